#!/usr/bin/env bash
# `make test`: every tier, in pytest runs side by side. The tiers that make no network (unit, slow, etcd: loopback
# only) run in the background. The ones that do (root, bmv2, mininet: mostly waiting on timers and links) run as two
# streams of modules (tests/network_streams.py), each in network, mount and PID namespaces of its own
# (tests/isolated.sh), since one MBalancer network at a time holds per namespace. The testbed stream runs in front;
# the others' output is shown when they end, and every run's failures are listed again last (CI shows the tail).
# Any failing fails.
# With pytest arguments (a path, -k ...), or not root, the network tiers run as one stream, in this namespace.
# Usage: tests/run_tiers.sh PYTHON [pytest arguments for every run]
set -uo pipefail
python="$1"; shift
offline="unit or slow or etcd"
network="root or bmv2 or mininet"
here="$(dirname "$0")"
names=()
logs=()
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -f "${logs[@]}"' EXIT

# in_background NAME COMMAND...: run it with its output in a log of its own, shown once the front run has ended
in_background() {
    local name="$1"; shift
    local log
    log="$(mktemp -t "mbalancer-$name.XXXXXX")"
    "$@" > "$log" 2>&1 &
    pids+=("$!"); logs+=("$log"); names+=("${name//-/ }")
    echo "tiers ${names[-1]}: running beside (output below when all are done)"
}

in_background "offline-$offline" "$python" -m pytest -m "$offline" "$@"
if [ "$#" -eq 0 ] && [ "$(id -u)" -eq 0 ]; then
    read -r -a namespaces <<< "$("$python" -m tests.network_streams namespaces)"
    read -r -a testbed <<< "$("$python" -m tests.network_streams testbed)"
    in_background "network-namespaces" "$here/isolated.sh" "$python" -m pytest -m "$network" "${namespaces[@]}"
    echo "tiers $network, testbed stream:"
    front=("$here/isolated.sh" "$python" -m pytest -m "$network" "${testbed[@]}")
else
    front=("$python" -m pytest -m "$network" "$@")
fi
front_log="$(mktemp -t mbalancer-front.XXXXXX)"
logs+=("$front_log")
"${front[@]}" 2>&1 | tee "$front_log"
codes=("${PIPESTATUS[0]}")
for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    codes+=("$?")
    echo
    echo "======== tiers ${names[$i]} ========"
    cat "${logs[$i]}"
done
echo
echo "======== failures and errors of every run (pytest's short summaries) ========"
grep -hE '^(FAILED|ERROR) ' "${logs[@]}" || echo "none"
echo "exit codes (front, then background runs in order): ${codes[*]}"
# pytest's 5 is "nothing collected" (a -k or a path that selects only one side): not a failure of the other side
collected=0
for rc in "${codes[@]}"; do
    [ "$rc" -eq 0 ] || [ "$rc" -eq 5 ] || exit "$rc"
    [ "$rc" -eq 5 ] || collected=1
done
[ "$collected" -eq 1 ] || exit 5
