// An NCCL communicator for W rank processes that already share a bootstrap:
// rank 0 draws the ncclUniqueId, the bootstrap all-gathers it, every rank
// joins on its current CUDA device. Used by tpf-gpurank and tpf-gpubench
// (one process per GPU; NCCL refuses two ranks on one GPU).
#pragma once

#include <nccl.h>

#include <string>
#include <vector>

#include <tpfabric/tpfabric.hpp>

namespace tpf::gputest {

inline Result<ncclComm_t> ncclCommOver(Bootstrap& boot) {
    ncclUniqueId id{};
    if (boot.rank() == 0)
        if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
            return Error{Errc::NcclError, std::string("ncclGetUniqueId: ") + ncclGetErrorString(r)};
    std::vector<ncclUniqueId> all(boot.world());
    if (auto s = boot.allGather(&id, all.data(), sizeof id); !s) return s.error();
    ncclComm_t comm = nullptr;
    if (ncclResult_t r = ncclCommInitRank(&comm, int(boot.world()), all[0], int(boot.rank())); r != ncclSuccess)
        return Error{Errc::NcclError, std::string("ncclCommInitRank: ") + ncclGetErrorString(r) +
                                          " (one rank per GPU; NCCL_NVLS_ENABLE=0 on shared machines)"};
    return comm;
}

} // namespace tpf::gputest
