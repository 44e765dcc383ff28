// The THERMOCLINE_* environment switches: each turns a layout, a kind of memory or an
// instruction set off, for A/B measurements and as a workaround (docs/operations.md,
// "Environment switches"). One table and one parser for all of them, so that every switch takes
// the same values: unset, empty or 1 is on, 0 is off. Any other value ("off", "false", a typo)
// is an error a process reports at start (CheckEnvironmentSwitches, startup_environment.h)
// instead of reading it as on.
#pragma once

#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace thermocline {

enum class EnvSwitch {
  kRepack,         // THERMOCLINE_REPACK: the interleaved 8-row copies of dense matrices
  kNeuronBundles,  // THERMOCLINE_NEURON_BUNDLES: each neuron's gate, up and down rows side by side
  kHugePages,      // THERMOCLINE_HUGEPAGES: huge-page advice for copies, the KV cache, cold rows
  kAmx,            // THERMOCLINE_AMX: AMX-INT8 tiles for the Q4_0 / Q4_K prompt GEMMs
};

// Every switch, in the table's order.
std::span<const EnvSwitch> AllEnvSwitches();

// The variable's name, e.g. "THERMOCLINE_REPACK".
const char* EnvSwitchName(EnvSwitch s);

// The switch as the environment sets it now; an error names the variable, its value and what
// 0 would turn off.
absl::StatusOr<bool> ReadEnvSwitch(EnvSwitch s);

// ReadEnvSwitch for code deep in a load or a kernel choice: a bad value is taken as on (the
// default) after a warning on stderr, once per switch. Processes refuse bad values at start
// (CheckEnvironmentSwitches), so only a program that skips that check gets here with one.
bool EnvSwitchOn(EnvSwitch s);

// The start check over all of them and THERMOCLINE_SIMD: CheckEnvironmentSwitches
// (startup_environment.h).

}  // namespace thermocline
