// GGUF v2/v3 reading (over mmap, validated before any data is touched) and writing.
//
// Everything read from a file is untrusted: counts, string lengths, dims, types, offsets and
// sizes are checked against the file size, and a bad file yields an InvalidArgument error whose
// message names the field and its byte offset. PowerInfer's files (magic "PWRI", same layout)
// are accepted.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shared/gguf/ggml_type.h"

namespace thermocline {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

struct GgufValue;

struct GgufArray {
  GgufValueType element_type = GgufValueType::kUint8;
  std::vector<GgufValue> items;
};

struct GgufValue {
  using Storage = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                               std::string, GgufArray, uint64_t, int64_t, double>;
  Storage v;

  GgufValueType type() const { return static_cast<GgufValueType>(v.index()); }
  // Integer of any width (and bool), or nullopt.
  std::optional<int64_t> AsInt() const;
  // Float32/Float64 or any integer, or nullopt.
  std::optional<double> AsDouble() const;
  const std::string* AsString() const { return std::get_if<std::string>(&v); }
  const GgufArray* AsArray() const { return std::get_if<GgufArray>(&v); }
};

// "uint8", ..., "string", "array", "float64", as used in error messages and `thermocline info`.
std::string_view GgufValueTypeName(GgufValueType type);

// Convenience constructors for writers.
GgufValue GgufU32(uint32_t x);
GgufValue GgufU64(uint64_t x);
GgufValue GgufI32(int32_t x);
GgufValue GgufF32(float x);
GgufValue GgufBool(bool x);
GgufValue GgufString(std::string s);
GgufValue GgufStringArray(std::vector<std::string> items);
GgufValue GgufF32Array(const std::vector<float>& items);
GgufValue GgufI32Array(const std::vector<int32_t>& items);
// Any array, including arrays of arrays; every item must have type `element_type` (checked by
// the writer).
GgufValue GgufArrayOf(GgufValueType element_type, std::vector<GgufValue> items);

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the contiguous (input) dimension
  uint64_t offset = 0;      // relative to the start of the tensor data section
  int64_t n_elements = 0;
  int64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // points into the mapping; valid while the GgufFile lives
};

class GgufFile {
 public:
  // Maps `path` read-only and validates header, metadata and tensor infos.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Reads only the header, metadata and tensor infos (no mapping; every tensor's data is null),
  // for a process that needs a model's description but never its weights (the gateway).
  static absl::StatusOr<std::unique_ptr<GgufFile>> OpenHeader(const std::string& path);
  // Parses a file image held by the caller (which must outlive the result). For tests and fuzzing.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBuffer(const uint8_t* data, size_t size);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  bool is_powerinfer() const { return powerinfer_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return file_size_; }
  bool header_only() const { return header_only_; }
  const std::string& path() const { return path_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* FindValue(std::string_view key) const;

  // Typed lookups; errors name the key (missing, or of the wrong type).
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetDouble(std::string_view key) const;
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<const GgufArray*> GetArray(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(std::string_view name) const;

 private:
  GgufFile() = default;
  absl::Status Parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;       // bytes at base_
  uint64_t file_size_ = 0;  // the whole file's (> size_ for OpenHeader)
  bool header_only_ = false;
  std::vector<uint8_t> owned_;  // OpenHeader's copy of the header
  bool owns_mapping_ = false;
  uint32_t version_ = 0;
  bool powerinfer_ = false;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  // Views of the names stored above (the vectors never grow after parsing).
  absl::flat_hash_map<std::string_view, size_t> key_index_;
  absl::flat_hash_map<std::string_view, size_t> tensor_index_;
};

// Opens a GGUF file that must carry general.architecture == `arch` (our side files: stats,
// plans). Every error is InvalidArgument prefixed "<what> <path>: "; a wrong architecture names
// both values and appends `hint`, which tells the user what kind of file was expected.
absl::StatusOr<std::unique_ptr<GgufFile>> OpenGgufOfArchitecture(const std::string& path,
                                                                 const std::string& arch,
                                                                 const std::string& what,
                                                                 const std::string& hint);

// Writes GGUF v3. Tensor bytes are produced on demand while writing, so a model larger than
// memory can be written tensor by tensor.
class GgufWriter {
 public:
  // Fills exactly `n_bytes` bytes at `dst`.
  using TensorFiller = std::function<absl::Status(uint8_t* dst, int64_t n_bytes)>;

  void set_powerinfer_magic(bool on) { powerinfer_ = on; }
  void set_alignment(uint32_t alignment) { alignment_ = alignment; }  // also written as general.alignment if != 32

  // Later values for the same key replace earlier ones.
  void SetValue(std::string key, GgufValue value);
  // `ne` in ggml order. ne[0] must be a multiple of the type's block size.
  absl::Status AddTensor(std::string name, GgmlType type, std::vector<int64_t> ne,
                         TensorFiller fill);
  // Convenience: the bytes are copied now.
  absl::Status AddTensorBytes(std::string name, GgmlType type, std::vector<int64_t> ne,
                              std::string_view bytes);

  // Writes to `path` + ".tmp" and renames, so a crash never leaves a half-written model.
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    int64_t n_bytes;
    TensorFiller fill;
  };
  bool powerinfer_ = false;
  uint32_t alignment_ = 32;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace thermocline
