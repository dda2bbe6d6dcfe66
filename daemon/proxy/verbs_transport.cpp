#include "daemon/proxy/verbs_transport.hpp"

namespace tpf::daemon {

namespace {
// Half the CQ for signaled flags: a QP in error also completes its payloads.
bool mustWait(const QpLink& link) {
    return link.gate.mustWait(2) || 2 * (link.hca().outstanding + 1) >= link.hca().cqDepth();
}
} // namespace

VerbsTransport::VerbsTransport(const Layout& layout, std::uint32_t rank, std::uint32_t peer,
                               std::shared_ptr<VerbsGroup> group)
    : layout_(layout), rank_(rank), group_(std::move(group)) {
    for (std::uint32_t k = 0; group_ && k < layout_.stripes; ++k) links_[k] = group_->link(rank, peer, k);
}

Carried VerbsTransport::carry(CarryStep& step) {
    for (; step.stripe < layout_.stripes; ++step.stripe) {
        const std::uint32_t k = step.stripe;
        QpLink* link = links_[k];
        if (!link || link->failed) return Carried::Done;
        if (mustWait(*link)) {
            step.host.pollCompletions();
            if (link->failed) return Carried::Done;
            if (mustWait(*link)) return Carried::Later;
        }
        const Stripe s = stripeOf(step.doorbell.bytes, layout_.stripes, k);
        if (auto st = link->postStripe(layout_, step.phase, rank_, k, s, step.doorbell.epoch); !st) {
            link->failed = true;
            step.host.peerFailed(link->groupHandle, link->remoteRank, qpFailure(*link, st.error().describe()));
            return Carried::Done;
        }
    }
    return Carried::Done;
}

bool VerbsTransport::inFlight() const {
    for (std::uint32_t k = 0; k < layout_.stripes; ++k)
        if (const QpLink* l = links_[k]; l && !l->failed && l->gate.wrs()) return true;
    return false;
}

Error qpFailure(const QpLink& link, const std::string& why) {
    return Error{Errc::PeerLost, "queue pair " + std::to_string(link.qpn()) + " to rank " + std::to_string(link.remoteRank) +
                                     " on rail " + std::to_string(link.rail) + " (" + link.hca().name() +
                                     ") failed: " + why};
}

} // namespace tpf::daemon
