// NcclBootstrap: open-time records all-gathered through NCCL.
#include <tpfabric/nccl.hpp>

#include "client/gpu_check.hpp"
#include "client/impl.hpp"

namespace tpf {

Result<std::unique_ptr<NcclBootstrap>> NcclBootstrap::create(ncclComm_t comm) {
    if (!comm) return Error{Errc::OutOfRange, "NcclBootstrap: null communicator"};
    std::unique_ptr<NcclBootstrap> b(new NcclBootstrap);
    b->comm_ = comm;
    int rank = 0, world = 0;
    TPF_GPU_TRY(ncclCommUserRank(comm, &rank));
    TPF_GPU_TRY(ncclCommCount(comm, &world));
    b->rank_ = std::uint32_t(rank);
    b->world_ = std::uint32_t(world);
    cudaStream_t s = nullptr;
    TPF_GPU_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    b->stream_ = s;
    return b;
}

NcclBootstrap::~NcclBootstrap() {
    if (scratch_) (void)TPF_GPU(cudaFree(scratch_));
    if (stream_) (void)TPF_GPU(cudaStreamDestroy(stream_));
}

Status NcclBootstrap::allGather(const void* mine, void* out, std::size_t bytes) {
    const std::size_t need = bytes * world_;
    if (need > scratchBytes_) {
        if (scratch_) TPF_GPU_TRY(cudaFree(scratch_));
        scratch_ = nullptr;
        scratchBytes_ = 0;
        TPF_GPU_TRY(cudaMalloc(&scratch_, need));
        scratchBytes_ = need;
    }
    auto* base = static_cast<std::uint8_t*>(scratch_);
    TPF_GPU_TRY(cudaMemcpyAsync(base + rank_ * bytes, mine, bytes, cudaMemcpyHostToDevice, stream_));
    TPF_GPU_TRY(ncclAllGather(base + rank_ * bytes, base, bytes, ncclUint8, comm_, stream_));
    TPF_GPU_TRY(cudaMemcpyAsync(out, base, need, cudaMemcpyDeviceToHost, stream_));
    TPF_GPU_TRY(cudaStreamSynchronize(stream_));
    return okStatus();
}

void* ncclCommOf(Bootstrap& boot) {
    auto* nb = dynamic_cast<NcclBootstrap*>(&boot);
    return nb ? static_cast<void*>(nb->comm()) : nullptr;
}

} // namespace tpf
