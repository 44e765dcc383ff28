// Bytes a careless or hostile client puts on the wire, sent raw over gRPC (a generic call, no
// stub-side checks): string fields that are not UTF-8 and messages that are not protobuf must be
// refused with INVALID_ARGUMENT naming the field, as every other bad request is, and the
// gateway must keep serving.
#include <grpcpp/generic/generic_stub.h>

#include "absl/strings/str_cat.h"
#include "tests/e2e/gateway_harness.h"

namespace thermocline::testing {
namespace {

// One call of `method` with `request` as its whole body, through the generic stub; the replies'
// bytes are appended to *replies.
grpc::Status RawCall(const std::string& address, const std::string& method,
                     const std::string& request, std::vector<std::string>* replies) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));  // safety net
  auto call = stub.PrepareCall(&ctx, method, &cq);
  void* tag = nullptr;
  bool ok = false;
  auto next = [&](intptr_t want) {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(reinterpret_cast<intptr_t>(tag), want);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  if (next(1)) {
    grpc::Slice slice(request);
    grpc::ByteBuffer body(&slice, 1);
    call->WriteLast(body, grpc::WriteOptions(), reinterpret_cast<void*>(2));
    next(2);
    while (true) {
      grpc::ByteBuffer reply;
      call->Read(&reply, reinterpret_cast<void*>(3));
      if (!next(3)) break;
      std::vector<grpc::Slice> slices;
      EXPECT_TRUE(reply.Dump(&slices).ok());
      std::string bytes;
      for (const grpc::Slice& s : slices) {
        bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
      replies->push_back(std::move(bytes));
    }
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  next(4);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {}
  return status;
}

// `message` serialized, with the placeholder `mark` (which must occur once) replaced by `bytes`
// of the same length: what a client that does not check UTF-8 sends.
std::string WithBytes(const google::protobuf::Message& message, const std::string& mark,
                      const std::string& bytes) {
  std::string wire = message.SerializeAsString();
  const size_t at = wire.find(mark);
  EXPECT_NE(at, std::string::npos);
  EXPECT_EQ(wire.find(mark, at + 1), std::string::npos);
  EXPECT_EQ(mark.size(), bytes.size());
  if (at != std::string::npos) wire.replace(at, mark.size(), bytes);
  return wire;
}

TEST(GatewayWire, InvalidUtf8AndMalformedMessagesAreInvalidArgumentNamingTheField) {
  Gateway gw(absl::StrCat("e2e-wire-", getpid()));
  const std::string kGenerate = "/thermocline.v1.Generation/Generate";
  const std::string kTokenize = "/thermocline.v1.Generation/Tokenize";
  const std::string kBad = "\xff\xfe\xc3";  // a lone 0xFF, 0xFE, a truncated 2-byte sequence
  struct Case {
    std::string what, method, wire, names;
  };
  std::vector<Case> cases;
  {
    v1::GenerateRequest r = Greedy("Once @@@ upon a time", 8);
    cases.push_back({"prompt text", kGenerate, WithBytes(r, "@@@", kBad), "text"});
  }
  {
    v1::GenerateRequest r = Greedy("Once upon a time", 8);
    r.add_stop("fine");
    r.add_stop("@@@");
    cases.push_back({"second stop string", kGenerate, WithBytes(r, "@@@", kBad), "stop[1]"});
  }
  {
    v1::GenerateRequest r = Greedy("Once upon a time", 8);
    r.set_request_id("req-@@@");
    cases.push_back({"request_id", kGenerate, WithBytes(r, "@@@", kBad), "request_id"});
  }
  {
    v1::TokenizeRequest r;
    r.set_text("abc @@@");
    cases.push_back({"tokenize text", kTokenize, WithBytes(r, "@@@", kBad), "text"});
  }
  // Chat: every string of a message, and the request's own strings.
  const std::string kChat = "/thermocline.v1.Generation/Chat";
  auto chat = [] {
    v1::ChatRequest r;
    r.set_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}");
    r.set_max_new_tokens(4);
    r.add_messages()->set_role("system");
    r.mutable_messages(0)->set_content("You tell stories.");
    r.add_messages()->set_role("user");
    r.mutable_messages(1)->set_content("Once upon a time");
    return r;
  };
  {
    v1::ChatRequest r = chat();
    r.mutable_messages(1)->set_content("Once @@@ upon a time");
    cases.push_back({"chat message content", kChat, WithBytes(r, "@@@", kBad),
                     "messages[1].content"});
  }
  {
    v1::ChatRequest r = chat();
    r.mutable_messages(0)->set_name("n@@@");
    cases.push_back({"chat message name", kChat, WithBytes(r, "@@@", kBad), "messages[0].name"});
  }
  {
    v1::ChatRequest r = chat();
    r.set_chat_template("{{ '@@@' }}");
    cases.push_back({"chat template", kChat, WithBytes(r, "@@@", kBad), "chat_template"});
  }
  {
    v1::ChatRequest r = chat();
    r.set_template_kwargs("{\"a\": \"@@@\"}");
    cases.push_back({"chat template kwargs", kChat, WithBytes(r, "@@@", kBad), "template_kwargs"});
  }
  {
    v1::TokenizeRequest r;
    r.set_text("abc @@@");
    r.set_parse_special(true);
    cases.push_back({"tokenize text, parse_special", kTokenize, WithBytes(r, "@@@", kBad), "text"});
  }
  cases.push_back({"truncated chat message", kChat, std::string("\xa2\x01\x7f" "abc", 6),
                   "thermocline.v1.ChatRequest"});
  // Not protobuf at all: a length-delimited field 1 whose length runs past the end.
  cases.push_back({"truncated message", kGenerate, std::string("\x0a\x7f" "abc", 5),
                   "thermocline.v1.GenerateRequest"});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<std::string> replies;
    const grpc::Status s = RawCall(gw.address(), c.method, c.wire, &replies);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find(c.names), std::string::npos) << s.error_message();
    EXPECT_TRUE(replies.empty());
  }
  // The same path with valid bytes streams a generation: the refusals above were the bytes'.
  std::vector<std::string> replies;
  const grpc::Status ok = RawCall(gw.address(), kGenerate,
                                  Greedy("Once upon a time", 8).SerializeAsString(), &replies);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  ASSERT_FALSE(replies.empty());
  v1::GenerateResponse last;
  ASSERT_TRUE(last.ParseFromString(replies.back()));
  EXPECT_TRUE(last.has_final());
  // And Chat with valid bytes streams too.
  replies.clear();
  const grpc::Status chat_ok = RawCall(gw.address(), kChat, chat().SerializeAsString(), &replies);
  ASSERT_TRUE(chat_ok.ok()) << chat_ok.error_message();
  ASSERT_FALSE(replies.empty());
  ASSERT_TRUE(last.ParseFromString(replies.back()));
  EXPECT_TRUE(last.has_final());
  EXPECT_EQ(gw.Health(), grpc::health::v1::HealthCheckResponse::SERVING);
}

}  // namespace
}  // namespace thermocline::testing
