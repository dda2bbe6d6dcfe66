// The agreed cap of a group: the exact minimum of every rank's roster
// maxBytes and every serving daemon's daemon.max_bytes (docs/operations.md,
// "Groups"). Every daemon of a group computes it from values they all hold:
// the roster (identical on every node) and, across nodes, each other daemon's
// daemonMax from its PeerGroup record.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/ids.hpp"
#include "proto/client_msg.hpp"

namespace tpf::daemon {

/// One daemon serving ranks of the group, and its daemon.max_bytes.
struct DaemonMax {
    NodeId node{};
    std::uint64_t maxBytes = 0;
};

/// The cap and what sets it.
struct CapAgreement {
    std::uint64_t cap = 0;
    /// A daemon whose daemon.max_bytes is the cap (the first listed), if any:
    /// a client clamps its roster entry to its daemon's max, so when the
    /// daemon's limit binds, that daemon is named rather than its ranks.
    bool byDaemon = false;
    NodeId node{};
    std::uint32_t rank = 0; ///< otherwise the lowest rank whose roster maxBytes is the cap

    /// "rank 2 is the smallest" / "daemon of node 0a1b2c3d4e5f is the smallest".
    std::string smallest() const {
        return byDaemon ? "daemon of node " + node.shortHex() + " is the smallest"
                        : "rank " + std::to_string(rank) + " is the smallest";
    }
};

/// The minimum of every roster entry's maxBytes and every listed daemon's
/// maxBytes. `roster` is non-empty.
inline CapAgreement agreeCap(const std::vector<client_proto::RosterEntry>& roster, std::span<const DaemonMax> daemons) {
    CapAgreement a;
    a.cap = roster.at(0).maxBytes;
    for (std::uint32_t r = 1; r < roster.size(); ++r)
        if (roster[r].maxBytes < a.cap) a.cap = roster[r].maxBytes, a.rank = r;
    for (const auto& d : daemons)
        if (d.maxBytes < a.cap || (d.maxBytes == a.cap && !a.byDaemon)) {
            a.cap = d.maxBytes;
            a.byDaemon = true;
            a.node = d.node;
        }
    return a;
}

} // namespace tpf::daemon
