# tests/vm/verbs-lib.sh: daemons for the verbs scenarios, sourced inside the
# guest after guest-lib.sh:  . /opt/tpf/verbs-lib.sh
# Node A's daemon listens for peers on its rail-0 IP, node B's on its own;
# both own their node's two rxe devices (one per rail). Groups across them
# (run_group, result_of, show_group, ...) are group-lib.sh's (tests/common/,
# beside this file in the guest).
# shellcheck disable=SC2034

# shellcheck source=../common/group-lib.sh
. "$_tpf_lib/group-lib.sh"

VERBS_ITERS=${VERBS_ITERS:-2000}      # calls per group run (gathers and sums alternate)
GROUP_CAP=65536                        # max bytes per rank (daemon.max_bytes and the ranks' --max-bytes)
VERBS_INFLIGHT=4096                    # verbs.inflight_bytes: small, so the cap binds
VERBS_STRIPE_MAX=32768                 # largest stripe of a 64 KiB shard over 2 rails
GROUP_SIZES=0,16,24,1000,4096,4104,8192,12312,32768,40976,65536
GROUP_TIMEOUT_MS=30000                 # every call's timeout
GROUP_STATUS_MATCH='"qps":\[{'        # run_group keeps daemon a's last status that lists peer QPs

# group_poll NAME (run_group, once a second): the daemons' registered MRs, while there are any, in NAME.mrs.
group_poll() {
  local n; n=$(rdma resource show mr 2>/dev/null | grep -c 'comm tpfabricd')
  [ "$n" -gt 0 ] && echo "$n" >"$1.mrs"
}

# start_daemon NAME NODE: config NAME.toml, log NAME.log, socket /run/tpf-NAME.sock.
# Overrides: HCAS (TOML array), KEY_FILE, LISTEN_IP, MAX_BYTES (daemon.max_bytes),
# MAX_REGION_BYTES (daemon.max_region_bytes; unset: the default),
# RESTART_WAIT_MS (peer.restart_wait_ms; 3000 here, so that a daemon killed
# for good ends its groups on the other node within the calls' timeouts).
start_daemon() {
  local name=$1 nd=$2 devs ip
  node "$nd"
  devs=$(printf '"%s",' $NODE_DEVS); devs="[${devs%,}]"
  ip=${LISTEN_IP:-${NODE_IPS%% *}}
  cat >"$name.toml" <<TOML
[daemon]
socket = "$(sock_of "$name")"
max_bytes = ${MAX_BYTES:-$GROUP_CAP}
${MAX_REGION_BYTES:+max_region_bytes = $MAX_REGION_BYTES}
open_timeout_ms = 60000
[peer]
listen = "$ip"
port = 18515
key_file = "${KEY_FILE:-}"
connect_timeout_ms = 10000
restart_wait_ms = ${RESTART_WAIT_MS:-3000}
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

# tpf_rdma_resources KIND: how many MRs / QPs (`rdma resource show KIND`) tpfabricd processes hold.
tpf_rdma_resources() { rdma resource show "$1" 2>/dev/null | grep -c 'comm tpfabricd'; }
