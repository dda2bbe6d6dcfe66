// Reference kernels of the GPU benchmark: the floor (one copy kernel of the
// same bytes) and a raw host-mapped flag ping-pong.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tpf::gpubench {

/// One kernel copying `bytes` (16-byte multiple) with the collectives' grid
/// sizing (one block of 256 threads per 16 KiB, at most 32).
void launchCopy(void* dst, const void* src, std::uint64_t bytes, cudaStream_t s);
/// The same copy launched with programmatic dependent launch (the kernel
/// waits for the one before it on the GPU), the floor of calls that use it.
void launchCopyPdl(void* dst, const void* src, std::uint64_t bytes, cudaStream_t s);
/// `iters` round trips: the kernel stores i+1 to ping (host-mapped), waits for
/// pong == i+1 written by a CPU thread. Returns when done; the host measures.
void launchPingPong(std::uint64_t* ping, const std::uint64_t* pong, std::uint64_t iters, cudaStream_t s);
/// The same round trip polled as the collectives poll a flag in host memory
/// (collectives_kernel.cuh, waitPeers): `warps` warps (1..4), warp w reading
/// pong[w * 4] (its own 32-byte copy) from w * 250 ns after warp 0's store to
/// ping; the CPU thread writes all `warps` copies. laps[i]: %globaltimer from
/// the store to the first warp's sight of pong (ns).
void launchPingPongWarps(std::uint64_t* ping, const std::uint64_t* pong, std::uint32_t warps, std::uint64_t iters,
                         std::uint64_t* laps, cudaStream_t s);
cudaError_t preloadBenchKernels();

} // namespace tpf::gpubench
