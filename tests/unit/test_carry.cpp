// The proxy's carry threads (daemon/proxy/carry.cpp): a copy split among the
// proxy and its helpers stores every byte of every part and none beyond,
// streamed or not, at every alignment, for copies back to back whose parts
// a slow helper might still hold; so does a batch of many copies (a poll
// pass's rows), small and large mixed, past the chunks one round holds;
// helpers asleep neither delay a copy nor keep stop() from returning. And the demotion of the carried rows
// (common/stream_copy.hpp demoteLines) changes no byte.
#include <catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common/stream_copy.hpp"
#include "daemon/proxy/carry.hpp"

using namespace tpf::daemon;

namespace {

constexpr std::size_t kGuard = 256;

// The checks go through libc (memset, memcmp): byte loops at -O0 under ASan
// (tests/run.sh) took a minute for this file alone.

/// Index of the first byte where a and b differ (compared by memcmp first), or -1.
std::ptrdiff_t firstDiff(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
    if (std::memcmp(a.data(), b.data(), a.size()) == 0) return -1;
    return std::mismatch(a.begin(), a.end(), b.begin()).first - a.begin();
}

/// n random bytes at p, eight at a time.
void fillRandom(std::uint8_t* p, std::size_t n, std::mt19937_64& rng) {
    for (std::size_t i = 0; i < n; i += 8) {
        const std::uint64_t r = rng();
        std::memcpy(p + i, &r, std::min<std::size_t>(8, n - i));
    }
}

/// Copies n bytes at the given misalignments and checks the destination and
/// the guard bytes around it.
void copyAndCheck(CarryPool& pool, std::size_t n, std::size_t dstOff, std::size_t srcOff, bool stream,
                  std::mt19937_64& rng) {
    static std::vector<std::uint8_t> src, dst, want; // malloc: 16-byte aligned, so dst+0 and dst+16 stream
    src.resize(n + srcOff + kGuard);
    fillRandom(src.data(), src.size(), rng);
    dst.assign(n + dstOff + 2 * kGuard, 0xa5);
    want = dst;
    std::memcpy(want.data() + kGuard + dstOff, src.data() + srcOff, n);
    pool.copy(dst.data() + kGuard + dstOff, src.data() + srcOff, n, stream);
    INFO("bytes " << n << " dst+" << dstOff << " src+" << srcOff << (stream ? " streamed" : ""));
    REQUIRE(firstDiff(dst, want) == -1);
}

const std::size_t kSizes[] = {0,
                              1,
                              63,
                              4096,
                              CarryPool::kSplitMin - 1,
                              CarryPool::kSplitMin,
                              CarryPool::kSplitMin + 1,
                              CarryPool::kSplitMin + 4096 + 17,
                              2 * CarryPool::kSplitMin,
                              200 * 1024 + 48,
                              512 * 1024,
                              (1u << 20) + 3};

} // namespace

TEST_CASE("every byte of every part, none beyond, at every helper count") {
    std::mt19937_64 rng(7);
    for (std::uint32_t helpers : {0u, 1u, 2u, 3u, 16u}) {
        CarryPool pool(helpers, 50);
        REQUIRE(pool.start().ok());
        CHECK(pool.threads() == helpers);
        for (std::size_t n : kSizes)
            for (bool stream : {false, true})
                for (auto [d, s] : {std::pair<std::size_t, std::size_t>{0, 0}, {16, 0}, {1, 3}, {64, 7}})
                    copyAndCheck(pool, n, d, s, stream, rng);
        pool.stop();
    }
}

TEST_CASE("copies back to back: no part of one lands in the next") {
    // Each copy goes to a fresh place in one buffer with its own byte; a
    // part claimed late, from an older copy, would leave the wrong byte.
    CarryPool pool(3, 1000);
    REQUIRE(pool.start().ok());
    std::mt19937 rng(11);
    std::vector<std::uint8_t> src(1u << 20), dst(4u << 20), want(dst.size());
    for (int round = 0; round < 400; ++round) {
        const std::size_t n = CarryPool::kSplitMin + rng() % (src.size() - CarryPool::kSplitMin);
        const std::size_t at = (rng() % ((dst.size() - n) / 64)) * 64;
        const auto mark = std::uint8_t(round);
        std::memset(src.data(), mark, n);
        std::memset(dst.data(), std::uint8_t(mark + 1), dst.size());
        std::memset(want.data(), std::uint8_t(mark + 1), want.size());
        std::memset(want.data() + at, mark, n);
        pool.copy(dst.data() + at, src.data(), n, round % 2 == 1);
        INFO("round " << round << " bytes " << n << " at " << at);
        REQUIRE(firstDiff(dst, want) == -1);
    }
}

TEST_CASE("awake helpers take parts; asleep ones delay nothing and stop") {
    std::mt19937_64 rng(3);
    {
        CarryPool pool(2, 1000000); // helpers stay awake between copies
        REQUIRE(pool.start().ok());
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (pool.parts() == 0 && std::chrono::steady_clock::now() < until)
            copyAndCheck(pool, 512 * 1024, 0, 0, false, rng);
        CHECK(pool.parts() > 0);
    }
    {
        CarryPool pool(2, 0); // helpers sleep at once
        REQUIRE(pool.start().ok());
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        for (std::size_t n : {CarryPool::kSplitMin, 2 * CarryPool::kSplitMin, std::size_t(512 * 1024)}) {
            copyAndCheck(pool, n, 0, 0, true, rng); // the proxy copies alone; the sleepers are only marked...
            pool.wakeIdle();                        // ...and woken here, after the copy
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        const auto t0 = std::chrono::steady_clock::now();
        pool.stop();
        CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
        copyAndCheck(pool, 64 * 1024, 0, 0, false, rng); // after stop: the caller copies alone
    }
}

// A poll pass's rows as one batch: many destinations in one buffer, each its
// own source bytes, rows below kSplitMin (one chunk each) beside rows split
// in parts, some streamed; batches of one row, of small rows only (below
// kSplitMin in all: the proxy's alone), and of more chunks than one round
// holds (W = 16's 240 rows).
TEST_CASE("a batch of rows: every byte of every row, none beyond, at every helper count") {
    std::mt19937_64 rng(19);
    const std::vector<std::vector<std::size_t>> batches = {
        {4096},
        {4096, 4096, 4096},                                   // W = 4, 4 KiB: 12 KiB, the proxy's alone
        std::vector<std::size_t>(56, 4096),                   // W = 8, 4 KiB: 224 KiB, shared
        {CarryPool::kSplitMin, CarryPool::kSplitMin},          // W = 2, 64 KiB: both ranks' rows
        {17, 0, 4096 + 16, CarryPool::kSplitMin + 48, 1, 200 * 1024, 63, 16 * 1024},
        std::vector<std::size_t>(300, 1024 + 16),             // more chunks than a round holds
        std::vector<std::size_t>(40, CarryPool::kSplitMin),   // split rows past a round's chunks
    };
    for (std::uint32_t helpers : {0u, 1u, 2u, 16u}) {
        CarryPool pool(helpers, 1000);
        REQUIRE(pool.start().ok());
        for (const auto& sizes : batches)
            for (bool stream : {false, true}) {
                std::size_t total = 0;
                for (std::size_t n : sizes) total += n + kGuard + 16;
                std::vector<std::uint8_t> src(total), dst(total + kGuard, 0xa5), want(dst);
                fillRandom(src.data(), src.size(), rng);
                std::vector<CarryItem> batch;
                std::size_t at = 0;
                for (std::size_t i = 0; i < sizes.size(); ++i) {
                    // Rows at 16-byte offsets (the slots'), every other one streamed when stream is set.
                    batch.push_back(CarryItem{dst.data() + kGuard + at, src.data() + at, sizes[i], stream && i % 2 == 0});
                    std::memcpy(want.data() + kGuard + at, src.data() + at, sizes[i]);
                    at += (sizes[i] + kGuard + 15) & ~std::size_t(15);
                    REQUIRE(at <= total);
                }
                pool.copy(batch);
                INFO("helpers " << helpers << ", " << sizes.size() << " rows" << (stream ? ", some streamed" : ""));
                REQUIRE(firstDiff(dst, want) == -1);
            }
        pool.stop();
    }
}

// The proxy's idle passes demote the rows it carried (common/stream_copy.hpp,
// daemon/proxy/proxy.hpp Demote): a hint that must change no byte, from any
// start and length, 1 KiB at a time as the proxy does it or whole. (On a CPU
// without CLDEMOTE its encoding is a NOP; the GPU machine's CPUs have it.)
TEST_CASE("demoteLines changes no byte, at every alignment and length") {
    std::mt19937_64 rng(4);
    std::vector<std::uint8_t> buf(16 * 1024 + 2 * kGuard);
    fillRandom(buf.data(), buf.size(), rng);
    const std::vector<std::uint8_t> want = buf;
    for (std::size_t off : {std::size_t(0), std::size_t(1), std::size_t(63), std::size_t(64), std::size_t(100)})
        for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(64), std::size_t(65), std::size_t(4096), std::size_t(16 * 1024)}) {
            const std::uint8_t* row = buf.data() + kGuard + off;
            for (std::size_t done = 0; done < n; done += 1024) tpf::demoteLines(row + done, std::min<std::size_t>(1024, n - done));
            tpf::demoteLines(row, n);
            REQUIRE(firstDiff(buf, want) == -1);
        }
}
