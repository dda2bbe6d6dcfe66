// Faults across real processes: a killed rank, abort from each rank, a rank
// that never posts, two groups side by side, misaligned and oversize calls.
// The rest of the fault matrix (docs/reliability.md): test_fault_matrix.cpp.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "catch.hpp"
#include "harness.hpp"
#include <tpfabric/tpfabric.hpp>

#include "common/shm.hpp"

using namespace tpf::testing;

namespace {
/// The number after "key=" in `line`, or -1.
double field(const std::string& line, const std::string& key) {
    const auto at = line.find(key + "=");
    return at == std::string::npos ? -1.0 : std::atof(line.c_str() + at + key.size() + 1);
}
} // namespace

// Bounds are the (a wait ends within its timeout + 1 s); the error's
// name tells an early end (PeerLost, Aborted) from the timeout.
TEST_CASE("a killed rank: every other rank ends with PeerLost, not at its timeout") {
    Daemon d;
    const std::uint32_t world = 4, victim = 2, timeoutMs = 10000;
    auto run = startRanks(d, world, {"--iters", "100000", "--sizes", "64,4096", "--timeout-ms", std::to_string(timeoutMs)},
                          {{victim, {"--stall-at", "300"}}});
    // Let the group run and the victim reach its stall, then kill it hard.
    REQUIRE(waitForOutput(run.ranks[victim], "STALL", 120000));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const std::uint64_t killedAt = tpf::monotonicNs();
    ::kill(run.ranks[victim].pid, SIGKILL);
    std::vector<Child*> all;
    for (auto& c : run.ranks) all.push_back(&c);
    REQUIRE(waitAll(all, 30000));
    INFO("daemon log:\n" << d.log());
    for (std::uint32_t r = 0; r < world; ++r) {
        if (r == victim) continue;
        INFO("rank " << r << ": " << run.line(r));
        CHECK(run.line(r).find("error=PeerLost calls=300 ") != std::string::npos);
        // The health word names the failure and the dead rank, read before check() (tpf-testrank).
        CHECK(run.line(r).find("health=PeerLost health_rank=" + std::to_string(victim) + " ") != std::string::npos);
        CHECK(run.ranks[r].endedNs - killedAt <= (timeoutMs + 1000) * 1000000ull);
    }
}

// A worker process an engine forks (a data loader, a tokenizer pool) inherits
// the rank's group. Its calls must be refused (they would stage into the
// parent's slots, its abort would break the parent's group), and its copy of
// the daemon socket must not hide the parent's death: before fork_guard the
// others waited out their timeout while the child lived, and a child that
// closed its copy told the daemon the parent had left.
TEST_CASE("a rank's fork()ed child: refused on the parent's group, and the parent's death still seen at once") {
    const bool closes = GENERATE(false, true);
    INFO("the child closes its copy: " << closes);
    Daemon d;
    const std::uint32_t world = 3, victim = 1, timeoutMs = 20000;
    std::vector<std::string> forking{"--fork-at", "20", "--stall-at", "300"};
    if (closes) forking.push_back("--fork-close");
    auto run = startRanks(d, world, {"--iters", "100000", "--sizes", "64,4096", "--timeout-ms", std::to_string(timeoutMs)},
                          {{victim, forking}});
    REQUIRE(waitForOutput(run.ranks[victim], "FORKED", 120000));
    // 280 calls of every rank after the child's: the parent's group is whole.
    REQUIRE(waitForOutput(run.ranks[victim], "STALL", 120000));
    const std::string& out = run.ranks[victim].output;
    const std::string forked = out.substr(out.find("FORKED"), out.find('\n', out.find("FORKED")) - out.find("FORKED"));
    INFO(forked);
    CHECK(forked.find("call=Closed check=Closed abort=Closed") != std::string::npos);
    CHECK(forked.find("a fork()ed child") != std::string::npos);
    const pid_t child = pid_t(field(forked, "child"));
    REQUIRE(child > 0);
    REQUIRE(::kill(child, 0) == 0); // still there, holding what it inherited
    const std::uint64_t killedAt = tpf::monotonicNs();
    ::kill(run.ranks[victim].pid, SIGKILL);
    std::vector<Child*> all;
    for (auto& c : run.ranks) all.push_back(&c);
    const bool ended = waitAll(all, 60000);
    ::kill(child, SIGKILL);
    REQUIRE(ended);
    INFO("daemon log:\n" << d.log());
    for (std::uint32_t r = 0; r < world; ++r) {
        if (r == victim) continue;
        INFO("rank " << r << ": " << run.line(r));
        CHECK(run.line(r).find("error=PeerLost calls=300 ") != std::string::npos);
        // The health word names the failure and the dead rank, read before check() (tpf-testrank).
        CHECK(run.line(r).find("health=PeerLost health_rank=" + std::to_string(victim) + " ") != std::string::npos);
        CHECK(run.ranks[r].endedNs - killedAt <= timeoutMs / 2 * 1000000ull); // the death, not the timeout
    }
}

TEST_CASE("abort from each rank ends every rank's waits with Aborted") {
    Daemon d;
    const std::uint32_t world = 4, timeoutMs = 10000;
    for (std::uint32_t aborter = 0; aborter < world; ++aborter) {
        // The others wait inside call 200, which the aborter never posts.
        auto run = startRanks(d, world, {"--iters", "100000", "--sizes", "256", "--mode", "mixed", "--timeout-ms",
                                         std::to_string(timeoutMs)},
                              {{aborter, {"--abort-at", "200"}}});
        std::vector<Child*> all;
        for (auto& c : run.ranks) all.push_back(&c);
        REQUIRE(waitAll(all, 120000));
        for (std::uint32_t r = 0; r < world; ++r) {
            const std::string line = run.line(r);
            INFO("aborter " << aborter << ", rank " << r << ": " << line);
            CHECK(line.find("error=Aborted ") != std::string::npos);
            CHECK(line.find("health=Aborted health_rank=" + std::to_string(aborter) + " ") != std::string::npos);
            // The abort is not queued behind the aborter's own doorbells: it
            // may overtake the aborter's shard of call 199 on its way to a
            // peer, which then ends call 199 Aborted instead of call 200.
            const double calls = field(line, "calls");
            if (r == aborter) CHECK(calls == 200);
            else CHECK((calls == 199 || calls == 200));
            CHECK(exitCode(run.ranks[r]) == 1); // 3: a failed call wrote into its output
            CHECK(field(line, "elapsed_ms") <= timeoutMs + 1000);
        }
    }
}

// A rank that gave up on a late peer (Timeout) and aborted: the late peer's
// call finds the aborter's row of that call already staged, and still ends
// Aborted, nothing written: an abort breaks the group on every rank, not
// only the waits under way when it lands (before, the late call completed
// Ok and only the next one failed).
TEST_CASE("abort after a Timeout: the late rank's call ends Aborted though every row is there") {
    Daemon d;
    char dir[] = "/tmp/tpf-abortlate-XXXXXX";
    REQUIRE(::mkdtemp(dir));
    const std::string go = std::string(dir) + "/go";
    auto run = startRanks(d, 2, {"--iters", "20", "--sizes", "256"},
                          {{0, {"--timeout-ms", "300", "--abort-on-failure"}},
                           {1, {"--timeout-ms", "10000", "--pause-at", "10", "--go-file", go}}});
    REQUIRE(waitAll({&run.ranks[0]}, 60000));
    INFO("rank 0: " << run.ranks[0].output);
    CHECK(run.ranks[0].output.find("ABORT rank=0 status=Ok") != std::string::npos);
    CHECK(run.line(0).find("error=Timeout calls=10 ") != std::string::npos);
    // The daemon has recorded the abort before the late rank goes on.
    bool broken = false;
    for (int i = 0; i < 200 && !broken; ++i) {
        const auto status = nlohmann::json::parse(statusJson(d.socket()));
        for (const auto& g : status["groups"]) broken = broken || g["state"] == "broken";
        if (!broken) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    REQUIRE(broken);
    std::fclose(std::fopen(go.c_str(), "w"));
    REQUIRE(waitAll({&run.ranks[1]}, 60000));
    INFO("rank 1: " << run.line(1));
    CHECK(run.line(1).find("error=Aborted calls=10 ") != std::string::npos);
    CHECK(run.line(1).find("detail=rank 0 aborted the group") != std::string::npos);
    CHECK(exitCode(run.ranks[1]) == 1); // 3: the failed call wrote into its output
    std::filesystem::remove_all(dir);
}

// The one call that may come from another thread: an engine's shutdown
// request aborts while its calls' thread is blocked in a call.
TEST_CASE("abort from a second thread ends the call blocked in the first with Aborted, long before the timeout") {
    Daemon d;
    auto run = startRanks(d, 2, {"--iters", "100", "--sizes", "256", "--timeout-ms", "20000"},
                          {{0, {"--abort-after-ms", "1500"}}, {1, {"--stall-at", "5"}}});
    REQUIRE(waitAll({&run.ranks[0]}, 60000));
    const std::string line = run.line(0);
    INFO("rank 0: " << run.ranks[0].output);
    CHECK(run.ranks[0].output.find("ABORT rank=0 status=Ok") != std::string::npos);
    CHECK(line.find("error=Aborted calls=5 ") != std::string::npos);
    CHECK(field(line, "elapsed_ms") < 15000); // the abort, not the timeout
    CHECK(exitCode(run.ranks[0]) == 1);
    ::kill(run.ranks[1].pid, SIGKILL);
    waitAll({&run.ranks[1]}, 5000);
}

TEST_CASE("a rank that never posts: the others end with Timeout naming it") {
    // Host-direct, and carried by the daemon's proxy (TPF_HOST_DIRECT=0): a live daemon is not blamed.
    const std::string direct = GENERATE(as<std::string>{}, "1", "0");
    INFO("TPF_HOST_DIRECT=" << direct);
    Daemon d;
    const std::uint32_t world = 3, silent = 1, timeoutMs = 800;
    auto run = startRanks(d, world, {"--iters", "1000", "--sizes", "128", "--timeout-ms", std::to_string(timeoutMs)},
                          {{silent, {"--stall-at", "10"}}}, {{"TPF_HOST_DIRECT", direct}});
    std::vector<Child*> others{&run.ranks[0], &run.ranks[2]};
    REQUIRE(waitAll(others, 60000));
    for (std::uint32_t r : {0u, 2u}) {
        const std::string line = run.line(r);
        INFO("rank " << r << ": " << line);
        CHECK(line.find("error=Timeout calls=10 ") != std::string::npos);
        CHECK(line.find("health=Timeout health_rank=1 ") != std::string::npos);
        CHECK(line.find("rank 1 did not deliver") != std::string::npos);
        CHECK(line.find("tpfabricd") == std::string::npos);
        CHECK(exitCode(run.ranks[r]) == 1);
        CHECK(field(line, "elapsed_ms") >= timeoutMs);
        CHECK(field(line, "elapsed_ms") <= timeoutMs + 1000);
    }
    ::kill(run.ranks[silent].pid, SIGKILL);
    waitAll({&run.ranks[silent]}, 5000);
}

// A daemon that stops (SIGSTOP, a debugger, a hang) while its proxy carries
// the shards: each rank's Timeout names the daemon, not whichever healthy peer
// its wait happened to reach first.
TEST_CASE("a stopped daemon that carries the shards: every rank's Timeout names it") {
    Daemon d;
    const std::uint32_t world = 3, timeoutMs = 1000;
    auto run = startRanks(d, world, {"--iters", "1000000000", "--sizes", "64,4096", "--mode", "mixed", "--timeout-ms",
                                     std::to_string(timeoutMs), "--progress", "32"},
                          {}, {{"TPF_HOST_DIRECT", "0"}});
    std::vector<Child*> all;
    for (auto& c : run.ranks) all.push_back(&c);
    for (Child* c : all) REQUIRE(waitForOutput(*c, "PROGRESS", 60000));
    d.signal(SIGSTOP);
    const bool ended = waitAll(all, 30000);
    d.signal(SIGCONT);
    REQUIRE(ended);
    for (std::uint32_t r = 0; r < world; ++r) {
        const std::string line = run.line(r);
        INFO("rank " << r << ": " << line);
        CHECK(line.find(" error=Timeout ") != std::string::npos);
        CHECK(line.find("tpfabricd's proxy, which carries the shards, has made no pass for ") != std::string::npos);
        CHECK(line.find("the daemon is stopped, hung or stuck") != std::string::npos);
    }
    CHECK(d.stop() == 0);
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
    // A count whose bytes wrap size_t (2^62 + 1 f32: 4 bytes once wrapped) is
    // above the cap too, refused before a byte is read or written.
    std::memset(buf[1] + 8192, 0xa5, 64);
    const tpf::Status huge = groups[1]->allReduceSum(buf[1], buf[1] + 8192, (std::size_t(1) << 62) + 1, tpf::DType::F32);
    CHECK(huge.code() == tpf::Errc::CapMismatch);
    CHECK(huge.error().detail.find("more bytes than size_t holds") != std::string::npos);
    CHECK(std::all_of(buf[1] + 8192, buf[1] + 8192 + 64, [](std::uint8_t b) { return b == 0xa5; }));
    // Neither refusal broke the group: a real call still works on both.
    tpf::Status s1{tpf::Errc::Closed};
    std::thread t([&] { s1 = groups[1]->allGather(buf[1], buf[1] + 8192, 4096 + 100); });
    const tpf::Status s0 = groups[0]->allGather(buf[0], buf[0] + 8192, 4096 + 100);
    t.join();
    CHECK(s0.ok());
    CHECK(s1.ok());
    CHECK(groups[0]->check().ok());
    CHECK(groups[1]->check().ok());
}

// An orderly leave ends the group only after the leaver's last epoch E: a
// call up to E that a slower rank posts after the leave still completes on
// every rank (the proxy carries it), the next call fails at once naming the
// leaver. Rank 0's last call (epoch 20) times out while rank 1 holds before
// posting it; rank 0 then closes (it posted epoch 20: its shard is there).
// Proxy-carried (TPF_HOST_DIRECT=0): the doorbell rank 1 posts after the
// leave is what the daemon must still carry to rank 2. Host-direct: rank 1
// must still publish its row of epoch 20 though its control block already
// shows the leave (before, rank 2 ended PeerLost after the 200 ms grace).
TEST_CASE("a rank that closed after epoch E: the others' calls up to E complete, the next fails at once naming it") {
    for (const char* direct : {"0", "1"}) {
        INFO("TPF_HOST_DIRECT=" << direct);
        Daemon d;
        const std::string go = d.socket() + ".go";
        const std::vector<std::string> common{"--sizes", "4096", "--mode", "mixed"};
        auto run = startRanks(d, 3, common,
                              {{0, {"--iters", "20", "--timeout-ms", "500"}},
                               {1, {"--iters", "21", "--timeout-ms", "10000", "--pause-at", "19", "--go-file", go}},
                               {2, {"--iters", "21", "--timeout-ms", "10000"}}},
                              {{"TPF_HOST_DIRECT", direct}});
        REQUIRE(waitForOutput(run.ranks[1], "PAUSED", 60000));
        // Rank 0 gives up on epoch 20 and closes; the daemon marks the group broken.
        REQUIRE(waitAll({&run.ranks[0]}, 30000));
        INFO("rank 0: " << run.line(0));
        CHECK(run.line(0).find("error=Timeout calls=19 ") != std::string::npos);
        bool broken = false;
        for (int i = 0; i < 500 && !broken; ++i) {
            broken = statusJson(d.socket()).find("\"broken\"") != std::string::npos;
            if (!broken) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        REQUIRE(broken);
        { std::FILE* f = std::fopen(go.c_str(), "w"); REQUIRE(f); std::fclose(f); }
        REQUIRE(waitAll({&run.ranks[1], &run.ranks[2]}, 30000));
        INFO("daemon log:\n" << d.log());
        for (std::uint32_t r : {1u, 2u}) {
            const std::string line = run.line(r);
            INFO("rank " << r << ": " << line);
            // Call 20 (epoch 20) ok with checked data; call 21 PeerLost at once, not at the 10 s timeout.
            CHECK(line.find("error=PeerLost calls=20 ") != std::string::npos);
            CHECK(line.find("rank 0 left the group after epoch 20") != std::string::npos);
            // Healthy through call 20 (tpf-testrank checks a fresh group); the call past the leave sets the word.
            CHECK(line.find("health=PeerLost health_rank=0 ") != std::string::npos);
            CHECK(exitCode(run.ranks[r]) == 1); // 3: wrong bytes, or a failed call wrote into its output
            CHECK(field(line, "elapsed_ms") < 10000);
        }
        std::remove(go.c_str());
    }
}
