# tests/common/group-lib.sh: groups of tpf-testrank ranks across two daemons
# ("nodes" a and b), for the VM's verbs scenarios (through
# tests/vm/verbs-lib.sh) and the host's tcp suite (tests/tcp/run.sh).
# Sourced after tap-lib.sh, with tpf-testrank and tpfabricctl on PATH.
# The caller defines start_daemon (its config; it sets DPID_<name>) and may
# set, before calling or per call:
#   GROUP_CAP          max bytes per rank: the ranks' --max-bytes
#   GROUP_SIZES        tpf-testrank --sizes
#   GROUP_TIMEOUT_MS   every call's timeout
#   GROUP_PROGRESS     ranks print PROGRESS every this many calls (200)
#   GROUP_STATUS_MATCH run_group keeps the last status of daemon a whose
#                      compact JSON matches this grep pattern
#   TPF_SOCK_DIR       where the daemons' sockets are (default /run)
# and may define group_poll NAME: run_group calls it once a second while
# group NAME runs (verbs-lib.sh: the daemons' registered MRs).
# shellcheck disable=SC2034  # GROUP_*, DURING_AT are for the scenarios

GROUP_CAP=${GROUP_CAP:-65536}
GROUP_SIZES=${GROUP_SIZES:-0,16,24,1000,4096,4104,8192,12312,32768,40976,65536}
GROUP_TIMEOUT_MS=${GROUP_TIMEOUT_MS:-30000}
GROUP_PROGRESS=${GROUP_PROGRESS:-200}
GROUP_STATUS_MATCH=${GROUP_STATUS_MATCH:-'"state":"ready"'}
_bport=${_bport:-19000}

sock_of() { echo "${TPF_SOCK_DIR:-/run}/tpf-$1.sock"; }
# stamp TEXT: a timestamped line on stderr (where the time goes)
stamp() { note "[$(date +%T)] $*"; }

# next_port: sets PORT to the first TCP port from $_bport up that nothing
# listens on, and moves $_bport past it (each group its own bootstrap port).
next_port() {
  while _tcp_listening "$_bport"; do _bport=$((_bport + 1)); done
  PORT=$_bport; _bport=$((_bport + 1))
}

# stop_daemon NAME [SIGNAL]
stop_daemon() {
  local pid; pid=$(eval echo "\${DPID_$1:-}")
  [ -n "$pid" ] || return 0
  kill "-${2:-TERM}" "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  eval "DPID_$1="
}
stop_daemons() { stop_daemon a; stop_daemon b; }

# run_group NAME "A B ..." [tpf-testrank args...]: rank i on the daemon of the
# i-th node (a or b), all bootstrapped over loopback TCP; waits for every
# rank. EXTRA_<rank> adds arguments for that rank only. With DURING set, once
# every rank printed a PROGRESS line, DURING is eval'ed (a fault to inject
# mid-run; DURING_AT is then its time, in seconds). While they run, the last
# status of daemon a that matches GROUP_STATUS_MATCH is kept, compacted, in
# NAME.status.json. Sets GROUP_PIDS (while they run) and GROUP_RCS (exit
# codes in rank order). Status 0 iff every rank exited 0.
run_group() {
  local name=$1 layout=$2; shift 2
  local w r=0 n pids=() port ok=0 pid
  next_port; port=$PORT
  w=$(wc -w <<<"$layout")
  rm -f "$name".r*.log "$name.status.json"
  stamp "group $name ($layout) starts"
  for n in $layout; do
    tpf-testrank --socket "$(sock_of "${n,,}")" --bootstrap "127.0.0.1:$port" --rank "$r" --world "$w" \
      --max-bytes "$GROUP_CAP" --sizes "$GROUP_SIZES" --timeout-ms "$GROUP_TIMEOUT_MS" --progress "$GROUP_PROGRESS" "$@" \
      $(eval echo "\${EXTRA_$r:-}") >"$name.r$r.log" 2>&1 &
    pids+=($!); r=$((r + 1))
  done
  GROUP_PIDS="${pids[*]}"
  ( while kill -0 "${pids[0]}" 2>/dev/null; do
      # compacted (tpfabricctl pretty-prints): one line, no blanks, for grep
      tpfabricctl status --json --socket "$(sock_of a)" 2>/dev/null | tr -d ' \n' >"$name.status.tmp" &&
        grep -q "$GROUP_STATUS_MATCH" "$name.status.tmp" && mv "$name.status.tmp" "$name.status.json"
      declare -F group_poll >/dev/null && group_poll "$name"
      sleep 1
    done ) &
  local poller=$!
  DURING_AT=
  if [ -n "${DURING:-}" ]; then
    # every rank printed PROGRESS (or one already ended: then no fault is injected)
    _all_progress() {
      local f p
      for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || return 0; done
      for f in "$name".r*.log; do grep -q '^PROGRESS' "$f" || return 1; done
    }
    wait_until 600 _all_progress
    if [ -z "$(for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || echo gone; done)" ]; then
      stamp "$name: injecting: $DURING"; eval "$DURING"; DURING_AT=$(date +%s)
    else note "run_group $name: a rank ended before every rank made progress; DURING not run"; fi
  fi
  GROUP_RCS=""
  for pid in "${pids[@]}"; do
    wait "$pid"; r=$?
    GROUP_RCS+="$r "
    [ "$r" = 0 ] || ok=1
  done
  GROUP_PIDS=""
  wait "$poller" 2>/dev/null
  stamp "group $name ended: exit codes $GROUP_RCS"
  return $ok
}

# show_group NAME: every rank's last lines and both daemons' last lines as TAP diagnostics.
show_group() {
  local f
  for f in "$1".r*.log; do diag "$f:"; diag_file "$f" 5; done
  diag "daemon a:"; diag_file a.log 15
  diag "daemon b:"; diag_file b.log 15
}

# result_of NAME RANK: the error name in that rank's RESULT line ("ok" when it succeeded).
result_of() {
  local l; l=$(grep '^RESULT' "$1.r$2.log" | tail -n1)
  case $l in *" ok "* | *" ok") echo ok ;; *error=*) l=${l#*error=}; echo "${l%% *}" ;; *) echo "none" ;; esac
}

# json_ints FILE KEY: every integer value of "KEY": in a compact JSON file, one per line.
json_ints() { grep -o "\"$2\":[0-9]*" "$1" | sed 's/.*://'; }
