// Helpers of the GPU programs (test_backend_ops, test_cuda_model and the
// kernel table bench_kernels): BF16 on the host, random inputs, CUDA
// buffers, poisoning, comparisons and the pass/fail count. Each program
// counts its checks and ends with gt_finish's "N passed, N failed".
//
// A check prints one line, "ok   <what> ..." or "FAIL <what> ..."
// (scripts/gpu-check.sh greps ^FAIL). Values are compared by relative L2
// error ||got - ref|| / ||ref|| over the whole output, and every element
// must be finite: outputs are poisoned (NaN) before a run, so an element
// left unwritten fails.
#pragma once
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cuda/ops_cuda.h"

// ops_cuda.cu (declared only in cuda_common.cuh, which is C++)
cudaStream_t cuda_stream(void);

static int gt_pass, gt_fail;

// ---- BF16 -------------------------------------------------------------------

static inline uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; // NaN
    u += 0x7fffu + ((u >> 16) & 1u);                    // round to nearest even
    return (uint16_t)(u >> 16);
}
static inline float bf2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// ---- random numbers -----------------------------------------------------------
// xorshift64 streams: gt_urand uniform in [-1, 1), gt_irand in [0, n),
// gt_randn normal (Box-Muller).

static uint64_t gt_rng = 0x9e3779b97f4a7c15ULL;
static inline uint64_t gt_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
static inline float gt_uniform(uint64_t *s) { return (float)((gt_next(s) >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f; }
static inline float gt_normal(uint64_t *s) {
    double u1 = ((gt_next(s) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = ((gt_next(s) >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
}
static inline float gt_urand(void) { return gt_uniform(&gt_rng); }
static inline float gt_randn(void) { return gt_normal(&gt_rng); }
static inline int gt_irand(int n) { return (int)(gt_next(&gt_rng) % (uint64_t)n); }
// off[0..E]: the expert offsets of N tokens each routed to k distinct
// random experts (k <= 64), from the gt_irand stream
static inline void gt_random_offsets(int *off, int N, int E, int k) {
    int *cnt = (int *)calloc(E, sizeof(int));
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

enum { GT_UNIFORM, GT_NORMAL };
// p[0..n) = offset + scale * (uniform in [-1, 1) or normal), rounded through
// BF16 when bf16 (so that both backends see the same values). Each chunk of
// 64K values draws from its own stream, seeded by (seed, chunk): large fills
// run on every thread and give the same values on any number of them.
static inline void gt_fill(float *p, size_t n, int dist, float offset, float scale, int bf16, uint64_t seed) {
    const size_t chunk = (size_t)1 << 16;
    long nchunks = (long)((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
    for (long c = 0; c < nchunks; c++) {
        uint64_t s = (seed + 1) * 0x9e3779b97f4a7c15ULL ^ ((uint64_t)c + 1) * 0xbf58476d1ce4e5b9ULL;
        s = s ? s : 1;
        for (int i = 0; i < 4; i++) gt_next(&s);
        size_t end = (size_t)(c + 1) * chunk < n ? (size_t)(c + 1) * chunk : n;
        for (size_t i = (size_t)c * chunk; i < end; i++) {
            float x = offset + scale * (dist == GT_NORMAL ? gt_normal(&s) : gt_uniform(&s));
            p[i] = bf16 ? bf2f(f2bf(x)) : x;
        }
    }
}

// ---- host and device buffers ---------------------------------------------------

static inline void *gt_malloc(size_t bytes) {
    void *p = malloc(bytes + 16);
    if (!p) { fprintf(stderr, "gpu test: out of host memory (%zu bytes)\n", bytes); exit(2); }
    return p;
}
// host floats into a device BF16 buffer
static inline void gt_upload_bf16(void *d, const float *h, size_t n) {
    uint16_t *b = gt_malloc(n * 2);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) b[i] = f2bf(h[i]);
    cuda_to_device(d, b, n * 2);
    free(b);
}
static inline void *gt_dev_bf16(const float *h, size_t n) {
    void *d = cuda_alloc(n * 2);
    gt_upload_bf16(d, h, n);
    return d;
}
static inline void *gt_dev_bytes(const void *h, size_t bytes) {
    void *d = cuda_alloc(bytes);
    cuda_to_device(d, h, bytes);
    return d;
}
// fills a device buffer with NaN (0xff bytes are NaN in BF16 and FP32), on
// the backend's stream
static inline void gt_poison(void *d, size_t bytes) {
    if (bytes && cudaMemsetAsync(d, 0xff, bytes, cuda_stream()) != cudaSuccess) {
        fprintf(stderr, "gpu test: cudaMemsetAsync failed\n");
        exit(2);
    }
}
static inline void *gt_host_bytes(const void *d, size_t bytes) {
    void *h = gt_malloc(bytes);
    cuda_to_host(h, d, bytes);
    return h;
}
static inline float *gt_host_bf16(const void *d, size_t n) {
    uint16_t *b = gt_host_bytes(d, n * 2);
    float *f = gt_malloc(n * 4);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) f[i] = bf2f(b[i]);
    free(b);
    return f;
}
static inline float *gt_host_f32(const void *d, size_t n) { return gt_host_bytes(d, n * 4); }

// ---- checks ---------------------------------------------------------------------

static inline int gt_count(int ok) {
    if (ok) gt_pass++;
    else gt_fail++;
    return ok;
}
// one counted check with a free-form message
static inline int gt_ok(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    return gt_count(ok);
}

// Relative L2 error, and every element finite.
static inline int gt_check(const char *what, const float *got, const float *ref, size_t n, double tol) {
    double d = 0, r = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) { bad++; continue; }
        d += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        r += (double)ref[i] * ref[i];
    }
    double err = r > 0 ? sqrt(d / r) : sqrt(d);
    int ok = bad == 0 && err <= tol;
    printf("%s %-48s rel err %.3e (tol %.0e)%s\n", ok ? "ok  " : "FAIL", what, err, tol,
           bad ? " UNWRITTEN/NONFINITE ELEMENTS" : "");
    if (bad) printf("      %zu of %zu elements not finite\n", bad, n);
    return gt_count(ok);
}

static inline void gt_print_index(size_t i, const int *dims, int nd) {
    if (nd < 2) { printf("[%zu]", i); return; }
    size_t idx[4];
    for (int a = nd - 1; a >= 0; a--) { idx[a] = i % (size_t)dims[a]; i /= (size_t)dims[a]; }
    printf("[");
    for (int a = 0; a < nd; a++) printf("%s%zu", a ? ", " : "", idx[a]);
    printf("]");
}
// After a failed comparison, where the error sits: the largest difference
// and the first non-finite element, and along each axis but the last of
// dims (outermost first, 0-terminated, up to 4) the indices whose slice has
// a relative error above tol. seg (nseg + 1 boundaries), when given, groups
// the outermost axis into segments (the experts' rows).
static inline void gt_explain(const float *got, const float *ref, size_t n, const int *dims, const int *seg, int nseg,
                              double tol) {
    int nd = 0;
    while (dims && nd < 4 && dims[nd]) nd++;
    size_t total = 1;
    for (int a = 0; a < nd; a++) total *= (size_t)dims[a];
    if (total != n) nd = 0; // dims do not describe this tensor
    size_t worst = 0, nonfinite = (size_t)-1;
    double wd = -1;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            if (nonfinite == (size_t)-1) nonfinite = i;
            continue;
        }
        double d = fabs((double)got[i] - ref[i]);
        if (d > wd) { wd = d; worst = i; }
    }
    if (wd >= 0) {
        printf("      largest |diff| %.4g at ", wd);
        gt_print_index(worst, dims, nd);
        printf(": got %.8g ref %.8g\n", got[worst], ref[worst]);
    }
    if (nonfinite != (size_t)-1) {
        printf("      first non-finite at ");
        gt_print_index(nonfinite, dims, nd);
        printf(" (ref %.8g)\n", ref[nonfinite]);
    }
    size_t stride = n;
    for (int a = 0; a + 1 < nd; a++) {
        stride /= (size_t)dims[a];
        int m = a == 0 && seg ? nseg : dims[a];
        int *map = NULL; // row -> segment
        if (a == 0 && seg) {
            map = gt_malloc((size_t)dims[0] * sizeof(int));
            for (int s = 0; s < nseg; s++)
                for (int r = seg[s]; r < seg[s + 1] && r < dims[0]; r++) map[r] = s;
        }
        double *dn = calloc(m, sizeof(double)), *rn = calloc(m, sizeof(double));
        char *bad = calloc(m, 1);
        for (size_t i = 0; i < n; i++) {
            int j = (int)(i / stride % (size_t)dims[a]);
            if (map) j = map[j];
            if (!isfinite(got[i])) { bad[j] = 1; continue; }
            double d = (double)got[i] - ref[i];
            dn[j] += d * d;
            rn[j] += (double)ref[i] * ref[i];
        }
        int shown = 0, over = 0;
        printf("      %s %d with rel err > tol (index:err):", map ? "segments of axis" : "axis", a);
        for (int j = 0; j < m; j++) {
            double e = rn[j] > 0 ? sqrt(dn[j] / rn[j]) : sqrt(dn[j]);
            if (!bad[j] && e <= tol) continue;
            if (shown++ < 12) {
                if (bad[j]) printf(" %d:nan", j);
                else printf(" %d:%.2g", j, e);
            }
            over++;
        }
        printf("%s (%d of %d)\n", over > 12 ? " ..." : "", over, m);
        free(dn); free(rn); free(bad); free(map);
    }
}
static inline int gt_check_diag(const char *what, const float *got, const float *ref, size_t n, double tol,
                                const int *dims, const int *seg, int nseg) {
    int ok = gt_check(what, got, ref, n, tol);
    if (!ok) gt_explain(got, ref, n, dims, seg, nseg, tol);
    return ok;
}
static inline int gt_check_int(const char *what, const int *got, const int *ref, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += got[i] != ref[i];
    printf("%s %-48s %zu of %zu differ\n", bad ? "FAIL" : "ok  ", what, bad, n);
    for (size_t i = 0, shown = 0; bad && i < n && shown < 8; i++)
        if (got[i] != ref[i]) { printf("      [%zu]: got %d ref %d\n", i, got[i], ref[i]); shown++; }
    return gt_count(!bad);
}
// n elements of elem bytes, bit for bit
static inline int gt_check_bits(const char *what, const void *a, const void *b, size_t n, size_t elem) {
    size_t bad = 0, first = (size_t)-1;
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * elem, (const char *)b + i * elem, elem)) {
            if (!bad) first = i;
            bad++;
        }
    printf("%s %-48s %zu of %zu differ\n", bad ? "FAIL" : "ok  ", what, bad, n);
    if (bad) printf("      first at [%zu]\n", first);
    return gt_count(!bad);
}
// Two kernels' results for the same inputs (got against ref, both finite):
// how many elements differ in bits, and the largest relative L2 difference
// of a row of `row` elements (0: the whole tensor), which must be <= tol.
static inline int gt_agree(const char *what, const float *got, const float *ref, size_t n, size_t row, double tol) {
    size_t len = row ? row : n, rows = n / len, differ = 0, worst_row = 0;
    double worst = 0;
    for (size_t r = 0; r < rows; r++) {
        double dn = 0, rn = 0;
        for (size_t j = r * len; j < (r + 1) * len; j++) {
            differ += memcmp(&got[j], &ref[j], 4) != 0;
            if (!isfinite(got[j]) || !isfinite(ref[j])) { dn = INFINITY; continue; }
            dn += ((double)got[j] - ref[j]) * ((double)got[j] - ref[j]);
            rn += (double)ref[j] * ref[j];
        }
        double e = rn > 0 ? sqrt(dn / rn) : sqrt(dn);
        if (!(e <= worst)) { worst = e; worst_row = r; }
    }
    int ok = worst <= tol;
    printf("%s %-48s %zu of %zu differ in bits, rel diff %.2g (tol %.0e)", ok ? "ok  " : "FAIL", what, differ, n,
           worst, tol);
    if (row) printf(" in row %zu, the largest of rows of %zu", worst_row, len);
    printf("\n");
    return gt_count(ok);
}

static inline int gt_finish(void) {
    printf("%d passed, %d failed\n", gt_pass, gt_fail);
    return gt_fail ? 1 : 0;
}

// ---- timing -----------------------------------------------------------------------

// median of n times (sorts ms)
static inline double gt_median(float *ms, int n) {
    for (int i = 1; i < n; i++) // insertion sort
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) { float t = ms[j]; ms[j] = ms[j - 1]; ms[j - 1] = t; }
    return n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
}

// Median ms of `runs` runs of f(ctx) after `warmup` more, each bracketed by
// CUDA events on the backend's stream (runs <= 64); a CUDA error while
// timing is a failed check.
static inline double gt_time_ms(void (*f)(void *), void *ctx, int warmup, int runs) {
    cudaStream_t st = cuda_stream();
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float ms[64];
    if (runs > 64) runs = 64;
    for (int i = -warmup; i < runs; i++) {
        cudaEventRecord(e0, st);
        f(ctx);
        cudaEventRecord(e1, st);
        cudaEventSynchronize(e1);
        if (i >= 0) cudaEventElapsedTime(&ms[i], e0, e1);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (cudaGetLastError() != cudaSuccess) {
        printf("FAIL CUDA error while timing\n");
        gt_count(0);
    }
    return gt_median(ms, runs);
}
