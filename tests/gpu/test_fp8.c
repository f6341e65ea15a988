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
// - the fused quantisers of train.precision: fp8 (test_fused).
// Ends with "N passed, N failed".
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_test_util.h"
#include "ops/cuda/fp8_cuda.h"
#include "ops/fp8.h"

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

// rows per expert of N tokens each routed to k distinct random experts
static void random_offsets(int *off, int N, int E, int k) {
    int *cnt = calloc(E, sizeof(int));
    for (int n = 0; n < N; n++) {
        int chosen[64], m = 0;
        while (m < k) {
            int e = gt_irand(E), dup = 0;
            for (int j = 0; j < m; j++) dup |= chosen[j] == e;
            if (!dup) chosen[m++] = e;
        }
        for (int j = 0; j < k; j++) cnt[chosen[j]]++;
    }
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + cnt[e];
    free(cnt);
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
    for (int v = 0; v < 4; v++) { // the kernel's variants (fp8.cu), then the default (3) again
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

int main(void) {
    test_encode_all();
    test_fused();
    test_quantize_1x128(1);
    test_quantize_1x128(0);
    test_quantize_128x128();
    test_quantize_mx();
    int small[7] = {0, 1, 1, 131, 431, 508, 700}; // uneven, one empty expert, one of a single row
    test_gemm("uneven", small, 6, 384, 512);
    int *off = malloc(65 * sizeof(int));
    random_offsets(off, 2048, 64, 8);
    test_gemm("OLMoE up", off, 64, 2048, 1024);
    test_gemm("OLMoE down", off, 64, 1024, 2048);
    free(off);
    return gt_finish();
}
