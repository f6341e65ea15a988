// The FP8 reference (src/ops/fp8.h) against oracles written here from the
// format's definition, not from the encoder's bit tricks:
// - decoding: every one of the 256 codes against (-1)^s 2^(e-7) (1 + m/8)
//   (subnormals m 2^-9) in double;
// - encoding: all 2^32 FP32 bit patterns against nearest-value search over
//   the 127 positive finite codes (ties to the even code, saturation at
//   448, NaN -> 0x7f, the sign copied), and every code round-trips;
// - block128 (1x128 and 128x128, with edge tiles) and MXFP8 quantisers
//   element by element against the scalar rules, on tiles chosen to hit
//   zeros, NaN, infinities, FP32 subnormals, saturation and ordinary values;
//   dequantisation error bounds;
// - the FP8 GEMM reference against a naive double-precision triple loop
//   over the dequantised operands, and its error against the unquantised
//   FP32 product (what FP8 costs); the dense FP8 GEMM's (transposed
//   activation scales, the data-grad's transposed weights) likewise; the
//   MXFP8 GEMM's exactly on values whose sums are exact in FP32, and within
//   the FP32 summation bound on random ones;
// - the FP8 dispatch payload: rows quantised at the source, packed, moved
//   and unpacked equal the rows quantised after the dispatch.
#include <check.h>

#include "check_main.h"
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops/fp8.h"
#include "ops/ops.h"

static float bits_f(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}
static uint32_t f_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

// value of code b from the definition (NaN for S.1111.111)
static double oracle_decode(int b) {
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e == 0 ? ldexp(m, -9) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -v : v;
}

static double pos_value[127]; // codes 0x00..0x7e, increasing
static void init_values(void) {
    for (int b = 0; b < 127; b++) pos_value[b] = oracle_decode(b);
}
// nearest code to |x| >= 0 (not NaN), ties to the even code, saturating
static int oracle_encode_abs(double x) {
    if (x >= 448.0) return 0x7e;
    int lo = 0, hi = 126; // largest k with pos_value[k] <= x
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (pos_value[mid] <= x) lo = mid;
        else hi = mid - 1;
    }
    if (lo == 126) return 126;
    double mid = 0.5 * (pos_value[lo] + pos_value[lo + 1]);
    if (x < mid) return lo;
    if (x > mid) return lo + 1;
    return (lo & 1) ? lo + 1 : lo;
}
static int oracle_encode(float x) {
    if (isnan(x)) return 0x7f;
    int s = signbit(x) ? 0x80 : 0;
    return s | oracle_encode_abs(fabs((double)x));
}

START_TEST(test_decode_all_codes) {
    for (int b = 0; b < 256; b++) {
        float got = fp8_e4m3_to_float((uint8_t)b);
        double want = oracle_decode(b);
        if (isnan(want)) {
            ck_assert_msg(isnan(got), "code 0x%02x should be NaN", b);
            continue;
        }
        ck_assert_msg((double)got == want && !!signbit(got) == (b >> 7 != 0), "code 0x%02x: %.9g, want %.9g", b, got,
                      want);
    }
    ck_assert(fp8_e4m3_to_float(0x7e) == 448.0f && fp8_e4m3_to_float(0x01) == 0x1p-9f);
    ck_assert(fp8_e4m3_to_float(0x08) == 0x1p-6f && fp8_e4m3_to_float(0xfe) == -448.0f);
}
END_TEST

START_TEST(test_round_trip_codes) {
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7f) == 0x7f) continue;
        ck_assert_msg(fp8_e4m3_from_float(fp8_e4m3_to_float((uint8_t)b)) == b, "code 0x%02x", b);
    }
    ck_assert_int_eq(fp8_e4m3_from_float(fp8_e4m3_to_float(0x7f)), 0x7f);
    ck_assert_int_eq(fp8_e4m3_from_float(fp8_e4m3_to_float(0xff)), 0x7f);
}
END_TEST

// every FP32 bit pattern (2^32) through the encoder and the oracle
START_TEST(test_encode_exhaustive) {
    long bad = 0;
    uint32_t first = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
    for (long hi = 0; hi < 65536; hi++) {
        for (uint32_t lo = 0; lo < 65536; lo++) {
            uint32_t u = (uint32_t)hi << 16 | lo;
            float x = bits_f(u);
            if (fp8_e4m3_from_float(x) != oracle_encode(x)) {
                if (!bad) first = u;
                bad++;
            }
        }
    }
    ck_assert_msg(bad == 0, "%ld FP32 values encode wrongly, e.g. bits 0x%08x (%.9g): got 0x%02x, want 0x%02x", bad,
                  first, bits_f(first), fp8_e4m3_from_float(bits_f(first)), oracle_encode(bits_f(first)));
}
END_TEST

START_TEST(test_encode_specials) {
    ck_assert_int_eq(fp8_e4m3_from_float(0.0f), 0x00);
    ck_assert_int_eq(fp8_e4m3_from_float(-0.0f), 0x80);
    ck_assert_int_eq(fp8_e4m3_from_float(INFINITY), 0x7e);
    ck_assert_int_eq(fp8_e4m3_from_float(-INFINITY), 0xfe);
    ck_assert_int_eq(fp8_e4m3_from_float(NAN), 0x7f);
    ck_assert_int_eq(fp8_e4m3_from_float(-NAN), 0x7f);
    ck_assert_int_eq(fp8_e4m3_from_float(464.0f), 0x7e);  // tie between 448 and (absent) 480
    ck_assert_int_eq(fp8_e4m3_from_float(1e30f), 0x7e);
    ck_assert_int_eq(fp8_e4m3_from_float(0x1p-10f), 0x00); // tie between 0 and 2^-9: even
    ck_assert_int_eq(fp8_e4m3_from_float(0x1.8p-9f), 0x02); // tie between 1 and 2 (x 2^-9): even
    ck_assert_int_eq(fp8_e4m3_from_float(0x1.1p0f), 0x38); // 1.0625: tie between 1 and 1.125 -> 1
    ck_assert_int_eq(fp8_e4m3_from_float(0x1.3p0f), 0x3a); // 1.1875: tie -> 1.25
    ck_assert_int_eq(fp8_e4m3_from_float(bits_f(1)), 0x00); // smallest FP32 subnormal
    ck_assert_int_eq(fp8_e4m3_from_float(0x1.fp-7f), 0x08); // rounds up into the smallest normal
}
END_TEST

// ---- quantisers -------------------------------------------------------------

static uint64_t rng = 88172645463325252ULL;
static double urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (rng >> 11) * (1.0 / 9007199254740992.0);
}
// Fills x[R, C] tile by tile (tile = 1 x `tw` along rows, or the element's
// whole 128x128 block when blocks) with a kind chosen per tile: ordinary
// values of a random magnitude, zeros, a NaN among values, +-inf among
// values, FP32 subnormals, or values with a spike.
static void fill_tiles(float *x, int R, int C, int tw) {
    int nt = (C + tw - 1) / tw;
    for (int r = 0; r < R; r++)
        for (int t = 0; t < nt; t++) {
            int kind = (int)(urand() * 8);
            double mag = ldexp(1.0, (int)(urand() * 60) - 30);
            for (int c = t * tw; c < (t + 1) * tw && c < C; c++) {
                double v = (urand() * 2 - 1) * mag;
                float f = (float)v;
                if (kind == 1) f = 0.0f;
                if (kind == 2 && urand() < 0.05) f = NAN;
                if (kind == 3 && urand() < 0.05) f = urand() < 0.5 ? INFINITY : -INFINITY;
                if (kind == 4) f = (float)((urand() * 2 - 1) * 1e-39);
                if (kind == 5 && urand() < 0.02) f *= 1e6f;
                if (kind == 6) f = (float)((urand() * 2 - 1) * 1e-35); // amax below the floor
                x[(size_t)r * C + c] = f;
            }
        }
}

// the scalar rules of fp8.h for one tile, checked against the quantiser's output
static void check_block128_tile(const float *x, const uint8_t *q, float s, int rows, int cols, size_t ld) {
    float amax = 0.0f;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            float v = x[i * ld + j];
            if (isnan(v)) continue;
            float a = fabsf(v);
            if (a > amax) amax = a;
        }
    if (amax > FLT_MAX) amax = FLT_MAX;
    if (amax < FP8_AMAX_FLOOR) amax = FP8_AMAX_FLOOR;
    float want_s = amax / 448.0f;
    ck_assert_msg(f_bits(s) == f_bits(want_s), "scale %.9g, want %.9g", s, want_s);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            float v = x[i * ld + j];
            int want = oracle_encode(v / want_s);
            ck_assert_msg(q[i * ld + j] == want, "x %.9g scale %.9g: q 0x%02x, want 0x%02x", v, want_s, q[i * ld + j],
                          want);
            // dequantised error: half a unit of the 3-bit mantissa, or of 2^-9 below 2^-6
            float d = fp8_e4m3_to_float(q[i * ld + j]) * want_s;
            double xs = fabs((double)v / want_s);
            if (isfinite(v) && xs <= 448.0) {
                double bound = fmax(xs * 0x1p-4, 0x1p-10) * want_s * (1 + 1e-6) + 1e-45;
                ck_assert_msg(fabs((double)d - v) <= bound, "x %.9g dequantised %.9g", v, d);
            }
        }
}

START_TEST(test_quantize_1x128) {
    int R = 37, C = 128 * 5 + 40; // an edge tile of 40
    float *x = malloc((size_t)R * C * 4), *d = malloc((size_t)R * C * 4);
    int nt = (C + 127) / 128;
    uint8_t *q = malloc((size_t)R * C);
    float *s = malloc((size_t)R * nt * 4);
    fill_tiles(x, R, C, 128);
    fp8_quantize_1x128(q, s, x, R, C);
    for (int r = 0; r < R; r++)
        for (int t = 0; t < nt; t++) {
            int cols = t == nt - 1 ? C - 128 * t : 128;
            check_block128_tile(x + (size_t)r * C + 128 * t, q + (size_t)r * C + 128 * t, s[r * nt + t], 1, cols, C);
        }
    fp8_dequantize_1x128(d, q, s, R, C);
    for (size_t i = 0; i < (size_t)R * C; i++) {
        float want = fp8_e4m3_to_float(q[i]) * s[(i / C) * nt + (i % C) / 128];
        ck_assert(f_bits(d[i]) == f_bits(want) || (isnan(d[i]) && isnan(want)));
    }
    free(x); free(d); free(q); free(s);
}
END_TEST

START_TEST(test_quantize_128x128) {
    int E = 3, M = 128 * 2 + 17, K = 128 * 3 + 96;
    int mb = (M + 127) / 128, kb = (K + 127) / 128;
    size_t n = (size_t)E * M * K;
    float *w = malloc(n * 4), *d = malloc(n * 4);
    uint8_t *q = malloc(n);
    float *s = malloc((size_t)E * mb * kb * 4);
    // one kind per 128x128 block: fill rows with per-row tiles, then give
    // whole blocks a common kind by overwriting a few blocks
    fill_tiles(w, E * M, K, 128);
    for (int j = 0; j < 128; j++)
        for (int i = 0; i < 128; i++) w[(size_t)i * K + j] = 0.0f; // expert 0 block (0,0): zeros
    w[(size_t)(M + 5) * K + 130] = NAN;                             // expert 1 block (0,1): a NaN
    fp8_quantize_128x128(q, s, w, E, M, K);
    for (int e = 0; e < E; e++)
        for (int bi = 0; bi < mb; bi++)
            for (int bj = 0; bj < kb; bj++) {
                int rows = bi == mb - 1 ? M - 128 * bi : 128, cols = bj == kb - 1 ? K - 128 * bj : 128;
                size_t o = ((size_t)e * M + 128 * bi) * K + 128 * bj;
                check_block128_tile(w + o, q + o, s[((size_t)e * mb + bi) * kb + bj], rows, cols, K);
            }
    ck_assert(s[0] == FP8_AMAX_FLOOR / 448.0f);
    fp8_dequantize_128x128(d, q, s, E, M, K);
    for (int e = 0; e < E; e++)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < K; j++) {
                size_t at = ((size_t)e * M + i) * K + j;
                float want = fp8_e4m3_to_float(q[at]) * s[((size_t)e * mb + i / 128) * kb + j / 128];
                ck_assert(f_bits(d[at]) == f_bits(want) || (isnan(d[at]) && isnan(want)));
            }
    free(w); free(d); free(q); free(s);
}
END_TEST

START_TEST(test_quantize_mx) {
    int R = 29, C = 32 * 9 + 20;
    int nb = (C + 31) / 32;
    float *x = malloc((size_t)R * C * 4), *d = malloc((size_t)R * C * 4);
    uint8_t *q = malloc((size_t)R * C), *s = malloc((size_t)R * nb);
    fill_tiles(x, R, C, 32);
    fp8_quantize_mx(q, s, x, R, C);
    for (int r = 0; r < R; r++)
        for (int b = 0; b < nb; b++) {
            int c0 = 32 * b, c1 = c0 + 32 < C ? c0 + 32 : C, has_nan = 0;
            double amax = 0;
            for (int c = c0; c < c1; c++) {
                double v = x[(size_t)r * C + c];
                if (isnan(v)) has_nan = 1;
                else amax = fmax(amax, fabs(v));
            }
            // E8M0 exponent from the definition: floor(log2 amax) - 8, clamped
            int e = -127;
            if (amax > 0) e = (int)floor(log2(amax)) - 8;
            if (isinf(amax)) e = 128 - 8;
            if (e < -127) e = -127;
            if (e > 127) e = 127;
            int want_s = has_nan ? 0xff : e + 127;
            ck_assert_msg(s[r * nb + b] == want_s, "row %d block %d: scale byte %d, want %d (amax %.9g)", r, b,
                          s[r * nb + b], want_s, amax);
            for (int c = c0; c < c1; c++) {
                float v = x[(size_t)r * C + c];
                int want = oracle_encode((float)ldexp(v, -e));
                ck_assert_msg(q[(size_t)r * C + c] == want, "x %.9g e %d: q 0x%02x, want 0x%02x", v, e,
                              q[(size_t)r * C + c], want);
            }
        }
    fp8_dequantize_mx(d, q, s, R, C);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)r * C + c;
            int sb = s[r * nb + c / 32];
            double want = sb == 0xff ? NAN : (float)(oracle_decode(q[i]) * ldexp(1.0, sb - 127)); // FP32 may overflow
            if (isnan(want)) ck_assert(isnan(d[i]));
            else ck_assert_msg((double)d[i] == want, "dequant %.9g want %.9g", d[i], want);
        }
    ck_assert_int_eq(fp8_mx_scale_byte(0.0f, 0), 0);
    ck_assert_int_eq(fp8_mx_scale_byte(448.0f, 0), 127);     // 448 = 1.75 * 2^8: scale 1
    ck_assert_int_eq(fp8_mx_scale_byte(1.0f, 0), 127 - 8);
    ck_assert_int_eq(fp8_mx_scale_byte(1.0f, 1), 0xff);
    free(x); free(d); free(q); free(s);
}
END_TEST

// ---- the GEMM reference ----------------------------------------------------------

START_TEST(test_grouped_matmul_ref) {
    int E = 4, C = 256 + 64, OC = 128 + 32;
    int off[5] = {0, 7, 7, 40, 70}; // an empty expert
    int R = off[E];
    float *a = malloc((size_t)R * C * 4), *w = malloc((size_t)E * OC * C * 4);
    for (size_t i = 0; i < (size_t)R * C; i++) a[i] = (float)(urand() * 2 - 1);
    for (size_t i = 0; i < (size_t)E * OC * C; i++) w[i] = (float)((urand() * 2 - 1) * 0.05);
    int ta = (C + 127) / 128, mb = (OC + 127) / 128;
    uint8_t *qa = malloc((size_t)R * C), *qw = malloc((size_t)E * OC * C);
    float *sa = malloc((size_t)R * ta * 4), *sw = malloc((size_t)E * mb * ta * 4);
    fp8_quantize_1x128(qa, sa, a, R, C);
    fp8_quantize_128x128(qw, sw, w, E, OC, C);
    float *out = malloc((size_t)R * OC * 4), *exact = malloc((size_t)R * OC * 4);
    fp8_grouped_matmul_ref(out, qa, sa, qw, sw, off, E, C, OC);
    ops_cpu.grouped_matmul_forward(exact, a, w, off, E, C, OC);
    double dn = 0, rn = 0, qn = 0;
    for (int e = 0; e < E; e++)
        for (int r = off[e]; r < off[e + 1]; r++)
            for (int o = 0; o < OC; o++) {
                double acc = 0; // naive, double, from the definition of each dequantised operand
                for (int c = 0; c < C; c++)
                    acc += oracle_decode(qa[(size_t)r * C + c]) * sa[r * ta + c / 128] *
                           (oracle_decode(qw[((size_t)e * OC + o) * C + c]) * sw[((size_t)e * mb + o / 128) * ta + c / 128]);
                double got = out[(size_t)r * OC + o];
                dn += (got - acc) * (got - acc);
                rn += acc * acc;
                qn += (exact[(size_t)r * OC + o] - acc) * (exact[(size_t)r * OC + o] - acc);
            }
    ck_assert_msg(sqrt(dn / rn) < 1e-5, "FP8 reference vs naive double: rel err %.3g", sqrt(dn / rn));
    // what quantisation costs against the FP32 product: a few percent (3 mantissa bits)
    double qerr = sqrt(qn / rn);
    ck_assert_msg(qerr > 1e-3 && qerr < 6e-2, "FP8 vs FP32 product: rel err %.3g", qerr);
    free(a); free(w); free(qa); free(qw); free(sa); free(sw); free(out); free(exact);
}
END_TEST

// The MXFP8 GEMM reference (the Blackwell kernel's), C a multiple of 32 but
// not of 128, with an empty expert and one of a single row:
// - exact: codes of small values (0, +-0.5 .. +-4) and scale bytes 2^-2 ..
//   2^2, so that every product is a multiple of 2^-6 of at most 2^8 and every
//   sum of C of them below 2^15: exact in FP32 whatever the order, so the
//   result must equal the integer-exact sum (in double) bit for bit; then a
//   NaN scale byte (0xff) makes its row NaN and leaves the others' bits;
// - random values quantised by fp8_quantize_mx, with magnitudes that change
//   from one 32-block to the next (so a scale applied to the wrong block
//   shows): each element within C 2^-24 sum |a_k w_k| of the double sum of
//   the dequantised operands (FP32 summation of C terms in any order).
static int mx_code_of(double v) { // the E4M3 code of v, by search over the decoder's oracle
    for (int b = 0; b < 256; b++)
        if (oracle_decode(b) == v) return b;
    return -1;
}
// sum_c deq(qa[r]) deq(qw_e[o]) in double, and sum |..| in *abs_sum
static double mx_dot(const uint8_t *qa, const uint8_t *sa, const uint8_t *qw, const uint8_t *sw, int r, int e, int o,
                     int OC, int C, double *abs_sum) {
    int nb = (C + 31) / 32;
    double acc = 0, mag = 0;
    size_t wr = (size_t)e * OC + o;
    for (int c = 0; c < C; c++) {
        double x = oracle_decode(qa[(size_t)r * C + c]) * ldexp(1.0, sa[(size_t)r * nb + c / 32] - 127);
        double y = oracle_decode(qw[wr * C + c]) * ldexp(1.0, sw[wr * nb + c / 32] - 127);
        acc += x * y;
        mag += fabs(x * y);
    }
    if (abs_sum) *abs_sum = mag;
    return acc;
}

START_TEST(test_grouped_matmul_mx_ref) {
    { // exact
        int E = 3, C = 96, OC = 7, nb = C / 32;
        int off[4] = {0, 5, 5, 11};
        int R = off[E];
        static const double vals[13] = {0, 0.5, -0.5, 1, -1, 1.5, -1.5, 2, -2, 3, -3, 4, -4};
        uint8_t *qa = malloc((size_t)R * C), *sa = malloc((size_t)R * nb);
        uint8_t *qw = malloc((size_t)E * OC * C), *sw = malloc((size_t)E * OC * nb);
        for (size_t i = 0; i < (size_t)R * C; i++) qa[i] = (uint8_t)mx_code_of(vals[(int)(urand() * 13)]);
        for (size_t i = 0; i < (size_t)E * OC * C; i++) qw[i] = (uint8_t)mx_code_of(vals[(int)(urand() * 13)]);
        for (size_t i = 0; i < (size_t)R * nb; i++) sa[i] = (uint8_t)(125 + (int)(urand() * 5));
        for (size_t i = 0; i < (size_t)E * OC * nb; i++) sw[i] = (uint8_t)(125 + (int)(urand() * 5));
        float *out = malloc((size_t)R * OC * 4), *again = malloc((size_t)R * OC * 4);
        fp8_grouped_matmul_mx_ref(out, qa, sa, qw, sw, off, E, C, OC);
        int nonzero = 0;
        for (int e = 0; e < E; e++)
            for (int r = off[e]; r < off[e + 1]; r++)
                for (int o = 0; o < OC; o++) {
                    double want = mx_dot(qa, sa, qw, sw, r, e, o, OC, C, NULL);
                    float got = out[(size_t)r * OC + o];
                    ck_assert_msg((double)got == want, "exact MX GEMM row %d col %d: %.9g, want %.9g", r, o, got, want);
                    nonzero += want != 0;
                }
        ck_assert_int_gt(nonzero, R * OC / 2);
        // a NaN scale byte: row 2's second block
        sa[2 * nb + 1] = 0xff;
        fp8_grouped_matmul_mx_ref(again, qa, sa, qw, sw, off, E, C, OC);
        for (int r = 0; r < R; r++)
            for (int o = 0; o < OC; o++) {
                size_t i = (size_t)r * OC + o;
                if (r == 2) ck_assert_msg(isnan(again[i]), "NaN scale: row 2 col %d is %g", o, again[i]);
                else ck_assert_msg(f_bits(again[i]) == f_bits(out[i]), "NaN scale of row 2 changed row %d", r);
            }
        free(qa); free(sa); free(qw); free(sw); free(out); free(again);
    }
    { // random, against the double sum within the FP32 bound
        int E = 5, C = 32 * 7, OC = 40, nb = C / 32;
        int off[6] = {0, 13, 13, 50, 51, 90}; // an empty expert, one of one row
        int R = off[E];
        float *a = malloc((size_t)R * C * 4), *w = malloc((size_t)E * OC * C * 4);
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) a[(size_t)r * C + c] = (float)ldexp(urand() * 2 - 1, (c / 32) % 5 - 2);
        for (int i = 0; i < E * OC; i++)
            for (int c = 0; c < C; c++) w[(size_t)i * C + c] = (float)ldexp((urand() * 2 - 1) * 0.05, 2 - (c / 32) % 3);
        uint8_t *qa = malloc((size_t)R * C), *sa = malloc((size_t)R * nb);
        uint8_t *qw = malloc((size_t)E * OC * C), *sw = malloc((size_t)E * OC * nb);
        fp8_quantize_mx(qa, sa, a, R, C);
        fp8_quantize_mx(qw, sw, w, E * OC, C);
        float *out = malloc((size_t)R * OC * 4);
        fp8_grouped_matmul_mx_ref(out, qa, sa, qw, sw, off, E, C, OC);
        for (int e = 0; e < E; e++)
            for (int r = off[e]; r < off[e + 1]; r++)
                for (int o = 0; o < OC; o++) {
                    double mag, want = mx_dot(qa, sa, qw, sw, r, e, o, OC, C, &mag);
                    double err = fabs(out[(size_t)r * OC + o] - want), bound = C * 0x1p-24 * mag;
                    ck_assert_msg(err <= bound, "MX GEMM row %d col %d: %.9g, want %.9g (|err| %.3g > bound %.3g)", r,
                                  o, out[(size_t)r * OC + o], want, err, bound);
                }
        free(a); free(w); free(qa); free(sa); free(qw); free(sw); free(out);
    }
}
END_TEST

// ---- the data-grads: transposed weights, the gate/up pair ---------------------------

// fp8_transpose_128x128 moves the forward copy's bytes and scales, and the
// FP8 data-grad (the reference GEMM with them) is deq(dY) deq(W), from the
// definition of each dequantised operand (W not transposed), in double.
START_TEST(test_dgrad_ref) {
    int E = 3, M = 256, K = 384, mb = M / 128, kb = K / 128, ldt = 2 * M;
    int off[4] = {0, 9, 9, 50}; // an empty expert
    int R = off[E];
    float *w = malloc((size_t)E * M * K * 4), *dy = malloc((size_t)R * M * 4);
    for (size_t i = 0; i < (size_t)E * M * K; i++) w[i] = (float)((urand() * 2 - 1) * ldexp(1.0, (int)(i / 16384 % 7)));
    for (size_t i = 0; i < (size_t)R * M; i++) dy[i] = (float)(urand() * 2 - 1);
    uint8_t *q = malloc((size_t)E * M * K), *qt = malloc((size_t)E * K * ldt);
    float *s = malloc((size_t)E * mb * kb * 4), *st = malloc((size_t)E * kb * (ldt / 128) * 4);
    memset(qt, 0xab, (size_t)E * K * ldt);
    for (size_t i = 0; i < (size_t)E * kb * (ldt / 128); i++) st[i] = -1.0f;
    fp8_quantize_128x128(q, s, w, E, M, K);
    fp8_transpose_128x128(qt, st, ldt, M, q, s, E, M, K); // the right half, as the up weight's
    for (int e = 0; e < E; e++)
        for (int j = 0; j < K; j++)
            for (int c = 0; c < ldt; c++) {
                uint8_t got = qt[((size_t)e * K + j) * ldt + c];
                if (c < M) ck_assert_int_eq(got, 0xab); // the left half untouched
                else ck_assert_int_eq(got, q[((size_t)e * M + c - M) * K + j]);
            }
    for (int e = 0; e < E; e++)
        for (int bj = 0; bj < kb; bj++)
            for (int b = 0; b < ldt / 128; b++) {
                float got = st[((size_t)e * kb + bj) * (ldt / 128) + b];
                if (b < mb) ck_assert(got == -1.0f);
                else ck_assert(memcmp(&got, &s[((size_t)e * mb + b - mb) * kb + bj], 4) == 0);
            }
    // the data-grad dX [R, K] = deq(dY) deq(W_e): the reference GEMM with qt (ldt = M here)
    fp8_transpose_128x128(qt, st, M, 0, q, s, E, M, K);
    uint8_t *qy = malloc((size_t)R * M);
    float *sy = malloc((size_t)R * mb * 4), *dx = malloc((size_t)R * K * 4);
    fp8_quantize_1x128(qy, sy, dy, R, M);
    fp8_grouped_matmul_ref(dx, qy, sy, qt, st, off, E, M, K);
    double dn = 0, rn = 0;
    for (int e = 0; e < E; e++)
        for (int r = off[e]; r < off[e + 1]; r++)
            for (int j = 0; j < K; j++) {
                double acc = 0;
                for (int i = 0; i < M; i++)
                    acc += oracle_decode(qy[(size_t)r * M + i]) * sy[r * mb + i / 128] *
                           (oracle_decode(q[((size_t)e * M + i) * K + j]) * s[((size_t)e * mb + i / 128) * kb + j / 128]);
                double got = dx[(size_t)r * K + j];
                dn += (got - acc) * (got - acc);
                rn += acc * acc;
            }
    ck_assert_msg(sqrt(dn / rn) < 1e-5, "FP8 data-grad vs naive double: rel err %.3g", sqrt(dn / rn));
    free(w); free(dy); free(q); free(qt); free(s); free(st); free(qy); free(sy); free(dx);
}
END_TEST

// ---- the dense FP8 GEMMs (fp8.gemms: experts_dense) ---------------------------------

// fp8_quantize_1x128_t: fp8_quantize_1x128's codes and scales, the scales
// transposed; the CPU op fp8_matmul (forward, accumulate, and the data-grad
// with the transposed weight copy) against the naive double product of the
// dequantised operands from the definition (the untransposed scales). The
// values' magnitude changes per 1 x 128 tile and per 128 x 128 block, so a
// scale read from the wrong tile moves the product far past the bound.
START_TEST(test_dense_matmul_ref) {
    int N = 40, C = 384, OC = 256, nt = C / 128, ot = OC / 128;
    float *x = malloc((size_t)N * C * 4), *w = malloc((size_t)OC * C * 4), *dy = malloc((size_t)N * OC * 4);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++) x[(size_t)r * C + c] = (float)((urand() * 2 - 1) * ldexp(1.0, (r * 3 + c / 128 * 5) % 11 - 5));
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++) w[(size_t)o * C + c] = (float)((urand() * 2 - 1) * ldexp(1.0, (o / 128 * 4 + c / 128 * 3) % 9 - 8));
    for (int r = 0; r < N; r++)
        for (int o = 0; o < OC; o++) dy[(size_t)r * OC + o] = (float)((urand() * 2 - 1) * ldexp(1.0, (r + o / 128 * 7) % 13 - 6));
    uint8_t *qx = malloc((size_t)N * C), *qx2 = malloc((size_t)N * C), *qw = malloc((size_t)OC * C), *qwt = malloc((size_t)OC * C);
    float *sx = malloc((size_t)N * nt * 4), *sxt = malloc((size_t)N * nt * 4), *sw = malloc((size_t)ot * nt * 4),
          *swt = malloc((size_t)ot * nt * 4);
    fp8_quantize_1x128(qx, sx, x, N, C);
    ops_cpu.fp8_quantize_rows_t(qx2, sxt, x, N, C);
    ck_assert(memcmp(qx, qx2, (size_t)N * C) == 0);
    for (int r = 0; r < N; r++)
        for (int t = 0; t < nt; t++) ck_assert(memcmp(&sxt[(size_t)t * N + r], &sx[(size_t)r * nt + t], 4) == 0);
    ops_cpu.fp8_quantize_weights(qw, sw, qwt, swt, OC, 0, w, 1, OC, C);
    float *out = malloc((size_t)N * OC * 4), *acc_out = malloc((size_t)N * OC * 4);
    ops_cpu.fp8_matmul(out, qx2, sxt, qw, sw, N, C, OC, 0);
    for (size_t i = 0; i < (size_t)N * OC; i++) acc_out[i] = (float)(i % 7) - 3.0f;
    ops_cpu.fp8_matmul(acc_out, qx2, sxt, qw, sw, N, C, OC, 1);
    double dn = 0, rn = 0, an = 0;
    for (int r = 0; r < N; r++)
        for (int o = 0; o < OC; o++) {
            double acc = 0;
            for (int c = 0; c < C; c++)
                acc += oracle_decode(qx[(size_t)r * C + c]) * sx[r * nt + c / 128] *
                       (oracle_decode(qw[(size_t)o * C + c]) * sw[(o / 128) * nt + c / 128]);
            size_t i = (size_t)r * OC + o;
            dn += (out[i] - acc) * (out[i] - acc);
            an += (acc_out[i] - ((float)(i % 7) - 3.0f) - acc) * (acc_out[i] - ((float)(i % 7) - 3.0f) - acc);
            rn += acc * acc;
        }
    ck_assert_msg(sqrt(dn / rn) < 1e-5, "FP8 dense GEMM vs naive double: rel err %.3g", sqrt(dn / rn));
    ck_assert_msg(sqrt(an / rn) < 1e-5, "FP8 dense GEMM, accumulating: rel err %.3g", sqrt(an / rn));
    // the data-grad dX [N, C] = deq(dY) deq(W): fp8_matmul with dY and the transposed copy
    uint8_t *qy = malloc((size_t)N * OC);
    float *syt = malloc((size_t)N * ot * 4), *dx = malloc((size_t)N * C * 4);
    ops_cpu.fp8_quantize_rows_t(qy, syt, dy, N, OC);
    ops_cpu.fp8_matmul(dx, qy, syt, qwt, swt, N, OC, C, 0);
    dn = rn = 0;
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++) {
            double acc = 0;
            for (int o = 0; o < OC; o++)
                acc += oracle_decode(qy[(size_t)r * OC + o]) * syt[(o / 128) * N + r] *
                       (oracle_decode(qw[(size_t)o * C + c]) * sw[(o / 128) * nt + c / 128]);
            double got = dx[(size_t)r * C + c];
            dn += (got - acc) * (got - acc);
            rn += acc * acc;
        }
    ck_assert_msg(sqrt(dn / rn) < 1e-5, "FP8 dense data-grad vs naive double: rel err %.3g", sqrt(dn / rn));
    free(x); free(w); free(dy); free(qx); free(qx2); free(qw); free(qwt); free(sx); free(sxt); free(sw); free(swt);
    free(out); free(acc_out); free(qy); free(syt); free(dx);
}
END_TEST

// fp8_quantize_1x128_pair: row r of [a | b], which is a and b quantised on
// their own (F % 128 == 0: no tile straddles them), placed side by side.
START_TEST(test_quantize_pair) {
    int R = 37, F = 256, nt = F / 128;
    float *a = malloc((size_t)R * F * 4), *b = malloc((size_t)R * F * 4);
    fill_tiles(a, R, F, 128);
    fill_tiles(b, R, F, 128);
    uint8_t *q = malloc((size_t)R * 2 * F), *qa = malloc((size_t)R * F), *qb = malloc((size_t)R * F);
    float *s = malloc((size_t)R * 2 * nt * 4), *sa = malloc((size_t)R * nt * 4), *sb = malloc((size_t)R * nt * 4);
    fp8_quantize_1x128_pair(q, s, a, b, R, F);
    fp8_quantize_1x128(qa, sa, a, R, F);
    fp8_quantize_1x128(qb, sb, b, R, F);
    for (int r = 0; r < R; r++) {
        ck_assert(memcmp(q + (size_t)r * 2 * F, qa + (size_t)r * F, F) == 0);
        ck_assert(memcmp(q + (size_t)r * 2 * F + F, qb + (size_t)r * F, F) == 0);
        ck_assert(memcmp(s + (size_t)r * 2 * nt, sa + (size_t)r * nt, nt * 4) == 0);
        ck_assert(memcmp(s + (size_t)r * 2 * nt + nt, sb + (size_t)r * nt, nt * 4) == 0);
    }
    free(a); free(b); free(q); free(qa); free(qb); free(s); free(sa); free(sb);
}
END_TEST

// fp8.wgrad: fp8's operands: 128 x 1 tiles along the rows inside each
// segment, quantised and dequantised in place; against the scalar rules
// (the amax rule here, the independent oracle encoder) tile by tile. A
// spike in each segment's first row would change the scale of the previous
// segment's last tile if a tile crossed the boundary.
START_TEST(test_fake_quantize_128x1) {
    static const int counts[] = {0, 1, 127, 128, 129, 300, 0, 5};
    enum { E = 8, C = 70 };
    int off[E + 1] = {0};
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + counts[e];
    int R = off[E];
    float *x = malloc((size_t)R * C * 4), *y = malloc((size_t)R * C * 4);
    fill_tiles(x, R, C, 8);
    for (int e = 0; e < E; e++)
        if (counts[e]) x[(size_t)off[e] * C + 3] = 1e6f; // column 3's spike in the segment's first row
    memcpy(y, x, (size_t)R * C * 4);
    fp8_fake_quantize_128x1(y, off, E, C);
    long tiles = 0;
    for (int e = 0; e < E; e++)
        for (int r0 = off[e]; r0 < off[e + 1]; r0 += 128) {
            int r1 = r0 + 128 < off[e + 1] ? r0 + 128 : off[e + 1];
            for (int c = 0; c < C; c++, tiles++) {
                float amax = 0.0f;
                for (int r = r0; r < r1; r++) {
                    float v = x[(size_t)r * C + c];
                    if (!isnan(v) && fabsf(v) > amax) amax = fabsf(v);
                }
                if (amax > FLT_MAX) amax = FLT_MAX;
                if (amax < FP8_AMAX_FLOOR) amax = FP8_AMAX_FLOOR;
                float sc = amax / 448.0f;
                for (int r = r0; r < r1; r++) {
                    float v = x[(size_t)r * C + c], got = y[(size_t)r * C + c];
                    float want = fp8_e4m3_to_float((uint8_t)oracle_encode(v / sc)) * sc;
                    ck_assert_msg(f_bits(got) == f_bits(want) || (isnan(got) && isnan(want)),
                                  "expert %d rows %d..%d column %d row %d: x %.9g -> %.9g, want %.9g (scale %.9g)", e,
                                  r0, r1, c, r, v, got, want, sc);
                }
            }
        }
    ck_assert_int_eq(tiles, (long)C * (0 + 1 + 1 + 1 + 2 + 3 + 0 + 1));
    free(x);
    free(y);
}
END_TEST

// The FP8 dispatch payload (ep > 1) through the CPU op table: rows
// quantised at the source (the gather's quantiser), packed, moved as bytes
// in an arbitrary received order (the all-to-all), unpacked through a
// regroup map, must be the codes and scales that quantising the regrouped
// rows after the dispatch gives, bit for bit; and a payload row is its
// codes, then its scales' bits, fp8_payload_bytes(C) = C + 4 C/128 bytes.
START_TEST(test_dispatch_payload) {
    enum { N = 50, R = 120, C = 384, NT = C / 128 };
    ck_assert_uint_eq(fp8_payload_bytes(C), 396);
    size_t pb = fp8_payload_bytes(C);
    float *x = malloc((size_t)N * C * 4);
    fill_tiles(x, N, C, 128);
    int tor[R], perm[R], regroup[R], after[R];
    for (int r = 0; r < R; r++) tor[r] = (int)(urand() * N);
    for (int r = 0; r < R; r++) perm[r] = regroup[r] = r;
    for (int r = R - 1; r > 0; r--) { // two random orders: received, then regrouped
        int i = (int)(urand() * (r + 1)), j = (int)(urand() * (r + 1)), t;
        t = perm[r]; perm[r] = perm[i]; perm[i] = t;
        t = regroup[r]; regroup[r] = regroup[j]; regroup[j] = t;
    }
    uint8_t *q = malloc((size_t)R * C), *p = malloc(R * pb), *recv = malloc(R * pb), *ql = malloc((size_t)R * C);
    uint8_t *qr = malloc((size_t)R * C);
    float *sq = malloc((size_t)R * NT * 4), *sl = malloc((size_t)R * NT * 4), *sr = malloc((size_t)R * NT * 4);
    ops_cpu.fp8_quantize_rows(q, sq, x, tor, R, C);
    memset(p, 0xa5, R * pb);
    ops_cpu.fp8_pack_rows(p, q, sq, R, C);
    for (int r = 0; r < R; r++) {
        ck_assert(memcmp(p + r * pb, q + (size_t)r * C, C) == 0);
        ck_assert(memcmp(p + r * pb + C, sq + (size_t)r * NT, NT * 4) == 0);
    }
    for (int r = 0; r < R; r++) memcpy(recv + r * pb, p + (size_t)perm[r] * pb, pb);
    ops_cpu.fp8_unpack_rows(ql, sl, recv, regroup, R, C);
    for (int r = 0; r < R; r++) after[r] = tor[perm[regroup[r]]]; // the token of each regrouped row
    ops_cpu.fp8_quantize_rows(qr, sr, x, after, R, C);
    for (int r = 0; r < R; r++) {
        ck_assert_msg(memcmp(ql + (size_t)r * C, qr + (size_t)r * C, C) == 0, "row %d: codes differ", r);
        ck_assert_msg(memcmp(sl + (size_t)r * NT, sr + (size_t)r * NT, NT * 4) == 0, "row %d: scales differ", r);
    }
    ops_cpu.fp8_unpack_rows(ql, sl, recv, NULL, R, C); // no map: the received order
    for (int r = 0; r < R; r++) {
        ck_assert(memcmp(ql + (size_t)r * C, q + (size_t)perm[r] * C, C) == 0);
        ck_assert(memcmp(sl + (size_t)r * NT, sq + (size_t)perm[r] * NT, NT * 4) == 0);
    }
    free(x); free(q); free(p); free(recv); free(ql); free(qr); free(sq); free(sl); free(sr);
}
END_TEST

int main(void) {
    init_values();
    Suite *s = suite_create("fp8");
    TCase *tc = tcase_create("fp8");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_decode_all_codes);
    tcase_add_test(tc, test_round_trip_codes);
    tcase_add_test(tc, test_encode_specials);
    tcase_add_test(tc, test_encode_exhaustive);
    tcase_add_test(tc, test_quantize_1x128);
    tcase_add_test(tc, test_quantize_128x128);
    tcase_add_test(tc, test_quantize_mx);
    tcase_add_test(tc, test_grouped_matmul_ref);
    tcase_add_test(tc, test_grouped_matmul_mx_ref);
    tcase_add_test(tc, test_dgrad_ref);
    tcase_add_test(tc, test_quantize_pair);
    tcase_add_test(tc, test_fake_quantize_128x1);
    tcase_add_test(tc, test_dispatch_payload);
    tcase_add_test(tc, test_dense_matmul_ref);
    suite_add_tcase(s, tc);
    return check_run(s);
}
