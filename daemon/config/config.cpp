// tpfabricd configuration: a TOML file read over the defaults in config.hpp.
#include "daemon/config/config.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <toml++/toml.h>

#include "common/quoted.hpp"
#include "common/byte_size.hpp"

namespace tpf::daemon {
namespace {

constexpr std::uint64_t KiB = 1024, MiB = KiB << 10, GiB = MiB << 10, TiB = GiB << 10;

constexpr std::array<std::string_view, 7> kLogLevels = {"trace", "debug", "info", "warn", "error", "critical", "off"};

std::string keyName(std::string_view k) {
    const bool bare = !k.empty() && k.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") ==
                                        std::string_view::npos;
    return bare ? std::string(k) : quote(k);
}

/// What the operator wrote, for "X is not allowed".
std::string shown(const toml::node& n) {
    if (auto v = n.as_string()) return quote(v->get());
    if (auto v = n.as_integer()) return std::to_string(v->get());
    if (auto v = n.as_boolean()) return v->get() ? "true" : "false";
    if (auto v = n.as_floating_point()) {
        char buf[40];
        std::snprintf(buf, sizeof buf, "%g (a float)", v->get());
        return buf;
    }
    if (n.is_array()) return "an array";
    if (n.is_table()) return "a table";
    if (n.is_date()) return "a date";
    if (n.is_time()) return "a time";
    return "a date-time";
}

/// One key's value with what is needed to blame it: file, line, "section.key".
struct Value {
    const std::string& file;
    std::string key;
    const toml::node& node;

    /// "FILE:LINE", "FILE", or "" for a value from a flag (file "").
    std::string origin() const {
        const auto line = node.source().begin.line;
        return line ? file + ":" + std::to_string(line) : file;
    }
    std::string where() const { return file.empty() ? "" : origin() + ": "; }
    [[noreturn]] void fail(const std::string& what) const { throw ConfigError(where() + key + ": " + what); }
    [[noreturn]] void refuse(const std::string& allowed) const { fail(shown(node) + " is not allowed; " + allowed); }
};

std::string intRange(std::uint64_t lo, std::uint64_t hi) {
    return "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
}

std::uint32_t integer(const Value& v, std::uint32_t lo, std::uint32_t hi) {
    auto i = v.node.as_integer();
    if (!i || i->get() < std::int64_t(lo) || i->get() > std::int64_t(hi)) v.refuse(intRange(lo, hi));
    return std::uint32_t(i->get());
}

std::uint64_t byteSize(const Value& v, std::uint64_t lo, std::uint64_t hi) {
    const std::string allowed = "a size from " + formatByteSize(lo) + " to " + formatByteSize(hi) +
                                ": an integer of bytes or a string such as \"512KiB\" (units B, KiB, MiB, GiB)";
    std::uint64_t bytes = 0;
    if (auto i = v.node.as_integer()) {
        if (i->get() < 0) v.refuse(allowed);
        bytes = std::uint64_t(i->get());
    } else if (auto s = v.node.as_string()) {
        auto r = parseByteSize(s->get());
        if (!r.ok()) v.refuse(allowed);
        bytes = *r;
    } else {
        v.refuse(allowed);
    }
    if (bytes < lo || bytes > hi) v.refuse(allowed);
    return bytes;
}

std::string text(const Value& v, const std::string& allowed) {
    auto s = v.node.as_string();
    if (!s) v.refuse(allowed);
    return s->get();
}

bool hasControl(std::string_view s) {
    for (unsigned char c : s)
        if (c < 0x20 || c == 0x7f) return true;
    return false;
}

std::string absolutePathOrEmpty(const Value& v, const std::string& emptyMeans, std::size_t maxLen) {
    // A flag (no file) takes no "": its usage refuses an empty value before this.
    const std::string allowed = (v.file.empty() ? "an absolute path" : "\"\" (" + emptyMeans + ") or an absolute path") +
                                (maxLen ? " of at most " + std::to_string(maxLen) + " bytes" : "");
    std::string s = text(v, allowed);
    if (s.empty()) return s;
    if (s[0] != '/' || hasControl(s) || (maxLen && s.size() > maxLen)) v.refuse(allowed);
    return s;
}

using Apply = void (*)(const Value&, DaemonConfig&);
struct KeySpec {
    std::string_view name;
    Apply apply;
};

const KeySpec kDaemonKeys[] = {
    {"socket",
     [](const Value& v, DaemonConfig& c) {
         // sun_path holds 108 bytes including the terminating NUL.
         c.socketPath = absolutePathOrEmpty(v, "$RUNTIME_DIRECTORY/tpfabricd.sock, else /run/tpfabric/tpfabricd.sock",
                                            sizeof(sockaddr_un::sun_path) - 1);
     }},
    {"socket_group",
     [](const Value& v, DaemonConfig& c) {
         const std::string allowed = "a group name: not empty, no spaces, ':' or '/'";
         std::string g = text(v, allowed);
         if (g.empty() || hasControl(g) || g.find_first_of(" :/") != std::string::npos) v.refuse(allowed);
         c.socketGroup = g;
     }},
    {"log_level",
     [](const Value& v, DaemonConfig& c) {
         const std::string allowed = "one of trace, debug, info, warn, error, critical, off";
         std::string l = text(v, allowed);
         if (std::find(kLogLevels.begin(), kLogLevels.end(), l) == kLogLevels.end()) v.refuse(allowed);
         c.logLevel = l;
     }},
    {"max_bytes", [](const Value& v, DaemonConfig& c) { c.maxBytes = byteSize(v, 4 * KiB, GiB); }},
    {"ring_entries",
     [](const Value& v, DaemonConfig& c) {
         auto i = v.node.as_integer();
         const std::int64_t n = i ? i->get() : 0;
         if (n < 8 || n > 4096 || (n & (n - 1)) != 0) v.refuse("a power of two from 8 to 4096");
         c.ringEntries = std::uint32_t(n);
     }},
    {"open_timeout_ms", [](const Value& v, DaemonConfig& c) { c.openTimeoutMs = integer(v, 100, 600000); }},
    {"max_clients", [](const Value& v, DaemonConfig& c) { c.maxClients = integer(v, 1, 65536); }},
    {"max_clients_per_uid", [](const Value& v, DaemonConfig& c) { c.maxClientsPerUid = integer(v, 1, 65536); }},
    {"message_timeout_ms", [](const Value& v, DaemonConfig& c) { c.messageTimeoutMs = integer(v, 100, 600000); }},
    {"max_groups", [](const Value& v, DaemonConfig& c) { c.maxGroups = integer(v, 1, 4096); }},
    {"max_region_bytes", [](const Value& v, DaemonConfig& c) { c.maxRegionBytes = byteSize(v, MiB, TiB); }},
};

const KeySpec kProxyKeys[] = {
    {"cpu",
     [](const Value& v, DaemonConfig& c) {
         auto i = v.node.as_integer();
         if (!i || i->get() < -1 || i->get() > 4095) v.refuse("-1 (do not pin) or a CPU number from 0 to 4095");
         c.proxyCpu = int(i->get());
     }},
    {"spin_us", [](const Value& v, DaemonConfig& c) { c.proxySpinUs = integer(v, 0, 1000000); }},
    {"heartbeat_ms", [](const Value& v, DaemonConfig& c) { c.heartbeatMs = integer(v, 10, 10000); }},
    {"gpu_poll_us", [](const Value& v, DaemonConfig& c) { c.gpuPollUs = integer(v, 0, 1000); }},
    {"carry_threads", [](const Value& v, DaemonConfig& c) { c.carryThreads = integer(v, 0, 16); }},
};

const KeySpec kPeerKeys[] = {
    {"listen",
     [](const Value& v, DaemonConfig& c) {
         const std::string allowed = "\"\" (peer negotiation off) or an IPv4 or IPv6 address such as \"10.0.0.1\" or \"fd00::1\"";
         std::string a = text(v, allowed);
         unsigned char buf[sizeof(in6_addr)];
         if (!a.empty() && inet_pton(AF_INET, a.c_str(), buf) != 1 && inet_pton(AF_INET6, a.c_str(), buf) != 1)
             v.refuse(allowed);
         c.peerListen = a;
     }},
    {"port", [](const Value& v, DaemonConfig& c) { c.peerPort = std::uint16_t(integer(v, 1, 65535)); }},
    {"key_file", [](const Value& v, DaemonConfig& c) { c.peerKeyFile = absolutePathOrEmpty(v, "no key", 0); }},
    {"connect_timeout_ms", [](const Value& v, DaemonConfig& c) { c.peerConnectTimeoutMs = integer(v, 100, 600000); }},
    {"restart_wait_ms", [](const Value& v, DaemonConfig& c) { c.peerRestartWaitMs = integer(v, 0, 600000); }},
    {"wire",
     [](const Value& v, DaemonConfig& c) {
         const std::string allowed = "\"auto\" (verbs where this node has a usable HCA, tcp otherwise), \"verbs\" or \"tcp\"";
         const std::string w = text(v, allowed);
         if (w == "auto") c.peerWire = DaemonConfig::PeerWire::Auto;
         else if (w == "verbs") c.peerWire = DaemonConfig::PeerWire::Verbs;
         else if (w == "tcp") c.peerWire = DaemonConfig::PeerWire::Tcp;
         else v.refuse(allowed);
     }},
    {"tcp_inflight_bytes", [](const Value& v, DaemonConfig& c) { c.tcpInflightBytes = byteSize(v, 64 * KiB, GiB); }},
};

const KeySpec kVerbsKeys[] = {
    {"hcas",
     [](const Value& v, DaemonConfig& c) {
         const std::string allowed =
             "an array of HCA names (\"mlx5_0\") or IP addresses (\"10.0.0.1\"), each a non-empty string without spaces or commas";
         auto arr = v.node.as_array();
         if (!arr) v.refuse(allowed);
         std::vector<std::string> hcas;
         std::set<std::string> seen;
         for (std::size_t i = 0; i < arr->size(); ++i) {
             const Value e{v.file, v.key + "[" + std::to_string(i) + "]", *arr->get(i)};
             auto s = e.node.as_string();
             if (!s || s->get().empty() || hasControl(s->get()) || s->get().find_first_of(" ,") != std::string::npos)
                 e.refuse(allowed);
             if (!seen.insert(s->get()).second) e.fail(quote(s->get()) + " is listed twice; name each HCA once");
             hcas.push_back(s->get());
         }
         c.hcas = std::move(hcas);
     }},
    {"inflight_bytes", [](const Value& v, DaemonConfig& c) { c.inflightBytes = byteSize(v, 4 * KiB, GiB); }},
    {"qp_timeout_ms", [](const Value& v, DaemonConfig& c) { c.qpTimeoutMs = integer(v, 100, 600000); }},
};

struct SectionSpec {
    std::string_view name;
    std::span<const KeySpec> keys;
};

const SectionSpec kSections[] = {
    {"daemon", kDaemonKeys},
    {"proxy", kProxyKeys},
    {"peer", kPeerKeys},
    {"verbs", kVerbsKeys},
};

std::string keyList(std::span<const KeySpec> keys) {
    std::string out;
    for (const auto& k : keys) out += (out.empty() ? "" : ", ") + std::string(k.name);
    return out;
}

/// The whole of a regular file (and its permission bits, into `mode` if given);
/// false and the reason in `why` when it cannot be read.
bool readRegularFile(const std::string& path, std::string& out, std::string& why, std::uint32_t* mode = nullptr) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        why = std::strerror(errno);
        return false;
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        const int err = errno;
        ::close(fd);
        why = S_ISDIR(st.st_mode) ? "is a directory" : st.st_mode ? "not a regular file" : std::strerror(err);
        return false;
    }
    if (mode) *mode = std::uint32_t(st.st_mode & 07777);
    out.clear();
    char buf[16384];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n == 0) break;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            why = std::strerror(errno);
            ::close(fd);
            return false;
        }
        out.append(buf, std::size_t(n));
    }
    ::close(fd);
    return true;
}

std::string readFile(const std::string& path) {
    std::string text, why;
    if (!readRegularFile(path, text, why)) throw ConfigError("cannot read config file " + quote(path) + ": " + why);
    return text;
}

[[noreturn]] void syntaxError(const std::string& path, const toml::source_region& where, std::string_view description) {
    std::string desc(description);
    for (char& ch : desc)
        if (ch == '\n' || ch == '\r') ch = ' ';
    throw ConfigError(path + ":" + std::to_string(where.begin.line) + ":" + std::to_string(where.begin.column) +
                      ": TOML syntax error: " + desc);
}

toml::table parseToml(const std::string& path, const std::string& text) {
#if TOML_EXCEPTIONS
    try {
        return toml::parse(text, path);
    } catch (const toml::parse_error& e) {
        syntaxError(path, e.source(), e.description());
    }
#else
    toml::parse_result r = toml::parse(text, path);
    if (!r) syntaxError(path, r.error().source(), r.error().description());
    return std::move(r).table();
#endif
}

/// The spec of "section.key", or nullptr.
const KeySpec* findKey(std::string_view dotted) {
    const auto dot = dotted.find('.');
    if (dot == std::string_view::npos) return nullptr;
    for (const auto& s : kSections)
        if (s.name == dotted.substr(0, dot))
            for (const auto& k : s.keys)
                if (k.name == dotted.substr(dot + 1)) return &k;
    return nullptr;
}

std::string octal(std::uint32_t v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%o", unsigned(v));
    return buf;
}

/// "FILE:LINE: " where cfg's `key` was set, for a check made after loading.
std::string setAt(const DaemonConfig& cfg, const std::string& key) {
    const auto it = cfg.origin.find(key);
    return (it != cfg.origin.end() ? it->second : cfg.source) + ": ";
}

} // namespace

void checkListenAddress(const DaemonConfig& cfg) {
    sockaddr_storage ss{};
    socklen_t len = 0;
    auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
    if (inet_pton(AF_INET, cfg.peerListen.c_str(), &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        len = sizeof *v4;
    } else if (inet_pton(AF_INET6, cfg.peerListen.c_str(), &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        len = sizeof *v6;
    } else {
        return; // the key's own rule refuses it
    }
    const std::string head = setAt(cfg, "peer.listen") + "peer.listen: " + quote(cfg.peerListen);
    const int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        if (errno == EAFNOSUPPORT)
            throw ConfigError(head + ": this host has no IPv6 (" + std::strerror(errno) +
                              "); set an IPv4 address of this host, or \"\" (peer negotiation off)");
        return; // out of descriptors and the like: the start reports it
    }
    const int r = ::bind(fd, reinterpret_cast<const sockaddr*>(&ss), len);
    const int err = errno;
    ::close(fd);
    if (r != 0 && err == EADDRNOTAVAIL)
        throw ConfigError(head + " is not an address of this host (" + std::strerror(err) +
                          "); set one of its addresses (ip -brief address), \"0.0.0.0\" or \"::\" for every "
                          "address, or \"\" (peer negotiation off)");
}

DaemonConfig defaultConfig() { return DaemonConfig{}; }

DaemonConfig loadConfig(const std::string& path) {
    const toml::table root = parseToml(path, readFile(path));
    DaemonConfig cfg;
    for (auto&& [name, node] : root) {
        const SectionSpec* section = nullptr;
        for (const auto& s : kSections)
            if (s.name == name.str()) section = &s;
        const Value here{path, keyName(name.str()), node};
        if (!section)
            here.fail(node.is_table() ? "unknown section; the sections are [daemon], [proxy], [peer] and [verbs]"
                                      : "unknown key outside any section; every key belongs to [daemon], [proxy], [peer] or [verbs]");
        auto table = node.as_table();
        if (!table) here.fail("must be a section ([" + std::string(section->name) + "]), not " + shown(node));
        for (auto&& [key, value] : *table) {
            const KeySpec* spec = nullptr;
            for (const auto& k : section->keys)
                if (k.name == key.str()) spec = &k;
            const Value v{path, std::string(section->name) + "." + keyName(key.str()), value};
            if (!spec) v.fail("unknown key; [" + std::string(section->name) + "] has " + keyList(section->keys));
            spec->apply(v, cfg);
            cfg.origin[v.key] = v.origin();
        }
    }
    // Absolute, as status and the start-up line show it: a daemon started with
    // --config cfg/run.toml says which file wherever it is read from.
    std::error_code ec;
    const auto full = std::filesystem::absolute(path, ec).lexically_normal();
    cfg.source = ec ? path : full.string();
    return cfg;
}

void applyFlag(DaemonConfig& cfg, std::string_view key, std::string_view flag, const std::string& value) {
    const KeySpec* spec = findKey(key);
    if (!spec) throw std::logic_error("applyFlag: no config key " + std::string(key));
    // The flag's text as the string the file would hold: the same rule, one definition.
    const toml::value<std::string> node(value);
    const std::string noFile;
    spec->apply(Value{noFile, std::string(flag), node}, cfg);
    cfg.origin[std::string(key)] = std::string(flag);
}

std::vector<int> allowedCpus() {
    // proxy.cpu goes to 4095; a kernel built for more CPUs wants a larger mask.
    for (int n = 4096; n <= (1 << 20); n *= 2) {
        cpu_set_t* set = CPU_ALLOC(n);
        if (!set) return {};
        const std::size_t size = CPU_ALLOC_SIZE(n);
        CPU_ZERO_S(size, set);
        if (::sched_getaffinity(0, size, set) != 0) {
            CPU_FREE(set);
            if (errno == EINVAL) continue;
            return {};
        }
        std::vector<int> cpus;
        for (int c = 0; c < n; ++c)
            if (CPU_ISSET_S(c, size, set)) cpus.push_back(c);
        CPU_FREE(set);
        return cpus;
    }
    return {};
}

std::string cpuList(const std::vector<int>& cpus) {
    std::string out;
    for (std::size_t i = 0; i < cpus.size();) {
        std::size_t j = i;
        while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
        out += (out.empty() ? "" : ",") + std::to_string(cpus[i]);
        if (j > i) out += "-" + std::to_string(cpus[j]);
        i = j + 1;
    }
    return out;
}

std::optional<PeerKey> readPeerKey(const DaemonConfig& cfg) {
    if (cfg.peerKeyFile.empty()) return std::nullopt;
    const std::string head = setAt(cfg, "peer.key_file") + "peer.key_file: ";
    std::string text, why;
    std::uint32_t mode = 0;
    if (!readRegularFile(cfg.peerKeyFile, text, why, &mode)) {
        // tpfabricd runs as root; a check by another user may not see a 0600 key.
        const bool notRoot = ::geteuid() != 0 && why == std::strerror(EACCES);
        throw ConfigError(head + "cannot read " + quote(cfg.peerKeyFile) + ": " + why +
                          (notRoot ? " (tpfabricd reads it as root: check as root)" : ""));
    }
    if (text.size() < 32)
        throw ConfigError(head + quote(cfg.peerKeyFile) + " holds " + std::to_string(text.size()) +
                          " bytes; a cluster key needs at least 32 (head -c 32 /dev/urandom > FILE; chmod 0600 FILE)");
    return PeerKey{std::vector<std::uint8_t>(text.begin(), text.end()), mode};
}

std::vector<std::string> checkOnHost(const DaemonConfig& cfg) {
    std::vector<std::string> warnings;
    if (cfg.proxyCpu >= 0) {
        const std::vector<int> cpus = allowedCpus();
        // Unreadable affinity: nothing to compare with; the proxy's own pinning still refuses a bad CPU.
        if (!cpus.empty() && std::find(cpus.begin(), cpus.end(), cfg.proxyCpu) == cpus.end())
            throw ConfigError(setAt(cfg, "proxy.cpu") + "proxy.cpu: " + std::to_string(cfg.proxyCpu) +
                              " is not one of the CPUs this daemon may run on (" + cpuList(cpus) +
                              "); set one of them, or -1 (do not pin)");
    }
    if (auto key = readPeerKey(cfg); key && (key->mode & 077))
        warnings.push_back(setAt(cfg, "peer.key_file") + "peer.key_file: " + quote(cfg.peerKeyFile) +
                           " is readable by group or others (mode " + octal(key->mode & 0777) + "); chmod 0600 it");
    return warnings;
}

std::vector<std::string> combinationWarnings(const DaemonConfig& cfg) {
    std::vector<std::string> warnings;
    // Only where the share was set: a lowered max_clients under the default share is no mistake.
    if (cfg.maxClientsPerUid > cfg.maxClients && cfg.origin.count("daemon.max_clients_per_uid"))
        warnings.push_back(setAt(cfg, "daemon.max_clients_per_uid") + "daemon.max_clients_per_uid: " +
                           std::to_string(cfg.maxClientsPerUid) + " is above daemon.max_clients (" +
                           std::to_string(cfg.maxClients) + "), so one user's share never binds; set it at most " +
                           std::to_string(cfg.maxClients) + " (e.g. half, as the defaults 128 and 256)");
    return warnings;
}

std::string resolveSocketPath(const DaemonConfig& cfg) {
    if (!cfg.socketPath.empty()) return cfg.socketPath;
    // systemd sets RUNTIME_DIRECTORY to a colon-separated list when several are configured.
    if (const char* env = std::getenv("RUNTIME_DIRECTORY"); env && *env) {
        std::string dir(env, std::strcspn(env, ":"));
        while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
        if (!dir.empty()) return (dir == "/" ? "" : dir) + "/tpfabricd.sock";
    }
    return kDefaultSocketPath;
}

} // namespace tpf::daemon
