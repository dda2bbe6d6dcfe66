// tpfabric device primitives — flags: publishing a call's shard (the ipc
// peers' flags and the doorbell the daemon's proxy carries from) and waiting
// for every peer's flags with a deadline, abort, the daemon's error and its
// heartbeat. Device code only; the host half is the daemon's proxy, which
// writes the flags of shm and verbs peers (every copy, kFlagCopies, release
// order), and readFailure / DeviceState (kernels/collectives.hpp).
//
// A flag (proto/layout.hpp: Layout::flagOffset, one 128-byte line per phase,
// source rank and stripe) holds the last epoch whose shard of that source is
// in slot (p, source). Who writes: an ipc peer's kernel (publish: its call's
// tag word relaxed, then the epoch with a .sys release) or the daemon's proxy
// (shm memcpy then release, verbs a WRITE chained after the payload's). Who
// reads: this rank's kernel, with an acquire load of the copy its poller
// owns, so the row loads after the decision see the shard. Flags only grow
// (epochs), nothing resets them; a wait compares with >=.
#pragma once

#include <cstdint>

#include "kernels/device/call.cuh"
#include "proto/ring.hpp"

namespace tpf::kernels::detail {

/// How long a proxy-route wait tolerates a silent daemon heartbeat before it
/// ends DaemonLost (the proxy beats every 1 ms while such a group is open).
inline constexpr std::uint64_t kDaemonSilentNs = 500ull * 1000 * 1000;
/// A wait reads the heartbeat only once it has waited this long: a hop takes
/// a few microseconds, and the beat's line (host memory the proxy rewrites
/// every millisecond) would otherwise be one more PCIe read in every poll of
/// every call. DaemonLost still comes within kDaemonSilentNs + this.
inline constexpr std::uint64_t kBeatAfterNs = 50ull * 1000;
/// Proxy-route flags live in host memory, where one poll is a PCIe read
/// round trip (about 1 us on an H200 host): the extra warps of a call with a
/// proxy peer poll the flag's copies (kFlagCopies, proto/layout.hpp) this far
/// apart, so that a read comes back every quarter round trip and the flag is
/// seen that much sooner (docs/gpu.md, "Polling host memory").
inline constexpr std::uint64_t kPollStaggerNs = 250;
/// Decision::wait while no poller has decided the call.
inline constexpr std::uint32_t kWaitPending = 0xffffffffu;

__device__ __forceinline__ bool isProxy(std::uint8_t wire) { return proxyCarries(wire); }

/// The word an ipc writer stores at kFlagTagOffset of a flag (proto/layout.hpp):
/// the epoch's low 32 bits above the call's tag (callTagOf).
__device__ __forceinline__ std::uint64_t tagWord(std::uint64_t e, std::uint32_t ctag) {
    return std::uint64_t(std::uint32_t(e)) << 32 | ctag;
}

/// Warp-level publish (one warp, lanes share the flags): the call's tag word
/// and epoch e into every ipc peer's flags (p, rank, k) for every stripe k,
/// then, with `hasProxy`, the doorbell {e, bytes, group} on the command ring
/// by lane 0 (the daemon copies the staged shard to shm/verbs peers). The
/// shard's stores of every block must be ordered before by the caller (its
/// blocks' fence and arrival, then a barrier): the release stores here are
/// cumulative, so one system-scope release per flag orders all of it.
/// Ring full for the whole timeout: DeviceState::ringFullEpoch = e and no
/// doorbell (the wait then fails the call naming this rank).
__device__ inline void publish(const DeviceGroupView& v, std::uint64_t e, std::uint32_t p, std::uint64_t bytes,
                               bool hasProxy, std::uint32_t ctag) {
    const std::uint32_t lane = threadIdx.x % kWarp;
    const std::uint32_t S = v.layout.stripes;
    const std::uint32_t n = (v.world - 1) * S;
    for (std::uint32_t f = lane; f < n; f += kWarp) {
        const std::uint32_t q = peerAt(v.rank, f / S, v.world);
        if (v.wires[q] == kWireIpc) {
            std::uint8_t* line = v.peerRegions[q] + v.layout.flagOffset(p, v.rank, f % S);
            stRelaxedSys(reinterpret_cast<std::uint64_t*>(line + kFlagTagOffset), tagWord(e, ctag)); // before the flag's release
            stReleaseSys(reinterpret_cast<std::uint64_t*>(line), e);
        }
    }
    if (!hasProxy || lane != 0) return;
    DeviceState* st = v.state;
    auto* h = reinterpret_cast<RingHeader*>(v.ring);
    const std::uint32_t head = st->ringHead;
    // Room is checked against the tail last read (device memory); only when
    // the ring looks full is the daemon's subTail read again, over PCIe. The
    // daemon busy-polls while GPU groups exist; a ring really full means it
    // is stuck or gone: wait at most the timeout, then report instead of
    // overwriting.
    if (head - st->ringTail >= v.ringLayout.entries) {
        std::uint32_t tail = ldAcquireSys(&h->subTail);
        const std::uint64_t t0 = globalTimerNs();
        while (head - tail >= v.ringLayout.entries) {
            if (globalTimerNs() - t0 > v.timeoutNs) {
                stReleaseGpu(&st->ringFullEpoch, e);
                return;
            }
            __nanosleep(1000);
            tail = ldAcquireSys(&h->subTail);
        }
        st->ringTail = tail;
    }
    // The proto/ring.hpp Doorbell, byte for byte as RingView::push writes it, in one 16-byte store.
    const Doorbell entry{e, std::uint32_t(bytes), v.groupHandle};
    uint4 d;
    memcpy(&d, &entry, sizeof d);
    st16(v.ring + v.ringLayout.submissionOffset(head), d);
    // The release orders the entry and the staged shard (this thread's
    // stores, and the block's through the caller's barrier and fence) before
    // the new head, as for the ipc flags above: no separate fence.
    stReleaseSys(&h->subHead, head + 1);
    st->ringHead = head + 1;
}

/// The block-shared outcome of a wait (shared memory, one per block).
struct Decision {
    std::uint32_t wait;      ///< kWaitPending, then 0 (every peer's flags arrived) or the call's Errc
    std::uint32_t published; ///< non-zero once the publishing warp is past publish (the helper pollers start then)
};

/// Block-local release of a poller's decision: the first of the block's
/// pollers to decide wins. Its flags' acquire loads come before the CAS
/// (fence.acq_rel.cta: the release pattern), so a thread that reads the
/// decision and then fences (awaitDecision) reads the rows after them.
__device__ __forceinline__ bool claim(Decision& d, std::uint32_t code) {
    __threadfence_block();
    return atomicCAS(&d.wait, kWaitPending, code) == kWaitPending;
}
__device__ __forceinline__ std::uint32_t decision(const Decision& d) {
    return *static_cast<const volatile std::uint32_t*>(&d.wait);
}
/// Spins until a poller decided, then orders this thread's later loads after it.
__device__ __forceinline__ std::uint32_t awaitDecision(const Decision& d) {
    std::uint32_t w;
    while ((w = decision(d)) == kWaitPending) {}
    __threadfence_block();
    return w;
}
/// The publishing thread's signal that publish is done (lane 0 of its warp).
__device__ __forceinline__ void markPublished(Decision& d) { *reinterpret_cast<volatile std::uint32_t*>(&d.published) = 1; }
/// Poller warp w starts once the publish is done, w quarter round trips after.
__device__ __forceinline__ void staggerStart(const Decision& d, std::uint32_t w) {
    while (*static_cast<const volatile std::uint32_t*>(&d.published) == 0) {}
    const std::uint64_t t = globalTimerNs();
    while (globalTimerNs() - t < w * kPollStaggerNs) {}
}

/// The daemon's error `err` leaves a wait for epoch e going (lane 0): a rank
/// closed in order after an epoch >= e (ControlBlock::carriedThrough) and its
/// own shard of e is here, so the other ranks' shards of e still come.
__device__ inline bool leaveCarries(const DeviceGroupView& v, std::uint32_t err, std::uint64_t e, std::uint32_t p) {
    if (err != std::uint32_t(Errc::PeerLost) || e > ldRelaxedSys(&v.control->carriedThrough)) return false;
    const std::uint32_t who = ldRelaxedSys(&v.control->missingPeer);
    if (who >= v.world || who == v.rank) return false;
    const std::uint8_t* base = isProxy(v.wires[who]) ? v.hostRegion : v.region;
    for (std::uint32_t k = 0; k < v.layout.stripes; ++k)
        if (ldAcquireSys(reinterpret_cast<const std::uint64_t*>(base + v.layout.flagOffset(p, who, k))) < e) return false;
    return true;
}

/// One poller warp, w of them (0: the lead): waits until every peer's flags
/// for every stripe reach e, or (the lead only) abort, the daemon's error,
/// ring-full, a silent heartbeat (DaemonLost) or the timeout
/// (DeviceGroupView::timeoutNs, %globaltimer). The first poller to decide
/// records the decision in d.wait (claim) and, with `verdict` (a multi-block
/// call), the verdict in DeviceState for the other blocks (awaitVerdict); a
/// failure is recorded in the control block when it is this rank's own (the
/// daemon's record stays as it wrote it). Poller w reads copy w of a
/// proxy-route peer's flag (host memory), copy 0 of an ipc peer's (device
/// memory, fast to poll), and an ipc peer's tag word beside it: a tag of
/// this epoch other than `ctag` decides GroupMismatch naming the peer.
/// Returns when the call is decided. A probe with kOn has its
/// decided(ns) called by the winning poller with the time of its winning
/// poll.
template <class Probe = NoProbe>
__device__ inline void waitPeers(const DeviceGroupView& v, std::uint64_t e, std::uint32_t p, std::uint32_t w,
                                 Decision& s, bool verdict, std::uint32_t ctag, Probe* probe = nullptr) {
    const std::uint32_t lane = threadIdx.x % kWarp;
    const std::uint32_t S = v.layout.stripes;
    const std::uint32_t n = v.world * S;
    const bool lead = w == 0;
    const std::uint64_t t0 = globalTimerNs();
    // A proxy-route wait also watches the daemon's heartbeat (RingHeader,
    // host memory): the proxy beats every millisecond while a Device group
    // with proxy peers is open, so a beat that stops for kDaemonSilentNs
    // means the daemon died or hung: DaemonLost, not a Timeout at the end.
    const bool watchBeat = anyProxyCarries(v.wires, v.world) && v.ring != nullptr && lead;
    const auto* beat = watchBeat ? &reinterpret_cast<const RingHeader*>(v.ring)->heartbeatNs : nullptr;
    std::uint64_t lastBeat = 0, beatSeen = t0;
    const auto decide = [&](std::uint32_t code) {
        if (lane != 0) return false;
        std::uint64_t now = 0;
        if constexpr (Probe::kOn) now = globalTimerNs();
        if (!claim(s, code)) return false;
        if constexpr (Probe::kOn) probe->decided(now);
        if (verdict) stReleaseGpu(&v.state->verdict, e | (code == 0 ? 0 : kVerdictFailed));
        return true;
    };
    for (;;) {
        if (decision(s) != kWaitPending) return; // another poller decided
        // Control words first: relaxed loads issue without waiting, so their
        // latency overlaps the flags' acquire loads.
        std::uint32_t daemonErr = 0, aborted = 0, ringFull = 0, silent = 0, carried = 0;
        if (lead && lane == 0) {
            daemonErr = ldRelaxedSys(&v.control->error);
            aborted = ldRelaxedSys(&v.control->abort);
            carried = daemonErr != 0 && aborted == 0 && leaveCarries(v, daemonErr, e, p);
            ringFull = ldRelaxedGpu(&v.state->ringFullEpoch) == e;
            if (beat) {
                const std::uint64_t now = globalTimerNs();
                if (now - t0 > kBeatAfterNs) {
                    const std::uint64_t b = ldRelaxedSys(beat);
                    if (b != lastBeat) lastBeat = b, beatSeen = now;
                    silent = now - beatSeen > kDaemonSilentNs;
                }
            }
        }
        std::uint32_t missing = kNoPeer, mismatch = kNoPeer;
        for (std::uint32_t f = lane; f < n; f += kWarp) {
            const std::uint32_t src = f / S;
            if (src == v.rank) continue;
            // A proxy-route peer's flag lands in the host region (the daemon writes it), an ipc peer's in region.
            const bool proxy = isProxy(v.wires[src]);
            const std::uint8_t* base = proxy ? v.hostRegion : v.region;
            const std::uint64_t off = v.layout.flagCopyOffset(p, src, f % S, proxy ? w : 0);
            const auto* flag = reinterpret_cast<const std::uint64_t*>(base + off);
            // An ipc peer's tag word, loaded before the flag so that the two
            // loads overlap: a word older than the flag it sits beside (the
            // flag landed between the loads) is read again next pass, after
            // this pass's acquire, which the writer's release orders it before.
            const std::uint64_t tw = proxy ? 0 : ldRelaxedSys(reinterpret_cast<const std::uint64_t*>(base + off + kFlagTagOffset));
            const std::uint64_t got = ldAcquireSys(flag);
            if (got < e || (!proxy && got == e && std::uint32_t(tw >> 32) != std::uint32_t(e))) {
                if (src < missing) missing = src;
            } else if (!proxy && got == e && std::uint32_t(tw) != ctag && src < mismatch) {
                mismatch = src;
            }
        }
        missing = __reduce_min_sync(0xffffffffu, missing);
        mismatch = __reduce_min_sync(0xffffffffu, mismatch);
        // A peer's call of another size, dtype or op: GroupMismatch on every
        // rank (the peer sees this rank's tag too), decided by any poller.
        if (mismatch != kNoPeer) {
            if (decide(std::uint32_t(Errc::GroupMismatch))) {
                recordFailure(v.control, std::uint32_t(Errc::GroupMismatch), mismatch);
                atomicAdd(&v.state->failures, 1u);
                markCallFailed(v.control);
            }
            __syncwarp();
            return;
        }
        // Every flag arrived: the call is whole, whatever the daemon recorded
        // since (a peer that delivered and then left, an abort after the
        // last shard); the next call sees the record. As the host path.
        if (missing == kNoPeer) {
            decide(0);
            return;
        }
        const std::uint64_t waited = globalTimerNs() - t0;
        if (lead) {
            daemonErr = __shfl_sync(0xffffffffu, daemonErr, 0);
            aborted = __shfl_sync(0xffffffffu, aborted, 0);
            ringFull = __shfl_sync(0xffffffffu, ringFull, 0);
            silent = __shfl_sync(0xffffffffu, silent, 0);
            carried = __shfl_sync(0xffffffffu, carried, 0);
            std::uint32_t code = 0;
            if (daemonErr != 0 && !carried) code = daemonErr; // carried: wait on, up to the timeout
            else if (aborted != 0) code = std::uint32_t(Errc::Aborted), missing = kNoPeer;
            else if (ringFull != 0) code = std::uint32_t(Errc::Timeout), missing = v.rank;
            else if (silent != 0) code = std::uint32_t(Errc::DaemonLost), missing = kNoPeer;
            if (code == 0 && waited > v.timeoutNs) code = std::uint32_t(Errc::Timeout);
            if (code != 0) {
                if (decide(code)) {
                    if (daemonErr == 0) recordFailure(v.control, code, missing); // the daemon's record stays as it wrote it
                    atomicAdd(&v.state->failures, 1u);
                    markCallFailed(v.control);
                }
                __syncwarp();
                return;
            }
        }
        if (waited > 100000) __nanosleep(500); // long waits: poll gently
    }
}

/// Blocks other than the deciding one: wait for its verdict of epoch e
/// (DeviceState::verdict, released at GPU scope by waitPeers). Bounded well
/// past the decider's own bound; if that runs out something is badly wrong
/// (the deciding block never ran): fail without output.
__device__ inline bool awaitVerdict(const DeviceGroupView& v, std::uint64_t e) {
    const std::uint64_t t0 = globalTimerNs();
    for (;;) {
        const std::uint64_t w = ldAcquireSys(&v.state->verdict);
        if ((w & ~kVerdictFailed) == e) return (w & kVerdictFailed) == 0;
        if (globalTimerNs() - t0 > 2 * v.timeoutNs + 1000000000ull) {
            recordFailure(v.control, std::uint32_t(Errc::Timeout), kNoPeer);
            return false;
        }
    }
}

} // namespace tpf::kernels::detail
