#!/usr/bin/env bash
# The installed tree, as an engine team gets it. In a fresh temporary
# directory (removed at the end; nothing is written outside it):
#   1. `meson install --destdir` of the build;
#   2. the files: headers, libtpfabric.so* links, libtpfabric.pc, the CMake
#      package, tpfabricd, tpfabricctl and tpf-bench, the sysusers and tmpfiles entries
#      (named *.conf, or systemd ignores them), the unit generated with this
#      install's paths, tpfabricd.conf.example and the tpfabricd.conf made
#      from it (a second install keeps an edited one);
#   3. every public header compiled alone from the installed include dir
#      (C headers as C11 and C++20, .hpp as C++20; -Wall -Wextra -Werror);
#   4. `nm -D` of the installed library: every exported symbol is public API
#      (no private member of an exported class), and every function of
#      tpfabric.h is exported;
#   5. examples/hello.c and hello.cpp built through pkg-config alone (sysroot
#      into the destdir) and by CMake (find_package(tpfabric) from the destdir);
#      with rustc (on PATH or in ~/.cargo/bin; said when absent), the installed
#      examples/hello.rs, and integration.md's Rust snippet compiled with a
#      stand-in communicator and run as a world-1 device group (opened, or
#      refused with tpf_last_error's message where there is no GPU);
#   6. each of the four (five) programs run as a W = 3 host group against the
#      installed tpfabricd on a temporary socket, with the installed library;
#      the pkg-config builds and hello.rs also with TPF_DISABLE=1 on one rank (every
#      rank reports Unavailable and exits 1); the installed tpf-bench measures a
#      short W = 2 point against that daemon, as an operator checks a node;
#      the daemon stops with status 0.
# A missing tool exits 77 (skip) naming it. Meson runs this with the build's
# directories (tests/install/meson.build); by hand:
#   tests/install/test_install.sh --build build --source . --meson meson --prefix /usr/local \
#     --bindir bin --sbindir sbin --libdir lib/x86_64-linux-gnu --includedir include \
#     --sysconfdir etc --datadir share --unitdir /lib/systemd/system --sysusersdir /usr/lib/sysusers.d \
#     --tmpfilesdir /usr/lib/tmpfiles.d --version 0.1.0
set -uo pipefail

nccl=0
while [ $# -gt 0 ]; do
    case $1 in
    --build) build=$2 ;; --source) src=$2 ;; --meson) meson=$2 ;; --prefix) prefix=$2 ;;
    --bindir) bindir=$2 ;; --sbindir) sbindir=$2 ;; --libdir) libdir=$2 ;; --includedir) includedir=$2 ;;
    --sysconfdir) sysconfdir=$2 ;; --datadir) datadir=$2 ;; --unitdir) unitdir=$2 ;; --version) version=$2 ;;
    --sysusersdir) sysusersdir=$2 ;; --tmpfilesdir) tmpfilesdir=$2 ;;
    --nccl) nccl=1; shift; continue ;;
    *) echo "test_install.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift 2
done

for tool in "$meson" cc c++ pkg-config cmake nm c++filt readelf ldd python3 timeout; do
    command -v "$tool" >/dev/null || { echo "SKIP: $tool is not installed (bash scripts/install-deps.sh installs it)"; exit 77; }
done
# Meson's directory options are relative to the prefix unless absolute.
abs() { case $1 in /*) echo "$1" ;; *) echo "$prefix/$1" ;; esac; }
bindir=$(abs "$bindir") sbindir=$(abs "$sbindir") libdir=$(abs "$libdir") includedir=$(abs "$includedir")
sysconfdir=$(abs "$sysconfdir") datadir=$(abs "$datadir") unitdir=$(abs "$unitdir")
sysusersdir=$(abs "$sysusersdir") tmpfilesdir=$(abs "$tmpfilesdir")
# Variables a developer may have set must not change what is tested.
for v in $(compgen -e | grep '^TPF_'); do unset "$v"; done
# Nothing of the build tree: meson test points LD_LIBRARY_PATH at it.
unset DESTDIR PKG_CONFIG_LIBDIR LD_LIBRARY_PATH

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tpf_install.XXXXXX") || exit 1
daemon_pid=""
cleanup() {
    [ -n "$daemon_pid" ] && kill -9 "$daemon_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
dest=$tmp/dest
fails=0 checks=0
ok() { checks=$((checks + 1)); echo "ok: $*"; }
fail() { checks=$((checks + 1)) fails=$((fails + 1)); echo "FAIL: $*"; }
# check DESCRIPTION CMD...: CMD succeeds.
check() { local what=$1; shift; if "$@"; then ok "$what"; else fail "$what"; fi; }
# run_logged DESCRIPTION LOG CMD...: CMD succeeds, else its output is shown.
run_logged() {
    local what=$1 log=$2; shift 2
    if "$@" >"$log" 2>&1; then ok "$what"; else fail "$what (exit $?):"; sed 's/^/    /' "$log"; fi
}
t0=$(date +%s%N)
elapsed() { local ds=$((($(date +%s%N) - t0) / 100000000)); echo "$((ds / 10)).$((ds % 10))"; }

# ---- 1. install ------------------------------------------------------------
run_logged "meson install --destdir" "$tmp/install.log" "$meson" install -C "$build" --no-rebuild --quiet --destdir "$dest"
if [ "$fails" -ne 0 ]; then echo "the install failed; nothing else is checked"; exit 1; fi

# ---- 2. the files ----------------------------------------------------------
inc=$dest$includedir lib=$dest$libdir etc=$dest$sysconfdir/tpfabric
headers=(errc.h export.h error.hpp tpfabric.h tpfabric.hpp version.h)
[ "$nccl" = 1 ] && headers+=(nccl.hpp)
for h in "${headers[@]}"; do check "header tpfabric/$h installed" test -f "$inc/tpfabric/$h"; done
# Nothing else: an installed header that is not API would be an internal one.
for f in "$inc"/tpfabric/*; do
    case " ${headers[*]} " in *" $(basename "$f") "*) ;; *) fail "unexpected installed header $f" ;; esac
done
check "no header outside include/tpfabric/" test "$(find "$inc" -type f ! -path "$inc/tpfabric/*" | wc -l)" -eq 0
check "libtpfabric.so.$version is a file" test -f "$lib/libtpfabric.so.$version" -a ! -L "$lib/libtpfabric.so.$version"
check "libtpfabric.so.0 -> libtpfabric.so.$version" test "$(readlink "$lib/libtpfabric.so.0")" = "libtpfabric.so.$version"
check "libtpfabric.so -> libtpfabric.so.0" test "$(readlink "$lib/libtpfabric.so")" = "libtpfabric.so.0"
check "libtpfabric.pc installed" test -f "$lib/pkgconfig/libtpfabric.pc"
check "tpfabricConfig.cmake installed" test -f "$lib/cmake/tpfabric/tpfabricConfig.cmake"
check "tpfabricConfigVersion.cmake installed" test -f "$lib/cmake/tpfabric/tpfabricConfigVersion.cmake"
check "tpfabricd installed in sbindir" test -x "$dest$sbindir/tpfabricd"
check "tpfabricctl installed in bindir" test -x "$dest$bindir/tpfabricctl"
check "tpf-bench installed in bindir" test -x "$dest$bindir/tpf-bench"
unit=$dest$unitdir/tpfabricd.service
check "tpfabricd.service installed" test -f "$unit"
check "the unit starts $sbindir/tpfabricd with $sysconfdir/tpfabric/tpfabricd.conf" \
    grep -qxF "ExecStart=$sbindir/tpfabricd --config $sysconfdir/tpfabric/tpfabricd.conf" "$unit"
check "the unit's documentation is installed" test -f "$dest$(sed -n 's|^Documentation=file:||p' "$unit")"
docdir=$(dirname "$dest$(sed -n 's|^Documentation=file:||p' "$unit")")
for d in integration operations configuration status python gpu verbs design perf reliability; do
    check "docs/$d.md installed" test -f "$docdir/$d.md"
done
check "examples installed below the guides" test -f "$docdir/examples/hello.c" -a -f "$docdir/examples/hello.rs" \
    -a -f "$docdir/examples/README.md"
# Every relative link of an installed guide leads to an installed file (docs/install_links.py).
broken=$(cd "$docdir" && for f in *.md examples/*.md; do
    grep -o '](\([^)#]*\)' "$f" | sed 's/^](//' | grep -v '^[a-z]*:' | grep -v '^$' | sort -u |
        while read -r t; do [ -e "$(dirname "$f")/$t" ] || echo "$f -> $t"; done
done)
check "the installed guides' links lead to installed files${broken:+ (broken: $broken)}" test -z "$broken"
check "no @placeholder@ left in the unit" test "$(grep -c '@[a-z]*@' "$unit")" -eq 0
check "sysusers.d/tpfabric.conf installed (group tpfabric)" grep -q '^g tpfabric' "$dest$sysusersdir/tpfabric.conf"
check "tmpfiles.d/tpfabric.conf creates $sysconfdir/tpfabric" \
    grep -q "^d $sysconfdir/tpfabric " "$dest$tmpfilesdir/tpfabric.conf"
check "tpfabricd.conf.example installed" test -f "$etc/tpfabricd.conf.example"
check "tpfabricd.conf made from the example" cmp -s "$etc/tpfabricd.conf.example" "$etc/tpfabricd.conf"
check "the installed tpfabricd accepts the installed tpfabricd.conf" \
    "$dest$sbindir/tpfabricd" --check-config "$etc/tpfabricd.conf"
# An operator's file survives the next install; the example is refreshed.
echo "# edited by the operator" >>"$etc/tpfabricd.conf"
echo "# stale" >"$etc/tpfabricd.conf.example"
run_logged "second meson install over the first" "$tmp/install2.log" "$meson" install -C "$build" --no-rebuild --quiet --destdir "$dest"
check "the second install kept the edited tpfabricd.conf" grep -qx "# edited by the operator" "$etc/tpfabricd.conf"
check "the second install refreshed tpfabricd.conf.example" cmp -s "$src/systemd/tpfabricd.conf.example" "$etc/tpfabricd.conf.example"
echo "== files checked ($(elapsed) s)"

# ---- 3. every public header compiles alone ----------------------------------
warn=(-Wall -Wextra -Wpedantic -Werror)
# nccl.h (and the cuda_runtime.h it includes) as system headers: their warnings are not ours.
nccl_inc=()
for d in /usr/local/cuda/include /usr/include; do [ -f "$d/nccl.h" ] && nccl_inc=(-isystem "$d" -isystem /usr/local/cuda/include) && break; done
compile_alone() { # LANG STD HEADER
    local lang=$1 std=$2 h=$3 cc=cc extra=()
    [ "$lang" = c++ ] && cc=c++
    [ "$h" = nccl.hpp ] && extra=("${nccl_inc[@]}")
    if printf '#include <tpfabric/%s>\nint tpf_header_test_anchor;\n' "$h" |
        "$cc" -x "$lang" -std="$std" "${warn[@]}" -I"$inc" "${extra[@]}" -fsyntax-only - >"$tmp/hdr.log" 2>&1; then
        ok "<tpfabric/$h> compiles alone as $lang ($std)"
    else
        fail "<tpfabric/$h> as $lang ($std):"
        sed 's/^/    /' "$tmp/hdr.log"
    fi
}
for h in "${headers[@]}"; do
    case $h in
    *.h) compile_alone c c11 "$h"; compile_alone c++ c++20 "$h" ;;
    nccl.hpp)
        if [ ${#nccl_inc[@]} -eq 0 ]; then echo "note: nccl.hpp installed but nccl.h not found; not compiled"
        else compile_alone c++ c++20 "$h"; fi ;;
    *) compile_alone c++ c++20 "$h" ;;
    esac
done
echo "== headers compiled ($(elapsed) s)"

# ---- 4. only the public API is exported --------------------------------------
so=$lib/libtpfabric.so.$version
# The CUDA runtime is linked in (meson.build): no libcudart to find at load.
needed=$(LC_ALL=C readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
echo "libtpfabric NEEDED: $needed"
check "libtpfabric needs no libcudart at load time (NEEDED: $needed)" bash -c "! grep -q libcudart <<<'$needed'"
nm -D --defined-only "$so" | c++filt >"$tmp/nm.txt"
exported=0 internal=0
while read -r _ type name; do
    [ -z "${name:-}" ] && { name=$type type=""; }
    name=${name%%@*} # the version node (TPFABRIC_0)
    exported=$((exported + 1))
    case $name in
    TPFABRIC_0) continue ;;                                      # the version node itself
    tpf_*) [[ $name =~ ^tpf_[a-z0-9_]+$ ]] && continue ;;        # the C ABI
    "typeinfo for tpf::"* | "typeinfo name for tpf::"* | "vtable for tpf::"*)
        case ${name#* for } in tpf::Bootstrap | tpf::TcpBootstrap | tpf::NcclBootstrap) continue ;; esac ;;
    tpf::*)
        qualified=${name%%(*} # the function's own name, before its parameters
        case $qualified in
        tpf::Group::Impl* | *::*::*::*) ;;                       # Impl, or anything nested deeper
        tpf::Group::* | tpf::Bootstrap::* | tpf::TcpBootstrap::* | tpf::NcclBootstrap::* | tpf::dtypeSize | tpf::version | tpf::lastOpenMayFallBack) continue ;;
        esac ;;
    esac
    internal=$((internal + 1))
    fail "exported but not public API: $name"
done <"$tmp/nm.txt"
[ "$internal" -eq 0 ] && ok "all $exported exported symbols are public API"
# Private members of the exported classes stay hidden (TPF_HIDDEN).
for f in 'tpf::TcpBootstrap::acceptRanks(' 'tpf::Group::Group(std::unique_ptr'; do
    grep -qF " $f" "$tmp/nm.txt" && fail "exported but private: $f"
done
# The other way round: every function the C header declares is exported.
declared=$(grep -o 'TPF_API[^;]*' "$inc/tpfabric/tpfabric.h" | grep -o '\btpf_[a-z0-9_]*[[:space:]]*(' | tr -d ' (' | sort -u)
missing=0
for f in $declared; do
    grep -q "^[0-9a-f]* T $f@" "$tmp/nm.txt" || { fail "$f is declared in tpfabric.h but not exported"; missing=$((missing + 1)); }
done
if [ -z "$declared" ]; then fail "found no TPF_API function in tpfabric.h (has its format changed?)"
elif [ "$missing" -eq 0 ]; then ok "all $(wc -w <<<"$declared") functions of tpfabric.h are exported"; fi
# And every free function the C++ headers declare TPF_API (a declaration
# without a map entry links nowhere: tpf::lastOpenMayFallBack() did once).
for f in $(grep -ho 'TPF_API [^;{(]*(' "$inc"/tpfabric/*.hpp | grep -o '[A-Za-z_][A-Za-z0-9_]*($' | tr -d '('); do
    check "exports tpf::$f (declared TPF_API)" grep -qF " tpf::$f(" "$tmp/nm.txt"
done
for s in "tpf::Group::open(" "tpf::TcpBootstrap::create(" "vtable for tpf::TcpBootstrap"; do
    check "exports $s" grep -qF " $s" "$tmp/nm.txt"
done

# ---- 5. build the examples from the installed tree alone ----------------------
mkdir -p "$tmp/examples" "$tmp/bin"
cp "$src/examples/hello.c" "$src/examples/hello.cpp" "$src/examples/CMakeLists.txt" "$tmp/examples/"
# pkg-config: the installed .pc only, found by PKG_CONFIG_PATH alone: it is
# relocatable (prefix=${pcfiledir}/...), so the destdir needs no
# PKG_CONFIG_SYSROOT_DIR, as a moved prefix needs none.
export PKG_CONFIG_PATH=$lib/pkgconfig
cflags=$(pkg-config --cflags libtpfabric) libs=$(pkg-config --libs libtpfabric)
echo "pkg-config --cflags --libs libtpfabric: $cflags $libs"
pc_inc=$(grep -o -- '-I[^ ]*' <<<"$cflags" | head -n 1) pc_lib=$(grep -o -- '-L[^ ]*' <<<"$libs" | head -n 1)
check "pkg-config's include path is the installed one" test "$(realpath -m -- "${pc_inc#-I}")" = "$(realpath -m -- "$inc")"
check "pkg-config's library path is the installed one" test "$(realpath -m -- "${pc_lib#-L}")" = "$(realpath -m -- "$lib")"
# shellcheck disable=SC2086 # the flags are words
run_logged "hello.c built with pkg-config" "$tmp/cc.log" \
    cc -std=c11 -Wall -Wextra -Wpedantic -Werror "$tmp/examples/hello.c" $cflags $libs -o "$tmp/bin/hello_c"
# shellcheck disable=SC2086
run_logged "hello.cpp built with pkg-config" "$tmp/cxx.log" \
    c++ -std=c++20 -Wall -Wextra -Wpedantic -Werror "$tmp/examples/hello.cpp" $cflags $libs -o "$tmp/bin/hello"
unset PKG_CONFIG_PATH
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
run_logged "examples/CMakeLists.txt configured with CMAKE_PREFIX_PATH=$dest$prefix" "$tmp/cmake.log" \
    cmake -S "$tmp/examples" -B "$tmp/cmake" "${generator[@]}" -DCMAKE_PREFIX_PATH="$dest$prefix" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" -DCMAKE_CXX_FLAGS="-Wall -Wextra -Werror"
if [ -f "$tmp/cmake/build.ninja" ] || [ -f "$tmp/cmake/Makefile" ]; then
    check "CMake found the installed package" grep -qx "tpfabric_DIR:PATH=$lib/cmake/tpfabric" "$tmp/cmake/CMakeCache.txt"
    run_logged "examples built by CMake" "$tmp/cmake-build.log" cmake --build "$tmp/cmake"
    # A C++17 engine that calls the C header through tpfabric::tpfabric stays C++17
    # (the imported target sets no standard; the C++ headers need C++20 themselves).
    mkdir -p "$tmp/cxx17"
    printf '%s\n' 'cmake_minimum_required(VERSION 3.16)' 'project(cxx17 LANGUAGES CXX)' 'set(CMAKE_CXX_STANDARD 17)' \
        'set(CMAKE_CXX_STANDARD_REQUIRED ON)' 'find_package(tpfabric 0.1 REQUIRED)' 'add_executable(engine17 engine.cpp)' \
        'target_link_libraries(engine17 PRIVATE tpfabric::tpfabric)' >"$tmp/cxx17/CMakeLists.txt"
    printf '%s\n' '#include <tpfabric/tpfabric.h>' \
        'static_assert(__cplusplus >= 201703L && __cplusplus < 202002L, "tpfabric::tpfabric changed the C++ standard");' \
        'int main() { return tpf_version() ? 0 : 1; }' >"$tmp/cxx17/engine.cpp"
    run_logged "a C++17 CMake engine calling the C header through tpfabric::tpfabric stays C++17" "$tmp/cxx17.log" \
        sh -c 'cmake -S "$1" -B "$1/b" -DCMAKE_PREFIX_PATH="$2" && cmake --build "$1/b"' sh "$tmp/cxx17" "$dest$prefix"
fi
# Rust: the installed example and the guide's snippet, against the installed library alone.
rustc=$(command -v rustc || { [ -x "$HOME/.cargo/bin/rustc" ] && echo "$HOME/.cargo/bin/rustc"; })
if [ -n "$rustc" ]; then
    # shellcheck disable=SC2046 # the flags are words
    run_logged "examples/hello.rs built with rustc and pkg-config ($("$rustc" --version))" "$tmp/rustc.log" \
        "$rustc" --edition 2021 -O -D warnings "$docdir/examples/hello.rs" \
        $(PKG_CONFIG_PATH=$lib/pkgconfig pkg-config --libs-only-L libtpfabric) -o "$tmp/bin/hello_rs"
    # The snippet as the guide prints it, with the communicator it assumes: world 1, a copy.
    { echo '#![allow(dead_code)]'
      awk '/^```rust$/ { on = 1; next } /^```$/ { on = 0 } on' "$docdir/integration.md"
      cat <<'EOF'
pub struct Comm;
impl Comm {
    fn world(&self) -> usize { 1 }
    fn all_gather(&mut self, mine: &[u8], out: &mut [u8]) -> Result<(), ()> { out.copy_from_slice(mine); Ok(()) }
}
fn main() {
    match open(0, 1, &mut Comm) {
        Ok(g) => { unsafe { tpf_group_close(g) }; println!("snippet: opened a world-1 device group"); }
        Err(e) => println!("snippet: open failed: {e}"),
    }
}
EOF
    } >"$tmp/snippet.rs"
    run_logged "integration.md's Rust snippet compiles against the installed library" "$tmp/snippet.log" \
        "$rustc" --edition 2021 -D warnings "$tmp/snippet.rs" -L "$lib" -o "$tmp/snippet"
    if [ -x "$tmp/snippet" ]; then
        out=$(LD_LIBRARY_PATH=$lib timeout 60 "$tmp/snippet" 2>/dev/null)
        echo "    $out"
        check "the Rust snippet opens a world-1 device group, or says why it cannot" \
            grep -Eq '^snippet: (opened a world-1 device group|open failed: [A-Za-z]+: .+)$' <<<"$out"
    fi
else
    echo "skip: no rustc (PATH, ~/.cargo/bin): examples/hello.rs and the guide's Rust snippet not built"
fi
echo "== examples built ($(elapsed) s)"

# ---- 6. run them as W = 3 host groups against the installed daemon -------------
# The programs link only libtpfabric (its CUDA runtime is inside it: no CUDA
# directory on the path; libnccl.so.2, where NEEDED, from the loader's cache).
ld_path=$lib
progs=("$tmp/bin/hello_c" "$tmp/bin/hello" "$tmp/cmake/hello_c" "$tmp/cmake/hello")
[ -n "$rustc" ] && progs+=("$tmp/bin/hello_rs")
for p in "${progs[@]}"; do
    [ -x "$p" ] || continue
    LD_LIBRARY_PATH=$ld_path ldd "$p" >"$tmp/ldd.txt" 2>&1
    check "$(basename "$(dirname "$p")")/$(basename "$p") loads the installed libtpfabric" \
        grep -qF "libtpfabric.so.0 => $lib/libtpfabric.so.0" "$tmp/ldd.txt"
    if grep -q "not found" "$tmp/ldd.txt"; then fail "$p: libraries not found: $(grep "not found" "$tmp/ldd.txt" | tr -s ' \t' ' ')"; fi
done

sock=$tmp/tpfabricd.sock
"$dest$sbindir/tpfabricd" --socket "$sock" --foreground 2>"$tmp/daemon.log" &
daemon_pid=$!
for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
check "the installed tpfabricd listens on $sock" test -S "$sock"
run_logged "the installed tpfabricctl reads its status" "$tmp/ctl.log" "$dest$bindir/tpfabricctl" status --socket "$sock"

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# group PROG PATTERN [ENV_OF_RANK_2]: three ranks of PROG; each exits 0 and prints PATTERN
# (RANK and ROUTES replaced by the rank's), or, when PATTERN starts with "!", exits 1 and prints the rest on stderr.
group() {
    local prog=$1 pattern=$2 env2=${3:-} port name pids=() r
    name=$(basename "$(dirname "$prog")")/$(basename "$prog")${env2:+ ($env2 on rank 2)}
    port=$(free_port)
    for r in 0 1 2; do
        local extra=()
        [ "$r" = 2 ] && [ -n "$env2" ] && extra=("$env2")
        env LD_LIBRARY_PATH="$ld_path" "${extra[@]}" \
            timeout 60 "$prog" "$r" 3 "127.0.0.1:$port" --socket "$sock" >"$tmp/out.$r" 2>"$tmp/err.$r" &
        pids+=($!)
    done
    local good=0
    for r in 0 1 2; do
        wait "${pids[$r]}"
        local rc=$? want=${pattern//RANK/$r}
        want=${want//ROUTES/$(routes "$r")}
        if [ "${want:0:1}" = "!" ]; then
            if [ "$rc" -eq 1 ] && grep -q -- "${want:1}" "$tmp/err.$r"; then good=$((good + 1))
            else fail "$name rank $r: exit $rc, wanted 1 with '${want:1}'; stdout: $(cat "$tmp/out.$r") stderr: $(cat "$tmp/err.$r")"; fi
        elif [ "$rc" -eq 0 ] && grep -qx -- "$want" "$tmp/out.$r"; then
            good=$((good + 1))
            [ "$r" = 0 ] && echo "    $(cat "$tmp/out.$r")"
        else
            fail "$name rank $r: exit $rc, wanted 0 and '$want'; stdout: $(cat "$tmp/out.$r") stderr: $(cat "$tmp/err.$r")"
        fi
    done
    [ "$good" -eq 3 ] && ok "$name: W = 3 group, every rank as expected"
}
routes() { local r=$1 out="" p; for p in 0 1 2; do [ "$p" = "$r" ] && out+=" self" || out+=" shm"; done; echo "${out# }"; }
c_line='hello_c: rank RANK of 3, path fabric (routes ROUTES): all-gather of 4096 B ok, f32 sum of 1024 ok'
cxx_line='hello: rank RANK of 3, path fabric (routes ROUTES): all-gather of 4096 B ok, bf16 sum of 2048 ok'
for p in "${progs[@]}"; do
    [ -x "$p" ] || { fail "$p was not built"; continue; }
    line=$c_line
    [ "$(basename "$p")" = hello ] && line=$cxx_line
    [ "$(basename "$p")" = hello_rs ] && line=${c_line/hello_c:/hello_rs:}
    group "$p" "$line"
done
# The off switch on one rank: a host group has no NCCL, so every rank fails alike.
for p in "$tmp/bin/hello_c" "$tmp/bin/hello" "$tmp/bin/hello_rs"; do
    [ -x "$p" ] && group "$p" "!Unavailable: TPF_DISABLE=1 on rank 2" TPF_DISABLE=1
done

# An operator measuring the node against its own daemon (docs/operations.md,
# "Measuring a node"): one short point, read back from its --json.
run_logged "the installed tpf-bench measures W = 2 against the installed daemon" "$tmp/bench.log" \
    env LD_LIBRARY_PATH="$ld_path" timeout 120 "$dest$bindir/tpf-bench" run --socket "$sock" --world 2 \
    --sizes 4KiB --ops gather --iters 20 --warmup 2 --opens 1 --floor-iters 100 --idle-ms 100 --settle-ms 0 \
    --json "$tmp/bench.json"
check "its --json holds the W = 2 4 KiB gather" python3 -c '
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
sys.exit(0 if any(r["op"] == "gather" and r["world"] == 2 and r["size"] == 4096 and r["samples"] > 0 for r in rows) else 1)' \
    "$tmp/bench.json"

kill -TERM "$daemon_pid"
wait "$daemon_pid"
rc=$?
daemon_pid=""
check "the installed tpfabricd stopped with status 0 (was $rc)" test "$rc" -eq 0
[ "$fails" -ne 0 ] && { echo "daemon log:"; sed 's/^/    /' "$tmp/daemon.log"; }

echo "== $checks checks, $fails failed ($(elapsed) s)"
[ "$fails" -eq 0 ]
