// tpfabricd configuration (daemon/config.hpp): defaults, every key, every refusal,
// the shipped example, and the socket path rule.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"
#include "daemon/config/config.hpp"

using namespace tpf::daemon;

namespace {

/// A scratch directory removed with everything in it at scope exit.
struct TempDir {
    std::string path;
    TempDir() {
        const char* base = std::getenv("TMPDIR");
        std::string tmpl = std::string(base && *base ? base : "/tmp") + "/tpf_config_XXXXXX";
        REQUIRE(mkdtemp(tmpl.data()) != nullptr);
        path = tmpl;
    }
    ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
    std::string write(const std::string& name, const std::string& text) const {
        const std::string p = path + "/" + name;
        std::ofstream(p, std::ios::binary) << text;
        return p;
    }
};

/// Loads text as a config file.
DaemonConfig load(const std::string& text) {
    TempDir dir;
    return loadConfig(dir.write("tpfabricd.conf", text));
}

/// The ConfigError message for text, or "" when it loads.
std::string refusal(const std::string& text) {
    try {
        load(text);
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "";
}

/// Sets or unsets an environment variable for one scope.
struct EnvVar {
    std::string name;
    std::optional<std::string> saved;
    EnvVar(std::string n, const char* value) : name(std::move(n)) {
        if (const char* old = std::getenv(name.c_str())) saved = old;
        if (value) setenv(name.c_str(), value, 1);
        else unsetenv(name.c_str());
    }
    ~EnvVar() {
        if (saved) setenv(name.c_str(), saved->c_str(), 1);
        else unsetenv(name.c_str());
    }
};

/// Every field but source and origin (where values came from, not values). The
/// structured binding stops compiling when a field is added to DaemonConfig, so
/// a new key cannot be left out of this comparison.
void checkSameValues(const DaemonConfig& a, const DaemonConfig& b) {
    [[maybe_unused]] const auto& [f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19,
                                  f20, f21, f22, f23, f24, f25, f26, f27, f28] = a;
    CHECK(a.socketPath == b.socketPath);
    CHECK(a.socketGroup == b.socketGroup);
    CHECK(a.logLevel == b.logLevel);
    CHECK(a.maxBytes == b.maxBytes);
    CHECK(a.ringEntries == b.ringEntries);
    CHECK(a.openTimeoutMs == b.openTimeoutMs);
    CHECK(a.maxClients == b.maxClients);
    CHECK(a.maxClientsPerUid == b.maxClientsPerUid);
    CHECK(a.messageTimeoutMs == b.messageTimeoutMs);
    CHECK(a.maxGroups == b.maxGroups);
    CHECK(a.maxRegionBytes == b.maxRegionBytes);
    CHECK(a.proxyCpu == b.proxyCpu);
    CHECK(a.proxySpinUs == b.proxySpinUs);
    CHECK(a.heartbeatMs == b.heartbeatMs);
    CHECK(a.gpuPollUs == b.gpuPollUs);
    CHECK(a.carryThreads == b.carryThreads);
    CHECK(a.peerListen == b.peerListen);
    CHECK(a.peerPort == b.peerPort);
    CHECK(a.peerKeyFile == b.peerKeyFile);
    CHECK(a.peerConnectTimeoutMs == b.peerConnectTimeoutMs);
    CHECK(a.peerRestartWaitMs == b.peerRestartWaitMs);
    CHECK(a.peerWire == b.peerWire);
    CHECK(a.tcpInflightBytes == b.tcpInflightBytes);
    CHECK(a.hcas == b.hcas);
    CHECK(a.inflightBytes == b.inflightBytes);
    CHECK(a.qpTimeoutMs == b.qpTimeoutMs);
}

} // namespace

TEST_CASE("defaults are the documented values") {
    const DaemonConfig c = defaultConfig();
    CHECK(c.socketPath.empty());
    CHECK(c.socketGroup == "tpfabric");
    CHECK(c.logLevel == "info");
    CHECK(c.maxBytes == 512 * 1024);
    CHECK(c.ringEntries == 64);
    CHECK(c.openTimeoutMs == 30000);
    CHECK(c.maxClients == 256);
    CHECK(c.maxClientsPerUid == 128);
    CHECK(c.messageTimeoutMs == 5000);
    CHECK(c.maxGroups == 64);
    CHECK(c.maxRegionBytes == 16ull << 30);
    CHECK(c.proxyCpu == -1);
    CHECK(c.proxySpinUs == 50);
    CHECK(c.heartbeatMs == 100);
    CHECK(c.gpuPollUs == 0);
    CHECK(c.carryThreads == 2);
    CHECK(c.peerListen.empty());
    CHECK(c.peerPort == 18515);
    CHECK(c.peerKeyFile.empty());
    CHECK(c.peerConnectTimeoutMs == 5000);
    CHECK(c.peerWire == DaemonConfig::PeerWire::Auto);
    CHECK(c.tcpInflightBytes == 4ull << 20);
    CHECK(c.hcas.empty());
    CHECK(c.inflightBytes == 1024 * 1024);
    CHECK(c.qpTimeoutMs == 2000);
    CHECK(c.source == "built-in defaults");
}

TEST_CASE("an empty file gives the defaults, with the file as source") {
    TempDir dir;
    const std::string path = dir.write("empty.conf", "# nothing\n");
    const DaemonConfig c = loadConfig(path);
    checkSameValues(c, defaultConfig());
    CHECK(c.source == path);
}

TEST_CASE("a file setting every key") {
    const DaemonConfig c = load(R"(
[daemon]
socket = "/run/tpf-test/d.sock"
socket_group = "rdma-users"
log_level = "debug"
max_bytes = "4MiB"
ring_entries = 256
open_timeout_ms = 1000
max_clients = 17
max_clients_per_uid = 5
message_timeout_ms = 1500
max_groups = 9
max_region_bytes = "2GiB"

[proxy]
cpu = 3
spin_us = 0
heartbeat_ms = 250
gpu_poll_us = 40
carry_threads = 5

[peer]
listen = "10.77.0.1"
port = 20000
key_file = "/etc/tpfabric/cluster.key"
connect_timeout_ms = 700
restart_wait_ms = 0
wire = "tcp"
tcp_inflight_bytes = "256KiB"

[verbs]
hcas = ["rxe0", "rxe2", "10.78.0.1"]
inflight_bytes = 65536
qp_timeout_ms = 9000
)");
    CHECK(c.socketPath == "/run/tpf-test/d.sock");
    CHECK(c.socketGroup == "rdma-users");
    CHECK(c.logLevel == "debug");
    CHECK(c.maxBytes == 4ull << 20);
    CHECK(c.ringEntries == 256);
    CHECK(c.openTimeoutMs == 1000);
    CHECK(c.maxClients == 17);
    CHECK(c.maxClientsPerUid == 5);
    CHECK(c.messageTimeoutMs == 1500);
    CHECK(c.maxGroups == 9);
    CHECK(c.maxRegionBytes == 2ull << 30);
    CHECK(c.proxyCpu == 3);
    CHECK(c.proxySpinUs == 0);
    CHECK(c.heartbeatMs == 250);
    CHECK(c.gpuPollUs == 40);
    CHECK(c.carryThreads == 5);
    CHECK(c.peerListen == "10.77.0.1");
    CHECK(c.peerPort == 20000);
    CHECK(c.peerKeyFile == "/etc/tpfabric/cluster.key");
    CHECK(c.peerConnectTimeoutMs == 700);
    CHECK(c.peerRestartWaitMs == 0);
    CHECK(c.peerWire == DaemonConfig::PeerWire::Tcp);
    CHECK(c.tcpInflightBytes == 256 * 1024);
    CHECK(c.hcas == std::vector<std::string>{"rxe0", "rxe2", "10.78.0.1"});
    CHECK(c.inflightBytes == 65536);
    CHECK(c.qpTimeoutMs == 9000);
}

TEST_CASE("values at the ends of their ranges are accepted") {
    auto c = load("[daemon]\nmax_bytes = 4096\nring_entries = 8\nopen_timeout_ms = 100\nmax_clients = 1\n"
                  "max_clients_per_uid = 1\nmessage_timeout_ms = 100\n"
                  "max_groups = 1\nmax_region_bytes = \"1MiB\"\n"
                  "[proxy]\ncpu = 0\nspin_us = 0\nheartbeat_ms = 10\ngpu_poll_us = 0\ncarry_threads = 0\n"
                  "[peer]\nport = 1\nconnect_timeout_ms = 100\n[verbs]\ninflight_bytes = \"4KiB\"\nqp_timeout_ms = 100\n");
    CHECK(c.maxBytes == 4096);
    CHECK(c.ringEntries == 8);
    CHECK(c.maxRegionBytes == 1ull << 20);
    CHECK(c.proxyCpu == 0);
    CHECK(c.carryThreads == 0);
    CHECK(c.peerPort == 1);
    c = load("[daemon]\nmax_bytes = \"1GiB\"\nring_entries = 4096\nopen_timeout_ms = 600000\nmax_clients = 65536\n"
             "max_clients_per_uid = 65536\nmessage_timeout_ms = 600000\n"
             "max_groups = 4096\nmax_region_bytes = \"1024GiB\"\n"
             "[proxy]\ncpu = 4095\nspin_us = 1000000\nheartbeat_ms = 10000\ngpu_poll_us = 1000\ncarry_threads = 16\n"
             "[peer]\nlisten = \"fd00::1\"\nport = 65535\nconnect_timeout_ms = 600000\n"
             "[verbs]\ninflight_bytes = 1073741824\nqp_timeout_ms = 600000\n");
    CHECK(c.maxBytes == 1ull << 30);
    CHECK(c.ringEntries == 4096);
    CHECK(c.maxClients == 65536);
    CHECK(c.maxRegionBytes == 1ull << 40);
    CHECK(c.proxyCpu == 4095);
    CHECK(c.carryThreads == 16);
    CHECK(c.peerListen == "fd00::1");
    CHECK(c.peerPort == 65535);
    CHECK(c.inflightBytes == 1ull << 30);
    for (const char* level : {"trace", "debug", "info", "warn", "error", "critical", "off"})
        CHECK(load(std::string("[daemon]\nlog_level = \"") + level + "\"\n").logLevel == level);
    CHECK(load("[peer]\nlisten = \"0.0.0.0\"\n").peerListen == "0.0.0.0");
    CHECK(load("[peer]\nlisten = \"::\"\n").peerListen == "::");
}

TEST_CASE("sizes: integers and strings with units") {
    struct Case {
        const char* value;
        std::uint64_t bytes;
    } cases[] = {
        {"4096", 4096},          {"\"4096\"", 4096},        {"\"8192B\"", 8192},       {"\"512KiB\"", 512 * 1024},
        {"\"4MiB\"", 4u << 20}, {"\"1GiB\"", 1ull << 30}, {"\"64KiB\"", 64 * 1024}, {"524288", 512 * 1024},
    };
    for (const auto& c : cases) {
        INFO("max_bytes = " << c.value);
        CHECK(load(std::string("[daemon]\nmax_bytes = ") + c.value + "\n").maxBytes == c.bytes);
    }
    CHECK(load("[daemon]\nmax_region_bytes = \"1024GiB\"\n").maxRegionBytes == 1ull << 40);
    CHECK(refusal("[daemon]\nmax_region_bytes = \"1TiB\"\n").find("units B, KiB, MiB, GiB") != std::string::npos);
    for (const char* bad : {"\"\"", "\"MiB\"", "\"4 MiB\"", "\"4mib\"", "\"4TB\"", "\"-4KiB\"", "-4096", "\"1.5MiB\"",
                            "4096.0", "true", "[4096]", "\"99999999999999999999\""}) {
        INFO("max_bytes = " << bad);
        const std::string msg = refusal(std::string("[daemon]\nmax_bytes = ") + bad + "\n");
        CHECK(msg.find("daemon.max_bytes: ") != std::string::npos);
        CHECK(msg.find("4KiB to 1GiB") != std::string::npos);
    }
}

TEST_CASE("every bad value is refused with one line naming the key and what is allowed") {
    struct Case {
        const char* section;
        const char* line;    // key = value
        const char* key;     // "section.key" the message must name
        const char* allowed; // part of what the message says is allowed
    } cases[] = {
        {"daemon", "socket = \"relative.sock\"", "daemon.socket", "absolute path"},
        {"daemon", "socket = 5", "daemon.socket", "absolute path"},
        {"daemon", "socket = \"/run/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx.sock\"",
         "daemon.socket", "at most 107 bytes"},
        {"daemon", "socket_group = \"\"", "daemon.socket_group", "group name"},
        {"daemon", "socket_group = \"a b\"", "daemon.socket_group", "group name"},
        {"daemon", "socket_group = 1000", "daemon.socket_group", "group name"},
        {"daemon", "log_level = \"verbose\"", "daemon.log_level", "trace, debug, info, warn, error, critical, off"},
        {"daemon", "log_level = \"INFO\"", "daemon.log_level", "trace, debug"},
        {"daemon", "log_level = 3", "daemon.log_level", "trace, debug"},
        {"daemon", "max_bytes = 4095", "daemon.max_bytes", "4KiB to 1GiB"},
        {"daemon", "max_bytes = \"2GiB\"", "daemon.max_bytes", "4KiB to 1GiB"},
        {"daemon", "ring_entries = 48", "daemon.ring_entries", "a power of two from 8 to 4096"},
        {"daemon", "ring_entries = 4", "daemon.ring_entries", "a power of two from 8 to 4096"},
        {"daemon", "ring_entries = 8192", "daemon.ring_entries", "a power of two from 8 to 4096"},
        {"daemon", "ring_entries = 0", "daemon.ring_entries", "a power of two from 8 to 4096"},
        {"daemon", "ring_entries = \"64\"", "daemon.ring_entries", "a power of two from 8 to 4096"},
        {"daemon", "open_timeout_ms = 99", "daemon.open_timeout_ms", "from 100 to 600000"},
        {"daemon", "open_timeout_ms = 600001", "daemon.open_timeout_ms", "from 100 to 600000"},
        {"daemon", "open_timeout_ms = 1e3", "daemon.open_timeout_ms", "from 100 to 600000"},
        {"daemon", "max_clients = 0", "daemon.max_clients", "from 1 to 65536"},
        {"daemon", "max_clients = 65537", "daemon.max_clients", "from 1 to 65536"},
        {"daemon", "max_clients = -1", "daemon.max_clients", "from 1 to 65536"},
        {"daemon", "max_clients_per_uid = 0", "daemon.max_clients_per_uid", "from 1 to 65536"},
        {"daemon", "max_clients_per_uid = 65537", "daemon.max_clients_per_uid", "from 1 to 65536"},
        {"daemon", "max_clients_per_uid = \"8\"", "daemon.max_clients_per_uid", "from 1 to 65536"},
        {"daemon", "max_groups = 0", "daemon.max_groups", "from 1 to 4096"},
        {"daemon", "max_groups = 4097", "daemon.max_groups", "from 1 to 4096"},
        {"daemon", "max_region_bytes = \"1023KiB\"", "daemon.max_region_bytes", "1MiB to 1024GiB"},
        {"daemon", "max_region_bytes = \"1025GiB\"", "daemon.max_region_bytes", "1MiB to 1024GiB"},
        {"proxy", "cpu = -2", "proxy.cpu", "-1 (do not pin) or a CPU number from 0 to 4095"},
        {"proxy", "cpu = 4096", "proxy.cpu", "from 0 to 4095"},
        {"proxy", "cpu = \"0\"", "proxy.cpu", "from 0 to 4095"},
        {"proxy", "spin_us = -1", "proxy.spin_us", "from 0 to 1000000"},
        {"proxy", "spin_us = 1000001", "proxy.spin_us", "from 0 to 1000000"},
        {"proxy", "heartbeat_ms = 9", "proxy.heartbeat_ms", "from 10 to 10000"},
        {"proxy", "heartbeat_ms = 10001", "proxy.heartbeat_ms", "from 10 to 10000"},
        {"proxy", "gpu_poll_us = -1", "proxy.gpu_poll_us", "from 0 to 1000"},
        {"proxy", "gpu_poll_us = 1001", "proxy.gpu_poll_us", "from 0 to 1000"},
        {"proxy", "carry_threads = -1", "proxy.carry_threads", "from 0 to 16"},
        {"proxy", "carry_threads = 17", "proxy.carry_threads", "from 0 to 16"},
        {"peer", "listen = \"node-a\"", "peer.listen", "IPv4 or IPv6 address"},
        {"peer", "listen = \"10.0.0.256\"", "peer.listen", "IPv4 or IPv6 address"},
        {"peer", "listen = \"10.0.0.1:18515\"", "peer.listen", "IPv4 or IPv6 address"},
        {"peer", "listen = \"[fd00::1]\"", "peer.listen", "IPv4 or IPv6 address"},
        {"peer", "listen = 10", "peer.listen", "IPv4 or IPv6 address"},
        {"peer", "port = 0", "peer.port", "from 1 to 65535"},
        {"peer", "port = 65536", "peer.port", "from 1 to 65535"},
        {"peer", "key_file = \"cluster.key\"", "peer.key_file", "absolute path"},
        {"peer", "key_file = false", "peer.key_file", "absolute path"},
        {"peer", "connect_timeout_ms = 99", "peer.connect_timeout_ms", "from 100 to 600000"},
        {"peer", "connect_timeout_ms = 600001", "peer.connect_timeout_ms", "from 100 to 600000"},
        {"peer", "restart_wait_ms = 600001", "peer.restart_wait_ms", "from 0 to 600000"},
        {"peer", "wire = \"rdma\"", "peer.wire", "\"auto\""},
        {"peer", "wire = 1", "peer.wire", "\"tcp\""},
        {"peer", "tcp_inflight_bytes = \"32KiB\"", "peer.tcp_inflight_bytes", "64KiB"},
        {"verbs", "hcas = \"mlx5_0\"", "verbs.hcas", "an array of HCA names"},
        {"verbs", "hcas = [\"mlx5_0\", \"\"]", "verbs.hcas[1]", "non-empty string"},
        {"verbs", "hcas = [\"mlx5_0\", 1]", "verbs.hcas[1]", "non-empty string"},
        {"verbs", "hcas = [\"mlx5_0,mlx5_1\"]", "verbs.hcas[0]", "without spaces or commas"},
        {"verbs", "hcas = [\"rxe0\", \"rxe0\"]", "verbs.hcas[1]", "listed twice"},
        {"verbs", "inflight_bytes = \"2KiB\"", "verbs.inflight_bytes", "4KiB to 1GiB"},
        {"verbs", "inflight_bytes = \"1025MiB\"", "verbs.inflight_bytes", "4KiB to 1GiB"},
        {"verbs", "qp_timeout_ms = 99", "verbs.qp_timeout_ms", "from 100 to 600000"},
        {"verbs", "qp_timeout_ms = 600001", "verbs.qp_timeout_ms", "from 100 to 600000"},
    };
    for (const auto& c : cases) {
        const std::string msg = refusal(std::string("# comment\n[") + c.section + "]\n" + c.line + "\n");
        INFO("[" << c.section << "] " << c.line << "  ->  " << msg);
        CHECK(msg.find(std::string(c.key) + ": ") != std::string::npos);
        CHECK(msg.find(c.allowed) != std::string::npos);
        CHECK(msg.find(":3: ") != std::string::npos); // the file's line
        CHECK(msg.find('\n') == std::string::npos);
    }
}

TEST_CASE("the message has the shape operators read") {
    TempDir dir;
    const std::string path = dir.write("t.conf", "[daemon]\nring_entries = 48\n");
    try {
        loadConfig(path);
        FAIL("ring_entries = 48 was accepted");
    } catch (const ConfigError& e) {
        CHECK(std::string(e.what()) ==
              path + ":2: daemon.ring_entries: 48 is not allowed; a power of two from 8 to 4096");
    }
}

TEST_CASE("unknown sections and keys are refused") {
    std::string msg = refusal("[daemon]\nmax_byte = 4096\n");
    CHECK(msg.find("daemon.max_byte: unknown key") != std::string::npos);
    CHECK(msg.find("max_bytes") != std::string::npos); // lists the keys [daemon] has

    msg = refusal("[deamon]\nmax_bytes = 4096\n");
    CHECK(msg.find("deamon: unknown section") != std::string::npos);
    CHECK(msg.find("[daemon], [proxy], [peer] and [verbs]") != std::string::npos);

    msg = refusal("max_bytes = 4096\n");
    CHECK(msg.find("max_bytes: unknown key outside any section") != std::string::npos);

    msg = refusal("daemon = 5\n");
    CHECK(msg.find("daemon: must be a section") != std::string::npos);

    msg = refusal("[[verbs]]\nhcas = []\n");
    CHECK(msg.find("verbs: must be a section") != std::string::npos);

    msg = refusal("[daemon.extra]\nx = 1\n");
    CHECK(msg.find("daemon.extra: unknown key") != std::string::npos);

    msg = refusal("[proxy]\n\"odd\\nkey\" = 1\n");
    CHECK(msg.find("proxy.\"odd\\nkey\": unknown key") != std::string::npos);
    CHECK(msg.find('\n') == std::string::npos);

    // Dotted keys name the same key as a section does.
    CHECK(load("daemon.max_groups = 7\n").maxGroups == 7);
}

TEST_CASE("syntax errors name the file and line; unreadable files name the file") {
    TempDir dir;
    const std::string bad = dir.write("bad.conf", "[daemon]\nmax_groups = 7\nmax_clients = \n");
    std::string msg;
    try {
        loadConfig(bad);
    } catch (const ConfigError& e) {
        msg = e.what();
    }
    CHECK(msg.rfind(bad + ":3:", 0) == 0);
    CHECK(msg.find("TOML syntax error") != std::string::npos);
    CHECK(msg.find('\n') == std::string::npos);

    msg = refusal("[daemon]\nmax_groups = 7\nmax_groups = 8\n"); // a key twice
    CHECK(msg.find(":3:") != std::string::npos);
    CHECK(msg.find("TOML syntax error") != std::string::npos);

    msg = refusal("[daemon]\n[daemon]\n");
    CHECK(msg.find(":2:") != std::string::npos);

    const std::string missing = dir.path + "/missing.conf";
    try {
        loadConfig(missing);
        FAIL("a missing file was accepted");
    } catch (const ConfigError& e) {
        msg = e.what();
    }
    CHECK(msg.find(missing) != std::string::npos);
    CHECK(msg.find("No such file or directory") != std::string::npos);

    try {
        loadConfig(dir.path);
        FAIL("a directory was accepted");
    } catch (const ConfigError& e) {
        msg = e.what();
    }
    CHECK(msg.find("is a directory") != std::string::npos);
}

TEST_CASE("the shipped example documents exactly the defaults") {
    const char* root = std::getenv("TPF_SOURCE_ROOT");
    if (!root || !*root) FAIL("TPF_SOURCE_ROOT is not set: point it at the tpfabric source tree");
    const std::string path = std::string(root) + "/systemd/tpfabricd.conf.example";
    DaemonConfig c;
    REQUIRE_NOTHROW(c = loadConfig(path));
    checkSameValues(c, defaultConfig());
    CHECK(c.source == path);

    // Every key of the example is set (uncommented), so the file shows every default.
    std::stringstream buf;
    buf << std::ifstream(path).rdbuf();
    const std::string text = buf.str();
    for (const char* key : {"socket", "socket_group", "log_level", "max_bytes", "ring_entries", "open_timeout_ms",
                            "max_clients", "max_clients_per_uid", "message_timeout_ms", "max_groups", "max_region_bytes", "cpu", "spin_us", "heartbeat_ms", "gpu_poll_us", "carry_threads",
                            "listen", "port", "key_file", "connect_timeout_ms", "restart_wait_ms", "hcas", "inflight_bytes",
                            "qp_timeout_ms"}) {
        INFO(key);
        CHECK(text.find("\n" + std::string(key) + " = ") != std::string::npos);
    }
}

TEST_CASE("socket path: the configured one, else RUNTIME_DIRECTORY, else /run/tpfabric") {
    DaemonConfig c = defaultConfig();
    {
        EnvVar env("RUNTIME_DIRECTORY", nullptr);
        CHECK(resolveSocketPath(c) == "/run/tpfabric/tpfabricd.sock");
    }
    {
        EnvVar env("RUNTIME_DIRECTORY", "");
        CHECK(resolveSocketPath(c) == "/run/tpfabric/tpfabricd.sock");
    }
    {
        EnvVar env("RUNTIME_DIRECTORY", "/run/tpfabric-test");
        CHECK(resolveSocketPath(c) == "/run/tpfabric-test/tpfabricd.sock");
    }
    {
        EnvVar env("RUNTIME_DIRECTORY", "/run/a:/run/b");
        CHECK(resolveSocketPath(c) == "/run/a/tpfabricd.sock");
    }
    {
        EnvVar env("RUNTIME_DIRECTORY", "/run/a/");
        CHECK(resolveSocketPath(c) == "/run/a/tpfabricd.sock");
    }
    c.socketPath = "/tmp/mine.sock";
    {
        EnvVar env("RUNTIME_DIRECTORY", "/run/a");
        CHECK(resolveSocketPath(c) == "/tmp/mine.sock");
    }
    CHECK(resolveSocketPath(load("[daemon]\nsocket = \"/srv/t.sock\"\n")) == "/srv/t.sock");
}

// ---- flags: the config's own rules -------------------------------------------

TEST_CASE("flags pass the rules of the keys they override, and are named in refusals") {
    DaemonConfig c = defaultConfig();
    applyFlag(c, "daemon.socket", "--socket", "/tmp/tpf-flag.sock");
    CHECK(c.socketPath == "/tmp/tpf-flag.sock");
    CHECK(c.origin.at("daemon.socket") == "--socket");
    applyFlag(c, "daemon.socket", "--socket", ""); // "": the RUNTIME_DIRECTORY rule, as in the file
    CHECK(c.socketPath.empty());
    for (const char* level : {"trace", "debug", "info", "warn", "error", "critical", "off"}) {
        applyFlag(c, "daemon.log_level", "--log-level", level);
        CHECK(c.logLevel == level);
    }

    const auto refusal = [](const char* key, const char* flag, const std::string& value) -> std::string {
        DaemonConfig d = defaultConfig();
        try {
            applyFlag(d, key, flag, value);
        } catch (const ConfigError& e) {
            CHECK(d.origin.count(key) == 0);
            return e.what();
        }
        return "";
    };
    // spdlog alone would take "warning" and "err"; the file does not, nor do the flags.
    for (const char* bad : {"warning", "err", "INFO", "loud", ""}) {
        INFO("--log-level " << bad);
        const std::string msg = refusal("daemon.log_level", "--log-level", bad);
        CHECK(msg.rfind("--log-level: \"" + std::string(bad) + "\" is not allowed; one of trace, debug, info, warn, error, "
                        "critical, off", 0) == 0);
    }
    // The flag takes no "" (its usage refuses it): the refusal offers only what it takes.
    CHECK(refusal("daemon.socket", "--socket", "rel.sock") ==
          "--socket: \"rel.sock\" is not allowed; an absolute path of at most 107 bytes");
    CHECK(refusal("daemon.socket", "--socket", "/tmp/" + std::string(120, 'x')).find("at most 107 bytes") !=
          std::string::npos);
    CHECK(refusal("daemon.socket", "--socket", "/tmp/a\nb").find("--socket: \"/tmp/a\\nb\" is not allowed") !=
          std::string::npos);
    CHECK_THROWS_AS(applyFlag(c, "daemon.no_such_key", "--x", "1"), std::logic_error);
}

TEST_CASE("a loaded file records where each key was set") {
    TempDir dir;
    const std::string path = dir.write("t.conf", "[daemon]\nmax_groups = 7\n\n[proxy]\ncpu = 0\n");
    const DaemonConfig c = loadConfig(path);
    CHECK(c.origin.at("daemon.max_groups") == path + ":2");
    CHECK(c.origin.at("proxy.cpu") == path + ":5");
    CHECK(c.origin.count("daemon.socket") == 0);
    CHECK(defaultConfig().origin.empty());
}

// ---- checks against this host -------------------------------------------------

namespace {

/// The CPUs this process may run on, read here with the fixed-size mask (the
/// test's own reference, not allowedCpus()).
std::vector<int> affinity() {
    cpu_set_t set;
    CPU_ZERO(&set);
    REQUIRE(::sched_getaffinity(0, sizeof set, &set) == 0);
    std::vector<int> cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) cpus.push_back(c);
    return cpus;
}

std::string hostRefusal(const DaemonConfig& c) {
    try {
        (void)checkOnHost(c);
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "";
}

} // namespace

TEST_CASE("CPU lists are printed as ranges") {
    CHECK(cpuList({}).empty());
    CHECK(cpuList({0}) == "0");
    CHECK(cpuList({0, 1}) == "0-1");
    CHECK(cpuList({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
    CHECK(cpuList({5, 7, 9}) == "5,7,9");
    CHECK(allowedCpus() == affinity());
}

TEST_CASE("proxy.cpu must be one of the CPUs this process may run on") {
    const std::vector<int> cpus = affinity();
    REQUIRE(!cpus.empty());
    TempDir dir;
    // Every allowed CPU, and -1, pass.
    for (int cpu : {-1, cpus.front(), cpus.back()}) {
        INFO("cpu = " << cpu);
        CHECK(hostRefusal(loadConfig(dir.write("ok.conf", "[proxy]\ncpu = " + std::to_string(cpu) + "\n"))).empty());
    }
    // The first CPU number outside the mask (a gap, or the one past the last).
    int outside = 0;
    while (std::find(cpus.begin(), cpus.end(), outside) != cpus.end()) ++outside;
    REQUIRE(outside <= 4095);
    const std::string path = dir.write("bad.conf", "# pinned\n[proxy]\ncpu = " + std::to_string(outside) + "\n");
    const DaemonConfig c = loadConfig(path); // the file alone is fine
    std::string list;
    for (std::size_t i = 0; i < cpus.size(); ++i) { // the expected list, built here
        std::size_t j = i;
        while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
        list += (list.empty() ? "" : ",") + std::to_string(cpus[i]) + (j > i ? "-" + std::to_string(cpus[j]) : "");
        i = j;
    }
    CHECK(hostRefusal(c) == path + ":3: proxy.cpu: " + std::to_string(outside) +
                                " is not one of the CPUs this daemon may run on (" + list +
                                "); set one of them, or -1 (do not pin)");
}

TEST_CASE("peer.key_file: read at check time with the same rules as at start") {
    TempDir dir;
    const auto withKey = [&](const std::string& keyPath) {
        return loadConfig(dir.write("k.conf", "[peer]\nlisten = \"127.0.0.1\"\nkey_file = \"" + keyPath + "\"\n"));
    };
    const std::string conf = dir.path + "/k.conf";

    CHECK_FALSE(readPeerKey(defaultConfig()).has_value());
    CHECK(hostRefusal(defaultConfig()).empty());

    SECTION("missing") {
        const std::string key = dir.path + "/none.key";
        const DaemonConfig c = withKey(key);
        CHECK(hostRefusal(c) == conf + ":3: peer.key_file: cannot read \"" + key + "\": No such file or directory");
        CHECK_THROWS_AS(readPeerKey(c), ConfigError);
    }
    SECTION("a directory") {
        CHECK(hostRefusal(withKey(dir.path)) == conf + ":3: peer.key_file: cannot read \"" + dir.path + "\": is a directory");
    }
    SECTION("shorter than 32 bytes") {
        const std::string key = dir.write("short.key", std::string(31, 'k'));
        REQUIRE(::chmod(key.c_str(), 0600) == 0);
        CHECK(hostRefusal(withKey(key)) == conf + ":3: peer.key_file: \"" + key +
                                               "\" holds 31 bytes; a cluster key needs at least 32 (head -c 32 "
                                               "/dev/urandom > FILE; chmod 0600 FILE)");
        const std::string empty = dir.write("empty.key", "");
        CHECK(hostRefusal(withKey(empty)).find("holds 0 bytes") != std::string::npos);
    }
    SECTION("32 bytes and more: the whole file is the key") {
        std::string bytes(40, '\0');
        for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 7 + 1);
        const std::string key = dir.write("good.key", bytes);
        REQUIRE(::chmod(key.c_str(), 0600) == 0);
        const DaemonConfig c = withKey(key);
        auto k = readPeerKey(c);
        REQUIRE(k.has_value());
        CHECK(k->bytes == std::vector<std::uint8_t>(bytes.begin(), bytes.end()));
        CHECK(k->mode == 0600);
        CHECK(checkOnHost(c).empty());
        // Readable by others: valid, with a warning naming the file, line and mode.
        REQUIRE(::chmod(key.c_str(), 0644) == 0);
        const auto warnings = checkOnHost(c);
        REQUIRE(warnings.size() == 1);
        CHECK(warnings[0] == conf + ":3: peer.key_file: \"" + key + "\" is readable by group or others (mode 644); chmod 0600 it");
    }
}

TEST_CASE("peer.listen must be an address of this host; its port is not tried") {
    const auto hostRefusal = [](const DaemonConfig& c) -> std::string {
        try {
            checkListenAddress(c);
        } catch (const ConfigError& e) {
            return e.what();
        }
        return "";
    };
    TempDir dir;
    const auto listening = [&](const std::string& addr, int port) {
        return loadConfig(dir.write("l.conf", "# peers\n[peer]\nlisten = \"" + addr + "\"\nport = " +
                                                  std::to_string(port) + "\n"));
    };
    CHECK(hostRefusal(defaultConfig()).empty()); // "": peer negotiation off, nothing to check
    CHECK(hostRefusal(listening("127.0.0.1", 18515)).empty());
    CHECK(hostRefusal(listening("0.0.0.0", 18515)).empty());

    // A port another socket holds is for the start to meet (exit 1, tried again), not a bad file.
    const int held = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(held >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(held, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(held, 1) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(held, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    CHECK(hostRefusal(listening("127.0.0.1", ntohs(a.sin_port))).empty());
    ::close(held);

    // 192.0.2.1 (TEST-NET-1, RFC 5737) is never a host's address.
    const std::string conf = dir.path + "/l.conf";
    CHECK(hostRefusal(listening("192.0.2.1", 18515)) ==
          conf + ":3: peer.listen: \"192.0.2.1\" is not an address of this host (Cannot assign requested address); "
                 "set one of its addresses (ip -brief address), \"0.0.0.0\" or \"::\" for every address, or \"\" "
                 "(peer negotiation off)");
}

TEST_CASE("a per-user share set above max_clients is a warning naming both; a default share under a lowered max_clients is none") {
    auto c = load("[daemon]\nmax_clients = 10\nmax_clients_per_uid = 100\n");
    const auto w = combinationWarnings(c);
    REQUIRE(w.size() == 1);
    CHECK(w[0].find(":3: daemon.max_clients_per_uid: 100 is above daemon.max_clients (10)") != std::string::npos);
    CHECK(combinationWarnings(load("[daemon]\nmax_clients = 10\n")).empty());
    CHECK(combinationWarnings(load("[daemon]\nmax_clients = 10\nmax_clients_per_uid = 10\n")).empty());
}
