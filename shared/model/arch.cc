#include "shared/model/arch.h"

#include <array>

#include "absl/strings/str_join.h"
#include "shared/model/arch_specs.h"

namespace thermocline {
namespace {

// The one table of architectures: each spec lives in its own arch_<name>.cc.
const std::array<const ArchSpec*, 13> kArchs = {
    &kLlamaArch,  &kQwen2Arch, &kQwen2MoeArch,   &kQwen3Arch,  &kQwen3MoeArch,
    &kOlmo2Arch,  &kGemma2Arch, &kGemma3Arch,    &kPhi3Arch,   &kStarcoder2Arch,
    &kFalconArch, &kBambooArch, &kMistralArch,
};

}  // namespace

const ArchSpec* FindArch(std::string_view name) {
  for (const ArchSpec* a : kArchs) {
    if (a->name == name) return a;
  }
  return nullptr;
}

std::span<const ArchSpec* const> AllArchs() { return kArchs; }

const char* ActivationName(FfnActivation a) {
  switch (a) {
    case FfnActivation::kSilu:
      return "silu";
    case FfnActivation::kRelu:
      return "relu";
    case FfnActivation::kGelu:
      return "gelu";
    case FfnActivation::kDrelu:
      return "drelu";
  }
  return "?";
}

std::string KnownArchNames() {
  return absl::StrJoin(kArchs, ", ", [](std::string* out, const ArchSpec* a) {
    out->append(a->name);
  });
}

}  // namespace thermocline
