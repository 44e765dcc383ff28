#include "shared/tokenizer/tokenizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <queue>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "shared/util/status_macros.h"

namespace thermocline {

namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581, SentencePiece's space
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// How the bytes at the start of `s` relate to UTF-8 (Unicode 15, table 3-7): `need` is the length
// of the sequence announced by the lead byte (0 for a byte that cannot start one) and `valid` how
// many leading bytes are consistent with a well-formed sequence (at least 1). The sequence is
// complete when valid == need; when valid < need and valid == s.size() it may still complete.
struct Utf8Prefix {
  size_t need;
  size_t valid;
};

Utf8Prefix ScanUtf8(std::string_view s) {
  const auto b0 = static_cast<uint8_t>(s[0]);
  if (b0 < 0x80) return {1, 1};
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return {0, 1};
  }
  size_t valid = 1;
  while (valid < need && valid < s.size()) {
    const auto b = static_cast<uint8_t>(s[valid]);
    if (b < (valid == 1 ? lo : 0x80) || b > (valid == 1 ? hi : 0xBF)) break;
    ++valid;
  }
  return {need, valid};
}

// Appends the valid UTF-8 of `in` to `out`, replacing each maximal ill-formed subpart with one
// U+FFFD (Unicode's "substitution of maximal subparts", which gives the same text whether the
// bytes arrive at once or in pieces). Unless `final`, an incomplete sequence at the end is left
// unconsumed. Returns the number of bytes consumed.
size_t AppendSanitizedUtf8(std::string_view in, bool final, std::string* out) {
  size_t i = 0;
  while (i < in.size()) {
    const Utf8Prefix p = ScanUtf8(in.substr(i));
    if (p.valid == p.need) {
      out->append(in.data() + i, p.need);
    } else if (!final && p.need > 0 && i + p.valid == in.size()) {
      break;
    } else {
      out->append(kReplacement);
    }
    i += p.valid;
  }
  return i;
}

// Length of the character at s[0] when splitting text into initial symbols: a well-formed UTF-8
// sequence, or a single byte for anything ill-formed.
size_t SymbolLength(std::string_view s) {
  const Utf8Prefix p = ScanUtf8(s);
  return p.valid == p.need ? p.need : 1;
}

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

absl::StatusOr<int32_t> SpecialId(const GgufFile& file, std::string_view key, int32_t dflt,
                                  int32_t vocab_size) {
  const GgufValue* v = file.FindValue(key);
  if (v == nullptr) return dflt;
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

}  // namespace

absl::StatusOr<Tokenizer> Tokenizer::FromGguf(const GgufFile& file) {
  TC_ASSIGN_OR_RETURN(std::string model, file.GetString("tokenizer.ggml.model"));
  if (model != "llama") {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.ggml.model is '", model, "'; only 'llama' (SentencePiece) is supported"));
  }
  TC_ASSIGN_OR_RETURN(const GgufArray* tokens, file.GetArray("tokenizer.ggml.tokens"));
  const size_t n = tokens->items.size();
  if (n == 0) return absl::InvalidArgumentError("tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("tokenizer.ggml.tokens has more than 2^31-1 entries");
  }
  std::vector<std::string> pieces;
  pieces.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string* s = tokens->items[i].AsString();
    if (s == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.ggml.tokens[", i, "] is not a string"));
    }
    pieces.push_back(*s);
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
  TC_ASSIGN_OR_RETURN(int32_t bos, SpecialId(file, "tokenizer.ggml.bos_token_id", 1, vocab));
  TC_ASSIGN_OR_RETURN(int32_t eos, SpecialId(file, "tokenizer.ggml.eos_token_id", 2, vocab));
  TC_ASSIGN_OR_RETURN(int32_t unk, SpecialId(file, "tokenizer.ggml.unknown_token_id", 0, vocab));
  return FromVocab(std::move(pieces), std::move(scores), std::move(types), bos, eos, unk);
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
  std::fill(std::begin(t.byte_tokens_), std::end(t.byte_tokens_), -1);
  t.piece_to_id_.reserve(n);
  for (int32_t id = 0; id < vocab; ++id) {
    const int type = static_cast<int>(types[id]);
    if (type < 0 || type > static_cast<int>(TokenType::kByte)) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", id, " has unknown token type ", type));
    }
    // A NaN score would make the merge order depend on comparison details.
    if (std::isnan(scores[id])) {
      return absl::InvalidArgumentError(absl::StrCat("token ", id, " has a NaN score"));
    }
    if (types[id] == TokenType::kByte) {
      const int byte = ParseByteToken(pieces[id]);
      if (byte < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token ", id, " has type byte but its piece '", absl::CEscape(pieces[id]),
            "' is not of the form <0xNN>"));
      }
      if (t.byte_tokens_[byte] < 0) t.byte_tokens_[byte] = id;
    }
    // On duplicate pieces the lowest id wins, so that encoding is stable.
    t.piece_to_id_.try_emplace(pieces[id], id);
  }
  t.pieces_ = std::move(pieces);
  t.scores_ = std::move(scores);
  t.types_ = std::move(types);
  t.bos_ = bos;
  t.eos_ = eos;
  t.unk_ = unk;
  return t;
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

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> out;
  if (add_bos) out.push_back(bos_);
  if (text.empty()) return out;

  std::string norm;
  norm.reserve(text.size() * 3 + 3);
  norm.append(kSpaceMarker);  // the dummy prefix
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
    const size_t len = SymbolLength(std::string_view(norm).substr(off));
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
      out.push_back(it->second);
      continue;
    }
    for (char c : s) {
      const int32_t id = byte_tokens_[static_cast<uint8_t>(c)];
      out.push_back(id >= 0 ? id : unk_);
    }
  }
  return out;
}

std::string Tokenizer::TokenBytes(int32_t prev, int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  switch (types_[id]) {
    case TokenType::kControl:
      return "";
    case TokenType::kByte:
      return std::string(1, static_cast<char>(ParseByteToken(pieces_[id])));
    default:
      break;
  }
  const std::string& piece = pieces_[id];
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
  if (prev == bos_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids) const {
  StreamingDetokenizer detok(*this);
  std::string out;
  for (int32_t id : ids) out += detok.Push(id);
  out += detok.Flush();
  return out;
}

std::string StreamingDetokenizer::Push(int32_t id) {
  pending_ += tokenizer_.TokenBytes(prev_, id);
  prev_ = id;
  std::string out;
  const size_t consumed = AppendSanitizedUtf8(pending_, /*final=*/false, &out);
  pending_.erase(0, consumed);
  return out;
}

std::string StreamingDetokenizer::Flush() {
  std::string out;
  AppendSanitizedUtf8(pending_, /*final=*/true, &out);
  pending_.clear();
  prev_ = -1;
  return out;
}

}  // namespace thermocline
