// Collectives on device buffers: one kernel launch per call on the caller's
// stream (no host wait, capturable), NCCL above the agreed cap or after a
// fallback, and the kernels' recorded failure read back by check(). Sizes
// that are not a multiple of 16 bytes, and all-gather-v, are staged
// (kernels/staging.hpp): pack, the same kernel over the padded size, unpack.
#include <algorithm>
#include <atomic>

#include "client/gpu_check.hpp"
#include "client/gpu_path.hpp"
#include "kernels/staging.hpp"

namespace tpf {

namespace {

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kBufferAlign == 0; }

Status hostGroup() { return Error{Errc::Unsupported, "stream calls need a group opened with device buffers (Buffers::Device, TPF_BUFFERS_DEVICE, buffers=\"device\")"}; }

#if TPF_HAVE_NCCL
ncclDataType_t ncclTypeOf(DType t) {
    switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    }
    return ncclFloat32;
}
#endif

// One call of a fabric group handed to NCCL (above the cap), counted for the
// daemon's status once NCCL took it: by the host when made eagerly, by a
// one-thread kernel captured beside it in a CUDA graph, so every replay
// counts. A group that fell back entirely has no ring: nothing to count.
Status countNccl(Group::Impl& g, const Status& call, std::uint64_t bytes, cudaStream_t stream) {
    if (!call || g.nccl || g.world == 1 || !g.ring.layout().entries) return call;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    TPF_GPU_TRY(cudaStreamIsCapturing(stream, &capture));
    if (capture == cudaStreamCaptureStatusActive) return TPF_GPU(kernels::launchCountNccl(g.gpu->view, bytes, stream));
    RankStats& r = g.ring.stats();
    std::atomic_ref(r.ncclCalls).fetch_add(1, std::memory_order_relaxed);
    std::atomic_ref(r.ncclBytes).fetch_add(bytes, std::memory_order_relaxed);
    return call;
}

} // namespace

Status Group::allGather(const void* send, void* recv, std::size_t bytes, CUstream_st* stream) {
    Impl& g = *impl_;
    if (g.broken()) return g.failure;
    if (!g.gpu) return hostGroup();
    if (!aligned(send) || !aligned(recv)) return Error{Errc::Misaligned, "allGather: send and recv must be 16-byte aligned"};
    GpuPath& p = *g.gpu;
    if (bytes == 0) return okStatus();
    if (g.nccl || !fits(bytes) || bytes > p.ncclAboveGather) {
#if TPF_HAVE_NCCL
        if (p.comm)
            return countNccl(g, TPF_GPU(ncclAllGather(send, recv, bytes, ncclUint8, static_cast<ncclComm_t>(p.comm), stream)),
                             bytes, stream);
#endif
        return Error{Errc::CapMismatch, std::to_string(bytes) + " bytes above the agreed cap of " +
                                            std::to_string(g.agreedCap) + " and no NCCL communicator"};
    }
    if (g.world == 1) return TPF_GPU(cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, stream));
    if (bytes % kBufferAlign == 0) {
        if (Errc e = kernels::validateAllGather(p.view, send, recv, bytes); e != Errc::Ok)
            return Error{e, "allGather of " + std::to_string(bytes) + " bytes refused by the kernel launcher"};
        return TPF_GPU(kernels::launchAllGather(p.view, send, recv, bytes, stream));
    }
    // Staged: the shard padded to 16 bytes, every row unpacked to its real size.
    const std::uint64_t padded = roundUp(bytes, kBufferAlign);
    std::uint8_t* const rows = p.scratch + g.layout.slotBytes;
    kernels::UnpackRows u;
    u.pitch = padded;
    u.rows = g.world;
    for (std::uint32_t r = 0; r < g.world; ++r) u.bytes[r] = bytes, u.offset[r] = std::uint64_t(r) * bytes;
    const kernels::CallTag tag{kStatsAllGather, 1, bytes};
    TPF_GPU_TRY(cudaMemcpyAsync(p.scratch, send, bytes, cudaMemcpyDeviceToDevice, stream));
    TPF_GPU_TRY(kernels::launchAllGather(p.view, p.scratch, rows, padded, stream, &tag));
    return TPF_GPU(kernels::launchUnpackRows(p.view, rows, recv, u, stream));
}

Status Group::allReduceSum(const void* send, void* recv, std::size_t count, DType type, CUstream_st* stream) {
    Impl& g = *impl_;
    if (g.broken()) return g.failure;
    if (!g.gpu) return hostGroup();
    const auto sized = sumBytes(count, type, g.agreedCap);
    if (!sized) return sized.error();
    const std::size_t bytes = *sized;
    if (!aligned(send) || !aligned(recv)) return Error{Errc::Misaligned, "allReduceSum: send and recv must be 16-byte aligned"};
    GpuPath& p = *g.gpu;
    if (count == 0) return okStatus();
    if (g.nccl || !fits(bytes) || bytes > p.ncclAboveSum) {
#if TPF_HAVE_NCCL
        if (p.comm)
            return countNccl(
                g, TPF_GPU(ncclAllReduce(send, recv, count, ncclTypeOf(type), ncclSum, static_cast<ncclComm_t>(p.comm), stream)),
                bytes, stream);
#endif
        return Error{Errc::CapMismatch, std::to_string(bytes) + " bytes above the agreed cap of " +
                                            std::to_string(g.agreedCap) + " and no NCCL communicator"};
    }
    if (g.world == 1) return TPF_GPU(cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, stream));
    if (bytes % kBufferAlign == 0) {
        if (Errc e = kernels::validateAllReduceSum(p.view, send, recv, count, type); e != Errc::Ok)
            return Error{e, "allReduceSum of " + std::to_string(bytes) + " bytes refused by the kernel launcher"};
        return TPF_GPU(kernels::launchAllReduceSum(p.view, send, recv, count, type, stream));
    }
    // Staged: the padding elements sum whatever the scratch held; only `count` come out.
    const std::uint64_t padded = roundUp(bytes, kBufferAlign);
    std::uint8_t* const out = p.scratch + g.layout.slotBytes;
    kernels::UnpackRows u;
    u.pitch = padded;
    u.rows = 1;
    u.bytes[0] = bytes;
    const kernels::CallTag tag{kStatsAllReduceSum, 1, bytes};
    TPF_GPU_TRY(cudaMemcpyAsync(p.scratch, send, bytes, cudaMemcpyDeviceToDevice, stream));
    TPF_GPU_TRY(kernels::launchAllReduceSum(p.view, p.scratch, out, padded / dtypeSize(type), type, stream, &tag));
    return TPF_GPU(kernels::launchUnpackRows(p.view, out, recv, u, stream));
}

Status Group::allGatherV(const void* send, void* recv, std::span<const std::size_t> counts, CUstream_st* stream) {
    Impl& g = *impl_;
    if (g.broken()) return g.failure;
    if (!g.gpu) return hostGroup();
    if (auto s = g.checkCounts(send, recv, counts); !s) return s;
    if (!aligned(send) || !aligned(recv)) return Error{Errc::Misaligned, "allGatherV: send and recv must be 16-byte aligned"};
    GpuPath& p = *g.gpu;
    const std::uint64_t largest = *std::max_element(counts.begin(), counts.end());
    if (largest == 0) return okStatus();
    std::uint64_t offset[kMaxWorld] = {};
    for (std::uint32_t r = 1; r < g.world; ++r) offset[r] = offset[r - 1] + counts[r - 1];
    const std::uint64_t padded = sizeof(RowHeader) + roundUp(largest, kBufferAlign);
    if (g.nccl || !fits(largest) || padded > g.layout.slotBytes || padded > p.ncclAboveGather) {
#if TPF_HAVE_NCCL
        // NCCL has no all-gather-v: grouped sends and receives, and the own row copied.
        if (p.comm) {
            const auto comm = static_cast<ncclComm_t>(p.comm);
            if (counts[g.rank])
                TPF_GPU_TRY(cudaMemcpyAsync(static_cast<std::uint8_t*>(recv) + offset[g.rank], send, counts[g.rank],
                                            cudaMemcpyDeviceToDevice, stream));
            TPF_GPU_TRY(ncclGroupStart());
            Status s = okStatus();
            for (std::uint32_t q = 0; q < g.world && s; ++q) {
                if (q == g.rank) continue;
                if (counts[g.rank]) s = TPF_GPU(ncclSend(send, counts[g.rank], ncclUint8, int(q), comm, stream));
                if (s && counts[q])
                    s = TPF_GPU(ncclRecv(static_cast<std::uint8_t*>(recv) + offset[q], counts[q], ncclUint8, int(q), comm, stream));
            }
            const Status end = TPF_GPU(ncclGroupEnd());
            return s ? countNccl(g, end, counts[g.rank], stream) : s;
        }
#endif
        return Error{Errc::CapMismatch, "allGatherV row of " + std::to_string(largest) + " bytes above the agreed cap of " +
                                            std::to_string(g.agreedCap) + " and no NCCL communicator"};
    }
    if (g.world == 1) return TPF_GPU(cudaMemcpyAsync(recv, send, counts[0], cudaMemcpyDeviceToDevice, stream));
    std::uint64_t c64[kMaxWorld] = {};
    for (std::uint32_t r = 0; r < g.world; ++r) c64[r] = counts[r];
    const RowHeader header{countsHash(c64, g.world), std::uint32_t(counts[g.rank]), kRowHeaderMagic};
    std::uint8_t* const rows = p.scratch + g.layout.slotBytes;
    kernels::UnpackRows u;
    u.pitch = padded;
    u.rows = g.world;
    u.headers = 1;
    u.countsHash = header.countsHash;
    u.statsOp = kStatsAllGatherV;
    u.statsBytes = counts[g.rank];
    const kernels::CallTag tag{kStatsAllGatherV, 1, counts[g.rank], 1};
    for (std::uint32_t r = 0; r < g.world; ++r) u.bytes[r] = counts[r], u.offset[r] = offset[r];
    TPF_GPU_TRY(kernels::launchPackRow(p.scratch, &header, send, counts[g.rank], stream));
    TPF_GPU_TRY(kernels::launchAllGather(p.view, p.scratch, rows, padded, stream, &tag));
    return TPF_GPU(kernels::launchUnpackRows(p.view, rows, recv, u, stream));
}

void gpuFlushStats(Group::Impl& g) {
    if (!g.gpu || g.nccl || g.world == 1 || !g.gpu->stats || !g.ring.layout().entries) return;
    kernels::DeviceStats d;
    if (cudaMemcpy(&d, g.gpu->stats, sizeof d, cudaMemcpyDeviceToHost) == cudaSuccess)
        kernels::publishDeviceStats(d, g.ring.stats());
}

Status gpuCheck(Group::Impl& g) {
    if (g.broken()) return g.failure;
    if (!g.gpu || g.nccl || g.world == 1) return okStatus();
    // Only a failed call counts: the daemon also writes the control block when
    // a rank leaves after the last call, which must not fail the others.
    kernels::DeviceState st;
    if (auto s = TPF_GPU(kernels::readDeviceState(g.gpu->state, st)); !s) return g.fail(s.error());
    if (st.failures == 0) return okStatus();
    kernels::CallFailure f;
    if (auto s = TPF_GPU(kernels::readFailure(g.gpu->view, f)); !s) return g.fail(s.error());
    if (f.error == Errc::Ok) f.error = Errc::PeerLost; // cannot happen: a failed call records its error
    std::string why;
    switch (f.error) {
    case Errc::GroupMismatch: // the call's tag (kernels::callTagOf) or an all-gather-v's row header
        why = "rank " + std::to_string(f.missingPeer) + " made the group's collective #" + std::to_string(f.epoch) +
              " with another size, dtype or op (or all-gather-v counts) than this rank; every rank must make the "
              "same calls in the same order with the same sizes";
        break;
    case Errc::Timeout:
        why = f.missingPeer == g.rank ? "the daemon's proxy did not take doorbells within the timeout"
                                      : "rank " + std::to_string(f.missingPeer) + " did not deliver epoch " +
                                            std::to_string(f.epoch) + " within " + std::to_string(g.options.timeout.count()) + " ms";
        break;
    case Errc::Aborted: // the daemon names the aborter in the control block's missingPeer
        why = f.missingPeer < g.world ? "rank " + std::to_string(f.missingPeer) + " aborted the group"
                                      : std::string("a rank aborted the group");
        break;
    case Errc::DaemonLost:
        why = g.adoptable() ? "tpfabricd's proxy stopped beating for 500 ms during a proxy-route wait: the daemon hung, or "
                              "it died and no daemon re-adopted the group in time (systemctl status tpfabricd; reopen the group)"
                            : "tpfabricd's proxy stopped beating for 500 ms during a proxy-route wait (the daemon died or "
                              "hung), and this group does not wait for a restarted daemon: restart it and reopen the group";
        break;
    default:
        why = f.missingPeer == kNoPeer ? std::string("reported by the daemon")
                                       : "rank " + std::to_string(f.missingPeer) +
                                             (f.error == Errc::PeerLost ? " is gone" : " failed the group");
    }
    // A call that timed out while the daemon was away: DaemonLost, naming the gap.
    if (f.error == Errc::Timeout) return g.timedOut(Error{f.error, why}, f.missingPeer < g.world ? f.missingPeer : kNoPeer);
    // A failure the daemon recorded (the control block's word): its reason beside ours.
    Error e{f.error, why};
    if (g.region.data() && std::atomic_ref(g.control().error).load(std::memory_order_acquire) == std::uint32_t(f.error))
        e = g.withDaemonWhy(e);
    return g.fail(std::move(e), f.missingPeer < g.world ? f.missingPeer : kNoPeer);
}

#if !TPF_HAVE_NCCL
void* ncclCommOf(Bootstrap&) { return nullptr; }
#endif

} // namespace tpf
