// Layout invariants, peerAt, stripes and caps (proto/layout.hpp).
#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "catch.hpp"
#include "golden.hpp"
#include "proto/layout.hpp"

using namespace tpf;

namespace {
struct Range {
    std::uint64_t begin, end;
    const char* what;
};

std::vector<Range> rangesOf(const Layout& l) {
    std::vector<Range> rs;
    for (std::uint32_t p = 0; p < 2; ++p)
        for (std::uint32_t s = 0; s < l.world; ++s) {
            rs.push_back({l.slotOffset(p, s), l.slotOffset(p, s) + l.slotBytes, "slot"});
            for (std::uint32_t k = 0; k < l.stripes; ++k)
                rs.push_back({l.flagOffset(p, s, k), l.flagOffset(p, s, k) + kFlagLine, "flag"});
        }
    rs.push_back({l.controlOffset(), l.controlOffset() + sizeof(ControlBlock), "control"});
    return rs;
}
} // namespace

TEST_CASE("layout: no overlap, alignment, phases disjoint, exact total for every world") {
    const std::uint64_t slots[] = {4096, 8192, 3 * 4096, 64 * 1024, 512 * 1024, 1 << 20};
    for (std::uint32_t world = 2; world <= kMaxWorld; ++world)
        for (auto slot : slots)
            for (std::uint32_t stripes : {1u, 2u, 3u, 4u, 8u}) {
                auto r = Layout::of(world, slot, stripes);
                REQUIRE(r.ok());
                const Layout l = r.value();
                auto rs = rangesOf(l);
                std::sort(rs.begin(), rs.end(), [](auto& a, auto& b) { return a.begin < b.begin; });
                for (std::size_t i = 1; i < rs.size(); ++i) REQUIRE(rs[i - 1].end <= rs[i].begin);
                REQUIRE(rs.back().end <= l.totalBytes());
                for (std::uint32_t p = 0; p < 2; ++p)
                    for (std::uint32_t s = 0; s < world; ++s) {
                        REQUIRE(l.slotOffset(p, s) % kSlotAlign == 0);
                        for (std::uint32_t k = 0; k < stripes; ++k) REQUIRE(l.flagOffset(p, s, k) % kFlagLine == 0);
                    }
                REQUIRE(l.controlOffset() % kFlagLine == 0);
                // Phase 0 and phase 1 occupy disjoint ranges: every phase-0 slot ends before any phase-1 slot.
                REQUIRE(l.slotOffset(0, world - 1) + slot <= l.slotOffset(1, 0));
                REQUIRE(l.flagOffset(0, world - 1, stripes - 1) + kFlagLine <= l.flagOffset(1, 0, 0));
                // Total: exactly the parts, rounded up to a page.
                const std::uint64_t parts = 2ull * world * slot + 2ull * world * stripes * kFlagLine + sizeof(ControlBlock);
                REQUIRE(l.totalBytes() == roundUp(parts, 4096));
                REQUIRE(l.totalBytes() % 4096 == 0);
            }
}

TEST_CASE("layout: refuses what it cannot lay out, by name") {
    CHECK(Layout::of(0, 4096, 1).code() == Errc::OutOfRange);
    CHECK(Layout::of(17, 4096, 1).code() == Errc::OutOfRange);
    CHECK(Layout::of(2, 0, 1).code() == Errc::OutOfRange);
    CHECK(Layout::of(2, 4097, 1).code() == Errc::Misaligned);
    CHECK(Layout::of(2, 4096, 0).code() == Errc::OutOfRange);
    CHECK(Layout::of(2, 4096, 9).code() == Errc::OutOfRange);
    CHECK(Layout::of(2, (1ull << 30) + 8192, 1).code() == Errc::OutOfRange);
    // The top cap (daemon.max_bytes = 1GiB) has a slot: the cap, a header's room, page-rounded.
    CHECK(Layout::of(2, slotBytesFor(1ull << 30), 1).ok());
    CHECK(Layout::of(16, slotBytesFor(kMaxCapBytes), 8).ok());
    CHECK(Layout::of(1, 4096, 1).ok()); // W = 1: the trivial copy still has a layout
}

TEST_CASE("layout: a known offset table (world 4, 8 KiB slots, 2 stripes)") {
    const Layout l = Layout::of(4, 8192, 2).value();
    CHECK(l.slotOffset(0, 0) == 0);
    CHECK(l.slotOffset(0, 3) == 3 * 8192);
    CHECK(l.slotOffset(1, 0) == 4 * 8192);
    CHECK(l.flagsOffset() == 8 * 8192);
    CHECK(l.flagOffset(0, 0, 1) == 8 * 8192 + 128);
    CHECK(l.flagOffset(1, 0, 0) == 8 * 8192 + 8 * 128);
    CHECK(l.controlOffset() == 8 * 8192 + 16 * 128);
    CHECK(l.totalBytes() == 8 * 8192 + 4096);
}

TEST_CASE("layout: a flag's copies lie in its own line, 32 bytes apart, copy 0 the flag") {
    const Layout l = Layout::of(4, 8192, 2).value();
    for (std::uint32_t p = 0; p < 2; ++p)
        for (std::uint32_t s = 0; s < 4; ++s)
            for (std::uint32_t k = 0; k < 2; ++k) {
                const std::uint64_t line = l.flagOffset(p, s, k);
                REQUIRE(l.flagCopyOffset(p, s, k, 0) == line);
                for (std::uint32_t c = 0; c < kFlagCopies; ++c) {
                    const std::uint64_t at = l.flagCopyOffset(p, s, k, c);
                    REQUIRE(at == line + 32 * c);
                    REQUIRE(at % 32 == 0); // a sector of its own: the GPU reads 8 bytes of it
                    REQUIRE(at + sizeof(std::uint64_t) <= line + kFlagLine);
                }
            }
    CHECK(l.flagCopyOffset(0, 0, 1, 3) == 8 * 8192 + 128 + 96);
}

TEST_CASE("peerAt visits every other rank once, starting at self+1") {
    for (std::uint32_t world = 2; world <= kMaxWorld; ++world)
        for (std::uint32_t self = 0; self < world; ++self) {
            std::set<std::uint32_t> seen;
            CHECK(peerAt(self, 0, world) == (self + 1) % world);
            for (std::uint32_t i = 0; i + 1 < world; ++i) {
                auto p = peerAt(self, i, world);
                REQUIRE(p != self);
                REQUIRE(p < world);
                seen.insert(p);
            }
            REQUIRE(seen.size() == world - 1);
        }
}

TEST_CASE("stripes reassemble every size exactly, empty shards included") {
    for (std::uint32_t n = 1; n <= kMaxStripes; ++n)
        for (std::uint64_t bytes = 0; bytes <= 5 * 4096 + 64; bytes += (bytes < 3 * 4096 ? 1 : 61)) {
            std::uint64_t next = 0;
            for (std::uint32_t k = 0; k < n; ++k) {
                const Stripe s = stripeOf(bytes, n, k);
                REQUIRE(s.offset == next); // contiguous, in order
                next += s.bytes;
                // Alignment rule: every stripe that has a successor with bytes ends on a page.
                if (k + 1 < n && stripeOf(bytes, n, k + 1).bytes > 0) REQUIRE((s.offset + s.bytes) % kStripeAlign == 0);
            }
            REQUIRE(next == bytes);
        }
    // Larger sizes split evenly on page boundaries.
    CHECK(stripeOf(512 * 1024, 2, 0).bytes == 256 * 1024);
    CHECK(stripeOf(512 * 1024, 2, 1).offset == 256 * 1024);
    CHECK(stripeOf(6144, 2, 0).bytes == 4096);
    CHECK(stripeOf(6144, 2, 1).bytes == 2048);
    CHECK(stripeOf(0, 4, 3).bytes == 0);
}

TEST_CASE("caps: 511 KiB and 512 KiB agree on 511 KiB; 512 KiB does not fit") {
    const std::uint64_t caps[] = {511 * 1024, 512 * 1024};
    const auto cap = agreedCap(caps, 2);
    CHECK(cap == 511 * 1024);
    // The slot has room for the cap, a RowHeader and a 16-byte rounding, page-rounded.
    CHECK(slotBytesFor(cap) == 512 * 1024);
    CHECK(slotBytesFor(caps[1]) == 516 * 1024);
    CHECK(slotBytesFor(512 * 1024 - 32) == 512 * 1024);
    CHECK(slotBytesFor(512 * 1024 - 31) == 516 * 1024);
    // Both ranks test the same agreed value, not their slot size.
    for (int rank = 0; rank < 2; ++rank) {
        CHECK_FALSE(fits(524288, cap));
        CHECK(fits(511 * 1024, cap));
    }
    CHECK(agreedCap(caps, 0) == 0);
    for (std::uint64_t c : {0ull, 1ull, 100ull, 4096ull, 65520ull, 524288ull}) {
        CHECK(slotBytesFor(c) >= sizeof(RowHeader) + roundUp(c, 16)); // an all-gather-v row of the cap
        CHECK(slotBytesFor(c) % kSlotAlign == 0);
    }
}

TEST_CASE("countsHash tells counts apart and is the same for equal counts") {
    const std::uint64_t a[] = {100, 0, 4096, 7}, b[] = {100, 0, 4096, 8}, c[] = {0, 100, 4096, 7};
    CHECK(countsHash(a, 4) == countsHash(a, 4));
    CHECK(countsHash(a, 4) != countsHash(b, 4));
    CHECK(countsHash(a, 4) != countsHash(c, 4)); // order matters
    CHECK(countsHash(a, 3) != countsHash(a, 4)); // so does the world
    STATIC_REQUIRE(sizeof(RowHeader) == 16);
    CHECK(slotBytesFor(0) == 4096);
    CHECK(slotBytesFor(1) == 4096);
    CHECK(slotBytesFor(4064) == 4096);
    CHECK(slotBytesFor(4065) == 8192);
}

// The control block is shared memory between the daemon, host waits and
// kernels: its bytes are a wire. carriedThrough sits in what was reserved1.
TEST_CASE("control block: golden byte image") {
    ControlBlock c{};
    c.epoch = 0x1112131415161718ull;
    c.error = 0x21222324u;
    c.missingPeer = 0x31323334u;
    c.carriedThrough = 0x4142434445464748ull;
    c.abort = 0x51525354u;
    c.wakeSeq = 0x61626364u;
    c.waiters = 0x71727374u;
    std::vector<std::uint8_t> b(sizeof c);
    std::memcpy(b.data(), &c, sizeof c);
    std::string want = "1817161514131211" + std::string(240, '0') + "2423222134333231" + "4847464544434241" +
                       std::string(224, '0') + "54535251" + std::string(248, '0') + "6463626174737271" +
                       std::string(240, '0');
    CHECK(golden(b, "control") == want);
}
