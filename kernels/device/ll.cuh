// tpfabric device primitives — the low-latency (LL) protocol, device half:
// the line format, the tag line, the scrub and the filler. The host half
// (sizes, the LL area's layout, grids) is kernels/device/ll.hpp.
//
// Every 16-byte line a rank stores into a peer's LL slot is {d0, f, d1, f}
// with f = the low 32 bits of the epoch, written by one st.volatile.v4
// (stLl): each 8-byte half (data word + flag) lands whole, so a reader that
// sees f in both halves has the line's data, with no fence, release store or
// separate flag (NCCL's LL protocol). Stale lines carry f of epoch e - 2
// (same phase), and the area is zeroed at creation (epochs start at 1).
// Who writes: peer q's kernel, into slot (p, q) of this rank's LL area only.
// Who reads: this rank's kernel, polling with ldLl until both halves of
// both lines of a chunk carry f.
//
// Chunk c (16 bytes of the shard) of n goes to line c (its first 8 bytes)
// and line n + c (its last 8) of the slot, so that each store and load
// instruction of a warp covers 512 contiguous bytes in whole 32-byte sectors
// (lines 2c and 2c + 1 would leave a 16-byte hole after every 16 bytes of
// each instruction, measurably slower from 8 KiB).
//
// The call's tag (callTagOf: op, dtype, bytes) travels in one more line,
// the tag line at 2n of the slot, {tag, f, kLlTagMagic, f}, stored before
// the data. A rank that called with another size finds there a data line of
// the peer or the peer's tag of another call: GroupMismatch, naming the peer.
// It then fills the lines of its slot past its tag line in every peer with
// {0, f, 0, f} (llFill), lines a peer of a larger size still waits for,
// whose tag line thus reads tag 0 (no call's) at this epoch: every rank
// fails the call at once, nothing written.
//
// f is 32 bits of a 64-bit epoch: a line a call of epoch e' left and nothing
// rewrote since would pass for one of epoch e' + 2^32 (half a day of calls at
// 100,000 a second, after a large call and only smaller ones). So every call
// also scrubs one line of each peer's slot (p, rank) that it does not write,
// round robin over the slot: line (e >> 1) mod lines (32 bits of the
// counter), if past 2n (the tag line), gets {0, f + 2^31, 0, f + 2^31}, a flag
// no epoch within 2^31 of e has (llScrub). Every line of a slot is then
// rewritten (data or scrub) within 2 x lines epochs of the slot's phase. A
// peer reads only lines up to 2n of slot (p, rank) at e, and at e + 2 only
// after this rank's kernel of e ended: the scrub never races a read.
#pragma once

#include <cstdint>

#include "kernels/device/call.cuh"

// TPF_LL_SCRUB=0 (compile time, tests/gpu/run.sh's TPF_GPU_NVCC_FLAGS) leaves
// the scrub out: for the GPU test that shows why it is there ("LL epoch wrap").
#ifndef TPF_LL_SCRUB
#define TPF_LL_SCRUB 1
#endif

namespace tpf::kernels::detail {

/// Failure codes a block shares (shared memory), beyond the Errc values.
inline constexpr std::uint32_t kLlKeep = 0xffffu; ///< fail without touching the control block (sticky, daemon-written)
inline constexpr std::uint32_t kLlTagMagic = 0x47415454u; ///< "TTAG": the third word of a tag line (never a filler's 0)

/// Chunk c of an n16-chunk shard into a peer's slot `dst` at flag f: two lines.
__device__ __forceinline__ void llPutChunk(std::uint8_t* dst, std::uint64_t n16, std::uint64_t c, uint4 v,
                                           std::uint32_t f) {
    stLl(dst + c * 16, v.x, v.y, f);
    stLl(dst + (n16 + c) * 16, v.z, v.w, f);
}
/// The tag line of a call of n16 chunks into a peer's slot `dst` (before the data).
__device__ __forceinline__ void llPutTag(std::uint8_t* dst, std::uint64_t n16, std::uint32_t ctag, std::uint32_t f) {
    stLl(dst + 2 * n16 * 16, ctag, kLlTagMagic, f);
}
/// Both lines of a chunk (a: line c, z: line n + c) carry flag f: its data is in.
__device__ __forceinline__ bool llSeen(uint4 a, uint4 z, std::uint32_t f) {
    return a.y == f && a.w == f && z.y == f && z.w == f;
}
/// The 16 bytes of a chunk from its two lines.
__device__ __forceinline__ uint4 llChunk(uint4 a, uint4 z) { return make_uint4(a.x, a.z, z.x, z.z); }
/// A tag line read at flag f: in (both halves carry f), and if in, whether it is the call's own tag.
__device__ __forceinline__ bool llTagIn(uint4 t, std::uint32_t f) { return t.y == f && t.w == f; }
__device__ __forceinline__ bool llTagAgrees(uint4 t, std::uint32_t ctag) { return t.x == ctag && t.z == kLlTagMagic; }
/// The scrub of one line of a call of epoch e and n16 chunks into slot `dst`
/// of a peer's LL area of `lines` lines (top of the file); no store when the
/// round robin lands on a line the call writes.
__device__ __forceinline__ void llScrub(std::uint8_t* dst, std::uint32_t m, std::uint32_t f) {
    stLl(dst + std::uint64_t(m) * 16, 0, 0, f + (1u << 31));
}
/// The filler (top of the file): lines 2n + 1 .. lines of slot `dst` get
/// {0, f, 0, f}, by threads `tid` of `stride`.
__device__ __forceinline__ void llFill(std::uint8_t* dst, std::uint64_t n16, std::uint64_t lines, std::uint32_t f,
                                       std::uint32_t tid, std::uint32_t stride) {
    for (std::uint64_t l = 2 * n16 + 1 + tid; l < lines; l += stride) stLl(dst + l * 16, 0, 0, f);
}

} // namespace tpf::kernels::detail
