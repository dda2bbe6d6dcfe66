// Byte sizes as operators type them: "4096", "64KiB", "1MiB", "512K".
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include <tpfabric/error.hpp>

namespace tpf {

inline Result<std::uint64_t> parseByteSize(std::string_view s) {
    std::uint64_t v = 0;
    std::size_t i = 0;
    for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
        if (v > (UINT64_MAX - 9) / 10) return {Errc::OutOfRange, "size '" + std::string(s) + "' too large"};
        v = v * 10 + std::uint64_t(s[i] - '0');
    }
    if (i == 0) return {Errc::ConfigError, "size '" + std::string(s) + "' does not start with a number"};
    const std::string_view unit = s.substr(i);
    if (!unit.empty() && (unit[0] == '.' || unit[0] == ','))
        return {Errc::ConfigError, "size '" + std::string(s) + "': a whole number of bytes or units (1536, 2KiB; no fractions)"};
    std::uint64_t mul = 0;
    if (unit.empty() || unit == "B") mul = 1;
    else if (unit == "K" || unit == "KiB") mul = 1ull << 10;
    else if (unit == "M" || unit == "MiB") mul = 1ull << 20;
    else if (unit == "G" || unit == "GiB") mul = 1ull << 30;
    else return {Errc::ConfigError, "size '" + std::string(s) + "': unit must be B, KiB, MiB or GiB"};
    if (v > UINT64_MAX / mul) return {Errc::OutOfRange, "size '" + std::string(s) + "' too large"};
    return v * mul;
}

inline std::string formatByteSize(std::uint64_t v) {
    char buf[32];
    if (v >= (1ull << 30) && v % (1ull << 30) == 0) std::snprintf(buf, sizeof buf, "%lluGiB", (unsigned long long)(v >> 30));
    else if (v >= (1ull << 20) && v % (1ull << 20) == 0) std::snprintf(buf, sizeof buf, "%lluMiB", (unsigned long long)(v >> 20));
    else if (v >= 1024 && v % 1024 == 0) std::snprintf(buf, sizeof buf, "%lluKiB", (unsigned long long)(v >> 10));
    else std::snprintf(buf, sizeof buf, "%lluB", (unsigned long long)v);
    return buf;
}

} // namespace tpf
