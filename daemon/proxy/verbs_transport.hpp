// The verbs wire on the daemon side: the proxy posts a rank's shard, stripe
// by stripe, as RDMA WRITEs to a rank on another node (transport.hpp).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "daemon/proxy/transport.hpp"
#include "daemon/verbs/qp.hpp"
#include "daemon/verbs/verbs_group.hpp"
#include "proto/layout.hpp"

namespace tpf::daemon {

/// Local rank `rank` to remote rank `peer` over the group's queue pairs, one
/// per rail (stripe k on rail k). carry() posts each stripe from
/// step.stripe on: payload WRITE then flag WRITE (QpLink::postStripe). A
/// stripe waits while its queue pair is at its in-flight cap (InflightGate)
/// or its CQ is half full (a QP in error completes its payloads too, so the
/// CQ must hold two completions per post): the transport polls every CQ
/// once and, if still so, returns Later. A failed link (an error completion
/// or a refused post) ends the doorbell towards that peer (Done): the group
/// breaks and its ranks end PeerLost.
class VerbsTransport final : public Transport {
public:
    /// `group` may be null (no queue pairs): nothing is carried.
    VerbsTransport(const Layout& layout, std::uint32_t rank, std::uint32_t peer, std::shared_ptr<VerbsGroup> group);

    Carried carry(CarryStep& step) override;
    /// RDMA WRITEs from the other node wake nobody here.
    bool watchesInbound() const override { return group_ != nullptr; }
    /// Requests outstanding on a live link to the peer (a failed link's
    /// requests flush and do not count).
    bool inFlight() const override;

private:
    const Layout layout_;
    const std::uint32_t rank_;
    const std::shared_ptr<VerbsGroup> group_; ///< keeps links_ alive
    std::array<QpLink*, kMaxStripes> links_{}; ///< by rail; null where the group has none
};

/// The error a failed queue pair reports: which one, to which rank, on
/// which rail and HCA, and why.
Error qpFailure(const QpLink& link, const std::string& why);

} // namespace tpf::daemon
