#include "shared/sparsity/profile_fields.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace thermocline {

absl::Status ProfileFieldError(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

absl::StatusOr<int64_t> ReadCountField(const GgufFile& f, const std::string& where,
                                       const std::string& key) {
  absl::StatusOr<int64_t> v = f.GetInt(key);
  if (!v.ok()) return ProfileFieldError(where, std::string(v.status().message()));
  if (*v <= 0 || *v > (int64_t{1} << 40)) {
    return ProfileFieldError(where, absl::StrCat(key, " = ", *v, " is out of range"));
  }
  return *v;
}

absl::StatusOr<std::vector<float>> ReadF32Field(const GgufFile& f, const std::string& where,
                                                const std::string& name, int64_t n) {
  const GgufTensorInfo* t = f.FindTensor(name);
  if (t == nullptr) return ProfileFieldError(where, absl::StrCat("tensor '", name, "' is missing"));
  if (t->type != GgmlType::kF32) {
    return ProfileFieldError(where, absl::StrCat("tensor '", name, "' has type ",
                                                 std::string(TypeTraits(t->type).name),
                                                 ", expected f32"));
  }
  if (t->ne.size() != 1 || (n >= 0 && t->ne[0] != n) || (n < 0 && t->ne[0] < 1)) {
    return ProfileFieldError(
        where, absl::StrCat("tensor '", name, "' has shape (", absl::StrJoin(t->ne, ", "),
                            "), expected (", n >= 0 ? absl::StrCat(n) : "n >= 1", ")"));
  }
  std::vector<float> out(t->ne[0]);
  std::memcpy(out.data(), t->data, out.size() * sizeof(float));
  return out;
}

std::string_view F32Bytes(const std::vector<float>& v) {
  return std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

}  // namespace thermocline
