#include "client/reduce.hpp"

#include <algorithm>
#include <cstring>

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
// One accumulation pass per row, the element conversion chosen outside the loop
// so each loop vectorises.
template <class Load>
void accumulate(float* acc, const std::uint16_t* x, std::size_t n, bool first, Load load) {
    if (first) for (std::size_t i = 0; i < n; ++i) acc[i] = load(x[i]);
    else for (std::size_t i = 0; i < n; ++i) acc[i] += load(x[i]);
}
} // namespace

void sumRowsInOrder(const void* const* rows, std::size_t nrows, void* out, std::size_t count, DType type) {
    constexpr std::size_t kChunk = 1024;
    float acc[kChunk];
    for (std::size_t base = 0; base < count; base += kChunk) {
        const std::size_t n = std::min(kChunk, count - base);
        for (std::size_t r = 0; r < nrows; ++r) {
            if (type == DType::F32) {
                const float* x = static_cast<const float*>(rows[r]) + base;
                if (r == 0) std::memcpy(acc, x, n * 4);
                else for (std::size_t i = 0; i < n; ++i) acc[i] += x[i];
            } else {
                const std::uint16_t* x = static_cast<const std::uint16_t*>(rows[r]) + base;
                if (type == DType::BF16) accumulate(acc, x, n, r == 0, bf16ToFloat);
                else accumulate(acc, x, n, r == 0, f16ToFloat);
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

} // namespace tpf
