// The daemon's side of a GPU rank's proxy route, driven from host ranks:
// tpf-testrank --staged-lines makes a rank stage each shard for the proxy as
// the device kernel does below its stagedLinesMax (kDoorbellLines,
// proto/ring.hpp): the doorbell first, then the shard's LL lines in its
// ring. The proxy waits for the lines, unpacks them into the rank's slot and
// carries the shard as any other; the peers see rows and flags as before.
#include <nlohmann/json.hpp>

#include "catch.hpp"
#include "harness.hpp"

#include "common/shm.hpp"

using namespace tpf::testing;

namespace {

std::uint64_t proxyDoorbells(const Daemon& d) {
    return nlohmann::json::parse(statusJson(d.socket()))["daemon"]["proxy"]["doorbells"].get<std::uint64_t>();
}

std::vector<Child*> pointers(RankRun& run) {
    std::vector<Child*> all;
    for (auto& c : run.ranks) all.push_back(&c);
    return all;
}

} // namespace

// Sizes: 16 B and 4 KiB go as lines; 12,345 B (not a multiple of 16) and
// 128 KiB (above kStagedLinesMax) through the slot, so one rank's ring mixes
// both kinds of doorbell, call by call, in each phase.
TEST_CASE("staged lines: W = 2, 3, 4, every rank or one, gathers and sums exact, one doorbell a call") {
    const std::uint64_t iters = 150;
    for (std::uint32_t world : {2u, 3u, 4u}) {
        for (const bool all : {true, false}) {
            DYNAMIC_SECTION("world " << world << (all ? ", every rank" : ", rank 1 alone")) {
                Daemon d;
                std::map<std::uint32_t, std::vector<std::string>> perRank;
                for (std::uint32_t r = 0; r < world; ++r)
                    if (all || r == 1) perRank[r] = {"--staged-lines", "lines"};
                auto run = startRanks(d, world,
                                      {"--iters", std::to_string(iters), "--max-bytes", "131072", "--sizes",
                                       "16,4096,12345,65536,131072", "--mode", "mixed"},
                                      perRank, {{"TPF_HOST_DIRECT", "0"}});
                REQUIRE(waitAll(pointers(run), 300000));
                INFO("daemon log:\n" << d.log());
                for (std::uint32_t r = 0; r < world; ++r)
                    CHECK(run.line(r) == "RESULT rank=" + std::to_string(r) + " ok calls=" + std::to_string(iters));
                CHECK(proxyDoorbells(d) == world * iters);
            }
        }
    }
}

// A doorbell whose lines never come (a kernel that died between its
// doorbell and its stores): the proxy gives up after Proxy::kLinesWaitNs,
// the group breaks naming the rank, and the daemon serves the next group.
TEST_CASE("staged lines: a rank that rings and writes no line ends the group PeerLost within the proxy's bound; the daemon goes on") {
    Daemon d;
    const std::uint32_t world = 3, silent = 2, timeoutMs = 20000;
    auto run = startRanks(d, world, {"--iters", "50", "--sizes", "4096", "--timeout-ms", std::to_string(timeoutMs)},
                          {{silent, {"--staged-lines", "never"}}}, {{"TPF_HOST_DIRECT", "0"}});
    const std::uint64_t start = tpf::monotonicNs();
    REQUIRE(waitAll(pointers(run), 60000));
    INFO("daemon log:\n" << d.log());
    for (std::uint32_t r = 0; r < world; ++r) {
        INFO("rank " << r << ": " << run.line(r));
        // The others never get epoch 1 from rank 2; rank 2 itself may finish it (their shards reach it).
        CHECK(run.line(r).find(r == silent ? " error=PeerLost calls=" : " error=PeerLost calls=0 ") != std::string::npos);
        CHECK(run.line(r).find("rank 2") != std::string::npos);
        CHECK(exitCode(run.ranks[r]) == 1); // 3 would be output written by a failed call
        // The proxy's 1 s bound, not the ranks' 20 s timeout.
        CHECK(run.ranks[r].endedNs - start < 10000ull * 1000000ull);
    }
    CHECK(d.log().find("rank 2 staged 0 of 4096 bytes of epoch 1 as lines within 1000 ms") != std::string::npos);
    auto next = startRanks(d, 2, {"--iters", "20", "--sizes", "4096"}, {{0, {"--staged-lines", "lines"}}},
                           {{"TPF_HOST_DIRECT", "0"}});
    REQUIRE(waitAll(pointers(next), 60000));
    for (std::uint32_t r = 0; r < 2; ++r) CHECK(next.line(r) == "RESULT rank=" + std::to_string(r) + " ok calls=20");
}
