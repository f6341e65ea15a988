// comm.h's staging of device buffers through the host (comm_stage_device,
// what MOECORE_COMM=mpi runs on GPUs), on CPU ranks: for tests/test_comm_stage.sh,
// under mpirun. The "device" is an mmap'ed arena kept PROT_NONE except while
// the hooks below copy to or from it, so an MPI call handed device memory
// instead of a host copy ends the rank with SIGSEGV. Every call of comm.h
// runs on device buffers with uneven counts, against values computed here;
// a rank prints "ok: ..." / "FAIL: ..." and exits 1 on any failure.
//   tool_comm_stage          the checks
//   tool_comm_stage nostage  the same without comm_stage_device: must die
//                            at the first collective (the trap works)
//   tool_comm_stage check [WRITE]  MOECORE_COMM_CHECK's semantics (comm_mpi.c),
//                            on host and device buffers: receive and in-place
//                            buffers hold 0xFF bytes until completion, sends
//                            go out with the bytes of the call; with WRITE
//                            (allreduce, rs-send, rs-recv, send, recv) the
//                            caller writes that buffer before comm_wait and the
//                            job must end with the check's message
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "dist/comm.h"

#define ARENA (1 << 22)
static char *arena;
static size_t used;
static int n_to_host, n_to_device, n_copy;

static void dev_rw(int on) {
    if (mprotect(arena, ARENA, on ? PROT_READ | PROT_WRITE : PROT_NONE)) {
        perror("mprotect");
        exit(2);
    }
}
static int on_device(const void *p) { return (const char *)p >= arena && (const char *)p < arena + ARENA; }
static void to_host(void *h, const void *d, size_t n) { dev_rw(1), memcpy(h, d, n), dev_rw(0), n_to_host++; }
static void to_device(void *d, const void *h, size_t n) { dev_rw(1), memcpy(d, h, n), dev_rw(0), n_to_device++; }
static void copy(void *d, const void *s, size_t n) { dev_rw(1), memmove(d, s, n), dev_rw(0), n_copy++; }
static const CommDeviceCopy hooks = {on_device, to_host, to_device, copy};

static void *dev_alloc(size_t n) {
    void *p = arena + used;
    used += (n + 63) & ~(size_t)63;
    if (used > ARENA) { fprintf(stderr, "arena full\n"); exit(2); }
    return p;
}
// the test's own reads and writes of device memory (not counted)
static void dev_put(void *d, const void *h, size_t n) { dev_rw(1), memcpy(d, h, n), dev_rw(0); }
static void dev_get(void *h, const void *d, size_t n) { dev_rw(1), memcpy(h, d, n), dev_rw(0); }

static int rank, P, fails;
static void check(int cond, const char *what) {
    printf("%s: rank %d: %s\n", cond ? "ok" : "FAIL", rank, what);
    if (!cond) fails++;
}
static float val(int r, int i) { return (float)(1000 * r + i); }

static int all_ff(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != 0xff) return 0;
    return 1;
}
// buffers on the "device" (dev) or the host, read and written by the test
static void *buf_alloc(int dev, size_t n) { return dev ? dev_alloc(n) : calloc(1, n); }
static void buf_put(int dev, void *d, const void *h, size_t n) { dev ? dev_put(d, h, n) : (void)memcpy(d, h, n); }
static void buf_get(int dev, void *h, const void *d, size_t n) { dev ? dev_get(h, d, n) : (void)memcpy(h, d, n); }

// MOECORE_COMM_CHECK (set by main): the checked non-blocking calls on host
// (dev 0) and device (dev 1) buffers; write names a buffer the caller then
// writes too early (the job must die in comm_wait)
static int run_check(Comm *w, const char *write) {
    int next = (rank + 1) % P, prev = (rank + P - 1) % P;
    float h[256], g[256], junk = 42;
    for (int dev = 0; dev < 2; dev++) {
        const char *where = dev ? "device" : "host";
        char what[160];
        // iallreduce: the buffer holds 0xFF until comm_wait, then the sums
        float *a = buf_alloc(dev, 64 * 4);
        for (int i = 0; i < 64; i++) h[i] = val(rank, i);
        buf_put(dev, a, h, 64 * 4);
        CommReq *r = comm_iallreduce(w, a, 64, COMM_F32);
        buf_get(dev, g, a, 64 * 4);
        snprintf(what, sizeof what, "checked iallreduce, %s buffer: 0xFF bytes before comm_wait", where);
        check(all_ff(g, 64 * 4), what);
        if (write && !strcmp(write, "allreduce") && dev) buf_put(dev, a + 5, &junk, 4);
        comm_wait(r);
        buf_get(dev, g, a, 64 * 4);
        int good = 1;
        for (int i = 0; i < 64; i++) {
            float want = 0;
            for (int q = 0; q < P; q++) want += val(q, i);
            good &= g[i] == want;
        }
        snprintf(what, sizeof what, "checked iallreduce, %s buffer: the sums after comm_wait", where);
        check(good, what);

        // ireduce_scatter, uneven counts: send unchanged, recv 0xFF until comm_wait
        size_t counts[64], total = 0, off = 0;
        for (int q = 0; q < P; q++) counts[q] = q + 2, total += counts[q];
        for (int q = 0; q < rank; q++) off += counts[q];
        float *s = buf_alloc(dev, total * 4), *rv = buf_alloc(dev, counts[rank] * 4);
        for (size_t i = 0; i < total; i++) h[i] = val(rank, (int)i);
        buf_put(dev, s, h, total * 4);
        r = comm_ireduce_scatter(w, s, rv, counts, COMM_F32);
        buf_get(dev, g, rv, counts[rank] * 4);
        snprintf(what, sizeof what, "checked ireduce_scatter, %s buffers: the receive buffer 0xFF before comm_wait", where);
        check(all_ff(g, counts[rank] * 4), what);
        if (write && !strcmp(write, "rs-send") && dev) buf_put(dev, s + total - 1, &junk, 4);
        if (write && !strcmp(write, "rs-recv") && !dev) buf_put(dev, rv, &junk, 4);
        comm_wait(r);
        buf_get(dev, g, rv, counts[rank] * 4);
        good = 1;
        for (size_t i = 0; i < counts[rank]; i++) {
            float want = 0;
            for (int q = 0; q < P; q++) want += val(q, (int)(off + i));
            good &= g[i] == want;
        }
        snprintf(what, sizeof what, "checked ireduce_scatter, %s buffers: the sums of the shard after comm_wait", where);
        check(good, what);

        // isend / irecv around the ring (tags count per pair, as the pipeline's)
        float *sb = buf_alloc(dev, 64 * 4), *rb = buf_alloc(dev, 64 * 4);
        for (int i = 0; i < 64; i++) h[i] = val(rank, 500 + i);
        buf_put(dev, sb, h, 64 * 4);
        CommReq *rr = comm_irecv(w, rb, 64, COMM_F32, prev, 20 + dev);
        CommReq *sr = comm_isend(w, sb, 64, COMM_F32, next, 20 + dev);
        buf_get(dev, g, rb, 64 * 4);
        snprintf(what, sizeof what, "checked irecv, %s buffer: 0xFF bytes before completion", where);
        check(all_ff(g, 64 * 4), what);
        if (write && !strcmp(write, "send") && !dev) buf_put(dev, sb + 63, &junk, 4);
        if (write && !strcmp(write, "recv") && dev) buf_put(dev, rb, &junk, 4);
        while (!comm_test(&rr)) {
        }
        comm_wait(sr);
        buf_get(dev, g, rb, 64 * 4);
        good = 1;
        for (int i = 0; i < 64; i++) good &= g[i] == val(prev, 500 + i);
        snprintf(what, sizeof what, "checked isend / irecv, %s buffers: the sender's values at completion", where);
        check(good, what);
    }
    comm_barrier(w);
    printf("rank %d: %d failed\n", rank, fails);
    comm_finalize();
    return fails ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "check")) setenv("MOECORE_COMM_CHECK", "1", 1);
    Comm *w = comm_init(&argc, &argv);
    rank = comm_rank(w), P = comm_size(w);
    arena = mmap(NULL, ARENA, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (arena == MAP_FAILED) { perror("mmap"); return 2; }
    if (argc > 1 && !strcmp(argv[1], "check")) {
        comm_stage_device(&hooks);
        setvbuf(stdout, NULL, _IOLBF, 0);
        return run_check(w, argc > 2 ? argv[2] : NULL);
    }
    int stage = !(argc > 1 && !strcmp(argv[1], "nostage"));
    if (stage) comm_stage_device(&hooks);
    check(comm_stages_device() == stage, "comm_stages_device says whether the hooks are set");
    setvbuf(stdout, NULL, _IOLBF, 0);

    // allreduce, F32, 1000 values
    enum { N = 1000 };
    float h[4096], g[4096];
    float *d = dev_alloc(N * 4);
    for (int i = 0; i < N; i++) h[i] = val(rank, i);
    dev_put(d, h, N * 4);
    int th = n_to_host;
    comm_allreduce(w, d, N, COMM_F32);
    dev_get(g, d, N * 4);
    int good = 1;
    for (int i = 0; i < N; i++) {
        float want = 0;
        for (int r = 0; r < P; r++) want += val(r, i);
        good &= g[i] == want;
    }
    check(good, "allreduce of a device buffer");
    check(n_to_host == th + 1, "allreduce: one copy out");

    // a host buffer is not staged
    double x = rank + 1;
    th = n_to_host;
    comm_allreduce(w, &x, 1, COMM_F64);
    check(x == P * (P + 1) / 2.0 && n_to_host == th, "allreduce of a host buffer: summed, not staged");

    // iallreduce: complete when it returns
    double *dd = dev_alloc(8 * 3), hd[3] = {rank, 2.0 * rank, -1}, gd[3];
    dev_put(dd, hd, sizeof hd);
    CommReq *r = comm_iallreduce(w, dd, 3, COMM_F64);
    dev_get(gd, dd, sizeof gd);
    double s = P * (P - 1) / 2.0;
    check(gd[0] == s && gd[1] == 2 * s && gd[2] == -P, "iallreduce of a device buffer: the sums before comm_wait");
    comm_wait(r);

    // reduce_scatter with uneven counts (rank q gets q + 2 values)
    size_t counts[64], total = 0;
    for (int q = 0; q < P; q++) counts[q] = q + 2, total += counts[q];
    float *ds = dev_alloc(total * 4), *dr = dev_alloc(counts[rank] * 4);
    for (size_t i = 0; i < total; i++) h[i] = val(rank, (int)i);
    dev_put(ds, h, total * 4);
    comm_wait(comm_ireduce_scatter(w, ds, dr, counts, COMM_F32));
    dev_get(g, dr, counts[rank] * 4);
    size_t off = 0;
    for (int q = 0; q < rank; q++) off += counts[q];
    good = 1;
    for (size_t i = 0; i < counts[rank]; i++) {
        float want = 0;
        for (int q = 0; q < P; q++) want += val(q, (int)(off + i));
        good &= g[i] == want;
    }
    check(good, "reduce_scatter, device send and receive, uneven counts");

    // all_gather in place, uneven counts
    float *da = dev_alloc(total * 4);
    for (size_t i = 0; i < total; i++) h[i] = -1;
    for (size_t i = 0; i < counts[rank]; i++) h[off + i] = val(rank, (int)i);
    dev_put(da, h, total * 4);
    comm_all_gather(w, da, counts, COMM_F32);
    dev_get(g, da, total * 4);
    good = 1;
    for (int q = 0, o = 0; q < P; o += (int)counts[q], q++)
        for (size_t i = 0; i < counts[q]; i++) good &= g[o + i] == val(q, (int)i);
    check(good, "all_gather in place on a device buffer, uneven counts");

    // all_to_all_v of 12-byte rows: rank a sends a + b + 1 rows to rank b
    size_t sc[64], rc[64], ns = 0, nr = 0;
    for (int q = 0; q < P; q++) sc[q] = rank + q + 1, rc[q] = q + rank + 1, ns += sc[q], nr += rc[q];
    float *dts = dev_alloc(ns * 12), *dtr = dev_alloc(nr * 12);
    for (int q = 0, o = 0; q < P; q++)
        for (size_t i = 0; i < sc[q]; i++, o++)
            for (int j = 0; j < 3; j++) h[3 * o + j] = val(rank, 100 * q + 3 * (int)i + j);
    dev_put(dts, h, ns * 12);
    comm_all_to_all_v(w, dts, sc, dtr, rc, 12);
    dev_get(g, dtr, nr * 12);
    good = 1;
    for (int q = 0, o = 0; q < P; q++)
        for (size_t i = 0; i < rc[q]; i++, o++)
            for (int j = 0; j < 3; j++) good &= g[3 * o + j] == val(q, 100 * rank + 3 * (int)i + j);
    check(good, "all_to_all_v of device rows, uneven counts");

    // send / recv around the ring
    int next = (rank + 1) % P, prev = (rank + P - 1) % P;
    float *dsend = dev_alloc(64 * 4), *drecv = dev_alloc(64 * 4);
    for (int i = 0; i < 64; i++) h[i] = val(rank, i);
    dev_put(dsend, h, 64 * 4);
    if (rank % 2 == 0) {
        comm_send(w, dsend, 64, COMM_F32, next, 7);
        comm_recv(w, drecv, 64, COMM_F32, prev, 7);
    } else {
        comm_recv(w, drecv, 64, COMM_F32, prev, 7);
        comm_send(w, dsend, 64, COMM_F32, next, 7);
    }
    dev_get(g, drecv, 64 * 4);
    good = 1;
    for (int i = 0; i < 64; i++) good &= g[i] == val(prev, i);
    check(good, "send / recv of device buffers around the ring");

    // isend / irecv: the send reads the buffer when it is called; the
    // receive reaches the device buffer at completion, not before
    float sentinel[64];
    for (int i = 0; i < 64; i++) sentinel[i] = -7;
    dev_put(drecv, sentinel, 64 * 4);
    CommReq *rr = comm_irecv(w, drecv, 64, COMM_F32, prev, 9);
    CommReq *sr = comm_isend(w, dsend, 64, COMM_F32, next, 9);
    for (int i = 0; i < 64; i++) h[i] = -1;
    dev_put(dsend, h, 64 * 4); // overwritten before the send completes
    comm_barrier(w);
    dev_get(g, drecv, 64 * 4);
    check(!memcmp(g, sentinel, sizeof sentinel), "irecv: the device buffer is untouched before comm_wait / comm_test");
    while (!comm_test(&rr)) {
    }
    check(rr == NULL, "comm_test frees a completed request");
    comm_wait(sr);
    dev_get(g, drecv, 64 * 4);
    good = 1;
    for (int i = 0; i < 64; i++) good &= g[i] == val(prev, i);
    check(good, "isend / irecv of device buffers: the values at isend, delivered at completion");

    // comm_p2p_group: a send to next and a receive from prev in one group
    // (the pipeline's slot), then the reverse direction with tags swapped
    float *dback = dev_alloc(64 * 4);
    for (int i = 0; i < 64; i++) h[i] = val(rank, 1000 + i);
    dev_put(dsend, h, 64 * 4);
    dev_put(drecv, sentinel, 64 * 4);
    CommP2P ops[2] = {{.buf = dsend, .n = 64, .type = COMM_F32, .peer = next, .tag = 11},
                      {.buf = drecv, .n = 64, .type = COMM_F32, .peer = prev, .tag = 11, .recv = 1}};
    comm_p2p_group(w, ops, 2);
    comm_wait(ops[1].req);
    comm_wait(ops[0].req);
    dev_get(g, drecv, 64 * 4);
    CommP2P back[2] = {{.buf = dback, .n = 64, .type = COMM_F32, .peer = next, .tag = 12, .recv = 1},
                       {.buf = drecv, .n = 64, .type = COMM_F32, .peer = prev, .tag = 12}};
    comm_p2p_group(w, back, 2);
    comm_wait(back[0].req);
    comm_wait(back[1].req);
    good = 1;
    for (int i = 0; i < 64; i++) good &= g[i] == val(prev, 1000 + i);
    dev_get(g, dback, 64 * 4);
    for (int i = 0; i < 64; i++) good &= g[i] == val(rank, 1000 + i);
    check(good, "comm_p2p_group: a send and a receive of device buffers in one group, both directions");

    // broadcast from the last rank
    float *db = dev_alloc(10 * 4);
    for (int i = 0; i < 10; i++) h[i] = val(rank, i);
    dev_put(db, h, 40);
    comm_broadcast(w, db, 10, COMM_F32, P - 1);
    dev_get(g, db, 40);
    good = 1;
    for (int i = 0; i < 10; i++) good &= g[i] == val(P - 1, i);
    check(good, "broadcast of a device buffer");

    // a one-rank group (the last rank alone): reduce_scatter and
    // all_to_all_v copy device to device through the copy hook
    Comm *one = comm_split(w, rank == P - 1, rank);
    if (comm_size(one) == 1) {
        size_t c1[1] = {5};
        float *a = dev_alloc(24), *b = dev_alloc(20);
        for (int i = 0; i < 6; i++) h[i] = val(rank, i);
        dev_put(a, h, 24);
        int nc = n_copy;
        comm_reduce_scatter(one, a, b, c1, COMM_F32);
        dev_get(g, b, 20);
        check(!memcmp(g, h, 20) && n_copy == nc + 1, "a one-rank group's reduce_scatter copies device to device");
        float *t = dev_alloc(24);
        comm_all_to_all_v(one, a, (size_t[1]){2}, t, (size_t[1]){2}, 12);
        dev_get(g, t, 24);
        check(!memcmp(g, h, 24), "a one-rank group's all_to_all_v copies device to device");
    } else {
        // the group of the others works on device buffers like the world
        float *a = dev_alloc(4);
        float one_v = 1;
        dev_put(a, &one_v, 4);
        comm_allreduce(one, a, 1, COMM_F32);
        dev_get(g, a, 4);
        check(g[0] == comm_size(one), "a split group stages device buffers too");
    }
    comm_free(one);

    comm_barrier(w);
    printf("rank %d: %d failed\n", rank, fails);
    comm_finalize();
    return fails ? 1 : 0;
}
