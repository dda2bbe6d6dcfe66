// A group's life on this node as one state machine: named states, the
// events that happen to a group, and one transition function, GroupLife::on,
// that every change of state and every refusal a state decides goes through
// (as PipeWire's node state goes through pw_impl_node_set_state). What a
// transition does outside the group's own state (refuse the members, tell
// the other nodes, fail the members' calls, count it in the metrics) goes
// through GroupLifeEffects, which the group table implements; the log lines
// are written here. Control thread only.
#pragma once

#include <cstdint>
#include <string>

#include <tpfabric/error.hpp>

namespace tpf::daemon {

/// Where a group is in its life on this node.
enum class GroupState : std::uint8_t {
    Joining,     ///< local ranks join, within the open timeout
    Negotiating, ///< every local rank joined; the daemons of the other nodes negotiate
    Open,        ///< the ok verdict went out; the proxy carries the group's doorbells
    Carrying,    ///< ranks closed in order: calls up to carriedThrough() still complete, later ones end PeerLost
    Broken,      ///< a fault or an abort: every call fails
    /// Every local rank closed in order while ranks on other nodes may still
    /// wait for its shards: kept until the proxy drained closeAt(). It goes
    /// on living the life it closed from (closingFrom(): open, carrying or
    /// broken) for the leaves still due then, and status shows that life.
    Closing,
    Closed, ///< dropped from the table: no event reaches it
};
/// "joining", "negotiating", "open", "carrying", "broken", "closing", "closed".
const char* groupStateName(GroupState s);

/// Something that happens to a group. Build one with the named functions.
struct GroupEvent {
    enum class Kind : std::uint8_t {
        Join,               ///< a local rank joins
        Refuse,             ///< this node cannot open the group: code, why
        OpenTimedOut,       ///< a local rank did not join within the open timeout: why
        Negotiate,          ///< every local rank joined, some rank is on another node
        Ready,              ///< every local rank joined, every rank is on this node
        NegotiationReady,   ///< every node is ready: the group opens on their wire
        NegotiationRefused, ///< the negotiation failed; every other node was told: code, why
        Leave,              ///< a local member closed (orderly) or its connection dropped: rank
        Left,               ///< once drained: a local rank that closed in order posted epochs up to `epoch`
        RemoteLeft,         ///< another node: its `rank` closed in order after `epoch`
        Fault,              ///< a failure seen here: a bad doorbell, a dropped member once drained
        LinkFault,          ///< a queue pair or the peer link to other nodes' `ranks` failed
        RemoteFault,        ///< another node reports the group broken: code, rank, why
        Abort,              ///< a local member aborts the group: rank
        Drained,            ///< the proxy drained table version `epoch`
        ShareRegion,        ///< a member shares its device region with the others (a request)
        DeviceAttach,       ///< a member reports its GPU attach (a request)
    };
    Kind kind;
    Errc code = Errc::Ok;
    std::uint32_t rank = 0;
    std::string why;
    std::uint64_t epoch = 0;   ///< Left, RemoteLeft: the rank's last epoch; Drained: the table version
    std::uint32_t ranks = 0;   ///< LinkFault: the ranks behind the failed queue pair or link (bit per rank)
    bool tellPeers = false;    ///< LinkFault: the other nodes hear it (a queue pair; a lost link tells nobody)
    bool orderly = false;      ///< Leave: a Close, not a dropped connection
    bool lastLocal = false;    ///< Leave: no local member remains
    bool othersAwait = false;  ///< Leave: ranks on other nodes may still wait for this node's shards

    static GroupEvent join() { return {Kind::Join}; }
    static GroupEvent refuse(Errc code, std::string why) { return {Kind::Refuse, code, 0, std::move(why)}; }
    static GroupEvent openTimedOut(std::string why) { return {Kind::OpenTimedOut, Errc::Timeout, 0, std::move(why)}; }
    static GroupEvent negotiate() { return {Kind::Negotiate}; }
    static GroupEvent ready() { return {Kind::Ready}; }
    static GroupEvent negotiationReady() { return {Kind::NegotiationReady}; }
    static GroupEvent negotiationRefused(Errc code, std::string why) {
        return {Kind::NegotiationRefused, code, 0, std::move(why)};
    }
    static GroupEvent leave(std::uint32_t rank, bool orderly, bool lastLocal, bool othersAwait) {
        GroupEvent e{Kind::Leave, Errc::PeerLost, rank};
        e.orderly = orderly;
        e.lastLocal = lastLocal;
        e.othersAwait = othersAwait;
        return e;
    }
    static GroupEvent left(std::uint32_t rank, std::uint64_t last) { return {Kind::Left, Errc::PeerLost, rank, {}, last}; }
    static GroupEvent remoteLeft(std::uint32_t rank, std::uint64_t last) {
        return {Kind::RemoteLeft, Errc::PeerLost, rank, {}, last};
    }
    static GroupEvent fault(Errc code, std::uint32_t rank, std::string why) { return {Kind::Fault, code, rank, std::move(why)}; }
    static GroupEvent linkFault(Errc code, std::uint32_t rank, std::string why, std::uint32_t ranks, bool tellPeers) {
        GroupEvent e{Kind::LinkFault, code, rank, std::move(why)};
        e.ranks = ranks;
        e.tellPeers = tellPeers;
        return e;
    }
    static GroupEvent remoteFault(Errc code, std::uint32_t rank, std::string why) {
        return {Kind::RemoteFault, code, rank, std::move(why)};
    }
    static GroupEvent abort(std::uint32_t rank) {
        return {Kind::Abort, Errc::Aborted, rank, "rank " + std::to_string(rank) + " aborted the group"};
    }
    static GroupEvent drained(std::uint64_t version) { return {Kind::Drained, Errc::Ok, 0, {}, version}; }
    static GroupEvent shareRegion() { return {Kind::ShareRegion}; }
    static GroupEvent deviceAttach() { return {Kind::DeviceAttach}; }
};
/// The kind's name, as the table test prints it.
const char* groupEventName(GroupEvent::Kind k);

/// What a transition does outside the group's own state; the group table
/// implements it for one group. Each is called at most once a transition.
class GroupLifeEffects {
public:
    virtual ~GroupLifeEffects() = default;
    /// Refuse every member (an error verdict) and forget them; with
    /// tellOtherNodes, every other node of the roster hears why (a group
    /// refused before it negotiated).
    virtual void refuseMembers(Errc code, const std::string& why, bool tellOtherNodes) = 0;
    /// Hand the group to the proxy and the ok verdict to every member.
    virtual void open() = 0;
    /// The other nodes hear it (PeerBroken): the group broke here naming
    /// `rank`, or (leftAfter non-zero) `rank` closed in order after that epoch.
    virtual void tellOtherNodes(Errc code, std::uint32_t rank, const std::string& why, std::uint64_t leftAfter) = 0;
    /// Every member's calls past `carriedThrough` (0: every call) fail with
    /// `code` naming `rank`, and the proxy carries none of them; `replace`:
    /// this failure replaces the one recorded before (it ends carrying).
    virtual void failCalls(Errc code, std::uint32_t rank, const std::string& why, std::uint64_t carriedThrough,
                           bool replace) = 0;
    /// `rank` closed in order: nothing is carried to it any more.
    virtual void markGone(std::uint32_t rank) = 0;
    /// Count the group broken in the daemon's lifetime metrics.
    virtual void countBroken(Errc code) = 0;
    /// Member `rank` leaves the proxy's table; its break (Left or Fault)
    /// comes once the proxy drained the table version this returns.
    virtual std::uint64_t retire(std::uint32_t rank, bool orderly) = 0;
    /// The negotiation gives up (a local rank left before the group opened);
    /// it comes back as NegotiationRefused. Called last: the group may be
    /// gone when it returns.
    virtual void failNegotiation(Errc code, const std::string& why) = 0;
};

class GroupLife {
public:
    /// What became of an event.
    enum class Outcome : std::uint8_t {
        Taken,   ///< it acted (the state may be the same)
        Refused, ///< a request or a join this state does not allow
        Ignored, ///< nothing happened: not for this state (or stale)
    };

    /// `name`: the group as log lines name it.
    explicit GroupLife(std::string name) : name_(std::move(name)) {}

    /// The transition function: every event of the group comes here.
    Outcome on(const GroupEvent& e, GroupLifeEffects& fx);

    GroupState state() const { return state_; }
    /// The life a Closing group closed from (Open, Carrying or Broken); else state().
    GroupState life() const { return state_ == GroupState::Closing ? closingFrom_ : state_; }
    /// Carrying (or Closing from it): calls up to this epoch still complete.
    std::uint64_t carriedThrough() const { return carriedThrough_; }
    /// Closing: the table version whose drain closes it.
    std::uint64_t closeAt() const { return closeAt_; }
    /// Ranks, on any node, that closed in order (bit per rank).
    std::uint32_t leftMask() const { return leftMask_; }

private:
    /// The one place the state changes. In Closing a life state
    /// (Open, Carrying, Broken) is the life it goes on living.
    void enter(GroupState next);
    /// The group breaks (or, broken already, an abort replaces the failure).
    Outcome breakFor(const GroupEvent& e, bool tellPeers, bool counted, GroupLifeEffects& fx);
    /// `rank` closed in order after `last`: calls up to the smallest such epoch still complete.
    Outcome rankLeft(std::uint32_t rank, std::uint64_t last, bool tellPeers, GroupLifeEffects& fx);
    /// Refuse every member; the group is dropped.
    Outcome refuseAll(Errc code, const std::string& why, bool tellOtherNodes, bool logClosed, GroupLifeEffects& fx);
    Outcome closed(const char* how);

    std::string name_;
    GroupState state_ = GroupState::Joining;
    GroupState closingFrom_ = GroupState::Open;
    std::uint64_t carriedThrough_ = 0;
    std::uint64_t closeAt_ = 0;
    std::uint32_t leftMask_ = 0;
    bool counted_ = false; ///< counted broken in the lifetime metrics
};

} // namespace tpf::daemon
