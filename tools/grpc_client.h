// The client side of `thermocline generate --server ADDR` and `thermocline chat --server ADDR`:
// one streaming Generate or Chat call to a thermocline-gateway over gRPC (plain text, TLS or
// mutual TLS, optionally with a bearer token), handing every chunk to a callback as it arrives.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "thermocline/v1/generation.pb.h"

namespace thermocline::tools {

// How `generate --server` reaches a secured gateway (docs/operations.md, "Security"): file
// contents, already read. TLS is used when `tls` is set; `root_ca` empty then means the
// system's roots; `cert_chain` + `private_key` present a client certificate (mutual TLS).
struct ClientSecurity {
  bool tls = false;
  std::string root_ca, cert_chain, private_key;
  std::string bearer_token;  // sent as "authorization: Bearer <token>" when not empty
};

// Reads the files of --tls-ca, --tls-cert, --tls-key and --auth-token-file (empty path = not
// given). InvalidArgument naming the flag for an unreadable or empty file, a certificate
// without its key (or the reverse), or an unusable token.
absl::StatusOr<ClientSecurity> LoadClientSecurity(const std::string& tls_ca,
                                                  const std::string& tls_cert,
                                                  const std::string& tls_key,
                                                  const std::string& auth_token_file);

// Streams `request` from the gateway at `address` (host:port). `on_chunk` sees each chunk in
// order; `cancel`, when set (e.g. by a SIGINT handler), cancels the call within ~50 ms. Returns
// the Final message, or the call's status (code and the server's message, prefixed with the
// address) when it fails or ends without one.
absl::StatusOr<v1::Final> StreamGenerate(
    const std::string& address, const v1::GenerateRequest& request,
    const std::function<void(const v1::TokenChunk&)>& on_chunk,
    const std::atomic<bool>* cancel = nullptr, const ClientSecurity& security = {});

// The same for one Chat call (the next assistant turn of a conversation).
absl::StatusOr<v1::Final> StreamChat(const std::string& address, const v1::ChatRequest& request,
                                     const std::function<void(const v1::TokenChunk&)>& on_chunk,
                                     const std::atomic<bool>* cancel = nullptr,
                                     const ClientSecurity& security = {});

// "eos", "length", "stop_sequence", "cancelled" (or "unspecified").
std::string FinishReasonName(v1::FinishReason reason);

}  // namespace thermocline::tools
