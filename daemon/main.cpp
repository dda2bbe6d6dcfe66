// tpfabricd — one per node: owns regions, rings, HCAs and the proxy; serves
// ranks and tpfabricctl on a Unix socket.
#include <sodium.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <cstring>
#include <fstream>

#include "common/shm.hpp"
#include "daemon/config/config.hpp"
#include "daemon/control/server.hpp"
#include "daemon/groups/groups.hpp"
#include "daemon/negotiate/negotiations.hpp"
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

int run(DaemonConfig cfg, bool foreground) {
    // A client that hangs up mid-reply must not end the daemon.
    ::signal(SIGPIPE, SIG_IGN);
    setupLogging(cfg.logLevel, foreground);
    if (sodium_init() < 0) {
        spdlog::critical("libsodium failed to initialise");
        return 1;
    }
    const std::string socketPath = resolveSocketPath(cfg);
    if (auto s = checkSocketPath(socketPath); !s) {
        spdlog::critical("{}", s.error().describe());
        return s.code() == Errc::ConfigError ? 2 : 1;
    }
    const NodeId nodeId = makeNodeId(socketPath);
    const auto started = std::chrono::system_clock::now();
    const auto startedSteady = std::chrono::steady_clock::now();
    const auto hcas = discoverHcas(cfg);
    spdlog::info("tpfabricd {} starting: node {}, config {}, {} HCA(s)", TPF_VERSION, nodeId.hex(),
                 cfg.source, hcas.size());

    boost::asio::io_context io;
    // Their default action would end the daemon, and with it every group on the
    // node: an operator's `kill -HUP` after editing the config must not.
    boost::asio::signal_set ignored(io, SIGHUP, SIGUSR1, SIGUSR2);
    ignoreSignals(ignored);
    GroupTable* groupsPtr = nullptr;
    Proxy proxy(ProxyOptions{.spinUs = cfg.proxySpinUs,
                             .heartbeatMs = cfg.heartbeatMs,
                             .cpu = cfg.proxyCpu,
                             .gpuPollUs = cfg.gpuPollUs,
                             .carryThreads = cfg.carryThreads},
                ProxyEvents{[&](std::uint64_t v) { boost::asio::post(io, [&, v] { groupsPtr->drained(v); }); },
                            [&](std::uint32_t handle, std::uint32_t rank, Error why) {
                                boost::asio::post(io, [&, handle, rank, why] { groupsPtr->badDoorbell(handle, rank, why); });
                            },
                            [&](std::uint32_t handle, std::uint32_t rank, Error why) {
                                boost::asio::post(io, [&, handle, rank, why] { groupsPtr->peerFailed(handle, rank, why); });
                            }});
    Negotiations negotiations(io, cfg, nodeId);
    GroupTable groups(io, cfg, nodeId, proxy, negotiations);
    groupsPtr = &groups;

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
    PeerService peers(io, cfg, nodeId, negotiations);
    if (auto s = peers.start(); !s) {
        spdlog::critical("{}", s.error().describe());
        return s.code() == Errc::ConfigError ? 2 : 1;
    }
    proxy.setHcas(verbsHcas);
    negotiations.attach(verbsHcas, &peers);
    const auto endpoint = endpointBytes(cfg.peerListen, hcas);

    client_proto::HelloReply hello{};
    nodeId.copyTo(hello.nodeId);
    setText(hello.daemonVersion, TPF_VERSION);
    hello.startedUnixNs = std::uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(started.time_since_epoch()).count());
    hello.protocol = client_proto::kClientVersion;

    auto nodeCard = [&] {
        client_proto::NodeCard card;
        nodeId.copyTo(card.fixed.nodeId);
        card.fixed.usableCap = cfg.maxBytes;
        card.fixed.endpointPort = peers.enabled() ? cfg.peerPort : 0;
        std::memcpy(card.fixed.endpointAddr, endpoint.data(), 16);
        card.hcas = hcas;
        card.fixed.hcaCount = std::uint16_t(hcas.size());
        return card;
    };

    Server* serverPtr = nullptr;
    const StatusSources statusSources{cfg, nodeId, socketPath, hello.startedUnixNs, startedSteady, hcas, proxy, groups,
                                      [&] { return serverPtr ? serverPtr->clients() : 0; }};
    auto statusJson = [&] { return statusDocument(statusSources).dump(); };

    Server server(io, cfg, groups, statusJson, hello, nodeCard);
    serverPtr = &server;
    if (auto s = proxy.start(); !s) {
        spdlog::critical("proxy: {}", s.error().describe());
        return s.code() == Errc::ConfigError ? 2 : 1;
    }
    if (auto s = server.listen(socketPath); !s) {
        spdlog::critical("{}", s.error().describe());
        return s.code() == Errc::ConfigError ? 2 : 1;
    }
    boost::asio::signal_set signals(io, SIGTERM, SIGINT);
    signals.async_wait([&](const boost::system::error_code& ec, int sig) {
        if (ec) return;
        spdlog::info("signal {}: stopping", sig);
        notify("STOPPING=1");
        server.stop();
        peers.stop();
        proxy.stop();
        io.stop();
    });
    spdlog::info("listening on {}", socketPath);
    notify("READY=1");
    io.run();
    spdlog::info("stopped");
    return 0;
}

} // namespace
} // namespace tpf::daemon

int main(int argc, char** argv) {
    using namespace tpf::daemon;
    CLI::App app{"tpfabricd " TPF_VERSION " - tpfabric node daemon: regions, command rings, the proxy, HCAs"};
    app.set_version_flag("--version", TPF_VERSION);
    std::string configPath, checkPath, socket, logLevel;
    bool foreground = false;
    // An empty path would silently mean "no file"; leaving the flag out says that.
    const auto namesAFile = [](std::string unlessNone) {
        return CLI::Validator(
            [unlessNone](std::string& path) {
                return path.empty() ? "an empty path names no file; give the TOML file's path" + unlessNone : std::string();
            },
            "");
    };
    app.add_option("--config", configPath, "TOML config file (see tpfabricd.conf.example); default: built-in defaults only")
        ->check(namesAFile(" (leave --config out to run on the built-in defaults)"))
        ->option_text("FILE");
    app.add_option("--check-config", checkPath,
                   "validate FILE (every key, type and range; proxy.cpu against this process's CPUs; peer.key_file "
                   "read) with any --socket and --log-level given, and exit: 0 valid, 2 not")
        ->check(namesAFile(""))
        ->option_text("FILE");
    auto* socketFlag = app.add_option("--socket", socket, "control socket path, absolute (overrides daemon.socket)")
                           ->option_text("PATH");
    app.add_flag("--foreground", foreground, "log to the terminal with timestamps (the daemon never forks)");
    auto* logLevelFlag =
        app.add_option("--log-level", logLevel, "trace, debug, info, warn, error, critical, off (overrides daemon.log_level)")
            ->option_text("LEVEL");
    app.footer("Signals: SIGTERM and SIGINT stop the daemon (every group on this node ends); SIGHUP, SIGUSR1 and SIGUSR2 "
               "are logged and ignored (the configuration is read at start only: restart to apply a new one).\n"
               "Exit status: 0 stopped by SIGTERM/SIGINT (or --check-config: valid); 1 a start-up failure (another "
               "tpfabricd serves the socket, proxy thread); 2 bad usage or configuration, a socket path too long, in a "
               "missing directory or naming something that is not a socket (systemd does not restart: "
               "RestartPreventExitStatus=2).");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        // --help and --version exit 0; every usage error exits 2, named, as a bad config does.
        if (e.get_exit_code() == 0) return app.exit(e);
        std::fprintf(stderr, "tpfabricd: %s\n", e.what());
        std::fprintf(stderr, "Run 'tpfabricd --help' for the options.\n");
        return 2;
    }

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
    } catch (const ConfigError& e) {
        std::fprintf(stderr, "tpfabricd: %s\n", e.what());
        return 2;
    }
    if (checkOnly) {
        for (const auto& w : warnings) std::fprintf(stderr, "tpfabricd: warning: %s\n", w.c_str());
        std::printf("tpfabricd: %s: configuration is valid\n", checkPath.c_str());
        return 0;
    }
    // At start the warnings are logged where they apply (PeerService: the key's mode).
    return run(std::move(cfg), foreground);
}
