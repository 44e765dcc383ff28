#include "shared/ipc/messages.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "shared/util/status_macros.h"

namespace thermocline::ipc {
namespace {

// This Abseil build has its own string_view type; the public API uses std::string_view.
absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status Invalid(const MessageView& m, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(Av(MessageKindName(m.kind())), " message (step ",
                                                 m.header.step_id, "): ", Av(what)));
}

absl::Status ExpectKind(const MessageView& m, MessageKind kind) {
  if (m.kind() != kind) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected a ", Av(MessageKindName(kind)), " message, got ", Av(MessageKindName(m.kind()))));
  }
  return absl::OkStatus();
}

// Reads u32 word `i` of the payload (callers have checked the size).
uint32_t U32At(absl::Span<const std::byte> p, size_t i) {
  uint32_t v;
  std::memcpy(&v, p.data() + 4 * i, 4);
  return v;
}

void PutU32s(std::byte* dst, std::initializer_list<uint32_t> words) {
  for (uint32_t w : words) {
    std::memcpy(dst, &w, 4);
    dst += 4;
  }
}

absl::StatusOr<absl::Span<const float>> FloatsAt(const MessageView& m, size_t offset,
                                                 uint64_t count) {
  const std::byte* p = m.payload.data() + offset;
  if (reinterpret_cast<uintptr_t>(p) % alignof(float) != 0) {
    return Invalid(m, "float array not 4-byte aligned");
  }
  return absl::Span<const float>(reinterpret_cast<const float*>(p), count);
}

absl::Status SendMatrix(RingProducer& ring, MessageKind kind, uint64_t step_id, uint32_t layer,
                        uint32_t rows, uint32_t cols, absl::Span<const float> data,
                        absl::Duration timeout) {
  if (static_cast<uint64_t>(rows) * cols != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat(Av(MessageKindName(kind)), ": ", data.size(),
                                                   " values for ", rows, " x ", cols));
  }
  const uint64_t bytes = MatrixBytes(rows, cols);
  TC_ASSIGN_OR_RETURN(absl::Span<std::byte> out, ring.Reserve(bytes, timeout));
  PutU32s(out.data(), {rows, cols});
  if (!data.empty()) std::memcpy(out.data() + 8, data.data(), data.size() * sizeof(float));
  absl::Status s = ring.Commit(MessageInfo{kind, step_id, layer});
  if (!s.ok()) ring.Abort();
  return s;
}

absl::StatusOr<MatrixView> DecodeMatrix(const MessageView& m, MessageKind kind,
                                        const MatrixLimits& limits) {
  TC_RETURN_IF_ERROR(ExpectKind(m, kind));
  if (m.payload.size() < 8) return Invalid(m, "shorter than its 8-byte prefix");
  MatrixView v;
  v.step_id = m.header.step_id;
  v.layer = m.header.layer;
  v.rows = U32At(m.payload, 0);
  v.cols = U32At(m.payload, 1);
  if (kind == MessageKind::kPartial && v.layer >= limits.n_layers) {
    return Invalid(m, absl::StrCat("layer ", v.layer, " >= ", limits.n_layers));
  }
  if (v.cols != limits.cols) {
    return Invalid(m, absl::StrCat("width ", v.cols, ", expected ", limits.cols));
  }
  // A Logits message may have no rows: it answers a step whose entries want no logits.
  const uint32_t min_rows = kind == MessageKind::kLogits ? 0 : 1;
  if (v.rows < min_rows || v.rows > limits.max_rows) {
    return Invalid(m, absl::StrCat("rows ", v.rows, " outside [", min_rows, ", ", limits.max_rows,
                                   "]"));
  }
  if (m.payload.size() != MatrixBytes(v.rows, v.cols)) {
    return Invalid(m, absl::StrCat(m.payload.size(), " bytes for ", v.rows, " x ", v.cols));
  }
  TC_ASSIGN_OR_RETURN(v.data, FloatsAt(m, 8, uint64_t{v.rows} * v.cols));
  return v;
}

}  // namespace

// --- Control ---------------------------------------------------------------------------------

absl::Status SendHello(RingProducer& ring, const HelloMsg& hello, absl::Duration timeout) {
  std::byte buf[16];
  PutU32s(buf, {static_cast<uint32_t>(hello.role), static_cast<uint32_t>(hello.pid),
                hello.protocol_version, 0});
  return ring.Send(MessageInfo{MessageKind::kHello, 0, 0}, buf, timeout);
}

absl::StatusOr<HelloMsg> DecodeHello(const MessageView& m) {
  TC_RETURN_IF_ERROR(ExpectKind(m, MessageKind::kHello));
  if (m.payload.size() != 16) return Invalid(m, absl::StrCat(m.payload.size(), " bytes, not 16"));
  uint32_t role = U32At(m.payload, 0);
  if (role >= kNumRoles) return Invalid(m, absl::StrCat("unknown role ", role));
  HelloMsg h;
  h.role = static_cast<Role>(role);
  h.pid = static_cast<int32_t>(U32At(m.payload, 1));
  h.protocol_version = U32At(m.payload, 2);
  if (h.protocol_version != kProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("peer ", Av(RoleName(h.role)), " (pid ", h.pid, ") speaks protocol version ",
                     h.protocol_version, ", this build speaks ", kProtocolVersion));
  }
  return h;
}

absl::Status SendShutdown(RingProducer& ring, absl::Duration timeout) {
  return ring.Send(MessageInfo{MessageKind::kShutdown, 0, 0}, {}, timeout);
}

absl::Status DecodeShutdown(const MessageView& m) {
  TC_RETURN_IF_ERROR(ExpectKind(m, MessageKind::kShutdown));
  if (!m.payload.empty()) return Invalid(m, "payload must be empty");
  return absl::OkStatus();
}

absl::Status SendError(RingProducer& ring, uint64_t step_id, const absl::Status& error,
                       absl::Duration timeout) {
  if (error.ok()) return absl::InvalidArgumentError("SendError: status is OK");
  absl::string_view text = error.message();
  text = text.substr(0, kMaxErrorMessageBytes);
  TC_ASSIGN_OR_RETURN(absl::Span<std::byte> out, ring.Reserve(8 + text.size(), timeout));
  PutU32s(out.data(), {static_cast<uint32_t>(error.code()), static_cast<uint32_t>(text.size())});
  if (!text.empty()) std::memcpy(out.data() + 8, text.data(), text.size());
  absl::Status s = ring.Commit(MessageInfo{MessageKind::kError, step_id, 0});
  if (!s.ok()) ring.Abort();
  return s;
}

absl::Status DecodeError(const MessageView& m, absl::Status* sender_error) {
  TC_RETURN_IF_ERROR(ExpectKind(m, MessageKind::kError));
  if (m.payload.size() < 8) return Invalid(m, "shorter than its 8-byte prefix");
  uint32_t code = U32At(m.payload, 0);
  uint32_t length = U32At(m.payload, 1);
  // Codes 1..16 are the canonical non-OK codes.
  if (code == 0 || code > 16) return Invalid(m, absl::StrCat("status code ", code));
  if (length > kMaxErrorMessageBytes || m.payload.size() != 8 + uint64_t{length}) {
    return Invalid(m, absl::StrCat("message length ", length, " in ", m.payload.size(), " bytes"));
  }
  std::string text(reinterpret_cast<const char*>(m.payload.data() + 8), length);
  *sender_error = absl::Status(static_cast<absl::StatusCode>(code), text);
  return absl::OkStatus();
}

// --- Step ------------------------------------------------------------------------------------

uint64_t StepBytes(uint64_t n_entries, uint64_t kv_words) {
  return 8 + n_entries * sizeof(StepEntry) + 4 * kv_words;
}

uint64_t KvWords(absl::Span<const KvSlotTable> tables, absl::Span<const KvBlockCopy> copies) {
  if (tables.empty() && copies.empty()) return 0;
  uint64_t words = 2 + 2 * uint64_t{copies.size()};
  for (const KvSlotTable& t : tables) words += 3 + uint64_t{t.blocks.size()};
  return words;
}

absl::Status SendStep(RingProducer& ring, uint64_t step_id, absl::Span<const StepEntry> entries,
                      absl::Duration timeout, absl::Span<const KvSlotTable> tables,
                      absl::Span<const KvBlockCopy> copies) {
  const uint64_t kv_words = KvWords(tables, copies);
  if (entries.size() > UINT32_MAX || kv_words > UINT32_MAX / 4) {
    return absl::InvalidArgumentError("Step: too many entries or KV blocks");
  }
  TC_ASSIGN_OR_RETURN(absl::Span<std::byte> out,
                      ring.Reserve(StepBytes(entries.size(), kv_words), timeout));
  PutU32s(out.data(), {static_cast<uint32_t>(entries.size()), static_cast<uint32_t>(kv_words)});
  std::byte* p = out.data() + 8;
  if (!entries.empty()) {
    std::memcpy(p, entries.data(), entries.size() * sizeof(StepEntry));
    p += entries.size() * sizeof(StepEntry);
  }
  if (kv_words > 0) {
    PutU32s(p, {static_cast<uint32_t>(tables.size()), static_cast<uint32_t>(copies.size())});
    p += 8;
    for (const KvSlotTable& t : tables) {
      PutU32s(p, {static_cast<uint32_t>(t.slot), static_cast<uint32_t>(t.length),
                  static_cast<uint32_t>(t.blocks.size())});
      p += 12;
      // An empty table (a slot released) has no data() to copy from: memcpy(p, nullptr, 0)
      // is undefined behaviour (UBSan).
      if (!t.blocks.empty()) std::memcpy(p, t.blocks.data(), t.blocks.size() * sizeof(int32_t));
      p += t.blocks.size() * sizeof(int32_t);
    }
    for (const KvBlockCopy& c : copies) {
      PutU32s(p, {static_cast<uint32_t>(c.src), static_cast<uint32_t>(c.dst)});
      p += 8;
    }
  }
  absl::Status s = ring.Commit(MessageInfo{MessageKind::kStep, step_id, 0});
  if (!s.ok()) ring.Abort();
  return s;
}

namespace {

// The KV section of a Step (kv_words words from `words`), copied out and checked against
// `limits`: a block id outside the pool or a slot outside the cache is refused here, so the
// receiver never indexes memory with one.
absl::Status DecodeStepKv(const MessageView& m, absl::Span<const std::byte> kv,
                          const StepLimits& limits, StepMsg* step) {
  const uint64_t words = kv.size() / 4;
  if (words < 2) return Invalid(m, "KV section shorter than its two counts");
  if (limits.n_kv_blocks <= 0) return Invalid(m, "KV tables sent to a receiver without paging");
  const uint32_t n_tables = U32At(kv, 0), n_copies = U32At(kv, 1);
  uint64_t at = 2;
  auto bad_block = [&](int32_t b) { return b < 0 || b >= limits.n_kv_blocks; };
  std::vector<bool> seen(static_cast<size_t>(std::max(0, limits.n_kv_slots)), false);
  for (uint32_t i = 0; i < n_tables; ++i) {
    if (at + 3 > words) return Invalid(m, absl::StrCat("KV table ", i, " cut short"));
    KvSlotTable t;
    t.slot = static_cast<int32_t>(U32At(kv, at));
    t.length = static_cast<int32_t>(U32At(kv, at + 1));
    const uint32_t n_blocks = U32At(kv, at + 2);
    at += 3;
    if (t.slot < 0 || t.slot >= limits.n_kv_slots) {
      return Invalid(m, absl::StrCat("KV table ", i, ": slot ", t.slot, " outside [0, ",
                                     limits.n_kv_slots, ")"));
    }
    if (seen[t.slot]) return Invalid(m, absl::StrCat("KV table ", i, ": slot ", t.slot, " twice"));
    seen[t.slot] = true;
    if (n_blocks > static_cast<uint32_t>(limits.blocks_per_slot) || at + n_blocks > words) {
      return Invalid(m, absl::StrCat("KV table ", i, ": ", n_blocks, " blocks (a slot holds ",
                                     limits.blocks_per_slot, ")"));
    }
    const int64_t covered = std::min<int64_t>(limits.n_positions, int64_t{n_blocks} * kKvBlockSize);
    if (t.length < 0 || t.length > covered) {
      return Invalid(m, absl::StrCat("KV table ", i, ": length ", t.length, " outside the ",
                                     covered, " positions of its blocks"));
    }
    t.blocks.resize(n_blocks);
    if (n_blocks > 0) std::memcpy(t.blocks.data(), kv.data() + 4 * at, 4 * n_blocks);
    at += n_blocks;
    for (uint32_t j = 0; j < n_blocks; ++j) {
      if (bad_block(t.blocks[j])) {
        return Invalid(m, absl::StrCat("KV table ", i, ": block ", t.blocks[j], " at ", j,
                                       " outside the pool [0, ", limits.n_kv_blocks, ")"));
      }
    }
    step->tables.push_back(std::move(t));
  }
  if (at + 2 * uint64_t{n_copies} != words) {
    return Invalid(m, absl::StrCat(words, " KV words for ", n_tables, " tables and ", n_copies,
                                   " copies"));
  }
  for (uint32_t i = 0; i < n_copies; ++i) {
    KvBlockCopy c{static_cast<int32_t>(U32At(kv, at)), static_cast<int32_t>(U32At(kv, at + 1))};
    at += 2;
    if (bad_block(c.src) || bad_block(c.dst) || c.src == c.dst) {
      return Invalid(m, absl::StrCat("KV copy ", i, ": block ", c.src, " to ", c.dst,
                                     " (the pool is [0, ", limits.n_kv_blocks, "))"));
    }
    step->copies.push_back(c);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StepMsg> DecodeStep(const MessageView& m, const StepLimits& limits) {
  TC_RETURN_IF_ERROR(ExpectKind(m, MessageKind::kStep));
  if (m.payload.size() < 8) return Invalid(m, "shorter than its 8-byte prefix");
  uint32_t n = U32At(m.payload, 0);
  const uint32_t kv_words = U32At(m.payload, 1);
  if (n == 0 || n > limits.max_entries) {
    return Invalid(m, absl::StrCat(n, " entries, outside [1, ", limits.max_entries, "]"));
  }
  if (m.payload.size() != StepBytes(n, kv_words)) {
    return Invalid(m, absl::StrCat(m.payload.size(), " bytes for ", n, " entries and ", kv_words,
                                   " KV words"));
  }
  StepMsg step;
  step.step_id = m.header.step_id;
  step.entries.resize(n);
  std::memcpy(step.entries.data(), m.payload.data() + 8, n * sizeof(StepEntry));
  for (uint32_t i = 0; i < n; ++i) {
    const StepEntry& e = step.entries[i];
    if (e.kv_slot < 0 || e.kv_slot >= limits.n_kv_slots) {
      return Invalid(m, absl::StrCat("entry ", i, ": kv_slot ", e.kv_slot, " outside [0, ",
                                     limits.n_kv_slots, ")"));
    }
    if (e.position < 0 || e.position >= limits.n_positions) {
      return Invalid(m, absl::StrCat("entry ", i, ": position ", e.position, " outside [0, ",
                                     limits.n_positions, ")"));
    }
    if (e.token_id < 0 || e.token_id >= limits.vocab) {
      return Invalid(
          m, absl::StrCat("entry ", i, ": token ", e.token_id, " outside [0, ", limits.vocab, ")"));
    }
    if ((e.flags & ~kEntryWantsLogits) != 0) {
      return Invalid(m, absl::StrCat("entry ", i, ": unknown flags 0x", absl::Hex(e.flags)));
    }
  }
  if (kv_words > 0) {
    TC_RETURN_IF_ERROR(DecodeStepKv(
        m, m.payload.subspan(8 + n * sizeof(StepEntry), 4 * uint64_t{kv_words}), limits, &step));
  }
  return step;
}

// --- Activation ------------------------------------------------------------------------------

uint64_t ActivationBytes(uint64_t rows, uint64_t dim, uint64_t n_active, bool all_candidates,
                         uint64_t picks, bool cuts) {
  const uint64_t lists = all_candidates ? 0 : (rows + n_active) * sizeof(uint32_t);
  const uint64_t routing = picks == 0 ? 0 : sizeof(uint32_t) + rows * picks * 8;
  const uint64_t cut_bytes = cuts ? rows * kCutsPerRow * sizeof(float) : 0;
  return 16 + rows * dim * sizeof(float) + lists + routing + cut_bytes;
}

absl::Status SendActivation(RingProducer& ring, uint64_t step_id, uint32_t layer, uint32_t rows,
                            uint32_t dim, absl::Span<const float> h,
                            const ActivationCandidates& candidates, absl::Duration timeout,
                            const ActivationRouting& routing, absl::Span<const float> cuts) {
  if (static_cast<uint64_t>(rows) * dim != h.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Activation: ", h.size(), " values for ", rows, " x ", dim));
  }
  if (candidates.all && (!candidates.row_end.empty() || !candidates.active.empty())) {
    return absl::InvalidArgumentError("Activation: all-candidates with explicit lists");
  }
  if (candidates.active.size() > UINT32_MAX) {
    return absl::InvalidArgumentError("Activation: too many ids");
  }
  if (!candidates.all) {
    if (candidates.row_end.size() != rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("Activation: ", candidates.row_end.size(), " row ends for ", rows, " rows"));
    }
    uint32_t prev = 0;
    for (uint32_t end : candidates.row_end) {
      if (end < prev) return absl::InvalidArgumentError("Activation: row ends decrease");
      prev = end;
    }
    if (prev != candidates.active.size()) {
      return absl::InvalidArgumentError(absl::StrCat("Activation: row ends end at ", prev, ", not ",
                                                     candidates.active.size()));
    }
  }
  const uint64_t n_picks = uint64_t{rows} * routing.picks;
  if (routing.experts.size() != n_picks || routing.weights.size() != n_picks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Activation: ", routing.experts.size(), " experts and ", routing.weights.size(),
        " weights for ", rows, " rows of ", routing.picks, " picks"));
  }
  const bool with_cuts = !cuts.empty();
  if (with_cuts &&
      (cuts.size() != uint64_t{rows} * kCutsPerRow || !candidates.all || routing.picks > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Activation: ", cuts.size(), " cuts for ", rows,
        " rows; cuts go with all candidates, no routing and ", kCutsPerRow, " per row"));
  }
  const uint32_t n_active = static_cast<uint32_t>(candidates.active.size());
  const uint64_t bytes =
      ActivationBytes(rows, dim, n_active, candidates.all, routing.picks, with_cuts);
  TC_ASSIGN_OR_RETURN(absl::Span<std::byte> out, ring.Reserve(bytes, timeout));
  const uint32_t flags = (candidates.all ? kActivationAllCandidates : 0u) |
                         (routing.picks > 0 ? kActivationRouted : 0u) |
                         (with_cuts ? kActivationCuts : 0u);
  PutU32s(out.data(), {rows, dim, n_active, flags});
  std::byte* p = out.data() + 16;
  if (!h.empty()) std::memcpy(p, h.data(), h.size() * sizeof(float));
  p += h.size() * sizeof(float);
  if (!candidates.all) {
    std::memcpy(p, candidates.row_end.data(), rows * sizeof(uint32_t));
    p += rows * sizeof(uint32_t);
    if (n_active > 0) std::memcpy(p, candidates.active.data(), n_active * sizeof(int32_t));
    p += n_active * sizeof(int32_t);
  }
  if (routing.picks > 0) {
    std::memcpy(p, &routing.picks, sizeof(uint32_t));
    p += sizeof(uint32_t);
    std::memcpy(p, routing.experts.data(), n_picks * sizeof(int32_t));
    p += n_picks * sizeof(int32_t);
    std::memcpy(p, routing.weights.data(), n_picks * sizeof(float));
    p += n_picks * sizeof(float);
  }
  if (with_cuts) std::memcpy(p, cuts.data(), cuts.size() * sizeof(float));
  absl::Status s = ring.Commit(MessageInfo{MessageKind::kActivation, step_id, layer});
  if (!s.ok()) ring.Abort();
  return s;
}

absl::StatusOr<ActivationView> DecodeActivation(const MessageView& m,
                                                const ActivationLimits& limits) {
  TC_RETURN_IF_ERROR(ExpectKind(m, MessageKind::kActivation));
  if (m.payload.size() < 16) return Invalid(m, "shorter than its 16-byte prefix");
  ActivationView v;
  v.step_id = m.header.step_id;
  v.layer = m.header.layer;
  v.rows = U32At(m.payload, 0);
  v.dim = U32At(m.payload, 1);
  const uint32_t n_active = U32At(m.payload, 2);
  const uint32_t flags = U32At(m.payload, 3);
  if (v.layer >= limits.n_layers) {
    return Invalid(m, absl::StrCat("layer ", v.layer, " >= ", limits.n_layers));
  }
  if (v.dim != limits.dim)
    return Invalid(m, absl::StrCat("dim ", v.dim, ", expected ", limits.dim));
  if (v.rows == 0 || v.rows > limits.max_rows) {
    return Invalid(m, absl::StrCat("rows ", v.rows, " outside [1, ", limits.max_rows, "]"));
  }
  if ((flags & ~(kActivationAllCandidates | kActivationRouted | kActivationCuts)) != 0) {
    return Invalid(m, absl::StrCat("unknown flags 0x", absl::Hex(flags)));
  }
  v.all_candidates = (flags & kActivationAllCandidates) != 0;
  const bool routed = (flags & kActivationRouted) != 0;
  const bool with_cuts = (flags & kActivationCuts) != 0;
  if (with_cuts && (!v.all_candidates || routed)) {
    return Invalid(m, "TEAL cuts go with all candidates and no routing");
  }
  if (v.all_candidates && n_active != 0) {
    return Invalid(m, absl::StrCat("all-candidates flag with ", n_active, " listed ids"));
  }
  // Each row lists distinct neurons, so no more than rows * n_neurons ids in all.
  if (limits.n_neurons < 0 ||
      uint64_t{n_active} > uint64_t{v.rows} * static_cast<uint64_t>(limits.n_neurons)) {
    return Invalid(m, absl::StrCat(n_active, " active ids for ", v.rows, " rows of ",
                                   limits.n_neurons, " neurons"));
  }
  const uint64_t unrouted = ActivationBytes(v.rows, v.dim, n_active, v.all_candidates);
  if (routed) {
    if (limits.max_picks == 0) return Invalid(m, "routed (MoE) activation, but no layer has experts");
    if (m.payload.size() < unrouted + sizeof(uint32_t)) {
      return Invalid(m, absl::StrCat(m.payload.size(), " bytes: too short for its routing"));
    }
    v.picks = U32At(m.payload, unrouted / 4);
    if (v.picks == 0 || v.picks > limits.max_picks) {
      return Invalid(m, absl::StrCat(v.picks, " experts per row outside [1, ", limits.max_picks,
                                     "]"));
    }
  }
  if (m.payload.size() !=
      ActivationBytes(v.rows, v.dim, n_active, v.all_candidates, v.picks, with_cuts)) {
    return Invalid(
        m, absl::StrCat(m.payload.size(), " bytes for ", v.rows, " x ", v.dim, " and ", n_active,
                        " ids", routed ? absl::StrCat(" and ", v.picks, " picks") : "",
                        with_cuts ? " and cuts" : ""));
  }
  const uint64_t h_count = uint64_t{v.rows} * v.dim;
  TC_ASSIGN_OR_RETURN(v.h, FloatsAt(m, 16, h_count));
  if (with_cuts) {
    // Copied before checking, as the ids are: shared memory may change under the reader.
    const uint64_t n = uint64_t{v.rows} * kCutsPerRow;
    v.cuts.resize(n);
    std::memcpy(v.cuts.data(), m.payload.data() + unrouted, n * sizeof(float));
    for (uint64_t i = 0; i < n; ++i) {
      if (!std::isfinite(v.cuts[i]) || v.cuts[i] < 0) {
        return Invalid(m, absl::StrCat("row ", i / kCutsPerRow, ": cut ", i % kCutsPerRow, " is ",
                                       v.cuts[i], ", not a finite value >= 0"));
      }
    }
  }
  if (routed) {
    const uint64_t n = uint64_t{v.rows} * v.picks;
    const std::byte* r = m.payload.data() + unrouted + sizeof(uint32_t);
    v.experts.resize(n);
    v.expert_weights.resize(n);
    std::memcpy(v.experts.data(), r, n * sizeof(int32_t));
    std::memcpy(v.expert_weights.data(), r + n * sizeof(int32_t), n * sizeof(float));
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t row = i / v.picks;
      const int32_t e = v.experts[i];
      if (e < 0 || static_cast<uint32_t>(e) >= limits.n_experts) {
        return Invalid(m, absl::StrCat("row ", row, ": expert ", e, " outside [0, ",
                                       limits.n_experts, ")"));
      }
      for (uint64_t j = row * v.picks; j < i; ++j) {
        if (v.experts[j] == e) {
          return Invalid(m, absl::StrCat("row ", row, ": expert ", e, " picked twice"));
        }
      }
      if (!std::isfinite(v.expert_weights[i])) {
        return Invalid(m, absl::StrCat("row ", row, ": weight of expert ", e, " is ",
                                       v.expert_weights[i]));
      }
    }
  }
  if (v.all_candidates) return v;
  // Copied before checking: the ids index the receiver's memory.
  const std::byte* lists = m.payload.data() + 16 + h_count * sizeof(float);
  v.row_end.resize(v.rows);
  std::memcpy(v.row_end.data(), lists, v.rows * sizeof(uint32_t));
  v.active.resize(n_active);
  if (n_active > 0) {
    std::memcpy(v.active.data(), lists + v.rows * sizeof(uint32_t), n_active * sizeof(int32_t));
  }
  uint32_t begin = 0;
  for (uint32_t r = 0; r < v.rows; ++r) {
    const uint32_t end = v.row_end[r];
    if (end < begin || end > n_active) {
      return Invalid(m, absl::StrCat("row ", r, ": end ", end, " outside [", begin, ", ", n_active,
                                     "]"));
    }
    for (uint32_t i = begin; i < end; ++i) {
      const int32_t id = v.active[i];
      if (id < 0 || id >= limits.n_neurons) {
        return Invalid(m, absl::StrCat("row ", r, ": active id ", id, " at ", i, " outside [0, ",
                                       limits.n_neurons, ")"));
      }
      if (i > begin && id <= v.active[i - 1]) {
        return Invalid(m, absl::StrCat("row ", r, ": ids not strictly ascending at ", i, " (",
                                       v.active[i - 1], " then ", id, ")"));
      }
    }
    begin = end;
  }
  if (begin != n_active) {
    return Invalid(m, absl::StrCat("row ends stop at ", begin, " of ", n_active, " ids"));
  }
  return v;
}

// --- Partial, Logits -------------------------------------------------------------------------

uint64_t MatrixBytes(uint64_t rows, uint64_t cols) { return 8 + rows * cols * sizeof(float); }

absl::Status SendPartial(RingProducer& ring, uint64_t step_id, uint32_t layer, uint32_t rows,
                         uint32_t dim, absl::Span<const float> y_cold, absl::Duration timeout) {
  return SendMatrix(ring, MessageKind::kPartial, step_id, layer, rows, dim, y_cold, timeout);
}

absl::StatusOr<MatrixView> DecodePartial(const MessageView& m, const MatrixLimits& limits) {
  return DecodeMatrix(m, MessageKind::kPartial, limits);
}

absl::Status SendLogits(RingProducer& ring, uint64_t step_id, uint32_t rows, uint32_t vocab,
                        absl::Span<const float> logits, absl::Duration timeout) {
  return SendMatrix(ring, MessageKind::kLogits, step_id, 0, rows, vocab, logits, timeout);
}

absl::StatusOr<MatrixView> DecodeLogits(const MessageView& m, const MatrixLimits& limits) {
  return DecodeMatrix(m, MessageKind::kLogits, limits);
}

}  // namespace thermocline::ipc
