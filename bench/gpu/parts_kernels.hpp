// The library's collective kernels taken apart, for tpf-gpubench's --mode
// parts and --mode hop: the same kernel bodies (kernels/collectives_kernel.cuh,
// kernels/ll_kernel.cuh) instantiated with a timeline probe, launched with the
// library's shapes (kernels/collectives_launch.cuh), and the proxy hop alone,
// composed from the device primitives (kernels/device/). Bench code only: the
// library's kernels carry none of it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/collectives.hpp"

namespace tpf::gpubench {

/// Phases of the calls launched by launchTimed* (device memory, zeroed by
/// the caller; ns summed, block 0's view of each call). Flag path: [0] kernel
/// entry to the doorbell (the put), [1] doorbell to every peer's flag seen,
/// [2] flags to its part of the output written. LL path: [0] epoch read to
/// the puts issued, [1] to every line seen, [2] to the output. `calls`:
/// calls summed. Calls must be stream-ordered (one Timeline, one call at a time).
struct Timeline {
    std::uint64_t phase[3];
    std::uint64_t calls;
    std::uint64_t publishedNs; ///< the running flag-path call's doorbell (%globaltimer), written by its publishing block
    std::uint64_t reserved[3];
};

/// kernels::launchAllGather / launchAllReduceSum with every call's phases
/// summed into `t`: the same kernel bodies, shapes and launch attributes, so
/// the call is the library's but for the probe's clock reads and sums.
cudaError_t launchTimedAllGather(const kernels::DeviceGroupView& view, const void* send, void* recv,
                                 std::uint64_t bytes, Timeline* t, cudaStream_t stream);
cudaError_t launchTimedAllReduceSum(const kernels::DeviceGroupView& view, const void* send, void* recv,
                                    std::uint64_t count, DType dtype, Timeline* t, cudaStream_t stream);

/// The proxy hop alone (--mode hop, --mode parts): `iters` calls of a
/// `bytes` shard (16-byte multiple, at most the slot) by one block of
/// `pollWarps` warps (the view's, as the collectives'), no output and no
/// launch per call: stage, doorbell, wait for every peer's flags. With `laps`
/// (device memory, iters entries) lap i is the ns from the doorbell to the
/// winning poll of the peers' flags (the daemon's carry of the shard
/// included, the staging not). Stops after the first failed call (recorded
/// as a call's). Needs a view with a proxy (shm or verbs) peer, the same on
/// every rank; every rank runs it with the same iters and bytes, between
/// calls. Returns cudaErrorInvalidValue, launching nothing, for an ipc-only
/// view or a bad size.
cudaError_t launchProxyHopLoop(const kernels::DeviceGroupView& view, std::uint64_t iters, std::uint64_t* laps,
                               cudaStream_t stream, std::uint64_t bytes = 16);

/// Loads every kernel above now (see kernels::preloadKernels).
cudaError_t preloadPartsKernels();

} // namespace tpf::gpubench
