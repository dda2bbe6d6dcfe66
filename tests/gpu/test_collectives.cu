// GPU test of kernels/collectives: W = 2, 4, 8 simulated ranks in one
// process on one GPU (tests/gpu/sim_group.hpp), ipc and proxy wires (and a
// mixed group), checked byte for byte / bit for bit against host references.
// Exit 0: all passed; 1: a check failed; 77: no GPU here (Meson's skip).
//   test_gpu_collectives [--no-bench] [--bench-only] [--wire=ipc|proxy|mixed] [--world=N]
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/collectives.hpp"
#include "kernels/layout_probe.hpp"
#include "tests/gpu/cases.hpp"
#include "tests/gpu/check_kernels.hpp"
#include "tests/gpu/sim_group.hpp"

using namespace tpf;
using namespace tpf::gputest;

namespace tpf::gputest {

Stats g_stats;

void check(bool ok, const std::string& what) {
    if (ok) {
        ++g_stats.passed;
    } else {
        ++g_stats.failed;
        std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    }
}

DevBuf::DevBuf(std::uint64_t n) : bytes(n) { TPF_CUDA_CHECK(cudaMalloc(&p, n < 16 ? 16 : n)); }
DevBuf::~DevBuf() { cudaFree(p); }
// Legacy-stream copies and memsets may still be in flight when they return,
// and the ranks' non-blocking streams do not wait for them: finish them here.
void DevBuf::upload(const std::vector<std::uint8_t>& v) const {
    TPF_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size(), cudaMemcpyHostToDevice));
    TPF_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}
std::vector<std::uint8_t> DevBuf::download(std::uint64_t n) const {
    std::vector<std::uint8_t> v(n);
    TPF_CUDA_CHECK(cudaMemcpy(v.data(), p, n, cudaMemcpyDeviceToHost));
    return v;
}
void DevBuf::poison() const {
    TPF_CUDA_CHECK(cudaMemset(p, kPoison, bytes));
    TPF_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

std::vector<std::uint8_t> randomBytes(std::mt19937_64& rng, std::uint64_t n) {
    std::vector<std::uint8_t> v(n);
    for (std::uint64_t i = 0; i < n; i += 8) {
        const std::uint64_t x = rng();
        std::memcpy(v.data() + i, &x, n - i < 8 ? n - i : 8);
    }
    return v;
}

bool allPoison(const std::vector<std::uint8_t>& v) {
    for (std::uint8_t b : v)
        if (b != kPoison) return false;
    return true;
}

std::string tag(const SimGroup& g) {
    return std::string(wireName(g.options().wire)) + " W=" + std::to_string(g.world()) +
           " S=" + std::to_string(g.options().stripes);
}

} // namespace tpf::gputest

namespace {

// Device offsets must equal the host's (kernels/layout_probe).
void testLayoutProbe() {
    const Layout l = *Layout::of(4, 8192, 2);
    DevBuf out(8 * (4 * l.world + 1));
    TPF_CUDA_CHECK(kernels::launchLayoutProbe(l, static_cast<std::uint64_t*>(out.p), nullptr));
    TPF_CUDA_CHECK(cudaDeviceSynchronize());
    const auto raw = out.download(out.bytes);
    std::vector<std::uint64_t> v(raw.size() / 8);
    std::memcpy(v.data(), raw.data(), raw.size());
    bool ok = v[4 * l.world] == l.totalBytes();
    for (std::uint32_t i = 0; i < 2 * l.world; ++i)
        ok &= v[i] == l.slotOffset(i / l.world, i % l.world) &&
              v[2 * l.world + i] == l.flagOffset(i / l.world, i % l.world, l.stripes - 1);
    check(ok, "layout probe: device offsets equal host offsets");
}

struct Args {
    bool bench = true, tests = true;
    std::string wire; // empty: all
    std::uint32_t world = 0;
};

Args parse(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string s = argv[i];
        if (s == "--no-bench") a.bench = false;
        else if (s == "--bench-only") a.tests = false;
        else if (s.rfind("--wire=", 0) == 0) a.wire = s.substr(7);
        else if (s.rfind("--world=", 0) == 0) a.world = std::uint32_t(std::stoul(s.substr(8)));
        else {
            std::fprintf(stderr, "usage: %s [--no-bench] [--bench-only] [--wire=ipc|proxy|mixed] [--world=N]\n", argv[0]);
            std::exit(2);
        }
    }
    return a;
}

// The watchdog: the case running now and since when. A case that runs past
// TPF_GPU_CASE_SECONDS (default 120) is named and the program exits 3, so a
// hang says where it is instead of using up run.sh's whole time limit.
std::atomic<const char*> g_case{"start"};
std::atomic<gputest::Wire> g_caseWire{gputest::Wire::Ipc};
std::atomic<std::uint32_t> g_caseWorld{0};
std::atomic<std::int64_t> g_caseSince{0};

std::int64_t nowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void enter(const char* name, gputest::Wire wire, std::uint32_t W) {
    g_caseWire = wire;
    g_caseWorld = W;
    g_case = name;
    g_caseSince = nowNs();
}

void startWatchdog() {
    const char* env = std::getenv("TPF_GPU_CASE_SECONDS");
    const std::int64_t limit = (env && *env ? std::atoll(env) : 120) * 1'000'000'000ll;
    std::thread([limit] {
        for (;;) {
            std::this_thread::sleep_for(std::chrono::seconds(1));
            const std::int64_t ran = nowNs() - g_caseSince.load();
            if (g_caseSince.load() != 0 && ran > limit) {
                char where[48] = "";
                if (g_caseWorld.load())
                    std::snprintf(where, sizeof where, "%s W=%u ", wireName(g_caseWire.load()), g_caseWorld.load());
                std::printf("HUNG: %scase %s still running after %lld s (TPF_GPU_CASE_SECONDS); exiting\n", where,
                            g_case.load(), static_cast<long long>(ran / 1'000'000'000ll));
                std::fflush(stdout);
                std::_Exit(3);
            }
        }
    }).detach();
}

void runSuite(gputest::Wire wire, std::uint32_t W) {
    SimOptions o;
    o.world = W;
    o.wire = wire;
    o.stripes = W % 4 == 0 ? 2 : 1; // per-stripe flags exercised at W = 4, 8
    const auto t0 = std::chrono::steady_clock::now();
    const std::uint32_t failedBefore = g_stats.failed;
    enter("gather", wire, W), testGather(o);
    enter("sum f32", wire, W), testSum(o, Elem::F32);
    enter("sum f16", wire, W), testSum(o, Elem::F16);
    enter("sum bf16", wire, W), testSum(o, Elem::BF16);
    enter("graph", wire, W), testGraph(o);
    enter("timeout", wire, W), testTimeout(o);
    if (wire == gputest::Wire::Ipc) enter("call mismatches", wire, W), testCallMismatches(o); // the proxy route carries no call tag
    enter("daemon stop (abort)", wire, W), testDaemonStop(o, /*abort=*/true);
    enter("daemon stop", wire, W), testDaemonStop(o, /*abort=*/false);
    enter("back to back", wire, W), testBackToBack(o, 2000);
    enter("composed", wire, W), testComposed(o);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("== %-5s W=%u: %s (%.1f s)\n", wireName(wire), W, g_stats.failed == failedBefore ? "ok" : "FAILED", s);
    std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) {
    const Args args = parse(argc, argv);
    // Every simulated rank's stream needs its own hardware queue: with the
    // default 8, two ranks' kernels can serialise behind each other and a
    // waiting kernel would block the one it waits for.
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        std::printf("SKIP: no CUDA device here (cudaGetDeviceCount: %s, %d devices); "
                    "run tests/gpu/run.sh on the GPU machine\n",
                    err != cudaSuccess ? cudaGetErrorString(err) : "ok", n);
        return 77;
    }
    try {
        cudaDeviceProp prop{};
        TPF_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        std::printf("device: %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);
        // All W ranks launch from this one thread: no kernel may be loaded
        // lazily while another rank's collective spins (a lazy load of the
        // verify kernel once stalled rank 0 for the whole 2 s timeout).
        TPF_CUDA_CHECK(kernels::preloadKernels());
        preloadCheckKernels();
        preloadComposedKernels();
        startWatchdog();
        if (args.tests) {
            testLayoutProbe();
            const gputest::Wire wires[] = {gputest::Wire::Ipc, gputest::Wire::Proxy};
            for (gputest::Wire w : wires) {
                if (!args.wire.empty() && args.wire != wireName(w)) continue;
                for (std::uint32_t W : {2u, 4u, 8u})
                    if (args.world == 0 || args.world == W) runSuite(w, W);
            }
            if (args.wire.empty() || args.wire == "mixed") enter("mixed", gputest::Wire::Ipc, 0), testMixed();
            if (args.wire.empty() || args.wire == "ipc") enter("LL epoch wrap", gputest::Wire::Ipc, 0), testLlEpochWrap();
        }
        if (args.bench) enter("latency bench", gputest::Wire::Ipc, 0), runLatencyBench();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "FAIL: exception: %s\n", e.what());
        ++g_stats.failed;
    }
    std::printf("gpu collectives: %u passed, %u failed\n", g_stats.passed, g_stats.failed);
    return g_stats.failed == 0 ? 0 : 1;
}
