// tpfabricctl's side of the status exchange: connect to tpfabricd's control
// socket, Hello as a control client, ask for the status document, parse it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include <tpfabric/error.hpp>

namespace tpf::ctl {

/// Where tpfabricd listens unless the config file says otherwise.
inline constexpr const char* kDefaultSocketPath = "/run/tpfabric/tpfabricd.sock";
/// Environment variable that overrides kDefaultSocketPath (--socket overrides both).
inline constexpr const char* kSocketEnv = "TPF_SOCKET";

/// $TPF_SOCKET when set and non-empty, else kDefaultSocketPath.
std::string defaultSocketPath();

/// Connect to `socketPath`, send Hello{kRoleControl} then StatusRequest, and
/// return the daemon's status document (a JSON object, see docs/status.md),
/// members in the order the daemon sent them.
/// The whole exchange, connect excluded, must finish within `timeoutMs`.
///
/// On failure the Error's code says what kind of failure it was
/// (DaemonUnreachable, Timeout, DaemonLost, BadMessage, BadMagic, ..., or the
/// code of the daemon's ErrorReply), and its detail is one complete line for
/// an operator: what failed, at which socket, and what to do about it.
Result<nlohmann::ordered_json> fetchStatus(const std::string& socketPath, int timeoutMs);

} // namespace tpf::ctl
