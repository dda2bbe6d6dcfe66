#include "daemon/groups/groups.hpp"

#include <boost/asio/post.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "daemon/groups/cap.hpp"
#include "daemon/proxy/shm_transport.hpp"
#include "daemon/proxy/tcp_transport.hpp"
#include "daemon/proxy/verbs_transport.hpp"

namespace tpf::daemon {

using namespace client_proto;

namespace {
std::string shortId(const GroupId& id) { return id.shortHex(); }

// The roster, this daemon's daemon.max_bytes, and every other daemon's once its record arrived.
CapAgreement capAgreement(const GroupTable::Group& g, const NodeId& self, std::uint64_t selfMax) {
    std::vector<DaemonMax> daemons{{self, selfMax}};
    if (g.negotiation)
        for (const auto& n : g.negotiation->nodes())
            if (n.daemonMax) daemons.push_back({n.node, n.daemonMax});
    return agreeCap(g.roster, daemons);
}

// The transport that carries local rank `rank`'s doorbells to `peer`
// (daemon/proxy/transport.hpp), chosen once per table: `wire` is the rank's
// wire to it; `direct`: both opened host-direct, so the peer reads the
// rank's row itself. A new wire's transport is registered here.
std::shared_ptr<Transport> transportTo(const ProxyGroup& g, std::uint32_t rank, std::uint32_t peer, std::uint8_t wire,
                                       bool direct) {
    if (direct) return directTransport();
    switch (wire) {
    case kWireShm: return std::make_shared<ShmTransport>(g.layout, rank, g.regions[rank], g.regions[peer]);
    case kWireVerbs: return std::make_shared<VerbsTransport>(g.layout, rank, peer, g.verbs);
    case kWireTcp: return std::make_shared<TcpTransport>(g.layout, rank, peer, g.regions[rank], g.tcp);
    case kWireIpc: return directTransport(); // its kernel stores into the peer's device region
    }
    return directTransport();
}
} // namespace

// What a transition of one group's life does outside it (GroupLifeEffects),
// for GroupTable::transition. A failed negotiation is held until the
// transition returned: the negotiation's refusal comes back at once.
class GroupTable::Effects final : public GroupLifeEffects {
public:
    Effects(GroupTable& table, Group& g, std::shared_ptr<CommandRing> ring, bool rang, NodeWires wires)
        : t_(table), g_(g), ring_(std::move(ring)), rang_(rang), wires_(std::move(wires)) {}

    void refuseMembers(Errc code, const std::string& why, bool tellOtherNodes) override {
        if (tellOtherNodes) t_.negotiations_.tellRefused(g_.id, g_.roster, code, why);
        for (auto& [rank, m] : g_.members) t_.refuse(*m.link, code, why, g_.adoption.has_value());
        g_.members.clear();
    }
    void open() override {
        if (wires_.verbs) g_.verbs = std::move(wires_.verbs);
        if (wires_.tcp) g_.tcp = std::move(wires_.tcp);
        t_.finishOpen(g_);
    }
    void tellOtherNodes(Errc code, std::uint32_t rank, const std::string& why, std::uint64_t leftAfter) override {
        if (g_.negotiation) g_.negotiation->tellBroken(code, rank, why, leftAfter);
    }
    void failCalls(Errc code, std::uint32_t rank, const std::string& why, std::uint64_t carriedThrough,
                   bool replace) override {
        g_.lastError = Error{code, why};
        if (g_.proxyGroup) {
            g_.proxyGroup->carriedThrough.store(carriedThrough, std::memory_order_relaxed);
            g_.proxyGroup->broken.store(true, std::memory_order_release);
        }
        // The reason first: written to the socket before a rank can see the control block's word.
        client_proto::GroupFailed told{};
        told.errc = std::uint16_t(code);
        told.rank = rank;
        told.groupHandle = g_.handle;
        setText(told.reason, why);
        for (auto& [r, m] : g_.members)
            if (m.link && m.region) m.link->sendGroupFailed(told);
        for (auto& [r, m] : g_.members)
            if (m.region) m.region->fail(code, rank, carriedThrough, replace);
    }
    void markGone(std::uint32_t rank) override {
        if (g_.proxyGroup) g_.proxyGroup->gone.fetch_or(1u << rank, std::memory_order_relaxed);
    }
    void countBroken(Errc code) override { t_.lifetime_.groupBroken(code); }
    std::uint64_t retire(std::uint32_t rank, bool orderly) override {
        // Its ring leaves the proxy; once drained, the others learn it is gone.
        const std::uint64_t v = t_.publishProxyTable();
        // "left" is an orderly Close; a rank whose connection just closed exited or was killed mid-group.
        t_.pendingBreaks_.push_back(
            {v, g_.id, rank,
             orderly ? std::string()
                     : "rank " + std::to_string(rank) +
                           " is gone (its connection closed without Close: the process exited or was killed)",
             orderly, orderly ? ring_ : nullptr, rang_});
        return v;
    }
    void failNegotiation(Errc code, const std::string& why) override { negotiationFailure_ = Error{code, why}; }

    /// The negotiation to fail once the transition returned.
    const std::optional<Error>& negotiationFailure() const { return negotiationFailure_; }

private:
    GroupTable& t_;
    Group& g_;
    std::shared_ptr<CommandRing> ring_;
    bool rang_;
    NodeWires wires_;
    std::optional<Error> negotiationFailure_;
};

GroupTable::GroupTable(boost::asio::io_context& io, const DaemonConfig& cfg, const NodeId& nodeId,
                       NegotiationTable& negotiations, const ProxyOptions& proxy,
                       std::vector<std::shared_ptr<VerbsHca>> hcas)
    : io_(io), cfg_(cfg), nodeId_(nodeId), negotiations_(negotiations), proxy_(proxy, *this) {
    proxy_.setHcas(std::move(hcas));
}

GroupLife::Outcome GroupTable::transition(Group& g, const GroupEvent& e, std::shared_ptr<CommandRing> ring, bool rang,
                                          NodeWires wires) {
    Effects fx(*this, g, std::move(ring), rang, std::move(wires));
    const GroupLife::Outcome out = g.life.on(e, fx);
    if (g.life.state() == GroupState::Closed) {
        erase(groups_.find(g.id));
        return out;
    }
    // A refusal comes back through negotiationRefused, which drops the group: last.
    if (const auto& why = fx.negotiationFailure()) g.negotiation->fail(why->code, why->detail);
    return out;
}

void GroupTable::drained(std::uint64_t version) {
    boost::asio::post(io_, [this, version] { onDrained(version); });
}

void GroupTable::badDoorbell(std::uint32_t handle, std::uint32_t rank, Error why) {
    boost::asio::post(io_, [this, handle, rank, why = std::move(why)] { onBadDoorbell(handle, rank, why); });
}

void GroupTable::peerFailed(std::uint32_t handle, std::uint32_t remoteRank, Error why) {
    boost::asio::post(io_, [this, handle, remoteRank, why = std::move(why)] { onPeerFailed(handle, remoteRank, why); });
}

void GroupTable::resent(std::uint32_t handle, std::uint32_t rank, std::uint32_t peer, std::uint64_t first,
                        std::uint64_t last) {
    boost::asio::post(io_, [this, handle, rank, peer, first, last] {
        const Group* g = findByHandle(handle);
        spdlog::info("group {}: rank {}'s epochs {}..{} carried again to rank {} (they had not landed there when its "
                     "node's daemon went away)",
                     g ? shortId(g->id) : "handle " + std::to_string(handle), rank, first, last, peer);
    });
}

void GroupTable::refuse(MemberLink& link, Errc code, const std::string& why, bool adopting) {
    if (adopting) return refuseAdopted(link, code, why);
    Verdict v{};
    v.errc = std::uint16_t(code);
    setText(v.reason, why);
    lifetime_.openRefused(code);
    link.sendVerdict(v, {});
}

void GroupTable::join(MemberLink& link, const GroupOpen& m) {
    const auto& f = m.fixed;
    const GroupId id = GroupId::of(f.groupId);
    // Each refusal of this rank in the journal too, where the refusal alert
    // (tpfabric_open_refusals_total) leads an operator.
    const auto refuseJoin = [&](Errc code, const std::string& why) {
        spdlog::warn("group {}: refused rank {} (pid {}, uid {}): {}: {}", shortId(id), f.rank, link.pid(), link.uid(),
                     errcName(code), why);
        refuse(link, code, why);
    };
    if (findByLink(link)) return refuseJoin(Errc::GroupMismatch, "this connection already joined a group");
    const auto& me = m.roster[f.rank];
    if (!nodeId_.is(me.nodeId))
        return refuseJoin(Errc::GroupMismatch, "rank " + std::to_string(f.rank) +
                                                     "'s roster entry names another node than this daemon");
    auto it = groups_.find(id);
    if (it != groups_.end()) {
        Group& old = it->second;
        if (old.adoption) return refuseJoin(Errc::GroupMismatch, "group " + shortId(id) + " is re-adopted after a daemon restart");
        const bool open = old.life.state() == GroupState::Open;
        if (transition(old, GroupEvent::join()) == GroupLife::Outcome::Refused)
            return refuseJoin(Errc::GroupMismatch, "group " + shortId(id) + " is already " + (open ? "open" : "broken"));
        it = groups_.find(id);
        // A Closing group whose id opens again went: its breaks due with it too.
        if (it == groups_.end()) std::erase_if(pendingBreaks_, [&](const PendingBreak& b) { return b.id == id; });
    }
    if (it == groups_.end()) {
        if (groups_.size() >= cfg_.maxGroups) {
            const std::string why = "daemon serves its maximum of " + std::to_string(cfg_.maxGroups) +
                                    " groups (daemon.max_groups)";
            negotiations_.tellRefused(id, m.roster, Errc::Unavailable, why);
            return refuseJoin(Errc::Unavailable, why);
        }
        Group g;
        g.id = id;
        g.life = GroupLife(shortId(id));
        g.handle = nextHandle_++;
        g.world = f.world;
        g.roster = m.roster;
        g.gpuDoorbells = (f.flags & kOpenGpuDoorbells) != 0;
        for (std::uint32_t r = 0; r < f.world; ++r)
            if (nodeId_.is(m.roster[r].nodeId)) g.localMask |= 1u << r;
        const auto timeout = std::min<std::uint32_t>(f.timeoutMs, cfg_.openTimeoutMs);
        g.openTimer = std::make_unique<boost::asio::steady_timer>(io_, std::chrono::milliseconds(timeout));
        g.openTimer->async_wait([this, id](const boost::system::error_code& ec) {
            if (!ec) openTimedOut(id);
        });
        const std::uint32_t everyRank = (1u << f.world) - 1;
        if ((g.localMask & everyRank) != everyRank) g.negotiation = negotiations_.create(*this, id, m.roster);
        it = groups_.emplace(id, std::move(g)).first;
        spdlog::info("group {}: opening, world {}, local ranks mask {:#x}", shortId(id), f.world, it->second.localMask);
    }
    Group& g = it->second;
    if (f.world != g.world || m.roster.size() != g.roster.size() ||
        std::memcmp(m.roster.data(), g.roster.data(), g.roster.size() * sizeof(RosterEntry)) != 0) {
        const std::string why = "rank " + std::to_string(f.rank) + " disagrees with the group's world or roster";
        refuseJoin(Errc::GroupMismatch, why);
        return void(transition(g, GroupEvent::refuse(Errc::GroupMismatch, why)));
    }
    // A group belongs to the uid that opened it; root may join any.
    if (!g.members.empty() && link.uid() != 0 && link.uid() != g.ownerUid) {
        return refuseJoin(Errc::PermissionDenied,
                          "group " + shortId(id) + " belongs to another user (uid " + std::to_string(g.ownerUid) + ")");
    }
    if (g.members.empty()) g.ownerUid = link.uid();
    if (g.everJoined >> f.rank & 1u) {
        const std::string why = "rank " + std::to_string(f.rank) + " joined twice";
        refuseJoin(Errc::GroupMismatch, why);
        return void(transition(g, GroupEvent::refuse(Errc::GroupMismatch, why)));
    }
    g.everJoined |= 1u << f.rank;
    g.gpuDoorbells |= (f.flags & kOpenGpuDoorbells) != 0;
    g.members[f.rank] = Member{&link, link.pid(), link.uid(), nullptr, nullptr};
    g.members[f.rank].hostDirect = (f.flags & kOpenHostDirect) != 0;
    if (f.flags & kOpenHostDirect) g.directMask |= 1u << f.rank;
    spdlog::info("group {}: rank {} joined (pid {}, uid {})", shortId(id), f.rank, link.pid(), link.uid());
    if ((g.everJoined & g.localMask) == g.localMask) tryOpen(g);
}

void GroupTable::tryOpen(Group& g) {
    g.openTimer->cancel();
    const GroupId id = g.id;
    const bool remote = g.negotiation != nullptr;
    const auto refuseOpen = [&](Errc code, const std::string& why) { transition(g, GroupEvent::refuse(code, why)); };
    if (const auto why = remote ? negotiations_.unavailable() : std::nullopt) return refuseOpen(why->code, why->detail);
    // Across nodes: verbs or tcp, chosen from the roster alike on every node.
    std::uint8_t crossWire = kWireVerbs;
    if (remote) {
        auto w = negotiations_.wireFor(g.roster);
        if (!w) return refuseOpen(w.code(), w.error().detail);
        crossWire = *w;
    }
    // The roster and our daemon.max_bytes: other daemons' maxima are at least
    // their ranks' roster entries (a client clamps its entry to its daemon's
    // node card), and each checks ours against its cap in the negotiation.
    g.agreedCap = capAgreement(g, nodeId_, cfg_.maxBytes).cap;
    // Across nodes on verbs a shard is striped over every HCA pair (pairing
    // checks both nodes have as many); on tcp and within one node there is one stripe.
    auto layout = Layout::of(g.world, slotBytesFor(g.agreedCap), remote && crossWire == kWireVerbs ? negotiations_.hcaCount() : 1);
    if (!layout) return refuseOpen(layout.code(), layout.error().detail);
    g.layout = *layout;
    const std::uint64_t need = std::uint64_t(std::popcount(g.localMask)) * g.layout.totalBytes();
    if (hostRegionBytes() + need > cfg_.maxRegionBytes)
        return refuseOpen(Errc::Unavailable,
                          "regions would exceed daemon.max_region_bytes (" + std::to_string(cfg_.maxRegionBytes) + ")");
    for (std::uint32_t r = 0; r < g.world; ++r) g.wires[r] = (g.localMask >> r & 1u) ? std::uint8_t(kWireShm) : crossWire;
    for (auto& [rank, m] : g.members) {
        const std::string tag = "tpf-" + shortId(id) + "-r" + std::to_string(rank);
        auto region = HostRegion::create(g.layout, tag + "-region");
        auto ring = region ? CommandRing::create(cfg_.ringEntries, g.handle, tag + "-ring", cfg_.heartbeatMs)
                           : Result<std::shared_ptr<CommandRing>>(region.error());
        if (!region || !ring) {
            const Error& e = region ? ring.error() : region.error();
            return refuseOpen(Errc::Unavailable, "creating shared memory: " + e.describe());
        }
        m.region = *region;
        m.ring = *ring;
    }
    if (!remote) return void(transition(g, GroupEvent::ready()));
    transition(g, GroupEvent::negotiate());
    NegotiationPlan plan{g.handle, crossWire, g.layout, g.agreedCap, {}};
    for (auto& [rank, m] : g.members)
        plan.regions.push_back(LocalRegion{rank, m.region->map.data(), m.region->layout.totalBytes(), m.region, m.region});
    g.negotiation->start(std::move(plan)); // a refusal comes back through negotiationRefused, maybe at once
}

void GroupTable::negotiationAway(const GroupId& id, std::uint32_t ranks) {
    auto it = groups_.find(id);
    if (it == groups_.end()) return;
    Group& g = it->second;
    g.awayMask |= ranks;
    if (g.proxyGroup) publishProxyTable();
}

void GroupTable::negotiationBack(const GroupId& id, std::uint32_t ranks, NodeWires wires,
                                 const std::vector<peer_proto::LandedRecord>& landed, std::uint64_t awayNs) {
    auto it = groups_.find(id);
    if (it == groups_.end()) return;
    Group& g = it->second;
    g.awayMask &= ~ranks;
    lifetime_.peerRejoined(awayNs);
    if (wires.verbs) g.verbs = std::move(wires.verbs);
    if (wires.tcp) g.tcp = std::move(wires.tcp);
    if (!g.proxyGroup) return;
    // The proxy sees the new queue pairs in a new ProxyGroup with the old one's state.
    auto next = proxyGroupOf(g);
    const ProxyGroup& old = *g.proxyGroup;
    next->carriedThrough.store(old.carriedThrough.load(std::memory_order_relaxed), std::memory_order_relaxed);
    next->gone.store(old.gone.load(std::memory_order_relaxed), std::memory_order_relaxed);
    next->broken.store(old.broken.load(std::memory_order_acquire), std::memory_order_release);
    g.proxyGroup = std::move(next);
    queueResends(g, landed);
    publishProxyTable();
}

// A Resend the proxy may hold is never changed: a new one takes its place,
// with what it still had to send (sending an epoch twice writes the same bytes).
void GroupTable::queueResends(Group& g, const std::vector<peer_proto::LandedRecord>& landed) {
    std::map<std::uint32_t, std::shared_ptr<Resend>> fresh;
    for (const auto& l : landed) {
        if (!g.members.contains(l.from) || !(g.localMask >> l.from & 1u) || (g.localMask >> l.rank & 1u)) continue;
        auto& r = fresh[l.from];
        if (!r) {
            r = std::make_shared<Resend>();
            if (auto old = g.resends.find(l.from); old != g.resends.end() && !old->second->taken.load(std::memory_order_acquire))
                r->peers = old->second->peers;
        }
        r->peers.push_back(Resend::Peer{l.rank, l.epoch});
    }
    for (auto& [rank, r] : fresh) g.resends[rank] = std::move(r);
}

void GroupTable::negotiationReady(const GroupId& id, NodeWires wires) {
    auto it = groups_.find(id);
    if (it != groups_.end()) transition(it->second, GroupEvent::negotiationReady(), nullptr, false, std::move(wires));
}

// Every other node was told; refuse every local rank, drop the group.
void GroupTable::negotiationRefused(const GroupId& id, Errc code, const std::string& why) {
    auto it = groups_.find(id);
    if (it != groups_.end()) transition(it->second, GroupEvent::negotiationRefused(code, why));
}

void GroupTable::negotiationBroken(const GroupId& id, Errc code, std::uint32_t rank, const std::string& why,
                                   bool seenHere, std::uint64_t leftAfter) {
    auto it = groups_.find(id);
    if (it == groups_.end()) return;
    Group& g = it->second;
    if (leftAfter && !seenHere) transition(g, GroupEvent::remoteLeft(rank, leftAfter));
    // A node whose every rank closed in order closes its link: no fault.
    else if (seenHere) transition(g, GroupEvent::linkFault(code, rank, why, nodeRanks(g, rank), false));
    else transition(g, GroupEvent::remoteFault(code, rank, why));
}

std::shared_ptr<ProxyGroup> GroupTable::proxyGroupOf(const Group& g) {
    auto pg = std::make_shared<ProxyGroup>();
    pg->handle = g.handle;
    pg->world = g.world;
    pg->layout = g.layout;
    pg->agreedCap = g.agreedCap;
    pg->wires = g.wires;
    pg->verbs = g.verbs;
    pg->tcp = g.tcp;
    for (const auto& [rank, m] : g.members) pg->regions[rank] = m.region;
    return pg;
}

void GroupTable::finishOpen(Group& g) {
    g.openTimer->cancel();
    if (g.adoption) return finishAdoption(g);
    g.proxyGroup = proxyGroupOf(g);
    lifetime_.groupOpened();
    publishProxyTable();
    // Every daemon's maximum is known by now (each record was checked against the cap).
    spdlog::info("group {}: agreed cap {} bytes ({})", shortId(g.id), g.agreedCap,
                 capAgreement(g, nodeId_, cfg_.maxBytes).smallest());
    spdlog::info("group {}: open, world {}, slot {} bytes, {} stripe(s), region {} bytes", shortId(g.id), g.world,
                 g.layout.slotBytes, g.layout.stripes, g.layout.totalBytes());
    for (auto& [rank, m] : g.members) {
        Verdict v{};
        v.rank = rank;
        v.world = g.world;
        v.stripes = g.layout.stripes;
        v.agreedCap = g.agreedCap;
        v.slotBytes = g.layout.slotBytes;
        v.regionBytes = g.layout.totalBytes();
        v.groupHandle = g.handle;
        v.ringEntries = cfg_.ringEntries;
        for (std::uint32_t r = 0; r < g.world; ++r) v.wires[r] = r == rank ? std::uint8_t(kWireSelf) : g.wires[r];
        const std::uint32_t direct = g.directPeers(rank, m);
        v.hostPeers = std::uint16_t(direct);
        m.link->sendVerdict(v, {m.region->fd.get(), m.ring->fd.get(), proxy_.eventFd()});
        // Every local rank joined (else no verdict), so each bit has a member.
        for (auto& [q, peer] : g.members)
            if (direct >> q & 1u) m.link->sendPeerHostRegion(PeerHostRegion{q, 0, g.layout.totalBytes()}, peer.region->fd.get());
    }
    std::uint32_t direct = 0;
    for (auto& [rank, m] : g.members) direct |= std::uint32_t(g.directPeers(rank, m) != 0) << rank;
    if (direct) spdlog::info("group {}: ranks {:#x} read each other's shards from their regions (host-direct)", shortId(g.id), direct);
}

void GroupTable::openTimedOut(const GroupId& id) {
    auto it = groups_.find(id);
    if (it == groups_.end()) return;
    Group& g = it->second;
    std::uint32_t missing = 0;
    while (missing < g.world && !((g.localMask & ~g.everJoined) >> missing & 1u)) ++missing;
    transition(g, GroupEvent::openTimedOut("rank " + std::to_string(missing) + " did not join within the open timeout"));
}

GroupTable::Group* GroupTable::findByLink(MemberLink& link, std::uint32_t* rank) {
    for (auto& [id, g] : groups_)
        for (auto& [r, m] : g.members)
            if (m.link == &link) {
                if (rank) *rank = r;
                return &g;
            }
    return nullptr;
}

GroupTable::Group* GroupTable::findByHandle(std::uint32_t handle) {
    for (auto& [id, g] : groups_)
        if (g.handle == handle) return &g;
    return nullptr;
}

void GroupTable::leave(MemberLink& link, bool orderly) {
    std::uint32_t rank = 0;
    Group* g = findByLink(link, &rank);
    if (!g) return;
    const GroupId id = g->id;
    const std::shared_ptr<CommandRing> ring = g->members[rank].ring;
    // It rang for every call unless it reached every peer itself (host-direct on one node, ipc).
    const std::uint32_t others = ((1u << g->world) - 1) & ~(1u << rank);
    const bool rang = ring && (g->gpuDoorbells ? g->ringsProxy(g->members[rank])
                                               : (others & ~g->directPeers(rank, g->members[rank])) != 0);
    if (ring) lifetime_.rankLeft(readStats(ring->view.stats()), g->members[rank].countedBefore.get());
    g->members.erase(rank);
    spdlog::info("group {}: rank {} {}", shortId(id), rank,
                 orderly     ? "left"
                 : stopping_ ? "dropped: the daemon is stopping (the group waits for the next daemon to re-adopt "
                               "it)"
                             : "is gone (connection closed without Close)");
    // Ranks on other nodes may still wait for this node's last shards.
    const bool othersAwait = g->negotiation && g->proxyGroup;
    if (g->adoption && g->life.state() == GroupState::Joining) { // all or none: the others are refused, told why
        if (stopping_) return; // not while stopping: the ranks ask the next daemon
        return void(transition(*g, GroupEvent::refuse(Errc::PeerLost, "rank " + std::to_string(rank) +
                                                                          " left before every rank was re-adopted")));
    }
    // The last local rank died: the group goes here at once, and the other
    // nodes hear why before its link closes (a closed link alone is a daemon
    // that may come back). Not while stopping: the next daemon re-adopts it.
    const GroupState life = g->life.state();
    if (!orderly && !stopping_ && g->members.empty() && othersAwait && (life == GroupState::Open || life == GroupState::Carrying))
        g->negotiation->tellBroken(Errc::PeerLost, rank, "rank " + std::to_string(rank) +
                                                             " is gone (its connection closed without Close: the process "
                                                             "exited or was killed)");
    transition(*g, GroupEvent::leave(rank, orderly, g->members.empty(), othersAwait), ring, rang);
}

void GroupTable::onDrained(std::uint64_t version) {
    std::vector<PendingBreak> due;
    auto split = std::stable_partition(pendingBreaks_.begin(), pendingBreaks_.end(),
                                       [&](const PendingBreak& b) { return b.version > version; });
    due.assign(split, pendingBreaks_.end());
    pendingBreaks_.erase(split, pendingBreaks_.end());
    for (auto& b : due) {
        auto it = groups_.find(b.id);
        if (it == groups_.end()) continue;
        if (b.orderly) transition(it->second, GroupEvent::left(b.rank, lastEpochOf(it->second, b)));
        else transition(it->second, GroupEvent::fault(Errc::PeerLost, b.rank, b.why));
    }
    // A Closing group whose last shards landed goes (erased by transition: `next` stays valid).
    for (auto it = groups_.begin(); it != groups_.end();) {
        const auto next = std::next(it);
        transition(it->second, GroupEvent::drained(version));
        it = next;
    }
}

Status GroupTable::shareRegion(MemberLink& link, const ShareRegion& m, int fd) {
    std::uint32_t rank = 0;
    Group* g = findByLink(link, &rank);
    if (!g || transition(*g, GroupEvent::shareRegion()) == GroupLife::Outcome::Refused)
        return {Errc::PermissionDenied, "ShareRegion from a rank in no open group"};
    spdlog::info("group {}: rank {} shares a device region of {} bytes", shortId(g->id), rank, m.bytes);
    const PeerRegion out{rank, 0, m.bytes};
    for (auto& [r, member] : g->members)
        if (r != rank) member.link->sendPeerRegion(out, fd);
    return okStatus();
}

void GroupTable::abort(MemberLink& link) {
    std::uint32_t rank = 0;
    Group* g = findByLink(link, &rank);
    // missingPeer names the aborter: the others' Aborted says who (as status does).
    if (g) transition(*g, GroupEvent::abort(rank));
}

Status GroupTable::deviceAttach(MemberLink& link, const DeviceAttach& m) {
    std::uint32_t rank = 0;
    Group* g = findByLink(link, &rank);
    if (!g || transition(*g, GroupEvent::deviceAttach()) == GroupLife::Outcome::Refused)
        return {Errc::PermissionDenied, "DeviceAttach from a rank in no open group"};
    if (!g->gpuDoorbells)
        return {Errc::PermissionDenied, "DeviceAttach for group " + shortId(g->id) + ", which was opened for host buffers"};
    if (m.group != g->handle || m.rank != rank || m.world != g->world)
        return {Errc::GroupMismatch, "DeviceAttach for group handle " + std::to_string(m.group) + ", rank " +
                                         std::to_string(m.rank) + " of " + std::to_string(m.world) + "; the sender is rank " +
                                         std::to_string(rank) + " of " + std::to_string(g->world) + " in group handle " +
                                         std::to_string(g->handle)};
    Member& me = g->members[rank];
    if (me.attach) return {Errc::BadMessage, "second DeviceAttach from rank " + std::to_string(rank)};
    std::string wires;
    for (std::uint32_t q = 0; q < g->world; ++q) {
        if (q == rank) continue;
        const bool local = g->localMask >> q & 1u;
        const std::uint8_t r = m.wires[q];
        if (local ? crossesNodes(r) : r != g->wires[q])
            return {Errc::BadMessage, "DeviceAttach: route " + std::string(wireName(r)) + " to rank " + std::to_string(q) +
                                          (local ? ", which is on this node" : ", which is on another node")};
        wires += (wires.empty() ? "" : " ") + std::to_string(q) + ":" + (r == kWireIpc ? "ipc" : "proxy");
    }
    if (m.deviceBytes && m.deviceBytes < g->layout.totalBytes())
        return {Errc::BadMessage, "DeviceAttach: device region of " + std::to_string(m.deviceBytes) +
                                      " bytes, smaller than the group's layout (" + std::to_string(g->layout.totalBytes()) + ")"};
    me.attach = m;
    spdlog::info("group {}: rank {} attached its GPU: routes {}, device region {} bytes; {}", shortId(g->id), rank, wires,
                 m.deviceBytes, ringsProxy(m) ? "its kernels ring the proxy" : "ipc only, the proxy does not poll its ring");
    publishProxyTable();
    return okStatus();
}

void GroupTable::onBadDoorbell(std::uint32_t handle, std::uint32_t rank, const Error& why) {
    Group* g = findByHandle(handle);
    if (!g) return;
    spdlog::warn("group {}: rank {}: {}", shortId(g->id), rank, why.describe());
    transition(*g, GroupEvent::fault(Errc::PeerLost, rank, "rank " + std::to_string(rank) + " sent a bad doorbell: " + why.describe()));
}

// Closing: its peer link closes soon anyway. A queue pair to a rank that
// closed in order goes away with it.
void GroupTable::onPeerFailed(std::uint32_t handle, std::uint32_t remoteRank, const Error& why) {
    Group* g = findByHandle(handle);
    if (!g) return;
    // Its node's daemon went away: the queue pair's failure is expected, and
    // the group waits for the daemon; so does a tcp data link's failure.
    if (g->awayMask >> remoteRank & 1u)
        return spdlog::debug("group {}: {} (its node's daemon is away)", shortId(g->id), why.describe());
    if (g->negotiation && g->negotiation->linkFailed(remoteRank, why.describe())) return;
    transition(*g, GroupEvent::linkFault(why.code, remoteRank, why.detail, 1u << remoteRank, true));
}

std::uint64_t GroupTable::lastEpochOf(const Group& g, const PendingBreak& b) const {
    // Its ring holds its last doorbell when it rang for every call; a
    // host-direct rank's flags of its own shards show it too (in its own
    // region, or in its local peers' regions from a client that still pushes
    // its shards, client protocol 4). An ipc-only GPU rank leaves no record here.
    std::uint64_t last = b.rang && b.ring ? b.ring->lastEpoch : 0;
    if (g.gpuDoorbells && !b.rang) return kCarriedUnknown;
    if (!g.proxyGroup) return last;
    for (std::uint32_t q = 0; q < g.world; ++q) {
        const auto& region = g.proxyGroup->regions[q];
        if (!region) continue;
        for (std::uint32_t p = 0; p < 2; ++p)
            for (std::uint32_t k = 0; k < g.layout.stripes; ++k)
                last = std::max(last, std::atomic_ref(*region->flag(p, b.rank, k)).load(std::memory_order_acquire));
    }
    return last;
}

std::uint32_t GroupTable::nodeRanks(const Group& g, std::uint32_t rank) const {
    std::uint32_t mask = 0;
    for (std::uint32_t r = 0; r < g.world && rank < g.world; ++r)
        if (std::memcmp(g.roster[r].nodeId, g.roster[rank].nodeId, sizeof g.roster[r].nodeId) == 0) mask |= 1u << r;
    return mask;
}

void GroupTable::openReport(MemberLink& link, const OpenReport& m) {
    Errc code = Errc::Unavailable;
    errcFromWire(m.errc, code); // validated
    spdlog::info("pid {}: open did not take the fabric path ({}): {}", link.pid(),
                 m.outcome == kOutcomeNccl ? "NCCL takes the group" : "Unavailable", errcName(code));
    lifetime_.fallbackReported(code, m.outcome);
}

std::uint64_t GroupTable::publishProxyTable() {
    std::vector<ProxyRank> table;
    for (auto& [id, g] : groups_) {
        std::erase_if(g.resends, [](const auto& kv) { return kv.second->taken.load(std::memory_order_relaxed); });
        if (!g.proxyGroup) continue;
        for (auto& [rank, m] : g.members) {
            if (!m.ring) continue;
            ProxyRank pr{g.proxyGroup, rank, m.ring};
            pr.gpuDoorbells = g.ringsProxy(m);
            if (auto r = g.resends.find(rank); r != g.resends.end()) pr.resend = r->second;
            const std::uint32_t direct = g.directPeers(rank, m);
            for (std::uint32_t i = 0; i + 1 < g.world; ++i) {
                const std::uint32_t q = peerAt(rank, i, g.world);
                // A Device group member's kernels reach some same-node peers by ipc (its DeviceAttach).
                const bool ipc = m.attach && m.attach->wires[q] == kWireIpc;
                const std::uint8_t wire = ipc ? std::uint8_t(kWireIpc) : g.proxyGroup->wires[q];
                pr.addPeer(q, g.awayMask >> q & 1u ? awayTransport()
                                                   : transportTo(*g.proxyGroup, rank, q, wire, direct >> q & 1u));
            }
            table.push_back(std::move(pr));
        }
    }
    proxy_.publish(std::move(table), ++tableVersion_);
    return tableVersion_;
}

void GroupTable::erase(std::map<GroupId, Group>::iterator it) {
    if (it->second.negotiation) it->second.negotiation->close();
    negotiations_.dropParked(it->first);
    const bool published = it->second.proxyGroup != nullptr;
    groups_.erase(it);
    if (published) publishProxyTable();
}

std::size_t GroupTable::regionCount() const {
    std::size_t n = 0;
    for (const auto& [id, g] : groups_)
        for (const auto& [r, m] : g.members) n += m.region ? 1 : 0;
    return n;
}

std::uint64_t GroupTable::deviceRegionBytes() const {
    std::uint64_t n = 0;
    for (const auto& [id, g] : groups_)
        for (const auto& [r, m] : g.members) n += m.attach ? m.attach->deviceBytes : 0;
    return n;
}

std::uint64_t GroupTable::hostRegionBytes() const {
    std::uint64_t n = 0;
    for (const auto& [id, g] : groups_)
        for (const auto& [r, m] : g.members) n += m.region ? m.region->layout.totalBytes() : 0;
    return n;
}

} // namespace tpf::daemon
