// GpuPath: the GPU side of a Device group. Internal to libtpfabric (CUDA builds).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>

#include "client/impl.hpp"
#include "kernels/collectives.hpp"

namespace tpf {

/// One mapping of a cuMemCreate'd device region: the own one (exported) or a
/// same-node peer's (imported from the fd the daemon forwarded).
struct DeviceMapping {
    CUmemGenericAllocationHandle handle = 0;
    CUdeviceptr ptr = 0;
    std::size_t bytes = 0;
};

struct GpuPath {
    int device = 0;
    kernels::DeviceGroupView view{}; ///< passed by value into every kernel (captured graphs hold a copy)
    kernels::DeviceState* state = nullptr;
    void* regionHost = nullptr; ///< the region memfd mapping, cudaHostRegister'ed (Mapped|Portable)
    void* ringHost = nullptr;   ///< the ring memfd mapping, likewise
    bool ipc = false;           ///< same-node peers over ipc (own device region + peers' mappings)
    bool llWanted = false;      ///< own region carries the LL area (and, after sharing, every peer's did)
    DeviceMapping own;
    std::array<DeviceMapping, kMaxWorld> peers{};
    void* comm = nullptr;       ///< ncclComm_t of an NcclBootstrap: fallback and above-cap calls
    /// With a communicator: shards above these go by NCCL although they fit
    /// the cap (the measured crossover, docs/perf.md), agreed (min) at open.
    std::uint64_t ncclAboveGather = ~0ull;
    std::uint64_t ncclAboveSum = ~0ull;
    /// Staged calls (kernels/staging.hpp: sizes not a multiple of 16, all-gather-v):
    /// one send row and `world` receive rows of layout.slotBytes each, device memory.
    std::uint8_t* scratch = nullptr;
    /// Device-side counts of this rank's calls (kernels publish them to the ring's RankStats).
    kernels::DeviceStats* stats = nullptr;

    ~GpuPath();
};

} // namespace tpf
