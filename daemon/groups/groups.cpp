#include "daemon/groups/groups.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "daemon/groups/cap.hpp"

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
} // namespace

GroupTable::GroupTable(boost::asio::io_context& io, const DaemonConfig& cfg, const NodeId& nodeId, Proxy& proxy,
                       NegotiationTable& negotiations)
    : io_(io), cfg_(cfg), nodeId_(nodeId), proxy_(proxy), negotiations_(negotiations) {}

void GroupTable::refuse(MemberLink& link, Errc code, const std::string& why) {
    Verdict v{};
    v.errc = std::uint16_t(code);
    setText(v.reason, why);
    lifetime_.openRefused(code);
    link.sendVerdict(v, {});
}

void GroupTable::refuseAll(Group& g, Errc code, const std::string& why) {
    spdlog::warn("group {}: unavailable: {}: {}", shortId(g.id), errcName(code), why);
    if (g.state == State::Pending) negotiations_.tellRefused(g.id, g.roster, code, why);
    for (auto& [rank, m] : g.members) refuse(*m.link, code, why);
    g.members.clear();
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
    if (it != groups_.end() && it->second.closingAt) {
        // Its id opens again while the old group waits for its last shards: drop that one now.
        spdlog::info("group {}: closed (opened again)", shortId(id));
        std::erase_if(pendingBreaks_, [&](const PendingBreak& b) { return b.id == id; });
        erase(it);
        it = groups_.end();
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
    if (g.state != State::Pending)
        return refuseJoin(Errc::GroupMismatch, "group " + shortId(id) + " is already " +
                                                     (g.state == State::Open ? "open" : "broken"));
    if (f.world != g.world || m.roster.size() != g.roster.size() ||
        std::memcmp(m.roster.data(), g.roster.data(), g.roster.size() * sizeof(RosterEntry)) != 0) {
        const std::string why = "rank " + std::to_string(f.rank) + " disagrees with the group's world or roster";
        refuseJoin(Errc::GroupMismatch, why);
        return refuseAll(g, Errc::GroupMismatch, why), eraseIfEmpty(id);
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
        return refuseAll(g, Errc::GroupMismatch, why), eraseIfEmpty(id);
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
    if (const auto why = remote ? negotiations_.unavailable() : std::nullopt)
        return refuseAll(g, why->code, why->detail), eraseIfEmpty(id);
    // The roster and our daemon.max_bytes: other daemons' maxima are at least
    // their ranks' roster entries (a client clamps its entry to its daemon's
    // node card), and each checks ours against its cap in the negotiation.
    g.agreedCap = capAgreement(g, nodeId_, cfg_.maxBytes).cap;
    // Across nodes a shard is striped over every HCA pair (pairing checks both
    // nodes have as many); within one node there is one stripe.
    auto layout = Layout::of(g.world, slotBytesFor(g.agreedCap), remote ? negotiations_.hcaCount() : 1);
    if (!layout) return refuseAll(g, layout.code(), layout.error().detail), eraseIfEmpty(id);
    g.layout = *layout;
    const std::uint64_t need = std::uint64_t(std::popcount(g.localMask)) * g.layout.totalBytes();
    if (hostRegionBytes() + need > cfg_.maxRegionBytes)
        return refuseAll(g, Errc::Unavailable,
                         "regions would exceed daemon.max_region_bytes (" + std::to_string(cfg_.maxRegionBytes) + ")"),
               eraseIfEmpty(id);
    for (std::uint32_t r = 0; r < g.world; ++r) g.wires[r] = (g.localMask >> r & 1u) ? kWireShm : kWireVerbs;
    for (auto& [rank, m] : g.members) {
        const std::string tag = "tpf-" + shortId(id) + "-r" + std::to_string(rank);
        auto region = HostRegion::create(g.layout, tag + "-region");
        auto ring = region ? CommandRing::create(cfg_.ringEntries, g.handle, tag + "-ring", cfg_.heartbeatMs)
                           : Result<std::shared_ptr<CommandRing>>(region.error());
        if (!region || !ring) {
            const Error& e = region ? ring.error() : region.error();
            return refuseAll(g, Errc::Unavailable, "creating shared memory: " + e.describe()), eraseIfEmpty(id);
        }
        m.region = *region;
        m.ring = *ring;
    }
    if (!remote) return finishOpen(g);
    g.state = State::Negotiating;
    NegotiationPlan plan{g.handle, g.layout, g.agreedCap, {}};
    for (auto& [rank, m] : g.members)
        plan.regions.push_back(LocalRegion{rank, m.region->map.data(), m.region->layout.totalBytes(), m.region});
    g.negotiation->start(std::move(plan)); // a refusal comes back through negotiationRefused, maybe at once
}

void GroupTable::negotiationReady(const GroupId& id, std::shared_ptr<VerbsGroup> wire) {
    auto it = groups_.find(id);
    if (it == groups_.end() || it->second.state != State::Negotiating) return;
    it->second.verbs = std::move(wire);
    finishOpen(it->second);
}

// Every other node was told; refuse every local rank, drop the group.
void GroupTable::negotiationRefused(const GroupId& id, Errc code, const std::string& why) {
    auto it = groups_.find(id);
    if (it == groups_.end()) return;
    it->second.state = State::Broken;
    refuseAll(it->second, code, why);
    eraseIfEmpty(id);
}

void GroupTable::negotiationBroken(const GroupId& id, Errc code, std::uint32_t rank, const std::string& why,
                                   bool seenHere, std::uint64_t leftAfter) {
    auto it = groups_.find(id);
    if (it == groups_.end()) return;
    Group& g = it->second;
    if (g.closingAt) return; // every local rank closed: nobody here to tell
    if (leftAfter && !seenHere) {
        if (g.state == State::Open || g.state == State::Broken) rankLeft(g, rank, leftAfter, false);
        return;
    }
    const bool carrying = g.state == State::Broken && g.carriedThrough;
    if (seenHere) {
        // A node whose every rank closed in order closes its link: no fault.
        if (carrying && (nodeRanks(g, rank) & ~g.leftMask) == 0) return;
        if (g.state == State::Open || carrying) breakGroup(g, code, rank, why, false);
    } else if (g.state == State::Open || carrying || code == Errc::Aborted) {
        breakGroup(g, code, rank, why, false, Cause::Remote);
    }
}

// Every rank's regions exist and, across nodes, every QP is up: hand the
// group to the proxy and the verdict to each local rank.
void GroupTable::finishOpen(Group& g) {
    g.openTimer->cancel();
    auto pg = std::make_shared<ProxyGroup>();
    pg->handle = g.handle;
    pg->world = g.world;
    pg->layout = g.layout;
    pg->agreedCap = g.agreedCap;
    pg->wires = g.wires;
    pg->verbs = g.verbs;
    for (auto& [rank, m] : g.members) pg->regions[rank] = m.region;
    g.proxyGroup = pg;
    g.state = State::Open;
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
        for (std::uint32_t r = 0; r < g.world; ++r) v.wires[r] = r == rank ? kWireSelf : g.wires[r];
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
    if (g.state != State::Pending) return; // a negotiation times out by itself
    std::uint32_t missing = 0;
    while (missing < g.world && !((g.localMask & ~g.everJoined) >> missing & 1u)) ++missing;
    refuseAll(g, Errc::Timeout, "rank " + std::to_string(missing) + " did not join within the open timeout");
    erase(it);
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
    if (ring) lifetime_.rankLeft(readStats(ring->view.stats()));
    g->members.erase(rank);
    spdlog::info("group {}: rank {} {}", shortId(id), rank,
                 orderly     ? "left"
                 : stopping_ ? "dropped: the daemon is stopping (the rank sees DaemonLost)"
                             : "is gone (connection closed without Close)");
    if (g->state == State::Pending || g->state == State::Negotiating) {
        // The group can no longer complete: tell the ranks already waiting.
        if (g->state == State::Negotiating)
            return g->negotiation->fail(Errc::PeerLost, "rank " + std::to_string(rank) + " left before the group opened");
        refuseAll(*g, Errc::PeerLost, "rank " + std::to_string(rank) + " left before the group opened");
        return eraseIfEmpty(id);
    }
    // Its ring leaves the proxy; once drained, the others learn it is gone.
    // Counted now: the group may be gone by then (its last member died).
    if (!orderly && (g->state == State::Open || (g->state == State::Broken && g->carriedThrough))) countBroken(*g, Errc::PeerLost);
    const std::uint64_t v = publishProxyTable();
    // "left" is an orderly Close; a rank whose connection just closed exited or was killed mid-group.
    pendingBreaks_.push_back({v, id, Errc::PeerLost, rank,
                              "rank " + std::to_string(rank) +
                                  (orderly ? " left the group" : " is gone (its connection closed without Close: the "
                                                                 "process exited or was killed)"),
                              orderly ? Cause::Closed : Cause::Fault, orderly ? ring : nullptr, rang});
    if (orderly && g->members.empty() && g->negotiation && g->proxyGroup) {
        // Ranks on other nodes may still wait for this node's last shards:
        // close the peer link (erase) only once the proxy carried them and
        // their RDMA WRITEs completed (drained(v)).
        g->closingAt = v;
        spdlog::info("group {}: closing once its last shards landed on the other nodes", shortId(id));
        return;
    }
    eraseIfEmpty(id);
}

void GroupTable::drained(std::uint64_t version) {
    std::vector<PendingBreak> due;
    auto split = std::stable_partition(pendingBreaks_.begin(), pendingBreaks_.end(),
                                       [&](const PendingBreak& b) { return b.version > version; });
    due.assign(split, pendingBreaks_.end());
    pendingBreaks_.erase(split, pendingBreaks_.end());
    for (auto& b : due) {
        auto it = groups_.find(b.id);
        if (it == groups_.end()) continue;
        if (b.cause == Cause::Closed) rankLeft(it->second, b.rank, lastEpochOf(it->second, b), true);
        else breakGroup(it->second, b.code, b.rank, b.why, true, b.cause);
    }
    for (auto it = groups_.begin(); it != groups_.end();) {
        const auto next = std::next(it);
        if (it->second.closingAt && *it->second.closingAt <= version) {
            spdlog::info("group {}: closed", shortId(it->first));
            erase(it);
        }
        it = next;
    }
}

Status GroupTable::shareRegion(MemberLink& link, const ShareRegion& m, int fd) {
    std::uint32_t rank = 0;
    Group* g = findByLink(link, &rank);
    if (!g || g->state != State::Open) return {Errc::PermissionDenied, "ShareRegion from a rank in no open group"};
    spdlog::info("group {}: rank {} shares a device region of {} bytes", shortId(g->id), rank, m.bytes);
    const PeerRegion out{rank, 0, m.bytes};
    for (auto& [r, member] : g->members)
        if (r != rank) member.link->sendPeerRegion(out, fd);
    return okStatus();
}

void GroupTable::abort(MemberLink& link) {
    std::uint32_t rank = 0;
    Group* g = findByLink(link, &rank);
    if (!g) return;
    // missingPeer names the aborter: the others' Aborted says who (as status does).
    breakGroup(*g, Errc::Aborted, rank, "rank " + std::to_string(rank) + " aborted the group");
}

Status GroupTable::deviceAttach(MemberLink& link, const DeviceAttach& m) {
    std::uint32_t rank = 0;
    Group* g = findByLink(link, &rank);
    if (!g || (g->state != State::Open && g->state != State::Broken))
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
        if (local ? r == kWireVerbs : r != kWireVerbs)
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

void GroupTable::badDoorbell(std::uint32_t handle, std::uint32_t rank, const Error& why) {
    Group* g = findByHandle(handle);
    if (!g) return;
    spdlog::warn("group {}: rank {}: {}", shortId(g->id), rank, why.describe());
    breakGroup(*g, Errc::PeerLost, rank, "rank " + std::to_string(rank) + " sent a bad doorbell: " + why.describe());
}

void GroupTable::peerFailed(std::uint32_t handle, std::uint32_t remoteRank, const Error& why) {
    Group* g = findByHandle(handle);
    if (!g || g->closingAt) return; // closing: its peer link closes soon anyway
    if (g->state != State::Open && !(g->state == State::Broken && g->carriedThrough)) return;
    if (g->leftMask >> remoteRank & 1u) return; // it closed in order: its queue pairs go away with it
    breakGroup(*g, why.code, remoteRank, why.detail);
}

void GroupTable::breakGroup(Group& g, Errc code, std::uint32_t rank, const std::string& why, bool tellPeers,
                            Cause cause) {
    // Broken by orderly leaves only, it still carries shards: a fault now ends that too.
    const bool carrying = g.state == State::Broken && g.carriedThrough;
    const bool healthy = g.state != State::Broken || carrying;
    if (!healthy && code != Errc::Aborted) return;
    if (healthy) spdlog::warn("group {}: broken: {}: {}", shortId(g.id), errcName(code), why);
    if ((g.state == State::Open || carrying) && cause == Cause::Fault) countBroken(g, code);
    if (tellPeers && healthy && g.negotiation) g.negotiation->tellBroken(code, rank, why);
    g.state = State::Broken;
    g.carriedThrough.reset();
    g.lastError = Error{code, why};
    if (g.proxyGroup) {
        g.proxyGroup->carriedThrough.store(0, std::memory_order_relaxed);
        g.proxyGroup->broken.store(true, std::memory_order_release);
    }
    for (auto& [r, m] : g.members)
        if (m.region) m.region->fail(code, rank, 0, carrying);
}

void GroupTable::rankLeft(Group& g, std::uint32_t rank, std::uint64_t last, bool tellPeers) {
    if (g.leftMask >> rank & 1u) return;
    g.leftMask |= 1u << rank;
    if (g.proxyGroup) g.proxyGroup->gone.fetch_or(1u << rank, std::memory_order_relaxed);
    const std::string why = "rank " + std::to_string(rank) + " left the group" +
                            (last == kCarriedUnknown ? std::string() : " after epoch " + std::to_string(last));
    if (tellPeers && g.negotiation && (g.state == State::Open || g.carriedThrough))
        g.negotiation->tellBroken(Errc::PeerLost, rank, why, last);
    if (g.state == State::Broken && !g.carriedThrough) return; // a fault came first: nothing is carried
    const bool first = g.state == State::Open;
    // An orderly Close is no fault: calls up to its last epoch complete, the next one fails (PeerLost).
    if (first)
        spdlog::info("group {}: {}; calls up to that epoch still complete, later ones end PeerLost", shortId(g.id), why);
    else
        spdlog::info("group {}: {} too", shortId(g.id), why);
    if (!first && last >= *g.carriedThrough) return; // an earlier leaver bounds the carried epochs
    g.state = State::Broken;
    g.carriedThrough = last;
    g.lastError = Error{Errc::PeerLost, why};
    if (g.proxyGroup) {
        g.proxyGroup->carriedThrough.store(last, std::memory_order_relaxed);
        g.proxyGroup->broken.store(true, std::memory_order_release);
    }
    for (auto& [r, m] : g.members)
        if (m.region) m.region->fail(Errc::PeerLost, rank, last, !first);
}

std::uint64_t GroupTable::lastEpochOf(const Group& g, const PendingBreak& b) const {
    // Its ring holds its last doorbell when it rang for every call; a
    // host-direct rank's flags of its own shards show it too (in its own
    // region since the pull model; its local peers' regions under the push
    // model of client protocol 4 before 2e0aa75). An ipc-only
    // GPU rank leaves no record here.
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

void GroupTable::countBroken(Group& g, Errc code) {
    if (g.brokenCounted) return;
    g.brokenCounted = true;
    lifetime_.groupBroken(code);
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
        if (!g.proxyGroup) continue;
        for (auto& [rank, m] : g.members) {
            if (!m.ring) continue;
            ProxyRank pr{g.proxyGroup, rank, m.ring};
            pr.gpuDoorbells = g.ringsProxy(m);
            for (std::uint32_t q = 0; m.attach && q < g.world; ++q) pr.ipcPeers |= std::uint32_t(m.attach->wires[q] == kWireIpc) << q;
            pr.directPeers = g.directPeers(rank, m);
            table.push_back(std::move(pr));
        }
    }
    proxy_.publish(std::move(table), ++tableVersion_);
    return tableVersion_;
}

void GroupTable::eraseIfEmpty(const GroupId& id) {
    auto it = groups_.find(id);
    if (it == groups_.end() || !it->second.members.empty()) return;
    spdlog::info("group {}: closed", shortId(id));
    erase(it);
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
