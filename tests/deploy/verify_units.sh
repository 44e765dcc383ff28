#!/usr/bin/env bash
# deploy_units_verify: installs the build into a temporary prefix (cmake --install --prefix) and
# checks what landed there: the executables, the example configuration, the sysusers entry, and
# every systemd unit through `systemd-analyze verify`. Usage: verify_units.sh CMAKE BUILD_DIR
# SYSTEMD_ANALYZE.
#
# systemd-analyze reports most unit errors (an unknown directive, a bad value) as warnings on
# stderr and still exits 0, so any output line fails the test, except the environmental ones
# listed in ALLOWED: they describe the machine running the test (no system bus in a container,
# no `thermocline` user before systemd-sysusers ran), not the units. The test then proves that
# this check catches real errors: a copy with a misspelled directive and one with a bad value
# must both fail it.
set -euo pipefail
cmake=$1 build=$2 analyze=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log"
units=$prefix/lib/systemd/system
for f in bin/thermocline bin/thermocline-gateway bin/thermocline-gpu-worker \
         bin/thermocline-cpu-worker share/thermocline/thermocline.env.example \
         lib/sysusers.d/thermocline.conf; do
  [[ -e $prefix/$f ]] || { echo "FAIL: $f was not installed"; exit 1; }
done
for u in thermocline.service thermocline-gateway.service thermocline-gpu-worker.service \
         thermocline-cpu-worker.service thermocline.target; do
  [[ -f $units/$u ]] || { echo "FAIL: unit $u was not installed"; exit 1; }
done
# The units name the installed executables by their absolute path under the prefix.
grep -q "^ExecStart=$prefix/bin/thermocline-gateway " "$units/thermocline.service" ||
  { echo "FAIL: thermocline.service does not run $prefix/bin/thermocline-gateway"; exit 1; }
if grep -n '@[A-Z_]*@' "$units"/*.service; then echo "FAIL: unsubstituted placeholder"; exit 1; fi

ALLOWED='Failed to connect to .*bus|Failed to resolve user|User .* (not found|does not exist)|Cannot find user'

# verify FILE...: 0 when systemd-analyze accepts them without a single complaint.
verify() {
  local out rc=0
  out=$(cd "$(dirname "$1")" && "$analyze" verify "$@" 2>&1) || rc=$?
  out=$(grep -Ev "$ALLOWED" <<<"$out" || true)
  if [[ $rc -ne 0 || -n $out ]]; then
    printf '%s\n' "$out"
    return 1
  fi
}

verify "$units"/thermocline.service "$units"/thermocline-gateway.service \
       "$units"/thermocline-gpu-worker.service "$units"/thermocline-cpu-worker.service \
       "$units"/thermocline.target || { echo "FAIL: systemd-analyze verify complained"; exit 1; }
echo "ok: the installed units verify cleanly"

# The check must catch real mistakes.
mkdir "$tmp/bad"
sed 's/^Restart=on-failure/Restartt=on-failure/' "$units/thermocline.service" \
  >"$tmp/bad/thermocline.service"
sed 's/^NUMAPolicy=bind/NUMAPolicy=bnid/' "$units/thermocline-cpu-worker.service" \
  >"$tmp/bad/thermocline-cpu-worker.service"
for b in "$tmp"/bad/*.service; do
  if verify "$b" >/dev/null; then
    echo "FAIL: a unit with a deliberate error ($(basename "$b")) passed the check"
    exit 1
  fi
done
echo "ok: units with a misspelled directive or a bad value are rejected"
