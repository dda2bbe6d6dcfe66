// Device groups at open: host regions registered for the proxy route, device
// regions exported, brokered by the daemon and imported for the ipc route,
// then the load-time probe (docs/gpu.md, Open). Each stage ends in a vote over the
// bootstrap, so every rank leaves with the same wires and the same verdict.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client/gpu_check.hpp"
#include "client/gpu_path.hpp"
#include "client/reduce.hpp"
#include "common/unix_socket.hpp"
#include "kernels/staging.hpp"
#include "proto/bootstrap.hpp"

namespace tpf {

using namespace client_proto;

namespace {

// Driver entry points through the runtime, so that libtpfabric does not link
// libcuda.so.1 (absent on CPU-only hosts, where host groups must still run).
struct Driver {
    decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
    decltype(&cuMemCreate) create = nullptr;
    decltype(&cuMemAddressReserve) reserve = nullptr;
    decltype(&cuMemMap) map = nullptr;
    decltype(&cuMemSetAccess) setAccess = nullptr;
    decltype(&cuMemExportToShareableHandle) exportFd = nullptr;
    decltype(&cuMemImportFromShareableHandle) importFd = nullptr;
    decltype(&cuMemUnmap) unmap = nullptr;
    decltype(&cuMemAddressFree) addressFree = nullptr;
    decltype(&cuMemRelease) release = nullptr;
};

template <class F>
Status entry(const char* name, F& out) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    TPF_GPU_TRY(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !fn) return Error{Errc::Unsupported, std::string("driver has no ") + name};
    out = reinterpret_cast<F>(fn);
    return okStatus();
}

Result<const Driver*> driver() {
    static Driver d;
    static Status loaded = [] {
        Status s = entry("cuMemGetAllocationGranularity", d.granularity);
        if (s) s = entry("cuMemCreate", d.create);
        if (s) s = entry("cuMemAddressReserve", d.reserve);
        if (s) s = entry("cuMemMap", d.map);
        if (s) s = entry("cuMemSetAccess", d.setAccess);
        if (s) s = entry("cuMemExportToShareableHandle", d.exportFd);
        if (s) s = entry("cuMemImportFromShareableHandle", d.importFd);
        if (s) s = entry("cuMemUnmap", d.unmap);
        if (s) s = entry("cuMemAddressFree", d.addressFree);
        if (s) s = entry("cuMemRelease", d.release);
        return s;
    }();
    if (!loaded) return loaded.error();
    return &d;
}

const Driver& drv() { return **driver(); } // only after driver() succeeded

GpuRoute gpuRouteOf(const Group::Impl& g) {
    if (g.options.gpuRoute) return *g.options.gpuRoute;
    return g.env.gpuRoute.value_or(GpuRoute::Auto);
}

// All-or-none over the bootstrap: the first failing rank's code, else Ok.
// `capable` ANDs one extra bit over every rank.
Status vote(Bootstrap& boot, const Status& mine, const char* stage, bool* capable = nullptr) {
    bootstrap_proto::OpenVote v{std::uint16_t(mine.code()), std::uint16_t(capable && *capable), 0};
    std::vector<bootstrap_proto::OpenVote> all(boot.world());
    if (auto s = boot.allGather(&v, all.data(), sizeof v); !s) return s;
    if (capable)
        for (const auto& a : all) *capable = *capable && a.reserved0;
    for (std::uint32_t r = 0; r < boot.world(); ++r)
        if (all[r].errc) {
            if (r == boot.rank()) return mine;
            Errc code = Errc::Unavailable;
            errcFromWire(all[r].errc, code);
            return Error{code, std::string(stage) + " failed on rank " + std::to_string(r) + " (" +
                                   std::string(errcName(code)) + ")"};
        }
    return okStatus();
}

Result<void*> registerMapped(void* host, std::size_t bytes) {
    TPF_GPU_TRY(cudaHostRegister(host, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
    void* dev = nullptr;
    TPF_GPU_TRY(cudaHostGetDevicePointer(&dev, host, 0));
    return dev;
}

Status mapAccess(GpuPath& p, DeviceMapping& m, std::size_t align) {
    TPF_GPU_TRY(drv().reserve(&m.ptr, m.bytes, align, 0, 0));
    TPF_GPU_TRY(drv().map(m.ptr, m.bytes, 0, m.handle, 0));
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = p.device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    TPF_GPU_TRY(drv().setAccess(m.ptr, m.bytes, &access, 1));
    return okStatus();
}

CUmemAllocationProp regionProp(int device) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return prop;
}

// Stage 1: the proxy route's host mappings and the device state.
Status attachHost(Group::Impl& g, GpuPath& p) {
    TPF_GPU_TRY(cudaGetDevice(&p.device));
    TPF_GPU_TRY(cudaFree(nullptr)); // the primary context, current for the driver calls below
    TPF_GPU_TRY(kernels::preloadKernels());
    TPF_GPU_TRY(kernels::preloadStagingKernels());
    // Rows of staged calls: allocated now, as a call may be captured in a graph.
    TPF_GPU_TRY(cudaMalloc(&p.scratch, (g.world + 1) * g.layout.slotBytes));
    auto region = registerMapped(g.region.data(), g.region.size());
    if (!region) return region.error();
    p.regionHost = g.region.data();
    auto ring = registerMapped(g.ringMap.data(), g.ringMap.size());
    if (!ring) return ring.error();
    p.ringHost = g.ringMap.data();
    TPF_GPU_TRY(kernels::createDeviceState(&p.state, 0, g.ring.header().subHead));
    TPF_GPU_TRY(cudaMalloc(&p.stats, sizeof(kernels::DeviceStats)));
    TPF_GPU_TRY(cudaMemset(p.stats, 0, sizeof(kernels::DeviceStats)));
    auto& v = p.view;
    v.layout = g.layout;
    v.rank = g.rank;
    v.world = g.world;
    std::memcpy(v.wires, g.wires.data(), kMaxWorld);
    v.region = static_cast<std::uint8_t*>(*region);
    v.hostRegion = v.region; // stays the host mapping when ipc peers make region the device region
    v.control = reinterpret_cast<ControlBlock*>(v.hostRegion + g.layout.controlOffset());
    v.ring = static_cast<std::uint8_t*>(*ring);
    v.ringLayout = g.ring.layout();
    v.groupHandle = g.handle;
    v.state = p.state;
    v.stats = testing::deviceStats() ? p.stats : nullptr;
    v.ringStats = reinterpret_cast<RankStats*>(v.ring + g.ring.layout().statsOffset());
    v.timeoutNs = std::uint64_t(g.options.timeout.count()) * 1000000ull;
    v.maxBlocks = g.options.maxBlocks;
    return okStatus();
}

// Stage 2a: the own device region, exportable as a POSIX fd.
Status createOwnRegion(Group::Impl& g, GpuPath& p) {
    if (auto d = driver(); !d) return d.error();
    const CUmemAllocationProp prop = regionProp(p.device);
    std::size_t gran = 0;
    TPF_GPU_TRY(drv().granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    // The LL area rides behind the flag path's layout (kernels/collectives.hpp);
    // TPF_GPU_LL=0 leaves it out, and then no rank uses it (shareRegions votes).
    p.llWanted = g.env.lowLatency;
    const std::uint64_t need = p.llWanted ? kernels::regionBytesWithLl(g.layout) : g.layout.totalBytes();
    p.own.bytes = (need + gran - 1) / gran * gran;
    TPF_GPU_TRY(drv().create(&p.own.handle, p.own.bytes, &prop, 0));
    if (auto s = mapAccess(p, p.own, gran); !s) return s;
    TPF_GPU_TRY(cudaMemset(reinterpret_cast<void*>(p.own.ptr), 0, p.own.bytes));
    TPF_GPU_TRY(cudaDeviceSynchronize()); // zero flags before any peer maps it
    return okStatus();
}

// Stage 2b: share the own region through the daemon; import every same-node peer's.
Status shareRegions(Group::Impl& g, GpuPath& p) {
    int fd = -1;
    TPF_GPU_TRY(drv().exportFd(&fd, p.own.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    UniqueFd exported(fd);
    const int t = int(g.options.openTimeout.count());
    const int fds[1] = {exported.get()};
    if (auto s = sendMessage(g.socket.get(), encode(kShareRegion, g.seq++, ShareRegion{p.own.bytes, 0, 0}), fds, t); !s)
        return s;
    std::uint32_t expected = 0;
    for (std::uint32_t q = 0; q < g.world; ++q) expected += g.wires[q] == kWireShm;
    const CUmemAllocationProp prop = regionProp(p.device);
    std::size_t gran = 0;
    TPF_GPU_TRY(drv().granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    for (std::uint32_t got = 0; got < expected; ++got) {
        auto m = receiveMessage(g.socket.get(), kReplySpec, t);
        if (!m) return m.error();
        if (m->header.opcode != kPeerRegion || m->fds.size() != 1)
            return Error{Errc::BadMessage, "expected PeerRegion with 1 fd, got opcode " + std::to_string(m->header.opcode)};
        auto pr = decodeFixed<PeerRegion>(m->payload, "PeerRegion");
        if (!pr) return pr.error();
        if (pr->rank >= g.world || g.wires[pr->rank] != kWireShm || p.peers[pr->rank].ptr || pr->bytes < g.layout.totalBytes())
            return Error{Errc::BadMessage, "PeerRegion for rank " + std::to_string(pr->rank) + " not expected"};
        if (pr->bytes < kernels::regionBytesWithLl(g.layout)) p.llWanted = false; // that peer has no LL area
        DeviceMapping& d = p.peers[pr->rank];
        d.bytes = pr->bytes;
        TPF_GPU_TRY(drv().importFd(&d.handle, reinterpret_cast<void*>(std::intptr_t(m->fds[0].get())),
                                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        if (auto s = mapAccess(p, d, gran); !s) return s;
    }
    return okStatus();
}

// Stage 3: the load-time probe. A 4 KiB all-gather checked byte for byte
// against the bootstrap's (NCCL's, over an NcclBootstrap), and a bf16 sum
// checked bit for bit against the host's rank-order reference over inputs
// gathered by the bootstrap.
Status probe(Group::Impl& g, GpuPath& p, Bootstrap& boot) {
    constexpr std::size_t kBytes = 4096, kCount = kBytes / 2;
    const std::uint32_t W = g.world;
    std::vector<std::uint8_t> mine(kBytes), gathered(W * kBytes), fabric(W * kBytes);
    std::vector<std::uint16_t> in(kCount), rows(W * kCount), sum(kCount), ref(kCount);
    for (std::size_t i = 0; i < kBytes; ++i) mine[i] = std::uint8_t(i * 7 + g.rank * 31 + 1);
    for (std::size_t i = 0; i < kCount; ++i) // cancelling pairs on ranks 0 and 1, small values elsewhere: order-sensitive
        in[i] = floatToBf16(g.rank == 0 ? 1024.0f + float(i % 13) : g.rank == 1 ? -1024.0f : 0.0078125f * float(1 + (i + g.rank) % 5));
    if (auto s = boot.allGather(mine.data(), gathered.data(), kBytes); !s) return s;
    if (auto s = boot.allGather(in.data(), rows.data(), kBytes); !s) return s;
    std::vector<const void*> rp(W);
    for (std::uint32_t r = 0; r < W; ++r) rp[r] = rows.data() + r * kCount;
    sumRowsInOrder(rp.data(), W, ref.data(), kCount, DType::BF16);

    cudaStream_t stream = nullptr;
    TPF_GPU_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    void* d = nullptr;
    Status s = TPF_GPU(cudaMalloc(&d, kBytes * (W + 2)));
    auto* dsend = static_cast<std::uint8_t*>(d);
    auto* drecv = dsend + kBytes;
    auto* dsum = drecv + W * kBytes;
    if (s) s = TPF_GPU(cudaMemcpyAsync(dsend, mine.data(), kBytes, cudaMemcpyHostToDevice, stream));
    if (s) s = TPF_GPU(kernels::launchAllGather(p.view, dsend, drecv, kBytes, stream));
    if (s) s = TPF_GPU(cudaMemcpyAsync(dsend, in.data(), kBytes, cudaMemcpyHostToDevice, stream));
    if (s) s = TPF_GPU(kernels::launchAllReduceSum(p.view, dsend, dsum, kCount, DType::BF16, stream));
    if (s) s = TPF_GPU(cudaMemcpyAsync(fabric.data(), drecv, W * kBytes, cudaMemcpyDeviceToHost, stream));
    if (s) s = TPF_GPU(cudaMemcpyAsync(sum.data(), dsum, kBytes, cudaMemcpyDeviceToHost, stream));
    if (s) s = TPF_GPU(cudaStreamSynchronize(stream));
    kernels::CallFailure f;
    if (s) s = TPF_GPU(kernels::readFailure(p.view, f));
    if (s && f.error != Errc::Ok)
        s = Error{Errc::ProbeFailed, "probe call failed: " + std::string(errcName(f.error)) + " (rank " + std::to_string(f.missingPeer) + ")"};
    // Test hook (testing::setProbeSabotage, not exported): that rank's probe disagrees.
    if (s && testing::probeSabotage() == int(g.rank)) fabric[5] ^= 1;
    if (s && std::memcmp(fabric.data(), gathered.data(), fabric.size()) != 0)
        s = Error{Errc::ProbeFailed, "4 KiB all-gather differs from the bootstrap's"};
    if (s && std::memcmp(sum.data(), ref.data(), kBytes) != 0)
        s = Error{Errc::ProbeFailed, "bf16 sum differs from the rank-order reference"};
    cudaFree(d);
    cudaStreamDestroy(stream);
    return s;
}

// Where NCCL overtakes the fabric kernel, per op: shards above it go by NCCL
// when the group has a communicator. Two H200s, W = 2, ipc over NVLink
// (docs/perf.md): the LL path beats NCCL at every size up to its
// limit (512 KiB at W = 2), the flag path above it is slower than NCCL, so
// the crossover is the LL limit. W > 2 is not measured beside NCCL (two GPUs
// only); the same rule stands there. Proxy groups keep every size within the cap.
std::uint64_t ipcNcclAbove(std::uint32_t world) { return kernels::llMaxBytes(world); }

// The crossover every rank uses: the minimum of every rank's choice
// (TPF_NCCL_ABOVE=<bytes> or "never" overrides the measured default).
Status agreeCrossover(Group::Impl& g, GpuPath& p, Bootstrap& boot) {
    std::uint64_t mine[2] = {~0ull, ~0ull};
    if (p.ipc) mine[0] = mine[1] = ipcNcclAbove(g.world);
    if (g.env.ncclAbove) mine[0] = mine[1] = *g.env.ncclAbove;
    std::vector<std::uint64_t> all(2 * g.world);
    if (auto s = boot.allGather(mine, all.data(), sizeof mine); !s) return s;
    for (std::uint32_t r = 0; r < g.world; ++r) {
        p.ncclAboveGather = std::min(p.ncclAboveGather, all[2 * r]);
        p.ncclAboveSum = std::min(p.ncclAboveSum, all[2 * r + 1]);
    }
    return okStatus();
}

// Tell the daemon the wires the kernels take and the device region held
// (status), and so whether they ever ring the proxy: it polls the ring only
// then. No reply; a daemon that cannot be told is gone, which the calls'
// heartbeat watch and check() report, so the open does not fail for it.
void reportAttach(Group::Impl& g, const GpuPath& p) {
    if (!g.socket) return;
    DeviceAttach m{};
    m.group = g.handle;
    m.rank = g.rank;
    m.world = g.world;
    m.deviceBytes = p.own.handle ? p.own.bytes : 0; // held even where a vote left ipc off
    g.deviceBytes = m.deviceBytes;                   // told again to a restarted daemon (Adopt)
    std::memcpy(m.wires, g.wires.data(), kMaxWorld);
    m.wires[g.rank] = kWireSelf;
    (void)sendMessage(g.socket.get(), encode(kDeviceAttach, g.seq++, m), {}, 1000);
}

} // namespace

GpuPath::~GpuPath() {
    if (state) kernels::destroyDeviceState(state);
    if (stats) TPF_GPU_CLEANUP(cudaFree(stats));
    if (scratch) TPF_GPU_CLEANUP(cudaFree(scratch));
    auto unmap = [](DeviceMapping& m) {
        if (m.ptr) {
            TPF_GPU_CLEANUP(drv().unmap(m.ptr, m.bytes));
            TPF_GPU_CLEANUP(drv().addressFree(m.ptr, m.bytes));
        }
        if (m.handle) TPF_GPU_CLEANUP(drv().release(m.handle));
    };
    for (auto& m : peers) unmap(m);
    unmap(own);
    if (regionHost) TPF_GPU_CLEANUP(cudaHostUnregister(regionHost));
    if (ringHost) TPF_GPU_CLEANUP(cudaHostUnregister(ringHost));
}

void GpuPathDeleter::operator()(GpuPath* p) const { delete p; }

Status gpuAttach(Group::Impl& g, Bootstrap& boot) {
    g.gpu.reset(new GpuPath);
    GpuPath& p = *g.gpu;
    p.comm = fallbackComm(g.options, boot);
    if (g.world == 1) {
        TPF_GPU_TRY(cudaGetDevice(&p.device));
        return okStatus();
    }
    const GpuRoute want = gpuRouteOf(g);
    // Peers on this node may take ipc; peers on other nodes keep the proxy
    // route (verbs), in the same call. A test may say which ranks count as
    // another node (testing::setTestNodes), since one machine is one node.
    std::uint32_t ipcPeers = 0, otherPeers = 0;
    const auto& nodes = testing::testNodes();
    const bool testNodes = nodes.size() >= g.world;
    for (std::uint32_t q = 0; q < g.world; ++q) {
        if (q == g.rank) continue;
        const bool sameNode = g.wires[q] == kWireShm && (!testNodes || nodes[q] == nodes[g.rank]);
        (sameNode ? ipcPeers : otherPeers) |= 1u << q;
    }

    Status s = attachHost(g, p);
    bool ipc = want != GpuRoute::Proxy && ipcPeers != 0;
    if (s && ipc) {
        const Status own = createOwnRegion(g, p);
        if (!own) {
            if (want == GpuRoute::Ipc) s = own;
            ipc = false;
        }
    }
    if (s = vote(boot, s, "GPU attach", &ipc); !s) return s;
    if (want == GpuRoute::Ipc && !ipc) return Error{Errc::Unsupported, "ipc route requested but a rank has no device region"};
    if (ipc) {
        bool llAll = p.llWanted && otherPeers == 0;
        if (s = vote(boot, shareRegions(g, p), "device region sharing", &llAll); !s) return s;
        p.ipc = otherPeers == 0;
        p.view.region = reinterpret_cast<std::uint8_t*>(p.own.ptr); // ipc peers deliver here; the rest stays in hostRegion
        for (std::uint32_t q = 0; q < g.world; ++q)
            if (ipcPeers >> q & 1u) {
                g.wires[q] = kWireIpc;
                p.view.wires[q] = kWireIpc;
                p.view.peerRegions[q] = reinterpret_cast<std::uint8_t*>(p.peers[q].ptr);
            }
        if (llAll) kernels::enableLowLatency(p.view);
        // TPF_GPU_LL_CHUNKS=1|2|4: chunks per thread of multi-block LL calls (a tuning knob; the bench compares them).
        if (g.env.llChunks) p.view.llChunks = g.env.llChunks;
    }
    // Warps polling proxy-route flags in host memory (docs/gpu.md, "Polling host memory"); rank-local.
    p.view.pollWarps = g.env.pollWarps;
    // Programmatic dependent launch hides each call's launch gap (docs/gpu.md); sm_90 and later, TPF_GPU_PDL=0 off.
    int major = 0;
    if (s && g.env.pdl && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, p.device) == cudaSuccess)
        p.view.pdl = major >= 9 ? 1 : 0;
    if (Errc e = kernels::validateView(p.view); e != Errc::Ok)
        s = Error{e, "device view of the group is invalid"};
    if (s = vote(boot, s, "device view"); !s) return s;
    if (p.comm)
        if (s = vote(boot, agreeCrossover(g, p, boot), "NCCL crossover"); !s) return s;
    if (!g.options.skipProbe) {
        if (s = vote(boot, probe(g, p, boot), "load-time probe"); !s) return s;
        // The probe's calls are not the engine's: the counts start at zero.
        TPF_GPU_TRY(cudaMemset(p.stats, 0, sizeof(kernels::DeviceStats)));
        TPF_GPU_TRY(cudaDeviceSynchronize());
        std::memset(static_cast<void*>(&g.ring.stats()), 0, sizeof(RankStats));
    }
    reportAttach(g, p);
    return okStatus();
}

Status gpuFallback(Group::Impl& g, void* comm) {
    g.gpu.reset(new GpuPath);
    g.gpu->comm = comm;
    g.nccl = true;
    TPF_GPU_TRY(cudaGetDevice(&g.gpu->device));
    return okStatus();
}

const kernels::DeviceGroupView& testing::deviceView(const Group& g) { return GroupAccess::of(g).gpu->view; }

} // namespace tpf
