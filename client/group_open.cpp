// Group::open: intents, node card, roster over the bootstrap, the daemon's
// verdict, all-or-none agreement; close and abort.
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "client/impl.hpp"
#include "common/unix_socket.hpp"
#include "proto/bootstrap.hpp"

namespace tpf {

using namespace client_proto;
using namespace bootstrap_proto;

namespace {

std::string socketPathOf(const Group::Impl& g) {
    if (!g.options.socketPath.empty()) return g.options.socketPath;
    if (!g.env.socket.empty()) return g.env.socket;
    return "/run/tpfabric/tpfabricd.sock";
}

using Clock = std::chrono::steady_clock;

// What is left of the open's deadline, in ms (at least 1: a read still takes what already arrived).
int msLeft(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return int(std::clamp<std::int64_t>(left, 1, 1 << 30));
}

// The daemon refuses a group at the open deadline (naming the rank that did
// not join); its verdict may take this long to arrive.
constexpr std::chrono::milliseconds kVerdictGrace{250};
// Bootstrap calls end this long after the open deadline: time for the
// bootstrap's root to name a late rank to the others (TcpBootstrap refuses
// 250 ms before it), while every rank still ends within openTimeout + 1 s.
constexpr std::chrono::milliseconds kBootstrapGrace{500};

// The caller's bootstrap with the open's deadline on every call (also the
// GPU attach's votes): the one place Group::open's bootstrap calls are bounded.
class BoundedBootstrap final : public Bootstrap {
public:
    BoundedBootstrap(Bootstrap& inner, Clock::time_point deadline) : inner_(inner), deadline_(deadline) {}
    std::uint32_t rank() const override { return inner_.rank(); }
    std::uint32_t world() const override { return inner_.world(); }
    Status allGather(const void* mine, void* out, std::size_t bytes) override {
        return inner_.allGatherUntil(mine, out, bytes, deadline_);
    }

private:
    Bootstrap& inner_;
    Clock::time_point deadline_;
};

Fallback fallbackOf(const Group::Impl& g) {
    if (g.options.fallback) return *g.options.fallback;
    return g.env.fallback.value_or(Fallback::Nccl);
}

// Round 0's record of this rank, flags and envErrc still 0.
OpenIntent intentOf(std::uint32_t rank, std::uint32_t world, std::uint64_t maxBytes) {
    // testing::dataProtocol: kDataProtocol, or what a test makes this rank say.
    return OpenIntent{kIntentMagic, kIntentVersion, 0, rank, world, maxBytes, 0, testing::dataProtocol(), 0};
}

// Round 0's verdict: a caller's mistake or a bad environment on any rank
// fails the open on every rank (no fallback: it is not the fabric's fault).
Status checkIntents(const Group::Impl& g, const std::vector<OpenIntent>& all, const Error& envError) {
    for (std::uint32_t r = 0; r < g.world; ++r) {
        const OpenIntent& i = all[r];
        const std::string who = "rank " + std::to_string(r);
        if (i.magic != kIntentMagic || i.version != kIntentVersion)
            return Error{Errc::GroupMismatch, "bootstrap " + who + " sent no tpfabric open record (is another program using this bootstrap?)"};
        if (i.dataProtocol != all[g.rank].dataProtocol)
            return Error{Errc::VersionMismatch,
                         who + "'s libtpfabric speaks data protocol " + std::to_string(i.dataProtocol) + ", rank " +
                             std::to_string(g.rank) + "'s " + std::to_string(all[g.rank].dataProtocol) +
                             (std::min(i.dataProtocol, all[g.rank].dataProtocol) == 0 ? " (0: a release before the field)" : "") +
                             ": their calls would not understand each other; give every rank the same libtpfabric release"};
        if (i.world != g.world)
            return Error{Errc::GroupMismatch, who + " opens with world " + std::to_string(i.world) + ", rank " +
                                                  std::to_string(g.rank) + " with world " + std::to_string(g.world)};
        if (i.rank != r && i.rank >= g.world)
            return Error{Errc::GroupMismatch, "bootstrap " + who + " opens as rank " + std::to_string(i.rank) +
                                                  ", not below world " + std::to_string(g.world)};
        if (i.rank != r)
            return Error{Errc::GroupMismatch, "bootstrap " + who + " opens as rank " + std::to_string(i.rank) +
                                                  " (every rank must pass its bootstrap rank; two ranks " +
                                                  std::to_string(i.rank) + "?)"};
        if (i.maxBytes == 0) // that rank itself fails OutOfRange
            return Error{Errc::GroupMismatch, who + " opens with max_bytes 0"};
        if (i.envErrc == std::uint16_t(Errc::InvalidArgument)) // that rank itself fails InvalidArgument
            return Error{Errc::GroupMismatch, who + " opens with invalid Options (its error names them)"};
        if ((i.flags & kIntentDevice) != (all[g.rank].flags & kIntentDevice))
            return Error{Errc::GroupMismatch, who + " opens with " + ((i.flags & kIntentDevice) ? "device" : "host") +
                                                  " buffers, rank " + std::to_string(g.rank) + " with " +
                                                  ((all[g.rank].flags & kIntentDevice) ? "device" : "host") + " buffers"};
    }
    for (std::uint32_t r = 0; r < g.world; ++r)
        if (all[r].envErrc) {
            if (r == g.rank) return envError;
            return Error{Errc::ConfigError, "rank " + std::to_string(r) + " has an invalid TPF_* variable (its error names it)"};
        }
    return okStatus();
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
        return Error{Errc::BadMessage, "daemon answered opcode " + std::to_string(m->header.opcode) + ", expected " +
                                           std::to_string(replyOp)};
    return m;
}

// Connect, introduce ourselves, and fill our roster entry from the node card.
Status meetDaemon(Group::Impl& g, std::uint64_t maxBytes, RosterEntry& entry, Clock::time_point deadline) {
    const std::string path = socketPathOf(g);
    auto fd = connectUnix(path, msLeft(deadline));
    if (!fd) { // what to do, as tpfabricctl says it: the engine's log is where an operator reads this
        if (const std::string what = nonSocketAt(path); !what.empty())
            return Error{fd.error().code, path + " is " + what + ", not a socket (TPF_SOCKET or the open's socket path "
                                                                 "option names the daemon's socket: its daemon.socket)"};
        const std::string& why = fd.error().detail;
        if (why.ends_with(std::strerror(EACCES)) || why.ends_with(std::strerror(EPERM)))
            return Error{fd.error().code, why + " (" + permissionHint(path) + ")"};
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
    entry.pid = std::uint32_t(::getpid());
    entry.maxBytes = std::min(maxBytes, card->fixed.usableCap);
    return okStatus();
}

// Host-direct: the same-node peers' regions, one PeerHostRegion each right
// after the verdict. Every peer the daemon did not hand over is rung for.
Status mapPeerRegions(Group::Impl& g, const Verdict& v, Clock::time_point deadline) {
    if (v.hostPeers && !(g.options.buffers == Buffers::Host && g.env.hostDirect))
        return Error{Errc::BadMessage, "verdict hands over host regions this rank did not ask for"};
    for (std::uint32_t q = 0; q < g.world; ++q) {
        if (!(v.hostPeers >> q & 1u)) continue;
        auto m = receiveMessage(g.socket.get(), kReplySpec, msLeft(deadline + kVerdictGrace));
        if (!m) return m.error();
        if (m->header.opcode != kPeerHostRegion || m->fds.size() != 1)
            return Error{Errc::BadMessage, "expected rank " + std::to_string(q) + "'s host region after the verdict, got opcode " +
                                               std::to_string(m->header.opcode) + " with " + std::to_string(m->fds.size()) + " fds"};
        auto p = decodeFixed<PeerHostRegion>(m->payload, "PeerHostRegion");
        if (!p) return p.error();
        if (p->rank != q || p->bytes != v.regionBytes)
            return Error{Errc::BadMessage, "host region of rank " + std::to_string(p->rank) + " (" + std::to_string(p->bytes) +
                                               " bytes) where rank " + std::to_string(q) + "'s (" +
                                               std::to_string(v.regionBytes) + " bytes) belongs"};
        auto region = mapShared(m->fds[0].get(), v.regionBytes, true); // sealed against shrinking: no SIGBUS
        if (!region) return region.error();
        g.peerRegions[q] = std::move(*region);
    }
    g.directPeers = v.hostPeers;
    g.ringsProxy = false;
    for (std::uint32_t q = 0; q < g.world; ++q) g.ringsProxy |= q != g.rank && !(g.directPeers >> q & 1u);
    return okStatus();
}

// Join at the daemon and map what the verdict hands over.
Status joinGroup(Group::Impl& g, const std::uint8_t (&groupId)[16], const std::vector<RosterEntry>& roster,
                 Clock::time_point deadline) {
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
    open.roster = roster;
    auto m = request(g, encode(g.seq++, open), kVerdict, msLeft(deadline + kVerdictGrace));
    if (!m) return m.error();
    auto v = decodeFixed<Verdict>(m->payload, "Verdict");
    if (!v) return v.error();
    if (v->errc != 0) {
        Errc code = Errc::Unavailable;
        errcFromWire(v->errc, code);
        return Error{code, v->reason};
    }
    if (m->fds.size() != kVerdictFds) return Error{Errc::BadMessage, "verdict came with " + std::to_string(m->fds.size()) + " fds, expected 3"};
    if (v->rank != g.rank || v->world != g.world) return Error{Errc::GroupMismatch, "verdict for another rank"};
    auto layout = Layout::of(v->world, v->slotBytes, v->stripes);
    if (!layout || layout->totalBytes() != v->regionBytes) return Error{Errc::BadMessage, "verdict region size does not follow its layout"};
    if (!RingLayout::validEntries(v->ringEntries)) return Error{Errc::BadMessage, "verdict ring entries " + std::to_string(v->ringEntries)};
    g.layout = *layout;
    g.agreedCap = v->agreedCap;
    g.handle = v->groupHandle;
    std::memcpy(g.wires.data(), v->wires, kMaxWorld);
    auto region = mapShared(m->fds[0].get(), v->regionBytes, true);
    if (!region) return region.error();
    const RingLayout rl{v->ringEntries};
    auto ring = mapShared(m->fds[1].get(), rl.totalBytes(), true);
    if (!ring) return ring.error();
    g.region = std::move(*region);
    g.ringMap = std::move(*ring);
    g.ring = RingView(g.ringMap.data(), rl);
    if (g.ring.header().magic == kRingMagic && g.ring.header().version != kRingVersion)
        return Error{Errc::VersionMismatch, "command ring version " + std::to_string(g.ring.header().version) +
                                                ", this libtpfabric reads " + std::to_string(kRingVersion) +
                                                ": tpfabricd and libtpfabric are of different releases; install them together"};
    if (g.ring.header().magic != kRingMagic || g.ring.header().group != g.handle)
        return Error{Errc::BadMessage, "command ring header does not match the verdict"};
    g.proxyEvent = std::move(m->fds[2]);
    return mapPeerRegions(g, *v, deadline);
}

// Set by Group::open's fallBack: read by lastOpenMayFallBack() (C: tpf_last_open_may_fall_back).
thread_local bool openMayFallBack = false;

} // namespace

Group::Group(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Group::~Group() { close(); }

Result<std::unique_ptr<Group>> Group::open(Bootstrap& caller, std::uint32_t rank, std::uint32_t world,
                                           std::uint64_t maxBytes, const Options& options) {
    openMayFallBack = false;
    // One deadline for the whole open: every bootstrap call, every daemon request.
    const Clock::time_point deadline = Clock::now() + options.openTimeout;
    BoundedBootstrap boot(caller, deadline + kBootstrapGrace);
    Error argError{};
    if (world < 1 || world > kMaxWorld) argError = Error{Errc::OutOfRange, "world " + std::to_string(world) + " outside 1..16"};
    else if (rank >= world)
        argError = Error{Errc::OutOfRange, "rank " + std::to_string(rank) + " not below world " + std::to_string(world)};
    else if (maxBytes == 0)
        argError = Error{Errc::OutOfRange, "max_bytes is 0: pass the largest shard, in bytes, this rank will pass"};
    else if (options.timeout.count() <= 0 || options.openTimeout.count() <= 0 || options.spin.count() < 0)
        argError = Error{Errc::InvalidArgument,
                         "Options: timeout " + std::to_string(options.timeout.count()) + " ms, openTimeout " +
                             std::to_string(options.openTimeout.count()) + " ms, spin " + std::to_string(options.spin.count()) +
                             " us: both timeouts must be positive and spin not negative (defaults 5000 ms, 30000 ms, 20 us)"};
    else if (boot.rank() != rank || boot.world() != world)
        argError = Error{Errc::GroupMismatch, "rank " + std::to_string(rank) + " opens with world " + std::to_string(world) +
                                                  " over a bootstrap of world " + std::to_string(boot.world()) + " (as its rank " +
                                                  std::to_string(boot.rank()) + ")"};
    if (argError.code != Errc::Ok) {
        // Still take part in round 0 where the bootstrap can carry it: the
        // others then fail at once, told which rank opens with what, instead
        // of waiting for this one until their deadline.
        const std::uint32_t bootWorld = boot.world();
        if (bootWorld >= 2 && bootWorld <= kMaxWorld && boot.rank() < bootWorld) {
            OpenIntent intent = intentOf(rank, world, maxBytes);
            if (argError.code == Errc::InvalidArgument) intent.envErrc = std::uint16_t(Errc::InvalidArgument);
            std::vector<OpenIntent> all(bootWorld);
            (void)boot.allGather(&intent, all.data(), sizeof intent);
        }
        return argError;
    }
    auto impl = std::make_unique<Impl>();
    impl->rank = rank;
    impl->world = world;
    impl->options = options;
    impl->agreedCap = maxBytes;
    const bool device = options.buffers == Buffers::Device;
    void* const comm = device ? fallbackComm(options, caller) : nullptr; // the caller's own (an NcclBootstrap's)
    // gpuAttach sees only the bounded wrapper of the caller's bootstrap, not
    // the NcclBootstrap inside it: hand it the communicator by the options.
    impl->options.ncclComm = comm;
    auto env = readClientEnv(); // a bad variable is reported in round 0, so that every rank fails with it
    if (env) impl->env = *env;
    // Round 0: intents. Nobody has contacted a daemon yet. World 1 too: its
    // bootstrap's one-record exchange checks the caller's bootstrap, and
    // TPF_DISABLE turns it off as any group.
    OpenIntent intent = intentOf(rank, world, maxBytes);
    if (!env) intent.envErrc = std::uint16_t(Errc::ConfigError);
    if (impl->env.disable) intent.flags |= kIntentDisabled;
    if (fallbackOf(*impl) == Fallback::Error)
        intent.flags |= kIntentFallbackError | (impl->options.fallback ? 0 : kIntentFallbackFromEnv);
    if (comm) intent.flags |= kIntentHasComm;
    if (device) intent.flags |= kIntentDevice;
    std::vector<OpenIntent> intents(world);
    if (auto s = boot.allGather(&intent, intents.data(), sizeof intent); !s) return s.error();
    if (auto s = checkIntents(*impl, intents, env ? Error{} : env.error()); !s) return s.error();
    // The group's fallback, decided alike on every rank: NCCL where every rank
    // has a communicator and none asked for errors instead (TPF_DISABLE: where
    // every rank has a communicator, whatever the policy).
    bool allComm = device;
    std::uint32_t disabledBy = kNoPeer, errorPolicyOf = kNoPeer; // the first rank of each
    for (std::uint32_t r = 0; r < world; ++r) {
        allComm = allComm && (intents[r].flags & kIntentHasComm);
        if ((intents[r].flags & kIntentFallbackError) && errorPolicyOf == kNoPeer) errorPolicyOf = r;
        if ((intents[r].flags & kIntentDisabled) && disabledBy == kNoPeer) disabledBy = r;
    }
    const bool anyFallbackError = errorPolicyOf != kNoPeer;
    const bool ncclFallback = disabledBy != kNoPeer ? allComm : allComm && !anyFallbackError;
    const auto fallBack = [&](const Error& why) -> Result<std::unique_ptr<Group>> {
        impl->gpu.reset();
        if (impl->socket) { // for the daemon's metrics only: no reply, a failure changes nothing
            const OpenReport report{std::uint16_t(why.code), ncclFallback ? kOutcomeNccl : kOutcomeUnavailable, 0, 0};
            (void)sendMessage(impl->socket.get(), encode(kOpenReport, impl->seq++, report), {}, 1000);
        }
        impl->socket.reset(); // leaves the daemon's group, if joined
        impl->proxyEvent.reset();
        impl->ring = RingView();
        impl->ringMap = Mapping();
        impl->region = Mapping();
        impl->peerRegions = {};
        impl->directPeers = 0;
        if (ncclFallback) {
            std::fprintf(stderr, "tpfabric: rank %u: fabric path unavailable (%s); NCCL takes this group's calls\n", rank,
                         why.describe().c_str());
            if (auto s = gpuFallback(*impl, comm); !s) return s.error();
            return std::unique_ptr<Group>(new Group(std::move(impl)));
        }
        openMayFallBack = disabledBy != kNoPeer || !anyFallbackError;
        std::string because;
        if (disabledBy == kNoPeer && anyFallbackError)
            because = intents[errorPolicyOf].flags & kIntentFallbackFromEnv
                          ? " (TPF_FALLBACK=error on rank " + std::to_string(errorPolicyOf) + ")"
                          : " (fallback = error in rank " + std::to_string(errorPolicyOf) + "'s open options)";
        else if (device && !allComm)
            because = " (no NCCL communicator to fall back to on every rank)";
        // A full daemon where the group may not fall back: Busy itself, so that
        // the caller can tell "retry later" from a node without a fabric path.
        // Where it may, Unavailable: what lastOpenMayFallBack() and Python's
        // Communicator read.
        if (why.code == Errc::Busy && !openMayFallBack) return Error{Errc::Busy, why.detail + because};
        // "Unavailable: TPF_DISABLE=1 on rank 2", not "Unavailable: Unavailable: ..."
        return Error{Errc::Unavailable, (why.code == Errc::Unavailable ? why.detail : why.describe()) + because};
    };
    // TPF_DISABLE on any rank: NCCL (or Unavailable for host buffers) on every
    // rank, whatever the fallback policy, without a daemon or a probe.
    if (disabledBy != kNoPeer)
        return fallBack(Error{Errc::Unavailable, "TPF_DISABLE=1 on rank " + std::to_string(disabledBy)});

    // World 1: a plain copy on this rank's own buffers, no daemon to meet.
    if (world == 1) {
        if (device)
            if (auto s = gpuAttach(*impl, boot); !s) return fallBack(s.error());
        return std::unique_ptr<Group>(new Group(std::move(impl)));
    }

    // Round 1: cards. Everyone learns rank 0's group id and whether every rank has a daemon.
    OpenCard mine{};
    if (rank == 0 && ::getrandom(mine.groupId, sizeof mine.groupId, 0) != sizeof mine.groupId)
        return Error{Errc::SystemError, "getrandom for the group id failed"};
    Error local{};
    if (auto s = meetDaemon(*impl, maxBytes, mine.entry, deadline); !s) {
        local = s.error();
        mine.errc = std::uint16_t(local.code);
    }
    std::vector<OpenCard> cards(world);
    if (auto s = boot.allGather(&mine, cards.data(), sizeof mine); !s) return s.error();
    // This rank's own failure first: its log must name its own daemon's
    // problem, not send its reader to another rank's node.
    Error verdict = mine.errc != 0 ? local : Error{};
    for (std::uint32_t r = 0; r < world && verdict.code == Errc::Ok; ++r)
        if (cards[r].errc != 0) {
            Errc code = Errc::Unavailable;
            errcFromWire(cards[r].errc, code);
            verdict = r == rank ? local : Error{code, "rank " + std::to_string(r) + " has no usable daemon"};
        }

    // Join at the daemon, then round 2: everyone's verdict; all or none.
    if (verdict.code == Errc::Ok) {
        std::vector<RosterEntry> roster;
        for (const auto& c : cards) roster.push_back(c.entry);
        if (auto s = joinGroup(*impl, cards[0].groupId, roster, deadline); !s) verdict = s.error();
    }
    OpenVote vote{std::uint16_t(verdict.code), 0, 0};
    std::vector<OpenVote> votes(world);
    if (auto s = boot.allGather(&vote, votes.data(), sizeof vote); !s) return s.error();
    for (std::uint32_t r = 0; r < world && verdict.code == Errc::Ok; ++r)
        if (votes[r].errc != 0) {
            Errc code = Errc::Unavailable;
            errcFromWire(votes[r].errc, code);
            verdict = Error{code, "rank " + std::to_string(r) + " could not join: " + std::string(errcName(code))};
        }
    // Device groups: host regions registered, ipc peers mapped, the load-time
    // probe passed, on every rank (gpuAttach votes inside), or none.
    if (verdict.code == Errc::Ok && device)
        if (auto s = gpuAttach(*impl, boot); !s) verdict = s.error();
    if (verdict.code != Errc::Ok) return fallBack(verdict);
    return std::unique_ptr<Group>(new Group(std::move(impl)));
}

void Group::close() {
    if (!impl_ || impl_->closed) return;
    impl_->closed = true;
    if (impl_->forked()) {
        // A fork()ed child's copy: the device state, the ring's counts and the
        // daemon's membership are the parent's. Only the child's own mappings
        // and descriptors go (the socket is /dev/null here already).
        (void)impl_->broken();
        (void)impl_->gpu.release(); // CUDA cannot be called in a fork()ed child
    } else {
        gpuFlushStats(*impl_); // the daemon folds the ring's counts when this rank leaves
        impl_->gpu.reset();    // unregisters the mappings below; waits for nothing
    }
    // Orderly leave; a dead daemon or a timeout changes nothing here.
    if (impl_->socket && !impl_->forked() && sendMessage(impl_->socket.get(), encodeEmpty(kClose, impl_->seq++), {}, 1000))
        (void)receiveMessage(impl_->socket.get(), kReplySpec, 1000);
    impl_->socket.reset();
    impl_->proxyEvent.reset(); // every fd goes now, not when the Group is destroyed
    impl_->ring = RingView();
    impl_->ringMap = Mapping();
    impl_->region = Mapping();
    impl_->peerRegions = {};
    impl_->directPeers = 0;
    if (impl_->failure.code == Errc::Ok) impl_->failure = Error{Errc::Closed, "the group was closed"};
}

bool lastOpenMayFallBack() { return openMayFallBack; }

Status Group::abort() {
    Impl& g = *impl_;
    if (g.forked()) return g.broken(), g.failure; // the parent's group: its peers are not this process's to abort
    if (g.closed) return Error{Errc::Closed, "abort on a closed group"};
    const Error aborted{Errc::Aborted, "rank " + std::to_string(g.rank) + " (this rank) aborted the group"};
    if (g.nccl) {
        (void)g.fail(aborted);
        return Error{Errc::Unsupported, "the group runs on NCCL, which has no abort: only this rank's group is broken"};
    }
    // Broken here even when the daemon cannot be told (it is gone: the others see DaemonLost).
    const Status told = g.world == 1 || !g.socket
                            ? okStatus()
                            : sendMessage(g.socket.get(), encode(kAbort, g.seq++, Abort{}), {}, 1000);
    (void)g.fail(aborted);
    if (!told) return Error{Errc::DaemonLost, "the daemon could not be told of the abort: " + told.error().describe()};
    return okStatus();
}

Status Group::check() const {
    if (impl_->broken()) return impl_->failure;
    if (impl_->gpu) return gpuCheck(*impl_);
    return okStatus();
}

std::uint32_t Group::rank() const { return impl_->rank; }
std::uint32_t Group::world() const { return impl_->world; }
std::uint64_t Group::agreedCap() const { return impl_->agreedCap; }
bool Group::fits(std::size_t bytes) const { return tpf::fits(bytes, impl_->agreedCap); }

std::string Group::path() const { return impl_->nccl ? "nccl" : "fabric"; }

std::string Group::route(std::uint32_t peer) const { return peer < impl_->world ? wireName(impl_->wires[peer]) : "none"; }

const RankStats& testing::ringStats(const Group& g) { return GroupAccess::of(g).ring.stats(); }

} // namespace tpf
