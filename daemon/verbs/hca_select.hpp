// Which HCA ports a daemon serves: a pure function of what discovery found
// and what the operator asked for, apart from verbs so that it is unit-tested
// without hardware (tests/unit/test_hca_select.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "proto/client_msg.hpp"
#include <tpfabric/error.hpp>

namespace tpf::daemon {

/// One RoCE v2 GID of a port with the IP address it stands for.
struct PortAddress {
    std::array<std::uint8_t, 16> gid{}; ///< the GID: ::ffff:a.b.c.d for IPv4, else the IPv6 address
    std::uint32_t gidIndex = 0;         ///< its index in the port's GID table
    std::uint8_t ipPrefixLen = 0;       ///< prefix length of the IP on its netdev: 0..32 IPv4, 0..128 IPv6
};

/// A verbs port as discovery found it (device order, then port order).
struct CandidatePort {
    std::string device;                  ///< verbs device name, "mlx5_0"
    std::uint8_t port = 1;               ///< 1-based
    std::uint32_t state = 0;             ///< IBV_PORT_* value (4 = ACTIVE)
    bool ethernet = true;                ///< link layer Ethernet (RoCE); InfiniBand ports are never chosen
    std::uint16_t mtu = 0;               ///< active MTU, bytes
    std::uint32_t speedMbps = 0;         ///< active speed x width
    std::vector<PortAddress> addresses;  ///< its RoCE v2 GIDs (link-local ones included), GID table order
};

/// Where a selection came from, in the order they are consulted.
enum class HcaSource {
    Config,    ///< verbs.hcas
    TpfHca,    ///< $TPF_HCA
    NcclIbHca, ///< $NCCL_IB_HCA
    AllActive, ///< none of them: every ACTIVE RoCE port
};

/// "verbs.hcas", "TPF_HCA", "NCCL_IB_HCA", "every ACTIVE RoCE port".
std::string_view hcaSourceName(HcaSource s);

/// What the operator asked for. An unset or empty variable counts as not given.
struct HcaRequest {
    std::vector<std::string> config;      ///< verbs.hcas
    std::optional<std::string> tpfHca;    ///< $TPF_HCA
    std::optional<std::string> ncclIbHca; ///< $NCCL_IB_HCA
};

struct HcaSelection {
    HcaSource source = HcaSource::AllActive;
    /// The chosen ports, one per (device, port, GID), at most kMaxStripes,
    /// each GID once. A port with several IP addresses gives several cards.
    std::vector<client_proto::HcaCard> hcas;
    /// One operator-readable line each: an entry that matched nothing (and
    /// why), a named port kept although not ACTIVE, cards dropped past 8.
    std::vector<std::string> warnings;
};

/// Chooses the HCA cards from `ports`.
///
/// The first non-empty of verbs.hcas, $TPF_HCA, $NCCL_IB_HCA decides:
/// - verbs.hcas and $TPF_HCA (a comma list) hold the same entries: an exact
///   device name ("rxe0": each of its ports), "dev:port" ("mlx5_0:1"), or an
///   IPv4/IPv6 literal ("10.0.0.1": the port whose RoCE v2 GID is that
///   address, that GID only). Named ports are kept in any state (a warning
///   says when one is not ACTIVE): the daemon finds ports only at start-up.
/// - $NCCL_IB_HCA in NCCL's syntax: a comma list of "name[:port]", matched
///   as prefixes ("mlx5" = mlx5_0, mlx5_1, ...), exact names with a leading
///   '=', everything else with a leading '^' (and "^=" for exact exclusion).
///   As in NCCL, only ACTIVE ports are taken.
/// - none: every ACTIVE RoCE port.
/// A port chosen by name or by default gives one card per RoCE v2 GID of an
/// IPv4 address; a port with none gives one per global IPv6 GID. Link-local
/// GIDs (fe80::/10) are never chosen: their subnet is the same on every rail.
/// Cards are in entry order (verbs.hcas, $TPF_HCA) or port order.
///
/// Errors: ConfigError for an entry that cannot be parsed (bad port number,
/// empty NCCL list), naming the entry and its source; Unavailable when
/// nothing is chosen, naming every entry that matched nothing and why (or,
/// by default, each port and why it was not taken).
Result<HcaSelection> selectHcas(std::span<const CandidatePort> ports, const HcaRequest& request);

/// The card for one port and one of its addresses: subnet in the 128-bit
/// form (IPv4-mapped with prefixLen 96 + the IPv4 prefix).
client_proto::HcaCard makeHcaCard(const CandidatePort& port, const PortAddress& address);

/// True for ::ffff:a.b.c.d.
bool isIpv4Mapped(const std::array<std::uint8_t, 16>& gid);

} // namespace tpf::daemon
