# tests/common/tap-lib.sh: TAP output and bounded waits for the bash test
# scripts, on a host (tests/tcp/run.sh) and in the VM guests (through
# tests/vm/guest-lib.sh, which sources it from /opt/tpf/). Sourced.
# stdout is the TAP stream; tool output belongs in files or on stderr.

TAP_N=0
TAP_FAILED=0

# --- TAP ---
diag() { local l; for l in "$@"; do printf '# %s\n' "$l"; done; }
diag_file() { [ -f "$1" ] && tail -n "${2:-20}" "$1" | sed 's/^/#   /'; }
note() { echo "$*" >&2; }
tap_ok() { TAP_N=$((TAP_N + 1)); echo "ok $TAP_N - $1"; }
tap_fail() {
  TAP_N=$((TAP_N + 1)); TAP_FAILED=$((TAP_FAILED + 1))
  echo "not ok $TAP_N - $1"; shift; diag "$@"
}
tap_skip() { TAP_N=$((TAP_N + 1)); echo "ok $TAP_N - $1 # SKIP $2"; }
# tap_check NAME CMD...: one test, ok iff CMD exits 0; its output is shown on failure.
tap_check() {
  local name=$1 log; shift
  log=$(mktemp "${TPF_SCRATCH:-/tmp}/check.XXXXXX")
  if "$@" >"$log" 2>&1; then tap_ok "$name"; else
    tap_fail "$name" "command failed (status $?): $*"; diag_file "$log"; fi
}
# tap_done: prints the plan and exits 0 only when nothing failed.
tap_done() { echo "1..$TAP_N"; exit $((TAP_FAILED > 0)); }

# --- waits ---
# wait_until SECONDS CMD...: polls CMD every 0.2 s; status 1 on timeout.
wait_until() {
  local end=$(($(date +%s) + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -ge "$end" ] && return 1
    sleep 0.2
  done
}
_tcp_listening() {
  local hex; hex=$(printf ':%04X ' "$1")
  awk -v p="$hex" '$4 == "0A" && index($2 " ", p) { f = 1 } END { exit !f }' /proc/net/tcp /proc/net/tcp6
}
wait_tcp_listen() { wait_until "${2:-30}" _tcp_listening "$1"; }   # PORT [SECONDS]
_gone() { ! kill -0 "$1" 2>/dev/null; }   # PID: true once the process has ended
