// The I/O seam of remote objects: `open` of an http://, https:// or s3:// URL learns the object's
// size and ETag, `pread` is a ranged GET (retried with backoff on 429, 5xx, resets and timeouts;
// never on other answers), `fstat` gives the size. ferry's POSIX path runs on it unchanged: its
// workers' preads become GETs on their own kept-alive connections, into the caller's host buffer
// or into pinned staging that is copied to the GPU while the next ranges download. Each object
// gets a placeholder descriptor (of /dev/null) that names it. Thread-safe. Errors are IoErrors
// that name the URL (never its query or a credential), the range, the server's status and, for
// S3, its <Code> and <Message>.
#pragma once

#include "io/io_seam.h"

namespace ferry::remote {

// The process's seam of remote objects (made once, never destroyed). Variables read at each
// open(): AWS_* (remote_url.h), the policy's (ferry/remote.h: FERRY_REMOTE_RETRIES,
// FERRY_REMOTE_TIMEOUT, FERRY_REMOTE_DEADLINE, KVIKIO_HTTP_*), AWS_CA_BUNDLE (s3:// only),
// CURL_CA_BUNDLE or SSL_CERT_FILE (the CA certificates for https). A call made under a cancelled
// io::CancelScope ends with ECANCELED: its GETs and retry waits stop within about a second.
io::IoSeam& remote_objects();

}  // namespace ferry::remote
