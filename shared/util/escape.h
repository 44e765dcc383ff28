// C-style escapes for text written for people or logs from bytes nobody vetted (file metadata,
// request fields): \" \\ \n \r \t, and \xNN for every other control byte, so that such text can
// neither drive a terminal nor break a line or a quoted value. Every other byte, UTF-8
// included, is written as it is. logfmt's values and `thermocline info` both write this form
// (shared/util/logfmt.h reads it back).
#pragma once

#include <string>
#include <string_view>

namespace thermocline {

void AppendEscaped(std::string_view text, std::string* out);

}  // namespace thermocline
