// The TPF_* environment of a rank, read once per Group::open. Every variable
// has a fixed set of accepted values; anything else fails the open with
// ConfigError naming the variable and what it accepts (docs/integration.md
// has the table of every variable, client and daemon).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <tpfabric/tpfabric.hpp>

namespace tpf {

struct ClientEnv {
    std::string socket;                    ///< TPF_SOCKET: daemon socket path ("" unset)
    bool disable = false;                  ///< TPF_DISABLE=1: the group stays on NCCL, the daemon is not contacted
    std::optional<Fallback> fallback;      ///< TPF_FALLBACK: nccl | error
    std::optional<GpuRoute> gpuRoute;      ///< TPF_GPU_ROUTE: auto | ipc | proxy
    std::optional<std::uint64_t> ncclAbove; ///< TPF_NCCL_ABOVE: bytes ("64KiB") or never (~0)
    bool lowLatency = true;                ///< TPF_GPU_LL: 1 | 0
    std::uint32_t llChunks = 0;            ///< TPF_GPU_LL_CHUNKS: 1 | 2 | 4 (0 unset)
    bool pdl = true;                       ///< TPF_GPU_PDL: 1 | 0 (device calls: programmatic dependent launch)
    std::uint32_t pollWarps = 0;           ///< TPF_GPU_POLLERS: 1..4 (0 unset: kFlagCopies)
    bool hostDirect = true;                ///< TPF_HOST_DIRECT: 1 | 0 (host groups: read same-node peers' rows in their regions)
};

/// Reads every client variable; the first bad one is a ConfigError
/// "TPF_FALLBACK=fallback: accepted values are nccl, error". A TPF_* name
/// one edit from a client variable's (TPF_DISBALE) is reported once
/// per process on stderr; it does not fail the open (tools and tests set
/// TPF_* names of their own).
Result<ClientEnv> readClientEnv();

} // namespace tpf
