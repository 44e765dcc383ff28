// `thermocline info`: what a GGUF file holds: header, every metadata key, every tensor, totals.
#include <cstdint>
#include <iostream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shared/gguf/gguf.h"
#include "shared/model/quantize.h"
#include "shared/util/escape.h"
#include "tools/command.h"

namespace thermocline::tools {
namespace {

struct Limits {
  int64_t items;       // array items shown
  int64_t string_len;  // bytes of a string shown; 0 = all
};

// Quoted, with control and non-UTF-8-looking bytes escaped, so a hostile file cannot drive the
// terminal; long strings (chat templates) are cut.
std::string Escape(std::string_view s, int64_t max_len) {
  std::string out;
  AppendEscaped(max_len > 0 ? s.substr(0, static_cast<size_t>(max_len)) : s, &out);
  return out;
}

std::string Quote(std::string_view s, int64_t max_len) {
  std::string out = absl::StrCat("\"", Escape(s, max_len), "\"");
  if (max_len > 0 && s.size() > static_cast<size_t>(max_len)) {
    absl::StrAppend(&out, "... (", s.size(), " bytes)");
  }
  return out;
}

std::string TypeName(const GgufValue& v) {
  const std::string_view name = GgufValueTypeName(v.type());
  if (const GgufArray* a = v.AsArray()) {
    const std::string_view et = GgufValueTypeName(a->element_type);
    return absl::StrCat("array[", absl::string_view(et.data(), et.size()), "]");
  }
  return std::string(name);
}

std::string FormatValue(const GgufValue& v, const Limits& limits) {
  switch (v.type()) {
    case GgufValueType::kString:
      return Quote(*v.AsString(), limits.string_len);
    case GgufValueType::kBool:
      return std::get<bool>(v.v) ? "true" : "false";
    case GgufValueType::kFloat32:
      return absl::StrFormat("%g", std::get<float>(v.v));
    case GgufValueType::kFloat64:
      return absl::StrFormat("%g", std::get<double>(v.v));
    case GgufValueType::kUint64:
      return absl::StrCat(std::get<uint64_t>(v.v));
    case GgufValueType::kArray: {
      const GgufArray& a = *v.AsArray();
      std::string out = absl::StrCat("(", a.items.size(), ") [");
      const size_t shown = std::min(a.items.size(), static_cast<size_t>(limits.items));
      for (size_t i = 0; i < shown; ++i) {
        if (i > 0) out += ", ";
        out += FormatValue(a.items[i], limits);
      }
      if (shown < a.items.size()) out += shown > 0 ? ", ..." : "...";
      return out + "]";
    }
    default:
      return absl::StrCat(*v.AsInt());
  }
}

std::string Shape(const std::vector<int64_t>& ne) {
  std::string out = "(";
  for (size_t i = 0; i < ne.size(); ++i) absl::StrAppend(&out, i > 0 ? ", " : "", ne[i]);
  return out + ")";
}

std::string HumanBytes(uint64_t n) {
  if (n >= (1ull << 30)) return absl::StrFormat("%.2f GiB", n / double(1ull << 30));
  if (n >= (1ull << 20)) return absl::StrFormat("%.2f MiB", n / double(1ull << 20));
  if (n >= (1ull << 10)) return absl::StrFormat("%.2f KiB", n / double(1ull << 10));
  return absl::StrCat(n, " B");
}

int RunInfo(const std::vector<std::string>& args) {
  std::string path;
  Limits limits;
  po::options_description opts("options");
  // One option per line reads as a table.
  // clang-format off
  opts.add_options()
      ("model,m", po::value(&path)->required(), "GGUF file (also accepted as the first argument)")
      ("items", po::value(&limits.items)->default_value(5), "array items to show per key")
      ("max-string", po::value(&limits.string_len)->default_value(120),
       "bytes of a string value to show (0 = all)");
  // clang-format on
  po::positional_options_description pos;
  pos.add("model", 1);
  po::variables_map vm;
  int exit_code = 0;
  if (!ParseOptions("info", "M.gguf [options]", opts, pos, args, vm, exit_code)) return exit_code;
  auto fail = [](std::string_view msg) {
    std::cerr << "thermocline info: " << msg << "\n";
    return 1;
  };
  if (limits.items < 0) return fail("--items must be >= 0");
  if (limits.string_len < 0) return fail("--max-string must be >= 0");

  auto file_or = GgufFile::Open(path);
  if (!file_or.ok()) {
    const absl::string_view m = file_or.status().message();
    return fail(std::string_view(m.data(), m.size()));
  }
  const GgufFile& f = **file_or;

  std::cout << "file:        " << f.path() << "\n"
            << "magic:       " << (f.is_powerinfer() ? "PWRI (PowerInfer)" : "GGUF") << "\n"
            << "version:     " << f.version() << "\n"
            << "alignment:   " << f.alignment() << "\n"
            << "data offset: " << f.data_offset() << "\n"
            << "file size:   " << f.file_size() << " (" << HumanBytes(f.file_size()) << ")\n";

  std::cout << "\nmetadata: " << f.metadata().size() << " keys\n";
  size_t key_width = 0;
  for (const auto& [key, value] : f.metadata()) key_width = std::max(key_width, key.size());
  key_width = std::min<size_t>(key_width, 48);
  for (const auto& [key, value] : f.metadata()) {
    std::string shown = FormatValue(value, limits);
    // The file type's number names a quantization mix (llama_ftype); say which.
    if (key == "general.file_type" && value.AsInt().has_value() && *value.AsInt() >= 0 &&
        *value.AsInt() <= UINT32_MAX) {
      if (auto name = FileTypeName(static_cast<uint32_t>(*value.AsInt())); name.has_value()) {
        shown += " (" + *name + ")";
      }
    }
    std::cout << absl::StrFormat("  %-*s  %s %s\n", key_width, Escape(key, 0), TypeName(value),
                                 shown);
  }

  std::cout << "\ntensors: " << f.tensors().size() << "\n";
  size_t name_width = 4;
  for (const GgufTensorInfo& t : f.tensors()) name_width = std::max(name_width, t.name.size());
  name_width = std::min<size_t>(name_width, 48);
  std::cout << absl::StrFormat("  %-*s  %-5s  %-24s  %12s  %12s\n", name_width, "name", "type",
                               "shape", "offset", "bytes");
  int64_t total_elements = 0;
  uint64_t total_bytes = 0;
  std::map<std::string, std::pair<int64_t, uint64_t>> by_type;  // count, bytes
  for (const GgufTensorInfo& t : f.tensors()) {
    const std::string_view type_name = TypeTraits(t.type).name;
    std::cout << absl::StrFormat("  %-*s  %-5s  %-24s  %12d  %12d\n", name_width, Escape(t.name, 0),
                                 std::string(type_name), Shape(t.ne), t.offset, t.n_bytes);
    total_elements += t.n_elements;
    total_bytes += static_cast<uint64_t>(t.n_bytes);
    auto& entry = by_type[std::string(type_name)];
    ++entry.first;
    entry.second += static_cast<uint64_t>(t.n_bytes);
  }
  std::cout << "\ntotal: " << f.tensors().size() << " tensors, " << total_elements << " elements, "
            << total_bytes << " bytes (" << HumanBytes(total_bytes) << ")\n";
  for (const auto& [type, stats] : by_type) {
    std::cout << "  " << type << ": " << stats.first << " tensors, " << stats.second << " bytes ("
              << HumanBytes(stats.second) << ")\n";
  }
  return 0;
}

static CommandRegistrar registrar({"info", "print a GGUF file's header, metadata and tensors",
                                   &RunInfo});

}  // namespace
}  // namespace thermocline::tools
