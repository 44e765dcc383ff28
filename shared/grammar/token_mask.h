// Which vocabulary tokens keep the output a prefix of a grammar's language: the token-level mask
// applied before sampling (docs/gateway.md#structured-output).
//
// A token's text is its bytes as the tokenizer decodes it after a token other than BOS
// (Tokenizer::TokenBytes(-1, id): SentencePiece's U+2581 as a space and <0xNN> as one byte,
// byte-level BPE's alphabet as bytes), which is exactly what a streamed completion shows. The
// vocabulary is a byte trie, so a shared prefix is matched once per step and a rejected prefix
// rules out every token below it. Tokens with no bytes (control, unused) are never allowed;
// the end tokens are the caller's to allow where CanEnd() says so.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "shared/grammar/matcher.h"
#include "shared/tokenizer/tokenizer.h"

namespace thermocline::grammar {

class VocabTrie {
 public:
  explicit VocabTrie(const Tokenizer& tokenizer);
  int32_t vocab_size() const { return vocab_size_; }
  size_t node_count() const { return nodes_.size(); }
  // The bytes the trie holds for `id` ("" when it is left out).
  const std::string& bytes(int32_t id) const { return bytes_[id]; }

 private:
  friend class MaskComputer;
  // Preorder: a node's children follow it; `end` is the index past its subtree.
  struct Node {
    uint32_t end;
    uint32_t tokens_begin, tokens_end;  // into tokens_
    uint16_t depth;
    uint8_t byte;
  };
  int32_t vocab_size_ = 0;
  std::vector<std::string> bytes_;
  std::vector<Node> nodes_;  // nodes_[0] is the root (no byte)
  std::vector<int32_t> tokens_;
};

// Computes one grammar's masks (one per sequence or thread). The matcher's states met along the
// trie are interned and their byte transitions remembered across calls: inside a JSON string
// nearly every prefix leads back to the same state, so most trie nodes cost one lookup instead
// of a stack-set advance.
class MaskComputer {
 public:
  explicit MaskComputer(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {}
  // allowed[id] = 1 for every token whose bytes `state` accepts, else 0 (resized to the
  // vocabulary); each of `end_tokens` (EOS, stop tokens: they end the sequence, their text is
  // not the output's) is allowed exactly where the text is whole (CanEnd). Returns how many are
  // allowed.
  int32_t Compute(const MatchState& state, const VocabTrie& trie, std::vector<uint8_t>* allowed,
                  std::span<const int32_t> end_tokens = {});

 private:
  static constexpr uint32_t kDead = 0xFFFFFFFFu;
  uint32_t Intern(const MatchState& s);
  uint32_t Next(uint32_t from, uint8_t byte);

  std::shared_ptr<const Grammar> grammar_;
  std::vector<MatchState> pool_;      // interned states by id
  absl::flat_hash_map<std::string, uint32_t> ids_;
  absl::flat_hash_map<uint64_t, uint32_t> next_;  // (id << 8 | byte) -> id or kDead
  std::vector<uint32_t> path_;  // path_[d]: the state after the first d bytes of the current path
  MatchState next_state_;
  std::string key_;
  Scratch scratch_;
};

}  // namespace thermocline::grammar
