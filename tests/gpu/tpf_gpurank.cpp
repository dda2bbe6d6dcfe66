// One rank of the multi-process GPU tests (tests/gpu/run.sh): opens a Device
// group on the real daemon and checks one scenario on device buffers. Each
// rank judges its own outcome and prints one line
//   RESULT rank=R scenario=S ok ...      (exit 0)
//   RESULT rank=R scenario=S FAIL ...    (exit 1)
//   RESULT rank=R scenario=S SKIP ...    (exit 77: no GPU, or an nccl* scenario built without NCCL)
// Scenarios:
//   data       gathers of every size class byte-exact, f32/f16/bf16 sums bit-exact,
//              Misaligned and CapMismatch refused without breaking the group
//   odd        gathers of 1, 15, 100, 4097 and cap-1 bytes and sums of odd counts (staged), exact,
//              nothing written past the output; the same captured in a graph, replayed 64 times
//   gatherv    allGatherV with uneven counts (zeros, up to the cap), eager and in a graph; then
//              mismatched counts: GroupMismatch on every rank, nothing written
//   mixed      TPF_TEST_NODES=0,0,1,1 (a node per rank): ipc to same-node peers, the proxy to the
//              others, in one call; the data, odd and gatherv checks on that group
//   daemonkill proxy route, calls until one fails; run.sh SIGKILLs the daemon after READY and starts
//              none: the call waits for a restarted daemon until its timeout, then DaemonLost
//              within the timeout + 1 s
//   restart    the graphkill graph replayed 1,000 times, one every 2 ms; READY after replay 5, then
//              run.sh SIGKILLs tpfabricd and starts it again on the same socket: the group is
//              re-adopted (no reopen, no recapture); after each replay's host sync point the health
//              word says healthy and every output is exact, the replays during the gap included
//   idle       100 gathers, READY, 4 s without calls (run.sh checks status and the daemon's CPU), 100 more
//   graph      4 gathers captured once, replayed 64 times with new shards
//   livecount  a graph of 3 gathers and 2 f32 sums replayed 200 times, the stream synchronised, no
//              check(): the ring's counts (what the daemon's status reads) reach 1,000 calls and
//              their bytes within 1 s; prints READY with them, holds the group 3 s (run.sh reads
//              tpfabricctl status --json meanwhile), then check() and the counts unchanged
//   b2b        2,000 calls back to back (gather / f32 sum), verified on the device
//   kill       the last rank exits without closing at call 3: the others get PeerLost naming it
//   graphkill / graphleave / graphstall
//              a graph of a flag-path gather, a staged (odd-size) gather and an f32 sum, replayed
//              up to 64 times; at replay 20 the last rank exits without closing (PeerLost), closes
//              in order (PeerLost once a replay passes its last epoch) or stops replaying (Timeout).
//              After each replay's host sync point (the output copied to the host, as an engine's
//              sampled tokens) the others read the health word before anything else: healthy
//              with exact output until then; the failed replay flagged (the code and the rank as
//              check() then reports them) with its outputs unwritten; never a replay whose
//              output is wrong or unwritten while the word says healthy
//   graphnodekill
//              two daemons as two nodes (--nodes): the graphkill graph replayed until a replay fails;
//              READY after replay 5, then run.sh SIGKILLs node 1's daemon for good: node 0's ranks see
//              PeerLost (their daemon waits peer.restart_wait_ms for node 1's), node 1's DaemonLost (their
//              kernels wait for a restarted daemon until their timeout), in the health word at the failed
//              replay's sync point, within the timeout + 1 s; of its three calls those before the fault
//              exact, the failing one and the rest unwritten
//   stall      the last rank never posts call 3: the others get Timeout naming it
//   mismatch   ipc route: the last rank gathers 8 KiB, the others 4 KiB: GroupMismatch on every rank
//              naming the other side, within 1 s, nothing written; the next call fails with it too
//   chaos      --calls calls back to back (gather / f32 sum, 4 KiB and 64 KiB, each checked; a failed
//              call must leave its 0xa5 output untouched) or until one fails; READY after 5
//              calls; SIGUSR1 makes the rank abort the group. Prints outcome=none|ERRC, the failed call's
//              ms and detail; tests/gpu/chaos.sh injects the event and judges the outcomes
//   probefail  TPF_PROBE_SABOTAGE on the last rank: open fails on every rank (TPF_FALLBACK=error)
//   nccl1      world 1 over an NcclBootstrap: above-cap calls go to NCCL
// --nodes 0,0,1,1 (any scenario): the ranks' daemons are distinct nodes (tests/gpu/crossnode.sh); at open
// every rank checks its routes: self, ipc (shm with --route proxy) to its own node's ranks, tcp to the others.
// Over an NcclBootstrap of W processes, one per GPU (run.sh on a machine of
// several GPUs; --max-bytes sets the group's cap):
//   nccl-fabric    the fabric path; calls above the cap go by NCCL; results exact and identical on every rank
//   nccl-fallback  the fabric path is expected to be unavailable (daemon stopped, refusing, or the probe
//                  sabotaged): every rank opens in NCCL mode; the same checks
//   nccl-error     as nccl-fallback with TPF_FALLBACK=error: open fails with Unavailable on every rank
//   nccl-refuse    holds the daemon's only group (daemon.max_groups = 1) over the TCP bootstrap, then
//                  opens over NCCL: the daemon refuses, every rank falls back to NCCL
//   nccl-late      the last rank never calls open: the others' open ends Timeout within openTimeout (2 s)
//                  + 1 s (the NcclBootstrap's all-gather is bounded by the open's deadline)
//   nccl-disabled  the last rank sets TPF_DISABLE=1: every rank opens in NCCL mode without the daemon
//                  (run.sh checks the daemon's debug log saw no connection); the same checks
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/testing.hpp"
#include "client/reduce.hpp"
#include "tests/gpu/rank_kernels.hpp"
#include "tests/integration/pattern.hpp"
#include "tpf_config.h"
#include <tpfabric/tpfabric.hpp>
#if TPF_HAVE_NCCL
#include <tpfabric/nccl.hpp>
#endif

using namespace tpf;
using namespace tpf::testing;

namespace {

struct Args {
    std::string socket, bootstrap, scenario = "data", route = "auto";
    std::uint32_t rank = 0, world = 2, timeoutMs = 5000;
    std::uint64_t calls = 20000; ///< chaos: calls when nothing fails (a count, so that every rank stops at the same call)
    std::uint64_t maxBytes = 512 * 1024;
    int device = -1; ///< -1: rank % visible devices
    std::vector<std::uint32_t> nodes; ///< --nodes: the node (daemon) of each rank, as run.sh started them
};

Args a;

int report(bool ok, const std::string& what) {
    std::printf("RESULT rank=%u scenario=%s %s %s\n", a.rank, a.scenario.c_str(), ok ? "ok" : "FAIL", what.c_str());
    std::fflush(stdout);
    return ok ? 0 : 1;
}
/// A scenario this build or machine cannot run: Meson's skip code, never a pass.
int skip(const std::string& why) {
    std::printf("RESULT rank=%u scenario=%s SKIP %s\n", a.rank, a.scenario.c_str(), why.c_str());
    std::fflush(stdout);
    return 77;
}

#define CK(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) return report(false, std::string(#call) + ": " + cudaGetErrorName(e_));              \
    } while (0)
#define ST(call)                                                                                                       \
    do {                                                                                                               \
        Status s_ = (call);                                                                                            \
        if (!s_) return report(false, std::string(#call) + ": " + s_.error().describe());                            \
    } while (0)

constexpr std::uint64_t kMaxBytes = 512 * 1024;

struct Buffers2 {
    std::uint8_t* send = nullptr;
    std::uint8_t* recv = nullptr;
};

int scenarioData(Group& g, cudaStream_t st, Buffers2 b) {
    const std::uint32_t W = g.world();
    std::vector<std::uint8_t> h(kMaxBytes), out(kMaxBytes * W), want(kMaxBytes);
    std::uint64_t it = 0;
    for (std::uint64_t size : {16ull, 1024ull, 4096ull, 65536ull + 16, 512ull * 1024})
        for (int rep = 0; rep < 3; ++rep, ++it) {
            fillBytes(h.data(), size, it, g.rank());
            CK(cudaMemcpyAsync(b.send, h.data(), size, cudaMemcpyHostToDevice, st));
            CK(cudaMemsetAsync(b.recv, 0xa5, size * W, st));
            ST(g.allGather(b.send, b.recv, size, st));
            CK(cudaMemcpyAsync(out.data(), b.recv, size * W, cudaMemcpyDeviceToHost, st));
            CK(cudaStreamSynchronize(st));
            ST(g.check());
            for (std::uint32_t q = 0; q < W; ++q) {
                fillBytes(want.data(), size, it, q);
                if (std::memcmp(out.data() + q * size, want.data(), size) != 0)
                    return report(false, "gather size " + std::to_string(size) + " row " + std::to_string(q) + " differs");
            }
        }
    int sums = 0;
    for (DType t : {DType::F32, DType::F16, DType::BF16})
        for (std::uint64_t size : {16ull, 1024ull, 65536ull + 16, 512ull * 1024}) {
            const std::size_t count = size / dtypeSize(t);
            fillValues(h.data(), count, t, ++it, g.rank());
            CK(cudaMemcpyAsync(b.send, h.data(), size, cudaMemcpyHostToDevice, st));
            CK(cudaMemsetAsync(b.recv, 0xa5, size, st));
            ST(g.allReduceSum(b.send, b.recv, count, t, st));
            CK(cudaMemcpyAsync(out.data(), b.recv, size, cudaMemcpyDeviceToHost, st));
            CK(cudaStreamSynchronize(st));
            ST(g.check());
            const auto ref = referenceSum(count, t, it, W);
            if (std::memcmp(out.data(), ref.data(), size) != 0)
                return report(false, "sum dtype " + std::to_string(int(t)) + " size " + std::to_string(size) + " differs");
            ++sums;
        }
    // The kernels counted every call into the ring the daemon reads (status,
    // metrics) as they ran.
    ST(g.check());
    const RankStats& rs = tpf::testing::ringStats(g);
    const std::uint64_t gatherBytes = 3 * (16 + 1024 + 4096 + 65536 + 16 + 512 * 1024);
    if (rs.ops[kStatsAllGather].calls != 15 || rs.ops[kStatsAllGather].bytes != gatherBytes ||
        rs.ops[kStatsAllReduceSum].calls != std::uint64_t(sums) || rs.ops[kStatsAllGather].errors != 0)
        return report(false, "ring stats: gathers " + std::to_string(rs.ops[kStatsAllGather].calls) + " (" +
                                 std::to_string(rs.ops[kStatsAllGather].bytes) + " bytes), sums " +
                                 std::to_string(rs.ops[kStatsAllReduceSum].calls) + ", wanted 15 (" +
                                 std::to_string(gatherBytes) + "), " + std::to_string(sums));
    // Refusals: nothing launched, the group stays healthy.
    Status m1 = g.allGather(b.send + 4, b.recv, 64, st);
    Status m2 = g.allReduceSum(b.send, b.recv + 8, 3, DType::F32, st);
    Status c1 = g.allGather(b.send, b.recv, g.agreedCap() + 16, st);
    if (m1.code() != Errc::Misaligned || m2.code() != Errc::Misaligned)
        return report(false, "misaligned calls gave " + std::string(errcName(m1.code())) + "/" + std::string(errcName(m2.code())));
    if (c1.code() != Errc::CapMismatch) return report(false, "above-cap call gave " + std::string(errcName(c1.code())));
    ST(g.check());
    return report(true, "gathers=15 sums=" + std::to_string(sums) + " counted misaligned=Misaligned abovecap=CapMismatch route1=" +
                            g.route((g.rank() + 1) % W));
}

// Sizes the kernels do not move in whole 16-byte vectors run staged: every
// byte and bit must still be right, and nothing may be written past the
// output (the 0xa5 fill behind it is checked).
int scenarioOdd(Group& g, cudaStream_t st, Buffers2 b) {
    const std::uint32_t W = g.world();
    const std::uint64_t cap = g.agreedCap();
    std::vector<std::uint8_t> h(kMaxBytes), out(kMaxBytes * W + 64), want(kMaxBytes);
    std::uint64_t it = 7000;
    int gathers = 0, sums = 0;
    for (std::uint64_t size : std::initializer_list<std::uint64_t>{1, 15, 100, 4097, cap - 1})
        for (int rep = 0; rep < 2; ++rep, ++it, ++gathers) {
            fillBytes(h.data(), size, it, g.rank());
            CK(cudaMemcpyAsync(b.send, h.data(), size, cudaMemcpyHostToDevice, st));
            CK(cudaMemsetAsync(b.recv, 0xa5, size * W + 64, st));
            ST(g.allGather(b.send, b.recv, size, st));
            CK(cudaMemcpyAsync(out.data(), b.recv, size * W + 64, cudaMemcpyDeviceToHost, st));
            CK(cudaStreamSynchronize(st));
            ST(g.check());
            for (std::uint32_t q = 0; q < W; ++q) {
                fillBytes(want.data(), size, it, q);
                if (std::memcmp(out.data() + q * size, want.data(), size) != 0)
                    return report(false, "odd gather size " + std::to_string(size) + " row " + std::to_string(q) + " differs");
            }
            for (std::uint64_t i = size * W; i < size * W + 64; ++i)
                if (out[i] != 0xa5) return report(false, "odd gather size " + std::to_string(size) + " wrote past its output");
        }
    for (DType t : {DType::F32, DType::F16, DType::BF16})
        for (std::size_t count : std::initializer_list<std::size_t>{1, 7, 1000, 1001, cap / dtypeSize(t) - 1}) {
            const std::size_t size = count * dtypeSize(t);
            if (size % 16 == 0) continue; // the plain path; the data scenario has it
            fillValues(h.data(), count, t, ++it, g.rank());
            CK(cudaMemcpyAsync(b.send, h.data(), size, cudaMemcpyHostToDevice, st));
            CK(cudaMemsetAsync(b.recv, 0xa5, size + 64, st));
            ST(g.allReduceSum(b.send, b.recv, count, t, st));
            CK(cudaMemcpyAsync(out.data(), b.recv, size + 64, cudaMemcpyDeviceToHost, st));
            CK(cudaStreamSynchronize(st));
            ST(g.check());
            const auto ref = referenceSum(count, t, it, W);
            if (std::memcmp(out.data(), ref.data(), size) != 0)
                return report(false, "odd sum dtype " + std::to_string(int(t)) + " count " + std::to_string(count) + " differs");
            for (std::size_t i = size; i < size + 64; ++i)
                if (out[i] != 0xa5) return report(false, "odd sum count " + std::to_string(count) + " wrote past its output");
            ++sums;
        }
    // The same staged calls captured once and replayed with new inputs.
    const std::uint64_t sizes[3] = {100, 4097, 15};
    std::uint64_t off[3], total = 0;
    for (int j = 0; j < 3; ++j) off[j] = roundUp(total, 16), total = off[j] + sizes[j];
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int j = 0; j < 3; ++j) ST(g.allGather(b.send + off[j], b.recv + off[j] * W, sizes[j], st));
    ST(g.allReduceSum(b.send + roundUp(total, 16), b.recv + roundUp(total, 16) * W, 1001, DType::BF16, st));
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    const std::uint64_t sumOff = roundUp(total, 16);
    std::vector<std::uint8_t> hin(sumOff + 2002), all((sumOff + 2002) * W);
    for (int rep = 0; rep < 64; ++rep) {
        for (int j = 0; j < 3; ++j) fillBytes(hin.data() + off[j], sizes[j], 9000 + rep * 4 + j, g.rank());
        fillValues(hin.data() + sumOff, 1001, DType::BF16, 9000 + rep * 4 + 3, g.rank());
        CK(cudaMemcpyAsync(b.send, hin.data(), hin.size(), cudaMemcpyHostToDevice, st));
        CK(cudaMemsetAsync(b.recv, 0x5a, all.size(), st));
        CK(cudaGraphLaunch(exec, st));
        CK(cudaMemcpyAsync(all.data(), b.recv, all.size(), cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        ST(g.check());
        for (int j = 0; j < 3; ++j)
            for (std::uint32_t q = 0; q < W; ++q) {
                fillBytes(want.data(), sizes[j], 9000 + rep * 4 + j, q);
                if (std::memcmp(all.data() + off[j] * W + q * sizes[j], want.data(), sizes[j]) != 0)
                    return report(false, "odd replay " + std::to_string(rep) + " gather " + std::to_string(j));
            }
        const auto ref = referenceSum(1001, DType::BF16, 9000 + rep * 4 + 3, W);
        if (std::memcmp(all.data() + sumOff * W, ref.data(), 2002) != 0)
            return report(false, "odd replay " + std::to_string(rep) + " bf16 sum of 1001 differs");
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return report(true, "gathers=" + std::to_string(gathers) + " sums=" + std::to_string(sums) + " replays=64");
}

// All-gather-v: uneven counts (zeros among them), rows packed in rank order,
// eager and in a graph; then the last rank passes other counts: every rank's
// check() names GroupMismatch and the output stays untouched.
int scenarioGatherV(Group& g, cudaStream_t st, Buffers2 b) {
    const std::uint32_t W = g.world();
    const std::uint64_t cap = g.agreedCap();
    std::vector<std::uint8_t> h(kMaxBytes), out(kMaxBytes * W + 64), want(kMaxBytes);
    auto countsOf = [&](std::uint64_t seed) {
        std::vector<std::size_t> c(W);
        for (std::uint32_t r = 0; r < W; ++r) c[r] = r == 1 ? 0 : std::size_t(mix(seed * 31 + r) % (seed % 3 == 2 ? cap + 1 : 5000));
        return c;
    };
    auto check = [&](const std::vector<std::size_t>& c, std::uint64_t it, const std::uint8_t* o) -> std::string {
        std::size_t at = 0;
        for (std::uint32_t q = 0; q < W; ++q) {
            fillBytes(want.data(), c[q], it, q);
            if (std::memcmp(o + at, want.data(), c[q]) != 0) return "row " + std::to_string(q) + " differs";
            at += c[q];
        }
        for (std::size_t i = at; i < at + 64; ++i)
            if (o[i] != 0xa5) return "written past the rows";
        return "";
    };
    int calls = 0;
    for (std::uint64_t it = 100; it < 112; ++it, ++calls) {
        const auto c = countsOf(it);
        std::size_t total = 0;
        for (auto n : c) total += n;
        fillBytes(h.data(), c[g.rank()], it, g.rank());
        CK(cudaMemcpyAsync(b.send, h.data(), c[g.rank()], cudaMemcpyHostToDevice, st));
        CK(cudaMemsetAsync(b.recv, 0xa5, total + 64, st));
        ST(g.allGatherV(b.send, b.recv, c, st));
        CK(cudaMemcpyAsync(out.data(), b.recv, total + 64, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        ST(g.check());
        if (auto e = check(c, it, out.data()); !e.empty()) return report(false, "allGatherV call " + std::to_string(it) + ": " + e);
    }
    // In a graph: the counts are part of the captured call.
    const auto c = countsOf(200);
    std::size_t total = 0;
    for (auto n : c) total += n;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    ST(g.allGatherV(b.send, b.recv, c, st));
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 64; ++rep) {
        fillBytes(h.data(), c[g.rank()], 300 + rep, g.rank());
        CK(cudaMemcpyAsync(b.send, h.data(), c[g.rank()], cudaMemcpyHostToDevice, st));
        CK(cudaMemsetAsync(b.recv, 0xa5, total + 64, st));
        CK(cudaGraphLaunch(exec, st));
        CK(cudaMemcpyAsync(out.data(), b.recv, total + 64, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        ST(g.check());
        if (auto e = check(c, 300 + rep, out.data()); !e.empty()) return report(false, "allGatherV replay " + std::to_string(rep) + ": " + e);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    // Mismatched counts: the last rank's row is 16 bytes longer in its own counts.
    auto bad = countsOf(400);
    if (g.rank() == W - 1) bad[W - 1] += 16;
    std::size_t badTotal = 0;
    for (auto n : bad) badTotal += n;
    CK(cudaMemsetAsync(b.recv, 0xa5, badTotal + 64, st));
    ST(g.allGatherV(b.send, b.recv, bad, st));
    CK(cudaMemcpyAsync(out.data(), b.recv, badTotal + 64, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    const Status s = g.check();
    for (std::size_t i = 0; i < badTotal + 64; ++i)
        if (out[i] != 0xa5) return report(false, "a mismatched allGatherV wrote its output");
    if (s.code() != Errc::GroupMismatch) return report(false, "mismatched counts gave " + std::string(errcName(s.code())) + ": " +
                                                                  (s ? std::string() : s.error().detail));
    return report(true, "calls=" + std::to_string(calls) + " replays=64 mismatch=GroupMismatch (" + s.error().detail + ")");
}

// Ipc route: the last rank gathers 8 KiB where the others gather 4 KiB.
// Every rank's check() says GroupMismatch naming a rank of the other side,
// within a second of a 5 s timeout, every output untouched; the group stays
// failed (the next call returns the same error at once).
int scenarioMismatch(Group& g, cudaStream_t st, Buffers2 b) {
    const std::uint32_t W = g.world();
    const std::uint64_t size = g.rank() == W - 1 ? 8192 : 4096, span = 8192 * W + 64;
    std::vector<std::uint8_t> out(span);
    CK(cudaMemsetAsync(b.recv, 0xa5, span, st));
    CK(cudaStreamSynchronize(st));
    const auto t0 = std::chrono::steady_clock::now();
    ST(g.allGather(b.send, b.recv, size, st));
    CK(cudaMemcpyAsync(out.data(), b.recv, span, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const Status c = g.check();
    for (std::uint8_t x : out)
        if (x != 0xa5) return report(false, "a mismatched allGather wrote its output");
    if (c.code() != Errc::GroupMismatch)
        return report(false, "mismatched sizes gave " + std::string(errcName(c.code())) + (c ? "" : ": " + c.error().detail));
    const std::string other = "rank " + std::to_string(g.rank() == W - 1 ? 0 : W - 1) + " ";
    if (c.error().detail.find(other) == std::string::npos)
        return report(false, "the GroupMismatch does not name " + other + ": " + c.error().detail);
    if (s > 1.0) return report(false, "the mismatch took " + std::to_string(s) + " s to decide");
    const Status again = g.allGather(b.send, b.recv, size, st);
    if (again.code() != Errc::GroupMismatch) return report(false, "the call after the mismatch did not fail with it");
    return report(true, "mismatch=GroupMismatch in " + std::to_string(s) + " s (" + c.error().detail + ")");
}

// Proxy route: calls back to back until one fails; run.sh kills the daemon
// (SIGKILL) once every rank printed READY. The failing call must end
// DaemonLost, within 1 s of its start (the kernel watches the heartbeat).
int scenarioDaemonKill(Group& g, cudaStream_t st, Buffers2 b) {
    for (std::uint64_t call = 0; call < 2000000; ++call) {
        if (call == 5) std::printf("READY rank=%u\n", a.rank), std::fflush(stdout);
        gputest::fillShard(b.send, 4096, call, g.rank(), st);
        const auto t0 = std::chrono::steady_clock::now();
        ST(g.allGather(b.send, b.recv, 4096, st));
        CK(cudaStreamSynchronize(st));
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        const Status s = g.check();
        if (s) continue;
        char buf[256];
        std::snprintf(buf, sizeof buf, "call=%llu error=%s after_ms=%.1f detail=%s", (unsigned long long)call,
                      std::string(errcName(s.code())).c_str(), ms, s.error().detail.c_str());
        return report(s.code() == Errc::DaemonLost && ms < a.timeoutMs + 1000 && call >= 5, buf);
    }
    return report(false, "the daemon was never killed");
}

// 100 gathers verified on the device, READY, then the group held open
// without calls for 4 s (run.sh reads tpfabricctl status and the daemon's
// CPU meanwhile), then 100 more: the group still works after the idle stretch.
int scenarioIdle(Group& g, cudaStream_t st, Buffers2 b) {
    unsigned long long* cnt = nullptr;
    CK(cudaMalloc(&cnt, 16));
    const unsigned long long init[2] = {0, ~0ull};
    CK(cudaMemcpy(cnt, init, 16, cudaMemcpyHostToDevice));
    const auto calls = [&](std::uint64_t from) -> int {
        for (std::uint64_t call = from; call < from + 100; ++call) {
            gputest::fillShard(b.send, 4096, call, g.rank(), st);
            ST(g.allGather(b.send, b.recv, 4096, st));
            gputest::verifyGather(b.recv, 4096, g.world(), call, cnt, cnt + 1, st);
        }
        CK(cudaStreamSynchronize(st));
        ST(g.check());
        unsigned long long res[2];
        CK(cudaMemcpy(res, cnt, 16, cudaMemcpyDeviceToHost));
        if (res[0]) return report(false, std::to_string(res[0]) + " wrong words, first in call " + std::to_string(res[1]));
        return 0;
    };
    if (int rc = calls(0)) return rc;
    std::printf("READY rank=%u\n", a.rank), std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(4));
    if (int rc = calls(100)) return rc;
    return report(true, "calls=200 idle_s=4");
}

int scenarioGraph(Group& g, cudaStream_t st, Buffers2 b) {
    const std::uint32_t W = g.world();
    const std::uint64_t sizes[4] = {4096, 65536 + 16, 16, 1024};
    std::uint64_t off[4], total = 0;
    for (int j = 0; j < 4; ++j) off[j] = total, total += sizes[j];
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int j = 0; j < 4; ++j) ST(g.allGather(b.send + off[j], b.recv + off[j] * W, sizes[j], st));
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    std::vector<std::uint8_t> h(total), out(total * W), want(65536 + 16);
    for (int rep = 0; rep < 64; ++rep) {
        for (int j = 0; j < 4; ++j) fillBytes(h.data() + off[j], sizes[j], 5000 + rep * 4 + j, g.rank());
        CK(cudaMemcpyAsync(b.send, h.data(), total, cudaMemcpyHostToDevice, st));
        CK(cudaMemsetAsync(b.recv, 0x5a, total * W, st));
        CK(cudaGraphLaunch(exec, st));
        CK(cudaMemcpyAsync(out.data(), b.recv, total * W, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        ST(g.check());
        for (int j = 0; j < 4; ++j)
            for (std::uint32_t q = 0; q < W; ++q) {
                fillBytes(want.data(), sizes[j], 5000 + rep * 4 + j, q);
                if (std::memcmp(out.data() + off[j] * W + q * sizes[j], want.data(), sizes[j]) != 0)
                    return report(false, "replay " + std::to_string(rep) + " gather " + std::to_string(j) + " row " + std::to_string(q));
            }
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return report(true, "replays=64 gathers_per_graph=4");
}

// A captured graph replayed without check(): the kernels' live counts.
int scenarioLiveCount(Group& g, cudaStream_t st, Buffers2 b) {
    const std::uint32_t W = g.world();
    constexpr std::uint64_t kGather = 4096, kSum = 1024, kReplays = 200;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int j = 0; j < 3; ++j) ST(g.allGather(b.send, b.recv + j * kGather * W, kGather, st));
    for (int j = 0; j < 2; ++j) ST(g.allReduceSum(b.send, b.recv, kSum / 4, DType::F32, st));
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (std::uint64_t rep = 0; rep < kReplays; ++rep) CK(cudaGraphLaunch(exec, st));
    CK(cudaStreamSynchronize(st));
    const auto done = std::chrono::steady_clock::now();
    const RankStats& rs = tpf::testing::ringStats(g);
    const auto load = [](const std::uint64_t& v) { return std::atomic_ref(const_cast<std::uint64_t&>(v)).load(); };
    const std::uint64_t wantG = 3 * kReplays, wantS = 2 * kReplays;
    const std::uint64_t wantBytes = wantG * kGather + wantS * kSum;
    std::uint64_t calls = 0, bytes = 0;
    double waited = 0;
    while (true) {
        calls = load(rs.ops[kStatsAllGather].calls) + load(rs.ops[kStatsAllReduceSum].calls);
        bytes = load(rs.ops[kStatsAllGather].bytes) + load(rs.ops[kStatsAllReduceSum].bytes);
        waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - done).count();
        if ((calls == wantG + wantS && bytes == wantBytes) || waited > 1.0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (calls != wantG + wantS || bytes != wantBytes)
        return report(false, "ring counts without check(): calls " + std::to_string(calls) + " bytes " + std::to_string(bytes) +
                                 " after 1 s, wanted " + std::to_string(wantG + wantS) + " and " + std::to_string(wantBytes));
    std::printf("READY rank=%u calls=%llu bytes=%llu\n", g.rank(), static_cast<unsigned long long>(calls),
                static_cast<unsigned long long>(bytes)),
        std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(3));
    ST(g.check());
    const std::uint64_t after = load(rs.ops[kStatsAllGather].calls) + load(rs.ops[kStatsAllReduceSum].calls);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    if (after != calls) return report(false, "check() changed the counts: " + std::to_string(after));
    char buf[96];
    std::snprintf(buf, sizeof buf, "calls=%llu bytes=%llu visible_ms=%.2f", static_cast<unsigned long long>(calls),
                  static_cast<unsigned long long>(bytes), waited * 1e3);
    return report(true, buf);
}

int scenarioB2b(Group& g, cudaStream_t st, Buffers2 b) {
    const std::uint32_t W = g.world();
    unsigned long long* cnt = nullptr;
    CK(cudaMalloc(&cnt, 16));
    const unsigned long long init[2] = {0, ~0ull};
    CK(cudaMemcpy(cnt, init, 16, cudaMemcpyHostToDevice));
    const std::uint64_t sizes[4] = {16, 4096, 65536 + 16, 128 * 1024};
    const auto t0 = std::chrono::steady_clock::now();
    for (std::uint64_t call = 0; call < 2000; ++call) {
        const std::uint64_t size = sizes[(call / 2) % 4];
        if (call % 2 == 0) {
            gputest::fillShard(b.send, size, call, g.rank(), st);
            ST(g.allGather(b.send, b.recv, size, st));
            gputest::verifyGather(b.recv, size, W, call, cnt, cnt + 1, st);
        } else {
            gputest::fillInts(reinterpret_cast<float*>(b.send), size / 4, call, g.rank(), st);
            ST(g.allReduceSum(b.send, b.recv, size / 4, DType::F32, st));
            gputest::verifySum(reinterpret_cast<float*>(b.recv), size / 4, W, call, cnt, cnt + 1, st);
        }
    }
    CK(cudaStreamSynchronize(st));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ST(g.check());
    unsigned long long res[2];
    CK(cudaMemcpy(res, cnt, 16, cudaMemcpyDeviceToHost));
    if (res[0]) return report(false, std::to_string(res[0]) + " wrong words, first in call " + std::to_string(res[1]));
    char buf[64];
    std::snprintf(buf, sizeof buf, "calls=2000 seconds=%.3f", s);
    return report(true, buf);
}

// chaos: --calls calls or until one fails (tests/gpu/chaos.sh kills,
// stops, aborts or kills the daemon meanwhile). Every successful call is
// checked on the host, a failed one must have written nothing. The rank
// judges only what it alone can (right bytes, nothing written on failure, a
// named error); chaos.sh judges the outcome against the event and the time.
volatile std::sig_atomic_t abortRequested = 0;
int scenarioChaos(Group& g, cudaStream_t st, Buffers2 b) {
    const std::uint32_t W = g.world();
    std::signal(SIGUSR1, [](int) { abortRequested = 1; });
    const std::uint64_t sizes[2] = {4096, 65536};
    std::vector<std::uint8_t> out(65536 * W);
    std::uint64_t call = 0;
    for (;; ++call) {
        if (call == 5) std::printf("READY rank=%u\n", a.rank), std::fflush(stdout);
        if (abortRequested == 1) {
            abortRequested = 2;
            const Status s = g.abort();
            std::printf("ABORTED rank=%u abort=%s\n", a.rank, std::string(errcName(s.code())).c_str()), std::fflush(stdout);
        }
        if (call >= a.calls && abortRequested == 0) break;
        const std::uint64_t size = sizes[(call / 2) % 2];
        const bool gather = call % 2 == 0;
        const std::uint64_t outBytes = gather ? size * W : size;
        if (gather) gputest::fillShard(b.send, size, call, g.rank(), st);
        else gputest::fillInts(reinterpret_cast<float*>(b.send), size / 4, call, g.rank(), st);
        CK(cudaMemsetAsync(b.recv, 0xa5, outBytes, st));
        CK(cudaStreamSynchronize(st));
        const auto t0 = std::chrono::steady_clock::now();
        const Status posted = gather ? g.allGather(b.send, b.recv, size, st)
                                     : g.allReduceSum(b.send, b.recv, size / 4, DType::F32, st);
        CK(cudaStreamSynchronize(st));
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        const Status s = posted ? g.check() : posted;
        if (!s) {
            CK(cudaMemcpy(out.data(), b.recv, outBytes, cudaMemcpyDeviceToHost));
            for (std::uint64_t i = 0; i < outBytes; ++i)
                if (out[i] != 0xa5)
                    return report(false, "call " + std::to_string(call) + " failed (" + s.error().describe() +
                                             ") but wrote its output at byte " + std::to_string(i));
            const Errc c = s.code();
            const bool named = c == Errc::PeerLost || c == Errc::DaemonLost || c == Errc::Aborted || c == Errc::Timeout;
            char buf[512];
            std::snprintf(buf, sizeof buf, "outcome=%s call=%llu ms=%.1f detail=%s", std::string(errcName(c)).c_str(),
                          (unsigned long long)call, ms, s.error().detail.c_str());
            return report(named, buf);
        }
        // Right bytes: the gather rows are fillShard's pattern, the sum the exact integer total (on the device).
        unsigned long long* cnt = reinterpret_cast<unsigned long long*>(b.send + 3 * 65536);
        const unsigned long long init[2] = {0, ~0ull};
        CK(cudaMemcpyAsync(cnt, init, 16, cudaMemcpyHostToDevice, st));
        if (gather) gputest::verifyGather(b.recv, size, W, call, cnt, cnt + 1, st);
        else gputest::verifySum(reinterpret_cast<float*>(b.recv), size / 4, W, call, cnt, cnt + 1, st);
        unsigned long long res[2];
        CK(cudaMemcpyAsync(res, cnt, 16, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        if (res[0])
            return report(false, "call " + std::to_string(call) + ": " + std::to_string(res[0]) + " wrong " +
                                     (gather ? "gather" : "sum") + " words");
    }
    return report(true, "outcome=none calls=" + std::to_string(call));
}

// kill / stall: the last rank misbehaves at call 3; the others must fail with `want` naming it.
int scenarioFault(Group& g, cudaStream_t st, Buffers2 b, bool kill) {
    const std::uint32_t W = g.world(), bad = W - 1;
    for (std::uint64_t call = 0; call < 20; ++call) {
        if (g.rank() == bad && call == 3) {
            if (kill) std::_Exit(0); // no Close: the daemon sees the socket drop
            std::this_thread::sleep_for(std::chrono::milliseconds(3 * a.timeoutMs));
            return report(true, "stalled rank woke up");
        }
        gputest::fillShard(b.send, 4096, call, g.rank(), st);
        CK(cudaMemsetAsync(b.recv, 0xa5, 4096 * W, st));
        const auto t0 = std::chrono::steady_clock::now();
        ST(g.allGather(b.send, b.recv, 4096, st));
        CK(cudaStreamSynchronize(st));
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        Status s = g.check();
        if (s) continue;
        std::vector<std::uint8_t> out(4096 * W);
        CK(cudaMemcpy(out.data(), b.recv, out.size(), cudaMemcpyDeviceToHost));
        for (auto v : out)
            if (v != 0xa5) return report(false, "output written by a failed call");
        const Errc want = kill ? Errc::PeerLost : Errc::Timeout;
        const bool names = s.error().detail.find("rank " + std::to_string(bad)) != std::string::npos;
        char buf[256];
        std::snprintf(buf, sizeof buf, "call=%llu error=%s after_ms=%.1f detail=%s", (unsigned long long)call,
                      std::string(errcName(s.code())).c_str(), ms, s.error().detail.c_str());
        const bool inTime = kill ? ms < 0.8 * a.timeoutMs : ms >= 0.9 * a.timeoutMs;
        return report(s.code() == want && names && call == 3 && inTime, buf);
    }
    return report(false, "no failure seen");
}

// The graph of the health scenarios: a flag-path (or LL) gather, a staged
// gather (pack, gather, unpack) and an f32 sum, the three kinds of failing
// kernel. replay() launches it with new shards, copies the outputs to the
// host (an engine's sync point: its sampled tokens) and reads the health word
// before anything else does, as an engine would.
class HealthGraph {
public:
    static constexpr std::uint64_t kGather = 4096, kOdd = 100, kSum = 1024; // kSum: f32 elements
    struct Replay {
        Health health;
        bool exact = true;     ///< every output right
        bool untouched = true; ///< every output byte still 0x5a (a failed call writes nothing)
        double ms = 0;         ///< launch to sync
        bool callExact[3] = {true, true, true};     ///< the gather, the staged gather, the sum: output right
        bool callUntouched[3] = {true, true, true}; ///< likewise: output still 0x5a
        /// What is wrong with a replay the health word calls healthy: "" when
        /// every output is right, else which replay and how.
        std::string wrongWhileHealthy(int rep) const {
            if (exact) return "";
            return "replay " + std::to_string(rep) + ": output " + (untouched ? "unwritten" : "wrong") +
                   " while the health word says healthy";
        }
        /// A fault that lands during the replay: the calls before it complete
        /// (exact), the failing one and every later one write nothing
        /// (untouched); never a call half written or wrong.
        bool cutCleanly() const {
            bool failed = false;
            for (int c = 0; c < 3; ++c) {
                if (!callExact[c] && !callUntouched[c]) return false;
                if (failed && !callUntouched[c]) return false;
                failed = failed || !callExact[c];
            }
            return failed;
        }
    };
    HealthGraph(Group& g, cudaStream_t st, Buffers2 b) : g_(g), st_(st), b_(b) {}
    ~HealthGraph() {
        if (exec_) cudaGraphExecDestroy(exec_);
        if (graph_) cudaGraphDestroy(graph_);
    }
    /// Captures and instantiates the graph; "" or what failed.
    std::string capture() {
        const std::uint32_t W = g_.world();
        if (cudaStreamBeginCapture(st_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return "begin capture";
        Status s = g_.allGather(b_.send, b_.recv, kGather, st_);
        if (s) s = g_.allGather(b_.send + kOddAt, b_.recv + kGather * W, kOdd, st_);
        if (s) s = g_.allReduceSum(b_.send + kSumAt, b_.recv + outSum(), kSum, DType::F32, st_);
        const cudaError_t e = cudaStreamEndCapture(st_, &graph_);
        if (!s) return "captured call: " + s.error().describe();
        if (e != cudaSuccess) return std::string("end capture: ") + cudaGetErrorName(e);
        if (cudaGraphInstantiate(&exec_, graph_, 0) != cudaSuccess) return "instantiate";
        h_.resize(kSumAt + kSum * 4);
        out_.resize(outBytes());
        want_.resize(kGather);
        return "";
    }
    /// Replay number rep; false with what failed in `err` if CUDA did.
    bool replay(int rep, Replay& r, std::string& err) {
        const std::uint32_t W = g_.world();
        fillBytes(h_.data(), kGather, 7000 + rep, g_.rank());
        fillBytes(h_.data() + kOddAt, kOdd, 9000 + rep, g_.rank());
        for (std::uint64_t i = 0; i < kSum; ++i) {
            const float v = value(g_.rank(), rep, i);
            std::memcpy(h_.data() + kSumAt + i * 4, &v, 4);
        }
        const auto t0 = std::chrono::steady_clock::now();
        cudaError_t e = cudaMemcpyAsync(b_.send, h_.data(), h_.size(), cudaMemcpyHostToDevice, st_);
        if (e == cudaSuccess) e = cudaMemsetAsync(b_.recv, 0x5a, outBytes(), st_);
        if (e == cudaSuccess) e = cudaGraphLaunch(exec_, st_);
        if (e == cudaSuccess) e = cudaMemcpyAsync(out_.data(), b_.recv, outBytes(), cudaMemcpyDeviceToHost, st_);
        if (e == cudaSuccess) e = cudaStreamSynchronize(st_);
        if (e != cudaSuccess) {
            err = std::string("replay: ") + cudaGetErrorName(e);
            return false;
        }
        r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        r.health = g_.health(); // before check(), which would read the device's record itself
        for (int c = 0; c < 3; ++c) r.callExact[c] = r.callUntouched[c] = true;
        for (std::uint32_t q = 0; q < W; ++q) {
            fillBytes(want_.data(), kGather, 7000 + rep, q);
            r.callExact[0] = r.callExact[0] && std::memcmp(out_.data() + q * kGather, want_.data(), kGather) == 0;
            fillBytes(want_.data(), kOdd, 9000 + rep, q);
            r.callExact[1] = r.callExact[1] && std::memcmp(out_.data() + kGather * W + q * kOdd, want_.data(), kOdd) == 0;
        }
        for (std::uint64_t i = 0; i < kSum && r.callExact[2]; ++i) {
            float sum = 0, got;
            for (std::uint32_t q = 0; q < W; ++q) sum += value(q, rep, i); // small integers: exact in any order
            std::memcpy(&got, out_.data() + outSum() + i * 4, 4);
            r.callExact[2] = got == sum;
        }
        const std::uint64_t from[4] = {0, kGather * W, outSum(), outBytes()}; // each call's output bytes
        for (int c = 0; c < 3; ++c)
            for (std::uint64_t i = from[c]; i < from[c + 1] && r.callUntouched[c]; ++i)
                r.callUntouched[c] = out_[i] == 0x5a;
        r.exact = r.callExact[0] && r.callExact[1] && r.callExact[2];
        r.untouched = r.callUntouched[0] && r.callUntouched[1] && r.callUntouched[2];
        return true;
    }

private:
    static constexpr std::uint64_t kOddAt = kGather, kSumAt = kOddAt + 128; // offsets in send (16-byte aligned)
    static float value(std::uint32_t r, int rep, std::uint64_t i) { return float(int((i * 7 + r * 13 + rep) % 31) - 15); }
    std::uint64_t outSum() const { return kGather * g_.world() + 128 * g_.world(); }
    std::uint64_t outBytes() const { return outSum() + kSum * 4; }
    Group& g_;
    cudaStream_t st_;
    Buffers2 b_;
    cudaGraph_t graph_ = nullptr;
    cudaGraphExec_t exec_ = nullptr;
    std::vector<std::uint8_t> h_, out_, want_;
};

std::string replayText(int rep, const HealthGraph::Replay& r, const Status& checked) {
    char buf[384];
    std::snprintf(buf, sizeof buf, "replay=%d health=%s health_rank=%d check=%s untouched=%d after_ms=%.1f detail=%s", rep,
                  std::string(errcName(r.health.code)).c_str(), r.health.rank == Health::kNoRank ? -1 : int(r.health.rank),
                  std::string(errcName(checked.code())).c_str(), int(r.untouched), r.ms,
                  checked ? "" : checked.error().detail.c_str());
    return buf;
}

// graphkill / graphleave / graphstall: the health word flags every failed
// replay of a captured graph (HealthGraph) at the replay's own host sync
// point, without check().
enum class GraphFault { Kill, Leave, Stall };
int scenarioGraphHealth(Group& g, cudaStream_t st, Buffers2 b, GraphFault fault) {
    const std::uint32_t bad = g.world() - 1;
    constexpr int kFaultAt = 20, kReplays = 64;
    HealthGraph graph(g, st, b);
    if (const std::string e = graph.capture(); !e.empty()) return report(false, e);
    HealthGraph::Replay r;
    std::string err;
    for (int rep = 0; rep < kReplays; ++rep) {
        if (g.rank() == bad && rep == kFaultAt) {
            CK(cudaStreamSynchronize(st));
            if (fault == GraphFault::Kill) std::_Exit(0); // no Close: the daemon sees the socket drop
            if (fault == GraphFault::Leave) {
                g.close(); // in order: the others' replays up to its last epoch complete, the next fails
                return report(true, "left in order at replay " + std::to_string(rep));
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(3 * a.timeoutMs));
            return report(true, "stalled rank woke up");
        }
        if (!graph.replay(rep, r, err)) return report(false, err);
        if (r.health.ok()) {
            if (const std::string e = r.wrongWhileHealthy(rep); !e.empty()) return report(false, e);
            continue;
        }
        const Status checked = g.check();
        const Errc expected = fault == GraphFault::Stall ? Errc::Timeout : Errc::PeerLost;
        const bool ok = r.health.code == expected && r.health.rank == bad && checked.code() == r.health.code && r.untouched &&
                        rep == kFaultAt && !g.healthy();
        return report(ok, replayText(rep, r, checked));
    }
    return report(false, "no replay failed");
}

// graphnodekill (two daemons as two nodes, --nodes): HealthGraph replayed
// until a replay fails; READY after replay 5, then run.sh SIGKILLs the
// daemon of node 1, and does not start it again. Node 0's ranks: PeerLost
// (their daemon waited peer.restart_wait_ms for node 1's to come back),
// node 1's: DaemonLost (their kernels waited for a restarted daemon until
// their timeout); the failed replay flagged in the health word at its sync
// point, its calls cut cleanly (the daemon dies mid-replay: calls before the
// fault complete, the failing one and the rest write nothing), within the
// timeout + 1 s, and no replay before it wrong while healthy.
int scenarioGraphNodeKill(Group& g, cudaStream_t st, Buffers2 b, const std::vector<std::uint32_t>& nodes) {
    if (nodes.size() != g.world()) return report(false, "graphnodekill needs --nodes with a node per rank");
    const bool lostOwnDaemon = nodes[g.rank()] == 1;
    HealthGraph graph(g, st, b);
    if (const std::string e = graph.capture(); !e.empty()) return report(false, e);
    HealthGraph::Replay r;
    std::string err;
    for (int rep = 0; rep < 200000; ++rep) {
        if (rep == 5) std::printf("READY rank=%u\n", a.rank), std::fflush(stdout);
        if (!graph.replay(rep, r, err)) return report(false, err);
        if (r.health.ok()) {
            if (const std::string e = r.wrongWhileHealthy(rep); !e.empty()) return report(false, e);
            continue;
        }
        const Status checked = g.check();
        const Errc expected = lostOwnDaemon ? Errc::DaemonLost : Errc::PeerLost;
        // The daemon dies at any point of a replay: calls before it may have
        // completed; the failing one and the rest must have written nothing.
        const bool ok = r.health.code == expected && checked.code() == r.health.code && r.cutCleanly() && rep >= 5 &&
                        r.ms < a.timeoutMs + 1000 && !g.healthy();
        return report(ok, std::string("expected=") + std::string(errcName(expected)) + " " + replayText(rep, r, checked) +
                              " calls_exact=" + std::to_string(r.callExact[0]) + std::to_string(r.callExact[1]) +
                              std::to_string(r.callExact[2]) + " calls_untouched=" + std::to_string(r.callUntouched[0]) +
                              std::to_string(r.callUntouched[1]) + std::to_string(r.callUntouched[2]));
    }
    return report(false, "no replay failed: node 1's daemon was never killed");
}

// restart: HealthGraph replayed kReplays times, one every 2 ms, so that the
// daemon's SIGKILL and restart by run.sh (after READY) land among them. The
// group goes on with the restarted daemon: every replay healthy at its sync
// point and exact, the slowest one (the gap) within the timeout.
int scenarioRestart(Group& g, cudaStream_t st, Buffers2 b) {
    constexpr int kReplays = 1000;
    HealthGraph graph(g, st, b);
    if (const std::string e = graph.capture(); !e.empty()) return report(false, e);
    HealthGraph::Replay r;
    std::string err;
    double slowest = 0;
    int slowestAt = -1;
    for (int rep = 0; rep < kReplays; ++rep) {
        if (rep == 5) std::printf("READY rank=%u\n", a.rank), std::fflush(stdout);
        if (!graph.replay(rep, r, err)) return report(false, err);
        if (!r.health.ok()) return report(false, "a replay failed across the restart: " + replayText(rep, r, g.check()));
        if (const std::string e = r.wrongWhileHealthy(rep); !e.empty()) return report(false, e);
        if (r.ms > slowest) slowest = r.ms, slowestAt = rep;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    const Status checked = g.check();
    char buf[192];
    std::snprintf(buf, sizeof buf, "replays=%d exact and healthy; slowest replay %d took %.1f ms; check=%s", kReplays, slowestAt,
                  slowest, std::string(errcName(checked.code())).c_str());
    return report(checked.ok() && g.healthy() && slowest < a.timeoutMs, buf);
}

#if TPF_HAVE_NCCL
int scenarioNccl1(cudaStream_t st, Buffers2 b) {
    ncclUniqueId id;
    ncclComm_t comm;
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess)
        return report(false, "NCCL world-1 communicator did not initialise");
    auto boot = NcclBootstrap::create(comm);
    if (!boot) return report(false, "NcclBootstrap: " + boot.error().describe());
    std::uint64_t x = 0x1234, y = 0;
    ST((*boot)->allGather(&x, &y, 8));
    if (y != x) return report(false, "NcclBootstrap allGather of one rank");
    Options o;
    o.buffers = tpf::Buffers::Device;
    auto grp = Group::open(**boot, 0, 1, 4096, o);
    if (!grp) return report(false, "open: " + grp.error().describe());
    Group& g = **grp;
    std::vector<std::uint8_t> h(65536), out(65536);
    fillBytes(h.data(), h.size(), 1, 0);
    CK(cudaMemcpy(b.send, h.data(), h.size(), cudaMemcpyHostToDevice));
    ST(g.allGather(b.send, b.recv, 4096, st));           // within the cap: a copy
    ST(g.allGather(b.send, b.recv + 4096, 61440, st));   // above: ncclAllGather
    fillValues(h.data(), 16384, DType::F32, 2, 0);
    CK(cudaMemcpyAsync(b.send + 65536, h.data(), 65536, cudaMemcpyHostToDevice, st));
    ST(g.allReduceSum(b.send + 65536, b.recv + 65536, 16384, DType::F32, st)); // above: ncclAllReduce
    CK(cudaStreamSynchronize(st));
    ST(g.check());
    CK(cudaMemcpy(out.data(), b.recv, 65536, cudaMemcpyDeviceToHost));
    fillBytes(h.data(), 65536, 1, 0);
    if (std::memcmp(out.data(), h.data(), 4096) || std::memcmp(out.data() + 4096, h.data(), 61440))
        return report(false, "world-1 gathers differ");
    CK(cudaMemcpy(out.data(), b.recv + 65536, 65536, cudaMemcpyDeviceToHost));
    fillValues(h.data(), 16384, DType::F32, 2, 0);
    if (std::memcmp(out.data(), h.data(), 65536)) return report(false, "world-1 NCCL sum differs");
    const std::string path = g.path(); // "nccl" under TPF_DISABLE=1: the fallback took the whole group
    grp->reset();
    boot->reset();
    ncclCommDestroy(comm);
    return report(true, "nccl_bootstrap=ok copy=ok ncclAllGather=ok ncclAllReduce=ok path=" + path);
}

// Gathers and sums on either side of the cap (fabric below, NCCL above, or
// NCCL for all after a fallback): gathers byte-exact, sums equal on every
// rank (hashes compared over the bootstrap) and, for W = 2 or f32 integers,
// equal to the rank-order reference.
int ncclChecks(Group& g, Bootstrap& boot, cudaStream_t st, Buffers2 b, const std::string& wantPath) {
    const std::uint32_t W = g.world();
    if (g.path() != wantPath) return report(false, "path is " + g.path() + ", wanted " + wantPath);
    std::vector<std::uint8_t> h(2 * kMaxBytes), out(2 * kMaxBytes * W), want(2 * kMaxBytes);
    std::uint64_t it = 900, hash = 1469598103934665603ull, fabricCalls = 0, ncclCalls = 0;
    // Which calls the fabric takes: within the cap and the crossover (run.sh sets TPF_NCCL_ABOVE).
    const char* above = std::getenv("TPF_NCCL_ABOVE"); // run.sh passes plain bytes
    const std::uint64_t crossover = above && *above ? std::strtoull(above, nullptr, 10) : ~0ull;
    auto viaFabric = [&](std::uint64_t size) { return g.path() == "fabric" && g.fits(size) && size <= crossover; };
    auto fnv = [&](const std::uint8_t* p, std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
    };
    for (std::uint64_t size : {4096ull, 65536ull, 65536ull + 16, 262144ull, 1048576ull}) {
        (viaFabric(size) ? fabricCalls : ncclCalls)++;
        fillBytes(h.data(), size, ++it, g.rank());
        CK(cudaMemcpyAsync(b.send, h.data(), size, cudaMemcpyHostToDevice, st));
        CK(cudaMemsetAsync(b.recv, 0xa5, size * W, st));
        ST(g.allGather(b.send, b.recv, size, st));
        CK(cudaMemcpyAsync(out.data(), b.recv, size * W, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        ST(g.check());
        for (std::uint32_t q = 0; q < W; ++q) {
            fillBytes(want.data(), size, it, q);
            if (std::memcmp(out.data() + q * size, want.data(), size) != 0)
                return report(false, "gather of " + std::to_string(size) + " bytes: row " + std::to_string(q) + " differs");
        }
        fnv(out.data(), size * W);
    }
    int refEqual = 0, sums = 0;
    for (DType t : {DType::BF16, DType::F32})
        for (std::uint64_t size : {4096ull, 65536ull, 65536ull + 16, 262144ull, 1048576ull}) {
            (viaFabric(size) ? fabricCalls : ncclCalls)++;
            const std::size_t count = size / dtypeSize(t);
            fillValues(h.data(), count, t, ++it, g.rank());
            CK(cudaMemcpyAsync(b.send, h.data(), size, cudaMemcpyHostToDevice, st));
            CK(cudaMemsetAsync(b.recv, 0xa5, size, st));
            ST(g.allReduceSum(b.send, b.recv, count, t, st));
            CK(cudaMemcpyAsync(out.data(), b.recv, size, cudaMemcpyDeviceToHost, st));
            CK(cudaStreamSynchronize(st));
            ST(g.check());
            fnv(out.data(), size);
            const auto ref = referenceSum(count, t, it, W);
            const bool same = std::memcmp(out.data(), ref.data(), size) == 0;
            refEqual += same;
            ++sums;
            if (!same && viaFabric(size))
                return report(false, "fabric sum of " + std::to_string(size) + " bytes differs from the rank-order reference");
        }
    std::vector<std::uint64_t> hashes(W);
    ST(boot.allGather(&hash, hashes.data(), sizeof hash));
    for (std::uint32_t q = 0; q < W; ++q)
        if (hashes[q] != hash) return report(false, "results differ between rank " + std::to_string(g.rank()) + " and rank " + std::to_string(q));
    // A fabric group counts the calls it handed to NCCL in its ring (the daemon's nccl_calls).
    if (g.path() == "fabric") {
        const RankStats& rs = tpf::testing::ringStats(g);
        if (rs.ncclCalls + rs.ncclGraphCalls != ncclCalls)
            return report(false, "ring counts " + std::to_string(rs.ncclCalls + rs.ncclGraphCalls) + " calls handed to NCCL, made " +
                                     std::to_string(ncclCalls));
    }
    char buf[200];
    std::snprintf(buf, sizeof buf, "path=%s cap=%llu fabric_calls=%llu nccl_calls=%llu identical_on_all_ranks=yes sums_equal_to_reference=%d/%d",
                  g.path().c_str(), (unsigned long long)g.agreedCap(), (unsigned long long)fabricCalls,
                  (unsigned long long)ncclCalls, refEqual, sums);
    return report(true, buf);
}

int scenarioNcclW(cudaStream_t st, Buffers2 b, Bootstrap& tcp) {
    auto comm = tpf::testing::ncclCommOver(tcp);
    if (!comm) return report(false, comm.error().describe());
    auto boot = NcclBootstrap::create(*comm);
    if (!boot) return report(false, "NcclBootstrap: " + boot.error().describe());
    Options o;
    o.socketPath = a.socket;
    o.buffers = tpf::Buffers::Device;
    o.timeout = std::chrono::milliseconds(a.timeoutMs);
    std::unique_ptr<Group> holder;
    if (a.scenario == "nccl-disabled" && a.rank == a.world - 1) ::setenv("TPF_DISABLE", "1", 1);
    if (a.scenario == "nccl-refuse") { // take the daemon's only group first
        Options ho;
        ho.socketPath = a.socket;
        auto hg = Group::open(tcp, a.rank, a.world, 4096, ho);
        if (!hg) return report(false, "holder group did not open: " + hg.error().describe());
        holder = std::move(*hg);
    }
    if (a.scenario == "nccl-late") { // the last rank never opens: the others' open ends by its deadline
        constexpr int kOpenMs = 2000;
        if (a.rank == a.world - 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(kOpenMs + 3000));
            boot->reset();
            ncclCommAbort(*comm);
            return report(true, "late rank: never opened");
        }
        o.openTimeout = std::chrono::milliseconds(kOpenMs);
        const auto t0 = std::chrono::steady_clock::now();
        auto late = Group::open(**boot, a.rank, a.world, a.maxBytes, o);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        boot->reset(); // a wedged bootstrap does not wait for its pending collective
        ncclCommAbort(*comm); // the pending collective cannot be withdrawn
        if (late) return report(false, "open succeeded without the last rank");
        char buf[512];
        std::snprintf(buf, sizeof buf, "open ended after %.0f ms (bound %d + 1000): %s", ms, kOpenMs,
                      late.error().describe().c_str());
        return report(late.code() == Errc::Timeout && ms <= kOpenMs + 1000, buf);
    }
    auto grp = Group::open(**boot, a.rank, a.world, a.maxBytes, o);
    int rc = 0;
    if (a.scenario == "nccl-error") {
        rc = grp ? report(false, "open succeeded despite TPF_FALLBACK=error and an unavailable fabric")
                 : report(grp.code() == Errc::Unavailable, "open refused: " + grp.error().describe());
    } else if (!grp) {
        rc = report(false, "open: " + grp.error().describe());
    } else {
        rc = ncclChecks(**grp, **boot, st, b, a.scenario == "nccl-fabric" ? "fabric" : "nccl");
        grp->reset();
    }
    holder.reset();
    boot->reset();
    ncclCommDestroy(*comm);
    return rc;
}
#endif

} // namespace

int main(int argc, char** argv) {
    CLI::App app{"tpfabric GPU test rank (started by tests/gpu/run.sh on the GPU machine)"};
    app.add_option("--socket", a.socket);
    app.add_option("--bootstrap", a.bootstrap);
    app.add_option("--scenario", a.scenario);
    app.add_option("--route", a.route);
    app.add_option("--rank", a.rank);
    app.add_option("--world", a.world);
    app.add_option("--timeout-ms", a.timeoutMs);
    app.add_option("--max-bytes", a.maxBytes, "the group's cap (nccl-* scenarios)");
    app.add_option("--device", a.device, "CUDA device (default: rank % visible devices)");
    app.add_option("--calls", a.calls, "chaos: calls when nothing fails");
    app.add_option("--nodes", a.nodes, "the node of each rank (0,0,1,1: two daemons as two nodes): routes checked at open")
        ->delimiter(',');
    CLI11_PARSE(app, argc, argv);
    // The probe's test hook is internal to libtpfabric (not in the installed library).
    if (const char* sab = std::getenv("TPF_PROBE_SABOTAGE"); sab && *sab) tpf::testing::setProbeSabotage(std::atoi(sab));
    // TPF_TEST_NODES=0,0,1,1: a node index per rank; other nodes' ranks keep the proxy route (the mixed scenario).
    if (const char* nodes = std::getenv("TPF_TEST_NODES"); nodes && *nodes) {
        std::vector<std::uint32_t> v;
        for (const char* c = nodes; *c; ++c)
            if (*c >= '0' && *c <= '9') v.push_back(std::uint32_t(*c - '0'));
        tpf::testing::setTestNodes(std::move(v));
    }
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
        return skip("no CUDA device here; tpf-gpurank runs on the GPU machine (tests/gpu/run.sh)");
    if (a.scenario == "has-device") return 0; // a probe for scripts (multiprocess.sh), not a test
    CK(cudaSetDevice(a.device >= 0 ? a.device : int(a.rank % std::uint32_t(devices))));
    CK(gputest::preloadRankKernels());
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    Buffers2 b;
    CK(cudaMalloc(&b.send, 2 * kMaxBytes));
    CK(cudaMalloc(&b.recv, 2 * kMaxBytes * 16));
    if (a.scenario == "nccl1") {
#if TPF_HAVE_NCCL
        return scenarioNccl1(st, b);
#else
        return skip("built without NCCL");
#endif
    }
    auto boot = TcpBootstrap::create(a.rank, a.world, a.bootstrap);
    if (!boot) return report(false, "bootstrap: " + boot.error().describe());
    if (a.scenario.rfind("nccl-", 0) == 0) {
#if TPF_HAVE_NCCL
        return scenarioNcclW(st, b, **boot);
#else
        return skip("built without NCCL");
#endif
    }
    Options o;
    o.socketPath = a.socket;
    o.buffers = tpf::Buffers::Device;
    o.timeout = std::chrono::milliseconds(a.timeoutMs);
    o.gpuRoute = a.route == "ipc" ? GpuRoute::Ipc : a.route == "proxy" ? GpuRoute::Proxy : GpuRoute::Auto;
    if (a.scenario == "probefail") {
        o.fallback = Fallback::Error;
        auto grp = Group::open(**boot, a.rank, a.world, kMaxBytes, o);
        if (grp) return report(false, "open succeeded despite a sabotaged probe");
        const std::string& d = grp.error().detail; // the sabotaged rank names its check, the others the rank
        const bool named = d.find("ProbeFailed") != std::string::npos || d.find("probe failed on rank 1") != std::string::npos;
        return report(grp.code() == Errc::Unavailable && named, "open: " + grp.error().describe());
    }
    auto grp = Group::open(**boot, a.rank, a.world, kMaxBytes, o);
    if (!grp) return report(false, "open: " + grp.error().describe());
    Group& g = **grp;
    const std::string want = a.route == "auto" ? "" : a.route == "ipc" ? "ipc" : "shm";
    if (!want.empty() && g.route((a.rank + 1) % a.world) != want)
        return report(false, "route to the next rank is " + g.route((a.rank + 1) % a.world) + ", wanted " + want);
    if (!a.nodes.empty()) { // two daemons as two nodes: ipc to the own node's GPUs (auto route), tcp to the other's
        if (a.nodes.size() != a.world) return report(false, "--nodes needs a node per rank");
        for (std::uint32_t q = 0; q < a.world; ++q) {
            const std::string wantRoute = q == a.rank                ? "self"
                                          : a.nodes[q] != a.nodes[a.rank] ? "tcp"
                                          : a.route == "proxy"        ? "shm"
                                                                      : "ipc";
            if (g.route(q) != wantRoute)
                return report(false, "route to rank " + std::to_string(q) + " (node " + std::to_string(a.nodes[q]) + ") is " +
                                         g.route(q) + ", wanted " + wantRoute);
        }
    }
    if (a.scenario == "mixed") { // ipc to same-"node" peers, the proxy to the others, in one call
        const auto& nodes = tpf::testing::testNodes();
        if (nodes.size() < a.world) return report(false, "mixed needs TPF_TEST_NODES with a node per rank");
        std::string wires;
        for (std::uint32_t q = 0; q < a.world; ++q) {
            const std::string wantRoute = q == a.rank ? "self" : nodes[q] == nodes[a.rank] ? "ipc" : "shm";
            wires += (q ? "," : "") + g.route(q);
            if (g.route(q) != wantRoute) return report(false, "route to rank " + std::to_string(q) + " is " + g.route(q) + ", wanted " + wantRoute);
        }
        if (int rc = scenarioData(g, st, b); rc) return rc;
        if (int rc = scenarioOdd(g, st, b); rc) return rc;
        if (int rc = scenarioGatherV(g, st, b); rc) return rc;
        return report(true, "mixed routes " + wires + ": data, odd, gatherv passed");
    }
    if (a.scenario == "data") return scenarioData(g, st, b);
    if (a.scenario == "daemonkill") return scenarioDaemonKill(g, st, b);
    if (a.scenario == "restart") return scenarioRestart(g, st, b);
    if (a.scenario == "idle") return scenarioIdle(g, st, b);
    if (a.scenario == "odd") return scenarioOdd(g, st, b);
    if (a.scenario == "gatherv") return scenarioGatherV(g, st, b);
    if (a.scenario == "mismatch") return scenarioMismatch(g, st, b);
    if (a.scenario == "graph") return scenarioGraph(g, st, b);
    if (a.scenario == "livecount") return scenarioLiveCount(g, st, b);
    if (a.scenario == "b2b") return scenarioB2b(g, st, b);
    if (a.scenario == "kill") return scenarioFault(g, st, b, true);
    if (a.scenario == "stall") return scenarioFault(g, st, b, false);
    if (a.scenario == "chaos") return scenarioChaos(g, st, b);
    if (a.scenario == "graphkill") return scenarioGraphHealth(g, st, b, GraphFault::Kill);
    if (a.scenario == "graphleave") return scenarioGraphHealth(g, st, b, GraphFault::Leave);
    if (a.scenario == "graphstall") return scenarioGraphHealth(g, st, b, GraphFault::Stall);
    if (a.scenario == "graphnodekill") return scenarioGraphNodeKill(g, st, b, a.nodes);
    return report(false, "unknown scenario");
}
