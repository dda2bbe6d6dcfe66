// Groups of ranks on this node: joining, the all-or-none verdict, faults.
// Runs on the control thread only (the Asio loop); the proxy sees a group
// through the ProxyGroup/ProxyRank table this publishes. A group with ranks
// on other nodes owns its Negotiation (negotiate/), which reports back through
// NegotiationEvents.
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
    virtual std::int32_t pid() const = 0;
    virtual std::uint32_t uid() const = 0;
};

class GroupTable : public NegotiationEvents {
public:
    GroupTable(boost::asio::io_context& io, const DaemonConfig& cfg, const NodeId& nodeId, Proxy& proxy,
               NegotiationTable& negotiations);

    /// A rank asks to join. The verdict arrives through link.sendVerdict, now
    /// or when the last local rank joins (or the open times out).
    void join(MemberLink& link, const client_proto::GroupOpen& m);
    /// A rank leaves: orderly (Close) or its connection dropped. Open groups
    /// break with PeerLost naming it once the proxy drained its ring (and its
    /// RDMA WRITEs completed); only a dropped connection counts as a broken
    /// group in the metrics. After a Close the group breaks only after the
    /// rank's last epoch (rankLeft): the calls up to it still complete. Its calls stay counted in the daemon's lifetime
    /// totals. A group whose last local rank left is erased then, except
    /// that after an orderly Close a group with ranks on other nodes stays
    /// (closingAt) until the proxy drained it, so that the other daemons learn
    /// it closed only after its last shards landed there.
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
    /// have (ipc to another node, shm to another node, verbs within it).
    Status deviceAttach(MemberLink& link, const client_proto::DeviceAttach& m);
    /// A member's doorbell was invalid (proxy report): break its group.
    void badDoorbell(std::uint32_t handle, std::uint32_t rank, const Error& why);
    /// The proxy carried out everything published before `version`.
    void drained(std::uint64_t version);
    /// The proxy saw a queue pair to `remoteRank` fail: break its group.
    void peerFailed(std::uint32_t handle, std::uint32_t remoteRank, const Error& why);

    // NegotiationEvents
    void negotiationReady(const GroupId& id, std::shared_ptr<VerbsGroup> wire) override;
    void negotiationRefused(const GroupId& id, Errc code, const std::string& why) override;
    void negotiationBroken(const GroupId& id, Errc code, std::uint32_t rank, const std::string& why, bool seenHere,
                           std::uint64_t leftAfter) override;

    enum class State { Pending, Negotiating, Open, Broken };
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
    };
    struct Group {
        GroupId id{};
        std::uint32_t handle = 0;
        std::uint32_t world = 0;
        State state = State::Pending;
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
        std::shared_ptr<VerbsGroup> verbs;        ///< the negotiation's wire, once every node is ready
        Error lastError;
        bool brokenCounted = false; ///< counted in the lifetime metrics as broken
        /// Its last local rank closed in order while ranks on other nodes may
        /// still wait for its shards: the table version published then. The
        /// group (and its peer link) stays until the proxy drained that
        /// version, i.e. every shard its ranks posted landed (Proxy::drained).
        std::optional<std::uint64_t> closingAt;
        /// Broken by orderly leaves only (each rank's Close after its last
        /// call): shards of epochs up to this, the smallest leaver's last
        /// epoch, are still carried, so every call posted before a rank left
        /// completes on every other rank (ControlBlock::carriedThrough). A
        /// fault afterwards resets it and breaks the group for good.
        std::optional<std::uint64_t> carriedThrough;
        std::uint32_t leftMask = 0; ///< bit per rank, on any node, that closed in order (ProxyGroup::gone)

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
    /// Why a group breaks, for the log and the metrics.
    enum class Cause {
        Fault,  ///< a failure this daemon saw: a warning, counted once per group
        Closed, ///< a member closed in order: info, not counted
        Remote, ///< another node reported it: a warning, counted there
    };
    struct PendingBreak {
        std::uint64_t version;
        GroupId id;
        Errc code;
        std::uint32_t rank;
        std::string why;
        Cause cause;
        /// Cause::Closed: the leaver's ring (its last doorbell's epoch) and
        /// whether it rang the proxy for every call (else its epoch is read
        /// from its shards in local peers' regions, or is unknown).
        std::shared_ptr<CommandRing> ring{};
        bool rang = false;
    };

    Group* findByLink(MemberLink& link, std::uint32_t* rank = nullptr);
    Group* findByHandle(std::uint32_t handle);
    void refuse(MemberLink& link, Errc code, const std::string& why);
    void refuseAll(Group& g, Errc code, const std::string& why);
    void tryOpen(Group& g);
    void openTimedOut(const GroupId& id);
    /// Mark `g` broken and tell its members (and, with tellPeers, the other
    /// nodes): their next call fails with `code` naming `rank`.
    void breakGroup(Group& g, Errc code, std::uint32_t rank, const std::string& why, bool tellPeers = true,
                    Cause cause = Cause::Fault);
    /// `rank` closed in order after posting epochs up to `last`: `g` breaks,
    /// but every other rank's shards of epochs up to the smallest such epoch
    /// are still carried (to every rank but the leavers); a later call fails
    /// at once (the leaver's shard is missing). With tellPeers (a local rank)
    /// the other nodes learn it with that epoch (PeerVerdict::leftAfter).
    void rankLeft(Group& g, std::uint32_t rank, std::uint64_t last, bool tellPeers);
    /// The last epoch a local rank that left posted (kCarriedUnknown when no
    /// record here shows it), once the proxy drained its ring.
    std::uint64_t lastEpochOf(const Group& g, const PendingBreak& b) const;
    /// Ranks of the roster on the node of `rank` (bit per rank).
    std::uint32_t nodeRanks(const Group& g, std::uint32_t rank) const;
    /// Count `g` broken in the metrics, once.
    void countBroken(Group& g, Errc code);
    void finishOpen(Group& g);
    std::uint64_t publishProxyTable();
    void eraseIfEmpty(const GroupId& id);
    /// Drop a group: its negotiation closes, the proxy forgets it.
    void erase(std::map<GroupId, Group>::iterator it);

    boost::asio::io_context& io_;
    const DaemonConfig& cfg_;
    NodeId nodeId_;
    Proxy& proxy_;
    NegotiationTable& negotiations_;
    std::map<GroupId, Group> groups_;
    std::uint32_t nextHandle_ = 1;
    bool stopping_ = false;
    std::uint64_t tableVersion_ = 0;
    std::vector<PendingBreak> pendingBreaks_;
    Lifetime lifetime_; ///< counters since start, for metrics
};

} // namespace tpf::daemon
