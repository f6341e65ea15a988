// The parameter store (DESIGN.md §4): a model's parameter table and, per
// shard class, one flat buffer each of FP32 main weights, compute weights
// and FP32 grads, in the backend's memory. The model owns it and lends it to
// what works on parameters without running the model: DDP reduces the
// grads, AdamW updates the weights, checkpoints save and load them.
#pragma once
#include <stddef.h>

#include "config/model_config.h"
#include "ops/ops.h"
#include "params/layout.h"
#include "params/params.h"

// Called during backward when the grads of table entries [first, end) are
// final for this micro-batch (top of the model first); DDP starts bucket
// reductions from it during the last micro-batch.
typedef void (*GradsReadyFn)(void *ctx, int first_entry, int end_entry);

typedef struct {
    ParamTable table;
    const Ops *ops;                   // the backend that holds the buffers
    float *params[N_CLASSES];         // FP32 main weights
    void *wact[N_CLASSES];            // compute weights (the same buffer when they are FP32)
    float *grads[N_CLASSES];          // FP32, accumulated over micro-batches
    // The aux-loss-free router bias [MoE layers, n_experts]: not a parameter
    // (the model updates it, the optimizer does not) but saved with them.
    float *router_bias;
    GradsReadyFn grads_ready;         // optional backward hook
    void *grads_ready_ctx;
} ParamStore;

// Lays out cfg (validated) for expert-parallel rank ep_rank of ep_size into
// s->table and *layout (params/layout.h), and allocates every buffer, zeroed.
void param_store_init(ParamStore *s, const ModelConfig *cfg, const Ops *ops, int ep_rank, int ep_size,
                      ParamLayout *layout);
void param_store_free(ParamStore *s);

float *param_store_main(const ParamStore *s, int idx);    // FP32 main weights of entry idx
void *param_store_weight(const ParamStore *s, int idx);   // its compute weights
float *param_store_grad(const ParamStore *s, int idx);
// After the main weights changed outside the optimizer (init, load): refresh
// the compute weights.
void param_store_sync_weights(ParamStore *s);
