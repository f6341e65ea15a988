// AdamW over the model's flat parameter buffers: FP32 moments per shard
// class, decoupled weight decay, bias correction (torch.optim.AdamW's
// arithmetic). Norm weights and the embedding are not decayed unless asked.
#pragma once
#include "model/model.h"

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    int decay_norms, decay_embeddings;
} OptimConfig;

typedef struct {
    OptimConfig cfg;
    float *m[N_CLASSES], *v[N_CLASSES];
    int t;  // steps taken
} AdamW;

void optim_config_defaults(OptimConfig *c);
void adamw_init(AdamW *o, const OptimConfig *cfg, const Model *model);
void adamw_free(AdamW *o);
// Whether a tensor is decayed under these rules.
int adamw_decays(const OptimConfig *c, const ParamEntry *e);
// One step at learning rate lr; grads are multiplied by grad_scale first.
void adamw_step(AdamW *o, Model *model, float lr, float grad_scale);
// Global L2 norm of all grads.
double grad_norm(const Model *model);
