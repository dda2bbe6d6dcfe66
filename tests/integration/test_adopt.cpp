// Re-adoption seen from the daemon's socket (issue 45): a test process plays
// the ranks of a one-node group whose daemon restarted. It holds the regions
// and rings itself, in the states a daemon stopped mid-work leaves them, and
// hands them to a fresh tpfabricd (Adopt): the new proxy carries out what
// the rings and flags show was not carried out, and nothing that was.
// Hostile Adopts are refused by name, and the daemon serves on.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "catch.hpp"
#include "common/shm.hpp"
#include "common/unix_socket.hpp"
#include "harness.hpp"
#include "proto/client_msg.hpp"

using namespace tpf;
using namespace tpf::testing;
using namespace tpf::client_proto;

namespace {

constexpr std::uint64_t kCap = 4096;
constexpr std::uint32_t kHandle = 4242;
constexpr std::uint32_t kEntries = 64;

// One rank's region and ring as the rank keeps them.
struct HeldRank {
    Layout layout{};
    UniqueFd regionFd, ringFd;
    Mapping region, ringMap;
    RingView ring;

    std::uint8_t* slot(std::uint32_t phase, std::uint32_t src) const { return region.data() + layout.slotOffset(phase, src); }
    std::uint64_t flag(std::uint32_t phase, std::uint32_t src) const {
        return std::atomic_ref(*reinterpret_cast<std::uint64_t*>(region.data() + layout.flagOffset(phase, src, 0)))
            .load(std::memory_order_acquire);
    }
    void setFlag(std::uint32_t phase, std::uint32_t src, std::uint64_t e) const {
        std::atomic_ref(*reinterpret_cast<std::uint64_t*>(region.data() + layout.flagOffset(phase, src, 0)))
            .store(e, std::memory_order_release);
    }
    /// Doorbells at ring indices 0.., head and tail as given.
    void ringWith(std::vector<std::uint64_t> epochs, std::uint32_t head, std::uint32_t tail) {
        for (std::uint32_t i = 0; i < epochs.size(); ++i) {
            const Doorbell d{epochs[i], 64, kHandle};
            std::memcpy(ringMap.data() + ring.layout().submissionOffset(i), &d, sizeof d);
        }
        ring.header().subHead = head;
        ring.header().subTail = tail;
    }
    std::uint32_t tail() const { return std::atomic_ref(ring.header().subTail).load(std::memory_order_acquire); }
};

HeldRank holdRank(std::uint32_t world, const std::string& name) {
    HeldRank h;
    h.layout = *Layout::of(world, slotBytesFor(kCap), 1);
    auto regionFd = createSealedMemfd(name + "-region", h.layout.totalBytes());
    REQUIRE(regionFd.ok());
    h.regionFd = std::move(*regionFd);
    auto region = mapShared(h.regionFd.get(), h.layout.totalBytes(), true);
    REQUIRE(region.ok());
    h.region = std::move(*region);
    const RingLayout rl{kEntries};
    auto ringFd = createSealedMemfd(name + "-ring", rl.totalBytes());
    REQUIRE(ringFd.ok());
    h.ringFd = std::move(*ringFd);
    auto ringMap = mapShared(h.ringFd.get(), rl.totalBytes(), true);
    REQUIRE(ringMap.ok());
    h.ringMap = std::move(*ringMap);
    h.ring = RingView(h.ringMap.data(), rl);
    auto& hdr = h.ring.header();
    hdr.magic = kRingMagic;
    hdr.version = kRingVersion;
    hdr.entryBytes = sizeof(Doorbell);
    hdr.entries = kEntries;
    hdr.group = kHandle;
    reinterpret_cast<ControlBlock*>(h.region.data() + h.layout.controlOffset())->missingPeer = kNoPeer;
    return h;
}

std::array<std::uint8_t, 16> nodeIdOf(const Daemon& d) {
    const std::string hex = nlohmann::json::parse(statusJson(d.socket()))["daemon"]["node_id"];
    std::array<std::uint8_t, 16> id{};
    for (std::size_t i = 0; i < 16; ++i) id[i] = std::uint8_t(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
    return id;
}

Adopt adoptOf(const std::array<std::uint8_t, 16>& node, std::uint32_t rank, std::uint32_t world, const Layout& layout) {
    Adopt m;
    std::memset(m.fixed.groupId, 0x5a, 16);
    m.fixed.rank = rank;
    m.fixed.world = world;
    m.fixed.groupHandle = kHandle;
    m.fixed.ringEntries = kEntries;
    m.fixed.agreedCap = kCap;
    m.fixed.slotBytes = slotBytesFor(kCap);
    m.fixed.regionBytes = layout.totalBytes();
    m.fixed.stripes = 1;
    m.fixed.timeoutMs = 10000;
    m.fixed.lostUnixNs = 1;
    for (std::uint32_t r = 0; r < world; ++r) {
        RosterEntry e{};
        std::memcpy(e.nodeId, node.data(), 16);
        e.pid = std::uint32_t(::getpid());
        e.maxBytes = kCap;
        m.roster.push_back(e);
    }
    return m;
}

// A rank's connection: Hello, then Adopt with `fds`.
UniqueFd askAdoption(const Daemon& d, const Adopt& m, std::vector<int> fds) {
    auto fd = connectUnix(d.socket());
    REQUIRE(fd.ok());
    REQUIRE(sendMessage(fd->get(), encode(kHello, 1, Hello{kRoleRank, 0, 0}), {}, 2000).ok());
    auto hello = receiveMessage(fd->get(), kReplySpec, 5000);
    REQUIRE(hello.ok());
    REQUIRE(hello->header.opcode == kHelloReply);
    REQUIRE(sendMessage(fd->get(), encode(2, m), fds, 2000).ok());
    return std::move(*fd);
}

// The daemon's answer: Adopted's error name ("Ok" when re-adopted, with its one fd), or the ErrorReply's.
std::string answerOf(int fd, std::string* reason = nullptr) {
    auto m = receiveMessage(fd, kReplySpec, 15000);
    if (!m) return "no answer: " + m.error().describe();
    if (m->header.opcode == kErrorReply) {
        auto e = decodeFixed<ErrorReply>(m->payload, "ErrorReply");
        REQUIRE(e.ok());
        if (reason) *reason = e->message;
        Errc code;
        errcFromWire(e->errc, code);
        return std::string(errcName(code));
    }
    REQUIRE(m->header.opcode == kAdopted);
    auto a = decodeFixed<Adopted>(m->payload, "Adopted");
    REQUIRE(a.ok());
    if (reason) *reason = a->reason;
    if (a->errc == 0) CHECK(m->fds.size() == 1);
    else CHECK(m->fds.empty());
    Errc code = Errc::Ok;
    errcFromWire(a->errc, code);
    return std::string(errcName(code));
}

bool eventually(const std::function<bool()>& cond) {
    const std::uint64_t deadline = monotonicNs() + 10000000000ull;
    while (!cond()) {
        if (monotonicNs() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
}

} // namespace

TEST_CASE("adopt: the new proxy carries out what the rings and flags show undone (a doorbell taken but not carried out, "
          "one still waiting), and nothing done") {
    Daemon d;
    const auto node = nodeIdOf(d);
    HeldRank r0 = holdRank(2, "tpf-test-r0"), r1 = holdRank(2, "tpf-test-r1");
    // Rank 0's epoch 1 was taken and carried out (rank 1 has its flag; the row
    // there is marked so a second copy would show), its epoch 2 taken but not
    // carried out (rank 1's flag of it is still 0) when the old daemon stopped.
    std::memset(r0.slot(1, 0), 0x11, 64);
    std::memset(r1.slot(1, 0), 0xee, 64);
    r1.setFlag(1, 0, 1);
    std::memset(r0.slot(0, 0), 0x22, 64);
    r0.ringWith({1, 2}, 2, 2);
    // Rank 1's epoch 1 waits in its ring, never taken.
    std::memset(r1.slot(1, 1), 0x33, 64);
    r1.ringWith({1}, 1, 0);

    auto c0 = askAdoption(d, adoptOf(node, 0, 2, r0.layout), {r0.regionFd.get(), r0.ringFd.get()});
    auto c1 = askAdoption(d, adoptOf(node, 1, 2, r1.layout), {r1.regionFd.get(), r1.ringFd.get()});
    INFO("daemon log:\n" << d.log());
    CHECK(answerOf(c0.get()) == "Ok");
    CHECK(answerOf(c1.get()) == "Ok");
    // Rank 0's epoch 2 reached rank 1, rank 1's epoch 1 reached rank 0.
    CHECK(eventually([&] { return r1.flag(0, 0) == 2 && r0.flag(1, 1) == 1; }));
    std::uint8_t want[64];
    std::memset(want, 0x22, 64);
    CHECK(std::memcmp(r1.slot(0, 0), want, 64) == 0);
    std::memset(want, 0x33, 64);
    CHECK(std::memcmp(r0.slot(1, 1), want, 64) == 0);
    // Epoch 1 of rank 0 was done: not copied again; no doorbell taken twice.
    std::memset(want, 0xee, 64);
    CHECK(std::memcmp(r1.slot(1, 0), want, 64) == 0);
    CHECK(r0.tail() == 2);
    CHECK(r1.tail() == 1);
    // The next doorbell of each carries on from there.
    std::memset(r0.slot(1, 0), 0x44, 64);
    r0.ringWith({1, 2, 3}, 3, 2);
    CHECK(eventually([&] { return r1.flag(1, 0) == 3; }));
    std::memset(want, 0x44, 64);
    CHECK(std::memcmp(r1.slot(1, 0), want, 64) == 0);
    auto groups = nlohmann::json::parse(statusJson(d.socket()))["groups"];
    REQUIRE(groups.size() == 1);
    CHECK(groups[0]["state"] == "open");
    CHECK(groups[0]["adoption"]["gap_ms"].is_number());
}

// A Device group on one node: each rank says which peers its kernels reach
// by ipc (they delivered those shards themselves) and its device region; the
// new proxy carries the ring to the others only, as the old one did.
TEST_CASE("adopt: a Device group's ranks say their ipc peers; the new proxy carries out only to the proxy-route peers") {
    Daemon d;
    const auto node = nodeIdOf(d);
    HeldRank r0 = holdRank(3, "tpf-test-d0"), r1 = holdRank(3, "tpf-test-d1"), r2 = holdRank(3, "tpf-test-d2");
    constexpr std::uint64_t kDeviceBytes = 2u << 20;
    // Ranks 0 and 1 reach each other by ipc, rank 2 by the proxy route.
    const auto deviceAdopt = [&](std::uint32_t rank, std::uint32_t ipcPeers, std::uint64_t deviceBytes) {
        Adopt m = adoptOf(node, rank, 3, r0.layout);
        m.fixed.flags = kOpenGpuDoorbells;
        m.fixed.ipcPeers = ipcPeers;
        m.fixed.deviceBytes = deviceBytes;
        return m;
    };
    std::string why;
    {
        INFO("one rank of host buffers among Device ones: refused");
        auto waiting = askAdoption(d, deviceAdopt(1, 1u, kDeviceBytes), {r1.regionFd.get(), r1.ringFd.get()});
        auto c = askAdoption(d, adoptOf(node, 0, 3, r0.layout), {r0.regionFd.get(), r0.ringFd.get()});
        CHECK(answerOf(c.get(), &why) == "GroupMismatch");
        CHECK(why.find("disagrees with the group's other ranks") != std::string::npos);
    } // rank 1 goes: the adoption it waited in is dropped
    REQUIRE(eventually([&] { return nlohmann::json::parse(statusJson(d.socket()))["groups"].empty(); }));
    {
        // Across nodes a Device group is re-adopted as a Host group is (its
        // rows to other nodes go through its host region): here the daemon
        // has no peer link, and says so.
        INFO("a Device group with a rank on another node, on a daemon without peer.listen");
        Adopt m = deviceAdopt(0, 0, 0);
        m.roster[2].nodeId[0] ^= 0xff;
        auto c = askAdoption(d, m, {r0.regionFd.get(), r0.ringFd.get()});
        CHECK(answerOf(c.get(), &why) == "Unavailable");
        CHECK(why.find("set peer.listen") != std::string::npos);
    }
    // Rank 0's epoch 1 was taken by the old proxy and carried to nobody: its
    // kernel had delivered it to rank 1 by ipc (rank 1's host copy stays
    // marked), rank 2 never got it.
    std::memset(r0.slot(1, 0), 0x55, 64);
    std::memset(r1.slot(1, 0), 0xee, 64);
    r0.ringWith({1}, 1, 1);
    auto c0 = askAdoption(d, deviceAdopt(0, 2u, kDeviceBytes), {r0.regionFd.get(), r0.ringFd.get()});
    auto c1 = askAdoption(d, deviceAdopt(1, 1u, kDeviceBytes), {r1.regionFd.get(), r1.ringFd.get()});
    auto c2 = askAdoption(d, deviceAdopt(2, 0, 0), {r2.regionFd.get(), r2.ringFd.get()});
    INFO("daemon log:\n" << d.log());
    CHECK(answerOf(c0.get()) == "Ok");
    CHECK(answerOf(c1.get()) == "Ok");
    CHECK(answerOf(c2.get()) == "Ok");
    CHECK(eventually([&] { return r2.flag(1, 0) == 1; }));
    std::uint8_t want[64];
    std::memset(want, 0x55, 64);
    CHECK(std::memcmp(r2.slot(1, 0), want, 64) == 0);
    std::memset(want, 0xee, 64);
    CHECK(std::memcmp(r1.slot(1, 0), want, 64) == 0);
    CHECK(r1.flag(1, 0) == 0);
    CHECK(d.log().find("had not reached rank 2") != std::string::npos);
    CHECK(d.log().find("had not reached rank 1") == std::string::npos);
    // Rank 1's next doorbell (epoch 1) goes to rank 2 only.
    std::memset(r1.slot(1, 1), 0x66, 64);
    r1.ringWith({1}, 1, 0);
    CHECK(eventually([&] { return r2.flag(1, 1) == 1; }));
    CHECK(r0.flag(1, 1) == 0);
    const auto doc = nlohmann::json::parse(statusJson(d.socket()));
    REQUIRE(doc["groups"].size() == 1);
    const auto& g = doc["groups"][0];
    CHECK(g["buffers"] == "device");
    CHECK(g["adoption"]["gap_ms"].is_number());
    CHECK(g["ranks"][0]["routes"] == nlohmann::json::array({"self", "ipc", "proxy"}));
    CHECK(g["ranks"][0]["device_bytes"] == kDeviceBytes);
    CHECK(g["ranks"][2]["routes"] == nlohmann::json::array({"proxy", "proxy", "self"}));
    CHECK(d.log().find("device buffers") != std::string::npos);
    CHECK(d.stop() == 0);
}

TEST_CASE("adopt: hostile or impossible Adopts are refused by name, every waiting rank too, and the daemon serves on") {
    Daemon d;
    const auto node = nodeIdOf(d);
    HeldRank r0 = holdRank(2, "tpf-test-h0"), r1 = holdRank(2, "tpf-test-h1");
    std::string why;
    {
        INFO("one fd instead of two");
        auto c = askAdoption(d, adoptOf(node, 0, 2, r0.layout), {r0.regionFd.get()});
        CHECK(answerOf(c.get(), &why) == "BadMessage");
        CHECK(why.find("exactly 2 file descriptors") != std::string::npos);
    }
    {
        INFO("a region fd that is no sealed memfd");
        int pipeFds[2];
        REQUIRE(::pipe(pipeFds) == 0);
        auto c = askAdoption(d, adoptOf(node, 0, 2, r0.layout), {pipeFds[0], r0.ringFd.get()});
        CHECK(answerOf(c.get(), &why) == "BadMessage");
        CHECK(why.find("rank 0's region") != std::string::npos);
        ::close(pipeFds[0]);
        ::close(pipeFds[1]);
    }
    {
        INFO("a ring whose header names another group handle; the rank already waiting is refused too");
        auto waiting = askAdoption(d, adoptOf(node, 1, 2, r1.layout), {r1.regionFd.get(), r1.ringFd.get()});
        r0.ring.header().group = kHandle + 1;
        auto c = askAdoption(d, adoptOf(node, 0, 2, r0.layout), {r0.regionFd.get(), r0.ringFd.get()});
        CHECK(answerOf(c.get(), &why) == "BadMessage");
        CHECK(why.find("rank 0's ring") != std::string::npos);
        CHECK(answerOf(waiting.get(), &why) == "BadMessage");
        CHECK(why.find("rank 0's ring") != std::string::npos);
        r0.ring.header().group = kHandle;
    }
    {
        INFO("a rank on another node, and this daemon has no peer link to bring the group back over");
        Adopt m = adoptOf(node, 0, 2, r0.layout);
        m.roster[1].nodeId[0] ^= 0xff;
        auto c = askAdoption(d, m, {r0.regionFd.get(), r0.ringFd.get()});
        CHECK(answerOf(c.get(), &why) == "Unavailable");
        CHECK(why.find("no peer link") != std::string::npos);
    }
    {
        INFO("a group that broke before the restart");
        auto* c0 = reinterpret_cast<ControlBlock*>(r0.region.data() + r0.layout.controlOffset());
        c0->error = std::uint32_t(Errc::PeerLost);
        c0->missingPeer = 1;
        auto waiting = askAdoption(d, adoptOf(node, 1, 2, r1.layout), {r1.regionFd.get(), r1.ringFd.get()});
        auto c = askAdoption(d, adoptOf(node, 0, 2, r0.layout), {r0.regionFd.get(), r0.ringFd.get()});
        CHECK(answerOf(c.get(), &why) == "PeerLost");
        CHECK(why.find("had broken before the restart") != std::string::npos);
        CHECK(answerOf(waiting.get()) == "PeerLost");
        c0->error = 0;
        c0->missingPeer = kNoPeer;
    }
    {
        INFO("a rank that never asks: the one that did is refused when the adoption times out");
        Adopt m = adoptOf(node, 0, 2, r0.layout);
        m.fixed.timeoutMs = 300;
        auto c = askAdoption(d, m, {r0.regionFd.get(), r0.ringFd.get()});
        CHECK(answerOf(c.get(), &why) == "Timeout");
        CHECK(why.find("rank 1 did not ask to be re-adopted in time") != std::string::npos);
    }
    {
        INFO("a rank whose connection closes while another waits (W = 3): the other is refused, told why");
        HeldRank q1 = holdRank(3, "tpf-test-q1"), q2 = holdRank(3, "tpf-test-q2");
        auto waiting = askAdoption(d, adoptOf(node, 1, 3, q1.layout), {q1.regionFd.get(), q1.ringFd.get()});
        {
            auto leaver = askAdoption(d, adoptOf(node, 2, 3, q2.layout), {q2.regionFd.get(), q2.ringFd.get()});
            // Both asked (the daemon logs each); rank 0 never does. Rank 2's process goes.
            REQUIRE(eventually([&] { return d.log().find("rank 2 (pid") != std::string::npos; }));
        }
        CHECK(answerOf(waiting.get(), &why) == "PeerLost");
        CHECK(why.find("rank 2 left before every rank was re-adopted") != std::string::npos);
    }
    {
        INFO("from a control client");
        auto fd = connectUnix(d.socket());
        REQUIRE(fd.ok());
        REQUIRE(sendMessage(fd->get(), encode(kHello, 1, Hello{kRoleControl, 0, 0}), {}, 2000).ok());
        REQUIRE(receiveMessage(fd->get(), kReplySpec, 5000).ok());
        REQUIRE(sendMessage(fd->get(), encode(2, adoptOf(node, 0, 2, r0.layout)), {}, 2000).ok());
        CHECK(answerOf(fd->get()) == "PermissionDenied");
    }
    // Still serving: no group left behind, and a real group opens and runs.
    CHECK(nlohmann::json::parse(statusJson(d.socket()))["groups"].empty());
    auto run = startRanks(d, 2, {"--iters", "200", "--sizes", "64,4096", "--mode", "mixed"});
    REQUIRE(waitAll({&run.ranks[0], &run.ranks[1]}, 120000));
    for (std::uint32_t r = 0; r < 2; ++r) CHECK(run.line(r) == "RESULT rank=" + std::to_string(r) + " ok calls=200");
    CHECK(d.stop() == 0);
}

TEST_CASE("adopt: an open (GroupOpen) of a group being re-adopted is refused by name; the adoption goes on") {
    Daemon d;
    const auto node = nodeIdOf(d);
    HeldRank r0 = holdRank(2, "tpf-test-j0"), r1 = holdRank(2, "tpf-test-j1");
    auto c0 = askAdoption(d, adoptOf(node, 0, 2, r0.layout), {r0.regionFd.get(), r0.ringFd.get()});
    // The same id, the same roster, as an ordinary open of rank 1.
    const Adopt as = adoptOf(node, 1, 2, r1.layout);
    GroupOpen open;
    std::memcpy(open.fixed.groupId, as.fixed.groupId, 16);
    open.fixed.rank = 1;
    open.fixed.world = 2;
    open.fixed.maxBytes = kCap;
    open.fixed.timeoutMs = 5000;
    open.fixed.regionKind = kRegionHost;
    open.roster = as.roster;
    auto j = connectUnix(d.socket());
    REQUIRE(j.ok());
    REQUIRE(sendMessage(j->get(), encode(kHello, 1, Hello{kRoleRank, 0, 0}), {}, 2000).ok());
    REQUIRE(receiveMessage(j->get(), kReplySpec, 5000).ok());
    REQUIRE(sendMessage(j->get(), encode(2, open), {}, 2000).ok());
    auto v = receiveMessage(j->get(), kReplySpec, 5000);
    REQUIRE(v.ok());
    REQUIRE(v->header.opcode == kVerdict);
    auto verdict = decodeFixed<Verdict>(v->payload, "Verdict");
    REQUIRE(verdict.ok());
    CHECK(verdict->errc == std::uint16_t(Errc::GroupMismatch));
    CHECK(std::string(verdict->reason).find("is re-adopted after a daemon restart") != std::string::npos);
    // Rank 1 asks as it should: both are re-adopted.
    auto c1 = askAdoption(d, as, {r1.regionFd.get(), r1.ringFd.get()});
    CHECK(answerOf(c0.get()) == "Ok");
    CHECK(answerOf(c1.get()) == "Ok");
}
