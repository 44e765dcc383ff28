// The tests' spawn helper (tests/process_spawn.h) on real programs: bytes through the stdin and
// stdout pipes of /bin/cat, stderr appended to or truncating a file, EOF once the child exits
// (no pipe end left open in the child), and the error for a missing program.
#include "tests/process_spawn.h"

#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace thermocline::testing {
namespace {

std::string ReadAll(int fd) {
  std::string s;
  char buf[256];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) s.append(buf, n);
  return s;
}

int Reap(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(ProcessSpawn, StdinAndStdoutPipesCarryBytesAndEndAtEof) {
  auto child = SpawnProcess({"/bin/cat"}, {.stdin_pipe = true, .stdout_pipe = true});
  ASSERT_TRUE(child.ok()) << child.status();
  const std::string text = "through cat\n";
  ASSERT_EQ(write(child->stdin_fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(child->stdin_fd);  // cat sees EOF only if the child holds no copy of the write end
  EXPECT_EQ(ReadAll(child->stdout_fd), text);
  close(child->stdout_fd);
  EXPECT_EQ(child->stderr_fd, -1);
  EXPECT_EQ(Reap(child->pid), 0);
}

TEST(ProcessSpawn, StderrFileIsAppendedToOrTruncated) {
  const std::string log = TempDir() + "/process_spawn_test.log";
  std::ofstream(log) << "before\n";
  auto run = [&](bool append) {
    // ls of a missing path writes its complaint to stderr and exits non-zero.
    auto child = SpawnProcess({"/bin/ls", "/nonexistent-process-spawn-test"},
                              {.stderr_file = log, .stderr_append = append});
    ASSERT_TRUE(child.ok()) << child.status();
    EXPECT_NE(Reap(child->pid), 0);
  };
  run(true);
  std::string s = ReadFileOrDie(log);
  EXPECT_EQ(s.rfind("before\n", 0), 0u) << s;
  EXPECT_NE(s.find("nonexistent-process-spawn-test"), std::string::npos) << s;
  run(false);
  s = ReadFileOrDie(log);
  EXPECT_EQ(s.find("before"), std::string::npos) << s;
  EXPECT_NE(s.find("nonexistent-process-spawn-test"), std::string::npos) << s;
}

TEST(ProcessSpawn, StderrPipe) {
  auto child = SpawnProcess({"/bin/ls", "/nonexistent-process-spawn-test"},
                            {.stdout_pipe = true, .stderr_pipe = true});
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(ReadAll(child->stdout_fd), "");
  EXPECT_NE(ReadAll(child->stderr_fd).find("nonexistent-process-spawn-test"), std::string::npos);
  close(child->stdout_fd);
  close(child->stderr_fd);
  EXPECT_NE(Reap(child->pid), 0);
}

TEST(ProcessSpawn, MissingProgramAndBadOptionsAreClearErrors) {
  auto missing = SpawnProcess({"/nonexistent/program"}, {.stdout_pipe = true});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(),
            "cannot spawn /nonexistent/program: No such file or directory");
  EXPECT_FALSE(SpawnProcess({}).ok());
  EXPECT_FALSE(SpawnProcess({"/bin/cat"}, {.stderr_pipe = true, .stderr_file = "x"}).ok());
}

}  // namespace
}  // namespace thermocline::testing
