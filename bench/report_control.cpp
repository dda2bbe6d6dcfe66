// The sum beside the gather of the same bytes, and the control plane: open
// times and the daemon's memory and idle CPU (issue 16's targets).
#include <algorithm>
#include <cstdio>
#include <tuple>

#include "bench/bench.hpp"
#include "common/byte_size.hpp"

namespace tpf::bench {

namespace {

constexpr double kSumGatherLimit = 1.3; // a sum's p50 over the p50 of the gather of the same bytes
constexpr std::uint64_t kSumGatherSize = 4096;
constexpr std::uint32_t kOpenWorld = 16;
constexpr double kOpenLimitMs = 100;  // open p50 at W = 16, one node
constexpr double kRssLimitMiB = 32;   // daemon RSS with a W = 16 group open
constexpr double kIdleCpuLimit = 1.0; // daemon CPU, % of one core, no call in flight

std::string fmt(double v, int decimals) {
    char b[32];
    std::snprintf(b, sizeof b, "%.*f", decimals, v);
    return b;
}

double p50(const std::vector<std::uint64_t>& ns) { return percentile(ns, 0.5); }

struct SumPair {
    Op op;
    std::uint32_t world;
    std::uint64_t size;
    double gatherUs, sumUs;
    double ratio() const { return gatherUs > 0 ? sumUs / gatherUs : 0; }
};

std::vector<SumPair> sumPairs(const Results& r) {
    std::vector<SumPair> out;
    for (const auto& [w, s] : r.rows) {
        if (s.op == Op::Gather) continue;
        for (const auto& [gw, g] : r.rows)
            if (g.op == Op::Gather && gw == w && g.size == s.size) out.push_back({s.op, w, s.size, p50(g.ns) / 1000, p50(s.ns) / 1000});
    }
    std::stable_sort(out.begin(), out.end(), [](const SumPair& a, const SumPair& b) {
        return std::tuple(a.op, a.world, a.size) < std::tuple(b.op, b.world, b.size);
    });
    return out;
}

std::string mib(long kib) { return kib < 0 ? "-" : fmt(double(kib) / 1024.0, 1); }
std::string cpu(const DaemonSample& s) { return s.cpuPercent < 0 ? "-" : fmt(s.cpuPercent, 2); }

nlohmann::json sampleJson(const DaemonSample& s) {
    return {{"rss_kib", s.rssKiB}, {"rss_shmem_kib", s.shmemKiB}, {"hwm_kib", s.hwmKiB}, {"cpu_percent", s.cpuPercent},
            {"window_ms", s.windowMs}};
}

} // namespace

std::string formatSumVsGather(const Results& r, bool markdown) {
    const auto pairs = sumPairs(r);
    if (pairs.empty()) return "";
    std::vector<std::vector<std::string>> rows{{"op", "W", "size", "gather p50 µs", "sum p50 µs", "sum / gather"}};
    for (const auto& p : pairs)
        rows.push_back({opName(p.op), std::to_string(p.world), formatByteSize(p.size), fmt(p.gatherUs, 1), fmt(p.sumUs, 1),
                        fmt(p.ratio(), 2) + "x"});
    std::string out = renderTable(rows, markdown);
    const std::string bullet = markdown ? "- " : "  ";
    // W ranks on fewer CPUs: which of two calls waited on the scheduler decides the ratio, not the data path.
    const unsigned cpus = onlineCpus();
    std::string verdicts;
    for (const auto& p : pairs)
        if (p.size == kSumGatherSize)
            verdicts += (verdicts.empty() ? "" : ", ") + std::string(opName(p.op)) + " W=" + std::to_string(p.world) + " " +
                        fmt(p.ratio(), 2) + "x (" +
                        (p.world > cpus ? "not judged: " + std::to_string(p.world) + " ranks on " + std::to_string(cpus) +
                                              " CPUs"
                         : p.ratio() <= kSumGatherLimit ? "met"
                                                        : "missed") +
                        ")";
    out += "\n" + bullet + "target: a sum at 4 KiB within " + fmt(kSumGatherLimit, 1) +
           "x the gather of the same bytes and W (p50): " +
           (verdicts.empty() ? std::string("not measured (needs both ops and 4KiB in --sizes)") : verdicts) + "\n";
    out += bullet + "same run, same ranks, same group: each sum row beside the gather row of its W and size; a sum moves "
                    "the same shards as the gather and then adds the W rows in rank order (client/reduce.cpp) instead of "
                    "copying them out.\n";
    return out;
}

std::string formatControl(const Results& r, bool markdown) {
    std::vector<std::vector<std::string>> rows{
        {"groups open", "opens", "open p50 ms", "open max ms", "daemon RSS MiB", "of it shmem MiB", "daemon CPU % of a core"}};
    auto idleRow = [&](const char* label, const DaemonSample& s) {
        if (s.windowMs > 0) rows.push_back({label, "-", "-", "-", mib(s.rssKiB), mib(s.shmemKiB), cpu(s)});
    };
    idleRow("none (before)", r.idleBefore);
    for (const auto& c : r.control) {
        const bool any = !c.openNs.empty();
        const double maxNs = any ? double(*std::max_element(c.openNs.begin(), c.openNs.end())) : 0;
        rows.push_back({"W=" + std::to_string(c.world), std::to_string(c.openNs.size()), any ? fmt(p50(c.openNs) / 1e6, 1) : "-",
                        any ? fmt(maxNs / 1e6, 1) : "-", mib(c.groupsOpen.rssKiB), mib(c.groupsOpen.shmemKiB), cpu(c.groupsOpen)});
    }
    idleRow("none (after)", r.idleAfter);
    std::string out = renderTable(rows, markdown, 1);
    const std::string bullet = markdown ? "- " : "  ";
    out += "\n";
    // Targets.
    std::string open = "not measured (needs --world 16)", rss = open;
    for (const auto& c : r.control) {
        if (c.world != kOpenWorld) continue;
        if (!c.openNs.empty()) {
            const double ms = p50(c.openNs) / 1e6;
            open = fmt(ms, 1) + " ms (" + (ms <= kOpenLimitMs ? "met" : "missed") + ")";
        }
        if (c.groupsOpen.rssKiB >= 0) {
            const double m = double(c.groupsOpen.rssKiB) / 1024.0;
            rss = fmt(m, 1) + " MiB (" + (m <= kRssLimitMiB ? "met" : "missed") + ")";
        } else {
            rss = "daemon not readable";
        }
    }
    double worstIdle = -1;
    std::string idle;
    for (const DaemonSample* s : {&r.idleBefore, &r.idleAfter})
        if (s->cpuPercent >= 0) worstIdle = std::max(worstIdle, s->cpuPercent);
    double worstOpen = -1;
    for (const auto& c : r.control) worstOpen = std::max(worstOpen, c.groupsOpen.cpuPercent);
    auto verdict = [](double v) { return v < 0 ? std::string("-") : fmt(v, 2) + "% (" + (v <= kIdleCpuLimit ? "met" : "missed") + ")"; };
    out += bullet + "target: open at W=" + std::to_string(kOpenWorld) + " within " + fmt(kOpenLimitMs, 0) + " ms (p50): " + open + "\n";
    out += bullet + "target: daemon RSS with a W=" + std::to_string(kOpenWorld) + " group open within " + fmt(kRssLimitMiB, 0) +
           " MiB: " + rss + "\n";
    out += bullet + "target: daemon idle CPU within " + fmt(kIdleCpuLimit, 0) + "% of a core: no group " + verdict(worstIdle) +
           ", host groups open between calls (worst W) " + verdict(worstOpen) + "\n";
    out += bullet + "open: Group::open on every rank after a barrier on the bootstrap, the slowest rank's time per open; " +
           "p50 and max over the opens of each W (each open but the last closed at once, " +
           (r.nodes == 2 ? "across two nodes: both daemons negotiate each group" : "on one node") +
           ", TCP bootstrap on loopback).\n";
    out += bullet + "daemon (" + (r.daemonHow.empty() ? std::string("not found") : r.daemonHow) +
           "): VmRSS and RssShmem from /proc/PID/status (shmem: the groups' regions, shared with the ranks); CPU = its "
           "threads' run time (/proc/PID/task/*/schedstat) over a window of " +
           fmt(r.control.empty() ? r.idleBefore.windowMs : r.control[0].groupsOpen.windowMs, 0) + " ms, " +
           std::to_string(r.settleMs) + " ms after the last call (or after the daemon started / the last group closed).\n";
    return out;
}

void addControlJson(const Results& r, nlohmann::json& doc) {
    nlohmann::json pairs = nlohmann::json::array();
    for (const auto& p : sumPairs(r))
        pairs.push_back({{"op", opKey(p.op)}, {"world", p.world}, {"size", p.size}, {"gather_p50_us", p.gatherUs},
                         {"sum_p50_us", p.sumUs}, {"ratio_p50", p.ratio()}, {"limit", kSumGatherLimit}});
    nlohmann::json worlds = nlohmann::json::array();
    for (const auto& c : r.control)
        worlds.push_back({{"world", c.world}, {"routes", c.routes}, {"open_ns", c.openNs}, {"open_p50_ms", c.openNs.empty() ? 0.0 : p50(c.openNs) / 1e6},
                          {"daemon_groups_open", sampleJson(c.groupsOpen)}});
    doc["sum_vs_gather"] = pairs;
    doc["control"] = {{"daemon", r.daemonHow}, {"settle_ms", r.settleMs}, {"idle_before", sampleJson(r.idleBefore)},
                      {"idle_after", sampleJson(r.idleAfter)}, {"worlds", worlds},
                      {"limits", {{"open_p50_ms_w16", kOpenLimitMs}, {"rss_mib_w16", kRssLimitMiB}, {"idle_cpu_percent", kIdleCpuLimit}}}};
}

} // namespace tpf::bench
