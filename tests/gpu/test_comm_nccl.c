// The NCCL communicator (src/dist/comm_nccl.c) through comm.h, as the
// trainer uses it: on whatever ranks the launcher started (alone: one rank),
// every call on device buffers and on host buffers (staged) gives the sums
// and copies computed here on the host (integers, exact in FP32 and F64);
// a non-blocking all-reduce sees what the compute stream wrote just before
// it and comm_wait orders the compute stream after it (a 64 MiB copy with no
// host wait in between would show a missing dependency); reduce_scatter,
// all_gather and all_to_all_v with unequal counts; p2p groups (the
// pipeline's slot: a send and a receive in one group); the mesh split names its
// groups. Alone, child processes also check the watchdog: a collective
// stuck behind a blocked stream, and the host stuck inside a NCCL call (as
// in a split whose peer never comes), each end the job with exit 3 and a
// message naming the collective and its group, or the call, and
// parallel.timeout_s.
// Run alone, or under torchrun-style variables (one GPU per rank).
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dist/comm.h"
#include "dist/launch.h"
#include "dist/mesh.h"
#include "gpu_test_util.h"

static void sleep_on_stream(void *arg) { sleep(*(int *)arg); }
void nccl_host_enter(const char *op);  // comm_nccl.c (comm_impl.h): what NCCL_CHECK calls around each call

// The children of the watchdog check: their own one-rank world with a 2 s
// timeout, then (host 0) an all-reduce stuck behind a host function that
// blocks the stream for 30 s, or (host 1) 30 s inside a NCCL call.
static void watchdog_child(int host) {
    LaunchInfo li = {LAUNCH_SINGLE, 0, 1, 0, "", 0};
    char err[800];
    Comm *w = comm_nccl_world(&li, 2.0, err, sizeof err);
    if (!w) { fprintf(stderr, "child: %s\n", err); _exit(1); }
    if (host) {
        nccl_host_enter("api->ncclCommSplit(nc(parent), color, key, &comm, &cfg)");
        sleep(30);
        exit(0);
    }
    float *d;
    cudaMalloc((void **)&d, 1024 * sizeof(float));
    static int secs = 30;
    cudaLaunchHostFunc(cuda_stream(), sleep_on_stream, &secs);
    comm_allreduce(w, d, 1024, COMM_F32);
    cudaStreamSynchronize(cuda_stream());  // the abort may free this wait: the exit must still fail
    exit(0);
}

static int check_watchdog(int host) {
    char path[] = "/tmp/moecore-watchdog-XXXXXX";
    int fd = mkstemp(path);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 2);
        alarm(60);
        watchdog_child(host);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    char buf[2000] = "";
    lseek(fd, 0, SEEK_SET);
    ssize_t n = read(fd, buf, sizeof buf - 1);
    buf[n > 0 ? n : 0] = 0;
    close(fd);
    unlink(path);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    const char *want = host ? "the host has been inside ncclCommSplit for more than 2 s"
                            : "all_reduce on group world (1 ranks) did not complete within 2 s";
    gt_ok(code == 3 && strstr(buf, want) && strstr(buf, "parallel.timeout_s"), "watchdog: %s ends the job (exit %d): %s",
          host ? "the host stuck in a NCCL call" : "a stuck all-reduce", code, strtok(buf, "\n") ? buf : "(no message)");
    return 0;
}

int main(void) {
    char err[800];
    LaunchInfo li;
    if (launch_detect(&li, err, sizeof err)) { printf("FAIL launch: %s\n", err); return 1; }
    // before anything touches CUDA in this process (a forked child cannot use it after)
    if (li.world == 1) check_watchdog(0), check_watchdog(1);
    Comm *w = comm_nccl_world(&li, 120, err, sizeof err);
    if (!w) { printf("FAIL comm_nccl_world: %s\n", err); return 1; }
    printf("-- %s\n", comm_nccl_describe());
    int R = comm_rank(w), W = comm_size(w);
    gt_ok(comm_is_nccl(w) && R == li.rank && W == li.world, "world: rank %d of %d", R, W);
    cudaStream_t s = cuda_stream();

    // all-reduce, device: rank r holds (r + 1) * (i % 1000)
    size_t n = (size_t)16 << 20;  // 64 MiB of floats
    float *h = malloc(n * sizeof(float)), *d;
    cudaMalloc((void **)&d, n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = (float)((R + 1) * (int)(i % 1000));
    cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    comm_allreduce(w, d, n, COMM_F32);
    cudaMemcpyAsync(h, d, n * sizeof(float), cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    float tri = W * (W + 1) / 2.0f;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += h[i] != tri * (float)(i % 1000);
    gt_ok(bad == 0, "all_reduce, 64 MiB on the device: %zu wrong", bad);

    // all-reduce, host (staged): doubles and ints come back on the host
    double hd[3] = {1.5 * (R + 1), -2.0, 1e15};
    comm_allreduce(w, hd, 3, COMM_F64);
    gt_ok(hd[0] == 1.5 * tri && hd[1] == -2.0 * W && hd[2] == 1e15 * W, "all_reduce, host doubles: %g %g %g", hd[0],
          hd[1], hd[2]);

    // non-blocking: sees the compute stream's copy enqueued just before, and
    // the compute stream's copy after comm_wait sees the sum
    for (size_t i = 0; i < n; i++) h[i] = (float)((R + 1) * (int)(i % 777));
    cudaMemcpyAsync(d, h, n * sizeof(float), cudaMemcpyHostToDevice, s);
    CommReq *rq = comm_iallreduce(w, d, n, COMM_F32);
    comm_wait(rq);
    float *back = malloc(n * sizeof(float));
    cudaMemcpyAsync(back, d, n * sizeof(float), cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += back[i] != tri * (float)(i % 777);
    gt_ok(bad == 0, "iallreduce + comm_wait: ordered after and before the compute stream's copies (%zu wrong)", bad);

    // reduce-scatter with unequal counts: rank q gets block q of the sum
    size_t counts[64], total = 0;
    for (int q = 0; q < W; q++) total += counts[q] = 1000 + 37 * q + (q == 0 ? 5 : 0);
    float *src = malloc(total * sizeof(float)), *dsrc, *drecv;
    for (size_t i = 0; i < total; i++) src[i] = (float)((R + 1) * (int)(i % 513));
    cudaMalloc((void **)&dsrc, total * sizeof(float));
    cudaMalloc((void **)&drecv, counts[R] * sizeof(float));
    cudaMemcpy(dsrc, src, total * sizeof(float), cudaMemcpyHostToDevice);
    comm_wait(comm_ireduce_scatter(w, dsrc, drecv, counts, COMM_F32));
    size_t off = 0;
    for (int q = 0; q < R; q++) off += counts[q];
    cudaMemcpyAsync(back, drecv, counts[R] * sizeof(float), cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    bad = 0;
    for (size_t i = 0; i < counts[R]; i++) bad += back[i] != tri * (float)((off + i) % 513);
    gt_ok(bad == 0, "reduce_scatter, counts 1005, 1037, ...: %zu wrong", bad);

    // all-gather in place, device and host: block q holds q + i
    float *g = malloc(total * sizeof(float));
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < total; i++) g[i] = -1;
        for (size_t i = 0; i < counts[R]; i++) g[off + i] = (float)(R + i);
        if (pass == 0) {
            cudaMemcpy(dsrc, g, total * sizeof(float), cudaMemcpyHostToDevice);
            comm_all_gather(w, dsrc, counts, COMM_F32);
            cudaMemcpyAsync(g, dsrc, total * sizeof(float), cudaMemcpyDeviceToHost, s);
            cudaStreamSynchronize(s);
        } else {
            comm_all_gather(w, g, counts, COMM_F32);
        }
        bad = 0;
        size_t o = 0;
        for (int q = 0; q < W; q++)
            for (size_t i = 0; i < counts[q]; i++, o++) bad += g[o] != (float)(q + i);
        gt_ok(bad == 0, "all_gather in place, %s: %zu wrong", pass ? "host (staged)" : "device", bad);
    }

    // all-to-all-v: rank r sends r + 1 + q rows of 3 ints to rank q, row j = (r, q, j)
    for (int pass = 0; pass < 2; pass++) {
        size_t sc[64], rc[64], ns = 0, nr = 0;
        for (int q = 0; q < W; q++) ns += sc[q] = (size_t)(R + 1 + q), nr += rc[q] = (size_t)(q + 1 + R);
        int *sh = malloc(ns * 3 * sizeof(int)), *rh = malloc(nr * 3 * sizeof(int));
        size_t o = 0;
        for (int q = 0; q < W; q++)
            for (size_t j = 0; j < sc[q]; j++, o++) sh[3 * o] = R, sh[3 * o + 1] = q, sh[3 * o + 2] = (int)j;
        if (pass == 0) {
            int *ds_, *dr_;
            cudaMalloc((void **)&ds_, ns * 3 * sizeof(int));
            cudaMalloc((void **)&dr_, nr * 3 * sizeof(int));
            cudaMemcpy(ds_, sh, ns * 3 * sizeof(int), cudaMemcpyHostToDevice);
            comm_all_to_all_v(w, ds_, sc, dr_, rc, 3 * sizeof(int));
            cudaMemcpyAsync(rh, dr_, nr * 3 * sizeof(int), cudaMemcpyDeviceToHost, s);
            cudaStreamSynchronize(s);
            cudaFree(ds_);
            cudaFree(dr_);
        } else {
            comm_all_to_all_v(w, sh, sc, rh, rc, 3 * sizeof(int));
        }
        bad = 0;
        o = 0;
        for (int q = 0; q < W; q++)
            for (size_t j = 0; j < rc[q]; j++, o++)
                bad += rh[3 * o] != q || rh[3 * o + 1] != R || rh[3 * o + 2] != (int)j;
        gt_ok(bad == 0, "all_to_all_v, %s: %zu rows received, %zu wrong", pass ? "host (staged)" : "device", nr, bad);
        free(sh);
        free(rh);
    }

    // comm_p2p_group (the pipeline's slot): a send to the next rank and a
    // receive from the previous one in one group (alone: to itself), then
    // the reverse; comm_wait orders the compute stream after each receive
    {
        int nx = (R + 1) % W, pv = (R + W - 1) % W, n = 1 << 20;
        float *hs = malloc(n * sizeof(float)), *hr = malloc(n * sizeof(float)), *d0, *d1, *d2;
        for (int i = 0; i < n; i++) hs[i] = (float)(R * 1000 + i % 977);
        cudaMalloc((void **)&d0, n * sizeof(float));
        cudaMalloc((void **)&d1, n * sizeof(float));
        cudaMalloc((void **)&d2, n * sizeof(float));
        cudaMemcpy(d0, hs, n * sizeof(float), cudaMemcpyHostToDevice);
        cudaMemset(d1, 0, n * sizeof(float));
        cudaMemset(d2, 0, n * sizeof(float));
        cudaDeviceSynchronize(); // the legacy stream's memsets before the communication stream's receives
        CommP2P fwd[2] = {{.buf = d0, .n = (size_t)n, .type = COMM_F32, .peer = nx},
                          {.buf = d1, .n = (size_t)n, .type = COMM_F32, .peer = pv, .recv = 1}};
        comm_p2p_group(w, fwd, 2);
        comm_wait(fwd[1].req);
        comm_wait(fwd[0].req);
        CommP2P bwd[2] = {{.buf = d2, .n = (size_t)n, .type = COMM_F32, .peer = nx, .recv = 1},
                          {.buf = d1, .n = (size_t)n, .type = COMM_F32, .peer = pv}};
        comm_p2p_group(w, bwd, 2);
        comm_wait(bwd[0].req);
        comm_wait(bwd[1].req);
        cudaMemcpyAsync(hr, d1, n * sizeof(float), cudaMemcpyDeviceToHost, s);
        cudaStreamSynchronize(s);
        size_t wrong = 0;
        for (int i = 0; i < n; i++) wrong += hr[i] != (float)(pv * 1000 + i % 977);
        cudaMemcpyAsync(hr, d2, n * sizeof(float), cudaMemcpyDeviceToHost, s);
        cudaStreamSynchronize(s);
        for (int i = 0; i < n; i++) wrong += hr[i] != hs[i];
        gt_ok(wrong == 0, "p2p groups: send to %d and receive from %d in one group, then back: %zu wrong", nx, pv, wrong);
        cudaFree(d0), cudaFree(d1), cudaFree(d2), free(hs), free(hr);
    }

    // broadcast from the last rank, device and host
    int root = W - 1;
    long v[4] = {R == root ? 7 : 0, R == root ? -9 : 0, 11, R == root ? 13 : 0}, *dv;
    cudaMalloc((void **)&dv, sizeof v);
    cudaMemcpy(dv, v, sizeof v, cudaMemcpyHostToDevice);
    comm_broadcast(w, dv, 4, COMM_I64, root);
    long got[4];
    cudaMemcpyAsync(got, dv, sizeof got, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    comm_broadcast(w, v, 4, COMM_I64, root);
    gt_ok(got[0] == 7 && got[1] == -9 && got[3] == 13 && v[0] == 7 && v[1] == -9 && v[3] == 13,
          "broadcast from rank %d: device %ld %ld %ld, host %ld %ld %ld", root, got[0], got[1], got[3], v[0], v[1], v[3]);
    comm_barrier(w);
    gt_ok(1, "barrier");

    // the mesh over NCCL: dp = W, ep = the largest of 2, 1 that divides it
    Mesh m;
    int ep = W % 2 == 0 ? 2 : 1;
    mesh_init(&m, w, W, ep, 1);
    gt_ok(comm_is_nccl(m.dp_comm) && comm_size(m.dp_comm) == W && comm_size(m.ep_comm) == ep &&
              comm_size(m.ep_dp_comm) == W / ep && comm_rank(m.ep_comm) == m.ep_rank,
          "mesh split: dp %d, ep %d, ep_dp %d", comm_size(m.dp_comm), comm_size(m.ep_comm), comm_size(m.ep_dp_comm));
    double one = 1;
    comm_allreduce(m.ep_dp_comm, &one, 1, COMM_F64);
    gt_ok(one == W / ep, "all_reduce over ep_dp: %g", one);
    mesh_free(&m);
    comm_free(w);
    comm_finalize();
    return gt_finish();
}
