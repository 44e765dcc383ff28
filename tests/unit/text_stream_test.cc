// TextStream (gateway/text_stream.h): stop strings across token boundaries, hold-back and
// release of text that might start a stop string, UTF-8 never split (byte-fallback tokens), the
// rule between overlapping stop strings, and, on stories260K's real tokenizer, random stop
// strings against a brute-force scan of the whole decoded text.
#include "gateway/text_stream.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/gguf/gguf.h"
#include "tests/test_support.h"

namespace thermocline::gateway {
namespace {

// A vocabulary of <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF>, then `pieces`
// (ids 259, 260, ...), so that any text can be spelled one byte at a time.
Tokenizer MakeTokenizer(const std::vector<std::string>& pieces) {
  std::vector<std::string> p = {"<unk>", "<s>", "</s>"};
  std::vector<TokenType> t = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    p.push_back(buf);
    t.push_back(TokenType::kByte);
  }
  for (const std::string& s : pieces) {
    p.push_back(s);
    t.push_back(TokenType::kNormal);
  }
  std::vector<float> scores(p.size(), 0.0f);
  auto tok = Tokenizer::FromVocab(p, scores, t, 1, 2, 0);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return *std::move(tok);
}

int32_t Byte(unsigned char b) { return 3 + b; }
constexpr int32_t kPiece0 = 259;

// Pushes every token; returns the streamed text (Finish included unless stopped) and each
// Push's delta text.
struct Streamed {
  std::string text;
  std::vector<std::string> deltas;
  bool stopped = false;
  std::string matched;
};
Streamed Stream(TextStream& ts, const std::vector<int32_t>& ids) {
  Streamed r;
  for (int32_t id : ids) {
    TextStream::Delta d = ts.Push(id);
    r.text += d.text;
    r.deltas.push_back(d.text);
    if (d.stopped) {
      r.stopped = true;
      r.matched = d.matched;
      break;
    }
  }
  if (!r.stopped) {
    r.text += ts.Finish();
    // The final flush (U+FFFD for an unfinished character) can complete a stop string too.
    r.stopped = ts.stopped();
    r.matched = ts.matched();
  }
  return r;
}

// A stop string split over three tokens: nothing of it is ever streamed.
TEST(TextStreamTest, StopStringSplitOverThreeTokens) {
  // 259 "Hello", 260 " wo", 261 "rl", 262 "d!", 263 " more"
  Tokenizer tok = MakeTokenizer({"Hello", "\xE2\x96\x81wo", "rl", "d!", "\xE2\x96\x81more"});
  TextStream ts(tok, {"world"});
  EXPECT_EQ(ts.Push(kPiece0).text, "Hello");
  TextStream::Delta d = ts.Push(kPiece0 + 1);  // " wo": "wo" may start "world"
  EXPECT_EQ(d.text, " ");
  EXPECT_FALSE(d.stopped);
  d = ts.Push(kPiece0 + 2);  // "worl"
  EXPECT_EQ(d.text, "");
  d = ts.Push(kPiece0 + 3);  // "world!" completes the stop
  EXPECT_TRUE(d.stopped);
  EXPECT_EQ(d.text, "");
  EXPECT_EQ(d.matched, "world");
  EXPECT_TRUE(ts.stopped());
  // Later pushes are no-ops that keep saying stopped; Finish has nothing more.
  d = ts.Push(kPiece0 + 4);
  EXPECT_TRUE(d.stopped);
  EXPECT_EQ(d.text, "");
  EXPECT_EQ(d.matched, "world");
  EXPECT_EQ(ts.Finish(), "");
}

// Text held back because it could start a stop string is released as soon as it cannot.
TEST(TextStreamTest, PrefixThatIsNotAStopIsReleased) {
  // 259 "Hello", 260 " wo", 261 "rk"
  Tokenizer tok = MakeTokenizer({"Hello", "\xE2\x96\x81wo", "rk"});
  TextStream ts(tok, {"world"});
  Streamed r = Stream(ts, {kPiece0, kPiece0 + 1, kPiece0 + 2});
  ASSERT_EQ(r.deltas.size(), 3u);
  EXPECT_EQ(r.deltas[1], " ");     // "wo" held
  EXPECT_EQ(r.deltas[2], "work");  // "work" is not a prefix of "world"
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.text, "Hello work");
}

// Held-back text at the end of the stream comes out of Finish.
TEST(TextStreamTest, FinishReleasesHeldText) {
  Tokenizer tok = MakeTokenizer({"Hello", "\xE2\x96\x81wo"});
  TextStream ts(tok, {"world"});
  EXPECT_EQ(ts.Push(kPiece0).text, "Hello");
  EXPECT_EQ(ts.Push(kPiece0 + 1).text, " ");
  EXPECT_EQ(ts.Finish(), "wo");
  EXPECT_FALSE(ts.stopped());
  EXPECT_EQ(ts.Finish(), "");  // once
}

// Multi-byte characters spelled with byte-fallback tokens come out whole, never split, and a
// stop string made of them still matches across those tokens.
TEST(TextStreamTest, MultiByteUtf8NeverSplit) {
  Tokenizer tok = MakeTokenizer({});
  const std::string text = "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80!";
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(Byte(c));
  TextStream ts(tok, {});
  Streamed r = Stream(ts, ids);
  EXPECT_EQ(r.text, text);
  for (const std::string& d : r.deltas) {
    // Every delta is whole characters: no continuation byte starts one, and none ends inside a
    // character (the next delta would start with a continuation byte).
    if (!d.empty()) {
      EXPECT_NE(static_cast<unsigned char>(d[0]) & 0xC0, 0x80) << d;
    }
  }
  // The emoji's four bytes: the first three deltas are empty, the fourth is the emoji.
  const size_t emoji = text.find("\xF0");
  EXPECT_EQ(r.deltas[emoji], "");
  EXPECT_EQ(r.deltas[emoji + 2], "");
  EXPECT_EQ(r.deltas[emoji + 3], "\xF0\x9F\x98\x80");

  TextStream stop(tok, {"\xE6\x9C\xAC\xE8\xAA\x9E"});  // "本語"
  Streamed s = Stream(stop, ids);
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.text, "caf\xC3\xA9 \xE6\x97\xA5");
  // A stop string that begins with the same lead byte as a character of the text holds that
  // character back whole, then releases it whole.
  TextStream near(tok, {"\xE6\x97\xA5\xE6\x97\xA5"});  // "日日"
  Streamed n = Stream(near, ids);
  EXPECT_FALSE(n.stopped);
  EXPECT_EQ(n.text, text);
  for (const std::string& d : n.deltas) {
    if (!d.empty()) {
      EXPECT_NE(static_cast<unsigned char>(d[0]) & 0xC0, 0x80);
    }
  }
  // An unfinished character at the end becomes U+FFFD.
  TextStream cut(tok, {});
  Streamed c = Stream(cut, {Byte('a'), Byte(0xE6), Byte(0x97)});
  EXPECT_EQ(c.text, "a\xEF\xBF\xBD");
}

// Overlapping stop strings: the occurrence that ends first wins.
TEST(TextStreamTest, OverlappingStopStrings) {
  Tokenizer tok = MakeTokenizer({"a", "b", "\xE2\x96\x81" "c", "x"});
  const int32_t a = kPiece0, b = kPiece0 + 1, sp_c = kPiece0 + 2, x = kPiece0 + 3;
  {
    // "x a b c": "ab" completes at the "b" token, before "b c" could.
    TextStream ts(tok, {"ab", "b c"});
    Streamed r = Stream(ts, {x, a, b, sp_c});
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.matched, "ab");
    EXPECT_EQ(r.text, "x");
  }
  {
    // "x b c": only "b c" occurs; "b" was held as its prefix, then cut.
    TextStream ts(tok, {"ab", "b c"});
    Streamed r = Stream(ts, {x, b, sp_c});
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.matched, "b c");
    EXPECT_EQ(r.text, "x");
  }
  {
    // Both end at the same byte: the one that starts first (longer) wins.
    TextStream ts(tok, {"c", "b c"});
    Streamed r = Stream(ts, {x, b, sp_c});
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.matched, "b c");
    EXPECT_EQ(r.text, "x");
  }
  {
    // Empty stop strings are ignored.
    TextStream ts(tok, {""});
    Streamed r = Stream(ts, {x, a});
    EXPECT_FALSE(r.stopped);
    EXPECT_EQ(r.text, "xa");
  }
}

// The reference: the occurrence with the smallest end in the whole decoded text (ties: the
// smallest start), found by trying every position.
struct Expected {
  std::string text;
  bool stopped = false;
  std::string matched;
};
Expected BruteForce(const std::string& full, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= full.size(); ++end) {
    size_t best_start = std::string::npos;
    std::string best;
    for (const std::string& s : stops) {
      if (s.empty() || s.size() > end) continue;
      const size_t start = end - s.size();
      if (full.compare(start, s.size(), s) == 0 && start < best_start) {
        best_start = start;
        best = s;
      }
    }
    if (best_start != std::string::npos) return {full.substr(0, best_start), true, best};
  }
  return {full, false, ""};
}

TEST(TextStreamTest, RandomStopsMatchBruteForceOnStories260K) {
  auto file = GgufFile::Open(testing::ModelPath("stories260K/stories260K.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  auto tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string corpus =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "sunshine. One day, she saw a big, red ball in the park. \"Look, Mom!\" she said. "
      "Caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80 and the dog ran away.";
  const std::vector<int32_t> all = tok->Encode(corpus, /*add_bos=*/true);
  std::mt19937 rng(1234);
  int stopped_runs = 0;
  for (int trial = 0; trial < 400; ++trial) {
    // A random window of the encoded corpus (with BOS when it starts at 0), or random ids.
    std::vector<int32_t> ids;
    if (trial % 4 == 3) {
      std::uniform_int_distribution<int32_t> any(0, tok->vocab_size() - 1);
      for (int i = 0; i < 40; ++i) ids.push_back(any(rng));
    } else {
      std::uniform_int_distribution<size_t> from(0, all.size() - 2);
      const size_t a = from(rng);
      std::uniform_int_distribution<size_t> len(1, all.size() - a);
      ids.assign(all.begin() + a, all.begin() + a + len(rng));
    }
    const std::string full = tok->Decode(ids);
    // 1-3 stop strings: substrings of the decoded text (which may cut characters), pieces of the
    // corpus that may not occur, and arbitrary short strings.
    std::vector<std::string> stops;
    std::uniform_int_distribution<int> n_stops(1, 3), kind(0, 2), slen(1, 8);
    for (int k = n_stops(rng); k > 0; --k) {
      const std::string& src = kind(rng) == 0 || full.empty() ? corpus : full;
      std::uniform_int_distribution<size_t> at(0, src.size() - 1);
      const size_t p = at(rng);
      stops.push_back(src.substr(p, slen(rng)));
      if (kind(rng) == 2) stops.back() = std::string(1, "aeo .,!"[at(rng) % 7]);
    }
    TextStream ts(*tok, stops);
    Streamed r = Stream(ts, ids);
    const Expected e = BruteForce(full, stops);
    std::string why = "trial " + std::to_string(trial) + " text [" + full + "] stops:";
    for (const std::string& s : stops) why += " [" + s + "]";
    ASSERT_EQ(r.stopped, e.stopped) << why;
    ASSERT_EQ(r.text, e.text) << "trial " << trial;
    ASSERT_EQ(r.matched, e.matched) << "trial " << trial;
    stopped_runs += r.stopped ? 1 : 0;
  }
  // Both outcomes were exercised.
  EXPECT_GT(stopped_runs, 50);
  EXPECT_LT(stopped_runs, 390);
}

}  // namespace
}  // namespace thermocline::gateway
