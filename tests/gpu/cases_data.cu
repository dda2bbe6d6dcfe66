// Data cases: gathers byte-exact, sums bit-exact against the rank-order
// reference, a captured graph replayed with new shards, a mixed group.
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>

#include "tests/gpu/cases.hpp"

namespace tpf::gputest {

namespace {

constexpr std::uint64_t kGatherSizes[] = {16, 1024, 4096, 65536 + 16, 512 * 1024};

struct Buffers {
    std::vector<std::unique_ptr<DevBuf>> send, recv;
    Buffers(std::uint32_t world, std::uint64_t sendBytes, std::uint64_t recvBytes) {
        for (std::uint32_t r = 0; r < world; ++r) {
            send.push_back(std::make_unique<DevBuf>(sendBytes));
            recv.push_back(std::make_unique<DevBuf>(recvBytes));
        }
    }
};

// One gather on every rank (launched in reverse rank order, so a rank often
// starts waiting before its peers put); true when every row of every rank is right.
bool gatherOnce(SimGroup& g, Buffers& b, std::uint64_t bytes, std::mt19937_64& rng, const std::string& what) {
    const std::uint32_t W = g.world();
    std::vector<std::vector<std::uint8_t>> shards(W);
    for (std::uint32_t r = 0; r < W; ++r) {
        shards[r] = randomBytes(rng, bytes);
        b.send[r]->upload(shards[r]);
        b.recv[r]->poison();
    }
    for (std::uint32_t r = W; r-- > 0;)
        TPF_CUDA_CHECK(kernels::launchAllGather(g.view(r), b.send[r]->p, b.recv[r]->p, bytes, g.stream(r)));
    g.syncAll();
    bool ok = true;
    for (std::uint32_t r = 0; r < W; ++r) {
        const auto out = b.recv[r]->download(W * bytes);
        for (std::uint32_t q = 0; q < W; ++q)
            ok &= std::memcmp(out.data() + q * bytes, shards[q].data(), bytes) == 0;
        ok &= g.failure(r).error == Errc::Ok;
    }
    check(ok, what + ": gather of " + std::to_string(bytes) + " B, every row of every rank");
    return ok;
}

// Values whose exponents spread over 2^-10..2^10, so the order of the f32
// adds changes the bits (f16: still normal; sums stay far below 65504).
float spreadValue(std::mt19937_64& rng, int lo, int hi) {
    const std::uint64_t x = rng();
    const float m = 1.0f + float(x & 0x7fffff) / float(1 << 23);
    return std::ldexp(m, std::uniform_int_distribution<int>(lo, hi)(rng)) * ((x >> 32) & 1 ? -1.f : 1.f);
}

// W rows of `count` elements. f16/bf16 rows of a few spread values sum
// exactly in f32 in any order, so every other element gets a cancelling pair
// +-2^K on two random ranks and a small value on a third: in one order the
// small value survives, in another it falls below the f32 ulp of 2^K (K = 15
// for f16, 30 for bf16) and the rounded result differs.
std::vector<std::vector<std::uint8_t>> makeRows(Elem t, std::mt19937_64& rng, std::uint32_t W, std::size_t count) {
    const std::size_t es = t == Elem::F32 ? 4 : 2;
    std::vector<std::vector<std::uint8_t>> rows(W, std::vector<std::uint8_t>(count * es));
    std::vector<float> v(W);
    for (std::size_t i = 0; i < count; ++i) {
        for (std::uint32_t r = 0; r < W; ++r) v[r] = t == Elem::F32 ? spreadValue(rng, -10, 10) : spreadValue(rng, -10, 0);
        if (t != Elem::F32 && W >= 3 && i % 2 == 0) {
            const std::uint32_t a = std::uint32_t(rng() % W), b = (a + 1 + std::uint32_t(rng() % (W - 1))) % W;
            std::uint32_t c = std::uint32_t(rng() % W);
            while (c == a || c == b) c = (c + 1) % W;
            const float big = std::ldexp(1.0f, t == Elem::F16 ? 15 : 30);
            v[a] = big, v[b] = -big;
            v[c] = t == Elem::F16 ? spreadValue(rng, -10, -1) : spreadValue(rng, 0, 5);
        }
        for (std::uint32_t r = 0; r < W; ++r) narrow(t, v[r], rows[r].data() + i * es);
    }
    return rows;
}

const char* elemName(Elem t) { return t == Elem::F32 ? "f32" : t == Elem::F16 ? "f16" : "bf16"; }

kernels::DType dtypeOf(Elem t) {
    return t == Elem::F32 ? kernels::DType::F32 : t == Elem::F16 ? kernels::DType::F16 : kernels::DType::BF16;
}

bool sumOnce(SimGroup& g, Buffers& b, Elem t, std::uint64_t bytes, std::mt19937_64& rng, const std::string& what) {
    const std::uint32_t W = g.world();
    const std::size_t es = t == Elem::F32 ? 4 : 2, count = bytes / es;
    const auto rows = makeRows(t, rng, W, count);
    for (std::uint32_t r = 0; r < W; ++r) {
        b.send[r]->upload(rows[r]);
        b.recv[r]->poison();
    }
    for (std::uint32_t r = W; r-- > 0;)
        TPF_CUDA_CHECK(kernels::launchAllReduceSum(g.view(r), b.send[r]->p, b.recv[r]->p, count, dtypeOf(t), g.stream(r)));
    g.syncAll();
    std::vector<std::uint32_t> order(W);
    std::iota(order.begin(), order.end(), 0u);
    const auto ref = sumRows(t, rows, count, order);
    bool ok = true;
    for (std::uint32_t r = 0; r < W; ++r) {
        ok &= b.recv[r]->download(bytes) == ref;
        ok &= g.failure(r).error == Errc::Ok;
    }
    check(ok, what + ": " + elemName(t) + " sum of " + std::to_string(count) + " elements bit-exact, every rank");
    if (bytes >= 65536) { // the test means something only if another order gives other bits
        std::vector<std::uint32_t> rev(order.rbegin(), order.rend());
        const auto other = sumRows(t, rows, count, rev);
        std::size_t differ = 0;
        for (std::size_t i = 0; i < count; ++i) differ += std::memcmp(&ref[i * es], &other[i * es], es) != 0;
        if (W >= 3) check(differ > 0, what + ": reverse order changes the bits of some " + elemName(t) + " sums");
        std::printf("   %s %s: %zu elements, %zu differ in reverse rank order\n", what.c_str(), elemName(t), count,
                    differ);
    }
    return ok;
}

} // namespace

void testGather(const SimOptions& o) {
    SimGroup g(o);
    Buffers b(o.world, o.slotBytes, o.world * o.slotBytes);
    std::mt19937_64 rng(1000 + o.world);
    for (std::uint64_t bytes : kGatherSizes)
        for (int rep = 0; rep < 3; ++rep) gatherOnce(g, b, bytes, rng, tag(g));
    check(g.proxyError().empty(), tag(g) + ": proxy saw valid doorbells only: " + g.proxyError());
}

void testSum(const SimOptions& o, Elem t) {
    SimGroup g(o);
    Buffers b(o.world, o.slotBytes, o.slotBytes);
    std::mt19937_64 rng(2000 + o.world * 10 + int(t));
    for (std::uint64_t bytes : {std::uint64_t(16), std::uint64_t(1024), std::uint64_t(65536 + 16), o.slotBytes})
        for (int rep = 0; rep < 2; ++rep) sumOnce(g, b, t, bytes, rng, tag(g));
}

// Four gathers per rank captured once in one graph (W branches), replayed 64
// times with new shards: each replay must deliver its own rows.
void testGraph(const SimOptions& o) {
    constexpr std::uint64_t kSizes[4] = {4096, 65536 + 16, 16, 1024};
    constexpr int kReplays = 64;
    SimGroup g(o);
    const std::uint32_t W = o.world;
    std::vector<std::unique_ptr<Buffers>> bufs;
    for (std::uint64_t s : kSizes) bufs.push_back(std::make_unique<Buffers>(W, s, W * s));

    cudaStream_t s0 = g.stream(0);
    std::vector<cudaEvent_t> ev(W);
    for (auto& e : ev) TPF_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    cudaGraph_t graph;
    TPF_CUDA_CHECK(cudaStreamBeginCapture(s0, cudaStreamCaptureModeThreadLocal));
    TPF_CUDA_CHECK(cudaEventRecord(ev[0], s0));
    for (std::uint32_t r = 1; r < W; ++r) TPF_CUDA_CHECK(cudaStreamWaitEvent(g.stream(r), ev[0], 0));
    for (std::uint32_t r = 0; r < W; ++r)
        for (int c = 0; c < 4; ++c)
            TPF_CUDA_CHECK(kernels::launchAllGather(g.view(r), bufs[c]->send[r]->p, bufs[c]->recv[r]->p, kSizes[c],
                                                    g.stream(r)));
    for (std::uint32_t r = 1; r < W; ++r) {
        TPF_CUDA_CHECK(cudaEventRecord(ev[r], g.stream(r)));
        TPF_CUDA_CHECK(cudaStreamWaitEvent(s0, ev[r], 0));
    }
    TPF_CUDA_CHECK(cudaStreamEndCapture(s0, &graph));
    cudaGraphExec_t exec;
    TPF_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

    std::mt19937_64 rng(3000 + W);
    int good = 0;
    for (int rep = 0; rep < kReplays; ++rep) {
        std::vector<std::vector<std::vector<std::uint8_t>>> shards(4, std::vector<std::vector<std::uint8_t>>(W));
        for (int c = 0; c < 4; ++c)
            for (std::uint32_t r = 0; r < W; ++r) {
                shards[c][r] = randomBytes(rng, kSizes[c]);
                bufs[c]->send[r]->upload(shards[c][r]);
                bufs[c]->recv[r]->poison();
            }
        TPF_CUDA_CHECK(cudaGraphLaunch(exec, s0));
        TPF_CUDA_CHECK(cudaStreamSynchronize(s0));
        bool ok = true;
        for (int c = 0; c < 4; ++c)
            for (std::uint32_t r = 0; r < W; ++r) {
                const auto out = bufs[c]->recv[r]->download(W * kSizes[c]);
                for (std::uint32_t q = 0; q < W; ++q)
                    ok &= std::memcmp(out.data() + q * kSizes[c], shards[c][q].data(), kSizes[c]) == 0;
            }
        good += ok;
    }
    bool epochs = true, healthy = true;
    for (std::uint32_t r = 0; r < W; ++r) {
        epochs &= g.state(r).epoch == 4ull * kReplays;
        healthy &= g.failure(r).error == Errc::Ok;
    }
    check(good == kReplays, tag(g) + ": graph of 4 gathers, " + std::to_string(good) + "/" +
                                std::to_string(kReplays) + " replays delivered their own rows");
    check(epochs && healthy, tag(g) + ": device epoch is 4 x replays on every rank, no error recorded");
    TPF_CUDA_CHECK(cudaGraphExecDestroy(exec));
    TPF_CUDA_CHECK(cudaGraphDestroy(graph));
    for (auto& e : ev) cudaEventDestroy(e);
}

void testMixed() {
    SimOptions o;
    o.world = 4;
    o.wire = Wire::Mixed;
    o.stripes = 2;
    SimGroup g(o);
    Buffers b(o.world, o.slotBytes, o.world * o.slotBytes);
    std::mt19937_64 rng(4000);
    for (int rep = 0; rep < 3; ++rep) {
        gatherOnce(g, b, 4096, rng, tag(g));
        gatherOnce(g, b, 65536 + 16, rng, tag(g));
        sumOnce(g, b, Elem::BF16, 65536 + 16, rng, tag(g));
        sumOnce(g, b, Elem::F32, 4096, rng, tag(g));
    }
    check(g.proxyError().empty(), tag(g) + ": proxy saw valid doorbells only: " + g.proxyError());
    std::printf("== mixed W=4 done\n");
}

} // namespace tpf::gputest
