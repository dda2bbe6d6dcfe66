#!/usr/bin/env bash
# The whole test suite, as README.md and CI run it. Stages, each in its own
# build dir, each timed:
#   build/       configure and build everything, run every Meson test (unit,
#                integration, vm; GPU tests skip with 77 where there is no GPU)
#   build-asan/  ASan+UBSan (gcc, CUDA off, -O0): the unit and integration
#                suites, collectives scaled down with TPF_IT_SCALE=0.1; only
#                what those tests run is compiled (tests/targets_for.py)
#   build-tsan/  TSan (gcc, CUDA off): the ring, inflight and tcp_link unit tests and the
#                faults, fault_matrix and status integration tests (proxy thread
#                against rank processes); likewise only what they run
#   build-fuzz/  libFuzzer targets (clang++-14, -Dfuzz=true): regression
#                inputs replayed, then $TPF_FUZZ_SECONDS (12) of fuzzing each
#   build-deb/   the Debian packages (debian/) by dpkg-buildpackage -b from a
#                clean clone of HEAD, lintian on them, then the systemd guest
#                (tests/vm/systemd-run.sh: the packages installed with apt and
#                the shipped unit run by systemd as PID 1; its root file
#                system is cached beside the VM kernel)
# then one line "N passed, N failed, N skipped" over every stage's
# testlog.json. Exit status non-zero on any failure. Extra arguments go to the
# first stage's meson test. TPF_STAGES (default "normal asan tsan fuzz deb")
# picks stages.
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
bash scripts/install-deps.sh
stages=${TPF_STAGES:-normal asan tsan fuzz deb}
logs=()
build_failures=0
t_all=$(date +%s)

# Sanitizer reports are fatal, with stacks; the daemon and ranks the
# integration tests spawn inherit these.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:print_summary=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:print_summary=1}
# Catch2 2.x is not thread-safe: an assertion in a test's helper thread races
# with the main thread's inside Catch (test_faults.cpp, "misaligned buffers").
# Only frames of Catch itself are suppressed; tpfabric code is not.
tsan_supp="$top/build-tsan/catch.supp"
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$tsan_supp}

# CPU seconds (user+sys) of this shell's finished children: wall time on a
# shared box varies with its load, CPU time much less.
cpu_s() { awk -v t="$(getconf CLK_TCK)" '{printf "%d", ($16 + $17) / t}' /proc/$$/stat; }
stage_time() { echo "== stage $1: $(( $(date +%s) - $2 )) s wall, $(( $(cpu_s) - $3 )) s CPU"; }

# setup <dir> <meson setup args...>: configure once; "build failed" counts as one failure.
setup() {
  local dir=$1; shift
  [ -f "$dir/build.ninja" ] && return 0
  meson setup "$dir" "$@" >"$top/.setup-$dir.log" 2>&1 && { rm -f "$top/.setup-$dir.log"; return 0; }
  cat "$top/.setup-$dir.log"; rm -f "$top/.setup-$dir.log"
  return 1
}
failed_build() { echo "stage $1: build failed"; build_failures=$((build_failures + 1)); }

# deb_stage: build-deb/testlog.json, one line per check in the form of Meson's
# testlog (summary.py counts them): the package build, lintian, and each TAP
# result of the systemd guest. Logs in build-deb/*.log.
deb_stage() {
  local d=$top/build-deb obj rc n=0 t=$(date +%s) times=""
  rm -rf "$d" && mkdir -p "$d" || return 1
  result() { printf '{"name": "deb/%s", "result": "%s"}\n' "$1" "$2" >>"$d/testlog.json"; }
  lap() { times+="$1 $(( $(date +%s) - t )) s, "; t=$(date +%s); }
  # A clean clone (what is committed), always at the same path, so that
  # ccache finds the last run's objects (dpkg-buildflags maps this path).
  git clone -q "$top" "$d/src" || { result clone FAIL; return 1; }
  if ! (cd "$d/src" && dpkg-buildpackage -b -uc -us) >"$d/dpkg-buildpackage.log" 2>&1; then
    echo "stage deb: dpkg-buildpackage failed; last lines of build-deb/dpkg-buildpackage.log:"
    tail -n 30 "$d/dpkg-buildpackage.log"
    result dpkg-buildpackage FAIL; return 1
  fi
  result dpkg-buildpackage OK
  lap dpkg-buildpackage
  # Errors and warnings fail; a warning we accept is overridden in debian/*.lintian-overrides with its reason.
  if lintian --fail-on error,warning "$d"/*.changes >"$d/lintian.log" 2>&1; then result lintian OK
  else echo "stage deb: lintian:"; cat "$d/lintian.log"; result lintian FAIL; fi
  lap lintian
  # tpf-testrank for the guest, from the package build's own objects (one file more to compile).
  obj=$(ls -d "$d"/src/obj-*/ | head -n1)
  if ! ninja -C "$obj" tests/integration/tpf-testrank >"$d/testrank.log" 2>&1; then
    tail -n 20 "$d/testrank.log"; result tpf-testrank FAIL; return 1
  fi
  lap tpf-testrank
  TPF_VM_SKIP_RC=0 TPF_VM_TAP_OUT=$d/vm-systemd.tap tests/vm/systemd-run.sh --debs "$d" \
    --bin "$obj/tests/integration/tpf-testrank" >"$d/vm-systemd.log"
  rc=$?
  lap "systemd guest"
  cat "$d/vm-systemd.log"
  echo "== stage deb: ${times%, }"
  awk '/^ok .*# SKIP/ { print "SKIP"; next } /^ok / { print "OK" } /^not ok / { print "FAIL" }' "$d/vm-systemd.log" |
    while read -r r; do result "vm-systemd-$((++n))" "$r"; done
  if ! grep -Eq '^(not )?ok ' "$d/vm-systemd.log"; then   # a skip (1..0 # SKIP), or no result at all
    if grep -q '^1\.\.0 # SKIP' "$d/vm-systemd.log"; then result vm-systemd SKIP
    else result vm-systemd "$([ $rc -eq 0 ] && echo OK || echo FAIL)"; fi
  fi
}

for stage in $stages; do
  t0=$(date +%s) c0=$(cpu_s)
  case $stage in
  normal)
    rm -f build/meson-logs/testlog.json
    if setup build && meson compile -C build; then
      meson test -C build --print-errorlogs --num-processes 2 "$@"
      logs+=(build/meson-logs/testlog.json)
    else failed_build normal; fi
    ;;
  asan)
    rm -f build-asan/meson-logs/testlog.json
    # -O0: most of this stage is compiling on two cores: 22 min at -O1, 9 at
    # -O0, while its tests take 2 min more; ASan and UBSan find the same bugs.
    if setup build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled -Dbuildtype=debug \
         -Doptimization=0 &&
       ninja -C build-asan $(python3 tests/targets_for.py build-asan --suite unit --suite integration); then
      TPF_IT_SCALE=${TPF_IT_SCALE:-0.1} meson test -C build-asan --no-rebuild --print-errorlogs --num-processes 2 \
        --timeout-multiplier 3 --suite unit --suite integration
      logs+=(build-asan/meson-logs/testlog.json)
    else failed_build asan; fi
    ;;
  tsan)
    rm -f build-tsan/meson-logs/testlog.json
    if setup build-tsan -Db_sanitize=thread -Dcuda=disabled -Dbuildtype=debugoptimized &&
       ninja -C build-tsan $(python3 tests/targets_for.py build-tsan ring inflight tcp_link faults fault_matrix status); then
      printf 'race:^Catch::\n' >"$tsan_supp"
      meson test -C build-tsan --no-rebuild --print-errorlogs --num-processes 2 --timeout-multiplier 3 ring inflight tcp_link faults fault_matrix status
      logs+=(build-tsan/meson-logs/testlog.json)
    else failed_build tsan; fi
    ;;
  fuzz)
    rm -f build-fuzz/meson-logs/testlog.json
    if ! command -v clang++-14 >/dev/null; then
      echo "stage fuzz: clang++-14 not installed (apt-get install clang-14 libclang-rt-14-dev)"
      build_failures=$((build_failures + 1))
    elif CXX=clang++-14 setup build-fuzz -Dfuzz=true -Dcuda=disabled &&
         meson compile -C build-fuzz fuzz/fuzz_client_msg fuzz/fuzz_peer_msg fuzz/fuzz_ring fuzz/fuzz_config fuzz/make_seeds; then
      meson test -C build-fuzz --no-rebuild --print-errorlogs --num-processes 2 --suite fuzz
      logs+=(build-fuzz/meson-logs/testlog.json)
    else failed_build fuzz; fi
    ;;
  deb)
    deb_stage
    [ -f build-deb/testlog.json ] && logs+=(build-deb/testlog.json) || failed_build deb
    ;;
  *) echo "unknown stage $stage"; build_failures=$((build_failures + 1)) ;;
  esac
  stage_time "$stage" "$t0" "$c0"
done
echo "== all stages: $(( $(date +%s) - t_all )) s wall, $(cpu_s) s CPU"
python3 tests/summary.py --build-failures "$build_failures" "${logs[@]}"
