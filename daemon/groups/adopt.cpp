// Re-adoption: a group whose daemon restarted goes on with this one, a Host
// or a Device group, on one node or across nodes. Each rank kept its region
// and ring (both sealed memfds, mapped in the rank; a Device group's rank
// also its device region, ipc mappings and captured graphs: its rows to and
// from other nodes go through the region, as at open) and hands them back
// (Adopt); once
// every local rank did, the proxy's per-ring state is rebuilt from what
// those hold (the ring's shared indices and doorbells, the peers' flags) and
// the proxy carries the group on. A group with ranks on other nodes first brings its links back: the
// other nodes kept it while this daemon was away (rejoin). All or none: a
// group some rank of which cannot be re-adopted, or which one rank does not
// ask for in time, is refused on every rank.
#include <sys/random.h>

#include <spdlog/spdlog.h>

#include <bit>
#include <chrono>
#include <cstring>
#include <ctime>

#include "daemon/groups/groups.hpp"

namespace tpf::daemon {

using namespace client_proto;

namespace {

std::uint64_t unixNs() {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return std::uint64_t(ts.tv_sec) * 1000000000ull + std::uint64_t(ts.tv_nsec);
}

std::string ranksText(std::uint32_t mask) {
    std::string s;
    for (std::uint32_t r = 0; r < kMaxWorld; ++r)
        if (mask >> r & 1u) s += (s.empty() ? "" : ",") + std::to_string(r);
    return s;
}

template <class T>
T loadShared(const T& v) {
    return std::atomic_ref(const_cast<T&>(v)).load(std::memory_order_acquire);
}

// The parameters of an Adopt that every rank of the group must send alike.
bool sameGroup(const AdoptFixed& a, const GroupTable::Group& g, const std::vector<RosterEntry>& roster) {
    return a.world == g.world && ((a.flags & kOpenGpuDoorbells) != 0) == g.gpuDoorbells && a.groupHandle == g.handle &&
           a.agreedCap == g.agreedCap && a.slotBytes == g.layout.slotBytes && a.stripes == g.layout.stripes &&
           a.regionBytes == g.layout.totalBytes() && roster.size() == g.roster.size() &&
           std::memcmp(roster.data(), g.roster.data(), roster.size() * sizeof(RosterEntry)) == 0;
}

} // namespace

std::uint32_t GroupTable::firstHandle() {
    // Random, so that a group opened on a restarted daemon before an older
    // group asks to be re-adopted does not take that group's handle.
    std::uint32_t r = 0;
    if (::getrandom(&r, sizeof r, GRND_NONBLOCK) != sizeof r) r = std::uint32_t(unixNs() >> 10);
    return (r & 0x7fffffffu) | 1u;
}

void GroupTable::refuseAdopt(MemberLink& link, const GroupId& id, std::uint32_t rank, Errc code, const std::string& why) {
    spdlog::warn("group {}: refused to re-adopt rank {} (pid {}, uid {}): {}: {}", id.shortHex(), rank, link.pid(),
                 link.uid(), errcName(code), why);
    Adopted a{};
    a.errc = std::uint16_t(code);
    a.rank = rank;
    setText(a.reason, why);
    lifetime_.adoptionRefused(code);
    link.sendAdopted(a, -1);
}

void GroupTable::refuseAdopted(MemberLink& link, Errc code, const std::string& why) {
    std::uint32_t rank = 0;
    const Group* g = findByLink(link, &rank);
    Adopted a{};
    a.errc = std::uint16_t(code);
    a.rank = rank;
    a.groupHandle = g ? g->handle : 0;
    setText(a.reason, why);
    lifetime_.adoptionRefused(code);
    link.sendAdopted(a, -1);
}

void GroupTable::adopt(MemberLink& link, const Adopt& m, UniqueFd regionFd, UniqueFd ringFd) {
    const AdoptFixed& f = m.fixed;
    const GroupId id = GroupId::of(f.groupId);
    const auto refuseRank = [&](Errc code, const std::string& why) { refuseAdopt(link, id, f.rank, code, why); };
    if (findByLink(link)) return refuseRank(Errc::GroupMismatch, "this connection already joined a group");
    auto it = groups_.find(id);
    if (it != groups_.end() && !it->second.adoption)
        return refuseRank(Errc::GroupMismatch, "group " + id.shortHex() + " is open on this daemon already");
    if (it != groups_.end() && it->second.life.state() != GroupState::Joining)
        return refuseRank(Errc::GroupMismatch, "group " + id.shortHex() + " was re-adopted already");
    if (it != groups_.end() && !sameGroup(f, it->second, m.roster))
        return refuseRank(Errc::GroupMismatch, "rank " + std::to_string(f.rank) +
                                                   " disagrees with the group's other ranks on its world, handle, "
                                                   "cap, layout or roster");
    // What holds for every rank alike is refused at once, on every rank
    // alike, before the group collects any.
    if (it == groups_.end()) {
        auto layout = Layout::of(f.world, f.slotBytes, f.stripes);
        std::uint32_t localMask = 0;
        for (std::uint32_t r = 0; r < f.world; ++r)
            if (nodeId_.is(m.roster[r].nodeId)) localMask |= 1u << r;
        const bool remote = localMask != (1u << f.world) - 1;
        const bool device = f.flags & kOpenGpuDoorbells;
        // Across nodes: the same wire and, on verbs, as many HCAs as when it opened.
        std::uint8_t crossWire = kWireShm;
        if (remote) {
            if (const auto why = negotiations_.unavailable()) return refuseRank(why->code, why->detail);
            auto w = negotiations_.wireFor(m.roster);
            if (!w) return refuseRank(w.code(), w.error().detail);
            crossWire = *w;
            if (crossWire == kWireTcp && f.stripes != 1)
                return refuseRank(Errc::BadMessage, "a group on the tcp wire with " + std::to_string(f.stripes) + " stripes");
            if (crossWire == kWireVerbs && f.stripes != negotiations_.hcaCount())
                return refuseRank(Errc::GroupMismatch, "this node's HCAs changed: the group stripes over " +
                                                           std::to_string(f.stripes) + " and the daemon now has " +
                                                           std::to_string(negotiations_.hcaCount()) +
                                                           " (verbs.hcas, tpfabricctl status); reopen the group");
        } else if (f.stripes != 1) {
            return refuseRank(Errc::BadMessage, "a group on one node with " + std::to_string(f.stripes) + " stripes");
        }
        if (f.agreedCap > cfg_.maxBytes)
            return refuseRank(Errc::CapMismatch, "daemon.max_bytes (" + std::to_string(cfg_.maxBytes) +
                                                     ") is now below the group's agreed cap (" + std::to_string(f.agreedCap) +
                                                     "): raise it to at least that, or reopen the group");
        if (!layout || layout->totalBytes() != f.regionBytes)
            return refuseRank(Errc::BadMessage, "the region's size (" + std::to_string(f.regionBytes) +
                                                    " bytes) does not follow from its layout");
        if (findByHandle(f.groupHandle))
            return refuseRank(Errc::Busy, "group handle " + std::to_string(f.groupHandle) +
                                              " is taken by a group opened on this daemon since it started; reopen the group");
        if (groups_.size() >= cfg_.maxGroups)
            return refuseRank(Errc::Unavailable, "daemon serves its maximum of " + std::to_string(cfg_.maxGroups) +
                                                     " groups (daemon.max_groups)");
        if (hostRegionBytes() + std::uint64_t(f.world) * f.regionBytes > cfg_.maxRegionBytes)
            return refuseRank(Errc::Unavailable,
                              "regions would exceed daemon.max_region_bytes (" + std::to_string(cfg_.maxRegionBytes) + ")");
        Group g;
        g.id = id;
        g.life = GroupLife(id.shortHex());
        g.handle = f.groupHandle;
        g.world = f.world;
        g.roster = m.roster;
        g.localMask = localMask;
        g.agreedCap = f.agreedCap;
        g.layout = *layout;
        for (std::uint32_t r = 0; r < f.world; ++r) g.wires[r] = localMask >> r & 1u ? std::uint8_t(kWireShm) : crossWire;
        g.gpuDoorbells = device;
        g.adoption = Group::Adoption{f.lostUnixNs, 0, 0};
        const auto timeout = std::min<std::uint32_t>(f.timeoutMs, cfg_.openTimeoutMs);
        g.openTimer = std::make_unique<boost::asio::steady_timer>(io_, std::chrono::milliseconds(timeout));
        g.openTimer->async_wait([this, id](const boost::system::error_code& ec) {
            if (!ec) adoptTimedOut(id);
        });
        it = groups_.emplace(id, std::move(g)).first;
        nextHandle_ = std::max(nextHandle_, f.groupHandle + 1);
        spdlog::info("group {}: re-adopting after a daemon restart, world {}, handle {}, agreed cap {} bytes", id.shortHex(),
                     f.world, f.groupHandle, f.agreedCap);
    }
    Group& g = it->second;
    // A group belongs to the uid that opened it; root may join any.
    if (!g.members.empty() && link.uid() != 0 && link.uid() != g.ownerUid)
        return refuseRank(Errc::PermissionDenied,
                          "group " + id.shortHex() + " belongs to another user (uid " + std::to_string(g.ownerUid) + ")");
    if (g.everJoined >> f.rank & 1u) {
        const std::string why = "rank " + std::to_string(f.rank) + " asked to be re-adopted twice";
        refuseRank(Errc::GroupMismatch, why);
        return void(transition(g, GroupEvent::refuse(Errc::GroupMismatch, why)));
    }
    if (g.members.empty()) g.ownerUid = link.uid();
    g.everJoined |= 1u << f.rank;
    Member& me = g.members[f.rank];
    me.link = &link;
    me.pid = link.pid();
    me.uid = link.uid();
    me.hostDirect = (f.flags & kOpenHostDirect) != 0;
    if (me.hostDirect) g.directMask |= 1u << f.rank;
    // A Device group's rank: what its DeviceAttach told the old daemon, which
    // peers its kernels reach by ipc (the proxy carries its ring to the others).
    if (g.gpuDoorbells) {
        DeviceAttach a{};
        a.group = g.handle;
        a.rank = f.rank;
        a.world = g.world;
        a.deviceBytes = f.deviceBytes;
        for (std::uint32_t q = 0; q < g.world; ++q)
            a.wires[q] = q == f.rank ? std::uint8_t(kWireSelf) : f.ipcPeers >> q & 1u ? std::uint8_t(kWireIpc) : g.wires[q];
        me.attach = a;
    }
    g.adoption->lostUnixNs = std::min(g.adoption->lostUnixNs, f.lostUnixNs);
    std::optional<Error> groupRefusal;
    {
        auto region = HostRegion::adopt(g.layout, std::move(regionFd));
        auto ring = region ? CommandRing::adopt(f.ringEntries, g.handle, std::move(ringFd), cfg_.heartbeatMs)
                           : Result<std::shared_ptr<CommandRing>>(region.error());
        if (!region || !ring) {
            const Error& e = region ? ring.error() : region.error();
            groupRefusal = Error{Errc::BadMessage, "rank " + std::to_string(f.rank) + "'s " + e.detail};
        } else {
            me.region = *region;
            me.ring = *ring;
            me.countedBefore = std::make_shared<const RankStats>(readStats(me.ring->view.stats()));
            // A group the old daemon had broken stays broken: nothing is carried for it.
            const ControlBlock& c = me.region->control();
            Errc broke = Errc::Ok;
            if (const std::uint32_t err = loadShared(c.error); err && errcFromWire(err, broke))
                groupRefusal = Error{broke, "the group had broken before the restart (" + std::string(errcName(broke)) +
                                                ", naming rank " + std::to_string(loadShared(c.missingPeer)) +
                                                "): reopen it"};
        }
    }
    spdlog::info("group {}: rank {} (pid {}, uid {}) asks to be re-adopted", id.shortHex(), f.rank, link.pid(), link.uid());
    if (groupRefusal) return void(transition(g, GroupEvent::refuse(groupRefusal->code, groupRefusal->detail)));
    if ((g.everJoined & g.localMask) != g.localMask) return;
    g.openTimer->cancel();
    for (auto& [rank, member] : g.members)
        if (auto s = rebuildRing(g, rank, member); !s) return void(transition(g, GroupEvent::refuse(s.code(), s.error().detail)));
    if (g.localMask != (1u << g.world) - 1) return rejoin(g);
    transition(g, GroupEvent::ready()); // finishOpen -> finishAdoption
}

// The other nodes kept the group while this daemon was away: new
// registrations and queue pairs (or data links), a PeerRejoin to each with
// what landed in our ranks' regions from theirs; their answers say what
// landed there (finishAdoption sends the rest again).
void GroupTable::rejoin(Group& g) {
    g.negotiation = negotiations_.create(*this, g.id, g.roster);
    transition(g, GroupEvent::negotiate());
    NegotiationPlan plan{g.handle, g.wires[std::countr_one(g.localMask)], g.layout, g.agreedCap, {}};
    for (auto& [rank, m] : g.members)
        plan.regions.push_back(LocalRegion{rank, m.region->map.data(), m.region->layout.totalBytes(), m.region, m.region});
    g.negotiation->startRejoin(std::move(plan)); // a refusal comes back through negotiationRefused
}

// The proxy's private state of one ring, from the ring and the regions: its
// consumer index is the shared one the old proxy stored after each take;
// the last epoch it took is one before the next doorbell waiting (or, with
// none waiting, the last one it took, still in the ring); and that last
// doorbell may have been half carried out when the old daemon stopped: the
// peers whose flags of it are older get it again, from the first of them in
// peerAt order (a row copied twice is the same bytes: the rank cannot
// restage that slot until every peer has the epoch).
Status GroupTable::rebuildRing(Group& g, std::uint32_t rank, Member& m) {
    CommandRing& ring = *m.ring;
    const RingHeader& h = ring.view.header();
    const std::uint32_t head = loadShared(h.subHead), tail = loadShared(h.subTail);
    const std::uint32_t entries = ring.layout.entries;
    const auto bad = [&](const std::string& why) {
        return Status{Errc::BadMessage, "rank " + std::to_string(rank) + "'s command ring " + why};
    };
    if (head - tail > entries)
        return bad("holds " + std::to_string(head - tail) + " doorbells, more than its " + std::to_string(entries) + " entries");
    std::uint64_t last = 0;
    if (head != tail) {
        const Doorbell next = ring.doorbellAt(tail);
        if (next.epoch == 0) return bad("has a waiting doorbell of epoch 0");
        last = next.epoch - 1;
    } else if (tail != 0) {
        last = ring.doorbellAt(tail - 1).epoch;
    }
    ring.tail = tail;
    ring.lastEpoch = last;
    ring.delivering.reset();
    // The last doorbell taken is still in the ring unless a full ring wrapped over it.
    if (tail == 0 || last == 0 || head - tail == entries) return okStatus();
    const Doorbell d = ring.doorbellAt(tail - 1);
    if (d.epoch != last || d.group != g.handle || d.bytes > g.layout.slotBytes)
        return bad("does not hold the doorbell of epoch " + std::to_string(last) + " before its tail");
    const std::uint32_t direct = g.directPeers(rank, m);
    const std::uint32_t phase = phaseOf(last);
    for (std::uint32_t i = 0; i + 1 < g.world; ++i) {
        const std::uint32_t q = peerAt(rank, i, g.world);
        if (direct >> q & 1u) continue; // it reads the row from the rank's region itself
        if (m.attach && m.attach->wires[q] == kWireIpc) continue; // the rank's kernel delivered it itself
        if (!(g.localMask >> q & 1u)) continue; // another node: its answer to our PeerRejoin says (finishAdoption)
        const HostRegion& peer = *g.members.at(q).region;
        bool arrived = true;
        for (std::uint32_t k = 0; k < g.layout.stripes; ++k) arrived &= loadShared(*peer.flag(phase, rank, k)) >= last;
        if (arrived) continue;
        ring.delivering = CommandRing::Delivery{d, i, 0};
        spdlog::info("group {}: rank {}'s doorbell of epoch {} had not reached rank {} when the old daemon stopped: carried "
                     "out again from there",
                     g.id.shortHex(), rank, last, q);
        break;
    }
    return okStatus();
}

void GroupTable::finishAdoption(Group& g) {
    g.proxyGroup = proxyGroupOf(g);
    if (g.negotiation) queueResends(g, g.negotiation->theirLanded());
    Group::Adoption& a = *g.adoption;
    a.adoptedUnixNs = unixNs();
    a.gapNs = a.lostUnixNs && a.adoptedUnixNs > a.lostUnixNs ? a.adoptedUnixNs - a.lostUnixNs : 0;
    lifetime_.groupAdopted(a.gapNs);
    publishProxyTable();
    std::string pids;
    for (auto& [rank, m] : g.members) pids += (pids.empty() ? "" : ",") + std::to_string(m.pid);
    spdlog::info("group {}: re-adopted after a daemon restart: ranks {} (pids {}), gap {} ms, world {}, agreed cap {} bytes, "
                 "{} buffers",
                 g.id.shortHex(), ranksText(g.localMask), pids, a.gapNs / 1000000, g.world, g.agreedCap,
                 g.gpuDoorbells ? "device" : "host");
    for (auto& [rank, m] : g.members) {
        Adopted out{};
        out.rank = rank;
        out.groupHandle = g.handle;
        out.ranks = g.localMask;
        out.gapNs = a.gapNs;
        m.link->sendAdopted(out, proxy_.eventFd());
    }
}

void GroupTable::adoptTimedOut(const GroupId& id) {
    auto it = groups_.find(id);
    if (it == groups_.end() || !it->second.adoption) return;
    Group& g = it->second;
    std::uint32_t missing = 0;
    while (missing < g.world && !((g.localMask & ~g.everJoined) >> missing & 1u)) ++missing;
    transition(g, GroupEvent::openTimedOut("rank " + std::to_string(missing) +
                                           " did not ask to be re-adopted in time (its process is gone, or it could not "
                                           "reach this daemon): every rank must, or none is"));
}

} // namespace tpf::daemon
