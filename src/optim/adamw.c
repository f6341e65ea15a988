#include "optim/adamw.h"

#include <math.h>
#include <string.h>

#include "util/check.h"

void optim_config_defaults(OptimConfig *c) {
    c->lr = 4e-4f;
    c->beta1 = 0.9f;
    c->beta2 = 0.95f;
    c->eps = 1e-8f;
    c->weight_decay = 0.1f;
    c->decay_norms = 0;
    c->decay_embeddings = 0;
}

void adamw_init(AdamW *o, const OptimConfig *cfg, const Model *model) {
    memset(o, 0, sizeof(*o));
    o->cfg = *cfg;
    for (int c = 0; c < N_CLASSES; c++) {
        o->m[c] = mallocCheck(model->table.class_numel[c] * sizeof(float));
        o->v[c] = mallocCheck(model->table.class_numel[c] * sizeof(float));
    }
}

void adamw_free(AdamW *o) {
    for (int c = 0; c < N_CLASSES; c++) { free(o->m[c]); free(o->v[c]); }
    memset(o, 0, sizeof(*o));
}

int adamw_decays(const OptimConfig *c, const ParamEntry *e) {
    if (e->kind == PARAM_NORM) return c->decay_norms;
    if (e->kind == PARAM_EMBEDDING) return c->decay_embeddings;
    return 1;
}

void adamw_step(AdamW *o, Model *model, float lr, float grad_scale) {
    o->t++;
    const OptimConfig *c = &o->cfg;
    for (int i = 0; i < model->table.n; i++) {
        const ParamEntry *e = &model->table.entries[i];
        float wd = adamw_decays(c, e) ? c->weight_decay : 0.0f;
        model->ops->adamw_update(model->params[e->cls] + e->offset, model->grads[e->cls] + e->offset,
                                 o->m[e->cls] + e->offset, o->v[e->cls] + e->offset, e->numel, lr,
                                 c->beta1, c->beta2, c->eps, wd, grad_scale, o->t);
    }
}

double grad_norm(const Model *model) {
    double s = 0;
    for (int c = 0; c < N_CLASSES; c++) s += model->ops->sum_squares(model->grads[c], model->table.class_numel[c]);
    return sqrt(s);
}
