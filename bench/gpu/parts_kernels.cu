#include "bench/gpu/parts_kernels.hpp"

#include "kernels/collectives_kernel.cuh"
#include "kernels/collectives_launch.cuh"
#include "kernels/ll_kernel.cuh"

namespace tpf::gpubench {

namespace {

using namespace kernels::detail;

// The timeline probe of the kernel bodies (kernels/device/call.cuh, NoProbe).
struct TimelineProbe {
    static constexpr bool kOn = true;
    Timeline* t;
    // Flag path: by the publishing thread, whichever block published.
    __device__ void published(std::uint64_t ns) { *reinterpret_cast<volatile std::uint64_t*>(&t->publishedNs) = ns; }
    __device__ std::uint64_t publishedAt() const { return ldRelaxedGpu(&t->publishedNs); }
    // Block 0's thread 0 at the call's end: four instants, three phases.
    __device__ void phases(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
        t->phase[0] += b - a;
        t->phase[1] += c - b;
        t->phase[2] += d - c;
        t->calls += 1;
    }
};

template <Op op>
__global__ void __launch_bounds__(kCollectiveThreadsMax)
    timedCollectiveKernel(const kernels::DeviceGroupView v, const std::uint8_t* send, std::uint8_t* recv,
                          std::uint64_t n16, const kernels::CallTag tag, Timeline* t) {
    __shared__ Shared s;
    TimelineProbe probe{t};
    collectiveCall<op>(s, v, send, recv, n16, tag, &probe);
}

template <Op op, std::uint32_t kPer, std::uint32_t kPeers>
__global__ void __launch_bounds__(llThreadsMax(kPer, kPeers))
    timedLlKernel(const kernels::DeviceGroupView v, const std::uint8_t* send, std::uint8_t* recv, std::uint64_t n16,
                  const kernels::CallTag tag, Timeline* t) {
    TimelineProbe probe{t};
    llCall<op, kPer, kPeers>(v, send, recv, n16, tag, &probe);
}

struct TimedKernels {
    template <Op op> static auto collective() { return &timedCollectiveKernel<op>; }
    template <Op op, std::uint32_t per, std::uint32_t peers> static auto ll() { return &timedLlKernel<op, per, peers>; }
};

template <Op op>
cudaError_t launchTimed(const kernels::DeviceGroupView& v, const void* send, void* recv, std::uint64_t bytes,
                        Timeline* t, cudaStream_t stream) {
    const kernels::CallTag tag{op == Op::Gather ? kStatsAllGather : kStatsAllReduceSum, 1, bytes};
    return launchCall<TimedKernels, op>(v, send, recv, bytes, tag, stream, t);
}

// The hop's probe: the winning poll's time into the block's `seen`.
struct HopProbe {
    static constexpr bool kOn = true;
    std::uint64_t* seen;
    __device__ void decided(std::uint64_t ns) { *seen = ns; }
};

constexpr std::uint32_t kHopTag = 1; // every hop loop's call tag (its ranks agree by construction)

// launchProxyHopLoop: one block of pollWarps warps. Each call: warp 0 stages
// the shard in the own slot and publishes the doorbell (publish: ring entry,
// release of subHead), the other warps start staggered (staggerStart), and
// every warp polls the flags' copies (waitPeers, as block 0 of a collective
// call). The epoch advances per call as the collective kernel's does.
__global__ void __launch_bounds__(kFlagCopies * kWarp)
    hopLoopKernel(const kernels::DeviceGroupView v, std::uint64_t iters, std::uint64_t* laps, std::uint64_t bytes) {
    __shared__ Decision dec;
    __shared__ std::uint64_t t0, tSeen;
    kernels::DeviceState* st = v.state;
    const std::uint32_t lane = threadIdx.x % kWarp, w = threadIdx.x / kWarp;
    HopProbe probe{&tSeen};
    for (std::uint64_t i = 0; i < iters; ++i) {
        const std::uint64_t e = ldRelaxedGpu(&st->epoch) + 1;
        const std::uint32_t p = phaseOf(e);
        if (threadIdx.x == 0) {
            stRelaxedSys(&v.control->epoch, e);
            st->llArrive[(e + 1) & 1] = 0;
            dec.wait = kWaitPending;
            dec.published = 0;
            tSeen = 0;
        }
        __syncthreads();
        if (w == 0) {
            std::uint8_t* slot = v.hostRegion + v.layout.slotOffset(p, v.rank);
            for (std::uint64_t j = lane; j < bytes / 16; j += kWarp)
                st16(slot + j * 16, make_uint4(std::uint32_t(e), std::uint32_t(i), std::uint32_t(j), 0));
            __syncwarp();
            if (lane == 0) t0 = globalTimerNs();
            publish(v, e, p, bytes, true, kHopTag);
            if (lane == 0) markPublished(dec);
        } else {
            staggerStart(dec, w);
        }
        waitPeers(v, e, p, w, dec, false, kHopTag, &probe);
        __syncthreads();
        const std::uint32_t code = dec.wait;
        if (threadIdx.x == 0) {
            if (laps) laps[i] = tSeen - t0;
            st->epoch = e;
        }
        __syncthreads();
        if (code != 0) return;
    }
}

bool usable(const kernels::DeviceGroupView& v) {
    return v.world >= 1 && v.world <= kMaxWorld && v.rank < v.world && v.state != nullptr && v.region != nullptr &&
           v.control != nullptr && v.layout.world == v.world;
}

} // namespace

cudaError_t launchTimedAllGather(const kernels::DeviceGroupView& v, const void* send, void* recv,
                                 std::uint64_t bytes, Timeline* t, cudaStream_t stream) {
    if (!usable(v) || kernels::validateAllGather(v, send, recv, bytes) != Errc::Ok) return cudaErrorInvalidValue;
    if (bytes == 0) return cudaSuccess;
    return launchTimed<Op::Gather>(v, send, recv, bytes, t, stream);
}

cudaError_t launchTimedAllReduceSum(const kernels::DeviceGroupView& v, const void* send, void* recv,
                                    std::uint64_t count, DType dtype, Timeline* t, cudaStream_t stream) {
    if (!usable(v) || kernels::validateAllReduceSum(v, send, recv, count, dtype) != Errc::Ok)
        return cudaErrorInvalidValue;
    const std::uint64_t bytes = count * dtypeSize(dtype);
    if (bytes == 0) return cudaSuccess;
    switch (dtype) {
    case DType::F32: return launchTimed<Op::SumF32>(v, send, recv, bytes, t, stream);
    case DType::F16: return launchTimed<Op::SumF16>(v, send, recv, bytes, t, stream);
    case DType::BF16: return launchTimed<Op::SumBF16>(v, send, recv, bytes, t, stream);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t launchProxyHopLoop(const kernels::DeviceGroupView& v, std::uint64_t iters, std::uint64_t* laps,
                               cudaStream_t stream, std::uint64_t bytes) {
    if (!usable(v) || !hasProxyPeer(v) || v.ring == nullptr || v.hostRegion == nullptr || bytes < 16 ||
        bytes % 16 != 0 || bytes > v.layout.slotBytes)
        return cudaErrorInvalidValue;
    hopLoopKernel<<<1, kWarp * pollWarpsOf(v), 0, stream>>>(v, iters, laps, bytes);
    return cudaGetLastError();
}

cudaError_t preloadPartsKernels() {
    const void* const all[] = {
        reinterpret_cast<const void*>(&hopLoopKernel),
        reinterpret_cast<const void*>(&timedCollectiveKernel<Op::Gather>),
        reinterpret_cast<const void*>(&timedCollectiveKernel<Op::SumF32>),
        reinterpret_cast<const void*>(&timedCollectiveKernel<Op::SumF16>),
        reinterpret_cast<const void*>(&timedCollectiveKernel<Op::SumBF16>),
#define TPF_TIMED_LL(per, peers)                                                                                       \
    reinterpret_cast<const void*>(&timedLlKernel<Op::Gather, per, peers>),                                            \
        reinterpret_cast<const void*>(&timedLlKernel<Op::SumF32, per, peers>),                                        \
        reinterpret_cast<const void*>(&timedLlKernel<Op::SumF16, per, peers>),                                        \
        reinterpret_cast<const void*>(&timedLlKernel<Op::SumBF16, per, peers>)
        TPF_TIMED_LL(1, 1), TPF_TIMED_LL(2, 1), TPF_TIMED_LL(4, 1),
        TPF_TIMED_LL(1, kernels::kLlHeld), TPF_TIMED_LL(2, kernels::kLlHeld / 2), TPF_TIMED_LL(4, kernels::kLlHeld / 4),
#undef TPF_TIMED_LL
    };
    for (const void* k : all) {
        cudaFuncAttributes a;
        if (cudaError_t err = cudaFuncGetAttributes(&a, k); err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

} // namespace tpf::gpubench
