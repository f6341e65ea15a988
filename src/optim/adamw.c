#include "optim/adamw.h"

#include <math.h>
#include <string.h>

#include "util/check.h"

void adamw_init_range(AdamW *o, const OptimConfig *cfg, const ParamStore *s, const size_t *begin,
                      const size_t *end) {
    memset(o, 0, sizeof(*o));
    o->cfg = *cfg;
    for (int c = 0; c < N_CLASSES; c++) {
        // the range's FP32 main weights must be held (params/store.h)
        if (begin[c] < s->main_begin[c] || end[c] > s->main_end[c] || begin[c] > end[c])
            die("adamw_init_range: class %d range %zu..%zu outside the main weights held (%zu..%zu)", c, begin[c],
                end[c], s->main_begin[c], s->main_end[c]);
        o->begin[c] = begin[c];
        o->end[c] = end[c];
        o->m[c] = s->ops->alloc((end[c] - begin[c]) * sizeof(float) + 4);
        o->v[c] = s->ops->alloc((end[c] - begin[c]) * sizeof(float) + 4);
        // the first update reads them (backend memory starts undefined)
        s->ops->zero(o->m[c], (end[c] - begin[c]) * sizeof(float));
        s->ops->zero(o->v[c], (end[c] - begin[c]) * sizeof(float));
    }
    o->ops = s->ops;
}

void adamw_init(AdamW *o, const OptimConfig *cfg, const ParamStore *s) {
    size_t begin[N_CLASSES] = {0}, end[N_CLASSES];
    for (int c = 0; c < N_CLASSES; c++) end[c] = s->table.class_numel[c];
    adamw_init_range(o, cfg, s, begin, end);
}

void adamw_free(AdamW *o) {
    for (int c = 0; c < N_CLASSES; c++) { o->ops->free(o->m[c]); o->ops->free(o->v[c]); }
    memset(o, 0, sizeof(*o));
}

int adamw_decays(const OptimConfig *c, const ParamEntry *e) {
    if (e->kind == PARAM_NORM) return c->decay_norms;
    if (e->kind == PARAM_EMBEDDING) return c->decay_embeddings;
    return 1;
}

void adamw_step_grads(AdamW *o, ParamStore *s, float *const *grads, float lr, float grad_scale) {
    o->t++;
    const OptimConfig *c = &o->cfg;
    for (int i = 0; i < s->table.n; i++) {
        const ParamEntry *e = &s->table.entries[i];
        int k = e->cls;
        // the part of this tensor inside the optimizer's range
        size_t lo = e->offset > o->begin[k] ? e->offset : o->begin[k];
        size_t hi = e->offset + e->numel < o->end[k] ? e->offset + e->numel : o->end[k];
        if (hi <= lo) continue;
        float wd = adamw_decays(c, e) ? c->weight_decay : 0.0f;
        size_t r = lo - o->begin[k];
        void *act = s->wact[k] ? (char *)s->wact[k] + lo * s->ops->act_bytes : NULL; // NULL: dropped (store.h)
        ParamFp8Copy *f = s->fp8 ? &s->fp8[i] : NULL;
        float *p = s->params[k] + (lo - s->main_begin[k]);
        if (f && f->q && lo == e->offset && hi == e->offset + e->numel && s->ops->adamw_update_fp8 &&
            (!act || act == (void *)p)) {
            // the whole tensor, with its FP8 copies in the same pass (store.h)
            s->ops->adamw_update_fp8(p, grads[k] + r, o->m[k] + r, o->v[k] + r,
                                     lr, c->beta1, c->beta2, c->eps, wd, grad_scale, o->t, f->q, f->s, f->qt, f->st,
                                     f->ldt, f->col0, f->E, f->M, f->K);
            f->fresh = 1;
            continue;
        }
        s->ops->adamw_update(p, act, grads[k] + r, o->m[k] + r, o->v[k] + r, hi - lo,
                             lr, c->beta1, c->beta2, c->eps, wd, grad_scale, o->t);
    }
}

void adamw_step(AdamW *o, ParamStore *s, float lr, float grad_scale) {
    float *g[N_CLASSES];
    for (int c = 0; c < N_CLASSES; c++) g[c] = s->grads[c] + o->begin[c];
    adamw_step_grads(o, s, g, lr, grad_scale);
}

