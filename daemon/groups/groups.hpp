// Groups of ranks on this node: joining, the all-or-none verdict, faults.
// Runs on the control thread only (the Asio loop); the proxy sees a group
// through the ProxyGroup/ProxyRank table this publishes.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/ids.hpp"
#include "daemon/config/config.hpp"
#include "daemon/groups/metrics.hpp"
#include "daemon/negotiate/peer_link.hpp"
#include "daemon/proxy/proxy.hpp"
#include "proto/client_msg.hpp"
#include "proto/peer_msg.hpp"

namespace tpf::daemon {


/// The connection of one rank, as the group table needs it.
class MemberLink {
public:
    virtual ~MemberLink() = default;
    /// Send the verdict (and, when ok, the region, ring and eventfd fds).
    virtual void sendVerdict(const client_proto::Verdict& v, std::vector<int> fds) = 0;
    /// Forward a same-group member's device region (ipc route) with its fd.
    virtual void sendPeerRegion(const client_proto::PeerRegion& m, int fd) = 0;
    virtual std::int32_t pid() const = 0;
    virtual std::uint32_t uid() const = 0;
};

class GroupTable : public PeerHandler {
public:
    GroupTable(boost::asio::io_context& io, const DaemonConfig& cfg, const NodeId& nodeId, Proxy& proxy);

    /// The verbs wire: the opened HCAs (stripe count of cross-node groups)
    /// and the peer service. Without them groups spanning nodes are refused.
    void attachVerbs(std::vector<std::shared_ptr<VerbsHca>> hcas, PeerService* peers);

    /// A rank asks to join. The verdict arrives through link.sendVerdict, now
    /// or when the last local rank joins (or the open times out).
    void join(MemberLink& link, const client_proto::GroupOpen& m);
    /// A rank leaves: orderly (Close) or its connection dropped. Open groups
    /// break with PeerLost naming it once the proxy drained its ring; only a
    /// dropped connection counts as a broken group in the metrics. Its calls
    /// stay counted in the daemon's lifetime totals.
    void leave(MemberLink& link, bool orderly);
    /// A rank reports that its open did not take the fabric path (metrics only).
    void openReport(MemberLink& link, const client_proto::OpenReport& m);
    /// A member of an open group shares its device region fd: forwarded as
    /// PeerRegion to the group's other members only. Refused (named error)
    /// when the link is in no open group.
    Status shareRegion(MemberLink& link, const client_proto::ShareRegion& m, int fd);
    /// A member aborts its group: every member's waits end with Aborted.
    void abort(MemberLink& link);
    /// A member's doorbell was invalid (proxy report): break its group.
    void badDoorbell(std::uint32_t handle, std::uint32_t rank, const Error& why);
    /// The proxy carried out everything published before `version`.
    void drained(std::uint64_t version);
    /// The proxy saw a queue pair to `remoteRank` fail: break its group.
    void peerFailed(std::uint32_t handle, std::uint32_t remoteRank, const Error& why);

    // PeerHandler (peer links, negotiate/negotiation.cpp)
    void peerRecord(const std::shared_ptr<PeerSession>& s, peer_proto::PeerGroup rec) override;
    void peerVerdict(const std::shared_ptr<PeerSession>& s, std::uint16_t opcode, const peer_proto::PeerVerdict& v) override;
    void peerLost(const std::shared_ptr<PeerSession>& s, const Error& why) override;

    nlohmann::json status() const;
    nlohmann::json peersStatus() const;
    /// The status document's "metrics": lifetime counters, the calls of
    /// ranks gone plus those of current members, groups by state, queue pairs.
    nlohmann::json metricsStatus() const;
    std::size_t regionCount() const;
    std::uint64_t hostRegionBytes() const;

private:
    enum class State { Pending, Negotiating, Open, Broken };
    /// The daemon of another node serving ranks of a group.
    struct NodeLink {
        NodeId node{};
        std::uint32_t ranks = 0;  ///< bit r: rank r is on that node
        std::uint8_t addr[16] = {};
        std::uint16_t port = 0;
        bool weConnect = false;   ///< our node id is the smaller one
        std::shared_ptr<PeerSession> session;
        bool selfReady = false;   ///< our QPs towards it are up and PeerReady sent
        bool remoteReady = false; ///< its PeerReady (ok) arrived
        Bytes ourRecord;          ///< PeerGroup we send it
    };
    struct Member {
        MemberLink* link = nullptr;
        std::int32_t pid = 0;
        std::uint32_t uid = 0;
        std::shared_ptr<HostRegion> region;
        std::shared_ptr<CommandRing> ring;
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
        std::uint32_t ownerUid = 0;              ///< uid of the first rank to join (others must match, or be root)
        std::unique_ptr<boost::asio::steady_timer> openTimer;
        std::uint64_t agreedCap = 0;
        Layout layout{};
        std::array<std::uint8_t, kMaxWorld> routes{};
        bool gpuDoorbells = false;
        std::shared_ptr<ProxyGroup> proxyGroup;
        std::vector<NodeLink> nodes;             ///< other nodes' daemons, when some rank is remote
        std::shared_ptr<VerbsGroup> verbs;
        QpTable<std::unique_ptr<QpLink>> qpsByHca; ///< lanes are this node's HCAs, until paired
        Error lastError;
        bool brokenCounted = false; ///< counted in the lifetime metrics as broken
    };
    struct Parked {
        std::shared_ptr<PeerSession> session;
        peer_proto::PeerGroup record;
        std::uint64_t sinceNs;
    };
    struct PendingBreak {
        std::uint64_t version;
        GroupId id;
        Errc code;
        std::uint32_t rank;
        std::string why;
        bool fault; ///< false: a member closed in order (not counted as broken)
    };

    Group* findByLink(MemberLink& link, std::uint32_t* rank = nullptr);
    Group* findByHandle(std::uint32_t handle);
    void refuse(MemberLink& link, Errc code, const std::string& why);
    void refuseAll(Group& g, Errc code, const std::string& why);
    void tryOpen(Group& g);
    void openTimedOut(const GroupId& id);
    /// Mark `g` broken and tell its members (and, with tellPeers, the other
    /// nodes). `fault`: a failure this daemon saw, counted once per group in
    /// the metrics (not an orderly close, nor a break another node reported).
    void breakGroup(Group& g, Errc code, std::uint32_t rank, const std::string& why, bool tellPeers = true,
                    bool fault = true);
    /// Count `g` broken in the metrics, once.
    void countBroken(Group& g, Errc code);
    void finishOpen(Group& g);
    // negotiate/negotiation.cpp
    Status startNegotiation(Group& g);
    Status buildVerbs(Group& g);
    Bytes recordFor(const Group& g, const NodeLink& n) const;
    void attach(Group& g, NodeLink& n, const std::shared_ptr<PeerSession>& s);
    void takeRecord(Group& g, NodeLink& n, const peer_proto::PeerGroup& rec);
    Status connectQps(Group& g, NodeLink& n, const peer_proto::PeerGroup& rec);
    void failNegotiation(Group& g, Errc code, const std::string& why);
    void tellRefused(const GroupId& id, const std::vector<client_proto::RosterEntry>& roster, Errc code,
                     const std::string& why);
    const Error* refusedGroup(const GroupId& id, bool ours);
    void maybeOpen(Group& g);
    void closePeers(Group& g);
    NodeLink* nodeOf(Group& g, const NodeId& node);
    std::uint64_t publishProxyTable();
    /// A PeerReady (ok when code is Ok) or PeerBroken record about group `id`, encoded.
    static Bytes verdictMessage(std::uint16_t opcode, const GroupId& id, Errc code, std::uint32_t missingRank,
                                const std::string& why);
    void eraseIfEmpty(const GroupId& id);

    boost::asio::io_context& io_;
    const DaemonConfig& cfg_;
    NodeId nodeId_;
    Proxy& proxy_;
    std::map<GroupId, Group> groups_;
    std::uint32_t nextHandle_ = 1;
    std::uint64_t tableVersion_ = 0;
    std::vector<PendingBreak> pendingBreaks_;
    std::vector<std::shared_ptr<VerbsHca>> hcas_;
    PeerService* peers_ = nullptr;
    std::vector<Parked> parked_; ///< accepted links whose group has not reached negotiation here yet
    Lifetime lifetime_;          ///< counters since start, for metrics
    struct Refusal {
        Error why;
        std::uint64_t atNs;
    };
    /// The last failed handshake of a node that connects to us (wrong key):
    /// a group waiting for that node is refused at once, not at the open timeout.
    std::map<NodeId, Refusal> refusals_;
    /// Groups refused before negotiation, for an open timeout: by this node
    /// (ours: told to every other node of the roster, and to links that come
    /// for it later), or by another node (its PeerReady came before our
    /// ranks joined). Either way the group is refused at once, not at the
    /// open timeout.
    struct GroupRefusal {
        Error why;
        std::uint64_t atNs;
        bool ours;
    };
    std::map<GroupId, GroupRefusal> refusedGroups_;
    static constexpr std::size_t kMaxRefusedGroups = 1024;
};

} // namespace tpf::daemon
