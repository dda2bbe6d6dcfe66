// One rank of an integration test: opens a group on the real daemon and runs
// collectives (all-gather, all-reduce sum, all-gather-v), checking every
// result byte for byte. Prints one line
//   RESULT rank=R ok calls=N
// or
//   RESULT rank=R error=NAME calls=N elapsed_ms=T [open_ms=O] detail=...
// and exits 0 (ok), 1 (a collective failed), 2 (usage) or 3 (wrong data, or
// a failed call that wrote into its output). Progress lines a test can wait
// for: "OPEN rank=R cap=N open_ms=O" (the agreed cap), "PAUSED rank=R calls=N", "STALL rank=R calls=N",
// "PROGRESS rank=R calls=N", "REOPEN rank=R ok|error=NAME ...",
// "BOOTSTRAP rank=R" (--skip-open), "ABORT rank=R status=NAME ..." (what
// abort() returned), "FDS rank=R before=N after=M" (--check-fds), "FORKED
// rank=R child=PID call=NAME check=NAME abort=NAME detail=..." (--fork-at:
// what the child's calls on the parent's group returned; the child then
// closes its copy if --fork-close, and sleeps 60 s holding what it kept). A failed
// open's elapsed_ms counts from the start of the program; open_ms (a failed
// open's RESULT line, and OPEN) is the time spent inside Group::open alone.
#include <fcntl.h>
#include <unistd.h>

#include <dirent.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "client/reduce.hpp"
#include "client/testing.hpp"
#include "common/shm.hpp"
#include "pattern.hpp"
#include <tpfabric/tpfabric.hpp>

using namespace tpf;
using namespace tpf::testing;

namespace {

constexpr std::uint8_t kSentinel = 0xa5; // every output byte before a call

struct Args {
    std::string socket, bootstrap;
    std::uint32_t rank = 0, world = 2;
    std::uint64_t maxBytes = 65536;
    std::uint64_t iters = 100;
    std::vector<std::uint64_t> sizes{16};
    std::string mode = "gather"; // gather | sum | mixed | gatherv
    std::uint32_t timeoutMs = 5000;
    std::int64_t abortAt = -1;   // call abort() before this iteration
    std::int64_t stallAt = -1;   // stop posting (sleep) at this iteration
    std::int64_t exitAt = -1;    // _exit(0) without closing at this iteration
    std::int64_t forkAt = -1;    // fork() before this iteration (the FORKED line); the parent goes on
    bool forkClose = false;      // the forked child closes its copy of the group
    std::int64_t mismatchAt = -1; // at this iteration the last rank passes other counts (gatherv), 16 bytes less (gather, sum)
    std::int64_t pauseAt = -1;   // before this iteration wait until goFile exists
    std::string goFile;
    std::string stopFile;        // every 16 calls all ranks agree whether it exists; stop ok if so
    std::uint64_t progress = 0;  // print PROGRESS every this many calls
    std::uint32_t holdMs = 0;    // wait this long before closing (keep the group open)
    bool reopen = false;         // after a failed call: close and open again (REOPEN line)
    std::string reopenGoFile;    // then wait for this file, open once more and run reopenIters calls
    std::uint64_t reopenIters = 200;
    std::uint32_t openTimeoutMs = 0;      // Options::openTimeout (0: the library's default)
    std::uint32_t bootstrapTimeoutMs = 30000;
    std::uint32_t bootstrapWorld = 0;     // the TcpBootstrap's world (0: --world)
    std::int64_t bootstrapRank = -1;      // the TcpBootstrap's rank (-1: --rank)
    std::string buffers = "host";         // host | device
    bool skipOpen = false;                // create the bootstrap, never call Group::open
    bool exitBeforeOpen = false;          // _exit(0) after creating the bootstrap
    bool abortThenClose = false;          // after --abort-at: abort again, close, abort once more
    bool abortOnFailure = false;          // after a failed call: abort() (ABORT line), then the RESULT line
    std::uint32_t abortAfterMs = 0;       // a second thread calls abort() this long after open (ABORT line)
    bool checkFds = false;                // count fds before open and after close()
    std::int32_t dataProtocol = -1;       // announce this data protocol at open (testing::setDataProtocol)
};

// Open file descriptors of this process.
int countFds() {
    int n = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
        while (const dirent* e = ::readdir(d))
            if (e->d_name[0] != '.') ++n;
        ::closedir(d);
        --n; // the directory's own
    }
    return n;
}

struct Aligned {
    explicit Aligned(std::size_t n) : v((n + 64) / 8 + 1) {}
    std::uint8_t* data() { return reinterpret_cast<std::uint8_t*>(v.data()); }
    std::vector<std::uint64_t> v;
};

[[gnu::format(printf, 1, 2)]] void line(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::vprintf(fmt, ap);
    va_end(ap);
    std::fflush(stdout);
}

// A test that died never writes the file: give up then rather than linger.
Status waitForFile(const std::string& path) {
    const std::uint64_t deadline = monotonicNs() + 300 * 1000000000ull;
    while (!std::filesystem::exists(path)) {
        if (monotonicNs() > deadline) return Status{Errc::Timeout, "the test never wrote " + path};
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return okStatus();
}

// The open group whose calls runCalls makes: a failure's RESULT line also
// shows its health word, read before anything else asks the group.
const Group* calling = nullptr;

// openMs >= 0: the call that failed was Group::open, which took that long.
int finish(const Args& a, const Status& s, std::uint64_t calls, std::uint64_t startNs, double openMs = -1) {
    const double ms = double(monotonicNs() - startNs) / 1e6;
    char open[48] = "", health[80] = "";
    if (openMs >= 0) std::snprintf(open, sizeof open, "open_ms=%.1f ", openMs);
    if (calling && !s) {
        const Health h = calling->health();
        std::snprintf(health, sizeof health, "health=%s health_rank=%d ", std::string(errcName(h.code)).c_str(),
                      h.rank == Health::kNoRank ? -1 : int(h.rank));
    }
    if (s) line("RESULT rank=%u ok calls=%llu\n", a.rank, (unsigned long long)calls);
    else
        line("RESULT rank=%u error=%s calls=%llu elapsed_ms=%.1f %s%sdetail=%s\n", a.rank,
             std::string(errcName(s.code())).c_str(), (unsigned long long)calls, ms, open, health,
             s.error().detail.c_str());
    return s ? 0 : 1;
}

Result<std::unique_ptr<Group>> openGroup(const Args& a, Bootstrap& boot) {
    Options o;
    o.socketPath = a.socket;
    o.timeout = std::chrono::milliseconds(a.timeoutMs);
    if (a.openTimeoutMs) o.openTimeout = std::chrono::milliseconds(a.openTimeoutMs);
    o.buffers = a.buffers == "device" ? Buffers::Device : Buffers::Host;
    return Group::open(boot, a.rank, a.world, a.maxBytes, o);
}

// Every rank learns whether any rank saw the stop file: one extra allGather.
Result<bool> agreeStop(const Args& a, Group& g) {
    alignas(16) std::uint64_t mine[2] = {std::filesystem::exists(a.stopFile) ? 1u : 0u, 0};
    std::vector<std::uint64_t> all(2 * a.world + 2);
    if (auto s = g.allGather(mine, all.data(), sizeof mine); !s) return s.error();
    for (std::uint32_t r = 0; r < a.world; ++r)
        if (all[2 * r]) return true;
    return false;
}

// --fork-at: a child that tries the parent's group (a call, check, abort:
// each must be refused, nothing of the parent's touched), closes its copy
// (--fork-close) or not, and then lingers, as a worker process an engine
// forks would. Stdout goes to
// /dev/null after the FORKED line so that the test's pipe ends with the parent.
void forkAChild(const Args& a, Group& g) {
    const pid_t pid = ::fork();
    if (pid != 0) return; // the parent (or a failed fork: no line, the test says so)
    alignas(16) std::uint8_t send[16] = {}, recv[16 * 16]; // a world of at most 16
    const Status call = g.allGather(send, recv, sizeof send);
    const Status checked = g.check();
    const Status aborted = g.abort();
    if (a.forkClose) g.close();
    line("FORKED rank=%u child=%d call=%s check=%s abort=%s detail=%s\n", a.rank, int(::getpid()),
         std::string(errcName(call.code())).c_str(), std::string(errcName(checked.code())).c_str(),
         std::string(errcName(aborted.code())).c_str(), call ? "" : call.error().detail.c_str());
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    std::this_thread::sleep_for(std::chrono::seconds(60));
    std::_Exit(0);
}

// The calls of one open group; prints the RESULT line, returns the exit code.
int runCallsOn(const Args& a, Group& g) {
    if (!g.healthy()) { // a fresh group is healthy
        line("RESULT rank=%u baddata health %s before any call\n", a.rank, std::string(errcName(g.health().code)).c_str());
        return 3;
    }
    std::uint64_t maxSize = 0;
    for (auto s : a.sizes) maxSize = std::max(maxSize, s);
    const std::size_t outBytes = maxSize * a.world + 16; // + a mismatched row's 16
    Aligned send(maxSize), recv(outBytes), expect(maxSize);
    std::uint64_t calls = 0;
    std::uint64_t start = monotonicNs();
    const auto says = [&](const char* what, const Status& s) {
        line("%s rank=%u status=%s detail=%s\n", what, a.rank, std::string(errcName(s.code())).c_str(),
             s ? "" : s.error().detail.c_str());
    };
    // A failed call writes nothing into its output.
    auto failed = [&](const Status& s) {
        for (std::size_t i = 0; i < outBytes; ++i)
            if (recv.data()[i] != kSentinel) {
                line("RESULT rank=%u baddata output written on failure (%s, byte %zu)\n", a.rank,
                     std::string(errcName(s.code())).c_str(), i);
                return 3;
            }
        if (a.abortOnFailure) says("ABORT", g.abort());
        const int rc = finish(a, s, calls, start);
        // --hold-ms holds a failed rank's group open too (after its RESULT
        // line): a refusal that does not break the group (CapMismatch) must
        // not close this rank while slower peers are still in a call with it.
        if (a.holdMs) std::this_thread::sleep_for(std::chrono::milliseconds(a.holdMs));
        return rc;
    };
    for (std::uint64_t it = 0; it < a.iters; ++it) {
        if (std::int64_t(it) == a.exitAt) std::_Exit(0);
        if (std::int64_t(it) == a.forkAt) forkAChild(a, g);
        if (std::int64_t(it) == a.abortAt) {
            start = monotonicNs();
            says("ABORT", g.abort());
            if (a.abortThenClose) {
                says("ABORT-AGAIN", g.abort());
                g.close();
                says("ABORT-CLOSED", g.abort());
            }
            return finish(a, g.check(), calls, start);
        }
        if (std::int64_t(it) == a.stallAt) {
            line("STALL rank=%u calls=%llu\n", a.rank, (unsigned long long)calls);
            std::this_thread::sleep_for(std::chrono::seconds(60));
            return finish(a, Status{Errc::Timeout, "stalled rank woke up"}, calls, start);
        }
        if (std::int64_t(it) == a.pauseAt && !a.goFile.empty()) {
            line("PAUSED rank=%u calls=%llu\n", a.rank, (unsigned long long)calls);
            if (auto s = waitForFile(a.goFile); !s) return finish(a, s, calls, start);
        }
        if (!a.stopFile.empty() && it > 0 && it % 16 == 0) {
            auto stop = agreeStop(a, g);
            if (!stop) return finish(a, stop.error(), calls, start);
            if (*stop) break;
        }
        if (a.progress && it > 0 && it % a.progress == 0) line("PROGRESS rank=%u calls=%llu\n", a.rank, (unsigned long long)calls);
        const std::uint64_t size = a.sizes[it % a.sizes.size()];
        const bool sum = a.mode == "sum" || (a.mode == "mixed" && it % 2);
        const bool skew = std::int64_t(it) == a.mismatchAt && a.rank == a.world - 1;
        start = monotonicNs();
        std::memset(recv.data(), kSentinel, outBytes);
        if (a.mode == "gatherv") {
            // Rows of uneven length up to this iteration's size, one of them empty.
            std::vector<std::size_t> counts(a.world);
            std::size_t at = 0;
            for (std::uint32_t q = 0; q < a.world; ++q)
                counts[q] = q == it % a.world ? 0 : std::size_t(mix(it * 131 + q) % (size + 1));
            if (skew) counts[a.rank] += 16;
            fillBytes(send.data(), counts[a.rank], it, a.rank);
            const Status s = g.allGatherV(send.data(), recv.data(), counts);
            if (!s) return failed(s);
            for (std::uint32_t q = 0; q < a.world; at += counts[q++]) {
                fillBytes(expect.data(), counts[q], it, q);
                if (std::memcmp(recv.data() + at, expect.data(), counts[q]) != 0) {
                    line("RESULT rank=%u baddata gatherv iter=%llu row=%u\n", a.rank, (unsigned long long)it, q);
                    return 3;
                }
            }
            for (std::size_t i = at; i < outBytes; ++i)
                if (recv.data()[i] != kSentinel) {
                    line("RESULT rank=%u baddata gatherv iter=%llu wrote past its rows\n", a.rank, (unsigned long long)it);
                    return 3;
                }
        } else if (!sum) {
            fillBytes(send.data(), size, it, a.rank);
            const Status s = g.allGather(send.data(), recv.data(), skew && size >= 16 ? size - 16 : size);
            if (!s) return failed(s);
            for (std::uint32_t q = 0; q < a.world; ++q) {
                fillBytes(expect.data(), size, it, q);
                if (std::memcmp(recv.data() + q * size, expect.data(), size) != 0) {
                    line("RESULT rank=%u baddata gather iter=%llu size=%llu row=%u\n", a.rank, (unsigned long long)it,
                         (unsigned long long)size, q);
                    return 3;
                }
            }
        } else {
            const DType types[] = {DType::F32, DType::F16, DType::BF16};
            const DType t = types[(it / 2) % 3];
            const std::size_t count = size / dtypeSize(t);
            fillValues(send.data(), count, t, it, a.rank);
            const Status s = g.allReduceSum(send.data(), recv.data(), skew ? count - 16 / dtypeSize(t) : count, t);
            if (!s) return failed(s);
            const auto ref = referenceSum(count, t, it, a.world);
            if (std::memcmp(recv.data(), ref.data(), ref.size()) != 0) {
                line("RESULT rank=%u baddata sum iter=%llu count=%zu\n", a.rank, (unsigned long long)it, count);
                return 3;
            }
        }
        ++calls;
    }
    if (const Health h = g.health(); !h.ok()) { // every call of the run succeeded
        line("RESULT rank=%u baddata health %s after %llu good calls\n", a.rank, std::string(errcName(h.code)).c_str(),
             (unsigned long long)calls);
        return 3;
    }
    if (a.holdMs) std::this_thread::sleep_for(std::chrono::milliseconds(a.holdMs));
    return finish(a, okStatus(), calls, start);
}

int runCalls(const Args& a, Group& g) {
    calling = &g;
    const int rc = runCallsOn(a, g);
    calling = nullptr;
    return rc;
}

// After a failed call: open again at once (no daemon: refused by name), then
// once more when the test says the daemon is back.
int reopenAfterFailure(const Args& a, Bootstrap& boot, int failedRc) {
    std::uint64_t start = monotonicNs();
    auto again = openGroup(a, boot);
    const double ms = double(monotonicNs() - start) / 1e6;
    if (again) line("REOPEN rank=%u ok path=%s\n", a.rank, (*again)->path().c_str());
    else
        line("REOPEN rank=%u error=%s elapsed_ms=%.1f detail=%s\n", a.rank, std::string(errcName(again.code())).c_str(), ms,
             again.error().detail.c_str());
    if (a.reopenGoFile.empty()) return failedRc;
    again = Error{}; // leave a group that did open before the next one
    if (auto s = waitForFile(a.reopenGoFile); !s) return finish(a, s, 0, start);
    start = monotonicNs();
    auto fresh = openGroup(a, boot);
    if (!fresh) return finish(a, fresh.error(), 0, start);
    Args plain = a; // the fresh group runs clean: no faults, no stop file
    plain.iters = a.reopenIters;
    plain.abortAt = plain.stallAt = plain.exitAt = plain.pauseAt = -1;
    plain.stopFile.clear();
    return runCalls(plain, **fresh);
}

} // namespace

int main(int argc, char** argv) {
    Args a;
    CLI::App app{"tpfabric integration-test rank"};
    app.add_option("--socket", a.socket)->required();
    app.add_option("--bootstrap", a.bootstrap, "host:port of rank 0")->required();
    app.add_option("--rank", a.rank)->required();
    app.add_option("--world", a.world)->required();
    app.add_option("--max-bytes", a.maxBytes);
    app.add_option("--iters", a.iters);
    app.add_option("--sizes", a.sizes)->delimiter(',');
    app.add_option("--mode", a.mode);
    app.add_option("--timeout-ms", a.timeoutMs);
    app.add_option("--abort-at", a.abortAt);
    app.add_option("--stall-at", a.stallAt);
    app.add_option("--exit-at", a.exitAt);
    app.add_option("--fork-at", a.forkAt, "fork() a child that tries the group and sleeps 60 s (FORKED line)");
    app.add_flag("--fork-close", a.forkClose, "the --fork-at child closes its copy of the group first");
    app.add_option("--mismatch-at", a.mismatchAt, "the last rank's counts differ at this iteration (gatherv), or its size is 16 bytes less (gather, sum)");
    app.add_option("--pause-at", a.pauseAt, "before this iteration print PAUSED and wait for --go-file");
    app.add_option("--go-file", a.goFile);
    app.add_option("--stop-file", a.stopFile, "every 16 calls the ranks agree whether it exists; stop ok if so");
    app.add_option("--progress", a.progress, "print PROGRESS every this many calls");
    app.add_option("--hold-ms", a.holdMs);
    app.add_flag("--reopen", a.reopen, "after a failed call, close and open again");
    app.add_option("--reopen-go-file", a.reopenGoFile, "then wait for this file and open once more");
    app.add_option("--reopen-iters", a.reopenIters);
    app.add_option("--open-timeout-ms", a.openTimeoutMs, "Options::openTimeout");
    app.add_option("--bootstrap-timeout-ms", a.bootstrapTimeoutMs, "the TcpBootstrap's create timeout");
    app.add_option("--bootstrap-world", a.bootstrapWorld, "the TcpBootstrap's world (default: --world)");
    app.add_option("--bootstrap-rank", a.bootstrapRank, "the TcpBootstrap's rank (default: --rank)");
    app.add_option("--buffers", a.buffers, "host or device")->check(CLI::IsMember({"host", "device"}));
    app.add_flag("--skip-open", a.skipOpen, "create the bootstrap, print BOOTSTRAP, hold --hold-ms, never open");
    app.add_flag("--exit-before-open", a.exitBeforeOpen, "exit right after creating the bootstrap");
    app.add_flag("--abort-then-close", a.abortThenClose, "after --abort-at: abort again, close, abort once more");
    app.add_flag("--abort-on-failure", a.abortOnFailure, "after a failed call: abort() (ABORT line), then RESULT");
    app.add_option("--abort-after-ms", a.abortAfterMs, "a second thread calls abort() this long after open (ABORT line)");
    app.add_flag("--check-fds", a.checkFds, "print FDS: fds before open and after close()");
    app.add_option("--data-protocol", a.dataProtocol, "announce this data protocol at open, as another release would");
    CLI11_PARSE(app, argc, argv);
    if (a.dataProtocol >= 0) setDataProtocol(std::uint16_t(a.dataProtocol));

    const std::uint64_t t0 = monotonicNs();
    auto boot = TcpBootstrap::create(a.bootstrapRank >= 0 ? std::uint32_t(a.bootstrapRank) : a.rank,
                                     a.bootstrapWorld ? a.bootstrapWorld : a.world, a.bootstrap,
                                     std::chrono::milliseconds(a.bootstrapTimeoutMs));
    if (!boot) return finish(a, boot.error(), 0, t0);
    if (a.exitBeforeOpen) std::_Exit(0);
    if (a.skipOpen) {
        line("BOOTSTRAP rank=%u\n", a.rank);
        std::this_thread::sleep_for(std::chrono::milliseconds(a.holdMs));
        line("RESULT rank=%u skipped open\n", a.rank);
        return 0;
    }
    const int fdsBefore = countFds();
    const std::uint64_t openStart = monotonicNs();
    auto group = openGroup(a, **boot);
    const double openMs = double(monotonicNs() - openStart) / 1e6;
    if (!group) return finish(a, group.error(), 0, t0, openMs);
    line("OPEN rank=%u cap=%llu open_ms=%.1f\n", a.rank, (unsigned long long)(*group)->agreedCap(), openMs);
    // --abort-after-ms: the shutdown request of an engine, from a thread of
    // its own while the calls' thread may be blocked in one (joined before
    // the group goes).
    std::jthread aborter;
    if (a.abortAfterMs)
        aborter = std::jthread([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(a.abortAfterMs));
            const Status s = (*group)->abort();
            line("ABORT rank=%u status=%s detail=%s\n", a.rank, std::string(errcName(s.code())).c_str(),
                 s ? "" : s.error().detail.c_str());
        });
    const int rc = runCalls(a, **group);
    if (aborter.joinable()) aborter.join();
    if (a.checkFds) {
        (*group)->close(); // the Group object lives on: close() alone must release everything
        line("FDS rank=%u before=%d after=%d\n", a.rank, fdsBefore, countFds());
    }
    if (rc != 1 || !a.reopen) return rc;
    group = Error{}; // closes the broken group
    return reopenAfterFailure(a, **boot, rc);
}
