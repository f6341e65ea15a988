#include "train/memory.h"

#include <stdlib.h>
#include <string.h>

#include "dist/ddp.h"
#include "params/params.h"
#include "params/layout.h"
#include "util/check.h"

int memory_plan(MemoryPlan *p, const ModelConfig *cfg, const MemoryLayout *l, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    if (l->dp < 1 || l->ep < 1 || l->ep_dp < 1 || l->dp_rank < 0 || l->dp_rank >= l->dp || l->ep_dp_rank < 0 ||
        l->ep_dp_rank >= l->ep_dp)
        FAIL("memory plan: bad layout (dp %d rank %d, ep %d, ep_dp %d rank %d)", l->dp, l->dp_rank, l->ep, l->ep_dp,
             l->ep_dp_rank);
    if (cfg->n_experts % l->ep) FAIL("memory plan: ep %d does not divide model.n_experts %d", l->ep, cfg->n_experts);
    ParamTable t;
    if (param_table_for_config(cfg, &t, err, errlen)) return -1;
    if (l->stage) { // the stage's tensors (the config is valid: its table was built)
        ParamLayout lay;
        param_table_free(&t);
        memset(&t, 0, sizeof t);
        param_layout_build_stage(&t, &lay, cfg, 0, 1, l->stage);
        free(lay.layers);
    }
    p->dense = t.class_numel[CLASS_DENSE];
    // every expert tensor is [E, ...]: ep divides it exactly
    p->expert = t.class_numel[CLASS_EXPERT] / l->ep;
    param_table_free(&t);

    // the optimizer's range: the rank's shard of its group, as DDP cuts it
    p->dense_div = l->sharded ? l->dp : 1;
    p->expert_div = l->sharded ? l->ep_dp : 1;
    size_t b, e;
    ddp_shard_range(p->dense, p->dense_div, l->sharded ? l->dp_rank : 0, &b, &e);
    p->dense_opt = e - b;
    ddp_shard_range(p->expert, p->expert_div, l->sharded ? l->ep_dp_rank : 0, &b, &e);
    p->expert_opt = e - b;
    // FP32 compute weights are the main weights; else the main weights are
    // the optimizer's range (params/store.h)
    int shared = l->act_bytes == sizeof(float);
    p->dense_main = shared ? 0 : p->dense_opt;
    p->expert_main = shared ? 0 : p->expert_opt;

    size_t held = p->dense + p->expert;
    p->compute_weights = held * l->act_bytes;
    p->grads = held * sizeof(float);
    p->main_weights = (p->dense_main + p->expert_main) * sizeof(float);
    p->moments = (p->dense_opt + p->expert_opt) * 2 * sizeof(float);
    p->comm = l->sharded ? (p->dense_opt + p->expert_opt) * sizeof(float) : 0;
    p->arena = l->arena_bytes;
    p->dispatch = l->dispatch_bytes;
    p->other = (size_t)model_moe_layers(cfg) * cfg->n_experts * sizeof(float);
    return 0;
}

void memory_plan_fp8(MemoryPlan *p, const ModelConfig *cfg, const MemoryLayout *l) {
    if (!p->expert) return;
    // 1 B per expert weight + an FP32 scale per 128x128 block of each expert tensor
    size_t blocks = ((size_t)cfg->d_model + 127) / 128 * (((size_t)cfg->expert_hidden + 127) / 128);
    p->fp8_weights = p->expert + (size_t)model_moe_layers(cfg) * 3 * (cfg->n_experts / l->ep) * blocks * sizeof(float);
    if (l->act_bytes != sizeof(float)) p->compute_weights -= p->expert * l->act_bytes;
}

double memory_bytes_per_param(const MemoryPlan *p) {
    size_t held = p->dense + p->expert;
    return held ? (double)(p->compute_weights + p->fp8_weights + p->grads + p->main_weights + p->moments) / held : 0;
}

size_t memory_total(const MemoryPlan *p) {
    return p->compute_weights + p->grads + p->main_weights + p->moments + p->comm + p->arena + p->dispatch + p->other +
           p->fp8_weights;
}

void memory_print(FILE *f, int rank, const MemoryPlan *p) {
    char main_note[64] = "";
    if (p->main_weights == 0 && p->dense + p->expert > 0) snprintf(main_note, sizeof main_note, " (the FP32 compute weights)");
    char arena[128];
    if (p->arena) snprintf(arena, sizeof arena, "%zu B", p->arena);
    else snprintf(arena, sizeof arena, "unknown");
    if (p->dispatch) snprintf(arena + strlen(arena), sizeof arena - strlen(arena), ", expert dispatch %zu B", p->dispatch);
    if (p->fp8_weights) snprintf(arena + strlen(arena), sizeof arena - strlen(arena), ", FP8 expert weights %zu B", p->fp8_weights);
    fprintf(f, "rank %d: memory: %zu dense + %zu expert parameters; compute weights %zu B, grads %zu B, "
               "main weights %zu B%s, moments %zu B (1/%d of dense, 1/%d of expert), comm buffers %zu B, "
               "activations %s, router bias %zu B; %.4f B/param (weights + grads + main + moments), %.2f MiB in all\n",
            rank, p->dense, p->expert, p->compute_weights, p->grads, p->main_weights, main_note, p->moments, p->dense_div,
            p->expert_div, p->comm, arena, p->other, memory_bytes_per_param(p), memory_total(p) / 1048576.0);
}
