// The client side of `thermocline generate --server ADDR`: one streaming Generate call to a
// thermocline-gateway over plain-text gRPC, handing every chunk to a callback as it arrives.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "thermocline/v1/generation.pb.h"

namespace thermocline::tools {

// Streams `request` from the gateway at `address` (host:port). `on_chunk` sees each chunk in
// order; `cancel`, when set (e.g. by a SIGINT handler), cancels the call within ~50 ms. Returns
// the Final message, or the call's status (code and the server's message, prefixed with the
// address) when it fails or ends without one.
absl::StatusOr<v1::Final> StreamGenerate(
    const std::string& address, const v1::GenerateRequest& request,
    const std::function<void(const v1::TokenChunk&)>& on_chunk,
    const std::atomic<bool>* cancel = nullptr);

// "eos", "length", "stop_sequence", "cancelled" (or "unspecified").
std::string FinishReasonName(v1::FinishReason reason);

}  // namespace thermocline::tools
