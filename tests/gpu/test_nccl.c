// NCCL as moecore loads it (src/dist/nccl_api.h) and bootstraps it
// (src/dist/launch.h): on whatever ranks the launcher started (one GPU per
// process, LOCAL_RANK picks it; alone: one rank), rank 0's unique id reaches
// every rank over the TCP rendezvous, the communicator is initialised, and
// all-reduce, broadcast, all-gather and reduce-scatter on device buffers
// give the sums and copies computed here on the host (integers, exact in
// FP32); a split by the mesh's groups gives groups of the expected sizes;
// symmetric memory (ncclMemAlloc + ncclCommWindowRegister) registers.
// Run alone (one rank), or under torchrun-style variables, e.g.
//   RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 build/tests/gpu/test_nccl
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/launch.h"
#include "dist/mesh.h"
#include "dist/nccl_api.h"
#include "gpu_test_util.h"

#define NCCL_OK(call)                                                                                      \
    do {                                                                                                   \
        ncclResult_t r_ = (call);                                                                          \
        if (r_ != ncclSuccess) {                                                                           \
            printf("FAIL %s: %s (%s)\n", #call, nccl->ncclGetErrorString(r_), nccl->ncclGetLastError(NULL)); \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)

int main(void) {
    char err[700];
    LaunchInfo li;
    if (launch_detect(&li, err, sizeof err)) { printf("FAIL launch: %s\n", err); return 1; }
    const NcclApi *nccl = nccl_api(err, sizeof err);
    if (!nccl) { printf("FAIL %s\n", err); return 1; }
    printf("-- %s rank %d of %d; NCCL %d from %s\n", launch_kind_name(li.kind), li.rank, li.world, nccl->version,
           nccl->path);
    gt_ok(nccl->version >= 22800, "NCCL is 2.28 or newer (%d)", nccl->version);
    int ndev = 0;
    cudaGetDeviceCount(&ndev);
    if (ndev < 1) { printf("FAIL no GPU\n"); return 1; }
    cudaSetDevice(li.local_rank % ndev);
    ncclUniqueId id, *ids = malloc((size_t)li.world * sizeof id);
    memset(&id, 0, sizeof id);
    if (li.rank == 0) NCCL_OK(nccl->ncclGetUniqueId(&id));
    if (launch_allgather(&li, &id, ids, sizeof id, 60, err, sizeof err)) { printf("FAIL rendezvous: %s\n", err); return 1; }
    ncclComm_t comm;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    NCCL_OK(nccl->ncclCommInitRankConfig(&comm, li.world, ids[0], li.rank, &config));
    int count = 0, me = -1;
    NCCL_OK(nccl->ncclCommCount(comm, &count));
    NCCL_OK(nccl->ncclCommUserRank(comm, &me));
    gt_ok(count == li.world && me == li.rank, "communicator of %d ranks, this one %d", count, me);

    cudaStream_t s;
    cudaStreamCreate(&s);
    int W = li.world;
    size_t n = (size_t)1 << 20;
    float *h = malloc(n * W * sizeof(float)), *want = malloc(n * W * sizeof(float)), *d;
    cudaMalloc((void **)&d, n * W * sizeof(float));
    // all-reduce: rank r holds r + 1 + i % 7; the sum over ranks
    for (size_t i = 0; i < n; i++) h[i] = (float)(li.rank + 1 + i % 7);
    for (size_t i = 0; i < n; i++) want[i] = (float)(W * (W + 1) / 2 + W * (i % 7));
    cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    NCCL_OK(nccl->ncclAllReduce(d, d, n, ncclFloat32, ncclSum, comm, s));
    cudaStreamSynchronize(s);
    cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost);
    gt_ok(!memcmp(h, want, n * sizeof(float)), "all-reduce of %zu floats over %d ranks: exact sums", n, W);
    // broadcast from the last rank
    for (size_t i = 0; i < n; i++) h[i] = (float)(li.rank * 1000 + i % 13);
    cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    NCCL_OK(nccl->ncclBroadcast(d, d, n, ncclFloat32, W - 1, comm, s));
    cudaStreamSynchronize(s);
    cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost);
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) ok = h[i] == (float)((W - 1) * 1000 + i % 13);
    gt_ok(ok, "broadcast from rank %d", W - 1);
    // all-gather: block r of rank r's values
    for (size_t i = 0; i < n; i++) h[i] = (float)(li.rank * 10 + i % 5);
    cudaMemcpy(d + (size_t)li.rank * n, h, n * sizeof(float), cudaMemcpyHostToDevice);
    NCCL_OK(nccl->ncclAllGather(d + (size_t)li.rank * n, d, n, ncclFloat32, comm, s));
    cudaStreamSynchronize(s);
    cudaMemcpy(h, d, n * W * sizeof(float), cudaMemcpyDeviceToHost);
    ok = 1;
    for (int r = 0; r < W; r++)
        for (size_t i = 0; i < n && ok; i++) ok = h[(size_t)r * n + i] == (float)(r * 10 + i % 5);
    gt_ok(ok, "all-gather of %d blocks", W);
    // reduce-scatter: every rank holds W blocks of (r + 1) * (block + 1); block b arrives at rank b summed
    for (int b = 0; b < W; b++)
        for (size_t i = 0; i < n; i++) h[(size_t)b * n + i] = (float)((li.rank + 1) * (b + 1));
    cudaMemcpy(d, h, n * W * sizeof(float), cudaMemcpyHostToDevice);
    float *out;
    cudaMalloc((void **)&out, n * sizeof(float));
    NCCL_OK(nccl->ncclReduceScatter(d, out, n, ncclFloat32, ncclSum, comm, s));
    cudaStreamSynchronize(s);
    cudaMemcpy(h, out, n * sizeof(float), cudaMemcpyDeviceToHost);
    ok = 1;
    for (size_t i = 0; i < n && ok; i++) ok = h[i] == (float)(W * (W + 1) / 2 * (li.rank + 1));
    gt_ok(ok, "reduce-scatter: rank %d's block", li.rank);
    // the mesh's groups by ncclCommSplit: dp = world, ep = the largest of 2, 1 dividing it
    int ep = W % 2 ? 1 : 2;
    Mesh m;
    mesh_coords(&m, li.rank, W, ep, 1);
    int color[MESH_GROUPS], key[MESH_GROUPS];
    mesh_groups(&m, color, key);
    const int want_size[MESH_GROUPS] = {W, ep, W / ep};
    for (int g = 0; g < MESH_GROUPS; g++) {
        ncclComm_t sub;
        NCCL_OK(nccl->ncclCommSplit(comm, color[g], key[g], &sub, NULL));
        int c = 0, r = -1;
        NCCL_OK(nccl->ncclCommCount(sub, &c));
        NCCL_OK(nccl->ncclCommUserRank(sub, &r));
        gt_ok(c == want_size[g] && r == key[g], "split into mesh group %d (dp, ep, ep_dp): %d ranks, rank %d", g, c, r);
        NCCL_OK(nccl->ncclCommDestroy(sub));
    }
    // symmetric memory, for the sync-free expert dispatch (issue 15)
    void *sym = NULL;
    ncclWindow_t win;
    NCCL_OK(nccl->ncclMemAlloc(&sym, (size_t)64 << 20));
    ncclResult_t wr = nccl->ncclCommWindowRegister(comm, sym, (size_t)64 << 20, &win, NCCL_WIN_COLL_SYMMETRIC);
    gt_ok(wr == ncclSuccess, "ncclMemAlloc + ncclCommWindowRegister of 64 MiB: %s", nccl->ncclGetErrorString(wr));
    if (wr == ncclSuccess) NCCL_OK(nccl->ncclCommWindowDeregister(comm, win));
    NCCL_OK(nccl->ncclMemFree(sym));
    // time the all-reduce of 256 MiB (on one rank: NCCL's in-place copy)
    size_t big = (size_t)64 << 20;
    float *db;
    cudaMalloc((void **)&db, big * sizeof(float));
    cudaMemset(db, 0, big * sizeof(float));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float ms[10];
    for (int it = 0; it < 13; it++) {
        cudaEventRecord(e0, s);
        NCCL_OK(nccl->ncclAllReduce(db, db, big, ncclFloat32, ncclSum, comm, s));
        cudaEventRecord(e1, s);
        cudaEventSynchronize(e1);
        if (it >= 3) cudaEventElapsedTime(&ms[it - 3], e0, e1);
    }
    double med = gt_median(ms, 10);
    printf("time all-reduce of %zu MiB FP32 over %d ranks: %.3f ms, bus %.1f GB/s\n", big * 4 >> 20, W, med,
           W > 1 ? 2.0 * (W - 1) / W * big * 4 / (med * 1e-3) / 1e9 : 0.0);
    NCCL_OK(nccl->ncclCommDestroy(comm));
    return gt_finish();
}
