#include "common/unix_socket.hpp"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>

#include "common/shm.hpp"

namespace tpf {

namespace {

// Control-message buffer for up to kMaxFdsPerMessage fds.
struct FdControl {
    alignas(cmsghdr) char bytes[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
};

// Point `msg` at `ctl` carrying `fds` as SCM_RIGHTS; no fds, no control data.
void attachFds(msghdr& msg, FdControl& ctl, std::span<const int> fds) {
    if (fds.empty()) return;
    msg.msg_control = ctl.bytes;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
}

// Move every SCM_RIGHTS fd of a received `msg` into `out`; false on MSG_CTRUNC.
bool takeFds(const msghdr& msg, std::vector<UniqueFd>& out) {
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(const_cast<msghdr*>(&msg), c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
            for (std::size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i) {
                int fd;
                std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                out.emplace_back(fd);
            }
    return !(msg.msg_flags & MSG_CTRUNC);
}

Error sysError(Errc code, const std::string& what) { return {code, what + ": " + std::strerror(errno)}; }

// Wait for `events` until the deadline; false on timeout.
bool waitFor(int fd, short events, std::uint64_t deadlineNs) {
    for (;;) {
        const std::uint64_t now = monotonicNs();
        if (now >= deadlineNs) return false;
        pollfd p{fd, events, 0};
        const int ms = int((deadlineNs - now + 999999) / 1000000);
        const int r = ::poll(&p, 1, ms);
        if (r > 0) return true;
        if (r < 0 && errno != EINTR) return true; // let the I/O call report it
    }
}

// Read exactly `len` bytes, collecting any fds that arrive.
Status readExact(int fd, std::uint8_t* dst, std::size_t len, std::vector<UniqueFd>& fds, std::uint64_t deadlineNs) {
    std::size_t got = 0;
    while (got < len) {
        const auto [n, fdsCut] = receiveWithFds(fd, {dst + got, len - got}, fds);
        if (n > 0) {
            if (fdsCut) return {Errc::BadMessage, "more file descriptors than a message may carry"};
            got += std::size_t(n);
            continue;
        }
        if (n == 0) return {Errc::DaemonLost, "connection closed by the daemon"};
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return sysError(Errc::DaemonLost, "recvmsg");
        if (!waitFor(fd, POLLIN, deadlineNs)) return {Errc::Timeout, "no reply from the daemon in time"};
    }
    return okStatus();
}

} // namespace

ssize_t sendWithFds(int fd, ByteView bytes, std::span<const int> fds) {
    iovec iov{const_cast<std::uint8_t*>(bytes.data()), bytes.size()};
    FdControl control;
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    attachFds(msg, control, fds);
    return ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

Received receiveWithFds(int fd, std::span<std::uint8_t> dst, std::vector<UniqueFd>& fds) {
    iovec iov{dst.data(), dst.size()};
    FdControl control;
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.bytes;
    msg.msg_controllen = sizeof control.bytes;
    Received r;
    r.n = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r.n > 0) r.fdsCut = !takeFds(msg, fds);
    return r;
}

Result<UniqueFd> connectUnix(const std::string& path, int timeoutMs) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof addr.sun_path)
        return Error{Errc::DaemonUnreachable, "socket path too long: " + path};
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    // Non-blocking: a Unix listener with a full backlog answers EAGAIN at
    // once (a blocking connect would wait for as long as it stays full).
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) return sysError(Errc::SystemError, "socket");
    const std::uint64_t deadline = monotonicNs() + std::uint64_t(timeoutMs > 0 ? timeoutMs : 0) * 1000000ull;
    while (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN || monotonicNs() >= deadline) {
            if (errno == EAGAIN)
                return Error{Errc::DaemonUnreachable, "connect to " + path + ": the daemon accepted no connection within " +
                                                          std::to_string(timeoutMs) + " ms (its backlog is full)"};
            return sysError(Errc::DaemonUnreachable, "connect to " + path);
        }
        ::usleep(10000);
    }
    // Every user of the socket waits with poll and MSG_DONTWAIT; keep it blocking as before.
    const int flags = ::fcntl(fd.get(), F_GETFL);
    if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) return sysError(Errc::SystemError, "fcntl");
    return fd;
}

namespace {

/// "owner root, group tpfabric, mode 0660", by name where the name is known.
std::string ownership(const struct stat& st) {
    const passwd* pw = ::getpwuid(st.st_uid);
    const group* gr = ::getgrgid(st.st_gid);
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
    return "owner " + (pw ? std::string(pw->pw_name) : "uid " + std::to_string(st.st_uid)) + ", group " +
           (gr ? std::string(gr->gr_name) : "gid " + std::to_string(st.st_gid)) + ", mode " + mode;
}

std::string groupName(gid_t gid) {
    const group* gr = ::getgrgid(gid);
    return gr ? std::string(gr->gr_name) : std::to_string(gid);
}

} // namespace

// What to do about EACCES: name what refused us (a directory on the way, else
// the socket) with its actual owner and group, which socket_group may have changed.
std::string permissionHint(const std::string& path) {
    // The group's members get in where the group has the permission; elsewhere only the owner (or sudo) does.
    const auto remedy = [](const struct stat& st, mode_t groupBit) {
        if (!(st.st_mode & groupBit)) return std::string("its group may not either: use sudo");
        return "add your user to group " + groupName(st.st_gid) + " and log in again, or use sudo";
    };
    // Each directory on the way needs search (x) permission; the first that refuses is the one to name.
    const std::filesystem::path p(path);
    std::filesystem::path dir;
    for (auto it = p.begin(); it != p.end() && std::next(it) != p.end(); ++it) {
        dir /= *it;
        struct stat st {};
        if (::access(dir.c_str(), X_OK) != 0 && errno == EACCES && ::stat(dir.c_str(), &st) == 0)
            return "its directory " + dir.string() + " (" + ownership(st) + ") does not let you in: " +
                   remedy(st, S_IXGRP);
    }
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
        // Group root: daemon.socket_group named no group when the daemon
        // started (the socket kept root's), or names root; joining root is no remedy.
        if (st.st_gid == 0 && (st.st_mode & S_IWGRP))
            return "the socket (" + ownership(st) + ") refuses you: use sudo; or let daemon.socket_group name a group "
                   "of yours (tpfabric, made by systemd-sysusers, is the default), which must exist when tpfabricd "
                   "starts, and restart it";
        return "the socket (" + ownership(st) + ") refuses you: " + remedy(st, S_IWGRP);
    }
    return "you may not open the socket or a directory on its way: check their owners and groups (ls -ld), or use sudo";
}

std::string nonSocketAt(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || S_ISSOCK(st.st_mode)) return {};
    return S_ISREG(st.st_mode) ? "a regular file" : S_ISDIR(st.st_mode) ? "a directory" : "a device or pipe";
}

Status sendMessage(int fd, ByteView bytes, std::span<const int> fds, int timeoutMs) {
    const std::uint64_t deadline = monotonicNs() + std::uint64_t(timeoutMs) * 1000000ull;
    std::size_t sent = 0;
    bool fdsSent = fds.empty();
    while (sent < bytes.size()) {
        if (!fdsSent && fds.size() > kMaxFdsPerMessage) return {Errc::OutOfRange, "too many fds for one message"};
        const ssize_t n = sendWithFds(fd, bytes.subspan(sent), fdsSent ? std::span<const int>() : fds);
        if (n > 0) {
            sent += std::size_t(n);
            fdsSent = true;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!waitFor(fd, POLLOUT, deadline)) return {Errc::Timeout, "daemon does not take our message"};
            continue;
        }
        return sysError(Errc::DaemonLost, "sendmsg");
    }
    return okStatus();
}

Result<Message> receiveMessage(int fd, const ProtocolSpec& spec, int timeoutMs) {
    const std::uint64_t deadline = monotonicNs() + std::uint64_t(timeoutMs) * 1000000ull;
    Message m;
    std::uint8_t head[sizeof(MsgHeader)];
    if (auto s = readExact(fd, head, sizeof head, m.fds, deadline); !s) return s.error();
    auto h = decodeHeader(head, spec);
    if (!h) return h.error();
    m.header = *h;
    m.payload.resize(h->length);
    if (auto s = readExact(fd, m.payload.data(), m.payload.size(), m.fds, deadline); !s) return s.error();
    return m;
}

bool peerClosed(int fd) {
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
}

} // namespace tpf
