#include "daemon/groups/metrics.hpp"

namespace tpf::daemon {

void CallTotals::add(const RankStats& s, const RankStats* before) {
    static const RankStats kNone{};
    const RankStats& b = before ? *before : kNone;
    // Counters only grow; a rank's stats below what was read before would be a bad ring: nothing is added then.
    const auto since = [](std::uint64_t now, std::uint64_t then) { return now > then ? now - then : 0; };
    for (std::uint32_t o = 0; o < kStatsOps; ++o) {
        const OpStats& from = s.ops[o];
        const OpStats& was = b.ops[o];
        Op& to = ops[o];
        to.calls += since(from.calls, was.calls);
        to.bytes += since(from.bytes, was.bytes);
        to.errors += since(from.errors, was.errors);
        to.latencyNs += since(from.latencyNs, was.latencyNs);
        for (std::uint32_t k = 0; k < kLatencyBuckets; ++k) to.latency[k] += since(from.latency[k], was.latency[k]);
    }
    for (std::uint32_t c = 0; c < kStatsErrcSlots; ++c) errorsByCode[c] += since(s.errorsByCode[c], b.errorsByCode[c]);
    ncclCalls += since(s.ncclCalls, b.ncclCalls) + since(s.ncclGraphCalls, b.ncclGraphCalls);
    ncclBytes += since(s.ncclBytes, b.ncclBytes) + since(s.ncclGraphBytes, b.ncclGraphBytes);
}

void CallTotals::add(const CallTotals& t) {
    for (std::uint32_t o = 0; o < kStatsOps; ++o) {
        ops[o].calls += t.ops[o].calls;
        ops[o].bytes += t.ops[o].bytes;
        ops[o].errors += t.ops[o].errors;
        ops[o].latencyNs += t.ops[o].latencyNs;
        for (std::uint32_t b = 0; b < kLatencyBuckets; ++b) ops[o].latency[b] += t.ops[o].latency[b];
    }
    for (std::uint32_t c = 0; c < kStatsErrcSlots; ++c) errorsByCode[c] += t.errorsByCode[c];
    ncclCalls += t.ncclCalls;
    ncclBytes += t.ncclBytes;
}

} // namespace tpf::daemon
