// tpfabric device primitives — what every collective call's kernel shares:
// the operation it runs, how a block's share of the vectors is cut, how a
// failure is recorded for the host (the device half of readFailure), and how
// a call is counted (in DeviceStats and, live, in the ring's RankStats the
// daemon reads). Device code only.
#pragma once

#include <cstdint>

#include "kernels/collectives.hpp"
#include "kernels/device/ptx.cuh"

namespace tpf::kernels::detail {

/// The kernel's operation: the gather, or the rank-order sum of one dtype
/// (also hashed into the call's tag, callTagOf).
enum class Op : std::uint32_t { Gather, SumF32, SumF16, SumBF16 };

inline constexpr std::uint32_t kWarp = 32;
inline constexpr std::uint32_t kUnroll = 4; ///< 16-byte vectors in flight per thread in a put or a gather

/// [begin, end) of `total` items for block b of nb, contiguous and balanced.
struct Range {
    std::uint64_t begin, end;
};
__device__ __forceinline__ Range blockRange(std::uint64_t total, std::uint32_t b, std::uint32_t nb) {
    const std::uint64_t per = (total + nb - 1) / nb;
    const std::uint64_t lo = per * b < total ? per * b : total;
    const std::uint64_t hi = per * (b + 1) < total ? per * (b + 1) : total;
    return {lo, hi};
}

/// Records this rank's failure in its control block (host memory the daemon
/// and readFailure read): `missing` first (relaxed), then the error word
/// (release), so a reader that acquires the error sees the peer it names.
/// One thread per call; the daemon's own record is never overwritten by the
/// callers (they skip this when the error came from the daemon).
__device__ __forceinline__ void recordFailure(ControlBlock* c, std::uint32_t code, std::uint32_t missing) {
    stRelaxedSys(&c->missingPeer, missing);
    stReleaseSys(&c->error, code);
}

/// Marks a failed call in host memory (ControlBlock::callFailed, release,
/// after the call's record), where Group::health() reads it without a
/// stream synchronisation. Beside every DeviceState::failures increment: that
/// count is device memory, and a failure whose record is the daemon's (an
/// orderly leave the call went past) leaves nothing else to tell it by.
__device__ __forceinline__ void markCallFailed(ControlBlock* c) { stReleaseSys(&c->callFailed, 1u); }

using U64 = unsigned long long;

/// A count's new total into the ring's RankStats (host memory the daemon
/// reads for status and metrics): a relaxed system-scope store, posted (the
/// thread does not wait for it). Totals, not increments: a store that lands
/// late or twice counts nothing twice. Calls of one group run one at a time
/// (each waits for the epoch of the one before), so one total follows the other.
__device__ __forceinline__ void publishTotal(std::uint64_t* ringField, std::uint64_t total) {
    stRelaxedSys(ringField, total);
}

/// One thread of a call, while the call waits for its peers anyway: count
/// the call and its bytes in DeviceStats (taken back if it fails) and
/// publish the new totals to the ring, so the daemon's status sees device
/// calls live, without check(). The atomics return their totals (an L2
/// round trip of this one thread, inside the call's peer wait); the stores
/// into host memory are posted.
__device__ inline void countCall(const DeviceGroupView& v, const CallTag& tag) {
    DeviceStats* d = v.stats;
    if (d == nullptr || !tag.record || tag.op >= kStatsOps) return;
    const U64 calls = atomicAdd(reinterpret_cast<U64*>(&d->ops[tag.op].calls), 1ull) + 1;
    const U64 bytes = atomicAdd(reinterpret_cast<U64*>(&d->ops[tag.op].bytes), U64(tag.bytes)) + tag.bytes;
    if (RankStats* r = v.ringStats) {
        publishTotal(&r->ops[tag.op].calls, calls);
        publishTotal(&r->ops[tag.op].bytes, bytes);
    }
}

/// A failed call's count (the error, its name, its bytes taken back), in
/// DeviceStats and published to the ring like countCall's. The slow path.
__device__ inline void countFailure(const DeviceGroupView& v, std::uint32_t op, std::uint64_t callBytes, std::uint32_t code) {
    DeviceStats* d = v.stats;
    if (d == nullptr || op >= kStatsOps) return;
    const U64 errors = atomicAdd(reinterpret_cast<U64*>(&d->ops[op].errors), 1ull) + 1;
    const U64 bytes = atomicAdd(reinterpret_cast<U64*>(&d->ops[op].bytes), U64(0) - U64(callBytes)) - callBytes; // completed calls only
    d->lastError = code;
    U64 byCode = 0;
    if (code < kStatsErrcSlots) byCode = atomicAdd(reinterpret_cast<U64*>(&d->errorsByCode[code]), 1ull) + 1;
    if (RankStats* r = v.ringStats) {
        publishTotal(&r->ops[op].errors, errors);
        publishTotal(&r->ops[op].bytes, bytes);
        if (code < kStatsErrcSlots) publishTotal(&r->errorsByCode[code], byCode);
        stRelaxedSys(&r->lastError, code);
    }
}

/// The last block out, once per call: a failure is counted here (the slow
/// path anyway); a success needs nothing more.
__device__ inline void endCall(const DeviceGroupView& v, const CallTag& tag, bool ok, std::uint32_t code) {
    if (ok || !tag.record) return;
    countFailure(v, tag.op, tag.bytes, code);
}

/// A kernel's probe: hooks at the points of a call a benchmark times
/// (bench/gpu's timeline and hop loop). The library's kernels run with
/// NoProbe: every hook is guarded by `if constexpr (Probe::kOn)`, so neither
/// a clock read nor a store of it is compiled into them. A probe with kOn
/// provides the hooks the kernel it is passed to names (see their calls in
/// collectives_kernel.cuh, ll_kernel.cuh and flag.cuh's waitPeers).
struct NoProbe {
    static constexpr bool kOn = false;
};

} // namespace tpf::kernels::detail
