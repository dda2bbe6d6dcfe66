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
    const std::uint32_t chunks = chunks_.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire); // see open(): a newer round's count means claim_ is closed
    std::uint32_t copied = 0;
    bool streamed = false;
    std::uint64_t c = claim_.load(std::memory_order_relaxed);
    for (;;) {
        // A claim of an older round (every chunk of it was claimed before the
        // proxy moved on) or past the last chunk fails: a chunk is read only
        // once claimed, and then it is this round's.
        if (std::uint32_t(c >> 32) != gen || std::uint32_t(c) >= chunks) break;
        if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acquire, std::memory_order_relaxed)) continue;
        const Chunk& k = chunk_[std::uint32_t(c)];
        std::uint8_t* const to = k.to.load(std::memory_order_relaxed);
        const std::uint8_t* const from = k.from.load(std::memory_order_relaxed);
        const std::size_t n = k.bytes.load(std::memory_order_relaxed);
        if (k.stream.load(std::memory_order_relaxed)) streamLines(to, from, n), streamed = true;
        else std::memcpy(to, from, n);
        ++copied;
        c = claim_.load(std::memory_order_relaxed);
    }
    if (copied) {
        if (streamed) streamFence(); // this thread's non-temporal stores before done_
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

std::uint32_t CarryPool::open() {
    const std::uint32_t gen = gen_.load(std::memory_order_relaxed) + 1;
    // Closed first: a helper still in the last round, which may read the
    // count written after this, can no longer claim a chunk (its acquire
    // fence in work() pairs with this release fence).
    claim_.store(std::uint64_t(gen) << 32 | 0xffffffffu, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    return gen;
}

void CarryPool::share(std::uint32_t gen, std::uint32_t chunks) {
    chunks_.store(chunks, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    claim_.store(std::uint64_t(gen) << 32, std::memory_order_relaxed);
    gen_.store(gen, std::memory_order_seq_cst); // publishes the chunks and the count
    if (sleepers_.load(std::memory_order_seq_cst)) wakeDue_ = true; // woken in wakeIdle(), after the flags
    work(gen);
    while (done_.load(std::memory_order_acquire) != chunks) cpuRelax();
}

void CarryPool::copy(std::span<const CarryItem> batch) {
    std::size_t total = 0;
    for (const CarryItem& c : batch) total += c.bytes;
    if (!shares(total)) {
        bool streamed = false;
        for (const CarryItem& c : batch) {
            if (c.stream) streamLines(c.to, c.from, c.bytes), streamed = true;
            else std::memcpy(c.to, c.from, c.bytes);
        }
        if (streamed) streamFence();
        return;
    }
    std::uint32_t gen = open(), n = 0;
    for (const CarryItem& c : batch) {
        // A copy below kSplitMin is one chunk; a larger one count_ + 1 parts
        // of at least kChunkMin, whole lines but for the last.
        const std::size_t parts =
            c.bytes < kSplitMin ? 1 : std::max<std::size_t>(1, std::min<std::size_t>(count_ + 1, c.bytes / kChunkMin));
        const std::size_t per = parts == 1 ? c.bytes : (c.bytes / parts + 63) & ~std::size_t(63);
        for (std::size_t off = 0; off < c.bytes; off += per) {
            if (n == kChunksMax) share(gen, n), gen = open(), n = 0;
            Chunk& k = chunk_[n++];
            k.to.store(static_cast<std::uint8_t*>(c.to) + off, std::memory_order_relaxed);
            k.from.store(static_cast<const std::uint8_t*>(c.from) + off, std::memory_order_relaxed);
            k.bytes.store(std::min(per, c.bytes - off), std::memory_order_relaxed);
            k.stream.store(c.stream, std::memory_order_relaxed);
        }
    }
    if (n) share(gen, n);
}

} // namespace tpf::daemon
