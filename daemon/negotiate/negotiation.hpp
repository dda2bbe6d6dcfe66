// The negotiation of one group whose ranks span nodes (docs/design.md,
// "3. Negotiation", steps 3-7), on the wire its roster chose (GroupTable:
// NegotiationTable::wireFor). Verbs: its local regions registered on every
// HCA, one RC QP per (local rank, remote rank, HCA), a PeerGroup record to
// each other node's daemon over a peer link, HCA pairing by subnet, QPs
// connected from the exchanged records, PeerReady both ways. Tcp: the
// records, then one data link per other node (daemon/tcp/), then PeerReady
// both ways. The group opens when every node is ready and is refused on
// every node otherwise. Once open, the same links carry PeerBroken both ways.
//
// Owned by the group table, which it tells what happened through
// NegotiationEvents only; it never sees the table. NegotiationTable (this
// folder) routes each peer link's reports to the negotiation of its group.
// Control thread only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/ids.hpp"
#include "daemon/config/config.hpp"
#include "daemon/negotiate/peer_link.hpp"
#include "daemon/proxy/shared_state.hpp"
#include "daemon/tcp/tcp_link.hpp"
#include "daemon/verbs/qp_index.hpp"
#include "daemon/verbs/verbs_group.hpp"
#include "proto/client_msg.hpp"
#include "proto/layout.hpp"
#include "proto/peer_msg.hpp"
#include "proto/peer_wire.hpp"

namespace tpf::daemon {

class NegotiationTable;

/// How a group's ranks on other nodes are reached once every node is ready:
/// its verbs wire or its tcp wire (the other one null).
struct NodeWires {
    std::shared_ptr<VerbsGroup> verbs;
    std::shared_ptr<TcpGroup> tcp;
};

/// What a negotiation tells the group table that owns it, by group id.
class NegotiationEvents {
public:
    virtual ~NegotiationEvents() = default;
    /// Every node is ready: the group opens on `wires`. Once per negotiation.
    virtual void negotiationReady(const GroupId& id, NodeWires wires) = 0;
    /// The group cannot open: every other node was told why; refuse every
    /// local rank. Once per negotiation, and nothing follows it.
    virtual void negotiationRefused(const GroupId& id, Errc code, const std::string& why) = 0;
    /// After negotiationReady: the group broke on another node (`seenHere`
    /// false, a PeerBroken naming `rank`) or its link to one died (`seenHere`
    /// true: a fault this daemon saw). leftAfter non-zero: no fault, `rank`
    /// closed in order after that epoch (PeerVerdict::leftAfter).
    virtual void negotiationBroken(const GroupId& id, Errc code, std::uint32_t rank, const std::string& why,
                                   bool seenHere, std::uint64_t leftAfter) = 0;
    /// After negotiationReady, verbs wire: the link to the daemon serving
    /// `ranks` closed and the group waits for that daemon to come back
    /// (peer.restart_wait_ms): nothing is carried to those ranks meanwhile.
    /// negotiationBack or negotiationBroken follows.
    virtual void negotiationAway(const GroupId& id, std::uint32_t ranks) = 0;
    /// That daemon came back (restarted, it re-adopted the group): the group
    /// goes on over `wires` (new queue pairs or data link to `ranks`);
    /// `landed`: what its record says landed in its ranks' regions, from
    /// which this node's ranks' later epochs are sent again; `awayNs`: how
    /// long its link was closed.
    virtual void negotiationBack(const GroupId& id, std::uint32_t ranks, NodeWires wires,
                                 const std::vector<peer_proto::LandedRecord>& landed, std::uint64_t awayNs) = 0;
};

/// A local rank's region as the negotiation registers it.
struct LocalRegion {
    std::uint32_t rank = 0;
    std::uint8_t* base = nullptr;       ///< the daemon's mapping
    std::uint64_t bytes = 0;            ///< Layout::totalBytes()
    std::shared_ptr<const void> memory; ///< keeps the mapping alive while registered
    std::shared_ptr<HostRegion> host;   ///< the same region: where the tcp wire lands frames and wakes the rank
};

/// What the group table fixed when the last local rank joined.
struct NegotiationPlan {
    std::uint32_t handle = 0;    ///< the group's handle, named in proxy reports of its QPs
    std::uint8_t wire = kWireVerbs; ///< kWireVerbs or kWireTcp, from the roster (NegotiationTable::wireFor)
    Layout layout{};             ///< stripes = this node's HCAs (verbs), 1 (tcp)
    std::uint64_t agreedCap = 0; ///< from the roster and our daemon.max_bytes; every other daemon's must reach it
    std::vector<LocalRegion> regions;
};

/// The daemon of another node serving ranks of the group.
struct NodeLink {
    NodeId node{};
    std::uint32_t ranks = 0;  ///< bit r: rank r is on that node
    std::uint8_t addr[16] = {};
    std::uint16_t port = 0;
    bool weConnect = false;   ///< our node id is the smaller one
    std::shared_ptr<PeerSession> session;
    bool recordTaken = false; ///< its PeerGroup was checked (and, verbs, our QPs connected)
    bool selfReady = false;   ///< our QPs (tcp: the data link) towards it are up and PeerReady sent
    bool remoteReady = false; ///< its PeerReady (ok) arrived
    std::uint64_t daemonMax = 0; ///< its daemon.max_bytes, once its record was taken (0 before)
    Bytes ourRecord;          ///< PeerGroup we send it (PeerRejoin when this daemon re-adopted the group)
    /// Ready: its link closed and the group waits for its daemon to come back
    /// (since awaySinceNs, CLOCK_MONOTONIC) with a PeerRejoin.
    bool away = false;
    std::uint64_t awaySinceNs = 0;
    /// Away: a link from its address refused meanwhile (another peer
    /// protocol, another cluster key), named when the wait ends.
    std::string refusedMeanwhile;
    /// It sent PeerBroken (a fault there, or its ranks' orderly leaves): it
    /// closes the link on purpose, and a closed link is not waited for.
    bool toldBroken = false;
    /// Away, its PeerRejoin taken: our new links to its ranks (the rest
    /// null), in use once its PeerReady comes, and what it said landed there.
    std::shared_ptr<VerbsGroup> backLinks;
    std::vector<peer_proto::LandedRecord> backLanded;
};

class Negotiation : public std::enable_shared_from_this<Negotiation> {
public:
    enum class Phase {
        Waiting,     ///< local ranks still joining; links for the group are parked
        Negotiating, ///< start() ran: records, QPs, verdicts
        Ready,       ///< negotiationReady was told; links carry PeerBroken
        Stopped,     ///< refused, broken before it was ready, or closed
    };

    /// Call NegotiationTable::create, which registers it.
    Negotiation(NegotiationTable& desk, NegotiationEvents& events, const GroupId& id,
                std::vector<client_proto::RosterEntry> roster);
    ~Negotiation();
    Negotiation(const Negotiation&) = delete;
    Negotiation& operator=(const Negotiation&) = delete;

    /// Every local rank joined: bring up the wire and talk to every other
    /// node. A failure, now or later, comes back as negotiationRefused.
    void start(NegotiationPlan plan);
    /// This daemon re-adopted the group after a restart: bring up the wire,
    /// open a link to every other node and send PeerRejoin with what landed
    /// in our ranks' regions from theirs (their flags); each node that kept
    /// the group answers with its own. negotiationReady or
    /// negotiationRefused follows, as after start(); theirLanded() then
    /// holds what the answers said landed there.
    void startRejoin(NegotiationPlan plan);
    /// What the other nodes' PeerRejoin answers said landed in their ranks' regions.
    const std::vector<peer_proto::LandedRecord>& theirLanded() const { return theirLanded_; }
    /// Give up (a local rank left, the open cannot complete): every node
    /// hears why (PeerReady with the error), then negotiationRefused.
    void fail(Errc code, const std::string& why);
    /// The group broke on this node: every node hears it (PeerBroken). A
    /// negotiation still running stops. leftAfter non-zero: `rank` closed in
    /// order after that epoch (PeerVerdict::leftAfter), no fault.
    void tellBroken(Errc code, std::uint32_t rank, const std::string& why, std::uint64_t leftAfter = 0);
    /// The group is gone here: links finish, nothing more is reported.
    void close();

    const GroupId& id() const { return id_; }
    Phase phase() const { return phase_; }
    const std::vector<NodeLink>& nodes() const { return nodes_; }
    /// The group's verbs wire: its queue pairs as they come up, then as the
    /// proxy posts on them (null before start(), and on the tcp wire).
    const VerbsGroup* wire() const { return wire_.get(); }
    /// The group's tcp wire: its data links as they come up (null before
    /// start(), and on the verbs wire).
    const TcpGroup* tcp() const { return tcp_.get(); }
    std::uint8_t wireKind() const { return plan_.wire; }
    /// Whether `node` serves a rank of the roster.
    bool inRoster(const NodeId& node) const;
    NodeLink* nodeOf(const NodeId& node);

    // From NegotiationTable, for a link of this group's.
    /// The remote's PeerGroup record on link `s` (Negotiating only).
    void takeLink(const std::shared_ptr<PeerSession>& s, const peer_proto::PeerGroup& rec);
    /// The remote's PeerRejoin on link `s`: a node whose daemon restarted
    /// comes back to this Ready group, or (rejoining) a node answers ours.
    void takeRejoin(const std::shared_ptr<PeerSession>& s, const peer_proto::PeerRejoin& rec);
    /// A link accepted from `s`'s address failed its handshake (`why`:
    /// BadMagic, VersionMismatch, AuthFailed): if a node away from this group
    /// has that address, it may be its daemon come back unable to rejoin.
    /// Noted, and named when the wait for that node ends: an unauthenticated
    /// link does not end the wait itself.
    void noteRefusedLink(const PeerSession& s, const Error& why);
    /// PeerReady or PeerBroken on the link of node `n` (n.session).
    void verdict(NodeLink& n, std::uint16_t opcode, const peer_proto::PeerVerdict& v);
    /// Link `s` of a node of the group failed (why.code AuthFailed: a
    /// handshake refused, maybe before the link was attached).
    void linkLost(const PeerSession& s, const Error& why);
    /// The accepted link `s` is the tcp data link of its node: take its
    /// socket, or close it when the group expects none from there now.
    void takeDataLink(const std::shared_ptr<PeerSession>& s);
    /// The proxy could not send to `remoteRank` on the tcp wire: true when
    /// the group waits for that rank's node's daemon to come back (its data
    /// link went with the daemon), false when the failure breaks the group.
    bool linkFailed(std::uint32_t remoteRank, const std::string& why);

private:
    Status bringUp();
    Status buildWire();
    /// Our PeerGroup record for node `n` (its ranks' QPs from qpsByHca_).
    peer_proto::PeerGroup groupRecord(const NodeLink& n) const;
    Bytes recordFor(const NodeLink& n) const;
    /// Create our QPs to the ranks of `n` on every HCA, into qpsByHca_.
    Status createQps(const NodeLink& n);
    /// Connect our QPs to the ranks of `n` from its record, into `into`'s links.
    Status connectQps(NodeLink& n, const peer_proto::PeerGroup& rec, VerbsGroup& into);
    /// What landed in our ranks' regions from the ranks of `ranks` (bit per rank).
    std::vector<peer_proto::LandedRecord> landedFrom(std::uint32_t ranks) const;
    /// Ready: node `n`'s link closed; the group waits for its daemon to come back.
    void goAway(NodeLink& n, const std::string& why);
    /// Ready: a node whose daemon restarted sends PeerRejoin on link `s`.
    Status takeBack(NodeLink& n, const std::shared_ptr<PeerSession>& s, const peer_proto::PeerRejoin& rec);
    /// Node `n`'s closed link is waited for (its daemon may restart and bring
    /// the group back): peer.restart_wait_ms set, and no PeerBroken either way before.
    bool mayWait(const NodeLink& n) const;
    /// The first rank of `n`, as a PeerLost names it.
    std::uint32_t firstRank(const NodeLink& n) const;
    void armAwayTimer();
    void awayTimedOut();
    void attach(NodeLink& n, const std::shared_ptr<PeerSession>& s);
    void takeRecord(NodeLink& n, const peer_proto::PeerGroup& rec);
    /// What both wires check in the remote's record: world, ranks, caps, wire.
    Status checkRecord(NodeLink& n, const peer_proto::PeerGroup& rec);
    /// Tcp: the side with the smaller node id opens the data link to `n`.
    void openDataLink(NodeLink& n);
    void dataLinkUp(NodeLink& n, UniqueFd fd);
    /// The receiver lost the data link to `node` (posted from its thread).
    void dataLinkLost(const NodeId& node, const TcpLink* which, const Error& why);
    /// Node `n` came back and its rejoin failed on the way: wait for it again.
    void rejoinFailed(NodeLink& n, const std::string& why);
    /// Both sides of a node that came back are up: carry to its ranks again.
    void maybeBack(NodeLink& n);
    /// Our side towards `n` is up: PeerReady to it.
    void selfReady(NodeLink& n);
    /// Tell the group table the PeerBroken verdicts held in order, up to a
    /// leave whose node's data link has not landed its last frames yet.
    void releaseVerdicts();
    void maybeReady();
    void armTimer(std::uint32_t ms);
    void timedOut();

    NegotiationTable& desk_;
    NegotiationEvents& events_;
    GroupId id_;
    std::uint32_t world_;
    std::uint32_t localMask_ = 0;
    std::vector<client_proto::RosterEntry> roster_;
    Phase phase_ = Phase::Waiting;
    NegotiationPlan plan_;
    std::vector<NodeLink> nodes_;
    std::shared_ptr<VerbsGroup> wire_;
    std::shared_ptr<TcpGroup> tcp_;
    bool rejoining_ = false;                          ///< startRejoin: this daemon re-adopted the group
    bool toldBroken_ = false;                         ///< tellBroken: the group broke (or a rank left) here
    std::vector<peer_proto::LandedRecord> ourLanded_;   ///< rejoining: sent in our PeerRejoin
    std::vector<peer_proto::LandedRecord> theirLanded_; ///< rejoining: from the answers
    /// A PeerBroken the group table has not been told yet (releaseVerdicts).
    struct HeldVerdict {
        Errc code;
        std::uint32_t rank;
        std::string why;
        std::uint64_t leftAfter;
        const TcpLink* link; ///< a leave on the tcp wire: told once this drained
        std::uint64_t sinceNs;
    };
    std::deque<HeldVerdict> heldVerdicts_;
    std::unique_ptr<boost::asio::steady_timer> verdictTimer_;
    QpTable<std::unique_ptr<QpLink>> qpsByHca_; ///< lanes are this node's HCAs, until paired
    boost::asio::steady_timer timer_;
    std::uint64_t timerGen_ = 0;
    boost::asio::steady_timer awayTimer_; ///< the first away node's peer.restart_wait_ms
};

} // namespace tpf::daemon
