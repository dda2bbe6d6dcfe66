// Pack and unpack kernels of staged calls (kernels/staging.hpp).
#include "kernels/staging.hpp"

#include "kernels/device/call.cuh"

namespace tpf::kernels {

namespace {

using detail::countFailure;
using detail::markCallFailed;
using detail::recordFailure;

constexpr std::uint32_t kThreads = 256;
constexpr std::uint32_t kMaxBlocksStaging = 32;
constexpr std::uint64_t kBytesPerStagingBlock = 16384;

std::uint32_t blocksFor(std::uint64_t bytes) {
    const std::uint64_t b = (bytes + kBytesPerStagingBlock - 1) / kBytesPerStagingBlock;
    return std::uint32_t(b < 1 ? 1 : b > kMaxBlocksStaging ? kMaxBlocksStaging : b);
}

// This block's share [lo, hi) of n items.
__device__ __forceinline__ void share(std::uint64_t n, std::uint64_t& lo, std::uint64_t& hi) {
    const std::uint64_t per = (n + gridDim.x - 1) / gridDim.x;
    lo = per * blockIdx.x < n ? per * blockIdx.x : n;
    hi = per * (blockIdx.x + 1) < n ? per * (blockIdx.x + 1) : n;
}

// This block's share of copying n bytes; 16-byte vectors where both ends
// allow them, 4-byte words where they allow those, else bytes.
__device__ void copyShare(std::uint8_t* dst, const std::uint8_t* src, std::uint64_t n) {
    const std::uintptr_t mis = reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src);
    const std::uint64_t unit = (mis & 15) == 0 ? 16 : (mis & 3) == 0 ? 4 : 1;
    std::uint64_t lo, hi;
    share(n / unit, lo, hi);
    for (std::uint64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        if (unit == 16) reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
        else if (unit == 4) reinterpret_cast<std::uint32_t*>(dst)[i] = reinterpret_cast<const std::uint32_t*>(src)[i];
        else dst[i] = src[i];
    }
    // The tail below one unit: the last block copies it byte by byte.
    if (blockIdx.x == gridDim.x - 1)
        for (std::uint64_t i = n / unit * unit + threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

// The collective kernel counted the call and its bytes; a mismatch found
// after it makes it a failed one (device totals and the ring's, live).
__device__ void countMismatch(const DeviceGroupView& v, const UnpackRows& rows) {
    countFailure(v, rows.statsOp, rows.statsBytes, std::uint32_t(Errc::GroupMismatch));
}

__global__ void __launch_bounds__(kThreads) packKernel(std::uint8_t* dst, RowHeader header, bool withHeader,
                                                       const std::uint8_t* send, std::uint64_t bytes) {
    if (withHeader) {
        if (blockIdx.x == 0 && threadIdx.x == 0) *reinterpret_cast<RowHeader*>(dst) = header;
        dst += sizeof(RowHeader);
    }
    copyShare(dst, send, bytes);
}

__global__ void __launch_bounds__(kThreads) unpackKernel(const DeviceGroupView v, const std::uint8_t* scratch,
                                                         std::uint8_t* recv, const UnpackRows rows) {
    __shared__ std::uint32_t go;
    if (threadIdx.x == 0) {
        // Stream order: the collective kernel of this call has finished.
        go = *reinterpret_cast<volatile const std::uint32_t*>(&v.state->failures) == 0;
        std::uint32_t bad = kNoPeer;
        if (go && rows.headers) {
            for (std::uint32_t r = 0; r < rows.rows && bad == kNoPeer; ++r) {
                const RowHeader h = *reinterpret_cast<const RowHeader*>(scratch + r * rows.pitch);
                if (h.magic != kRowHeaderMagic || h.countsHash != rows.countsHash || h.rowBytes != rows.bytes[r]) bad = r;
            }
            if (bad != kNoPeer) {
                go = 0;
                if (blockIdx.x == 0) { // one block records the failure; every block reached the same verdict
                    recordFailure(v.control, std::uint32_t(Errc::GroupMismatch), bad);
                    atomicAdd(&v.state->failures, 1u);
                    markCallFailed(v.control);
                    countMismatch(v, rows);
                }
            }
        }
    }
    __syncthreads();
    if (!go) return;
    const std::uint64_t skip = rows.headers ? sizeof(RowHeader) : 0;
    for (std::uint32_t r = 0; r < rows.rows; ++r)
        copyShare(recv + rows.offset[r], scratch + r * rows.pitch + skip, rows.bytes[r]);
}

} // namespace

cudaError_t launchPackRow(void* dst, const RowHeader* header, const void* send, std::uint64_t bytes,
                          cudaStream_t stream) {
    if (reinterpret_cast<std::uintptr_t>(dst) % 16 != 0 || (bytes && send == nullptr)) return cudaErrorInvalidValue;
    packKernel<<<blocksFor(bytes), kThreads, 0, stream>>>(static_cast<std::uint8_t*>(dst), header ? *header : RowHeader{},
                                                          header != nullptr, static_cast<const std::uint8_t*>(send), bytes);
    return cudaGetLastError();
}

cudaError_t launchUnpackRows(const DeviceGroupView& v, const void* scratch, void* recv, const UnpackRows& rows,
                             cudaStream_t stream) {
    if (rows.rows < 1 || rows.rows > kMaxWorld || rows.pitch % 16 != 0 || v.state == nullptr || v.control == nullptr)
        return cudaErrorInvalidValue;
    std::uint64_t total = 0;
    for (std::uint32_t r = 0; r < rows.rows; ++r) total += rows.bytes[r];
    unpackKernel<<<blocksFor(total), kThreads, 0, stream>>>(v, static_cast<const std::uint8_t*>(scratch),
                                                            static_cast<std::uint8_t*>(recv), rows);
    return cudaGetLastError();
}

cudaError_t preloadStagingKernels() {
    for (const void* k : {reinterpret_cast<const void*>(&packKernel), reinterpret_cast<const void*>(&unpackKernel)}) {
        cudaFuncAttributes a;
        if (cudaError_t err = cudaFuncGetAttributes(&a, k); err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

} // namespace tpf::kernels
