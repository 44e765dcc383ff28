#include "tests/test_support.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "tests/process_spawn.h"

namespace thermocline::testing {

std::string SharedDataDir() {
  const char* env = std::getenv("THERMOCLINE_SHARED_DATA_DIR");
  return env != nullptr ? env : THERMOCLINE_SHARED_DATA_DIR;
}

std::string ModelPath(const std::string& rel) { return SharedDataDir() + "/models/" + rel; }

std::string MissingSharedData() {
  const std::string dir = SharedDataDir();
  const std::string model = ModelPath("stories260K/stories260K.gguf");
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return "reference data not found: no directory " + dir +
           " (../shared beside the checkout, or THERMOCLINE_SHARED_DATA_DIR; see README.md, "
           "Reference data)";
  }
  if (!std::filesystem::is_regular_file(model, ec)) {
    return "reference data incomplete: no " + model + " (see README.md, Reference data)";
  }
  return "";
}

// THERMOCLINE_BIN_DIR in the environment wins: test binaries copied away from their build tree
// (the GPU device bundle, scripts/gpu-bundle.sh) find the executables beside them.
std::string BinDir() {
  const char* env = std::getenv("THERMOCLINE_BIN_DIR");
  return env != nullptr && *env != '\0' ? env : THERMOCLINE_BIN_DIR;
}

namespace {
struct TempRoot {
  std::string path;
  TempRoot() {
    std::string tmpl = std::filesystem::temp_directory_path() / "thermocline-test-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    path = tmpl;
  }
  ~TempRoot() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};
}  // namespace

std::string TempDir() {
  static TempRoot root;
  static int counter = 0;
  std::string dir = root.path + "/" + std::to_string(counter++);
  std::filesystem::create_directories(dir);
  return dir;
}

absl::Status CopyGgufWithMetadata(const std::string& src,
                                  const std::vector<std::pair<std::string, GgufValue>>& metadata,
                                  const std::string& dst) {
  absl::StatusOr<std::unique_ptr<GgufFile>> in = GgufFile::Open(src);
  if (!in.ok()) return in.status();
  GgufWriter w;
  for (const auto& [key, value] : (*in)->metadata()) w.SetValue(key, value);
  for (const auto& [key, value] : metadata) w.SetValue(key, value);
  for (const GgufTensorInfo& t : (*in)->tensors()) {
    const std::string bytes(reinterpret_cast<const char*>(t.data), static_cast<size_t>(t.n_bytes));
    if (absl::Status s = w.AddTensorBytes(t.name, t.type, t.ne, bytes); !s.ok()) return s;
  }
  return w.WriteFile(dst);
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    std::abort();
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<float> ReadF32File(const std::string& path) {
  std::string bytes = ReadFileOrDie(path);
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

int64_t InterleavedBytes(const std::string& err) {
  const std::string key = " bytes in interleaved copies";
  const size_t at = err.find(key);
  if (at == std::string::npos) return -1;
  size_t begin = at;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(err[begin - 1]))) --begin;
  return begin == at ? -1 : std::stoll(err.substr(begin, at - begin));
}

CommandResult RunCommand(const std::vector<std::string>& argv) {
  CommandResult result;
  auto child = SpawnProcess(argv, {.stdout_pipe = true, .stderr_pipe = true});
  if (!child.ok()) {
    result.err = std::string(child.status().message());
    return result;
  }
  pollfd fds[2] = {{child->stdout_fd, POLLIN, 0}, {child->stderr_fd, POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, n);
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  waitpid(child->pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

CommandResult CalibrateTealProfile(const std::string& model, const std::string& out) {
  return RunCommand({BinDir() + "/thermocline",
                     "teal-calibrate",
                     "-m",
                     model,
                     "--corpus",
                     SharedDataDir() + "/corpus/tinystories_valid_sample.txt",
                     "--tokens",
                     "600",
                     "--greedy-tokens",
                     "128",
                     "--window",
                     "64",
                     "--batch",
                     "64",
                     "--targets",
                     "0.5",
                     "--threads",
                     "1",
                     "-o",
                     out});
}

std::unique_ptr<Model> SmallSynthModel(GgmlType type, SynthFfnKind kind,
                                       const std::string& name) {
  SynthOptions o;
  o.dim = 64;
  o.ffn = 160;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.vocab = 300;
  o.context = 32;
  o.type = type;
  o.ffn_kind = kind;
  o.threads = 1;
  const std::string path = TempDir() + "/" + name + ".gguf";
  EXPECT_TRUE(WriteSynthModel(o, path).ok());
  auto model = Model::Load(path);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

}  // namespace thermocline::testing
