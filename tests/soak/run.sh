#!/usr/bin/env bash
# Soak (not in CI; docs/reliability.md records the results):
#   1. SOAK_CALLS (1,000,000) allGathers of SOAK_SIZE (64) bytes at W=SOAK_WORLD (8)
#      on the host path: tpf-testrank processes against the real daemon;
#   2. SOAK_CYCLES (10,000) open/close cycles of a W=2 group (tpf-soak-openclose).
# Prints the daemon's RSS, open fds and region/group counts fresh, after a
# warm-up, and after each part; after the warm-up they must stay flat.
# Builds its own build dir (build-soak), or takes prebuilt binaries from
# SOAK_BIN (with their .so files in SOAK_BIN/lib). Exit 0 when every part passed and
# fds, regions and groups came back to their warm-up values.
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
calls=${SOAK_CALLS:-1000000}
cycles=${SOAK_CYCLES:-10000}
size=${SOAK_SIZE:-64}
world=${SOAK_WORLD:-8}
bd=${SOAK_BUILD:-build-soak}

if [ -n "${SOAK_BIN:-}" ]; then
  # Prebuilt (another machine): tpfabricd, tpf-testrank, tpfabricctl,
  # tpf-soak-openclose in SOAK_BIN, the .so files they need in SOAK_BIN/lib.
  daemon=$SOAK_BIN/tpfabricd rank=$SOAK_BIN/tpf-testrank ctl=$SOAK_BIN/tpfabricctl openclose=$SOAK_BIN/tpf-soak-openclose
  export LD_LIBRARY_PATH="$SOAK_BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  [ -f "$bd/build.ninja" ] || meson setup "$bd" -Dcuda=disabled -Dbuildtype=release >/dev/null || exit 1
  meson compile -C "$bd" daemon/tpfabricd tests/integration/tpf-testrank ctl/tpfabricctl client/tpfabric >/dev/null || exit 1
  c++ -std=c++20 -O2 -I"$top" -I"$top/client/include" -I"$bd" tests/soak/open_close.cpp -o "$bd/tpf-soak-openclose" \
    -L"$bd/client" -ltpfabric -Wl,-rpath,"$top/$bd/client" "$bd/common/libtpf_common.a" -pthread || exit 1
  daemon=$bd/daemon/tpfabricd rank=$bd/tests/integration/tpf-testrank ctl=$bd/ctl/tpfabricctl openclose=$bd/tpf-soak-openclose
fi

work=$(mktemp -d /tmp/tpf-soak-XXXXXX)
sock="$work/tpfabricd.sock"
"$daemon" --socket "$sock" --foreground --log-level warn 2>"$work/daemon.log" &
dpid=$!
cleanup() { kill "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# snapshot <label>: RSS (KiB), fds, regions, groups of the daemon.
declare -A snap
snapshot() {
  local rss fds st
  rss=$(awk '/^VmRSS/{print $2}' /proc/$dpid/status)
  fds=$(ls /proc/$dpid/fd | wc -l)
  st=$("$ctl" status --socket "$sock" --json | python3 -c \
    'import json,sys; d=json.load(sys.stdin); print(d["regions"]["count"], len(d["groups"]))')
  read -r regions groups <<<"$st"
  snap[$1]="$rss $fds $regions $groups"
  printf '%-22s rss=%6s KiB  fds=%4s  regions=%3s  groups=%3s\n' "$1" "$rss" "$fds" "$regions" "$groups"
}

# calls_part <iters>: W ranks, each making <iters> calls; prints the rate.
calls_part() {
  local iters=$1 port t0 t1 pids=() ok=0
  port=$(free_port)
  t0=$(date +%s.%N)
  for ((r = 0; r < world; r++)); do
    "$rank" --socket "$sock" --bootstrap "127.0.0.1:$port" --rank $r --world "$world" \
      --max-bytes 4096 --sizes "$size" --mode gather --iters "$iters" --timeout-ms 30000 >"$work/rank$r.out" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" && ok=$((ok + 1)); done
  t1=$(date +%s.%N)
  python3 -c "print(f'  {$iters} calls x W=$world of $size B: {$t1-$t0:.1f} s, {$iters/($t1-$t0):.0f} calls/s, $ok/$world ranks ok')"
  [ "$ok" -eq "$world" ] || { cat "$work"/rank*.out; return 1; }
}

openclose_part() {
  "$openclose" --socket "$sock" --cycles "$1" --port "$(free_port)"
}

echo "soak: $(date -u +%FT%TZ) $(nproc) CPUs, W=$world, $size B shards, $calls calls, $cycles open/close cycles"
status=0
snapshot fresh
calls_part 2000 || status=1
openclose_part 100 || status=1
snapshot after-warm-up
calls_part "$calls" || status=1
snapshot after-calls
openclose_part "$cycles" || status=1
snapshot after-open-close
warnings=$(grep -c -E '\b(warn|error|critical)\b' "$work/daemon.log")
echo "daemon log: $warnings warning/error lines"

read -r r0 f0 g0 n0 <<<"${snap[after-warm-up]}"
read -r r1 f1 g1 n1 <<<"${snap[after-open-close]}"
[ "$f0" = "$f1" ] && [ "$g1" = 0 ] && [ "$n1" = 0 ] || { echo "NOT FLAT: fds $f0 -> $f1, regions $g1, groups $n1"; status=1; }
# RSS: allow 10% (allocator arenas) over the warm-up value.
[ "$r1" -le $((r0 + r0 / 10)) ] || { echo "NOT FLAT: RSS $r0 -> $r1 KiB"; status=1; }
[ $status -eq 0 ] && echo "SOAK ok" || echo "SOAK FAILED"
exit $status
