#!/usr/bin/env bash
# Install the Debian packages listed in install/apt-packages.txt that are not installed yet.
# Idempotent: when nothing is missing it does not touch apt at all, so a second run takes well under a second.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
list="$here/apt-packages.txt"

mapfile -t wanted < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$list" | grep -v '^$')
missing=()
for pkg in "${wanted[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    [ "$status" = "installed" ] || missing+=("$pkg")
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install/system.sh: all ${#wanted[@]} system packages present"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install/system.sh: missing packages (${missing[*]}); run as root to install them" >&2
    exit 1
fi
echo "install/system.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
