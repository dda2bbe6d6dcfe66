#!/bin/bash
# /init of the tpfabric VM guest (copied there by tests/vm/run.sh).
# Loads the soft-RoCE modules, builds the two-"node" topology in ONE network
# namespace (see README.md), runs every /opt/tpf/scenarios/*.sh in sorted order
# and powers off. Scenario output goes to the console (ttyS0); the TAP-looking
# lines of each scenario's stdout, framed by "@@TPFVM@@" records, go to ttyS1,
# which run.sh reads: the kernel never writes there, so nothing interleaves.
# systemd-run.sh runs this same script as a service of a guest whose PID 1 is
# systemd: then the file systems are systemd's, and the end is `systemctl poweroff`.
export PATH=/opt/tpf/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LD_LIBRARY_PATH=/opt/tpf/lib
IP=/usr/sbin/ip   # iproute2, never busybox's applet (softroce.md gotcha 1)

if [ $$ -eq 1 ]; then
  mount -t proc proc /proc
  mount -t sysfs sysfs /sys
  mount -t devtmpfs devtmpfs /dev
  mkdir -p /dev/pts /dev/shm /root
  mount -t devpts devpts /dev/pts
  ln -sf /proc/self/fd /dev/fd
  ln -sf /proc/self/fd/0 /dev/stdin; ln -sf /proc/self/fd/1 /dev/stdout; ln -sf /proc/self/fd/2 /dev/stderr
  mount -t tmpfs tmpfs /tmp
  mount -t tmpfs tmpfs /run
  mount -t tmpfs tmpfs /dev/shm
fi

exec 3>/dev/ttyS1 || exec 3>/dev/console
stty -F /dev/ttyS1 raw -echo 2>/dev/null
echo "vm-init: /init started at $(cut -d' ' -f1 /proc/uptime) s"
rec() { echo "@@TPFVM@@ $*" >&3; }
finish() {
  rec "done"; exec 3>&-; sleep 0.3
  if [ $$ -eq 1 ]; then poweroff -f; else systemctl poweroff --force --force; fi
}
setup_fail() { echo "vm-init: setup failed: $*"; rec setup fail "$*"; finish; }

set -a; . /etc/tpf-vm.env; set +a
. /opt/tpf/guest-lib.sh

# Modules, in the order run.sh computed (crc32_generic first: gotcha 3).
while read -r ko; do
  insmod "/lib/modules/tpf/$ko" || setup_fail "insmod $ko failed"
done </lib/modules/tpf/load.list
mount -t configfs configfs /sys/kernel/config 2>/dev/null

conf() { echo "$3" >"/proc/sys/net/ipv4/conf/$1/$2" || setup_fail "setting net.ipv4.conf.$1.$2=$3"; }
for d in all default; do conf $d accept_local 1; conf $d rp_filter 0; done
$IP link set lo up || setup_fail "ip link set lo up"
$IP link add veth0 type veth peer name veth1 || setup_fail "ip link add veth0/veth1"
$IP link add veth2 type veth peer name veth3 || setup_fail "ip link add veth2/veth3"
# Gotcha 5: local table behind our rules, so traffic to the peer IP leaves
# through the veth instead of lo.
$IP rule add pref 100 lookup local && $IP rule del pref 0 lookup local ||
  setup_fail "moving the local routing table to pref 100"
for i in 0 1 2 3; do
  rail=$((i / 2)); net=$((77 + rail)); me=$((i % 2 + 1)); peer=$((2 - i % 2))
  dev=veth$i
  $IP addr add "10.$net.0.$me/24" dev $dev || setup_fail "ip addr add 10.$net.0.$me on $dev"
  conf $dev accept_local 1; conf $dev rp_filter 0
  $IP link set $dev up || setup_fail "ip link set $dev up"
  rail_route $i || setup_fail "policy route 10.$net.0.$me -> 10.$net.0.$peer via $dev"
done
for i in 0 1 2 3; do
  rdma link add rxe$i type rxe netdev veth$i || setup_fail "rdma link add rxe$i netdev veth$i"
done
for i in 0 1 2 3; do
  wait_port_active rxe$i 60 || setup_fail "rxe$i port not ACTIVE after 60 s"
  addr=10.$((77 + i / 2)).0.$((i % 2 + 1))
  gid_index rxe$i "$addr" 60 >/dev/null || setup_fail "rxe$i has no RoCE v2 GID for $addr after 60 s"
done
echo "vm-init: topology up: $(rdma link show | tr '\n' ';')"
rec setup ok

for s in /opt/tpf/scenarios/*.sh; do
  [ -e "$s" ] || continue
  name=$(basename "$s" .sh)
  limit=$(sed -n '1,20s/^# *vm-timeout: *\([0-9][0-9]*\).*/\1/p' "$s" | head -n1)
  limit=${limit:-$TPF_SCENARIO_TIMEOUT}
  export TPF_SCENARIO=$name TPF_SCRATCH=/tmp/tpf/$name
  mkdir -p "$TPF_SCRATCH"
  echo "vm-init: ===== $name (limit ${limit}s) ====="
  rec begin "$name"
  t0=$(date +%s)
  # The scenario runs as its own process group (setsid): when it ends, whatever
  # it left running in the background is killed, so nothing holds its output open.
  fifo=/tmp/tpf/.out.$name
  mkfifo "$fifo"
  while IFS= read -r l; do
    echo "[$name] $l"
    case $l in ok* | "not ok"* | 1..* | "#"* | "Bail out!"*) rec line "$name" "$l" ;; esac
  done <"$fifo" &
  rpid=$!
  (cd "$TPF_SCRATCH" && exec setsid timeout -k 10 "$limit" bash "$s" >"$fifo" \
      2> >(while IFS= read -r l; do echo "[$name] $l"; done) 3>&-) &
  spid=$!
  wait $spid
  rc=$?
  kill -KILL -- -$spid 2>/dev/null
  wait_until 10 _gone $rpid || { echo "vm-init: output of $name still open; dropping it"; kill $rpid; }
  rm -f "$fifo"
  rec end "$name" "$rc" "$(($(date +%s) - t0))"
  if ! why=$(topology_ok); then   # repair it, so one scenario cannot fail the next
    rec broken "$name" "$(echo $why)"
    for i in 0 1 2 3; do link_up veth$i; done
    topology_ok >/dev/null || rxe_recreate rxe0 rxe1 rxe2 rxe3
  fi
  cd /
done
finish
