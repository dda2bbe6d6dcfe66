// Byte-image helpers for golden tests: a record layout change must show up as
// a visible change of these strings (and a bump of the magic's revision byte).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

inline std::string hexOf(const std::vector<std::uint8_t>& b) {
    static const char* d = "0123456789abcdef";
    std::string s;
    for (std::size_t i = 0; i < b.size(); ++i) {
        s += d[b[i] >> 4];
        s += d[b[i] & 15];
    }
    return s;
}

/// Deterministic filler so every byte of a record is visible in its image.
template <std::size_t N>
inline void fill(std::uint8_t (&a)[N], std::uint8_t start) {
    for (std::size_t i = 0; i < N; ++i) a[i] = std::uint8_t(start + i);
}

#include <cstdio>
#include <cstdlib>

/// Hex of `bytes`; with TPF_PRINT_GOLDEN=1 in the environment, also printed as
/// C string lines of 32 bytes, for updating an image after a deliberate change.
inline std::string golden(const std::vector<std::uint8_t>& bytes, const char* name) {
    std::string h = hexOf(bytes);
    if (std::getenv("TPF_PRINT_GOLDEN")) {
        std::printf("%s:\n", name);
        for (std::size_t i = 0; i < h.size(); i += 64) std::printf("          \"%s\"\n", h.substr(i, 64).c_str());
    }
    return h;
}
