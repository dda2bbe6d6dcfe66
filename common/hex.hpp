// Hex text of raw bytes: the one formatter of ids, GIDs and keys in logs,
// status and tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tpf {

/// Lower-case hex of `n` bytes, two digits a byte, no separators.
inline std::string hexText(const std::uint8_t* bytes, std::size_t n) {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string s;
    s.reserve(2 * n);
    for (std::size_t i = 0; i < n; ++i) {
        s += kDigits[bytes[i] >> 4];
        s += kDigits[bytes[i] & 15];
    }
    return s;
}

} // namespace tpf
