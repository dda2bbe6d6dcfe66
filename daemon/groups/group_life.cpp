// A group's life on this node (see group_life.hpp).
#include "daemon/groups/group_life.hpp"

#include <spdlog/spdlog.h>

#include "proto/layout.hpp"

namespace tpf::daemon {

const char* groupStateName(GroupState s) {
    switch (s) {
    case GroupState::Joining: return "joining";
    case GroupState::Negotiating: return "negotiating";
    case GroupState::Open: return "open";
    case GroupState::Carrying: return "carrying";
    case GroupState::Broken: return "broken";
    case GroupState::Closing: return "closing";
    case GroupState::Closed: return "closed";
    }
    return "?";
}

const char* groupEventName(GroupEvent::Kind k) {
    using K = GroupEvent::Kind;
    switch (k) {
    case K::Join: return "join";
    case K::Refuse: return "refuse";
    case K::OpenTimedOut: return "open-timed-out";
    case K::Negotiate: return "negotiate";
    case K::Ready: return "ready";
    case K::NegotiationReady: return "negotiation-ready";
    case K::NegotiationRefused: return "negotiation-refused";
    case K::Leave: return "leave";
    case K::Left: return "left";
    case K::RemoteLeft: return "remote-left";
    case K::Fault: return "fault";
    case K::LinkFault: return "link-fault";
    case K::RemoteFault: return "remote-fault";
    case K::Abort: return "abort";
    case K::Drained: return "drained";
    case K::ShareRegion: return "share-region";
    case K::DeviceAttach: return "device-attach";
    }
    return "?";
}

void GroupLife::enter(GroupState next) {
    if (next == GroupState::Closing) closingFrom_ = state_;
    const bool life = next == GroupState::Open || next == GroupState::Carrying || next == GroupState::Broken;
    if (state_ == GroupState::Closing && life) closingFrom_ = next;
    else state_ = next;
}

GroupLife::Outcome GroupLife::closed(const char* how) {
    if (how) spdlog::info("group {}: {}", name_, how);
    enter(GroupState::Closed);
    return Outcome::Taken;
}

GroupLife::Outcome GroupLife::refuseAll(Errc code, const std::string& why, bool tellOtherNodes, bool logClosed,
                                        GroupLifeEffects& fx) {
    spdlog::warn("group {}: unavailable: {}: {}", name_, errcName(code), why);
    fx.refuseMembers(code, why, tellOtherNodes);
    return closed(logClosed ? "closed" : nullptr);
}

// `counted`: a failure this daemon saw, counted in the metrics once per group
// while the group was open or carrying (another node's is counted there).
GroupLife::Outcome GroupLife::breakFor(const GroupEvent& e, bool tellPeers, bool counted, GroupLifeEffects& fx) {
    const GroupState was = life();
    // Broken by orderly leaves only, it still carries shards: a fault now ends that too.
    const bool carrying = was == GroupState::Carrying;
    const bool healthy = was != GroupState::Broken;
    // Broken already: only an abort replaces the failure its members see.
    if (!healthy && e.code != Errc::Aborted) return Outcome::Ignored;
    if (healthy) spdlog::warn("group {}: broken: {}: {}", name_, errcName(e.code), e.why);
    if ((was == GroupState::Open || carrying) && counted && !counted_) {
        counted_ = true;
        fx.countBroken(e.code);
    }
    if (tellPeers && healthy) fx.tellOtherNodes(e.code, e.rank, e.why, 0);
    enter(GroupState::Broken);
    carriedThrough_ = 0;
    fx.failCalls(e.code, e.rank, e.why, 0, carrying);
    return Outcome::Taken;
}

GroupLife::Outcome GroupLife::rankLeft(std::uint32_t rank, std::uint64_t last, bool tellPeers, GroupLifeEffects& fx) {
    const GroupState was = life();
    // Before the group opened nothing was carried: a leave then is a refusal (Leave).
    if (was == GroupState::Joining || was == GroupState::Negotiating) return Outcome::Ignored;
    if (leftMask_ >> rank & 1u) return Outcome::Ignored;
    leftMask_ |= 1u << rank;
    fx.markGone(rank);
    const std::string why = "rank " + std::to_string(rank) + " left the group" +
                            (last == kCarriedUnknown ? std::string() : " after epoch " + std::to_string(last));
    if (tellPeers && (was == GroupState::Open || was == GroupState::Carrying))
        fx.tellOtherNodes(Errc::PeerLost, rank, why, last);
    if (was == GroupState::Broken) return Outcome::Taken; // a fault came first: nothing is carried
    const bool first = was == GroupState::Open;
    // An orderly Close is no fault: calls up to its last epoch complete, the next one fails (PeerLost).
    if (first)
        spdlog::info("group {}: {}; calls up to that epoch still complete, later ones end PeerLost", name_, why);
    else
        spdlog::info("group {}: {} too", name_, why);
    if (!first && last >= carriedThrough_) return Outcome::Taken; // an earlier leaver bounds the carried epochs
    enter(GroupState::Carrying);
    carriedThrough_ = last;
    fx.failCalls(Errc::PeerLost, rank, why, last, !first);
    return Outcome::Taken;
}

GroupLife::Outcome GroupLife::on(const GroupEvent& e, GroupLifeEffects& fx) {
    using K = GroupEvent::Kind;
    using S = GroupState;
    const S s = state_;
    if (s == S::Closed) return Outcome::Ignored;
    switch (e.kind) {
    case K::Join:
        if (s == S::Joining) return Outcome::Taken;
        // Its id opens again while the old group waits for its last shards: the old one goes now.
        if (s == S::Closing) return closed("closed (opened again)");
        return Outcome::Refused;
    case K::Refuse:
        if (s != S::Joining) return Outcome::Ignored;
        return refuseAll(e.code, e.why, true, true, fx);
    case K::OpenTimedOut:
        if (s != S::Joining) return Outcome::Ignored; // a negotiation times out by itself
        return refuseAll(Errc::Timeout, e.why, true, false, fx);
    case K::Negotiate:
        if (s != S::Joining) return Outcome::Ignored;
        enter(S::Negotiating);
        return Outcome::Taken;
    case K::Ready:
    case K::NegotiationReady:
        if (s != (e.kind == K::Ready ? S::Joining : S::Negotiating)) return Outcome::Ignored;
        enter(S::Open);
        fx.open();
        return Outcome::Taken;
    case K::NegotiationRefused:
        // Every other node was told already. Broken: aborted while it negotiated.
        if (s != S::Negotiating && s != S::Broken) return Outcome::Ignored;
        return refuseAll(e.code, e.why, false, true, fx);
    case K::Leave:
        switch (s) {
        case S::Joining:
            // The group can no longer complete: tell the ranks already waiting.
            return refuseAll(Errc::PeerLost, "rank " + std::to_string(e.rank) + " left before the group opened", true,
                             true, fx);
        case S::Negotiating:
            fx.failNegotiation(Errc::PeerLost, "rank " + std::to_string(e.rank) + " left before the group opened");
            return Outcome::Taken;
        case S::Open:
        case S::Carrying:
        case S::Broken: {
            // Counted now: the group may be gone once the proxy drained its ring.
            if (!e.orderly && s != S::Broken && !counted_) {
                counted_ = true;
                fx.countBroken(Errc::PeerLost);
            }
            const std::uint64_t version = fx.retire(e.rank, e.orderly);
            if (e.orderly && e.lastLocal && e.othersAwait) {
                // Close the peer link only once the proxy carried this node's
                // last shards and their RDMA WRITEs completed (Drained).
                closeAt_ = version;
                enter(S::Closing);
                spdlog::info("group {}: closing once its last shards landed on the other nodes", name_);
                return Outcome::Taken;
            }
            if (e.lastLocal) return closed("closed");
            return Outcome::Taken;
        }
        default: return Outcome::Ignored;
        }
    case K::Left: return rankLeft(e.rank, e.epoch, true, fx);
    case K::RemoteLeft:
        if (s == S::Closing) return Outcome::Ignored; // every local rank closed: nobody here to tell
        return rankLeft(e.rank, e.epoch, false, fx);
    case K::Fault: return breakFor(e, true, true, fx);
    case K::LinkFault:
        // A queue pair or link to ranks that all closed in order goes away with them: no fault.
        if (s == S::Open || (s == S::Carrying && (e.ranks & ~leftMask_) != 0)) return breakFor(e, e.tellPeers, true, fx);
        return Outcome::Ignored;
    case K::RemoteFault:
        if (s == S::Closing) return Outcome::Ignored;
        if (s == S::Open || s == S::Carrying || e.code == Errc::Aborted) return breakFor(e, false, false, fx);
        return Outcome::Ignored;
    case K::Abort:
        if (s == S::Closing) return Outcome::Ignored; // no member left to abort it
        return breakFor(e, true, true, fx);
    case K::Drained:
        if (s == S::Closing && closeAt_ <= e.epoch) return closed("closed");
        return Outcome::Ignored;
    case K::ShareRegion: return s == S::Open ? Outcome::Taken : Outcome::Refused;
    case K::DeviceAttach:
        return s == S::Open || s == S::Carrying || s == S::Broken ? Outcome::Taken : Outcome::Refused;
    }
    return Outcome::Ignored;
}

} // namespace tpf::daemon
