# tests/vm/host-lib.sh: host-side helpers shared by run.sh (the busybox guest)
# and systemd-run.sh (the Debian guest with systemd as PID 1). Sourced; the
# caller defines pkgs (Debian packages it needs), cache, sudo and the
# functions log, bail, skip and left (run.sh's header says what each does).

ensure_packages() {
  local missing=() p
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  timeout "$(left)" $sudo apt-get update -qq >&2 &&
    timeout "$(left)" $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    skip "cannot install ${missing[*]} with apt-get (no network or no root?); install them and rerun"
}

# Prints the concrete kernel package (linux-image-6.1.0-N-amd64) and its version.
kernel_candidate() {
  local pkg
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
  [ -n "$pkg" ] || return 1
  echo "$pkg $(apt-cache show --no-all-versions "$pkg" 2>/dev/null | awk '/^Version:/ { print $2; exit }')"
}

# Sets kdir to a cache dir holding vmlinuz, modules/*.ko and modules/load.list.
fetch_kernel() {
  mkdir -p "$cache/kernel" || bail "cannot create cache dir $cache (set TPF_VM_CACHE)"
  exec 9>"$cache/lock"
  flock -w "$(left)" 9 || bail "timed out waiting for the cache lock $cache/lock"
  local cand pkg ver tmp x kver m
  cand=$(kernel_candidate) || { timeout "$(left)" $sudo apt-get update -qq >&2; cand=$(kernel_candidate); }
  read -r pkg ver <<<"$cand"
  kdir=$cache/kernel/${pkg#linux-image-}_${ver//[^A-Za-z0-9.+~-]/_}
  if [ -n "$pkg" ] && [ -f "$kdir/ok" ]; then exec 9>&-; return 0; fi
  rm -rf "$cache"/tmp.*   # left by a run that was killed; we hold the lock
  tmp=$(mktemp -d "$cache/tmp.XXXXXX") || bail "cannot write to $cache"
  if [ -n "$pkg" ]; then
    log "fetching kernel $pkg $ver"
    (cd "$tmp" && timeout "$(left)" apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2)
  fi
  x=$(ls "$tmp"/*.deb 2>/dev/null | head -n1)
  if [ -z "$x" ]; then
    rm -rf "$tmp"; exec 9>&-
    kdir=$(ls -dt "$cache"/kernel/*/ok 2>/dev/null | head -n1); kdir=${kdir%/ok}
    [ -n "$kdir" ] || skip "cannot download the Debian kernel package ${pkg:-linux-image-amd64} (no network?) and none is cached in $cache"
    log "warning: cannot download ${pkg:-the kernel}; using the cached $(basename "$kdir")"
    return 0
  fi
  dpkg -x "$x" "$tmp/x" || bail "dpkg -x $x failed"
  kver=$(ls "$tmp/x/lib/modules" | head -n1)
  [ -f "$tmp/x/boot/vmlinuz-$kver" ] || bail "no boot/vmlinuz-$kver in $x"
  depmod -b "$tmp/x" "$kver" || bail "depmod -b $tmp/x $kver failed"
  mkdir -p "$tmp/k/modules"
  cp "$tmp/x/boot/vmlinuz-$kver" "$tmp/k/vmlinuz"; echo "$kver" >"$tmp/k/kver"
  # crc32_generic first: rxe needs the crc32 shash and modules.dep does not say so.
  local deps=""
  for m in crc32_generic rdma_rxe rdma_ucm veth; do
    deps+=$(modprobe -d "$tmp/x" -S "$kver" --show-depends "$m") ||
      bail "modprobe --show-depends $m failed for $kver in $x"
    deps+=$'\n'
  done
  for m in $(awk '$1 == "insmod" && !seen[$2]++ { print $2 }' <<<"$deps"); do
    case $m in *.ko) ;; *) bail "compressed kernel module $m is not supported" ;; esac
    cp "$m" "$tmp/k/modules/" && basename "$m" >>"$tmp/k/modules/load.list" || bail "cannot copy $m"
  done
  grep -q '^rdma_rxe.ko$' "$tmp/k/modules/load.list" || bail "rdma_rxe.ko not found in $pkg"
  touch "$tmp/k/ok"
  rm -rf "$kdir" && mv "$tmp/k" "$kdir" && rm -rf "$tmp"
  find "$cache/kernel" -mindepth 1 -maxdepth 1 ! -path "$kdir" -exec rm -rf {} +
  exec 9>&-
}

# boot_guest MEM_MB APPEND: boots $kdir/vmlinuz with $work/initrd.cpio under
# QEMU (TCG unless TPF_VM_ACCEL says otherwise) until the guest powers off or
# the run's time is up; console on $work/console.log, TAP on $work/tap.log.
# Sets stopped (why the guest stopped, for tap-merge.awk).
boot_guest() {
  local mem=$1 append=$2 t0=$SECONDS qrc
  timeout -k 10 "$(left)" qemu-system-x86_64 -accel "${TPF_VM_ACCEL:-tcg,thread=multi}" -cpu "${TPF_VM_CPU:-max}" \
    -m "${TPF_VM_MEM:-$mem}" -smp 2 -nographic -nic none -no-reboot -monitor none \
    -serial "file:$work/console.log" -serial "file:$work/tap.log" \
    -kernel "$kdir/vmlinuz" -initrd "$work/initrd.cpio" \
    -append "console=ttyS0 quiet panic=-1 $append ${TPF_VM_APPEND:-}" </dev/null >"$work/qemu.log" 2>&1 &
  qpid=$!
  [ -n "${TPF_VM_VERBOSE:-}" ] && tail -n +1 -F --pid=$qpid "$work/console.log" 2>/dev/null >&2 &
  wait $qpid
  qrc=$?
  qpid=""
  log "guest ran $((SECONDS - t0)) s (qemu status $qrc)"
  if [ $qrc -eq 124 ] || [ $qrc -eq 137 ]; then stopped="global timeout TPF_VM_TIMEOUT=${timeout_s}s hit"
  elif grep -q '@@TPFVM@@ done' "$work/tap.log" 2>/dev/null; then stopped="guest finished"
  else stopped="guest stopped early, qemu status $qrc: see the console log"; fi
}

# merge_tap CONSOLE_COPY: one TAP stream over every scenario of $scens (a
# result for each, whatever the guest printed), on stdout and in
# $work/tap.out (and $TPF_VM_TAP_OUT); the console kept as
# $cache/CONSOLE_COPY. Sets ok (0: every scenario passed).
merge_tap() {
  local names="" f
  for f in "${scens[@]}"; do names+="$(basename "$f" .sh) "; done
  awk -v scenarios="$names" -v stopped="$stopped" -f "$here/tap-merge.awk" "$work/tap.log" >"$work/tap.out"
  ok=$?
  cat "$work/tap.out"
  [ -n "${TPF_VM_TAP_OUT:-}" ] && cp "$work/tap.out" "$TPF_VM_TAP_OUT"
  cp "$work/console.log" "$cache/$1" 2>/dev/null
}

# fail_with_console CONSOLE_COPY: exit 1 after the last console lines and what qemu said.
fail_with_console() {
  log "FAILED. Last lines of the guest console (all of it: $cache/$1):"
  tail -n "${TPF_VM_LOG_LINES:-150}" "$work/console.log" | sed 's/^/  | /' >&2
  [ -s "$work/qemu.log" ] && { log "qemu said:"; sed 's/^/  | /' "$work/qemu.log" >&2; }
  exit 1
}

# The guest's two "nodes" (tests/vm/README.md, "The guest"), as lines of its
# /etc/tpf-vm.env: the rxe devices, IPs and veths of each, one per rail.
guest_topology() {
  cat <<'EOF'
TPF_NODE_A_DEVS="rxe0 rxe2"
TPF_NODE_A_IPS="10.77.0.1 10.78.0.1"
TPF_NODE_A_NETDEVS="veth0 veth2"
TPF_NODE_B_DEVS="rxe1 rxe3"
TPF_NODE_B_IPS="10.77.0.2 10.78.0.2"
TPF_NODE_B_NETDEVS="veth1 veth3"
EOF
}

