// The optimizer's settings: the `optim:` section of a run config (its keys
// are in config.c's table), read by the optimizer in src/optim/.
#pragma once

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    int decay_norms, decay_embeddings;
} OptimConfig;

static inline void optim_config_defaults(OptimConfig *c) {
    c->lr = 4e-4f;
    c->beta1 = 0.9f;
    c->beta2 = 0.95f;
    c->eps = 1e-8f;
    c->weight_decay = 0.1f;
    c->decay_norms = 0;
    c->decay_embeddings = 0;
}
