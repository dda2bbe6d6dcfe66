// Host references for the collective tests (GPU: tests/gpu/cases.hpp; host
// and GPU ranks: tests/integration/pattern.hpp): f16/bf16 conversions written
// out bit by bit (independent of cuda_fp16.h and of the library's
// client/reduce.cpp) and rank-order sums.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace tpf::testref {

inline float bitsToFloat(std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline std::uint32_t floatToBits(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

/// IEEE binary16 -> f32, exact (subnormals, infinities, NaN).
inline float halfToFloat(std::uint16_t h) {
    const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
    std::uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
    if (exp == 0x1f) return bitsToFloat(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0) return bitsToFloat(sign);
        int e = -1; // normalise the subnormal
        do {
            man <<= 1;
            ++e;
        } while ((man & 0x400u) == 0);
        return bitsToFloat(sign | (std::uint32_t(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13));
    }
    return bitsToFloat(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

/// f32 -> binary16, round to nearest even, overflow to infinity, subnormals.
inline std::uint16_t floatToHalfRne(float f) {
    const std::uint32_t u = floatToBits(f);
    const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
    const std::uint32_t absu = u & 0x7fffffffu;
    if (absu >= 0x7f800000u) return std::uint16_t(sign | (absu > 0x7f800000u ? 0x7e00u : 0x7c00u));
    const int exp = int(absu >> 23) - 127 + 15;
    std::uint32_t man = (absu & 0x7fffffu) | 0x800000u; // 24 significant bits
    if (exp >= 0x1f) return std::uint16_t(sign | 0x7c00u);
    int shift = 13;        // 24 -> 11 bits for a normal result
    std::uint32_t e16 = exp;
    if (exp <= 0) {        // subnormal result: shift further, exponent field 0
        shift = 14 - exp;
        e16 = 0;
        if (shift > 25) return sign; // below half the smallest subnormal
    }
    const std::uint32_t kept = man >> shift;
    const std::uint32_t rest = man & ((1u << shift) - 1);
    const std::uint32_t half = 1u << (shift - 1);
    std::uint32_t r = kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
    // kept carries the implicit bit for normals: compose exponent + mantissa, letting a carry roll into the exponent.
    std::uint32_t bits = exp <= 0 ? r : ((e16 << 10) + (r - 0x400u));
    if (bits >= 0x7c00u) bits = 0x7c00u;
    return std::uint16_t(sign | bits);
}

inline float bf16ToFloat(std::uint16_t b) { return bitsToFloat(std::uint32_t(b) << 16); }

/// f32 -> bfloat16, round to nearest even; a NaN stays a NaN (quiet bit set).
inline std::uint16_t floatToBf16Rne(float f) {
    const std::uint32_t u = floatToBits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40u);
    return std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

enum class Elem { F32, F16, BF16 };

inline float widen(Elem t, const std::uint8_t* p) {
    if (t == Elem::F32) {
        float f;
        std::memcpy(&f, p, 4);
        return f;
    }
    std::uint16_t h;
    std::memcpy(&h, p, 2);
    return t == Elem::F16 ? halfToFloat(h) : bf16ToFloat(h);
}

inline void narrow(Elem t, float f, std::uint8_t* p) {
    if (t == Elem::F32) {
        std::memcpy(p, &f, 4);
        return;
    }
    const std::uint16_t h = t == Elem::F16 ? floatToHalfRne(f) : floatToBf16Rne(f);
    std::memcpy(p, &h, 2);
}

/// Sum of rows in the given order (rank order 0..W-1 is the contract):
/// acc = float(x[order0]); acc = acc + float(x[r]) in f32; one final rounding.
/// `volatile` keeps the host compiler from reassociating or keeping excess precision.
inline std::vector<std::uint8_t> sumRows(Elem t, const std::vector<std::vector<std::uint8_t>>& rows, std::size_t count,
                                         const std::vector<std::uint32_t>& order) {
    const std::size_t es = t == Elem::F32 ? 4 : 2;
    std::vector<std::uint8_t> out(count * es);
    for (std::size_t i = 0; i < count; ++i) {
        volatile float acc = widen(t, rows[order[0]].data() + i * es);
        for (std::size_t k = 1; k < order.size(); ++k) acc = acc + widen(t, rows[order[k]].data() + i * es);
        narrow(t, acc, out.data() + i * es);
    }
    return out;
}

} // namespace tpf::testref
