// The table (plain or Markdown), its notes, and the JSON document.
#include <sys/utsname.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <stdexcept>
#include <tuple>

#include "bench/bench.hpp"
#include "common/byte_size.hpp"

namespace tpf::bench {

const char* opName(Op op) { return op == Op::Gather ? "gather" : op == Op::SumBf16 ? "sum bf16" : "sum f16"; }
const char* opKey(Op op) { return op == Op::Gather ? "gather" : op == Op::SumBf16 ? "sum" : "sum-f16"; }
Op opOfKey(const std::string& key) {
    for (Op op : {Op::Gather, Op::SumBf16, Op::SumF16})
        if (key == opKey(op)) return op;
    throw std::invalid_argument("'" + key + "': one of gather, sum, sum-f16");
}

double percentile(std::vector<std::uint64_t> samples, double p) {
    if (samples.empty()) return 0;
    std::sort(samples.begin(), samples.end());
    const auto rank = std::size_t(std::ceil(p * double(samples.size())));
    return double(samples[std::clamp<std::size_t>(rank, 1, samples.size()) - 1]);
}

namespace {

// Issue 16's host-path targets (3x the floor before it).
constexpr std::uint32_t kTargetWorld = 2;
constexpr std::uint64_t kTargetSize = 4096;
constexpr double kTargetRatio = 2.0;   // W = 2 4 KiB p50 over the floor's
constexpr std::uint32_t kWideWorld = 16;
constexpr double kWideLimitUs = 10.0; // W = 16 4 KiB gather p50
const char* jsonOp(Op op) { return op == Op::Gather ? "gather" : op == Op::SumBf16 ? "sum_bf16" : "sum_f16"; }

std::string fmt(double v, int decimals = 1) {
    char b[32];
    std::snprintf(b, sizeof b, "%.*f", decimals, v);
    return b;
}

double us(const std::vector<std::uint64_t>& ns, double p) { return percentile(ns, p) / 1000.0; }
double floorP50(const Point& f) { return f.bestBurstP50Ns > 0 ? f.bestBurstP50Ns / 1000.0 : us(f.ns, 0.5); }

const Point* floorAt(const Results& r, std::uint64_t size) {
    for (const auto& f : r.floor)
        if (f.size == size) return &f;
    return nullptr;
}

// Display width of UTF-8 text (code points; µ is one).
std::size_t width(const std::string& s) {
    std::size_t n = 0;
    for (unsigned char c : s) n += (c & 0xc0) != 0x80;
    return n;
}

/// The W = 16 4 KiB gather row the wide target judges, or nullptr.
const Point* wideGather(const Results& r) {
    for (const auto& [world, p] : r.rows)
        if (world == kWideWorld && p.size == kTargetSize && p.op == Op::Gather) return &p;
    return nullptr;
}

const std::string& routesOf(const Results& r, std::uint32_t world) {
    static const std::string none = "-";
    for (const auto& c : r.control)
        if (c.world == world) return c.routes;
    return none;
}

// "model name" of /proc/cpuinfo's first CPU, "" where there is none (not x86).
std::string cpuModel() {
    std::ifstream f("/proc/cpuinfo");
    for (std::string line; std::getline(f, line);)
        if (line.rfind("model name", 0) == 0) {
            const auto colon = line.find(':');
            return colon == std::string::npos ? "" : line.substr(line.find_first_not_of(' ', colon + 1));
        }
    return "";
}

double ratioOf(const Results& r, const Point& p) {
    const Point* f = floorAt(r, p.size);
    const double fl = f ? floorP50(*f) : 0;
    return fl > 0 ? us(p.ns, 0.5) / fl : 0;
}

} // namespace

std::string renderTable(const std::vector<std::vector<std::string>>& rows, bool markdown, std::size_t leftCols) {
    std::vector<std::size_t> w(rows[0].size(), 0);
    for (const auto& row : rows)
        for (std::size_t c = 0; c < row.size(); ++c) w[c] = std::max(w[c], width(row[c]));
    std::string out;
    auto pad = [&](const std::string& s, std::size_t c) {
        const std::string fill(w[c] - width(s), ' ');
        return c < leftCols ? s + fill : fill + s;
    };
    for (std::size_t i = 0; i < rows.size(); ++i) {
        std::string line = markdown ? "|" : "";
        for (std::size_t c = 0; c < rows[i].size(); ++c)
            line += markdown ? " " + pad(rows[i][c], c) + " |" : (c ? "  " : "") + pad(rows[i][c], c);
        out += line + "\n";
        if (i == 0) {
            std::string rule = markdown ? "|" : "";
            for (std::size_t c = 0; c < w.size(); ++c)
                rule += markdown ? " " + std::string(w[c] - 1, '-') + (c < leftCols ? "-" : ":") + " |"
                                 : (c ? "  " : "") + std::string(w[c], '-');
            out += rule + "\n";
        }
    }
    return out;
}

std::string formatTable(const Results& r, bool markdown) {
    const bool tcp = r.nodes == 2;
    const std::string fl = tcp ? "tcp floor" : "floor";
    std::vector<std::vector<std::string>> rows{
        {"op", "W", "size", "routes", "calls", "p50 µs", "p99 µs", fl + " p50 µs", fl + " p99 µs", "p50 / " + fl}};
    auto sorted = r.rows;
    std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
        return std::tuple(a.second.op, a.first, a.second.size) < std::tuple(b.second.op, b.first, b.second.size);
    });
    for (const auto& [world, p] : sorted) {
        const Point* f = floorAt(r, p.size);
        rows.push_back({opName(p.op), std::to_string(world), formatByteSize(p.size), routesOf(r, world), std::to_string(p.ns.size()), fmt(us(p.ns, 0.5)),
                        fmt(us(p.ns, 0.99)), f ? fmt(floorP50(*f), 2) : "-", f ? fmt(us(f->ns, 0.99), 2) : "-",
                        fmt(ratioOf(r, p)) + "x"});
    }
    const std::string bullet = markdown ? "- " : "  ";
    std::string out = tcp ? (markdown ? "**" : "") + std::string("Host path across 2 nodes over the tcp wire") + (markdown ? "**" : "") +
                                ": two tpfabricd on this machine, rank r on node r % 2; tcp floor: a raw TCP ping-pong between "
                                "two processes on loopback, one way = round trip / 2.\n\n"
                          : "";
    out += renderTable(rows, markdown, 4);
    out += "\n";
    std::string target;
    for (const auto& [world, p] : sorted)
        if (world == kTargetWorld && p.size == kTargetSize) {
            const double x = ratioOf(r, p);
            target += (target.empty() ? "" : ", ") + std::string(opName(p.op)) + " " + fmt(x) + "x (" +
                      (x <= kTargetRatio ? "met" : "missed") + ")";
        }
    out += bullet + "host path: " + r.hostPath +
           (r.hostPath == "direct" ? " (same-node ranks read each other's shards from their regions; TPF_HOST_DIRECT=1)"
                                   : " (the daemon's proxy carries every shard; TPF_HOST_DIRECT=0)") +
           (tcp ? " between ranks of one node; to the other node's ranks the sending daemon's proxy writes each shard to "
                  "the tcp link and the receiving daemon lands it in their regions" : "") + "\n";
    out += bullet + "routes: the wires in Group::route of every rank to every other rank" +
           (tcp ? "; every pair of ranks on different nodes took tcp (the run refuses any other wire)" : "") + "\n";
    if (tcp) {
        out += bullet + "loopback on one host is not a network: these rows measure the daemons' share of a call across "
                        "nodes (the sending proxy, both kernels' socket copies, the receiving daemon's receiver thread), "
                        "not a wire.\n";
        out += bullet + "targets: the host targets are for the ranks of one node; none is judged across nodes.\n";
    } else {
        out += bullet + "target: W=2 at 4 KiB within " + fmt(kTargetRatio, 0) + "x the floor (p50): " +
               (target.empty() ? std::string("not measured in this run (needs --world 2 and 4KiB in --sizes)") : target) + "\n";
        const Point* wide = wideGather(r);
        const double wideUs = wide ? us(wide->ns, 0.5) : 0;
        out += bullet + "target: W=16 4 KiB gather within " + fmt(kWideLimitUs, 0) + " µs (p50): " +
               (wide ? fmt(wideUs) + " µs (" + (wideUs <= kWideLimitUs ? "met" : "missed") + ")"
                     : std::string("not measured in this run (needs --world 16, 4KiB in --sizes, gather in --ops)")) + "\n";
    }
    const std::string pinning = r.floorPinning.empty() ? std::string("not pinned") : r.floorPinning;
    const std::string bursts = "p50 = the best of " + std::to_string(kFloorBursts) +
                               " interleaved bursts' p50, p99 over all round trips; " + pinning + ".\n";
    if (tcp)
        out += bullet + "tcp floor: raw two-process TCP ping-pong over one connection on 127.0.0.1 (TCP_NODELAY), one way = "
                        "round trip / 2; each leg sends the bytes, the other side, asleep in a blocking recv as the "
                        "daemons' receiver sleeps in epoll_wait, reads them all and sends them back. No daemon, no frame "
                        "header, no region. " + bursts;
    else
        out += bullet + "floor: raw two-process shared-memory ping-pong, one way = round trip / 2; each leg copies the bytes "
                        "in, release-stores a flag, the other side spins (pause, sched_yield) and copies them out. No daemon, "
                        "no futex. " + bursts;
    out += bullet + "p50/p99: CLOCK_MONOTONIC around each call, every timed call of every rank pooled (calls = W x timed "
                    "calls per rank: up to " + std::to_string(r.iters) + " after up to " + std::to_string(r.warmup) +
           " warm-up calls" +
           (r.pointMs ? "; slow points stop after about " + std::to_string(r.pointMs) + " ms but at least " +
                            std::to_string(r.minIters) + " calls, so their p99 is close to their maximum"
                      : "") +
           ").\n";
    const unsigned cpus = onlineCpus();
    if (r.loadBefore >= 0)
        out += bullet + "load average (1 min) " + fmt(r.loadBefore, 2) + " before the run, " + fmt(r.loadAfter, 2) +
               " after it: anything above ~0 is other work competing for the same CPUs.\n";
    std::uint32_t maxWorld = 0;
    for (auto w : r.worlds) maxWorld = std::max(maxWorld, w);
    // Across nodes a call also waits for the sending proxy and the receiving daemon's thread to run.
    const bool oversubscribed = tcp ? maxWorld + 2 > cpus : maxWorld > cpus;
    out += bullet + "this machine has " + std::to_string(cpus) + " online CPU(s); the ranks and the " +
           (tcp ? "daemons" : "daemon") + " are not pinned" +
           (!oversubscribed ? "."
            : tcp ? "; W = " + std::to_string(maxWorld) + " ranks plus both daemons' proxy and tcp receiver threads "
                    "oversubscribe it, so those rows measure the scheduler as much as the data path."
                  : "; W > " + std::to_string(cpus) + " oversubscribes it (plus the daemon's proxy thread), so those rows "
                    "measure the scheduler as much as the data path.") +
           "\n";
    out += "\n" + formatSumVsGather(r, markdown) + "\n" + formatControl(r, markdown);
    if (!r.otherPaths.empty()) out += "\n" + formatHostPaths(r, markdown);
    return out;
}

nlohmann::json toJson(const Results& r) {
    utsname u{};
    ::uname(&u);
    const std::time_t t = std::time(nullptr);
    char when[64];
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    nlohmann::json floor = nlohmann::json::array(), rows = nlohmann::json::array();
    for (const auto& f : r.floor)
        floor.push_back({{"size", f.size}, {"p50_us", floorP50(f)}, {"p50_all_us", us(f.ns, 0.5)}, {"p99_us", us(f.ns, 0.99)}, {"samples", f.ns.size()}});
    for (const auto& [world, p] : r.rows) {
        const Point* f = floorAt(r, p.size);
        rows.push_back({{"op", jsonOp(p.op)}, {"world", world}, {"size", p.size}, {"routes", routesOf(r, world)},
                        {"p50_us", us(p.ns, 0.5)}, {"p99_us", us(p.ns, 0.99)}, {"samples", p.ns.size()},
                        {"floor_p50_us", f ? floorP50(*f) : 0.0}, {"floor_p99_us", f ? us(f->ns, 0.99) : 0.0},
                        {"ratio_p50", ratioOf(r, p)}});
    }
    // The host targets are one node's; across nodes none is judged.
    const bool judged = r.nodes == 1;
    nlohmann::json target = nlohmann::json::array();
    for (const auto& [world, p] : r.rows)
        if (judged && world == kTargetWorld && p.size == kTargetSize)
            target.push_back({{"op", jsonOp(p.op)}, {"ratio_p50", ratioOf(r, p)},
                              {"limit", kTargetRatio}, {"met", ratioOf(r, p) <= kTargetRatio}});
    nlohmann::json wide = nullptr;
    if (const Point* p = judged ? wideGather(r) : nullptr) {
        const double x = us(p->ns, 0.5);
        wide = {{"world", kWideWorld}, {"size", p->size}, {"p50_us", x}, {"limit_us", kWideLimitUs}, {"met", x <= kWideLimitUs}};
    }
    nlohmann::json doc = {{"bench_version", 4}, {"nodes", r.nodes}, {"host_path", r.hostPath},
            {"machine", {{"cpus", onlineCpus()}, {"cpu_model", cpuModel()}, {"kernel", std::string(u.sysname) + " " + u.release},
                         {"arch", u.machine}, {"date_utc", when},
                         {"loadavg_1m_before", r.loadBefore}, {"loadavg_1m_after", r.loadAfter}}},
            {"iters", r.iters}, {"warmup", r.warmup}, {"point_ms", r.pointMs}, {"min_iters", r.minIters}, {"worlds", r.worlds}, {"sizes", r.sizes},
            {"units", "microseconds; p50/p99 nearest rank over all ranks' calls"},
            {"floor_kind", r.nodes == 2 ? "tcp" : "shm"}, {"floor", floor}, {"floor_pinning", r.floorPinning}, {"results", rows}, {"target", target}, {"target_wide", wide}};
    addControlJson(r, doc);
    addHostPathsJson(r, doc);
    return doc;
}

} // namespace tpf::bench
