// Framed messages over a Unix stream socket, with file descriptors passed as
// SCM_RIGHTS beside a message. Blocking with timeouts: the client library and
// tpfabricctl use these; the daemon has its own non-blocking side.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/fd.hpp"
#include "proto/error.hpp"
#include "proto/wire.hpp"

namespace tpf {

inline constexpr std::size_t kMaxFdsPerMessage = 8;

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
