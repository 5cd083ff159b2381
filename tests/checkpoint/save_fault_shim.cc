// A fault injector for the save protocol's tests, loaded with LD_PRELOAD into a child process:
// it counts the calls a save makes of each system call of the protocol and, on the Nth call of
// one, kills the process (SIGKILL, as a crash or an OOM kill would) or fails the call with an
// errno, without touching the production code. Thread-safe (atomic counters).
//   FERRY_FAULT=OP:N:ACTION   OP: pwrite fsync_file fsync_dir rename link linkat unlink mkdir
//                             ACTION: kill, or an errno name: EIO ENOSPC EROFS EACCES
//   FERRY_FAULT_COUNT=FILE    at exit, "OP COUNT" lines of the calls made, for the test to walk,
//                             then a "fsync_dir PATH" line for each folder fsynced
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>

namespace {

enum { kPwrite, kFsyncFile, kFsyncDir, kRename, kLink, kLinkat, kUnlink, kMkdir, kUmask, kOps };
const char* const kNames[kOps] = {"pwrite", "fsync_file", "fsync_dir", "rename", "link",
                                  "linkat", "unlink",     "mkdir",     "umask"};
std::atomic<long> calls[kOps];
int fault_op = -1;
long fault_n = 0;
int fault_errno = 0;  // 0: kill
char synced[16384];   // "fsync_dir PATH\n" lines
std::atomic<int> synced_lock{0};

void note_synced(int fd) {
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return;
  path[n] = 0;
  while (synced_lock.exchange(1)) {
  }
  const size_t used = strlen(synced);
  snprintf(synced + used, sizeof synced - used, "fsync_dir %s\n", path);
  synced_lock.store(0);
}

__attribute__((constructor)) void setup(void) {
  const char* spec = getenv("FERRY_FAULT");
  if (spec == NULL || spec[0] == 0) return;
  char op[32] = {0}, action[32] = {0};
  if (sscanf(spec, "%31[a-z_]:%ld:%31s", op, &fault_n, action) != 3) {
    fprintf(stderr, "save_fault_shim: FERRY_FAULT=%s is not OP:N:ACTION\n", spec);
    _exit(90);
  }
  for (int i = 0; i < kOps; ++i) {
    if (strcmp(op, kNames[i]) == 0) fault_op = i;
  }
  if (strcmp(action, "kill") == 0)
    fault_errno = 0;
  else if (strcmp(action, "EIO") == 0)
    fault_errno = EIO;
  else if (strcmp(action, "ENOSPC") == 0)
    fault_errno = ENOSPC;
  else if (strcmp(action, "EROFS") == 0)
    fault_errno = EROFS;
  else if (strcmp(action, "EACCES") == 0)
    fault_errno = EACCES;
  else
    fault_op = -1;
  if (fault_op < 0) {
    fprintf(stderr, "save_fault_shim: FERRY_FAULT=%s names no known OP or ACTION\n", spec);
    _exit(90);
  }
}

__attribute__((destructor)) void report(void) {
  const char* path = getenv("FERRY_FAULT_COUNT");
  if (path == NULL || path[0] == 0) return;
  FILE* f = fopen(path, "w");
  if (f == NULL) return;
  for (int i = 0; i < kOps; ++i) fprintf(f, "%s %ld\n", kNames[i], calls[i].load());
  fputs(synced, f);
  fclose(f);
}

// Counts the call; on the chosen one, kills the process or answers -1 with errno set (1).
int fault(int op) {
  const long n = calls[op].fetch_add(1) + 1;
  if (op != fault_op || n != fault_n) return 0;
  if (fault_errno == 0) kill(getpid(), SIGKILL);
  errno = fault_errno;
  return 1;
}

}  // namespace

#define NEXT(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

extern "C" {

ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  if (fault(kPwrite)) return -1;
  return NEXT(pwrite)(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) {
  if (fault(kPwrite)) return -1;
  return NEXT(pwrite64)(fd, buf, n, off);
}

int fsync(int fd) {
  struct stat st;
  const int dir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
  if (fault(dir ? kFsyncDir : kFsyncFile)) return -1;
  if (dir) note_synced(fd);
  return NEXT(fsync)(fd);
}

int rename(const char* from, const char* to) __THROW {
  if (fault(kRename)) return -1;
  return NEXT(rename)(from, to);
}

int link(const char* from, const char* to) __THROW {
  if (fault(kLink)) return -1;
  return NEXT(link)(from, to);
}

int linkat(int fromdir, const char* from, int todir, const char* to, int flags) __THROW {
  if (fault(kLinkat)) return -1;
  return NEXT(linkat)(fromdir, from, todir, to, flags);
}

int unlink(const char* path) __THROW {
  if (fault(kUnlink)) return -1;
  return NEXT(unlink)(path);
}

int unlinkat(int dir, const char* path, int flags) __THROW {
  if (fault(kUnlink)) return -1;
  return NEXT(unlinkat)(dir, path, flags);
}

mode_t umask(mode_t mask) __THROW {
  fault(kUmask);
  return NEXT(umask)(mask);
}

int mkdir(const char* path, mode_t mode) __THROW {
  if (fault(kMkdir)) return -1;
  return NEXT(mkdir)(path, mode);
}

}  // extern "C"
