// libtpfabric over NCCL (installed only with the meson feature `nccl`).
//
//   ncclComm_t comm = ...;                       // the engine's communicator
//   auto boot = tpf::NcclBootstrap::create(comm);
//   tpf::Options o;  o.buffers = tpf::Buffers::Device;
//   auto group = tpf::Group::open(**boot, rank, world, 512 * 1024, o);
//   group.value()->allGather(dsend, drecv, bytes, stream);
//
// A group opened over an NcclBootstrap falls back to NCCL (TPF_FALLBACK=nccl,
// the default) when the daemon is unreachable or refuses, or the load-time
// probe fails on any rank, on every rank together; calls above the agreed cap
// go to ncclAllGather / ncclAllReduce (sum) on the caller's stream.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <memory>

#include <tpfabric/tpfabric.hpp>

namespace tpf {

/// Bootstrap over a communicator: each allGather copies the record into a
/// device scratch buffer, runs ncclAllGather on a private stream and waits
/// for it. Not for the data path; for open-time records of a few KiB.
class TPF_API NcclBootstrap final : public Bootstrap {
public:
    /// `comm` is not owned and must outlive every group opened over it. Uses
    /// the current CUDA device.
    static Result<std::unique_ptr<NcclBootstrap>> create(ncclComm_t comm);
    ~NcclBootstrap() override;
    std::uint32_t rank() const override { return rank_; }
    std::uint32_t world() const override { return world_; }
    Status allGather(const void* mine, void* out, std::size_t bytes) override;
    /// Returns by `deadline`: Timeout when the all-gather did not complete
    /// (a rank of the communicator never called open, or is stuck). The
    /// collective cannot be withdrawn: the communicator is then wedged, this
    /// bootstrap refuses every later call, and the caller must
    /// ncclCommAbort the communicator (and may destroy this bootstrap).
    Status allGatherUntil(const void* mine, void* out, std::size_t bytes, Clock::time_point deadline) override;
    ncclComm_t comm() const { return comm_; }

private:
    NcclBootstrap() = default;
    ncclComm_t comm_ = nullptr;
    std::uint32_t rank_ = 0, world_ = 0;
    CUstream_st* stream_ = nullptr;
    void* scratch_ = nullptr;      ///< device: world * bytes of the largest call so far
    std::size_t scratchBytes_ = 0;
    bool wedged_ = false;          ///< an all-gather passed its deadline and is still pending
};

} // namespace tpf
