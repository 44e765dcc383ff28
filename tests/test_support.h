// Helpers shared by tests: where the team's reference data lives, temporary files, binaries.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "shared/gguf/gguf.h"
#include "shared/model/model.h"
#include "shared/model/synth.h"

namespace thermocline::testing {

// ../shared beside the checkout (override with THERMOCLINE_SHARED_DATA_DIR in the environment).
std::string SharedDataDir();
// Why the reference data is unusable here ("" when it is there): SharedDataDir() or its
// models/stories260K/stories260K.gguf is missing. A fresh clone has no ../shared (README.md,
// "Reference data").
std::string MissingSharedData();

// At the top of a test (or SetUp) that reads ../shared: without it the test is skipped with
// the reason; with CI set in the environment it fails instead, since CI must have the data.
// A binary all of whose tests need it links tests/require_shared_data.cc instead.
#define THERMOCLINE_REQUIRE_SHARED_DATA()                                                   \
  do {                                                                                     \
    if (const std::string why_ = ::thermocline::testing::MissingSharedData(); !why_.empty()) { \
      if (std::getenv("CI") != nullptr) GTEST_FAIL() << why_ << " (CI is set: not skipping)"; \
      GTEST_SKIP() << why_;                                                                \
    }                                                                                      \
  } while (0)
// SharedDataDir() + "/models/" + rel.
std::string ModelPath(const std::string& rel);
// Directory holding the built executables (thermocline, workers): THERMOCLINE_BIN_DIR from the
// environment, else the build tree's bin/.
std::string BinDir();
// A fresh directory under $TMPDIR, removed when the test binary exits.
std::string TempDir();
// Writes a copy of the GGUF `src` to `dst` with `metadata` set (keys it has are replaced, the
// others added) and every tensor byte for byte: a reference model with one more key.
absl::Status CopyGgufWithMetadata(const std::string& src,
                                  const std::vector<std::pair<std::string, GgufValue>>& metadata,
                                  const std::string& dst);
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
// The number before " bytes in interleaved copies" in a command's standard error, or -1.
int64_t InterleavedBytes(const std::string& err);

// `thermocline teal-calibrate` of `model` at the single target 0.5 on a few hundred tokens of
// the tiny-stories corpus, written to `out` (a real profile, quickly: not a good one). Returns
// the command's result (exit code 0 on success).
CommandResult CalibrateTealProfile(const std::string& model, const std::string& out);

// A small synthetic model (dim 64, ffn 160, 2 layers, 4 heads / 2 KV heads, vocab 300, context
// 32) of `type` and FFN `kind`, written to TempDir()/<name>.gguf and loaded; null (with a test
// failure) when either step fails.
std::unique_ptr<Model> SmallSynthModel(GgmlType type, SynthFfnKind kind,
                                       const std::string& name = "m");

}  // namespace thermocline::testing
