// Host side of the collective kernels: argument checks, the launchers (the
// shapes: collectives_launch.cuh), and the synchronous state/control-block
// accessors.
#include "kernels/collectives.hpp"

#include <atomic>

#include "kernels/collectives_kernel.cuh"
#include "kernels/collectives_launch.cuh"
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

// The library's kernels, for detail::launchCall.
struct LibraryKernels {
    template <Op op> static auto collective() { return &detail::collectiveKernel<op>; }
    template <Op op, std::uint32_t per, std::uint32_t peers> static auto ll() { return &detail::llKernel<op, per, peers>; }
};

template <Op op>
cudaError_t launch(const DeviceGroupView& v, const void* send, void* recv, std::uint64_t bytes, const CallTag* tag,
                   cudaStream_t stream) {
    const CallTag t = tag ? *tag : CallTag{op == Op::Gather ? kStatsAllGather : kStatsAllReduceSum, 1, bytes};
    return detail::launchCall<LibraryKernels, op>(v, send, recv, bytes, t, stream);
}

} // namespace

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
        if (route > kLastWire || (route == kWireSelf) != (r == v.rank))
            return Errc::OutOfRange;
        if (route == kWireIpc && v.peerRegions[r] == nullptr) return Errc::BadMessage;
        proxy |= proxyCarries(route);
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

namespace {

// One call handed to NCCL, counted on the stream (launchCountNccl).
__global__ void countNcclKernel(DeviceStats* d, RankStats* ring, std::uint64_t bytes) {
    using U64 = unsigned long long;
    const U64 calls = atomicAdd(reinterpret_cast<U64*>(&d->ncclCalls), 1ull) + 1;
    const U64 total = atomicAdd(reinterpret_cast<U64*>(&d->ncclBytes), U64(bytes)) + bytes;
    if (ring) {
        detail::stRelaxedSys(&ring->ncclGraphCalls, calls);
        detail::stRelaxedSys(&ring->ncclGraphBytes, total);
    }
}

} // namespace

cudaError_t preloadKernels() {
    // cudaFuncGetAttributes loads the function (the documented way to defeat lazy loading).
    const void* const kernels[] = {
        reinterpret_cast<const void*>(&detail::collectiveKernel<Op::Gather>),
        reinterpret_cast<const void*>(&detail::collectiveKernel<Op::SumF32>),
        reinterpret_cast<const void*>(&detail::collectiveKernel<Op::SumF16>),
        reinterpret_cast<const void*>(&detail::collectiveKernel<Op::SumBF16>),
        reinterpret_cast<const void*>(&countNcclKernel),
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
    put(r.ncclGraphCalls, d.ncclCalls);
    put(r.ncclGraphBytes, d.ncclBytes);
}

cudaError_t launchCountNccl(const DeviceGroupView& v, std::uint64_t bytes, cudaStream_t stream) {
    if (v.stats == nullptr) return cudaSuccess;
    countNcclKernel<<<1, 1, 0, stream>>>(v.stats, v.ringStats, bytes);
    return cudaGetLastError();
}

} // namespace tpf::kernels
