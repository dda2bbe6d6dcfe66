// tpf-bench: host-path latency of tpfabric collectives against the floor of a
// raw two-process shared-memory ping-pong, measured in the same run.
//
// Processes: the parent (`tpf-bench run`) measures the floor with one helper
// (`tpf-bench floor-peer`), then for each world W starts W `tpf-bench rank`
// processes against an already running tpfabricd. Each rank times every call
// itself and writes its samples, as one JSON document, to a pipe the parent
// reads; the parent pools them and prints the table.
#pragma once

#include <cstdint>
#include <string>
#include <sys/types.h>
#include <vector>

#include <nlohmann/json.hpp>

namespace tpf::bench {

/// The two collectives measured: allGather (bytes per rank) and
/// allReduceSum over bf16 (size / 2 elements).
enum class Op : std::uint8_t { Gather, SumBf16 };
const char* opName(Op op); ///< "gather" / "sum bf16"

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
    std::string socket, bootstrap;
    std::uint32_t world = 2;
    std::vector<std::uint64_t> sizes;
    std::vector<Op> ops;
    std::uint64_t iters = 0, warmup = 0; ///< timed and untimed calls per point, at most
    std::uint64_t pointMs = 0;           ///< per-point time budget; 0 = exactly iters
    std::uint64_t minIters = 10;         ///< the budget never cuts a point below this
    std::uint32_t timeoutMs = 5000;
    std::uint32_t spinUs = 20;  ///< Options::spin of the library
    std::uint32_t holdMs = 0;   ///< keep the group open this long after reporting
};

/// `tpf-bench rank`: one rank's whole life. Writes its report (rankReport
/// JSON) to reportFd, closes it, holds, closes the group. Exit status 0 ok,
/// 1 a call failed, 3 wrong data.
int runRank(const RankPlan& plan, std::uint32_t rank, int reportFd);

/// Ranks of one world started by the parent; reports collected.
struct WorldRun {
    std::uint32_t world = 0;
    std::vector<pid_t> pids;
    std::vector<nlohmann::json> reports; ///< per rank, once collected
};

/// Start `plan.world` rank processes (fork + exec of this binary) and wait
/// for every report (not for the processes). Throws std::runtime_error with
/// what went wrong; the ranks are killed then.
WorldRun runWorld(const RankPlan& plan, std::uint32_t deadlineS);
/// Reap the ranks of `run`, killing them after timeoutMs; throws if any did not exit 0.
void reapWorld(WorldRun& run, std::uint32_t timeoutMs);
/// Pool the per-rank samples of `run` into one Point per (op, size).
std::vector<Point> poolReports(const WorldRun& run);

/// The floor: one-way time (round trip / 2) of a ping-pong between this
/// process and a `tpf-bench floor-peer` child over a shared memfd, for each
/// size. Each one-way leg copies `size` bytes into the shared buffer,
/// release-stores a sequence number, and the other side spins (pause, then
/// sched_yield) until it sees it and copies the bytes out. The sizes take
/// turns in kFloorBursts bursts of iters / kFloorBursts round trips; a
/// floor's p50 is its best burst's (a lower bound should not carry another
/// job's burst of load), its p99 is over all its round trips.
constexpr std::uint32_t kFloorBursts = 5;
std::vector<Point> measureFloor(const std::vector<std::uint64_t>& sizes, std::uint64_t iters, std::uint64_t warmup);
/// `tpf-bench floor-peer`: the answering side; memfd inherited as `fd`.
int runFloorPeer(int fd, const std::vector<std::uint64_t>& sizes, std::uint64_t iters, std::uint64_t warmup);

/// Everything one `tpf-bench run` measured.
struct Results {
    std::vector<std::uint64_t> sizes;
    std::vector<std::uint32_t> worlds;
    std::uint64_t iters = 0, warmup = 0, pointMs = 0, minIters = 0;
    std::vector<Point> floor;                         ///< one per size
    std::vector<std::pair<std::uint32_t, Point>> rows; ///< (world, point)
    double loadBefore = -1, loadAfter = -1;           ///< 1-minute load average (getloadavg)
};

/// The human table (or Markdown), the notes under it, the target line.
std::string formatTable(const Results& r, bool markdown);
nlohmann::json toJson(const Results& r);

} // namespace tpf::bench
