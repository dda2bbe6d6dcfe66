// tpfabric — the device side of the GPU data path: one fused kernel per
// collective call (put, wait, gather or sum), host-callable launchers, and
// what the host reads back after a failure. See docs/gpu.md. The kernels are
// composed from the device primitives of kernels/device/ (put, publish, wait,
// LL lines, the rank-order sum), which tests/gpu and bench/gpu compose too.
//
// One call, epoch e = DeviceState::epoch + 1, phase p = e & 1:
//   1. put: the shard goes to slot (p, rank) of the own region when a proxy
//      peer exists (the daemon's source), and straight into slot (p, rank) of
//      every ipc peer's region; then, once every block has stored its part,
//      the epoch is release-stored (.sys) into each ipc peer's flag
//      (p, rank, k) for every stripe k, and a Doorbell{e, bytes, group} is
//      published on the command ring (the daemon copies to shm/verbs peers).
//   2. wait: block 0 polls every peer's flags (p, src, k) >= e with
//      ld.acquire.sys, bounded by timeoutNs (%globaltimer), ending early on
//      ControlBlock.abort or ControlBlock.error.
//   3. on success: gather rows in rank order into recv, or sum rows in rank
//      order 0..W-1; on failure: record {error, missingPeer} in the control
//      block and write nothing to recv.
//   4. the last block to finish advances DeviceState::epoch to e.
// No host call and no host-side epoch: a captured CUDA graph of any number
// of calls replays any number of times. Calls of ipc-only groups up to
// llMaxBytes(W) take the LL path instead (below): same epochs, phases,
// failure rules and all-or-none output, data and epoch in every line.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include <tpfabric/error.hpp>
#include <tpfabric/tpfabric.hpp>

#include "proto/layout.hpp"
#include "proto/ring.hpp"
#include "proto/peer_wire.hpp"
#include "kernels/device/ll.hpp"

namespace tpf::kernels {

/// Element types of an all-reduce sum: tpf::DType of the API (f16/bf16
/// accumulate in f32 in rank order and round once, to nearest even).
using tpf::DType;

inline constexpr std::uint32_t kDefaultMaxBlocks = 32;  ///< DeviceGroupView::maxBlocks when 0
inline constexpr std::uint64_t kBytesPerBlock = 16384;  ///< shard bytes one block handles before another is added
/// The same for a call with a proxy-route peer above kProxyOneBlockMax: its
/// rows are staged to and read from host memory over PCIe, where the loads
/// in flight (not the bandwidth) bound the speed, so more blocks share the
/// bytes (a row read back by 16 blocks after the flag takes a fraction of
/// what a copy kernel of 4 blocks takes).
inline constexpr std::uint64_t kProxyBytesPerBlock = 4096;
inline constexpr std::uint64_t kProxyOneBlockMax = 8192;
inline constexpr std::uint32_t kThreadsPerBlock = 256;

/// Per-rank state in device memory (createDeviceState), read and written only
/// by this rank's kernels, except where a field says otherwise. All calls of
/// one group on one device must be stream-ordered (one stream, or events):
/// a call reads `epoch` that the previous call's last block wrote.
struct DeviceState {
    std::uint64_t epoch;         ///< @0  last epoch whose call finished; the next call uses epoch + 1
    std::uint64_t verdict;       ///< @8  block 0's outcome of the running call: epoch | kVerdictFailed
    std::uint64_t ringFullEpoch; ///< @16 epoch whose doorbell found the ring full for the whole timeout
    std::uint32_t ringHead;      ///< @24 doorbells published: device-held RingHeader::subHead (single producer)
    std::uint32_t putArrive;     ///< @28 blocks done with the put of the running call (wraps to 0)
    std::uint32_t doneArrive;    ///< @32 blocks done with the running call (wraps to 0)
    std::uint32_t failures;      ///< @36 calls that failed; non-zero makes every later LL call fail at once (sticky)
    std::uint32_t llArrive[2];   ///< @40 LL calls of epoch e use [e & 1]: blocks arrived (low 16 bits), failed ones (high 16);
                                 ///<     every call (both kernels) zeroes [(e + 1) & 1] for the next one at its start
    std::uint32_t llCode;        ///< @48 LL calls: largest failure code a block saw (the last block to arrive resets it)
    std::uint32_t llMissing;     ///< @52 LL calls: lowest rank a block timed out on, kNoPeer if none (likewise)
    std::uint32_t ringTail;      ///< @56 RingHeader::subTail as last read: the ring is re-read (a PCIe round trip)
                                 ///<     only when it looks full from here
    std::uint32_t reserved0;     ///< @60
    std::uint8_t reserved[64];   ///< @64 (the line's rest: the counters above share no line with another group's)
};
static_assert(sizeof(DeviceState) == 128);
static_assert(std::is_trivially_copyable_v<DeviceState>);
inline constexpr std::uint64_t kVerdictFailed = 1ull << 63;

/// Counts of this rank's device calls (calls, bytes, errors by name), kept
/// in device memory by the kernels, which also publish each new total into
/// the ring's RankStats (host memory the daemon reads for status and
/// metrics) as they count: the daemon sees device calls live, with no
/// check(). A call counts itself and its bytes while it waits for its peers
/// (taken back if it fails); nothing is counted at a kernel's end, where the
/// call's completion would wait for it. Calls the library hands to NCCL
/// inside a CUDA graph are counted by a one-thread kernel captured beside
/// them (launchCountNccl); eager ones by the host. Latencies are not
/// counted: timing a call on the device and keeping it costs about a third
/// of a 4 KiB call, more than they are worth; the host path has them.
struct DeviceStats {
    OpStats ops[kStatsOps];
    std::uint64_t errorsByCode[kStatsErrcSlots];
    std::uint32_t lastError; ///< Errc of the last failed call
    std::uint32_t reserved;
    std::uint64_t ncclCalls; ///< calls handed to NCCL that replayed in a graph (launchCountNccl)
    std::uint64_t ncclBytes;
};
static_assert(std::is_trivially_copyable_v<DeviceStats>);

/// Every total of `stats` (a copy read back after the stream synchronised)
/// into the ring's RankStats: at close(), after the last call, the same
/// totals the kernels published as they counted.
void publishDeviceStats(const DeviceStats& stats, RankStats& ring);

/// What one call counts as (staged calls pass the caller's op and bytes to
/// the collective kernel that moves their padded rows).
struct CallTag {
    std::uint32_t op = 0;       ///< StatsOp
    std::uint32_t record = 1;   ///< 0: not counted
    std::uint64_t bytes = 0;    ///< this rank's bytes of the call
    std::uint32_t flagPath = 0; ///< 1: never the LL path. All-gather-v: ranks whose counts differ stage
                                ///< different sizes, and an LL wait for lines a shorter sender never
                                ///< wrote would only end at the timeout; flags end every rank's wait,
                                ///< so the row headers can name the mismatch.
};

/// What every rank of a device call must agree on, hashed to 32 bits (never
/// 0): the kernel's operation (`kernelOp`: the gather, or the sum of one
/// dtype), the op the call counts as, and its bytes (an all-gather-v: the
/// padded rows it launches, the same on every rank, since its counts differ
/// by design and its row headers check them). Ipc peers compare it on every
/// call (the LL path's tag line, kernels/device/ll.cuh; the flag path's tag word,
/// Layout::kFlagTagOffset), so ranks that pass another size, dtype or op
/// fail the call with GroupMismatch on every rank, nothing written.
TPF_HD constexpr std::uint32_t callTagOf(std::uint32_t kernelOp, const CallTag& t, std::uint64_t n16) {
    std::uint64_t h = (t.op == kStatsAllGatherV ? n16 * 16 : t.bytes) * 0x9e3779b97f4a7c15ull;
    h ^= (std::uint64_t(kernelOp) << 56) ^ (std::uint64_t(t.op) << 48);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    return std::uint32_t(h) | 1u;
}

/// Everything one rank's kernels need to know about its group. Trivially
/// copyable: it is passed by value as a kernel argument, so a captured graph
/// holds a copy (build the view once per group; it never changes).
/// Pointers are device-accessible addresses: device memory, a CUDA IPC
/// mapping, or cudaHostGetDevicePointer of a cudaHostRegister'ed mapping.
struct DeviceGroupView {
    Layout layout{};                          ///< the group's region layout (same on every rank)
    std::uint32_t rank = 0;                   ///< this rank
    std::uint32_t world = 0;                  ///< ranks in the group, == layout.world
    std::uint8_t wires[kMaxWorld] = {};      ///< Wire per rank; kWireSelf (0) at `rank`
    std::uint8_t* region = nullptr;           ///< own region where ipc peers deliver: the device region of an
                                              ///< ipc group, else == hostRegion (Layout::totalBytes bytes)
    std::uint8_t* hostRegion = nullptr;       ///< own host region (the daemon's memfd, mapped): where the shard is
                                              ///< staged for the proxy and proxy-route peers' rows and flags land
    ControlBlock* control = nullptr;          ///< own control block, in the host region (the daemon writes it)
    std::uint8_t* peerRegions[kMaxWorld] = {};///< regions of ipc peers (route kWireIpc), nullptr for the others
    std::uint8_t* ring = nullptr;             ///< command ring mapping (RingHeader at 0); needed iff a shm/verbs peer exists
    RingLayout ringLayout{};                  ///< entries of that ring
    std::uint32_t groupHandle = 0;            ///< Verdict.groupHandle, written into each Doorbell
    DeviceState* state = nullptr;             ///< this rank's DeviceState (device memory)
    std::uint64_t timeoutNs = 0;              ///< bound of one call's wait, > 0
    std::uint32_t maxBlocks = 0;              ///< grid cap per call (0: kDefaultMaxBlocks); all must fit on the GPU at once
    std::uint32_t pdl = 0;                    ///< 1: calls launch with programmatic dependent launch (sm_90+): a
                                              ///< call's blocks are scheduled while the kernel before it in the
                                              ///< stream ends, and wait for it on the GPU (gridDepWait), which
                                              ///< hides the launch gap; releases the next kernel once its peers'
                                              ///< data arrived. 0: plain launches
    std::uint32_t pollWarps = 0;              ///< calls with a proxy-route peer: warps that poll its flags in host
                                              ///< memory, each its own copy (1..kFlagCopies; 0: kFlagCopies); 1:
                                              ///< warp 0 alone
    std::uint32_t llChunks = 0;               ///< LL calls above one block: 256-thread blocks of this many chunks a thread (1, 2, 4); 0: the measured grid
    Layout ll{};                              ///< LL area's layout (2 x 8 data bytes per 16-byte line); world 0: no LL path
    std::uint64_t llOffset = 0;               ///< where the LL area starts in every ipc region (own and peers')
    DeviceStats* stats = nullptr;             ///< device memory, zeroed; nullptr: calls are not counted
    RankStats* ringStats = nullptr;           ///< the ring's RankStats (mapped host memory) the counts are published to
};
static_assert(std::is_trivially_copyable_v<DeviceGroupView>);

// The LL protocol's sizes (llMaxBytes, llLayoutOf, regionBytesWithLl, ...):
// kernels/device/ll.hpp.

/// Turns the LL path on for an ipc view whose regions (own and peers') are
/// regionBytesWithLl bytes, zeroed before first use.
void enableLowLatency(DeviceGroupView& view);

/// Checks a view once at set-up: world/rank/layout agree, wires are valid
/// (self exactly at rank), every ipc peer has a region, a ring and the host
/// region exist when a shm/verbs peer does, state/region/control set,
/// timeout > 0. Routes may mix: ipc to some peers, the proxy to others. Ok or
/// OutOfRange / BadMessage / Misaligned naming nothing further.
Errc validateView(const DeviceGroupView& view);

/// Checks one all-gather call: send, recv and bytes 16-byte aligned
/// (Misaligned), bytes <= layout.slotBytes (CapMismatch).
Errc validateAllGather(const DeviceGroupView& view, const void* send, const void* recv, std::uint64_t bytes);

/// Checks one all-reduce call: as validateAllGather for count * dtypeSize.
Errc validateAllReduceSum(const DeviceGroupView& view, const void* send, const void* recv, std::uint64_t count,
                          DType dtype);

/// Counts one call the library handed to NCCL, on `stream`: a one-thread
/// kernel, captured beside the NCCL call when the stream is capturing, so
/// that every replay counts (DeviceStats::ncclCalls, published to the ring's
/// ncclGraphCalls). Nothing when the view counts no calls.
cudaError_t launchCountNccl(const DeviceGroupView& view, std::uint64_t bytes, cudaStream_t stream);

/// All-gather of `bytes` from `send` into `recv` (world * bytes; row r holds
/// rank r's shard). Enqueues one kernel on `stream`; nothing else, so it can
/// be captured. Returns cudaErrorInvalidValue, launching nothing, when
/// validateAllGather (or a cheap view check) fails; bytes == 0 launches
/// nothing and returns cudaSuccess (every rank skips alike; the epoch does
/// not move). A failed wait is not a launch error: read it with readFailure.
cudaError_t launchAllGather(const DeviceGroupView& view, const void* send, void* recv, std::uint64_t bytes,
                            cudaStream_t stream, const CallTag* tag = nullptr);

/// All-reduce sum of `count` elements of `dtype` from `send` into `recv`
/// (count elements), summed in rank order 0..W-1 (bit-identical on every
/// rank): f32 adds in f32; f16/bf16 add in f32 from float(x0) and round to
/// nearest even once. Same contract as launchAllGather otherwise.
cudaError_t launchAllReduceSum(const DeviceGroupView& view, const void* send, void* recv, std::uint64_t count,
                               DType dtype, cudaStream_t stream, const CallTag* tag = nullptr);

/// Loads every collective kernel variant now. CUDA loads a kernel lazily at
/// its first launch (CUDA_MODULE_LOADING=LAZY, the default), and that load
/// may wait until the kernels already running on the device finish; a
/// collective spinning on a peer whose launch comes later from the same
/// process then waits out its whole timeout (seen on the H200 with W ranks in
/// one process). Call once per process before the first collective (group
/// open does); cheap after the first call.
cudaError_t preloadKernels();

/// Allocates and initialises a DeviceState (synchronous): `epoch` is the last
/// epoch this rank finished (0 for a fresh group), `ringHead` the ring's
/// current subHead (0 for a fresh ring). A host path that also pushes to the
/// ring or advances the epoch must resynchronise through readDeviceState /
/// writeDeviceState while no device call is in flight.
cudaError_t createDeviceState(DeviceState** out, std::uint64_t epoch, std::uint32_t ringHead);
cudaError_t destroyDeviceState(DeviceState* state);
/// Synchronous copy of the state (call after the stream synchronised).
cudaError_t readDeviceState(const DeviceState* state, DeviceState& out);
/// Synchronous overwrite of epoch and ringHead (counters are reset).
cudaError_t writeDeviceState(DeviceState* state, std::uint64_t epoch, std::uint32_t ringHead);

/// What a failed call left in the control block.
struct CallFailure {
    Errc error = Errc::Ok;            ///< Ok while healthy; Timeout, Aborted, GroupMismatch, or the daemon's code
    std::uint32_t missingPeer = kNoPeer; ///< Timeout: lowest rank whose flag had not arrived (own rank:
                                         ///< the ring stayed full); GroupMismatch: a rank whose call's tag
                                         ///< differs; otherwise what the daemon wrote
    std::uint64_t epoch = 0;          ///< ControlBlock.epoch: the last epoch a call of this rank started
};

/// Reads error, missingPeer and epoch of view.control (synchronous; device or
/// host-mapped memory alike). Call after the stream synchronised. The error
/// is sticky: every later call fails at once until the group is reopened.
cudaError_t readFailure(const DeviceGroupView& view, CallFailure& out);

} // namespace tpf::kernels
