// Helper threads that copy beside the proxy thread (proxy.carry_threads):
// parts of a large row, or a doorbell's small rows at once. One proxy
// thread copying every local rank's shard into every peer's region in turn
// is the one-host proxy route's cost at 64 KiB and above; three cores
// copying parts of each shard take a GPU call of 64 KiB from 22.3 to 16.8
// us and of 512 KiB from 85.7 to 54.7.
//
// The proxy posts a batch of copies (the same-node rows of one doorbell, one
// to each peer) as chunks: a row below kSplitMin is one chunk, a larger one
// is split in parts; the helpers that are awake and the proxy itself claim
// chunks from one counter, and the proxy returns once every chunk is stored.
// A batch below kSplitMin in all is the proxy's alone. Helpers busy-poll for
// proxy.spin_us after their last chunk, then sleep on a futex
// (std::atomic::wait), so an idle pool costs no CPU. Helpers asleep when a
// copy comes are woken after it (wakeIdle(), once the proxy released the
// copy's flags), awake then for the calls that follow: waking them first
// delays the copy itself at every size, since a helper takes longer to run
// than the copy (bench/carry_bench.cpp measures it).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <thread>
#include <vector>

#include <tpfabric/error.hpp>

namespace tpf::daemon {

/// One copy of a batch: `bytes` from `from` to `to`, not overlapping any
/// other of the batch. stream: non-temporal stores (streamLines), for a GPU
/// reader.
struct CarryItem {
    void* to = nullptr;
    const void* from = nullptr;
    std::size_t bytes = 0;
    bool stream = false;
};

class CarryPool {
public:
    /// Copies below this many bytes are one chunk, and batches below it the
    /// proxy's alone: split from 16 KiB, the proxy route gains nothing at 16
    /// and 32 KiB and takes 0.76x the time at 64 KiB.
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

    /// Proxy thread only: every copy of the batch. Every byte is stored (the
    /// streamed ones fenced), and visible to a release store after the call,
    /// when it returns.
    void copy(std::span<const CarryItem> batch);
    /// Whether a batch of this many bytes in all goes to the helpers too
    /// (else the proxy copies it alone).
    bool shares(std::size_t bytes) const { return count_ != 0 && bytes >= kSplitMin; }
    /// A batch of one.
    void copy(void* to, const void* from, std::size_t n, bool stream) {
        const CarryItem one{to, from, n, stream};
        copy(std::span(&one, 1));
    }
    /// Proxy thread only, after the flags of its copies are released: wake
    /// the helpers that slept through a copy (cheap when none did).
    void wakeIdle() {
        if (wakeDue_) wakeDue_ = false, gen_.notify_all();
    }

    std::uint32_t threads() const { return std::uint32_t(threads_.size()); }
    /// Chunks the helpers copied since start: status's daemon.proxy.carry_parts, how much they took.
    std::uint64_t parts() const { return parts_.load(std::memory_order_relaxed); }

private:
    /// Chunks a shared round holds; a batch of more is copied in rounds.
    static constexpr std::size_t kChunksMax = 256;
    /// One chunk of the round in progress, written by the proxy before it
    /// publishes gen_ (atomics: a helper late from an older round may read
    /// one while it is rewritten, and then fails its claim).
    struct Chunk {
        std::atomic<std::uint8_t*> to{nullptr};
        std::atomic<const std::uint8_t*> from{nullptr};
        std::atomic<std::size_t> bytes{0};
        std::atomic<bool> stream{false};
    };

    void helper();
    /// Claim and copy chunks of generation gen until none is left; returns how many this thread copied.
    std::uint32_t work(std::uint32_t gen);
    /// The proxy, before it writes a round's chunks: closes claim_ to the
    /// last round's helpers; returns the new round's generation.
    std::uint32_t open();
    /// The proxy: publishes the first `chunks` of chunk_ as round gen and
    /// copies them with the helpers; returns once every one is stored.
    void share(std::uint32_t gen, std::uint32_t chunks);

    const std::uint32_t count_;
    const std::uint64_t spinNs_;
    bool wakeDue_ = false; ///< proxy thread: helpers slept through a copy
    std::vector<std::thread> threads_;
    std::atomic<bool> running_{false};

    // The round in progress. Written by the proxy before it publishes gen_
    // (release) and not again until every chunk is done.
    std::array<Chunk, kChunksMax> chunk_;
    std::atomic<std::uint32_t> chunks_{0};
    alignas(64) std::atomic<std::uint32_t> gen_{0};   ///< copy generation; the helpers' futex word
    alignas(64) std::atomic<std::uint64_t> claim_{0}; ///< gen << 32 | next chunk to claim
    alignas(64) std::atomic<std::uint32_t> done_{0};  ///< chunks of the current copy stored
    alignas(64) std::atomic<std::uint32_t> sleepers_{0};
    std::atomic<std::uint64_t> parts_{0};
};

} // namespace tpf::daemon
