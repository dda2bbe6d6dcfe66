// The low-latency (LL) collective kernel: ipc-only groups, small shards,
// composed from the device primitives of kernels/device/ (the protocol, its
// line format, tag line and scrub: kernels/device/ll.cuh); the contract is in
// collectives.hpp. The body (llCall) takes a probe: the library's kernel runs
// it with NoProbe, bench/gpu with its timeline.
//
// Per thread: kPer 16-byte chunks of the shard, stored into slot (p, rank)
// of every peer's LL area; the thread then waits for the same chunks of every
// peer, keeps them in registers, and only once every thread of every block
// has all of them writes the output: all-or-none, as the flag path (block
// AND, then a count of the blocks per call that every block waits on; the
// last to arrive advances the epoch). Block 0's threads 0..W-2 (one peer
// each) also load that peer's tag line with their own lines each pass and
// check it once those are in (the data wait itself is the protocol's,
// untouched). A peer whose size took the flag path instead (above
// llMaxBytes) writes no lines: both end in Timeout, nothing written.
#pragma once

#include "kernels/collectives.hpp"
#include "kernels/device/call.cuh"
#include "kernels/device/ll.cuh"
#include "kernels/device/reduce.cuh"

namespace tpf::kernels::detail {

/// Block size bound of a variant: 1,024 for one chunk of one peer (about 40
/// registers), else 256.
constexpr std::uint32_t llThreadsMax(std::uint32_t per, std::uint32_t peers) {
    return per == 1 && peers == 1 ? kLlThreadsOnePeer : kLlThreads;
}

/// One LL call, by every thread of every block of the launch. kPer: 16-byte
/// chunks a thread; kPeers: peers one thread holds (world - 1 <= kPeers <=
/// kLlHeld / kPer), 1 for W = 2 so that its loops carry no dead peers. A
/// probe with kOn gets phases(epoch read, puts issued, lines seen, output
/// written) from block 0's thread 0 (its view of the call, %globaltimer).
template <Op op, std::uint32_t kPer, std::uint32_t kPeers, class Probe>
__device__ __forceinline__ void llCall(const DeviceGroupView& v, const std::uint8_t* send, std::uint8_t* recv,
                                       std::uint64_t n16, const CallTag& tag, Probe* probe) {
    static_assert(kPer * kPeers <= kLlHeld);
    __shared__ std::uint32_t sCode, sMissing, sFill;
    DeviceState* st = v.state;
    const std::uint32_t nb = gridDim.x, b = blockIdx.x, W = v.world, me = v.rank;
    const std::uint64_t base = std::uint64_t(b) * kPer * blockDim.x + threadIdx.x;

    gridDepWait(); // launched early (DeviceGroupView::pdl): the previous kernel's send and epoch first
    // The own chunks load while the epoch does: neither waits for the other.
    uint4 own[kPer];
#pragma unroll
    for (std::uint32_t k = 0; k < kPer; ++k) {
        const std::uint64_t c = base + std::uint64_t(k) * blockDim.x;
        if (c < n16) own[k] = ldSend16(send + c * 16);
    }
    const std::uint64_t e = ldRelaxedGpu(&st->epoch) + 1;
    const std::uint32_t sticky = ldRelaxedGpu(&st->failures);
    const std::uint32_t p = phaseOf(e), f = std::uint32_t(e);
    const std::uint32_t ctag = callTagOf(std::uint32_t(op), tag, n16);
    const std::uint64_t t0 = globalTimerNs();
    if (threadIdx.x == 0) {
        sCode = sticky != 0 ? kLlKeep : 0;
        sMissing = kNoPeer; // ControlBlock.epoch (host memory) is written on failure only
        if (b == 0) st->llArrive[(e + 1) & 1] = 0; // the next call's counter (this call uses [e & 1])
    }

    // 1. put: every chunk into every peer's slot (p, me), peerAt order.
    for (std::uint32_t i = 0; i + 1 < W; ++i) {
        const std::uint32_t q = peerAt(me, i, W);
        std::uint8_t* dst = v.peerRegions[q] + v.llOffset + v.ll.slotOffset(p, me);
        if (b == 0 && threadIdx.x == 0) llPutTag(dst, n16, ctag, f);
#pragma unroll
        for (std::uint32_t k = 0; k < kPer; ++k) {
            const std::uint64_t c = base + std::uint64_t(k) * blockDim.x;
            if (c < n16) llPutChunk(dst, n16, c, own[k], f);
        }
    }
    __syncthreads(); // sCode / sMissing initialised
    // Block 0's last thread (no tag line to wait for; in a small call no chunk
    // either): its atomics' round trip and posted stores pass while the lines travel.
    if (b == 0 && threadIdx.x == blockDim.x - 1) countCall(v, tag);
    std::uint64_t tPut = 0;
    if constexpr (Probe::kOn) tPut = b == 0 && threadIdx.x == 0 ? globalTimerNs() : 0;

    // 2. wait for the same chunks of every peer (rank order, self skipped).
    // Each pass loads every line still missing before it looks at any, so
    // a pass costs one memory round trip whatever kPer and W are.
    volatile std::uint32_t& code = sCode;
    bool ok = code == 0;
    uint4 held[kPer][kPeers];
    std::uint32_t pending = 0; // bit k * kPeers + j: chunk k of peer j not yet seen
    bool recorded = false;     // the daemon's error or abort was seen once
#pragma unroll
    for (std::uint32_t k = 0; k < kPer; ++k)
#pragma unroll
        for (std::uint32_t j = 0; j < kPeers; ++j)
            if (base + std::uint64_t(k) * blockDim.x < n16 && j + 1 < W) pending |= 1u << (k * kPeers + j);
    const std::uint8_t* ll = v.region + v.llOffset;
    // Block 0's thread j < W - 1 also loads peer j's tag line with its own
    // lines each pass, and looks at the last one loaded after the wait.
    const std::uint32_t tagSrc = threadIdx.x < me ? threadIdx.x : threadIdx.x + 1;
    const bool tagThread = b == 0 && threadIdx.x + 1 < W;
    const std::uint8_t* tagLine = ll + v.ll.slotOffset(p, tagSrc < W ? tagSrc : 0) + 2 * n16 * 16;
    uint4 t = make_uint4(0, ~f, 0, ~f); // no flag of this call until loaded
    for (std::uint32_t spins = 1; ok && pending != 0; ++spins) {
        uint4 a[kPer][kPeers], z[kPer][kPeers];
#pragma unroll
        for (std::uint32_t k = 0; k < kPer; ++k)
#pragma unroll
            for (std::uint32_t j = 0; j < kPeers; ++j)
                if (pending >> (k * kPeers + j) & 1u) {
                    const std::uint8_t* line =
                        ll + v.ll.slotOffset(p, j < me ? j : j + 1) + (base + std::uint64_t(k) * blockDim.x) * 16;
                    a[k][j] = ldLl(line);
                    z[k][j] = ldLl(line + n16 * 16);
                }
        if (tagThread) t = ldLl(tagLine);
        // The scrub (kernels/device/ll.cuh), by block 0's thread 0 while its
        // first pass's loads are in flight, so that its arithmetic is off the
        // call's path (it then costs no measurable time). 32-bit arithmetic:
        // the counter's wrap every 2^33 epochs restarts the round.
        if (TPF_LL_SCRUB && spins == 1 && b == 0 && threadIdx.x == 0) {
            const std::uint32_t lines = std::uint32_t(v.ll.slotBytes / 16), m = std::uint32_t(e >> 1) % lines;
            if (m > 2 * n16)
                for (std::uint32_t i = 0; i + 1 < W; ++i)
                    llScrub(v.peerRegions[peerAt(me, i, W)] + v.llOffset + v.ll.slotOffset(p, me), m, f);
        }
#pragma unroll
        for (std::uint32_t k = 0; k < kPer; ++k)
#pragma unroll
            for (std::uint32_t j = 0; j < kPeers; ++j) {
                const std::uint32_t bit = 1u << (k * kPeers + j);
                if ((pending & bit) && llSeen(a[k][j], z[k][j], f)) {
                    held[k][j] = llChunk(a[k][j], z[k][j]);
                    pending &= ~bit;
                }
            }
        if (pending == 0 || (spins & 63u) != 0) continue;
        if (code != 0) {
            ok = false;
            break;
        }
        if ((spins & 1023u) == 0) { // the daemon's words live in host memory: read them rarely
            const std::uint32_t err = ldRelaxedSys(&v.control->error), ab = ldRelaxedSys(&v.control->abort);
            // A rank that closed in order after an epoch >= e (ControlBlock::
            // carriedThrough), whose lines this thread has, leaves the wait
            // going up to the timeout: the other ranks' lines of e still come.
            bool carried = false;
            if (err == std::uint32_t(Errc::PeerLost) && ab == 0 && e <= ldRelaxedSys(&v.control->carriedThrough)) {
                const std::uint32_t who = ldRelaxedSys(&v.control->missingPeer);
                carried = who < W && who != me;
#pragma unroll
                for (std::uint32_t k = 0; k < kPer; ++k)
                    if (carried && (pending >> (k * kPeers + (who < me ? who : who - 1)) & 1u)) carried = false;
            }
            // Lines that landed before the record (a peer that delivered, then
            // left) still count: fail at the second look, 1,024 polls later.
            if ((err != 0 || ab != 0) && !recorded) {
                recorded = true;
            } else if ((err != 0 || ab != 0) && !carried) {
                atomicCAS(&sCode, 0u, err != 0 ? kLlKeep : std::uint32_t(Errc::Aborted));
                ok = false;
                break;
            }
        }
        if (globalTimerNs() - t0 > v.timeoutNs) {
            std::uint32_t low = kNoPeer; // lowest rank still missing here
#pragma unroll
            for (std::uint32_t k = 0; k < kPer; ++k)
#pragma unroll
                for (std::uint32_t j = 0; j < kPeers; ++j)
                    if ((pending >> (k * kPeers + j) & 1u) && (j < me ? j : j + 1) < low) low = j < me ? j : j + 1;
            atomicMin(&sMissing, low);
            atomicCAS(&sCode, 0u, std::uint32_t(Errc::Timeout));
            ok = false;
        }
    }

    // The tag line: in by now but for a straggler (the peer stores it before
    // its lines); another tag, or a line of the peer's data or filler there,
    // is another size, dtype or op.
    for (std::uint32_t spins = 1; ok && tagThread; ++spins) {
        if (llTagIn(t, f)) {
            if (!llTagAgrees(t, ctag)) {
                atomicMin(&sMissing, tagSrc);
                atomicCAS(&sCode, 0u, std::uint32_t(Errc::GroupMismatch));
                ok = false;
            }
            break;
        }
        if ((spins & 63u) == 0 && code != 0) {
            ok = false;
            break;
        }
        if ((spins & 1023u) == 0) { // the daemon's record, as in the wait above (a second look fails)
            const std::uint32_t err = ldRelaxedSys(&v.control->error), ab = ldRelaxedSys(&v.control->abort);
            if ((err != 0 || ab != 0) && recorded) {
                atomicCAS(&sCode, 0u, err != 0 ? kLlKeep : std::uint32_t(Errc::Aborted));
                ok = false;
                break;
            }
            recorded |= err != 0 || ab != 0;
        }
        if (globalTimerNs() - t0 > v.timeoutNs) {
            atomicMin(&sMissing, tagSrc);
            atomicCAS(&sCode, 0u, std::uint32_t(Errc::Timeout));
            ok = false;
            break;
        }
        t = ldLl(tagLine);
    }

    // 3. verdict: the block's AND, then across blocks: every block adds
    // itself to this call's counter (failed blocks also in the high half)
    // and waits until all have; the last to arrive records a failure and
    // advances the epoch (every block read it already).
    bool good = __syncthreads_and(ok) != 0;
    std::uint64_t tLines = 0;
    if constexpr (Probe::kOn) tLines = b == 0 && threadIdx.x == 0 ? globalTimerNs() : 0;
    if (threadIdx.x == 0) {
        const std::uint32_t mine = good ? 0u : (code != 0 ? code : std::uint32_t(Errc::Timeout));
        sFill = mine == std::uint32_t(Errc::GroupMismatch); // block 0 only: its threads check the tags
        std::uint32_t failCode = mine, missing = sMissing;
        bool last = true;
        if (nb > 1) {
            if (mine != 0) {
                atomicMax(&st->llCode, mine);
                atomicMin(&st->llMissing, missing);
                __threadfence(); // llCode / llMissing before the arrival
            }
            std::uint32_t* count = &st->llArrive[e & 1];
            const std::uint32_t add = mine != 0 ? 0x10001u : 1u;
            const std::uint32_t old = atomicAdd(count, add);
            last = (old & 0xffffu) == nb - 1;
            std::uint32_t word = old + add;
            while ((word & 0xffffu) != nb) {
                if (globalTimerNs() - t0 > 2 * v.timeoutNs + 1000000000ull) { // a block never ran
                    word = 0x10000u;
                    recordFailure(v.control, std::uint32_t(Errc::Timeout), kNoPeer);
                    break;
                }
                word = ldAcquireGpu(count);
            }
            good = (word >> 16) == 0;
            failCode = 0;
            if (last && !good) {
                __threadfence();
                failCode = atomicExch(&st->llCode, 0u);
                missing = atomicExch(&st->llMissing, kNoPeer);
                if (failCode == 0) failCode = std::uint32_t(Errc::Timeout);
            }
        }
        if (last) {
            if (failCode != 0) {
                stRelaxedSys(&v.control->epoch, e);
                if (failCode != kLlKeep) {
                    const bool named = failCode == std::uint32_t(Errc::Timeout) || failCode == std::uint32_t(Errc::GroupMismatch);
                    recordFailure(v.control, failCode, named ? missing : kNoPeer);
                }
                atomicAdd(&st->failures, 1u);
                markCallFailed(v.control);
            }
            st->epoch = e;
            endCall(v, tag, failCode == 0, failCode == kLlKeep ? ldRelaxedSys(&v.control->error) : failCode);
        }
        sCode = good ? 0u : 1u;
    }
    __syncthreads();
    // Every block has every peer's lines, so every peer's blocks have run
    // their put: the next kernel may be scheduled (collectiveKernel's rule).
    gridDepRelease();
    // A tag that disagreed: the filler past the own tag line in every peer
    // (kernels/device/ll.cuh), so that a peer of a larger size fails now too.
    if (sFill) {
        const std::uint64_t lines = v.ll.slotBytes / 16;
        for (std::uint32_t i = 0; i + 1 < W; ++i)
            llFill(v.peerRegions[peerAt(me, i, W)] + v.llOffset + v.ll.slotOffset(p, me), n16, lines, f, threadIdx.x,
                   blockDim.x);
    }

    // 4. the result, only when every block of this rank has every row.
    if (sCode == 0) {
#pragma unroll
        for (std::uint32_t k = 0; k < kPer; ++k) {
            const std::uint64_t c = base + std::uint64_t(k) * blockDim.x;
            if (c >= n16) continue;
            if constexpr (op == Op::Gather) {
                st16(recv + (std::uint64_t(me) * n16 + c) * 16, own[k]);
#pragma unroll
                for (std::uint32_t j = 0; j < kPeers; ++j)
                    if (j + 1 < W) st16(recv + (std::uint64_t(j < me ? j : j + 1) * n16 + c) * 16, held[k][j]);
            } else {
                using V = Vec<op>;
                float acc[V::kLanes];
                bool first = true;
#pragma unroll
                for (std::uint32_t j = 0; j < kPeers; ++j) {
                    if (j + 1 >= W) break;
                    if (j == me) accumulate<V>(acc, own[k], first), first = false; // rank order: own row at its rank
                    accumulate<V>(acc, held[k][j], first);
                    first = false;
                }
                if (me == W - 1) accumulate<V>(acc, own[k], first);
                st16(recv + c * 16, V::narrow(acc));
            }
        }
    }
    if constexpr (Probe::kOn) {
        if (b == 0) {
            __syncthreads();
            if (threadIdx.x == 0) probe->phases(t0, tPut, tLines, globalTimerNs());
        }
    }
}

/// The library's LL kernel (launched by collectives.cu).
template <Op op, std::uint32_t kPer, std::uint32_t kPeers>
__global__ void __launch_bounds__(llThreadsMax(kPer, kPeers)) llKernel(const DeviceGroupView v, const std::uint8_t* send,
                                                                       std::uint8_t* recv, std::uint64_t n16, const CallTag tag) {
    llCall<op, kPer, kPeers, NoProbe>(v, send, recv, n16, tag, nullptr);
}

} // namespace tpf::kernels::detail