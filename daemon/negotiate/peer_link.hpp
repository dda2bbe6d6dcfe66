// Daemon <-> daemon links (docs/design.md, "3. Negotiation"): one TCP
// connection per group and remote node, on the Asio loop. The daemon with the
// smaller node id connects, the other accepts. Both send PeerHello; with a
// cluster key both prove it (PeerAuth, HMAC-SHA-256 with libsodium) before any
// other record; then the records of proto/peer_msg.hpp: PeerGroup each way,
// PeerReady each way, and PeerBroken when a group breaks. A closed or failed
// link is reported once. A group on the tcp wire opens a second link per
// node pair the same way, its data link: after the handshake the connecting
// side sends PeerData and both hand the socket over to the wire
// (daemon/tcp/tcp_link.hpp); from then on no record is read from it here.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/fd.hpp"
#include "common/ids.hpp"
#include "daemon/config/config.hpp"
#include "daemon/negotiate/peer_input.hpp"
#include "proto/client_msg.hpp"
#include "proto/peer_msg.hpp"

namespace tpf::daemon {

class PeerSession;

/// Where a link to another node's daemon stands (status: peers[].state).
enum class LinkState : std::uint8_t {
    Connecting,  ///< TCP connect under way (the connecting side)
    Handshake,   ///< hellos and, with a cluster key, the HMAC proofs
    Negotiating, ///< group records exchanged, queue pairs coming up
    Ready,       ///< every queue pair up on both sides
    Closed,
    Failed,      ///< PeerSession::lastError() says why
    Waiting,     ///< no link yet: the other node connects and has not (a node's state, never a session's)
    Away,        ///< an open group's link closed: it waits for that node's daemon to come back (a node's state)
};
/// "connecting", "handshake", "negotiating", "ready", "closed", "failed", "waiting", "away".
const char* linkStateName(LinkState s);

/// What a link reports; implemented by the group table (control thread).
class PeerHandler {
public:
    virtual ~PeerHandler() = default;
    /// The remote's PeerGroup record arrived (first record after the handshake).
    virtual void peerRecord(const std::shared_ptr<PeerSession>& s, peer_proto::PeerGroup rec) = 0;
    /// The remote's PeerRejoin arrived: a group goes on after a daemon restart.
    virtual void peerRejoin(const std::shared_ptr<PeerSession>& s, peer_proto::PeerRejoin rec) = 0;
    /// PeerReady or PeerBroken for the session's group.
    virtual void peerVerdict(const std::shared_ptr<PeerSession>& s, std::uint16_t opcode, const peer_proto::PeerVerdict& v) = 0;
    /// The link failed or closed (once per session; not after close()).
    virtual void peerLost(const std::shared_ptr<PeerSession>& s, const Error& why) = 0;
    /// An accepted link is a group's tcp data link (its PeerData arrived):
    /// take its socket (PeerSession::takeSocket) or close it.
    virtual void peerData(const std::shared_ptr<PeerSession>& s, const peer_proto::PeerData& rec) = 0;
};

/// Where a data link's connecting side learns how it went: the connected,
/// proven socket once PeerData is written, or why not.
using DataLinkDone = std::function<void(Result<UniqueFd>)>;

class PeerSession : public std::enable_shared_from_this<PeerSession> {
public:
    PeerSession(boost::asio::io_context& io, boost::asio::ip::tcp::socket socket, PeerHandler& handler,
                const NodeId& self, const std::optional<std::vector<std::uint8_t>>& key, bool accepted);

    /// Connecting side: connect to `endpoint` within `timeoutMs`, expecting
    /// node `remote`, then handshake and send `first` as the first record;
    /// with `only`, close once `first` is written (a refusal's verdict).
    void connect(const boost::asio::ip::tcp::endpoint& endpoint, const NodeId& remote, std::uint32_t timeoutMs,
                 Bytes first, bool only = false);
    /// Connecting side of a tcp data link: as connect(), with PeerData as
    /// `first`; once it is written the socket goes to `done` (so does an
    /// error, instead of peerLost).
    void connectData(const boost::asio::ip::tcp::endpoint& endpoint, const NodeId& remote, std::uint32_t timeoutMs,
                     Bytes first, DataLinkDone done);
    /// Accepting side: handshake, then wait for the remote's record.
    void accept();
    /// After peerData: the socket, leaving the session closed (no peerLost).
    Result<UniqueFd> takeSocket();
    void send(Bytes message);
    /// Close without reporting peerLost.
    void close();
    /// Close once everything queued is written (no peerLost either).
    void finish();

    bool accepted() const { return accepted_; }
    /// The remote's IP address (IPv4-mapped or IPv6), as NodeLink::addr holds one.
    const std::array<std::uint8_t, 16>& remoteAddress() const { return remoteAddr_; }
    const NodeId& remoteNode() const { return remote_; }
    std::string endpointText() const { return endpoint_; }
    LinkState state() const { return state_; }
    void setState(LinkState s) { state_ = s; }
    const Error& lastError() const { return lastError_; }

private:
    void handshake();
    void readHeader(std::size_t want, std::uint16_t opcode);
    void readNext();
    void onMessage(const MsgHeader& h, ByteView payload);
    void onHello(const peer_proto::PeerHello& hello);
    void onAuth(const peer_proto::PeerAuth& auth);
    void established();
    void handOver();
    void fail(Error why);
    void flush();
    std::array<std::uint8_t, 32> mac(const peer_proto::PeerHello& first, const peer_proto::PeerHello& second) const;

    boost::asio::io_context& io_;
    boost::asio::ip::tcp::socket socket_;
    boost::asio::steady_timer timer_;
    PeerHandler& handler_;
    NodeId self_;
    NodeId remote_{};
    bool expectRemote_ = false;
    bool onlyFirst_ = false; ///< close once first_ is written
    std::optional<std::vector<std::uint8_t>> key_;
    bool accepted_;
    std::string endpoint_;
    std::array<std::uint8_t, 16> remoteAddr_{};
    LinkState state_ = LinkState::Connecting;
    Error lastError_;
    bool done_ = false; ///< closed or failed: no more reports
    PeerPhase phase_ = PeerPhase::Hello;
    peer_proto::PeerHello ourHello_{};
    peer_proto::PeerHello theirHello_{};
    Bytes first_;
    std::array<std::uint8_t, sizeof(MsgHeader)> header_{};
    Bytes payload_;
    std::deque<Bytes> out_;
    bool writing_ = false;
    bool finishing_ = false;
    DataLinkDone dataDone_; ///< set: the connecting side of a data link
    std::uint32_t seq_ = 0;
};

/// The TCP listener for peer daemons.
class PeerService {
public:
    PeerService(boost::asio::io_context& io, const DaemonConfig& cfg, const NodeId& self, PeerHandler& handler);
    /// Reads the cluster key (if configured) and listens. Errors name the key
    /// or the address.
    Status start();
    void stop();
    /// Open a link for one group to the node at `addr` (16-byte IPv4-mapped or
    /// IPv6) : `port`, sending `first` (our PeerGroup) once the handshake is
    /// done; with `only`, close after it (a PeerReady refusing a group).
    std::shared_ptr<PeerSession> connect(const std::uint8_t (&addr)[16], std::uint16_t port, const NodeId& remote,
                                         Bytes first, bool only = false);
    /// Open a tcp data link to that node, sending `first` (our PeerData);
    /// `done` gets the socket or the error.
    void connectData(const std::uint8_t (&addr)[16], std::uint16_t port, const NodeId& remote, Bytes first,
                     DataLinkDone done);
    bool enabled() const { return acceptor_.is_open(); }
    bool keyed() const { return key_.has_value(); }

private:
    void acceptNext();

    boost::asio::io_context& io_;
    const DaemonConfig& cfg_;
    NodeId self_;
    PeerHandler& handler_;
    boost::asio::ip::tcp::acceptor acceptor_;
    std::optional<std::vector<std::uint8_t>> key_;
    std::vector<std::weak_ptr<PeerSession>> sessions_;
};

/// The address to advertise for `listen` (the configured literal; for a
/// wildcard, the first HCA's IP), 16 bytes IPv4-mapped or IPv6.
std::array<std::uint8_t, 16> endpointBytes(const std::string& listen, const std::vector<client_proto::HcaCard>& hcas);
std::string endpointText(const std::uint8_t (&addr)[16], std::uint16_t port);

} // namespace tpf::daemon
