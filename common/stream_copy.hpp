// Copies into host memory that a GPU reads next over PCIe: non-temporal
// stores for whole 64-byte lines, so the copy neither reads the destination
// lines first nor leaves them dirty in this core's cache for the GPU's reads
// to snoop. On the proxy route (one H200, docs/perf.md) that is 6 to
// 17 % faster from 128 KiB a stripe, 1 to 2 us slower at 4..64 KiB, hence
// the threshold. Not for a CPU reader (it would then read from memory
// instead of another core's cache). Non-temporal stores are weakly ordered:
// call streamFence() before the release store that publishes the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tpf {

/// Copies at or above this many bytes stream; below it memcpy.
inline constexpr std::size_t kStreamCopyMin = 128 * 1024;

/// Non-temporal stores for the whole 64-byte lines of n bytes, memcpy for
/// the tail; memcpy alone where dst is not 16-byte aligned or the CPU is not
/// x86-64. For parts of one large copy (daemon/proxy/carry.hpp), whatever
/// their size.
inline void streamLines(void* dst, const void* src, std::size_t n) {
#if defined(__x86_64__)
    auto* d = static_cast<std::uint8_t*>(dst);
    const auto* s = static_cast<const std::uint8_t*>(src);
    if (reinterpret_cast<std::uintptr_t>(d) % 16 == 0) {
        const std::size_t body = n & ~std::size_t(63);
        for (std::size_t i = 0; i < body; i += 64) {
            const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
            const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
            const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
            const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
            _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
            _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
            _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
            _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
        }
        std::memcpy(d + body, s + body, n - body);
        return;
    }
#endif
    std::memcpy(dst, src, n);
}

/// streamLines from kStreamCopyMin bytes on, memcpy below.
inline void streamCopy(void* dst, const void* src, std::size_t n) {
    if (n >= kStreamCopyMin) return streamLines(dst, src, n);
    std::memcpy(dst, src, n);
}

/// Asks the CPU to move the lines of [p, p + n) from this core's caches to
/// the shared last-level cache (x86 CLDEMOTE), so a GPU's PCIe read of them
/// finds them there instead of waiting on a snoop of this core. A hint: it
/// changes no data, and CPUs without CLDEMOTE run its encoding as a NOP;
/// nothing on other CPUs. It costs the calling thread: on the proxy's path
/// of a 4 KiB row it delayed the flag (issued before it) or the next carry
/// (after it) by 0.3-1.3 us (docs/perf.md), so call it off the
/// latency path (daemon/proxy: idle passes).
inline void demoteLines(const void* p, std::size_t n) {
#if defined(__x86_64__)
    const auto begin = reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t(63);
    const auto end = reinterpret_cast<std::uintptr_t>(p) + n;
    for (std::uintptr_t a = begin; a < end; a += 64)
        asm volatile("cldemote %0" ::"m"(*reinterpret_cast<const volatile char*>(a)));
#else
    (void)p, (void)n;
#endif
}

/// Orders every streamCopy store before the stores after it.
inline void streamFence() {
#if defined(__x86_64__)
    _mm_sfence();
#endif
}

} // namespace tpf
