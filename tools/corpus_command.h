// The skeleton of the commands that run a model over a text corpus and write one result file
// (`profile`, `teal-calibrate`): the flags they share (--model, --corpus, -o, --tokens,
// --targets, --threads), loading, tokenizing, the thread pool, the timing and the error
// reporting, so that each command states only its own options and its one step.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shared/model/model.h"
#include "shared/util/thread_pool.h"
#include "tools/command.h"

namespace thermocline::tools {

// What the command's own step gets: the loaded model, the corpus tokens, --targets parsed.
struct CorpusInput {
  const Model& model;
  const std::vector<int32_t>& tokens;
  const std::vector<float>& targets;
  ThreadPool& pool;
};

struct CorpusCommand {
  std::string name;   // "profile"
  std::string usage;  // after the name in the usage line
  std::string output_help;
  std::string tokens_help;
  std::string targets_default;
  std::string targets_help;
  // Adds the command's own options (bound to its own variables).
  std::function<void(po::options_description&)> add_options;
  // Checks the command's options against the model; runs before the corpus is read.
  std::function<absl::Status(const std::vector<float>& targets, const Model&)> validate;
  // Optional: readies the model for the step (after validate, before the corpus is read).
  std::function<absl::Status(Model&)> prepare;
  // Runs the step and writes `output`; returns the line to print on stderr (without the
  // seconds and threads, which are appended), or the error.
  std::function<absl::StatusOr<std::string>(const CorpusInput&, const std::string& output)> run;
};

// Parses `args` for `command` and runs it; the process exit code (0, 1 on an error named on
// stderr as "thermocline NAME: ...", 2 on bad options).
int RunCorpusCommand(const CorpusCommand& command, const std::vector<std::string>& args);

}  // namespace thermocline::tools
