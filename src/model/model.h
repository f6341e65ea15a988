// The MoE transformer of docs/model.md: forward and backward over the
// parameters of its store (src/params/), written once against the op
// interface (src/ops/ops.h).
//
// Usage per optimizer step (gradient accumulation over M micro-batches):
//   model_zero_grads(m) (or model_zero_dense_grads(m)); model_begin_step(m);
//   for each micro-batch: model_forward(m, tokens, targets, seed);
//                         model_backward(m, 1/total_valid_targets, 1/M);
//   ... optimizer ...;  model_end_step(m)   (aux-free bias update)
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "config/model_config.h"
#include "dist/comm.h"
#include "dist/ep.h"
#include "dist/symmem.h"
#include "ops/ops.h"
#include "params/layout.h"
#include "params/store.h"

// Expert parallelism: this rank holds experts [ep_rank*E/ep, (ep_rank+1)*E/ep)
// and exchanges routed rows inside ep_comm. model.lb_global sums the
// expert counts of each micro-batch over dp_comm, the data-parallel group
// (NULL: one rank). NULL in model_init = one rank.
//
// ep_backend (parallel.ep_backend) picks how rows reach the experts' ranks:
// EP_A2A the all-to-alls of dist/ep.h (split sizes through the host, one
// host wait per layer); EP_SYMMETRIC the direct writes of ops/ep_sym.h into
// the owners' receive buffers in symmetric memory (dist/symmem.h: nothing
// through the host, captures in a CUDA graph), also with one rank (a P = 1
// run of the same path, for tests); EP_AUTO symmetric where the ep group
// shares memory (one node of CPU ranks, one NVLink domain of GPUs) and
// ep > 1, else a2a (ep > 1) or no dispatch at all (ep = 1).
// ep_recv_factor (symmetric): the receive buffers hold ceil(factor x the
// rows a rank routes) rows per layer; 0: ep x those rows (nothing can
// overflow), shrunk to what the device can spare (model_alloc_acts).
typedef enum { EP_AUTO = 0, EP_A2A = 1, EP_SYMMETRIC = 2 } EpBackend;
// Pipeline parallelism: stage (NULL: the whole model) names the layers this
// rank holds, as one or more chunks (params/layout.h); the store then holds
// only their tensors, and the trainer runs model_forward_chunk /
// model_backward_chunk per action of its schedule, handing the residual
// stream between ranks (model_chunk_input / model_chunk_output, dres).
typedef struct {
    int ep_rank, ep_size;
    Comm *ep_comm;
    Comm *dp_comm;
    int ep_backend;
    double ep_recv_factor;
    const ParamStage *stage;
} ModelParallel;

// What one block keeps from forward for backward. act buffers (void *)
// are in the backend's compute dtype, f32 ones (float *) in FP32; all live
// in the backend's memory (ops.h).
typedef struct {
    void *ln1; float *ln1_rstd;       // attn_norm(x)          (pre, peri)
    void *q, *k, *v;                  // projections
    void *qn, *kn;                    // QK-norm's scratch, shared by all blocks (rmsnorm_rope_forward; alias q, k without it)
    float *qn_rstd, *kn_rstd;
    void *qr, *kr;                    // after RoPE
    float *att;                       // what attention backward needs (backend layout)
    void *ao;                         // attention output, before wo
    void *o, *on; float *o_rstd;      // wo output; attn_post_norm(o) (post, peri)
    void *h;                          // residual after the attention half
    void *ln2; float *ln2_rstd;       // ffn_norm(h)           (pre, peri)
    void *f, *fn; float *f_rstd;      // ffn output; ffn_post_norm(f) (post, peri)
    // dense MLP
    void *g, *u, *a;
    // MoE
    float *logits, *probs, *weights;  // [N,E], [N,E], [N,k]
    int *idx, *row_of, *token_of_row, *offsets;
    float *counts;                    // [E] this micro-batch
    float *lb_counts;                 // [E] counts the LB loss used
    float lb_tokens;                  // tokens those counts cover
    void *xp, *ey;                    // routed rows sorted by global expert [R,D]
    EpPlan plan;                      // dispatch to the experts' ranks (use_plan)
    int use_plan;                     // 0: one rank (or symmetric): no all-to-all plan
    int *sym_plan;                    // symmetric: this layer's plan (ops/ep_sym.h), kept for backward
    void **sym_recv;                  // symmetric: [ep] the peers' receive buffers of this layer (xl here; fp8: none, sym_xrecv)
    const int *local_offsets;         // the local experts' segments
    int rows_local;                   // rows at the local experts (-1: symmetric, only the device knows)
    void *xl, *eg, *eu, *ea, *yl;     // rows at the experts, by local expert [Rl,D], [Rl,Fe] x3, [Rl,D]
    void *sg, *su, *sa, *so;          // shared experts [N,Fs] x3, [N,D]
    // train.precision: fp8 (model_set_fp8): the experts' routed inputs and
    // SwiGLU outputs as the FP8 GEMMs read them and the backward dequantises
    // them, in place of xp / xl and ea: E4M3 bytes [Rl,D], [Rl,Fe] and FP32
    // scales per 1 x 128 tile [Rl,D/128], [Rl,Fe/128]
    uint8_t *xq, *eaq;
    float *xs, *eas;
    // defer_wgrad: the output grads of wo, wq, wk, wv, kept from the input-grad
    // backward for the weight-grad one [N,D], [N,qd], [N,kvd] x2
    void *w_do, *w_dq, *w_dk, *w_dv;
} LayerActs;

// What one micro-batch in flight keeps (an activation slot): the model's
// per-micro-batch fields below, swapped in by model_use_slot. Pipeline
// schedules keep several micro-batches between their forward and backward.
typedef struct {
    LayerActs *acts;
    void **resid;
    void *xf, *logits; float *xf_rstd, *losses;
    int *tokens, *targets, *doc_start, *doc_start_host;
    int batch_docs, n_valid;
    size_t *plan_sizes;
    int *plan_host;
    void *grad_out;                   // pipeline: the grad this micro-batch sends to the previous stage [N,D]
    uint64_t *route_seeds;            // random routing: each layer's seed, in backend memory [n_layers]
    uint64_t route_seed;              // the micro-batch seed they were made from
    int route_seed_set;               // whether route_seeds holds route_seed's
} ModelSlot;

typedef struct {
    ModelConfig cfg;
    const Ops *ops;
    ModelParallel par;
    ParamStage stage;                 // the layers held (par.stage, or all of them as one chunk)
    int staged;                       // the store holds part of the model (pipeline parallelism)
    int E_local;                      // experts held here
    ParamStore store;                 // table, weights, grads, router bias (params/store.h)
    int expert_grads_unset;           // set by model_zero_dense_grads, cleared by model_backward
    // The grad norm's slots of the expert grads (ops.h grouped_wgrad_sumsq),
    // per MoE layer gate, up, down (model_alloc_wgrad_slots). The trainer
    // sets wgrad_slots_on for a step's last backward, whose expert
    // weight-grads then also fill them.
    double *wgrad_slots;
    int wgrad_slots_on;
    int embed, final_norm, lm_head;   // from the store's layout (params/layout.h)
    LayerParams *layers;
    int n_moe;

    // activations, sized by model_alloc_acts for micro-batches of B x T
    int B, T;
    // Activation recompute, set before model_alloc_acts: 0 keeps everything;
    // 1 (experts) keeps one SwiGLU output buffer for all MoE layers, and one
    // routed-rows buffer when the rows stay on this rank (one EP rank), and
    // the backward recomputes them (a gather and a SwiGLU);
    // 2 (gather) only the routed-rows buffer (the gather is redone).
    // 3 (layers): whole blocks are recomputed in the backward from their
    // inputs, and share one set of activation buffers (per kind of block):
    // block l unless it is the last, when l % recompute_every == 0 (0: 1)
    // and, with recompute_first > 0, l < recompute_first.
    int recompute, recompute_every, recompute_first;
    // Selective recompute, set before model_alloc_acts, beside any mode:
    // recompute_norms: the input norms' outputs (ln1, ln2) of every block
    // share one buffer; the backward recomputes each from its kept input.
    // recompute_attention: only q, k, v (and the input norm's output) stay;
    // the QK-norm, RoPE and attention outputs (qn, kn, qr, kr, the saved
    // softmax statistics, ao) of every block share one set, which the
    // backward refills from q, k, v (the same kernels) before the block's
    // attention backward. recompute_swiglu: the SwiGLU outputs (experts' ea,
    // dense MLPs' a, shared experts' sa) share one buffer per kind and the
    // backward redoes SwiGLU from the kept gate and up projections.
    int recompute_norms, recompute_attention, recompute_swiglu;
    int recomputing;                  // set while backward recomputes a block
    // ce_fused_scale != 0 (the trainer, around one micro-batch's forward and
    // backward): the forward's cross-entropy also writes the dlogits for the
    // backward's ce_scale, which must equal it (ops->crossentropy_fused: one
    // read of the logits instead of two; the same bits); ce_dlogits_ready
    // tells the backward the logits hold them.
    float ce_fused_scale;
    int ce_dlogits_ready;
    // train.precision: fp8 (model_set_fp8, before model_alloc_acts): the
    // experts' grouped GEMMs run their forward in FP8 (block128: E4M3, 1 x 128
    // activation tiles, 128 x 128 weight blocks, FP32 accumulation). The
    // FP8 copies of the expert weights [n_moe][gate, up, down] and their
    // scales are made from the FP32 main weights by model_fp8_refresh, and
    // replace the BF16 copies of the expert weights (the store drops them).
    // The data-grads run in FP8 too: the output grads quantised 1 x 128, the
    // weights' transposed copies (the same bytes and scales, made with the
    // forward's; fp8_wt: per MoE layer [Wg^T | Wu^T] [E_local, d_model,
    // 2 expert_hidden], then Wd^T [E_local, expert_hidden, d_model]). The
    // weight-grads run in the compute dtype from the dequantised FP8 inputs
    // (what the forward multiplied) and the unquantised output grads, or,
    // with fp8_wgrad (fp8.wgrad: fp8; 2: on the backend's FP8 weight-grad
    // GEMM where it takes the shapes, device.cuda.fp8_wgrad_gemm), from both operands
    // quantised and dequantised per 128 x 1 tile along the tokens of each
    // expert segment (fp8_fake_quantize_tokens: the reference of an FP8
    // weight-grad GEMM, whose K is the tokens).
    int fp8, fp8_wgrad;
    // fp8.wgrad: fp8 on the backend's FP8 weight-grad GEMM (fp8_quantize_tokens_t,
    // fp8_grouped_wgrad; NULL: the fake quantiser): both operands along the
    // tokens, [max(d_model, expert_hidden), fp8_ldk] E4M3, and their scales
    uint8_t *fp8_wqa, *fp8_wqb;
    float *fp8_wsa, *fp8_wsb;
    int fp8_ldk;
    uint8_t *fp8_w;                   // [n_moe * 3][E_local * d_model * expert_hidden]
    float *fp8_ws;                    // [n_moe * 3][fp8_ws_per]
    uint8_t *fp8_wt;                  // [n_moe][3 * E_local * d_model * expert_hidden]: the transposed copies
    float *fp8_wts;                   // [n_moe][3 * fp8_ws_per]
    size_t fp8_ws_per;                // scales per expert tensor
    void *fp8_deq;                    // backward scratch [R, max(d_model, expert_hidden)] act: a dequantised input
    uint8_t *fp8_dq;                  // backward scratch [R, max(d_model, 2 expert_hidden)]: quantised output grads
    float *fp8_ds;                    // their scales [R, max(d_model, 2 expert_hidden) / 128]
    // (the three above and the weight-grad's operands: Rl rows with ep > 1,
    // the rows at this rank's experts)
    // ep > 1 (or symmetric): the routed rows quantised here [R, d_model],
    // their scales, and the payload rows that carry both to the experts'
    // ranks (ep_dispatch_fp8; symmetric: ep_sym_dispatch into sym_xrecv)
    uint8_t *fp8_src_q, *fp8_send;
    float *fp8_src_s;
    // fp8.gemms: experts_dense (model_set_fp8_dense, after model_set_fp8):
    // the dense GEMMs too, through ops->fp8_matmul: the attention
    // projections wq, wk, wv, wo and the SwiGLU MLPs of dense layers and
    // shared experts (not the LM head, the router or attention itself).
    // Forward and data-grad in FP8 (inputs and output grads 1 x 128,
    // weights 128 x 128 with the data-grad's transposed copy made in the same
    // pass by model_fp8_refresh); weight-grads in the compute dtype from the
    // unquantised output grads and the dequantised FP8 inputs. The inputs
    // are quantised again in the backward (same values, same bits) instead
    // of being kept: no activation memory beyond the shared scratch below.
    // The FP8 copies sit beside the BF16 ones (which stay: they share one
    // buffer with the embedding, norms, router and LM head, which DDP and
    // the optimizer address as a whole).
    int fp8_dense;
    int n_fp8d;                       // dense FP8 weights
    struct Fp8DenseWeight {
        int entry, M, K;              // its param entry, shape [M, K]
        uint8_t *q, *qt;              // [M, K] and the transposed [K, M]
        float *s, *st;                // [M/128, K/128] and [K/128, M/128]
    } *fp8d;
    int *fp8d_of;                     // [store.table.n]: index in fp8d, or -1
    uint8_t *fp8d_bytes;              // one allocation for every copy and scale
    uint8_t *fp8d_xq, *fp8d_gq;       // scratch [N, fp8d_width]: an input, an output grad, quantised
    float *fp8d_xs, *fp8d_gs;         // their scales [fp8d_width / 128, N] (transposed: ops.h)
    void *fp8d_deq;                   // scratch [N, fp8d_width] act: a dequantised input (the weight-grads')
    // Zero-bubble pipelines (ZB-H1), set before model_alloc_acts: the
    // backward leaves the weight grads of the attention projections and the
    // LM head to model_wgrad_chunk, keeping their output grads in the slot
    // (the MoE and MLP weight grads stay in the backward).
    int defer_wgrad;
    // Called after each block of a chunk's forward and backward when set
    // (pipeline.c on CPU ranks: MPI moves a large message only while the
    // sender is inside an MPI call, so the pipeline's sends progress between
    // blocks instead of waiting for the rank's next action).
    void (*between_blocks)(void *ctx);
    void *between_blocks_ctx;
    // Intra-document attention masking (docs/model.md), set before
    // model_alloc_acts: with doc_mask, a position attends only to the
    // positions of its own document, the documents of a sequence each ending
    // with a doc_eos token. model_set_batch computes the ops' doc_start from
    // the tokens on the host and uploads it with them.
    int doc_mask, doc_eos;
    char *arena;                      // one backend allocation, carved
    size_t arena_bytes;
    size_t slot_bytes;                // of which each activation slot
    ModelSlot *slots;                 // [n_slots]; the fields below are those of slots[slot]
    int n_slots, slot;
    LayerActs *acts;
    void **resid;                     // [L+1] residual stream [N,D]
    void *xf, *logits; float *xf_rstd, *losses;
    int *tokens, *targets;
    int *doc_start, *doc_start_host;  // [B*T] (ops.h), with doc_mask; else NULL
    void *grad_out;                   // the slot's grad to the previous stage (staged models)
    // random routing: each layer's seed in backend memory [n_layers], made
    // from the micro-batch seed route_seed (model_set_route_seed)
    uint64_t *route_seeds;
    uint64_t route_seed;
    int route_seed_set;
    uint64_t *route_seeds_host;       // their host staging [n_layers], allocated once (model_init)
    // The micro-batch has a document boundary (an EOS before its last
    // position in some row): attention gets doc_start; without one it runs
    // the causal kernels (the same numbers, at the causal speed).
    int batch_docs;
    float *rope_cos, *rope_sin;
    // backward scratch
    void *dres, *d1, *d2, *dq, *dk, *dv, *dq2, *dk2, *dao;
    float *att_scratch;
    void *da, *dg, *du, *dey, *dyl, *dea, *deg, *deu, *dxl, *dxp; // (fp8 without symmetric: carve_shared)
    size_t *plan_sizes;               // host: the plans' sizes, and (ep > 1) their host arrays (dist/ep.h)
    int *plan_host;
    float *dweights, *dprobs, *dlogits;
    void *dsa, *dsg, *dsu, *ep_scratch;
    int max_rows_local;               // bound on rows an expert rank receives
    // symmetric expert parallelism (ModelParallel.ep_backend): the layers'
    // receive buffers (acts[].xl) and the shared count window, expert
    // outputs, output grads and input grads live in symmetric memory; the
    // peer tables of each are in the arena
    int ep_sym;                       // the symmetric path runs
    SymMem *sym;
    size_t sym_bytes;
    int *sym_counts;                  // this rank's count window [ep][E]
    void *sym_out, *sym_dout, *sym_dxl;
    uint8_t *sym_xrecv;               // fp8: the FP8 payload rows received [max_rows_local, fp8_payload_bytes(D)]
    int **sym_counts_tab;
    void **sym_out_tab, **sym_dout_tab, **sym_dxl_tab, **sym_xrecv_tab;
    char ep_note[320];                // what model_init_parallel / model_alloc_acts chose, for the log

    // router state across micro-batches and steps (backend memory; the
    // aux-loss-free bias is store.router_bias)
    float *step_counts;               // [n_moe, E] counts summed over the step
    float *lb_global_counts;          // [n_moe, E] model.lb_global: the step's counts so far, summed over dp_comm
    float step_tokens;                // tokens those counts cover
    float *dropped_step;              // [n_moe] rows dropped by capacity this step (at the experts)
    float *step_dropped;              // host copy of dropped_step: model_forward and the trainer's step read fill it
    float *step_rows;                 // host [n_moe] rows routed from this rank this step
    // host: the rows and payload bytes this rank's forward dispatches sent
    // this step (the all-to-all, ep > 1; the recomputed blocks' not counted)
    double step_dispatch_rows, step_dispatch_bytes;
    // losses (backend memory): this micro-batch's LB and z per MoE layer,
    // their sums over the step, and CE sums [micro-batch, step]
    float *lb_mb, *z_mb, *lb_step, *z_step;
    double *ce_acc;

    // results of the last model_forward, on the host
    double ce_sum;                    // sum of per-token CE over valid targets
    int n_valid;                      // valid targets
    float loss_ce;                    // ce_sum / n_valid
    float *lb, *z;                    // [n_moe] raw aux losses
    float loss_total;                 // CE mean + coefficients * aux
} Model;

// Builds the store (table, parameters and grads, zeroed); validates cfg.
// Returns -1 with a message on an invalid config.
int model_init(Model *m, const ModelConfig *cfg, const Ops *ops, char *err, size_t errlen);
// Same with expert parallelism (par may be NULL).
int model_init_parallel(Model *m, const ModelConfig *cfg, const Ops *ops, const ModelParallel *par,
                        char *err, size_t errlen);
// train.precision: fp8 (fp8.recipe block128, fp8.gemms experts): call after
// model_init, before model_alloc_acts. -1 with a message naming what the
// model or the backend cannot do (the all-to-all expert dispatch only, no
// pipeline stages, the backend's FP8 kernel sizes).
int model_set_fp8(Model *m, char *err, size_t errlen);
// fp8.gemms: experts_dense: call after model_set_fp8, before model_alloc_acts,
// with the tokens of a micro-batch (B T): the dense GEMMs in FP8 (the
// Model fields above). -1 with a message naming the key where a dimension
// is not a multiple of 128 or the backend cannot run the shapes.
int model_set_fp8_dense(Model *m, int tokens, char *err, size_t errlen);
// Bytes model_set_fp8_dense allocates for the dense FP8 weights and scales
// (the memory plan's count).
size_t model_fp8_dense_bytes(const ModelConfig *cfg, const ParamStage *stage);
// The FP8 expert weights from the FP32 main weights. model_begin_step calls
// it; call it after the weights change outside a step, before a forward
// (eval after an optimizer step). A no-op without fp8.
void model_fp8_refresh(Model *m);
// Matrices ~ normal(0, init_std), norms 1, from a seeded generator.
void model_init_weights(Model *m, uint64_t seed);
void model_alloc_acts(Model *m, int B, int T);
// The same with n_slots activation slots (micro-batches in flight); slot 0
// is in use after it.
void model_alloc_slots(Model *m, int B, int T, int n_slots);
// What model_alloc_slots would allocate for a rank, without a Model or a
// device (the planner and the memory accounting, train/memory.h): the same
// measuring carve. ep_sym: the symmetric dispatch (its receive buffers at
// the bound ep x rows, or ep_recv_factor's).
typedef struct {
    int B, T, n_slots;
    int ep, ep_sym;
    double ep_recv_factor;
    int recompute, recompute_every, recompute_first;
    int recompute_norms, recompute_attention, recompute_swiglu;
    int defer_wgrad, doc_mask;
    int fp8;                          // train.precision: fp8 (its FP8 activation buffers)
    int fp8_wgrad;                    // Model.fp8_wgrad's values (2: the FP8 weight-grad GEMM's operand buffers too)
    int fp8_dense;                    // fp8.gemms: experts_dense (the dense FP8 GEMMs' scratch)
    const ParamStage *stage;          // NULL: the whole model
} ModelArenaSpec;
typedef struct {
    size_t arena_bytes, slot_bytes;   // the arena, of which each activation slot
    size_t sym_bytes;                 // symmetric memory (0 without ep_sym)
    int rows_local;                   // rows an expert rank's buffers hold per layer
} ModelArenaSize;
int model_arena_plan(const ModelConfig *cfg, const Ops *ops, const ModelArenaSpec *s, ModelArenaSize *out,
                     char *err, size_t errlen);
// Makes slot k the one model_set_batch, the forward and the backward use.
void model_use_slot(Model *m, int k);
void model_free(Model *m);

// Allocates Model.wgrad_slots (model_free frees them) and returns how many,
// or 0 (nothing allocated) where a backward cannot fill them: no MoE
// layers, a backend without grouped_wgrad_sumsq, or the FP8 weight-grad
// GEMM (fp8.wgrad: fp8), whose kernels do not sum.
size_t model_alloc_wgrad_slots(Model *m);
// The same from a config, for E_local experts a rank and every MoE layer.
size_t model_wgrad_slots_for(const ModelConfig *cfg, int E_local);
void model_zero_grads(Model *m);
// As model_zero_grads for the dense grads only: the next model_backward
// writes the expert grads (every expert weight-grad of the model, zeros for
// experts without rows) instead of adding to them, which saves a pass over
// them and the reads of the first accumulation. A backward captured in a
// CUDA graph keeps what it was captured with: the trainer captures the
// step's first backward (=) and the later ones (+=) as graphs of their own.
void model_zero_dense_grads(Model *m);
void model_begin_step(Model *m);
// tokens, targets: host [B,T]; targets -1 are masked. route_seed drives
// random routing. Token ids must be in [0, vocab_size): callers validate
// data. model_set_batch uploads a micro-batch (and counts n_valid on the
// host); model_forward_async then runs with no host synchronisation, leaving
// every result in backend memory (the step sums lb_step, z_step, ce_acc[1]),
// so it can be captured in a CUDA graph. model_forward does both and copies
// this micro-batch's losses to the host fields below, returning the total.
void model_set_batch(Model *m, const int *tokens, const int *targets);
// Random routing: uploads the layers' seeds of micro-batch seed route_seed
// into the slot in use (a no-op when they are there already, or without
// random routing). The forward calls it; a caller capturing the forward in
// a CUDA graph calls it first, so that the graph only reads them.
void model_set_route_seed(Model *m, uint64_t route_seed);
void model_forward_async(Model *m, uint64_t route_seed);
// Host-side counts of one executed micro-batch (tokens and routed rows of
// the step): model_forward calls it; callers of model_forward_async call it
// once per micro-batch the device runs (a captured graph runs the forward
// without the host code).
void model_count_micro_batch(Model *m);
float model_forward(Model *m, const int *tokens, const int *targets, uint64_t route_seed);
// doc_start[B*T] of the ops' attention (ops.h) for the documents of tokens
// [B,T]: a document ends with its eos token (or at the end of the sequence),
// so the next position starts a new one.
void model_doc_starts(int *doc_start, const int *tokens, int B, int T, int eos);
// Targets >= 0 among n (masked ones are -1): what the CE is normalised by.
int64_t model_count_valid(const int *targets, size_t n);
// The auxiliary part of the loss, lb_coef sum_l LB_l + z_coef sum_l Z_l, from
// per-layer raw values (a micro-batch's in model_forward, the step's means
// in the trainer).
double model_aux_loss(const ModelConfig *c, const double *lb, const double *z, int n_moe);
// Backward of ce_scale * ce_sum + aux_scale * (lb_coef sum LB + z_coef sum Z);
// grads accumulate.
void model_backward(Model *m, float ce_scale, float aux_scale);
// One model chunk of a pipeline stage (the whole model is chunk 0 of one):
// the forward of its layers, from the embedding when it has it, else from
// model_chunk_input (which the caller filled: the previous stage's output),
// to model_chunk_output, or to the loss when it has the head; its step sums
// as in model_forward_async. model_forward_async runs every chunk in order.
void model_forward_chunk(Model *m, int chunk, uint64_t route_seed);
// Its backward: from the loss when it has the head, else from the grad of
// its output in dres (model_stage_dres, filled by the caller); leaves the
// grad of its input in dres. model_backward runs every chunk in reverse.
void model_backward_chunk(Model *m, int chunk, float ce_scale, float aux_scale);
// With defer_wgrad: the weight grads model_backward_chunk left out, for the
// slot in use (which keeps what they need until then).
void model_wgrad_chunk(Model *m, int chunk);
// fp8.wgrad: fp8 runs on the backend's FP8 weight-grad GEMM (1: fp8_wgrad
// is 2 and the backend's ops are there and take both expert shapes), else
// the fake quantiser and the compute-dtype weight-grad (0; also without
// fp8_wgrad).
int model_fp8_wgrad_gemm(const Model *m);
// Buffers of the slot in use [B*T, d_model] in the compute dtype.
void *model_chunk_input(Model *m, int chunk);
void *model_chunk_output(Model *m, int chunk);
void *model_stage_dres(Model *m);
// Copies dres into the slot's grad_out and returns it (the send stays valid
// while other micro-batches run their backward).
void *model_stage_grad_out(Model *m);
// Host counts of one chunk's forward (as model_count_micro_batch for the
// whole model): the routed rows of its MoE layers; the tokens with the last chunk.
void model_count_chunk(Model *m, int chunk);
// Aux-loss-free bias update from the step's counts (no-op when disabled).
void model_end_step(Model *m);

// 1 when backward recomputes block l (recompute = 3, layers).
int model_recomputes_layer(const Model *m, int l);

// Matmul parameters a token touches (attention, router, top-k + shared
// experts, dense MLPs, LM head; not the embedding), for the FLOP count.
double model_active_matmul_params(const ModelConfig *c);
