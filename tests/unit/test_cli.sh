#!/bin/sh
# The command lines of tpfabricd and tpfabricctl: usage errors exit 2 and name
# the program (the unit's RestartPreventExitStatus=2 relies on it), --help and
# --version exit 0, and `tpfabricd --check-config FILE` validates a file:
# 0 for a good one (the shipped example among them), 2 naming the key for a
# bad one, 2 for a missing one, 2 for what the file cannot settle alone
# (proxy.cpu outside this process's CPUs, an unreadable or short
# peer.key_file), and the daemon refuses those at start with the same line;
# a peer.listen that is no address of this host: the check exits 2, a start
# 1 (retried: the address may come up late at boot). tpfabricd's flags follow
# the rules of the keys they override; an empty --socket is refused by both
# programs, and --config with --check-config is refused. tpfabricctl names an
# unknown command, a --socket that is no socket, and the owner and group of
# what refused it permission; its daemon options (--socket, --timeout-ms) go
# before or after the command; tpfabricd's socket path is checked before
# anything starts, by a start and by --check-config alike, and a failed start
# says why on stderr even at --log-level off; a socket directory the daemon
# may not write exits 2 (never retried), and a stopping daemon removes only
# the socket it made. One daemon runs for a moment
# (its start-up lines, a check while it serves, tpfabricctl's permissions) and
# is stopped (a second one on its peer port exits 1, naming the port's
# holder); nothing here keeps one running.
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

# Flags accept what the keys they override accept, no more; --config "" is no file.
# (`timeout`, a socket in $tmp: a daemon that starts anyway fails the check, 124, not the run.)
expect 2 "^tpfabricd: --log-level: .warning. is not allowed" timeout 10 "$d" --socket "$tmp/f.sock" --log-level warning
expect 2 "^tpfabricd: --log-level: .err. is not allowed" timeout 10 "$d" --socket "$tmp/f.sock" --log-level err
expect 2 "^tpfabricd: --socket: .rel\.sock. is not allowed; an absolute path of at most 107 bytes$" timeout 10 "$d" --socket rel.sock
expect 2 "^tpfabricd: --socket: .rel\.sock. is not allowed" "$d" --check-config "$tmp/good.conf" --socket rel.sock
expect 2 "^tpfabricd: --config: an empty path names no file" timeout 10 "$d" --config "" --socket "$tmp/f.sock"
expect 2 "^tpfabricd: --check-config: an empty path names no file" "$d" --check-config ""
# Keys with which a start runs but serves less: notes, exit 0.
printf '[daemon]\nsocket_group = "tpf-no-such-group"\n[verbs]\nhcas = ["tpf_no_such_hca"]\n' >"$tmp/degraded.conf"
expect 0 "note: daemon\.socket_group: no group 'tpf-no-such-group' on this host now" \
    "$d" --check-config "$tmp/degraded.conf" --socket "$tmp/degraded.sock"
expect 0 "note: verbs\.hcas: a start here would find no usable HCA port \(.*tpf_no_such_hca.*\): serving same-node groups only" \
    "$d" --check-config "$tmp/degraded.conf" --socket "$tmp/degraded.sock"
# A flag where a path belongs is the next flag taken as the value: named as such.
expect 2 "^tpfabricd: --check-config: got the flag '--config' where a file path belongs" "$d" --check-config --config "$tmp/x.conf"
expect 2 "^tpfabricd: --config: got the flag '--foreground' where a file path belongs" "$d" --config --foreground
expect 2 "^tpfabricd: --socket: an empty path names no socket" timeout 10 "$d" --socket ""
expect 2 "^tpfabricd: --socket: an empty path names no socket" "$d" --check-config "$tmp/good.conf" --socket ""
expect 2 "^tpfabricd: --config and --check-config both name a file: .*give --check-config alone" \
    timeout 10 "$d" --config "$tmp/good.conf" --check-config "$tmp/good.conf" --socket "$tmp/f.sock"

# What the file alone cannot settle: the check and the start refuse it alike, naming file, line and key.
# refused CONF SOCK CHECK_PATTERN START_PATTERN: --check-config CONF and a start on CONF (socket SOCK
# in $tmp) both exit 2, each printing a line that matches its pattern.
refused() {
    expect 2 "$3" "$d" --check-config "$1"
    expect 2 "$4" timeout 10 "$d" --foreground --config "$1" --socket "$tmp/$2"
}
# (4095: the highest proxy.cpu allowed; this process may run on it only on a machine of 4096 CPUs.)
printf '[proxy]\ncpu = 4095\n' >"$tmp/cpu.conf"
cpus=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
refused "$tmp/cpu.conf" cpu.sock \
    "^tpfabricd: .*cpu\.conf:2: proxy\.cpu: 4095 is not one of the CPUs this daemon may run on \($cpus\)" \
    "^tpfabricd: .*cpu\.conf:2: proxy\.cpu: 4095 is not one of the CPUs"
printf '[proxy]\ncpu = %s\n' "${cpus%%[-,]*}" >"$tmp/cpu-ok.conf"
expect 0 "configuration is valid" "$d" --check-config "$tmp/cpu-ok.conf"
printf '[peer]\nkey_file = "%s"\n' "$tmp/none.key" >"$tmp/nokey.conf"
refused "$tmp/nokey.conf" key.sock \
    "^tpfabricd: .*nokey\.conf:2: peer\.key_file: cannot read .*none\.key.: No such file" \
    "^tpfabricd: .*nokey\.conf:2: peer\.key_file: cannot read"
head -c 16 /dev/urandom >"$tmp/short.key"
chmod 0600 "$tmp/short.key"
printf '[peer]\nkey_file = "%s"\n' "$tmp/short.key" >"$tmp/shortkey.conf"
refused "$tmp/shortkey.conf" key.sock \
    "^tpfabricd: .*shortkey\.conf:2: peer\.key_file: .*short\.key. holds 16 bytes; a cluster key needs at least 32" \
    "^tpfabricd: .*shortkey\.conf:2: peer\.key_file: .* holds 16 bytes"
head -c 32 /dev/urandom >"$tmp/good.key"
chmod 0644 "$tmp/good.key"
printf '[peer]\nkey_file = "%s"\n' "$tmp/good.key" >"$tmp/goodkey.conf"
expect 0 "warning: .*goodkey\.conf:2: peer\.key_file: .* readable by group or others \(mode 644\); chmod 0600" \
    "$d" --check-config "$tmp/goodkey.conf"
# 192.0.2.1 (TEST-NET-1) is no host's address: the check refuses it (exit 2);
# a start fails to listen with exit 1, tried again (an address may come up late at boot).
printf '[peer]\nlisten = "192.0.2.1"\n' >"$tmp/listen.conf"
expect 2 "^tpfabricd: .*listen\.conf:2: peer\.listen: .192\.0\.2\.1. is not an address of this host" \
    "$d" --check-config "$tmp/listen.conf"
expect 1 "peer\.listen 192\.0\.2\.1 is not an address of this host \(yet\)" \
    timeout 10 "$d" --foreground --config "$tmp/listen.conf" --socket "$tmp/listen.sock"
printf '[peer]\nlisten = "127.0.0.1"\n' >"$tmp/listen-ok.conf"
expect 0 "configuration is valid" "$d" --check-config "$tmp/listen-ok.conf" --socket "$tmp/c.sock"
for s in cpu.sock key.sock listen.sock; do
    if [ -e "$tmp/$s" ]; then
        echo "FAIL: a refused start left $tmp/$s behind"
        fails=$((fails + 1))
    fi
done

expect 0 "Usage:" "$ctl" --help
expect 0 "Subcommands:" "$ctl" help
expect 0 "Usage: .*tpfabricctl status" "$ctl" help status
expect 2 "^tpfabricctl: unknown command 'bogus'; the commands are layout, status, metrics, help" "$ctl" bogus
expect 2 "^tpfabricctl: help: unknown command 'bogus'; the commands are layout, status, metrics, help" "$ctl" help bogus
expect 2 "^tpfabricctl: a command is required: layout, status, metrics, help" "$ctl"
printf 'not a socket\n' >"$tmp/plain"
expect 1 "^tpfabricctl: cannot reach tpfabricd: .*plain is a regular file, not a socket \(check --socket / TPF_SOCKET" \
    "$ctl" --socket "$tmp/plain" status
expect 1 "^tpfabricctl: cannot reach tpfabricd: .* is a directory, not a socket" env TPF_SOCKET="$tmp" "$ctl" metrics
expect 2 "^tpfabricctl: " "$ctl" --no-such-flag
expect 2 "^tpfabricctl: " "$ctl"
expect 2 "^tpfabricctl: status does not take '--bogus' \('tpfabricctl status --help' lists what it takes\)" "$ctl" status --json --bogus
# layout takes no daemon options: the words named in the order given
expect 2 "^tpfabricctl: layout does not take '--socket /x' \('tpfabricctl layout --help'" "$ctl" layout --socket /x
expect 2 "^tpfabricctl: --max-bytes: 0 is no cap" "$ctl" layout --max-bytes 0
expect 2 "^tpfabricctl: " "$ctl" layout --world 99
expect 2 "^tpfabricctl: layout reads no daemon: --socket is an option of status and metrics" "$ctl" --socket /x layout
expect 2 "^tpfabricctl: layout reads no daemon: --timeout-ms" "$ctl" --timeout-ms 5 layout
expect 2 "^tpfabricctl: --max-bytes: .*'1.5KiB': a whole number of bytes or units" "$ctl" layout --max-bytes 1.5KiB
expect 0 '"region_bytes"' "$ctl" --json layout --world 2
# An option whose value is missing, or took the command word
expect 2 "^tpfabricctl: --socket needs a value, then a command \(tpfabricctl --socket PATH status\)" "$ctl" --socket
expect 2 "^tpfabricctl: --socket took the command 'status' as its value: give the value first" "$ctl" --socket status
expect 2 "^tpfabricctl: --timeout-ms took the command 'metrics' as its value" "$ctl" --timeout-ms metrics
expect 2 "^tpfabricctl: metrics prints Prometheus text: --json is an option of status and layout" "$ctl" --json metrics

# Daemon options before or after the command; no daemon at $tmp/none.sock.
expect 1 "^tpfabricctl: .*none\.sock" "$ctl" --socket "$tmp/none.sock" status
expect 1 "^tpfabricctl: .*none\.sock" "$ctl" status --socket "$tmp/none.sock"
expect 1 "^tpfabricctl: .*none\.sock" "$ctl" --socket "$tmp/none.sock" --timeout-ms 100 metrics
expect 1 "^tpfabricctl: .*none\.sock" "$ctl" --timeout-ms 100 metrics --socket "$tmp/none.sock"
expect 1 "^tpfabricctl: .*none\.sock" "$ctl" --socket "$tmp/none.sock" status --json
expect 1 "^tpfabricctl: .*none\.sock" "$ctl" --json --socket "$tmp/none.sock" status
expect 2 "^tpfabricctl: --timeout-ms" "$ctl" --timeout-ms 0 status
expect 2 "^tpfabricctl: --timeout-ms" "$ctl" status --timeout-ms 0
expect 2 "^tpfabricctl: --timeout-ms: abc is not a whole number of milliseconds" "$ctl" status --timeout-ms abc
expect 0 "Daemon options" "$ctl" status --help

# The socket path: too long for sun_path, or something that is not a socket
# (left alone), or a missing directory (none created): exit 2 before anything
# starts (`timeout`: a daemon that starts anyway fails the check, 124, not the run).
# --check-config runs the same check of the socket path.
expect 2 "at most 107" timeout 10 "$d" --foreground --socket "$tmp/$(printf '%0120d' 0).sock"
expect 2 "at most 107" "$d" --check-config "$tmp/good.conf" --socket "$tmp/$(printf '%0120d' 0).sock"
printf 'keep me\n' >"$tmp/notes"
expect 2 "notes exists and is not a socket" timeout 10 "$d" --foreground --socket "$tmp/notes"
expect 2 "^tpfabricd: socket path .*notes exists and is not a socket \(a regular file\)" \
    "$d" --check-config "$tmp/good.conf" --socket "$tmp/notes"
ln -s "$tmp/notes" "$tmp/notes-link"
expect 2 "^tpfabricd: socket path .*notes-link exists and is not a socket \(a symbolic link\)" \
    "$d" --check-config "$tmp/good.conf" --socket "$tmp/notes-link"
expect 2 "^tpfabricd: socket path .*no-such-dir/d\.sock: its directory .*no-such-dir does not exist" \
    "$d" --check-config "$tmp/good.conf" --socket "$tmp/no-such-dir/d.sock"
printf '[daemon]\nsocket = "%s"\n' "$tmp/no-such-dir/d.sock" >"$tmp/nodir.conf"
expect 2 "^tpfabricd: socket path .*no-such-dir/d\.sock: its directory .*no-such-dir does not exist" \
    "$d" --check-config "$tmp/nodir.conf"
# The shipped unit's /run/tpfabric exists only while the unit runs: a note, not a failure.
if [ ! -e /run/tpfabric ]; then
    expect 0 "note: socket path /run/tpfabric/tpfabricd\.sock: its directory /run/tpfabric does not exist now; the unit's RuntimeDirectory= makes it" \
        env -u RUNTIME_DIRECTORY "$d" --check-config "$tmp/good.conf"
fi
# A socket directory this daemon may not write: a start exits 2 (a retry
# cannot fix it: under the unit, exit 1 would restart it every 2 s). Checked
# as the user nobody: --check-config run as another user than root (the
# unit's) only notes it, since the daemon may write what its checker may not.
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null 2>&1; then
    ro=$(mktemp -d "${TMPDIR:-/tmp}/tpf_cli_ro.XXXXXX")
    chmod 755 "$ro"
    : >"$ro/empty.conf"
    chmod 644 "$ro/empty.conf"
    expect 0 "^tpfabricd: note: socket path $ro/d\.sock: its directory $ro is not writable by this daemon \(uid [0-9]+\): Permission denied \(choose a directory it may write; under the tpfabricd unit only /run/tpfabric is writable, ProtectSystem=strict\); checked as uid 65534: the unit's daemon runs as root" \
        setpriv --reuid=65534 --regid=65534 --clear-groups "$d" --check-config "$ro/empty.conf" --socket "$ro/d.sock"
    expect 2 "ConfigError: socket path $ro/d\.sock: its directory $ro is not writable by this daemon" \
        setpriv --reuid=65534 --regid=65534 --clear-groups timeout 10 "$d" --foreground --config "$ro/empty.conf" --socket "$ro/d.sock"
    rm -rf "$ro"
else
    echo "skip: an unwritable socket directory (needs root and setpriv)"
fi
# A failed start is one line on stderr whatever the log level.
expect 2 "no-such-dir does not exist" timeout 10 "$d" --log-level off --socket "$tmp/no-such-dir/d.sock"
printf '[daemon]\nlog_level = "off"\n' >"$tmp/off.conf"
expect 2 "^tpfabricd: ConfigError: socket path .*notes exists and is not a socket" \
    timeout 10 "$d" --config "$tmp/off.conf" --socket "$tmp/notes"
if [ "$(cat "$tmp/notes")" != "keep me" ]; then
    echo "FAIL: tpfabricd --socket $tmp/notes changed the file"
    fails=$((fails + 1))
fi
expect 2 "no-such-dir does not exist" timeout 10 "$d" --foreground --socket "$tmp/no-such-dir/d.sock"
if [ -e "$tmp/no-such-dir" ]; then
    echo "FAIL: tpfabricd created $tmp/no-such-dir"
    fails=$((fails + 1))
fi

# tpfabricctl's --socket names a path: "" is no socket.
expect 2 "^tpfabricctl: --socket: an empty path names no socket" "$ctl" --socket "" status
expect 2 "^tpfabricctl: --socket: an empty path names no socket" "$ctl" metrics --socket ""

# One daemon, for a moment: its first line says which daemon starts, before the HCAs'.
# It also listens for peer daemons on 127.0.0.1, on a port of this test's own.
port=$((20000 + $$ % 20000))
printf '[daemon]\nsocket_group = "%s"\n[peer]\nlisten = "127.0.0.1"\nport = %s\n' "$(id -gn)" "$port" >"$tmp/run.conf"
"$d" --foreground --config "$tmp/run.conf" --socket "$tmp/run.sock" >"$tmp/run.log" 2>&1 &
dpid=$!
i=0
while [ $i -lt 100 ] && ! grep -q "listening on" "$tmp/run.log"; do
    sleep 0.1
    i=$((i + 1))
done
if ! grep -q "listening on" "$tmp/run.log"; then
    echo "FAIL: tpfabricd did not start: $(cat "$tmp/run.log")"
    fails=$((fails + 1))
else
    first=$(grep -m1 -o 'info: .*' "$tmp/run.log")
    case $first in
    "info: tpfabricd "*" starting: node "*) echo "ok: the first line is the starting line" ;;
    *)
        echo "FAIL: the first info line is not the starting line: $(cat "$tmp/run.log")"
        fails=$((fails + 1))
        ;;
    esac
    # --check-config while a daemon serves the socket: valid, with a note (a restart stops that daemon first).
    expect 0 "note: another tpfabricd is serving .*run\.sock: a start exits 1 while it runs" \
        "$d" --check-config "$tmp/good.conf" --socket "$tmp/run.sock"
    # A second daemon on another socket but the same peer port: exit 1 (tried
    # again by systemd), naming the port's holder as the thing to look at.
    printf '[peer]\nlisten = "127.0.0.1"\nport = %s\n' "$port" >"$tmp/port.conf"
    expect 1 "peer\.listen: cannot listen on 127\.0\.0\.1:$port: .*\(another process holds the port \(ss -ltnp 'sport = :$port'\); stop it or choose another peer\.port" \
        timeout 10 "$d" --foreground --config "$tmp/port.conf" --socket "$tmp/port.sock"
    if [ -e "$tmp/port.sock" ]; then
        echo "FAIL: a refused start left $tmp/port.sock behind"
        fails=$((fails + 1))
    fi
    # Permission denied: tpfabricctl names what refused, with its actual owner and group
    # (socket_group here is not tpfabric). Needs root, to try it as nobody.
    if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null 2>&1; then
        asNobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
        group=$(id -gn)
        chmod 0710 "$tmp"
        expect 1 "^tpfabricctl: cannot reach tpfabricd at .*run\.sock: connect: Permission denied \(its directory $tmp \(owner root, group $group, mode 0710\) does not let you in: add your user to group $group and log in again, or use sudo\)" \
            asNobody "$ctl" --socket "$tmp/run.sock" status
        chmod 0700 "$tmp"
        expect 1 "^tpfabricctl: .*Permission denied \(its directory $tmp \(owner root, group $group, mode 0700\) does not let you in: its group may not either: use sudo\)" \
            asNobody "$ctl" --socket "$tmp/run.sock" status
        chmod 0711 "$tmp"
        remedy="add your user to group $group and log in again, or use sudo"
        # group root: joining it is no remedy; the socket's group comes from daemon.socket_group
        [ "$(id -g)" -eq 0 ] && remedy="use sudo; or let daemon\.socket_group name a group of yours .*and restart it"
        expect 1 "^tpfabricctl: cannot reach tpfabricd at .*run\.sock: connect: Permission denied \(the socket \(owner root, group $group, mode 0660\) refuses you: $remedy\)" \
            asNobody "$ctl" --socket "$tmp/run.sock" status
        chmod 0700 "$tmp"
    else
        echo "skip: tpfabricctl's permission messages (needs root and setpriv to try as nobody)"
    fi
fi
kill -INT "$dpid" 2>/dev/null
wait "$dpid"

# A stopping daemon removes only the socket it made: after its socket was
# removed by hand and a second daemon took the path, stopping the first
# leaves the second one reachable (and says so in its log).
listening() { # LOG: wait up to 10 s for the daemon's "listening on" line
    i=0
    while [ $i -lt 100 ] && ! grep -q "listening on" "$1"; do
        sleep 0.1
        i=$((i + 1))
    done
    grep -q "listening on" "$1"
}
"$d" --foreground --socket "$tmp/swap.sock" >"$tmp/a.log" 2>&1 &
apid=$!
if listening "$tmp/a.log"; then
    rm -f "$tmp/swap.sock"
    "$d" --foreground --socket "$tmp/swap.sock" >"$tmp/b.log" 2>&1 &
    bpid=$!
    if listening "$tmp/b.log"; then
        kill -TERM "$apid"
        wait "$apid"
        expect 0 "." "$ctl" --socket "$tmp/swap.sock" status
        if ! grep -q "socket .*swap\.sock is no longer the one this daemon made (another daemon's?): left in place" "$tmp/a.log"; then
            echo "FAIL: the first daemon did not say it left the second's socket: $(cat "$tmp/a.log")"
            fails=$((fails + 1))
        fi
    else
        echo "FAIL: the second daemon did not start: $(cat "$tmp/b.log")"
        fails=$((fails + 1))
        kill -TERM "$apid"
        wait "$apid"
    fi
    kill -TERM "$bpid"
    wait "$bpid"
    if [ -e "$tmp/swap.sock" ]; then
        echo "FAIL: the second daemon left its socket behind"
        fails=$((fails + 1))
    fi
else
    echo "FAIL: tpfabricd did not start: $(cat "$tmp/a.log")"
    fails=$((fails + 1))
    kill -TERM "$apid" 2>/dev/null
    wait "$apid"
fi

if [ "$fails" -ne 0 ]; then
    echo "$fails check(s) failed"
    exit 1
fi
echo "all command-line checks passed"
