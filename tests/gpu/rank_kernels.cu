#include "tests/gpu/rank_kernels.hpp"

namespace tpf::gputest {

namespace {

__device__ __host__ inline std::uint64_t mix64(std::uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

__device__ inline std::uint64_t word(std::uint64_t call, std::uint32_t rank, std::uint64_t i) {
    return mix64(call * 1000003ull + rank * 7919ull + i * 0x9e3779b97f4a7c15ull);
}

__global__ void fillShardK(std::uint64_t* p, std::uint64_t words, std::uint64_t call, std::uint32_t rank) {
    for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x)
        p[i] = word(call, rank, i);
}

__global__ void fillIntsK(float* p, std::uint64_t count, std::uint64_t call, std::uint32_t rank) {
    for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x)
        p[i] = float(std::int64_t(word(call, rank, i) % 201) - 100);
}

__global__ void verifyGatherK(const std::uint64_t* r, std::uint64_t words, std::uint32_t world, std::uint64_t call,
                              unsigned long long* bad, unsigned long long* firstBad) {
    for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words * world; i += gridDim.x * blockDim.x)
        if (r[i] != word(call, std::uint32_t(i / words), i % words)) {
            atomicAdd(bad, 1ull);
            atomicMin(firstBad, (unsigned long long)call);
        }
}

__global__ void verifySumK(const float* r, std::uint64_t count, std::uint32_t world, std::uint64_t call,
                           unsigned long long* bad, unsigned long long* firstBad) {
    for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
        float want = 0;
        for (std::uint32_t q = 0; q < world; ++q) want += float(std::int64_t(word(call, q, i) % 201) - 100);
        if (r[i] != want) {
            atomicAdd(bad, 1ull);
            atomicMin(firstBad, (unsigned long long)call);
        }
    }
}

unsigned gridFor(std::uint64_t n) { return unsigned(n / 256 + 1 < 64 ? n / 256 + 1 : 64); }

} // namespace

void fillShard(void* p, std::uint64_t bytes, std::uint64_t call, std::uint32_t rank, cudaStream_t s) {
    fillShardK<<<gridFor(bytes / 8), 256, 0, s>>>(static_cast<std::uint64_t*>(p), bytes / 8, call, rank);
}
void fillInts(float* p, std::uint64_t count, std::uint64_t call, std::uint32_t rank, cudaStream_t s) {
    fillIntsK<<<gridFor(count), 256, 0, s>>>(p, count, call, rank);
}
void verifyGather(const void* recv, std::uint64_t bytes, std::uint32_t world, std::uint64_t call,
                  unsigned long long* bad, unsigned long long* firstBad, cudaStream_t s) {
    verifyGatherK<<<gridFor(bytes / 8 * world), 256, 0, s>>>(static_cast<const std::uint64_t*>(recv), bytes / 8, world,
                                                             call, bad, firstBad);
}
void verifySum(const float* recv, std::uint64_t count, std::uint32_t world, std::uint64_t call,
               unsigned long long* bad, unsigned long long* firstBad, cudaStream_t s) {
    verifySumK<<<gridFor(count), 256, 0, s>>>(recv, count, world, call, bad, firstBad);
}

cudaError_t preloadRankKernels() {
    cudaFuncAttributes a;
    for (const void* f : {(const void*)fillShardK, (const void*)fillIntsK, (const void*)verifyGatherK, (const void*)verifySumK})
        if (cudaError_t e = cudaFuncGetAttributes(&a, f); e != cudaSuccess) return e;
    return cudaSuccess;
}

} // namespace tpf::gputest
