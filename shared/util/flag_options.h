// Registers one field of a flag table (a `Visit...Fields` list) as a Boost.Program_options
// option that writes into the caller's struct at po::notify. Lets every program build its
// options from the same table its flags are emitted from (shared/ipc/worker_flags.h), instead
// of a second hand-written add_options() that could drift from it.
// Header-only because only programs (which link Boost.Program_options) include it.
#pragma once

#include <boost/program_options.hpp>
#include <optional>
#include <string>
#include <type_traits>

namespace thermocline {

// A value field: --NAME VALUE. The field's current value (the struct's default) is shown in
// --help unless it is an empty string, which stands for "not given".
template <class T>
void AddFlagOption(boost::program_options::options_description& opts, const char* name,
                   const char* help, T& value, bool required = false) {
  namespace po = boost::program_options;
  auto* semantic = po::value<T>()->notifier([&value](const T& v) { value = v; });
  if (required) {
    semantic->required();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!value.empty()) semantic->default_value(value);
  } else {
    semantic->default_value(value);
  }
  opts.add_options()(name, semantic, help);
}

// An optional field: absent (nullopt) unless given.
template <class T>
void AddFlagOption(boost::program_options::options_description& opts, const char* name,
                   const char* help, std::optional<T>& value, bool required = false) {
  namespace po = boost::program_options;
  auto* semantic = po::value<T>()->notifier([&value](const T& v) { value = v; });
  if (required) semantic->required();
  opts.add_options()(name, semantic, help);
}

// A switch: --NAME alone turns it on. Switches are off by default (po::bool_switch writes
// false when the flag is absent, which would undo a default of true).
inline void AddFlagOption(boost::program_options::options_description& opts, const char* name,
                          const char* help, bool& value, bool /*required*/ = false) {
  namespace po = boost::program_options;
  opts.add_options()(name, po::bool_switch()->notifier([&value](bool v) { value = v; }), help);
}

}  // namespace thermocline
