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
//
// Then the whole expert layer on the virtual ranks, forward and backward,
// driven through the Ops table so that one function runs it on the CUDA
// backend and on the CPU backend (ep_sym_cpu.c, whose CI test ties it to
// ep.c's all-to-all): counts, plan, dispatch, the grouped GEMMs and SwiGLU
// on the device's row count, combine; then the output grads dispatched, the
// experts' backward (weight grads from the received rows), the input grads
// combined. Outputs and grads agree within BF16 rounding, plans and drops
// exactly; the GPU's sequence also captures as one graph.
//
// Then the FP8 payload rows of train.precision: fp8 with the symmetric
// dispatch (model.c's sym_fp8_moe_experts_forward): the BF16 rows quantised
// 1 x 128 and packed on the device, moved by the dispatch as
// fp8_payload_bytes(C) / 2 BF16 elements (66 at C = 128: the scalar copy
// path; 264 at 512: the vector one), unpacked over the whole poisoned
// receive buffer: the received prefix's codes and scales equal the CPU
// reference's (quantised, packed, moved as FP32 words, unpacked) bit for bit.
//
// Last, the copy rate: dispatch and combine of OLMoE-1B-7B rows (2048 BF16
// values, top-8 of 64 experts, 8,192 tokens per rank, 8 virtual ranks)
// against cudaMemcpyAsync device-to-device of the same bytes, CUDA events
// after warm-up, median of repeats (issue 15 asks for >= 70%).
#include "gpu_test_util.h"

#include "../ep_sym_harness.h"
#include "ops/cuda/fp8_cuda.h"
#include "ops/fp8.h"

typedef struct {
    int *offsets, *window, *plan;
    uint16_t *xp, *recv, *y;
    float *dropped;
} DevRank;

// Rank r's device buffers for case c: its expert offsets and BF16 routed
// rows from the host, the count window and plan poisoned (every entry the
// kernels own must be written), the receive and combine buffers allocated;
// windows_h / recv_h get its entries of the peer tables.
static void dev_rank_alloc(const EpSymCase *c, DevRank *d, const int *offsets, const uint16_t *xp, int **windows_h,
                           void **recv_h) {
    int P = c->P, R = c->N * c->k, C = c->C;
    d->offsets = gt_dev_bytes(offsets, (c->E + 1) * sizeof(int));
    d->xp = gt_dev_bytes(xp, (size_t)R * C * 2);
    d->window = cuda_alloc((size_t)P * c->E * sizeof(int));
    gt_poison(d->window, (size_t)P * c->E * sizeof(int));
    d->plan = cuda_alloc(ep_sym_plan_ints(P, c->E) * sizeof(int));
    gt_poison(d->plan, ep_sym_plan_ints(P, c->E) * sizeof(int));
    d->recv = cuda_alloc((size_t)c->max_rows * C * 2);
    d->y = cuda_alloc((size_t)R * C * 2);
    d->dropped = cuda_alloc(sizeof(float));
    *windows_h = d->window;
    *recv_h = d->recv;
}

static void dev_rank_free(DevRank *d) {
    cuda_free(d->offsets); cuda_free(d->xp); cuda_free(d->window); cuda_free(d->plan);
    cuda_free(d->recv); cuda_free(d->y); cuda_free(d->dropped);
}

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
        for (size_t i = 0; i < (size_t)R * C; i++) xb[i] = f2bf(rk[r].xp[i]);
        dev_rank_alloc(c, &d[r], rk[r].offsets, xb, &windows_h[r], &recv_h[r]);
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
    for (int r = 0; r < P; r++) dev_rank_free(&d[r]);
    cuda_free(windows);
    cuda_free(recv);
    free(xb);
    eh_free(c, rk);
}

// ---- FP8 payload rows through the dispatch --------------------------------------

static void run_fp8_case(const EpSymCase *c) {
    int P = c->P, R = c->N * c->k, C = c->C, El = c->E / P, nt = C / FP8_BLOCK;
    size_t pb = fp8_payload_bytes(C), pn = ep_sym_plan_ints(P, c->E);
    EpSymRank *rk = eh_alloc(c);
    for (int r = 0; r < P; r++) // BF16 values: the device quantises the same numbers
        for (size_t i = 0; i < (size_t)R * C; i++) rk[r].xp[i] = bf2f(f2bf(rk[r].xp[i]));
    eh_dispatch_cpu(c, rk); // the plans (and the BF16 rows' move, unused here)
    // the CPU reference: quantise, pack, move the payload as FP32 words, unpack
    uint8_t *q = gt_malloc((size_t)R * C), *pay[P], *recv_c[P];
    float *sc = gt_malloc((size_t)R * nt * sizeof(float));
    void *recv_tab_c[P];
    for (int r = 0; r < P; r++) {
        pay[r] = gt_malloc((size_t)R * pb);
        fp8_quantize_1x128(q, sc, rk[r].xp, R, C);
        fp8_pack_rows(pay[r], q, sc, R, C);
        recv_c[r] = calloc((size_t)c->max_rows, pb);
        recv_tab_c[r] = recv_c[r];
    }
    for (int r = 0; r < P; r++)
        ep_sym_cpu_dispatch(recv_tab_c, rk[r].plan, rk[r].offsets, pay[r], P, c->E, R, (int)(pb / sizeof(float)));
    // the device: the same chain on every virtual rank, phase by phase
    uint16_t *xb = gt_malloc((size_t)R * C * 2);
    void *dxp[P], *dq[P], *ds[P], *dpay[P], *drecv[P], *duq[P], *dus[P], *doff[P], *dplan[P];
    for (int r = 0; r < P; r++) {
        for (size_t i = 0; i < (size_t)R * C; i++) xb[i] = f2bf(rk[r].xp[i]);
        dxp[r] = gt_dev_bytes(xb, (size_t)R * C * 2);
        doff[r] = gt_dev_bytes(rk[r].offsets, (c->E + 1) * sizeof(int));
        dplan[r] = gt_dev_bytes(rk[r].plan, pn * sizeof(int));
        dq[r] = cuda_alloc((size_t)R * C);
        ds[r] = cuda_alloc((size_t)R * nt * sizeof(float));
        dpay[r] = cuda_alloc((size_t)R * pb);
        drecv[r] = cuda_alloc((size_t)c->max_rows * pb);
        gt_poison(drecv[r], (size_t)c->max_rows * pb); // the rows past the prefix: garbage
        duq[r] = cuda_alloc((size_t)c->max_rows * C);
        dus[r] = cuda_alloc((size_t)c->max_rows * nt * sizeof(float));
    }
    void **recv_tab = gt_dev_bytes(drecv, sizeof drecv);
    for (int r = 0; r < P; r++) {
        gt_ok(cuda_fp8_quantize_1x128(dq[r], ds[r], dxp[r], R, C) == 0, "fp8 quantise [%d, %d]", R, C);
        cuda_fp8_pack_rows(dpay[r], dq[r], ds[r], R, C);
    }
    for (int r = 0; r < P; r++)
        cuda_ep_sym_dispatch(recv_tab, dplan[r], doff[r], dpay[r], P, c->E, R, (int)(pb / 2));
    for (int r = 0; r < P; r++) cuda_fp8_unpack_rows(duq[r], dus[r], drecv[r], NULL, c->max_rows, C);
    cudaDeviceSynchronize();
    char what[160];
    for (int r = 0; r < P; r++) {
        int rows = ep_sym_recv_offsets(rk[r].plan, c->E)[El];
        uint8_t *wq = gt_malloc((size_t)rows * C);
        float *ws = gt_malloc((size_t)rows * nt * sizeof(float));
        fp8_unpack_rows(wq, ws, recv_c[r], NULL, rows, C);
        uint8_t *gq = gt_host_bytes(duq[r], (size_t)rows * C);
        float *gs = gt_host_f32(dus[r], (size_t)rows * nt);
        snprintf(what, sizeof what, "fp8 payload P %d C %d (%zu BF16 a row) cap %d: rank %d codes (%d rows)", P, C,
                 pb / 2, c->capacity, r, rows);
        gt_check_bits(what, gq, wq, (size_t)rows * C, 1);
        snprintf(what, sizeof what, "fp8 payload P %d C %d cap %d: rank %d scales", P, C, c->capacity, r);
        gt_check_bits(what, gs, ws, (size_t)rows * nt, 4);
        free(wq); free(ws); free(gq); free(gs);
    }
    for (int r = 0; r < P; r++) {
        void *d[] = {dxp[r], dq[r], ds[r], dpay[r], drecv[r], duq[r], dus[r], doff[r], dplan[r]};
        for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) cuda_free(d[i]);
        free(pay[r]); free(recv_c[r]);
    }
    cuda_free(recv_tab);
    free(q); free(sc); free(xb);
    eh_free(c, rk);
}

// ---- the expert layer through the Ops table ---------------------------------

typedef struct {
    void *xp, *dy, *ey, *dxp;           // [R][D] act, this rank's rows in expert order
    void *recv, *out, *dout, *dxl;      // [max_rows][D] act (recv, out, dout, dxl: the symmetric buffers)
    void *eg, *eu, *ea, *dea, *deg, *deu; // [max_rows][F] act
    void *wg, *wu, *wd;                 // [El][F][D], [El][F][D], [El][D][F] act
    float *dwg, *dwu, *dwd, *dropped;
    int *offsets, *window, *plan;
} LRank;

typedef struct {
    const Ops *o;
    LRank *r;
    int **wtab;
    void **recv_tab, **out_tab, **dout_tab, **dxl_tab;
} LSet;

static void up_act(const Ops *o, void *dst, const float *src, size_t n) {
    if (o->act_bytes == 4) { o->to_device(dst, src, n * 4); return; }
    uint16_t *b = gt_malloc(n * 2);
    for (size_t i = 0; i < n; i++) b[i] = f2bf(src[i]);
    o->to_device(dst, b, n * 2);
    free(b);
}
static float *down_act(const Ops *o, const void *src, size_t n) {
    float *f = gt_malloc(n * 4);
    if (o->act_bytes == 4) { o->to_host(f, src, n * 4); return f; }
    uint16_t *b = gt_malloc(n * 2);
    o->to_host(b, src, n * 2);
    for (size_t i = 0; i < n; i++) f[i] = bf2f(b[i]);
    free(b);
    return f;
}
static void *table(const Ops *o, void *const *p, int P) {
    void *t = o->alloc((size_t)P * sizeof(void *));
    o->to_device(t, p, (size_t)P * sizeof(void *));
    return t;
}

// inputs: rank r's rows, output grads and weights, all BF16 values
static void lset_init(LSet *ls, const Ops *o, const EpSymCase *c, EpSymRank *rk, float *const *dy, float *const *w,
                      int F) {
    int P = c->P, R = c->N * c->k, D = c->C, El = c->E / P, M = c->max_rows;
    size_t a = o->act_bytes, wn = (size_t)El * F * D;
    ls->o = o;
    ls->r = calloc(P, sizeof(LRank));
    void *recv[P], *out[P], *dout[P], *dxl[P];
    int *win[P];
    for (int q = 0; q < P; q++) {
        LRank *x = &ls->r[q];
        x->xp = o->alloc((size_t)R * D * a); x->dy = o->alloc((size_t)R * D * a);
        x->ey = o->alloc((size_t)R * D * a); x->dxp = o->alloc((size_t)R * D * a);
        x->recv = o->alloc((size_t)M * D * a); x->out = o->alloc((size_t)M * D * a);
        x->dout = o->alloc((size_t)M * D * a); x->dxl = o->alloc((size_t)M * D * a);
        x->eg = o->alloc((size_t)M * F * a); x->eu = o->alloc((size_t)M * F * a); x->ea = o->alloc((size_t)M * F * a);
        x->dea = o->alloc((size_t)M * F * a); x->deg = o->alloc((size_t)M * F * a); x->deu = o->alloc((size_t)M * F * a);
        x->wg = o->alloc(wn * a); x->wu = o->alloc(wn * a); x->wd = o->alloc(wn * a);
        x->dwg = o->alloc(wn * 4); x->dwu = o->alloc(wn * 4); x->dwd = o->alloc(wn * 4);
        x->dropped = o->alloc(4);
        x->offsets = o->alloc((c->E + 1) * sizeof(int));
        x->window = o->alloc((size_t)P * c->E * sizeof(int));
        x->plan = o->alloc(ep_sym_plan_ints(P, c->E) * sizeof(int));
        up_act(o, x->xp, rk[q].xp, (size_t)R * D);
        up_act(o, x->dy, dy[q], (size_t)R * D);
        up_act(o, x->wg, w[q], wn); up_act(o, x->wu, w[q] + wn, wn); up_act(o, x->wd, w[q] + 2 * wn, wn);
        o->to_device(x->offsets, rk[q].offsets, (c->E + 1) * sizeof(int));
        recv[q] = x->recv; out[q] = x->out; dout[q] = x->dout; dxl[q] = x->dxl; win[q] = x->window;
    }
    ls->wtab = table(o, (void *const *)win, P);
    ls->recv_tab = table(o, recv, P); ls->out_tab = table(o, out, P);
    ls->dout_tab = table(o, dout, P); ls->dxl_tab = table(o, dxl, P);
}

static void lset_free(LSet *ls, int P) {
    const Ops *o = ls->o;
    for (int q = 0; q < P; q++) {
        LRank *x = &ls->r[q];
        void *b[] = {x->xp, x->dy, x->ey, x->dxp, x->recv, x->out, x->dout, x->dxl, x->eg, x->eu, x->ea, x->dea,
                     x->deg, x->deu, x->wg, x->wu, x->wd, x->dwg, x->dwu, x->dwd, x->dropped, x->offsets,
                     x->window, x->plan};
        for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) o->free(b[i]);
    }
    o->free(ls->wtab); o->free(ls->recv_tab); o->free(ls->out_tab); o->free(ls->dout_tab); o->free(ls->dxl_tab);
    free(ls->r);
}

// The layer, phase by phase over the ranks (the order is the barrier).
static void layer(LSet *ls, const EpSymCase *c, int F) {
    const Ops *o = ls->o;
    int P = c->P, R = c->N * c->k, D = c->C, E = c->E, El = E / P, M = c->max_rows;
    for (int r = 0; r < P; r++) o->zero(ls->r[r].dropped, 4);
    for (int r = 0; r < P; r++) o->ep_sym_write_counts(ls->wtab, ls->r[r].offsets, P, r, E);
    for (int r = 0; r < P; r++)
        o->ep_sym_plan(ls->r[r].plan, ls->r[r].dropped, ls->r[r].window, P, r, E, c->capacity, M);
    for (int r = 0; r < P; r++) o->ep_sym_dispatch(ls->recv_tab, ls->r[r].plan, ls->r[r].offsets, ls->r[r].xp, P, E, R, D);
    for (int q = 0; q < P; q++) {
        LRank *x = &ls->r[q];
        const int *lo = ep_sym_recv_offsets(x->plan, E);
        o->grouped_matmul_forward(x->eg, x->recv, x->wg, lo, El, D, F);
        o->grouped_matmul_forward(x->eu, x->recv, x->wu, lo, El, D, F);
        o->swiglu_forward_rows(x->ea, x->eg, x->eu, lo + El, M, F);
        o->grouped_matmul_forward(x->out, x->ea, x->wd, lo, El, F, D);
    }
    for (int r = 0; r < P; r++) o->ep_sym_combine(ls->r[r].ey, ls->out_tab, ls->r[r].plan, ls->r[r].offsets, P, E, R, D);
    // backward
    for (int r = 0; r < P; r++) o->ep_sym_dispatch(ls->dout_tab, ls->r[r].plan, ls->r[r].offsets, ls->r[r].dy, P, E, R, D);
    for (int q = 0; q < P; q++) {
        LRank *x = &ls->r[q];
        const int *lo = ep_sym_recv_offsets(x->plan, E);
        o->grouped_matmul_backward(x->dea, x->dwd, x->dout, x->ea, x->wd, lo, El, F, D, 0);
        o->swiglu_backward_rows(x->deg, x->deu, x->dea, x->eg, x->eu, lo + El, M, F);
        o->grouped_matmul_backward(NULL, x->dwg, x->deg, x->recv, x->wg, lo, El, D, F, 0);
        o->grouped_matmul_backward(NULL, x->dwu, x->deu, x->recv, x->wu, lo, El, D, F, 0);
        o->grouped_dgrad_pair(x->dxl, x->deg, x->wg, x->deu, x->wu, lo, El, D, F);
    }
    for (int r = 0; r < P; r++) o->ep_sym_combine(ls->r[r].dxp, ls->dxl_tab, ls->r[r].plan, ls->r[r].offsets, P, E, R, D);
}

static void compare_sets(const char *tag, LSet *g, LSet *h, const EpSymCase *c, int F) {
    int P = c->P, R = c->N * c->k, D = c->C, El = c->E / P;
    size_t wn = (size_t)El * F * D, pn = ep_sym_plan_ints(P, c->E);
    char what[160];
    for (int q = 0; q < P; q++) {
        LRank *a = &g->r[q], *b = &h->r[q];
        int *pa = gt_malloc(pn * 4), *pb = gt_malloc(pn * 4);
        g->o->to_host(pa, a->plan, pn * 4); h->o->to_host(pb, b->plan, pn * 4);
        snprintf(what, sizeof what, "%s rank %d plan", tag, q);
        gt_check_int(what, pa, pb, pn);
        float da, db;
        g->o->to_host(&da, a->dropped, 4); h->o->to_host(&db, b->dropped, 4);
        gt_ok(da == db, "%s rank %d dropped %g (CPU %g)", tag, q, da, db);
        struct { const char *n; void *x, *y; size_t len; int act; } t[] = {
            {"expert outputs combined", a->ey, b->ey, (size_t)R * D, 1},
            {"input grads combined", a->dxp, b->dxp, (size_t)R * D, 1},
            {"down weight grads", a->dwd, b->dwd, wn, 0},
            {"gate weight grads", a->dwg, b->dwg, wn, 0},
            {"up weight grads", a->dwu, b->dwu, wn, 0},
        };
        for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
            float *x, *y;
            if (t[i].act) { x = down_act(g->o, t[i].x, t[i].len); y = down_act(h->o, t[i].y, t[i].len); }
            else {
                x = gt_malloc(t[i].len * 4); y = gt_malloc(t[i].len * 4);
                g->o->to_host(x, t[i].x, t[i].len * 4); h->o->to_host(y, t[i].y, t[i].len * 4);
            }
            snprintf(what, sizeof what, "%s rank %d %s", tag, q, t[i].n);
            // BF16 rows and weights, BF16 intermediates (eg, eu, ea, dea, deg,
            // deu) on the GPU against FP32 on the CPU, FP32 sums in another order
            gt_check(what, x, y, t[i].len, 2e-2);
            free(x); free(y);
        }
        free(pa); free(pb);
    }
}

static void run_layer_case(const EpSymCase *c, int F) {
    int P = c->P, R = c->N * c->k, D = c->C, El = c->E / P;
    size_t wn = (size_t)El * F * D;
    EpSymRank *rk = eh_alloc(c);
    float *dy[P], *w[P];
    uint64_t s = c->seed * 7 + 3;
    for (int r = 0; r < P; r++) {
        for (size_t i = 0; i < (size_t)R * D; i++) rk[r].xp[i] = bf2f(f2bf(rk[r].xp[i]));
        dy[r] = gt_malloc((size_t)R * D * 4);
        w[r] = gt_malloc(3 * wn * 4);
        for (size_t i = 0; i < (size_t)R * D; i++) dy[r][i] = bf2f(f2bf(gt_uniform(&s)));
        for (size_t i = 0; i < 3 * wn; i++) w[r][i] = bf2f(f2bf(0.2f * gt_uniform(&s)));
    }
    LSet gpu, cpu;
    lset_init(&gpu, &ops_cuda, c, rk, dy, w, F);
    lset_init(&cpu, &ops_cpu, c, rk, dy, w, F);
    for (int q = 0; q < P; q++) { // every output written: poison the GPU's
        LRank *x = &gpu.r[q];
        gt_poison(x->ey, (size_t)R * D * 2); gt_poison(x->dxp, (size_t)R * D * 2);
        gt_poison(x->dwd, wn * 4); gt_poison(x->dwg, wn * 4); gt_poison(x->dwu, wn * 4);
    }
    layer(&cpu, c, F);
    layer(&gpu, c, F);
    cudaDeviceSynchronize();
    char tag[128];
    snprintf(tag, sizeof tag, "layer P %d %s cap %d rows %d", P, c->skewed ? "skewed" : "uniform", c->capacity,
             c->max_rows);
    compare_sets(tag, &gpu, &cpu, c, F);
    // the GPU's layer, forward and backward, as one graph
    char err[256] = "";
    ops_cuda.capture_begin();
    layer(&gpu, c, F);
    void *graph = ops_cuda.capture_end(err, sizeof err);
    if (gt_ok(graph != NULL, "%s: forward and backward capture as one CUDA graph %s", tag, err)) {
        for (int q = 0; q < P; q++) { gt_poison(gpu.r[q].ey, (size_t)R * D * 2); gt_poison(gpu.r[q].dxp, (size_t)R * D * 2); }
        ops_cuda.graph_launch(graph);
        cudaDeviceSynchronize();
        char gtag[160];
        snprintf(gtag, sizeof gtag, "%s graph", tag);
        compare_sets(gtag, &gpu, &cpu, c, F);
        ops_cuda.graph_free(graph);
    }
    lset_free(&gpu, P);
    lset_free(&cpu, P);
    for (int r = 0; r < P; r++) { free(dy[r]); free(w[r]); }
    eh_free(c, rk);
}

// ---- the copy rate ----------------------------------------------------------------

static double time_ms(void (*f)(void *), void *arg, int reps) {
    float ms[reps];
    cudaEvent_t a, b;
    cudaEventCreate(&a); cudaEventCreate(&b);
    for (int i = 0; i < 3; i++) f(arg);
    for (int i = 0; i < reps; i++) {
        cudaEventRecord(a, cuda_stream());
        f(arg);
        cudaEventRecord(b, cuda_stream());
        cudaEventSynchronize(b);
        cudaEventElapsedTime(&ms[i], a, b);
    }
    cudaEventDestroy(a); cudaEventDestroy(b);
    return gt_median(ms, reps);
}

typedef struct {
    const EpSymCase *c;
    DevRank *d;
    void **recv, **out;
    void *src, *dst;
    size_t bytes;
    int rank;
} BenchArg;
static void b_dispatch(void *p) {
    BenchArg *b = p;
    DevRank *d = &b->d[b->rank];
    ops_cuda.ep_sym_dispatch(b->recv, d->plan, d->offsets, d->xp, b->c->P, b->c->E, b->c->N * b->c->k, b->c->C);
}
static void b_combine(void *p) {
    BenchArg *b = p;
    DevRank *d = &b->d[b->rank];
    ops_cuda.ep_sym_combine(d->y, b->out, d->plan, d->offsets, b->c->P, b->c->E, b->c->N * b->c->k, b->c->C);
}
static void b_copy(void *p) {
    BenchArg *b = p;
    cudaMemcpyAsync(b->dst, b->src, b->bytes, cudaMemcpyDeviceToDevice, cuda_stream());
}

static void bench_rate(void) {
    // OLMoE-1B-7B: d 2048, 64 experts, top-8, 8,192 tokens per rank; 8 virtual ranks
    EpSymCase c = {8, 8192, 8, 64, 2048, 0, 0, 0, 77};
    c.max_rows = c.N * c.k * 2; // uniform routing: each rank receives ~N k rows
    int P = c.P, R = c.N * c.k, C = c.C;
    DevRank d[P];
    int *windows_h[P];
    void *recv_h[P];
    // uniform routing over the experts, rows in expert order
    int *offsets = gt_malloc((c.E + 1) * sizeof(int));
    for (int g = 0; g <= c.E; g++) offsets[g] = (int)((long)R * g / c.E);
    uint16_t *rows = gt_malloc((size_t)R * C * 2);
    for (size_t i = 0; i < (size_t)R * C; i++) rows[i] = 0x3c3c; // any finite BF16 value
    for (int r = 0; r < P; r++) dev_rank_alloc(&c, &d[r], offsets, rows, &windows_h[r], &recv_h[r]);
    free(rows);
    int **windows = gt_dev_bytes(windows_h, sizeof windows_h);
    void **recv = gt_dev_bytes(recv_h, sizeof recv_h);
    for (int r = 0; r < P; r++) ops_cuda.ep_sym_write_counts(windows, d[r].offsets, P, r, c.E);
    for (int r = 0; r < P; r++) ops_cuda.ep_sym_plan(d[r].plan, d[r].dropped, d[r].window, P, r, c.E, 0, c.max_rows);
    cudaDeviceSynchronize();
    size_t bytes = (size_t)R * C * 2;
    BenchArg b = {&c, d, recv, recv, d[1].xp, d[1].y, bytes, 0};
    int reps = 21;
    double t_copy = time_ms(b_copy, &b, reps), t_disp = time_ms(b_dispatch, &b, reps), t_comb = time_ms(b_combine, &b, reps);
    double gb = 2.0 * bytes / 1e9; // read + write
    printf("rate: %zu MiB of rows (%d x %d BF16), device-to-device copy %.3f ms = %.0f GB/s moved (read+write)\n",
           bytes >> 20, R, C, t_copy, gb / (t_copy * 1e-3));
    printf("rate: dispatch %.3f ms = %.0f GB/s (%.0f%% of the copy), combine %.3f ms = %.0f GB/s (%.0f%%)\n", t_disp,
           gb / (t_disp * 1e-3), 100 * t_copy / t_disp, t_comb, gb / (t_comb * 1e-3), 100 * t_copy / t_comb);
    gt_ok(t_copy / t_disp >= 0.7, "dispatch at >= 70%% of the device-to-device copy rate (%.0f%%)", 100 * t_copy / t_disp);
    gt_ok(t_copy / t_comb >= 0.7, "combine at >= 70%% of the device-to-device copy rate (%.0f%%)", 100 * t_copy / t_comb);
    for (int r = 0; r < P; r++) dev_rank_free(&d[r]);
    cuda_free(windows); cuda_free(recv); free(offsets);
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
    // FP8 payload rows: a narrow row (scalar copies) and a wide one, with and without drops
    for (int pi = 0; pi < 3; pi++)
        for (int ci = 0; ci < 2; ci++) {
            EpSymCase c = {Ps[pi], 128, 4, 16, ci ? 512 : 128, 0, 0, 1, 4000 + pi * 5 + ci};
            c.max_rows = c.N * c.k * c.P;
            if (ci) c.capacity = (int)ceil(0.75 * c.N * c.P * c.k / c.E);
            run_fp8_case(&c);
        }
    // the layer: small shapes, so that the CPU reference is quick
    for (int pi = 0; pi < 3; pi++)
        for (int skewed = 0; skewed <= 1; skewed++)
            for (int ci = 0; ci < 3; ci++) {
                EpSymCase c = {Ps[pi], 64, 4, 16, 64, 0, 0, skewed, 3000 + pi * 11 + ci * 3 + skewed};
                c.max_rows = c.N * c.k * c.P;
                if (ci == 1) c.capacity = (int)ceil(0.75 * c.N * c.P * c.k / c.E);  // capacity drops
                if (ci == 2) c.max_rows = c.N * c.k;  // dropless, bounded receive buffers
                run_layer_case(&c, 32);
            }
    if (!getenv("EP_SYM_NO_BENCH")) bench_rate();
    return gt_finish();
}
