// Memory-model primitives the collective kernels are built from, spelled in
// PTX so that scope and ordering are explicit (sm_70+). Device code only.
//
// Scopes: a flag or ring index that another GPU or the host reads or writes
// is accessed at .sys scope; counters shared only by the blocks of one launch
// use .gpu scope.
#pragma once

#include <cstdint>

// Experiment knobs, off by default (docs/gpu.md has what they measured):
//   TPF_SLOT_LOAD_CG=1  peers' rows read with ld.global.cg (weak, L2) instead of ld.relaxed.sys;
//                       sound for device regions only (a sysmem line could be stale in L2).
//   TPF_POLL_RELAXED=1  flags polled with ld.relaxed.sys, one fence.acq_rel.sys once all arrived.
//   TPF_LL_SCRUB=0      the LL kernel's scrub of one stale line a call off (ll_kernel.cuh): for the
//                       test that shows why it is there (tests/gpu, "LL epoch wrap").
#ifndef TPF_LL_SCRUB
#define TPF_LL_SCRUB 1
#endif
#ifndef TPF_SLOT_LOAD_CG
#define TPF_SLOT_LOAD_CG 0
#endif
#ifndef TPF_POLL_RELAXED
#define TPF_POLL_RELAXED 0
#endif

namespace tpf::kernels::detail {

/// Acquire load at system scope: later loads of this thread see everything
/// the releasing writer (peer GPU, host proxy) wrote before its release.
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
/// Relaxed (strong, uncached in L1) load at system scope: control words the daemon writes.
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
__device__ __forceinline__ std::uint64_t ldRelaxedGpu(const std::uint64_t* p) {
    std::uint64_t v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
/// Release store at system scope: everything this thread (and, cumulatively,
/// what it observed) wrote before becomes visible to an acquiring reader first.
__device__ __forceinline__ void stReleaseSys(std::uint64_t* p, std::uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void stReleaseSys(std::uint32_t* p, std::uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void stRelaxedSys(std::uint32_t* p, std::uint32_t v) {
    asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void stRelaxedSys(std::uint64_t* p, std::uint64_t v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void stReleaseGpu(std::uint64_t* p, std::uint64_t v) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void fenceAcqRelSys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
__device__ __forceinline__ void fenceAcqRelGpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

/// 16 bytes a peer or the proxy delivered into this rank's region. Strong
/// (.relaxed.sys) so that neither L1 nor a cached line of host memory from an
/// epoch two calls back can answer; ordered by the block's earlier acquire.
__device__ __forceinline__ uint4 ldSlot16(const void* p) {
#if TPF_SLOT_LOAD_CG
    return __ldcg(static_cast<const uint4*>(p));
#else
    uint4 v;
    asm volatile("ld.relaxed.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
#endif
}
/// 16 bytes of the caller's send buffer (unchanged while the kernel runs).
__device__ __forceinline__ uint4 ldSend16(const void* p) { return __ldg(static_cast<const uint4*>(p)); }
__device__ __forceinline__ void st16(void* p, uint4 v) { *static_cast<uint4*>(p) = v; }

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
