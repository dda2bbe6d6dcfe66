#!/bin/bash
# VM scenario 43-verbs-close: the cross-node close race of docs/reliability.md.
# 54 short groups across both daemons (layouts "B A A B", "A B", "B A"; 100,
# 102 and 104 mixed calls each) open, run and close in order one after the
# other, nothing injected, no hold before Close. Every rank of every group
# must end ok: a rank that finished its calls and closed must not make a rank
# of the other node fail its last call with PeerLost (its daemon must not
# close the group's peer link before every shard the closing rank posted
# landed). Before the fix about 10..13 % of such groups failed (7 of 72 in
# one run of this scenario at 72 groups).
# vm-timeout: 600
# shellcheck source=../guest-lib.sh
. "$TPF_GUEST_LIB"
# shellcheck source=../verbs-lib.sh
. /opt/tpf/verbs-lib.sh

start_daemon a A && start_daemon b B || tap_done
n=0; failed=0
for round in 1 2 3 4 5 6; do
  for it in 100 102 104; do
    for l in "B A A B" "A B" "B A"; do
      n=$((n + 1))
      if ! GROUP_TIMEOUT_MS=10000 run_group "g$n" "$l" --iters "$it" --mode mixed; then
        failed=$((failed + 1))
        diag "group $n ($l, $it calls, round $round): exit codes $GROUP_RCS; $(grep -h RESULT "g$n".r*.log | grep error | head -n1)"
      fi
    done
  done
done
if [ "$failed" -eq 0 ]; then
  tap_ok "$n cross-node groups opened, ran and closed in order, every rank ok"
else
  tap_fail "$n cross-node groups closed in order: $failed ended with a failed rank"
  diag_file a.log; diag_file b.log
fi
stop_daemons
tap_done
