#include "daemon/proxy.hpp"

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>

#include <cerrno>
#include <cstring>

#include "common/shm.hpp"

namespace tpf::daemon {

namespace {
inline void cpuRelax() {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
}
} // namespace

Proxy::Proxy(std::uint32_t spinUs, std::uint32_t heartbeatMs, int cpu, ProxyEvents events)
    : spinNs_(std::uint64_t(spinUs) * 1000), heartbeatMs_(heartbeatMs), cpu_(cpu), events_(std::move(events)),
      eventFd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

Proxy::~Proxy() { stop(); }

Status Proxy::start() {
    if (!eventFd_) return {Errc::SystemError, std::string("eventfd: ") + std::strerror(errno)};
    running_ = true;
    thread_ = std::thread([this] { run(); });
    if (cpu_ >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu_, &set);
        if (int e = pthread_setaffinity_np(thread_.native_handle(), sizeof set, &set); e != 0)
            return {Errc::SystemError, "pinning the proxy to CPU " + std::to_string(cpu_) + ": " + std::strerror(e)};
    }
    return okStatus();
}

void Proxy::stop() {
    if (!running_.exchange(false)) return;
    wake();
    if (thread_.joinable()) thread_.join();
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
    auto refuse = [&](Errc code, const std::string& why) {
        ring.view.complete(ring.cplHead, Completion{d.epoch, std::uint16_t(code), 0, d.group});
        if (events_.badDoorbell) events_.badDoorbell(g.handle, pr.rank, Error{code, why});
    };
    if (d.group != g.handle) return refuse(Errc::BadMessage, "doorbell for group handle " + std::to_string(d.group));
    if (d.bytes > g.agreedCap)
        return refuse(Errc::CapMismatch, "doorbell of " + std::to_string(d.bytes) + " bytes above the agreed cap " +
                                             std::to_string(g.agreedCap));
    if (d.epoch != ring.lastEpoch + 1)
        return refuse(Errc::BadMessage, "doorbell epoch " + std::to_string(d.epoch) + " after " +
                                            std::to_string(ring.lastEpoch));
    ring.lastEpoch = d.epoch;
    if (g.broken.load(std::memory_order_acquire)) return;

    const std::uint32_t phase = phaseOf(d.epoch);
    const HostRegion& src = *g.regions[pr.rank];
    for (std::uint32_t i = 0; i + 1 < g.world; ++i) {
        const std::uint32_t q = peerAt(pr.rank, i, g.world);
        if (g.routes[q] == client_proto::kRouteVerbs) {
            deliverVerbs(pr, q, phase, d);
            continue;
        }
        if (g.routes[q] != client_proto::kRouteShm) continue;
        const HostRegion& dst = *g.regions[q];
        for (std::uint32_t k = 0; k < g.layout.stripes; ++k) {
            const Stripe s = stripeOf(d.bytes, g.layout.stripes, k);
            std::memcpy(dst.slot(phase, pr.rank) + s.offset, src.slot(phase, pr.rank) + s.offset, s.bytes);
            std::atomic_ref(*dst.flag(phase, pr.rank, k)).store(d.epoch, std::memory_order_release);
        }
        dst.wakeIfWaiting();
    }
    doorbells_.fetch_add(1, std::memory_order_relaxed);
}

// Each stripe: wait (polling completions) until its QP is under the in-flight
// cap, then post payload + flag. A failed link breaks the group; the doorbell
// is not carried further (the group's ranks end with PeerLost).
void Proxy::deliverVerbs(ProxyRank& pr, std::uint32_t peer, std::uint32_t phase, const Doorbell& d) {
    ProxyGroup& g = *pr.group;
    if (!g.verbs) return;
    for (std::uint32_t k = 0; k < g.layout.stripes; ++k) {
        QpLink* link = g.verbs->link(pr.rank, peer, k);
        if (!link) return;
        // Half the CQ for signaled flags: a QP in error also completes its payloads.
        while (!link->failed && (link->gate.mustWait(2) || 2 * (link->hca().outstanding + 1) >= link->hca().cqDepth())) {
            pollCqs();
            if (g.broken.load(std::memory_order_acquire) || !running_.load(std::memory_order_relaxed)) return;
            cpuRelax();
        }
        if (link->failed) return;
        const Stripe s = stripeOf(d.bytes, g.layout.stripes, k);
        if (auto st = link->postStripe(g.layout, phase, pr.rank, k, s, d.epoch); !st) {
            link->failed = true;
            return linkFailed(*link, st.error().describe());
        }
    }
}

void Proxy::linkFailed(QpLink& link, const std::string& why) {
    if (events_.peerFailed)
        events_.peerFailed(link.groupHandle, link.remoteRank,
                           Error{Errc::PeerLost, "queue pair " + std::to_string(link.qpn()) + " to rank " +
                                                     std::to_string(link.remoteRank) + " on rail " + std::to_string(link.rail) +
                                                     " (" + link.hca().name() + ") failed: " + why});
}

bool Proxy::pollCqs() {
    bool busy = false;
    for (auto& h : hcas_) {
        if (!h->outstanding) continue;
        pollCompletions(*h, [](void* self, QpLink& link, const std::string& why) {
            static_cast<Proxy*>(self)->linkFailed(link, why);
        }, this);
        busy |= h->outstanding != 0;
    }
    return busy;
}

bool Proxy::wakeVerbsWaiters(std::vector<ProxyRank>& table) {
    bool waiting = false;
    for (auto& pr : table) {
        const ProxyGroup& g = *pr.group;
        if (!g.verbs) continue;
        const HostRegion& r = *g.regions[pr.rank];
        if (std::atomic_ref(r.control().waiters).load(std::memory_order_relaxed) == 0) continue;
        waiting = true;
        std::uint64_t sum = 0;
        for (std::uint32_t p = 0; p < 2; ++p)
            for (std::uint32_t q = 0; q < g.world; ++q)
                if (g.routes[q] == client_proto::kRouteVerbs)
                    for (std::uint32_t k = 0; k < g.layout.stripes; ++k)
                        sum += std::atomic_ref(*r.flag(p, q, k)).load(std::memory_order_acquire);
        if (sum != pr.verbsFlagSum) {
            pr.verbsFlagSum = sum;
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

std::size_t Proxy::pollOnce(std::vector<ProxyRank>& table) {
    std::size_t work = 0;
    for (auto& pr : table) {
        Doorbell d;
        for (;;) {
            const auto r = pr.ring->view.pop(pr.ring->tail, d);
            if (r == RingView::Pop::Empty) break;
            if (r == RingView::Pop::Corrupt) {
                if (events_.badDoorbell)
                    events_.badDoorbell(pr.group->handle, pr.rank,
                                        Error{Errc::BadMessage, "command ring head corrupted by the client"});
                pr.ring->tail = std::atomic_ref(pr.ring->view.header().subHead).load(std::memory_order_acquire);
                break;
            }
            deliver(pr, d);
            ++work;
        }
    }
    return work;
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

void Proxy::run() {
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
            retire(table, next);
            table = std::move(next);
            mustSpin = false;
            for (auto& pr : table) mustSpin |= pr.group->gpuDoorbells;
            if (events_.drained) events_.drained(version);
        }
        const std::size_t work = pollOnce(table);
        const std::uint64_t now = monotonicNs();
        // The verbs wire: completions, retiring groups, waits on remote flags.
        bool verbsBusy = pollCqs();
        if (!retiring_.empty()) {
            std::erase_if(retiring_, [&](Retiring& r) {
                if (!r.group->busy()) return true;
                if (!r.flushed && now - r.sinceNs > 1000000000ull) {
                    for (auto& l : r.group->links)
                        if (l) l->flush();
                    r.flushed = true;
                }
                return false;
            });
            verbsBusy = true;
        }
        verbsBusy |= wakeVerbsWaiters(table);
        if (now - lastBeat > 1000000) {
            for (auto& pr : table) std::atomic_ref(pr.ring->view.header().heartbeatNs).store(now, std::memory_order_relaxed);
            lastBeat = now;
        }
        if (work || mustSpin || verbsBusy) {
            if (work) lastWork = now;
            cpuRelax();
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
        pollfd p{eventFd_.get(), POLLIN, 0};
        ::poll(&p, 1, int(heartbeatMs_));
        std::uint64_t drain;
        [[maybe_unused]] auto n = ::read(eventFd_.get(), &drain, sizeof drain);
        sleeping_.store(false, std::memory_order_relaxed);
        for (auto& pr : table) std::atomic_ref(pr.ring->view.header().proxyIdle).store(0, std::memory_order_relaxed);
        lastWork = monotonicNs();
    }
}

} // namespace tpf::daemon
