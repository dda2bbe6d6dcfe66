// The flag-path collective kernel (put, publish, wait, gather or sum),
// composed from the device primitives of kernels/device/; the contract is in
// collectives.hpp. The body (collectiveCall) takes a probe: the library's
// kernel runs it with NoProbe, bench/gpu with its timeline.
#pragma once

#include "kernels/collectives.hpp"
#include "kernels/device/call.cuh"
#include "kernels/device/flag.cuh"
#include "kernels/device/put.cuh"
#include "kernels/device/reduce.cuh"

namespace tpf::kernels::detail {

/// Per-launch tables block-local threads share (filled by thread 0).
struct Shared {
    std::uint64_t epoch;
    std::uint8_t* dst[kMaxWorld]; // where the own shard goes: own slot (if staged) + ipc peers' slots
    const std::uint8_t* src[kMaxWorld]; // row r of the result: send for r == rank, else slot (p, r)
    std::uint32_t ndst;
    std::uint32_t lastPut; // this block finished the put last: it publishes
    Decision dec;          // block 0: its pollers' decision; other blocks: 0 or 1 from the verdict
};

/// The barrier of the kernel's work threads (the first kThreadsPerBlock),
/// once the extra poller warps went their own way.
__device__ __forceinline__ void workBarrier() { barSync<1>(kThreadsPerBlock); }

/// Threads a collectiveKernel block has: the kThreadsPerBlock work threads,
/// then, for a call with a proxy-route peer, `pollWarps` extra warps (1..
/// kFlagCopies) that poll the flags' copies in host memory from block 0
/// (DeviceGroupView::pollWarps); without them warp 0 polls.
constexpr std::uint32_t kCollectiveThreadsMax = kThreadsPerBlock + kFlagCopies * kWarp;

/// One call of the flag path, by every thread of every block of the launch.
/// A probe with kOn gets published(ns) from the publishing thread,
/// publishedAt() and phases(entry, published, flags seen, output written)
/// from block 0's thread 0 (its view of the call, %globaltimer).
template <Op op, class Probe>
__device__ __forceinline__ void collectiveCall(Shared& s, const DeviceGroupView& v, const std::uint8_t* send,
                                               std::uint8_t* recv, std::uint64_t n16, const CallTag& tag,
                                               Probe* probe) {
    DeviceState* st = v.state;
    const std::uint32_t nb = gridDim.x, b = blockIdx.x;
    const std::uint32_t pollWarps = (blockDim.x - kThreadsPerBlock) / kWarp; // extra warps; 0: warp 0 polls
    const bool poller = threadIdx.x >= kThreadsPerBlock;
    const bool hasProxy = anyProxyCarries(v.wires, v.world);
    gridDepWait(); // launched early (DeviceGroupView::pdl): the previous kernel's send and epoch first
    std::uint64_t tIn = 0;
    if constexpr (Probe::kOn) tIn = b == 0 && threadIdx.x == 0 ? globalTimerNs() : 0;
    if (threadIdx.x == 0) {
        // Every block reads the epoch before it arrives at doneArrive; the
        // last to arrive advances it, so all blocks of a call agree on e.
        const std::uint64_t e = ldRelaxedGpu(&st->epoch) + 1;
        const std::uint32_t p = phaseOf(e);
        s.epoch = e;
        s.ndst = 0;
        s.dec.wait = kWaitPending;
        s.dec.published = 0;
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
    putRange(s.dst, s.ndst, send, blockRange(n16, b, nb));
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
    if (threadIdx.x < kWarp && s.lastPut) {
        publish(v, e, p, n16 * 16, hasProxy, callTagOf(std::uint32_t(op), tag, n16));
        if constexpr (Probe::kOn)
            if (threadIdx.x == 0) probe->published(globalTimerNs());
    }
    // The helper pollers' loads would hold up publish's system-scope
    // release if they were in flight before it (measured): they start now.
    if (threadIdx.x == 0) markPublished(s.dec);

    // 2. wait: block 0 decides for all, so that either every block writes or none does.
    if (b == 0) {
        if (threadIdx.x == kWarp) countCall(v, tag); // a spare warp, after every release of this call
        if (pollWarps == 0 ? threadIdx.x < kWarp : poller) {
            const std::uint32_t w = poller ? (threadIdx.x - kThreadsPerBlock) / kWarp : 0;
            if (poller) staggerStart(s.dec, w); // the lead (w = 0) too: after publish
            waitPeers(v, e, p, w, s.dec, nb > 1, callTagOf(std::uint32_t(op), tag, n16));
        }
    } else if (threadIdx.x == 0) {
        s.dec.wait = awaitVerdict(v, e) ? 0u : 1u;
    }
    // The poller warps are done: block 0's decided (or saw the decision),
    // the other blocks' never polled. A straggler's last read comes back
    // while the work threads read the rows.
    if (poller) return;
    if (b == 0 && pollWarps != 0) awaitDecision(s.dec);
    workBarrier();
    const bool ok = s.dec.wait == 0;
    std::uint64_t tFlags = 0;
    if constexpr (Probe::kOn) tFlags = b == 0 && threadIdx.x == 0 ? globalTimerNs() : 0;
    // The next kernel may be scheduled now: every peer's blocks have all run
    // their put (block 0 saw their flags), so blocks of it waiting for this
    // grid cannot keep a peer's blocks of this call from the SMs.
    gridDepRelease();

    // 3. the result, only on success.
    if (ok) {
        if constexpr (op == Op::Gather)
            gatherRange<kThreadsPerBlock>(s.src, v.rank, recv, std::uint32_t(n16), blockRange(n16 * v.world, b, nb));
        else sumRange<op, kThreadsPerBlock>(s.src, v.rank, v.world, recv, blockRange(n16, b, nb));
    }
    if constexpr (Probe::kOn) {
        if (b == 0) {
            workBarrier();
            if (threadIdx.x == 0) {
                const std::uint64_t pub = probe->publishedAt(), out = globalTimerNs();
                if (pub >= tIn && tFlags >= pub) probe->phases(tIn, pub, tFlags, out);
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

/// The library's flag-path kernel (launched by collectives.cu).
template <Op op>
__global__ void __launch_bounds__(kCollectiveThreadsMax) collectiveKernel(const DeviceGroupView v,
                                                                          const std::uint8_t* send, std::uint8_t* recv,
                                                                          std::uint64_t n16, const CallTag tag) {
    __shared__ Shared s;
    collectiveCall<op, NoProbe>(s, v, send, recv, n16, tag, nullptr);
}

} // namespace tpf::kernels::detail
