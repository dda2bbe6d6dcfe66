// Loopback TCP bootstrap: a star around rank 0. Framed with proto/bootstrap.hpp.
//
// The root is the one place that sees every rank, so it is the one that
// decides when the bootstrap cannot complete (a rank of another world, a rank
// twice, a rank gone or late): it tells every rank it can reach with a
// kRefuse frame, so that each fails at once with the same named reason
// instead of waiting for its own timeout. The root takes the joins in its
// first call, not in create, so that a rank that never starts is named within
// that call's deadline (Group::open's) rather than the create timeout.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "client/format.hpp"
#include "common/shm.hpp"
#include "common/unix_socket.hpp"
#include "proto/bootstrap.hpp"
#include <tpfabric/tpfabric.hpp>

namespace tpf {

using namespace bootstrap_proto;

namespace {

// The root gives up on missing joins and parts this long before the call's deadline,
// so that its refusal (naming the missing rank) reaches the others before
// their own wait for its answer ends.
constexpr std::uint64_t kRefuseLeadNs = 250 * 1000000ull;
constexpr int kRefuseSendMs = 200;
// After a failed join the root waits this long at most for the ranks it has
// not told yet (they are starting as it fails); later ones find no listener
// and end at their own create timeout, naming the root.
constexpr std::uint64_t kRefuseLingerNs = 1000 * 1000000ull;

using Clock = std::chrono::steady_clock;

std::uint64_t nsOf(Clock::time_point t) {
    return std::uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}

// Milliseconds left until `deadlineNs` (0 once it passed: a read still takes what already arrived).
int msLeft(std::uint64_t deadlineNs) {
    const std::uint64_t now = monotonicNs();
    return now >= deadlineNs ? 0 : int(std::min<std::uint64_t>((deadlineNs - now + 999999) / 1000000, 1u << 30));
}

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

// `who` names the peer in errors: "rank 2", "the bootstrap root (rank 0)".
// The socket layer speaks of "the daemon"; a bootstrap peer is never one.
Status sendFrame(int fd, std::uint16_t op, std::uint32_t seq, ByteView payload, int timeoutMs, const std::string& who) {
    Bytes b = encodeHeader(kBootstrapSpec, op, seq, std::uint32_t(payload.size()));
    b.insert(b.end(), payload.begin(), payload.end());
    auto s = sendMessage(fd, b, {}, timeoutMs);
    if (s) return s;
    if (s.code() == Errc::Timeout) return Error{Errc::Timeout, who + " takes no bootstrap data within " + std::to_string(timeoutMs) + " ms"};
    return Error{Errc::PeerLost, who + " closed its bootstrap connection (" + s.error().detail + ")"};
}

Status sendRefusal(int fd, const Error& why, std::uint32_t namedRank) {
    client_proto::ErrorReply r{};
    r.errc = std::uint16_t(why.code);
    r.missingPeer = namedRank;
    std::strncpy(r.message, why.detail.c_str(), sizeof r.message - 1);
    return sendFrame(fd, kRefuse, 0, ByteView(reinterpret_cast<const std::uint8_t*>(&r), sizeof r), kRefuseSendMs, "a rank");
}

// One frame of opcode `op` and sequence `seq` from `who`, or the root's
// refusal (any sequence), which becomes its error.
Result<Bytes> receiveFrame(int fd, std::uint16_t op, std::uint32_t seq, std::size_t bytes, int timeoutMs,
                           const std::string& who, bool* refused = nullptr) {
    auto m = receiveMessage(fd, kBootstrapSpec, timeoutMs);
    if (!m) {
        if (m.code() == Errc::Timeout)
            return Error{Errc::Timeout, who + " sent nothing within " + std::to_string(timeoutMs) + " ms"};
        if (m.code() == Errc::DaemonLost) // end of stream or a reset: the peer's process or its open is gone
            return Error{Errc::PeerLost, who + " closed its bootstrap connection (its process exited, or it gave up the open)"};
        return Error{m.code(), who + ": " + m.error().detail};
    }
    if (m->header.opcode == kRefuse) {
        auto r = decodeFixed<client_proto::ErrorReply>(m->payload, "bootstrap refusal");
        if (!r) return r.error();
        Errc code = Errc::GroupMismatch;
        errcFromWire(r->errc, code);
        if (refused) *refused = true;
        return Error{code, std::string(r->message) + "; told by " + who};
    }
    if (m->header.opcode != op || m->header.seq != seq || m->payload.size() != bytes || !m->fds.empty())
        return Error{Errc::BadMessage, format("{} sent an unexpected bootstrap message (opcode {}, {} bytes): is another program "
                                              "using this bootstrap address?",
                                              who, m->header.opcode, m->payload.size())};
    return std::move(m->payload);
}

std::string rankName(std::uint32_t r) { return "rank " + std::to_string(r); }

// "127.0.0.1:29500": the address a listening socket is bound to, for errors.
std::string boundAddress(int fd) {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    char ip[INET_ADDRSTRLEN] = "?";
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) ::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
    return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}
const std::string kRootName = "the bootstrap root (rank 0)";

} // namespace

Status Bootstrap::allGatherUntil(const void* mine, void* out, std::size_t bytes, Clock::time_point) {
    return allGather(mine, out, bytes);
}

Result<std::unique_ptr<TcpBootstrap>> TcpBootstrap::create(std::uint32_t rank, std::uint32_t world,
                                                           const std::string& hostPort, std::chrono::milliseconds timeout) {
    if (world == 0)
        return Error{Errc::OutOfRange, format("bootstrap: world 0 (a group has 1 to {} ranks)", kMaxWorld)};
    if (rank >= world)
        return Error{Errc::OutOfRange, format("bootstrap: rank {} not below world {} (ranks are 0..{})", rank, world, world - 1)};
    // The root's tables hold kMaxWorld ranks. A larger world elsewhere still
    // joins, so that the root refuses it by name to every rank.
    if (rank == 0 && world > kMaxWorld)
        return Error{Errc::OutOfRange, format("bootstrap: world {} outside 1..{}", world, kMaxWorld)};
    auto addr = resolve(hostPort);
    if (!addr) return addr.error();
    std::unique_ptr<TcpBootstrap> b(new TcpBootstrap());
    b->rank_ = rank;
    b->world_ = world;
    b->timeoutMs_ = int(timeout.count());
    // Only the root holds a socket per rank (world <= kMaxWorld there); a
    // rank of an oversized world (refused by the root) needs just the root's.
    b->peers_.reset(new int[std::min(world, kMaxWorld)]);
    for (std::uint32_t i = 0; i < std::min(world, kMaxWorld); ++i) b->peers_[i] = -1;
    const std::uint64_t deadline = monotonicNs() + std::uint64_t(timeout.count()) * 1000000ull;
    if (rank == 0) {
        b->listenFd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (b->listenFd_ < 0) return Error{Errc::SystemError, std::string("bootstrap: socket: ") + std::strerror(errno)};
        const int one = 1;
        ::setsockopt(b->listenFd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(b->listenFd_, reinterpret_cast<const sockaddr*>(&*addr), sizeof *addr) != 0)
            return Error{Errc::SystemError, "bootstrap: bind " + hostPort + ": " + std::strerror(errno)};
        if (::listen(b->listenFd_, int(kMaxWorld)) != 0)
            return Error{Errc::SystemError, std::string("bootstrap: listen: ") + std::strerror(errno)};
        if (world == 1) // nobody to wait for
            if (auto s = b->acceptRanks(hostPort, deadline); !s) return s.error();
        return b; // the others' joins are taken by the first call, within its deadline
    }
    for (;;) {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return Error{Errc::SystemError, std::string("bootstrap: socket: ") + std::strerror(errno)};
        if (::connect(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof *addr) == 0) {
            const int one = 1;
            ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            b->peers_[0] = fd; // closed by the destructor from here on
            const std::uint32_t who[2] = {rank, world};
            if (auto s = sendFrame(fd, kJoin, 0, ByteView(reinterpret_cast<const std::uint8_t*>(who), 8),
                                   msLeft(deadline), kRootName);
                !s)
                return s.error();
            return b; // a refusal, if any, is read by the first allGather
        }
        const int err = errno;
        ::close(fd);
        if (monotonicNs() >= deadline)
            return Error{Errc::Timeout, format("{} at {} accepted no connection within {} ms (last: {})", kRootName, hostPort,
                                              timeout.count(), std::string_view(std::strerror(err)))};
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

// The root, in its first call: accept every rank's join until all of
// world-1 joined, shortly before the call's deadline. A join that cannot
// belong to this bootstrap (another world, a rank twice), or a rank that has
// not joined by then, ends it: every rank that joined or joins until the
// deadline is refused by name, so none waits for a bootstrap that will not
// complete.
Status TcpBootstrap::acceptRanks(const std::string& hostPort, std::uint64_t deadline) {
    const int one = 1;
    const std::uint64_t startNs = monotonicNs();
    const std::uint64_t lead = deadline > startNs ? std::min(kRefuseLeadNs, (deadline - startNs) / 2) : 0;
    const std::uint64_t joinsBy = deadline - lead;
    Error failure{};
    std::uint32_t named = kNoPeer;   // the rank the failure names
    std::uint32_t expected = world_; // ranks 1..expected-1 should hear of a failure
    std::uint32_t told = 0;          // bit r: rank r heard of it
    std::uint32_t joined = 1;
    std::uint64_t until = joinsBy; // after a failure: the linger's end
    const auto fail = [&](Error e, std::uint32_t r) {
        failure = std::move(e);
        named = r;
        until = std::min(deadline, monotonicNs() + kRefuseLingerNs);
        for (std::uint32_t q = 1; q < world_; ++q)
            if (peers_[q] >= 0) {
                (void)sendRefusal(peers_[q], failure, named);
                told |= 1u << q;
            }
    };
    const auto everyoneTold = [&] {
        for (std::uint32_t q = 1; q < expected; ++q)
            if (!(told >> q & 1u)) return false;
        return true;
    };
    while (failure.code == Errc::Ok ? joined < world_ : !everyoneTold()) {
        pollfd p{listenFd_, POLLIN, 0};
        if (::poll(&p, 1, msLeft(until)) <= 0) { // a join already queued is still taken once the time is up
            if (monotonicNs() < until) continue;
            if (failure.code == Errc::Ok) {
                std::uint32_t missing = 1;
                while (missing < world_ && peers_[missing] >= 0) ++missing;
                fail(Error{Errc::Timeout, format("{} did not join the bootstrap at {} within {} ms ({} of {} ranks joined): is "
                                                 "its process running, with this address?",
                                                 rankName(missing), hostPort, (joinsBy - std::min(joinsBy, startNs)) / 1000000,
                                                 joined, world_)},
                     missing);
                if (!everyoneTold()) continue; // the linger: a rank starting now still hears why
            }
            break;
        }
        const int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) continue;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        auto hello = receiveFrame(fd, kJoin, 0, 8, msLeft(until), "a joining process");
        if (!hello) { // not a rank of ours (a port scan, another program): ignored
            ::close(fd);
            continue;
        }
        std::uint32_t who[2] = {0, 0};
        std::memcpy(who, hello->data(), 8);
        const std::uint32_t r = who[0], w = who[1];
        expected = std::max(expected, std::min(w, kMaxWorld)); // a rank of a larger world expects to hear too
        if (failure.code == Errc::Ok) {
            if (w != world_) {
                fail(Error{Errc::GroupMismatch, format("{} opens with world {}, rank 0 with world {}", rankName(r), w, world_)}, r);
            } else if (r >= world_) {
                fail(Error{Errc::OutOfRange, format("{} joins the bootstrap of world {}", rankName(r), w)}, r);
            } else if (r == 0 || peers_[r] >= 0) {
                fail(Error{Errc::GroupMismatch, format("two processes join the bootstrap as {} of world {} (each rank must open "
                                                       "with its own rank number)",
                                                       rankName(r), w)},
                     r);
            } else {
                peers_[r] = fd;
                ++joined;
                continue;
            }
        }
        (void)sendRefusal(fd, failure, named);
        if (r < 32) told |= 1u << r;
        ::close(fd);
    }
    ::close(std::exchange(listenFd_, -1)); // late joiners are refused by the kernel: nothing here answers them
    if (failure.code != Errc::Ok) {
        refused_ = failure;
        return failure;
    }
    return okStatus();
}

TcpBootstrap::~TcpBootstrap() {
    if (listenFd_ >= 0) ::close(listenFd_);
    if (peers_)
        for (std::uint32_t i = 0; i < std::min(world_, kMaxWorld); ++i)
            if (peers_[i] >= 0) ::close(peers_[i]);
}

Status TcpBootstrap::allGather(const void* mine, void* out, std::size_t bytes) {
    return allGatherUntil(mine, out, bytes, Clock::now() + std::chrono::milliseconds(timeoutMs_));
}

Status TcpBootstrap::allGatherUntil(const void* mine, void* out, std::size_t bytes, Clock::time_point until) {
    if (refused_.code != Errc::Ok) return refused_;
    const std::uint64_t deadline = nsOf(until);
    if (listenFd_ >= 0) // the root's first call: the joins first, within this call's deadline
        if (auto s = acceptRanks(boundAddress(listenFd_), deadline); !s) return s;
    const std::uint32_t seq = ++seq_;
    auto* o = static_cast<std::uint8_t*>(out);
    const ByteView part(static_cast<const std::uint8_t*>(mine), bytes);
    if (rank_ != 0) {
        // A root that refused has closed its end: our part may then fail to
        // send, but its refusal still waits to be read, and says more.
        const Status sent = sendFrame(peers_[0], kGatherPart, seq, part, msLeft(deadline), kRootName);
        bool refused = false;
        auto all = receiveFrame(peers_[0], kGatherAll, seq, bytes * world_, sent ? msLeft(deadline) : 0, kRootName, &refused);
        if (all && sent) {
            std::memcpy(o, all->data(), all->size());
            return okStatus();
        }
        if (refused || sent) refused_ = all ? Error{Errc::BadMessage, "bootstrap: an answer to a part never sent"} : all.error();
        else refused_ = sent.error();
        if (refused_.code == Errc::Timeout && !refused)
            refused_ = Error{Errc::Timeout, kRootName + " did not answer within the deadline: it, or a rank it waits for, "
                                                        "has not reached the same call"};
        return refused_;
    }
    // The root: every part, in whatever order they come, until shortly before
    // the deadline; the first rank gone or late ends the call on every rank.
    std::memcpy(o, mine, bytes);
    const std::uint64_t now = monotonicNs();
    const std::uint64_t lead = deadline > now ? std::min(kRefuseLeadNs, (deadline - now) / 2) : 0; // a short call keeps half
    const std::uint64_t partsBy = deadline - lead;
    std::uint32_t pending = 0;
    for (std::uint32_t r = 1; r < world_; ++r) pending |= 1u << r;
    Error failure{};
    std::uint32_t named = kNoPeer;
    while (pending && failure.code == Errc::Ok) {
        pollfd p[kMaxWorld];
        std::uint32_t rankOf[kMaxWorld], n = 0;
        for (std::uint32_t r = 1; r < world_; ++r)
            if (pending >> r & 1u) {
                p[n] = pollfd{peers_[r], POLLIN, 0};
                rankOf[n++] = r;
            }
        if (::poll(p, n, msLeft(partsBy)) == 0) { // what already arrived is still taken once the time is up
            named = rankOf[0];
            failure = Error{Errc::Timeout, rankName(named) + " sent nothing within the deadline: it is connected but has "
                                                             "not reached the same call (for Group::open: it has not called it)"};
            break;
        }
        for (std::uint32_t i = 0; i < n && failure.code == Errc::Ok; ++i) {
            if (!p[i].revents) continue;
            const std::uint32_t r = rankOf[i];
            auto got = receiveFrame(peers_[r], kGatherPart, seq, bytes, msLeft(deadline), rankName(r));
            if (!got) {
                failure = got.error();
                named = r;
                break;
            }
            std::memcpy(o + r * bytes, got->data(), bytes);
            pending &= ~(1u << r);
        }
    }
    if (failure.code != Errc::Ok) {
        for (std::uint32_t r = 1; r < world_; ++r) (void)sendRefusal(peers_[r], failure, named); // a late rank too
        refused_ = failure;
        return failure;
    }
    for (std::uint32_t r = 1; r < world_; ++r)
        if (auto s = sendFrame(peers_[r], kGatherAll, seq, ByteView(o, bytes * world_), msLeft(deadline), rankName(r)); !s) {
            refused_ = s.error();
            return s;
        }
    return okStatus();
}

} // namespace tpf
