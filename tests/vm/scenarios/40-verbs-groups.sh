#!/bin/bash
# VM scenario 40-verbs-groups: two tpfabricd (node A: rxe0+rxe2, node B:
# rxe1+rxe3) negotiate over TCP and carry groups across "nodes" over RDMA
# WRITEs on both rails: W=2 (1+1), W=3 (2+1), W=4 (2+2), thousands of gathers
# and sums of every size class checked byte- and bit-exact by each rank; the
# rxe counters show both rails carried data; the world-4 group never had more
# than the in-flight cap plus one stripe outstanding on any QP; tpfabricctl
# status lists the peer link and its QPs, each writing the flag line's four
# copies in one inline WRITE (rxe takes 104 bytes inline); once the groups closed the daemons
# hold no MR or QP. Timing means nothing under TCG.
# vm-timeout: 1500
# shellcheck source=../guest-lib.sh
. "$TPF_GUEST_LIB"
# shellcheck source=../verbs-lib.sh
. /opt/tpf/verbs-lib.sh

start_daemon a A || tap_done
start_daemon b B || tap_done

# W=2 (1+1), W=3 (2+1), W=4 (2+2): ITERS calls cycling through every size
# class (empty, tiny, odd, page, stripe boundaries, the cap), gathers and sums
# (f32, f16, bf16) alternating.
for layout in "A B" "A A B" "A B A B"; do
  w=$(wc -w <<<"$layout")
  snap_counters
  if run_group "w$w" "$layout" --iters "$VERBS_ITERS" --mode mixed --hold-ms 3000; then
    tap_ok "W=$w ($layout): $VERBS_ITERS gathers and sums, every rank byte/bit-exact"
  else
    tap_fail "W=$w ($layout): $VERBS_ITERS gathers and sums, every rank byte/bit-exact" "exit codes $GROUP_RCS"; show_group "w$w"
  fi
  for rail in 0 1; do
    a=$(delta "$(rail_dev A "$rail")" sent_pkts); b=$(delta "$(rail_dev B "$rail")" sent_pkts)
    if [ "$a" -ge 100 ] && [ "$b" -ge 100 ]; then tap_ok "W=$w: rail $rail carried data both ways ($a / $b packets)"
    else tap_fail "W=$w: rail $rail carried data both ways" "sent packets: node A $a, node B $b"; fi
  done
  # Daemon A's status while the group was open: the peer link and its QPs.
  st=w$w.status.json
  na=$(grep -o A <<<"$layout" | wc -l); nb=$((w - na))
  want=$((na * nb * 2))
  got=$(json_ints "$st" qpn 2>/dev/null | wc -l)
  if [ -f "$st" ] && grep -q '"state":"ready"' "$st" && grep -q "\"endpoint\":\"$(rail_ip B 0):18515\"" "$st" &&
    [ "$got" = "$want" ]; then
    tap_ok "W=$w: status on node A lists the peer link to $(rail_ip B 0) (ready) and its $want QPs"
  else
    tap_fail "W=$w: status on node A lists the peer link (ready) and its $want QPs" "QPs listed: $got"
    [ -f "$st" ] && diag "$(head -c 1500 "$st")"
  fi
  fb=$(json_ints "$st" flag_bytes 2>/dev/null | sort -u | tr '\n' ' ')
  if [ "$fb" = "104 " ]; then tap_ok "W=$w: every QP writes the flag's four copies (104 bytes inline)"
  else tap_fail "W=$w: every QP writes the flag's four copies (104 bytes inline)" "flag_bytes seen: ${fb:-none}"; fi
  if [ "$w" = 4 ]; then
    bound=$((VERBS_INFLIGHT + VERBS_STRIPE_MAX + 104)) worst=0
    for v in $(json_ints "$st" inflight_high_water); do [ "$v" -gt "$worst" ] && worst=$v; done
    if [ "$worst" -gt 0 ] && [ "$worst" -le "$bound" ]; then
      tap_ok "W=4: no QP ever had more than cap + one stripe outstanding ($worst <= $VERBS_INFLIGHT + $VERBS_STRIPE_MAX + 104 bytes)"
    else
      tap_fail "W=4: no QP ever had more than cap + one stripe outstanding" "largest high water $worst, bound $bound"
    fi
  fi
done
# Every group closed: the daemons hold no MR and no QP any more (the W=4
# group had them registered while it ran).
_released() { [ "$(tpf_rdma_resources mr)" = 0 ] && [ "$(tpf_rdma_resources qp)" = 0 ]; }
wait_until 30 _released
mrs=$(tpf_rdma_resources mr) qps=$(tpf_rdma_resources qp)
if [ "$(cat w4.mrs 2>/dev/null || echo 0)" -gt 0 ] && [ "$mrs" = 0 ] && [ "$qps" = 0 ]; then
  tap_ok "groups closed: MRs deregistered and QPs destroyed ($(cat w4.mrs) MRs while W=4 ran, 0 now)"
else
  tap_fail "groups closed: MRs deregistered and QPs destroyed" "MRs while W=4 ran: $(cat w4.mrs 2>/dev/null), now: $mrs MRs, $qps QPs"
  rdma resource show mr >&2; rdma resource show qp >&2
fi
stop_daemons
tap_done
