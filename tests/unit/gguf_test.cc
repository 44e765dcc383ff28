#include "shared/gguf/gguf.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shared/gguf/quant.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

void ExpectError(const absl::Status& s, const std::string& substr) {
  EXPECT_FALSE(s.ok()) << "expected an error containing: " << substr;
  EXPECT_NE(std::string(s.message()).find(substr), std::string::npos)
      << "message: " << s.message() << "\nexpected to contain: " << substr;
}

std::string WriteBytes(const std::string& bytes, const std::string& name) {
  const std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
  return path;
}

absl::StatusOr<std::unique_ptr<GgufFile>> Parse(const std::string& bytes) {
  return GgufFile::FromBuffer(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

absl::Status ParseError(const std::string& bytes) { return Parse(bytes).status(); }

// Builds GGUF images field by field, so tests can put any value into any field.
class RawGguf {
 public:
  template <typename T>
  RawGguf& Put(T x) {
    char b[sizeof(T)];
    std::memcpy(b, &x, sizeof(T));
    bytes_.append(b, sizeof(T));
    return *this;
  }
  RawGguf& Str(std::string_view s) {
    Put<uint64_t>(s.size());
    bytes_.append(s);
    return *this;
  }
  RawGguf& Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3,
                  std::string_view magic = "GGUF") {
    bytes_.append(magic);
    return Put<uint32_t>(version).Put<uint64_t>(n_tensors).Put<uint64_t>(n_kv);
  }
  RawGguf& KvU32(std::string_view key, uint32_t v) { return Str(key).Put<uint32_t>(4).Put(v); }
  RawGguf& Tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    Str(name).Put<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) Put<uint64_t>(d);
    return Put<uint32_t>(type).Put<uint64_t>(offset);
  }
  RawGguf& Pad(size_t alignment = 32) {
    bytes_.resize((bytes_.size() + alignment - 1) / alignment * alignment, '\0');
    return *this;
  }
  RawGguf& Data(size_t n, char fill = 0) {
    bytes_.append(n, fill);
    return *this;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// One key, two tensors (a: F32 x32 at 0, b: F32 8x4 at 128) and their data.
std::string ValidTwoTensors() {
  RawGguf g;
  g.Header(2, 1).KvU32("test.n", 7);
  g.Tensor("a", {32}, 0, 0).Tensor("b", {8, 4}, 0, 128).Pad().Data(256, 1);
  return g.bytes();
}

TEST(GgufRawTest, ValidFileParses) {
  const std::string bytes = ValidTwoTensors();
  auto f = Parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_FALSE((*f)->is_powerinfer());
  EXPECT_EQ((*f)->alignment(), 32u);
  EXPECT_EQ((*f)->file_size(), bytes.size());
  EXPECT_EQ((*f)->data_offset() % 32, 0u);
  EXPECT_EQ((*f)->data_offset() + 256, bytes.size());
  ASSERT_EQ((*f)->metadata().size(), 1u);
  EXPECT_EQ((*f)->GetInt("test.n").value(), 7);
  ASSERT_EQ((*f)->tensors().size(), 2u);
  const GgufTensorInfo* b = (*f)->FindTensor("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->ne, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(b->n_elements, 32);
  EXPECT_EQ(b->n_bytes, 128);
  EXPECT_EQ(b->offset, 128u);
  EXPECT_EQ(b->data, reinterpret_cast<const uint8_t*>(bytes.data()) + (*f)->data_offset() + 128);
  EXPECT_EQ((*f)->FindTensor("c"), nullptr);
}

// A metadata-only file may stop before the alignment padding; its (empty) data section starts
// at the end of the file.
TEST(GgufRawTest, NoTensorsAndNoPaddingParses) {
  RawGguf g;
  g.Header(0, 0, 3);
  const std::string bytes = g.bytes() + std::string(6, '\xef');
  auto f = Parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->data_offset(), bytes.size());
}

TEST(GgufRawTest, PowerInferMagicAccepted) {
  RawGguf g;
  g.Header(0, 1, 3, "PWRI").KvU32("k", 1);
  auto f = Parse(g.bytes());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE((*f)->is_powerinfer());
}

TEST(GgufRawTest, Version2Accepted) {
  RawGguf g;
  g.Header(1, 1, 2).KvU32("k", 1).Tensor("t", {32}, 0, 0).Pad().Data(128);
  auto f = Parse(g.bytes());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 2u);
}

TEST(GgufRawTest, HeaderErrors) {
  ExpectError(ParseError(""), "file too small for the magic");
  ExpectError(ParseError("GGU"), "file too small for the magic");
  ExpectError(ParseError(RawGguf().Header(0, 0, 3, "GGML").bytes()), "bad magic 'GGML'");
  ExpectError(ParseError(RawGguf().Header(0, 0, 1).bytes()), "version 1 is not supported");
  ExpectError(ParseError(RawGguf().Header(0, 0, 4).bytes()), "unsupported version 4");
  ExpectError(ParseError(RawGguf().Header(0, 0, 0x03000000).bytes()), "big-endian");
  ExpectError(ParseError(RawGguf().Header(0, 0).bytes().substr(0, 20)),
              "file truncated reading metadata count");
  ExpectError(ParseError(RawGguf().Header(0, 1000).bytes()),
              "metadata count 1000 cannot fit in the 0 bytes left");
  ExpectError(ParseError(RawGguf().Header(~0ull, 0).bytes()), "tensor count");
  // Messages carry the byte offset of the bad field.
  ExpectError(ParseError(RawGguf().Header(0, 0, 4).bytes()), "(at byte 4)");
}

TEST(GgufRawTest, MetadataErrors) {
  ExpectError(ParseError(RawGguf().Header(0, 1).Put<uint64_t>(1000).Data(20).bytes()),
              "metadata 0: key length 1000 exceeds the 20 bytes left");
  ExpectError(ParseError(RawGguf().Header(0, 1).Str("k").Put<uint32_t>(13).Data(8).bytes()),
              "metadata 0 'k': invalid value type 13 (at byte 33)");
  ExpectError(ParseError(RawGguf().Header(0, 2).KvU32("dup", 1).KvU32("dup", 2).bytes()),
              "metadata 1 'dup': duplicate key");
  ExpectError(ParseError(RawGguf().Header(0, 1).Str("").Put<uint32_t>(4).Put<uint32_t>(1).bytes()),
              "metadata 0: empty key");
  ExpectError(ParseError(RawGguf()
                             .Header(0, 1)
                             .Str("s")
                             .Put<uint32_t>(8)
                             .Put<uint64_t>(1ull << 62)
                             .Data(8)
                             .bytes()),
              "metadata 0 's': string value length 4611686018427387904 exceeds the 8 bytes left");
  ExpectError(ParseError(RawGguf()
                             .Header(0, 1)
                             .Str("arr")
                             .Put<uint32_t>(9)
                             .Put<uint32_t>(4)
                             .Put<uint64_t>(1000)
                             .Data(16)
                             .bytes()),
              "metadata 0 'arr': array of 1000 uint32 items cannot fit in the 16 bytes left");
  ExpectError(ParseError(RawGguf()
                             .Header(0, 1)
                             .Str("arr")
                             .Put<uint32_t>(9)
                             .Put<uint32_t>(77)
                             .Put<uint64_t>(0)
                             .bytes()),
              "invalid array element type 77");
  ExpectError(ParseError(RawGguf().Header(0, 1).Str("b").Put<uint32_t>(7).Put<uint8_t>(2).bytes()),
              "metadata 0 'b': bool value 2 is not 0 or 1");
  // Arrays nested without end (each level is just a header) hit the depth limit, not the stack.
  RawGguf deep;
  deep.Header(0, 1).Str("deep").Put<uint32_t>(9);
  for (int i = 0; i < 100; ++i) deep.Put<uint32_t>(9).Put<uint64_t>(1);
  deep.Put<uint32_t>(4).Put<uint64_t>(1).Put<uint32_t>(0);
  ExpectError(ParseError(deep.bytes()), "arrays nested deeper than 8 levels");
}

TEST(GgufRawTest, MemoryLimits) {
  // Counts that fit in the file can still blow up in memory (a 1-byte item becomes a ~40-byte
  // value), so totals are capped.
  const uint64_t items = (1ull << 24) + 1;
  RawGguf big;
  big.Header(0, 1).Str("big").Put<uint32_t>(9).Put<uint32_t>(0).Put<uint64_t>(items).Data(items);
  ExpectError(ParseError(big.bytes()),
              "metadata 0 'big': array of 16777217 items takes the metadata past 16777216 array "
              "items in total");
  const uint64_t keys = (1ull << 20) + 1;
  RawGguf many;
  many.Header(0, keys).Data(keys * 13);
  ExpectError(ParseError(many.bytes()), "metadata count 1048577 exceeds the limit of 1048576");
}

TEST(GgufRawTest, AlignmentErrors) {
  auto with_alignment = [](uint32_t a) {
    return RawGguf().Header(0, 1).KvU32("general.alignment", a).bytes();
  };
  ExpectError(ParseError(with_alignment(0)),
              "'general.alignment': 0 is not a nonzero power of two");
  ExpectError(ParseError(with_alignment(48)), "'general.alignment': 48 is not a nonzero power");
  ExpectError(
      ParseError(RawGguf().Header(0, 1).Str("general.alignment").Put<uint32_t>(8).Str("x").bytes()),
      "'general.alignment': has type string, expected an integer");
  auto f = Parse(RawGguf()
                     .Header(1, 1)
                     .KvU32("general.alignment", 64)
                     .Tensor("t", {16}, 0, 0)
                     .Pad(64)
                     .Data(64)
                     .bytes());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->data_offset(), 128u);
}

TEST(GgufRawTest, TensorInfoErrors) {
  auto one = [](std::vector<uint64_t> ne, uint32_t type, uint64_t offset, size_t data) {
    return RawGguf()
        .Header(1, 0)
        .Tensor("blk.0.ffn_up.weight", ne, type, offset)
        .Pad()
        .Data(data)
        .bytes();
  };
  // Every type ggml knows is read (with its block size), whether or not anything can run it.
  for (uint32_t id : {3u, 12u, 14u, 18u, 21u, 23u, 29u, 34u, 39u}) {
    const GgmlTypeTraits t = *TypeTraits(id);
    auto f = Parse(one({static_cast<uint64_t>(t.block_size) * 2}, id, 0, 1024));
    ASSERT_TRUE(f.ok()) << id << ": " << f.status();
    EXPECT_EQ((*f)->tensors()[0].type, t.type);
    EXPECT_EQ((*f)->tensors()[0].n_bytes, 2 * t.block_bytes);
  }
  ExpectError(ParseError(one({32}, 12, 0, 1024)),
              "tensor 0 'blk.0.ffn_up.weight': ne[0] = 32 is not a multiple of the q4_K block "
              "size 256");
  ExpectError(ParseError(one({32}, 4, 0, 1024)), "unknown tensor type id 4 (q4_2 (removed))");
  ExpectError(ParseError(one({32}, 33, 0, 1024)), "unknown tensor type id 33 (q4_0_8_8 (removed))");
  ExpectError(ParseError(one({32}, 500, 0, 1024)), "unknown tensor type id 500 (unknown)");
  ExpectError(ParseError(one({1, 1, 1, 1, 1}, 0, 0, 1024)), "n_dims 5 is not in [1, 4]");
  ExpectError(ParseError(one({}, 0, 0, 1024)), "n_dims 0 is not in [1, 4]");
  ExpectError(ParseError(one({~0ull}, 0, 0, 1024)), "ne[0] = -1 is negative");
  ExpectError(ParseError(one({1ull << 40, 1ull << 40}, 0, 0, 1024)),
              "element count overflows 64 bits");
  ExpectError(ParseError(one({1ull << 62}, 0, 0, 1024)), "byte size overflows 64 bits");
  ExpectError(ParseError(one({33, 2}, 8, 0, 1024)),
              "ne[0] = 33 is not a multiple of the q8_0 block size 32");
  ExpectError(ParseError(one({32}, 0, 16, 1024)),
              "offset 16 is not a multiple of the alignment 32");
  // Header: 24 + name (8 + 19) + n_dims 4 + ne 8 + type 4 + offset 8 = 75, padded to 96.
  ExpectError(ParseError(one({32}, 0, 0, 100)),
              "tensor 0 'blk.0.ffn_up.weight': data [96, 224) extends past end of file (size 196)");
  ExpectError(ParseError(one({32}, 0, 1ull << 63, 1024)), "extends past end of file");
  ExpectError(ParseError(one({32}, 0, ~0ull - 31, 1024)), "extends past end of file");

  ExpectError(ParseError(RawGguf()
                             .Header(2, 0)
                             .Tensor("t", {32}, 0, 0)
                             .Tensor("t", {32}, 0, 128)
                             .Pad()
                             .Data(256)
                             .bytes()),
              "tensor 1 't': duplicate tensor name");
  ExpectError(ParseError(RawGguf().Header(1, 0).Tensor("", {32}, 0, 0).Pad().Data(128).bytes()),
              "tensor 0: empty name");
  ExpectError(ParseError(RawGguf()
                             .Header(2, 0)
                             .Tensor("a", {64}, 0, 0)
                             .Tensor("b", {32}, 0, 128)
                             .Pad()
                             .Data(512)
                             .bytes()),
              "tensor 1 'b': data at offset 128 overlaps tensor 0 'a' at [0, 256)");
  // Zero-sized tensors are allowed and overlap nothing.
  auto empty =
      Parse(RawGguf().Header(2, 0).Tensor("a", {0}, 0, 0).Tensor("b", {32, 0}, 8, 0).Pad().bytes());
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ((*empty)->tensors()[1].n_bytes, 0);
}

TEST(GgufRawTest, TruncatedEverywhereIsAnError) {
  const std::string bytes = ValidTwoTensors();
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> copy(bytes.begin(), bytes.begin() + n);
    auto f = GgufFile::FromBuffer(copy.data(), copy.size());
    EXPECT_FALSE(f.ok()) << "truncated at " << n;
  }
}

// ---------------------------------------------------------------------------------------------
// Writer round trips.

std::vector<float> Ramp(int64_t n, float scale) {
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = scale * std::sin(0.37f * i + 0.1f);
  return x;
}

std::string Quantized(GgmlType type, const std::vector<float>& x) {
  std::string out(RowBytes(type, static_cast<int64_t>(x.size())), '\0');
  QuantizeRow(type, x.data(), out.data(), static_cast<int64_t>(x.size()));
  return out;
}

GgufValue Nested() {
  std::vector<GgufValue> rows;
  rows.push_back(GgufI32Array({1, 2, 3}));
  rows.push_back(GgufI32Array({}));
  rows.push_back(GgufI32Array({-4}));
  std::vector<GgufValue> outer;
  outer.push_back(GgufArrayOf(GgufValueType::kArray, std::move(rows)));
  outer.push_back(GgufArrayOf(GgufValueType::kArray, {}));
  return GgufArrayOf(GgufValueType::kArray, std::move(outer));
}

TEST(GgufWriterTest, RoundTripsEveryValueAndTensorType) {
  GgufWriter w;
  w.SetValue("v.u8", GgufValue{GgufValue::Storage(std::in_place_index<0>, uint8_t{200})});
  w.SetValue("v.i8", GgufValue{GgufValue::Storage(std::in_place_index<1>, int8_t{-100})});
  w.SetValue("v.u16", GgufValue{GgufValue::Storage(std::in_place_index<2>, uint16_t{60000})});
  w.SetValue("v.i16", GgufValue{GgufValue::Storage(std::in_place_index<3>, int16_t{-30000})});
  w.SetValue("v.u32", GgufU32(4000000000u));
  w.SetValue("v.i32", GgufI32(-2000000000));
  w.SetValue("v.f32", GgufF32(1e-5f));
  w.SetValue("v.bool", GgufBool(true));
  w.SetValue("v.string", GgufString("héllo ▁world"));
  w.SetValue("v.empty_string", GgufString(""));
  w.SetValue("v.u64", GgufU64(~0ull));
  w.SetValue("v.i64", GgufValue{GgufValue::Storage(std::in_place_index<11>, int64_t{-5})});
  w.SetValue("v.f64", GgufValue{GgufValue::Storage(std::in_place_index<12>, 3.25)});
  w.SetValue("v.strings", GgufStringArray({"<unk>", "", "▁the"}));
  w.SetValue("v.floats", GgufF32Array({0.5f, -1.0f}));
  w.SetValue("v.ints", GgufI32Array({1, -2, 3}));
  w.SetValue("v.empty_array", GgufStringArray({}));
  w.SetValue("v.nested", Nested());

  struct Spec {
    const char* name;
    GgmlType type;
    std::vector<int64_t> ne;
  };
  const std::vector<Spec> specs = {
      {"t.f32", GgmlType::kF32, {32, 3}},         {"t.f16", GgmlType::kF16, {7}},
      {"t.bf16", GgmlType::kBF16, {5, 2, 1}},     {"t.q8_0", GgmlType::kQ8_0, {64, 3}},
      {"t.q4_0", GgmlType::kQ4_0, {32, 2, 2, 2}}, {"t.empty", GgmlType::kF32, {0, 4}},
  };
  std::vector<std::string> payloads;
  for (size_t i = 0; i < specs.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : specs[i].ne) n *= d;
    payloads.push_back(Quantized(specs[i].type, Ramp(n, 1.0f + i)));
    ASSERT_TRUE(w.AddTensorBytes(specs[i].name, specs[i].type, specs[i].ne, payloads[i]).ok());
  }
  const std::string path = testing::TempDir() + "/all.gguf";
  ASSERT_TRUE(w.WriteFile(path).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.path(), path);
  EXPECT_EQ(g.alignment(), 32u);
  EXPECT_EQ(g.file_size(), std::filesystem::file_size(path));
  EXPECT_EQ(g.file_size() % 32, 0u);
  ASSERT_EQ(g.metadata().size(), 18u);
  EXPECT_EQ(g.metadata()[0].first, "v.u8");
  EXPECT_EQ(g.metadata()[17].first, "v.nested");

  EXPECT_EQ(g.FindValue("v.u8")->type(), GgufValueType::kUint8);
  EXPECT_EQ(g.GetInt("v.u8").value(), 200);
  EXPECT_EQ(g.FindValue("v.i8")->type(), GgufValueType::kInt8);
  EXPECT_EQ(g.GetInt("v.i8").value(), -100);
  EXPECT_EQ(g.GetInt("v.u16").value(), 60000);
  EXPECT_EQ(g.GetInt("v.i16").value(), -30000);
  EXPECT_EQ(g.GetInt("v.u32").value(), 4000000000);
  EXPECT_EQ(g.GetInt("v.i32").value(), -2000000000);
  EXPECT_EQ(g.FindValue("v.f32")->type(), GgufValueType::kFloat32);
  EXPECT_EQ(g.GetDouble("v.f32").value(), static_cast<double>(1e-5f));
  EXPECT_EQ(g.GetInt("v.bool").value(), 1);
  EXPECT_EQ(g.GetString("v.string").value(), "héllo ▁world");
  EXPECT_EQ(g.GetString("v.empty_string").value(), "");
  EXPECT_EQ(std::get<uint64_t>(g.FindValue("v.u64")->v), ~0ull);
  EXPECT_FALSE(g.FindValue("v.u64")->AsInt().has_value());
  ExpectError(g.GetInt("v.u64").status(), "'v.u64' value 18446744073709551615 does not fit");
  EXPECT_EQ(g.GetDouble("v.u64").value(), 18446744073709551615.0);
  EXPECT_EQ(g.GetInt("v.i64").value(), -5);
  EXPECT_EQ(g.GetDouble("v.f64").value(), 3.25);
  EXPECT_EQ(g.GetDouble("v.i32").value(), -2000000000.0);

  const GgufArray* strings = g.GetArray("v.strings").value();
  EXPECT_EQ(strings->element_type, GgufValueType::kString);
  ASSERT_EQ(strings->items.size(), 3u);
  EXPECT_EQ(*strings->items[0].AsString(), "<unk>");
  EXPECT_EQ(*strings->items[1].AsString(), "");
  EXPECT_EQ(*strings->items[2].AsString(), "▁the");
  const GgufArray* floats = g.GetArray("v.floats").value();
  EXPECT_EQ(floats->element_type, GgufValueType::kFloat32);
  EXPECT_EQ(floats->items[1].AsDouble().value(), -1.0);
  const GgufArray* ints = g.GetArray("v.ints").value();
  EXPECT_EQ(ints->element_type, GgufValueType::kInt32);
  EXPECT_EQ(ints->items[1].AsInt().value(), -2);
  EXPECT_TRUE(g.GetArray("v.empty_array").value()->items.empty());
  const GgufArray* nested = g.GetArray("v.nested").value();
  ASSERT_EQ(nested->element_type, GgufValueType::kArray);
  ASSERT_EQ(nested->items.size(), 2u);
  const GgufArray* rows = nested->items[0].AsArray();
  ASSERT_NE(rows, nullptr);
  ASSERT_EQ(rows->items.size(), 3u);
  EXPECT_EQ(rows->items[0].AsArray()->items[2].AsInt().value(), 3);
  EXPECT_TRUE(rows->items[1].AsArray()->items.empty());
  EXPECT_EQ(rows->items[2].AsArray()->items[0].AsInt().value(), -4);
  EXPECT_TRUE(nested->items[1].AsArray()->items.empty());

  ASSERT_EQ(g.tensors().size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const GgufTensorInfo& t = g.tensors()[i];
    EXPECT_EQ(t.name, specs[i].name);
    EXPECT_EQ(t.type, specs[i].type);
    EXPECT_EQ(t.ne, specs[i].ne);
    EXPECT_EQ(t.offset % 32, 0u);
    EXPECT_EQ(t.n_bytes, static_cast<int64_t>(payloads[i].size()));
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(t.data), t.n_bytes), payloads[i]) << t.name;
    EXPECT_EQ(g.FindTensor(specs[i].name), &t);
  }
}

TEST(GgufWriterTest, SetValueReplacesInPlace) {
  GgufWriter w;
  w.SetValue("a", GgufU32(1));
  w.SetValue("b", GgufU32(2));
  w.SetValue("a", GgufString("one"));
  const std::string path = testing::TempDir() + "/replace.gguf";
  ASSERT_TRUE(w.WriteFile(path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->metadata().size(), 2u);
  EXPECT_EQ((*f)->metadata()[0].first, "a");
  EXPECT_EQ((*f)->GetString("a").value(), "one");
  EXPECT_EQ((*f)->metadata()[1].first, "b");
}

TEST(GgufWriterTest, AlignmentAndPowerInferMagic) {
  for (uint32_t alignment : {1u, 8u, 32u, 64u, 4096u}) {
    GgufWriter w;
    w.set_alignment(alignment);
    w.set_powerinfer_magic(alignment == 64);
    w.SetValue("x", GgufU32(1));
    ASSERT_TRUE(w.AddTensorBytes("a", GgmlType::kF16, {3}, std::string(6, 'a')).ok());
    ASSERT_TRUE(w.AddTensorBytes("b", GgmlType::kQ4_0, {32}, std::string(18, 'b')).ok());
    const std::string path = testing::TempDir() + "/aligned.gguf";
    ASSERT_TRUE(w.WriteFile(path).ok());
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->alignment(), alignment);
    EXPECT_EQ((*f)->is_powerinfer(), alignment == 64);
    EXPECT_EQ((*f)->data_offset() % alignment, 0u);
    EXPECT_EQ((*f)->FindValue("general.alignment") != nullptr, alignment != 32);
    for (const auto& t : (*f)->tensors()) EXPECT_EQ(t.offset % alignment, 0u);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>((*f)->FindTensor("b")->data), 18),
              std::string(18, 'b'));
  }
  GgufWriter bad;
  bad.set_alignment(24);
  ExpectError(bad.WriteFile(testing::TempDir() + "/bad.gguf"), "alignment 24 is not");
}

TEST(GgufWriterTest, RejectsBadTensors) {
  GgufWriter w;
  auto filler = [](uint8_t*, int64_t) { return absl::OkStatus(); };
  ExpectError(w.AddTensor("q", GgmlType::kQ8_0, {33}, filler),
              "tensor 'q': ne[0] = 33 is not a multiple of the q8_0 block size 32");
  ExpectError(w.AddTensor("q", GgmlType::kQ4_0, {16, 2}, filler), "q4_0 block size 32");
  ExpectError(w.AddTensor("n", GgmlType::kF32, {4, -1}, filler), "ne[1] = -1 is negative");
  ExpectError(w.AddTensor("d", GgmlType::kF32, {1, 1, 1, 1, 1}, filler), "5 dimensions");
  ExpectError(w.AddTensor("", GgmlType::kF32, {1}, filler), "empty name");
  ExpectError(w.AddTensor("o", GgmlType::kF32, {1ll << 40, 1ll << 40}, filler), "overflows");
  ASSERT_TRUE(w.AddTensor("ok", GgmlType::kF32, {1}, filler).ok());
  ExpectError(w.AddTensor("ok", GgmlType::kF32, {1}, filler), "tensor 'ok': duplicate");
  ExpectError(w.AddTensorBytes("short", GgmlType::kF32, {4}, "abc"),
              "tensor 'short': got 3 bytes, shape needs 16");
}

TEST(GgufWriterTest, FillerErrorLeavesNoFile) {
  GgufWriter w;
  ASSERT_TRUE(w.AddTensor("t", GgmlType::kF32, {8}, [](uint8_t*, int64_t) {
                 return absl::DataLossError("boom");
               }).ok());
  const std::string path = testing::TempDir() + "/fail.gguf";
  ExpectError(w.WriteFile(path), "tensor 't': boom");
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  ExpectError(w.WriteFile("/nonexistent-dir/x.gguf"), "cannot create");
}

TEST(GgufWriterTest, MismatchedArrayItemsRejected) {
  GgufWriter w;
  std::vector<GgufValue> items;
  items.push_back(GgufU32(1));
  items.push_back(GgufString("x"));
  w.SetValue("mixed", GgufArrayOf(GgufValueType::kUint32, std::move(items)));
  ExpectError(w.WriteFile(testing::TempDir() + "/mixed.gguf"),
              "key 'mixed': array item 1 has type string, expected uint32");
}

// ---------------------------------------------------------------------------------------------
// Lookups.

TEST(GgufFileTest, TypedGettersNameTheKey) {
  GgufWriter w;
  w.SetValue("s", GgufString("x"));
  w.SetValue("i", GgufI32(3));
  w.SetValue("a", GgufF32Array({1.0f}));
  const std::string path = testing::TempDir() + "/getters.gguf";
  ASSERT_TRUE(w.WriteFile(path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ExpectError((*f)->GetInt("missing.key").status(), "metadata key 'missing.key' not found");
  EXPECT_EQ((*f)->GetInt("missing.key").status().code(), absl::StatusCode::kNotFound);
  ExpectError((*f)->GetInt("s").status(), "metadata key 's' has type string, expected an integer");
  ExpectError((*f)->GetDouble("a").status(), "'a' has type array[float32], expected a number");
  ExpectError((*f)->GetString("i").status(), "'i' has type int32, expected a string");
  ExpectError((*f)->GetArray("s").status(), "'s' has type string, expected an array");
  EXPECT_EQ((*f)->FindValue("nope"), nullptr);
}

TEST(GgufValueTest, Conversions) {
  EXPECT_EQ(GgufBool(true).AsInt().value(), 1);
  EXPECT_EQ(GgufBool(false).AsDouble().value(), 0.0);
  EXPECT_FALSE(GgufString("1").AsInt().has_value());
  EXPECT_FALSE(GgufF32(1.0f).AsInt().has_value());
  EXPECT_EQ(GgufF32(1.5f).AsDouble().value(), 1.5);
  EXPECT_FALSE(GgufStringArray({}).AsDouble().has_value());
  EXPECT_EQ(GgufU32(7).type(), GgufValueType::kUint32);
  EXPECT_EQ(GgufValueTypeName(GgufValueType::kFloat64), "float64");
}

TEST(GgufFileTest, OpenErrors) {
  auto missing = GgufFile::Open("/nonexistent/model.gguf");
  ExpectError(missing.status(), "gguf: /nonexistent/model.gguf: cannot open");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  ExpectError(GgufFile::Open(testing::TempDir()).status(), "not a regular file");
  ExpectError(GgufFile::Open(WriteBytes("", "empty.gguf")).status(), "file is empty");
  const std::string bad = WriteBytes(RawGguf().Header(0, 0, 1).bytes(), "v1.gguf");
  ExpectError(GgufFile::Open(bad).status(),
              "gguf: " + bad + ": header: version 1 is not supported");
}

// ---------------------------------------------------------------------------------------------
// The real model.

TEST(GgufStoriesTest, ReadsStories260K) {
  const std::string path = testing::ModelPath("stories260K/stories260K.gguf");
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_FALSE(g.is_powerinfer());
  EXPECT_EQ(g.alignment(), 32u);
  EXPECT_EQ(g.metadata().size(), 19u);
  EXPECT_EQ(g.tensors().size(), 48u);
  EXPECT_EQ(g.data_offset(), 14176u);
  EXPECT_EQ(g.file_size(), 1185376u);
  for (const GgufTensorInfo& t : g.tensors()) EXPECT_EQ(t.type, GgmlType::kF32) << t.name;
  const GgufTensorInfo* embd = g.FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->ne, (std::vector<int64_t>{64, 512}));
  EXPECT_EQ(embd->n_bytes, 64 * 512 * 4);
  ASSERT_NE(g.FindTensor("blk.4.ffn_gate.weight"), nullptr);
  EXPECT_EQ(g.FindTensor("blk.4.ffn_gate.weight")->ne, (std::vector<int64_t>{64, 172}));
  EXPECT_EQ(g.GetString("general.architecture").value(), "llama");
  EXPECT_EQ(g.GetInt("llama.block_count").value(), 5);
  EXPECT_EQ(g.GetInt("llama.attention.head_count_kv").value(), 4);
  EXPECT_NEAR(g.GetDouble("llama.attention.layer_norm_rms_epsilon").value(), 1e-5, 1e-12);
  const GgufArray* tokens = g.GetArray("tokenizer.ggml.tokens").value();
  ASSERT_EQ(tokens->items.size(), 512u);
  EXPECT_EQ(*tokens->items[1].AsString(), "<s>");
  EXPECT_EQ(*tokens->items[3].AsString(), "<0x00>");
  EXPECT_EQ(g.GetArray("tokenizer.ggml.scores").value()->element_type, GgufValueType::kFloat32);
  // The embedding is bit-identical to the llama2.c checkpoint's, which follows its 28-byte header.
  const std::string bin = testing::ReadFileOrDie(testing::ModelPath("stories260K/stories260K.bin"));
  ASSERT_GE(bin.size(), 28u + embd->n_bytes);
  EXPECT_EQ(0, std::memcmp(embd->data, bin.data() + 28, embd->n_bytes));
}

TEST(GgufStoriesTest, Version2AndPowerInferVariantsParse) {
  std::string bytes = testing::ReadFileOrDie(testing::ModelPath("stories260K/stories260K.gguf"));
  bytes[4] = 2;
  auto v2 = Parse(bytes);
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ((*v2)->version(), 2u);
  bytes.replace(0, 4, "PWRI");
  auto pwri = Parse(bytes);
  ASSERT_TRUE(pwri.ok()) << pwri.status();
  EXPECT_TRUE((*pwri)->is_powerinfer());
  bytes[4] = 1;
  ExpectError(ParseError(bytes), "version 1 is not supported");
}

TEST(GgufStoriesTest, SpecificCorruptions) {
  const std::string orig =
      testing::ReadFileOrDie(testing::ModelPath("stories260K/stories260K.gguf"));
  // Cut inside the last tensor's data.
  ExpectError(ParseError(orig.substr(0, orig.size() - 100)),
              "tensor 47 'blk.4.ffn_norm.weight': data [1185120, 1185376)");
  ExpectError(ParseError(orig.substr(0, orig.size() - 100)),
              "extends past end of file (size 1185276)");
  // Cut inside the metadata.
  ExpectError(ParseError(orig.substr(0, 5000)), "metadata 0 'tokenizer.ggml.tokens' item");
  // The tokens array length (after magic, version, counts, key and two type fields).
  std::string bytes = orig;
  const size_t n_at = 24 + 8 + std::string("tokenizer.ggml.tokens").size() + 4 + 4;
  const uint64_t huge = 1ull << 60;
  std::memcpy(bytes.data() + n_at, &huge, 8);
  ExpectError(ParseError(bytes), "array of 1152921504606846976 string items cannot fit");
  ExpectError(ParseError(bytes), absl::StrCat("(at byte ", n_at, ")"));
}

}  // namespace
}  // namespace thermocline
