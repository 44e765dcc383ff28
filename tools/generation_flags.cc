#include "tools/generation_flags.h"

namespace thermocline::tools {

void AddSamplingOptions(po::options_description& opts, SamplingParams& sp) {
  opts.add_options()
      ("temperature,t", po::value(&sp.temperature)->default_value(0.8f, "0.8"), "0 = greedy")
      ("top-k", po::value(&sp.top_k)->default_value(40), "keep the k most likely tokens (0 = off)")
      ("top-p", po::value(&sp.top_p)->default_value(0.95f, "0.95"), "nucleus sampling mass (1 = off)")
      ("min-p", po::value(&sp.min_p)->default_value(0.05f, "0.05"), "drop tokens below min-p * p(top) (0 = off)")
      ("repeat-penalty", po::value(&sp.repetition_penalty)->default_value(1.0f, "1.0"), "repetition penalty (1 = off)")
      ("presence-penalty", po::value(&sp.presence_penalty)->default_value(0.0f, "0"), "presence penalty")
      ("frequency-penalty", po::value(&sp.frequency_penalty)->default_value(0.0f, "0"), "frequency penalty")
      ("penalty-window", po::value(&sp.penalty_window)->default_value(64), "tokens the penalties look back over")
      ("seed", po::value(&sp.seed)->default_value(0), "random seed (same seed, same output)");
}

void AddClientSecurityOptions(po::options_description& opts, ClientSecurityFlags& flags) {
  opts.add_options()
      ("tls-ca", po::value(&flags.tls_ca), "connect over TLS, trusting this PEM CA (default with --tls-cert: the system's roots)")
      ("tls-cert", po::value(&flags.tls_cert), "mutual TLS: this PEM client certificate (with --tls-key)")
      ("tls-key", po::value(&flags.tls_key), "mutual TLS: the PEM private key of --tls-cert")
      ("auth-token-file", po::value(&flags.auth_token_file), "send 'authorization: Bearer <first line of this file>'");
}

}  // namespace thermocline::tools
