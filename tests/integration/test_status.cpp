// tpfabricctl status --json shows the group, its ranks and its counters;
// SIGTERM stops the daemon cleanly (socket removed). Device groups: each
// rank's DeviceAttach (its GPU wires and device region) shows in status and
// decides whether the proxy polls its ring; bad reports are refused by name.
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "catch.hpp"
#include "common/shm.hpp"
#include "common/unix_socket.hpp"
#include "harness.hpp"
#include "proto/client_msg.hpp"
#include "proto/ring.hpp"

using namespace tpf::testing;

TEST_CASE("status --json shows the group and its counters; SIGTERM removes the socket") {
    Daemon d;
    auto run = startRanks(d, 3, {"--iters", "500", "--sizes", "4096", "--hold-ms", "4000"});
    // Wait until every rank finished its calls and holds the group open.
    nlohmann::json doc;
    for (int i = 0; i < 300; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        doc = nlohmann::json::parse(statusJson(d.socket()));
        if (!doc["groups"].empty() && doc["groups"][0]["calls"].get<std::uint64_t>() == 3 * 500) break;
    }
    INFO(doc.dump(2));
    REQUIRE(doc["groups"].size() == 1);
    const auto& g = doc["groups"][0];
    CHECK(g["world"] == 3);
    CHECK(g["state"] == "open");
    CHECK(g["agreed_cap"] == 65536);
    CHECK(g["calls"] == 1500);
    CHECK(g["bytes"] == 1500ull * 4096);
    CHECK(g["errors"] == 0);
    CHECK(g["latency_us"]["p50"].get<double>() > 0.0);
    CHECK(g["latency_us"]["p99"].get<double>() >= g["latency_us"]["p50"].get<double>());
    REQUIRE(g["ranks"].size() == 3);
    for (std::uint32_t r = 0; r < 3; ++r) {
        CHECK(g["ranks"][r]["pid"] == run.ranks[r].pid);
        CHECK(g["ranks"][r]["route"] == "shm");
        CHECK(g["ranks"][r]["host_direct"] == true); // TPF_HOST_DIRECT's default
    }
    CHECK(doc["regions"]["count"] == 3);
    CHECK(doc["hcas"].is_array());
    // No HCA here (no RDMA in this kernel, or a build without verbs): status says why, not only "none".
    if (doc["hcas"].empty()) CHECK_FALSE(doc["hcas_none_reason"].get<std::string>().empty());
    else CHECK(doc["hcas_none_reason"] == "");

    // The same through tpfabricctl, as an operator would see it.
    Child ctl = spawn({envPath("TPF_CTL"), "status", "--json", "--socket", d.socket()});
    REQUIRE(waitAll({&ctl}, 10000));
    CHECK(exitCode(ctl) == 0);
    auto viaCtl = nlohmann::json::parse(ctl.output);
    CHECK(viaCtl["groups"][0]["calls"] == 1500);
    Child human = spawn({envPath("TPF_CTL"), "status", "--socket", d.socket()});
    REQUIRE(waitAll({&human}, 10000));
    CHECK(exitCode(human) == 0);
    CHECK(human.output.find(g["id"].get<std::string>().substr(0, 12)) != std::string::npos);
    if (doc["hcas"].empty())
        CHECK(human.output.find("HCAs: none (" + doc["hcas_none_reason"].get<std::string>()) != std::string::npos);

    std::vector<Child*> all;
    for (auto& c : run.ranks) all.push_back(&c);
    REQUIRE(waitAll(all, 30000));
    CHECK(d.stop() == 0);
    struct stat st;
    CHECK(::stat(d.socket().c_str(), &st) != 0);
}

TEST_CASE("tpfabricctl status without a daemon: exit 1 and one line naming the socket") {
    Child ctl = spawn({envPath("TPF_CTL"), "status", "--socket", "/nonexistent/tpfabricd.sock"});
    REQUIRE(waitAll({&ctl}, 10000));
    CHECK(exitCode(ctl) == 1);
}

// ---- Device groups: DeviceAttach ------------------------------------------
// No GPU here: the ranks are raw clients of the real daemon that open a group
// as libtpfabric does for device buffers (kOpenGpuDoorbells) and send the
// report client/gpu_open.cpp sends once its GPU attach is done. The daemon
// cannot tell them from libtpfabric ranks.
namespace {

using namespace tpf;
using namespace tpf::client_proto;

struct RawRank {
    UniqueFd fd;
    std::uint32_t seq = 1;
    Verdict verdict{};
    std::vector<UniqueFd> fds; ///< region, ring, proxy eventfd
};

Message expectReply(RawRank& r, std::uint16_t opcode) {
    auto m = receiveMessage(r.fd.get(), kReplySpec, 10000);
    REQUIRE(m.ok());
    REQUIRE(m->header.opcode == opcode);
    return std::move(*m);
}

// W raw ranks of one group (Hello, NodeCard, GroupOpen with `flags`), every verdict ok.
std::vector<RawRank> openRaw(const Daemon& d, std::uint32_t world, std::uint32_t flags) {
    std::vector<RawRank> ranks(world);
    std::uint8_t groupId[16];
    REQUIRE(::getrandom(groupId, sizeof groupId, 0) == sizeof groupId);
    std::vector<RosterEntry> roster(world);
    for (std::uint32_t r = 0; r < world; ++r) {
        auto fd = connectUnix(d.socket());
        REQUIRE(fd.ok());
        ranks[r].fd = std::move(*fd);
        REQUIRE(sendMessage(ranks[r].fd.get(), encode(kHello, ranks[r].seq++, Hello{kRoleRank, 0, 0}), {}, 2000).ok());
        expectReply(ranks[r], kHelloReply);
        REQUIRE(sendMessage(ranks[r].fd.get(), encodeEmpty(kNodeCardRequest, ranks[r].seq++), {}, 2000).ok());
        auto card = decodeNodeCard(expectReply(ranks[r], kNodeCard).payload);
        REQUIRE(card.ok());
        std::memcpy(roster[r].nodeId, card->fixed.nodeId, 16);
        std::memcpy(roster[r].endpointAddr, card->fixed.endpointAddr, 16);
        roster[r].endpointPort = card->fixed.endpointPort;
        roster[r].pid = 1000 + r;
        roster[r].maxBytes = 65536;
    }
    for (std::uint32_t r = 0; r < world; ++r) {
        GroupOpen open;
        std::memcpy(open.fixed.groupId, groupId, 16);
        open.fixed.rank = r;
        open.fixed.world = world;
        open.fixed.maxBytes = 65536;
        open.fixed.timeoutMs = 10000;
        open.fixed.regionKind = kRegionHost;
        open.fixed.flags = flags;
        open.roster = roster;
        REQUIRE(sendMessage(ranks[r].fd.get(), encode(ranks[r].seq++, open), {}, 2000).ok());
    }
    for (auto& rank : ranks) {
        Message m = expectReply(rank, kVerdict);
        auto v = decodeFixed<Verdict>(m.payload, "Verdict");
        REQUIRE(v.ok());
        REQUIRE(v->errc == 0);
        REQUIRE(m.fds.size() == kVerdictFds);
        rank.verdict = *v;
        rank.fds = std::move(m.fds);
    }
    return ranks;
}

// The report rank r of `ranks` would send with these wires (Wire per rank) and device bytes.
DeviceAttach attachOf(const RawRank& r, std::initializer_list<std::uint8_t> wires, std::uint64_t deviceBytes) {
    DeviceAttach m{};
    m.group = r.verdict.groupHandle;
    m.rank = r.verdict.rank;
    m.world = r.verdict.world;
    m.deviceBytes = deviceBytes;
    std::copy(wires.begin(), wires.end(), m.wires);
    return m;
}

void send(RawRank& r, const DeviceAttach& m) {
    REQUIRE(sendMessage(r.fd.get(), encode(kDeviceAttach, r.seq++, m), {}, 2000).ok());
}

// The daemon's answer to a refused request: its ErrorReply's error name, then it closes.
std::string refusal(RawRank& r) {
    auto m = receiveMessage(r.fd.get(), kReplySpec, 10000);
    // A rank whose group another rank's refusal broke is told why first (GroupFailed).
    while (m && m->header.opcode == kGroupFailed) m = receiveMessage(r.fd.get(), kReplySpec, 10000);
    if (!m) return "no answer: " + m.error().describe();
    if (m->header.opcode != kErrorReply) return "opcode " + std::to_string(m->header.opcode);
    auto e = decodeFixed<ErrorReply>(m->payload, "ErrorReply");
    REQUIRE(e.ok());
    CHECK(receiveMessage(r.fd.get(), kReplySpec, 10000).code() == Errc::DaemonLost); // closed after it
    Errc code = Errc::Ok;
    errcFromWire(e->errc, code);
    return std::string(errcName(code));
}

// Status until `done(doc)`, at most 10 s (the daemon handles each message as it arrives).
nlohmann::json statusWhen(const Daemon& d, const std::function<bool(const nlohmann::json&)>& done) {
    nlohmann::json doc;
    for (int i = 0; i < 500; ++i) {
        doc = nlohmann::json::parse(statusJson(d.socket()));
        if (done(doc)) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return doc;
}

const nlohmann::json& onlyGroup(const nlohmann::json& doc) {
    REQUIRE(doc["groups"].size() == 1);
    return doc["groups"][0];
}

} // namespace

TEST_CASE("status shows a Device group's reported routes and device region; the proxy polls only proxy-route rings") {
    Daemon d;
    auto ipc = openRaw(d, 2, kOpenGpuDoorbells);
    {
        // Before the reports the kernels may ring (the load-time probe runs then): the proxy polls
        // (once it took the new table: it may still be asleep when the verdicts arrive).
        const auto doc = statusWhen(d, [](const nlohmann::json& s) { return s["daemon"]["proxy"]["state"] == "polling"; });
        INFO(doc.dump(2));
        const auto& g = onlyGroup(doc);
        CHECK(g["buffers"] == "device");
        CHECK(g["proxy_polls"] == true);
        CHECK(g["ranks"][0]["route"] == "shm");
        CHECK(g["ranks"][0]["routes"].is_null());
        CHECK(g["ranks"][0]["device_bytes"].is_null());
        CHECK(g["ranks"][0]["host_direct"].is_null()); // host groups only
        CHECK(doc["daemon"]["proxy"]["state"] == "polling");
        CHECK(doc["regions"]["device_bytes"] == 0);
    }
    constexpr std::uint64_t kRegion = 4ull << 20;
    send(ipc[0], attachOf(ipc[0], {kWireSelf, kWireIpc}, kRegion));
    send(ipc[1], attachOf(ipc[1], {kWireIpc, kWireSelf}, kRegion + 2 * 1024 * 1024));
    // Ipc only: nothing rings the proxy; it goes to sleep (proxy.spin_us after its last work).
    auto doc = statusWhen(d, [](const nlohmann::json& s) {
        return !s["groups"][0]["ranks"][1]["routes"].is_null() && s["daemon"]["proxy"]["state"] == "sleeping";
    });
    {
        INFO(doc.dump(2));
        const auto& g = onlyGroup(doc);
        CHECK(g["proxy_polls"] == false);
        CHECK(doc["daemon"]["proxy"]["state"] == "sleeping");
        for (std::uint32_t r = 0; r < 2; ++r) {
            CHECK(g["ranks"][r]["route"] == "ipc");
            CHECK(g["ranks"][r]["routes"] == (r == 0 ? nlohmann::json{"self", "ipc"} : nlohmann::json{"ipc", "self"}));
        }
        CHECK(g["ranks"][0]["device_bytes"] == kRegion);
        CHECK(g["ranks"][1]["device_bytes"] == kRegion + 2 * 1024 * 1024);
        CHECK(doc["regions"]["device_bytes"] == 2 * kRegion + 2 * 1024 * 1024);
    }
    Child human = spawn({envPath("TPF_CTL"), "status", "--socket", d.socket()});
    REQUIRE(waitAll({&human}, 10000));
    CHECK(exitCode(human) == 0);
    INFO(human.output);
    CHECK(human.output.find("device buffers, agreed cap") != std::string::npos);
    CHECK(human.output.find("PEER ROUTES") != std::string::npos);
    CHECK(human.output.find(" 1:ipc ") != std::string::npos);
    CHECK(human.output.find("device 10.0MiB") != std::string::npos);

    // A proxy-route Device group beside it: its kernels ring the proxy, which
    // polls and keeps beating into its rings every millisecond (the kernels'
    // DaemonLost watch reads the beat).
    auto proxied = openRaw(d, 2, kOpenGpuDoorbells);
    send(proxied[0], attachOf(proxied[0], {kWireSelf, kWireShm}, 0));
    send(proxied[1], attachOf(proxied[1], {kWireShm, kWireSelf}, 0));
    // (As above: the proxy, asleep since the ipc group's reports, may not yet
    // have taken the new table when the reports are in.)
    doc = statusWhen(d, [](const nlohmann::json& s) {
        std::size_t reported = 0;
        for (const auto& g : s["groups"])
            for (const auto& r : g["ranks"]) reported += !r["routes"].is_null();
        return reported == 4 && s["daemon"]["proxy"]["state"] == "polling";
    });
    INFO(doc.dump(2));
    REQUIRE(doc["groups"].size() == 2);
    for (const auto& g : doc["groups"]) {
        const bool proxy = g["ranks"][0]["routes"][1] == "proxy";
        CHECK(g["proxy_polls"] == proxy);
        CHECK(g["ranks"][1]["route"] == (proxy ? "proxy" : "ipc"));
    }
    CHECK(doc["daemon"]["proxy"]["state"] == "polling");
    auto ring = mapShared(proxied[0].fds[1].get(), RingLayout{proxied[0].verdict.ringEntries}.totalBytes(), true);
    REQUIRE(ring.ok());
    const auto beat = [&] {
        return std::atomic_ref(reinterpret_cast<RingHeader*>(ring->data())->heartbeatNs).load(std::memory_order_relaxed);
    };
    const std::uint64_t first = beat();
    std::uint64_t later = first;
    for (int i = 0; i < 500 && later == first; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        later = beat();
    }
    CHECK(later > first);

    // A doorbell of rank 0 in each group (as its kernel would ring it): the
    // proxy carries it to a proxy-route peer (copy and flag in its host
    // region), not to an ipc peer (the kernel stored it there itself).
    const auto ring0 = [&](std::vector<RawRank>& g, std::uint64_t doorbellsBefore) {
        auto region = mapShared(g[0].fds[0].get(), g[0].verdict.regionBytes, true);
        auto peer = mapShared(g[1].fds[0].get(), g[1].verdict.regionBytes, true);
        auto rm = mapShared(g[0].fds[1].get(), RingLayout{g[0].verdict.ringEntries}.totalBytes(), true);
        REQUIRE((region.ok() && peer.ok() && rm.ok()));
        const auto layout = Layout::of(2, g[0].verdict.slotBytes, g[0].verdict.stripes);
        REQUIRE(layout.ok());
        std::memset(region->data() + layout->slotOffset(phaseOf(1), 0), 0x5a, 16);
        RingView view(rm->data(), RingLayout{g[0].verdict.ringEntries});
        REQUIRE(view.push(Doorbell{1, 16, g[0].verdict.groupHandle}));
        const std::uint64_t one = 1;
        REQUIRE(::write(g[0].fds[2].get(), &one, sizeof one) == sizeof one);
        const auto s = statusWhen(d, [&](const nlohmann::json& j) {
            return j["daemon"]["proxy"]["doorbells"].get<std::uint64_t>() > doorbellsBefore;
        });
        REQUIRE(s["daemon"]["proxy"]["doorbells"] == doorbellsBefore + 1); // carried out (or skipped) to its end
        const auto flag = std::atomic_ref(*reinterpret_cast<std::uint64_t*>(peer->data() + layout->flagOffset(phaseOf(1), 0, 0)))
                              .load(std::memory_order_acquire);
        const bool copied = peer->data()[layout->slotOffset(phaseOf(1), 0)] == 0x5a;
        CHECK(flag == (copied ? 1u : 0u));
        return copied;
    };
    const std::uint64_t before = doc["daemon"]["proxy"]["doorbells"].get<std::uint64_t>();
    CHECK(ring0(proxied, before));
    CHECK_FALSE(ring0(ipc, before + 1));

    // The proxy group leaves: the proxy sleeps again with the ipc group still open.
    proxied.clear();
    doc = statusWhen(d, [](const nlohmann::json& s) {
        return s["groups"].size() == 1 && s["daemon"]["proxy"]["state"] == "sleeping";
    });
    CHECK(doc["groups"].size() == 1);
    CHECK(doc["daemon"]["proxy"]["state"] == "sleeping");
    CHECK(d.log().find("ipc only, the proxy does not poll its ring") != std::string::npos);
    CHECK(d.stop() == 0);
}

TEST_CASE("bad DeviceAttach reports are refused by name and logged; the daemon and a reported group carry on") {
    Daemon d;
    auto good = openRaw(d, 2, kOpenGpuDoorbells);
    send(good[0], attachOf(good[0], {kWireSelf, kWireIpc}, 4ull << 20));
    send(good[1], attachOf(good[1], {kWireIpc, kWireSelf}, 4ull << 20));
    {
        auto host = openRaw(d, 2, 0); // a host group's ranks have no GPU wires
        send(host[0], attachOf(host[0], {kWireSelf, kWireShm}, 0));
        CHECK(refusal(host[0]) == "PermissionDenied");
    }
    {
        auto dev = openRaw(d, 2, kOpenGpuDoorbells);
        DeviceAttach m = attachOf(dev[0], {kWireSelf, kWireIpc}, 4ull << 20);
        m.group ^= 0x100; // another group's handle
        send(dev[0], m);
        CHECK(refusal(dev[0]) == "GroupMismatch");
    }
    {
        auto dev = openRaw(d, 2, kOpenGpuDoorbells);
        DeviceAttach m = attachOf(dev[0], {kWireSelf, kWireIpc}, 4ull << 20);
        m.world = 3; // the group has 2 ranks
        m.wires[2] = kWireIpc;
        send(dev[0], m);
        CHECK(refusal(dev[0]) == "GroupMismatch");
        m = attachOf(dev[1], {kWireIpc, kWireSelf}, 4ull << 20);
        m.rank = 0; // another member's rank
        m.wires[0] = kWireSelf;
        m.wires[1] = kWireIpc;
        send(dev[1], m);
        CHECK(refusal(dev[1]) == "GroupMismatch");
    }
    {
        auto dev = openRaw(d, 2, kOpenGpuDoorbells);
        send(dev[0], attachOf(dev[0], {kWireSelf, 9}, 4ull << 20)); // no route 9
        CHECK(refusal(dev[0]) == "OutOfRange");
        send(dev[1], attachOf(dev[1], {kWireVerbs, kWireSelf}, 0)); // rank 0 is on this node
        CHECK(refusal(dev[1]) == "BadMessage");
    }
    {
        auto dev = openRaw(d, 2, kOpenGpuDoorbells);
        send(dev[0], attachOf(dev[0], {kWireSelf, kWireIpc}, 4096)); // smaller than the group's region
        CHECK(refusal(dev[0]) == "BadMessage");
        send(dev[1], attachOf(dev[1], {kWireShm, kWireSelf}, 0));
        send(dev[1], attachOf(dev[1], {kWireShm, kWireSelf}, 0)); // once only
        CHECK(refusal(dev[1]) == "BadMessage");
    }
    {
        // Outside a group, and from a control client.
        RawRank lone;
        auto fd = connectUnix(d.socket());
        REQUIRE(fd.ok());
        lone.fd = std::move(*fd);
        REQUIRE(sendMessage(lone.fd.get(), encode(kHello, 1, Hello{kRoleRank, 0, 0}), {}, 2000).ok());
        expectReply(lone, kHelloReply);
        lone.verdict = good[0].verdict;
        send(lone, attachOf(lone, {kWireSelf, kWireIpc}, 4ull << 20));
        CHECK(refusal(lone) == "PermissionDenied");
        RawRank ctl;
        fd = connectUnix(d.socket());
        REQUIRE(fd.ok());
        ctl.fd = std::move(*fd);
        REQUIRE(sendMessage(ctl.fd.get(), encode(kHello, 1, Hello{kRoleControl, 0, 0}), {}, 2000).ok());
        expectReply(ctl, kHelloReply);
        ctl.verdict = good[0].verdict;
        send(ctl, attachOf(ctl, {kWireSelf, kWireIpc}, 4ull << 20));
        CHECK(refusal(ctl) == "PermissionDenied");
    }
    // The reported group is untouched: open, its wires and region as reported.
    const auto doc = statusWhen(d, [](const nlohmann::json& s) {
        std::size_t open = 0;
        for (const auto& g : s["groups"]) open += g["state"] == "open";
        return open == 1;
    });
    INFO(doc.dump(2));
    std::size_t open = 0;
    for (const auto& g : doc["groups"]) {
        if (g["state"] != "open") continue;
        ++open;
        CHECK(g["ranks"][0]["routes"] == nlohmann::json{"self", "ipc"});
        CHECK(g["ranks"][1]["device_bytes"] == 4ull << 20);
        CHECK(g["proxy_polls"] == false);
    }
    CHECK(open == 1);
    CHECK(doc["regions"]["device_bytes"] == 8ull << 20);
    const std::string log = d.log();
    CHECK(log.find("refused: PermissionDenied: DeviceAttach for group") != std::string::npos);
    CHECK(log.find("refused: GroupMismatch: DeviceAttach for group handle") != std::string::npos);
    CHECK(log.find("refused: OutOfRange: DeviceAttach: route 9 to rank 1") != std::string::npos);
    CHECK(log.find("refused: BadMessage: DeviceAttach: route verbs to rank 0, which is on this node") != std::string::npos);
    CHECK(log.find("refused: BadMessage: second DeviceAttach from rank 1") != std::string::npos);
    CHECK(log.find("refused: PermissionDenied: DeviceAttach from a control client") != std::string::npos);
    CHECK(d.stop() == 0);
}
