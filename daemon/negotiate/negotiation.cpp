// One group's negotiation with the other nodes (see negotiation.hpp).
#include "daemon/negotiate/negotiation.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "daemon/negotiate/negotiation_table.hpp"
#include "daemon/verbs/hca.hpp"
#include "proto/pairing.hpp"

namespace tpf::daemon {

using namespace client_proto;
using namespace peer_proto;

namespace {
constexpr std::uint32_t kMaxSendWr = 256;

HcaAddress addressOf(const HcaRecord& h) {
    HcaAddress a;
    std::memcpy(a.gid.data(), h.gid, 16);
    std::memcpy(a.subnet.data(), h.subnet, 16);
    a.prefixLen = h.prefixLen;
    return a;
}

std::string ranksText(std::uint32_t mask) {
    std::string s;
    for (std::uint32_t r = 0; r < 32; ++r)
        if (mask >> r & 1u) s += (s.empty() ? "" : ",") + std::to_string(r);
    return s;
}
} // namespace

Negotiation::Negotiation(NegotiationTable& desk, NegotiationEvents& events, const GroupId& id,
                         std::vector<RosterEntry> roster)
    : desk_(desk), events_(events), id_(id), world_(std::uint32_t(roster.size())), roster_(std::move(roster)),
      timer_(desk.io_) {
    for (std::uint32_t r = 0; r < world_; ++r)
        if (desk_.self_.is(roster_[r].nodeId)) localMask_ |= 1u << r;
}

Negotiation::~Negotiation() { close(); }

bool Negotiation::inRoster(const NodeId& node) const {
    return std::any_of(roster_.begin(), roster_.end(), [&](const RosterEntry& e) { return node.is(e.nodeId); });
}

NodeLink* Negotiation::nodeOf(const NodeId& node) {
    for (auto& n : nodes_)
        if (n.node == node) return &n;
    return nullptr;
}

void Negotiation::start(NegotiationPlan plan) {
    auto self = shared_from_this(); // a failure ends the group, and the table drops us
    plan_ = std::move(plan);
    phase_ = Phase::Negotiating;
    if (auto s = bringUp(); !s) fail(s.code(), s.error().detail);
}

Status Negotiation::bringUp() {
    if (const Error* e = desk_.refusedGroup(id_, false)) return *e;
    for (std::uint32_t r = 0; r < world_; ++r) {
        if (localMask_ >> r & 1u) continue;
        const auto& e = roster_[r];
        const NodeId node = NodeId::of(e.nodeId);
        NodeLink* n = nodeOf(node);
        if (!n) {
            if (e.endpointPort == 0)
                return Error{Errc::Unavailable, "rank " + std::to_string(r) + "'s daemon (node " + node.shortHex() +
                                                    ") has no peer link (peer.listen is unset there)"};
            n = &nodes_.emplace_back();
            n->node = node;
            std::memcpy(n->addr, e.endpointAddr, 16);
            n->port = e.endpointPort;
            n->weConnect = desk_.self_ < node; // bytewise, as both nodes compare
        }
        n->ranks |= 1u << r;
    }
    if (auto s = buildWire(); !s) return s;
    for (auto& n : nodes_) n.ourRecord = recordFor(n);

    armTimer(desk_.cfg_.openTimeoutMs);
    spdlog::info("group {}: negotiating with {} other node(s) over {} HCA(s)", id_.shortHex(), nodes_.size(),
                 desk_.hcas_.size());
    // Links whose record already arrived are taken last: taking one may end the negotiation.
    std::vector<NegotiationTable::Parked> ready;
    for (auto& n : nodes_) {
        if (n.weConnect) {
            n.session = desk_.peers_.connect(n.addr, n.port, n.node, n.ourRecord);
            continue;
        }
        if (const Error* e = desk_.refusalOf(n.node))
            return Error{e->code, "peer daemon " + endpointText(n.addr, n.port) + ": " + e->detail};
        if (auto p = desk_.takeParked(id_, n.node)) ready.push_back(std::move(*p));
    }
    for (auto& p : ready) {
        if (phase_ != Phase::Negotiating) {
            p.session->finish();
            continue;
        }
        NodeLink* n = nodeOf(p.session->remoteNode());
        attach(*n, p.session);
        takeRecord(*n, p.record);
    }
    return okStatus();
}

Status Negotiation::buildWire() {
    const auto& hcas = desk_.hcas_;
    const std::uint32_t nh = std::uint32_t(hcas.size());
    auto vg = std::make_shared<VerbsGroup>();
    vg->world = world_;
    vg->hcas = nh;
    vg->mrs.resize(std::size_t(world_) * nh);
    vg->links = QpTable<std::unique_ptr<QpLink>>(world_, plan_.layout.stripes);
    qpsByHca_ = QpTable<std::unique_ptr<QpLink>>(world_, nh);
    wire_ = vg; // status shows its queue pairs while they come up
    for (const auto& m : plan_.regions) {
        const std::uint32_t l = m.rank;
        for (std::uint32_t a = 0; a < nh; ++a) {
            auto mr = VerbsMr::reg(hcas[a], m.base, m.bytes, m.memory);
            if (!mr) return Error{mr.code(), "registering rank " + std::to_string(l) + "'s region on " + hcas[a]->name() +
                                                 ": " + mr.error().detail + " (LimitMEMLOCK=infinity?)"};
            vg->mrs[vg->mrIndex(l, a)] = std::move(*mr);
        }
        for (std::uint32_t r = 0; r < world_; ++r) {
            if (localMask_ >> r & 1u) continue;
            for (std::uint32_t a = 0; a < nh; ++a) {
                auto qp = QpLink::create(hcas[a], kMaxSendWr, desk_.cfg_.inflightBytes);
                if (!qp) return Error{qp.code(), "creating a QP on " + hcas[a]->name() + ": " + qp.error().detail};
                (*qp)->groupHandle = plan_.handle;
                (*qp)->localRank = l;
                (*qp)->remoteRank = r;
                (*qp)->localBase = m.base;
                (*qp)->lkey = vg->mr(l, a)->lkey();
                qpsByHca_.at(l, r, a) = std::move(*qp);
            }
        }
    }
    return okStatus();
}

Bytes Negotiation::recordFor(const NodeLink& n) const {
    const auto& hcas = desk_.hcas_;
    const std::uint32_t nh = std::uint32_t(hcas.size());
    PeerGroup rec;
    id_.copyTo(rec.fixed.groupId);
    desk_.self_.copyTo(rec.fixed.nodeId);
    rec.fixed.world = world_;
    rec.fixed.localRanks = localMask_;
    for (std::uint32_t r = 0; r < world_; ++r) rec.fixed.caps[r] = roster_[r].maxBytes;
    rec.fixed.daemonMax = desk_.cfg_.maxBytes;
    for (std::uint32_t a = 0; a < nh; ++a) {
        const auto& c = hcas[a]->card();
        HcaRecord h{};
        std::memcpy(h.gid, c.gid, 16);
        std::memcpy(h.subnet, c.subnet, 16);
        h.prefixLen = c.prefixLen;
        h.port = c.port;
        h.mtu = c.mtu;
        h.gidIndex = c.gidIndex;
        rec.hcas.push_back(h);
    }
    for (const auto& m : plan_.regions)
        for (std::uint32_t a = 0; a < nh; ++a) {
            const std::uint32_t l = m.rank;
            const VerbsMr* mr = wire_->mr(l, a);
            rec.regions.push_back(RegionRecord{l, a, mr->addr(), mr->bytes(), mr->rkey(), 0});
            for (std::uint32_t r = 0; r < world_; ++r)
                if (n.ranks >> r & 1u) {
                    const auto& qp = qpsByHca_.at(l, r, a);
                    rec.qps.push_back(QpRecord{std::uint8_t(a), 0, std::uint16_t(l), std::uint16_t(r), 0, qp->qpn(), qp->psn()});
                }
        }
    return peer_proto::encode(0, rec);
}

void Negotiation::attach(NodeLink& n, const std::shared_ptr<PeerSession>& s) {
    n.session = s;
    if (!n.weConnect) s->send(n.ourRecord);
    spdlog::info("group {}: peer link {} to node {} attached", id_.shortHex(), s->endpointText(), n.node.shortHex());
}

void Negotiation::takeLink(const std::shared_ptr<PeerSession>& s, const PeerGroup& rec) {
    auto self = shared_from_this();
    const auto refuseLink = [&](const std::string& why) {
        spdlog::warn("peer link {}: group {}: {}", s->endpointText(), id_.shortHex(), why);
        s->send(verdictMessage(kPeerReady, id_, Errc::GroupMismatch, kNoPeer, why));
        s->finish();
    };
    NodeLink* n = nodeOf(s->remoteNode());
    if (!n) return refuseLink("node " + s->remoteNode().shortHex() + " serves no rank of this group");
    if (s->accepted()) {
        if (n->session) return refuseLink("a second link for the same group and node");
        attach(*n, s);
    } else if (n->session != s) {
        return refuseLink("record on a link the group did not open");
    }
    takeRecord(*n, rec);
}

// The remote's record: pair, connect our QPs, say PeerReady (or why not).
void Negotiation::takeRecord(NodeLink& n, const PeerGroup& rec) {
    if (auto s = connectQps(n, rec); !s)
        return fail(s.code(), "with node " + n.node.shortHex() + " (" + n.session->endpointText() + "): " +
                                  s.error().detail);
    n.session->send(verdictMessage(kPeerReady, id_, Errc::Ok, kNoPeer, ""));
    n.selfReady = true;
    // Our QPs are up towards every node: the others' must follow within verbs.qp_timeout_ms.
    if (std::all_of(nodes_.begin(), nodes_.end(), [](const NodeLink& x) { return x.selfReady; }))
        armTimer(desk_.cfg_.qpTimeoutMs);
    maybeReady();
}

Status Negotiation::connectQps(NodeLink& n, const PeerGroup& rec) {
    const auto& f = rec.fixed;
    const Layout& layout = plan_.layout;
    if (f.world != world_ || f.localRanks != n.ranks)
        return Error{Errc::GroupMismatch, "it serves ranks " + ranksText(f.localRanks) + " of world " + std::to_string(f.world) +
                                              ", our roster says ranks " + ranksText(n.ranks) + " of world " +
                                              std::to_string(world_)};
    for (std::uint32_t r = 0; r < world_; ++r)
        if (f.caps[r] != roster_[r].maxBytes)
            return Error{Errc::GroupMismatch, "the nodes' rosters differ: rank " + std::to_string(r) + "'s maxBytes is " +
                                                  std::to_string(roster_[r].maxBytes) + " here, " +
                                                  std::to_string(f.caps[r]) + " there"};
    // Both nodes took the cap from the same roster and their own daemon.max_bytes;
    // a daemon below our cap means a roster entry above its own daemon's maximum.
    if (f.daemonMax < plan_.agreedCap)
        return Error{Errc::CapMismatch, "its daemon.max_bytes " + std::to_string(f.daemonMax) + " is below the cap of " +
                                            std::to_string(plan_.agreedCap) +
                                            " bytes this node agreed: a rank of it sent a roster entry above its own "
                                            "daemon's maximum (a libtpfabric of another release?)"};
    n.daemonMax = f.daemonMax;
    std::vector<HcaAddress> ours, theirs;
    for (const auto& h : desk_.hcas_) ours.push_back(hcaAddress(h->card()));
    for (const auto& h : rec.hcas) theirs.push_back(addressOf(h));
    auto pairs = pairHcas(ours, theirs);
    if (!pairs) return pairs.error();
    if (pairs->size() != layout.stripes)
        return Error{Errc::NonOneToOnePairing, std::to_string(pairs->size()) + " HCA pairs for " +
                                                   std::to_string(layout.stripes) + " stripes"};
    for (std::uint32_t k = 0; k < pairs->size(); ++k) {
        const std::uint32_t a = (*pairs)[k].local, b = (*pairs)[k].remote;
        for (const auto& m : plan_.regions)
            for (std::uint32_t r = 0; r < world_; ++r) {
                const std::uint32_t l = m.rank;
                if (!(n.ranks >> r & 1u)) continue;
                const RegionRecord* region = nullptr;
                for (const auto& x : rec.regions)
                    if (x.rank == r && x.hca == b) region = &x;
                const QpRecord* qp = nullptr;
                for (const auto& x : rec.qps)
                    if (x.hca == b && x.localRank == r && x.remoteRank == l) qp = &x;
                if (!region || !qp)
                    return Error{Errc::GroupMismatch, "its record lacks the region or QP of rank " + std::to_string(r) +
                                                          " on its HCA " + std::to_string(b)};
                if (region->bytes != layout.totalBytes())
                    return Error{Errc::GroupMismatch, "rank " + std::to_string(r) + "'s region is " +
                                                          std::to_string(region->bytes) + " bytes, ours " +
                                                          std::to_string(layout.totalBytes()) + " (different layout)"};
                RemoteQp rq;
                rq.qpn = qp->qpn;
                rq.psn = qp->psn;
                std::memcpy(rq.gid, rec.hcas[b].gid, 16);
                rq.mtu = rec.hcas[b].mtu;
                rq.regionAddr = region->addr;
                rq.rkey = region->rkey;
                auto& link = qpsByHca_.at(l, r, a);
                if (!link) return Error{Errc::GroupMismatch, "QP of rank " + std::to_string(l) + " to " + std::to_string(r) + " used twice"};
                link->rail = k;
                if (auto s = link->connect(rq); !s) return s;
                wire_->links.at(l, r, k) = std::move(link);
            }
    }
    spdlog::info("group {}: QPs to node {} up ({} rail(s))", id_.shortHex(), n.node.shortHex(), pairs->size());
    return okStatus();
}

void Negotiation::maybeReady() {
    for (const auto& n : nodes_)
        if (!n.selfReady || !n.remoteReady) return;
    for (auto& n : nodes_) n.session->setState(LinkState::Ready);
    qpsByHca_.clear();
    ++timerGen_;
    timer_.cancel();
    phase_ = Phase::Ready;
    events_.negotiationReady(id_, wire_);
}

void Negotiation::verdict(NodeLink& n, std::uint16_t opcode, const PeerVerdict& v) {
    auto self = shared_from_this();
    Errc code = Errc::PeerLost;
    errcFromWire(v.errc, code);
    std::string reason;
    getText(v.reason, reason);
    const std::string from = "node " + n.node.shortHex() + " (" + n.session->endpointText() + ")";
    if (opcode == kPeerReady) {
        if (phase_ != Phase::Negotiating) return;
        if (v.errc) return fail(code, from + " refused the group: " + reason);
        n.remoteReady = true;
        return maybeReady();
    }
    if (phase_ == Phase::Negotiating) return fail(code, from + ": " + reason);
    // An orderly leave counts only for a rank that node serves.
    const bool left = code == Errc::PeerLost && v.missingRank < world_ && (n.ranks >> v.missingRank & 1u);
    if (phase_ == Phase::Ready || phase_ == Phase::Stopped) // counted where it was seen
        events_.negotiationBroken(id_, code, v.missingRank, from + ": " + reason, false, left ? v.leftAfter : 0);
}

void Negotiation::linkLost(const PeerSession& s, const Error& why) {
    auto self = shared_from_this();
    NodeLink* n = nodeOf(s.remoteNode());
    const std::string what = "peer daemon " + s.endpointText() + ": " + why.describe();
    if (phase_ == Phase::Negotiating) return fail(why.code == Errc::AuthFailed ? Errc::AuthFailed : Errc::PeerLost, what);
    if (phase_ != Phase::Ready) return;
    std::uint32_t first = 0;
    while (n && first < world_ && !(n->ranks >> first & 1u)) ++first;
    events_.negotiationBroken(id_, Errc::PeerLost, first, what, true, 0);
}

// Tell every node why, then the group table (which refuses its ranks and drops us).
void Negotiation::fail(Errc code, const std::string& why) {
    auto self = shared_from_this();
    if (phase_ == Phase::Stopped) return;
    const Bytes v = verdictMessage(kPeerReady, id_, code, kNoPeer, why);
    for (auto& n : nodes_)
        if (n.session) n.session->send(v);
    phase_ = Phase::Stopped;
    ++timerGen_;
    timer_.cancel();
    events_.negotiationRefused(id_, code, why);
}

void Negotiation::tellBroken(Errc code, std::uint32_t rank, const std::string& why, std::uint64_t leftAfter) {
    const Bytes v = verdictMessage(kPeerBroken, id_, code, rank, why, leftAfter);
    for (auto& n : nodes_)
        if (n.session) n.session->send(v);
    if (phase_ == Phase::Ready) return;
    phase_ = Phase::Stopped;
    ++timerGen_;
    timer_.cancel();
}

void Negotiation::close() {
    if (desk_.find(id_) == this) desk_.active_.erase(id_);
    phase_ = Phase::Stopped;
    ++timerGen_;
    timer_.cancel();
    for (auto& n : nodes_)
        if (n.session) std::exchange(n.session, nullptr)->finish();
}

void Negotiation::armTimer(std::uint32_t ms) {
    const std::uint64_t gen = ++timerGen_;
    timer_.expires_after(std::chrono::milliseconds(ms));
    timer_.async_wait([w = weak_from_this(), gen](const boost::system::error_code& ec) {
        auto self = w.lock();
        if (!ec && self && self->timerGen_ == gen) self->timedOut();
    });
}

void Negotiation::timedOut() {
    if (phase_ != Phase::Negotiating) return;
    std::string slow;
    for (const auto& n : nodes_)
        if (!n.selfReady || !n.remoteReady)
            slow += (slow.empty() ? "" : ", ") + endpointText(n.addr, n.port) + " (" +
                    linkStateName(n.session ? n.session->state() : LinkState::Waiting) + ")";
    fail(Errc::Timeout, "peer daemon(s) " + slow +
                            " did not complete negotiation in time (daemon.open_timeout_ms, or verbs.qp_timeout_ms "
                            "once our QPs were up)");
}

} // namespace tpf::daemon
