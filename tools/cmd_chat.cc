// `thermocline chat`: a conversation with a model, one user turn per line of standard input.
// With --model the conversation is rendered through the chat template here (the model's or
// --template's), tokenized as a templated prompt (shared/tokenizer/chat_prompt.h) and generated
// on this machine by the engine `thermocline generate` runs; with --server each turn is one
// Chat call to a thermocline-gateway, which renders and tokenizes it by the same rules. Either
// way the reply streams to standard output as it is generated, followed by a newline, and the
// whole conversation so far is sent again with the next line.
//
// Lines are read plainly (no line editing or history): on a terminal a "> " prompt is shown on
// standard error, so that standard output carries the replies alone. "/exit" or the end of
// input ends the conversation; empty lines are skipped.
#include <editline/readline.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "shared/chat/chat_template.h"
#include "shared/model/model.h"
#include "shared/runtime/generate.h"
#include "shared/tokenizer/chat_prompt.h"
#include "shared/tokenizer/tokenizer.h"
#include "tools/command.h"
#include "tools/generation_flags.h"
#include "tools/grpc_client.h"

namespace thermocline::tools {
namespace {

int Fail(const std::string& msg) {
  std::cerr << "thermocline chat: " << msg << "\n";
  return 1;
}

void Print(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

// One line from the terminal through libedit (line editing, and the turns so far as history
// on the up arrow); nullopt at end of input (Ctrl-D).
std::optional<std::string> EditLine() {
  char* raw = readline("> ");
  if (raw == nullptr) return std::nullopt;
  std::string line(raw);
  std::free(raw);
  if (!line.empty()) add_history(line.c_str());
  return line;
}

// The user's next line: nullopt at the end of input or "/exit". A terminal gets line editing;
// anything else (a pipe, a file) is read as plain lines.
std::optional<std::string> NextTurn(bool interactive) {
  std::string line;
  while (true) {
    if (interactive) {
      std::optional<std::string> edited = EditLine();
      if (!edited.has_value()) return std::nullopt;
      line = *std::move(edited);
    } else if (!std::getline(std::cin, line)) {
      return std::nullopt;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "/exit") return std::nullopt;
    if (!line.empty()) return line;
  }
}

struct Turn {
  std::string role, content;
};

// The conversation as the template's messages (OpenAI's JSON form).
nlohmann::ordered_json Messages(const std::vector<Turn>& turns) {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (const Turn& t : turns) messages.push_back({{"role", t.role}, {"content", t.content}});
  return messages;
}

// One reply generated here: the prompt runs from position 0 of the one slot each turn (the
// conversation is re-read; a chat model's turns are short next to its prefill speed). Stops at
// EOS (Generate) and at the vocabulary's other end-of-generation tokens (here), unless
// ignore_eos; neither is printed.
absl::StatusOr<std::string> LocalReply(BatchRunner& runner, const Tokenizer& tok,
                                       const chat::ChatTemplate& tmpl,
                                       const ModelChatTemplate& specials,
                                       const std::vector<Turn>& turns, GenerationRequest req) {
  chat::ChatTemplateInputs in;
  in.messages = Messages(turns);
  in.add_generation_prompt = true;
  in.bos_token = specials.bos_token;
  in.eos_token = specials.eos_token;
  absl::StatusOr<std::string> prompt = tmpl.Render(in);
  if (!prompt.ok()) return prompt.status();
  req.prompt = EncodeChatPrompt(tok, *prompt);
  std::string reply;
  StreamingDetokenizer detok(tok);
  absl::StatusOr<GenerationStats> stats =
      Generate(runner, tok.eos(), req, [&](int32_t token, std::span<const float>) {
        if (!req.ignore_eos && tok.IsEog(token)) return false;
        const std::string text = detok.Push(token);
        reply += text;
        Print(text);
        return true;
      });
  const std::string rest = detok.Flush();
  reply += rest;
  Print(rest + "\n");
  if (!stats.ok()) return stats.status();
  return reply;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--template ", path, ": cannot open"));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int RunChat(const std::vector<std::string>& args) {
  std::string model_path, server, system, template_path;
  int32_t max_new_tokens = 0, threads = 0, context = 0;
  SamplingParams sp;
  bool ignore_eos = false;
  ClientSecurityFlags sec;
  po::options_description opts("options");
  opts.add_options()
      ("model,m", po::value(&model_path), "model file (GGUF): generate on this machine")
      ("server", po::value(&server), "or: the gateway at HOST:PORT (its Chat call)")
      ("system", po::value(&system), "a system message that opens the conversation")
      ("template", po::value(&template_path), "a Jinja chat template file instead of the model's")
      ("max-new-tokens,n", po::value(&max_new_tokens)->default_value(256), "tokens per reply at most");
  AddSamplingOptions(opts, sp);
  opts.add_options()
      ("ignore-eos", po::bool_switch(&ignore_eos), "keep generating past the end-of-turn and end-of-sequence tokens")
      ("threads", po::value(&threads)->default_value(0), "--model: CPU threads (0 = all cores)")
      ("context", po::value(&context)->default_value(0), "--model: KV cache positions, the whole conversation's (0 = the model's context)");
  AddClientSecurityOptions(opts, sec);
  po::variables_map vm;
  int exit_code = 0;
  if (!ParseOptions("chat", "(--model M.gguf | --server HOST:PORT) [--system TEXT] [options]",
                    opts, {}, args, vm, exit_code)) {
    return exit_code;
  }
  if (vm.count("model") == vm.count("server")) return Fail("give exactly one of --model and --server");
  if (max_new_tokens < 1) return Fail("--max-new-tokens must be >= 1");
  if (threads < 0) return Fail("--threads must be >= 0");
  if (context < 0) return Fail("--context must be >= 0");
  if (absl::Status s = ValidateSamplingParams(sp); !s.ok()) return Fail(std::string(s.message()));
  std::optional<std::string> template_source;
  if (vm.count("template")) {
    absl::StatusOr<std::string> t = ReadFile(template_path);
    if (!t.ok()) return Fail(std::string(t.status().message()));
    template_source = *std::move(t);
  }
  std::vector<Turn> turns;
  if (vm.count("system")) turns.push_back({"system", system});
  const bool interactive = isatty(STDIN_FILENO) == 1;

  if (vm.count("server")) {
    for (const char* flag : {"threads", "context"}) {
      if (!vm[flag].defaulted()) return Fail(std::string("--") + flag + " is for --model; the gateway has its own");
    }
    if (sp.penalty_window != 64) return Fail("--penalty-window is fixed at 64 by the gateway");
    absl::StatusOr<ClientSecurity> security =
        LoadClientSecurity(sec.tls_ca, sec.tls_cert, sec.tls_key, sec.auth_token_file);
    if (!security.ok()) return Fail(std::string(security.status().message()));
    v1::ChatRequest req;
    req.set_max_new_tokens(max_new_tokens);
    SetSamplingFields(sp, !vm["seed"].defaulted(), req);
    req.set_ignore_eos(ignore_eos);
    if (template_source.has_value()) req.set_chat_template(*template_source);
    while (std::optional<std::string> line = NextTurn(interactive)) {
      turns.push_back({"user", *line});
      req.clear_messages();
      for (const Turn& t : turns) {
        v1::ChatMessage* m = req.add_messages();
        m->set_role(t.role);
        m->set_content(t.content);
      }
      std::string reply;
      absl::StatusOr<v1::Final> final = StreamChat(
          server, req,
          [&](const v1::TokenChunk& chunk) {
            reply += chunk.text();
            Print(chunk.text());
          },
          nullptr, *security);
      if (!final.ok()) {
        if (!reply.empty()) Print("\n");
        return Fail(std::string(final.status().message()));
      }
      reply += final->text();
      Print(final->text() + "\n");
      turns.push_back({"assistant", reply});
    }
    return 0;
  }

  for (const char* flag : {"tls-ca", "tls-cert", "tls-key", "auth-token-file"}) {
    if (vm.count(flag)) return Fail(std::string("--") + flag + " needs --server");
  }
  absl::StatusOr<std::unique_ptr<Model>> model_or = Model::Load(model_path);
  if (!model_or.ok()) return Fail(std::string(model_or.status().message()));
  // Chat runs the dense FFN whole in this process, as `generate` in dense mode: its Q4_0 and
  // K-quant (Q4_K, Q5_K, Q6_K) matrices get the interleaved copy too (THERMOCLINE_REPACK=0
  // turns it off).
  if (absl::Status s = (*model_or)->InterleaveDenseFfn(); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  const Model& model = **model_or;
  std::cerr << absl::StrFormat("thermocline chat: %s weights, %d bytes in interleaved copies\n",
                               model.weight_type_name(), model.interleaved_bytes());
  ModelChatTemplate specials = ReadModelChatTemplate(model.file());
  if (!template_source.has_value()) {
    if (!specials.source.has_value()) {
      return Fail(absl::StrCat("model ", model_path,
                               " has no chat template (tokenizer.chat_template); pass --template"));
    }
    template_source = specials.source;
  }
  absl::StatusOr<chat::ChatTemplate> tmpl = chat::ChatTemplate::Parse(*template_source);
  if (!tmpl.ok()) return Fail(std::string(tmpl.status().message()));
  const int64_t capacity = context > 0 ? context : model.config().context_length;
  if (capacity > model.config().context_length) {
    return Fail(absl::StrCat("--context ", context, " exceeds the model's context of ",
                             model.config().context_length));
  }
  auto kv = KvCache::Create(model.config(), 1, capacity, GgmlType::kF32);
  if (!kv.ok()) return Fail(std::string(kv.status().message()));
  const int n_threads = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  ThreadPool pool(n_threads);
  ForwardPass pass(model, *kv, pool);
  ForwardPassRunner runner(pass);
  GenerationRequest req;
  req.max_new_tokens = max_new_tokens;
  req.sampling = sp;
  req.ignore_eos = ignore_eos;
  while (std::optional<std::string> line = NextTurn(interactive)) {
    turns.push_back({"user", *line});
    absl::StatusOr<std::string> reply = LocalReply(runner, model.tokenizer(), *tmpl, specials,
                                                   turns, req);
    if (!reply.ok()) return Fail(std::string(reply.status().message()));
    turns.push_back({"assistant", *std::move(reply)});
  }
  return 0;
}

const CommandRegistrar kRegistrar({"chat",
                                   "a conversation through the model's chat template, one user "
                                   "turn per line of standard input (--model or --server)",
                                   &RunChat});

}  // namespace
}  // namespace thermocline::tools
