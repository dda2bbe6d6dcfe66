// tpfabric device primitives — the memory-model helpers every kernel of the
// repository is built from (library, tests/gpu, bench/gpu), spelled in PTX so
// that scope and ordering are explicit (sm_70+). Device code only; the one
// copy of each helper.
//
// Scopes: a word another GPU or the host reads or writes (a flag, a ring
// index, the control block, a peer's slot) is accessed at .sys scope; a word
// only the blocks of one rank's launches share (DeviceState) at .gpu scope.
//
// Orders, as the PTX memory model names them:
//   acquire load   later loads of this thread see everything the releasing
//                  writer (peer GPU, host proxy) wrote before its release;
//   release store  everything this thread wrote before (and, cumulatively,
//                  what it observed) is visible to an acquiring reader first;
//   relaxed        strong (never answered from L1 or a stale cached line)
//                  but unordered: ordered only by an acquire, release or
//                  fence around it;
//   volatile       the LL lines' loads and stores (ll_device.cuh): each
//                  16-byte vector is one access, so each 8-byte half lands
//                  whole; no order at all.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tpf::kernels::detail {

// ---- Loads ------------------------------------------------------------------

/// Acquire load at system scope: the reader's side of a flag a peer GPU or
/// the daemon's proxy released (or any .sys word written before one).
__device__ __forceinline__ std::uint64_t ldAcquireSys(const std::uint64_t* p) {
    std::uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ std::uint32_t ldAcquireSys(const std::uint32_t* p) {
    std::uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
/// Acquire load at GPU scope: a counter the blocks of this rank's launches release to each other.
__device__ __forceinline__ std::uint32_t ldAcquireGpu(const std::uint32_t* p) {
    std::uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
/// Relaxed load at system scope: control words the daemon writes, tag words
/// beside an ipc flag; issues without waiting for earlier loads.
__device__ __forceinline__ std::uint32_t ldRelaxedSys(const std::uint32_t* p) {
    std::uint32_t v;
    asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ std::uint64_t ldRelaxedSys(const std::uint64_t* p) {
    std::uint64_t v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
/// Relaxed load at GPU scope: DeviceState words of this rank.
__device__ __forceinline__ std::uint32_t ldRelaxedGpu(const std::uint32_t* p) {
    std::uint32_t v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ std::uint64_t ldRelaxedGpu(const std::uint64_t* p) {
    std::uint64_t v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// ---- Stores -----------------------------------------------------------------

/// Release store at system scope: the writer's side of a flag, a ring head,
/// the control block's error word.
__device__ __forceinline__ void stReleaseSys(std::uint64_t* p, std::uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void stReleaseSys(std::uint32_t* p, std::uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
/// Release store at GPU scope: a word only this rank's blocks acquire.
__device__ __forceinline__ void stReleaseGpu(std::uint64_t* p, std::uint64_t v) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void stReleaseGpu(std::uint32_t* p, std::uint32_t v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
/// Relaxed store at system scope: a word a later release store of this thread publishes.
__device__ __forceinline__ void stRelaxedSys(std::uint32_t* p, std::uint32_t v) {
    asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void stRelaxedSys(std::uint64_t* p, std::uint64_t v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// ---- Fences -----------------------------------------------------------------

__device__ __forceinline__ void fenceAcqRelSys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
__device__ __forceinline__ void fenceAcqRelGpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// ---- 16-byte vectors --------------------------------------------------------

/// 16 bytes a peer or the proxy delivered into this rank's region (a slot
/// row). Strong (.relaxed.sys) so that neither L1 nor a cached line of host
/// memory from an epoch two calls back can answer; ordered by the block's
/// earlier acquire of the row's flag.
__device__ __forceinline__ uint4 ldSlot16(const void* p) {
    uint4 v;
    asm volatile("ld.relaxed.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
/// 16 bytes of the caller's send buffer (unchanged while the kernel runs: the
/// read-only path may cache it).
__device__ __forceinline__ uint4 ldSend16(const void* p) { return __ldg(static_cast<const uint4*>(p)); }
/// A plain 16-byte store (a slot row, the output, a ring entry): ordered for
/// a reader only by a later release or fence.
__device__ __forceinline__ void st16(void* p, uint4 v) { *static_cast<uint4*>(p) = v; }
/// One volatile 16-byte store of {a, f, b, f}: an LL line (ll_device.cuh).
/// Each 8-byte half {data, flag} lands whole.
__device__ __forceinline__ void stLl(void* p, std::uint32_t a, std::uint32_t b, std::uint32_t f) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(f), "r"(b), "r"(f) : "memory");
}
/// One volatile 16-byte load of an LL line: each 8-byte half is one value
/// its writer stored whole (never an old data word with a new flag).
__device__ __forceinline__ uint4 ldLl(const void* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}

// ---- Barriers, launch order and time -----------------------------------------

/// Named barrier `id` (1..15; 0 is __syncthreads') of the first `threads`
/// threads of the block (a multiple of 32): the threads that reach it wait for
/// each other, with block-scope memory order as __syncthreads; threads past
/// `threads` (a kernel's extra warps) never take part.
template <std::uint32_t id>
__device__ __forceinline__ void barSync(std::uint32_t threads) {
    static_assert(id >= 1 && id <= 15);
    asm volatile("bar.sync %0, %1;" ::"n"(id), "r"(threads) : "memory");
}

/// Programmatic dependent launch (sm_90+; no-ops in a kernel launched
/// without the attribute). gridDepWait: this thread waits until the grids
/// this one depends on in its stream completed and their memory is visible;
/// nothing of theirs (the send buffer, DeviceState) may be read before it.
/// gridDepRelease: the next kernel in the stream, if launched with the
/// attribute, may be scheduled once every block of this grid has released
/// (or exited); it still waits in its own gridDepWait for this grid's end.
__device__ __forceinline__ void gridDepWait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void gridDepRelease() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Nanoseconds of the GPU's global timer (coarse, but monotonic and shared by all SMs).
__device__ __forceinline__ std::uint64_t globalTimerNs() {
    std::uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

} // namespace tpf::kernels::detail
