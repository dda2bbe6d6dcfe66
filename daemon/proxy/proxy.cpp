#include "daemon/proxy/proxy.hpp"

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/cpu_relax.hpp"
#include "common/shm.hpp"
#include "common/stream_copy.hpp"
#include "daemon/proxy/verbs_transport.hpp"

namespace tpf::daemon {

Proxy::Proxy(const ProxyOptions& options, ProxyEvents& events)
    : spinNs_(std::uint64_t(options.spinUs) * 1000), heartbeatMs_(options.heartbeatMs), cpu_(options.cpu),
      gpuPollNs_(std::uint64_t(options.gpuPollUs) * 1000), events_(events),
      eventFd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)), carry_(options.carryThreads, options.spinUs) {}

Proxy::~Proxy() { stop(); }

Status Proxy::start() {
    if (!eventFd_) return {Errc::SystemError, std::string("eventfd: ") + std::strerror(errno)};
    if (auto s = carry_.start(); !s) return s;
    running_ = true;
    thread_ = std::thread([this] { run(); });
    if (cpu_ >= 0) {
        // A mask sized for cpu_: proxy.cpu may exceed cpu_set_t's 1024 CPUs.
        cpu_set_t* set = CPU_ALLOC(cpu_ + 1);
        if (!set) return {Errc::SystemError, "pinning the proxy: CPU_ALLOC failed"};
        const std::size_t size = CPU_ALLOC_SIZE(cpu_ + 1);
        CPU_ZERO_S(size, set);
        CPU_SET_S(cpu_, size, set);
        const int e = pthread_setaffinity_np(thread_.native_handle(), size, set);
        CPU_FREE(set);
        // checkOnHost (config) refuses a CPU outside our affinity first; this is the backstop.
        if (e != 0)
            return {Errc::ConfigError, "proxy.cpu: cannot pin the proxy thread to CPU " + std::to_string(cpu_) + ": " +
                                           std::strerror(e) + " (set proxy.cpu to a CPU this daemon may run on, or -1)"};
    }
    return okStatus();
}

void Proxy::stop() {
    if (!running_.exchange(false)) return;
    wake();
    if (thread_.joinable()) thread_.join();
    carry_.stop();
}

void Proxy::publish(std::vector<ProxyRank> table, std::uint64_t version) {
    {
        std::lock_guard lock(mutex_);
        pending_ = std::move(table);
        pendingVersion_ = version;
    }
    publishedVersion_.store(version, std::memory_order_release);
    wake();
}

void Proxy::wake() const {
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(eventFd_.get(), &one, sizeof one);
}

void Proxy::deliver(ProxyRank& pr, const Doorbell& d) {
    ProxyGroup& g = *pr.group;
    CommandRing& ring = *pr.ring;
    // The group breaks: every rank learns it from its region's control block.
    auto refuse = [&](Errc code, const std::string& why) {
        events_.badDoorbell(g.handle, pr.rank, Error{code, why});
    };
    if (d.group != g.handle) return refuse(Errc::BadMessage, "doorbell for group handle " + std::to_string(d.group));
    // The slot, not the cap, bounds a doorbell: a staged shard is the cap
    // rounded up to 16 bytes, an all-gather-v row carries a RowHeader.
    if (d.bytes > g.layout.slotBytes)
        return refuse(Errc::CapMismatch, "doorbell of " + std::to_string(d.bytes) + " bytes above the slot of " +
                                             std::to_string(g.layout.slotBytes));
    if (d.epoch != ring.lastEpoch + 1)
        return refuse(Errc::BadMessage, "doorbell epoch " + std::to_string(d.epoch) + " after " +
                                            std::to_string(ring.lastEpoch));
    ring.lastEpoch = d.epoch;
    if (g.drops(d.epoch)) return;
    ring.delivering = CommandRing::Delivery{d, 0, 0};
    resume(pr);
}

// The rank's transports in peerAt order: shm rows join the doorbell's batch
// (copied and flagged in carryBatch(), at the end or before a come-back-later);
// verbs stripes are posted while their queue pairs are under the cap. A
// transport at its cap leaves the rest for a later pass (the caller serves
// the other rings meanwhile), so one stalled queue pair holds up only this
// ring.
bool Proxy::resume(ProxyRank& pr) {
    const ProxyGroup& g = *pr.group;
    CommandRing& ring = *pr.ring;
    CommandRing::Delivery& cur = *ring.delivering;
    const Doorbell& d = cur.doorbell;
    if (g.drops(d.epoch)) return ring.delivering.reset(), true;
    const std::uint32_t gone = g.gone.load(std::memory_order_relaxed); // closed in order: they need nothing more
    CarryStep step{d, phaseOf(d.epoch), pr.gpuDoorbells, cur.stripe, batch_, *this};
    for (; cur.peer < pr.peers.size(); ++cur.peer, cur.stripe = 0) {
        const ProxyPeer& peer = pr.peers[cur.peer];
        if (gone >> peer.rank & 1u) continue;
        if (peer.transport->carry(step) == Carried::Later) return carryBatch(d.epoch, pr.gpuDoorbells), false;
    }
    carryBatch(d.epoch, pr.gpuDoorbells);
    ring.delivering.reset();
    doorbells_.fetch_add(1, std::memory_order_relaxed);
    return true;
}

void Proxy::resend(ProxyRank& pr) {
    const ProxyGroup& g = *pr.group;
    CommandRing& ring = *pr.ring;
    for (const Resend::Peer& to : pr.resend->peers) {
        std::uint32_t index = 0;
        while (index < pr.peers.size() && pr.peers[index].rank != to.rank) ++index;
        if (index == pr.peers.size()) continue;
        Transport& transport = *pr.peers[index].transport;
        std::uint64_t first = 0, last = 0;
        for (std::uint64_t e = to.landed + 1; e <= ring.lastEpoch; ++e) {
            // The doorbell in progress reaches this peer when it resumes.
            if (ring.delivering && ring.delivering->doorbell.epoch == e && ring.delivering->peer <= index) continue;
            const std::uint64_t back = ring.lastEpoch - e;
            const Doorbell d = back < ring.layout.entries && back < ring.tail
                                   ? ring.doorbellAt(ring.tail - 1 - std::uint32_t(back))
                                   : Doorbell{};
            if (d.epoch != e || d.group != g.handle || d.bytes > g.layout.slotBytes) {
                events_.badDoorbell(g.handle, pr.rank,
                                    Error{Errc::PeerLost, "epoch " + std::to_string(e) + " of rank " + std::to_string(pr.rank) +
                                                              " must reach rank " + std::to_string(to.rank) +
                                                              " again, and its doorbell is no longer in the ring"});
                return;
            }
            if (g.drops(e)) return;
            std::uint32_t stripe = 0;
            CarryStep step{d, phaseOf(e), pr.gpuDoorbells, stripe, batch_, *this};
            while (transport.carry(step) == Carried::Later) {
                if (!running_.load(std::memory_order_relaxed)) return;
                pollCqs();
                cpuRelax();
            }
            carryBatch(e, pr.gpuDoorbells);
            first = first ? first : e;
            last = e;
        }
        if (first) events_.resent(g.handle, pr.rank, to.rank, first, last);
    }
}

// The doorbell's same-node rows: each row of kSplitMin and more split among
// the carry threads and flagged at once, so that its reader starts on it
// while the next one is copied; the smaller rows as one batch when they
// come to kSplitMin together (shared among the carry threads: a W = 8
// call's seven rows of 16 KiB, which one proxy thread copies one after the
// other), flagged after it, else each copied and flagged at once. Flags are
// not held until a whole poll pass's rows are copied: the GPUs' PCIe reads
// of the rows overlap the copies (2x faster at W = 4, 64 KiB and up).
void Proxy::carryBatch(std::uint64_t epoch, bool gpu) {
    const HostRegion* woken = nullptr;
    const auto release = [&](std::size_t i) {
        const CarryRows::Release& r = batch_.releases[i];
        if (gpu) {
            // Copy 0 first, then the copies the kernel's other pollers read (proto/layout.hpp).
            for (std::uint32_t c = 0; c < kFlagCopies; ++c)
                std::atomic_ref(r.flag[c * kFlagCopyStride / sizeof *r.flag]).store(epoch, std::memory_order_release);
            const CarryItem& row = batch_.items[i];
            if (row.bytes <= kDemoteMax && demotes_.size() < kDemotesHeld)
                demotes_.push_back({static_cast<const std::uint8_t*>(row.to), row.bytes, r.flag});
        } else {
            std::atomic_ref(*r.flag).store(epoch, std::memory_order_release);
        }
        if (r.dst != woken) r.dst->wakeIfWaiting(), woken = r.dst;
    };
    // Runs: a row of kSplitMin and more alone, else consecutive smaller rows.
    const std::span<const CarryItem> rows(batch_.items);
    for (std::size_t begin = 0, end; begin < rows.size(); begin = end) {
        std::size_t bytes = rows[begin].bytes;
        end = begin + 1;
        if (bytes < CarryPool::kSplitMin)
            for (; end < rows.size() && rows[end].bytes < CarryPool::kSplitMin; ++end) bytes += rows[end].bytes;
        if (carry_.shares(bytes)) { // with the helpers, then every flag (streamed lines fenced before them)
            carry_.copy(rows.subspan(begin, end - begin));
            for (std::size_t i = begin; i < end; ++i) release(i);
        } else { // the proxy's alone: each row flagged at once
            for (std::size_t i = begin; i < end; ++i) carry_.copy(rows.subspan(i, 1)), release(i);
        }
    }
    batch_.clear();
    carry_.wakeIdle(); // after the flags: a futex wake must not delay them
}

void Proxy::finishLeaving(std::vector<ProxyRank>& old, const std::vector<ProxyRank>& next) {
    for (auto& pr : old) {
        bool stays = false;
        for (const auto& n : next) stays |= n.ring == pr.ring;
        if (stays) continue;
        do {
            while (pr.ring->delivering && !resume(pr)) {
                if (!running_.load(std::memory_order_relaxed)) return pr.ring->delivering.reset();
                pollCqs();
                cpuRelax();
            }
        } while (popOne(pr));
    }
}

void Proxy::peerFailed(std::uint32_t groupHandle, std::uint32_t remoteRank, Error why) {
    events_.peerFailed(groupHandle, remoteRank, std::move(why));
}

bool Proxy::pollCqs() {
    bool busy = false;
    for (auto& h : hcas_) {
        if (!h->outstanding) continue;
        tpf::daemon::pollCompletions(*h, [](void* self, QpLink& link, const std::string& why) {
            if (link.replaced.load(std::memory_order_relaxed)) return; // its node's daemon went away: expected
            static_cast<Proxy*>(self)->peerFailed(link.groupHandle, link.remoteRank, qpFailure(link, why));
        }, this);
        busy |= h->outstanding != 0;
    }
    return busy;
}

bool Proxy::wakeInboundWaiters(std::vector<ProxyRank>& table) {
    bool waiting = false;
    for (auto& pr : table) {
        if (!pr.watchesInbound) continue;
        const ProxyGroup& g = *pr.group;
        const HostRegion& r = *g.regions[pr.rank];
        if (std::atomic_ref(r.control().waiters).load(std::memory_order_relaxed) == 0) continue;
        waiting = true;
        std::uint64_t sum = 0;
        for (std::uint32_t p = 0; p < 2; ++p)
            for (const ProxyPeer& peer : pr.peers)
                if (peer.watchesInbound)
                    for (std::uint32_t k = 0; k < g.layout.stripes; ++k)
                        sum += std::atomic_ref(*r.flag(p, peer.rank, k)).load(std::memory_order_acquire);
        if (sum != pr.inboundFlagSum) {
            pr.inboundFlagSum = sum;
            r.wakeIfWaiting();
        }
    }
    return waiting;
}

// Groups leaving the table keep their QPs until every posted request
// completed (a completion names its QpLink); after 1 s the QPs are moved to
// the error state so they flush.
void Proxy::retire(const std::vector<ProxyRank>& old, const std::vector<ProxyRank>& next) {
    for (const auto& pr : old) {
        const auto& vg = pr.group->verbs;
        if (!vg || !vg->busy()) continue;
        bool kept = false;
        for (const auto& n : next) kept |= n.group->verbs == vg;
        for (const auto& r : retiring_) kept |= r.group == vg;
        if (!kept) retiring_.push_back(Retiring{vg, monotonicNs()});
    }
}

// A rank leaving the table (its Close, or its connection gone) may have
// writes still on the wire (RDMA WRITEs): its last shards. drained() waits
// until they landed, so that its group's other nodes learn it left (or, when
// it was the group's last local rank, that the group closed) only after they
// did.
void Proxy::land(const std::vector<ProxyRank>& old, const std::vector<ProxyRank>& next, std::uint64_t nowNs) {
    for (const auto& pr : old) {
        if (!pr.inFlight()) continue;
        bool stays = false;
        for (const auto& n : next) stays |= n.ring == pr.ring;
        if (!stays) landing_.push_back(Landing{pr.peers, nowNs});
    }
}

void Proxy::reportDrained(std::uint64_t nowNs) {
    std::erase_if(landing_, [&](const Landing& l) {
        bool inFlight = false;
        for (const auto& p : l.peers) inFlight |= p.transport->inFlight();
        return !inFlight || nowNs - l.sinceNs > kLandingNs;
    });
    if (!landing_.empty()) return;
    const std::uint64_t version = std::exchange(drainDue_, 0);
    if (version) events_.drained(version);
}

std::size_t Proxy::pollOnce(std::vector<ProxyRank>& table) {
    std::size_t work = 0;
    for (auto& pr : table) {
        // A doorbell in progress goes first; while it waits, so do the ring's later ones.
        if (pr.ring->delivering && !resume(pr)) {
            ++work;
            continue;
        }
        while (popOne(pr)) {
            ++work;
            if (pr.ring->delivering) break; // at a cap: the other rings first
        }
    }
    return work;
}

bool Proxy::popOne(ProxyRank& pr) {
    Doorbell d;
    const auto r = pr.ring->view.pop(pr.ring->tail, d);
    if (r == RingView::Pop::Empty) return false;
    if (r == RingView::Pop::Corrupt) {
        events_.badDoorbell(pr.group->handle, pr.rank, Error{Errc::BadMessage, "command ring head corrupted by the client"});
        pr.ring->tail = std::atomic_ref(pr.ring->view.header().subHead).load(std::memory_order_acquire);
        return false;
    }
    deliver(pr, d);
    return true;
}

// Announce sleep in every ring, then re-check (the producers' side of the
// Dekker pattern is RingView::proxyNeedsWake). True if work turned up.
bool Proxy::goIdle(std::vector<ProxyRank>& table) {
    for (auto& pr : table) std::atomic_ref(pr.ring->view.header().proxyIdle).store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    for (auto& pr : table)
        if (pr.ring->view.hasSubmissions(pr.ring->tail)) return true;
    return false;
}

void Proxy::markAwake(bool awake, std::uint64_t nowNs) {
    busySeq_.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    const std::uint64_t since = awakeSinceNs_.load(std::memory_order_relaxed);
    if (!awake && since && nowNs > since)
        busyDoneNs_.store(busyDoneNs_.load(std::memory_order_relaxed) + (nowNs - since), std::memory_order_relaxed);
    awakeSinceNs_.store(awake ? nowNs : 0, std::memory_order_relaxed);
    busySeq_.fetch_add(1, std::memory_order_release);
}

std::uint64_t Proxy::busyNs() const {
    for (;;) {
        const std::uint32_t seq = busySeq_.load(std::memory_order_acquire);
        const std::uint64_t done = busyDoneNs_.load(std::memory_order_relaxed);
        const std::uint64_t since = awakeSinceNs_.load(std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (!(seq & 1) && busySeq_.load(std::memory_order_relaxed) == seq) {
            const std::uint64_t now = monotonicNs();
            return done + (since && now > since ? now - since : 0);
        }
    }
}

void Proxy::run() {
    markAwake(true, monotonicNs());
    demotes_.reserve(kDemotesHeld);
    batch_.reserve(kBatchReserve);
    std::vector<ProxyRank> table;
    std::uint64_t version = 0;
    std::uint64_t lastWork = monotonicNs();
    std::uint64_t lastBeat = 0;
    bool mustSpin = false;
    while (running_.load(std::memory_order_relaxed)) {
        if (publishedVersion_.load(std::memory_order_acquire) != version) {
            pollOnce(table); // drain what the old set published before the switch
            std::vector<ProxyRank> next;
            {
                std::lock_guard lock(mutex_);
                next = pending_;
                version = pendingVersion_;
            }
            finishLeaving(table, next);
            demotes_.clear(); // their regions may go with the old set
            land(table, next, monotonicNs());
            retire(table, next);
            table = std::move(next);
            for (auto& pr : table)
                if (pr.resend && !pr.resend->taken.exchange(true)) resend(pr);
            mustSpin = false;
            for (auto& pr : table) mustSpin |= pr.gpuDoorbells;
            drainDue_ = version;
            reportDrained(monotonicNs());
        }
        const std::size_t work = pollOnce(table);
        if (!work && !demotes_.empty()) { // idle: one chunk of a row out of this core's caches (demotes_)
            Demote& dm = demotes_.back();
            const std::size_t n = std::min(dm.bytes, kDemoteChunk);
            demoteLines(dm.row, n);
            dm.row += n;
            dm.bytes -= n;
            if (dm.bytes == 0) {
                demoteLines(dm.flag, kFlagLine);
                demotes_.pop_back();
            }
        }
        const std::uint64_t now = monotonicNs();
        // The verbs wire: completions, retiring groups; waits on flags other nodes write.
        bool verbsBusy = pollCqs();
        if (!retiring_.empty()) {
            std::erase_if(retiring_, [&](Retiring& r) {
                if (!r.group->busy()) return true;
                if (!r.flushed && now - r.sinceNs > 1000000000ull) {
                    for (auto& l : r.group->links) // not the links a later group of the same group shares
                        if (VerbsGroup::own(l)) l->flush();
                    r.flushed = true;
                }
                return false;
            });
            verbsBusy = true;
        }
        if (drainDue_) {
            reportDrained(now);
            verbsBusy = true;
        }
        verbsBusy |= wakeInboundWaiters(table);
        if (now - lastBeat > 1000000) {
            for (auto& pr : table) std::atomic_ref(pr.ring->view.header().heartbeatNs).store(now, std::memory_order_relaxed);
            lastBeat = now;
        }
        if (work) lastWork = now;
        if (work || verbsBusy || (mustSpin && (gpuPollNs_ == 0 || now - lastWork < spinNs_))) {
            cpuRelax();
            continue;
        }
        if (mustSpin) { // GPU rings, idle, proxy.gpu_poll_us: a kernel cannot write the eventfd, so nap and poll again
            markAwake(false, now);
            const timespec nap{0, long(gpuPollNs_)};
            ::nanosleep(&nap, nullptr);
            markAwake(true, monotonicNs());
            continue;
        }
        if (now - lastWork < spinNs_) {
            cpuRelax();
            continue;
        }
        if (goIdle(table)) {
            for (auto& pr : table) std::atomic_ref(pr.ring->view.header().proxyIdle).store(0, std::memory_order_relaxed);
            continue;
        }
        sleeping_.store(true, std::memory_order_relaxed);
        markAwake(false, now);
        pollfd p{eventFd_.get(), POLLIN, 0};
        ::poll(&p, 1, int(heartbeatMs_));
        std::uint64_t drain;
        [[maybe_unused]] auto n = ::read(eventFd_.get(), &drain, sizeof drain);
        sleeping_.store(false, std::memory_order_relaxed);
        for (auto& pr : table) std::atomic_ref(pr.ring->view.header().proxyIdle).store(0, std::memory_order_relaxed);
        lastWork = monotonicNs();
        markAwake(true, lastWork);
    }
    markAwake(false, monotonicNs());
}

} // namespace tpf::daemon
