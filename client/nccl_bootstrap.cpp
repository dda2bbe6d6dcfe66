// NcclBootstrap: open-time records all-gathered through NCCL.
#include <tpfabric/nccl.hpp>

#include "client/format.hpp"
#include "client/gpu_check.hpp"
#include "client/impl.hpp"

#include <chrono>
#include <thread>

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
    // A wedged all-gather still owns the scratch: cudaFree would wait for it
    // (forever). Leak it; the stream is released once its work ends.
    if (scratch_ && !wedged_) TPF_GPU_CLEANUP(cudaFree(scratch_));
    if (stream_) TPF_GPU_CLEANUP(cudaStreamDestroy(stream_));
}

Status NcclBootstrap::allGather(const void* mine, void* out, std::size_t bytes) {
    return allGatherUntil(mine, out, bytes, Clock::time_point::max());
}

// The records go out by ncclAllGather on the private stream; the host polls
// the stream (spin briefly, then sleep 50 us) until the deadline. A rank
// that never calls open leaves the collective pending: Timeout, and this
// bootstrap (and the communicator, whose collective cannot be withdrawn)
// is wedged: every later call returns the same error, and the caller must
// ncclCommAbort the communicator.
Status NcclBootstrap::allGatherUntil(const void* mine, void* out, std::size_t bytes, Clock::time_point deadline) {
    if (wedged_)
        return Error{Errc::Timeout, "an earlier NCCL all-gather of this bootstrap never completed: the communicator is "
                                    "wedged (ncclCommAbort it)"};
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
    const auto start = Clock::now();
    for (std::uint64_t spins = 0;; ++spins) {
        const cudaError_t q = cudaStreamQuery(stream_);
        if (q == cudaSuccess) return okStatus();
        if (q != cudaErrorNotReady) return TPF_GPU(q);
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
            wedged_ = true; // its kernel may never end either
            return Error{Errc::NcclError, std::string("the bootstrap's ncclAllGather failed: ") + ncclGetErrorString(async)};
        }
        const auto now = Clock::now();
        if (now >= deadline) {
            wedged_ = true;
            const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count();
            return Error{Errc::Timeout, format("the NCCL bootstrap's all-gather did not complete within {} ms (the open's "
                                               "deadline): some rank of the communicator did not call open, or is stuck; the "
                                               "communicator has a collective pending (ncclCommAbort it)",
                                               ms)};
        }
        if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

void* ncclCommOf(Bootstrap& boot) {
    auto* nb = dynamic_cast<NcclBootstrap*>(&boot);
    return nb ? static_cast<void*>(nb->comm()) : nullptr;
}

} // namespace tpf
