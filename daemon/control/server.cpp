#include "daemon/control/server.hpp"

#include <grp.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/unix_socket.hpp"

namespace tpf::daemon {

using namespace client_proto;
namespace asio = boost::asio;
using Local = asio::local::stream_protocol;

namespace {
constexpr std::size_t kReadChunk = 64 * 1024;
constexpr std::size_t kMaxQueuedOutput = 16 * 1024 * 1024; // a client that never reads is dropped
} // namespace

Connection::Connection(Server& server, Local::socket socket, std::uint64_t id, std::string overLimit)
    : server_(server), socket_(std::move(socket)), id_(id), overLimit_(std::move(overLimit)),
      partial_(socket_.get_executor()) {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(socket_.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
        pid_ = cred.pid;
        uid_ = cred.uid;
        gid_ = cred.gid;
    }
    socket_.non_blocking(true);
}

void Connection::start() {
    spdlog::debug("client {}: connected (pid {}, uid {}, gid {})", id_, pid_, uid_, gid_);
    watchPartial(); // an idle connection is held no longer than a stalled message
    waitReadable();
}

void Connection::waitReadable() {
    if (closing_ || closed_) return;
    socket_.async_wait(Local::socket::wait_read, [self = shared_from_this()](const boost::system::error_code& ec) {
        if (ec) return self->close();
        self->onReadable();
    });
}

void Connection::onReadable() {
    if (closed_) return;
    // Read what is there, collecting fds.
    bool hungUp = false;
    for (;;) {
        const std::size_t old = inbuf_.size();
        inbuf_.resize(old + kReadChunk);
        const auto [n, fdsCut] = receiveWithFds(socket_.native_handle(), {inbuf_.data() + old, kReadChunk}, infds_);
        inbuf_.resize(old + (n > 0 ? std::size_t(n) : 0));
        if (n > 0) {
            if (fdsCut) return refuse(Errc::BadMessage, "too many file descriptors in one message");
            if (std::size_t(n) < kReadChunk) break;
            continue;
        }
        if (n == 0) {
            hungUp = true;
            break;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        if (errno == ECONNRESET) { // a client that exited with replies unread: a hang-up like any other
            hungUp = true;
            break;
        }
        spdlog::warn("client {} (pid {}): recvmsg: {}", id_, pid_, std::strerror(errno));
        return close();
    }
    // Handle every whole message (also those a client sent right before it hung up).
    const std::size_t used = dispatch_.feed(ByteView(inbuf_), infds_);
    if (dispatch_.ended()) return;
    inbuf_.erase(inbuf_.begin(), inbuf_.begin() + std::ptrdiff_t(used));
    if (hungUp) {
        if (!inbuf_.empty()) // bad input is logged, also when it is too short to refuse by its header
            spdlog::warn("client {} (pid {}, uid {}): closed the connection with {} byte(s) of an incomplete message",
                         id_, pid_, uid_, inbuf_.size());
        return close();
    }
    if (used > 0 && !greeted_) { // the wait for a first message is over; a next one gets its own
        greeted_ = true;
        if (partialSince_) partial_.cancel();
        partialSince_ = 0;
    }
    watchPartial();
    waitReadable();
}

// Arm the timer when a message is left incomplete, or at connecting, once
// (bytes trickling in do not extend it); disarm when the buffer empties after
// the first whole message.
void Connection::watchPartial() {
    if (inbuf_.empty() && greeted_) {
        if (partialSince_) partial_.cancel();
        partialSince_ = 0;
        return;
    }
    if (partialSince_ || closing_ || closed_) return;
    partialSince_ = ++partialGen_;
    const std::uint32_t ms = server_.cfg_.messageTimeoutMs;
    partial_.expires_after(std::chrono::milliseconds(ms));
    partial_.async_wait([self = shared_from_this(), gen = partialSince_, ms](const boost::system::error_code& ec) {
        if (ec || self->partialSince_ != gen || self->closing_ || self->closed_) return;
        if (self->inbuf_.empty())
            return self->refuse(Errc::Timeout, "sent no message within " + std::to_string(ms) +
                                                   " ms of connecting (daemon.message_timeout_ms)");
        self->refuse(Errc::Timeout, "a message stayed incomplete for " + std::to_string(ms) +
                                        " ms (daemon.message_timeout_ms); " + std::to_string(self->inbuf_.size()) +
                                        " byte(s) of it arrived");
    });
}

bool Connection::silentFor(std::chrono::steady_clock::duration grace) {
    if (closed_ || closing_ || greeted_ || !inbuf_.empty() || std::chrono::steady_clock::now() - accepted_ < grace)
        return false;
    int waiting = 0;
    return ::ioctl(socket_.native_handle(), FIONREAD, &waiting) == 0 && waiting == 0;
}

void Connection::evictSilent() {
    refuse(Errc::Busy, overLimit_ + "; this connection, kept for a control client, sent nothing for " +
                           std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                              std::chrono::steady_clock::now() - accepted_)
                                              .count()) +
                           " ms, and a newer one took its place");
}

void Connection::finish() {
    closing_ = true;
    flush();
}

HelloReply Connection::helloReply() { return server_.hello_; }
std::string Connection::busyFor(std::uint32_t role) { return role == kRoleControl ? std::string() : overLimit_; }
NodeCard Connection::nodeCard() { return server_.nodeCard_(); }
std::string Connection::statusJson() { return server_.statusJson_(server_.clients()); }
void Connection::join(const GroupOpen& m) { server_.groups_.join(*this, m); }
void Connection::leave() { server_.groups_.leave(*this, true); }
void Connection::abort() { server_.groups_.abort(*this); }
void Connection::openReport(const OpenReport& m) { server_.groups_.openReport(*this, m); }
Status Connection::shareRegion(const ShareRegion& m, int fd) { return server_.groups_.shareRegion(*this, m, fd); }
Status Connection::deviceAttach(const DeviceAttach& m) { return server_.groups_.deviceAttach(*this, m); }
void Connection::adopt(const Adopt& m, UniqueFd region, UniqueFd ring) {
    server_.groups_.adopt(*this, m, std::move(region), std::move(ring));
}

void Connection::refuse(Errc code, const std::string& why) {
    spdlog::warn("client {} (pid {}, uid {}): refused: {}: {}", id_, pid_, uid_, errcName(code), why);
    ErrorReply e{};
    e.errc = std::uint16_t(code);
    e.missingPeer = kNoPeer;
    setText(e.message, std::string(errcName(code)) + ": " + why);
    send(encode(kErrorReply, 0, e));
    closing_ = true;
    flush();
}

void Connection::sendVerdict(const Verdict& v, std::vector<int> fds) {
    if (v.errc != 0) dispatch_.groupRefused(); // a refused rank may not abort or signal anything
    send(encode(kVerdict, 0, v), fds);
}

void Connection::sendAdopted(const Adopted& m, int fd) {
    if (m.errc != 0) dispatch_.groupRefused(); // as a refused open: in no group
    send(encode(kAdopted, 0, m), fd >= 0 ? std::vector<int>{fd} : std::vector<int>{});
}

void Connection::sendGroupFailed(const GroupFailed& m) { send(encode(kGroupFailed, 0, m)); }

void Connection::sendPeerRegion(const PeerRegion& m, int fd) { send(encode(kPeerRegion, 0, m), {fd}); }

void Connection::sendPeerHostRegion(const PeerHostRegion& m, int fd) { send(encode(kPeerHostRegion, 0, m), {fd}); }

void Connection::send(Bytes bytes, const std::vector<int>& fds) {
    if (closed_ || closeQueued_) return;
    Outgoing o;
    o.bytes = std::move(bytes);
    for (int fd : fds) o.fds.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    out_.push_back(std::move(o));
    std::size_t queued = 0;
    for (const auto& q : out_) queued += q.bytes.size() - q.sent;
    if (queued > kMaxQueuedOutput) {
        spdlog::warn("client {} (pid {}): does not read its replies; dropped", id_, pid_);
        return closeLater();
    }
    flush();
}

void Connection::flush() {
    while (!closed_ && !writing_ && !out_.empty()) {
        Outgoing& o = out_.front();
        std::vector<int> fds;
        if (o.sent == 0)
            for (const auto& fd : o.fds) fds.push_back(fd.get());
        const ssize_t n = sendWithFds(socket_.native_handle(), ByteView(o.bytes).subspan(o.sent), fds);
        if (n > 0) {
            o.sent += std::size_t(n);
            o.fds.clear();
            if (o.sent == o.bytes.size()) out_.pop_front();
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            writing_ = true;
            socket_.async_wait(Local::socket::wait_write, [self = shared_from_this()](const boost::system::error_code& ec) {
                self->writing_ = false;
                if (ec) return self->close();
                self->flush();
            });
            return;
        }
        return closeLater();
    }
    if (closing_ && out_.empty() && !closed_) close();
}

void Connection::closeLater() {
    if (closed_ || closeQueued_) return;
    closeQueued_ = true;
    out_.clear();
    boost::asio::post(socket_.get_executor(), [self = shared_from_this()] { self->close(); });
}

void Connection::close() {
    if (closed_) return;
    closed_ = true;
    partialSince_ = 0;
    partial_.cancel();
    if (dispatch_.inGroup()) server_.groups_.leave(*this, false);
    dispatch_.dropped();
    boost::system::error_code ec;
    socket_.close(ec);
    out_.clear();
    spdlog::debug("client {}: closed", id_);
    server_.forget(id_);
}

void Connection::shutdown() { close(); }

Server::Server(asio::io_context& io, const DaemonConfig& cfg, GroupTable& groups,
               std::function<std::string(std::size_t clients)> statusJson,
               HelloReply hello, std::function<NodeCard()> nodeCard)
    : io_(io), cfg_(cfg), groups_(groups), statusJson_(std::move(statusJson)), hello_(hello),
      nodeCard_(std::move(nodeCard)), acceptor_(io), acceptPause_(io) {}

Server::~Server() { stop(); }

namespace {

// "socket path P: its directory D is not writable by this daemon (uid U): Read-only file system (...)".
// The socket is made (and a stale one replaced) in that directory: a start
// that cannot would fail every retry alike, so it is a bad path (exit 2),
// not a passing condition (exit 1, which the unit restarts every 2 s).
std::string unwritable(const std::string& named, const std::string& dir, int err) {
    return named + ": its directory " + dir + " is not writable by this daemon (uid " + std::to_string(::geteuid()) +
           "): " + std::strerror(err) +
           " (choose a directory it may write; under the tpfabricd unit only /run/tpfabric is writable, "
           "ProtectSystem=strict)";
}

// The directory the socket is made in ("." for a bare name).
std::string socketDirOf(const std::string& path) {
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    return parent.empty() ? "." : parent.string();
}

} // namespace

Status checkSocketPath(const std::string& path) {
    constexpr std::size_t kMaxPath = sizeof(sockaddr_un::sun_path) - 1; // sun_path ends in a NUL
    const std::string named = "socket path " + path;
    if (path.empty()) return {Errc::ConfigError, "socket path is empty"};
    if (path.size() > kMaxPath)
        return {Errc::ConfigError, named + " is " + std::to_string(path.size()) +
                                       " bytes; a Unix socket path holds at most " + std::to_string(kMaxPath) +
                                       " (sun_path): choose a shorter --socket or daemon.socket"};
    const std::string dir = socketDirOf(path);
    struct stat st {};
    if (const int r = ::stat(dir.c_str(), &st); r != 0 || !S_ISDIR(st.st_mode)) {
        const std::string why = r == 0 ? "is not a directory" : errno == ENOENT ? "does not exist" : std::strerror(errno);
        return {Errc::ConfigError, named + ": its directory " + dir + " " + why +
                                       " (tpfabricd creates no directory; systemd's RuntimeDirectory= makes /run/tpfabric)"};
    }
    if (::lstat(path.c_str(), &st) != 0) {
        if (errno == ENOENT) return okStatus();
        return {Errc::ConfigError, named + ": " + std::strerror(errno)};
    }
    if (!S_ISSOCK(st.st_mode))
        return {Errc::ConfigError, named + " exists and is not a socket (" +
                                       (S_ISREG(st.st_mode) ? "a regular file" : S_ISDIR(st.st_mode) ? "a directory"
                                        : S_ISLNK(st.st_mode) ? "a symbolic link" : "not a socket") +
                                       "); tpfabricd leaves it alone: remove it or choose another --socket or daemon.socket"};
    // A socket: served (connect succeeds, or the backlog is full) or stale (refused).
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) return {Errc::SystemError, std::string("socket: ") + std::strerror(errno)};
    int r;
    do r = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    while (r != 0 && errno == EINTR);
    if (r == 0 || errno == EAGAIN) return {Errc::SystemError, "another tpfabricd is serving " + path};
    if (errno == ECONNREFUSED) return okStatus(); // stale: left by a daemon that died
    return {Errc::ConfigError, named + ": connect: " + std::strerror(errno)};
}

Status checkSocketDirectory(const std::string& path) {
    const std::string dir = socketDirOf(path);
    if (::access(dir.c_str(), W_OK | X_OK) != 0) return {Errc::ConfigError, unwritable("socket path " + path, dir, errno)};
    return okStatus();
}

Status Server::listen(const std::string& path) {
    if (auto s = checkSocketPath(path); !s) return s;
    if (auto s = checkSocketDirectory(path); !s) return s;
    // What is left there is a stale socket; nothing else is ever removed.
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && ::unlink(path.c_str()) != 0 && errno != ENOENT)
        return {Errc::SystemError, "removing the stale socket " + path + ": " + std::strerror(errno)};
    boost::system::error_code ec;
    acceptor_.open(Local(), ec);
    if (!ec) acceptor_.bind(Local::endpoint(path), ec);
    if (!ec) acceptor_.listen(128, ec);
    if (ec) {
        const int err = ec.value();
        if (ec.category() == boost::system::system_category() && (err == EACCES || err == EROFS || err == EPERM))
            return {Errc::ConfigError, unwritable("socket path " + path, socketDirOf(path), err)};
        return {Errc::SystemError, "listening on " + path + ": " + ec.message()};
    }
    path_ = path;
    // Ours until stop(): only this inode is removed then (another daemon
    // may have replaced a socket removed by hand).
    if (::lstat(path.c_str(), &st) == 0) pathId_ = {st.st_dev, st.st_ino};
    if (const group* gr = ::getgrnam(cfg_.socketGroup.c_str())) {
        if (::chown(path.c_str(), ~0u, gr->gr_gid) != 0)
            spdlog::warn("socket {}: cannot give it to group {}: {}", path, cfg_.socketGroup, std::strerror(errno));
    } else {
        spdlog::warn("socket {}: group '{}' does not exist (daemon.socket_group); the socket keeps the daemon's group",
                     path, cfg_.socketGroup);
    }
    ::chmod(path.c_str(), 0660);
    accept();
    return okStatus();
}

void Server::accept() {
    acceptor_.async_accept([this](const boost::system::error_code& ec, Local::socket socket) {
        if (ec) {
            if (ec != asio::error::operation_aborted && acceptor_.is_open()) acceptFailed(ec);
            return;
        }
        if (acceptFailures_ > 0) {
            spdlog::info("accepting connections again after {} ms ({} failed accept(s))",
                         std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                               acceptFailingSince_)
                             .count(),
                         acceptFailures_);
            acceptFailures_ = 0;
        }
        ucred cred{};
        socklen_t len = sizeof cred;
        const bool known = ::getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
        std::string why = fullFor(known ? cred.uid : ~0u);
        std::size_t reserved = 0;
        for (const auto& [id, c] : connections_) reserved += c->isOpen() && c->overLimit();
        if (!why.empty() && reserved >= kControlReserve) {
            // Every kept slot is taken: the oldest that has said nothing for kSilentGrace makes room, so
            // connections that never speak cannot lock tpfabricctl out for daemon.message_timeout_ms.
            for (const auto& [id, c] : connections_)
                if (c->overLimit() && c->silentFor(kSilentGrace)) {
                    c->evictSilent();
                    --reserved;
                    break;
                }
        }
        if (!why.empty() && reserved < kControlReserve) {
            // Kept for a control client: its Hello decides (a rank's is refused Busy, by the same words).
            auto c = std::make_shared<Connection>(*this, std::move(socket), nextId_++, std::move(why));
            connections_[c->id()] = c;
            c->start();
        } else if (!why.empty()) {
            // Told in a reply, then closed: the client reports Busy, not a lost daemon.
            spdlog::warn("refusing a client (pid {}, uid {}): Busy: {}", known ? cred.pid : -1, known ? cred.uid : ~0u, why);
            ErrorReply e{};
            e.errc = std::uint16_t(Errc::Busy);
            e.missingPeer = kNoPeer;
            setText(e.message, "Busy: " + why);
            const Bytes reply = encode(kErrorReply, 0, e);
            (void)sendWithFds(socket.native_handle(), ByteView(reply), {}); // a fresh socket has room for it
            boost::system::error_code ignored;
            socket.close(ignored);
        } else {
            auto c = std::make_shared<Connection>(*this, std::move(socket), nextId_++);
            connections_[c->id()] = c;
            c->start();
        }
        accept();
    });
}

void Server::acceptFailed(const boost::system::error_code& ec) {
    if (acceptFailures_++ == 0) {
        acceptFailingSince_ = std::chrono::steady_clock::now();
        std::string files; // (no count of the open ones: listing /proc/self/fd needs a descriptor too)
        if (rlimit rl{}; ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
            files = " (the open-files limit is " + std::to_string(rl.rlim_cur) + ")";
        const bool fds = ec == asio::error::no_descriptors || ec.value() == ENFILE;
        spdlog::warn("accept: {}{}: new connections wait in the listen queue, accepting again every {} ms{}", ec.message(),
                     files, kAcceptPause.count(),
                     fds ? "; raise the open-files limit (LimitNOFILE= in the unit, ulimit -n) or lower "
                           "daemon.max_clients"
                         : "");
    }
    acceptPause_.expires_after(kAcceptPause);
    acceptPause_.async_wait([this](const boost::system::error_code& waitEc) {
        if (!waitEc && acceptor_.is_open()) accept();
    });
}

std::string Server::fullFor(std::uint32_t uid) const {
    // Counted without the connections kept for control clients beyond the limits.
    std::size_t n = 0;
    std::uint32_t mine = 0;
    for (const auto& [id, c] : connections_)
        if (c->isOpen() && !c->overLimit()) {
            ++n;
            mine += c->uid() == uid;
        }
    if (n >= cfg_.maxClients)
        return "tpfabricd serves " + std::to_string(n) + " clients, its limit (daemon.max_clients)";
    if (mine >= cfg_.maxClientsPerUid)
        return "uid " + std::to_string(uid) + " has " + std::to_string(mine) +
               " connections to tpfabricd, its share (daemon.max_clients_per_uid)";
    return {};
}

void Server::forget(std::uint64_t id) {
    // Defer: the connection may be inside one of its own handlers.
    asio::post(io_, [this, id] { connections_.erase(id); });
}

void Server::stop() {
    if (!acceptor_.is_open()) return;
    boost::system::error_code ec;
    acceptor_.close(ec);
    acceptPause_.cancel();
    auto all = connections_;
    for (auto& [id, c] : all) c->shutdown();
    if (path_.empty()) return;
    struct stat st {};
    if (::lstat(path_.c_str(), &st) != 0) return; // removed by hand: nothing of ours there
    if (std::pair{st.st_dev, st.st_ino} == pathId_) ::unlink(path_.c_str());
    else spdlog::warn("socket {} is no longer the one this daemon made (another daemon's?): left in place", path_);
}

} // namespace tpf::daemon
