// Host side of the collective kernels: argument checks, grid sizing, launch,
// and the synchronous state/control-block accessors.
#include "kernels/collectives.hpp"

#include <algorithm>
#include <atomic>
#include <utility>

#include "kernels/collectives_kernel.cuh"
#include "kernels/ll_kernel.cuh"

namespace tpf::kernels {

namespace {

using detail::Op;

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kBufferAlign == 0; }

// Cheap per-call sanity; validateView is the full check.
bool viewUsable(const DeviceGroupView& v) {
    return v.world >= 1 && v.world <= kMaxWorld && v.rank < v.world && v.state != nullptr && v.region != nullptr &&
           v.control != nullptr && v.layout.world == v.world;
}

Errc checkCall(const DeviceGroupView& v, const void* send, const void* recv, std::uint64_t bytes) {
    if (!aligned16(send) || !aligned16(recv) || bytes % kBufferAlign != 0) return Errc::Misaligned;
    if (bytes > v.layout.slotBytes) return Errc::CapMismatch;
    return Errc::Ok;
}

std::atomic<bool> timeline{false}; // setKernelTimeline

// Some peer is on a proxy route (the daemon carries its shards).
bool hasProxyPeer(const DeviceGroupView& v) { return anyProxyCarries(v.wires, v.world); }

// Blocks of one call: one per kBytesPerBlock of shard (kProxyBytesPerBlock
// with a proxy-route peer), at most maxBlocks.
// Every block of every rank sharing the GPU must be resident at once (they
// wait on each other), which is why the cap is small.
std::uint32_t gridFor(const DeviceGroupView& v, std::uint64_t bytes) {
    const std::uint32_t cap = v.maxBlocks != 0 ? v.maxBlocks : kDefaultMaxBlocks;
    const bool proxy = hasProxyPeer(v);
    // A proxy-route call of a few KiB stays on one block: the blocks'
    // arrival and verdict cost more than the loads a second block adds.
    const std::uint64_t per = !proxy ? kBytesPerBlock : bytes <= kProxyOneBlockMax ? kProxyOneBlockMax : kProxyBytesPerBlock;
    const std::uint64_t want = (bytes + per - 1) / per;
    return std::uint32_t(want < 1 ? 1 : want > cap ? cap : want);
}

// Threads of a collectiveKernel block: the work threads, and with a
// proxy-route peer the poller warps of DeviceGroupView::pollWarps when there
// are several (one: warp 0 polls).
std::uint32_t pollWarpsOf(const DeviceGroupView& v) { return v.pollWarps != 0 ? v.pollWarps : kFlagCopies; }
std::uint32_t collectiveThreads(const DeviceGroupView& v) {
    const std::uint32_t w = pollWarpsOf(v);
    return kThreadsPerBlock + (hasProxyPeer(v) && w > 1 ? w * detail::kWarp : 0);
}

// The LL grid of a call (measured on two H200s and one, docs/perf.md): at
// W > 2 (llChunks 0) one chunk a thread over blocks of kLlSpreadThreads while
// llMaxBlocks of them cover the shard; else one block of 256 threads while
// two chunks a thread cover the shard; at W = 2 (llChunks 0) two chunks a
// thread over 256-thread blocks up to kLlOnePeerAbove and one chunk a thread
// over 1,024-thread blocks above it; else llChunks per thread (more if the
// blocks would not fit llMaxBlocks) over as many blocks as needed; per = 0:
// not an LL call.
struct LlGrid {
    std::uint32_t per = 0, blocks = 0, threads = 0;
};
LlGrid llGridFor(const DeviceGroupView& v, std::uint64_t bytes) {
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

// One launch of a collective kernel, with the programmatic-dependent-launch
// attribute when the view asks for it (DeviceGroupView::pdl); captured into a
// graph as a programmatic edge.
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

template <Op op, std::uint32_t kPer>
cudaError_t launchLl(const DeviceGroupView& v, const void* send, void* recv, std::uint64_t n16, std::uint32_t blocks,
                     std::uint32_t threads, const CallTag& tag, cudaStream_t stream) {
    const auto* s = static_cast<const std::uint8_t*>(send);
    auto* r = static_cast<std::uint8_t*>(recv);
    if (v.world == 2) return launchKernel(v, detail::llKernel<op, kPer, 1>, blocks, threads, stream, v, s, r, n16, tag);
    return launchKernel(v, detail::llKernel<op, kPer, kLlHeld / kPer>, blocks, threads, stream, v, s, r, n16, tag);
}

template <Op op>
cudaError_t launchLlFor(const DeviceGroupView& v, const void* send, void* recv, std::uint64_t bytes, LlGrid g,
                        const CallTag& tag, cudaStream_t stream) {
    switch (g.per) {
    case 1: return launchLl<op, 1>(v, send, recv, bytes / 16, g.blocks, g.threads, tag, stream);
    case 2: return launchLl<op, 2>(v, send, recv, bytes / 16, g.blocks, g.threads, tag, stream);
    default: return launchLl<op, 4>(v, send, recv, bytes / 16, g.blocks, g.threads, tag, stream);
    }
}

template <Op op>
cudaError_t launch(const DeviceGroupView& v, const void* send, void* recv, std::uint64_t bytes, const CallTag* tag,
                   cudaStream_t stream) {
    CallTag t = tag ? *tag : CallTag{op == Op::Gather ? kStatsAllGather : kStatsAllReduceSum, 1, bytes};
    if (timeline.load(std::memory_order_relaxed)) t.flags |= kTagTimeline;
    if (const LlGrid g = llGridFor(v, bytes); g.per != 0 && !t.flagPath) return launchLlFor<op>(v, send, recv, bytes, g, t, stream);
    return launchKernel(v, detail::collectiveKernel<op>, gridFor(v, bytes), collectiveThreads(v), stream, v,
                        static_cast<const std::uint8_t*>(send), static_cast<std::uint8_t*>(recv), bytes / 16, t);
}

} // namespace

Layout llLayoutOf(const Layout& l) {
    const std::uint64_t bytes = l.slotBytes < llMaxBytes(l.world) ? l.slotBytes : llMaxBytes(l.world);
    auto ll = Layout::of(l.world, roundUp(2 * bytes + 16, kSlotAlign), 1); // two lines a chunk, and the tag line
    return ll ? *ll : Layout{};
}

void enableLowLatency(DeviceGroupView& v) {
    v.ll = llLayoutOf(v.layout);
    v.llOffset = v.ll.world ? llAreaOffset(v.layout) : 0;
}

Errc validateView(const DeviceGroupView& v) {
    if (v.world < 1 || v.world > kMaxWorld || v.rank >= v.world) return Errc::OutOfRange;
    if (v.layout.world != v.world || v.layout.stripes < 1 || v.layout.stripes > kMaxStripes) return Errc::OutOfRange;
    if (v.layout.slotBytes == 0 || v.layout.slotBytes % kSlotAlign != 0) return Errc::Misaligned;
    if (v.region == nullptr || v.control == nullptr || v.state == nullptr || v.timeoutNs == 0) return Errc::BadMessage;
    if (v.pollWarps > kFlagCopies) return Errc::OutOfRange;
    bool proxy = false;
    for (std::uint32_t r = 0; r < v.world; ++r) {
        const std::uint8_t route = v.wires[r];
        if (route > kWireIpc || (route == kWireSelf) != (r == v.rank))
            return Errc::OutOfRange;
        if (route == kWireIpc && v.peerRegions[r] == nullptr) return Errc::BadMessage;
        proxy |= route == kWireShm || route == kWireVerbs;
    }
    if (proxy && (v.ring == nullptr || v.hostRegion == nullptr || !RingLayout::validEntries(v.ringLayout.entries)))
        return Errc::BadMessage;
    if (v.layout.slotBytes > 0xffffffffull && proxy) return Errc::OutOfRange; // Doorbell.bytes is u32
    return Errc::Ok;
}

Errc validateAllGather(const DeviceGroupView& v, const void* send, const void* recv, std::uint64_t bytes) {
    return checkCall(v, send, recv, bytes);
}

Errc validateAllReduceSum(const DeviceGroupView& v, const void* send, const void* recv, std::uint64_t count,
                          DType dtype) {
    if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) return Errc::Unsupported;
    return checkCall(v, send, recv, count * dtypeSize(dtype));
}

cudaError_t launchAllGather(const DeviceGroupView& v, const void* send, void* recv, std::uint64_t bytes,
                            cudaStream_t stream, const CallTag* tag) {
    if (!viewUsable(v) || checkCall(v, send, recv, bytes) != Errc::Ok) return cudaErrorInvalidValue;
    if (bytes == 0) return cudaSuccess;
    return launch<Op::Gather>(v, send, recv, bytes, tag, stream);
}

cudaError_t launchAllReduceSum(const DeviceGroupView& v, const void* send, void* recv, std::uint64_t count,
                               DType dtype, cudaStream_t stream, const CallTag* tag) {
    if (!viewUsable(v) || validateAllReduceSum(v, send, recv, count, dtype) != Errc::Ok) return cudaErrorInvalidValue;
    const std::uint64_t bytes = count * dtypeSize(dtype);
    if (bytes == 0) return cudaSuccess;
    switch (dtype) {
    case DType::F32: return launch<Op::SumF32>(v, send, recv, bytes, tag, stream);
    case DType::F16: return launch<Op::SumF16>(v, send, recv, bytes, tag, stream);
    case DType::BF16: return launch<Op::SumBF16>(v, send, recv, bytes, tag, stream);
    }
    return cudaErrorInvalidValue;
}

void setKernelTimeline(bool on) { timeline.store(on, std::memory_order_relaxed); }

cudaError_t launchProxyHopLoop(const DeviceGroupView& v, std::uint64_t iters, std::uint64_t* laps,
                               cudaStream_t stream, std::uint64_t bytes) {
    if (!viewUsable(v) || !hasProxyPeer(v) || v.ring == nullptr || v.hostRegion == nullptr || bytes < 16 ||
        bytes % 16 != 0 || bytes > v.layout.slotBytes)
        return cudaErrorInvalidValue;
    detail::hopLoopKernel<<<1, detail::kWarp * pollWarpsOf(v), 0, stream>>>(v, iters, laps, bytes);
    return cudaGetLastError();
}

cudaError_t preloadKernels() {
    // cudaFuncGetAttributes loads the function (the documented way to defeat lazy loading).
    const void* const kernels[] = {
        reinterpret_cast<const void*>(&detail::collectiveKernel<Op::Gather>),
        reinterpret_cast<const void*>(&detail::collectiveKernel<Op::SumF32>),
        reinterpret_cast<const void*>(&detail::collectiveKernel<Op::SumF16>),
        reinterpret_cast<const void*>(&detail::collectiveKernel<Op::SumBF16>),
        reinterpret_cast<const void*>(&detail::hopLoopKernel),
#define TPF_LL_KERNELS(per, peers)                                                                                     \
    reinterpret_cast<const void*>(&detail::llKernel<Op::Gather, per, peers>),                                          \
        reinterpret_cast<const void*>(&detail::llKernel<Op::SumF32, per, peers>),                                     \
        reinterpret_cast<const void*>(&detail::llKernel<Op::SumF16, per, peers>),                                     \
        reinterpret_cast<const void*>(&detail::llKernel<Op::SumBF16, per, peers>)
        TPF_LL_KERNELS(1, 1), TPF_LL_KERNELS(2, 1), TPF_LL_KERNELS(4, 1),
        TPF_LL_KERNELS(1, kLlHeld), TPF_LL_KERNELS(2, kLlHeld / 2), TPF_LL_KERNELS(4, kLlHeld / 4),
#undef TPF_LL_KERNELS
    };
    for (const void* k : kernels) {
        cudaFuncAttributes a;
        if (cudaError_t err = cudaFuncGetAttributes(&a, k); err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

cudaError_t createDeviceState(DeviceState** out, std::uint64_t epoch, std::uint32_t ringHead) {
    *out = nullptr;
    DeviceState* s = nullptr;
    if (cudaError_t err = cudaMalloc(&s, sizeof(DeviceState)); err != cudaSuccess) return err;
    if (cudaError_t err = writeDeviceState(s, epoch, ringHead); err != cudaSuccess) {
        cudaFree(s);
        return err;
    }
    *out = s;
    return cudaSuccess;
}

cudaError_t destroyDeviceState(DeviceState* state) { return cudaFree(state); }

cudaError_t readDeviceState(const DeviceState* state, DeviceState& out) {
    return cudaMemcpy(&out, state, sizeof(DeviceState), cudaMemcpyDeviceToHost);
}

cudaError_t writeDeviceState(DeviceState* state, std::uint64_t epoch, std::uint32_t ringHead) {
    DeviceState init{};
    init.epoch = epoch;
    init.verdict = epoch; // no call of a later epoch has been decided yet
    init.ringHead = ringHead;
    init.ringTail = ringHead - (1u << 31); // looks full: the first doorbell reads the real tail
    init.llMissing = kNoPeer;
    // A private stream, synchronised: a pageable cudaMemcpy may return before
    // the bytes land, and a kernel on a non-blocking stream would not wait.
    cudaStream_t s;
    if (cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); err != cudaSuccess) return err;
    cudaError_t err = cudaMemcpyAsync(state, &init, sizeof(DeviceState), cudaMemcpyHostToDevice, s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    return err;
}

cudaError_t readFailure(const DeviceGroupView& v, CallFailure& out) {
    ControlBlock cb;
    // cudaMemcpyDefault: the control block is device memory or a host-mapped region alike.
    if (cudaError_t err = cudaMemcpy(&cb, v.control, sizeof cb, cudaMemcpyDefault); err != cudaSuccess) return err;
    Errc code = Errc::Ok;
    out.error = errcFromWire(cb.error, code) ? code : Errc::BadMessage;
    out.missingPeer = cb.missingPeer;
    out.epoch = cb.epoch;
    return cudaSuccess;
}

void publishDeviceStats(const DeviceStats& d, RankStats& r) {
    const auto put = [](auto& field, auto v) { std::atomic_ref(field).store(v, std::memory_order_relaxed); };
    for (std::uint32_t o = 0; o < kStatsOps; ++o) {
        put(r.ops[o].calls, d.ops[o].calls);
        put(r.ops[o].bytes, d.ops[o].bytes);
        put(r.ops[o].errors, d.ops[o].errors);
        put(r.ops[o].latencyNs, d.ops[o].latencyNs);
        for (std::uint32_t b = 0; b < kLatencyBuckets; ++b) put(r.ops[o].latency[b], d.ops[o].latency[b]);
    }
    for (std::uint32_t c = 0; c < kStatsErrcSlots; ++c) put(r.errorsByCode[c], d.errorsByCode[c]);
    if (d.lastError) put(r.lastError, d.lastError);
}

} // namespace tpf::kernels
