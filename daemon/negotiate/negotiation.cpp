// Groups spanning nodes (DESIGN.md §3 steps 3-7): regions registered on every
// HCA, one RC QP per (local rank, remote rank, HCA), a PeerGroup record to
// each other node's daemon over a peer link, HCA pairing by subnet, QPs
// connected from the exchanged records, PeerReady both ways; the group opens
// when every node is ready, and is refused on every node otherwise.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "daemon/groups/groups.hpp"
#include "proto/pairing.hpp"

namespace tpf::daemon {

using namespace client_proto;
using namespace peer_proto;

namespace {
constexpr std::uint32_t kMaxSendWr = 256;

std::string shortHex(const std::uint8_t (&b)[16]) { return hexText(b, 6); }
std::string shortId(const GroupId& id) { return id.shortHex(); }

HcaAddress addressOf(const std::uint8_t (&gid)[16], const std::uint8_t (&subnet)[16], std::uint8_t prefixLen) {
    HcaAddress a;
    std::memcpy(a.gid.data(), gid, 16);
    std::memcpy(a.subnet.data(), subnet, 16);
    a.prefixLen = prefixLen;
    return a;
}

std::string ranksText(std::uint32_t mask) {
    std::string s;
    for (std::uint32_t r = 0; r < 32; ++r)
        if (mask >> r & 1u) s += (s.empty() ? "" : ",") + std::to_string(r);
    return s;
}
} // namespace

GroupTable::NodeLink* GroupTable::nodeOf(Group& g, const NodeId& node) {
    for (auto& n : g.nodes)
        if (n.node == node) return &n;
    return nullptr;
}

Status GroupTable::startNegotiation(Group& g) {
    g.state = State::Negotiating;
    if (const Error* e = refusedGroup(g.id, false)) return *e;
    for (std::uint32_t r = 0; r < g.world; ++r) {
        if (g.localMask >> r & 1u) continue;
        const auto& e = g.roster[r];
        const NodeId node = NodeId::of(e.nodeId);
        NodeLink* n = nodeOf(g, node);
        if (!n) {
            if (e.endpointPort == 0)
                return Error{Errc::Unavailable, "rank " + std::to_string(r) + "'s daemon (node " + shortHex(e.nodeId) +
                                                    ") has no peer link (peer.listen is unset there)"};
            n = &g.nodes.emplace_back();
            n->node = node;
            std::memcpy(n->addr, e.endpointAddr, 16);
            n->port = e.endpointPort;
            n->weConnect = nodeId_ < node; // bytewise, as both nodes compare
        }
        n->ranks |= 1u << r;
    }
    if (auto s = buildVerbs(g); !s) return s;
    for (auto& n : g.nodes) n.ourRecord = recordFor(g, n);

    const GroupId id = g.id;
    g.openTimer->expires_after(std::chrono::milliseconds(cfg_.openTimeoutMs));
    g.openTimer->async_wait([this, id](const boost::system::error_code& ec) {
        if (!ec) openTimedOut(id);
    });
    spdlog::info("group {}: negotiating with {} other node(s) over {} HCA(s)", shortId(id), g.nodes.size(), hcas_.size());
    // Links whose record already arrived are taken last: taking one may end the group.
    std::vector<Parked> ready;
    for (auto& n : g.nodes) {
        if (n.weConnect) {
            n.session = peers_->connect(n.addr, n.port, n.node, n.ourRecord);
            continue;
        }
        if (auto r = refusals_.find(n.node);
            r != refusals_.end() && monotonicNs() - r->second.atNs < std::uint64_t(cfg_.openTimeoutMs) * 1000000ull)
            return Error{r->second.why.code, "peer daemon " + endpointText(n.addr, n.port) + ": " + r->second.why.detail};
        auto it = std::find_if(parked_.begin(), parked_.end(), [&](const Parked& p) {
            return id.is(p.record.fixed.groupId) && p.session->remoteNode() == n.node;
        });
        if (it != parked_.end()) {
            ready.push_back(std::move(*it));
            parked_.erase(it);
        }
    }
    for (auto& p : ready) {
        auto git = groups_.find(id);
        if (git == groups_.end() || git->second.state != State::Negotiating) {
            p.session->finish();
            continue;
        }
        NodeLink* n = nodeOf(git->second, p.session->remoteNode());
        attach(git->second, *n, p.session);
        takeRecord(git->second, *n, p.record);
    }
    return okStatus();
}

Status GroupTable::buildVerbs(Group& g) {
    const std::uint32_t nh = std::uint32_t(hcas_.size());
    auto vg = std::make_shared<VerbsGroup>();
    vg->world = g.world;
    vg->hcas = nh;
    vg->mrs.resize(std::size_t(g.world) * nh);
    vg->links = QpTable<std::unique_ptr<QpLink>>(g.world, g.layout.stripes);
    g.qpsByHca = QpTable<std::unique_ptr<QpLink>>(g.world, nh);
    for (auto& [l, m] : g.members) {
        for (std::uint32_t a = 0; a < nh; ++a) {
            auto mr = VerbsMr::reg(hcas_[a], m.region->map.data(), m.region->layout.totalBytes(), m.region);
            if (!mr) return Error{mr.code(), "registering rank " + std::to_string(l) + "'s region on " + hcas_[a]->name() +
                                                 ": " + mr.error().detail + " (LimitMEMLOCK=infinity?)"};
            vg->mrs[vg->mrIndex(l, a)] = std::move(*mr);
        }
        for (std::uint32_t r = 0; r < g.world; ++r) {
            if (g.localMask >> r & 1u) continue;
            for (std::uint32_t a = 0; a < nh; ++a) {
                auto qp = QpLink::create(hcas_[a], kMaxSendWr, cfg_.inflightBytes);
                if (!qp) return Error{qp.code(), "creating a QP on " + hcas_[a]->name() + ": " + qp.error().detail};
                (*qp)->groupHandle = g.handle;
                (*qp)->localRank = l;
                (*qp)->remoteRank = r;
                (*qp)->localBase = m.region->map.data();
                (*qp)->lkey = vg->mr(l, a)->lkey();
                g.qpsByHca.at(l, r, a) = std::move(*qp);
            }
        }
    }
    g.verbs = std::move(vg);
    return okStatus();
}

Bytes GroupTable::recordFor(const Group& g, const NodeLink& n) const {
    const std::uint32_t nh = std::uint32_t(hcas_.size());
    PeerGroup rec;
    g.id.copyTo(rec.fixed.groupId);
    nodeId_.copyTo(rec.fixed.nodeId);
    rec.fixed.world = g.world;
    rec.fixed.localRanks = g.localMask;
    for (std::uint32_t r = 0; r < g.world; ++r) rec.fixed.caps[r] = g.roster[r].maxBytes;
    for (std::uint32_t a = 0; a < nh; ++a) {
        const auto& c = hcas_[a]->card();
        HcaRecord h{};
        std::memcpy(h.gid, c.gid, 16);
        std::memcpy(h.subnet, c.subnet, 16);
        h.prefixLen = c.prefixLen;
        h.port = c.port;
        h.mtu = c.mtu;
        h.gidIndex = c.gidIndex;
        rec.hcas.push_back(h);
    }
    for (const auto& [l, m] : g.members)
        for (std::uint32_t a = 0; a < nh; ++a) {
            const VerbsMr* mr = g.verbs->mr(l, a);
            rec.regions.push_back(RegionRecord{l, a, mr->addr(), mr->bytes(), mr->rkey(), 0});
            for (std::uint32_t r = 0; r < g.world; ++r)
                if (n.ranks >> r & 1u) {
                    const auto& qp = g.qpsByHca.at(l, r, a);
                    rec.qps.push_back(QpRecord{std::uint8_t(a), 0, std::uint16_t(l), std::uint16_t(r), 0, qp->qpn(), qp->psn()});
                }
        }
    return peer_proto::encode(0, rec);
}

void GroupTable::attach(Group& g, NodeLink& n, const std::shared_ptr<PeerSession>& s) {
    n.session = s;
    if (!n.weConnect) s->send(n.ourRecord);
    spdlog::info("group {}: peer link {} to node {} attached", shortId(g.id), s->endpointText(), n.node.shortHex());
}

// The remote's record: pair, connect our QPs, say PeerReady (or why not).
void GroupTable::takeRecord(Group& g, NodeLink& n, const PeerGroup& rec) {
    if (auto s = connectQps(g, n, rec); !s)
        return failNegotiation(g, s.code(), "with node " + n.node.shortHex() + " (" + n.session->endpointText() +
                                                "): " + s.error().detail);
    n.session->send(verdictMessage(kPeerReady, g.id, Errc::Ok, kNoPeer, ""));
    n.selfReady = true;
    // Our QPs are up towards every node: the others' must follow within verbs.qp_timeout_ms.
    if (std::all_of(g.nodes.begin(), g.nodes.end(), [](const NodeLink& x) { return x.selfReady; })) {
        const GroupId id = g.id;
        g.openTimer->expires_after(std::chrono::milliseconds(cfg_.qpTimeoutMs));
        g.openTimer->async_wait([this, id](const boost::system::error_code& ec) {
            if (!ec) openTimedOut(id);
        });
    }
    maybeOpen(g);
}

Status GroupTable::connectQps(Group& g, NodeLink& n, const PeerGroup& rec) {
    const auto& f = rec.fixed;
    if (f.world != g.world || f.localRanks != n.ranks)
        return Error{Errc::GroupMismatch, "it serves ranks " + ranksText(f.localRanks) + " of world " + std::to_string(f.world) +
                                              ", our roster says ranks " + ranksText(n.ranks) + " of world " +
                                              std::to_string(g.world)};
    for (std::uint32_t r = 0; r < g.world; ++r)
        if (f.caps[r] != g.roster[r].maxBytes)
            return Error{Errc::CapMismatch, "rank " + std::to_string(r) + "'s cap differs between the nodes"};
    std::vector<HcaAddress> ours, theirs;
    for (const auto& h : hcas_) ours.push_back(addressOf(h->card().gid, h->card().subnet, h->card().prefixLen));
    for (const auto& h : rec.hcas) theirs.push_back(addressOf(h.gid, h.subnet, h.prefixLen));
    auto pairs = pairHcas(ours, theirs);
    if (!pairs) return pairs.error();
    if (pairs->size() != g.layout.stripes)
        return Error{Errc::NonOneToOnePairing, std::to_string(pairs->size()) + " HCA pairs for " +
                                                   std::to_string(g.layout.stripes) + " stripes"};
    for (std::uint32_t k = 0; k < pairs->size(); ++k) {
        const std::uint32_t a = (*pairs)[k].local, b = (*pairs)[k].remote;
        for (const auto& [l, m] : g.members)
            for (std::uint32_t r = 0; r < g.world; ++r) {
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
                if (region->bytes != g.layout.totalBytes())
                    return Error{Errc::GroupMismatch, "rank " + std::to_string(r) + "'s region is " +
                                                          std::to_string(region->bytes) + " bytes, ours " +
                                                          std::to_string(g.layout.totalBytes()) + " (different layout)"};
                RemoteQp rq;
                rq.qpn = qp->qpn;
                rq.psn = qp->psn;
                std::memcpy(rq.gid, rec.hcas[b].gid, 16);
                rq.mtu = rec.hcas[b].mtu;
                rq.regionAddr = region->addr;
                rq.rkey = region->rkey;
                auto& link = g.qpsByHca.at(l, r, a);
                if (!link) return Error{Errc::GroupMismatch, "QP of rank " + std::to_string(l) + " to " + std::to_string(r) + " used twice"};
                link->rail = k;
                if (auto s = link->connect(rq); !s) return s;
                g.verbs->links.at(l, r, k) = std::move(link);
            }
    }
    spdlog::info("group {}: QPs to node {} up ({} rail(s))", shortId(g.id), n.node.shortHex(), pairs->size());
    return okStatus();
}

void GroupTable::maybeOpen(Group& g) {
    for (const auto& n : g.nodes)
        if (!n.selfReady || !n.remoteReady) return;
    for (auto& n : g.nodes) n.session->setState("ready");
    g.qpsByHca.clear();
    finishOpen(g);
}

// Tell every node why, refuse every local rank, drop the group.
void GroupTable::failNegotiation(Group& g, Errc code, const std::string& why) {
    const Bytes v = verdictMessage(kPeerReady, g.id, code, kNoPeer, why);
    for (auto& n : g.nodes)
        if (n.session) n.session->send(v);
    const GroupId id = g.id;
    g.state = State::Broken;
    refuseAll(g, code, why);
    eraseIfEmpty(id);
}

Bytes GroupTable::verdictMessage(std::uint16_t opcode, const GroupId& id, Errc code, std::uint32_t missingRank,
                                 const std::string& why) {
    PeerVerdict v{};
    id.copyTo(v.groupId);
    v.errc = std::uint16_t(code);
    v.missingRank = missingRank;
    setText(v.reason, why.substr(0, sizeof v.reason - 1));
    return peer_proto::encode(opcode, 0, v);
}

const Error* GroupTable::refusedGroup(const GroupId& id, bool ours) {
    auto it = refusedGroups_.find(id);
    if (it == refusedGroups_.end() || it->second.ours != ours) return nullptr;
    if (monotonicNs() - it->second.atNs > std::uint64_t(cfg_.openTimeoutMs) * 1000000ull) {
        refusedGroups_.erase(it);
        return nullptr;
    }
    return &it->second.why;
}

// A group this node refused before negotiating (a local check, a roster
// mismatch, the open timeout): every other node of its roster is told with a
// PeerReady carrying the reason, on a link opened for that alone (or on the
// link it already parked here), so that its ranks are refused at once rather
// than at their open timeout.
void GroupTable::tellRefused(const GroupId& id, const std::vector<client_proto::RosterEntry>& roster, Errc code,
                             const std::string& why) {
    if (!peers_ || !peers_->enabled()) return;
    const bool told = refusedGroup(id, true) != nullptr;
    const std::uint64_t now = monotonicNs();
    std::erase_if(refusedGroups_, [&](const auto& kv) {
        return now - kv.second.atNs > std::uint64_t(cfg_.openTimeoutMs) * 1000000ull;
    });
    if (refusedGroups_.size() >= kMaxRefusedGroups) refusedGroups_.erase(refusedGroups_.begin());
    refusedGroups_[id] = GroupRefusal{Error{code, why}, now, true};
    if (told) return;
    const Bytes v = verdictMessage(kPeerReady, id, code, kNoPeer, why);
    std::vector<NodeId> done{nodeId_};
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
        spdlog::info("group {}: telling node {} ({}) that it was refused here", shortId(id), shortHex(e.nodeId),
                     endpointText(e.endpointAddr, e.endpointPort));
        peers_->connect(e.endpointAddr, e.endpointPort, node, v, true);
    }
}

void GroupTable::closePeers(Group& g) {
    for (auto& n : g.nodes)
        if (n.session) std::exchange(n.session, nullptr)->finish();
    std::erase_if(parked_, [&](const Parked& p) { return g.id.is(p.record.fixed.groupId); });
}

// ---- PeerHandler ------------------------------------------------------------

void GroupTable::peerRecord(const std::shared_ptr<PeerSession>& s, PeerGroup rec) {
    const GroupId id = GroupId::of(rec.fixed.groupId);
    const NodeId from = NodeId::of(rec.fixed.nodeId);
    auto refuseLink = [&](const std::string& why) {
        spdlog::warn("peer link {}: group {}: {}", s->endpointText(), shortId(id), why);
        s->send(verdictMessage(kPeerReady, id, Errc::GroupMismatch, kNoPeer, why));
        s->finish();
    };
    if (from != s->remoteNode()) return refuseLink("record of node " + from.shortHex() + " on the link of another node");
    refusals_.erase(from);
    if (const Error* e = refusedGroup(id, true)) {
        spdlog::info("peer link {}: group {} was refused here: {}", s->endpointText(), shortId(id), e->detail);
        s->send(verdictMessage(kPeerReady, id, e->code, kNoPeer, e->detail));
        return s->finish();
    }
    auto it = groups_.find(id);
    if (s->accepted() && (it == groups_.end() || it->second.state == State::Pending)) {
        // Our ranks have not all joined yet: hold the link until they have.
        const std::uint64_t now = monotonicNs();
        std::erase_if(parked_, [&](const Parked& p) {
            const bool old = now - p.sinceNs > std::uint64_t(cfg_.openTimeoutMs) * 1000000ull;
            if (old) p.session->finish();
            return old;
        });
        parked_.push_back(Parked{s, std::move(rec), now});
        return;
    }
    if (it == groups_.end() || it->second.state != State::Negotiating) return refuseLink("no such group negotiating here");
    Group& g = it->second;
    NodeLink* n = nodeOf(g, from);
    if (!n) return refuseLink("node " + from.shortHex() + " serves no rank of this group");
    if (s->accepted()) {
        if (n->session) return refuseLink("a second link for the same group and node");
        attach(g, *n, s);
    } else if (n->session != s) {
        return refuseLink("record on a link the group did not open");
    }
    takeRecord(g, *n, rec);
}

void GroupTable::peerVerdict(const std::shared_ptr<PeerSession>& s, std::uint16_t opcode, const PeerVerdict& v) {
    const GroupId id = GroupId::of(v.groupId);
    auto it = groups_.find(id);
    if (opcode == kPeerReady && v.errc && s->accepted() &&
        (it == groups_.end() || it->second.state == State::Pending || nodeOf(it->second, s->remoteNode()) == nullptr ||
         nodeOf(it->second, s->remoteNode())->session != s)) {
        // A refusal on a link opened for it alone (tellRefused on that node).
        Errc code = Errc::Unavailable;
        errcFromWire(v.errc, code);
        std::string reason;
        getText(v.reason, reason);
        const std::string why = "node " + s->remoteNode().shortHex() + " (" + s->endpointText() +
                                ") refused the group: " + reason;
        s->finish();
        if (it != groups_.end() && it->second.state == State::Negotiating) {
            if (nodeOf(it->second, s->remoteNode())) failNegotiation(it->second, code, why);
            return;
        }
        if (it != groups_.end() && it->second.state != State::Pending) return;
        if (it != groups_.end() && std::none_of(it->second.roster.begin(), it->second.roster.end(), [&](const auto& e) {
                return s->remoteNode().is(e.nodeId);
            }))
            return;
        spdlog::info("group {}: {}", shortId(id), why);
        if (refusedGroups_.size() >= kMaxRefusedGroups) refusedGroups_.erase(refusedGroups_.begin());
        refusedGroups_[id] = GroupRefusal{Error{code, why}, monotonicNs(), false};
        return;
    }
    if (it == groups_.end()) return;
    Group& g = it->second;
    NodeLink* n = nodeOf(g, s->remoteNode());
    if (!n || n->session != s) return;
    Errc code = Errc::PeerLost;
    errcFromWire(v.errc, code);
    std::string reason;
    getText(v.reason, reason);
    const std::string from = "node " + n->node.shortHex() + " (" + s->endpointText() + ")";
    if (opcode == kPeerReady) {
        if (g.state != State::Negotiating) return;
        if (v.errc) return failNegotiation(g, code, from + " refused the group: " + reason);
        n->remoteReady = true;
        return maybeOpen(g);
    }
    if (g.state == State::Negotiating) return failNegotiation(g, code, from + ": " + reason);
    if (g.state == State::Open || code == Errc::Aborted)
        breakGroup(g, code, v.missingRank, from + ": " + reason, false, false); // counted where it was seen
}

void GroupTable::peerLost(const std::shared_ptr<PeerSession>& s, const Error& why) {
    std::erase_if(parked_, [&](const Parked& p) { return p.session == s; });
    if (why.code == Errc::AuthFailed && s->accepted()) refusals_[s->remoteNode()] = Refusal{why, monotonicNs()};
    std::vector<GroupId> hit;
    for (auto& [id, g] : groups_)
        for (auto& n : g.nodes)
            if (n.session == s || (!n.session && !n.weConnect && n.node == s->remoteNode() && why.code == Errc::AuthFailed &&
                                   g.state == State::Negotiating))
                hit.push_back(id);
    for (const auto& id : hit) {
        auto it = groups_.find(id);
        if (it == groups_.end()) continue;
        Group& g = it->second;
        NodeLink* n = nodeOf(g, s->remoteNode());
        const std::string what = "peer daemon " + s->endpointText() + ": " + why.describe();
        if (g.state == State::Negotiating) {
            failNegotiation(g, why.code == Errc::AuthFailed ? Errc::AuthFailed : Errc::PeerLost, what);
        } else if (g.state == State::Open) {
            std::uint32_t first = 0;
            while (n && first < g.world && !(n->ranks >> first & 1u)) ++first;
            breakGroup(g, Errc::PeerLost, first, what, false);
        }
    }
}

nlohmann::json GroupTable::peersStatus() const {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [id, g] : groups_)
        for (const auto& n : g.nodes) {
            nlohmann::json qps = nlohmann::json::array();
            if (g.verbs)
                for (const auto& l : g.verbs->links) {
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
            out.push_back({{"group", id.hex()},
                           {"node_id", n.node.hex()},
                           {"endpoint", endpointText(n.addr, n.port)},
                           {"role", n.weConnect ? "connect" : "accept"},
                           {"ranks", ranksText(n.ranks)},
                           {"state", n.session ? n.session->state() : std::string(g.state == State::Negotiating ? "waiting" : "closed")},
                           {"qps", qps},
                           {"last_error", n.session && n.session->lastError().code != Errc::Ok ? n.session->lastError().describe()
                                                                                              : std::string()}});
        }
    return out;
}

} // namespace tpf::daemon
