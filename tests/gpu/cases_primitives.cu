// Kernels the test composes itself from the device primitives
// (kernels/device/): put, publish, wait with a deadline, the gather and the
// rank-order sum, run over a SimGroup's real regions, rings and (proxy wire)
// simulated daemon. They fail when a primitive breaks its contract (a flag
// released before the shard, a wait that ends early or never, a sum out of
// rank order), independently of the library's own kernels.
#include <cstring>
#include <memory>

#include "kernels/device/flag.cuh"
#include "kernels/device/put.cuh"
#include "kernels/device/reduce.cuh"
#include "tests/gpu/cases.hpp"

namespace tpf::gputest {

namespace {

using namespace kernels::detail;

constexpr std::uint32_t kThreads = 256;

// One call of one block: the shard put into every destination (the own host
// slot when a proxy-route peer exists, every ipc peer's slot), published by
// warp 0 (ipc flags, doorbell), warp 0 waits for every peer's flags, then
// every thread writes its part of the result when the wait succeeded.
template <Op op>
__global__ void __launch_bounds__(kThreads) composedKernel(const kernels::DeviceGroupView v, const std::uint8_t* send,
                                                           std::uint8_t* recv, std::uint64_t n16, std::uint32_t ctag) {
    __shared__ std::uint8_t* dst[kMaxWorld];
    __shared__ const std::uint8_t* src[kMaxWorld];
    __shared__ std::uint32_t ndst;
    __shared__ std::uint64_t epoch;
    __shared__ Decision dec;
    const bool hasProxy = anyProxyCarries(v.wires, v.world);
    if (threadIdx.x == 0) {
        const std::uint64_t e = v.state->epoch + 1;
        const std::uint32_t p = phaseOf(e);
        epoch = e;
        ndst = 0;
        dec.wait = kWaitPending;
        dec.published = 0;
        if (hasProxy) dst[ndst++] = v.hostRegion + v.layout.slotOffset(p, v.rank);
        for (std::uint32_t i = 0; i + 1 < v.world; ++i) {
            const std::uint32_t q = peerAt(v.rank, i, v.world);
            if (v.wires[q] == kWireIpc) dst[ndst++] = v.peerRegions[q] + v.layout.slotOffset(p, v.rank);
        }
        for (std::uint32_t r = 0; r < v.world; ++r)
            src[r] = r == v.rank ? send : (isProxy(v.wires[r]) ? v.hostRegion : v.region) + v.layout.slotOffset(p, r);
        stRelaxedSys(&v.control->epoch, e);
    }
    __syncthreads();
    const std::uint64_t e = epoch;
    const std::uint32_t p = phaseOf(e);
    putRange(dst, ndst, send, Range{0, n16});
    __syncthreads(); // one block: publish's release is cumulative over the barrier
    if (threadIdx.x < kWarp) {
        publish(v, e, p, n16 * 16, hasProxy, ctag);
        waitPeers(v, e, p, 0, dec, false, ctag);
    }
    __syncthreads();
    if (dec.wait == 0) {
        if constexpr (op == Op::Gather) gatherRange<kThreads>(src, v.rank, recv, std::uint32_t(n16), Range{0, n16 * v.world});
        else sumRange<op, kThreads>(src, v.rank, v.world, recv, Range{0, n16});
    }
    if (threadIdx.x == 0) v.state->epoch = e;
}

template <Op op>
void launchComposed(const kernels::DeviceGroupView& v, const void* send, void* recv, std::uint64_t bytes,
                    cudaStream_t s) {
    composedKernel<op><<<1, kThreads, 0, s>>>(v, static_cast<const std::uint8_t*>(send), static_cast<std::uint8_t*>(recv),
                                               bytes / 16, 0x2545f491u);
    TPF_CUDA_CHECK(cudaGetLastError());
}

} // namespace

void preloadComposedKernels() {
    cudaFuncAttributes a;
    TPF_CUDA_CHECK(cudaFuncGetAttributes(&a, reinterpret_cast<const void*>(&composedKernel<Op::Gather>)));
    TPF_CUDA_CHECK(cudaFuncGetAttributes(&a, reinterpret_cast<const void*>(&composedKernel<Op::SumF32>)));
}

// A gather and an f32 sum composed from the primitives, three calls each
// (both phases, and a phase reused), checked against host references; then
// one rank alone: its wait ends at the deadline with Timeout naming the
// lowest missing peer, its output untouched.
void testComposed(const SimOptions& base) {
    SimOptions o = base;
    o.timeoutNs = 20'000'000;
    SimGroup g(o);
    const std::uint32_t W = o.world;
    const std::uint64_t bytes = 8192, count = bytes / 4;
    std::mt19937_64 rng(4711);
    std::vector<std::unique_ptr<DevBuf>> send, recv;
    for (std::uint32_t r = 0; r < W; ++r) {
        send.push_back(std::make_unique<DevBuf>(bytes));
        recv.push_back(std::make_unique<DevBuf>(W * bytes));
    }
    std::vector<std::uint32_t> order(W);
    for (std::uint32_t r = 0; r < W; ++r) order[r] = r;
    bool gathered = true, summed = true;
    for (int call = 0; call < 6; ++call) {
        const bool sum = call % 2 == 1;
        std::vector<std::vector<std::uint8_t>> rows(W);
        for (std::uint32_t r = 0; r < W; ++r) {
            if (sum) { // small integers as f32: any order of adds would be exact, so also check the order below
                rows[r].resize(bytes);
                for (std::uint64_t i = 0; i < count; ++i) {
                    const float f = float(std::int64_t(rng() % 2001) - 1000) * (r + 1) * 0.001f;
                    std::memcpy(rows[r].data() + 4 * i, &f, 4);
                }
            } else {
                rows[r] = randomBytes(rng, bytes);
            }
            send[r]->upload(rows[r]);
            recv[r]->poison();
        }
        for (std::uint32_t r = 0; r < W; ++r) {
            if (sum) launchComposed<Op::SumF32>(g.view(r), send[r]->p, recv[r]->p, bytes, g.stream(r));
            else launchComposed<Op::Gather>(g.view(r), send[r]->p, recv[r]->p, bytes, g.stream(r));
        }
        g.syncAll();
        if (sum) {
            const auto want = sumRows(Elem::F32, rows, count, order);
            for (std::uint32_t r = 0; r < W; ++r) summed &= recv[r]->download(bytes) == want;
        } else {
            std::vector<std::uint8_t> want;
            for (const auto& row : rows) want.insert(want.end(), row.begin(), row.end());
            for (std::uint32_t r = 0; r < W; ++r) gathered &= recv[r]->download(W * bytes) == want;
        }
    }
    bool healthy = true;
    for (std::uint32_t r = 0; r < W; ++r) healthy &= g.failure(r).error == Errc::Ok && g.state(r).epoch == 6;
    check(gathered, tag(g) + ": composed from the primitives: put, publish, wait, gather in rank order");
    check(summed, tag(g) + ": composed from the primitives: the f32 sum bit for bit in rank order 0..W-1");
    check(healthy, tag(g) + ": composed calls: no failure recorded, epoch advanced once a call");

    // Rank 0 alone: the wait's deadline ends it, Timeout naming rank 1, nothing written.
    recv[0]->poison();
    launchComposed<Op::Gather>(g.view(0), send[0]->p, recv[0]->p, bytes, g.stream(0));
    g.syncAll();
    const auto f = g.failure(0);
    check(f.error == Errc::Timeout && f.missingPeer == 1 && f.epoch == 7 && allPoison(recv[0]->download(W * bytes)),
          tag(g) + ": composed wait alone: Timeout at its deadline naming rank 1, output untouched");
}

} // namespace tpf::gputest
