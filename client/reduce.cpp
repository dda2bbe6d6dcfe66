#include "client/reduce.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#define TPF_REDUCE_AVX2 1
#else
#define TPF_REDUCE_AVX2 0
#endif

namespace tpf {

const char* version() { return TPF_VERSION_STRING; }

float bf16ToFloat(std::uint16_t v) {
    const std::uint32_t bits = std::uint32_t(v) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

std::uint16_t floatToBf16(float f) {
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((bits >> 16) | 0x40); // quiet NaN
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return std::uint16_t(bits >> 16);
}

// IEEE binary16 through GCC's _Float16 (correctly rounded conversions).
float f16ToFloat(std::uint16_t v) {
    _Float16 h;
    std::memcpy(&h, &v, 2);
    return float(h);
}

std::uint16_t floatToF16(float f) {
    const _Float16 h = static_cast<_Float16>(f);
    std::uint16_t v;
    std::memcpy(&v, &h, 2);
    return v;
}

namespace {

// first + second; when both are NaN, first's, quieted: what addss gives
// with `first` as its first operand. Spelled out because the compiler may
// swap a commutative add. Which operand is first is part of the contract
// (reduce.hpp): the accumulator for f32, the new row for f16/bf16.
float addNanFirst(float first, float second) {
    if (!std::isnan(first)) return first + second;
    std::uint32_t bits;
    std::memcpy(&bits, &first, 4);
    bits |= 0x00400000u;
    std::memcpy(&first, &bits, 4);
    return first;
}

void sumScalar(const void* const* rows, std::size_t nrows, void* out, std::size_t count, DType type) {
    constexpr std::size_t kChunk = 1024;
    float acc[kChunk];
    for (std::size_t base = 0; base < count; base += kChunk) {
        const std::size_t n = std::min(kChunk, count - base);
        for (std::size_t r = 0; r < nrows; ++r) {
            if (type == DType::F32) {
                const float* x = static_cast<const float*>(rows[r]) + base;
                if (r == 0) std::memcpy(acc, x, n * 4); // one row: the bits as they are
                else for (std::size_t i = 0; i < n; ++i) acc[i] = addNanFirst(acc[i], x[i]);
                continue;
            }
            const std::uint16_t* x = static_cast<const std::uint16_t*>(rows[r]) + base;
            for (std::size_t i = 0; i < n; ++i) {
                const float v = type == DType::BF16 ? bf16ToFloat(x[i]) : f16ToFloat(x[i]);
                acc[i] = r == 0 ? v : addNanFirst(v, acc[i]);
            }
        }
        if (type == DType::F32) {
            std::memcpy(static_cast<float*>(out) + base, acc, n * 4);
        } else {
            std::uint16_t* o = static_cast<std::uint16_t*>(out) + base;
            if (type == DType::BF16) for (std::size_t i = 0; i < n; ++i) o[i] = floatToBf16(acc[i]);
            else for (std::size_t i = 0; i < n; ++i) o[i] = floatToF16(acc[i]);
        }
    }
}

#if TPF_REDUCE_AVX2
#define TPF_AVX2 __attribute__((target("avx2,f16c")))

// acc + x as vaddps with the contract's first source (reduce.hpp): acc for
// f32, x for f16/bf16; on two NaNs x86 returns the first's, quieted.
// Written out so the compiler cannot commute the operands.
template <DType T> TPF_AVX2 inline __m256 add8(__m256 acc, __m256 x) {
    __m256 r;
    if constexpr (T == DType::F32) __asm__("vaddps %2, %1, %0" : "=x"(r) : "x"(acc), "xm"(x));
    else __asm__("vaddps %1, %2, %0" : "=x"(r) : "x"(acc), "x"(x));
    return r;
}

template <DType T> constexpr std::size_t kElemBytes = T == DType::F32 ? 4 : 2;

template <DType T> TPF_AVX2 inline __m256 load8(const std::uint8_t* p) {
    if constexpr (T == DType::F32) {
        return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
    } else {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        if constexpr (T == DType::F16) return _mm256_cvtph_ps(h);
        else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); // bf16: the top half of f32
    }
}

// floatToBf16 on 8 lanes, each result in the low half of its 32-bit lane:
// NaN -> its top half | 0x40, else + 0x7fff + lsb, top half.
TPF_AVX2 inline __m256i toBf16Lanes(__m256 a) {
    const __m256i bits = _mm256_castps_si256(a);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    const __m256i top = _mm256_srli_epi32(bits, 16);
    const __m256i lsb = _mm256_and_si256(top, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    return _mm256_blendv_epi8(rounded, _mm256_or_si256(top, _mm256_set1_epi32(0x40)), nan);
}

// Every lane <= 0xffff: the packs below never saturate.
TPF_AVX2 inline __m128i toBf16x8(__m256 a) {
    const __m256i v = toBf16Lanes(a);
    return _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

template <DType T> TPF_AVX2 inline void store8(std::uint8_t* p, __m256 a) {
    if constexpr (T == DType::F32) _mm256_storeu_ps(reinterpret_cast<float*>(p), a);
    else if constexpr (T == DType::F16) _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
    else _mm_storeu_si128(reinterpret_cast<__m128i*>(p), toBf16x8(a));
}

// 32 elements as four vectors of 8 lanes. bf16 in the order the unpacks
// give (elements 0-3 and 8-11 in the first of a pair, 4-7 and 12-15 in the
// second): one shuffle widens 8 of them, and the per-128-bit pack of the
// narrowing puts them back in order. The lanes' order matters only to the
// load and the store; the adds are element-wise. Four named members, not an
// array, so they stay in registers.
struct Lanes32 {
    __m256 a, b, c, d;
};

template <DType T> TPF_AVX2 inline Lanes32 load32(const std::uint8_t* p) {
    if constexpr (T == DType::BF16) {
        const __m256i zero = _mm256_setzero_si256();
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
        return {_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, lo)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, lo)),
                _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, hi)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, hi))};
    } else {
        constexpr std::size_t k8 = 8 * kElemBytes<T>;
        return {load8<T>(p), load8<T>(p + k8), load8<T>(p + 2 * k8), load8<T>(p + 3 * k8)};
    }
}

template <DType T> TPF_AVX2 inline void store32(std::uint8_t* p, const Lanes32& v) {
    if constexpr (T == DType::BF16) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_packus_epi32(toBf16Lanes(v.a), toBf16Lanes(v.b)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 32), _mm256_packus_epi32(toBf16Lanes(v.c), toBf16Lanes(v.d)));
    } else {
        constexpr std::size_t k8 = 8 * kElemBytes<T>;
        store8<T>(p, v.a);
        store8<T>(p + k8, v.b);
        store8<T>(p + 2 * k8, v.c);
        store8<T>(p + 3 * k8, v.d);
    }
}

// How far ahead of its loads each row is prefetched. A peer's row sits in
// another core's cache (host-direct) or came from the proxy: without it the
// adds and the bf16 rounding fill the out-of-order window, few of those
// misses are in flight at once, and a W = 2 4 KiB bf16 sum cost twice the
// gather of the same rows on the GPU machine's Xeon (docs/perf.md).
constexpr std::size_t kPrefetchAhead = 1024;

// Blocks of 32 elements (four independent accumulators, so the adds of one
// row overlap), then of 8, then a tail staged through a zeroed 8-lane buffer
// so every element takes the same instructions.
template <DType T> TPF_AVX2 void sumAvx2(const void* const* rows, std::size_t nrows, void* out, std::size_t count) {
    constexpr std::size_t kEs = kElemBytes<T>;
    const auto* const* in = reinterpret_cast<const std::uint8_t* const*>(rows);
    auto* o = static_cast<std::uint8_t*>(out);
    const std::size_t bytes = count * kEs;
    for (std::size_t r = 0; r < nrows; ++r)
        for (std::size_t b = 0; b < kPrefetchAhead && b < bytes; b += 64) _mm_prefetch(reinterpret_cast<const char*>(in[r] + b), _MM_HINT_T0);
    std::size_t i = 0;
    for (; i + 32 <= count; i += 32) {
        const std::size_t off = i * kEs;
        if (off + kPrefetchAhead < bytes)
            for (std::size_t r = 0; r < nrows; ++r)
                for (std::size_t b = 0; b < 32 * kEs; b += 64)
                    _mm_prefetch(reinterpret_cast<const char*>(in[r] + off + kPrefetchAhead + b), _MM_HINT_T0);
        Lanes32 acc = load32<T>(in[0] + off);
        for (std::size_t r = 1; r < nrows; ++r) {
            const Lanes32 x = load32<T>(in[r] + off);
            acc = {add8<T>(acc.a, x.a), add8<T>(acc.b, x.b), add8<T>(acc.c, x.c), add8<T>(acc.d, x.d)};
        }
        store32<T>(o + off, acc);
    }
    for (; i + 8 <= count; i += 8) {
        __m256 a = load8<T>(in[0] + i * kEs);
        for (std::size_t r = 1; r < nrows; ++r) a = add8<T>(a, load8<T>(in[r] + i * kEs));
        store8<T>(o + i * kEs, a);
    }
    if (i == count) return;
    const std::size_t tailBytes = (count - i) * kEs;
    alignas(32) std::uint8_t buf[8 * kEs] = {};
    std::memcpy(buf, in[0] + i * kEs, tailBytes);
    __m256 a = load8<T>(buf);
    for (std::size_t r = 1; r < nrows; ++r) {
        std::memcpy(buf, in[r] + i * kEs, tailBytes);
        a = add8<T>(a, load8<T>(buf));
    }
    store8<T>(buf, a);
    std::memcpy(o + i * kEs, buf, tailBytes);
}

bool cpuHasAvx2F16c() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}
#undef TPF_AVX2
#else
bool cpuHasAvx2F16c() { return false; }
#endif

} // namespace

bool reduceKernelAvailable(ReduceKernel kernel) {
    static const bool avx2 = cpuHasAvx2F16c();
    return kernel != ReduceKernel::Avx2F16c || avx2;
}

ReduceKernel autoReduceKernel() {
    return reduceKernelAvailable(ReduceKernel::Avx2F16c) ? ReduceKernel::Avx2F16c : ReduceKernel::Scalar;
}

const char* reduceKernelName(ReduceKernel kernel) {
    switch (kernel) {
    case ReduceKernel::Auto: return "auto";
    case ReduceKernel::Scalar: return "scalar";
    case ReduceKernel::Avx2F16c: return "avx2+f16c";
    }
    return "?";
}

void sumRowsInOrder(const void* const* rows, std::size_t nrows, void* out, std::size_t count, DType type, ReduceKernel kernel) {
    if (nrows == 0 || count == 0) return;
    if (kernel == ReduceKernel::Auto || !reduceKernelAvailable(kernel)) kernel = autoReduceKernel();
#if TPF_REDUCE_AVX2
    if (kernel == ReduceKernel::Avx2F16c) {
        if (type == DType::F32) sumAvx2<DType::F32>(rows, nrows, out, count);
        else if (type == DType::F16) sumAvx2<DType::F16>(rows, nrows, out, count);
        else sumAvx2<DType::BF16>(rows, nrows, out, count);
        return;
    }
#endif
    sumScalar(rows, nrows, out, count, type);
}

} // namespace tpf
