#!/usr/bin/env bash
# tpfabric.torch on the GPU machine: the Communicator over torch.distributed
# with the carried library and daemon. One function, tpf_python_gpu_suite,
# for tests/gpu/run.sh to call (sourced), or run alone from the repo root:
#   bash tests/gpu/python/run.sh [BIN [LOGDIR]]
# BIN: the carried binaries ($TPF_GPU_BIN, default .carry/gpu: tpfabricd and
# lib/libtpfabric.so.0, as docs/development.md "The GPU machine" carries
# them); LOGDIR: logs ($TPF_GPU_LOG, else $OUT, else build-gpu-device).
#   1. several GPUs (nvidia-smi -L lists N >= 2), no MPS: one rank per GPU,
#      an NCCL process group, W = N: comm_rank.py data, graph, graphabort,
#      graphrestart (on the proxy route: tpfabricd SIGKILLed and started again under the graph's
#      replays: re-adopted, every replay right), fallback (a stopped daemon),
#      disable (TPF_DISABLE=1 on the last rank; the daemon must see no
#      connection); then bench_comm.py (TPF_GPU_NO_BENCH=1 skips).
#   2. always: every rank on GPU 0 under MPS (run.sh's MPS daemon when
#      CUDA_MPS_PIPE_DIRECTORY is set, else a private one), a gloo process
#      group (NCCL refuses two ranks of one communicator on one GPU), W = 2
#      and 4: the same six scenarios; then bench_comm.py --backend gloo at
#      W = 2 (the Communicator alone; TPF_GPU_NO_BENCH=1 skips it).
#   Both parts also run compile_rank.py against the live daemon, after data
#   and graph: torch._dynamo.explain of each collective (0 graph breaks), a
#   tensor-parallel MLP compiled with fullgraph=True and with
#   mode="reduce-overhead" bit-identical to eager over 100 steps, compiled
#   calls the fabric does not take by torch.distributed; at W = 2 its
#   benchmark (BENCH lines: the compiled MLP beside torch.distributed, the
#   ops beside the C ABI inside a CUDA graph); JSON per rank under LOGDIR
#   (py-compile-BACKEND-wW-rankR.json). TPF_PY_NO_COMPILE=1 skips it,
#   TPF_PY_COMPILE_ONLY=1 runs it alone (no other scenario, no bench_comm.py);
#   TPF_PY_SCENARIOS="graph graphrestart" runs only the comm_rank.py scenarios it lists;
#   a torch without torch.compile or torch.library.custom_op prints SKIP.
#   3. only with TPF_PY_GPU_ONLY=crossnode (tests/gpu/crossnode.sh, whose two
#      daemons as two nodes it uses): W = 2, rank r attached to the r-th socket
#      of TPF_PY_SOCKETS ("A B"), a gloo process group, on whatever GPU and MPS
#      the caller set: comm_rank.py data, graph, graphabort across the tcp wire;
#      logs py-crossnode-$TPF_PY_LABEL-*.
# TPF_PY_GPU_ONLY=pergpu or mps runs only that part (to split a run under a
# command time limit); TPF_GPU_NO_BENCH=1 skips the benchmark.
# Returns 0 when all passed, 1 on a failure, 77 with no GPU or no CUDA torch.
# The ranks import torch before tpfabric, so libtpfabric's libcudart.so.13
# and libnccl.so.2 are torch's own (already loaded, same sonames); the
# carried lib/ stays off their LD_LIBRARY_PATH.

tpf_python_gpu_suite() {
  local bin=${1:-${TPF_GPU_BIN:-.carry/gpu}} logdir=${2:-${TPF_GPU_LOG:-${OUT:-build-gpu-device}}}
  local rc=0 py=python3 dir tmp ngpu w scen own_mps=
  # run.sh defines freeport; standalone, a port the kernel says is free now.
  declare -F freeport >/dev/null ||
    freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP python: no GPU"; return 77; }
  mkdir -p "$logdir"
  dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  [ -x "$bin/tpfabricd" ] && [ -f "$bin/lib/libtpfabric.so.0" ] || { echo "FAIL python: no $bin/tpfabricd or $bin/lib/libtpfabric.so.0"; return 1; }
  bin=$(cd "$bin" && pwd)
  local -a pyenv=(env -u LD_LIBRARY_PATH "PYTHONPATH=$dir/../../../python" "TPF_LIBRARY=$bin/lib/libtpfabric.so.0"
                  NCCL_NVLS_ENABLE=0 GLOO_SOCKET_IFNAME=lo)
  if ! "${pyenv[@]}" "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 77)'; then
    echo "SKIP python: torch with CUDA not importable by $py"; return 77
  fi
  "${pyenv[@]}" "$py" -c 'import torch, tpfabric; print("python:", torch.__version__, "tpfabric", tpfabric.__version__, tpfabric.library_path())' ||
    { echo "FAIL python: import tpfabric"; return 1; }
  tmp=$(mktemp -d)
  ngpu=$(nvidia-smi -L | grep -c '^GPU')

  # _daemon NAME [--log-level debug]: the carried tpfabricd on $tmp/NAME.sock (pid in $_dpid)
  local _dpid
  _daemon() {
    local name=$1; shift
    # The daemon needs the carried .so files the machine lacks; the ranks must not see them (torch's own).
    LD_LIBRARY_PATH="$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$bin/tpfabricd" --socket "$tmp/$name.sock" --foreground "$@" \
      >"$logdir/py-tpfabricd-$name.log" 2>&1 &
    _dpid=$!
    for _ in $(seq 100); do [ -S "$tmp/$name.sock" ] && return 0; sleep 0.1; done
    echo "tpfabricd did not start:"; cat "$logdir/py-tpfabricd-$name.log"; return 1
  }
  # _ranks TAG W BACKEND SOCKETS PROGRAM ARGS...: W rank processes, rank r on the
  # (r mod n)-th of the n space-separated SOCKETS; fails unless every one exits 0.
  _ranks() {
    local tag=$1 w=$2 backend=$3 prog=$5 socks; read -ra socks <<<"$4"; shift 5
    local port pids=() r ok=0 log="$logdir/py-$tag.log"
    port=$(freeport)
    : >"$log"
    for ((r = 0; r < w; r++)); do
      RANK=$r WORLD_SIZE=$w LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout "${_rank_limit:-300}" \
        "${pyenv[@]}" "$py" "$dir/$prog" --socket "${socks[r % ${#socks[@]}]}" "$@" >>"$log" 2>&1 &
      pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r" || ok=1; done
    return $ok
  }
  # _compile LABEL W BACKEND SOCKET: compile_rank.py (torch.compile through the custom ops; its
  # benchmark at W = 2 unless TPF_GPU_NO_BENCH); JSON under $logdir. TPF_PY_NO_COMPILE=1 skips it.
  _compile() {
    local label=$1 w=$2 backend=$3 sock=$4 st tag=$1-compile-w$2 bench=
    [ -n "${TPF_PY_NO_COMPILE:-}" ] && { echo "SKIP python $label W=$w compile (TPF_PY_NO_COMPILE)"; return; }
    [ "$w" = 2 ] && [ -z "${TPF_GPU_NO_BENCH:-}" ] && bench=--bench
    if _rank_limit=540 _ranks "$tag" "$w" "$backend" "$sock" compile_rank.py --backend "$backend" --json-dir "$logdir" $bench
    then st=PASS; else st=FAIL; rc=1; fi
    grep -q '^SKIP' "$logdir/py-$tag.log" && st=SKIP
    echo "$st python $label W=$w compile (torch.compile: explain, TP MLP fullgraph and reduce-overhead, fallbacks)"
    grep -h '^RESULT\|^SKIP' "$logdir/py-$tag.log" | sort | uniq | sed 's/^/    /'
    grep -h '^BENCH' "$logdir/py-$tag.log" | sed 's/^/    /'
    [ $st = FAIL ] && grep -h '^FAIL' "$logdir/py-$tag.log" | head -30 | sed 's/^/    ! /'
    [ $st = FAIL ] && grep -hv '^RESULT\|^INFO\|^PASS\|^FAIL\|^BENCH\|NCCL INFO' "$logdir/py-$tag.log" | head -30 | sed 's/^/    ! /'
    [ $st = FAIL ] && grep -h '^INFO' "$logdir/py-$tag.log" | tail -2 | sed 's/^/    ! last step: /' # where a rank that printed no RESULT stopped
    return 0 # the verdict is in rc
  }
  # _wanted SCENARIO: TPF_PY_SCENARIOS (space-separated) lists it, or is unset.
  _wanted() { [ -z "${TPF_PY_SCENARIOS:-}" ] || [[ " $TPF_PY_SCENARIOS " == *" $1 "* ]]; }
  # _suite LABEL W BACKEND: the six scenarios (those TPF_PY_SCENARIOS lists), and compile.
  _suite() {
    local label=$1 w=$2 backend=$3 st tag before
    _daemon "$label-w$w" || { rc=1; return; }
    local live=$_dpid
    if [ -n "${TPF_PY_COMPILE_ONLY:-}" ]; then # compile_rank.py alone (its own benchmark at W = 2 included)
      _compile "$label" "$w" "$backend" "$tmp/$label-w$w.sock"
      kill "$live"; wait "$live" 2>/dev/null
      return
    fi
    for scen in data graph graphabort; do
      _wanted $scen || continue
      tag=$label-$scen-w$w
      if _ranks "$tag" "$w" "$backend" "$tmp/$label-w$w.sock" comm_rank.py --backend "$backend" --scenario $scen; then st=PASS; else st=FAIL; rc=1; fi
      echo "$st python $label W=$w $scen"
      grep -h '^RESULT' "$logdir/py-$tag.log" | sort | sed 's/^/    /'
      [ $st = FAIL ] && grep -hv '^RESULT\|^INFO\|NCCL INFO' "$logdir/py-$tag.log" | head -30 | sed 's/^/    ! /'
    done
    # graphrestart: tpfabricd SIGKILLed and started again under the graph's replays; the group is re-adopted.
    # On the proxy route (TPF_GPU_ROUTE=proxy), so that every call of the graph waits on the daemon.
    if _wanted graphrestart; then
      tag=$label-graphrestart-w$w
      : >"$logdir/py-$tag.log" # emptied before the wait below reads it (an earlier run's READY lines)
      TPF_GPU_ROUTE=proxy _ranks "$tag" "$w" "$backend" "$tmp/$label-w$w.sock" comm_rank.py --backend "$backend" --scenario graphrestart &
      local rp=$! adopted proxied
      for _ in $(seq 600); do [ "$(grep -c '^READY' "$logdir/py-$tag.log" 2>/dev/null)" = "$w" ] && break; sleep 0.1; done
      sleep 0.2
      kill -9 "$live"; wait "$live" 2>/dev/null
      sleep 2 # as systemd's RestartSec=2s: longer than the kernels' 500 ms heartbeat tolerance
      mv "$logdir/py-tpfabricd-$label-w$w.log" "$logdir/py-tpfabricd-$label-w$w-killed.log"
      _daemon "$label-w$w" || { rc=1; return; }
      live=$_dpid
      if wait "$rp"; then st=PASS; else st=FAIL; rc=1; fi
      adopted=$(grep -c 're-adopted after a daemon restart.*device buffers' "$logdir/py-tpfabricd-$label-w$w.log")
      proxied=$(grep -c 'attached its GPU: routes [^;]*proxy' "$logdir/py-tpfabricd-$label-w$w-killed.log")
      [ "$adopted" = 1 ] && [ "$proxied" = "$w" ] || { st=FAIL; rc=1; }
      echo "$st python $label W=$w graphrestart (proxy route on $proxied of $w ranks; tpfabricd SIGKILLed and started again under the replays: re-adopted $adopted time(s))"
      grep -h '^RESULT' "$logdir/py-$tag.log" | sort | sed 's/^/    /'
      [ $st = FAIL ] && grep -hv '^RESULT\|^INFO\|NCCL INFO' "$logdir/py-$tag.log" | head -30 | sed 's/^/    ! /'
    fi
    _compile "$label" "$w" "$backend" "$tmp/$label-w$w.sock"
    kill "$live"; wait "$live" 2>/dev/null
    # fallback: a daemon that died (its socket file stays; connect is refused)
    if _wanted fallback; then
      _daemon "$label-stopped-w$w" && kill -9 "$_dpid" && wait "$_dpid" 2>/dev/null
      tag=$label-fallback-w$w
      if _ranks "$tag" "$w" "$backend" "$tmp/$label-stopped-w$w.sock" comm_rank.py --backend "$backend" --scenario fallback; then st=PASS; else st=FAIL; rc=1; fi
      echo "$st python $label W=$w fallback (daemon stopped)"
      grep -h '^RESULT' "$logdir/py-$tag.log" | sort | sed 's/^/    /'
      [ $st = FAIL ] && grep -hv '^RESULT\|^INFO\|NCCL INFO' "$logdir/py-$tag.log" | head -30 | sed 's/^/    ! /'
    fi
    _wanted disable || return
    # TPF_DISABLE=1 on the last rank: every rank falls back and no rank connects to the daemon
    _daemon "$label-disabled-w$w" --log-level debug || { rc=1; return; }
    tag=$label-disable-w$w
    if _ranks "$tag" "$w" "$backend" "$tmp/$label-disabled-w$w.sock" comm_rank.py --backend "$backend" --scenario disable \
         --disable-rank $((w - 1)); then st=PASS; else st=FAIL; rc=1; fi
    if grep -q "connected (pid" "$logdir/py-tpfabricd-$label-disabled-w$w.log"; then
      st=FAIL; rc=1; echo "    ! a rank connected to the daemon despite TPF_DISABLE=1"
    fi
    echo "$st python $label W=$w disable (TPF_DISABLE=1 on rank $((w - 1)))"
    grep -h '^RESULT' "$logdir/py-$tag.log" | sort | sed 's/^/    /'
    [ $st = FAIL ] && grep -hv '^RESULT\|^INFO\|NCCL INFO' "$logdir/py-$tag.log" | head -30 | sed 's/^/    ! /'
    kill "$_dpid"; wait "$_dpid" 2>/dev/null
  }

  local only=${TPF_PY_GPU_ONLY:-}
  if [ "$only" = crossnode ]; then # two daemons as two nodes, the caller's (tests/gpu/crossnode.sh)
    local label=crossnode-${TPF_PY_LABEL:-mps} st tag
    [ -n "${TPF_PY_SOCKETS:-}" ] || { echo "FAIL python crossnode: TPF_PY_SOCKETS names no sockets"; rm -rf "$tmp"; return 1; }
    for scen in data graph graphabort; do
      tag=$label-$scen-w2
      if _ranks "$tag" 2 gloo "$TPF_PY_SOCKETS" comm_rank.py --backend gloo --scenario $scen; then st=PASS; else st=FAIL; rc=1; fi
      echo "$st python $label W=2 $scen (rank r on node r, the tcp wire between them)"
      grep -h '^RESULT' "$logdir/py-$tag.log" | sort | sed 's/^/    /'
      [ $st = FAIL ] && grep -hv '^RESULT\|^INFO\|NCCL INFO' "$logdir/py-$tag.log" | head -30 | sed 's/^/    ! /'
    done
    rm -rf "$tmp"
    return $rc
  fi
  if [ "$only" = pergpu ] && [ "$ngpu" -lt 2 ]; then echo "SKIP python pergpu: $ngpu GPU"; rm -rf "$tmp"; return 77; fi
  if [ "$ngpu" -ge 2 ] && [ "$only" != mps ]; then
    (
      unset CUDA_VISIBLE_DEVICES CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY # one process per GPU, no MPS
      _suite pergpu "$ngpu" nccl
      if [ -z "${TPF_GPU_NO_BENCH:-}" ] && [ -z "${TPF_PY_COMPILE_ONLY:-}" ]; then
        _daemon bench || exit 1
        echo "== python benchmark (tests/gpu/python/bench_comm.py, W=$ngpu, NCCL group): $(date -u +%FT%TZ)"
        if _ranks bench "$ngpu" nccl "$tmp/bench.sock" bench_comm.py; then grep -h '^ROW\|^INFO' "$logdir/py-bench.log"
        else echo "FAIL python benchmark"; grep -hv 'NCCL INFO' "$logdir/py-bench.log" | head -30 | sed 's/^/    ! /'; rc=1; fi
        kill "$_dpid"; wait "$_dpid" 2>/dev/null
      fi
      exit $rc
    ) || rc=1
  fi
  [ "$only" = pergpu ] || (
    export CUDA_VISIBLE_DEVICES=0
    if [ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then
      export CUDA_MPS_PIPE_DIRECTORY=$tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=$tmp/mps-log
      mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
      nvidia-cuda-mps-control -d || { echo "FAIL python: MPS did not start"; exit 1; }
      own_mps=1
    fi
    for w in 2 4; do _suite mps "$w" gloo; done
    if [ -z "${TPF_GPU_NO_BENCH:-}" ] && [ -z "${TPF_PY_COMPILE_ONLY:-}" ]; then # the Communicator alone, W = 2 on one GPU (run.sh's tpf-gpubench rows beside it)
      _daemon mps-bench || exit 1
      echo "== python benchmark under MPS (bench_comm.py --backend gloo, W=2 on one GPU): $(date -u +%FT%TZ)"
      if _ranks mps-bench 2 gloo "$tmp/mps-bench.sock" bench_comm.py --backend gloo; then grep -h '^ROW\|^INFO' "$logdir/py-mps-bench.log"
      else echo "FAIL python benchmark under MPS"; grep -hv 'NCCL INFO' "$logdir/py-mps-bench.log" | head -30 | sed 's/^/    ! /'; rc=1; fi
      kill "$_dpid"; wait "$_dpid" 2>/dev/null
    fi
    [ -n "$own_mps" ] && { echo quit | nvidia-cuda-mps-control; sleep 1; }
    exit $rc
  ) || rc=1
  rm -rf "$tmp"
  return $rc
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  cd "$(dirname "$0")/../../.." || exit 1
  tpf_python_gpu_suite "$@"
  exit $?
fi
