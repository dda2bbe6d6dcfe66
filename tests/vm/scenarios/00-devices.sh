#!/bin/bash
# VM scenario 00-devices: the guest has four ACTIVE soft-RoCE devices, each bound
# to its veth and carrying a RoCE v2 GID of its IPv4 address (::ffff:10.7x.0.y),
# as seen by ibv_devinfo -v, the rdma tool and sysfs; node A/B names agree;
# every --bin binary finds its libraries.
# shellcheck source=../guest-lib.sh
. "$TPF_GUEST_LIB"

devs=$(ibv_devices 2>&1 | awk '$1 ~ /^rxe/ { print $1 }' | sort | tr '\n' ' ')
[ "$devs" = "rxe0 rxe1 rxe2 rxe3 " ] && tap_ok "ibv_devices lists rxe0..rxe3" ||
  tap_fail "ibv_devices lists rxe0..rxe3" "got: ${devs:-nothing}"

for node in A B; do
  for rail in $RAILS; do
    dev=$(rail_dev $node $rail) addr=$(rail_ip $node $rail) nd=$(rail_netdev $node $rail)
    info=$(ibv_devinfo -v -d "$dev" 2>&1)
    if grep -q 'state:.*PORT_ACTIVE' <<<"$info" && grep -q 'link_layer:.*Ethernet' <<<"$info"; then
      tap_ok "$dev (node $node rail $rail): ibv_devinfo says PORT_ACTIVE, Ethernet"
    else tap_fail "$dev (node $node rail $rail): ibv_devinfo says PORT_ACTIVE, Ethernet" "$info"; fi
    grep -Eq "GID\[ *[0-9]+\]:[[:space:]]*::ffff:$addr, RoCE v2" <<<"$info" &&
      tap_ok "$dev: ibv_devinfo shows GID ::ffff:$addr, RoCE v2" ||
      tap_fail "$dev: ibv_devinfo shows GID ::ffff:$addr, RoCE v2" "$(grep GID <<<"$info")"
    link=$($RDMA link show "$dev/1" 2>&1)
    grep -q "state ACTIVE .*netdev $nd\b" <<<"$link" && tap_ok "$dev: rdma link says ACTIVE on $nd" ||
      tap_fail "$dev: rdma link says ACTIVE on $nd" "$link"
    if idx=$(gid_index "$dev" "$addr"); then
      got=$(cat "/sys/class/infiniband/$dev/ports/1/gid_attrs/ndevs/$idx")
      [ "$got" = "$nd" ] && tap_ok "$dev: sysfs GID $idx is ::ffff:$addr on $nd" ||
        tap_fail "$dev: sysfs GID $idx is ::ffff:$addr on $nd" "its netdev is '$got'"
    else tap_fail "$dev: sysfs has a RoCE v2 GID for $addr" "$(cat /sys/class/infiniband/$dev/ports/1/gids/* | head -n 4)"; fi
  done
done

for b in "$TPF_BIN"/*; do   # the --bin files: the loader finds every library
  [ -f "$b" ] && head -c4 "$b" | grep -q ELF || continue
  out=$(/lib64/ld-linux-x86-64.so.2 --list "$b" 2>&1) && ! grep -q 'not found' <<<"$out" &&
    tap_ok "$b: every library it needs is in the guest" ||
    tap_fail "$b: every library it needs is in the guest" "$(grep 'not found' <<<"$out")"
done

node A
[ "$NODE_DEVS|$NODE_IPS|$NODE_NETDEVS" = "$TPF_NODE_A_DEVS|$TPF_NODE_A_IPS|$TPF_NODE_A_NETDEVS" ] &&
  [ "$PEER_DEVS|$PEER_IPS" = "$TPF_NODE_B_DEVS|$TPF_NODE_B_IPS" ] &&
  tap_ok "node A / node B helpers match the TPF_NODE_* environment" ||
  tap_fail "node A / node B helpers match the TPF_NODE_* environment" "node A: $NODE_DEVS / $NODE_IPS / $NODE_NETDEVS, peer $PEER_DEVS / $PEER_IPS"
tap_done
