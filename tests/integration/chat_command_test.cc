// `thermocline chat --model` driven through a pipe (and through a terminal): each line of standard input is a user turn,
// and each reply is exactly what `thermocline generate` prints (greedy) for the prompt that
// `thermocline render-template` gives for the conversation so far; /exit ends it; a model
// without a template is refused naming it. Like `generate` in dense mode, chat multiplies the
// FFN whole, so its Q4_0 / K-quant matrices get the interleaved copy (THERMOCLINE_REPACK).
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "shared/model/model.h"
#include "tests/test_support.h"

namespace thermocline {
namespace {

using testing::BinDir;
using testing::InterleavedBytes;
using testing::RunCommand;

void Write(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
}

// A template with no special-token text and no BOS of its own, so that `generate -p` (BOS as
// the vocabulary says, no special-token parsing) tokenizes its output as chat does.
constexpr char kTemplate[] =
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}";

// What `thermocline generate` prints (greedy, 24 tokens) as the replies to `lines`, each on
// the conversation so far rendered by `render-template`, one per line.
// generate_err collects generate's standard error per reply; generate_env, if not empty, is one
// NAME=VALUE for generate's environment.
std::vector<std::string> ExpectedReplies(const std::string& model, const std::string& dir,
                                         const std::vector<std::string>& lines,
                                         std::vector<std::string>* generate_err = nullptr,
                                         const std::string& generate_env = "") {
  nlohmann::ordered_json messages = {{{"role", "system"}, {"content", "You tell stories."}}};
  std::vector<std::string> want;
  for (const std::string& line : lines) {
    messages.push_back({{"role", "user"}, {"content", line}});
    Write(dir + "/messages.json", messages.dump());
    const testing::CommandResult prompt =
        RunCommand({BinDir() + "/thermocline", "render-template", "--template",
                    dir + "/chat.jinja", "--messages", dir + "/messages.json",
                    "--add-generation-prompt"});
    EXPECT_EQ(prompt.exit_code, 0) << prompt.err;
    std::vector<std::string> argv = {"/usr/bin/env"};
    if (!generate_env.empty()) argv.push_back(generate_env);
    for (const std::string& a : {BinDir() + "/thermocline", std::string("generate"),
                                 std::string("-m"), model, std::string("-p"), prompt.out,
                                 std::string("-n"), std::string("24"), std::string("-t"),
                                 std::string("0"), std::string("--threads"), std::string("1")}) {
      argv.push_back(a);
    }
    const testing::CommandResult gen = RunCommand(argv);
    EXPECT_EQ(gen.exit_code, 0) << gen.err;
    if (generate_err != nullptr) generate_err->push_back(gen.err);
    // generate prints the prompt, the completion and a newline.
    EXPECT_EQ(gen.out.rfind(prompt.out, 0), 0u) << gen.out;
    if (gen.out.size() < prompt.out.size() + 1) return want;
    const std::string reply = gen.out.substr(prompt.out.size(), gen.out.size() - prompt.out.size() - 1);
    EXPECT_FALSE(reply.empty());
    want.push_back(reply);
    messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
  return want;
}

std::string ChatCommand(const std::string& model, const std::string& dir) {
  return absl::StrCat(BinDir(), "/thermocline chat --model ", model, " --template ", dir,
                      "/chat.jinja --system 'You tell stories.' -n 24 -t 0 --threads 1");
}

TEST(ChatCommand, RepliesEqualGenerateOnTheRenderedConversation) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  const std::string model = testing::ModelPath("stories260K/stories260K.gguf");
  const std::string dir = testing::TempDir();
  Write(dir + "/chat.jinja", kTemplate);
  Write(dir + "/turns.txt", "Once upon a time\n\nThe little dog\n/exit\nnever read\n");
  const testing::CommandResult chat = RunCommand(
      {"/bin/sh", "-c", absl::StrCat(ChatCommand(model, dir), " < ", dir, "/turns.txt")});
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  std::string want;
  for (const std::string& reply : ExpectedReplies(model, dir, {"Once upon a time", "The little dog"})) {
    want += reply + "\n";
  }
  EXPECT_EQ(chat.out, want);
}

// Chat multiplies the FFN whole, as generate does in dense mode: both report the interleaved
// copies of attention, output and FFN (what Model::InterleaveDenseFfn makes after the load, more
// than the load alone), and their replies are equal (the same matrices in the same layouts give
// the same bits). With THERMOCLINE_REPACK=0 both report none.
TEST(ChatCommand, DenseFfnIsInterleavedAsInGenerate) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  const std::string model = testing::ModelPath("quants/Q4_K_M.gguf");
  auto loaded = Model::Load(model);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const int64_t at_load = (*loaded)->interleaved_bytes();
  ASSERT_TRUE((*loaded)->InterleaveDenseFfn().ok());
  const int64_t with_ffn = (*loaded)->interleaved_bytes();
  ASSERT_GT(with_ffn, at_load);  // the FFN has Q4_K matrices
  const std::string dir = testing::TempDir();
  Write(dir + "/chat.jinja", kTemplate);
  Write(dir + "/turns.txt", "Once upon a time\nThe little dog\n");
  for (const char* repack : {"1", "0"}) {
    const std::string env = std::string("THERMOCLINE_REPACK=") + repack;
    SCOPED_TRACE(env);
    const testing::CommandResult chat = RunCommand(
        {"/bin/sh", "-c",
         absl::StrCat(env, " ", ChatCommand(model, dir), " < ", dir, "/turns.txt")});
    ASSERT_EQ(chat.exit_code, 0) << chat.err;
    const int64_t want = repack[0] == '1' ? with_ffn : 0;
    EXPECT_EQ(InterleavedBytes(chat.err), want) << chat.err;
    std::vector<std::string> generate_err;
    std::string replies;
    for (const std::string& reply : ExpectedReplies(
             model, dir, {"Once upon a time", "The little dog"}, &generate_err, env)) {
      replies += reply + "\n";
    }
    EXPECT_EQ(chat.out, replies);
    ASSERT_EQ(generate_err.size(), 2u);
    for (const std::string& err : generate_err) EXPECT_EQ(InterleavedBytes(err), want) << err;
  }
}

// On a terminal (script(1) gives it a pseudo-terminal) the turns are read through libedit:
// its prompt is shown, and the up arrow recalls the previous turn from the history, so the
// second turn here is the first one again.
TEST(ChatCommand, ATerminalGetsLineEditingAndHistory) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  const std::string model = testing::ModelPath("stories260K/stories260K.gguf");
  const std::string dir = testing::TempDir();
  Write(dir + "/chat.jinja", kTemplate);
  Write(dir + "/tty-turns.txt", "Once upon a time\n\x1b[A\n/exit\n");
  const testing::CommandResult chat = RunCommand(
      {"/bin/sh", "-c",
       absl::StrCat("script -qec \"", ChatCommand(model, dir), "\" /dev/null < ", dir,
                    "/tty-turns.txt")});
  ASSERT_EQ(chat.exit_code, 0) << chat.err << chat.out;
  std::string out;
  for (char c : chat.out) {
    if (c != '\r') out += c;
  }
  EXPECT_NE(out.find("> "), std::string::npos) << out;
  const std::vector<std::string> want =
      ExpectedReplies(model, dir, {"Once upon a time", "Once upon a time"});
  ASSERT_EQ(want.size(), 2u);
  const std::string& first = want[0];
  const std::string& second = want[1];
  ASSERT_NE(first, second);
  const size_t at = out.find(first);
  EXPECT_NE(at, std::string::npos) << out;
  EXPECT_NE(out.find(second, at + first.size()), std::string::npos) << "history recall: " << out;
}

TEST(ChatCommand, ModelWithoutTemplateIsRefusedNamingIt) {
  THERMOCLINE_REQUIRE_SHARED_DATA();
  const std::string model = testing::ModelPath("stories260K/stories260K.gguf");
  const testing::CommandResult r = RunCommand(
      {"/bin/sh", "-c", absl::StrCat(BinDir(), "/thermocline chat --model ", model, " < /dev/null")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("stories260K.gguf has no chat template"), std::string::npos) << r.err;
  const testing::CommandResult both =
      RunCommand({BinDir() + "/thermocline", "chat", "--model", model, "--server", "x:1"});
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("exactly one of --model and --server"), std::string::npos) << both.err;
}

}  // namespace
}  // namespace thermocline
