#include "daemon/proxy/carry.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/cpu_relax.hpp"
#include "common/shm.hpp"
#include "common/stream_copy.hpp"

namespace tpf::daemon {

CarryPool::CarryPool(std::uint32_t threads, std::uint32_t spinUs)
    : count_(threads), spinNs_(std::uint64_t(spinUs) * 1000) {}

CarryPool::~CarryPool() { stop(); }

Status CarryPool::start() {
    running_.store(true, std::memory_order_relaxed);
    try {
        for (std::uint32_t i = 0; i < count_; ++i) threads_.emplace_back([this] { helper(); });
    } catch (const std::system_error& e) {
        stop();
        return {Errc::SystemError, std::string("starting the proxy's carry threads (proxy.carry_threads): ") + e.what()};
    }
    return okStatus();
}

void CarryPool::stop() {
    if (!running_.exchange(false)) return;
    gen_.fetch_add(1, std::memory_order_seq_cst); // no chunks: claim_ keeps the old generation
    gen_.notify_all();
    for (auto& t : threads_)
        if (t.joinable()) t.join();
    threads_.clear();
}

std::uint32_t CarryPool::work(std::uint32_t gen) {
    std::uint8_t* const to = to_.load(std::memory_order_relaxed);
    const std::uint8_t* const from = from_.load(std::memory_order_relaxed);
    const std::size_t bytes = bytes_.load(std::memory_order_relaxed);
    const std::size_t chunkBytes = chunkBytes_.load(std::memory_order_relaxed);
    const std::uint32_t chunks = chunks_.load(std::memory_order_relaxed);
    const bool stream = stream_.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire); // see copy(): fields of a newer copy mean claim_ is closed
    std::uint32_t copied = 0;
    std::uint64_t c = claim_.load(std::memory_order_relaxed);
    for (;;) {
        // A claim of an older copy (every chunk of it was claimed before the
        // proxy moved on) or past the last chunk fails: the fields read above
        // belong to gen whenever the exchange succeeds.
        if (std::uint32_t(c >> 32) != gen || std::uint32_t(c) >= chunks) break;
        if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acquire, std::memory_order_relaxed)) continue;
        const std::size_t off = std::size_t(std::uint32_t(c)) * chunkBytes;
        const std::size_t n = std::min(chunkBytes, bytes - off);
        if (stream) streamLines(to + off, from + off, n);
        else std::memcpy(to + off, from + off, n);
        ++copied;
        c = claim_.load(std::memory_order_relaxed);
    }
    if (copied) {
        if (stream) streamFence(); // this thread's non-temporal stores before done_
        done_.fetch_add(copied, std::memory_order_release);
    }
    return copied;
}

void CarryPool::helper() {
    std::uint32_t seen = gen_.load(std::memory_order_acquire);
    std::uint64_t lastWorkNs = monotonicNs();
    while (running_.load(std::memory_order_relaxed)) {
        const std::uint32_t gen = gen_.load(std::memory_order_acquire);
        if (gen != seen) {
            seen = gen;
            if (const std::uint32_t n = work(gen)) parts_.fetch_add(n, std::memory_order_relaxed);
            lastWorkNs = monotonicNs();
            continue;
        }
        if (monotonicNs() - lastWorkNs < spinNs_) {
            cpuRelax();
            continue;
        }
        // Dekker with copy(): announce the sleep, then look again (a helper
        // that still sleeps through a copy only misses that copy).
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        if (gen_.load(std::memory_order_seq_cst) == seen && running_.load(std::memory_order_relaxed))
            gen_.wait(seen, std::memory_order_acquire);
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
        lastWorkNs = monotonicNs();
    }
}

void CarryPool::copy(void* to, const void* from, std::size_t n, bool stream) {
    const std::size_t parts = std::min<std::size_t>(count_ + 1, n / kChunkMin);
    if (count_ == 0 || n < kSplitMin || parts < 2) {
        if (!stream) return void(std::memcpy(to, from, n));
        streamLines(to, from, n);
        streamFence();
        return;
    }
    const std::size_t chunkBytes = (n / parts + 63) & ~std::size_t(63);
    const auto chunks = std::uint32_t((n + chunkBytes - 1) / chunkBytes);
    const std::uint32_t gen = gen_.load(std::memory_order_relaxed) + 1;
    // Closed first: a helper still holding the last copy's generation, which
    // may read some of the fields below, can no longer claim a chunk (its
    // acquire fence in work() pairs with this release fence).
    claim_.store(std::uint64_t(gen) << 32 | 0xffffffffu, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    to_.store(static_cast<std::uint8_t*>(to), std::memory_order_relaxed);
    from_.store(static_cast<const std::uint8_t*>(from), std::memory_order_relaxed);
    bytes_.store(n, std::memory_order_relaxed);
    chunkBytes_.store(chunkBytes, std::memory_order_relaxed);
    chunks_.store(chunks, std::memory_order_relaxed);
    stream_.store(stream, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    claim_.store(std::uint64_t(gen) << 32, std::memory_order_relaxed);
    gen_.store(gen, std::memory_order_seq_cst); // publishes the fields above
    if (sleepers_.load(std::memory_order_seq_cst)) wakeDue_ = true; // woken in wakeIdle(), after the flags
    work(gen);
    while (done_.load(std::memory_order_acquire) != chunks) cpuRelax();
}

} // namespace tpf::daemon
