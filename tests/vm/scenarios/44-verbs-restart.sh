#!/bin/bash
# VM scenario 44-verbs-restart: a group spanning nodes goes on through its
# daemons' restarts. A W = 4 host group over verbs (two ranks a node) makes
# 10,000 checked calls; meanwhile node A's daemon is stopped (SIGTERM) and
# started again, and once it re-adopted the group node B's is SIGKILLed and
# started again. Every rank ends ok after every call (tpf-testrank checks each
# call byte/bit-exact and exits 3 on a wrong byte): no rank reopens; each
# restarted daemon logs one re-adoption and shows the group re-adopted in its
# status (same group, adoption.gap_ms); the daemon that kept the group logs
# the other node's rejoin. A daemon that does not come back ends the group
# with PeerLost on the other node after peer.restart_wait_ms: 41-verbs-faults.
# vm-timeout: 1200
# shellcheck source=../guest-lib.sh
. "$TPF_GUEST_LIB"
# shellcheck source=../verbs-lib.sh
. /opt/tpf/verbs-lib.sh

RESTART_WAIT_MS=60000
GROUP_SIZES=16,1000,4096,40976
GROUP_PROGRESS=250

# calls_of NAME RANK: the rank's last PROGRESS count (0 before any).
calls_of() { local l; l=$(grep '^PROGRESS' "$1.r$2.log" | tail -n1); l=${l##*calls=}; echo "${l:-0}"; }
_past() { [ "$(calls_of restart 0)" -ge "$1" ] || [ -n "$(grep '^RESULT' restart.r0.log)" ]; }
_logged() { [ "$(grep -c "$2" "$1")" -ge "${3:-1}" ]; }

# restart_both: run by run_group once every rank made progress.
restart_both() {
  local before
  stamp "SIGTERM to daemon a, then a start"
  stop_daemon a TERM
  start_daemon a A || return
  wait_until 120 _logged a.log 're-adopted after a daemon restart' || note "daemon a logged no re-adoption in 120 s"
  tpfabricctl status --json --socket "$(sock_of a)" 2>/dev/null | tr -d ' \n' >restart.a.json
  before=$(calls_of restart 0)
  wait_until 300 _past $((before + 500)) || note "no 500 calls after daemon a's restart in 300 s"
  stamp "SIGKILL to daemon b, then a start"
  stop_daemon b KILL
  start_daemon b B || return
  wait_until 120 _logged b.log 're-adopted after a daemon restart' || note "daemon b logged no re-adoption in 120 s"
  tpfabricctl status --json --socket "$(sock_of b)" 2>/dev/null | tr -d ' \n' >restart.b.json
}

start_daemon a A && start_daemon b B || tap_done
t0=$(date +%s)
DURING=restart_both run_group restart "A B A B" --iters 10000 --mode mixed
t=$(($(date +%s) - t0))
rs="$(result_of restart 0) $(result_of restart 1) $(result_of restart 2) $(result_of restart 3)"
calls=""
for r in 0 1 2 3; do calls+="$(grep '^RESULT' "restart.r$r.log" | tail -n1 | grep -o 'calls=[0-9]*' | cut -d= -f2) "; done
if [ "$rs" = "ok ok ok ok" ] && [ "$calls" = "10000 10000 10000 10000 " ]; then
  tap_ok "W = 4 over verbs, daemon a restarted (SIGTERM) then daemon b (SIGKILL) mid-run: every rank's 10,000 calls correct, no reopen (${t} s)"
else
  tap_fail "W = 4 over verbs through both daemons' restarts: every rank's 10,000 calls correct" "ranks: $rs; calls: $calls"
  show_group restart
fi
for d in a b; do
  n=$(grep -c 're-adopted after a daemon restart' $d.log)
  st=$(cat restart.$d.json 2>/dev/null)
  if [ "$n" = 1 ] && grep -q '"adoption":{' <<<"$st" && grep -q '"gap_ms":' <<<"$st"; then
    tap_ok "daemon $d: one re-adoption line, and its status shows the group re-adopted ($(grep -o '"gap_ms":[0-9.]*' <<<"$st" | head -n1))"
  else
    tap_fail "daemon $d: one re-adoption line and the group re-adopted in its status" "lines: $n; status: ${st:0:300}"
    diag_file $d.log 20
  fi
done
if grep -q 'rejoined after' b.log && grep -q 'rejoined after' a.log; then
  tap_ok "the daemon that kept the group logs the other node's rejoin (b for a, a for b)"
else
  tap_fail "the daemon that kept the group logs the other node's rejoin"; diag_file a.log 12; diag_file b.log 12
fi
stop_daemons
tap_done
