// Reading the fields of the GGUF files Thermocline's offline steps write (activation statistics,
// shared/sparsity/activation_stats.h; TEAL profiles, teal_profile.h): one set of checks and one
// wording, each error prefixed with `where` (the file).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shared/gguf/gguf.h"

namespace thermocline {

// InvalidArgument "<where>: <what>".
absl::Status ProfileFieldError(const std::string& where, const std::string& what);

// An integer key holding a count: present, in [1, 2^40].
absl::StatusOr<int64_t> ReadCountField(const GgufFile& f, const std::string& where,
                                       const std::string& key);

// A 1-D F32 tensor of `n` values (n < 0: any length, at least 1).
absl::StatusOr<std::vector<float>> ReadF32Field(const GgufFile& f, const std::string& where,
                                                const std::string& name, int64_t n);

// The bytes of `v`, for GgufWriter::AddTensorBytes.
std::string_view F32Bytes(const std::vector<float>& v);

}  // namespace thermocline
