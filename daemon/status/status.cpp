// The status document (see status.hpp; its fields: docs/status.md).
#include "daemon/status/status.hpp"

#include <unistd.h>

#include "daemon/verbs/hca.hpp"
#include "proto/ring.hpp"
#include "tpf_config.h"

namespace tpf::daemon {

namespace {

// A group's state as status names it: carrying (ranks closed in order) is
// "broken" too, and a closing group shows the life it closed from.
const char* stateName(const GroupLife& life) {
    switch (life.life()) {
    case GroupState::Joining: return "pending";
    case GroupState::Negotiating: return "negotiating";
    case GroupState::Open: return "open";
    case GroupState::Carrying:
    case GroupState::Broken: return "broken";
    default: return "unknown";
    }
}
constexpr const char* kStateNames[] = {"pending", "negotiating", "open", "broken"};

std::string ranksText(std::uint32_t mask) {
    std::string s;
    for (std::uint32_t r = 0; r < 32; ++r)
        if (mask >> r & 1u) s += (s.empty() ? "" : ",") + std::to_string(r);
    return s;
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

nlohmann::json daemonPart(const StatusSources& s) {
    const double uptime = std::chrono::duration<double>(std::chrono::steady_clock::now() - s.startedSteady).count();
    return {{"version", TPF_VERSION},
            {"pid", ::getpid()},
            {"uptime_s", uptime},
            {"started_unix_ns", s.startedUnixNs},
            {"node_id", s.nodeId.hex()},
            {"socket", s.socketPath},
            {"config_source", s.cfg.source},
            // The wire this node offers other nodes; "" without a peer link (peer.listen unset).
            {"peer_wire", s.cfg.peerListen.empty() ? "" : wireName(offeredWire(s.cfg, !s.hcas.empty()))},
            {"proxy",
             {{"state", s.proxy.sleeping() ? "sleeping" : "polling"},
              {"cpu", s.proxy.cpu()},
              {"doorbells", s.proxy.doorbells()},
              {"busy_ns", s.proxy.busyNs()},
              {"carry_threads", s.proxy.carryThreads()},
              {"carry_parts", s.proxy.carryParts()}}}};
}

nlohmann::json hcasPart(const std::vector<client_proto::HcaCard>& hcas) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& h : hcas) {
        std::string name;
        getText(h.device, name);
        out.push_back({{"device", name}, {"port", h.port}, {"state", portStateName(livePortState(h))},
                       {"gid", gidText(h.gid)}, {"gid_index", h.gidIndex}, {"ip", hcaIp(h)},
                       {"subnet", hcaSubnetText(h)}, {"mtu", h.mtu}, {"speed_mbps", h.speedMbps}});
    }
    return out;
}

// A tcp data link: its bytes and frames each way, its send buffer; null before it is up.
nlohmann::json tcpLinkPart(const TcpLink* l) {
    if (!l) return nullptr;
    const auto why = l->error();
    return {{"sent_bytes", l->bytesSent()},
            {"received_bytes", l->bytesReceived()},
            {"frames_sent", l->framesSent()},
            {"frames_received", l->framesReceived()},
            {"send_buffer", l->sendBuffer()},
            {"failed", why ? why->describe() : std::string()}};
}

// One entry per (group, other node): its link, its wire, and the queue pairs
// to its ranks (verbs) or its data link (tcp).
nlohmann::json peersPart(const GroupTable& table) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [id, g] : table.groups()) {
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
                                   {"inflight_high_water", l->gate.highWater()},
                                   {"flag_bytes", l->flagBytes()}});
                }
            // Every rank of that node closed in order: its daemon closing the link is no failure.
            const bool left = g.proxyGroup && (g.proxyGroup->gone.load(std::memory_order_relaxed) & n.ranks) == n.ranks;
            const LinkState state = left     ? LinkState::Closed
                                    : n.away ? LinkState::Away
                                    : n.session ? n.session->state()
                                    : g.life.state() == GroupState::Negotiating ? LinkState::Waiting
                                                                    : LinkState::Closed;
            const bool failed = !left && n.session && n.session->lastError().code != Errc::Ok;
            const TcpGroup* tcp = g.negotiation->tcp();
            out.push_back({{"group", id.hex()},
                           {"node_id", n.node.hex()},
                           {"endpoint", endpointText(n.addr, n.port)},
                           {"role", n.weConnect ? "connect" : "accept"},
                           {"ranks", ranksText(n.ranks)},
                           {"state", linkStateName(state)},
                           {"away_ms", n.away ? (monotonicNs() - n.awaySinceNs) / 1000000ull : std::uint64_t(0)},
                           {"wire", wireName(g.negotiation->wireKind())},
                           {"qps", qps},
                           {"tcp", tcpLinkPart(tcp ? tcp->linkTo(n.node) : nullptr)},
                           {"last_error", failed ? n.session->lastError().describe() : std::string()}});
        }
    }
    return out;
}

// A Device group's route as its kernels take it: ipc, or proxy (shm or verbs, the daemon carries it).
const char* gpuRouteName(std::uint8_t r) { return r == kWireSelf ? "self" : r == kWireIpc ? "ipc" : "proxy"; }

// How the local members that reported their GPU attach reach rank r: "ipc",
// "proxy", "ipc+proxy" when they differ; empty when none reported.
std::string reportedRouteTo(const GroupTable::Group& g, std::uint32_t r) {
    bool ipc = false, proxy = false;
    for (const auto& [s, m] : g.members)
        if (s != r && m.attach) (m.attach->wires[r] == kWireIpc ? ipc : proxy) = true;
    return ipc && proxy ? "ipc+proxy" : ipc ? "ipc" : proxy ? "proxy" : "";
}

// null for a group opened on this daemon; else its re-adoption after a
// restart: the gap from its ranks' loss of the old daemon to the adoption
// (null while some local rank has yet to ask).
nlohmann::json adoptionJson(const GroupTable::Group& g) {
    if (!g.adoption) return nullptr;
    const auto& a = *g.adoption;
    return {{"lost_unix_ns", a.lostUnixNs},
            {"adopted_unix_ns", a.adoptedUnixNs ? nlohmann::json(a.adoptedUnixNs) : nlohmann::json(nullptr)},
            {"gap_ms", a.adoptedUnixNs ? nlohmann::json(double(a.gapNs) / 1e6) : nlohmann::json(nullptr)}};
}

nlohmann::json groupsPart(const GroupTable& table) {
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& [id, g] : table.groups()) {
        std::uint64_t calls = 0, bytes = 0, errors = 0, hist[kLatencyBuckets] = {};
        std::uint64_t ncclCalls = 0, ncclBytes = 0;
        bool proxyPolls = false;
        nlohmann::json ranks = nlohmann::json::array();
        for (std::uint32_t r = 0; r < g.world; ++r) {
            const bool local = g.localMask >> r & 1u;
            nlohmann::json e = {{"rank", r}, {"local", local}, {"pid", nullptr}, {"uid", nullptr},
                                {"route", local ? "shm" : "verbs"}, {"host_direct", nullptr}, {"routes", nullptr},
                                {"device_bytes", nullptr}};
            auto m = g.members.find(r);
            if (m != g.members.end()) {
                e["pid"] = m->second.pid;
                e["uid"] = m->second.uid;
                if (!g.gpuDoorbells) e["host_direct"] = m->second.hostDirect;
                proxyPolls |= m->second.ring && g.ringsProxy(m->second);
                if (const auto& a = m->second.attach) {
                    nlohmann::json wires = nlohmann::json::array();
                    for (std::uint32_t q = 0; q < g.world; ++q) wires.push_back(gpuRouteName(a->wires[q]));
                    e["routes"] = std::move(wires);
                    e["device_bytes"] = a->deviceBytes;
                }
                if (m->second.ring) {
                    const RankStats st = readStats(m->second.ring->view.stats());
                    for (const OpStats& op : st.ops) {
                        calls += op.calls;
                        bytes += op.bytes;
                        errors += op.errors;
                        for (std::uint32_t b = 0; b < kLatencyBuckets; ++b) hist[b] += op.latency[b];
                    }
                    ncclCalls += st.ncclCalls + st.ncclGraphCalls;
                    ncclBytes += st.ncclBytes + st.ncclGraphBytes;
                }
            }
            if (g.wires[r]) e["route"] = wireName(g.wires[r]);
            if (const std::string gpu = reportedRouteTo(g, r); !gpu.empty()) e["route"] = gpu;
            ranks.push_back(e);
        }
        std::uint64_t total = 0;
        for (auto h : hist) total += h;
        groups.push_back({{"id", id.hex()},
                          {"world", g.world},
                          {"state", stateName(g.life)},
                          {"buffers", g.gpuDoorbells ? "device" : "host"},
                          {"proxy_polls", proxyPolls},
                          {"agreed_cap", g.agreedCap},
                          {"slot_bytes", g.layout.slotBytes},
                          {"stripes", g.layout.stripes},
                          {"ranks", ranks},
                          {"calls", calls},
                          {"bytes", bytes},
                          {"errors", errors},
                          {"nccl_calls", ncclCalls},
                          {"nccl_bytes", ncclBytes},
                          // null: no call of the group was timed (none completed yet, or device calls, which are not timed).
                          {"latency_us", total ? nlohmann::json{{"p50", percentileUs(hist, total, 0.50)},
                                                                {"p99", percentileUs(hist, total, 0.99)}}
                                               : nlohmann::json{{"p50", nullptr}, {"p99", nullptr}}},
                          {"last_error", g.lastError.code == Errc::Ok ? std::string() : g.lastError.describe()},
                          {"adoption", adoptionJson(g)}});
    }
    return groups;
}

std::string errcText(std::uint32_t code) {
    Errc e;
    if (errcFromWire(code, e)) return std::string(errcName(e));
    return "Errc" + std::to_string(code); // a newer client's code, still kept apart
}

// "calls" by assigned op name, "call_errors" by Errc name.
void callsJson(const CallTotals& t, nlohmann::json& out) {
    nlohmann::json calls = nlohmann::json::object();
    for (std::uint32_t o = 0; o < kStatsOps; ++o) {
        const char* name = statsOpName(o);
        if (!name) continue; // a slot no release assigned yet
        const CallTotals::Op& op = t.ops[o];
        calls[name] = {{"calls", op.calls},
                       {"bytes", op.bytes},
                       {"errors", op.errors},
                       {"latency_sum_ns", op.latencyNs},
                       {"latency_buckets", op.latency}};
    }
    nlohmann::json errors = nlohmann::json::object();
    for (std::uint32_t c = 1; c < kStatsErrcSlots; ++c)
        if (t.errorsByCode[c]) errors[errcText(c)] = t.errorsByCode[c];
    out["calls"] = std::move(calls);
    out["call_errors"] = std::move(errors);
    out["nccl_calls"] = {{"calls", t.ncclCalls}, {"bytes", t.ncclBytes}};
}

// Lifetime counters; calls of ranks gone plus those of current members;
// groups by state; queue pairs (as peers[].qps lists them).
nlohmann::json metricsPart(const GroupTable& table) {
    const Lifetime& life = table.lifetime();
    const auto byName = [](const std::map<Errc, std::uint64_t>& m) {
        nlohmann::json j = nlohmann::json::object();
        for (const auto& [code, n] : m) j[std::string(errcName(code))] = n;
        return j;
    };
    nlohmann::json fallbacks = nlohmann::json::array();
    for (const auto& [key, n] : life.openFallbacks())
        fallbacks.push_back({{"reason", std::string(errcName(key.first))},
                             {"outcome", key.second == client_proto::kOutcomeNccl ? "nccl" : "unavailable"},
                             {"count", n}});
    nlohmann::json out = {{"groups_opened", life.groupsOpened()},
                          {"groups_broken", byName(life.groupsBroken())},
                          {"open_refusals", byName(life.openRefusals())},
                          {"open_fallbacks", std::move(fallbacks)},
                          {"groups_adopted", life.groupsAdopted()},
                          {"adoption_gap_seconds", double(life.adoptionGapNs()) / 1e9},
                          {"adoption_refusals", byName(life.adoptionRefusals())},
                          {"peer_rejoins", life.peerRejoins()},
                          {"peer_away_seconds", double(life.peerAwayNs()) / 1e9}};
    CallTotals calls = life.calls();
    std::map<std::string, std::uint64_t> byState;
    std::uint64_t qps = 0;
    for (const auto& [id, g] : table.groups()) {
        ++byState[stateName(g.life)];
        for (const auto& [r, m] : g.members)
            if (m.ring) calls.add(readStats(m.ring->view.stats()), m.countedBefore.get());
        if (const VerbsGroup* wire = g.negotiation ? g.negotiation->wire() : nullptr)
            for (const auto& l : wire->links) qps += l ? 1 : 0;
    }
    callsJson(calls, out);
    nlohmann::json states = nlohmann::json::object();
    for (const char* name : kStateNames) states[name] = byState[name];
    out["groups"] = std::move(states);
    out["queue_pairs"] = qps;
    return out;
}

} // namespace

nlohmann::json statusDocument(const StatusSources& s, std::size_t clients) {
    return {
        {"status_version", 2},
        {"daemon", daemonPart(s)},
        {"hcas", hcasPart(s.hcas)},
        {"hcas_none_reason", s.hcas.empty() ? s.hcasNoneReason : std::string()},
        {"peers", peersPart(s.groups)},
        {"groups", groupsPart(s.groups)},
        {"regions", {{"count", s.groups.regionCount()}, {"host_bytes", s.groups.hostRegionBytes()}, {"device_bytes", s.groups.deviceRegionBytes()}}},
        {"clients", clients},
        {"metrics", metricsPart(s.groups)},
    };
}

} // namespace tpf::daemon
