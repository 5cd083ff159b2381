"""Real servers on 127.0.0.1 for the remote-source tests: nginx for http:// and s3rver for s3://,
and Python's own http.server, which ignores Range.

    with nginx_server(root) as base_url: ...             # serves the files under root
    with python_http_server(root) as base_url: ...       # python3 -m http.server: no Range
    with s3rver_server(directory) as (endpoint, access_key, secret_key): ...
    with s3rver_server(directory, verify_signatures=True) as (endpoint, ...): ...

Each server runs in its own process group on a free port, is waited for until it answers and is
ended with its group when the block exits (and at interpreter exit, should a block be skipped).
A server that cannot start for want of software raises ServerUnavailable, whose message names
what is missing and how to get it; the fixtures at the bottom turn that into a skip.

- nginx: /usr/sbin/nginx (Debian: nginx-light) with a config written here, one process
  (master_process off, so no switch to the user nobody: it runs as root or unprivileged alike and
  reads pytest's 0700 temporary directories), Range, ETag, If-Match and keep-alive on.
- s3rver (npm, pinned S3RVER_VERSION, installed by scripts/install-s3rver into .cache/node; or the
  s3rver.js that FERRY_S3RVER names): path-style URLs http://127.0.0.1:PORT/bucket/key, keys
  S3RVER/S3RVER. It checks that a SigV4 request is well formed (Authorization's three parts, a
  known access key, x-amz-content-sha256 present, x-amz-date within 15 minutes, a presigned URL
  not expired) but NOT the signature itself, and it answers anonymous requests to any bucket.
  Its Range handling is off in places (bytes=0-0 answers the whole object, bytes=-N the first
  N+1 bytes, a range of an empty object a broken response) and it ignores If-Match.
  verify_signatures=True puts a front in between (this file run as a program, its own process)
  that behaves as S3 does: it recomputes every SigV4 signature, header or query-string (the
  method is signed: a URL presigned for GET is refused for HEAD), answers AWS's XML errors
  (SignatureDoesNotMatch, AccessDenied, ...), lets anonymous requests read only buckets whose
  names start with PUBLIC_BUCKET_PREFIX, and does Range (416 InvalidRange where S3 answers it,
  200 for what S3 ignores) and If-Match (412 PreconditionFailed) itself.

The S3 helpers (s3_create_bucket, s3_put, s3_get, s3_presign, ...) sign with hmac/hashlib here:
no boto3. Their canonical form is checked against AWS's published examples in
test_remote_servers.py. (libcurl 7.88's CURLOPT_AWS_SIGV4 signs the URL as given: the front
accepts it only when the URL is already canonical, as object_path and canonical_query make it:
each byte but A-Z a-z 0-9 - _ . ~ (and / in the path) as %XY, query parameters sorted, 'k=' for
a parameter without a value.)
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import hashlib
import hmac
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from email.message import Message
from typing import Any, Iterator, Mapping, Union

S3RVER_VERSION = "3.7.1"
S3RVER_ACCESS_KEY = "S3RVER"  # the one key pair s3rver knows
S3RVER_SECRET_KEY = "S3RVER"
REGION = "us-east-1"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
PUBLIC_BUCKET_PREFIX = "public-"  # buckets anonymous requests may read behind the verifying front

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 20.0
Headers = Union[Mapping[str, str], Message]  # a dict, or http.server's case-insensitive headers


class ServerUnavailable(RuntimeError):
    """The server's software is missing; the message says what and how to install it."""


# --- processes ------------------------------------------------------------------------------

_running: dict[int, subprocess.Popen] = {}
_running_lock = threading.Lock()


def _set_parent_death_signal() -> None:
    # The server gets SIGTERM when the process that started it dies, even by SIGKILL.
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _spawn(argv: list[str], log_path: Path, **kwargs) -> subprocess.Popen:
    """Starts argv in a new session (its own process group), output into log_path."""
    # PR_SET_PDEATHSIG fires when the starting *thread* ends: only from the main thread.
    on_main = threading.current_thread() is threading.main_thread()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True,
                                preexec_fn=_set_parent_death_signal if on_main else None,
                                **kwargs)
    with _running_lock:
        _running[proc.pid] = proc
    return proc


def _stop(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """Ends proc's whole process group: SIGTERM, then SIGKILL after timeout seconds."""
    try:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # Anything the leader left behind in its group (none of ours forks, but be sure).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    finally:
        with _running_lock:
            _running.pop(proc.pid, None)


@atexit.register
def _stop_all() -> None:
    with _running_lock:
        procs = list(_running.values())
    for proc in procs:
        _stop(proc, timeout=2.0)


def _log_tail(log_path: Path, limit: int = 3000) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-limit:].strip()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, log_path: Path, what: str,
               timeout: float = STARTUP_TIMEOUT_S, expect: bytes | None = None) -> None:
    """Waits until url answers with any HTTP status (with expect: 200 and that body, proof that
    it is this server that answers); raises RuntimeError (with the server's log) when proc exits
    first or timeout passes."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before it answered; "
                               f"its log ({log_path}):\n{_log_tail(log_path)}")
        try:
            request = urllib.request.Request(url, method="GET" if expect else "HEAD")
            with urllib.request.urlopen(request, timeout=2) as r:
                if expect is None or r.read() == expect:
                    return
        except urllib.error.HTTPError:
            if expect is None:
                return  # it answers
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer {url} within {timeout:.0f} s; "
                               f"its log ({log_path}):\n{_log_tail(log_path)}")
        time.sleep(0.05)


def _wait_line(log_path: Path, pattern: str, proc: subprocess.Popen, what: str,
               timeout: float = STARTUP_TIMEOUT_S) -> re.Match:
    """Waits until a line of log_path matches pattern (a server saying which port it took)."""
    deadline = time.monotonic() + timeout
    regex = re.compile(pattern, re.MULTILINE)
    while True:
        match = regex.search(_log_tail(log_path, 1 << 16))
        if match:
            return match
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before it listened; "
                               f"its log ({log_path}):\n{_log_tail(log_path)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not say it listens within {timeout:.0f} s; "
                               f"its log ({log_path}):\n{_log_tail(log_path)}")
        time.sleep(0.05)


# --- nginx ----------------------------------------------------------------------------------

def find_nginx() -> str:
    """The nginx binary: $FERRY_NGINX, nginx on PATH, or /usr/sbin/nginx."""
    candidates = [os.environ.get("FERRY_NGINX"), shutil.which("nginx"), "/usr/sbin/nginx"]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise ServerUnavailable(
        "nginx is not installed (looked for $FERRY_NGINX, nginx on PATH, /usr/sbin/nginx): "
        "apt-get install nginx-light")


_NGINX_CONF = """\
daemon off;
master_process off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    log_format ferry_requests '"$request" $status $http_range';
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    types {{ }}
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    keepalive_timeout 75s;
    keepalive_requests 100000;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        etag on;
        {max_ranges}
        location / {{ }}
        location = /.ferry-nginx-ready {{ return 200 "{token}"; }}
    }}
    {tls_server}
}}
"""


_NGINX_TLS_SERVER = """server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        root {root};
        etag on;
        location / {{ }}
    }}"""


@contextlib.contextmanager
def nginx_tls_server(root: str | os.PathLike) -> Iterator[tuple[str, Path]]:
    """Serves root over HTTPS: yields ('https://127.0.0.1:PORT', the CA file that verifies
    it), a self-signed certificate for IP 127.0.0.1 made here with the openssl command."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ServerUnavailable("openssl is not installed: apt-get install openssl")
    tmp = Path(tempfile.mkdtemp(prefix="ferry-tls-"))
    try:
        cert, key = tmp / "cert.pem", tmp / "key.pem"
        made = subprocess.run(
            [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
             "-keyout", str(key), "-out", str(cert)], capture_output=True, text=True)
        if made.returncode != 0:
            raise ServerUnavailable(f"openssl could not make a certificate: {made.stderr[-300:]}")
        with nginx_server(root, tls=(cert, key)) as (_, https_url):
            yield https_url, cert
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def nginx_server(root: str | os.PathLike, *, ranges: bool = True,
                 tls: tuple[Path, Path] | None = None, limit_rate: str = "",
                 access_log: str | os.PathLike | None = None) -> Iterator[Any]:
    """Serves the files under root at the yielded base URL 'http://127.0.0.1:PORT' (a file
    root/a/b.bin at base_url + '/a/b.bin'). ranges=False: nginx ignores Range headers and
    answers 200 with the whole file (max_ranges 0), as some servers do. tls=(cert, key): also
    over HTTPS on a second port, and yields (http_url, https_url) (nginx_tls_server).
    limit_rate="2m": each response is sent at that many bytes a second at most (nginx's
    limit_rate, per connection), a slow server for progress tests. access_log=PATH: a line per
    request there ('"GET /m.safetensors HTTP/1.1" 206 bytes=0-99'), for tests that count them
    (access_log_requests)."""
    nginx = find_nginx()
    root = Path(root).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"nginx_server: {root} is not a directory")
    tmp = Path(tempfile.mkdtemp(prefix="ferry-nginx-"))
    try:
        for attempt in range(10):  # another process may take the port before nginx does
            port = free_port()
            tls_port = free_port() if tls else 0
            conf = tmp / "nginx.conf"
            token = os.urandom(8).hex()
            tls_server = (_NGINX_TLS_SERVER.format(port=tls_port, cert=tls[0], key=tls[1],
                                                   root=root) if tls else "")
            conf.write_text(_NGINX_CONF.format(tmp=tmp, port=port, root=root, token=token,
                                               max_ranges=("" if ranges else "max_ranges 0;")
                                               + (f" limit_rate {limit_rate};"
                                                  if limit_rate else "")
                                               + (f" access_log {Path(access_log).resolve()} "
                                                  "ferry_requests;" if access_log else ""),
                                               tls_server=tls_server))
            log = tmp / "error.log"
            log.write_bytes(b"")
            # -e: the error log from the start (before the config is read), -p: prefix for any
            # relative path, so nothing under /var or /etc is needed.
            proc = _spawn([nginx, "-p", str(tmp), "-c", str(conf), "-e", str(log)], tmp / "out.log")
            try:
                # The token: an answer from this nginx, not from whoever took the port meanwhile.
                _wait_http(f"http://127.0.0.1:{port}/.ferry-nginx-ready", proc, log, "nginx",
                           expect=token.encode())
            except RuntimeError:
                _stop(proc)
                if "Address already in use" in _log_tail(log) and attempt < 9:
                    continue
                raise
            break
        try:
            if tls:
                yield f"http://127.0.0.1:{port}", f"https://127.0.0.1:{tls_port}"
            else:
                yield f"http://127.0.0.1:{port}"
        finally:
            _stop(proc)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def access_log_requests(path: str | os.PathLike) -> list[str]:
    """The requests an nginx_server(access_log=path) has answered: '"GET /x HTTP/1.1" 206
    bytes=0-7' (the readiness probe's left out)."""
    p = Path(path)
    lines = p.read_text().splitlines() if p.exists() else []
    return [line for line in lines if ".ferry-nginx-ready" not in line]


# --- python3 -m http.server ----------------------------------------------------------------

@contextlib.contextmanager
def python_http_server(root: str | os.PathLike) -> Iterator[str]:
    """`python3 -m http.server` serving the files under root at the yielded base URL
    'http://127.0.0.1:PORT' (a port the kernel picks; the server prints it). The first server a
    new user tries: it answers every GET 200 with the whole file, whatever its Range, says no
    Accept-Ranges and sends no ETag (Content-Length and Last-Modified only), HTTP/1.0."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"python_http_server: {root} is not a directory")
    # -u: its "Serving HTTP on 127.0.0.1 port N" reaches the log at once, not at exit.
    with _listening([sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1",
                     "--directory", str(root), "0"], r"Serving HTTP on \S+ port (\d+)",
                    "http.server") as endpoint:
        yield endpoint


# --- s3rver ---------------------------------------------------------------------------------

def find_s3rver() -> list[str]:
    """argv that runs s3rver: node and s3rver's bin/s3rver.js, from $FERRY_S3RVER (that file, or
    an npm prefix holding node_modules/s3rver), else the repository's .cache/node."""
    node = shutil.which("node") or shutil.which("nodejs")
    if not node:
        raise ServerUnavailable("node is not installed (s3rver needs it): apt-get install nodejs "
                                "npm, then scripts/install-s3rver")
    env = os.environ.get("FERRY_S3RVER")
    places = []
    if env:
        p = Path(env)
        places += [p, p / "node_modules/s3rver/bin/s3rver.js", p / "bin/s3rver.js"]
    places.append(REPO / ".cache/node/node_modules/s3rver/bin/s3rver.js")
    for p in places:
        if p.is_file():
            # s3rver's continuation tokens (ListObjectsV2 pages) use DES, which OpenSSL 3 only
            # has in its legacy provider: without it a truncated listing answers 500.
            legacy = subprocess.run([node, "--openssl-legacy-provider", "-e", "0"],
                                    capture_output=True).returncode == 0
            return [node, *(["--openssl-legacy-provider"] if legacy else []), str(p)]
    raise ServerUnavailable(
        f"s3rver is not installed (looked in {', '.join(str(p) for p in places)}): run "
        f"scripts/install-s3rver (npm install --prefix .cache/node s3rver@{S3RVER_VERSION}; "
        f"needs apt-get install nodejs npm), or set FERRY_S3RVER to its bin/s3rver.js")


@contextlib.contextmanager
def _s3rver_process(directory: Path) -> Iterator[str]:
    argv = find_s3rver()
    directory.mkdir(parents=True, exist_ok=True)
    # -p 0: the kernel picks the port and s3rver prints it; no race for a free port.
    # --silent: no line per request (FERRY_S3RVER_VERBOSE=1 keeps them, in the log).
    silent = [] if os.environ.get("FERRY_S3RVER_VERBOSE") else ["--silent"]
    with _listening(argv + ["-d", str(directory), "-a", "127.0.0.1", "-p", "0", *silent],
                    r"S3rver listening on 127\.0\.0\.1:(\d+)", "s3rver") as endpoint:
        yield endpoint


@contextlib.contextmanager
def _listening(argv: list[str], pattern: str, what: str) -> Iterator[str]:
    """Runs argv, a server that prints the port it listens on (`pattern`'s group 1) into its
    log; yields its endpoint once it answers HTTP, stops it and removes the log after."""
    log = Path(tempfile.mkstemp(prefix=f"ferry-{what}-", suffix=".log")[1])
    proc = _spawn(argv, log)
    try:
        match = _wait_line(log, pattern, proc, what)
        endpoint = f"http://127.0.0.1:{match.group(1)}"
        _wait_http(endpoint + "/", proc, log, what)
        yield endpoint
    finally:
        _stop(proc)
        with contextlib.suppress(OSError):
            log.unlink()


@contextlib.contextmanager
def s3_verifying_front(upstream: str, *, access_key: str = S3RVER_ACCESS_KEY,
                       secret_key: str = S3RVER_SECRET_KEY, region: str = REGION,
                       public_prefix: str = PUBLIC_BUCKET_PREFIX) -> Iterator[str]:
    """Starts the SigV4-verifying front (this file as a program, in its own process) before
    upstream; yields its endpoint."""
    argv = [sys.executable, "-u", os.path.abspath(__file__), "s3-front", "--upstream", upstream,
            "--access-key", access_key, "--secret-key", secret_key, "--region", region,
            "--public-prefix", public_prefix]
    with _listening(argv, r"s3-front listening on 127\.0\.0\.1:(\d+)", "s3-front") as endpoint:
        yield endpoint


@contextlib.contextmanager
def s3rver_server(directory: str | os.PathLike, *, verify_signatures: bool = False
                  ) -> Iterator[tuple[str, str, str]]:
    """Runs s3rver with its data in directory; yields (endpoint_url, access_key, secret_key).
    verify_signatures=True: the endpoint is the SigV4-verifying front (see the module's doc)."""
    with _s3rver_process(Path(directory)) as endpoint:
        if verify_signatures:
            with s3_verifying_front(endpoint) as front:
                yield front, S3RVER_ACCESS_KEY, S3RVER_SECRET_KEY
        else:
            yield endpoint, S3RVER_ACCESS_KEY, S3RVER_SECRET_KEY


# --- SigV4 ----------------------------------------------------------------------------------

def uri_encode(text: str, *, keep_slash: bool = False) -> str:
    """AWS's UriEncode: every byte but A-Z a-z 0-9 - _ . ~ as %XY (upper-case hex), '/' kept in
    paths."""
    return urllib.parse.quote(text, safe="/-_.~" if keep_slash else "-_.~")


def object_path(bucket: str, key: str = "") -> str:
    """The path-style path /bucket/key, encoded once the AWS way (what a signer must send)."""
    return "/" + uri_encode(bucket) + ("/" + uri_encode(key, keep_slash=True) if key else "")


def canonical_query(pairs) -> str:
    """name=value pairs (decoded) → AWS's canonical query string: encoded, sorted, 'k=' for k."""
    encoded = sorted((uri_encode(k), uri_encode(v)) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in encoded)


def _signing_key(secret_key: str, date: str, region: str, service: str) -> bytes:
    key = ("AWS4" + secret_key).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def sigv4_signature(*, method: str, path: str, query_pairs, headers: Headers,
                    signed_headers: list[str], payload_hash: str, amz_date: str,
                    secret_key: str, region: str, service: str = "s3") -> tuple[str, str]:
    """(signature, canonical request) for a request. path: decoded (it is encoded here once);
    query_pairs: decoded (name, value) pairs without X-Amz-Signature; headers: a mapping whose
    lower-cased names include signed_headers."""
    lower = {k.lower(): v for k, v in headers.items()}
    names = sorted(h.lower() for h in signed_headers)
    canonical_headers = "".join(f"{n}:{' '.join(str(lower.get(n, '')).split())}\n" for n in names)
    canonical_request = "\n".join([
        method.upper(), uri_encode(path, keep_slash=True), canonical_query(query_pairs),
        canonical_headers, ";".join(names), payload_hash])
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    string_to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                                hashlib.sha256(canonical_request.encode()).hexdigest()])
    key = _signing_key(secret_key, amz_date[:8], region, service)
    return hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest(), canonical_request


def _amz_date(now: datetime.datetime | None = None) -> str:
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ")


def sign_headers(method: str, url: str, access_key: str, secret_key: str, *,
                 region: str = REGION, headers: Mapping[str, str] | None = None,
                 payload_hash: str = UNSIGNED_PAYLOAD,
                 now: datetime.datetime | None = None) -> dict[str, str]:
    """The headers of a SigV4-signed request to url (already encoded the AWS way, as
    object_path makes it): headers plus Host, x-amz-date, x-amz-content-sha256 and
    Authorization. Signs host and every x-amz-* header."""
    parts = urllib.parse.urlsplit(url)
    amz_date = _amz_date(now)
    out = dict(headers or {})
    out["Host"] = parts.netloc
    out["x-amz-date"] = amz_date
    out["x-amz-content-sha256"] = payload_hash
    signed = sorted({k.lower() for k in out if k.lower() == "host" or
                     k.lower().startswith("x-amz-")})
    signature, _ = sigv4_signature(
        method=method, path=urllib.parse.unquote(parts.path or "/"),
        query_pairs=urllib.parse.parse_qsl(parts.query, keep_blank_values=True), headers=out,
        signed_headers=signed, payload_hash=payload_hash, amz_date=amz_date,
        secret_key=secret_key, region=region)
    out["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={access_key}/{amz_date[:8]}/{region}/"
                            f"s3/aws4_request, SignedHeaders={';'.join(signed)}, "
                            f"Signature={signature}")
    return out


def s3_presign(endpoint: str, bucket: str, key: str, access_key: str, secret_key: str,
               expires: int = 3600, *, method: str = "GET", region: str = REGION,
               now: datetime.datetime | None = None) -> str:
    """A presigned (query-string SigV4) URL for bucket/key, valid expires seconds from now."""
    amz_date = _amz_date(now)
    parts = urllib.parse.urlsplit(endpoint)
    path = urllib.parse.urlsplit(endpoint).path.rstrip("/") + object_path(bucket, key)
    pairs = [("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
             ("X-Amz-Credential", f"{access_key}/{amz_date[:8]}/{region}/s3/aws4_request"),
             ("X-Amz-Date", amz_date), ("X-Amz-Expires", str(int(expires))),
             ("X-Amz-SignedHeaders", "host")]
    signature, _ = sigv4_signature(
        method=method, path=urllib.parse.unquote(path), query_pairs=pairs,
        headers={"host": parts.netloc}, signed_headers=["host"], payload_hash=UNSIGNED_PAYLOAD,
        amz_date=amz_date, secret_key=secret_key, region=region)
    query = canonical_query(pairs) + "&X-Amz-Signature=" + signature
    return f"{parts.scheme}://{parts.netloc}{path}?{query}"


# --- S3 requests ----------------------------------------------------------------------------

class S3Error(Exception):
    """An S3 request answered >= 300: status, code (<Code>), message, headers, body."""

    def __init__(self, status: int, body: bytes, headers: Mapping[str, str], what: str):
        self.status, self.body, self.headers = status, body, dict(headers)
        text = body.decode("utf-8", "replace")
        self.code = _xml_text(text, "Code")
        self.message = _xml_text(text, "Message")
        super().__init__(f"{what}: HTTP {status} {self.code or ''} {self.message or ''}".strip())


def _xml_text(text: str, tag: str) -> str | None:
    m = re.search(rf"<{tag}>(.*?)</{tag}>", text, re.S)
    return m.group(1) if m else None


@dataclasses.dataclass
class Response:
    status: int
    headers: dict[str, str]  # names lower-cased
    body: bytes


def s3_request(method: str, endpoint: str, bucket: str = "", key: str = "", *,
               access_key: str | None = None, secret_key: str | None = None,
               query: list[tuple[str, str]] | None = None, data: bytes | None = None,
               headers: Mapping[str, str] | None = None, region: str = REGION,
               sign_payload: bool = False, check: bool = True, timeout: float = 60) -> Response:
    """One path-style S3 request, SigV4-signed when access_key is given, else anonymous.
    check: raise S3Error when the status is >= 300."""
    base = endpoint.rstrip("/")
    path = urllib.parse.urlsplit(base).path + (object_path(bucket, key) if bucket else "/")
    url = urllib.parse.urlunsplit(urllib.parse.urlsplit(base)._replace(
        path=path, query=canonical_query(query or [])))
    hdrs = dict(headers or {})
    if data is not None:
        hdrs.setdefault("Content-Length", str(len(data)))
    if access_key is not None:
        payload = (hashlib.sha256(data or b"").hexdigest() if sign_payload else UNSIGNED_PAYLOAD)
        hdrs = sign_headers(method, url, access_key, secret_key or "", region=region,
                            headers=hdrs, payload_hash=payload)
        hdrs.pop("Host", None)  # urllib sends the same Host
    request = urllib.request.Request(url, data=data, headers=hdrs, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            response = Response(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read())
    except urllib.error.HTTPError as e:
        response = Response(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read())
    if check and response.status >= 300:
        raise S3Error(response.status, response.body, response.headers,
                      f"{method} {url}")
    return response


def s3_create_bucket(endpoint: str, bucket: str, access_key: str | None = S3RVER_ACCESS_KEY,
                     secret_key: str | None = S3RVER_SECRET_KEY, *, region: str = REGION,
                     exist_ok: bool = True) -> None:
    """PUT /bucket. s3rver answers 409 BucketAlreadyExists for a bucket it has: fine when
    exist_ok. Bucket names: 3 to 63 characters, a-z 0-9 . - (s3rver: 400 InvalidBucketName)."""
    try:
        s3_request("PUT", endpoint, bucket, access_key=access_key, secret_key=secret_key,
                   region=region, data=b"")
    except S3Error as e:
        if not (exist_ok and e.code in ("BucketAlreadyExists", "BucketAlreadyOwnedByYou")):
            raise


def s3_put(endpoint: str, bucket: str, key: str, data: bytes,
           access_key: str | None = S3RVER_ACCESS_KEY, secret_key: str | None = S3RVER_SECRET_KEY,
           *, region: str = REGION, content_type: str = "application/octet-stream") -> str:
    """PUT one object; returns its ETag (with the quotes, '"<md5 hex>"')."""
    r = s3_request("PUT", endpoint, bucket, key, access_key=access_key, secret_key=secret_key,
                   region=region, data=bytes(data), headers={"Content-Type": content_type})
    return r.headers.get("etag", "")


def s3_get(endpoint: str, bucket: str, key: str, access_key: str | None = S3RVER_ACCESS_KEY,
           secret_key: str | None = S3RVER_SECRET_KEY, *, range: str | None = None,
           region: str = REGION) -> Response:
    """GET one object (range: a Range header value such as 'bytes=0-99')."""
    return s3_request("GET", endpoint, bucket, key, access_key=access_key,
                      secret_key=secret_key, region=region,
                      headers={"Range": range} if range else None)


def s3_delete(endpoint: str, bucket: str, key: str, access_key: str | None = S3RVER_ACCESS_KEY,
              secret_key: str | None = S3RVER_SECRET_KEY, *, region: str = REGION) -> None:
    s3_request("DELETE", endpoint, bucket, key, access_key=access_key, secret_key=secret_key,
               region=region)


def s3_list(endpoint: str, bucket: str, prefix: str = "",
            access_key: str | None = S3RVER_ACCESS_KEY,
            secret_key: str | None = S3RVER_SECRET_KEY, *, region: str = REGION,
            max_keys: int = 1000) -> list[str]:
    """ListObjectsV2, every page of max_keys keys: the keys under prefix."""
    keys, token = [], None
    while True:
        query = [("list-type", "2"), ("prefix", prefix), ("max-keys", str(max_keys))]
        if token:
            query.append(("continuation-token", token))
        text = s3_request("GET", endpoint, bucket, access_key=access_key, secret_key=secret_key,
                          region=region, query=query).body.decode()
        keys += [_unescape(k) for k in re.findall(r"<Key>(.*?)</Key>", text, re.S)]
        token = _xml_text(text, "NextContinuationToken")
        if _xml_text(text, "IsTruncated") != "true" or not token:
            return keys
        token = _unescape(token)


def _unescape(text: str) -> str:
    import html
    return html.unescape(text)


# --- the SigV4-verifying front --------------------------------------------------------------

def _xml_error(code: str, message: str, **extra: str) -> bytes:
    from xml.sax.saxutils import escape
    fields = "".join(f"<{k}>{escape(str(v))}</{k}>" for k, v in extra.items())
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{escape(message)}</Message>{fields}<RequestId>ferry-test</RequestId>"
            f"</Error>").encode()


class AuthFailure(Exception):
    def __init__(self, status: int, code: str, message: str, **extra: str):
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message, self.extra = status, code, message, extra


_AUTH_RE = re.compile(r"AWS4-HMAC-SHA256\s+Credential=([^,\s]+),\s*SignedHeaders=([^,\s]+),"
                      r"\s*Signature=([0-9a-fA-F]+)\s*$")


def verify_sigv4(method: str, target: str, headers: Headers, body: bytes | None,
                 keys: Mapping[str, str], region: str = REGION,
                 now: datetime.datetime | None = None) -> str | None:
    """Checks a request as S3 would. target: the request-target as received ('/b/k?x=y');
    headers: case-insensitive mapping (e.g. http.client's). Returns the access key id, or None
    for an anonymous request; raises AuthFailure (status, AWS error code, message)."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    path, _, raw_query = target.partition("?")
    pairs = urllib.parse.parse_qsl(raw_query, keep_blank_values=True)
    query = dict(pairs)
    auth = headers.get("Authorization")
    if auth and "X-Amz-Algorithm" in query:
        raise AuthFailure(400, "InvalidArgument", "Only one auth mechanism allowed")
    if not auth and "X-Amz-Algorithm" not in query:
        return None
    if auth:
        m = _AUTH_RE.match(auth)
        if not m:
            raise AuthFailure(400, "AuthorizationHeaderMalformed",
                              "The authorization header is malformed.")
        credential, signed, provided = m.group(1), m.group(2).split(";"), m.group(3)
        amz_date = headers.get("x-amz-date") or ""
        payload_hash = headers.get("x-amz-content-sha256")
        if not payload_hash:
            raise AuthFailure(400, "InvalidRequest",
                              "Missing required header for this request: x-amz-content-sha256")
        if payload_hash != UNSIGNED_PAYLOAD and body is not None and not payload_hash.startswith(
                "STREAMING-") and hashlib.sha256(body).hexdigest() != payload_hash.lower():
            raise AuthFailure(400, "XAmzContentSHA256Mismatch",
                              "The provided 'x-amz-content-sha256' header does not match what "
                              "was computed.")
        sign_pairs = pairs
    else:
        if query.get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256":
            raise AuthFailure(400, "AuthorizationQueryParametersError",
                              'X-Amz-Algorithm only supports "AWS4-HMAC-SHA256"')
        try:
            credential, amz_date = query["X-Amz-Credential"], query["X-Amz-Date"]
            signed, provided = query["X-Amz-SignedHeaders"].split(";"), query["X-Amz-Signature"]
            expires = int(query["X-Amz-Expires"])
        except (KeyError, ValueError):
            raise AuthFailure(400, "AuthorizationQueryParametersError",
                              "Query-string authentication version 4 requires the "
                              "X-Amz-Algorithm, X-Amz-Credential, X-Amz-Signature, X-Amz-Date, "
                              "X-Amz-SignedHeaders, and X-Amz-Expires parameters.") from None
        payload_hash = UNSIGNED_PAYLOAD
        sign_pairs = [(k, v) for k, v in pairs if k != "X-Amz-Signature"]
    try:
        access_key, date, cred_region, service, terminal = credential.split("/")
    except ValueError:
        raise AuthFailure(400, "AuthorizationHeaderMalformed",
                          f"The credential is malformed: {credential}") from None
    if access_key not in keys:
        raise AuthFailure(403, "InvalidAccessKeyId",
                          "The AWS Access Key Id you provided does not exist in our records.",
                          AWSAccessKeyId=access_key)
    if cred_region != region:
        raise AuthFailure(400, "AuthorizationHeaderMalformed",
                          f"The authorization header is malformed; the region '{cred_region}' "
                          f"is wrong; expecting '{region}'", Region=region)
    if service != "s3" or terminal != "aws4_request" or date != amz_date[:8]:
        raise AuthFailure(400, "AuthorizationHeaderMalformed",
                          f"The credential scope is wrong: {credential}")
    try:
        when = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(
            tzinfo=datetime.timezone.utc)
    except ValueError:
        raise AuthFailure(403, "AccessDenied",
                          "AWS authentication requires a valid Date or x-amz-date header") from None
    if auth:
        if abs((now - when).total_seconds()) > 900:
            raise AuthFailure(403, "RequestTimeTooSkewed",
                              "The difference between the request time and the current time is "
                              "too large.")
    else:
        if not 1 <= expires <= 604800:
            raise AuthFailure(400, "AuthorizationQueryParametersError",
                              "X-Amz-Expires must be between 1 and 604800 seconds")
        if (now - when).total_seconds() > expires:
            raise AuthFailure(403, "AccessDenied", "Request has expired",
                              X_Amz_Expires=str(expires))
    names = [s.lower() for s in signed]
    if "host" not in names:
        raise AuthFailure(400, "AuthorizationHeaderMalformed", "host must be a signed header")
    unsigned = [h for h in headers.keys() if h.lower().startswith("x-amz-") and
                h.lower() not in names]
    if unsigned:
        raise AuthFailure(403, "AccessDenied",
                          "There were headers present in the request which were not signed",
                          HeadersNotSigned=", ".join(sorted(h.lower() for h in unsigned)))
    expected, canonical_request = sigv4_signature(
        method=method, path=urllib.parse.unquote(path), query_pairs=sign_pairs, headers=headers,
        signed_headers=names, payload_hash=payload_hash, amz_date=amz_date,
        secret_key=keys[access_key], region=region)
    if not hmac.compare_digest(expected, provided.lower()):
        raise AuthFailure(403, "SignatureDoesNotMatch",
                          "The request signature we calculated does not match the signature you "
                          "provided. Check your key and signing method.",
                          AWSAccessKeyId=access_key, CanonicalRequest=canonical_request)
    return access_key


def _resolve_range(header: str, size: int):
    """A Range header against an object of size bytes, as S3 reads it: (first, last) to answer
    with 206; "unsatisfiable" (416); None to ignore it (not one bytes range: 200, whole)."""
    m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header)
    if not m or (m.group(1) == "" and m.group(2) == ""):
        return None
    if m.group(1) == "":  # the last N bytes
        n = int(m.group(2))
        if n == 0 or size == 0:
            return "unsatisfiable"
        return max(0, size - n), size - 1
    first = int(m.group(1))
    if m.group(2) and int(m.group(2)) < first:  # not a valid range: ignored
        return None
    if first >= size:
        return "unsatisfiable"
    return first, min(int(m.group(2)) if m.group(2) else size - 1, size - 1)


def _run_front(upstream: str, keys: dict[str, str], region: str, public_prefix: str) -> None:
    """Serves on 127.0.0.1 (a free port, printed), verifying every request, then forwarding
    it to upstream. HTTP/1.1 keep-alive on both sides; bodies streamed."""
    import http.client
    import http.server

    up = urllib.parse.urlsplit(upstream)
    local = threading.local()
    hop = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
           "upgrade", "expect"}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "ferry-s3-front"

        def log_message(self, format, *args):  # noqa: A002 (the base class's name)
            if os.environ.get("FERRY_S3RVER_VERBOSE"):
                super().log_message(format, *args)

        def _read_body(self) -> bytes | None:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                chunks: list[bytes] = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            length = self.headers.get("Content-Length")
            return self.rfile.read(int(length)) if length else None

        def _error(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _upstream(self, method: str, path: str, headers: dict[str, str],
                      body: bytes | None = None) -> http.client.HTTPResponse | None:
            for attempt in (0, 1):  # a kept-alive upstream connection may have been closed
                conn = getattr(local, "conn", None)
                if conn is None:
                    conn = local.conn = http.client.HTTPConnection(
                        up.hostname or "127.0.0.1", up.port, timeout=300)
                try:
                    conn.request(method, path, body=body, headers=headers)
                    return conn.getresponse()
                except (http.client.HTTPException, OSError):
                    conn.close()
                    local.conn = None
            self._error(502, _xml_error("BadGateway", "s3rver did not answer"))
            return None

        def _handle(self) -> None:
            body = self._read_body()
            try:
                who = verify_sigv4(self.command, self.path, self.headers, body, keys, region)
            except AuthFailure as e:
                return self._error(e.status, _xml_error(e.code, e.message, **e.extra))
            path = self.path.partition("?")[0]
            bucket, _, key = urllib.parse.unquote(path).lstrip("/").partition("/")
            if who is None and not (bucket.startswith(public_prefix) and
                                    self.command in ("GET", "HEAD")):
                return self._error(403, _xml_error("AccessDenied", "Access Denied"))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in hop}
            if body is not None:
                headers["Content-Length"] = str(len(body))
            # What s3rver gets wrong of a GET/HEAD, done here as S3 does it: If-Match (s3rver
            # ignores it), Range bytes=0-0, bytes=-N, ranges of an empty object, several ranges.
            window = None  # (start, end, size): the bytes of the object to answer, with 206
            condition = self.headers.get("If-Match")
            range_ = self.headers.get("Range") if self.command == "GET" else None
            if key and self.command in ("GET", "HEAD") and (condition or range_):
                head = self._upstream("HEAD", path, {"Host": self.headers.get("Host", "")})
                if head is None:
                    return None
                head.read()
                if head.status == 200:
                    etag = head.getheader("ETag", "")
                    size = int(head.getheader("Content-Length") or 0)
                    if condition and condition.strip() not in ("*", etag):
                        return self._error(412, _xml_error(
                            "PreconditionFailed",
                            "At least one of the pre-conditions you specified did not hold",
                            Condition="If-Match"))
                    headers = {k: v for k, v in headers.items()
                               if k.lower() not in ("if-match", "range")}
                    if range_:
                        window = _resolve_range(range_, size)
                        if window == "unsatisfiable":
                            return self._error(416, _xml_error(
                                "InvalidRange", "The requested range is not satisfiable",
                                RangeRequested=range_, ActualObjectSize=str(size)))
                        if window is not None:
                            first, last = window
                            # s3rver reads an end of 0 as "to the end": ask for a byte more.
                            asked = last if last > 0 else min(1, size - 1)
                            headers["Range"] = f"bytes={first}-{asked}"
                            window = (first, last, size)
            resp = self._upstream(self.command, self.path, headers, body)
            if resp is None:
                return None
            if window is not None and resp.status == 206:
                first, last, size = window
                self.send_response(206, "Partial Content")
                for k, v in resp.getheaders():
                    if k.lower() not in hop and k.lower() not in ("content-length",
                                                                  "content-range"):
                        self.send_header(k, v)
                self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
                self.send_header("Content-Length", str(last - first + 1))
                self.end_headers()
                left = last - first + 1
                while left > 0:
                    chunk = resp.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    left -= len(chunk)
                resp.read()  # the byte more, if asked for
                return None
            self.send_response(resp.status, resp.reason)
            length = resp.getheader("Content-Length")
            data = None
            if length is None and self.command != "HEAD":
                data = resp.read()
                length = str(len(data))
            for k, v in resp.getheaders():
                if k.lower() not in hop and k.lower() != "content-length":
                    self.send_header(k, v)
            if length is not None:
                self.send_header("Content-Length", length)
            self.end_headers()
            if self.command == "HEAD":
                resp.read()
                return None
            if data is not None:
                self.wfile.write(data)
                return None
            while True:
                chunk = resp.read(1 << 20)
                if not chunk:
                    break
                self.wfile.write(chunk)
            return None

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 128

    server = Server(("127.0.0.1", 0), Handler)
    print(f"s3-front listening on 127.0.0.1:{server.server_address[1]}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    server.serve_forever()


# --- pytest fixtures ------------------------------------------------------------------------

@dataclasses.dataclass
class NginxServer:
    url: str  # http://127.0.0.1:PORT; root/a.bin is at url + "/a.bin"
    root: Path

    def put(self, name: str, data: bytes) -> str:
        """Writes root/name; returns its URL."""
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return f"{self.url}/{urllib.parse.quote(name)}"


@dataclasses.dataclass
class S3Server:
    endpoint: str  # http://127.0.0.1:PORT (path-style: endpoint/bucket/key)
    access_key: str
    secret_key: str
    directory: Path
    region: str = REGION
    verifies_signatures: bool = False

    def create_bucket(self, bucket: str) -> None:
        s3_create_bucket(self.endpoint, bucket, self.access_key, self.secret_key,
                         region=self.region)

    def put(self, bucket: str, key: str, data: bytes) -> str:
        """Uploads (creating the bucket first, if need be); returns the object's s3:// URL."""
        self.create_bucket(bucket)
        s3_put(self.endpoint, bucket, key, data, self.access_key, self.secret_key,
               region=self.region)
        return f"s3://{bucket}/{key}"

    def url(self, bucket: str, key: str) -> str:
        """The plain http URL of an object (path style)."""
        return self.endpoint + object_path(bucket, key)

    def presign(self, bucket: str, key: str, expires: int = 3600) -> str:
        return s3_presign(self.endpoint, bucket, key, self.access_key, self.secret_key,
                          expires, region=self.region)

    def env(self, *, anonymous: bool = False) -> dict[str, str]:
        """The environment for an AWS client to reach this server."""
        env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": self.region,
               "AWS_DEFAULT_REGION": self.region}
        if not anonymous:
            env.update(AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key)
        return env


pytest: Any
try:
    import pytest
except ImportError:  # the helpers above work without pytest
    pytest = None

if pytest is not None:
    def _skip_unavailable(cm):
        try:
            return cm.__enter__()
        except ServerUnavailable as e:
            pytest.skip(str(e))

    @pytest.fixture(scope="session")
    def python_http(tmp_path_factory):
        """NginxServer's shape (.url, .root, .put) for `python3 -m http.server` serving a fresh
        directory: a server that ignores Range."""
        root = tmp_path_factory.mktemp("http-server-root")
        cm = python_http_server(root)
        url = cm.__enter__()
        try:
            yield NginxServer(url, root)
        finally:
            cm.__exit__(None, None, None)

    @pytest.fixture(scope="session")
    def nginx(tmp_path_factory):
        """NginxServer serving a fresh directory (its .root); files written there are served."""
        root = tmp_path_factory.mktemp("nginx-root")
        cm = nginx_server(root)
        url = _skip_unavailable(cm)
        try:
            yield NginxServer(url, root)
        finally:
            cm.__exit__(None, None, None)

    def _s3_fixture(tmp_path_factory, verify: bool):
        directory = tmp_path_factory.mktemp("s3rver-data")
        cm = s3rver_server(directory, verify_signatures=verify)
        endpoint, access_key, secret_key = _skip_unavailable(cm)
        try:
            yield S3Server(endpoint, access_key, secret_key, directory,
                           verifies_signatures=verify)
        finally:
            cm.__exit__(None, None, None)

    @pytest.fixture(scope="session")
    def s3rver(tmp_path_factory):
        """S3Server: s3rver itself (signatures not checked, anonymous requests answered)."""
        yield from _s3_fixture(tmp_path_factory, verify=False)

    @pytest.fixture(scope="session")
    def s3rver_strict(tmp_path_factory):
        """S3Server behind the SigV4-verifying front: a wrong signature is refused as AWS
        would (403 SignatureDoesNotMatch), anonymous requests may only read public-* buckets."""
        yield from _s3_fixture(tmp_path_factory, verify=True)


def _main(argv: list[str]) -> int:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    front = sub.add_parser("s3-front", help="the SigV4-verifying front before an S3 server")
    front.add_argument("--upstream", required=True)
    front.add_argument("--access-key", default=S3RVER_ACCESS_KEY)
    front.add_argument("--secret-key", default=S3RVER_SECRET_KEY)
    front.add_argument("--region", default=REGION)
    front.add_argument("--public-prefix", default=PUBLIC_BUCKET_PREFIX)
    serve = sub.add_parser("serve", help="start the servers for manual tries; Ctrl-C ends them")
    serve.add_argument("directory")
    serve.add_argument("--verify-signatures", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "s3-front":
        _run_front(args.upstream, {args.access_key: args.secret_key}, args.region,
                   args.public_prefix)
        return 0
    root = Path(args.directory).resolve()
    (root / "http").mkdir(parents=True, exist_ok=True)
    with nginx_server(root / "http") as url, \
            s3rver_server(root / "s3", verify_signatures=args.verify_signatures) as s3:
        print(f"nginx: {url} serving {root / 'http'}\ns3: AWS_ENDPOINT_URL={s3[0]} "
              f"AWS_ACCESS_KEY_ID={s3[1]} AWS_SECRET_ACCESS_KEY={s3[2]} AWS_REGION={REGION}",
              flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
