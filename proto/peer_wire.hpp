// tpfabric — how one rank's shard reaches a peer: its wire, fixed per peer
// when a group opens and identical on every rank (Verdict.wires carries it
// from the daemon; the kernels and the proxy follow it). One group may mix
// wires: ipc to same-node GPUs, verbs (or tcp) to other nodes' ranks. A
// group's ranks on other nodes are all on one of verbs and tcp: the one its
// nodes agreed (docs/wires.md).
#pragma once

#include <cstdint>

namespace tpf {

/// The wire to a peer. Encoding: one byte (Verdict.wires[peer]).
enum Wire : std::uint8_t {
    kWireSelf = 0,  ///< the rank itself
    kWireShm = 1,   ///< same node, host regions: the daemon's proxy copies
    kWireVerbs = 2, ///< another node: the daemon's proxy posts RDMA WRITEs
    kWireIpc = 3,   ///< same node, GPU memory: the kernel stores into the peer's device region
    kWireTcp = 4,   ///< another node: the daemon's proxy sends shard then flag on a TCP stream
};
inline constexpr std::uint8_t kLastWire = kWireTcp;

/// "self", "shm", "verbs", "ipc", "tcp" (status, logs, Group::route).
constexpr const char* wireName(std::uint8_t r) {
    switch (r) {
    case kWireSelf: return "self";
    case kWireShm: return "shm";
    case kWireVerbs: return "verbs";
    case kWireIpc: return "ipc";
    case kWireTcp: return "tcp";
    }
    return "unknown";
}

/// Wires on which the daemon's proxy carries the shard (doorbells needed).
constexpr bool proxyCarries(std::uint8_t r) { return r == kWireShm || r == kWireVerbs || r == kWireTcp; }

/// Another node's rank: reached over a wire between daemons.
constexpr bool crossesNodes(std::uint8_t r) { return r == kWireVerbs || r == kWireTcp; }

/// Some rank of wires[0, n) is on a wire the proxy carries: that rank's
/// kernels ring the proxy. One definition for the daemon (a DeviceAttach),
/// the launch (grid, block size) and the kernel itself (constexpr: nvcc
/// calls it from device code with --expt-relaxed-constexpr).
constexpr bool anyProxyCarries(const std::uint8_t* wires, std::uint32_t n) {
    for (std::uint32_t r = 0; r < n; ++r)
        if (proxyCarries(wires[r])) return true;
    return false;
}

} // namespace tpf
