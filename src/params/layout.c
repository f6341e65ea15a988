#include "params/layout.h"

#include <stdio.h>
#include <string.h>

#include "util/check.h"

static int add(ParamTable *t, int cls, int kind, const char *fmt, int layer, int ndim, int64_t d0,
               int64_t d1, int64_t d2) {
    char name[PARAM_NAME_MAX];
    snprintf(name, sizeof name, fmt, layer);
    int64_t shape[3] = {d0, d1, d2};
    return param_add(t, name, cls, kind, ndim, shape);
}
#define DENSE(fmt, l, ...) add(t, CLASS_DENSE, PARAM_MATRIX, fmt, l, __VA_ARGS__)
#define NORM(fmt, l, d) add(t, CLASS_DENSE, PARAM_NORM, fmt, l, 1, d, 0, 0)

void param_layout_build(ParamTable *t, ParamLayout *lay, const ModelConfig *c, int ep_rank, int ep_size) {
    int D = c->d_model, qd = model_q_dim(c), kvd = model_kv_dim(c);
    int pre = c->norm != NORM_POST, post = c->norm != NORM_PRE;
    lay->embed = add(t, CLASS_DENSE, PARAM_EMBEDDING, "embed", 0, 2, c->padded_vocab, D, 0);
    lay->layers = mallocCheck(c->n_layers * sizeof(LayerParams));
    lay->n_moe = 0;
    for (int l = 0; l < c->n_layers; l++) {
        LayerParams *L = &lay->layers[l];
        memset(L, -1, sizeof(*L));
        L->first_entry = t->n;
        if (pre) L->attn_norm = NORM("layers.%d.attn_norm", l, D);
        L->wq = DENSE("layers.%d.attn.wq", l, 2, qd, D, 0);
        L->wk = DENSE("layers.%d.attn.wk", l, 2, kvd, D, 0);
        L->wv = DENSE("layers.%d.attn.wv", l, 2, kvd, D, 0);
        L->wo = DENSE("layers.%d.attn.wo", l, 2, D, qd, 0);
        if (c->qk_norm == QKNORM_FULL) {
            L->q_norm = NORM("layers.%d.attn.q_norm", l, qd);
            L->k_norm = NORM("layers.%d.attn.k_norm", l, kvd);
        } else if (c->qk_norm == QKNORM_HEAD) {
            L->q_norm = NORM("layers.%d.attn.q_norm", l, c->head_dim);
            L->k_norm = NORM("layers.%d.attn.k_norm", l, c->head_dim);
        }
        if (post) L->attn_post_norm = NORM("layers.%d.attn_post_norm", l, D);
        if (pre) L->ffn_norm = NORM("layers.%d.ffn_norm", l, D);
        if (!model_is_moe_layer(c, l)) {
            int F = c->dense_hidden;
            L->mlp_gate = DENSE("layers.%d.mlp.w_gate", l, 2, F, D, 0);
            L->mlp_up = DENSE("layers.%d.mlp.w_up", l, 2, F, D, 0);
            L->mlp_down = DENSE("layers.%d.mlp.w_down", l, 2, D, F, 0);
        } else {
            int E = c->n_experts, El = E / ep_size, Fe = c->expert_hidden;
            L->moe_index = lay->n_moe++;
            L->router = DENSE("layers.%d.moe.router", l, 2, E, D, 0);
            // this rank's slice of the [E, ...] expert tensors
            L->exp_gate = add(t, CLASS_EXPERT, PARAM_MATRIX, "layers.%d.moe.experts.w_gate", l, 3, El, Fe, D);
            L->exp_up = add(t, CLASS_EXPERT, PARAM_MATRIX, "layers.%d.moe.experts.w_up", l, 3, El, Fe, D);
            L->exp_down = add(t, CLASS_EXPERT, PARAM_MATRIX, "layers.%d.moe.experts.w_down", l, 3, El, D, Fe);
            for (int i = L->exp_gate; i <= L->exp_down; i++) {
                t->entries[i].global_shape[0] = E;
                t->entries[i].slice0 = (int64_t)ep_rank * El;
            }
            if (c->n_shared > 0) {
                int Fs = c->n_shared * c->shared_hidden;
                L->sh_gate = DENSE("layers.%d.moe.shared.w_gate", l, 2, Fs, D, 0);
                L->sh_up = DENSE("layers.%d.moe.shared.w_up", l, 2, Fs, D, 0);
                L->sh_down = DENSE("layers.%d.moe.shared.w_down", l, 2, D, Fs, 0);
            }
        }
        if (post) L->ffn_post_norm = NORM("layers.%d.ffn_post_norm", l, D);
        L->end_entry = t->n;
    }
    lay->final_norm = NORM("final_norm", 0, D);
    lay->lm_head = DENSE("lm_head", 0, 2, c->padded_vocab, D, 0);
}

ParamStage param_stage_all(const ModelConfig *cfg) {
    ParamStage s = {.n_chunks = 1, .embed = 1, .head = 1};
    s.begin[0] = 0;
    s.end[0] = cfg->n_layers;
    return s;
}

int param_stage_chunk_of(const ParamStage *st, int l) {
    for (int c = 0; c < st->n_chunks; c++)
        if (l >= st->begin[c] && l < st->end[c]) return c;
    return -1;
}

void param_layout_build_stage(ParamTable *t, ParamLayout *lay, const ModelConfig *cfg, int ep_rank, int ep_size,
                              const ParamStage *st) {
    if (!st) { param_layout_build(t, lay, cfg, ep_rank, ep_size); return; }
    // lay out the whole model, then keep what the stage holds, in order
    ParamTable full;
    memset(&full, 0, sizeof full);
    param_layout_build(&full, lay, cfg, ep_rank, ep_size);
    int *local = mallocCheck(((size_t)full.n + 1) * sizeof(int));
    for (int i = 0; i < full.n; i++) {
        int l = -1;
        for (int j = 0; j < cfg->n_layers && l < 0; j++)
            if (i >= lay->layers[j].first_entry && i < lay->layers[j].end_entry) l = j;
        int held = l >= 0 ? param_stage_chunk_of(st, l) >= 0
                          : (i == lay->embed ? st->embed : st->head); // outside the layers: embed, final norm, head
        local[i] = -1;
        if (!held) continue;
        const ParamEntry *e = &full.entries[i];
        int k = param_add(t, e->name, e->cls, e->kind, e->ndim, e->shape);
        ParamEntry *n = &t->entries[k];
        memcpy(n->global_shape, e->global_shape, sizeof n->global_shape);
        n->slice0 = e->slice0;
        n->global_index = i;
        local[i] = k;
    }
#define REMAP(x) ((x) = (x) >= 0 ? local[x] : -1)
    for (int j = 0; j < cfg->n_layers; j++) {
        LayerParams *L = &lay->layers[j];
        int held = param_stage_chunk_of(st, j) >= 0, first = L->first_entry, end = L->end_entry;
        int *f = &L->attn_norm, n = (int)((&L->moe_index) - f); // the tensor indices precede moe_index
        for (int q = 0; q < n; q++) REMAP(f[q]);
        L->first_entry = L->end_entry = 0;
        if (held && end > first) { L->first_entry = local[first]; L->end_entry = local[end - 1] + 1; }
    }
    REMAP(lay->embed);
    REMAP(lay->final_norm);
    REMAP(lay->lm_head);
#undef REMAP
    free(local);
    param_table_free(&full);
}

int param_table_for_config(const ModelConfig *cfg, ParamTable *t, char *err, size_t errlen) {
    ModelConfig c = *cfg;
    if (model_config_validate(&c, err, errlen)) return -1;
    ParamLayout lay;
    memset(t, 0, sizeof *t);
    param_layout_build(t, &lay, &c, 0, 1);
    free(lay.layers);
    return 0;
}
