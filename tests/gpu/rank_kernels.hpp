// Device-side fill and verify kernels of tpf-gpurank: every rank's shard of
// every call is a function of (call, rank, index), so each rank checks the
// whole result on its own stream without a host sync.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tpf::gputest {

/// Gather shards: bytes of (call, rank), 16-byte words.
void fillShard(void* p, std::uint64_t bytes, std::uint64_t call, std::uint32_t rank, cudaStream_t s);
/// f32 sum inputs: small integers (exact in any order).
void fillInts(float* p, std::uint64_t count, std::uint64_t call, std::uint32_t rank, cudaStream_t s);
/// Counts wrong words of a gather result (world rows) into *bad; records the first bad call in *firstBad.
void verifyGather(const void* recv, std::uint64_t bytes, std::uint32_t world, std::uint64_t call,
                  unsigned long long* bad, unsigned long long* firstBad, cudaStream_t s);
void verifySum(const float* recv, std::uint64_t count, std::uint32_t world, std::uint64_t call,
               unsigned long long* bad, unsigned long long* firstBad, cudaStream_t s);
/// Makes sure the kernels above are loaded before any collective spins (docs/gpu.md, preloadKernels).
cudaError_t preloadRankKernels();

} // namespace tpf::gputest
