#include "daemon/groups/metrics.hpp"

#include <string>

#include "proto/client_msg.hpp"

namespace tpf::daemon {

namespace {
std::string codeName(std::uint32_t code) {
    Errc e;
    if (errcFromWire(code, e)) return std::string(errcName(e));
    return "Errc" + std::to_string(code); // a newer client's code, still kept apart
}
const char* outcomeName(std::uint16_t outcome) {
    return outcome == client_proto::kOutcomeNccl ? "nccl" : "unavailable"; // validate() admits only these two
}
} // namespace

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

void CallTotals::toJson(nlohmann::json& out) const {
    nlohmann::json calls = nlohmann::json::object();
    for (std::uint32_t o = 0; o < kStatsOps; ++o) {
        const char* name = statsOpName(o);
        if (!name) continue; // a slot no release assigned yet
        const Op& op = ops[o];
        calls[name] = {{"calls", op.calls},
                       {"bytes", op.bytes},
                       {"errors", op.errors},
                       {"latency_sum_ns", op.latencyNs},
                       {"latency_buckets", op.latency}};
    }
    nlohmann::json errors = nlohmann::json::object();
    for (std::uint32_t c = 1; c < kStatsErrcSlots; ++c)
        if (errorsByCode[c]) errors[codeName(c)] = errorsByCode[c];
    out["calls"] = std::move(calls);
    out["call_errors"] = std::move(errors);
}

void Lifetime::toJson(nlohmann::json& out) const {
    const auto byName = [](const std::map<Errc, std::uint64_t>& m) {
        nlohmann::json j = nlohmann::json::object();
        for (const auto& [code, n] : m) j[std::string(errcName(code))] = n;
        return j;
    };
    nlohmann::json fallbacks = nlohmann::json::array();
    for (const auto& [key, n] : fallbacks_)
        fallbacks.push_back({{"reason", std::string(errcName(key.first))}, {"outcome", outcomeName(key.second)}, {"count", n}});
    out["groups_opened"] = groupsOpened_;
    out["groups_broken"] = byName(broken_);
    out["open_refusals"] = byName(refused_);
    out["open_fallbacks"] = std::move(fallbacks);
}

} // namespace tpf::daemon
