// Without verbs: no HCAs.
#include "daemon/hca.hpp"

namespace tpf::daemon {

std::vector<client_proto::HcaCard> discoverHcas(const DaemonConfig&) { return {}; }

} // namespace tpf::daemon
