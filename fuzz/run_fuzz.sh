#!/usr/bin/env bash
# One fuzz target as a Meson test (suite 'fuzz'):
#   run_fuzz.sh <fuzzer> <make_seeds> <target> <source root> <work dir>
# 1. replays every input in tests/fuzz-regressions/<target>/ (a crash once
#    found must stay fixed), 2. writes the seed corpus, 3. fuzzes for
#    $TPF_FUZZ_SECONDS (default 12) from the seeds plus what earlier runs
#    in this build dir found. A crash leaves its input in <work dir>/artifacts/
#    (copy it to tests/fuzz-regressions/<target>/). Exit non-zero on any crash.
set -uo pipefail
fuzzer=$1 seeds=$2 target=$3 root=$4 work=$5
secs=${TPF_FUZZ_SECONDS:-12}
reg="$root/tests/fuzz-regressions/$target"
mkdir -p "$work/corpus" "$work/seeds" "$work/artifacts"
# Leaks are fatal, UBSan too (the target is built with -fno-sanitize-recover).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

if [ -d "$reg" ] && [ -n "$(ls -A "$reg" 2>/dev/null)" ]; then
  n=$(find "$reg" -type f | wc -l)
  echo "== replaying $n regression input(s) from $reg"
  find "$reg" -type f -print0 | xargs -0 "$fuzzer" -runs=1 >"$work/replay.log" 2>&1 || {
    cat "$work/replay.log"; echo "FAIL: a regression input of $target crashes again"; exit 1; }
fi
"$seeds" "$target" "$work/seeds" "$root" || exit 1
echo "== fuzzing $target for ${secs}s"
"$fuzzer" "$work/corpus" "$work/seeds" ${reg:+$( [ -d "$reg" ] && echo "$reg")} \
  -max_total_time="$secs" -timeout=30 -rss_limit_mb=2048 -max_len=65536 \
  -artifact_prefix="$work/artifacts/" -print_final_stats=1 -close_fd_mask=1 2>&1 | grep -v -E '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)'
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || echo "FAIL: $target crashed (exit $rc); input in $work/artifacts/"
exit "$rc"
