// Deterministic shards for integration tests and the GPU tests: every process
// can compute every rank's input of every iteration, so each checks the whole
// result by itself. The reference sum here is written independently of the
// library's (client/reduce.cpp): the element conversions by hand (bf16) or
// through the compiler's _Float16 (f16), the rank-order float accumulation
// element by element, rounded once at the end (docs/design.md: the sum is the
// float32 sum in rank order, rounded once to the element type).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

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

namespace ref {
inline float bf16ToFloat(std::uint16_t v) {
    const std::uint32_t bits = std::uint32_t(v) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}
/// Round to nearest, ties to even; a NaN stays a NaN (quiet bit set, payload's top bits kept).
inline std::uint16_t floatToBf16(float f) {
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    const std::uint32_t upper = bits >> 16, lower = bits & 0xffffu;
    if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x7fffffu) != 0) return std::uint16_t(upper | 0x40u);
    const bool roundUp = lower > 0x8000u || (lower == 0x8000u && (upper & 1u));
    return std::uint16_t(upper + (roundUp ? 1u : 0u));
}
inline float f16ToFloat(std::uint16_t v) {
    _Float16 h;
    std::memcpy(&h, &v, 2);
    return float(h);
}
inline std::uint16_t floatToF16(float f) {
    const _Float16 h = static_cast<_Float16>(f);
    std::uint16_t v;
    std::memcpy(&v, &h, 2);
    return v;
}
} // namespace ref

/// Elements whose magnitudes spread over 2^-10..2^9 with both signs, so a
/// different summation order changes the bits of the result.
inline float valueAt(std::uint64_t it, std::uint32_t r, std::size_t i) {
    const std::uint64_t h = mix(it * 1000003u + r * 7919u + i);
    const std::uint32_t exponent = std::uint32_t(127 - 10 + h % 19); // 2^-10 .. 2^9: 16 of them stay finite in f16
    const std::uint32_t bits = std::uint32_t((h >> 40) & 1) << 31 | exponent << 23 | std::uint32_t(h >> 8) & 0x7fffffu;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

inline void fillValues(void* p, std::size_t count, DType t, std::uint64_t it, std::uint32_t r) {
    for (std::size_t i = 0; i < count; ++i) {
        const float v = valueAt(it, r, i);
        if (t == DType::F32) static_cast<float*>(p)[i] = v;
        else if (t == DType::BF16) static_cast<std::uint16_t*>(p)[i] = ref::floatToBf16(v);
        else static_cast<std::uint16_t*>(p)[i] = ref::floatToF16(v);
    }
}

/// The rank-order reference sum of iteration `it` over `world` ranks: per
/// element, rank 0's value, plus rank 1's, ... in float, rounded once.
inline std::vector<std::uint8_t> referenceSum(std::size_t count, DType t, std::uint64_t it, std::uint32_t world) {
    const std::size_t esize = dtypeSize(t);
    std::vector<std::vector<std::uint8_t>> in(world, std::vector<std::uint8_t>(count * esize + 16));
    for (std::uint32_t r = 0; r < world; ++r) fillValues(in[r].data(), count, t, it, r);
    const auto load = [&](std::uint32_t r, std::size_t i) {
        if (t == DType::F32) {
            float f;
            std::memcpy(&f, in[r].data() + i * 4, 4);
            return f;
        }
        std::uint16_t h;
        std::memcpy(&h, in[r].data() + i * 2, 2);
        return t == DType::BF16 ? ref::bf16ToFloat(h) : ref::f16ToFloat(h);
    };
    // 16 bytes more, cut off below: data() stays a real pointer for count 0
    // (callers memcmp against it; memcmp's arguments must not be null).
    std::vector<std::uint8_t> out(count * esize + 16);
    for (std::size_t i = 0; i < count; ++i) {
        float acc = load(0, i);
        for (std::uint32_t r = 1; r < world; ++r) acc += load(r, i);
        if (t == DType::F32) {
            std::memcpy(out.data() + i * 4, &acc, 4);
        } else {
            const std::uint16_t h = t == DType::BF16 ? ref::floatToBf16(acc) : ref::floatToF16(acc);
            std::memcpy(out.data() + i * 2, &h, 2);
        }
    }
    out.resize(count * esize);
    return out;
}

} // namespace tpf::testing
