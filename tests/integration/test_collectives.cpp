// Real daemon, real rank processes: gathers byte-exact and sums bit-exact for
// W in {2, 3, 4, 8, 16}, every size class from empty shards to the cap, any
// byte and element count; all-gather-v with uneven rows, and mismatched counts.
#include <cstdlib>
#include <string>
#include <vector>

#include "catch.hpp"
#include "harness.hpp"

using namespace tpf::testing;

namespace {

// Calls per size class: 2000, scaled by $TPF_IT_SCALE (0 < scale <= 1) where
// every call costs more (sanitizer builds in tests/run.sh use 0.1).
std::uint64_t perSize() {
    const char* v = std::getenv("TPF_IT_SCALE");
    const double scale = v && *v ? std::atof(v) : 1.0;
    if (!(scale > 0.0) || scale >= 1.0) return 2000;
    const auto n = std::uint64_t(2000 * scale);
    return n ? n : 1;
}

std::string join(const std::vector<std::uint64_t>& v) {
    std::string s;
    for (auto x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
    return s;
}

// Every rank must end "ok" with `calls` calls.
void runAndCheck(std::uint32_t world, std::uint64_t cap, const std::vector<std::uint64_t>& sizes, const char* mode,
                 std::uint64_t iters) {
    Daemon d;
    auto run = startRanks(d, world, {"--max-bytes", std::to_string(cap), "--sizes", join(sizes), "--mode", mode,
                                     "--iters", std::to_string(iters), "--timeout-ms", "20000"});
    std::vector<Child*> all;
    for (auto& c : run.ranks) all.push_back(&c);
    const bool clean = waitAll(all, 600000);
    INFO("daemon log:\n" << d.log());
    REQUIRE(clean);
    for (std::uint32_t r = 0; r < world; ++r) {
        INFO("rank " << r << ": " << run.line(r));
        CHECK(exitCode(run.ranks[r]) == 0);
        CHECK(run.line(r) == "RESULT rank=" + std::to_string(r) + " ok calls=" + std::to_string(iters));
    }
}

} // namespace

// Size classes: empty, 16 B, odd sizes around a page, 64 KiB + 16, and the cap.
TEST_CASE("gathers are byte-exact for W = 2, 3, 4 up to a 512 KiB cap") {
    const std::uint64_t cap = 512 * 1024;
    const std::vector<std::uint64_t> sizes{0, 16, 1000, 4097, 65552, cap - 3, cap};
    for (std::uint32_t world : {2u, 3u, 4u}) {
        DYNAMIC_SECTION("world " << world) { runAndCheck(world, cap, sizes, "gather", perSize() * sizes.size()); }
    }
}

TEST_CASE("gathers are byte-exact for W = 8 and 16 up to a 64 KiB cap") {
    const std::uint64_t cap = 64 * 1024;
    const std::vector<std::uint64_t> sizes{0, 16, 1000, 4097, cap - 1, cap};
    for (std::uint32_t world : {8u, 16u}) {
        DYNAMIC_SECTION("world " << world) { runAndCheck(world, cap, sizes, "gather", perSize() * sizes.size()); }
    }
}

// Sums cycle f32, f16, bf16; values where the order changes the bits.
TEST_CASE("sums are bit-exact against the rank-order reference for every W") {
    const std::vector<std::uint64_t> sizes{16, 1008, 4096, 65536};
    for (std::uint32_t world : {2u, 3u, 4u, 8u, 16u}) {
        DYNAMIC_SECTION("world " << world) { runAndCheck(world, 64 * 1024, sizes, "sum", perSize()); }
    }
}

// Sizes no 16-byte rule divides: a gather of 1, 15, 100 bytes, sums of odd
// element counts (2 and 6 bytes are one f16/bf16 and 3 of them, or no f32).
TEST_CASE("any byte and element count, W = 2 .. 16") {
    for (std::uint32_t world : {2u, 5u, 16u}) {
        const std::uint64_t cap = world == 16 ? 4097 : 65536 - 3;
        DYNAMIC_SECTION("world " << world) {
            runAndCheck(world, cap, {1, 15, 100, 4097, cap - 1}, "gather", perSize() / 4 * 5);
            runAndCheck(world, cap, {2, 6, 100, 1030, cap - 1}, "sum", perSize() / 4 * 5);
        }
    }
}

TEST_CASE("all-gather-v: uneven rows, zeros among them, up to the cap, W = 2 .. 16") {
    for (std::uint32_t world : {2u, 3u, 8u, 16u}) {
        const std::uint64_t cap = world >= 8 ? 8192 : 65536;
        DYNAMIC_SECTION("world " << world) { runAndCheck(world, cap, {1, 100, 4097, cap}, "gatherv", perSize() / 2); }
    }
}

// Ranks run with --mismatch-at 5 (the last rank passes other counts or
// sizes at call 5): every rank ends with call 5 failed by name, its output
// untouched (tpf-testrank checks it), its line holding what `says(r)` lists.
template <class Says>
void requireMismatchAtCall5(RankRun& run, std::uint32_t world, Says says) {
    std::vector<Child*> all;
    for (auto& c : run.ranks) all.push_back(&c);
    REQUIRE(waitAll(all, 60000));
    for (std::uint32_t r = 0; r < world; ++r) {
        INFO("rank " << r << ": " << run.line(r));
        CHECK(exitCode(run.ranks[r]) == 1);
        CHECK(run.line(r).find("error=GroupMismatch calls=5") != std::string::npos);
        for (const std::string& text : says(r)) CHECK(run.line(r).find(text) != std::string::npos);
    }
}

// The last rank's own counts differ at call 5: every rank's call 5 fails by
// name (GroupMismatch) and writes nothing (tpf-testrank checks its output).
TEST_CASE("all-gather-v with mismatched counts fails by name on every rank, nothing written") {
    for (std::uint32_t world : {2u, 4u}) {
        DYNAMIC_SECTION("world " << world) {
            Daemon d;
            auto run = startRanks(d, world, {"--max-bytes", "4096", "--sizes", "4000", "--mode", "gatherv", "--iters", "20",
                                             "--mismatch-at", "5"});
            requireMismatchAtCall5(run, world, [](std::uint32_t) { return std::vector<std::string>{"passed other counts"}; });
        }
    }
}

// The same for allGather and allReduceSum: the last rank passes 16 bytes
// less at call 5. Every row carries a trailer naming its call, so
// every rank fails call 5 by name, nothing written, whether the rows came
// straight from the peers' regions or through the daemon's proxy.
TEST_CASE("gather and sum with a size that differs between ranks fail by name on every rank, nothing written") {
    for (const char* mode : {"gather", "sum"})
        for (std::uint32_t world : {2u, 3u})
            for (const char* direct : {"1", "0"}) {
                DYNAMIC_SECTION(mode << " world " << world << " TPF_HOST_DIRECT=" << direct) {
                    Daemon d;
                    auto run = startRanks(d, world,
                                          {"--max-bytes", "4096", "--sizes", "4096,48", "--mode", mode, "--iters", "20",
                                           "--mismatch-at", "5"},
                                          {}, {{"TPF_HOST_DIRECT", direct}});
                    // call 5: 48 bytes, 32 on the last rank; each names its own call and the other rank
                    requireMismatchAtCall5(run, world, [world](std::uint32_t r) {
                        const bool last = r + 1 == world;
                        return std::vector<std::string>{last ? " of 32 bytes" : " of 48 bytes",
                                                        last ? "rank 0 passed another size" : "passed another size",
                                                        "(every rank of a call passes the same op, dtype and size)"};
                    });
                }
            }
}
