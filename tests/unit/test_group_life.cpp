// A group's life (daemon/groups/group_life.cpp): every state x event against
// the table below, which says what each must do (the resulting state, or
// refused, or ignored). Each state is reached from a fresh group through the
// events that lead there in the daemon, so the table tests the transitions
// that reach a state as well; a refused or ignored event must also leave the
// group and the world outside it untouched.
#include <cctype>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "catch.hpp"
#include "daemon/groups/group_life.hpp"

using namespace tpf;
using namespace tpf::daemon;

namespace {

// The transitions' log lines are not what this test reads.
[[maybe_unused]] const bool kQuiet = (spdlog::set_level(spdlog::level::off), true);

// Every effect, as a line: what the test checks of a transition besides its state.
struct Recorder final : GroupLifeEffects {
    std::vector<std::string> calls;
    std::uint64_t version = 10; ///< the table version retire() publishes next, less one

    void refuseMembers(Errc code, const std::string&, bool tellOtherNodes) override {
        calls.push_back("refuse " + std::string(errcName(code)) + (tellOtherNodes ? " told" : ""));
    }
    void open() override { calls.push_back("open"); }
    void tellOtherNodes(Errc code, std::uint32_t rank, const std::string&, std::uint64_t leftAfter) override {
        calls.push_back("tell " + std::string(errcName(code)) + " " + std::to_string(rank) + " " + std::to_string(leftAfter));
    }
    void failCalls(Errc code, std::uint32_t rank, const std::string&, std::uint64_t carriedThrough, bool replace) override {
        calls.push_back("fail " + std::string(errcName(code)) + " " + std::to_string(rank) + " " +
                        std::to_string(carriedThrough) + (replace ? " replace" : ""));
    }
    void markGone(std::uint32_t rank) override { calls.push_back("gone " + std::to_string(rank)); }
    void countBroken(Errc code) override { calls.push_back("count " + std::string(errcName(code))); }
    std::uint64_t retire(std::uint32_t rank, bool orderly) override {
        calls.push_back("retire " + std::to_string(rank) + (orderly ? " orderly" : ""));
        return ++version;
    }
    void failNegotiation(Errc code, const std::string&) override { calls.push_back("fail-negotiation " + std::string(errcName(code))); }
};

// The rows: where the group is before the event.
struct Start {
    const char* name;
    std::vector<GroupEvent> path; ///< from a fresh group (Joining)
};
// Carrying: rank 3 (another node's) closed after epoch 20. Closing: rank 0,
// the last local one, closed in order (its retire published version 11).
const GroupEvent kCloseLast = GroupEvent::leave(0, true, true, true);
const std::vector<Start> kStarts = {
    {"joining", {}},
    {"negotiating", {GroupEvent::negotiate()}},
    {"open", {GroupEvent::ready()}},
    {"carrying", {GroupEvent::ready(), GroupEvent::remoteLeft(3, 20)}},
    {"broken", {GroupEvent::ready(), GroupEvent::fault(Errc::PeerLost, 1, "rank 1 is gone")}},
    {"closing/open", {GroupEvent::ready(), kCloseLast}},
    {"closing/carrying", {GroupEvent::ready(), GroupEvent::remoteLeft(3, 20), kCloseLast}},
    {"closing/broken", {GroupEvent::ready(), GroupEvent::fault(Errc::PeerLost, 1, "rank 1 is gone"), kCloseLast}},
};

// The columns: the events, with the data that decides between outcomes.
struct Column {
    const char* name;
    GroupEvent event;
};
const std::vector<Column> kColumns = {
    {"join", GroupEvent::join()},
    {"refuse", GroupEvent::refuse(Errc::GroupMismatch, "rank 1 disagrees")},
    {"open-timed-out", GroupEvent::openTimedOut("rank 1 did not join")},
    {"negotiate", GroupEvent::negotiate()},
    {"ready", GroupEvent::ready()},
    {"negotiation-ready", GroupEvent::negotiationReady()},
    {"negotiation-refused", GroupEvent::negotiationRefused(Errc::Timeout, "node x did not answer")},
    {"close (others stay)", GroupEvent::leave(1, true, false, true)},
    {"drop (others stay)", GroupEvent::leave(1, false, false, true)},
    {"close (last, other nodes wait)", GroupEvent::leave(1, true, true, true)},
    {"close (last, none waits)", GroupEvent::leave(1, true, true, false)},
    {"drop (last)", GroupEvent::leave(1, false, true, true)},
    {"left before the carried epoch", GroupEvent::left(2, 10)},
    {"left after the carried epoch", GroupEvent::left(2, 30)},
    {"left: rank 3", GroupEvent::left(3, 5)},
    {"remote-left", GroupEvent::remoteLeft(2, 10)},
    {"fault", GroupEvent::fault(Errc::PeerLost, 2, "rank 2 sent a bad doorbell")},
    {"link-fault (a rank stays)", GroupEvent::linkFault(Errc::PeerLost, 2, "queue pair failed", 1u << 2, true)},
    {"link-fault (its ranks left)", GroupEvent::linkFault(Errc::PeerLost, 3, "peer link closed", 1u << 3, false)},
    {"remote-fault", GroupEvent::remoteFault(Errc::PeerLost, 2, "node y: rank 2 is gone")},
    {"remote-fault (aborted)", GroupEvent::remoteFault(Errc::Aborted, 2, "node y: rank 2 aborted the group")},
    {"abort", GroupEvent::abort(1)},
    {"drained (before closing)", GroupEvent::drained(10)},
    {"drained (closing's version)", GroupEvent::drained(11)},
    {"share-region", GroupEvent::shareRegion()},
    {"device-attach", GroupEvent::deviceAttach()},
};

// One cell: J N O C B Z (joining, negotiating, open, carrying, broken,
// closed), Xo Xc Xb (closing, living open, carrying, broken), R refused, -
// ignored. A state letter means taken: the group is in that state after it.
// clang-format off
const char* const kTable[] = {
//                    join ref tmo neg rdy nrd nrf cl  dr  clW clN drL l<  l>  l3  rl  flt lkS lkL rf  rfA abt d<  d=  shr dev
/* joining          */ "J   Z   Z   N   O   -   -   Z   Z   Z   Z   Z   -   -   -   -   B   -   -   -   B   B   -   -   R   R",
/* negotiating      */ "R   -   -   -   -   O   Z   N   N   N   N   N   -   -   -   -   B   -   -   -   B   B   -   -   R   R",
/* open             */ "R   -   -   -   -   -   -   O   O   Xo  Z   Z   C   C   C   C   B   B   B   B   B   B   -   -   O   O",
/* carrying         */ "R   -   -   -   -   -   -   C   C   Xc  Z   Z   C   C   -   C   B   B   -   B   B   B   -   -   R   C",
/* broken           */ "R   -   -   -   -   -   Z   B   B   Xb  Z   Z   B   B   B   B   -   -   -   -   B   B   -   -   R   B",
/* closing/open     */ "Z   -   -   -   -   -   -   -   -   -   -   -   Xc  Xc  Xc  -   Xb  -   -   -   -   -   -   Z   R   R",
/* closing/carrying */ "Z   -   -   -   -   -   -   -   -   -   -   -   Xc  Xc  -   -   Xb  -   -   -   -   -   -   Z   R   R",
/* closing/broken   */ "Z   -   -   -   -   -   -   -   -   -   -   -   Xb  Xb  Xb  -   -   -   -   -   -   -   -   Z   R   R",
};
// clang-format on

std::vector<std::string> cellsOf(const char* row) {
    std::istringstream in(row);
    std::vector<std::string> cells;
    for (std::string c; in >> c;) cells.push_back(c);
    return cells;
}

GroupState stateOf(char c) {
    switch (c) {
    case 'J': return GroupState::Joining;
    case 'N': return GroupState::Negotiating;
    case 'O': return GroupState::Open;
    case 'C': return GroupState::Carrying;
    case 'B': return GroupState::Broken;
    case 'X': return GroupState::Closing;
    case 'Z': return GroupState::Closed;
    }
    FAIL("no state letter " << c);
    return GroupState::Closed;
}

std::string joined(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : "; ") + x;
    return s;
}

// A fresh group driven to row `r`'s state, checked on the way.
GroupLife reach(const Start& start, Recorder& fx) {
    GroupLife life("test");
    for (const auto& e : start.path) REQUIRE(life.on(e, fx) == GroupLife::Outcome::Taken);
    return life;
}

} // namespace

TEST_CASE("group life: every state x event does what the table says") {
    REQUIRE(std::size(kTable) == kStarts.size());
    for (std::size_t r = 0; r < kStarts.size(); ++r) {
        const auto cells = cellsOf(kTable[r]);
        REQUIRE(cells.size() == kColumns.size());
        for (std::size_t c = 0; c < kColumns.size(); ++c) {
            INFO("state " << kStarts[r].name << ", event " << kColumns[c].name << ": expected " << cells[c]);
            Recorder fx;
            GroupLife life = reach(kStarts[r], fx);
            fx.calls.clear();
            const GroupState before = life.state(), lifeBefore = life.life();
            const GroupLife::Outcome out = life.on(kColumns[c].event, fx);
            INFO("effects: " << joined(fx.calls) << "; now " << groupStateName(life.state()) << " living "
                             << groupStateName(life.life()));
            const std::string& want = cells[c];
            if (want == "R" || want == "-") {
                CHECK(out == (want == "R" ? GroupLife::Outcome::Refused : GroupLife::Outcome::Ignored));
                CHECK(life.state() == before);
                CHECK(life.life() == lifeBefore);
                CHECK(fx.calls.empty());
                continue;
            }
            CHECK(out == GroupLife::Outcome::Taken);
            CHECK(life.state() == stateOf(want[0]));
            if (want[0] == 'X') CHECK(life.life() == stateOf(char(std::toupper(want[1]))));
        }
    }
}

TEST_CASE("group life: a rank's orderly leave once drained") {
    Recorder fx;
    GroupLife life("test");
    REQUIRE(life.on(GroupEvent::ready(), fx) == GroupLife::Outcome::Taken);
    REQUIRE(fx.calls == std::vector<std::string>{"open"});
    fx.calls.clear();
    // The first leaver: the others hear its last epoch, calls up to it complete.
    life.on(GroupEvent::left(1, 20), fx);
    CHECK(fx.calls == std::vector<std::string>{"gone 1", "tell PeerLost 1 20", "fail PeerLost 1 20"});
    CHECK(life.carriedThrough() == 20);
    fx.calls.clear();
    // A later one does not move the bound; an earlier one lowers it, replacing the recorded failure.
    life.on(GroupEvent::left(2, 25), fx);
    CHECK(fx.calls == std::vector<std::string>{"gone 2", "tell PeerLost 2 25"});
    fx.calls.clear();
    life.on(GroupEvent::remoteLeft(3, 15), fx);
    CHECK(fx.calls == std::vector<std::string>{"gone 3", "fail PeerLost 3 15 replace"});
    CHECK(life.carriedThrough() == 15);
    CHECK(life.leftMask() == 0xeu);
    fx.calls.clear();
    // A fault ends carrying: every call fails from now on, counted once.
    life.on(GroupEvent::fault(Errc::PeerLost, 0, "rank 0 is gone"), fx);
    CHECK(fx.calls == std::vector<std::string>{"count PeerLost", "tell PeerLost 0 0", "fail PeerLost 0 0 replace"});
    CHECK(life.state() == GroupState::Broken);
}

TEST_CASE("group life: a broken group is counted once, where it was seen") {
    Recorder fx;
    GroupLife life("test");
    life.on(GroupEvent::ready(), fx);
    fx.calls.clear();
    // A dropped member counts at once (the group may be gone once its break is due).
    life.on(GroupEvent::leave(1, false, false, true), fx);
    CHECK(fx.calls == std::vector<std::string>{"count PeerLost", "retire 1"});
    fx.calls.clear();
    life.on(GroupEvent::fault(Errc::PeerLost, 1, "rank 1 is gone"), fx);
    CHECK(fx.calls == std::vector<std::string>{"tell PeerLost 1 0", "fail PeerLost 1 0"});
    // Another node's report is counted there; an abort replaces the failure quietly.
    Recorder remote;
    GroupLife other("test");
    other.on(GroupEvent::ready(), remote);
    remote.calls.clear();
    other.on(GroupEvent::remoteFault(Errc::PeerLost, 2, "node y"), remote);
    CHECK(remote.calls == std::vector<std::string>{"fail PeerLost 2 0"});
    remote.calls.clear();
    other.on(GroupEvent::abort(0), remote);
    CHECK(remote.calls == std::vector<std::string>{"fail Aborted 0 0"});
}

TEST_CASE("group life: refusals before the open") {
    Recorder fx;
    GroupLife mine("test");
    // Refused here: the other nodes hear it from this node.
    mine.on(GroupEvent::refuse(Errc::Unavailable, "no peer link"), fx);
    CHECK(fx.calls == std::vector<std::string>{"refuse Unavailable told"});
    CHECK(mine.state() == GroupState::Closed);
    CHECK(mine.on(GroupEvent::join(), fx) == GroupLife::Outcome::Ignored);
    // Refused by the negotiation: it told them already.
    fx.calls.clear();
    GroupLife theirs("test");
    theirs.on(GroupEvent::negotiate(), fx);
    theirs.on(GroupEvent::negotiationRefused(Errc::Timeout, "node x did not answer"), fx);
    CHECK(fx.calls == std::vector<std::string>{"refuse Timeout"});
    // A rank that leaves while the nodes negotiate fails the negotiation, which refuses the group.
    fx.calls.clear();
    GroupLife left("test");
    left.on(GroupEvent::negotiate(), fx);
    left.on(GroupEvent::leave(0, true, false, true), fx);
    CHECK(fx.calls == std::vector<std::string>{"fail-negotiation PeerLost"});
    CHECK(left.state() == GroupState::Negotiating);
}
