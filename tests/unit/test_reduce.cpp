// The host reduction (client/reduce.cpp) against a rank-order reference
// written here from the IEEE rules, not from the library's code: every
// kernel this CPU runs, every 16-bit pattern of f16 and bf16 against partners
// of every class, random f32/f16/bf16 rows of W = 1..16 with tails, offsets
// off any alignment, and the output in place. Bit-exact.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "catch.hpp"
#include "client/reduce.hpp"

using namespace tpf;

namespace {

// ---- the reference -------------------------------------------------------

std::uint32_t bitsOf(float f) {
    std::uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}

float fromBits(std::uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

bool isNan(std::uint32_t b) { return (b & 0x7fffffffu) > 0x7f800000u; }

float widenBf16(std::uint16_t h) { return fromBits(std::uint32_t(h) << 16); }

// Exact: every binary16 is a binary32; a NaN keeps its payload (and its
// signalling bit: the add or the narrowing quiets it).
float widenF16(std::uint16_t h) {
    const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return fromBits(sign | 0x7f800000u | man << 13);
    if (exp == 0) {
        const float mag = std::ldexp(float(man), -24); // subnormal: man x 2^-24, exact
        return sign ? -mag : mag;
    }
    return fromBits(sign | (exp + 112) << 23 | man << 13);
}

// IEEE addition, x86 NaN rules: the first NaN operand, quieted; inf - inf is
// the default NaN. The contract names the first operand: the accumulator
// for f32, the new row for f16/bf16 (reduce.hpp). Rounded once: a double holds a + b of two floats well
// enough that rounding it to float is the correctly rounded sum (53 >= 2 x 24 + 2).
float add(float a, float b) {
    if (isNan(bitsOf(a))) return fromBits(bitsOf(a) | 0x00400000u);
    if (isNan(bitsOf(b))) return fromBits(bitsOf(b) | 0x00400000u);
    if (std::isinf(a) && std::isinf(b) && std::signbit(a) != std::signbit(b)) return fromBits(0xffc00000u);
    return float(double(a) + double(b));
}

std::uint16_t narrowBf16(float f) {
    const std::uint32_t b = bitsOf(f);
    if (isNan(b)) return std::uint16_t((b >> 16) | 0x40u);
    std::uint32_t upper = b >> 16;
    const std::uint32_t rest = b & 0xffffu;
    if (rest > 0x8000u || (rest == 0x8000u && (upper & 1u))) ++upper; // a carry walks into the exponent, up to inf
    return std::uint16_t(upper);
}

// Round to nearest even from the significand and exponent, by integer shifts.
std::uint16_t narrowF16(float f) {
    const std::uint32_t b = bitsOf(f);
    const std::uint16_t sign = std::uint16_t((b >> 16) & 0x8000u);
    const std::uint32_t expField = (b >> 23) & 0xffu, frac = b & 0x7fffffu;
    if (expField == 0xff) return frac ? std::uint16_t(sign | 0x7e00u | (frac >> 13)) : std::uint16_t(sign | 0x7c00u);
    if (expField == 0) return sign; // f32 subnormals are far below half the least f16 subnormal
    const int e = int(expField) - 127;
    const std::uint32_t m = frac | 0x800000u; // value = m x 2^(e - 23)
    const int quantum = std::max(e, -14) - 10;  // f16 spacing at this exponent: 2^quantum
    const int shift = quantum - (e - 23);       // >= 13
    if (shift > 25) return sign;
    std::uint32_t n = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (n & 1u))) ++n;
    if (e < -14) return std::uint16_t(sign | n); // subnormal; n == 1024 is the least normal
    int field = e + 15;
    if (n == 2048) {
        n = 1024;
        ++field;
    }
    if (field >= 31) return std::uint16_t(sign | 0x7c00u);
    return std::uint16_t(sign | std::uint32_t(field) << 10 | (n - 1024));
}

// out[i] from the rows' raw elements, rank 0 first.
std::uint32_t reference(const std::vector<const std::uint8_t*>& rows, std::size_t i, DType t) {
    if (t == DType::F32) {
        std::uint32_t x0;
        std::memcpy(&x0, rows[0] + 4 * i, 4);
        float acc = fromBits(x0);
        for (std::size_t r = 1; r < rows.size(); ++r) {
            std::uint32_t x;
            std::memcpy(&x, rows[r] + 4 * i, 4);
            acc = add(acc, fromBits(x));
        }
        return rows.size() == 1 ? x0 : bitsOf(acc);
    }
    auto widen = [t](std::uint16_t h) { return t == DType::F16 ? widenF16(h) : widenBf16(h); };
    float acc = 0;
    for (std::size_t r = 0; r < rows.size(); ++r) {
        std::uint16_t x;
        std::memcpy(&x, rows[r] + 2 * i, 2);
        acc = r == 0 ? widen(x) : add(widen(x), acc);
    }
    return t == DType::F16 ? narrowF16(acc) : narrowBf16(acc);
}

// ---- driving the library ---------------------------------------------------

std::vector<ReduceKernel> kernels() {
    static const std::vector<ReduceKernel> k = [] {
        std::vector<ReduceKernel> v{ReduceKernel::Auto, ReduceKernel::Scalar};
        if (reduceKernelAvailable(ReduceKernel::Avx2F16c)) v.push_back(ReduceKernel::Avx2F16c);
        else std::fprintf(stderr, "test_reduce: this CPU lacks AVX2/F16C; only the scalar kernel is tested\n");
        return v;
    }();
    return k;
}

const char* typeName(DType t) { return t == DType::F32 ? "f32" : t == DType::F16 ? "f16" : "bf16"; }

std::string hex(std::uint32_t v) {
    char b[16];
    std::snprintf(b, sizeof b, "0x%08x", v);
    return b;
}

// Runs `kernel` over `rows` into `out` and compares every element with the
// reference; the first wrong one fails the test with its operands.
void check(const std::vector<const std::uint8_t*>& rows, std::uint8_t* out, std::size_t count, DType t, ReduceKernel kernel,
           const std::string& what) {
    const std::size_t es = dtypeSize(t);
    // The reference first: `out` may be one of the rows.
    std::vector<std::uint32_t> want(count);
    for (std::size_t i = 0; i < count; ++i) want[i] = reference(rows, i, t);
    sumRowsInOrder(reinterpret_cast<const void* const*>(rows.data()), rows.size(), out, count, t, kernel);
    for (std::size_t i = 0; i < count; ++i) {
        std::uint32_t got = 0;
        std::memcpy(&got, out + es * i, es);
        if (got == want[i]) continue;
        std::string ops;
        for (const auto* r : rows) {
            std::uint32_t x = 0;
            std::memcpy(&x, r + es * i, es);
            ops += " " + hex(x);
        }
        FAIL(what << ": " << typeName(t) << " kernel " << reduceKernelName(kernel) << " W=" << rows.size() << " count=" << count
                  << " element " << i << ": got " << hex(got) << ", want " << hex(want[i]) << "; rows" << ops);
    }
    SUCCEED();
}

// Values of every class for random rows: specials, subnormals, near-equal
// values of opposite sign (cancellation), and any bits at all.
std::uint32_t randomF32(std::mt19937_64& rng) {
    static const std::uint32_t special[] = {0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007fffff, 0x807fffff,
                                            0x00800000, 0x3f800000, 0xbf800000, 0x7f7fffff, 0xff7fffff, 0x7f800000,
                                            0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001, 0x7fa5a5a5, 0xffffffff,
                                            0x4b800000, 0x33800000, 0x3f800001, 0xbf7fffff};
    switch (rng() % 6) {
    case 0: return special[rng() % (sizeof special / sizeof special[0])];
    case 1: return std::uint32_t(rng()) & 0x807fffffu;                                 // subnormal or zero
    case 2: return 0x3f800000u + (std::uint32_t(rng()) & 0xffu) + (rng() & 1 ? 0x80000000u : 0); // about +-1: cancels
    case 3: return (std::uint32_t(rng()) & 0x80ffffffu) | 0x7f000000u;                // huge: overflows
    default: return std::uint32_t(rng());
    }
}

std::uint16_t random16(std::mt19937_64& rng, DType t) {
    static const std::uint16_t f16[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x3c00, 0xbc00, 0x7bff, 0xfbff,
                                        0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0x7fff, 0x6400, 0xe400, 0x1400};
    static const std::uint16_t bf16[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x0080, 0x3f80, 0xbf80, 0x7f7f, 0xff7f,
                                         0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0x7fff, 0x4b80, 0xcb80, 0x3380};
    const bool isF16 = t == DType::F16;
    switch (rng() % 5) {
    case 0: return isF16 ? f16[rng() % 19] : bf16[rng() % 19];
    case 1: return std::uint16_t(rng() & (isF16 ? 0x83ffu : 0x807fu));               // subnormal or zero
    case 2: return std::uint16_t((isF16 ? 0x3c00u : 0x3f80u) + (rng() & 0x1f) + (rng() & 1 ? 0x8000u : 0)); // about +-1
    default: return std::uint16_t(rng());
    }
}

// Partners of every 16-bit pattern: zeros, subnormals, normals, the largest
// finite, infinities, quiet and signalling NaNs with payloads.
const std::vector<std::uint16_t> kF16Partners = {0x0000, 0x8000, 0x0001, 0x8001, 0x0200, 0x03ff, 0x83ff, 0x0400, 0x8400,
                                                 0x3c00, 0xbc00, 0x3c01, 0x3800, 0x3555, 0xc000, 0x5bff, 0x6400, 0xe400,
                                                 0x7bff, 0xfbff, 0x7bfe, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0x7d55,
                                                 0xfc01, 0x7fff, 0xffff};
const std::vector<std::uint16_t> kBf16Partners = {0x0000, 0x8000, 0x0001, 0x8001, 0x0040, 0x007f, 0x807f, 0x0080, 0x8080,
                                                  0x3f80, 0xbf80, 0x3f81, 0x3f00, 0x3eab, 0xc000, 0x4b80, 0xcb80, 0x7f00,
                                                  0x7f7f, 0xff7f, 0x7f7e, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0x7fa5,
                                                  0xff81, 0x7fff, 0xffff};

} // namespace

TEST_CASE("the reference's own conversions hold at known points", "[reduce]") {
    CHECK(bitsOf(widenF16(0x0001)) == 0x33800000u);   // 2^-24
    CHECK(bitsOf(widenF16(0x3c00)) == 0x3f800000u);
    CHECK(bitsOf(widenF16(0xfbff)) == 0xc77fe000u);   // -65504
    CHECK(narrowF16(fromBits(0x477fefffu)) == 0x7bff); // just under 65520: the largest finite
    CHECK(narrowF16(fromBits(0x477ff000u)) == 0x7c00); // 65520 ties up to inf
    CHECK(narrowF16(fromBits(0x33000000u)) == 0x0000); // 2^-25 ties to even (zero)
    CHECK(narrowF16(fromBits(0x33000001u)) == 0x0001);
    CHECK(narrowF16(fromBits(0x387fc000u)) == 0x03ff); // 1023 subnormal steps, exact
    CHECK(narrowF16(fromBits(0x387fe000u)) == 0x0400); // 1023.5 ties up to the least normal
    CHECK(narrowBf16(fromBits(0x3f808000u)) == 0x3f80); // tie, even stays
    CHECK(narrowBf16(fromBits(0x3f818000u)) == 0x3f82); // tie, odd rounds up
    CHECK(narrowBf16(fromBits(0x7f7fffffu)) == 0x7f80);
    CHECK(bitsOf(add(fromBits(0x7f800000u), fromBits(0xff800000u))) == 0xffc00000u);
    CHECK(bitsOf(add(fromBits(0x7fa00001u), fromBits(0x7fc00002u))) == 0x7fe00001u);
}

TEST_CASE("every f16 and bf16 pattern against partners of every class, both orders", "[reduce]") {
    constexpr std::size_t kAll = 65536;
    std::vector<std::uint16_t> every(kAll), partner(kAll), out(kAll);
    for (std::size_t i = 0; i < kAll; ++i) every[i] = std::uint16_t(i);
    for (const DType t : {DType::F16, DType::BF16}) {
        const auto& fixed = t == DType::F16 ? kF16Partners : kBf16Partners;
        // Per-element partners too: the negation (exact cancellation to +0),
        // the negation one ulp off (a tiny or subnormal difference), itself
        // (doubling: overflow), the pattern one above.
        std::vector<std::vector<std::uint16_t>> partners;
        for (std::uint16_t p : fixed) partners.emplace_back(kAll, p);
        for (int kind = 0; kind < 4; ++kind) {
            std::vector<std::uint16_t> p(kAll);
            for (std::size_t i = 0; i < kAll; ++i)
                p[i] = std::uint16_t(kind == 0 ? i ^ 0x8000u : kind == 1 ? (i ^ 0x8000u) ^ 1u : kind == 2 ? i : i + 1);
            partners.push_back(std::move(p));
        }
        for (const ReduceKernel k : kernels()) {
            const auto* e = reinterpret_cast<const std::uint8_t*>(every.data());
            check({e}, reinterpret_cast<std::uint8_t*>(out.data()), kAll, t, k, "W=1, every pattern");
            for (const auto& p : partners) {
                const auto* q = reinterpret_cast<const std::uint8_t*>(p.data());
                check({e, q}, reinterpret_cast<std::uint8_t*>(out.data()), kAll, t, k, "every pattern + partner");
                check({q, e}, reinterpret_cast<std::uint8_t*>(out.data()), kAll, t, k, "partner + every pattern");
                check({e, q, q}, reinterpret_cast<std::uint8_t*>(out.data()), kAll, t, k, "every pattern + partner + partner");
            }
            // Three terms that cancel only in f32: x + 1 - 1 (one rounding at the end).
            std::vector<std::uint16_t> one(kAll, t == DType::F16 ? 0x3c00 : 0x3f80), minusOne(kAll, t == DType::F16 ? 0xbc00 : 0xbf80);
            check({e, reinterpret_cast<const std::uint8_t*>(one.data()), reinterpret_cast<const std::uint8_t*>(minusOne.data())},
                  reinterpret_cast<std::uint8_t*>(out.data()), kAll, t, k, "x + 1 - 1");
        }
    }
}

TEST_CASE("random rows of every type, W = 1..16, tails, unaligned, in place", "[reduce]") {
    std::mt19937_64 rng(20261201);
    constexpr std::size_t kMaxCount = 700, kSlack = 16; // elements; rows start up to 15 elements off a 64-byte line
    for (const DType t : {DType::F32, DType::F16, DType::BF16}) {
        const std::size_t es = dtypeSize(t);
        for (std::uint32_t w = 1; w <= 16; ++w) {
            for (int round = 0; round < 24; ++round) {
                const std::size_t count = round < 12 ? std::size_t(round) * 5 + rng() % 5 : rng() % kMaxCount;
                alignas(64) static std::uint8_t store[17][(kMaxCount + kSlack) * 4];
                std::vector<const std::uint8_t*> rows;
                for (std::uint32_t r = 0; r < w; ++r) {
                    std::uint8_t* row = store[r] + es * (rng() % kSlack);
                    for (std::size_t i = 0; i < count; ++i) {
                        if (t == DType::F32) {
                            const std::uint32_t v = randomF32(rng);
                            std::memcpy(row + 4 * i, &v, 4);
                        } else {
                            const std::uint16_t v = random16(rng, t);
                            std::memcpy(row + 2 * i, &v, 2);
                        }
                    }
                    rows.push_back(row);
                }
                std::uint8_t* out = store[16] + es * (rng() % kSlack);
                const std::vector<ReduceKernel> ks = kernels();
                const ReduceKernel k = ks[std::size_t(round) % ks.size()];
                check(rows, out, count, t, k, "random");
                // In place: the output is one of the rows (the host path's own slot may be).
                const std::vector<std::uint8_t> saved(rows[w - 1], rows[w - 1] + es * count);
                check(rows, const_cast<std::uint8_t*>(rows[w - 1]), count, t, k, "random, in place");
                if (!saved.empty()) std::memcpy(const_cast<std::uint8_t*>(rows[w - 1]), saved.data(), saved.size());
            }
        }
    }
}

TEST_CASE("every kernel gives the same bits on long rows", "[reduce]") {
    // Lengths around the 32- and 8-element blocks and the scalar path's chunk.
    std::mt19937_64 rng(7);
    for (const DType t : {DType::F32, DType::F16, DType::BF16}) {
        for (const std::size_t count : {31, 32, 33, 1023, 1024, 1025, 2048 + 7, 4096 + 31}) {
            const std::size_t es = dtypeSize(t);
            std::vector<std::vector<std::uint8_t>> data(4, std::vector<std::uint8_t>(count * es));
            std::vector<const std::uint8_t*> rows;
            for (auto& d : data) {
                for (std::size_t i = 0; i < count; ++i) {
                    if (t == DType::F32) {
                        const std::uint32_t v = randomF32(rng);
                        std::memcpy(d.data() + 4 * i, &v, 4);
                    } else {
                        const std::uint16_t v = random16(rng, t);
                        std::memcpy(d.data() + 2 * i, &v, 2);
                    }
                }
                rows.push_back(d.data());
            }
            std::vector<std::uint8_t> out(count * es);
            for (const ReduceKernel k : kernels()) check(rows, out.data(), count, t, k, "long rows");
        }
    }
}

TEST_CASE("nrows == 0 or count == 0 writes nothing", "[reduce]") {
    std::uint32_t out[4] = {1, 2, 3, 4};
    const std::uint32_t in[4] = {};
    const void* rows[1] = {in};
    for (const ReduceKernel k : kernels()) {
        sumRowsInOrder(rows, 0, out, 4, DType::F32, k);
        sumRowsInOrder(rows, 1, out, 0, DType::BF16, k);
        CHECK(out[0] == 1);
        CHECK(out[3] == 4);
    }
}
