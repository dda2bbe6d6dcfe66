// Group::open's steps with the rank's own daemon (client/open_daemon.cpp):
// meet it, ask it for the group, map what its verdict hands over and connect
// every peer to its transport. Internal to libtpfabric.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "client/impl.hpp"
#include "proto/client_msg.hpp"

namespace tpf {

using OpenClock = std::chrono::steady_clock;

/// What is left of the open's deadline, in ms (at least 1: a read still takes what already arrived).
inline int msLeft(OpenClock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - OpenClock::now()).count();
    return int(std::clamp<std::int64_t>(left, 1, 1 << 30));
}

/// Connect to the daemon, introduce this rank, and fill its roster entry
/// from the node card.
Status meetDaemon(Group::Impl& g, std::uint64_t maxBytes, client_proto::RosterEntry& entry, OpenClock::time_point deadline);

/// Join the group `groupId` of `roster` at the daemon: its verdict, the
/// region, ring and proxy event it hands over mapped, the same-node peers'
/// regions it hands over, and every peer connected to its transport.
Status joinDaemon(Group::Impl& g, const std::uint8_t (&groupId)[16], const std::vector<client_proto::RosterEntry>& roster,
                  OpenClock::time_point deadline);

/// The daemon's socket path: the open's option, else TPF_SOCKET, else the default.
std::string daemonSocketPath(const Group::Impl& g);

/// After the open: watch the daemon's connection of a group a restarted
/// daemon can re-adopt (Group::Impl::adoptable; client/readopt.cpp).
Status startDaemonWatch(Group::Impl& g);

} // namespace tpf
