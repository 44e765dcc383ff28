// Tokenizer built from a GGUF vocabulary: SentencePiece (`tokenizer.ggml.model = llama`),
// byte-level BPE (`gpt2`, with llama.cpp's pre-tokenizers) or WordPiece (`bert`,
// wordpiece.h), with llama.cpp's special-token handling.
//
// SentencePiece encoding follows llama.cpp's SPM tokenizer (and llama2.c's run.c, which agrees
// on real prompts): a "dummy prefix" space (add_space_prefix), spaces as U+2581, pairwise merges
// of adjacent pieces by the highest vocabulary score (leftmost on ties), and byte fallback
// (<0xNN>) for text that no piece covers. Decoding strips the leading space of the first piece
// after BOS and turns <0xNN> into raw bytes.
//
// BPE encoding follows llama.cpp's llm_tokenizer_bpe: the pre-tokenizer regexes of
// tokenizer.ggml.pre split the text into words (pretokenizer.h), each word is written in GPT-2's
// byte-level alphabet (byte_level.h) and merged by tokenizer.ggml.merges ranks (bpe.h). Invalid
// UTF-8 is read as one U+FFFD per bad byte first, as llama.cpp does.
//
// Special tokens (llama.cpp's tokenizer_st_partition): with parse_special, the text of every
// control, user-defined and unknown token is cut out of the input as that token's id (longest
// texts first). Without it, BPE and WordPiece vocabularies still cut out user-defined tokens, as
// llama.cpp and Hugging Face do (deepseek-llm's 'ü' is one); SentencePiece ones cut out nothing,
// which is the behaviour this tokenizer always had for raw text.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "shared/gguf/gguf.h"

namespace thermocline {

class BpeMerges;
class Pretokenizer;

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

enum class TokenizerKind {
  kSentencePiece,  // tokenizer.ggml.model = "llama"
  kBpe,            // tokenizer.ggml.model = "gpt2"
  kWordPiece,      // tokenizer.ggml.model = "bert"
};

struct EncodeOptions {
  // llama.cpp's add_special: BOS first and EOS last as tokenizer.ggml.add_bos_token /
  // add_eos_token (or the per-kind defaults) say; WordPiece: CLS first, SEP last.
  bool add_special = false;
  // llama.cpp's parse_special: control / user-defined / unknown token text becomes the id.
  bool parse_special = false;
};

class Tokenizer {
 public:
  // Reads tokenizer.ggml.{model,pre,tokens,scores,token_type,merges,bos_token_id,eos_token_id,
  // unknown_token_id,eot_token_id,eom_token_id,cls_token_id,seperator_token_id,add_bos_token,
  // add_eos_token,add_space_prefix}.
  // Every field is validated; an unsupported model or pre-tokenizer is an error naming it.
  static absl::StatusOr<Tokenizer> FromGguf(const GgufFile& file);
  // Opens `path` and reads its vocabulary; a vocabulary-only GGUF (no tensors) is fine.
  static absl::StatusOr<Tokenizer> Load(const std::string& path);
  // A SentencePiece vocabulary from parts (the converter and synthetic models build them so).
  static absl::StatusOr<Tokenizer> FromVocab(std::vector<std::string> pieces,
                                             std::vector<float> scores,
                                             std::vector<TokenType> types, int32_t bos,
                                             int32_t eos, int32_t unk);

  // Raw text (no special-token parsing), BOS first exactly when `add_bos` (and the vocabulary
  // has one). Encoding and decoding are const and safe to call from several threads.
  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const;
  std::vector<int32_t> Encode(std::string_view text, const EncodeOptions& options) const;

  TokenizerKind kind() const { return kind_; }
  // "llama", "gpt2" or "bert", as in tokenizer.ggml.model.
  std::string_view model_name() const;
  // The BPE pre-tokenizer's name ("default" when the file has none); "" for SentencePiece.
  const std::string& pre() const;

  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  // -1 where the vocabulary has none.
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  int32_t unk() const { return unk_; }
  int32_t eot() const { return eot_; }  // end of turn (<|eot_id|>, <|im_end|>, ...)
  int32_t eom() const { return eom_; }  // end of message (<|eom_id|>)
  int32_t sep() const { return sep_; }  // WordPiece's [SEP]; bos() is its [CLS]
  // Every id that ends a generation (EOS, EOT, EOM and llama.cpp's list of end texts), sorted.
  const std::vector<int32_t>& eog_ids() const { return eog_ids_; }
  bool IsEog(int32_t id) const;

  bool add_bos_token() const { return add_bos_; }
  bool add_eos_token() const { return add_eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  // Whether llama.cpp's detokenizer applies CleanUpTokenizationSpaces for this vocabulary.
  bool clean_spaces() const { return clean_spaces_; }

  const std::string& piece(int32_t id) const { return pieces_[id]; }
  TokenType type(int32_t id) const { return types_[id]; }
  float score(int32_t id) const { return scores_[id]; }

  // The bytes token `id` stands for when it follows `prev` (prev = -1 at the start). Control
  // (and, for BPE, unknown) tokens give "" unless `render_special`, which gives their text.
  // SentencePiece: U+2581 becomes a space, the leading space after BOS is dropped, <0xNN>
  // becomes one raw byte. BPE: byte-level text becomes its bytes, user-defined text is verbatim.
  // WordPiece: U+2581 becomes a space.
  // May be an incomplete UTF-8 sequence; out-of-range ids give "".
  std::string TokenBytes(int32_t prev, int32_t id, bool render_special = false) const;

  // The text of a whole id sequence, exactly what a StreamingDetokenizer fed the same ids and
  // then flushed gives (llama.cpp's detokenize without clean_up_tokenization_spaces).
  std::string Decode(std::span<const int32_t> ids, bool render_special = false) const;

 private:
  struct Fragment {
    int32_t token;  // >= 0: a special token's id; -1: text [offset, offset + length)
    size_t offset;
    size_t length;
  };

  absl::Status Index();  // piece_to_id_, byte_tokens_, special_order_, EOG ids
  std::vector<Fragment> Partition(std::string_view text, bool parse_special) const;
  void EncodeSpm(std::string_view text, bool space_prefix, std::vector<int32_t>* out) const;
  void EncodeBpe(std::string_view text, std::vector<int32_t>* out) const;
  void EncodeWordPiece(std::string_view text, std::vector<int32_t>* out) const;

  TokenizerKind kind_ = TokenizerKind::kSentencePiece;
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<TokenType> types_;
  std::vector<bool> rstrip_;  // llama.cpp's RSTRIP attribute (Phi-3's special tokens)
  absl::flat_hash_map<std::string, int32_t> piece_to_id_;
  int32_t byte_tokens_[256];  // id of <0xNN>, or -1
  // Control, user-defined and unknown ids, longest text first.
  std::vector<int32_t> special_order_;
  std::shared_ptr<const Pretokenizer> pre_;  // BPE only
  std::shared_ptr<const BpeMerges> merges_;  // BPE only
  int32_t bos_ = 1, eos_ = 2, unk_ = 0, eot_ = -1, eom_ = -1, sep_ = -1;
  size_t max_piece_bytes_ = 0;
  std::vector<int32_t> eog_ids_;
  bool add_bos_ = true, add_eos_ = false, add_space_prefix_ = true, clean_spaces_ = false;
};

// llama.cpp's clean_up_tokenization_spaces pass over detokenized text (Hugging Face's, ASCII
// only): drops the space before ? ! . , and before 's 'm 're 've, and the spaces around a lone
// apostrophe. Lossy, so Decode never applies it; callers that want llama.cpp's exact text do
// when clean_spaces() says so.
std::string CleanUpTokenizationSpaces(std::string_view text);

// Turns a stream of token ids into text that is always valid UTF-8: bytes of an incomplete
// multi-byte sequence are held back until the sequence completes; bytes that can never form
// valid UTF-8 come out as U+FFFD.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool render_special = false)
      : tokenizer_(tokenizer), render_special_(render_special) {}
  // Text that became complete with this token (possibly empty).
  std::string Push(int32_t id);
  // What is still held back, as U+FFFD for each incomplete sequence; resets the state.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool render_special_;
  int32_t prev_ = -1;
  std::string pending_;
};

}  // namespace thermocline
