// A pushdown matcher for a parsed GBNF grammar (gbnf.h), fed UTF-8 bytes.
//
// The state is a set of stacks, as in llama.cpp's grammar sampler: each stack holds positions
// in the grammar's flat elements, its top a character class still to match; the empty stack
// means "the text so far is a whole sentence". Feeding a code point keeps the stacks whose top
// matches it, advanced and expanded through rule references until a class is on top again.
// A code point arrives byte by byte: while a UTF-8 sequence is incomplete only the stacks that
// some completion of it could satisfy are kept, so that a token ending mid-character (byte
// fallback, byte-level BPE) is allowed exactly when the character can still be finished.
// Overlong forms, surrogates and bytes that cannot be UTF-8 are refused: the text a client
// sees is valid UTF-8 and is the text that was matched.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "shared/grammar/gbnf.h"

namespace thermocline::grammar {

// Stacks stored one after another (no allocation per stack); duplicates are dropped on Add.
class StackSet {
 public:
  size_t size() const { return ends_.size(); }
  bool empty() const { return ends_.empty(); }
  std::span<const uint32_t> operator[](size_t i) const {
    const uint32_t b = i == 0 ? 0 : ends_[i - 1];
    return {data_.data() + b, ends_[i] - b};
  }
  void Clear() {
    data_.clear();
    ends_.clear();
  }
  void Add(std::span<const uint32_t> stack);

 private:
  std::vector<uint32_t> data_;
  std::vector<uint32_t> ends_;
};

struct MatchState {
  StackSet stacks;
  uint32_t cp = 0;   // bits of the code point being read
  uint8_t left = 0;  // continuation bytes it still needs
  uint8_t len = 0;   // its length in bytes
};

// Reusable buffers for Advance (one per thread).
struct Scratch {
  std::vector<uint32_t> stack;
};

// Rule expansions one step may take: an ambiguous grammar has exponentially many expansion
// paths to the same stacks. Past it the character is refused (the initial state: ParseGbnf
// refuses the grammar).
inline constexpr int64_t kExpandBudget = 100000;

// The state before any text; no stacks when the expansion ran out of budget.
MatchState InitialState(const Grammar& g);
// `from` advanced by one byte into *to (overwritten); false when nothing survives (*to is
// then unspecified).
bool AdvanceByte(const Grammar& g, const MatchState& from, uint8_t byte, MatchState* to,
                 Scratch* scratch);
// The text so far is a sentence of the grammar (no partial character pending).
bool CanEnd(const MatchState& s);
// The text so far is a sentence and nothing can follow it.
bool IsComplete(const MatchState& s);

// A grammar and a position in it.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> grammar);
  // Feeds `bytes`; false (and the matcher unchanged) when they leave the language.
  bool Accept(std::string_view bytes);
  bool CanEnd() const { return grammar::CanEnd(state_); }
  bool IsComplete() const { return grammar::IsComplete(state_); }
  const Grammar& grammar() const { return *grammar_; }
  const MatchState& state() const { return state_; }

 private:
  std::shared_ptr<const Grammar> grammar_;
  MatchState state_;
  MatchState next_;
  Scratch scratch_;
};

}  // namespace thermocline::grammar
