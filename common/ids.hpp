// The 128-bit ids of groups (rank 0 draws one) and nodes (each daemon derives
// its own), typed apart so that one cannot be passed where the other belongs.
// On the wire both are 16 raw bytes (proto/client_msg.hpp, proto/peer_msg.hpp).
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/hex.hpp"

namespace tpf {

template <class Tag>
struct Id128 {
    std::array<std::uint8_t, 16> bytes{};

    /// The id carried in a wire record's 16-byte field.
    static Id128 of(const std::uint8_t (&wire)[16]) {
        Id128 id;
        std::memcpy(id.bytes.data(), wire, 16);
        return id;
    }
    /// Write the id into a wire record's 16-byte field.
    void copyTo(std::uint8_t (&wire)[16]) const { std::memcpy(wire, bytes.data(), 16); }
    /// Whether a wire record's field holds this id.
    bool is(const std::uint8_t (&wire)[16]) const { return std::memcmp(wire, bytes.data(), 16) == 0; }

    const std::uint8_t* data() const { return bytes.data(); }
    std::uint8_t* data() { return bytes.data(); }
    static constexpr std::size_t size() { return 16; }

    /// All 32 hex digits (status, the daemon's start-up line).
    std::string hex() const { return hexText(bytes.data(), 16); }
    /// The first 6 bytes in hex: how log lines name a group or a node.
    std::string shortHex() const { return hexText(bytes.data(), 6); }

    auto operator<=>(const Id128&) const = default;
};

using GroupId = Id128<struct GroupIdTag>;
using NodeId = Id128<struct NodeIdTag>;

} // namespace tpf
