#include "tests/gpu/sim_group.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "proto/client_msg.hpp"
#include "proto/ring.hpp"

namespace tpf::gputest {

namespace {

constexpr std::uint32_t kGroupHandle = 0x5eed;
constexpr std::uint32_t kRingEntries = 64;

// A sealed-memfd stand-in: the daemon's regions and rings are memfds mapped
// MAP_SHARED, which cudaHostRegister accepts (notes/device.md).
std::uint8_t* mapMemfd(const char* name, std::uint64_t bytes, int& fd) {
    fd = ::memfd_create(name, MFD_CLOEXEC);
    if (fd < 0) throw std::runtime_error(std::string("memfd_create: ") + std::strerror(errno));
    if (::ftruncate(fd, off_t(bytes)) != 0) throw std::runtime_error(std::string("ftruncate: ") + std::strerror(errno));
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) throw std::runtime_error(std::string("mmap: ") + std::strerror(errno));
    std::memset(p, 0, bytes);
    return static_cast<std::uint8_t*>(p);
}

std::uint8_t* registerMapped(std::uint8_t* host, std::uint64_t bytes) {
    TPF_CUDA_CHECK(cudaHostRegister(host, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
    void* dev = nullptr;
    TPF_CUDA_CHECK(cudaHostGetDevicePointer(&dev, host, 0));
    return static_cast<std::uint8_t*>(dev);
}

} // namespace

const char* wireName(Wire w) {
    switch (w) {
    case Wire::Ipc: return "ipc";
    case Wire::Proxy: return "proxy";
    case Wire::Mixed: return "mixed";
    }
    return "?";
}

std::uint8_t SimGroup::routeOf(std::uint32_t from, std::uint32_t to) const {
    if (from == to) return kWireSelf;
    switch (o_.wire) {
    case Wire::Ipc: return kWireIpc;
    case Wire::Proxy: return kWireShm;
    case Wire::Mixed: return from / 2 == to / 2 ? kWireIpc : kWireShm;
    }
    return kWireShm;
}

SimGroup::SimGroup(const SimOptions& o) : o_(o), ranks_(o.world) {
    auto l = Layout::of(o.world, o.slotBytes, o.stripes);
    if (!l) throw std::runtime_error("Layout::of: " + l.error().describe());
    layout_ = *l;
    ringLayout_.entries = kRingEntries;
    const std::uint64_t total = layout_.totalBytes();
    TPF_CUDA_CHECK(cudaStreamCreateWithFlags(&ctrlStream_, cudaStreamNonBlocking));
    TPF_CUDA_CHECK(cudaMallocHost(&staging_, sizeof(ControlBlock)));
    bool anyProxy = false;
    for (std::uint32_t r = 0; r < o.world; ++r)
        for (std::uint32_t q = 0; q < o.world; ++q)
            anyProxy |= routeOf(r, q) == kWireShm;

    for (std::uint32_t r = 0; r < o.world; ++r) {
        Rank& k = ranks_[r];
        ControlBlock init{};
        init.missingPeer = kNoPeer;
        if (hostRegions()) {
            k.host = mapMemfd("tpf-region", total, k.fd);
            std::memcpy(k.host + layout_.controlOffset(), &init, sizeof init);
            k.dev = registerMapped(k.host, total);
        } else {
            // Device regions carry the LL area too (kernels/collectives.hpp); ipc-only groups use it.
            TPF_CUDA_CHECK(cudaMalloc(&k.dev, kernels::regionBytesWithLl(layout_)));
            TPF_CUDA_CHECK(cudaMemset(k.dev, 0, kernels::regionBytesWithLl(layout_)));
            TPF_CUDA_CHECK(cudaMemcpy(k.dev + layout_.controlOffset(), &init, sizeof init, cudaMemcpyHostToDevice));
        }
        if (anyProxy) {
            k.ringHost = mapMemfd("tpf-ring", ringLayout_.totalBytes(), k.ringFd);
            auto* h = reinterpret_cast<RingHeader*>(k.ringHost);
            h->magic = kRingMagic;
            h->version = kRingVersion;
            h->entryBytes = sizeof(Doorbell);
            h->entries = kRingEntries;
            h->group = kGroupHandle;
            k.ringDev = registerMapped(k.ringHost, ringLayout_.totalBytes());
        }
        TPF_CUDA_CHECK(kernels::createDeviceState(&k.state, 0, 0));
        TPF_CUDA_CHECK(cudaStreamCreateWithFlags(&k.stream, cudaStreamNonBlocking));
    }
    for (std::uint32_t r = 0; r < o.world; ++r) {
        Rank& k = ranks_[r];
        kernels::DeviceGroupView& v = k.view;
        v.layout = layout_;
        v.rank = r;
        v.world = o.world;
        v.region = k.dev;
        v.hostRegion = k.dev; // no simulated group mixes wires
        v.control = reinterpret_cast<ControlBlock*>(k.dev + layout_.controlOffset());
        for (std::uint32_t q = 0; q < o.world; ++q) {
            v.wires[q] = routeOf(r, q);
            if (v.wires[q] == kWireIpc) v.peerRegions[q] = ranks_[q].dev;
        }
        v.ring = k.ringDev;
        v.ringLayout = ringLayout_;
        v.groupHandle = kGroupHandle;
        v.state = k.state;
        v.timeoutNs = o.timeoutNs;
        v.maxBlocks = o.maxBlocks;
        if (o.wire == Wire::Ipc && !std::getenv("TPF_GPU_LL_OFF")) kernels::enableLowLatency(v);
        // Launched as the library launches them (programmatic dependent launch), unless TPF_GPU_PDL=0.
        const char* pdl = std::getenv("TPF_GPU_PDL");
        v.pdl = pdl && *pdl == '0' ? 0 : 1;
        if (Errc e = kernels::validateView(v); e != Errc::Ok)
            throw std::runtime_error("validateView: " + std::string(errcName(e)));
    }
    TPF_CUDA_CHECK(cudaDeviceSynchronize()); // the memsets and copies above land before any rank's kernel
    if (anyProxy) proxy_ = std::thread([this] { proxyLoop(); });
}

SimGroup::~SimGroup() {
    stop_ = true;
    if (proxy_.joinable()) proxy_.join();
    cudaDeviceSynchronize();
    const std::uint64_t total = layout_.totalBytes();
    for (Rank& k : ranks_) {
        if (k.stream) cudaStreamDestroy(k.stream);
        if (k.state) kernels::destroyDeviceState(k.state);
        if (k.host) {
            cudaHostUnregister(k.host);
            ::munmap(k.host, total);
            ::close(k.fd);
        } else if (k.dev) {
            cudaFree(k.dev);
        }
        if (k.ringHost) {
            cudaHostUnregister(k.ringHost);
            ::munmap(k.ringHost, ringLayout_.totalBytes());
            ::close(k.ringFd);
        }
    }
    if (ctrlStream_) cudaStreamDestroy(ctrlStream_);
    if (staging_) cudaFreeHost(staging_);
}

void SimGroup::syncAll() const {
    for (const Rank& k : ranks_) TPF_CUDA_CHECK(cudaStreamSynchronize(k.stream));
}

void SimGroup::daemonWrite(std::uint32_t r, std::uint32_t error, std::uint32_t missingPeer, std::uint32_t abort) {
    Rank& k = ranks_[r];
    if (k.host) {
        auto* cb = reinterpret_cast<ControlBlock*>(k.host + layout_.controlOffset());
        std::atomic_ref(cb->missingPeer).store(missingPeer, std::memory_order_relaxed);
        std::atomic_ref(cb->abort).store(abort, std::memory_order_relaxed);
        std::atomic_ref(cb->error).store(error, std::memory_order_release);
        return;
    }
    // Device region: copies on their own stream, concurrent with the spinning kernels.
    staging_->missingPeer = missingPeer;
    staging_->error = error;
    staging_->abort = abort;
    std::uint8_t* cb = k.dev + layout_.controlOffset();
    TPF_CUDA_CHECK(cudaMemcpyAsync(cb + offsetof(ControlBlock, error), &staging_->error, 8, cudaMemcpyHostToDevice,
                                   ctrlStream_));
    TPF_CUDA_CHECK(cudaMemcpyAsync(cb + offsetof(ControlBlock, abort), &staging_->abort, 4, cudaMemcpyHostToDevice,
                                   ctrlStream_));
    TPF_CUDA_CHECK(cudaStreamSynchronize(ctrlStream_));
}

kernels::CallFailure SimGroup::failure(std::uint32_t r) const {
    kernels::CallFailure f;
    TPF_CUDA_CHECK(kernels::readFailure(ranks_[r].view, f));
    return f;
}

kernels::DeviceState SimGroup::state(std::uint32_t r) const {
    kernels::DeviceState s;
    TPF_CUDA_CHECK(kernels::readDeviceState(ranks_[r].state, s));
    return s;
}

void SimGroup::setEpoch(std::uint64_t next) {
    syncAll();
    for (Rank& k : ranks_) {
        const kernels::DeviceState now = [&] {
            kernels::DeviceState s;
            TPF_CUDA_CHECK(kernels::readDeviceState(k.state, s));
            return s;
        }();
        TPF_CUDA_CHECK(kernels::writeDeviceState(k.state, next - 1, now.ringHead));
        k.lastEpoch = next - 1;
    }
}

void SimGroup::plantLlLines(std::uint32_t r, std::uint32_t phase, std::uint32_t src, std::uint64_t from,
                            std::uint64_t to, std::uint32_t flag) {
    const kernels::DeviceGroupView& v = ranks_[r].view;
    if (v.ll.world == 0 || to * 16 > v.ll.slotBytes) throw std::runtime_error("plantLlLines: no LL area or out of the slot");
    std::vector<std::uint32_t> lines(4 * (to - from));
    for (std::size_t i = 0; i < lines.size(); i += 4) lines[i] = lines[i + 2] = 0xdeadbeef, lines[i + 1] = lines[i + 3] = flag;
    TPF_CUDA_CHECK(cudaMemcpy(v.region + v.llOffset + v.ll.slotOffset(phase, src) + from * 16, lines.data(),
                              lines.size() * 4, cudaMemcpyHostToDevice));
}

std::string SimGroup::proxyError() const {
    return proxyFailed_.load(std::memory_order_acquire) ? proxyError_ : std::string();
}

void SimGroup::proxyFail(const std::string& why) {
    if (proxyFailed_.load()) return;
    proxyError_ = why;
    proxyFailed_.store(true, std::memory_order_release);
}

// The daemon proxy's shm wire, as daemon/proxy.cpp does it: per doorbell,
// each shm peer in peerAt order, each stripe: memcpy, then release the flag
// (its copies: proto/layout.hpp).
void SimGroup::proxyLoop() {
    std::vector<RingView> rings;
    for (Rank& k : ranks_) rings.emplace_back(k.ringHost, ringLayout_);
    while (!stop_.load(std::memory_order_relaxed)) {
        for (std::uint32_t r = 0; r < o_.world; ++r) {
            Rank& k = ranks_[r];
            Doorbell d;
            const auto got = rings[r].pop(k.tail, d);
            if (got == RingView::Pop::Empty) continue;
            if (got == RingView::Pop::Corrupt) return proxyFail("rank " + std::to_string(r) + ": ring head corrupt");
            if (d.group != kGroupHandle || d.epoch != k.lastEpoch + 1 || d.bytes > layout_.slotBytes)
                return proxyFail("rank " + std::to_string(r) + ": bad doorbell epoch " + std::to_string(d.epoch) +
                                 " after " + std::to_string(k.lastEpoch) + ", bytes " + std::to_string(d.bytes) +
                                 ", group " + std::to_string(d.group));
            k.lastEpoch = d.epoch;
            const std::uint32_t p = phaseOf(d.epoch);
            const std::uint8_t* src = k.host + layout_.slotOffset(p, r);
            for (std::uint32_t i = 0; i + 1 < o_.world; ++i) {
                const std::uint32_t q = peerAt(r, i, o_.world);
                if (routeOf(r, q) != kWireShm) continue;
                std::uint8_t* dst = ranks_[q].host;
                for (std::uint32_t s = 0; s < layout_.stripes; ++s) {
                    const Stripe st = stripeOf(d.bytes, layout_.stripes, s);
                    std::memcpy(dst + layout_.slotOffset(p, r) + st.offset, src + st.offset, st.bytes);
                    // Every copy of the flag, as the daemon does for Device groups, except
                    // on every third epoch copy 0 alone, as an RDMA WRITE of the flag does:
                    // the kernel's lead poller alone sees those.
                    const std::uint32_t copies = d.epoch % 3 == 0 ? 1 : kFlagCopies;
                    for (std::uint32_t c = 0; c < copies; ++c) {
                        auto* flag = reinterpret_cast<std::uint64_t*>(dst + layout_.flagCopyOffset(p, r, s, c));
                        std::atomic_ref(*flag).store(d.epoch, std::memory_order_release);
                    }
                }
            }
            doorbells_.fetch_add(1, std::memory_order_relaxed);
        }
    }
}

} // namespace tpf::gputest
