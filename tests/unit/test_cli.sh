#!/bin/sh
# The command lines of tpfabricd and tpfabricctl: usage errors exit 2 and name
# the program (the unit's RestartPreventExitStatus=2 relies on it), --help and
# --version exit 0, and `tpfabricd --check-config FILE` validates a file:
# 0 for a good one (the shipped example among them), 2 naming the key for a
# bad one, 2 for a missing one. Nothing here starts a daemon.
# Usage: test_cli.sh TPFABRICD TPFABRICCTL   (TPF_SOURCE_ROOT: the source tree)
set -u
d=$1 ctl=$2
src=${TPF_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tpf_cli.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
fails=0

# expect STATUS PATTERN CMD...: exit status STATUS and PATTERN (grep -E) in stdout+stderr.
expect() {
    want=$1 pattern=$2
    shift 2
    out=$("$@" 2>&1)
    got=$?
    if [ "$got" -ne "$want" ]; then
        echo "FAIL: $* exited $got, wanted $want; output: $out"
        fails=$((fails + 1))
    elif ! printf '%s\n' "$out" | grep -Eq -- "$pattern"; then
        echo "FAIL: $* printed no line matching '$pattern'; output: $out"
        fails=$((fails + 1))
    else
        echo "ok: $* -> $got"
    fi
}

expect 0 "Usage:" "$d" --help
expect 0 "^[0-9]+\.[0-9]+\.[0-9]+" "$d" --version
expect 2 "^tpfabricd: .*--no-such-flag" "$d" --no-such-flag
expect 2 "^tpfabricd: " "$d" --socket
expect 2 "^tpfabricd: " "$d" stray-argument
expect 2 "^tpfabricd: --log-level: .loud. is not allowed" "$d" --log-level loud

cp "$src/systemd/tpfabricd.conf.example" "$tmp/example.conf"
expect 0 "configuration is valid" "$d" --check-config "$tmp/example.conf"
printf '[daemon]\nmax_bytes = "512KiB"\n' >"$tmp/good.conf"
expect 0 "good.conf: configuration is valid" "$d" --check-config "$tmp/good.conf"
printf '[daemon]\nmax_bytes = "lots"\n' >"$tmp/bad.conf"
expect 2 "daemon.max_bytes" "$d" --check-config "$tmp/bad.conf"
printf '[daemon]\nmax_byte = 4096\n' >"$tmp/typo.conf"
expect 2 "daemon.max_byte.*unknown key" "$d" --check-config "$tmp/typo.conf"
expect 2 "cannot read config file" "$d" --check-config "$tmp/missing.conf"
expect 2 "cannot read config file" "$d" --config "$tmp/missing.conf"

expect 0 "Usage:" "$ctl" --help
expect 2 "^tpfabricctl: " "$ctl" --no-such-flag
expect 2 "^tpfabricctl: " "$ctl"
expect 2 "^tpfabricctl: " "$ctl" status --json --bogus
expect 2 "^tpfabricctl: " "$ctl" layout --world 99

if [ "$fails" -ne 0 ]; then
    echo "$fails check(s) failed"
    exit 1
fi
echo "all command-line checks passed"
