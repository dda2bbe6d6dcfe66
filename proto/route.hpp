// tpfabric — how one rank's shard reaches a peer: the route, fixed per peer
// when a group opens and identical on every rank (Verdict.routes carries it
// from the daemon; the kernels and the proxy follow it). One group may mix
// routes: ipc to same-node GPUs, verbs to other nodes' ranks.
#pragma once

#include <cstdint>

namespace tpf {

/// Route of a peer. Wire encoding: one byte (Verdict.routes[peer]).
enum Route : std::uint8_t {
    kRouteSelf = 0,  ///< the rank itself
    kRouteShm = 1,   ///< same node, host regions: the daemon's proxy copies
    kRouteVerbs = 2, ///< another node: the daemon's proxy posts RDMA WRITEs
    kRouteIpc = 3,   ///< same node, GPU memory: the kernel stores into the peer's device region
};
inline constexpr std::uint8_t kLastRoute = kRouteIpc;

/// "self", "shm", "verbs", "ipc" (status, logs, Group::route).
constexpr const char* routeName(std::uint8_t r) {
    switch (r) {
    case kRouteSelf: return "self";
    case kRouteShm: return "shm";
    case kRouteVerbs: return "verbs";
    case kRouteIpc: return "ipc";
    }
    return "unknown";
}

/// Routes on which the daemon's proxy carries the shard (doorbells needed).
constexpr bool proxyCarries(std::uint8_t r) { return r == kRouteShm || r == kRouteVerbs; }

/// Some rank of routes[0, n) is on a route the proxy carries: that rank's
/// kernels ring the proxy. One definition for the daemon (a DeviceAttach),
/// the launch (grid, block size) and the kernel itself (constexpr: nvcc
/// calls it from device code with --expt-relaxed-constexpr).
constexpr bool anyProxyCarries(const std::uint8_t* routes, std::uint32_t n) {
    for (std::uint32_t r = 0; r < n; ++r)
        if (proxyCarries(routes[r])) return true;
    return false;
}

} // namespace tpf
