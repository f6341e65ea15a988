#!/usr/bin/env bash
# Installs, with apt-get, the Debian packages moecore builds and tests with,
# skipping the ones already present. Run as root (or with sudo available).
set -euo pipefail
pkgs=(build-essential pkg-config libopenblas-dev libyaml-dev libjson-c-dev check
      python3 python3-venv python3-numpy python3-torch python3-matplotlib fortunes clang libclang-rt-14-dev
      libopenmpi-dev openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
