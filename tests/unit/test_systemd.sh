#!/bin/sh
# Verifies the shipped systemd files with systemd's own tools:
#   systemd-analyze verify   on the generated tpfabricd.service, its ExecStart pointed at $1
#   systemd-sysusers         on systemd/tpfabric.sysusers, into a scratch root
#   systemd-tmpfiles         on the generated tpfabric.tmpfiles, into that scratch root
# Usage: test_systemd.sh PATH_TO_TPFABRICD BUILD/systemd/tpfabricd.service
# (any existing executable will do; tpfabric.tmpfiles is read beside the unit).
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
exit $status
