// Typed payloads of the decode-step protocol (DESIGN.md "One decode step") and the control
// messages, encoded straight into a ring reservation and decoded with full validation.
//
// Layouts (little-endian; every payload starts 8-byte aligned in the ring, every array 4-byte
// aligned after its prefix):
//   Hello       u32 role, i32 pid, u32 protocol_version, u32 reserved
//   Shutdown    (empty)
//   Error       i32 code (absl::StatusCode, not OK), u32 length, char message[length]
//   Step        u32 n_entries, u32 kv_words, n_entries x {i32 kv_slot, i32 position,
//               i32 token_id, u32 flags}, then kv_words u32 words of KV paging (0: none, the
//               worker keeps its tables): u32 n_tables, u32 n_copies, n_tables x {i32 slot,
//               i32 length, u32 n_blocks, i32 block[n_blocks]}, n_copies x {i32 src, i32 dst}
//               (shared/runtime/kv_cache.h: copies run first, then the tables are set, then
//               the entries)
//   Activation  u32 rows, u32 dim, u32 n_active, u32 flags, f32 h[rows*dim],
//               u32 row_end[rows], i32 active[n_active]   (header.layer = layer)
//               Row r's candidate neurons are active[row_end[r-1] .. row_end[r]) (row_end[-1]
//               = 0): row_end non-decreasing, row_end[rows-1] == n_active, each row's ids
//               strictly ascending and in [0, n_neurons). With flags & kActivationAllCandidates
//               every row's candidates are all of the layer's cold neurons, and row_end and
//               active are absent (n_active = 0): dense/exact/threshold layers send just h.
//               Then, with kActivationRouted, u32 picks, i32 experts[rows*picks],
//               f32 weights[rows*picks]; then, with kActivationCuts, f32 cuts[rows*3]: row r's
//               TEAL input cuts of gate, up and down (all three 0: the row's FFN without TEAL).
//   Partial     u32 rows, u32 dim, f32 y_cold[rows*dim]  (header.layer = layer)
//   Logits      u32 rows, u32 cols, f32 logits[rows*cols]   (rows may be 0: a step whose
//               entries want no logits is still answered, so the sender knows it finished)
// step_id and layer travel in the MessageHeader. A decoder checks the kind, that the counts
// account for exactly the payload bytes, and the dimensions against what the receiver
// expects; counts are read from shared memory once. Float arrays are returned in place (valid
// until the message is released); index arrays are copied, since the receiver indexes memory
// with them and the sender could still change shared memory after the check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "shared/ipc/ring.h"
#include "shared/ipc/transport.h"
#include "shared/runtime/kv_cache.h"

namespace thermocline::ipc {

// 2: Activation carries one candidate list per row (row_end) and flags.
// 3: Activation carries the router's picks of MoE layers (kActivationRouted).
// 4: Step carries KV block tables and block copies (the prefix cache).
// 5: Activation carries per-row TEAL cuts of the FFN's inputs (kActivationCuts).
inline constexpr uint32_t kProtocolVersion = 5;

// A view of a message copied out with RingConsumer::Receive, for the decoders below.
inline MessageView ViewOf(const MessageHeader& header, const std::vector<std::byte>& payload) {
  return MessageView{header, absl::Span<const std::byte>(payload)};
}

// --- Control ---------------------------------------------------------------------------------

struct HelloMsg {
  Role role = Role::kGateway;
  int32_t pid = 0;
  uint32_t protocol_version = kProtocolVersion;
};
absl::Status SendHello(RingProducer& ring, const HelloMsg& hello,
                       absl::Duration timeout = absl::InfiniteDuration());
// Also rejects a protocol_version other than kProtocolVersion.
absl::StatusOr<HelloMsg> DecodeHello(const MessageView& m);

absl::Status SendShutdown(RingProducer& ring, absl::Duration timeout = absl::InfiniteDuration());
absl::Status DecodeShutdown(const MessageView& m);

inline constexpr uint32_t kMaxErrorMessageBytes = 4096;
// Sends a non-OK status (message truncated to kMaxErrorMessageBytes).
absl::Status SendError(RingProducer& ring, uint64_t step_id, const absl::Status& error,
                       absl::Duration timeout = absl::InfiniteDuration());
// Rebuilds the sender's status into *sender_error. The return value is about the message
// itself (InvalidArgument when it is malformed), so the two cannot be confused.
absl::Status DecodeError(const MessageView& m, absl::Status* sender_error);

// --- Decode step -----------------------------------------------------------------------------

inline constexpr uint32_t kEntryWantsLogits = 1;  // return a logits row for this entry

struct StepEntry {
  int32_t kv_slot = 0;
  int32_t position = 0;
  int32_t token_id = 0;
  uint32_t flags = kEntryWantsLogits;
};
static_assert(sizeof(StepEntry) == 16);

struct StepMsg {
  uint64_t step_id = 0;
  std::vector<StepEntry> entries;
  std::vector<KvSlotTable> tables;  // validated copies (ids against StepLimits)
  std::vector<KvBlockCopy> copies;
};

struct StepLimits {
  uint32_t max_entries = 0;  // receiver's batch capacity
  int32_t n_kv_slots = 0;    // kv_slot in [0, n_kv_slots)
  int32_t n_positions = 0;   // position in [0, n_positions) (context length)
  int32_t vocab = 0;         // token_id in [0, vocab)
  int32_t n_kv_blocks = 0;   // block ids in [0, n_kv_blocks)
  int32_t blocks_per_slot = 0;  // a table holds at most this many
};

// Bytes of a Step: `kv_words` as KvWords gives for the tables and copies sent with it.
uint64_t StepBytes(uint64_t n_entries, uint64_t kv_words = 0);
uint64_t KvWords(absl::Span<const KvSlotTable> tables, absl::Span<const KvBlockCopy> copies);
// The tables and copies are what the receiver applies before the entries (none: it keeps its
// tables). Their ids are checked by the receiver.
absl::Status SendStep(RingProducer& ring, uint64_t step_id, absl::Span<const StepEntry> entries,
                      absl::Duration timeout = absl::InfiniteDuration(),
                      absl::Span<const KvSlotTable> tables = {},
                      absl::Span<const KvBlockCopy> copies = {});
absl::StatusOr<StepMsg> DecodeStep(const MessageView& m, const StepLimits& limits);

struct ActivationLimits {
  uint32_t dim = 0;       // exact width of h
  uint32_t max_rows = 0;  // rows in [1, max_rows]
  uint32_t n_layers = 0;  // layer in [0, n_layers)
  int32_t n_neurons = 0;  // every active id in [0, n_neurons)
  uint32_t n_experts = 0;  // routed: every expert id in [0, n_experts)
  uint32_t max_picks = 0;  // routed: picks per row in [1, max_picks] (0: no routing accepted)
};

// Activation flags.
inline constexpr uint32_t kActivationAllCandidates = 1;  // every cold neuron, for every row
inline constexpr uint32_t kActivationRouted = 2;         // MoE: each row's experts and weights
inline constexpr uint32_t kActivationCuts = 4;  // TEAL: each row's gate, up and down input cuts
inline constexpr uint32_t kCutsPerRow = 3;

// The candidate lists of an Activation, as the sender gives them: either all cold neurons for
// every row, or row r's ids active[row_end[r-1] .. row_end[r]).
struct ActivationCandidates {
  bool all = false;
  absl::Span<const uint32_t> row_end;  // [rows] when !all
  absl::Span<const int32_t> active;

  static ActivationCandidates All() { return {true, {}, {}}; }
  static ActivationCandidates PerRow(absl::Span<const uint32_t> row_end,
                                     absl::Span<const int32_t> active) {
    return {false, row_end, active};
  }
};

// The router's choice for every row of an MoE layer: row r uses experts[r * picks + j] with
// weight weights[r * picks + j], j < picks. picks = 0: not an MoE layer.
struct ActivationRouting {
  uint32_t picks = 0;
  absl::Span<const int32_t> experts;
  absl::Span<const float> weights;
};

struct ActivationView {
  uint64_t step_id = 0;
  uint32_t layer = 0;
  uint32_t rows = 0;
  uint32_t dim = 0;
  bool all_candidates = false;  // kActivationAllCandidates: row_end and active are empty
  absl::Span<const float> h;      // rows x dim, row-major, in the message
  std::vector<uint32_t> row_end;  // validated copy, [rows] (empty when all_candidates)
  std::vector<int32_t> active;    // validated copy
  uint32_t picks = 0;                   // kActivationRouted: experts per row (else 0)
  std::vector<int32_t> experts;         // validated copy, [rows * picks]
  std::vector<float> expert_weights;    // validated copy, [rows * picks]
  std::vector<float> cuts;  // kActivationCuts: validated copy, [rows][kCutsPerRow] (else empty)

  // Row r's candidate ids (strictly ascending); only when !all_candidates.
  absl::Span<const int32_t> row(uint32_t r) const {
    const uint32_t begin = r == 0 ? 0 : row_end[r - 1];
    return absl::Span<const int32_t>(active.data() + begin, row_end[r] - begin);
  }
};

// Payload bytes: with all_candidates there are no row_end words (and n_active must be 0);
// picks > 0 adds the routing, cuts the TEAL cuts.
uint64_t ActivationBytes(uint64_t rows, uint64_t dim, uint64_t n_active, bool all_candidates,
                         uint64_t picks = 0, bool cuts = false);
// The sender's lists are checked for shape (row_end: rows entries, non-decreasing, ending at
// active.size()), not for order or range: the receiver checks those. `cuts` (TEAL's FFN input
// cuts, [rows][kCutsPerRow], or empty for none) go only with all candidates and no routing:
// the split FFN runs TEAL over whole dense layers.
absl::Status SendActivation(RingProducer& ring, uint64_t step_id, uint32_t layer, uint32_t rows,
                            uint32_t dim, absl::Span<const float> h,
                            const ActivationCandidates& candidates,
                            absl::Duration timeout = absl::InfiniteDuration(),
                            const ActivationRouting& routing = {},
                            absl::Span<const float> cuts = {});
absl::StatusOr<ActivationView> DecodeActivation(const MessageView& m,
                                                const ActivationLimits& limits);

// Shape a receiver expects of a row-major f32 matrix message (Partial, Logits).
struct MatrixLimits {
  uint32_t cols = 0;      // exact width (model dim for Partial, vocab for Logits)
  uint32_t max_rows = 0;  // rows in [1, max_rows] (Logits: [0, max_rows])
  uint32_t n_layers = 0;  // Partial only: layer in [0, n_layers)
};

struct MatrixView {
  uint64_t step_id = 0;
  uint32_t layer = 0;
  uint32_t rows = 0;
  uint32_t cols = 0;
  absl::Span<const float> data;  // rows x cols, in the message
};

uint64_t MatrixBytes(uint64_t rows, uint64_t cols);
absl::Status SendPartial(RingProducer& ring, uint64_t step_id, uint32_t layer, uint32_t rows,
                         uint32_t dim, absl::Span<const float> y_cold,
                         absl::Duration timeout = absl::InfiniteDuration());
absl::StatusOr<MatrixView> DecodePartial(const MessageView& m, const MatrixLimits& limits);
absl::Status SendLogits(RingProducer& ring, uint64_t step_id, uint32_t rows, uint32_t vocab,
                        absl::Span<const float> logits,
                        absl::Duration timeout = absl::InfiniteDuration());
absl::StatusOr<MatrixView> DecodeLogits(const MessageView& m, const MatrixLimits& limits);

}  // namespace thermocline::ipc
