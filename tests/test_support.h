// Helpers shared by tests: where the team's reference data lives, temporary files, binaries.
#pragma once

#include <string>
#include <vector>

namespace thermocline::testing {

// ../shared beside the checkout (override with THERMOCLINE_SHARED_DATA_DIR in the environment).
std::string SharedDataDir();
// SharedDataDir() + "/models/" + rel.
std::string ModelPath(const std::string& rel);
// Directory holding the built executables (thermocline, workers).
std::string BinDir();
// A fresh directory under $TMPDIR, removed when the test binary exits.
std::string TempDir();
// Whole file as bytes; aborts the test on failure.
std::string ReadFileOrDie(const std::string& path);
std::vector<float> ReadF32File(const std::string& path);

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
// Runs argv[0] with the given arguments (no shell), capturing stdout and stderr.
CommandResult RunCommand(const std::vector<std::string>& argv);

}  // namespace thermocline::testing
