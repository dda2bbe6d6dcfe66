// The proxy's side of a shard staged as LL lines in a rank's ring
// (kDoorbellLines, proto/ring.hpp): check each line's flags and unpack its
// data into the rank's slot.
#pragma once

#include <atomic>
#include <cstdint>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "proto/ring.hpp"

namespace tpf::daemon {

/// Unpacks the lines of a `bytes`-byte shard (a multiple of 16) from `lines`
/// into `out`, starting at byte `from` (a multiple of 16) and stopping at the
/// first 16 bytes whose two lines do not both carry `flag` in each half.
/// Returns how far the shard is unpacked (`bytes` once whole). Each 16-byte
/// line is read with one aligned 16-byte load (single-copy atomic on x86-64
/// CPUs with AVX; every 8-byte half is, everywhere), and a chunk is taken
/// only from lines read whole, so a line still being written is never
/// half-taken.
inline std::uint64_t unpackStagedLines(const std::uint8_t* lines, std::uint8_t* out, std::uint64_t bytes,
                                       std::uint32_t flag, std::uint64_t from) {
    std::uint64_t c = from / 16;
    const std::uint64_t n = bytes / 16;
#if defined(__x86_64__)
    const __m128i f = _mm_set1_epi32(int(flag));
    for (; c < n; ++c) {
        const __m128i a = *reinterpret_cast<const volatile __m128i*>(lines + c * 16);
        const __m128i b = *reinterpret_cast<const volatile __m128i*>(lines + (n + c) * 16);
        // Lanes 1 and 3 of both lines are the flag: movemask bits 1 and 3.
        const int ma = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(a, f)));
        const int mb = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(b, f)));
        if ((ma & mb & 0xa) != 0xa) break;
        const __m128 data = _mm_shuffle_ps(_mm_castsi128_ps(a), _mm_castsi128_ps(b), _MM_SHUFFLE(2, 0, 2, 0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c * 16), _mm_castps_si128(data));
    }
#else
    for (; c < n; ++c) {
        auto* low = reinterpret_cast<std::uint64_t*>(const_cast<std::uint8_t*>(lines + c * 16));
        auto* high = reinterpret_cast<std::uint64_t*>(const_cast<std::uint8_t*>(lines + (n + c) * 16));
        std::uint64_t h[4];
        bool whole = true;
        for (int k = 0; k < 4; ++k) {
            h[k] = std::atomic_ref(k < 2 ? low[k] : high[k - 2]).load(std::memory_order_relaxed);
            whole = whole && std::uint32_t(h[k] >> 32) == flag;
        }
        if (!whole) break;
        auto* o = reinterpret_cast<std::uint32_t*>(out + c * 16);
        for (int k = 0; k < 4; ++k) o[k] = std::uint32_t(h[k]);
    }
#endif
    return c * 16;
}

} // namespace tpf::daemon
