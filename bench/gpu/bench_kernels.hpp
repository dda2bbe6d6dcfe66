// Reference kernels of the GPU benchmark: the floors (one copy kernel of the
// same bytes; one kernel that stores them into every peer and releases a
// flag the peer waits on) and a raw host-mapped flag ping-pong.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tpf::gpubench {

/// One kernel copying `bytes` (16-byte multiple) with the collectives' grid
/// sizing (one block of 256 threads per 16 KiB, at most 32).
void launchCopy(void* dst, const void* src, std::uint64_t bytes, cudaStream_t s);
/// The same copy launched with programmatic dependent launch (the kernel
/// waits for the one before it on the GPU), the floor of calls that use it.
void launchCopyPdl(void* dst, const void* src, std::uint64_t bytes, cudaStream_t s);
/// `iters` round trips: the kernel stores i+1 to ping (host-mapped), waits for
/// pong == i+1 written by a CPU thread. Returns when done; the host measures.
void launchPingPong(std::uint64_t* ping, const std::uint64_t* pong, std::uint64_t iters, cudaStream_t s);
/// The same round trip polled as the collectives poll a flag in host memory
/// (kernels/device/flag.cuh, waitPeers): `warps` warps (1..4), warp w reading
/// pong[w * 4] (its own 32-byte copy) from w * 250 ns after warp 0's store to
/// ping; the CPU thread writes all `warps` copies. laps[i]: %globaltimer from
/// the store to the first warp's sight of pong (ns).
void launchPingPongWarps(std::uint64_t* ping, const std::uint64_t* pong, std::uint32_t warps, std::uint64_t iters,
                         std::uint64_t* laps, cudaStream_t s);
/// The exchange floor of a W-rank all-gather: every
/// rank's area is `world` rows of `rowBytes` and then the flags, one word per
/// (sender, block); the peers' areas are mapped through CUDA IPC.
constexpr std::uint32_t kFloorMaxWorld = 16, kFloorMaxBlocks = 32;
struct ExchangeFloor {
    std::uint8_t* peerArea[kFloorMaxWorld]; ///< peer q's area (IPC-mapped); nullptr for this rank
    std::uint32_t* flags;                   ///< this rank's flags: [sender * kFloorMaxBlocks + block]
    std::uint32_t* epochs;                  ///< this rank's calls so far, per block (device memory)
    std::uint64_t rowBytes;                 ///< a row's size; the flags follow world rows
    std::uint32_t world, rank;
    bool system; ///< flags at system scope (peers on other GPUs) rather than GPU scope (one GPU, MPS)
};
/// Bytes of one rank's area (rows and flags) for `world` rows of `rowBytes`.
constexpr std::uint64_t floorAreaBytes(std::uint32_t world, std::uint64_t rowBytes) {
    return world * rowBytes + kFloorMaxWorld * kFloorMaxBlocks * 4;
}
/// One call of the floor: `bytes` (16-byte multiple, at most rowBytes) of
/// `src` stored into row `rank` of every peer's area by the copy kernel's
/// grid (launchCopy), then each block releases its flag in every peer and
/// waits until every peer's same block has released its own here. Nothing
/// is read back or copied out: what a one-shot flag protocol over these
/// links pays at least (the LL path, whose lines carry their own flags, does
/// without the release; at W = 8 the one thread that releases and polls
/// every peer's flag in turn makes this no floor). `pdl`:
/// launched as the collectives are (programmatic dependent launch), else
/// plainly.
void launchExchangeFloor(const ExchangeFloor& f, const void* src, std::uint64_t bytes, bool pdl, cudaStream_t s);
cudaError_t preloadBenchKernels();

} // namespace tpf::gpubench
