// Linked into test binaries every test of which reads ../shared (the e2e, deploy and soak
// suites all serve stories260K): each test starts with THERMOCLINE_REQUIRE_SHARED_DATA (skip
// with the reason; fail when CI is set), without each test saying so.
//
// It is a listener rather than a global Environment: a skip recorded as a test starts (before
// its body) is reported as that test's "[  SKIPPED ]", which ctest counts as skipped, whereas
// this GoogleTest reports tests skipped from an Environment as passed.
#include <gtest/gtest.h>

#include "tests/test_support.h"

namespace thermocline::testing {
namespace {

class RequireSharedData : public ::testing::EmptyTestEventListener {
 public:
  void OnTestStart(const ::testing::TestInfo&) override { THERMOCLINE_REQUIRE_SHARED_DATA(); }
};

[[maybe_unused]] const bool kInstalled = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new RequireSharedData);
  return true;
}();

}  // namespace
}  // namespace thermocline::testing
