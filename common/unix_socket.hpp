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
#include "proto/error.hpp"
#include "proto/wire.hpp"

namespace tpf {

inline constexpr std::size_t kMaxFdsPerMessage = 8;

/// Control-message buffer for up to kMaxFdsPerMessage fds.
struct FdControl {
    alignas(cmsghdr) char bytes[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
};

/// Point `msg` at `ctl` carrying `fds` as SCM_RIGHTS; no fds, no control data.
/// At most kMaxFdsPerMessage (checked by the caller).
void attachFds(msghdr& msg, FdControl& ctl, std::span<const int> fds);

/// Move every SCM_RIGHTS fd of a received `msg` into `out`. False when the
/// kernel cut some off (MSG_CTRUNC: more than a message may carry).
bool takeFds(const msghdr& msg, std::vector<UniqueFd>& out);

/// One received message: checked header, payload, and the fds that came with it.
struct Message {
    MsgHeader header{};
    Bytes payload;
    std::vector<UniqueFd> fds;
};

/// Connect to a Unix stream socket; DaemonUnreachable names the path and errno.
Result<UniqueFd> connectUnix(const std::string& path);

/// Send all bytes (blocking, up to timeoutMs), `fds` attached to the first byte.
Status sendMessage(int fd, ByteView bytes, std::span<const int> fds, int timeoutMs);

/// Receive one whole message checked against `spec`, waiting up to timeoutMs.
/// A closed connection is DaemonLost; a timeout is Timeout.
Result<Message> receiveMessage(int fd, const ProtocolSpec& spec, int timeoutMs);

/// Whether the peer closed (or reset) the connection; never blocks.
bool peerClosed(int fd);

} // namespace tpf
