// The in-flight byte cap of one queue pair (docs/design.md, "4. Data path",
// step 2): the proxy asks mustWait() before it posts a peer stripe and polls
// completions while it is true, so a post adds at most one payload past the
// cap and the bytes outstanding on a QP never exceed cap + the largest payload.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

namespace tpf::daemon {

/// Owned by its QpLink; posted() and retireOldest() on the proxy thread only.
/// Every post is one signaled work request (the flag WRITE) that stands for
/// the whole post: its completion retires the post's bytes and requests, in
/// post order (an RC queue pair completes in order).
class InflightGate {
public:
    explicit InflightGate(std::uint64_t capBytes = 0, std::uint32_t maxWrs = 0) { reset(capBytes, maxWrs); }
    /// Set the limits of a gate with nothing outstanding.
    void reset(std::uint64_t capBytes, std::uint32_t maxWrs) {
        cap_ = capBytes;
        maxWrs_ = maxWrs;
        bytes_ = 0;
        wrs_ = 0;
        posts_.assign(maxWrs ? maxWrs : 1, Post{});
        head_ = tail_ = 0;
        highWater_.store(0, std::memory_order_relaxed);
    }

    /// True while posting `wrs` more work requests must wait for completions:
    /// the bytes outstanding reached the cap, or the send queue has no room.
    bool mustWait(std::uint32_t wrs) const { return bytes_ >= cap_ || wrs_ + wrs > maxWrs_; }
    /// A post of `bytes` in `wrs` work requests went out.
    void posted(std::uint64_t bytes, std::uint32_t wrs) {
        posts_[head_++ % posts_.size()] = Post{bytes, wrs};
        bytes_ += bytes;
        wrs_ += wrs;
        if (bytes_ > highWater_.load(std::memory_order_relaxed)) highWater_.store(bytes_, std::memory_order_relaxed);
    }
    /// The signaled completion of the oldest post outstanding arrived: its
    /// bytes and requests retire. False (nothing retired) if none is outstanding.
    bool retireOldest() {
        if (tail_ == head_) return false;
        const Post p = posts_[tail_++ % posts_.size()];
        bytes_ -= p.bytes;
        wrs_ -= p.wrs;
        return true;
    }

    std::uint64_t bytes() const { return bytes_; }
    std::uint32_t wrs() const { return wrs_; }
    std::uint64_t cap() const { return cap_; }
    /// Most bytes ever outstanding at once; read by status on another thread.
    std::uint64_t highWater() const { return highWater_.load(std::memory_order_relaxed); }

private:
    struct Post {
        std::uint64_t bytes = 0;
        std::uint32_t wrs = 0;
    };
    std::uint64_t cap_ = 0;
    std::uint32_t maxWrs_ = 0;
    std::uint64_t bytes_ = 0;
    std::uint32_t wrs_ = 0;
    std::vector<Post> posts_; ///< posts outstanding, oldest at tail_: at most maxWrs (a post is >= 1 request)
    std::uint32_t head_ = 0, tail_ = 0;
    std::atomic<std::uint64_t> highWater_{0};
};

} // namespace tpf::daemon
