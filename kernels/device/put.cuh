// tpfabric device primitives — put: a block's share of the own shard stored
// into every destination slot (the own host slot the daemon's proxy carries
// from, and slot (p, rank) of every ipc peer's region). Device code only.
//
// Memory order: plain 16-byte stores, ordered for a reader by nothing yet.
// The caller publishes them: every block fences and arrives, and the last
// one's release of the peers' flags and of the ring head (flag.cuh, publish)
// makes every block's stores visible before the flag or the doorbell.
// Who writes: this rank's kernel, into slot (p, rank) only. Who reads: the
// peer's kernel after it acquired the flag (ipc), or the daemon's proxy
// after it acquired the doorbell (shm, verbs).
#pragma once

#include <cstdint>

#include "kernels/device/call.cuh"

namespace tpf::kernels::detail {

/// The destinations of one call's put (block-shared, filled by thread 0):
/// `dst[0..ndst)` are slot (p, rank) of each destination region.
/// Copies this block's part `r` of the shard (16-byte vectors of `send`) to
/// every destination, kUnroll vectors in flight per thread; each vector is
/// loaded once and stored ndst times. `ndst` is read where it lives (shared
/// memory) on every pass, as the stores may alias it for all the compiler
/// knows: the loop stays rolled, which is the shape that was measured.
__device__ __forceinline__ void putRange(std::uint8_t* const (&dst)[kMaxWorld], const std::uint32_t& ndst,
                                         const std::uint8_t* send, Range r) {
    for (std::uint64_t i = r.begin + threadIdx.x; i < r.end; i += kUnroll * blockDim.x) {
        uint4 v[kUnroll];
#pragma unroll
        for (std::uint32_t u = 0; u < kUnroll; ++u) {
            const std::uint64_t j = i + std::uint64_t(u) * blockDim.x;
            if (j < r.end) v[u] = ldSend16(send + j * 16);
        }
        for (std::uint32_t d = 0; d < ndst; ++d) {
#pragma unroll
            for (std::uint32_t u = 0; u < kUnroll; ++u) {
                const std::uint64_t j = i + std::uint64_t(u) * blockDim.x;
                if (j < r.end) st16(dst[d] + j * 16, v[u]);
            }
        }
    }
}

} // namespace tpf::kernels::detail
