// The in-flight byte cap of one queue pair (DESIGN.md §4 step 2): the proxy
// asks mustWait() before it posts a peer stripe and polls completions while
// it is true, so a post adds at most one payload past the cap and the bytes
// outstanding on a QP never exceed cap + the largest payload.
#pragma once

#include <atomic>
#include <cstdint>

namespace tpf::daemon {

class InflightGate {
public:
    explicit InflightGate(std::uint64_t capBytes = 0, std::uint32_t maxWrs = 0) : cap_(capBytes), maxWrs_(maxWrs) {}
    /// Set the limits of a gate with nothing outstanding.
    void reset(std::uint64_t capBytes, std::uint32_t maxWrs) {
        cap_ = capBytes;
        maxWrs_ = maxWrs;
        bytes_ = 0;
        wrs_ = 0;
        highWater_.store(0, std::memory_order_relaxed);
    }

    /// True while posting `wrs` more work requests must wait for completions:
    /// the bytes outstanding reached the cap, or the send queue has no room.
    bool mustWait(std::uint32_t wrs) const { return bytes_ >= cap_ || wrs_ + wrs > maxWrs_; }
    /// A post of `bytes` in `wrs` work requests went out (proxy thread only).
    void posted(std::uint64_t bytes, std::uint32_t wrs) {
        bytes_ += bytes;
        wrs_ += wrs;
        if (bytes_ > highWater_.load(std::memory_order_relaxed)) highWater_.store(bytes_, std::memory_order_relaxed);
    }
    /// A signaled completion retired a post of `bytes` in `wrs` work requests.
    void retired(std::uint64_t bytes, std::uint32_t wrs) {
        bytes_ -= bytes;
        wrs_ -= wrs;
    }

    std::uint64_t bytes() const { return bytes_; }
    std::uint32_t wrs() const { return wrs_; }
    std::uint64_t cap() const { return cap_; }
    /// Most bytes ever outstanding at once; read by status on another thread.
    std::uint64_t highWater() const { return highWater_.load(std::memory_order_relaxed); }

private:
    std::uint64_t cap_;
    std::uint32_t maxWrs_;
    std::uint64_t bytes_ = 0;
    std::uint32_t wrs_ = 0;
    std::atomic<std::uint64_t> highWater_{0};
};

} // namespace tpf::daemon
