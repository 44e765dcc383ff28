#include "shared/tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <queue>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "shared/tokenizer/bpe.h"
#include "shared/tokenizer/byte_level.h"
#include "shared/tokenizer/pretokenizer.h"
#include "shared/tokenizer/utf8.h"
#include "shared/tokenizer/wordpiece.h"
#include "shared/util/status_macros.h"

namespace thermocline {

namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// Texts llama.cpp recognises as end-of-turn / end-of-message / end-of-generation tokens when the
// file names none (llama_vocab::impl::load), in the order the first match is taken here.
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"};
constexpr std::string_view kEomTexts[] = {"<|eom_id|>"};
constexpr std::string_view kEogTexts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                          "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>",
                                          "<|end_of_text|>"};

// Abseil here is built with its own string_view type, distinct from std::string_view.
absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// "<0xNN>" -> NN, or -1.
int ParseByteToken(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  const int hi = HexValue(piece[3]), lo = HexValue(piece[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

bool IsMergeable(TokenType t) { return t == TokenType::kNormal || t == TokenType::kUserDefined; }

bool IsSpecial(TokenType t) {
  return t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown;
}

// An optional token id key: `dflt` when absent; present, it must be an integer inside the
// vocabulary.
absl::StatusOr<int32_t> SpecialId(const GgufFile& file, std::string_view key, int32_t dflt,
                                  int32_t vocab_size) {
  const GgufValue* v = file.FindValue(key);
  if (v == nullptr) return dflt < vocab_size ? dflt : -1;
  std::optional<int64_t> id = v->AsInt();
  if (!id.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(Av(key), " is not an integer"));
  }
  if (*id < 0 || *id >= vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(Av(key), " = ", *id, " is outside the vocabulary of ", vocab_size, " tokens"));
  }
  return static_cast<int32_t>(*id);
}

absl::StatusOr<bool> OptionalBool(const GgufFile& file, std::string_view key, bool dflt) {
  const GgufValue* v = file.FindValue(key);
  if (v == nullptr) return dflt;
  if (v->type() != GgufValueType::kBool) {
    return absl::InvalidArgumentError(absl::StrCat(Av(key), " is not a bool"));
  }
  return std::get<bool>(v->v);
}

absl::StatusOr<std::vector<std::string>> StringArray(const GgufFile& file, std::string_view key) {
  TC_ASSIGN_OR_RETURN(const GgufArray* arr, file.GetArray(key));
  std::vector<std::string> out;
  out.reserve(arr->items.size());
  for (size_t i = 0; i < arr->items.size(); ++i) {
    const std::string* s = arr->items[i].AsString();
    if (s == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(Av(key), "[", i, "] is not a string"));
    }
    out.push_back(*s);
  }
  return out;
}

}  // namespace

absl::StatusOr<Tokenizer> Tokenizer::FromGguf(const GgufFile& file) {
  TC_ASSIGN_OR_RETURN(std::string model, file.GetString("tokenizer.ggml.model"));
  TokenizerKind kind;
  if (model == "llama") {
    kind = TokenizerKind::kSentencePiece;
  } else if (model == "gpt2") {
    kind = TokenizerKind::kBpe;
  } else if (model == "bert") {
    kind = TokenizerKind::kWordPiece;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.ggml.model is '", model,
                     "'; supported are 'llama' (SentencePiece), 'gpt2' (byte-level BPE) and "
                     "'bert' (WordPiece)"));
  }
  TC_ASSIGN_OR_RETURN(std::vector<std::string> pieces, StringArray(file, "tokenizer.ggml.tokens"));
  const size_t n = pieces.size();
  if (n == 0) return absl::InvalidArgumentError("tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("tokenizer.ggml.tokens has more than 2^31-1 entries");
  }

  // Scores and types are optional in llama.cpp (defaults 0 and normal), but when present they
  // must describe every token.
  std::vector<float> scores(n, 0.0f);
  if (file.FindValue("tokenizer.ggml.scores") != nullptr) {
    TC_ASSIGN_OR_RETURN(const GgufArray* arr, file.GetArray("tokenizer.ggml.scores"));
    if (arr->items.size() != n) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.scores has ",
                                                     arr->items.size(), " entries but there are ",
                                                     n, " tokens"));
    }
    for (size_t i = 0; i < n; ++i) {
      std::optional<double> d = arr->items[i].AsDouble();
      if (!d.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.ggml.scores[", i, "] is not a number"));
      }
      scores[i] = static_cast<float>(*d);
    }
  }
  std::vector<TokenType> types(n, TokenType::kNormal);
  if (file.FindValue("tokenizer.ggml.token_type") != nullptr) {
    TC_ASSIGN_OR_RETURN(const GgufArray* arr, file.GetArray("tokenizer.ggml.token_type"));
    if (arr->items.size() != n) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.token_type has ",
                                                     arr->items.size(),
                                                     " entries but there are ", n, " tokens"));
    }
    for (size_t i = 0; i < n; ++i) {
      std::optional<int64_t> t = arr->items[i].AsInt();
      if (!t.has_value() || *t < 0 || *t > static_cast<int64_t>(TokenType::kByte)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.ggml.token_type[", i, "] is not a token type (0..6)"));
      }
      types[i] = static_cast<TokenType>(*t);
    }
  }
  const auto vocab = static_cast<int32_t>(n);

  Tokenizer t;
  t.kind_ = kind;
  bool add_bos_default = true;
  if (kind == TokenizerKind::kSentencePiece) {
    TC_ASSIGN_OR_RETURN(t.bos_, SpecialId(file, "tokenizer.ggml.bos_token_id", 1, vocab));
    TC_ASSIGN_OR_RETURN(t.eos_, SpecialId(file, "tokenizer.ggml.eos_token_id", 2, vocab));
    TC_ASSIGN_OR_RETURN(t.unk_, SpecialId(file, "tokenizer.ggml.unknown_token_id", 0, vocab));
    TC_ASSIGN_OR_RETURN(t.add_space_prefix_,
                        OptionalBool(file, "tokenizer.ggml.add_space_prefix", true));
  } else if (kind == TokenizerKind::kWordPiece) {
    // llama.cpp's WordPiece defaults: [CLS] 101 as BOS, [UNK] 100, [SEP] 102 (the GGUF key is
    // spelled "seperator"), no EOS.
    TC_ASSIGN_OR_RETURN(int32_t bos, SpecialId(file, "tokenizer.ggml.bos_token_id", 101, vocab));
    TC_ASSIGN_OR_RETURN(t.bos_, SpecialId(file, "tokenizer.ggml.cls_token_id", bos, vocab));
    TC_ASSIGN_OR_RETURN(t.eos_, SpecialId(file, "tokenizer.ggml.eos_token_id", -1, vocab));
    TC_ASSIGN_OR_RETURN(t.unk_, SpecialId(file, "tokenizer.ggml.unknown_token_id", 100, vocab));
    TC_ASSIGN_OR_RETURN(t.sep_, SpecialId(file, "tokenizer.ggml.seperator_token_id", 102, vocab));
    TC_ASSIGN_OR_RETURN(t.add_space_prefix_,
                        OptionalBool(file, "tokenizer.ggml.add_space_prefix", false));
    t.clean_spaces_ = true;
    if (t.bos_ < 0 || t.sep_ < 0) {
      return absl::InvalidArgumentError(
          "a WordPiece vocabulary needs [CLS] (tokenizer.ggml.cls_token_id) and [SEP] "
          "(tokenizer.ggml.seperator_token_id) inside the vocabulary");
    }
  } else {
    if (file.FindValue("tokenizer.ggml.merges") == nullptr) {
      return absl::InvalidArgumentError(
          "tokenizer.ggml.model is 'gpt2' but the file has no tokenizer.ggml.merges");
    }
    TC_ASSIGN_OR_RETURN(std::vector<std::string> merge_strings,
                        StringArray(file, "tokenizer.ggml.merges"));
    TC_ASSIGN_OR_RETURN(BpeMerges merges, BpeMerges::FromStrings(merge_strings));
    t.merges_ = std::make_shared<const BpeMerges>(std::move(merges));
    std::string pre;
    if (file.FindValue("tokenizer.ggml.pre") != nullptr) {
      TC_ASSIGN_OR_RETURN(pre, file.GetString("tokenizer.ggml.pre"));
    }
    TC_ASSIGN_OR_RETURN(t.pre_, Pretokenizer::ForName(pre));
    add_bos_default = t.pre_->add_bos_default();
    t.clean_spaces_ = t.pre_->clean_spaces();
    // llama.cpp's BPE defaults: BOS = EOS = 11 (GPT-NeoX's), no unknown token.
    TC_ASSIGN_OR_RETURN(t.bos_, SpecialId(file, "tokenizer.ggml.bos_token_id", 11, vocab));
    TC_ASSIGN_OR_RETURN(t.eos_, SpecialId(file, "tokenizer.ggml.eos_token_id", 11, vocab));
    TC_ASSIGN_OR_RETURN(t.unk_, SpecialId(file, "tokenizer.ggml.unknown_token_id", -1, vocab));
    TC_ASSIGN_OR_RETURN(t.add_space_prefix_,
                        OptionalBool(file, "tokenizer.ggml.add_space_prefix", false));
  }
  TC_ASSIGN_OR_RETURN(t.eot_, SpecialId(file, "tokenizer.ggml.eot_token_id", -1, vocab));
  TC_ASSIGN_OR_RETURN(t.eom_, SpecialId(file, "tokenizer.ggml.eom_token_id", -1, vocab));
  TC_ASSIGN_OR_RETURN(t.add_bos_, OptionalBool(file, "tokenizer.ggml.add_bos_token",
                                               add_bos_default));
  TC_ASSIGN_OR_RETURN(t.add_eos_, OptionalBool(file, "tokenizer.ggml.add_eos_token", false));
  if (t.add_bos_ && t.bos_ < 0) {
    return absl::InvalidArgumentError("tokenizer.ggml.add_bos_token is set but there is no BOS");
  }
  if (t.add_eos_ && t.eos_ < 0) {
    return absl::InvalidArgumentError("tokenizer.ggml.add_eos_token is set but there is no EOS");
  }
  t.pieces_ = std::move(pieces);
  t.scores_ = std::move(scores);
  t.types_ = std::move(types);
  t.rstrip_.assign(n, false);

  // llama.cpp gives Phi-3's special tokens (found by the model's name) the RSTRIP attribute:
  // whitespace after them is dropped when they are parsed out of text.
  std::string name;
  if (const GgufValue* v = file.FindValue("general.name"); v != nullptr && v->AsString()) {
    name = absl::AsciiStrToLower(*v->AsString());
  }
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (size_t id = 0; id < n; ++id) {
      const std::string& p = t.pieces_[id];
      t.rstrip_[id] = (IsSpecial(t.types_[id]) || p == "</s>") && p != "<unk>" && p != "<s>" &&
                      p != "<|endoftext|>";
    }
  }
  TC_RETURN_IF_ERROR(t.Index());
  return t;
}

absl::StatusOr<Tokenizer> Tokenizer::Load(const std::string& path) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  if (!file.ok()) return file.status();
  absl::StatusOr<Tokenizer> t = FromGguf(**file);
  if (!t.ok()) {
    return absl::Status(t.status().code(), absl::StrCat(path, ": ", t.status().message()));
  }
  return t;
}

absl::StatusOr<Tokenizer> Tokenizer::FromVocab(std::vector<std::string> pieces,
                                               std::vector<float> scores,
                                               std::vector<TokenType> types, int32_t bos,
                                               int32_t eos, int32_t unk) {
  const size_t n = pieces.size();
  if (n == 0) return absl::InvalidArgumentError("vocabulary is empty");
  if (n > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("vocabulary has more than 2^31-1 tokens");
  }
  if (scores.size() != n || types.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("vocabulary has ", n, " pieces, ",
                                                   scores.size(), " scores and ", types.size(),
                                                   " token types; they must agree"));
  }
  const auto vocab = static_cast<int32_t>(n);
  for (auto [name, id] : {std::pair<const char*, int32_t>{"bos", bos}, {"eos", eos}, {"unk", unk}}) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(name, " token id ", id,
                                                     " is outside the vocabulary of ", vocab,
                                                     " tokens"));
    }
  }
  Tokenizer t;
  t.pieces_ = std::move(pieces);
  t.scores_ = std::move(scores);
  t.types_ = std::move(types);
  t.rstrip_.assign(n, false);
  t.bos_ = bos;
  t.eos_ = eos;
  t.unk_ = unk;
  TC_RETURN_IF_ERROR(t.Index());
  return t;
}

absl::Status Tokenizer::Index() {
  const auto vocab = static_cast<int32_t>(pieces_.size());
  std::fill(std::begin(byte_tokens_), std::end(byte_tokens_), -1);
  piece_to_id_.reserve(pieces_.size());
  for (int32_t id = 0; id < vocab; ++id) {
    const int type = static_cast<int>(types_[id]);
    if (type < 0 || type > static_cast<int>(TokenType::kByte)) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", id, " has unknown token type ", type));
    }
    // A NaN score would make the merge order depend on comparison details.
    if (std::isnan(scores_[id])) {
      return absl::InvalidArgumentError(absl::StrCat("token ", id, " has a NaN score"));
    }
    // Byte tokens are SentencePiece's fallback; BPE covers bytes with its alphabet instead.
    if (types_[id] == TokenType::kByte && kind_ == TokenizerKind::kSentencePiece) {
      const int byte = ParseByteToken(pieces_[id]);
      if (byte < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token ", id, " has type byte but its piece '", absl::CEscape(pieces_[id]),
            "' is not of the form <0xNN>"));
      }
      if (byte_tokens_[byte] < 0) byte_tokens_[byte] = id;
    }
    // On duplicate pieces the lowest id wins, so that encoding is stable.
    piece_to_id_.try_emplace(pieces_[id], id);
    max_piece_bytes_ = std::max(max_piece_bytes_, pieces_[id].size());
  }

  // End-of-turn / end-of-generation tokens by text where the file names none; like llama.cpp,
  // they become control tokens (never printed, parsed only when asked).
  auto find = [&](std::string_view text) {
    auto it = piece_to_id_.find(Av(text));
    return it == piece_to_id_.end() ? -1 : it->second;
  };
  auto first_of = [&](std::span<const std::string_view> texts) {
    for (std::string_view s : texts) {
      if (int32_t id = find(s); id >= 0) return id;
    }
    return -1;
  };
  if (eot_ < 0) eot_ = first_of(kEotTexts);
  if (eom_ < 0) eom_ = first_of(kEomTexts);
  eog_ids_.clear();
  for (std::string_view s : kEogTexts) {
    if (int32_t id = find(s); id >= 0) eog_ids_.push_back(id);
  }
  for (int32_t id : {eot_, eom_}) {
    if (id >= 0) eog_ids_.push_back(id);
  }
  for (int32_t id : eog_ids_) types_[id] = TokenType::kControl;
  if (eos_ >= 0) eog_ids_.push_back(eos_);
  std::sort(eog_ids_.begin(), eog_ids_.end());
  eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());

  special_order_.clear();
  for (int32_t id = 0; id < vocab; ++id) {
    if (IsSpecial(types_[id]) && !pieces_[id].empty()) special_order_.push_back(id);
  }
  std::stable_sort(special_order_.begin(), special_order_.end(), [&](int32_t a, int32_t b) {
    return pieces_[a].size() > pieces_[b].size();
  });
  return absl::OkStatus();
}

std::string_view Tokenizer::model_name() const {
  switch (kind_) {
    case TokenizerKind::kBpe:
      return "gpt2";
    case TokenizerKind::kWordPiece:
      return "bert";
    default:
      return "llama";
  }
}

const std::string& Tokenizer::pre() const {
  static const std::string* none = new std::string();
  return pre_ != nullptr ? pre_->name() : *none;
}

bool Tokenizer::IsEog(int32_t id) const {
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

std::vector<Tokenizer::Fragment> Tokenizer::Partition(std::string_view text,
                                                      bool parse_special) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({-1, 0, text.size()});
  if (!parse_special && kind_ == TokenizerKind::kSentencePiece) return frags;
  std::vector<Fragment> next;
  for (int32_t id : special_order_) {
    if (!parse_special && types_[id] != TokenType::kUserDefined) continue;
    const std::string& s = pieces_[id];
    next.clear();
    bool found = false;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t base = f.offset;
      const size_t end = f.offset + f.length;
      const std::string_view window = text.substr(0, end);
      for (size_t pos; (pos = window.find(s, base)) != std::string_view::npos;) {
        found = true;
        if (pos > base) next.push_back({-1, base, pos - base});
        next.push_back({id, 0, 0});
        base = pos + s.size();
        if (rstrip_[id]) {
          while (base < end && std::isspace(static_cast<unsigned char>(text[base]))) ++base;
        }
      }
      if (base < end) next.push_back({-1, base, end - base});
    }
    if (found) frags.swap(next);
  }
  return frags;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> out;
  if (add_bos && bos_ >= 0) out.push_back(bos_);
  const std::vector<int32_t> ids = Encode(text, EncodeOptions{});
  out.insert(out.end(), ids.begin(), ids.end());
  return out;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<int32_t> out;
  if (options.add_special && add_bos_) out.push_back(bos_);
  bool prev_special = true;  // SentencePiece's dummy prefix goes on text that starts a fragment
  for (const Fragment& f : Partition(text, options.parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    const std::string_view part = text.substr(f.offset, f.length);
    switch (kind_) {
      case TokenizerKind::kBpe:
        EncodeBpe(part, &out);
        break;
      case TokenizerKind::kWordPiece:
        EncodeWordPiece(part, &out);
        break;
      case TokenizerKind::kSentencePiece:
        EncodeSpm(part, add_space_prefix_ && prev_special, &out);
        break;
    }
    prev_special = false;
  }
  if (options.add_special && kind_ == TokenizerKind::kWordPiece) out.push_back(sep_);
  if (options.add_special && add_eos_) out.push_back(eos_);
  return out;
}

void Tokenizer::EncodeWordPiece(std::string_view text, std::vector<int32_t>* out) const {
  auto lookup = [&](std::string_view piece) {
    auto it = piece_to_id_.find(Av(piece));
    return it == piece_to_id_.end() ? -1 : it->second;
  };
  for (const std::string& word : WordPieceWords(text)) {
    WordPieceEncodeWord(word, max_piece_bytes_, lookup, unk_, out);
  }
}

void Tokenizer::EncodeBpe(std::string_view text, std::vector<int32_t>* out) const {
  const std::string valid = utf8::ReplaceInvalidBytes(text);
  for (std::string_view word : pre_->Split(valid)) {
    const std::string encoded = byte_level::Encode(word);
    if (pre_->ignore_merges()) {
      auto it = piece_to_id_.find(encoded);
      if (it != piece_to_id_.end()) {
        out->push_back(it->second);
        continue;
      }
    }
    for (std::string_view sym : merges_->Merge(encoded)) {
      auto it = piece_to_id_.find(Av(sym));
      if (it != piece_to_id_.end()) {
        out->push_back(it->second);
        continue;
      }
      // Not in the vocabulary (the merges and tokens disagree): llama.cpp emits the tokens of
      // the symbol's single bytes that exist and drops the rest.
      for (char c : sym) {
        auto b = piece_to_id_.find(absl::string_view(&c, 1));
        if (b != piece_to_id_.end()) out->push_back(b->second);
      }
    }
  }
}

namespace {

struct Symbol {
  int32_t prev;
  int32_t next;
  size_t offset;
  size_t n;  // 0 once merged into its left neighbour
};

struct Bigram {
  int32_t left;
  int32_t right;
  float score;
  size_t size;
};

struct BigramLess {
  // The queue pops the highest score first, and the leftmost pair among equal scores.
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

void Tokenizer::EncodeSpm(std::string_view text, bool space_prefix,
                          std::vector<int32_t>* out) const {
  if (text.empty()) return;
  std::string norm;
  norm.reserve(text.size() * 3 + 3);
  if (space_prefix) norm.append(kSpaceMarker);
  for (char c : text) {
    if (c == ' ') {
      norm.append(kSpaceMarker);
    } else {
      norm.push_back(c);
    }
  }

  std::vector<Symbol> symbols;
  symbols.reserve(norm.size());
  for (size_t off = 0; off < norm.size();) {
    const size_t len = utf8::SymbolLength(std::string_view(norm).substr(off));
    const auto idx = static_cast<int32_t>(symbols.size());
    symbols.push_back({idx - 1, idx + 1, off, len});
    off += len;
  }
  symbols.back().next = -1;

  std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue;
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const std::string_view merged(norm.data() + symbols[left].offset,
                                  symbols[left].n + symbols[right].n);
    auto it = piece_to_id_.find(Av(merged));
    if (it == piece_to_id_.end() || !IsMergeable(types_[it->second])) return;
    queue.push({left, right, scores_[it->second], merged.size()});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& left = symbols[b.left];
    Symbol& right = symbols[b.right];
    // Stale entry: one side has since been merged into something else.
    if (left.n == 0 || right.n == 0 || left.next != b.right || left.n + right.n != b.size) {
      continue;
    }
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = b.left;
    try_add(left.prev, b.left);
    try_add(b.left, left.next);
  }

  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const std::string_view s(norm.data() + symbols[i].offset, symbols[i].n);
    auto it = piece_to_id_.find(Av(s));
    if (it != piece_to_id_.end() && IsMergeable(types_[it->second])) {
      out->push_back(it->second);
      continue;
    }
    for (char c : s) {
      const int32_t id = byte_tokens_[static_cast<uint8_t>(c)];
      out->push_back(id >= 0 ? id : unk_);
    }
  }
}

std::string Tokenizer::TokenBytes(int32_t prev, int32_t id, bool render_special) const {
  if (id < 0 || id >= vocab_size()) return "";
  const std::string& piece = pieces_[id];
  const TokenType type = types_[id];
  if (type == TokenType::kControl) return render_special ? piece : "";
  if (kind_ != TokenizerKind::kSentencePiece) {
    switch (type) {
      case TokenType::kUnknown:
        return render_special ? piece : "";
      case TokenType::kUserDefined:
        return piece;
      case TokenType::kNormal:
        if (kind_ == TokenizerKind::kBpe) return byte_level::Decode(piece);
        break;
      default:
        return "";  // llama.cpp prints no other type
    }
  }
  if (type == TokenType::kByte) {
    return std::string(1, static_cast<char>(ParseByteToken(piece)));
  }
  std::string out;
  out.reserve(piece.size());
  for (size_t i = 0; i < piece.size();) {
    if (std::string_view(piece).substr(i, kSpaceMarker.size()) == kSpaceMarker) {
      out.push_back(' ');
      i += kSpaceMarker.size();
    } else {
      out.push_back(piece[i++]);
    }
  }
  // Encode added a dummy-prefix space to the text; dropping it after BOS gives the text back.
  if (kind_ == TokenizerKind::kSentencePiece && prev == bos_ && !out.empty() && out[0] == ' ') {
    out.erase(0, 1);
  }
  return out;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool render_special) const {
  StreamingDetokenizer detok(*this, render_special);
  std::string out;
  for (int32_t id : ids) out += detok.Push(id);
  out += detok.Flush();
  return out;
}

std::string CleanUpTokenizationSpaces(std::string_view text) {
  // Three passes as in llama.cpp's llama_vocab::impl::detokenize; each keeps the first byte.
  std::string a;
  a.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char x = text[i];
    if (i > 0 && text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) {
      a.pop_back();  // " ?" -> "?"
    }
    a.push_back(x);
  }
  std::string b;
  b.reserve(a.size());
  char prev = a.empty() ? '\0' : a[0];
  if (!a.empty()) b.push_back(a[0]);
  for (size_t i = 1; i < a.size(); ++i) {
    const char x = a[i];
    if (x == '\'' && i + 1 < a.size() && prev == ' ' && a[i + 1] == ' ') {  // " ' " -> "'"
      b.pop_back();
      b.push_back(x);
      prev = '\0';  // llama.cpp blanks the next space in place, so it is the next "previous"
      ++i;
      continue;
    }
    b.push_back(x);
    prev = x;
  }
  std::string c;
  c.reserve(b.size());
  if (!b.empty()) c.push_back(b[0]);
  for (size_t i = 1; i < b.size(); ++i) {
    const char x = b[i];
    if (b[i - 1] == ' ' && x == '\'' && i + 1 < b.size()) {
      const char x1 = b[i + 1];
      const char x2 = i + 2 < b.size() ? b[i + 2] : '\0';
      // " 's" " 'm" " 're" " 've" lose the space; " 't" " 'd" " 'll" keep it.
      if (x1 == 's' || x1 == 'm' || (x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) {
        c.pop_back();
      }
    }
    c.push_back(x);
  }
  return c;
}

std::string StreamingDetokenizer::Push(int32_t id) {
  pending_ += tokenizer_.TokenBytes(prev_, id, render_special_);
  prev_ = id;
  std::string out;
  const size_t consumed = utf8::AppendSanitized(pending_, /*final=*/false, &out);
  pending_.erase(0, consumed);
  return out;
}

std::string StreamingDetokenizer::Flush() {
  std::string out;
  utf8::AppendSanitized(pending_, /*final=*/true, &out);
  pending_.clear();
  prev_ = -1;
  return out;
}

}  // namespace thermocline
