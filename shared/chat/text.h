// UTF-8 helpers with Python's str semantics, for the chat-template interpreter: templates index,
// slice, strip and split strings by code point exactly as Jinja2 (Python) does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace thermocline::chat {

// Code points of `s`. Invalid UTF-8 bytes decode as U+FFFD each (input text was validated when
// it entered, so this only matters for strings cut by the engine itself, which never happens).
std::vector<char32_t> DecodeUtf8(std::string_view s);
void AppendUtf8(char32_t c, std::string& out);
std::string EncodeUtf8(const std::vector<char32_t>& cps, size_t begin, size_t end);
// Number of code points.
size_t Utf8Length(std::string_view s);
// Whether `s` is well-formed UTF-8.
bool IsValidUtf8(std::string_view s);

// Python's str.isspace() for one code point (also what `\s` matches in a str regex).
bool IsPySpace(char32_t c);
// Python's str.splitlines() line boundaries: \n \r \v \f \x1c \x1d \x1e \x85 U+2028 U+2029
// (\r\n counts once).
bool IsPyLineBreak(char32_t c);

// str.strip / lstrip / rstrip: with `chars` null, whitespace; otherwise any code point of *chars.
std::string PyStrip(std::string_view s, const std::string* chars, bool left, bool right);
// str.split(sep, maxsplit) / str.split() (sep null: runs of whitespace, no empty items).
std::vector<std::string> PySplit(std::string_view s, const std::string* sep, int64_t maxsplit);
// str.rsplit(sep, maxsplit).
std::vector<std::string> PyRSplit(std::string_view s, const std::string* sep, int64_t maxsplit);
// str.splitlines() without keepends.
std::vector<std::string> PySplitLines(std::string_view s);
// str.replace(old, new, count); count < 0 replaces all. An empty `from` inserts between code
// points, as Python does.
std::string PyReplace(std::string_view s, std::string_view from, std::string_view to,
                      int64_t count);
// str.upper() / str.lower(): full Unicode case mapping (ß -> SS, final sigma), through ICU.
std::string PyUpper(std::string_view s);
std::string PyLower(std::string_view s);
// str.isupper() / str.islower(): no cased character of the other case, and at least one cased.
bool PyIsUpper(std::string_view s);
bool PyIsLower(std::string_view s);
// str.title() / str.capitalize(), Unicode-aware like the rest (titlecase, then lowercase).
std::string PyTitle(std::string_view s);
std::string PyCapitalize(std::string_view s);

// Python's repr() of a str: single quotes unless the text holds ' and no ", escapes \\ \n \r
// \t, other non-printable code points as \xNN / \uNNNN / \UNNNNNNNN.
std::string PyStrRepr(std::string_view s);
// markupsafe.escape: & < > " ' as &amp; &lt; &gt; &#34; &#39;.
std::string HtmlEscape(std::string_view s);
// json.dumps(s, ensure_ascii=False) of a str.
std::string JsonQuote(std::string_view s);
// Python's repr() of a float ("1.0", "1e+16", "inf", "nan").
std::string PyFloatRepr(double x);

}  // namespace thermocline::chat
