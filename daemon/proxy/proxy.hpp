// The proxy thread: polls the command rings of open groups and carries each
// doorbell out to every peer through that peer's transport (transport.hpp:
// shm copies + release stores of the epoch flag, verbs RDMA WRITEs under each
// queue pair's in-flight cap, nothing where the rank moves the shard itself);
// a doorbell whose transport comes back later (a queue pair at its cap) is
// resumed on a later pass, so it holds up only its own ring. Busy-polls
// while there is work, sleeps on an eventfd after proxy.spin_us without any
// (idle CPU about 0), and never sleeps while it serves a ring that GPU
// kernels may ring (a kernel cannot write the eventfd): a Device group
// member with a proxy-route peer, or one that has not reported its wires
// yet (DeviceAttach). Members whose every peer is ipc cost nothing while
// idle. A doorbell's rows between regions of this node
// are copied by the carry threads as well (carry.hpp): each row of 64 KiB
// and more in parts, the smaller ones together when they come to 64 KiB.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/fd.hpp"
#include "daemon/proxy/carry.hpp"
#include "daemon/proxy/shared_state.hpp"
#include "daemon/proxy/transport.hpp"
#include "daemon/tcp/tcp_link.hpp"
#include "daemon/verbs/qp.hpp"
#include "daemon/verbs/verbs_group.hpp"
#include "proto/client_msg.hpp"

namespace tpf::daemon {

/// What the proxy knows of one open group. Built by the control thread; the
/// proxy reads it, and only `broken`, `carriedThrough` and `gone` change
/// afterwards.
struct ProxyGroup {
    std::uint32_t handle = 0;
    std::uint32_t world = 0;
    Layout layout{};
    std::uint64_t agreedCap = 0;
    std::array<std::shared_ptr<HostRegion>, kMaxWorld> regions{}; ///< local ranks only
    /// How this node reaches each rank; the transports are chosen from them.
    std::array<std::uint8_t, kMaxWorld> wires{};
    std::shared_ptr<VerbsGroup> verbs; ///< set when some rank is on another node and the group is on the verbs wire
    std::shared_ptr<TcpGroup> tcp;     ///< or on the tcp wire
    /// Once broken: doorbells of epochs up to this are still carried (ranks
    /// closed in order after it: ControlBlock::carriedThrough); 0 after a
    /// fault. Stored before `broken` (release).
    std::atomic<std::uint64_t> carriedThrough{0};
    /// Ranks that closed in order (bit per rank): nothing is carried to them.
    std::atomic<std::uint32_t> gone{0};
    std::atomic<bool> broken{false};

    /// A doorbell of `epoch` is no longer carried.
    bool drops(std::uint64_t epoch) const {
        return broken.load(std::memory_order_acquire) && epoch > carriedThrough.load(std::memory_order_relaxed);
    }
};

/// One peer of a ProxyRank and the transport that carries the rank's
/// doorbells to it.
struct ProxyPeer {
    std::uint32_t rank = 0;
    std::shared_ptr<Transport> transport;
    bool watchesInbound = false; ///< transport->watchesInbound(), read every poll pass
};

/// Epochs of one local rank to send again to some of its peers, once: their
/// node's daemon restarted and its record shows what landed there
/// (GroupTable::negotiationBack, or this daemon's own restart). The group
/// table attaches it to the rank's entry of every table it publishes until
/// the proxy took it.
struct Resend {
    struct Peer {
        std::uint32_t rank;   ///< the peer
        std::uint64_t landed; ///< its region holds the rank's rows up to this epoch
    };
    std::vector<Peer> peers;
    std::atomic<bool> taken{false}; ///< the proxy sent them (Proxy::resend)
};

/// One local rank the proxy serves: its group, its ring, and a transport per
/// peer.
struct ProxyRank {
    std::shared_ptr<ProxyGroup> group;
    std::uint32_t rank = 0;
    std::shared_ptr<CommandRing> ring;
    /// GPU kernels may ring this ring: the proxy never sleeps while it serves it.
    bool gpuDoorbells = false;
    /// The group's other ranks in peerAt order (addPeer), each with the
    /// transport chosen for it (GroupTable::publishProxyTable). A rank all
    /// of whose transports are direct never rings.
    std::vector<ProxyPeer> peers;
    bool watchesInbound = false;     ///< some peer's watchesInbound
    std::uint64_t inboundFlagSum = 0; ///< proxy-private: those peers' flags last seen (to wake sleeping waits)
    /// Epochs to send again before anything else of this rank (null: none).
    std::shared_ptr<Resend> resend;

    /// Append the next peer in peerAt order.
    void addPeer(std::uint32_t peer, std::shared_ptr<Transport> transport) {
        const bool watches = transport->watchesInbound();
        peers.push_back(ProxyPeer{peer, std::move(transport), watches});
        watchesInbound |= watches;
    }
    /// Some transport's writes may not have landed yet (Transport::inFlight).
    bool inFlight() const {
        for (const auto& p : peers)
            if (p.transport->inFlight()) return true;
        return false;
    }
};

/// What the proxy reports. Called on the proxy thread: an implementation
/// posts each report on to the thread that acts on it (the daemon's group
/// table: its control thread) and returns.
class ProxyEvents {
public:
    virtual ~ProxyEvents() = default;
    /// Every doorbell published before table `version` was published is
    /// carried out, and the RDMA WRITEs of the ranks that left the table with
    /// it completed (every shard they posted landed on the other nodes), or
    /// 1 s passed since the switch (Proxy::kLandingNs).
    virtual void drained(std::uint64_t version) = 0;
    /// A rank's doorbell or ring was invalid; its group must break.
    virtual void badDoorbell(std::uint32_t groupHandle, std::uint32_t rank, Error why) = 0;
    /// A queue pair to a remote rank failed (error completion or post): its group must break.
    virtual void peerFailed(std::uint32_t groupHandle, std::uint32_t remoteRank, Error why) = 0;
    /// Epochs first..last of local rank `rank` were carried again to `peer`
    /// (Resend: its node's daemon came back, or this one restarted).
    virtual void resent(std::uint32_t groupHandle, std::uint32_t rank, std::uint32_t peer, std::uint64_t first,
                        std::uint64_t last) = 0;
};

/// The proxy's settings ([proxy] of the config, docs/configuration.md; the
/// daemon passes every one from DaemonConfig). These defaults are a Proxy's
/// without a config, as the unit tests build it: carry threads off, the
/// rest as the config's.
struct ProxyOptions {
    std::uint32_t spinUs = 50;       ///< busy-poll this long without work before sleeping
    std::uint32_t heartbeatMs = 100; ///< ring heartbeat period while idle
    int cpu = -1;                    ///< pin the proxy thread to this CPU; -1: not pinned
    /// While it serves rings GPU kernels may ring and has had no work for
    /// spinUs, sleep this long between polls instead of busy-polling (0:
    /// busy-poll, a whole core for as long as such a group is open; else
    /// about one poll pass a period, and a doorbell waits up to that much
    /// longer).
    std::uint32_t gpuPollUs = 0;
    /// Helper threads copying beside the proxy the rows it carries between
    /// same-node regions: parts of rows of CarryPool::kSplitMin bytes and
    /// more, a doorbell's smaller rows together from kSplitMin (carry.hpp).
    std::uint32_t carryThreads = 0;
};

class Proxy : private TransportHost {
public:
    /// `events` outlives the proxy (the daemon: the group table that owns it).
    Proxy(const ProxyOptions& options, ProxyEvents& events);
    ~Proxy();
    Proxy(const Proxy&) = delete;
    Proxy& operator=(const Proxy&) = delete;

    /// The HCAs whose CQs the proxy polls (before start()).
    void setHcas(std::vector<std::shared_ptr<VerbsHca>> hcas) { hcas_ = std::move(hcas); }
    Status start();
    void stop();

    /// How long drained() waits at most for the RDMA WRITEs of leaving ranks.
    static constexpr std::uint64_t kLandingNs = 1000000000ull;

    /// Replace the set of served ranks (control thread). The proxy drains the
    /// old set before switching and, once the leaving ranks' RDMA WRITEs
    /// completed (or kLandingNs passed), reports drained(version).
    void publish(std::vector<ProxyRank> table, std::uint64_t version);

    /// The eventfd clients write to wake an idle proxy (dup it for each client).
    int eventFd() const { return eventFd_.get(); }
    void wake() const;

    std::uint64_t doorbells() const { return doorbells_.load(std::memory_order_relaxed); }
    /// Time the proxy thread has been awake since start() (busy-polling or
    /// carrying out doorbells, not asleep on its eventfd), ns. Any thread;
    /// the proxy reads the clock for it only when it falls asleep or wakes.
    std::uint64_t busyNs() const;
    bool sleeping() const { return sleeping_.load(std::memory_order_relaxed); }
    int cpu() const { return cpu_; }
    std::uint32_t carryThreads() const { return carry_.threads(); }
    /// Shard parts the carry threads copied since start.
    std::uint64_t carryParts() const { return carry_.parts(); }

private:
    void run();
    std::size_t pollOnce(std::vector<ProxyRank>& table);
    /// Pop one doorbell of the ring and start it; false when there is none.
    bool popOne(ProxyRank& pr);
    /// Check a popped doorbell and start carrying it out (resume()).
    void deliver(ProxyRank& pr, const Doorbell& d);
    /// Carry out the ring's doorbell in progress through the rank's
    /// transports, in peerAt order from the delivery's peer on; true once it
    /// is done (or dropped: group broken), false when a transport came back
    /// later. Same-node rows join the doorbell's batch (carryBatch).
    bool resume(ProxyRank& pr);
    /// Copy the batch's rows (with the carry threads), release their flags
    /// (the doorbell's epoch; gpu: every kFlagCopies copy, the rows kept to
    /// demote) and wake their waits: at the end of a doorbell, and before a
    /// transport's come-back-later.
    void carryBatch(std::uint64_t epoch, bool gpu);
    /// The rank's epochs after each Resend peer's landed one, up to the last
    /// it took, carried again to that peer (all but the one in progress, if
    /// it has yet to reach the peer). A doorbell no longer in the ring breaks
    /// the group (badDoorbell).
    void resend(ProxyRank& pr);
    /// Finish the deliveries of rings leaving the table, waiting on the caps
    /// (so that drained() still means every doorbell was carried out).
    void finishLeaving(std::vector<ProxyRank>& old, const std::vector<ProxyRank>& next);
    bool goIdle(std::vector<ProxyRank>& table);
    /// Poll every HCA CQ with requests outstanding; true if any is still busy.
    bool pollCqs();
    // TransportHost
    void pollCompletions() override { pollCqs(); }
    void peerFailed(std::uint32_t groupHandle, std::uint32_t remoteRank, Error why) override;
    /// Wake host waits of ranks whose flags another node wrote (peers whose
    /// transport watchesInbound); true if such a rank is waiting (then the
    /// proxy must not sleep).
    bool wakeInboundWaiters(std::vector<ProxyRank>& table);
    void retire(const std::vector<ProxyRank>& old, const std::vector<ProxyRank>& next);
    /// Note the ranks leaving the table whose writes are in flight (ProxyRank::inFlight): drained() waits for them.
    void land(const std::vector<ProxyRank>& old, const std::vector<ProxyRank>& next, std::uint64_t nowNs);
    /// Report drained(drainDue_) once every leaving rank's writes landed (or kLandingNs passed).
    void reportDrained(std::uint64_t nowNs);
    /// Proxy thread, at each sleep/wake transition: close or open an awake period.
    void markAwake(bool awake, std::uint64_t nowNs);

    const std::uint64_t spinNs_;
    const std::uint32_t heartbeatMs_;
    const int cpu_;
    const std::uint64_t gpuPollNs_;
    ProxyEvents& events_;
    UniqueFd eventFd_;
    CarryPool carry_;
    std::thread thread_;
    std::atomic<bool> running_{false};
    std::atomic<bool> sleeping_{false};
    std::atomic<std::uint64_t> doorbells_{0};
    // busyNs(): a seqlock the proxy thread writes at sleep/wake only.
    std::atomic<std::uint32_t> busySeq_{0};      ///< odd while the proxy updates the two below
    std::atomic<std::uint64_t> busyDoneNs_{0};   ///< awake periods that ended
    std::atomic<std::uint64_t> awakeSinceNs_{0}; ///< start of the awake period now, 0 while asleep

    std::mutex mutex_; // guards pending_, pendingVersion_
    std::vector<ProxyRank> pending_;
    std::uint64_t pendingVersion_ = 0;
    std::atomic<std::uint64_t> publishedVersion_{0};

    std::vector<std::shared_ptr<VerbsHca>> hcas_;
    struct Retiring {
        std::shared_ptr<VerbsGroup> group;
        std::uint64_t sinceNs;
        bool flushed = false;
    };
    /// Rows the proxy copied for a GPU to read, with their flag lines, whose
    /// lines it pushes out of its core's caches in idle passes (demoteLines):
    /// a GPU's read of a line still in this core's cache waits on a snoop
    /// (demoted, a 4 KiB call's flags-to-output takes 1.8 us instead of 2.2).
    /// One kDemoteChunk a pass, newest row first, its flag line after it, so
    /// a doorbell that comes meanwhile waits on one chunk at most (a whole
    /// row a pass adds about 1 us to a 16-byte hop's p99). A hint, not owed: all
    /// dropped at a table switch (their regions may go), and rows past
    /// kDemotesHeld are not held (keeping the newest instead is no faster at
    /// W = 8).
    struct Demote {
        const std::uint8_t* row;
        std::size_t bytes; ///< left to demote
        const std::uint64_t* flag;
    };
    static constexpr std::size_t kDemoteMax = 16 * 1024; ///< rows above this are left alone (demoting a 64 KiB row slows the calls)
    static constexpr std::size_t kDemoteChunk = 1024;
    static constexpr std::size_t kDemotesHeld = 64;
    std::vector<Demote> demotes_; ///< proxy thread
    static constexpr std::size_t kBatchReserve = (kMaxWorld - 1) * kMaxStripes; ///< a doorbell's rows, at most
    CarryRows batch_; ///< same-node rows of the doorbell in progress (proxy thread)
    std::vector<Retiring> retiring_; ///< dropped groups whose QPs still have requests posted (proxy thread)
    struct Landing {
        std::vector<ProxyPeer> peers; ///< the leaving rank's transports (they keep their links alive)
        std::uint64_t sinceNs;
    };
    std::vector<Landing> landing_; ///< ranks that left with writes still in flight (proxy thread)
    std::uint64_t drainDue_ = 0;   ///< table version whose drained() waits for landing_ (0: none)
};

} // namespace tpf::daemon
