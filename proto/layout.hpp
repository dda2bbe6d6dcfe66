// tpfabric — region layout: the one place any region offset is computed.
//
// A region is one rank's registered memory (a memfd for `host` regions, GPU
// memory for `device` regions). Daemon, client, CUDA kernels and tests all
// take offsets from Layout; nothing else does arithmetic on region offsets.
//
//   [ slots:   phase 0: src 0..W-1 | phase 1: src 0..W-1 ]  each slotBytes, 4096-aligned
//   [ flags:   phase 0: src 0..W-1 x stripe 0..S-1 | phase 1: ... ]  each its own 128-byte line
//   [ control: ControlBlock (4 lines of 128 bytes) ]
//   [ padding to a whole page ]
//
// Phase p = epoch & 1. Slot (p, s) of rank r holds source rank s's shard of
// an epoch with parity p; slot (p, r) is r's own staged shard (the source of
// its writes and already its own row of an all-gather). Flag (p, s, k) holds
// the last epoch whose stripe k arrived from s in its first 8 bytes (copy 0:
// every writer writes it, every reader may read it). Flags carry epochs,
// never booleans, so nothing is reset between calls. A GPU that waits for a
// flag in host memory polls it from kFlagCopies warps at once, a quarter of
// a PCIe read round trip apart, each its own 32-byte copy in the flag's line
// (docs/gpu.md, "Polling host memory"), so the proxy writes every copy when
// it carries for a Device group, and an RDMA WRITE of a flag carries the
// line's copies (daemon/verbs/qp.hpp, kFlagLineInline); a writer that writes
// copy 0 alone (a host rank; an HCA without 104 bytes of inline data)
// leaves the other pollers waiting and copy 0's poller sees the epoch. A
// copy never runs ahead of the shard it flags. A device group's ipc writer
// also stores, before it releases the flag, a tag word at kFlagTagOffset of
// copy 0: (low 32 bits of the epoch) << 32 | the call's tag (kernels/
// collectives.hpp, callTagOf), which the reader compares with its own.
//
// All integers little-endian (the only byte order tpfabric runs on).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include <tpfabric/error.hpp>

#if defined(__CUDACC__)
#define TPF_HD __host__ __device__
#else
#define TPF_HD
#endif

namespace tpf {

inline constexpr std::uint32_t kMaxWorld = 16;      ///< ranks in a group, at most
inline constexpr std::uint32_t kMaxStripes = 8;     ///< HCA pairs between two nodes, at most
inline constexpr std::uint64_t kSlotAlign = 4096;   ///< slot size and offset granularity (a page)
inline constexpr std::uint64_t kFlagLine = 128;     ///< one flag per line (two 64 B sectors: no false sharing on adjacent-line prefetch)
inline constexpr std::uint32_t kFlagCopies = 4;     ///< copies of a flag's epoch in its line, for pollers over PCIe
inline constexpr std::uint64_t kFlagCopyStride = 32; ///< bytes between copies: one 32-byte sector each
static_assert(kFlagCopies * kFlagCopyStride <= kFlagLine);
inline constexpr std::uint64_t kFlagTagOffset = 8;  ///< an ipc writer's call tag word, behind copy 0's epoch
static_assert(kFlagTagOffset + 8 <= kFlagCopyStride);
inline constexpr std::uint64_t kStripeAlign = 4096; ///< every stripe but the last starts and ends on this
inline constexpr std::uint64_t kMaxCapBytes = 1ull << 30;  ///< a group's cap (max_bytes a rank), at most 1 GiB
inline constexpr std::uint64_t kMaxSlotBytes = kMaxCapBytes + kSlotAlign; ///< one slot, at most: slotBytesFor(kMaxCapBytes)
inline constexpr std::uint64_t kBufferAlign = 16;   ///< user buffers and sizes: 16-byte aligned

TPF_HD constexpr std::uint64_t roundUp(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

/// Shared control words of a region. Lives at Layout::controlOffset().
/// Written by: daemon (error, missingPeer, carriedThrough, abort, wakeSeq),
/// the region's own rank (epoch, callFailed, waiters). Read by the rank's
/// waits (host code or kernels) and its health word (Group::health()).
struct ControlBlock {
    std::uint64_t epoch;        ///< @0   last epoch this rank started (device-resident mirror for graphs)
    /// @8 Non-zero once a device call of this rank failed (its kernels store
    /// it, release, after the call's record: error and missingPeer, written
    /// by the kernel or, for a daemon-reported cause, by the daemon). The
    /// host reads it without synchronising the stream (Group::health()):
    /// error alone cannot tell a failed call from an orderly leave that no
    /// call has passed yet (carriedThrough). The daemon neither writes nor
    /// reads it (the region starts zeroed).
    std::uint32_t callFailed;
    std::uint8_t reserved0[116];
    std::uint32_t error;        ///< @128 Errc of a group-wide failure, 0 while healthy (daemon writes)
    std::uint32_t missingPeer;  ///< @132 rank the failure names, 0xffffffff if none
    /// @136 With error PeerLost: missingPeer closed in order after posting
    /// epochs 1..carriedThrough, and every other rank's shards of those
    /// epochs are still carried, so a wait for an epoch up to it goes on
    /// (until its timeout) while missingPeer's own shard is there; a later
    /// epoch lacks that shard and fails at once. 0: nothing is carried (a
    /// fault: a wait ends after a short grace for shards under way).
    /// kCarriedUnknown: the daemon cannot tell the last epoch (the rank
    /// exchanged every shard by ipc); its own shard decides. The daemon
    /// writes it before error (release); it may lower it or reset it to 0
    /// later (another rank left earlier, a fault followed).
    std::uint64_t carriedThrough;
    std::uint8_t reserved1[112];
    std::uint32_t abort;        ///< @256 non-zero once any rank aborted (daemon writes)
    std::uint8_t reserved2[124];
    std::uint32_t wakeSeq;      ///< @384 futex word: daemon bumps it and wakes after storing flags or errors
    std::uint32_t waiters;      ///< @388 ranks' host threads sleeping on wakeSeq (rank writes)
    std::uint8_t reserved3[120];
};
static_assert(sizeof(ControlBlock) == 512);
static_assert(offsetof(ControlBlock, callFailed) == 8);
static_assert(offsetof(ControlBlock, error) == 128);
static_assert(offsetof(ControlBlock, missingPeer) == 132);
static_assert(offsetof(ControlBlock, carriedThrough) == 136);
static_assert(offsetof(ControlBlock, reserved1) == 144);
static_assert(offsetof(ControlBlock, reserved2) == 260);
static_assert(std::is_trivially_copyable_v<ControlBlock>);
static_assert(offsetof(ControlBlock, abort) == 256);
static_assert(offsetof(ControlBlock, wakeSeq) == 384);
static_assert(offsetof(ControlBlock, waiters) == 388);

inline constexpr std::uint32_t kNoPeer = 0xffffffffu;
/// ControlBlock::carriedThrough when the leaving rank's last epoch is unknown.
inline constexpr std::uint64_t kCarriedUnknown = ~0ull;

/// Offsets of one rank's region for a group of `world` ranks. Trivially
/// copyable so it can be passed by value into a kernel.
struct Layout {
    std::uint32_t world = 0;
    std::uint32_t stripes = 0;
    std::uint64_t slotBytes = 0;

    /// Validating constructor: world 1..16, slotBytes a positive multiple of
    /// 4096 up to kMaxSlotBytes, stripes 1..8; anything else is OutOfRange / Misaligned.
    static Result<Layout> of(std::uint32_t world, std::uint64_t slotBytes, std::uint32_t stripes) {
        if (world < 1 || world > kMaxWorld)
            return {Errc::OutOfRange, "world " + std::to_string(world) + " outside 1..16"};
        if (stripes < 1 || stripes > kMaxStripes)
            return {Errc::OutOfRange, "stripes " + std::to_string(stripes) + " outside 1..8"};
        if (slotBytes == 0 || slotBytes > kMaxSlotBytes)
            return {Errc::OutOfRange, "slot of " + std::to_string(slotBytes) + " bytes outside 4096.." +
                                          std::to_string(kMaxSlotBytes) + " (the slot of a 1 GiB cap)"};
        if (slotBytes % kSlotAlign != 0)
            return {Errc::Misaligned, "slot of " + std::to_string(slotBytes) + " bytes is not a multiple of 4096"};
        Layout l;
        l.world = world;
        l.stripes = stripes;
        l.slotBytes = slotBytes;
        return l;
    }

    /// Offset of the slot that holds source rank `src`'s shard in `phase`.
    TPF_HD constexpr std::uint64_t slotOffset(std::uint32_t phase, std::uint32_t src) const {
        return (std::uint64_t(phase) * world + src) * slotBytes;
    }
    TPF_HD constexpr std::uint64_t flagsOffset() const { return 2ull * world * slotBytes; }
    /// Offset of the 64-bit epoch flag for (phase, src, stripe).
    TPF_HD constexpr std::uint64_t flagOffset(std::uint32_t phase, std::uint32_t src,
                                              std::uint32_t stripe) const {
        return flagsOffset() + ((std::uint64_t(phase) * world + src) * stripes + stripe) * kFlagLine;
    }
    /// Offset of copy c (0..kFlagCopies-1) of that flag; copy 0 is the flag.
    TPF_HD constexpr std::uint64_t flagCopyOffset(std::uint32_t phase, std::uint32_t src, std::uint32_t stripe,
                                                  std::uint32_t copy) const {
        return flagOffset(phase, src, stripe) + copy * kFlagCopyStride;
    }
    TPF_HD constexpr std::uint64_t flagsBytes() const { return 2ull * world * stripes * kFlagLine; }
    TPF_HD constexpr std::uint64_t controlOffset() const { return flagsOffset() + flagsBytes(); }
    /// Whole region, a multiple of the page size.
    TPF_HD constexpr std::uint64_t totalBytes() const {
        return roundUp(controlOffset() + sizeof(ControlBlock), kSlotAlign);
    }
};
static_assert(sizeof(Layout) == 16);

/// Phase of an epoch: its parity.
TPF_HD constexpr std::uint32_t phaseOf(std::uint64_t epoch) { return std::uint32_t(epoch & 1u); }

/// The i-th peer rank `self` sends to, i in [0, world-1): next rank first, so
/// senders do not all hit one receiver at once.
TPF_HD constexpr std::uint32_t peerAt(std::uint32_t self, std::uint32_t i, std::uint32_t world) {
    return (self + 1 + i) % world;
}

/// A byte range [offset, offset+bytes) of a shard.
struct Stripe {
    std::uint64_t offset;
    std::uint64_t bytes;
};

/// Stripe k of a shard of `bytes` split over `n` HCA pairs. Rule: every
/// stripe but the last carries `per = roundUp(ceil(bytes/n), 4096)` bytes
/// (page-aligned boundaries); later stripes may be short or empty. Both ends
/// compute the same split from (bytes, n) alone. Every stripe, empty or not,
/// has its flag written, so a receiver always waits on all n flags.
TPF_HD constexpr Stripe stripeOf(std::uint64_t bytes, std::uint32_t n, std::uint32_t k) {
    const std::uint64_t per = n == 0 ? bytes : roundUp((bytes + n - 1) / n, kStripeAlign);
    const std::uint64_t begin = per * k < bytes ? per * k : bytes;
    const std::uint64_t end = per * (k + 1) < bytes ? per * (k + 1) : bytes;
    return Stripe{begin, end - begin};
}

/// The 16-byte header in front of a row of an all-gather-v (allGatherV): each
/// rank stages [RowHeader | its row] in its own slot, and a receiver takes a
/// row only after checking every row's header against its own counts, so
/// ranks that pass different counts fail the call (GroupMismatch) on every
/// rank with nothing written, whatever sizes they staged. The header sits at
/// offset 0 of the slot, which every call writes: it is never stale.
struct RowHeader {
    std::uint64_t countsHash; ///< countsHash(counts, world) of the sender's counts
    std::uint32_t rowBytes;   ///< the sender's own count (its row's bytes)
    std::uint32_t magic;      ///< kRowHeaderMagic
};
static_assert(sizeof(RowHeader) == 16);
static_assert(offsetof(RowHeader, rowBytes) == 8);
inline constexpr std::uint32_t kRowHeaderMagic = 0x56475054; ///< "TPGV"
/// A host group's allGather and allReduceSum row carries a RowTrailer right
/// behind it, at roundUp(bytes, 16) of the slot (the row itself stays at
/// offset 0, cache-line aligned for the peers' copies and sums), naming the
/// call: the epoch, the bytes and the op (magic). A receiver reads it where a
/// row of its own size ends, so ranks that pass another size, op or dtype
/// fail the call on every rank (GroupMismatch) instead of reading a row of
/// another shape: a row of another size has no trailer of this epoch there.
/// Device groups' rows carry none: their ipc peers compare a tag of the call
/// instead (kFlagTagOffset; the LL path's tag line, kernels/ll_kernel.cuh).
struct RowTrailer {
    std::uint64_t epoch;    ///< the call's epoch (a stale trailer of e - 2 never passes)
    std::uint32_t rowBytes; ///< the sender's bytes
    std::uint32_t magic;    ///< kTrailerGather, or kTrailerSumBase + tpf_dtype
};
static_assert(sizeof(RowTrailer) == 16);
static_assert(offsetof(RowTrailer, rowBytes) == 8 && offsetof(RowTrailer, magic) == 12);
inline constexpr std::uint32_t kTrailerGather = 0x41475054;  ///< "TPGA": allGather
inline constexpr std::uint32_t kTrailerSumBase = 0x30535054; ///< "TPS0" + tpf_dtype: allReduceSum of that dtype

/// FNV-1a over world and every count (as u64, little-endian), identical on
/// host and device: equal on two ranks iff (with overwhelming probability)
/// they pass the same counts.
TPF_HD constexpr std::uint64_t countsHash(const std::uint64_t* counts, std::uint32_t world) {
    std::uint64_t h = 1469598103934665603ull;
    for (std::uint32_t r = 0; r <= world; ++r) {
        const std::uint64_t v = r == 0 ? world : counts[r - 1];
        for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
    }
    return h;
}

/// Slot size for an agreed cap: the cap plus room for a RowHeader (or a
/// RowTrailer) and the 16-byte rounding of a staged shard (2 x 16 bytes),
/// rounded up to a page. So a row of up to the cap behind its header or
/// before its trailer, or a shard of up to the cap rounded up to 16 bytes,
/// always fits the slot.
constexpr std::uint64_t slotBytesFor(std::uint64_t cap) { return roundUp(cap + 2 * sizeof(RowHeader), kSlotAlign); }
static_assert(slotBytesFor(kMaxCapBytes) == kMaxSlotBytes);

/// The agreed cap: the exact minimum of every rank's usable maximum (never a
/// rounded slot size). Empty input gives 0.
constexpr std::uint64_t agreedCap(const std::uint64_t* caps, std::size_t n) {
    if (n == 0) return 0;
    std::uint64_t m = caps[0];
    for (std::size_t i = 1; i < n; ++i)
        if (caps[i] < m) m = caps[i];
    return m;
}

/// Whether a shard of `bytes` may take the fabric path: tests the agreed cap
/// itself, identical on every rank.
TPF_HD constexpr bool fits(std::uint64_t bytes, std::uint64_t agreedCapBytes) {
    return bytes <= agreedCapBytes;
}

} // namespace tpf
