// Group::Impl: one rank's state. Internal to libtpfabric.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "client/env.hpp"
#include "client/fork_guard.hpp"
#include "client/format.hpp"
#include "client/host_transport.hpp"
#include "client/testing.hpp"
#include "common/fd.hpp"
#include "common/shm.hpp"
#include "proto/client_msg.hpp"
#include "proto/layout.hpp"
#include "proto/ring.hpp"
#include <tpfabric/tpfabric.hpp>

namespace tpf {

/// The GPU side of a Device group (client/gpu_*.cpp); opaque to the host path.
struct GpuPath;
struct GpuPathDeleter {
    void operator()(GpuPath* p) const;
};

/// The watch on the daemon's connection of a group a restarted daemon can
/// re-adopt (client/readopt.cpp); opaque to the host path.
class DaemonWatch;
struct DaemonWatchDeleter {
    void operator()(DaemonWatch* w) const;
};

struct [[gnu::visibility("hidden")]] Group::Impl {
    std::uint32_t rank = 0;
    std::uint32_t world = 1;
    std::uint64_t agreedCap = 0;
    Options options;
    ClientEnv env; ///< TPF_* variables as read at open
    std::array<std::uint8_t, kMaxWorld> wires{};

    // Fabric path (world >= 2): the daemon connection and shared memory.
    DaemonSocket socket; ///< replaced by /dev/null in a fork()ed child (client/fork_guard.hpp)
    UniqueFd proxyEvent;
    std::uint32_t handle = 0;
    Layout layout{};
    Mapping region;
    Mapping ringMap;
    RingView ring;
    std::uint64_t epoch = 0;
    std::uint32_t seq = 1;
    // What a restarted daemon needs to re-adopt the group (client/readopt.cpp):
    // the group as it opened and the memfds of this rank's region and ring.
    std::array<std::uint8_t, 16> groupId{};
    std::vector<client_proto::RosterEntry> roster;
    std::uint32_t openFlags = 0; ///< GroupOpen.flags this rank opened with
    std::uint64_t deviceBytes = 0; ///< a Device group's DeviceAttach.deviceBytes (its wires are `wires`)
    UniqueFd regionFd;
    UniqueFd ringFd;
    /// Set while the group can be re-adopted (adoptable()): it
    /// watches the daemon's connection and, when it closes, reconnects and
    /// asks the daemon that comes back to re-adopt the group.
    std::unique_ptr<DaemonWatch, DaemonWatchDeleter> watch;
    // The host path's peers (client/host_transport.hpp), chosen at open.
    std::vector<std::unique_ptr<HostTransport>> transports; ///< each publishes a call's row to its peers, in this order
    std::array<std::uint8_t*, kMaxWorld> sources{};        ///< per rank, the region its rows and flags are read from

    /// Sticky; code Ok while healthy. Written once, by fail() (first
    /// failure wins), which may run on a thread in abort() while another
    /// blocks in a call: the detail is written before the code is released,
    /// and broken() acquires the code before a caller copies the whole.
    Error failure;
    /// The health word of the host side: failure's code (low 16 bits) and
    /// the rank it names (high 32 bits, kNoPeer if none), 0 while healthy.
    /// Written once, release, by fail() (and by close()); loaded by health().
    std::uint64_t healthWord = 0;
    std::mutex failMutex; ///< serialises fail()'s writers
    /// The daemon's GroupFailed (its reason for breaking the group), as the
    /// watch thread read it from the connection; daemonSaid once it did.
    std::mutex daemonWhyMutex;
    Error daemonWhy;
    std::atomic<bool> daemonSaid{false};
    bool closed = false;
    pid_t openedBy = ::getpid();                  ///< the process that opened the group
    std::uint32_t openedAt = forkGeneration();    ///< forkGeneration() then: another one here is a fork()ed child
    bool nccl = false; ///< fell back: every call goes to NCCL (Device groups over an NcclBootstrap)

    // Declared last: destroyed first, before the mappings it registered.
    std::unique_ptr<GpuPath, GpuPathDeleter> gpu;

    ControlBlock& control() const { return *reinterpret_cast<ControlBlock*>(region.data() + layout.controlOffset()); }
    std::uint8_t* slot(std::uint32_t phase, std::uint32_t src) const { return region.data() + layout.slotOffset(phase, src); }
    std::uint64_t* flag(std::uint32_t phase, std::uint32_t src, std::uint32_t k) const {
        return reinterpret_cast<std::uint64_t*>(region.data() + layout.flagOffset(phase, src, k));
    }
    /// Rank q's row and flags as this rank reads them, at its source: our
    /// own region (our row, and the rows a carried transport delivers) or a
    /// host-direct peer's (it publishes there).
    const std::uint8_t* rowOf(std::uint32_t phase, std::uint32_t q) const { return sources[q] + layout.slotOffset(phase, q); }
    /// Only loaded (atomic_ref of a const object is not C++20).
    std::uint64_t* flagOf(std::uint32_t phase, std::uint32_t q, std::uint32_t k) const {
        return reinterpret_cast<std::uint64_t*>(sources[q] + layout.flagOffset(phase, q, k));
    }

    /// Stage [`bytes` of `send` | RowTrailer{epoch, bytes, magic} at
    /// roundUp(bytes, 16)] into the own slot of a new epoch, ring the
    /// doorbell, wait until every peer's row of that epoch arrived and check
    /// every row's trailer against ours (another size or call on some rank:
    /// GroupMismatch, the group broken). Returns the epoch's phase in `phase`;
    /// rank q's row is at rowOf(phase, q).
    Status exchange(const void* send, std::size_t bytes, std::uint32_t magic, std::uint32_t& phase);
    /// exchange() without the staging: the caller wrote `bytes` into
    /// slot(phaseOf(epoch + 1), rank) itself.
    Status post(std::size_t bytes, std::uint32_t& phase);
    Status waitPeers(std::uint64_t epoch, std::uint32_t phase);
    /// "; tpfabricd's proxy ... has made no pass for N ms ..." when the ring's
    /// heartbeat says the daemon stalls, else "" (a Timeout's suffix).
    std::string proxyStalled(std::uint64_t now) const;
    /// Shards of `epoch` still flow: the group is healthy, or its only
    /// record is a rank's orderly leave after an epoch >= `epoch`
    /// (ControlBlock::carriedThrough, written before the error).
    bool stillCarried(std::uint64_t epoch);
    /// Makes `e` the group's sticky failure unless one is recorded already
    /// (the first wins), naming `peer` (kNoPeer: none) in the health word.
    Status fail(Error e, std::uint32_t peer = kNoPeer);
    /// The daemon said why it broke the group (GroupFailed; watch thread).
    void noteDaemonWhy(Error why);
    /// `e`, a failure read from the control block, with the daemon's reason
    /// for it where the daemon gave one of the same code: sent before the
    /// control block's word, so it is at most a socket read away (waited for
    /// up to 20 ms while the watch thread reads the connection).
    Error withDaemonWhy(Error e);
    /// Whether a restarted daemon can re-adopt this group: world >= 2, the
    /// fabric path, Host buffers with every peer reached over shm, verbs or
    /// tcp, or Device buffers with every peer reached so or by ipc.
    bool adoptable() const;
    /// Within a call, where the host path looks at its daemon: Ok while it
    /// serves, or while it is away and being re-adopted (watch); the group's
    /// failure once re-adoption failed, or at once DaemonLost where the
    /// group cannot be re-adopted and the daemon's connection closed.
    Status daemonCheck();
    /// The daemon's connection closed and the group waits for a restarted
    /// daemon to re-adopt it (one load).
    bool daemonAway() const noexcept;
    /// A call's timeout passed while the daemon was away: DaemonLost naming
    /// the gap, else `timeout` (the call's own Timeout).
    Status timedOut(Error timeout, std::uint32_t peer);
    /// What Group::health() answers: loads of host memory only.
    Health health() const noexcept;
    /// In a fork()ed child: the group is the parent's (its regions, rings
    /// and daemon connection), so nothing of it may be used or released here.
    bool forked() const { return openedAt != forkGeneration(); }
    /// The call may not go on: a sticky failure, or (first noted here) a
    /// fork()ed child's copy of the group, Closed naming the parent.
    bool broken() {
        if (forked() && std::atomic_ref(failure.code).load(std::memory_order_acquire) != Errc::Closed) noteForked();
        // A rank's abort breaks the group for every rank at once, also for
        // calls this rank could still complete (the aborter staged its row).
        if (std::atomic_ref(failure.code).load(std::memory_order_acquire) == Errc::Ok && region.data() &&
            std::atomic_ref(control().abort).load(std::memory_order_acquire))
            (void)fail(sharedFailure(), sharedPeer());
        return std::atomic_ref(failure.code).load(std::memory_order_acquire) != Errc::Ok;
    }
    /// The daemon's record of a group-wide failure (ControlBlock error and
    /// missingPeer) as a call reports it: "rank 1 aborted the group".
    Error sharedFailure() const;
    /// The code sharedFailure() reports and the rank it names (kNoPeer: none).
    Errc sharedCode() const;
    std::uint32_t sharedPeer() const;
    void noteForked();
    /// allGatherV's arguments, before anything is staged: world counts, send
    /// and recv not null where a row exists (InvalidArgument). Same on every rank.
    Status checkCounts(const void* send, const void* recv, std::span<const std::size_t> counts) const {
        if (counts.size() != world)
            return Error{Errc::InvalidArgument, format("allGatherV: {} counts for a world of {}", counts.size(), world)};
        std::size_t total = 0;
        for (std::size_t c : counts) total += c;
        if ((!send && counts[rank]) || (!recv && total)) return Error{Errc::InvalidArgument, "allGatherV: send or recv is null"};
        return okStatus();
    }
    /// How teardown() takes leave of the daemon.
    enum class Leave {
        Silently,   ///< nothing sent (a failed bootstrap round: the socket's close says it)
        FailedOpen, ///< the OpenReport (metrics only, no reply)
        Close,      ///< an orderly close, its reply awaited; the device's counts flushed first
    };
    /// The one teardown, for close() and for a failed open: the GPU side
    /// first (it unregisters the host mappings below), then the daemon told
    /// as `how` says, then every descriptor, mapping and transport at once.
    /// In a fork()ed child only the child's own mappings and descriptors go.
    void teardown(Leave how, const client_proto::OpenReport& report = {});
    /// Count one host-path call of `op` in the ring's RankStats (a failed one under `failure`).
    void record(StatsOp op, std::uint64_t startNs, std::size_t bytes, bool ok);
};

/// What in-tree benchmarks and tests may read of an open group (not
/// installed), and how Group::open's steps hand over the group they opened.
struct GroupAccess {
    static const Group::Impl& of(const Group& g) { return *g.impl_; }
    static std::unique_ptr<Group> make(std::unique_ptr<Group::Impl> impl) { return std::unique_ptr<Group>(new Group(std::move(impl))); }
};

// Test hooks (tpf::testing): client/testing.hpp.

/// GPU hooks of Group::open (client/gpu_open.cpp; client/gpu_stub.cpp without CUDA).
/// The NCCL communicator of an NcclBootstrap, else nullptr.
void* ncclCommOf(Bootstrap& boot);
/// The communicator a Device group falls back to: Options::ncclComm, else the bootstrap's.
inline void* fallbackComm(const Options& o, Bootstrap& boot) { return o.ncclComm ? o.ncclComm : ncclCommOf(boot); }
/// After the all-or-none fabric vote: register the host regions, build the
/// device view, set up ipc peers and run the load-time probe. Collective:
/// every rank calls it and every rank gets the same verdict.
Status gpuAttach(Group::Impl& g, Bootstrap& boot);
/// `count` elements of `type` in bytes; CapMismatch when that is more than
/// size_t holds (above every cap: refused before anything is read or routed).
inline Result<std::size_t> sumBytes(std::size_t count, DType type, std::uint64_t agreedCap) {
    std::size_t bytes = 0;
    if (__builtin_mul_overflow(count, dtypeSize(type), &bytes))
        return Error{Errc::CapMismatch,
                     format("allReduceSum of {} elements is more bytes than size_t holds, above the agreed cap of {}", count, agreedCap)};
    return bytes;
}

/// What a kernel recorded (readFailure), made the group's sticky failure.
Status gpuCheck(Group::Impl& g);
/// The device's call counts into the ring's RankStats at close() (the kernels publish them as they count).
void gpuFlushStats(Group::Impl& g);
/// The group takes NCCL for every call (comm from ncclCommOf).
Status gpuFallback(Group::Impl& g, void* comm);

} // namespace tpf
