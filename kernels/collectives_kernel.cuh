// The fused collective kernel (put, wait, gather or sum). Included by
// collectives.cu only; the contract is in collectives.hpp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/collectives.hpp"
#include "kernels/device_sync.cuh"

namespace tpf::kernels::detail {

enum class Op : std::uint32_t { Gather, SumF32, SumF16, SumBF16 };

constexpr std::uint32_t kUnroll = 4;
/// How long a proxy-route wait tolerates a silent daemon heartbeat before it
/// ends DaemonLost (the proxy beats every 1 ms while such a group is open).
constexpr std::uint64_t kDaemonSilentNs = 500ull * 1000 * 1000;
/// A wait reads the heartbeat only once it has waited this long: a hop takes
/// a few microseconds, and the beat's line (host memory the proxy rewrites
/// every millisecond) would otherwise be one more PCIe read in every poll of
/// every call. DaemonLost still comes within kDaemonSilentNs + this.
constexpr std::uint64_t kBeatAfterNs = 50ull * 1000;
constexpr std::uint32_t kWarp = 32;
/// Proxy-route flags live in host memory, where one poll is a PCIe read
/// round trip (1.04 us measured on the H200 host): the extra warps of a call
/// with a proxy peer poll the flag's copies (kFlagCopies, proto/layout.hpp)
/// this far apart, so that a read comes back every quarter round trip and
/// the flag is seen that much sooner (docs/gpu.md, "Polling host memory").
constexpr std::uint64_t kPollStaggerNs = 250;
/// Shared::wait while no poller has decided the call.
constexpr std::uint32_t kWaitPending = 0xffffffffu;

__device__ __forceinline__ bool isProxy(std::uint8_t route) { return proxyCarries(route); }

/// The word an ipc writer stores at kFlagTagOffset of a flag (proto/layout.hpp).
__device__ __forceinline__ std::uint64_t tagWord(std::uint64_t e, std::uint32_t ctag) {
    return std::uint64_t(std::uint32_t(e)) << 32 | ctag;
}

/// [begin, end) of `total` items for block b of nb, contiguous and balanced.
struct Range {
    std::uint64_t begin, end;
};
__device__ __forceinline__ Range blockRange(std::uint64_t total, std::uint32_t b, std::uint32_t nb) {
    const std::uint64_t per = (total + nb - 1) / nb;
    const std::uint64_t lo = per * b < total ? per * b : total;
    const std::uint64_t hi = per * (b + 1) < total ? per * (b + 1) : total;
    return {lo, hi};
}

/// Per-launch tables block-local threads share (filled by thread 0).
struct Shared {
    std::uint64_t epoch;
    std::uint8_t* dst[kMaxWorld]; // where the own shard goes: own slot (if staged) + ipc peers' slots
    const std::uint8_t* src[kMaxWorld]; // row r of the result: send for r == rank, else slot (p, r)
    std::uint32_t ndst;
    std::uint32_t lastPut;   // this block finished the put last: it publishes
    std::uint32_t wait;      // kWaitPending, then 0 (every peer's flags arrived) or the call's Errc (non-zero blocks: 1)
    std::uint32_t published; // block 0: warp 0 is past publish (the helper pollers start then)
    std::uint64_t t0, tSeen; // hopLoopKernel's doorbell; the winning poll (waitPeers), %globaltimer
};

/// Block-local release of a poller's decision: the first of the block's
/// pollers to decide wins. Its flags' acquire loads come before the CAS
/// (fence.acq_rel.cta: the release pattern), so a thread that reads the
/// decision and then fences (awaitDecision) reads the rows after them.
__device__ __forceinline__ bool claim(Shared& s, std::uint32_t code) {
    __threadfence_block();
    return atomicCAS(&s.wait, kWaitPending, code) == kWaitPending;
}
__device__ __forceinline__ std::uint32_t decision(const Shared& s) {
    return *static_cast<const volatile std::uint32_t*>(&s.wait);
}
/// Spins until a poller decided, then orders this thread's later loads after it.
__device__ __forceinline__ std::uint32_t awaitDecision(const Shared& s) {
    std::uint32_t d;
    while ((d = decision(s)) == kWaitPending) {}
    __threadfence_block();
    return d;
}
/// Poller warp w starts once warp 0 is past publish, w quarter round trips after.
__device__ __forceinline__ void staggerStart(const Shared& s, std::uint32_t w) {
    while (*static_cast<const volatile std::uint32_t*>(&s.published) == 0) {}
    const std::uint64_t t = globalTimerNs();
    while (globalTimerNs() - t < w * kPollStaggerNs) {}
}
/// The barrier of the kernel's work threads (the first kThreadsPerBlock),
/// once the extra poller warps went their own way.
__device__ __forceinline__ void workBarrier() {
    asm volatile("bar.sync 1, %0;" ::"r"(kThreadsPerBlock) : "memory");
}

/// Copies this block's part of the shard to every destination, kUnroll
/// vectors in flight per thread.
__device__ __forceinline__ void putRange(const Shared& s, const std::uint8_t* send, Range r) {
    for (std::uint64_t i = r.begin + threadIdx.x; i < r.end; i += kUnroll * blockDim.x) {
        uint4 v[kUnroll];
#pragma unroll
        for (std::uint32_t u = 0; u < kUnroll; ++u) {
            const std::uint64_t j = i + std::uint64_t(u) * blockDim.x;
            if (j < r.end) v[u] = ldSend16(send + j * 16);
        }
        for (std::uint32_t d = 0; d < s.ndst; ++d) {
#pragma unroll
            for (std::uint32_t u = 0; u < kUnroll; ++u) {
                const std::uint64_t j = i + std::uint64_t(u) * blockDim.x;
                if (j < r.end) st16(s.dst[d] + j * 16, v[u]);
            }
        }
    }
}

/// Warp 0 of the block that finished the put last: the call's tag word and
/// the epoch into every ipc peer's flags, then the doorbell for the daemon.
/// Everything every block stored is ordered before (caller: fence after the
/// arrival + __syncthreads).
__device__ void publish(const DeviceGroupView& v, std::uint64_t e, std::uint32_t p, std::uint64_t bytes,
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

/// The daemon's error `err` leaves a wait for epoch e going (lane 0): a rank
/// closed in order after an epoch >= e (ControlBlock::carriedThrough) and its
/// own shard of e is here, so the other ranks' shards of e still come.
__device__ bool leaveCarries(const DeviceGroupView& v, std::uint32_t err, std::uint64_t e, std::uint32_t p) {
    if (err != std::uint32_t(Errc::PeerLost) || e > ldRelaxedSys(&v.control->carriedThrough)) return false;
    const std::uint32_t who = ldRelaxedSys(&v.control->missingPeer);
    if (who >= v.world || who == v.rank) return false;
    const std::uint8_t* base = isProxy(v.wires[who]) ? v.hostRegion : v.region;
    for (std::uint32_t k = 0; k < v.layout.stripes; ++k)
        if (ldAcquireSys(reinterpret_cast<const std::uint64_t*>(base + v.layout.flagOffset(p, who, k))) < e) return false;
    return true;
}

/// One poller warp of block 0, w of them (0: the lead): waits until every
/// peer's flags for every stripe reach e, or (the lead only) abort, error,
/// ring-full or timeout. The first poller to decide records the decision in
/// s.wait (claim) and, for a multi-block call, the verdict; a failure is
/// recorded in the control block when it is this rank's own. Poller w reads
/// copy w of a proxy-route peer's flag (host memory), copy 0 of an ipc
/// peer's (device memory, fast to poll), and an ipc peer's tag word beside
/// it: a tag of this epoch other than `ctag` decides GroupMismatch naming the
/// peer. Returns when the call is decided.
__device__ void waitPeers(const DeviceGroupView& v, std::uint64_t e, std::uint32_t p, std::uint32_t w, Shared& s,
                          bool verdict, std::uint32_t ctag) {
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
        const std::uint64_t now = globalTimerNs();
        if (!claim(s, code)) return false;
        s.tSeen = now;
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
#if TPF_POLL_RELAXED
            const std::uint64_t got = ldRelaxedSys(flag);
#else
            const std::uint64_t got = ldAcquireSys(flag);
#endif
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
                stRelaxedSys(&v.control->missingPeer, mismatch);
                stReleaseSys(&v.control->error, std::uint32_t(Errc::GroupMismatch));
                atomicAdd(&v.state->failures, 1u);
            }
            __syncwarp();
            return;
        }
        // Every flag arrived: the call is whole, whatever the daemon recorded
        // since (a peer that delivered and then left, an abort after the
        // last shard); the next call sees the record. As the host path.
        if (missing == kNoPeer) {
#if TPF_POLL_RELAXED
            fenceAcqRelSys(); // relaxed polls + this fence: the acquire pattern
#endif
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
                    if (daemonErr == 0) { // the daemon's record stays as it wrote it
                        stRelaxedSys(&v.control->missingPeer, missing);
                        stReleaseSys(&v.control->error, code);
                    }
                    atomicAdd(&v.state->failures, 1u);
                }
                __syncwarp();
                return;
            }
        }
        if (waited > 100000) __nanosleep(500); // long waits: poll gently
    }
}

/// Non-zero blocks: wait for block 0's verdict of epoch e. Bounded well past
/// block 0's own bound; if that runs out something is badly wrong (block 0
/// never ran): fail without output.
__device__ bool awaitVerdict(const DeviceGroupView& v, std::uint64_t e) {
    const std::uint64_t t0 = globalTimerNs();
    for (;;) {
        const std::uint64_t w = ldAcquireSys(&v.state->verdict);
        if ((w & ~kVerdictFailed) == e) return (w & kVerdictFailed) == 0;
        if (globalTimerNs() - t0 > 2 * v.timeoutNs + 1000000000ull) {
            stRelaxedSys(&v.control->missingPeer, kNoPeer);
            stReleaseSys(&v.control->error, std::uint32_t(Errc::Timeout));
            return false;
        }
    }
}

using U64 = unsigned long long;

/// One thread of a call, while the call waits for its peers anyway: count
/// the call and its bytes (taken back if it fails). Fire-and-forget atomics:
/// the thread does not wait for them, and they complete during the wait.
__device__ void countCall(const DeviceGroupView& v, const CallTag& tag) {
    DeviceStats* d = v.stats;
    if (d == nullptr || !tag.record || tag.op >= kStatsOps) return;
    atomicAdd(reinterpret_cast<U64*>(&d->ops[tag.op].calls), 1ull);
    atomicAdd(reinterpret_cast<U64*>(&d->ops[tag.op].bytes), U64(tag.bytes));
}

/// The last block out, once per call: a failure is counted here (the slow
/// path anyway); a success needs nothing more.
__device__ void endCall(const DeviceGroupView& v, const CallTag& tag, bool ok, std::uint32_t code) {
    DeviceStats* d = v.stats;
    if (ok || d == nullptr || !tag.record || tag.op >= kStatsOps) return;
    atomicAdd(reinterpret_cast<U64*>(&d->ops[tag.op].errors), 1ull);
    atomicAdd(reinterpret_cast<U64*>(&d->ops[tag.op].bytes), U64(0) - U64(tag.bytes)); // bytes of completed calls only
    d->lastError = code;
    if (code < kStatsErrcSlots) atomicAdd(reinterpret_cast<U64*>(&d->errorsByCode[code]), 1ull);
}

__device__ __forceinline__ uint4 loadRow(const Shared& s, std::uint32_t r, std::uint32_t rank, std::uint64_t off) {
    return r == rank ? ldSend16(s.src[r] + off) : ldSlot16(s.src[r] + off);
}

/// Rows in rank order into recv: vector j of the W * n16 output is row j / n16.
/// By the block's kThreadsPerBlock work threads (the poller warps are not).
/// 32-bit index math: W * n16 <= 16 * 2^26 (a slot is at most 1 GiB).
__device__ __forceinline__ void gatherRange(const Shared& s, std::uint32_t rank, std::uint8_t* recv, std::uint32_t n16,
                                            Range r) {
    const std::uint32_t end = std::uint32_t(r.end);
    for (std::uint32_t i = std::uint32_t(r.begin) + threadIdx.x; i < end; i += kUnroll * kThreadsPerBlock) {
        uint4 v[kUnroll];
#pragma unroll
        for (std::uint32_t u = 0; u < kUnroll; ++u) {
            const std::uint32_t j = i + u * kThreadsPerBlock;
            if (j < end) {
                const std::uint32_t row = j / n16;
                v[u] = loadRow(s, row, rank, std::uint64_t(j - row * n16) * 16);
            }
        }
#pragma unroll
        for (std::uint32_t u = 0; u < kUnroll; ++u) {
            const std::uint32_t j = i + u * kThreadsPerBlock;
            if (j < end) st16(recv + std::uint64_t(j) * 16, v[u]);
        }
    }
}

/// Lanes of one 16-byte vector and how they widen to f32 and narrow back.
template <Op op> struct Vec;
template <> struct Vec<Op::SumF32> {
    static constexpr int kLanes = 4;
    __device__ static void widen(uint4 x, float* f) {
        f[0] = __uint_as_float(x.x), f[1] = __uint_as_float(x.y), f[2] = __uint_as_float(x.z), f[3] = __uint_as_float(x.w);
    }
    __device__ static uint4 narrow(const float* f) {
        return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
    }
};
template <> struct Vec<Op::SumF16> {
    static constexpr int kLanes = 8;
    __device__ static void widen(uint4 x, float* f) {
        const std::uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            __half2 h = *reinterpret_cast<const __half2*>(&w[k]);
            const float2 t = __half22float2(h);
            f[2 * k] = t.x, f[2 * k + 1] = t.y;
        }
    }
    __device__ static uint4 narrow(const float* f) {
        std::uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const __half lo = __float2half_rn(f[2 * k]), hi = __float2half_rn(f[2 * k + 1]);
            w[k] = std::uint32_t(__half_as_ushort(lo)) | (std::uint32_t(__half_as_ushort(hi)) << 16);
        }
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
};
template <> struct Vec<Op::SumBF16> {
    static constexpr int kLanes = 8;
    __device__ static void widen(uint4 x, float* f) {
        const std::uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            f[2 * k] = __uint_as_float(w[k] << 16);           // bf16 -> f32 is exact: the high half
            f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    }
    __device__ static uint4 narrow(const float* f) {
        std::uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const __nv_bfloat16 lo = __float2bfloat16_rn(f[2 * k]), hi = __float2bfloat16_rn(f[2 * k + 1]);
            w[k] = std::uint32_t(__bfloat16_as_ushort(lo)) | (std::uint32_t(__bfloat16_as_ushort(hi)) << 16);
        }
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
};

/// By the block's work threads, as gatherRange:
/// sum of rows 0..W-1 in rank order, f32 accumulation (adds only: nothing to
/// contract), rows loaded kUnroll at a time so their latencies overlap.
template <Op op>
__device__ __forceinline__ void sumRange(const Shared& s, std::uint32_t rank, std::uint32_t world, std::uint8_t* recv,
                                         Range r) {
    using V = Vec<op>;
    for (std::uint64_t i = r.begin + threadIdx.x; i < r.end; i += kThreadsPerBlock) {
        const std::uint64_t off = i * 16;
        float acc[V::kLanes];
        for (std::uint32_t r0 = 0; r0 < world; r0 += kUnroll) {
            uint4 x[kUnroll];
#pragma unroll
            for (std::uint32_t u = 0; u < kUnroll; ++u)
                if (r0 + u < world) x[u] = loadRow(s, r0 + u, rank, off);
#pragma unroll
            for (std::uint32_t u = 0; u < kUnroll; ++u) {
                if (r0 + u >= world) break;
                float f[V::kLanes];
                V::widen(x[u], f);
                if (r0 + u == 0) {
#pragma unroll
                    for (int k = 0; k < V::kLanes; ++k) acc[k] = f[k];
                } else {
#pragma unroll
                    for (int k = 0; k < V::kLanes; ++k) acc[k] = __fadd_rn(acc[k], f[k]);
                }
            }
        }
        st16(recv + off, V::narrow(acc));
    }
}

/// Threads a collectiveKernel block has: the kThreadsPerBlock work threads,
/// then, for a call with a proxy-route peer, `pollWarps` extra warps (1..
/// kFlagCopies) that poll the flags' copies in host memory from block 0
/// (DeviceGroupView::pollWarps); without them warp 0 polls.
constexpr std::uint32_t kCollectiveThreadsMax = kThreadsPerBlock + kFlagCopies * kWarp;

template <Op op>
__global__ void __launch_bounds__(kCollectiveThreadsMax) collectiveKernel(const DeviceGroupView v,
                                                                          const std::uint8_t* send, std::uint8_t* recv,
                                                                          std::uint64_t n16, const CallTag tag) {
    __shared__ Shared s;
    DeviceState* st = v.state;
    const std::uint32_t nb = gridDim.x, b = blockIdx.x;
    const std::uint32_t pollWarps = (blockDim.x - kThreadsPerBlock) / kWarp; // extra warps; 0: warp 0 polls
    const bool poller = threadIdx.x >= kThreadsPerBlock;
    const bool hasProxy = anyProxyCarries(v.wires, v.world);
    gridDepWait(); // launched early (DeviceGroupView::pdl): the previous kernel's send and epoch first
    const std::uint64_t tIn = (tag.flags & kTagTimeline) != 0 && b == 0 && threadIdx.x == 0 ? globalTimerNs() : 0;
    if (threadIdx.x == 0) {
        // Every block reads the epoch before it arrives at doneArrive; the
        // last to arrive advances it, so all blocks of a call agree on e.
        const std::uint64_t e = ldRelaxedGpu(&st->epoch) + 1;
        const std::uint32_t p = phaseOf(e);
        s.epoch = e;
        s.ndst = 0;
        s.wait = kWaitPending;
        s.published = 0;
        if (hasProxy) s.dst[s.ndst++] = v.hostRegion + v.layout.slotOffset(p, v.rank); // the daemon's source
        for (std::uint32_t i = 0; i + 1 < v.world; ++i) {
            const std::uint32_t q = peerAt(v.rank, i, v.world);
            if (v.wires[q] == kWireIpc) s.dst[s.ndst++] = v.peerRegions[q] + v.layout.slotOffset(p, v.rank);
        }
        for (std::uint32_t r = 0; r < v.world; ++r)
            s.src[r] = r == v.rank ? send : (isProxy(v.wires[r]) ? v.hostRegion : v.region) + v.layout.slotOffset(p, r);
        if (b == 0) {
            stRelaxedSys(&v.control->epoch, e);
            st->llArrive[(e + 1) & 1] = 0; // the LL path's counter for the next call (ll_kernel.cuh)
        }
    }
    __syncthreads();
    const std::uint64_t e = s.epoch;
    const std::uint32_t p = phaseOf(e);

    // 1. put (every thread of the block), then publish once every block's stores are ordered before it.
    putRange(s, send, blockRange(n16, b, nb));
    __syncthreads();
    if (threadIdx.x == 0) {
        bool last = true;
        if (nb > 1) {
            // This block's stores before its arrival (cumulative over the
            // barrier). GPU scope is enough, also for the stores to host
            // memory: the last block acquires every arrival at GPU scope
            // (its fence after the atomic), and publish's release stores
            // (system scope, cumulative) then order every block's stores
            // before the flags and the doorbell, causality order being
            // transitive across the scopes (PTX memory model). So a call
            // pays for one system-scope fence, publish's: each costs a PCIe
            // round trip once stores to host memory are in flight.
            __threadfence();
            last = atomicInc(&st->putArrive, nb - 1) == nb - 1;
            if (last) fenceAcqRelGpu();
        }
        s.lastPut = last;
    }
    __syncthreads();
    const bool timed = (tag.flags & kTagTimeline) != 0;
    if (threadIdx.x < kWarp && s.lastPut) {
        publish(v, e, p, n16 * 16, hasProxy, callTagOf(std::uint32_t(op), tag, n16));
        if (timed && threadIdx.x == 0) *reinterpret_cast<volatile std::uint64_t*>(&st->publishedNs) = globalTimerNs();
    }
    // The helper pollers' loads would hold up publish's system-scope
    // release if they were in flight before it (measured): they start now.
    if (threadIdx.x == 0) *reinterpret_cast<volatile std::uint32_t*>(&s.published) = 1;

    // 2. wait: block 0 decides for all, so that either every block writes or none does.
    if (b == 0) {
        if (threadIdx.x == kWarp) countCall(v, tag); // a spare warp, after every release of this call
        if (pollWarps == 0 ? threadIdx.x < kWarp : poller) {
            const std::uint32_t w = poller ? (threadIdx.x - kThreadsPerBlock) / kWarp : 0;
            if (poller) staggerStart(s, w); // the lead (w = 0) too: after publish
            waitPeers(v, e, p, w, s, nb > 1, callTagOf(std::uint32_t(op), tag, n16));
        }
    } else if (threadIdx.x == 0) {
        s.wait = awaitVerdict(v, e) ? 0u : 1u;
    }
    // The poller warps are done: block 0's decided (or saw the decision),
    // the other blocks' never polled. A straggler's last read comes back
    // while the work threads read the rows.
    if (poller) return;
    if (b == 0 && pollWarps != 0) awaitDecision(s);
    workBarrier();
    const bool ok = s.wait == 0;
    const std::uint64_t tFlags = timed && b == 0 && threadIdx.x == 0 ? globalTimerNs() : 0;
    // The next kernel may be scheduled now: every peer's blocks have all run
    // their put (block 0 saw their flags), so blocks of it waiting for this
    // grid cannot keep a peer's blocks of this call from the SMs.
    gridDepRelease();

    // 3. the result, only on success.
    if (ok) {
        if constexpr (op == Op::Gather) gatherRange(s, v.rank, recv, std::uint32_t(n16), blockRange(n16 * v.world, b, nb));
        else sumRange<op>(s, v.rank, v.world, recv, blockRange(n16, b, nb));
    }
    if (timed && b == 0) {
        workBarrier();
        if (threadIdx.x == 0) {
            const std::uint64_t pub = ldRelaxedGpu(&st->publishedNs), out = globalTimerNs();
            if (pub >= tIn && tFlags >= pub) {
                st->timeline[0] += pub - tIn;
                st->timeline[1] += tFlags - pub;
                st->timeline[2] += out - tFlags;
                st->timeline[3] += 1;
            }
        }
    }

    // 4. the last block out advances the epoch for the next call, and counts it.
    if (threadIdx.x == 0) {
        if (nb == 1 || atomicInc(&st->doneArrive, nb - 1) == nb - 1) {
            st->epoch = e;
            endCall(v, tag, ok, ok ? 0u : ldRelaxedSys(&v.control->error));
        }
    }
}

/// The proxy hop alone (launchProxyHopLoop): one block of `pollWarps` warps
/// (1..kFlagCopies), `iters` calls of a `bytes` shard (16-byte multiple, at
/// most the slot) with no output. Each call: warp 0 stages the shard in the
/// own slot, publishes the doorbell (publish: fence, ring entry, release of
/// subHead) and waits for every peer's flags with the other warps
/// (waitPeers, as block 0 of a collective call); lap i, %globaltimer from
/// just before the doorbell to the winning poll, goes to laps[i] when laps
/// is set: the daemon's carry of the shard is in the lap, the staging is
/// not. Stops after the first failed call (recorded as a call's). The epoch
/// advances per call as the collective kernel's does.
constexpr std::uint32_t kHopTag = 1; ///< every hop loop's call tag (its ranks agree by construction)
__global__ void __launch_bounds__(kFlagCopies * kWarp) hopLoopKernel(const DeviceGroupView v, std::uint64_t iters,
                                                                      std::uint64_t* laps, std::uint64_t bytes) {
    __shared__ Shared s;
    DeviceState* st = v.state;
    const std::uint32_t lane = threadIdx.x % kWarp, w = threadIdx.x / kWarp;
    for (std::uint64_t i = 0; i < iters; ++i) {
        const std::uint64_t e = ldRelaxedGpu(&st->epoch) + 1;
        const std::uint32_t p = phaseOf(e);
        if (threadIdx.x == 0) {
            stRelaxedSys(&v.control->epoch, e);
            st->llArrive[(e + 1) & 1] = 0;
            s.wait = kWaitPending;
            s.published = 0;
            s.tSeen = 0;
        }
        __syncthreads();
        if (w == 0) {
            std::uint8_t* slot = v.hostRegion + v.layout.slotOffset(p, v.rank);
            for (std::uint64_t j = lane; j < bytes / 16; j += kWarp)
                st16(slot + j * 16, make_uint4(std::uint32_t(e), std::uint32_t(i), std::uint32_t(j), 0));
            __syncwarp();
            if (lane == 0) s.t0 = globalTimerNs();
            publish(v, e, p, bytes, true, kHopTag);
            if (lane == 0) *reinterpret_cast<volatile std::uint32_t*>(&s.published) = 1;
        } else {
            staggerStart(s, w);
        }
        waitPeers(v, e, p, w, s, false, kHopTag); // the winner stamps s.tSeen
        __syncthreads();
        const std::uint32_t code = s.wait;
        if (threadIdx.x == 0) {
            if (laps) laps[i] = s.tSeen - s.t0;
            st->epoch = e;
        }
        __syncthreads();
        if (code != 0) return;
    }
}

} // namespace tpf::kernels::detail
