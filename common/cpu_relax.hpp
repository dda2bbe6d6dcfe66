// The spin-wait hint of every busy-poll loop (the proxy, its carry threads,
// the client's host-path waits, the bench's floor): tells the core it is
// spinning, so a sibling hyperthread gets the pipeline and the loop's exit
// is not a memory-order mis-speculation.
#pragma once

namespace tpf {

inline void cpuRelax() {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

} // namespace tpf
