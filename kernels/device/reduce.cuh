// tpfabric device primitives — the result of a call: the rows gathered in
// rank order, or summed in rank order 0..W-1 (bit-identical on every rank
// and run: f32 adds in f32; f16/bf16 widen exactly to f32, add in f32 and
// round once to nearest even). No fast-math: adds only, nothing to contract.
// Device code only.
//
// Rows come from a table `src[r]` (block-shared): the caller's send buffer
// for r == rank (ldSend16), else slot (p, r) where peer r's shard landed
// (ldSlot16: strong loads, ordered after the flag's acquire by the caller's
// decision and barrier). Nothing here waits: call these only after the
// call's wait decided success.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/device/call.cuh"

namespace tpf::kernels::detail {

/// Lanes of one 16-byte vector and how they widen to f32 and narrow back.
template <Op op> struct Vec;
template <> struct Vec<Op::SumF32> {
    static constexpr int kLanes = 4;
    __device__ static void widen(uint4 x, float* f) {
        f[0] = __uint_as_float(x.x), f[1] = __uint_as_float(x.y), f[2] = __uint_as_float(x.z), f[3] = __uint_as_float(x.w);
    }
    __device__ static uint4 narrow(const float* f) {
        return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
    }
};
template <> struct Vec<Op::SumF16> {
    static constexpr int kLanes = 8;
    __device__ static void widen(uint4 x, float* f) {
        const std::uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            __half2 h = *reinterpret_cast<const __half2*>(&w[k]);
            const float2 t = __half22float2(h);
            f[2 * k] = t.x, f[2 * k + 1] = t.y;
        }
    }
    __device__ static uint4 narrow(const float* f) {
        std::uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const __half lo = __float2half_rn(f[2 * k]), hi = __float2half_rn(f[2 * k + 1]);
            w[k] = std::uint32_t(__half_as_ushort(lo)) | (std::uint32_t(__half_as_ushort(hi)) << 16);
        }
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
};
template <> struct Vec<Op::SumBF16> {
    static constexpr int kLanes = 8;
    __device__ static void widen(uint4 x, float* f) {
        const std::uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            f[2 * k] = __uint_as_float(w[k] << 16);           // bf16 -> f32 is exact: the high half
            f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    }
    __device__ static uint4 narrow(const float* f) {
        std::uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const __nv_bfloat16 lo = __float2bfloat16_rn(f[2 * k]), hi = __float2bfloat16_rn(f[2 * k + 1]);
            w[k] = std::uint32_t(__bfloat16_as_ushort(lo)) | (std::uint32_t(__bfloat16_as_ushort(hi)) << 16);
        }
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
};

/// One row's vector into the accumulator: `first` starts it (acc = x), else
/// acc += x in f32, round to nearest. Called in rank order 0..W-1.
template <class V>
__device__ __forceinline__ void accumulate(float* acc, uint4 x, bool first) {
    float f[V::kLanes];
    V::widen(x, f);
#pragma unroll
    for (int k = 0; k < V::kLanes; ++k) acc[k] = first ? f[k] : __fadd_rn(acc[k], f[k]);
}

/// Row r's 16 bytes at `off`: the send buffer for the own row, else the slot.
__device__ __forceinline__ uint4 loadRow(const std::uint8_t* const (&src)[kMaxWorld], std::uint32_t r,
                                         std::uint32_t rank, std::uint64_t off) {
    return r == rank ? ldSend16(src[r] + off) : ldSlot16(src[r] + off);
}

/// Rows in rank order into recv: vector j of the W * n16 output is row j / n16.
/// By the block's first `threads` threads, kUnroll vectors in flight each.
/// 32-bit index math: W * n16 <= 16 * 2^26 (a slot is at most 1 GiB).
template <std::uint32_t threads>
__device__ __forceinline__ void gatherRange(const std::uint8_t* const (&src)[kMaxWorld], std::uint32_t rank,
                                            std::uint8_t* recv, std::uint32_t n16, Range r) {
    const std::uint32_t end = std::uint32_t(r.end);
    for (std::uint32_t i = std::uint32_t(r.begin) + threadIdx.x; i < end; i += kUnroll * threads) {
        uint4 v[kUnroll];
#pragma unroll
        for (std::uint32_t u = 0; u < kUnroll; ++u) {
            const std::uint32_t j = i + u * threads;
            if (j < end) {
                const std::uint32_t row = j / n16;
                v[u] = loadRow(src, row, rank, std::uint64_t(j - row * n16) * 16);
            }
        }
#pragma unroll
        for (std::uint32_t u = 0; u < kUnroll; ++u) {
            const std::uint32_t j = i + u * threads;
            if (j < end) st16(recv + std::uint64_t(j) * 16, v[u]);
        }
    }
}

/// Sum of rows 0..W-1 in rank order into recv (range r of the n16 vectors),
/// by the block's first `threads` threads, rows loaded kUnroll at a time so
/// their latencies overlap.
template <Op op, std::uint32_t threads>
__device__ __forceinline__ void sumRange(const std::uint8_t* const (&src)[kMaxWorld], std::uint32_t rank,
                                         std::uint32_t world, std::uint8_t* recv, Range r) {
    using V = Vec<op>;
    for (std::uint64_t i = r.begin + threadIdx.x; i < r.end; i += threads) {
        const std::uint64_t off = i * 16;
        float acc[V::kLanes];
        for (std::uint32_t r0 = 0; r0 < world; r0 += kUnroll) {
            uint4 x[kUnroll];
#pragma unroll
            for (std::uint32_t u = 0; u < kUnroll; ++u)
                if (r0 + u < world) x[u] = loadRow(src, r0 + u, rank, off);
#pragma unroll
            for (std::uint32_t u = 0; u < kUnroll; ++u) {
                if (r0 + u >= world) break;
                float f[V::kLanes];
                V::widen(x[u], f);
                if (r0 + u == 0) {
#pragma unroll
                    for (int k = 0; k < V::kLanes; ++k) acc[k] = f[k];
                } else {
#pragma unroll
                    for (int k = 0; k < V::kLanes; ++k) acc[k] = __fadd_rn(acc[k], f[k]);
                }
            }
        }
        st16(recv + off, V::narrow(acc));
    }
}

} // namespace tpf::kernels::detail
