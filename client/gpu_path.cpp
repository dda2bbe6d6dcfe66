// Collectives on device buffers: one kernel launch per call on the caller's
// stream (no host wait, capturable), NCCL above the agreed cap or after a
// fallback, and the kernels' recorded failure read back by check().
#include "client/gpu_check.hpp"
#include "client/gpu_path.hpp"

namespace tpf {

namespace {

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kBufferAlign == 0; }

Status hostGroup() { return Error{Errc::Unsupported, "stream calls need a group opened with Buffers::Device"}; }

#if TPF_HAVE_NCCL
ncclDataType_t ncclTypeOf(DType t) {
    switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    }
    return ncclFloat32;
}
#endif

} // namespace

Status Group::allGather(const void* send, void* recv, std::size_t bytes, CUstream_st* stream) {
    Impl& g = *impl_;
    if (g.failure.code != Errc::Ok) return g.failure;
    if (!g.gpu) return hostGroup();
    if (!aligned(send) || !aligned(recv) || bytes % kBufferAlign)
        return Error{Errc::Misaligned, "allGather: send, recv and bytes must be 16-byte aligned"};
    GpuPath& p = *g.gpu;
    if (bytes == 0) return okStatus();
    if (g.nccl || !fits(bytes) || bytes > p.ncclAboveGather) {
#if TPF_HAVE_NCCL
        if (p.comm)
            return TPF_GPU(ncclAllGather(send, recv, bytes, ncclUint8, static_cast<ncclComm_t>(p.comm), stream));
#endif
        return Error{Errc::CapMismatch, std::to_string(bytes) + " bytes above the agreed cap of " +
                                            std::to_string(g.agreedCap) + " and no NCCL communicator"};
    }
    if (g.world == 1) return TPF_GPU(cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, stream));
    if (Errc e = kernels::validateAllGather(p.view, send, recv, bytes); e != Errc::Ok)
        return Error{e, "allGather of " + std::to_string(bytes) + " bytes refused by the kernel launcher"};
    return TPF_GPU(kernels::launchAllGather(p.view, send, recv, bytes, stream));
}

Status Group::allReduceSum(const void* send, void* recv, std::size_t count, DType type, CUstream_st* stream) {
    Impl& g = *impl_;
    if (g.failure.code != Errc::Ok) return g.failure;
    if (!g.gpu) return hostGroup();
    const std::size_t bytes = count * dtypeSize(type);
    if (!aligned(send) || !aligned(recv) || bytes % kBufferAlign)
        return Error{Errc::Misaligned, "allReduceSum: send, recv and bytes must be 16-byte aligned"};
    GpuPath& p = *g.gpu;
    if (count == 0) return okStatus();
    if (g.nccl || !fits(bytes) || bytes > p.ncclAboveSum) {
#if TPF_HAVE_NCCL
        if (p.comm)
            return TPF_GPU(ncclAllReduce(send, recv, count, ncclTypeOf(type), ncclSum, static_cast<ncclComm_t>(p.comm), stream));
#endif
        return Error{Errc::CapMismatch, std::to_string(bytes) + " bytes above the agreed cap of " +
                                            std::to_string(g.agreedCap) + " and no NCCL communicator"};
    }
    if (g.world == 1) return TPF_GPU(cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, stream));
    const auto kt = static_cast<kernels::DType>(type);
    if (Errc e = kernels::validateAllReduceSum(p.view, send, recv, count, kt); e != Errc::Ok)
        return Error{e, "allReduceSum of " + std::to_string(bytes) + " bytes refused by the kernel launcher"};
    return TPF_GPU(kernels::launchAllReduceSum(p.view, send, recv, count, kt, stream));
}

Status gpuCheck(Group::Impl& g) {
    if (g.failure.code != Errc::Ok) return g.failure;
    if (!g.gpu || g.nccl || g.world == 1) return okStatus();
    // Only a failed call counts: the daemon also writes the control block when
    // a rank leaves after the last call, which must not fail the others.
    kernels::DeviceState st;
    if (auto s = TPF_GPU(kernels::readDeviceState(g.gpu->state, st)); !s) return g.fail(s.error());
    if (st.failures == 0) return okStatus();
    kernels::CallFailure f;
    if (auto s = TPF_GPU(kernels::readFailure(g.gpu->view, f)); !s) return g.fail(s.error());
    if (f.error == Errc::Ok) f.error = Errc::PeerLost; // cannot happen: a failed call records its error
    std::string why;
    switch (f.error) {
    case Errc::Timeout:
        why = f.missingPeer == g.rank ? "the daemon's proxy did not take doorbells within the timeout"
                                      : "rank " + std::to_string(f.missingPeer) + " did not deliver epoch " +
                                            std::to_string(f.epoch) + " within " + std::to_string(g.options.timeout.count()) + " ms";
        break;
    case Errc::Aborted: why = "a rank aborted the group"; break;
    default:
        why = f.missingPeer == kNoPeer ? std::string("reported by the daemon")
                                       : "rank " + std::to_string(f.missingPeer) + " is gone (" + std::string(errcName(f.error)) + ")";
    }
    return g.fail(Error{f.error, why});
}

#if !TPF_HAVE_NCCL
void* ncclCommOf(Bootstrap&) { return nullptr; }
#endif

} // namespace tpf
