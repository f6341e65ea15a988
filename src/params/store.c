#include "params/store.h"

#include <stdlib.h>
#include <string.h>

#include "util/check.h"

// param_store_write stages compute weights that have no main weight through
// a backend FP32 buffer of this many elements (4 MiB).
#define STORE_STAGE_FLOATS ((size_t)1 << 20)

void param_store_init(ParamStore *s, const ModelConfig *cfg, const Ops *ops, int ep_rank, int ep_size,
                      ParamLayout *layout) {
    param_store_init_stage(s, cfg, ops, ep_rank, ep_size, NULL, layout);
}

void param_store_init_stage(ParamStore *s, const ModelConfig *cfg, const Ops *ops, int ep_rank, int ep_size,
                            const ParamStage *st, ParamLayout *layout) {
    memset(s, 0, sizeof(*s));
    s->ops = ops;
    param_layout_build_stage(&s->table, layout, cfg, ep_rank, ep_size, st);
    for (int c = 0; c < N_CLASSES; c++) {
        size_t n = s->table.class_numel[c];
        s->params[c] = ops->alloc(n * sizeof(float) + 4);
        s->main_begin[c] = 0;
        s->main_end[c] = n;
        s->grads[c] = ops->alloc(n * sizeof(float) + 4);
        // with an FP32 compute dtype the main weights are the compute weights
        s->wact[c] = ops->act_bytes == sizeof(float) ? (void *)s->params[c] : ops->alloc(n * ops->act_bytes + 4);
    }
    size_t nb = ((size_t)layout->n_moe + 1) * cfg->n_experts * sizeof(float) + 4;
    s->router_bias = ops->alloc(nb);
    ops->zero(s->router_bias, nb); // routing reads it (aux_free_rate > 0) and checkpoints save it from the start
}

void param_store_free(ParamStore *s) {
    const Ops *ops = s->ops;
    for (int c = 0; c < N_CLASSES; c++) {
        if (s->wact[c] && s->wact[c] != (void *)s->params[c]) ops->free(s->wact[c]);
        ops->free(s->params[c]);
        ops->free(s->grads[c]);
    }
    if (s->stage) ops->free(s->stage);
    ops->free(s->router_bias);
    free(s->fp8);
    param_table_free(&s->table);
    memset(s, 0, sizeof(*s));
}

float *param_store_main(const ParamStore *s, int idx) {
    const ParamEntry *e = &s->table.entries[idx];
    if (e->offset < s->main_begin[e->cls] || e->offset + e->numel > s->main_end[e->cls])
        die("param_store_main: the FP32 main weights of %s (elements %zu..%zu of its class buffer) are not held "
            "here (this rank keeps %zu..%zu: the distributed optimizer's shard)", e->name, e->offset,
            e->offset + e->numel, s->main_begin[e->cls], s->main_end[e->cls]);
    return s->params[e->cls] + (e->offset - s->main_begin[e->cls]);
}

void *param_store_weight(const ParamStore *s, int idx) {
    const ParamEntry *e = &s->table.entries[idx];
    return s->wact[e->cls] ? (char *)s->wact[e->cls] + e->offset * s->ops->act_bytes : NULL;
}

void param_store_drop_act(ParamStore *s, int cls) {
    if (!s->wact[cls] || s->wact[cls] == (void *)s->params[cls]) return;
    s->ops->free(s->wact[cls]);
    s->wact[cls] = NULL;
}

float *param_store_grad(const ParamStore *s, int idx) {
    const ParamEntry *e = &s->table.entries[idx];
    return s->grads[e->cls] + e->offset;
}

static void *act_at(const ParamStore *s, int c, size_t i) { return (char *)s->wact[c] + i * s->ops->act_bytes; }

void param_store_sync_weights(ParamStore *s) {
    for (int c = 0; c < N_CLASSES; c++)
        if (s->wact[c]) s->ops->cast_to_act(act_at(s, c, s->main_begin[c]), s->params[c], s->main_end[c] - s->main_begin[c]);
}

int param_store_main_is_whole(const ParamStore *s) {
    for (int c = 0; c < N_CLASSES; c++)
        if (s->main_begin[c] != 0 || s->main_end[c] != s->table.class_numel[c]) return 0;
    return 1;
}

void param_store_shard_main(ParamStore *s, const size_t *begin, const size_t *end) {
    const Ops *ops = s->ops;
    for (int c = 0; c < N_CLASSES; c++) {
        if (s->wact[c] == (void *)s->params[c]) continue; // FP32 compute weights: they must stay whole
        if (begin[c] == s->main_begin[c] && end[c] == s->main_end[c]) continue;
        if (begin[c] < s->main_begin[c] || end[c] > s->main_end[c] || begin[c] > end[c])
            die("param_store_shard_main: class %d range %zu..%zu is not inside the main weights held (%zu..%zu)", c,
                begin[c], end[c], s->main_begin[c], s->main_end[c]);
        float *p = ops->alloc((end[c] - begin[c]) * sizeof(float) + 4);
        ops->copy_f32(p, s->params[c] + (begin[c] - s->main_begin[c]), end[c] - begin[c]);
        ops->free(s->params[c]);
        s->params[c] = p;
        s->main_begin[c] = begin[c];
        s->main_end[c] = end[c];
    }
}

// Compute weights [lo, lo + n) of class c from host FP32 src, through the
// backend scratch, one chunk at a time.
static void write_act_staged(ParamStore *s, int c, size_t lo, const float *src, size_t n) {
    const Ops *ops = s->ops;
    if (n && !s->stage) s->stage = ops->alloc(STORE_STAGE_FLOATS * sizeof(float));
    for (size_t done = 0; done < n; done += STORE_STAGE_FLOATS) {
        size_t k = n - done < STORE_STAGE_FLOATS ? n - done : STORE_STAGE_FLOATS;
        ops->to_device(s->stage, src + done, k * sizeof(float));
        ops->cast_to_act(act_at(s, c, lo + done), s->stage, k);
    }
}

void param_store_write(ParamStore *s, int c, size_t lo, const float *src, size_t n) {
    const Ops *ops = s->ops;
    size_t hi = lo + n;
    if (hi > s->table.class_numel[c])
        die("param_store_write: elements %zu..%zu beyond class %d's %zu", lo, hi, c, s->table.class_numel[c]);
    // the part with main weights: upload, then cast from them
    size_t a = lo > s->main_begin[c] ? lo : s->main_begin[c];
    size_t z = hi < s->main_end[c] ? hi : s->main_end[c];
    if (z > a) {
        ops->to_device(s->params[c] + (a - s->main_begin[c]), src + (a - lo), (z - a) * sizeof(float));
        if (s->wact[c] && s->wact[c] != (void *)s->params[c])
            ops->cast_to_act(act_at(s, c, a), s->params[c] + (a - s->main_begin[c]), z - a);
    }
    if (s->wact[c] == (void *)s->params[c]) return; // FP32: the main weights are whole, all written
    if (!s->wact[c]) return;                         // dropped (param_store_drop_act)
    // the parts without: compute weights only
    if (z <= a) {
        write_act_staged(s, c, lo, src, n);
        return;
    }
    write_act_staged(s, c, lo, src, a - lo);
    write_act_staged(s, c, z, src + (z - lo), hi - z);
}
