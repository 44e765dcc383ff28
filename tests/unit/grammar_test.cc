// GBNF parsing and matching (shared/grammar/gbnf.h, matcher.h), JSON schema compilation
// (json_schema.h) and token masks (token_mask.h) against a brute-force reference on
// SentencePiece and byte-level BPE vocabularies.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "shared/grammar/gbnf.h"
#include "shared/grammar/json_schema.h"
#include "shared/grammar/matcher.h"
#include "shared/grammar/token_mask.h"
#include "shared/tokenizer/tokenizer.h"
#include "tests/test_support.h"

namespace thermocline::grammar {
namespace {

std::shared_ptr<const Grammar> Parse(const std::string& text) {
  absl::StatusOr<Grammar> g = ParseGbnf(text);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << text;
  if (!g.ok()) return nullptr;
  return std::make_shared<const Grammar>(*std::move(g));
}

// Whether `s` is a whole sentence of the grammar (kPrefix: a prefix of one).
enum Verdict { kReject, kPrefix, kSentence };
Verdict Match(const std::shared_ptr<const Grammar>& g, const std::string& s) {
  Matcher m(g);
  if (!m.Accept(s)) return kReject;
  return m.CanEnd() ? kSentence : kPrefix;
}

std::string ParseError(const std::string& text) {
  absl::StatusOr<Grammar> g = ParseGbnf(text);
  EXPECT_FALSE(g.ok()) << text;
  return g.ok() ? "" : std::string(g.status().message());
}

TEST(Gbnf, LiteralsClassesAndRepetition) {
  auto g = Parse(R"(root ::= "ab" [0-9]+ ("x" | "yz")? [^a-c]{2,3} .
)");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Match(g, "ab1xdd!"), kSentence);
  EXPECT_EQ(Match(g, "ab123yzddd\xC3\xA9"), kSentence);  // . matches one code point (é)
  EXPECT_EQ(Match(g, "ab1dd!"), kSentence);
  EXPECT_EQ(Match(g, "ab"), kPrefix);
  EXPECT_EQ(Match(g, "ab1xd"), kPrefix);
  EXPECT_EQ(Match(g, "abx"), kReject);        // + needs one digit
  EXPECT_EQ(Match(g, "ab1xad!"), kReject);    // a is excluded by [^a-c]
  EXPECT_EQ(Match(g, "ab1xdddd!"), kReject);  // {2,3}
  EXPECT_EQ(Match(g, "ab1xdd!!!"), kReject);  // . is one character after at most 3
}

TEST(Gbnf, EscapesRulesCommentsAndNewlines) {
  auto g = Parse(R"(# a comment
root ::= greeting ("," ws greeting)*   # trailing comment
greeting ::= "h\x69" | "\u00e9t\u00E9" | "q\"\\\n" | [\t\]-]
ws ::= (
  " " |
  "\t"
)?
)");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Match(g, "hi"), kSentence);
  EXPECT_EQ(Match(g, "hi, \xC3\xA9t\xC3\xA9,q\"\\\n"), kSentence);
  EXPECT_EQ(Match(g, "hi,\t]"), kSentence);
  EXPECT_EQ(Match(g, "hi,-"), kSentence);
  EXPECT_EQ(Match(g, "hi,  hi"), kReject);
  EXPECT_EQ(Match(g, "ha"), kReject);
}

TEST(Gbnf, RecursionAndEmptyAlternatives) {
  auto g = Parse("root ::= \"(\" root \")\" | \"\"\n");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Match(g, ""), kSentence);
  EXPECT_EQ(Match(g, "((()))"), kSentence);
  EXPECT_EQ(Match(g, "(()"), kPrefix);
  EXPECT_EQ(Match(g, "())"), kReject);
  auto empty = Parse("root ::= \"\"? \"\"* \"\"{2,5} \"a\"\n");  // found by validate_fuzzer
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(Match(empty, "a"), kSentence);
  auto counted = Parse("root ::= \"a\"{3} \"b\"{0,2} \"c\"{2,}\n");
  ASSERT_NE(counted, nullptr);
  EXPECT_EQ(Match(counted, "aaacc"), kSentence);
  EXPECT_EQ(Match(counted, "aaabbcccc"), kSentence);
  EXPECT_EQ(Match(counted, "aabcc"), kReject);
  EXPECT_EQ(Match(counted, "aaabbbcc"), kReject);
  EXPECT_EQ(Match(counted, "aaac"), kPrefix);
}

TEST(Gbnf, Utf8ByteByByte) {
  auto g = Parse("root ::= [\\u00e0-\\u00ff] \"\\U0001F600\"\n");
  ASSERT_NE(g, nullptr);
  Matcher m(g);
  EXPECT_TRUE(m.Accept("\xC3"));       // lead of U+00C0..U+00FF: can still become à..ÿ
  EXPECT_FALSE(m.Accept("\x80"));      // U+00C0 is below the class
  EXPECT_TRUE(m.Accept("\xA9"));       // é
  EXPECT_TRUE(m.Accept("\xF0\x9F"));   // half of U+1F600
  EXPECT_FALSE(m.CanEnd());
  EXPECT_TRUE(m.Accept("\x98\x80"));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_TRUE(m.IsComplete());
  // Overlong, surrogate and stray bytes never match, even where `.` would.
  auto any = Parse("root ::= .*\n");
  ASSERT_NE(any, nullptr);
  EXPECT_EQ(Match(any, "\xC0\xAF"), kReject);
  EXPECT_EQ(Match(any, "\xE0\x80"), kReject);
  EXPECT_EQ(Match(any, "\xED\xA0\x80"), kReject);
  EXPECT_EQ(Match(any, "\x80"), kReject);
  EXPECT_EQ(Match(any, "\xFF"), kReject);
  EXPECT_EQ(Match(any, "ok \xE2\x82\xAC"), kSentence);
}

TEST(Gbnf, ErrorsNameLineColumnAndConstruct) {
  EXPECT_EQ(ParseError("root ::= \"abc\n"), "line 1, column 10: unterminated string literal");
  EXPECT_EQ(ParseError("root ::= [a-z\n"), "line 1, column 10: unterminated character class");
  EXPECT_EQ(ParseError("root ::= x\n"), "line 1, column 10: rule 'x' is used but not defined");
  EXPECT_EQ(ParseError("a ::= \"x\"\n"), "line 1, column 1: the grammar has no rule named 'root'");
  EXPECT_EQ(ParseError("root ::= \"a\"\nroot ::= \"b\"\n"),
            "line 2, column 1: rule 'root' is defined twice");
  EXPECT_EQ(ParseError("root ::= * \"a\"\n"),
            "line 1, column 10: '*' repeats nothing (no item before it)");
  EXPECT_EQ(ParseError("root ::= \"a\"{3,1}\n"),
            "line 1, column 13: repetition {3,1} has max < min");
  EXPECT_EQ(ParseError("root ::= \"a\"{5000}\n"),
            "line 1, column 14: repetition count exceeds 1000");
  EXPECT_EQ(ParseError("root ::= \"\\q\"\n"),
            "line 1, column 11: unknown escape \\q in a string literal");
  EXPECT_EQ(ParseError("root ::= [z-a]\n"),
            "line 1, column 13: character class range ends below its start (U+007A to U+0061)");
  EXPECT_EQ(ParseError("root ::= (\"a\" \"b\"\n"), "line 2, column 1: unterminated group: expected )");
  EXPECT_EQ(ParseError("root ::= \"a\" )\n"),
            "line 1, column 14: unexpected ')' in rule 'root' (expected a newline or the end)");
  EXPECT_EQ(ParseError("root ::= \"a\"\n  | \"b\"\n"), "line 2, column 3: expected a rule name");
  EXPECT_EQ(ParseError("root ::= x\nx ::= y \"a\"\ny ::= \"\" | x\n"),
            "line 2, column 1: rule 'x' is left-recursive (x -> y -> x without matching a "
            "character); rewrite it with repetition");
  EXPECT_EQ(ParseError("root ::= " + std::string(200, '(') + "\"a\"" + std::string(200, ')')),
            "line 1, column 138: groups nest deeper than 128 levels");
  // Exponentially many expansion paths to the same start (2^30) are refused, not run.
  std::string ambiguous = "root ::= ";
  for (int i = 0; i < 30; ++i) ambiguous += "(\"\" | \"\") ";
  EXPECT_EQ(ParseError(ambiguous + "\"x\"\n"),
            "line 1, column 1: the grammar is too ambiguous: its start expands in more than "
            "100000 steps");
  // Repeating something that can be empty is left recursion too (x* never ends).
  EXPECT_NE(ParseError("root ::= (\"a\"?)*\n").find("left-recursive"), std::string::npos);
}

// --- JSON schema ---

std::shared_ptr<const Grammar> FromSchema(const std::string& schema) {
  absl::StatusOr<std::string> gbnf = JsonSchemaToGbnf(schema);
  EXPECT_TRUE(gbnf.ok()) << gbnf.status() << "\n" << schema;
  if (!gbnf.ok()) return nullptr;
  return Parse(*gbnf);
}

TEST(JsonSchema, ObjectsWithRequiredAndOptionalProperties) {
  auto g = FromSchema(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 5},
      "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}, "minItems": 1, "maxItems": 2},
      "ok": {"type": ["boolean", "null"]}},
    "required": ["name", "ok"], "additionalProperties": false})");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Match(g, R"({"name": "bob","ok":true})"), kSentence);
  EXPECT_EQ(Match(g, R"({"name":"bob", "age": -12, "tags": ["a", 3],"ok":null})"), kSentence);
  EXPECT_EQ(Match(g, R"({"name":"bob","tags":["b"],"ok":false})"), kSentence);
  EXPECT_EQ(Match(g, R"({"name":"bobby1","ok":true})"), kReject);   // maxLength 5
  EXPECT_EQ(Match(g, R"({"name":"b","tags":[],"ok":true})"), kReject);  // minItems 1
  EXPECT_EQ(Match(g, R"({"name":"b","tags":["a","a","a"])"), kReject);  // maxItems 2
  EXPECT_EQ(Match(g, R"({"age":1,"name":"b","ok":true})"), kReject);    // fixed order
  EXPECT_EQ(Match(g, R"({"name":"b"})"), kReject);                      // ok is required
  EXPECT_EQ(Match(g, R"({"name":"b",)"), kPrefix);
  EXPECT_EQ(Match(g, R"({"name":"b","ok":true,"x":1})"), kReject);
  EXPECT_EQ(Match(g, R"({ "name":"b","ok":true})"), kReject);  // no space after {
}

TEST(JsonSchema, RefsAnyOfConstNumbersAndJsonObject) {
  auto g = FromSchema(R"({"$defs": {"node": {"type": "object",
      "properties": {"v": {"type": "number"}, "next": {"anyOf": [{"$ref": "#/$defs/node"},
                                                             {"type": "null"}]}},
      "required": ["v", "next"]}},
    "type": "object", "properties": {"head": {"$ref": "#/$defs/node"}, "k": {"const": "x"}},
    "required": ["head", "k"]})");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Match(g, R"({"head":{"v":1.5e3,"next":{"v":-0.25,"next":null}},"k":"x"})"),
            kSentence);
  EXPECT_EQ(Match(g, R"({"head":{"v":01,"next":null},"k":"x"})"), kReject);
  EXPECT_EQ(Match(g, R"({"head":{"v":1,"next":null},"k":"y"})"), kReject);
  auto obj = Parse(JsonObjectGbnf());
  ASSERT_NE(obj, nullptr);
  EXPECT_EQ(Match(obj, R"({"a": [1, {"b": "\u00e9\n"}, null, true],"c":{}})"), kSentence);
  EXPECT_EQ(Match(obj, R"([1])"), kReject);
  EXPECT_EQ(Match(obj, "{\"a\":\"\x01\"}"), kReject);  // raw control characters
  auto map = FromSchema(R"({"type": "object", "additionalProperties": {"type": "integer"}})");
  ASSERT_NE(map, nullptr);
  EXPECT_EQ(Match(map, R"({"x": 1, "y":2})"), kSentence);
  EXPECT_EQ(Match(map, R"({"x": "1"})"), kReject);
}

std::string SchemaError(const std::string& schema) {
  absl::StatusOr<std::string> g = JsonSchemaToGbnf(schema);
  EXPECT_FALSE(g.ok()) << schema;
  return g.ok() ? "" : std::string(g.status().message());
}

TEST(JsonSchema, RefusesWhatItCannotCompileNamingConstructAndPath) {
  EXPECT_EQ(SchemaError(R"({"type":"object","properties":{"name":{"type":"string","pattern":"a+"}}})"),
            "pattern at $.properties.name is not supported");
  EXPECT_EQ(SchemaError(R"({"type":"array","items":{"type":"integer","minimum":0}})"),
            "minimum at $.items is not supported");
  EXPECT_EQ(SchemaError(R"({"anyOf":[{"type":"string"},{"allOf":[]}]})"),
            "allOf at $.anyOf[1] is not supported");
  EXPECT_EQ(SchemaError(R"({"$ref":"http://example.com/s.json"})"),
            "$ref \"http://example.com/s.json\" (only #, #/$defs/NAME and #/definitions/NAME) "
            "at $.$ref is not supported");
  EXPECT_EQ(SchemaError(R"({"$ref":"#/$defs/missing"})"),
            "$.$ref: $ref \"#/$defs/missing\" names no schema in $defs");
  EXPECT_EQ(SchemaError(R"({"type":"strin"})"), "$.type: unknown type \"strin\"");
  EXPECT_EQ(SchemaError(R"({"type":"array","maxItems":5000})"),
            "maxItems above 1000 at $.maxItems is not supported");
  EXPECT_EQ(SchemaError("{"), SchemaError("{").substr(0, 0) + SchemaError("{"));
  EXPECT_EQ(SchemaError("{").rfind("the schema is not valid JSON: ", 0), 0u);
  EXPECT_NE(SchemaError(R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})")
                .find("left-recursive"),
            std::string::npos);
}

// --- token masks against decoding every token and asking the matcher ---

void CheckMasksAlongRandomWalks(const std::string& vocab_path, const std::string& gbnf,
                                int walks, int steps) {
  absl::StatusOr<Tokenizer> tok = Tokenizer::Load(vocab_path);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto g = Parse(gbnf);
  ASSERT_NE(g, nullptr);
  VocabTrie trie(*tok);
  MaskComputer masks(g);
  std::mt19937 rng(7);
  std::vector<uint8_t> mask;
  int checked = 0;
  for (int w = 0; w < walks; ++w) {
    Matcher m(g);
    for (int step = 0; step < steps && !m.IsComplete(); ++step) {
      const int32_t n = masks.Compute(m.state(), trie, &mask);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < tok->vocab_size(); ++id) {
        const std::string bytes = tok->TokenBytes(-1, id);
        Matcher ref = m;
        const bool want = !bytes.empty() && ref.Accept(bytes);
        ASSERT_EQ(mask[id] != 0, want) << "token " << id << " '" << bytes << "' at step " << step
                                       << " of walk " << w;
        if (want) allowed.push_back(id);
      }
      ASSERT_EQ(n, static_cast<int32_t>(allowed.size()));
      ++checked;
      if (allowed.empty()) break;
      const int32_t pick = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.Accept(tok->TokenBytes(-1, pick)));
    }
  }
  EXPECT_GT(checked, walks);
}

constexpr const char* kMixedGrammar = R"(root ::= "{" ws "\"k\":" ws (num | str | "[" ws (num ("," ws num)*)? "]") ws "}" tail
num ::= "-"? [0-9]{1,4} ("." [0-9]{1,3})?
str ::= "\"" ([^"\\\n] | "\\" ["\\n])* "\""
ws ::= [ \n]?
tail ::= "" | " ok" | " \u00e9t\u00e9 \U0001F600"
)";

TEST(TokenMask, SentencePieceByteFallbackMatchesBruteForce) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  CheckMasksAlongRandomWalks(testing::ModelPath("stories260K/stories260K.gguf"), kMixedGrammar,
                             20, 40);
  CheckMasksAlongRandomWalks(testing::SharedDataDir() + "/tokenizers/ggml-vocab-llama-spm.gguf",
                             kMixedGrammar, 3, 25);
}

TEST(TokenMask, ByteLevelBpeMatchesBruteForce) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  CheckMasksAlongRandomWalks(testing::SharedDataDir() + "/tokenizers/ggml-vocab-gpt-2.gguf",
                             kMixedGrammar, 3, 25);
  absl::StatusOr<std::string> schema = JsonSchemaToGbnf(
      R"({"type":"object","properties":{"name":{"type":"string"},"n":{"type":"integer"}},
          "required":["name","n"]})");
  ASSERT_TRUE(schema.ok()) << schema.status();
  CheckMasksAlongRandomWalks(testing::SharedDataDir() + "/tokenizers/ggml-vocab-gpt-2.gguf",
                             *schema, 2, 20);
}

// Random token walks through a schema's masks end in text a real JSON parser reads, holding
// what the schema says.
TEST(TokenMask, WalksThroughASchemaGiveValidJson) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  absl::StatusOr<Tokenizer> tok = Tokenizer::Load(testing::ModelPath("stories260K/stories260K.gguf"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  absl::StatusOr<std::string> gbnf = JsonSchemaToGbnf(
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},
          "kind":{"enum":["cat","dog"]},"n":{"type":"integer"}},"required":["name","kind"]})");
  ASSERT_TRUE(gbnf.ok()) << gbnf.status();
  auto g = Parse(*gbnf);
  ASSERT_NE(g, nullptr);
  VocabTrie trie(*tok);
  MaskComputer masks(g);
  std::mt19937 rng(11);
  std::vector<uint8_t> mask;
  for (int w = 0; w < 30; ++w) {
    Matcher m(g);
    std::string text;
    for (int step = 0; step < 200 && !m.IsComplete(); ++step) {
      masks.Compute(m.state(), trie, &mask);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < tok->vocab_size(); ++id) {
        if (mask[id]) allowed.push_back(id);
      }
      // Stop where the grammar allows it half of the time (as an end token would).
      if (allowed.empty() || (m.CanEnd() && rng() % 2 == 0)) break;
      const int32_t pick = allowed[rng() % allowed.size()];
      text += tok->TokenBytes(-1, pick);
      ASSERT_TRUE(m.Accept(tok->TokenBytes(-1, pick)));
    }
    if (!m.CanEnd()) continue;  // ran out of steps inside a string
    nlohmann::json j = nlohmann::json::parse(text);  // throws (fails) if not JSON
    ASSERT_TRUE(j.is_object()) << text;
    ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << text;
    EXPECT_LE(j["name"].get<std::string>().size(), 8u * 4) << text;
    ASSERT_TRUE(j.contains("kind")) << text;
    EXPECT_TRUE(j["kind"] == "cat" || j["kind"] == "dog") << text;
    if (j.contains("n")) {
      EXPECT_TRUE(j["n"].is_number_integer()) << text;
    }
  }
}

}  // namespace
}  // namespace thermocline::grammar
