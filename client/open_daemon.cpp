// Group::open with the rank's own daemon: hello and node card, the group's
// verdict, its region, ring and proxy event, the same-node peers' regions,
// and each peer's transport.
#include "client/open_daemon.hpp"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "client/format.hpp"
#include "common/unix_socket.hpp"

namespace tpf {

using namespace client_proto;

namespace {

// The daemon refuses a group at the open deadline (naming the rank that did
// not join); its verdict may take this long to arrive.
constexpr std::chrono::milliseconds kVerdictGrace{250};

std::string socketPathOf(const Group::Impl& g) {
    if (!g.options.socketPath.empty()) return g.options.socketPath;
    if (!g.env.socket.empty()) return g.env.socket;
    return "/run/tpfabric/tpfabricd.sock";
}

// One request, one reply of the expected opcode (an ErrorReply becomes its error).
Result<Message> request(Group::Impl& g, const Bytes& msg, std::uint16_t replyOp, int timeoutMs) {
    const Status sent = sendMessage(g.socket.get(), msg, {}, timeoutMs);
    // A daemon that refuses a client at once (Busy) may have closed before the
    // request arrived; its ErrorReply is still there to read.
    auto m = receiveMessage(g.socket.get(), kReplySpec, sent ? timeoutMs : 0);
    if (!sent && (!m || m->header.opcode != kErrorReply)) return sent.error();
    if (!m) return m.error();
    if (m->header.opcode == kErrorReply) {
        auto e = decodeFixed<ErrorReply>(m->payload, "ErrorReply");
        if (!e) return e.error();
        Errc code = Errc::Unavailable;
        errcFromWire(e->errc, code);
        std::string why = e->message; // "Busy: ...": the name once, in describe()
        if (const std::string name(errcName(code)); why.rfind(name + ": ", 0) == 0) why.erase(0, name.size() + 2);
        return Error{code, "daemon refused: " + why};
    }
    if (m->header.opcode != replyOp)
        return Error{Errc::BadMessage, format("daemon answered opcode {}, expected {}", m->header.opcode, replyOp)};
    return m;
}

// The group's verdict, checked: the daemon's refusal as its error, else the
// message with the region, ring and proxy-event fds.
Result<Message> askDaemon(Group::Impl& g, const std::uint8_t (&groupId)[16], const std::vector<RosterEntry>& roster,
                          OpenClock::time_point deadline, Verdict& v) {
    GroupOpen open;
    std::memcpy(open.fixed.groupId, groupId, 16);
    open.fixed.rank = g.rank;
    open.fixed.world = g.world;
    open.fixed.maxBytes = roster[g.rank].maxBytes;
    open.fixed.timeoutMs = std::uint32_t(std::min(msLeft(deadline), 600000)); // the daemon refuses by then, naming who is missing
    open.fixed.regionKind = kRegionHost;
    open.fixed.flags = g.options.buffers == Buffers::Device ? std::uint32_t(kOpenGpuDoorbells)
                       : g.env.hostDirect                   ? std::uint32_t(kOpenHostDirect)
                                                            : 0u;
    g.openFlags = open.fixed.flags;
    open.roster = roster;
    auto m = request(g, encode(g.seq++, open), kVerdict, msLeft(deadline + kVerdictGrace));
    if (!m) return m.error();
    auto decoded = decodeFixed<Verdict>(m->payload, "Verdict");
    if (!decoded) return decoded.error();
    v = *decoded;
    if (v.errc != 0) {
        Errc code = Errc::Unavailable;
        errcFromWire(v.errc, code);
        return Error{code, v.reason};
    }
    if (m->fds.size() != kVerdictFds) return Error{Errc::BadMessage, format("verdict came with {} fds, expected 3", m->fds.size())};
    if (v.rank != g.rank || v.world != g.world) return Error{Errc::GroupMismatch, "verdict for another rank"};
    return m;
}

// The group's own region, this rank's command ring and the proxy's event fd.
Status mapRegions(Group::Impl& g, const Verdict& v, Message& m) {
    auto layout = Layout::of(v.world, v.slotBytes, v.stripes);
    if (!layout || layout->totalBytes() != v.regionBytes) return Error{Errc::BadMessage, "verdict region size does not follow its layout"};
    if (!RingLayout::validEntries(v.ringEntries)) return Error{Errc::BadMessage, format("verdict ring entries {}", v.ringEntries)};
    g.layout = *layout;
    g.agreedCap = v.agreedCap;
    g.handle = v.groupHandle;
    std::memcpy(g.wires.data(), v.wires, kMaxWorld);
    auto region = mapShared(m.fds[0].get(), v.regionBytes, true);
    if (!region) return region.error();
    const RingLayout rl{v.ringEntries};
    auto ring = mapShared(m.fds[1].get(), rl.totalBytes(), true);
    if (!ring) return ring.error();
    g.region = std::move(*region);
    g.ringMap = std::move(*ring);
    g.ring = RingView(g.ringMap.data(), rl);
    if (g.ring.header().magic == kRingMagic && g.ring.header().version != kRingVersion)
        return Error{Errc::VersionMismatch, format("command ring version {}, this libtpfabric reads {}: tpfabricd and libtpfabric "
                                                   "are of different releases; install them together",
                                                   g.ring.header().version, kRingVersion)};
    if (g.ring.header().magic != kRingMagic || g.ring.header().group != g.handle)
        return Error{Errc::BadMessage, "command ring header does not match the verdict"};
    g.proxyEvent = std::move(m.fds[2]);
    g.regionFd = std::move(m.fds[0]); // kept to hand back to a restarted daemon (client/readopt.cpp)
    g.ringFd = std::move(m.fds[1]);
    return okStatus();
}

// Each peer as the verdict offers it: its wire, and the same-node peers'
// regions the daemon hands over (one PeerHostRegion each right after the
// verdict, in rank order).
Status receiveOffers(Group::Impl& g, const Verdict& v, OpenClock::time_point deadline, std::span<PeerOffer> offers) {
    if (v.hostPeers && !(g.options.buffers == Buffers::Host && g.env.hostDirect))
        return Error{Errc::BadMessage, "verdict hands over host regions this rank did not ask for"};
    for (std::uint32_t q = 0; q < g.world; ++q) {
        offers[q].rank = q;
        offers[q].wire = v.wires[q];
        if (!(v.hostPeers >> q & 1u)) continue;
        auto m = receiveMessage(g.socket.get(), kReplySpec, msLeft(deadline + kVerdictGrace));
        if (!m) return m.error();
        if (m->header.opcode != kPeerHostRegion || m->fds.size() != 1)
            return Error{Errc::BadMessage, format("expected rank {}'s host region after the verdict, got opcode {} with {} fds", q,
                                                  m->header.opcode, m->fds.size())};
        auto p = decodeFixed<PeerHostRegion>(m->payload, "PeerHostRegion");
        if (!p) return p.error();
        if (p->rank != q || p->bytes != v.regionBytes)
            return Error{Errc::BadMessage, format("host region of rank {} ({} bytes) where rank {}'s ({} bytes) belongs", p->rank,
                                                  p->bytes, q, v.regionBytes)};
        auto region = mapShared(m->fds[0].get(), v.regionBytes, true); // sealed against shrinking: no SIGBUS
        if (!region) return region.error();
        offers[q].region = std::move(*region);
    }
    return okStatus();
}

} // namespace

std::string daemonSocketPath(const Group::Impl& g) { return socketPathOf(g); }

Status meetDaemon(Group::Impl& g, std::uint64_t maxBytes, RosterEntry& entry, OpenClock::time_point deadline) {
    const std::string path = socketPathOf(g);
    auto fd = connectUnix(path, msLeft(deadline));
    if (!fd) { // what to do, as tpfabricctl says it: the engine's log is where an operator reads this
        if (const std::string what = nonSocketAt(path); !what.empty())
            return Error{fd.error().code, format("{} is {}, not a socket (TPF_SOCKET or the open's socket path option names the "
                                                 "daemon's socket: its daemon.socket)",
                                                 path, what)};
        const std::string& why = fd.error().detail;
        if (why.ends_with(std::strerror(EACCES)) || why.ends_with(std::strerror(EPERM)))
            return Error{fd.error().code, format("{} ({})", why, permissionHint(path))};
        return Error{fd.error().code, why + " (is tpfabricd running? systemctl status tpfabricd; another socket: TPF_SOCKET or "
                                            "the open's socket path option)"};
    }
    g.socket.reset(std::move(*fd));
    auto hello = request(g, encode(kHello, g.seq++, Hello{kRoleRank, 0, 0}), kHelloReply, msLeft(deadline));
    if (!hello) return hello.error();
    if (auto h = decodeFixed<HelloReply>(hello->payload, "HelloReply"); !h) return h.error();
    auto cardMsg = request(g, encodeEmpty(kNodeCardRequest, g.seq++), kNodeCard, msLeft(deadline));
    if (!cardMsg) return cardMsg.error();
    auto card = decodeNodeCard(cardMsg->payload);
    if (!card) return card.error();
    std::memcpy(entry.nodeId, card->fixed.nodeId, 16);
    std::memcpy(entry.endpointAddr, card->fixed.endpointAddr, 16);
    entry.endpointPort = card->fixed.endpointPort;
    entry.peerWire = card->fixed.peerWire;
    entry.pid = std::uint32_t(::getpid());
    entry.maxBytes = std::min(maxBytes, card->fixed.usableCap);
    return okStatus();
}

Status joinDaemon(Group::Impl& g, const std::uint8_t (&groupId)[16], const std::vector<RosterEntry>& roster,
                  OpenClock::time_point deadline) {
    Verdict v{};
    std::memcpy(g.groupId.data(), groupId, 16);
    g.roster = roster;
    auto m = askDaemon(g, groupId, roster, deadline, v);
    if (!m) return m.error();
    if (auto s = mapRegions(g, v, *m); !s) return s;
    std::array<PeerOffer, kMaxWorld> offers;
    if (auto s = receiveOffers(g, v, deadline, offers); !s) return s;
    return connectTransports(g, std::span(offers).first(g.world));
}

} // namespace tpf
