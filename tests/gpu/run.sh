#!/usr/bin/env bash
# The one script that runs every GPU test, on the GPU machine, from the repo
# root (docs/gpu.md):
#   bash tests/gpu/run.sh [program args...]
# Binaries: $TPF_GPU_BIN (default .carry/gpu) when it holds test_gpu_collectives
# (built on the CPU box: meson compile -C build-gpu, then copied there with
# libcudart.so.13 under lib/); otherwise, or with TPF_GPU_BUILD=1, they are
# built here with nvcc into build-gpu-device/ (single-process test only;
# TPF_GPU_NVCC_FLAGS adds flags, e.g. -DTPF_LL_SCRUB=0).
# The multi-process tests and the benchmark need tpf-gpurank, tpfabricd and
# tpf-gpubench in $TPF_GPU_BIN, with libtpfabric.so.0 and the .so files the
# GPU machine lacks (libsodium.so.23, libtomlplusplus.so.3, libspdlog.so.1.10,
# libfmt.so.9; libprometheus-cpp-core.so.1.0 for tpfabricctl) under lib/ (docs/gpu.md). TPF_GPU_SKIP_SINGLE=1 skips the
# single-process test, TPF_GPU_NO_BENCH=1 the benchmark; TPF_GPU_BENCH_ONLY=1
# runs only the one-GPU benchmark (under MPS, with the daemon), TPF_GPU_BENCH_W
# its ipc widths (default "2 4 8"), TPF_GPU_BENCH_PROXY_W its proxy-route
# widths (default "2"). The host path's tpf-bench runs last of all (its table on
# stdout, every number in $logdir/tpf-bench-host.json for scripts/perf_tables.py), after the
# torch suite, with MPS and the suite's daemon stopped and TPF_GPU_HOST_SETTLE
# seconds (default 5) to settle (TPF_GPU_HOST_W its worlds, default 2,4,8,16;
# TPF_GPU_NO_HOST_BENCH=1 skips it; needs $TPF_GPU_BIN/tpf-bench).
# TPF_GPU_DAEMON_CONFIG: a config file for
# the MPS suite's daemon (e.g. [proxy] carry_threads = 0 to compare).
# Logs: $TPF_GPU_LOG, else $OUT (the device tool's folder), else build-gpu-device/.
# TPF_GPU_TIMEOUT: seconds one test program may run (default 540).
# The MPS suite ends with the chaos run (tests/gpu/chaos.sh; TPF_GPU_CHAOS_SECONDS,
# default 60; TPF_GPU_CHAOS_SEED replays one; TPF_GPU_NO_CHAOS=1 skips it).
# Then the cross-node (tcp) stage (tests/gpu/crossnode.sh; TPF_GPU_NO_TCP=1
# skips it): two tpfabricd on loopback as two nodes, Device groups of W = 2
# (a rank a node) and W = 4 (two a node: ipc inside, tcp across) split across
# them, and the torch Communicator at W = 2 across them; its verdict lines
# read "gpu-crossnode(tcp)".
# Last, the torch Communicator's suite (tests/gpu/python/run.sh; TPF_GPU_NO_PYTHON=1 skips it).
# TPF_GPU_ONLY=STAGE[,STAGE...] runs only those stages (to split a run under
# a command time limit; unset: all): single (the single-process test and
# nccl1), pergpu (the one-process-per-GPU part, several GPUs), mps (the MPS
# suite's route x W x scenario loop), extra (mixed routes, idle, daemonkill, restart,
# probefail), chaos, tcp (the cross-node stage), bench (tpf-gpubench), python,
# host (tpf-bench on the host CPUs).
# Several GPUs (nvidia-smi -L lists N >= 2): first, with no MPS, one rank
# process per GPU (rank r on GPU r % N): the scenarios at W = N, the NCCL
# bootstrap and fallback scenarios, the cross-node (tcp) stage with one GPU
# a node (node n's ranks on GPU n), and the benchmark beside NCCL
# (tpf-gpubench --mode nccl); then the MPS suite as on one GPU, on GPU 0
# (CUDA_VISIBLE_DEVICES=0). TPF_GPU_NO_MPS=1 skips the MPS suite.
# Exit: 0 all passed, 1 a test failed or the build failed, 77 no GPU here.
set -uo pipefail
cd "$(dirname "$0")/../.."
# stage NAME: true when TPF_GPU_ONLY is unset or lists NAME.
stage() { [ -z "${TPF_GPU_ONLY:-}" ] || [[ ",$TPF_GPU_ONLY," == *",$1,"* ]]; }
for st_ in ${TPF_GPU_ONLY//,/ }; do
  case $st_ in single | pergpu | mps | extra | chaos | tcp | bench | python | host) ;;
  *) echo "TPF_GPU_ONLY: unknown stage '$st_' (single, pergpu, mps, extra, chaos, tcp, bench, python, host)"; exit 1 ;;
  esac
done

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: no GPU here (nvidia-smi -L failed); tests/gpu needs the GPU machine"
  exit 77
fi
export NCCL_NVLS_ENABLE=0 # never NVLink multicast on shared machines (notes/device.md)
logdir=${TPF_GPU_LOG:-${OUT:-build-gpu-device}}
mkdir -p "$logdir" build-gpu-device
bin=${TPF_GPU_BIN:-.carry/gpu}

build_here() {
  echo "building the GPU tests with $(nvcc --version | tail -1)"
  # <tpfabric/version.h> as Meson generates it (include/tpfabric/meson.build).
  local ver maj min pat
  ver=$(sed -n "s/^ *version: *'\([0-9.]*\)'.*/\1/p" meson.build | head -1)
  IFS=. read -r maj min pat <<<"$ver"
  mkdir -p build-gpu-device/include/tpfabric
  sed -e "s/@TPF_VERSION_MAJOR@/$maj/" -e "s/@TPF_VERSION_MINOR@/$min/" -e "s/@TPF_VERSION_PATCH@/$pat/" \
      -e "s/@TPF_VERSION_STRING@/$ver/" include/tpfabric/version.h.in >build-gpu-device/include/tpfabric/version.h
  local srcs=(kernels/collectives.cu kernels/layout_probe.cu tests/gpu/test_collectives.cu tests/gpu/cases_data.cu
              tests/gpu/cases_fault.cu tests/gpu/cases_primitives.cu tests/gpu/bench.cu tests/gpu/check_kernels.cu
              tests/gpu/sim_group.cpp)
  local objs=() pids=() s o ok=1
  for s in "${srcs[@]}"; do
    o=build-gpu-device/$(basename "$s").o
    objs+=("$o")
    nvcc -O2 -arch=sm_90 -std=c++20 --expt-relaxed-constexpr -Xcompiler -pthread ${TPF_GPU_NVCC_FLAGS:-} \
      -I. -Iinclude -Ibuild-gpu-device/include -c "$s" -o "$o" &
    pids+=($!)
  done
  for s in "${pids[@]}"; do wait "$s" || ok=0; done
  [ $ok = 1 ] && nvcc -arch=sm_90 -Xcompiler -pthread -o build-gpu-device/test_gpu_collectives "${objs[@]}"
}

# A TCP port free on 127.0.0.1 now (the kernel picks it) for a group's
# bootstrap: a random one may be taken (an earlier group's TIME_WAIT, a service).
freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

if [ -z "${TPF_GPU_BUILD:-}" ] && [ -x "$bin/test_gpu_collectives" ]; then
  export LD_LIBRARY_PATH="$PWD/$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  build_here >"$logdir/gpu-build.log" 2>&1 || { cat "$logdir/gpu-build.log"; echo "GPU test build failed"; exit 1; }
  bin=build-gpu-device
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ngpu=$(nvidia-smi -L | grep -c '^GPU')

# MPS: several processes on ONE GPU time-slice without it (a flag round trip
# of 4.5 ms instead of 0.7 us, notes/device.md). The multi-process tests and
# the benchmark run under a private MPS daemon, against the real tpfabricd
# ($bin/tpfabricd, carried with the .so files it lacks here under $bin/lib).
single_process=(test_gpu_collectives)
mps_dir=
start_mps() {
  mps_dir=$(mktemp -d)
  export CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe CUDA_MPS_LOG_DIRECTORY=$mps_dir/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d
}
dpid=
# stop_mps: the suite's daemon and the MPS daemon, once (cleanup, and before the host bench).
stop_mps() {
  [ -n "$dpid" ] && kill "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null; dpid=
  if [ -n "$mps_dir" ]; then echo quit | nvidia-cuda-mps-control; sleep 1; rm -rf "$mps_dir"; mps_dir=; fi
}
xnode_pids=() # the cross-node stage's daemons (crossnode.sh)
cleanup() {
  [ -n "${xpid:-}" ] && kill "$xpid" 2>/dev/null && wait "$xpid" 2>/dev/null
  for p in "${xnode_pids[@]}"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done
  stop_mps
  echo "gpu: $n_pass passed, $n_fail failed, $n_skip skipped"
}
trap cleanup EXIT

rc=0
# Every test's verdict is counted; the last line is "gpu: N passed, N failed, N skipped".
n_pass=0 n_fail=0 n_skip=0
# judge EXIT: PASS (0), SKIP (77: what the build or machine cannot run, never a pass) or FAIL, into $st.
judge() {
  case $1 in
  0) st=PASS; n_pass=$((n_pass + 1)) ;;
  77) st=SKIP; n_skip=$((n_skip + 1)) ;;
  *) st=FAIL; n_fail=$((n_fail + 1)); rc=1 ;;
  esac
}
run_one() {
  local name=$1; shift
  echo "== $name"
  timeout "${TPF_GPU_TIMEOUT:-540}" "$bin/$name" "$@" 2>&1 | tee "$logdir/$name.log"
  local r=${PIPESTATUS[0]}
  judge "$r"
  echo "== $name: exit $r ($st)"
}
[ -n "${TPF_GPU_BENCH_ONLY:-}" ] && TPF_GPU_SKIP_SINGLE=1
if [ -z "${TPF_GPU_SKIP_SINGLE:-}" ] && stage single; then
  for t in "${single_process[@]}"; do run_one "$t" "$@"; done
fi
[ -x "$bin/tpf-gpurank" ] || { echo "no $bin/tpf-gpurank: multi-process tests not run"; exit $rc; }
if [ -z "${TPF_GPU_BENCH_ONLY:-}" ] && stage single; then
  echo "== tpf-gpurank nccl1 (world-1 NcclBootstrap; above-cap calls to NCCL)"
  timeout 60 "$bin/tpf-gpurank" --scenario nccl1 2>&1 | tee "$logdir/nccl1.log"
  judge "${PIPESTATUS[0]}"
  echo "$st gpu-nccl1"
fi

# start_daemon SOCKET LOG [args]: the carried tpfabricd in the background (pid in $started).
started=
start_daemon() {
  local s=$1 log=$2; shift 2
  "$bin/tpfabricd" --socket "$s" --foreground "$@" >"$log" 2>&1 &
  started=$!
  for _ in $(seq 100); do [ -S "$s" ] && return 0; sleep 0.1; done
  echo "tpfabricd did not start:"; cat "$log"; return 1
}

# ranks PROGRAM WORLD ROUTE SCENARIO TIMEOUT_MS [extra args]: W rank
# processes against the daemon on $sock (rank r on GPU r % N), or rank r on
# the r-th socket of $rank_socks and the r-th device of $rank_devs where
# those lists are set (two daemons as two nodes: crossnode.sh); each judges
# its own outcome (exit 0, 77 for a scenario it cannot run) and prints RESULT
# lines. Returns 0 when every rank passed, 77 when every rank skipped, else 1.
# $tag names the log. A scenario's rank gets 40 s; a benchmark rank 120 (the
# proxy route's sizes table at W = 8 is eight ranks and one proxy thread
# carrying 56 rows a call, each size a graph of 100 calls replayed).
tag=
ranks() {
  local prog=$1 w=$2 route=$3 scen=$4 tmo=$5; shift 5
  local port pids=() r ok=1 log="$logdir/$prog-$scen-$route-w$w$tag.log" limit=40 socks devs
  [ "$prog" = tpf-gpubench ] && limit=120
  read -ra socks <<<"${rank_socks:-}"; read -ra devs <<<"${rank_devs:-}"
  port=$(freeport)
  : >"$log"
  for ((r = 0; r < w; r++)); do
    timeout $limit "$bin/$prog" --socket "${socks[$r]:-$sock}" ${devs[$r]:+--device "${devs[$r]}"} \
      --bootstrap 127.0.0.1:$port --rank $r --world $w --route "$route" "$@" >>"$log" 2>&1 &
    pids+=($!)
  done
  local skipped=0
  for r in "${pids[@]}"; do
    wait "$r"
    case $? in 0) ;; 77) skipped=$((skipped + 1)) ;; *) ok=0 ;; esac
  done
  [ $ok = 1 ] && [ $skipped = "$w" ] && return 77 # every rank skipped (e.g. built without NCCL)
  [ $ok = 1 ] && [ $skipped = 0 ] && return 0
  return 1
}
# show STATUS-LINE LOG: the verdict line, the RESULT lines, and on failure the rest.
show() {
  echo "$1"
  grep -h RESULT "$2" | sort | sed 's/^/    /'
  case $1 in FAIL*) grep -hv RESULT "$2" | head -20 | sed 's/^/    ! /' ;; esac
}
# One rank process per GPU, no MPS: the scenarios at W = N, NCCL bootstrap
# and fallback, and the benchmark beside NCCL (needs N >= 2: NCCL refuses two
# ranks on one GPU). NCCL_NVLS_ENABLE=0 stays exported (above).
if [ "$ngpu" -ge 2 ] && [ -z "${TPF_GPU_BENCH_ONLY:-}" ] && stage pergpu; then
  t0=$SECONDS
  xdir=$(mktemp -d)
  sock=$xdir/tpfabricd.sock
  start_daemon "$sock" "$logdir/tpfabricd-pergpu.log" || exit 1
  dpid=$started
  tag=-pergpu
  w=$ngpu
  for route in ipc proxy; do
    for scen in data odd gatherv graph b2b kill stall mismatch graphkill graphleave graphstall; do
      [ $scen = mismatch ] && [ $route != ipc ] && continue # the proxy route carries no call tag
      tmo=5000; [ ${scen#graph} = stall ] && tmo=1000; [ ${scen#graph} = kill ] && tmo=10000
      ranks tpf-gpurank $w $route $scen $tmo --scenario $scen --timeout-ms $tmo; judge $?
      show "$st gpu-pergpu route=$route W=$w scenario=$scen" "$logdir/tpf-gpurank-$scen-$route-w$w$tag.log"
    done
  done
  # nccl_case NAME SCENARIO SOCKET [env...]: W ranks over an NcclBootstrap.
  nccl_case() {
    local name=$1 scen=$2 s=$3; shift 3
    tag=-$name
    (export "$@"; sock=$s; ranks tpf-gpurank $w auto $scen 5000 --scenario $scen --max-bytes 131072); judge $?
    show "$st gpu-nccl W=$w $name ($scen${*:+, $*})" "$logdir/tpf-gpurank-$scen-auto-w$w$tag.log"
  }
  nccl_case fabric nccl-fabric "$sock" TPF_NCCL_ABOVE=65536
  nccl_case no-socket nccl-fallback "$xdir/nothing-here.sock" TPF_FALLBACK=nccl
  # a daemon that died: its socket file stays, connect() is refused
  start_daemon "$xdir/stopped.sock" "$logdir/tpfabricd-stopped.log" && kill -9 "$started" && wait "$started" 2>/dev/null
  nccl_case daemon-stopped nccl-fallback "$xdir/stopped.sock" TPF_FALLBACK=nccl
  printf '[daemon]\nmax_groups = 1\n' >"$xdir/one-group.toml"
  start_daemon "$xdir/one.sock" "$logdir/tpfabricd-onegroup.log" --config "$xdir/one-group.toml" && xpid=$started
  nccl_case daemon-refuses nccl-refuse "$xdir/one.sock" TPF_FALLBACK=nccl
  [ -n "${xpid:-}" ] && kill "$xpid" && wait "$xpid" 2>/dev/null; xpid=
  nccl_case probe-fails nccl-fallback "$sock" TPF_PROBE_SABOTAGE=1
  nccl_case probe-fails-error nccl-error "$sock" TPF_PROBE_SABOTAGE=1 TPF_FALLBACK=error
  nccl_case daemon-stopped-error nccl-error "$xdir/stopped.sock" TPF_FALLBACK=error
  nccl_case late-rank nccl-late "$sock"
  # TPF_DISABLE=1 on the last rank only: NCCL on every rank, and no rank connects to the daemon.
  start_daemon "$xdir/disabled.sock" "$logdir/tpfabricd-disabled.log" --log-level debug && xpid=$started
  nccl_case disabled nccl-disabled "$xdir/disabled.sock"
  if grep -q "connected (pid" "$logdir/tpfabricd-disabled.log"; then
    judge 1; echo "FAIL gpu-nccl W=$w disabled: a rank connected to the daemon despite TPF_DISABLE=1"
  else
    judge 0; echo "PASS gpu-nccl W=$w disabled: the daemon saw no connection"
  fi
  [ -n "${xpid:-}" ] && kill "$xpid" && wait "$xpid" 2>/dev/null; xpid=
  tag=
  # Two daemons as two nodes, one GPU each (tests/gpu/crossnode.sh).
  . tests/gpu/crossnode.sh
  tpf_gpu_crossnode pergpu 0 1
  echo "one-process-per-GPU tests took $((SECONDS - t0)) s"
  if [ -x "$bin/tpf-gpubench" ] && [ -z "${TPF_GPU_NO_BENCH:-}" ]; then
    echo "== benchmark beside NCCL (bench/gpu, --mode nccl, one process per GPU): $(date -u +%FT%TZ)"
    nvidia-smi topo -m 2>/dev/null | head -4
    # TPF_GPU_BENCH_RUNS=N: N runs, one log each (bench/gpu/plot_nccl.py takes the median)
    for i in $(seq "${TPF_GPU_BENCH_RUNS:-1}"); do
      tag=-run$i
      ranks tpf-gpubench $w ipc nccl 0 --mode nccl || { echo "bench beside NCCL failed"; rc=1; }
      grep -h '^ROW\|^INFO' "$logdir/tpf-gpubench-nccl-ipc-w$w$tag.log"
      grep -hv '^ROW\|^INFO' "$logdir/tpf-gpubench-nccl-ipc-w$w$tag.log" | grep -v '^NCCL\|NCCL INFO' | head -20 | sed 's/^/    ! /'
    done
    tag=
  fi
  kill "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null; dpid=
  rm -rf "$xdir"
fi
[ -n "${TPF_GPU_NO_MPS:-}" ] && exit $rc

# The MPS suite shares ONE GPU among all ranks, also on a machine of several.
[ "$ngpu" -ge 2 ] && export CUDA_VISIBLE_DEVICES=0 && echo "== MPS suite on GPU 0 only (CUDA_VISIBLE_DEVICES=0)"
start_mps || { echo "MPS did not start"; exit 1; }
sock=$mps_dir/tpfabricd.sock
start_daemon "$sock" "$logdir/tpfabricd.log" ${TPF_GPU_DAEMON_CONFIG:+--config "$TPF_GPU_DAEMON_CONFIG"} || exit 1
dpid=$started

t0=$SECONDS
for route in ipc proxy; do
  [ -n "${TPF_GPU_BENCH_ONLY:-}" ] && break
  stage mps || break
  for w in 2 4 8; do
    for scen in data odd gatherv graph b2b kill stall mismatch graphkill graphleave graphstall; do
      [ $scen = mismatch ] && [ $route != ipc ] && continue # the proxy route carries no call tag
      tmo=5000; [ ${scen#graph} = stall ] && tmo=1000; [ ${scen#graph} = kill ] && tmo=10000
      ranks tpf-gpurank $w $route $scen $tmo --scenario $scen --timeout-ms $tmo; judge $?
      echo "$st gpu-multiprocess route=$route W=$w scenario=$scen"
      grep -h RESULT "$logdir/tpf-gpurank-$scen-$route-w$w.log" | sort | sed 's/^/    /'
      [ $st = FAIL ] && grep -hv RESULT "$logdir/tpf-gpurank-$scen-$route-w$w.log" | head -20 | sed 's/^/    ! /'
    done
  done
done
if [ -z "${TPF_GPU_BENCH_ONLY:-}" ]; then
  # Mixed routes in one group: ranks of one "node" (TPF_TEST_NODES, a test hook) over ipc, the others through the proxy.
  stage extra && for nodes in 0,0,1,1 0,0,0,1,1,1,2,2; do
    w=$(echo "$nodes" | tr ',' '\n' | wc -l)
    (export TPF_TEST_NODES=$nodes; ranks tpf-gpurank $w auto mixed 5000 --scenario mixed); judge $?
    echo "$st gpu-multiprocess mixed W=$w nodes=$nodes"
    grep -h RESULT "$logdir/tpf-gpurank-mixed-auto-w$w.log" | sort | sed 's/^/    /'
    [ $st = FAIL ] && grep -hv RESULT "$logdir/tpf-gpurank-mixed-auto-w$w.log" | head -20 | sed 's/^/    ! /'
  done
  # ---- status and idle CPU of an ipc Device group ----
  # While an open W = 2 ipc group idles: tpfabricctl status shows ipc routes
  # and the ranks' device regions, and the daemon's CPU over 2 s stays under
  # 5 % of a core (its proxy polls no ipc-only ring). Needs $bin/tpfabricctl.
  if ! stage extra; then
    :
  elif [ -x "$bin/tpfabricctl" ]; then
    ilog=$logdir/tpf-gpurank-idle-ipc-w2.log
    : >"$ilog" # emptied before the wait below reads it (an earlier run's READY lines)
    (ranks tpf-gpurank 2 ipc idle 5000 --scenario idle) &
    rp=$!
    for _ in $(seq 300); do [ "$(grep -c READY "$ilog" 2>/dev/null)" = 2 ] && break; sleep 0.1; done
    sleep 0.5
    t1=$(awk '{print $14 + $15}' "/proc/$dpid/stat"); sleep 2; t2=$(awk '{print $14 + $15}' "/proc/$dpid/stat")
    cpu=$(awk -v d=$((t2 - t1)) -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", 100 * d / hz / 2}')
    "$bin/tpfabricctl" status --json --socket "$sock" >"$logdir/status-idle-ipc.json" 2>&1
    "$bin/tpfabricctl" status --socket "$sock" >"$logdir/status-idle-ipc.txt" 2>&1
    wait "$rp"; rr=$?
    seen=$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
g = [g for g in d["groups"] if g["state"] == "open" and g.get("buffers") == "device"]
if len(g) != 1: print("no open Device group in status"); sys.exit()
r = [x for x in g[0]["ranks"] if x["local"]]
bad = [x["rank"] for x in r if x["route"] != "ipc" or not x.get("device_bytes")]
print("ok device_bytes=%d proxy_polls=%s" % (d["regions"]["device_bytes"], g[0]["proxy_polls"]) if not bad and d["regions"]["device_bytes"] > 0 and not g[0]["proxy_polls"] else "ranks %s not ipc with a device region" % bad)
' "$logdir/status-idle-ipc.json" 2>&1)
    case "$rr:$seen" in 0:ok*) awk -v c="$cpu" 'BEGIN {exit !(c < 5)}' && judge 0 || judge 1 ;; *) judge 1 ;; esac
    echo "$st gpu-multiprocess idle W=2 route=ipc: status $seen; daemon CPU $cpu % of a core over 2 s idle"
    grep -h RESULT "$ilog" | sort | sed 's/^/    /'
    [ $st = FAIL ] && sed 's/^/    ! /' "$logdir/status-idle-ipc.txt" | head -30
  else
    judge 77; echo "SKIP gpu-multiprocess idle: no $bin/tpfabricctl (carry build-gpu/ctl/tpfabricctl)"
  fi
  # Live counts: a graph of 5 calls replayed 200 times with no check(); once
  # every rank synchronised (READY), tpfabricctl status --json shows the
  # group's W x 1,000 calls and their bytes within 1 s, on either route.
  if [ -x "$bin/tpfabricctl" ] && stage extra; then
    for route in ipc proxy; do
      w=2
      llog=$logdir/tpf-gpurank-livecount-$route-w$w.log
      : >"$llog" # emptied before the wait below reads it
      (ranks tpf-gpurank $w $route livecount 5000 --scenario livecount) &
      rp=$!
      for _ in $(seq 300); do [ "$(grep -c READY "$llog" 2>/dev/null)" = $w ] && break; sleep 0.05; done
      seen=$(python3 - "$bin/tpfabricctl" "$sock" "$w" <<'PY' 2>&1
import json, subprocess, sys, time
ctl, sock, w = sys.argv[1], sys.argv[2], int(sys.argv[3])
want_calls, want_bytes = w * 1000, w * (600 * 4096 + 400 * 1024)
t0 = time.monotonic()
while True:
    d = json.loads(subprocess.run([ctl, "status", "--json", "--socket", sock], capture_output=True, text=True).stdout)
    g = [g for g in d["groups"] if g["state"] == "open" and g.get("buffers") == "device"]
    got = (g[0]["calls"], g[0]["bytes"]) if len(g) == 1 else None
    dt = time.monotonic() - t0
    if got == (want_calls, want_bytes):
        print("ok calls=%d bytes=%d seen after %.0f ms" % (got[0], got[1], dt * 1e3)); break
    if dt > 1.0:
        print("status shows %s after 1 s, wanted calls=%d bytes=%d" % (got, want_calls, want_bytes)); break
    time.sleep(0.02)
PY
)
      wait "$rp"; rr=$?
      case "$rr:$seen" in 0:ok*) judge 0 ;; *) judge 1 ;; esac
      echo "$st gpu-multiprocess livecount W=$w route=$route (a graph replayed 200 times, no check()): status $seen"
      grep -h RESULT "$llog" | sort | sed 's/^/    /'
      [ $st = FAIL ] && grep -hv RESULT "$llog" | head -20 | sed 's/^/    ! /'
    done
  fi
  # An idle proxy-route group: the daemon busy-polls its ring (a kernel cannot
  # wake it), a whole core; proxy.gpu_poll_us = 100 bounds that.
  # Both measured, the bounded one must stay under 20 % of a core, and the
  # group's calls before and after the idle stretch must be right.
  if [ -x "$bin/tpfabricctl" ] && stage extra; then
    pdir=$(mktemp -d)
    printf '[proxy]\ngpu_poll_us = 100\n' >"$pdir/nap.toml"
    for cfg in busy nap; do
      args=(); [ $cfg = nap ] && args=(--config "$pdir/nap.toml")
      start_daemon "$pdir/$cfg.sock" "$logdir/tpfabricd-idle-proxy-$cfg.log" "${args[@]}" || { judge 1; continue; }
      pd=$started
      ilog=$logdir/tpf-gpurank-idle-proxy-w2-$cfg.log
      : >"$ilog" # emptied before the wait below reads it
      (sock=$pdir/$cfg.sock; tag=-$cfg; ranks tpf-gpurank 2 proxy idle 5000 --scenario idle) &
      rp=$!
      for _ in $(seq 300); do [ "$(grep -c READY "$ilog" 2>/dev/null)" = 2 ] && break; sleep 0.1; done
      sleep 0.5
      t1=$(awk '{print $14 + $15}' "/proc/$pd/stat"); sleep 2; t2=$(awk '{print $14 + $15}' "/proc/$pd/stat")
      cpu=$(awk -v d=$((t2 - t1)) -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", 100 * d / hz / 2}')
      wait "$rp"; rr=$?
      kill "$pd"; wait "$pd" 2>/dev/null
      if [ $cfg = busy ]; then judge $rr; else [ $rr = 0 ] && awk -v c="$cpu" 'BEGIN {exit !(c < 20)}' && judge 0 || judge 1; fi
      echo "$st gpu-multiprocess idle W=2 route=proxy proxy.gpu_poll_us=$([ $cfg = nap ] && echo 100 || echo 0): daemon CPU $cpu % of a core over 2 s idle"
      grep -h RESULT "$ilog" | sort | sed 's/^/    /'
    done
    rm -rf "$pdir"
  fi
  # The daemon killed under a proxy-route Device group and not started again:
  # the call waits for it until its timeout (3 s), then DaemonLost.
  dkdir=$(mktemp -d)
  if ! stage extra; then
    :
  elif start_daemon "$dkdir/d.sock" "$logdir/tpfabricd-daemonkill.log"; then
    dk=$started
    : >"$logdir/tpf-gpurank-daemonkill-proxy-w2.log" # emptied before the wait below reads it
    (sock=$dkdir/d.sock; ranks tpf-gpurank 2 proxy daemonkill 3000 --scenario daemonkill --timeout-ms 3000) &
    rp=$!
    for _ in $(seq 300); do [ "$(grep -c READY "$logdir/tpf-gpurank-daemonkill-proxy-w2.log" 2>/dev/null)" = 2 ] && break; sleep 0.1; done
    sleep 0.3
    kill -9 "$dk"; wait "$dk" 2>/dev/null
    wait "$rp"; judge $?
    echo "$st gpu-multiprocess daemonkill W=2 route=proxy (SIGKILL tpfabricd under calls, none started: DaemonLost within the 3 s timeout + 1 s)"
    grep -h RESULT "$logdir/tpf-gpurank-daemonkill-proxy-w2.log" | sort | sed 's/^/    /'
  else
    judge 1; echo "FAIL gpu-multiprocess daemonkill: the daemon did not start"
  fi
  # The daemon killed and started again under a Device group replaying a
  # captured graph (issue 45): W = 2 on the proxy route, W = 4 mixed (ipc
  # inside a "node", the proxy across). Every replay exact and healthy, the
  # group re-adopted by the new daemon (one journal line), no reopen.
  for spec in 2:proxy: 4:auto:0,0,1,1; do
    IFS=: read -r w route nodes <<<"$spec"
    stage extra || break
    if ! start_daemon "$dkdir/r.sock" "$logdir/tpfabricd-restart-$route-w$w.log"; then
      judge 1; echo "FAIL gpu-multiprocess restart W=$w: the daemon did not start"; continue
    fi
    dk=$started
    rlog=$logdir/tpf-gpurank-restart-$route-w$w.log
    : >"$rlog" # emptied before the wait below reads it (an earlier run's READY lines)
    (export TPF_TEST_NODES=$nodes; sock=$dkdir/r.sock; ranks tpf-gpurank $w $route restart 10000 --scenario restart --timeout-ms 10000) &
    rp=$!
    for _ in $(seq 300); do [ "$(grep -c READY "$rlog" 2>/dev/null)" = "$w" ] && break; sleep 0.1; done
    sleep 0.2
    kill -9 "$dk"; wait "$dk" 2>/dev/null
    sleep 2 # as systemd's RestartSec=2s: longer than the kernels' 500 ms heartbeat tolerance
    start_daemon "$dkdir/r.sock" "$logdir/tpfabricd-restart-$route-w$w-after.log"; dk=$started
    wait "$rp"; rr=$?
    adopted=$(grep -c 're-adopted after a daemon restart.*device buffers' "$logdir/tpfabricd-restart-$route-w$w-after.log")
    kill "$dk" 2>/dev/null; wait "$dk" 2>/dev/null
    [ $rr = 0 ] && [ "$adopted" = 1 ] && judge 0 || judge 1
    echo "$st gpu-multiprocess restart W=$w route=$route${nodes:+ nodes=$nodes} (SIGKILL tpfabricd and start it again under graph replays: re-adopted $adopted time(s), every replay exact and healthy)"
    grep -h RESULT "$rlog" | sort | sed 's/^/    /'
    grep -h 're-adopted\|refused\|tpfabricd closed' "$logdir/tpfabricd-restart-$route-w$w-after.log" "$rlog" | head -8 | sed 's/^/    > /'
    [ $st = FAIL ] && grep -hv RESULT "$rlog" | head -20 | sed 's/^/    ! /'
  done
  rm -rf "$dkdir"
  # The chaos run (tests/gpu/chaos.sh): random kills, stalls, aborts and daemon kills under W = 2..4 groups.
  if [ -z "${TPF_GPU_NO_CHAOS:-}" ] && stage chaos; then
    . tests/gpu/chaos.sh
    tpf_gpu_chaos
  fi
  # The cross-node (tcp) stage on this one GPU: two daemons as two nodes (tests/gpu/crossnode.sh).
  if stage tcp; then
    . tests/gpu/crossnode.sh
    tpf_gpu_crossnode mps
  fi
  if stage extra; then
    (export TPF_PROBE_SABOTAGE=1 TPF_FALLBACK=error; ranks tpf-gpurank 2 auto probefail 5000 --scenario probefail); judge $?
    echo "$st gpu-multiprocess probefail W=2 (TPF_PROBE_SABOTAGE=1, TPF_FALLBACK=error)"
    grep -h RESULT "$logdir/tpf-gpurank-probefail-auto-w2.log" | sed 's/^/    /'
  fi
  echo "multi-process tests took $((SECONDS - t0)) s"
fi

if [ -x "$bin/tpf-gpubench" ] && [ -z "${TPF_GPU_NO_BENCH:-}" ] && stage bench; then
  echo "== benchmark (bench/gpu): $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
  for w in ${TPF_GPU_BENCH_W:-2 4 8}; do
    ranks tpf-gpubench $w ipc sizes 0 --mode sizes || { echo "bench ipc W=$w failed"; rc=1; }
    grep -h '^ROW' "$logdir/tpf-gpubench-sizes-ipc-w$w.log"
  done
  ranks tpf-gpubench 2 proxy hop 0 --mode hop || { echo "bench hop failed"; rc=1; }
  grep -h '^ROW' "$logdir/tpf-gpubench-hop-proxy-w2.log"
  for w in ${TPF_GPU_BENCH_PROXY_W:-2}; do
    ranks tpf-gpubench $w proxy sizes 0 --mode sizes || { echo "bench proxy W=$w failed"; rc=1; }
    grep -h '^ROW' "$logdir/tpf-gpubench-sizes-proxy-w$w.log"
  done
  # The proxy route taken apart (stage, daemon carry, read; docs/perf.md).
  ranks tpf-gpubench 2 proxy parts 0 --mode parts || { echo "bench proxy parts failed"; rc=1; }
  grep -h '^ROW' "$logdir/tpf-gpubench-parts-proxy-w2.log"
  # The ipc route's LL calls taken apart (docs/perf.md).
  for w in ${TPF_GPU_BENCH_W:-2 4 8}; do
    ranks tpf-gpubench $w ipc parts 0 --mode parts || { echo "bench ipc parts W=$w failed"; rc=1; }
    grep -h '^ROW' "$logdir/tpf-gpubench-parts-ipc-w$w.log"
  done
  # The tcp wire between two daemons beside the one-host proxy route (tests/gpu/crossnode.sh).
  if [ -z "${TPF_GPU_NO_TCP:-}" ]; then
    . tests/gpu/crossnode.sh
    tpf_gpu_crossnode_bench
  fi
fi

# ---- tpfabric.torch (tests/gpu/python/run.sh): the Communicator over torch.distributed ----
if [ -z "${TPF_GPU_BENCH_ONLY:-}" ] && [ -z "${TPF_GPU_NO_PYTHON:-}" ] && stage python; then
  . tests/gpu/python/run.sh
  tpf_python_gpu_suite "$bin" "$logdir"; judge $?
  echo "$st gpu-python (tests/gpu/python/run.sh)"
fi

# The host path on this machine's host CPUs, in the same run (the host
# path's targets: W = 2..16 beside the shared-memory floor, the sum beside
# the gather, open times, the daemon's memory and idle CPU; docs/perf.md).
# Last, with the MPS daemon and the suite's tpfabricd stopped first and a
# few seconds to settle: the targets are stated for idle host CPUs, and 16
# host ranks on 16 vCPUs feel any process still awake.
if [ -x "$bin/tpf-bench" ] && [ -z "${TPF_GPU_NO_BENCH:-}" ] && [ -z "${TPF_GPU_NO_HOST_BENCH:-}" ] && stage host; then
  stop_mps
  sleep "${TPF_GPU_HOST_SETTLE:-5}"
  # Then up to 60 s more until the CPUs are idle (>= 95 % over a second): the
  # benchmarks before leave processes winding down, and the load average
  # (a minute's mean) says so only long after.
  for _ in $(seq 60); do
    idle=$(python3 -c 'import time
def t():
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return v[3] + v[4], sum(v)
i0, a0 = t(); time.sleep(1); i1, a1 = t(); print(int(100 * (i1 - i0) / max(1, a1 - a0)))')
    [ "$idle" -ge 95 ] && break
  done
  echo "== host path (tpf-bench run, $(nproc) host CPUs, ${idle:-?} % idle over the last second, load $(cut -d' ' -f1-3 /proc/loadavg), MPS stopped): $(date -u +%FT%TZ)"
  timeout 300 "$bin/tpf-bench" run --daemon "$bin/tpfabricd" --world ${TPF_GPU_HOST_W:-2,4,8,16} \
    --sizes 4KiB,64KiB --ops gather,sum --markdown --json "$logdir/tpf-bench-host.json" >"$logdir/tpf-bench-host.log" 2>&1 ||
    { echo "bench host path failed"; rc=1; }
  cat "$logdir/tpf-bench-host.log"
  # The host path across two daemons over the tcp wire (loopback), beside a TCP floor (docs/perf.md, host-tcp).
  timeout 300 "$bin/tpf-bench" run --daemon "$bin/tpfabricd" --nodes 2 --world 2,4 --sizes 4KiB,64KiB --ops gather,sum \
    --markdown --json "$logdir/tpf-bench-host-tcp.json" >"$logdir/tpf-bench-host-tcp.log" 2>&1 ||
    { echo "bench host path across two daemons failed"; rc=1; }
  cat "$logdir/tpf-bench-host-tcp.log"
fi
exit $rc
