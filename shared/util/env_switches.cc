#include "shared/util/env_switches.h"

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace thermocline {
namespace {

struct SwitchInfo {
  EnvSwitch id;
  const char* name;
  const char* off;  // what 0 turns off
};

constexpr SwitchInfo kSwitches[] = {
    {EnvSwitch::kRepack, "THERMOCLINE_REPACK",
     "the interleaved copies of the Q4_0, Q5_0, Q8_0, K-quant and IQ4_XS matrices used only "
     "densely"},
    {EnvSwitch::kNeuronBundles, "THERMOCLINE_NEURON_BUNDLES",
     "the side-by-side copies of each sparse neuron's gate, up and down rows"},
    {EnvSwitch::kHugePages, "THERMOCLINE_HUGEPAGES",
     "the huge-page advice for weight copies, the KV cache and the cpu worker's rows"},
    {EnvSwitch::kAmx, "THERMOCLINE_AMX", "the AMX-INT8 prompt GEMMs"},
};

constexpr std::array<EnvSwitch, std::size(kSwitches)> kAll = [] {
  std::array<EnvSwitch, std::size(kSwitches)> all{};
  for (size_t i = 0; i < all.size(); ++i) all[i] = kSwitches[i].id;
  return all;
}();

const SwitchInfo& Info(EnvSwitch s) {
  for (const SwitchInfo& i : kSwitches) {
    if (i.id == s) return i;
  }
  return kSwitches[0];  // unreachable: every enumerator has a row
}

}  // namespace

std::span<const EnvSwitch> AllEnvSwitches() { return kAll; }

const char* EnvSwitchName(EnvSwitch s) { return Info(s).name; }

absl::StatusOr<bool> ReadEnvSwitch(EnvSwitch s) {
  const SwitchInfo& info = Info(s);
  const char* v = std::getenv(info.name);
  if (v == nullptr || *v == '\0' || std::string_view(v) == "1") return true;
  if (std::string_view(v) == "0") return false;
  return absl::InvalidArgumentError(absl::StrCat(info.name, "='", v, "' must be 0 (turns off ",
                                                 info.off, ") or 1 (the default)"));
}

bool EnvSwitchOn(EnvSwitch s) {
  absl::StatusOr<bool> on = ReadEnvSwitch(s);
  if (on.ok()) return *on;
  static std::atomic<unsigned> warned{0};
  const unsigned bit = 1u << static_cast<unsigned>(s);
  if ((warned.fetch_or(bit) & bit) == 0) {
    std::fprintf(stderr, "thermocline: %s; taken as 1\n",
                 std::string(on.status().message()).c_str());
  }
  return true;
}

}  // namespace thermocline
