#include "tools/grpc_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "thermocline/v1/generation.grpc.pb.h"

namespace thermocline::tools {
namespace {

absl::StatusCode ToAbsl(grpc::StatusCode code) {
  // gRPC and absl share the canonical code numbers.
  return static_cast<absl::StatusCode>(static_cast<int>(code));
}

}  // namespace

std::string FinishReasonName(v1::FinishReason reason) {
  std::string name = v1::FinishReason_Name(reason);
  constexpr std::string_view kPrefix = "FINISH_REASON_";
  if (name.rfind(kPrefix, 0) == 0) name.erase(0, kPrefix.size());
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return name.empty() ? "unspecified" : name;
}

absl::StatusOr<v1::Final> StreamGenerate(
    const std::string& address, const v1::GenerateRequest& request,
    const std::function<void(const v1::TokenChunk&)>& on_chunk, const std::atomic<bool>* cancel) {
  grpc::ChannelArguments args;
  // Long prompts and many logprobs make big messages; the server sets its own limits.
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  auto stub = v1::Generation::NewStub(channel);
  grpc::ClientContext context;

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

  auto reader = stub->Generate(&context, request);
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

}  // namespace thermocline::tools
