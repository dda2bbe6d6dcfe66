// Offsets as device code computes them, for the GPU test that checks them
// against the host's: daemon, client and kernels must agree on every byte.
#include "kernels/layout_probe.hpp"

namespace tpf::kernels {

__global__ void layoutProbeKernel(Layout l, std::uint64_t* out) {
    const std::uint32_t i = threadIdx.x;
    const std::uint32_t n = 2 * l.world;
    if (i < n) {
        out[i] = l.slotOffset(i / l.world, i % l.world);
        out[n + i] = l.flagOffset(i / l.world, i % l.world, l.stripes - 1);
    }
    if (i == 0) out[2 * n] = l.totalBytes();
}

cudaError_t launchLayoutProbe(const Layout& l, std::uint64_t* deviceOut, cudaStream_t stream) {
    layoutProbeKernel<<<1, 64, 0, stream>>>(l, deviceOut);
    return cudaGetLastError();
}

} // namespace tpf::kernels
