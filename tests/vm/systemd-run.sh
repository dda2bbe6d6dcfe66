#!/usr/bin/env bash
# tests/vm/systemd-run.sh: the Debian packages (debian/) installed and run the
# way operators do it, in a QEMU guest whose PID 1 is systemd: a Debian 12
# root file system (mmdebstrap, from this machine's apt sources; built once
# and cached) booted with the same kernel and soft-RoCE topology as run.sh.
# The guest runs tests/vm/guest-init.sh as a service, which builds the
# topology and runs the scenarios (default tests/vm/systemd/*.sh) with the
# .debs in /opt/tpf/debs. One TAP stream on stdout, as run.sh prints.
#
#   tests/vm/systemd-run.sh --debs DIR [--bin FILE]... [--scenario FILE]...
#                           [--break-unit SED] [--expect-fail REGEX]
#     --debs DIR         the .debs of `dpkg-buildpackage -b` (tpfabricd_*.deb, ...)
#     --bin FILE         copied to /opt/tpf/bin (tpf-testrank); the Debian packages
#                        of its libraries go into the root file system
#     --scenario FILE    run only these (default: tests/vm/systemd/*.sh)
#     --break-unit SED   a deliberate break: the guest gets a scratch copy of
#                        tpfabricd_*.deb whose unit is edited by this sed script
#     --expect-fail REGEX  exit 0 only if the run FAILED and its TAP output matches
#                        REGEX (with --break-unit: the break is caught and named)
#
# Exit: 0 all passed, 1 anything failed, 77 (or $TPF_VM_SKIP_RC) QEMU, the
# kernel or the root file system cannot be obtained here. Environment as
# run.sh (README.md); TPF_VM_CACHE holds the root file system too (about 300 MB).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
timeout_s=${TPF_VM_TIMEOUT:-1200}
cache=${TPF_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpfabric-vm}
# shellcheck disable=SC2034  # host-lib.sh installs them
pkgs=(qemu-system-x86 mmdebstrap cpio kmod dpkg-dev)

log() { echo "vm-systemd: $*" >&2; }
bail() { echo "Bail out! vm-systemd: $*"; log "error: $*"; exit 1; }
skip() { echo "1..0 # SKIP vm-systemd: $*"; log "SKIPPED (not passed): $*"; exit "${TPF_VM_SKIP_RC:-77}"; }
left() { echo $((timeout_s - SECONDS)); }
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
# shellcheck source=host-lib.sh
. "$here/host-lib.sh"

debs="" bins=() scens=() break_unit="" expect_fail=""
while [ $# -gt 0 ]; do
  case $1 in
    --debs | --bin | --scenario | --break-unit | --expect-fail) [ $# -ge 2 ] || bail "$1 needs a value" ;;&
    --debs) debs=$2; shift 2 ;;
    --bin) bins+=("$2"); shift 2 ;;
    --scenario) scens+=("$2"); shift 2 ;;
    --break-unit) break_unit=$2; shift 2 ;;
    --expect-fail) expect_fail=$2; shift 2 ;;
    -h | --help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
    *) bail "unknown argument '$1' (see $0 --help)" ;;
  esac
done
[ -n "$debs" ] || bail "--debs DIR is required (the output of dpkg-buildpackage -b)"
[ ${#scens[@]} -gt 0 ] || scens=("$here"/systemd/*.sh)
for f in "${bins[@]}" "${scens[@]}"; do [ -f "$f" ] || bail "no such file: $f"; done
ours=(tpfabricd libtpfabric0 libtpfabric-dev tpfabric-tools python3-tpfabric)
for p in "${ours[@]}"; do
  ls "$debs/${p}_"*.deb >/dev/null 2>&1 || bail "no ${p}_*.deb in $debs (build them: dpkg-buildpackage -b)"
done

# The root file system's packages: systemd, the RDMA userspace the scenarios
# use, and every dependency of our packages and of the --bin files, so that
# `apt install ./*.deb` in the guest needs no network.
rootfs_pkgs() {
  local f p lib
  printf '%s\n' systemd systemd-sysv udev kmod iproute2 rdma-core ibverbs-providers ibverbs-utils procps
  for p in "${ours[@]}"; do
    f=$(ls "$debs/${p}_"*.deb | head -n1)
    # "a (>= 1), b | c" -> a b (the first of alternatives), our own packages left out
    dpkg-deb -f "$f" Depends Pre-Depends | tr ',' '\n' | sed 's/|.*//; s/(.*)//; s/:any//; s/^[A-Za-z-]*: //' |
      tr -d ' ' | grep -v '^$'
  done | grep -vxF -f <(printf '%s\n' "${ours[@]}")
  for f in "${bins[@]}"; do
    for lib in $(ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'); do
      p=$(dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null) && echo "${p%%:*}"
    done
  done
}

# Sets rootfs to a cached cpio of a Debian 12 root file system with systemd.
build_rootfs() {
  local list key tmp sources=()
  mapfile -t list < <(rootfs_pkgs | sort -u)
  # The recipe's own version (bump it when the hooks below change) and the package list name the cache entry.
  key=$( (echo recipe-1; printf '%s\n' "${list[@]}") | sha256sum | cut -c1-16)
  rootfs=$cache/rootfs/bookworm-$key.cpio
  mkdir -p "$cache/rootfs" || bail "cannot create $cache/rootfs"
  exec 8>"$cache/rootfs/lock"
  flock -w "$(left)" 8 || bail "timed out waiting for $cache/rootfs/lock"
  if [ -f "$rootfs" ]; then exec 8>&-; return 0; fi
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && grep -q bookworm "$f" && sources+=("$f")
  done
  [ ${#sources[@]} -gt 0 ] || skip "no bookworm entry in this machine's apt sources to build the root file system from"
  rm -rf "$cache"/rootfs/tmp.*
  tmp=$(mktemp -d "$cache/rootfs/tmp.XXXXXX") || bail "cannot write to $cache/rootfs"
  log "building the root file system (once; cached as $(basename "$rootfs")): ${list[*]}"
  # Masked: timers that would wake apt and friends mid-scenario, and the getty the
  # serial console would get (the console carries the scenario's output).
  if ! timeout "$(left)" $sudo mmdebstrap --quiet --variant=minbase --mode=root \
      --include="$(IFS=,; echo "${list[*]}")" \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --customize-hook='echo tpfvm >"$1/etc/hostname"; echo "127.0.1.1 tpfvm" >>"$1/etc/hosts"' \
      --customize-hook='chroot "$1" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer serial-getty@ttyS0.service getty@tty1.service systemd-timesyncd.service >/dev/null 2>&1; true' \
      bookworm "$tmp/root" "${sources[@]}" >"$tmp/mmdebstrap.log" 2>&1; then
    tail -n 30 "$tmp/mmdebstrap.log" | sed 's/^/  | /' >&2
    rm -rf "$tmp"; exec 8>&-
    skip "mmdebstrap could not build the root file system (no network?); see above"
  fi
  (cd "$tmp/root" && find . -print0 | cpio --null -o -H newc --quiet) >"$tmp/rootfs.cpio" || bail "cpio of the root file system failed"
  mv "$tmp/rootfs.cpio" "$rootfs" && rm -rf "$tmp"
  find "$cache/rootfs" -name 'bookworm-*.cpio' ! -path "$rootfs" -delete   # older recipes
  exec 8>&-
  log "root file system: $(($(stat -c %s "$rootfs") / 1048576)) MiB"
}

# The per-run part of the initramfs, unpacked over the root file system: the
# .debs, the scenarios and their libraries, the modules and the service that runs them.
build_overlay() {
  local o=$work/overlay f x
  mkdir -p "$o"/opt/tpf/{bin,debs,debs-upgrade,scenarios} "$o/usr/lib/modules/tpf" \
    "$o/etc/systemd/system/multi-user.target.wants" || bail "mkdir in $o"
  for f in "${ours[@]}"; do cp "$(ls "$debs/${f}_"*.deb | head -n1)" "$o/opt/tpf/debs/"; done
  if [ -n "$break_unit" ]; then
    # The deliberate break: a scratch copy of tpfabricd_*.deb, its unit edited.
    x=$work/break; f=$(ls "$o"/opt/tpf/debs/tpfabricd_*.deb)
    dpkg-deb -R "$f" "$x" && sed -i -e "$break_unit" "$x"/lib/systemd/system/tpfabricd.service &&
      dpkg-deb -b -Zgzip "$x" "$f" >/dev/null || bail "cannot make the broken copy of $(basename "$f")"
    log "deliberate break: the unit differs from the shipped one by"
    dpkg-deb --fsys-tarfile "$debs/$(basename "$f")" | tar -xO ./lib/systemd/system/tpfabricd.service |
      diff - "$x"/lib/systemd/system/tpfabricd.service | sed 's/^/  | /' >&2
  fi
  # The upgrade: the same tpfabricd with a higher version, as a rebuild would be.
  x=$work/upgrade; f=$(ls "$o"/opt/tpf/debs/tpfabricd_*.deb)
  dpkg-deb -R "$f" "$x" || bail "dpkg-deb -R $f"
  sed -i 's/^Version: .*/&+vmupgrade1/' "$x/DEBIAN/control"
  dpkg-deb -b -Zgzip "$x" "$o/opt/tpf/debs-upgrade/" >/dev/null || bail "cannot build the upgrade of $(basename "$f")"
  for f in "${bins[@]}"; do
    cp -L "$f" "$o/opt/tpf/bin/" && objcopy --strip-debug "$o/opt/tpf/bin/$(basename "$f")" 2>/dev/null
  done
  for f in "${scens[@]}"; do cp "$f" "$o/opt/tpf/scenarios/"; done
  cp "$here/guest-init.sh" "$here/guest-lib.sh" "$here/verbs-lib.sh" "$here/../common/tap-lib.sh" \
    "$here/../common/group-lib.sh" "$o/opt/tpf/"
  cp "$kdir"/modules/*.ko "$kdir/modules/load.list" "$o/usr/lib/modules/tpf/"
  cat >"$o/etc/systemd/system/tpf-vm.service" <<'EOF'
[Unit]
Description=tpfabric VM scenarios (tests/vm/systemd-run.sh)
[Service]
Type=simple
ExecStart=/bin/bash /opt/tpf/guest-init.sh
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity
EOF
  ln -s ../tpf-vm.service "$o/etc/systemd/system/multi-user.target.wants/tpf-vm.service"
  cat >"$o/etc/tpf-vm.env" <<EOF
TPF_KVER=$(cat "$kdir/kver")
TPF_SCENARIO_TIMEOUT=${TPF_VM_SCENARIO_TIMEOUT:-900}
TPF_BIN=/opt/tpf/bin
TPF_GUEST_LIB=/opt/tpf/guest-lib.sh
TPF_DEBS=/opt/tpf/debs
TPF_DEBS_UPGRADE=/opt/tpf/debs-upgrade
$(guest_topology)
EOF
  (cd "$o" && find . -print0 | cpio --null -o -H newc -R 0:0 --quiet) >"$work/overlay.cpio" || bail "cpio of the overlay failed"
}

[ -n "$expect_fail" ] || [ -z "$break_unit" ] || log "note: --break-unit without --expect-fail: this run should fail"
ensure_packages
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 is not installed and could not be"
command -v mmdebstrap >/dev/null || skip "mmdebstrap is not installed and could not be"
fetch_kernel
t0=$SECONDS
build_rootfs
log "root file system ready in $((SECONDS - t0)) s"
work=$(mktemp -d "${TMPDIR:-/tmp}/tpf-vm-systemd.XXXXXX") || bail "mktemp failed"
qpid=""
cleanup() {
  [ -n "$qpid" ] && kill "$qpid" 2>/dev/null
  [ -n "${TPF_VM_KEEP:-}" ] && log "kept $work" || rm -rf "$work"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM
build_overlay
# One initramfs: the cached root file system, then this run's files over it.
cat "$rootfs" "$work/overlay.cpio" >"$work/initrd.cpio" || bail "cannot write $work/initrd.cpio"
log "kernel $(basename "$kdir"), initramfs $(($(stat -c %s "$work/initrd.cpio") / 1048576)) MiB; booting (limit $(left) s)"
[ "$(left)" -gt 10 ] || bail "no time left to boot (TPF_VM_TIMEOUT=$timeout_s)"

# systemd runs from the initramfs as the real root (no /etc/initrd-release there).
boot_guest 3072 "rdinit=/lib/systemd/systemd systemd.show_status=error"
merge_tap last-systemd-console.log
if [ -n "$expect_fail" ]; then
  if [ $ok -eq 0 ]; then log "FAILED: the run passed, but --expect-fail wanted it to fail"; exit 1; fi
  if grep -Eq "$expect_fail" "$work/tap.out"; then
    log "the run failed as expected; the failure says: $(grep -E "$expect_fail" "$work/tap.out" | head -n 3)"
    exit 0
  fi
  log "FAILED: the run failed, but no line of its TAP output matches --expect-fail '$expect_fail'"
  exit 1
fi
[ $ok -eq 0 ] || fail_with_console last-systemd-console.log
log "all passed (console log: $cache/last-systemd-console.log)"
exit 0
