// NOT YET RUN ON A GPU: built here (make gpu-bundle), written for the next
// session with a GPU to run (bash tests/gpu/run.sh, or this program alone).
//
// The symmetric expert-parallel kernels (src/ops/cuda/ep_sym.cu) with
// P = 2, 4, 8 virtual ranks on one GPU (DESIGN.md §11): every logical rank
// has its own routed rows, count window, plan, receive buffer and combine
// output in device memory, and device tables of pointers into the others'
// (what NCCL's LSA pointers are on real peers). The phases run rank by rank
// on one stream, which orders them as the barriers would. Against the CPU
// reference on identical routing (tests/ep_sym_harness.h, whose own test
// checks it against ep.h's order): plans and dropped counts equal, received
// rows and combined rows bit-identical (they are copies), every element
// written (outputs poisoned first); then the same phases captured as one
// CUDA graph (a host synchronisation inside would break the capture) and
// replayed give the same bits.
#include "gpu_test_util.h"

#include "../ep_sym_harness.h"

typedef struct {
    int *offsets, *window, *plan;
    uint16_t *xp, *recv, *y;
    float *dropped;
} DevRank;

static void phases(const EpSymCase *c, DevRank *d, int **windows, void **recv) {
    int P = c->P, R = c->N * c->k;
    for (int r = 0; r < P; r++) cuda_ep_sym_write_counts(windows, d[r].offsets, P, r, c->E);
    for (int r = 0; r < P; r++)
        cuda_ep_sym_plan(d[r].plan, d[r].dropped, d[r].window, P, r, c->E, c->capacity, c->max_rows);
    for (int r = 0; r < P; r++) cuda_ep_sym_dispatch(recv, d[r].plan, d[r].offsets, d[r].xp, P, c->E, R, c->C);
    // identity experts: combine reads the receive buffers back
    for (int r = 0; r < P; r++) cuda_ep_sym_combine(d[r].y, recv, d[r].plan, d[r].offsets, P, c->E, R, c->C);
}

static void check_results(const char *tag, const EpSymCase *c, EpSymRank *rk, DevRank *d) {
    int P = c->P, R = c->N * c->k, C = c->C, El = c->E / P;
    size_t pn = ep_sym_plan_ints(P, c->E);
    uint16_t *want = gt_malloc((size_t)(c->max_rows > R ? c->max_rows : R) * C * 2);
    for (int q = 0; q < P; q++) {
        char what[160];
        int *plan = gt_host_bytes(d[q].plan, pn * sizeof(int));
        snprintf(what, sizeof what, "%s rank %d plan", tag, q);
        gt_check_int(what, plan, rk[q].plan, pn);
        float *dropped = gt_host_f32(d[q].dropped, 1);
        gt_ok(dropped[0] == rk[q].dropped, "%s rank %d dropped %g (CPU %g)", tag, q, dropped[0], rk[q].dropped);
        int rows = ep_sym_recv_offsets(rk[q].plan, c->E)[El];
        uint16_t *recv = gt_host_bytes(d[q].recv, (size_t)rows * C * 2);
        for (size_t i = 0; i < (size_t)rows * C; i++) want[i] = f2bf(rk[q].recv[i]);
        snprintf(what, sizeof what, "%s rank %d received rows (%d)", tag, q, rows);
        gt_check_bits(what, recv, want, (size_t)rows * C, 2);
        uint16_t *y = gt_host_bytes(d[q].y, (size_t)R * C * 2);
        for (size_t i = 0; i < (size_t)R * C; i++) want[i] = f2bf(rk[q].y[i]);
        snprintf(what, sizeof what, "%s rank %d combined rows", tag, q);
        gt_check_bits(what, y, want, (size_t)R * C, 2);
        free(plan); free(dropped); free(recv); free(y);
    }
    free(want);
}

static void run_case(const EpSymCase *c) {
    int P = c->P, R = c->N * c->k, C = c->C;
    EpSymRank *rk = eh_alloc(c);
    for (int r = 0; r < P; r++) // BF16 values, so that the copies compare bit for bit
        for (size_t i = 0; i < (size_t)R * C; i++) rk[r].xp[i] = bf2f(f2bf(rk[r].xp[i]));
    eh_dispatch_cpu(c, rk);
    float *out[P];
    for (int q = 0; q < P; q++) out[q] = rk[q].recv;
    eh_combine_cpu(c, rk, out);

    DevRank d[P];
    int *windows_h[P];
    void *recv_h[P];
    uint16_t *xb = gt_malloc((size_t)R * C * 2);
    for (int r = 0; r < P; r++) {
        d[r].offsets = gt_dev_bytes(rk[r].offsets, (c->E + 1) * sizeof(int));
        for (size_t i = 0; i < (size_t)R * C; i++) xb[i] = f2bf(rk[r].xp[i]);
        d[r].xp = gt_dev_bytes(xb, (size_t)R * C * 2);
        d[r].window = cuda_alloc((size_t)P * c->E * sizeof(int));
        gt_poison(d[r].window, (size_t)P * c->E * sizeof(int));
        d[r].plan = cuda_alloc(ep_sym_plan_ints(P, c->E) * sizeof(int));
        gt_poison(d[r].plan, ep_sym_plan_ints(P, c->E) * sizeof(int));
        d[r].recv = cuda_alloc((size_t)c->max_rows * C * 2);
        d[r].y = cuda_alloc((size_t)R * C * 2);
        d[r].dropped = cuda_alloc(sizeof(float));
        windows_h[r] = d[r].window;
        recv_h[r] = d[r].recv;
    }
    int **windows = gt_dev_bytes(windows_h, sizeof windows_h);
    void **recv = gt_dev_bytes(recv_h, sizeof recv_h);
    char tag[96];
    snprintf(tag, sizeof tag, "P %d %s cap %d rows %d", P, c->skewed ? "skewed" : "uniform", c->capacity,
             c->max_rows);
    for (int pass = 0; pass < 2; pass++) {
        for (int r = 0; r < P; r++) {
            gt_poison(d[r].recv, (size_t)c->max_rows * C * 2);
            gt_poison(d[r].y, (size_t)R * C * 2);
            cudaMemsetAsync(d[r].dropped, 0, sizeof(float), cuda_stream());
        }
        cudaDeviceSynchronize();
        if (pass == 0) {
            phases(c, d, windows, recv);
            check_results(tag, c, rk, d);
        } else {
            char err[256] = "";
            ops_cuda.capture_begin();
            phases(c, d, windows, recv);
            void *graph = ops_cuda.capture_end(err, sizeof err);
            if (!gt_ok(graph != NULL, "%s: the phases capture as one CUDA graph %s", tag, err)) break;
            ops_cuda.graph_launch(graph);
            char gtag[128];
            snprintf(gtag, sizeof gtag, "%s graph", tag);
            check_results(gtag, c, rk, d);
            ops_cuda.graph_free(graph);
        }
    }
    for (int r = 0; r < P; r++) {
        cuda_free(d[r].offsets); cuda_free(d[r].xp); cuda_free(d[r].window); cuda_free(d[r].plan);
        cuda_free(d[r].recv); cuda_free(d[r].y); cuda_free(d[r].dropped);
    }
    cuda_free(windows);
    cuda_free(recv);
    free(xb);
    eh_free(c, rk);
}

int main(void) {
    int Ps[] = {2, 4, 8};
    double cfs[] = {0, 1.0, 0.5};
    for (int pi = 0; pi < 3; pi++)
        for (int skewed = 0; skewed <= 1; skewed++) {
            for (int ci = 0; ci < 3; ci++) {
                // OLMoE-like rows (2048 wide, top-8 of 64) on few tokens, and a
                // narrow odd width for the scalar path
                EpSymCase c = {Ps[pi], 256, 8, 64, ci == 2 ? 36 : 2048, 0, 0, skewed, 1000 + pi * 7 + ci};
                c.capacity = cfs[ci] > 0 ? (int)ceil(cfs[ci] * c.N * c.P * c.k / c.E) : 0;
                c.max_rows = c.N * c.k * c.P;
                run_case(&c);
            }
            // dropless, the receive buffer 1.2 x the mean rows per rank
            EpSymCase c = {Ps[pi], 256, 8, 64, 2048, 0, 0, skewed, 2000 + pi};
            c.max_rows = (int)(1.2 * c.N * c.k);
            run_case(&c);
        }
    return gt_finish();
}
