#!/usr/bin/env bash
# Run a command in network, mount and PID namespaces of its own, so that two runs of the network tiers can go side by
# side: each has its own loopback (ports), root-namespace interfaces, /run/mbalancer (the network claim, OVS and bmv2
# run folders, switch records), /run/netns, bpffs (pins), sysfs (showing its own interfaces) and process list (pgrep).
# Both networks MBalancer builds put the controller's port at 10.0.0.254 in the root namespace, hence one at a time
# per namespace (topologies/claim.py); here each run has a root namespace of its own.
# Usage: tests/isolated.sh COMMAND [ARGS...]   (root; util-linux's unshare)
set -euo pipefail
[ "$#" -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
mkdir -p /run/mbalancer /run/netns  # mount points (what is in them stays the machine's: tmpfs goes over them)
# bash, not the command, is the namespace's PID 1: it reaps the orphans a killed test leaves, as init would.
exec unshare --net --mount --pid --fork --kill-child --mount-proc --propagation private bash -c '
set -e
umount -l /sys  # not stacked on the machine'"'"'s: `ip netns exec` unmounts one sysfs, and tc looks for bpffs below it
mount -t sysfs sysfs /sys
mount -t bpf bpf /sys/fs/bpf
mount -t tmpfs tmpfs /sys/fs/cgroup
mkdir /sys/fs/cgroup/unified
mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified
mount -t tmpfs tmpfs /run/mbalancer
mount -t tmpfs tmpfs /run/netns
ip link set lo up
set +e
"$@"
exit $?' isolated "$@"
