// Host entry for the layout probe kernel (kernels/layout_probe.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "proto/layout.hpp"

namespace tpf::kernels {

/// Writes, for every (phase, src): slot offset at [i], last stripe's flag
/// offset at [2W + i], then totalBytes at [4W]. deviceOut holds 4W+1 u64.
cudaError_t launchLayoutProbe(const Layout& l, std::uint64_t* deviceOut, cudaStream_t stream);

} // namespace tpf::kernels
