// Transport security and authentication of the gateway (docs/operations.md, "Security"):
// TLS (--tls-cert, --tls-key), mutual TLS (--tls-client-ca: clients must present a certificate
// signed by that CA) and bearer tokens (--auth-token-file). Every file is read and checked at
// startup, so a bad path or a malformed PEM ends the gateway with a message naming the flag
// instead of failing later at the first handshake.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/string_ref.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace thermocline::gateway {

struct SecurityOptions {
  std::string tls_cert;       // PEM certificate chain of the server
  std::string tls_key;        // PEM private key matching tls_cert
  std::string tls_client_ca;  // PEM CA bundle; set: clients must present a cert it signed
};

// Insecure credentials when no TLS flag is set; SSL credentials otherwise. InvalidArgument
// naming the flag for: a key without a certificate (or the reverse), a client CA without TLS,
// an unreadable or empty file, a file that is not PEM of the right kind, a key that does not
// match the certificate.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const SecurityOptions& options);

// The token of --auth-token-file: the file's first line without surrounding whitespace. It
// must be 16 to 4096 printable ASCII characters without spaces (what fits in a header).
absl::StatusOr<std::string> LoadAuthToken(const std::string& path);

// Constant time in the contents: the time taken depends only on the lengths, so a caller
// cannot find the token a character at a time by timing refusals.
bool TokensEqual(std::string_view a, std::string_view b);

// OK when `metadata` holds "authorization: Bearer <expected>"; Unauthenticated otherwise,
// saying which of missing / malformed / wrong it was (never echoing what was sent).
absl::Status CheckBearerToken(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                              std::string_view expected);

// The same check on one header's value (nullptr: the header is absent), for the HTTP API;
// `what` names the carrier in the messages ("metadata", "header").
absl::Status CheckAuthorizationValue(const std::string_view* value, std::string_view expected,
                                    std::string_view what);

// Reads a whole file; InvalidArgument naming `flag` when it cannot be read or is empty.
absl::StatusOr<std::string> ReadFlagFile(const char* flag, const std::string& path);

}  // namespace thermocline::gateway
