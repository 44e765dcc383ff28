#include "shared/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shared/tokenizer/utf8.h"

namespace thermocline {

namespace {

// The pattern families of llama.cpp's llm_tokenizer_bpe (src/llama-vocab.cpp, c392e50).
// Non-ASCII characters are written as \x{..} so that no editor or tool can normalize them
// (DeepSeek's letter class holds compatibility characters such as U+212A KELVIN SIGN).
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kTekken =
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kPoro = R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+)";
constexpr const char* kCjk = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
constexpr const char* kDeepseekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})"
    R"(\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A})"
    R"(\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556})"
    R"(\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF})"
    R"(\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D})"
    R"(\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D})"
    R"(\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4})"
    R"(\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4})"
    R"(\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124})"
    R"(\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F})"
    R"(\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F})"
    R"(\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17})"
    R"(\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3})"
    R"(\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF})"
    R"(\x{1E900}-\x{1E943}]+)";
constexpr const char* kDeepseekPunct =
    R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)";

struct Spec {
  std::vector<std::string_view> names;
  std::vector<const char*> regexes;
  bool ignore_merges = false;
  bool add_bos = false;
  bool clean_spaces = true;  // llama.cpp's clean_up_tokenization_spaces default for the name
};

const std::vector<Spec>& Specs() {
  static const std::vector<Spec>* specs = new std::vector<Spec>{
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3"}, {kLlama3}, true, true},
      {{"dbrx", "smaug-bpe"}, {kLlama3}},
      {{"deepseek-llm"},
       {R"([\r\n])", kDeepseekLetters, kDeepseekPunct, R"(\s+$)", kCjk, R"(\p{N}+)"},
       false, false, false},
      {{"deepseek-coder"},
       {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjk, R"(\p{N})"},
       false, false, false},
      {{"deepseek-v3"},
       {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       false, false, false},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}},
      {{"gpt-2", "phi-2", "mpt", "olmo", "jais", "gigachat", "jina-es", "jina-de", "jina-v2-es",
        "jina-v2-de"},
       {kGpt2}},
      {{"starcoder", "refact", "codeshell", "exaone", "minerva-7b"}, {R"(\p{N})", kGpt2}},
      {{"command-r", "smollm"}, {R"(\p{N})", kGpt2}, false, false, false},
      {{"qwen2", "deepseek-r1-qwen"}, {kQwen2}, false, false, false},
      {{"megrez", "stablelm2"}, {kQwen2}},
      {{"bloom", "gpt3-finnish"}, {kPoro}},
      {{"poro-chat"}, {kPoro}, false, false, false},
      {{"viking"}, {kPoro, R"(\p{N})"}, false, false, false},
      {{"tekken"}, {kTekken}, true, true, false},
  };
  return *specs;
}

}  // namespace

struct Pretokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

Pretokenizer::~Pretokenizer() = default;

std::vector<std::string_view> Pretokenizer::KnownNames() {
  std::vector<std::string_view> names;
  for (const Spec& s : Specs()) names.insert(names.end(), s.names.begin(), s.names.end());
  return names;
}

absl::StatusOr<std::shared_ptr<const Pretokenizer>> Pretokenizer::ForName(std::string_view pre) {
  const std::string_view want = pre.empty() ? "default" : pre;
  const Spec* spec = nullptr;
  for (const Spec& s : Specs()) {
    for (std::string_view n : s.names) {
      if (n == want) spec = &s;
    }
  }
  if (spec == nullptr) {
    std::vector<std::string> known;
    for (std::string_view n : KnownNames()) known.emplace_back(n);
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.ggml.pre '", absl::string_view(want.data(), want.size()),
                     "' is not a known BPE pre-tokenizer; known: ", absl::StrJoin(known, ", ")));
  }
  std::shared_ptr<Pretokenizer> p(new Pretokenizer());
  p->name_ = std::string(want);
  p->ignore_merges_ = spec->ignore_merges;
  p->add_bos_ = spec->add_bos;
  p->clean_spaces_ = spec->clean_spaces;
  for (const char* pattern : spec->regexes) {
    auto re = std::make_unique<Regex>();
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    // DOLLAR_ENDONLY: `$` is the end of the piece, as in std::regex (not before a final \n).
    re->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                             PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &error, &error_offset,
                             nullptr);
    if (re->code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(error, msg, sizeof msg);
      return absl::InternalError(absl::StrCat("pre-tokenizer '", p->name_, "': regex ", pattern,
                                              " does not compile at offset ", error_offset, ": ",
                                              reinterpret_cast<const char*>(msg)));
    }
    // Without JIT (not built for this CPU) the interpreter gives the same matches, slower.
    pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);
    p->regexes_.push_back(std::move(re));
  }
  return std::shared_ptr<const Pretokenizer>(std::move(p));
}

std::vector<std::string_view> Pretokenizer::Split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (text.empty()) return pieces;
  pieces.push_back(text);
  std::vector<std::string_view> next;
  for (const auto& re : regexes_) {
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
        pcre2_match_data_create_from_pattern(re->code, nullptr), &pcre2_match_data_free);
    next.clear();
    for (std::string_view piece : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t start = 0;  // where the next unmatched gap begins
      size_t pos = 0;    // where the search resumes
      while (pos < piece.size() && md != nullptr) {
        const int rc = pcre2_match(re->code, subject, piece.size(), pos, PCRE2_NO_UTF_CHECK,
                                   md.get(), nullptr);
        // No match, or a resource limit (not reachable with these patterns): the rest of the
        // piece stays one gap.
        if (rc < 0) break;
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
        const size_t begin = ov[0], end = ov[1];
        if (end == begin) {  // an empty match is no piece; step over one character
          pos = begin + utf8::SymbolLength(piece.substr(begin));
          continue;
        }
        if (begin > start) next.push_back(piece.substr(start, begin - start));
        next.push_back(piece.substr(begin, end - begin));
        start = pos = end;
      }
      if (start < piece.size()) next.push_back(piece.substr(start));
    }
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace thermocline
