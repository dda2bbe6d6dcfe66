# shellcheck shell=bash disable=SC2154  # run.sh defines bin, logdir, started, st
# The cross-node (tcp) stage of the GPU tests, sourced by tests/gpu/run.sh:
# two tpfabricd on 127.0.0.1 as two nodes (their own sockets and peer ports,
# peer.wire = "tcp"), and Device groups split across them, each rank attached
# to its own node's daemon: a kernel stages its shard in host memory, its
# node's proxy sends it over the tcp wire, the other node's daemon lands
# payload then flag in the peer's region, the peer's kernel reads it.
#   W = 2, nodes 0,1 (one rank a node) and W = 4, nodes 0,0,1,1 (two ranks a
#   node: ipc inside, tcp across), route auto; every rank checks its routes at
#   open (tpf-gpurank --nodes: self, ipc to its own node, tcp to the other):
#     data, odd, gatherv, graph (64 replays), kill (the last rank, on node 1,
#     exits: PeerLost naming it), stall (it stops posting: Timeout), and
#     graphnodekill: node 1's daemon SIGKILLed under graph replays (node 0's
#     ranks PeerLost, node 1's DaemonLost, in the health word at the failed
#     replay's sync point, outputs unwritten: node 0's daemon waits
#     peer.restart_wait_ms, 4 s here, for node 1's to come back; node 1's
#     kernels wait for theirs until their 5 s timeout); before the kill
#     daemon 0's status shows the link's wire tcp with its byte counters
#     moved (needs $bin/tpfabricctl);
#     restart: node 1's daemon SIGKILLed under 1,000 graph replays and
#     started again 2 s later on its socket and port (as systemd's
#     RestartSec=2s): it re-adopts the group (one journal line, device
#     buffers) and rejoins node 0, which kept it (one "rejoined" line);
#     every replay exact and healthy, the same graph throughout;
#   then the torch Communicator at W = 2 across the two daemons
#   (tests/gpu/python/run.sh, TPF_PY_GPU_ONLY=crossnode: data, graph, graphabort).
# Every line it prints for a verdict starts "PASS|FAIL|SKIP gpu-crossnode(tcp)".
# tpf_gpu_crossnode LABEL [DEVICE_0 DEVICE_1]: LABEL names the logs (mps,
# pergpu); with devices, node n's ranks run on DEVICE_n (one GPU a node),
# else on the visible device (under MPS). Uses run.sh's $bin, $logdir,
# start_daemon, ranks, show, judge and freeport. TPF_GPU_NO_TCP=1 skips it.

# crossnode_status SOCKET: "ok ..." when the daemon's status lists one ready
# peer link with wire tcp and byte and frame counters that moved, and its
# open Device group routes the other node's ranks through the proxy; else what is not so.
crossnode_status() {
  "$bin/tpfabricctl" status --json --socket "$1" 2>&1 | python3 -c '
import json, sys
try:
    d = json.load(sys.stdin)
except Exception as e:
    print("status unreadable: %s" % e); sys.exit()
gs = [g for g in d["groups"] if g["state"] == "open"]
ps = [p for p in d["peers"] if gs and p["group"] == gs[0]["id"]]
if len(gs) != 1 or len(ps) != 1:
    print("%d open groups, %d peer links of it" % (len(gs), len(ps))); sys.exit()
p, t = ps[0], ps[0].get("tcp") or {}
bad = [k for k in ("sent_bytes", "received_bytes", "frames_sent", "frames_received") if not t.get(k, 0) > 0]
remote = [r["rank"] for r in gs[0]["ranks"] if not r["local"]]
if p.get("wire") != "tcp" or p.get("state") != "ready" or bad or not remote:
    print("link wire %s state %s, counters not moved: %s, remote ranks %s" % (p.get("wire"), p.get("state"), bad, remote))
else:
    print("ok link wire tcp ready, sent %d B received %d B" % (t["sent_bytes"], t["received_bytes"]))'
}

tpf_gpu_crossnode() {
  local label=$1 dev0=${2:-} dev1=${3:-} xdir n nodes w scen tmo layout sa
  local -a socks=()
  xnode_pids=()
  if [ -n "${TPF_GPU_NO_TCP:-}" ]; then
    judge 77; echo "SKIP gpu-crossnode(tcp) $label: TPF_GPU_NO_TCP is set"; return
  fi
  echo "== cross-node (tcp) stage, $label: two tpfabricd on 127.0.0.1 as two nodes, Device groups split across them"
  xdir=$(mktemp -d)
  # xnode_start N [LOG_SUFFIX [same]]: node N's daemon (config, socket and log
  # of its own) in xnode_pids[N]; with "same", on the port it had (a restart).
  xnode_start() {
    local n=$1
    [ "${3:-}" = same ] ||
      printf '[peer]\nlisten = "127.0.0.1"\nport = %s\nwire = "tcp"\nrestart_wait_ms = 4000\n' "$(freeport)" >"$xdir/node$n.toml"
    start_daemon "$xdir/node$n.sock" "$logdir/tpfabricd-tcp-$label-node$n${2:-}.log" --config "$xdir/node$n.toml" || return 1
    xnode_pids[$n]=$started
  }
  xnode_stop() { [ -n "${xnode_pids[$1]:-}" ] && kill "${xnode_pids[$1]}" 2>/dev/null && wait "${xnode_pids[$1]}" 2>/dev/null; xnode_pids[$1]=; }
  if ! xnode_start 0 || ! xnode_start 1; then
    judge 1; echo "FAIL gpu-crossnode(tcp) $label: the daemons did not start"
    xnode_stop 0; xnode_stop 1; rm -rf "$xdir"; return
  fi
  socks=("$xdir/node0.sock" "$xdir/node1.sock")
  for layout in "0 1" "0 0 1 1"; do
    w=$(wc -w <<<"$layout") nodes=${layout// /,}
    local rank_socks="" rank_devs=""
    for n in $layout; do
      rank_socks+="${socks[$n]} "
      [ -n "$dev0" ] && rank_devs+="$([ "$n" = 0 ] && echo "$dev0" || echo "$dev1") "
    done
    tag=-tcp-$label
    for scen in data odd gatherv graph kill stall; do
      tmo=5000; [ $scen = stall ] && tmo=1000; [ $scen = kill ] && tmo=10000
      ranks tpf-gpurank "$w" auto $scen $tmo --scenario $scen --timeout-ms $tmo --nodes "$nodes"; judge $?
      show "$st gpu-crossnode(tcp) $label W=$w nodes=$nodes scenario=$scen" "$logdir/tpf-gpurank-$scen-auto-w$w$tag.log"
    done
    # node 1's daemon SIGKILLed under graph replays, once every rank is READY
    local glog=$logdir/tpf-gpurank-graphnodekill-auto-w$w$tag.log
    (ranks tpf-gpurank "$w" auto graphnodekill 5000 --scenario graphnodekill --timeout-ms 5000 --nodes "$nodes") &
    local rp=$!
    for _ in $(seq 300); do [ "$(grep -c READY "$glog" 2>/dev/null)" = "$w" ] && break; sleep 0.1; done
    sa="no $bin/tpfabricctl"
    [ -x "$bin/tpfabricctl" ] && sa=$(crossnode_status "${socks[0]}")
    kill -9 "${xnode_pids[1]}" 2>/dev/null; wait "${xnode_pids[1]}" 2>/dev/null; xnode_pids[1]=
    wait "$rp"; judge $?
    show "$st gpu-crossnode(tcp) $label W=$w nodes=$nodes scenario=graphnodekill (node 1's daemon SIGKILLed under replays)" "$glog"
    if [ -x "$bin/tpfabricctl" ]; then
      case $sa in ok*) judge 0 ;; *) judge 1 ;; esac
      echo "$st gpu-crossnode(tcp) $label W=$w status of node 0 under the graph: $sa"
    fi
    xnode_start 1 "-after-w$w" || { judge 1; echo "FAIL gpu-crossnode(tcp) $label: node 1's daemon did not restart"; break; }
    # node 1's daemon SIGKILLed under graph replays and started again 2 s later: the group goes on
    local rlog=$logdir/tpf-gpurank-restart-auto-w$w$tag.log rr adopted rejoined before
    local after=$logdir/tpfabricd-tcp-$label-node1-restart-w$w.log
    : >"$rlog"
    (ranks tpf-gpurank "$w" auto restart 10000 --scenario restart --timeout-ms 10000 --nodes "$nodes") &
    rp=$!
    for _ in $(seq 300); do [ "$(grep -c READY "$rlog" 2>/dev/null)" = "$w" ] && break; sleep 0.1; done
    sleep 0.2
    before=$(grep -c 'rejoined after' "$logdir/tpfabricd-tcp-$label-node0.log")
    kill -9 "${xnode_pids[1]}" 2>/dev/null; wait "${xnode_pids[1]}" 2>/dev/null; xnode_pids[1]=
    sleep 2 # as systemd's RestartSec=2s
    xnode_start 1 "-restart-w$w" same || echo "node 1's daemon did not start again on its port"
    wait "$rp"; rr=$?
    adopted=$(grep -c 're-adopted after a daemon restart.*device buffers' "$after" 2>/dev/null)
    rejoined=$(($(grep -c 'rejoined after' "$logdir/tpfabricd-tcp-$label-node0.log") - before))
    [ $rr = 0 ] && [ "$adopted" = 1 ] && [ "$rejoined" = 1 ] && judge 0 || judge 1
    show "$st gpu-crossnode(tcp) $label W=$w nodes=$nodes scenario=restart (node 1's daemon SIGKILLed and started again under graph replays: re-adopted $adopted time(s), rejoined node 0 $rejoined time(s), every replay exact and healthy)" "$rlog"
    grep -h 're-adopted\|refused\|rejoin' "$after" "$logdir/tpfabricd-tcp-$label-node0.log" 2>/dev/null | tail -4 | sed 's/^/    > /'
    [ -n "${xnode_pids[1]:-}" ] || { judge 1; echo "FAIL gpu-crossnode(tcp) $label: node 1's daemon is not running"; break; }
  done
  tag=
  # The torch Communicator at W = 2, rank r on node r.
  if [ -z "${TPF_GPU_NO_PYTHON:-}" ] && [ -n "${xnode_pids[1]:-}" ]; then
    . tests/gpu/python/run.sh
    TPF_PY_GPU_ONLY=crossnode TPF_PY_SOCKETS="${socks[0]} ${socks[1]}" TPF_PY_LABEL=$label \
      tpf_python_gpu_suite "$bin" "$logdir"; judge $?
    echo "$st gpu-crossnode(tcp) $label python W=2 (the torch Communicator across two daemons)"
  fi
  xnode_stop 0; xnode_stop 1
  rm -rf "$xdir"
}

# tpf_gpu_crossnode_bench: the benchmark of the tcp wire under a Device group
# (docs/perf.md, the cross-node model), in the bench section of run.sh: two
# daemons as above, W = 2 with one rank a node, tpf-gpubench --route proxy
# --mode sizes (4 KiB .. 512 KiB, a graph of 100 calls, best of 5) and
# --mode parts (the call taken apart: staging copy, hop = doorbell -> this
# node's proxy -> tcp -> the other node's receiver -> flag, read copy),
# interleaved with the same on one daemon (the one-host proxy route) and the
# hop (--mode hop), so that every row has its comparison from the same run.
# Logs: tpf-gpubench-<mode>-proxy-w2-tcp.log beside -onehost.log.
tpf_gpu_crossnode_bench() {
  local xdir n mode
  local -a pids=()
  xdir=$(mktemp -d)
  for n in 0 1; do
    printf '[peer]\nlisten = "127.0.0.1"\nport = %s\nwire = "tcp"\n' "$(freeport)" >"$xdir/node$n.toml"
    start_daemon "$xdir/node$n.sock" "$logdir/tpfabricd-tcp-bench-node$n.log" --config "$xdir/node$n.toml" ||
      { echo "bench tcp: node $n's daemon did not start"; rc=1; for n in "${pids[@]}"; do kill "$n"; done; rm -rf "$xdir"; return; }
    pids+=("$started")
  done
  echo "== benchmark: the tcp wire between two daemons (W = 2, one rank a node) beside the one-host proxy route"
  for mode in sizes parts; do
    tag=-tcp rank_socks="$xdir/node0.sock $xdir/node1.sock" ranks tpf-gpubench 2 proxy "$mode" 0 --mode "$mode" ||
      { echo "bench tcp $mode failed"; rc=1; }
    grep -h '^ROW' "$logdir/tpf-gpubench-$mode-proxy-w2-tcp.log" | sed 's/^ROW /ROW tcp-/'
    tag=-onehost rank_socks="$xdir/node0.sock $xdir/node0.sock" ranks tpf-gpubench 2 proxy "$mode" 0 --mode "$mode" ||
      { echo "bench one-host $mode failed"; rc=1; }
    grep -h '^ROW' "$logdir/tpf-gpubench-$mode-proxy-w2-onehost.log" | sed 's/^ROW /ROW onehost-/'
  done
  tag=-tcp rank_socks="$xdir/node0.sock $xdir/node1.sock" ranks tpf-gpubench 2 proxy hop 0 --mode hop ||
    { echo "bench tcp hop failed"; rc=1; }
  grep -h '^ROW' "$logdir/tpf-gpubench-hop-proxy-w2-tcp.log" | sed 's/^ROW /ROW tcp-/'
  tag=
  for n in "${pids[@]}"; do kill "$n" 2>/dev/null; wait "$n" 2>/dev/null; done
  rm -rf "$xdir"
}
