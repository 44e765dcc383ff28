// The command-line pieces that `thermocline generate` and `thermocline chat` share: the sampling
// flags (same names, defaults and checks in both) and how they travel to a gateway, and the
// flags that reach a secured gateway.
#pragma once

#include <string>

#include "shared/runtime/sampler.h"
#include "tools/command.h"
#include "tools/grpc_client.h"

namespace thermocline::tools {

// --temperature/-t, --top-k, --top-p, --min-p, --repeat-penalty, --presence-penalty,
// --frequency-penalty, --penalty-window and --seed, into `sp` (defaults: SamplingParams').
void AddSamplingOptions(po::options_description& opts, SamplingParams& sp);

// Every sampling field of a GenerateRequest or ChatRequest (fields 4 to 11, the same in both)
// from `sp`, defaults included, so that a gateway's own defaults never make a --server run
// differ from a local one with the same flags. The seed only when `seed_given`: the gateway
// then draws one and reports it, as the proto promises (a fixed default would make every
// unseeded request sample alike).
template <class Request>
void SetSamplingFields(const SamplingParams& sp, bool seed_given, Request& req) {
  req.set_temperature(sp.temperature);
  req.set_top_k(sp.top_k);
  req.set_top_p(sp.top_p);
  req.set_min_p(sp.min_p);
  req.set_repetition_penalty(sp.repetition_penalty);
  req.set_presence_penalty(sp.presence_penalty);
  req.set_frequency_penalty(sp.frequency_penalty);
  if (seed_given) req.set_seed(sp.seed);
}

// --tls-ca, --tls-cert, --tls-key and --auth-token-file (LoadClientSecurity reads them).
struct ClientSecurityFlags {
  std::string tls_ca, tls_cert, tls_key, auth_token_file;
};
void AddClientSecurityOptions(po::options_description& opts, ClientSecurityFlags& flags);

}  // namespace thermocline::tools
