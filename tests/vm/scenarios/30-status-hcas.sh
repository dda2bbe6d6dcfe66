#!/bin/bash
# VM scenario 30-status-hcas: `tpfabricctl status --json` lists exactly the HCAs
# a daemon was told to own, as ibv_devinfo -v describes them (device, port,
# port state, active MTU, speed, RoCE v2 GID of the IPv4 address and its GID
# index), with the IP and its subnet as `ip addr` has them: node A chosen by
# name in verbs.hcas, node B by IP, one daemon by TPF_HCA, one by
# NCCL_IB_HCA, one by a single IP, one by default (every ACTIVE port); a
# configured entry that matches nothing is named in the log and the daemon
# still starts; the human table shows the same; the state is live (a cut
# link shows DOWN, then ACTIVE again).
# vm-timeout: 300
# shellcheck source=../guest-lib.sh
. "$TPF_GUEST_LIB"
cd "$TPF_SCRATCH" || exit 1
cut=$(rail_netdev A 1)
trap 'link_up "$cut" 2>/dev/null; $IP addr del 10.79.0.1/24 dev "$(rail_netdev A 0)" 2>/dev/null; rm -f /run/tpf-hca-*.sock' EXIT

# devinfo_rows DEV...: one line per RoCE v2 GID of an IPv4 address that
# ibv_devinfo -v prints for DEV's ports: "dev port state gid index mtu mbps".
devinfo_rows() {
  local d
  for d in "$@"; do ibv_devinfo -v -d "$d"; done 2>&1 | awk '
    /^hca_id:/ { dev = $2 }
    $1 == "port:" { port = $2 }
    $1 == "state:" { st = $2; sub(/^PORT_/, "", st) }
    $1 == "active_mtu:" { mtu = $2 }
    $1 == "active_width:" { w = $2; sub(/X$/, "", w) }
    $1 == "active_speed:" { sp = int($2 * ($3 == "Gbps" ? 1000 : 1) * w + 0.5) }
    /GID\[/ {
      l = $0; sub(/^.*GID\[ */, "", l)
      idx = l; sub(/\].*$/, "", idx)
      rest = l; sub(/^[0-9]+\]:[ \t]*/, "", rest)
      gid = rest; sub(/,.*$/, "", gid)
      type = rest; sub(/^[^,]*,[ \t]*/, "", type)
      if (type == "RoCE v2" && gid ~ /^::ffff:[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$/)
        print dev, port, st, gid, idx, mtu, sp
    }' | sort
}

# status_rows SOCKET FIELD...: the daemon's hcas[], one line per entry, the
# FIELDs in order ("-" when absent). No jq in the guest: the pretty JSON is
# squeezed to one line (HCA fields hold no blanks) and the array cut out.
status_rows() {
  local sock=$1; shift
  tpfabricctl status --socket "$sock" --json 2>&1 | tr -d ' \t\n' | awk -v fields="$*" '
    function val(obj, key,   k, i, s) {
      k = "\"" key "\":"; i = index(obj, k)
      if (!i) return "-"
      s = substr(obj, i + length(k))
      if (substr(s, 1, 1) == "\"") { s = substr(s, 2); return substr(s, 1, index(s, "\"") - 1) }
      match(s, /^[^,}]*/); return substr(s, 1, RLENGTH)
    }
    function emit(obj,   i, line) {
      if (obj == "") return
      line = ""
      for (i = 1; i <= nf; i++) line = line (i > 1 ? " " : "") val(obj, f[i])
      print line
    }
    {
      nf = split(fields, f, " ")
      i = index($0, "\"hcas\":[")
      if (!i) { print "NO-HCAS-IN-STATUS"; exit }
      s = substr($0, i + 8); s = substr(s, 1, index(s, "]") - 1)
      while ((j = index(s, "},{")) > 0) { emit(substr(s, 1, j)); s = substr(s, j + 2) }
      emit(s)
    }' | sort
}
hca_rows() { status_rows "$1" device port state gid gid_index mtu speed_mbps; }

# subnet_of IPV4: its subnet on the interface holding it, as CIDR text.
subnet_of() {
  $IP -o -4 addr show | awk -v a="$1" '{
    for (i = 1; i < NF; i++) if ($i == "inet") {
      split($(i + 1), p, "/"); if (p[1] != a) continue
      split(p[1], o, "."); n = p[2]; s = ""
      for (k = 1; k <= 4; k++) {
        b = n - 8 * (k - 1); q = 1; for (m = b < 0 ? 0 : b; m < 8; m++) q *= 2
        s = s (k > 1 ? "." : "") int(o[k] / q) * q
      }
      print s "/" n; exit
    } }'
}

# same_as_devinfo NAME SOCKET DEV...: status lists exactly what ibv_devinfo says of DEV...
same_as_devinfo() {
  local name=$1 sock=$2 want got; shift 2
  want=$(devinfo_rows "$@"); got=$(hca_rows "$sock")
  if [ -z "$want" ]; then
    tap_fail "$name" "ibv_devinfo -v printed no IPv4 RoCE v2 GID for $*"
  elif [ "$got" = "$want" ]; then
    tap_ok "$name"; note "$got"
  else
    tap_fail "$name" "ibv_devinfo (dev port state gid index mtu mbps):" "$want" "tpfabricctl status:" "$got"
  fi
}

# ip_subnet_ok SOCKET: every entry's ip is its GID's IPv4 and subnet is that address's subnet.
ip_subnet_ok() {
  local dev gid ip subnet want bad=0
  while read -r dev gid ip subnet; do
    want=$(subnet_of "$ip")
    [ "$gid" = "::ffff:$ip" ] && [ "$ip" = "$(dev_ip "$dev")" ] && [ -n "$want" ] && [ "$subnet" = "$want" ] ||
      { echo "$dev: gid $gid ip $ip subnet $subnet; ip addr says $(dev_ip "$dev") in ${want:-nothing}"; bad=1; }
  done <<<"$(status_rows "$1" device gid ip subnet)"
  return $bad
}

PIDS=""
# start NAME CONFIG_TEXT [VAR=VALUE...]: a daemon on /run/tpf-hca-NAME.sock with
# that [verbs] config ("" = no file), TPF_HCA and NCCL_IB_HCA unset unless given.
start() {
  local name=$1 conf=$2 args=(); shift 2
  rm -f "/run/tpf-hca-$name.sock"
  if [ -n "$conf" ]; then printf '[verbs]\n%s\n' "$conf" >"$name.toml"; args=(--config "$name.toml"); fi
  env -u TPF_HCA -u NCCL_IB_HCA "$@" tpfabricd --foreground --socket "/run/tpf-hca-$name.sock" "${args[@]}" \
    >"$name.log" 2>&1 &
  PIDS+=" $!"
}
started() {   # NAME: the daemon's socket appears
  wait_until 60 test -S "/run/tpf-hca-$1.sock" && tap_ok "daemon $1 starts" && return 0
  tap_fail "daemon $1 starts"; diag_file "$1.log"; return 1
}

node A
read -ra A_DEVS <<<"$TPF_NODE_A_DEVS"
read -ra B_DEVS <<<"$TPF_NODE_B_DEVS"
start a "hcas = [\"$(rail_dev A 0)\", \"$(rail_dev A 1)\"]"
start b "hcas = [\"$(rail_ip B 0)\", \"$(rail_ip B 1)\"]"
start tpfhca "" TPF_HCA="$(rail_dev B 0)"
start byip "hcas = [\"$(rail_ip B 1)\"]"
start default ""
start nccl "" NCCL_IB_HCA="^=rxe0"
start partial "hcas = [\"rxe0\", \"rxe9\"]"
start none "hcas = [\"rxe9\", \"10.99.0.1\"]"

if started a; then
  same_as_devinfo "node A (verbs.hcas by name): status lists $TPF_NODE_A_DEVS as ibv_devinfo does" \
    /run/tpf-hca-a.sock "${A_DEVS[@]}"
  tap_check "node A: each HCA's ip is its GID's address and subnet that address's subnet" ip_subnet_ok /run/tpf-hca-a.sock
  n=$(grep -c 'info.*HCA rxe[02] port 1: ACTIVE, GID\[[0-9]*\] ::ffff:10\.7[78]\.0\.1 ' a.log)
  [ "$n" = 2 ] && tap_ok "node A: the log names each chosen HCA once" ||
    { tap_fail "node A: the log names each chosen HCA once" "$n lines"; diag_file a.log; }
  table=$(tpfabricctl status --socket /run/tpf-hca-a.sock 2>&1)
  note "$table" "$(grep -E 'HCA|verbs' a.log)"
  grep -q '^HCAs: 2$' <<<"$table" &&
    grep -Eq "^  rxe0 +1 +ACTIVE +::ffff:10\.77\.0\.1 +[0-9]+ +10\.77\.0\.1 +10\.77\.0\.0/24 +1024 " <<<"$table" &&
    grep -Eq "^  rxe2 +1 +ACTIVE +::ffff:10\.78\.0\.1 +[0-9]+ +10\.78\.0\.1 +10\.78\.0\.0/24 +1024 " <<<"$table" &&
    tap_ok "node A: the human table lists both HCAs" || tap_fail "node A: the human table lists both HCAs" "$table"
fi
if started b; then
  same_as_devinfo "node B (verbs.hcas by IP): status lists $TPF_NODE_B_DEVS as ibv_devinfo does" \
    /run/tpf-hca-b.sock "${B_DEVS[@]}"
  tap_check "node B: each HCA's ip is its GID's address and subnet that address's subnet" ip_subnet_ok /run/tpf-hca-b.sock
fi
started tpfhca && same_as_devinfo "TPF_HCA=$(rail_dev B 0), no config: status lists only $(rail_dev B 0)" \
  /run/tpf-hca-tpfhca.sock "$(rail_dev B 0)"
started byip && same_as_devinfo "hcas = [\"$(rail_ip B 1)\"]: status lists only $(rail_dev B 1)" \
  /run/tpf-hca-byip.sock "$(rail_dev B 1)"
started default && same_as_devinfo "no config, no TPF_HCA/NCCL_IB_HCA: status lists every ACTIVE port, rxe0..rxe3" \
  /run/tpf-hca-default.sock rxe0 rxe1 rxe2 rxe3
started nccl && same_as_devinfo "NCCL_IB_HCA=^=rxe0: status lists rxe1..rxe3" /run/tpf-hca-nccl.sock rxe1 rxe2 rxe3
if started partial; then
  same_as_devinfo "hcas = [\"rxe0\", \"rxe9\"]: status lists rxe0" /run/tpf-hca-partial.sock rxe0
  grep -q 'warn.*verbs.hcas entry "rxe9" matched no HCA port: no RDMA device of that name' partial.log &&
    tap_ok "hcas = [\"rxe0\", \"rxe9\"]: the log warns that rxe9 matched nothing" ||
    { tap_fail "hcas = [\"rxe0\", \"rxe9\"]: the log warns that rxe9 matched nothing"; diag_file partial.log; }
fi
if started none; then
  got=$(tpfabricctl status --socket /run/tpf-hca-none.sock --json 2>&1 | tr -d ' \n')
  grep -q '"hcas":\[\]' <<<"$got" && tap_ok "hcas matching nothing: the daemon runs with zero HCAs" ||
    tap_fail "hcas matching nothing: the daemon runs with zero HCAs" "$got"
  grep -q 'HCAs: none: Unavailable: no HCA chosen by verbs.hcas: .*"rxe9".*"10.99.0.1"' none.log &&
    tap_ok "hcas matching nothing: the log says which entries and why" ||
    { tap_fail "hcas matching nothing: the log says which entries and why"; diag_file none.log; }
  grep -q '"hcas_none_reason":"Unavailable:noHCAchosenbyverbs.hcas:.*rxe9.*10.99.0.1' <<<"$got" &&
    tap_ok "hcas matching nothing: status --json says why (hcas_none_reason)" ||
    tap_fail "hcas matching nothing: status --json says why (hcas_none_reason)" "$got"
  table=$(tpfabricctl status --socket /run/tpf-hca-none.sock 2>&1)
  grep -q '^HCAs: none (Unavailable: no HCA chosen by verbs.hcas: .*rxe9' <<<"$table" &&
    tap_ok "hcas matching nothing: the human status says why" || tap_fail "hcas matching nothing: the human status says why" "$table"
fi
if [ -S /run/tpf-hca-a.sock ]; then
  grep -q '"hcas_none_reason":""' <<<"$(tpfabricctl status --socket /run/tpf-hca-a.sock --json 2>&1 | tr -d ' \n')" &&
    tap_ok "node A: hcas_none_reason is empty when HCAs serve" ||
    tap_fail "node A: hcas_none_reason is empty when HCAs serve"
fi

# A second address on a port: its GID gets another index, found by address,
# and the port serves once per address.
extra=10.79.0.1 extra_dev=$(rail_dev A 0)
if $IP addr add "$extra/24" dev "$(rail_netdev A 0)" && gid_index "$extra_dev" "$extra" 60 >/dev/null; then
  start multi "hcas = [\"$extra_dev\"]"
  start extra "hcas = [\"$extra\"]"
  started multi && same_as_devinfo "$extra_dev with a second address: status lists it once per IPv4 GID" \
    /run/tpf-hca-multi.sock "$extra_dev"
  if started extra; then
    want=$(devinfo_rows "$extra_dev" | grep " ::ffff:$extra ")
    got=$(hca_rows /run/tpf-hca-extra.sock)
    [ -n "$want" ] && [ "$got" = "$want" ] && tap_ok "hcas = [\"$extra\"]: that GID only, at the index ibv_devinfo shows" ||
      tap_fail "hcas = [\"$extra\"]: that GID only, at the index ibv_devinfo shows" "ibv_devinfo: $want" "status: $got"
    note "$got"
  fi
else
  tap_fail "a second address $extra on $(rail_netdev A 0) gives $extra_dev a GID"
fi
$IP addr del "$extra/24" dev "$(rail_netdev A 0)" 2>/dev/null
wait_until 30 bash -c "! grep -qs 0000:0000:0000:0000:0000:ffff:0a4f:0001 /sys/class/infiniband/$extra_dev/ports/1/gids/*"

# The state is read when status is asked: a cut link shows, and its return.
rail1=$(rail_dev A 1)
_state_is() { [ "$(status_rows /run/tpf-hca-a.sock device state | awk -v d="$1" '$1 == d { print $2 }')" = "$2" ]; }
if link_down "$cut" && wait_port_down "$rail1" 60; then
  wait_until 30 _state_is "$rail1" DOWN
  same_as_devinfo "link $cut cut: node A's status shows $rail1 DOWN, as ibv_devinfo does" \
    /run/tpf-hca-a.sock "${A_DEVS[@]}"
else
  tap_fail "link $cut cut: $rail1 goes DOWN" "$(port_state "$rail1")"
fi
if link_up "$cut" && wait_port_active "$rail1" 60 && wait_port_active "$(rail_dev B 1)" 60 &&
  gid_index "$rail1" "$(rail_ip A 1)" 60 >/dev/null; then
  wait_until 30 _state_is "$rail1" ACTIVE
  same_as_devinfo "link $cut back: node A's status shows $rail1 ACTIVE again" /run/tpf-hca-a.sock "${A_DEVS[@]}"
else
  tap_fail "link $cut back: $rail1 is ACTIVE again" "$(port_state "$rail1")"
fi

for p in $PIDS; do kill "$p" 2>/dev/null; done
for p in $PIDS; do wait "$p" 2>/dev/null; done
tap_check "the topology is as the scenario found it" topology_ok
tap_done
