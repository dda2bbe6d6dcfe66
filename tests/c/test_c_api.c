/* Every function of <tpfabric/tpfabric.h>, from C, against the real tpfabricd
 * ($TPF_DAEMON, started here on a temporary socket) and real rank processes
 * (forked; the host path needs no exec). The bootstrap is a caller-supplied
 * callback over files in a directory, as an engine's own store would be.
 *
 * Scenarios, each W ranks: data (gathers and sums checked against a
 * reference computed here, bad arguments and their codes), a killed peer
 * (PeerLost), abort (Aborted on the others), the TCP bootstrap, and open
 * failures (bad options, a failing callback, a bad value of each TPF_*
 * variable), and TPF_DISABLE on one rank (Unavailable everywhere for a host
 * group, and the daemon's log shows no connection).
 * Prints one line per check that fails and "ok N checks" at the end. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tpfabric/tpfabric.h>

static int failures = 0;
static int checks = 0;
static const char* who = "parent";

#define CHECK(cond, ...)                                                                                   \
    do {                                                                                                   \
        ++checks;                                                                                          \
        if (!(cond)) {                                                                                     \
            ++failures;                                                                                    \
            fprintf(stderr, "FAIL %s %s:%d: %s: ", who, __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                                  \
            fprintf(stderr, " (last error: %s)\n", tpf_last_error());                                      \
        }                                                                                                  \
    } while (0)
#define CHECK_STATUS(call, want)                                                                           \
    do {                                                                                                   \
        tpf_status got_ = (call);                                                                          \
        CHECK(got_ == (want), "%s returned %s, wanted %s", #call, tpf_status_name(got_), tpf_status_name(want)); \
    } while (0)

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_ms(unsigned ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- the caller-supplied bootstrap: an all-gather over files ---------- */

struct file_store {
    char dir[256];
    uint32_t rank, world, seq;
    int fail_at; /* return TPF_TIMEOUT at this call (-1: never) */
};

static tpf_status store_allgather(void* ctx, const void* mine, void* out, size_t bytes) {
    struct file_store* s = ctx;
    char tmp[320], path[320];
    uint32_t seq = s->seq++;
    if (s->fail_at >= 0 && (int)seq == s->fail_at) return TPF_TIMEOUT;
    snprintf(tmp, sizeof tmp, "%s/g%u-r%u.tmp", s->dir, seq, s->rank);
    snprintf(path, sizeof path, "%s/g%u-r%u.rec", s->dir, seq, s->rank);
    FILE* f = fopen(tmp, "wb");
    if (!f || fwrite(mine, 1, bytes, f) != bytes || fclose(f) != 0 || rename(tmp, path) != 0) return TPF_SYSTEM_ERROR;
    /* Bounded by the open's deadline (only tpf_group_open calls this; its default open timeout is 30 s). */
    const uint32_t left = tpf_bootstrap_time_left_ms();
    if (left == UINT32_MAX || left > 30000 + 500) return TPF_INVALID_ARGUMENT;
    uint64_t deadline = now_ms() + left;
    for (uint32_t r = 0; r < s->world; ++r) {
        snprintf(path, sizeof path, "%s/g%u-r%u.rec", s->dir, seq, r);
        for (;;) {
            struct stat st;
            if (stat(path, &st) == 0 && (size_t)st.st_size == bytes) break;
            if (now_ms() > deadline) return TPF_TIMEOUT;
            sleep_ms(1);
        }
        f = fopen(path, "rb");
        if (!f) return TPF_SYSTEM_ERROR;
        size_t n = fread((char*)out + (size_t)r * bytes, 1, bytes, f);
        fclose(f);
        if (n != bytes) return TPF_SYSTEM_ERROR;
    }
    return TPF_OK;
}

/* Counts its calls in *(int*)ctx and fails each: a bootstrap whose peers are gone. */
static tpf_status counting_allgather(void* ctx, const void* mine, void* out, size_t bytes) {
    (void)mine, (void)out, (void)bytes;
    ++*(int*)ctx;
    return TPF_PEER_LOST;
}

/* ---- the daemon and the ranks ------------------------------------------ */

static char top[64];
static char socket_path[108]; /* sun_path */
static pid_t daemon_pid = -1;

static int socket_answers(const char* path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    int ok = connect(fd, (struct sockaddr*)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

static void start_daemon(void) {
    const char* exe = getenv("TPF_DAEMON");
    if (!exe || !*exe) {
        fprintf(stderr, "TPF_DAEMON is not set (meson test sets it to the built tpfabricd)\n");
        exit(1);
    }
    snprintf(socket_path, sizeof socket_path, "%s/tpfabricd.sock", top);
    char log[320];
    snprintf(log, sizeof log, "%s/daemon.log", top);
    daemon_pid = fork();
    if (daemon_pid == 0) {
        int fd = open(log, O_CREAT | O_WRONLY | O_APPEND, 0644);
        dup2(fd, 2);
        /* debug: the log names every connection, so a test can tell the daemon was never contacted */
        execl(exe, exe, "--socket", socket_path, "--foreground", "--log-level", "debug", (char*)NULL);
        _exit(127);
    }
    for (int i = 0; i < 1000 && !socket_answers(socket_path); ++i) sleep_ms(10);
    if (!socket_answers(socket_path)) {
        fprintf(stderr, "tpfabricd did not listen on %s (see %s)\n", socket_path, log);
        exit(1);
    }
}

static void stop_daemon(void) {
    if (daemon_pid <= 0) return;
    kill(daemon_pid, SIGTERM);
    int st = 0;
    waitpid(daemon_pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tpfabricd exited with status %d", st);
}

typedef int (*rank_fn)(uint32_t rank, uint32_t world, const char* store_dir);

/* Runs `fn` as `world` forked ranks; returns how many failed (non-zero exit, or alive after timeout_ms). */
static int run_ranks(const char* name, uint32_t world, rank_fn fn, int timeout_ms) {
    static int scenario = 0;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/store-%d", top, ++scenario);
    mkdir(dir, 0700);
    pid_t pids[16];
    for (uint32_t r = 0; r < world; ++r) {
        pids[r] = fork();
        if (pids[r] == 0) {
            static char tag[64];
            snprintf(tag, sizeof tag, "%s rank %u", name, r);
            who = tag;
            failures = 0;
            int rc = fn(r, world, dir);
            fflush(stderr);
            _exit(rc != 0 || failures != 0 ? 1 : 0);
        }
    }
    int bad = 0;
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    for (uint32_t r = 0; r < world; ++r) {
        int st = 0;
        for (;;) {
            pid_t p = waitpid(pids[r], &st, WNOHANG);
            if (p == pids[r]) break;
            if (now_ms() > deadline) {
                fprintf(stderr, "FAIL %s: rank %u did not finish within %d ms\n", name, r, timeout_ms);
                kill(pids[r], SIGKILL);
                waitpid(pids[r], &st, 0);
                st = -1;
                break;
            }
            sleep_ms(2);
        }
        if (st != 0) ++bad;
    }
    ++checks;
    if (bad) {
        ++failures;
        fprintf(stderr, "FAIL %s: %d of %u ranks failed\n", name, bad, world);
    }
    return bad;
}

/* A fresh store in `dir` for `rank` of `world`, never failing (fail_at -1). */
static void store_init(struct file_store* store, const char* dir, uint32_t rank, uint32_t world) {
    memset(store, 0, sizeof *store);
    snprintf(store->dir, sizeof store->dir, "%s", dir);
    store->rank = rank;
    store->world = world;
    store->fail_at = -1;
}

static tpf_status open_rank(uint32_t rank, uint32_t world, uint64_t max_bytes, const char* dir, struct file_store* store,
                            tpf_group** g) {
    store_init(store, dir, rank, world);
    tpf_open_options o;
    tpf_open_options_init(&o);
    o.socket_path = socket_path;
    o.timeout_ms = 5000;
    return tpf_group_open(rank, world, max_bytes, store_allgather, store, &o, g);
}

/* ---- references written here, not the library's ---------------------- */

static uint8_t pattern(uint32_t rank, uint32_t call, size_t i) { return (uint8_t)(i * 131u + rank * 17u + call * 7u + 1u); }

static float bf16_to_float(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_bf16(float f) { /* round to nearest even; NaN stays NaN */
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

static float f32_value(uint32_t rank, size_t i) { return (float)((int)(i % 97) - 48) * 0.375f + (float)rank * 1.0e-3f; }
static uint16_t bf16_value(uint32_t rank, size_t i) {
    return float_to_bf16(rank == 0 ? 1024.0f + (float)(i % 13) : rank == 1 ? -1024.0f : 0.0078125f * (float)(1 + (i + rank) % 5));
}

/* ---- scenarios ---------------------------------------------------------- */

static int rank_data(uint32_t rank, uint32_t world, const char* dir) {
    struct file_store store;
    tpf_group* g = NULL;
    CHECK_STATUS(open_rank(rank, world, 65536, dir, &store, &g), TPF_OK);
    if (!g) return 1;
    CHECK(tpf_rank(g) == rank && tpf_world(g) == world, "rank %u world %u", tpf_rank(g), tpf_world(g));
    CHECK(tpf_agreed_cap(g) == 65536, "agreed cap %llu", (unsigned long long)tpf_agreed_cap(g));
    CHECK(tpf_fits(g, 65536) == 1 && tpf_fits(g, 65537) == 0, "fits");
    CHECK(strcmp(tpf_path(g), "fabric") == 0, "path %s", tpf_path(g));
    CHECK(strcmp(tpf_route(g, rank), "self") == 0, "route to self %s", tpf_route(g, rank));
    CHECK(strcmp(tpf_route(g, (rank + 1) % world), "shm") == 0, "route to next %s", tpf_route(g, (rank + 1) % world));
    CHECK(strcmp(tpf_route(g, world), "none") == 0, "route out of range %s", tpf_route(g, world));
    tpf_health h;
    memset(&h, 0xff, sizeof h);
    CHECK_STATUS(tpf_group_health(g, &h), TPF_OK); /* healthy before any call */
    CHECK(h.status == TPF_OK && h.rank == TPF_NO_RANK && h.flags == 0 && h.reserved[0] == 0 && h.reserved[4] == 0,
          "fresh group's health: status %d rank %u flags %u", h.status, h.rank, h.flags);

    size_t cap = 65536;
    uint8_t* send = aligned_alloc(64, cap);
    uint8_t* recv = aligned_alloc(64, cap * world);
    const size_t sizes[] = {16, 4096, 65536};
    for (uint32_t c = 0; c < 3; ++c) {
        size_t n = sizes[c];
        for (size_t i = 0; i < n; ++i) send[i] = pattern(rank, c, i);
        memset(recv, 0xa5, cap * world);
        CHECK_STATUS(tpf_all_gather(g, send, recv, n), TPF_OK);
        int wrong = 0;
        for (uint32_t q = 0; q < world; ++q)
            for (size_t i = 0; i < n; ++i) wrong += recv[q * n + i] != pattern(q, c, i);
        CHECK(wrong == 0, "all-gather of %zu bytes: %d wrong bytes", n, wrong);
    }
    /* f32 sum against the rank-order reference */
    size_t count = 1000;
    float* fs = (float*)send;
    for (size_t i = 0; i < count; ++i) fs[i] = f32_value(rank, i);
    CHECK_STATUS(tpf_all_reduce_sum(g, send, recv, count, TPF_DTYPE_F32), TPF_OK);
    int wrong = 0;
    for (size_t i = 0; i < count; ++i) {
        float acc = f32_value(0, i);
        for (uint32_t q = 1; q < world; ++q) acc += f32_value(q, i);
        uint32_t a, b;
        memcpy(&a, &acc, 4);
        memcpy(&b, (float*)recv + i, 4);
        wrong += a != b;
    }
    CHECK(wrong == 0, "f32 sum: %d elements differ from the rank-order reference", wrong);
    /* bf16 sum: accumulate in f32 in rank order, one rounding */
    uint16_t* hs = (uint16_t*)send;
    for (size_t i = 0; i < 2048; ++i) hs[i] = bf16_value(rank, i);
    CHECK_STATUS(tpf_all_reduce_sum(g, send, recv, 2048, TPF_DTYPE_BF16), TPF_OK);
    wrong = 0;
    for (size_t i = 0; i < 2048; ++i) {
        float acc = bf16_to_float(bf16_value(0, i));
        for (uint32_t q = 1; q < world; ++q) acc += bf16_to_float(bf16_value(q, i));
        wrong += float_to_bf16(acc) != ((uint16_t*)recv)[i];
    }
    CHECK(wrong == 0, "bf16 sum: %d elements differ from the rank-order reference", wrong);

    /* all-gather-v: uneven rows, one empty, packed in rank order */
    size_t counts[16], total = 0;
    for (uint32_t q = 0; q < world; ++q) total += counts[q] = q == 1 ? 0 : 100 + 37 * q;
    for (size_t i = 0; i < counts[rank]; ++i) send[i] = pattern(rank, 5, i);
    memset(recv, 0xa5, total + 64);
    CHECK_STATUS(tpf_all_gather_v(g, send, recv, counts), TPF_OK);
    wrong = 0;
    size_t at = 0;
    for (uint32_t q = 0; q < world; at += counts[q++])
        for (size_t i = 0; i < counts[q]; ++i) wrong += recv[at + i] != pattern(q, 5, i);
    CHECK(wrong == 0 && recv[total] == 0xa5, "all-gather-v: %d wrong bytes, byte after the rows %02x", wrong, recv[total]);
    CHECK_STATUS(tpf_all_gather_v(g, send, recv, NULL), TPF_INVALID_ARGUMENT);
    CHECK_STATUS(tpf_all_gather_v(NULL, send, recv, counts), TPF_INVALID_ARGUMENT);
    CHECK_STATUS(tpf_all_gather_v_async(g, send, recv, counts, NULL), TPF_UNSUPPORTED);
    CHECK_STATUS(tpf_all_gather_v_async(g, send, recv, NULL, NULL), TPF_INVALID_ARGUMENT);
    /* any byte count: 100 bytes a rank */
    for (size_t i = 0; i < 100; ++i) send[i] = pattern(rank, 6, i);
    memset(recv, 0xa5, 100 * world + 64);
    CHECK_STATUS(tpf_all_gather(g, send, recv, 100), TPF_OK);
    wrong = 0;
    for (uint32_t q = 0; q < world; ++q)
        for (size_t i = 0; i < 100; ++i) wrong += recv[q * 100 + i] != pattern(q, 6, i);
    CHECK(wrong == 0 && recv[100 * world] == 0xa5, "gather of 100 bytes: %d wrong bytes", wrong);

    /* Bad arguments: named codes, nothing written, the group stays usable. */
    memset(recv, 0xa5, 64);
    CHECK_STATUS(tpf_all_gather(NULL, send, recv, 16), TPF_INVALID_ARGUMENT);
    CHECK(strstr(tpf_last_error(), "InvalidArgument: tpf_all_gather: group is NULL") != NULL, "last error %s", tpf_last_error());
    CHECK_STATUS(tpf_all_gather(g, NULL, recv, 16), TPF_INVALID_ARGUMENT);
    CHECK_STATUS(tpf_all_gather(g, send + 1, recv, 16), TPF_MISALIGNED);
    CHECK_STATUS(tpf_all_gather(g, send, recv, cap + 16), TPF_CAP_MISMATCH);
    CHECK(strstr(tpf_last_error(), "CapMismatch") == tpf_last_error(), "last error %s", tpf_last_error());
    CHECK_STATUS(tpf_all_reduce_sum(g, send, recv, 16, 7), TPF_INVALID_ARGUMENT);
    CHECK_STATUS(tpf_all_reduce_sum(NULL, send, recv, 16, TPF_DTYPE_F32), TPF_INVALID_ARGUMENT);
    CHECK_STATUS(tpf_all_gather_async(g, send, recv, 16, NULL), TPF_UNSUPPORTED); /* a host group has no stream calls */
    CHECK_STATUS(tpf_all_reduce_sum_async(g, send, recv, 16, TPF_DTYPE_F32, NULL), TPF_UNSUPPORTED);
    CHECK_STATUS(tpf_all_gather_async(NULL, send, recv, 16, NULL), TPF_INVALID_ARGUMENT);
    CHECK_STATUS(tpf_all_reduce_sum_async(g, send, recv, 16, -1, NULL), TPF_INVALID_ARGUMENT);
    CHECK(recv[0] == 0xa5 && recv[63] == 0xa5, "a refused call wrote into recv");
    CHECK_STATUS(tpf_check(g), TPF_OK);
    CHECK_STATUS(tpf_check(NULL), TPF_INVALID_ARGUMENT);
    /* Healthy after good calls and refusals that leave the group usable. */
    CHECK_STATUS(tpf_group_health(g, &h), TPF_OK);
    CHECK(h.status == TPF_OK && h.rank == TPF_NO_RANK, "health after refusals: %s rank %u", tpf_status_name(h.status), h.rank);
    CHECK_STATUS(tpf_group_health(g, NULL), TPF_OK);
    memset(&h, 0, sizeof h);
    CHECK_STATUS(tpf_group_health(NULL, &h), TPF_INVALID_ARGUMENT);
    CHECK(h.status == TPF_INVALID_ARGUMENT && h.rank == TPF_NO_RANK, "NULL group's health: %s rank %u",
          tpf_status_name(h.status), h.rank);
    CHECK(strstr(tpf_last_error(), "tpf_group_health: group is NULL") != NULL, "last error %s", tpf_last_error());
    CHECK_STATUS(tpf_group_health(NULL, NULL), TPF_INVALID_ARGUMENT);
    /* A fork()ed child's copy is closed to it: its health says so, the parent's stays OK. */
    fflush(NULL);
    const pid_t child = fork();
    if (child == 0) {
        tpf_health ch;
        const tpf_status cs = tpf_group_health(g, &ch);
        _exit(cs == TPF_CLOSED && ch.status == TPF_CLOSED && ch.rank == TPF_NO_RANK ? 0 : 1);
    }
    int child_status = -1;
    CHECK(child > 0 && waitpid(child, &child_status, 0) == child && WIFEXITED(child_status) && WEXITSTATUS(child_status) == 0,
          "a fork()ed child's tpf_group_health did not answer TPF_CLOSED (status %d)", child_status);
    CHECK_STATUS(tpf_group_health(g, NULL), TPF_OK);
    CHECK_STATUS(tpf_abort(NULL), TPF_INVALID_ARGUMENT);
    CHECK(tpf_bootstrap_time_left_ms() == UINT32_MAX, "tpf_bootstrap_time_left_ms outside a bootstrap callback: %u",
          tpf_bootstrap_time_left_ms());
    /* still usable after the refusals */
    for (size_t i = 0; i < 16; ++i) send[i] = pattern(rank, 9, i);
    CHECK_STATUS(tpf_all_gather(g, send, recv, 16), TPF_OK);
    CHECK(recv[16 * ((rank + 1) % world)] == pattern((rank + 1) % world, 9, 0), "gather after refusals");
    CHECK(tpf_agreed_cap(NULL) == 0 && tpf_fits(NULL, 1) == 0 && strcmp(tpf_path(NULL), "") == 0, "NULL getters");
    tpf_group_close(g);
    tpf_group_close(NULL);
    free(send);
    free(recv);
    return 0;
}

/* The last rank dies (no close) after 20 calls; the others must end with PeerLost. */
static int rank_killed(uint32_t rank, uint32_t world, const char* dir) {
    struct file_store store;
    tpf_group* g = NULL;
    CHECK_STATUS(open_rank(rank, world, 4096, dir, &store, &g), TPF_OK);
    if (!g) return 1;
    uint8_t* send = aligned_alloc(64, 4096);
    uint8_t* recv = aligned_alloc(64, 4096 * world);
    memset(send, (int)rank, 4096);
    tpf_status s = TPF_OK;
    uint64_t start = 0;
    for (int call = 0; call < 1000 && s == TPF_OK; ++call) {
        if (rank == world - 1 && call == 20) _exit(0);
        if (call == 20) start = now_ms();
        s = tpf_all_gather(g, send, recv, 256);
    }
    CHECK(s == TPF_PEER_LOST, "the call after the peer died returned %s", tpf_status_name(s));
    CHECK(now_ms() - start < 5000, "PeerLost took %llu ms", (unsigned long long)(now_ms() - start));
    tpf_health h; /* before tpf_check: the health word names the failure and the dead rank by itself */
    CHECK_STATUS(tpf_group_health(g, &h), TPF_PEER_LOST);
    CHECK(h.status == TPF_PEER_LOST && h.rank == world - 1, "health after the peer died: %s rank %u", tpf_status_name(h.status),
          h.rank);
    CHECK_STATUS(tpf_check(g), TPF_PEER_LOST);
    CHECK(strstr(tpf_last_error(), "PeerLost") == tpf_last_error(), "last error %s", tpf_last_error());
    CHECK_STATUS(tpf_all_gather(g, send, recv, 256), TPF_PEER_LOST); /* broken stays broken */
    tpf_group_close(g);
    free(send);
    free(recv);
    return 0;
}

/* Rank 1 aborts after 10 calls; everyone else's next call ends Aborted. */
static int rank_abort(uint32_t rank, uint32_t world, const char* dir) {
    struct file_store store;
    tpf_group* g = NULL;
    CHECK_STATUS(open_rank(rank, world, 4096, dir, &store, &g), TPF_OK);
    if (!g) return 1;
    uint8_t* send = aligned_alloc(64, 4096);
    uint8_t* recv = aligned_alloc(64, 4096 * world);
    memset(send, (int)rank, 4096);
    for (int call = 0; call < 10; ++call) CHECK_STATUS(tpf_all_gather(g, send, recv, 64), TPF_OK);
    if (rank == 1) {
        CHECK_STATUS(tpf_abort(g), TPF_OK);
        CHECK_STATUS(tpf_abort(g), TPF_OK); /* delivered again: abort reports delivery, not the group's state */
        tpf_health h;
        CHECK_STATUS(tpf_group_health(g, &h), TPF_ABORTED);
        CHECK(h.rank == 1, "the aborter's health names rank %u", h.rank);
        CHECK_STATUS(tpf_check(g), TPF_ABORTED);
        CHECK_STATUS(tpf_all_gather(g, send, recv, 64), TPF_ABORTED);
    } else {
        tpf_status s = TPF_OK;
        for (int call = 0; call < 1000 && s == TPF_OK; ++call) s = tpf_all_gather(g, send, recv, 64);
        CHECK(s == TPF_ABORTED, "the others' call returned %s", tpf_status_name(s));
        tpf_health h; /* before tpf_check */
        CHECK_STATUS(tpf_group_health(g, &h), TPF_ABORTED);
        CHECK(h.rank == 1, "the others' health names rank %u, not the aborter", h.rank);
        CHECK(strstr(tpf_last_error(), "rank 1 aborted the group") != NULL, "the others' Aborted names the aborter: %s",
              tpf_last_error());
        CHECK_STATUS(tpf_check(g), TPF_ABORTED);
    }
    tpf_group_close(g);
    free(send);
    free(recv);
    return 0;
}

/* The library's own TCP bootstrap through the same callback interface. */
static int rank_tcp(uint32_t rank, uint32_t world, const char* dir) {
    (void)dir;
    char port_file[300], host_port[64];
    snprintf(port_file, sizeof port_file, "%s/tcp-port", top);
    FILE* f = fopen(port_file, "r");
    int port = 0;
    if (!f || fscanf(f, "%d", &port) != 1) return 1;
    fclose(f);
    snprintf(host_port, sizeof host_port, "127.0.0.1:%d", port);
    tpf_tcp_bootstrap* b = NULL;
    CHECK_STATUS(tpf_tcp_bootstrap_create(rank, world, host_port, 20000, &b), TPF_OK);
    if (!b) return 1;
    tpf_open_options o;
    tpf_open_options_init(&o);
    o.socket_path = socket_path;
    tpf_group* g = NULL;
    CHECK_STATUS(tpf_group_open(rank, world, 8192, tpf_tcp_bootstrap_allgather, b, &o, &g), TPF_OK);
    if (g) {
        uint8_t* send = aligned_alloc(64, 8192);
        uint8_t* recv = aligned_alloc(64, 8192 * world);
        for (size_t i = 0; i < 8192; ++i) send[i] = pattern(rank, 3, i);
        CHECK_STATUS(tpf_all_gather(g, send, recv, 8192), TPF_OK);
        int wrong = 0;
        for (uint32_t q = 0; q < world; ++q)
            for (size_t i = 0; i < 8192; ++i) wrong += recv[q * 8192 + i] != pattern(q, 3, i);
        CHECK(wrong == 0, "gather over the TCP bootstrap: %d wrong bytes", wrong);
        tpf_group_close(g);
        free(send);
        free(recv);
    }
    tpf_tcp_bootstrap_destroy(b);
    return 0;
}

/* A callback that fails at its second call: the open fails with its code on that rank. */
static int rank_callback_fails(uint32_t rank, uint32_t world, const char* dir) {
    struct file_store store;
    store_init(&store, dir, rank, world);
    store.fail_at = 0; /* every rank: the very first all-gather fails */
    tpf_open_options o;
    tpf_open_options_init(&o);
    o.socket_path = socket_path;
    tpf_group* g = (tpf_group*)&store; /* must come back NULL */
    CHECK_STATUS(tpf_group_open(rank, world, 4096, store_allgather, &store, &o, &g), TPF_TIMEOUT);
    CHECK(g == NULL, "a failed open left a group");
    CHECK(strstr(tpf_last_error(), "callback returned 3") != NULL, "last error %s", tpf_last_error());
    return 0;
}

/* A bad TPF_* value on rank 0 fails the open on every rank, naming it and
 * what it accepts there. One scenario per client variable (TPF_SOCKET takes
 * any path). */
static const char* bad_name;
static const char* bad_value;
static const char* bad_accepted;

static int rank_bad_env(uint32_t rank, uint32_t world, const char* dir) {
    if (rank == 0) setenv(bad_name, bad_value, 1);
    struct file_store store;
    tpf_group* g = NULL;
    CHECK_STATUS(open_rank(rank, world, 4096, dir, &store, &g), TPF_CONFIG_ERROR);
    CHECK(g == NULL, "a failed open left a group");
    char want[160];
    snprintf(want, sizeof want, "%s=%s: accepted values are %s", bad_name, bad_value, bad_accepted);
    if (rank == 0)
        CHECK(strstr(tpf_last_error(), want) != NULL, "last error %s, wanted %s", tpf_last_error(), want);
    else
        CHECK(strstr(tpf_last_error(), "rank 0 has an invalid TPF_* variable") != NULL, "last error %s", tpf_last_error());
    return 0;
}

/* The last rank passes rank world + 2 through the same callback (its store
 * rank is its own): OutOfRange there, GroupMismatch naming its bootstrap rank
 * on the others, at once rather than at their open timeout. */
static int rank_bad_rank(uint32_t rank, uint32_t world, const char* dir) {
    struct file_store store;
    tpf_group* g = NULL;
    const int last = rank == world - 1;
    const uint64_t start = now_ms();
    store_init(&store, dir, rank, world);
    tpf_open_options o;
    tpf_open_options_init(&o);
    o.socket_path = socket_path;
    o.open_timeout_ms = 20000;
    CHECK_STATUS(tpf_group_open(last ? world + 2 : rank, world, 4096, store_allgather, &store, &o, &g),
                 last ? TPF_OUT_OF_RANGE : TPF_GROUP_MISMATCH);
    CHECK(g == NULL, "a failed open left a group");
    char want[96];
    if (last) snprintf(want, sizeof want, "rank %u not below world %u", world + 2, world);
    else snprintf(want, sizeof want, "bootstrap rank %u opens as rank %u, not below world %u", world - 1, world + 2, world);
    CHECK(strstr(tpf_last_error(), want) != NULL, "last error %s, wanted %s", tpf_last_error(), want);
    CHECK(now_ms() - start < 10000, "the open took %llu ms", (unsigned long long)(now_ms() - start));
    return 0;
}

/* TPF_DISABLE=1 on the last rank: a host group is Unavailable on every rank, and no daemon is asked. */
static int rank_disabled(uint32_t rank, uint32_t world, const char* dir) {
    if (rank == world - 1) setenv("TPF_DISABLE", "1", 1);
    struct file_store store;
    tpf_group* g = NULL;
    CHECK_STATUS(open_rank(rank, world, 4096, dir, &store, &g), TPF_UNAVAILABLE);
    char want[64];
    snprintf(want, sizeof want, "TPF_DISABLE=1 on rank %u", world - 1);
    CHECK(strstr(tpf_last_error(), want) != NULL, "last error %s", tpf_last_error());
    CHECK(tpf_last_open_may_fall_back() == 1, "TPF_DISABLE allows a fallback whatever the policy");
    return 0;
}

/* No daemon on the socket, rank 0 asks for errors instead of a fallback:
 * Unavailable on every rank, and tpf_last_open_may_fall_back() says 0 on
 * every rank; the same group with every rank allowing a fallback says 1. */
static int rank_fallback_policy(uint32_t rank, uint32_t world, const char* dir) {
    for (int pass = 0; pass < 2; ++pass) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s/pass%d", dir, pass);
        mkdir(sub, 0700);
        struct file_store store;
        store_init(&store, sub, rank, world);
        tpf_open_options o;
        tpf_open_options_init(&o);
        o.socket_path = "/nonexistent/tpfabricd.sock";
        o.fallback = pass == 0 && rank == 0 ? TPF_FALLBACK_ERROR : TPF_FALLBACK_NCCL;
        tpf_group* g = NULL;
        CHECK_STATUS(tpf_group_open(rank, world, 4096, store_allgather, &store, &o, &g), TPF_UNAVAILABLE);
        const int want = pass == 0 ? 0 : 1;
        CHECK(tpf_last_open_may_fall_back() == want, "pass %d: tpf_last_open_may_fall_back() %d, want %d (%s)", pass,
              tpf_last_open_may_fall_back(), want, tpf_last_error());
    }
    /* Any later call that is not an Unavailable open resets it. */
    tpf_group* g = NULL;
    CHECK_STATUS(tpf_group_open(rank, world, 4096, store_allgather, NULL, NULL, NULL), TPF_INVALID_ARGUMENT);
    CHECK(tpf_last_open_may_fall_back() == 0, "a refused open argument resets tpf_last_open_may_fall_back()");
    (void)g;
    return 0;
}

/* How many lines of the daemon's log contain `needle`. */
static int count_in_log(const char* needle) {
    char path[320], line[1024];
    snprintf(path, sizeof path, "%s/daemon.log", top);
    FILE* f = fopen(path, "r");
    int n = 0;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (strstr(line, needle)) ++n;
    fclose(f);
    return n;
}

/* A loopback port free a moment ago (the kernel's pick for port 0). */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(0x7f000001);
    bind(fd, (struct sockaddr*)&a, sizeof a);
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr*)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

static void single_process_checks(void) {
    tpf_group* g = (tpf_group*)1;
    tpf_open_options o;
    tpf_open_options_init(&o);
    CHECK(o.struct_size == sizeof o && o.buffers == TPF_BUFFERS_HOST && o.socket_path == NULL, "options_init");
    CHECK_STATUS(tpf_group_open(0, 2, 4096, NULL, NULL, &o, &g), TPF_INVALID_ARGUMENT);
    CHECK(g == NULL, "group not cleared");
    CHECK_STATUS(tpf_group_open(0, 2, 4096, store_allgather, NULL, &o, NULL), TPF_INVALID_ARGUMENT);
    CHECK_STATUS(tpf_group_open(0, 0, 4096, store_allgather, NULL, &o, &g), TPF_OUT_OF_RANGE);
    CHECK_STATUS(tpf_group_open(0, 17, 4096, store_allgather, NULL, &o, &g), TPF_OUT_OF_RANGE);
    /* A rank outside the world still takes part in the first exchange (so that
       the others hear which rank opened as what): one call of the callback,
       whose failure does not hide the caller's own mistake. */
    int calls = 0;
    CHECK_STATUS(tpf_group_open(3, 2, 4096, counting_allgather, &calls, &o, &g), TPF_OUT_OF_RANGE);
    CHECK(calls == 1, "rank 3 of 2 called the bootstrap %d times, not once", calls);
    CHECK(strstr(tpf_last_error(), "rank 3 not below world 2") != NULL, "last error %s", tpf_last_error());
    tpf_open_options bad = o;
    bad.struct_size = 0;
    CHECK_STATUS(tpf_group_open(0, 2, 4096, store_allgather, NULL, &bad, &g), TPF_INVALID_ARGUMENT);
    bad = o;
    bad.buffers = 5;
    CHECK_STATUS(tpf_group_open(0, 2, 4096, store_allgather, NULL, &bad, &g), TPF_INVALID_ARGUMENT);
    bad = o;
    bad.fallback = 9;
    CHECK_STATUS(tpf_group_open(0, 2, 4096, store_allgather, NULL, &bad, &g), TPF_INVALID_ARGUMENT);
    bad = o;
    bad.gpu_route = -2;
    CHECK_STATUS(tpf_group_open(0, 2, 4096, store_allgather, NULL, &bad, &g), TPF_INVALID_ARGUMENT);
    CHECK(strstr(tpf_last_error(), "gpu_route") != NULL, "last error %s", tpf_last_error());

    /* World 1: a plain copy, no daemon (none is asked: the socket below
       does not exist), one bootstrap exchange of its own record. */
    struct file_store store;
    store_init(&store, top, 0, 1);
    tpf_open_options nowhere = o;
    nowhere.socket_path = "/nonexistent/tpfabricd.sock";
    CHECK_STATUS(tpf_group_open(0, 1, 4096, store_allgather, &store, &nowhere, &g), TPF_OK);
    CHECK(store.seq == 1, "world 1 used the bootstrap %u times, not once", store.seq);
    if (g) {
        _Alignas(16) uint8_t a[64], b[64];
        for (int i = 0; i < 64; ++i) a[i] = (uint8_t)i;
        CHECK_STATUS(tpf_all_gather(g, a, b, 64), TPF_OK);
        CHECK(memcmp(a, b, 64) == 0, "world-1 gather");
        CHECK(tpf_agreed_cap(g) == 4096, "world-1 cap %llu", (unsigned long long)tpf_agreed_cap(g));
        tpf_group_close(g);
    }
    /* World 1 fails as any group: a cap of 0, its bootstrap's failure, TPF_DISABLE. */
    CHECK_STATUS(tpf_group_open(0, 1, 0, store_allgather, &store, &nowhere, &g), TPF_OUT_OF_RANGE);
    CHECK(strstr(tpf_last_error(), "max_bytes is 0") != NULL, "last error %s", tpf_last_error());
    store.fail_at = (int)store.seq;
    CHECK_STATUS(tpf_group_open(0, 1, 4096, store_allgather, &store, &nowhere, &g), TPF_TIMEOUT);
    CHECK(g == NULL, "a failed world-1 open left a group");
    store.fail_at = -1;
    setenv("TPF_DISABLE", "1", 1);
    CHECK_STATUS(tpf_group_open(0, 1, 4096, store_allgather, &store, &nowhere, &g), TPF_UNAVAILABLE);
    CHECK(strstr(tpf_last_error(), "TPF_DISABLE=1 on rank 0") != NULL, "last error %s", tpf_last_error());
    CHECK(tpf_last_open_may_fall_back() == 1, "TPF_DISABLE at world 1 allows a fallback");
    unsetenv("TPF_DISABLE");

    /* No daemon behind the socket: a host group has nothing to fall back to. */
    CHECK(tpf_tcp_bootstrap_create(0, 2, NULL, 0, NULL) == TPF_INVALID_ARGUMENT, "tcp bootstrap NULL out");
    tpf_tcp_bootstrap* tb = (tpf_tcp_bootstrap*)1;
    CHECK_STATUS(tpf_tcp_bootstrap_create(0, 2, NULL, 0, &tb), TPF_INVALID_ARGUMENT);
    CHECK(tb == NULL, "bootstrap not cleared");
    CHECK_STATUS(tpf_tcp_bootstrap_allgather(NULL, "", NULL, 0), TPF_INVALID_ARGUMENT);
    tpf_tcp_bootstrap_destroy(NULL);
    /* A world-1 TCP bootstrap: NULL buffers are refused, not dereferenced;
       its allgather without its handle is refused by name at open. */
    tpf_tcp_bootstrap* one = NULL;
    char one_at[32];
    snprintf(one_at, sizeof one_at, "127.0.0.1:%d", free_port());
    CHECK_STATUS(tpf_tcp_bootstrap_create(0, 1, one_at, 0, &one), TPF_OK);
    if (one) {
        uint8_t mine[16] = {7}, out[16] = {0};
        CHECK_STATUS(tpf_tcp_bootstrap_allgather(one, NULL, out, 16), TPF_INVALID_ARGUMENT);
        CHECK(strstr(tpf_last_error(), "mine or out is NULL") != NULL, "last error %s", tpf_last_error());
        CHECK_STATUS(tpf_tcp_bootstrap_allgather(one, mine, NULL, 16), TPF_INVALID_ARGUMENT);
        CHECK_STATUS(tpf_tcp_bootstrap_allgather(one, mine, out, 16), TPF_OK);
        CHECK(out[0] == 7, "world-1 bootstrap all-gather");
        tpf_tcp_bootstrap_destroy(one);
    }
    CHECK_STATUS(tpf_group_open(0, 2, 4096, tpf_tcp_bootstrap_allgather, NULL, &o, &g), TPF_INVALID_ARGUMENT);
    CHECK(strstr(tpf_last_error(), "ctx (its tpf_tcp_bootstrap) is NULL") != NULL, "last error %s", tpf_last_error());

    /* Names, messages, version. */
    CHECK(strcmp(tpf_status_name(TPF_PEER_LOST), "PeerLost") == 0, "name %s", tpf_status_name(TPF_PEER_LOST));
    CHECK(strcmp(tpf_status_name(TPF_OK), "Ok") == 0, "name of ok");
    CHECK(strcmp(tpf_status_name(TPF_INVALID_ARGUMENT), "InvalidArgument") == 0, "name");
    CHECK(strcmp(tpf_status_name(999), "Unknown") == 0 && strcmp(tpf_status_name(-1), "Unknown") == 0, "unknown name");
    CHECK(strlen(tpf_strerror(TPF_DAEMON_LOST)) > 10 && strstr(tpf_strerror(TPF_DAEMON_LOST), "tpfabricd") != NULL, "strerror");
    CHECK(strstr(tpf_strerror(12345), "unknown") != NULL, "strerror of an unknown code");
    CHECK(strcmp(tpf_version(), TPF_VERSION_STRING) == 0, "library %s, header %s", tpf_version(), TPF_VERSION_STRING);
    for (int code = TPF_OK; code <= TPF_BUSY; ++code)
        CHECK(strcmp(tpf_status_name(code), "Unknown") != 0, "code %d has no name", code);
    CHECK(strcmp(tpf_status_name(TPF_BUSY), "Busy") == 0, "name of TPF_BUSY");
}

static void write_free_port(void) {
    char path[300];
    snprintf(path, sizeof path, "%s/tcp-port", top);
    FILE* f = fopen(path, "w");
    fprintf(f, "%d\n", free_port());
    fclose(f);
}

int main(void) {
    setvbuf(stderr, NULL, _IOLBF, 0);
    snprintf(top, sizeof top, "/tmp/tpf-c-XXXXXX");
    if (!mkdtemp(top)) {
        perror("mkdtemp");
        return 1;
    }
    start_daemon();
    single_process_checks();
    run_ranks("data W=3", 3, rank_data, 60000);
    run_ranks("killed peer W=3", 3, rank_killed, 60000);
    run_ranks("abort W=3", 3, rank_abort, 60000);
    run_ranks("callback fails W=2", 2, rank_callback_fails, 30000);
    run_ranks("rank outside the world W=3", 3, rank_bad_rank, 30000);
    static const char* const bad[][3] = {
        {"TPF_DISABLE", "yes", "1 (keep every group off the fabric: NCCL takes a device group with a communicator, any other open is Unavailable) and 0"},
        {"TPF_FALLBACK", "ncll", "nccl, error"},
        {"TPF_GPU_ROUTE", "nvlink", "auto, ipc, proxy"},
        {"TPF_NCCL_ABOVE", "lots", "a byte size (4096, 64KiB, 1MiB) or never"},
        {"TPF_GPU_LL", "on", "1 (use the LL path where it fits) and 0"},
        {"TPF_GPU_LL_CHUNKS", "3", "1, 2, 4"},
        {"TPF_GPU_PDL", "yes", "1 (device calls use programmatic dependent launch where the GPU has it) and 0"},
        {"TPF_GPU_POLLERS", "8", "1, 2, 3, 4 (warps that poll a proxy-route flag in host memory)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        bad_name = bad[i][0];
        bad_value = bad[i][1];
        bad_accepted = bad[i][2];
        char name[64];
        snprintf(name, sizeof name, "bad %s W=2", bad_name);
        run_ranks(name, 2, rank_bad_env, 30000);
    }
    {
        /* TPF_DISABLE: no rank may even connect to the daemon. */
        int before = count_in_log("connected (pid");
        run_ranks("TPF_DISABLE W=3", 3, rank_disabled, 30000);
        int after = count_in_log("connected (pid");
        CHECK(before > 0 && after == before, "the daemon logged %d connections before the TPF_DISABLE group, %d after",
              before, after);
    }
    run_ranks("fallback policy W=2", 2, rank_fallback_policy, 30000);
    write_free_port();
    run_ranks("TCP bootstrap W=2", 2, rank_tcp, 60000);
    stop_daemon();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
    if (failures == 0 && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", top);
    if (failures) {
        fprintf(stderr, "%d of %d checks failed (daemon log: %s/daemon.log)\n", failures, checks, top);
        return 1;
    }
    printf("ok %d checks\n", checks);
    return 0;
}
