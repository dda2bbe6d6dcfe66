#!/usr/bin/env bash
# tests/tcp/run.sh: host groups across two tpfabricd on this machine, as two
# nodes ("a" and "b": their own sockets and peer ports on 127.0.0.1), over
# the tcp wire. No RDMA device, no VM: Meson's suite `tcp`, every CI run.
#   run.sh TPFABRICD TPFABRICCTL TPF_TESTRANK
# Prints one TAP stream; exit 0 when every test passed.
#
# Data: W = 2 (1+1), 3 (2+1), 4 (2+2), gathers and f32/f16/bf16 sums
# alternating over every size class (empty, 1 byte, odd, page boundaries, the
# cap), then all-gather-v of uneven rows; every rank checks every byte
# (tpf-testrank exits 3 on a wrong one). Once with peer.wire left at its
# default (auto: no HCA here, so tcp) and once with wire = "tcp" and the
# smallest peer.tcp_inflight_bytes (64 KiB: at the cap the proxy waits).
# While a group is paused between calls both daemons' status show the link
# with wire tcp and byte and frame counters that moved, each side's sent
# equal to the other's received; remote ranks' routes are "tcp"; the text
# status names the wire.
# Faults: a rank of node b exits mid-run (the others PeerLost); a rank of
# node b aborts (Aborted everywhere); daemon b SIGKILLed (node a's ranks
# PeerLost once peer.restart_wait_ms passed, node b's DaemonLost); daemon a
# SIGTERMed and started again, then daemon b SIGKILLed and started again,
# under calls (the group goes on, every call ok); daemon b back only after
# daemon a's peer.restart_wait_ms (a's ranks PeerLost, b's DaemonLost naming
# a's refusal of the rejoin); daemon b replaced by one of another peer
# protocol (a's ranks PeerLost naming it); daemon b SIGSTOPped (every call ends by
# its timeout, Timeout or PeerLost, none hangs; SIGCONT once the ranks
# ended, then a fresh group runs); a node with peer.wire = "verbs" and no
# HCA refuses the group by name on both nodes, at once.
#
# Ports: below the kernel's ephemeral range (32768..), where parallel tests'
# bind(0) and outgoing connections never land, from a random base, each
# checked free (/proc/net/tcp) before use. Everything runs in a temporary
# directory, removed at the end (TPF_TCP_KEEP=1 keeps it and says where);
# every daemon and rank still running is killed on exit.
set -u
here=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 3 ] || { echo "usage: $0 TPFABRICD TPFABRICCTL TPF_TESTRANK" >&2; exit 2; }
# shellcheck source=../common/tap-lib.sh
. "$here/../common/tap-lib.sh"
# shellcheck source=../common/group-lib.sh
. "$here/../common/group-lib.sh"

work=$(mktemp -d "${TMPDIR:-/tmp}/tpf-tcp.XXXXXX") || { echo "Bail out! mktemp failed"; exit 1; }
mkdir -p "$work/bin"
for f in "$@"; do
  [ -x "$f" ] || { echo "Bail out! not an executable: $f"; exit 1; }
done
ln -s "$(realpath "$1")" "$work/bin/tpfabricd"
ln -s "$(realpath "$2")" "$work/bin/tpfabricctl"
ln -s "$(realpath "$3")" "$work/bin/tpf-testrank"
export PATH="$work/bin:$PATH" TPF_SCRATCH=$work
# shellcheck disable=SC2034  # group-lib.sh's
TPF_SOCK_DIR=$work
cd "$work" || exit 1

cleanup() {
  local p
  for p in ${DPID_a:-} ${DPID_b:-}; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
  for p in ${GROUP_PIDS:-}; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  cd / || return
  if [ -n "${TPF_TCP_KEEP:-}" ]; then note "tcp: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT

_bport=$((20000 + RANDOM % 12000))
# shellcheck disable=SC2034  # group-lib.sh's
GROUP_CAP=65536
# An odd number of sizes, so that every size is both gathered and summed.
# shellcheck disable=SC2034
GROUP_SIZES=0,1,3,16,24,100,1000,4096,4097,4104,8192,12312,32768,40976,65520,65535,65536
GROUP_TIMEOUT_MS=10000
ITERS=${TPF_TCP_ITERS:-1020}   # 60 rounds of the 17 sizes
t_start=$(date +%s)

# start_daemon NAME: config NAME.toml (its socket, a free peer port on
# 127.0.0.1, or PEER_PORT), log NAME.log. WIRE sets
# peer.wire (unset: the key is left out, its default), TCP_INFLIGHT
# peer.tcp_inflight_bytes, RESTART_WAIT_MS peer.restart_wait_ms (3000 here:
# a daemon killed for good ends its groups on the other node within the
# calls' timeout).
start_daemon() {
  local name=$1 port=${PEER_PORT:-}
  [ -n "$port" ] || { next_port; port=$PORT; }
  cat >"$name.toml" <<TOML
[daemon]
socket = "$(sock_of "$name")"
max_bytes = $GROUP_CAP
open_timeout_ms = 20000
[peer]
listen = "127.0.0.1"
port = $port
connect_timeout_ms = 5000
restart_wait_ms = ${RESTART_WAIT_MS:-3000}
${WIRE:+wire = \"$WIRE\"}
${TCP_INFLIGHT:+tcp_inflight_bytes = \"$TCP_INFLIGHT\"}
TOML
  rm -f "$(sock_of "$name")"
  tpfabricd --config "$name.toml" --foreground >>"$name.log" 2>&1 &
  eval "DPID_$name=$!"
  if ! wait_until 30 test -S "$(sock_of "$name")" || ! wait_tcp_listen "$port" 10; then
    tap_fail "daemon $name starts (peer port $port${WIRE:+, wire $WIRE})"; diag_file "$name.toml"; diag_file "$name.log"
    return 1
  fi
}
start_daemons() { : >a.log; : >b.log; start_daemon a && start_daemon b; }

# ranks_are NAME WANT RANK...: every listed rank's result is one of WANT ("A|B").
ranks_are() {
  local name=$1 want=$2 r res; shift 2
  for r in "$@"; do
    res=$(result_of "$name" "$r")
    [[ "|$want|" == *"|$res|"* ]] || return 1
  done
}
results() { local r out=""; for ((r = 0; r < $2; r++)); do out+="$(result_of "$1" "$r") "; done; echo "${out% }"; }
# elapsed_max NAME W: the longest elapsed_ms of a failed call over the group's RESULT lines.
elapsed_max() { grep -ho 'elapsed_ms=[0-9.]*' "$1".r*.log 2>/dev/null | cut -d= -f2 | sort -n | tail -n1; }

# snap_status NAME W: once all W ranks of group NAME are paused between
# calls (--pause-at), both daemons' status (JSON, and a's text),
# then lets the group go on.
snap_status() {
  local d
  _paused() { [ "$(cat "$1".r*.log 2>/dev/null | grep -c '^PAUSED')" -ge "$2" ]; }
  wait_until 60 _paused "$1" "$2" || note "snap_status $1: not every rank paused"
  for d in a b; do tpfabricctl status --json --socket "$(sock_of $d)" >"$1.$d.json" 2>&1; done
  tpfabricctl status --socket "$(sock_of a)" >"$1.a.txt" 2>&1
  touch "$work/$1.go"
}

# check_status NAME W LAYOUT: the snapshots of snap_status, judged by python
# (the JSON's structure: grep would not tell peers[] from groups[]).
check_status() {
  local name=$1 w=$2 layout=$3 out
  if out=$(python3 - "$name.a.json" "$name.b.json" "$layout" "${SEND_BUFFER:-0}" <<'PY' 2>&1
import json, sys
try:
    a, b = (json.load(open(p)) for p in sys.argv[1:3])
except Exception as e:
    print(f"status unreadable: {e}"); sys.exit(1)
layout = sys.argv[3].split()  # the node of each rank, A or B
send_buffer = int(sys.argv[4])  # peer.tcp_inflight_bytes as configured (0: not checked)
fails = []
def link(d, who):
    open_ids = {g["id"] for g in d["groups"] if g["state"] == "open"}
    ps = [p for p in d["peers"] if p["group"] in open_ids]
    if len(ps) != 1:
        fails.append(f"daemon {who}: {len(ps)} peer links of the open group, expected 1")
        return None
    p = ps[0]
    if p.get("wire") != "tcp": fails.append(f"daemon {who}: the link's wire is {p.get('wire')!r}, expected 'tcp'")
    if p.get("state") != "ready": fails.append(f"daemon {who}: the link's state is {p.get('state')!r}, expected 'ready'")
    t = p.get("tcp")
    if not isinstance(t, dict):
        fails.append(f"daemon {who}: the link has no tcp object: {p}")
        return None
    for k in ("sent_bytes", "received_bytes", "frames_sent", "frames_received"):
        if not isinstance(t.get(k), int) or t[k] <= 0: fails.append(f"daemon {who}: tcp.{k} is {t.get(k)!r}, expected > 0")
    if send_buffer and t.get("send_buffer") != send_buffer:
        fails.append(f"daemon {who}: tcp.send_buffer is {t.get('send_buffer')!r}, peer.tcp_inflight_bytes {send_buffer}")
    if t.get("failed"): fails.append(f"daemon {who}: tcp.failed says {t['failed']!r}")
    return t
def routes(d, who, me):
    gs = [g for g in d["groups"] if g["state"] == "open"]
    if len(gs) != 1:
        fails.append(f"daemon {who}: {len(gs)} open groups, expected 1"); return
    for r in gs[0]["ranks"]:
        remote = layout[r["rank"]] != me
        if remote and r["route"] != "tcp": fails.append(f"daemon {who}: rank {r['rank']} (node {layout[r['rank']]}) has route {r['route']!r}, expected 'tcp'")
        if not remote and r["route"] == "tcp": fails.append(f"daemon {who}: its own rank {r['rank']} has route 'tcp'")
        if remote == r["local"]: fails.append(f"daemon {who}: rank {r['rank']} local={r['local']}, on node {layout[r['rank']]}")
ta, tb = link(a, "a"), link(b, "b")
routes(a, "a", "A"); routes(b, "b", "B")
if ta and tb:
    # every rank paused between calls: nothing in flight, each side's sent is the other's received
    for x, y in (("sent_bytes", "received_bytes"), ("frames_sent", "frames_received")):
        if ta[x] != tb[y]: fails.append(f"a's tcp.{x} {ta[x]} != b's tcp.{y} {tb[y]}")
        if tb[x] != ta[y]: fails.append(f"b's tcp.{x} {tb[x]} != a's tcp.{y} {ta[y]}")
if fails: print("\n".join(fails)); sys.exit(1)
print(f"a sent {ta['sent_bytes']} B in {ta['frames_sent']} frames, received {ta['received_bytes']} B in {ta['frames_received']}")
PY
  ); then
    tap_ok "W=$w ($layout): status on both nodes: the link's wire is tcp, routes to the other node tcp, counters moved and agree ($out)"
  else
    tap_fail "W=$w ($layout): status on both nodes: the link's wire is tcp, routes to the other node tcp, counters moved and agree" \
      "$out"
    diag "a: $(head -c 2000 "$name.a.json" 2>/dev/null)"
  fi
  if grep -qw tcp "$name.a.txt"; then tap_ok "W=$w: tpfabricctl status (text) names the tcp wire"
  else tap_fail "W=$w: tpfabricctl status (text) names the tcp wire"; diag_file "$name.a.txt" 30; fi
}

# data_runs ID LABEL: on the running daemons, W = 2, 3, 4: mixed gathers and
# sums (paused half way for both daemons' status), then all-gather-v. ID
# names the files, LABEL the tests.
data_runs() {
  local id=$1 label=$2 layout w name
  for layout in "A B" "A A B" "A B A B"; do
    w=$(wc -w <<<"$layout") name=$id-w$w
    GROUP_PROGRESS=$((ITERS / 4)) DURING="snap_status $name $w" \
      run_group "$name" "$layout" --iters "$ITERS" --mode mixed --pause-at $((ITERS / 2)) --go-file "$work/$name.go"
    if [ "$GROUP_RCS" = "$(printf '0 %.0s' $(seq "$w"))" ]; then
      tap_ok "$label, W=$w ($layout): $ITERS gathers and sums of every size class up to the cap, every rank byte/bit-exact"
    else
      tap_fail "$label, W=$w ($layout): $ITERS gathers and sums of every size class up to the cap, every rank byte/bit-exact" \
        "exit codes $GROUP_RCS"
      show_group "$name"
    fi
    check_status "$name" "$w" "$layout"
    if run_group "$name-v" "$layout" --iters $((ITERS / 2)) --mode gatherv; then
      tap_ok "$label, W=$w ($layout): $((ITERS / 2)) all-gather-v calls of uneven rows, every rank byte-exact"
    else
      tap_fail "$label, W=$w ($layout): $((ITERS / 2)) all-gather-v calls of uneven rows, every rank byte-exact" \
        "exit codes $GROUP_RCS"
      show_group "$name-v"
    fi
  done
}

# ---- data, peer.wire left at its default (auto: no HCA here, so tcp) ----------
start_daemons || tap_done
data_runs auto "wire auto"
stop_daemons

# ---- data, then faults, wire = "tcp" on both nodes, the smallest in-flight cap --
WIRE=tcp TCP_INFLIGHT=64KiB start_daemons || tap_done
SEND_BUFFER=65536 data_runs tcp "wire tcp, tcp_inflight_bytes 64KiB"

# A rank of node b exits without closing: every other rank, on both nodes, PeerLost.
EXTRA_3="--exit-at 150" run_group exitrank "A B A B" --iters 2000 --mode mixed
rs=$(results exitrank 3)
if ranks_are exitrank PeerLost 0 1 2; then tap_ok "rank 3 (node b) exits mid-run: ranks 0-2 on both nodes end PeerLost"
else tap_fail "rank 3 (node b) exits mid-run: ranks 0-2 on both nodes end PeerLost" "ranks 0-2: $rs"; show_group exitrank; fi

# A rank of node b aborts the group: every rank, on both nodes, Aborted.
EXTRA_1="--abort-at 150" run_group abortrank "A B A B" --iters 2000 --mode mixed
rs=$(results abortrank 4)
if [ "$rs" = "Aborted Aborted Aborted Aborted" ]; then tap_ok "rank 1 (node b) aborts: every rank on both nodes ends Aborted"
else tap_fail "rank 1 (node b) aborts: every rank on both nodes ends Aborted" "ranks: $rs"; show_group abortrank; fi

# After those two the daemons still carry a group.
if run_group after "A B A B" --iters 100 --mode mixed; then tap_ok "after a lost rank and an abort a fresh W=4 group runs ok"
else tap_fail "after a lost rank and an abort a fresh W=4 group runs ok" "exit codes $GROUP_RCS"; show_group after; fi

# Daemon b SIGKILLed under calls: node a's ranks PeerLost, node b's DaemonLost, within the timeout.
DURING='stop_daemon b KILL' run_group kill "A B A B" --iters 100000000 --mode mixed
t=$(($(date +%s) - ${DURING_AT:-0}))
el=$(elapsed_max kill)
if [ -n "$DURING_AT" ] && ranks_are kill PeerLost 0 2 && [ "$t" -le $((GROUP_TIMEOUT_MS / 1000 + 5)) ] &&
   awk -v e="${el:-99999}" -v b=$((GROUP_TIMEOUT_MS + 1000)) 'BEGIN { exit !(e <= b) }'; then
  tap_ok "daemon b SIGKILLed: node a's ranks end PeerLost (longest failed call ${el} ms; all out ${t} s after the kill)"
else tap_fail "daemon b SIGKILLed: node a's ranks end PeerLost within the timeout + 1 s" \
  "ranks: $(results kill 4), longest failed call ${el:-none} ms, all out ${t} s after the kill"; show_group kill; fi
if ranks_are kill DaemonLost 1 3; then tap_ok "daemon b SIGKILLed: its own ranks end DaemonLost"
else tap_fail "daemon b SIGKILLed: its own ranks end DaemonLost" "ranks: $(results kill 4)"; show_group kill; fi
if grep -q PeerLost a.log; then tap_ok "daemon b SIGKILLed: daemon a logs the lost peer"
else tap_fail "daemon b SIGKILLed: daemon a logs the lost peer"; diag_file a.log 10; fi
# Daemon a carries on: with b restarted, a fresh group across them runs.
if WIRE=tcp TCP_INFLIGHT=64KiB start_daemon b && run_group afterkill "A B" --iters 200 --mode mixed; then
  tap_ok "daemon b restarted after the kill: a fresh W=2 group with daemon a runs ok"
else tap_fail "daemon b restarted after the kill: a fresh W=2 group with daemon a runs ok" "exit codes $GROUP_RCS"
  show_group afterkill; fi
stop_daemons

# ---- daemons restarted under calls --------------------------------------------
# A W = 4 group goes on through a restart of daemon a (SIGTERM, then started
# again on the same socket and peer port) and then a SIGKILL and start of
# daemon b: every rank's calls all ok (checked byte/bit-exact), no reopen;
# each restarted daemon logs one re-adoption and shows the group re-adopted,
# the other logs the node's rejoin.
calls_of() { local l; l=$(grep '^PROGRESS' "$1.r$2.log" | tail -n1); l=${l##*calls=}; echo "${l:-0}"; }
_past() { [ "$(calls_of restart 0)" -ge "$1" ] || grep -q '^RESULT' restart.r0.log; }
_adopted() { grep -q 're-adopted after a daemon restart' "$1.log"; }
# restart_one NAME SIGNAL: stop daemon NAME, start it again on its port, wait
# for its re-adoption of the group and for 300 more calls.
restart_one() {
  local port before
  port=$(sed -n 's/^port = //p' "$1.toml")
  stop_daemon "$1" "$2"
  RESTART_WAIT_MS=60000 WIRE=tcp PEER_PORT=$port start_daemon "$1" || return 1
  wait_until 60 _adopted "$1" || note "daemon $1 logged no re-adoption in 60 s"
  tpfabricctl status --json --socket "$(sock_of "$1")" 2>/dev/null | tr -d ' \n' >"restart.$1.json"
  before=$(calls_of restart 0)
  wait_until 60 _past $((before + 300)) || note "no 300 calls after daemon $1's restart in 60 s"
}
: >a.log; : >b.log
RESTART_WAIT_MS=60000 WIRE=tcp start_daemon a && RESTART_WAIT_MS=60000 WIRE=tcp start_daemon b || tap_done
DURING='restart_one a TERM && restart_one b KILL' run_group restart "A B A B" --iters 3000 --mode mixed
rs=$(results restart 4)
if [ -n "$DURING_AT" ] && [ "$rs" = "ok ok ok ok" ]; then
  tap_ok "daemon a SIGTERMed and restarted, then daemon b SIGKILLed and restarted, under calls: every rank's 3000 calls ok, no reopen"
else tap_fail "daemons restarted under calls: every rank's 3000 calls ok" "ranks: $rs (exit codes $GROUP_RCS)"; show_group restart; fi
for d in a b; do
  if [ "$(grep -c 're-adopted after a daemon restart' $d.log)" = 1 ] && grep -q '"adoption":{' "restart.$d.json"; then
    tap_ok "daemon $d: one re-adoption line, and its status shows the group re-adopted ($(grep -o '"gap_ms":[0-9.]*' "restart.$d.json"))"
  else tap_fail "daemon $d: one re-adoption line and the group re-adopted in its status"; diag_file $d.log 15; fi
done
if grep -q 'rejoined after' a.log && grep -q 'rejoined after' b.log; then
  tap_ok "the daemon that kept the group logs the other node's rejoin (b for a, a for b)"
else tap_fail "the daemon that kept the group logs the other node's rejoin"; diag_file a.log 10; diag_file b.log 10; fi
cp a.log restart.a.log; cp b.log restart.b.log # kept with TPF_TCP_KEEP: the next tests start new logs
# Daemon a kept the group through b's restart: its metrics count the rejoin.
m=$(tpfabricctl metrics --socket "$(sock_of a)" 2>&1)
if grep -q '^tpfabric_peer_rejoins_total 1$' <<<"$m" && grep -q '^tpfabric_peer_away_seconds_total [0-9.e+-]*$' <<<"$m"; then
  tap_ok "daemon a's metrics count daemon b's rejoin: $(grep '^tpfabric_peer_away_seconds_total' <<<"$m")"
else tap_fail "daemon a's metrics count daemon b's rejoin" "$(grep 'tpfabric_peer' <<<"$m" | tr '\n' ' ')"; fi
stop_daemons

# Daemon b back too late: daemon a waits 2 s (peer.restart_wait_ms), ends
# the group (its ranks PeerLost) and refuses b's rejoin 3 s after the kill;
# b's ranks, re-adopted by the new daemon b, end DaemonLost naming why.
: >a.log; : >b.log
RESTART_WAIT_MS=2000 WIRE=tcp start_daemon a && WIRE=tcp start_daemon b || tap_done
bport=$(sed -n 's/^port = //p' b.toml)
DURING='stop_daemon b KILL; sleep 3; WIRE=tcp PEER_PORT=$bport start_daemon b' run_group late "A B A B" --iters 100000000 --mode mixed
if ranks_are late PeerLost 0 2 && ranks_are late DaemonLost 1 3 && grep -q 'while your daemon was away' late.r1.log; then
  tap_ok "daemon b back after daemon a's peer.restart_wait_ms: a's ranks PeerLost, b's DaemonLost naming a's refusal"
else tap_fail "daemon b back too late: a's ranks PeerLost, b's DaemonLost naming a's refusal" "ranks: $(results late 4)"
  show_group late; fi
stop_daemons

# Daemon b SIGKILLed and "back" as a daemon of another release: a stand-in on
# b's address opens links to daemon a with a hello of another peer-record
# revision every 200 ms. Daemon a refuses each (BadMagic), waits on (an
# unauthenticated link does not end the wait), and when its
# peer.restart_wait_ms (2 s) passes ends the group naming what it refused:
# the journal, and a's ranks' PeerLost detail (the daemon's GroupFailed).
# b's ranks, their daemon not back, end DaemonLost at their call's timeout.
other_release_peer() { # PORT SECONDS
  python3 - "$1" "$2" <<'PY'
import os, socket, struct, sys, time
port, secs = int(sys.argv[1]), float(sys.argv[2])
# MsgHeader (magic 'TPP' revision 2, version 3, opcode 1 PeerHello, 64 bytes, seq 1) + PeerHello.
hello = struct.pack("<IHHII", 0x02505054, 3, 1, 64, 1) + os.urandom(48) + bytes(16)
end = time.time() + secs
while time.time() < end:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(hello)
            s.recv(4096)
    except OSError:
        pass
    time.sleep(0.2)
PY
}
: >a.log; : >b.log
RESTART_WAIT_MS=2000 WIRE=tcp start_daemon a && WIRE=tcp start_daemon b || tap_done
aport=$(sed -n 's/^port = //p' a.toml)
DURING='stop_daemon b KILL; other_release_peer $aport 2.5 &' run_group otherpeer "A B A B" --iters 100000000 --mode mixed
if ranks_are otherpeer PeerLost 0 2 && ranks_are otherpeer DaemonLost 1 3 &&
   [ "$(grep -l 'did not come back within 2000 ms.*was refused: BadMagic.*another peer protocol' otherpeer.r0.log otherpeer.r2.log | wc -l)" = 2 ] &&
   grep -q 'the address of node .* whose daemon is away, was refused' a.log; then
  tap_ok "daemon b back speaking another peer protocol: a's ranks PeerLost naming it (daemon a's reason in their detail), b's DaemonLost"
else tap_fail "daemon b back speaking another peer protocol: a's ranks PeerLost naming it, b's DaemonLost" \
  "ranks: $(results otherpeer 4); $(grep -ho 'detail=.*' otherpeer.r0.log | head -1 | cut -c1-400)"
  show_group otherpeer; diag_file a.log 10; fi
stop_daemons

# Daemon b SIGSTOPped under calls (3 s timeout): every rank's call ends, by
# its timeout, Timeout or PeerLost (node b's ranks: their own daemon is the
# one stalled, so DaemonLost is named too); none hangs, none returns wrong
# data. SIGCONT once every rank ended; then both daemons carry a fresh group.
WIRE=tcp start_daemons || tap_done
# A rank that hung on its stopped daemon would hold run_group forever: 30 s
# after the stop daemon b resumes anyway (and the timing check fails).
GROUP_TIMEOUT_MS=3000 DURING='kill -STOP $DPID_b; (sleep 30; kill -CONT $DPID_b) & cont=$!' \
  run_group stall "A B A B" --iters 100000000 --mode mixed
t=$(($(date +%s) - ${DURING_AT:-0}))
kill -CONT "$DPID_b" 2>/dev/null
[ -n "${cont:-}" ] && kill "$cont" 2>/dev/null
el=$(elapsed_max stall)
if [ -n "$DURING_AT" ] && ranks_are stall "Timeout|PeerLost" 0 2 && ranks_are stall "Timeout|PeerLost|DaemonLost" 1 3 &&
   [ "$t" -le 10 ] && awk -v e="${el:-99999}" 'BEGIN { exit !(e <= 4000) }'; then
  tap_ok "daemon b SIGSTOPped: every rank's call ends ($(results stall 4)) within the 3 s timeout + 1 s (longest ${el} ms; all out ${t} s after the stop)"
else
  tap_fail "daemon b SIGSTOPped: every rank's call ends Timeout or PeerLost within the 3 s timeout + 1 s" \
    "ranks: $(results stall 4), longest failed call ${el:-none} ms, all out ${t} s after the stop (exit codes $GROUP_RCS)"
  show_group stall
fi
if run_group afterstall "A B" --iters 200 --mode mixed; then tap_ok "daemon b resumed (SIGCONT): a fresh W=2 group runs ok"
else tap_fail "daemon b resumed (SIGCONT): a fresh W=2 group runs ok" "exit codes $GROUP_RCS"; show_group afterstall; fi
stop_daemons

# ---- a node with peer.wire = "verbs" and no HCA ---------------------------------
# Node b may only use verbs and has no HCA: the group spans the nodes, so both
# refuse it by name, at once (not at the open timeout).
: >a.log; : >b.log
WIRE=tcp start_daemon a && WIRE=verbs start_daemon b || tap_done
t0=$(date +%s)
run_group refused "A B" --iters 10
t=$(($(date +%s) - t0))
r0=$(result_of refused 0) r1=$(result_of refused 1)
if [ "$r0/$r1" = Unavailable/Unavailable ] && [ "$t" -lt 15 ]; then
  tap_ok "node b with wire \"verbs\" and no HCA: both ranks refused Unavailable after ${t} s"
else tap_fail "node b with wire \"verbs\" and no HCA: both ranks refused Unavailable within 15 s" "ranks: $r0, $r1 after ${t} s"
  show_group refused; fi
# The reason, whole on both nodes (it travels in 127 bytes): this one's peer.wire, and the other node offers only tcp.
if grep -q 'peer\.wire is "verbs" and node [0-9a-f]* offers only tcp (set "auto")' refused.r1.log &&
   grep -q 'peer\.wire is "verbs" and node [0-9a-f]* offers only tcp' refused.r0.log &&
   grep -q 'peer\.wire is "verbs"' b.log; then
  tap_ok "node b with wire \"verbs\": both ranks are told that node a offers only tcp and b's peer.wire refuses it"
else tap_fail "node b with wire \"verbs\": both ranks are told that node a offers only tcp and b's peer.wire refuses it"
  diag_file refused.r0.log 2; diag_file refused.r1.log 2; diag "daemon b:"; diag_file b.log 4; fi
stop_daemons

diag "tcp suite: $(($(date +%s) - t_start)) s"
tap_done
