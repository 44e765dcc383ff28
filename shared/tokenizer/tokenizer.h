// SentencePiece-style (llama) tokenizer built from a GGUF vocabulary.
//
// Encoding follows llama.cpp's SPM tokenizer (and llama2.c's run.c, which agrees on real
// prompts): a "dummy prefix" space, spaces as U+2581, pairwise merges of adjacent pieces by the
// highest vocabulary score (leftmost on ties), and byte fallback (<0xNN>) for text that no piece
// covers. Decoding strips the leading space of the first piece after BOS and turns <0xNN> into
// raw bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "shared/model/gguf.h"

namespace thermocline {

// llama.cpp token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

class Tokenizer {
 public:
  // Reads tokenizer.ggml.{model,tokens,scores,token_type,bos_token_id,eos_token_id,
  // unknown_token_id}. Only model "llama" is supported; anything else is an error naming it.
  static absl::StatusOr<Tokenizer> FromGguf(const GgufFile& file);
  // From parts (the converter and synthetic models build vocabularies this way).
  static absl::StatusOr<Tokenizer> FromVocab(std::vector<std::string> pieces,
                                             std::vector<float> scores,
                                             std::vector<TokenType> types, int32_t bos,
                                             int32_t eos, int32_t unk);

  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const;

  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  int32_t unk() const { return unk_; }
  const std::string& piece(int32_t id) const { return pieces_[id]; }
  TokenType type(int32_t id) const { return types_[id]; }
  float score(int32_t id) const { return scores_[id]; }

  // The bytes token `id` stands for when it follows `prev` (prev = -1 at the start): U+2581
  // becomes a space, the leading space after BOS is dropped, <0xNN> becomes one raw byte,
  // control tokens become "". May be an incomplete UTF-8 sequence.
  std::string TokenBytes(int32_t prev, int32_t id) const;

  // The text of a whole id sequence, exactly what a StreamingDetokenizer fed the same ids and
  // then flushed gives. Out-of-range ids decode to "".
  std::string Decode(std::span<const int32_t> ids) const;

 private:
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<TokenType> types_;
  absl::flat_hash_map<std::string, int32_t> piece_to_id_;
  int32_t byte_tokens_[256];  // id of <0xNN>, or -1
  int32_t bos_ = 1, eos_ = 2, unk_ = 0;
};

// Turns a stream of token ids into text that is always valid UTF-8: bytes of an incomplete
// multi-byte sequence are held back until the sequence completes; bytes that can never form
// valid UTF-8 come out as U+FFFD.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // Text that became complete with this token (possibly empty).
  std::string Push(int32_t id);
  // What is still held back, as U+FFFD for each incomplete sequence; resets the state.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  int32_t prev_ = -1;
  std::string pending_;
};

}  // namespace thermocline
