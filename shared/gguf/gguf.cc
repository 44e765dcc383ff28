#include "shared/gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shared/util/page_arena.h"
#include "shared/util/status_macros.h"

namespace thermocline {

namespace {

constexpr uint64_t kDefaultAlignment = 32;

// This Abseil build has its own string_view type; the public API uses std::string_view.
absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Bytes a value of this type occupies at least, used to bound counts read from the file before
// anything is allocated for them.
uint64_t MinEncodedSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
    case GgufValueType::kString:  // the length
      return 8;
    case GgufValueType::kArray:  // element type + count
      return 12;
  }
  return 1;
}

bool IsValidValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kFloat64); }

// ggml's names for the type ids we do not support, so that an error says "q4_K" rather than 12.
absl::string_view GgmlTypeIdName(uint32_t id, bool powerinfer) {
  // clang-format off
  static constexpr absl::string_view kNames[] = {
      "f32", "f16", "q4_0", "q4_1", "q4_2 (removed)", "q4_3 (removed)", "q5_0", "q5_1", "q8_0",
      "q8_1", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "q8_K", "iq2_xxs", "iq2_xs", "iq3_xxs",
      "iq1_s", "iq4_nl", "iq3_s", "iq2_s", "iq4_xs", "i8", "i16", "i32", "i64", "f64", "iq1_m",
      "bf16", "q4_0_4_4 (removed)", "q4_0_4_8 (removed)", "q4_0_8_8 (removed)", "tq1_0", "tq2_0",
      "iq4_nl_4_4 (removed)", "iq4_nl_4_8 (removed)", "iq4_nl_8_8 (removed)", "mxfp4"};
  // clang-format on
  // PowerInfer's ggml numbers its integer types 16..18 (see TypeTraitsInFile).
  if (powerinfer && id >= 16 && id <= 18) return kNames[id + 8];
  if (id < std::size(kNames)) return kNames[id];
  return "unknown";
}

bool IsPowerOfTwo(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

// Rounds up to a multiple of `alignment` (a power of two); false on overflow.
bool AlignUp(uint64_t x, uint64_t alignment, uint64_t* out) {
  if (x > std::numeric_limits<uint64_t>::max() - (alignment - 1)) return false;
  *out = (x + alignment - 1) & ~(alignment - 1);
  return true;
}

std::string Printable(absl::string_view s, size_t max_len = 64) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max_len; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\' && c != '\'') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    }
  }
  if (s.size() > max_len) out += "...";
  return out;
}

// Where the reader is ("metadata 0 'tokenizer.ggml.tokens' item 17"), as a chain on the stack so
// that nothing is formatted unless an error is reported: a vocabulary has 10^5 items.
struct Where {
  static constexpr uint64_t kNoIndex = ~0ull;
  const Where* parent = nullptr;
  absl::string_view label;
  uint64_t index = kNoIndex;
  absl::string_view name;

  std::string Format() const {
    std::string out = parent != nullptr ? parent->Format() + " " : "";
    absl::StrAppend(&out, label);
    if (index != kNoIndex) absl::StrAppend(&out, " ", index);
    if (!name.empty()) absl::StrAppend(&out, " '", Printable(name), "'");
    return out;
  }
};

// Cursor over the untrusted file image. Every read is bounds-checked, and errors carry the byte
// offset and the name of the field being read.
class Reader {
 public:
  Reader(const uint8_t* data, uint64_t size, uint64_t max_array_items)
      : data_(data), size_(size), array_items_left_(max_array_items) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  // Counts `n` array items against the file's budget; false when it is exhausted.
  bool TakeArrayItems(uint64_t n) {
    if (n > array_items_left_) return false;
    array_items_left_ -= n;
    return true;
  }

  absl::Status Error(uint64_t at, const Where& where, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(where.Format(), ": ", what, " (at byte ", at, ")"));
  }

  template <typename T>
  absl::Status Read(T* out, const Where& where, absl::string_view field,
                    absl::string_view field_suffix = "") {
    if (remaining() < sizeof(T)) {
      return Error(
          pos_, where,
          absl::StrCat("file truncated reading ", field, field_suffix, " (needs ", sizeof(T),
                       " bytes, ", remaining(), " left; file size ", size_, ")"));
    }
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string* out, const Where& where, absl::string_view field) {
    const uint64_t at = pos_;
    uint64_t len = 0;
    TC_RETURN_IF_ERROR(Read(&len, where, field, " length"));
    if (len > remaining()) {
      return Error(at, where,
                   absl::StrCat(field, " length ", len, " exceeds the ", remaining(),
                                " bytes left in the file (size ", size_, ")"));
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return absl::OkStatus();
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t array_items_left_;
};

constexpr int kMaxArrayNesting = 8;

// In-memory values are ~40x larger than a 1-byte encoded item, so counts that merely fit in the
// file could still exhaust memory. Real files stay far below these (the largest vocabularies
// hold a few hundred thousand tokens and merges; the largest models a few thousand tensors).
constexpr uint64_t kMaxArrayItemsTotal = 1ull << 24;
constexpr uint64_t kMaxTensors = 1ull << 20;
constexpr uint64_t kMaxKeys = 1ull << 20;

absl::Status ReadValue(Reader& r, GgufValueType type, int depth, const Where& context,
                       GgufValue* out);

template <size_t I, typename T>
absl::Status ReadScalar(Reader& r, const Where& context, GgufValue* out) {
  T x{};
  TC_RETURN_IF_ERROR(r.Read(&x, context, "value"));
  out->v.emplace<I>(x);
  return absl::OkStatus();
}

absl::Status ReadValue(Reader& r, GgufValueType type, int depth, const Where& context,
                       GgufValue* out) {
  switch (type) {
    case GgufValueType::kUint8:
      return ReadScalar<0, uint8_t>(r, context, out);
    case GgufValueType::kInt8:
      return ReadScalar<1, int8_t>(r, context, out);
    case GgufValueType::kUint16:
      return ReadScalar<2, uint16_t>(r, context, out);
    case GgufValueType::kInt16:
      return ReadScalar<3, int16_t>(r, context, out);
    case GgufValueType::kUint32:
      return ReadScalar<4, uint32_t>(r, context, out);
    case GgufValueType::kInt32:
      return ReadScalar<5, int32_t>(r, context, out);
    case GgufValueType::kFloat32:
      return ReadScalar<6, float>(r, context, out);
    case GgufValueType::kBool: {
      const uint64_t at = r.pos();
      uint8_t b = 0;
      TC_RETURN_IF_ERROR(r.Read(&b, context, "bool value"));
      if (b > 1) return r.Error(at, context, absl::StrCat("bool value ", b, " is not 0 or 1"));
      out->v.emplace<7>(b == 1);
      return absl::OkStatus();
    }
    case GgufValueType::kString: {
      std::string s;
      TC_RETURN_IF_ERROR(r.ReadString(&s, context, "string value"));
      out->v.emplace<8>(std::move(s));
      return absl::OkStatus();
    }
    case GgufValueType::kArray: {
      const uint64_t at = r.pos();
      if (depth >= kMaxArrayNesting) {
        return r.Error(at, context,
                       absl::StrCat("arrays nested deeper than ", kMaxArrayNesting, " levels"));
      }
      uint32_t elem_type = 0;
      TC_RETURN_IF_ERROR(r.Read(&elem_type, context, "array element type"));
      if (!IsValidValueType(elem_type)) {
        return r.Error(at, context, absl::StrCat("invalid array element type ", elem_type));
      }
      const uint64_t count_at = r.pos();
      uint64_t n = 0;
      TC_RETURN_IF_ERROR(r.Read(&n, context, "array length"));
      const GgufValueType et = static_cast<GgufValueType>(elem_type);
      if (n > r.remaining() / MinEncodedSize(et)) {
        return r.Error(
            count_at, context,
            absl::StrCat("array of ", n, " ", Av(GgufValueTypeName(et)),
                         " items cannot fit in the ", r.remaining(), " bytes left in the file"));
      }
      if (!r.TakeArrayItems(n)) {
        return r.Error(count_at, context,
                       absl::StrCat("array of ", n, " items takes the metadata past ",
                                    kMaxArrayItemsTotal, " array items in total"));
      }
      GgufArray arr;
      arr.element_type = et;
      arr.items.resize(n);
      for (uint64_t i = 0; i < n; ++i) {
        const Where item{&context, "item", i, {}};
        TC_RETURN_IF_ERROR(ReadValue(r, et, depth + 1, item, &arr.items[i]));
      }
      out->v.emplace<9>(std::move(arr));
      return absl::OkStatus();
    }
    case GgufValueType::kUint64:
      return ReadScalar<10, uint64_t>(r, context, out);
    case GgufValueType::kInt64:
      return ReadScalar<11, int64_t>(r, context, out);
    case GgufValueType::kFloat64:
      return ReadScalar<12, double>(r, context, out);
  }
  return r.Error(r.pos(), context, "invalid value type");
}

std::string DescribeType(const GgufValue& v) {
  if (const GgufArray* a = v.AsArray()) {
    return absl::StrCat("array[", Av(GgufValueTypeName(a->element_type)), "]");
  }
  return std::string(Av(GgufValueTypeName(v.type())));
}

}  // namespace

std::string_view GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return "invalid";
}

// ---------------------------------------------------------------------------------------------
// GgufValue

std::optional<int64_t> GgufValue::AsInt() const {
  switch (type()) {
    case GgufValueType::kUint8:
      return std::get<0>(v);
    case GgufValueType::kInt8:
      return std::get<1>(v);
    case GgufValueType::kUint16:
      return std::get<2>(v);
    case GgufValueType::kInt16:
      return std::get<3>(v);
    case GgufValueType::kUint32:
      return std::get<4>(v);
    case GgufValueType::kInt32:
      return std::get<5>(v);
    case GgufValueType::kBool:
      return std::get<7>(v) ? 1 : 0;
    case GgufValueType::kUint64: {
      const uint64_t x = std::get<10>(v);
      if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
      return static_cast<int64_t>(x);
    }
    case GgufValueType::kInt64:
      return std::get<11>(v);
    default:
      return std::nullopt;
  }
}

std::optional<double> GgufValue::AsDouble() const {
  switch (type()) {
    case GgufValueType::kFloat32:
      return std::get<6>(v);
    case GgufValueType::kFloat64:
      return std::get<12>(v);
    case GgufValueType::kUint64:
      return static_cast<double>(std::get<10>(v));
    default: {
      std::optional<int64_t> i = AsInt();
      if (!i) return std::nullopt;
      return static_cast<double>(*i);
    }
  }
}

GgufValue GgufU32(uint32_t x) { return GgufValue{GgufValue::Storage(std::in_place_index<4>, x)}; }
GgufValue GgufI32(int32_t x) { return GgufValue{GgufValue::Storage(std::in_place_index<5>, x)}; }
GgufValue GgufF32(float x) { return GgufValue{GgufValue::Storage(std::in_place_index<6>, x)}; }
GgufValue GgufBool(bool x) { return GgufValue{GgufValue::Storage(std::in_place_index<7>, x)}; }
GgufValue GgufString(std::string s) {
  return GgufValue{GgufValue::Storage(std::in_place_index<8>, std::move(s))};
}
GgufValue GgufU64(uint64_t x) { return GgufValue{GgufValue::Storage(std::in_place_index<10>, x)}; }
GgufValue GgufArrayOf(GgufValueType element_type, std::vector<GgufValue> items) {
  GgufArray a;
  a.element_type = element_type;
  a.items = std::move(items);
  return GgufValue{GgufValue::Storage(std::in_place_index<9>, std::move(a))};
}
GgufValue GgufStringArray(std::vector<std::string> items) {
  std::vector<GgufValue> v;
  v.reserve(items.size());
  for (std::string& s : items) v.push_back(GgufString(std::move(s)));
  return GgufArrayOf(GgufValueType::kString, std::move(v));
}
GgufValue GgufF32Array(const std::vector<float>& items) {
  std::vector<GgufValue> v;
  v.reserve(items.size());
  for (float x : items) v.push_back(GgufF32(x));
  return GgufArrayOf(GgufValueType::kFloat32, std::move(v));
}
GgufValue GgufI32Array(const std::vector<int32_t>& items) {
  std::vector<GgufValue> v;
  v.reserve(items.size());
  for (int32_t x : items) v.push_back(GgufI32(x));
  return GgufArrayOf(GgufValueType::kInt32, std::move(v));
}

// ---------------------------------------------------------------------------------------------
// GgufFile

absl::StatusOr<std::unique_ptr<GgufFile>> OpenGgufOfArchitecture(const std::string& path,
                                                                 const std::string& arch,
                                                                 const std::string& what,
                                                                 const std::string& hint) {
  const std::string where = absl::StrCat(what, " ", path, ": ");
  auto invalid = [&](absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat(where, message));
  };
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  if (!file.ok()) return invalid(file.status().message());
  absl::StatusOr<std::string> found = (*file)->GetString("general.architecture");
  if (!found.ok()) return invalid(found.status().message());
  if (*found != arch) {
    return invalid(absl::StrCat("general.architecture is '", *found, "', expected '", arch, "' (",
                                hint, ")"));
  }
  return file;
}

namespace {

// Opens `path` for reading as a regular, non-empty file: the descriptor and its size, or the
// error both openers report ("gguf: PATH: ...").
absl::Status OpenRegularFile(const std::string& path, int* fd_out, uint64_t* size_out) {
  auto fail = [&](absl::StatusCode code, absl::string_view what) {
    return absl::Status(code, absl::StrCat("gguf: ", path, ": ", what));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return fail(err == ENOENT   ? absl::StatusCode::kNotFound
                : err == EACCES ? absl::StatusCode::kPermissionDenied
                                : absl::StatusCode::kUnavailable,
                absl::StrCat("cannot open: ", std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return fail(absl::StatusCode::kUnavailable, absl::StrCat("cannot stat: ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(absl::StatusCode::kInvalidArgument, "not a regular file");
  }
  if (st.st_size == 0) {
    ::close(fd);
    return fail(absl::StatusCode::kInvalidArgument, "file is empty");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  *fd_out = fd;
  *size_out = size;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  auto fail = [&](absl::StatusCode code, absl::string_view what) {
    return absl::Status(code, absl::StrCat("gguf: ", path, ": ", what));
  };
  int fd = -1;
  uint64_t size = 0;
  TC_RETURN_IF_ERROR(OpenRegularFile(path, &fd, &size));
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) {
    return fail(absl::StatusCode::kUnavailable,
                absl::StrCat("cannot mmap ", size, " bytes: ", std::strerror(map_err)));
  }
  // Advice: where the file system keeps large folios, page faults may then map the weights
  // with 2 MiB entries (fewer TLB misses for the rows decode gathers).
  if (HugePagesWanted()) ::madvise(map, size, MADV_HUGEPAGE);
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  file->base_ = static_cast<const uint8_t*>(map);
  file->size_ = size;
  file->file_size_ = size;
  file->owns_mapping_ = true;
  absl::Status s = file->Parse();
  if (!s.ok()) return fail(s.code(), s.message());
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBuffer(const uint8_t* data, size_t size) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->base_ = data;
  file->size_ = size;
  file->file_size_ = size;
  absl::Status s = file->Parse();
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("gguf: ", s.message()));
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::OpenHeader(const std::string& path) {
  auto fail = [&](absl::StatusCode code, absl::string_view what) {
    return absl::Status(code, absl::StrCat("gguf: ", path, ": ", what));
  };
  int fd = -1;
  uint64_t size = 0;
  TC_RETURN_IF_ERROR(OpenRegularFile(path, &fd, &size));
  // The header's length is known only once parsed: read a prefix, and a larger one while the
  // parse runs out of bytes before the end of the file.
  uint64_t want = std::min<uint64_t>(size, uint64_t{1} << 20);
  std::vector<uint8_t> buffer;
  while (true) {
    buffer.resize(want);
    uint64_t got = 0;
    while (got < want) {
      const ssize_t n = ::pread(fd, buffer.data() + got, want - got, static_cast<off_t>(got));
      if (n <= 0) {
        ::close(fd);
        return fail(absl::StatusCode::kUnavailable, "read failed or the file shrank");
      }
      got += static_cast<uint64_t>(n);
    }
    std::unique_ptr<GgufFile> file(new GgufFile());
    file->path_ = path;
    file->owned_ = std::move(buffer);
    file->base_ = file->owned_.data();
    file->size_ = want;
    file->file_size_ = size;
    file->header_only_ = true;
    absl::Status s = file->Parse();
    if (s.ok()) {
      ::close(fd);
      return file;
    }
    if (want == size) {
      ::close(fd);
      return fail(s.code(), s.message());
    }
    buffer = std::move(file->owned_);
    want = std::min<uint64_t>(size, want * 4);
  }
}

GgufFile::~GgufFile() {
  if (owns_mapping_ && base_ != nullptr) {
    ::munmap(const_cast<uint8_t*>(base_), size_);
  }
}

absl::Status GgufFile::Parse() {
  Reader r(base_, size_, kMaxArrayItemsTotal);
  const Where header{nullptr, "header", Where::kNoIndex, {}};

  // Header.
  if (size_ < 4 || base_ == nullptr) {
    return r.Error(0, header, absl::StrCat("file too small for the magic (", size_, " bytes)"));
  }
  const absl::string_view magic(reinterpret_cast<const char*>(base_), 4);
  if (magic == "GGUF") {
    powerinfer_ = false;
  } else if (magic == "PWRI") {
    powerinfer_ = true;
  } else {
    return r.Error(0, header,
                   absl::StrCat("bad magic '", Printable(magic),
                                "' (expected 'GGUF', or 'PWRI' for PowerInfer)"));
  }
  uint8_t skip[4] = {};
  TC_RETURN_IF_ERROR(r.Read(&skip, header, "magic"));
  TC_RETURN_IF_ERROR(r.Read(&version_, header, "version"));
  if (version_ == 1) {
    return r.Error(4, header,
                   "version 1 is not supported (it uses 32-bit counts; re-convert the model "
                   "with a current llama.cpp)");
  }
  if (version_ != 2 && version_ != 3) {
    const uint32_t swapped = __builtin_bswap32(version_);
    if (swapped >= 1 && swapped <= 3) {
      return r.Error(4, header,
                     absl::StrCat("big-endian GGUF (version ", swapped, ") is not supported"));
    }
    return r.Error(4, header,
                   absl::StrCat("unsupported version ", version_, " (supported: 2 and 3)"));
  }
  uint64_t n_tensors = 0, n_kv = 0;
  TC_RETURN_IF_ERROR(r.Read(&n_tensors, header, "tensor count"));
  TC_RETURN_IF_ERROR(r.Read(&n_kv, header, "metadata count"));
  // Smallest possible entries: key length + type + 1-byte value; name length + n_dims + one dim
  // + type + offset.
  constexpr uint64_t kMinKv = 8 + 4 + 1;
  constexpr uint64_t kMinTensorInfo = 8 + 4 + 8 + 4 + 8;
  if (n_kv > r.remaining() / kMinKv) {
    return r.Error(16, header,
                   absl::StrCat("metadata count ", n_kv, " cannot fit in the ", r.remaining(),
                                " bytes left in the file"));
  }
  if (n_kv > kMaxKeys) {
    return r.Error(16, header,
                   absl::StrCat("metadata count ", n_kv, " exceeds the limit of ", kMaxKeys));
  }
  if (n_tensors > kMaxTensors) {
    return r.Error(8, header,
                   absl::StrCat("tensor count ", n_tensors, " exceeds the limit of ", kMaxTensors));
  }
  if (n_tensors > r.remaining() / kMinTensorInfo) {
    return r.Error(8, header,
                   absl::StrCat("tensor count ", n_tensors, " cannot fit in the ", r.remaining(),
                                " bytes left in the file"));
  }

  // Metadata. Reserving up front keeps the strings in place, so the index can refer to them.
  metadata_.reserve(n_kv);
  key_index_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t at = r.pos();
    const Where context{nullptr, "metadata", i, {}};
    std::string key;
    TC_RETURN_IF_ERROR(r.ReadString(&key, context, "key"));
    const Where key_context{nullptr, "metadata", i, key};
    if (key.empty()) return r.Error(at, context, "empty key");
    const uint64_t type_at = r.pos();
    uint32_t type = 0;
    TC_RETURN_IF_ERROR(r.Read(&type, key_context, "value type"));
    if (!IsValidValueType(type)) {
      return r.Error(type_at, key_context, absl::StrCat("invalid value type ", type));
    }
    GgufValue value;
    TC_RETURN_IF_ERROR(ReadValue(r, static_cast<GgufValueType>(type), 0, key_context, &value));
    metadata_.emplace_back(std::move(key), std::move(value));  // key_context now dangles
    const std::string& added = metadata_.back().first;
    if (!key_index_.emplace(std::string_view(added), metadata_.size() - 1).second) {
      return r.Error(at, Where{nullptr, "metadata", i, added}, "duplicate key");
    }
  }

  // Alignment.
  alignment_ = kDefaultAlignment;
  if (const GgufValue* a = FindValue("general.alignment")) {
    std::optional<int64_t> v = a->AsInt();
    if (!v || a->type() == GgufValueType::kBool) {
      return absl::InvalidArgumentError(absl::StrCat("metadata 'general.alignment': has type ",
                                                     DescribeType(*a), ", expected an integer"));
    }
    if (*v <= 0 || !IsPowerOfTwo(static_cast<uint64_t>(*v)) ||
        *v > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("metadata 'general.alignment': ", *v,
                                                     " is not a nonzero power of two below 2^32"));
    }
    alignment_ = static_cast<uint64_t>(*v);
  }

  // Tensor infos.
  tensors_.reserve(n_tensors);
  tensor_index_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const uint64_t at = r.pos();
    const Where context{nullptr, "tensor", i, {}};
    GgufTensorInfo t;
    TC_RETURN_IF_ERROR(r.ReadString(&t.name, context, "name"));
    if (t.name.empty()) return r.Error(at, context, "empty name");
    const Where tc{nullptr, "tensor", i, t.name};
    const uint64_t dims_at = r.pos();
    uint32_t n_dims = 0;
    TC_RETURN_IF_ERROR(r.Read(&n_dims, tc, "n_dims"));
    if (n_dims < 1 || n_dims > 4) {
      return r.Error(dims_at, tc, absl::StrCat("n_dims ", n_dims, " is not in [1, 4]"));
    }
    t.ne.resize(n_dims);
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne_at = r.pos();
      uint64_t ne = 0;
      TC_RETURN_IF_ERROR(r.Read(&ne, tc, absl::StrCat("ne[", d, "]")));
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return r.Error(ne_at, tc,
                       absl::StrCat("ne[", d, "] = ", static_cast<int64_t>(ne), " is negative"));
      }
      t.ne[d] = static_cast<int64_t>(ne);
      if (t.ne[d] != 0 && n_elements > std::numeric_limits<int64_t>::max() / t.ne[d]) {
        return r.Error(ne_at, tc, "element count overflows 64 bits");
      }
      n_elements *= t.ne[d];
    }
    const uint64_t type_at = r.pos();
    uint32_t type_id = 0;
    TC_RETURN_IF_ERROR(r.Read(&type_id, tc, "type"));
    std::optional<GgmlTypeTraits> traits = TypeTraitsInFile(type_id, powerinfer_);
    if (!traits) {
      // Only ids ggml no longer (or never) defined end up here: every known type is listed,
      // and the model loader decides which ones it can run.
      return r.Error(type_at, tc,
                     absl::StrCat("unknown tensor type id ", type_id, " (",
                                  GgmlTypeIdName(type_id, powerinfer_), ")"));
    }
    t.type = traits->type;
    if (t.ne[0] % traits->block_size != 0) {
      return r.Error(dims_at, tc,
                     absl::StrCat("ne[0] = ", t.ne[0], " is not a multiple of the ",
                                  Av(traits->name), " block size ", traits->block_size));
    }
    const int64_t n_blocks = n_elements / traits->block_size;
    if (n_blocks > std::numeric_limits<int64_t>::max() / traits->block_bytes) {
      return r.Error(dims_at, tc, "byte size overflows 64 bits");
    }
    t.n_elements = n_elements;
    t.n_bytes = n_blocks * traits->block_bytes;
    const uint64_t offset_at = r.pos();
    TC_RETURN_IF_ERROR(r.Read(&t.offset, tc, "offset"));
    if (t.offset % alignment_ != 0) {
      return r.Error(
          offset_at, tc,
          absl::StrCat("offset ", t.offset, " is not a multiple of the alignment ", alignment_));
    }
    tensors_.push_back(std::move(t));  // tc's name now refers to a moved-from string
    const GgufTensorInfo& added = tensors_.back();
    if (!tensor_index_.emplace(std::string_view(added.name), tensors_.size() - 1).second) {
      return r.Error(at, Where{nullptr, "tensor", i, added.name}, "duplicate tensor name");
    }
  }

  // Tensor data: every range must lie inside the file before any pointer into it is formed.
  if (!AlignUp(r.pos(), alignment_, &data_offset_)) {
    return absl::InvalidArgumentError("data section offset overflows 64 bits");
  }
  // A file without tensors may end before its alignment padding (found by the fuzzer: a
  // metadata-only file of 30 bytes). Its empty data section then starts at the end of the
  // file, which keeps data_offset() <= file_size() for every file that parses.
  // Ranges are checked against the whole file even when only its header was read (OpenHeader).
  const uint64_t fsize = file_size_;
  if (tensors_.empty() && data_offset_ > fsize) data_offset_ = fsize;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    GgufTensorInfo& t = tensors_[i];
    const std::string tc = absl::StrCat("tensor ", i, " '", Printable(t.name), "'");
    const uint64_t n_bytes = static_cast<uint64_t>(t.n_bytes);
    if (t.offset > fsize || data_offset_ > fsize - t.offset ||
        n_bytes > fsize - t.offset - data_offset_) {
      const uint64_t begin = data_offset_ + t.offset;  // only for the message; may wrap
      return absl::InvalidArgumentError(absl::StrCat(tc, ": data [", begin, ", ", begin + n_bytes,
                                                     ") extends past end of file (size ", fsize,
                                                     ")"));
    }
    t.data = header_only_ ? nullptr : base_ + data_offset_ + t.offset;
  }
  // Overlapping tensors would let a write through one view (e.g. after conversion) corrupt
  // another; no writer produces them, so they indicate a damaged file.
  std::vector<size_t> order;
  order.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].n_bytes > 0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const GgufTensorInfo& prev = tensors_[order[k - 1]];
    const GgufTensorInfo& cur = tensors_[order[k]];
    if (prev.offset + static_cast<uint64_t>(prev.n_bytes) > cur.offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", order[k], " '", Printable(cur.name), "': data at offset ",
                       cur.offset, " overlaps tensor ", order[k - 1], " '", Printable(prev.name),
                       "' at [", prev.offset, ", ", prev.offset + prev.n_bytes, ")"));
    }
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::FindValue(std::string_view key_sv) const {
  auto it = key_index_.find(key_sv);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].second;
}

namespace {
absl::Status MissingKey(absl::string_view key) {
  return absl::NotFoundError(absl::StrCat("gguf: metadata key '", key, "' not found"));
}
absl::Status WrongType(absl::string_view key, const GgufValue& v, absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat("gguf: metadata key '", key, "' has type ",
                                                 DescribeType(v), ", expected ", expected));
}
}  // namespace

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key_sv) const {
  const absl::string_view key = Av(key_sv);
  const GgufValue* v = FindValue(key_sv);
  if (v == nullptr) return MissingKey(key);
  std::optional<int64_t> x = v->AsInt();
  if (!x) {
    if (v->type() == GgufValueType::kUint64) {
      return absl::InvalidArgumentError(absl::StrCat("gguf: metadata key '", key, "' value ",
                                                     std::get<uint64_t>(v->v),
                                                     " does not fit in int64"));
    }
    return WrongType(key, *v, "an integer");
  }
  return *x;
}

absl::StatusOr<double> GgufFile::GetDouble(std::string_view key_sv) const {
  const absl::string_view key = Av(key_sv);
  const GgufValue* v = FindValue(key_sv);
  if (v == nullptr) return MissingKey(key);
  std::optional<double> x = v->AsDouble();
  if (!x) return WrongType(key, *v, "a number");
  return *x;
}

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key_sv) const {
  const absl::string_view key = Av(key_sv);
  const GgufValue* v = FindValue(key_sv);
  if (v == nullptr) return MissingKey(key);
  const std::string* s = v->AsString();
  if (s == nullptr) return WrongType(key, *v, "a string");
  return *s;
}

absl::StatusOr<const GgufArray*> GgufFile::GetArray(std::string_view key_sv) const {
  const absl::string_view key = Av(key_sv);
  const GgufValue* v = FindValue(key_sv);
  if (v == nullptr) return MissingKey(key);
  const GgufArray* a = v->AsArray();
  if (a == nullptr) return WrongType(key, *v, "an array");
  return a;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name_sv) const {
  auto it = tensor_index_.find(name_sv);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace thermocline
