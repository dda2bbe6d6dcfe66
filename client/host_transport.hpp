// The client side of a Host group's wires: what a host call does per peer.
// A call stages its row in this rank's own slot, then (1) each of the
// group's transports publishes it to its peers, (2) the call waits for every
// peer's flags and (3) reads or reduces every peer's row, both at the
// peer's source: the region its transport delivers that peer's row to.
// The transport of each peer is chosen once, when the group opens (as NCCL
// picks an ncclTransport per peer at connect); a call loops over the
// group's transports and reads through the sources, testing no wire.
//
// Two transports, registered in hostTransports():
//   carried      the daemon's proxy moves the row (shm within the node,
//                verbs across; any wire proxyCarries() names): one doorbell
//                per call, and the peer's row arrives in this rank's region.
//   host-direct  a same-node peer whose region the daemon handed over
//                (Verdict.hostPeers, PeerHostRegion): this rank releases its
//                own flags and wakes the peer, which reads the row from this
//                rank's region; its row is read from its region here.
// A new wire the daemons carry (a tcp wire between daemons) is carried by
// the daemon's proxy: it takes the carried transport through proxyCarries();
// a new way for this rank to move the bytes itself is one HostTransport and
// one entry in hostTransports().
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/shm.hpp"
#include "proto/peer_wire.hpp"
#include <tpfabric/tpfabric.hpp>

namespace tpf {

/// What the daemon's verdict offers for one peer of a Host group.
struct PeerOffer {
    std::uint32_t rank = 0;
    std::uint8_t wire = kWireSelf; ///< Verdict.wires[rank]
    Mapping region;                ///< the peer's own region where the daemon handed it over (PeerHostRegion), else empty
};

/// One client transport of a group: the peers it connected and what a call
/// does for them. Not copied; owned by Group::Impl::transports.
class HostTransport {
public:
    virtual ~HostTransport() = default;
    /// Takes `peer` (its region, where offered): returns the region where the
    /// peer's rows and flags are read, this rank's own or the peer's.
    virtual std::uint8_t* connect(Group::Impl& g, PeerOffer& peer) = 0;
    /// Once per call, before the wait: this rank's row of `epoch`
    /// (`rowBytes` in slot(phase, rank), staged) goes to every peer of this
    /// transport. A failure is the group's (fail()).
    virtual Status publish(Group::Impl& g, std::uint64_t epoch, std::uint32_t phase, std::uint32_t rowBytes) = 0;
    /// A Timeout's suffix naming what of this transport stalls, else "".
    virtual std::string stalled(const Group::Impl& g, std::uint64_t now) const = 0;
};

/// The registration of one client transport.
struct HostTransportKind {
    /// Whether it can reach `peer` as offered (NCCL's canConnect).
    bool (*canConnect)(const Group::Impl& g, const PeerOffer& peer);
    std::unique_ptr<HostTransport> (*make)();
};

/// Every client transport, in the order a call publishes through them:
/// carried first, so that the proxy's RDMA writes overlap this rank's own
/// work. A peer takes the first that can connect it.
std::span<const HostTransportKind> hostTransports();

/// Connects every peer of `offers` (indexed by rank; this rank's entry is
/// ignored) to the first transport that can reach it, filling g.transports
/// (in hostTransports() order) and g.sources. BadMessage when no transport
/// reaches a peer's wire.
Status connectTransports(Group::Impl& g, std::span<PeerOffer> offers);

} // namespace tpf
