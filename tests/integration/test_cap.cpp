// The agreed cap (issue 13, item 4): ranks asking above daemon.max_bytes get
// the daemon's maximum, not a refusal; the cap is the exact minimum of every
// rank's ask and the daemon's maximum, the same on every rank, logged once
// naming what set it, shown by status; calls at the cap pass on every rank
// and calls one byte above it fail CapMismatch on every rank.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "catch.hpp"
#include "harness.hpp"
#include <tpfabric/tpfabric.hpp>

using namespace tpf::testing;

namespace {

constexpr std::uint64_t kDaemonMax = 16384;

// A daemon whose daemon.max_bytes is `maxBytes`.
Daemon daemonWithMax(std::uint64_t maxBytes) {
    char dir[] = "/tmp/tpf-cap-XXXXXX";
    if (!::mkdtemp(dir)) throw std::runtime_error("mkdtemp");
    const std::string cfg = std::string(dir) + "/d.toml";
    FILE* f = std::fopen(cfg.c_str(), "w");
    std::fprintf(f, "[daemon]\nmax_bytes = %llu\n", (unsigned long long)maxBytes);
    std::fclose(f);
    return Daemon({"--config", cfg});
}

// What one rank saw; threads only record (Catch2 2.x is not thread-safe).
struct RankView {
    tpf::Status open{tpf::Errc::Closed};
    std::unique_ptr<tpf::Group> group;
};

// Every rank opens in its own thread with its own ask.
std::vector<RankView> openAll(const Daemon& d, const std::vector<std::uint64_t>& asks) {
    const auto world = std::uint32_t(asks.size());
    const std::string boot = "127.0.0.1:" + std::to_string(freePort());
    std::vector<RankView> views(world);
    std::vector<std::thread> threads;
    for (std::uint32_t r = 0; r < world; ++r)
        threads.emplace_back([&, r] {
            auto b = tpf::TcpBootstrap::create(r, world, boot);
            if (!b) return void(views[r].open = b.error());
            tpf::Options o;
            o.socketPath = d.socket();
            o.fallback = tpf::Fallback::Error;
            auto g = tpf::Group::open(**b, r, world, asks[r], o);
            if (!g) return void(views[r].open = g.error());
            views[r].group = std::move(*g);
            views[r].open = tpf::okStatus();
        });
    for (auto& t : threads) t.join();
    return views;
}

// One call on every rank at once; each rank's status.
std::vector<tpf::Status> onEveryRank(std::vector<RankView>& views,
                                     const std::function<tpf::Status(tpf::Group&, std::uint32_t)>& call) {
    std::vector<tpf::Status> out(views.size(), tpf::Status{tpf::Errc::Closed});
    std::vector<std::thread> threads;
    for (std::uint32_t r = 0; r < views.size(); ++r)
        threads.emplace_back([&, r] { out[r] = call(*views[r].group, r); });
    for (auto& t : threads) t.join();
    return out;
}

std::size_t count(const std::string& text, const std::string& needle) {
    std::size_t n = 0;
    for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
}

// Gathers and sums at `bytes` on every rank, byte/bit-exact; "" when all passed.
std::string callsAt(std::vector<RankView>& views, std::uint64_t bytes) {
    const auto world = std::uint32_t(views.size());
    std::vector<std::vector<std::uint8_t>> send(world), recv(world);
    std::vector<std::vector<float>> fsend(world), fsum(world);
    for (std::uint32_t r = 0; r < world; ++r) {
        send[r].resize(bytes + 64);
        recv[r].assign(std::size_t(world) * bytes + 64, 0);
        for (std::uint64_t i = 0; i < bytes; ++i) send[r][i] = std::uint8_t(r * 131 + i * 7 + 1);
        fsend[r].assign(bytes / sizeof(float), float(r + 1));
        fsum[r].assign(bytes / sizeof(float), 0.0f);
    }
    auto g = onEveryRank(views, [&](tpf::Group& grp, std::uint32_t r) { return grp.allGather(send[r].data(), recv[r].data(), bytes); });
    auto s = onEveryRank(views, [&](tpf::Group& grp, std::uint32_t r) {
        return grp.allReduceSum(fsend[r].data(), fsum[r].data(), fsend[r].size(), tpf::DType::F32);
    });
    const float want = float(world * (world + 1) / 2);
    for (std::uint32_t r = 0; r < world; ++r) {
        if (!g[r]) return "rank " + std::to_string(r) + " gather: " + g[r].error().describe();
        if (!s[r]) return "rank " + std::to_string(r) + " sum: " + s[r].error().describe();
        for (std::uint32_t q = 0; q < world; ++q)
            for (std::uint64_t i = 0; i < bytes; ++i)
                if (recv[r][q * bytes + i] != send[q][i]) return "rank " + std::to_string(r) + ": wrong gather row " + std::to_string(q);
        for (float v : fsum[r])
            if (v != want) return "rank " + std::to_string(r) + ": wrong sum";
    }
    return "";
}

} // namespace

TEST_CASE("ranks asking above daemon.max_bytes: the group opens with the daemon's maximum on every rank") {
    Daemon d = daemonWithMax(kDaemonMax);
    auto views = openAll(d, {65536, 1 << 20, kDaemonMax + 1});
    for (std::uint32_t r = 0; r < views.size(); ++r) {
        INFO("rank " << r << ": " << (views[r].open ? "ok" : views[r].open.error().describe()) << "\n" << d.log());
        REQUIRE(views[r].open.ok());
        CHECK(views[r].group->path() == "fabric");
        CHECK(views[r].group->agreedCap() == kDaemonMax);
        CHECK(views[r].group->fits(kDaemonMax));
        CHECK_FALSE(views[r].group->fits(kDaemonMax + 1));
    }
    const std::string log = d.log();
    INFO(log);
    CHECK(count(log, "agreed cap ") == 1);
    CHECK(count(log, "agreed cap 16384 bytes (daemon of node ") == 1);
    CHECK(log.find("CapMismatch") == std::string::npos);
    const auto doc = nlohmann::json::parse(statusJson(d.socket()));
    REQUIRE(doc["groups"].size() == 1);
    CHECK(doc["groups"][0]["agreed_cap"] == kDaemonMax);
    CHECK(doc["groups"][0]["state"] == "open");

    // At the cap every rank's gather and sum pass, byte/bit-exact.
    CHECK(callsAt(views, kDaemonMax) == "");
    // One byte above it every rank refuses by name; nothing breaks.
    alignas(16) static std::uint8_t in[3][kDaemonMax + 16], out[3][3 * (kDaemonMax + 16)];
    auto over = onEveryRank(views, [&](tpf::Group& g, std::uint32_t r) { return g.allGather(in[r], out[r], kDaemonMax + 1); });
    auto overSum = onEveryRank(views, [&](tpf::Group& g, std::uint32_t r) {
        return g.allReduceSum(in[r], out[r], (kDaemonMax + 16) / 4, tpf::DType::F32);
    });
    for (std::uint32_t r = 0; r < views.size(); ++r) {
        INFO("rank " << r);
        CHECK(over[r].code() == tpf::Errc::CapMismatch);
        CHECK(overSum[r].code() == tpf::Errc::CapMismatch);
        CHECK(views[r].group->check().ok());
    }
    CHECK(over[0].error().detail == over[1].error().detail);
    CHECK(over[1].error().detail == over[2].error().detail);
    CHECK(callsAt(views, kDaemonMax) == "");
}

TEST_CASE("a rank asking below daemon.max_bytes sets the cap exactly, and is named") {
    Daemon d = daemonWithMax(kDaemonMax);
    const std::uint64_t smallest = 4096 + 100; // not a page multiple: the cap is exact, never a rounded slot
    auto views = openAll(d, {1 << 20, smallest, kDaemonMax});
    for (std::uint32_t r = 0; r < views.size(); ++r) {
        INFO("rank " << r << ": " << (views[r].open ? "ok" : views[r].open.error().describe()));
        REQUIRE(views[r].open.ok());
        CHECK(views[r].group->agreedCap() == smallest);
    }
    const std::string log = d.log();
    INFO(log);
    CHECK(count(log, "agreed cap ") == 1);
    CHECK(count(log, "agreed cap 4196 bytes (rank 1 is the smallest)") == 1);
    CHECK(callsAt(views, smallest) == "");
    alignas(16) static std::uint8_t in[3][8192], out[3][3 * 8192];
    auto over = onEveryRank(views, [&](tpf::Group& g, std::uint32_t r) { return g.allGather(in[r], out[r], smallest + 1); });
    for (std::uint32_t r = 0; r < views.size(); ++r) CHECK(over[r].code() == tpf::Errc::CapMismatch);
}
