// tpfabricd — one per node: owns regions, rings, HCAs and the proxy; serves
// ranks and tpfabricctl on a Unix socket.
#include <grp.h>
#include <sodium.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/cli_usage.hpp"
#include "common/shm.hpp"
#include "daemon/config/config.hpp"
#include "daemon/control/server.hpp"
#include "daemon/groups/groups.hpp"
#include "daemon/negotiate/negotiation_table.hpp"
#include "daemon/proxy/proxy.hpp"
#include "daemon/status/status.hpp"
#include "daemon/verbs/hca.hpp"
#include "tpf_config.h"

#if TPF_HAVE_SYSTEMD
#include <spdlog/sinks/systemd_sink.h>
#include <systemd/sd-daemon.h>
#endif

namespace tpf::daemon {
namespace {

void notify(const char* state) {
#if TPF_HAVE_SYSTEMD
    sd_notify(0, state);
#else
    (void)state;
#endif
}

// Stable per (machine, boot, socket): two daemons on one machine (tests, the
// VM) are two nodes, and so are machines cloned from one image (same
// machine-id, but each boot has its own boot_id and, usually, host name).
NodeId makeNodeId(const std::string& socketPath) {
    std::string machine, boot;
    std::ifstream("/etc/machine-id") >> machine;
    std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const std::string seed = machine + "|" + boot + "|" + host + "|" + socketPath;
    NodeId id{};
    crypto_generichash(id.data(), id.size(), reinterpret_cast<const unsigned char*>(seed.data()), seed.size(),
                       nullptr, 0);
    return id;
}

void setupLogging(const std::string& level, bool foreground) {
    std::shared_ptr<spdlog::logger> logger;
#if TPF_HAVE_SYSTEMD
    // Under systemd: straight to the journal, with each event's priority.
    if (!foreground && std::getenv("JOURNAL_STREAM"))
        logger = std::make_shared<spdlog::logger>("tpfabricd", std::make_shared<spdlog::sinks::systemd_sink_mt>("tpfabricd"));
#endif
    if (!logger) {
        logger = spdlog::stderr_color_mt("tpfabricd");
        logger->set_pattern("%Y-%m-%d %H:%M:%S.%e tpfabricd[%P] %^%l%$: %v");
    }
    spdlog::set_default_logger(logger);
    spdlog::set_level(spdlog::level::from_str(level));
}

// SIGHUP, SIGUSR1, SIGUSR2: logged, never acted on (tpfabricd --help, operations.md).
void ignoreSignals(boost::asio::signal_set& set) {
    set.async_wait([&set](const boost::system::error_code& ec, int sig) {
        if (ec) return;
        if (sig == SIGHUP)
            spdlog::warn("SIGHUP ignored: the configuration is read at start only; `systemctl restart tpfabricd` "
                         "applies a new one");
        else
            spdlog::warn("{} ignored: tpfabricd stops on SIGTERM or SIGINT and acts on no other signal",
                         sig == SIGUSR1 ? "SIGUSR1" : "SIGUSR2");
        ignoreSignals(set);
    });
}

// A start-up failure, as one line that reaches the operator whatever
// daemon.log_level says (`off` included): through the logger when it logs
// critical lines, else straight to stderr (which systemd sends to the journal
// too). `hint` says what to do where the error's own text does not. Returns
// the exit status: 2 for a ConfigError (the unit does not restart on it), else 1.
int startFailed(const Error& e, const std::string& hint = {}) {
    const std::string line = e.describe() + (hint.empty() ? "" : " (" + hint + ")");
    if (spdlog::default_logger_raw()->should_log(spdlog::level::critical))
        spdlog::critical("{}", line);
    else
        std::fprintf(stderr, "tpfabricd: %s\n", line.c_str());
    return e.code == Errc::ConfigError ? 2 : 1;
}

// Descriptors the daemon holds for one connected rank (its socket, its
// region's memfd, its ring's eventfd), with room to spare, and for itself.
constexpr rlim_t kFilesPerClient = 4, kFilesBase = 64;

// Raises the soft open-files limit toward what daemon.max_clients needs (at
// most the hard limit; epoll has no FD_SETSIZE bound); a warning when even
// the hard limit is short: clients beyond it would wait on a daemon that
// cannot accept them (Server::acceptFailed).
void fitOpenFileLimit(const DaemonConfig& cfg) {
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    const rlim_t want = rlim_t(cfg.maxClients) * kFilesPerClient + kFilesBase;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        const rlim_t was = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : std::min(want, rl.rlim_max);
        if (rl.rlim_cur > was && ::setrlimit(RLIMIT_NOFILE, &rl) == 0)
            spdlog::info("open-files limit raised from {} to {} for daemon.max_clients {}", was, rl.rlim_cur,
                         cfg.maxClients);
        else
            rl.rlim_cur = was;
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want)
        spdlog::warn("open-files limit {} (hard {}) is below the {} that daemon.max_clients {} needs: about {} clients fit; "
                     "raise it (LimitNOFILE= in the unit, ulimit -n) or lower daemon.max_clients",
                     rl.rlim_cur, rl.rlim_max, want, cfg.maxClients,
                     rl.rlim_cur > kFilesBase ? (rl.rlim_cur - kFilesBase) / kFilesPerClient : 0);
}

int run(DaemonConfig cfg, bool foreground) {
    // A client that hangs up mid-reply must not end the daemon.
    ::signal(SIGPIPE, SIG_IGN);
    setupLogging(cfg.logLevel, foreground);
    if (sodium_init() < 0)
        return startFailed({Errc::SystemError, "libsodium failed to initialise (sodium_init)"},
                           "check the libsodium installation: tpfabricd cannot start without it");
    const std::string socketPath = resolveSocketPath(cfg);
    if (auto s = checkSocketPath(socketPath); !s)
        return startFailed(s.error(), s.code() == Errc::ConfigError ? ""
                                      : "stop the other tpfabricd first (systemctl stop tpfabricd), or give this one "
                                        "its own --socket or daemon.socket");
    if (auto s = checkSocketDirectory(socketPath); !s) return startFailed(s.error());
    const NodeId nodeId = makeNodeId(socketPath);
    const auto started = std::chrono::system_clock::now();
    const auto startedSteady = std::chrono::steady_clock::now();
    // First, so that every later line (the HCAs' among them) follows the one that says which daemon this is.
    spdlog::info("tpfabricd {} starting: node {}, config {}, socket {}", TPF_VERSION, nodeId.hex(), cfg.source,
                 socketPath);
    for (const auto& w : combinationWarnings(cfg)) spdlog::warn("{}", w);
    fitOpenFileLimit(cfg);
    std::string hcasNoneReason;
    const auto hcas = discoverHcas(cfg, &hcasNoneReason);

    boost::asio::io_context io;
    // Their default action would end the daemon, and with it every group on the
    // node: an operator's `kill -HUP` after editing the config must not.
    boost::asio::signal_set ignored(io, SIGHUP, SIGUSR1, SIGUSR2);
    ignoreSignals(ignored);
    // Built in dependency order, each from the parts before it only: the
    // HCAs; the negotiations (owning the peer service, which reports to them);
    // the group table (owning the proxy, which reports to it on the control
    // thread); the control socket's server.
    // The verbs wire: every discovered HCA opened once, shared by all groups.
    std::vector<std::shared_ptr<VerbsHca>> verbsHcas;
    for (const auto& card : hcas) {
        auto h = VerbsHca::open(card, 4096);
        if (!h) {
            std::string name;
            getText(card.device, name);
            spdlog::error("HCA {} port {}: {}; not used", name, card.port, h.error().describe());
            continue;
        }
        verbsHcas.push_back(*h);
    }
    NegotiationTable negotiations(io, cfg, nodeId, verbsHcas);
    GroupTable groups(io, cfg, nodeId, negotiations,
                      ProxyOptions{.spinUs = cfg.proxySpinUs,
                                   .heartbeatMs = cfg.heartbeatMs,
                                   .cpu = cfg.proxyCpu,
                                   .gpuPollUs = cfg.gpuPollUs,
                                   .carryThreads = cfg.carryThreads},
                      verbsHcas);
    // The message names the remedy (a port held, an address not up yet).
    if (auto s = negotiations.start(); !s) return startFailed(s.error());
    const auto endpoint = endpointBytes(cfg.peerListen, hcas);
    // A wildcard peer.listen is advertised as the first HCA's address: without one, other nodes cannot be told where to connect.
    const bool endpointKnown = std::any_of(endpoint.begin(), endpoint.end(), [](std::uint8_t b) { return b != 0; });
    if (negotiations.peersEnabled() && !endpointKnown)
        spdlog::warn("peer.listen {} is a wildcard and this node has no HCA whose address it could give other nodes: "
                     "groups spanning nodes cannot open here; set peer.listen to this node's address",
                     cfg.peerListen);

    client_proto::HelloReply hello{};
    nodeId.copyTo(hello.nodeId);
    setText(hello.daemonVersion, TPF_VERSION);
    hello.startedUnixNs = std::uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(started.time_since_epoch()).count());
    hello.protocol = client_proto::kClientVersion;

    auto nodeCard = [&] {
        client_proto::NodeCard card;
        nodeId.copyTo(card.fixed.nodeId);
        card.fixed.usableCap = cfg.maxBytes;
        card.fixed.endpointPort = negotiations.peersEnabled() && endpointKnown ? cfg.peerPort : 0;
        card.fixed.peerWire = negotiations.offeredWire();
        std::memcpy(card.fixed.endpointAddr, endpoint.data(), 16);
        card.hcas = hcas;
        card.fixed.hcaCount = std::uint16_t(hcas.size());
        return card;
    };

    const StatusSources statusSources{cfg,           nodeId,         socketPath,     hello.startedUnixNs,
                                      startedSteady, hcas,           hcasNoneReason, groups.proxy(),
                                      groups};
    auto statusJson = [&](std::size_t clients) { return statusDocument(statusSources, clients).dump(); };

    Server server(io, cfg, groups, statusJson, hello, nodeCard);
    Proxy& proxy = groups.proxy();
    if (auto s = proxy.start(); !s)
        return startFailed({s.code(), "proxy: " + s.error().detail},
                           s.code() == Errc::ConfigError
                               ? ""
                               : "the system is short of file descriptors, threads or memory for the proxy thread");
    if (auto s = server.listen(socketPath); !s)
        return startFailed(s.error(), s.code() == Errc::ConfigError ? ""
                                      : "check the socket's directory: its permissions, a read-only file system");
    boost::asio::signal_set signals(io, SIGTERM, SIGINT);
    signals.async_wait([&](const boost::system::error_code& ec, int sig) {
        if (ec) return;
        spdlog::info("signal {}: stopping", sig);
        notify("STOPPING=1");
        groups.stopping();
        server.stop();
        negotiations.stop();
        proxy.stop();
        negotiations.stopReceiving();
        io.stop();
    });
    spdlog::info("listening on {}, {} HCA(s){}", socketPath, hcas.size(),
                 negotiations.peersEnabled() ? std::string(", peer wire ") + wireName(negotiations.offeredWire()) : "");
    notify("READY=1");
    io.run();
    spdlog::info("stopped");
    return 0;
}

// --check-config's look at the socket path: the start's own checks
// (checkSocketPath, checkSocketDirectory) with three differences an operator
// checking an edit expects. A daemon serving the path now is the one a
// restart stops first; the unit's RuntimeDirectory= makes /run/tpfabric only
// while it runs; and a check run as another user than root (the unit's
// User=) cannot say what the daemon may write.
// Notes go to stderr; false (after the line saying why) where a start exits 2.
bool checkSocketLikeStart(const DaemonConfig& cfg) {
    const std::string path = resolveSocketPath(cfg);
    const std::string dir = std::filesystem::path(path).parent_path().string();
    struct stat st {};
    if (dir == std::filesystem::path(kDefaultSocketPath).parent_path().string() && ::stat(dir.c_str(), &st) != 0 &&
        errno == ENOENT) {
        std::fprintf(stderr,
                     "tpfabricd: note: socket path %s: its directory %s does not exist now; the unit's "
                     "RuntimeDirectory= makes it at start (a start by hand needs it, or --socket)\n",
                     path.c_str(), dir.c_str());
        return true;
    }
    const Status s = checkSocketPath(path);
    if (!s && s.code() == Errc::ConfigError) {
        std::fprintf(stderr, "tpfabricd: %s\n", s.error().detail.c_str());
        return false;
    }
    if (!s)
        std::fprintf(stderr,
                     "tpfabricd: note: %s: a start exits 1 while it runs (systemctl restart tpfabricd stops it first)\n",
                     s.error().detail.c_str());
    if (const Status w = checkSocketDirectory(path); !w) {
        if (::geteuid() == 0) {
            std::fprintf(stderr, "tpfabricd: %s\n", w.error().detail.c_str());
            return false;
        }
        std::fprintf(stderr, "tpfabricd: note: %s; checked as uid %u: the unit's daemon runs as root\n",
                     w.error().detail.c_str(), unsigned(::geteuid()));
    }
    return true;
}

// --check-config's notes on what a start would do short of failing: keys
// that parse but that this host makes a start quietly serve less.
void checkDegradedStart(const DaemonConfig& cfg) {
    if (::getgrnam(cfg.socketGroup.c_str()) == nullptr)
        std::fprintf(stderr,
                     "tpfabricd: note: daemon.socket_group: no group '%s' on this host now: a start would leave the "
                     "socket in the daemon's own group, so only its user and group could connect; the package's "
                     "sysusers.d entry creates 'tpfabric' (systemd-sysusers), or set a group that exists\n",
                     cfg.socketGroup.c_str());
    if (!cfg.hcas.empty()) {
        // The start's own discovery, its log lines silenced: the note says the outcome.
        const auto level = spdlog::get_level();
        spdlog::set_level(spdlog::level::off);
        std::string why;
        const bool none = discoverHcas(cfg, &why).empty();
        spdlog::set_level(level);
        if (none)
            std::fprintf(stderr,
                         "tpfabricd: note: verbs.hcas: a start here would find no usable HCA port (%s): %s; check "
                         "the names against `ibv_devices` / `rdma link`\n",
                         why.c_str(), withoutHcas(cfg));
    }
}

} // namespace
} // namespace tpf::daemon

int main(int argc, char** argv) {
    using namespace tpf::daemon;
    CLI::App app{"tpfabricd " TPF_VERSION " - tpfabric node daemon: regions, command rings, the proxy, HCAs"};
    app.set_version_flag("--version", TPF_VERSION);
    std::string configPath, checkPath, socket, logLevel;
    bool foreground = false;
    // An empty path would silently mean "no file" (or the default socket);
    // leaving the flag out says that. A path that starts with '-' is the next
    // flag taken as the value (--check-config --config FILE): say so.
    const auto namesAPath = [](std::string what, std::string unlessNone) {
        return CLI::Validator(
            [what, unlessNone](std::string& path) {
                if (path.empty()) return "an empty path names no " + what + unlessNone;
                if (path[0] == '-')
                    return "got the flag '" + path + "' where a " + what + " path belongs: put the " + what +
                           "'s path right after this flag (a " + what + " named so: ./" + path + ")";
                return std::string();
            },
            "");
    };
    auto* configFlag =
        app.add_option("--config", configPath, "TOML config file (see tpfabricd.conf.example); default: built-in defaults only")
            ->check(namesAPath("file", "; give the TOML file's path (leave --config out to run on the built-in defaults)"))
            ->option_text("FILE");
    auto* checkFlag =
        app.add_option("--check-config", checkPath,
                       "check FILE as a start with --config FILE would, touching nothing: every key, type and range; "
                       "proxy.cpu against this process's CPUs; peer.key_file read; peer.listen an address of this "
                       "host; the socket path (with any --socket and --log-level given; a daemon serving it now, or a "
                       "missing /run/tpfabric, which the unit makes, is a note). Exit 0 valid, 2 not. Give FILE "
                       "here alone, without --config")
            ->check(namesAPath("file", "; give the TOML file's path"))
            ->option_text("FILE");
    auto* socketFlag = app.add_option("--socket", socket, "control socket path, absolute (overrides daemon.socket)")
                           ->check(namesAPath("socket", "; give an absolute path, or leave --socket out for "
                                                        "daemon.socket (else the default)"))
                           ->option_text("PATH");
    app.add_flag("--foreground", foreground,
                 "log to stderr with timestamps even under systemd (else the journal, with priorities); run by hand "
                 "it logs so anyway. The daemon never forks");
    auto* logLevelFlag =
        app.add_option("--log-level", logLevel, "trace, debug, info, warn, error, critical, off (overrides daemon.log_level)")
            ->option_text("LEVEL");
    app.footer("Signals: SIGTERM and SIGINT stop the daemon (every group on this node ends); SIGHUP, SIGUSR1 and SIGUSR2 "
               "are logged and ignored (the configuration is read at start only: restart to apply a new one).\n"
               "Exit status: 0 stopped by SIGTERM/SIGINT (or --check-config: valid); 1 a start-up failure that may "
               "pass (another tpfabricd serves the socket, peer.port held by another process, peer.listen not up yet, "
               "proxy thread); 2 bad usage or configuration: a bad key or flag, a socket path too long, in a missing directory or naming something that is not a socket (systemd does not "
               "restart: RestartPreventExitStatus=2). A start-up failure is one line on stderr or in the journal, "
               "whatever the log level.");
    const auto usageError = [](const std::string& line) {
        return tpf::cli::usageError("tpfabricd", line, "Run 'tpfabricd --help' for the options.");
    };
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        // --help and --version exit 0; every usage error exits 2, named, as a bad config does.
        if (e.get_exit_code() == 0) return app.exit(e);
        return usageError(e.what());
    }
    // Which file would be checked is not for us to guess.
    if (*configFlag && *checkFlag)
        return usageError("--config and --check-config both name a file: --check-config FILE checks FILE as a start "
                          "with --config FILE would; give --check-config alone");

    // The flags go through the config file's own rules (config.cpp), so that
    // they accept exactly what daemon.socket and daemon.log_level accept.
    const bool checkOnly = !checkPath.empty();
    DaemonConfig cfg;
    std::vector<std::string> warnings;
    try {
        if (checkOnly) cfg = loadConfig(checkPath);
        else cfg = configPath.empty() ? defaultConfig() : loadConfig(configPath);
        if (*socketFlag) applyFlag(cfg, "daemon.socket", "--socket", socket);
        if (*logLevelFlag) applyFlag(cfg, "daemon.log_level", "--log-level", logLevel);
        warnings = checkOnHost(cfg);
        for (auto& w : combinationWarnings(cfg)) warnings.push_back(std::move(w));
        if (checkOnly) checkListenAddress(cfg);
    } catch (const ConfigError& e) {
        std::fprintf(stderr, "tpfabricd: %s\n", e.what());
        return 2;
    }
    if (checkOnly) {
        for (const auto& w : warnings) std::fprintf(stderr, "tpfabricd: warning: %s\n", w.c_str());
        if (!checkSocketLikeStart(cfg)) return 2;
        checkDegradedStart(cfg);
        std::printf("tpfabricd: %s: configuration is valid\n", checkPath.c_str());
        return 0;
    }
    // At start the warnings are logged where they apply (PeerService: the key's mode).
    return run(std::move(cfg), foreground);
}
