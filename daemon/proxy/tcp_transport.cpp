#include "daemon/proxy/tcp_transport.hpp"

namespace tpf::daemon {

TcpTransport::TcpTransport(const Layout& layout, std::uint32_t rank, std::uint32_t peer, std::shared_ptr<HostRegion> own,
                           std::shared_ptr<TcpGroup> group)
    : layout_(layout), rank_(rank), peer_(peer), own_(std::move(own)), group_(std::move(group)) {
    if (group_ && peer_ < kMaxWorld) link_ = group_->byRank[peer_];
}

Carried TcpTransport::failed(CarryStep& step, bool first) {
    if (first)
        if (auto why = link_->error()) step.host.peerFailed(link_->groupHandle(), peer_, *why);
    return Carried::Done;
}

Carried TcpTransport::carry(CarryStep& step) {
    if (!link_ || !own_ || link_->failed()) return Carried::Done;
    bool first = false;
    // A frame left half written (this rank's, or another's on the same link) goes out first.
    switch (link_->flush(first)) {
    case TcpLink::Sent::Done: break;
    case TcpLink::Sent::Full: return Carried::Later;
    case TcpLink::Sent::Failed: return failed(step, first);
    }
    for (; step.stripe < layout_.stripes; ++step.stripe) {
        const std::uint32_t k = step.stripe;
        const Stripe s = stripeOf(step.doorbell.bytes, layout_.stripes, k);
        peer_proto::TcpFrame f{};
        f.magic = peer_proto::kTcpFrameMagic;
        f.src = std::uint16_t(rank_);
        f.dst = std::uint16_t(peer_);
        f.stripe = std::uint8_t(k);
        f.phase = std::uint8_t(step.phase);
        f.bytes = std::uint32_t(s.bytes);
        f.offset = s.offset;
        f.epoch = step.doorbell.epoch;
        switch (link_->send(f, own_->slot(step.phase, rank_) + s.offset, first)) {
        case TcpLink::Sent::Done: continue;
        case TcpLink::Sent::Full: ++step.stripe; return Carried::Later; // the rest of it first, next call
        case TcpLink::Sent::Failed: return failed(step, first);
        }
    }
    return Carried::Done;
}

bool TcpTransport::inFlight() const { return link_ && link_->inFlight(); }

} // namespace tpf::daemon
