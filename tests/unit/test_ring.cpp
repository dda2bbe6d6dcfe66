// Command ring (proto/ring.hpp): layout, wrap-around, full, corrupt heads, and
// one producer thread against one consumer thread.
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "golden.hpp"
#include "proto/ring.hpp"

using namespace tpf;

namespace {
struct Mem {
    explicit Mem(std::uint32_t entries) : layout{entries}, bytes(layout.totalBytes() / 8 + 1) {
        auto& h = view().header();
        h.magic = kRingMagic;
        h.entries = entries;
    }
    RingLayout layout;
    std::vector<std::uint64_t> bytes; // 8-byte aligned backing store
    RingView view() { return RingView(bytes.data(), layout); }
};
} // namespace

TEST_CASE("ring layout") {
    CHECK(RingLayout::validEntries(8));
    CHECK(RingLayout::validEntries(4096));
    CHECK_FALSE(RingLayout::validEntries(4));
    CHECK_FALSE(RingLayout::validEntries(48));
    CHECK_FALSE(RingLayout::validEntries(8192));
    RingLayout l{64};
    CHECK(l.statsOffset() == 512);
    CHECK(l.submissionsOffset() == 512 + 1920);
    CHECK(l.submissionOffset(65) == 512 + 1920 + 16);
    CHECK(l.totalBytes() == 4096); // 512 + 1920 + 64 * 16 = 3456, page-rounded
    CHECK(RingLayout{4096}.totalBytes() == 512 + 1920 + 4096 * 16 + 1664);
    CHECK(l.submissionsOffset() % 128 == 0);
    // 2: RankStats per op (1: one set for all calls); 3: no completion ring.
    CHECK(kRingVersion == 3);
}

// The header's bytes as the daemon writes them and a rank (and its kernels) reads them.
TEST_CASE("ring header: golden byte image") {
    RingHeader h{};
    h.magic = kRingMagic;
    h.version = kRingVersion;
    h.entryBytes = sizeof(Doorbell);
    h.entries = 64;
    h.group = 7;
    h.subHead = 0x11223344;
    h.subTail = 0x55667788;
    h.proxyIdle = 1;
    h.heartbeatNs = 0x0102030405060708ull;
    std::vector<std::uint8_t> b(sizeof h);
    std::memcpy(b.data(), &h, sizeof h);
    auto at = [&](std::size_t off, std::size_t n) { return hexOf({b.begin() + off, b.begin() + off + n}); };
    CHECK(at(0, 16) == "54524e47" "0300" "1000" "40000000" "07000000"); // magic, version 3, 16 B entries, 64, group 7
    CHECK(at(128, 4) == "44332211");
    CHECK(at(256, 4) == "88776655");
    CHECK(at(384, 16) == "01000000" "00000000" "0807060504030201"); // proxyIdle, reserved, heartbeatNs
    std::size_t nonZero = 0;
    for (auto v : b) nonZero += v != 0;
    CHECK(nonZero == 8 + 4 + 4 + 1 + 8); // nothing else written: no completion indices any more
}

TEST_CASE("rank stats: per-op slots and errors by code at fixed offsets") {
    RankStats s{};
    auto* base = reinterpret_cast<const std::uint8_t*>(&s);
    CHECK(reinterpret_cast<const std::uint8_t*>(&s.ops[kStatsAllGather]) - base == 0);
    CHECK(reinterpret_cast<const std::uint8_t*>(&s.ops[kStatsAllReduceSum]) - base == 384);
    CHECK(reinterpret_cast<const std::uint8_t*>(&s.ops[kStatsAllReduceSum].latencyNs) - base == 384 + 24);
    CHECK(reinterpret_cast<const std::uint8_t*>(&s.ops[kStatsAllReduceSum].latency[0]) - base == 384 + 32);
    CHECK(reinterpret_cast<const std::uint8_t*>(&s.errorsByCode[std::size_t(Errc::PeerLost)]) - base == 1536 + 4 * 8);
    CHECK(kStatsErrcSlots > std::uint32_t(kLastErrc));
    CHECK(std::string(statsOpName(kStatsAllGather)) == "all_gather");
    CHECK(std::string(statsOpName(kStatsAllReduceSum)) == "all_reduce_sum");
    CHECK(std::string(statsOpName(2)) == "all_gather_v");
    CHECK(statsOpName(kStatsOps) == nullptr);
}

TEST_CASE("readStats copies every field of the shared block") {
    RankStats shared{};
    auto* words = reinterpret_cast<std::uint32_t*>(&shared);
    const std::size_t used = offsetof(RankStats, pad) / 4; // everything but the padding
    for (std::size_t i = 0; i < used; ++i) words[i] = std::uint32_t(i * 2654435761u + 1);
    words[offsetof(RankStats, reserved0) / 4] = 0; // reserved: not copied
    const RankStats copy = readStats(shared);
    CHECK(std::memcmp(&copy, &shared, offsetof(RankStats, pad)) == 0);
}

TEST_CASE("ring wraps, refuses when full, detects a corrupt head") {
    Mem m(8);
    auto v = m.view();
    std::uint32_t tail = 0;
    Doorbell d;
    for (std::uint64_t round = 0; round < 5; ++round) {
        for (std::uint32_t i = 0; i < 8; ++i) REQUIRE(v.push({round * 8 + i + 1, i, 3}));
        CHECK_FALSE(v.push({999, 0, 3}));
        for (std::uint32_t i = 0; i < 8; ++i) {
            REQUIRE(v.pop(tail, d) == RingView::Pop::Taken);
            CHECK(d.epoch == round * 8 + i + 1);
            CHECK(d.bytes == i);
        }
        CHECK(v.pop(tail, d) == RingView::Pop::Empty);
    }
    // A client that writes a head more than a ring ahead is caught.
    v.header().subHead = tail + 9;
    CHECK(v.pop(tail, d) == RingView::Pop::Corrupt);
}

TEST_CASE("one producer, one consumer thread: every doorbell once, in order") {
    Mem m(16);
    auto v = m.view();
    constexpr std::uint64_t n = 200000;
    std::thread producer([&] {
        for (std::uint64_t e = 1; e <= n; ++e)
            while (!v.push({e, std::uint32_t(e), 1})) std::this_thread::yield();
    });
    std::uint32_t tail = 0;
    Doorbell d;
    std::uint64_t next = 1;
    while (next <= n) {
        auto r = v.pop(tail, d);
        REQUIRE(r != RingView::Pop::Corrupt);
        if (r == RingView::Pop::Empty) {
            std::this_thread::yield();
            continue;
        }
        REQUIRE(d.epoch == next);
        REQUIRE(d.bytes == std::uint32_t(next));
        ++next;
    }
    producer.join();
}

TEST_CASE("latency buckets: monotone, 4 per power of two, floors invert them") {
    CHECK(latencyBucket(0) == 0);
    CHECK(latencyBucket(255) == 0);
    CHECK(latencyBucket(256) == 0);
    CHECK(latencyBucket(320) == 1);
    CHECK(latencyBucket(512) == 4);
    CHECK(latencyBucket(1000) == 7);
    CHECK(latencyBucket(~0ull) == kLatencyBuckets - 1);
    CHECK(latencyBucketFloor(kLatencyBuckets - 1) > 900000000ull);
    std::uint32_t prev = 0;
    for (std::uint64_t ns = 1; ns < (1ull << 36); ns = ns * 17 / 16 + 1) {
        const auto b = latencyBucket(ns);
        REQUIRE(b >= prev);
        prev = b;
        if (b > 0 && b + 1 < kLatencyBuckets) {
            REQUIRE(latencyBucketFloor(b) <= ns);
            REQUIRE(ns < latencyBucketFloor(b + 1));
        }
    }
}
