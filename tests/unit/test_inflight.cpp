// The in-flight cap (docs/design.md, "4. Data path", step 2), driven through
// the daemon's own proxy (daemon/proxy/proxy.cpp, running its thread), its
// shm and verbs transports and the gate (daemon/verbs/inflight.hpp) over the
// NIC of fake_nic.cpp: two local
// ranks of a world-4 group, the other two ranks on another node behind two
// rails, doorbells from both rings, completions that come late and in bursts.
// The NIC counts for itself what is outstanding on each queue pair: no post
// may find the cap already reached (so a queue pair never holds more than
// cap + one payload), nor a full send queue or CQ; every doorbell lands, with
// the bytes its rank staged, on the other node and on the same-node peer.
#include <catch.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "daemon/proxy/proxy.hpp"
#include "daemon/proxy/shm_transport.hpp"
#include "daemon/proxy/verbs_transport.hpp"
#include "daemon/verbs/inflight.hpp"
#include "fake_nic.hpp"
#include "proto/layout.hpp"

using namespace tpf;
using namespace tpf::daemon;
using tpf::testing::fakeNic;

namespace {

/// The proxy's reports, counted: a bad doorbell or a failed peer each adds one.
struct CountedReports final : ProxyEvents {
    std::atomic<int>& count;
    explicit CountedReports(std::atomic<int>& c) : count(c) {}
    void drained(std::uint64_t) override {}
    void badDoorbell(std::uint32_t, std::uint32_t, Error) override { ++count; }
    void peerFailed(std::uint32_t, std::uint32_t, Error) override { ++count; }
    void resent(std::uint32_t, std::uint32_t, std::uint32_t, std::uint64_t, std::uint64_t) override {}
};

constexpr std::uint32_t kWorld = 4, kRails = 2, kHandle = 7;
constexpr std::uint32_t kLocal[] = {0, 1}, kRemote[] = {2, 3};

std::uint8_t staged(std::uint64_t epoch, std::uint32_t src, std::uint64_t offset) {
    return std::uint8_t(epoch * 131 + src * 29 + offset * 7 + (offset >> 8));
}

/// The other node's regions, as its NIC would land writes in them.
struct RemoteRegion {
    explicit RemoteRegion(std::uint64_t bytes) : words(bytes / 8 + 1) {}
    std::uint8_t* data() { return reinterpret_cast<std::uint8_t*>(words.data()); }
    std::vector<std::uint64_t> words;
};

struct Scenario {
    std::uint64_t cap;        ///< in-flight bytes per queue pair
    std::uint32_t maxWrs;     ///< send queue depth
    std::uint32_t cqDepth;    ///< per HCA
    std::uint64_t agreedCap;  ///< largest shard
    std::uint32_t maxPerPoll; ///< completions per poll, at most
    std::uint64_t epochs;
};

void run(const Scenario& sc) {
    testing::resetFakeNic();
    fakeNic().maxPerPoll = sc.maxPerPoll;
    fakeNic().expected = staged;
    auto layout = Layout::of(kWorld, slotBytesFor(sc.agreedCap), kRails);
    REQUIRE(layout.ok());

    std::vector<std::shared_ptr<VerbsHca>> hcas;
    for (std::uint32_t k = 0; k < kRails; ++k) {
        client_proto::HcaCard card{};
        setText(card.device, "fake" + std::to_string(k));
        hcas.push_back(*VerbsHca::open(card, sc.cqDepth));
    }
    auto group = std::make_shared<ProxyGroup>();
    group->handle = kHandle;
    group->world = kWorld;
    group->layout = *layout;
    group->agreedCap = sc.agreedCap;
    std::vector<std::shared_ptr<CommandRing>> rings;
    for (std::uint32_t r : kLocal) {
        auto region = HostRegion::create(*layout, "tpf-test-inflight-r" + std::to_string(r));
        auto ring = CommandRing::create(16, kHandle, "tpf-test-inflight-ring" + std::to_string(r));
        REQUIRE(region.ok());
        REQUIRE(ring.ok());
        group->regions[r] = *region;
        rings.push_back(*ring);
        group->wires[r] = kWireShm;
    }
    std::vector<RemoteRegion> remote;
    for (std::uint32_t r : kRemote) {
        remote.emplace_back(layout->totalBytes());
        group->wires[r] = kWireVerbs;
    }
    auto wire = std::make_shared<VerbsGroup>();
    wire->world = kWorld;
    wire->hcas = kRails;
    wire->links = QpTable<std::shared_ptr<QpLink>>(kWorld, kRails);
    for (std::uint32_t l : kLocal)
        for (std::uint32_t i = 0; i < 2; ++i)
            for (std::uint32_t k = 0; k < kRails; ++k) {
                auto qp = QpLink::create(hcas[k], sc.maxWrs, sc.cap);
                REQUIRE(qp.ok());
                (*qp)->groupHandle = kHandle;
                (*qp)->localRank = l;
                (*qp)->remoteRank = kRemote[i];
                (*qp)->rail = k;
                (*qp)->localBase = group->regions[l]->map.data();
                RemoteQp rq;
                rq.regionAddr = reinterpret_cast<std::uintptr_t>(remote[i].data());
                REQUIRE((*qp)->connect(rq).ok());
                wire->links.at(l, kRemote[i], k) = std::move(*qp);
            }
    group->verbs = wire;

    std::atomic<int> reports{0};
    ProxyOptions options;
    options.carryThreads = 2; // same-node copies through the carry threads too
    CountedReports events(reports);
    Proxy proxy(options, events);
    proxy.setHcas(hcas);
    REQUIRE(proxy.start().ok());
    std::vector<ProxyRank> table;
    for (std::uint32_t i = 0; i < 2; ++i) {
        // The transports as GroupTable::publishProxyTable chooses them: shm to the same-node rank, verbs to the others.
        ProxyRank pr{group, kLocal[i], rings[i]};
        for (std::uint32_t j = 0; j + 1 < kWorld; ++j) {
            const std::uint32_t q = peerAt(kLocal[i], j, kWorld);
            if (group->wires[q] == kWireShm)
                pr.addPeer(q, std::make_shared<ShmTransport>(*layout, kLocal[i], group->regions[kLocal[i]], group->regions[q]));
            else
                pr.addPeer(q, std::make_shared<VerbsTransport>(*layout, kLocal[i], q, wire));
        }
        table.push_back(std::move(pr));
    }
    proxy.publish(table, 1);

    // Where epoch e of rank src lands: the other node's regions, and the same-node peer's.
    const auto landed = [&](std::uint64_t e, std::uint32_t src) {
        const std::uint32_t p = phaseOf(e);
        for (auto& rr : remote)
            for (std::uint32_t k = 0; k < kRails; ++k) {
                auto* f = reinterpret_cast<std::uint64_t*>(rr.data() + layout->flagOffset(p, src, k));
                if (std::atomic_ref(*f).load(std::memory_order_acquire) < e) return false;
            }
        const HostRegion& peer = *group->regions[src == 0 ? 1 : 0];
        for (std::uint32_t k = 0; k < kRails; ++k)
            if (std::atomic_ref(*peer.flag(p, src, k)).load(std::memory_order_acquire) < e) return false;
        return true;
    };
    // The ranks: stage, ring, and reuse a slot only once its epoch landed everywhere (as peers' flags say in a group).
    std::mt19937_64 rng(11);
    std::vector<std::uint64_t> sizes(sc.epochs + 1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (std::uint64_t e = 1; e <= sc.epochs; ++e) {
        sizes[e] = 1 + rng() % sc.agreedCap;
        for (std::uint32_t i = 0; i < 2; ++i) {
            const std::uint32_t r = kLocal[i];
            while (e > 2 && !landed(e - 2, r)) {
                REQUIRE(std::chrono::steady_clock::now() < deadline);
                std::this_thread::yield();
            }
            std::uint8_t* slot = group->regions[r]->slot(phaseOf(e), r);
            for (std::uint64_t b = 0; b < sizes[e]; ++b) slot[b] = staged(e, r, b);
            while (!rings[i]->view.push(Doorbell{e, std::uint32_t(sizes[e]), kHandle})) std::this_thread::yield();
            if (rings[i]->view.proxyNeedsWake()) proxy.wake();
        }
    }
    for (std::uint32_t r : kLocal)
        while (!landed(sc.epochs, r) || !landed(sc.epochs - 1, r)) {
            REQUIRE(std::chrono::steady_clock::now() < deadline);
            std::this_thread::yield();
        }
    proxy.stop();

    const auto& rep = fakeNic().report;
    INFO("posts " << rep.posts << ", completions " << rep.completions << ", largest outstanding "
                  << rep.largestOutstanding << ", largest post " << rep.largestPost);
    for (const auto& n : rep.notes) INFO(n);
    CHECK(reports == 0);
    CHECK(rep.capExceeded == 0);
    CHECK(rep.sendQueueFull == 0);
    CHECK(rep.cqOverrun == 0);
    CHECK(rep.wrongBytes == 0);
    CHECK(rep.largestOutstanding < sc.cap + rep.largestPost);
    CHECK(rep.posts == sc.epochs * 2 * 2 * kRails); // every doorbell, to both remote ranks, on both rails
    // The last two epochs' rows, byte for byte, where they landed.
    for (std::uint64_t e : {sc.epochs - 1, sc.epochs})
        for (std::uint32_t src : kLocal) {
            const std::uint64_t at = layout->slotOffset(phaseOf(e), src);
            for (auto& rr : remote)
                for (std::uint64_t b = 0; b < sizes[e]; ++b) REQUIRE(rr.data()[at + b] == staged(e, src, b));
            const std::uint8_t* peer = group->regions[src == 0 ? 1 : 0]->slot(phaseOf(e), src);
            for (std::uint64_t b = 0; b < sizes[e]; ++b) REQUIRE(peer[b] == staged(e, src, b));
        }
}

} // namespace

TEST_CASE("inflight: the proxy keeps every queue pair under its cap, a post at most one payload past it") {
    // A cap below one stripe: every post after the first waits for a completion.
    run({4096, 64, 4096, 64 * 1024, 2, 300});
    // A cap of several stripes, completions in bursts.
    run({48 * 1024, 64, 4096, 64 * 1024, 3, 300});
}

TEST_CASE("inflight: a small send queue and a small CQ bound posts too") {
    run({1 << 30, 4, 4096, 16 * 1024, 1, 300}); // at most two posts of two requests on a QP
    run({1 << 30, 64, 16, 16 * 1024, 1, 300});  // at most 7 flags outstanding on a CQ of 16
}

TEST_CASE("inflight gate: a payload above the cap still goes out alone") {
    InflightGate g(4096, 8);
    CHECK_FALSE(g.mustWait(2));
    g.posted(1 << 20, 2);
    CHECK(g.mustWait(2));
    CHECK(g.retireOldest());
    CHECK_FALSE(g.mustWait(2));
    CHECK(g.highWater() == 1 << 20);
    CHECK_FALSE(g.retireOldest()); // nothing outstanding: nothing retires
}

TEST_CASE("inflight gate: completions retire posts in post order") {
    InflightGate g(1 << 30, 8);
    g.posted(100, 2);
    g.posted(8, 1);
    CHECK(g.bytes() == 108);
    CHECK(g.retireOldest());
    CHECK(g.bytes() == 8);
    CHECK(g.wrs() == 1);
}

TEST_CASE("transports: the proxy carries a doorbell through each peer's transport, none to a direct peer or one gone") {
    // One node, W = 4: rank 0's shard goes by shm to ranks 1 and 3; rank 2
    // reads it itself (direct); rank 3 then closes in order (gone).
    constexpr std::uint32_t kW = 4;
    auto layout = Layout::of(kW, 4096, 1);
    REQUIRE(layout.ok());
    auto group = std::make_shared<ProxyGroup>();
    group->handle = kHandle;
    group->world = kW;
    group->layout = *layout;
    group->agreedCap = 4096;
    for (std::uint32_t r = 0; r < kW; ++r) {
        auto region = HostRegion::create(*layout, "tpf-test-transports-r" + std::to_string(r));
        REQUIRE(region.ok());
        group->regions[r] = *region;
        group->wires[r] = kWireShm;
    }
    auto ring = CommandRing::create(16, kHandle, "tpf-test-transports-ring");
    REQUIRE(ring.ok());
    ProxyRank pr{group, 0, *ring};
    for (std::uint32_t q : {1u, 2u, 3u})
        pr.addPeer(q, q == 2 ? directTransport() : std::make_shared<ShmTransport>(*layout, 0, group->regions[0], group->regions[q]));
    CHECK_FALSE(pr.watchesInbound);
    CHECK_FALSE(pr.inFlight());

    std::atomic<int> reports{0};
    CountedReports events(reports);
    Proxy proxy(ProxyOptions{}, events);
    REQUIRE(proxy.start().ok());
    proxy.publish({pr}, 1);
    const auto flagOf = [&](std::uint32_t dst, std::uint64_t e) {
        return std::atomic_ref(*group->regions[dst]->flag(phaseOf(e), 0, 0)).load(std::memory_order_acquire);
    };
    const auto ringAndWait = [&](std::uint64_t e) {
        std::uint8_t* slot = group->regions[0]->slot(phaseOf(e), 0);
        for (std::uint64_t b = 0; b < 100; ++b) slot[b] = staged(e, 0, b);
        REQUIRE((*ring)->view.push(Doorbell{e, 100, kHandle}));
        proxy.wake();
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (proxy.doorbells() < e) { // counted once every flag of it was released
            REQUIRE(std::chrono::steady_clock::now() < deadline);
            std::this_thread::yield();
        }
    };
    ringAndWait(1);
    CHECK(flagOf(3, 1) == 1);
    CHECK(flagOf(2, 1) == 0); // direct: rank 2 reads rank 0's region itself
    for (std::uint32_t q : {1u, 3u})
        for (std::uint64_t b = 0; b < 100; ++b) REQUIRE(group->regions[q]->slot(1, 0)[b] == staged(1, 0, b));
    CHECK(group->regions[2]->slot(1, 0)[0] == 0);

    group->gone.fetch_or(1u << 3);
    ringAndWait(2);
    CHECK(flagOf(3, 2) == 0); // closed in order: nothing more is carried to it
    CHECK(flagOf(2, 2) == 0);
    proxy.stop();
    CHECK(reports == 0);
    CHECK(proxy.doorbells() == 2);
}
