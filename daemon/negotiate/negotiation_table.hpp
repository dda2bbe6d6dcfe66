// Every negotiation of this daemon, the peer service its links come through
// (which it owns, and which reports every link to it), and what arrives from
// other nodes before
// a group negotiates here: the reports of every peer link go to the
// negotiation of their group, a link whose group's local ranks have not all
// joined is parked until they have, and refusals are remembered for the open
// timeout (a node's failed handshake, a group refused here or elsewhere), so
// that a group they concern is refused at once, not at its open timeout.
// Control thread only.
#pragma once

#include <boost/asio/io_context.hpp>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/ids.hpp"
#include "daemon/config/config.hpp"
#include "daemon/negotiate/negotiation.hpp"
#include "daemon/negotiate/peer_link.hpp"
#include "daemon/tcp/tcp_receiver.hpp"
#include "daemon/verbs/qp.hpp"

namespace tpf::daemon {

/// The wire a node offers other nodes: tcp when peer.wire is "tcp", or
/// "auto" without a usable HCA; else verbs.
std::uint8_t offeredWire(const DaemonConfig& cfg, bool haveHcas);

class NegotiationTable : public PeerHandler {
public:
    /// `hcas`: the verbs wire, every opened HCA of this node. Without one,
    /// or without a peer link (start()), a group spanning nodes cannot open.
    NegotiationTable(boost::asio::io_context& io, const DaemonConfig& cfg, const NodeId& self,
                     std::vector<std::shared_ptr<VerbsHca>> hcas);

    /// Listen for peer daemons (PeerService::start): errors name the key or the address.
    Status start() { return peers_.start(); }
    void stop() { peers_.stop(); }
    /// Peer links are served (peer.listen set, start() succeeded).
    bool peersEnabled() const { return peers_.enabled(); }
    /// Why no group spanning nodes can open here, or nothing when one can.
    std::optional<Error> unavailable() const;
    /// HCAs a group spanning nodes on the verbs wire stripes over (every one of this node's).
    std::uint32_t hcaCount() const { return std::uint32_t(hcas_.size()); }
    /// The wire this node offers other nodes (NodeCardFixed::peerWire).
    std::uint8_t offeredWire() const { return tpf::daemon::offeredWire(cfg_, !hcas_.empty()); }
    /// The wire a group of `roster` crosses nodes on, the same on every node
    /// of it: tcp when some node offers only tcp, else verbs. Unavailable
    /// when this node cannot carry it (peer.wire = "verbs" in a tcp group;
    /// verbs without a usable HCA), naming why and what to set.
    Result<std::uint8_t> wireFor(const std::vector<client_proto::RosterEntry>& roster) const;
    /// The tcp wire's receiver (its thread starts with the first data link).
    TcpReceiver& tcpReceiver() { return tcpReceiver_; }
    /// Stop receiving on the tcp wire (the daemon is stopping).
    void stopReceiving() { tcpReceiver_.stop(); }

    /// The negotiation of cross-node group `id`, whose local ranks start
    /// joining now; the caller owns it.
    std::shared_ptr<Negotiation> create(NegotiationEvents& events, const GroupId& id,
                                        const std::vector<client_proto::RosterEntry>& roster);
    /// Group `id` was refused here before it negotiated: every other node of
    /// its roster hears why, once (on a link opened for that alone, or on one
    /// it parked here), and so does any link that comes for it later.
    void tellRefused(const GroupId& id, const std::vector<client_proto::RosterEntry>& roster, Errc code,
                     const std::string& why);
    /// Group `id` is gone here: links parked for it are dropped.
    void dropParked(const GroupId& id);

    // PeerHandler
    void peerRecord(const std::shared_ptr<PeerSession>& s, peer_proto::PeerGroup rec) override;
    void peerRejoin(const std::shared_ptr<PeerSession>& s, peer_proto::PeerRejoin rec) override;
    void peerVerdict(const std::shared_ptr<PeerSession>& s, std::uint16_t opcode, const peer_proto::PeerVerdict& v) override;
    void peerLost(const std::shared_ptr<PeerSession>& s, const Error& why) override;
    void peerData(const std::shared_ptr<PeerSession>& s, const peer_proto::PeerData& rec) override;

private:
    friend class Negotiation;
    struct Parked {
        std::shared_ptr<PeerSession> session;
        peer_proto::PeerGroup record;
        std::uint64_t sinceNs;
    };
    struct Refusal {
        Error why;
        std::uint64_t atNs;
    };
    /// A group refused before negotiation: by this node (`ours`: told to
    /// every other node of the roster, and to links that come for it later),
    /// or by another (its PeerReady came before our ranks joined).
    struct GroupRefusal {
        Error why;
        std::uint64_t atNs;
        bool ours;
    };
    static constexpr std::size_t kMaxRefusedGroups = 1024;

    Negotiation* find(const GroupId& id) const;
    /// The refusal of group `id` by this node (`ours`) or another, while it
    /// is younger than the open timeout.
    const Error* refusedGroup(const GroupId& id, bool ours);
    void rememberRefusal(const GroupId& id, Error why, bool ours);
    /// A node's last failed handshake, while younger than the open timeout.
    const Error* refusalOf(const NodeId& node) const;
    /// The parked link of `node` for group `id`, taken out of the park.
    std::optional<Parked> takeParked(const GroupId& id, const NodeId& node);
    bool expired(std::uint64_t sinceNs) const;

    boost::asio::io_context& io_;
    const DaemonConfig& cfg_;
    NodeId self_;
    std::vector<std::shared_ptr<VerbsHca>> hcas_;
    TcpReceiver tcpReceiver_; ///< outlives every group's tcp wire (the group table goes first)
    PeerService peers_; ///< reports every link to this table
    std::map<GroupId, Negotiation*> active_; ///< registered by Negotiation, until close()
    std::vector<Parked> parked_;             ///< accepted links whose group has not reached negotiation here yet
    std::map<NodeId, Refusal> refusals_;     ///< failed handshakes of nodes that connect to us (wrong key)
    std::map<GroupId, GroupRefusal> refusedGroups_;
};

/// A PeerReady (ok when code is Ok) or PeerBroken record about group `id`, encoded.
Bytes verdictMessage(std::uint16_t opcode, const GroupId& id, Errc code, std::uint32_t missingRank,
                     const std::string& why, std::uint64_t leftAfter = 0);

} // namespace tpf::daemon
