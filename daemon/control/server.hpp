// The control socket: a Unix stream socket served on the Asio loop. Every
// message is a proto/ record; fds travel as SCM_RIGHTS; SO_PEERCRED names the
// peer. Bad input gets an ErrorReply naming the failure, a log line, and the
// connection closed; nothing else is disturbed.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/fd.hpp"
#include "daemon/control/dispatch.hpp"
#include "daemon/groups/groups.hpp"
#include "proto/client_msg.hpp"

namespace tpf::daemon {

class Server;

/// One client connection: its socket, and the group table's MemberLink for it.
class Connection : public MemberLink, private ControlRequests, public std::enable_shared_from_this<Connection> {
public:
    /// `overLimit`: why the daemon is full (daemon.max_clients or
    /// max_clients_per_uid) when this connection was admitted beyond it, as
    /// one of the few kept for control clients; "" for an ordinary one.
    Connection(Server& server, boost::asio::local::stream_protocol::socket socket, std::uint64_t id,
               std::string overLimit = {});
    void start();
    void shutdown(); ///< close now (daemon stopping)

    void sendVerdict(const client_proto::Verdict& v, std::vector<int> fds) override;
    void sendPeerRegion(const client_proto::PeerRegion& m, int fd) override;
    void sendPeerHostRegion(const client_proto::PeerHostRegion& m, int fd) override;
    void sendAdopted(const client_proto::Adopted& m, int fd) override;
    void sendGroupFailed(const client_proto::GroupFailed& m) override;
    std::int32_t pid() const override { return pid_; }
    std::uint32_t uid() const override { return uid_; }
    std::uint64_t id() const { return id_; }
    bool overLimit() const { return !overLimit_.empty(); } ///< admitted on one of the slots kept for control clients
    bool isOpen() const { return !closed_; }                 ///< not closed yet (the table forgets it a moment later)
    /// Said nothing in the `grace` since it connected: no whole message, no
    /// byte received, none waiting in its socket. A client that connects to
    /// talk (tpfabricctl sends its Hello at once) is never silent.
    bool silentFor(std::chrono::steady_clock::duration grace);
    /// Refuses (Busy) a silent connection on a slot kept for control clients, for a newer one.
    void evictSilent();

private:
    struct Outgoing {
        Bytes bytes;
        std::vector<UniqueFd> fds; ///< dups, closed once sent
        std::size_t sent = 0;
    };
    void waitReadable();
    void onReadable();
    void watchPartial();
    // ControlRequests
    void reply(Bytes message) override { send(std::move(message)); }
    void refuse(Errc code, const std::string& why) override; ///< ErrorReply, log, close after flush
    void finish() override;
    client_proto::HelloReply helloReply() override;
    std::string busyFor(std::uint32_t role) override;
    client_proto::NodeCard nodeCard() override;
    std::string statusJson() override;
    void join(const client_proto::GroupOpen& m) override;
    void leave() override;
    void abort() override;
    void openReport(const client_proto::OpenReport& m) override;
    Status shareRegion(const client_proto::ShareRegion& m, int fd) override;
    Status deviceAttach(const client_proto::DeviceAttach& m) override;
    void adopt(const client_proto::Adopt& m, UniqueFd region, UniqueFd ring) override;
    bool closed() const override { return closed_; }

    void send(Bytes bytes, const std::vector<int>& fds = {});
    void flush();
    void close();
    /// A write failed or the client does not read: closed once the caller's
    /// work is done, not within it (a send from a group's transition must
    /// not re-enter the group table by closing the member's link).
    void closeLater();

    Server& server_;
    boost::asio::local::stream_protocol::socket socket_;
    std::uint64_t id_;
    std::int32_t pid_ = -1;
    std::uint32_t uid_ = ~0u;
    std::uint32_t gid_ = ~0u;
    std::string overLimit_; ///< admitted beyond the limits for a control client: why it was full
    std::chrono::steady_clock::time_point accepted_ = std::chrono::steady_clock::now();
    ControlDispatch dispatch_{*this};
    bool closing_ = false;   ///< no more input; close once output is flushed
    bool closed_ = false;
    bool closeQueued_ = false; ///< closeLater() ran: nothing more is sent
    bool writing_ = false;
    Bytes inbuf_;
    std::vector<UniqueFd> infds_;
    std::deque<Outgoing> out_;
    /// Runs while inbuf_ holds part of a message, and from connecting until
    /// the first whole message: a message left incomplete (or never begun) for
    /// daemon.message_timeout_ms refuses the client (Timeout).
    boost::asio::steady_timer partial_;
    bool greeted_ = false; ///< a whole message arrived
    std::uint64_t partialSince_ = 0; ///< generation of the armed timer, 0: not armed
    std::uint64_t partialGen_ = 0;
};

/// Whether the daemon may listen at `path`, checked before anything is
/// touched: ok when nothing is there or a stale socket (refusing connections)
/// is; ConfigError when the path is longer than sun_path allows, its directory
/// is missing (none is created), or something other than a socket is there
/// (left alone); SystemError when another daemon serves it.
Status checkSocketPath(const std::string& path);
/// Whether this process may make the socket in `path`'s directory (write
/// and search permission, a file system not read-only): ConfigError naming
/// the directory, the uid and the one writable directory under the unit.
/// A start that cannot would fail every retry alike: exit 2, not restarted.
Status checkSocketDirectory(const std::string& path);

/// Accepts connections and routes their requests to the group table.
class Server {
public:
    /// `statusJson(clients)`: the status document, given the connections now.
    Server(boost::asio::io_context& io, const DaemonConfig& cfg, GroupTable& groups,
           std::function<std::string(std::size_t clients)> statusJson, client_proto::HelloReply hello,
           std::function<client_proto::NodeCard()> nodeCard);
    ~Server();

    /// checkSocketPath, then bind (replacing a stale socket), set its group and mode 0660, listen.
    Status listen(const std::string& path);
    void stop();

    std::size_t clients() const { return connections_.size(); }
    const std::string& path() const { return path_; }

private:
    friend class Connection;
    void accept();
    /// Why a new client of `uid` may not connect now (daemon.max_clients or
    /// daemon.max_clients_per_uid), "" when it may.
    std::string fullFor(std::uint32_t uid) const;
    /// Connections admitted beyond the limits while they are full, for
    /// control clients only (a rank's Hello on one is refused Busy): an
    /// operator's tpfabricctl status reads a full daemon and names who holds it.
    static constexpr std::size_t kControlReserve = 2;
    /// How long a connection on a kept slot may say nothing before a newer
    /// one may take its slot (Connection::silentFor): long against a Hello's
    /// way in, short against daemon.message_timeout_ms.
    static constexpr std::chrono::milliseconds kSilentGrace{250};
    /// How long accepting pauses after accept() failed (EMFILE, ENFILE, ENOMEM):
    /// the pending connection stays queued, so an immediate retry fails again.
    static constexpr std::chrono::milliseconds kAcceptPause{100};
    void forget(std::uint64_t id);
    /// accept() failed: one warning per episode (how many files are open, what
    /// to raise), then accepting again after kAcceptPause.
    void acceptFailed(const boost::system::error_code& ec);

    boost::asio::io_context& io_;
    const DaemonConfig& cfg_;
    GroupTable& groups_;
    std::function<std::string(std::size_t clients)> statusJson_;
    client_proto::HelloReply hello_;
    std::function<client_proto::NodeCard()> nodeCard_;
    boost::asio::local::stream_protocol::acceptor acceptor_;
    boost::asio::steady_timer acceptPause_;
    std::chrono::steady_clock::time_point acceptFailingSince_{}; ///< first failure of the current episode
    std::uint64_t acceptFailures_ = 0;                           ///< of the current episode; 0 = accepting
    std::string path_;
    std::pair<dev_t, ino_t> pathId_{}; ///< the socket file listen() made (stop() removes only it)
    std::uint64_t nextId_ = 1;
    std::map<std::uint64_t, std::shared_ptr<Connection>> connections_;
};

} // namespace tpf::daemon
