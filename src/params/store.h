// The parameter store (DESIGN.md §4): a model's parameter table and, per
// shard class, one flat buffer each of FP32 main weights, compute weights
// and FP32 grads, in the backend's memory. The model owns it and lends it to
// what works on parameters without running the model: DDP reduces the
// grads, AdamW updates the weights, checkpoints save and load them.
//
// Compute weights and grads always cover the whole class buffer. The FP32
// main weights cover elements [main_begin, main_end) of it: everything,
// except with the distributed optimizer on a backend whose compute weights
// are a separate (BF16) copy, where a rank keeps main weights only for its
// optimizer shard (param_store_shard_main) and the other ranks' updates
// arrive as compute weights. When the compute dtype is FP32 (the CPU) the
// main weights are the compute weights and stay whole.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "config/model_config.h"
#include "ops/ops.h"
#include "params/layout.h"
#include "params/params.h"

// Called during backward when the grads of table entries [first, end) are
// final for this micro-batch (top of the model first); DDP starts bucket
// reductions from it during the last micro-batch.
typedef void (*GradsReadyFn)(void *ctx, int first_entry, int end_entry);

// An entry's FP8 copies (train.precision: fp8, the expert weights): the
// arguments of ops->fp8_quantize_weights for its main weights [E, M, K],
// and whether the last AdamW step wrote them (fresh).
typedef struct {
    uint8_t *q, *qt;
    float *s, *st;
    int ldt, col0, E, M, K;
    int fresh;
} ParamFp8Copy;

typedef struct {
    ParamTable table;
    const Ops *ops;                   // the backend that holds the buffers
    float *params[N_CLASSES];         // FP32 main weights: params[c][i - main_begin[c]]
    size_t main_begin[N_CLASSES], main_end[N_CLASSES];
    void *wact[N_CLASSES];            // compute weights (the same buffer when they are FP32)
    float *grads[N_CLASSES];          // FP32, accumulated over micro-batches
    // The aux-loss-free router bias [MoE layers, n_experts]: not a parameter
    // (the model updates it, the optimizer does not) but saved with them.
    float *router_bias;
    GradsReadyFn grads_ready;         // optional backward hook
    void *grads_ready_ctx;
    float *stage;                     // FP32 backend scratch of param_store_write (lazy)
    // FP8 copies the optimizer writes (train.precision: fp8; a host array of
    // table.n, NULL without): where fp8[i].q is set and AdamW updates all of
    // entry i, ops->adamw_update_fp8 writes its copies in the update's pass
    // and sets fp8[i].fresh; the model's refresh skips such an entry once
    // (and clears the mark) instead of quantising it again.
    ParamFp8Copy *fp8;
} ParamStore;

// Lays out cfg (validated) for expert-parallel rank ep_rank of ep_size into
// s->table and *layout (params/layout.h), and allocates every buffer, zeroed.
void param_store_init(ParamStore *s, const ModelConfig *cfg, const Ops *ops, int ep_rank, int ep_size,
                      ParamLayout *layout);
// The same for the tensors of pipeline stage st only (params/layout.h; NULL: all).
void param_store_init_stage(ParamStore *s, const ModelConfig *cfg, const Ops *ops, int ep_rank, int ep_size,
                            const ParamStage *st, ParamLayout *layout);
void param_store_free(ParamStore *s);

// FP32 main weights of entry idx; the store must hold all of them (it dies
// naming the tensor otherwise: a sharded store has only its shard).
float *param_store_main(const ParamStore *s, int idx);
void *param_store_weight(const ParamStore *s, int idx);   // its compute weights
float *param_store_grad(const ParamStore *s, int idx);
// Frees the separate compute weights of class cls (a no-op when they are the
// FP32 main weights): their users read another copy (train.precision: fp8,
// the experts' FP8 weights). param_store_weight then returns NULL for the
// class; syncs, writes and the optimizer skip it.
void param_store_drop_act(ParamStore *s, int cls);
// After the main weights changed outside the optimizer: refresh the compute
// weights of the elements whose main weights are held.
void param_store_sync_weights(ParamStore *s);
// Keeps FP32 main weights only for elements [begin[c], end[c]) of each class
// (the values held there stay); a no-op when the compute weights are the
// main weights. The range must lie inside what is held.
void param_store_shard_main(ParamStore *s, const size_t *begin, const size_t *end);
int param_store_main_is_whole(const ParamStore *s);
// Sets elements [lo, lo + n) of class buffer cls to the FP32 values src (host
// memory): the main weights where held, the compute weights everywhere
// (through a fixed-size backend scratch where there is no main weight).
void param_store_write(ParamStore *s, int cls, size_t lo, const float *src, size_t n);
