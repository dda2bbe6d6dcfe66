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
cudaError_t preloadBenchKernels();

} // namespace tpf::gpubench
