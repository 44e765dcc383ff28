#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "shared/util/startup_environment.h"
#include "shared/util/version.h"
#include "tools/command.h"

namespace thermocline::tools {

namespace {
std::vector<Command>& Registry() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace

void PrintUsage(std::ostream& os) {
  os << "usage: thermocline <command> [options]\n\ncommands:\n";
  for (const Command& c : Commands()) {
    os << "  " << c.name << std::string(c.name.size() < 16 ? 16 - c.name.size() : 1, ' ')
       << c.summary << "\n";
  }
  os << "\n`thermocline <command> --help` describes each command; `thermocline --version` "
        "prints the version.\n";
}

CommandRegistrar::CommandRegistrar(Command command) { Registry().push_back(std::move(command)); }

const std::vector<Command>& Commands() { return Registry(); }

absl::StatusOr<std::vector<float>> ParseFloatList(std::string_view flag, std::string_view text) {
  std::vector<float> out;
  for (absl::string_view piece : absl::StrSplit(absl::string_view(text.data(), text.size()), ',')) {
    float v = 0;
    if (!absl::SimpleAtof(absl::StripAsciiWhitespace(piece), &v)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: '%s' is not a number", std::string(flag), std::string(piece)));
    }
    out.push_back(v);
  }
  return out;
}

bool ParseOptions(const std::string& command, const std::string& usage,
                  const po::options_description& options,
                  const po::positional_options_description& positional,
                  const std::vector<std::string>& args, po::variables_map& vm, int& exit_code) {
  po::options_description all;
  all.add_options()("help,h", "show this help");
  all.add(options);
  auto print_usage = [&](std::ostream& os) {
    os << "usage: thermocline " << command << " " << usage << "\n\n" << all << "\n";
  };
  try {
    po::store(po::command_line_parser(args).options(all).positional(positional).run(), vm);
    if (vm.count("help")) {
      print_usage(std::cout);
      exit_code = 0;
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "thermocline " << command << ": " << e.what() << "\n\n";
    print_usage(std::cerr);
    exit_code = 2;
    return false;
  }
  return true;
}

}  // namespace thermocline::tools

int main(int argc, char** argv) {
  using thermocline::tools::Commands;
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    thermocline::tools::PrintUsage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? 2 : 0;
  }
  if (std::string(argv[1]) == "--version") {
    std::cout << "thermocline " << thermocline::Version() << "\n";
    return 0;
  }
  const std::string name = argv[1];
  for (const auto& c : Commands()) {
    if (c.name == name) {
      if (absl::Status env = thermocline::CheckEnvironmentSwitches(); !env.ok()) {
        std::cerr << "thermocline " << name << ": " << env.message() << "\n";
        return 2;
      }
      std::vector<std::string> args(argv + 2, argv + argc);
      try {
        return c.run(args);
      } catch (const std::exception& e) {
        std::cerr << "thermocline " << name << ": " << e.what() << "\n";
        return 1;
      }
    }
  }
  std::cerr << "thermocline: unknown command '" << name << "'\n\n";
  thermocline::tools::PrintUsage(std::cerr);
  return 2;
}
