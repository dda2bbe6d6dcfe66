# tests/vm/verbs-lib.sh: daemons and rank groups for the verbs scenarios,
# sourced inside the guest after guest-lib.sh:  . /opt/tpf/verbs-lib.sh
# Node A's daemon listens for peers on its rail-0 IP, node B's on its own;
# both own their node's two rxe devices (one per rail).
# shellcheck disable=SC2034

VERBS_ITERS=${VERBS_ITERS:-2000}      # calls per group run (gathers and sums alternate)
VERBS_CAP=65536                        # max bytes per rank (daemon.max_bytes and the ranks' --max-bytes)
VERBS_INFLIGHT=4096                    # verbs.inflight_bytes: small, so the cap binds
VERBS_STRIPE_MAX=32768                 # largest stripe of a 64 KiB shard over 2 rails
VERBS_SIZES=0,16,24,1000,4096,4104,8192,12312,32768,40976,65536
VERBS_TIMEOUT_MS=${VERBS_TIMEOUT_MS:-30000}
_bport=19000

sock_of() { echo "/run/tpf-$1.sock"; }
# stamp TEXT: a timestamped line in the console log (where the time goes under TCG)
stamp() { note "[$(date +%T)] $*"; }

# start_daemon NAME NODE: config NAME.toml, log NAME.log, socket /run/tpf-NAME.sock.
# Overrides: HCAS (TOML array), KEY_FILE, LISTEN_IP, MAX_BYTES (daemon.max_bytes),
# MAX_REGION_BYTES (daemon.max_region_bytes; unset: the default).
start_daemon() {
  local name=$1 nd=$2 devs ip
  node "$nd"
  devs=$(printf '"%s",' $NODE_DEVS); devs="[${devs%,}]"
  ip=${LISTEN_IP:-${NODE_IPS%% *}}
  cat >"$name.toml" <<TOML
[daemon]
socket = "$(sock_of "$name")"
max_bytes = ${MAX_BYTES:-$VERBS_CAP}
${MAX_REGION_BYTES:+max_region_bytes = $MAX_REGION_BYTES}
open_timeout_ms = 60000
[peer]
listen = "$ip"
port = 18515
key_file = "${KEY_FILE:-}"
connect_timeout_ms = 10000
[verbs]
hcas = ${HCAS:-$devs}
inflight_bytes = $VERBS_INFLIGHT
TOML
  rm -f "$(sock_of "$name")"
  tpfabricd --config "$name.toml" --foreground >>"$name.log" 2>&1 &
  eval "DPID_$name=$!"
  if ! wait_until 60 test -S "$(sock_of "$name")"; then
    tap_fail "daemon $name (node $nd) starts"; diag_file "$name.log"; return 1
  fi
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
# rank. EXTRA_<rank> adds arguments for that rank only. With DURING set, once every rank printed a PROGRESS line, DURING is
# eval'ed (a fault to inject mid-run). While they run, the last status of daemon a that shows peer QPs is
# kept, compacted, in NAME.status.json, and the daemons' registered MRs
# (rdma resource show mr) in NAME.mrs. Sets GROUP_RCS (exit codes in rank order).
# Status 0 iff every rank exited 0.
run_group() {
  local name=$1 layout=$2; shift 2
  local w r=0 n pids=() port=$((_bport++)) ok=0 pid
  w=$(wc -w <<<"$layout")
  rm -f "$name".r*.log "$name.status.json" "$name.mrs"
  stamp "group $name ($layout) starts"
  for n in $layout; do
    tpf-testrank --socket "$(sock_of "${n,,}")" --bootstrap "127.0.0.1:$port" --rank "$r" --world "$w" \
      --max-bytes "$VERBS_CAP" --sizes "$VERBS_SIZES" --timeout-ms "$VERBS_TIMEOUT_MS" --progress 200 "$@" \
      $(eval echo "\${EXTRA_$r:-}") >"$name.r$r.log" 2>&1 &
    pids+=($!); r=$((r + 1))
  done
  GROUP_PIDS="${pids[*]}"
  ( while kill -0 "${pids[0]}" 2>/dev/null; do
      # compacted (tpfabricctl pretty-prints): one line, no blanks, for grep
      tpfabricctl status --json --socket "$(sock_of a)" 2>/dev/null | tr -d ' \n' >"$name.status.tmp" &&
        grep -q '"qps":\[{' "$name.status.tmp" && mv "$name.status.tmp" "$name.status.json"
      n=$(rdma resource show mr 2>/dev/null | grep -c 'comm tpfabricd')
      [ "$n" -gt 0 ] && echo "$n" >"$name.mrs"
      sleep 1
    done ) &
  local poller=$!
  if [ -n "${DURING:-}" ]; then
    # every rank printed PROGRESS (or one already ended: then no fault is injected)
    _all_progress() {
      local f p
      for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || return 0; done
      for f in "$name".r*.log; do grep -q '^PROGRESS' "$f" || return 1; done
    }
    DURING_AT=
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

# tpf_rdma_resources KIND: how many MRs / QPs (`rdma resource show KIND`) tpfabricd processes hold.
tpf_rdma_resources() { rdma resource show "$1" 2>/dev/null | grep -c 'comm tpfabricd'; }
