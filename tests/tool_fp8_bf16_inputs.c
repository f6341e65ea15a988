// How far one training step's gradients move on the CPU when the FP8
// quantisers see BF16-rounded values (as the GPU's do: its activations are
// BF16) instead of FP32 ones: the part of the CPU-fp8 vs CUDA-fp8 gradient
// difference (tests/gpu/test_cuda_model's FP8 bounds) that comes from
// values landing on the other side of an E4M3 rounding boundary. Runs
// test_cuda_model's "fp8 block128" config and batch (d 256, 4 layers, 8
// experts top-2, random routing, 2 x 128 tokens) with fp8.gemms: experts
// and experts_dense, each on ops_cpu and on ops_cpu with its quantisers
// wrapped to round their inputs to BF16 first, and prints every gradient
// that differs by more than 5% (relative L2) and the worst.
// Measured 2026-12-02: experts 3.4e-2 at worst; experts_dense 1.16e-1
// (layers.3.attn.k_norm), most tensors 7-10e-2.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/model.h"
#include "ops/fp8.h"
static float rbf(float f) { unsigned u; memcpy(&u, &f, 4); if ((u & 0x7fffffffu) > 0x7f800000u) return f; u += 0x7fffu + ((u >> 16) & 1u); u &= 0xffff0000u; memcpy(&f, &u, 4); return f; }
static float *rcopy(const void *x, size_t n) { float *y = malloc(n * 4 + 4); for (size_t i = 0; i < n; i++) y[i] = rbf(((const float *)x)[i]); return y; }
static void q_rows(uint8_t *q, float *s, const void *x, const int *tor, int R, int C) {
    size_t rows = R; if (tor) { rows = 0; for (int r = 0; r < R; r++) if ((size_t)tor[r] + 1 > rows) rows = tor[r] + 1; }
    float *y = rcopy(x, rows * C); ops_cpu.fp8_quantize_rows(q, s, y, tor, R, C); free(y);
}
static void q_rows_t(uint8_t *q, float *s, const void *x, int R, int C) { float *y = rcopy(x, (size_t)R * C); ops_cpu.fp8_quantize_rows_t(q, s, y, R, C); free(y); }
static void q_swiglu(uint8_t *q, float *s, const void *g, const void *u, int R, int F) {
    size_t n = (size_t)R * F; float *a = rcopy(g, n), *b = rcopy(u, n), *o = malloc(n * 4);
    ops_cpu.swiglu_forward(o, a, b, n); for (size_t i = 0; i < n; i++) o[i] = rbf(o[i]);
    fp8_quantize_1x128(q, s, o, R, F); free(a); free(b); free(o);
}
static void q_swiglu_bwd(void *dg, void *du, uint8_t *q, float *s, const void *dout, const void *g, const void *u, int R, int F) {
    size_t n = (size_t)R * F; float *a = rcopy(g, n), *b = rcopy(u, n), *d = rcopy(dout, n);
    ops_cpu.swiglu_backward(dg, du, d, a, b, n);
    for (size_t i = 0; i < n; i++) { ((float *)dg)[i] = rbf(((float *)dg)[i]); ((float *)du)[i] = rbf(((float *)du)[i]); }
    fp8_quantize_1x128_pair(q, s, dg, du, R, F); free(a); free(b); free(d);
}
static void build(Model *m, const Ops *ops, int mode) {
    ModelConfig c; char err[256];
    model_config_defaults(&c);
    const char *kv[][2] = {{"vocab_size", "257"}, {"d_model", "256"}, {"n_layers", "4"}, {"n_heads", "4"}, {"n_experts", "8"},
        {"top_k", "2"}, {"expert_hidden", "256"}, {"seq_len", "128"}, {"norm", "pre"}, {"qk_norm", "full"}, {"routing", "random"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) if (model_config_set(&c, kv[i][0], kv[i][1], err, sizeof err)) { puts(err); exit(1); }
    if (model_init(m, &c, ops, err, sizeof err)) { puts(err); exit(1); }
    model_init_weights(m, 7);
    if (model_set_fp8(m, err, sizeof err)) { puts(err); exit(1); }
    if (mode == 4 && model_set_fp8_dense(m, 256, err, sizeof err)) { puts(err); exit(1); }
    model_alloc_acts(m, 2, 128);
}
int main(void) {
    Ops o = ops_cpu;
    o.fp8_quantize_rows = q_rows; o.fp8_quantize_rows_t = q_rows_t; o.fp8_swiglu_quantize = q_swiglu; o.fp8_swiglu_backward_quantize = q_swiglu_bwd;
    int modes[2] = {1, 4};
    for (int mi = 0; mi < 2; mi++) {
        Model a, b; build(&a, &ops_cpu, modes[mi]); build(&b, &o, modes[mi]);
        int N = 256, tok[256], tgt[256]; unsigned seed = 11;
        for (int i = 0; i < N; i++) { seed = seed * 1103515245u + 12345u; tok[i] = (seed >> 8) % 257; }
        for (int i = 0; i < N; i++) tgt[i] = (i % 128 == 127) ? -1 : tok[i + 1];
        Model *ms[2] = {&a, &b}; float loss[2];
        for (int i = 0; i < 2; i++) { model_zero_grads(ms[i]); model_begin_step(ms[i]); loss[i] = model_forward(ms[i], tok, tgt, 1); model_backward(ms[i], 1.0f / ms[i]->n_valid, 1.0f); }
        printf("== %s: loss FP32-input %.5f, BF16-input %.5f\n", modes[mi] == 4 ? "experts_dense" : "experts", loss[0], loss[1]);
        double worst = 0; const char *wn = "";
        for (int i = 0; i < a.store.table.n; i++) {
            const ParamEntry *e = &a.store.table.entries[i];
            const float *ga = param_store_grad(&a.store, i), *gb = param_store_grad(&b.store, i);
            double d = 0, r = 0;
            for (size_t j = 0; j < e->numel; j++) { d += ((double)gb[j] - ga[j]) * ((double)gb[j] - ga[j]); r += (double)ga[j] * ga[j]; }
            double err = sqrt(d / r);
            if (err > 0.05) printf("   grad %-36s rel %.3e\n", e->name, err);
            if (err > worst) { worst = err; wn = e->name; }
        }
        printf("   worst %.3e (%s) of %d\n", worst, wn, a.store.table.n);
        model_free(&a); model_free(&b);
    }
    return 0;
}
