// Framed messages over a Unix stream socket, with file descriptors passed as
// SCM_RIGHTS beside a message. Blocking with timeouts: the client library and
// tpfabricctl use these; the daemon has its own non-blocking side.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/fd.hpp"
#include <tpfabric/error.hpp>
#include "proto/wire.hpp"

namespace tpf {

inline constexpr std::size_t kMaxFdsPerMessage = 8;

/// One non-blocking sendmsg (MSG_NOSIGNAL | MSG_DONTWAIT) of `bytes` with `fds`
/// as SCM_RIGHTS; no fds, no control data. At most kMaxFdsPerMessage fds
/// (checked by the caller). Returns sendmsg's value; errno is set when it is -1.
ssize_t sendWithFds(int fd, ByteView bytes, std::span<const int> fds);

/// What one receiveWithFds got.
struct Received {
    ssize_t n = 0;       ///< recvmsg's value: bytes read, 0 at end of stream, -1 with errno set
    bool fdsCut = false; ///< MSG_CTRUNC: the kernel cut off fds beyond what a message may carry
};

/// One non-blocking recvmsg (MSG_DONTWAIT | MSG_CMSG_CLOEXEC) into `dst`; when
/// it reads bytes, every SCM_RIGHTS fd that came with them is moved into `fds`.
Received receiveWithFds(int fd, std::span<std::uint8_t> dst, std::vector<UniqueFd>& fds);

/// One received message: checked header, payload, and the fds that came with it.
struct Message {
    MsgHeader header{};
    Bytes payload;
    std::vector<UniqueFd> fds;
};

/// Connect to a Unix stream socket; DaemonUnreachable names the path and errno.
/// A listener whose backlog is full (a daemon that stopped accepting) is
/// retried until `timeoutMs` has passed, then reported as such.
Result<UniqueFd> connectUnix(const std::string& path, int timeoutMs = 5000);

/// What sits at `path` when it is there and is no socket ("a regular file",
/// "a directory", "a device or pipe"), else "": connect() says "Connection
/// refused" for a file or a directory, which sends people looking for a
/// stopped daemon instead of a wrong TPF_SOCKET / --socket.
std::string nonSocketAt(const std::string& path);

/// What to do when connecting to `path` was refused permission (EACCES,
/// EPERM): names what refused (the first directory on the way without search
/// permission, else the socket) with its owner, group and mode, and the
/// remedy ("add your user to group tpfabric and log in again, or use sudo").
std::string permissionHint(const std::string& path);

/// Send all bytes (blocking, up to timeoutMs), `fds` attached to the first byte.
Status sendMessage(int fd, ByteView bytes, std::span<const int> fds, int timeoutMs);

/// Receive one whole message checked against `spec`, waiting up to timeoutMs.
/// A closed connection is DaemonLost; a timeout is Timeout.
Result<Message> receiveMessage(int fd, const ProtocolSpec& spec, int timeoutMs);

/// Whether the peer closed (or reset) the connection; never blocks.
bool peerClosed(int fd);

} // namespace tpf
