// Helpers for the GPU tests (they call the cuda_* launchers of
// src/ops/cuda/ops_cuda.h directly, and the CPU reference through ops_cpu): BF16 on the host, random inputs, device
// buffers, poisoning, and comparison against the CPU backend by
// ||out - ref|| / ||ref||. Each test program counts its checks and ends
// with "N passed, N failed".
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cuda/ops_cuda.h"

static int gt_pass, gt_fail;

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

static uint64_t gt_rng = 0x1234567890abcdefULL;
static inline float gt_randn(void) {
    // Box-Muller over xorshift
    gt_rng ^= gt_rng << 13; gt_rng ^= gt_rng >> 7; gt_rng ^= gt_rng << 17;
    double u1 = ((gt_rng >> 11) + 0.5) / 9007199254740992.0;
    gt_rng ^= gt_rng << 13; gt_rng ^= gt_rng >> 7; gt_rng ^= gt_rng << 17;
    double u2 = ((gt_rng >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
}
// n random floats * scale, rounded through BF16 so that CPU and GPU see
// the same values
static inline float *gt_rand(size_t n, float scale) {
    float *p = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) p[i] = bf2f(f2bf(gt_randn() * scale));
    return p;
}
// device BF16 copy of host floats
static inline void *gt_dev_bf16(const float *h, size_t n) {
    uint16_t *b = malloc(n * 2 + 2);
    for (size_t i = 0; i < n; i++) b[i] = f2bf(h[i]);
    void *d = cuda_alloc(n * 2);
    cuda_to_device(d, b, n * 2);
    free(b);
    return d;
}
static inline void *gt_dev_bytes(const void *h, size_t bytes) {
    void *d = cuda_alloc(bytes);
    cuda_to_device(d, h, bytes);
    return d;
}
// fills a device buffer with NaN (0xff bytes are NaN in BF16 and FP32)
static inline void gt_poison(void *d, size_t bytes) {
    void *h = malloc(bytes + 1);
    memset(h, 0xff, bytes);
    cuda_to_device(d, h, bytes);
    free(h);
}
static inline float *gt_host_bf16(const void *d, size_t n) {
    uint16_t *b = malloc(n * 2 + 2);
    cuda_to_host(b, d, n * 2);
    float *f = malloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) f[i] = bf2f(b[i]);
    free(b);
    return f;
}
static inline float *gt_host_f32(const void *d, size_t n) {
    float *f = malloc(n * 4 + 4);
    cuda_to_host(f, d, n * 4);
    return f;
}
// Compares n values: relative L2 error <= tol and every element finite
// (poisoned outputs that were not written stay NaN).
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
    if (ok) gt_pass++; else gt_fail++;
    return ok;
}
static inline int gt_check_int(const char *what, const int *got, const int *ref, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += got[i] != ref[i];
    printf("%s %-48s %zu of %zu differ\n", bad ? "FAIL" : "ok  ", what, bad, n);
    if (bad) gt_fail++; else gt_pass++;
    return !bad;
}
static inline int gt_finish(void) {
    printf("%d passed, %d failed\n", gt_pass, gt_fail);
    return gt_fail ? 1 : 0;
}
