// Deterministic shards for integration tests and the GPU tests: every process
// can compute every rank's input of every iteration, so each checks the whole
// result by itself. The reference sum is tests/common/reference.hpp's,
// written independently of the library's (client/reduce.cpp): conversions bit
// by bit, the rank-order float accumulation element by element, rounded once
// at the end (docs/design.md: the sum is the float32 sum in rank order,
// rounded once to the element type).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "../common/reference.hpp"
#include "tpfabric/tpfabric.hpp"

namespace tpf::testing {

inline std::uint64_t mix(std::uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/// Bytes of rank `r`'s shard in iteration `it`: one hash per 8-byte word.
inline void fillBytes(std::uint8_t* p, std::size_t n, std::uint64_t it, std::uint32_t r) {
    const std::uint64_t seed = it * 1000003u + r * 7919u;
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const std::uint64_t w = mix(seed + i / 8);
        std::memcpy(p + i, &w, 8);
    }
    if (i < n) {
        const std::uint64_t w = mix(seed + i / 8);
        std::memcpy(p + i, &w, n - i);
    }
}


/// Elements whose magnitudes spread over 2^-10..2^9 with both signs, so a
/// different summation order changes the bits of the result.
inline float valueAt(std::uint64_t it, std::uint32_t r, std::size_t i) {
    const std::uint64_t h = mix(it * 1000003u + r * 7919u + i);
    const std::uint32_t exponent = std::uint32_t(127 - 10 + h % 19); // 2^-10 .. 2^9: 16 of them stay finite in f16
    const std::uint32_t bits = (std::uint32_t((h >> 40) & 1) << 31) | (exponent << 23) | (std::uint32_t(h >> 8) & 0x7fffffu);
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

inline void fillValues(void* p, std::size_t count, DType t, std::uint64_t it, std::uint32_t r) {
    for (std::size_t i = 0; i < count; ++i) {
        const float v = valueAt(it, r, i);
        if (t == DType::F32) static_cast<float*>(p)[i] = v;
        else if (t == DType::BF16) static_cast<std::uint16_t*>(p)[i] = testref::floatToBf16Rne(v);
        else static_cast<std::uint16_t*>(p)[i] = testref::floatToHalfRne(v);
    }
}

/// The rank-order reference sum of iteration `it` over `world` ranks: per
/// element, rank 0's value, plus rank 1's, ... in float, rounded once.
inline std::vector<std::uint8_t> referenceSum(std::size_t count, DType t, std::uint64_t it, std::uint32_t world) {
    const std::size_t esize = dtypeSize(t);
    std::vector<std::vector<std::uint8_t>> rows(world, std::vector<std::uint8_t>(count * esize));
    std::vector<std::uint32_t> order(world);
    for (std::uint32_t r = 0; r < world; ++r) fillValues(rows[r].data(), count, t, it, r), order[r] = r;
    const testref::Elem e = t == DType::F32 ? testref::Elem::F32 : t == DType::BF16 ? testref::Elem::BF16 : testref::Elem::F16;
    auto out = testref::sumRows(e, rows, count, order);
    out.reserve(16); // data() stays a real pointer for count 0 (callers memcmp against it; its arguments must not be null)
    return out;
}

} // namespace tpf::testing
