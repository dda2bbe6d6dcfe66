// `tpfabricctl metrics` rendering (ctl/metrics_render.cpp): every metric from
// a status document, histogram buckets against latencies this test buckets
// itself, refusals of old and malformed documents by name. The end-to-end
// check against a real daemon, parsed by prometheus_client, is
// tests/integration/test_metrics.py.
#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"
#include "ctl/metrics_render.hpp"
#include "proto/ring.hpp"

using namespace tpf;
using json = nlohmann::ordered_json;

namespace {

// Latencies (ns) of the sample's completed all_gather calls; none equal to a bound.
const std::vector<std::uint64_t> kLatencies = {100, 900, 1500, 3000, 3100, 70000, 500000000, 2000000000};

json sampleDoc() {
    std::vector<std::uint64_t> buckets(kLatencyBuckets, 0), none(kLatencyBuckets, 0);
    std::uint64_t sum = 0;
    for (auto ns : kLatencies) {
        ++buckets[latencyBucket(ns)];
        sum += ns;
    }
    return json{
        {"status_version", 2},
        {"daemon",
         {{"version", "0.1.0"},
          {"node_id", "00112233445566778899aabbccddeeff"},
          {"started_unix_ns", 1700000000500000000ull},
          {"proxy",
           {{"state", "sleeping"}, {"cpu", -1}, {"doorbells", 42}, {"busy_ns", 2500000000ull}, {"carry_threads", 2},
            {"carry_parts", 96}}}}},
        {"regions", {{"count", 3}, {"host_bytes", 3 * 69632}, {"device_bytes", 0}}},
        {"clients", 4},
        {"metrics",
         {{"groups_opened", 5},
          {"groups_broken", {{"PeerLost", 2}, {"Aborted", 1}}},
          {"open_refusals", {{"Unavailable", 3}}},
          {"open_fallbacks", json::array({{{"reason", "Unavailable"}, {"outcome", "unavailable"}, {"count", 2}},
                                          {{"reason", "ProbeFailed"}, {"outcome", "nccl"}, {"count", 4}}})},
          {"calls",
           {{"all_gather", {{"calls", kLatencies.size() + 1}, {"bytes", 4096}, {"errors", 1}, {"latency_sum_ns", sum},
                            {"latency_buckets", buckets}}},
            {"all_reduce_sum",
             {{"calls", 0}, {"bytes", 0}, {"errors", 0}, {"latency_sum_ns", 0}, {"latency_buckets", none}}}}},
          {"call_errors", {{"PeerLost", 1}}},
          {"nccl_calls", {{"calls", 7}, {"bytes", 7340032}}},
          {"groups", {{"pending", 0}, {"negotiating", 0}, {"open", 1}, {"broken", 0}}},
          {"queue_pairs", 6},
          {"groups_adopted", 2},
          {"adoption_gap_seconds", 0.75},
          {"peer_rejoins", 3},
          {"peer_away_seconds", 1.5},
          {"adoption_refusals", {{"CapMismatch", 2}}}}},
    };
}

// "name{a="x",b="y"}" -> value, for every sample line.
std::map<std::string, double> samples(const std::string& text) {
    std::map<std::string, double> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        if (line.empty() || line[0] == '#') continue;
        const auto space = line.rfind(' ');
        REQUIRE(space != std::string::npos);
        out[line.substr(0, space)] = std::strtod(line.c_str() + space + 1, nullptr);
    }
    return out;
}

std::string render(const json& doc) {
    auto r = ctl::renderMetrics(doc);
    INFO((r ? std::string() : r.error().describe()));
    REQUIRE(r.ok());
    return *r;
}

} // namespace

TEST_CASE("latency bounds are edges of the ring's buckets") {
    const auto bounds = ctl::latencyBoundsNs();
    REQUIRE(bounds.size() >= 10);
    for (auto ns : bounds) {
        const std::uint32_t b = latencyBucket(ns);
        INFO(ns);
        CHECK(latencyBucketFloor(b) == ns);     // a bucket starts there...
        CHECK(b + 1 < kLatencyBuckets);         // ...and is not the open-ended last one
        CHECK(latencyBucket(ns - 1) == b - 1);  // so the one below ends there
    }
}

TEST_CASE("every metric of a status document, with HELP and TYPE") {
    const std::string text = render(sampleDoc());
    INFO(text);
    const auto s = samples(text);
    auto at = [&](const std::string& key) {
        INFO(key);
        REQUIRE(s.count(key) == 1);
        return s.at(key);
    };
    CHECK(at(R"(tpfabric_daemon_info{node_id="00112233445566778899aabbccddeeff",version="0.1.0"})") == 1);
    CHECK(at("tpfabric_daemon_start_time_seconds") == Approx(1700000000.5));
    CHECK(at("tpfabric_groups_opened_total") == 5);
    CHECK(at(R"(tpfabric_groups_broken_total{reason="PeerLost"})") == 2);
    CHECK(at(R"(tpfabric_groups_broken_total{reason="Aborted"})") == 1);
    CHECK(at(R"(tpfabric_open_refusals_total{reason="Unavailable"})") == 3);
    CHECK(at("tpfabric_groups_adopted_total") == 2);
    CHECK(at("tpfabric_adoption_gap_seconds_total") == Approx(0.75));
    CHECK(at("tpfabric_peer_rejoins_total") == 3);
    CHECK(at("tpfabric_peer_away_seconds_total") == Approx(1.5));
    CHECK(at(R"(tpfabric_adoption_refusals_total{reason="CapMismatch"})") == 2);
    CHECK(at(R"(tpfabric_open_fallbacks_total{outcome="unavailable",reason="Unavailable"})") == 2);
    CHECK(at(R"(tpfabric_open_fallbacks_total{outcome="nccl",reason="ProbeFailed"})") == 4);
    CHECK(at(R"(tpfabric_calls_total{op="all_gather"})") == double(kLatencies.size() + 1));
    CHECK(at(R"(tpfabric_calls_total{op="all_reduce_sum"})") == 0);
    CHECK(at(R"(tpfabric_failed_calls_total{op="all_gather"})") == 1);
    CHECK(at(R"(tpfabric_bytes_total{op="all_gather"})") == 4096);
    CHECK(at(R"(tpfabric_call_errors_total{error="PeerLost"})") == 1);
    CHECK(at("tpfabric_nccl_calls_total") == 7);
    CHECK(at("tpfabric_nccl_bytes_total") == 7340032);
    CHECK(at(R"(tpfabric_groups{state="open"})") == 1);
    CHECK(at(R"(tpfabric_groups{state="pending"})") == 0);
    CHECK(at("tpfabric_regions") == 3);
    CHECK(at(R"(tpfabric_region_bytes{kind="host"})") == 3 * 69632);
    CHECK(at(R"(tpfabric_region_bytes{kind="device"})") == 0);
    CHECK(at("tpfabric_queue_pairs") == 6);
    CHECK(at("tpfabric_clients") == 4);
    CHECK(at("tpfabric_proxy_busy_seconds_total") == 2.5);
    CHECK(at("tpfabric_proxy_doorbells_total") == 42);
    CHECK(at("tpfabric_proxy_carry_threads") == 2);
    CHECK(at("tpfabric_proxy_carry_parts_total") == 96);

    // Every family has its HELP and TYPE, every name is tpfabric_*.
    std::istringstream in(text);
    std::map<std::string, int> help, type;
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("# HELP ", 0) == 0) ++help[line.substr(7, line.find(' ', 7) - 7)];
        else if (line.rfind("# TYPE ", 0) == 0) ++type[line.substr(7, line.find(' ', 7) - 7)];
        else if (!line.empty()) CHECK(line.rfind("tpfabric_", 0) == 0);
    }
    CHECK(type.size() == 27);
    for (const auto& [name, n] : type) {
        INFO(name);
        CHECK(n == 1);
        CHECK(help[name] == 1);
    }
}

TEST_CASE("latency histogram: cumulative le buckets, count and sum of completed calls") {
    const auto s = samples(render(sampleDoc()));
    std::uint64_t sum = 0;
    for (auto ns : kLatencies) sum += ns;
    CHECK(s.at(R"(tpfabric_call_latency_seconds_count{op="all_gather"})") == double(kLatencies.size()));
    CHECK(s.at(R"(tpfabric_call_latency_seconds_sum{op="all_gather"})") == Approx(double(sum) / 1e9));
    CHECK(s.at(R"(tpfabric_call_latency_seconds_bucket{op="all_gather",le="+Inf"})") == double(kLatencies.size()));
    CHECK(s.at(R"(tpfabric_call_latency_seconds_count{op="all_reduce_sum"})") == 0);
    std::size_t seen = 0;
    for (const auto& [key, value] : s) {
        const std::string prefix = R"(tpfabric_call_latency_seconds_bucket{op="all_gather",le=")";
        if (key.rfind(prefix, 0) != 0) continue;
        const std::string le = key.substr(prefix.size(), key.find('"', prefix.size()) - prefix.size());
        if (le == "+Inf") continue;
        const double bound = std::strtod(le.c_str(), nullptr) * 1e9;
        double expect = 0;
        for (auto ns : kLatencies) expect += double(ns) <= bound ? 1 : 0;
        INFO(key);
        CHECK(value == expect);
        ++seen;
    }
    CHECK(seen == ctl::latencyBoundsNs().size());
}

TEST_CASE("a daemon from before the carry threads: their two metrics left out, the rest as ever") {
    json doc = sampleDoc();
    doc["daemon"]["proxy"].erase("carry_threads");
    doc["daemon"]["proxy"].erase("carry_parts");
    const auto s = samples(render(doc));
    CHECK(s.count("tpfabric_proxy_carry_threads") == 0);
    CHECK(s.count("tpfabric_proxy_carry_parts_total") == 0);
    CHECK(s.at("tpfabric_proxy_doorbells_total") == 42);
}

TEST_CASE("an older daemon and malformed documents are refused by name") {
    json old = sampleDoc();
    old["status_version"] = 1;
    old.erase("metrics");
    auto r = ctl::renderMetrics(old);
    CHECK(r.code() == Errc::VersionMismatch);
    CHECK(r.error().detail.find("upgrade tpfabricd") != std::string::npos);

    CHECK(ctl::renderMetrics(json::parse("[]")).code() == Errc::BadMessage);
    CHECK(ctl::renderMetrics(json::parse(R"({"status_version": "2"})")).code() == Errc::BadMessage);

    json bad = sampleDoc();
    bad["metrics"]["calls"]["all_gather"]["bytes"] = "many";
    r = ctl::renderMetrics(bad);
    CHECK(r.code() == Errc::BadMessage);
    CHECK(r.error().detail.find("metrics.calls.all_gather.bytes") != std::string::npos);

    bad = sampleDoc();
    bad["metrics"]["groups_broken"]["PeerLost"] = -1;
    r = ctl::renderMetrics(bad);
    CHECK(r.code() == Errc::BadMessage);
    CHECK(r.error().detail.find("metrics.groups_broken.PeerLost") != std::string::npos);

    bad = sampleDoc();
    bad["metrics"]["calls"]["all_gather"]["latency_buckets"] = json::array({1, 2, 3});
    r = ctl::renderMetrics(bad);
    CHECK(r.code() == Errc::BadMessage);
    CHECK(r.error().detail.find("latency_buckets has 3 buckets") != std::string::npos);

    bad = sampleDoc();
    bad["daemon"].erase("proxy");
    r = ctl::renderMetrics(bad);
    CHECK(r.code() == Errc::BadMessage);
    CHECK(r.error().detail.find("daemon.proxy") != std::string::npos);
}
