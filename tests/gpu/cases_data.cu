// Data cases: gathers byte-exact, sums bit-exact against the rank-order
// reference, a captured graph replayed with new shards, a mixed group, the
// LL path across the 32-bit wrap of its flags.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <thread>

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
    std::string first; // the first wrong 16 bytes, or the first failure
    for (std::uint32_t r = 0; r < W; ++r) {
        const auto out = b.recv[r]->download(W * bytes);
        for (std::uint32_t q = 0; q < W; ++q) {
            std::uint64_t wrong = 0, at = 0;
            for (std::uint64_t i = 0; i < bytes; i += 16)
                if (std::memcmp(out.data() + q * bytes + i, shards[q].data() + i, std::min<std::uint64_t>(16, bytes - i)) != 0)
                    at = wrong++ ? at : i;
            if (wrong == 0) continue;
            ok = false;
            if (!first.empty()) continue;
            char words[160];
            std::uint32_t got[4] = {}, want[4] = {};
            std::memcpy(got, out.data() + q * bytes + at, std::min<std::uint64_t>(16, bytes - at));
            std::memcpy(want, shards[q].data() + at, std::min<std::uint64_t>(16, bytes - at));
            std::snprintf(words, sizeof words, " (%08x %08x %08x %08x, not %08x %08x %08x %08x)", got[0], got[1], got[2],
                          got[3], want[0], want[1], want[2], want[3]);
            first = "; rank " + std::to_string(r) + " row " + std::to_string(q) + ": " + std::to_string(wrong) + " of " +
                    std::to_string((bytes + 15) / 16) + " chunks wrong, the first " + std::to_string(at / 16) + words;
        }
        if (const auto f = g.failure(r); f.error != Errc::Ok) {
            ok = false;
            if (first.empty()) first = "; rank " + std::to_string(r) + " failed " + std::string(errcName(f.error));
        }
    }
    check(ok, what + ": gather of " + std::to_string(bytes) + " B, every row of every rank" + first);
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

// The LL flag is 32 bits of the epoch (ll_kernel.cuh): lines a call left
// 2^32 epochs back would pass for fresh ones. W = 2 ipc, a 16 KiB slot: lines
// of rank 0's slot for rank 1 planted with garbage and the flag of epoch E
// (as a large call of E - 2^32 would have left them), then 2 x lines + 4
// calls of 16 B (the epoch crossing 2^32 on the way), then a gather at E
// whose lines cover the planted ones: its rows must be the new shards, not
// the garbage. Without the scrub (TPF_LL_SCRUB=0) rank 0 takes the garbage.
void testLlEpochWrap() {
    SimOptions o;
    o.world = 2;
    o.wire = Wire::Ipc;
    o.slotBytes = 16384;
    SimGroup g(o);
    const kernels::DeviceGroupView& v = g.view(0);
    if (v.ll.world == 0) return check(false, "LL epoch wrap: the group has no LL area");
    const std::uint64_t lines = v.ll.slotBytes / 16, small = 2 * lines + 4;
    const std::uint64_t E = (1ull << 32) + 7, start = E - small; // every small call's epoch, then E
    const std::uint64_t big =
        std::min({(v.ll.slotBytes - 16) / 2, kernels::llMaxBytes(2), o.slotBytes}) & ~std::uint64_t(15); // + the tag line
    g.setEpoch(start);
    g.plantLlLines(0, phaseOf(E), 1, 2, lines, std::uint32_t(E));
    Buffers b(2, big, 2 * big);
    std::mt19937_64 rng(4242);
    bool ok = true;
    for (std::uint64_t i = 0; i < small && ok; ++i) {
        for (std::uint32_t r = 2; r-- > 0;)
            TPF_CUDA_CHECK(kernels::launchAllGather(g.view(r), b.send[r]->p, b.recv[r]->p, 16, g.stream(r)));
        if (i % 1024 == 1023) {
            g.syncAll();
            ok = g.failure(0).error == Errc::Ok && g.failure(1).error == Errc::Ok;
        }
    }
    g.syncAll();
    check(ok && g.state(0).epoch == E - 1 && g.state(1).epoch == E - 1,
          "LL epoch wrap: " + std::to_string(small) + " calls of 16 B across epoch 2^32 (the scrub's round)");
    // Rank 0 first, rank 1 a millisecond later: rank 0 polls its slot before
    // rank 1 wrote anything there, so planted lines it took would stay taken.
    std::vector<std::vector<std::uint8_t>> shards(2);
    for (std::uint32_t r = 0; r < 2; ++r) {
        shards[r] = randomBytes(rng, big);
        b.send[r]->upload(shards[r]);
        b.recv[r]->poison();
    }
    TPF_CUDA_CHECK(kernels::launchAllGather(g.view(0), b.send[0]->p, b.recv[0]->p, big, g.stream(0)));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    TPF_CUDA_CHECK(kernels::launchAllGather(g.view(1), b.send[1]->p, b.recv[1]->p, big, g.stream(1)));
    g.syncAll();
    for (std::uint32_t r = 0; r < 2; ++r) {
        const auto out = b.recv[r]->download(2 * big);
        const bool rows = std::memcmp(out.data(), shards[0].data(), big) == 0 &&
                          std::memcmp(out.data() + big, shards[1].data(), big) == 0;
        check(rows && g.failure(r).error == Errc::Ok,
              "LL epoch wrap: rank " + std::to_string(r) + "'s gather of " + std::to_string(big) +
                  " B at epoch 2^32 + 7, over lines left with its 32-bit flag, has the new rows");
    }
}

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
