// The fault matrix of docs/reliability.md (issue 6), against the real daemon
// and real rank processes: a client killed before, during and after a call
// while another group runs; the local daemon killed mid-call and between
// calls, open refused without it, a restarted daemon serving fresh groups.
// Bounds are the (a wait ends within its timeout + 1 s), never speed.
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "catch.hpp"
#include "harness.hpp"

#include "common/shm.hpp"

using namespace tpf::testing;

namespace {

constexpr std::uint32_t kTimeoutMs = 10000; // every rank's --timeout-ms
constexpr std::uint64_t kBoundNs = (kTimeoutMs + 1000) * 1000000ull;
const std::string kTimeout = std::to_string(kTimeoutMs);
constexpr int kSlowStartMs = 120000; // processes starting on a loaded two-core box

void touch(const std::string& path) { std::ofstream(path) << "go\n"; }

std::vector<Child*> pointers(RankRun& run, std::int64_t except = -1) {
    std::vector<Child*> v;
    for (std::size_t r = 0; r < run.ranks.size(); ++r)
        if (std::int64_t(r) != except) v.push_back(&run.ranks[r]);
    return v;
}

/// The first line of `out` starting with `prefix`, or "".
std::string firstLine(const std::string& out, const std::string& prefix) {
    for (std::size_t at = 0; at < out.size();) {
        const std::size_t end = std::min(out.find('\n', at), out.size());
        if (out.compare(at, prefix.size(), prefix) == 0) return out.substr(at, end - at);
        at = end + 1;
    }
    return "";
}

/// The number after "key=" in `line`, or -1.
double field(const std::string& line, const std::string& key) {
    const auto at = line.find(key + "=");
    return at == std::string::npos ? -1.0 : std::atof(line.c_str() + at + key.size() + 1);
}

/// Poll until every child printed a line starting with `prefix`; when each first did, 0 if never.
std::vector<std::uint64_t> seenAt(const std::vector<Child*>& children, const std::string& prefix, int timeoutMs) {
    std::vector<std::uint64_t> at(children.size(), 0);
    const std::uint64_t deadline = tpf::monotonicNs() + std::uint64_t(timeoutMs) * 1000000ull;
    for (;;) {
        bool all = true;
        for (std::size_t i = 0; i < children.size(); ++i) {
            if (at[i]) continue;
            readOutput(*children[i]);
            if (!firstLine(children[i]->output, prefix).empty()) at[i] = tpf::monotonicNs();
            else all = false;
        }
        if (all || tpf::monotonicNs() > deadline) return at;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
}

nlohmann::json status(const Daemon& d) { return nlohmann::json::parse(statusJson(d.socket())); }

/// Until the daemon reports a group of `world` ranks broken with `error` (its last_error).
bool groupBroken(const Daemon& d, std::uint32_t world, const std::string& error) {
    for (int i = 0; i < 500; ++i) {
        const auto s = status(d);
        for (const auto& g : s["groups"])
            if (g["world"] == world && g["last_error"].get<std::string>().find(error) != std::string::npos) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
}

/// Until the daemon holds exactly `groups` groups and `regions` regions (they leave asynchronously).
bool holdsOnly(const Daemon& d, std::size_t groups, std::size_t regions) {
    for (int i = 0; i < 500; ++i) {
        const auto s = status(d);
        if (s["groups"].size() == groups && s["regions"]["count"] == regions) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
}

/// A W = 2 group calling until its stop file appears, as the daemon's "other group".
class Bystander {
public:
    explicit Bystander(const Daemon& d)
        : stop_(d.dir() + "/stop-bystander"),
          run_(startRanks(d, 2, {"--iters", "1000000000", "--sizes", "64,4096", "--mode", "mixed", "--timeout-ms",
                                 kTimeout, "--stop-file", stop_, "--progress", "32"})) {}
    /// Until rank 0 reports more calls than `past`; the count it reached, or 0.
    std::uint64_t advancesPast(std::uint64_t past) {
        const std::uint64_t deadline = tpf::monotonicNs() + std::uint64_t(kSlowStartMs) * 1000000ull;
        while (tpf::monotonicNs() < deadline) {
            Child& c = run_.ranks[0];
            if (!waitForOutput(c, "PROGRESS", 100)) {
                if (c.reaped) return 0;
                continue;
            }
            const auto at = c.output.rfind("PROGRESS");
            const auto calls = std::uint64_t(field(c.output.substr(at, c.output.find('\n', at) - at), "calls"));
            if (calls > past) return calls;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return 0;
    }
    void finish() {
        touch(stop_);
        auto all = pointers(run_);
        REQUIRE(waitAll(all, kSlowStartMs));
        for (std::uint32_t r = 0; r < 2; ++r) {
            INFO("bystander rank " << r << ": " << run_.line(r));
            CHECK(run_.line(r).rfind("RESULT rank=" + std::to_string(r) + " ok calls=", 0) == 0);
            CHECK(exitCode(run_.ranks[r]) == 0);
        }
    }

private:
    std::string stop_;
    RankRun run_;
};

} // namespace

TEST_CASE("a client killed before, during and after a call: the others end PeerLost naming it, another group runs on") {
    Daemon d;
    Bystander bystander(d);
    std::uint64_t bystanderCalls = bystander.advancesPast(0);
    REQUIRE(bystanderCalls > 0);
    const std::uint32_t world = 3;
    enum class When { BeforeFirstCall, OthersWaiting, VictimWaiting, BetweenCalls };
    struct Phase {
        When when;
        const char* name;
        std::uint32_t victim;
        std::uint64_t calls; // the call (index) the survivors fail
    };
    const Phase phases[] = {
        {When::BeforeFirstCall, "before its first call (every rank opened, none called)", 0, 0},
        {When::OthersWaiting, "before posting a call the others wait in", 1, 50},
        {When::VictimWaiting, "inside a call it posted, waiting for a slow rank", 1, 50},
        {When::BetweenCalls, "between calls (every rank idle)", 2, 50},
    };
    for (const Phase& p : phases) {
        INFO("client killed " << p.name << ": victim rank " << p.victim);
        const std::string go = d.dir() + "/go-" + std::to_string(int(p.when));
        const std::string at = std::to_string(p.calls);
        std::vector<std::string> common{"--iters", "1000", "--sizes", "64,4096", "--mode", "mixed", "--timeout-ms", kTimeout};
        std::map<std::uint32_t, std::vector<std::string>> perRank;
        const std::uint32_t slow = (p.victim + 1) % world; // VictimWaiting: the rank that posts late
        switch (p.when) {
        case When::BeforeFirstCall:
        case When::BetweenCalls: common.insert(common.end(), {"--pause-at", at, "--go-file", go}); break;
        case When::OthersWaiting: perRank[p.victim] = {"--stall-at", at}; break;
        case When::VictimWaiting: perRank[slow] = {"--pause-at", at, "--go-file", go}; break;
        }
        auto run = startRanks(d, world, common, perRank);
        Child& victim = run.ranks[p.victim];
        switch (p.when) {
        case When::BeforeFirstCall:
        case When::BetweenCalls:
            for (auto& c : run.ranks) REQUIRE(waitForOutput(c, "PAUSED", kSlowStartMs));
            break;
        case When::OthersWaiting: // the victim never posts call 50; the others wait in it
            REQUIRE(waitForOutput(victim, "STALL", kSlowStartMs));
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            break;
        case When::VictimWaiting: // the victim and one more posted call 50 and wait for the slow rank
            REQUIRE(waitForOutput(run.ranks[slow], "PAUSED", kSlowStartMs));
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            break;
        }
        const std::uint64_t killedAt = tpf::monotonicNs();
        ::kill(victim.pid, SIGKILL);
        waitAll({&victim}, 10000);
        if (p.when == When::VictimWaiting) CHECK(groupBroken(d, world, "PeerLost")); // the slow rank posts after the break
        if (p.when != When::OthersWaiting) touch(go);
        auto others = pointers(run, p.victim);
        REQUIRE(waitAll(others, int(kBoundNs / 1000000) + 10000));
        INFO("daemon log:\n" << d.log());
        for (std::uint32_t r = 0; r < world; ++r) {
            if (r == p.victim) continue;
            const std::string line = run.line(r);
            INFO("rank " << r << ": " << line);
            CHECK(line.find("error=PeerLost ") != std::string::npos);
            // The slow rank may still complete the call it posted last: every shard of it was there.
            const auto calls = std::uint64_t(field(line, "calls"));
            if (p.when == When::VictimWaiting && r == slow) CHECK((calls == p.calls || calls == p.calls + 1));
            else CHECK(calls == p.calls);
            CHECK(line.find("detail=rank " + std::to_string(p.victim) + " is gone") != std::string::npos);
            CHECK(exitCode(run.ranks[r]) == 1); // 3: a failed call wrote into its output
            CHECK(field(line, "elapsed_ms") <= kTimeoutMs + 1000);
            CHECK(run.ranks[r].endedNs - killedAt <= kBoundNs);
        }
        // The broken group's regions and rings are freed; only the bystander's two remain.
        CHECK(holdsOnly(d, 1, 2));
        // The other group kept calling through the fault and goes on.
        const std::uint64_t now = bystander.advancesPast(bystanderCalls);
        CHECK(now > bystanderCalls);
        bystanderCalls = now;
    }
    bystander.finish();
    CHECK(holdsOnly(d, 0, 0));
    CHECK(d.stop() == 0);
}

TEST_CASE("the local daemon killed and not back in time: every call ends DaemonLost, open is refused by name, a restarted "
          "daemon serves") {
    for (const bool midCall : {true, false}) {
        INFO((midCall ? "daemon killed while every rank is inside a call" : "daemon killed while every rank is between calls"));
        Daemon d;
        const std::string go = d.dir() + "/go", back = d.dir() + "/daemon-back";
        // Host-direct calls need no daemon: they go on until the open timeout, in which no daemon re-adopted the group.
        const std::uint32_t openTimeoutMs = 5000;
        std::vector<std::string> common{"--iters", "1000000000", "--sizes", "64,4096", "--mode", "mixed",
                                        "--timeout-ms", kTimeout, "--progress", "32", "--reopen",
                                        "--reopen-go-file", back, "--reopen-iters", "200"};
        if (!midCall) common.insert(common.end(), {"--pause-at", "100", "--go-file", go, "--open-timeout-ms",
                                                   std::to_string(openTimeoutMs)});
        const std::uint64_t boundNs = midCall ? kBoundNs : (openTimeoutMs + 1000) * 1000000ull;
        // Two groups, one per fallback policy: host buffers have no NCCL to fall back to, so both refuse.
        // Inside a call: the proxy-carried path, which a stopped daemon holds up (the calls end at their
        // timeout); between calls: host-direct (it needs no daemon to run, and ends DaemonLost when the
        // daemon is not back within the open timeout; test_host_direct kills it mid-run).
        const std::string direct = midCall ? "0" : "1";
        auto a = startRanks(d, 3, common, {}, {{"TPF_FALLBACK", "nccl"}, {"TPF_HOST_DIRECT", direct}});
        auto b = startRanks(d, 2, common, {}, {{"TPF_FALLBACK", "error"}, {"TPF_HOST_DIRECT", direct}});
        std::vector<Child*> all = pointers(a);
        for (Child* c : pointers(b)) all.push_back(c);
        for (Child* c : all) REQUIRE(waitForOutput(*c, midCall ? "PROGRESS" : "PAUSED", kSlowStartMs));
        if (midCall) {
            // A stopped daemon takes no doorbell (TPF_HOST_DIRECT=0): every rank is then inside a call, waiting.
            d.signal(SIGSTOP);
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
        }
        const std::uint64_t killedAt = tpf::monotonicNs();
        d.signal(SIGKILL);
        if (!midCall) touch(go);
        const auto failedAt = seenAt(all, "RESULT", int(boundNs / 1000000) + 10000);
        const auto reopenedAt = seenAt(all, "REOPEN", kSlowStartMs);
        INFO("daemon log:\n" << d.log());
        for (std::size_t i = 0; i < all.size(); ++i) {
            const bool policyError = i >= a.ranks.size();
            const std::string failed = firstLine(all[i]->output, "RESULT"), reopen = firstLine(all[i]->output, "REOPEN");
            INFO((policyError ? "TPF_FALLBACK=error group, rank " : "TPF_FALLBACK=nccl group, rank ")
                 << (policyError ? i - a.ranks.size() : i) << ":\n"
                 << all[i]->output);
            CHECK(failed.find(" error=DaemonLost ") != std::string::npos);
            if (!midCall) CHECK(field(failed, "calls") >= 100);
            CHECK(field(failed, "elapsed_ms") <= kTimeoutMs + 1000);
            CHECK(failedAt[i] != 0);
            CHECK(failedAt[i] - killedAt <= boundNs);
            // The next open, with no daemon on the socket: refused, the reason named.
            CHECK(reopenedAt[i] != 0);
            CHECK(reopen.find(" error=Unavailable ") != std::string::npos);
            CHECK(reopen.find("DaemonUnreachable") != std::string::npos);
            if (policyError) CHECK(reopen.find("(TPF_FALLBACK=error on rank 0)") != std::string::npos);
        }
        // A daemon restarted on the same socket path serves both groups afresh.
        d.restart();
        touch(back);
        REQUIRE(waitAll(all, kSlowStartMs));
        for (std::uint32_t r = 0; r < 3; ++r) {
            INFO("after the restart, group a rank " << r << ": " << a.line(r));
            CHECK(a.line(r) == "RESULT rank=" + std::to_string(r) + " ok calls=200");
        }
        for (std::uint32_t r = 0; r < 2; ++r) {
            INFO("after the restart, group b rank " << r << ": " << b.line(r));
            CHECK(b.line(r) == "RESULT rank=" + std::to_string(r) + " ok calls=200");
        }
        CHECK(holdsOnly(d, 0, 0));
        CHECK(d.stop() == 0);
    }
}
