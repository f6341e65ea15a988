// Writes FP8 reference outputs for tests/test_fp8_torch.sh to compare with
// PyTorch: tool_fp8_dump DIR writes, as raw little-endian arrays,
//   dec.f32        the 256 codes decoded;
//   enc_in.f32     3 x 2^20 FP32 values (every pattern with its low 12 bits
//                  0, 1 or 0xfff: all exponents, every E4M3 midpoint, and
//                  the values just beside them), enc_out.u8 their encodings;
//   b128_x.f32     [64, 1024] tiles of mixed kinds, b128_q.u8 and
//                  b128_s.f32 its 1x128 quantisation;
//   mx_x.f32       the same values, mx_q.u8 and mx_s.u8 their MXFP8 form.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/fp8.h"

static void put(const char *dir, const char *name, const void *p, size_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, bytes, f) != bytes) {
        fprintf(stderr, "tool_fp8_dump: cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: tool_fp8_dump DIR\n");
        return 2;
    }
    float dec[256];
    for (int b = 0; b < 256; b++) dec[b] = fp8_e4m3_to_float((uint8_t)b);
    put(argv[1], "dec.f32", dec, sizeof dec);

    size_t n = (size_t)3 << 20;
    uint32_t *in = malloc(n * 4);
    uint8_t *out = malloc(n);
    const uint32_t low[3] = {0, 1, 0xfff};
    for (size_t i = 0; i < n; i++) {
        in[i] = (uint32_t)(i % ((size_t)1 << 20)) << 12 | low[i >> 20];
        float x;
        memcpy(&x, &in[i], 4);
        out[i] = fp8_e4m3_from_float(x);
    }
    put(argv[1], "enc_in.f32", in, n * 4);
    put(argv[1], "enc_out.u8", out, n);

    int R = 64, C = 1024;
    size_t m = (size_t)R * C;
    float *x = malloc(m * 4);
    uint64_t s = 12345;
    for (int r = 0; r < R; r++)
        for (int t = 0; t < C / 32; t++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            int kind = (int)(s >> 61);
            float mag = ldexpf(1.0f, (int)((s >> 20) % 60) - 30);
            for (int c = 32 * t; c < 32 * (t + 1); c++) {
                s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                float u = (float)((s >> 40) * (1.0 / 16777216.0)) * 2 - 1, f = u * mag;
                if (kind == 1) f = 0.0f;
                if (kind == 2 && c % 32 == 5) f = NAN;
                if (kind == 3 && c % 32 == 7) f = -INFINITY;
                if (kind == 4) f = u * 1e-39f;
                if (kind == 5 && c % 32 == 9) f *= 1e6f;
                x[(size_t)r * C + c] = f;
            }
        }
    uint8_t *q = malloc(m), *mxs = malloc(m / 32);
    float *sc = malloc(m / 128 * 4);
    fp8_quantize_1x128(q, sc, x, R, C);
    put(argv[1], "b128_x.f32", x, m * 4);
    put(argv[1], "b128_q.u8", q, m);
    put(argv[1], "b128_s.f32", sc, m / 128 * 4);
    fp8_quantize_mx(q, mxs, x, R, C);
    put(argv[1], "mx_x.f32", x, m * 4);
    put(argv[1], "mx_q.u8", q, m);
    put(argv[1], "mx_s.u8", mxs, m / 32);
    free(in); free(out); free(x); free(q); free(mxs); free(sc);
    return 0;
}
