// Collectives on host buffers: stage, doorbell, bounded wait, copy out / sum.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "client/format.hpp"
#include "client/impl.hpp"
#include "client/reduce.hpp"
#include "common/cpu_relax.hpp"
#include "common/unix_socket.hpp"

namespace tpf {

namespace {

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kBufferAlign == 0; }

constexpr std::uint64_t kSleepSliceNs = 10 * 1000 * 1000; // re-check the daemon's socket this often
// How long a wait still takes shards after its group broke: deliveries the
// daemon had begun (a proxy copy, RDMA writes in flight) land; nothing new comes.
constexpr std::uint64_t kBrokenGraceNs = 200 * 1000 * 1000;

} // namespace

void Group::Impl::noteForked() {
    failure = Error{Errc::Closed, format("this group was opened by process {}; a fork()ed child (process {}) cannot use it: "
                                         "open a new group in the child",
                                         openedBy, ::getpid())};
}

Status Group::Impl::fail(Error e, std::uint32_t peer) {
    const std::lock_guard lock(failMutex);
    if (std::atomic_ref(failure.code).load(std::memory_order_relaxed) == Errc::Ok) {
        failure.detail = std::move(e.detail);
        std::atomic_ref(failure.code).store(e.code, std::memory_order_release);
        std::atomic_ref(healthWord).store(std::uint64_t(e.code) | std::uint64_t(peer) << 32, std::memory_order_release);
    }
    return failure;
}

Errc Group::Impl::sharedCode() const {
    auto& c = control();
    Errc code;
    if (!errcFromWire(std::atomic_ref(c.error).load(std::memory_order_acquire), code) || code == Errc::Ok)
        code = std::atomic_ref(c.abort).load(std::memory_order_acquire) ? Errc::Aborted : Errc::PeerLost;
    return code;
}

std::uint32_t Group::Impl::sharedPeer() const {
    const std::uint32_t who = std::atomic_ref(control().missingPeer).load(std::memory_order_acquire);
    return who < world ? who : kNoPeer;
}

Error Group::Impl::sharedFailure() const {
    auto& c = control();
    const Errc code = sharedCode();
    const std::uint32_t who = std::atomic_ref(c.missingPeer).load(std::memory_order_acquire);
    if (code == Errc::Aborted) // the daemon names the aborter in missingPeer
        return Error{code, who < world ? "rank " + std::to_string(who) + " aborted the group" : std::string("a rank aborted the group")};
    // The code is describe()'s prefix already: "PeerLost: rank 3 is gone".
    return Error{code, "rank " + std::to_string(who) + (code == Errc::PeerLost ? " is gone" : " failed the group")};
}

void Group::Impl::record(StatsOp op, std::uint64_t startNs, std::size_t bytes, bool ok) {
    if (!ring.layout().entries) return;
    RankStats& rs = ring.stats();
    OpStats& s = rs.ops[op];
    const auto add = [](auto& v, std::uint64_t d) {
        std::atomic_ref(v).store(std::atomic_ref(v).load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
    };
    add(s.calls, 1);
    if (ok) {
        const std::uint64_t ns = monotonicNs() - startNs;
        add(s.bytes, bytes);
        add(s.latencyNs, ns);
        add(s.latency[latencyBucket(ns)], 1);
    } else {
        add(s.errors, 1);
        if (std::uint32_t(failure.code) < kStatsErrcSlots) add(rs.errorsByCode[std::uint32_t(failure.code)], 1);
        std::atomic_ref(rs.lastError).store(std::uint32_t(failure.code), std::memory_order_relaxed);
    }
}

// Every peer's flags for `epoch` arrived? `next` remembers how far we got.
Status Group::Impl::waitPeers(std::uint64_t e, std::uint32_t phase) {
    const std::uint64_t start = monotonicNs();
    const std::uint64_t deadline = start + std::uint64_t(options.timeout.count()) * 1000000ull;
    const std::uint64_t spinUntil = start + std::uint64_t(options.spin.count()) * 1000ull;
    std::uint32_t next = 0; // index i of peerAt(rank, i) still missing
    auto& c = control();
    auto missingPeer = [&] { return peerAt(rank, next, world); };
    auto arrived = [&] {
        for (; next + 1 < world; ++next) {
            const std::uint32_t q = peerAt(rank, next, world);
            for (std::uint32_t k = 0; k < layout.stripes; ++k)
                if (std::atomic_ref(*flagOf(phase, q, k)).load(std::memory_order_acquire) < e) return false;
        }
        return true;
    };
    // A daemon-reported failure ends the wait at once when it is an abort or
    // it names a peer whose shard is still missing. A rank that left after
    // delivering this epoch does not fail the ranks still waiting for others
    // at once: shards already under way may land. But a broken group's
    // doorbells are no longer carried, so after a grace the wait ends too
    // (else a rank killed inside a call it posted leaves the others waiting
    // for a live rank's dropped doorbell until the timeout).
    std::uint64_t brokenSeenNs = 0;
    auto failed = [&]() -> bool {
        const std::uint32_t err = std::atomic_ref(c.error).load(std::memory_order_acquire);
        if (!err) return false;
        const std::uint32_t who = std::atomic_ref(c.missingPeer).load(std::memory_order_acquire);
        if (err == std::uint32_t(Errc::Aborted) || std::atomic_ref(c.abort).load(std::memory_order_acquire) || who == kNoPeer)
            return true;
        // `who` closed in order after epoch `carried`: the daemons still carry
        // every other rank's shards of epochs up to it (ControlBlock::carriedThrough).
        const std::uint64_t carried =
            err == std::uint32_t(Errc::PeerLost) ? std::atomic_ref(c.carriedThrough).load(std::memory_order_acquire) : 0;
        for (std::uint32_t k = 0; k < layout.stripes; ++k)
            if (who < world && who != rank && std::atomic_ref(*flagOf(phase, who, k)).load(std::memory_order_acquire) < e) {
                if (carried && carried != kCarriedUnknown && e > carried) // its shard of e never comes: say why
                    static_cast<void>(fail(Error{Errc::PeerLost,
                                                 format("rank {} left the group after epoch {} (this call is epoch {})", who, carried, e)},
                                           who));
                return true;
            }
        // Still carried: wait as in a healthy group, up to the timeout (the
        // daemons carry the other ranks' shards of e, and host-direct peers
        // still publish theirs: client/host_transport.cpp).
        if (e <= carried) return false;
        const std::uint64_t now = monotonicNs();
        if (!brokenSeenNs) brokenSeenNs = now;
        return now - brokenSeenNs >= kBrokenGraceNs;
    };
    auto reportFailure = [&]() -> Status { return fail(withDaemonWhy(sharedFailure()), sharedPeer()); };

    for (std::uint64_t now = start; now < spinUntil; now = monotonicNs()) {
        for (int i = 0; i < 64; ++i) {
            if (arrived()) return okStatus();
            cpuRelax();
        }
        if (failed()) return reportFailure();
    }
    for (int i = 0; i < 4; ++i) {
        if (arrived()) return okStatus();
        ::sched_yield();
    }
    for (;;) {
        std::atomic_ref(c.waiters).fetch_add(1, std::memory_order_seq_cst);
        const std::uint32_t seenSeq = std::atomic_ref(c.wakeSeq).load(std::memory_order_seq_cst);
        const bool done = arrived();
        const bool bad = !done && failed();
        const std::uint64_t now = monotonicNs();
        if (!done && !bad && now < deadline) futexWait(&c.wakeSeq, seenSeq, std::min(kSleepSliceNs, deadline - now));
        std::atomic_ref(c.waiters).fetch_sub(1, std::memory_order_seq_cst);
        if (done || arrived()) return okStatus();
        if (bad || failed()) return reportFailure();
        if (auto s = daemonCheck(); !s) return s;
        if (monotonicNs() >= deadline) {
            std::string why = format("rank {} did not deliver epoch {} within {} ms", missingPeer(), e, options.timeout.count());
            const std::uint64_t stalledAt = monotonicNs();
            for (const auto& t : transports) why += t->stalled(*this, stalledAt);
            return timedOut(Error{Errc::Timeout, why}, missingPeer());
        }
    }
}

namespace {

/// "allReduceSum(bf16) of 4096 bytes": the call a row's trailer names.
std::string callOf(std::uint32_t magic, std::uint32_t bytes) {
    std::string op;
    if (magic == kTrailerGather) op = "allGather";
    else if (magic - kTrailerSumBase <= std::uint32_t(DType::BF16))
        op = std::string("allReduceSum(") + (magic == kTrailerSumBase ? "f32" : magic == kTrailerSumBase + 1 ? "f16" : "bf16") + ")";
    else return "a call this library does not know (magic " + std::to_string(magic) + ")";
    return op + " of " + std::to_string(bytes) + " bytes";
}

} // namespace

Status Group::Impl::exchange(const void* send, std::size_t bytes, std::uint32_t magic, std::uint32_t& phase) {
    const std::uint64_t e = epoch + 1, at = roundUp(bytes, 16);
    const RowTrailer mine{e, std::uint32_t(bytes), magic};
    std::uint8_t* const own = slot(phaseOf(e), rank);
    std::memcpy(own, send, bytes);
    std::memcpy(own + at, &mine, sizeof mine);
    if (auto s = post(at + sizeof mine, phase); !s) return s;
    // Every row's trailer, where a row of our size ends, before any byte of
    // output: all or nothing.
    for (std::uint32_t q = 0; q < world; ++q) {
        if (q == rank) continue;
        RowTrailer t;
        std::memcpy(&t, rowOf(phase, q) + at, sizeof t);
        if (t.epoch == e && t.magic == mine.magic && t.rowBytes == mine.rowBytes) continue;
        return fail(Error{Errc::GroupMismatch,
                          t.epoch == e ? format("rank {} called {}, not rank {}'s {} (every rank of a call passes the same op, "
                                                "dtype and size)",
                                                q, callOf(t.magic, t.rowBytes), rank, callOf(mine.magic, mine.rowBytes))
                                       : format("rank {} passed another size or op than rank {}'s {} (every rank of a call "
                                                "passes the same op, dtype and size)",
                                                q, rank, callOf(mine.magic, mine.rowBytes))}, q);
    }
    return okStatus();
}

// The proxy that carries the shards, not the peer, stalls when its heartbeat
// (written every pass, and at least every proxy.heartbeat_ms while it
// sleeps) is older than twice that period plus 200 ms: no pass in that long.
// A doorbell still in the ring is no proof (the proxy may hold the one before
// it for a link at its cap), so it is not asked.
std::string Group::Impl::proxyStalled(std::uint64_t now) const {
    const RingHeader& h = ring.header();
    const std::uint64_t beatNs = std::atomic_ref(h.heartbeatNs).load(std::memory_order_relaxed);
    const std::uint64_t periodNs = std::uint64_t(std::atomic_ref(h.heartbeatMs).load(std::memory_order_relaxed)) * 1000000ull;
    if (!periodNs || !beatNs || now <= beatNs || now - beatNs <= 2 * periodNs + 200000000ull) return {};
    return "; tpfabricd's proxy, which carries the shards, has made no pass for " + std::to_string((now - beatNs) / 1000000) +
           " ms: the daemon is stopped, hung or stuck (systemctl status tpfabricd)";
}

// Each transport publishes our staged row to its peers (carried first: the
// proxy's RDMA writes overlap our own copies), then every peer's flags.
Status Group::Impl::post(std::size_t bytes, std::uint32_t& phase) {
    const std::uint64_t e = ++epoch;
    phase = phaseOf(e);
    for (const auto& t : transports)
        if (auto s = t->publish(*this, e, phase, std::uint32_t(bytes)); !s) return s;
    return waitPeers(e, phase);
}

bool Group::Impl::stillCarried(std::uint64_t e) {
    auto& c = control();
    const std::uint32_t err = std::atomic_ref(c.error).load(std::memory_order_acquire);
    if (!err) return true;
    return err == std::uint32_t(Errc::PeerLost) && !std::atomic_ref(c.abort).load(std::memory_order_acquire) &&
           e <= std::atomic_ref(c.carriedThrough).load(std::memory_order_acquire);
}

Status Group::allGather(const void* send, void* recv, std::size_t bytes) {
    Impl& g = *impl_;
    if (g.broken()) return g.failure;
    if (!aligned(send) || !aligned(recv)) return Error{Errc::Misaligned, "allGather buffers must be 16-byte aligned"};
    if (!fits(bytes))
        return Error{Errc::CapMismatch, std::to_string(bytes) + " bytes above the agreed cap of " + std::to_string(g.agreedCap)};
    auto* out = static_cast<std::uint8_t*>(recv);
    if (g.world == 1) {
        std::memmove(out, send, bytes);
        return okStatus();
    }
    const std::uint64_t start = monotonicNs();
    std::uint32_t phase = 0;
    const Status s = g.exchange(send, bytes, kTrailerGather, phase);
    if (s) {
        // Our own row from send, first (no other row overwrites it then):
        // the peers are reading our slot now, and reading it here as well
        // is slower than the private copy.
        if (bytes) std::memmove(out + std::size_t(g.rank) * bytes, send, bytes);
        for (std::uint32_t q = 0; q < g.world; ++q)
            if (q != g.rank) std::memmove(out + std::size_t(q) * bytes, g.rowOf(phase, q), bytes);
    }
    g.record(kStatsAllGather, start, bytes, bool(s));
    return s;
}

Status Group::allReduceSum(const void* send, void* recv, std::size_t count, DType type) {
    Impl& g = *impl_;
    if (g.broken()) return g.failure;
    if (!aligned(send) || !aligned(recv)) return Error{Errc::Misaligned, "allReduceSum buffers must be 16-byte aligned"};
    const auto sized = sumBytes(count, type, g.agreedCap);
    if (!sized) return sized.error();
    const std::size_t bytes = *sized;
    if (!fits(bytes))
        return Error{Errc::CapMismatch, std::to_string(bytes) + " bytes above the agreed cap of " + std::to_string(g.agreedCap)};
    if (g.world == 1) {
        std::memmove(recv, send, bytes);
        return okStatus();
    }
    const std::uint64_t start = monotonicNs();
    std::uint32_t phase = 0;
    const Status s = g.exchange(send, bytes, kTrailerSumBase + std::uint32_t(type), phase);
    if (s) {
        const void* rows[kMaxWorld];
        for (std::uint32_t q = 0; q < g.world; ++q) rows[q] = g.rowOf(phase, q);
        // As in allGather, our own row from send unless recv overlaps it (in place: then from our slot).
        const auto in = reinterpret_cast<std::uintptr_t>(send), to = reinterpret_cast<std::uintptr_t>(recv);
        if (in + bytes <= to || to + bytes <= in) rows[g.rank] = send;
        sumRowsInOrder(rows, g.world, recv, count, type);
    }
    g.record(kStatsAllReduceSum, start, bytes, bool(s));
    return s;
}

Status Group::allGatherV(const void* send, void* recv, std::span<const std::size_t> counts) {
    Impl& g = *impl_;
    if (g.broken()) return g.failure;
    if (auto s = g.checkCounts(send, recv, counts); !s) return s;
    if (!aligned(send) || !aligned(recv)) return Error{Errc::Misaligned, "allGatherV buffers must be 16-byte aligned"};
    std::size_t largest = 0, offset[kMaxWorld] = {};
    for (std::uint32_t r = 0; r < g.world; ++r) {
        largest = std::max(largest, counts[r]);
        if (r) offset[r] = offset[r - 1] + counts[r - 1];
    }
    if (!fits(largest))
        return Error{Errc::CapMismatch, format("allGatherV row of {} bytes above the agreed cap of {}", largest, g.agreedCap)};
    auto* out = static_cast<std::uint8_t*>(recv);
    if (g.world == 1) {
        std::memmove(out, send, counts[0]);
        return okStatus();
    }
    // Stage [RowHeader | own row]; only the own row travels (its header names
    // the counts it was sent under), so each rank posts its own size.
    const std::uint64_t start = monotonicNs();
    std::uint64_t c64[kMaxWorld] = {};
    for (std::uint32_t r = 0; r < g.world; ++r) c64[r] = counts[r];
    const RowHeader mine{countsHash(c64, g.world), std::uint32_t(counts[g.rank]), kRowHeaderMagic};
    std::uint8_t* const own = g.slot(phaseOf(g.epoch + 1), g.rank);
    std::memcpy(own, &mine, sizeof mine);
    std::memcpy(own + sizeof mine, send, counts[g.rank]);
    std::uint32_t phase = 0;
    Status s = g.post(sizeof mine + counts[g.rank], phase);
    // Every row's header before any byte of output: all or nothing.
    for (std::uint32_t q = 0; q < g.world && s; ++q) {
        RowHeader h;
        std::memcpy(&h, g.rowOf(phase, q), sizeof h);
        if (h.magic != kRowHeaderMagic)
            s = g.fail(Error{Errc::GroupMismatch, format("rank {} called another op than rank {}'s allGatherV (every rank of a call "
                                                         "passes the same op)",
                                                         q, g.rank)},
                             q);
        else if (h.countsHash != mine.countsHash || h.rowBytes != counts[q])
            // Only its own row's length travels, with a hash of its counts:
            // name the row when that is what differs, else say the counts do.
            s = g.fail(Error{Errc::GroupMismatch,
                             format("allGatherV: rank {} passed other counts than rank {}{}; every rank passes the same counts", q,
                                    g.rank,
                                    h.rowBytes != counts[q]
                                        ? format(" (its row is {} bytes; counts[{}] here is {})", h.rowBytes, q, counts[q])
                                        : format(" (its own row agrees, counts[{}] = {}: another entry differs)", q, counts[q]))},
                             q);
    }
    if (s) {
        if (counts[g.rank]) std::memmove(out + offset[g.rank], send, counts[g.rank]); // first, as in allGather
        for (std::uint32_t q = 0; q < g.world; ++q)
            if (q != g.rank) std::memmove(out + offset[q], g.rowOf(phase, q) + sizeof(RowHeader), counts[q]);
    }
    g.record(kStatsAllGatherV, start, counts[g.rank], bool(s));
    return s;
}

} // namespace tpf
