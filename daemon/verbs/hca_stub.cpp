// Without verbs: no HCAs.
#include "daemon/verbs/hca.hpp"

#include <spdlog/spdlog.h>

namespace tpf::daemon {

std::vector<client_proto::HcaCard> discoverHcas(const DaemonConfig& cfg) {
    if (!cfg.hcas.empty())
        spdlog::warn("HCAs: none: verbs.hcas is set but this tpfabricd was built without verbs (libibverbs); "
                     "serving same-node groups only");
    else
        spdlog::info("HCAs: none: built without verbs (libibverbs); serving same-node groups only");
    return {};
}

std::uint32_t livePortState(const client_proto::HcaCard& card) { return card.state; }

} // namespace tpf::daemon
