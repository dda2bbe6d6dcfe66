// Helper threads that copy parts of one large shard beside the proxy thread
// (proxy.carry_threads). One proxy thread copying every local rank's shard
// into every peer's region in turn was the one-host proxy route's cost at
// 64 KiB and above; three cores copying parts of each shard took a GPU
// call of 64 KiB from 22.3 to 16.8 us and of 512 KiB from 85.7 to 54.7
// (docs/perf.md, 2026-12-02 10:50).
//
// The proxy posts a copy as chunks; the helpers that are awake and the proxy
// itself claim chunks from one counter, and the proxy returns once every
// chunk is stored. Helpers busy-poll for proxy.spin_us after their last
// chunk, then sleep on a futex (std::atomic::wait), so an idle pool costs
// no CPU. Helpers asleep when a copy comes are woken after it (wakeIdle(),
// once the proxy released the copy's flags), awake then for the calls that
// follow: waking them first delayed the copy itself at every size, since a
// helper takes longer to run than the copy (bench/carry_bench.cpp,
// docs/perf.md).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include <tpfabric/error.hpp>

namespace tpf::daemon {

class CarryPool {
public:
    /// Copies below this many bytes are the proxy's alone. Measured on the
    /// GPU machine (docs/perf.md, 2026-12-02 10:50): split from 16 KiB, the
    /// proxy route gained nothing at 16 and 32 KiB and 0.76x at 64 KiB.
    static constexpr std::size_t kSplitMin = 64 * 1024;
    /// No chunk is smaller than this (a multiple of 64: whole lines, and the
    /// 16-byte alignment streamLines needs is kept from chunk to chunk).
    static constexpr std::size_t kChunkMin = 8 * 1024;

    /// threads: helper threads (0: the proxy copies alone); spinUs: how long
    /// an idle helper busy-polls before it sleeps.
    CarryPool(std::uint32_t threads, std::uint32_t spinUs);
    ~CarryPool();
    CarryPool(const CarryPool&) = delete;
    CarryPool& operator=(const CarryPool&) = delete;

    Status start();
    void stop();

    /// Proxy thread only: copies n bytes from `from` to `to` (not
    /// overlapping). stream: non-temporal stores (streamLines) for a GPU
    /// reader, fenced before this returns. Every byte is stored, and visible
    /// to a release store after the call, when it returns.
    void copy(void* to, const void* from, std::size_t n, bool stream);
    /// Proxy thread only, after the flags of its copies are released: wake
    /// the helpers that slept through a copy (cheap when none did).
    void wakeIdle() {
        if (wakeDue_) wakeDue_ = false, gen_.notify_all();
    }

    std::uint32_t threads() const { return std::uint32_t(threads_.size()); }
    /// Chunks the helpers copied since start: status's daemon.proxy.carry_parts, how much they took.
    std::uint64_t parts() const { return parts_.load(std::memory_order_relaxed); }

private:
    void helper();
    /// Claim and copy chunks of generation gen until none is left; returns how many this thread copied.
    std::uint32_t work(std::uint32_t gen);

    const std::uint32_t count_;
    const std::uint64_t spinNs_;
    bool wakeDue_ = false; ///< proxy thread: helpers slept through a copy
    std::vector<std::thread> threads_;
    std::atomic<bool> running_{false};

    // The copy in progress. Fields are written by the proxy before it
    // publishes gen_ (release) and not again until every chunk is done.
    std::atomic<std::uint8_t*> to_{nullptr};
    std::atomic<const std::uint8_t*> from_{nullptr};
    std::atomic<std::size_t> bytes_{0};
    std::atomic<std::size_t> chunkBytes_{0};
    std::atomic<std::uint32_t> chunks_{0};
    std::atomic<bool> stream_{false};
    alignas(64) std::atomic<std::uint32_t> gen_{0};   ///< copy generation; the helpers' futex word
    alignas(64) std::atomic<std::uint64_t> claim_{0}; ///< gen << 32 | next chunk to claim
    alignas(64) std::atomic<std::uint32_t> done_{0};  ///< chunks of the current copy stored
    alignas(64) std::atomic<std::uint32_t> sleepers_{0};
    std::atomic<std::uint64_t> parts_{0};
};

} // namespace tpf::daemon
