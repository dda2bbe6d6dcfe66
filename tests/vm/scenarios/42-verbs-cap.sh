#!/bin/bash
# VM scenario 42-verbs-cap: two daemons with different daemon.max_bytes (65536
# and 20000, not a page multiple) carry one group across the nodes; the ranks
# ask 65536. The group opens (no refusal, no fallback) with the exact minimum,
# 20000, on every rank (its OPEN line) and in both daemons' status; each
# daemon logs the agreed cap once, naming the smaller daemon's node. Gathers
# and sums up to 20000 bytes pass byte/bit-exact on every rank; a gather of
# 20001 bytes is refused CapMismatch by every rank alike, after one call at
# 20000 passed. Once with node B's daemon the smaller, once node A's, so the
# smaller daemon is the connecting side of the node pair once and the
# accepting side once.
# vm-timeout: 1200
# shellcheck source=../guest-lib.sh
. "$TPF_GUEST_LIB"
# shellcheck source=../verbs-lib.sh
. /opt/tpf/verbs-lib.sh

SMALL=20000

# node_short NAME: the first 12 hex digits of daemon NAME's node id (how its log names nodes).
node_short() {
  tpfabricctl status --json --socket "$(sock_of "$1")" 2>/dev/null | tr -d ' \n' |
    grep -o '"node_id":"[0-9a-f]*"' | head -n1 | cut -d'"' -f4 | cut -c1-12
}
# snap_status NAME: both daemons' status (compact) while group NAME is paused, then let it go on.
snap_status() {
  local d
  for d in a b; do tpfabricctl status --json --socket "$(sock_of $d)" 2>/dev/null | tr -d ' \n' >"$1.$d.json"; done
  touch "$PWD/$1.go"
}

for small in b a; do
  : >a.log; : >b.log
  if [ $small = b ]; then start_daemon a A && MAX_BYTES=$SMALL start_daemon b B || tap_done
  else MAX_BYTES=$SMALL start_daemon a A && start_daemon b B || tap_done; fi
  if [ $small = b ]; then layout="A B A B"; else layout="A B B"; fi
  w=$(wc -w <<<"$layout") name=cap$small
  what="daemon $small's max_bytes $SMALL, the other's $GROUP_CAP, W=$w ($layout)"

  # Calls up to the cap; paused at call 201 (after PROGRESS at 200) while both statuses are taken.
  GROUP_SIZES=0,16,1000,4096,16384,19984,$SMALL DURING="snap_status $name" \
    run_group "$name" "$layout" --iters 300 --mode mixed --pause-at 201 --go-file "$PWD/$name.go"
  if [ "$GROUP_RCS" = "$(printf '0 %.0s' $(seq "$w"))" ]; then
    tap_ok "$what: gathers and sums up to $SMALL bytes pass on every rank"
  else tap_fail "$what: gathers and sums up to $SMALL bytes pass on every rank" "exit codes $GROUP_RCS"; show_group "$name"; fi
  caps=$(grep -ho '^OPEN rank=[0-9]* cap=[0-9]*' "$name".r*.log | sed 's/.*cap=//' | sort | uniq -c | tr -s ' ')
  if [ "$caps" = " $w $SMALL" ]; then tap_ok "$what: every rank opens with the cap $SMALL"
  else tap_fail "$what: every rank opens with the cap $SMALL" "caps seen (count cap): ${caps:-none}"; show_group "$name"; fi
  if grep -q "\"agreed_cap\":$SMALL," "$name.a.json" 2>/dev/null && grep -q "\"agreed_cap\":$SMALL," "$name.b.json" 2>/dev/null; then
    tap_ok "$what: both daemons' status show agreed_cap $SMALL"
  else
    tap_fail "$what: both daemons' status show agreed_cap $SMALL" "a: $(grep -o '"agreed_cap":[0-9]*' "$name.a.json" 2>/dev/null)" \
      "b: $(grep -o '"agreed_cap":[0-9]*' "$name.b.json" 2>/dev/null)"
  fi
  want="agreed cap $SMALL bytes (daemon of node $(node_short $small) is the smallest)"
  na=$(grep -c "agreed cap " a.log) nb=$(grep -c "agreed cap " b.log)
  if [ "$na" = 1 ] && [ "$nb" = 1 ] && grep -qF "$want" a.log && grep -qF "$want" b.log; then
    tap_ok "$what: each daemon logs once: $want"
  else
    tap_fail "$what: each daemon logs once: $want" "a ($na): $(grep 'agreed cap ' a.log | tail -n1)" "b ($nb): $(grep 'agreed cap ' b.log | tail -n1)"
  fi

  # One call at the cap, then one byte above it: CapMismatch on every rank, the
  # same. No hold: a rank closes at once after its refusal while a slower one
  # may still be in the 20000-byte call, which the leave must not break
  # (docs/reliability.md: orderly leave after the last epoch).
  GROUP_SIZES=$SMALL,$((SMALL + 1)) run_group "${name}over" "$layout" --iters 2 --mode gather
  rs=$(for ((r = 0; r < w; r++)); do grep -ho '^RESULT .*' "${name}over.r$r.log" | sed 's/^RESULT rank=[0-9]* //; s/ elapsed_ms=[0-9.]*//'; done | sort | uniq -c | tr -s ' ')
  if [ "$(wc -l <<<"$rs")" = 1 ] && [[ $rs == " $w error=CapMismatch calls=1 "* ]]; then
    tap_ok "$what: a gather of $((SMALL + 1)) bytes is refused CapMismatch on every rank alike, after one at $SMALL"
  else
    tap_fail "$what: a gather of $((SMALL + 1)) bytes is refused CapMismatch on every rank alike" "results (count line): $rs"
    show_group "${name}over"
  fi
  if grep -q "CapMismatch\|refused the group\|unavailable" a.log b.log; then
    tap_fail "$what: neither daemon refused the group" "$(grep -h "CapMismatch\|refused the group\|unavailable" a.log b.log | head -n3)"
  else tap_ok "$what: neither daemon refused the group"; fi
  stop_daemons
done
tap_done
