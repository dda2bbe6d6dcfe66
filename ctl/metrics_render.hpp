// `tpfabricctl metrics`: the daemon's status document (docs/status.md) as the
// Prometheus text exposition format (version 0.0.4), rendered by
// prometheus-cpp. Every metric is listed in docs/operations.md, "Metrics".
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <tpfabric/error.hpp>

namespace tpf::ctl {

/// The oldest status_version that carries "metrics".
inline constexpr std::int64_t kMetricsStatusVersion = 2;

/// Upper bounds (`le`) of tpfabric_call_latency_seconds, in ns: powers of two
/// from 1.024 us to 0.537 s, each a bucket edge of proto/ring.hpp's
/// log-linear histogram, so every count is exact; +Inf follows.
std::vector<std::uint64_t> latencyBoundsNs();

/// Render `doc` (a status document of status_version >= 2). A document
/// without "metrics" (an older daemon) fails with VersionMismatch; a field
/// missing or of the wrong type fails with BadMessage naming it
/// ("metrics.calls.all_gather.bytes"). The detail is one line for an operator.
Result<std::string> renderMetrics(const nlohmann::ordered_json& doc);

} // namespace tpf::ctl
