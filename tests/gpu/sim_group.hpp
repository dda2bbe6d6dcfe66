// W simulated ranks of one group in ONE process on one GPU, one stream each.
//   Wire::Ipc   : regions are cudaMalloc'd device memory; every peer is an
//                 ipc peer (the kernels store into each other's slots).
//   Wire::Proxy : regions and command rings are memfd mappings registered
//                 with cudaHostRegister(Mapped|Portable); every peer is a shm
//                 peer; a CPU thread plays the daemon proxy (pops doorbells
//                 with RingView, copies the staged shard into each peer's
//                 slot in peerAt order, stripe by stripe, release-stores the
//                 flag). A unit-test stand-in for daemon/proxy.cpp.
//   Wire::Mixed : host regions; ranks r, q with r/2 == q/2 are ipc peers,
//                 the others shm peers through the proxy thread.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/collectives.hpp"

namespace tpf::gputest {

#define TPF_CUDA_CHECK(call)                                                                                  \
    do {                                                                                                      \
        const cudaError_t tpf_err_ = (call);                                                                  \
        if (tpf_err_ != cudaSuccess)                                                                          \
            throw std::runtime_error(std::string(#call) + " at " + __FILE__ + ":" + std::to_string(__LINE__) + \
                                     ": " + cudaGetErrorString(tpf_err_));                                    \
    } while (0)

enum class Wire { Ipc, Proxy, Mixed };
const char* wireName(Wire w);

struct SimOptions {
    std::uint32_t world = 2;
    Wire wire = Wire::Ipc;
    std::uint32_t stripes = 1;
    std::uint64_t slotBytes = 512 * 1024;
    std::uint64_t timeoutNs = 2'000'000'000;
    std::uint32_t maxBlocks = 0;
};

class SimGroup {
public:
    explicit SimGroup(const SimOptions& o);
    ~SimGroup();
    SimGroup(const SimGroup&) = delete;
    SimGroup& operator=(const SimGroup&) = delete;

    std::uint32_t world() const { return o_.world; }
    const SimOptions& options() const { return o_; }
    const kernels::DeviceGroupView& view(std::uint32_t r) const { return ranks_[r].view; }
    cudaStream_t stream(std::uint32_t r) const { return ranks_[r].stream; }
    void syncAll() const;

    /// What the daemon would write into rank r's control block.
    void daemonWrite(std::uint32_t r, std::uint32_t error, std::uint32_t missingPeer, std::uint32_t abort);
    kernels::CallFailure failure(std::uint32_t r) const;
    kernels::DeviceState state(std::uint32_t r) const;
    /// Every rank's next call gets epoch `next` (the streams are idle).
    void setEpoch(std::uint64_t next);
    /// Lines [from, to) of slot (phase, src) of rank r's LL area (ipc wire)
    /// set to {0xdeadbeef, flag, 0xdeadbeef, flag}: what an old call left.
    void plantLlLines(std::uint32_t r, std::uint32_t phase, std::uint32_t src, std::uint64_t from, std::uint64_t to,
                      std::uint32_t flag);
    /// Doorbells the proxy thread carried out, and the first protocol
    /// violation it saw ("" if none).
    std::uint64_t doorbells() const { return doorbells_.load(); }
    std::string proxyError() const;

private:
    struct Rank {
        std::uint8_t* host = nullptr;  // host mapping (host regions)
        std::uint8_t* dev = nullptr;   // device-accessible region
        int fd = -1;
        std::uint8_t* ringHost = nullptr;
        std::uint8_t* ringDev = nullptr;
        int ringFd = -1;
        std::uint32_t tail = 0;        // proxy's private subTail
        std::uint64_t lastEpoch = 0;   // proxy's last epoch seen from this rank
        kernels::DeviceState* state = nullptr;
        cudaStream_t stream = nullptr;
        kernels::DeviceGroupView view{};
    };
    bool hostRegions() const { return o_.wire != Wire::Ipc; }
    std::uint8_t routeOf(std::uint32_t from, std::uint32_t to) const;
    void proxyLoop();
    void proxyFail(const std::string& why);

    SimOptions o_;
    Layout layout_{};
    RingLayout ringLayout_{};
    std::vector<Rank> ranks_;
    cudaStream_t ctrlStream_ = nullptr;
    ControlBlock* staging_ = nullptr; // pinned source of daemonWrite's copies
    std::thread proxy_;
    std::atomic<bool> stop_{false};
    std::atomic<std::uint64_t> doorbells_{0};
    std::atomic<bool> proxyFailed_{false};
    std::string proxyError_;
};

} // namespace tpf::gputest
