// Rank-order sums on the host: the reference every path must match bit for
// bit. f32: acc = x0; acc += x_r for r = 1..W-1. f16/bf16: the same in f32,
// then one round to nearest even. Compiled without fast-math.
#pragma once

#include <cstddef>
#include <cstdint>

#include <tpfabric/tpfabric.hpp>

namespace tpf {

/// out[i] = rows[0][i] + rows[1][i] + ... + rows[n-1][i], in that order.
/// `out` may alias rows[k] only if it is written after being read element-wise (it is).
void sumRowsInOrder(const void* const* rows, std::size_t nrows, void* out, std::size_t count, DType type);

float bf16ToFloat(std::uint16_t v);
std::uint16_t floatToBf16(float f); ///< round to nearest even; NaN stays NaN
float f16ToFloat(std::uint16_t v);
std::uint16_t floatToF16(float f);  ///< round to nearest even; overflow to inf

} // namespace tpf
