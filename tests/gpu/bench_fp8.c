// The FP8 kernel table (issue 18): on the OLMoE-1B-7B expert shapes (64
// experts, d 2048, expert hidden 1024, top-8 of 8192 tokens with random
// routing: 65536 grouped rows), the FP8 block128 grouped GEMM forward beside
// the BF16 grouped forward (production: cuda_grouped_matmul_forward) on the
// same rows and offsets, and the quantisers. Each GEMM is validated in full
// against the CPU (BF16: ops_cpu's FP32 grouped product; FP8: the FP8
// reference on the same quantised operands) before it is timed.
// Timing: median of RUNS runs after WARMUP, CUDA events around the op alone;
// the BF16 kernel and the FP8 kernel's variants (fp8.cu) are timed in
// ROUNDS interleaved rounds (a first session saw the same kernel's time move
// by 15% between the start and the end of a run).
// Every operand (64-256 MB) is over 2 x L2. Prints a markdown table (to
// argv[1] too when given) and ends with "N passed, N failed".
// "bench_fp8 dgrad [FILE]": the data-grads instead (bench_dgrad): the FP8
// data-grad GEMMs (the forward kernel with the transposed weights) beside
// the BF16 production data-grads, and the quantisers around them; each FP8
// result checked against the BF16 one (the FP8 rounding, a few percent;
// tests/gpu/test_fp8 holds them to the FP8 reference).
// "bench_fp8 dense [FILE]": the dense GEMMs of fp8.gemms: experts_dense
// (bench_dense): cuBLASLt's block-scaled FP8 forward and data-grad beside
// its BF16 ones on the OLMoE-1B-7B attention projection (8192 tokens,
// 2048 -> 2048), each FP8 result checked against the BF16 one first.
// "bench_fp8 wgrad [FILE]": the weight-grads of fp8.wgrad: fp8
// (bench_wgrad): the FP8 grouped weight-grad beside the BF16 production
// one, and the whole of each path: fake quantisation of both operands +
// the BF16 weight-grad (before) against the transposing quantiser + the
// FP8 weight-grad (now).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_test_util.h"
#include "ops/cuda/fp8_cuda.h"
#include "ops/fp8.h"

#ifndef MOECORE_BUILD_COMMIT
#define MOECORE_BUILD_COMMIT "unknown"
#endif
enum { TOKENS = 8192, N_EXP = 64, TOP_K = 8, WARMUP = 3, RUNS = 20, ROUNDS = 7 };

static char table[8192];
static size_t tlen;
static void row(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tlen += vsnprintf(table + tlen, sizeof table - tlen, fmt, ap);
    va_end(ap);
}

typedef void (*RunFn)(void *ctx);
static double time_ms(RunFn f, void *ctx) { return gt_time_ms(f, ctx, WARMUP, RUNS); }

typedef struct {
    int E, C, OC, R;
    int *doff;
    void *a_bf16, *w_bf16, *out;
    float *w_f32;
    uint8_t *qa, *qw, *mxq, *mxs;
    float *sa, *sw;
} Case;

static void run_bf16(void *p) {
    Case *c = p;
    cuda_grouped_matmul_forward(c->out, c->a_bf16, c->w_bf16, c->doff, c->E, c->C, c->OC);
}
static void run_fp8(void *p) {
    Case *c = p;
    cuda_fp8_grouped_forward(c->out, c->qa, c->sa, c->qw, c->sw, c->doff, c->E, c->C, c->OC);
}
static void run_act_quant(void *p) {
    Case *c = p;
    cuda_fp8_quantize_1x128(c->qa, c->sa, c->a_bf16, c->R, c->C);
}
// the weight-grads' input under fp8.wgrad: bf16 (the backward's re-gather): quantise then dequantise, or one pass
static void run_quant_deq(void *p) {
    Case *c = p;
    cuda_fp8_quantize_1x128(c->qa, c->sa, c->a_bf16, c->R, c->C);
    cuda_fp8_dequantize_1x128(c->out, c->qa, c->sa, c->R, c->C);
}
static void run_fake_quant(void *p) {
    Case *c = p;
    cuda_fp8_gather_fake_quantize(c->out, c->a_bf16, NULL, c->R, c->C);
}
static void run_fp8_with_quant(void *p) {
    run_act_quant(p);
    run_fp8(p);
}
static void run_w_quant(void *p) {
    Case *c = p;
    cuda_fp8_quantize_128x128(c->qw, c->sw, c->w_f32, c->E, c->OC, c->C);
}
static void run_mx(void *p) {
    Case *c = p;
    cuda_fp8_quantize_mx(c->mxq, c->mxs, c->a_bf16, c->R, c->C);
}

static void bench_shape(const char *name, const int *off, int C, int OC) {
    Case c = {.E = N_EXP, .C = C, .OC = OC, .R = off[N_EXP]};
    int R = c.R, E = N_EXP;
    size_t na = (size_t)R * C, nw = (size_t)E * OC * C, no = (size_t)R * OC;
    printf("== %s: R=%d, %d -> %d\n", name, R, C, OC);
    fflush(stdout);
    float *a = gt_malloc(na * 4), *w = gt_malloc(nw * 4);
    gt_fill(a, na, GT_NORMAL, 0, 1, 1, 21);
    gt_fill(w, nw, GT_NORMAL, 0, 1 / sqrtf((float)C), 1, 22);
    c.doff = gt_dev_bytes(off, (E + 1) * sizeof(int));
    c.a_bf16 = gt_dev_bf16(a, na);
    c.w_bf16 = gt_dev_bf16(w, nw);
    c.w_f32 = gt_dev_bytes(w, nw * 4);
    c.out = cuda_alloc(no * 2);
    c.qa = cuda_alloc(na);
    c.qw = cuda_alloc(nw);
    c.sa = cuda_alloc(na / 128 * 4);
    c.sw = cuda_alloc(nw / (128 * 128) * 4);
    c.mxq = cuda_alloc(na);
    c.mxs = cuda_alloc(na / 32);

    // validation: BF16 against the FP32 CPU product, FP8 against its reference
    float *ref = gt_malloc(no * 4);
    ops_cpu.grouped_matmul_forward(ref, a, w, off, E, C, OC);
    gt_poison(c.out, no * 2);
    run_bf16(&c);
    float *got = gt_host_bf16(c.out, no);
    gt_check("bf16 grouped forward vs CPU FP32", got, ref, no, 1e-2);
    free(got);
    run_act_quant(&c);
    run_w_quant(&c);
    uint8_t *qa = gt_host_bytes(c.qa, na), *qw = gt_host_bytes(c.qw, nw);
    float *sa = gt_host_bytes(c.sa, na / 128 * 4), *sw = gt_host_bytes(c.sw, nw / (128 * 128) * 4);
    float *ref8 = gt_malloc(no * 4);
    fp8_grouped_matmul_ref(ref8, qa, sa, qw, sw, off, E, C, OC);
    gt_poison(c.out, no * 2);
    if (cuda_fp8_grouped_forward(c.out, c.qa, c.sa, c.qw, c.sw, c.doff, E, C, OC)) {
        printf("FAIL fp8 grouped forward refused the call\n");
        gt_count(0);
    }
    got = gt_host_bf16(c.out, no);
    gt_check("fp8 grouped forward vs CPU FP8 reference", got, ref8, no, 4e-3);
    gt_check("fp8 grouped forward vs CPU FP32 (what FP8 costs)", got, ref, no, 1e30);
    free(got);
    // every variant schedules the same arithmetic: the default's bits
    uint16_t *bits3 = gt_host_bytes(c.out, no * 2);
    for (int v = 0; v < FP8_GEMM_VARIANTS; v++) {
        char what[64];
        snprintf(what, sizeof what, "fp8 grouped forward variant %d: the default's bits", v);
        setenv("MOECORE_FP8_GEMM_VARIANT", (char[2]){(char)('0' + v), 0}, 1);
        gt_poison(c.out, no * 2);
        run_fp8(&c);
        uint16_t *bits = gt_host_bytes(c.out, no * 2);
        gt_check_bits(what, bits, bits3, no, 2);
        free(bits);
    }
    unsetenv("MOECORE_FP8_GEMM_VARIANT");
    free(bits3);

    // ROUNDS rounds of {BF16, FP8 variants 0..3}, each entry the median of
    // RUNS runs: the median over rounds, its spread, and the median of the
    // per-round ratios BF16 / FP8 (paired, so that a drift of the card's
    // clock between rounds cancels)
    double flops = 2.0 * R * C * OC;
    double t[1 + FP8_GEMM_VARIANTS][ROUNDS];
    for (int rd = 0; rd < ROUNDS; rd++) {
        t[0][rd] = time_ms(run_bf16, &c);
        for (int v = 0; v < FP8_GEMM_VARIANTS; v++) {
            setenv("MOECORE_FP8_GEMM_VARIANT", (char[2]){(char)('0' + v), 0}, 1);
            t[1 + v][rd] = time_ms(run_fp8, &c);
        }
        unsetenv("MOECORE_FP8_GEMM_VARIANT");
    }
    static const char *label[1 + FP8_GEMM_VARIANTS] = {
        "BF16 grouped forward (production)",
        "FP8 variant 0: scales loaded at each stage's start, 4-byte stores",
        "FP8 variant 1: scale prefetch, 4-byte stores",
        "FP8 variant 2: scale prefetch, 16-byte stores",
        "FP8 variant 3 (default): variant 2, column halves staggered between warpgroups"};
    double med[1 + FP8_GEMM_VARIANTS];
    for (int k = 0; k < 1 + FP8_GEMM_VARIANTS; k++) {
        float x[ROUNDS], ratio[ROUNDS];
        double lo = 1e30, hi = 0;
        for (int rd = 0; rd < ROUNDS; rd++) {
            x[rd] = (float)t[k][rd];
            ratio[rd] = (float)(t[0][rd] / t[k][rd]);
            lo = t[k][rd] < lo ? t[k][rd] : lo;
            hi = t[k][rd] > hi ? t[k][rd] : hi;
        }
        med[k] = gt_median(x, ROUNDS);
        double rmed = gt_median(ratio, ROUNDS);
        if (k == 0)
            row("| %s | %s | %.3f (%.3f..%.3f) | %.0f TFLOP/s | |\n", name, label[k], med[k], lo, hi, flops / med[k] / 1e9);
        else
            row("| %s | %s | %.3f (%.3f..%.3f) | %.0f TFLOP/s | %.2fx |\n", name, label[k], med[k], lo, hi,
                flops / med[k] / 1e9, rmed);
    }
    if (getenv("BENCH_FP8_DIAG")) { // bench_fp8's diag mode: the default against fp8.cu's DIAG kernels
        double d[3][ROUNDS];
        for (int rd = 0; rd < ROUNDS; rd++) {
            d[0][rd] = time_ms(run_fp8, &c);
            for (int k = 1; k <= 2; k++) {
                setenv("MOECORE_FP8_GEMM_DIAG", k == 1 ? "1" : "2", 1);
                d[k][rd] = time_ms(run_fp8, &c);
            }
            unsetenv("MOECORE_FP8_GEMM_DIAG");
        }
        static const char *dl[3] = {"FP8 default (again)", "DIAG 1: no promotion arithmetic (wrong results)",
                                    "DIAG 2: all of K in the tensor cores, one wait a stage (wrong results)"};
        for (int k = 0; k < 3; k++) {
            float x[ROUNDS];
            for (int rd = 0; rd < ROUNDS; rd++) x[rd] = (float)d[k][rd];
            double m = gt_median(x, ROUNDS);
            row("| %s | %s | %.3f | %.0f TFLOP/s | %.2fx |\n", name, dl[k], m, flops / m / 1e9, med[0] / m);
        }
    }
    double bfm = med[0];
    double fq = time_ms(run_fp8_with_quant, &c), aq = time_ms(run_act_quant, &c), wq = time_ms(run_w_quant, &c);
    double mx = time_ms(run_mx, &c);
    row("| %s | FP8: activation quantise (BF16 -> 1x128) + forward | %.3f | %.0f TFLOP/s | %.2fx BF16 |\n", name, fq,
        flops / fq / 1e9, bfm / fq);
    double abytes = na * 2.0 + na + na / 128 * 4.0, wbytes = nw * 4.0 + nw + nw / 16384 * 4.0;
    double mbytes = na * 2.0 + na + na / 32.0;
    row("| %s | activation quantise 1x128, BF16 [%d, %d] | %.3f | %.0f GB/s | |\n", name, R, C, aq, abytes / aq / 1e6);
    if ((size_t)R * OC >= na) { // out holds [R, C] BF16
        double qd = time_ms(run_quant_deq, &c), fk = time_ms(run_fake_quant, &c);
        row("| %s | quantise + dequantise 1x128 / one pass (fp8_fake_quantize_rows) | %.3f / %.3f | %.0f / %.0f GB/s | "
            "%.2fx |\n", name, qd, fk, na * 6.0 / qd / 1e6, na * 4.0 / fk / 1e6, qd / fk);
    }
    row("| %s | weight quantise 128x128, FP32 [%d, %d, %d] | %.3f | %.0f GB/s | |\n", name, E, OC, C, wq,
        wbytes / wq / 1e6);
    row("| %s | MXFP8 quantise, BF16 [%d, %d] | %.3f | %.0f GB/s | |\n", name, R, C, mx, mbytes / mx / 1e6);
    free(a); free(w); free(ref); free(ref8); free(qa); free(qw); free(sa); free(sw);
    cuda_free(c.doff); cuda_free(c.a_bf16); cuda_free(c.w_bf16); cuda_free(c.w_f32); cuda_free(c.out);
    cuda_free(c.qa); cuda_free(c.qw); cuda_free(c.sa); cuda_free(c.sw); cuda_free(c.mxq); cuda_free(c.mxs);
}

// ---- the data-grads ----------------------------------------------------------------

typedef struct {
    int E, R, C, OC, pair; // forward weights [E, OC, C]; dY [R, OC] (pair: two, side by side)
    int *doff;
    void *dy, *dy2, *w, *w2, *dx, *wdeq;
    float *w_f32;
    uint8_t *qy, *qt, *qw;
    float *sy, *st, *sw;
} DCase;

static void d_bf16(void *p) {
    DCase *c = p;
    if (c->pair) cuda_grouped_dgrad_pair(c->dx, c->dy, c->w, c->dy2, c->w2, c->doff, c->E, c->C, c->OC);
    else cuda_grouped_matmul_backward(c->dx, NULL, c->dy, c->dy, c->w, c->doff, c->E, c->C, c->OC, 0);
}
static void d_fp8(void *p) {
    DCase *c = p;
    int K = (c->pair ? 2 : 1) * c->OC;
    cuda_fp8_grouped_forward(c->dx, c->qy, c->sy, c->qt, c->st, c->doff, c->E, K, c->C);
}
// what the data-grads cost before (FP8 weights dequantised for the BF16 kernel)
static void d_dequant(void *p) {
    DCase *c = p;
    for (int h = 0; h < (c->pair ? 2 : 1); h++) cuda_fp8_dequantize_128x128(c->wdeq, c->qw, c->sw, c->E, c->OC, c->C);
}
static void d_wquant(void *p) {
    DCase *c = p;
    cuda_fp8_quantize_128x128(c->qw, c->sw, c->w_f32, c->E, c->OC, c->C);
}
static void d_wquant_t(void *p) {
    DCase *c = p;
    int K = (c->pair ? 2 : 1) * c->OC;
    cuda_fp8_quantize_128x128_t(c->qw, c->sw, c->qt, c->st, K, 0, c->w_f32, c->E, c->OC, c->C);
}
// the output grads' quantiser: the down's from dY, the pair's fused into the SwiGLU backward
static void d_yquant(void *p) {
    DCase *c = p;
    if (c->pair) // dY, dY2 stand in for dout / gate / up: the fused kernel writes its BF16 outputs into dx's room
        cuda_fp8_swiglu_backward_quantize_1x128(c->dx, (char *)c->dx + (size_t)c->R * c->OC * 2, c->qy, c->sy, c->dy,
                                                c->dy2, c->dy, c->R, c->OC);
    else cuda_fp8_quantize_1x128(c->qy, c->sy, c->dy, c->R, c->OC);
}
static void d_swiglu_bwd(void *p) {
    DCase *c = p;
    cuda_swiglu_backward(c->dx, (char *)c->dx + (size_t)c->R * c->OC * 2, c->dy, c->dy2, c->dy, (size_t)c->R * c->OC);
}

static void bench_dgrad(const char *name, const int *off, int C, int OC, int pair) {
    DCase c = {.E = N_EXP, .R = off[N_EXP], .C = C, .OC = OC, .pair = pair};
    int R = c.R, E = N_EXP, np = pair ? 2 : 1, K = np * OC;
    size_t ny = (size_t)R * OC, nw = (size_t)E * OC * C, nx = (size_t)R * C;
    printf("== data-grad %s: R=%d, %d -> %d\n", name, R, K, C);
    fflush(stdout);
    float *y = gt_malloc(ny * 4), *w = gt_malloc(nw * 4), *yy = gt_malloc((size_t)R * K * 4);
    c.doff = gt_dev_bytes(off, (E + 1) * sizeof(int));
    c.qt = cuda_alloc(np * nw);
    c.st = cuda_alloc(np * nw / 16384 * 4);
    c.qw = cuda_alloc(nw);
    c.sw = cuda_alloc(nw / 16384 * 4);
    c.wdeq = cuda_alloc(nw * 2);
    void *dyy = NULL;
    for (int h = 0; h < np; h++) {
        gt_fill(y, ny, GT_NORMAL, 0, 1, 1, 51 + h);
        gt_fill(w, nw, GT_NORMAL, 0, 1 / sqrtf((float)C), 1, 61 + h);
        for (int r = 0; r < R; r++) memcpy(yy + (size_t)r * K + h * OC, y + (size_t)r * OC, (size_t)OC * 4);
        void **dyh = h ? &c.dy2 : &c.dy, **dwh = h ? &c.w2 : &c.w;
        *dyh = gt_dev_bf16(y, ny);
        *dwh = gt_dev_bf16(w, nw);
        float *wf = gt_dev_bytes(w, nw * 4);
        cuda_fp8_quantize_128x128_t(c.qw, c.sw, c.qt, c.st, K, h * OC, wf, E, OC, C);
        if (h == 0) c.w_f32 = wf;
        else cuda_free(wf);
    }
    dyy = gt_dev_bf16(yy, (size_t)R * K);
    c.qy = cuda_alloc((size_t)R * K);
    c.sy = cuda_alloc((size_t)R * K / 128 * 4);
    cuda_fp8_quantize_1x128(c.qy, c.sy, dyy, R, K); // the data-grad's operand: [dY | dY2] quantised
    c.dx = cuda_alloc(nx * 2 > 2 * ny * 2 ? nx * 2 : 2 * ny * 2);
    // validation: the FP8 data-grad against the BF16 one (the same unquantised operands)
    gt_poison(c.dx, nx * 2);
    d_bf16(&c);
    float *ref = gt_host_bf16(c.dx, nx);
    gt_poison(c.dx, nx * 2);
    if (cuda_fp8_grouped_forward(c.dx, c.qy, c.sy, c.qt, c.st, c.doff, E, K, C)) {
        printf("FAIL fp8 data-grad refused the call\n");
        gt_count(0);
    }
    float *got = gt_host_bf16(c.dx, nx);
    gt_check("fp8 data-grad vs bf16 data-grad (FP8 rounding)", got, ref, nx, 6e-2);
    free(got); free(ref);

    double flops = 2.0 * R * K * C, t[2][ROUNDS];
    for (int rd = 0; rd < ROUNDS; rd++) {
        t[0][rd] = time_ms(d_bf16, &c);
        t[1][rd] = time_ms(d_fp8, &c);
    }
    double med[2];
    float ratio[ROUNDS];
    for (int k = 0; k < 2; k++) {
        float x[ROUNDS];
        double lo = 1e30, hi = 0;
        for (int rd = 0; rd < ROUNDS; rd++) {
            x[rd] = (float)t[k][rd];
            ratio[rd] = (float)(t[0][rd] / t[1][rd]);
            lo = t[k][rd] < lo ? t[k][rd] : lo;
            hi = t[k][rd] > hi ? t[k][rd] : hi;
        }
        med[k] = gt_median(x, ROUNDS);
        if (k == 0)
            row("| %s | BF16 data-grad (production%s) | %.3f (%.3f..%.3f) | %.0f TFLOP/s | |\n", name,
                pair ? ": grouped_dgrad_pair" : "", med[0], lo, hi, flops / med[0] / 1e9);
        else
            row("| %s | FP8 data-grad (forward kernel, W^T) | %.3f (%.3f..%.3f) | %.0f TFLOP/s | %.2fx |\n", name,
                med[1], lo, hi, flops / med[1] / 1e9, gt_median(ratio, ROUNDS));
    }
    double dq = time_ms(d_dequant, &c), yq = time_ms(d_yquant, &c), wq = time_ms(d_wquant, &c);
    double wqt = time_ms(d_wquant_t, &c);
    row("| %s | before: FP8 weights dequantised (%d x [%d, %d, %d]) + BF16 data-grad | %.3f | | |\n", name, np, E,
        OC, C, dq + med[0]);
    if (pair) {
        double sb = time_ms(d_swiglu_bwd, &c);
        row("| %s | SwiGLU backward [%d, %d]: plain / fused with the pair's 1x128 quantiser | %.3f / %.3f | | |\n",
            name, R, OC, sb, yq);
        row("| %s | now: FP8 data-grad + the quantiser's extra time | %.3f | | %.2fx before |\n", name,
            med[1] + yq - sb, (dq + med[0]) / (med[1] + yq - sb));
    } else {
        row("| %s | dY quantise 1x128, BF16 [%d, %d] | %.3f | %.0f GB/s | |\n", name, R, OC, yq,
            (ny * 3.0 + ny / 128 * 4.0) / yq / 1e6);
        row("| %s | now: dY quantise + FP8 data-grad | %.3f | | %.2fx before |\n", name, med[1] + yq,
            (dq + med[0]) / (med[1] + yq));
    }
    row("| %s | weight quantise 128x128, FP32 [%d, %d, %d]: forward copy / + transposed | %.3f / %.3f | | |\n", name,
        E, OC, C, wq, wqt);
    free(y); free(w); free(yy);
    cuda_free(c.doff); cuda_free(c.dy); cuda_free(c.w); cuda_free(c.dx); cuda_free(c.wdeq); cuda_free(c.w_f32);
    if (pair) { cuda_free(c.dy2); cuda_free(c.w2); }
    cuda_free(dyy); cuda_free(c.qy); cuda_free(c.qt); cuda_free(c.qw); cuda_free(c.sy); cuda_free(c.st); cuda_free(c.sw);
}

// ---- the weight-grads (fp8.wgrad: fp8) ---------------------------------------------

typedef struct {
    int E, R, C, OC, ldk; // dw [E, OC, C] = dout^T inp per expert; dout [R, OC], inp [R, C]
    int *doff;
    void *dout, *inp, *fdout, *finp; // BF16; f*: the fake-quantised copies
    float *dw;
    uint8_t *qa, *qb, *qx; // qx, sx: inp quantised 1 x 128 (an FP8 input as the forward saved it)
    float *sa, *sb, *sx;
} WCase;

static void w_bf16(void *p) { // the production BF16 weight-grad (+=, as every micro-batch after a step's first)
    WCase *c = p;
    cuda_grouped_matmul_backward(NULL, c->dw, c->fdout, c->finp, NULL, c->doff, c->E, c->C, c->OC, 1);
}
static void w_fake(void *p) { // both operands fake-quantised in place (idempotent: the same tiles again)
    WCase *c = p;
    cuda_fp8_fake_quantize_128x1(c->fdout, c->doff, c->E, c->OC);
    cuda_fp8_fake_quantize_128x1(c->finp, c->doff, c->E, c->C);
}
static void w_fake_bf16(void *p) {
    w_fake(p);
    w_bf16(p);
}
static void w_quant_t(void *p) {
    WCase *c = p;
    cuda_fp8_quantize_tokens_t(c->qa, c->sa, c->dout, c->doff, c->E, c->OC, c->ldk);
    cuda_fp8_quantize_tokens_t(c->qb, c->sb, c->inp, c->doff, c->E, c->C, c->ldk);
}
// an FP8 input's operand: dequantised, then quantised along the tokens, or in one pass
static void w_deq_quant_t(void *p) {
    WCase *c = p;
    cuda_fp8_dequantize_1x128(c->finp, c->qx, c->sx, c->R, c->C);
    cuda_fp8_quantize_tokens_t(c->qb, c->sb, c->finp, c->doff, c->E, c->C, c->ldk);
}
static void w_requant_t(void *p) {
    WCase *c = p;
    cuda_fp8_requantize_tokens_t(c->qb, c->sb, c->qx, c->sx, c->doff, c->E, c->C, c->ldk);
}
static void w_fp8(void *p) {
    WCase *c = p;
    cuda_fp8_grouped_wgrad(c->dw, c->qa, c->sa, c->qb, c->sb, c->doff, c->E, c->C, c->OC, c->ldk, 1);
}
static void w_fp8_set(void *p) { // = (a step's first micro-batch)
    WCase *c = p;
    cuda_fp8_grouped_wgrad(c->dw, c->qa, c->sa, c->qb, c->sb, c->doff, c->E, c->C, c->OC, c->ldk, 0);
}
static void w_bf16_set(void *p) {
    WCase *c = p;
    cuda_grouped_matmul_backward(NULL, c->dw, c->fdout, c->finp, NULL, c->doff, c->E, c->C, c->OC, 0);
}
static void w_quant_fp8(void *p) {
    w_quant_t(p);
    w_fp8(p);
}

static void bench_wgrad(const char *name, const int *off, int C, int OC) {
    WCase c = {.E = N_EXP, .R = off[N_EXP], .C = C, .OC = OC};
    int R = c.R, E = N_EXP;
    c.ldk = fp8_tokens_ldk(R, E);
    size_t ny = (size_t)R * OC, nx = (size_t)R * C, nw = (size_t)E * OC * C;
    printf("== weight-grad %s: R=%d, dw [%d, %d, %d]\n", name, R, E, OC, C);
    fflush(stdout);
    float *y = gt_malloc(ny * 4), *x = gt_malloc(nx * 4);
    gt_fill(y, ny, GT_NORMAL, 0, 1e-3f, 1, 81);
    gt_fill(x, nx, GT_NORMAL, 0, 1, 1, 82);
    for (int r = 0; r < R; r += 3) // rows with their own magnitude, so that the token tiles' scales differ
        for (int c2 = 0; c2 < OC; c2++) y[(size_t)r * OC + c2] = bf2f(f2bf(y[(size_t)r * OC + c2] * 16.0f));
    c.doff = gt_dev_bytes(off, (E + 1) * sizeof(int));
    c.dout = gt_dev_bf16(y, ny);
    c.inp = gt_dev_bf16(x, nx);
    c.fdout = gt_dev_bf16(y, ny);
    c.finp = gt_dev_bf16(x, nx);
    c.dw = cuda_alloc(nw * 4);
    c.qa = cuda_alloc((size_t)OC * c.ldk);
    c.qb = cuda_alloc((size_t)C * c.ldk);
    c.sa = cuda_alloc((size_t)c.ldk / 128 * OC * 4);
    c.sb = cuda_alloc((size_t)c.ldk / 128 * C * 4);
    // validation: the FP8 kernel against the BF16 one on the fake-quantised operands (the same function up to
    // the BF16 rounding of the dequantised values; test_fp8 holds the kernel to the CPU reference)
    w_fake(&c);
    gt_poison(c.dw, nw * 4);
    cuda_grouped_matmul_backward(NULL, c.dw, c.fdout, c.finp, NULL, c.doff, E, C, OC, 0);
    float *ref = gt_host_f32(c.dw, nw);
    w_quant_t(&c);
    gt_poison(c.dw, nw * 4);
    if (cuda_fp8_grouped_wgrad(c.dw, c.qa, c.sa, c.qb, c.sb, c.doff, E, C, OC, c.ldk, 0)) {
        printf("FAIL fp8 grouped wgrad refused the call\n");
        gt_count(0);
    }
    float *got = gt_host_f32(c.dw, nw);
    gt_check("fp8 wgrad vs bf16 wgrad of the fake-quantised operands", got, ref, nw, 1e-2);
    free(ref);
    for (int v = 0; v < 3; v++) { // every variant: the default's bits (=)
        char what[64], var[2] = {(char)('0' + v), 0};
        snprintf(what, sizeof what, "fp8 wgrad variant %d: the default's bits", v);
        setenv("MOECORE_FP8_WGRAD_VARIANT", var, 1);
        gt_poison(c.dw, nw * 4);
        cuda_fp8_grouped_wgrad(c.dw, c.qa, c.sa, c.qb, c.sb, c.doff, E, C, OC, c.ldk, 0);
        float *other = gt_host_f32(c.dw, nw);
        gt_check_bits(what, other, got, nw, 4);
        free(other);
    }
    unsetenv("MOECORE_FP8_WGRAD_VARIANT");
    free(got);

    // ROUNDS interleaved rounds of {BF16, FP8 variants 0, 1, 2 (default)}, all +=
    double flops = 2.0 * R * C * OC, t[4][ROUNDS];
    for (int rd = 0; rd < ROUNDS; rd++) {
        t[0][rd] = time_ms(w_bf16, &c);
        for (int v = 0; v < 3; v++) {
            setenv("MOECORE_FP8_WGRAD_VARIANT", (char[2]){(char)('0' + v), 0}, 1);
            t[1 + v][rd] = time_ms(w_fp8, &c);
        }
        unsetenv("MOECORE_FP8_WGRAD_VARIANT");
    }
    static const char *label[4] = {"BF16 weight-grad (production, +=)",
                                   "FP8 weight-grad, variant 0: stores from registers (+=)",
                                   "FP8 weight-grad, variant 1: TMA reduce-add from shared memory (+=)",
                                   "FP8 weight-grad, variant 2 (default): 128 x 128 tiles, double-buffered partials (+=)"};
    double med[4];
    for (int k = 0; k < 4; k++) {
        float v[ROUNDS], ratio[ROUNDS];
        double lo = 1e30, hi = 0;
        for (int rd = 0; rd < ROUNDS; rd++) {
            v[rd] = (float)t[k][rd];
            ratio[rd] = (float)(t[0][rd] / t[k][rd]);
            lo = t[k][rd] < lo ? t[k][rd] : lo;
            hi = t[k][rd] > hi ? t[k][rd] : hi;
        }
        med[k] = gt_median(v, ROUNDS);
        if (k == 0)
            row("| %s | %s | %.3f (%.3f..%.3f) | %.0f TFLOP/s | |\n", name, label[k], med[0], lo, hi,
                flops / med[0] / 1e9);
        else
            row("| %s | %s | %.3f (%.3f..%.3f) | %.0f TFLOP/s | %.2fx |\n", name, label[k], med[k], lo, hi,
                flops / med[k] / 1e9, gt_median(ratio, ROUNDS));
    }
    double bs = time_ms(w_bf16_set, &c), fs = time_ms(w_fp8_set, &c);
    row("| %s | = (a step's first micro-batch): BF16 / FP8 (default) | %.3f / %.3f | | %.2fx |\n", name, bs, fs, bs / fs);
    double fq = time_ms(w_fake, &c), fb = time_ms(w_fake_bf16, &c), qt = time_ms(w_quant_t, &c),
           qf = time_ms(w_quant_fp8, &c);
    row("| %s | fake quantise 128x1, both operands in place (BF16 [%d, %d] + [%d, %d]) | %.3f | %.0f GB/s | |\n", name,
        R, OC, R, C, fq, (ny + nx) * 4.0 / fq / 1e6);
    row("| %s | quantise along the tokens, transposed, both operands | %.3f | %.0f GB/s | |\n", name, qt,
        (ny + nx) * 3.0 / qt / 1e6);
    c.qx = cuda_alloc(nx);
    c.sx = cuda_alloc(nx / 128 * 4);
    cuda_fp8_quantize_1x128(c.qx, c.sx, c.inp, R, C);
    double dq = time_ms(w_deq_quant_t, &c), rq = time_ms(w_requant_t, &c);
    row("| %s | FP8 input [%d, %d] along the tokens: dequantise + quantise / requantise in one pass | %.3f / %.3f | "
        "%.0f / %.0f GB/s | %.2fx |\n", name, R, C, dq, rq, nx * 6.0 / dq / 1e6, nx * 2.0 / rq / 1e6, dq / rq);
    cuda_free(c.qx); cuda_free(c.sx);
    row("| %s | before: fake quantise + BF16 weight-grad | %.3f | | |\n", name, fb);
    row("| %s | now: transposed quantise + FP8 weight-grad | %.3f | | %.2fx before |\n", name, qf, fb / qf);
    free(y); free(x);
    cuda_free(c.doff); cuda_free(c.dout); cuda_free(c.inp); cuda_free(c.fdout); cuda_free(c.finp); cuda_free(c.dw);
    cuda_free(c.qa); cuda_free(c.qb); cuda_free(c.sa); cuda_free(c.sb);
}

// ---- the dense GEMMs (fp8.gemms: experts_dense) --------------------------------

typedef struct {
    int N, C, OC; // out[N, OC] = x[N, C] W^T; the data-grad dX[N, C] = dY W
    void *x, *w, *dy, *out, *dx;
    uint8_t *qx, *qy, *qw, *qwt;
    float *sx, *sy, *sw, *swt;
} NCase;

static void n_bf16_fwd(void *p) { NCase *c = p; cuda_matmul_forward(c->out, c->x, c->w, c->N, c->C, c->OC); }
static void n_bf16_dgrad(void *p) {
    NCase *c = p;
    cuda_matmul_backward(c->dx, NULL, c->dy, c->x, c->w, c->N, c->C, c->OC, 0);
}
static void n_fp8_fwd(void *p) {
    NCase *c = p;
    cuda_fp8_dense_matmul(c->out, c->qx, c->sx, c->qw, c->sw, c->N, c->C, c->OC, 0);
}
static void n_fp8_dgrad(void *p) {
    NCase *c = p;
    cuda_fp8_dense_matmul(c->dx, c->qy, c->sy, c->qwt, c->swt, c->N, c->OC, c->C, 0);
}
static void n_xquant(void *p) { NCase *c = p; cuda_fp8_quantize_rows_t(c->qx, c->sx, c->x, c->N, c->C); }

// BF16 (production: cuBLASLt's BF16 matmul) against FP8 (cuBLASLt block-scaled)
// forward and data-grad, interleaved as the grouped rows; each FP8 result
// first checked against the BF16 one (the FP8 rounding: a few percent).
static void bench_dense(const char *name, int N, int C, int OC) {
    NCase c = {.N = N, .C = C, .OC = OC};
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    printf("== dense %s: N=%d, %d -> %d\n", name, N, C, OC);
    fflush(stdout);
    char why[300] = "";
    if (!cuda_fp8_dense_supports(N, C, OC, why, sizeof why)) {
        printf("FAIL dense %s: %s\n", name, why);
        gt_count(0);
        return;
    }
    float *x = gt_malloc(nx * 4), *w = gt_malloc(nw * 4), *y = gt_malloc(ny * 4);
    gt_fill(x, nx, GT_NORMAL, 0, 1, 1, 71);
    gt_fill(w, nw, GT_NORMAL, 0, 1 / sqrtf((float)C), 1, 72);
    gt_fill(y, ny, GT_NORMAL, 0, 1, 1, 73);
    c.x = gt_dev_bf16(x, nx); c.w = gt_dev_bf16(w, nw); c.dy = gt_dev_bf16(y, ny);
    float *wf = gt_dev_bytes(w, nw * 4);
    c.out = cuda_alloc(ny * 2); c.dx = cuda_alloc(nx * 2);
    c.qx = cuda_alloc(nx); c.qy = cuda_alloc(ny); c.qw = cuda_alloc(nw); c.qwt = cuda_alloc(nw);
    c.sx = cuda_alloc(nx / 128 * 4); c.sy = cuda_alloc(ny / 128 * 4);
    c.sw = cuda_alloc(nw / 16384 * 4); c.swt = cuda_alloc(nw / 16384 * 4);
    cuda_fp8_quantize_rows_t(c.qx, c.sx, c.x, N, C);
    cuda_fp8_quantize_rows_t(c.qy, c.sy, c.dy, N, OC);
    cuda_fp8_quantize_128x128_t(c.qw, c.sw, c.qwt, c.swt, OC, 0, wf, 1, OC, C);
    RunFn fns[4] = {n_bf16_fwd, n_fp8_fwd, n_bf16_dgrad, n_fp8_dgrad};
    void *outs[2] = {c.out, c.dx};
    size_t nouts[2] = {ny, nx};
    for (int k = 0; k < 2; k++) {
        gt_poison(outs[k], nouts[k] * 2);
        fns[2 * k](&c);
        float *ref = gt_host_bf16(outs[k], nouts[k]);
        gt_poison(outs[k], nouts[k] * 2);
        fns[2 * k + 1](&c);
        float *got = gt_host_bf16(outs[k], nouts[k]);
        char what[160];
        snprintf(what, sizeof what, "dense %s: FP8 %s vs BF16 (FP8 rounding)", name, k ? "data-grad" : "forward");
        gt_check(what, got, ref, nouts[k], 6e-2);
        free(ref); free(got);
    }
    double flops = 2.0 * N * C * OC, t[4][ROUNDS];
    for (int rd = 0; rd < ROUNDS; rd++)
        for (int k = 0; k < 4; k++) t[k][rd] = time_ms(fns[k], &c);
    const char *label[4] = {"BF16 forward (cuBLASLt)", "FP8 forward (cuBLASLt block-scaled)", "BF16 data-grad (cuBLASLt)",
                            "FP8 data-grad (cuBLASLt block-scaled, W^T copy)"};
    for (int k = 0; k < 4; k++) {
        float v[ROUNDS], ratio[ROUNDS];
        double lo = 1e30, hi = 0;
        for (int rd = 0; rd < ROUNDS; rd++) {
            v[rd] = (float)t[k][rd];
            ratio[rd] = (float)(t[k & 2][rd] / t[k][rd]);
            lo = t[k][rd] < lo ? t[k][rd] : lo;
            hi = t[k][rd] > hi ? t[k][rd] : hi;
        }
        double med = gt_median(v, ROUNDS);
        if (k & 1)
            row("| %s | %s | %.3f (%.3f..%.3f) | %.0f TFLOP/s | %.2fx |\n", name, label[k], med, lo, hi,
                flops / med / 1e9, gt_median(ratio, ROUNDS));
        else
            row("| %s | %s | %.3f (%.3f..%.3f) | %.0f TFLOP/s | |\n", name, label[k], med, lo, hi, flops / med / 1e9);
    }
    double xq = time_ms(n_xquant, &c);
    row("| %s | input quantise 1x128 (transposed scales), BF16 [%d, %d] | %.3f | %.0f GB/s | |\n", name, N, C, xq,
        (nx * 3.0 + nx / 128 * 4.0) / xq / 1e6);
    free(x); free(w); free(y);
    cuda_free(wf); cuda_free(c.x); cuda_free(c.w); cuda_free(c.dy); cuda_free(c.out); cuda_free(c.dx);
    cuda_free(c.qx); cuda_free(c.qy); cuda_free(c.qw); cuda_free(c.qwt);
    cuda_free(c.sx); cuda_free(c.sy); cuda_free(c.sw); cuda_free(c.swt);
}

int main(int argc, char **argv) {
    // random top-8 routing of 8192 tokens over 64 experts (distinct per token)
    int off[N_EXP + 1];
    gt_random_offsets(off, TOKENS, N_EXP, TOP_K);
    int mn = 1 << 30, mxr = 0;
    for (int e = 0; e < N_EXP; e++) {
        int c = off[e + 1] - off[e];
        mn = c < mn ? c : mn;
        mxr = c > mxr ? c : mxr;
    }
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    row("- commit %s; device %s (%d SMs); date %s\n", MOECORE_BUILD_COMMIT, prop.name, prop.multiProcessorCount, date);
    row("- OLMoE-1B-7B experts: %d tokens x top-%d of %d experts, random routing: %d rows, %d..%d per expert\n",
        TOKENS, TOP_K, N_EXP, off[N_EXP], mn, mxr);
    int dgrad = argc > 1 && !strcmp(argv[1], "dgrad"), wgrad = argc > 1 && !strcmp(argv[1], "wgrad");
    int dense = argc > 1 && !strcmp(argv[1], "dense");
    row("- each entry the median of %d runs after %d warm-ups (CUDA events); GEMM rows: %d interleaved rounds of "
        "all %s, ms = median over rounds (min..max), vs BF16 = median of the rounds' BF16 / FP8 time ratios; "
        "FLOPs 2 R C OC\n\n",
        RUNS, WARMUP, ROUNDS, dgrad ? "two" : wgrad ? "four" : dense ? "four" : "five");
    row("| layer | kernel | ms | rate | vs BF16 |\n|---|---|---:|---:|---:|\n");
    const char *out = argc > 1 + (dgrad || wgrad || dense) ? argv[1 + (dgrad || wgrad || dense)] : NULL;
    if (dense) {
        bench_dense("OLMoE-1B-7B q/k/v/o, 8192 tokens", 8192, 2048, 2048);
    } else if (wgrad) {
        bench_wgrad("down: dY [R, 2048], act [R, 1024]", off, 1024, 2048);
        bench_wgrad("gate or up: dG [R, 1024], x [R, 2048]", off, 2048, 1024);
    } else if (dgrad) {
        bench_dgrad("down dY 2048 -> 1024", off, 1024, 2048, 0);
        bench_dgrad("gate/up [dG | dU] 2x1024 -> 2048", off, 2048, 1024, 1);
    } else {
        bench_shape("gate/up 2048->1024", off, 2048, 1024);
        bench_shape("down 1024->2048", off, 1024, 2048);
    }
    printf("\n%s\n", table);
    if (out) {
        FILE *f = fopen(out, "w");
        if (f) {
            fputs(table, f);
            fclose(f);
        }
    }
    return gt_finish();
}
