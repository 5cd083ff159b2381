#include <fcntl.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>

#include "test_util.h"

namespace {

using ferry::test::TempDir;

struct CliRun {
  int status;
  std::string out;  // stdout and stderr together
};

CliRun run(const std::string& args, const std::string& env = "") {
  std::string command = env + " " FERRY_CLI_PATH " " + args + " 2>&1";
  FILE* p = popen(command.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string sha256_hex(const std::vector<unsigned char>& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr);
  std::string hex;
  char two[3];
  for (unsigned int i = 0; i < length; ++i) {
    std::snprintf(two, sizeof two, "%02x", digest[i]);
    hex += two;
  }
  return hex;
}

TEST(Cli, DemoWritesReadsVerifiesAndCleansUp) {
  TempDir dir;
  CliRun r = run("demo --size 8MiB --dir " + dir.path().string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("data verified"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("route:"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "demo left files behind";
}

TEST(Cli, ReadChecksumMatchesAnIndependentSha256) {
  TempDir dir;
  auto data = ferry::test::random_bytes(3'000'017, 51);
  ferry::test::write_file(dir / "c.bin", data);
  CliRun r =
      run("read " + (dir / "c.bin").string() + " --host --checksum --offset 17 --task-size 64KiB");
  ASSERT_EQ(r.status, 0) << r.out;
  std::vector<unsigned char> tail(data.begin() + 17, data.end());
  EXPECT_NE(r.out.find("sha256: " + sha256_hex(tail)), std::string::npos) << r.out;
}

TEST(Cli, ReadJsonHasTheDocumentedFields) {
  TempDir dir;
  auto data = ferry::test::random_bytes(1 << 20, 52);
  ferry::test::write_file(dir / "j.bin", data);
  CliRun r = run("read " + (dir / "j.bin").string() + " --host --json --checksum --direct");
  ASSERT_EQ(r.status, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["bytes"], 1 << 20);
  EXPECT_EQ(j["memory"], "host");
  EXPECT_TRUE(j["seconds"].is_number());
  EXPECT_TRUE(j["gbps"].is_number());
  EXPECT_EQ(j["sha256"], sha256_hex(data));
  EXPECT_EQ(j["route"]["layer1"]["posix_tasks"], 1);
  EXPECT_TRUE(j["route"]["layer1"]["reasons"].is_array());
  EXPECT_TRUE(j["route"]["verdict"].is_string());
}

TEST(Cli, WriteChecksumMatchesTheFileAndLeavesNoPartialFile) {
  TempDir dir;
  auto path = dir / "w.bin";
  CliRun r = run("write " + path.string() + " --host --size 1000003 --checksum --json");
  ASSERT_EQ(r.status, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["bytes"], 1000003);
  EXPECT_EQ(j["sha256"], sha256_hex(ferry::test::read_file(path)));
  for (auto& entry : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path(), path) << "unexpected file " << entry.path();
  }
}

TEST(Cli, FailedWriteLeavesNothingThatLooksComplete) {
  TempDir dir;
  // Writing into a folder that does not exist fails before any byte is written.
  CliRun r = run("write " + (dir / "no/such/dir/x.bin").string() + " --host --size 1MiB");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("no/such/dir"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(Cli, BadEnvironmentValueNamesTheVariable) {
  TempDir dir;
  ferry::test::write_file(dir / "e.bin", {1, 2, 3});
  CliRun r = run("read " + (dir / "e.bin").string() + " --host", "FERRY_TASK_SIZE=4XB");
  EXPECT_EQ(r.status, 2) << "a malformed setting is refused before any work";
  EXPECT_NE(r.out.find("FERRY_TASK_SIZE='4XB'"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one line expected: " << r.out;
}

TEST(Cli, BadOptionValueNamesTheOption) {
  TempDir dir;
  ferry::test::write_file(dir / "o.bin", {1, 2, 3});
  CliRun r = run("read " + (dir / "o.bin").string() + " --host --task-size 0");
  EXPECT_EQ(r.status, 2) << "a malformed flag value is refused before any work";
  EXPECT_NE(r.out.find("--task-size='0'"), std::string::npos) << r.out;
}

TEST(Cli, MissingFileIsOneLineAndNonZero) {
  CliRun r = run("read /nonexistent/ferry.bin --host");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "ferry: open /nonexistent/ferry.bin: No such file or directory\n");
}

TEST(Cli, GpuWithoutDriverSaysSo) {
  TempDir dir;
  ferry::test::write_file(dir / "g.bin", {1, 2, 3});
  CliRun r = run("read " + (dir / "g.bin").string() + " --gpu 0",
                 "FERRY_CUDA_LIBRARY=/nonexistent/libcuda.so.1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("no CUDA driver: /nonexistent/libcuda.so.1 not found"), std::string::npos)
      << r.out;
}

TEST(Cli, EveryCommandHasHelp) {
  for (const char* command : {"", "read", "write", "demo"}) {
    CliRun r = run(std::string(command) + " --help");
    EXPECT_EQ(r.status, 0) << command << ": " << r.out;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << command;
  }
}

// ferry write's promise (docs/reliability.md): PATH holds the old file or the complete new one,
// whenever the writer is killed; nothing it leaves behind survives the next run.
TEST(CliWrite, KilledAtAnyMomentLeavesTheOldFileOrTheNewOne) {
  TempDir dir;
  const auto path = dir / "c.bin";
  const auto ref = dir / "ref.bin";
  ASSERT_EQ(run("write " + path.string() + " --host --size 4MiB --seed 1").status, 0);
  const std::string old_sha = sha256_hex(ferry::test::read_file(path));
  const auto t0 = std::chrono::steady_clock::now();
  // 32 MiB: eight tasks of the default 4 MiB in flight, written, synced and renamed; the kills
  // spread over that run's time whatever its length (96 MiB took 72 of CTest's 500 s).
  ASSERT_EQ(run("write " + ref.string() + " --host --size 32MiB --seed 2").status, 0);
  // Kills land anywhere from the start to a little after a whole run's time.
  const auto whole =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
  const std::string new_sha = sha256_hex(ferry::test::read_file(ref));
  std::mt19937 rng(5);
  int saw_old = 0, saw_new = 0;
  for (int i = 0; i < 20; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      dup2(null, 2);
      execl(FERRY_CLI_PATH, FERRY_CLI_PATH, "write", path.c_str(), "--host", "--size", "32MiB",
            "--seed", "2", static_cast<char*>(nullptr));
      _exit(127);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % (whole.count() * 13 / 10 + 1)));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    const std::string sha = sha256_hex(ferry::test::read_file(path));
    ASSERT_TRUE(sha == old_sha || sha == new_sha) << "round " << i << ": a partial file at PATH";
    if (sha == new_sha) {
      ++saw_new;
      ASSERT_EQ(run("write " + path.string() + " --host --size 4MiB --seed 1").status, 0);
    } else {
      ++saw_old;
    }
  }
  EXPECT_GT(saw_old, 0) << "no kill landed before the rename: the test proved nothing";
  // The next complete run removes what the killed ones left.
  ASSERT_EQ(run("write " + path.string() + " --host --size 1MiB").status, 0);
  for (auto& entry : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_TRUE(entry.path() == path || entry.path() == ref) << "left behind: " << entry.path();
  }
  std::printf("killed 20 writers: PATH held the old file %d times, the new one %d times\n", saw_old,
              saw_new);
}

TEST(CliWrite, SigtermRemovesTheTemporaryFileAtOnce) {
  TempDir dir;
  const auto path = dir / "t.bin";
  pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    execl(FERRY_CLI_PATH, FERRY_CLI_PATH, "write", path.c_str(), "--host", "--size", "1GiB",
          "--pattern", "zero", static_cast<char*>(nullptr));
    _exit(127);
  }
  // Until its temporary file exists.
  bool started = false;
  for (int i = 0; i < 4000 && !started; ++i) {  // up to 20 s on a loaded machine
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    for (auto& entry : std::filesystem::directory_iterator(dir.path())) {
      started = started || entry.path().filename().string().find(".ferry-") != std::string::npos;
    }
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(started) << "the writer never made its temporary file";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "a temporary file is left";
}

TEST(CliWrite, KeepsTheModeAndWritesThroughASymlink) {
  TempDir dir;
  const auto path = dir / "m.bin";
  ASSERT_EQ(run("write " + path.string() + " --host --size 4KiB").status, 0);
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  ASSERT_EQ(run("write " + path.string() + " --host --size 8KiB").status, 0);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_size, 8192);
  std::filesystem::create_symlink("m.bin", dir / "link");
  ASSERT_EQ(run("write " + (dir / "link").string() + " --host --size 12KiB").status, 0);
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "link"));
  EXPECT_EQ(std::filesystem::file_size(path), 12288u);
}

TEST(CliWrite, RefusesToReplaceAFifoOrADevice) {
  TempDir dir;
  const auto fifo = dir / "f";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  CliRun r = run("write " + fifo.string() + " --host --size 4KiB");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("is a FIFO"), std::string::npos) << r.out;
  struct stat st {};
  ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  r = run("write /dev/null --host --size 4KiB");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("is a character device"), std::string::npos) << r.out;
  ASSERT_EQ(stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

// Issue 45 B16: a FIFO or a device given to load or read is named for what it is and refused,
// never "no such file" (load said so), and nothing waits on the FIFO for a writer.
TEST(CliLoad, RefusesAFifoOrADeviceSayingWhatItIs) {
  TempDir dir;
  const auto fifo = dir / "model.safetensors";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  for (const std::string command : {"load", "read"}) {
    for (const auto& [path, kind] : {std::pair<std::string, std::string>{fifo.string(), "a FIFO"},
                                     {"/dev/zero", "a character device"}}) {
      CliRun r = run(command + " " + path + " --host");
      EXPECT_EQ(r.status, 1) << command << " " << path << ": " << r.out;
      EXPECT_NE(r.out.find(path), std::string::npos) << r.out;
      EXPECT_NE(r.out.find(kind), std::string::npos) << command << ": " << r.out;
      EXPECT_EQ(r.out.find("no such file"), std::string::npos) << r.out;
    }
  }
}

// A failed rename names its real cause (it said "Success" once, the code overwritten by the
// cleanup) and leaves PATH and its folder as they were. An immutable file (chattr +i) refuses it.
TEST(CliWrite, AFailedRenameNamesItsCauseAndChangesNothing) {
  TempDir dir(std::filesystem::current_path().string());  // chattr needs ext4 or xfs, not tmpfs
  const auto path = dir / "i.bin";
  ASSERT_EQ(run("write " + path.string() + " --host --size 4KiB").status, 0);
  if (std::system(("chattr +i " + path.string() + " 2>/dev/null").c_str()) != 0) {
    GTEST_SKIP() << "chattr +i is not available here (needs root and ext4/xfs)";
  }
  CliRun r = run("write " + path.string() + " --host --size 8KiB");
  EXPECT_EQ(std::system(("chattr -i " + path.string()).c_str()), 0);
  EXPECT_NE(r.status, 0);
  // Refused by the check that the file could be opened for writing (issue 30), before the rename.
  EXPECT_TRUE(r.out.find("rename") != std::string::npos || r.out.find("open") != std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(std::strerror(EPERM)), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Success"), std::string::npos) << r.out;
  EXPECT_EQ(std::filesystem::file_size(path), 4096u);
  for (auto& entry : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path(), path) << "left behind: " << entry.path();
  }
}

// Issue 30, finding 1: ferry write followed links itself, so the kernel's fs.protected_symlinks
// rule never ran: a link that `nobody` planted in a sticky world-writable folder, pointing at
// root's 0600 file, let root's `ferry write link` replace the victim (dd of=link is refused).
TEST(CliWrite, ALinkThatProtectedSymlinksForbidsIsNotFollowed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (to give the link to another user)";
  TempDir dir;
  ASSERT_EQ(chmod(dir.path().c_str(), 01777), 0);  // like /tmp, owned by root
  const auto victim = dir / "victim";
  ferry::test::write_file(victim, std::vector<unsigned char>(100, 'v'));
  ASSERT_EQ(chmod(victim.c_str(), 0600), 0);
  std::filesystem::create_symlink(victim, dir / "link");
  ASSERT_EQ(lchown((dir / "link").c_str(), 65534, 65534), 0);
  CliRun r = run("write " + (dir / "link").string() + " --host --size 4KiB --pattern zero");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("protected_symlinks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not followed"), std::string::npos) << r.out;
  EXPECT_EQ(std::filesystem::file_size(victim), 100u);
  // The folder's owner's link, and the caller's own link, are followed as the kernel would.
  ASSERT_EQ(lchown((dir / "link").c_str(), 0, 0), 0);
  r = run("write " + (dir / "link").string() + " --host --size 4KiB --pattern zero");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(std::filesystem::file_size(victim), 4096u);
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "link"));
}

// Finding 1, second half: a rename needs only the folder's permission, so a user who may write a
// folder replaced files there that they could not open for writing (root's 0600 file, through a
// link of their own in a folder that is not sticky). Now refused with the open's errno.
TEST(CliWrite, AFileTheCallerCouldNotOpenForWritingIsNotReplaced) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (to run the CLI as nobody)";
  if (std::system("command -v setpriv >/dev/null") != 0) GTEST_SKIP() << "setpriv is missing";
  TempDir dir;
  ASSERT_EQ(chmod(dir.path().c_str(), 0777), 0);
  const auto victim = dir / "root-owned";
  ferry::test::write_file(victim, std::vector<unsigned char>(100, 'v'));
  ASSERT_EQ(chmod(victim.c_str(), 0644), 0);
  std::filesystem::create_symlink(victim, dir / "link");
  ASSERT_EQ(lchown((dir / "link").c_str(), 65534, 65534), 0);
  const std::string as_nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups";
  for (const std::string name : {"link", "root-owned"}) {
    CliRun r = run("write " + (dir / name).string() + " --host --size 4KiB", as_nobody);
    EXPECT_NE(r.status, 0) << name << ": " << r.out;
    EXPECT_NE(r.out.find(std::strerror(EACCES)), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("could open for writing"), std::string::npos) << r.out;
    EXPECT_EQ(std::filesystem::file_size(victim), 100u) << name;
  }
}

// Finding 13: a temporary file that cannot be made printed "temporary file beside the dest",
// without the errno; `ferry write ""` printed "rename  offset=0".
TEST(CliWrite, ATemporaryFileThatCannotBeMadeNamesItsErrnoAndAnEmptyPathIsNamed) {
  TempDir dir;
  CliRun r = run("write " + (dir / "missing/x.bin").string() + " --host --size 4KiB");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find(std::strerror(ENOENT)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("temporary file beside"), std::string::npos) << r.out;
  if (geteuid() == 0 && std::system("command -v setpriv >/dev/null") == 0) {
    ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);  // nobody may not create files here
    r = run("write " + (dir / "x.bin").string() + " --host --size 4KiB",
            "setpriv --reuid=65534 --regid=65534 --clear-groups");
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.out.find(std::strerror(EACCES)), std::string::npos) << r.out;
  }
  r = run("write '' --host --size 4KiB");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("empty path"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("rename"), std::string::npos) << r.out;
}

// Finding 18: replacing splits hard links (the other names keep the old bytes), so a file with
// other links is refused; its access ACL goes to the new file; a setuid bit is kept with its
// owner and dropped, saying so, when the new file cannot have that owner.
TEST(CliWrite, AHardLinkedFileIsRefusedAndAclsAndSetuidAreHandled) {
  TempDir dir;
  const auto path = dir / "h.bin";
  ferry::test::write_file(path, std::vector<unsigned char>(100, 'h'));
  ASSERT_EQ(link(path.c_str(), (dir / "other").c_str()), 0);
  CliRun r = run("write " + path.string() + " --host --size 4KiB");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("2 hard links"), std::string::npos) << r.out;
  EXPECT_EQ(std::filesystem::file_size(path), 100u);
  std::filesystem::remove(dir / "other");

  // An access ACL giving uid 4242 read and write (the xattr's binary form: version 2, then
  // entries of tag, permissions, id).
  struct Entry {
    std::uint16_t tag, perm;
    std::uint32_t id;
  };
  const Entry entries[] = {Entry{0x01, 6, ~0u}, Entry{0x02, 6, 4242}, Entry{0x04, 4, ~0u},
                           Entry{0x10, 6, ~0u}, Entry{0x20, 4, ~0u}};
  // Sized first and filled by memcpy: g++ 13 warned (-Wstringop-overflow, a false positive) on
  // growing the vector by inserts.
  std::vector<unsigned char> acl(4 + sizeof entries);
  const std::uint32_t version = 2;
  std::memcpy(acl.data(), &version, 4);
  std::memcpy(acl.data() + 4, entries, sizeof entries);
  if (setxattr(path.c_str(), "system.posix_acl_access", acl.data(), acl.size(), 0) == 0) {
    ASSERT_EQ(run("write " + path.string() + " --host --size 4KiB").status, 0);
    std::vector<unsigned char> got(acl.size());
    EXPECT_EQ(getxattr(path.c_str(), "system.posix_acl_access", got.data(), got.size()),
              static_cast<ssize_t>(acl.size()));
    EXPECT_EQ(got, acl) << "the ACL did not follow the file";
    ASSERT_EQ(removexattr(path.c_str(), "system.posix_acl_access"), 0);
  } else {
    std::printf("skipped the ACL part: this file system has no POSIX ACLs (%s)\n",
                std::strerror(errno));
  }

  if (geteuid() != 0 || std::system("command -v setpriv >/dev/null") != 0) return;
  // Root over nobody's setuid file: owner and bit kept.
  ASSERT_EQ(chown(path.c_str(), 65534, 65534), 0);
  ASSERT_EQ(chmod(path.c_str(), 04755), 0);
  r = run("write " + path.string() + " --host --size 4KiB");
  ASSERT_EQ(r.status, 0) << r.out;
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u);
  EXPECT_EQ(st.st_mode & 07777, 04755u);
  // Nobody over root's setuid file (writable by all, in a folder nobody may write): the new file
  // is nobody's, so the bit goes, and the command says so.
  ASSERT_EQ(chmod(dir.path().c_str(), 0777), 0);
  ASSERT_EQ(chown(path.c_str(), 0, 0), 0);
  ASSERT_EQ(chmod(path.c_str(), 04777), 0);
  r = run("write " + path.string() + " --host --size 4KiB",
          "setpriv --reuid=65534 --regid=65534 --clear-groups");
  ASSERT_EQ(r.status, 0) << r.out;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u);
  EXPECT_EQ(st.st_mode & 07777, 0777u);
  EXPECT_NE(r.out.find("never gives a setuid or setgid bit to another owner"), std::string::npos)
      << r.out;
}

// Issue 11, bugs 3 and 4, and the CLI details: each was a hang, a crash or a misleading line.
TEST(CliLimits, SizesThatOverflowAreClearErrorsNotHangsOrCrashes) {
  TempDir dir;
  const auto path = dir / "a.bin";
  ASSERT_EQ(run("write " + path.string() + " --host --size 1MiB").status, 0);
  // An alignment round-up wrapped to 0 and looped forever.
  CliRun r = run(
      "read " + path.string() + " --host --direct --offset 1 --bounce-size 18446744073709551615",
      "timeout 20");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("bounce_buffer_size"), std::string::npos) << r.out;
  // A page round-up wrapped: 0 bytes allocated for SIZE_MAX, then a segfault.
  r = run("write " + (dir / "o.bin").string() + " --size 18446744073709551615 --host");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("cannot allocate"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir / "o.bin"));
  // Asking for more than the file holds allocates what it holds, and says so.
  r = run("read " + path.string() + " --host --size 100GiB");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("read 1048576 B"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("reading 1048576 B of the 107374182400 B asked for"), std::string::npos)
      << r.out;
  r = run("read " + path.string() + " --host --offset 1MiB");
  EXPECT_NE(r.out.find("at or past the end of the file"), std::string::npos) << r.out;
  // Task sizes and thread counts that would cost more than they give.
  r = run("read " + path.string() + " --host --task-size 1");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("task_size=1: must be from 4 KiB"), std::string::npos) << r.out;
  r = run("read " + path.string() + " --host --threads 4096");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("from 1 to 256"), std::string::npos) << r.out;
}

TEST(CliLimits, ZeroOffsetInAnySpellingAndRepeatAtLeastOne) {
  TempDir dir;
  const auto path = dir / "a.bin";
  ASSERT_EQ(run("write " + path.string() + " --host --size 64KiB").status, 0);
  for (const char* zero : {"0", "00", "0B", "0KiB"}) {
    CliRun r = run("read " + path.string() + " --host --offset " + zero);
    EXPECT_EQ(r.status, 0) << zero << ": " << r.out;
    EXPECT_NE(r.out.find("read 65536 B"), std::string::npos) << zero << ": " << r.out;
    // explain reads --offset as read does (it refused "00" and "0B" as sizes).
    r = run("explain " + path.string() + " --host --json --offset " + zero);
    EXPECT_EQ(r.status, 0) << zero << ": " << r.out;
  }
  CliRun r = run("read " + path.string() + " --host --offset 0XB");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("'0XB'"), std::string::npos) << r.out;
  r = run("read " + path.string() + " --host --repeat 0");
  EXPECT_NE(r.status, 0);
  // CLI11 words it "not in range 1 to 1000000" or "[1 - 1000000]" depending on its version.
  EXPECT_NE(r.out.find("--repeat"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1000000"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(".000000"), std::string::npos) << r.out;
  // CPU time in one unit whatever the size (issue 35): CPU-s/GiB, never microseconds.
  r = run("read " + path.string() + " --host");
  EXPECT_NE(r.out.find("CPU-s/GiB"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("us of CPU"), std::string::npos) << r.out;
}

// Issue 11's CLI details: a plan of a read that cannot run, a rounded size that hid bytes, and a
// check of a path that does not exist (it described / instead).
TEST(CliLimits, PlanAndCheckSayWhenTheirInputCannotBe) {
  CliRun r = run("plan --size 18446744073709551615");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("EOVERFLOW"), std::string::npos) << r.out;
  r = run("plan --size 16MiB --task-size 4194303");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("4194303 B"), std::string::npos) << r.out;
  r = run("plan --size 16MiB --task-size 1");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("task_size"), std::string::npos) << r.out;
  r = run("check --path /nonexistent/ferry-check");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("/nonexistent/ferry-check"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("no such file"), std::string::npos) << r.out;
}

}  // namespace
