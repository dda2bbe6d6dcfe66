// The host-direct path (docs/design.md §4): same-node ranks of a host group
// publish their shards in their own regions and read each other's rows there
// ("pull"), so the daemon's proxy carries nothing for them; TPF_HOST_DIRECT=0
// forces the old proxy-carried path. Both must be byte/bit-exact and fail alike.
#include <csignal>
#include <cstdlib>
#include <thread>

#include <nlohmann/json.hpp>

#include "catch.hpp"
#include "harness.hpp"

#include "common/shm.hpp"

using namespace tpf::testing;

namespace {

// Doorbells the daemon's proxy carried out since it started (status).
std::uint64_t proxyDoorbells(const Daemon& d) {
    return nlohmann::json::parse(statusJson(d.socket()))["daemon"]["proxy"]["doorbells"].get<std::uint64_t>();
}

std::vector<Child*> pointers(RankRun& run) {
    std::vector<Child*> all;
    for (auto& c : run.ranks) all.push_back(&c);
    return all;
}

constexpr std::uint32_t kNoVictim = ~0u;

// Every rank but `victim` ended with `error` (a piece of its RESULT line)
// within timeoutMs + 1 s of `since`; with `exitOne` each exited 1 (3: a
// failed call wrote into its output).
void checkEndedBy(RankRun& run, std::uint32_t victim, const std::string& error, std::uint64_t since,
                  std::uint32_t timeoutMs, bool exitOne) {
    for (std::uint32_t r = 0; r < run.ranks.size(); ++r) {
        if (r == victim) continue;
        INFO("rank " << r << ": " << run.line(r));
        CHECK(run.line(r).find(error) != std::string::npos);
        if (exitOne) CHECK(exitCode(run.ranks[r]) == 1);
        CHECK(run.ranks[r].endedNs - since <= (timeoutMs + 1000) * 1000000ull);
    }
}

} // namespace

TEST_CASE("one-node host groups: byte-exact over either path; host-direct rings no doorbell, the proxy path one a call") {
    const std::uint64_t iters = 200;
    for (const bool direct : {true, false}) {
        INFO((direct ? "TPF_HOST_DIRECT=1" : "TPF_HOST_DIRECT=0"));
        Daemon d;
        std::uint64_t calls = 0;
        for (std::uint32_t world : {2u, 5u, 16u}) {
            INFO("world " << world);
            // mixed: gathers and bf16 sums; the ranks check every byte against their own reference.
            auto run = startRanks(d, world, {"--iters", std::to_string(iters), "--sizes", "16,4096,12345", "--mode", "mixed"}, {},
                                  {{"TPF_HOST_DIRECT", direct ? "1" : "0"}});
            REQUIRE(waitAll(pointers(run), 300000));
            for (std::uint32_t r = 0; r < world; ++r)
                CHECK(run.line(r) == "RESULT rank=" + std::to_string(r) + " ok calls=" + std::to_string(iters));
            calls += world * iters;
        }
        INFO("daemon log:\n" << d.log());
        if (direct) CHECK(proxyDoorbells(d) == 0);
        else CHECK(proxyDoorbells(d) >= calls);
        CHECK((d.log().find("(host-direct)") != std::string::npos) == direct);
    }
}

// The rows the proxy carries are copied by its carry threads as well
// (daemon/proxy/carry.hpp, proxy.carry_threads = 2 by default): shards of
// 64 KiB and more in parts, a doorbell's smaller rows together once they
// come to 64 KiB (W = 8: seven rows of 12000 or 16384 bytes), every byte
// still lands, sums still rank-order exact.
TEST_CASE("the proxy path: rows copied by the carry threads, in parts and together, land byte-exact") {
    Daemon d;
    for (std::uint32_t world : {2u, 4u, 8u}) {
        INFO("world " << world);
        auto run = startRanks(d, world, {"--iters", "100", "--sizes", "16384,65536,300000,100000,12000,4096", "--max-bytes", "300000",
                                         "--mode", "mixed"},
                              {}, {{"TPF_HOST_DIRECT", "0"}});
        REQUIRE(waitAll(pointers(run), 300000));
        for (std::uint32_t r = 0; r < world; ++r) CHECK(run.line(r) == "RESULT rank=" + std::to_string(r) + " ok calls=100");
    }
    const auto proxy = nlohmann::json::parse(statusJson(d.socket()))["daemon"]["proxy"];
    INFO(proxy.dump());
    CHECK(proxy["carry_threads"] == 2);
    CHECK(proxy["carry_parts"].is_number_unsigned());
}

// Every rank checks every byte of every call against its own reference
// (tests/common/reference.hpp for the sums: f32, f16 and bf16 in turn, the
// rank-order float sum rounded once). The sizes alternate call by call, so
// each slot is re-staged with another size two calls later while the peers
// read the other phase's rows: the two-phase rule under pull.
TEST_CASE("host-direct pull, W = 2, 3, 4, 8, 16: back-to-back gathers and sums of alternating sizes exact, all-gather-v rows exact") {
    for (std::uint32_t world : {2u, 3u, 4u, 8u, 16u}) {
        DYNAMIC_SECTION("world " << world) {
            Daemon d;
            const std::uint64_t iters = world <= 4 ? 3000 : 600;
            auto run = startRanks(d, world, {"--iters", std::to_string(iters), "--sizes", "4096,16,65536,48,12345,1008",
                                             "--mode", "mixed", "--timeout-ms", "20000"},
                                  {}, {{"TPF_HOST_DIRECT", "1"}});
            REQUIRE(waitAll(pointers(run), 300000));
            auto gv = startRanks(d, world, {"--iters", "300", "--sizes", "1,4097,65536", "--mode", "gatherv", "--timeout-ms", "20000"},
                                 {}, {{"TPF_HOST_DIRECT", "1"}});
            REQUIRE(waitAll(pointers(gv), 300000));
            INFO("daemon log:\n" << d.log());
            for (std::uint32_t r = 0; r < world; ++r) {
                CHECK(run.line(r) == "RESULT rank=" + std::to_string(r) + " ok calls=" + std::to_string(iters));
                CHECK(gv.line(r) == "RESULT rank=" + std::to_string(r) + " ok calls=300");
            }
            CHECK(proxyDoorbells(d) == 0); // no shard went through the proxy
        }
    }
}

// The last rank's own counts differ at call 5: its row header, read from its
// own region, tells every rank so before anything is written.
TEST_CASE("host-direct: all-gather-v with mismatched counts fails GroupMismatch on every rank, nothing written") {
    for (std::uint32_t world : {2u, 4u, 16u}) {
        DYNAMIC_SECTION("world " << world) {
            Daemon d;
            auto run = startRanks(d, world, {"--max-bytes", "4096", "--sizes", "4000", "--mode", "gatherv", "--iters", "20",
                                             "--mismatch-at", "5"},
                                  {}, {{"TPF_HOST_DIRECT", "1"}});
            REQUIRE(waitAll(pointers(run), 60000));
            for (std::uint32_t r = 0; r < world; ++r) {
                INFO("rank " << r << ": " << run.line(r));
                CHECK(exitCode(run.ranks[r]) == 1); // 3: wrong data, or a failed call wrote into its output
                CHECK(run.line(r).find("error=GroupMismatch calls=5") != std::string::npos);
                CHECK(run.line(r).find("passed other counts") != std::string::npos);
            }
        }
    }
}

TEST_CASE("host-direct: a rank killed mid-run ends every other rank's call with PeerLost, not at its timeout") {
    Daemon d;
    const std::uint32_t world = 4, victim = 1, timeoutMs = 10000;
    auto run = startRanks(d, world, {"--iters", "100000", "--sizes", "64,4096", "--mode", "mixed", "--timeout-ms",
                                     std::to_string(timeoutMs)},
                          {{victim, {"--stall-at", "300"}}}, {{"TPF_HOST_DIRECT", "1"}});
    REQUIRE(waitForOutput(run.ranks[victim], "STALL", 120000));
    std::this_thread::sleep_for(std::chrono::milliseconds(300)); // the others wait inside call 301
    const std::uint64_t killedAt = tpf::monotonicNs();
    ::kill(run.ranks[victim].pid, SIGKILL);
    REQUIRE(waitAll(pointers(run), 30000));
    INFO("daemon log:\n" << d.log());
    checkEndedBy(run, victim, "error=PeerLost calls=300 ", killedAt, timeoutMs, true);
    CHECK(proxyDoorbells(d) == 0); // the daemon saw the death by the socket alone
}

// Killed while every rank is calling, at any point of a call (before its
// row is staged, between row and flag, while peers read its region): the
// others end PeerLost, nothing wrong written, within timeout + 1 s.
TEST_CASE("host-direct: a rank killed while W = 8 ranks call back to back: the others end PeerLost within timeout + 1 s") {
    Daemon d;
    const std::uint32_t world = 8, victim = 5, timeoutMs = 10000;
    auto run = startRanks(d, world, {"--iters", "1000000000", "--sizes", "16,4096,12345", "--mode", "mixed", "--timeout-ms",
                                     std::to_string(timeoutMs), "--progress", "64"},
                          {}, {{"TPF_HOST_DIRECT", "1"}});
    for (auto& c : run.ranks) REQUIRE(waitForOutput(c, "PROGRESS", 120000));
    const std::uint64_t killedAt = tpf::monotonicNs();
    ::kill(run.ranks[victim].pid, SIGKILL);
    REQUIRE(waitAll(pointers(run), 30000));
    INFO("daemon log:\n" << d.log());
    checkEndedBy(run, victim, " error=PeerLost ", killedAt, timeoutMs, true);
}

TEST_CASE("host-direct: the daemon killed and not back within the open timeout: every rank ends DaemonLost") {
    // A one-node host-direct group needs no daemon for its data, but only the
    // daemon sees ranks die: the calls go on while the ranks wait for a
    // restarted daemon to re-adopt the group, and end DaemonLost once none
    // came back within the open timeout (test_restart: one that does).
    Daemon d;
    const std::uint32_t world = 3, timeoutMs = 10000;
    auto run = startRanks(d, world, {"--iters", "1000000000", "--sizes", "4096", "--timeout-ms", std::to_string(timeoutMs),
                                     "--open-timeout-ms", "3000", "--progress", "64"},
                          {}, {{"TPF_HOST_DIRECT", "1"}});
    for (auto& c : run.ranks) REQUIRE(waitForOutput(c, "PROGRESS", 120000));
    const std::uint64_t killedAt = tpf::monotonicNs();
    d.signal(SIGKILL);
    REQUIRE(waitAll(pointers(run), 30000));
    checkEndedBy(run, kNoVictim, " error=DaemonLost ", killedAt, timeoutMs, false);
}

TEST_CASE("ranks of one group may differ: TPF_HOST_DIRECT=0 on one rank, the proxy carries the shards to and from it, and only those") {
    Daemon d;
    const std::uint32_t world = 4, proxied = 2;
    const std::uint64_t iters = 300;
    RankRun run;
    const std::string boot = "127.0.0.1:" + std::to_string(freePort());
    for (std::uint32_t r = 0; r < world; ++r)
        run.ranks.push_back(spawn({envPath("TPF_TESTRANK"), "--socket", d.socket(), "--bootstrap", boot, "--rank", std::to_string(r),
                                   "--world", std::to_string(world), "--iters", std::to_string(iters), "--sizes", "16,4096,12345",
                                   "--mode", "mixed"},
                                  {{"TPF_HOST_DIRECT", r == proxied ? "0" : "1"}}));
    REQUIRE(waitAll(pointers(run), 300000));
    INFO("daemon log:\n" << d.log());
    for (std::uint32_t r = 0; r < world; ++r)
        CHECK(run.line(r) == "RESULT rank=" + std::to_string(r) + " ok calls=" + std::to_string(iters));
    // One a call from every rank: the proxied rank's to its three peers, each
    // direct rank's to the proxied one (it neither writes nor reads peers'
    // regions). The proxy's copies between direct ranks: none (not counted
    // here; the data check above fails if one went missing).
    CHECK(proxyDoorbells(d) == world * iters);
}
