// The CUDA backend's launchers, one per op of src/ops/ops.h with the same
// signature and semantics (act = BF16, f32 = float, all device memory, all
// on cuda_stream()). ops_cuda_table.c gathers them into the ops_cuda table.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ops/cuda/cuda_settings.h"
#include "ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

// gemm.cu: cuBLASLt and the grouped GEMM
void cuda_matmul_forward(void *out, const void *inp, const void *w, int N, int C, int OC);
void cuda_matmul_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                          int N, int C, int OC, int accumulate);
void cuda_router_logits_forward(float *logits, const void *inp, const void *w, int N, int C, int E);
void cuda_router_logits_backward(void *dinp, float *dw, const float *dlogits, const void *inp,
                                 const void *w, int N, int C, int E);
void cuda_grouped_matmul_forward(void *out, const void *inp, const void *w, const int *offsets,
                                 int E, int C, int OC);
void cuda_grouped_matmul_backward(void *dinp, float *dw, const void *dout, const void *inp,
                                  const void *w, const int *offsets, int E, int C, int OC, int accumulate);
void cuda_grouped_dgrad_pair(void *dinp, const void *dout1, const void *w1, const void *dout2, const void *w2,
                             const int *offsets, int E, int C, int OC);
void cuda_grouped_glu_forward(void *g, void *u, void *a, const void *inp, const void *wg, const void *wu,
                              const int *offsets, int E, int C, int OC, int R);
void cuda_grouped_wgrad_sumsq(float *dw, double *sq, const void *dout, const void *inp, const int *offsets, int E,
                              int C, int OC, int accumulate);
// the slots of dw's sum of squares from dw in memory (all experts', or only_empty: those without rows)
void cuda_wgrad_sumsq_slots(const float *dw, double *sq, const int *offsets, int E, int C, int OC, int only_empty);

// attention.cu
void cuda_attention_forward(void *out, float *saved, const void *q, const void *k, const void *v,
                            const int *doc_start, int B, int T, int H, int KV, int hd);
void cuda_attention_backward(void *dq, void *dk, void *dv, const void *dout, const float *saved,
                             const void *q, const void *k, const void *v, const void *out,
                             const int *doc_start, float *scratch, int B, int T, int H, int KV, int hd);
size_t cuda_attention_saved_floats(int B, int T, int H, int hd);
size_t cuda_attention_scratch_floats(int B, int T, int H, int KV, int hd);

// elementwise.cu: cast, SwiGLU, add, copy
void cuda_cast_to_act(void *dst, const float *src, size_t n);
void cuda_swiglu_forward(void *out, const void *gate, const void *up, size_t n);
void cuda_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n);
void cuda_swiglu_forward_rows(void *out, const void *gate, const void *up, const int *rows, int max_rows, int F);
void cuda_swiglu_backward_rows(void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                               const int *rows, int max_rows, int F);
void cuda_add_act(void *y, const void *x, size_t n);
void cuda_sum_act(void *out, const void *a, const void *b, size_t n);
void cuda_copy_act(void *dst, const void *src, size_t n);
void cuda_add_f32(float *y, const float *x, size_t n);
void cuda_copy_f32(float *dst, const float *src, size_t n);

// rmsnorm.cu
void cuda_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *w, int N, int C, float eps);
void cuda_rmsnorm_rope_forward(void *out, float *rstd, void *tmp, const void *inp, const void *w, const float *cos_t,
                               const float *sin_t, int B, int T, int nh, int hd, int C, float eps);
void cuda_rmsnorm_rope_backward(void *dinp, float *dw, void *tmp, const void *dout, const void *inp, const void *w,
                                const float *rstd, const float *cos_t, const float *sin_t, int B, int T, int nh,
                                int hd, int C, int accumulate);
void cuda_rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                           const float *rstd, int N, int C, int accumulate);

// rope.cu
void cuda_rope_forward(void *out, const void *inp, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd);
void cuda_rope_backward(void *dinp, const void *dout, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd);

// router.cu: gate probabilities, top-k, gate weights, counts, load-balancing and z-loss
void cuda_router_probs_forward(float *probs, const float *logits, int N, int E, Gating g);
void cuda_router_probs_backward(float *dlogits, const float *dprobs, const float *probs, int N, int E,
                                Gating g, int accumulate);
void cuda_router_topk(int *idx, const float *probs, const float *bias, int N, int E, int k,
                      RoutingMode mode, const uint64_t *seed);
void cuda_router_weights_forward(float *weights, const float *probs, const int *idx, int N, int E, int k, int renorm);
void cuda_router_weights_backward(float *dprobs, const float *dweights, const float *probs, const int *idx,
                                  int N, int E, int k, int renorm, int accumulate);
void cuda_router_count(float *counts, const int *idx, int N, int E, int k);
void cuda_router_bias_update(float *bias, const float *counts, int L, int E, float rate);
void cuda_lb_loss_forward(float *out, const float *probs, const float *counts, float count_tokens,
                          int N, int E, int k, Gating g);
void cuda_lb_loss_backward(float *dprobs, const float *probs, const float *counts, float count_tokens,
                           int N, int E, int k, Gating g, float scale);
void cuda_zloss_forward(float *out, const float *logits, int N, int E);
void cuda_zloss_backward(float *dlogits, const float *logits, int N, int E, float scale);

// dispatch.cu: the MoE layer's row index, permute and unpermute; the embedding
void cuda_moe_route_index(int *offsets, int *row_of, int *token_of_row, const int *idx, int N, int E, int k);
void cuda_permute_forward(void *xp, const void *x, const int *token_of_row, int R, int C);
void cuda_permute_scatter(void *xp, const void *x, const int *row_of, int N, int k, int C);
void cuda_unpermute_residual(void *out, const void *res, const void *y, const float *weights, const int *row_of, int N,
                             int k, int C);
void cuda_permute_backward(void *dx, const void *dxp, const int *token_of_row, int N, int R, int C, int accumulate);
void cuda_unpermute_forward(void *out, const void *y, const float *weights, const int *row_of,
                            int N, int k, int C, int accumulate);
void cuda_unpermute_backward(void *dy, float *dweights, const void *dout, const void *y,
                             const float *weights, const int *row_of, int N, int k, int C);
void cuda_moe_capacity_drop(void *y, float *dropped, const int *offsets, int E, int R, int C, int capacity);
void cuda_moe_segment_sizes(int *sizes, const int *offsets, int E);
void cuda_embedding_forward(void *out, const int *tokens, const void *wte, int N, int C);
void cuda_embedding_backward(float *dwte, const void *dout, const int *tokens, int N, int C);

// loss.cu: cross-entropy and the loss sum
void cuda_crossentropy_forward(float *losses, const void *logits, const int *targets, int N, int V);
void cuda_crossentropy_backward(void *dlogits, const void *logits, const int *targets, float dloss, int N, int V);
void cuda_crossentropy_fused(float *losses, void *dlogits, const void *logits, const int *targets, float dloss, int N,
                             int V);
void cuda_loss_sum(double *acc, const float *losses, const int *targets, int N);

// optim.cu: AdamW and the sum of squares (gradient norm)
void cuda_adamw_update(float *p, void *p_act, const float *g, float *m, float *v, size_t n, float lr,
                       float beta1, float beta2, float eps, float wd, float grad_scale, int t);
void cuda_adamw_update_fp8(float *p, const float *g, float *m, float *v, float lr, float beta1, float beta2, float eps,
                           float wd, float grad_scale, int t, uint8_t *qw, float *sw, uint8_t *qwt, float *swt, int ldt,
                           int col0, int E, int M, int K);
void cuda_sum_squares(double *acc, const float *x, size_t n);
void cuda_sum_f64(double *acc, const double *x, size_t n);

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
extern "C" {
#endif
// The limits behind Ops.supports (ops_cuda_table.c): 1 when the kernels
// take the sizes, else 0 with the limit in why. No device is touched.
int cuda_attention_supports(int B, int T, int H, int KV, int hd, char *why, size_t whylen); // attention.cu
// The forward on the TMA + wgmma kernel (attention_wgmma.cu): 0 when it ran,
// -1 (nothing launched) for the cases it does not take.
int cuda_attention_forward_wgmma(void *out, float *lse2, const void *q, const void *k, const void *v,
                                 const int *doc_start, int B, int T, int H, int KV, int hd);
// The backward's dK/dV (+ dS^T into dsT, ds_head elements per head) and dQ
// kernels on TMA + wgmma, given D (attention_wgmma.cu): whether they take
// the shape, and the launch (0, or -1 with nothing launched).
int cuda_attention_backward_wgmma_takes(const int *doc_start, int B, int T, int H, int KV, int hd);
int cuda_attention_backward_wgmma(void *dq, void *dk, void *dv, void *dsT, const void *dout, const float *lse2,
                                  const float *D, const void *q, const void *k, const void *v, int B, int T, int H,
                                  size_t ds_head);
int cuda_grouped_supports(int E, int C, int OC, char *why, size_t whylen);                 // gemm.cu
// For benchmarks and tests only, not configuration: the grouped kernels'
// epilogue variant (0-CUDA_GROUPED_VARIANT_MAX of grouped_wgmma.cu's WS_*
// bits; -1: the default) and the streaming cross-entropy kernels instead of
// the shared-memory ones.
#define CUDA_GROUPED_VARIANT_MAX 2047
void cuda_grouped_set_variant(int v);         // grouped_wgmma.cu
void cuda_crossentropy_set_streaming(int on); // loss.cu
int cuda_router_supports(int E, int k, int routing, char *why, size_t whylen);             // router.cu
int cuda_supports(const OpDesc *d, char *why, size_t whylen);                              // ops_cuda_table.c
// gemm_fp8.cu: the dense GEMMs in FP8 (cuBLASLt block scaling) and their quantiser
int cuda_fp8_dense_supports(int N, int C, int OC, char *why, size_t whylen);
void cuda_fp8_quantize_rows_t_op(uint8_t *q, float *st, const void *x, int R, int C);
void cuda_fp8_matmul_op(void *out, const uint8_t *qa, const float *st, const uint8_t *qw, const float *sw, int N, int C,
                        int OC, int accumulate);
int cuda_fp8_quantize_rows_t(uint8_t *q, float *st, const void *x, int R, int C);
void cuda_fp8_dense_probe(int N, int C, int OC, char *out, size_t len);
int cuda_fp8_dense_matmul(void *out, const uint8_t *qa, const float *st, const uint8_t *qw, const float *sw, int N, int C,
                          int OC, int accumulate);

// fp8.cu: the FP8 entries of the op table (ops.h) and the sizes they take
int cuda_fp8_supports(int E, int C, int OC, char *why, size_t whylen);
void cuda_fp8_quantize_weights(uint8_t *qw, float *sw, uint8_t *qwt, float *swt, int ldt, int col0, const float *w,
                               int E, int M, int K);
void cuda_fp8_quantize_rows(uint8_t *q, float *s, const void *x, const int *token_of_row, int R, int C);
void cuda_fp8_unpermute_backward_quantize(void *dy, float *dweights, uint8_t *q, float *s, const void *dout,
                                          const void *y, const float *weights, const int *row_of, int N, int k, int C);
void cuda_fp8_swiglu_quantize(uint8_t *q, float *s, const void *gate, const void *up, int R, int F);
void cuda_fp8_swiglu_backward_quantize(void *dgate, void *dup, uint8_t *q, float *s, const void *dout, const void *gate,
                                       const void *up, int R, int F);
void cuda_fp8_fake_quantize_tokens(void *x, const int *offsets, int E, int C);
int cuda_fp8_wgrad_supports(int E, int C, int OC, char *why, size_t whylen);
void cuda_fp8_quantize_tokens_t_op(uint8_t *qt, float *st, const void *x, const int *offsets, int E, int C, int ldk);
void cuda_fp8_requantize_tokens_t_op(uint8_t *qt, float *st, const uint8_t *q, const float *s, const int *offsets, int E,
                                     int C, int ldk);
void cuda_fp8_grouped_wgrad_op(float *dw, const uint8_t *qa, const float *sa, const uint8_t *qb, const float *sb,
                               const int *offsets, int E, int C, int OC, int ldk, int accumulate);
void cuda_fp8_dequantize_rows(void *x, const uint8_t *q, const float *s, int R, int C);
void cuda_fp8_fake_quantize_rows(void *out, const void *x, const int *token_of_row, int R, int C);
void cuda_fp8_grouped_matmul_forward(void *out, const uint8_t *qa, const float *sa, const uint8_t *qw, const float *sw,
                                 const int *offsets, int E, int C, int OC);
// fp8_payload.cu: the FP8 dispatch payload's entries
void cuda_fp8_pack_rows(void *payload, const uint8_t *q, const float *s, int R, int C);
void cuda_fp8_unpack_rows(uint8_t *q, float *s, const void *payload, const int *src_row, int R, int C);
#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
extern "C" {
#endif
// ops_cuda.cu: the kernel choices (read at each op, so tests may switch
// between calls; attention_ds_mib must not change after the attention
// scratch was sized with it), memory and the stream
void cuda_configure(const CudaSettings *s);
const CudaSettings *cuda_settings(void);
// What the run's records name: the device, its compute capability, the
// kernel driver's version (from /proc/driver/nvidia/version, "?" if absent)
// and the CUDA driver API and runtime versions (1000 major + 10 minor).
typedef struct {
    char name[256];
    int cc_major, cc_minor, sms;
    double memory_gib;
    char driver[64];
    int driver_api, runtime;
} CudaDeviceInfo;
void cuda_device_info(CudaDeviceInfo *d);
void *cuda_alloc(size_t bytes);
void cuda_free(void *p);
void *cuda_alloc_host(size_t bytes);   // page-locked (cudaHostAlloc), zero-filled
void cuda_free_host(void *p);
void cuda_to_device(void *dst, const void *src, size_t bytes);
void cuda_to_host(void *dst, const void *src, size_t bytes);
void cuda_zero(void *p, size_t bytes);
void cuda_synchronize(void);
size_t cuda_device_memory_used(void);
size_t cuda_device_memory_free(void);
#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
extern "C" {
#endif
// CUDA graphs of work on cuda_stream(): capture_end returns NULL (and the
// reason in err) when the captured work was invalid, e.g. because it
// synchronised with the host.
void cuda_capture_begin(void);
void *cuda_capture_end(char *err, size_t errlen);
void cuda_graph_launch(void *exec);
void cuda_graph_free(void *exec);
// Milliseconds between two points on the stream (events), for benchmarks.
void *cuda_event_record(void);
float cuda_event_elapsed_ms(void *start, void *stop);
#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
extern "C" {
#endif
// ops_cuda_prof.c: ops_cuda with CUDA events around every compute op, for
// `moecore bench --breakdown` (no graph hooks: the step runs uncaptured).
// ops_timed_reset drops what was timed so far; ops_timed_report prints the
// GPU time per op and per class of op, per step, against step_ms, the
// caller's mean wall time of the `steps` steps timed.
extern const Ops ops_cuda_timed;
void ops_timed_reset(void);
void ops_timed_report(FILE *f, int steps, double step_ms);
#ifdef __cplusplus
}
#endif
