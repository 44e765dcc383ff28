#include "absl/strings/str_cat.h"
#include "shared/model/arch_specs.h"
#include "shared/gguf/gguf.h"
#include "shared/model/model.h"
#include "shared/util/status_macros.h"

namespace thermocline {

absl::StatusOr<int64_t> ArchPositiveInt(const GgufFile& file, const ModelConfig& config,
                                        std::string_view suffix) {
  const std::string key = absl::StrCat(std::string(config.arch->name), ".", std::string(suffix));
  TC_ASSIGN_OR_RETURN(int64_t v, file.GetInt(key));
  if (v <= 0 || v > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat("model ", file.path(), ": ", key, " = ", v,
                                                   " is out of range (must be in 1..2^31)"));
  }
  return v;
}

absl::StatusOr<float> ArchPositiveRealOr(const GgufFile& file, const ModelConfig& config,
                                         std::string_view suffix, float fallback) {
  const std::string key = absl::StrCat(std::string(config.arch->name), ".", std::string(suffix));
  if (file.FindValue(key) == nullptr) return fallback;
  TC_ASSIGN_OR_RETURN(double v, file.GetDouble(key));
  if (!(v > 0 && v < 1e30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", file.path(), ": ", key, " = ", v, " must be > 0"));
  }
  return static_cast<float>(v);
}

}  // namespace thermocline
