// libtpfabric — the client library a GPU worker links.
//
//   auto boot = tpf::TcpBootstrap::create(rank, world, "127.0.0.1:29500");
//   if (!boot) return boot.error();                       // "SystemError: bind ...: Address already in use"
//   auto group = tpf::Group::open(**boot, rank, world, 512 * 1024);
//   if (!group) return group.error();                     // value() on a failure throws tpf::BadResultAccess
//   tpf::Status s = group.value()->allGather(send, recv, bytes);   // recv: world * bytes
//   s = group.value()->allReduceSum(send, recv, count, tpf::DType::BF16);
//
// Every call returns a Status naming its failure (tpf::Errc, <tpfabric/error.hpp>).
// A failed call writes nothing into its output buffer. After any failure
// except CapMismatch, Misaligned and InvalidArgument the group is broken:
// check() returns the failure, every later call fails the same way, and the
// group must be reopened. health() says so without synchronising a stream
// (a device call's failure included): read it once per step. The guide is
// docs/integration.md; the same API for C, Zig and Rust is <tpfabric/tpfabric.h>.
#pragma once

#if __cplusplus < 202002L
#error "<tpfabric/tpfabric.hpp> needs C++20 (-std=c++20); C++17 and older code can use <tpfabric/tpfabric.h>"
#endif

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include <tpfabric/error.hpp>
#include <tpfabric/export.h>
#include <tpfabric/version.h>

// cudaStream_t without the CUDA headers: the stream overloads below exist in
// every build; without CUDA they return Unsupported.
struct CUstream_st;

namespace tpf {

/// Element types of allReduceSum (the values of tpf_dtype in <tpfabric/tpfabric.h>).
enum class DType : std::uint8_t { F32 = 0, F16 = 1, BF16 = 2 };
/// Bytes of one element.
constexpr std::size_t dtypeSize(DType t) { return t == DType::F32 ? 4 : 2; }
/// The library's release ("0.1.0"); TPF_VERSION_STRING is the headers'.
TPF_API const char* version();

/// How ranks exchange small records while opening a group. Blocking; every
/// rank calls allGather with the same size in the same order.
class TPF_API Bootstrap {
public:
    using Clock = std::chrono::steady_clock;
    virtual ~Bootstrap() = default;
    virtual std::uint32_t rank() const = 0;
    virtual std::uint32_t world() const = 0;
    /// `out` receives world() * bytes: rank r's `mine` at out + r * bytes.
    virtual Status allGather(const void* mine, void* out, std::size_t bytes) = 0;
    /// allGather that returns by `deadline`: Group::open calls only this, with
    /// its open deadline (Options::openTimeout from the call, plus half a
    /// second for the ranks' answers). A rank that is gone or late ends the
    /// call with PeerLost or Timeout naming it, on every rank the bootstrap
    /// can reach. The default calls allGather, which Group::open cannot
    /// interrupt: a bootstrap that can block should override this one.
    virtual Status allGatherUntil(const void* mine, void* out, std::size_t bytes, Clock::time_point deadline);
};

/// Loopback (or LAN) TCP bootstrap for CPU processes: rank 0 listens on
/// host:port, the others connect (retrying until the timeout). The root
/// takes and checks every rank's join in its first call, within that call's
/// deadline (in Group::open: the open's): a rank of another world or a rank
/// number twice ends the bootstrap on every rank that joins by then
/// (GroupMismatch naming the rank and both worlds), and so does a rank that
/// has not joined by then (Timeout: "rank 2 did not join the bootstrap");
/// in an all-gather, a rank whose connection closed (PeerLost) or that sent
/// nothing by the deadline (Timeout) ends the call on every rank, named.
/// After a failure every later call returns the same error.
class TPF_API TcpBootstrap final : public Bootstrap {
public:
    /// Rank 0 returns once it listens (OutOfRange for a world above 16); the
    /// others once connected to it, retrying until `timeout` (then Timeout
    /// naming the root: this wait is outside any Group::open, so keep it no
    /// longer than the open timeout where a missing root should end as
    /// quickly). OutOfRange at once for rank >= world. Every join, and any
    /// refusal, comes with the first call.
    static Result<std::unique_ptr<TcpBootstrap>> create(std::uint32_t rank, std::uint32_t world,
                                                        const std::string& hostPort,
                                                        std::chrono::milliseconds timeout = std::chrono::seconds(30));
    ~TcpBootstrap() override;
    std::uint32_t rank() const override { return rank_; }
    std::uint32_t world() const override { return world_; }
    /// Bounded by the create timeout from the call (rank 0's first call: the joins included).
    Status allGather(const void* mine, void* out, std::size_t bytes) override;
    Status allGatherUntil(const void* mine, void* out, std::size_t bytes, Clock::time_point deadline) override;

private:
    TcpBootstrap() = default;
    TPF_HIDDEN Status acceptRanks(const std::string& hostPort, std::uint64_t deadlineNs);
    std::uint32_t rank_ = 0, world_ = 0;
    int timeoutMs_ = 30000;
    std::uint32_t seq_ = 0;
    int listenFd_ = -1;            ///< root, until every rank joined
    std::unique_ptr<int[]> peers_; ///< root: fd per rank; others: [0] = root
    Error refused_;                ///< once it failed: what every later call returns
};

/// The memory a group's collectives take.
enum class Buffers {
    Host,   ///< host buffers; calls without a stream
    Device, ///< device buffers on a CUDA stream (needs a CUDA build)
};

/// How a Device group reaches same-node peers. Fixed at open, identical on every rank.
enum class GpuRoute {
    Auto,  ///< ipc when every rank could create and share a device region, else proxy
    Ipc,   ///< ipc or nothing (open fails when a rank cannot)
    Proxy, ///< host regions through the daemon's proxy (doorbells from the kernel)
};

/// What happens when the fabric path is unavailable at open.
enum class Fallback {
    Nccl,  ///< use NCCL (device buffers), or report Unavailable for host buffers
    Error, ///< open fails with the reason
};

struct Options {
    /// Daemon socket; "" = $TPF_SOCKET, else /run/tpfabric/tpfabricd.sock.
    std::string socketPath;
    /// Bound on every wait of a collective; positive (open refuses 0 or
    /// less with InvalidArgument).
    std::chrono::milliseconds timeout{5000};
    /// Bound on opening (all local ranks joining at their daemon); positive.
    /// Also how long a host group (on one node, or across nodes on the verbs
    /// wire) waits for its daemon to come back and re-adopt it after a
    /// restart (from its connection closing; docs/integration.md, "A daemon
    /// restart").
    std::chrono::milliseconds openTimeout{30000};
    /// Busy-poll this long before sleeping in a wait (host path); 0 or more.
    std::chrono::microseconds spin{20};
    /// Default: $TPF_FALLBACK ("nccl" or "error"), else Nccl.
    std::optional<Fallback> fallback;
    /// Host (default) or Device buffers. Device groups open with GPU doorbells
    /// on the current CUDA device and run the load-time probe (docs/gpu.md).
    Buffers buffers = Buffers::Host;
    /// Device groups: the ncclComm_t (of the same ranks, in rank order) that
    /// takes the NCCL fallback and calls above the agreed cap. Default: the
    /// NcclBootstrap's communicator when the group opens over one, else none.
    void* ncclComm = nullptr;
    /// Device groups: route to same-node peers. Default: $TPF_GPU_ROUTE
    /// ("auto", "ipc", "proxy"), else Auto.
    std::optional<GpuRoute> gpuRoute;
    /// Device groups: grid cap per call (0: the kernels' default of 32 blocks).
    std::uint32_t maxBlocks = 0;
    /// Device groups: skip the load-time probe (tests and benchmarks only).
    bool skipProbe = false;
};

/// A group's health word as Group::health() reads it: Ok, or the failure
/// that broke the group and the rank it names, as check() reports it (the
/// detail text is check()'s alone). 16 bytes, trivially copyable; its C
/// form is tpf_health (<tpfabric/tpfabric.h>).
///
/// Who sets it: every host call that fails the group (the call returns the
/// same failure), every device call that fails (its kernel, in host-mapped
/// memory, before the kernel ends: no stream synchronisation is needed to see
/// it, only that the call has run, e.g. after the event or copy an engine
/// synchronises on anyway), an abort by any rank (the daemon's record,
/// seen at once), close(). What does not set it: a peer that left in order
/// (closed the group) until a call of this rank goes past the last epoch it
/// posted (that call fails PeerLost naming it); a peer that died or a daemon
/// that went away while no call ran (the next call fails and sets it);
/// refusals that do not break the group (CapMismatch, Misaligned,
/// InvalidArgument, Unsupported are returned by the call only).
struct Health {
    static constexpr std::uint32_t kNoRank = 0xffffffffu; ///< `rank` when the failure names none
    /// `flags`: the group runs on NCCL (it fell back at open). The word then
    /// holds only what the library itself recorded (an abort(), close());
    /// NCCL's asynchronous errors are not in it (ncclCommGetAsyncError).
    static constexpr std::uint16_t kNccl = 1;

    Errc code = Errc::Ok;           ///< @0 Ok while healthy; else the failure, check()'s code
    std::uint16_t flags = 0;        ///< @2 kNccl; other bits 0
    std::uint32_t rank = kNoRank;   ///< @4 the rank the failure names: the peer that is gone, late or
                                    ///<    mismatched, the aborter (this rank for its own abort()); kNoRank if none
    std::uint64_t reserved = 0;     ///< @8 0
    /// code == Ok.
    constexpr bool ok() const noexcept { return code == Errc::Ok; }
};
static_assert(sizeof(Health) == 16);

/// One rank's membership of a group. It belongs to the process that opened
/// it: in a fork()ed child every call on the inherited copy returns Closed and
/// close() releases the child's copies only (docs/integration.md, "Processes
/// and fork()").
class TPF_API Group {
public:
    /// Open as `rank` of `world` (1..16) with shards of at most `maxBytes`.
    /// Every rank calls it with the same world and buffers (maxBytes may
    /// differ: the group agrees the minimum, agreedCap()); the group takes
    /// the fabric path on every rank or on none. Returns Unavailable (with
    /// the reason) when it cannot and there is nothing to fall back to.
    /// Bounded: every rank returns within options.openTimeout + 1 s whatever
    /// the ranks disagree on, each told what and which rank: GroupMismatch
    /// ("rank 2 opens with world 4, rank 0 with world 3", a rank twice, host
    /// and device buffers, a bootstrap of another world, another rank's
    /// world outside 1..16 or rank not below world: that rank itself gets
    /// OutOfRange), Timeout or PeerLost naming a rank that never called open,
    /// never joined the TcpBootstrap, or is gone, as far as the bootstrap can
    /// tell (Bootstrap::allGatherUntil). A full daemon (daemon.max_clients,
    /// or this uid's share) is Busy itself where the group may not fall back
    /// (Fallback::Error on any rank); where it may, NCCL takes the group
    /// (device groups with a communicator) or the open returns Unavailable
    /// with "Busy: daemon refused: ..." in its detail (lastOpenMayFallBack()).
    /// maxBytes 0 is OutOfRange. World 1 is a plain copy of the rank's own
    /// buffers: no daemon is asked (agreedCap() is maxBytes), the bootstrap
    /// exchanges the rank's one record, and TPF_DISABLE turns it off as any
    /// group.
    static Result<std::unique_ptr<Group>> open(Bootstrap& bootstrap, std::uint32_t rank, std::uint32_t world,
                                               std::uint64_t maxBytes, const Options& options = {});
    ~Group();
    Group(const Group&) = delete;
    Group& operator=(const Group&) = delete;

    /// Host buffers: recv (world * bytes) gets every rank's send in rank
    /// order. send and recv 16-byte aligned (else Misaligned); bytes any
    /// count up to agreedCap() (else CapMismatch), the same on every rank
    /// (else GroupMismatch on every rank, nothing written). In place when
    /// send == recv + rank * bytes.
    Status allGather(const void* send, void* recv, std::size_t bytes);
    /// Host buffers: all-gather with a length per rank. counts has world()
    /// entries, the same on every rank: rank r contributes counts[r] bytes
    /// (this rank: counts[rank()] bytes of send), and recv gets the rows
    /// packed in rank order (row r at counts[0] + ... + counts[r-1]; recv
    /// holds their sum). Counts may be 0. Ranks that pass different counts
    /// fail the call with GroupMismatch on every rank and nothing written.
    /// The largest count at most agreedCap() (else CapMismatch).
    Status allGatherV(const void* send, void* recv, std::span<const std::size_t> counts);
    /// Host buffers: recv = sum over ranks of send, added in rank order
    /// 0..W-1 (f16/bf16 accumulate in f32, rounded once to nearest even), so
    /// every rank's result is bit-identical. send may equal recv. count and
    /// type the same on every rank (else GroupMismatch on every rank).
    Status allReduceSum(const void* send, void* recv, std::size_t count, DType type);

    /// Device buffers (Buffers::Device) on `stream`: enqueues kernels only
    /// (CUDA-graph capturable, no host wait). Misaligned / CapMismatch are
    /// returned at once and launch nothing; a failed wait is recorded on the
    /// device and returned by check() after the stream synchronised. Above
    /// agreedCap() (or when the group fell back) the call goes to NCCL on the
    /// same stream, where the group was opened over an NcclBootstrap.
    /// Any byte or element count: sizes that are not a multiple of 16 bytes
    /// run staged (three launches instead of one; docs/gpu.md). Sizes,
    /// dtype and op must match across ranks: same-node peers compare a tag
    /// of them on every call (GroupMismatch from check(), nothing written);
    /// peers on other nodes do not (docs/integration.md).
    Status allGather(const void* send, void* recv, std::size_t bytes, CUstream_st* stream);
    Status allReduceSum(const void* send, void* recv, std::size_t count, DType type, CUstream_st* stream);
    /// As the host allGatherV, on `stream` (staged). A mismatch of counts is
    /// recorded on the device and returned by check(). Above the agreed cap
    /// (or after a fallback) the rows go by NCCL send/receive, where counts
    /// are not checked.
    Status allGatherV(const void* send, void* recv, std::span<const std::size_t> counts, CUstream_st* stream);

    /// The group's recorded failure, or Ok. Device groups: also what a kernel
    /// recorded (call after synchronising the stream).
    Status check() const;
    /// The health word (Health): Ok, or the failure and the rank it names as
    /// check() would report it, read without synchronising any stream and
    /// without a system call or a CUDA call (a few loads of host memory,
    /// well under a microsecond), so an engine can read it once per step.
    /// Device groups see a failed call once its kernel has run: read it
    /// after the step's own synchronisation point (where the sampled tokens
    /// reach the host), and a failed replay of a CUDA graph is flagged
    /// before the next replay is launched. Once set it stays set: the group
    /// is broken; call check() for the detail, then close and reopen on
    /// every rank (docs/integration.md, "Failures, check() and reopening").
    /// A closed group answers as check() does: Closed, or the failure that
    /// broke it before close(); a fork()ed child's copy answers Closed. Any
    /// thread may call it, also while a call of the group runs (not while
    /// close() runs: close() unmaps what it reads).
    Health health() const noexcept;
    /// health().ok().
    bool healthy() const noexcept { return health().ok(); }
    /// "fabric" or "nccl": which path this group's calls take.
    std::string path() const;
    /// End every rank's waits with Aborted (its detail names this rank:
    /// "rank 1 aborted the group") and break the group. Returns whether the
    /// abort was delivered, never the group's state (check() says that):
    /// Ok when the daemon was told (or, world 1, there is no one to tell),
    /// also on a group already broken or aborted (abort may be called
    /// again); check() then returns Aborted, or the failure that broke the
    /// group first. DaemonLost when the daemon could not be told (the group
    /// is broken here all the same); Unsupported on a group that fell back
    /// to NCCL (no abort there: broken here only); Closed after close().
    /// tpf_abort() answers the same. Not queued behind this rank's posted
    /// calls: a peer still waiting for this rank's last shard may end that
    /// call Aborted too. A group is used by one thread at a time, except
    /// abort(): it may come from another thread while a call of the group
    /// blocks (a shutdown request), which then ends Aborted.
    Status abort();
    /// Leave the group (also done by the destructor): every fd and mapping of
    /// the group is released before it returns. Every call must have finished
    /// (device groups: the stream synchronised).
    void close();

    std::uint32_t rank() const;
    std::uint32_t world() const;
    /// Exact minimum of every rank's usable maximum.
    std::uint64_t agreedCap() const;
    bool fits(std::size_t bytes) const;
    /// "self", "shm", "verbs", "ipc" or "tcp": how this rank reaches `peer` (docs/wires.md).
    std::string route(std::uint32_t peer) const;

    struct Impl;
    /// In-tree benchmarks and tests read an open group through this (client/impl.hpp).
    friend struct GroupAccess;

private:
    TPF_HIDDEN explicit Group(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

/// After a Group::open on this thread that returned Unavailable: true when
/// the group agreed that a fallback is allowed (no rank asked for
/// Fallback::Error / TPF_FALLBACK=error, or some rank set TPF_DISABLE=1), so
/// the caller may take its own path, as the Python Communicator takes
/// torch.distributed (host buffers and groups without an NCCL communicator
/// have no fallback inside the library). False after any other outcome,
/// including a successful open.
TPF_API bool lastOpenMayFallBack();

} // namespace tpf
