#include "shared/util/escape.h"

#include <cstdio>

namespace thermocline {

void AppendEscaped(std::string_view text, std::string* out) {
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char esc[8];
          std::snprintf(esc, sizeof(esc), "\\x%02x", c);
          *out += esc;
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
}

}  // namespace thermocline
