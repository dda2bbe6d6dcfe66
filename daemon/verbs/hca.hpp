// HCA discovery. Built without the verbs feature (or with no RoCE port
// active) it reports zero HCAs, and only same-node groups open.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/config/config.hpp"
#include "proto/client_msg.hpp"
#include "proto/pairing.hpp"

namespace tpf::daemon {

/// The HCA ports this daemon serves, as its node card and status show them:
/// one HcaCard per chosen (device, port, RoCE v2 GID), at most kMaxStripes,
/// in selection order (see selectHcas in daemon/verbs/hca_select.hpp for which are
/// chosen: cfg.hcas, else $TPF_HCA, else $NCCL_IB_HCA, else every ACTIVE
/// RoCE port). Called once at start-up; never fails: when verbs finds
/// nothing usable, or the selection matches nothing, it logs why (one line)
/// and returns an empty list, and the daemon serves same-node groups, and
/// groups spanning nodes over the tcp wire where peer.wire allows.
/// Logs one info line per chosen HCA and a warning per selection entry that
/// matched nothing. `noneWhy`, when given, gets the reason of an empty list
/// (status's hcas_none_reason), "" otherwise.
/// What a node without a usable HCA still serves, for the discovery's log
/// line: groups spanning nodes over the tcp wire when peer.wire allows and
/// peer.listen is set, else same-node groups only.
inline const char* withoutHcas(const DaemonConfig& cfg) {
    return cfg.peerWire != DaemonConfig::PeerWire::Verbs && !cfg.peerListen.empty()
               ? "groups spanning nodes use the tcp wire"
               : "serving same-node groups only";
}

std::vector<client_proto::HcaCard> discoverHcas(const DaemonConfig& cfg, std::string* noneWhy = nullptr);

/// The port's state now (an IBV_PORT_* value, 4 = ACTIVE), read from sysfs,
/// so status shows a link cut after start-up. card.state when it cannot be
/// read (device gone) or without verbs.
std::uint32_t livePortState(const client_proto::HcaCard& card);

/// Name of an IBV_PORT_* value as ibv_devinfo prints it without the
/// "PORT_" prefix: "NOP", "DOWN", "INIT", "ARMED", "ACTIVE",
/// "ACTIVE_DEFER"; "UNKNOWN(n)" for anything else.
std::string portStateName(std::uint32_t state);

/// A GID in the text form ibv_devinfo prints (inet_ntop of AF_INET6):
/// "::ffff:10.77.0.1" for an IPv4-mapped GID, "fe80::..." otherwise.
std::string gidText(const std::uint8_t (&gid)[16]);

/// The IP address behind the card's GID: "10.77.0.1" for an IPv4-mapped
/// GID, the IPv6 text otherwise.
std::string hcaIp(const client_proto::HcaCard& card);

/// What pairing (proto/pairing.hpp) needs of a card: GID, subnet, prefix.
HcaAddress hcaAddress(const client_proto::HcaCard& card);

/// The card's subnet as CIDR text: "10.77.0.0/24", or hex groups for IPv6
/// (subnetText of hcaAddress(card)).
std::string hcaSubnetText(const client_proto::HcaCard& card);

} // namespace tpf::daemon
