// One-node host groups survive a restart of their daemon (issue 45): the
// real tpfabricd on a temporary socket, stopped (SIGTERM) or killed
// (SIGKILL) and started again on the same socket while real rank processes
// make calls they verify byte for byte. The group goes on: same group, no
// reopen, every call correct. A daemon not back in time, or one that cannot
// hold the group, ends every rank's calls with a named failure. No timing is
// asserted beyond the bounds the API promises.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "common/shm.hpp"
#include "common/unix_socket.hpp"
#include "harness.hpp"
#include "proto/client_msg.hpp"

using namespace tpf::testing;

namespace {

constexpr int kSlowStartMs = 120000; // processes starting on a loaded two-core box

std::vector<Child*> pointers(RankRun& run) {
    std::vector<Child*> v;
    for (auto& c : run.ranks) v.push_back(&c);
    return v;
}

void touch(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "w");
    REQUIRE(f);
    std::fclose(f);
}

/// The number after "key=" in `line`, or -1.
double field(const std::string& line, const std::string& key) {
    const auto at = line.find(key + "=");
    return at == std::string::npos ? -1.0 : std::atof(line.c_str() + at + key.size() + 1);
}

/// How many calls `c` reported last (its last PROGRESS line), 0 before any.
std::uint64_t lastCalls(Child& c) {
    readOutput(c);
    const auto at = c.output.rfind("PROGRESS");
    if (at == std::string::npos) return 0;
    return std::uint64_t(field(c.output.substr(at, c.output.find('\n', at) - at), "calls"));
}

/// Waits until every rank reported more than `past` calls (or one ended); false if one did not.
bool advancePast(RankRun& run, const std::vector<std::uint64_t>& past, int timeoutMs) {
    const std::uint64_t deadline = tpf::monotonicNs() + std::uint64_t(timeoutMs) * 1000000ull;
    for (;;) {
        bool all = true;
        for (std::size_t r = 0; r < run.ranks.size(); ++r) {
            if (lastCalls(run.ranks[r]) > past[r]) continue;
            all = false;
            if (run.ranks[r].output.find("RESULT") != std::string::npos) return false;
        }
        if (all) return true;
        if (tpf::monotonicNs() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
}

std::vector<std::uint64_t> callsNow(RankRun& run) {
    std::vector<std::uint64_t> v;
    for (auto& c : run.ranks) v.push_back(lastCalls(c));
    return v;
}

/// How many times `needle` occurs in `text`.
std::size_t count(const std::string& text, const std::string& needle) {
    std::size_t n = 0;
    for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
    return n;
}

nlohmann::json groupsOf(const Daemon& d) { return nlohmann::json::parse(statusJson(d.socket()))["groups"]; }

/// Waits until the daemon shows group `id` open and re-adopted; false if it does not in time.
bool readopted(const Daemon& d, const std::string& id, int timeoutMs) {
    const std::uint64_t deadline = tpf::monotonicNs() + std::uint64_t(timeoutMs) * 1000000ull;
    for (;;) {
        for (const auto& g : groupsOf(d))
            if (g["id"] == id && g["state"] == "open" && g["adoption"].is_object() && g["adoption"]["gap_ms"].is_number())
                return true;
        if (tpf::monotonicNs() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

std::string ctl(const Daemon& d, std::vector<std::string> args) {
    std::vector<std::string> argv{envPath("TPF_CTL")};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--socket", d.socket()});
    Child c = spawn(argv);
    REQUIRE(waitAll({&c}, 30000));
    CHECK(exitCode(c) == 0);
    return c.output;
}

// A re-adopted group as an operator sees it: status (--json and the table),
// the metrics, and one journal line for its adoption.
void operatorsSeeIt(const Daemon& d, const std::string& id) {
    auto doc = nlohmann::json::parse(ctl(d, {"status", "--json"}));
    REQUIRE(doc["groups"].size() == 1);
    const auto& adoption = doc["groups"][0]["adoption"];
    INFO("status: " << doc.dump(2));
    REQUIRE(adoption.is_object());
    CHECK(adoption["gap_ms"].is_number());
    CHECK(adoption["gap_ms"].get<double>() >= 0);
    CHECK(adoption["adopted_unix_ns"].get<std::uint64_t>() >= adoption["lost_unix_ns"].get<std::uint64_t>());
    CHECK(doc["metrics"]["groups_adopted"] == 1); // a new daemon each time
    CHECK(doc["metrics"]["adoption_refusals"].empty());
    // The group's calls include those before the restart; this daemon's counters only its own.
    std::uint64_t counted = 0;
    for (const auto& [op, v] : doc["metrics"]["calls"].items()) counted += v["calls"].get<std::uint64_t>();
    CHECK(counted < doc["groups"][0]["calls"].get<std::uint64_t>());
    const std::string table = ctl(d, {"status"});
    CHECK(table.find(id.substr(0, 12)) != std::string::npos);
    CHECK(table.find("re-adopted after a daemon restart: gap ") != std::string::npos);
    const std::string metrics = ctl(d, {"metrics"});
    CHECK(metrics.find("\ntpfabric_groups_adopted_total 1\n") != std::string::npos);
    CHECK(metrics.find("\ntpfabric_adoption_gap_seconds_total ") != std::string::npos);
}

} // namespace

TEST_CASE("restart: a one-node host group goes on through SIGTERM and SIGKILL restarts of its daemon, the same group, "
          "every call correct, no reopen") {
    for (const std::uint32_t world : {2u, 4u}) {
        for (const bool direct : {false, true}) {
            DYNAMIC_SECTION("world " << world << (direct ? ", host-direct" : ", carried by the proxy")) {
                Daemon d;
                const std::string stop = d.dir() + "/stop";
                auto run = startRanks(d, world,
                                      {"--iters", "1000000000", "--sizes", "64,4096,12345", "--mode", "mixed", "--timeout-ms",
                                       "10000", "--progress", "64", "--stop-file", stop},
                                      {}, {{"TPF_HOST_DIRECT", direct ? "1" : "0"}});
                REQUIRE(advancePast(run, std::vector<std::uint64_t>(world, 0), kSlowStartMs));
                const auto groups = groupsOf(d);
                REQUIRE(groups.size() == 1);
                const std::string id = groups[0]["id"];
                for (const int sig : {SIGTERM, SIGKILL}) {
                    INFO((sig == SIGTERM ? "SIGTERM, then a new daemon" : "SIGKILL, then a new daemon"));
                    const auto before = callsNow(run);
                    if (sig == SIGTERM) CHECK(d.stop() == 0);
                    else d.signal(SIGKILL);
                    d.restart();
                    // The same group, re-adopted (host-direct calls go on meanwhile: they need no daemon).
                    INFO("daemon log:\n" << d.log());
                    REQUIRE(readopted(d, id, kSlowStartMs));
                    // Calls go on after the restart: every rank's count passes where it stood then.
                    REQUIRE(advancePast(run, callsNow(run), kSlowStartMs));
                    CHECK(advancePast(run, before, 0));
                    operatorsSeeIt(d, id);
                }
                touch(stop);
                REQUIRE(waitAll(pointers(run), kSlowStartMs));
                INFO("daemon log:\n" << d.log());
                // One journal line per adoption, naming the group, its ranks and the gap.
                CHECK(count(d.log(), "group " + id.substr(0, 12) + ": re-adopted after a daemon restart: ranks " +
                                         (world == 2 ? "0,1 " : "0,1,2,3 ")) == 2);
                for (std::uint32_t r = 0; r < world; ++r) {
                    INFO("rank " << r << ":\n" << run.ranks[r].output);
                    CHECK(run.line(r).find("RESULT rank=" + std::to_string(r) + " ok ") == 0);
                    CHECK(exitCode(run.ranks[r]) == 0); // 3: a wrong result, or a failed call that wrote its output
                    CHECK(count(run.ranks[r].output, "OPEN rank=") == 1);
                }
                CHECK(d.stop() == 0);
            }
        }
    }
}

TEST_CASE("restart: a daemon not back in time ends calls DaemonLost within their timeout + 1 s (carried) or the open "
          "timeout + 1 s (host-direct)") {
    for (const bool direct : {false, true}) {
        DYNAMIC_SECTION((direct ? "host-direct" : "carried by the proxy")) {
            Daemon d;
            const std::uint32_t world = 3, timeoutMs = 3000, openTimeoutMs = direct ? 3000 : 60000;
            auto run = startRanks(d, world,
                                  {"--iters", "1000000000", "--sizes", "64,4096", "--mode", "mixed", "--timeout-ms",
                                   std::to_string(timeoutMs), "--open-timeout-ms", std::to_string(openTimeoutMs), "--progress",
                                   "64"},
                                  {}, {{"TPF_HOST_DIRECT", direct ? "1" : "0"}});
            REQUIRE(advancePast(run, std::vector<std::uint64_t>(world, 0), kSlowStartMs));
            const std::uint64_t killedAt = tpf::monotonicNs();
            d.signal(SIGKILL);
            REQUIRE(waitAll(pointers(run), 30000));
            const std::uint64_t bound = std::uint64_t((direct ? openTimeoutMs : timeoutMs) + 1000) * 1000000ull;
            for (std::uint32_t r = 0; r < world; ++r) {
                const std::string line = run.line(r);
                INFO("rank " << r << ": " << line);
                CHECK(line.find(" error=DaemonLost ") != std::string::npos);
                CHECK(line.find(" health=DaemonLost ") != std::string::npos);
                CHECK(line.find(direct ? "was not back within the open timeout" : "is not back: this call waited its timeout") !=
                      std::string::npos);
                CHECK(exitCode(run.ranks[r]) == 1); // 3: a failed call wrote into its output
                CHECK(run.ranks[r].endedNs - killedAt <= bound);
            }
        }
    }
}

TEST_CASE("restart: a new daemon whose daemon.max_bytes is below the agreed cap refuses re-adoption on every rank, by "
          "name") {
    Daemon d;
    const std::uint32_t world = 2;
    auto run = startRanks(d, world,
                          {"--iters", "1000000000", "--max-bytes", "65536", "--sizes", "64,65536", "--mode", "mixed",
                           "--timeout-ms", "20000", "--progress", "64"},
                          {}, {{"TPF_HOST_DIRECT", "0"}});
    REQUIRE(advancePast(run, std::vector<std::uint64_t>(world, 0), kSlowStartMs));
    const std::string cfg = d.dir() + "/small.toml";
    FILE* f = std::fopen(cfg.c_str(), "w");
    REQUIRE(f);
    std::fprintf(f, "[daemon]\nmax_bytes = 16384\n");
    std::fclose(f);
    d.signal(SIGKILL);
    d.restart({"--config", cfg});
    REQUIRE(waitAll(pointers(run), 30000));
    INFO("daemon log:\n" << d.log());
    for (std::uint32_t r = 0; r < world; ++r) {
        const std::string line = run.line(r);
        INFO("rank " << r << ": " << line);
        CHECK(line.find(" error=DaemonLost ") != std::string::npos);
        CHECK(line.find("refused to re-adopt the group: CapMismatch: daemon.max_bytes (16384) is now below the group's agreed "
                        "cap (65536)") != std::string::npos);
        CHECK(exitCode(run.ranks[r]) == 1);
    }
    CHECK(count(d.log(), "refused to re-adopt rank") == world);
    CHECK(groupsOf(d).empty());
    auto doc = nlohmann::json::parse(statusJson(d.socket()));
    CHECK(doc["metrics"]["adoption_refusals"]["CapMismatch"] == world);
    CHECK(doc["metrics"]["groups_adopted"] == 0);
}

// A daemon of another release on the socket: it answers every Hello in its
// own client protocol (one above this library's), as a newer tpfabricd does.
class OtherReleaseDaemon {
public:
    explicit OtherReleaseDaemon(const std::string& path) {
        ::unlink(path.c_str()); // the killed daemon's stale socket
        listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
        REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
        REQUIRE(::listen(listener_, 16) == 0);
        thread_ = std::thread([this] { serve(); });
    }
    ~OtherReleaseDaemon() {
        ::shutdown(listener_, SHUT_RDWR);
        thread_.join();
        ::close(listener_);
    }

private:
    void serve() {
        for (;;) {
            const int c = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
            if (c < 0) return;
            tpf::Bytes reply = tpf::client_proto::encode(tpf::client_proto::kHelloReply, 1, tpf::client_proto::HelloReply{});
            const std::uint16_t newer = tpf::client_proto::kClientVersion + 1;
            std::memcpy(reply.data() + offsetof(tpf::MsgHeader, version), &newer, sizeof newer);
            char buf[256];
            (void)::recv(c, buf, sizeof buf, 0); // its Hello
            (void)::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
            ::close(c);
        }
    }
    int listener_ = -1;
    std::thread thread_;
};

TEST_CASE("restart: a daemon of another client protocol comes back: every rank fails DaemonLost, the reason named") {
    Daemon d;
    const std::uint32_t world = 2;
    auto run = startRanks(d, world,
                          {"--iters", "1000000000", "--sizes", "64,4096", "--mode", "mixed", "--timeout-ms", "20000",
                           "--open-timeout-ms", "20000", "--progress", "64"},
                          {}, {{"TPF_HOST_DIRECT", "0"}});
    REQUIRE(advancePast(run, std::vector<std::uint64_t>(world, 0), kSlowStartMs));
    d.signal(SIGKILL);
    const std::uint64_t backAt = tpf::monotonicNs();
    OtherReleaseDaemon other(d.socket());
    REQUIRE(waitAll(pointers(run), 30000));
    for (std::uint32_t r = 0; r < world; ++r) {
        const std::string line = run.line(r);
        INFO("rank " << r << ": " << line);
        CHECK(line.find(" error=DaemonLost ") != std::string::npos);
        CHECK(line.find("came back speaking another client protocol") != std::string::npos);
        CHECK(line.find("re-adoption cannot hold") != std::string::npos);
        CHECK(exitCode(run.ranks[r]) == 1);
        CHECK(run.ranks[r].endedNs - backAt <= 21000 * 1000000ull); // within open timeout + 1 s
    }
}

TEST_CASE("restart: all or none: a rank that does not ask to be re-adopted in time gets every other rank refused, by name") {
    Daemon d;
    const std::uint32_t world = 3, silent = 2;
    auto run = startRanks(d, world,
                          {"--iters", "1000000000", "--sizes", "64,4096", "--mode", "mixed", "--timeout-ms", "20000",
                           "--open-timeout-ms", "3000", "--progress", "64"},
                          {}, {{"TPF_HOST_DIRECT", "0"}});
    REQUIRE(advancePast(run, std::vector<std::uint64_t>(world, 0), kSlowStartMs));
    ::kill(run.ranks[silent].pid, SIGSTOP); // cannot ask: its watch is stopped with it
    d.signal(SIGKILL);
    d.restart();
    const std::uint64_t backAt = tpf::monotonicNs();
    std::vector<Child*> others;
    for (std::uint32_t r = 0; r < world; ++r)
        if (r != silent) others.push_back(&run.ranks[r]);
    REQUIRE(waitAll(others, 30000));
    ::kill(run.ranks[silent].pid, SIGKILL);
    INFO("daemon log:\n" << d.log());
    for (std::uint32_t r = 0; r < world; ++r) {
        if (r == silent) continue;
        const std::string line = run.line(r);
        INFO("rank " << r << ": " << line);
        CHECK(line.find(" error=DaemonLost ") != std::string::npos);
        CHECK(line.find("refused to re-adopt the group: Timeout: rank 2 did not ask to be re-adopted in time") !=
              std::string::npos);
        CHECK(exitCode(run.ranks[r]) == 1);
        CHECK(run.ranks[r].endedNs - backAt <= 4000 * 1000000ull); // within the open timeout + 1 s of the daemon's return
    }
    CHECK(groupsOf(d).empty());
    auto doc = nlohmann::json::parse(statusJson(d.socket()));
    CHECK(doc["metrics"]["adoption_refusals"]["Timeout"] == world - 1);
}
