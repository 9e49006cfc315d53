#!/usr/bin/env bash
# Install the Debian packages listed in a package list (default install/apt-packages.txt; install/p4.sh passes its
# own) that are not installed yet. Usage: install/system.sh [LIST]
# Idempotent: when nothing is missing it does not touch apt at all, so a second run takes well under a second.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
list=${1:-$here/apt-packages.txt}

mapfile -t wanted < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$list" | grep -v '^$')
missing=()
for pkg in "${wanted[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    [ "$status" = "installed" ] || missing+=("$pkg")
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install/system.sh: all ${#wanted[@]} packages of $(basename "$list") present"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install/system.sh: missing packages (${missing[*]}); run as root to install them" >&2
    exit 1
fi
echo "install/system.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# Name the packages apt cannot have (no candidate version) before installing, instead of one apt error among many.
unavailable=()
for pkg in "${missing[@]}"; do
    candidate=$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ {print $2}')
    [ -n "$candidate" ] && [ "$candidate" != "(none)" ] || unavailable+=("$pkg")
done
if [ ${#unavailable[@]} -gt 0 ]; then
    echo "install/system.sh: FAILED: apt has no version of ${unavailable[*]} (check /etc/apt/sources.list for Debian 12 main)" >&2
    exit 1
fi
# Packages start their services on install (Prometheus's would listen on :9090 and scrape nothing): the project
# starts the daemons it uses itself, so a policy-rc.d that says no is in place while apt runs (unless there is one).
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# install/system.sh: no service starts while it installs packages\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
fi
if ! apt-get install -y -q --no-install-recommends "${missing[@]}"; then
    echo "install/system.sh: FAILED: apt-get install of ${missing[*]} (apt's error is above)" >&2
    exit 1
fi
# ... nor at the next boot: the tests run their own Prometheus and etcd on loopback ports.
for service in prometheus etcd; do
    package=$service; [ "$service" = etcd ] && package=etcd-server
    if [[ " ${missing[*]} " == *" $package "* ]] && [ -d /run/systemd/system ]; then
        systemctl disable "$service.service" >/dev/null 2>&1 || true
    fi
done
