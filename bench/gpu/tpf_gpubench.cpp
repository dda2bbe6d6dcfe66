// GPU benchmark, one rank process (bench/gpu/run.sh starts W of them under MPS
// with the real daemon). Rank 0 prints the table rows as
//   ROW <what> <bytes> <us_per_call>
// --mode sizes: ipc (or proxy) gathers and bf16 sums, 100 calls captured in one
//   graph, best of 5 replays, beside a graph of 100 copy kernels of the same
//   bytes measured in the same run (the floor) and, on the ipc route, the
//   exchange floor (store-flag-floor: one kernel storing the bytes into every
//   peer and releasing a flag each peer waits on, bench_kernels.hpp); each also without
//   programmatic dependent launch (-nopdl: a second group opened with
//   TPF_GPU_PDL=0) and the floor with it (copy-kernel-pdl); on the proxy
//   route also with one poller warp (-1poll: TPF_GPU_POLLERS=1).
// --mode nccl: one process per GPU (W GPUs), NCCL beside tpfabric in the same
//   run, every side a graph of 100 calls, best of 5 replays, per size 4 KiB ..
//   512 KiB: the copy floor; the exchange floor over the link (plain and
//   with PDL); the fabric kernel (LL path where it applies: its
//   default grid, and 256-thread blocks of 1, 2 and 4 chunks per thread
//   (TPF_GPU_LL_CHUNKS), and the flag path with
//   TPF_GPU_LL=0, and the default grid with TPF_GPU_PDL=0), all over the TCP bootstrap so that the
//   fabric takes every size; ncclAllGather / ncclAllReduce (bf16, sum); and a
//   group over an NcclBootstrap, which routes each size as an application's
//   group would (fabric up to the crossover, NCCL above it).
// --mode hop: proxy route 16 B gathers (a graph of 100, per call), then the
//   hop alone (doorbell -> daemon -> flag -> waiting kernel; proxyHop below,
//   parts_kernels.hpp),
//   both also with one poller warp (TPF_GPU_POLLERS=1), beside raw
//   host-mapped flag ping-pongs (kernel <-> CPU thread) in the same run:
//   one thread's round trip (the host clock's mean), and warp 0 alone or
//   four warps polling as the collectives do (laps).
// --mode parts --route ipc: the LL calls of 4 to 64 KiB taken apart (block
//   0's phases: epoch read to the puts issued, to every line seen, to the
//   output), beside the copy floor launched as they are.
// --mode parts: the proxy route taken apart, per size 4 KiB .. 512 KiB, every
//   rank at once: the whole gather (graph of 100), a copy kernel staging the
//   bytes into the own host slot (the route's first stage) and one reading a
//   peer's slot back (its last), each also on a cudaHostAlloc buffer (to see
//   whether the group's memfd region costs more), and the hop carrying the
//   bytes (proxyHop: doorbell -> the daemon's copy -> flag, laps p50), and
//   the gather's own phases as its block 0 sees them (kernel entry to the
//   doorbell, doorbell to the peer's flag, flag to the output written; the
//   mean over the graph's calls: the library's kernel bodies with a timeline
//   probe, parts_kernels.hpp).
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench/gpu/bench_kernels.hpp"
#include "bench/gpu/parts_kernels.hpp"
#include "client/testing.hpp"
#include "kernels/collectives.hpp"
#include "tpf_config.h"
#include <tpfabric/tpfabric.hpp>
#if TPF_HAVE_NCCL
#include <tpfabric/nccl.hpp>
#endif

using namespace tpf;

namespace {

struct Args {
    std::string socket, bootstrap, mode = "sizes", route = "ipc";
    std::uint32_t rank = 0, world = 2, calls = 100, reps = 5;
    int device = -1; ///< -1: rank % visible devices
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

// One side of a benchmark table: a row's name, the call its graph repeats,
// and the group to check() after it (nullptr for the reference kernels).
struct Side {
    std::string name;
    std::function<void()> call;
    Group* g;
};

void closeFloor(gpubench::ExchangeFloor& f);

// The exchange floor's areas (bench_kernels.hpp): this rank's, and every
// peer's mapped through CUDA IPC, the handles exchanged over the bootstrap.
// Every rank takes part in both exchanges whatever failed on it, and the
// floor runs only where it opened on every rank: a floor kernel on some
// ranks alone would wait for flags that never come. Else each rank says why
// and its sides are left out (f.world 0); the benchmark's other rows still
// come. closeFloor after a barrier that every rank passes once its last call
// is done, so that no peer still stores into an area being freed.
bool openFloor(Bootstrap& boot, std::uint64_t rowBytes, bool system, gpubench::ExchangeFloor& f) {
    f = {};
    f.world = a.world;
    f.rank = a.rank;
    f.rowBytes = rowBytes;
    f.system = system;
    struct Record {
        cudaIpcMemHandle_t handle;
        std::uint32_t ok, pad;
    };
    Record mine{};
    const std::uint64_t area = gpubench::floorAreaBytes(a.world, rowBytes);
    std::uint8_t* own = nullptr;
    cudaError_t e = cudaMalloc(&own, area);
    if (e == cudaSuccess) f.flags = reinterpret_cast<std::uint32_t*>(own + a.world * rowBytes), e = cudaMemset(own, 0, area);
    if (e == cudaSuccess) e = cudaMalloc(&f.epochs, gpubench::kFloorMaxBlocks * 4);
    if (e == cudaSuccess) e = cudaMemset(f.epochs, 0, gpubench::kFloorMaxBlocks * 4);
    if (e == cudaSuccess) e = cudaIpcGetMemHandle(&mine.handle, own);
    if (e == cudaSuccess) e = cudaDeviceSynchronize(); // the memsets before any peer's first store
    mine.ok = e == cudaSuccess;
    std::vector<Record> all(a.world);
    std::string why = e == cudaSuccess ? "" : std::string("this rank's area: ") + cudaGetErrorName(e);
    bool every = false;
    if (auto s = boot.allGather(&mine, all.data(), sizeof mine); !s) why = "the handles' exchange: " + s.error().describe();
    else every = std::all_of(all.begin(), all.end(), [](const Record& r) { return r.ok != 0; });
    if (!every && why.empty()) why = "another rank could not make its area";
    for (std::uint32_t q = 0; q < a.world && why.empty(); ++q) {
        if (q == a.rank) continue;
        void* p = nullptr;
        if (e = cudaIpcOpenMemHandle(&p, all[q].handle, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess)
            why = "rank " + std::to_string(q) + "'s area: " + cudaGetErrorName(e);
        f.peerArea[q] = static_cast<std::uint8_t*>(p);
    }
    const std::uint32_t opened = why.empty();
    std::vector<std::uint32_t> each(a.world);
    bool ready = false;
    if (auto s = boot.allGather(&opened, each.data(), 4); !s) why = "the last exchange: " + s.error().describe();
    else ready = std::all_of(each.begin(), each.end(), [](std::uint32_t o) { return o != 0; });
    if (why.empty() && ready) return true;
    std::fprintf(stderr, "rank %u: the exchange floor is left out of this run (%s)\n", a.rank,
                 why.empty() ? "another rank could not map the areas" : why.c_str());
    closeFloor(f);
    return false;
}

// The exchange floor's two sides (plain and PDL) of one size, where it opened.
void addFloorSides(std::vector<Side>& sides, const gpubench::ExchangeFloor& f, const std::uint8_t* send,
                   std::uint64_t bytes, cudaStream_t st) {
    if (f.world == 0) return;
    sides.push_back({"store-flag-floor", [&f, send, bytes, st] { gpubench::launchExchangeFloor(f, send, bytes, false, st); },
                     nullptr});
    sides.push_back({"store-flag-floor-pdl", [&f, send, bytes, st] { gpubench::launchExchangeFloor(f, send, bytes, true, st); },
                     nullptr});
}

void closeFloor(gpubench::ExchangeFloor& f) {
    for (std::uint32_t q = 0; q < f.world; ++q)
        if (f.peerArea[q]) (void)cudaIpcCloseMemHandle(f.peerArea[q]);
    if (f.flags) (void)cudaFree(reinterpret_cast<std::uint8_t*>(f.flags) - f.world * f.rowBytes);
    if (f.epochs) (void)cudaFree(f.epochs);
    f = {};
}

// One side of --mode parts: its graph timed (ROW name), and for a group's
// side (its calls launched through gpubench::launchTimed*, summing into `tl`)
// the phases summed meanwhile, block 0's mean per call, one ROW each.
int timeParts(const char* name, const std::function<void()>& call, Group* g, std::uint64_t bytes, cudaStream_t st,
              const char* const (&phases)[3], const gpubench::Timeline* tl) {
    gpubench::Timeline t0{}, t1{};
    if (g) CK(cudaMemcpy(&t0, tl, sizeof t0, cudaMemcpyDeviceToHost));
    double us = 0;
    if (timeGraph(st, call, us, g)) return 1;
    row(name, bytes, us);
    if (!g) return 0;
    CK(cudaMemcpy(&t1, tl, sizeof t1, cudaMemcpyDeviceToHost));
    const double calls = double(t1.calls - t0.calls);
    if (calls == 0) return 0;
    for (int k = 0; k < 3; ++k) row(phases[k], bytes, double(t1.phase[k] - t0.phase[k]) / calls / 1e3);
    return 0;
}

// A Device group's call as the library launches it, with the phases summed
// into `tl` (gpubench::launchTimed*: the library's kernel bodies and shapes).
void timedGather(Group& g, const void* send, void* recv, std::uint64_t bytes, gpubench::Timeline* tl, cudaStream_t st) {
    (void)gpubench::launchTimedAllGather(tpf::testing::deviceView(g), send, recv, bytes, tl, st);
}
void timedSumBf16(Group& g, const void* send, void* recv, std::uint64_t count, gpubench::Timeline* tl, cudaStream_t st) {
    (void)gpubench::launchTimedAllReduceSum(tpf::testing::deviceView(g), send, recv, count, DType::BF16, tl, st);
}

// Rows name-p50 / -mean / -p99 (us) of laps in ns (sorted here).
void lapRows(const std::string& name, std::uint64_t bytes, std::vector<std::uint64_t>& lap) {
    std::sort(lap.begin(), lap.end());
    double sum = 0;
    for (const std::uint64_t l : lap) sum += double(l);
    row((name + "-p50").c_str(), bytes, double(lap[lap.size() / 2]) / 1e3);
    row((name + "-mean").c_str(), bytes, sum / double(lap.size()) / 1e3);
    row((name + "-p99").c_str(), bytes, double(lap[lap.size() * 99 / 100]) / 1e3);
}

// --mode hop, the hop alone: every rank runs one launch of kHopCalls 16-byte
// calls (gpubench::launchProxyHopLoop: stage, doorbell, wait for the peer's
// flag; no launch and no output per call), after a warm-up launch. Rows: the
// period per call (host clock over the launch / calls: with several poller
// warps it includes the slower pollers' last reads, which a collective call
// overlaps with its output) and the laps' p50 / mean / p99 (%globaltimer,
// doorbell store to the flags seen), named `name`-*.
template <class Barrier>
int proxyHop(Group& g, cudaStream_t st, Barrier& barrier, std::uint64_t bytes = 16, std::uint64_t kHopCalls = 20000,
             const std::string& name = "proxy-hop") {
    constexpr std::uint64_t kWarmup = 1000;
    const kernels::DeviceGroupView& view = tpf::testing::deviceView(g);
    std::uint64_t* laps = nullptr;
    CK(cudaMalloc(&laps, kHopCalls * sizeof(std::uint64_t)));
    barrier();
    CK(gpubench::launchProxyHopLoop(view, kWarmup, nullptr, st, bytes));
    CK(cudaStreamSynchronize(st));
    barrier();
    const auto t0 = std::chrono::steady_clock::now();
    CK(gpubench::launchProxyHopLoop(view, kHopCalls, laps, st, bytes));
    CK(cudaStreamSynchronize(st));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (auto c = g.check(); !c) return std::fprintf(stderr, "rank %u: hop: %s\n", a.rank, c.error().describe().c_str()), 1;
    std::vector<std::uint64_t> lap(kHopCalls);
    CK(cudaMemcpy(lap.data(), laps, kHopCalls * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
    cudaFree(laps);
    row((name + "-period").c_str(), bytes, s * 1e6 / double(kHopCalls));
    lapRows(name, bytes, lap);
    return 0;
}

// The raw ping-pong polled as waitPeers polls (gpubench::launchPingPongWarps):
// rows pingpong-<warps>w-p50 / -mean / -p99, from the laps.
int pingPongWarps(cudaStream_t st, std::uint32_t warps) {
    constexpr std::uint64_t kIters = 20000;
    std::uint64_t *flags = nullptr, *dflags = nullptr, *laps = nullptr;
    CK(cudaHostAlloc(&flags, 256, cudaHostAllocMapped | cudaHostAllocPortable));
    std::fill(flags, flags + 32, 0);
    CK(cudaHostGetDevicePointer(&dflags, flags, 0));
    CK(cudaMalloc(&laps, kIters * sizeof(std::uint64_t)));
    std::thread cpu([&] {
        for (std::uint64_t i = 1; i <= kIters; ++i) {
            while (std::atomic_ref(flags[0]).load(std::memory_order_acquire) < i) {}
            for (std::uint32_t w = 0; w < warps; ++w) std::atomic_ref(flags[16 + 4 * w]).store(i, std::memory_order_release);
        }
    });
    gpubench::launchPingPongWarps(dflags, dflags + 16, warps, kIters, laps, st);
    const cudaError_t err = cudaStreamSynchronize(st);
    cpu.join();
    CK(err);
    std::vector<std::uint64_t> lap(kIters);
    CK(cudaMemcpy(lap.data(), laps, kIters * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
    cudaFree(laps);
    cudaFreeHost(flags);
    lapRows("pingpong-" + std::to_string(warps) + "w", 8, lap);
    return 0;
}

#if TPF_HAVE_NCCL
// --mode nccl (see the top of the file).
int benchBeside(Bootstrap& tcp, cudaStream_t st, std::uint8_t* send, std::uint8_t* recv, std::uint8_t* recv2,
                std::uint64_t maxBytes) {
    auto comm = tpf::testing::ncclCommOver(tcp);
    if (!comm) return std::fprintf(stderr, "rank %u: %s\n", a.rank, comm.error().describe().c_str()), 1;
    Options o;
    o.socketPath = a.socket;
    o.buffers = tpf::Buffers::Device;
    o.gpuRoute = GpuRoute::Ipc;
    auto ll = Group::open(tcp, a.rank, a.world, maxBytes, o);
    if (!ll) return std::fprintf(stderr, "rank %u: open: %s\n", a.rank, ll.error().describe().c_str()), 1;
    ::setenv("TPF_GPU_LL", "0", 1); // the flag path alone, for comparison
    auto flag = Group::open(tcp, a.rank, a.world, maxBytes, o);
    ::unsetenv("TPF_GPU_LL");
    if (!flag) return std::fprintf(stderr, "rank %u: open (flag path): %s\n", a.rank, flag.error().describe().c_str()), 1;
    ::setenv("TPF_GPU_PDL", "0", 1); // plain launches, for comparison
    auto nopdl = Group::open(tcp, a.rank, a.world, maxBytes, o);
    ::unsetenv("TPF_GPU_PDL");
    if (!nopdl) return std::fprintf(stderr, "rank %u: open (TPF_GPU_PDL=0): %s\n", a.rank, nopdl.error().describe().c_str()), 1;
    ::setenv("TPF_GPU_LL_CHUNKS", "1", 1); // LL grid variants: chunks per thread, 256-thread blocks
    auto ll1 = Group::open(tcp, a.rank, a.world, maxBytes, o);
    ::setenv("TPF_GPU_LL_CHUNKS", "2", 1);
    auto ll2 = Group::open(tcp, a.rank, a.world, maxBytes, o);
    ::setenv("TPF_GPU_LL_CHUNKS", "4", 1);
    auto ll4 = Group::open(tcp, a.rank, a.world, maxBytes, o);
    ::unsetenv("TPF_GPU_LL_CHUNKS");
    if (!ll1 || !ll2 || !ll4) return std::fprintf(stderr, "rank %u: open (LL variants) failed\n", a.rank), 1;
    auto nboot = NcclBootstrap::create(*comm);
    if (!nboot) return std::fprintf(stderr, "rank %u: %s\n", a.rank, nboot.error().describe().c_str()), 1;
    auto routed = Group::open(**nboot, a.rank, a.world, maxBytes, o);
    if (!routed) return std::fprintf(stderr, "rank %u: open (routed): %s\n", a.rank, routed.error().describe().c_str()), 1;
    if (a.rank == 0)
        std::printf("INFO routed group path=%s cap=%llu\n", (*routed)->path().c_str(), (unsigned long long)(*routed)->agreedCap());
    gpubench::ExchangeFloor floor; // one process per GPU: flags at system scope; f.world 0 when left out
    (void)openFloor(tcp, maxBytes, true, floor);
    std::uint32_t sync = 0;
    std::vector<std::uint32_t> all(a.world);
    auto barrier = [&] { return bool(tcp.allGather(&sync, all.data(), 4)); };
    const ncclComm_t c = *comm;
    double us = 0;
    for (std::uint64_t bytes = 4096; bytes <= maxBytes; bytes *= 2) {
        const std::uint64_t n = bytes / 2;
        std::vector<Side> sides = {
            {"copy-kernel", [&] { gpubench::launchCopy(recv2, send, bytes, st); }, nullptr},
            {"ll-gather", [&] { (void)(*ll)->allGather(send, recv, bytes, st); }, ll->get()},
            {"ll-sum-bf16", [&] { (void)(*ll)->allReduceSum(send, recv, n, DType::BF16, st); }, ll->get()},
            {"ll-gather-nopdl", [&] { (void)(*nopdl)->allGather(send, recv, bytes, st); }, nopdl->get()},
            {"ll-sum-bf16-nopdl", [&] { (void)(*nopdl)->allReduceSum(send, recv, n, DType::BF16, st); }, nopdl->get()},
            {"ll1-gather", [&] { (void)(*ll1)->allGather(send, recv, bytes, st); }, ll1->get()},
            {"ll1-sum-bf16", [&] { (void)(*ll1)->allReduceSum(send, recv, n, DType::BF16, st); }, ll1->get()},
            {"ll2-gather", [&] { (void)(*ll2)->allGather(send, recv, bytes, st); }, ll2->get()},
            {"ll2-sum-bf16", [&] { (void)(*ll2)->allReduceSum(send, recv, n, DType::BF16, st); }, ll2->get()},
            {"ll4-gather", [&] { (void)(*ll4)->allGather(send, recv, bytes, st); }, ll4->get()},
            {"ll4-sum-bf16", [&] { (void)(*ll4)->allReduceSum(send, recv, n, DType::BF16, st); }, ll4->get()},
            {"flag-gather", [&] { (void)(*flag)->allGather(send, recv, bytes, st); }, flag->get()},
            {"flag-sum-bf16", [&] { (void)(*flag)->allReduceSum(send, recv, n, DType::BF16, st); }, flag->get()},
            {"nccl-gather", [&] { (void)ncclAllGather(send, recv, bytes, ncclUint8, c, st); }, nullptr},
            {"nccl-sum-bf16", [&] { (void)ncclAllReduce(send, recv, n, ncclBfloat16, ncclSum, c, st); }, nullptr},
            {"routed-gather", [&] { (void)(*routed)->allGather(send, recv, bytes, st); }, routed->get()},
            {"routed-sum-bf16", [&] { (void)(*routed)->allReduceSum(send, recv, n, DType::BF16, st); }, routed->get()},
        };
        addFloorSides(sides, floor, send, bytes, st);
        for (const Side& sd : sides) {
            barrier();
            if (timeGraph(st, sd.call, us, sd.g)) return 1;
            row(sd.name.c_str(), bytes, us);
        }
    }
    barrier();
    closeFloor(floor);
    routed->reset();
    ll4->reset();
    ll2->reset();
    ll1->reset();
    flag->reset();
    nopdl->reset();
    ll->reset();
    nboot->reset();
    ncclCommDestroy(c);
    return 0;
}
#endif

} // namespace

int main(int argc, char** argv) {
    CLI::App app{"tpfabric GPU benchmark rank (started by bench/gpu/run.sh on the GPU machine)"};
    app.add_option("--socket", a.socket);
    app.add_option("--bootstrap", a.bootstrap);
    app.add_option("--mode", a.mode, "sizes, nccl, hop or parts (the top of bench/gpu/tpf_gpubench.cpp)");
    app.add_option("--route", a.route);
    app.add_option("--rank", a.rank);
    app.add_option("--world", a.world);
    app.add_option("--calls", a.calls);
    app.add_option("--device", a.device, "CUDA device (default: rank % visible devices)");
    CLI11_PARSE(app, argc, argv);
    // TPF_BENCH_STATS=0: the kernels count no calls (to measure what counting costs).
    if (const char* v = std::getenv("TPF_BENCH_STATS"); v && *v == '0') tpf::testing::setDeviceStats(false);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return std::printf("SKIP: no CUDA device\n"), 77;
    CK(cudaSetDevice(a.device >= 0 ? a.device : int(a.rank % std::uint32_t(n))));
    CK(gpubench::preloadBenchKernels());
    CK(gpubench::preloadPartsKernels());
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
    if (a.mode == "nccl") {
#if TPF_HAVE_NCCL
        return benchBeside(**boot, st, send, recv, recv2, maxBytes);
#else
        return std::printf("SKIP: built without NCCL\n"), 77;
#endif
    }
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
        // The same group without programmatic dependent launch (TPF_GPU_PDL=0), beside it in the same run.
        ::setenv("TPF_GPU_PDL", "0", 1);
        auto plain = Group::open(**boot, a.rank, a.world, maxBytes, o);
        ::unsetenv("TPF_GPU_PDL");
        if (!plain) return std::fprintf(stderr, "rank %u: open (TPF_GPU_PDL=0): %s\n", a.rank, plain.error().describe().c_str()), 1;
        Group& gp = **plain;
        // Proxy route: the same group with one poller warp (TPF_GPU_POLLERS=1), beside it.
        std::unique_ptr<Group> onePoll;
        if (a.route == "proxy") {
            ::setenv("TPF_GPU_POLLERS", "1", 1);
            auto one = Group::open(**boot, a.rank, a.world, maxBytes, o);
            ::unsetenv("TPF_GPU_POLLERS");
            if (!one) return std::fprintf(stderr, "rank %u: open (TPF_GPU_POLLERS=1): %s\n", a.rank, one.error().describe().c_str()), 1;
            onePoll = std::move(*one);
        }
        // The ipc route: the exchange floor beside it (all ranks on one GPU: flags at GPU scope).
        gpubench::ExchangeFloor floor{};
        if (a.route == "ipc") (void)openFloor(**boot, maxBytes, false, floor); // f.world 0 when left out
        for (std::uint64_t bytes = 4096; bytes <= maxBytes; bytes *= 2) {
            const std::uint64_t count = bytes / 2;
            const std::string gather = a.route + "-gather", sum = a.route + "-sum-bf16";
            std::vector<Side> sides = {
                {"copy-kernel", [&] { gpubench::launchCopy(recv2, send, bytes, st); }, nullptr},
                {"copy-kernel-pdl", [&] { gpubench::launchCopyPdl(recv2, send, bytes, st); }, nullptr},
                {gather, [&] { (void)g.allGather(send, recv, bytes, st); }, &g},
                {gather + "-nopdl", [&] { (void)gp.allGather(send, recv, bytes, st); }, &gp},
                {sum, [&] { (void)g.allReduceSum(send, recv, count, DType::BF16, st); }, &g},
                {sum + "-nopdl", [&] { (void)gp.allReduceSum(send, recv, count, DType::BF16, st); }, &gp},
            };
            addFloorSides(sides, floor, send, bytes, st);
            if (onePoll) {
                sides.push_back({gather + "-1poll", [&] { (void)onePoll->allGather(send, recv, bytes, st); }, onePoll.get()});
                sides.push_back({sum + "-1poll", [&] { (void)onePoll->allReduceSum(send, recv, count, DType::BF16, st); },
                                 onePoll.get()});
            }
            for (const auto& sd : sides) {
                barrier();
                if (timeGraph(st, sd.call, us, sd.g)) return 1;
                row(sd.name.c_str(), bytes, us);
            }
        }
        barrier();
        closeFloor(floor);
    } else if (a.mode == "parts" && a.route == "ipc") {
        // The ipc route's LL calls taken apart (block 0's phases), 4 to 64 KiB (LL at W <= 9),
        // beside a group with TPF_GPU_LL_CHUNKS=1 (-c1: 256-thread blocks of one chunk a thread).
        ::setenv("TPF_GPU_LL_CHUNKS", "1", 1);
        auto c1 = Group::open(**boot, a.rank, a.world, maxBytes, o);
        ::unsetenv("TPF_GPU_LL_CHUNKS");
        if (!c1) return std::fprintf(stderr, "rank %u: open (TPF_GPU_LL_CHUNKS=1): %s\n", a.rank, c1.error().describe().c_str()), 1;
        gpubench::Timeline* tl = nullptr; // the group sides' calls sum their phases here
        CK(cudaMalloc(&tl, sizeof *tl));
        CK(cudaMemset(tl, 0, sizeof *tl));
        Group& g1 = **c1;
        for (std::uint64_t bytes = 4096; bytes <= 65536; bytes *= 2) {
            const Side sides[] = {
                {"copy-kernel-pdl", [&] { gpubench::launchCopyPdl(recv2, send, bytes, st); }, nullptr},
                {"ipc-gather", [&] { timedGather(g, send, recv, bytes, tl, st); }, &g},
                {"ipc-gather-c1", [&] { timedGather(g1, send, recv, bytes, tl, st); }, &g1},
                {"ipc-sum-bf16", [&] { timedSumBf16(g, send, recv, bytes / 2, tl, st); }, &g},
                {"ipc-sum-bf16-c1", [&] { timedSumBf16(g1, send, recv, bytes / 2, tl, st); }, &g1},
            };
            static const char* const phases[3] = {"ll-epoch-to-puts", "ll-puts-to-lines", "ll-lines-to-output"};
            for (const auto& sd : sides) {
                barrier();
                if (timeParts(sd.name.c_str(), sd.call, sd.g, bytes, st, phases, tl)) return 1;
            }
        }
        barrier();
        cudaFree(tl);
    } else if (a.mode == "parts") {
        const kernels::DeviceGroupView& view = tpf::testing::deviceView(g);
        gpubench::Timeline* tl = nullptr; // the gather's calls sum their phases here
        CK(cudaMalloc(&tl, sizeof *tl));
        CK(cudaMemset(tl, 0, sizeof *tl));
        // Phase 0's slots: the calls between these graphs rewrite them anyway.
        std::uint8_t* const own = view.hostRegion + view.layout.slotOffset(0, a.rank);
        std::uint8_t* const peer = view.hostRegion + view.layout.slotOffset(0, (a.rank + 1) % a.world);
        std::uint8_t *pinned = nullptr, *dpinned = nullptr;
        CK(cudaHostAlloc(&pinned, maxBytes, cudaHostAllocMapped | cudaHostAllocPortable));
        CK(cudaHostGetDevicePointer(&dpinned, pinned, 0));
        for (std::uint64_t bytes = 4096; bytes <= maxBytes; bytes *= 4) {
            const Side sides[] = {
                {"copy-kernel", [&] { gpubench::launchCopy(recv2, send, bytes, st); }, nullptr},
                {"proxy-gather", [&] { timedGather(g, send, recv, bytes, tl, st); }, &g},
                {"stage-kernel", [&] { gpubench::launchCopy(own, send, bytes, st); }, nullptr},
                {"stage-kernel-pinned", [&] { gpubench::launchCopy(dpinned, send, bytes, st); }, nullptr},
                {"read-kernel", [&] { gpubench::launchCopy(recv2, peer, bytes, st); }, nullptr},
                {"read-kernel-pinned", [&] { gpubench::launchCopy(recv2, dpinned, bytes, st); }, nullptr},
            };
            static const char* const phases[3] = {"gather-put-to-doorbell", "gather-doorbell-to-flags",
                                                  "gather-flags-to-output"};
            for (const auto& sd : sides) {
                barrier();
                if (timeParts(sd.name.c_str(), sd.call, sd.g, bytes, st, phases, tl)) return 1;
            }
            barrier();
            if (proxyHop(g, st, barrier, bytes, 2000)) return 1;
        }
        barrier();
        cudaFreeHost(pinned);
        cudaFree(tl);
    } else { // hop
        barrier();
        if (timeGraph(st, [&] { gpubench::launchCopy(recv2, send, 16, st); }, us, nullptr)) return 1;
        row("copy-kernel", 16, us);
        barrier();
        if (timeGraph(st, [&] { (void)g.allGather(send, recv, 16, st); }, us, &g)) return 1;
        row("proxy-gather", 16, us);
        barrier();
        if (proxyHop(g, st, barrier)) return 1;
        barrier();
        { // the same hop polled by warp 0 alone (TPF_GPU_POLLERS=1), beside it
            ::setenv("TPF_GPU_POLLERS", "1", 1);
            auto one = Group::open(**boot, a.rank, a.world, maxBytes, o);
            ::unsetenv("TPF_GPU_POLLERS");
            if (!one) return std::fprintf(stderr, "rank %u: open (TPF_GPU_POLLERS=1): %s\n", a.rank, one.error().describe().c_str()), 1;
            barrier();
            if (timeGraph(st, [&] { (void)(*one)->allGather(send, recv, 16, st); }, us, one->get())) return 1;
            row("proxy-gather-1poll", 16, us);
            barrier();
            if (proxyHop(**one, st, barrier, 16, 20000, "proxy-hop-1poll")) return 1;
            barrier();
        }
        if (a.rank == 0) { // raw ping-pongs: GPU kernel <-> CPU thread through host-mapped memory
            if (pingPongWarps(st, 1) || pingPongWarps(st, 4)) return 1;
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
