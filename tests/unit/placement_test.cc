// Placement files (PowerInfer's .gpuidx format: ours and hand-made PowerInfer ones, every check
// on read), Placement::Uniform, byte sizes, and the planner on stories260K with its profile.
#include "shared/sparsity/placement.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shared/gguf/gguf.h"
#include "shared/runtime/corpus.h"
#include "shared/model/synth.h"
#include "shared/sparsity/partition.h"
#include "shared/sparsity/planner.h"
#include "shared/sparsity/profiler.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

void ExpectError(const absl::Status& s, const std::string& substr) {
  EXPECT_FALSE(s.ok()) << "expected an error containing: " << substr;
  EXPECT_NE(std::string(s.message()).find(substr), std::string::npos)
      << "message: " << s.message() << "\nexpected to contain: " << substr;
}

LayerPlacement MakeLayer(int64_t n, std::vector<int32_t> bucket) {
  LayerPlacement l;
  l.on_gpu.assign(n, 0);
  for (int32_t id : bucket) l.on_gpu[id] = 1;
  l.gpu_bucket = std::move(bucket);
  return l;
}

ModelConfig Config(int64_t layers, int64_t ffn) {
  ModelConfig c;
  c.dim = 16;
  c.ffn_dim = ffn;
  c.n_layers = layers;
  return c;
}

TEST(PlacementTest, RoundTrip) {
  Placement p;
  std::vector<int32_t> all(64);
  std::iota(all.begin(), all.end(), 0);
  p.layers = {MakeLayer(64, {0, 5, 63}), MakeLayer(64, {}), MakeLayer(64, all)};
  p.vram_capacity = int64_t{6} << 30;
  p.expected_gpu_share = 0.75;
  p.gpu_ffn_bytes = 12345;
  const std::string path = testing::TempDir() + "/plan.gguf";
  ASSERT_TRUE(WritePlacement(p, path).ok());
  auto back = ReadPlacement(path, Config(3, 64));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->layers.size(), 3u);
  for (size_t l = 0; l < 3; ++l) {
    EXPECT_EQ(back->layers[l].gpu_bucket, p.layers[l].gpu_bucket);
    EXPECT_EQ(back->layers[l].on_gpu, p.layers[l].on_gpu);
  }
  EXPECT_EQ(back->vram_capacity, p.vram_capacity);
  EXPECT_FLOAT_EQ(back->expected_gpu_share, 0.75);
  EXPECT_EQ(back->gpu_ffn_bytes, 12345);
  EXPECT_EQ(back->n_gpu_neurons(), 3 + 0 + 64);
  ASSERT_TRUE(ReadPlacement(path).ok());  // shapes from the file alone

  // PowerInfer's format: PWRI magic, its architecture and keys, I32 stored as its id 18.
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE((*f)->is_powerinfer());
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "generic.gpu_index");
  EXPECT_EQ(*(*f)->GetInt("generic.gpu_index.block_count"), 3);
  EXPECT_EQ((*f)->FindValue("split.vram_capacity")->type(), GgufValueType::kUint64);
  EXPECT_EQ((*f)->tensors()[0].name, "blk.0.gpu_idx");
  EXPECT_EQ((*f)->tensors()[1].name, "blk.0.gpu_bucket");
  const std::string bytes = testing::ReadFileOrDie(path);
  EXPECT_EQ(bytes.substr(0, 4), "PWRI");
  const size_t at = bytes.find("blk.0.gpu_idx") + 13 + 4 + 8;  // name, n_dims, ne[0]
  uint32_t id = 0;
  std::memcpy(&id, bytes.data() + at, 4);
  EXPECT_EQ(id, 18u);

  ExpectError(ReadPlacement(path, Config(4, 64)).status(),
              "generic.gpu_index.block_count = 3 but the model has 4 layers");
  ExpectError(ReadPlacement(path, Config(3, 65)).status(),
              "tensor 'blk.0.gpu_idx' has shape (64), expected (65)");
}

// Builds a .gpuidx byte for byte as PowerInfer's gguf-py (export_split) writes it: PWRI magic,
// version 3, general.architecture, generic.gpu_index.block_count (u32), split.vram_capacity
// (u64), then per layer gpu_idx and gpu_bucket as 1-D tensors of type 18 (I32 in PowerInfer's
// ggml), each tensor's data padded to 32 bytes.
std::string PowerInferGpuIdx(const std::vector<std::vector<int32_t>>& idx,
                             const std::vector<std::vector<int32_t>>& buckets, uint64_t vram,
                             const std::string& count_key = "generic.gpu_index.block_count") {
  std::string out;
  auto put = [&](const auto& x) { out.append(reinterpret_cast<const char*>(&x), sizeof(x)); };
  auto str = [&](const std::string& s) {
    put(static_cast<uint64_t>(s.size()));
    out += s;
  };
  out += "PWRI";
  put(uint32_t{3});
  put(static_cast<uint64_t>(2 * idx.size()));
  put(uint64_t{3});
  str("general.architecture");
  put(uint32_t{8});
  str("generic.gpu_index");
  str(count_key);
  put(uint32_t{4});
  put(static_cast<uint32_t>(idx.size()));
  str("split.vram_capacity");
  put(uint32_t{10});
  put(vram);
  std::vector<const std::vector<int32_t>*> data;
  uint64_t offset = 0;
  auto tensor = [&](const std::string& name, const std::vector<int32_t>& v) {
    str(name);
    put(uint32_t{1});
    put(static_cast<uint64_t>(v.size()));
    put(uint32_t{18});
    put(offset);
    offset += (v.size() * 4 + 31) / 32 * 32;
    data.push_back(&v);
  };
  for (size_t l = 0; l < idx.size(); ++l) {
    tensor(absl::StrCat("blk.", l, ".gpu_idx"), idx[l]);
    tensor(absl::StrCat("blk.", l, ".gpu_bucket"), buckets[l]);
  }
  out.resize((out.size() + 31) / 32 * 32, '\0');
  for (const auto* v : data) {
    out.append(reinterpret_cast<const char*>(v->data()), v->size() * 4);
    out.resize((out.size() + 31) / 32 * 32, '\0');
  }
  return out;
}

std::string WriteBytes(const std::string& bytes, const std::string& name) {
  const std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
  return path;
}

TEST(PlacementTest, ReadsPowerInferGpuIdxFiles) {
  const std::vector<std::vector<int32_t>> idx = {{1, 0, 1, 0, 0, 0, 0, 1},
                                                 {0, 0, 0, 0, 0, 0, 0, 0}};
  const std::vector<std::vector<int32_t>> buckets = {{0, 2, 7}, {}};
  auto p = ReadPlacement(WriteBytes(PowerInferGpuIdx(idx, buckets, 4ull << 30), "pi.gpuidx"),
                         Config(2, 8));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->layers[0].gpu_bucket, buckets[0]);
  EXPECT_EQ(p->layers[0].on_gpu, (std::vector<uint8_t>{1, 0, 1, 0, 0, 0, 0, 1}));
  EXPECT_TRUE(p->layers[1].gpu_bucket.empty());
  EXPECT_EQ(p->vram_capacity, int64_t{4} << 30);
  EXPECT_EQ(p->expected_gpu_share, 0.0);  // PowerInfer does not store it

  // A llama-style block count is accepted too.
  EXPECT_TRUE(ReadPlacement(
                  WriteBytes(PowerInferGpuIdx(idx, buckets, 1, "llama.block_count"), "pi2.gpuidx"),
                  Config(2, 8))
                  .ok());

  // The same written with GgufWriter (PWRI magic, I32 tensors) reads back the same.
  GgufWriter w;
  w.set_powerinfer_magic(true);
  w.SetValue("general.architecture", GgufString("generic.gpu_index"));
  w.SetValue("generic.gpu_index.block_count", GgufU32(2));
  w.SetValue("split.vram_capacity", GgufU64(4ull << 30));
  for (size_t l = 0; l < 2; ++l) {
    ASSERT_TRUE(w.AddTensorBytes(absl::StrCat("blk.", l, ".gpu_idx"), GgmlType::kI32, {8},
                                 std::string_view(reinterpret_cast<const char*>(idx[l].data()), 32))
                    .ok());
    ASSERT_TRUE(w.AddTensorBytes(absl::StrCat("blk.", l, ".gpu_bucket"), GgmlType::kI32,
                                 {static_cast<int64_t>(buckets[l].size())},
                                 std::string_view(reinterpret_cast<const char*>(buckets[l].data()),
                                                  buckets[l].size() * 4))
                    .ok());
  }
  const std::string path = testing::TempDir() + "/writer.gpuidx";
  ASSERT_TRUE(w.WriteFile(path).ok());
  EXPECT_EQ(testing::ReadFileOrDie(path), PowerInferGpuIdx(idx, buckets, 4ull << 30));
  auto q = ReadPlacement(path, Config(2, 8));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->layers[0].gpu_bucket, buckets[0]);
}

TEST(PlacementTest, ReadRejectsInconsistentFiles) {
  const std::vector<std::vector<int32_t>> idx = {{1, 0, 1, 0}, {0, 1, 0, 0}};
  auto error = [&](std::vector<std::vector<int32_t>> i, std::vector<std::vector<int32_t>> b) {
    return ReadPlacement(WriteBytes(PowerInferGpuIdx(i, b, 0), "bad.gpuidx"), Config(2, 4))
        .status();
  };
  EXPECT_TRUE(error(idx, {{0, 2}, {1}}).ok());
  ExpectError(error(idx, {{0, 4}, {1}}), "layer 0: gpu_bucket[1] = 4 is not a neuron id in [0, 4)");
  ExpectError(error(idx, {{0, -1}, {1}}), "gpu_bucket[1] = -1 is not a neuron id");
  ExpectError(error(idx, {{2, 0}, {1}}), "gpu_bucket is not strictly ascending at [1]: 2 then 0");
  ExpectError(error(idx, {{0, 0}, {1}}), "not strictly ascending");
  ExpectError(error(idx, {{0, 1}, {1}}), "gpu_bucket[1] = 1 but gpu_idx[1] is 0");
  ExpectError(error(idx, {{0}, {1}}), "gpu_idx marks 2 neurons but gpu_bucket lists 1");
  ExpectError(error({{1, 0, 2, 0}, {0, 1, 0, 0}}, {{0, 2}, {1}}), "gpu_idx[2] = 2 is not 0 or 1");
  ExpectError(error({{1, 0, 1}, {0, 1, 0, 0}}, {{0, 2}, {1}}),
              "tensor 'blk.0.gpu_idx' has shape (3), expected (4)");

  GgufWriter w;
  w.set_powerinfer_magic(true);
  w.SetValue("general.architecture", GgufString("generic.gpu_index"));
  w.SetValue("generic.gpu_index.block_count", GgufU32(1));
  ASSERT_TRUE(w.AddTensorBytes("blk.0.gpu_idx", GgmlType::kF32, {4}, std::string(16, '\0')).ok());
  const std::string path = testing::TempDir() + "/f32.gpuidx";
  ASSERT_TRUE(w.WriteFile(path).ok());
  ExpectError(ReadPlacement(path, Config(1, 4)).status(),
              "tensor 'blk.0.gpu_idx' has type f32, expected i32");
  GgufWriter w2 = w;
  w2.SetValue("general.architecture", GgufString("llama"));
  ASSERT_TRUE(w2.WriteFile(path).ok());
  ExpectError(ReadPlacement(path, Config(1, 4)).status(),
              "general.architecture is 'llama', expected 'generic.gpu_index'");
  GgufWriter w3;
  w3.SetValue("general.architecture", GgufString("generic.gpu_index"));
  ASSERT_TRUE(w3.WriteFile(path).ok());
  ExpectError(ReadPlacement(path, Config(1, 4)).status(), "no block count");
  GgufWriter w4;
  w4.SetValue("general.architecture", GgufString("generic.gpu_index"));
  w4.SetValue("generic.gpu_index.block_count", GgufU32(1));
  ASSERT_TRUE(w4.AddTensorBytes("blk.0.gpu_idx", GgmlType::kI32, {4}, std::string(16, '\0')).ok());
  ASSERT_TRUE(w4.WriteFile(path).ok());
  ExpectError(ReadPlacement(path, Config(1, 4)).status(), "tensor 'blk.0.gpu_bucket' is missing");

  // The writer refuses what the reader would refuse.
  Placement p;
  p.layers = {MakeLayer(4, {0, 2})};
  p.layers[0].gpu_bucket = {2, 0};
  ExpectError(WritePlacement(p, path), "not strictly ascending");
  p.layers[0].gpu_bucket = {0, 2};
  p.expected_gpu_share = 1.5;
  ExpectError(WritePlacement(p, path), "expected_gpu_share 1.5 is not in [0, 1]");
}

// Layer 1 of 2 is an MoE layer of 3 experts x 4 neurons: ids e * 4 + i.
ModelConfig MoeConfig() {
  ModelConfig c = Config(2, 4);
  c.n_experts = 3;
  c.n_experts_used = 2;
  c.layers.resize(2);
  c.layers[1].moe = true;
  return c;
}

TEST(PlacementTest, MoeLayersPlaceEveryExpertsNeurons) {
  const ModelConfig c = MoeConfig();
  EXPECT_EQ(LayerNeurons(c, 0), 4);
  EXPECT_EQ(LayerNeurons(c, 1), 12);
  // Each expert gets the fraction of its own neurons, lowest ids first.
  Placement p = Placement::Uniform(c, 0.5, nullptr);
  EXPECT_EQ(p.layers[0].gpu_bucket, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(p.layers[1].gpu_bucket, (std::vector<int32_t>{0, 1, 4, 5, 8, 9}));
  // Hottest first within each expert when statistics are given.
  ActivationStats s;
  s.dim = 16;
  s.ffn_dim = 4;
  s.layers.resize(2);
  s.layers[0].frequency = {0.1f, 0.2f, 0.3f, 0.4f};
  s.layers[1].frequency = {0.9f, 0, 0, 0.8f, 0, 0.1f, 0.2f, 0, 0, 0, 0.5f, 0.6f};
  p = Placement::Uniform(c, 0.5, &s);
  EXPECT_EQ(p.layers[0].gpu_bucket, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(p.layers[1].gpu_bucket, (std::vector<int32_t>{0, 3, 5, 6, 10, 11}));

  // A plan's per-expert lists round-trip and split into partitions per expert.
  p.layers[1] = MakeLayer(12, {1, 2, 3, 11});  // expert 0: 1..3, expert 1: none, expert 2: 3
  const std::string path = testing::TempDir() + "/moe_plan.gguf";
  ASSERT_TRUE(WritePlacement(p, path).ok());
  auto back = ReadPlacement(path, c);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->layers[1].gpu_bucket, (std::vector<int32_t>{1, 2, 3, 11}));
  auto part = Partition::FromPlacement(*back, c);
  ASSERT_TRUE(part.ok()) << part.status();
  const LayerPartition& lp = part->layers[1];
  EXPECT_EQ(std::vector<int32_t>(ExpertSlice(lp.hot, 0, 4).begin(), ExpertSlice(lp.hot, 0, 4).end()),
            (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(ExpertSlice(lp.hot, 1, 4).empty());
  EXPECT_EQ(std::vector<int32_t>(ExpertSlice(lp.cold, 1, 4).begin(), ExpertSlice(lp.cold, 1, 4).end()),
            (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(std::vector<int32_t>(ExpertSlice(lp.cold, 2, 4).begin(), ExpertSlice(lp.cold, 2, 4).end()),
            (std::vector<int32_t>{8, 9, 10}));

  // Bad plans are refused naming the layer and the expert.
  const std::vector<std::vector<int32_t>> idx = {{1, 0, 0, 0}, std::vector<int32_t>(12, 0)};
  auto error = [&](std::vector<std::vector<int32_t>> i, std::vector<std::vector<int32_t>> b) {
    return ReadPlacement(WriteBytes(PowerInferGpuIdx(i, b, 0), "bad_moe.gpuidx"), c).status();
  };
  EXPECT_TRUE(error(idx, {{0}, {}}).ok());
  std::vector<std::vector<int32_t>> two = idx;
  two[1][9] = 2;
  ExpectError(error(two, {{0}, {9}}), "layer 1: gpu_idx[9] (expert 2, neuron 1) = 2 is not 0 or 1");
  ExpectError(error(idx, {{0}, {6}}),
              "layer 1: gpu_bucket[0] = 6 (expert 1, neuron 2) but gpu_idx[6] is 0");
  // A dense-sized layer where the model has experts: the shape names what is expected.
  ExpectError(error({{1, 0, 0, 0}, {0, 0, 0, 0}}, {{0}, {}}),
              "tensor 'blk.1.gpu_idx' has shape (4), expected (12)");
  Placement dense_sized = Placement::Uniform(Config(2, 4), 0.5, nullptr);
  ExpectError(Partition::FromPlacement(dense_sized, c).status(),
              "placement layer 1 has 4 neurons, the model 12 (3 experts x 4)");
}

TEST(PlacementTest, Uniform) {
  const ModelConfig c = Config(2, 10);
  Placement p = Placement::Uniform(c, 0.3, nullptr);
  ASSERT_EQ(p.layers.size(), 2u);
  EXPECT_EQ(p.layers[0].gpu_bucket, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(p.expected_gpu_share, 0.0);
  EXPECT_TRUE(ValidatePlacement(p).ok());

  ActivationStats s;
  s.dim = 16;
  s.ffn_dim = 10;
  s.layers.resize(2);
  s.layers[0].frequency = {0.1f, 0.9f, 0.0f, 0.5f, 0.2f, 0.8f, 0.0f, 0.0f, 0.0f, 0.5f};
  s.layers[1].frequency = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  p = Placement::Uniform(c, 0.3, &s);
  EXPECT_EQ(p.layers[0].gpu_bucket, (std::vector<int32_t>{1, 3, 5}));  // 0.9, 0.8, first 0.5
  EXPECT_EQ(p.layers[1].gpu_bucket, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_NEAR(p.expected_gpu_share, (2.2 + 3.0) / (3.0 + 10.0), 1e-6);
  EXPECT_EQ(Placement::Uniform(c, 1.0, &s).expected_gpu_share, 1.0);
  EXPECT_EQ(Placement::Uniform(c, 0.0, &s).n_gpu_neurons(), 0);
}

TEST(ByteSizeTest, ParsesUnitsAndRejectsGarbage) {
  EXPECT_EQ(*ParseByteSize("6GiB"), int64_t{6} << 30);
  EXPECT_EQ(*ParseByteSize("6G"), int64_t{6} << 30);
  EXPECT_EQ(*ParseByteSize("6 gib"), int64_t{6} << 30);
  EXPECT_EQ(*ParseByteSize("1.5GiB"), int64_t{3} << 29);
  EXPECT_EQ(*ParseByteSize("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("512M"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("64KiB"), int64_t{64} << 10);
  EXPECT_EQ(*ParseByteSize("2K"), 2048);
  EXPECT_EQ(*ParseByteSize("2KB"), 2000);
  EXPECT_EQ(*ParseByteSize("3GB"), int64_t{3000000000});
  EXPECT_EQ(*ParseByteSize("4096"), 4096);
  EXPECT_EQ(*ParseByteSize("4096B"), 4096);
  EXPECT_EQ(*ParseByteSize(" 1TiB "), int64_t{1} << 40);
  EXPECT_EQ(*ParseByteSize("0"), 0);
  ExpectError(ParseByteSize("").status(), "expected a non-negative number");
  ExpectError(ParseByteSize("GiB").status(), "expected a non-negative number");
  ExpectError(ParseByteSize("-1GiB").status(), "size '-1GiB': expected a non-negative number");
  ExpectError(ParseByteSize("6 GiBs").status(), "unknown unit 'GiBs'");
  ExpectError(ParseByteSize("6x").status(), "unknown unit 'x'");
  ExpectError(ParseByteSize("1.2.3G").status(), "unknown unit '.3G'");
  ExpectError(ParseByteSize("nan").status(), "expected a non-negative number");
  ExpectError(ParseByteSize("99999999999TiB").status(), "too large");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(int64_t{3} << 29), "1.50 GiB");
}

// The planner on stories260K with a real profile of the TinyStories sample.
class PlannerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto model = Model::Load(testing::ModelPath("stories260K/stories260K.gguf"));
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = model->release();
    auto tokens =
        TokenizeCorpusFile(testing::SharedDataDir() + "/corpus/tinystories_valid_sample.txt",
                           model_->tokenizer(), 4096);
    ASSERT_TRUE(tokens.ok());
    ThreadPool pool(2);
    auto result = ProfileActivations(*model_, *tokens, ProfileOptions(), pool);
    ASSERT_TRUE(result.ok()) << result.status();
    stats_ = new ActivationStats(result->stats);
  }
  static void TearDownTestSuite() {
    delete model_;
    delete stats_;
  }
  static PlannerOptions Options(int64_t budget) {
    PlannerOptions o;
    o.vram_budget = budget;
    o.context = 512;
    o.scratch_bytes = 1 << 20;
    return o;
  }
  static int64_t Dense() { return ChargeDense(*model_, Options(1)).total(); }

  static Model* model_;
  static ActivationStats* stats_;
};
Model* PlannerTest::model_ = nullptr;
ActivationStats* PlannerTest::stats_ = nullptr;

TEST_F(PlannerTest, ChargesTheDensePart) {
  const DenseCharges d = ChargeDense(*model_, Options(1));
  // stories260K, all f32: 512 x 64 embeddings and an untied output head of the same size, 11
  // norms of 64, per layer q/o 64x64 and k/v 32x64, KV cache K and V x 5 layers x 512
  // positions x kv_dim 32 in f32 for the gateway's 4 slots plus its probe slot.
  EXPECT_EQ(d.token_embd, 512 * 64 * 4);
  EXPECT_EQ(d.output, 512 * 64 * 4);
  EXPECT_EQ(d.norms, 11 * 64 * 4);
  EXPECT_EQ(d.attention, 5 * (2 * 64 * 64 + 2 * 32 * 64) * 4);
  EXPECT_EQ(d.kv_cache, 2 * 5 * 512 * 32 * 4 * (4 + 1));
  EXPECT_EQ(d.predictors, 0);
  EXPECT_EQ(d.scratch, 1 << 20);
  PlannerOptions f16 = Options(1);
  f16.kv_slots = 1;
  f16.kv_type = "f16";
  EXPECT_EQ(ChargeDense(*model_, f16).kv_cache, 2 * 5 * 512 * 32 * 2 * (1 + 1));
}

// The plan records the KV cache it charged (a gateway serving another one refuses the plan),
// and the file keeps it; bad KV options are refused naming them.
TEST_F(PlannerTest, RecordsTheKvConfigurationItCharged) {
  PlannerOptions o = Options(Dense() + (64 << 10));
  o.kv_slots = 2;
  o.kv_type = "f16";
  auto plan = PlanPlacement(*model_, *stats_, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->placement.kv_slots, 2);
  EXPECT_EQ(plan->placement.kv_context, 512);
  EXPECT_EQ(plan->placement.kv_type, "f16");
  const std::string path = testing::TempDir() + "/kv-plan.gguf";
  ASSERT_TRUE(WritePlacement(plan->placement, path).ok());
  auto back = ReadPlacement(path, model_->config());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kv_slots, 2);
  EXPECT_EQ(back->kv_context, 512);
  EXPECT_EQ(back->kv_type, "f16");
  o.kv_type = "q8_0";
  EXPECT_NE(PlanPlacement(*model_, *stats_, o).status().message().find("--kv-type 'q8_0'"),
            std::string::npos);
  o.kv_type = "f32";
  o.kv_slots = 0;
  EXPECT_NE(PlanPlacement(*model_, *stats_, o).status().message().find("--kv-slots 0"),
            std::string::npos);
}

TEST_F(PlannerTest, RefusesABudgetBelowTheDensePartNamingTheMissingBytes) {
  auto plan = PlanPlacement(*model_, *stats_, Options(Dense() - 12345));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  ExpectError(plan.status(), "12345 bytes (12.1 KiB) are missing");
  ExpectError(plan.status(), "KV cache 3.12 MiB (4 slots + 1 x 512 positions, f32)");
}

TEST_F(PlannerTest, ABudgetForEverythingPutsEveryNeuronOnTheGpu) {
  // Each neuron: gate and up rows of 64 f32, and a column of the f32 ffn_down.
  const int64_t all = 5 * 172 * 3 * 64 * 4;
  auto plan = PlanPlacement(*model_, *stats_, Options(Dense() + all));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ffn_bytes, all);
  EXPECT_EQ(plan->gpu_ffn_bytes, all);
  EXPECT_EQ(plan->placement.n_gpu_neurons(), 5 * 172);
  EXPECT_DOUBLE_EQ(plan->placement.expected_gpu_share, 1.0);
  // One byte less and the last step of some layer no longer fits.
  auto less = PlanPlacement(*model_, *stats_, Options(Dense() + all - 1));
  ASSERT_TRUE(less.ok());
  EXPECT_LT(less->placement.n_gpu_neurons(), 5 * 172);
  EXPECT_LT(less->placement.expected_gpu_share, 1.0);
}

TEST_F(PlannerTest, InBetweenTheHottestNeuronsAreChosenAndTheShareGrowsWithTheBudget) {
  const int64_t neuron = 3 * 64 * 4;
  double last_share = 0;
  for (int64_t n : {0, 10, 32, 64, 100, 200, 333, 500, 700, 860}) {
    auto plan = PlanPlacement(*model_, *stats_, Options(Dense() + n * neuron));
    ASSERT_TRUE(plan.ok()) << plan.status();
    const Placement& p = plan->placement;
    ASSERT_TRUE(ValidatePlacement(p).ok());
    EXPECT_GE(p.expected_gpu_share, last_share) << n << " neurons' worth";
    last_share = p.expected_gpu_share;
    EXPECT_LE(plan->gpu_ffn_bytes, n * neuron);
    // Whole steps only: at most one step (32 neurons) of budget can be left unused per layer.
    EXPECT_GT(plan->gpu_ffn_bytes + 5 * 32 * neuron, n * neuron - 1);
    double placed = 0, total = 0;
    for (int64_t l = 0; l < 5; ++l) {
      const LayerPlacement& lp = p.layers[l];
      const int64_t k = static_cast<int64_t>(lp.gpu_bucket.size());
      EXPECT_TRUE(k == 0 || k == 172 || (k >= 32 && k % 32 == 0)) << "layer " << l << ": " << k;
      // Hottest first: no neuron left on the CPU is more often active than one on the GPU.
      const std::vector<float>& f = stats_->layers[l].frequency;
      float min_gpu = 2, max_cpu = -1;
      for (int64_t i = 0; i < 172; ++i) {
        if (lp.on_gpu[i]) {
          min_gpu = std::min(min_gpu, f[i]);
          placed += f[i];
        } else {
          max_cpu = std::max(max_cpu, f[i]);
        }
        total += f[i];
      }
      if (k > 0 && k < 172) {
        EXPECT_GE(min_gpu, max_cpu) << "layer " << l;
      }
    }
    EXPECT_NEAR(p.expected_gpu_share, placed / total, 1e-9);
    if (n == 0) {
      EXPECT_EQ(p.n_gpu_neurons(), 0);
    }
  }
  EXPECT_DOUBLE_EQ(last_share, 1.0);
}

TEST_F(PlannerTest, MinSliceAndPredictors) {
  const int64_t neuron = 3 * 64 * 4;
  PlannerOptions o = Options(Dense() + 300 * neuron);
  o.min_slice = 100;
  auto plan = PlanPlacement(*model_, *stats_, o);
  ASSERT_TRUE(plan.ok());
  for (const LayerPlacement& lp : plan->placement.layers) {
    const size_t k = lp.gpu_bucket.size();
    EXPECT_TRUE(k == 0 || k == 128 || k == 160 || k == 172) << k;
  }
  o.min_slice = 0;
  ExpectError(PlanPlacement(*model_, *stats_, o).status(), "--min-slice 0 must be >= 1");

  // Predictors are charged with the dense part, so the same budget places fewer neurons.
  o = Options(Dense() + 300 * neuron);
  o.predictor_bytes = 100 * neuron;
  auto with = PlanPlacement(*model_, *stats_, o);
  ASSERT_TRUE(with.ok());
  EXPECT_LE(with->gpu_ffn_bytes, 200 * neuron);
  EXPECT_EQ(with->dense.predictors, 100 * neuron);

  // PredictorBytes reads PowerInfer-named predictor tensors and checks their shapes.
  GgufWriter w;
  w.SetValue("general.architecture", GgufString("llama"));
  for (int l = 0; l < 5; ++l) {
    ASSERT_TRUE(w.AddTensorBytes(absl::StrCat("blk.", l, ".fc1.weight"), GgmlType::kF32, {64, 8},
                                 std::string(64 * 8 * 4, '\0'))
                    .ok());
    if (l == 3) continue;
    ASSERT_TRUE(w.AddTensorBytes(absl::StrCat("blk.", l, ".fc2.weight"), GgmlType::kF32, {8, 172},
                                 std::string(8 * 172 * 4, '\0'))
                    .ok());
  }
  const std::string path = testing::TempDir() + "/pred.gguf";
  ASSERT_TRUE(w.WriteFile(path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok());
  ExpectError(PredictorBytes(**f, model_->config()).status(), "'blk.3.fc2.weight' is missing");
  ASSERT_TRUE(
      w.AddTensorBytes("blk.3.fc2.weight", GgmlType::kF32, {8, 172}, std::string(8 * 172 * 4, '\0'))
          .ok());
  ASSERT_TRUE(w.WriteFile(path).ok());
  f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok());
  auto bytes = PredictorBytes(**f, model_->config());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, 5 * (64 * 8 + 8 * 172) * 4);
  EXPECT_EQ(*PredictorBytes(model_->file(), model_->config()), 0);
}

// The planner on a synthetic ReLU llama-MoE (4 experts, 2 used) with its per-expert profile:
// routers charged with the dense part, each layer's GPU neurons the most valuable by
// frequency x the expert's share of the tokens, and a plan the split's partition accepts.
TEST(MoePlannerTest, PlacesExpertNeuronsByExpectedActivations) {
  SynthOptions so;
  so.dim = 64;
  so.ffn = 96;
  so.layers = 2;
  so.heads = 4;
  so.kv_heads = 2;
  so.vocab = 300;
  so.context = 64;
  so.experts = 4;
  so.ffn_kind = SynthFfnKind::kReluGated;
  so.active_fraction = 0;
  so.seed = 31;
  const std::string path = testing::TempDir() + "/planner_moe.gguf";
  ASSERT_TRUE(WriteSynthModel(so, path).ok());
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  auto tokens = TokenizeCorpusFile(testing::SharedDataDir() + "/corpus/tinystories_valid_sample.txt",
                                   (*model)->tokenizer(), 1500);
  ASSERT_TRUE(tokens.ok());
  ThreadPool pool(2);
  ProfileOptions po;
  po.window = 64;
  po.batch = 64;
  auto profile = ProfileActivations(**model, *tokens, po, pool);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const ActivationStats& stats = profile->stats;

  PlannerOptions o;
  o.context = 64;
  o.scratch_bytes = 0;
  o.vram_budget = 1;
  const DenseCharges dense = ChargeDense(**model, o);
  int64_t routers = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    routers += (*model)->layer(l).router.rows * (*model)->layer(l).router.row_bytes;
  }
  EXPECT_EQ(dense.moe_dense, routers);
  const int64_t neuron = (*model)->layer(0).experts[0].gate.row_bytes * 3;  // f32 gate, up, down
  const int64_t all = c.n_layers * c.n_experts * c.ffn_dim;
  o.vram_budget = dense.total() + all * 4 / 10 * neuron;
  auto plan = PlanPlacement(**model, stats, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_LE(plan->gpu_ffn_bytes, o.vram_budget - dense.total());
  EXPECT_GT(plan->gpu_ffn_bytes, (o.vram_budget - dense.total()) * 9 / 10);
  auto part = Partition::FromPlacement(plan->placement, c);
  ASSERT_TRUE(part.ok()) << part.status();
  double placed = 0, total = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerActivationStats& L = stats.layers[l];
    const LayerPlacement& lp = plan->placement.layers[l];
    ASSERT_EQ(lp.on_gpu.size(), static_cast<size_t>(c.n_experts * c.ffn_dim));
    double min_in = 1e30, max_out = -1;
    for (int64_t id = 0; id < c.n_experts * c.ffn_dim; ++id) {
      const double v = static_cast<double>(L.frequency[id]) * L.expert_share[id / c.ffn_dim];
      total += v;
      if (lp.on_gpu[id]) {
        placed += v;
        min_in = std::min(min_in, v);
      } else {
        max_out = std::max(max_out, v);
      }
    }
    EXPECT_GE(min_in, max_out) << "layer " << l;
    EXPECT_GT(lp.gpu_bucket.size(), 0u);
    EXPECT_LT(lp.gpu_bucket.size(), lp.on_gpu.size());
  }
  EXPECT_NEAR(plan->placement.expected_gpu_share, placed / total, 1e-9);
  // The frequencies alone would order differently: some expert's share differs from 1/2.
  EXPECT_NE(stats.layers[0].expert_share[0], stats.layers[0].expert_share[1]);
  EXPECT_NE(FormatPlan(*plan, c).find("routers and shared experts"), std::string::npos);
}

}  // namespace
}  // namespace thermocline
