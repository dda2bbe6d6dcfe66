// Without verbs: no HCAs.
#include "daemon/verbs/hca.hpp"

#include <spdlog/spdlog.h>

namespace tpf::daemon {

std::vector<client_proto::HcaCard> discoverHcas(const DaemonConfig& cfg, std::string* noneWhy) {
    const std::string why = cfg.hcas.empty() ? "built without verbs (libibverbs)"
                                             : "verbs.hcas is set but this tpfabricd was built without verbs (libibverbs)";
    spdlog::log(cfg.hcas.empty() ? spdlog::level::info : spdlog::level::warn, "HCAs: none: {}; {}", why,
                withoutHcas(cfg));
    if (noneWhy) *noneWhy = why;
    return {};
}

std::uint32_t livePortState(const client_proto::HcaCard& card) { return card.state; }

} // namespace tpf::daemon
