// A group survives a restart of its daemon, a Host or a Device group, on
// one node or across nodes (where the other nodes' daemons keep it
// meanwhile). The rank owns what its calls use (its region
// and ring, mapped, and their memfds; a Device group's rank also its device
// region, ipc mappings and the graphs captured on them); a
// thread per group watches the daemon's connection and, when it closes,
// reconnects with backoff until the group's open timeout and hands the
// region and ring back (Adopt) to the daemon that comes back, which
// re-adopts the group once every local rank did. Calls meanwhile wait for
// their shards as always (the new proxy carries the doorbells left in the
// ring); one whose timeout passes first fails DaemonLost, and so does the
// group when the daemon refuses it or is not back within the open timeout.
// A Device group's kernels end a proxy-route wait DaemonLost once the
// proxy's heartbeat in the ring stops for 500 ms: while the daemon is away
// and the group may still be re-adopted, this thread beats in its place, so
// a kernel waits for the new proxy within its call's timeout; once the
// group fails, the beat stops and the kernels end DaemonLost.
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <ctime>
#include <system_error>
#include <thread>

#include "client/format.hpp"
#include "client/impl.hpp"
#include "client/open_daemon.hpp"
#include "common/unix_socket.hpp"

namespace tpf {

using namespace client_proto;

namespace {

constexpr std::uint64_t kMs = 1000000ull;
constexpr std::uint64_t kFirstBackoffNs = 10 * kMs;
constexpr std::uint64_t kMaxBackoffNs = 200 * kMs;
// The daemon refuses an adoption some rank did not ask for by the open
// timeout; its answer may take this long to arrive.
constexpr std::uint64_t kAnswerGraceNs = 500 * kMs;

std::uint64_t unixNs() {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return std::uint64_t(ts.tv_sec) * 1000000000ull + std::uint64_t(ts.tv_nsec);
}

int msUntil(std::uint64_t deadlineNs) {
    const std::uint64_t now = monotonicNs();
    return now >= deadlineNs ? 0 : int(std::min<std::uint64_t>((deadlineNs - now + kMs - 1) / kMs, 1u << 30));
}

// Bytes to read on `fd` (also after its peer closed it, before they are read).
bool bytesWaiting(int fd) {
    char c;
    return ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

// The proxy's heartbeat (RingHeader::heartbeatNs) written in its place
// every millisecond while this lives: a Device group's rank whose daemon is
// away, so that its kernels wait for the next one.
class StandInBeat {
public:
    explicit StandInBeat(Group::Impl& g) {
        if (!g.gpu || !g.ring.layout().entries) return;
        std::uint64_t* beat = &g.ring.header().heartbeatNs;
        try {
            thread_ = std::thread([this, beat] {
                while (!stop_.load(std::memory_order_acquire)) {
                    std::atomic_ref(*beat).store(monotonicNs(), std::memory_order_relaxed);
                    const timespec ms{0, 1000000};
                    ::nanosleep(&ms, nullptr);
                }
            });
        } catch (const std::system_error&) {
            // Without it the kernels end DaemonLost after 500 ms, as where the group cannot be re-adopted.
            std::fprintf(stderr, "tpfabric: no thread to stand in for the daemon's heartbeat: device calls during the restart "
                                 "fail DaemonLost\n");
        }
    }
    ~StandInBeat() {
        stop_.store(true, std::memory_order_release);
        if (thread_.joinable()) thread_.join();
    }
    StandInBeat(const StandInBeat&) = delete;
    StandInBeat& operator=(const StandInBeat&) = delete;

private:
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

} // namespace

class DaemonWatch {
public:
    explicit DaemonWatch(Group::Impl& g) : g_(g), stop_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
    ~DaemonWatch() { stop(); }
    DaemonWatch(const DaemonWatch&) = delete;
    DaemonWatch& operator=(const DaemonWatch&) = delete;

    Status start() {
        if (!stop_) return Error{Errc::SystemError, format("eventfd for the daemon watch: {}", std::strerror(errno))};
        try {
            thread_ = std::thread([this] { run(); });
        } catch (const std::system_error& e) {
            return Error{Errc::SystemError, format("starting the daemon watch thread: {}", e.what())};
        }
        return okStatus();
    }
    void stop() {
        if (!thread_.joinable()) return;
        const std::uint64_t one = 1;
        [[maybe_unused]] auto n = ::write(stop_.get(), &one, sizeof one);
        thread_.join();
    }
    /// CLOCK_MONOTONIC ns when the daemon's connection closed, 0 while it serves.
    std::uint64_t lostSinceNs() const { return lostSinceNs_.load(std::memory_order_acquire); }
    /// A daemon is back and has this rank's Adopt: it waits for the group's other ranks.
    bool asked() const { return asked_.load(std::memory_order_acquire); }

private:
    enum class Outcome { Adopted, Retry, Refused, Stopped };

    void run();
    Outcome tryAdopt(std::uint64_t lostUnixNs, std::uint64_t deadlineNs, Error& why);
    /// Sleeps up to `ns`; true when stop() was called.
    bool stopWithin(std::uint64_t ns) const {
        pollfd p{stop_.get(), POLLIN, 0};
        return ::poll(&p, 1, int((ns + kMs - 1) / kMs)) > 0;
    }
    /// The group's failure: every wait of this rank ends within a sleep slice.
    void failGroup(Error e) {
        (void)g_.fail(std::move(e));
        auto& c = g_.control();
        std::atomic_ref(c.wakeSeq).fetch_add(1, std::memory_order_seq_cst);
        futexWakeAll(&c.wakeSeq);
    }
    bool groupBroken() const { return std::atomic_ref(g_.failure.code).load(std::memory_order_acquire) != Errc::Ok; }

    Group::Impl& g_;
    UniqueFd stop_;
    std::thread thread_;
    std::atomic<std::uint64_t> lostSinceNs_{0};
    std::atomic<bool> asked_{false};
    std::uint32_t seq_ = 1; ///< its own request numbers: the calls' thread owns g_.seq
};

void DaemonWatchDeleter::operator()(DaemonWatch* w) const { delete w; }

void DaemonWatch::run() {
    for (;;) {
        pollfd p[2] = {{g_.socket.get(), POLLIN | POLLRDHUP, 0}, {stop_.get(), POLLIN, 0}};
        if (::poll(p, 2, -1) < 0) {
            if (errno == EINTR) continue;
            return;
        }
        if (p[1].revents) return;
        // The daemon sends an open group one thing, unasked: why it broke the
        // group (GroupFailed), read also when the connection closed after it.
        // Anything else is read and dropped.
        if ((p[0].revents & POLLIN) && bytesWaiting(g_.socket.get())) {
            auto m = receiveMessage(g_.socket.get(), kReplySpec, 100);
            if (m && m->header.opcode == kGroupFailed)
                if (auto f = decodeFixed<GroupFailed>(m->payload, "GroupFailed"); f && f->groupHandle == g_.handle) {
                    Errc code = Errc::Ok;
                    std::string why;
                    if (errcFromWire(f->errc, code) && getText(f->reason, why)) g_.noteDaemonWhy(Error{code, why});
                }
            continue;
        }
        const bool hungUp = p[0].revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL);
        if (!hungUp && !(p[0].revents & POLLIN)) continue;
        const std::uint64_t lostUnix = unixNs(), lostAt = monotonicNs();
        lostSinceNs_.store(lostAt, std::memory_order_release);
        const std::uint64_t deadline = lostAt + std::uint64_t(g_.options.openTimeout.count()) * kMs;
        std::fprintf(stderr, "tpfabric: rank %u: tpfabricd closed its connection; waiting up to %lld ms for it to come back and "
                             "re-adopt the group\n",
                     g_.rank, static_cast<long long>(g_.options.openTimeout.count()));
        const StandInBeat beat(g_); // until the group is re-adopted or fails
        for (std::uint64_t backoff = kFirstBackoffNs;; backoff = std::min(2 * backoff, kMaxBackoffNs)) {
            // A call failed meanwhile, or the old daemon had recorded a failure of
            // the group (a rank gone, an abort): nothing to re-adopt; the calls
            // report that failure themselves.
            if (groupBroken() || std::atomic_ref(g_.control().error).load(std::memory_order_acquire) != 0) return;
            Error why;
            const Outcome o = tryAdopt(lostUnix, deadline, why);
            if (o == Outcome::Stopped) return;
            if (o == Outcome::Refused) return failGroup(std::move(why));
            if (o == Outcome::Adopted) break;
            const std::uint64_t now = monotonicNs();
            if (now >= deadline)
                return failGroup(Error{Errc::DaemonLost,
                                       format("tpfabricd closed our connection and was not back within the open timeout ({} ms) "
                                              "to re-adopt the group{} (systemctl status tpfabricd)",
                                              g_.options.openTimeout.count(), why.code == Errc::Ok ? "" : ": " + why.describe())});
            if (stopWithin(std::min(backoff, deadline - now))) return;
        }
        const std::uint64_t gapMs = (monotonicNs() - lostAt) / kMs;
        lostSinceNs_.store(0, std::memory_order_release);
        std::fprintf(stderr, "tpfabric: rank %u: the group was re-adopted by the restarted tpfabricd after %llu ms\n", g_.rank,
                     static_cast<unsigned long long>(gapMs));
    }
}

DaemonWatch::Outcome DaemonWatch::tryAdopt(std::uint64_t lostUnixNs, std::uint64_t deadlineNs, Error& why) {
    const int left = msUntil(deadlineNs);
    if (left <= 0) return Outcome::Retry;
    auto fd = connectUnix(daemonSocketPath(g_), std::min(left, 1000));
    if (!fd) return why = fd.error(), Outcome::Retry; // not listening (yet)
    // What another release of the daemon refuses cannot hold: named, and the group fails.
    const auto versionRefused = [&](const Error& e) {
        why = Error{Errc::DaemonLost, format("tpfabricd came back speaking another client protocol ({}); this libtpfabric speaks "
                                             "{}: re-adoption cannot hold (install tpfabricd and libtpfabric of one release; "
                                             "reopen the group)",
                                             e.describe(), kClientVersion)};
        return Outcome::Refused;
    };
    if (auto s = sendMessage(fd->get(), encode(kHello, seq_++, Hello{kRoleRank, 0, 0}), {}, std::min(left, 1000)); !s)
        return why = s.error(), Outcome::Retry;
    auto hello = receiveMessage(fd->get(), kReplySpec, std::max(msUntil(deadlineNs), 1));
    if (!hello) {
        if (hello.code() == Errc::VersionMismatch || hello.code() == Errc::BadMagic) return versionRefused(hello.error());
        return why = hello.error(), Outcome::Retry;
    }
    if (hello->header.opcode == kErrorReply) {
        auto e = decodeFixed<ErrorReply>(hello->payload, "ErrorReply");
        Errc code = Errc::Unavailable;
        if (e) errcFromWire(e->errc, code);
        if (code == Errc::VersionMismatch || code == Errc::BadMagic)
            return versionRefused(Error{code, e ? std::string(e->message) : "refused"});
        return why = Error{code, e ? std::string(e->message) : "refused"}, Outcome::Retry; // Busy: it may pass
    }
    if (hello->header.opcode != kHelloReply) return why = Error{Errc::BadMessage, "no HelloReply"}, Outcome::Retry;
    if (auto h = decodeFixed<HelloReply>(hello->payload, "HelloReply"); !h || h->protocol != kClientVersion)
        return versionRefused(h ? Error{Errc::VersionMismatch, format("protocol {}", h->protocol)} : h.error());
    Adopt m;
    std::memcpy(m.fixed.groupId, g_.groupId.data(), 16);
    m.fixed.rank = g_.rank;
    m.fixed.world = g_.world;
    m.fixed.groupHandle = g_.handle;
    m.fixed.ringEntries = g_.ring.layout().entries;
    m.fixed.agreedCap = g_.agreedCap;
    m.fixed.slotBytes = g_.layout.slotBytes;
    m.fixed.regionBytes = g_.layout.totalBytes();
    m.fixed.stripes = g_.layout.stripes;
    // The daemon answers every rank by the end of this rank's open timeout: refused, naming the rank that did not ask.
    m.fixed.timeoutMs = std::uint32_t(std::clamp(msUntil(deadlineNs), 1, 600000));
    m.fixed.flags = g_.openFlags & (kOpenHostDirect | kOpenGpuDoorbells);
    if (g_.gpu) { // what the DeviceAttach said: the proxy carries the ring to the other peers
        for (std::uint32_t q = 0; q < g_.world; ++q)
            if (q != g_.rank && g_.wires[q] == kWireIpc) m.fixed.ipcPeers |= 1u << q;
        m.fixed.deviceBytes = g_.deviceBytes;
    }
    m.fixed.lostUnixNs = lostUnixNs;
    m.roster = g_.roster;
    const int fds[kAdoptFds] = {g_.regionFd.get(), g_.ringFd.get()};
    if (auto s = sendMessage(fd->get(), encode(seq_++, m), fds, std::max(msUntil(deadlineNs), 1)); !s)
        return why = s.error(), Outcome::Retry;
    // Every local rank must ask before any is answered: wait, but not past stop().
    asked_.store(true, std::memory_order_release);
    const struct Unask {
        std::atomic<bool>& a;
        ~Unask() { a.store(false, std::memory_order_release); }
    } unask{asked_};
    const std::uint64_t answerBy = deadlineNs + kAnswerGraceNs;
    for (;;) {
        pollfd p[2] = {{fd->get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
        const int r = ::poll(p, 2, std::max(msUntil(answerBy), 1));
        if (r < 0 && errno == EINTR) continue;
        if (r > 0 && p[1].revents) return Outcome::Stopped;
        if (r > 0 && p[0].revents) break;
        if (monotonicNs() >= answerBy)
            return why = Error{Errc::Timeout, "the restarted daemon did not answer the re-adoption in time"}, Outcome::Retry;
    }
    auto reply = receiveMessage(fd->get(), kReplySpec, 1000);
    if (!reply) return why = reply.error(), Outcome::Retry; // it died again: try again
    if (reply->header.opcode == kErrorReply) {
        auto e = decodeFixed<ErrorReply>(reply->payload, "ErrorReply");
        why = Error{Errc::DaemonLost, format("tpfabricd restarted and refused to re-adopt the group: {}",
                                             e ? std::string(e->message) : e.error().describe())};
        return Outcome::Refused;
    }
    auto a = reply->header.opcode == kAdopted ? decodeFixed<Adopted>(reply->payload, "Adopted")
                                              : Result<Adopted>(Error{Errc::BadMessage, format("opcode {}", reply->header.opcode)});
    if (!a) {
        why = Error{Errc::DaemonLost, "tpfabricd restarted and answered the re-adoption with " + a.error().describe()};
        return Outcome::Refused;
    }
    if (a->errc != 0) {
        Errc code = Errc::Unavailable;
        errcFromWire(a->errc, code);
        why = Error{Errc::DaemonLost, format("tpfabricd restarted and refused to re-adopt the group: {}: {}",
                                             std::string_view(errcName(code)), std::string(a->reason))};
        return Outcome::Refused;
    }
    if (reply->fds.size() != 1 || a->rank != g_.rank || a->groupHandle != g_.handle) {
        why = Error{Errc::DaemonLost, "tpfabricd restarted and answered the re-adoption for another rank or without its event fd"};
        return Outcome::Refused;
    }
    // The same descriptor numbers, now the new daemon's: calls never see another.
    if (::dup3(reply->fds[0].get(), g_.proxyEvent.get(), O_CLOEXEC) < 0 || ::dup3(fd->get(), g_.socket.get(), O_CLOEXEC) < 0) {
        why = Error{Errc::SystemError, format("dup3 after the re-adoption: {}", std::strerror(errno))};
        return Outcome::Refused;
    }
    return Outcome::Adopted;
}

void Group::Impl::noteDaemonWhy(Error why) {
    {
        const std::lock_guard lock(daemonWhyMutex);
        daemonWhy = std::move(why);
    }
    daemonSaid.store(true, std::memory_order_release);
}

Error Group::Impl::withDaemonWhy(Error e) {
    constexpr int kWaitMs = 20;
    for (int i = 0; watch && i < kWaitMs && !daemonSaid.load(std::memory_order_acquire); ++i) {
        const timespec ms{0, 1000000};
        ::nanosleep(&ms, nullptr);
    }
    if (!daemonSaid.load(std::memory_order_acquire)) return e;
    const std::lock_guard lock(daemonWhyMutex);
    const std::string& why = daemonWhy.detail;
    if (daemonWhy.code != e.code || why.empty() || e.detail.find(why) != std::string::npos) return e;
    if (why.starts_with(e.detail)) e.detail = why; // "rank 3 is gone" -> "rank 3 is gone (its connection closed ...)"
    else e.detail += " (tpfabricd: " + why + ")";
    return e;
}

bool Group::Impl::adoptable() const {
    if (world < 2 || nccl || !region.data()) return false;
    // Every peer by the proxy (on this node, or across nodes, where the
    // other nodes' daemons keep the group while this node's daemon is away),
    // host-direct, or (a Device group) by ipc.
    if (options.buffers == Buffers::Device ? !gpu : options.buffers != Buffers::Host) return false;
    for (std::uint32_t q = 0; q < world; ++q) {
        const bool ipc = wires[q] == kWireIpc && options.buffers == Buffers::Device;
        if (q != rank && !ipc && wires[q] != kWireShm && wires[q] != kWireVerbs && wires[q] != kWireTcp) return false;
    }
    return true;
}

Status startDaemonWatch(Group::Impl& g) {
    if (!g.adoptable()) return okStatus();
    auto w = std::unique_ptr<DaemonWatch, DaemonWatchDeleter>(new DaemonWatch(g));
    if (auto s = w->start(); !s) return s;
    g.watch = std::move(w);
    return okStatus();
}

Status Group::Impl::daemonCheck() {
    if (watch) return broken() ? Status(failure) : okStatus();
    if (!peerClosed(socket.get())) return okStatus();
    return fail(Error{Errc::DaemonLost, "tpfabricd closed our connection during a call, and this group does not wait for a "
                                        "restarted daemon (docs/integration.md, \"A daemon restart\"): reopen it"});
}

bool Group::Impl::daemonAway() const noexcept { return watch && watch->lostSinceNs() != 0; }

Status Group::Impl::timedOut(Error timeout, std::uint32_t peer) {
    const std::uint64_t since = watch ? watch->lostSinceNs() : 0;
    if (!since) return fail(std::move(timeout), peer);
    if (watch->asked())
        return fail(Error{Errc::DaemonLost,
                          format("tpfabricd restarted (its connection closed {} ms ago) and still waits for every rank of the group "
                                 "to ask to be re-adopted: this call waited its timeout ({} ms); the group is broken on this rank "
                                 "(reopen it)",
                                 (monotonicNs() - since) / kMs, options.timeout.count())});
    return fail(Error{Errc::DaemonLost, format("tpfabricd closed our connection {} ms ago and is not back: this call waited its "
                                               "timeout ({} ms); the group is broken on this rank (reopen it)",
                                               (monotonicNs() - since) / kMs, options.timeout.count())});
}

} // namespace tpf
