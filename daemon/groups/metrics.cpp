#include "daemon/groups/metrics.hpp"

namespace tpf::daemon {

void CallTotals::add(const RankStats& s) {
    for (std::uint32_t o = 0; o < kStatsOps; ++o) {
        const OpStats& from = s.ops[o];
        Op& to = ops[o];
        to.calls += from.calls;
        to.bytes += from.bytes;
        to.errors += from.errors;
        to.latencyNs += from.latencyNs;
        for (std::uint32_t b = 0; b < kLatencyBuckets; ++b) to.latency[b] += from.latency[b];
    }
    for (std::uint32_t c = 0; c < kStatsErrcSlots; ++c) errorsByCode[c] += s.errorsByCode[c];
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
}

} // namespace tpf::daemon
