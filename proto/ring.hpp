// tpfabric — the per-client command ring in shared memory (a sealed memfd the
// daemon creates and passes with the Verdict).
//
// Single producer, single consumer, PipeWire style: free-running u32
// indices, each on its own 128-byte line, published with release stores and
// read with acquire loads; index & (entries-1) is the slot. The rank (its
// host thread or its GPU kernel) produces Doorbells, the daemon proxy
// consumes them. A doorbell the daemon refuses or cannot carry out breaks
// the group: the error reaches every rank through its region's ControlBlock
// (there is no completion ring: version 2 had one, written and never read).
// The daemon sets `proxyIdle` before it sleeps; a producer that sees it set
// after publishing writes the proxy eventfd (Dekker pattern, seq_cst fences on
// both sides), so a busy proxy costs producers no system call.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "proto/layout.hpp"

namespace tpf {

inline constexpr std::uint32_t kRingMagic = 0x474e5254; ///< "TRNG"
/// Bumped with any change of RingHeader, RankStats or the entries: a rank
/// refuses a ring of another version (its stats would land in the wrong place).
/// 3: the completion ring and its indices removed; proxyIdle and heartbeatNs
/// moved up to @384.
inline constexpr std::uint16_t kRingVersion = 3;
inline constexpr std::uint32_t kRingMinEntries = 8;
inline constexpr std::uint32_t kRingMaxEntries = 4096;

/// A request to deliver this rank's staged shard of `epoch` to every peer. 16 bytes.
struct Doorbell {
    std::uint64_t epoch; ///< > 0; the shard sits in slot (phaseOf(epoch), rank) of the rank's region
    std::uint32_t bytes; ///< shard size, <= the agreed cap
    std::uint32_t group; ///< Verdict.groupHandle
};
static_assert(sizeof(Doorbell) == 16);
static_assert(offsetof(Doorbell, bytes) == 8);
static_assert(std::is_trivially_copyable_v<Doorbell>);

/// Ring header at offset 0 of the ring memfd; one line per writer. 512 bytes.
struct RingHeader {
    std::uint32_t magic;        ///< @0 kRingMagic (daemon writes once)
    std::uint16_t version;      ///< kRingVersion
    std::uint16_t entryBytes;   ///< 16
    std::uint32_t entries;      ///< power of two, 8..4096
    std::uint32_t group;        ///< the group handle this ring serves
    std::uint8_t pad0[112];
    std::uint32_t subHead;      ///< @128 rank writes (release): doorbells published
    std::uint8_t pad1[124];
    std::uint32_t subTail;      ///< @256 daemon writes (release): doorbells consumed
    std::uint8_t pad2[124];
    std::uint32_t proxyIdle;    ///< @384 daemon writes: 1 while the proxy sleeps on its eventfd
    /// @388 daemon writes once: proxy.heartbeat_ms, the longest heartbeatNs
    /// goes unwritten while the proxy sleeps (a healthy daemon's beat is never
    /// much older); 0 from a daemon before it (clients then judge no beat).
    std::uint32_t heartbeatMs;
    /// @392 daemon writes: CLOCK_MONOTONIC ns of its last proxy pass; every
    /// ms while the proxy polls (always, while a member has a GPU proxy
    /// route), at least every proxy.heartbeat_ms while it sleeps.
    std::uint64_t heartbeatNs;
    std::uint8_t pad3[112];
};
static_assert(sizeof(RingHeader) == 512);
static_assert(offsetof(RingHeader, subHead) == 128);
static_assert(offsetof(RingHeader, subTail) == 256);
static_assert(offsetof(RingHeader, proxyIdle) == 384);
static_assert(offsetof(RingHeader, heartbeatMs) == 388);
static_assert(offsetof(RingHeader, heartbeatNs) == 392);
static_assert(std::is_trivially_copyable_v<RingHeader>);

inline constexpr std::uint32_t kLatencyBuckets = 88;

/// Log-linear latency bucket: 4 per power of two from 256 ns (so a bucket's
/// floor is within 19% of any value in it); bucket 0 holds everything below
/// 320 ns, bucket 87 everything from about 0.94 s.
constexpr std::uint32_t latencyBucket(std::uint64_t ns) {
    if (ns < 256) return 0;
    std::uint32_t e = 63;
    while (!(ns >> e)) --e;
    const std::uint32_t idx = (e - 8) * 4 + std::uint32_t((ns >> (e - 2)) & 3);
    return idx >= kLatencyBuckets ? kLatencyBuckets - 1 : idx;
}
/// Lower bound in ns of a latency bucket (inverse of latencyBucket). Bucket
/// b holds [floor(b), floor(b + 1)); the last bucket has no upper bound.
constexpr std::uint64_t latencyBucketFloor(std::uint32_t idx) {
    if (idx == 0) return 0;
    const std::uint32_t e = idx / 4 + 8;
    return (std::uint64_t(4 + idx % 4)) << (e - 2);
}

/// Which collective a RankStats::ops slot counts. The slot index is part of
/// the ring layout: a value, once assigned, keeps its meaning.
enum StatsOp : std::uint32_t {
    kStatsAllGather = 0,    ///< Group::allGather
    kStatsAllReduceSum = 1, ///< Group::allReduceSum
    kStatsAllGatherV = 2,   ///< Group::allGatherV (bytes: this rank's row)
    // 3: spare, 0 until assigned.
};
inline constexpr std::uint32_t kStatsOps = 4;
/// errorsByCode slots: one per Errc value (29 assigned, room to append).
inline constexpr std::uint32_t kStatsErrcSlots = 32;

/// Name of an assigned StatsOp as metrics and status print it
/// ("all_gather"), or nullptr for a slot not assigned yet.
constexpr const char* statsOpName(std::uint32_t op) {
    switch (op) {
    case kStatsAllGather: return "all_gather";
    case kStatsAllReduceSum: return "all_reduce_sum";
    case kStatsAllGatherV: return "all_gather_v";
    default: return nullptr;
    }
}

/// One collective's counts in a RankStats. 384 bytes.
struct OpStats {
    std::uint64_t calls;        ///< calls completed or failed
    std::uint64_t bytes;        ///< shard bytes of completed calls (this rank's contribution)
    std::uint64_t errors;       ///< failed calls
    std::uint64_t latencyNs;    ///< sum of the latencies of completed calls, ns
    std::uint32_t latency[kLatencyBuckets]; ///< completed calls by latencyBucket(ns)
};
static_assert(sizeof(OpStats) == 384);
static_assert(offsetof(OpStats, latencyNs) == 24);
static_assert(offsetof(OpStats, latency) == 32);
static_assert(std::is_trivially_copyable_v<OpStats>);

/// Per-rank call statistics at RingLayout::statsOffset(). The rank writes
/// them after every host-path call (relaxed stores; one writer), a Device
/// group's kernels as they count each call (kernels/collectives.hpp,
/// DeviceStats; system-scope stores of totals); the daemon
/// reads them (relaxed loads, readStats) for status and metrics, and folds a
/// rank's last values into its lifetime counters when the rank leaves.
/// Values come from a client: the daemon only adds them up. 1920 bytes.
struct RankStats {
    OpStats ops[kStatsOps];                        ///< @0 by StatsOp
    std::uint64_t errorsByCode[kStatsErrcSlots];   ///< @1536 failed calls by Errc value (any op)
    std::uint32_t lastError;                       ///< @1792 Errc of the last failure
    std::uint32_t reserved0;
    std::uint64_t ncclCalls;                       ///< @1800 calls a Device group handed to NCCL (above the
                                                   ///<       fabric's cap), counted by the host when made eagerly
    std::uint64_t ncclBytes;                       ///< @1808 their bytes (this rank's send bytes)
    std::uint64_t ncclGraphCalls;                  ///< @1816 those replayed in CUDA graphs, counted by a kernel
    std::uint64_t ncclGraphBytes;                  ///< @1824
    std::uint8_t pad[88];                          ///< to a 128-byte multiple
};
static_assert(sizeof(RankStats) == 1920);
static_assert(offsetof(RankStats, errorsByCode) == 1536);
static_assert(offsetof(RankStats, lastError) == 1792);
static_assert(offsetof(RankStats, ncclCalls) == 1800);
static_assert(offsetof(RankStats, ncclGraphBytes) == 1824);
static_assert(sizeof(RankStats) % 128 == 0);
static_assert(std::is_trivially_copyable_v<RankStats>);

#if !defined(__CUDA_ARCH__)
/// A private copy of a shared RankStats, each field read with one relaxed
/// load (the writer may be mid-call; each field is whole, the set is not a
/// snapshot). The one reader of a rank's stats block.
inline RankStats readStats(const RankStats& shared) {
    RankStats out{};
    const auto load = [](const auto& v) {
        using T = std::remove_cvref_t<decltype(v)>;
        return std::atomic_ref(const_cast<T&>(v)).load(std::memory_order_relaxed);
    };
    for (std::uint32_t o = 0; o < kStatsOps; ++o) {
        const OpStats& s = shared.ops[o];
        OpStats& d = out.ops[o];
        d.calls = load(s.calls);
        d.bytes = load(s.bytes);
        d.errors = load(s.errors);
        d.latencyNs = load(s.latencyNs);
        for (std::uint32_t b = 0; b < kLatencyBuckets; ++b) d.latency[b] = load(s.latency[b]);
    }
    for (std::uint32_t c = 0; c < kStatsErrcSlots; ++c) out.errorsByCode[c] = load(shared.errorsByCode[c]);
    out.lastError = load(shared.lastError);
    out.ncclCalls = load(shared.ncclCalls);
    out.ncclBytes = load(shared.ncclBytes);
    out.ncclGraphCalls = load(shared.ncclGraphCalls);
    out.ncclGraphBytes = load(shared.ncclGraphBytes);
    return out;
}
#endif

/// Offsets of the ring memfd. The one place ring offsets are computed.
struct RingLayout {
    std::uint32_t entries = 0;

    static constexpr bool validEntries(std::uint32_t n) {
        return n >= kRingMinEntries && n <= kRingMaxEntries && (n & (n - 1)) == 0;
    }
    TPF_HD constexpr std::uint64_t statsOffset() const { return sizeof(RingHeader); }
    TPF_HD constexpr std::uint64_t submissionsOffset() const { return statsOffset() + sizeof(RankStats); }
    TPF_HD constexpr std::uint64_t submissionOffset(std::uint32_t index) const {
        return submissionsOffset() + std::uint64_t(index & (entries - 1)) * sizeof(Doorbell);
    }
    TPF_HD constexpr std::uint64_t totalBytes() const {
        return roundUp(submissionsOffset() + std::uint64_t(entries) * sizeof(Doorbell), kSlotAlign);
    }
};

#if !defined(__CUDA_ARCH__)
/// Host view of a mapped ring; both sides use it. Does not own the mapping.
class RingView {
public:
    RingView() = default;
    RingView(void* base, RingLayout layout) : base_(static_cast<std::uint8_t*>(base)), layout_(layout) {}

    RingHeader& header() const { return *reinterpret_cast<RingHeader*>(base_); }
    RankStats& stats() const { return *reinterpret_cast<RankStats*>(base_ + layout_.statsOffset()); }
    const RingLayout& layout() const { return layout_; }

    /// Producer (rank): publish one doorbell; false if the ring is full.
    bool push(const Doorbell& d) const {
        auto& h = header();
        const std::uint32_t head = std::atomic_ref(h.subHead).load(std::memory_order_relaxed);
        const std::uint32_t tail = std::atomic_ref(h.subTail).load(std::memory_order_acquire);
        if (head - tail >= layout_.entries) return false;
        *reinterpret_cast<Doorbell*>(base_ + layout_.submissionOffset(head)) = d;
        std::atomic_ref(h.subHead).store(head + 1, std::memory_order_release);
        return true;
    }
    /// Producer: after push, whether the proxy must be woken through its eventfd.
    bool proxyNeedsWake() const {
        std::atomic_thread_fence(std::memory_order_seq_cst);
        return std::atomic_ref(header().proxyIdle).load(std::memory_order_relaxed) != 0;
    }
    /// Consumer (daemon): take one doorbell. `tail` is the daemon's private
    /// copy of subTail (a client could scribble on the shared one). Returns
    /// Empty, Taken, or Corrupt when the shared head is more than a ring ahead.
    enum class Pop { Empty, Taken, Corrupt };
    Pop pop(std::uint32_t& tail, Doorbell& out) const {
        auto& h = header();
        const std::uint32_t head = std::atomic_ref(h.subHead).load(std::memory_order_acquire);
        if (head == tail) return Pop::Empty;
        if (head - tail > layout_.entries) return Pop::Corrupt;
        out = *reinterpret_cast<const Doorbell*>(base_ + layout_.submissionOffset(tail));
        ++tail;
        std::atomic_ref(h.subTail).store(tail, std::memory_order_release);
        return Pop::Taken;
    }
    bool hasSubmissions(std::uint32_t tail) const {
        return std::atomic_ref(header().subHead).load(std::memory_order_acquire) != tail;
    }

private:
    std::uint8_t* base_ = nullptr;
    RingLayout layout_{};
};
#endif

} // namespace tpf
