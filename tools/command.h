// The `thermocline` command is a set of subcommands, one per cmd_*.cc file, each registering
// itself here. Options are parsed with Boost.Program_options.
#pragma once

#include <boost/program_options.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace thermocline::tools {

namespace po = boost::program_options;

struct Command {
  std::string name;
  std::string summary;  // one line for `thermocline --help`
  // Receives the arguments after the subcommand name; returns the process exit code.
  int (*run)(const std::vector<std::string>& args);
};

// Static registration: `static CommandRegistrar reg({"info", "...", &RunInfo});`
struct CommandRegistrar {
  explicit CommandRegistrar(Command command);
};

const std::vector<Command>& Commands();

// Parses `args` against `options` (plus --help) and `positional`. On --help prints usage to
// stdout and returns 0 through `exit_code`; on a bad option prints the error and usage to stderr
// and returns 2. Returns true when the command should go on.
bool ParseOptions(const std::string& command, const std::string& usage,
                  const po::options_description& options,
                  const po::positional_options_description& positional,
                  const std::vector<std::string>& args, po::variables_map& vm, int& exit_code);

// A comma-separated list of numbers given to `flag` ("0.5,0.7,0.9"); the error names the flag
// and the piece that is not a number.
absl::StatusOr<std::vector<float>> ParseFloatList(std::string_view flag, std::string_view text);

}  // namespace thermocline::tools
