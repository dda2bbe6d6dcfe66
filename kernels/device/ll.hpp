// tpfabric device primitives — the low-latency (LL) protocol, host half: how
// big an LL call may be, where the LL area sits in a device region, and how
// many threads and blocks carry a call. The device half (the line format,
// its stores and loads, the tag line, the scrub) is kernels/device/ll.cuh.
//
// The LL protocol is used for calls whose every peer is ipc and whose shard
// is at most llMaxBytes(world): each 8 bytes of payload travel with a 32-bit
// copy of the epoch in every 16-byte line ({d0, e, d1, e}, one volatile
// 16-byte store, NCCL's LL layout), into an area of the device regions after
// Layout::totalBytes(), so the receiver polls the data itself and no fence,
// release or separate flag is on the path. Each thread holds the peers' rows
// of its chunks in registers until every block has them (all-or-none output,
// as the flag path).
#pragma once

#include <cstdint>

#include "proto/layout.hpp"

namespace tpf::kernels {

inline constexpr std::uint32_t kLlThreads = 256;
/// W = 2, one chunk a thread: the one-peer kernel needs about 40 registers,
/// so its blocks can be 1,024 threads; used for W = 2 shards above
/// kLlOnePeerAbove (faster there, slower below: fewer SMs move the lines).
inline constexpr std::uint32_t kLlThreadsOnePeer = 1024;
inline constexpr std::uint64_t kLlOnePeerAbove = 128 * 1024;
inline constexpr std::uint32_t kLlHeld = 16; ///< 16-byte chunks of peers' rows one thread holds
/// Blocks of one LL call, at most: W = 2 kernels hold one peer (few
/// registers, many blocks fit); wider worlds hold up to kLlHeld chunks
/// (about 240 registers, one block per SM), and every block of every rank
/// sharing a GPU must be resident at once.
TPF_HD constexpr std::uint32_t llMaxBlocks(std::uint32_t world) { return world <= 2 ? 32u : 8u; }
/// Most 16-byte chunks per thread for world W: 4, 2 or 1, so that (W - 1) x chunks <= kLlHeld.
TPF_HD constexpr std::uint32_t llChunksPerThread(std::uint32_t world) {
    return world <= 1 ? 4u : (world - 1) * 4 <= kLlHeld ? 4u : (world - 1) * 2 <= kLlHeld ? 2u : 1u;
}
/// Largest shard the LL path takes at this world (W = 2: 512 KiB; 3..5: 128 KiB; 6..9: 64 KiB; 10..16: 32 KiB).
TPF_HD constexpr std::uint64_t llMaxBytes(std::uint32_t world) {
    return std::uint64_t(llMaxBlocks(world)) * kLlThreads * llChunksPerThread(world) * 16;
}
/// Chunks per thread of a multi-block LL call when DeviceGroupView::llChunks
/// is 0 and W > 2 (W = 2: two chunks up to kLlOnePeerAbove, see llGridFor).
inline constexpr std::uint32_t kLlChunksDefault = 1;
/// W > 2, llChunks 0, shards of at most llMaxBlocks(W) x this many 16-byte
/// chunks: one chunk a thread over blocks of this many threads, so that the
/// W - 1 copies of every line are stored (and the peers' lines polled) by
/// several SMs instead of one block's: the cross-block verdict costs less
/// than one SM storing (W - 1) x 2 x the shard.
inline constexpr std::uint32_t kLlSpreadThreads = 64;
/// Offset of the LL area in a device region of this layout.
constexpr std::uint64_t llAreaOffset(const Layout& l) { return roundUp(l.totalBytes(), kSlotAlign); }
/// The LL area's own layout: two phases x world slots of twice the LL bytes
/// (two lines a 16-byte chunk) and the tag line; world 0 when none fits.
inline Layout llLayoutOf(const Layout& l) {
    const std::uint64_t bytes = l.slotBytes < llMaxBytes(l.world) ? l.slotBytes : llMaxBytes(l.world);
    auto ll = Layout::of(l.world, roundUp(2 * bytes + 16, kSlotAlign), 1);
    return ll ? *ll : Layout{};
}
/// Bytes a device region needs for the flag path and the LL area.
inline std::uint64_t regionBytesWithLl(const Layout& l) {
    const Layout ll = llLayoutOf(l);
    return ll.world ? llAreaOffset(l) + ll.totalBytes() : l.totalBytes();
}

} // namespace tpf::kernels
