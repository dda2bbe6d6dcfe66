// Groups of ranks on this node: joining, the all-or-none verdict, faults.
// Runs on the control thread only (the Asio loop). Each group's life is a
// GroupLife (group_life.hpp): every event goes through its one transition
// function, and this table carries out what the transition says. The table
// owns the proxy: the proxy sees a group through the ProxyGroup/ProxyRank
// table published here and reports back through ProxyEvents, posted onto the
// control thread. A group with ranks on other nodes owns its Negotiation
// (negotiate/), which reports back through NegotiationEvents.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/ids.hpp"
#include "daemon/config/config.hpp"
#include "daemon/groups/group_life.hpp"
#include "daemon/groups/metrics.hpp"
#include "daemon/negotiate/negotiation.hpp"
#include "daemon/negotiate/negotiation_table.hpp"
#include "daemon/proxy/proxy.hpp"
#include "proto/client_msg.hpp"

namespace tpf::daemon {

/// The connection of one rank, as the group table needs it.
class MemberLink {
public:
    virtual ~MemberLink() = default;
    /// Send the verdict (and, when ok, the region, ring and eventfd fds).
    virtual void sendVerdict(const client_proto::Verdict& v, std::vector<int> fds) = 0;
    /// Forward a same-group member's device region (ipc route) with its fd.
    virtual void sendPeerRegion(const client_proto::PeerRegion& m, int fd) = 0;
    /// Hand a same-node member's host region memfd to a host-direct rank.
    virtual void sendPeerHostRegion(const client_proto::PeerHostRegion& m, int fd) = 0;
    /// Answer a rank's Adopt (fd: the proxy eventfd when re-adopted, else -1).
    virtual void sendAdopted(const client_proto::Adopted& m, int fd) = 0;
    /// Tell an open group's rank why the group broke (before its control block says so).
    virtual void sendGroupFailed(const client_proto::GroupFailed& m) = 0;
    virtual std::int32_t pid() const = 0;
    virtual std::uint32_t uid() const = 0;
};

class GroupTable : public NegotiationEvents, private ProxyEvents {
public:
    /// Builds the proxy (`proxy`, serving `hcas`), which reports to this
    /// table; start it with proxy().start().
    GroupTable(boost::asio::io_context& io, const DaemonConfig& cfg, const NodeId& nodeId, NegotiationTable& negotiations,
               const ProxyOptions& proxy, std::vector<std::shared_ptr<VerbsHca>> hcas);

    Proxy& proxy() { return proxy_; }
    const Proxy& proxy() const { return proxy_; }

    /// A rank asks to join. The verdict arrives through link.sendVerdict, now
    /// or when the last local rank joins (or the open times out).
    void join(MemberLink& link, const client_proto::GroupOpen& m);
    /// A rank leaves: orderly (Close) or its connection dropped. Open groups
    /// break with PeerLost naming it once the proxy drained its ring (and its
    /// RDMA WRITEs completed); only a dropped connection counts as a broken
    /// group in the metrics. After a Close the group breaks only after the
    /// rank's last epoch (GroupState::Carrying): the calls up to it still
    /// complete. Its calls stay counted in the daemon's lifetime totals. A
    /// group whose last local rank left is erased then, except that after an
    /// orderly Close a group with ranks on other nodes stays (Closing) until
    /// the proxy drained it, so that the other daemons learn it closed only
    /// after its last shards landed there.
    void leave(MemberLink& link, bool orderly);
    /// The daemon is stopping (SIGTERM, SIGINT): the connections it drops
    /// from now on are logged as its own doing, not as ranks that died.
    void stopping() { stopping_ = true; }
    /// A rank reports that its open did not take the fabric path (metrics only).
    void openReport(MemberLink& link, const client_proto::OpenReport& m);
    /// A member of an open group shares its device region fd: forwarded as
    /// PeerRegion to the group's other members only. Refused (named error)
    /// when the link is in no open group.
    Status shareRegion(MemberLink& link, const client_proto::ShareRegion& m, int fd);
    /// A member aborts its group: every member's waits end with Aborted.
    void abort(MemberLink& link);
    /// A member of an open Device group reports its GPU attach: its wires
    /// per peer and its device region (status), and whether its kernels ring
    /// the proxy (the proxy stops polling its ring when they never do).
    /// Refused (named error) from a rank in no open Device group, for
    /// another group, rank or world, twice, or with wires this node cannot
    /// have (ipc or shm to another node, verbs or tcp within it, another
    /// wire across nodes than the group's).
    Status deviceAttach(MemberLink& link, const client_proto::DeviceAttach& m);
    /// A rank of a one-node Host group hands its region and ring back to
    /// this daemon, which was (re)started after the one it opened with
    /// (adopt.cpp). All or none: once every local rank of the group did,
    /// within the adoption's timeout, the proxy carries the group on from
    /// where its rings and regions show the old daemon left it, and every
    /// rank gets Adopted; else every rank is refused, the reason named.
    void adopt(MemberLink& link, const client_proto::Adopt& m, UniqueFd region, UniqueFd ring);

    // NegotiationEvents
    void negotiationAway(const GroupId& id, std::uint32_t ranks) override;
    void negotiationBack(const GroupId& id, std::uint32_t ranks, NodeWires wires,
                         const std::vector<peer_proto::LandedRecord>& landed, std::uint64_t awayNs) override;
    void negotiationReady(const GroupId& id, NodeWires wires) override;
    void negotiationRefused(const GroupId& id, Errc code, const std::string& why) override;
    void negotiationBroken(const GroupId& id, Errc code, std::uint32_t rank, const std::string& why, bool seenHere,
                           std::uint64_t leftAfter) override;

    struct Member {
        MemberLink* link = nullptr;
        std::int32_t pid = 0;
        std::uint32_t uid = 0;
        std::shared_ptr<HostRegion> region;
        std::shared_ptr<CommandRing> ring;
        /// Its DeviceAttach, once it came (Device groups only).
        std::optional<client_proto::DeviceAttach> attach{};
        /// Opened with kOpenHostDirect (Host groups only): it exchanges shards
        /// with its host-direct same-node peers through their regions (it
        /// reads their rows there) and holds their memfds.
        bool hostDirect = false;
        /// A re-adopted rank: what its ring had counted when this daemon got
        /// it (calls an earlier daemon counted), left out of this daemon's
        /// own call counters (metrics); null for a rank that opened here.
        std::shared_ptr<const RankStats> countedBefore;
    };
    struct Group {
        GroupId id{};
        std::uint32_t handle = 0;
        std::uint32_t world = 0;
        GroupLife life{""}; ///< where it is in its life: every event goes through life.on (transition)
        std::vector<client_proto::RosterEntry> roster;
        std::uint32_t localMask = 0;
        std::map<std::uint32_t, Member> members; ///< by rank, local ranks that joined and did not leave
        std::uint32_t everJoined = 0;            ///< bit per rank that joined at some time
        std::uint32_t directMask = 0;            ///< bit per local rank that joined host-direct (kOpenHostDirect)
        std::uint32_t ownerUid = 0;              ///< uid of the first rank to join (others must match, or be root)
        std::unique_ptr<boost::asio::steady_timer> openTimer; ///< until every local rank joined
        std::uint64_t agreedCap = 0;
        Layout layout{};
        std::array<std::uint8_t, kMaxWorld> wires{};
        bool gpuDoorbells = false; ///< a Device group (kOpenGpuDoorbells): its kernels may ring the proxy
        std::shared_ptr<ProxyGroup> proxyGroup;
        std::shared_ptr<Negotiation> negotiation; ///< when some rank is on another node
        std::shared_ptr<VerbsGroup> verbs;        ///< the negotiation's verbs wire, once every node is ready
        std::shared_ptr<TcpGroup> tcp;            ///< or its tcp wire
        Error lastError; ///< the failure its members' calls see (GroupLifeEffects::failCalls)
        /// A group this daemon re-adopted after a restart (Adopt), not opened.
        struct Adoption {
            std::uint64_t lostUnixNs = 0;    ///< the earliest rank's record of its old daemon's connection closing
            std::uint64_t adoptedUnixNs = 0; ///< when every local rank was re-adopted (0: not yet)
            std::uint64_t gapNs = 0;         ///< adoptedUnixNs - lostUnixNs
        };
        std::optional<Adoption> adoption;
        /// Ranks on other nodes whose daemon went away: the group waits for
        /// it to come back (Negotiation::goAway) and carries nothing to them.
        std::uint32_t awayMask = 0;
        /// Epochs to send again, by local rank, until the proxy took them
        /// (attached to every table published meanwhile).
        std::map<std::uint32_t, std::shared_ptr<Resend>> resends;

        /// The kernels of member `m` may ring the proxy: a Device group member
        /// that has not reported its wires yet, or has a proxy-route peer.
        bool ringsProxy(const Member& m) const { return gpuDoorbells && (!m.attach || client_proto::ringsProxy(*m.attach)); }
        /// Ranks that exchange shards with member `rank` without the proxy
        /// (bit per rank): the group's other ranks on this node that opened
        /// host-direct, when it did too. Both ends must: a rank that opened
        /// without (TPF_HOST_DIRECT=0, an older client) neither writes into
        /// its peers' regions nor reads theirs, so the proxy carries every
        /// shard to and from it.
        std::uint32_t directPeers(std::uint32_t rank, const Member& m) const {
            return m.hostDirect && !gpuDoorbells ? localMask & directMask & ~(1u << rank) : 0u;
        }
    };
    /// Every group, by id (status reads them).
    const std::map<GroupId, Group>& groups() const { return groups_; }
    /// Counters since the daemon started.
    const Lifetime& lifetime() const { return lifetime_; }
    std::size_t regionCount() const;
    std::uint64_t hostRegionBytes() const;
    /// Device region bytes the local members reported (DeviceAttach).
    std::uint64_t deviceRegionBytes() const;

private:
    /// A rank's break, due once the proxy drained the table version that
    /// left its ring out (GroupLifeEffects::retire).
    struct PendingBreak {
        std::uint64_t version;
        GroupId id;
        std::uint32_t rank;
        std::string why; ///< a dropped connection's (a Fault); empty for an orderly Close (Left)
        bool orderly;
        /// An orderly Close: the leaver's ring (its last doorbell's epoch) and
        /// whether it rang the proxy for every call (else its epoch is read
        /// from its shards in local peers' regions, or is unknown).
        std::shared_ptr<CommandRing> ring{};
        bool rang = false;
    };
    class Effects;

    // ProxyEvents: on the proxy thread, posted onto the control thread.
    void drained(std::uint64_t version) override;
    void badDoorbell(std::uint32_t handle, std::uint32_t rank, Error why) override;
    void peerFailed(std::uint32_t handle, std::uint32_t remoteRank, Error why) override;
    void resent(std::uint32_t handle, std::uint32_t rank, std::uint32_t peer, std::uint64_t first,
                std::uint64_t last) override;
    /// The proxy carried out everything published before `version`.
    void onDrained(std::uint64_t version);
    /// A member's doorbell was invalid: break its group.
    void onBadDoorbell(std::uint32_t handle, std::uint32_t rank, const Error& why);
    /// A queue pair to `remoteRank` failed: break its group.
    void onPeerFailed(std::uint32_t handle, std::uint32_t remoteRank, const Error& why);

    /// Hand `e` to the group's life and carry out what it says; a group that
    /// reaches Closed is erased (`g` is gone then). `ring`, `rang`: a Leave's
    /// leaver; `wires`: Ready's wire to the other nodes.
    GroupLife::Outcome transition(Group& g, const GroupEvent& e, std::shared_ptr<CommandRing> ring = nullptr,
                                  bool rang = false, NodeWires wires = {});
    Group* findByLink(MemberLink& link, std::uint32_t* rank = nullptr);
    Group* findByHandle(std::uint32_t handle);
    /// An error verdict (or, for a rank asking to be re-adopted, an error Adopted).
    void refuse(MemberLink& link, Errc code, const std::string& why, bool adopting = false);
    void tryOpen(Group& g);
    void openTimedOut(const GroupId& id);
    /// The last epoch a local rank that left posted (kCarriedUnknown when no
    /// record here shows it), once the proxy drained its ring.
    std::uint64_t lastEpochOf(const Group& g, const PendingBreak& b) const;
    /// Ranks of the roster on the node of `rank` (bit per rank).
    std::uint32_t nodeRanks(const Group& g, std::uint32_t rank) const;
    /// Every local rank's regions exist and, across nodes, every QP is up:
    /// hand the group to the proxy and the verdict to each local rank.
    void finishOpen(Group& g);
    std::uint64_t publishProxyTable();
    // adopt.cpp
    /// The first group handle this daemon gives out (random, see adopt.cpp).
    static std::uint32_t firstHandle();
    /// Rebuild member `rank`'s ring's proxy state from the ring and the regions.
    Status rebuildRing(Group& g, std::uint32_t rank, Member& m);
    /// An error Adopted for a member of an adopting group (refuse(..., true)).
    void refuseAdopted(MemberLink& link, Errc code, const std::string& why);
    /// Every local rank handed its region and ring back: rebuild each ring's
    /// proxy state, hand the group to the proxy, answer every rank.
    void finishAdoption(Group& g);
    /// What the proxy is handed of an open (or re-adopted) group.
    static std::shared_ptr<ProxyGroup> proxyGroupOf(const Group& g);
    /// Queue the epochs of the group's local ranks that `landed` (records of
    /// another node: its rank, our rank, the epoch) shows did not land there.
    static void queueResends(Group& g, const std::vector<peer_proto::LandedRecord>& landed);
    /// A re-adopted group spanning nodes: every local rank handed its region
    /// and ring back; bring the links to the other nodes back (PeerRejoin).
    void rejoin(Group& g);
    void adoptTimedOut(const GroupId& id);
    /// Refuse one rank's Adopt (not yet in a group), logged and counted.
    void refuseAdopt(MemberLink& link, const GroupId& id, std::uint32_t rank, Errc code, const std::string& why);
    /// Drop a group: its negotiation closes, the proxy forgets it.
    void erase(std::map<GroupId, Group>::iterator it);

    boost::asio::io_context& io_;
    const DaemonConfig& cfg_;
    NodeId nodeId_;
    NegotiationTable& negotiations_;
    Proxy proxy_; ///< reports to this table (ProxyEvents)
    std::map<GroupId, Group> groups_;
    std::uint32_t nextHandle_ = firstHandle();
    bool stopping_ = false;
    std::uint64_t tableVersion_ = 0;
    std::vector<PendingBreak> pendingBreaks_;
    Lifetime lifetime_; ///< counters since start, for metrics
};

} // namespace tpf::daemon
