#!/usr/bin/env bash
# tests/vm/run.sh: runs the VM scenarios (tests/vm/scenarios/*.sh) in a throwaway
# QEMU guest with real RDMA verbs: the stock Debian 12 kernel, soft-RoCE, four
# rxe devices on two rails as two "nodes" (README.md, docs in shared/notes/softroce.md).
#
#   tests/vm/run.sh [--bin FILE]... [--scenario FILE]...
#     --bin FILE       copy FILE (and every library ldd lists for it) into the guest:
#                      executables to /opt/tpf/bin, *.so* to /opt/tpf/lib
#     --scenario FILE  run only these scenarios (default: all of tests/vm/scenarios)
#
# Installs the Debian packages it needs, fetches the kernel once into a cache,
# builds an initramfs, boots, and prints ONE TAP stream on stdout.
# Exit: 0 all passed, 1 anything failed, 77 (or $TPF_VM_SKIP_RC) QEMU or the
# kernel cannot be obtained here. Environment: see README.md (TPF_VM_*).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
timeout_s=${TPF_VM_TIMEOUT:-1700}
cache=${TPF_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpfabric-vm}
# shellcheck disable=SC2034  # host-lib.sh installs them
pkgs=(qemu-system-x86 busybox-static rdma-core ibverbs-utils ibverbs-providers
  rdmacm-utils perftest cpio kmod iproute2 coreutils util-linux bash)

log() { echo "vm: $*" >&2; }
bail() { echo "Bail out! vm: $*"; log "error: $*"; exit 1; }
skip() { echo "1..0 # SKIP vm: $*"; log "SKIPPED (not passed): $*"; exit "${TPF_VM_SKIP_RC:-77}"; }
left() { echo $((timeout_s - SECONDS)); }
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"

bins=() scens=()
while [ $# -gt 0 ]; do
  case $1 in
    --bin) [ $# -ge 2 ] || bail "--bin needs a file"; bins+=("$2"); shift 2 ;;
    --scenario) [ $# -ge 2 ] || bail "--scenario needs a file"; scens+=("$2"); shift 2 ;;
    -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
    *) bail "unknown argument '$1' (see $0 --help)" ;;
  esac
done
[ ${#scens[@]} -gt 0 ] || scens=("$here"/scenarios/*.sh)
mapfile -t scens < <(for f in "${scens[@]}"; do echo "$(basename "$f")/$f"; done | sort | sed 's|^[^/]*/||')   # the guest's order
for f in "${bins[@]}" "${scens[@]}"; do
  [ -f "$f" ] || bail "no such file: $f (build it first, or fix the --bin/--scenario path)"
done

# shellcheck source=host-lib.sh
. "$here/host-lib.sh"

# copy_elf SRC DEST: SRC to $root/DEST plus every library ldd lists (system
# libraries at their own path, others in /opt/tpf/lib).
declare -A copied
copy_elf() {
  local src=$1 dest=$2 lib out
  mkdir -p "$root/$(dirname "$dest")" && cp -L "$src" "$root/$dest" || bail "cannot copy $src into the initramfs"
  # Project files lose their DWARF (no debugger in the guest; halves the initramfs).
  case $dest in /opt/tpf/*) objcopy --strip-debug "$root/$dest" 2>/dev/null ;; esac
  [ "${3:-}" = nodeps ] && return 0
  head -c4 "$src" | grep -q ELF || return 0
  out=$(ldd "$src" 2>&1)
  grep -q 'not found' <<<"$out" && bail "ldd $src: $(grep 'not found' <<<"$out" | head -n1)"
  # ldd lists the whole closure, so the libraries need no ldd of their own.
  for lib in $(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$out"); do
    [ -n "${copied[$lib]:-}" ] && continue
    copied[$lib]=1
    case $lib in /lib/* | /lib64/* | /usr/lib/* | /usr/lib64/*) copy_elf "$lib" "$lib" nodeps ;;
      *) copy_elf "$lib" "/opt/tpf/lib/$(basename "$lib")" nodeps ;; esac
  done
}

build_initramfs() {
  local t f
  mkdir -p "$root"/{usr/bin,usr/sbin,usr/lib64,usr/lib/modules/tpf,etc/libibverbs.d,proc,sys,dev,tmp,run,root}
  mkdir -p "$root"/opt/tpf/{bin,lib,scenarios}
  for t in bin sbin lib lib64; do ln -s "usr/$t" "$root/$t"; done
  for t in /usr/sbin/ip /usr/bin/rdma /usr/bin/ss /bin/bash /usr/bin/timeout /usr/bin/env \
    /usr/bin/nohup /usr/bin/setsid /usr/bin/sleep /usr/bin/ibv_devinfo /usr/bin/ibv_devices /usr/bin/ibv_asyncwatch \
    /usr/bin/ibv_rc_pingpong /usr/bin/ibv_ud_pingpong /usr/bin/rping /usr/bin/ucmatose \
    /usr/bin/udaddy /usr/bin/rdma_server /usr/bin/rdma_client /usr/bin/ib_write_lat \
    /usr/bin/ib_write_bw /usr/bin/ib_read_lat /usr/bin/ib_send_lat /usr/bin/ib_send_bw; do
    copy_elf "$t" "/usr/${t#/usr}"
  done
  f=$(ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so | head -n1)
  [ -f "$f" ] || bail "the rxe verbs provider is missing (package ibverbs-providers)"
  copy_elf "$f" "$f"
  cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/" || bail "no /etc/libibverbs.d/rxe.driver"
  f=$(ldconfig -p | awk '$1 == "libgcc_s.so.1" && $NF ~ /x86_64|\/lib\// { print $NF; exit }')
  copy_elf "${f:-/lib/x86_64-linux-gnu/libgcc_s.so.1}" /lib/x86_64-linux-gnu/libgcc_s.so.1
  for f in "${bins[@]}"; do
    case $(basename "$f") in *.so | *.so.*) copy_elf "$f" "/opt/tpf/lib/$(basename "$f")" ;;
      *) copy_elf "$f" "/opt/tpf/bin/$(basename "$f")"; chmod 755 "$root/opt/tpf/bin/$(basename "$f")" ;; esac
  done
  cp /bin/busybox "$root/usr/bin/busybox" || bail "no /bin/busybox (package busybox-static)"
  busybox --list-full | while read -r t; do
    [ -e "$root/$t" ] || [ -L "$root/$t" ] || ln -s /usr/bin/busybox "$root/$t"
  done
  cp "$kdir"/modules/*.ko "$kdir/modules/load.list" "$root/usr/lib/modules/tpf/"
  cp "$here/guest-init.sh" "$root/init" && chmod 755 "$root/init"
  cp "$here/guest-lib.sh" "$here/verbs-lib.sh" "$here/../common/tap-lib.sh" "$here/../common/group-lib.sh" "$root/opt/tpf/"
  for f in "${scens[@]}"; do cp "$f" "$root/opt/tpf/scenarios/"; done
  printf '%s\n' /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /opt/tpf/lib >"$root/etc/ld.so.conf"
  echo "root:x:0:0:root:/root:/bin/bash" >"$root/etc/passwd"
  echo "root:x:0:" >"$root/etc/group"
  echo "127.0.0.1 localhost" >"$root/etc/hosts"
  cat >"$root/etc/tpf-vm.env" <<EOF
TPF_KVER=$(cat "$kdir/kver")
TPF_SCENARIO_TIMEOUT=${TPF_VM_SCENARIO_TIMEOUT:-300}
TPF_BIN=/opt/tpf/bin
TPF_GUEST_LIB=/opt/tpf/guest-lib.sh
$(guest_topology)
EOF
  # Scenario knobs from the host (50-chaos: TPF_CHAOS_SEED, _SECONDS, _ROUNDS); numbers only.
  env | grep -E '^TPF_CHAOS_[A-Z_]+=[0-9]+$' >>"$root/etc/tpf-vm.env"
  ldconfig -r "$root" 2>/dev/null || log "warning: ldconfig -r failed (not root?); the guest relies on LD_LIBRARY_PATH"
  (cd "$root" && find . -print0 | cpio --null -o -H newc -R 0:0 --quiet) >"$work/initrd.cpio" ||
    bail "cpio of the initramfs failed"
}

ensure_packages
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 is not installed and could not be"
fetch_kernel
work=$(mktemp -d "${TMPDIR:-/tmp}/tpf-vm.XXXXXX") || bail "mktemp failed"
qpid=""
cleanup() {
  [ -n "$qpid" ] && kill "$qpid" 2>/dev/null   # timeout passes it on to qemu
  [ -n "${TPF_VM_KEEP:-}" ] && log "kept $work" || rm -rf "$work"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM
root=$work/root
t0=$SECONDS
build_initramfs
log "kernel $(basename "$kdir"), initramfs $(($(stat -c %s "$work/initrd.cpio") / 1024)) KiB in $((SECONDS - t0)) s; booting (limit $(left) s)"
[ "$(left)" -gt 10 ] || bail "no time left to boot (TPF_VM_TIMEOUT=$timeout_s)"

boot_guest 2048 ""
merge_tap last-console.log
[ $ok -eq 0 ] || fail_with_console last-console.log
log "all passed (console log: $cache/last-console.log)"
exit 0
