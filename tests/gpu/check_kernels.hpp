// Small helper kernels of the GPU tests: per-call fill and on-device
// verification (the 2,000-call run checks every call without a host sync),
// and a plain copy kernel (the latency baseline).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tpf::gputest {

/// Fills rank `rank`'s shard of call `call` (words 32-bit words). sum: small
/// integers as f32 (their sum is exact in any order); else hash words.
void launchFill(std::uint32_t* send, std::uint64_t words, std::uint32_t rank, std::uint32_t call, bool sum,
                cudaStream_t stream);
/// Counts into *bad the words of recv that differ from what call `call`
/// must have produced (gather: world rows; sum: one row), and stores the
/// first failing call + 1 into *firstBadCall.
void launchVerify(const std::uint32_t* recv, std::uint64_t words, std::uint32_t world, std::uint32_t call, bool sum,
                  unsigned* bad, unsigned* firstBadCall, cudaStream_t stream);
/// Loads the kernels below now (see kernels::preloadKernels: a lazy load at
/// first launch can wait for a spinning collective of another simulated rank).
void preloadCheckKernels();
/// dst <- src, 16 bytes a thread, one block per 16 KiB (like the collectives).
void launchCopy(void* dst, const void* src, std::uint64_t bytes, cudaStream_t stream);

} // namespace tpf::gputest
