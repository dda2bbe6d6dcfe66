// The proxy thread: polls the command rings of open groups and carries each
// doorbell out on the wire of every peer (shm: copy + release store of the
// epoch flag). Busy-polls while there is work, sleeps on an eventfd after
// proxy.spin_us without any (idle CPU about 0), and never sleeps while a group
// with GPU doorbells is open (a kernel cannot write the eventfd).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/fd.hpp"
#include "daemon/shared_state.hpp"
#include "proto/client_msg.hpp"

namespace tpf::daemon {

/// What the proxy knows of one open group. Built by the control thread; the
/// proxy reads it, and only `broken` changes afterwards.
struct ProxyGroup {
    std::uint32_t handle = 0;
    std::uint32_t world = 0;
    Layout layout{};
    std::uint64_t agreedCap = 0;
    std::array<std::shared_ptr<HostRegion>, kMaxWorld> regions{}; ///< local ranks only
    std::array<std::uint8_t, kMaxWorld> routes{};                 ///< how this node reaches each rank
    bool gpuDoorbells = false;
    std::atomic<bool> broken{false};
};

/// One local rank the proxy serves: its group and its ring.
struct ProxyRank {
    std::shared_ptr<ProxyGroup> group;
    std::uint32_t rank = 0;
    std::shared_ptr<CommandRing> ring;
};

/// Events the proxy reports; called on the proxy thread (post them on).
struct ProxyEvents {
    /// Every doorbell published before table `version` was published is carried out.
    std::function<void(std::uint64_t version)> drained;
    /// A rank's doorbell or ring was invalid; its group must break.
    std::function<void(std::uint32_t groupHandle, std::uint32_t rank, Error why)> badDoorbell;
};

class Proxy {
public:
    Proxy(std::uint32_t spinUs, std::uint32_t heartbeatMs, int cpu, ProxyEvents events);
    ~Proxy();
    Proxy(const Proxy&) = delete;
    Proxy& operator=(const Proxy&) = delete;

    Status start();
    void stop();

    /// Replace the set of served ranks (control thread). The proxy drains the
    /// old set before switching and then reports drained(version).
    void publish(std::vector<ProxyRank> table, std::uint64_t version);

    /// The eventfd clients write to wake an idle proxy (dup it for each client).
    int eventFd() const { return eventFd_.get(); }
    void wake() const;

    std::uint64_t doorbells() const { return doorbells_.load(std::memory_order_relaxed); }
    bool sleeping() const { return sleeping_.load(std::memory_order_relaxed); }
    int cpu() const { return cpu_; }

private:
    void run();
    std::size_t pollOnce(std::vector<ProxyRank>& table);
    void deliver(ProxyRank& pr, const Doorbell& d);
    bool goIdle(std::vector<ProxyRank>& table);

    const std::uint64_t spinNs_;
    const std::uint32_t heartbeatMs_;
    const int cpu_;
    ProxyEvents events_;
    UniqueFd eventFd_;
    std::thread thread_;
    std::atomic<bool> running_{false};
    std::atomic<bool> sleeping_{false};
    std::atomic<std::uint64_t> doorbells_{0};

    std::mutex mutex_; // guards pending_, pendingVersion_
    std::vector<ProxyRank> pending_;
    std::uint64_t pendingVersion_ = 0;
    std::atomic<std::uint64_t> publishedVersion_{0};
};

} // namespace tpf::daemon
