// Fault cases (a rank that never posts, abort, a daemon-reported error) and
// 2,000 calls in a row verified on the device.
#include <chrono>
#include <cstdio>
#include <thread>

#include "tests/gpu/cases.hpp"
#include "tests/gpu/check_kernels.hpp"

namespace tpf::gputest {

namespace {

double secondsSince(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The rank that never posts: not 0, and not always the last.
std::uint32_t silentRank(std::uint32_t W) { return W > 2 ? 2 : 1; }

struct RankBufs {
    std::vector<std::unique_ptr<DevBuf>> send, recv;
    RankBufs(std::uint32_t W, std::uint64_t bytes) {
        std::mt19937_64 rng(77);
        for (std::uint32_t r = 0; r < W; ++r) {
            send.push_back(std::make_unique<DevBuf>(bytes));
            recv.push_back(std::make_unique<DevBuf>(W * bytes));
            send.back()->upload(randomBytes(rng, bytes));
            recv.back()->poison();
        }
    }
};

} // namespace

// Every rank but m calls: each records Timeout naming m and leaves its output
// untouched; the error is sticky, so a second call fails at once, also untouched.
void testTimeout(const SimOptions& base) {
    SimOptions o = base;
    o.timeoutNs = 20'000'000;
    SimGroup g(o);
    const std::uint32_t W = o.world, m = silentRank(W);
    const std::uint64_t bytes = 65536 + 16; // several blocks: block 0 decides for all
    RankBufs b(W, bytes);
    auto t0 = std::chrono::steady_clock::now();
    for (std::uint32_t r = 0; r < W; ++r)
        if (r != m) TPF_CUDA_CHECK(kernels::launchAllGather(g.view(r), b.send[r]->p, b.recv[r]->p, bytes, g.stream(r)));
    g.syncAll();
    const double first = secondsSince(t0);
    bool named = true, untouched = true;
    for (std::uint32_t r = 0; r < W; ++r) {
        if (r == m) continue;
        const auto f = g.failure(r);
        named &= f.error == Errc::Timeout && f.missingPeer == m && f.epoch == 1;
        untouched &= allPoison(b.recv[r]->download(W * bytes));
    }
    check(named, tag(g) + ": rank " + std::to_string(m) + " never posts: Timeout naming it on every other rank");
    check(untouched, tag(g) + ": after Timeout the outputs are untouched");
    check(first >= 0.015 && first < 2.0, tag(g) + ": Timeout after about the 20 ms bound (" + std::to_string(first) + " s)");

    t0 = std::chrono::steady_clock::now();
    for (std::uint32_t r = 0; r < W; ++r) {
        if (r == m) continue;
        b.recv[r]->poison();
        TPF_CUDA_CHECK(kernels::launchAllReduceSum(g.view(r), b.send[r]->p, b.recv[r]->p, 2048, kernels::DType::BF16,
                                                   g.stream(r)));
    }
    g.syncAll();
    const double second = secondsSince(t0);
    bool sticky = true;
    for (std::uint32_t r = 0; r < W; ++r) {
        if (r == m) continue;
        const auto f = g.failure(r);
        sticky &= f.error == Errc::Timeout && f.missingPeer == m && g.state(r).epoch == 2 && g.state(r).failures == 2;
        sticky &= allPoison(b.recv[r]->download(4096));
    }
    check(sticky && second < 0.015, tag(g) + ": the recorded error is sticky: the next call fails at once (" +
                                        std::to_string(second) + " s), output untouched");
}

// The daemon ends the waits: abort (-> Aborted) or a recorded error (PeerLost
// with its missing peer, kept as the daemon wrote it), long before the 10 s bound.
void testDaemonStop(const SimOptions& base, bool abort) {
    SimOptions o = base;
    o.timeoutNs = 10'000'000'000ull;
    SimGroup g(o);
    const std::uint32_t W = o.world, m = silentRank(W);
    const std::uint64_t bytes = 4096;
    RankBufs b(W, bytes);
    const auto t0 = std::chrono::steady_clock::now();
    for (std::uint32_t r = 0; r < W; ++r)
        if (r != m) TPF_CUDA_CHECK(kernels::launchAllGather(g.view(r), b.send[r]->p, b.recv[r]->p, bytes, g.stream(r)));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (std::uint32_t r = 0; r < W; ++r) {
        if (r == m) continue;
        if (abort) g.daemonWrite(r, 0, kNoPeer, 1);
        else g.daemonWrite(r, std::uint32_t(Errc::PeerLost), m, 0);
    }
    g.syncAll();
    const double s = secondsSince(t0);
    bool ok = true, untouched = true;
    for (std::uint32_t r = 0; r < W; ++r) {
        if (r == m) continue;
        const auto f = g.failure(r);
        ok &= abort ? f.error == Errc::Aborted && f.missingPeer == kNoPeer
                    : f.error == Errc::PeerLost && f.missingPeer == m;
        untouched &= allPoison(b.recv[r]->download(W * bytes));
    }
    const std::string what = abort ? "abort flag" : "daemon-recorded PeerLost";
    check(ok, tag(g) + ": " + what + " ends every wait with " + (abort ? "Aborted" : "PeerLost"));
    check(untouched, tag(g) + ": after " + what + " the outputs are untouched");
    check(s < 2.0, tag(g) + ": " + what + " ends the waits early (" + std::to_string(s) + " s of a 10 s bound)");
}

namespace {

// One call of a mismatch case: the gather or a sum of one dtype, `bytes` a
// rank, forced onto the flag path or left to the launcher (the LL path here).
struct Call {
    int kind; // 0 gather, 1 f32 sum, 2 f16 sum, 3 bf16 sum
    std::uint64_t bytes;
    bool flagPath;
    const char* name;
};

void launchCall(const kernels::DeviceGroupView& v, const DevBuf& send, const DevBuf& recv, const Call& c,
                cudaStream_t stream) {
    const kernels::CallTag t{c.kind == 0 ? kStatsAllGather : kStatsAllReduceSum, 1, c.bytes, c.flagPath ? 1u : 0u};
    if (c.kind == 0) {
        TPF_CUDA_CHECK(kernels::launchAllGather(v, send.p, recv.p, c.bytes, stream, &t));
        return;
    }
    const kernels::DType d = c.kind == 1 ? kernels::DType::F32 : c.kind == 2 ? kernels::DType::F16 : kernels::DType::BF16;
    TPF_CUDA_CHECK(kernels::launchAllReduceSum(v, send.p, recv.p, c.bytes / dtypeSize(d), d, stream, &t));
}

} // namespace

// Rank 0 calls `odd`, every other rank `usual`, on a fresh group: every rank
// fails the call with GroupMismatch naming a rank that disagrees with it (rank
// 0: rank 1; the others: rank 0), long before the 10 s bound, every output
// untouched. `timeout`: the two calls take different paths (LL and flag),
// where neither sees the other's tag: every rank fails (Timeout), untouched.
void testCallMismatch(const SimOptions& base, const Call& odd, const Call& usual, bool timeout) {
    SimOptions o = base;
    o.timeoutNs = timeout ? 50'000'000ull : 10'000'000'000ull;
    SimGroup g(o);
    if (timeout && g.view(0).ll.world == 0) return; // no LL path (TPF_GPU_LL_OFF): both calls take the flag path
    const std::uint32_t W = o.world;
    const std::uint64_t most = std::max(odd.bytes, usual.bytes);
    RankBufs b(W, most);
    const auto t0 = std::chrono::steady_clock::now();
    for (std::uint32_t r = 0; r < W; ++r) launchCall(g.view(r), *b.send[r], *b.recv[r], r == 0 ? odd : usual, g.stream(r));
    g.syncAll();
    const double s = secondsSince(t0);
    bool named = true, untouched = true;
    std::string seen;
    for (std::uint32_t r = 0; r < W; ++r) {
        const auto f = g.failure(r);
        seen += " " + std::string(errcName(f.error)) + "/" + std::to_string(f.missingPeer);
        named &= timeout ? f.error != Errc::Ok : f.error == Errc::GroupMismatch && f.missingPeer == (r == 0 ? 1u : 0u);
        named &= f.epoch == 1;
        untouched &= allPoison(b.recv[r]->download(W * most));
    }
    const std::string what = tag(g) + ": rank 0 " + odd.name + ", the others " + usual.name;
    check(named, what + (timeout ? ": every rank fails the call" : ": GroupMismatch naming the other side on every rank") +
                     " (error/rank:" + seen + ")");
    check(untouched, what + ": every output untouched");
    check(timeout || s < 2.0, what + ": decided at once (" + std::to_string(s) + " s of a 10 s bound)");
}

void testCallMismatches(const SimOptions& o) {
    const std::uint64_t big = std::min<std::uint64_t>(kernels::llMaxBytes(o.world), o.slotBytes);
    const Call g4{0, 4096, false, "gathers 4 KiB"}, g8{0, 8192, false, "gathers 8 KiB"};
    const Call gBig{0, big, false, "gathers the LL path's largest"}, gHalf{0, big / 2, false, "gathers half of it"};
    const Call f16{2, 4096, false, "sums 4 KiB of f16"}, bf16{3, 4096, false, "sums 4 KiB of bf16"};
    const Call f32{1, 4096, false, "sums 4 KiB of f32"};
    const Call p4{0, 4096, true, "gathers 4 KiB on the flag path"}, p8{0, 8192, true, "gathers 8 KiB on the flag path"};
    testCallMismatch(o, g4, g8, false);     // the smaller rank finds a data line at its tag line
    testCallMismatch(o, gBig, gHalf, false); // the larger rank finds filler; several blocks at W > 2
    testCallMismatch(o, f16, bf16, false);  // same bytes, another dtype
    testCallMismatch(o, g4, f32, false);    // same bytes, another op
    testCallMismatch(o, p8, p4, false);     // the flag path's tag word
    testCallMismatch(o, p4, g4, true);      // one path each: Timeout, nothing written
}

// `calls` calls per rank back to back, gathers and f32 sums alternating over
// sizes that change the grid from call to call; a fill kernel before and a
// verify kernel after each call, all on the rank's stream, no host sync.
void testBackToBack(const SimOptions& o, std::uint32_t calls) {
    constexpr std::uint64_t kSizes[4] = {16, 4096, 65536 + 16, 128 * 1024};
    SimGroup g(o);
    const std::uint32_t W = o.world;
    RankBufs b(W, kSizes[3]);
    DevBuf counters(8 * W);
    TPF_CUDA_CHECK(cudaMemset(counters.p, 0, counters.bytes));
    TPF_CUDA_CHECK(cudaDeviceSynchronize());
    auto* bad = static_cast<unsigned*>(counters.p);
    const auto t0 = std::chrono::steady_clock::now();
    for (std::uint32_t i = 0; i < calls; ++i) {
        const bool sum = i % 2 == 1;
        const std::uint64_t bytes = kSizes[(i / 2) % 4], words = bytes / 4;
        for (std::uint32_t r = W; r-- > 0;) {
            auto* send = static_cast<std::uint32_t*>(b.send[r]->p);
            auto* recv = static_cast<std::uint32_t*>(b.recv[r]->p);
            launchFill(send, words, r, i, sum, g.stream(r));
            if (sum) TPF_CUDA_CHECK(kernels::launchAllReduceSum(g.view(r), send, recv, words, kernels::DType::F32, g.stream(r)));
            else TPF_CUDA_CHECK(kernels::launchAllGather(g.view(r), send, recv, bytes, g.stream(r)));
            launchVerify(recv, words, W, i, sum, bad + 2 * r, bad + 2 * r + 1, g.stream(r));
        }
    }
    TPF_CUDA_CHECK(cudaGetLastError());
    g.syncAll();
    const double s = secondsSince(t0);
    std::vector<unsigned> c(2 * W);
    TPF_CUDA_CHECK(cudaMemcpy(c.data(), bad, 8 * W, cudaMemcpyDeviceToHost));
    bool ok = true;
    std::string detail;
    for (std::uint32_t r = 0; r < W; ++r) {
        const auto f = g.failure(r);
        const auto st = g.state(r);
        if (c[2 * r] != 0 || f.error != Errc::Ok || st.epoch != calls) {
            ok = false;
            detail += " rank " + std::to_string(r) + ": " + std::to_string(c[2 * r]) + " bad words (first bad call " +
                      std::to_string(int(c[2 * r + 1]) - 1) + "), " + std::string(errcName(f.error)) + ", epoch " +
                      std::to_string(st.epoch) + ";";
        }
    }
    check(ok, tag(g) + ": " + std::to_string(calls) + " back-to-back calls, each verified on the device" + detail);
    check(g.proxyError().empty(), tag(g) + ": proxy saw valid doorbells only: " + g.proxyError());
    std::printf("   %s: %u calls (with fill + verify kernels) in %.3f s, %.1f us a call\n", tag(g).c_str(), calls, s,
                s * 1e6 / calls);
}

} // namespace tpf::gputest
