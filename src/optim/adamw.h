// AdamW over the model's flat parameter buffers: FP32 moments per shard
// class, decoupled weight decay, bias correction (torch.optim.AdamW's
// arithmetic). Norm weights and the embedding are not decayed unless asked.
#pragma once
#include "model/model.h"

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    int decay_norms, decay_embeddings;
} OptimConfig;

// The optimizer updates elements [begin, end) of each class buffer: the
// whole buffer, or with the distributed optimizer this rank's shard; the
// moments exist for that range only.
typedef struct {
    OptimConfig cfg;
    size_t begin[N_CLASSES], end[N_CLASSES];
    float *m[N_CLASSES], *v[N_CLASSES];   // [end - begin], backend memory
    int t;  // steps taken
    const Ops *ops;
} AdamW;

void optim_config_defaults(OptimConfig *c);
void adamw_init(AdamW *o, const OptimConfig *cfg, const Model *model);
void adamw_init_range(AdamW *o, const OptimConfig *cfg, const Model *model, const size_t *begin,
                      const size_t *end);
void adamw_free(AdamW *o);
// Whether a tensor is decayed under these rules.
int adamw_decays(const OptimConfig *c, const ParamEntry *e);
// One step at learning rate lr; grads are multiplied by grad_scale first.
// adamw_step reads the model's grads; adamw_step_grads reads grads[c][i -
// begin[c]] (a reduced shard).
void adamw_step(AdamW *o, Model *model, float lr, float grad_scale);
void adamw_step_grads(AdamW *o, Model *model, float *const *grads, float lr, float grad_scale);
