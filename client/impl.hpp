// Group::Impl: one rank's state. Internal to libtpfabric.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "client/env.hpp"
#include "client/fork_guard.hpp"
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
    // Host-direct (Host groups, TPF_HOST_DIRECT unset or 1): the regions of
    // the same-node peers, whose rows and flags this rank reads there itself.
    std::array<Mapping, kMaxWorld> peerRegions; ///< mapped at the ranks of directPeers only
    std::uint32_t directPeers = 0;              ///< bit per rank read directly (Verdict.hostPeers)
    bool ringsProxy = true;                     ///< some peer is reached through the proxy: ring for each call
    std::uint64_t daemonCheckedNs = 0;          ///< when a host-direct call last looked at the daemon's socket

    /// Sticky; code Ok while healthy. Written once, by fail() (first
    /// failure wins), which may run on a thread in abort() while another
    /// blocks in a call: the detail is written before the code is released,
    /// and broken() acquires the code before a caller copies the whole.
    Error failure;
    std::mutex failMutex; ///< serialises fail()'s writers
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
    /// The region that holds rank q's row and flags as this rank reads them:
    /// a direct peer's own (it publishes there), else ours (our own row, and
    /// the rows the proxy delivers).
    std::uint8_t* regionOf(std::uint32_t q) const { return (directPeers >> q & 1u ? peerRegions[q] : region).data(); }
    const std::uint8_t* rowOf(std::uint32_t phase, std::uint32_t q) const { return regionOf(q) + layout.slotOffset(phase, q); }
    /// Only loaded (atomic_ref of a const object is not C++20).
    std::uint64_t* flagOf(std::uint32_t phase, std::uint32_t q, std::uint32_t k) const {
        return reinterpret_cast<std::uint64_t*>(regionOf(q) + layout.flagOffset(phase, q, k));
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
    /// Host-direct: release the own row of `epoch` (staged in our own slot)
    /// by our own flags, then wake the directPeers that sleep; they read it
    /// from our region (the proxy carries it to the other peers).
    Status publish(std::uint64_t epoch, std::uint32_t phase);
    /// Shards of `epoch` still flow: the group is healthy, or its only
    /// record is a rank's orderly leave after an epoch >= `epoch`
    /// (ControlBlock::carriedThrough, written before the error).
    bool stillCarried(std::uint64_t epoch);
    Status fail(Error e);
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
            (void)fail(sharedFailure());
        return std::atomic_ref(failure.code).load(std::memory_order_acquire) != Errc::Ok;
    }
    /// The daemon's record of a group-wide failure (ControlBlock error and
    /// missingPeer) as a call reports it: "rank 1 aborted the group".
    Error sharedFailure() const;
    void noteForked();
    /// allGatherV's arguments, before anything is staged: world counts, send
    /// and recv not null where a row exists (InvalidArgument). Same on every rank.
    Status checkCounts(const void* send, const void* recv, std::span<const std::size_t> counts) const {
        if (counts.size() != world)
            return Error{Errc::InvalidArgument, "allGatherV: " + std::to_string(counts.size()) + " counts for a world of " +
                                                    std::to_string(world)};
        std::size_t total = 0;
        for (std::size_t c : counts) total += c;
        if ((!send && counts[rank]) || (!recv && total)) return Error{Errc::InvalidArgument, "allGatherV: send or recv is null"};
        return okStatus();
    }
    /// Count one host-path call of `op` in the ring's RankStats (a failed one under `failure`).
    void record(StatsOp op, std::uint64_t startNs, std::size_t bytes, bool ok);
};

/// What in-tree benchmarks and tests may read of an open group (not installed).
struct GroupAccess {
    static const Group::Impl& of(const Group& g) { return *g.impl_; }
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
        return Error{Errc::CapMismatch, "allReduceSum of " + std::to_string(count) + " elements is more bytes than size_t " +
                                            "holds, above the agreed cap of " + std::to_string(agreedCap)};
    return bytes;
}

/// What a kernel recorded (readFailure), made the group's sticky failure.
Status gpuCheck(Group::Impl& g);
/// The device's call counts into the ring's RankStats (check() and close()).
void gpuFlushStats(Group::Impl& g);
/// The group takes NCCL for every call (comm from ncclCommOf).
Status gpuFallback(Group::Impl& g, void* comm);

} // namespace tpf
