# The GPU chaos run, sourced by tests/gpu/run.sh inside its MPS
# suite: for TPF_GPU_CHAOS_SECONDS (default 60) seconds, rounds of one Device
# group each (W = 2..4 rank processes on the one GPU under MPS, route ipc or
# proxy, chosen at random) running checked calls back to back
# (tpf-gpurank --scenario chaos), and one event per round once every rank
# printed READY:
#   none        nothing happens: every rank ends its 20,000 calls with outcome=none
#   kill        SIGKILL one rank: every other rank ends PeerLost
#   stall       SIGSTOP one rank for the timeout + 2 s: every other rank ends
#               Timeout or PeerLost (naming a rank)
#   abort       SIGUSR1 makes one rank call Group::abort: every rank ends Aborted
#   daemonkill  SIGKILL tpfabricd (restarted for the next round): proxy-route
#               ranks end DaemonLost; ipc ranks need no daemon for their calls
#               and may finish (outcome=none) or end DaemonLost
# Invariants checked after every round, each a named failure line:
#   - every rank checked its own bytes (right on success, nothing written by a
#     failed call) and its error is a named one (the rank's RESULT line);
#   - every failed call ended within its timeout + 1 s (the rank's clock),
#     and every surviving rank process exited within the timeout + 3 s of the
#     event (ours, in milliseconds: the exit adds the group's close and CUDA's
#     teardown to the failed call);
#   - the daemon's open groups, regions, clients and file descriptors back to
#     where they were before the round, within 5 s (after a daemonkill, the
#     restarted daemon's: no group, region or client);
#   - the next round's group opens (the last round is followed by a W = 2
#     `data` group on each route).
# The seed is printed; TPF_GPU_CHAOS_SEED=N replays the same rounds.
# Uses run.sh's $bin, $logdir, start_daemon and judge.

# chaos_ready SOCKET: wait (5 s at most) until the daemon answers status (a
# restarted daemon's socket file exists before it listens: the stale one).
chaos_ready() {
  local _
  for _ in $(seq 50); do "$bin/tpfabricctl" status --json --socket "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}

# chaos_status_clean SOCKET DAEMON_PID BASE_FDS: "ok" once the daemon lists no
# group, no region and no client but the asking tpfabricctl, and holds
# BASE_FDS descriptors (within 5 s), else what is left.
chaos_status_clean() {
  local s=$1 pid=$2 base=$3 left="" _
  for _ in $(seq 50); do
    left=$("$bin/tpfabricctl" status --json --socket "$s" 2>&1 | python3 -c '
import json, sys
try:
    d = json.load(sys.stdin)
except Exception as e:
    print("status unreadable: %s" % e); sys.exit()
g = [x.get("state") for x in d.get("groups", [])]
r = d.get("regions", {}).get("count", 0)
c = d.get("clients", 0)
print("ok" if not g and not r and c <= 1 else "groups %s regions %s clients %s" % (g, r, c))')
    local fds
    fds=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l)
    [ "$left" = ok ] && [ "$fds" -le "$base" ] && { echo ok; return 0; }
    [ "$left" = ok ] && left="fds $fds (was $base)"
    sleep 0.1
  done
  echo "$left"
  return 1
}

tpf_gpu_chaos() {
  local secs=${TPF_GPU_CHAOS_SECONDS:-60} seed=${TPF_GPU_CHAOS_SEED:-$((($(date +%s) * 7919) % 100000))}
  local cdir csock cpid tmo=2000 round=0 bad=0 events=(none kill stall abort daemonkill)
  echo "== GPU chaos: ${secs} s of rounds, seed $seed (TPF_GPU_CHAOS_SEED=$seed replays them)"
  if [ ! -x "$bin/tpfabricctl" ]; then
    judge 77; echo "SKIP gpu-chaos: no $bin/tpfabricctl (carry build-gpu/ctl/tpfabricctl)"; return
  fi
  RANDOM=$seed
  cdir=$(mktemp -d)
  csock=$cdir/chaos.sock
  start_daemon "$csock" "$logdir/tpfabricd-chaos.log" || { judge 1; echo "FAIL gpu-chaos: the daemon did not start"; return; }
  cpid=$started
  chaos_ready "$csock"
  local end=$((SECONDS + secs))
  while [ $SECONDS -lt $end ]; do
    round=$((round + 1))
    local w=$((2 + RANDOM % 3)) route=proxy ev victim port pids=() r why="" t_ev
    [ $((RANDOM % 2)) = 0 ] && route=ipc # (no $RANDOM in a subshell: the seed must replay)
    ev=${events[RANDOM % ${#events[@]}]}
    victim=$((RANDOM % w))
    port=$(freeport); : $((RANDOM)) # (the draw keeps an older seed's rounds as they were)
    local base_fds
    base_fds=$(ls "/proc/$cpid/fd" | wc -l)
    local log=$logdir/chaos-r$round
    rm -f "$log".*.log # a log of an earlier run's round would count its READY
    # The ranks themselves, not under timeout(1): the signals below must reach
    # them (timeout would die of SIGUSR1 or SIGKILL and leave its child running).
    for ((r = 0; r < w; r++)); do
      "$bin/tpf-gpurank" --socket "$csock" --bootstrap 127.0.0.1:$port --rank $r --world $w --route $route \
        --scenario chaos --timeout-ms $tmo --calls 20000 >"$log.$r.log" 2>&1 &
      pids+=($!)
    done
    (sleep 60; kill -9 "${pids[@]}" 2>/dev/null) & # a watchdog: no round outlives a minute
    local watchdog=$!
    local ready=0
    for _ in $(seq 300); do
      ready=0
      for ((r = 0; r < w; r++)); do grep -q READY "$log.$r.log" 2>/dev/null && ready=$((ready + 1)); done
      [ $ready = "$w" ] && break
      sleep 0.1
    done
    if [ $ready != "$w" ]; then
      why="not every rank became READY within 30 s (the group did not open?)"
    fi
    sleep "0.$((RANDOM % 5))"
    t_ev=$(date +%s%3N)
    case $ev in
    kill) kill -9 "${pids[$victim]}" ;;
    stall) kill -STOP "${pids[$victim]}"; sleep $((tmo / 1000 + 2)); kill -CONT "${pids[$victim]}" ;;
    abort) kill -USR1 "${pids[$victim]}" ;;
    daemonkill) kill -9 "$cpid"; wait "$cpid" 2>/dev/null ;;
    esac
    local rcs=() ends=()
    for ((r = 0; r < w; r++)); do
      wait "${pids[$r]}"; rcs+=($?); ends+=($(date +%s%3N))
    done
    kill "$watchdog" 2>/dev/null; wait "$watchdog" 2>/dev/null
    # Judge each rank: its own checks (exit 0), then its outcome against the event and the clock.
    for ((r = 0; r < w; r++)); do
      local line out ms
      [ "$ev" = kill ] && [ $r = "$victim" ] && continue
      line=$(grep -h '^RESULT' "$log.$r.log" | tail -1)
      out=$(sed -n 's/.* outcome=\([A-Za-z]*\).*/\1/p' <<<"$line")
      ms=$(sed -n 's/.* ms=\([0-9.]*\).*/\1/p' <<<"$line")
      [ "${rcs[$r]}" = 0 ] || { why="${why:+$why; }rank $r: exit ${rcs[$r]}: ${line:-no RESULT}"; continue; }
      if [ -n "$ms" ] && [ ! "$ev" = stall -o $r != "$victim" ] && ! awk -v m="$ms" -v t=$tmo 'BEGIN {exit !(m <= t + 1000)}'; then
        why="${why:+$why; }rank $r: the failed call took $ms ms (timeout $tmo)"
      fi
      # (A stall's survivors are waited for only after the victim is continued, timeout + 2 s on.)
      local late=$((ends[r] - t_ev))
      if [ "$ev" != none ] && [ ! "$ev" = stall -o $r != "$victim" ] && [ $late -gt $((tmo + 3000)) ] &&
        ! { [ "$ev" = daemonkill ] && [ "$out" = none ]; }; then
        why="${why:+$why; }rank $r: exited $late ms after the event"
      fi
      local want
      case $ev in
      none) want="none" ;;
      kill) want="PeerLost" ;;
      stall) [ $r = "$victim" ] && want="any" || want="Timeout PeerLost" ;;
      abort) want="Aborted" ;;
      daemonkill) [ $route = proxy ] && want="DaemonLost" || want="none DaemonLost" ;;
      esac
      [ "$want" = any ] || grep -qw -- "$out" <<<"$want" || why="${why:+$why; }rank $r: outcome ${out:-?}, wanted $want: $line"
    done
    if [ "$ev" = daemonkill ]; then
      start_daemon "$csock" "$logdir/tpfabricd-chaos-r$round.log" || { why="${why:+$why; }the daemon did not restart"; }
      cpid=$started
      chaos_ready "$csock" || why="${why:+$why; }the restarted daemon does not answer status"
      local fresh
      fresh=$(chaos_status_clean "$csock" "$cpid" 1000000) || why="${why:+$why; }the restarted daemon holds $fresh"
      sleep 0.5 # its descriptors settle before the next round's baseline
    else
      local clean
      clean=$(chaos_status_clean "$csock" "$cpid" "$base_fds") || why="${why:+$why; }after the round the daemon holds $clean"
    fi
    if [ -z "$why" ]; then
      echo "    ok   round $round: W=$w route=$route event=$ev victim=$victim"
    else
      bad=$((bad + 1))
      echo "    FAIL round $round: W=$w route=$route event=$ev victim=$victim: $why (logs $log.*.log; seed $seed)"
      [ $bad -ge 3 ] && break
    fi
  done
  # A new group still opens and is right after all of it, on each route.
  local port pids=() r after route
  for route in ipc proxy; do
    port=$(freeport) pids=() after=0
    for ((r = 0; r < 2; r++)); do
      timeout 60 "$bin/tpf-gpurank" --socket "$csock" --bootstrap 127.0.0.1:$port --rank $r --world 2 --route $route \
        --scenario data >"$logdir/chaos-after-$route.$r.log" 2>&1 &
      pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r" || after=1; done
    [ $after = 0 ] || { bad=$((bad + 1)); echo "    FAIL after the rounds: a W=2 $route data group: $(grep -h RESULT "$logdir"/chaos-after-$route.*.log | head -2)"; }
  done
  kill "$cpid" 2>/dev/null; wait "$cpid" 2>/dev/null
  rm -rf "$cdir"
  [ $bad = 0 ] && judge 0 || judge 1
  echo "$st gpu-chaos: $round rounds in ${secs} s (seed $seed), $bad failed"
}
