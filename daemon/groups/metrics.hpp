// Daemon-lifetime counters for `tpfabricctl metrics` (docs/operations.md,
// "Metrics"): what the group table saw happen since the daemon started,
// kept after the groups it counts are gone. The status document carries
// them under "metrics" (docs/status.md; daemon/status/ renders them).
// Control thread only.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <utility>

#include <tpfabric/error.hpp>
#include "proto/ring.hpp"

namespace tpf::daemon {

/// Ranks' call statistics added up: the daemon's own copy, never shared
/// memory. Counts come from clients, so sums wrap rather than trap.
struct CallTotals {
    struct Op {
        std::uint64_t calls = 0;     ///< completed or failed
        std::uint64_t bytes = 0;     ///< shard bytes of completed calls
        std::uint64_t errors = 0;    ///< failed calls
        std::uint64_t latencyNs = 0; ///< sum of completed calls' latencies
        std::array<std::uint64_t, kLatencyBuckets> latency{}; ///< completed calls by latencyBucket
    };
    std::array<Op, kStatsOps> ops{};                               ///< by StatsOp
    std::array<std::uint64_t, kStatsErrcSlots> errorsByCode{};     ///< failed calls by Errc value
    std::uint64_t ncclCalls = 0; ///< Device groups' calls the library handed to NCCL (eager and graph-replayed)
    std::uint64_t ncclBytes = 0; ///< their bytes

    /// Add one rank's stats (a private copy: readStats), less what of them
    /// `before` had counted already (a re-adopted rank's earlier calls) when given.
    void add(const RankStats& s, const RankStats* before = nullptr);
    void add(const CallTotals& t);
};

/// What happened to groups and opens since the daemon started.
class Lifetime {
public:
    /// A group opened on this daemon (every local rank got an ok verdict).
    void groupOpened() { ++groupsOpened_; }
    /// A group broke by a fault this daemon saw (counted once per group).
    void groupBroken(Errc why) { ++broken_[why]; }
    /// This daemon answered one rank's open with a refusal.
    void openRefused(Errc why) { ++refused_[why]; }
    /// A rank reported that its open did not take the fabric path (OpenReport).
    void fallbackReported(Errc why, std::uint16_t outcome) { ++fallbacks_[{why, outcome}]; }
    /// A group was re-adopted after a daemon restart, `gapNs` after its ranks lost the old daemon.
    void groupAdopted(std::uint64_t gapNs) {
        ++groupsAdopted_;
        adoptionGapNs_ += gapNs;
    }
    /// Another node's daemon came back to a group here (restarted, it
    /// re-adopted the group) after `awayNs` with its link closed.
    void peerRejoined(std::uint64_t awayNs) {
        ++peerRejoins_;
        peerAwayNs_ += awayNs;
    }
    /// This daemon refused one rank's Adopt (or its whole group's).
    void adoptionRefused(Errc why) { ++adoptionRefused_[why]; }
    /// A member left: its calls so far stay counted after its ring is gone.
    void rankLeft(const RankStats& last, const RankStats* countedBefore = nullptr) { calls_.add(last, countedBefore); }

    /// Calls of ranks that have left.
    const CallTotals& calls() const { return calls_; }
    std::uint64_t groupsOpened() const { return groupsOpened_; }
    const std::map<Errc, std::uint64_t>& groupsBroken() const { return broken_; }
    const std::map<Errc, std::uint64_t>& openRefusals() const { return refused_; }
    std::uint64_t groupsAdopted() const { return groupsAdopted_; }
    /// The gaps of every re-adopted group added up, ns.
    std::uint64_t adoptionGapNs() const { return adoptionGapNs_; }
    std::uint64_t peerRejoins() const { return peerRejoins_; }
    /// The times other nodes' daemons were away before they rejoined, added up, ns.
    std::uint64_t peerAwayNs() const { return peerAwayNs_; }
    /// Ranks refused re-adoption, by reason.
    const std::map<Errc, std::uint64_t>& adoptionRefusals() const { return adoptionRefused_; }
    /// By (reason, OpenReport outcome).
    const std::map<std::pair<Errc, std::uint16_t>, std::uint64_t>& openFallbacks() const { return fallbacks_; }

private:
    std::uint64_t groupsOpened_ = 0;
    std::uint64_t groupsAdopted_ = 0;
    std::uint64_t adoptionGapNs_ = 0;
    std::uint64_t peerRejoins_ = 0;
    std::uint64_t peerAwayNs_ = 0;
    std::map<Errc, std::uint64_t> adoptionRefused_;
    std::map<Errc, std::uint64_t> broken_;
    std::map<Errc, std::uint64_t> refused_;
    std::map<std::pair<Errc, std::uint16_t>, std::uint64_t> fallbacks_;
    CallTotals calls_;
};

} // namespace tpf::daemon
