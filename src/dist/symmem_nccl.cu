// The NCCL LSA kind of symmetric memory (symmem.h), on NCCL 2.28's device
// API: the buffer comes from ncclMemAlloc and is registered as a symmetric
// window of the group's communicator; a device communicator with one LSA
// barrier orders the ranks. Kernels never see the window: a setup kernel
// reads every peer's load/store address of it once (ncclGetPeerPointer),
// and the ops get plain pointers (ops/ep_sym.h's tables), exactly as the
// virtual ranks of one GPU do.
//
// The barrier is a one-block kernel on the compute stream whose
// ncclLsaBarrierSession sync (acquire-release at system scope) follows the
// stream's earlier kernels, so stores they made into peers' windows are
// visible to the peers' later kernels. It launches like any kernel: no host
// wait, and it is captured in CUDA graphs.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <nccl_device.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "dist/nccl_api.h"
}
#include <string.h>

extern "C" {
typedef struct Comm Comm;
int comm_size(const Comm *c);
int comm_rank(const Comm *c);
void *nccl_handle(Comm *c);
cudaStream_t cuda_stream(void);
void comm_abort(int code);
void nccl_host_enter(const char *op);  // comm_nccl.c's watchdog
void nccl_host_leave(void);
void nccl_watch_barrier(const Comm *c);
}

typedef ncclResult_t (*DevCommCreateFn)(ncclComm_t, ncclDevCommRequirements_t const *, ncclDevComm_t *);
typedef ncclResult_t (*DevCommDestroyFn)(ncclComm_t, ncclDevComm_t const *);
typedef ncclTeam_t (*TeamLsaFn)(ncclComm_t);

struct NcclSym {
    ncclComm_t comm;
    const NcclApi *api;
    DevCommDestroyFn destroy;
    void *buf;
    ncclWindow_t win;
    ncclDevComm dev;
    int P;
    const Comm *group;  // for the watchdog's messages
};

static void errorf(char *err, size_t n, const char *fmt, const char *a, const char *b) {
    if (err && n) snprintf(err, n, fmt, a, b);
}

// a failure after the group has committed (the peers are in the same call):
// nothing sensible is left to fall back to
static void die(const char *what, ncclResult_t r, const NcclApi *api) {
    fprintf(stderr, "moecore: NCCL symmetric memory: %s failed: %s\n", what, api->ncclGetErrorString(r));
    comm_abort(3);
}

static void *sym(const NcclApi *api, const char *name) { return api->dl ? dlsym(api->dl, name) : NULL; }

extern "C" int nccl_sym_available(Comm *c, char *why, size_t whylen) {
    const NcclApi *api = nccl_api(why, whylen);
    if (!api) return 0;
    TeamLsaFn lsa = (TeamLsaFn)sym(api, "ncclTeamLsa");
    if (!lsa || !sym(api, "ncclDevCommCreate")) {
        errorf(why, whylen, "%s%s has no device API (NCCL 2.28 or newer)", api->path, "");
        return 0;
    }
    ncclTeam_t t = lsa((ncclComm_t)nccl_handle(c));
    if (t.nRanks != comm_size(c)) {
        char n[64];
        snprintf(n, sizeof n, "%d of the group's %d", t.nRanks, comm_size(c));
        errorf(why, whylen, "only %s ranks share load/store memory with this one (one NVLink domain)%s", n, "");
        return 0;
    }
    return 1;
}

static __global__ void peer_bases_kernel(ncclWindow_t w, void **out, int P) {
    int q = threadIdx.x;
    if (q < P) out[q] = ncclGetPeerPointer(w, 0, q);
}

extern "C" void *nccl_sym_create(Comm *c, size_t bytes, void **local, void **peers, char *err, size_t errlen) {
    const NcclApi *api = nccl_api(err, errlen);
    if (!api) return NULL;
    DevCommCreateFn create = (DevCommCreateFn)sym(api, "ncclDevCommCreate");
    NcclSym *s = (NcclSym *)calloc(1, sizeof(NcclSym));
    s->comm = (ncclComm_t)nccl_handle(c);
    s->api = api;
    s->destroy = (DevCommDestroyFn)sym(api, "ncclDevCommDestroy");
    s->P = comm_size(c);
    s->group = c;
    bytes = (bytes + NCCL_WIN_REQUIRED_ALIGNMENT - 1) / NCCL_WIN_REQUIRED_ALIGNMENT * NCCL_WIN_REQUIRED_ALIGNMENT;
    ncclResult_t r = api->ncclMemAlloc(&s->buf, bytes);
    if (r != ncclSuccess) {
        char n[32];
        snprintf(n, sizeof n, "%zu", bytes);
        errorf(err, errlen, "ncclMemAlloc of %s bytes failed: %s", n, api->ncclGetErrorString(r));
        free(s);
        return NULL;
    }
    cudaMemset(s->buf, 0, bytes);
    cudaDeviceSynchronize();
    // both wait for every rank of the group: watched like a collective
    nccl_host_enter("ncclCommWindowRegister");
    r = api->ncclCommWindowRegister(s->comm, s->buf, bytes, &s->win, NCCL_WIN_COLL_SYMMETRIC);
    nccl_host_leave();
    if (r != ncclSuccess) die("ncclCommWindowRegister", r, api);
    ncclDevCommRequirements_t req;
    memset(&req, 0, sizeof req);
    req.lsaBarrierCount = 1;
    nccl_host_enter("ncclDevCommCreate");
    r = create(s->comm, &req, &s->dev);
    nccl_host_leave();
    if (r != ncclSuccess) die("ncclDevCommCreate", r, api);
    void **d_bases = NULL;
    cudaMalloc(&d_bases, (size_t)s->P * sizeof(void *));
    peer_bases_kernel<<<1, s->P < 32 ? 32 : s->P, 0, cuda_stream()>>>(s->win, d_bases, s->P);
    cudaMemcpyAsync(peers, d_bases, (size_t)s->P * sizeof(void *), cudaMemcpyDeviceToHost, cuda_stream());
    cudaError_t e = cudaStreamSynchronize(cuda_stream());
    cudaFree(d_bases);
    if (e != cudaSuccess) {
        fprintf(stderr, "moecore: NCCL symmetric memory: reading the peers' addresses: %s\n", cudaGetErrorString(e));
        comm_abort(3);
    }
    *local = s->buf;
    return s;
}

static __global__ void lsa_barrier_kernel(ncclDevComm dev) {
    ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), dev, ncclTeamLsa(dev), dev.lsaBarrier, 0};
    bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

extern "C" void nccl_sym_barrier(void *state) {
    NcclSym *s = (NcclSym *)state;
    lsa_barrier_kernel<<<1, 32, 0, cuda_stream()>>>(s->dev);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "moecore: NCCL symmetric memory: barrier launch: %s\n", cudaGetErrorString(e));
        comm_abort(3);
    }
    nccl_watch_barrier(s->group); // a peer that never arrives: the watchdog's timeout
}

extern "C" void nccl_sym_free(void *state) {
    NcclSym *s = (NcclSym *)state;
    if (!s) return;
    cudaStreamSynchronize(cuda_stream());
    if (s->destroy) s->destroy(s->comm, &s->dev);
    s->api->ncclCommWindowDeregister(s->comm, s->win);
    s->api->ncclMemFree(s->buf);
    free(s);
}
