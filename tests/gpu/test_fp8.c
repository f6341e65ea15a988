// The CUDA FP8 kernels (src/ops/cuda/fp8.cu) against the CPU reference
// (src/ops/fp8.h):
// - the E4M3 encoder on all 2^32 FP32 bit patterns, bit for bit;
// - the block128 quantisers (1x128 from BF16 and from FP32, 128x128 from
//   FP32) and MXFP8 (from BF16): values and scales bit for bit, on tiles
//   built to hit zeros, NaN, +-inf, subnormals, tiny amax and spikes;
// - the FP8 grouped GEMM forward against fp8_grouped_matmul_ref on the
//   same quantised operands (relative L2 error, every output row of every
//   segment written: the output is poisoned first), on uneven segments with
//   empty experts and on the OLMoE-1B-7B expert shapes;
// - the fused quantisers of train.precision: fp8 (test_fused);
// - the data-grads (test_transposed, test_swiglu_backward_quantize,
//   test_dgrad): the weight quantiser's transposed copy (bit for bit against
//   fp8_transpose_128x128 of the CPU's forward copy), the SwiGLU backward
//   fused with the pair's quantiser (bit for bit against
//   cuda_swiglu_backward + the CPU quantiser), unpermute_backward fused with
//   the 1x128 quantiser (test_unpermute_backward_quantize: against
//   cuda_unpermute_backward + the CPU quantiser), and the FP8 data-grad GEMMs
//   (the forward kernel with the transposed weights) against the CPU FP8
//   reference, outputs poisoned first.
// - fp8.wgrad: fp8 (wgrad_tests): the 128 x 1 fake quantiser against the
//   CPU's, bit for bit after BF16 rounding; the transposing quantiser of
//   the speed path (codes and scales bit for bit, its dequantised values
//   the fake quantiser's) and the FP8 grouped weight-grad against the CPU
//   reference (fake-quantised operands, FP32 weight-grad), = and +=.
// - the FP8 dispatch payload of ep > 1 (test_payload): pack and unpack bit
//   for bit against the CPU's, and the whole chain (quantise at the source,
//   pack, move, unpack) against the CPU quantiser after the move.
// - fp8.gemms: experts_dense (dense_tests): the quantiser with transposed
//   scales bit for bit, the cuBLASLt block-scaled FP8 GEMM (forward, +=,
//   data-grad) against fp8_matmul_ref, outputs poisoned first.
// Argument "dgrad": the data-grad checks and the small GEMM check only;
// "gemm": the grouped GEMM checks (every kernel variant) and the data-grads;
// "wgrad": wgrad_tests only; "payload": test_payload only; "dense":
// dense_tests only; "mx": the Blackwell MXFP8 grouped GEMM (mx_tests, on a
// compute capability 10.0 GPU only; elsewhere it says it skipped).
// Ends with "N passed, N failed".
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_test_util.h"
#include "ops/cuda/fp8_cuda.h"
#include "ops/fp8.h"
#include "ops/ops.h"

static void check_rc(int rc, const char *what) {
    if (rc) {
        printf("FAIL %s: the kernel refused the call\n", what);
        gt_count(0);
    }
}

static void test_encode_all(void) {
    const size_t chunk = (size_t)1 << 28;
    uint8_t *d = cuda_alloc(chunk), *ref = gt_malloc(chunk);
    size_t bad = 0;
    uint32_t first_bad = 0;
    for (uint64_t c = 0; c < 16; c++) {
        uint32_t first = (uint32_t)(c << 28);
        check_rc(cuda_fp8_encode_bits(d, first, chunk), "encode");
        uint8_t *got = gt_host_bytes(d, chunk);
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < chunk; i++) {
            float x;
            uint32_t u = first + (uint32_t)i;
            memcpy(&x, &u, 4);
            ref[i] = fp8_e4m3_from_float(x);
        }
        for (size_t i = 0; i < chunk; i++)
            if (got[i] != ref[i]) {
                if (!bad) first_bad = first + (uint32_t)i;
                if (bad < 8) printf("      bits 0x%08x: gpu 0x%02x cpu 0x%02x\n", first + (uint32_t)i, got[i], ref[i]);
                bad++;
            }
        free(got);
    }
    gt_ok(bad == 0, "e4m3 encode, all 2^32 FP32 patterns: %zu differ (first 0x%08x)", bad, first_bad);
    cuda_free(d);
    free(ref);
}

// The quantisers of BF16 values divide by one reciprocal per scale and a
// correction (div_bf16): its codes must be IEEE division's on every pair
// of a BF16 value (all 65536 patterns: NaN, +-inf, -0, subnormals) and the
// scale of a BF16 amax (all 32641, and the floor's)
static void test_div_bf16_all(void) {
    unsigned long long *d = cuda_alloc(2 * sizeof(unsigned long long)), h[2] = {0, 0};
    cuda_to_device(d, h, sizeof h);
    check_rc(cuda_fp8_div_bf16_check(d), "div_bf16_check");
    cuda_to_host(h, d, sizeof h);
    gt_ok(h[0] == 0, "BF16 / scale by reciprocal + correction, all %llu pairs: %llu E4M3 codes differ from IEEE "
          "division's (%llu FP32 quotients differ)", 65536ULL * 0x7f81, h[0], h[1]);
    cuda_free(d);
}

// x[R, C]: per tile of tw along rows, a kind: ordinary (random magnitude),
// zeros, one NaN, +-inf, subnormal (FP32 or BF16 range), amax below the
// floor, a spike; BF16-rounded when bf16.
static void fill_tiles(float *x, int R, int C, int tw, int bf16) {
    int nt = C / tw;
    for (int r = 0; r < R; r++)
        for (int t = 0; t < nt; t++) {
            int kind = gt_irand(8);
            float mag = ldexpf(1.0f, gt_irand(60) - 30);
            int at = gt_irand(tw);
            for (int c = t * tw; c < (t + 1) * tw; c++) {
                float f = gt_urand() * mag;
                if (kind == 1) f = 0.0f;
                if (kind == 2 && c - t * tw == at) f = NAN;
                if (kind == 3 && c - t * tw == at) f = gt_urand() < 0 ? -INFINITY : INFINITY;
                if (kind == 4) f = gt_urand() * 1e-39f;
                if (kind == 5 && c - t * tw == at) f *= 1e6f;
                if (kind == 6) f = gt_urand() * 1e-35f;
                x[(size_t)r * C + c] = bf16 ? bf2f(f2bf(f)) : f;
            }
        }
}

static void test_quantize_1x128(int bf16) {
    int R = 1000, C = 2048, nt = C / 128;
    size_t n = (size_t)R * C;
    float *x = gt_malloc(n * 4);
    fill_tiles(x, R, C, 128, bf16);
    uint8_t *q = gt_malloc(n);
    float *s = gt_malloc((size_t)R * nt * 4);
    fp8_quantize_1x128(q, s, x, R, C);
    void *dx = bf16 ? gt_dev_bf16(x, n) : gt_dev_bytes(x, n * 4);
    uint8_t *dq = cuda_alloc(n);
    float *ds = cuda_alloc((size_t)R * nt * 4);
    gt_poison(dq, n);
    gt_poison(ds, (size_t)R * nt * 4);
    check_rc(bf16 ? cuda_fp8_quantize_1x128(dq, ds, dx, R, C) : cuda_fp8_quantize_1x128_f32(dq, ds, dx, R, C),
             "quantize_1x128");
    uint8_t *gq = gt_host_bytes(dq, n);
    float *gs = gt_host_bytes(ds, (size_t)R * nt * 4);
    char what[96];
    snprintf(what, sizeof what, "1x128 from %s [%d, %d]: values", bf16 ? "BF16" : "FP32", R, C);
    gt_check_bits(what, gq, q, n, 1);
    snprintf(what, sizeof what, "1x128 from %s [%d, %d]: scales", bf16 ? "BF16" : "FP32", R, C);
    gt_check_bits(what, gs, s, (size_t)R * nt, 4);
    free(x); free(q); free(s); free(gq); free(gs);
    cuda_free(dx); cuda_free(dq); cuda_free(ds);
}

static void test_quantize_128x128(void) {
    int E = 3, M = 384, K = 640, mb = M / 128, kb = K / 128;
    size_t n = (size_t)E * M * K, ns = (size_t)E * mb * kb;
    float *w = gt_malloc(n * 4);
    // kinds per 128 x 128 block: fill each block's rows with one kind
    for (int e = 0; e < E; e++)
        for (int b = 0; b < mb * kb; b++) {
            float blk[128 * 128];
            fill_tiles(blk, 1, 128 * 128, 128 * 128, 0);
            int bi = b / kb, bj = b % kb;
            for (int i = 0; i < 128; i++)
                memcpy(w + ((size_t)e * M + bi * 128 + i) * K + bj * 128, blk + i * 128, 128 * 4);
        }
    uint8_t *q = gt_malloc(n);
    float *s = gt_malloc(ns * 4);
    fp8_quantize_128x128(q, s, w, E, M, K);
    float *dw = gt_dev_bytes(w, n * 4);
    uint8_t *dq = cuda_alloc(n);
    float *ds = cuda_alloc(ns * 4);
    gt_poison(dq, n);
    gt_poison(ds, ns * 4);
    check_rc(cuda_fp8_quantize_128x128(dq, ds, dw, E, M, K), "quantize_128x128");
    uint8_t *gq = gt_host_bytes(dq, n);
    float *gs = gt_host_bytes(ds, ns * 4);
    gt_check_bits("128x128 from FP32 [3, 384, 640]: values", gq, q, n, 1);
    gt_check_bits("128x128 from FP32 [3, 384, 640]: scales", gs, s, ns, 4);
    // and back (the data-grads' weights): float(q) * s rounded to BF16, NaN for NaN
    float *deq = gt_malloc(n * 4);
    fp8_dequantize_128x128(deq, q, s, E, M, K);
    void *dd = cuda_alloc(n * 2);
    gt_poison(dd, n * 2);
    check_rc(cuda_fp8_dequantize_128x128(dd, dq, ds, E, M, K), "dequantize_128x128");
    uint16_t *gd = gt_host_bytes(dd, n * 2);
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t ref = f2bf(deq[i]);
        int both_nan = isnan(deq[i]) && isnan(bf2f(gd[i]));
        differ += !both_nan && gd[i] != ref;
    }
    gt_ok(differ == 0, "dequantise 128x128 -> BF16 [3, 384, 640]: %zu of %zu differ", differ, n);
    free(deq); free(gd);
    cuda_free(dd);
    free(w); free(q); free(s); free(gq); free(gs);
    cuda_free(dw); cuda_free(dq); cuda_free(ds);
}

static void test_quantize_mx(void) {
    int R = 777, C = 1024, nb = C / 32;
    size_t n = (size_t)R * C;
    float *x = gt_malloc(n * 4);
    fill_tiles(x, R, C, 32, 1);
    uint8_t *q = gt_malloc(n), *s = gt_malloc((size_t)R * nb);
    fp8_quantize_mx(q, s, x, R, C);
    void *dx = gt_dev_bf16(x, n);
    uint8_t *dq = cuda_alloc(n), *ds = cuda_alloc((size_t)R * nb);
    gt_poison(dq, n);
    gt_poison(ds, (size_t)R * nb);
    check_rc(cuda_fp8_quantize_mx(dq, ds, dx, R, C), "quantize_mx");
    uint8_t *gq = gt_host_bytes(dq, n), *gs = gt_host_bytes(ds, (size_t)R * nb);
    gt_check_bits("MXFP8 from BF16 [777, 1024]: values", gq, q, n, 1);
    gt_check_bits("MXFP8 from BF16 [777, 1024]: E8M0 scales", gs, s, (size_t)R * nb, 1);
    free(x); free(q); free(s); free(gq); free(gs);
    cuda_free(dx); cuda_free(dq); cuda_free(ds);
}

static void test_gemm(const char *name, const int *off, int E, int C, int OC) {
    int R = off[E];
    size_t na = (size_t)R * C, nw = (size_t)E * OC * C, no = (size_t)R * OC;
    float *a = gt_malloc(na * 4), *w = gt_malloc(nw * 4);
    gt_fill(a, na, GT_NORMAL, 0, 1, 1, 11);
    gt_fill(w, nw, GT_NORMAL, 0, 1 / sqrtf((float)C), 0, 12);
    // a few rows with a large spread between 128-column tiles, so that the scales matter
    for (int r = 0; r < R; r += 7)
        for (int c = 0; c < C; c++) a[(size_t)r * C + c] *= (float)(1 << ((c / 128) % 5));
    void *da = gt_dev_bf16(a, na);
    float *dw = gt_dev_bytes(w, nw * 4);
    uint8_t *dqa = cuda_alloc(na + 16), *dqw = cuda_alloc(nw);
    float *dsa = cuda_alloc((size_t)R * (C / 128) * 4 + 16), *dsw = cuda_alloc((size_t)E * (OC / 128) * (C / 128) * 4);
    check_rc(cuda_fp8_quantize_1x128(dqa, dsa, da, R, C), "quantize_1x128");
    check_rc(cuda_fp8_quantize_128x128(dqw, dsw, dw, E, OC, C), "quantize_128x128");
    uint8_t *qa = gt_host_bytes(dqa, na), *qw = gt_host_bytes(dqw, nw);
    float *sa = gt_host_bytes(dsa, (size_t)R * (C / 128) * 4), *sw = gt_host_bytes(dsw, (size_t)E * (OC / 128) * (C / 128) * 4);
    float *ref = gt_malloc(no * 4);
    fp8_grouped_matmul_ref(ref, qa, sa, qw, sw, off, E, C, OC);
    int *doff = gt_dev_bytes(off, (E + 1) * sizeof(int));
    void *dout = cuda_alloc(no * 2 + 16);
    for (int v = 0; v < FP8_GEMM_VARIANTS; v++) { // the kernel's variants (fp8.cu), then the default again
        setenv("MOECORE_FP8_GEMM_VARIANT", (char[2]){(char)('0' + v), 0}, 1);
        gt_poison(dout, no * 2);
        check_rc(cuda_fp8_grouped_forward(dout, dqa, dsa, dqw, dsw, doff, E, C, OC), "fp8 grouped forward");
        float *g = gt_host_bf16(dout, no);
        char w2[128];
        snprintf(w2, sizeof w2, "fp8 grouped forward %s (variant %d)", name, v);
        gt_check(w2, g, ref, no, 4e-3);
        free(g);
    }
    unsetenv("MOECORE_FP8_GEMM_VARIANT");
    gt_poison(dout, no * 2);
    check_rc(cuda_fp8_grouped_forward(dout, dqa, dsa, dqw, dsw, doff, E, C, OC), "fp8 grouped forward");
    float *got = gt_host_bf16(dout, no);
    char what[128];
    snprintf(what, sizeof what, "fp8 grouped forward %s R=%d %d->%d", name, R, C, OC);
    int dims[3] = {R, OC, 0};
    gt_check_diag(what, got, ref, no, 4e-3, dims, off, E);
    // determinism: a second run gives the same bits
    gt_poison(dout, no * 2);
    check_rc(cuda_fp8_grouped_forward(dout, dqa, dsa, dqw, dsw, doff, E, C, OC), "fp8 grouped forward");
    float *again = gt_host_bf16(dout, no);
    snprintf(what, sizeof what, "fp8 grouped forward %s: run twice, same bits", name);
    gt_check_bits(what, again, got, no, 4);
    free(a); free(w); free(qa); free(qw); free(sa); free(sw); free(ref); free(got); free(again);
    cuda_free(da); cuda_free(dw); cuda_free(dqa); cuda_free(dqw); cuda_free(dsa); cuda_free(dsw);
    cuda_free(doff); cuda_free(dout);
}

// The device's q [n] and scales [ns] against q, s, bit for bit.
static void check_quantised(const char *what, const uint8_t *dq, const float *ds, const uint8_t *q, const float *s,
                            size_t n, size_t ns) {
    uint8_t *gq = gt_host_bytes(dq, n);
    float *gs = gt_host_bytes(ds, ns * 4);
    char line[160];
    snprintf(line, sizeof line, "%s: values", what);
    gt_check_bits(line, gq, q, n, 1);
    snprintf(line, sizeof line, "%s: scales", what);
    gt_check_bits(line, gs, s, ns, 4);
    free(gq); free(gs);
}

// The fused quantisers of train.precision: fp8 (ops.h's FP8 entries):
// gather + 1x128 against the CPU reference on the gathered rows; SwiGLU +
// 1x128 against cuda_swiglu_forward followed by the 1x128 quantiser (the
// same bits by construction); dequantisation against the reference rounded
// to BF16. All bit for bit; outputs poisoned first.
static void test_fused(void) {
    int N = 700, R = 1500, C = 1024, nt = C / 128;
    size_t n = (size_t)R * C;
    float *x = gt_malloc((size_t)N * C * 4), *xp = gt_malloc(n * 4);
    fill_tiles(x, N, C, 128, 1);
    int *rows = gt_malloc(R * sizeof(int));
    for (int r = 0; r < R; r++) rows[r] = gt_irand(N);
    for (int r = 0; r < R; r++) memcpy(xp + (size_t)r * C, x + (size_t)rows[r] * C, C * 4);
    uint8_t *q = gt_malloc(n);
    float *s = gt_malloc((size_t)R * nt * 4);
    fp8_quantize_1x128(q, s, xp, R, C);
    void *dx = gt_dev_bf16(x, (size_t)N * C);
    int *drows = gt_dev_bytes(rows, R * sizeof(int));
    uint8_t *dq = cuda_alloc(n);
    float *ds = cuda_alloc((size_t)R * nt * 4);
    gt_poison(dq, n);
    gt_poison(ds, (size_t)R * nt * 4);
    cuda_fp8_quantize_rows(dq, ds, dx, drows, R, C);
    check_quantised("gather + 1x128 [1500 of 700 rows, 1024]", dq, ds, q, s, n, (size_t)R * nt);
    { // gather + quantise + dequantise in one pass (fp8_fake_quantize_rows) = the two ops
        void *d1 = cuda_alloc(n * 2), *d2 = cuda_alloc(n * 2);
        gt_poison(d1, n * 2);
        gt_poison(d2, n * 2);
        check_rc(cuda_fp8_dequantize_1x128(d1, dq, ds, R, C), "dequantize_1x128");
        check_rc(cuda_fp8_gather_fake_quantize(d2, dx, drows, R, C), "gather_fake_quantize");
        uint16_t *h1 = gt_host_bytes(d1, n * 2), *h2 = gt_host_bytes(d2, n * 2);
        gt_check_bits("gather + quantise + dequantise [1500 of 700 rows, 1024] = the two ops", h2, h1, n, 2);
        free(h1); free(h2);
        cuda_free(d1); cuda_free(d2);
    }

    // SwiGLU + 1x128 = swiglu_forward then the quantiser (gate, up: ordinary values)
    float *g = gt_malloc(n * 4), *u = gt_malloc(n * 4);
    gt_fill(g, n, GT_NORMAL, 0, 2, 1, 21);
    gt_fill(u, n, GT_NORMAL, 0, 1, 1, 22);
    void *dg = gt_dev_bf16(g, n), *du = gt_dev_bf16(u, n), *da = cuda_alloc(n * 2);
    cuda_swiglu_forward(da, dg, du, n);
    check_rc(cuda_fp8_quantize_1x128(dq, ds, da, R, C), "quantize_1x128");
    uint8_t *uq = gt_host_bytes(dq, n);
    float *us = gt_host_bytes(ds, (size_t)R * nt * 4);
    gt_poison(dq, n);
    gt_poison(ds, (size_t)R * nt * 4);
    cuda_fp8_swiglu_quantize(dq, ds, dg, du, R, C);
    check_quantised("SwiGLU + 1x128 [1500, 1024] = swiglu_forward + quantise", dq, ds, uq, us, n, (size_t)R * nt);
    // dequantise (ordinary values: the SwiGLU's q, s): float(q) * s rounded to BF16
    uint16_t *ref = gt_malloc(n * 2);
    float *deq = gt_malloc(n * 4);
    fp8_dequantize_1x128(deq, uq, us, R, C);
    for (size_t i = 0; i < n; i++) ref[i] = f2bf(deq[i]);
    uint8_t *dq2 = gt_dev_bytes(uq, n);
    float *ds2 = gt_dev_bytes(us, (size_t)R * nt * 4);
    void *dd = cuda_alloc(n * 2);
    gt_poison(dd, n * 2);
    cuda_fp8_dequantize_rows(dd, dq2, ds2, R, C);
    uint16_t *gd = gt_host_bytes(dd, n * 2);
    gt_check_bits("dequantise 1x128 -> BF16 [1500, 1024]", gd, ref, n, 2);

    free(x); free(xp); free(rows); free(q); free(s); free(ref); free(deq); free(gd);
    free(g); free(u); free(uq); free(us);
    cuda_free(dx); cuda_free(drows); cuda_free(dq); cuda_free(ds); cuda_free(dq2); cuda_free(ds2); cuda_free(dd);
    cuda_free(dg); cuda_free(du); cuda_free(da);
}

// The weight quantiser's transposed copy, two weights side by side (the
// gate/up pair's layout: ldt = 2M, col0 0 and M): the forward copy and the
// transposed bytes and scales bit for bit against the CPU reference, every
// byte of the transposed buffer written (poisoned first).
static void test_transposed(void) {
    int E = 3, M = 384, K = 640, mb = M / 128, kb = K / 128, ldt = 2 * M;
    size_t n = (size_t)E * M * K, ns = (size_t)E * mb * kb;
    float *w[2];
    uint8_t *q[2], *dq[2], *qt = gt_malloc(2 * n), *dqt = cuda_alloc(2 * n);
    float *sc[2], *ds[2], *st = gt_malloc(2 * ns * 4), *dst = cuda_alloc(2 * ns * 4), *dw[2];
    gt_poison(dqt, 2 * n);
    gt_poison(dst, 2 * ns * 4);
    for (int h = 0; h < 2; h++) {
        w[h] = gt_malloc(n * 4);
        for (int e = 0; e < E; e++)
            for (int b = 0; b < mb * kb; b++) {
                float blk[128 * 128];
                fill_tiles(blk, 1, 128 * 128, 128 * 128, 0);
                int bi = b / kb, bj = b % kb;
                for (int i = 0; i < 128; i++)
                    memcpy(w[h] + ((size_t)e * M + bi * 128 + i) * K + bj * 128, blk + i * 128, 128 * 4);
            }
        q[h] = gt_malloc(n);
        sc[h] = gt_malloc(ns * 4);
        fp8_quantize_128x128(q[h], sc[h], w[h], E, M, K);
        fp8_transpose_128x128(qt, st, ldt, h * M, q[h], sc[h], E, M, K);
        dw[h] = gt_dev_bytes(w[h], n * 4);
        dq[h] = cuda_alloc(n);
        ds[h] = cuda_alloc(ns * 4);
        gt_poison(dq[h], n);
        gt_poison(ds[h], ns * 4);
        check_rc(cuda_fp8_quantize_128x128_t(dq[h], ds[h], dqt, dst, ldt, h * M, dw[h], E, M, K), "quantize_128x128_t");
        uint8_t *gq = gt_host_bytes(dq[h], n);
        float *gs = gt_host_bytes(ds[h], ns * 4);
        gt_check_bits(h ? "128x128 + transposed [3, 384, 640], 2nd: forward values" :
                          "128x128 + transposed [3, 384, 640], 1st: forward values", gq, q[h], n, 1);
        gt_check_bits(h ? "128x128 + transposed, 2nd: forward scales" : "128x128 + transposed, 1st: forward scales",
                      gs, sc[h], ns, 4);
        free(gq); free(gs);
    }
    uint8_t *gqt = gt_host_bytes(dqt, 2 * n);
    float *gst = gt_host_bytes(dst, 2 * ns * 4);
    gt_check_bits("transposed pair [3, 640, 2 x 384]: values", gqt, qt, 2 * n, 1);
    gt_check_bits("transposed pair [3, 640 / 128, 2 x 384 / 128]: scales", gst, st, 2 * ns, 4);
    free(gqt); free(gst); free(qt); free(st);
    cuda_free(dqt); cuda_free(dst);
    for (int h = 0; h < 2; h++) {
        free(w[h]); free(q[h]); free(sc[h]);
        cuda_free(dw[h]); cuda_free(dq[h]); cuda_free(ds[h]);
    }
}

// The SwiGLU backward fused with the pair's quantiser: dgate, dup the bits
// of cuda_swiglu_backward, q and scales those of fp8_quantize_1x128_pair on
// those BF16 values. Output grads with a magnitude per row (and a few zero
// rows), so that the tiles' scales differ.
static void test_swiglu_backward_quantize(void) {
    int R = 1500, F = 1024, nt = 2 * F / 128;
    size_t n = (size_t)R * F;
    float *g = gt_malloc(n * 4), *u = gt_malloc(n * 4), *d = gt_malloc(n * 4);
    gt_fill(g, n, GT_NORMAL, 0, 2, 1, 31);
    gt_fill(u, n, GT_NORMAL, 0, 1, 1, 32);
    gt_fill(d, n, GT_NORMAL, 0, 1, 0, 33);
    for (int r = 0; r < R; r++) {
        float mag = r % 97 == 0 ? 0.0f : ldexpf(1.0f, gt_irand(40) - 30);
        for (int c = 0; c < F; c++) d[(size_t)r * F + c] = bf2f(f2bf(d[(size_t)r * F + c] * mag));
    }
    void *dg = gt_dev_bf16(g, n), *du = gt_dev_bf16(u, n), *dd = gt_dev_bf16(d, n);
    void *rg = cuda_alloc(n * 2), *ru = cuda_alloc(n * 2), *og = cuda_alloc(n * 2), *ou = cuda_alloc(n * 2);
    cuda_swiglu_backward(rg, ru, dd, dg, du, n);
    uint8_t *dq = cuda_alloc(2 * n);
    float *ds = cuda_alloc((size_t)R * nt * 4);
    gt_poison(og, n * 2);
    gt_poison(ou, n * 2);
    gt_poison(dq, 2 * n);
    gt_poison(ds, (size_t)R * nt * 4);
    check_rc(cuda_fp8_swiglu_backward_quantize_1x128(og, ou, dq, ds, dd, dg, du, R, F), "swiglu_backward_quantize");
    uint16_t *hrg = gt_host_bytes(rg, n * 2), *hru = gt_host_bytes(ru, n * 2);
    uint16_t *hog = gt_host_bytes(og, n * 2), *hou = gt_host_bytes(ou, n * 2);
    gt_check_bits("SwiGLU backward + pair 1x128 [1500, 1024]: dgate = swiglu_backward's", hog, hrg, n, 2);
    gt_check_bits("SwiGLU backward + pair 1x128 [1500, 1024]: dup = swiglu_backward's", hou, hru, n, 2);
    float *fg = gt_malloc(n * 4), *fu = gt_malloc(n * 4);
    for (size_t i = 0; i < n; i++) fg[i] = bf2f(hrg[i]), fu[i] = bf2f(hru[i]);
    uint8_t *q = gt_malloc(2 * n);
    float *sc = gt_malloc((size_t)R * nt * 4);
    fp8_quantize_1x128_pair(q, sc, fg, fu, R, F);
    check_quantised("SwiGLU backward + pair 1x128 [1500, 2 x 1024]", dq, ds, q, sc, 2 * n, (size_t)R * nt);
    free(g); free(u); free(d); free(hrg); free(hru); free(hog); free(hou); free(fg); free(fu); free(q); free(sc);
    cuda_free(dg); cuda_free(du); cuda_free(dd); cuda_free(rg); cuda_free(ru); cuda_free(og); cuda_free(ou);
    cuda_free(dq); cuda_free(ds);
}

// unpermute_backward fused with the 1 x 128 quantiser of the dy it stores
// (cuda_fp8_unpermute_backward_quantize): dy and dweights bit for bit those
// of cuda_unpermute_backward, the codes and scales those of the CPU
// quantiser on that dy. dout from fill_tiles (zeros, NaN, +-inf,
// subnormals, spikes per tile), weights with zeros and negatives; C = 2048
// and 1024 (one 8-channel group a thread), 4096 (two), 384 (not a multiple
// of 8 x the block: the two ops); k = 8 and 2 (slot groups not full).
static void test_unpermute_backward_quantize(int N, int k, int C) {
    int R = N * k, nt = C / 128;
    size_t n = (size_t)R * C;
    float *dout = gt_malloc((size_t)N * C * 4), *y = gt_malloc(n * 4), *w = gt_malloc((size_t)R * 4);
    fill_tiles(dout, N, C, 128, 1);
    gt_fill(y, n, GT_NORMAL, 0, 1, 1, 41);
    gt_fill(w, R, GT_NORMAL, 0, 1, 0, 42);
    for (int i = 0; i < R; i += 13) w[i] = i % 26 ? -w[i] : 0.0f;
    int *row_of = gt_malloc(R * sizeof(int)); // a permutation of the rows
    for (int i = 0; i < R; i++) row_of[i] = i;
    for (int i = R - 1; i > 0; i--) {
        int j = gt_irand(i + 1), t = row_of[i];
        row_of[i] = row_of[j], row_of[j] = t;
    }
    void *ddout = gt_dev_bf16(dout, (size_t)N * C), *dy_ = gt_dev_bf16(y, n);
    float *dw = gt_dev_bytes(w, (size_t)R * 4);
    int *drow = gt_dev_bytes(row_of, R * sizeof(int));
    void *ref_dy = cuda_alloc(n * 2), *dy = cuda_alloc(n * 2);
    float *ref_dwt = cuda_alloc((size_t)R * 4), *dwt = cuda_alloc((size_t)R * 4);
    uint8_t *dq = cuda_alloc(n);
    float *ds = cuda_alloc((size_t)R * nt * 4);
    cuda_unpermute_backward(ref_dy, ref_dwt, ddout, dy_, dw, drow, N, k, C);
    gt_poison(dy, n * 2);
    gt_poison(dwt, (size_t)R * 4);
    gt_poison(dq, n);
    gt_poison(ds, (size_t)R * nt * 4);
    cuda_fp8_unpermute_backward_quantize(dy, dwt, dq, ds, ddout, dy_, dw, drow, N, k, C);
    char what[128];
    uint16_t *hr = gt_host_bytes(ref_dy, n * 2), *hd = gt_host_bytes(dy, n * 2);
    snprintf(what, sizeof what, "unpermute backward + 1x128 N=%d k=%d C=%d: dy = unpermute_backward's", N, k, C);
    gt_check_bits(what, hd, hr, n, 2);
    float *hrw = gt_host_bytes(ref_dwt, (size_t)R * 4), *hdw = gt_host_bytes(dwt, (size_t)R * 4);
    snprintf(what, sizeof what, "unpermute backward + 1x128 N=%d k=%d C=%d: dweights = unpermute_backward's", N, k, C);
    gt_check_bits(what, hdw, hrw, R, 4);
    float *f = gt_malloc(n * 4);
    for (size_t i = 0; i < n; i++) f[i] = bf2f(hr[i]);
    uint8_t *q = gt_malloc(n);
    float *sc = gt_malloc((size_t)R * nt * 4);
    fp8_quantize_1x128(q, sc, f, R, C);
    snprintf(what, sizeof what, "unpermute backward + 1x128 N=%d k=%d C=%d", N, k, C);
    check_quantised(what, dq, ds, q, sc, n, (size_t)R * nt);
    free(dout); free(y); free(w); free(row_of); free(hr); free(hd); free(hrw); free(hdw); free(f); free(q); free(sc);
    cuda_free(ddout); cuda_free(dy_); cuda_free(dw); cuda_free(drow); cuda_free(ref_dy); cuda_free(dy);
    cuda_free(ref_dwt); cuda_free(dwt); cuda_free(dq); cuda_free(ds);
}

static void unpermute_quantize_tests(void) {
    setenv("MOECORE_FP8_UNPERMUTE_FUSED", "0", 1); // the two ops
    test_unpermute_backward_quantize(300, 8, 2048);
    unsetenv("MOECORE_FP8_UNPERMUTE_FUSED"); // the fused kernel (the default), and the two ops at C = 384
    test_unpermute_backward_quantize(300, 8, 2048);
    test_unpermute_backward_quantize(301, 2, 1024);
    test_unpermute_backward_quantize(97, 8, 4096);
    test_unpermute_backward_quantize(100, 3, 384);
}

// fp8.wgrad: fp8's operands (cuda_fp8_fake_quantize_128x1, the op
// fp8_fake_quantize_tokens): against fp8_fake_quantize_128x1 on the same
// BF16 values, each result rounded to BF16 (NaN for NaN), bit for bit.
// Segments of 0, 1, 127, 128, 129 and longer rows (tiles that end inside a
// segment, empty experts), a spike in each segment's first row (it would
// move the previous segment's last tile's scale if a tile crossed the
// boundary), per 8-row run a kind of fill_tiles (zeros, NaN, +-inf, BF16
// subnormals, amax under the floor, spikes), and column blocks of 256 with
// a partial last one. Rows past offsets[E] stay as they were.
static void test_fake_quantize_128x1(const char *name, const int *off, int E, int C, int extra) {
    int R = off[E] + extra;
    size_t n = (size_t)R * C;
    float *x = gt_malloc(n * 4), *col = gt_malloc((size_t)8 * C * 4);
    for (int r0 = 0; r0 < R; r0 += 8) { // a kind per 8 rows x 8 columns, so that tiles along the rows vary
        fill_tiles(col, C / 8, 64, 64, 1);
        for (int i = 0; i < 8 && r0 + i < R; i++)
            for (int c = 0; c < C; c++) x[(size_t)(r0 + i) * C + c] = col[(size_t)(c / 8) * 64 + i * 8 + c % 8];
    }
    for (int e = 0; e < E; e++)
        if (off[e + 1] > off[e]) x[(size_t)off[e] * C + 3] = bf2f(f2bf(3e4f));
    float *ref = gt_malloc(n * 4);
    memcpy(ref, x, n * 4);
    fp8_fake_quantize_128x1(ref, off, E, C);
    void *dx = gt_dev_bf16(x, n);
    int *doff = gt_dev_bytes(off, (E + 1) * sizeof(int));
    check_rc(cuda_fp8_fake_quantize_128x1(dx, doff, E, C), "fake_quantize_128x1");
    uint16_t *got = gt_host_bytes(dx, n * 2);
    size_t differ = 0, nan = 0, first = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        uint16_t want = f2bf(ref[i]);
        int both_nan = isnan(ref[i]) && isnan(bf2f(got[i]));
        nan += both_nan;
        if (!both_nan && got[i] != want) {
            if (first == (size_t)-1) first = i;
            differ++;
        }
    }
    if (differ)
        printf("      first at row %zu column %zu: x %.9g -> gpu %.9g, cpu %.9g\n", first / C, first % C, x[first],
               bf2f(got[first]), ref[first]);
    gt_ok(differ == 0, "fake quantise 128x1 %s [%d, %d], %d experts: %zu of %zu differ from the CPU's (rounded to "
          "BF16; %zu NaN)", name, R, C, E, differ, n, nan);
    free(x); free(col); free(ref); free(got);
    cuda_free(dx); cuda_free(doff);
}

// x [R, C] with a magnitude per row (a few zero rows) and per column
// block, BF16-rounded: tiles along the tokens whose scales differ.
static void fill_grads(float *x, int R, int C, uint64_t seed) {
    gt_fill(x, (size_t)R * C, GT_NORMAL, 0, 1, 0, seed);
    for (int r = 0; r < R; r++) {
        float mag = r % 61 == 0 ? 0.0f : ldexpf(1.0f, gt_irand(12) - 6);
        for (int c = 0; c < C; c++) x[(size_t)r * C + c] = bf2f(f2bf(x[(size_t)r * C + c] * mag * (float)(1 + c / 128 % 3)));
    }
}

// The transposing quantiser (cuda_fp8_quantize_tokens_t) against the CPU
// rules: codes and scales bit for bit (the scale of each 128-token block
// and column from its amax, the codes e4m3(x / s), zeros past a segment's
// end), and float(code) * scale equal to fp8_fake_quantize_128x1's value
// (FP32 bits). Returns the device's qt and st on the host.
static void check_tokens_t(const char *name, const float *x, const int *off, int E, int C, int ldk, const void *dx,
                           const int *doff, uint8_t **hq, float **hs) {
    int R = off[E], nb = ldk / 128;
    uint8_t *dq = cuda_alloc((size_t)C * ldk);
    float *ds = cuda_alloc((size_t)nb * C * 4);
    gt_poison(dq, (size_t)C * ldk);
    gt_poison(ds, (size_t)nb * C * 4);
    check_rc(cuda_fp8_quantize_tokens_t(dq, ds, dx, doff, E, C, ldk), "quantize_tokens_t");
    uint8_t *q = gt_host_bytes(dq, (size_t)C * ldk);
    float *s = gt_host_bytes(ds, (size_t)nb * C * 4);
    float *fq = gt_malloc((size_t)R * C * 4);
    memcpy(fq, x, (size_t)R * C * 4);
    fp8_fake_quantize_128x1(fq, off, E, C);
    size_t bad_q = 0, bad_s = 0, bad_v = 0, checked = 0;
    int kb = 0;
    for (int e = 0; e < E; e++)
        for (int r0 = off[e]; r0 < off[e + 1]; r0 += 128, kb++)
            for (int c = 0; c < C; c++) {
                float amax = 0.0f;
                for (int r = r0; r < r0 + 128 && r < off[e + 1]; r++) amax = fmaxf(amax, fabsf(x[(size_t)r * C + c]));
                float sc = fp8_block_scale(amax);
                bad_s += memcmp(&sc, &s[(size_t)kb * C + c], 4) != 0;
                for (int i = 0; i < 128; i++) {
                    int r = r0 + i;
                    uint8_t got = q[(size_t)c * ldk + (size_t)kb * 128 + i];
                    uint8_t want = r < off[e + 1] ? fp8_e4m3_from_float(x[(size_t)r * C + c] / sc) : 0;
                    bad_q += got != want;
                    if (r < off[e + 1]) {
                        float v = fp8_e4m3_to_float(got) * s[(size_t)kb * C + c], w = fq[(size_t)r * C + c];
                        bad_v += memcmp(&v, &w, 4) != 0 && !(isnan(v) && isnan(w));
                    }
                    checked++;
                }
            }
    gt_ok(bad_q == 0 && bad_s == 0 && bad_v == 0,
          "quantise along the tokens, transposed, %s [%d, %d] -> [%d, %d of %d]: %zu of %zu codes, %zu of %zu scales, "
          "%zu dequantised values differ from the CPU's", name, R, C, C, kb * 128, ldk, bad_q, checked, bad_s,
          (size_t)kb * C, bad_v);
    free(fq);
    cuda_free(dq); cuda_free(ds);
    *hq = q;
    *hs = s;
}

// The requantiser (cuda_fp8_requantize_tokens_t): x's 1 x 128 codes and
// scales along the tokens in one pass against the two calls it replaces
// (cuda_fp8_dequantize_1x128, then cuda_fp8_quantize_tokens_t), codes and
// scales bit for bit over the whole outputs, both poisoned alike first.
static void check_requant(const char *name, const int *off, int E, int C, int ldk, const void *dx, const int *doff) {
    int R = off[E], nb = ldk / 128;
    size_t nq = (size_t)C * ldk, ns = (size_t)nb * C * 4;
    uint8_t *q = cuda_alloc((size_t)R * C), *qa = cuda_alloc(nq), *qb = cuda_alloc(nq);
    float *s = cuda_alloc((size_t)R * (C / 128) * 4), *sa = cuda_alloc(ns), *sb = cuda_alloc(ns);
    void *deq = cuda_alloc((size_t)R * C * 2);
    check_rc(cuda_fp8_quantize_1x128(q, s, dx, R, C), "quantize_1x128");
    gt_poison(qa, nq); gt_poison(qb, nq); gt_poison(sa, ns); gt_poison(sb, ns);
    check_rc(cuda_fp8_dequantize_1x128(deq, q, s, R, C), "dequantize_1x128");
    check_rc(cuda_fp8_quantize_tokens_t(qa, sa, deq, doff, E, C, ldk), "quantize_tokens_t");
    check_rc(cuda_fp8_requantize_tokens_t(qb, sb, q, s, doff, E, C, ldk), "requantize_tokens_t");
    uint8_t *ha = gt_host_bytes(qa, nq), *hb = gt_host_bytes(qb, nq);
    float *hsa = gt_host_bytes(sa, ns), *hsb = gt_host_bytes(sb, ns);
    char what[200];
    snprintf(what, sizeof what, "requantise along the tokens %s [%d, %d]: codes as dequantise + quantise", name, R, C);
    gt_check_bits(what, hb, ha, nq, 1);
    snprintf(what, sizeof what, "requantise along the tokens %s: scales", name);
    gt_check_bits(what, hsb, hsa, ns / 4, 4);
    free(ha); free(hb); free(hsa); free(hsb);
    cuda_free(q); cuda_free(qa); cuda_free(qb); cuda_free(s); cuda_free(sa); cuda_free(sb); cuda_free(deq);
}

// fp8.wgrad: fp8's speed path: the transposing quantiser on both operands
// (check_tokens_t), then the FP8 grouped weight-grad against the CPU
// reference (both operands fake-quantised, FP32 grouped weight-grad):
// assigned over a poisoned dw (empty experts get zeros), then accumulated
// (2x), and run twice for the same bits.
static void test_wgrad(const char *name, const int *off, int E, int C, int OC) {
    int R = off[E], ldk = fp8_tokens_ldk(R, E), nb = ldk / 128;
    size_t ny = (size_t)R * OC, nx = (size_t)R * C, nw = (size_t)E * OC * C;
    float *y = gt_malloc(ny * 4), *x = gt_malloc(nx * 4);
    fill_grads(y, R, OC, 71);
    fill_grads(x, R, C, 72);
    int *doff = gt_dev_bytes(off, (E + 1) * sizeof(int));
    uint8_t *qy, *qx;
    float *sy, *sx;
    char what[160];
    // NaN, +-inf: the code 0x7f, +-448, the block's other values keep the others' scale (not multiplied below)
    float keep[3] = {x[5], x[C + 6], x[2 * C + 7]};
    x[5] = NAN, x[C + 6] = INFINITY, x[2 * C + 7] = -INFINITY;
    void *dx = gt_dev_bf16(x, nx);
    snprintf(what, sizeof what, "%s, NaN and inf", name);
    check_tokens_t(what, x, off, E, C, ldk, dx, doff, &qx, &sx);
    free(qx); free(sx);
    x[5] = keep[0], x[C + 6] = keep[1], x[2 * C + 7] = keep[2];
    gt_upload_bf16(dx, x, nx);
    void *dy = gt_dev_bf16(y, ny);
    snprintf(what, sizeof what, "%s dout", name);
    check_tokens_t(what, y, off, E, OC, ldk, dy, doff, &qy, &sy);
    snprintf(what, sizeof what, "%s inp", name);
    check_tokens_t(what, x, off, E, C, ldk, dx, doff, &qx, &sx);
    check_requant(name, off, E, C, ldk, dx, doff);
    float *fy = gt_malloc(ny * 4), *fx = gt_malloc(nx * 4), *ref = gt_malloc(nw * 4);
    memcpy(fy, y, ny * 4);
    memcpy(fx, x, nx * 4);
    fp8_fake_quantize_128x1(fy, off, E, OC);
    fp8_fake_quantize_128x1(fx, off, E, C);
    ops_cpu.grouped_matmul_backward(NULL, ref, fy, fx, NULL, off, E, C, OC, 0);
    uint8_t *dqy = gt_dev_bytes(qy, (size_t)OC * ldk), *dqx = gt_dev_bytes(qx, (size_t)C * ldk);
    float *dsy = gt_dev_bytes(sy, (size_t)nb * OC * 4), *dsx = gt_dev_bytes(sx, (size_t)nb * C * 4);
    float *ddw = cuda_alloc(nw * 4);
    float *ref2 = gt_malloc(nw * 4);
    for (size_t i = 0; i < nw; i++) ref2[i] = 2 * ref[i];
    int dims[4] = {E, OC, C, 0};
    for (int v = 0; v < 3; v++) { // the variants (fp8.cu): stores from registers, TMA from shared memory, double-buffered
        setenv("MOECORE_FP8_WGRAD_VARIANT", (char[2]){(char)('0' + v), 0}, 1);
        gt_poison(ddw, nw * 4);
        check_rc(cuda_fp8_grouped_wgrad(ddw, dqy, dsy, dqx, dsx, doff, E, C, OC, ldk, 0), "fp8 grouped wgrad");
        float *g = gt_host_f32(ddw, nw);
        snprintf(what, sizeof what, "fp8 grouped wgrad %s R=%d [%d, %d, %d] (=, variant %d)", name, R, E, OC, C, v);
        gt_check_diag(what, g, ref, nw, 1e-3, dims, NULL, 0);
        free(g);
        check_rc(cuda_fp8_grouped_wgrad(ddw, dqy, dsy, dqx, dsx, doff, E, C, OC, ldk, 1), "fp8 grouped wgrad");
        g = gt_host_f32(ddw, nw);
        snprintf(what, sizeof what, "fp8 grouped wgrad %s (+=, variant %d): twice", name, v);
        gt_check_diag(what, g, ref2, nw, 1e-3, dims, NULL, 0);
        free(g);
    }
    unsetenv("MOECORE_FP8_WGRAD_VARIANT");
    gt_poison(ddw, nw * 4);
    check_rc(cuda_fp8_grouped_wgrad(ddw, dqy, dsy, dqx, dsx, doff, E, C, OC, ldk, 0), "fp8 grouped wgrad");
    float *got = gt_host_f32(ddw, nw);
    gt_poison(ddw, nw * 4);
    check_rc(cuda_fp8_grouped_wgrad(ddw, dqy, dsy, dqx, dsx, doff, E, C, OC, ldk, 0), "fp8 grouped wgrad");
    float *again = gt_host_f32(ddw, nw);
    snprintf(what, sizeof what, "fp8 grouped wgrad %s: run twice, same bits", name);
    gt_check_bits(what, again, got, nw, 4);
    free(y); free(x); free(qy); free(qx); free(sy); free(sx); free(fy); free(fx); free(ref); free(ref2); free(got);
    free(again);
    cuda_free(dy); cuda_free(dx); cuda_free(doff); cuda_free(dqy); cuda_free(dqx); cuda_free(dsy); cuda_free(dsx);
    cuda_free(ddw);
}

// The FP8 data-grad: dX [R, C] = deq(dY) deq(W_e) for the forward weights W
// [E, OC, C] (pair: dY = [dY1 | dY2] [R, 2 OC] against [W1; W2], the
// gate/up data-grad) on the forward kernel with the transposed copy from
// cuda_fp8_quantize_128x128_t, against fp8_grouped_matmul_ref with the CPU's
// transposition of the device's forward copy; output poisoned first.
static void test_dgrad(const char *name, const int *off, int E, int C, int OC, int pair) {
    int R = off[E], np = pair ? 2 : 1, K = np * OC; // K: the data-grad's inner dimension
    size_t nw = (size_t)E * OC * C, ny = (size_t)R * K, nx = (size_t)R * C, nts = (size_t)E * (C / 128) * (K / 128);
    float *y = gt_malloc(ny * 4), *w = gt_malloc(nw * 4);
    gt_fill(y, ny, GT_NORMAL, 0, 1, 1, 41);
    for (int r = 0; r < R; r += 5) // rows with a spread between tiles, so that the scales matter
        for (int c = 0; c < K; c++) y[(size_t)r * K + c] *= (float)(1 << ((c / 128) % 5));
    void *dy = gt_dev_bf16(y, ny);
    uint8_t *dqy = cuda_alloc(ny + 16), *dqt = cuda_alloc(np * nw);
    float *dsy = cuda_alloc((size_t)R * (K / 128) * 4 + 16), *dst = cuda_alloc(nts * 4);
    uint8_t *qt = gt_malloc(np * nw);
    float *st = gt_malloc(nts * 4);
    check_rc(cuda_fp8_quantize_1x128(dqy, dsy, dy, R, K), "quantize_1x128");
    for (int h = 0; h < np; h++) {
        gt_fill(w, nw, GT_NORMAL, 0, 1 / sqrtf((float)C), 0, 42 + h);
        float *dw = gt_dev_bytes(w, nw * 4);
        uint8_t *dq = cuda_alloc(nw);
        float *ds = cuda_alloc((size_t)E * (OC / 128) * (C / 128) * 4);
        check_rc(cuda_fp8_quantize_128x128_t(dq, ds, dqt, dst, K, h * OC, dw, E, OC, C), "quantize_128x128_t");
        uint8_t *q = gt_host_bytes(dq, nw);
        float *sc = gt_host_bytes(ds, (size_t)E * (OC / 128) * (C / 128) * 4);
        fp8_transpose_128x128(qt, st, K, h * OC, q, sc, E, OC, C);
        free(q); free(sc);
        cuda_free(dw); cuda_free(dq); cuda_free(ds);
    }
    uint8_t *qy = gt_host_bytes(dqy, ny);
    float *sy = gt_host_bytes(dsy, (size_t)R * (K / 128) * 4);
    float *ref = gt_malloc(nx * 4);
    fp8_grouped_matmul_ref(ref, qy, sy, qt, st, off, E, K, C);
    int *doff = gt_dev_bytes(off, (E + 1) * sizeof(int));
    void *dx = cuda_alloc(nx * 2 + 16);
    char what[128];
    int dims[3] = {R, C, 0};
    for (int v = 0; v < FP8_GEMM_VARIANTS; v++) { // every variant of the kernel, then the default
        setenv("MOECORE_FP8_GEMM_VARIANT", (char[2]){(char)('0' + v), 0}, 1);
        gt_poison(dx, nx * 2);
        check_rc(cuda_fp8_grouped_forward(dx, dqy, dsy, dqt, dst, doff, E, K, C), "fp8 data-grad");
        float *g = gt_host_bf16(dx, nx);
        snprintf(what, sizeof what, "fp8 data-grad %s (variant %d)", name, v);
        gt_check(what, g, ref, nx, 4e-3);
        free(g);
    }
    unsetenv("MOECORE_FP8_GEMM_VARIANT");
    gt_poison(dx, nx * 2);
    check_rc(cuda_fp8_grouped_forward(dx, dqy, dsy, dqt, dst, doff, E, K, C), "fp8 data-grad");
    float *got = gt_host_bf16(dx, nx);
    snprintf(what, sizeof what, "fp8 data-grad %s R=%d %d->%d", name, R, K, C);
    gt_check_diag(what, got, ref, nx, 4e-3, dims, off, E);
    free(y); free(w); free(qt); free(st); free(qy); free(sy); free(ref); free(got);
    cuda_free(dy); cuda_free(dqy); cuda_free(dqt); cuda_free(dsy); cuda_free(dst); cuda_free(doff); cuda_free(dx);
}

// fp8.gemms: experts_dense (gemm_fp8.cu): the quantiser with transposed
// scales (bit for bit against fp8_quantize_1x128_t of the BF16 values), and
// the cuBLASLt block-scaled FP8 GEMM, forward (= and +=) and data-grad (the
// transposed copy of cuda_fp8_quantize_128x128_t), against fp8_matmul_ref
// on the device's own codes and scales; outputs poisoned first. Rows and
// tiles of x, dY and the weights' blocks get different magnitudes, so a
// scale read from the wrong tile or block shows.
static void test_dense(const char *name, int N, int C, int OC) {
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    int ct = C / 128, ot = OC / 128;
    char why[300] = "", what[160];
    int sup = cuda_fp8_dense_supports(N, C, OC, why, sizeof why);
    gt_ok(sup, "fp8 dense %s: cuBLASLt has block-scaled FP8 algorithms for N %d, %d -> %d and back%s%s", name, N, C,
          OC, sup ? "" : ": ", why);
    if (!sup) return;
    float *x = gt_malloc(nx * 4), *w = gt_malloc(nw * 4), *y = gt_malloc(ny * 4), *y0 = gt_malloc(ny * 4);
    gt_fill(x, nx, GT_NORMAL, 0, 1, 1, 61);
    gt_fill(w, nw, GT_NORMAL, 0, 1 / sqrtf((float)C), 0, 62);
    gt_fill(y, ny, GT_NORMAL, 0, 1, 1, 63);
    gt_fill(y0, ny, GT_NORMAL, 0, 1, 1, 64);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++) x[(size_t)r * C + c] *= (float)(1 << ((r % 3 + c / 128) % 6));
    for (int r = 0; r < N; r++)
        for (int o = 0; o < OC; o++) y[(size_t)r * OC + o] *= (float)(1 << ((r % 5 + 2 * (o / 128)) % 7));
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++) w[(size_t)o * C + c] *= ldexpf(1.0f, (3 * (o / 128) + c / 128) % 5 - 2);
    void *dx = gt_dev_bf16(x, nx), *dy = gt_dev_bf16(y, ny);
    float *dw = gt_dev_bytes(w, nw * 4);
    uint8_t *dqx = cuda_alloc(nx), *dqy = cuda_alloc(ny), *dqw = cuda_alloc(nw), *dqwt = cuda_alloc(nw);
    float *dsx = cuda_alloc((size_t)N * ct * 4), *dsy = cuda_alloc((size_t)N * ot * 4);
    float *dsw = cuda_alloc((size_t)ot * ct * 4), *dswt = cuda_alloc((size_t)ot * ct * 4);
    gt_poison(dqx, nx); gt_poison(dsx, (size_t)N * ct * 4);
    check_rc(cuda_fp8_quantize_rows_t(dqx, dsx, dx, N, C), "quantize_rows_t");
    check_rc(cuda_fp8_quantize_rows_t(dqy, dsy, dy, N, OC), "quantize_rows_t");
    check_rc(cuda_fp8_quantize_128x128_t(dqw, dsw, dqwt, dswt, OC, 0, dw, 1, OC, C), "quantize_128x128_t");
    uint8_t *qx = gt_host_bytes(dqx, nx), *qy = gt_host_bytes(dqy, ny), *qw = gt_host_bytes(dqw, nw);
    uint8_t *qwt = gt_host_bytes(dqwt, nw);
    float *sx = gt_host_bytes(dsx, (size_t)N * ct * 4), *sy = gt_host_bytes(dsy, (size_t)N * ot * 4);
    float *sw = gt_host_bytes(dsw, (size_t)ot * ct * 4), *swt = gt_host_bytes(dswt, (size_t)ot * ct * 4);
    // the quantiser, bit for bit (x holds the BF16 values the device read)
    uint8_t *rq = gt_malloc(nx);
    float *rs = gt_malloc((size_t)N * ct * 4);
    fp8_quantize_1x128_t(rq, rs, x, N, C);
    snprintf(what, sizeof what, "fp8 dense %s: 1x128 quantiser, transposed scales: values", name);
    gt_check_bits(what, qx, rq, nx, 1);
    snprintf(what, sizeof what, "fp8 dense %s: 1x128 quantiser, transposed scales: scales", name);
    gt_check_bits(what, sx, rs, (size_t)N * ct, 4);
    // forward
    float *ref = gt_malloc(ny * 4), *ref_acc = gt_malloc(ny * 4), *refd = gt_malloc(nx * 4);
    fp8_matmul_ref(ref, qx, sx, qw, sw, N, C, OC);
    void *dout = cuda_alloc(ny * 2), *ddx = cuda_alloc(nx * 2);
    gt_poison(dout, ny * 2);
    check_rc(cuda_fp8_dense_matmul(dout, dqx, dsx, dqw, dsw, N, C, OC, 0), "fp8 dense forward");
    float *got = gt_host_bf16(dout, ny);
    snprintf(what, sizeof what, "fp8 dense %s forward: [%d, %d] x [%d, %d]^T", name, N, C, OC, C);
    gt_check(what, got, ref, ny, 4e-3);
    // forward, accumulating into y0 (beta = 1)
    void *dy0 = gt_dev_bf16(y0, ny);
    check_rc(cuda_fp8_dense_matmul(dy0, dqx, dsx, dqw, dsw, N, C, OC, 1), "fp8 dense forward +=");
    float *got_acc = gt_host_bf16(dy0, ny);
    for (size_t i = 0; i < ny; i++) ref_acc[i] = ref[i] + y0[i];
    snprintf(what, sizeof what, "fp8 dense %s forward, +=", name);
    gt_check(what, got_acc, ref_acc, ny, 4e-3);
    // data-grad dX [N, C] = deq(dY) deq(W): the transposed copy (its bytes: the forward copy's, moved)
    uint8_t *tq = gt_malloc(nw);
    float *ts = gt_malloc((size_t)ot * ct * 4);
    fp8_transpose_128x128(tq, ts, OC, 0, qw, sw, 1, OC, C);
    snprintf(what, sizeof what, "fp8 dense %s: transposed weight copy", name);
    gt_check_bits(what, qwt, tq, nw, 1);
    fp8_matmul_ref(refd, qy, sy, qwt, swt, N, OC, C);
    gt_poison(ddx, nx * 2);
    check_rc(cuda_fp8_dense_matmul(ddx, dqy, dsy, dqwt, dswt, N, OC, C, 0), "fp8 dense data-grad");
    float *gotd = gt_host_bf16(ddx, nx);
    snprintf(what, sizeof what, "fp8 dense %s data-grad: [%d, %d] x [%d, %d]", name, N, OC, OC, C);
    gt_check(what, gotd, refd, nx, 4e-3);
    free(x); free(w); free(y); free(y0); free(qx); free(qy); free(qw); free(qwt); free(sx); free(sy); free(sw);
    free(swt); free(rq); free(rs); free(ref); free(ref_acc); free(refd); free(got); free(got_acc); free(tq); free(ts);
    free(gotd);
    cuda_free(dx); cuda_free(dy); cuda_free(dw); cuda_free(dqx); cuda_free(dqy); cuda_free(dqw); cuda_free(dqwt);
    cuda_free(dsx); cuda_free(dsy); cuda_free(dsw); cuda_free(dswt); cuda_free(dout); cuda_free(ddx); cuda_free(dy0);
}

static void dense_tests(void) {
    char probe[1024];
    cuda_fp8_dense_probe(8192, 2048, 2048, probe, sizeof probe);
    printf("cuBLASLt block-scaled FP8 heuristics, 8192 tokens, 2048 -> 2048:\n%s", probe);
    test_dense("small (K/128 = 3: padded block scales)", 256, 384, 256);
    test_dense("OLMoE-1B-7B q/k/v/o (8192 tokens, 2048 -> 2048)", 8192, 2048, 2048);
}

// fp8.wgrad: fp8's checks (the fake quantiser, the speed path)
// A random permutation of 0..n-1 (gt_irand's stream).
static int *random_perm(int n) {
    int *p = gt_malloc(n * sizeof(int));
    for (int i = 0; i < n; i++) p[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = gt_irand(i + 1), t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    return p;
}

// The FP8 dispatch payload of train.precision: fp8 with ep > 1
// (fp8_payload.cu): pack and unpack against the CPU's fp8_pack_rows /
// fp8_unpack_rows, bit for bit, outputs poisoned first, on random bytes as
// codes and scales (any bit pattern, NaN among them: the kernels move words,
// never floats), rows of 128 values (132-byte payload rows, 4-byte aligned
// only) and of 2048, through a random regroup map and none. Then the
// dispatch's chain on one device: the gather's quantiser, pack, the rows
// moved in another order (the all-to-all), unpack through a regroup map:
// the CPU quantiser's codes and scales of the regrouped rows.
static void test_payload(void) {
    int Cs[2] = {128, 2048};
    for (int ci = 0; ci < 2; ci++) {
        int R = 777, C = Cs[ci], ns = C / 128;
        size_t pb = fp8_payload_bytes(C), n = (size_t)R * C;
        uint8_t *q = gt_malloc(n), *p = gt_malloc(R * pb), *ql = gt_malloc(n);
        uint32_t *s = gt_malloc((size_t)R * ns * 4);
        float *sl = gt_malloc((size_t)R * ns * 4);
        for (size_t i = 0; i < n; i++) q[i] = (uint8_t)gt_next(&gt_rng);
        for (size_t i = 0; i < (size_t)R * ns; i++) s[i] = (uint32_t)gt_next(&gt_rng);
        int *map = random_perm(R);
        fp8_pack_rows(p, q, (const float *)s, R, C);
        fp8_unpack_rows(ql, sl, p, map, R, C);
        uint8_t *dq = gt_dev_bytes(q, n), *dp = cuda_alloc(R * pb), *dql = cuda_alloc(n);
        float *ds = gt_dev_bytes(s, (size_t)R * ns * 4), *dsl = cuda_alloc((size_t)R * ns * 4);
        int *dmap = gt_dev_bytes(map, R * sizeof(int));
        char what[160];
        gt_poison(dp, R * pb);
        check_rc(cuda_fp8_payload_pack(dp, dq, ds, R, C), "payload pack");
        uint8_t *gp = gt_host_bytes(dp, R * pb);
        snprintf(what, sizeof what, "payload pack [%d rows of %d: %zu bytes a row]", R, C, pb);
        gt_check_bits(what, gp, p, R * pb, 1);
        gt_poison(dql, n);
        gt_poison(dsl, (size_t)R * ns * 4);
        check_rc(cuda_fp8_payload_unpack(dql, dsl, dp, dmap, R, C), "payload unpack");
        snprintf(what, sizeof what, "payload unpack through a regroup map [%d, %d]", R, C);
        check_quantised(what, dql, dsl, ql, sl, n, (size_t)R * ns);
        gt_poison(dql, n);
        gt_poison(dsl, (size_t)R * ns * 4);
        check_rc(cuda_fp8_payload_unpack(dql, dsl, dp, NULL, R, C), "payload unpack");
        snprintf(what, sizeof what, "payload unpack, no map [%d, %d]", R, C);
        check_quantised(what, dql, dsl, q, (const float *)s, n, (size_t)R * ns);
        free(q); free(p); free(ql); free(s); free(sl); free(map); free(gp);
        cuda_free(dq); cuda_free(dp); cuda_free(dql); cuda_free(ds); cuda_free(dsl); cuda_free(dmap);
    }

    int N = 300, R = 600, C = 1024, nt = C / 128;
    size_t n = (size_t)R * C, pb = fp8_payload_bytes(C);
    float *x = gt_malloc((size_t)N * C * 4), *xr = gt_malloc(n * 4);
    fill_tiles(x, N, C, 128, 1);
    int *rows = gt_malloc(R * sizeof(int)), *recv = random_perm(R), *regroup = random_perm(R);
    for (int r = 0; r < R; r++) rows[r] = gt_irand(N);
    for (int r = 0; r < R; r++) // the regrouped row r is sent row recv[regroup[r]]
        memcpy(xr + (size_t)r * C, x + (size_t)rows[recv[regroup[r]]] * C, C * 4);
    uint8_t *qr = gt_malloc(n);
    float *sr = gt_malloc((size_t)R * nt * 4);
    fp8_quantize_1x128(qr, sr, xr, R, C);
    void *dx = gt_dev_bf16(x, (size_t)N * C);
    int *drows = gt_dev_bytes(rows, R * sizeof(int)), *dregroup = gt_dev_bytes(regroup, R * sizeof(int));
    uint8_t *dq = cuda_alloc(n), *dp = cuda_alloc(R * pb), *dql = cuda_alloc(n);
    float *ds = cuda_alloc((size_t)R * nt * 4), *dsl = cuda_alloc((size_t)R * nt * 4);
    cuda_fp8_quantize_rows(dq, ds, dx, drows, R, C);
    check_rc(cuda_fp8_payload_pack(dp, dq, ds, R, C), "payload pack");
    uint8_t *sent = gt_host_bytes(dp, R * pb), *got = gt_malloc(R * pb);
    for (int r = 0; r < R; r++) memcpy(got + r * pb, sent + (size_t)recv[r] * pb, pb);
    uint8_t *drecv = gt_dev_bytes(got, R * pb);
    gt_poison(dql, n);
    gt_poison(dsl, (size_t)R * nt * 4);
    check_rc(cuda_fp8_payload_unpack(dql, dsl, drecv, dregroup, R, C), "payload unpack");
    check_quantised("dispatch chain: gather + 1x128 at the source, pack, move, unpack = 1x128 after [600, 1024]", dql,
                    dsl, qr, sr, n, (size_t)R * nt);
    free(x); free(xr); free(rows); free(recv); free(regroup); free(qr); free(sr); free(sent); free(got);
    cuda_free(dx); cuda_free(drows); cuda_free(dregroup); cuda_free(dq); cuda_free(dp); cuda_free(dql);
    cuda_free(ds); cuda_free(dsl); cuda_free(drecv);
}

// The MXFP8 grouped GEMM on Blackwell (fp8_sm100.cu, mode "mx"; compile-only
// where no compute capability 10.0 GPU is at hand: then it says it skipped
// and counts nothing). Operands quantised by the CPU reference
// (fp8_quantize_mx), with magnitudes that change from one 32-block of K to
// the next, so that a scale applied to the wrong block shows. Every output
// element against fp8_grouped_matmul_mx_ref rounded to BF16, within
//   2^-7 |ref| + 1.01 * 2 C 2^-24 sum_k |a_k w_k|:
// the kernel's and the reference's FP32 sums of C terms each lie within
// C 2^-24 sum |a_k w_k| of the exact sum (any order), and the two roundings
// to BF16 (8 significant bits) within 2^-8 of each value. The output has
// 64 rows past R, poisoned like the rest: they must keep their poison,
// and every element of the R rows must be written (finite).
static int mx_off(int *off, int E, int R_min) { // random segments: every 5th empty, expert 0 of one row
    int avg = R_min / (E - E / 5) + 1;
    off[0] = 0;
    for (int e = 0; e < E; e++) {
        int n = e % 5 == 2 ? 0 : e == 0 ? 1 : avg / 2 + gt_irand(avg + 1);
        off[e + 1] = off[e] + n;
    }
    if (off[E] < R_min) off[E] = R_min; // the last expert takes the rows short of R_min
    return off[E];
}

static void test_mx_gemm(const char *name, int E, int R_min, int C, int OC) {
    int *off = gt_malloc((E + 1) * sizeof(int));
    int R = mx_off(off, E, R_min), pad = 64, nb = C / 32;
    size_t na = (size_t)R * C, nw = (size_t)E * OC * C, no = (size_t)R * OC, nall = (size_t)(R + pad) * OC;
    float *a = gt_malloc(na * 4), *w = gt_malloc(nw * 4);
    gt_fill(a, na, GT_NORMAL, 0, 1, 0, 41);
    gt_fill(w, nw, GT_NORMAL, 0, 1 / sqrtf((float)C), 0, 42);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < na; i++) a[i] = ldexpf(a[i], (int)(i % C / 32 % 7) - 3);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < nw; i++) w[i] = ldexpf(w[i], 2 - (int)(i % C / 32 % 5));
    uint8_t *qa = gt_malloc(na), *sa = gt_malloc((size_t)R * nb), *qw = gt_malloc(nw), *sw = gt_malloc((size_t)E * OC * nb);
    fp8_quantize_mx(qa, sa, a, R, C);
    fp8_quantize_mx(qw, sw, w, E * OC, C);
    float *ref = gt_malloc(no * 4), *mag = gt_malloc(no * 4);
    fp8_grouped_matmul_mx_ref(ref, qa, sa, qw, sw, off, E, C, OC);
    // sum_k |a_k w_k| per element: the same product of the operands' magnitudes
    fp8_dequantize_mx(a, qa, sa, R, C);
    fp8_dequantize_mx(w, qw, sw, E * OC, C);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < na; i++) a[i] = fabsf(a[i]);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < nw; i++) w[i] = fabsf(w[i]);
    ops_cpu.grouped_matmul_forward(mag, a, w, off, E, C, OC);

    uint8_t *dqa = gt_dev_bytes(qa, na), *dsa = gt_dev_bytes(sa, (size_t)R * nb);
    uint8_t *dqw = gt_dev_bytes(qw, nw), *dsw = gt_dev_bytes(sw, (size_t)E * OC * nb);
    int *doff = gt_dev_bytes(off, (E + 1) * sizeof(int));
    void *dout = cuda_alloc(nall * 2);
    gt_poison(dout, nall * 2);
    int rc = cuda_mxfp8_grouped_forward(dout, dqa, dsa, dqw, dsw, doff, R, E, C, OC);
    char what[160];
    snprintf(what, sizeof what, "MXFP8 grouped forward %s: E %d, R %d, %d -> %d", name, E, R, C, OC);
    if (rc) {
        gt_ok(0, "%s: refused: %s", what, cuda_mxfp8_error(rc));
    } else {
        uint16_t *got = gt_host_bytes(dout, nall * 2);
        size_t over = 0, unwritten = 0, past = 0, worst_i = 0;
        double worst = 0;
        for (size_t i = 0; i < no; i++) {
            float g = bf2f(got[i]), rb = bf2f(f2bf(ref[i]));
            double tol = 0x1p-7 * fabs(ref[i]) + 1.01 * 2 * C * 0x1p-24 * mag[i];
            if (!isfinite(g)) { unwritten++; continue; }
            double d = fabs((double)g - rb);
            if (d > tol) over++;
            if (d / (tol > 0 ? tol : 1e-30) > worst) { worst = d / (tol > 0 ? tol : 1e-30); worst_i = i; }
        }
        for (size_t i = no; i < nall; i++) past += got[i] != 0xffff;
        gt_ok(over == 0 && unwritten == 0, "%s: %zu of %zu elements over the bound, %zu not written; largest "
              "|diff| / bound %.3g at [%zu, %zu] (got %.6g, ref %.6g)", what, over, no, unwritten, worst,
              worst_i / OC, worst_i % OC, bf2f(got[worst_i]), ref[worst_i]);
        gt_ok(past == 0, "%s: the %d x %d elements past the last row keep their poison (%zu written)", what, pad, OC,
              past);
        free(got);
    }
    free(off); free(a); free(w); free(qa); free(sa); free(qw); free(sw); free(ref); free(mag);
    cuda_free(dqa); cuda_free(dsa); cuda_free(dqw); cuda_free(dsw); cuda_free(doff); cuda_free(dout);
}

static void mx_tests(void) {
    int dev = 0;
    struct cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        gt_ok(0, "test_fp8 mx: no CUDA device");
        return;
    }
    if (prop.major != 10) {
        printf("test_fp8 mx: skipped: needs a compute capability 10.x GPU (this is %s, %d.%d)\n", prop.name,
               prop.major, prop.minor);
        return;
    }
    if (prop.minor != 0) { // sm_100a code loads on 10.0 only
        printf("test_fp8 mx: skipped: the kernel is built for sm_100a, which runs on compute capability 10.0 only "
               "(this is %s, %d.%d)\n", prop.name, prop.major, prop.minor);
        return;
    }
    test_mx_gemm("OLMoE-like up", 8, 4096, 2048, 1024);
    test_mx_gemm("OLMoE-like down", 8, 4096, 1024, 2048);
    test_mx_gemm("OLMoE up", 64, 16384, 2048, 1024);
    test_mx_gemm("OLMoE down", 64, 16384, 1024, 2048);
}

static void wgrad_tests(void) {
    int edges[9] = {0, 0, 1, 128, 256, 385, 512, 512, 900}; // empty, 1, 127, 128, 129, 127, empty, 388 rows
    test_fake_quantize_128x1("edges", edges, 8, 328, 37);
    test_wgrad("edges", edges, 8, 512, 384);
    int *off = malloc(65 * sizeof(int));
    gt_random_offsets(off, 2048, 64, 8);
    test_fake_quantize_128x1("OLMoE d_model", off, 64, 2048, 0);
    test_fake_quantize_128x1("OLMoE expert hidden", off, 64, 1024, 0);
    test_wgrad("OLMoE down (dY [R, 2048], act [R, 1024])", off, 64, 1024, 2048);
    test_wgrad("OLMoE gate (dG [R, 1024], x [R, 2048])", off, 64, 2048, 1024);
    free(off);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "mx")) {
        mx_tests();
        return gt_finish();
    }
    if (argc > 1 && !strcmp(argv[1], "payload")) {
        test_payload();
        return gt_finish();
    }
    if (argc > 1 && !strcmp(argv[1], "dense")) {
        dense_tests();
        return gt_finish();
    }
    if (argc > 1 && !strcmp(argv[1], "quant")) { // the quantisers alone, bit for bit
        test_encode_all();
        test_div_bf16_all();
        test_fused();
        test_quantize_1x128(1);
        test_quantize_1x128(0);
        test_quantize_128x128();
        test_transposed();
        test_swiglu_backward_quantize();
        unpermute_quantize_tests();
        return gt_finish();
    }
    if (argc > 1 && !strcmp(argv[1], "wgrad")) {
        test_div_bf16_all();
        wgrad_tests();
        return gt_finish();
    }
    // dgrad: the data-grads alone; gemm: the grouped GEMM (every variant) and the data-grads
    int gemm_only = argc > 1 && !strcmp(argv[1], "gemm");
    int dgrad_only = gemm_only || (argc > 1 && !strcmp(argv[1], "dgrad"));
    if (!dgrad_only) {
        test_encode_all();
        test_div_bf16_all();
        test_fused();
        test_payload();
        test_quantize_1x128(1);
        test_quantize_1x128(0);
        test_quantize_128x128();
        test_quantize_mx();
    }
    if (!gemm_only) {
        test_transposed();
        test_swiglu_backward_quantize();
        unpermute_quantize_tests();
    }
    int small[7] = {0, 1, 1, 131, 431, 508, 700}; // uneven, one empty expert, one of a single row
    test_gemm("uneven", small, 6, 384, 512);
    test_dgrad("uneven", small, 6, 512, 256, 0);
    test_dgrad("uneven pair", small, 6, 512, 256, 1);
    int *off = malloc(65 * sizeof(int));
    gt_random_offsets(off, 2048, 64, 8);
    if (!dgrad_only || gemm_only) {
        test_gemm("OLMoE up", off, 64, 2048, 1024);
        test_gemm("OLMoE down", off, 64, 1024, 2048);
    }
    test_dgrad("OLMoE down (dY [R, 2048] x Wd)", off, 64, 1024, 2048, 0);
    test_dgrad("OLMoE gate/up pair ([dG | dU] [R, 2048] x [Wg; Wu])", off, 64, 2048, 1024, 1);
    free(off);
    if (!dgrad_only) wgrad_tests();
    if (!dgrad_only) dense_tests();
    return gt_finish();
}
