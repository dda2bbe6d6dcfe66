// Host side of the collective kernels: argument checks, grid sizing, launch,
// and the synchronous state/control-block accessors.
#include "kernels/collectives.hpp"

#include "kernels/collectives_kernel.cuh"

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

// Blocks of one call: one per kBytesPerBlock of shard, at most maxBlocks.
// Every block of every rank sharing the GPU must be resident at once (they
// wait on each other), which is why the cap is small.
std::uint32_t gridFor(const DeviceGroupView& v, std::uint64_t bytes) {
    const std::uint32_t cap = v.maxBlocks != 0 ? v.maxBlocks : kDefaultMaxBlocks;
    const std::uint64_t want = (bytes + kBytesPerBlock - 1) / kBytesPerBlock;
    return std::uint32_t(want < 1 ? 1 : want > cap ? cap : want);
}

template <Op op>
cudaError_t launch(const DeviceGroupView& v, const void* send, void* recv, std::uint64_t bytes, cudaStream_t stream) {
    detail::collectiveKernel<op><<<gridFor(v, bytes), kThreadsPerBlock, 0, stream>>>(
        v, static_cast<const std::uint8_t*>(send), static_cast<std::uint8_t*>(recv), bytes / 16);
    return cudaGetLastError();
}

} // namespace

Errc validateView(const DeviceGroupView& v) {
    if (v.world < 1 || v.world > kMaxWorld || v.rank >= v.world) return Errc::OutOfRange;
    if (v.layout.world != v.world || v.layout.stripes < 1 || v.layout.stripes > kMaxStripes) return Errc::OutOfRange;
    if (v.layout.slotBytes == 0 || v.layout.slotBytes % kSlotAlign != 0) return Errc::Misaligned;
    if (v.region == nullptr || v.control == nullptr || v.state == nullptr || v.timeoutNs == 0) return Errc::BadMessage;
    bool proxy = false;
    for (std::uint32_t r = 0; r < v.world; ++r) {
        const std::uint8_t route = v.routes[r];
        if (route > client_proto::kRouteIpc || (route == client_proto::kRouteSelf) != (r == v.rank))
            return Errc::OutOfRange;
        if (route == client_proto::kRouteIpc && v.peerRegions[r] == nullptr) return Errc::BadMessage;
        proxy |= route == client_proto::kRouteShm || route == client_proto::kRouteVerbs;
    }
    if (proxy && (v.ring == nullptr || !RingLayout::validEntries(v.ringLayout.entries))) return Errc::BadMessage;
    if (v.layout.slotBytes > 0xffffffffull && proxy) return Errc::OutOfRange; // Doorbell.bytes is u32
    return Errc::Ok;
}

Errc validateAllGather(const DeviceGroupView& v, const void* send, const void* recv, std::uint64_t bytes) {
    return checkCall(v, send, recv, bytes);
}

Errc validateAllReduceSum(const DeviceGroupView& v, const void* send, const void* recv, std::uint64_t count,
                          DType dtype) {
    if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) return Errc::Unsupported;
    return checkCall(v, send, recv, count * dtypeBytes(dtype));
}

cudaError_t launchAllGather(const DeviceGroupView& v, const void* send, void* recv, std::uint64_t bytes,
                            cudaStream_t stream) {
    if (!viewUsable(v) || checkCall(v, send, recv, bytes) != Errc::Ok) return cudaErrorInvalidValue;
    if (bytes == 0) return cudaSuccess;
    return launch<Op::Gather>(v, send, recv, bytes, stream);
}

cudaError_t launchAllReduceSum(const DeviceGroupView& v, const void* send, void* recv, std::uint64_t count,
                               DType dtype, cudaStream_t stream) {
    if (!viewUsable(v) || validateAllReduceSum(v, send, recv, count, dtype) != Errc::Ok) return cudaErrorInvalidValue;
    const std::uint64_t bytes = count * dtypeBytes(dtype);
    if (bytes == 0) return cudaSuccess;
    switch (dtype) {
    case DType::F32: return launch<Op::SumF32>(v, send, recv, bytes, stream);
    case DType::F16: return launch<Op::SumF16>(v, send, recv, bytes, stream);
    case DType::BF16: return launch<Op::SumBF16>(v, send, recv, bytes, stream);
    }
    return cudaErrorInvalidValue;
}

cudaError_t preloadKernels() {
    // cudaFuncGetAttributes loads the function (the documented way to defeat lazy loading).
    const void* const kernels[] = {
        reinterpret_cast<const void*>(&detail::collectiveKernel<Op::Gather>),
        reinterpret_cast<const void*>(&detail::collectiveKernel<Op::SumF32>),
        reinterpret_cast<const void*>(&detail::collectiveKernel<Op::SumF16>),
        reinterpret_cast<const void*>(&detail::collectiveKernel<Op::SumBF16>),
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

} // namespace tpf::kernels
