// tpf-bench — host-path latency of tpfabric collectives beside a raw
// shared-memory floor (or, across two daemons over the tcp wire, a raw TCP
// floor), each sum beside the gather of the same bytes, and the control plane
// (open time, the daemon's memory and idle CPU). `run` is the command; `rank`,
// `floor-peer` and `tcp-floor-peer` are the processes it starts (hidden).
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <stdexcept>

#include "bench/bench.hpp"
#include "bench/launch.hpp"
#include "common/byte_size.hpp"
#include "common/cli_usage.hpp"
#include "common/unix_socket.hpp"
#include "proto/layout.hpp"
#include "tpf_config.h"

using namespace tpf;
using namespace tpf::bench;

namespace {

struct RunArgs {
    std::vector<std::string> sockets;
    std::uint32_t nodes = 1;
    std::vector<std::uint32_t> worlds{2, 4, 8, 16};
    std::vector<std::string> sizes{"64", "256", "1KiB", "4KiB", "16KiB", "64KiB", "256KiB", "512KiB"};
    std::vector<std::string> ops{"gather", "sum"};
    std::vector<std::string> hostPaths{"direct"};
    std::uint64_t iters = 200, warmup = 20, floorIters = 2000, pointMs = 100, minIters = 10;
    std::uint32_t timeoutMs = 5000, spinUs = 20, holdMs = 0, deadlineS = 300;
    std::uint32_t opens = 5, idleMs = 1000, settleMs = 200;
    std::string daemonExe;
    std::string jsonPath;
    bool markdown = false;
};

std::vector<std::uint64_t> parseSizes(const std::vector<std::string>& in) {
    std::vector<std::uint64_t> out;
    for (const auto& s : in) {
        auto v = parseByteSize(s);
        if (!v) throw CLI::ValidationError("--sizes", v.error().detail);
        if (*v < 16 || *v % 16) throw CLI::ValidationError("--sizes", s + ": sizes must be multiples of 16 bytes, at least 16");
        // daemon.max_bytes is at most 1 GiB: a larger shard has no group to run in (a smaller one above the
        // daemon's daemon.max_bytes, 512 KiB by default, fails CapMismatch when the run reaches it).
        if (*v > kMaxCapBytes)
            throw CLI::ValidationError("--sizes", s + ": above 1GiB, the largest cap any tpfabricd serves (daemon.max_bytes)");
        out.push_back(*v);
    }
    return out;
}

std::vector<Op> parseOps(const std::vector<std::string>& in) {
    std::vector<Op> out;
    for (const auto& s : in) {
        try {
            out.push_back(opOfKey(s));
        } catch (const std::invalid_argument& e) {
            throw CLI::ValidationError("--ops", e.what());
        }
    }
    return out;
}

std::string defaultSocket() {
    const char* env = std::getenv("TPF_SOCKET");
    return env && *env ? env : "/run/tpfabric/tpfabricd.sock";
}

// The daemons' sockets the ranks attach to, one per node, when tpf-bench starts none; a usage error otherwise.
std::vector<std::string> givenSockets(const RunArgs& a) {
    if (a.nodes == 2 && a.sockets.size() != 2)
        throw CLI::ValidationError("--nodes 2 needs two daemons, one per node: --socket A,B (each with peer.listen set, "
                                   "one with peer.wire = \"tcp\"), or --daemon PATH to start two on loopback (--socket named " +
                                   std::to_string(a.sockets.size()) + ")");
    if (a.nodes == 1 && a.sockets.size() > 1)
        throw CLI::ValidationError("--socket: " + std::to_string(a.sockets.size()) + " sockets are " +
                                   std::to_string(a.sockets.size()) + " nodes; give --nodes 2 with two, or one socket");
    return a.sockets.empty() ? std::vector<std::string>{defaultSocket()} : a.sockets;
}

// Whether the socket is one a client may connect to; when not, says why on stderr.
bool socketReachable(const std::string& socket) {
    struct stat st{};
    const int statErr = ::stat(socket.c_str(), &st) == 0 ? 0 : errno;
    if (statErr == EACCES || statErr == EPERM) {
        std::fprintf(stderr, "tpf-bench: cannot reach the tpfabricd socket at %s: %s (%s)\n", socket.c_str(),
                     std::strerror(statErr), tpf::permissionHint(socket).c_str());
        return false;
    }
    if (statErr != 0 || !S_ISSOCK(st.st_mode)) {
        std::fprintf(stderr, "tpf-bench: no tpfabricd socket at %s (start one: tpfabricd --socket %s --foreground, "
                             "or let tpf-bench start one: --daemon PATH)\n",
                     socket.c_str(), socket.c_str());
        return false;
    }
    return true;
}

int runCommand(const RunArgs& a) {
    Results res;
    res.nodes = a.nodes;
    res.sizes = parseSizes(a.sizes);
    res.worlds = a.worlds;
    res.iters = a.iters;
    res.warmup = a.warmup;
    res.pointMs = a.pointMs;
    res.minIters = a.minIters;
    res.settleMs = a.settleMs;
    const auto ops = parseOps(a.ops);
    std::vector<StartedDaemon> started;
    std::string tmpDir;
    std::vector<std::string> sockets;
    pid_t daemonPid = -1;
    if (!a.daemonExe.empty()) {
        char tmpl[] = "/tmp/tpf-bench.XXXXXX";
        if (!::mkdtemp(tmpl)) {
            std::perror("tpf-bench: mkdtemp");
            return 1;
        }
        tmpDir = tmpl;
        try {
            started = startNodes(a.daemonExe, tmpDir, a.nodes);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "tpf-bench: %s\n", e.what());
            std::error_code ec;
            std::filesystem::remove_all(tmpDir, ec);
            return 1;
        }
        for (const auto& d : started) sockets.push_back(d.socket);
        daemonPid = started[0].pid;
        res.daemonHow = "started by tpf-bench, pid " + std::to_string(daemonPid);
        if (a.nodes == 2)
            res.daemonHow = "node 0's, " + res.daemonHow + "; node 1's, pid " + std::to_string(started[1].pid) + ", not sampled";
    } else {
        sockets = givenSockets(a);
        for (const auto& socket : sockets)
            if (!socketReachable(socket)) return 1;
        daemonPid = daemonPidBehind(sockets[0]);
        res.daemonHow = daemonPid > 0 ? "already running, pid " + std::to_string(daemonPid) + " (SO_PEERCRED of its socket)"
                                      : "not found behind the socket (socket activation, or another user's): no daemon columns";
        if (a.nodes == 2) res.daemonHow = "node 0's (" + sockets[0] + "), " + res.daemonHow + "; node 1's not sampled";
    }
    struct StopAtExit {
        std::vector<StartedDaemon>& daemons;
        std::string dir;
        bool keepLog = false;
        ~StopAtExit() {
            for (auto& d : daemons) {
                stopDaemon(d);
                if (keepLog) std::fprintf(stderr, "tpf-bench: the daemon's log: %s\n", d.log.c_str());
            }
            if (!keepLog && !dir.empty()) {
                std::error_code ec;
                std::filesystem::remove_all(dir, ec);
            }
        }
    } stopAtExit{started, tmpDir};
    auto settle = [&] { std::this_thread::sleep_for(std::chrono::milliseconds(a.settleMs)); };
    auto load = [] {
        double l[1] = {-1};
        return ::getloadavg(l, 1) == 1 ? l[0] : -1.0;
    };
    res.loadBefore = load();
    try {
        std::fprintf(stderr, "tpf-bench: floor: %s ping-pong, %zu sizes x %llu round trips\n",
                     a.nodes == 2 ? "TCP loopback" : "shared-memory", res.sizes.size(), (unsigned long long)a.floorIters);
        res.floor = a.nodes == 2 ? measureTcpFloor(res.sizes, a.floorIters, a.floorIters / 10, res.floorPinning)
                                 : measureFloor(res.sizes, a.floorIters, a.floorIters / 10, res.floorPinning);
        if (daemonPid > 0) {
            std::fprintf(stderr, "tpf-bench: daemon with no group: %u ms\n", a.idleMs);
            settle();
            res.idleBefore = sampleDaemon(daemonPid, a.idleMs);
        }
        WorldRun held;
        // Each world of one host path; the ranks read TPF_HOST_DIRECT from the environment they inherit.
        auto runWorlds = [&](const std::string& path, std::vector<std::pair<std::uint32_t, Point>>& rows,
                             std::vector<WorldControl>& control, bool mayHold) {
            ::setenv("TPF_HOST_DIRECT", path == "direct" ? "1" : "0", 1);
            for (std::size_t i = 0; i < a.worlds.size(); ++i) {
                const bool last = mayHold && i + 1 == a.worlds.size();
                RankPlan plan{sockets, "127.0.0.1:" + std::to_string(freeLoopbackPort()), a.worlds[i], res.sizes, ops,
                              a.iters, a.warmup, a.pointMs, a.minIters, a.timeoutMs, a.spinUs, last ? a.holdMs : 0, a.opens};
                const std::uint64_t t0 = nowNs();
                std::fprintf(stderr, "tpf-bench: W=%u (%s): %u ranks, %u opens, %zu points ...", plan.world, path.c_str(),
                             plan.world, plan.opens, res.sizes.size() * ops.size());
                WorldRun run = runWorld(plan, a.deadlineS, true);
                std::string routes;
                try {
                    routes = worldRoutes(run, a.nodes);
                } catch (...) {
                    std::fputs(" wrong wire\n", stderr);
                    try { // the wire is the error to report, not how the ranks then ended
                        reapWorld(run, 30000);
                    } catch (const std::exception&) {
                    }
                    throw;
                }
                std::fprintf(stderr, " %.1f s (routes %s)\n", double(nowNs() - t0) / 1e9, routes.c_str());
                for (auto& p : poolReports(run)) rows.emplace_back(plan.world, std::move(p));
                WorldControl c{plan.world, routes, openTimes(run), {}};
                if (daemonPid > 0) { // the ranks hold their group open, no call in flight
                    settle();
                    c.groupsOpen = sampleDaemon(daemonPid, a.idleMs);
                }
                control.push_back(std::move(c));
                releaseWorld(run);
                if (plan.holdMs) held = std::move(run);
                else reapWorld(run, 30000);
            }
        };
        res.hostPath = a.hostPaths[0];
        for (std::size_t k = 1; k < a.hostPaths.size(); ++k) { // the comparison first: the held world comes last
            PathRun other{a.hostPaths[k], {}, {}};
            runWorlds(other.path, other.rows, other.control, false);
            res.otherPaths.push_back(std::move(other));
        }
        runWorlds(res.hostPath, res.rows, res.control, true);
        if (daemonPid > 0 && held.pids.empty()) {
            settle();
            res.idleAfter = sampleDaemon(daemonPid, a.idleMs);
        }
        res.loadAfter = load();
        std::fputs(formatTable(res, a.markdown).c_str(), stdout);
        if (!a.jsonPath.empty()) {
            std::ofstream f(a.jsonPath);
            f << toJson(res).dump(2) << "\n";
            if (!f) throw std::runtime_error("cannot write " + a.jsonPath);
        }
        std::fflush(stdout);
        if (!held.pids.empty()) {
            std::fprintf(stderr, "tpf-bench: W=%u ranks hold the group open for %u ms\n", held.world, a.holdMs);
            reapWorld(held, a.holdMs + 30000);
            std::fprintf(stderr, "tpf-bench: ranks closed the group and exited\n");
        }
    } catch (const std::exception& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "\ntpf-bench: %s\n", e.what());
        stopAtExit.keepLog = !started.empty();
        return 1;
    }
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    CLI::App app{"tpf-bench " TPF_VERSION " - host-path latency of tpfabric collectives beside a shared-memory floor "
                 "(or across two daemons over the tcp wire beside a TCP floor), sum beside gather, and the control plane "
                 "(open time, daemon RSS and idle CPU)"};
    app.set_version_flag("--version", TPF_VERSION);
    app.require_subcommand(1);

    RunArgs a;
    auto* run = app.add_subcommand("run", "start W rank processes per world against a tpfabricd (or two: --nodes 2) and print p50/p99 per size, "
                                          "each sum beside the gather, open times and the daemon's memory and idle CPU");
    run->add_option("--socket", a.sockets, "tpfabricd socket (default $TPF_SOCKET, else /run/tpfabric/tpfabricd.sock); "
                                           "with --nodes 2 two, A,B: node 0's and node 1's (node 0's sampled); ignored with --daemon")
        ->delimiter(',')->check(cli::clientSocketPath("TPF_SOCKET", "/run/tpfabric/tpfabricd.sock"));
    run->add_option("--daemon", a.daemonExe, "start this tpfabricd on a private socket for the run and stop it after "
                                             "(with --nodes 2 two of it, as two nodes on loopback over the tcp wire; "
                                             "else use the one on --socket; its pid from the socket's peer credentials)");
    run->add_option("--nodes", a.nodes, "1: every rank on one daemon (the host path of one node, beside a shared-memory "
                                        "floor); 2: rank r on node r % 2, two daemons whose groups cross over the tcp "
                                        "wire (refused if they take another), beside a TCP floor on loopback")
        ->check(CLI::Validator(
            [](std::string& v) {
                return v == "1" || v == "2" ? std::string()
                                            : v + ": tpf-bench runs one node (1) or two (2: two tpfabricd, ranks across "
                                                  "them over the tcp wire)";
            },
            "1|2"))
        ->capture_default_str();
    run->add_option("--world", a.worlds, "worlds to run, one after another")->delimiter(',')->check(CLI::Range(2, 16))->capture_default_str();
    run->add_option("--sizes", a.sizes, "bytes per rank: 64,4KiB,... (multiples of 16, at most the daemon's daemon.max_bytes: "
                                        "512KiB by default)")->delimiter(',')->capture_default_str();
    run->add_option("--ops", a.ops, "gather, sum (allReduceSum bf16), sum-f16 (allReduceSum f16)")->delimiter(',')->capture_default_str();
    run->add_option("--iters", a.iters, "timed calls per (op, size) and rank, at most (see --point-ms)")->check(CLI::Range(1, 1000000))->capture_default_str();
    run->add_option("--warmup", a.warmup, "untimed calls before them (at most iters / 5 when --point-ms cuts a point short)")->capture_default_str();
    run->add_option("--point-ms", a.pointMs, "time budget of one (op, W, size) point: fewer than --iters calls when the "
                                             "slowest rank's probe call says they would take longer; 0 = always --iters")->capture_default_str();
    run->add_option("--min-iters", a.minIters, "the budget never cuts a point below this many timed calls")->check(CLI::Range(1, 1000000))->capture_default_str();
    run->add_option("--floor-iters", a.floorIters, "timed round trips of the floor per size (shared memory; TCP with --nodes 2)")->check(CLI::Range(1, 10000000))->capture_default_str();
    run->add_option("--timeout-ms", a.timeoutMs, "the library's bound on one call's wait")->capture_default_str();
    run->add_option("--spin-us", a.spinUs, "the library's spin before it sleeps in a wait (Options::spin)")->capture_default_str();
    run->add_option("--hold-ms", a.holdMs, "the last world's ranks keep the group open this long after the table is printed")->capture_default_str();
    run->add_option("--opens", a.opens, "timed Group::open per world (all but the last closed at once); the table shows p50 and max")
        ->check(CLI::Range(1, 1000))->capture_default_str();
    run->add_option("--idle-ms", a.idleMs, "window of each daemon CPU sample: no group open (before and after the worlds), "
                                           "and each world's group open between calls")->check(CLI::Range(1, 600000))->capture_default_str();
    run->add_option("--settle-ms", a.settleMs, "wait before each daemon sample (the proxy spins briefly after a call)")
        ->capture_default_str();
    run->add_option("--deadline-s", a.deadlineS, "give up on a world whose ranks have not reported by then")->capture_default_str();
    run->add_option("--host-path", a.hostPaths, "host path of the ranks: direct (same-node ranks read each other's "
                                                "shards from their regions), proxy (TPF_HOST_DIRECT=0: the daemon's proxy carries every shard); "
                                                "both (direct,proxy) adds a table of one beside the other, the first is the "
                                                "main table's")
        ->delimiter(',')->check(CLI::IsMember({"direct", "proxy"}))->capture_default_str();
    run->add_option("--json", a.jsonPath, "also write every number to this file");
    run->add_flag("--markdown", a.markdown, "print the table as Markdown");
    run->footer("Exit status: 0 measured; 1 no daemon (or --daemon did not start), a rank failed or timed out, or wrong "
                "data; 2 bad usage (a line on stderr names the problem).");

    RankPlan plan;
    std::string rankSocket;
    std::uint32_t rankNo = 0;
    int reportFd = -1;
    std::vector<std::uint64_t> rankSizes;
    std::vector<std::string> rankOps;
    auto* rank = app.add_subcommand("rank", "one rank (started by run)")->group("");
    rank->add_option("--socket", rankSocket)->required();
    rank->add_option("--bootstrap", plan.bootstrap)->required();
    rank->add_option("--rank", rankNo)->required();
    rank->add_option("--world", plan.world)->required();
    rank->add_option("--sizes", rankSizes)->delimiter(',')->required();
    rank->add_option("--ops", rankOps)->delimiter(',')->required();
    rank->add_option("--iters", plan.iters)->required();
    rank->add_option("--warmup", plan.warmup);
    rank->add_option("--point-ms", plan.pointMs);
    rank->add_option("--min-iters", plan.minIters);
    rank->add_option("--timeout-ms", plan.timeoutMs);
    rank->add_option("--spin-us", plan.spinUs);
    rank->add_option("--hold-ms", plan.holdMs);
    rank->add_option("--opens", plan.opens);
    rank->add_option("--release-fd", plan.releaseFd);
    rank->add_option("--report-fd", reportFd)->required();

    std::vector<std::uint32_t> reduceWorlds{2, 4, 8, 16};
    std::vector<std::string> reduceSizes{"4KiB", "64KiB"};
    bool reduceMarkdown = false;
    auto* reduce = app.add_subcommand("reduce", "time the host reduction alone (each kernel this CPU runs) beside a copy of "
                                                "the same rows; no daemon");
    reduce->add_option("--world", reduceWorlds, "rows to add")->delimiter(',')->check(CLI::Range(1, 16))->capture_default_str();
    reduce->add_option("--sizes", reduceSizes, "bytes per row (multiples of 16)")->delimiter(',')->capture_default_str();
    reduce->add_flag("--markdown", reduceMarkdown, "print the table as Markdown");
    reduce->footer("Exit status: 0 measured; 2 bad usage (a line on stderr names the problem).");
    app.footer("Exit status: 0 measured (or --help, --version); 1 run: no daemon, a rank failed or timed out, or wrong "
               "data; 2 bad usage (a line on stderr names the problem).");

    int floorFd = -1;
    std::uint64_t floorIters = 0, floorWarmup = 0;
    std::vector<std::uint64_t> floorSizes;
    auto* peer = app.add_subcommand("floor-peer", "the answering side of the floor (started by run)")->group("");
    peer->add_option("--fd", floorFd)->required();
    peer->add_option("--sizes", floorSizes)->delimiter(',')->required();
    peer->add_option("--iters", floorIters)->required();
    peer->add_option("--warmup", floorWarmup);

    int tcpFloorFd = -1;
    auto* tcpPeer = app.add_subcommand("tcp-floor-peer", "the answering side of the TCP floor (started by run)")->group("");
    tcpPeer->add_option("--fd", tcpFloorFd)->required();
    tcpPeer->add_option("--sizes", floorSizes)->delimiter(',')->required();
    tcpPeer->add_option("--iters", floorIters)->required();
    tcpPeer->add_option("--warmup", floorWarmup);

    // A usage error, as tpfabricd's and tpfabricctl's: two lines on stderr, exit 2.
    const auto usageError = [&](const std::string& line) {
        const std::string cmd = *reduce ? "reduce" : "run";
        return cli::usageError("tpf-bench", line,
                               ("Run 'tpf-bench --help' (or 'tpf-bench " + cmd + " --help') for the commands and options.").c_str());
    };
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) return app.exit(e); // --help, --version
        return usageError(cli::parseErrorLine(app, e));
    }
    try {
        if (*run) return runCommand(a);
        if (*reduce) return runReduceBench(reduceWorlds, parseSizes(reduceSizes), reduceMarkdown);
        if (*rank) {
            plan.sockets = {rankSocket};
            plan.sizes = rankSizes;
            plan.ops = parseOps(rankOps);
            return runRank(plan, rankNo, reportFd);
        }
        if (*peer) return runFloorPeer(floorFd, floorSizes, floorIters, floorWarmup);
        if (*tcpPeer) return runTcpFloorPeer(tcpFloorFd, floorSizes, floorIters, floorWarmup);
    } catch (const CLI::Error& e) { // --sizes or --ops that parse but make no sense
        return usageError(e.what());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tpf-bench: %s\n", e.what());
        return 1;
    }
    return 2;
}
