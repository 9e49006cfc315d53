#!/usr/bin/env bash
# `make test`: every tier, in two pytest runs side by side. The tiers that make no network (unit, slow, etcd: loopback
# only) run in the background while the ones that do (root, bmv2, mininet: one MBalancer network at a time, mostly
# waiting on timers and links) run in front; the background run's output is shown when it ends. Either failing fails.
# Usage: tests/run_tiers.sh PYTHON [pytest arguments for both runs]
set -uo pipefail
python="$1"; shift
offline="unit or slow or etcd"
network="root or bmv2 or mininet"
log="$(mktemp -t mbalancer-offline-tiers.XXXXXX)"
"$python" -m pytest -m "$offline" "$@" > "$log" 2>&1 &
background=$!
trap 'kill "$background" 2>/dev/null; rm -f "$log"' EXIT
echo "tiers $offline: running beside the network tiers (output below when both are done)"
"$python" -m pytest -m "$network" "$@"
network_rc=$?
wait "$background"
offline_rc=$?
echo
echo "======== tiers $offline ========"
cat "$log"
echo "network tiers: exit $network_rc; $offline: exit $offline_rc"
# pytest's 5 is "nothing collected" (a -k or a path that selects only one side): not a failure of the other side
for rc in "$network_rc" "$offline_rc"; do
    [ "$rc" -eq 0 ] || [ "$rc" -eq 5 ] || exit "$rc"
done
[ "$network_rc" -ne 5 ] || [ "$offline_rc" -ne 5 ] || exit 5
