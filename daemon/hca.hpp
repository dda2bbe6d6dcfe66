// HCA discovery. Built without the verbs feature (or with no RoCE port
// active) it reports zero HCAs, and only same-node groups open.
#pragma once

#include <string>
#include <vector>

#include "daemon/config.hpp"
#include "proto/client_msg.hpp"

namespace tpf::daemon {

/// The HCA ports this daemon serves, as its node card and status show them.
std::vector<client_proto::HcaCard> discoverHcas(const DaemonConfig& cfg);

} // namespace tpf::daemon
