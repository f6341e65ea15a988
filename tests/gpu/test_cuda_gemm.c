// The CUDA matrix products (src/ops/cuda/gemm.cu) against the CPU backend:
// dense matmul and router logits through cuBLASLt, and the grouped GEMM of
// the experts, forward and backward, on small odd shapes (tile edges in M,
// N and K, zero-row experts) and on OLMoE-1B-7B's (64 experts, 2048 -> 1024,
// 4096 tokens x top-8); then timings of the OLMoE shape against dense
// cuBLASLt of the same size.
//
// Each grouped op has two kernels: the Hopper wgmma one (grouped_wgmma.cu),
// which cuda_grouped_matmul_forward / _backward take first, and the
// mma.sync one (gemm.cu) they fall back to. main() sets
// device.cuda.grouped_gemm to mma_sync (cuda_configure), so the gemm.cu
// entry points run the fallback here, and the wgmma kernels are called directly through
// cuda_grouped_forward_wgmma, cuda_grouped_dgrad_wgmma and
// cuda_grouped_wgrad_wgmma: each grouped shape checks forward, data-grad
// and weight-grad of both against the CPU and against each other, and the
// timings print both.
//
// Tolerances (relative L2 error against the FP32 CPU result on the same
// BF16-representable inputs):
// - BF16 outputs: the GPU rounds each output to BF16 (8-bit mantissa,
//   relative error up to 2^-9, about 1.1e-3 RMS), on top of FP32 sums taken
//   in another order (~1e-6). 1e-2 leaves a margin of ~10 while a missed or
//   misplaced tile, k-step or expert costs far more (dropping one K-step of
//   32 out of 2048 already gives ~1.2e-1).
// - FP32 dw: products of BF16 inputs are exact in FP32 and only the order of
//   the sums differs (~1e-6), except in the router, whose FP32 dlogits are
//   rounded to BF16 before cuBLASLt (2^-9 per element); one bound of 1e-2 for
//   all dw, with the same reasoning about real bugs.
// - FP32 router logits: exact BF16 products summed in FP32: 1e-4.
// Accumulating outputs (dw +=, dinp with accumulate) start from the same
// random values on both sides; assigned outputs start as NaN on the GPU, so
// any element left unwritten fails.
#include "gpu_test_util.h"

#define TOL_BF16 1e-2
#define TOL_DW 1e-2
#define TOL_F32 1e-4

// grouped_wgmma.cu: 0 when it ran, -1 (nothing launched) when it does not take the shape or device
int cuda_grouped_forward_wgmma(void *out, const void *inp, const void *w, const int *offsets, int E, int C, int OC);
int cuda_grouped_dgrad_wgmma(void *dinp, const void *dout, const void *w, const int *offsets, int E, int C, int OC);
int cuda_grouped_wgrad_wgmma(float *dw, const void *dout, const void *inp, const int *offsets, int E, int C, int OC,
                             int accumulate);
int cuda_grouped_dgrad_pair_wgmma(void *dinp, const void *dout, const void *w, const void *dout2, const void *w2,
                                  const int *offsets, int E, int C, int OC);

static uint64_t count_rng = 0x9e3779b97f4a7c15ULL;
static double uniform01(void) {
    count_rng ^= count_rng << 13; count_rng ^= count_rng >> 7; count_rng ^= count_rng << 17;
    return (count_rng >> 11) / 9007199254740992.0;
}

// host floats into an existing device BF16 buffer
static void upload_bf16(void *d, const float *h, size_t n) {
    uint16_t *b = malloc(n * 2 + 2);
    for (size_t i = 0; i < n; i++) b[i] = f2bf(h[i]);
    cuda_to_device(d, b, n * 2);
    free(b);
}

static float *dup_f32(const float *x, size_t n) {
    float *y = malloc(n * sizeof(float) + 4);
    memcpy(y, x, n * sizeof(float));
    return y;
}

// gt_check, and on failure a breakdown: the relative error of each expert
// (row segment seg[e]..seg[e+1]; seg NULL: all rows) that fails, and the
// first elements far off, with their row and column.
static int check2d(const char *what, const float *got, const float *ref, int rows, int cols, const int *seg,
                   int nseg, double tol) {
    size_t n = (size_t)rows * cols;
    if (gt_check(what, got, ref, n, tol)) return 1;
    int whole[2] = {0, rows};
    if (!seg) { seg = whole; nseg = 1; }
    double rms = 0;
    for (size_t i = 0; i < n; i++) rms += (double)ref[i] * ref[i];
    rms = n ? sqrt(rms / n) : 0;
    int shown = 0;
    for (int s = 0; s < nseg && shown < 16; s++) {
        double d = 0, r = 0;
        size_t bad = 0;
        for (size_t i = (size_t)seg[s] * cols; i < (size_t)seg[s + 1] * cols; i++) {
            if (!isfinite(got[i])) { bad++; continue; }
            d += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
            r += (double)ref[i] * ref[i];
        }
        double err = r > 0 ? sqrt(d / r) : sqrt(d);
        if (bad || err > tol) {
            printf("      %s %d (rows %d..%d): rel err %.3e, %zu not finite\n", nseg > 1 ? "expert" : "segment", s,
                   seg[s], seg[s + 1] - 1, err, bad);
            shown++;
        }
    }
    shown = 0;
    for (size_t i = 0; i < n && shown < 8; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!isfinite(got[i]) || d > 0.1 * rms + 1e-6) {
            printf("      [row %zu, col %zu] got %.6g want %.6g\n", i / cols, i % cols, got[i], ref[i]);
            shown++;
        }
    }
    return 0;
}

// ---- dense -------------------------------------------------------------------

static void test_matmul(int N, int C, int OC) {
    printf("-- matmul N=%d C=%d OC=%d\n", N, C, OC);
    fflush(stdout);
    char what[128];
    size_t nin = (size_t)N * C, nw = (size_t)OC * C, nout = (size_t)N * OC;
    float *inp = gt_rand(nin, 1.0f), *w = gt_rand(nw, 1.0f / sqrtf((float)C)), *dout = gt_rand(nout, 1.0f);
    float *dinp0 = gt_rand(nin, 1.0f), *dw0 = gt_rand(nw, 1.0f); // prefills for +=
    void *d_inp = gt_dev_bf16(inp, nin), *d_w = gt_dev_bf16(w, nw), *d_dout = gt_dev_bf16(dout, nout);
    void *d_out = cuda_alloc(nout * 2), *d_dinp = cuda_alloc(nin * 2);
    float *d_dw = cuda_alloc(nw * 4);

    // forward
    float *ref = malloc(nout * 4 + 4);
    ops_cpu.matmul_forward(ref, inp, w, N, C, OC);
    gt_poison(d_out, nout * 2);
    cuda_matmul_forward(d_out, d_inp, d_w, N, C, OC);
    float *got = gt_host_bf16(d_out, nout);
    snprintf(what, sizeof what, "matmul_forward out N=%d C=%d OC=%d", N, C, OC);
    check2d(what, got, ref, N, OC, NULL, 0, TOL_BF16);
    free(ref); free(got);

    for (int acc = 0; acc <= 1; acc++) {
        float *dinp_ref = acc ? dup_f32(dinp0, nin) : malloc(nin * 4 + 4), *dw_ref = dup_f32(dw0, nw);
        ops_cpu.matmul_backward(dinp_ref, dw_ref, dout, inp, w, N, C, OC, acc);
        // 0: both grads, 1: dinp only (dw NULL), 2: dw only (dinp NULL; once)
        for (int variant = 0; variant < (acc ? 2 : 3); variant++) {
            int want_dinp = variant != 2, want_dw = variant != 1;
            if (want_dinp) {
                if (acc) upload_bf16(d_dinp, dinp0, nin);
                else gt_poison(d_dinp, nin * 2);
            }
            if (want_dw) cuda_to_device(d_dw, dw0, nw * 4);
            cuda_matmul_backward(want_dinp ? d_dinp : NULL, want_dw ? d_dw : NULL, d_dout, d_inp, d_w, N, C, OC,
                                 acc);
            const char *v = variant == 0 ? "" : variant == 1 ? ", dw NULL" : ", dinp NULL";
            if (want_dinp) {
                got = gt_host_bf16(d_dinp, nin);
                snprintf(what, sizeof what, "matmul_backward dinp acc=%d%s", acc, v);
                check2d(what, got, dinp_ref, N, C, NULL, 0, TOL_BF16);
                free(got);
            }
            if (want_dw) {
                got = gt_host_f32(d_dw, nw);
                snprintf(what, sizeof what, "matmul_backward dw += acc=%d%s", acc, v);
                check2d(what, got, dw_ref, OC, C, NULL, 0, TOL_DW);
                free(got);
            }
        }
        free(dinp_ref); free(dw_ref);
    }
    cuda_free(d_inp); cuda_free(d_w); cuda_free(d_dout); cuda_free(d_out); cuda_free(d_dinp); cuda_free(d_dw);
    free(inp); free(w); free(dout); free(dinp0); free(dw0);
}

static void test_router(int N, int C, int E) {
    printf("-- router logits N=%d C=%d E=%d\n", N, C, E);
    fflush(stdout);
    char what[128];
    size_t nin = (size_t)N * C, nw = (size_t)E * C, nl = (size_t)N * E;
    float *inp = gt_rand(nin, 1.0f), *w = gt_rand(nw, 1.0f / sqrtf((float)C));
    // dlogits are FP32 in the model and not BF16-representable: the GPU's
    // rounding of them is part of what is tested
    float *dl = malloc(nl * 4 + 4);
    for (size_t i = 0; i < nl; i++) dl[i] = gt_randn();
    float *dinp0 = gt_rand(nin, 1.0f), *dw0 = gt_rand(nw, 1.0f);
    void *d_inp = gt_dev_bf16(inp, nin), *d_w = gt_dev_bf16(w, nw);
    float *d_dl = gt_dev_bytes(dl, nl * 4), *d_logits = cuda_alloc(nl * 4);

    float *ref = malloc(nl * 4 + 4);
    ops_cpu.router_logits_forward(ref, inp, w, N, C, E);
    gt_poison(d_logits, nl * 4);
    cuda_router_logits_forward(d_logits, d_inp, d_w, N, C, E);
    float *got = gt_host_f32(d_logits, nl);
    snprintf(what, sizeof what, "router_logits_forward N=%d C=%d E=%d", N, C, E);
    check2d(what, got, ref, N, E, NULL, 0, TOL_F32);
    free(ref); free(got);

    float *dinp_ref = dup_f32(dinp0, nin), *dw_ref = dup_f32(dw0, nw);
    ops_cpu.router_logits_backward(dinp_ref, dw_ref, dl, inp, w, N, C, E);
    for (int variant = 0; variant < 3; variant++) { // both, dw NULL, dinp NULL
        int want_dinp = variant != 2, want_dw = variant != 1;
        void *d_dinp = want_dinp ? gt_dev_bf16(dinp0, nin) : NULL;
        float *d_dw = want_dw ? gt_dev_bytes(dw0, nw * 4) : NULL;
        cuda_router_logits_backward(d_dinp, d_dw, d_dl, d_inp, d_w, N, C, E);
        const char *v = variant == 0 ? "" : variant == 1 ? ", dw NULL" : ", dinp NULL";
        if (want_dinp) {
            got = gt_host_bf16(d_dinp, nin);
            snprintf(what, sizeof what, "router_logits_backward dinp +=%s", v);
            check2d(what, got, dinp_ref, N, C, NULL, 0, TOL_BF16);
            free(got);
            cuda_free(d_dinp);
        }
        if (want_dw) {
            got = gt_host_f32(d_dw, nw);
            snprintf(what, sizeof what, "router_logits_backward dw +=%s", v);
            check2d(what, got, dw_ref, E, C, NULL, 0, TOL_DW);
            free(got);
            cuda_free(d_dw);
        }
    }
    free(dinp_ref); free(dw_ref);
    cuda_free(d_inp); cuda_free(d_w); cuda_free(d_dl); cuda_free(d_logits);
    free(inp); free(w); free(dl); free(dinp0); free(dw0);
}

// ---- grouped -------------------------------------------------------------------

typedef struct {
    int E, C, OC, R;
    int *offsets; // host, E+1
    int *d_offsets;
    void *d_inp, *d_w, *d_dout, *d_out, *d_dinp;
    float *d_dw;
} Grouped;

static double median_ms(float *ms, int n) {
    for (int i = 1; i < n; i++) // insertion sort
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) { float t = ms[j]; ms[j] = ms[j - 1]; ms[j - 1] = t; }
    return n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
}

enum { T_GFWD, T_GFWD_WGMMA, T_GDGRAD, T_GDGRAD_WGMMA, T_GWGRAD, T_GWGRAD_WGMMA, T_DFWD, T_DDGRAD, T_DWGRAD };
static const char *timed_name[] = {"grouped forward (mma.sync)", "grouped forward (wgmma)",
                                   "grouped data-grad (mma.sync)", "grouped data-grad (wgmma)",
                                   "grouped weight-grad (mma.sync)", "grouped weight-grad (wgmma)",
                                   "dense cuBLASLt forward", "dense cuBLASLt data-grad",
                                   "dense cuBLASLt weight-grad"};

static void run_timed(const Grouped *g, int op) {
    switch (op) {
    case T_GFWD: cuda_grouped_matmul_forward(g->d_out, g->d_inp, g->d_w, g->d_offsets, g->E, g->C, g->OC); break;
    case T_GFWD_WGMMA:
        cuda_grouped_forward_wgmma(g->d_out, g->d_inp, g->d_w, g->d_offsets, g->E, g->C, g->OC);
        break;
    case T_GDGRAD:
        cuda_grouped_matmul_backward(g->d_dinp, NULL, g->d_dout, g->d_inp, g->d_w, g->d_offsets, g->E, g->C, g->OC, 1);
        break;
    case T_GDGRAD_WGMMA:
        cuda_grouped_dgrad_wgmma(g->d_dinp, g->d_dout, g->d_w, g->d_offsets, g->E, g->C, g->OC);
        break;
    case T_GWGRAD:
        cuda_grouped_matmul_backward(NULL, g->d_dw, g->d_dout, g->d_inp, g->d_w, g->d_offsets, g->E, g->C, g->OC, 1);
        break;
    case T_GWGRAD_WGMMA:
        cuda_grouped_wgrad_wgmma(g->d_dw, g->d_dout, g->d_inp, g->d_offsets, g->E, g->C, g->OC, 1);
        break;
    // dense over all R rows with expert 0's weights: the same FLOPs in one GEMM
    case T_DFWD: cuda_matmul_forward(g->d_out, g->d_inp, g->d_w, g->R, g->C, g->OC); break;
    case T_DDGRAD: cuda_matmul_backward(g->d_dinp, NULL, g->d_dout, g->d_inp, g->d_w, g->R, g->C, g->OC, 0); break;
    case T_DWGRAD: cuda_matmul_backward(NULL, g->d_dw, g->d_dout, g->d_inp, g->d_w, g->R, g->C, g->OC, 0); break;
    }
}

// Median of 10 timed runs after 3 warm-ups; prints TFLOP/s at 2 R C OC.
// wgmma_ok[0..2]: whether the wgmma forward, data-grad, weight-grad took the shape.
static void time_grouped(const Grouped *g, const char *label, const int *wgmma_ok) {
    double flops = 2.0 * g->R * g->C * g->OC;
    for (int op = T_GFWD; op <= T_DWGRAD; op++) {
        if ((op == T_GFWD_WGMMA && !wgmma_ok[0]) || (op == T_GDGRAD_WGMMA && !wgmma_ok[1]) ||
            (op == T_GWGRAD_WGMMA && !wgmma_ok[2])) {
            printf("time %-28s %s: not taken for this shape/device\n", timed_name[op], label);
            continue;
        }
        for (int i = 0; i < 3; i++) run_timed(g, op);
        float ms[10];
        for (int i = 0; i < 10; i++) {
            void *t0 = cuda_event_record();
            run_timed(g, op);
            void *t1 = cuda_event_record();
            ms[i] = cuda_event_elapsed_ms(t0, t1);
        }
        double med = median_ms(ms, 10);
        printf("time %-28s %s: %8.3f ms  %6.1f TFLOP/s\n", timed_name[op], label, med, flops / (med * 1e-3) / 1e12);
        fflush(stdout);
    }
}

static void test_grouped(const char *label, int E, int C, int OC, const int *counts, int timed) {
    Grouped g = {.E = E, .C = C, .OC = OC};
    g.offsets = malloc((E + 1) * sizeof(int));
    g.offsets[0] = 0;
    int zero = 0, maxc = 0;
    for (int e = 0; e < E; e++) {
        g.offsets[e + 1] = g.offsets[e] + counts[e];
        zero += counts[e] == 0;
        if (counts[e] > maxc) maxc = counts[e];
    }
    int R = g.R = g.offsets[E];
    printf("-- grouped %s: E=%d C=%d OC=%d R=%d (%d experts empty, largest %d rows)\n", label, E, C, OC, R, zero,
           maxc);
    fflush(stdout);
    char what[160];
    size_t nin = (size_t)R * C, nw = (size_t)E * OC * C, nout = (size_t)R * OC;
    float *inp = gt_rand(nin, 1.0f), *w = gt_rand(nw, 1.0f / sqrtf((float)C)), *dout = gt_rand(nout, 1.0f);
    float *dw0 = gt_rand(nw, 1.0f);
    g.d_offsets = gt_dev_bytes(g.offsets, (E + 1) * sizeof(int));
    g.d_inp = gt_dev_bf16(inp, nin);
    g.d_w = gt_dev_bf16(w, nw);
    g.d_dout = gt_dev_bf16(dout, nout);
    g.d_out = cuda_alloc(nout * 2);
    g.d_dinp = cuda_alloc(nin * 2);
    g.d_dw = cuda_alloc(nw * 4);
    int *dw_seg = malloc((E + 1) * sizeof(int)); // dw as [E*OC, C]: a segment per expert
    for (int e = 0; e <= E; e++) dw_seg[e] = e * OC;

    // forward
    float *ref = malloc(nout * 4 + 4), *got;
    int wgmma_ok = 0;
    ops_cpu.grouped_matmul_forward(ref, inp, w, g.offsets, E, C, OC);
    if (R > 0) {
        gt_poison(g.d_out, nout * 2);
        cuda_grouped_matmul_forward(g.d_out, g.d_inp, g.d_w, g.d_offsets, E, C, OC);
        got = gt_host_bf16(g.d_out, nout);
        snprintf(what, sizeof what, "grouped forward out (%s)", label);
        check2d(what, got, ref, R, OC, g.offsets, E, TOL_BF16);
        // the wgmma kernel, against the CPU and the fallback's result `got`
        gt_poison(g.d_out, nout * 2);
        wgmma_ok = cuda_grouped_forward_wgmma(g.d_out, g.d_inp, g.d_w, g.d_offsets, E, C, OC) == 0;
        if (wgmma_ok) {
            float *got2 = gt_host_bf16(g.d_out, nout);
            snprintf(what, sizeof what, "grouped forward wgmma out (%s)", label);
            check2d(what, got2, ref, R, OC, g.offsets, E, TOL_BF16);
            snprintf(what, sizeof what, "grouped forward wgmma vs mma.sync (%s)", label);
            check2d(what, got2, got, R, OC, g.offsets, E, TOL_BF16);
            free(got2);
        } else {
            printf("      (wgmma forward does not take this shape/device)\n");
        }
        free(got);
    } else { // nothing to write: must still run and leave nothing behind
        cuda_grouped_matmul_forward(g.d_out, g.d_inp, g.d_w, g.d_offsets, E, C, OC);
        wgmma_ok = cuda_grouped_forward_wgmma(g.d_out, g.d_inp, g.d_w, g.d_offsets, E, C, OC) == 0;
        cuda_synchronize();
    }
    free(ref);

    // backward: both, dw NULL, dinp NULL against one CPU reference
    float *dinp_ref = malloc(nin * 4 + 4), *dw_ref = dup_f32(dw0, nw);
    ops_cpu.grouped_matmul_backward(dinp_ref, dw_ref, dout, inp, w, g.offsets, E, C, OC, 1);
    for (int variant = 0; variant < 3; variant++) {
        int want_dinp = variant != 2, want_dw = variant != 1;
        if (want_dinp) gt_poison(g.d_dinp, nin * 2);
        if (want_dw) cuda_to_device(g.d_dw, dw0, nw * 4);
        cuda_grouped_matmul_backward(want_dinp ? g.d_dinp : NULL, want_dw ? g.d_dw : NULL, g.d_dout, g.d_inp, g.d_w,
                                     g.d_offsets, E, C, OC, 1);
        cuda_synchronize();
        const char *v = variant == 0 ? "" : variant == 1 ? ", dw NULL" : ", dinp NULL";
        if (want_dinp && R > 0) {
            got = gt_host_bf16(g.d_dinp, nin);
            snprintf(what, sizeof what, "grouped backward dinp (%s%s)", label, v);
            check2d(what, got, dinp_ref, R, C, g.offsets, E, TOL_BF16);
            free(got);
        }
        if (want_dw) {
            got = gt_host_f32(g.d_dw, nw);
            snprintf(what, sizeof what, "grouped backward dw += (%s%s)", label, v);
            check2d(what, got, dw_ref, E * OC, C, dw_seg, E, TOL_DW);
            free(got);
        }
    }

    // dw = (accumulate 0, the first micro-batch of a step) over poison: the
    // CPU's product alone (experts without rows: zeros), and the same bits as
    // += into zeros on the GPU
    {
        float *zeros = calloc(nw ? nw : 1, 4), *ref0 = calloc(nw ? nw : 1, 4);
        ops_cpu.grouped_matmul_backward(NULL, ref0, dout, inp, w, g.offsets, E, C, OC, 0);
        cuda_to_device(g.d_dw, zeros, nw * 4);
        cuda_grouped_matmul_backward(NULL, g.d_dw, g.d_dout, g.d_inp, g.d_w, g.d_offsets, E, C, OC, 1);
        cuda_synchronize();
        float *added = gt_host_f32(g.d_dw, nw);
        gt_poison(g.d_dw, nw * 4);
        cuda_grouped_matmul_backward(NULL, g.d_dw, g.d_dout, g.d_inp, g.d_w, g.d_offsets, E, C, OC, 0);
        cuda_synchronize();
        got = gt_host_f32(g.d_dw, nw);
        snprintf(what, sizeof what, "grouped backward dw = (%s)", label);
        check2d(what, got, ref0, E * OC, C, dw_seg, E, TOL_DW);
        int same = memcmp(got, added, nw * 4) == 0;
        printf("%s grouped backward dw = is += into zeros, bit for bit (%s)\n", same ? "ok  " : "FAIL", label);
        if (same) gt_pass++; else gt_fail++;
        free(got); free(added); free(zeros); free(ref0);
    }

    // the wgmma backward kernels, called directly: against the CPU and
    // against the mma.sync kernels' results (run again here, variant 0)
    int ok[3] = {wgmma_ok, 0, 0};
    {
        float *fb_dinp = NULL, *fb_dw;
        if (R > 0) gt_poison(g.d_dinp, nin * 2);
        cuda_to_device(g.d_dw, dw0, nw * 4);
        cuda_grouped_matmul_backward(R > 0 ? g.d_dinp : NULL, g.d_dw, g.d_dout, g.d_inp, g.d_w, g.d_offsets, E, C, OC, 1);
        cuda_synchronize();
        if (R > 0) fb_dinp = gt_host_bf16(g.d_dinp, nin);
        fb_dw = gt_host_f32(g.d_dw, nw);

        if (R > 0) gt_poison(g.d_dinp, nin * 2);
        ok[1] = cuda_grouped_dgrad_wgmma(g.d_dinp, g.d_dout, g.d_w, g.d_offsets, E, C, OC) == 0;
        cuda_synchronize();
        if (!ok[1]) {
            printf("      (wgmma data-grad does not take this shape/device)\n");
        } else if (R > 0) {
            got = gt_host_bf16(g.d_dinp, nin);
            snprintf(what, sizeof what, "grouped backward wgmma dinp (%s)", label);
            check2d(what, got, dinp_ref, R, C, g.offsets, E, TOL_BF16);
            snprintf(what, sizeof what, "grouped backward wgmma dinp vs mma.sync (%s)", label);
            check2d(what, got, fb_dinp, R, C, g.offsets, E, TOL_BF16);
            free(got);
        } else {
            printf("      (wgmma data-grad ran with no rows: nothing to check)\n");
        }

        cuda_to_device(g.d_dw, dw0, nw * 4);
        ok[2] = cuda_grouped_wgrad_wgmma(g.d_dw, g.d_dout, g.d_inp, g.d_offsets, E, C, OC, 1) == 0;
        cuda_synchronize();
        if (!ok[2]) {
            printf("      (wgmma weight-grad does not take this shape/device)\n");
        } else { // with no rows, dw must come back as prefilled
            got = gt_host_f32(g.d_dw, nw);
            snprintf(what, sizeof what, "grouped backward wgmma dw += (%s)", label);
            check2d(what, got, dw_ref, E * OC, C, dw_seg, E, TOL_DW);
            snprintf(what, sizeof what, "grouped backward wgmma dw += vs mma.sync (%s)", label);
            check2d(what, got, fb_dw, E * OC, C, dw_seg, E, TOL_DW);
            free(got);
        }
        free(fb_dinp); free(fb_dw);
    }
    free(dinp_ref); free(dw_ref);

    // the data-grad pair dout w_e + dout2 w2_e (the experts' gate and up):
    // the entry point (the mma.sync fallback here: assign, then accumulate)
    // and the wgmma kernel (one product over both K ranges), against the CPU
    if (R > 0) {
        float *w2 = gt_rand(nw, 1.0f / sqrtf((float)C)), *dout2 = gt_rand(nout, 1.0f);
        void *d_w2 = gt_dev_bf16(w2, nw), *d_dout2 = gt_dev_bf16(dout2, nout);
        float *pair_ref = malloc(nin * 4 + 4);
        ops_cpu.grouped_dgrad_pair(pair_ref, dout, w, dout2, w2, g.offsets, E, C, OC);
        for (int k = 0; k < 2; k++) {
            gt_poison(g.d_dinp, nin * 2);
            int ran = 1;
            if (k == 0) cuda_grouped_dgrad_pair(g.d_dinp, g.d_dout, g.d_w, d_dout2, d_w2, g.d_offsets, E, C, OC);
            else ran = cuda_grouped_dgrad_pair_wgmma(g.d_dinp, g.d_dout, g.d_w, d_dout2, d_w2, g.d_offsets, E, C,
                                                     OC) == 0;
            cuda_synchronize();
            if (!ran) { printf("      (wgmma data-grad pair does not take this shape/device)\n"); continue; }
            got = gt_host_bf16(g.d_dinp, nin);
            snprintf(what, sizeof what, "grouped data-grad pair %s (%s)", k ? "wgmma" : "mma.sync", label);
            check2d(what, got, pair_ref, R, C, g.offsets, E, TOL_BF16);
            free(got);
        }
        free(pair_ref); free(w2); free(dout2);
        cuda_free(d_w2); cuda_free(d_dout2);
    }

    if (timed) time_grouped(&g, label, ok);

    cuda_free(g.d_offsets); cuda_free(g.d_inp); cuda_free(g.d_w); cuda_free(g.d_dout);
    cuda_free(g.d_out); cuda_free(g.d_dinp); cuda_free(g.d_dw);
    free(g.offsets); free(dw_seg); free(inp); free(w); free(dout); free(dw0);
}

// R rows spread over E experts with random weights in [0.2, 2], none for
// the experts listed in zero[].
static void uneven_counts(int *counts, int E, int R, const int *zero, int nzero) {
    double *cum = malloc(E * sizeof(double)), total = 0;
    for (int e = 0; e < E; e++) {
        double wgt = 0.2 + 1.8 * uniform01();
        for (int z = 0; z < nzero; z++) if (zero[z] == e) wgt = 0;
        cum[e] = total += wgt;
        counts[e] = 0;
    }
    for (int r = 0; r < R; r++) {
        double u = uniform01() * total;
        int e = 0;
        while (e < E - 1 && u >= cum[e]) e++; // skips empty experts: their cum equals the previous
        counts[e]++;
    }
    free(cum);
}

int main(void) {
    CudaSettings mma = cuda_settings_default(); // the gemm.cu entry points on mma.sync: see the header
    mma.grouped_gemm = CUDA_KERNELS_MMA_SYNC;
    cuda_configure(&mma);
    // dense: odd sizes (tails everywhere), then OLMoE's attention-sized GEMM
    test_matmul(37, 64, 96);
    test_matmul(37, 72, 40);
    test_matmul(4096, 2048, 1024);

    // grouped, small: rows not multiples of the 128-row tile, zero-row
    // experts first / inside / last, K (C=72, OC=40) not multiples of 32
    int small[] = {37, 0, 130, 1, 9};
    test_grouped("small", 5, 64, 96, small, 0);
    int tails[] = {0, 200, 3, 0};
    test_grouped("tails", 4, 72, 40, tails, 0);
    int one_row[] = {1};
    test_grouped("one row", 1, 8, 8, one_row, 0);
    int none[] = {0, 0, 0};
    test_grouped("no rows", 3, 64, 96, none, 0);
    // the wgmma kernel's 256-column tile with tails in every dimension:
    // K = 200 (3 x 64 + 8), OC = 264 (a second column tile with 8 columns),
    // rows around its 128-row tile and a zero-row expert
    int wide[] = {37, 0, 130, 1, 300};
    test_grouped("wide tails", 5, 200, 264, wide, 0);
    // the data-grad's 256-column tile (N = C = 328: a second column tile
    // with 72 columns) with K = OC = 136 (2 x 64 + 8): the TMA kernel reads
    // zeros past dout's columns and the last expert's weights
    int wide2[] = {300, 0, 77};
    test_grouped("wide tails, data-grad", 3, 328, 136, wide2, 0);

    // OLMoE: 64 experts, 2048 -> 1024, 4096 tokens x top-8, uneven with
    // empty experts (first, middle, last)
    int counts[64], zero[] = {0, 17, 40, 63};
    uneven_counts(counts, 64, 32768, zero, 4);
    test_grouped("olmoe uneven", 64, 2048, 1024, counts, 1);
    // all rows in one expert (the last, then the first)
    int last[8] = {0, 0, 0, 0, 0, 0, 0, 32768};
    test_grouped("E=8 all rows in expert 7", 8, 2048, 1024, last, 1);
    int first[8] = {4096, 0, 0, 0, 0, 0, 0, 0};
    test_grouped("E=8 all rows in expert 0", 8, 2048, 1024, first, 0);

    // router (E=60 last: a leading dimension that is not a multiple of 8)
    test_router(37, 64, 8);
    test_router(4096, 2048, 64);
    test_router(37, 72, 60);
    return gt_finish();
}
