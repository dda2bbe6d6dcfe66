#!/usr/bin/env bash
# Meson's gpu_multiprocess test: the real tpfabricd on a temporary socket and
# two real rank processes (tpf-gpurank) in one Device group, scenario "data"
# (gathers and sums of every size class, checked byte/bit-exact on every
# rank). Without a CUDA device the ranks exit 77 and so does this script
# (Meson: SKIP). On the GPU machine tests/gpu/run.sh runs every scenario.
#   multiprocess.sh TPFABRICD TPF_GPURANK
set -uo pipefail
daemon=$1 rank=$2
dir=$(mktemp -d)
dpid=
trap '[ -n "$dpid" ] && kill "$dpid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
# Probe for a device before starting anything: a rank with no device exits 77 at once.
"$rank" --scenario has-device >"$dir/probe.log" 2>&1
probe=$?
case $probe in
0) ;;
77) echo "SKIP: $(grep -h RESULT "$dir/probe.log" | sed 's/.*SKIP //')"; exit 77 ;;
*) echo "FAIL: tpf-gpurank --scenario has-device exited $probe"; cat "$dir/probe.log"; exit 1 ;;
esac
"$daemon" --socket "$dir/d.sock" --foreground >"$dir/daemon.log" 2>&1 &
dpid=$!
for _ in $(seq 100); do [ -S "$dir/d.sock" ] && break; sleep 0.1; done
[ -S "$dir/d.sock" ] || { echo "FAIL: tpfabricd did not start"; cat "$dir/daemon.log"; exit 1; }
# A port the kernel says is free now (a random one may be taken).
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for r in 0 1; do
  timeout 120 "$rank" --socket "$dir/d.sock" --bootstrap 127.0.0.1:$port --rank $r --world 2 --scenario data \
    >"$dir/rank$r.log" 2>&1 &
  pids+=($!)
done
rc=0 skipped=0
for p in "${pids[@]}"; do
  wait "$p"; r=$?
  case $r in 0) ;; 77) skipped=$((skipped + 1)) ;; *) rc=1 ;; esac
done
cat "$dir"/rank*.log | grep RESULT
[ "$rc" = 0 ] || { cat "$dir"/rank*.log | grep -v RESULT | head -40; tail -20 "$dir/daemon.log"; exit 1; }
[ "$skipped" = 2 ] && exit 77
[ "$skipped" = 0 ] || { echo "FAIL: one rank skipped, the other ran"; exit 1; }
exit 0
