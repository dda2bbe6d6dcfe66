/* libtpfabric — the C ABI, for C, Zig, Rust and Python (ctypes) engines.
 *
 * One implementation: these functions call the C++ API (tpfabric.hpp) of the
 * same library. Handles are opaque; every function that can fail returns a
 * tpf_status (enum tpf_status_code in <tpfabric/errc.h>, equal to tpf::Errc),
 * and a failure leaves its text in tpf_last_error() of the calling thread.
 *
 *   tpf_group* g = NULL;
 *   tpf_status s = tpf_group_open(rank, world, 512 * 1024, my_allgather, my_store, NULL, &g);
 *   if (s != TPF_OK) fprintf(stderr, "open: %s\n", tpf_last_error());
 *   s = tpf_all_gather(g, send, recv, bytes);                    // recv: world * bytes
 *   s = tpf_all_reduce_sum(g, send, recv, count, TPF_DTYPE_BF16); // rank-order sum, bit-identical
 *   tpf_group_close(g);
 *
 * Threads: a group is used by one thread at a time; different groups may be
 * used from different threads. The one exception is tpf_abort, which may be
 * called from another thread while a call of the group blocks (a shutdown
 * request): that call then ends TPF_ABORTED. Link with -ltpfabric (pkg-config libtpfabric,
 * or CMake find_package(tpfabric) and tpfabric::tpfabric).
 * docs/integration.md is the guide. */
#ifndef TPFABRIC_H
#define TPFABRIC_H

#include <stddef.h>
#include <stdint.h>

#include <tpfabric/errc.h>
#include <tpfabric/export.h>
#include <tpfabric/version.h>

#ifdef __cplusplus
extern "C" {
#endif

/** A status code: one of enum tpf_status_code (TPF_OK is 0). */
typedef int32_t tpf_status;

/** One rank's membership of a group. Opaque; from tpf_group_open, freed by tpf_group_close.
 *  It belongs to the opening process: in a fork()ed child every call on it returns TPF_CLOSED
 *  and tpf_group_close frees the child's copy only (docs/integration.md, "Processes and fork()"). */
typedef struct tpf_group tpf_group;

/** A TCP bootstrap (rank 0 listens, the others connect). Opaque. */
typedef struct tpf_tcp_bootstrap tpf_tcp_bootstrap;

/** Element types of tpf_all_reduce_sum. */
enum tpf_dtype {
    TPF_DTYPE_F32 = 0,
    TPF_DTYPE_F16 = 1,
    TPF_DTYPE_BF16 = 2
};

/** tpf_open_options.buffers: the memory a group's calls take. */
enum tpf_buffers {
    TPF_BUFFERS_HOST = 0,   /**< host buffers: tpf_all_gather, tpf_all_reduce_sum */
    TPF_BUFFERS_DEVICE = 1  /**< CUDA device buffers on a stream: the *_async calls (needs a CUDA build) */
};

/** tpf_open_options.fallback: what happens when the fabric path is unavailable at open. */
enum tpf_fallback {
    TPF_FALLBACK_DEFAULT = 0, /**< $TPF_FALLBACK ("nccl" or "error"), else NCCL */
    TPF_FALLBACK_NCCL = 1,    /**< NCCL takes the calls (device groups with nccl_comm), else TPF_UNAVAILABLE */
    TPF_FALLBACK_ERROR = 2    /**< the open fails with the reason */
};

/** tpf_open_options.gpu_route: how a device group reaches same-node peers. */
enum tpf_gpu_route {
    TPF_GPU_ROUTE_DEFAULT = 0, /**< $TPF_GPU_ROUTE ("auto", "ipc", "proxy"), else auto */
    TPF_GPU_ROUTE_AUTO = 1,    /**< ipc where every rank could share a device region, else proxy */
    TPF_GPU_ROUTE_IPC = 2,     /**< ipc or the open fails */
    TPF_GPU_ROUTE_PROXY = 3    /**< host regions through the daemon's proxy */
};

/** The bootstrap an engine supplies: all-gather `bytes` bytes of `mine` from
 *  every rank into `out` (world * bytes, rank r's record at out + r * bytes).
 *  Called on every rank the same number of times with the same sizes, only
 *  from inside tpf_group_open (a few calls of at most a few KiB). Blocking,
 *  but bounded: the open cannot interrupt a callback, so it must return by
 *  the open's deadline, which tpf_bootstrap_time_left_ms() gives inside it
 *  (a rank that never calls tpf_group_open would otherwise hold every other
 *  rank in it). Return TPF_OK, or a code naming the failure (TPF_TIMEOUT,
 *  TPF_PEER_LOST, ...; other values are reported as TPF_PEER_LOST); the open
 *  then fails with it. An engine typically implements it over its own
 *  communicator or store. tpf_tcp_bootstrap_allgather with its handle is
 *  recognised and bounded by the library itself. */
typedef tpf_status (*tpf_allgather_fn)(void* ctx, const void* mine, void* out, size_t bytes);

/** Options of tpf_group_open. Initialise with tpf_open_options_init (it sets
 *  struct_size, so a later library with more fields still reads this one). */
typedef struct tpf_open_options {
    uint32_t struct_size;      /**< sizeof(tpf_open_options) of the caller's header */
    int32_t buffers;           /**< enum tpf_buffers; default TPF_BUFFERS_HOST */
    const char* socket_path;   /**< tpfabricd's socket; NULL: $TPF_SOCKET, else /run/tpfabric/tpfabricd.sock */
    uint32_t timeout_ms;       /**< bound on every wait of a call; 0: 5000 */
    uint32_t open_timeout_ms;  /**< bound on opening, and on a host group's wait for a restarted daemon; 0: 30000 */
    uint32_t spin_us;          /**< host path: busy-poll this long before sleeping; 0: 20 */
    int32_t fallback;          /**< enum tpf_fallback */
    int32_t gpu_route;         /**< enum tpf_gpu_route (device groups) */
    uint32_t max_blocks;       /**< device groups: grid cap per call; 0: the kernels' default */
    void* nccl_comm;           /**< device groups: an ncclComm_t of the same ranks, used for the NCCL
                                    fallback and for calls above the agreed cap; NULL: none */
} tpf_open_options;

/** Fill `options` with the defaults (every field 0 or NULL, struct_size set). */
TPF_API void tpf_open_options_init(tpf_open_options* options);

/** Open (join) a group as `rank` of `world` (1..16) with shards of at most
 *  `max_bytes`. Every rank calls it with the same world and buffers
 *  (max_bytes may differ: the group agrees the minimum, tpf_agreed_cap); the
 *  group takes the fabric path on every rank or on none (then NCCL, see
 *  tpf_open_options.fallback and TPF_DISABLE in docs/integration.md).
 *  `allgather` and `ctx` are the bootstrap; `options` may be NULL.
 *  On success *group is the new group; on failure *group is NULL and the
 *  status names why (TPF_UNAVAILABLE with the reason, TPF_CONFIG_ERROR for a
 *  bad TPF_* variable, TPF_INVALID_ARGUMENT, TPF_OUT_OF_RANGE, ...). A full
 *  daemon is TPF_BUSY itself where the group may not fall back
 *  (TPF_FALLBACK_ERROR on any rank); where it may, TPF_UNAVAILABLE with
 *  "Busy: daemon refused: ..." in tpf_last_error() (or NCCL takes the group).
 *  Bounded: every rank returns within open_timeout_ms + 1 s whatever the
 *  ranks disagree on, each told what and which rank: TPF_GROUP_MISMATCH
 *  ("rank 2 opens with world 4, rank 0 with world 3"; a rank twice; host and
 *  device buffers), TPF_TIMEOUT or TPF_PEER_LOST naming a rank that never
 *  called it or is gone (where the bootstrap names it: a callback bootstrap
 *  reports its own errors). max_bytes 0 is TPF_OUT_OF_RANGE. World 1 is a
 *  plain copy of the rank's own buffers: no daemon is asked (tpf_agreed_cap
 *  is max_bytes), `allgather` is called once with the rank's one record, and
 *  TPF_DISABLE turns it off as any group. */
TPF_API tpf_status tpf_group_open(uint32_t rank, uint32_t world, uint64_t max_bytes, tpf_allgather_fn allgather,
                                  void* ctx, const tpf_open_options* options, tpf_group** group);

/** After a tpf_group_open on this thread that returned TPF_UNAVAILABLE: 1
 *  when the group agreed that a fallback is allowed (no rank asked for
 *  TPF_FALLBACK_ERROR / TPF_FALLBACK=error, or some rank set TPF_DISABLE=1),
 *  so the caller may take its own path, as the Python Communicator takes
 *  torch.distributed (host buffers, and device groups without nccl_comm on
 *  every rank, have no fallback inside the library); 0 after any other
 *  outcome, including a successful open. */
TPF_API int tpf_last_open_may_fall_back(void);

/** Leave the group and free the handle (NULL is a no-op): every fd and
 *  mapping of the group is released before it returns. Every call on the
 *  group must have finished (device groups: the stream synchronised). */
TPF_API void tpf_group_close(tpf_group* group);

/** Host buffers: recv (world * bytes) gets every rank's send in rank order.
 *  send and recv 16-byte aligned (else TPF_MISALIGNED); bytes at most
 *  tpf_agreed_cap (else TPF_CAP_MISMATCH); any byte count, the same on every
 *  rank (else TPF_GROUP_MISMATCH on every rank). A failed call writes
 *  nothing into recv. In place when send == recv + rank * bytes. */
TPF_API tpf_status tpf_all_gather(tpf_group* group, const void* send, void* recv, size_t bytes);

/** Host buffers: all-gather with a length per rank. `counts` has world
 *  entries, the same on every rank: rank r contributes counts[r] bytes (this
 *  rank: counts[rank] bytes of send) and recv gets the rows packed in rank
 *  order (row r at counts[0] + ... + counts[r-1]). Ranks passing different
 *  counts fail with TPF_GROUP_MISMATCH on every rank, nothing written. The
 *  largest count at most tpf_agreed_cap (else TPF_CAP_MISMATCH). */
TPF_API tpf_status tpf_all_gather_v(tpf_group* group, const void* send, void* recv, const size_t* counts);

/** Host buffers: recv = sum over ranks of send (count elements of `dtype`,
 *  enum tpf_dtype), added in rank order 0..W-1 (f16/bf16 accumulate in f32,
 *  rounded once), bit-identical on every rank. send may equal recv. count
 *  and dtype the same on every rank (else TPF_GROUP_MISMATCH on every rank). */
TPF_API tpf_status tpf_all_reduce_sum(tpf_group* group, const void* send, void* recv, size_t count, int32_t dtype);

/** Device buffers (TPF_BUFFERS_DEVICE) on `stream` (a cudaStream_t; NULL the
 *  legacy default stream): enqueues kernels only, capturable in a CUDA graph.
 *  TPF_MISALIGNED / TPF_CAP_MISMATCH come back at once and launch nothing,
 *  as does TPF_UNSUPPORTED on a group opened with host buffers (or a
 *  library built without CUDA);
 *  a failed wait is recorded on the device and returned by tpf_check after
 *  the stream synchronised. Above the agreed cap, or after a fallback, the
 *  call goes to NCCL on the same stream where options.nccl_comm was given. */
TPF_API tpf_status tpf_all_gather_async(tpf_group* group, const void* send, void* recv, size_t bytes, void* stream);
TPF_API tpf_status tpf_all_reduce_sum_async(tpf_group* group, const void* send, void* recv, size_t count,
                                            int32_t dtype, void* stream);
/** tpf_all_gather_v on `stream`; a counts mismatch is returned by tpf_check
 *  after the stream synchronised. */
TPF_API tpf_status tpf_all_gather_v_async(tpf_group* group, const void* send, void* recv, const size_t* counts,
                                          void* stream);

/** The group's recorded failure, or TPF_OK. After any failure except
 *  TPF_CAP_MISMATCH, TPF_MISALIGNED and TPF_INVALID_ARGUMENT the group is
 *  broken: every later call fails the same way; close it and open again.
 *  Device groups: also what a kernel recorded (call after synchronising). */
TPF_API tpf_status tpf_check(const tpf_group* group);

/** A group's health word, as tpf_group_health reads it. 32 bytes of
 *  fixed-width fields; a later release may give meaning to reserved fields
 *  (0 until then) but never moves or resizes one.
 *
 *  Who sets it: every host call that fails the group (the call returns the
 *  same status); every device call that fails, from its kernel, in
 *  host-mapped memory before the kernel ends (no stream synchronisation is
 *  needed, only that the call has run: after the event or copy the engine
 *  synchronises on anyway, a failed replay of a CUDA graph is flagged before
 *  the next replay); an abort by any rank, at once; tpf_check when it finds a
 *  failure. Not set: by a peer that closed the group in order until a call
 *  of this rank goes past the last epoch that peer posted (that call fails
 *  TPF_PEER_LOST naming it); by a peer or daemon lost while no call ran (the
 *  next call fails and sets it); by refusals that leave the group usable
 *  (TPF_CAP_MISMATCH, TPF_MISALIGNED, TPF_INVALID_ARGUMENT, TPF_UNSUPPORTED). */
typedef struct tpf_health {
    int32_t status;       /**< @0  TPF_OK while healthy; else the failure's code, as tpf_check returns it */
    uint32_t rank;        /**< @4  the rank the failure names (the peer gone, late or mismatched; the aborter,
                                   this rank for its own tpf_abort); TPF_NO_RANK if none */
    uint32_t flags;       /**< @8  TPF_HEALTH_* bits */
    uint32_t reserved[5]; /**< @12 0 */
} tpf_health;

/** tpf_health.rank when the failure names no rank. */
#define TPF_NO_RANK UINT32_MAX
/** tpf_health.flags: the group runs on NCCL (it fell back at open); the word
 *  holds only what the library recorded (tpf_abort), not NCCL's asynchronous
 *  errors (ncclCommGetAsyncError). */
#define TPF_HEALTH_NCCL 1u

/** Read the group's health word without synchronising a stream and without
 *  a system call or a CUDA call (a few loads of host memory, well under a
 *  microsecond): an engine reads it once per step, after its own
 *  synchronisation point. Returns health->status: TPF_OK, or the failure as
 *  tpf_check would return it; `health` may be NULL when the status is all
 *  the caller wants. Once set it stays set: the group is broken; tpf_check
 *  gives the detail (tpf_last_error), then close and reopen on every rank.
 *  tpf_last_error is not touched (reading the word allocates nothing), except
 *  for a NULL group: TPF_INVALID_ARGUMENT, also in health->status. A group
 *  copied into a fork()ed child answers TPF_CLOSED. Any thread may call it,
 *  also while a call of the group blocks (never with or after
 *  tpf_group_close, which frees the handle). */
TPF_API tpf_status tpf_group_health(const tpf_group* group, tpf_health* health);

/** End every rank's waits with TPF_ABORTED (its text names this rank: "rank
 *  1 aborted the group") and break the group. The status says whether the
 *  abort was delivered, never the group's state (tpf_check says that):
 *  TPF_OK when the daemon was told (or, world 1, there is no one to tell),
 *  also on a group already broken or aborted (abort may be called again);
 *  tpf_check then returns TPF_ABORTED, or the failure that broke the group
 *  first. TPF_DAEMON_LOST when the daemon could not be told (the group is
 *  broken here all the same); TPF_UNSUPPORTED on a group that fell back to
 *  NCCL (no abort there: broken here only). The same as Group::abort() in
 *  C++, whose only other answer, TPF_CLOSED after close(), cannot arise here
 *  (tpf_group_close frees the handle). Not queued behind this rank's posted
 *  calls: a peer waiting for this rank's last shard may end that call
 *  TPF_ABORTED too. */
TPF_API tpf_status tpf_abort(tpf_group* group);

/** The exact minimum of every rank's usable maximum shard, in bytes (0 for NULL). */
TPF_API uint64_t tpf_agreed_cap(const tpf_group* group);
/** 1 when `bytes` fits the agreed cap, else 0. */
TPF_API int tpf_fits(const tpf_group* group, size_t bytes);
/** "fabric" or "nccl": which path this group's calls take ("" for NULL). Static storage. */
TPF_API const char* tpf_path(const tpf_group* group);
/** "self", "shm", "verbs", "ipc" or "tcp": how this rank reaches `peer` ("none" out of range; docs/wires.md). Static storage. */
TPF_API const char* tpf_route(const tpf_group* group, uint32_t peer);
/** This rank's rank in the group (0 for NULL). */
TPF_API uint32_t tpf_rank(const tpf_group* group);
/** The group's world size (0 for NULL). */
TPF_API uint32_t tpf_world(const tpf_group* group);

/** TCP bootstrap for CPU processes and tools: rank 0 listens on host_port
 *  ("127.0.0.1:29500") and returns; the others connect, retrying until
 *  timeout_ms (0: 30000; then TPF_TIMEOUT naming the root, before any open).
 *  Rank 0 takes the others' joins in its first all-gather, within that call's
 *  deadline. Pass tpf_tcp_bootstrap_allgather and the handle to tpf_group_open. */
TPF_API tpf_status tpf_tcp_bootstrap_create(uint32_t rank, uint32_t world, const char* host_port, uint32_t timeout_ms,
                                            tpf_tcp_bootstrap** bootstrap);
/** Closes the bootstrap's sockets and frees it; NULL is a no-op. A group
 *  opened through it does not need it afterwards. */
TPF_API void tpf_tcp_bootstrap_destroy(tpf_tcp_bootstrap* bootstrap);
/** A tpf_allgather_fn over a tpf_tcp_bootstrap (ctx). Rank 0 checks every
 *  rank's join and all-gather: a rank of another world, a rank twice, a rank
 *  gone or late fails every rank it can reach with the same named status.
 *  Given to tpf_group_open, it is bounded by the open's deadline and its rank
 *  and world are checked against the call's; called directly, each call is
 *  bounded by the create timeout. */
TPF_API tpf_status tpf_tcp_bootstrap_allgather(void* ctx, const void* mine, void* out, size_t bytes);

/** Inside a tpf_allgather_fn called by tpf_group_open: the milliseconds left
 *  until the open's deadline (open_timeout_ms from the call, plus half a
 *  second for the ranks' answers), by which the callback must return; 0 once
 *  it passed. UINT32_MAX when no such callback runs on this thread. */
TPF_API uint32_t tpf_bootstrap_time_left_ms(void);

/** "PeerLost": the stable name of a status ("Unknown" for values no release assigned). */
TPF_API const char* tpf_status_name(tpf_status status);
/** What an operator should understand and do about a status, one sentence. */
TPF_API const char* tpf_strerror(tpf_status status);
/** The last failure of this thread, with its detail ("PeerLost: rank 3 is
 *  gone"); "" when no call of this thread failed. Only a call that fails
 *  replaces it (tpf_status_name, tpf_strerror, tpf_version and
 *  tpf_last_error never do), and the text it replaces is freed: read it
 *  after the call it describes, not in the same expression (the order in
 *  which C evaluates a call's arguments is unspecified). */
TPF_API const char* tpf_last_error(void);
/** The library's release, "0.1.0" (compare with TPF_VERSION_STRING of the header). */
TPF_API const char* tpf_version(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TPFABRIC_H */
