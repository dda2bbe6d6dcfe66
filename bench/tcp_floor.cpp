// The tcp wire's floor: what moving `size` bytes between two processes over
// one TCP connection on loopback costs with nothing in between: no daemon,
// no frame header, no region, only both kernels' socket copies and a wake-up.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "bench/bench.hpp"
#include "bench/launch.hpp"

namespace tpf::bench {

namespace {

constexpr int kWaitS = 10; // a leg not answered by then: the peer is gone or stuck

bool sendAll(int fd, const std::uint8_t* p, std::size_t n) {
    while (n) {
        const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= std::size_t(w);
    }
    return true;
}

bool recvAll(int fd, std::uint8_t* p, std::size_t n) {
    while (n) {
        const ssize_t r = ::recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false; // EOF, an error, or SO_RCVTIMEO
        p += r;
        n -= std::size_t(r);
    }
    return true;
}

void tuned(int fd) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); // as the daemons' data links
    timeval tv{kWaitS, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

std::uint64_t maxOf(const std::vector<std::uint64_t>& v) {
    std::uint64_t m = 0;
    for (auto x : v) m = std::max(m, x);
    return m;
}

} // namespace

std::vector<Point> measureTcpFloor(const std::vector<std::uint64_t>& sizes, std::uint64_t iters, std::uint64_t warmup,
                                   std::string& pinning) {
    const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listener, 1) != 0 ||
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
        const std::string why = std::strerror(errno);
        if (listener >= 0) ::close(listener);
        throw std::runtime_error("tcp floor: cannot listen on 127.0.0.1: " + why);
    }
    FloorPins pins;
    pinning = pins.describe();
    const pid_t peer = spawnSelf({"tcp-floor-peer", "--fd", "3", "--iters", std::to_string(iters), "--warmup",
                                  std::to_string(warmup), "--sizes", joinSizes(sizes)},
                                 listener);
    pins.afterSpawn();
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool connected = fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    const std::string connectErr = std::strerror(errno);
    ::close(listener);
    auto fail = [&](const std::string& why) -> std::runtime_error {
        if (fd >= 0) ::close(fd);
        ::kill(peer, SIGKILL);
        ::waitpid(peer, nullptr, 0);
        return std::runtime_error("tcp floor: " + why);
    };
    if (!connected) throw fail("cannot connect to the tcp-floor-peer process on 127.0.0.1: " + connectErr);
    tuned(fd);

    const std::uint64_t maxSize = maxOf(sizes);
    std::vector<std::uint8_t> src(maxSize), dst(maxSize);
    for (std::size_t i = 0; i < maxSize; ++i) src[i] = std::uint8_t(i * 7 + 1);
    std::vector<Point> out;
    for (const std::uint64_t size : sizes) out.push_back(Point{Op::Gather, size, {}});
    for (std::uint32_t b = 0; b < kFloorBursts; ++b) {
        for (Point& p : out) {
            const std::uint64_t size = p.size, first = p.ns.size();
            std::memset(dst.data(), 0, size);
            for (std::uint64_t i = 0; i < floorBurstWarmup(warmup) + floorBurstIters(iters); ++i) {
                const std::uint64_t t0 = nowNs();
                if (!sendAll(fd, src.data(), size)) throw fail(std::string("send: ") + std::strerror(errno));
                if (!recvAll(fd, dst.data(), size))
                    throw fail("no answer from the tcp-floor-peer process within " + std::to_string(kWaitS) + " s");
                const std::uint64_t t1 = nowNs();
                if (i >= floorBurstWarmup(warmup)) p.ns.push_back((t1 - t0) / 2);
            }
            if (std::memcmp(src.data(), dst.data(), size) != 0) throw fail("the echoed bytes differ at size " + std::to_string(size));
            const double median = percentile(std::vector<std::uint64_t>(p.ns.begin() + std::ptrdiff_t(first), p.ns.end()), 0.5);
            p.bestBurstP50Ns = b == 0 ? median : std::min(p.bestBurstP50Ns, median);
        }
    }
    ::close(fd);
    int st = 0;
    ::waitpid(peer, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) throw std::runtime_error("tcp floor: the tcp-floor-peer process failed");
    return out;
}

int runTcpFloorPeer(int listener, const std::vector<std::uint64_t>& sizes, std::uint64_t iters, std::uint64_t warmup) {
    timeval tv{kWaitS, 0}; // accept too: a parent gone before it connected does not leave this process behind
    ::setsockopt(listener, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    ::close(listener);
    if (fd < 0) return 1;
    tuned(fd);
    std::vector<std::uint8_t> tmp(maxOf(sizes));
    for (std::uint32_t b = 0; b < kFloorBursts; ++b)
        for (const std::uint64_t size : sizes)
            for (std::uint64_t i = 0; i < floorBurstWarmup(warmup) + floorBurstIters(iters); ++i)
                if (!recvAll(fd, tmp.data(), size) || !sendAll(fd, tmp.data(), size)) return 1;
    ::close(fd);
    return 0;
}

} // namespace tpf::bench
