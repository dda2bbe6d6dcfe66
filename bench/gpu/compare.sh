#!/usr/bin/env bash
# Two builds measured in one run, interleaved, on the GPU machine: the
# before/after check of a change that must not cost speed (docs/development.md,
# "Comparing two builds").
#   bash bench/gpu/compare.sh BEFORE AFTER [OUTDIR]
# BEFORE, AFTER: carried binary folders as tests/gpu/run.sh takes them
# (tpfabricd, tpf-gpubench, tpf-bench, and lib/ with libtpfabric.so.0 and the
# .so files the machine lacks). OUTDIR: logs and compare.md (default $OUT,
# else ./compare-out).
# TPF_COMPARE_ROUNDS rounds (default 3); each runs both builds, the order
# alternating (before first in odd rounds), and each build:
#   - its own tpfabricd under MPS: tpf-gpubench --mode sizes on the ipc route
#     at W = 2, 4, 8 and on the proxy route at W = 2;
#   - tpf-bench run (host path, its own daemon) at W = 2 and 16, 4 KiB gather.
# Every cell is the median over the rounds. compare.md: one row per
# measurement (ipc and proxy gathers at 4 and 64 KiB, host 4 KiB gathers),
# before, after, after / before, and "slower" where after is more than
# TPF_COMPARE_LIMIT (default 3) % slower. Exit 0 when no row is, 1 when one
# is, 2 on a failed run, 77 with no GPU.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
[ $# -ge 2 ] || { echo "usage: bash bench/gpu/compare.sh BEFORE AFTER [OUTDIR]"; exit 2; }
before=$(cd "$1" && pwd) || exit 2
after=$(cd "$2" && pwd) || exit 2
out=${3:-${OUT:-compare-out}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rounds=${TPF_COMPARE_ROUNDS:-3}
for side in "$before" "$after"; do
  for f in tpfabricd tpf-gpubench tpf-bench lib/libtpfabric.so.0; do
    [ -e "$side/$f" ] || { echo "compare: $side/$f is missing (carry it as tests/gpu/run.sh's binaries)"; exit 2; }
  done
done
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: no GPU here (nvidia-smi -L failed)"
  exit 77
fi
export NCCL_NVLS_ENABLE=0
freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

mps=$(mktemp -d)
export CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_LOG_DIRECTORY=$mps/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || { echo "compare: MPS did not start"; exit 2; }
dpid=
cleanup() {
  [ -n "$dpid" ] && kill "$dpid" 2>/dev/null
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
  rm -rf "$mps"
}
trap cleanup EXIT

failed=0
# bench SIDE NAME ROUND: one build's measurements, logs under $out/NAME-rROUND-*.
bench() {
  local side=$1 name=$2 round=$3 sock w route port r pids log
  export LD_LIBRARY_PATH="$side/lib"
  sock=$mps/$name.sock
  "$side/tpfabricd" --socket "$sock" --foreground >"$out/$name-r$round-tpfabricd.log" 2>&1 &
  dpid=$!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  for spec in ipc:2 ipc:4 ipc:8 proxy:2; do
    route=${spec%:*} w=${spec#*:}
    log=$out/$name-r$round-$route-w$w.log
    port=$(freeport)
    pids=()
    for ((r = 0; r < w; r++)); do
      timeout 120 "$side/tpf-gpubench" --socket "$sock" --bootstrap "127.0.0.1:$port" --rank $r --world "$w" \
        --route "$route" --mode sizes >>"$log" 2>&1 &
      pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r" || { echo "compare: $name round $round $route W=$w failed ($log)"; failed=1; }; done
  done
  kill "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null; dpid=
  timeout 300 "$side/tpf-bench" run --daemon "$side/tpfabricd" --world 2,16 --sizes 4KiB --ops gather \
    --json "$out/$name-r$round-host.json" >"$out/$name-r$round-host.log" 2>&1 ||
    { echo "compare: $name round $round tpf-bench failed ($out/$name-r$round-host.log)"; failed=1; }
  unset LD_LIBRARY_PATH
}

for ((i = 1; i <= rounds; i++)); do
  echo "== round $i of $rounds: $(date -u +%FT%TZ)"
  if ((i % 2)); then bench "$before" before $i; bench "$after" after $i; else bench "$after" after $i; bench "$before" before $i; fi
done

python3 - "$out" "${TPF_COMPARE_LIMIT:-3}" "$before" "$after" <<'PY'
import glob, json, os, re, statistics, sys
out, limit, before, after = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
ROW = re.compile(r"^ROW (\S+) W=(\d+) (\d+) ([\d.]+)\s*$")
def cells(name):
    seen = {}
    for p in glob.glob(os.path.join(out, f"{name}-r*-*-w*.log")):
        for line in open(p, errors="replace"):
            m = ROW.match(line)
            if m and m.group(1) in ("ipc-gather", "proxy-gather") and int(m.group(3)) in (4096, 65536):
                seen.setdefault((m.group(1), int(m.group(2)), int(m.group(3))), []).append(float(m.group(4)))
    for p in glob.glob(os.path.join(out, f"{name}-r*-host.json")):
        try:
            doc = json.load(open(p))
        except (OSError, ValueError):
            continue
        for r in doc.get("results", []):
            if r.get("op") == "gather" and r.get("size") == 4096 and r.get("p50_us") is not None:
                seen.setdefault(("host-gather-p50", int(r["world"]), 4096), []).append(float(r["p50_us"]))
    return {k: statistics.median(v) for k, v in seen.items()}
b, a = cells("before"), cells("after")
lines = ["| measurement | W | bytes | before µs | after µs | after / before | verdict |",
         "| --- | --- | --- | ---: | ---: | ---: | --- |"]
slower = 0
for key in sorted(set(b) | set(a)):
    what, w, size = key
    x, y = b.get(key), a.get(key)
    if x is None or y is None:
        lines.append(f"| {what} | {w} | {size // 1024} KiB | {x or ''} | {y or ''} | | not measured by both |")
        continue
    worse = y > x * (1 + limit / 100)
    slower += worse
    lines.append(f"| {what} | {w} | {size // 1024} KiB | {x:.2f} | {y:.2f} | {y / x:.3f}x | "
                 f"{'slower by more than %g %%' % limit if worse else 'ok'} |")
text = "\n".join(lines) + f"\n\nBefore: {before}. After: {after}. Each cell the median of the rounds' values.\n"
open(os.path.join(out, "compare.md"), "w").write(text)
print(text)
sys.exit(1 if slower else 0)
PY
verdict=$?
[ $failed = 1 ] && exit 2
exit $verdict
