// Comm over NCCL for device buffers (comm.h, DESIGN.md §6), CUDA builds only.
//
// Streams. A "blocking" call is enqueued on the compute stream
// (cuda_stream()), so it is ordered with the kernels around it and the host
// does not wait. A non-blocking call (DDP's buckets) records an event on the
// compute stream, makes the communication stream wait for it and runs
// there; comm_wait makes the compute stream wait for the call's done event.
// Host buffers (the step's scalars, the expert-parallel counts) are copied
// to a device staging buffer, reduced there and copied back, and the call
// returns after a stream synchronisation: those are the host waits the
// caller asked for by passing host memory.
//
// Variable-count collectives are NCCL groups: reduce_scatter with counts is
// one ncclReduce per rank, the in-place all_gather one ncclBroadcast per
// rank, all_to_all_v one ncclSend + ncclRecv per peer.
//
// Failure. Every NCCL and CUDA call is checked (the call, file and line,
// then the job ends). A watchdog thread follows every enqueued collective
// (and symmetric-memory barrier) through an event recorded after it, and
// every NCCL call the host is inside (communicator set-up and splits,
// window registration, the lazy connection a first collective may make);
// one that has not completed after timeout_s, or a NCCL asynchronous error
// on any communicator, makes it print what and where, abort every
// communicator (ncclCommAbort, which also frees kernels stuck waiting for a
// dead peer) and end the job, within a grace period even where the abort
// itself blocks (a barrier kernel spinning on a dead peer cannot be
// stopped).
#include "dist/comm_impl.h"
#ifdef MOECORE_CUDA
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist/launch.h"
#include "dist/nccl_api.h"
#include "util/check.h"
#include "util/clock.h"

cudaStream_t cuda_stream(void); // ops_cuda.cu: the CUDA backend's stream

#define FAIL_NULL(err, errlen, ...) do { errorf(err, errlen, __VA_ARGS__); return NULL; } while (0)
#define MAX_COMMS 64
#define WATCH_SLOTS 4096
#define STAGE_MIN (1 << 20)

struct NcclComm {
    ncclComm_t comm;
    char name[24];
};
struct NcclReq {
    int slot;  // its done event: ev_pool[slot], back to the pool on wait
};

static const NcclApi *api;
static int device = -1, world_rank = 0;
static double timeout_s = 600;
static cudaStream_t comm_stream;
static Comm *comms[MAX_COMMS];  // every live NCCL Comm (abort walks them)
static int n_comms;
static char *stage;             // device staging buffer for host buffers
static size_t stage_bytes;
static char describe[700];

// events: a pool for requests, grown while the first step finds out how
// many it keeps in flight (DDP's buckets), reused after
static cudaEvent_t *ev_pool;
static int *ev_free, n_ev_free, n_ev;
static cudaEvent_t fork_ev;

// watchdog: a ring of enqueued collectives and the event after each
typedef struct {
    cudaEvent_t ev;
    double t0;
    const char *op;
    const Comm *comm;
} Watch;
static Watch ring[WATCH_SLOTS];
static cudaEvent_t ring_ev[WATCH_SLOTS];
static int ring_head, ring_len;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t watchdog;
static int watchdog_on, watchdog_stop;

// The NCCL call the host is inside (op NULL: none) and since when: a call
// that blocks on a peer (a split, a registration, a first collective's
// connection) is watched as an enqueued collective is.
static const char *host_op;
static double host_t0;
void nccl_host_enter(const char *op) {
    pthread_mutex_lock(&lock);
    host_op = op, host_t0 = clock_now_s();
    pthread_mutex_unlock(&lock);
}
void nccl_host_leave(void) {
    pthread_mutex_lock(&lock);
    host_op = NULL;
    pthread_mutex_unlock(&lock);
}

static void nccl_die(const char *msg, const char *call, const char *file, int line) {
    fprintf(stderr, "moecore: rank %d: NCCL error in %s at %s:%d: %s\n", world_rank, call, file, line, msg);
    comm_abort(3);
}
#define NCCL_CHECK(call)                                                                              \
    do {                                                                                              \
        nccl_host_enter(#call);                                                                       \
        ncclResult_t r_ = (call);                                                                     \
        nccl_host_leave();                                                                            \
        if (r_ != ncclSuccess) nccl_die(api->ncclGetErrorString(r_), #call, __FILE__, __LINE__);     \
    } while (0)
#define CU_CHECK(call)                                                                                \
    do {                                                                                              \
        cudaError_t e_ = (call);                                                                      \
        if (e_ != cudaSuccess) nccl_die(cudaGetErrorString(e_), #call, __FILE__, __LINE__);           \
    } while (0)

static ncclDataType_t nccl_type(CommType t) {
    switch (t) {
    case COMM_F32: return ncclFloat32;
    case COMM_F64: return ncclFloat64;
    case COMM_I32: return ncclInt32;
    case COMM_I64: return ncclInt64;
    default: return ncclUint8;
    }
}

static ncclComm_t nc(const Comm *c) { return c->nccl->comm; }
void *nccl_handle(Comm *c) { return nc(c); }

// ---- the watchdog -------------------------------------------------------------

// Set before the communicators are aborted: the main thread, freed from a
// stuck wait by the abort, may reach exit() before the watchdog's _exit(3);
// this makes that exit the job's failure too.
static volatile int aborting;
static void exit_if_aborting(void) {
    if (aborting) _exit(3);
}

// Ends the process ABORT_GRACE_S after an abort began, whatever the abort
// is stuck in (ncclCommAbort waits for the device, which a kernel spinning on
// a dead peer never frees; MPI_Abort may wait on the launcher).
#define ABORT_GRACE_S 20
static void *abort_deadline(void *arg) {
    (void)arg;
    struct timespec ts = {ABORT_GRACE_S, 0};
    nanosleep(&ts, NULL);
    fprintf(stderr, "moecore: rank %d: the abort did not finish within %d s (a kernel waiting on a dead peer "
            "cannot be stopped); exiting\n", world_rank, ABORT_GRACE_S);
    _exit(3);
}

static void abort_all(const char *why) {
    aborting = 1;
    pthread_t t;
    if (pthread_create(&t, NULL, abort_deadline, NULL) == 0) pthread_detach(t);
    fprintf(stderr, "moecore: error: rank %d: %s; aborting the NCCL communicators and ending the job\n", world_rank,
            why);
    fflush(stderr);
    ncclComm_t all[MAX_COMMS];
    int n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_comms; i++)
        if (comms[i]) all[n++] = nc(comms[i]);
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < n; i++) api->ncclCommAbort(all[i]);
    fflush(stdout);
    if (comm_mpi_active()) MPI_Abort(MPI_COMM_WORLD, 3);
    _exit(3);
}

static void *watch_loop(void *arg) {
    (void)arg;
    if (cudaSetDevice(device) != cudaSuccess) return NULL;
    for (;;) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&lock);
        if (watchdog_stop) { pthread_mutex_unlock(&lock); return NULL; }
        // completed collectives leave the ring in order
        while (ring_len > 0 && cudaEventQuery(ring[ring_head].ev) == cudaSuccess) {
            ring_head = (ring_head + 1) % WATCH_SLOTS;
            ring_len--;
        }
        char why[300] = "";
        if (ring_len > 0 && clock_now_s() - ring[ring_head].t0 > timeout_s) {
            const Watch *w = &ring[ring_head];
            snprintf(why, sizeof why, "NCCL %s on group %s (%d ranks) did not complete within %.0f s "
                     "(parallel.timeout_s); a rank of the group is dead or stuck", w->op, w->comm->nccl->name,
                     w->comm->size, timeout_s);
        }
        if (!why[0] && host_op && clock_now_s() - host_t0 > timeout_s) {
            const char *op = strncmp(host_op, "api->", 5) ? host_op : host_op + 5; // NCCL_CHECK's text
            snprintf(why, sizeof why, "the host has been inside %.*s for more than %.0f s (parallel.timeout_s); "
                     "a rank is dead or stuck", (int)strcspn(op, "("), op, timeout_s);
        }
        for (int i = 0; i < n_comms && !why[0]; i++) {
            ncclResult_t async = ncclSuccess;
            if (comms[i] && api->ncclCommGetAsyncError(nc(comms[i]), &async) == ncclSuccess && async != ncclSuccess &&
                async != ncclInProgress)
                snprintf(why, sizeof why, "NCCL asynchronous error on group %s: %s", comms[i]->nccl->name,
                         api->ncclGetErrorString(async));
        }
        pthread_mutex_unlock(&lock);
        if (why[0]) abort_all(why);
    }
}

// After a collective was enqueued on stream s: watch it (not while a CUDA
// graph is being captured, where events are graph nodes, nor when the ring
// is full: the oldest entries are then the ones that matter).
static void watch(cudaStream_t s, const char *op, const Comm *c) {
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    CU_CHECK(cudaStreamIsCapturing(s, &cap));
    if (cap != cudaStreamCaptureStatusNone) return;
    pthread_mutex_lock(&lock);
    if (ring_len < WATCH_SLOTS) {
        int i = (ring_head + ring_len) % WATCH_SLOTS;
        ring[i] = (Watch){ring_ev[i], clock_now_s(), op, c};
        CU_CHECK(cudaEventRecord(ring_ev[i], s));
        ring_len++;
    }
    pthread_mutex_unlock(&lock);
}

// A symmetric-memory barrier just launched on the compute stream (symmem_nccl.cu).
void nccl_watch_barrier(const Comm *c) { watch(cuda_stream(), "symmetric-memory barrier", c); }

// ---- set-up -------------------------------------------------------------------

static Comm *register_comm(ncclComm_t comm, const char *name) {
    if (n_comms == MAX_COMMS) {
        fprintf(stderr, "moecore: more than %d NCCL communicators\n", MAX_COMMS);
        comm_abort(3);
    }
    Comm *c = mallocCheck(sizeof(Comm));
    c->nccl = mallocCheck(sizeof(NcclComm));
    c->nccl->comm = comm;
    snprintf(c->nccl->name, sizeof c->nccl->name, "%s", name);
    NCCL_CHECK(api->ncclCommUserRank(comm, &c->rank));
    NCCL_CHECK(api->ncclCommCount(comm, &c->size));
    pthread_mutex_lock(&lock);
    comms[n_comms++] = c;
    pthread_mutex_unlock(&lock);
    return c;
}

// This process's GPU: the launcher's local rank modulo the visible devices,
// set before anything else touches CUDA. The number of devices, or 0 with
// a message in err.
static int pick_device(const LaunchInfo *li, char *err, size_t errlen) {
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        errorf(err, errlen, "rank %d: no CUDA device (%s)", li->rank, e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 0;
    }
    device = li->local_rank % n_dev;
    world_rank = li->rank;
    if ((e = cudaSetDevice(device)) != cudaSuccess) {
        errorf(err, errlen, "rank %d: cudaSetDevice(%d): %s", li->rank, device, cudaGetErrorString(e));
        return 0;
    }
    return n_dev;
}

Comm *comm_nccl_world(const LaunchInfo *li, double timeout, char *err, size_t errlen) {
    char why[600];
    if (!(api = nccl_api(why, sizeof why))) FAIL_NULL(err, errlen, "%s", why);
    int n_dev = pick_device(li, err, errlen);
    if (!n_dev) return NULL;
    timeout_s = timeout > 0 ? timeout : 600;
    // the unique id: from rank 0, over MPI or the TCP rendezvous
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (li->rank == 0) NCCL_CHECK(api->ncclGetUniqueId(&id));
    if (comm_mpi_active()) {
        comm_broadcast(comm_world(), &id, sizeof id, COMM_BYTE, 0);
    } else if (li->world > 1) {
        char *all = mallocCheck((size_t)li->world * sizeof id);
        int rc = launch_allgather(li, &id, all, sizeof id, timeout_s < 300 ? timeout_s : 300, why, sizeof why);
        memcpy(&id, all, sizeof id);
        free(all);
        if (rc) FAIL_NULL(err, errlen, "rank %d: the NCCL unique id exchange failed: %s", li->rank, why);
    }
    // the watchdog from here: the set-up below waits for every rank
    watchdog_stop = 0;
    atexit(exit_if_aborting);
    if (!watchdog_on && pthread_create(&watchdog, NULL, watch_loop, NULL) == 0) watchdog_on = 1;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclComm_t comm;
    nccl_host_enter("ncclCommInitRankConfig");
    ncclResult_t r = api->ncclCommInitRankConfig(&comm, li->world, id, li->rank, &cfg);
    nccl_host_leave();
    if (r != ncclSuccess)
        FAIL_NULL(err, errlen, "rank %d of %d: ncclCommInitRankConfig: %s (%s)", li->rank, li->world,
                  api->ncclGetErrorString(r), api->ncclGetLastError(NULL));
    CU_CHECK(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking));
    for (int i = 0; i < WATCH_SLOTS; i++) CU_CHECK(cudaEventCreateWithFlags(&ring_ev[i], cudaEventDisableTiming));
    CU_CHECK(cudaEventCreateWithFlags(&fork_ev, cudaEventDisableTiming));
    stage_bytes = STAGE_MIN;
    CU_CHECK(cudaMalloc((void **)&stage, stage_bytes));
    Comm *c = register_comm(comm, "world");
    int v = api->version;
    snprintf(describe, sizeof describe, "NCCL %d.%d.%d (%s), rank %d on GPU %d of %d, timeout %.0f s", v / 10000,
             v / 100 % 100, v % 100, api->path, li->rank, device, n_dev, timeout_s);
    return c;
}

const char *comm_nccl_describe(void) { return describe; }

// ---- GPU ranks over MPI (MOECORE_COMM=mpi: comm.h's comm_stage_device) -----------

static int on_device(const void *p);
static void stage_check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "moecore: rank %d: CUDA error while staging a buffer for MPI (%s): %s\n", world_rank, what,
            cudaGetErrorString(e));
    comm_abort(3);
}
// on the compute stream, so ordered after its enqueued work and before its
// later work; the host waits (the host side is ordinary pageable memory)
static void stage_copy(void *dst, const void *src, size_t bytes, const char *what) {
    stage_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda_stream()), what);
    stage_check(cudaStreamSynchronize(cuda_stream()), what);
}
static void stage_to_host(void *h, const void *d, size_t bytes) { stage_copy(h, d, bytes, "device to host"); }
static void stage_to_device(void *d, const void *h, size_t bytes) { stage_copy(d, h, bytes, "host to device"); }
static void stage_move(void *dst, const void *src, size_t bytes) { stage_copy(dst, src, bytes, "device copy"); }
static const CommDeviceCopy device_copy = {on_device, stage_to_host, stage_to_device, stage_move};

Comm *comm_mpi_device_world(const LaunchInfo *li, char *err, size_t errlen) {
    if (!comm_mpi_active())
        FAIL_NULL(err, errlen, "MOECORE_COMM=mpi: GPU ranks over MPI need a job started by mpirun (this one was "
                  "started by %s)", launch_kind_name(li->kind));
    int n_dev = pick_device(li, err, errlen);
    if (!n_dev) return NULL;
    comm_stage_device(&device_copy);
    snprintf(describe, sizeof describe, "MPI, device buffers staged through the host (MOECORE_COMM=mpi: a "
             "correctness check, slow by design), rank %d on GPU %d of %d", li->rank, device, n_dev);
    return comm_world();
}

void comm_set_name(Comm *c, const char *name) {
    if (c && c->nccl) snprintf(c->nccl->name, sizeof c->nccl->name, "%s", name);
}

Comm *nccl_split(Comm *parent, int color, int key) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclComm_t comm;
    NCCL_CHECK(api->ncclCommSplit(nc(parent), color, key, &comm, &cfg));
    return register_comm(comm, "group");
}

void nccl_free(Comm *c) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_comms; i++)
        if (comms[i] == c) comms[i] = comms[--n_comms];
    pthread_mutex_unlock(&lock);
    NCCL_CHECK(api->ncclCommDestroy(nc(c)));
    free(c->nccl);
    free(c);
}

void nccl_shutdown(void) {
    if (!api) return;
    if (watchdog_on) {
        pthread_mutex_lock(&lock);
        watchdog_stop = 1;
        pthread_mutex_unlock(&lock);
        pthread_join(watchdog, NULL);
        watchdog_on = 0;
    }
    while (n_comms > 0) nccl_free(comms[n_comms - 1]);
    if (stage) cudaFree(stage);
    stage = NULL;
}

// ---- host buffers -------------------------------------------------------------

static int on_device(const void *p) {
    struct cudaPointerAttributes a;
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();  // a plain host pointer may leave an error behind on old runtimes
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static void *staging(size_t bytes) {
    if (bytes > stage_bytes) {  // the first step's sizes; later steps reuse them
        CU_CHECK(cudaFree(stage));
        stage_bytes = bytes;
        CU_CHECK(cudaMalloc((void **)&stage, stage_bytes));
    }
    return stage;
}

// ---- collectives --------------------------------------------------------------

// Runs body on device memory d: buf itself, or a staged copy of bytes of it
// (copied in when copy_in, always copied back, then a host wait).
#define STAGED(buf, bytes, copy_in, body)                                                             \
    do {                                                                                              \
        cudaStream_t s = cuda_stream();                                                               \
        int dev_ = on_device(buf);                                                                    \
        char *d = dev_ ? (char *)(buf) : staging(bytes);                                              \
        if (!dev_ && (copy_in)) CU_CHECK(cudaMemcpyAsync(d, buf, bytes, cudaMemcpyHostToDevice, s));   \
        body;                                                                                         \
        if (!dev_) {                                                                                  \
            CU_CHECK(cudaMemcpyAsync((void *)(buf), d, bytes, cudaMemcpyDeviceToHost, s));            \
            CU_CHECK(cudaStreamSynchronize(s));                                                       \
        }                                                                                             \
    } while (0)

void nccl_allreduce(Comm *c, void *buf, size_t n, CommType t) {
    STAGED(buf, n * comm_type_size(t), 1, {
        NCCL_CHECK(api->ncclAllReduce(d, d, n, nccl_type(t), ncclSum, nc(c), s));
        watch(s, "all_reduce", c);
    });
}

// The communication stream after what the compute stream has enqueued (a
// wait takes the event's state when it is called, so one event serves all).
static void comm_stream_after_compute(void) {
    CU_CHECK(cudaEventRecord(fork_ev, cuda_stream()));
    CU_CHECK(cudaStreamWaitEvent(comm_stream, fork_ev, 0));
}

static CommReq *request(const Comm *c, const char *op) {
    if (n_ev_free == 0) {  // every event is in flight: add as many again
        int grow = n_ev ? n_ev : 256;
        ev_pool = reallocCheck(ev_pool, (n_ev + grow) * sizeof(cudaEvent_t));
        ev_free = reallocCheck(ev_free, (n_ev + grow) * sizeof(int));
        for (int i = n_ev; i < n_ev + grow; i++) {
            CU_CHECK(cudaEventCreateWithFlags(&ev_pool[i], cudaEventDisableTiming));
            ev_free[n_ev_free++] = i;
        }
        n_ev += grow;
    }
    CommReq *r = mallocCheck(sizeof(CommReq));
    r->nccl = mallocCheck(sizeof(NcclReq));
    r->nccl->slot = ev_free[--n_ev_free];
    CU_CHECK(cudaEventRecord(ev_pool[r->nccl->slot], comm_stream));
    watch(comm_stream, op, c);
    return r;
}

static void require_device(const void *p, const char *op) {
    if (p && !on_device(p)) {
        fprintf(stderr, "moecore: internal error: NCCL %s given a host buffer (non-blocking calls take device memory)\n", op);
        comm_abort(3);
    }
}

CommReq *nccl_iallreduce(Comm *c, void *buf, size_t n, CommType t) {
    require_device(buf, "iallreduce");
    comm_stream_after_compute();
    NCCL_CHECK(api->ncclAllReduce(buf, buf, n, nccl_type(t), ncclSum, nc(c), comm_stream));
    return request(c, "all_reduce (bucket)");
}

CommReq *nccl_ireduce_scatter(Comm *c, const void *send, void *recv, const size_t *counts, CommType t) {
    require_device(send, "ireduce_scatter");
    comm_stream_after_compute();
    size_t es = comm_type_size(t), off = 0;
    NCCL_CHECK(api->ncclGroupStart());
    for (int r = 0; r < c->size; r++) {
        if (counts[r])
            NCCL_CHECK(api->ncclReduce((const char *)send + off * es, r == c->rank ? recv : NULL, counts[r],
                                       nccl_type(t), ncclSum, r, nc(c), comm_stream));
        off += counts[r];
    }
    NCCL_CHECK(api->ncclGroupEnd());
    return request(c, "reduce_scatter (bucket)");
}

void nccl_wait(CommReq *r) {
    CU_CHECK(cudaStreamWaitEvent(cuda_stream(), ev_pool[r->nccl->slot], 0));
    ev_free[n_ev_free++] = r->nccl->slot;
    free(r->nccl);
    free(r);
}


void nccl_all_gather(Comm *c, void *buf, const size_t *counts, CommType t) {
    size_t es = comm_type_size(t), total = 0;
    for (int r = 0; r < c->size; r++) total += counts[r];
    STAGED(buf, total * es, 1, {
        size_t off = 0;
        NCCL_CHECK(api->ncclGroupStart());
        for (int r = 0; r < c->size; r++) {
            if (counts[r])
                NCCL_CHECK(api->ncclBroadcast(d + off * es, d + off * es, counts[r], nccl_type(t), r, nc(c), s));
            off += counts[r];
        }
        NCCL_CHECK(api->ncclGroupEnd());
        watch(s, "all_gather", c);
    });
}

void nccl_broadcast(Comm *c, void *buf, size_t n, CommType t, int root) {
    STAGED(buf, n * comm_type_size(t), c->rank == root, {
        NCCL_CHECK(api->ncclBroadcast(d, d, n, nccl_type(t), root, nc(c), s));
        watch(s, "broadcast", c);
    });
}

void nccl_barrier(Comm *c) {
    int one = 1;
    nccl_allreduce(c, &one, 1, COMM_I32);  // host buffer: returns when every rank has joined
}

void nccl_all_to_all_v(Comm *c, const void *send, const size_t *send_counts, void *recv, const size_t *recv_counts,
                       size_t elem_bytes) {
    size_t ns = 0, nr = 0;
    for (int r = 0; r < c->size; r++) ns += send_counts[r], nr += recv_counts[r];
    cudaStream_t s = cuda_stream();
    int dev = on_device(send);
    if (dev != on_device(recv) && ns && nr) {
        fprintf(stderr, "moecore: internal error: NCCL all_to_all_v between host and device buffers\n");
        comm_abort(3);
    }
    const char *sd = send;
    char *rd = recv;
    if (!dev) {  // host (the expert-parallel counts): both staged in one buffer
        char *d = staging((ns + nr) * elem_bytes);
        CU_CHECK(cudaMemcpyAsync(d, send, ns * elem_bytes, cudaMemcpyHostToDevice, s));
        sd = d, rd = d + ns * elem_bytes;
    }
    size_t so = 0, ro = 0;
    NCCL_CHECK(api->ncclGroupStart());
    for (int r = 0; r < c->size; r++) {
        if (send_counts[r])
            NCCL_CHECK(api->ncclSend(sd + so * elem_bytes, send_counts[r] * elem_bytes, ncclUint8, r, nc(c), s));
        if (recv_counts[r])
            NCCL_CHECK(api->ncclRecv(rd + ro * elem_bytes, recv_counts[r] * elem_bytes, ncclUint8, r, nc(c), s));
        so += send_counts[r], ro += recv_counts[r];
    }
    NCCL_CHECK(api->ncclGroupEnd());
    watch(s, "all_to_all_v", c);
    if (!dev) {
        CU_CHECK(cudaMemcpyAsync(recv, rd, nr * elem_bytes, cudaMemcpyDeviceToHost, s));
        CU_CHECK(cudaStreamSynchronize(s));
    }
}

void nccl_send(Comm *c, const void *buf, size_t n, CommType t, int dst) {
    STAGED(buf, n * comm_type_size(t), 1, {
        NCCL_CHECK(api->ncclSend(d, n, nccl_type(t), dst, nc(c), s));
        watch(s, "send", c);
    });
}

void nccl_recv(Comm *c, void *buf, size_t n, CommType t, int src) {
    STAGED(buf, n * comm_type_size(t), 0, {
        NCCL_CHECK(api->ncclRecv(d, n, nccl_type(t), src, nc(c), s));
        watch(s, "recv", c);
    });
}
// Pipeline hand-offs: device buffers only (activations and their grads),
// a group of sends and receives on the communication stream after the
// compute stream's work so far; comm_wait orders the compute stream after
// it. isend / irecv are groups of one.
CommReq *nccl_isend(Comm *c, const void *buf, size_t n, CommType t, int dst) {
    CommP2P op = {.buf = (void *)buf, .n = n, .type = t, .peer = dst};
    nccl_p2p_group(c, &op, 1);
    return op.req;
}

CommReq *nccl_irecv(Comm *c, void *buf, size_t n, CommType t, int src) {
    CommP2P op = {.buf = buf, .n = n, .type = t, .peer = src, .recv = 1};
    nccl_p2p_group(c, &op, 1);
    return op.req;
}

void nccl_p2p_group(Comm *c, CommP2P *ops, int n_ops) {
    if (n_ops == 0) return;
    comm_stream_after_compute();
    NCCL_CHECK(api->ncclGroupStart());
    for (int i = 0; i < n_ops; i++) {
        CommP2P *o = &ops[i];
        require_device(o->buf, o->recv ? "irecv" : "isend");
        if (o->recv) NCCL_CHECK(api->ncclRecv(o->buf, o->n, nccl_type(o->type), o->peer, nc(c), comm_stream));
        else NCCL_CHECK(api->ncclSend(o->buf, o->n, nccl_type(o->type), o->peer, nc(c), comm_stream));
    }
    NCCL_CHECK(api->ncclGroupEnd());
    // each request's event after the whole group (recorded once it is enqueued)
    for (int i = 0; i < n_ops; i++) ops[i].req = request(c, ops[i].recv ? "recv (pipeline)" : "send (pipeline)");
}
#endif
