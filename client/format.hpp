// format("rank {} opens with world {}", r, w): how client code builds a
// message from parts, each "{}" replaced by the next argument (a string or an
// integer, as std::to_string writes it). The count of "{}" is checked against
// the arguments at compile time. Local because std::format is not in GCC 12
// and Debian's fmt is a shared library only: linking it would add a run-time
// dependency and a Requires.private to the installed libtpfabric.
#pragma once

#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

namespace tpf {

namespace format_detail {

inline void append(std::string& out, std::string_view s) { out += s; }
template <std::integral T>
    requires(!std::same_as<T, bool> && !std::same_as<T, char>)
void append(std::string& out, T v) {
    out += std::to_string(v);
}

constexpr std::size_t holes(std::string_view text) {
    std::size_t n = 0;
    for (std::size_t at = text.find("{}"); at != std::string_view::npos; at = text.find("{}", at + 2)) ++n;
    return n;
}

inline void holesDoNotMatchArguments() {} // not constexpr: calling it in a constant expression fails the build

} // namespace format_detail

/// A format string of exactly sizeof...(A) "{}".
template <class... A>
struct FormatString {
    std::string_view text;
    template <std::size_t N>
    consteval FormatString(const char (&s)[N]) : text(s, N - 1) {
        if (format_detail::holes(text) != sizeof...(A)) format_detail::holesDoNotMatchArguments();
    }
};

template <class... A>
std::string format(FormatString<std::type_identity_t<A>...> f, const A&... args) {
    std::string out;
    std::size_t at = 0;
    [[maybe_unused]] const auto one = [&](const auto& arg) {
        const std::size_t hole = f.text.find("{}", at);
        out.append(f.text, at, hole - at);
        format_detail::append(out, arg);
        at = hole + 2;
    };
    (one(args), ...);
    out.append(f.text, at);
    return out;
}

} // namespace tpf
