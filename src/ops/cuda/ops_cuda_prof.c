// ops_cuda_timed: the ops_cuda table with every compute op bracketed by two
// CUDA events on the backend stream, for `moecore bench --breakdown` (time
// per op and per class of op over whole training steps).
//
// The events are recorded into a pool and read only at flush points: when
// the pool is full, when the trainer copies to the host (to_host waits for
// the device anyway, so reading the events then adds no extra wait) and in
// ops_timed_reset / ops_timed_report. The graph hooks are NULL, so the
// trainer runs the step uncaptured: events inside a graph would not time
// the ops one by one. Each op's time is from its start event to its stop
// event on the GPU: when the host cannot keep the GPU busy, it includes the
// op's own launch cost; the gaps between ops show as the report's remainder.
#ifdef MOECORE_CUDA
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops/cuda/ops_cuda.h"
#include "ops/ep_sym.h"

cudaStream_t cuda_stream(void); // ops_cuda.cu (declared for C++ in cuda_common.cuh)

static void check(cudaError_t e, const char *call, int line) {
    if (e != cudaSuccess) {
        fprintf(stderr, "moecore: CUDA error %s in %s at %s:%d\n", cudaGetErrorString(e), call, __FILE__, line);
        exit(3);
    }
}
#define CHECK(call) check((call), #call, __LINE__)

// Every timed op once: X(name, class, (parameters), (arguments)). The list
// makes the op ids, the name table, the wrappers and the table entries, so
// an op cannot be in one and missing from another.
enum { C_EXPERT, C_DENSE, C_ATTN, C_OPTIM, C_DISPATCH, C_OTHER, N_CLASSES };
static const char *class_names[N_CLASSES] = {"expert GEMMs", "dense GEMMs", "attention",
                                             "optimizer", "MoE dispatch", "other elementwise"};
#define TIMED_OPS(X)                                                                                         \
    X(cast_to_act, C_OTHER, (void *dst, const float *src, size_t n), (dst, src, n))                          \
    X(embedding_forward, C_OTHER, (void *out, const int *tokens, const void *wte, int N, int C),             \
      (out, tokens, wte, N, C))                                                                              \
    X(embedding_backward, C_OTHER, (float *dwte, const void *dout, const int *tokens, int N, int C),         \
      (dwte, dout, tokens, N, C))                                                                            \
    X(matmul_forward, C_DENSE, (void *out, const void *inp, const void *w, int N, int C, int OC),            \
      (out, inp, w, N, C, OC))                                                                               \
    X(matmul_backward, C_DENSE,                                                                              \
      (void *dinp, float *dw, const void *dout, const void *inp, const void *w, int N, int C, int OC,        \
       int accumulate),                                                                                      \
      (dinp, dw, dout, inp, w, N, C, OC, accumulate))                                                        \
    X(router_logits_forward, C_DENSE, (float *logits, const void *inp, const void *w, int N, int C, int E),  \
      (logits, inp, w, N, C, E))                                                                             \
    X(router_logits_backward, C_DENSE,                                                                       \
      (void *dinp, float *dw, const float *dlogits, const void *inp, const void *w, int N, int C, int E),    \
      (dinp, dw, dlogits, inp, w, N, C, E))                                                                  \
    X(rmsnorm_forward, C_OTHER,                                                                              \
      (void *out, float *rstd, const void *inp, const void *w, int N, int C, float eps),                     \
      (out, rstd, inp, w, N, C, eps))                                                                        \
    X(rmsnorm_backward, C_OTHER,                                                                             \
      (void *dinp, float *dw, const void *dout, const void *inp, const void *w, const float *rstd, int N,    \
       int C, int accumulate),                                                                               \
      (dinp, dw, dout, inp, w, rstd, N, C, accumulate))                                                      \
    X(rope_forward, C_OTHER,                                                                                 \
      (void *out, const void *inp, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd),    \
      (out, inp, cos_t, sin_t, B, T, nh, hd))                                                                \
    X(rope_backward, C_OTHER,                                                                                \
      (void *dinp, const void *dout, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd),  \
      (dinp, dout, cos_t, sin_t, B, T, nh, hd))                                                              \
    X(rmsnorm_rope_forward, C_OTHER,                                                                         \
      (void *out, float *rstd, void *tmp, const void *inp, const void *w, const float *cos_t, const float *sin_t, \
       int B, int T, int nh, int hd, int C, float eps),                                                      \
      (out, rstd, tmp, inp, w, cos_t, sin_t, B, T, nh, hd, C, eps))                                          \
    X(rmsnorm_rope_backward, C_OTHER,                                                                        \
      (void *dinp, float *dw, void *tmp, const void *dout, const void *inp, const void *w, const float *rstd, \
       const float *cos_t, const float *sin_t, int B, int T, int nh, int hd, int C, int accumulate),          \
      (dinp, dw, tmp, dout, inp, w, rstd, cos_t, sin_t, B, T, nh, hd, C, accumulate))                        \
    X(attention_forward, C_ATTN,                                                                             \
      (void *out, float *saved, const void *q, const void *k, const void *v, const int *doc_start, int B,    \
       int T, int H, int KV, int hd),                                                                        \
      (out, saved, q, k, v, doc_start, B, T, H, KV, hd))                                                     \
    X(attention_backward, C_ATTN,                                                                            \
      (void *dq, void *dk, void *dv, const void *dout, const float *saved, const void *q, const void *k,     \
       const void *v, const void *out, const int *doc_start, float *scratch, int B, int T, int H, int KV,    \
       int hd),                                                                                              \
      (dq, dk, dv, dout, saved, q, k, v, out, doc_start, scratch, B, T, H, KV, hd))                          \
    X(swiglu_forward, C_OTHER, (void *out, const void *gate, const void *up, size_t n), (out, gate, up, n))  \
    X(swiglu_backward, C_OTHER,                                                                              \
      (void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n),                \
      (dgate, dup, dout, gate, up, n))                                                                       \
    X(swiglu_forward_rows, C_OTHER,                                                                          \
      (void *out, const void *gate, const void *up, const int *rows, int max_rows, int F),                   \
      (out, gate, up, rows, max_rows, F))                                                                    \
    X(swiglu_backward_rows, C_OTHER,                                                                         \
      (void *dgate, void *dup, const void *dout, const void *gate, const void *up, const int *rows,          \
       int max_rows, int F),                                                                                 \
      (dgate, dup, dout, gate, up, rows, max_rows, F))                                                       \
    X(router_probs_forward, C_DISPATCH, (float *probs, const float *logits, int N, int E, Gating g),         \
      (probs, logits, N, E, g))                                                                              \
    X(router_probs_backward, C_DISPATCH,                                                                     \
      (float *dlogits, const float *dprobs, const float *probs, int N, int E, Gating g, int accumulate),     \
      (dlogits, dprobs, probs, N, E, g, accumulate))                                                         \
    X(router_topk, C_DISPATCH,                                                                               \
      (int *idx, const float *probs, const float *bias, int N, int E, int k, RoutingMode mode,               \
       const uint64_t *seed),                                                                                \
      (idx, probs, bias, N, E, k, mode, seed))                                                               \
    X(router_weights_forward, C_DISPATCH,                                                                    \
      (float *weights, const float *probs, const int *idx, int N, int E, int k, int renorm),                 \
      (weights, probs, idx, N, E, k, renorm))                                                                \
    X(router_weights_backward, C_DISPATCH,                                                                   \
      (float *dprobs, const float *dweights, const float *probs, const int *idx, int N, int E, int k,        \
       int renorm, int accumulate),                                                                          \
      (dprobs, dweights, probs, idx, N, E, k, renorm, accumulate))                                           \
    X(router_count, C_DISPATCH, (float *counts, const int *idx, int N, int E, int k), (counts, idx, N, E, k)) \
    X(router_bias_update, C_OTHER, (float *bias, const float *counts, int L, int E, float rate),             \
      (bias, counts, L, E, rate))                                                                            \
    X(lb_loss_forward, C_DISPATCH,                                                                           \
      (float *out, const float *probs, const float *counts, float count_tokens, int N, int E, int k,         \
       Gating g),                                                                                            \
      (out, probs, counts, count_tokens, N, E, k, g))                                                        \
    X(lb_loss_backward, C_DISPATCH,                                                                          \
      (float *dprobs, const float *probs, const float *counts, float count_tokens, int N, int E, int k,       \
       Gating g, float scale),                                                                               \
      (dprobs, probs, counts, count_tokens, N, E, k, g, scale))                                              \
    X(zloss_forward, C_DISPATCH, (float *out, const float *logits, int N, int E), (out, logits, N, E))       \
    X(zloss_backward, C_DISPATCH, (float *dlogits, const float *logits, int N, int E, float scale),          \
      (dlogits, logits, N, E, scale))                                                                        \
    X(moe_route_index, C_DISPATCH,                                                                           \
      (int *offsets, int *row_of, int *token_of_row, const int *idx, int N, int E, int k),                   \
      (offsets, row_of, token_of_row, idx, N, E, k))                                                         \
    X(permute_forward, C_DISPATCH, (void *xp, const void *x, const int *token_of_row, int R, int C),         \
      (xp, x, token_of_row, R, C))                                                                           \
    X(permute_scatter, C_DISPATCH, (void *xp, const void *x, const int *row_of, int N, int k, int C),        \
      (xp, x, row_of, N, k, C))                                                                              \
    X(permute_backward, C_DISPATCH,                                                                          \
      (void *dx, const void *dxp, const int *token_of_row, int N, int R, int C, int accumulate),             \
      (dx, dxp, token_of_row, N, R, C, accumulate))                                                          \
    X(unpermute_forward, C_DISPATCH,                                                                         \
      (void *out, const void *y, const float *weights, const int *row_of, int N, int k, int C,               \
       int accumulate),                                                                                      \
      (out, y, weights, row_of, N, k, C, accumulate))                                                        \
    X(unpermute_residual, C_DISPATCH,                                                                        \
      (void *out, const void *res, const void *y, const float *weights, const int *row_of, int N, int k,     \
       int C),                                                                                               \
      (out, res, y, weights, row_of, N, k, C))                                                               \
    X(unpermute_backward, C_DISPATCH,                                                                        \
      (void *dy, float *dweights, const void *dout, const void *y, const float *weights, const int *row_of,  \
       int N, int k, int C),                                                                                 \
      (dy, dweights, dout, y, weights, row_of, N, k, C))                                                     \
    X(moe_capacity_drop, C_DISPATCH,                                                                         \
      (void *y, float *dropped, const int *offsets, int E, int R, int C, int capacity),                      \
      (y, dropped, offsets, E, R, C, capacity))                                                              \
    X(moe_segment_sizes, C_DISPATCH, (int *sizes, const int *offsets, int E), (sizes, offsets, E))           \
    X(ep_sym_write_counts, C_DISPATCH, (int *const *windows, const int *offsets, int P, int rank, int E),    \
      (windows, offsets, P, rank, E))                                                                        \
    X(ep_sym_plan, C_DISPATCH,                                                                               \
      (int *plan, float *dropped, const int *counts, int P, int rank, int E, int capacity, int max_rows),    \
      (plan, dropped, counts, P, rank, E, capacity, max_rows))                                               \
    X(ep_sym_dispatch, C_DISPATCH,                                                                           \
      (void *const *recv, const int *plan, const int *offsets, const void *xp, int P, int E, int R, int C),  \
      (recv, plan, offsets, xp, P, E, R, C))                                                                 \
    X(ep_sym_combine, C_DISPATCH,                                                                            \
      (void *y, void *const *out, const int *plan, const int *offsets, int P, int E, int R, int C),          \
      (y, out, plan, offsets, P, E, R, C))                                                                   \
    X(grouped_matmul_forward, C_EXPERT,                                                                      \
      (void *out, const void *inp, const void *w, const int *offsets, int E, int C, int OC),                 \
      (out, inp, w, offsets, E, C, OC))                                                                      \
    X(grouped_matmul_backward, C_EXPERT,                                                                     \
      (void *dinp, float *dw, const void *dout, const void *inp, const void *w, const int *offsets, int E,   \
       int C, int OC, int accumulate),                                                                       \
      (dinp, dw, dout, inp, w, offsets, E, C, OC, accumulate))                                               \
    X(grouped_glu_forward, C_EXPERT,                                                                         \
      (void *g, void *u, void *a, const void *inp, const void *wg, const void *wu, const int *offsets, int E,  \
       int C, int OC, int R),                                                                                \
      (g, u, a, inp, wg, wu, offsets, E, C, OC, R))                                                          \
    X(grouped_wgrad_sumsq, C_EXPERT,                                                                         \
      (float *dw, double *slots, const void *dout, const void *inp, const int *offsets, int E, int C, int OC,  \
       int accumulate),                                                                                      \
      (dw, slots, dout, inp, offsets, E, C, OC, accumulate))                                                 \
    X(grouped_dgrad_pair, C_EXPERT,                                                                          \
      (void *dinp, const void *dout1, const void *w1, const void *dout2, const void *w2, const int *offsets,  \
       int E, int C, int OC),                                                                                \
      (dinp, dout1, w1, dout2, w2, offsets, E, C, OC))                                                       \
    X(fp8_quantize_weights, C_OPTIM,                                                                         \
      (uint8_t *qw, float *sw, uint8_t *qwt, float *swt, int ldt, int col0, const float *w, int E, int M,     \
       int K),                                                                                               \
      (qw, sw, qwt, swt, ldt, col0, w, E, M, K))                                                             \
    X(fp8_quantize_rows, C_DISPATCH,                                                                         \
      (uint8_t *q, float *s, const void *x, const int *token_of_row, int R, int C),                          \
      (q, s, x, token_of_row, R, C))                                                                         \
    X(fp8_swiglu_quantize, C_OTHER, (uint8_t *q, float *s, const void *gate, const void *up, int R, int F),  \
      (q, s, gate, up, R, F))                                                                                \
    X(fp8_swiglu_backward_quantize, C_OTHER,                                                                 \
      (void *dgate, void *dup, uint8_t *q, float *s, const void *dout, const void *gate, const void *up,     \
       int R, int F),                                                                                        \
      (dgate, dup, q, s, dout, gate, up, R, F))                                                              \
    X(fp8_unpermute_backward_quantize, C_DISPATCH,                                                           \
      (void *dy, float *dweights, uint8_t *q, float *s, const void *dout, const void *y, const float *weights, \
       const int *row_of, int N, int k, int C),                                                              \
      (dy, dweights, q, s, dout, y, weights, row_of, N, k, C))                                               \
    X(fp8_dequantize_rows, C_OTHER, (void *x, const uint8_t *q, const float *s, int R, int C),               \
      (x, q, s, R, C))                                                                                       \
    X(fp8_fake_quantize_rows, C_DISPATCH, (void *out, const void *x, const int *token_of_row, int R, int C),  \
      (out, x, token_of_row, R, C))                                                                          \
    X(fp8_pack_rows, C_DISPATCH, (void *p, const uint8_t *q, const float *s, int R, int C), (p, q, s, R, C))     \
    X(fp8_unpack_rows, C_DISPATCH, (uint8_t *q, float *s, const void *p, const int *src_row, int R, int C),    \
      (q, s, p, src_row, R, C))                                                                              \
    X(fp8_fake_quantize_tokens, C_OTHER, (void *x, const int *offsets, int E, int C), (x, offsets, E, C))     \
    X(fp8_quantize_tokens_t, C_OTHER,                                                                        \
      (uint8_t *qt, float *st, const void *x, const int *offsets, int E, int C, int ldk),                    \
      (qt, st, x, offsets, E, C, ldk))                                                                       \
    X(fp8_requantize_tokens_t, C_OTHER,                                                                      \
      (uint8_t *qt, float *st, const uint8_t *q, const float *s, const int *offsets, int E, int C, int ldk),  \
      (qt, st, q, s, offsets, E, C, ldk))                                                                    \
    X(fp8_grouped_wgrad, C_EXPERT,                                                                           \
      (float *dw, const uint8_t *qa, const float *sa, const uint8_t *qb, const float *sb, const int *offsets, \
       int E, int C, int OC, int ldk, int accumulate),                                                       \
      (dw, qa, sa, qb, sb, offsets, E, C, OC, ldk, accumulate))                                              \
    X(fp8_grouped_matmul_forward, C_EXPERT,                                                                         \
      (void *out, const uint8_t *qa, const float *sa, const uint8_t *qw, const float *sw, const int *offsets, \
       int E, int C, int OC),                                                                                \
      (out, qa, sa, qw, sw, offsets, E, C, OC))                                                              \
    X(fp8_quantize_rows_t, C_OTHER, (uint8_t *q, float *st, const void *x, int R, int C), (q, st, x, R, C))      \
    X(fp8_matmul, C_DENSE,                                                                                   \
      (void *out, const uint8_t *qa, const float *st, const uint8_t *qw, const float *sw, int N, int C, int OC, \
       int accumulate),                                                                                      \
      (out, qa, st, qw, sw, N, C, OC, accumulate))                                                           \
    X(crossentropy_forward, C_OTHER, (float *losses, const void *logits, const int *targets, int N, int V),  \
      (losses, logits, targets, N, V))                                                                       \
    X(crossentropy_backward, C_OTHER,                                                                        \
      (void *dlogits, const void *logits, const int *targets, float dloss, int N, int V),                    \
      (dlogits, logits, targets, dloss, N, V))                                                               \
    X(crossentropy_fused, C_OTHER,                                                                           \
      (float *losses, void *dlogits, const void *logits, const int *targets, float dloss, int N, int V),     \
      (losses, dlogits, logits, targets, dloss, N, V))                                                       \
    X(loss_sum, C_OTHER, (double *acc, const float *losses, const int *targets, int N),                      \
      (acc, losses, targets, N))                                                                             \
    X(add_act, C_OTHER, (void *y, const void *x, size_t n), (y, x, n))                                       \
    X(sum_act, C_OTHER, (void *out, const void *a, const void *b, size_t n), (out, a, b, n))                 \
    X(copy_act, C_OTHER, (void *dst, const void *src, size_t n), (dst, src, n))                              \
    X(add_f32, C_OTHER, (float *y, const float *x, size_t n), (y, x, n))                                     \
    X(copy_f32, C_OTHER, (float *dst, const float *src, size_t n), (dst, src, n))                            \
    X(zero, C_OPTIM, (void *x, size_t bytes), (x, bytes))                                                    \
    X(adamw_update, C_OPTIM,                                                                                 \
      (float *p, void *p_act, const float *g, float *m, float *v, size_t n, float lr, float beta1,           \
       float beta2, float eps, float wd, float grad_scale, int t),                                           \
      (p, p_act, g, m, v, n, lr, beta1, beta2, eps, wd, grad_scale, t))                                      \
    X(adamw_update_fp8, C_OPTIM,                                                                             \
      (float *p, const float *g, float *m, float *v, float lr, float beta1, float beta2, float eps, float wd, \
       float grad_scale, int t, uint8_t *qw, float *sw, uint8_t *qwt, float *swt, int ldt, int col0, int E,   \
       int M, int K),                                                                                        \
      (p, g, m, v, lr, beta1, beta2, eps, wd, grad_scale, t, qw, sw, qwt, swt, ldt, col0, E, M, K))          \
    X(sum_squares, C_OPTIM, (double *acc, const float *x, size_t n), (acc, x, n))                            \
    X(sum_f64, C_OPTIM, (double *acc, const double *x, size_t n), (acc, x, n))

#define OP_ID(name, cls, params, args) OP_##name,
enum { TIMED_OPS(OP_ID) N_OPS };
#define OP_NAME(name, cls, params, args) #name,
static const char *op_names[N_OPS] = {TIMED_OPS(OP_NAME)};
#define OP_CLASS(name, cls, params, args) cls,
static const int op_class[N_OPS] = {TIMED_OPS(OP_CLASS)};

// The pool: pair i is (ev_start[i], ev_stop[i]) around one call of op
// ev_op[i]. Events are created on first use and kept for the life of the
// process (bench runs several configs in one process).
#define POOL (1 << 16)
static cudaEvent_t ev_start[POOL], ev_stop[POOL];
static int ev_op[POOL];
static int n_pending, n_created;
static double total_ms[N_OPS];
static long long calls[N_OPS];

// Reads every pending pair into the totals. The stream runs in order, so
// once the last stop event has completed, every earlier event has too.
static void flush(void) {
    if (!n_pending) return;
    CHECK(cudaEventSynchronize(ev_stop[n_pending - 1]));
    for (int i = 0; i < n_pending; i++) {
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, ev_start[i], ev_stop[i]));
        total_ms[ev_op[i]] += ms;
        calls[ev_op[i]]++;
    }
    n_pending = 0;
}

// Start event of the next pair; the pair counts only once timed_end has
// recorded its stop (no op calls another through the table, so the two
// never interleave).
static void timed_begin(void) {
    if (n_pending == POOL) flush();
    if (n_pending == n_created) {
        CHECK(cudaEventCreate(&ev_start[n_created]));
        CHECK(cudaEventCreate(&ev_stop[n_created]));
        n_created++;
    }
    CHECK(cudaEventRecord(ev_start[n_pending], cuda_stream()));
}
static void timed_end(int op) {
    CHECK(cudaEventRecord(ev_stop[n_pending], cuda_stream()));
    ev_op[n_pending++] = op;
}

// The ops whose CUDA functions carry an _op suffix (fp8_cuda.h has the
// unsuffixed ones, which return a status).
#define cuda_fp8_quantize_tokens_t cuda_fp8_quantize_tokens_t_op
#define cuda_fp8_requantize_tokens_t cuda_fp8_requantize_tokens_t_op
#define cuda_fp8_grouped_wgrad cuda_fp8_grouped_wgrad_op
#define cuda_fp8_quantize_rows_t cuda_fp8_quantize_rows_t_op
#define cuda_fp8_matmul cuda_fp8_matmul_op
#define OP_WRAPPER(name, cls, params, args) \
    static void timed_##name params { timed_begin(); cuda_##name args; timed_end(OP_##name); }
TIMED_OPS(OP_WRAPPER)

// to_host has waited for the stream: a good moment to read the events.
static void timed_to_host(void *dst, const void *src, size_t bytes) {
    cuda_to_host(dst, src, bytes);
    flush();
}

#define OP_ENTRY(name, cls, params, args) .name = timed_##name,
const Ops ops_cuda_timed = {
    .name = "cuda",
    .supports = cuda_supports,
    .act_bytes = 2, // BF16
    .alloc = cuda_alloc,
    .free = cuda_free,
    .to_device = cuda_to_device,
    .alloc_host = cuda_alloc_host,
    .free_host = cuda_free_host,
    .to_host = timed_to_host,
    .device_memory_used = cuda_device_memory_used,
    .device_memory_free = cuda_device_memory_free,
    .synchronize = cuda_synchronize,
    // capture_begin, capture_end, graph_launch, graph_free: NULL, no graphs
    .attention_saved_floats = cuda_attention_saved_floats,
    .attention_scratch_floats = cuda_attention_scratch_floats,
    TIMED_OPS(OP_ENTRY)
};

void ops_timed_reset(void) {
    flush();
    for (int i = 0; i < N_OPS; i++) { total_ms[i] = 0; calls[i] = 0; }
}

static int by_time_desc(const void *a, const void *b) {
    double x = total_ms[*(const int *)a], y = total_ms[*(const int *)b];
    return (x < y) - (x > y);
}

void ops_timed_report(FILE *f, int steps, double step_ms) {
    flush();
    if (steps <= 0) { fprintf(f, "op breakdown: no steps timed\n"); return; }
    int order[N_OPS];
    double sum = 0, cls_ms[N_CLASSES] = {0};
    for (int i = 0; i < N_OPS; i++) {
        order[i] = i;
        sum += total_ms[i];
        cls_ms[op_class[i]] += total_ms[i];
    }
    qsort(order, N_OPS, sizeof order[0], by_time_desc);
    double pct = step_ms > 0 ? 100 / step_ms : 0; // % of the step per ms of a step
    fprintf(f, "\nGPU time per op (CUDA events around each op, no CUDA graph) over %d steps, mean wall time %.3f ms\n",
            steps, step_ms);
    fprintf(f, "%-26s %11s %11s %10s\n", "op", "calls/step", "ms/step", "% of step");
    for (int j = 0; j < N_OPS; j++) {
        int i = order[j];
        if (!calls[i]) continue;
        fprintf(f, "%-26s %11.1f %11.3f %9.1f%%\n", op_names[i], (double)calls[i] / steps, total_ms[i] / steps,
                total_ms[i] / steps * pct);
    }
    fprintf(f, "%-26s %11s %11.3f %9.1f%%\n", "sum of ops", "", sum / steps, sum / steps * pct);
    fprintf(f, "%-26s %11s %11.3f %9.1f%%\n", "remainder (host, idle GPU)", "", step_ms - sum / steps,
            (step_ms - sum / steps) * pct);
    fprintf(f, "\n%-26s %11s %10s\n", "class", "ms/step", "% of step");
    for (int c = 0; c < N_CLASSES; c++)
        fprintf(f, "%-26s %11.3f %9.1f%%\n", class_names[c], cls_ms[c] / steps, cls_ms[c] / steps * pct);
    fflush(f);
}
#endif
