#!/usr/bin/env bash
# The whole test suite, as README.md and CI run it:
#   configure and build build/, run every Meson test (unit, integration, vm;
#   GPU tests skip with 77 where there is no GPU), then print one line
#   "N passed, N failed, N skipped". Exit status non-zero on any failure.
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
bash scripts/install-deps.sh
[ -f build/build.ninja ] || meson setup build >/dev/null || { echo "0 passed, 1 failed, 0 skipped"; exit 1; }
if ! meson compile -C build; then
  echo "build failed"
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
fi
meson test -C build --print-errorlogs --num-processes 2 "$@"
python3 tests/summary.py build/meson-logs/testlog.json
