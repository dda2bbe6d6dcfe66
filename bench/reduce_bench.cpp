// `tpf-bench reduce`: the host reduction alone (client/reduce.cpp), each
// kernel this CPU runs, beside a copy of the same W rows (what a gather's
// copy-out moves), in this process: no daemon, no ranks.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench/bench.hpp"
#include "client/reduce.hpp"
#include "common/byte_size.hpp"

namespace tpf::bench {

namespace {

// The best of `batches` batches of `calls` calls: a lower bound that another
// job's burst of load does not move.
template <class F> double bestNsPerCall(F&& f, int batches, int calls) {
    double best = 1e300;
    for (int b = 0; b < batches; ++b) {
        const std::uint64_t t0 = nowNs();
        for (int i = 0; i < calls; ++i) {
            f();
            asm volatile("" ::: "memory"); // keep every call
        }
        best = std::min(best, double(nowNs() - t0) / calls);
    }
    return best;
}

} // namespace

int runReduceBench(const std::vector<std::uint32_t>& worlds, const std::vector<std::uint64_t>& sizes, bool markdown) {
    std::vector<std::vector<std::string>> rows{{"type", "W", "size", "kernel", "sum µs", "copy µs", "sum / copy"}};
    for (const DType t : {DType::BF16, DType::F16, DType::F32}) {
        for (const std::uint32_t w : worlds) {
            for (const std::uint64_t size : sizes) {
                const std::size_t count = size / dtypeSize(t);
                // Rows of small values (no subnormals: those cost microcode assists on some CPUs).
                std::vector<std::vector<std::uint8_t>> data(w, std::vector<std::uint8_t>(size));
                std::vector<const void*> ptrs;
                for (std::uint32_t r = 0; r < w; ++r) {
                    for (std::size_t i = 0; i < count; ++i) {
                        const float v = float((r + i) % 7 + 1);
                        std::uint32_t bits;
                        std::memcpy(&bits, &v, 4);
                        if (t == DType::F32) std::memcpy(data[r].data() + 4 * i, &bits, 4);
                        else {
                            const std::uint16_t h = t == DType::BF16 ? floatToBf16(v) : floatToF16(v);
                            std::memcpy(data[r].data() + 2 * i, &h, 2);
                        }
                    }
                    ptrs.push_back(data[r].data());
                }
                std::vector<std::uint8_t> out(std::size_t(w) * size);
                const int calls = int(std::clamp<std::uint64_t>(4'000'000 / (size * w + 1), 4, 2000));
                const double copyNs = bestNsPerCall(
                    [&] {
                        for (std::uint32_t r = 0; r < w; ++r) std::memcpy(out.data() + std::size_t(r) * size, ptrs[r], size);
                    },
                    20, calls);
                for (const ReduceKernel k : {ReduceKernel::Scalar, ReduceKernel::Avx2F16c}) {
                    if (!reduceKernelAvailable(k)) continue;
                    const int kc = k == ReduceKernel::Scalar ? std::max(1, calls / 20) : calls;
                    const double sumNs =
                        bestNsPerCall([&] { sumRowsInOrder(ptrs.data(), w, out.data(), count, t, k); }, 20, kc);
                    char s[32], c[32], x[32];
                    std::snprintf(s, sizeof s, "%.3f", sumNs / 1000);
                    std::snprintf(c, sizeof c, "%.3f", copyNs / 1000);
                    std::snprintf(x, sizeof x, "%.2fx", sumNs / copyNs);
                    rows.push_back({t == DType::BF16 ? "bf16" : t == DType::F16 ? "f16" : "f32", std::to_string(w),
                                    formatByteSize(size), reduceKernelName(k), s, c, x});
                }
            }
        }
    }
    std::fputs(renderTable(rows, markdown, 4).c_str(), stdout);
    const std::string bullet = markdown ? "- " : "  ";
    std::printf("\n%sthe reduction alone, in this process: sumRowsInOrder over W rows of `size` bytes each (the sum a rank "
                "computes after the exchange), beside memcpy of the same W rows (what a gather copies out); best of 20 "
                "batches, µs per call. Auto runs %s on this CPU.\n",
                bullet.c_str(), reduceKernelName(autoReduceKernel()));
    return 0;
}

} // namespace tpf::bench
