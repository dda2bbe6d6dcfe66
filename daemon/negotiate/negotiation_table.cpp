// Routing peer links to negotiations, parked links, remembered refusals (see negotiation_table.hpp).
#include "daemon/negotiate/negotiation_table.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/shm.hpp"

namespace tpf::daemon {

using namespace client_proto;
using namespace peer_proto;

Bytes verdictMessage(std::uint16_t opcode, const GroupId& id, Errc code, std::uint32_t missingRank,
                     const std::string& why, std::uint64_t leftAfter) {
    PeerVerdict v{};
    id.copyTo(v.groupId);
    v.errc = std::uint16_t(code);
    v.missingRank = missingRank;
    v.leftAfter = leftAfter;
    setText(v.reason, why.substr(0, sizeof v.reason - 1));
    return peer_proto::encode(opcode, 0, v);
}

NegotiationTable::NegotiationTable(boost::asio::io_context& io, const DaemonConfig& cfg, const NodeId& self,
                                   std::vector<std::shared_ptr<VerbsHca>> hcas)
    : io_(io), cfg_(cfg), self_(self), hcas_(std::move(hcas)), peers_(io, cfg, self, *this) {}

std::optional<Error> NegotiationTable::unavailable() const {
    if (!peers_.enabled())
        return Error{Errc::Unavailable, "ranks are on other nodes and this daemon has no peer link (set peer.listen)"};
    return std::nullopt;
}

std::uint8_t offeredWire(const DaemonConfig& cfg, bool haveHcas) {
    using W = DaemonConfig::PeerWire;
    return cfg.peerWire == W::Tcp || (cfg.peerWire == W::Auto && !haveHcas) ? kWireTcp : kWireVerbs;
}

Result<std::uint8_t> NegotiationTable::wireFor(const std::vector<RosterEntry>& roster) const {
    for (std::uint32_t r = 0; r < roster.size(); ++r) {
        if (roster[r].peerWire != kWireTcp) continue;
        // The point first and short: a reason travels in 127 bytes, behind "node X (ADDR) refused the group: ".
        if (cfg_.peerWire == DaemonConfig::PeerWire::Verbs)
            return Error{Errc::Unavailable, "peer.wire is \"verbs\" and node " + NodeId::of(roster[r].nodeId).shortHex() +
                                                " offers only tcp (set \"auto\")"};
        return std::uint8_t(kWireTcp);
    }
    if (hcas_.empty())
        return Error{Errc::Unavailable, cfg_.peerWire == DaemonConfig::PeerWire::Verbs
                                            ? "peer.wire is \"verbs\" and this node has no usable HCA (tpfabricctl "
                                              "status; or set \"auto\")"
                                            : "this node has no usable HCA and the roster offers no tcp (a "
                                              "libtpfabric before the tcp wire opened it?)"};
    return std::uint8_t(kWireVerbs);
}

std::shared_ptr<Negotiation> NegotiationTable::create(NegotiationEvents& events, const GroupId& id,
                                                  const std::vector<RosterEntry>& roster) {
    auto n = std::make_shared<Negotiation>(*this, events, id, roster);
    active_[id] = n.get();
    return n;
}

Negotiation* NegotiationTable::find(const GroupId& id) const {
    auto it = active_.find(id);
    return it == active_.end() ? nullptr : it->second;
}

bool NegotiationTable::expired(std::uint64_t sinceNs) const {
    return monotonicNs() - sinceNs > std::uint64_t(cfg_.openTimeoutMs) * 1000000ull;
}

const Error* NegotiationTable::refusedGroup(const GroupId& id, bool ours) {
    auto it = refusedGroups_.find(id);
    if (it == refusedGroups_.end() || it->second.ours != ours) return nullptr;
    if (expired(it->second.atNs)) {
        refusedGroups_.erase(it);
        return nullptr;
    }
    return &it->second.why;
}

void NegotiationTable::rememberRefusal(const GroupId& id, Error why, bool ours) {
    std::erase_if(refusedGroups_, [&](const auto& kv) { return expired(kv.second.atNs); });
    if (refusedGroups_.size() >= kMaxRefusedGroups) refusedGroups_.erase(refusedGroups_.begin());
    refusedGroups_[id] = GroupRefusal{std::move(why), monotonicNs(), ours};
}

const Error* NegotiationTable::refusalOf(const NodeId& node) const {
    auto it = refusals_.find(node);
    if (it == refusals_.end() || monotonicNs() - it->second.atNs >= std::uint64_t(cfg_.openTimeoutMs) * 1000000ull)
        return nullptr;
    return &it->second.why;
}

std::optional<NegotiationTable::Parked> NegotiationTable::takeParked(const GroupId& id, const NodeId& node) {
    auto it = std::find_if(parked_.begin(), parked_.end(), [&](const Parked& p) {
        return id.is(p.record.fixed.groupId) && p.session->remoteNode() == node;
    });
    if (it == parked_.end()) return std::nullopt;
    Parked p = std::move(*it);
    parked_.erase(it);
    return p;
}

void NegotiationTable::dropParked(const GroupId& id) {
    std::erase_if(parked_, [&](const Parked& p) { return id.is(p.record.fixed.groupId); });
}

// A PeerReady carrying the reason goes to every other node of the roster, on
// a link opened for that alone (or on the link it already parked here).
void NegotiationTable::tellRefused(const GroupId& id, const std::vector<RosterEntry>& roster, Errc code,
                               const std::string& why) {
    if (!peers_.enabled()) return;
    const bool told = refusedGroup(id, true) != nullptr;
    rememberRefusal(id, Error{code, why}, true);
    if (told) return;
    const Bytes v = verdictMessage(kPeerReady, id, code, kNoPeer, why);
    std::vector<NodeId> done{self_};
    std::erase_if(parked_, [&](const Parked& p) {
        if (!id.is(p.record.fixed.groupId)) return false;
        p.session->send(v);
        p.session->finish();
        done.push_back(p.session->remoteNode());
        return true;
    });
    for (const auto& e : roster) {
        const NodeId node = NodeId::of(e.nodeId);
        if (e.endpointPort == 0 || std::find(done.begin(), done.end(), node) != done.end()) continue;
        done.push_back(node);
        spdlog::info("group {}: telling node {} ({}) that it was refused here", id.shortHex(), node.shortHex(),
                     endpointText(e.endpointAddr, e.endpointPort));
        peers_.connect(e.endpointAddr, e.endpointPort, node, v, true);
    }
}

void NegotiationTable::peerRecord(const std::shared_ptr<PeerSession>& s, PeerGroup rec) {
    const GroupId id = GroupId::of(rec.fixed.groupId);
    const NodeId from = NodeId::of(rec.fixed.nodeId);
    auto refuseLink = [&](const std::string& why) {
        spdlog::warn("peer link {}: group {}: {}", s->endpointText(), id.shortHex(), why);
        s->send(verdictMessage(kPeerReady, id, Errc::GroupMismatch, kNoPeer, why));
        s->finish();
    };
    if (from != s->remoteNode()) return refuseLink("record of node " + from.shortHex() + " on the link of another node");
    refusals_.erase(from);
    if (const Error* e = refusedGroup(id, true)) {
        spdlog::info("peer link {}: group {} was refused here: {}", s->endpointText(), id.shortHex(), e->detail);
        s->send(verdictMessage(kPeerReady, id, e->code, kNoPeer, e->detail));
        return s->finish();
    }
    Negotiation* n = find(id);
    if (s->accepted() && (!n || n->phase() == Negotiation::Phase::Waiting)) {
        // Our ranks have not all joined yet: hold the link until they have.
        std::erase_if(parked_, [&](const Parked& p) {
            const bool old = expired(p.sinceNs);
            if (old) p.session->finish();
            return old;
        });
        parked_.push_back(Parked{s, std::move(rec), monotonicNs()});
        return;
    }
    if (!n || n->phase() != Negotiation::Phase::Negotiating) return refuseLink("no such group negotiating here");
    n->takeLink(s, rec);
}

// A daemon that restarted brings back a group it re-adopted (to the
// negotiation that kept it open here), or answers ours.
void NegotiationTable::peerRejoin(const std::shared_ptr<PeerSession>& s, PeerRejoin rec) {
    const GroupId id = GroupId::of(rec.group.fixed.groupId);
    const NodeId from = NodeId::of(rec.group.fixed.nodeId);
    const auto refuseLink = [&](const std::string& why) {
        spdlog::warn("peer link {}: group {}: rejoin refused: {}", s->endpointText(), id.shortHex(), why);
        s->send(verdictMessage(kPeerReady, id, Errc::PeerLost, kNoPeer, why));
        s->finish();
    };
    if (from != s->remoteNode()) return refuseLink("record of node " + from.shortHex() + " on the link of another node");
    refusals_.erase(from);
    Negotiation* n = find(id);
    if (!n) return refuseLink("the group is gone here (it broke or closed while your daemon was away)");
    n->takeRejoin(s, rec);
}

void NegotiationTable::peerVerdict(const std::shared_ptr<PeerSession>& s, std::uint16_t opcode, const PeerVerdict& v) {
    const GroupId id = GroupId::of(v.groupId);
    Negotiation* n = find(id);
    NodeLink* node = n ? n->nodeOf(s->remoteNode()) : nullptr;
    if (opcode == kPeerReady && v.errc && s->accepted() &&
        (!n || n->phase() == Negotiation::Phase::Waiting || !node || node->session != s)) {
        // A refusal on a link opened for it alone (tellRefused on that node).
        Errc code = Errc::Unavailable;
        errcFromWire(v.errc, code);
        std::string reason;
        getText(v.reason, reason);
        const std::string why = "node " + s->remoteNode().shortHex() + " (" + s->endpointText() +
                                ") refused the group: " + reason;
        s->finish();
        if (n && n->phase() == Negotiation::Phase::Negotiating) {
            if (node) n->fail(code, why);
            return;
        }
        if (n && (n->phase() != Negotiation::Phase::Waiting || !n->inRoster(s->remoteNode()))) return;
        spdlog::info("group {}: {}", id.shortHex(), why);
        rememberRefusal(id, Error{code, why}, false);
        return;
    }
    if (!n || !node || node->session != s) return;
    n->verdict(*node, opcode, v);
}

void NegotiationTable::peerData(const std::shared_ptr<PeerSession>& s, const PeerData& rec) {
    const GroupId id = GroupId::of(rec.groupId);
    Negotiation* n = find(id);
    if (!n) {
        spdlog::warn("peer link {}: tcp data link for group {}, which is not negotiating here; closed", s->endpointText(),
                     id.shortHex());
        return s->close();
    }
    n->takeDataLink(s);
}

void NegotiationTable::peerLost(const std::shared_ptr<PeerSession>& s, const Error& why) {
    std::erase_if(parked_, [&](const Parked& p) { return p.session == s; });
    const bool auth = why.code == Errc::AuthFailed;
    if (auth && s->accepted()) refusals_[s->remoteNode()] = Refusal{why, monotonicNs()};
    // A daemon that speaks another peer protocol (or has another key) may be
    // an away node's, restarted: the groups waiting for that node say so when they end.
    if (s->accepted() && (auth || why.code == Errc::BadMagic || why.code == Errc::VersionMismatch))
        for (const auto& [id, n] : active_) n->noteRefusedLink(*s, why);
    // A node that must connect to us and failed its handshake ends the
    // negotiations waiting for it, although its link never reached them.
    std::vector<GroupId> hit;
    for (const auto& [id, n] : active_)
        for (const auto& node : n->nodes())
            if (node.session == s || (auth && !node.session && !node.weConnect && node.node == s->remoteNode() &&
                                      n->phase() == Negotiation::Phase::Negotiating))
                hit.push_back(id);
    for (const auto& id : hit)
        if (Negotiation* n = find(id)) n->linkLost(*s, why); // may end others' groups: found again each time
}

} // namespace tpf::daemon
