// A stand-in worker for the driver's supervisor tests: it does what the real workers do for
// their supervisor (attach to the instance, take the role's slot, become ready, heartbeat every
// 50 ms, exit on SIGTERM or when the gateway is gone) and nothing else, so that the tests of
// restart budgets and backoff need no model.
//   driver_fake_worker --instance I --role gpu|cpu [--die-if-exists FILE] [--exit-code C]
// With --die-if-exists, the worker exits with C (default 3) right after attaching when FILE
// exists: a worker that crashes at start.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "shared/ipc/transport.h"

namespace {
std::atomic<bool> g_stop{false};
void OnTerm(int) { g_stop = true; }
}  // namespace

int main(int argc, char** argv) {
  using namespace thermocline::ipc;
  std::string instance, role_name, die_file;
  int exit_code = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--instance") instance = argv[i + 1];
    else if (a == "--role") role_name = argv[i + 1];
    else if (a == "--die-if-exists") die_file = argv[i + 1];
    else if (a == "--exit-code") exit_code = std::atoi(argv[i + 1]);
  }
  if (instance.empty() || (role_name != "gpu" && role_name != "cpu")) {
    std::fprintf(stderr, "usage: driver_fake_worker --instance I --role gpu|cpu\n");
    return 2;
  }
  signal(SIGTERM, OnTerm);
  const Role role = role_name == "gpu" ? Role::kGpuWorker : Role::kCpuWorker;
  std::unique_ptr<Transport> t;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    auto attached = Transport::Attach(instance, role);
    if (attached.ok()) {
      t = std::move(*attached);
      break;
    }
    if (std::chrono::steady_clock::now() > give_up) {
      std::fprintf(stderr, "driver_fake_worker: %s\n", attached.status().ToString().c_str());
      return 3;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  t->SetState(ProcessState::kStarting);
  if (!die_file.empty() && access(die_file.c_str(), F_OK) == 0) return exit_code;
  t->Heartbeat();
  t->SetState(ProcessState::kReady);
  while (!g_stop && t->OwnerAlive()) {
    t->Heartbeat();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  t->SetState(ProcessState::kStopping);
  return 0;
}
