// Loopback TCP bootstrap: a star around rank 0. Framed with proto/bootstrap.hpp.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "common/shm.hpp"
#include "common/unix_socket.hpp"
#include "proto/bootstrap.hpp"
#include <tpfabric/tpfabric.hpp>

namespace tpf {

using namespace bootstrap_proto;

namespace {

Error sysError(const std::string& what) { return {Errc::SystemError, what + ": " + std::strerror(errno)}; }

// "host:port": an IPv4 address or a name that resolves to one (MASTER_ADDR
// style), and a port 1..65535. Never throws: a bad address is a named error.
Result<sockaddr_in> resolve(const std::string& hostPort) {
    const auto colon = hostPort.rfind(':');
    if (colon == std::string::npos || colon == 0)
        return Error{Errc::InvalidArgument, "bootstrap address '" + hostPort + "' is not host:port"};
    const std::string host = hostPort.substr(0, colon), port = hostPort.substr(colon + 1);
    unsigned long p = 0;
    for (char c : port) p = (c >= '0' && c <= '9' && p <= 65535) ? p * 10 + unsigned(c - '0') : 70000;
    if (port.empty() || p == 0 || p > 65535)
        return Error{Errc::InvalidArgument, "bootstrap port '" + port + "' in '" + hostPort + "' is not 1..65535"};
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0 || !found)
        return Error{Errc::InvalidArgument, "bootstrap host '" + host + "' does not resolve to an IPv4 address: " +
                                                (rc ? ::gai_strerror(rc) : "no address")};
    sockaddr_in a = *reinterpret_cast<const sockaddr_in*>(found->ai_addr);
    ::freeaddrinfo(found);
    a.sin_port = htons(std::uint16_t(p));
    return a;
}

Status sendFrame(int fd, std::uint16_t op, std::uint32_t seq, ByteView payload, int timeoutMs) {
    Bytes b = encodeHeader(kBootstrapSpec, op, seq, std::uint32_t(payload.size()));
    b.insert(b.end(), payload.begin(), payload.end());
    return sendMessage(fd, b, {}, timeoutMs);
}

Result<Bytes> receiveFrame(int fd, std::uint16_t op, std::uint32_t seq, std::size_t bytes, int timeoutMs) {
    auto m = receiveMessage(fd, kBootstrapSpec, timeoutMs);
    if (!m) return Error{m.code() == Errc::DaemonLost ? Errc::PeerLost : m.code(), "bootstrap: " + m.error().detail};
    if (m->header.opcode != op || m->header.seq != seq || m->payload.size() != bytes || !m->fds.empty())
        return Error{Errc::BadMessage, "bootstrap: unexpected message (opcode " + std::to_string(m->header.opcode) +
                                           ", " + std::to_string(m->payload.size()) + " bytes)"};
    return std::move(m->payload);
}

} // namespace

Result<std::unique_ptr<TcpBootstrap>> TcpBootstrap::create(std::uint32_t rank, std::uint32_t world,
                                                           const std::string& hostPort, std::chrono::milliseconds timeout) {
    if (world == 0 || rank >= world) return Error{Errc::OutOfRange, "bootstrap: rank " + std::to_string(rank) + " of " + std::to_string(world)};
    auto addr = resolve(hostPort);
    if (!addr) return addr.error();
    std::unique_ptr<TcpBootstrap> b(new TcpBootstrap());
    b->rank_ = rank;
    b->world_ = world;
    b->timeoutMs_ = int(timeout.count());
    b->peers_.reset(new int[world]);
    for (std::uint32_t i = 0; i < world; ++i) b->peers_[i] = -1;
    const std::uint64_t deadline = monotonicNs() + std::uint64_t(timeout.count()) * 1000000ull;
    if (rank == 0) {
        b->listenFd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        const int one = 1;
        ::setsockopt(b->listenFd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(b->listenFd_, reinterpret_cast<sockaddr*>(&*addr), sizeof *addr) != 0)
            return sysError("bootstrap: bind " + hostPort);
        if (::listen(b->listenFd_, int(world)) != 0) return sysError("bootstrap: listen");
        for (std::uint32_t joined = 1; joined < world;) {
            pollfd p{b->listenFd_, POLLIN, 0};
            const std::uint64_t now = monotonicNs();
            if (now >= deadline) return Error{Errc::Timeout, "bootstrap: only " + std::to_string(joined) + " of " + std::to_string(world) + " ranks connected"};
            if (::poll(&p, 1, int((deadline - now) / 1000000 + 1)) <= 0) continue;
            const int fd = ::accept4(b->listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0) continue;
            ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            auto hello = receiveFrame(fd, kJoin, 0, 8, b->timeoutMs_);
            std::uint32_t who[2] = {0, 0};
            if (hello) std::memcpy(who, hello->data(), 8);
            if (!hello || who[1] != world || who[0] == 0 || who[0] >= world || b->peers_[who[0]] >= 0) {
                ::close(fd);
                continue;
            }
            b->peers_[who[0]] = fd;
            ++joined;
        }
        return b;
    }
    for (;;) {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (::connect(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof *addr) == 0) {
            const int one = 1;
            ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            const std::uint32_t who[2] = {rank, world};
            if (auto s = sendFrame(fd, kJoin, 0, ByteView(reinterpret_cast<const std::uint8_t*>(who), 8), b->timeoutMs_); !s) {
                ::close(fd);
                return s.error();
            }
            b->peers_[0] = fd;
            return b;
        }
        ::close(fd);
        if (monotonicNs() >= deadline) return sysError("bootstrap: connect to rank 0 at " + hostPort);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

TcpBootstrap::~TcpBootstrap() {
    if (listenFd_ >= 0) ::close(listenFd_);
    if (peers_)
        for (std::uint32_t i = 0; i < world_; ++i)
            if (peers_[i] >= 0) ::close(peers_[i]);
}

Status TcpBootstrap::allGather(const void* mine, void* out, std::size_t bytes) {
    const std::uint32_t seq = ++seq_;
    auto* o = static_cast<std::uint8_t*>(out);
    const ByteView part(static_cast<const std::uint8_t*>(mine), bytes);
    if (rank_ != 0) {
        if (auto s = sendFrame(peers_[0], kGatherPart, seq, part, timeoutMs_); !s) return s;
        auto all = receiveFrame(peers_[0], kGatherAll, seq, bytes * world_, timeoutMs_);
        if (!all) return all.error();
        std::memcpy(o, all->data(), all->size());
        return okStatus();
    }
    std::memcpy(o, mine, bytes);
    for (std::uint32_t r = 1; r < world_; ++r) {
        auto p = receiveFrame(peers_[r], kGatherPart, seq, bytes, timeoutMs_);
        if (!p) return Error{p.code(), "rank " + std::to_string(r) + ": " + p.error().detail};
        std::memcpy(o + r * bytes, p->data(), bytes);
    }
    for (std::uint32_t r = 1; r < world_; ++r)
        if (auto s = sendFrame(peers_[r], kGatherAll, seq, ByteView(o, bytes * world_), timeoutMs_); !s) return s;
    return okStatus();
}

} // namespace tpf
