// thermocline-gateway over real gRPC: greedy streams equal local generation, concurrent streams
// equal single ones, every token exactly once; bad requests refused with the right code and a
// message naming the field; cancellation and deadlines free the slot; the tokenizer calls,
// model info and reflection.
#include <algorithm>
#include <atomic>
#include <fstream>
#include <limits>
#include <thread>

#include <google/protobuf/descriptor.pb.h>

#include "absl/strings/str_cat.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "tests/e2e/gateway_harness.h"

namespace thermocline::testing {
namespace {

std::string Unique(const std::string& name) { return absl::StrCat("e2e-", name, "-", getpid()); }

TEST(GatewayGenerate, GreedyStreamEqualsLocalGeneration) {
  Gateway gw(Unique("greedy"));
  const std::string prompt = "Once upon a time";
  const Completion c = gw.Generate(Greedy(prompt, 48));
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  // `thermocline generate -t 0 --split --hot-fraction 0.5` prints the prompt, the completion
  // and a newline: the same text must come over gRPC.
  CommandResult local = RunCommand({absl::StrCat(BinDir(), "/thermocline"), "generate", "-m", Stories260K(),
                                    "-p", prompt, "-n", "48", "-t", "0", "--split",
                                    "--hot-fraction", "0.5", "--instance", Unique("local")});
  ASSERT_EQ(local.exit_code, 0) << local.err;
  EXPECT_EQ(absl::StrCat(prompt, c.text, "\n"), local.out);
  // Every token exactly once, one per chunk, and the ids spell the text.
  EXPECT_EQ(c.chunks, static_cast<int>(c.ids.size()));
  EXPECT_EQ(c.final.usage().completion_tokens(), static_cast<int>(c.ids.size()));
  grpc::ClientContext ctx;
  v1::DetokenizeRequest dreq;
  for (int32_t id : c.ids) dreq.add_token_ids(id);
  v1::DetokenizeResponse dresp;
  ASSERT_TRUE(gw.stub().Detokenize(&ctx, dreq, &dresp).ok());
  EXPECT_EQ(dresp.text(), c.text);
  EXPECT_TRUE(c.final.finish_reason() == v1::FINISH_REASON_LENGTH ||
              c.final.finish_reason() == v1::FINISH_REASON_EOS);
}

// TEAL on every projection (--sparsity teal with a calibrated profile): the spawned workers
// split the FFN's inputs between them, and the stream is `generate --split`'s text under the
// same flags. The gateway's --mlock reaches the cpu worker, which locks its TEAL copies too.
// Attach mode refuses the flags (the workers take them on their own lines).
TEST(GatewayGenerate, TealStreamEqualsLocalSplitGeneration) {
  const std::string thermocline = absl::StrCat(BinDir(), "/thermocline");
  const std::string profile = absl::StrCat(TempDir(), "/teal-", getpid(), ".gguf");
  const CommandResult cal = CalibrateTealProfile(Stories260K(), profile);
  ASSERT_EQ(cal.exit_code, 0) << cal.err;
  const std::vector<std::string> teal = {"--sparsity", "teal",           "--teal-sparsity",
                                         "0.5",        "--teal-profile", profile};
  const std::string prompt = "Once upon a time";
  std::string text;
  {
    std::vector<std::string> spawn = teal;
    spawn.push_back("--mlock");
    Gateway gw(Unique("teal"), spawn);
    const Completion c = gw.Generate(Greedy(prompt, 32));
    ASSERT_TRUE(c.status.ok()) << c.status.error_message();
    text = c.text;
    const std::string log = gw.Log();
    EXPECT_NE(log.find("event=teal"), std::string::npos) << log;
    EXPECT_EQ(log.find("locked=false"), std::string::npos) << log;
    EXPECT_NE(log.find("locked=true"), std::string::npos) << log;
  }
  std::vector<std::string> local = {thermocline,   "generate",   "-m",
                                    Stories260K(), "-p",         prompt,
                                    "-n",          "32",         "-t",
                                    "0",           "--split",    "--hot-fraction",
                                    "0.5",         "--instance", Unique("teal-local")};
  local.insert(local.end(), teal.begin(), teal.end());
  CommandResult want = RunCommand(local);
  ASSERT_EQ(want.exit_code, 0) << want.err;
  EXPECT_EQ(absl::StrCat(prompt, text, "\n"), want.out);
  // TEAL changed the text: the flags reached the workers.
  local.resize(local.size() - teal.size());
  CommandResult dense = RunCommand(local);
  ASSERT_EQ(dense.exit_code, 0) << dense.err;
  EXPECT_NE(dense.out, want.out);

  std::vector<std::string> attach = {absl::StrCat(BinDir(), "/thermocline-gateway"),
                                     "--model",
                                     Stories260K(),
                                     "--workers",
                                     "attach",
                                     "--instance",
                                     Unique("teal-attach")};
  attach.insert(attach.end(), teal.begin(), teal.end());
  CommandResult refused = RunCommand(attach);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("give them to both workers"), std::string::npos) << refused.err;
}

TEST(GatewayGenerate, SixteenConcurrentStreamsEqualSingleStreams) {
  Gateway gw(Unique("concurrent"), {"--max-batch", "4", "--kv-slots", "4", "--prefill-chunk", "8"});
  const char* kStarts[] = {"Once upon a time", "The little dog", "Lily wanted", "Tom and Sue",
                           "One day, a bird", "The sun was", "A big red ball", "Mom said",
                           "There was a girl", "The cat sat", "In the park", "Ben had a toy",
                           "The old tree", "Sara liked to", "A small boat", "The happy frog"};
  std::vector<v1::GenerateRequest> reqs;
  for (const char* p : kStarts) {
    v1::GenerateRequest r = Greedy(p, 32);
    r.set_logprobs(true);
    r.set_top_logprobs(2);
    reqs.push_back(r);
  }
  std::vector<Completion> single;
  for (const auto& r : reqs) {
    single.push_back(gw.Generate(r));
    ASSERT_TRUE(single.back().status.ok()) << single.back().status.error_message();
  }
  std::vector<Completion> together(reqs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) {
    threads.emplace_back([&, i] { together[i] = gw.Generate(reqs[i]); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE(kStarts[i]);
    ASSERT_TRUE(together[i].status.ok()) << together[i].status.error_message();
    EXPECT_EQ(together[i].ids, single[i].ids);
    EXPECT_EQ(together[i].text, single[i].text);
    EXPECT_EQ(together[i].chunks, static_cast<int>(together[i].ids.size()));
    EXPECT_EQ(together[i].final.usage().completion_tokens(),
              static_cast<int>(together[i].ids.size()));
    EXPECT_EQ(together[i].final.finish_reason(), single[i].final.finish_reason());
  }
}

TEST(GatewayGenerate, BadRequestsAreRefusedNamingTheField) {
  Gateway gw(Unique("bad"));
  using grpc::StatusCode;
  struct Case {
    std::string what;
    std::function<void(v1::GenerateRequest&)> edit;
    std::string names;  // a substring the message must hold
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<Case> cases = {
      {"no prompt", [](auto& r) { r.clear_text(); }, "prompt"},
      {"empty text", [](auto& r) { r.set_text(""); }, "prompt text"},
      {"empty token ids", [](auto& r) { r.mutable_token_ids(); }, "token_ids"},
      {"token id out of vocab", [](auto& r) { r.mutable_token_ids()->add_ids(1 << 20); }, "token_ids[0]"},
      {"negative token id", [](auto& r) { r.mutable_token_ids()->add_ids(1); r.mutable_token_ids()->add_ids(-3); }, "token_ids[1]"},
      {"max_new_tokens 0", [](auto& r) { r.set_max_new_tokens(0); }, "max_new_tokens"},
      {"max_new_tokens negative", [](auto& r) { r.set_max_new_tokens(-5); }, "max_new_tokens"},
      {"max_new_tokens huge", [](auto& r) { r.set_max_new_tokens(1 << 30); }, "max_new_tokens"},
      {"beyond context", [](auto& r) { r.set_max_new_tokens(254); }, "exceeds the context"},
      {"negative temperature", [](auto& r) { r.set_temperature(-1); }, "temperature must be >= 0, got -1"},
      {"NaN temperature", [nan](auto& r) { r.set_temperature(nan); }, "temperature"},
      {"top_k negative", [](auto& r) { r.set_top_k(-1); }, "top_k"},
      {"top_p 0", [](auto& r) { r.set_top_p(0); }, "top_p"},
      {"top_p 1.5", [](auto& r) { r.set_top_p(1.5f); }, "top_p"},
      {"min_p 2", [](auto& r) { r.set_min_p(2); }, "min_p"},
      {"repetition_penalty 0", [](auto& r) { r.set_repetition_penalty(0); }, "repetition_penalty"},
      {"presence_penalty 3", [](auto& r) { r.set_presence_penalty(3); }, "presence_penalty"},
      {"frequency_penalty inf", [](auto& r) { r.set_frequency_penalty(std::numeric_limits<float>::infinity()); }, "frequency_penalty"},
      {"too many stop strings", [](auto& r) { for (int i = 0; i < 17; ++i) r.add_stop(std::string(1, 'x')); }, "stop"},
      {"empty stop string", [](auto& r) { r.add_stop(std::string("ok")); r.add_stop(std::string()); }, "stop[1]"},
      {"stop string too long", [](auto& r) { r.add_stop(std::string(300, 'a')); }, "stop[0]"},
      {"stop token out of vocab", [](auto& r) { r.add_stop_token_ids(999999); }, "stop_token_ids[0]"},
      {"top_logprobs 21", [](auto& r) { r.set_logprobs(true); r.set_top_logprobs(21); }, "top_logprobs"},
      {"top_logprobs without logprobs", [](auto& r) { r.set_top_logprobs(3); }, "top_logprobs"},
      {"request_id with spaces", [](auto& r) { r.set_request_id("a b"); }, "request_id"},
      {"request_id too long", [](auto& r) { r.set_request_id(std::string(200, 'r')); }, "request_id"},
      {"prompt text too long", [](auto& r) { r.set_text(std::string(70000, 'a')); }, "prompt text"},
  };
  ASSERT_GE(cases.size(), 20u);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    v1::GenerateRequest r = Greedy("Once upon a time", 8);
    c.edit(r);
    const Completion got = gw.Generate(r);
    EXPECT_EQ(got.status.error_code(), StatusCode::INVALID_ARGUMENT) << got.status.error_message();
    EXPECT_NE(got.status.error_message().find(c.names), std::string::npos)
        << "message: " << got.status.error_message();
    EXPECT_TRUE(got.ids.empty());
  }
  {  // the other calls validate too
    grpc::ClientContext ctx;
    v1::DetokenizeRequest d;
    d.add_token_ids(-1);
    v1::DetokenizeResponse resp;
    const grpc::Status s = gw.stub().Detokenize(&ctx, d, &resp);
    EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("token_ids[0]"), std::string::npos) << s.error_message();
  }
  EXPECT_EQ(gw.Health(), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(gw.Health("thermocline.v1.Generation"), grpc::health::v1::HealthCheckResponse::SERVING);
  const Completion good = gw.Generate(Greedy("Once upon a time", 8));
  EXPECT_TRUE(good.status.ok()) << good.status.error_message();
  EXPECT_FALSE(good.ids.empty());
}

// A long request that only a cancellation ends (ignore_eos, nearly the whole context).
v1::GenerateRequest Long() {
  v1::GenerateRequest r = Greedy("Once upon a time", 2000);
  r.set_ignore_eos(true);
  return r;
}

TEST(GatewayGenerate, DeadlineAndCancellationFreeTheSlot) {
  Gateway gw(Unique("deadline"), {"--max-batch", "1", "--kv-slots", "1", "--max-queue", "4",
                                  "--context", "2048"});
  grpc::ClientContext a_ctx;
  auto a_reader = gw.stub().Generate(&a_ctx, Long());
  v1::GenerateResponse first;
  ASSERT_TRUE(a_reader->Read(&first));  // A holds the only slot
  // B waits behind A; its deadline passes while it waits and it leaves the queue.
  const Completion b = gw.Generate(Greedy("The little dog", 8), [](grpc::ClientContext& ctx) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  });
  EXPECT_EQ(b.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << b.status.error_message();
  EXPECT_TRUE(b.ids.empty());
  // C waits behind A; A is cancelled; C can only complete if A's slot was freed.
  Completion c;
  std::thread tc([&] { c = gw.Generate(Greedy("Lily wanted", 8)); });
  a_ctx.TryCancel();
  v1::GenerateResponse rest;
  int a_chunks = 1;
  while (a_reader->Read(&rest)) ++a_chunks;
  EXPECT_EQ(a_reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_LT(a_chunks, 2000);
  tc.join();
  EXPECT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_EQ(c.final.usage().completion_tokens(), static_cast<int>(c.ids.size()));
  // A running request whose deadline passes ends the same way (the handler sees the call
  // cancelled): the next request runs.
  const Completion d = gw.Generate(Long(), [](grpc::ClientContext& ctx) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  });
  if (d.status.ok()) {
    GTEST_LOG_(INFO) << "the long request finished inside its deadline on this machine";
  } else {
    EXPECT_EQ(d.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  const Completion e = gw.Generate(Greedy("Tom and Sue", 8));
  EXPECT_TRUE(e.status.ok()) << e.status.error_message();
}

TEST(GatewayGenerate, CancelledStreamFreesTheSlot) {
  Gateway gw(Unique("cancel2"), {"--max-batch", "1", "--kv-slots", "1", "--max-queue", "1",
                                 "--context", "2048"});
  grpc::ClientContext a_ctx;
  auto a_reader = gw.stub().Generate(&a_ctx, Long());
  v1::GenerateResponse first;
  ASSERT_TRUE(a_reader->Read(&first));  // A holds the only slot
  ASSERT_TRUE(first.has_chunk());
  // B queues behind A (the queue holds one); C finds the queue full, or, if C got there first,
  // B does: exactly one of them is RESOURCE_EXHAUSTED.
  Completion b, c;
  std::thread tb([&] { b = gw.Generate(Greedy("The little dog", 8)); });
  c = gw.Generate(Greedy("Lily wanted", 8));
  a_ctx.TryCancel();  // A leaves: its slot goes to the queued request at the next step
  v1::GenerateResponse rest;
  while (a_reader->Read(&rest)) {}
  const grpc::Status a_status = a_reader->Finish();
  tb.join();
  EXPECT_EQ(a_status.error_code(), grpc::StatusCode::CANCELLED) << a_status.error_message();
  const bool b_refused = b.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
  const bool c_refused = c.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
  EXPECT_NE(b_refused, c_refused) << "b: " << b.status.error_message()
                                  << " c: " << c.status.error_message();
  const Completion& ran = b_refused ? c : b;
  const Completion& refused = b_refused ? b : c;
  EXPECT_TRUE(ran.status.ok()) << ran.status.error_message();
  EXPECT_FALSE(ran.ids.empty());
  EXPECT_NE(refused.status.error_message().find("queue is full"), std::string::npos);
}

TEST(GatewayGenerate, TokenizerModelInfoAndReflection) {
  Gateway gw(Unique("info"));
  v1::TokenizeResponse tok;
  {
    grpc::ClientContext ctx;
    v1::TokenizeRequest req;
    req.set_text("Once upon a time");
    req.set_add_bos(true);
    ASSERT_TRUE(gw.stub().Tokenize(&ctx, req, &tok).ok());
  }
  ASSERT_GT(tok.token_ids_size(), 1);
  EXPECT_EQ(tok.pieces_size(), tok.token_ids_size());
  {
    grpc::ClientContext ctx;
    v1::DetokenizeRequest req;
    req.mutable_token_ids()->CopyFrom(tok.token_ids());
    v1::DetokenizeResponse resp;
    ASSERT_TRUE(gw.stub().Detokenize(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.text(), "Once upon a time");
  }
  v1::ModelInfo info;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(gw.stub().GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  }
  EXPECT_EQ(info.model(), "stories260K.gguf");
  EXPECT_EQ(info.vocab_size(), 512);
  EXPECT_EQ(info.context_length(), 256);
  EXPECT_EQ(info.bos_token_id(), tok.token_ids(0));
  EXPECT_EQ(info.workers(), "spawn");
  // Token ids as the prompt give the same output as the text they spell.
  v1::GenerateRequest by_ids = Greedy("", 16);
  by_ids.mutable_token_ids()->mutable_ids()->CopyFrom(tok.token_ids());
  const Completion a = gw.Generate(by_ids), b = gw.Generate(Greedy("Once upon a time", 16));
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(b.final.usage().prompt_tokens(), tok.token_ids_size());

  // Server reflection lists the service (what grpcurl relies on).
  auto channel = grpc::CreateChannel(gw.address(), grpc::InsecureChannelCredentials());
  auto refl = grpc::reflection::v1alpha::ServerReflection::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = refl->ServerReflectionInfo(&ctx);
  grpc::reflection::v1alpha::ServerReflectionRequest req;
  req.set_list_services("");
  ASSERT_TRUE(stream->Write(req));
  stream->WritesDone();
  grpc::reflection::v1alpha::ServerReflectionResponse resp;
  std::vector<std::string> names;
  while (stream->Read(&resp)) {
    for (const auto& s : resp.list_services_response().service()) names.push_back(s.name());
  }
  ASSERT_TRUE(stream->Finish().ok());
  EXPECT_NE(std::find(names.begin(), names.end(), "thermocline.v1.Generation"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "grpc.health.v1.Health"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "grpc.reflection.v1.ServerReflection"),
            names.end());

  // And reflection v1, which current grpcurl asks for first: the services, then the API's
  // descriptor (with its dependencies) by a symbol, and NOT_FOUND for an unknown one.
  namespace rv1 = grpc::reflection::v1;
  auto refl1 = rv1::ServerReflection::NewStub(channel);
  grpc::ClientContext ctx1;
  auto s1 = refl1->ServerReflectionInfo(&ctx1);
  rv1::ServerReflectionRequest list, symbol, unknown;
  list.set_list_services("");
  symbol.set_file_containing_symbol("thermocline.v1.Generation.Chat");
  unknown.set_file_containing_symbol("no.such.Service");
  for (const auto* r : {&list, &symbol, &unknown}) ASSERT_TRUE(s1->Write(*r));
  s1->WritesDone();
  std::vector<rv1::ServerReflectionResponse> answers;
  for (rv1::ServerReflectionResponse a; s1->Read(&a);) answers.push_back(a);
  ASSERT_TRUE(s1->Finish().ok());
  ASSERT_EQ(answers.size(), 3u);
  std::vector<std::string> v1_names;
  for (const auto& svc : answers[0].list_services_response().service()) {
    v1_names.push_back(svc.name());
  }
  EXPECT_NE(std::find(v1_names.begin(), v1_names.end(), "thermocline.v1.Generation"),
            v1_names.end());
  const auto& files = answers[1].file_descriptor_response().file_descriptor_proto();
  ASSERT_GE(files.size(), 1);
  google::protobuf::FileDescriptorProto api;
  ASSERT_TRUE(api.ParseFromString(files[files.size() - 1]));  // dependencies come first
  EXPECT_EQ(api.name(), "thermocline/v1/generation.proto");
  ASSERT_EQ(api.service_size(), 1);
  std::vector<std::string> methods;
  for (const auto& m : api.service(0).method()) methods.push_back(m.name());
  EXPECT_NE(std::find(methods.begin(), methods.end(), "Chat"), methods.end());
  EXPECT_NE(std::find(methods.begin(), methods.end(), "Generate"), methods.end());
  EXPECT_EQ(answers[2].error_response().error_code(), 5) << "NOT_FOUND";
}

}  // namespace
}  // namespace thermocline::testing

namespace thermocline::testing {
namespace {

// The gateway tokenizes and sizes requests from the model's header alone: the model file is
// never mapped into its address space (only the workers map it), and its info names the
// architecture from the file.
TEST(GatewayGenerate, GatewayNeverMapsTheModel) {
  Gateway gw(absl::StrCat("e2e-nomap-", getpid()));
  std::ifstream maps(absl::StrCat("/proc/", gw.pid(), "/maps"));
  ASSERT_TRUE(maps.good());
  std::string line;
  int lines = 0;
  while (std::getline(maps, line)) {
    ++lines;
    EXPECT_EQ(line.find("stories260K.gguf"), std::string::npos) << line;
  }
  EXPECT_GT(lines, 10);
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(gw.stub().GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.architecture(), "llama");
  EXPECT_EQ(info.vocab_size(), 512);
}

}  // namespace
}  // namespace thermocline::testing
