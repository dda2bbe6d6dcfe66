// tpfabricd configuration: every key has a default, so the daemon runs with no
// file at all. systemd/tpfabricd.conf.example documents every key.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tpf::daemon {

/// Thrown by loadConfig, applyFlag, checkOnHost and readPeerKey for a bad file,
/// key, flag or value. what() is one line that names the file and line (or the
/// flag), the key (as "section.key") and what is allowed; main exits 2 on it.
struct ConfigError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct DaemonConfig {
    // [daemon]
    std::string socketPath;                    ///< daemon.socket; "" = $RUNTIME_DIRECTORY/tpfabricd.sock, else /run/tpfabric/tpfabricd.sock
    std::string socketGroup = "tpfabric";      ///< daemon.socket_group; group owning the socket (mode 0660); missing group: keep ours, warn
    std::string logLevel = "info";             ///< daemon.log_level: trace, debug, info, warn, error, critical, off
    std::uint64_t maxBytes = 512 * 1024;       ///< daemon.max_bytes: largest shard a rank may use (usable cap), 4KiB..1GiB; "512KiB" or integer
    std::uint32_t ringEntries = 64;            ///< daemon.ring_entries: command ring entries per client, power of two 8..4096
    std::uint32_t openTimeoutMs = 30000;       ///< daemon.open_timeout_ms: how long a group waits for all its ranks, 100..600000
    std::uint32_t maxClients = 256;            ///< daemon.max_clients: connections at once, 1..65536
    std::uint32_t maxClientsPerUid = 128;      ///< daemon.max_clients_per_uid: connections at once of one uid, 1..65536
    std::uint32_t messageTimeoutMs = 5000;     ///< daemon.message_timeout_ms: a client's message (its first: from connecting) may stay incomplete this long, 100..600000
    std::uint32_t maxGroups = 64;              ///< daemon.max_groups: groups at once, 1..4096
    std::uint64_t maxRegionBytes = 16ull << 30; ///< daemon.max_region_bytes: all regions together, 1MiB..1024GiB

    // [proxy]
    int proxyCpu = -1;                         ///< proxy.cpu: pin the proxy thread to this CPU; -1 = do not pin
    std::uint32_t proxySpinUs = 50;            ///< proxy.spin_us: busy-poll this long without work before sleeping, 0..1000000
    std::uint32_t heartbeatMs = 100;           ///< proxy.heartbeat_ms: ring heartbeat period while idle, 10..10000
    std::uint32_t gpuPollUs = 0;               ///< proxy.gpu_poll_us: sleep between polls of GPU rings once idle, 0 (busy-poll)..1000
    std::uint32_t carryThreads = 2;            ///< proxy.carry_threads: helper threads copying parts of large shards, 0..16

    // [peer]
    std::string peerListen = "";               ///< peer.listen: address for daemon<->daemon TCP; "" = peer negotiation off
    std::uint16_t peerPort = 18515;            ///< peer.port: TCP port, 1..65535
    std::string peerKeyFile = "";              ///< peer.key_file: cluster key file (>= 32 bytes); "" = no key
    std::uint32_t peerConnectTimeoutMs = 5000; ///< peer.connect_timeout_ms, 100..600000
    /// peer.wire: "auto" (verbs with a usable HCA, else tcp), "verbs" or "tcp" (docs/wires.md).
    enum class PeerWire : std::uint8_t { Auto, Verbs, Tcp };
    PeerWire peerWire = PeerWire::Auto;
    /// peer.restart_wait_ms: how long a group spanning nodes waits for another
    /// node's daemon whose link closed to come back (restarted, the group
    /// re-adopted) before it breaks with PeerLost, 0 (at once)..600000.
    std::uint32_t peerRestartWaitMs = 30000;
    std::uint64_t tcpInflightBytes = 4ull << 20; ///< peer.tcp_inflight_bytes: a tcp data link's send buffer (SO_SNDBUF), 64KiB..1GiB

    // [verbs]
    std::vector<std::string> hcas;             ///< verbs.hcas: device names ("mlx5_0", "rxe0") or IPs; [] = $TPF_HCA, $NCCL_IB_HCA, every active RoCE port
    std::uint64_t inflightBytes = 1024 * 1024; ///< verbs.inflight_bytes: in-flight WRITE bytes per peer stripe, 4KiB..1GiB
    std::uint32_t qpTimeoutMs = 2000;          ///< verbs.qp_timeout_ms: how long QPs may take to come up, 100..600000

    /// Where the values came from, for status: "built-in defaults" or the file path.
    std::string source = "built-in defaults";
    /// Where each key not left at its default was set ("section.key" ->
    /// "FILE:LINE" or the flag, "--socket"), for the messages of checks made
    /// after loading (checkOnHost, readPeerKey).
    std::map<std::string, std::string> origin;
};

/// Reads a TOML file over the defaults. Unknown sections or keys, wrong
/// types and out-of-range values throw ConfigError naming the key.
DaemonConfig loadConfig(const std::string& path);

/// Defaults only (no file).
DaemonConfig defaultConfig();

/// A command-line flag that overrides one key ("daemon.socket",
/// "daemon.log_level"): `value` is checked by the key's own rule, as if the file
/// set it to that string, and a refusal names the flag ("--socket: ...").
/// Throws ConfigError; a key that does not exist is a programming error
/// (std::logic_error). Only keys whose file values are strings fit: the rule
/// sees a TOML string.
void applyFlag(DaemonConfig& cfg, std::string_view key, std::string_view flag, const std::string& value);

/// The cluster key of peer.key_file as read from disk.
struct PeerKey {
    std::vector<std::uint8_t> bytes; ///< the whole file, at least 32 bytes
    std::uint32_t mode = 0;          ///< its permission bits (st_mode & 07777): group or other bits deserve a warning
};

/// Reads peer.key_file: nullopt when none is configured. Throws ConfigError,
/// naming the config file and line, when it cannot be read, is not a regular
/// file or holds fewer than 32 bytes. The one reader of the key: PeerService
/// at start and checkOnHost (so --check-config) both call it.
std::optional<PeerKey> readPeerKey(const DaemonConfig& cfg);

/// The checks a file cannot settle alone, made against this host and process:
/// proxy.cpu is one of the CPUs this process may run on (sched_getaffinity),
/// and peer.key_file reads as a key (readPeerKey). Throws ConfigError naming
/// the config file and key. Returns warnings, one line each, for what works
/// but should be fixed (a key file readable by others).
std::vector<std::string> checkOnHost(const DaemonConfig& cfg);

/// Keys each valid alone whose combination makes one of them do nothing
/// (daemon.max_clients_per_uid, where set, above daemon.max_clients), one line each:
/// --check-config prints them as warnings, a start logs them.
std::vector<std::string> combinationWarnings(const DaemonConfig& cfg);

/// --check-config only: peer.listen ("" passes) is an address of this host
/// now (a socket bound to it on port 0, then closed: the port itself is not
/// tried, a running daemon holds it). Throws ConfigError naming the config
/// file and key. A start does not ask: an address not up yet at boot fails
/// its listen, exit 1, and systemd tries again.
void checkListenAddress(const DaemonConfig& cfg);

/// The CPUs this process may run on, ascending (sched_getaffinity); empty if
/// that cannot be read.
std::vector<int> allowedCpus();

/// CPU numbers as ranges, "0-3,8,10-11".
std::string cpuList(const std::vector<int>& cpus);

/// The socket path when neither daemon.socket nor RUNTIME_DIRECTORY names one;
/// its directory is the shipped unit's RuntimeDirectory=.
inline constexpr const char* kDefaultSocketPath = "/run/tpfabric/tpfabricd.sock";

/// The socket path after applying the RUNTIME_DIRECTORY rule to cfg.socketPath.
std::string resolveSocketPath(const DaemonConfig& cfg);

} // namespace tpf::daemon
