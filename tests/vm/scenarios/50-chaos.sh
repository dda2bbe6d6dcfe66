#!/bin/bash
# vm-timeout: 900
# VM scenario 50-chaos: a seeded chaos run bounded in time. Each round opens a
# W = 2..4 group spread over both nodes' daemons (random layout), lets every
# rank make progress with gathers and sums checked byte/bit-exact, then injects
# one random fault: a rank SIGKILLed, a rank calling abort() (at a random
# call), a daemon SIGKILLed or SIGTERMed (then restarted on the same socket),
# or a rail's link cut (then restored). Checked after every event: every rank
# ended with the error the event calls for (PeerLost, DaemonLost, Aborted;
# PeerLost or Timeout on a cut), within its call timeout + 1 s, both by the
# rank's own clock (elapsed_ms of the failing call) and by ours (event to
# exit); no wrong byte and no byte written by a failed call (tpf-testrank
# exits 3 on either); a SIGTERMed daemon exits 0; both daemons' fds, regions,
# groups, peer links and clients, and the MRs/QPs `rdma resource` lists for
# tpfabricd, back to what they were when the daemons started; and a fresh
# group (another random layout) opens and runs 100 calls byte-exact over both
# rails. One TAP line per round names the seed, the round, the event and what
# every rank got; a failure says how to replay it. A fault-free group (the
# first, or a round's fresh one) must end ok on every rank: the cross-node
# close race it once found (docs/reliability.md) counts as a failure.
# From the host's environment (run.sh passes TPF_CHAOS_* into the guest):
# TPF_CHAOS_SEED (default: random, printed), TPF_CHAOS_SECONDS (default 180:
# how long new rounds start), TPF_CHAOS_ROUNDS (exactly this many rounds).
# shellcheck source=../guest-lib.sh
. "$TPF_GUEST_LIB"
# shellcheck source=../verbs-lib.sh
. /opt/tpf/verbs-lib.sh

SEED=${TPF_CHAOS_SEED:-$(($(date +%s) % 100000 + $$))}
SECONDS_BUDGET=${TPF_CHAOS_SECONDS:-180}
MAX_ROUNDS=${TPF_CHAOS_ROUNDS:-0}
T_MS=10000                 # every call's timeout
BOUND_CS=$((T_MS / 10 + 100))   # timeout + 1 s, in centiseconds
RANDOM=$SEED
EVENTS=(rankkill abort daemonkill daemonstop linkcut)
cuts=""
trap 'for d in $cuts; do link_up "$d" 2>/dev/null; done' EXIT

diag "chaos seed $SEED, rounds for ${SECONDS_BUDGET} s${TPF_CHAOS_ROUNDS:+ (exactly $MAX_ROUNDS rounds)}"
note "chaos: seed $SEED (replay: TPF_CHAOS_SEED=$SEED)"

now_cs() { local u _; read -r u _ </proc/uptime; echo $((10#${u/./})); }   # centiseconds since boot

# snapshot NAME: what daemon NAME holds (fds, groups, regions, peer links,
# clients), for comparing with its baseline.
snapshot() {
  local pid st fds
  pid=$(eval echo "\${DPID_$1:-}")
  fds=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l)
  st=$(tpfabricctl status --json --socket "$(sock_of "$1")" 2>/dev/null | tr -d ' \n')
  [ -n "$st" ] || { echo "no status from daemon $1"; return; }
  local groups peers regions clients
  grep -q '"groups":\[\]' <<<"$st" && groups=0 || groups=some
  grep -q '"peers":\[\]' <<<"$st" && peers=0 || peers=some
  regions=$(grep -o '"regions":{"count":[0-9]*' <<<"$st" | grep -o '[0-9]*$')
  clients=$(grep -o '"clients":[0-9]*' <<<"$st" | grep -o '[0-9]*$')
  echo "fds=$fds groups=$groups peers=$peers regions=$regions clients=$clients"
}
rdma_snapshot() { echo "mrs=$(tpf_rdma_resources mr) qps=$(tpf_rdma_resources qp)"; }
declare -A BASE
_at_baseline() {
  [ "$(snapshot a)" = "${BASE[a]}" ] && [ "$(snapshot b)" = "${BASE[b]}" ] && [ "$(rdma_snapshot)" = "mrs=0 qps=0" ]
}
# take_baseline NAME: the daemon's snapshot once it serves (nothing open yet).
take_baseline() { BASE[$1]=$(snapshot "$1"); }

# halt_daemon NAME SIGNAL: signals the daemon and waits (20 s at most, then
# SIGKILL) for it to end; status 1, and why in HALT_WHY, if it hung or a
# SIGTERM did not end in exit status 0.
halt_daemon() {
  local pid rc; pid=$(eval echo "\${DPID_$1:-}") HALT_WHY=
  [ -n "$pid" ] || return 0
  kill "-$2" "$pid" 2>/dev/null
  if ! wait_until 20 _gone "$pid"; then
    HALT_WHY="daemon $1 still ran 20 s after SIG$2: killed"; kill -9 "$pid" 2>/dev/null
  fi
  wait "$pid" 2>/dev/null; rc=$?
  [ "$2" = TERM ] && [ -z "$HALT_WHY" ] && [ "$rc" != 0 ] && HALT_WHY="daemon $1 exited $rc on SIGTERM, not 0"
  eval "DPID_$1="
  [ -z "$HALT_WHY" ]
}

# start_ranks NAME "A B ..." ARGS...: rank i on the daemon of the i-th node;
# each rank's pid in NAME.rI.pid, its log in NAME.rI.log and, once it ended,
# "STATUS CENTISECONDS" in NAME.rI.exit. EXTRA_<i> adds arguments to rank i.
start_ranks() {
  local name=$1 layout=$2 n r=0 w port=$((_bport++)); shift 2
  w=$(wc -w <<<"$layout")
  rm -f "$name".r*.log "$name".r*.pid "$name".r*.exit
  for n in $layout; do
    local f=$name.r$r extra
    extra=$(eval echo "\${EXTRA_$r:-}")
    ( (echo "$BASHPID" >"$f.pid"
       exec tpf-testrank --socket "$(sock_of "${n,,}")" --bootstrap "127.0.0.1:$port" --rank "$r" --world "$w" \
         --max-bytes "$GROUP_CAP" --sizes "$GROUP_SIZES" --timeout-ms "$T_MS" --progress 50 "$@" $extra >"$f.log" 2>&1)
      echo "$? $(now_cs)" >"$f.exit" ) &
    r=$((r + 1))
  done
}
_all_exited() { local r; for ((r = 0; r < $2; r++)); do [ -f "$1.r$r.exit" ] || return 1; done; }
_all_progress_or_exit() {
  local r
  for ((r = 0; r < $2; r++)); do
    [ -f "$1.r$r.exit" ] || grep -q '^PROGRESS' "$1.r$r.log" 2>/dev/null || return 1
  done
}
_any_exited() { local r; for ((r = 0; r < $2; r++)); do [ -f "$1.r$r.exit" ] && return 0; done; return 1; }
# kill_ranks NAME W: SIGKILL whatever is left of a group.
kill_ranks() {
  local r p
  for ((r = 0; r < $2; r++)); do
    [ -f "$1.r$r.exit" ] && continue
    p=$(cat "$1.r$r.pid" 2>/dev/null) && kill -9 "$p" 2>/dev/null
  done
  wait_until 20 _all_exited "$1" "$2"
}
exit_status() { cut -d' ' -f1 "$1.r$2.exit" 2>/dev/null; }
exit_cs() { cut -d' ' -f2 "$1.r$2.exit" 2>/dev/null; }
elapsed_ms() { grep '^RESULT' "$1.r$2.log" | tail -n1 | grep -o 'elapsed_ms=[0-9]*' | cut -d= -f2; }

# Every draw happens in this shell, never in a $(...): bash reseeds $RANDOM in
# a subshell, which would make a seed replay something else.
# pick VAR WORD...: VAR = one of the words.
pick() { local -n _v=$1; shift; local a=("$@"); _v=${a[RANDOM % $#]}; }
# random_layout VAR W: VAR = W node letters, both nodes present.
random_layout() {
  local -n _l=$1; local w=$2 i k l=()
  for ((i = 0; i < w; i++)); do pick k A B; l+=("$k"); done
  if [[ " ${l[*]} " != *" A "* || " ${l[*]} " != *" B "* ]]; then
    k=$((RANDOM % w)); [ "${l[k]}" = A ] && l[k]=B || l[k]=A
  fi
  _l="${l[*]}"
}

# judge_clean NAME W: how a group that saw no fault ended. CLEAN=ok (every
# rank ok) or bad; CLEAN_WHY lists every rank that did not end ok (among them
# the signature of the fixed close race of docs/reliability.md: a last call
# ended PeerLost "rank Q is gone" naming a rank of the other node that ended ok).
judge_clean() {
  local name=$1 w=$2 r l
  CLEAN_WHY=()
  for ((r = 0; r < w; r++)); do
    [ "$(exit_status "$name" "$r")" = 0 ] && [ "$(result_of "$name" "$r")" = ok ] && continue
    l=$(grep '^RESULT' "$name.r$r.log" | tail -n1)
    CLEAN_WHY+=("rank $r: exit $(exit_status "$name" "$r"), ${l:-no RESULT line}")
  done
  if [ ${#CLEAN_WHY[@]} = 0 ]; then CLEAN=ok; else CLEAN=bad; fi
}

# The daemons, their baselines.
start_daemon a A && start_daemon b B || tap_done
take_baseline a; take_baseline b
diag "baselines: a: ${BASE[a]}; b: ${BASE[b]}; $(rdma_snapshot)"
# A first group: the baseline holds after a group that ran clean, too.
EXTRA_0= EXTRA_1= EXTRA_2= EXTRA_3=
start_ranks warm "A B" --iters 200 --mode mixed
wait_until 180 _all_exited warm 2 || kill_ranks warm 2
judge_clean warm 2
if [ "$CLEAN" = ok ] && wait_until 30 _at_baseline; then
  tap_ok "seed $SEED: a W=2 group runs clean and both daemons are back to their baselines (a: ${BASE[a]}; b: ${BASE[b]})"
else
  tap_fail "seed $SEED: a W=2 group runs clean and both daemons are back to their baselines" \
    "exit codes $(exit_status warm 0) $(exit_status warm 1)${CLEAN_WHY:+ (${CLEAN_WHY[*]})}; a: $(snapshot a) (baseline ${BASE[a]}); b: $(snapshot b) (baseline ${BASE[b]}); $(rdma_snapshot)"
  kill_ranks warm 2; show_group warm
fi

declare -A COUNT
t_start=$(date +%s)
round=0 failed_rounds=0
while :; do
  if [ "$MAX_ROUNDS" -gt 0 ]; then [ "$round" -lt "$MAX_ROUNDS" ] || break
  else [ $(($(date +%s) - t_start)) -lt "$SECONDS_BUDGET" ] || break; fi
  round=$((round + 1))
  # Every random choice of the round, drawn up front: a seed replays them.
  w=$((2 + RANDOM % 3)); random_layout layout "$w"; read -ra nodes <<<"$layout"
  pick event "${EVENTS[@]}"
  victim=$((RANDOM % w)); pick vdaemon a b
  rail=$((RANDOM % 2)); pick cutnode A B
  abort_at=$((100 + RANDOM % 400)); delay=0.$((RANDOM % 10))
  fw=$((2 + RANDOM % 3)); random_layout flayout "$fw"
  pick mode gather mixed mixed
  COUNT[$event]=$((${COUNT[$event]:-0} + 1))
  name=c$round
  case $event in
    rankkill) what="rank $victim (node ${nodes[victim]}) SIGKILLed" ;;
    abort) what="rank $victim (node ${nodes[victim]}) aborts at call $abort_at" ;;
    daemonkill) what="daemon $vdaemon SIGKILLed and restarted" ;;
    daemonstop) what="daemon $vdaemon SIGTERMed and restarted" ;;
    linkcut) what="rail $rail cut at node $cutnode's $(rail_netdev "$cutnode" "$rail"), then restored" ;;
  esac
  title="seed $SEED round $round: W=$w ($layout) $mode, $what"
  stamp "chaos: $title"
  bad=()

  EXTRA_0= EXTRA_1= EXTRA_2= EXTRA_3=
  [ "$event" = abort ] && eval "EXTRA_$victim='--abort-at $abort_at'"
  start_ranks "$name" "$layout" --iters 100000000 --mode "$mode"
  wait_until 180 _all_progress_or_exit "$name" "$w" || bad+=("not every rank made progress within 180 s")
  if [ "$event" != abort ] && _any_exited "$name" "$w"; then
    bad+=("a rank ended before the event: $(for ((r = 0; r < w; r++)); do echo -n "r$r $(result_of "$name" $r) (exit $(exit_status "$name" $r)) "; done)")
  fi
  sleep "$delay"
  stamp "chaos: every rank made progress; the event"

  # The event.
  t_event=$(now_cs)
  expect=()   # per rank: the error names it may end with ("-" for the victim: anything)
  for ((r = 0; r < w; r++)); do expect[r]=PeerLost; done
  case $event in
    rankkill) kill -9 "$(cat "$name.r$victim.pid")"; expect[victim]=- ;;
    abort) for ((r = 0; r < w; r++)); do expect[r]=Aborted; done ;;
    daemonkill | daemonstop)
      for ((r = 0; r < w; r++)); do [ "${nodes[r],,}" = "$vdaemon" ] && expect[r]=DaemonLost; done
      halt_daemon "$vdaemon" "$([ "$event" = daemonkill ] && echo KILL || echo TERM)" || bad+=("$HALT_WHY") ;;
    linkcut)
      cut=$(rail_netdev "$cutnode" "$rail"); cuts+=" $cut"
      link_down "$cut"
      for ((r = 0; r < w; r++)); do expect[r]="PeerLost|Timeout"; done ;;
  esac

  # Every rank ends, within the bound.
  wait_until $((T_MS / 1000 + 30)) _all_exited "$name" "$w" || {
    bad+=("a rank still ran $((T_MS / 1000 + 30)) s after the event: killed")
    kill_ranks "$name" "$w"
  }
  stamp "chaos: every rank ended"
  # abort: the event is the aborter's exit (it aborts on its own).
  [ "$event" = abort ] && t_event=$(exit_cs "$name" "$victim")
  got=""
  for ((r = 0; r < w; r++)); do
    st=$(exit_status "$name" "$r") res=$(result_of "$name" "$r") ms=$(elapsed_ms "$name" "$r")
    got+="r$r $res"
    if [ "${expect[r]}" = - ]; then got+=" (killed); "; continue; fi
    late=$(($(exit_cs "$name" "$r") - ${t_event:-0}))
    got+=" ${ms:-?} ms, exit +$((late * 10)) ms; "
    [ "$st" = 3 ] && bad+=("rank $r: wrong data or output written on failure: $(grep '^RESULT' "$name.r$r.log" | tail -n1)")
    case "|${expect[r]}|" in *"|$res|"*) ;; *) bad+=("rank $r ended '$res' (exit $st), expected ${expect[r]}") ;; esac
    [ -n "$ms" ] && [ "$ms" -gt $((T_MS + 1000)) ] && bad+=("rank $r: its failing call took $ms ms (> timeout $T_MS + 1000)")
    [ "$late" -gt "$BOUND_CS" ] && bad+=("rank $r exited $((late * 10)) ms after the event (> timeout $T_MS + 1000 ms)")
  done

  # Undo the event.
  case $event in
    daemonkill | daemonstop)
      start_daemon "$vdaemon" "$([ "$vdaemon" = a ] && echo A || echo B)" || bad+=("daemon $vdaemon did not restart") ;;
    linkcut)
      link_up "$cut"
      for d in $(rail_dev A "$rail") $(rail_dev B "$rail"); do
        wait_port_active "$d" 60 && gid_index "$d" "$(dev_ip "$d")" 60 >/dev/null || bad+=("$d not ACTIVE with its GID after the link came back")
      done ;;
  esac

  # Back to baseline, then a fresh group.
  if ! wait_until 30 _at_baseline; then
    bad+=("not back to baseline 30 s after the group ended: a: $(snapshot a) (baseline ${BASE[a]}); b: $(snapshot b) (baseline ${BASE[b]}); $(rdma_snapshot)")
  fi
  stamp "chaos: at baseline; the fresh group"
  EXTRA_0= EXTRA_1= EXTRA_2= EXTRA_3=
  snap_counters
  start_ranks "f$round" "$flayout" --iters 100 --mode mixed
  wait_until 180 _all_exited "f$round" "$fw" || { bad+=("the fresh group did not end within 180 s"); kill_ranks "f$round" "$fw"; }
  judge_clean "f$round" "$fw"
  for l in "${CLEAN_WHY[@]}"; do bad+=("fresh W=$fw ($flayout) group: $l"); done
  for rl in $RAILS; do
    for d in $(rail_dev A "$rl") $(rail_dev B "$rl"); do
      [ "$(delta "$d" sent_pkts)" -gt 0 ] || bad+=("fresh group: $d (rail $rl) sent nothing")
    done
  done
  wait_until 30 _at_baseline || bad+=("not back to baseline after the fresh group: a: $(snapshot a); b: $(snapshot b); $(rdma_snapshot)")

  if [ ${#bad[@]} = 0 ]; then
    tap_ok "$title: ${got%; }; back to baseline; fresh W=$fw ($flayout) group ok on both rails"
  else
    failed_rounds=$((failed_rounds + 1))
    tap_fail "$title" "${bad[@]}" "ranks: $got" \
      "replay: TPF_CHAOS_SEED=$SEED TPF_CHAOS_ROUNDS=$round tests/vm/run.sh --bin ... --scenario tests/vm/scenarios/50-chaos.sh"
    show_group "$name"
    [ "$CLEAN" = ok ] || show_group "f$round"
    # A clean start for the next round: fresh daemons, fresh baselines.
    halt_daemon a TERM; halt_daemon b TERM
    for d in $cuts; do link_up "$d"; done
    start_daemon a A && start_daemon b B || tap_done
    take_baseline a; take_baseline b
  fi
done
halt_daemon a TERM && halt_daemon b TERM || tap_fail "both daemons stop on SIGTERM with status 0" "$HALT_WHY"
summary=""
for e in "${EVENTS[@]}"; do summary+="$e ${COUNT[$e]:-0}, "; done
if [ "$round" -ge 1 ]; then tap_ok "seed $SEED: $round rounds in $(($(date +%s) - t_start)) s (${summary%, }), $failed_rounds failed"
else tap_fail "seed $SEED: at least one round ran" "TPF_CHAOS_SECONDS=$SECONDS_BUDGET"; fi
tap_done
