// The status document (docs/status.md), built in this one place from every
// room's state: the daemon and its proxy, HCAs, peers, groups, regions and
// the lifetime counters of `tpfabricctl metrics`. tpfabricctl prints it
// (status, status --json, metrics); the control socket serves it as a
// StatusReply. Control thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/ids.hpp"
#include "daemon/config/config.hpp"
#include "daemon/groups/groups.hpp"
#include "daemon/proxy/proxy.hpp"
#include "proto/client_msg.hpp"

namespace tpf::daemon {

/// What the document is built from; references outlive the builder.
struct StatusSources {
    const DaemonConfig& cfg;
    NodeId nodeId;
    std::string socketPath;
    std::uint64_t startedUnixNs = 0;
    std::chrono::steady_clock::time_point startedSteady;
    const std::vector<client_proto::HcaCard>& hcas; ///< as discovery chose them
    std::string hcasNoneReason;                     ///< why hcas is empty (discoverHcas), "" when it is not
    const Proxy& proxy;
    const GroupTable& groups;
};

/// The whole document, "status_version" 2; `clients`: connections on the
/// control socket now (the server asking for it knows them).
nlohmann::json statusDocument(const StatusSources& s, std::size_t clients);

} // namespace tpf::daemon
