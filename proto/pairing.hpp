// tpfabric — HCA pairing between two nodes: one to one, by subnet.
//
// Rails are subnets: HCA i of node A talks to the HCA of node B that sits in
// the same IP subnet. Any shape other than a bijection of subnets is refused
// with NonOneToOnePairing (then that group goes to NCCL): two HCAs of one
// node in one subnet, a subnet on one side only, unequal counts.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <tpfabric/error.hpp>
#include "proto/layout.hpp"

namespace tpf {

/// What pairing needs to know of one HCA port.
struct HcaAddress {
    std::array<std::uint8_t, 16> gid{};    ///< RoCE v2 GID (IPv4-mapped for IPv4)
    std::array<std::uint8_t, 16> subnet{}; ///< address with host bits cleared (IPv4-mapped for IPv4)
    std::uint8_t prefixLen = 0;            ///< subnet prefix length in bits of the 128-bit form
};

/// One rail: index of the HCA on the local side and on the remote side. The
/// rail's stripe number is its position in the pairing, which is sorted by
/// subnet so both nodes number the rails identically.
struct HcaPair {
    std::uint32_t local;
    std::uint32_t remote;
};

inline bool sameSubnet(const HcaAddress& a, const HcaAddress& b) {
    return a.prefixLen == b.prefixLen && a.subnet == b.subnet;
}

inline std::string subnetText(const HcaAddress& a) {
    // Printed as IPv4 when IPv4-mapped (::ffff:a.b.c.d), else as hex groups.
    const auto& s = a.subnet;
    bool v4 = std::all_of(s.begin(), s.begin() + 10, [](std::uint8_t b) { return b == 0; }) &&
              s[10] == 0xff && s[11] == 0xff;
    std::string out;
    if (v4) {
        for (int i = 12; i < 16; ++i) out += std::to_string(s[i]) + (i < 15 ? "." : "");
        out += "/" + std::to_string(a.prefixLen >= 96 ? a.prefixLen - 96 : 0);
        return out;
    }
    static const char* hex = "0123456789abcdef";
    for (int i = 0; i < 16; ++i) {
        out += hex[s[i] >> 4];
        out += hex[s[i] & 15];
        if (i % 2 == 1 && i < 15) out += ':';
    }
    return out + "/" + std::to_string(a.prefixLen);
}

/// Pair two nodes' HCA lists one to one by subnet. The result is ordered by
/// subnet (bytes, then prefix), so stripe k is the same rail on both nodes
/// whatever order each lists its HCAs in.
inline Result<std::vector<HcaPair>> pairHcas(std::span<const HcaAddress> local,
                                             std::span<const HcaAddress> remote) {
    auto dupIn = [](std::span<const HcaAddress> side) -> int {
        for (std::size_t i = 0; i < side.size(); ++i)
            for (std::size_t j = i + 1; j < side.size(); ++j)
                if (sameSubnet(side[i], side[j])) return int(i);
        return -1;
    };
    if (local.empty() || remote.empty())
        return {Errc::NonOneToOnePairing, "a node has no HCA (local " + std::to_string(local.size()) +
                                              ", remote " + std::to_string(remote.size()) + ")"};
    if (local.size() > kMaxStripes || remote.size() > kMaxStripes)
        return {Errc::NonOneToOnePairing, "more than 8 HCAs on a node"};
    if (int i = dupIn(local); i >= 0)
        return {Errc::NonOneToOnePairing, "two local HCAs in subnet " + subnetText(local[i])};
    if (int i = dupIn(remote); i >= 0)
        return {Errc::NonOneToOnePairing, "two remote HCAs in subnet " + subnetText(remote[i])};
    if (local.size() != remote.size())
        return {Errc::NonOneToOnePairing, "unequal HCA counts: local " + std::to_string(local.size()) +
                                              ", remote " + std::to_string(remote.size())};
    std::vector<HcaPair> pairs;
    for (std::uint32_t i = 0; i < local.size(); ++i) {
        auto it = std::find_if(remote.begin(), remote.end(),
                               [&](const HcaAddress& r) { return sameSubnet(local[i], r); });
        if (it == remote.end())
            return {Errc::NonOneToOnePairing, "subnet " + subnetText(local[i]) + " only on the local node"};
        pairs.push_back({i, std::uint32_t(it - remote.begin())});
    }
    std::sort(pairs.begin(), pairs.end(), [&](const HcaPair& a, const HcaPair& b) {
        const auto& x = local[a.local];
        const auto& y = local[b.local];
        return x.subnet != y.subnet ? x.subnet < y.subnet : x.prefixLen < y.prefixLen;
    });
    return pairs;
}

} // namespace tpf
