// tpfabric — staged calls: any byte count and all-gather-v over the fixed-size
// collective kernel (kernels/collectives.hpp), without touching its protocol.
//
// The collective kernel moves whole 16-byte vectors of one shard size on
// every rank. A call whose size is not a multiple of 16 (an all-gather of
// 100 bytes, a bf16 sum of 1,000 elements), or whose rows differ per rank
// (all-gather-v), is run as three stream-ordered launches, all capturable:
//   1. pack:   the shard into a device scratch row, rounded up to 16 bytes
//              (all-gather-v: behind a RowHeader naming the sender's counts);
//   2. the collective kernel over the padded size, scratch to scratch;
//   3. unpack: only if the call succeeded (DeviceState::failures is still 0,
//              and, for all-gather-v, every row's header matches the own
//              counts), each row's real bytes into the caller's buffer, rows
//              packed in rank order.
// Every rank computes the padded size from values every rank passes alike
// (bytes, count, counts), so every rank takes the same path with the same
// epoch. Ranks whose counts differ stage different sizes: the headers at
// offset 0 of every row, which every call rewrites, name the mismatch, and
// unpack records GroupMismatch on that rank and writes nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/collectives.hpp"

namespace tpf::kernels {

/// Copies `bytes` of `send` to `dst`, after a RowHeader when `header` is not
/// null (dst then gets the header at 0 and the bytes at 16). dst is a
/// 16-byte-aligned scratch row; send may have any alignment.
cudaError_t launchPackRow(void* dst, const RowHeader* header, const void* send, std::uint64_t bytes,
                          cudaStream_t stream);

/// What unpack takes out of a gathered scratch (W rows of `pitch` bytes).
struct UnpackRows {
    std::uint64_t pitch = 0;              ///< bytes between rows in the scratch, a multiple of 16
    std::uint32_t rows = 0;               ///< W for a gather, 1 for a sum
    std::uint32_t headers = 0;            ///< 1: every row starts with a RowHeader (all-gather-v)
    std::uint64_t countsHash = 0;         ///< headers: the own countsHash every row must carry
    std::uint32_t statsOp = 0;            ///< StatsOp a mismatch is counted under (as an error of that call)
    std::uint64_t statsBytes = 0;         ///< the bytes that call counted, taken back on a mismatch
    std::uint64_t bytes[kMaxWorld] = {};  ///< row r's real bytes
    std::uint64_t offset[kMaxWorld] = {}; ///< where row r goes in recv
};
static_assert(std::is_trivially_copyable_v<UnpackRows>);

/// Unpacks the rows of the call `view` ran last on this stream into recv
/// (any alignment), or, if that call failed, writes nothing. With headers, a
/// row whose header does not match (countsHash, its bytes, the magic) fails
/// the call: GroupMismatch naming the lowest such rank is recorded in the
/// control block (check() reports it, the group is broken) and nothing is written.
cudaError_t launchUnpackRows(const DeviceGroupView& view, const void* scratch, void* recv, const UnpackRows& rows,
                             cudaStream_t stream);

/// Loads the pack and unpack kernels now (see preloadKernels: a lazy load
/// can wait behind another rank's spinning collective in the same process).
cudaError_t preloadStagingKernels();

} // namespace tpf::kernels
