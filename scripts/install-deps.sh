#!/usr/bin/env bash
# Installs the Debian 12 packages tpfabric builds and tests with. Idempotent:
# does nothing (and needs no network) when every package is already present.
# CUDA 13 and NCCL are not Debian packages: when /usr/local/cuda is absent the
# build turns those features off by itself.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mapfile -t pkgs < <(grep -v '^\s*#' "$here/debian-packages.txt" | tr -s ' \t' '\n' | sed '/^$/d')
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${#missing[@]} Debian packages: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
