// The client's small internal API for the in-tree test programs and
// benchmarks (tests/gpu, bench/gpu): test hooks and read-only views of an
// open group. Linked from libtpfabric_internal; nothing here is exported from
// libtpfabric.so or installed, so a release cannot be made to fail its probe
// or to skip its counts. Programs include this, never client/impl.hpp.
#pragma once

#include <cstdint>
#include <vector>

#include "proto/ring.hpp"
#include "tpf_config.h"
#include <tpfabric/tpfabric.hpp>

#if TPF_HAVE_CUDA
#include "kernels/collectives.hpp"
#endif
#if TPF_HAVE_NCCL
#include <nccl.h>

#include <string>
#endif

namespace tpf::testing {

/// The load-time probe of `rank` disagrees with the reference (-1: none).
void setProbeSabotage(int rank);
int probeSabotage();
/// Device groups on one machine: a node index per rank (empty: the daemon's
/// view). Ranks of another index are treated as another node's: their route
/// stays the proxy while same-index peers take ipc, as in a group spanning
/// nodes.
void setTestNodes(std::vector<std::uint32_t> nodes);
const std::vector<std::uint32_t>& testNodes();
/// Device groups opened after setDeviceStats(false) do not count their calls
/// (to measure what counting costs).
void setDeviceStats(bool on);
bool deviceStats();
/// Groups opened after setDataProtocol(p) announce data protocol p in round
/// 0 (bootstrap_proto::kDataProtocol by default), as another libtpfabric
/// release would.
void setDataProtocol(std::uint16_t protocol);
std::uint16_t dataProtocol();

/// The group's counts in its command ring, as the daemon reads them.
const RankStats& ringStats(const Group& g);
#if TPF_HAVE_CUDA
/// The device view a Device group's kernels run with (the group must be on
/// the fabric path, not fallen back).
const kernels::DeviceGroupView& deviceView(const Group& g);
#endif

#if TPF_HAVE_NCCL
/// An NCCL communicator for W rank processes that already share a
/// bootstrap: rank 0 draws the ncclUniqueId, the bootstrap all-gathers it,
/// every rank joins on its current CUDA device (one rank per GPU: NCCL
/// refuses two ranks on one GPU).
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
#endif

} // namespace tpf::testing
