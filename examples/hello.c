/* hello.c: one rank of a tpfabric host group, through the C ABI.
 *
 * Opens a group over the TCP bootstrap, runs an all-gather and an f32 sum,
 * and checks both against a reference computed here from every rank's
 * inputs. Start WORLD copies, one per rank, against a running tpfabricd:
 *
 *   cc -std=c11 hello.c $(pkg-config --cflags --libs libtpfabric) -o hello_c
 *   for r in 0 1 2; do ./hello_c $r 3 127.0.0.1:29500 & done; wait
 *
 * Exit status 0 when every check passed, 1 on any failure (printed), 2 on
 * bad arguments. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tpfabric/tpfabric.h>

enum { GATHER_BYTES = 4096, SUM_COUNT = 1024 };

/* Every rank's inputs, so that any rank can compute the expected results. */
static uint8_t gather_byte(uint32_t rank, size_t i) { return (uint8_t)(rank * 31 + i * 7); }
static float sum_input(uint32_t rank, size_t i) { return (float)((int)((i * 13 + rank * 29) % 101) - 50) * 0.37f; }

static int fail(const char* what, tpf_status s) {
    /* tpf_last_error() has the detail: "Unavailable: TPF_DISABLE=1 on rank 2" */
    fprintf(stderr, "hello_c: %s: %s (%s)\n", what, tpf_last_error(), tpf_status_name(s));
    return 1;
}

int main(int argc, char** argv) {
    if (argc != 4 && !(argc == 6 && strcmp(argv[4], "--socket") == 0)) {
        fprintf(stderr, "usage: %s RANK WORLD HOST:PORT [--socket PATH]\n", argv[0]);
        return 2;
    }
    uint32_t rank = (uint32_t)strtoul(argv[1], NULL, 10);
    uint32_t world = (uint32_t)strtoul(argv[2], NULL, 10);
    tpf_open_options options;
    tpf_open_options_init(&options);
    if (argc == 6) options.socket_path = argv[5]; /* NULL: $TPF_SOCKET, else /run/tpfabric/tpfabricd.sock */

    /* Rank 0 listens on HOST:PORT, the others connect. An engine passes its
     * own all-gather callback over its communicator or store instead. */
    tpf_tcp_bootstrap* boot = NULL;
    tpf_status s = tpf_tcp_bootstrap_create(rank, world, argv[3], 0, &boot);
    if (s != TPF_OK) return fail("bootstrap", s);
    tpf_group* group = NULL;
    s = tpf_group_open(rank, world, 64 * 1024, tpf_tcp_bootstrap_allgather, boot, &options, &group);
    tpf_tcp_bootstrap_destroy(boot); /* only tpf_group_open uses the bootstrap */
    if (s != TPF_OK) return fail("open", s);

    int rc = 1;
    /* 16-byte aligned buffers (else TPF_MISALIGNED); recv holds world shards in rank order. */
    uint8_t* send = aligned_alloc(64, GATHER_BYTES);
    uint8_t* recv = aligned_alloc(64, (size_t)world * GATHER_BYTES);
    float* in = aligned_alloc(64, SUM_COUNT * sizeof(float));
    float* out = aligned_alloc(64, SUM_COUNT * sizeof(float));
    if (!send || !recv || !in || !out) {
        fprintf(stderr, "hello_c: out of memory\n");
        goto done;
    }
    for (size_t i = 0; i < GATHER_BYTES; ++i) send[i] = gather_byte(rank, i);
    for (size_t i = 0; i < SUM_COUNT; ++i) in[i] = sum_input(rank, i);

    if (!tpf_fits(group, GATHER_BYTES)) { /* above the cap a device group would call NCCL instead */
        fprintf(stderr, "hello_c: %d B is above the agreed cap %llu B\n", GATHER_BYTES,
                (unsigned long long)tpf_agreed_cap(group));
        goto done;
    }
    if ((s = tpf_all_gather(group, send, recv, GATHER_BYTES)) != TPF_OK) {
        rc = fail("all-gather", s);
        goto done;
    }
    for (uint32_t r = 0; r < world; ++r)
        for (size_t i = 0; i < GATHER_BYTES; ++i)
            if (recv[(size_t)r * GATHER_BYTES + i] != gather_byte(r, i)) {
                fprintf(stderr, "hello_c: all-gather: byte %zu of rank %u's shard differs\n", i, r);
                goto done;
            }

    /* f32 sum: added in rank order 0..W-1, so every rank gets the same bits. */
    if ((s = tpf_all_reduce_sum(group, in, out, SUM_COUNT, TPF_DTYPE_F32)) != TPF_OK) {
        rc = fail("f32 sum", s);
        goto done;
    }
    for (size_t i = 0; i < SUM_COUNT; ++i) {
        float acc = sum_input(0, i);
        for (uint32_t r = 1; r < world; ++r) acc += sum_input(r, i);
        if (memcmp(&out[i], &acc, sizeof acc) != 0) {
            fprintf(stderr, "hello_c: f32 sum: element %zu is %a, expected %a\n", i, (double)out[i], (double)acc);
            goto done;
        }
    }
    /* The health word, once per step after the engine's own synchronisation
     * point (device groups: where the step's sampled tokens reach the host):
     * a few loads of host memory, no stream sync, no system call. A device
     * call that failed inside a kernel, also one replayed in a CUDA graph,
     * sets it before the kernel ends. When it is set, the outputs of the
     * failed call and every later one were not written: drop the step's
     * results, stop the other ranks (tpf_abort, or the engine's teardown),
     * then on every rank close, reopen, capture the graphs again and redo the
     * step; tpf_check (after synchronising) gives the detail. */
    tpf_health health;
    if (tpf_group_health(group, &health) != TPF_OK) {
        fprintf(stderr, "hello_c: the group is broken: %s naming rank %d; reopen it on every rank\n",
                tpf_status_name(health.status), health.rank == TPF_NO_RANK ? -1 : (int)health.rank);
        rc = fail("check", tpf_check(group));
        goto done;
    }
    /* A failed call breaks the group: tpf_check says so; close it and open again. */
    if ((s = tpf_check(group)) != TPF_OK) {
        rc = fail("check", s);
        goto done;
    }

    printf("hello_c: rank %u of %u, path %s (routes", rank, world, tpf_path(group));
    for (uint32_t p = 0; p < world; ++p) printf(" %s", tpf_route(group, p));
    printf("): all-gather of %d B ok, f32 sum of %d ok\n", GATHER_BYTES, SUM_COUNT);
    rc = 0;
done:
    free(send);
    free(recv);
    free(in);
    free(out);
    tpf_group_close(group);
    return rc;
}
