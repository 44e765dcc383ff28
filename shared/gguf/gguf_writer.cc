// GgufWriter: GGUF v3 output with llama.cpp's layout (header, metadata, tensor infos, padding
// to the alignment, then each tensor's bytes padded to the alignment).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "shared/gguf/gguf.h"
#include "shared/util/status_macros.h"

namespace thermocline {

namespace {

constexpr int kMaxArrayNesting = 8;  // as accepted by the reader
constexpr uint32_t kDefaultAlignment = 32;

// This Abseil build has its own string_view type; the public API uses std::string_view.
absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

template <typename T>
void Put(std::string& out, T x) {
  char buf[sizeof(T)];
  std::memcpy(buf, &x, sizeof(T));
  out.append(buf, sizeof(T));
}

void PutString(std::string& out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  out.append(s);
}

absl::Status PutValue(std::string& out, const GgufValue& v, int depth, absl::string_view context) {
  switch (v.type()) {
    case GgufValueType::kUint8:
      Put(out, std::get<0>(v.v));
      return absl::OkStatus();
    case GgufValueType::kInt8:
      Put(out, std::get<1>(v.v));
      return absl::OkStatus();
    case GgufValueType::kUint16:
      Put(out, std::get<2>(v.v));
      return absl::OkStatus();
    case GgufValueType::kInt16:
      Put(out, std::get<3>(v.v));
      return absl::OkStatus();
    case GgufValueType::kUint32:
      Put(out, std::get<4>(v.v));
      return absl::OkStatus();
    case GgufValueType::kInt32:
      Put(out, std::get<5>(v.v));
      return absl::OkStatus();
    case GgufValueType::kFloat32:
      Put(out, std::get<6>(v.v));
      return absl::OkStatus();
    case GgufValueType::kBool:
      Put<uint8_t>(out, std::get<7>(v.v) ? 1 : 0);
      return absl::OkStatus();
    case GgufValueType::kString:
      PutString(out, std::get<8>(v.v));
      return absl::OkStatus();
    case GgufValueType::kArray: {
      if (depth >= kMaxArrayNesting) {
        return absl::InvalidArgumentError(absl::StrCat(
            "gguf writer: ", context, ": arrays nested deeper than ", kMaxArrayNesting, " levels"));
      }
      const GgufArray& a = std::get<9>(v.v);
      Put<uint32_t>(out, static_cast<uint32_t>(a.element_type));
      Put<uint64_t>(out, a.items.size());
      for (size_t i = 0; i < a.items.size(); ++i) {
        if (a.items[i].type() != a.element_type) {
          return absl::InvalidArgumentError(
              absl::StrCat("gguf writer: ", context, ": array item ", i, " has type ",
                           Av(GgufValueTypeName(a.items[i].type())), ", expected ",
                           Av(GgufValueTypeName(a.element_type))));
        }
        TC_RETURN_IF_ERROR(PutValue(out, a.items[i], depth + 1, context));
      }
      return absl::OkStatus();
    }
    case GgufValueType::kUint64:
      Put(out, std::get<10>(v.v));
      return absl::OkStatus();
    case GgufValueType::kInt64:
      Put(out, std::get<11>(v.v));
      return absl::OkStatus();
    case GgufValueType::kFloat64:
      Put(out, std::get<12>(v.v));
      return absl::OkStatus();
  }
  return absl::InternalError("gguf writer: invalid value type");
}

uint64_t AlignUp(uint64_t x, uint64_t alignment) { return (x + alignment - 1) & ~(alignment - 1); }

// Owns the temporary file until it is committed; removes it on any failure.
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }

  absl::Status Open() {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return Errno("cannot create");
    return absl::OkStatus();
  }

  absl::Status Write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return Errno("write failed");
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    return absl::OkStatus();
  }

  absl::Status Commit(const std::string& final_path) {
    // Flush to disk before the rename, so the final name never refers to a partial file.
    if (::fsync(fd_) != 0) return Errno("fsync failed");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return Errno("close failed");
    if (::rename(path_.c_str(), final_path.c_str()) != 0) {
      return Errno(absl::StrCat("cannot rename to ", final_path));
    }
    committed_ = true;
    return absl::OkStatus();
  }

 private:
  absl::Status Errno(absl::string_view what) const {
    return absl::UnavailableError(
        absl::StrCat("gguf writer: ", path_, ": ", what, ": ", std::strerror(errno)));
  }

  std::string path_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

void GgufWriter::SetValue(std::string key, GgufValue value) {
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
}

absl::Status GgufWriter::AddTensor(std::string name, GgmlType type, std::vector<int64_t> ne,
                                   TensorFiller fill) {
  auto fail = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("gguf writer: tensor '", name, "': ", what));
  };
  if (name.empty()) return fail("empty name");
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) return fail("duplicate tensor name");
  }
  if (ne.empty() || ne.size() > 4) {
    return fail(absl::StrCat(ne.size(), " dimensions; must be 1 to 4"));
  }
  std::optional<GgmlTypeTraits> traits = TypeTraits(static_cast<uint32_t>(type));
  if (!traits) return fail(absl::StrCat("unsupported type id ", static_cast<uint32_t>(type)));
  int64_t n = 1;
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] < 0) return fail(absl::StrCat("ne[", d, "] = ", ne[d], " is negative"));
    if (ne[d] != 0 && n > std::numeric_limits<int64_t>::max() / ne[d]) {
      return fail("element count overflows 64 bits");
    }
    n *= ne[d];
  }
  if (ne[0] % traits->block_size != 0) {
    return fail(absl::StrCat("ne[0] = ", ne[0], " is not a multiple of the ", Av(traits->name),
                             " block size ", traits->block_size));
  }
  const int64_t blocks = n / traits->block_size;
  if (blocks > std::numeric_limits<int64_t>::max() / traits->block_bytes) {
    return fail("byte size overflows 64 bits");
  }
  if (!fill) return fail("no filler");
  tensors_.push_back(PendingTensor{std::move(name), type, std::move(ne),
                                   blocks * traits->block_bytes, std::move(fill)});
  return absl::OkStatus();
}

absl::Status GgufWriter::AddTensorBytes(std::string name, GgmlType type, std::vector<int64_t> ne,
                                        std::string_view bytes) {
  auto copy = std::make_shared<std::string>(bytes);
  const std::string name_copy = name;
  TC_RETURN_IF_ERROR(
      AddTensor(std::move(name), type, std::move(ne), [copy](uint8_t* dst, int64_t n_bytes) {
        std::memcpy(dst, copy->data(), static_cast<size_t>(n_bytes));
        return absl::OkStatus();
      }));
  if (static_cast<int64_t>(bytes.size()) != tensors_.back().n_bytes) {
    const int64_t expected = tensors_.back().n_bytes;
    tensors_.pop_back();
    return absl::InvalidArgumentError(absl::StrCat("gguf writer: tensor '", name_copy, "': got ",
                                                   bytes.size(), " bytes, shape needs ", expected));
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gguf writer: alignment ", alignment_, " is not a nonzero power of two"));
  }
  const bool write_alignment = alignment_ != kDefaultAlignment ||
                               std::any_of(metadata_.begin(), metadata_.end(), [](const auto& kv) {
                                 return kv.first == "general.alignment";
                               });

  std::string header;
  header.append(powerinfer_ ? "PWRI" : "GGUF", 4);
  Put<uint32_t>(header, 3);
  Put<uint64_t>(header, tensors_.size());
  bool alignment_written = false;
  const size_t n_kv = metadata_.size() + (write_alignment ? 1 : 0);
  const size_t count_pos = header.size();
  Put<uint64_t>(header, n_kv);
  for (const auto& [key, value] : metadata_) {
    if (key.empty()) return absl::InvalidArgumentError("gguf writer: empty metadata key");
    PutString(header, key);
    if (key == "general.alignment") {
      // The reader takes the data layout from this key, so it must always agree with alignment_.
      Put<uint32_t>(header, static_cast<uint32_t>(GgufValueType::kUint32));
      Put<uint32_t>(header, alignment_);
      alignment_written = true;
      continue;
    }
    Put<uint32_t>(header, static_cast<uint32_t>(value.type()));
    TC_RETURN_IF_ERROR(PutValue(header, value, 0, absl::StrCat("key '", key, "'")));
  }
  if (write_alignment && !alignment_written) {
    PutString(header, "general.alignment");
    Put<uint32_t>(header, static_cast<uint32_t>(GgufValueType::kUint32));
    Put<uint32_t>(header, alignment_);
  } else if (alignment_written) {
    // The key was already among metadata_; do not count it twice.
    const uint64_t n = metadata_.size();
    std::memcpy(header.data() + count_pos, &n, sizeof n);
  }

  uint64_t offset = 0;
  std::vector<uint64_t> offsets(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const PendingTensor& t = tensors_[i];
    offsets[i] = offset;
    PutString(header, t.name);
    Put<uint32_t>(header, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) Put<uint64_t>(header, static_cast<uint64_t>(d));
    Put<uint32_t>(header, TypeIdInFile(t.type, powerinfer_));
    Put<uint64_t>(header, offset);
    offset = AlignUp(offset + static_cast<uint64_t>(t.n_bytes), alignment_);
  }
  header.resize(AlignUp(header.size(), alignment_), '\0');

  TempFile out(path + ".tmp");
  TC_RETURN_IF_ERROR(out.Open());
  TC_RETURN_IF_ERROR(out.Write(header.data(), header.size()));
  // One buffer, grown to the largest tensor, reused for all of them.
  std::unique_ptr<uint8_t[]> buf;
  size_t buf_size = 0;
  static constexpr char kZeros[4096] = {};
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const PendingTensor& t = tensors_[i];
    const size_t n = static_cast<size_t>(t.n_bytes);
    if (n > buf_size) {
      buf.reset(new (std::nothrow) uint8_t[n]);
      if (!buf) {
        return absl::ResourceExhaustedError(
            absl::StrCat("gguf writer: tensor '", t.name, "': cannot allocate ", n, " bytes"));
      }
      buf_size = n;
    }
    // Zeroed, so a filler that skips bytes still yields a deterministic file.
    std::memset(buf.get(), 0, n);
    absl::Status s = t.fill(buf.get(), t.n_bytes);
    if (!s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("gguf writer: tensor '", t.name, "': ", s.message()));
    }
    TC_RETURN_IF_ERROR(out.Write(buf.get(), n));
    for (size_t pad = AlignUp(n, alignment_) - n; pad > 0;) {
      const size_t k = std::min(pad, sizeof kZeros);
      TC_RETURN_IF_ERROR(out.Write(kZeros, k));
      pad -= k;
    }
  }
  return out.Commit(path);
}

}  // namespace thermocline
