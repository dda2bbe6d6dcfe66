// Latency print, for information (docs/gpu.md keeps the numbers): graph-
// replayed collectives of W = 2 simulated ranks on ONE GPU against a
// graph-launched copy kernel of the same bytes. Both ranks share one GPU, so
// ipc stores are local HBM writes, not NVLink: a floor, not a forecast.
#include <cstdio>
#include <functional>
#include <memory>

#include "tests/gpu/cases.hpp"
#include "tests/gpu/check_kernels.hpp"

namespace tpf::gputest {

namespace {

using Enqueue = std::function<void(std::uint32_t rank, cudaStream_t s)>;

// One graph: `perGraph` calls on each of `streams` streams (fork/join on s[0]).
cudaGraphExec_t capture(const std::vector<cudaStream_t>& s, int perGraph, const Enqueue& enqueue) {
    std::vector<cudaEvent_t> ev(s.size());
    for (auto& e : ev) TPF_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    cudaGraph_t graph;
    TPF_CUDA_CHECK(cudaStreamBeginCapture(s[0], cudaStreamCaptureModeThreadLocal));
    TPF_CUDA_CHECK(cudaEventRecord(ev[0], s[0]));
    for (std::size_t r = 1; r < s.size(); ++r) TPF_CUDA_CHECK(cudaStreamWaitEvent(s[r], ev[0], 0));
    for (std::size_t r = 0; r < s.size(); ++r)
        for (int i = 0; i < perGraph; ++i) enqueue(std::uint32_t(r), s[r]);
    for (std::size_t r = 1; r < s.size(); ++r) {
        TPF_CUDA_CHECK(cudaEventRecord(ev[r], s[r]));
        TPF_CUDA_CHECK(cudaStreamWaitEvent(s[0], ev[r], 0));
    }
    TPF_CUDA_CHECK(cudaStreamEndCapture(s[0], &graph));
    cudaGraphExec_t exec;
    TPF_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    TPF_CUDA_CHECK(cudaGraphDestroy(graph));
    for (auto& e : ev) cudaEventDestroy(e);
    return exec;
}

// Microseconds per call: best of 3 trials of `replays` graph launches.
double usPerCall(const std::vector<cudaStream_t>& s, int perGraph, int replays, const Enqueue& enqueue) {
    cudaGraphExec_t exec = capture(s, perGraph, enqueue);
    cudaEvent_t a, b;
    TPF_CUDA_CHECK(cudaEventCreate(&a));
    TPF_CUDA_CHECK(cudaEventCreate(&b));
    TPF_CUDA_CHECK(cudaGraphLaunch(exec, s[0])); // warm-up
    TPF_CUDA_CHECK(cudaStreamSynchronize(s[0]));
    float best = 1e30f;
    for (int t = 0; t < 3; ++t) {
        TPF_CUDA_CHECK(cudaEventRecord(a, s[0]));
        for (int i = 0; i < replays; ++i) TPF_CUDA_CHECK(cudaGraphLaunch(exec, s[0]));
        TPF_CUDA_CHECK(cudaEventRecord(b, s[0]));
        TPF_CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        TPF_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        best = ms < best ? ms : best;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    TPF_CUDA_CHECK(cudaGraphExecDestroy(exec));
    return double(best) * 1000.0 / (double(replays) * perGraph);
}

struct Row {
    std::string what;
    double single, many; // 1 call per graph; 100 calls per graph
};

} // namespace

void runLatencyBench() {
    constexpr int kMany = 100;
    std::vector<Row> rows;
    auto collective = [&](Wire wire, bool sum, std::uint64_t bytes) {
        SimOptions o;
        o.world = 2;
        o.wire = wire;
        SimGroup g(o);
        std::vector<std::unique_ptr<DevBuf>> send, recv;
        for (int r = 0; r < 2; ++r) {
            send.push_back(std::make_unique<DevBuf>(bytes));
            recv.push_back(std::make_unique<DevBuf>(2 * bytes));
            TPF_CUDA_CHECK(cudaMemset(send.back()->p, 0x3c, bytes)); // bf16/f32 finite values
        }
        TPF_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<cudaStream_t> s = {g.stream(0), g.stream(1)};
        Enqueue enq = [&](std::uint32_t r, cudaStream_t st) {
            if (sum)
                TPF_CUDA_CHECK(kernels::launchAllReduceSum(g.view(r), send[r]->p, recv[r]->p, bytes / 2,
                                                           kernels::DType::BF16, st));
            else TPF_CUDA_CHECK(kernels::launchAllGather(g.view(r), send[r]->p, recv[r]->p, bytes, st));
        };
        Row row{std::string(wireName(wire)) + (sum ? " sum bf16 " : " gather ") + std::to_string(bytes / 1024) + " KiB",
                usPerCall(s, 1, 500, enq), usPerCall(s, kMany, 5, enq)};
        check(g.failure(0).error == Errc::Ok && g.failure(1).error == Errc::Ok, "bench " + row.what + ": no error");
        rows.push_back(row);
    };
    auto copy = [&](std::uint64_t bytes) {
        DevBuf src(bytes), dst(bytes);
        cudaStream_t st;
        TPF_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        Enqueue enq = [&](std::uint32_t, cudaStream_t s) { launchCopy(dst.p, src.p, bytes, s); };
        rows.push_back({"copy kernel " + std::to_string(bytes / 1024) + " KiB", usPerCall({st}, 1, 500, enq),
                        usPerCall({st}, kMany, 5, enq)});
        cudaStreamDestroy(st);
    };
    copy(4096);
    collective(Wire::Ipc, false, 4096);
    collective(Wire::Ipc, true, 4096);
    copy(64 * 1024);
    collective(Wire::Ipc, false, 64 * 1024);
    collective(Wire::Ipc, true, 64 * 1024);
    copy(512 * 1024);
    collective(Wire::Ipc, false, 512 * 1024);
    collective(Wire::Ipc, true, 512 * 1024);
    collective(Wire::Proxy, false, 4096);
    collective(Wire::Proxy, true, 4096);
    collective(Wire::Proxy, false, 64 * 1024);

    std::printf("\nlatency, W=2 simulated on one GPU, us per call (best of 3)\n");
    std::printf("| %-26s | 1 call/graph | %d calls/graph |\n", "what", kMany);
    std::printf("|----------------------------|--------------|-----------------|\n");
    for (const Row& r : rows) std::printf("| %-26s | %12.2f | %15.2f |\n", r.what.c_str(), r.single, r.many);
}

} // namespace tpf::gputest
