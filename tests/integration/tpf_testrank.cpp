// One rank of an integration test: opens a group on the real daemon and runs
// collectives, checking every result byte for byte. Prints one line
//   RESULT rank=R ok calls=N
// or
//   RESULT rank=R error=NAME calls=N elapsed_ms=T detail=...
// and exits 0 (ok), 1 (a collective failed), 2 (usage) or 3 (wrong data).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "client/reduce.hpp"
#include "common/shm.hpp"
#include "pattern.hpp"
#include <tpfabric/tpfabric.hpp>

using namespace tpf;
using namespace tpf::testing;

namespace {

struct Args {
    std::string socket, bootstrap;
    std::uint32_t rank = 0, world = 2;
    std::uint64_t maxBytes = 65536;
    std::uint64_t iters = 100;
    std::vector<std::uint64_t> sizes{16};
    std::string mode = "gather"; // gather | sum | mixed
    std::uint32_t timeoutMs = 5000;
    std::int64_t abortAt = -1;   // call abort() before this iteration
    std::int64_t stallAt = -1;   // stop posting (sleep) at this iteration
    std::int64_t exitAt = -1;    // _exit(0) without closing at this iteration
    std::uint32_t holdMs = 0;    // wait this long before closing (keep the group open)
};

struct Aligned {
    explicit Aligned(std::size_t n) : v((n + 64) / 8 + 1) {}
    std::uint8_t* data() { return reinterpret_cast<std::uint8_t*>(v.data()); }
    std::vector<std::uint64_t> v;
};

int finish(const Args& a, const Status& s, std::uint64_t calls, std::uint64_t startNs) {
    const double ms = double(monotonicNs() - startNs) / 1e6;
    if (s) std::printf("RESULT rank=%u ok calls=%llu\n", a.rank, (unsigned long long)calls);
    else
        std::printf("RESULT rank=%u error=%s calls=%llu elapsed_ms=%.1f detail=%s\n", a.rank,
                    std::string(errcName(s.code())).c_str(), (unsigned long long)calls, ms, s.error().detail.c_str());
    std::fflush(stdout);
    return s ? 0 : 1;
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
    app.add_option("--hold-ms", a.holdMs);
    CLI11_PARSE(app, argc, argv);

    auto boot = TcpBootstrap::create(a.rank, a.world, a.bootstrap);
    if (!boot) return finish(a, boot.error(), 0, monotonicNs());
    Options o;
    o.socketPath = a.socket;
    o.timeout = std::chrono::milliseconds(a.timeoutMs);
    auto group = Group::open(**boot, a.rank, a.world, a.maxBytes, o);
    if (!group) return finish(a, group.error(), 0, monotonicNs());
    Group& g = **group;

    std::uint64_t maxSize = 0;
    for (auto s : a.sizes) maxSize = std::max(maxSize, s);
    Aligned send(maxSize), recv(maxSize * a.world), expect(maxSize);
    std::uint64_t calls = 0;
    std::uint64_t start = monotonicNs();
    for (std::uint64_t it = 0; it < a.iters; ++it) {
        if (std::int64_t(it) == a.exitAt) std::_Exit(0);
        if (std::int64_t(it) == a.abortAt) {
            start = monotonicNs();
            (void)g.abort();
            return finish(a, g.check(), calls, start);
        }
        if (std::int64_t(it) == a.stallAt) {
            std::this_thread::sleep_for(std::chrono::seconds(60));
            return finish(a, Status{Errc::Timeout, "stalled rank woke up"}, calls, start);
        }
        const std::uint64_t size = a.sizes[it % a.sizes.size()];
        const bool sum = a.mode == "sum" || (a.mode == "mixed" && it % 2);
        start = monotonicNs();
        std::memset(recv.data(), 0xa5, maxSize * a.world);
        if (!sum) {
            fillBytes(send.data(), size, it, a.rank);
            const Status s = g.allGather(send.data(), recv.data(), size);
            if (!s) {
                // A failed call writes nothing into its output.
                for (std::size_t i = 0; i < size * a.world; ++i)
                    if (recv.data()[i] != 0xa5) {
                        std::printf("RESULT rank=%u baddata output written on failure\n", a.rank);
                        return 3;
                    }
                return finish(a, s, calls, start);
            }
            for (std::uint32_t q = 0; q < a.world; ++q) {
                fillBytes(expect.data(), size, it, q);
                if (std::memcmp(recv.data() + q * size, expect.data(), size) != 0) {
                    std::printf("RESULT rank=%u baddata gather iter=%llu size=%llu row=%u\n", a.rank,
                                (unsigned long long)it, (unsigned long long)size, q);
                    return 3;
                }
            }
        } else {
            const DType types[] = {DType::F32, DType::F16, DType::BF16};
            const DType t = types[(it / 2) % 3];
            const std::size_t count = size / dtypeSize(t);
            fillValues(send.data(), count, t, it, a.rank);
            const Status s = g.allReduceSum(send.data(), recv.data(), count, t);
            if (!s) return finish(a, s, calls, start);
            const auto ref = referenceSum(count, t, it, a.world);
            if (std::memcmp(recv.data(), ref.data(), ref.size()) != 0) {
                std::printf("RESULT rank=%u baddata sum iter=%llu count=%zu\n", a.rank, (unsigned long long)it, count);
                return 3;
            }
        }
        ++calls;
    }
    if (a.holdMs) std::this_thread::sleep_for(std::chrono::milliseconds(a.holdMs));
    return finish(a, okStatus(), calls, start);
}
