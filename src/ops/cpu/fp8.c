// The FP8 reference (see src/ops/fp8.h for the formats and rules): scalar,
// readable, and the definition the CUDA quantisers are held to bit for bit.
#include "ops/fp8.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "util/check.h"

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static float f32_from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

uint8_t fp8_e4m3_from_float(float x) {
    uint32_t u = f32_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return FP8_E4M3_NAN;
    if (a >= 0x43e00000u) return sign | 0x7e; // |x| >= 448, inf included: saturate
    if (a < 0x3c800000u) {                    // |x| < 2^-6: multiples of 2^-9
        // |x| * 512 is exact; nearbyintf rounds to nearest even (the default
        // mode). 8 (= 2^-6) is the code of the smallest normal, 0x08.
        return sign | (uint8_t)nearbyintf(f32_from_bits(a) * 512.0f);
    }
    // Normal: keep 3 of the 23 mantissa bits, ties to even (a carry into the
    // exponent is the right result), then rebias the exponent 127 -> 7.
    uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
    return sign | (uint8_t)(r - (120u << 3));
}

float fp8_e4m3_to_float(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80) << 24;
    int e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return f32_from_bits(sign | 0x7fc00000u);
    if (e == 0) return f32_from_bits(sign | f32_bits((float)m * 0x1p-9f));
    return f32_from_bits(sign | (uint32_t)(e + 120) << 23 | (uint32_t)m << 20);
}

// max |x| over a tile, NaN ignored (fmaxf returns the other operand)
static float amax_acc(float amax, float x) { return fmaxf(amax, fabsf(x)); }

float fp8_block_scale(float amax) {
    amax = fminf(amax, FLT_MAX);
    amax = fmaxf(amax, FP8_AMAX_FLOOR);
    return amax / FP8_E4M3_MAX;
}

float fp8_e8m0_to_float(uint8_t b) {
    if (b == FP8_E8M0_NAN) return NAN;
    if (b == 0) return 0x1p-127f; // FP32 subnormal
    return f32_from_bits((uint32_t)b << 23);
}

uint8_t fp8_mx_scale_byte(float amax, int has_nan) {
    if (has_nan) return FP8_E8M0_NAN;
    // floor(log2(amax)) is the biased exponent - 127 for normal amax; for
    // zero or subnormal amax it is below -127 - 8 and clamps to -127.
    int e = (int)((f32_bits(amax) >> 23) & 0xff) - 127 - 8;
    if (e < -127) e = -127;
    if (e > 127) e = 127;
    return (uint8_t)(e + 127);
}

void fp8_quantize_1x128(uint8_t *q, float *scale, const float *x, int R, int C) {
    int nt = (C + FP8_BLOCK - 1) / FP8_BLOCK;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) {
        for (int t = 0; t < nt; t++) {
            int c0 = t * FP8_BLOCK, c1 = c0 + FP8_BLOCK < C ? c0 + FP8_BLOCK : C;
            const float *xr = x + (size_t)r * C;
            float amax = 0.0f;
            for (int c = c0; c < c1; c++) amax = amax_acc(amax, xr[c]);
            float s = fp8_block_scale(amax);
            scale[(size_t)r * nt + t] = s;
            for (int c = c0; c < c1; c++) q[(size_t)r * C + c] = fp8_e4m3_from_float(xr[c] / s);
        }
    }
}

void fp8_fake_quantize_128x1(float *x, const int *offsets, int E, int C) {
#pragma omp parallel for schedule(dynamic)
    for (int e = 0; e < E; e++) {
        for (int r0 = offsets[e]; r0 < offsets[e + 1]; r0 += FP8_BLOCK) {
            int r1 = r0 + FP8_BLOCK < offsets[e + 1] ? r0 + FP8_BLOCK : offsets[e + 1];
            for (int c = 0; c < C; c++) {
                float amax = 0.0f;
                for (int r = r0; r < r1; r++) amax = amax_acc(amax, x[(size_t)r * C + c]);
                float s = fp8_block_scale(amax);
                for (int r = r0; r < r1; r++) {
                    float *v = x + (size_t)r * C + c;
                    *v = fp8_e4m3_to_float(fp8_e4m3_from_float(*v / s)) * s;
                }
            }
        }
    }
}

void fp8_dequantize_1x128(float *x, const uint8_t *q, const float *scale, int R, int C) {
    int nt = (C + FP8_BLOCK - 1) / FP8_BLOCK;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            x[(size_t)r * C + c] = fp8_e4m3_to_float(q[(size_t)r * C + c]) * scale[(size_t)r * nt + c / FP8_BLOCK];
}

void fp8_pack_rows(uint8_t *payload, const uint8_t *q, const float *scale, int R, int C) {
    size_t pb = fp8_payload_bytes(C), ns = (size_t)C / FP8_BLOCK;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) {
        uint8_t *p = payload + (size_t)r * pb;
        memcpy(p, q + (size_t)r * C, (size_t)C);
        memcpy(p + C, scale + (size_t)r * ns, ns * sizeof(float));
    }
}

void fp8_unpack_rows(uint8_t *q, float *scale, const uint8_t *payload, const int *src_row, int R, int C) {
    size_t pb = fp8_payload_bytes(C), ns = (size_t)C / FP8_BLOCK;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) {
        const uint8_t *p = payload + (size_t)(src_row ? src_row[r] : r) * pb;
        memcpy(q + (size_t)r * C, p, (size_t)C);
        memcpy(scale + (size_t)r * ns, p + C, ns * sizeof(float));
    }
}

void fp8_quantize_128x128(uint8_t *q, float *scale, const float *w, int E, int M, int K) {
    int mb = (M + FP8_BLOCK - 1) / FP8_BLOCK, kb = (K + FP8_BLOCK - 1) / FP8_BLOCK;
#pragma omp parallel for collapse(2) schedule(static)
    for (int e = 0; e < E; e++) {
        for (int b = 0; b < mb * kb; b++) {
            int i0 = b / kb * FP8_BLOCK, j0 = b % kb * FP8_BLOCK;
            int i1 = i0 + FP8_BLOCK < M ? i0 + FP8_BLOCK : M, j1 = j0 + FP8_BLOCK < K ? j0 + FP8_BLOCK : K;
            const float *we = w + (size_t)e * M * K;
            uint8_t *qe = q + (size_t)e * M * K;
            float amax = 0.0f;
            for (int i = i0; i < i1; i++)
                for (int j = j0; j < j1; j++) amax = amax_acc(amax, we[(size_t)i * K + j]);
            float s = fp8_block_scale(amax);
            scale[(size_t)e * mb * kb + b] = s;
            for (int i = i0; i < i1; i++)
                for (int j = j0; j < j1; j++) qe[(size_t)i * K + j] = fp8_e4m3_from_float(we[(size_t)i * K + j] / s);
        }
    }
}

void fp8_dequantize_128x128(float *w, const uint8_t *q, const float *scale, int E, int M, int K) {
    int mb = (M + FP8_BLOCK - 1) / FP8_BLOCK, kb = (K + FP8_BLOCK - 1) / FP8_BLOCK;
#pragma omp parallel for collapse(2) schedule(static)
    for (int e = 0; e < E; e++)
        for (int i = 0; i < M; i++) {
            const float *se = scale + ((size_t)e * mb + i / FP8_BLOCK) * kb;
            size_t row = ((size_t)e * M + i) * K;
            for (int j = 0; j < K; j++) w[row + j] = fp8_e4m3_to_float(q[row + j]) * se[j / FP8_BLOCK];
        }
}

void fp8_transpose_128x128(uint8_t *qt, float *st, int ldt, int col0, const uint8_t *q, const float *scale, int E,
                           int M, int K) {
    int mb = M / FP8_BLOCK, kb = K / FP8_BLOCK, tb = ldt / FP8_BLOCK;
#pragma omp parallel for collapse(2) schedule(static)
    for (int e = 0; e < E; e++)
        for (int j = 0; j < K; j++) {
            uint8_t *out = qt + ((size_t)e * K + j) * ldt + col0;
            const uint8_t *in = q + (size_t)e * M * K + j;
            for (int i = 0; i < M; i++) out[i] = in[(size_t)i * K];
        }
    for (int e = 0; e < E; e++)
        for (int bi = 0; bi < mb; bi++)
            for (int bj = 0; bj < kb; bj++)
                st[((size_t)e * kb + bj) * tb + col0 / FP8_BLOCK + bi] = scale[((size_t)e * mb + bi) * kb + bj];
}

void fp8_quantize_1x128_pair(uint8_t *q, float *scale, const float *a, const float *b, int R, int F) {
    float *ab = mallocCheck((size_t)R * 2 * F * sizeof(float) + 1);
    for (int r = 0; r < R; r++) {
        memcpy(ab + (size_t)r * 2 * F, a + (size_t)r * F, (size_t)F * sizeof(float));
        memcpy(ab + (size_t)r * 2 * F + F, b + (size_t)r * F, (size_t)F * sizeof(float));
    }
    fp8_quantize_1x128(q, scale, ab, R, 2 * F);
    free(ab);
}

void fp8_quantize_mx(uint8_t *q, uint8_t *scale, const float *x, int R, int C) {
    int nb = (C + FP8_MX_BLOCK - 1) / FP8_MX_BLOCK;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) {
        for (int b = 0; b < nb; b++) {
            int c0 = b * FP8_MX_BLOCK, c1 = c0 + FP8_MX_BLOCK < C ? c0 + FP8_MX_BLOCK : C;
            const float *xr = x + (size_t)r * C;
            float amax = 0.0f;
            int has_nan = 0;
            for (int c = c0; c < c1; c++) {
                has_nan |= isnan(xr[c]);
                amax = amax_acc(amax, xr[c]);
            }
            uint8_t sb = fp8_mx_scale_byte(amax, 0); // a NaN block's elements use the others' scale
            scale[(size_t)r * nb + b] = has_nan ? FP8_E8M0_NAN : sb;
            // 2^-e with e = sb - 127 in [-127, 127]: the scale of an E8M0 byte 254 - sb
            float inv = fp8_e8m0_to_float((uint8_t)(254 - sb));
            for (int c = c0; c < c1; c++) q[(size_t)r * C + c] = fp8_e4m3_from_float(xr[c] * inv);
        }
    }
}

void fp8_dequantize_mx(float *x, const uint8_t *q, const uint8_t *scale, int R, int C) {
    int nb = (C + FP8_MX_BLOCK - 1) / FP8_MX_BLOCK;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            x[(size_t)r * C + c] =
                fp8_e4m3_to_float(q[(size_t)r * C + c]) * fp8_e8m0_to_float(scale[(size_t)r * nb + c / FP8_MX_BLOCK]);
}

// The grouped GEMM references: both operands dequantised into FP32 host
// buffers a [R, C] and w [E, OC, C], then the CPU backend's grouped product.
typedef struct {
    float *a, *w;
} Dequantised;
static Dequantised dequantised_alloc(const int *offsets, int E, int C, int OC) {
    Dequantised d = {mallocCheck((size_t)offsets[E] * C * sizeof(float) + 1),
                     mallocCheck((size_t)E * OC * C * sizeof(float) + 1)};
    return d;
}
static void dequantised_matmul(float *out, Dequantised d, const int *offsets, int E, int C, int OC) {
    ops_cpu.grouped_matmul_forward(out, d.a, d.w, offsets, E, C, OC);
    free(d.a);
    free(d.w);
}

void fp8_grouped_matmul_ref(float *out, const uint8_t *qa, const float *sa, const uint8_t *qw, const float *sw,
                            const int *offsets, int E, int C, int OC) {
    Dequantised d = dequantised_alloc(offsets, E, C, OC);
    fp8_dequantize_1x128(d.a, qa, sa, offsets[E], C);
    fp8_dequantize_128x128(d.w, qw, sw, E, OC, C);
    dequantised_matmul(out, d, offsets, E, C, OC);
}

void fp8_grouped_matmul_mx_ref(float *out, const uint8_t *qa, const uint8_t *sa, const uint8_t *qw, const uint8_t *sw,
                               const int *offsets, int E, int C, int OC) {
    Dequantised d = dequantised_alloc(offsets, E, C, OC);
    fp8_dequantize_mx(d.a, qa, sa, offsets[E], C);
    fp8_dequantize_mx(d.w, qw, sw, E * OC, C); // [E, OC, C] is E * OC rows of C, scales alike
    dequantised_matmul(out, d, offsets, E, C, OC);
}

void fp8_quantize_1x128_t(uint8_t *q, float *st, const float *x, int R, int C) {
    int nt = C / FP8_BLOCK;
    float *s = mallocCheck((size_t)R * nt * sizeof(float) + 1);
    fp8_quantize_1x128(q, s, x, R, C);
    for (int r = 0; r < R; r++)
        for (int t = 0; t < nt; t++) st[(size_t)t * R + r] = s[(size_t)r * nt + t];
    free(s);
}

void fp8_dequantize_1x128_t(float *x, const uint8_t *q, const float *st, int R, int C) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            x[(size_t)r * C + c] = fp8_e4m3_to_float(q[(size_t)r * C + c]) * st[(size_t)(c / FP8_BLOCK) * R + r];
}

void fp8_matmul_ref(float *out, const uint8_t *qa, const float *st, const uint8_t *qw, const float *sw, int N, int C,
                    int OC) {
    float *a = mallocCheck((size_t)N * C * sizeof(float) + 1);
    float *w = mallocCheck((size_t)OC * C * sizeof(float) + 1);
    fp8_dequantize_1x128_t(a, qa, st, N, C);
    fp8_dequantize_128x128(w, qw, sw, 1, OC, C);
    ops_cpu.matmul_forward(out, a, w, N, C, OC);
    free(a);
    free(w);
}
