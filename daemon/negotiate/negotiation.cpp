// One group's negotiation with the other nodes (see negotiation.hpp).
#include "daemon/negotiate/negotiation.hpp"

#include <boost/asio/post.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/shm.hpp"
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
      timer_(desk.io_), awayTimer_(desk.io_) {
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

void Negotiation::startRejoin(NegotiationPlan plan) {
    rejoining_ = true;
    plan_ = std::move(plan);
    ourLanded_ = landedFrom(((1u << world_) - 1) & ~localMask_);
    start(std::move(plan_));
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
                                                    ") has no peer link (peer.listen is unset there, or a wildcard "
                                                    "on a node without an HCA address)"};
            n = &nodes_.emplace_back();
            n->node = node;
            std::memcpy(n->addr, e.endpointAddr, 16);
            n->port = e.endpointPort;
            n->weConnect = desk_.self_ < node; // bytewise, as both nodes compare
        }
        n->ranks |= 1u << r;
    }
    if (auto s = buildWire(); !s) return s;
    for (auto& n : nodes_) {
        n.ourRecord = recordFor(n);
        if (!rejoining_) continue;
        PeerRejoin rec{groupRecord(n), 0, {}};
        for (const auto& l : ourLanded_)
            if (n.ranks >> l.from & 1u) rec.landed.push_back(l);
        n.ourRecord = peer_proto::encode(0, rec);
    }

    armTimer(desk_.cfg_.openTimeoutMs);
    const std::string over = plan_.wire == kWireTcp ? std::string("the tcp wire") : std::to_string(desk_.hcas_.size()) + " HCA(s)";
    if (rejoining_)
        spdlog::info("group {}: rejoining {} other node(s) over {} after this daemon's restart", id_.shortHex(),
                     nodes_.size(), over);
    else if (plan_.wire == kWireTcp)
        spdlog::info("group {}: negotiating with {} other node(s) over the tcp wire", id_.shortHex(), nodes_.size());
    else
        spdlog::info("group {}: negotiating with {} other node(s) over {} HCA(s)", id_.shortHex(), nodes_.size(),
                     desk_.hcas_.size());
    // Links whose record already arrived are taken last: taking one may end the negotiation.
    std::vector<NegotiationTable::Parked> ready;
    for (auto& n : nodes_) {
        // Rejoining, this daemon opens every link: the other nodes wait for it.
        if (n.weConnect || rejoining_) {
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
    if (plan_.wire == kWireTcp) {
        tcp_ = std::make_shared<TcpGroup>(desk_.tcpReceiver_); // its links come with the records
        return okStatus();
    }
    const auto& hcas = desk_.hcas_;
    const std::uint32_t nh = std::uint32_t(hcas.size());
    auto vg = std::make_shared<VerbsGroup>();
    vg->world = world_;
    vg->hcas = nh;
    vg->mrs.resize(std::size_t(world_) * nh);
    vg->links = QpTable<std::shared_ptr<QpLink>>(world_, plan_.layout.stripes);
    qpsByHca_ = QpTable<std::unique_ptr<QpLink>>(world_, nh);
    wire_ = vg; // status shows its queue pairs while they come up
    for (const auto& m : plan_.regions)
        for (std::uint32_t a = 0; a < nh; ++a) {
            auto mr = VerbsMr::reg(hcas[a], m.base, m.bytes, m.memory);
            if (!mr) return Error{mr.code(), "registering rank " + std::to_string(m.rank) + "'s region on " + hcas[a]->name() +
                                                 ": " + mr.error().detail + " (LimitMEMLOCK=infinity?)"};
            vg->mrs[vg->mrIndex(m.rank, a)] = std::move(*mr);
        }
    for (const auto& n : nodes_)
        if (auto s = createQps(n); !s) return s;
    return okStatus();
}

Status Negotiation::createQps(const NodeLink& n) {
    const auto& hcas = desk_.hcas_;
    for (const auto& m : plan_.regions)
        for (std::uint32_t r = 0; r < world_; ++r) {
            if (!(n.ranks >> r & 1u)) continue;
            for (std::uint32_t a = 0; a < hcas.size(); ++a) {
                auto qp = QpLink::create(hcas[a], kMaxSendWr, desk_.cfg_.inflightBytes);
                if (!qp) return Error{qp.code(), "creating a QP on " + hcas[a]->name() + ": " + qp.error().detail};
                (*qp)->groupHandle = plan_.handle;
                (*qp)->localRank = m.rank;
                (*qp)->remoteRank = r;
                (*qp)->localBase = m.base;
                (*qp)->lkey = wire_->mr(m.rank, a)->lkey();
                qpsByHca_.at(m.rank, r, a) = std::move(*qp);
            }
        }
    return okStatus();
}

Bytes Negotiation::recordFor(const NodeLink& n) const { return peer_proto::encode(0, groupRecord(n)); }

PeerGroup Negotiation::groupRecord(const NodeLink& n) const {
    const auto& hcas = desk_.hcas_;
    const std::uint32_t nh = std::uint32_t(hcas.size());
    PeerGroup rec;
    id_.copyTo(rec.fixed.groupId);
    desk_.self_.copyTo(rec.fixed.nodeId);
    rec.fixed.world = world_;
    rec.fixed.localRanks = localMask_;
    for (std::uint32_t r = 0; r < world_; ++r) rec.fixed.caps[r] = roster_[r].maxBytes;
    rec.fixed.daemonMax = desk_.cfg_.maxBytes;
    rec.fixed.wire = plan_.wire;
    if (plan_.wire == kWireTcp) return rec; // no region, HCA or QP: frames name ranks
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
    return rec;
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

// The remote's record: check it, then verbs: pair, connect our QPs, say
// PeerReady (or why not); tcp: bring up the data link first.
void Negotiation::takeRecord(NodeLink& n, const PeerGroup& rec) {
    auto s = checkRecord(n, rec);
    if (s && plan_.wire == kWireVerbs) s = connectQps(n, rec, *wire_);
    if (!s)
        return fail(s.code(), "with node " + n.node.shortHex() + " (" + n.session->endpointText() + "): " +
                                  s.error().detail);
    n.recordTaken = true;
    if (plan_.wire == kWireTcp) return openDataLink(n);
    selfReady(n);
}

void Negotiation::selfReady(NodeLink& n) {
    n.session->send(verdictMessage(kPeerReady, id_, Errc::Ok, kNoPeer, ""));
    n.selfReady = true;
    // Our QPs (data links) are up towards every node: the others' must follow within verbs.qp_timeout_ms.
    if (std::all_of(nodes_.begin(), nodes_.end(), [](const NodeLink& x) { return x.selfReady; }))
        armTimer(desk_.cfg_.qpTimeoutMs);
    maybeReady();
}

Status Negotiation::checkRecord(NodeLink& n, const PeerGroup& rec) {
    const auto& f = rec.fixed;
    const std::uint8_t theirs = f.wire == kWireTcp ? kWireTcp : kWireVerbs; // 0: a daemon before the tcp wire
    if (theirs != plan_.wire)
        return Error{Errc::GroupMismatch, std::string("it carries the group over the ") + wireName(theirs) +
                                              " wire, this node over " + wireName(plan_.wire) +
                                              " (both choose from the roster: a daemon or libtpfabric before the tcp "
                                              "wire on one of the nodes?)"};
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
    return okStatus();
}

Status Negotiation::connectQps(NodeLink& n, const PeerGroup& rec, VerbsGroup& into) {
    const Layout& layout = plan_.layout;
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
                into.links.at(l, r, k) = std::move(link);
            }
    }
    spdlog::info("group {}: QPs to node {} up ({} rail(s))", id_.shortHex(), n.node.shortHex(), pairs->size());
    return okStatus();
}

void Negotiation::openDataLink(NodeLink& n) {
    // The side with the smaller node id opens it (the other: takeDataLink);
    // a daemon that rejoins after a restart opens every link itself.
    if (!n.weConnect && !rejoining_) return;
    PeerData d{};
    id_.copyTo(d.groupId);
    desk_.self_.copyTo(d.nodeId);
    desk_.peers_.connectData(n.addr, n.port, n.node, peer_proto::encode(kPeerData, 0, d),
                             [w = weak_from_this(), node = n.node](Result<UniqueFd> fd) {
                                 auto self = w.lock();
                                 if (!self || self->phase_ != Phase::Negotiating) return;
                                 NodeLink* to = self->nodeOf(node);
                                 if (!to) return;
                                 if (!fd)
                                     return self->fail(fd.code() == Errc::AuthFailed ? Errc::AuthFailed : Errc::PeerLost,
                                                       "tcp data link to node " + node.shortHex() + ": " +
                                                           fd.error().detail);
                                 self->dataLinkUp(*to, std::move(*fd));
                             });
}

void Negotiation::takeDataLink(const std::shared_ptr<PeerSession>& s) {
    auto self = shared_from_this();
    const auto refuse = [&](const std::string& why) {
        spdlog::warn("peer link {}: group {}: tcp data link refused: {}", s->endpointText(), id_.shortHex(), why);
        s->close();
    };
    NodeLink* n = nodeOf(s->remoteNode());
    // A node whose daemon restarted opens its new data link once it took our answer to its PeerRejoin.
    const bool back = phase_ == Phase::Ready && n && n->away && n->session;
    if (phase_ != Phase::Negotiating && !back) return refuse("the group is not negotiating here");
    if (plan_.wire != kWireTcp) return refuse("the group is on the verbs wire here");
    if (back && n->selfReady) return refuse("a second data link");
    if (!back && (!n || n->weConnect))
        return refuse("node " + s->remoteNode().shortHex() + " does not open this group's data link");
    if (!back && (!n->recordTaken || n->selfReady))
        return refuse(n->selfReady ? "a second data link" : "before the node's record");
    auto fd = s->takeSocket();
    if (!fd && back) return rejoinFailed(*n, "tcp data link: " + fd.error().detail);
    if (!fd) return fail(Errc::PeerLost, "tcp data link from node " + n->node.shortHex() + ": " + fd.error().detail);
    dataLinkUp(*n, std::move(*fd));
}

void Negotiation::dataLinkUp(NodeLink& n, UniqueFd fd) {
    std::array<std::shared_ptr<HostRegion>, kMaxWorld> regions{};
    for (const auto& m : plan_.regions) regions[m.rank] = m.host;
    auto link = std::make_shared<TcpLink>(std::move(fd), plan_.layout, plan_.handle, n.node, endpointText(n.addr, n.port),
                                          n.ranks, localMask_, regions, desk_.cfg_.tcpInflightBytes);
    // The receiver's thread reports on the control thread, to a negotiation that may be gone by then.
    link->onReceiveFailed = [&io = desk_.io_, w = weak_from_this(), node = n.node, which = link.get()](const Error& why) {
        boost::asio::post(io, [w, node, which, why] {
            if (auto self = w.lock()) self->dataLinkLost(node, which, why);
        });
    };
    if (phase_ == Phase::Ready) { // a node that came back: its new link replaces the old
        if (auto s = tcp_->replace(link); !s) return rejoinFailed(n, "tcp data link: " + s.error().detail);
        spdlog::info("group {}: new tcp data link to node {} ({}) up", id_.shortHex(), n.node.shortHex(),
                     endpointText(n.addr, n.port));
        n.session->send(verdictMessage(kPeerReady, id_, Errc::Ok, kNoPeer, ""));
        n.selfReady = true;
        return maybeBack(n);
    }
    if (auto s = tcp_->add(link); !s) return fail(s.code(), "tcp data link to node " + n.node.shortHex() + ": " + s.error().detail);
    spdlog::info("group {}: tcp data link to node {} ({}) up, send buffer {} bytes", id_.shortHex(), n.node.shortHex(),
                 endpointText(n.addr, n.port), link->sendBuffer());
    // The kernel holds twice what it is asked for, up to twice net.core.wmem_max (socket(7)); said once a daemon.
    static bool capped = false;
    if (link->sendBuffer() < desk_.cfg_.tcpInflightBytes && !std::exchange(capped, true))
        spdlog::warn("tcp data links get a send buffer of {} bytes, below peer.tcp_inflight_bytes ({}): the kernel caps it "
                     "at twice net.core.wmem_max; sysctl net.core.wmem_max={} gives the configured size",
                     link->sendBuffer(), desk_.cfg_.tcpInflightBytes, desk_.cfg_.tcpInflightBytes / 2);
    selfReady(n);
}

void Negotiation::dataLinkLost(const NodeId& node, const TcpLink* which, const Error& why) {
    auto self = shared_from_this();
    if (phase_ == Phase::Ready && tcp_ && tcp_->linkTo(node) != which) return; // a link replaced since: nothing to it
    spdlog::warn("group {}: {}", id_.shortHex(), why.describe());
    if (phase_ == Phase::Negotiating) return fail(Errc::PeerLost, why.detail);
    if (phase_ != Phase::Ready) return;
    NodeLink* n = nodeOf(node);
    if (n && n->away && !n->selfReady) return; // the old link, whose daemon went: reported late
    if (n && n->away) return rejoinFailed(*n, why.detail); // the new one, before the node's PeerReady
    if (n && mayWait(*n)) { // its daemon may come back: the peer link goes with the data link
        if (n->session) std::exchange(n->session, nullptr)->close();
        return goAway(*n, why.detail);
    }
    events_.negotiationBroken(id_, Errc::PeerLost, n ? firstRank(*n) : 0, why.detail, true, 0);
}

bool Negotiation::linkFailed(std::uint32_t remoteRank, const std::string& why) {
    if (phase_ != Phase::Ready || plan_.wire != kWireTcp || remoteRank >= world_) return false;
    for (auto& n : nodes_) {
        if (!(n.ranks >> remoteRank & 1u)) continue;
        if (n.away) return true;
        if (!mayWait(n)) return false;
        if (n.session) std::exchange(n.session, nullptr)->close();
        goAway(n, why);
        return true;
    }
    return false;
}

void Negotiation::rejoinFailed(NodeLink& n, const std::string& why) {
    spdlog::warn("group {}: node {} could not rejoin ({}): waiting for it again", id_.shortHex(), n.node.shortHex(), why);
    if (n.session) std::exchange(n.session, nullptr)->close();
    n.backLinks = nullptr;
    n.backLanded.clear();
    n.selfReady = n.remoteReady = false;
}

void Negotiation::maybeReady() {
    for (const auto& n : nodes_)
        if (!n.selfReady || !n.remoteReady) return;
    for (auto& n : nodes_) n.session->setState(LinkState::Ready);
    qpsByHca_.clear();
    ++timerGen_;
    timer_.cancel();
    phase_ = Phase::Ready;
    events_.negotiationReady(id_, NodeWires{wire_, tcp_});
}

void Negotiation::verdict(NodeLink& n, std::uint16_t opcode, const PeerVerdict& v) {
    auto self = shared_from_this();
    Errc code = Errc::PeerLost;
    errcFromWire(v.errc, code);
    std::string reason;
    getText(v.reason, reason);
    const std::string from = "node " + n.node.shortHex() + " (" + n.session->endpointText() + ")";
    if (opcode == kPeerReady && phase_ == Phase::Ready && n.away) {
        if (v.errc) {
            const std::string why = from + " could not rejoin: " + (reason.empty() ? std::string(errcName(code)) : reason);
            return events_.negotiationBroken(id_, code, firstRank(n), why, true, 0);
        }
        n.remoteReady = true;
        return maybeBack(n);
    }
    if (opcode == kPeerReady) {
        if (phase_ != Phase::Negotiating) return;
        if (v.errc) return fail(code, from + " refused the group: " + reason);
        n.remoteReady = true;
        return maybeReady();
    }
    if (phase_ == Phase::Negotiating) return fail(code, from + ": " + reason);
    n.toldBroken = true;
    // An orderly leave counts only for a rank that node serves.
    const bool left = code == Errc::PeerLost && v.missingRank < world_ && (n.ranks >> v.missingRank & 1u);
    if (phase_ != Phase::Ready && phase_ != Phase::Stopped) return;
    // Counted where it was seen. On the tcp wire a leave waits until that
    // node's data link landed what it sent first (TcpLink::drained); every
    // later verdict of the group waits behind it, in order.
    const TcpLink* link = tcp_ ? tcp_->linkTo(n.node) : nullptr;
    const std::uint64_t leftAfter = left ? v.leftAfter : 0;
    heldVerdicts_.push_back(HeldVerdict{code, v.missingRank, from + ": " + reason, leftAfter,
                                        leftAfter ? link : nullptr, monotonicNs()});
    releaseVerdicts();
}

void Negotiation::releaseVerdicts() {
    auto self = shared_from_this(); // the table may drop us on a verdict
    constexpr std::uint64_t kLandingWaitNs = 1000000000ull; // as the proxy waits for a leaver's last writes
    while (!heldVerdicts_.empty()) {
        HeldVerdict& h = heldVerdicts_.front();
        if (h.link && !h.link->drained() && monotonicNs() - h.sinceNs < kLandingWaitNs) {
            if (!verdictTimer_) verdictTimer_ = std::make_unique<boost::asio::steady_timer>(desk_.io_);
            verdictTimer_->expires_after(std::chrono::microseconds(200));
            verdictTimer_->async_wait([w = weak_from_this()](const boost::system::error_code& ec) {
                if (auto again = w.lock(); again && !ec) again->releaseVerdicts();
            });
            return;
        }
        const HeldVerdict out = std::move(h);
        heldVerdicts_.pop_front();
        events_.negotiationBroken(id_, out.code, out.rank, out.why, false, out.leftAfter); // may close us
    }
}

void Negotiation::linkLost(const PeerSession& s, const Error& why) {
    auto self = shared_from_this();
    NodeLink* n = nodeOf(s.remoteNode());
    const std::string what = "peer daemon " + s.endpointText() + ": " + why.describe();
    if (phase_ == Phase::Negotiating) return fail(why.code == Errc::AuthFailed ? Errc::AuthFailed : Errc::PeerLost, what);
    if (phase_ != Phase::Ready) return;
    if (n && n->away) { // its daemon came back and this link to it failed: it may come again
        n->session = nullptr;
        return rejoinFailed(*n, what);
    }
    // A node whose daemon restarts comes back with PeerRejoin.
    if (n && mayWait(*n)) return goAway(*n, what);
    events_.negotiationBroken(id_, Errc::PeerLost, n ? firstRank(*n) : 0, what, true, 0);
}

bool Negotiation::mayWait(const NodeLink& n) const {
    return desk_.cfg_.peerRestartWaitMs > 0 && !n.toldBroken && !toldBroken_;
}

std::uint32_t Negotiation::firstRank(const NodeLink& n) const {
    std::uint32_t first = 0;
    while (first < world_ && !(n.ranks >> first & 1u)) ++first;
    return first;
}

void Negotiation::goAway(NodeLink& n, const std::string& why) {
    n.away = true;
    n.awaySinceNs = monotonicNs();
    n.refusedMeanwhile.clear();
    n.session = nullptr;
    n.backLinks = nullptr;
    n.selfReady = n.remoteReady = false;
    // Its old queue pairs fail from now on (its daemon's end is gone): expected.
    if (wire_)
        for (const auto& m : plan_.regions)
            for (std::uint32_t r = 0; r < world_; ++r)
                if (n.ranks >> r & 1u)
                    for (std::uint32_t k = 0; k < plan_.layout.stripes; ++k)
                        if (QpLink* l = wire_->link(m.rank, r, k)) l->replaced.store(true, std::memory_order_relaxed);
    spdlog::warn("group {}: the link to node {} (ranks {}) closed ({}): waiting up to {} ms (peer.restart_wait_ms) for "
                 "its daemon to come back; nothing is carried to those ranks meanwhile",
                 id_.shortHex(), n.node.shortHex(), ranksText(n.ranks), why, desk_.cfg_.peerRestartWaitMs);
    events_.negotiationAway(id_, n.ranks);
    armAwayTimer();
}

void Negotiation::armAwayTimer() {
    std::uint64_t due = 0;
    for (const auto& n : nodes_)
        if (n.away) {
            const std::uint64_t at = n.awaySinceNs + std::uint64_t(desk_.cfg_.peerRestartWaitMs) * 1000000ull;
            due = due ? std::min(due, at) : at;
        }
    if (!due) return void(awayTimer_.cancel());
    const std::uint64_t now = monotonicNs();
    awayTimer_.expires_after(std::chrono::nanoseconds(due > now ? due - now : 0));
    awayTimer_.async_wait([w = weak_from_this()](const boost::system::error_code& ec) {
        auto self = w.lock();
        if (!ec && self) self->awayTimedOut();
    });
}

void Negotiation::awayTimedOut() {
    auto self = shared_from_this();
    if (phase_ != Phase::Ready) return;
    const std::uint64_t now = monotonicNs();
    for (auto& n : nodes_)
        if (n.away && now - n.awaySinceNs >= std::uint64_t(desk_.cfg_.peerRestartWaitMs) * 1000000ull) {
            std::string why = "node " + n.node.shortHex() + "'s daemon (" + endpointText(n.addr, n.port) +
                              ") did not come back within " + std::to_string(desk_.cfg_.peerRestartWaitMs) +
                              " ms (peer.restart_wait_ms) after its link closed";
            if (!n.refusedMeanwhile.empty()) why += "; " + n.refusedMeanwhile;
            spdlog::warn("group {}: {}", id_.shortHex(), why);
            n.away = false;
            n.toldBroken = true; // it comes back too late: refused (takeRejoin)
            return events_.negotiationBroken(id_, Errc::PeerLost, firstRank(n), why, true, 0); // may close us
        }
    armAwayTimer();
}

void Negotiation::noteRefusedLink(const PeerSession& s, const Error& why) {
    if (phase_ != Phase::Ready) return;
    for (auto& n : nodes_) {
        if (!n.away || std::memcmp(n.addr, s.remoteAddress().data(), sizeof n.addr) != 0) continue;
        const char* remedy = why.code == Errc::AuthFailed
                                 ? "its cluster key differs from this node's (peer.key_file): give every node the same key"
                                 : "a tpfabricd of another release speaks another peer protocol and cannot bring the group "
                                   "back: install one release of tpfabric on every node";
        n.refusedMeanwhile = "meanwhile a daemon at its address (" + s.endpointText() + ") was refused: " + why.describe() +
                             " (" + remedy + ")";
        spdlog::warn("group {}: a peer link from {}, the address of node {} whose daemon is away, was refused ({}): if that is "
                     "its daemon come back, it cannot bring the group back, which ends when peer.restart_wait_ms passes",
                     id_.shortHex(), s.endpointText(), n.node.shortHex(), why.describe());
    }
}

std::vector<LandedRecord> Negotiation::landedFrom(std::uint32_t ranks) const {
    std::vector<LandedRecord> out;
    for (const auto& m : plan_.regions) {
        if (!m.host) continue;
        for (std::uint32_t q = 0; q < world_; ++q) {
            if (!(ranks >> q & 1u)) continue;
            // Every stripe's row up to the epoch landed: the smallest over
            // stripes of the newer of the two phases' flags.
            std::uint64_t landed = ~0ull;
            for (std::uint32_t k = 0; k < plan_.layout.stripes; ++k) {
                std::uint64_t newest = 0;
                for (std::uint32_t p = 0; p < 2; ++p)
                    newest = std::max(newest, std::atomic_ref(*m.host->flag(p, q, k)).load(std::memory_order_acquire));
                landed = std::min(landed, newest);
            }
            out.push_back(LandedRecord{std::uint16_t(m.rank), std::uint16_t(q), 0, landed});
        }
    }
    return out;
}

void Negotiation::takeRejoin(const std::shared_ptr<PeerSession>& s, const PeerRejoin& rec) {
    auto self = shared_from_this();
    const auto refuseLink = [&](Errc code, const std::string& why) {
        spdlog::warn("peer link {}: group {}: rejoin refused: {}", s->endpointText(), id_.shortHex(), why);
        s->send(verdictMessage(kPeerReady, id_, code, kNoPeer, why));
        s->finish();
    };
    NodeLink* n = nodeOf(s->remoteNode());
    if (!n) return refuseLink(Errc::GroupMismatch, "node " + s->remoteNode().shortHex() + " serves no rank of this group");
    if (rec.flags & kRejoinAnswer) { // the answer of a node that kept the group, on the link we opened
        if (!rejoining_ || phase_ != Phase::Negotiating || n->session != s || n->recordTaken)
            return refuseLink(Errc::GroupMismatch, "a rejoin answer this daemon did not ask for");
        theirLanded_.insert(theirLanded_.end(), rec.landed.begin(), rec.landed.end());
        return takeRecord(*n, rec.group);
    }
    if (phase_ != Phase::Ready)
        return refuseLink(Errc::GroupMismatch, "the group is not open here (it broke or closed while your daemon was away)");
    // Broken here meanwhile (or that node's wait ran out), or a group this node does not wait for.
    if (toldBroken_ || n->toldBroken || (!n->away && !mayWait(*n)))
        return refuseLink(Errc::PeerLost, "the group broke here while your daemon was away (or peer.restart_wait_ms is 0 here)");
    if (!n->away) { // its old link has not been seen closing yet: it has
        if (n->session) std::exchange(n->session, nullptr)->close();
        goAway(*n, "its daemon restarted");
    }
    if (n->session) return refuseLink(Errc::GroupMismatch, "a second rejoin of the same node");
    if (auto st = takeBack(*n, s, rec); !st) {
        const std::string why = "node " + n->node.shortHex() + "'s daemon came back and could not rejoin: " + st.error().detail;
        refuseLink(st.code(), st.error().detail);
        return events_.negotiationBroken(id_, st.code(), firstRank(*n), why, true, 0); // may close us
    }
}

// The restarted node's record: our new QPs to its ranks, connected to its
// new ones and regions; our answer (what landed here from its ranks), then
// PeerReady. Its PeerReady puts the new links to use (verdict).
Status Negotiation::takeBack(NodeLink& n, const std::shared_ptr<PeerSession>& s, const PeerRejoin& rec) {
    if (auto st = checkRecord(n, rec.group); !st) return st;
    if (plan_.wire == kWireTcp) { // the answer; the node opens a new data link (takeDataLink), then PeerReady
        n.session = s;
        n.backLanded = rec.landed;
        s->send(peer_proto::encode(0, PeerRejoin{groupRecord(n), kRejoinAnswer, landedFrom(n.ranks)}));
        spdlog::info("group {}: node {}'s daemon came back ({}): waiting for its new tcp data link", id_.shortHex(),
                     n.node.shortHex(), s->endpointText());
        return okStatus();
    }
    qpsByHca_ = QpTable<std::unique_ptr<QpLink>>(world_, std::uint32_t(desk_.hcas_.size()));
    if (auto st = createQps(n); !st) return st;
    PeerRejoin answer{groupRecord(n), kRejoinAnswer, landedFrom(n.ranks)};
    auto links = std::make_shared<VerbsGroup>();
    links->world = world_;
    links->hcas = wire_->hcas;
    links->links = QpTable<std::shared_ptr<QpLink>>(world_, plan_.layout.stripes);
    if (auto st = connectQps(n, rec.group, *links); !st) return st;
    qpsByHca_.clear();
    n.session = s;
    n.backLinks = std::move(links);
    n.backLanded = rec.landed;
    s->send(peer_proto::encode(0, answer));
    s->send(verdictMessage(kPeerReady, id_, Errc::Ok, kNoPeer, ""));
    n.selfReady = true;
    spdlog::info("group {}: node {}'s daemon came back ({}): new queue pairs to ranks {} up", id_.shortHex(),
                 n.node.shortHex(), s->endpointText(), ranksText(n.ranks));
    return okStatus();
}

// Both sides of a node that came back are up (our new links, its
// PeerReady): its ranks are carried to again.
void Negotiation::maybeBack(NodeLink& n) {
    if (!n.away || !n.selfReady || !n.remoteReady || (wire_ && !n.backLinks)) return;
    if (wire_) { // its new queue pairs replace the old ones to its ranks; the rest are shared
        auto next = std::make_shared<VerbsGroup>(*wire_);
        for (std::uint32_t l = 0; l < world_; ++l)
            for (std::uint32_t r = 0; r < world_; ++r)
                for (std::uint32_t k = 0; k < plan_.layout.stripes; ++k)
                    if (n.ranks >> r & 1u) next->links.at(l, r, k) = n.backLinks->links.at(l, r, k);
        wire_ = next;
    }
    n.away = false;
    n.backLinks = nullptr;
    n.session->setState(LinkState::Ready);
    const std::uint64_t awayNs = monotonicNs() - n.awaySinceNs;
    spdlog::info("group {}: node {} rejoined after {} ms away: its ranks {} are carried to again", id_.shortHex(),
                 n.node.shortHex(), awayNs / 1000000ull, ranksText(n.ranks));
    armAwayTimer();
    events_.negotiationBack(id_, n.ranks, NodeWires{wire_, tcp_}, std::exchange(n.backLanded, {}), awayNs);
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
    toldBroken_ = true;
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
    awayTimer_.cancel();
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
                            "once our QPs or data links were up)");
}

} // namespace tpf::daemon
