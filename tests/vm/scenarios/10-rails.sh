#!/bin/bash
# VM scenario 10-rails: on each rail, RC traffic both ways between node A's and
# node B's device of that rail: ibv_rc_pingpong with each side's IPv4 GID, and
# rping over rdma_cm with both cm ids bound to their rail IPs. After each
# exchange the hw counters must show that both devices of that rail sent and
# received, the sender's veth transmitted, and the other rail stayed silent,
# so a pass cannot come from rxe loopback on one device.
# shellcheck source=../guest-lib.sh
. "$TPF_GUEST_LIB"
iters=20
port=18600
for rail in $RAILS; do
  for pair in "A B" "B A"; do
    read -r cli srv <<<"$pair"
    what="rail $rail $cli->$srv ($(rail_dev "$cli" "$rail") -> $(rail_dev "$srv" "$rail"))"
    snap_counters
    if rc_exchange "$rail" "$srv" "$cli" "$port" "" "$iters" && [ "$RC_SERVER_STATUS" = 0 ]; then
      tap_ok "$what: ibv_rc_pingpong with IPv4 GIDs, $iters round trips"
    else
      tap_fail "$what: ibv_rc_pingpong with IPv4 GIDs, $iters round trips" "server status $RC_SERVER_STATUS; client log:"
      diag_file "$RC_LOG"; diag "server log:"; diag_file "$RC_SERVER_LOG"
    fi
    why=$(check_rail_traffic "$rail" "$cli" "$iters") && tap_ok "$what: counters show rail $rail carried the ping-pong" ||
      tap_fail "$what: counters show rail $rail carried the ping-pong" "$why"
    port=$((port + 1))

    snap_counters
    if cm_exchange "$rail" "$srv" "$cli" "$port" 10 && [ "$CM_SERVER_STATUS" = 0 ]; then
      tap_ok "$what: rping over rdma_cm, both ends bound to rail IPs"
    else
      tap_fail "$what: rping over rdma_cm, both ends bound to rail IPs" "server status $CM_SERVER_STATUS; client log:"
      diag_file "$CM_LOG"; diag "server log:"; diag_file "$CM_SERVER_LOG"
    fi
    why=$(check_rail_traffic "$rail" "$cli" 10) && tap_ok "$what: counters show rail $rail carried the rping" ||
      tap_fail "$what: counters show rail $rail carried the rping" "$why"
    port=$((port + 1))
  done
done
tap_done
