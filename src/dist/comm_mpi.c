// Comm over MPI (Open MPI), with a no-MPI path for one-rank groups, and
// device buffers staged through the host where comm_stage_device asked.
#include "dist/comm_impl.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/check.h"

static int use_mpi = 0;
static Comm world = {0, 0, 1, NULL};

int comm_mpi_active(void) { return use_mpi; }
int comm_is_nccl(const Comm *c) { return c && c->nccl; }

// ---- device buffers staged through the host (comm.h) ----------------------------------

static const CommDeviceCopy *dc;
void comm_stage_device(const CommDeviceCopy *d) { dc = d; }
int comm_stages_device(void) { return dc != NULL; }
static int staged(const void *p) { return dc && p && dc->on_device(p); }
// The host view of bytes at p: p itself, or a new host copy of the device
// memory (its contents copied when in).
static void *host_in(const void *p, size_t bytes, int in) {
    if (!staged(p)) return (void *)p;
    void *h = mallocCheck(bytes ? bytes : 1);
    if (in && bytes) dc->to_host(h, p, bytes);
    return h;
}
// Ends a host view: its bytes back to the device when out, the copy freed.
static void host_out(void *h, void *p, size_t bytes, int out) {
    if (h == p) return;
    if (out && bytes) dc->to_device(p, h, bytes);
    free(h);
}
// memmove for a one-rank group, whose buffers may be device memory
static void move(void *dst, const void *src, size_t bytes) {
    if (staged(dst) || staged(src)) dc->copy(dst, src, bytes);
    else memmove(dst, src, bytes);
}
static CommReq *new_req(const char *op) {
    CommReq *r = calloc(1, sizeof(CommReq));
    if (!r) {
        fprintf(stderr, "moecore: out of host memory for a communication request\n");
        comm_abort(3);
    }
    r->tmp_type = MPI_DATATYPE_NULL;
    r->op = op;
    return r;
}

// ---- MOECORE_COMM_CHECK: the non-blocking calls' contract, checked (comm.h) ------------
// Over NCCL a non-blocking call reads its input and writes its output on the
// communication stream at a time of its own between the call and comm_wait /
// comm_test; over MPI on the host (no progress thread) the work mostly happens
// inside MPI_Wait, and in the staged mode before the call returns, so a caller
// that writes a buffer too early, or reads a result too early, passes on CPU
// ranks and corrupts the GPU run. With the check on, each non-blocking call
// works on host copies taken at the call (as NCCL reads in stream order), fills
// its receive (and in-place) buffers with 0xFF bytes (NaN in floats) until it
// completes, and on completion ends the job with a message if the caller wrote
// any of its buffers in between.
static int check_mode = -1;
static int comm_check(void) {
    if (check_mode < 0) {
        const char *e = getenv("MOECORE_COMM_CHECK");
        check_mode = e && *e && strcmp(e, "0") != 0;
    }
    return check_mode;
}
// A new host copy of bytes at p (host or device memory).
static void *copy_in(const void *p, size_t bytes) {
    void *h = mallocCheck(bytes ? bytes : 1);
    if (!bytes) return h;
    if (staged(p)) dc->to_host(h, p, bytes);
    else memcpy(h, p, bytes);
    return h;
}
// bytes of host memory h to p (host or device memory)
static void copy_out(void *p, const void *h, size_t bytes) {
    if (!bytes) return;
    if (staged(p)) dc->to_device(p, h, bytes);
    else memcpy(p, h, bytes);
}
// buf must hold want (taken over) when the request completes
static void guard(CommReq *r, const void *buf, void *want, size_t bytes, const char *what) {
    r->guard[r->n_guard].buf = buf;
    r->guard[r->n_guard].want = want;
    r->guard[r->n_guard].bytes = bytes;
    r->guard[r->n_guard++].what = what;
}
// buf must keep its bytes of now until the request completes
static void guard_unchanged(CommReq *r, const void *buf, size_t bytes, const char *what) {
    guard(r, buf, copy_in(buf, bytes), bytes, what);
}
// buf holds 0xFF bytes until the request completes, and must still then
static void guard_poison(CommReq *r, void *buf, size_t bytes, const char *what) {
    void *p = mallocCheck(bytes ? bytes : 1);
    memset(p, 0xff, bytes);
    copy_out(buf, p, bytes);
    guard(r, buf, p, bytes, what);
}
static void check_guards(CommReq *r) {
    for (int i = 0; i < r->n_guard; i++) {
        size_t n = r->guard[i].bytes, at = 0;
        unsigned char *now = copy_in(r->guard[i].buf, n), *want = r->guard[i].want;
        while (at < n && now[at] == want[at]) at++;
        free(now);
        if (at < n) {
            fprintf(stderr,
                    "moecore: MOECORE_COMM_CHECK: the %s of a non-blocking %s (%zu bytes at %p) was written between "
                    "the call and its comm_wait / comm_test (first changed byte: %zu); over NCCL that write races "
                    "the communication (src/dist/comm.h)\n",
                    r->guard[i].what, r->op, n, r->guard[i].buf, at);
            comm_abort(3);
        }
        free(want);
    }
    r->n_guard = 0;
}

// What completes a request besides MPI's part: the guards are checked, a
// staged or checked receive's bytes reach their buffer, host copies are freed.
static void req_finish(CommReq *r) {
    if (r->tmp_type != MPI_DATATYPE_NULL) MPI_Type_free(&r->tmp_type);
    check_guards(r);
    if (r->out) copy_out(r->out, r->host, r->bytes);
    free(r->host);
    free(r->send_copy);
    free(r->ints);
    free(r);
}

#ifndef MOECORE_CUDA
Comm *comm_mpi_device_world(const LaunchInfo *li, char *err, size_t errlen) {
    (void)li;
    errorf(err, errlen, "GPU ranks over MPI need the CUDA backend, which is not compiled into this build");
    return NULL;
}
Comm *comm_nccl_world(const LaunchInfo *li, double timeout_s, char *err, size_t errlen) {
    (void)li, (void)timeout_s;
    errorf(err, errlen, "NCCL needs the CUDA backend, which is not compiled into this build (nvcc was not found when it was built)");
    return NULL;
}
const char *comm_nccl_describe(void) { return ""; }
void comm_set_name(Comm *c, const char *name) { (void)c, (void)name; }
#endif

static void mpi_fail(int rc, const char *call, const char *file, int line) {
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fprintf(stderr, "moecore: MPI error in %s at %s:%d: %s\n", call, file, line, msg);
    MPI_Abort(MPI_COMM_WORLD, 3);
    exit(3);
}
#define MPI_CHECK(call) do { int rc_ = (call); if (rc_ != MPI_SUCCESS) mpi_fail(rc_, #call, __FILE__, __LINE__); } while (0)

static int launched_by_mpi(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE", NULL};
    for (int i = 0; vars[i]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

Comm *comm_init(int *argc, char ***argv) {
    if (!launched_by_mpi()) return &world;
    MPI_CHECK(MPI_Init(argc, argv));
    use_mpi = 1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    world.mpi = MPI_COMM_WORLD;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world.rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world.size));
    return &world;
}

void comm_finalize(void) {
#ifdef MOECORE_CUDA
    nccl_shutdown();
#endif
    if (use_mpi) MPI_Finalize();
    use_mpi = 0;
}

Comm *comm_world(void) { return &world; }
int comm_rank(const Comm *c) { return c->rank; }
int comm_size(const Comm *c) { return c->size; }
int comm_is_mpi(void) { return use_mpi; }

Comm *comm_split(Comm *parent, int color, int key) {
#ifdef MOECORE_CUDA
    if (parent->nccl) return nccl_split(parent, color, key);
#endif
    Comm *c = mallocCheck(sizeof(Comm));
    if (parent->size == 1 || !use_mpi) {
        c->rank = 0;
        c->size = 1;
        return c;
    }
    MPI_CHECK(MPI_Comm_split(parent->mpi, color, key, &c->mpi));
    MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
    MPI_CHECK(MPI_Comm_rank(c->mpi, &c->rank));
    MPI_CHECK(MPI_Comm_size(c->mpi, &c->size));
    return c;
}

void comm_free(Comm *c) {
#ifdef MOECORE_CUDA
    if (c && c->nccl) { nccl_free(c); return; }
#endif
    if (!c || c == &world) return;
    if (c->size > 1) MPI_Comm_free(&c->mpi);
    free(c);
}

static MPI_Datatype mpi_type(CommType t) {
    switch (t) {
    case COMM_F32: return MPI_FLOAT;
    case COMM_F64: return MPI_DOUBLE;
    case COMM_I32: return MPI_INT;
    case COMM_I64: return MPI_INT64_T;
    default: return MPI_BYTE;
    }
}
size_t comm_type_size(CommType t) {
    switch (t) {
    case COMM_F32: case COMM_I32: return 4;
    case COMM_F64: case COMM_I64: return 8;
    default: return 1;
    }
}
static int as_int(size_t n, const char *what) {
    if (n > INT_MAX) {
        fprintf(stderr, "moecore: %s: %zu elements exceed MPI's int count\n", what, n);
        comm_abort(3);
    }
    return (int)n;
}

void comm_allreduce(Comm *c, void *buf, size_t n, CommType t) {
#ifdef MOECORE_CUDA
    if (c->nccl) { nccl_allreduce(c, buf, n, t); return; }
#endif
    if (c->size == 1) return;
    size_t bytes = n * comm_type_size(t);
    char *h = host_in(buf, bytes, 1);
    // chunks keep each count within int
    for (size_t off = 0; off < n; off += (size_t)1 << 30) {
        size_t m = n - off < ((size_t)1 << 30) ? n - off : (size_t)1 << 30;
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, h + off * comm_type_size(t), (int)m, mpi_type(t), MPI_SUM, c->mpi));
    }
    host_out(h, buf, bytes, 1);
}

CommReq *comm_iallreduce(Comm *c, void *buf, size_t n, CommType t) {
#ifdef MOECORE_CUDA
    if (c->nccl) return nccl_iallreduce(c, buf, n, t);
#endif
    if (c->size == 1) return NULL;
    if (comm_check()) { // on a copy of buf taken now; buf holds 0xFF bytes until completion
        size_t bytes = n * comm_type_size(t);
        CommReq *r = new_req("all-reduce");
        r->host = copy_in(buf, bytes), r->out = buf, r->bytes = bytes;
        guard_poison(r, buf, bytes, "in-place buffer");
        MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, r->host, as_int(n, "iallreduce"), mpi_type(t), MPI_SUM, c->mpi,
                                 &r->req));
        return r;
    }
    if (staged(buf)) { // completes here
        comm_allreduce(c, buf, n, t);
        return NULL;
    }
    CommReq *r = new_req("all-reduce");
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, as_int(n, "iallreduce"), mpi_type(t), MPI_SUM, c->mpi, &r->req));
    return r;
}

static int *int_counts(const Comm *c, const size_t *counts, const char *what) {
    int *ic = mallocCheck(c->size * sizeof(int));
    for (int i = 0; i < c->size; i++) ic[i] = as_int(counts[i], what);
    return ic;
}

void comm_reduce_scatter(Comm *c, const void *send, void *recv, const size_t *counts, CommType t) {
    comm_wait(comm_ireduce_scatter(c, send, recv, counts, t));
}

CommReq *comm_ireduce_scatter(Comm *c, const void *send, void *recv, const size_t *counts, CommType t) {
#ifdef MOECORE_CUDA
    if (c->nccl) return nccl_ireduce_scatter(c, send, recv, counts, t);
#endif
    size_t es = comm_type_size(t);
    if (c->size == 1) {
        if (send != recv) move(recv, send, counts[0] * es);
        return NULL;
    }
    CommReq *r = new_req("reduce-scatter");
    r->ints = int_counts(c, counts, "reduce_scatter");
    if (comm_check()) { // on a copy of send taken now; recv holds 0xFF bytes until completion
        size_t total = 0;
        for (int i = 0; i < c->size; i++) total += counts[i];
        size_t sb = total * es, rb = counts[c->rank] * es;
        const char *s0 = send, *r0 = recv;
        r->send_copy = copy_in(send, sb);
        r->host = mallocCheck(rb ? rb : 1), r->out = recv, r->bytes = rb;
        if (r0 + rb <= s0 || s0 + sb <= r0) guard_unchanged(r, send, sb, "send buffer"); // not in place
        guard_poison(r, recv, rb, "receive buffer");
        MPI_CHECK(MPI_Ireduce_scatter(r->send_copy, r->host, r->ints, mpi_type(t), MPI_SUM, c->mpi, &r->req));
        return r;
    }
    if (staged(send) || staged(recv)) { // completes here
        size_t total = 0;
        for (int i = 0; i < c->size; i++) total += counts[i];
        void *hs = host_in(send, total * es, 1), *hr = host_in(recv, counts[c->rank] * es, 0);
        MPI_CHECK(MPI_Reduce_scatter(hs, hr, r->ints, mpi_type(t), MPI_SUM, c->mpi));
        host_out(hr, recv, counts[c->rank] * es, 1);
        host_out(hs, (void *)send, total * es, 0);
        req_finish(r);
        return NULL;
    }
    MPI_CHECK(MPI_Ireduce_scatter(send, recv, r->ints, mpi_type(t), MPI_SUM, c->mpi, &r->req));
    return r;
}

void comm_all_gather(Comm *c, void *buf, const size_t *counts, CommType t) {
#ifdef MOECORE_CUDA
    if (c->nccl) { nccl_all_gather(c, buf, counts, t); return; }
#endif
    if (c->size == 1) return;
    int *ic = int_counts(c, counts, "all_gather");
    int *displ = mallocCheck(c->size * sizeof(int));
    size_t d = 0;
    for (int i = 0; i < c->size; i++) { displ[i] = as_int(d, "all_gather"); d += counts[i]; }
    void *h = host_in(buf, d * comm_type_size(t), 1);
    MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, h, ic, displ, mpi_type(t), c->mpi));
    host_out(h, buf, d * comm_type_size(t), 1);
    free(ic);
    free(displ);
}

void comm_all_to_all_v(Comm *c, const void *send, const size_t *send_counts, void *recv,
                       const size_t *recv_counts, size_t elem_bytes) {
#ifdef MOECORE_CUDA
    if (c->nccl) { nccl_all_to_all_v(c, send, send_counts, recv, recv_counts, elem_bytes); return; }
#endif
    if (c->size == 1) {
        if (send_counts[0] && send != recv) move(recv, send, send_counts[0] * elem_bytes);
        return;
    }
    MPI_Datatype row;
    MPI_CHECK(MPI_Type_contiguous(as_int(elem_bytes, "all_to_all_v row"), MPI_BYTE, &row));
    MPI_CHECK(MPI_Type_commit(&row));
    int *sc = int_counts(c, send_counts, "all_to_all_v"), *rc = int_counts(c, recv_counts, "all_to_all_v");
    int *sd = mallocCheck(c->size * sizeof(int)), *rd = mallocCheck(c->size * sizeof(int));
    size_t s = 0, q = 0;
    for (int i = 0; i < c->size; i++) {
        sd[i] = as_int(s, "all_to_all_v");
        rd[i] = as_int(q, "all_to_all_v");
        s += send_counts[i];
        q += recv_counts[i];
    }
    void *hs = host_in(send, s * elem_bytes, 1), *hr = host_in(recv, q * elem_bytes, 0);
    MPI_CHECK(MPI_Alltoallv(hs, sc, sd, row, hr, rc, rd, row, c->mpi));
    host_out(hr, recv, q * elem_bytes, 1);
    host_out(hs, (void *)send, s * elem_bytes, 0);
    MPI_Type_free(&row);
    free(sc); free(rc); free(sd); free(rd);
}

void comm_send(Comm *c, const void *buf, size_t n, CommType t, int dst, int tag) {
#ifdef MOECORE_CUDA
    if (c->nccl) { nccl_send(c, buf, n, t, dst); return; }
#endif
    void *h = host_in(buf, n * comm_type_size(t), 1);
    MPI_CHECK(MPI_Send(h, as_int(n, "send"), mpi_type(t), dst, tag, c->mpi));
    host_out(h, (void *)buf, n * comm_type_size(t), 0);
}

void comm_recv(Comm *c, void *buf, size_t n, CommType t, int src, int tag) {
#ifdef MOECORE_CUDA
    if (c->nccl) { nccl_recv(c, buf, n, t, src); return; }
#endif
    void *h = host_in(buf, n * comm_type_size(t), 0);
    MPI_CHECK(MPI_Recv(h, as_int(n, "recv"), mpi_type(t), src, tag, c->mpi, MPI_STATUS_IGNORE));
    host_out(h, buf, n * comm_type_size(t), 1);
}

CommReq *comm_isend(Comm *c, const void *buf, size_t n, CommType t, int dst, int tag) {
#ifdef MOECORE_CUDA
    if (c->nccl) return nccl_isend(c, buf, n, t, dst);
#endif
    CommReq *r = new_req("send");
    if (comm_check()) { // from a copy of buf taken now, which buf must keep until completion
        size_t bytes = n * comm_type_size(t);
        r->host = copy_in(buf, bytes);
        guard_unchanged(r, buf, bytes, "send buffer");
        MPI_CHECK(MPI_Isend(r->host, as_int(n, "isend"), mpi_type(t), dst, tag, c->mpi, &r->req));
        return r;
    }
    void *h = host_in(buf, n * comm_type_size(t), 1); // the send reads the host copy
    if (h != buf) r->host = h;
    MPI_CHECK(MPI_Isend(h, as_int(n, "isend"), mpi_type(t), dst, tag, c->mpi, &r->req));
    return r;
}

CommReq *comm_irecv(Comm *c, void *buf, size_t n, CommType t, int src, int tag) {
#ifdef MOECORE_CUDA
    if (c->nccl) return nccl_irecv(c, buf, n, t, src);
#endif
    CommReq *r = new_req("receive");
    if (comm_check()) { // into a host copy; buf holds 0xFF bytes until completion
        size_t bytes = n * comm_type_size(t);
        r->host = mallocCheck(bytes ? bytes : 1), r->out = buf, r->bytes = bytes;
        guard_poison(r, buf, bytes, "receive buffer");
        MPI_CHECK(MPI_Irecv(r->host, as_int(n, "irecv"), mpi_type(t), src, tag, c->mpi, &r->req));
        return r;
    }
    void *h = host_in(buf, n * comm_type_size(t), 0); // copied to the device on completion
    if (h != buf) r->host = h, r->out = buf, r->bytes = n * comm_type_size(t);
    MPI_CHECK(MPI_Irecv(h, as_int(n, "irecv"), mpi_type(t), src, tag, c->mpi, &r->req));
    return r;
}

void comm_p2p_group(Comm *c, CommP2P *ops, int n_ops) {
#ifdef MOECORE_CUDA
    if (c->nccl) { nccl_p2p_group(c, ops, n_ops); return; }
#endif
    for (int i = 0; i < n_ops; i++)
        ops[i].req = ops[i].recv ? comm_irecv(c, ops[i].buf, ops[i].n, ops[i].type, ops[i].peer, ops[i].tag)
                                 : comm_isend(c, ops[i].buf, ops[i].n, ops[i].type, ops[i].peer, ops[i].tag);
}

void comm_broadcast(Comm *c, void *buf, size_t n, CommType t, int root) {
#ifdef MOECORE_CUDA
    if (c->nccl) { nccl_broadcast(c, buf, n, t, root); return; }
#endif
    if (c->size == 1) return;
    void *h = host_in(buf, n * comm_type_size(t), c->rank == root);
    MPI_CHECK(MPI_Bcast(h, as_int(n, "broadcast"), mpi_type(t), root, c->mpi));
    host_out(h, buf, n * comm_type_size(t), 1);
}

void comm_barrier(Comm *c) {
#ifdef MOECORE_CUDA
    if (c->nccl) { nccl_barrier(c); return; }
#endif
    if (c->size > 1) MPI_CHECK(MPI_Barrier(c->mpi));
}

void comm_wait(CommReq *r) {
    if (!r) return;
#ifdef MOECORE_CUDA
    if (r->nccl) { nccl_wait(r); return; }
#endif
    MPI_CHECK(MPI_Wait(&r->req, MPI_STATUS_IGNORE));
    req_finish(r);
}

int comm_test(CommReq **r) {
    if (!*r) return 1;
#ifdef MOECORE_CUDA
    if ((*r)->nccl) { nccl_wait(*r); *r = NULL; return 1; }
#endif
    int done = 0;
    MPI_CHECK(MPI_Test(&(*r)->req, &done, MPI_STATUS_IGNORE));
    if (!done) return 0;
    req_finish(*r);
    *r = NULL;
    return 1;
}

void comm_abort(int code) {
    fflush(stdout);
    fflush(stderr);
    if (use_mpi) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}
