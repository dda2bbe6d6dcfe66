# tests/vm/guest-lib.sh: bash helpers for VM scenarios, sourced inside the guest
# as /opt/tpf/guest-lib.sh:  . "$TPF_GUEST_LIB"
# The node/rail topology, GID lookup, counters and RDMA waits; TAP output and
# the plain waits are tap-lib.sh's (tests/common/, beside this file in the guest).
# Topology (README.md): rail r uses 10.(77+r).0.0/24; node A owns rxe(2r) on
# veth(2r) = 10.(77+r).0.1, node B owns rxe(2r+1) on veth(2r+1) = 10.(77+r).0.2.

_tpf_lib=$(dirname "${BASH_SOURCE[0]}")   # /opt/tpf in the guest, tests/vm in the tree
[ -f "$_tpf_lib/tap-lib.sh" ] || _tpf_lib=$_tpf_lib/../common
# shellcheck source=../common/tap-lib.sh
. "$_tpf_lib/tap-lib.sh"

# shellcheck disable=SC2034  # NODE_*, PEER_*, RC_*, CM_* are for the scenarios
IP=/usr/sbin/ip      # iproute2; a bare `ip` may be busybox's applet (gotcha 1)
RDMA=/usr/bin/rdma

# --- topology ---
_node_bit() { case $1 in A) echo 0 ;; B) echo 1 ;; *) note "guest-lib: node must be A or B, not '$1'"; return 1 ;; esac; }
rail_dev() { echo "rxe$((2 * $2 + $(_node_bit "$1")))"; }
rail_netdev() { echo "veth$((2 * $2 + $(_node_bit "$1")))"; }
rail_ip() { echo "10.$((77 + $2)).0.$((1 + $(_node_bit "$1")))"; }
RAILS="0 1"
# node A|B: sets NODE, NODE_DEVS, NODE_IPS, NODE_NETDEVS and PEER, PEER_DEVS,
# PEER_IPS, PEER_NETDEVS (space-separated, rail order) and exports them as TPF_*.
node() {
  _node_bit "$1" >/dev/null || return 1
  NODE=$1; PEER=$([ "$1" = A ] && echo B || echo A)
  NODE_DEVS="" NODE_IPS="" NODE_NETDEVS="" PEER_DEVS="" PEER_IPS="" PEER_NETDEVS=""
  local r
  for r in $RAILS; do
    NODE_DEVS+="$(rail_dev "$NODE" "$r") "; PEER_DEVS+="$(rail_dev "$PEER" "$r") "
    NODE_IPS+="$(rail_ip "$NODE" "$r") "; PEER_IPS+="$(rail_ip "$PEER" "$r") "
    NODE_NETDEVS+="$(rail_netdev "$NODE" "$r") "; PEER_NETDEVS+="$(rail_netdev "$PEER" "$r") "
  done
  NODE_DEVS=${NODE_DEVS% } NODE_IPS=${NODE_IPS% } NODE_NETDEVS=${NODE_NETDEVS% }
  PEER_DEVS=${PEER_DEVS% } PEER_IPS=${PEER_IPS% } PEER_NETDEVS=${PEER_NETDEVS% }
  export TPF_NODE=$NODE TPF_NODE_DEVS=$NODE_DEVS TPF_NODE_IPS=$NODE_IPS \
    TPF_NODE_NETDEVS=$NODE_NETDEVS TPF_PEER_DEVS=$PEER_DEVS TPF_PEER_IPS=$PEER_IPS
}

# rail_route I: (re)installs the policy route that sends local traffic from vethI's
# IP to its peer's IP out of vethI instead of lo (softroce.md gotcha 5).
rail_route() {
  local i=$1 net=$((77 + $1 / 2)) me=$(($1 % 2 + 1)) peer=$((2 - $1 % 2)) table=$((10 + $1))
  [ -n "$($IP rule show pref $table)" ] || $IP rule add pref $table iif lo to "10.$net.0.$peer" lookup $table || return 1
  $IP route replace "10.$net.0.$peer/32" dev "veth$i" src "10.$net.0.$me" table $table
}
# link_down / link_up NETDEV: cut and restore a link. Use these, not a bare
# `ip link set up`: taking a veth down deletes its policy route and bringing it
# up does not restore it (then rdma_cm on that rail ends in RDMA_CM_EVENT_UNREACHABLE).
link_down() { $IP link set "$1" down; }
link_up() { $IP link set "$1" up && rail_route "${1#veth}"; }

dev_ip() { local i=${1#rxe}; i=${i#veth}; echo "10.$((77 + i / 2)).0.$((i % 2 + 1))"; }   # rxeI|vethI
# rxe_recreate DEV...: deletes and re-adds soft-RoCE devices on their veths, then
# waits until each is ACTIVE with its IPv4 GID. Needed after a link flap that
# killed a connected QP: rxe (kernel 6.1) then loses rdma_cm traffic on that rail
# (RDMA_CM_EVENT_UNREACHABLE) until its devices are recreated; verbs QPs work.
rxe_recreate() {
  local d
  for d in "$@"; do
    $RDMA link delete "$d" && $RDMA link add "$d" type rxe netdev "veth${d#rxe}" || return 1
  done
  for d in "$@"; do
    wait_port_active "$d" 60 && gid_index "$d" "$(dev_ip "$d")" 60 >/dev/null || return 1
  done
}
# topology_ok: prints what differs from the topology /init built; status 1 if anything.
topology_ok() {
  local i bad=0 peer
  for i in 0 1 2 3; do
    peer=$(dev_ip $((i ^ 1)))
    [ -n "$($IP -o link show up dev "veth$i" 2>/dev/null)" ] || { echo "veth$i is down"; bad=1; }
    _port_is "rxe$i" ACTIVE || { echo "rxe$i is $(port_state "rxe$i")"; bad=1; }
    _gid_index_now "rxe$i" "$(dev_ip $i)" >/dev/null || { echo "rxe$i lacks its IPv4 GID"; bad=1; }
    $IP route show table $((10 + i)) | grep -q "^$peer dev veth$i " || { echo "policy route to $peer via veth$i is gone"; bad=1; }
  done
  return $bad
}

# --- RDMA devices ---
port_state() { sed 's/^[0-9]*: *//' "/sys/class/infiniband/$1/ports/1/state" 2>/dev/null; }
_port_is() { [ "$(port_state "$1")" = "$2" ]; }
wait_port_active() { wait_until "${2:-30}" _port_is "$1" ACTIVE; }
wait_port_down() { wait_until "${2:-30}" _port_is "$1" DOWN; }
_gid_index_now() {
  local want g idx
  want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' ${2//./ })
  for g in /sys/class/infiniband/$1/ports/1/gids/*; do
    [ "$(cat "$g" 2>/dev/null)" = "$want" ] || continue
    idx=${g##*/}
    grep -q 'RoCE v2' "/sys/class/infiniband/$1/ports/1/gid_attrs/types/$idx" 2>/dev/null || continue
    echo "$idx"; return 0
  done
  return 1
}
# gid_index DEV IPV4 [WAIT_SECONDS]: prints the index of DEV's RoCE v2 GID ::ffff:IPV4.
gid_index() {
  _gid_index_now "$1" "$2" && return 0
  [ "${3:-0}" -gt 0 ] && wait_until "$3" _gid_index_now "$1" "$2" && _gid_index_now "$1" "$2"
}
hw_counter() { cat "/sys/class/infiniband/$1/ports/1/hw_counters/$2"; }   # DEV sent_pkts|rcvd_pkts|...
net_counter() { cat "/sys/class/net/$1/statistics/$2"; }                  # NETDEV tx_packets|...

# snap_counters: remembers sent/rcvd of every rxe and tx/rx of every veth;
# delta DEV NAME then prints how much that counter grew since.
declare -gA TPF_SNAP
snap_counters() {
  local i
  for i in 0 1 2 3; do
    TPF_SNAP[rxe$i.sent_pkts]=$(hw_counter rxe$i sent_pkts)
    TPF_SNAP[rxe$i.rcvd_pkts]=$(hw_counter rxe$i rcvd_pkts)
    TPF_SNAP[veth$i.tx_packets]=$(net_counter veth$i tx_packets)
    TPF_SNAP[veth$i.rx_packets]=$(net_counter veth$i rx_packets)
  done
}
delta() {
  case $1 in veth*) echo $(($(net_counter "$1" "$2") - ${TPF_SNAP[$1.$2]})) ;;
    *) echo $(($(hw_counter "$1" "$2") - ${TPF_SNAP[$1.$2]})) ;; esac
}
# check_rail_traffic RAIL FROM_NODE MIN: since snap_counters, both devices of RAIL
# sent and received >= MIN packets, FROM_NODE's veth transmitted, and the other
# rail carried nothing. Prints what is wrong; status 1 if anything is.
check_rail_traffic() {
  local rail=$1 from=$2 min=$3 other=$((1 - $1)) bad=0 d c n
  for d in $(rail_dev A "$rail") $(rail_dev B "$rail"); do
    for c in sent_pkts rcvd_pkts; do
      n=$(delta "$d" "$c")
      [ "$n" -ge "$min" ] || { echo "$d $c grew by $n, expected >= $min"; bad=1; }
    done
  done
  d=$(rail_netdev "$from" "$rail"); n=$(delta "$d" tx_packets)
  [ "$n" -gt 0 ] || { echo "$d transmitted nothing: traffic did not cross the veth"; bad=1; }
  for d in $(rail_dev A "$other") $(rail_dev B "$other"); do
    for c in sent_pkts rcvd_pkts; do
      n=$(delta "$d" "$c")
      [ "$n" -eq 0 ] || { echo "$d (rail $other) $c grew by $n, expected 0"; bad=1; }
    done
  done
  return $bad
}

# rc_exchange RAIL SERVER_NODE CLIENT_NODE PORT [OOB_HOST] [ITERS] [LIMIT_S]:
# ibv_rc_pingpong between the two nodes' devices of RAIL with each side's IPv4
# GID; the TCP exchange of QP numbers goes to OOB_HOST (default: the server's
# rail IP). Status: the client's. Sets RC_SERVER_STATUS, RC_LOG (client log
# path) and RC_SERVER_LOG.
rc_exchange() {
  local rail=$1 srv=$2 cli=$3 port=$4 iters=${6:-20} limit=${7:-120}
  local host=${5:-$(rail_ip "$2" "$1")} sdev cdev sgid cgid spid
  sdev=$(rail_dev "$srv" "$rail"); cdev=$(rail_dev "$cli" "$rail")
  RC_LOG=${TPF_SCRATCH:-/tmp}/rc.$rail.$cli$srv.$port.client.log
  RC_SERVER_LOG=${TPF_SCRATCH:-/tmp}/rc.$rail.$cli$srv.$port.server.log
  RC_SERVER_STATUS=
  sgid=$(gid_index "$sdev" "$(rail_ip "$srv" "$rail")") || { echo "no IPv4 GID on $sdev" >"$RC_LOG"; return 2; }
  cgid=$(gid_index "$cdev" "$(rail_ip "$cli" "$rail")") || { echo "no IPv4 GID on $cdev" >"$RC_LOG"; return 2; }
  timeout -k 5 "$limit" ibv_rc_pingpong -d "$sdev" -g "$sgid" -p "$port" -n "$iters" >"$RC_SERVER_LOG" 2>&1 &
  spid=$!
  if ! wait_tcp_listen "$port" 30; then
    echo "server on $sdev never listened on TCP $port" >"$RC_LOG"; kill "$spid" 2>/dev/null; wait "$spid"
    return 2
  fi
  timeout -k 5 "$limit" ibv_rc_pingpong -d "$cdev" -g "$cgid" -p "$port" -n "$iters" "$host" >"$RC_LOG" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || kill "$spid" 2>/dev/null
  wait "$spid"; RC_SERVER_STATUS=$?
  return $rc
}

_cm_listening() { $RDMA res show cm_id 2>/dev/null | grep -Eq "state LISTEN .*src-addr ($1|0\.0\.0\.0):$2 "; }
# wait_cm_listen IP PORT [SECONDS]: an rdma_cm id listens on IP:PORT (or on any address).
wait_cm_listen() { wait_until "${3:-30}" _cm_listening "${1//./\\.}" "$2"; }

# cm_exchange RAIL SERVER_NODE CLIENT_NODE PORT [COUNT] [LIMIT_S]: rping over
# rdma_cm, the server bound to its rail IP and the client's cm id bound to its
# own (-I), so neither side can fall back to rxe loopback. Status: the client's.
# Sets CM_SERVER_STATUS, CM_LOG and CM_SERVER_LOG.
cm_exchange() {
  local rail=$1 port=$4 count=${5:-10} limit=${6:-120} sip cip spid
  sip=$(rail_ip "$2" "$rail"); cip=$(rail_ip "$3" "$rail")
  CM_LOG=${TPF_SCRATCH:-/tmp}/cm.$rail.$3$2.$port.client.log
  CM_SERVER_LOG=${TPF_SCRATCH:-/tmp}/cm.$rail.$3$2.$port.server.log
  CM_SERVER_STATUS=
  timeout -k 5 "$limit" rping -s -a "$sip" -p "$port" -C "$count" -V >"$CM_SERVER_LOG" 2>&1 &
  spid=$!
  if ! wait_cm_listen "$sip" "$port" 30; then
    echo "rping server never listened on $sip:$port" >"$CM_LOG"; kill "$spid" 2>/dev/null; wait "$spid"
    return 2
  fi
  timeout -k 5 "$limit" rping -c -a "$sip" -I "$cip" -p "$port" -C "$count" -V >"$CM_LOG" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || kill "$spid" 2>/dev/null
  wait "$spid"; CM_SERVER_STATUS=$?
  return $rc
}
