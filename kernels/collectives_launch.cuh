// Host side of a collective call's launch: the grid and block shapes of the
// flag path and the LL path, and the launch itself (with programmatic
// dependent launch when the view asks for it). One source for the shapes:
// the library's launchers (collectives.cu) and bench/gpu's timed variants
// launch through launchCall, each with its own kernel set, so both run the
// same shapes. Compiled by nvcc (it names kernels).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "kernels/collectives.hpp"
#include "kernels/device/call.cuh"

namespace tpf::kernels::detail {

/// Some peer is on a proxy route (the daemon carries its shards).
inline bool hasProxyPeer(const DeviceGroupView& v) { return anyProxyCarries(v.wires, v.world); }

/// Blocks of one flag-path call: one per kBytesPerBlock of shard
/// (kProxyBytesPerBlock with a proxy-route peer), at most maxBlocks. Every
/// block of every rank sharing the GPU must be resident at once (they wait
/// on each other), which is why the cap is small.
inline std::uint32_t gridFor(const DeviceGroupView& v, std::uint64_t bytes) {
    const std::uint32_t cap = v.maxBlocks != 0 ? v.maxBlocks : kDefaultMaxBlocks;
    const bool proxy = hasProxyPeer(v);
    // A proxy-route call of a few KiB stays on one block: the blocks'
    // arrival and verdict cost more than the loads a second block adds.
    const std::uint64_t per = !proxy ? kBytesPerBlock : bytes <= kProxyOneBlockMax ? kProxyOneBlockMax : kProxyBytesPerBlock;
    const std::uint64_t want = (bytes + per - 1) / per;
    return std::uint32_t(want < 1 ? 1 : want > cap ? cap : want);
}

/// Poller warps of a call with a proxy-route peer (DeviceGroupView::pollWarps, 0: kFlagCopies).
inline std::uint32_t pollWarpsOf(const DeviceGroupView& v) { return v.pollWarps != 0 ? v.pollWarps : kFlagCopies; }
/// Threads of a flag-path block: the work threads, and with a proxy-route
/// peer the poller warps when there are several (one: warp 0 polls).
inline std::uint32_t collectiveThreads(const DeviceGroupView& v) {
    const std::uint32_t w = pollWarpsOf(v);
    return kThreadsPerBlock + (hasProxyPeer(v) && w > 1 ? w * kWarp : 0);
}

/// The LL grid of a call, measured on two H200s and one: at W > 2
/// (llChunks 0) one chunk a thread over blocks of kLlSpreadThreads while
/// llMaxBlocks of them cover the shard; else one block of 256 threads while
/// two chunks a thread cover the shard; at W = 2 (llChunks 0) two chunks a
/// thread over 256-thread blocks up to kLlOnePeerAbove and one chunk a thread
/// over 1,024-thread blocks above it; else llChunks per thread (more if the
/// blocks would not fit llMaxBlocks) over as many blocks as needed; per = 0:
/// not an LL call.
struct LlGrid {
    std::uint32_t per = 0, blocks = 0, threads = 0;
};
inline LlGrid llGridFor(const DeviceGroupView& v, std::uint64_t bytes) {
    LlGrid g;
    if (v.ll.world == 0 || bytes > llMaxBytes(v.world) || 2 * bytes + 16 > v.ll.slotBytes) return g; // + the tag line
    for (std::uint32_t r = 0; r < v.world; ++r)
        if (r != v.rank && v.wires[r] != kWireIpc) return g;
    const std::uint64_t n16 = bytes / 16, T = kLlThreads;
    const std::uint32_t maxPer = llChunksPerThread(v.world);
    const std::uint32_t cap = std::min(llMaxBlocks(v.world), v.maxBlocks != 0 ? v.maxBlocks : kDefaultMaxBlocks);
    const std::uint64_t T1 = kLlThreadsOnePeer;
    if (v.world == 2 && v.llChunks == 0 && n16 > kLlOnePeerAbove / 16 && (n16 + T1 - 1) / T1 <= cap) {
        g.per = 1; // large W = 2 calls: one chunk a thread, blocks of 1,024
        g.blocks = std::uint32_t((n16 + T1 - 1) / T1);
        g.threads = kLlThreadsOnePeer;
        return g;
    }
    if (v.world > 2 && v.llChunks == 0 && n16 > kLlSpreadThreads && (n16 + kLlSpreadThreads - 1) / kLlSpreadThreads <= cap) {
        g.per = 1; // small W > 2 calls: the peers' copies stored by several SMs (kLlSpreadThreads)
        g.blocks = std::uint32_t((n16 + kLlSpreadThreads - 1) / kLlSpreadThreads);
        g.threads = kLlSpreadThreads;
        return g;
    }
    if (n16 <= 2 * T && maxPer >= 2) {
        g.per = n16 <= T ? 1u : 2u;
        g.blocks = 1;
        g.threads = g.per == 1 ? std::uint32_t((n16 + 31) / 32 * 32) : kLlThreads;
        return g;
    }
    std::uint32_t per = v.llChunks != 0 ? v.llChunks : v.world == 2 ? 2u : kLlChunksDefault;
    per = per >= 4 ? 4u : per >= 2 ? 2u : 1u;
    if (per > maxPer) per = maxPer;
    while ((n16 + T * per - 1) / (T * per) > cap && per < maxPer) per *= 2;
    const std::uint64_t blocks = (n16 + T * per - 1) / (T * per);
    if (blocks > cap) return g;
    g.per = per;
    g.blocks = std::uint32_t(blocks);
    g.threads = kLlThreads;
    return g;
}

/// One launch of a collective kernel, with the programmatic-dependent-launch
/// attribute when the view asks for it (DeviceGroupView::pdl); captured into a
/// graph as a programmatic edge.
template <class... P, class... A>
cudaError_t launchKernel(const DeviceGroupView& v, void (*kernel)(P...), std::uint32_t blocks, std::uint32_t threads,
                         cudaStream_t stream, A&&... args) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(threads);
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = v.pdl != 0 ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

/// One call of `bytes` (a 16-byte multiple, checked by the caller): the LL
/// path where llGridFor takes it and the tag allows it, else the flag path.
/// K names the kernels: K::template collective<op>() and
/// K::template ll<op, per, peers>(), each taking (view, send, recv, n16, tag,
/// extra...).
template <class K, Op op, class... X>
cudaError_t launchCall(const DeviceGroupView& v, const void* send, void* recv, std::uint64_t bytes, const CallTag& t,
                       cudaStream_t stream, X... extra) {
    const auto* s = static_cast<const std::uint8_t*>(send);
    auto* r = static_cast<std::uint8_t*>(recv);
    const std::uint64_t n16 = bytes / 16;
    if (const LlGrid g = llGridFor(v, bytes); g.per != 0 && !t.flagPath) {
        const auto ll = [&](auto kernel) { return launchKernel(v, kernel, g.blocks, g.threads, stream, v, s, r, n16, t, extra...); };
        const bool one = v.world == 2; // one peer: loops without dead peers
        switch (g.per) {
        case 1: return one ? ll(K::template ll<op, 1, 1>()) : ll(K::template ll<op, 1, kLlHeld>());
        case 2: return one ? ll(K::template ll<op, 2, 1>()) : ll(K::template ll<op, 2, kLlHeld / 2>());
        default: return one ? ll(K::template ll<op, 4, 1>()) : ll(K::template ll<op, 4, kLlHeld / 4>());
        }
    }
    return launchKernel(v, K::template collective<op>(), gridFor(v, bytes), collectiveThreads(v), stream, v, s, r, n16, t,
                        extra...);
}

} // namespace tpf::kernels::detail
