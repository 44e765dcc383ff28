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
#include <span>
#include <string>
#include <vector>

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

// Computes masks; keeps per-depth states between calls (one per sequence or thread).
class MaskComputer {
 public:
  // allowed[id] = 1 for every token whose bytes `state` accepts, else 0 (resized to the
  // vocabulary); each of `end_tokens` (EOS, stop tokens: they end the sequence, their text is
  // not the output's) is allowed exactly where the text is whole (CanEnd). Returns how many are
  // allowed.
  int32_t Compute(const Grammar& g, const MatchState& state, const VocabTrie& trie,
                  std::vector<uint8_t>* allowed, std::span<const int32_t> end_tokens = {});

 private:
  std::vector<MatchState> states_;  // states_[d]: after the first d bytes of the current path
  Scratch scratch_;
};

}  // namespace thermocline::grammar
