// The host-direct path beside the proxy-carried one (--host-path direct,proxy):
// the same worlds, sizes and ops run twice against one daemon in one run.
#include <algorithm>
#include <cstdio>
#include <tuple>

#include "bench/bench.hpp"
#include "common/byte_size.hpp"

namespace tpf::bench {

namespace {

std::string fmt(double v, int decimals) {
    char b[32];
    std::snprintf(b, sizeof b, "%.*f", decimals, v);
    return b;
}

double us(const std::vector<std::uint64_t>& ns, double p) { return percentile(ns, p) / 1000.0; }

const Point* pointAt(const std::vector<std::pair<std::uint32_t, Point>>& rows, std::uint32_t world, const Point& like) {
    for (const auto& [w, p] : rows)
        if (w == world && p.op == like.op && p.size == like.size) return &p;
    return nullptr;
}

const WorldControl* controlAt(const std::vector<WorldControl>& control, std::uint32_t world) {
    for (const auto& c : control)
        if (c.world == world) return &c;
    return nullptr;
}

std::string mib(long kib) { return kib < 0 ? "-" : fmt(double(kib) / 1024.0, 1); }

} // namespace

std::string formatHostPaths(const Results& r, bool markdown) {
    if (r.otherPaths.empty()) return "";
    const PathRun& o = r.otherPaths[0];
    const std::string a = r.hostPath, b = o.path;
    std::vector<std::vector<std::string>> rows{{"op", "W", "size", a + " p50 µs", b + " p50 µs", a + " p99 µs", b + " p99 µs",
                                                b + " / " + a + " (p50)"}};
    auto sorted = r.rows;
    std::stable_sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) {
        return std::tuple(x.second.op, x.first, x.second.size) < std::tuple(y.second.op, y.first, y.second.size);
    });
    for (const auto& [world, p] : sorted) {
        const Point* q = pointAt(o.rows, world, p);
        if (!q) continue;
        const double pa = us(p.ns, 0.5), pb = us(q->ns, 0.5);
        rows.push_back({opName(p.op), std::to_string(world), formatByteSize(p.size), fmt(pa, 1), fmt(pb, 1), fmt(us(p.ns, 0.99), 1),
                        fmt(us(q->ns, 0.99), 1), pa > 0 ? fmt(pb / pa, 1) + "x" : "-"});
    }
    std::string out = renderTable(rows, markdown);
    std::vector<std::vector<std::string>> mem{{"group open", a + " daemon RSS MiB", b + " daemon RSS MiB", a + " shmem MiB",
                                               b + " shmem MiB"}};
    for (const auto& c : r.control)
        if (const WorldControl* d = controlAt(o.control, c.world))
            mem.push_back({"W=" + std::to_string(c.world), mib(c.groupsOpen.rssKiB), mib(d->groupsOpen.rssKiB),
                           mib(c.groupsOpen.shmemKiB), mib(d->groupsOpen.shmemKiB)});
    if (mem.size() > 1) out += "\n" + renderTable(mem, markdown, 1);
    const std::string bullet = markdown ? "- " : "  ";
    out += "\n" + bullet +
           "host paths: direct = each rank stages its shard in its own region and its same-node peers read it from "
           "there, waking each other themselves (TPF_HOST_DIRECT=1, the default); proxy = each rank rings the daemon, whose one proxy thread copies "
           "every shard to every peer (TPF_HOST_DIRECT=0). Both against the same daemon in this run, the " + b +
           " worlds first.\n";
    return out;
}

void addHostPathsJson(const Results& r, nlohmann::json& doc) {
    if (r.otherPaths.empty()) return;
    const PathRun& o = r.otherPaths[0];
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& [world, p] : o.rows)
        rows.push_back({{"op", opKey(p.op)}, {"world", world}, {"size", p.size}, {"p50_us", us(p.ns, 0.5)},
                        {"p99_us", us(p.ns, 0.99)}, {"samples", p.ns.size()}});
    nlohmann::json control = nlohmann::json::array();
    for (const auto& c : o.control)
        control.push_back({{"world", c.world}, {"rss_kib", c.groupsOpen.rssKiB}, {"rss_shmem_kib", c.groupsOpen.shmemKiB},
                           {"cpu_percent", c.groupsOpen.cpuPercent}});
    doc["host_paths"] = {{"main", r.hostPath}, {"other", o.path}, {"other_results", rows}, {"other_control", control}};
}

} // namespace tpf::bench
