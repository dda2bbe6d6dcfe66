// The tcp wire on the daemon side: the proxy sends a rank's shard, stripe by
// stripe, as frames on the group's data link to the other node
// (transport.hpp; the link: daemon/tcp/tcp_link.hpp).
#pragma once

#include <cstdint>
#include <memory>

#include "daemon/proxy/shared_state.hpp"
#include "daemon/proxy/transport.hpp"
#include "daemon/tcp/tcp_link.hpp"
#include "proto/layout.hpp"

namespace tpf::daemon {

/// Local rank `rank` to remote rank `peer` over the data link of the peer's
/// node. carry() sends each stripe from step.stripe on as one frame (header,
/// then the stripe of the rank's staged shard); the receiving daemon stores
/// payload then flag. The link is shared by every local rank and peer of
/// that node: a frame another transport left half written goes out first.
/// At the socket's send buffer (peer.tcp_inflight_bytes) the rest of the
/// frame waits in the link and carry() returns Later; it finishes it on the
/// next call before it goes on. A failed link ends the doorbell towards the
/// peer (Done): the group breaks and its ranks end PeerLost.
class TcpTransport final : public Transport {
public:
    /// `group` may lack a link to the peer (null byRank): nothing is carried.
    TcpTransport(const Layout& layout, std::uint32_t rank, std::uint32_t peer, std::shared_ptr<HostRegion> own,
                 std::shared_ptr<TcpGroup> group);

    Carried carry(CarryStep& step) override;
    /// Frames not all written, or written and not yet acknowledged by the other node.
    bool inFlight() const override;

private:
    /// The link failed: report it (once, by whoever saw it first) and drop the doorbell.
    Carried failed(CarryStep& step, bool first);

    const Layout layout_;
    const std::uint32_t rank_;
    const std::uint32_t peer_;
    const std::shared_ptr<HostRegion> own_; ///< the rank's region: its staged shard is sent from there
    const std::shared_ptr<TcpGroup> group_; ///< keeps link_ alive
    TcpLink* link_ = nullptr;
};

} // namespace tpf::daemon
