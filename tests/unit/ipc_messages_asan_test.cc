// Typed protocol payloads: encode through a ring, decode with the receiver's limits, and reject
// every inconsistency (kind, counts vs bytes, dims, ranges) without reading past the payload.
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "shared/ipc/messages.h"
#include "shared/ipc/ring.h"

namespace thermocline::ipc {
namespace {

struct AlignedFree {
  void operator()(void* p) const { ::operator delete(p, std::align_val_t(64)); }
};

class Loop {
 public:
  Loop() : mem_(::operator new(RingRegionBytes(kCap), std::align_val_t(64))) {
    EXPECT_TRUE(InitRing(mem_.get(), RingRegionBytes(kCap), kCap).ok());
    RingOptions o;
    o.epoch = 1;
    producer_ = std::make_unique<RingProducer>(
        *RingProducer::Attach(mem_.get(), RingRegionBytes(kCap), kCap, o));
    consumer_ = std::make_unique<RingConsumer>(
        *RingConsumer::Attach(mem_.get(), RingRegionBytes(kCap), kCap, o));
  }
  RingProducer& out() { return *producer_; }
  // The next message, copied out of the ring into a buffer of exactly its size.
  MessageView Next() {
    auto h = consumer_->Receive(&buf_, absl::ZeroDuration());
    EXPECT_TRUE(h.ok()) << h.status();
    header_ = h.ok() ? *h : MessageHeader{};
    return ViewOf(header_, buf_);
  }

 private:
  static constexpr uint64_t kCap = 1 << 16;
  std::unique_ptr<void, AlignedFree> mem_;
  std::unique_ptr<RingProducer> producer_;
  std::unique_ptr<RingConsumer> consumer_;
  std::vector<std::byte> buf_;
  MessageHeader header_;
};

// A MessageView over an exact-size heap copy of `bytes`, as if it came from a ring.
struct Forged {
  MessageHeader header;
  std::vector<std::byte> bytes;
  MessageView view() const { return ViewOf(header, bytes); }
};

Forged Forge(MessageKind kind, std::vector<uint32_t> words, uint64_t step = 1, uint32_t layer = 0) {
  Forged f;
  f.header.kind = static_cast<uint16_t>(kind);
  f.header.step_id = step;
  f.header.layer = layer;
  f.bytes.resize(words.size() * 4);
  if (!words.empty()) std::memcpy(f.bytes.data(), words.data(), f.bytes.size());
  f.header.bytes = static_cast<uint32_t>(f.bytes.size());
  return f;
}

uint32_t F32Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

TEST(IpcMessages, HelloShutdownError) {
  Loop loop;
  ASSERT_TRUE(SendHello(loop.out(), HelloMsg{Role::kCpuWorker, 1234, kProtocolVersion}).ok());
  auto hello = DecodeHello(loop.Next());
  ASSERT_TRUE(hello.ok()) << hello.status();
  EXPECT_EQ(hello->role, Role::kCpuWorker);
  EXPECT_EQ(hello->pid, 1234);

  ASSERT_TRUE(SendHello(loop.out(), HelloMsg{Role::kGpuWorker, 1, kProtocolVersion + 1}).ok());
  EXPECT_EQ(DecodeHello(loop.Next()).status().code(), absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(SendShutdown(loop.out()).ok());
  EXPECT_TRUE(DecodeShutdown(loop.Next()).ok());

  ASSERT_TRUE(SendError(loop.out(), 77, absl::NotFoundError("no such slot")).ok());
  MessageView m = loop.Next();
  EXPECT_EQ(m.header.step_id, 77u);
  absl::Status err;
  ASSERT_TRUE(DecodeError(m, &err).ok());
  EXPECT_EQ(err, absl::NotFoundError("no such slot"));
  EXPECT_EQ(SendError(loop.out(), 0, absl::OkStatus()).code(), absl::StatusCode::kInvalidArgument);

  EXPECT_FALSE(DecodeHello(Forge(MessageKind::kHello, {7, 1, kProtocolVersion, 0}).view()).ok());
  EXPECT_FALSE(DecodeHello(Forge(MessageKind::kHello, {1, 1, kProtocolVersion}).view()).ok());
  EXPECT_FALSE(DecodeShutdown(Forge(MessageKind::kShutdown, {0}).view()).ok());
  EXPECT_FALSE(DecodeError(Forge(MessageKind::kError, {0, 0}).view(), &err).ok());   // OK code
  EXPECT_FALSE(DecodeError(Forge(MessageKind::kError, {17, 0}).view(), &err).ok());  // unknown code
  EXPECT_FALSE(DecodeError(Forge(MessageKind::kError, {5, 8, 0}).view(), &err).ok());  // short text
  EXPECT_FALSE(DecodeError(Forge(MessageKind::kError, {5}).view(), &err).ok());
}

TEST(IpcMessages, Step) {
  Loop loop;
  std::vector<StepEntry> entries = {{0, 0, 1, kEntryWantsLogits}, {3, 17, 255, 0}};
  ASSERT_TRUE(SendStep(loop.out(), 9, entries).ok());
  StepLimits limits{4, 4, 32, 256};
  MessageView m = loop.Next();
  EXPECT_EQ(m.header.bytes, StepBytes(2));
  auto step = DecodeStep(m, limits);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->step_id, 9u);
  ASSERT_EQ(step->entries.size(), 2u);
  EXPECT_EQ(step->entries[1].kv_slot, 3);
  EXPECT_EQ(step->entries[1].position, 17);
  EXPECT_EQ(step->entries[1].token_id, 255);
  EXPECT_EQ(step->entries[0].flags, kEntryWantsLogits);

  auto bad = [&](std::vector<uint32_t> words, const char* why) {
    EXPECT_EQ(DecodeStep(Forge(MessageKind::kStep, words).view(), limits).status().code(),
              absl::StatusCode::kInvalidArgument)
        << why;
  };
  bad({1, 0, 0, 0, 1}, "entry bytes missing");
  bad({2, 0, 0, 0, 1, 0}, "count larger than the bytes");
  bad({0, 0}, "no entries");
  bad({5, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0}, "more than max_entries");
  bad({0xffffffffu, 0, 0, 0, 1, 0}, "count overflow");
  bad({1, 0, 4, 0, 1, 0}, "kv_slot out of range");
  bad({1, 0, 0xffffffffu, 0, 1, 0}, "negative kv_slot");
  bad({1, 0, 0, 32, 1, 0}, "position out of range");
  bad({1, 0, 0, 0, 256, 0}, "token out of range");
  bad({1, 0, 0, 0, 1, 2}, "unknown flag");
  bad({1}, "shorter than the prefix");
  EXPECT_EQ(
      DecodeStep(Forge(MessageKind::kPartial, {1, 0, 0, 0, 1, 0}).view(), limits).status().code(),
      absl::StatusCode::kInvalidArgument);  // wrong kind

  // KV tables and copies (the prefix cache): round trip, then every id checked on receipt.
  StepLimits paged{4, 4, 32, 256, 10, 2};
  const std::vector<KvSlotTable> tables = {{3, 16, {7, 2}}, {0, 0, {}}};
  const std::vector<KvBlockCopy> copies = {{7, 9}};
  ASSERT_TRUE(SendStep(loop.out(), 10, entries, absl::InfiniteDuration(), tables, copies).ok());
  MessageView pm = loop.Next();
  EXPECT_EQ(pm.header.bytes, StepBytes(2, KvWords(tables, copies)));
  auto ps = DecodeStep(pm, paged);
  ASSERT_TRUE(ps.ok()) << ps.status();
  ASSERT_EQ(ps->tables.size(), 2u);
  EXPECT_EQ(ps->tables[0].slot, 3);
  EXPECT_EQ(ps->tables[0].length, 16);
  EXPECT_EQ(ps->tables[0].blocks, (std::vector<int32_t>{7, 2}));
  EXPECT_TRUE(ps->tables[1].blocks.empty());
  ASSERT_EQ(ps->copies.size(), 1u);
  EXPECT_EQ(ps->copies[0].dst, 9);
  EXPECT_FALSE(DecodeStep(pm, limits).ok());  // a receiver without paging refuses tables
  auto bad_kv = [&](std::vector<uint32_t> kv, const char* why) {
    std::vector<uint32_t> words = {1, static_cast<uint32_t>(kv.size()), 0, 0, 1, 0};
    words.insert(words.end(), kv.begin(), kv.end());
    absl::Status st = DecodeStep(Forge(MessageKind::kStep, words).view(), paged).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << why;
    return std::string(st.message());
  };
  EXPECT_NE(bad_kv({1, 0, 0, 0, 1, 10}, "block id past the pool").find("block 10"),
            std::string::npos);
  bad_kv({1, 0, 0, 0, 1, 0xffffffffu}, "negative block id");
  bad_kv({1, 0, 4, 0, 0}, "slot out of range");
  bad_kv({2, 0, 0, 0, 0, 0, 0, 0}, "slot twice");
  bad_kv({1, 0, 0, 0, 3, 1, 2, 3}, "more blocks than a slot holds");
  bad_kv({1, 0, 0, 17, 1, 1}, "length past its blocks");
  bad_kv({1, 0, 0, 0, 2, 1}, "table cut short");
  bad_kv({0, 1, 3, 3}, "copy onto itself");
  bad_kv({0, 1, 3, 10}, "copy past the pool");
  bad_kv({0, 2, 3, 4}, "copy count past the words");
  bad_kv({0}, "section shorter than its counts");
}

TEST(IpcMessages, Activation) {
  Loop loop;
  const uint32_t rows = 3, dim = 8;
  std::vector<float> h(rows * dim);
  for (size_t i = 0; i < h.size(); ++i) h[i] = 0.5f * static_cast<float>(i) - 3.0f;
  // Row 0: {0, 5, 99}; row 1: none; row 2: {7}.
  std::vector<uint32_t> row_end = {3, 3, 4};
  std::vector<int32_t> active = {0, 5, 99, 7};
  ASSERT_TRUE(SendActivation(loop.out(), 4, 3, rows, dim, h,
                             ActivationCandidates::PerRow(row_end, active))
                  .ok());
  ActivationLimits limits{dim, 4, 6, 100};
  MessageView m = loop.Next();
  EXPECT_EQ(m.header.bytes, ActivationBytes(rows, dim, 4, false));
  auto a = DecodeActivation(m, limits);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->step_id, 4u);
  EXPECT_EQ(a->layer, 3u);
  EXPECT_EQ(a->rows, rows);
  EXPECT_FALSE(a->all_candidates);
  EXPECT_EQ(std::vector<float>(a->h.begin(), a->h.end()), h);
  EXPECT_EQ(a->row_end, row_end);
  EXPECT_EQ(a->active, active);
  EXPECT_EQ(std::vector<int32_t>(a->row(0).begin(), a->row(0).end()),
            (std::vector<int32_t>{0, 5, 99}));
  EXPECT_TRUE(a->row(1).empty());
  EXPECT_EQ(std::vector<int32_t>(a->row(2).begin(), a->row(2).end()), std::vector<int32_t>{7});

  // All candidates: the message is just h.
  auto one_row = absl::MakeSpan(h).subspan(0, dim);
  ASSERT_TRUE(SendActivation(loop.out(), 5, 0, 1, dim, one_row, ActivationCandidates::All()).ok());
  m = loop.Next();
  EXPECT_EQ(m.header.bytes, 16 + dim * 4);
  auto all = DecodeActivation(m, limits);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->all_candidates);
  EXPECT_TRUE(all->active.empty());
  EXPECT_TRUE(all->row_end.empty());

  // Empty lists for every row.
  const uint32_t zero_end[] = {0};
  ASSERT_TRUE(
      SendActivation(loop.out(), 6, 0, 1, dim, one_row, ActivationCandidates::PerRow(zero_end, {}))
          .ok());
  auto empty = DecodeActivation(loop.Next(), limits);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->active.empty());
  EXPECT_TRUE(empty->row(0).empty());

  // The sender refuses inconsistent shapes.
  auto send_bad = [&](uint32_t n_rows, absl::Span<const float> values,
                      const ActivationCandidates& c, const char* why) {
    EXPECT_EQ(SendActivation(loop.out(), 1, 0, n_rows, dim, values, c).code(),
              absl::StatusCode::kInvalidArgument)
        << why;
  };
  send_bad(2, h, ActivationCandidates::All(), "24 values are not 2 x 8");
  const uint32_t two_ends[] = {1, 1};
  send_bad(3, h, ActivationCandidates::PerRow(two_ends, active), "2 row ends for 3 rows");
  const uint32_t falling[] = {3, 2, 4};
  send_bad(3, h, ActivationCandidates::PerRow(falling, active), "row ends decrease");
  const uint32_t short_end[] = {1, 2, 3};
  send_bad(3, h, ActivationCandidates::PerRow(short_end, active), "last end != n_active");
  send_bad(3, h, ActivationCandidates{true, row_end, active}, "all with lists");

  const uint32_t one = F32Bits(1.0f);
  auto bad = [&](std::vector<uint32_t> words, uint32_t layer, const char* why) {
    Forged f = Forge(MessageKind::kActivation, words, 1, layer);
    auto r = DecodeActivation(f.view(), limits);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << why;
    EXPECT_NE(r.status().message().find("Activation message"), std::string::npos) << why;
  };
  // One row of 8 values, row_end {2}, ids {7, 9}.
  std::vector<uint32_t> good = {1, dim, 2, 0, one, one, one, one, one, one, one, one, 2, 7, 9};
  EXPECT_TRUE(DecodeActivation(Forge(MessageKind::kActivation, good).view(), limits).ok());
  // Two rows, row_end {1, 2}, ids {7} and {3}: ascending within each row, not across rows.
  std::vector<uint32_t> two = {2, dim, 2, 0};
  for (int i = 0; i < 16; ++i) two.push_back(one);
  for (uint32_t w : {1u, 2u, 7u, 3u}) two.push_back(w);
  EXPECT_TRUE(DecodeActivation(Forge(MessageKind::kActivation, two).view(), limits).ok());
  std::vector<uint32_t> all_words = {1, dim, 0, kActivationAllCandidates, one, one, one, one,
                                     one, one, one, one};
  EXPECT_TRUE(DecodeActivation(Forge(MessageKind::kActivation, all_words).view(), limits).ok());

  bad(good, 6, "layer out of range");
  auto edit = [](std::vector<uint32_t> w, size_t i, uint32_t v) {
    w[i] = v;
    return w;
  };
  bad(edit(good, 1, dim + 1), 0, "dim other than expected");
  bad(edit(good, 0, 0), 0, "zero rows");
  bad(edit(good, 0, 5), 0, "rows above max");
  bad(edit(good, 0, 2), 0, "rows larger than the bytes");
  bad(edit(good, 2, 3), 0, "ids larger than the bytes");
  bad(edit(good, 2, 1), 0, "ids smaller than the bytes");
  bad(edit(good, 2, 101), 0, "more ids than rows x neurons");
  bad(edit(good, 3, 8), 0, "unknown flag");
  bad(edit(good, 3, kActivationRouted), 0, "routing where no layer has experts");
  bad(edit(good, 3, kActivationAllCandidates), 0, "all-candidates with listed ids");
  bad(edit(all_words, 3, 0), 0, "lists missing without the flag");
  bad(edit(good, 12, 1), 0, "row_end short of n_active");
  bad(edit(good, 12, 3), 0, "row_end past n_active");
  bad(edit(good, 13, 100), 0, "id out of range");
  bad(edit(good, 13, 0xffffffffu), 0, "negative id");
  bad(edit(good, 13, 9), 0, "repeated id");
  bad(edit(good, 14, 3), 0, "descending ids");
  bad(edit(two, 20, 3), 0, "first row ends beyond the ids");
  bad(edit(edit(two, 20, 2), 21, 1), 0, "row ends decrease");
  bad({1, dim, 0}, 0, "shorter than the prefix");
}

// words with words[i] = v.
std::vector<uint32_t> Edited(std::vector<uint32_t> words, size_t i, uint32_t v) {
  words[i] = v;
  return words;
}

// A forged Activation of `words` is refused, with `expect` in the message.
void ExpectActivationRefused(const std::vector<uint32_t>& words, const ActivationLimits& limits,
                             const char* expect) {
  auto r = DecodeActivation(Forge(MessageKind::kActivation, words).view(), limits);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << expect;
  EXPECT_NE(r.status().message().find(expect), std::string::npos) << r.status();
}

// MoE layers: the router's picks and weights travel after the candidates.
TEST(IpcMessages, ActivationWithRouting) {
  Loop loop;
  const uint32_t rows = 2, dim = 4;
  std::vector<float> h = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int32_t> experts = {3, 0, 1, 2};
  const std::vector<float> weights = {0.75f, 0.25f, 0.5f, 0.125f};
  ASSERT_TRUE(SendActivation(loop.out(), 7, 1, rows, dim, h, ActivationCandidates::All(),
                             absl::InfiniteDuration(), ActivationRouting{2, experts, weights})
                  .ok());
  const ActivationLimits limits{dim, 4, 2, 64, 4, 2};
  MessageView m = loop.Next();
  EXPECT_EQ(m.header.bytes, ActivationBytes(rows, dim, 0, true, 2));
  EXPECT_EQ(m.header.bytes, 16 + 8 * 4 + 4 + 4 * 8);
  auto a = DecodeActivation(m, limits);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->all_candidates);
  EXPECT_EQ(a->picks, 2u);
  EXPECT_EQ(a->experts, experts);
  EXPECT_EQ(a->expert_weights, weights);
  EXPECT_EQ(std::vector<float>(a->h.begin(), a->h.end()), h);
  // With per-row lists too: the routing follows them.
  const uint32_t row_end[] = {1, 2};
  const int32_t ids[] = {5, 9};
  ASSERT_TRUE(SendActivation(loop.out(), 8, 0, rows, dim, h, ActivationCandidates::PerRow(row_end, ids),
                             absl::InfiniteDuration(), ActivationRouting{2, experts, weights})
                  .ok());
  auto listed = DecodeActivation(loop.Next(), limits);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->active, (std::vector<int32_t>{5, 9}));
  EXPECT_EQ(listed->experts, experts);
  // The sender refuses routing of the wrong size.
  EXPECT_EQ(SendActivation(loop.out(), 9, 0, rows, dim, h, ActivationCandidates::All(),
                           absl::InfiniteDuration(),
                           ActivationRouting{2, absl::MakeConstSpan(experts).first(3), weights})
                .code(),
            absl::StatusCode::kInvalidArgument);

  // One row of 4 values, all candidates, 2 picks: experts {1, 3}, weights {0.5, 0.5}.
  const uint32_t half = F32Bits(0.5f), one = F32Bits(1.0f);
  const std::vector<uint32_t> good = {1, dim, 0, kActivationAllCandidates | kActivationRouted,
                                      one, one, one, one, 2, 1, 3, half, half};
  EXPECT_TRUE(DecodeActivation(Forge(MessageKind::kActivation, good).view(), limits).ok());
  auto edit = Edited;
  auto bad = [&](std::vector<uint32_t> words, const char* expect) {
    ExpectActivationRefused(words, limits, expect);
  };
  bad(edit(good, 8, 0), "0 experts per row outside [1, 2]");
  bad(edit(good, 8, 3), "3 experts per row outside [1, 2]");
  bad(edit(good, 10, 4), "row 0: expert 4 outside [0, 4)");
  bad(edit(good, 9, 0xffffffffu), "row 0: expert -1 outside [0, 4)");
  bad(edit(good, 10, 1), "row 0: expert 1 picked twice");
  bad(edit(good, 12, F32Bits(std::numeric_limits<float>::quiet_NaN())), "weight of expert 3 is nan");
  bad(std::vector<uint32_t>(good.begin(), good.end() - 1), "bytes for 1 x 4 and 0 ids and 2 picks");
  bad(std::vector<uint32_t>(good.begin(), good.begin() + 8), "too short for its routing");
}

// TEAL's FFN cuts travel after h, three per row, with all candidates and no routing.
TEST(IpcMessages, ActivationWithCuts) {
  Loop loop;
  const uint32_t rows = 2, dim = 4;
  std::vector<float> h = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<float> cuts = {0.25f, 0.5f, 0.125f, 0, 0, 0};
  ASSERT_TRUE(SendActivation(loop.out(), 7, 1, rows, dim, h, ActivationCandidates::All(),
                             absl::InfiniteDuration(), {}, cuts)
                  .ok());
  const ActivationLimits limits{dim, 4, 2, 64, 0, 0};
  MessageView m = loop.Next();
  EXPECT_EQ(m.header.bytes, ActivationBytes(rows, dim, 0, true, 0, true));
  EXPECT_EQ(m.header.bytes, 16 + 8 * 4 + 6 * 4);
  auto a = DecodeActivation(m, limits);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->all_candidates);
  EXPECT_EQ(a->cuts, cuts);
  EXPECT_EQ(std::vector<float>(a->h.begin(), a->h.end()), h);
  // Without cuts the view has none.
  ASSERT_TRUE(SendActivation(loop.out(), 8, 1, rows, dim, h, ActivationCandidates::All()).ok());
  auto plain = DecodeActivation(loop.Next(), limits);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->cuts.empty());
  // The sender refuses cuts of the wrong count, with per-row lists, or with routing.
  EXPECT_EQ(SendActivation(loop.out(), 9, 0, rows, dim, h, ActivationCandidates::All(),
                           absl::InfiniteDuration(), {}, absl::MakeConstSpan(cuts).first(5))
                .code(),
            absl::StatusCode::kInvalidArgument);
  const uint32_t row_end[] = {1, 2};
  const int32_t ids[] = {5, 9};
  EXPECT_EQ(
      SendActivation(loop.out(), 9, 0, rows, dim, h, ActivationCandidates::PerRow(row_end, ids),
                     absl::InfiniteDuration(), {}, cuts)
          .code(),
      absl::StatusCode::kInvalidArgument);

  // One row of 4 values, all candidates, cuts {0.5, 0.5, 1}.
  const uint32_t half = F32Bits(0.5f), one = F32Bits(1.0f);
  const std::vector<uint32_t> good = {
      1, dim, 0, kActivationAllCandidates | kActivationCuts, one, one, one, one, half, half, one};
  EXPECT_TRUE(DecodeActivation(Forge(MessageKind::kActivation, good).view(), limits).ok());
  auto edit = Edited;
  auto bad = [&](std::vector<uint32_t> words, const char* expect) {
    ExpectActivationRefused(words, limits, expect);
  };
  bad(edit(good, 9, F32Bits(-0.5f)), "row 0: cut 1 is -0.5, not a finite value >= 0");
  bad(edit(good, 10, F32Bits(std::numeric_limits<float>::infinity())), "row 0: cut 2 is inf");
  bad(edit(good, 8, F32Bits(std::numeric_limits<float>::quiet_NaN())), "row 0: cut 0 is nan");
  bad(std::vector<uint32_t>(good.begin(), good.end() - 1), "bytes for 1 x 4 and 0 ids and cuts");
  bad(edit(good, 3, kActivationCuts), "TEAL cuts go with all candidates and no routing");
  bad(edit(good, 3, kActivationAllCandidates | kActivationCuts | kActivationRouted),
      "TEAL cuts go with all candidates and no routing");
}

TEST(IpcMessages, PartialAndLogits) {
  Loop loop;
  std::vector<float> y = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(SendPartial(loop.out(), 8, 2, 2, 3, y).ok());
  auto p = DecodePartial(loop.Next(), MatrixLimits{3, 2, 4});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->layer, 2u);
  EXPECT_EQ(p->rows, 2u);
  EXPECT_EQ(std::vector<float>(p->data.begin(), p->data.end()), y);

  ASSERT_TRUE(SendLogits(loop.out(), 8, 1, 6, y).ok());
  auto l = DecodeLogits(loop.Next(), MatrixLimits{6, 4, 0});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->step_id, 8u);
  EXPECT_EQ(l->cols, 6u);

  ASSERT_TRUE(SendPartial(loop.out(), 8, 2, 2, 3, y).ok());
  MessageView m = loop.Next();
  EXPECT_FALSE(DecodePartial(m, MatrixLimits{4, 2, 4}).ok());  // width
  EXPECT_FALSE(DecodePartial(m, MatrixLimits{3, 1, 4}).ok());  // rows
  EXPECT_FALSE(DecodePartial(m, MatrixLimits{3, 2, 2}).ok());  // layer
  EXPECT_FALSE(DecodeLogits(m, MatrixLimits{3, 2, 4}).ok());   // kind
  EXPECT_EQ(SendLogits(loop.out(), 1, 2, 6, y).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(DecodeLogits(Forge(MessageKind::kLogits, {1, 2, 0}).view(), {2, 4, 0}).ok());
  // A step whose entries want no logits is answered with zero rows; a Partial never has none.
  ASSERT_TRUE(SendLogits(loop.out(), 9, 0, 6, {}).ok());
  auto none = DecodeLogits(loop.Next(), MatrixLimits{6, 4, 0});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->rows, 0u);
  EXPECT_TRUE(none->data.empty());
  EXPECT_FALSE(DecodePartial(Forge(MessageKind::kPartial, {0, 3}).view(), {3, 2, 4}).ok());
  EXPECT_FALSE(DecodeLogits(Forge(MessageKind::kLogits, {1, 2, 0, 0, 0}).view(), {2, 4, 0}).ok());
  EXPECT_FALSE(
      DecodeLogits(Forge(MessageKind::kLogits, {0x40000000u, 2, 0, 0}).view(), {2, ~0u, 0}).ok());
}

// Random bytes of random length under every kind: decoders return errors or values that stay
// inside the payload, and ASan watches the exact-size buffers.
TEST(IpcMessages, RandomPayloadsNeverEscape) {
  std::mt19937_64 rng(99);
  const MessageKind kinds[] = {MessageKind::kHello, MessageKind::kShutdown,   MessageKind::kError,
                               MessageKind::kStep,  MessageKind::kActivation, MessageKind::kPartial,
                               MessageKind::kLogits};
  for (int trial = 0; trial < 20000; ++trial) {
    Forged f;
    f.header.kind = static_cast<uint16_t>(kinds[rng() % 7]);
    f.header.layer = rng() % 4;
    f.bytes.resize(rng() % 96);
    for (auto& b : f.bytes) b = std::byte(rng() % 4 == 0 ? rng() : rng() % 3);
    // Make the leading counts small sometimes, so that decoders get past the first checks.
    if (f.bytes.size() >= 8 && rng() % 2) {
      uint32_t a = rng() % 4, b = 4;
      std::memcpy(f.bytes.data(), &a, 4);
      std::memcpy(f.bytes.data() + 4, &b, 4);
    }
    f.header.bytes = static_cast<uint32_t>(f.bytes.size());
    MessageView v = f.view();
    (void)DecodeHello(v);
    (void)DecodeShutdown(v);
    absl::Status sender;
    (void)DecodeError(v, &sender);
    (void)DecodeStep(v, StepLimits{8, 4, 64, 100});
    auto a = DecodeActivation(v, ActivationLimits{4, 4, 4, 16, 4, 2});
    if (a.ok()) {
      for (int32_t id : a->active) ASSERT_TRUE(id >= 0 && id < 16);
      ASSERT_EQ(a->experts.size(), size_t{a->rows} * a->picks);
      for (int32_t e : a->experts) ASSERT_TRUE(e >= 0 && e < 4);
      if (!a->all_candidates) {
        for (uint32_t r = 0; r < a->rows; ++r) ASSERT_LE(a->row(r).size(), a->active.size());
      }
      volatile float s = 0;
      for (float x : a->h) s = s + x;
    }
    auto p = DecodePartial(v, MatrixLimits{4, 4, 4});
    if (p.ok()) {
      volatile float s = 0;
      for (float x : p->data) s = s + x;
    }
    (void)DecodeLogits(v, MatrixLimits{4, 4, 0});
  }
}

}  // namespace
}  // namespace thermocline::ipc
