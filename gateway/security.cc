#include "gateway/security.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <grpcpp/security/server_credentials.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace thermocline::gateway {
namespace {

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no PEM block found";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
using Bio = std::unique_ptr<BIO, BioDeleter>;

Bio MemBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of `pem`, or an error naming `flag`.
absl::StatusOr<X509*> ParseCert(const char* flag, const std::string& path,
                                const std::string& pem) {
  Bio bio = MemBio(pem);
  X509* cert = bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr;
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path,
                                                   ": not a PEM certificate (", OpenSslError(),
                                                   ")"));
  }
  return cert;
}

}  // namespace

absl::StatusOr<std::string> ReadFlagFile(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": cannot read (", std::strerror(errno), ")"));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": read error"));
  }
  std::string data = ss.str();
  if (data.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": empty"));
  return data;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const SecurityOptions& o) {
  if (o.tls_cert.empty() && o.tls_key.empty()) {
    if (!o.tls_client_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)");
    }
    return grpc::InsecureServerCredentials();
  }
  if (o.tls_cert.empty() || o.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together; give both");
  }
  auto cert_pem = ReadFlagFile("--tls-cert", o.tls_cert);
  if (!cert_pem.ok()) return cert_pem.status();
  auto key_pem = ReadFlagFile("--tls-key", o.tls_key);
  if (!key_pem.ok()) return key_pem.status();

  auto cert = ParseCert("--tls-cert", o.tls_cert, *cert_pem);
  if (!cert.ok()) return cert.status();
  std::unique_ptr<X509, void (*)(X509*)> cert_owner(*cert, X509_free);
  Bio key_bio = MemBio(*key_pem);
  EVP_PKEY* key = key_bio ? PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr)
                          : nullptr;
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-key ", o.tls_key,
                                                   ": not an unencrypted PEM private key (",
                                                   OpenSslError(), ")"));
  }
  std::unique_ptr<EVP_PKEY, void (*)(EVP_PKEY*)> key_owner(key, EVP_PKEY_free);
  if (X509_check_private_key(*cert, key) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("--tls-key ", o.tls_key,
                                                   " does not match the certificate of --tls-cert ",
                                                   o.tls_cert));
  }

  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key_pem, *cert_pem});
  if (!o.tls_client_ca.empty()) {
    auto ca_pem = ReadFlagFile("--tls-client-ca", o.tls_client_ca);
    if (!ca_pem.ok()) return ca_pem.status();
    auto ca = ParseCert("--tls-client-ca", o.tls_client_ca, *ca_pem);
    if (!ca.ok()) return ca.status();
    X509_free(*ca);
    ssl.pem_root_certs = *ca_pem;
    // Mutual TLS: a client without a certificate, or with one the CA did not sign, fails the
    // handshake before any call reaches the service.
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<std::string> LoadAuthToken(const std::string& path) {
  // A token other users can read is a token they can present: refuse it rather than serve
  // behind it (docs/operations.md asks for mode 0600).
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--auth-token-file ", path, ": mode 0", absl::Dec(st.st_mode & 0777, absl::kZeroPad3),
        " lets other users read the token; make it 0600 (chmod 600 ", path, ")"));
  }
  auto data = ReadFlagFile("--auth-token-file", path);
  if (!data.ok()) return data.status();
  absl::string_view token(*data);
  token = token.substr(0, token.find('\n'));
  token = absl::StripAsciiWhitespace(token);
  if (token.size() < 16 || token.size() > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--auth-token-file ", path, ": the token (first line) must be 16 to 4096 characters, got ",
        token.size()));
  }
  for (char c : token) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(absl::StrCat(
          "--auth-token-file ", path,
          ": the token may hold only printable ASCII without spaces"));
    }
  }
  return std::string(token);
}

bool TokensEqual(std::string_view a, std::string_view b) {
  // Every byte of `b` (the expected token) is visited whatever `a` holds; differences are
  // OR-ed, never branched on. The length mismatch itself is folded in the same way.
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff = diff | (x ^ static_cast<unsigned char>(b[i]));
  }
  return diff == 0;
}

absl::Status CheckAuthorizationValue(const std::string_view* value, std::string_view expected,
                                    std::string_view what) {
  if (value == nullptr) {
    return absl::UnauthenticatedError(absl::StrCat(
        "missing 'authorization: Bearer <token>' ", std::string(what),
        " (the gateway requires a token)"));
  }
  const absl::string_view v(value->data(), value->size());
  constexpr absl::string_view kScheme = "Bearer ";
  if (v.size() <= kScheme.size() || !absl::StartsWithIgnoreCase(v, kScheme)) {
    return absl::UnauthenticatedError(
        absl::StrCat("the authorization ", std::string(what), " is not 'Bearer <token>'"));
  }
  const absl::string_view presented = v.substr(kScheme.size());
  if (!TokensEqual(std::string_view(presented.data(), presented.size()), expected)) {
    return absl::UnauthenticatedError("invalid bearer token");
  }
  return absl::OkStatus();
}

absl::Status CheckBearerToken(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                              std::string_view expected) {
  const auto it = metadata.find("authorization");
  if (it == metadata.end()) return CheckAuthorizationValue(nullptr, expected, "metadata");
  const std::string_view value(it->second.data(), it->second.size());
  return CheckAuthorizationValue(&value, expected, "metadata");
}

}  // namespace thermocline::gateway
