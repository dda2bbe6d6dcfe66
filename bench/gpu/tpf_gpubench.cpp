// GPU benchmark, one rank process (bench/gpu/run.sh starts W of them under MPS
// with the real daemon). Rank 0 prints the table rows as
//   ROW <what> <bytes> <us_per_call>
// --mode sizes: ipc (or proxy) gathers and bf16 sums, 100 calls captured in one
//   graph, best of 5 replays, beside a graph of 100 copy kernels of the same
//   bytes measured in the same run (the floor).
// --mode hop: proxy route 16 B gathers (doorbell -> daemon -> flag -> waiting
//   kernel, per call) beside a raw host-mapped flag ping-pong (kernel <-> CPU
//   thread) in the same run.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench/gpu/bench_kernels.hpp"
#include <tpfabric/tpfabric.hpp>

using namespace tpf;

namespace {

struct Args {
    std::string socket, bootstrap, mode = "sizes", route = "ipc";
    std::uint32_t rank = 0, world = 2, calls = 100, reps = 5;
};

#define CK(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            std::fprintf(stderr, "rank %u: %s: %s\n", a.rank, #call, cudaGetErrorName(e_));                         \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

Args a;

// Best per-call time of `reps` replays of a graph of `calls` calls of `enqueue`.
template <class F>
int timeGraph(cudaStream_t st, F&& enqueue, double& best, Group* g) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (std::uint32_t i = 0; i < a.calls; ++i) enqueue();
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, st)); // warm-up
    CK(cudaStreamSynchronize(st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    best = 1e30;
    for (std::uint32_t r = 0; r < a.reps; ++r) {
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(exec, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaStreamSynchronize(st));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        best = std::min(best, double(ms) * 1000.0 / a.calls);
    }
    if (g)
        if (auto s = g->check(); !s) {
            std::fprintf(stderr, "rank %u: %s\n", a.rank, s.error().describe().c_str());
            return 1;
        }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return 0;
}

void row(const char* what, std::uint64_t bytes, double us) {
    if (a.rank == 0) std::printf("ROW %s W=%u %llu %.2f\n", what, a.world, (unsigned long long)bytes, us), std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) {
    CLI::App app{"tpfabric GPU benchmark rank (started by bench/gpu/run.sh on the GPU machine)"};
    app.add_option("--socket", a.socket);
    app.add_option("--bootstrap", a.bootstrap);
    app.add_option("--mode", a.mode);
    app.add_option("--route", a.route);
    app.add_option("--rank", a.rank);
    app.add_option("--world", a.world);
    app.add_option("--calls", a.calls);
    CLI11_PARSE(app, argc, argv);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return std::printf("SKIP: no CUDA device\n"), 77;
    CK(cudaSetDevice(0));
    CK(gpubench::preloadBenchKernels());
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const std::uint64_t maxBytes = 512 * 1024;
    std::uint8_t *send, *recv, *recv2;
    CK(cudaMalloc(&send, maxBytes));
    CK(cudaMalloc(&recv, maxBytes * a.world));
    CK(cudaMalloc(&recv2, maxBytes));
    CK(cudaMemset(send, 1, maxBytes));

    auto boot = TcpBootstrap::create(a.rank, a.world, a.bootstrap);
    if (!boot) return std::fprintf(stderr, "bootstrap: %s\n", boot.error().describe().c_str()), 1;
    Options o;
    o.socketPath = a.socket;
    o.buffers = tpf::Buffers::Device;
    o.gpuRoute = a.route == "ipc" ? GpuRoute::Ipc : GpuRoute::Proxy;
    auto grp = Group::open(**boot, a.rank, a.world, maxBytes, o);
    if (!grp) return std::fprintf(stderr, "rank %u: open: %s\n", a.rank, grp.error().describe().c_str()), 1;
    Group& g = **grp;
    std::uint32_t sync = 0;
    std::vector<std::uint32_t> all(a.world);
    auto barrier = [&] { return bool((*boot)->allGather(&sync, all.data(), 4)); };

    double us = 0;
    if (a.mode == "sizes") {
        for (std::uint64_t bytes = 4096; bytes <= maxBytes; bytes *= 2) {
            barrier();
            if (timeGraph(st, [&] { gpubench::launchCopy(recv2, send, bytes, st); }, us, nullptr)) return 1;
            row("copy-kernel", bytes, us);
            barrier();
            if (timeGraph(st, [&] { (void)g.allGather(send, recv, bytes, st); }, us, &g)) return 1;
            row((a.route + "-gather").c_str(), bytes, us);
            barrier();
            if (timeGraph(st, [&] { (void)g.allReduceSum(send, recv, bytes / 2, DType::BF16, st); }, us, &g)) return 1;
            row((a.route + "-sum-bf16").c_str(), bytes, us);
        }
    } else { // hop
        barrier();
        if (timeGraph(st, [&] { gpubench::launchCopy(recv2, send, 16, st); }, us, nullptr)) return 1;
        row("copy-kernel", 16, us);
        barrier();
        if (timeGraph(st, [&] { (void)g.allGather(send, recv, 16, st); }, us, &g)) return 1;
        row("proxy-gather", 16, us);
        barrier();
        if (a.rank == 0) { // raw ping-pong: GPU kernel <-> CPU thread through host-mapped memory
            std::uint64_t* flags = nullptr;
            CK(cudaHostAlloc(&flags, 256, cudaHostAllocMapped | cudaHostAllocPortable));
            flags[0] = flags[16] = 0;
            std::uint64_t *dflags;
            CK(cudaHostGetDevicePointer(&dflags, flags, 0));
            const std::uint64_t iters = 20000;
            std::thread cpu([&] {
                for (std::uint64_t i = 1; i <= iters; ++i) {
                    while (std::atomic_ref(flags[0]).load(std::memory_order_acquire) < i) {}
                    std::atomic_ref(flags[16]).store(i, std::memory_order_release);
                }
            });
            const auto t0 = std::chrono::steady_clock::now();
            gpubench::launchPingPong(dflags, dflags + 16, iters, st);
            CK(cudaStreamSynchronize(st));
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            cpu.join();
            row("hostmapped-pingpong-rtt", 8, s * 1e6 / double(iters));
            cudaFreeHost(flags);
        }
        barrier();
    }
    barrier();
    return 0;
}
