#!/usr/bin/env bash
# The main job on an embedded default: install what is missing, build, run.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
bash scripts/install-deps.sh
[ -f build/build.ninja ] || meson setup build
meson compile -C build
./build/ctl/tpfabricctl layout --world 8 --max-bytes 512KiB --stripes 2
