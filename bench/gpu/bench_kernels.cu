// The reference kernels of tpf-gpubench (bench_kernels.hpp), composed from
// the device primitives' PTX helpers (kernels/device/ptx.cuh).
#include "bench/gpu/bench_kernels.hpp"

#include "kernels/device/ptx.cuh"

namespace tpf::gpubench {

namespace {

using namespace kernels::detail;

__device__ __forceinline__ void copyVectors(uint4* dst, const uint4* src, std::uint64_t n) {
    for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}

__global__ void copyK(uint4* dst, const uint4* src, std::uint64_t n) { copyVectors(dst, src, n); }

// The floor of a call launched with programmatic dependent launch: the same
// copy, waiting on the GPU for the kernel before it (as the collectives do).
__global__ void copyPdlK(uint4* dst, const uint4* src, std::uint64_t n) {
    gridDepWait();
    copyVectors(dst, src, n);
    gridDepRelease();
}

// launchExchangeFloor (bench_kernels.hpp). Block b of rank r stores its part
// of the shard (the copy kernel's grid-stride split) into row r of every
// peer, then thread 0 releases flag (r, b) in every peer and waits for flag
// (q, b) of every peer q here: the epoch, counted per block on each rank,
// agrees because every rank runs the same calls.
template <bool kPdl>
__global__ void exchangeFloorK(const ExchangeFloor f, const uint4* src, std::uint64_t n) {
    if constexpr (kPdl) gridDepWait();
    const unsigned b = blockIdx.x;
    for (std::uint32_t q = 0; q < f.world; ++q)
        if (q != f.rank) copyVectors(reinterpret_cast<uint4*>(f.peerArea[q] + f.rank * f.rowBytes), src, n);
    __syncthreads();
    if (threadIdx.x == 0) {
        const std::uint32_t e = f.epochs[b] + 1;
        for (std::uint32_t q = 0; q < f.world; ++q) {
            if (q == f.rank) continue;
            std::uint32_t* flag =
                reinterpret_cast<std::uint32_t*>(f.peerArea[q] + f.world * f.rowBytes) + f.rank * kFloorMaxBlocks + b;
            if (f.system) stReleaseSys(flag, e);
            else stReleaseGpu(flag, e);
        }
        for (std::uint32_t q = 0; q < f.world; ++q) {
            if (q == f.rank) continue;
            const std::uint32_t* flag = f.flags + q * kFloorMaxBlocks + b;
            std::uint32_t v;
            do v = f.system ? ldAcquireSys(flag) : ldAcquireGpu(flag);
            while (std::int32_t(v - e) < 0); // a peer may already be one call ahead
        }
        f.epochs[b] = e;
    }
    if constexpr (kPdl) gridDepRelease();
}

__global__ void pingPongK(std::uint64_t* ping, const std::uint64_t* pong, std::uint64_t iters) {
    for (std::uint64_t i = 1; i <= iters; ++i) {
        stReleaseSys(ping, i);
        while (ldAcquireSys(pong) < i) {}
    }
}

__global__ void pingPongWarpsK(std::uint64_t* ping, const std::uint64_t* pong, std::uint64_t iters,
                               std::uint64_t* laps) {
    __shared__ volatile std::uint64_t seen, published, t0, tSeen;
    const unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) seen = 0, published = 0;
    __syncthreads();
    for (std::uint64_t i = 1; i <= iters; ++i) {
        if (lane == 0) {
            if (w == 0) {
                t0 = globalTimerNs();
                stReleaseSys(ping, i);
                published = i;
            } else {
                while (published < i) {}
                const std::uint64_t a = globalTimerNs();
                while (globalTimerNs() - a < w * 250) {}
            }
            while (seen < i) {
                const std::uint64_t v = ldAcquireSys(pong + w * 4);
                if (v >= i) {
                    const std::uint64_t t = globalTimerNs();
                    if (atomicCAS(const_cast<unsigned long long*>(reinterpret_cast<volatile unsigned long long*>(&seen)),
                                  (unsigned long long)(i - 1), (unsigned long long)i) == i - 1)
                        tSeen = t;
                    break;
                }
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) laps[i - 1] = tSeen - t0;
    }
}

// The collectives' grid sizing: one block of 256 threads per 16 KiB, at most 32.
unsigned copyBlocks(std::uint64_t bytes) {
    const std::uint64_t blocks = (bytes + 16383) / 16384;
    return unsigned(blocks > 32 ? 32 : blocks == 0 ? 1 : blocks);
}

// `blocks` blocks of 256 threads with programmatic dependent launch: the
// kernel may start while the one before it on `s` finishes, and waits for it
// at griddepcontrol.wait.
template <class... P, class... A>
void launchPdl(unsigned blocks, cudaStream_t s, void (*kernel)(P...), A... args) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    (void)cudaLaunchKernelEx(&cfg, kernel, args...);
}

} // namespace

void launchCopy(void* dst, const void* src, std::uint64_t bytes, cudaStream_t s) {
    copyK<<<copyBlocks(bytes), 256, 0, s>>>(static_cast<uint4*>(dst), static_cast<const uint4*>(src), bytes / 16);
}

void launchCopyPdl(void* dst, const void* src, std::uint64_t bytes, cudaStream_t s) {
    launchPdl(copyBlocks(bytes), s, copyPdlK, static_cast<uint4*>(dst), static_cast<const uint4*>(src), bytes / 16);
}

void launchExchangeFloor(const ExchangeFloor& f, const void* src, std::uint64_t bytes, bool pdl, cudaStream_t s) {
    const auto* in = static_cast<const uint4*>(src);
    if (!pdl) {
        exchangeFloorK<false><<<copyBlocks(bytes), 256, 0, s>>>(f, in, bytes / 16);
        return;
    }
    launchPdl(copyBlocks(bytes), s, exchangeFloorK<true>, f, in, bytes / 16);
}

void launchPingPong(std::uint64_t* ping, const std::uint64_t* pong, std::uint64_t iters, cudaStream_t s) {
    pingPongK<<<1, 1, 0, s>>>(ping, pong, iters);
}

void launchPingPongWarps(std::uint64_t* ping, const std::uint64_t* pong, std::uint32_t warps, std::uint64_t iters,
                         std::uint64_t* laps, cudaStream_t s) {
    pingPongWarpsK<<<1, 32 * warps, 0, s>>>(ping, pong, iters, laps);
}

cudaError_t preloadBenchKernels() {
    cudaFuncAttributes a;
    if (cudaError_t e = cudaFuncGetAttributes(&a, (const void*)pingPongWarpsK); e != cudaSuccess) return e;
    if (cudaError_t e = cudaFuncGetAttributes(&a, (const void*)copyK); e != cudaSuccess) return e;
    if (cudaError_t e = cudaFuncGetAttributes(&a, (const void*)copyPdlK); e != cudaSuccess) return e;
    if (cudaError_t e = cudaFuncGetAttributes(&a, (const void*)exchangeFloorK<false>); e != cudaSuccess) return e;
    if (cudaError_t e = cudaFuncGetAttributes(&a, (const void*)exchangeFloorK<true>); e != cudaSuccess) return e;
    return cudaFuncGetAttributes(&a, (const void*)pingPongK);
}

} // namespace tpf::gpubench
