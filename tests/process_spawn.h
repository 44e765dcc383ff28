// Starting a test's child process without a shell: which of its standard descriptors are pipes
// back to the test and where its stderr goes. Every process-spawning test goes through here, so
// the descriptor rules (the child holds only its own ends, the test only the other ones; a
// leaked write end would keep the test's read from ever seeing EOF) are kept in one place.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace thermocline::testing {

struct SpawnOptions {
  // Each one set is a pipe: its child end becomes the child's 0, 1 or 2 and its other end is
  // returned to the test. Unset: the child shares the test's descriptor.
  bool stdin_pipe = false;
  bool stdout_pipe = false;
  bool stderr_pipe = false;
  // When not empty (and stderr_pipe is unset): the child's stderr is this file, created 0600 if
  // missing, appended to (several children writing one log) or truncated.
  std::string stderr_file;
  bool stderr_append = false;
};

// The started child and the test's pipe ends (-1 where none was asked for). The caller closes
// the ends and reaps the pid.
struct SpawnedProcess {
  pid_t pid = -1;
  int stdin_fd = -1;   // write end of the child's stdin
  int stdout_fd = -1;  // read end of the child's stdout
  int stderr_fd = -1;  // read end of the child's stderr
};

// Runs argv[0] (a path, not searched in PATH) with argv and the test's environment. Errors name
// the program and carry strerror of what failed (pipe2, or posix_spawn's code: a missing
// binary, an unopenable stderr file).
absl::StatusOr<SpawnedProcess> SpawnProcess(const std::vector<std::string>& argv,
                                            const SpawnOptions& options = {});

}  // namespace thermocline::testing
