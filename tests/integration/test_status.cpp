// tpfabricctl status --json shows the group, its ranks and its counters;
// SIGTERM stops the daemon cleanly (socket removed).
#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "catch.hpp"
#include "harness.hpp"

using namespace tpf::testing;

TEST_CASE("status --json shows the group and its counters; SIGTERM removes the socket") {
    Daemon d;
    auto run = startRanks(d, 3, {"--iters", "500", "--sizes", "4096", "--hold-ms", "4000"});
    // Wait until every rank finished its calls and holds the group open.
    nlohmann::json doc;
    for (int i = 0; i < 300; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        doc = nlohmann::json::parse(statusJson(d.socket()));
        if (!doc["groups"].empty() && doc["groups"][0]["calls"].get<std::uint64_t>() == 3 * 500) break;
    }
    INFO(doc.dump(2));
    REQUIRE(doc["groups"].size() == 1);
    const auto& g = doc["groups"][0];
    CHECK(g["world"] == 3);
    CHECK(g["state"] == "open");
    CHECK(g["agreed_cap"] == 65536);
    CHECK(g["calls"] == 1500);
    CHECK(g["bytes"] == 1500ull * 4096);
    CHECK(g["errors"] == 0);
    CHECK(g["latency_us"]["p50"].get<double>() > 0.0);
    CHECK(g["latency_us"]["p99"].get<double>() >= g["latency_us"]["p50"].get<double>());
    REQUIRE(g["ranks"].size() == 3);
    for (std::uint32_t r = 0; r < 3; ++r) {
        CHECK(g["ranks"][r]["pid"] == run.ranks[r].pid);
        CHECK(g["ranks"][r]["route"] == "shm");
    }
    CHECK(doc["regions"]["count"] == 3);
    CHECK(doc["hcas"].is_array());

    // The same through tpfabricctl, as an operator would see it.
    Child ctl = spawn({envPath("TPF_CTL"), "status", "--json", "--socket", d.socket()});
    REQUIRE(waitAll({&ctl}, 10000));
    CHECK(exitCode(ctl) == 0);
    auto viaCtl = nlohmann::json::parse(ctl.output);
    CHECK(viaCtl["groups"][0]["calls"] == 1500);
    Child human = spawn({envPath("TPF_CTL"), "status", "--socket", d.socket()});
    REQUIRE(waitAll({&human}, 10000));
    CHECK(exitCode(human) == 0);
    CHECK(human.output.find(g["id"].get<std::string>().substr(0, 12)) != std::string::npos);

    std::vector<Child*> all;
    for (auto& c : run.ranks) all.push_back(&c);
    REQUIRE(waitAll(all, 30000));
    CHECK(d.stop() == 0);
    struct stat st;
    CHECK(::stat(d.socket().c_str(), &st) != 0);
}

TEST_CASE("tpfabricctl status without a daemon: exit 1 and one line naming the socket") {
    Child ctl = spawn({envPath("TPF_CTL"), "status", "--socket", "/nonexistent/tpfabricd.sock"});
    REQUIRE(waitAll({&ctl}, 10000));
    CHECK(exitCode(ctl) == 1);
}
