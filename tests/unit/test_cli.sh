#!/bin/sh
# The command lines of tpfabricd and tpfabricctl: usage errors exit 2 and name
# the program (the unit's RestartPreventExitStatus=2 relies on it), --help and
# --version exit 0, and `tpfabricd --check-config FILE` validates a file:
# 0 for a good one (the shipped example among them), 2 naming the key for a
# bad one, 2 for a missing one. tpfabricctl's daemon options (--socket,
# --timeout-ms) go before or after the command; tpfabricd's socket path is
# checked before anything starts. Nothing here starts a daemon.
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

# Daemon options before or after the command; no daemon at $tmp/none.sock.
expect 1 "^tpfabricctl: .*none\.sock" "$ctl" --socket "$tmp/none.sock" status
expect 1 "^tpfabricctl: .*none\.sock" "$ctl" status --socket "$tmp/none.sock"
expect 1 "^tpfabricctl: .*none\.sock" "$ctl" --socket "$tmp/none.sock" --timeout-ms 100 metrics
expect 1 "^tpfabricctl: .*none\.sock" "$ctl" --timeout-ms 100 metrics --socket "$tmp/none.sock"
expect 1 "^tpfabricctl: .*none\.sock" "$ctl" --socket "$tmp/none.sock" status --json
expect 2 "^tpfabricctl: --timeout-ms" "$ctl" --timeout-ms 0 status
expect 2 "^tpfabricctl: --timeout-ms" "$ctl" status --timeout-ms 0
expect 0 "Daemon options" "$ctl" status --help

# The socket path: too long for sun_path, or something that is not a socket
# (left alone), or a missing directory (none created): exit 2 before anything
# starts (`timeout`: a daemon that starts anyway fails the check, 124, not the run).
expect 2 "at most 107" timeout 10 "$d" --foreground --socket "$tmp/$(printf '%0120d' 0).sock"
printf 'keep me\n' >"$tmp/notes"
expect 2 "notes exists and is not a socket" timeout 10 "$d" --foreground --socket "$tmp/notes"
if [ "$(cat "$tmp/notes")" != "keep me" ]; then
    echo "FAIL: tpfabricd --socket $tmp/notes changed the file"
    fails=$((fails + 1))
fi
expect 2 "no-such-dir does not exist" timeout 10 "$d" --foreground --socket "$tmp/no-such-dir/d.sock"
if [ -e "$tmp/no-such-dir" ]; then
    echo "FAIL: tpfabricd created $tmp/no-such-dir"
    fails=$((fails + 1))
fi

if [ "$fails" -ne 0 ]; then
    echo "$fails check(s) failed"
    exit 1
fi
echo "all command-line checks passed"
