// Faults across real processes: a killed rank, abort, a rank that never
// posts, two groups side by side, misaligned and oversize calls.
#include <csignal>
#include <thread>

#include "catch.hpp"
#include "harness.hpp"
#include <tpfabric/tpfabric.hpp>

#include "common/shm.hpp"

using namespace tpf::testing;

TEST_CASE("a killed rank: every other rank ends with PeerLost within 1 s") {
    Daemon d;
    const std::uint32_t world = 4, victim = 2;
    auto run = startRanks(d, world, {"--iters", "100000", "--sizes", "64,4096", "--timeout-ms", "30000"},
                          {{victim, {"--stall-at", "300"}}});
    // Let the group run and the victim reach its stall, then kill it hard.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    const std::uint64_t killedAt = tpf::monotonicNs();
    ::kill(run.ranks[victim].pid, SIGKILL);
    std::vector<Child*> all;
    for (auto& c : run.ranks) all.push_back(&c);
    REQUIRE(waitAll(all, 20000));
    INFO("daemon log:\n" << d.log());
    for (std::uint32_t r = 0; r < world; ++r) {
        if (r == victim) continue;
        INFO("rank " << r << ": " << run.line(r));
        CHECK(run.line(r).find("error=PeerLost") != std::string::npos);
        CHECK(run.ranks[r].endedNs - killedAt < 1000000000ull);
    }
}

TEST_CASE("abort from a rank ends every rank's waits with Aborted") {
    Daemon d;
    const std::uint32_t world = 4;
    for (std::uint32_t aborter : {0u, 3u}) {
        auto run = startRanks(d, world, {"--iters", "100000", "--sizes", "256", "--timeout-ms", "30000"},
                              {{aborter, {"--abort-at", "200"}}});
        std::vector<Child*> all;
        for (auto& c : run.ranks) all.push_back(&c);
        REQUIRE(waitAll(all, 20000));
        for (std::uint32_t r = 0; r < world; ++r) {
            INFO("aborter " << aborter << ", rank " << r << ": " << run.line(r));
            CHECK(run.line(r).find("error=Aborted") != std::string::npos);
        }
    }
}

TEST_CASE("a rank that never posts: the others end with Timeout naming it") {
    Daemon d;
    const std::uint32_t world = 3, silent = 1;
    auto run = startRanks(d, world, {"--iters", "1000", "--sizes", "128", "--timeout-ms", "800"},
                          {{silent, {"--stall-at", "10"}}});
    std::vector<Child*> others{&run.ranks[0], &run.ranks[2]};
    REQUIRE(waitAll(others, 20000));
    for (std::uint32_t r : {0u, 2u}) {
        INFO("rank " << r << ": " << run.line(r));
        CHECK(run.line(r).find("error=Timeout") != std::string::npos);
        CHECK(run.line(r).find("rank 1 did not deliver") != std::string::npos);
    }
    ::kill(run.ranks[silent].pid, SIGKILL);
    waitAll({&run.ranks[silent]}, 5000);
}

TEST_CASE("two groups on one daemon stay apart") {
    Daemon d;
    auto a = startRanks(d, 3, {"--iters", "3000", "--sizes", "16,4096,12345", "--mode", "mixed"});
    auto b = startRanks(d, 2, {"--iters", "3000", "--sizes", "4096,100", "--mode", "mixed"});
    std::vector<Child*> all;
    for (auto& c : a.ranks) all.push_back(&c);
    for (auto& c : b.ranks) all.push_back(&c);
    REQUIRE(waitAll(all, 120000));
    for (std::uint32_t r = 0; r < 3; ++r) CHECK(a.line(r) == "RESULT rank=" + std::to_string(r) + " ok calls=3000");
    for (std::uint32_t r = 0; r < 2; ++r) CHECK(b.line(r) == "RESULT rank=" + std::to_string(r) + " ok calls=3000");
}

TEST_CASE("misaligned buffers and sizes above the cap are refused by name, the group goes on") {
    Daemon d;
    const std::string boot = "127.0.0.1:" + std::to_string(freePort());
    std::unique_ptr<tpf::Group> groups[2];
    // Catch2 2.x is not thread-safe: the helper thread only records, the main thread checks.
    tpf::Status peerOpen{tpf::Errc::Closed};
    std::thread peer([&] {
        auto b = tpf::TcpBootstrap::create(1, 2, boot);
        if (!b) return void(peerOpen = b.error());
        tpf::Options o;
        o.socketPath = d.socket();
        auto g = tpf::Group::open(**b, 1, 2, 8192, o);
        if (!g) return void(peerOpen = g.error());
        groups[1] = std::move(*g);
        peerOpen = tpf::okStatus();
    });
    auto b = tpf::TcpBootstrap::create(0, 2, boot);
    tpf::Options o;
    o.socketPath = d.socket();
    auto g = b ? tpf::Group::open(**b, 0, 2, 4096 + 100, o) : tpf::Result<std::unique_ptr<tpf::Group>>(b.error());
    peer.join();
    INFO("peer: " << (peerOpen ? "ok" : peerOpen.error().describe()));
    REQUIRE(peerOpen.ok());
    REQUIRE(g.ok());
    groups[0] = std::move(*g);
    CHECK(groups[0]->agreedCap() == 4096 + 100); // exact minimum, not a rounded slot
    CHECK(groups[1]->agreedCap() == 4096 + 100);
    alignas(64) static std::uint8_t buf[2][4 * 8192];
    CHECK(groups[0]->allGather(buf[0] + 1, buf[0] + 64, 16).code() == tpf::Errc::Misaligned);
    CHECK(groups[0]->allGather(buf[0], buf[0] + 8, 16).code() == tpf::Errc::Misaligned);
    CHECK(groups[1]->allGather(buf[1], buf[1] + 8192, 4096 + 101).code() == tpf::Errc::CapMismatch);
    CHECK_FALSE(groups[1]->fits(4096 + 101));
    // Neither refusal broke the group: a real call still works on both.
    tpf::Status s1{tpf::Errc::Closed};
    std::thread t([&] { s1 = groups[1]->allGather(buf[1], buf[1] + 8192, 4096 + 100); });
    const tpf::Status s0 = groups[0]->allGather(buf[0], buf[0] + 8192, 4096 + 100);
    t.join();
    CHECK(s0.ok());
    CHECK(s1.ok());
    CHECK(groups[0]->check().ok());
}
