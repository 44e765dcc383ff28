// The gateway's logfmt lines (gateway/log.h): fixed leading keys, values quoted and escaped
// exactly when logfmt needs it, numbers and booleans formatted.
#include "gateway/log.h"

#include "gtest/gtest.h"

namespace thermocline::gateway {
namespace {

TEST(GatewayLogTest, FormatsOneLogfmtLine) {
  const std::string line = FormatLogLine(
      "2026-11-29T19:45:17.000001Z", Level::kInfo, "gateway", "request_done",
      {{"request_id", "r-1"}, {"tokens", 12}, {"ok", true}, {"seconds", 0.25},
       {"reason", "stop sequence"}, {"empty", ""}, {"quote", "a\"b\\c"}, {"nl", "x\ny"},
       {"eq", "a=b"}});
  EXPECT_EQ(line,
            "ts=2026-11-29T19:45:17.000001Z level=info component=gateway event=request_done "
            "request_id=r-1 tokens=12 ok=true seconds=0.25 reason=\"stop sequence\" empty=\"\" "
            "quote=\"a\\\"b\\\\c\" nl=\"x\\ny\" eq=\"a=b\"");
}

TEST(GatewayLogTest, EscapesControlBytesAndKeepsUtf8) {
  EXPECT_EQ(LogfmtValue("plain"), "plain");
  EXPECT_EQ(LogfmtValue("caf\xC3\xA9"), "caf\xC3\xA9");
  EXPECT_EQ(LogfmtValue(std::string("a\x01z", 3)), "\"a\\x01z\"");
  EXPECT_EQ(LogfmtValue("tab\there"), "\"tab\\there\"");
  EXPECT_EQ(LevelName(Level::kWarn), "warn");
  EXPECT_EQ(LevelName(Level::kError), "error");
}

}  // namespace
}  // namespace thermocline::gateway
