// The daemon side of a wire: what the proxy does for a doorbell to one peer.
//
// A group's wires are fixed when it opens (proto/peer_wire.hpp). When the
// group table publishes the proxy table (GroupTable::publishProxyTable) it
// turns them into one Transport per (local rank, peer), as NCCL picks an
// ncclTransport per peer at connect; the proxy then carries a doorbell by
// calling the rank's transports in peerAt order (Proxy::resume) and tests no
// wire per doorbell. The implementations:
//
// - DirectTransport (here), the ipc wire and the shm wire between two
//   host-direct ranks: nothing; the rank's kernel stored the shard into the
//   peer's region, or the peer reads it from the rank's region.
// - ShmTransport (shm_transport.hpp), the shm wire: one row per stripe into
//   the doorbell's CarryRows; the proxy copies them (with the carry threads)
//   and releases each row's flag.
// - VerbsTransport (verbs_transport.hpp), the verbs wire: each stripe posted
//   (payload WRITE, then flag WRITE) on its rail's queue pair while that is
//   under its in-flight cap; Later at the cap.
// - TcpTransport (tcp_transport.hpp), the tcp wire: each stripe sent as one
//   frame on the data link to the peer's node (daemon/tcp/), whose daemon
//   stores payload then flag; Later at the socket's send buffer.
//
// Adding a wire is one class deriving from Transport and its case in
// GroupTable::publishProxyTable (docs/development.md): carry()
// writes each stripe's payload then its flag in order under its own
// in-flight cap and returns Later at the cap; inFlight() tells whether what
// it sent may not have reached the peer yet (a leaving rank's drained()
// waits for it); watchesInbound() when the peer's flags land in the local
// rank's region without waking its waits. What moves its cap it may poll
// in carry() itself (the proxy calls a Later transport again every pass).
// Two parts of the verbs wire are shared by every peer and stay in the
// proxy: polling the HCAs' CQs (Proxy::pollCqs, also run for a transport by
// TransportHost::pollCompletions) and retiring a dropped group's queue
// pairs once their requests completed (Proxy::retire).
//
// Threads: a transport is built on the control thread and handed to the
// proxy inside its table (Proxy::publish: a mutex hand-off); from then on
// only the proxy thread calls it. Tables share transports (shared_ptr), and a
// transport keeps alive what it writes from and into (regions, queue pairs).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <tpfabric/error.hpp>

#include "daemon/proxy/carry.hpp"
#include "proto/ring.hpp"

namespace tpf::daemon {

struct HostRegion;

/// The same-node rows of the doorbell in progress: ShmTransport adds them,
/// the proxy copies them all (CarryPool) and then releases each row's flag
/// with the doorbell's epoch (Proxy::carryBatch), at the end of the doorbell
/// or before it comes back later. Proxy thread only.
struct CarryRows {
    /// The flag a row's copy releases: copy 0 of the flag line (a GPU
    /// reader's: every kFlagCopies copy), in region `dst`, whose sleeping
    /// waits are woken after it.
    struct Release {
        std::uint64_t* flag;
        const HostRegion* dst;
    };
    std::vector<CarryItem> items;   ///< the rows, in the order the transports added them
    std::vector<Release> releases;  ///< one per item

    void add(const CarryItem& row, std::uint64_t* flag, const HostRegion* dst) {
        items.push_back(row);
        releases.push_back(Release{flag, dst});
    }
    void reserve(std::size_t rows) {
        items.reserve(rows);
        releases.reserve(rows);
    }
    void clear() {
        items.clear();
        releases.clear();
    }
};

/// What a transport reaches of the proxy beyond the doorbell. Implemented by
/// Proxy; called on the proxy thread from Transport::carry only, off the
/// common path (a queue pair at its cap, a failed post).
class TransportHost {
public:
    virtual ~TransportHost() = default;
    /// Poll every wire's completions once (the verbs CQs): the only thing
    /// that lowers a queue pair's bytes in flight.
    virtual void pollCompletions() = 0;
    /// A link of group `groupHandle` to `remoteRank` failed (an error
    /// completion, a refused post): the group breaks (ProxyEvents::peerFailed).
    /// Reported once per link; `why` names the link.
    virtual void peerFailed(std::uint32_t groupHandle, std::uint32_t remoteRank, Error why) = 0;
};

/// One doorbell of one local rank as the proxy hands it to each of the
/// rank's transports in turn (Proxy::resume); one per resume() call.
struct CarryStep {
    const Doorbell& doorbell; ///< epoch (what every flag is set to) and bytes (the shard, staged in the rank's slot)
    std::uint32_t phase;      ///< phaseOf(doorbell.epoch): the slot and flags written
    bool gpu;                 ///< GPU kernels read this group's rows (ProxyRank::gpuDoorbells): stream large copies
    /// The first stripe not yet carried to the peer in hand: 0 when the
    /// proxy turns to a peer; a transport that returns Later leaves it at
    /// the stripe to go on with (CommandRing::Delivery keeps it).
    std::uint32_t& stripe;
    CarryRows& rows; ///< where same-node rows go
    TransportHost& host;
};

/// What carry() came to.
enum class Carried : std::uint8_t {
    /// The doorbell needs nothing more towards this peer: carried, queued
    /// in CarryRows, or dropped (its link failed).
    Done,
    /// Stopped at an in-flight cap: the proxy calls carry() again on a
    /// later pass, from step.stripe.
    Later,
};

/// How one local rank's doorbells reach one peer. One object per (local
/// rank, peer) and table version, built by GroupTable::publishProxyTable.
class Transport {
public:
    virtual ~Transport() = default;

    /// Carry the doorbell's shard to the peer, stripe by stripe from
    /// step.stripe on: copy rows (as CarryRows), post writes, or nothing.
    /// Later only when a write must wait for completions (an in-flight cap);
    /// the proxy first copies the rows already in step.rows and serves its
    /// other rings, and this ring's later doorbells wait behind this one.
    /// Never blocks. Proxy thread.
    virtual Carried carry(CarryStep& step) = 0;

    /// The peer's shards land in the local rank's region by a path that
    /// wakes none of its host waits (an RDMA WRITE from another node): the
    /// proxy watches their flags and wakes the rank when they move
    /// (Proxy::wakeInboundWaiters). Fixed for the transport's life.
    virtual bool watchesInbound() const { return false; }

    /// Writes this transport posted may not have landed at the peer yet
    /// (requests outstanding on a live link). A rank leaving the table
    /// holds drained() back until none is (or Proxy::kLandingNs passed).
    /// Proxy thread.
    virtual bool inFlight() const { return false; }
};

/// Nothing to carry: the rank moves its shard itself. The ipc wire (the
/// rank's kernel stores shard and flag into the peer's device region) and
/// the shm wire between two host-direct ranks (the peer reads the rank's
/// row and flags in the rank's own region). Stateless, so one serves every
/// such pair: directTransport().
class DirectTransport final : public Transport {
public:
    Carried carry(CarryStep&) override { return Carried::Done; }
};

/// Nothing to carry now: the peer's node's daemon went away (its link
/// closed) and the group waits for it to come back. What the rank posts
/// meanwhile is carried once it is back (Resend). The proxy watches the
/// peer's flags in the rank's region meanwhile, as for VerbsTransport (a
/// tcp receiver wakes the rank itself: watching costs it nothing more).
class AwayTransport final : public Transport {
public:
    Carried carry(CarryStep&) override { return Carried::Done; }
    bool watchesInbound() const override { return true; }
};

/// The one AwayTransport.
inline std::shared_ptr<Transport> awayTransport() {
    static const std::shared_ptr<Transport> one = std::make_shared<AwayTransport>();
    return one;
}

/// The one DirectTransport.
inline std::shared_ptr<Transport> directTransport() {
    static const std::shared_ptr<Transport> one = std::make_shared<DirectTransport>();
    return one;
}

} // namespace tpf::daemon
