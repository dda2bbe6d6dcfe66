// The status document (docs/status.md): groups' part here, the daemon's part
// in main.cpp.
#include "daemon/groups/groups.hpp"
#include "proto/ring.hpp"

namespace tpf::daemon {

namespace {
const char* stateName(int s) {
    static const char* const names[] = {"pending", "negotiating", "open", "broken"}; // GroupTable::State order
    return s >= 0 && s < 4 ? names[s] : "unknown";
}
double percentileUs(const std::uint64_t (&hist)[kLatencyBuckets], std::uint64_t total, double q) {
    if (total == 0) return 0.0;
    const std::uint64_t target = std::uint64_t(double(total) * q + 0.5);
    std::uint64_t seen = 0;
    for (std::uint32_t b = 0; b < kLatencyBuckets; ++b) {
        seen += hist[b];
        if (seen >= target && hist[b]) return double(latencyBucketFloor(b)) / 1000.0;
    }
    return double(latencyBucketFloor(kLatencyBuckets - 1)) / 1000.0;
}
} // namespace

nlohmann::json GroupTable::status() const {
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& [id, g] : groups_) {
        std::uint64_t calls = 0, bytes = 0, errors = 0, hist[kLatencyBuckets] = {};
        nlohmann::json ranks = nlohmann::json::array();
        for (std::uint32_t r = 0; r < g.world; ++r) {
            const bool local = g.localMask >> r & 1u;
            nlohmann::json e = {{"rank", r}, {"local", local}, {"pid", nullptr}, {"uid", nullptr},
                                {"route", local ? "shm" : "verbs"}};
            auto m = g.members.find(r);
            if (m != g.members.end()) {
                e["pid"] = m->second.pid;
                e["uid"] = m->second.uid;
                if (m->second.ring) {
                    const RankStats st = readStats(m->second.ring->view.stats());
                    for (const OpStats& op : st.ops) {
                        calls += op.calls;
                        bytes += op.bytes;
                        errors += op.errors;
                        for (std::uint32_t b = 0; b < kLatencyBuckets; ++b) hist[b] += op.latency[b];
                    }
                }
            }
            if (g.routes[r]) e["route"] = routeName(g.routes[r]);
            ranks.push_back(e);
        }
        std::uint64_t total = 0;
        for (auto h : hist) total += h;
        groups.push_back({{"id", id.hex()},
                          {"world", g.world},
                          {"state", stateName(int(g.state))},
                          {"agreed_cap", g.agreedCap},
                          {"slot_bytes", g.layout.slotBytes},
                          {"stripes", g.layout.stripes},
                          {"ranks", ranks},
                          {"calls", calls},
                          {"bytes", bytes},
                          {"errors", errors},
                          {"latency_us", {{"p50", percentileUs(hist, total, 0.50)}, {"p99", percentileUs(hist, total, 0.99)}}},
                          {"last_error", g.lastError.code == Errc::Ok ? std::string() : g.lastError.describe()}});
    }
    return groups;
}

nlohmann::json GroupTable::metricsStatus() const {
    nlohmann::json out = nlohmann::json::object();
    lifetime_.toJson(out);
    CallTotals calls = lifetime_.calls(); // ranks gone, then current members
    std::uint64_t byState[4] = {};
    std::uint64_t qps = 0;
    for (const auto& [id, g] : groups_) {
        ++byState[int(g.state)];
        for (const auto& [r, m] : g.members)
            if (m.ring) calls.add(readStats(m.ring->view.stats()));
        if (const VerbsGroup* wire = g.negotiation ? g.negotiation->wire() : nullptr)
            for (const auto& l : wire->links) qps += l ? 1 : 0; // as peers[].qps lists them
    }
    calls.toJson(out);
    nlohmann::json states = nlohmann::json::object();
    for (int s = 0; s < 4; ++s) states[stateName(s)] = byState[s];
    out["groups"] = std::move(states);
    out["queue_pairs"] = qps;
    return out;
}

nlohmann::json GroupTable::peersStatus() const {
    const auto ranksText = [](std::uint32_t mask) {
        std::string s;
        for (std::uint32_t r = 0; r < 32; ++r)
            if (mask >> r & 1u) s += (s.empty() ? "" : ",") + std::to_string(r);
        return s;
    };
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [id, g] : groups_) {
        if (!g.negotiation) continue;
        const VerbsGroup* wire = g.negotiation->wire();
        for (const auto& n : g.negotiation->nodes()) {
            nlohmann::json qps = nlohmann::json::array();
            if (wire)
                for (const auto& l : wire->links) {
                    if (!l || !(n.ranks >> l->remoteRank & 1u)) continue;
                    qps.push_back({{"local_rank", l->localRank},
                                   {"remote_rank", l->remoteRank},
                                   {"rail", l->rail},
                                   {"hca", l->hca().name()},
                                   {"qpn", l->qpn()},
                                   {"remote_qpn", l->remote.qpn},
                                   {"posts", l->posts.load(std::memory_order_relaxed)},
                                   {"inflight_cap", l->gate.cap()},
                                   {"inflight_high_water", l->gate.highWater()}});
                }
            const LinkState state = n.session ? n.session->state()
                                    : g.state == State::Negotiating ? LinkState::Waiting
                                                                    : LinkState::Closed;
            out.push_back({{"group", id.hex()},
                           {"node_id", n.node.hex()},
                           {"endpoint", endpointText(n.addr, n.port)},
                           {"role", n.weConnect ? "connect" : "accept"},
                           {"ranks", ranksText(n.ranks)},
                           {"state", linkStateName(state)},
                           {"qps", qps},
                           {"last_error", n.session && n.session->lastError().code != Errc::Ok ? n.session->lastError().describe()
                                                                                              : std::string()}});
        }
    }
    return out;
}

} // namespace tpf::daemon
