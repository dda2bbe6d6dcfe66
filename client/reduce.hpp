// Rank-order sums on the host: the reference every path must match bit for
// bit. f32: acc = x0; acc = acc + x_r for r = 1..W-1. f16/bf16: the same in
// f32 (each element widened exactly), then one round to nearest even. A NaN
// operand gives a quiet NaN with its payload. When both operands of an add
// are NaN, x86 returns its first operand's: the accumulator's for f32, the
// new row's for f16/bf16 (what the scalar code compiled to before the vector
// kernel; kept so that no result changed). Infinities of both signs give
// x86's default NaN (0xffc00000). The f32 adds use the calling thread's
// MXCSR (nearest-even, no FTZ/DAZ unless the caller set them); the
// narrowing is nearest-even always. Compiled without fast-math.
#pragma once

#include <cstddef>
#include <cstdint>

#include <tpfabric/tpfabric.hpp>

namespace tpf {

/// The implementations of sumRowsInOrder; every one gives the same bits.
/// Auto: the fastest this CPU runs (chosen once, at the first call).
enum class ReduceKernel : std::uint8_t {
    Auto,
    Scalar,  ///< one element at a time; any CPU
    Avx2F16c ///< 8 lanes of f32 (AVX2, F16C for f16); x86-64 with both
};

/// out[i] = rows[0][i] + rows[1][i] + ... + rows[n-1][i], in that order.
/// `out` may be one of the rows (the same pointer): every row of an element
/// is read before that element is written. Other overlaps are not allowed.
/// nrows == 0 writes nothing. No alignment needed. A kernel this CPU lacks
/// runs as Auto.
void sumRowsInOrder(const void* const* rows, std::size_t nrows, void* out, std::size_t count, DType type,
                    ReduceKernel kernel = ReduceKernel::Auto);

/// Whether this CPU runs `kernel` (Auto and Scalar: always).
bool reduceKernelAvailable(ReduceKernel kernel);
/// What Auto runs on this CPU.
ReduceKernel autoReduceKernel();
/// "auto", "scalar", "avx2+f16c".
const char* reduceKernelName(ReduceKernel kernel);

float bf16ToFloat(std::uint16_t v);
std::uint16_t floatToBf16(float f); ///< round to nearest even; NaN stays NaN
float f16ToFloat(std::uint16_t v);
std::uint16_t floatToF16(float f);  ///< round to nearest even; overflow to inf

} // namespace tpf
