// Peer links: TCP, handshake with the optional cluster key, framing.
#include "daemon/negotiate/peer_link.hpp"

#include <arpa/inet.h>
#include <sodium.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include <cerrno>
#include <cstring>

namespace tpf::daemon {

using boost::asio::ip::tcp;
using namespace peer_proto;

namespace {
constexpr std::string_view kAuthLabel = "tpfabric peer auth v1";

constexpr const char* kLinkStateNames[] = {"connecting", "handshake", "negotiating", "ready", "closed", "failed", "waiting", "away"};

tcp::endpoint toEndpoint(const std::uint8_t (&addr)[16], std::uint16_t port) {
    boost::asio::ip::address_v6::bytes_type b;
    std::memcpy(b.data(), addr, 16);
    const boost::asio::ip::address_v6 v6(b);
    if (v6.is_v4_mapped()) return {boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, v6), port};
    return {v6, port};
}
} // namespace

const char* linkStateName(LinkState s) {
    const auto i = std::size_t(s);
    return i < std::size(kLinkStateNames) ? kLinkStateNames[i] : "unknown";
}

std::string endpointText(const std::uint8_t (&addr)[16], std::uint16_t port) {
    const auto ep = toEndpoint(addr, port);
    return ep.address().to_string() + ":" + std::to_string(port);
}

std::array<std::uint8_t, 16> endpointBytes(const std::string& listen, const std::vector<client_proto::HcaCard>& hcas) {
    std::array<std::uint8_t, 16> out{};
    boost::system::error_code ec;
    auto a = boost::asio::ip::make_address(listen, ec);
    if (!ec && a.is_unspecified() && !hcas.empty()) {
        std::memcpy(out.data(), hcas.front().gid, 16); // RoCE v2 GID = the port's IP (IPv4-mapped)
        return out;
    }
    if (ec || a.is_unspecified()) return out;
    const auto v6 = a.is_v4() ? boost::asio::ip::make_address_v6(boost::asio::ip::v4_mapped, a.to_v4()) : a.to_v6();
    const auto b = v6.to_bytes();
    std::memcpy(out.data(), b.data(), 16);
    return out;
}

// ---- session ---------------------------------------------------------------

PeerSession::PeerSession(boost::asio::io_context& io, tcp::socket socket, PeerHandler& handler, const NodeId& self,
                         const std::optional<std::vector<std::uint8_t>>& key, bool accepted)
    : io_(io), socket_(std::move(socket)), timer_(io), handler_(handler), self_(self), key_(key), accepted_(accepted) {
    boost::system::error_code ec;
    if (accepted_) {
        auto ep = socket_.remote_endpoint(ec);
        if (!ec) {
            endpoint_ = ep.address().to_string() + ":" + std::to_string(ep.port());
            const auto a = ep.address();
            const auto v6 = a.is_v4() ? boost::asio::ip::make_address_v6(boost::asio::ip::v4_mapped, a.to_v4()) : a.to_v6();
            const auto b = v6.to_bytes();
            std::copy(b.begin(), b.end(), remoteAddr_.begin());
        }
        state_ = LinkState::Handshake;
    }
}

void PeerSession::connect(const tcp::endpoint& endpoint, const NodeId& remote, std::uint32_t timeoutMs, Bytes first,
                          bool only) {
    remote_ = remote;
    expectRemote_ = true;
    onlyFirst_ = only;
    first_ = std::move(first);
    endpoint_ = endpoint.address().to_string() + ":" + std::to_string(endpoint.port());
    auto self = shared_from_this();
    timer_.expires_after(std::chrono::milliseconds(timeoutMs));
    timer_.async_wait([this, self, timeoutMs](const boost::system::error_code& ec) {
        if (!ec && state_ == LinkState::Connecting)
            fail(Error{Errc::Timeout, "no TCP connection to peer daemon " + endpoint_ + " within " +
                                          std::to_string(timeoutMs) + " ms (peer.connect_timeout_ms)"});
    });
    socket_.async_connect(endpoint, [this, self](const boost::system::error_code& ec) {
        if (done_) return;
        timer_.cancel();
        if (ec)
            return fail(Error{Errc::PeerLost, "cannot connect to peer daemon " + endpoint_ + ": " + ec.message() +
                                                  " (is tpfabricd running there with peer.listen set?)"});
        socket_.set_option(tcp::no_delay(true));
        state_ = LinkState::Handshake;
        handshake();
    });
}

void PeerSession::connectData(const tcp::endpoint& endpoint, const NodeId& remote, std::uint32_t timeoutMs, Bytes first,
                              DataLinkDone done) {
    dataDone_ = std::move(done);
    connect(endpoint, remote, timeoutMs, std::move(first));
}

void PeerSession::accept() {
    socket_.set_option(tcp::no_delay(true));
    handshake();
}

void PeerSession::handshake() {
    self_.copyTo(ourHello_.nodeId);
    randombytes_buf(ourHello_.nonce, sizeof ourHello_.nonce);
    ourHello_.flags = key_ ? kHelloKeyed : 0;
    send(encode(kPeerHello, ++seq_, ourHello_));
    readNext();
}

void PeerSession::readNext() {
    auto self = shared_from_this();
    boost::asio::async_read(socket_, boost::asio::buffer(header_), [this, self](const boost::system::error_code& ec, std::size_t) {
        if (done_) return;
        if (ec)
            return fail(Error{Errc::PeerLost, "peer daemon " + endpoint_ +
                                                  (ec == boost::asio::error::eof ? " closed the link" : ": " + ec.message())});
        auto h = decodeHeader(ByteView(header_.data(), header_.size()), kPeerSpec);
        if (!h) return fail(h.error());
        const MsgHeader hdr = *h;
        payload_.assign(hdr.length, 0);
        boost::asio::async_read(socket_, boost::asio::buffer(payload_),
                                [this, self, hdr](const boost::system::error_code& ec2, std::size_t) {
                                    if (done_) return;
                                    if (ec2) return fail(Error{Errc::PeerLost, "peer daemon " + endpoint_ + ": " + ec2.message()});
                                    onMessage(hdr, ByteView(payload_.data(), payload_.size()));
                                });
    });
}

void PeerSession::onMessage(const MsgHeader& h, ByteView payload) {
    auto in = decodePeerInput(phase_, h, payload);
    if (!in) return fail(in.error());
    if (phase_ == PeerPhase::Hello) return onHello(std::get<PeerHello>(in->record));
    if (phase_ == PeerPhase::Auth) return onAuth(std::get<PeerAuth>(in->record));
    auto self = shared_from_this();
    if (auto* rec = std::get_if<PeerGroup>(&in->record)) {
        state_ = LinkState::Negotiating;
        handler_.peerRecord(self, std::move(*rec));
    } else if (auto* rejoin = std::get_if<PeerRejoin>(&in->record)) {
        state_ = LinkState::Negotiating;
        handler_.peerRejoin(self, std::move(*rejoin));
    } else if (auto* data = std::get_if<PeerData>(&in->record)) {
        // Frames follow on this socket, not records: no more reads here.
        if (!accepted_ || dataDone_)
            return fail(Error{Errc::BadMessage, "peer daemon " + endpoint_ + " sent PeerData on a link this daemon opened"});
        if (NodeId::of(data->nodeId) != remote_)
            return fail(Error{Errc::BadMessage, "peer daemon " + endpoint_ + " sent PeerData of another node"});
        handler_.peerData(self, *data);
        if (!done_) close();
        return;
    } else {
        handler_.peerVerdict(self, in->opcode, std::get<PeerVerdict>(in->record));
    }
    if (!done_) readNext();
}

void PeerSession::onHello(const PeerHello& hello) {
    theirHello_ = hello;
    const NodeId them = NodeId::of(theirHello_.nodeId);
    if (expectRemote_ && them != remote_)
        return fail(Error{Errc::GroupMismatch, "peer daemon " + endpoint_ + " is node " + them.shortHex() + ", the roster says " +
                                                   remote_.shortHex()});
    remote_ = them;
    const bool theyKeyed = theirHello_.flags & kHelloKeyed;
    if (theyKeyed && !key_)
        return fail(Error{Errc::AuthFailed, "peer daemon " + endpoint_ + " requires a cluster key and this daemon has none "
                                                                         "(set peer.key_file to the cluster's key)"});
    if (!theyKeyed && key_)
        return fail(Error{Errc::AuthFailed, "peer daemon " + endpoint_ + " has no cluster key; refusing it "
                                                                         "(give it the cluster's peer.key_file)"});
    if (!key_) return established();
    PeerAuth auth{};
    const auto m = mac(ourHello_, theirHello_);
    std::memcpy(auth.mac, m.data(), 32);
    send(encode(kPeerAuth, ++seq_, auth));
    phase_ = PeerPhase::Auth;
    readNext();
}

void PeerSession::onAuth(const PeerAuth& auth) {
    const auto want = mac(theirHello_, ourHello_);
    if (sodium_memcmp(want.data(), auth.mac, 32) != 0)
        return fail(Error{Errc::AuthFailed, "peer daemon " + endpoint_ + " (node " + remote_.shortHex() +
                                                ") did not prove the cluster key: its peer.key_file differs from ours"});
    established();
}

void PeerSession::established() {
    phase_ = PeerPhase::Records;
    state_ = LinkState::Negotiating;
    spdlog::info("peer link {} to node {} established{}", endpoint_, remote_.shortHex(), key_ ? " (cluster key proven)" : "");
    if (!first_.empty()) send(std::move(first_));
    if (onlyFirst_ || dataDone_) return finish(); // a data link: handed over once PeerData is written
    readNext();
}

// A data link's connecting side: PeerData written, the socket goes to the wire.
void PeerSession::handOver() {
    DataLinkDone done = std::exchange(dataDone_, nullptr);
    auto fd = takeSocket();
    done(std::move(fd));
}

Result<UniqueFd> PeerSession::takeSocket() {
    if (done_)
        return lastError_.code != Errc::Ok ? lastError_
                                           : Error{Errc::PeerLost, "tcp data link " + endpoint_ + " closed before it was handed over"};
    boost::system::error_code ec;
    const int fd = ::dup(socket_.native_handle());
    if (fd < 0) {
        const Error why{Errc::SystemError, "tcp data link " + endpoint_ + ": dup: " + std::strerror(errno)};
        close();
        return why;
    }
    done_ = true;
    state_ = LinkState::Closed;
    timer_.cancel();
    socket_.close(ec); // the duplicate keeps the connection
    return UniqueFd(fd);
}

// HMAC-SHA-256(key, label || first hello || second hello): the sender MACs
// (its hello, the receiver's), so a reflected proof does not verify.
std::array<std::uint8_t, 32> PeerSession::mac(const PeerHello& first, const PeerHello& second) const {
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, key_->data(), key_->size());
    crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(kAuthLabel.data()), kAuthLabel.size());
    crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(&first), sizeof first);
    crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(&second), sizeof second);
    std::array<std::uint8_t, 32> out;
    crypto_auth_hmacsha256_final(&st, out.data());
    return out;
}

void PeerSession::send(Bytes message) {
    if (done_) return;
    out_.push_back(std::move(message));
    flush();
}

void PeerSession::finish() {
    if (done_) return;
    finishing_ = true;
    flush();
}

void PeerSession::flush() {
    if (finishing_ && !writing_ && out_.empty()) return dataDone_ && !done_ ? handOver() : close();
    if (writing_ || out_.empty() || done_) return;
    writing_ = true;
    auto self = shared_from_this();
    boost::asio::async_write(socket_, boost::asio::buffer(out_.front()), [this, self](const boost::system::error_code& ec, std::size_t) {
        writing_ = false;
        if (done_) return;
        if (ec) return fail(Error{Errc::PeerLost, "writing to peer daemon " + endpoint_ + ": " + ec.message()});
        out_.pop_front();
        flush();
    });
}

void PeerSession::fail(Error why) {
    if (done_) return;
    done_ = true;
    state_ = LinkState::Failed;
    lastError_ = why;
    const bool auth = why.code == Errc::AuthFailed || why.code == Errc::BadMagic || why.code == Errc::VersionMismatch;
    if (auth) spdlog::error("peer link {}: {}", endpoint_, why.describe());
    else spdlog::warn("peer link {}: {}", endpoint_, why.describe());
    boost::system::error_code ec;
    timer_.cancel();
    socket_.close(ec);
    if (dataDone_) return std::exchange(dataDone_, nullptr)(why);
    handler_.peerLost(shared_from_this(), why);
}

void PeerSession::close() {
    if (done_) return;
    done_ = true;
    state_ = LinkState::Closed;
    boost::system::error_code ec;
    timer_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
}

// ---- service -----------------------------------------------------------------

PeerService::PeerService(boost::asio::io_context& io, const DaemonConfig& cfg, const NodeId& self, PeerHandler& handler)
    : io_(io), cfg_(cfg), self_(self), handler_(handler), acceptor_(io) {}

Status PeerService::start() {
    try {
        // The one reader of the key, the same that --check-config runs (config.hpp).
        if (auto key = readPeerKey(cfg_)) {
            if (key->mode & 077)
                spdlog::warn("peer.key_file {} is readable by group or others (mode {:o}); chmod 0600 it", cfg_.peerKeyFile,
                             key->mode & 0777);
            key_ = std::move(key->bytes);
        }
    } catch (const ConfigError& e) {
        return Error{Errc::ConfigError, e.what()};
    }
    if (cfg_.peerListen.empty()) return okStatus();
    boost::system::error_code ec;
    const auto addr = boost::asio::ip::make_address(cfg_.peerListen, ec);
    if (ec) return Error{Errc::ConfigError, "peer.listen: '" + cfg_.peerListen + "' is not an IP address"};
    const tcp::endpoint ep(addr, cfg_.peerPort);
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(64, ec);
    if (ec) {
        // Exit 1 and tried again by systemd: a port another process holds, or
        // an address not up yet at boot (--check-config refuses one that is
        // no address of this host). The remedy rides in the message.
        const std::string port = std::to_string(cfg_.peerPort);
        const std::string remedy =
            ec == boost::asio::error::address_in_use
                ? "another process holds the port (ss -ltnp 'sport = :" + port +
                      "'); stop it or choose another peer.port; systemd tries again every 2 s"
            : ec == boost::system::errc::address_not_available
                ? "peer.listen " + cfg_.peerListen + " is not an address of this host (yet): ip -brief address; "
                                                     "systemd tries again every 2 s"
                : "check peer.listen and peer.port";
        return Error{Errc::SystemError, "peer.listen: cannot listen on " + cfg_.peerListen + ":" + port + ": " + ec.message() +
                                            " (" + remedy + ")"};
    }
    spdlog::info("peer daemons: listening on {}:{}{}", cfg_.peerListen, cfg_.peerPort, key_ ? ", cluster key required" : "");
    acceptNext();
    return okStatus();
}

void PeerService::stop() {
    boost::system::error_code ec;
    acceptor_.close(ec);
    for (auto& w : sessions_)
        if (auto s = w.lock()) s->close();
    sessions_.clear();
}

void PeerService::acceptNext() {
    acceptor_.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
        if (ec == boost::asio::error::operation_aborted || !acceptor_.is_open()) return;
        if (!ec) {
            auto s = std::make_shared<PeerSession>(io_, std::move(socket), handler_, self_, key_, true);
            std::erase_if(sessions_, [](const std::weak_ptr<PeerSession>& w) { return w.expired(); });
            sessions_.push_back(s);
            s->accept();
        } else {
            spdlog::warn("peer daemons: accept: {}", ec.message());
        }
        acceptNext();
    });
}

std::shared_ptr<PeerSession> PeerService::connect(const std::uint8_t (&addr)[16], std::uint16_t port, const NodeId& remote,
                                                  Bytes first, bool only) {
    auto s = std::make_shared<PeerSession>(io_, tcp::socket(io_), handler_, self_, key_, false);
    std::erase_if(sessions_, [](const std::weak_ptr<PeerSession>& w) { return w.expired(); });
    sessions_.push_back(s);
    s->connect(toEndpoint(addr, port), remote, cfg_.peerConnectTimeoutMs, std::move(first), only);
    return s;
}

void PeerService::connectData(const std::uint8_t (&addr)[16], std::uint16_t port, const NodeId& remote, Bytes first,
                              DataLinkDone done) {
    auto s = std::make_shared<PeerSession>(io_, tcp::socket(io_), handler_, self_, key_, false);
    std::erase_if(sessions_, [](const std::weak_ptr<PeerSession>& w) { return w.expired(); });
    sessions_.push_back(s);
    s->connectData(toEndpoint(addr, port), remote, cfg_.peerConnectTimeoutMs, std::move(first), std::move(done));
}

} // namespace tpf::daemon
