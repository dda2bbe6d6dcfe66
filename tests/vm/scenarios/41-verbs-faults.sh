#!/bin/bash
# VM scenario 41-verbs-faults: what breaks a group spanning nodes ends it with
# a named error on every rank instead of a hang. Peer daemon killed mid-run
# and not started again: PeerLost on the other node once
# peer.restart_wait_ms (3 s here) passed, DaemonLost on its own (their
# calls' timeout, waiting for a restarted daemon). A rank of node B dies:
# PeerLost on both nodes; a rank of node B aborts: Aborted on both nodes.
# Rail 1 cut mid-run: an
# error (Timeout or PeerLost) within the timeout. Daemons with different
# cluster keys: the group is refused (AuthFailed), both daemons log it. A
# group refused by one daemon before negotiation (daemon.max_region_bytes):
# refused on both nodes at once, not at the open timeout. Two
# HCAs of node A in one subnet: both nodes refuse with NonOneToOnePairing and
# every rank is told.
# vm-timeout: 1200
# shellcheck source=../guest-lib.sh
. "$TPF_GUEST_LIB"
# shellcheck source=../verbs-lib.sh
. /opt/tpf/verbs-lib.sh
cut=$(rail_netdev B 1)
trap 'link_up "$cut" 2>/dev/null; $IP addr del 10.77.0.3/24 dev "$(rail_netdev A 1)" 2>/dev/null' EXIT

# -- peer daemon killed --------------------------------------------------------
start_daemon a A && start_daemon b B || tap_done
DURING='stop_daemon b KILL' run_group kill "A B A B" --iters 100000000 --mode mixed
t=$(($(date +%s) - ${DURING_AT:-0}))
r0=$(result_of kill 0) r1=$(result_of kill 1) r2=$(result_of kill 2) r3=$(result_of kill 3)
el0=$(grep '^RESULT' kill.r0.log | grep -o 'elapsed_ms=[0-9]*' | cut -d= -f2)
if [ "$r0" = PeerLost ] && [ "$r2" = PeerLost ]; then tap_ok "peer daemon killed: node A's ranks end with PeerLost (rank 0's failing call ${el0:-?} ms; peer.restart_wait_ms 3000; all ranks out ${t} s after the kill)"
else tap_fail "peer daemon killed: node A's ranks end with PeerLost" "ranks 0, 2: $r0, $r2"; show_group kill; fi
if [ "$r1" = DaemonLost ] && [ "$r3" = DaemonLost ]; then tap_ok "peer daemon killed: its own ranks end with DaemonLost"
else tap_fail "peer daemon killed: its own ranks end with DaemonLost" "ranks 1, 3: $r1, $r3"; show_group kill; fi
grep -q 'PeerLost' a.log && tap_ok "peer daemon killed: daemon A logs the lost peer" ||
  { tap_fail "peer daemon killed: daemon A logs the lost peer"; diag_file a.log 10; }
stop_daemons

# -- a rank on node B dies, a rank on node B aborts --------------------------------
start_daemon a A && start_daemon b B || tap_done
EXTRA_3="--exit-at 300" run_group exitrank "A B A B" --iters 2000 --mode mixed
r0=$(result_of exitrank 0) r1=$(result_of exitrank 1) r2=$(result_of exitrank 2)
if [ "$r0" = PeerLost ] && [ "$r1" = PeerLost ] && [ "$r2" = PeerLost ]; then
  tap_ok "rank 3 (node B) dies mid-run: ranks 0-2 on both nodes end with PeerLost"
else tap_fail "rank 3 (node B) dies mid-run: ranks 0-2 on both nodes end with PeerLost" "ranks 0-2: $r0 $r1 $r2"; show_group exitrank; fi
EXTRA_1="--abort-at 300" run_group abortrank "A B A B" --iters 2000 --mode mixed
rs="$(result_of abortrank 0) $(result_of abortrank 1) $(result_of abortrank 2) $(result_of abortrank 3)"
if [ "$rs" = "Aborted Aborted Aborted Aborted" ]; then tap_ok "rank 1 (node B) aborts: every rank on both nodes ends with Aborted"
else tap_fail "rank 1 (node B) aborts: every rank on both nodes ends with Aborted" "ranks: $rs"; show_group abortrank; fi
stop_daemons

# -- link cut ------------------------------------------------------------------
start_daemon a A && start_daemon b B || tap_done
GROUP_TIMEOUT_MS=10000 DURING="link_down $cut" run_group cut "A B" --iters 100000000 --mode gather
t=$(($(date +%s) - ${DURING_AT:-0}))
link_up "$cut"
wait_port_active "$(rail_dev B 1)" 60
r0=$(result_of cut 0) r1=$(result_of cut 1)
case "$r0/$r1" in
  Timeout/* | PeerLost/*) case $r1 in Timeout | PeerLost) ok=1 ;; *) ok=0 ;; esac ;;
  *) ok=0 ;;
esac
if [ -n "${DURING_AT:-}" ] && [ $ok = 1 ] && [ "$t" -le 120 ]; then tap_ok "rail 1 cut mid-run: both ranks end with an error ($r0, $r1) ${t} s after the cut"
else tap_fail "rail 1 cut mid-run: both ranks end with Timeout or PeerLost within 120 s" "ranks: $r0, $r1 after ${t} s"; show_group cut; fi
stop_daemons

# -- wrong cluster key -----------------------------------------------------------
head -c 32 /dev/urandom >key.a; head -c 32 /dev/urandom >key.b; chmod 600 key.a key.b
: >a.log; : >b.log
KEY_FILE=$PWD/key.a start_daemon a A && KEY_FILE=$PWD/key.b start_daemon b B || tap_done
run_group key "A B" --iters 10
r0=$(result_of key 0) r1=$(result_of key 1)
if [ "$r0" != ok ] && [ "$r1" != ok ] && [ "$r0" != none ] && [ "$r1" != none ]; then
  tap_ok "wrong cluster key: the group is refused on both nodes ($r0, $r1)"
else tap_fail "wrong cluster key: the group is refused on both nodes" "ranks: $r0, $r1"; show_group key; fi
if grep -q AuthFailed a.log && grep -q AuthFailed b.log; then tap_ok "wrong cluster key: both daemons log AuthFailed"
else tap_fail "wrong cluster key: both daemons log AuthFailed"; diag_file a.log 8; diag_file b.log 8; fi
stop_daemons
# the same key on both: accepted
KEY_FILE=$PWD/key.a start_daemon a A && KEY_FILE=$PWD/key.a start_daemon b B || tap_done
if run_group samekey "A B" --iters 200 --mode mixed; then tap_ok "same cluster key on both: the group opens and runs"
else tap_fail "same cluster key on both: the group opens and runs"; show_group samekey; fi
stop_daemons

# -- a group refused on one node before negotiation --------------------------------
# The ranks' 1 MiB cap needs more region memory than that daemon's
# max_region_bytes (1 MiB) allows: it refuses its rank at once and tells the
# other daemon (on a link opened for that, or on the link that came for the
# group), whose rank is refused at once too, not at its open timeout (client
# 30 s, daemon 60 s). Each daemon refuses once, so that the refuser is the
# connecting side of the node pair once and the accepting once. (Different
# daemon.max_bytes are no reason to refuse: 42-verbs-cap.)
for refuser in b a; do
  : >a.log; : >b.log
  if [ $refuser = b ]; then MAX_BYTES=1048576 start_daemon a A && MAX_BYTES=1048576 MAX_REGION_BYTES=1048576 start_daemon b B || tap_done
  else MAX_BYTES=1048576 MAX_REGION_BYTES=1048576 start_daemon a A && MAX_BYTES=1048576 start_daemon b B || tap_done; fi
  t0=$(date +%s)
  GROUP_CAP=1048576 run_group "refused$refuser" "A B" --iters 10
  t=$(($(date +%s) - t0))
  r0=$(result_of "refused$refuser" 0) r1=$(result_of "refused$refuser" 1)
  what="daemon $refuser refuses a group (max_region_bytes): both ranks are refused within 20 s"
  case "$r0/$r1" in
    ok/* | */ok | none/* | */none | Timeout/* | */Timeout) ok=0 ;;
    *) ok=1 ;;
  esac
  if [ $ok = 1 ] && [ "$t" -lt 20 ]; then tap_ok "$what ($r0, $r1 after ${t} s)"
  else tap_fail "$what" "ranks: $r0, $r1 after ${t} s"; show_group "refused$refuser"; fi
  stop_daemons
done

# -- pairing refusal -----------------------------------------------------------------
# Node A's rail-1 device also gets an address in rail 0's subnet; daemon A owns
# rxe0 (10.77.0.1) and rxe2 by that address: two HCAs in 10.77.0.0/24.
$IP addr add 10.77.0.3/24 dev "$(rail_netdev A 1)"
gid_index "$(rail_dev A 1)" 10.77.0.3 30 >/dev/null || note "no GID for 10.77.0.3 on $(rail_dev A 1)"
: >a.log; : >b.log
HCAS='["10.77.0.1", "10.77.0.3"]' start_daemon a A && start_daemon b B || tap_done
run_group pair "A B" --iters 10
r0=$(result_of pair 0) r1=$(result_of pair 1)
if [ "$r0" != ok ] && [ "$r1" != ok ] && [ "$r0" != none ] && [ "$r1" != none ]; then
  tap_ok "two HCAs in one subnet: every rank is refused ($r0, $r1)"
else tap_fail "two HCAs in one subnet: every rank is refused" "ranks: $r0, $r1"; show_group pair; fi
if grep -q NonOneToOnePairing a.log && grep -q NonOneToOnePairing b.log; then
  tap_ok "two HCAs in one subnet: both daemons report NonOneToOnePairing"
else tap_fail "two HCAs in one subnet: both daemons report NonOneToOnePairing"; diag_file a.log 8; diag_file b.log 8; fi
grep -h '^RESULT' pair.r*.log | grep -q 'NonOneToOnePairing\|HCA' && tap_ok "two HCAs in one subnet: the ranks are told the reason" ||
  { tap_fail "two HCAs in one subnet: the ranks are told the reason"; show_group pair; }
stop_daemons
$IP addr del 10.77.0.3/24 dev "$(rail_netdev A 1)"
tap_done
