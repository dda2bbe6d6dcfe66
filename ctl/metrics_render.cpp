#include "ctl/metrics_render.hpp"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "proto/ring.hpp"

namespace tpf::ctl {

namespace {

using json = nlohmann::ordered_json;

// Reads the fields the metrics need; the first missing or mistyped one is
// remembered by its path, and every later read returns a neutral value.
class Fields {
public:
    const json& object(const json& parent, const std::string& key, const std::string& path) {
        const json* v = find(parent, key);
        if (v && v->is_object()) return *v;
        fail(path + key, "an object");
        return empty_;
    }
    std::uint64_t count(const json& parent, const std::string& key, const std::string& path) {
        const json* v = find(parent, key);
        if (v && v->is_number_unsigned()) return v->get<std::uint64_t>();
        if (v && v->is_number_integer() && v->get<std::int64_t>() >= 0) return std::uint64_t(v->get<std::int64_t>());
        fail(path + key, "a non-negative integer");
        return 0;
    }
    std::string text(const json& parent, const std::string& key, const std::string& path) {
        const json* v = find(parent, key);
        if (v && v->is_string()) return v->get<std::string>();
        fail(path + key, "a string");
        return {};
    }
    /// Every member of an object of counts, by name.
    std::map<std::string, std::uint64_t> countsByName(const json& parent, const std::string& key, const std::string& path) {
        std::map<std::string, std::uint64_t> out;
        const json& o = object(parent, key, path);
        for (const auto& [name, v] : o.items()) out[name] = count(o, name, path + key + ".");
        return out;
    }
    const json& array(const json& parent, const std::string& key, const std::string& path) {
        const json* v = find(parent, key);
        if (v && v->is_array()) return *v;
        fail(path + key, "an array");
        return emptyArray_;
    }
    void fail(const std::string& path, const std::string& want) {
        if (!error_) error_ = Error{Errc::BadMessage, "the daemon's status document has no " + want + " at " + path};
    }
    const std::optional<Error>& error() const { return error_; }

private:
    static const json* find(const json& parent, const std::string& key) {
        if (!parent.is_object()) return nullptr;
        auto it = parent.find(key);
        return it == parent.end() ? nullptr : &*it;
    }
    std::optional<Error> error_;
    const json empty_ = json::object();
    const json emptyArray_ = json::array();
};

struct OpCalls {
    std::uint64_t calls = 0, bytes = 0, errors = 0, latencySumNs = 0;
    std::vector<std::uint64_t> buckets; // kLatencyBuckets, by ring bucket
};

struct Fallback {
    std::string reason, outcome;
    std::uint64_t count = 0;
};

// Everything the exposition needs, read and checked before anything renders.
struct Snapshot {
    std::string version, nodeId;
    std::uint64_t startedUnixNs = 0, busyNs = 0, doorbells = 0;
    std::optional<std::uint64_t> carryThreads, carryParts; // absent from a daemon before the carry threads
    std::uint64_t regions = 0, hostBytes = 0, deviceBytes = 0, clients = 0;
    std::uint64_t groupsOpened = 0, queuePairs = 0, groupsAdopted = 0, ncclCalls = 0, ncclBytes = 0;
    double adoptionGapSeconds = 0;
    std::uint64_t peerRejoins = 0;
    double peerAwaySeconds = 0;
    std::map<std::string, std::uint64_t> adoptionRefused;
    std::map<std::string, std::uint64_t> broken, refused, callErrors, groupsByState;
    std::vector<Fallback> fallbacks;
    std::map<std::string, OpCalls> ops;
};

Result<Snapshot> read(const json& doc) {
    const json* version = doc.is_object() && doc.contains("status_version") ? &doc["status_version"] : nullptr;
    if (!version || !version->is_number_integer())
        return Error{Errc::BadMessage, "the daemon's answer is not a status document (no status_version)"};
    if (version->get<std::int64_t>() < kMetricsStatusVersion || !doc.contains("metrics"))
        return Error{Errc::VersionMismatch,
                     "tpfabricd's status document (status_version " + std::to_string(version->get<std::int64_t>()) +
                         ") has no metrics; this tpfabricctl needs status_version " +
                         std::to_string(kMetricsStatusVersion) + " or later: upgrade tpfabricd"};
    Fields f;
    Snapshot s;
    const json& daemon = f.object(doc, "daemon", "");
    s.version = f.text(daemon, "version", "daemon.");
    s.nodeId = f.text(daemon, "node_id", "daemon.");
    s.startedUnixNs = f.count(daemon, "started_unix_ns", "daemon.");
    const json& proxy = f.object(daemon, "proxy", "daemon.");
    s.busyNs = f.count(proxy, "busy_ns", "daemon.proxy.");
    s.doorbells = f.count(proxy, "doorbells", "daemon.proxy.");
    if (proxy.contains("carry_threads")) {
        s.carryThreads = f.count(proxy, "carry_threads", "daemon.proxy.");
        s.carryParts = f.count(proxy, "carry_parts", "daemon.proxy.");
    }
    const json& regions = f.object(doc, "regions", "");
    s.regions = f.count(regions, "count", "regions.");
    s.hostBytes = f.count(regions, "host_bytes", "regions.");
    s.deviceBytes = f.count(regions, "device_bytes", "regions.");
    s.clients = f.count(doc, "clients", "");

    const json& m = f.object(doc, "metrics", "");
    s.groupsOpened = f.count(m, "groups_opened", "metrics.");
    s.broken = f.countsByName(m, "groups_broken", "metrics.");
    s.refused = f.countsByName(m, "open_refusals", "metrics.");
    if (m.contains("groups_adopted")) { // a daemon that re-adopts groups after a restart
        s.groupsAdopted = f.count(m, "groups_adopted", "metrics.");
        const json* gap = m.contains("adoption_gap_seconds") ? &m["adoption_gap_seconds"] : nullptr;
        s.adoptionGapSeconds = gap && gap->is_number() ? gap->get<double>() : 0.0;
        s.adoptionRefused = f.countsByName(m, "adoption_refusals", "metrics.");
    }
    if (m.contains("peer_rejoins")) { // a daemon that waits for another node's restarted daemon
        s.peerRejoins = f.count(m, "peer_rejoins", "metrics.");
        const json* away = m.contains("peer_away_seconds") ? &m["peer_away_seconds"] : nullptr;
        s.peerAwaySeconds = away && away->is_number() ? away->get<double>() : 0.0;
    }
    s.callErrors = f.countsByName(m, "call_errors", "metrics.");
    if (m.contains("nccl_calls")) { // a daemon that counts Device groups' calls handed to NCCL
        const json& n = f.object(m, "nccl_calls", "metrics.");
        s.ncclCalls = f.count(n, "calls", "metrics.nccl_calls.");
        s.ncclBytes = f.count(n, "bytes", "metrics.nccl_calls.");
    }
    s.groupsByState = f.countsByName(m, "groups", "metrics.");
    s.queuePairs = f.count(m, "queue_pairs", "metrics.");
    const json& fallbacks = f.array(m, "open_fallbacks", "metrics.");
    for (std::size_t i = 0; i < fallbacks.size(); ++i) {
        const std::string at = "metrics.open_fallbacks[" + std::to_string(i) + "].";
        s.fallbacks.push_back({f.text(fallbacks[i], "reason", at), f.text(fallbacks[i], "outcome", at),
                               f.count(fallbacks[i], "count", at)});
    }
    const json& calls = f.object(m, "calls", "metrics.");
    for (const auto& [name, op] : calls.items()) {
        const std::string at = "metrics.calls." + name + ".";
        OpCalls c;
        c.calls = f.count(op, "calls", at);
        c.bytes = f.count(op, "bytes", at);
        c.errors = f.count(op, "errors", at);
        c.latencySumNs = f.count(op, "latency_sum_ns", at);
        const json& buckets = f.array(op, "latency_buckets", at);
        if (buckets.size() != kLatencyBuckets && !f.error())
            return Error{Errc::BadMessage, at + "latency_buckets has " + std::to_string(buckets.size()) +
                                               " buckets; this tpfabricctl reads " + std::to_string(kLatencyBuckets) +
                                               ": install tpfabricctl and tpfabricd of one release"};
        for (std::size_t b = 0; b < buckets.size(); ++b) {
            if (!buckets[b].is_number_unsigned()) {
                f.fail(at + "latency_buckets[" + std::to_string(b) + "]", "a non-negative integer");
                break;
            }
            c.buckets.push_back(buckets[b].get<std::uint64_t>());
        }
        s.ops[name] = std::move(c);
    }
    if (f.error()) return *f.error();
    return s;
}

// Per-`le` increments (not cumulative) of one op's ring histogram, +Inf last.
std::vector<double> coarsen(const std::vector<std::uint64_t>& ring, const std::vector<std::uint64_t>& bounds) {
    std::vector<double> out(bounds.size() + 1, 0.0);
    for (std::uint32_t b = 0; b < ring.size(); ++b) {
        // Bucket b holds [floor(b), floor(b+1)); the last one has no upper edge.
        const std::uint64_t upper = b + 1 < kLatencyBuckets ? latencyBucketFloor(b + 1) : ~0ull;
        std::size_t i = 0;
        while (i < bounds.size() && upper > bounds[i]) ++i;
        out[i] += double(ring[b]);
    }
    return out;
}

constexpr double kNsPerSecond = 1e9;

} // namespace

std::vector<std::uint64_t> latencyBoundsNs() {
    std::vector<std::uint64_t> out;
    for (std::uint32_t k = 10; k <= 29; ++k) out.push_back(1ull << k);
    return out;
}

Result<std::string> renderMetrics(const nlohmann::ordered_json& doc) {
    auto snap = read(doc);
    if (!snap) return snap.error();
    const Snapshot& s = *snap;
    using namespace prometheus;
    Registry reg;
    const auto counter = [&](const char* name, const char* help) -> Family<Counter>& {
        return BuildCounter().Name(name).Help(help).Register(reg);
    };
    const auto gauge = [&](const char* name, const char* help) -> Family<Gauge>& {
        return BuildGauge().Name(name).Help(help).Register(reg);
    };

    gauge("tpfabric_daemon_info", "tpfabricd's release and node id; always 1")
        .Add({{"version", s.version}, {"node_id", s.nodeId}})
        .Set(1);
    gauge("tpfabric_daemon_start_time_seconds", "When tpfabricd started, seconds since the Unix epoch; counters start at 0 then")
        .Add({})
        .Set(double(s.startedUnixNs) / kNsPerSecond);

    counter("tpfabric_groups_opened_total", "Groups that opened on this daemon (every local rank given the fabric path)")
        .Add({})
        .Increment(double(s.groupsOpened));
    auto& broken = counter("tpfabric_groups_broken_total",
                           "Open groups broken by a fault this daemon saw (a rank gone without closing, an abort, a bad "
                           "doorbell, a failed queue pair or peer link), once per group, by error name");
    for (const auto& [reason, n] : s.broken) broken.Add({{"reason", reason}}).Increment(double(n));
    auto& refused = counter("tpfabric_open_refusals_total",
                            "Ranks whose open this daemon refused (a verdict naming why), by error name");
    for (const auto& [reason, n] : s.refused) refused.Add({{"reason", reason}}).Increment(double(n));
    counter("tpfabric_groups_adopted_total",
            "Groups this daemon re-adopted after a restart (every local rank handed its region and ring back)")
        .Add({})
        .Increment(double(s.groupsAdopted));
    counter("tpfabric_adoption_gap_seconds_total",
            "The re-adopted groups' gaps added up: from their ranks losing the old daemon to the adoption, seconds")
        .Add({})
        .Increment(s.adoptionGapSeconds);
    counter("tpfabric_peer_rejoins_total",
            "Times another node's daemon came back to a group here after its link closed (restarted, it re-adopted "
            "the group)")
        .Add({})
        .Increment(double(s.peerRejoins));
    counter("tpfabric_peer_away_seconds_total",
            "How long those daemons' links were closed before they came back, added up, seconds")
        .Add({})
        .Increment(s.peerAwaySeconds);
    auto& adoptionRefused = counter("tpfabric_adoption_refusals_total",
                                    "Ranks this daemon refused to re-adopt after a restart (an Adopted naming why), by error name");
    for (const auto& [reason, n] : s.adoptionRefused) adoptionRefused.Add({{"reason", reason}}).Increment(double(n));
    auto& fallbacks = counter("tpfabric_open_fallbacks_total",
                              "Opens that ranks report did not take the fabric path, by error name and outcome "
                              "(nccl: NCCL took the group; unavailable: the open failed)");
    for (const auto& fb : s.fallbacks)
        fallbacks.Add({{"reason", fb.reason}, {"outcome", fb.outcome}}).Increment(double(fb.count));

    auto& calls = counter("tpfabric_calls_total",
                          "Collective calls of ranks on this node (host path, and Device groups' kernels), completed or failed, by op");
    auto& failed = counter("tpfabric_failed_calls_total", "Collective calls that failed, by op");
    auto& bytes = counter("tpfabric_bytes_total", "Shard bytes of completed calls (each rank's contribution), by op");
    auto& latency = BuildHistogram()
                        .Name("tpfabric_call_latency_seconds")
                        .Help("Latency of completed host-path calls, from the first byte staged to the result, by op")
                        .Register(reg);
    const auto bounds = latencyBoundsNs();
    Histogram::BucketBoundaries le;
    for (auto ns : bounds) le.push_back(double(ns) / kNsPerSecond);
    for (const auto& [op, c] : s.ops) {
        calls.Add({{"op", op}}).Increment(double(c.calls));
        failed.Add({{"op", op}}).Increment(double(c.errors));
        bytes.Add({{"op", op}}).Increment(double(c.bytes));
        latency.Add({{"op", op}}, le).ObserveMultiple(coarsen(c.buckets, bounds), double(c.latencySumNs) / kNsPerSecond);
    }
    auto& errors = counter("tpfabric_call_errors_total", "Failed calls by error name (any op)");
    for (const auto& [name, n] : s.callErrors) errors.Add({{"error", name}}).Increment(double(n));
    counter("tpfabric_nccl_calls_total", "Device groups' calls the library handed to NCCL (above the fabric's cap)")
        .Add({})
        .Increment(double(s.ncclCalls));
    counter("tpfabric_nccl_bytes_total", "Bytes of those calls (each rank's send bytes)").Add({}).Increment(double(s.ncclBytes));

    auto& groups = gauge("tpfabric_groups", "Groups in the daemon's table now, by state");
    for (const auto& [state, n] : s.groupsByState) groups.Add({{"state", state}}).Set(double(n));
    gauge("tpfabric_regions", "Registered regions now (one per local rank of a group)").Add({}).Set(double(s.regions));
    auto& regionBytes = gauge("tpfabric_region_bytes", "Bytes of registered regions now, by kind");
    regionBytes.Add({{"kind", "host"}}).Set(double(s.hostBytes));
    regionBytes.Add({{"kind", "device"}}).Set(double(s.deviceBytes));
    gauge("tpfabric_queue_pairs", "RDMA RC queue pairs of the groups in the table now").Add({}).Set(double(s.queuePairs));
    gauge("tpfabric_clients", "Connections to the control socket now, this scrape's included").Add({}).Set(double(s.clients));
    counter("tpfabric_proxy_busy_seconds_total", "Time the proxy thread was awake (polling or carrying doorbells), not asleep")
        .Add({})
        .Increment(double(s.busyNs) / kNsPerSecond);
    counter("tpfabric_proxy_doorbells_total", "Doorbells the proxy thread carried out")
        .Add({})
        .Increment(double(s.doorbells));
    if (s.carryThreads) {
        gauge("tpfabric_proxy_carry_threads", "The proxy's carry threads (proxy.carry_threads)").Add({}).Set(double(*s.carryThreads));
        counter("tpfabric_proxy_carry_parts_total", "Parts the carry threads copied: of same-node rows of 64 KiB and more, or a doorbell's smaller rows once they come to 64 KiB together")
            .Add({})
            .Increment(double(*s.carryParts));
    }

    std::ostringstream out;
    TextSerializer().Serialize(out, reg.Collect());
    return out.str();
}

} // namespace tpf::ctl
