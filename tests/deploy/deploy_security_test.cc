// Issue 7, item 2 (docs/operations.md, "Security"): the real thermocline-gateway with TLS,
// mutual TLS and bearer tokens, driven by real gRPC clients and by `thermocline generate
// --server`; startup validation (every bad flag exits 1 naming the flag); shared-memory
// segments mode 0600 owned by the service user; two instances side by side, one killed -9,
// the other untouched. Certificates are made at test time with the openssl CLI.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <set>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "shared/ipc/segment.h"
#include "tests/deploy/deploy_process.h"
#include "tests/e2e/gateway_harness.h"

namespace thermocline::testing {
namespace {

std::string Dir() {
  static const std::string dir = [] {
    std::string d = absl::StrCat(TempDir(), "/deploy_security_", getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}
std::string P(const std::string& name) { return Dir() + "/" + name; }

// A CA, a server certificate for localhost / 127.0.0.1, a client certificate signed by the
// CA, and a client certificate signed by another CA ("rogue"). EC P-256 keys: fast to make.
void MakeCertificates() {
  if (std::filesystem::exists(P("rogue.crt"))) return;
  ASSERT_EQ(Shell("command -v openssl >/dev/null"), 0) << "openssl CLI missing (scripts/setup.sh)";
  {
    std::ofstream(P("server.ext")) << "subjectAltName=DNS:localhost,IP:127.0.0.1\n";
    std::ofstream(P("client.ext")) << "extendedKeyUsage=clientAuth\n";
  }
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const std::string q = " >>" + P("openssl.log") + " 2>&1";
  auto ca = [&](const std::string& n) {
    return absl::StrCat("openssl req -x509 ", key, " -keyout ", P(n + ".key"), " -out ",
                        P(n + ".crt"), " -days 2 -subj /CN=", n, q);
  };
  auto leaf = [&](const std::string& n, const std::string& issuer, const std::string& ext) {
    return absl::StrCat("openssl req ", key, " -keyout ", P(n + ".key"), " -out ", P(n + ".csr"),
                        " -subj /CN=", n, q, " && openssl x509 -req -in ", P(n + ".csr"), " -CA ",
                        P(issuer + ".crt"), " -CAkey ", P(issuer + ".key"),
                        " -CAcreateserial -days 2 -extfile ", P(ext), " -out ", P(n + ".crt"), q);
  };
  ASSERT_EQ(Shell(ca("ca")), 0) << ReadFileOrDie(P("openssl.log"));
  ASSERT_EQ(Shell(ca("rogueca")), 0);
  ASSERT_EQ(Shell(leaf("server", "ca", "server.ext")), 0) << ReadFileOrDie(P("openssl.log"));
  ASSERT_EQ(Shell(leaf("client", "ca", "client.ext")), 0);
  ASSERT_EQ(Shell(leaf("rogue", "rogueca", "client.ext")), 0);
  std::ofstream(P("token")) << "s3cret-token-0123456789abcdef\n";
  chmod(P("token").c_str(), 0600);
  std::ofstream(P("loose-token")) << "s3cret-token-0123456789abcdef\n";
  chmod(P("loose-token").c_str(), 0644);
  std::ofstream(P("short-token")) << "short\n";
  chmod(P("short-token").c_str(), 0600);
  std::ofstream(P("unreadable.crt")) << "x";
  chmod(P("unreadable.crt").c_str(), 0);
}

std::vector<std::string> GatewayArgv(const std::string& instance, std::vector<std::string> extra) {
  std::vector<std::string> a = {absl::StrCat(BinDir(), "/thermocline-gateway"), "--model",
                                Stories260K(), "--hot-fraction", "0.5", "--context", "256",
                                "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                                "--instance", instance};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// A gateway started with `extra` flags; address() is its gRPC address.
struct Server {
  Server(const std::string& name, std::vector<std::string> extra)
      : process(GatewayArgv(absl::StrCat(name, "-", getpid()), std::move(extra)),
                P(name + ".log")) {
    const std::string line = process.FirstLine();
    address = Field(line, "grpc");
    EXPECT_FALSE(address.empty()) << "no listening line; log:\n" << process.Log();
  }
  Process process;
  std::string address;
};

std::string ReadAll(const std::string& path) { return ReadFileOrDie(path); }

std::shared_ptr<grpc::Channel> Channel(const std::string& address,
                                       std::shared_ptr<grpc::ChannelCredentials> creds) {
  grpc::ChannelArguments args;
  return grpc::CreateCustomChannel(address, creds, args);
}

std::shared_ptr<grpc::ChannelCredentials> Tls(bool client_cert, bool rogue = false) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = ReadAll(P("ca.crt"));
  if (client_cert) {
    const std::string n = rogue ? "rogue" : "client";
    o.pem_cert_chain = ReadAll(P(n + ".crt"));
    o.pem_private_key = ReadAll(P(n + ".key"));
  }
  return grpc::SslCredentials(o);
}

// GetModelInfo with a 5 s deadline (the gateway answers it while it loads, too); `token`
// non-empty adds the bearer header.
grpc::Status Info(const std::shared_ptr<grpc::Channel>& ch, const std::string& token = "") {
  auto stub = v1::Generation::NewStub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (!token.empty()) ctx.AddMetadata("authorization", token);
  v1::GetModelInfoRequest req;
  v1::ModelInfo info;
  return stub->GetModelInfo(&ctx, req, &info);
}

// Polls health until SERVING (the model is loaded and the workers are ready; GetModelInfo
// answers earlier) and then checks GetModelInfo with `token`; 60 s at most.
bool WaitInfo(const std::shared_ptr<grpc::Channel>& ch, const std::string& token = "") {
  auto health = grpc::health::v1::Health::NewStub(ch);
  for (int i = 0; i < 600; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    if (health->Check(&ctx, req, &resp).ok() &&
        resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return Info(ch, token).ok();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// A greedy Generate of 8 tokens; its status.
grpc::Status Generate8(const std::shared_ptr<grpc::Channel>& ch, const std::string& token = "") {
  auto stub = v1::Generation::NewStub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  if (!token.empty()) ctx.AddMetadata("authorization", token);
  auto reader = stub->Generate(&ctx, Greedy("Once upon a time", 8));
  v1::GenerateResponse r;
  int chunks = 0;
  while (reader->Read(&r)) chunks += r.has_chunk();
  grpc::Status s = reader->Finish();
  if (s.ok()) {
    EXPECT_GT(chunks, 0);
  }
  return s;
}

class DeploySecurity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { MakeCertificates(); }
};

TEST_F(DeploySecurity, TlsServesEncryptedAndRefusesPlaintext) {
  Server s("tls", {"--tls-cert", P("server.crt"), "--tls-key", P("server.key")});
  auto tls = Channel(s.address, Tls(false));
  ASSERT_TRUE(WaitInfo(tls)) << s.process.Log();
  EXPECT_TRUE(Generate8(tls).ok());
  const grpc::Status plain = Info(Channel(s.address, grpc::InsecureChannelCredentials()));
  EXPECT_FALSE(plain.ok());
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE) << plain.error_message();
  // SIGTERM is a clean exit (status 0, segments removed), also with gRPC's TLS threads running.
  s.process.Signal(SIGTERM);
  const std::optional<int> st = s.process.Wait(20);
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << "status " << *st << "\n"
                                                       << s.process.Log();
  EXPECT_TRUE(ipc::ListInstanceSegments(absl::StrCat("tls-", getpid())).empty());
}

TEST_F(DeploySecurity, MutualTlsRequiresAClientCertificateFromTheCa) {
  Server s("mtls", {"--tls-cert", P("server.crt"), "--tls-key", P("server.key"),
                    "--tls-client-ca", P("ca.crt")});
  auto good = Channel(s.address, Tls(true));
  ASSERT_TRUE(WaitInfo(good)) << s.process.Log();
  EXPECT_TRUE(Generate8(good).ok());
  EXPECT_FALSE(Info(Channel(s.address, Tls(false))).ok()) << "no client certificate";
  EXPECT_FALSE(Info(Channel(s.address, Tls(true, /*rogue=*/true))).ok()) << "another CA's";
}

TEST_F(DeploySecurity, BearerTokenGuardsEveryCallButHealth) {
  Server s("token", {"--auth-token-file", P("token")});
  auto ch = Channel(s.address, grpc::InsecureChannelCredentials());
  const std::string good = "Bearer s3cret-token-0123456789abcdef";
  ASSERT_TRUE(WaitInfo(ch, good)) << s.process.Log();
  EXPECT_TRUE(Generate8(ch, good).ok());
  for (const std::string& bad :
       {std::string(), std::string("Bearer wrong-token-0123456789abcdef"),
        std::string("Bearer s3cret-token-0123456789abcde"), std::string("Basic czNjcmV0"),
        std::string("s3cret-token-0123456789abcdef")}) {
    const grpc::Status info = Info(ch, bad);
    EXPECT_EQ(info.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "'" << bad << "'";
    const grpc::Status gen = Generate8(ch, bad);
    EXPECT_EQ(gen.error_code(), grpc::StatusCode::UNAUTHENTICATED) << gen.error_message();
    EXPECT_EQ(gen.error_message().find("s3cret"), std::string::npos) << "never echoes the token";
  }
  // Health stays open to probes without a token.
  auto health = grpc::health::v1::Health::NewStub(ch);
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

// `thermocline generate --server` with every client flag against TLS + mTLS + token.
TEST_F(DeploySecurity, CommandLineClientUsesTlsClientCertificateAndToken) {
  Server s("cli", {"--tls-cert", P("server.crt"), "--tls-key", P("server.key"),
                   "--tls-client-ca", P("ca.crt"), "--auth-token-file", P("token")});
  ASSERT_TRUE(WaitInfo(Channel(s.address, Tls(true)), "Bearer s3cret-token-0123456789abcdef"))
      << s.process.Log();
  const std::string base = absl::StrCat(BinDir(), "/thermocline generate --server ", s.address,
                                        " --prompt 'Once upon a time' --max-new-tokens 8",
                                        " --temperature 0 --tls-ca ", P("ca.crt"));
  const std::string ok = absl::StrCat(base, " --tls-cert ", P("client.crt"), " --tls-key ",
                                      P("client.key"), " --auth-token-file ", P("token"), " >",
                                      P("cli.out"), " 2>", P("cli.err"));
  ASSERT_EQ(Shell(ok), 0) << ReadAll(P("cli.err"));
  EXPECT_EQ(ReadAll(P("cli.out")).rfind("Once upon a time", 0), 0u) << ReadAll(P("cli.out"));
  const std::string no_token = absl::StrCat(base, " --tls-cert ", P("client.crt"), " --tls-key ",
                                            P("client.key"), " >/dev/null 2>", P("cli.err"));
  EXPECT_NE(Shell(no_token), 0);
  EXPECT_NE(ReadAll(P("cli.err")).find("authorization"), std::string::npos)
      << ReadAll(P("cli.err"));
  EXPECT_NE(Shell(base + " --tls-cert " + P("client.crt") + " >/dev/null 2>" + P("cli.err")), 0);
  EXPECT_NE(ReadAll(P("cli.err")).find("--tls-key"), std::string::npos) << ReadAll(P("cli.err"));
}

// Every bad configuration ends startup with status 1 and a message naming the flag.
TEST_F(DeploySecurity, BadConfigurationExitsNamingTheFlag) {
  // A port held by a socket with SO_REUSEPORT, as another gRPC server holds its port.
  const int busy = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(busy, 0);
  const int one = 1;
  setsockopt(busy, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(busy, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(listen(busy, 1), 0);
  socklen_t len = sizeof sa;
  getsockname(busy, reinterpret_cast<sockaddr*>(&sa), &len);
  const std::string busy_addr = absl::StrCat("127.0.0.1:", ntohs(sa.sin_port));

  struct Case {
    std::vector<std::string> args;
    std::string flag;
  };
  const std::vector<Case> cases = {
      {{"--model", P("no-such-model.gguf")}, "--model"},
      {{"--tls-cert", P("no-such.crt"), "--tls-key", P("server.key")}, "--tls-cert"},
      {{"--tls-cert", P("unreadable.crt"), "--tls-key", P("server.key")}, "--tls-cert"},
      {{"--tls-cert", P("server.key"), "--tls-key", P("server.key")}, "--tls-cert"},
      {{"--tls-cert", P("server.crt"), "--tls-key", P("client.key")}, "--tls-key"},
      {{"--tls-cert", P("server.crt")}, "--tls-key"},
      {{"--tls-client-ca", P("ca.crt")}, "--tls-client-ca"},
      {{"--tls-cert", P("server.crt"), "--tls-key", P("server.key"), "--tls-client-ca",
        P("token")}, "--tls-client-ca"},
      {{"--auth-token-file", P("short-token")}, "--auth-token-file"},
      {{"--auth-token-file", P("no-such-token")}, "--auth-token-file"},
      {{"--auth-token-file", P("loose-token")}, "--auth-token-file"},
      {{"--max-queue", "0"}, "--max-queue"},
      {{"--listen", "localhost"}, "--listen"},
      {{"--listen", "127.0.0.1:99999"}, "--listen"},
      {{"--listen", "256.1.2.3:0"}, "--listen"},
      {{"--listen", busy_addr}, "--listen"},
      {{"--metrics-listen", busy_addr}, "--metrics-listen"},
  };
  // Model last: a later --model overrides the first, which the first case relies on.
  int i = 0;
  for (const Case& c : cases) {
    std::vector<std::string> argv = GatewayArgv(absl::StrCat("bad-", getpid(), "-", i), {});
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    if (c.flag == "--listen" || c.flag == "--metrics-listen") {
      // Replace the defaults given above rather than repeating the option (repeats are errors).
      for (size_t k = 0; k + 1 < argv.size(); ++k) {
        if (argv[k] == c.flag && argv[k + 1] == "127.0.0.1:0") argv.erase(argv.begin() + k, argv.begin() + k + 2);
      }
    }
    if (c.flag == "--model") {
      argv.erase(argv.begin() + 1, argv.begin() + 3);
    }
    Process p(argv, P(absl::StrCat("bad", i++, ".log")));
    const std::optional<int> st = p.Wait(60);
    ASSERT_TRUE(st.has_value()) << c.flag << ": still running";
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 1) << c.flag << " status " << *st;
    EXPECT_NE(p.Log().find(c.flag), std::string::npos) << c.flag << ":\n" << p.Log();
  }
  close(busy);
}

// Segments: mode 0600, owned by the user running the gateway; two instances side by side
// share nothing, and kill -9 of one leaves the other's segments and streams intact.
TEST_F(DeploySecurity, InstancesAreIsolatedAndSegmentsPrivate) {
  const std::string a = absl::StrCat("iso-a-", getpid()), b = absl::StrCat("iso-b-", getpid());
  Gateway gb(b);
  Process ga(GatewayArgv(a, {}), P("iso-a.log"));
  ASSERT_FALSE(Field(ga.FirstLine(), "grpc").empty()) << ga.Log();
  // Wait until A has created its segments (the transport comes after the model load).
  std::vector<std::string> segs_a;
  for (int i = 0; i < 600 && segs_a.size() < 2; ++i) {
    segs_a = ipc::ListInstanceSegments(a);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::vector<std::string> segs_b = ipc::ListInstanceSegments(b);
  ASSERT_GE(segs_a.size(), 2u);
  ASSERT_GE(segs_b.size(), 2u);
  std::set<std::string> all(segs_a.begin(), segs_a.end());
  for (const std::string& s : segs_b) EXPECT_TRUE(all.insert(s).second) << s << " shared";
  for (const std::string& s : all) {
    struct stat st {};
    ASSERT_EQ(stat(("/dev/shm/" + s).c_str(), &st), 0) << s;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << s;
    EXPECT_EQ(st.st_uid, geteuid()) << s;
  }

  const v1::GenerateRequest req = Greedy("Once upon a time", 48);
  const Completion quiet = gb.Generate(req);
  ASSERT_TRUE(quiet.status.ok()) << quiet.status.error_message();
  // A stream on B while A dies by SIGKILL mid-way.
  Completion during;
  std::thread t([&] { during = gb.Generate(req); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ga.Signal(SIGKILL);
  ASSERT_TRUE(ga.Wait(10).has_value());
  t.join();
  ASSERT_TRUE(during.status.ok()) << during.status.error_message();
  EXPECT_EQ(during.ids, quiet.ids);
  EXPECT_EQ(during.text, quiet.text);
  EXPECT_EQ(gb.Health(), grpc::health::v1::HealthCheckResponse::SERVING);
  const std::vector<std::string> after = ipc::ListInstanceSegments(b);
  EXPECT_EQ(std::set<std::string>(after.begin(), after.end()),
            std::set<std::string>(segs_b.begin(), segs_b.end()));
  const Completion again = gb.Generate(req);
  EXPECT_TRUE(again.status.ok());
  EXPECT_EQ(again.ids, quiet.ids);
  // A's orphans notice their gateway is gone and exit; its segments stay (nobody ran its
  // destructors) until a restarted A replaces them (DESIGN.md) or, as here, they are removed as
  // stale, so that no run of this test leaves 40 MB in /dev/shm.
  for (const std::string& s : segs_a) {
    const std::string what = s.substr(s.rfind('-') + 1);
    auto removed = ipc::SharedSegment::RemoveIfStale(a, what);
    ASSERT_TRUE(removed.ok()) << s << ": " << removed.status();
    EXPECT_TRUE(*removed) << s;
  }
  EXPECT_TRUE(ipc::ListInstanceSegments(a).empty());
}

}  // namespace
}  // namespace thermocline::testing
