#include "tools/grpc_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <sstream>
#include <mutex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "thermocline/v1/generation.grpc.pb.h"

namespace thermocline::tools {
namespace {

absl::StatusCode ToAbsl(grpc::StatusCode code) {
  // gRPC and absl share the canonical code numbers.
  return static_cast<absl::StatusCode>(static_cast<int>(code));
}

absl::StatusOr<std::string> ReadFile(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": cannot read"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (ss.str().empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": empty"));
  return ss.str();
}

}  // namespace

absl::StatusOr<ClientSecurity> LoadClientSecurity(const std::string& tls_ca,
                                                  const std::string& tls_cert,
                                                  const std::string& tls_key,
                                                  const std::string& auth_token_file) {
  ClientSecurity s;
  if (tls_cert.empty() != tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together; give both");
  }
  s.tls = !tls_ca.empty() || !tls_cert.empty();
  if (!tls_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadFile("--tls-ca", tls_ca);
    if (!ca.ok()) return ca.status();
    s.root_ca = *std::move(ca);
  }
  if (!tls_cert.empty()) {
    absl::StatusOr<std::string> cert = ReadFile("--tls-cert", tls_cert);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFile("--tls-key", tls_key);
    if (!key.ok()) return key.status();
    s.cert_chain = *std::move(cert);
    s.private_key = *std::move(key);
  }
  if (!auth_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadFile("--auth-token-file", auth_token_file);
    if (!token.ok()) return token.status();
    // The first line, as the gateway reads its own copy.
    absl::string_view t(*token);
    t = absl::StripAsciiWhitespace(t.substr(0, t.find('\n')));
    if (t.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--auth-token-file ", auth_token_file, ": the first line is empty"));
    }
    s.bearer_token = std::string(t);
  }
  return s;
}

std::string FinishReasonName(v1::FinishReason reason) {
  std::string name = v1::FinishReason_Name(reason);
  constexpr std::string_view kPrefix = "FINISH_REASON_";
  if (name.rfind(kPrefix, 0) == 0) name.erase(0, kPrefix.size());
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return name.empty() ? "unspecified" : name;
}

namespace {

using Reader = grpc::ClientReader<v1::GenerateResponse>;

// One server-streaming call of GenerateResponse messages; `start` begins it on the stub (the
// only part that differs between Generate and Chat).
absl::StatusOr<v1::Final> StreamCall(
    const std::string& address,
    const std::function<std::unique_ptr<Reader>(v1::Generation::Stub&, grpc::ClientContext*)>&
        start,
    const std::function<void(const v1::TokenChunk&)>& on_chunk, const std::atomic<bool>* cancel,
    const ClientSecurity& security) {
  grpc::ChannelArguments args;
  // Long prompts and many logprobs make big messages; the server sets its own limits.
  args.SetMaxReceiveMessageSize(64 << 20);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (security.tls) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = security.root_ca;
    ssl.pem_cert_chain = security.cert_chain;
    ssl.pem_private_key = security.private_key;
    credentials = grpc::SslCredentials(ssl);
  }
  auto channel = grpc::CreateCustomChannel(address, credentials, args);
  auto stub = v1::Generation::NewStub(channel);
  grpc::ClientContext context;
  if (!security.bearer_token.empty()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", security.bearer_token));
  }

  // Cancellation from a signal handler can only set a flag; this thread turns it into
  // TryCancel, which is safe from any thread.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread watcher;
  if (cancel != nullptr) {
    watcher = std::thread([&] {
      std::unique_lock<std::mutex> lock(mu);
      while (!done) {
        if (cancel->load()) {
          context.TryCancel();
          return;
        }
        cv.wait_for(lock, std::chrono::milliseconds(50));
      }
    });
  }

  std::unique_ptr<Reader> reader = start(*stub, &context);
  v1::GenerateResponse response;
  v1::Final final;
  bool have_final = false;
  while (reader->Read(&response)) {
    if (response.has_chunk()) {
      on_chunk(response.chunk());
    } else if (response.has_final()) {
      final = response.final();
      have_final = true;
    }
  }
  const grpc::Status status = reader->Finish();
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  if (watcher.joinable()) watcher.join();

  if (!status.ok()) {
    return absl::Status(ToAbsl(status.error_code()),
                        absl::StrCat("server ", address, ": ",
                                     absl::StatusCodeToString(ToAbsl(status.error_code())), ": ",
                                     status.error_message()));
  }
  if (!have_final) {
    return absl::DataLossError(
        absl::StrCat("server ", address, ": the stream ended without its final message"));
  }
  return final;
}

}  // namespace

absl::StatusOr<v1::Final> StreamGenerate(
    const std::string& address, const v1::GenerateRequest& request,
    const std::function<void(const v1::TokenChunk&)>& on_chunk, const std::atomic<bool>* cancel,
    const ClientSecurity& security) {
  return StreamCall(
      address,
      [&](v1::Generation::Stub& stub, grpc::ClientContext* ctx) {
        return stub.Generate(ctx, request);
      },
      on_chunk, cancel, security);
}

absl::StatusOr<v1::Final> StreamChat(const std::string& address, const v1::ChatRequest& request,
                                     const std::function<void(const v1::TokenChunk&)>& on_chunk,
                                     const std::atomic<bool>* cancel,
                                     const ClientSecurity& security) {
  return StreamCall(
      address,
      [&](v1::Generation::Stub& stub, grpc::ClientContext* ctx) { return stub.Chat(ctx, request); },
      on_chunk, cancel, security);
}

}  // namespace thermocline::tools
