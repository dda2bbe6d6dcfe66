// tpf-bench: host-path latency of tpfabric collectives against the floor of a
// raw two-process shared-memory ping-pong, measured in the same run; or, with
// --nodes 2, across two daemons over the tcp wire against a raw TCP ping-pong
// on loopback.
//
// Processes: the parent (`tpf-bench run`) measures the floor with one helper
// (`tpf-bench floor-peer`), then for each world W starts W `tpf-bench rank`
// processes against a running tpfabricd (or one it starts, --daemon). Each
// rank times its opens and every call itself and writes its samples, as one
// JSON document, to a pipe the parent reads; it then keeps its group open
// until the parent closes a second pipe, while the parent reads the daemon's
// memory and CPU from /proc. The parent pools the samples and prints the tables.
#pragma once

#include <sched.h>

#include <cstdint>
#include <string>
#include <sys/types.h>
#include <vector>

#include <nlohmann/json.hpp>

namespace tpf::bench {

/// The collectives measured: allGather (bytes per rank) and allReduceSum
/// over bf16 or f16 (size / 2 elements).
enum class Op : std::uint8_t { Gather, SumBf16, SumF16 };
const char* opName(Op op); ///< "gather" / "sum bf16" / "sum f16"
const char* opKey(Op op);  ///< the --ops spelling: "gather" / "sum" / "sum-f16"
Op opOfKey(const std::string& key); ///< throws std::invalid_argument

/// p in [0, 1] of `samples` (nearest rank; sorts a copy); 0 when empty.
double percentile(std::vector<std::uint64_t> samples, double p);

/// CLOCK_MONOTONIC in nanoseconds.
std::uint64_t nowNs();

/// Absolute path of this executable (/proc/self/exe).
std::string selfExe();

/// Online CPUs of this machine.
unsigned onlineCpus();

/// One (op, size) point: every timed call of every rank, in nanoseconds.
struct Point {
    Op op = Op::Gather;
    std::uint64_t size = 0; ///< bytes per rank
    std::vector<std::uint64_t> ns;
    double bestBurstP50Ns = 0; ///< floor only: the lowest p50 of its bursts (its reported p50)
};

/// What every rank of one world runs.
struct RankPlan {
    std::vector<std::string> sockets; ///< one per node: rank r attaches to sockets[r % sockets.size()]
    std::string bootstrap;
    std::uint32_t world = 2;
    std::vector<std::uint64_t> sizes;
    std::vector<Op> ops;
    std::uint64_t iters = 0, warmup = 0; ///< timed and untimed calls per point, at most
    std::uint64_t pointMs = 0;           ///< per-point time budget; 0 = exactly iters
    std::uint64_t minIters = 10;         ///< the budget never cuts a point below this
    std::uint32_t timeoutMs = 5000;
    std::uint32_t spinUs = 20;  ///< Options::spin of the library
    std::uint32_t holdMs = 0;   ///< keep the group open this long after reporting (and the release)
    std::uint32_t opens = 1;    ///< timed opens; all but the last closed again at once
    int releaseFd = -1;         ///< >= 0: after reporting, keep the group open until EOF on it
};

/// `tpf-bench rank`: one rank's whole life. Opens `opens` times (each after
/// a barrier on the bootstrap, each timed), writes its report (JSON, with
/// `routes`: Group::route of every rank) to
/// reportFd, closes it, waits for the release, holds, closes the group. Exit status 0 ok,
/// 1 a call failed, 3 wrong data.
int runRank(const RankPlan& plan, std::uint32_t rank, int reportFd);

/// Ranks of one world started by the parent; reports collected.
struct WorldRun {
    std::uint32_t world = 0;
    std::vector<pid_t> pids;
    std::vector<nlohmann::json> reports; ///< per rank, once collected
    std::vector<int> releaseFds;         ///< write ends; closing them lets the ranks close their groups
};

/// Start `plan.world` rank processes (fork + exec of this binary) and wait
/// for every report (not for the processes). Throws std::runtime_error with
/// what went wrong; the ranks are killed then. With `holdUntilRelease` the
/// ranks keep their group open after reporting until releaseWorld.
WorldRun runWorld(const RankPlan& plan, std::uint32_t deadlineS, bool holdUntilRelease = false);
/// Let the ranks of `run` close their groups (closes the release pipes).
void releaseWorld(WorldRun& run);
/// Reap the ranks of `run`, killing them after timeoutMs; throws if any did not exit 0.
void reapWorld(WorldRun& run, std::uint32_t timeoutMs);
/// The wires the ranks of `run` took to each other ("shm", "shm, tcp", ...),
/// from every rank's Group::route of every other rank. With `nodes` 2 (rank r
/// on node r % 2) throws, naming the pair, where two ranks of different
/// nodes did not take the tcp wire.
std::string worldRoutes(const WorldRun& run, std::uint32_t nodes);
/// Pool the per-rank samples of `run` into one Point per (op, size).
std::vector<Point> poolReports(const WorldRun& run);
/// Per open (in order): the slowest rank's open time, ns. A group is open
/// when its last rank's open returns; the ranks start each open together.
std::vector<std::uint64_t> openTimes(const WorldRun& run);

/// A tpfabricd this run started on a private socket (--daemon).
struct StartedDaemon {
    pid_t pid = -1;
    std::string socket, log;
};
/// Start `exe --socket DIR/NAME.sock --foreground --log-level warn` (with
/// `--config CONFIG` unless empty; output to DIR/NAME.log) and wait until it
/// listens on its socket (a daemon listens for peers before that); throws
/// with its log.
StartedDaemon startDaemon(const std::string& exe, const std::string& dir, const std::string& name = "tpfabricd",
                          const std::string& config = "");
/// The daemons of `tpf-bench run --daemon`: one as above for nodes = 1; for
/// nodes = 2 two nodes on this machine, each with DIR/nodeN.toml of its own
/// (peer.listen = "127.0.0.1", a free peer.port, peer.wire = "tcp") and
/// socket DIR/nodeN.sock. Throws (the daemons started so far stopped).
std::vector<StartedDaemon> startNodes(const std::string& exe, const std::string& dir, std::uint32_t nodes);
/// SIGTERM, wait up to 5 s, then SIGKILL.
void stopDaemon(StartedDaemon& d);
/// The pid of the tpfabricd listening on `socket` (SO_PEERCRED of a
/// connection, checked against /proc/PID/comm); -1 when that is not a
/// tpfabricd (socket activation: systemd listened) or cannot be read.
pid_t daemonPidBehind(const std::string& socket);
/// CPU time of every thread of `pid`, ns (/proc/PID/task/*/schedstat).
std::uint64_t processCpuNs(pid_t pid);

/// The daemon's memory (/proc/PID/status) and its CPU over a window.
struct DaemonSample {
    long rssKiB = -1, shmemKiB = -1, hwmKiB = -1; ///< VmRSS, RssShmem (of it), VmHWM; -1 unknown
    double cpuPercent = -1;                       ///< CPU time / wall time over the window, % of one core
    double windowMs = 0;
};
/// Memory now, then CPU over the next windowMs. All -1 for pid <= 0.
DaemonSample sampleDaemon(pid_t pid, std::uint32_t windowMs);

/// One world's control-plane numbers.
struct WorldControl {
    std::uint32_t world = 0;
    std::string routes;                ///< worldRoutes of that world
    std::vector<std::uint64_t> openNs; ///< openTimes of that world
    DaemonSample groupsOpen;           ///< with this world's group open, no call in flight
};

/// The floors' two processes run pinned to two CPUs of different physical
/// cores (of one package where there are such), so that two SMT siblings
/// sharing one core's caches never make a floor 10x lower in one run than
/// the next. Construct before spawning the peer (it inherits the second CPU
/// at fork), call afterSpawn() to move this process to the first; the
/// destructor restores this process's affinity.
class FloorPins {
public:
    FloorPins();
    ~FloorPins();
    FloorPins(const FloorPins&) = delete;
    FloorPins& operator=(const FloorPins&) = delete;
    void afterSpawn();
    /// "pinned to CPUs A and B (two physical cores)" or "not pinned (why)".
    const std::string& describe() const { return describe_; }

private:
    cpu_set_t before_{};
    bool haveBefore_ = false, pinned_ = false;
    int mine_ = -1;
    std::string describe_;
};

/// The floor: one-way time (round trip / 2) of a ping-pong between this
/// process and a `tpf-bench floor-peer` child over a shared memfd, for each
/// size. Each one-way leg copies `size` bytes into the shared buffer,
/// release-stores a sequence number, and the other side spins (pause, then
/// sched_yield) until it sees it and copies the bytes out. The sizes take
/// turns in kFloorBursts bursts of iters / kFloorBursts round trips; a
/// floor's p50 is its best burst's (a lower bound should not carry another
/// job's burst of load), its p99 is over all its round trips.
constexpr std::uint32_t kFloorBursts = 5;
inline std::uint64_t floorBurstIters(std::uint64_t iters) { return iters / kFloorBursts ? iters / kFloorBursts : 1; }
inline std::uint64_t floorBurstWarmup(std::uint64_t warmup) { return warmup / kFloorBursts; }
/// Pinned by FloorPins; `pinning` says which CPUs, or why it was not pinned.
std::vector<Point> measureFloor(const std::vector<std::uint64_t>& sizes, std::uint64_t iters, std::uint64_t warmup,
                                std::string& pinning);
/// `tpf-bench floor-peer`: the answering side; memfd inherited as `fd`.
int runFloorPeer(int fd, const std::vector<std::uint64_t>& sizes, std::uint64_t iters, std::uint64_t warmup);

/// The floor of the tcp wire (--nodes 2): one-way time (round trip / 2) of
/// a ping-pong over one TCP connection on 127.0.0.1 between this process
/// and a `tpf-bench tcp-floor-peer` child, for each size. Each leg writes
/// `size` bytes (blocking send, TCP_NODELAY) and the other side, asleep in a
/// blocking recv as the daemons' receiver sleeps in epoll_wait, reads them
/// all and writes them back. Bursts, best-burst p50 and pinning as
/// measureFloor's.
std::vector<Point> measureTcpFloor(const std::vector<std::uint64_t>& sizes, std::uint64_t iters, std::uint64_t warmup,
                                   std::string& pinning);
/// `tpf-bench tcp-floor-peer`: the answering side; accepts one connection on
/// the inherited listening socket `fd`.
int runTcpFloorPeer(int fd, const std::vector<std::uint64_t>& sizes, std::uint64_t iters, std::uint64_t warmup);

/// The worlds run again with the host path forced the other way
/// (--host-path direct,proxy): TPF_HOST_DIRECT=1 or 0 in the ranks.
struct PathRun {
    std::string path;                                  ///< "direct" or "proxy"
    std::vector<std::pair<std::uint32_t, Point>> rows; ///< (world, point)
    std::vector<WorldControl> control;                 ///< one per world
};

/// Everything one `tpf-bench run` measured.
struct Results {
    std::uint32_t nodes = 1;                          ///< 2: ranks across two daemons over the tcp wire
    std::vector<std::uint64_t> sizes;
    std::vector<std::uint32_t> worlds;
    std::uint64_t iters = 0, warmup = 0, pointMs = 0, minIters = 0;
    std::vector<Point> floor;                         ///< one per size: shared memory (nodes 1) or tcp (nodes 2)
    std::string floorPinning;                         ///< the floor's two CPUs, or why it was not pinned
    std::vector<std::pair<std::uint32_t, Point>> rows; ///< (world, point)
    double loadBefore = -1, loadAfter = -1;           ///< 1-minute load average (getloadavg)
    std::vector<WorldControl> control;                ///< one per world, in run order
    DaemonSample idleBefore, idleAfter;               ///< no group open: before the worlds, after them
    std::string daemonHow;                            ///< how the (node 0's) daemon's pid was found, or why not
    std::uint32_t settleMs = 0;                       ///< wait before each daemon sample
    std::string hostPath = "direct";                  ///< the host path of rows and control
    std::vector<PathRun> otherPaths;                  ///< the same worlds over the other host path
};

/// The human tables (or Markdown): latency beside the floor, sum beside
/// gather, the control plane; the notes under them, the target lines.
std::string formatTable(const Results& r, bool markdown);
nlohmann::json toJson(const Results& r);
/// Each sum beside the gather of the same W and bytes (part of formatTable).
std::string formatSumVsGather(const Results& r, bool markdown);
/// Open times and the daemon's memory and idle CPU (part of formatTable).
std::string formatControl(const Results& r, bool markdown);
/// The JSON of those two tables: "sum_vs_gather" and "control".
void addControlJson(const Results& r, nlohmann::json& doc);
/// Each (op, W, size) over the host-direct path beside the proxy-carried one,
/// and the daemon's memory with each world's group open; "" without otherPaths.
std::string formatHostPaths(const Results& r, bool markdown);
/// Their JSON: "host_paths".
void addHostPathsJson(const Results& r, nlohmann::json& doc);
/// `tpf-bench reduce`: sumRowsInOrder alone, every kernel this CPU runs,
/// beside a memcpy of the same W rows; prints a table. Returns the exit status.
int runReduceBench(const std::vector<std::uint32_t>& worlds, const std::vector<std::uint64_t>& sizes, bool markdown);
/// A text table (Markdown with `markdown`); rows[0] the header; the first
/// `leftCols` columns left-aligned, the rest right.
std::string renderTable(const std::vector<std::vector<std::string>>& rows, bool markdown, std::size_t leftCols = 3);

} // namespace tpf::bench
