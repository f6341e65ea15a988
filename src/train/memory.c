#include "train/memory.h"

#include <stdlib.h>
#include <string.h>

#include "dist/ddp.h"
#include "dist/pp_schedule.h"
#include "params/params.h"
#include "params/layout.h"
#include "util/check.h"

// MoE layers of the layers held (a stage's, or all).
static int moe_layers_held(const ModelConfig *cfg, const ParamStage *st) {
    if (!st) return model_moe_layers(cfg);
    int n = 0;
    for (int ch = 0; ch < st->n_chunks; ch++)
        for (int l = st->begin[ch]; l < st->end[ch]; l++) n += model_is_moe_layer(cfg, l);
    return n;
}

// The small buffers of model_init_parallel (model.c) for nm = MoE layers + 1,
// and the router bias of the store (params/store.c), as they allocate them.
static size_t model_small_bytes(const ModelConfig *cfg, size_t nm) {
    size_t E = cfg->n_experts, counts = nm * E * sizeof(float) + 4;
    return counts * (cfg->lb_global ? 2 : 1) + 5 * nm * sizeof(float) + 2 * sizeof(double);
}
static size_t router_bias_bytes(const ModelConfig *cfg, size_t nm) { return nm * cfg->n_experts * sizeof(float) + 4; }

// Everything else a run allocates (MemoryLayout.ops): the arena and the
// symmetric memory from the same measuring carve model_alloc_slots runs,
// the model's and DDP's small buffers, the pipeline's send buffers, on a
// GPU the kernel workspaces and the stated context allowance; and the peak
// of setup (train.c setup_model: store, [ep > 1: the whole model drawn on
// the CPU], DDP with the main-weight shard copied out of the whole FP32
// weights, the moments, then the arena).
static int plan_run(MemoryPlan *p, const ModelConfig *cfg, const MemoryLayout *l, size_t held, char *err,
                    size_t errlen) {
    if (l->arena_bytes || l->dispatch_bytes) FAIL("memory plan: arena_bytes and dispatch_bytes come from ops");
    ModelArenaSpec a = l->act;
    a.stage = l->stage;
    a.ep = l->ep;
    ModelArenaSize sz;
    if (model_arena_plan(cfg, l->ops, &a, &sz, err, errlen)) return -1;
    p->arena = sz.arena_bytes;
    p->dispatch = sz.sym_bytes;
    p->slot_bytes = sz.slot_bytes;
    p->n_slots = a.n_slots > 0 ? a.n_slots : 1;
    size_t nm = (size_t)moe_layers_held(cfg, l->stage) + 1;
    int separate = l->act_bytes != sizeof(float);
    // the 4 bytes each backend allocation of a class buffer adds (store.c,
    // adamw.c, ddp.c), 2 classes
    size_t pads = 2 * 4 * (2 + separate) + 2 * 4 * 2 + (l->sharded ? 2 * 4 : 0);
    p->other = router_bias_bytes(cfg, nm);
    p->small = model_small_bytes(cfg, nm) + sizeof(double) + pads;
    // the grad norm's slots, where the last backward sums the expert grads'
    // squares (train.c: one pipeline stage, an expert data-parallel group of
    // one; counted also where fp8.wgrad: fp8's GEMM leaves them unused)
    if (ddp_norm_from_slots(l->pp, l->ep_dp) && !l->stage && l->ops->grouped_wgrad_sumsq && cfg->n_experts)
        p->small += model_wgrad_slots_for(cfg, cfg->n_experts / l->ep) * sizeof(double);
    size_t N = (size_t)a.B * a.T, R = N * cfg->top_k;
    if (l->pp > 1) p->pipe = (size_t)p->n_slots * N * cfg->d_model * l->act_bytes;
    if (l->gpu) {
        // cuBLASLt's 64 MiB (ops_cuda.cu), the radix sort's arrays and
        // temporary (dispatch.cu: about 8 ints per row), the router's BF16
        // logits (gemm.cu): an estimate from the code, stated as such
        p->workspace = ((size_t)64 << 20) + 32 * R + 2 * N * cfg->n_experts;
        p->context = l->context_bytes + (size_t)l->n_comms * l->nccl_bytes;
    }
    // setup's peaks
    size_t store_whole = held * (separate ? l->act_bytes : 0) + 2 * held * sizeof(float) + p->other + p->small;
    size_t setup = store_whole;
    if (!l->gpu && l->ep > 1) { // the whole model on the CPU beside the stage
        ParamTable t;
        if (param_table_for_config(cfg, &t, err, errlen)) return -1;
        size_t all = t.class_numel[CLASS_DENSE] + t.class_numel[CLASS_EXPERT];
        param_table_free(&t);
        size_t nm_all = (size_t)model_moe_layers(cfg) + 1;
        setup += 2 * all * sizeof(float) + router_bias_bytes(cfg, nm_all) + model_small_bytes(cfg, nm_all) + 2 * 2 * 4;
    }
    size_t late = store_whole; // the phases after the whole model (if any) is freed
    if (l->sharded && separate) { // the shard copied out of the whole main weights
        size_t at_shard = store_whole + p->comm + p->main_weights; // before the arena (train.c)
        if (at_shard > late) late = at_shard;
    }
    if (late > setup) setup = late;
    p->setup_late = late;
    p->setup_peak = setup + p->workspace + p->context;
    size_t steady = memory_total(p);
    p->peak = steady > p->setup_peak ? steady : p->setup_peak;
    return 0;
}

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
    p->tensors = t.n;
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
    return l->ops ? plan_run(p, cfg, l, held, err, errlen) : 0;
}

void memory_plan_fp8(MemoryPlan *p, const ModelConfig *cfg, const MemoryLayout *l) {
    if (!p->expert) return;
    // 1 B per expert weight + an FP32 scale per 128x128 block of each expert
    // tensor, twice: the forward's copy and the data-grads' transposed one
    size_t blocks = ((size_t)cfg->d_model + 127) / 128 * (((size_t)cfg->expert_hidden + 127) / 128);
    p->fp8_weights =
        2 * (p->expert + (size_t)model_moe_layers(cfg) * 3 * (cfg->n_experts / l->ep) * blocks * sizeof(float));
    if (l->act_bytes != sizeof(float)) p->compute_weights -= p->expert * l->act_bytes;
    // the dense ones: the allocation model_set_fp8_dense makes
    p->fp8_dense_weights = l->act.fp8_dense ? model_fp8_dense_bytes(cfg, l->stage) : 0;
    if (p->peak) { // the FP8 copies are made after the whole model is freed and before DDP (train.c)
        size_t late = p->setup_late + p->fp8_weights + p->fp8_dense_weights + p->workspace + p->context;
        if (late > p->setup_peak) p->setup_peak = late;
        size_t steady = memory_total(p);
        p->peak = steady > p->setup_peak ? steady : p->setup_peak;
    }
}

double memory_bytes_per_param(const MemoryPlan *p) {
    size_t held = p->dense + p->expert;
    return held ? (double)(p->compute_weights + p->fp8_weights + p->fp8_dense_weights + p->grads + p->main_weights +
                           p->moments) / held : 0;
}

size_t memory_total(const MemoryPlan *p) {
    return p->compute_weights + p->grads + p->main_weights + p->moments + p->comm + p->arena + p->dispatch + p->other +
           p->small + p->pipe + p->workspace + p->context + p->fp8_weights + p->fp8_dense_weights;
}

void memory_print(FILE *f, int rank, const MemoryPlan *p) {
    char main_note[64] = "";
    if (p->main_weights == 0 && p->dense + p->expert > 0) snprintf(main_note, sizeof main_note, " (the FP32 compute weights)");
    char arena[256];
    if (p->arena) snprintf(arena, sizeof arena, "%zu B", p->arena);
    else snprintf(arena, sizeof arena, "unknown");
    if (p->dispatch) snprintf(arena + strlen(arena), sizeof arena - strlen(arena), ", expert dispatch %zu B", p->dispatch);
    if (p->fp8_weights) snprintf(arena + strlen(arena), sizeof arena - strlen(arena), ", FP8 expert weights %zu B", p->fp8_weights);
    if (p->fp8_dense_weights)
        snprintf(arena + strlen(arena), sizeof arena - strlen(arena), ", FP8 dense weights %zu B", p->fp8_dense_weights);
    fprintf(f, "rank %d: memory: %zu dense + %zu expert parameters; compute weights %zu B, grads %zu B, "
               "main weights %zu B%s, moments %zu B (1/%d of dense, 1/%d of expert), comm buffers %zu B, "
               "activations %s, router bias %zu B; %.4f B/param (weights + grads + main + moments), %.2f MiB in all\n",
            rank, p->dense, p->expert, p->compute_weights, p->grads, p->main_weights, main_note, p->moments, p->dense_div,
            p->expert_div, p->comm, arena, p->other, memory_bytes_per_param(p), memory_total(p) / 1048576.0);
}

void memory_print_plan(FILE *f, int rank, const MemoryPlan *p) {
    const double M = 1048576.0;
    fprintf(f, "rank %d: memory plan (MiB): BF16/compute weights %.1f, FP32 grads %.1f, FP32 main weights %.1f, "
               "moments %.1f, comm buffers %.1f, activations %.1f (%d slot%s of %.1f), expert dispatch %.1f, "
               "router state %.1f, pipeline buffers %.1f, kernel workspaces %.1f, context allowance %.1f; "
               "steady %.1f, setup peak %.1f, peak %.1f\n",
            rank, p->compute_weights / M, p->grads / M, p->main_weights / M, p->moments / M, p->comm / M, p->arena / M,
            p->n_slots, p->n_slots == 1 ? "" : "s", p->slot_bytes / M, p->dispatch / M, (p->other + p->small) / M,
            p->pipe / M, p->workspace / M, p->context / M, memory_total(p) / M, p->setup_peak / M, p->peak / M);
}

void memory_layout_for_run(MemoryLayout *l, const RunConfig *cfg, const Ops *ops, int dp_rank, int ep_dp_rank,
                           const ParamStage *stage, int n_slots, int M, int gpu) {
    const ParallelSection *par = &cfg->parallel;
    int ep = par->ep > 0 ? par->ep : 1, dp = par->dp > 0 ? par->dp : 1;
    memset(l, 0, sizeof *l);
    l->dp = dp;
    l->dp_rank = dp_rank;
    l->ep = ep;
    l->ep_dp = dp / ep > 0 ? dp / ep : 1;
    l->ep_dp_rank = ep_dp_rank;
    l->sharded = cfg->optim_sharded;
    l->act_bytes = ops->act_bytes;
    l->stage = stage;
    l->ops = ops;
    // the symmetric dispatch: what model_init_parallel picks where symmetric
    // memory is available (auto with ep > 1 but not for fp8, or asked for)
    int be = run_config_ep_backend(cfg);
    int sym = cfg->model.n_experts > 0 && (be == EP_SYMMETRIC || (be == EP_AUTO && ep > 1));
    l->act = (ModelArenaSpec){.B = cfg->train.micro_batch, .T = cfg->model.seq_len, .n_slots = n_slots, .ep = ep,
                              .ep_sym = sym, .ep_recv_factor = par->ep_recv_factor,
                              .recompute = cfg->train.recompute, .recompute_every = cfg->train.recompute_every,
                              .recompute_first = cfg->train.recompute_first,
                              .recompute_norms = cfg->train.recompute_norms,
                              .recompute_attention = cfg->train.recompute_attention,
                              .recompute_swiglu = cfg->train.recompute_swiglu,
                              .fp8 = cfg->train.precision == PRECISION_FP8,
                              .fp8_dense = cfg->train.precision == PRECISION_FP8 && cfg->fp8.gemms == FP8_GEMMS_EXPERTS_DENSE,
                              .fp8_wgrad = cfg->train.precision != PRECISION_FP8 || cfg->fp8.wgrad != FP8_WGRAD_FP8 ? 0
                                           : cfg->device.type == 1 && cfg->device.cuda.fp8_wgrad_gemm ? 2 : 1,
                              .defer_wgrad = par->pp > 1 && par->pp_schedule == PP_ZB1, .doc_mask = cfg->data.doc_mask,
                              .stage = stage};
    l->gpu = gpu;
    l->context_bytes = gpu ? (size_t)(MEMORY_CONTEXT_MIB * 1048576.0) : 0;
    l->nccl_bytes = (size_t)(MEMORY_NCCL_MIB_DEFAULT * 1048576.0);
    l->pp = par->pp > 1 ? par->pp : 1;
    l->micro = M;
}
