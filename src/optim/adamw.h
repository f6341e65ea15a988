// AdamW over the flat buffers of a parameter store: FP32 moments per shard
// class, decoupled weight decay, bias correction (torch.optim.AdamW's
// arithmetic). Norm weights and the embedding are not decayed unless asked.
#pragma once
#include "config/optim_config.h"
#include "params/store.h"

// The optimizer updates elements [begin, end) of each class buffer: the
// whole buffer, or with the distributed optimizer this rank's shard; the
// moments exist for that range only, and the store must hold its main
// weights (params/store.h).
typedef struct {
    OptimConfig cfg;
    size_t begin[N_CLASSES], end[N_CLASSES];
    float *m[N_CLASSES], *v[N_CLASSES];   // [end - begin], backend memory
    int t;  // steps taken
    const Ops *ops;
} AdamW;

void adamw_init(AdamW *o, const OptimConfig *cfg, const ParamStore *s);
void adamw_init_range(AdamW *o, const OptimConfig *cfg, const ParamStore *s, const size_t *begin,
                      const size_t *end);
void adamw_free(AdamW *o);
// Whether a tensor is decayed under these rules.
int adamw_decays(const OptimConfig *c, const ParamEntry *e);
// One step at learning rate lr; grads are multiplied by grad_scale first.
// adamw_step reads the store's grads; adamw_step_grads reads grads[c][i -
// begin[c]] (a reduced shard).
void adamw_step(AdamW *o, ParamStore *s, float lr, float grad_scale);
void adamw_step_grads(AdamW *o, ParamStore *s, float *const *grads, float lr, float grad_scale);
