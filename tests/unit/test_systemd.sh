#!/bin/sh
# Verifies the shipped systemd files with systemd's own tools:
#   systemd-analyze verify   on the generated tpfabricd.service, its ExecStart pointed at $1
#   systemd-sysusers         on systemd/tpfabric.sysusers, into a scratch root
#   systemd-tmpfiles         on the generated tpfabric.tmpfiles, into that scratch root
#   install_config.sh        twice into a scratch DESTDIR: the config is created once,
#                            then kept, and each run's line lands in meson-logs
# Usage: test_systemd.sh PATH_TO_TPFABRICD BUILD/systemd/tpfabricd.service
# (tpfabricd itself: its --help must give exit status 2 the unit's RestartPreventExitStatus=;
# tpfabric.tmpfiles is read beside the unit).
# Exits 77 (skip) where systemd-analyze is missing.
set -u

if [ $# -ne 2 ]; then
    echo "usage: $0 PATH_TO_TPFABRICD BUILD/systemd/tpfabricd.service" >&2
    exit 2
fi
case $1 in
/*) exe=$1 ;;
*) exe=$(pwd)/$1 ;;
esac
if [ ! -x "$exe" ] || [ -d "$exe" ]; then
    echo "FAIL: $exe is not an executable file" >&2
    exit 1
fi

src=${TPF_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
unit=$2
tmpfiles=$(dirname "$unit")/tpfabric.tmpfiles
for f in "$unit" "$src/systemd/tpfabric.sysusers" "$tmpfiles"; do
    if [ ! -f "$f" ]; then
        echo "FAIL: $f not found (set TPF_SOURCE_ROOT to the source tree)" >&2
        exit 1
    fi
done

if ! command -v systemd-analyze >/dev/null 2>&1; then
    echo "SKIP: systemd-analyze not found (Debian package: systemd)"
    exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tpf_systemd.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

# Meson filled in every path: nothing of the template is left.
if grep -q '@sbindir@\|@sysconfdir@\|@docdir@' "$unit" "$tmpfiles"; then
    echo "FAIL: $unit or $tmpfiles still holds a @...@ placeholder" >&2
    exit 1
fi
# The copy differs from the generated unit only in the executable it starts.
grep -q '^ExecStart=/[^ ]*/sbin/tpfabricd --config /[^ ]*/tpfabric/tpfabricd.conf$' "$unit" || {
    echo "FAIL: $unit has no 'ExecStart=PREFIX/sbin/tpfabricd --config SYSCONFDIR/tpfabric/tpfabricd.conf' line" >&2
    exit 1
}
sed "s|^ExecStart=[^ ]*/tpfabricd |ExecStart=$exe |" "$unit" >"$tmp/tpfabricd.service"
# The exit status the unit does not restart on is the one --help gives a bad configuration.
grep -q '^RestartPreventExitStatus=2$' "$unit" && "$exe" --help | grep -q '2 bad usage or configuration.*RestartPreventExitStatus=2' || {
    echo "FAIL: $unit's RestartPreventExitStatus= and tpfabricd --help's exit status 2 disagree" >&2
    exit 1
}

status=0
# --man=no: the Documentation= page is a file, not a man page.
systemd-analyze verify --man=no "$tmp/tpfabricd.service" >"$tmp/verify.out" 2>&1
rc=$?
# Warnings about our unit (unknown keys, bad values) fail the test too; other
# units of this host that verify happens to load are not ours to judge.
if [ $rc -ne 0 ] || grep -q 'tpfabricd\.service' "$tmp/verify.out"; then
    echo "FAIL: systemd-analyze verify tpfabricd.service (exit $rc):"
    cat "$tmp/verify.out"
    status=1
else
    echo "ok: systemd-analyze verify tpfabricd.service"
fi

if command -v systemd-sysusers >/dev/null 2>&1; then
    mkdir -p "$tmp/root/etc"
    if systemd-sysusers --root="$tmp/root" "$src/systemd/tpfabric.sysusers" >"$tmp/sysusers.out" 2>&1 &&
        grep -q '^tpfabric:' "$tmp/root/etc/group"; then
        echo "ok: systemd-sysusers tpfabric.sysusers creates group tpfabric"
    else
        echo "FAIL: systemd-sysusers tpfabric.sysusers:"
        cat "$tmp/sysusers.out"
        status=1
    fi
    if command -v systemd-tmpfiles >/dev/null 2>&1; then
        confdir=$(awk '$1 == "d" {print $2}' "$tmpfiles")
        if systemd-tmpfiles --root="$tmp/root" --create "$tmpfiles" >"$tmp/tmpfiles.out" 2>&1 &&
            [ -n "$confdir" ] && [ -d "$tmp/root$confdir" ] && [ ! -s "$tmp/tmpfiles.out" ]; then
            echo "ok: systemd-tmpfiles tpfabric.tmpfiles creates $confdir"
        else
            echo "FAIL: systemd-tmpfiles tpfabric.tmpfiles:"
            cat "$tmp/tmpfiles.out"
            status=1
        fi
    fi
fi
# The install script (meson.add_install_script): creates tpfabricd.conf once, then keeps the
# operator's, and records each run in BUILDDIR/meson-logs/tpfabric-install.txt, since meson
# 1.0 shows nothing a successful install script prints.
mkdir -p "$tmp/stage/usr/local/etc/tpfabric" "$tmp/build/meson-logs"
cp "$src/systemd/tpfabricd.conf.example" "$tmp/stage/usr/local/etc/tpfabric/"
runInstall() {
    DESTDIR="$tmp/stage" MESON_INSTALL_PREFIX=/usr/local MESON_BUILD_ROOT="$tmp/build" \
        sh "$src/systemd/install_config.sh" etc/tpfabric
}
log=$tmp/build/meson-logs/tpfabric-install.txt
first=$(runInstall) && cmp -s "$src/systemd/tpfabricd.conf.example" "$tmp/stage/usr/local/etc/tpfabric/tpfabricd.conf" &&
    [ "$first" = "tpfabric: installed /usr/local/etc/tpfabric/tpfabricd.conf from tpfabricd.conf.example" ] &&
    grep -qF "DESTDIR=$tmp/stage: $first" "$log"
rc1=$?
echo "# operator's edit" >>"$tmp/stage/usr/local/etc/tpfabric/tpfabricd.conf"
second=$(runInstall) && grep -q "operator's edit" "$tmp/stage/usr/local/etc/tpfabric/tpfabricd.conf" &&
    [ "$second" = "tpfabric: keeping the existing /usr/local/etc/tpfabric/tpfabricd.conf (the new example is /usr/local/etc/tpfabric/tpfabricd.conf.example)" ] &&
    [ "$(wc -l <"$log")" -eq 2 ] && tail -n 1 "$log" | grep -q "keeping the existing /usr/local/etc/tpfabric/tpfabricd.conf"
rc2=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]; then
    echo "ok: install_config.sh creates tpfabricd.conf once, keeps it after, and logs each run in meson-logs"
else
    echo "FAIL: install_config.sh (first: '$first', second: '$second'); meson-logs/tpfabric-install.txt:"
    cat "$log" 2>/dev/null
    status=1
fi
exit $status
