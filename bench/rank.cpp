// One rank of a world: open a group on the running daemon, time every call of
// the sweep, check the last result of each point, report over a pipe.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "bench/bench.hpp"
#include <tpfabric/tpfabric.hpp>

namespace tpf::bench {

namespace {

struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<std::uint8_t, FreeDeleter>;

Buffer alignedBuffer(std::size_t bytes) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes); // fault the pages in before anything is timed
    return Buffer(static_cast<std::uint8_t*>(p));
}

std::uint8_t gatherByte(std::uint32_t rank, std::size_t i) { return std::uint8_t(rank * 31 + i * 7 + 1); }

// Small integers are exact in bf16 (the upper half of their f32 bits) and
// in f16 (n <= 2048: exponent 15 + e, the bits below the leading one).
std::uint16_t halfOf(unsigned n, Op op) {
    const float f = float(n);
    std::uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    if (op == Op::SumBf16) return std::uint16_t(bits >> 16);
    if (n == 0) return 0;
    const std::uint32_t e = (bits >> 23) - 127;
    return std::uint16_t((e + 15) << 10 | ((bits >> 13) & 0x3ffu));
}

void fillSend(std::uint8_t* send, Op op, std::uint32_t rank, std::size_t bytes) {
    if (op == Op::Gather) {
        for (std::size_t i = 0; i < bytes; ++i) send[i] = gatherByte(rank, i);
    } else {
        const std::uint16_t v = halfOf(rank + 1, op);
        for (std::size_t i = 0; i + 1 < bytes; i += 2) std::memcpy(send + i, &v, 2);
    }
}

// An empty string when recv holds the right answer.
std::string checkRecv(const std::uint8_t* recv, Op op, std::uint32_t world, std::size_t bytes) {
    if (op == Op::Gather) {
        for (std::uint32_t q = 0; q < world; ++q)
            for (std::size_t i = 0; i < bytes; ++i)
                if (recv[q * bytes + i] != gatherByte(q, i))
                    return "gather row " + std::to_string(q) + " byte " + std::to_string(i) + " is wrong";
        return {};
    }
    const std::uint16_t want = halfOf(world * (world + 1) / 2, op);
    for (std::size_t i = 0; i + 1 < bytes; i += 2) {
        std::uint16_t got;
        std::memcpy(&got, recv + i, 2);
        if (got != want) return "sum element " + std::to_string(i / 2) + " is wrong";
    }
    return {};
}

bool writeAll(int fd, const std::string& s) {
    std::size_t done = 0;
    while (done < s.size()) {
        const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        done += std::size_t(n);
    }
    return true;
}

int reportError(int fd, std::uint32_t rank, const std::string& what, int code) {
    const nlohmann::json j = {{"rank", rank}, {"error", what}};
    writeAll(fd, j.dump());
    ::close(fd);
    return code;
}

} // namespace

int runRank(const RankPlan& plan, std::uint32_t rank, int reportFd) {
    auto boot = TcpBootstrap::create(rank, plan.world, plan.bootstrap);
    if (!boot) return reportError(reportFd, rank, "bootstrap: " + boot.error().describe(), 1);
    std::uint64_t maxSize = 0;
    for (auto s : plan.sizes) maxSize = std::max(maxSize, s);
    Options o;
    o.socketPath = plan.sockets[rank % plan.sockets.size()];
    o.timeout = std::chrono::milliseconds(plan.timeoutMs);
    o.spin = std::chrono::microseconds(plan.spinUs);
    // Each open starts together on every rank (a barrier on the bootstrap),
    // so its time is the open's own, not the wait for a late process.
    std::vector<std::uint64_t> openNs;
    std::unique_ptr<Group> group;
    for (std::uint32_t k = 0; k < std::max<std::uint32_t>(1, plan.opens); ++k) {
        if (group) group->close();
        group.reset();
        std::uint64_t ready = 1;
        std::vector<std::uint64_t> all(plan.world);
        if (const Status s = (*boot)->allGather(&ready, all.data(), sizeof ready); !s)
            return reportError(reportFd, rank, "bootstrap barrier before open " + std::to_string(k) + ": " + s.error().describe(), 1);
        const std::uint64_t t0 = nowNs();
        auto opened = Group::open(**boot, rank, plan.world, maxSize, o);
        openNs.push_back(nowNs() - t0);
        if (!opened) return reportError(reportFd, rank, "Group::open (" + std::to_string(k + 1) + " of " +
                                                            std::to_string(plan.opens) + "): " + opened.error().describe(), 1);
        group = std::move(*opened);
    }
    Group& g = *group;

    Buffer send = alignedBuffer(maxSize), recv = alignedBuffer(maxSize * plan.world);
    nlohmann::json points = nlohmann::json::array();
    std::vector<std::uint64_t> ns;
    ns.reserve(plan.iters);
    for (const Op op : plan.ops) {
        for (const std::uint64_t size : plan.sizes) {
            fillSend(send.get(), op, rank, size);
            auto call = [&] {
                return op == Op::Gather ? g.allGather(send.get(), recv.get(), size)
                                        : g.allReduceSum(send.get(), recv.get(), size / 2, op == Op::SumF16 ? DType::F16 : DType::BF16);
            };
            auto failed = [&](const std::string& why) {
                return reportError(reportFd, rank, std::string(opName(op)) + " " + std::to_string(size) + " B: " + why, 1);
            };
            std::uint64_t iters = plan.iters, warmup = plan.warmup;
            if (plan.pointMs) {
                // Two probe calls; the slowest rank's second one sets this
                // point's call count, identically on every rank.
                std::uint64_t probe = 1;
                for (int i = 0; i < 2; ++i) {
                    const std::uint64_t t0 = nowNs();
                    if (const Status s = call(); !s) return failed(s.error().describe());
                    probe = std::max<std::uint64_t>(1, nowNs() - t0);
                }
                std::vector<std::uint64_t> all(plan.world);
                if (const Status s = (*boot)->allGather(&probe, all.data(), sizeof probe); !s)
                    return failed("bootstrap: " + s.error().describe());
                const std::uint64_t slowest = *std::max_element(all.begin(), all.end());
                iters = std::clamp<std::uint64_t>(plan.pointMs * 1000000ull / slowest, std::min(plan.minIters, plan.iters),
                                                  plan.iters);
                // The probes were warm-up calls too.
                warmup = std::min(plan.warmup, iters / 5);
                warmup = warmup > 2 ? warmup - 2 : 0;
            }
            ns.clear();
            for (std::uint64_t i = 0; i < warmup + iters; ++i) {
                const std::uint64_t t0 = nowNs();
                const Status s = call();
                const std::uint64_t t1 = nowNs();
                if (!s) return failed(s.error().describe());
                if (i >= warmup) ns.push_back(t1 - t0);
            }
            if (auto bad = checkRecv(recv.get(), op, plan.world, size); !bad.empty())
                return reportError(reportFd, rank, std::string(opName(op)) + " " + std::to_string(size) + " B: " + bad, 3);
            points.push_back({{"op", opKey(op)}, {"size", size}, {"warmup", warmup}, {"ns", ns}});
        }
    }
    std::vector<std::string> routes;
    for (std::uint32_t q = 0; q < plan.world; ++q) routes.push_back(g.route(q));
    const nlohmann::json report = {{"rank", rank}, {"pid", ::getpid()}, {"routes", routes},
                                   {"agreed_cap", g.agreedCap()}, {"open_ns", openNs}, {"points", std::move(points)}};
    const bool sent = writeAll(reportFd, report.dump());
    ::close(reportFd);
    if (plan.releaseFd >= 0) {
        for (;;) { // until EOF: the parent closed its end (or died)
            char c;
            const ssize_t n = ::read(plan.releaseFd, &c, 1);
            if (n > 0 || (n < 0 && errno == EINTR)) continue;
            break;
        }
        ::close(plan.releaseFd);
    }
    if (plan.holdMs) std::this_thread::sleep_for(std::chrono::milliseconds(plan.holdMs));
    g.close();
    return sent ? 0 : 1;
}

} // namespace tpf::bench
