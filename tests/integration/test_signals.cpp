// Signals to the real tpfabricd (operations.md, "Start, stop, logs"): SIGHUP,
// SIGUSR1 and SIGUSR2 are logged and ignored, so an open group runs on and the
// daemon still answers; SIGTERM then stops it with status 0 and removes its
// socket.
#include <sys/stat.h>

#include <csignal>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "catch.hpp"
#include "harness.hpp"

using namespace tpf::testing;

namespace {

/// Waits until the daemon's log holds `needle`.
bool logHas(Daemon& d, const std::string& needle, int timeoutMs) {
    for (int waited = 0; waited < timeoutMs; waited += 20) {
        if (d.log().find(needle) != std::string::npos) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
}

} // namespace

TEST_CASE("SIGHUP, SIGUSR1, SIGUSR2: logged and ignored; the group runs on; SIGTERM stops with 0") {
    Daemon d;
    // Two ranks pause between calls, holding their group open while the signals arrive.
    const std::string go = d.dir() + "/go";
    auto run = startRanks(d, 2, {"--iters", "400", "--sizes", "64,4096", "--pause-at", "200", "--go-file", go});
    for (auto& c : run.ranks) REQUIRE(waitForOutput(c, "PAUSED", 120000));

    ::kill(d.pid(), SIGHUP);
    REQUIRE(logHas(d, "SIGHUP ignored: the configuration is read at start only; `systemctl restart tpfabricd` applies "
                      "a new one",
                   10000));
    ::kill(d.pid(), SIGUSR1);
    REQUIRE(logHas(d, "SIGUSR1 ignored", 10000));
    ::kill(d.pid(), SIGUSR2);
    REQUIRE(logHas(d, "SIGUSR2 ignored", 10000));
    ::kill(d.pid(), SIGHUP); // a second one is ignored too
    std::this_thread::sleep_for(std::chrono::milliseconds(100));

    // Still serving: the group is open and tpfabricctl status answers.
    const auto doc = nlohmann::json::parse(statusJson(d.socket()));
    REQUIRE(doc["groups"].size() == 1);
    CHECK(doc["groups"][0]["state"] == "open");
    Child ctl = spawn({envPath("TPF_CTL"), "status", "--socket", d.socket()});
    REQUIRE(waitAll({&ctl}, 10000));
    CHECK(exitCode(ctl) == 0);

    // The group finishes its calls after the signals.
    std::ofstream(go) << "go\n";
    std::vector<Child*> all;
    for (auto& c : run.ranks) all.push_back(&c);
    REQUIRE(waitAll(all, 60000));
    INFO("daemon log:\n" << d.log());
    for (std::uint32_t r = 0; r < 2; ++r) {
        INFO("rank " << r << ": " << run.line(r));
        CHECK(run.line(r).find("ok calls=400") != std::string::npos);
        CHECK(exitCode(run.ranks[r]) == 0);
    }

    CHECK(d.stop() == 0);
    struct stat st;
    CHECK(::stat(d.socket().c_str(), &st) != 0);
}
