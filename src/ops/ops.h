// The op interface: every computation the model performs, forward and
// backward, as plain functions behind one table per device (ggml's seam,
// llm.c's function shapes). src/model/ calls only these, so a backend is
// complete when it fills this table; tests/test_ops_grad.c checks every
// backward here against finite differences on the CPU backend.
//
// Buffers live in the backend's memory (host memory on CPU, device memory
// on CUDA) and come from its alloc. They hold one of three element types:
//   act  void *   activations and compute weights, in the backend's compute
//                 dtype (act_bytes per element: FP32 on CPU, BF16 on CUDA)
//   f32  float *  parameter grads, master weights, optimizer state, router
//                 logits / probabilities / weights, rstd, per-token losses
//   i32  int *    token ids, expert choices, offsets and row maps
// Scalars a step produces (losses, sums of squares) are accumulated into
// backend buffers (`double *acc`), so nothing waits for the device until
// the host copies them with to_host.
//
// Conventions
// - Matrices are row-major, weights [out, in]; y = x W^T.
// - Parameter grads (f32) accumulate (+=), except grouped_matmul_backward's
//   dw with accumulate = 0 (the expert grads of a step's first backward).
// - Activation grads assign, unless the op takes `accumulate`, in which case
//   accumulate != 0 means += (used on the residual stream and where several
//   paths meet).
// - Token counts N, rows R, channels C etc. are int; sizes that can exceed
//   2^31 are size_t.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum { GATING_SOFTMAX = 0, GATING_SIGMOID = 1 } Gating;
typedef enum { ROUTING_LEARNED = 0, ROUTING_RANDOM = 1, ROUTING_UNIFORM = 2 } RoutingMode;

// A question put to a backend before a run (ggml's supports_op): can it run
// this op on these sizes? The model lists the ops of a config with their
// sizes (model_check_backend); fields an op does not use are 0.
typedef enum {
    OP_ATTENTION,       // B, T, H, KV, hd
    OP_GROUPED_MATMUL,  // E (experts on this rank), C, OC: forward and backward, and the gate/up pair
    OP_ROUTER,          // N, E, k, routing (RoutingMode): probs, top-k, weights, counts, LB and z losses
    OP_FP8_GROUPED,     // E, C, OC: the FP8 grouped forward and its quantisers (train.precision: fp8)
    OP_FP8_WGRAD,       // E, C, OC: the FP8 grouped weight-grad (fp8.wgrad: fp8; else the fake quantiser + BF16)
    OP_FP8_DENSE,       // N, C, OC: fp8_matmul forward (out[N,OC]) and its data-grad (out[N,C]) (fp8.gemms: experts_dense)
} OpKind;
typedef struct {
    OpKind op;
    int B, T, H, KV, hd;
    int N, E, k, routing;
    int C, OC;
} OpDesc;

typedef struct Ops {
    const char *name;
    // 1 when this backend runs d; else 0 with the limit it hits in why.
    // NULL: every op at every size (the CPU).
    int (*supports)(const OpDesc *d, char *why, size_t whylen);
    size_t act_bytes;  // bytes per act element
    int host_memory;   // buffers are host memory (the host may read them directly)

    // --- memory -------------------------------------------------------------
    void *(*alloc)(size_t bytes);                                 // zero-filled
    void (*free)(void *p);
    void (*to_device)(void *dst, const void *host_src, size_t bytes);
    void (*to_host)(void *host_dst, const void *src, size_t bytes); // waits for the device
    // Host memory for staging copies to and from the device (checkpoints):
    // page-locked on CUDA, so that copies run at full speed; plain zero-filled
    // memory on the CPU.
    void *(*alloc_host)(size_t bytes);
    void (*free_host)(void *p);
    // bytes of device memory in use (NULL on the CPU)
    size_t (*device_memory_used)(void);
    size_t (*device_memory_free)(void);  // bytes the device has free (NULL on the CPU)
    // waits until the device has done the work issued so far (NULL on the
    // CPU, whose ops are done when they return)
    void (*synchronize)(void);
    // Graphs of the work issued between capture_begin and capture_end (NULL
    // on the CPU). capture_end returns NULL, with the reason in err, when the
    // work could not be captured (a host synchronisation inside, say).
    void (*capture_begin)(void);
    void *(*capture_end)(char *err, size_t errlen);
    void (*graph_launch)(void *graph);
    void (*graph_free)(void *graph);
    // compute weights from FP32 master weights (CPU: the same buffer, no-op)
    void (*cast_to_act)(void *dst, const float *src, size_t n);

    // out[N,C] = wte[tokens[n], :]. Token ids must be in [0, V).
    void (*embedding_forward)(void *out, const int *tokens, const void *wte, int N, int C);
    // dwte[tokens[n], :] += dout[n, :]
    void (*embedding_backward)(float *dwte, const void *dout, const int *tokens, int N, int C);

    // out[N,OC] = inp[N,C] w[OC,C]^T
    void (*matmul_forward)(void *out, const void *inp, const void *w, int N, int C, int OC);
    // dinp[N,C] (=|+=) dout w ;  dw[OC,C] += dout^T inp. Either grad may be NULL.
    void (*matmul_backward)(void *dinp, float *dw, const void *dout, const void *inp,
                            const void *w, int N, int C, int OC, int accumulate);
    // The router's matmul, with FP32 logits: logits[N,E] = inp w^T;
    // backward: dinp += dlogits w (always accumulates), dw += dlogits^T inp.
    void (*router_logits_forward)(float *logits, const void *inp, const void *w, int N, int C, int E);
    void (*router_logits_backward)(void *dinp, float *dw, const float *dlogits, const void *inp,
                                   const void *w, int N, int C, int E);

    // out[N,C] = inp / sqrt(mean(inp^2) + eps) * w;  rstd[N] saved for backward.
    void (*rmsnorm_forward)(void *out, float *rstd, const void *inp, const void *w,
                            int N, int C, float eps);
    // dinp (=|+=), dw +=
    void (*rmsnorm_backward)(void *dinp, float *dw, const void *dout, const void *inp,
                             const void *w, const float *rstd, int N, int C, int accumulate);

    // Rotate-half RoPE, in place allowed. x is [B, T, nh, hd]; position = t.
    // cos/sin tables are f32 [T, hd/2]. backward applies the inverse rotation.
    void (*rope_forward)(void *out, const void *inp, const float *cos_t, const float *sin_t,
                         int B, int T, int nh, int hd);
    void (*rope_backward)(void *dinp, const void *dout, const float *cos_t, const float *sin_t,
                          int B, int T, int nh, int hd);
    // QK-norm then RoPE: out = rope_forward(rmsnorm_forward(inp)) over the
    // rows of C channels of x [B, T, nh, hd] (C = nh hd: one row per (b, t);
    // C = hd: per head), rstd as rmsnorm_forward's, and the bits of the two
    // ops in turn (the normed rows rounded to act before the rotation). tmp
    // [B T nh hd] act is scratch the op may overwrite (the normed rows where
    // a backend does not fuse the two).
    void (*rmsnorm_rope_forward)(void *out, float *rstd, void *tmp, const void *inp, const void *w,
                                 const float *cos_t, const float *sin_t, int B, int T, int nh, int hd, int C,
                                 float eps);
    // Its backward: rope_backward of dout (the rotated rows' grad) into tmp,
    // then rmsnorm_backward from it: dinp (=|+=), dw +=; dinp may alias dout.
    void (*rmsnorm_rope_backward)(void *dinp, float *dw, void *tmp, const void *dout, const void *inp,
                                  const void *w, const float *rstd, const float *cos_t, const float *sin_t, int B,
                                  int T, int nh, int hd, int C, int accumulate);

    // Causal attention with GQA. q [B,T,H,hd], k/v [B,T,KV,hd], out [B,T,H,hd].
    // saved (f32, attention_saved_floats of them) is what backward needs:
    // the probabilities [B,H,T,T] on CPU, the log-sum-exp [B,H,T] on CUDA.
    // doc_start (i32 [B,T]) or NULL: intra-document masking. doc_start[b*T+t]
    // is the first position (0..t) of the document that holds position t of
    // sequence b, and query t sees key s iff doc_start[b*T+t] <= s <= t.
    // Documents are contiguous: doc_start[b*T+t] is t or doc_start[b*T+t-1]
    // (t = 0: 0); the kernels rely on it to skip masked tiles. NULL is plain
    // causal attention (every doc_start 0 computes the same numbers).
    void (*attention_forward)(void *out, float *saved, const void *q, const void *k,
                              const void *v, const int *doc_start, int B, int T, int H, int KV,
                              int hd);
    // dq, dk, dv assigned. scratch: attention_scratch_floats(B,T,H,KV,hd) f32.
    // doc_start as given to the forward.
    void (*attention_backward)(void *dq, void *dk, void *dv, const void *dout,
                               const float *saved, const void *q, const void *k, const void *v,
                               const void *out, const int *doc_start, float *scratch, int B, int T,
                               int H, int KV, int hd);
    size_t (*attention_saved_floats)(int B, int T, int H, int hd);
    size_t (*attention_scratch_floats)(int B, int T, int H, int KV, int hd);

    // out = silu(gate) * up, all [N, F]. backward assigns dgate, dup.
    void (*swiglu_forward)(void *out, const void *gate, const void *up, size_t n);
    void (*swiglu_backward)(void *dgate, void *dup, const void *dout, const void *gate,
                            const void *up, size_t n);
    // The same on the first rows[0] rows of [max_rows, F] (rows read where it
    // lives, clamped to max_rows): the rows at the experts under symmetric
    // expert parallelism, whose number only the device knows.
    void (*swiglu_forward_rows)(void *out, const void *gate, const void *up, const int *rows, int max_rows,
                                int F);
    void (*swiglu_backward_rows)(void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                                 const int *rows, int max_rows, int F);

    // --- router (all f32) -------------------------------------------------
    // probs[N,E] = softmax(logits) or sigmoid(logits)
    void (*router_probs_forward)(float *probs, const float *logits, int N, int E, Gating g);
    // dlogits (=|+=) from dprobs
    void (*router_probs_backward)(float *dlogits, const float *dprobs, const float *probs,
                                  int N, int E, Gating g, int accumulate);
    // Expert choice idx[N,k] (not differentiable). bias may be NULL (aux-free
    // balancing adds it to probs for the choice only). For ROUTING_RANDOM the
    // choice of token n depends only on (*seed, n): seed is in backend
    // memory, so a captured graph reads each micro-batch's (read only for
    // ROUTING_RANDOM; NULL otherwise is fine).
    void (*router_topk)(int *idx, const float *probs, const float *bias, int N, int E, int k,
                        RoutingMode mode, const uint64_t *seed);
    // weights[N,k] = probs[n, idx[n,s]], divided by their sum when renorm.
    void (*router_weights_forward)(float *weights, const float *probs, const int *idx,
                                   int N, int E, int k, int renorm);
    // dprobs[N,E] (=|+=) from dweights[N,k]
    void (*router_weights_backward)(float *dprobs, const float *dweights, const float *probs,
                                    const int *idx, int N, int E, int k, int renorm,
                                    int accumulate);
    // counts[E] += number of (token, slot) pairs routed to each expert
    void (*router_count)(float *counts, const int *idx, int N, int E, int k);
    // Aux-loss-free balancing after a step, for L layers of E experts:
    // bias[l, e] += rate * sign(mean_e counts[l, :] - counts[l, e]) (0 when
    // equal; the mean in FP64). counts stay where they are (no host copy).
    void (*router_bias_update)(float *bias, const float *counts, int L, int E, float rate);
    // Load-balancing loss (E/k) sum_i f_i P_i, f_i = counts[i] / count_tokens,
    // P_i = mean over the N tokens of p̂[:, i] (p̂ = probs, normalised per
    // token for sigmoid gating), written to out[0]; backward adds
    // scale * dLB/dprobs into dprobs. count_tokens <= 0: the tokens the
    // counts cover, sum_i counts[i] / k, read where the counts are (so a
    // graph of model.lb_global's running counts needs no host argument).
    void (*lb_loss_forward)(float *out, const float *probs, const float *counts, float count_tokens,
                            int N, int E, int k, Gating g);
    void (*lb_loss_backward)(float *dprobs, const float *probs, const float *counts,
                             float count_tokens, int N, int E, int k, Gating g, float scale);
    // Router z-loss mean_t logsumexp(logits[t])^2 written to out[0];
    // backward adds scale * dZ/dlogits.
    void (*zloss_forward)(float *out, const float *logits, int N, int E);
    void (*zloss_backward)(float *dlogits, const float *logits, int N, int E, float scale);

    // --- dropless expert dispatch ---------------------------------------
    // From idx[N,k]: offsets[E+1] of each expert's segment in the grouped
    // rows, row_of[N*k] (the grouped row of token n, slot s) and
    // token_of_row[N*k] (its token). Stable: expert, then token, then slot.
    void (*moe_route_index)(int *offsets, int *row_of, int *token_of_row, const int *idx,
                            int N, int E, int k);
    // xp[R,C] = x[token_of_row[r], :]   (R = N*k)
    void (*permute_forward)(void *xp, const void *x, const int *token_of_row, int R, int C);
    // The same rows from the other map: xp[row_of[n,s], :] = x[n, :] for
    // every token n and slot s (R = N*k, row_of a permutation of 0..R-1, as
    // moe_route_index leaves it): permute_forward's bytes, with each token
    // row read once instead of k times. Optional (NULL: permute_forward).
    void (*permute_scatter)(void *xp, const void *x, const int *row_of, int N, int k, int C);
    // dx[N,C] (=|+=) scatter-add of dxp
    void (*permute_backward)(void *dx, const void *dxp, const int *token_of_row,
                             int N, int R, int C, int accumulate);
    // out[n] (=|+=) sum_s weights[n,s] * y[row_of[n,s]]
    void (*unpermute_forward)(void *out, const void *y, const float *weights,
                              const int *row_of, int N, int k, int C, int accumulate);
    // out[n] = res[n] + sum_s weights[n,s] * y[row_of[n,s]], the sum rounded
    // to the compute dtype first: the bits of unpermute_forward into a
    // scratch f, then sum_act(out, res, f), without f's write and read (the
    // residual add after an MoE layer whose output needs no post-norm).
    // Optional (NULL: those two ops).
    void (*unpermute_residual)(void *out, const void *res, const void *y, const float *weights,
                               const int *row_of, int N, int k, int C);
    // dy[row_of[n,s]] = weights[n,s] * dout[n] ;  dweights[n,s] = <dout[n], y[row]>
    void (*unpermute_backward)(void *dy, float *dweights, const void *dout, const void *y,
                               const float *weights, const int *row_of, int N, int k, int C);

    // --- capacity and expert-parallel dispatch --------------------------
    // Tail drop (model.capacity_factor): y[R,C] holds E segments of rows,
    // offsets[E+1] (read where they live; offsets[E] <= R); the rows past
    // the first `capacity` of each segment are zeroed and dropped[0] (f32,
    // NULL: not counted) += how many they are. Rows from offsets[E] on are
    // untouched. Its backward is itself (zeroing the same rows of the grad).
    void (*moe_capacity_drop)(void *y, float *dropped, const int *offsets, int E, int R, int C,
                              int capacity);
    // sizes[e] = offsets[e+1] - offsets[e]: the segments' row counts, where
    // the offsets live (the per-expert counts expert parallelism exchanges).
    void (*moe_segment_sizes)(int *sizes, const int *offsets, int E);
    // Symmetric ("direct-write") expert parallelism, parallel.ep_backend:
    // symmetric: the count exchange, the plan, the dispatch that writes rows
    // straight into their owner's receive buffer and the combine that reads
    // them back, over tables of peer pointers in backend memory. The
    // semantics, buffers and barriers are in ops/ep_sym.h.
    void (*ep_sym_write_counts)(int *const *windows, const int *offsets, int P, int rank, int E);
    void (*ep_sym_plan)(int *plan, float *dropped, const int *counts, int P, int rank, int E, int capacity,
                        int max_rows);
    void (*ep_sym_dispatch)(void *const *recv, const int *plan, const int *offsets, const void *xp, int P, int E,
                            int R, int C);
    void (*ep_sym_combine)(void *y, void *const *out, const int *plan, const int *offsets, int P, int E, int R,
                           int C);

    // Grouped matmul over expert segments: rows offsets[e]..offsets[e+1] of
    // inp use w[e] ([OC, C]); offsets are read where they live (device
    // memory on CUDA: the host never sees the counts). out[R,OC].
    void (*grouped_matmul_forward)(void *out, const void *inp, const void *w,
                                   const int *offsets, int E, int C, int OC);
    // The experts' gate and up products and their SwiGLU: g = inp wg[e]^T,
    // u = inp wu[e]^T over the segments (as grouped_matmul_forward), a =
    // silu(g) u on the first R rows (as swiglu_forward): the same bits as
    // those three ops, in one pass over inp where the backend fuses them.
    // NULL where a backend has none.
    void (*grouped_glu_forward)(void *g, void *u, void *a, const void *inp, const void *wg, const void *wu,
                                const int *offsets, int E, int C, int OC, int R);
    // dinp (=) and dw (=|+=, by accumulate: an exception to the rule above,
    // so that the first micro-batch of a step can write the expert grads
    // instead of zeroing and adding; experts without rows get zeros); either
    // may be NULL.
    void (*grouped_matmul_backward)(void *dinp, float *dw, const void *dout,
                                    const void *inp, const void *w, const int *offsets,
                                    int E, int C, int OC, int accumulate);
    // dinp[R,C] = dout1 w1[e] + dout2 w2[e] over the segments: the data-grads
    // of two grouped matmuls of the same input (the experts' gate and up
    // projections), as one product with twice the K.
    void (*grouped_dgrad_pair)(void *dinp, const void *dout1, const void *w1, const void *dout2,
                               const void *w2, const int *offsets, int E, int C, int OC);
    // dw as grouped_matmul_backward's (= or +=, by accumulate), and the sum
    // of squares of the dw it leaves, every expert's (those without rows
    // too), into slots[0 .. ops_wgrad_slots(E, C, OC)): one FP64 slot per
    // 16 rows x 128 columns of dw[e] [OC, C], summed in the fixed order of
    // ops_cpu_wgrad_slots (bit for bit the same on every backend for the
    // same dw). The trainer's grad norm takes the expert grads' share from
    // these on a step's last backward instead of another pass over them
    // (docs/design.md §2, "The grad norm"). NULL where a backend has none.
    void (*grouped_wgrad_sumsq)(float *dw, double *slots, const void *dout, const void *inp,
                                const int *offsets, int E, int C, int OC, int accumulate);

    // --- FP8 (train.precision: fp8; formats and rules in ops/fp8.h) ---------
    // block128: E4M3 values, FP32 scales per 1 x 128 tile of a row and per
    // 128 x 128 block of an expert weight. q are bytes, s f32, both in backend
    // memory; rows of C values have ceil(C / 128) scales.
    // qw[E,M,K], sw[E, M/128, K/128] from the FP32 weights w, and (qwt not
    // NULL) the data-grads' transposed copy of the same bytes and scales:
    // qwt [E, K, ldt] with qw_e^T in columns col0..col0+M, swt [E, K/128,
    // ldt/128] (fp8_transpose_128x128 of ops/fp8.h).
    void (*fp8_quantize_weights)(uint8_t *qw, float *sw, uint8_t *qwt, float *swt, int ldt, int col0, const float *w,
                                 int E, int M, int K);
    // q[R,C], s of rows x[token_of_row[r], :] (the permute, quantised;
    // token_of_row NULL: x's own rows in order).
    void (*fp8_quantize_rows)(uint8_t *q, float *s, const void *x, const int *token_of_row, int R, int C);
    // q[R,F], s of silu(gate) * up, the SwiGLU in the act dtype (as
    // swiglu_forward writes it), quantised.
    void (*fp8_swiglu_quantize)(uint8_t *q, float *s, const void *gate, const void *up, int R, int F);
    // swiglu_backward (dgate, dup [R,F] act, as it writes them) and the pair
    // quantised side by side for the data-grad: q [R, 2F], s of [dgate | dup].
    void (*fp8_swiglu_backward_quantize)(void *dgate, void *dup, uint8_t *q, float *s, const void *dout,
                                         const void *gate, const void *up, int R, int F);
    // unpermute_backward, then fp8_quantize_rows of the dy it wrote (R = N
    // k rows, token_of_row NULL) into q, s: the same bits, with dy's 1 x 128
    // tiles quantised as they are stored instead of read back (the FP8
    // data-grad of the experts' down projection). Optional (NULL: the two ops).
    void (*fp8_unpermute_backward_quantize)(void *dy, float *dweights, uint8_t *q, float *s, const void *dout,
                                            const void *y, const float *weights, const int *row_of, int N, int k,
                                            int C);
    // x[R,C] (act) = the dequantised q, s.
    void (*fp8_dequantize_rows)(void *x, const uint8_t *q, const float *s, int R, int C);
    // out[R,C] (act) = fp8_quantize_rows of x, token_of_row dequantised (the
    // bits of the two ops, without the codes and scales between them).
    void (*fp8_fake_quantize_rows)(void *out, const void *x, const int *token_of_row, int R, int C);
    // The FP8 dispatch payload (ep > 1; fp8_pack_rows / fp8_unpack_rows of
    // ops/fp8.h): p [R, fp8_payload_bytes(C)] bytes from q [R,C], s; and q,
    // s row r from p row src_row[r] (NULL: row r). C % 128 == 0.
    void (*fp8_pack_rows)(void *p, const uint8_t *q, const float *s, int R, int C);
    void (*fp8_unpack_rows)(uint8_t *q, float *s, const void *p, const int *src_row, int R, int C);
    // fp8.wgrad: fp8: x [R,C] act quantised and dequantised in place per
    // 128 x 1 tile along the rows of each expert segment (the offsets, where
    // they live): the weight-grads' operands (fp8_fake_quantize_128x1 of
    // ops/fp8.h; on CUDA the dequantised values rounded to BF16). A backend
    // without it leaves it NULL, and train refuses fp8.wgrad: fp8 there.
    void (*fp8_fake_quantize_tokens)(void *x, const int *offsets, int E, int C);
    // fp8.wgrad: fp8 as an FP8 GEMM (NULL, or supports() refusing
    // OP_FP8_WGRAD: the model fake-quantises and runs grouped_matmul_backward):
    // qt [C, ldk] (bytes), st [ldk/128, C] (f32) of x [R, C] act, the same
    // tiles, codes and scales as fp8_fake_quantize_tokens laid out along the
    // tokens (fp8_tokens_ldk of ops/fp8.h); and dw [E, OC, C] (=|+=, as
    // grouped_matmul_backward's) of qa/sa from dout [R, OC], qb/sb from inp [R, C].
    void (*fp8_quantize_tokens_t)(uint8_t *qt, float *st, const void *x, const int *offsets, int E, int C, int ldk);
    // The same (qt, st) of the act values fp8_dequantize_rows makes of q [R,C],
    // s (1 x 128 codes and scales), without writing them (NULL where
    // fp8_quantize_tokens_t is; the FP8 weight-grad GEMM needs both).
    void (*fp8_requantize_tokens_t)(uint8_t *qt, float *st, const uint8_t *q, const float *s, const int *offsets,
                                    int E, int C, int ldk);
    void (*fp8_grouped_wgrad)(float *dw, const uint8_t *qa, const float *sa, const uint8_t *qb, const float *sb,
                              const int *offsets, int E, int C, int OC, int ldk, int accumulate);
    // The FP8 grouped matmul forward: out[R,OC] (act) = deq(qa) deq(qw[e])^T
    // over the segments offsets[e]..offsets[e+1] (read where they live), qa
    // [R,C] from fp8_quantize_rows / fp8_swiglu_quantize, qw [E,OC,C] from
    // fp8_quantize_weights; FP32 accumulation. The data-grads run it too,
    // with the transposed weights: dX = deq(dY) deq(W_e) with qw = W^T.
    void (*fp8_grouped_matmul_forward)(void *out, const uint8_t *qa, const float *sa, const uint8_t *qw, const float *sw,
                                const int *offsets, int E, int C, int OC);
    // The dense GEMMs in FP8 (fp8.gemms: experts_dense). q [R, C] and st
    // [C/128, R] of x [R, C] act: fp8_quantize_rows's codes and scales with
    // the scales stored transposed (tile t of row r at st[t R + r]: the
    // layout cuBLASLt's VEC128_32F mode reads). C % 128 == 0.
    void (*fp8_quantize_rows_t)(uint8_t *q, float *st, const void *x, int R, int C);
    // out[N, OC] (act; =|+= by accumulate) = deq(qa) deq(qw)^T, qa [N, C]
    // with st [C/128, N] from fp8_quantize_rows_t, qw [OC, C] with sw
    // [OC/128, C/128] from fp8_quantize_weights (E = 1); FP32 accumulation.
    // The data-grad dX [N, C] = deq(dY) deq(W) is this with qa = dY [N, OC]
    // and qw = W^T [C, OC] (fp8_quantize_weights' transposed copy, ldt = OC).
    // C and OC multiples of 128.
    void (*fp8_matmul)(void *out, const uint8_t *qa, const float *st, const uint8_t *qw, const float *sw, int N, int C,
                       int OC, int accumulate);

    // --- loss -------------------------------------------------------------
    // losses[N] = -log softmax(logits[n])[targets[n]] (0 where target < 0).
    void (*crossentropy_forward)(float *losses, const void *logits, const int *targets,
                                 int N, int V);
    // dlogits[N,V] = dloss * (softmax(logits) - onehot) for valid rows, 0 elsewhere.
    // dlogits may alias logits (the fused classifier case).
    void (*crossentropy_backward)(void *dlogits, const void *logits, const int *targets,
                                  float dloss, int N, int V);
    // Both at once, from one read of the logits (the training step's
    // forward, when the backward's dloss is known): losses as
    // crossentropy_forward, dlogits as crossentropy_backward, the same bits.
    void (*crossentropy_fused)(float *losses, void *dlogits, const void *logits, const int *targets,
                               float dloss, int N, int V);
    // acc[0] += sum of losses[n] over n with targets[n] >= 0
    void (*loss_sum)(double *acc, const float *losses, const int *targets, int N);

    // --- elementwise --------------------------------------------------------
    void (*add_act)(void *y, const void *x, size_t n);     // y += x
    void (*sum_act)(void *out, const void *a, const void *b, size_t n); // out = a + b (as copy + add_act)
    void (*copy_act)(void *dst, const void *src, size_t n);
    void (*add_f32)(float *y, const float *x, size_t n);   // y += x
    void (*copy_f32)(float *dst, const float *src, size_t n);
    void (*zero)(void *x, size_t bytes);

    // --- optimizer ----------------------------------------------------------
    // One AdamW step on n elements of the FP32 master weights p; step t >= 1
    // (bias correction); wd is decoupled: p -= lr * wd * p. grad_scale
    // multiplies the grads first (clipping). p_act, when not NULL and not p,
    // receives the updated weights in the compute dtype.
    void (*adamw_update)(float *p, void *p_act, const float *g, float *m, float *v, size_t n,
                         float lr, float beta1, float beta2, float eps, float wd,
                         float grad_scale, int t);
    // adamw_update of one expert weight p [E, M, K] (n = E M K, no compute
    // copy) that also writes its FP8 copies from the updated main weights:
    // the bits of adamw_update followed by fp8_quantize_weights(qw, sw, qwt,
    // swt, ldt, col0, p, E, M, K), in one pass over memory where the backend
    // fuses them (M, K multiples of 128). NULL where a backend has no FP8 ops.
    void (*adamw_update_fp8)(float *p, const float *g, float *m, float *v, float lr, float beta1, float beta2,
                             float eps, float wd, float grad_scale, int t, uint8_t *qw, float *sw, uint8_t *qwt,
                             float *swt, int ldt, int col0, int E, int M, int K);
    // acc[0] += sum of squares of x
    void (*sum_squares)(double *acc, const float *x, size_t n);
    // acc[0] += the sum of x (FP64, in an order fixed by n and the backend)
    void (*sum_f64)(double *acc, const double *x, size_t n);
} Ops;

// The slots of grouped_wgrad_sumsq for E experts' dw [OC, C].
static inline size_t ops_wgrad_slots(int E, int C, int OC) {
    return (size_t)E * (size_t)((OC + 15) / 16) * (size_t)((C + 127) / 128);
}
// The reference order of those slots, from dw in host memory: slot (e, i,
// j) sums rows 16 i.. and columns 128 j.. of dw[e] as 32 lanes would (lane l
// rows 16 i + l / 4 and + 8, columns 128 j + 2 (l % 4) + 8 t + {0, 1}, t =
// 0..15; per lane in the order t, then (row, column), (row, column + 1),
// (row + 8, column), (row + 8, column + 1), skipping elements past OC or C;
// then the lanes' sums pairwise over lane ^ 16, ^ 8, ^ 4, ^ 2, ^ 1: lane 0's).
void ops_cpu_wgrad_slots(const float *dw, double *slots, int E, int C, int OC);

extern const Ops ops_cpu;
// The CPU backend's allocation counters: bytes of ops_cpu.alloc live now and
// at most so far (the memory accounting's measure, train/memory.h);
// ops_cpu_count_bytes adds memory the backend did not allocate itself
// (symmetric memory's shared MPI window, dist/symmem.c).
void ops_cpu_alloc_stats(size_t *live, size_t *peak);
void ops_cpu_count_bytes(size_t bytes, int freed);
// Whether MOECORE_CPU_POISON is set (tests): ops_cpu.alloc and the shared
// MPI window then start as 0xff bytes (FP32 NaN, E4M3 NaN), so that a value
// read before it is written shows in the results, as it can on a GPU.
int ops_cpu_poison(void);

// RoPE tables [T, hd/2], computed in double on the host.
void rope_tables(float *cos_t, float *sin_t, int T, int hd, float theta);

#ifdef MOECORE_CUDA
// The CUDA backend (src/ops/cuda/): BF16 act, device memory, one stream.
extern const Ops ops_cuda;
#endif
