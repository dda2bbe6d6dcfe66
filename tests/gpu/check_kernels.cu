#include "tests/gpu/check_kernels.hpp"

#include <stdexcept>
#include <string>

#define TPF_CHECK_LOAD(call)                                                                         \
    do {                                                                                             \
        if (cudaError_t e_ = (call); e_ != cudaSuccess)                                              \
            throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorString(e_));             \
    } while (0)

namespace tpf::gputest {

namespace {

__device__ __forceinline__ std::uint32_t mix(std::uint32_t rank, std::uint32_t call, std::uint32_t j) {
    std::uint32_t h = rank * 0x9e3779b9u ^ (call + 0x7f4a7c15u) * 0x85ebca6bu ^ j * 0xc2b2ae35u;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    return h;
}

__device__ __forceinline__ float smallInt(std::uint32_t h) { return float(int(h % 1024u) - 512); }

__global__ void fillKernel(std::uint32_t* send, std::uint64_t words, std::uint32_t rank, std::uint32_t call, bool sum) {
    for (std::uint64_t j = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; j < words;
         j += std::uint64_t(gridDim.x) * blockDim.x) {
        const std::uint32_t h = mix(rank, call, std::uint32_t(j));
        send[j] = sum ? __float_as_uint(smallInt(h)) : h;
    }
}

__global__ void verifyKernel(const std::uint32_t* recv, std::uint64_t words, std::uint32_t world, std::uint32_t call,
                             bool sum, unsigned* bad, unsigned* firstBadCall) {
    const std::uint64_t total = sum ? words : words * world;
    unsigned mine = 0;
    for (std::uint64_t j = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; j < total;
         j += std::uint64_t(gridDim.x) * blockDim.x) {
        std::uint32_t want;
        if (sum) {
            float acc = 0.f;
            for (std::uint32_t r = 0; r < world; ++r) acc += smallInt(mix(r, call, std::uint32_t(j)));
            want = __float_as_uint(acc);
        } else {
            const std::uint32_t row = std::uint32_t(j / words);
            want = mix(row, call, std::uint32_t(j - row * words));
        }
        mine += recv[j] != want;
    }
    if (mine) {
        atomicAdd(bad, mine);
        atomicCAS(firstBadCall, 0u, call + 1);
    }
}

__global__ void copyKernel(uint4* dst, const uint4* src, std::uint64_t n16) {
    for (std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < n16;
         i += std::uint64_t(gridDim.x) * blockDim.x)
        dst[i] = src[i];
}

unsigned gridFor(std::uint64_t items, unsigned threads) {
    const std::uint64_t g = (items + threads - 1) / threads;
    return unsigned(g < 1 ? 1 : g > 64 ? 64 : g);
}

} // namespace

void launchFill(std::uint32_t* send, std::uint64_t words, std::uint32_t rank, std::uint32_t call, bool sum,
                cudaStream_t stream) {
    fillKernel<<<gridFor(words, 256), 256, 0, stream>>>(send, words, rank, call, sum);
}

void launchVerify(const std::uint32_t* recv, std::uint64_t words, std::uint32_t world, std::uint32_t call, bool sum,
                  unsigned* bad, unsigned* firstBadCall, cudaStream_t stream) {
    verifyKernel<<<gridFor(sum ? words : words * world, 256), 256, 0, stream>>>(recv, words, world, call, sum, bad,
                                                                               firstBadCall);
}

void preloadCheckKernels() {
    cudaFuncAttributes a;
    TPF_CHECK_LOAD(cudaFuncGetAttributes(&a, reinterpret_cast<const void*>(&fillKernel)));
    TPF_CHECK_LOAD(cudaFuncGetAttributes(&a, reinterpret_cast<const void*>(&verifyKernel)));
    TPF_CHECK_LOAD(cudaFuncGetAttributes(&a, reinterpret_cast<const void*>(&copyKernel)));
}

void launchCopy(void* dst, const void* src, std::uint64_t bytes, cudaStream_t stream) {
    const std::uint64_t n16 = bytes / 16;
    const std::uint64_t blocks = (bytes + 16383) / 16384;
    copyKernel<<<unsigned(blocks < 1 ? 1 : blocks > 32 ? 32 : blocks), 256, 0, stream>>>(
        static_cast<uint4*>(dst), static_cast<const uint4*>(src), n16);
}

} // namespace tpf::gputest
