// Group::open as named steps: its arguments, round 0 (intents) and the
// fallback policy, round 1 (cards, meeting the daemon), joining the daemon's
// group (client/open_daemon.cpp), round 2 (votes), the GPU attach; a failed
// open falls back. The one teardown, for close() and a failed open; abort.
#include <sys/random.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "client/format.hpp"
#include "client/impl.hpp"
#include "client/open_daemon.hpp"
#include "common/unix_socket.hpp"
#include "proto/bootstrap.hpp"

namespace tpf {

using namespace client_proto;
using namespace bootstrap_proto;

namespace {

using Clock = OpenClock;

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

// The caller's arguments: Ok, or the error this rank's open fails with.
Error checkArguments(Bootstrap& boot, std::uint32_t rank, std::uint32_t world, std::uint64_t maxBytes, const Options& options) {
    if (world < 1 || world > kMaxWorld) return Error{Errc::OutOfRange, format("world {} outside 1..16", world)};
    if (rank >= world) return Error{Errc::OutOfRange, format("rank {} not below world {}", rank, world)};
    if (maxBytes == 0) return Error{Errc::OutOfRange, "max_bytes is 0: pass the largest shard, in bytes, this rank will pass"};
    if (options.timeout.count() <= 0 || options.openTimeout.count() <= 0 || options.spin.count() < 0)
        return Error{Errc::InvalidArgument,
                     format("Options: timeout {} ms, openTimeout {} ms, spin {} us: both timeouts must be positive and spin not "
                            "negative (defaults 5000 ms, 30000 ms, 20 us)",
                            options.timeout.count(), options.openTimeout.count(), options.spin.count())};
    if (boot.rank() != rank || boot.world() != world)
        return Error{Errc::GroupMismatch, format("rank {} opens with world {} over a bootstrap of world {} (as its rank {})", rank,
                                                 world, boot.world(), boot.rank())};
    return Error{};
}

// A rank whose arguments are wrong still takes part in round 0 where the
// bootstrap can carry it: the others then fail at once, told which rank
// opens with what, instead of waiting for this one until their deadline.
Error refuseInRound0(Bootstrap& boot, std::uint32_t rank, std::uint32_t world, std::uint64_t maxBytes, const Error& why) {
    const std::uint32_t bootWorld = boot.world();
    if (bootWorld >= 2 && bootWorld <= kMaxWorld && boot.rank() < bootWorld) {
        OpenIntent intent = intentOf(rank, world, maxBytes);
        if (why.code == Errc::InvalidArgument) intent.envErrc = std::uint16_t(Errc::InvalidArgument);
        std::vector<OpenIntent> all(bootWorld);
        (void)boot.allGather(&intent, all.data(), sizeof intent);
    }
    return why;
}

// Round 0's verdict: a caller's mistake or a bad environment on any rank
// fails the open on every rank (no fallback: it is not the fabric's fault).
Status checkIntents(const Group::Impl& g, const std::vector<OpenIntent>& all, const Error& envError) {
    const auto kind = [](const OpenIntent& i) { return (i.flags & kIntentDevice) ? "device" : "host"; };
    for (std::uint32_t r = 0; r < g.world; ++r) {
        const OpenIntent& i = all[r];
        if (i.magic != kIntentMagic || i.version != kIntentVersion)
            return Error{Errc::GroupMismatch,
                         format("bootstrap rank {} sent no tpfabric open record (is another program using this bootstrap?)", r)};
        if (i.dataProtocol != all[g.rank].dataProtocol)
            return Error{Errc::VersionMismatch,
                         format("rank {}'s libtpfabric speaks data protocol {}, rank {}'s {}{}: their calls would not understand "
                                "each other; give every rank the same libtpfabric release",
                                r, i.dataProtocol, g.rank, all[g.rank].dataProtocol,
                                std::min(i.dataProtocol, all[g.rank].dataProtocol) == 0 ? " (0: a release before the field)" : "")};
        if (i.world != g.world)
            return Error{Errc::GroupMismatch, format("rank {} opens with world {}, rank {} with world {}", r, i.world, g.rank, g.world)};
        if (i.rank != r && i.rank >= g.world)
            return Error{Errc::GroupMismatch, format("bootstrap rank {} opens as rank {}, not below world {}", r, i.rank, g.world)};
        if (i.rank != r)
            return Error{Errc::GroupMismatch,
                         format("bootstrap rank {} opens as rank {} (every rank must pass its bootstrap rank; two ranks {}?)", r,
                                i.rank, i.rank)};
        if (i.maxBytes == 0) // that rank itself fails OutOfRange
            return Error{Errc::GroupMismatch, format("rank {} opens with max_bytes 0", r)};
        if (i.envErrc == std::uint16_t(Errc::InvalidArgument)) // that rank itself fails InvalidArgument
            return Error{Errc::GroupMismatch, format("rank {} opens with invalid Options (its error names them)", r)};
        if ((i.flags & kIntentDevice) != (all[g.rank].flags & kIntentDevice))
            return Error{Errc::GroupMismatch,
                         format("rank {} opens with {} buffers, rank {} with {} buffers", r, kind(i), g.rank, kind(all[g.rank]))};
    }
    for (std::uint32_t r = 0; r < g.world; ++r)
        if (all[r].envErrc) {
            if (r == g.rank) return envError;
            return Error{Errc::ConfigError, format("rank {} has an invalid TPF_* variable (its error names it)", r)};
        }
    return okStatus();
}

// Set by Opening::fallBack: read by lastOpenMayFallBack() (C: tpf_last_open_may_fall_back).
thread_local bool openMayFallBack = false;

// One rank's open once its arguments passed, step by step. A step that
// fails on the bootstrap ends the open at once (the others fail on it too);
// a fabric step's failure is voted on and, where every rank agrees, ends in
// fallBack. A failed open leaves the daemon through Impl::teardown.
class Opening {
public:
    Opening(Bootstrap& caller, Clock::time_point deadline, std::uint64_t maxBytes, std::unique_ptr<Group::Impl> g)
        : boot_(caller, deadline + kBootstrapGrace), deadline_(deadline), maxBytes_(maxBytes), g_(std::move(g)),
          device_(g_->options.buffers == Buffers::Device),
          comm_(device_ ? fallbackComm(g_->options, caller) : nullptr) { // the caller's own (an NcclBootstrap's)
        // gpuAttach sees only the bounded wrapper of the caller's bootstrap, not
        // the NcclBootstrap inside it: hand it the communicator by the options.
        g_->options.ncclComm = comm_;
    }
    Opening(const Opening&) = delete;
    Opening& operator=(const Opening&) = delete;
    ~Opening() {
        if (g_) g_->teardown(Group::Impl::Leave::Silently);
    }

    Result<std::unique_ptr<Group>> run() {
        if (auto s = exchangeIntents(); !s) return s.error();
        agreeFallback();
        // TPF_DISABLE on any rank: NCCL (or Unavailable for host buffers) on every
        // rank, whatever the fallback policy, without a daemon or a probe.
        if (disabledBy_ != kNoPeer) return fallBack(Error{Errc::Unavailable, format("TPF_DISABLE=1 on rank {}", disabledBy_)});
        // World 1: a plain copy on this rank's own buffers, no daemon to meet.
        if (g_->world == 1) {
            if (device_)
                if (auto s = gpuAttach(*g_, boot_); !s) return fallBack(s.error());
            return opened();
        }
        std::vector<OpenCard> cards(g_->world);
        Error verdict{};
        if (auto s = exchangeCards(cards, verdict); !s) return s.error();
        if (verdict.code == Errc::Ok) verdict = joinGroup(cards);
        if (auto s = agreeVerdict(verdict); !s) return s.error();
        // Device groups: host regions registered, ipc peers mapped, the load-time
        // probe passed, on every rank (gpuAttach votes inside), or none.
        if (verdict.code == Errc::Ok && device_)
            if (auto s = gpuAttach(*g_, boot_); !s) verdict = s.error();
        if (verdict.code != Errc::Ok) return fallBack(verdict);
        return opened();
    }

private:
    // Round 0: intents. Nobody has contacted a daemon yet. World 1 too: its
    // bootstrap's one-record exchange checks the caller's bootstrap, and
    // TPF_DISABLE turns it off as any group.
    Status exchangeIntents() {
        Group::Impl& g = *g_;
        auto env = readClientEnv(); // a bad variable is reported in round 0, so that every rank fails with it
        if (env) g.env = *env;
        OpenIntent intent = intentOf(g.rank, g.world, maxBytes_);
        if (!env) intent.envErrc = std::uint16_t(Errc::ConfigError);
        if (g.env.disable) intent.flags |= kIntentDisabled;
        if (fallbackOf(g) == Fallback::Error)
            intent.flags |= kIntentFallbackError | (g.options.fallback ? 0 : kIntentFallbackFromEnv);
        if (comm_) intent.flags |= kIntentHasComm;
        if (device_) intent.flags |= kIntentDevice;
        intents_.resize(g.world);
        if (auto s = boot_.allGather(&intent, intents_.data(), sizeof intent); !s) return s;
        return checkIntents(g, intents_, env ? Error{} : env.error());
    }

    // The group's fallback, decided alike on every rank: NCCL where every rank
    // has a communicator and none asked for errors instead (TPF_DISABLE: where
    // every rank has a communicator, whatever the policy).
    void agreeFallback() {
        allComm_ = device_;
        for (std::uint32_t r = 0; r < g_->world; ++r) { // the first rank of each
            allComm_ = allComm_ && (intents_[r].flags & kIntentHasComm);
            if ((intents_[r].flags & kIntentFallbackError) && errorPolicyOf_ == kNoPeer) errorPolicyOf_ = r;
            if ((intents_[r].flags & kIntentDisabled) && disabledBy_ == kNoPeer) disabledBy_ = r;
        }
        ncclFallback_ = disabledBy_ != kNoPeer ? allComm_ : allComm_ && errorPolicyOf_ == kNoPeer;
    }

    // Round 1: cards. Everyone learns rank 0's group id and whether every
    // rank has a daemon; `verdict` says whether one has not.
    Status exchangeCards(std::vector<OpenCard>& cards, Error& verdict) {
        Group::Impl& g = *g_;
        OpenCard mine{};
        if (g.rank == 0 && ::getrandom(mine.groupId, sizeof mine.groupId, 0) != sizeof mine.groupId)
            return Error{Errc::SystemError, "getrandom for the group id failed"};
        Error local{};
        if (auto s = meetDaemon(g, maxBytes_, mine.entry, deadline_); !s) {
            local = s.error();
            mine.errc = std::uint16_t(local.code);
        }
        if (auto s = boot_.allGather(&mine, cards.data(), sizeof mine); !s) return s;
        // This rank's own failure first: its log must name its own daemon's
        // problem, not send its reader to another rank's node.
        verdict = mine.errc != 0 ? local : Error{};
        for (std::uint32_t r = 0; r < g.world && verdict.code == Errc::Ok; ++r)
            if (cards[r].errc != 0) {
                Errc code = Errc::Unavailable;
                errcFromWire(cards[r].errc, code);
                verdict = r == g.rank ? local : Error{code, format("rank {} has no usable daemon", r)};
            }
        return okStatus();
    }

    // Join at the daemon: its verdict, the regions it hands over, the peers'
    // transports (client/open_daemon.cpp).
    Error joinGroup(const std::vector<OpenCard>& cards) {
        std::vector<RosterEntry> roster;
        for (const auto& c : cards) roster.push_back(c.entry);
        if (auto s = joinDaemon(*g_, cards[0].groupId, roster, deadline_); !s) return s.error();
        return Error{};
    }

    // Round 2: everyone's verdict; all or none.
    Status agreeVerdict(Error& verdict) {
        OpenVote vote{std::uint16_t(verdict.code), 0, 0};
        std::vector<OpenVote> votes(g_->world);
        if (auto s = boot_.allGather(&vote, votes.data(), sizeof vote); !s) return s;
        for (std::uint32_t r = 0; r < g_->world && verdict.code == Errc::Ok; ++r)
            if (votes[r].errc != 0) {
                Errc code = Errc::Unavailable;
                errcFromWire(votes[r].errc, code);
                verdict = Error{code, format("rank {} could not join: {}", r, std::string_view(errcName(code)))};
            }
        return okStatus();
    }

    Result<std::unique_ptr<Group>> opened() {
        // Not fatal: without its watch the group fails DaemonLost at a restart, as one that cannot be re-adopted.
        if (auto s = startDaemonWatch(*g_); !s)
            std::fprintf(stderr, "tpfabric: rank %u: %s; a daemon restart breaks this group\n", g_->rank, s.error().describe().c_str());
        return GroupAccess::make(std::move(g_));
    }

    // The fabric path is not taken: the daemon is left (told why, for its
    // metrics), then NCCL takes the group's calls or the open fails.
    Result<std::unique_ptr<Group>> fallBack(const Error& why) {
        g_->teardown(Group::Impl::Leave::FailedOpen,
                     OpenReport{std::uint16_t(why.code), ncclFallback_ ? kOutcomeNccl : kOutcomeUnavailable, 0, 0});
        if (ncclFallback_) {
            std::fprintf(stderr, "tpfabric: rank %u: fabric path unavailable (%s); NCCL takes this group's calls\n", g_->rank,
                         why.describe().c_str());
            if (auto s = gpuFallback(*g_, comm_); !s) return s.error();
            return opened();
        }
        const bool anyFallbackError = errorPolicyOf_ != kNoPeer;
        openMayFallBack = disabledBy_ != kNoPeer || !anyFallbackError;
        std::string because;
        if (disabledBy_ == kNoPeer && anyFallbackError)
            because = intents_[errorPolicyOf_].flags & kIntentFallbackFromEnv
                          ? format(" (TPF_FALLBACK=error on rank {})", errorPolicyOf_)
                          : format(" (fallback = error in rank {}'s open options)", errorPolicyOf_);
        else if (device_ && !allComm_)
            because = " (no NCCL communicator to fall back to on every rank)";
        // A full daemon where the group may not fall back: Busy itself, so that
        // the caller can tell "retry later" from a node without a fabric path.
        // Where it may, Unavailable: what lastOpenMayFallBack() and Python's
        // Communicator read.
        if (why.code == Errc::Busy && !openMayFallBack) return Error{Errc::Busy, why.detail + because};
        // "Unavailable: TPF_DISABLE=1 on rank 2", not "Unavailable: Unavailable: ..."
        return Error{Errc::Unavailable, (why.code == Errc::Unavailable ? why.detail : why.describe()) + because};
    }

    BoundedBootstrap boot_;
    const Clock::time_point deadline_;
    const std::uint64_t maxBytes_; ///< the caller's: this rank's largest shard
    std::unique_ptr<Group::Impl> g_; ///< handed to the Group when it opens
    const bool device_;
    void* const comm_;
    std::vector<OpenIntent> intents_;
    bool allComm_ = false;
    std::uint32_t disabledBy_ = kNoPeer, errorPolicyOf_ = kNoPeer; // the first rank of each
    bool ncclFallback_ = false;
};

} // namespace

Group::Group(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Group::~Group() { close(); }

Result<std::unique_ptr<Group>> Group::open(Bootstrap& caller, std::uint32_t rank, std::uint32_t world,
                                           std::uint64_t maxBytes, const Options& options) {
    openMayFallBack = false;
    // One deadline for the whole open: every bootstrap call, every daemon request.
    const Clock::time_point deadline = Clock::now() + options.openTimeout;
    {
        BoundedBootstrap boot(caller, deadline + kBootstrapGrace);
        if (Error e = checkArguments(boot, rank, world, maxBytes, options); e.code != Errc::Ok)
            return refuseInRound0(boot, rank, world, maxBytes, e);
    }
    auto impl = std::make_unique<Impl>();
    impl->rank = rank;
    impl->world = world;
    impl->options = options;
    impl->agreedCap = maxBytes;
    return Opening(caller, deadline, maxBytes, std::move(impl)).run();
}

void Group::Impl::teardown(Leave how, const OpenReport& report) {
    if (forked()) {
        // A fork()ed child's copy: the device state, the ring's counts and the
        // daemon's membership are the parent's. Only the child's own mappings
        // and descriptors go (the socket is /dev/null here already).
        (void)gpu.release(); // CUDA cannot be called in a fork()ed child
        (void)watch.release(); // its thread is the parent's
    } else {
        watch.reset(); // first: it may be handing the socket over to a restarted daemon
        if (how == Leave::Close) gpuFlushStats(*this); // the daemon folds the ring's counts when this rank leaves
        gpu.reset(); // unregisters the mappings below; waits for nothing
    }
    // A dead daemon or a timeout changes nothing here.
    if (socket && !forked()) {
        if (how == Leave::Close && sendMessage(socket.get(), encodeEmpty(kClose, seq++), {}, 1000))
            (void)receiveMessage(socket.get(), kReplySpec, 1000);
        if (how == Leave::FailedOpen) // for the daemon's metrics only: no reply, a failure changes nothing
            (void)sendMessage(socket.get(), encode(kOpenReport, seq++, report), {}, 1000);
    }
    socket.reset(); // leaves the daemon's group, if joined
    proxyEvent.reset(); // every fd goes now, not when the Group is destroyed
    regionFd.reset();
    ringFd.reset();
    ring = RingView();
    ringMap = Mapping();
    region = Mapping();
    transports.clear(); // unmaps the host-direct peers' regions
    sources = {};
}

void Group::close() {
    if (!impl_ || impl_->closed) return;
    impl_->closed = true;
    if (impl_->forked()) (void)impl_->broken(); // notes the fork: Closed, naming the parent
    impl_->teardown(Impl::Leave::Close);
    if (impl_->failure.code == Errc::Ok) (void)impl_->fail(Error{Errc::Closed, "the group was closed"});
}

bool lastOpenMayFallBack() { return openMayFallBack; }

Status Group::abort() {
    Impl& g = *impl_;
    if (g.forked()) return g.broken(), g.failure; // the parent's group: its peers are not this process's to abort
    if (g.closed) return Error{Errc::Closed, "abort on a closed group"};
    const Error aborted{Errc::Aborted, "rank " + std::to_string(g.rank) + " (this rank) aborted the group"};
    if (g.nccl) {
        (void)g.fail(aborted, g.rank);
        return Error{Errc::Unsupported, "the group runs on NCCL, which has no abort: only this rank's group is broken"};
    }
    // Broken here even when the daemon cannot be told (it is gone: the others see DaemonLost).
    const Status told = g.world == 1 || !g.socket
                            ? okStatus()
                            : sendMessage(g.socket.get(), encode(kAbort, g.seq++, Abort{}), {}, 1000);
    (void)g.fail(aborted, g.rank);
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
