#!/usr/bin/env bash
# The main job: install what is missing, build, start tpfabricd on a temporary
# socket, run four rank processes through a sweep of all-gather and bf16
# all-reduce sizes (latency table beside a raw shared-memory floor), show
# `tpfabricctl status` while their group is open, stop the daemon cleanly.
# Exits non-zero with the failing step named; the daemon never outlives it.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

world=4
sizes=64,4KiB,64KiB,512KiB
iters=${TPF_DEMO_ITERS:-100}   # timed calls per (op, size) and rank, at most
hold_ms=6000                   # the ranks keep their group open this long after the table

step=0
started=$SECONDS
say() { printf '\n== [%d] %s\n' "$step" "$*"; }
next() { step=$((step + 1)); say "$@"; }
fail() {
  printf '\ndemo: FAILED at step %d: %s\n' "$step" "$*" >&2
  if [ -n "${tmp:-}" ] && [ -s "$tmp/daemon.log" ]; then
    echo "--- last lines of the daemon log ($tmp/daemon.log):" >&2
    tail -n 20 "$tmp/daemon.log" >&2
  fi
  exit 1
}

tmp="" daemon_pid="" bench_pid=""
cleanup() {
  local rc=$?
  # Only the processes this script started, by pid.
  if [ -n "$bench_pid" ] && kill -0 "$bench_pid" 2>/dev/null; then kill "$bench_pid" 2>/dev/null || true; fi
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$daemon_pid" 2>/dev/null || true
  fi
  # Keep the logs of a failed run; drop them after a good one.
  if [ -n "$tmp" ]; then
    if [ "$rc" -eq 0 ]; then rm -rf "$tmp"; else echo "demo: logs kept in $tmp" >&2; fi
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

next "dependencies (scripts/install-deps.sh)"
bash scripts/install-deps.sh || fail "installing the Debian packages"
echo "ok"

next "configure and build (meson, ninja)"
if [ ! -f build/build.ninja ]; then
  meson setup build || fail "meson setup build"
fi
meson compile -C build || fail "meson compile -C build"
daemon=build/daemon/tpfabricd ctl=build/ctl/tpfabricctl bench=build/bench/tpf-bench
for exe in "$daemon" "$ctl" "$bench"; do
  [ -x "$exe" ] || fail "$exe was not built (bench/ needs subdir('bench') in the root meson.build)"
done
build_done=$SECONDS

next "start tpfabricd on a temporary socket"
tmp=$(mktemp -d /tmp/tpf-demo-XXXXXX)
socket=$tmp/tpfabricd.sock
"$daemon" --socket "$socket" --foreground --log-level info >"$tmp/daemon.log" 2>&1 &
daemon_pid=$!
echo "tpfabricd pid $daemon_pid, socket $socket, log $tmp/daemon.log"
ready=0
for _ in $(seq 100); do
  kill -0 "$daemon_pid" 2>/dev/null || fail "tpfabricd exited at start-up"
  if "$ctl" status --socket "$socket" --timeout-ms 1000 >/dev/null 2>&1; then ready=1; break; fi
  sleep 0.1
done
[ "$ready" -eq 1 ] || fail "tpfabricctl status did not reach tpfabricd within 10 s"
echo "tpfabricctl status answers"

next "workload: $world rank processes, gather and bf16 sum over $sizes"
"$bench" run --socket "$socket" --world "$world" --sizes "$sizes" --iters "$iters" --warmup 10 \
  --hold-ms "$hold_ms" >"$tmp/bench.out" 2>&1 &
bench_pid=$!
holding=0
for _ in $(seq 900); do
  if grep -q "hold the group open" "$tmp/bench.out"; then holding=1; break; fi
  kill -0 "$bench_pid" 2>/dev/null || break
  sleep 0.1
done
cat "$tmp/bench.out"
if [ "$holding" -ne 1 ]; then
  wait "$bench_pid" || true
  bench_pid=""
  fail "tpf-bench did not finish its sweep (output above)"
fi

next "tpfabricctl status while the $world ranks hold their group open"
"$ctl" status --socket "$socket" || fail "tpfabricctl status"
"$ctl" status --socket "$socket" --json >"$tmp/status.json" || fail "tpfabricctl status --json"
python3 - "$tmp/status.json" "$world" <<'EOF' || fail "the daemon does not show the open group of $world ranks"
import json, sys
doc = json.load(open(sys.argv[1]))
world = int(sys.argv[2])
groups = [g for g in doc.get("groups", []) if g.get("world") == world and g.get("state") == "open"]
if not groups:
    sys.exit(f"no open group of world {world} in the status document")
g = groups[0]
print(f"status check: group {g['id'][:8]}.. world {g['world']}, {len(g.get('ranks', []))} ranks, "
      f"{g.get('calls', 0)} calls, {g.get('errors', 0)} errors")
if g.get("errors", 0):
    sys.exit("the group recorded errors")
EOF

next "wait for the ranks to close the group and exit"
rc=0
wait "$bench_pid" || rc=$?
bench_pid=""
tail -n 1 "$tmp/bench.out"
[ "$rc" -eq 0 ] || fail "tpf-bench exited with status $rc"

next "stop tpfabricd (SIGTERM)"
kill -TERM "$daemon_pid"
rc=0
wait "$daemon_pid" || rc=$?
daemon_pid=""
tail -n 2 "$tmp/daemon.log"
[ "$rc" -eq 0 ] || fail "tpfabricd exited with status $rc after SIGTERM"
[ ! -e "$socket" ] || fail "tpfabricd left its socket $socket behind"
echo "tpfabricd exited 0 and removed its socket"

printf '\ndemo: OK (build %ds, daemon and workload %ds)\n' "$((build_done - started))" "$((SECONDS - build_done))"
