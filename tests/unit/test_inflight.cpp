// The in-flight cap (daemon/inflight.hpp): driven the way the proxy drives it
// for a world-4 group (three peers, two stripes each), with completions that
// arrive late and in bursts, a post never leaves more than cap + one payload
// outstanding on a queue pair, and every post eventually goes out.
#include <catch.hpp>

#include <deque>
#include <random>
#include <vector>

#include "daemon/verbs/inflight.hpp"
#include "proto/layout.hpp"

using tpf::daemon::InflightGate;

namespace {
struct SimQp {
    InflightGate gate;
    std::deque<std::uint64_t> signaled; // bytes of each post not yet completed, in order
    SimQp(std::uint64_t cap, std::uint32_t wrs) : gate(cap, wrs) {}
};
} // namespace

TEST_CASE("inflight gate: a post adds at most one payload past the cap") {
    const std::uint64_t cap = 64 * 1024;
    const std::uint32_t maxWrs = 32;
    std::mt19937_64 rng(7);
    for (const std::uint64_t payload : {std::uint64_t(16), std::uint64_t(4096), std::uint64_t(48 * 1024),
                                        std::uint64_t(200 * 1024), std::uint64_t(512 * 1024)}) {
        std::deque<SimQp> qps;
        for (int i = 0; i < 3 * 2; ++i) qps.emplace_back(cap, maxWrs);
        std::uint64_t largest = 0;
        auto pollSome = [&] {
            // The NIC finishes the oldest posts of a random QP, a random number of them.
            auto& q = qps[rng() % qps.size()];
            for (std::size_t n = rng() % 4; n && !q.signaled.empty(); --n) {
                q.gate.retireOldest();
                q.signaled.pop_front();
            }
        };
        for (int call = 0; call < 2000; ++call) {
            const std::uint64_t bytes = payload - (rng() % 16) * 16 * (payload > 256);
            for (std::uint32_t peer = 0; peer < 3; ++peer)
                for (std::uint32_t k = 0; k < 2; ++k) {
                    const auto s = tpf::stripeOf(bytes, 2, k);
                    auto& q = qps[peer * 2 + k];
                    int spins = 0;
                    while (q.gate.mustWait(2)) {
                        pollSome();
                        REQUIRE(++spins < 100000);
                    }
                    const std::uint64_t posted = s.bytes + 8; // payload + flag
                    q.gate.posted(posted, 2);
                    q.signaled.push_back(posted);
                    largest = std::max(largest, posted);
                    REQUIRE(q.gate.bytes() <= cap + largest);
                    REQUIRE(q.gate.wrs() <= maxWrs);
                }
            if (rng() % 3 == 0) pollSome();
        }
        for (auto& q : qps) CHECK(q.gate.highWater() <= cap + largest);
    }
}

TEST_CASE("inflight gate: a payload above the cap still goes out alone") {
    InflightGate g(4096, 8);
    CHECK_FALSE(g.mustWait(2));
    g.posted(1 << 20, 2);
    CHECK(g.mustWait(2));
    g.retireOldest();
    CHECK_FALSE(g.mustWait(2));
    CHECK(g.highWater() == 1 << 20);
}

TEST_CASE("inflight gate: the send queue bounds work requests") {
    InflightGate g(1 << 30, 4);
    g.posted(8, 2);
    g.posted(8, 2);
    CHECK(g.mustWait(2));
    CHECK(g.wrs() == 4);
    g.retireOldest();
    CHECK_FALSE(g.mustWait(2));
}
