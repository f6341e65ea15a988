#include "params/store.h"

#include <string.h>

void param_store_init(ParamStore *s, const ModelConfig *cfg, const Ops *ops, int ep_rank, int ep_size,
                      ParamLayout *layout) {
    memset(s, 0, sizeof(*s));
    s->ops = ops;
    param_layout_build(&s->table, layout, cfg, ep_rank, ep_size);
    for (int c = 0; c < N_CLASSES; c++) {
        size_t n = s->table.class_numel[c];
        s->params[c] = ops->alloc(n * sizeof(float) + 4);
        s->grads[c] = ops->alloc(n * sizeof(float) + 4);
        // with an FP32 compute dtype the main weights are the compute weights
        s->wact[c] = ops->act_bytes == sizeof(float) ? (void *)s->params[c] : ops->alloc(n * ops->act_bytes + 4);
    }
    s->router_bias = ops->alloc(((size_t)layout->n_moe + 1) * cfg->n_experts * sizeof(float) + 4);
}

void param_store_free(ParamStore *s) {
    const Ops *ops = s->ops;
    for (int c = 0; c < N_CLASSES; c++) {
        if (s->wact[c] != (void *)s->params[c]) ops->free(s->wact[c]);
        ops->free(s->params[c]);
        ops->free(s->grads[c]);
    }
    ops->free(s->router_bias);
    param_table_free(&s->table);
    memset(s, 0, sizeof(*s));
}

float *param_store_main(const ParamStore *s, int idx) {
    const ParamEntry *e = &s->table.entries[idx];
    return s->params[e->cls] + e->offset;
}

void *param_store_weight(const ParamStore *s, int idx) {
    const ParamEntry *e = &s->table.entries[idx];
    return (char *)s->wact[e->cls] + e->offset * s->ops->act_bytes;
}

float *param_store_grad(const ParamStore *s, int idx) {
    const ParamEntry *e = &s->table.entries[idx];
    return s->grads[e->cls] + e->offset;
}

void param_store_sync_weights(ParamStore *s) {
    for (int c = 0; c < N_CLASSES; c++) s->ops->cast_to_act(s->wact[c], s->params[c], s->table.class_numel[c]);
}
