// libFuzzer target: the per-client command ring (proto/ring.hpp) as the
// daemon maps it from a client that may scribble anything into the shared
// memory. Input: byte 0 picks the ring size (8 << n entries), bytes 1..4
// the daemon's private subTail copy, then a script of operations: pop, push,
// and writes of arbitrary values into any shared index or entry. The image is exactly
// RingLayout::totalBytes() long, so ASan catches any access outside it.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <new>

#include "fuzz_common.hpp"
#include "proto/ring.hpp"

using namespace tpf;

namespace {

struct Input {
    const std::uint8_t* p;
    std::size_t n;
    template <class T>
    bool take(T& v) {
        if (n < sizeof(T)) return false;
        std::memcpy(&v, p, sizeof(T));
        p += sizeof(T);
        n -= sizeof(T);
        return true;
    }
};

struct Image {
    explicit Image(std::size_t bytes) : size(bytes), base(static_cast<std::uint8_t*>(::operator new(bytes, std::align_val_t(64)))) {
        std::memset(base, 0, bytes);
    }
    ~Image() { ::operator delete(base, std::align_val_t(64)); }
    std::size_t size;
    std::uint8_t* base;
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    Input in{data, size};
    std::uint8_t shift = 0;
    if (!in.take(shift)) return 0;
    RingLayout layout{kRingMinEntries << (shift % 10)};
    TPF_FUZZ_CHECK(RingLayout::validEntries(layout.entries));
    Image img(layout.totalBytes());
    RingView ring(img.base, layout);
    auto& h = ring.header();
    h.magic = kRingMagic;
    h.version = kRingVersion;
    h.entryBytes = sizeof(Doorbell);
    h.entries = layout.entries;

    std::uint32_t tail = 0; // the daemon's private copy
    in.take(tail);
    std::atomic_ref(h.subHead).store(tail);
    std::atomic_ref(h.subTail).store(tail);

    std::uint8_t op = 0;
    for (int steps = 0; steps < 4096 && in.take(op); ++steps) {
        switch (op % 6) {
        case 0: { // daemon: pop one doorbell
            const std::uint32_t before = tail;
            const std::uint32_t head = std::atomic_ref(h.subHead).load();
            Doorbell d{};
            const auto r = ring.pop(tail, d);
            if (r == RingView::Pop::Taken) {
                TPF_FUZZ_CHECK(tail == before + 1 && head - before <= layout.entries && head != before);
                TPF_FUZZ_CHECK(std::atomic_ref(h.subTail).load() == tail);
            } else {
                TPF_FUZZ_CHECK(tail == before);
                if (r == RingView::Pop::Empty) TPF_FUZZ_CHECK(head == before);
                else TPF_FUZZ_CHECK(head - before > layout.entries);
            }
            break;
        }
        case 1: { // rank: push a doorbell
            Doorbell d{};
            in.take(d);
            (void)ring.push(d);
            (void)ring.proxyNeedsWake();
            break;
        }
        case 2: { // hostile client: any value into any shared index
            std::uint8_t which = 0;
            std::uint32_t v = 0;
            in.take(which);
            in.take(v);
            std::uint32_t* idx[] = {&h.subHead, &h.subTail, &h.proxyIdle, &h.entries};
            std::atomic_ref(*idx[which % 4]).store(v);
            break;
        }
        case 3: { // hostile client: scribble over entries and stats
            std::uint16_t at = 0;
            std::uint8_t len = 0;
            in.take(at);
            in.take(len);
            const std::size_t off = sizeof(RingHeader) + at % (img.size - sizeof(RingHeader));
            const std::size_t n = std::min({std::size_t(len), in.n, img.size - off});
            std::memcpy(img.base + off, in.p, n);
            in.p += n;
            in.n -= n;
            break;
        }
        case 4: (void)ring.hasSubmissions(tail); break;
        case 5: { // status and metrics read the rank's statistics (whatever the client wrote)
            const RankStats s = readStats(ring.stats());
            TPF_FUZZ_CHECK(std::memcmp(&s, &ring.stats(), offsetof(RankStats, reserved0)) == 0);
            std::uint64_t sum = 0;
            for (const OpStats& stats : s.ops) {
                for (std::uint32_t b = 0; b < kLatencyBuckets; ++b) sum += stats.latency[b];
                TPF_FUZZ_CHECK(latencyBucket(stats.calls) < kLatencyBuckets);
                TPF_FUZZ_CHECK(latencyBucketFloor(latencyBucket(stats.latencyNs)) <= stats.latencyNs);
            }
            for (std::uint64_t n : s.errorsByCode) sum += n;
            (void)sum;
            break;
        }
        }
    }
    return 0;
}
