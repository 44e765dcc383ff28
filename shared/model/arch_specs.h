// The specs of the architectures in arch.cc's table, one arch_<name>.cc each, and the helpers
// their read_extra hooks share. Internal to shared/model/.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "shared/model/arch.h"

namespace thermocline {

extern const ArchSpec kLlamaArch, kMistralArch, kBambooArch, kQwen2Arch, kQwen2MoeArch,
    kQwen3Arch, kQwen3MoeArch, kOlmo2Arch, kGemma2Arch, kGemma3Arch, kPhi3Arch, kStarcoder2Arch,
    kFalconArch;

// `<arch>.<suffix>` of config.arch as a positive integer (required) or a real (optional, must be
// > 0), with errors naming the key and the file.
absl::StatusOr<int64_t> ArchPositiveInt(const GgufFile& file, const ModelConfig& config,
                                        std::string_view suffix);
absl::StatusOr<float> ArchPositiveRealOr(const GgufFile& file, const ModelConfig& config,
                                         std::string_view suffix, float fallback);

}  // namespace thermocline
