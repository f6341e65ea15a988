// The CPU backend: FP32 kernels from cpu_kernels.h behind the op table.
// Memory is host memory; act buffers hold float. The wrappers only give the
// kernels the table's types.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "util/check.h"

typedef float real;
#include "ops/cpu/cpu_kernels.h"
#include "ops/ep_sym.h"
#include "ops/fp8.h"

#define F(p) ((float *)(p))
#define CF(p) ((const float *)(p))

// Backend allocations carry their size in a 16-byte header, for the
// counters of ops_cpu_alloc_stats (the memory accounting's measure).
static size_t live_bytes, peak_bytes;
void ops_cpu_count_bytes(size_t bytes, int freed) {
    size_t now = freed ? __atomic_sub_fetch(&live_bytes, bytes, __ATOMIC_RELAXED)
                       : __atomic_add_fetch(&live_bytes, bytes, __ATOMIC_RELAXED);
    size_t peak = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&peak_bytes, &peak, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
}
void ops_cpu_alloc_stats(size_t *live, size_t *peak) {
    *live = __atomic_load_n(&live_bytes, __ATOMIC_RELAXED);
    *peak = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED);
}
int ops_cpu_poison(void) {
    const char *p = getenv("MOECORE_CPU_POISON");
    return p && p[0] && strcmp(p, "0") != 0;
}
static void *c_alloc(size_t bytes) {
    size_t *h = mallocCheck(bytes + 16);
    h[0] = bytes;
    ops_cpu_count_bytes(bytes, 0);
    if (ops_cpu_poison()) memset(h + 2, 0xff, bytes);
    return (char *)h + 16;
}
static void c_free(void *p) {
    if (!p) return;
    size_t *h = (size_t *)((char *)p - 16);
    ops_cpu_count_bytes(h[0], 1);
    free(h);
}
static void *c_alloc_host(size_t bytes) { return mallocCheck(bytes); }
static void c_free_host(void *p) { free(p); }
static void c_copy(void *dst, const void *src, size_t bytes) { if (bytes && dst != src) memcpy(dst, src, bytes); }
static void c_cast(void *dst, const float *src, size_t n) { if (dst != src) memcpy(dst, src, n * sizeof(float)); }

static void c_embedding_forward(void *out, const int *tokens, const void *wte, int N, int C) {
    cpu_embedding_forward(F(out), tokens, CF(wte), N, C);
}
static void c_embedding_backward(float *dwte, const void *dout, const int *tokens, int N, int C) {
    cpu_embedding_backward(dwte, CF(dout), tokens, N, C);
}
static void c_matmul_forward(void *out, const void *inp, const void *w, int N, int C, int OC) {
    cpu_matmul_forward(F(out), CF(inp), CF(w), N, C, OC);
}
static void c_matmul_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                              int N, int C, int OC, int accumulate) {
    cpu_matmul_backward(F(dinp), dw, CF(dout), CF(inp), CF(w), N, C, OC, accumulate);
}
static void c_router_topk(int *idx, const float *probs, const float *bias, int N, int E, int k, RoutingMode mode,
                          const uint64_t *seed) {
    cpu_router_topk(idx, probs, bias, N, E, k, mode, mode == ROUTING_RANDOM ? *seed : 0);
}
static void c_router_logits_forward(float *logits, const void *inp, const void *w, int N, int C, int E) {
    cpu_matmul_forward(logits, CF(inp), CF(w), N, C, E);
}
static void c_router_logits_backward(void *dinp, float *dw, const float *dlogits, const void *inp,
                                     const void *w, int N, int C, int E) {
    cpu_matmul_backward(F(dinp), dw, dlogits, CF(inp), CF(w), N, C, E, 1);
}
static void c_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *w, int N, int C, float eps) {
    cpu_rmsnorm_forward(F(out), rstd, CF(inp), CF(w), N, C, eps);
}
static void c_rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                               const float *rstd, int N, int C, int accumulate) {
    cpu_rmsnorm_backward(F(dinp), dw, CF(dout), CF(inp), CF(w), rstd, N, C, accumulate);
}
static void c_rope_forward(void *out, const void *inp, const float *cs, const float *sn, int B, int T, int nh, int hd) {
    cpu_rope_forward(F(out), CF(inp), cs, sn, B, T, nh, hd);
}
static void c_rope_backward(void *dinp, const void *dout, const float *cs, const float *sn, int B, int T, int nh, int hd) {
    cpu_rope_backward(F(dinp), CF(dout), cs, sn, B, T, nh, hd);
}
// QK-norm then RoPE: the two ops in turn through tmp (the reference the
// CUDA backend's fused kernels match)
static void c_rmsnorm_rope_forward(void *out, float *rstd, void *tmp, const void *inp, const void *w,
                                   const float *cs, const float *sn, int B, int T, int nh, int hd, int C, float eps) {
    if (C <= 0) return;
    int N = (int)((long)B * T * nh * hd / C);
    cpu_rmsnorm_forward(F(tmp), rstd, CF(inp), CF(w), N, C, eps);
    cpu_rope_forward(F(out), CF(tmp), cs, sn, B, T, nh, hd);
}
static void c_rmsnorm_rope_backward(void *dinp, float *dw, void *tmp, const void *dout, const void *inp, const void *w,
                                    const float *rstd, const float *cs, const float *sn, int B, int T, int nh, int hd,
                                    int C, int accumulate) {
    if (C <= 0) return;
    int N = (int)((long)B * T * nh * hd / C);
    cpu_rope_backward(F(tmp), CF(dout), cs, sn, B, T, nh, hd);
    cpu_rmsnorm_backward(F(dinp), dw, CF(tmp), CF(inp), CF(w), rstd, N, C, accumulate);
}
static void c_attention_forward(void *out, float *saved, const void *q, const void *k, const void *v,
                                const int *doc_start, int B, int T, int H, int KV, int hd) {
    cpu_attention_forward(F(out), saved, CF(q), CF(k), CF(v), doc_start, B, T, H, KV, hd);
}
static void c_attention_backward(void *dq, void *dk, void *dv, const void *dout, const float *saved,
                                 const void *q, const void *k, const void *v, const void *out,
                                 const int *doc_start, float *scratch, int B, int T, int H, int KV, int hd) {
    cpu_attention_backward(F(dq), F(dk), F(dv), CF(dout), saved, CF(q), CF(k), CF(v), doc_start, scratch, B, T,
                           H, KV, hd);
}
static void c_swiglu_forward(void *out, const void *gate, const void *up, size_t n) {
    cpu_swiglu_forward(F(out), CF(gate), CF(up), n);
}
static void c_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n) {
    cpu_swiglu_backward(F(dgate), F(dup), CF(dout), CF(gate), CF(up), n);
}
static void c_lb_loss_forward(float *out, const float *probs, const float *counts, float count_tokens,
                              int N, int E, int k, Gating g) {
    out[0] = cpu_lb_loss_forward(probs, counts, count_tokens, N, E, k, g);
}
static void c_zloss_forward(float *out, const float *logits, int N, int E) {
    out[0] = cpu_zloss_forward(logits, N, E);
}
static void c_permute_forward(void *xp, const void *x, const int *token_of_row, int R, int C) {
    cpu_permute_forward(F(xp), CF(x), token_of_row, R, C);
}
static void c_permute_backward(void *dx, const void *dxp, const int *token_of_row, int N, int R, int C, int accumulate) {
    cpu_permute_backward(F(dx), CF(dxp), token_of_row, N, R, C, accumulate);
}
static void c_unpermute_forward(void *out, const void *y, const float *weights, const int *row_of, int N,
                                int k, int C, int accumulate) {
    cpu_unpermute_forward(F(out), CF(y), weights, row_of, N, k, C, accumulate);
}
static void c_unpermute_backward(void *dy, float *dweights, const void *dout, const void *y,
                                 const float *weights, const int *row_of, int N, int k, int C) {
    cpu_unpermute_backward(F(dy), dweights, CF(dout), CF(y), weights, row_of, N, k, C);
}
static void c_moe_capacity_drop(void *y, float *dropped, const int *offsets, int E, int R, int C, int capacity) {
    (void)R;
    long n = 0;
    for (int e = 0; e < E; e++) {
        int first = offsets[e] + capacity, end = offsets[e + 1];
        if (end <= first) continue;
        memset(F(y) + (size_t)first * C, 0, (size_t)(end - first) * C * sizeof(float));
        n += end - first;
    }
    if (dropped) dropped[0] += (float)n;
}
static void c_swiglu_forward_rows(void *out, const void *gate, const void *up, const int *rows, int max_rows,
                                  int cols) {
    size_t n = (size_t)(rows[0] < max_rows ? rows[0] : max_rows) * cols;
    cpu_swiglu_forward(F(out), CF(gate), CF(up), n);
}
static void c_swiglu_backward_rows(void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                                   const int *rows, int max_rows, int cols) {
    size_t n = (size_t)(rows[0] < max_rows ? rows[0] : max_rows) * cols;
    cpu_swiglu_backward(F(dgate), F(dup), CF(dout), CF(gate), CF(up), n);
}
static void c_moe_segment_sizes(int *sizes, const int *offsets, int E) {
    for (int e = 0; e < E; e++) sizes[e] = offsets[e + 1] - offsets[e];
}
static void c_grouped_matmul_forward(void *out, const void *inp, const void *w, const int *offsets,
                                     int E, int C, int OC) {
    cpu_grouped_matmul_forward(F(out), CF(inp), CF(w), offsets, E, C, OC);
}
static void c_grouped_glu_forward(void *g, void *u, void *a, const void *inp, const void *wg, const void *wu,
                                  const int *offsets, int E, int C, int OC, int R) {
    cpu_grouped_matmul_forward(F(g), CF(inp), CF(wg), offsets, E, C, OC);
    cpu_grouped_matmul_forward(F(u), CF(inp), CF(wu), offsets, E, C, OC);
    ops_cpu.swiglu_forward(a, g, u, (size_t)R * OC);
}
static void c_grouped_matmul_backward(void *dinp, float *dw, const void *dout, const void *inp,
                                      const void *w, const int *offsets, int E, int C, int OC, int accumulate) {
    if (dw && !accumulate) memset(dw, 0, (size_t)E * OC * C * sizeof(float));
    cpu_grouped_matmul_backward(F(dinp), dw, CF(dout), CF(inp), CF(w), offsets, E, C, OC);
}
void ops_cpu_wgrad_slots(const float *dw, double *slots, int E, int C, int OC) {
    const int rs = (OC + 15) / 16, cs = (C + 127) / 128;
#pragma omp parallel for collapse(2)
    for (int e = 0; e < E; e++)
        for (int i = 0; i < rs; i++) {
            const float *o = dw + (size_t)e * OC * C;
            for (int j = 0; j < cs; j++) {
                double lane[32];
                for (int l = 0; l < 32; l++) {
                    int r = 16 * i + l / 4, c0 = 128 * j + 2 * (l % 4);
                    double s = 0;
                    for (int t = 0; t < 16; t++) {
                        int c = c0 + 8 * t;
                        if (c >= C) continue;
                        if (r < OC) {
                            s += (double)o[(size_t)r * C + c] * o[(size_t)r * C + c];
                            s += (double)o[(size_t)r * C + c + 1] * o[(size_t)r * C + c + 1];
                        }
                        if (r + 8 < OC) {
                            s += (double)o[(size_t)(r + 8) * C + c] * o[(size_t)(r + 8) * C + c];
                            s += (double)o[(size_t)(r + 8) * C + c + 1] * o[(size_t)(r + 8) * C + c + 1];
                        }
                    }
                    lane[l] = s;
                }
                for (int k = 16; k; k >>= 1) {
                    double nx[32];
                    for (int l = 0; l < 32; l++) nx[l] = lane[l] + lane[l ^ k];
                    memcpy(lane, nx, sizeof lane);
                }
                slots[((size_t)e * rs + i) * cs + j] = lane[0];
            }
        }
}
static void c_grouped_wgrad_sumsq(float *dw, double *slots, const void *dout, const void *inp, const int *offsets,
                                  int E, int C, int OC, int accumulate) {
    c_grouped_matmul_backward(NULL, dw, dout, inp, dout, offsets, E, C, OC, accumulate); // w: unread without dinp
    ops_cpu_wgrad_slots(dw, slots, E, C, OC);
}
static void c_grouped_dgrad_pair(void *dinp, const void *dout1, const void *w1, const void *dout2, const void *w2,
                                  const int *offsets, int E, int C, int OC) {
    cpu_grouped_dgrad_pair(F(dinp), CF(dout1), CF(w1), CF(dout2), CF(w2), offsets, E, C, OC);
}
// FP8: the reference quantisers of ops/fp8.h on the FP32 act values; the
// permute and the SwiGLU run first into a scratch (the CPU is the readable
// reference, not fused).
static void c_fp8_quantize_weights(uint8_t *qw, float *sw, uint8_t *qwt, float *swt, int ldt, int col0, const float *w,
                                   int E, int M, int K) {
    fp8_quantize_128x128(qw, sw, w, E, M, K);
    if (qwt) fp8_transpose_128x128(qwt, swt, ldt, col0, qw, sw, E, M, K);
}
static void c_fp8_quantize_rows(uint8_t *q, float *s, const void *x, const int *token_of_row, int R, int C) {
    if (!token_of_row) { fp8_quantize_1x128(q, s, CF(x), R, C); return; }
    float *xp = mallocCheck((size_t)R * C * sizeof(float) + 1);
    cpu_permute_forward(xp, CF(x), token_of_row, R, C);
    fp8_quantize_1x128(q, s, xp, R, C);
    free(xp);
}
static void c_fp8_swiglu_quantize(uint8_t *q, float *s, const void *gate, const void *up, int R, int F) {
    float *a = mallocCheck((size_t)R * F * sizeof(float) + 1);
    cpu_swiglu_forward(a, CF(gate), CF(up), (size_t)R * F);
    fp8_quantize_1x128(q, s, a, R, F);
    free(a);
}
static void c_fp8_unpermute_backward_quantize(void *dy, float *dweights, uint8_t *q, float *s, const void *dout,
                                              const void *y, const float *weights, const int *row_of, int N, int k,
                                              int C) {
    c_unpermute_backward(dy, dweights, dout, y, weights, row_of, N, k, C);
    c_fp8_quantize_rows(q, s, dy, NULL, N * k, C);
}
static void c_fp8_swiglu_backward_quantize(void *dgate, void *dup, uint8_t *q, float *s, const void *dout,
                                           const void *gate, const void *up, int R, int F) {
    cpu_swiglu_backward(F(dgate), F(dup), CF(dout), CF(gate), CF(up), (size_t)R * F);
    fp8_quantize_1x128_pair(q, s, CF(dgate), CF(dup), R, F);
}
static void c_fp8_dequantize_rows(void *x, const uint8_t *q, const float *s, int R, int C) {
    fp8_dequantize_1x128(F(x), q, s, R, C);
}
static void c_fp8_fake_quantize_rows(void *out, const void *x, const int *token_of_row, int R, int C) {
    uint8_t *q = mallocCheck((size_t)R * C + 1);
    float *s = mallocCheck((size_t)R * (C / 128) * sizeof(float) + 1);
    c_fp8_quantize_rows(q, s, x, token_of_row, R, C);
    fp8_dequantize_1x128(F(out), q, s, R, C);
    free(q);
    free(s);
}
static void c_fp8_pack_rows(void *p, const uint8_t *q, const float *s, int R, int C) { fp8_pack_rows(p, q, s, R, C); }
static void c_fp8_unpack_rows(uint8_t *q, float *s, const void *p, const int *src_row, int R, int C) {
    fp8_unpack_rows(q, s, p, src_row, R, C);
}
static void c_fp8_fake_quantize_tokens(void *x, const int *offsets, int E, int C) {
    fp8_fake_quantize_128x1(F(x), offsets, E, C);
}
static void c_fp8_grouped_matmul_forward(void *out, const uint8_t *qa, const float *sa, const uint8_t *qw, const float *sw,
                                  const int *offsets, int E, int C, int OC) {
    fp8_grouped_matmul_ref(F(out), qa, sa, qw, sw, offsets, E, C, OC);
}
static void c_fp8_quantize_rows_t(uint8_t *q, float *st, const void *x, int R, int C) {
    fp8_quantize_1x128_t(q, st, CF(x), R, C);
}
// the reference's FP32 product, added in FP32 where the output accumulates
static void c_fp8_matmul(void *out, const uint8_t *qa, const float *st, const uint8_t *qw, const float *sw, int N, int C,
                         int OC, int accumulate) {
    if (!accumulate) { fp8_matmul_ref(F(out), qa, st, qw, sw, N, C, OC); return; }
    float *y = mallocCheck((size_t)N * OC * sizeof(float) + 1);
    fp8_matmul_ref(y, qa, st, qw, sw, N, C, OC);
    float *o = F(out);
    for (size_t i = 0; i < (size_t)N * OC; i++) o[i] += y[i];
    free(y);
}
static void c_crossentropy_forward(float *losses, const void *logits, const int *targets, int N, int V) {
    cpu_crossentropy_forward(losses, CF(logits), targets, N, V);
}
static void c_crossentropy_backward(void *dlogits, const void *logits, const int *targets, float dloss, int N, int V) {
    cpu_crossentropy_backward(F(dlogits), CF(logits), targets, dloss, N, V);
}
static void c_crossentropy_fused(float *losses, void *dlogits, const void *logits, const int *targets, float dloss,
                                 int N, int V) {
    cpu_crossentropy_forward(losses, CF(logits), targets, N, V);
    cpu_crossentropy_backward(F(dlogits), CF(logits), targets, dloss, N, V);
}
static void c_loss_sum(double *acc, const float *losses, const int *targets, int N) {
    double s = 0;
    for (int n = 0; n < N; n++)
        if (targets[n] >= 0) s += losses[n];
    acc[0] += s;
}
static void c_add_act(void *y, const void *x, size_t n) { cpu_add_inplace(F(y), CF(x), n); }
static void c_sum_act(void *out, const void *a, const void *b, size_t n) {
    float *o = F(out);
    const float *x = CF(a), *y = CF(b);
    for (size_t i = 0; i < n; i++) o[i] = x[i] + y[i];
}
static void c_copy_act(void *dst, const void *src, size_t n) { cpu_copy(F(dst), CF(src), n); }
static void c_zero(void *x, size_t bytes) { memset(x, 0, bytes); }
static void c_adamw_update(float *p, void *p_act, const float *g, float *m, float *v, size_t n, float lr,
                           float beta1, float beta2, float eps, float wd, float grad_scale, int t) {
    cpu_adamw_update(p, g, m, v, n, lr, beta1, beta2, eps, wd, grad_scale, t);
    if (p_act && p_act != p) memcpy(p_act, p, n * sizeof(float));
}
// the reference of the fused op: the two ops in turn
static void c_adamw_update_fp8(float *p, const float *g, float *m, float *v, float lr, float beta1, float beta2,
                               float eps, float wd, float grad_scale, int t, uint8_t *qw, float *sw, uint8_t *qwt,
                               float *swt, int ldt, int col0, int E, int M, int K) {
    cpu_adamw_update(p, g, m, v, (size_t)E * M * K, lr, beta1, beta2, eps, wd, grad_scale, t);
    c_fp8_quantize_weights(qw, sw, qwt, swt, ldt, col0, p, E, M, K);
}
static void c_sum_squares(double *acc, const float *x, size_t n) { acc[0] += cpu_sum_squares(x, n); }
static void c_sum_f64(double *acc, const double *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += x[i];
    acc[0] += s;
}

const Ops ops_cpu = {
    .name = "cpu",
    .act_bytes = sizeof(float),
    .host_memory = 1,
    .alloc = c_alloc,
    .free = c_free,
    .to_device = c_copy,
    .to_host = c_copy,
    .alloc_host = c_alloc_host,
    .free_host = c_free_host,
    .cast_to_act = c_cast,
    .embedding_forward = c_embedding_forward,
    .embedding_backward = c_embedding_backward,
    .matmul_forward = c_matmul_forward,
    .matmul_backward = c_matmul_backward,
    .router_logits_forward = c_router_logits_forward,
    .router_logits_backward = c_router_logits_backward,
    .rmsnorm_forward = c_rmsnorm_forward,
    .rmsnorm_backward = c_rmsnorm_backward,
    .rope_forward = c_rope_forward,
    .rope_backward = c_rope_backward,
    .rmsnorm_rope_forward = c_rmsnorm_rope_forward,
    .rmsnorm_rope_backward = c_rmsnorm_rope_backward,
    .attention_forward = c_attention_forward,
    .attention_backward = c_attention_backward,
    .attention_saved_floats = cpu_attention_saved_floats,
    .attention_scratch_floats = cpu_attention_scratch_floats,
    .swiglu_forward = c_swiglu_forward,
    .swiglu_backward = c_swiglu_backward,
    .swiglu_forward_rows = c_swiglu_forward_rows,
    .swiglu_backward_rows = c_swiglu_backward_rows,
    .router_probs_forward = cpu_router_probs_forward,
    .router_probs_backward = cpu_router_probs_backward,
    .router_topk = c_router_topk,
    .router_weights_forward = cpu_router_weights_forward,
    .router_weights_backward = cpu_router_weights_backward,
    .router_count = cpu_router_count,
    .router_bias_update = cpu_router_bias_update,
    .lb_loss_forward = c_lb_loss_forward,
    .lb_loss_backward = cpu_lb_loss_backward,
    .zloss_forward = c_zloss_forward,
    .zloss_backward = cpu_zloss_backward,
    .moe_route_index = cpu_moe_route_index,
    .permute_forward = c_permute_forward,
    .permute_backward = c_permute_backward,
    .unpermute_forward = c_unpermute_forward,
    .unpermute_backward = c_unpermute_backward,
    .moe_capacity_drop = c_moe_capacity_drop,
    .moe_segment_sizes = c_moe_segment_sizes,
    .ep_sym_write_counts = ep_sym_cpu_write_counts,
    .ep_sym_plan = ep_sym_cpu_plan,
    .ep_sym_dispatch = ep_sym_cpu_dispatch,
    .ep_sym_combine = ep_sym_cpu_combine,
    .grouped_matmul_forward = c_grouped_matmul_forward,
    .grouped_matmul_backward = c_grouped_matmul_backward,
    .grouped_glu_forward = c_grouped_glu_forward,
    .grouped_wgrad_sumsq = c_grouped_wgrad_sumsq,
    .grouped_dgrad_pair = c_grouped_dgrad_pair,
    .fp8_quantize_weights = c_fp8_quantize_weights,
    .fp8_quantize_rows = c_fp8_quantize_rows,
    .fp8_swiglu_quantize = c_fp8_swiglu_quantize,
    .fp8_swiglu_backward_quantize = c_fp8_swiglu_backward_quantize,
    .fp8_unpermute_backward_quantize = c_fp8_unpermute_backward_quantize,
    .fp8_dequantize_rows = c_fp8_dequantize_rows,
    .fp8_fake_quantize_rows = c_fp8_fake_quantize_rows,
    .fp8_pack_rows = c_fp8_pack_rows,
    .fp8_unpack_rows = c_fp8_unpack_rows,
    .fp8_fake_quantize_tokens = c_fp8_fake_quantize_tokens,
    .fp8_grouped_matmul_forward = c_fp8_grouped_matmul_forward,
    .fp8_quantize_rows_t = c_fp8_quantize_rows_t,
    .fp8_matmul = c_fp8_matmul,
    .crossentropy_forward = c_crossentropy_forward,
    .crossentropy_backward = c_crossentropy_backward,
    .crossentropy_fused = c_crossentropy_fused,
    .loss_sum = c_loss_sum,
    .add_act = c_add_act,
    .sum_act = c_sum_act,
    .copy_act = c_copy_act,
    .add_f32 = cpu_add_inplace,
    .copy_f32 = cpu_copy,
    .zero = c_zero,
    .adamw_update = c_adamw_update,
    .adamw_update_fp8 = c_adamw_update_fp8,
    .sum_squares = c_sum_squares,
    .sum_f64 = c_sum_f64,
};

void rope_tables(float *cos_t, float *sin_t, int T, int hd, float theta) {
    int half = hd / 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double f = pow((double)theta, -2.0 * i / hd);
            cos_t[(size_t)t * half + i] = (float)cos(t * f);
            sin_t[(size_t)t * half + i] = (float)sin(t * f);
        }
}
