// Forward and backward of the MoE transformer (docs/model.md), as a flat
// list of op calls per block. No autograd: each forward op has its backward
// called in reverse order, with the saved activations of LayerActs.
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ep_sym.h"
#include "ops/fp8.h"
#include "util/check.h"

// the compute weights of entry i, and its FP32 grad
#define P(i) param_store_weight(&m->store, (i))
#define G(i) param_store_grad(&m->store, (i))

int model_init(Model *m, const ModelConfig *cfg, const Ops *ops, char *err, size_t errlen) {
    return model_init_parallel(m, cfg, ops, NULL, err, errlen);
}

int model_init_parallel(Model *m, const ModelConfig *cfg, const Ops *ops, const ModelParallel *par,
                        char *err, size_t errlen) {
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    if (model_config_validate(&m->cfg, err, errlen)) return -1;
    m->ops = ops;
    m->par = par ? *par : (ModelParallel){.ep_size = 1, .ep_comm = comm_world()};
    m->stage = m->par.stage ? *m->par.stage : param_stage_all(&m->cfg);
    m->staged = m->par.stage != NULL;
    m->par.stage = NULL; // the copy in m->stage is the one used
    for (int ch = 0; ch < m->stage.n_chunks; ch++)
        if (m->stage.n_chunks > PARAM_MAX_CHUNKS || m->stage.begin[ch] < 0 || m->stage.end[ch] <= m->stage.begin[ch] ||
            m->stage.end[ch] > m->cfg.n_layers || (ch && m->stage.begin[ch] < m->stage.end[ch - 1])) {
            snprintf(err, errlen, "pipeline stage chunk %d: layers [%d, %d) of %d are not a valid chunk", ch,
                     m->stage.begin[ch], m->stage.end[ch], m->cfg.n_layers);
            return -1;
        }
    if (m->par.ep_size > 1 && (m->cfg.n_experts == 0 || m->cfg.n_experts % m->par.ep_size)) {
        snprintf(err, errlen, "parallel.ep (%d) must divide model.n_experts (%d)", m->par.ep_size, m->cfg.n_experts);
        return -1;
    }
    m->E_local = m->cfg.n_experts / m->par.ep_size;
    // the expert dispatch (ModelParallel.ep_backend); symmem_available is
    // collective over the ep group, like this call
    int want = m->par.ep_backend, ep = m->par.ep_size;
    if (m->cfg.n_experts > 0 && (want == EP_SYMMETRIC || (want == EP_AUTO && ep > 1))) {
        char why[256] = "";
        if (symmem_available(m->par.ep_comm, ops, why, sizeof why)) {
            m->ep_sym = 1;
        } else if (want == EP_SYMMETRIC) {
            snprintf(err, errlen, "parallel.ep_backend: symmetric needs symmetric memory in the ep group: %s", why);
            return -1;
        } else {
            snprintf(m->ep_note, sizeof m->ep_note, "expert dispatch: a2a (all-to-all), since symmetric memory is "
                     "not available: %s", why);
        }
    } else if (ep > 1) {
        snprintf(m->ep_note, sizeof m->ep_note, "expert dispatch: a2a (all-to-all)");
    }
    ParamLayout lay;
    param_store_init_stage(&m->store, &m->cfg, ops, m->par.ep_rank, m->par.ep_size, m->staged ? &m->stage : NULL, &lay);
    m->embed = lay.embed;
    m->final_norm = lay.final_norm;
    m->lm_head = lay.lm_head;
    m->layers = lay.layers;
    m->n_moe = lay.n_moe;
    int E = m->cfg.n_experts;
    size_t nm = (size_t)m->n_moe + 1;
    m->step_counts = ops->alloc(nm * E * sizeof(float) + 4);
    if (m->cfg.lb_global) m->lb_global_counts = ops->alloc(nm * E * sizeof(float) + 4);
    m->dropped_step = ops->alloc(nm * sizeof(float));
    m->step_dropped = mallocCheck(nm * sizeof(float));
    m->step_rows = mallocCheck(nm * sizeof(float));
    m->lb_mb = ops->alloc(nm * sizeof(float));
    m->z_mb = ops->alloc(nm * sizeof(float));
    m->lb_step = ops->alloc(nm * sizeof(float));
    m->z_step = ops->alloc(nm * sizeof(float));
    m->ce_acc = ops->alloc(2 * sizeof(double));
    m->lb = mallocCheck(nm * sizeof(float));
    m->route_seeds_host = mallocCheck(((size_t)m->cfg.n_layers + 1) * sizeof(uint64_t));
    m->z = mallocCheck(nm * sizeof(float));
    return 0;
}

// ---- FP8 (train.precision: fp8) ---------------------------------------------------

static size_t fp8_blocks(int n) { return ((size_t)n + 127) / 128; }

// Weight t (0 gate, 1 up, 2 down) of MoE layer L: its table entry and the
// arguments of fp8_quantize_weights that make its two FP8 copies: gate and
// up [E, Fe, D] into the pair's [Wg^T | Wu^T] at columns 0 and Fe, down
// [E, D, Fe] into Wd^T.
typedef struct {
    int entry;
    ParamFp8Copy copy;
} Fp8Target;
static Fp8Target fp8_target(const Model *m, const LayerParams *L, int t);

int model_set_fp8(Model *m, char *err, size_t errlen) {
    const ModelConfig *c = &m->cfg;
    int El = m->E_local, D = c->d_model, Fe = c->expert_hidden;
    if (c->n_experts <= 0 || m->n_moe == 0) {
        snprintf(err, errlen, "train.precision: fp8 (fp8.gemms: experts) needs MoE layers (model.n_experts > 0)");
        return -1;
    }
    if (m->staged) {
        snprintf(err, errlen, "train.precision: fp8 with pipeline stages (parallel.pp > 1) is not supported yet");
        return -1;
    }
    if (!m->ops->fp8_grouped_matmul_forward) {
        snprintf(err, errlen, "train.precision: fp8: the %s backend has no FP8 ops", m->ops->name);
        return -1;
    }
    if (m->ops->supports) {
        char why[300];
        OpDesc up = {.op = OP_FP8_GROUPED, .E = El, .C = D, .OC = Fe}, down = {.op = OP_FP8_GROUPED, .E = El, .C = Fe, .OC = D};
        if (!m->ops->supports(&up, why, sizeof why) || !m->ops->supports(&down, why, sizeof why)) {
            snprintf(err, errlen, "train.precision: fp8 with model.d_model %d, model.expert_hidden %d, %d experts per "
                     "rank: the %s backend cannot run these FP8 expert GEMMs: %s", D, Fe, El, m->ops->name, why);
            return -1;
        }
    }
    if (D % 128 || Fe % 128) { // the transposed weight blocks and the gate/up pair's tiles
        snprintf(err, errlen, "train.precision: fp8 needs model.d_model and model.expert_hidden multiples of %d "
                 "(got %d, %d)", 128, D, Fe);
        return -1;
    }
    // the symmetric dispatch moves a payload row (fp8_payload_bytes: 33 D / 32
    // bytes, a multiple of 4 when D % 128 == 0) as whole compute-dtype elements
    if (m->ep_sym && fp8_payload_bytes(D) % m->ops->act_bytes) {
        snprintf(err, errlen, "train.precision: fp8 with parallel.ep_backend: symmetric: an FP8 payload row of "
                 "model.d_model %d (%zu bytes) is not a whole number of the %s backend's %zu-byte elements", D,
                 fp8_payload_bytes(D), m->ops->name, m->ops->act_bytes);
        return -1;
    }
    size_t n = (size_t)El * D * Fe, tensors = (size_t)m->n_moe * 3;
    m->fp8_ws_per = (size_t)El * fp8_blocks(D) * fp8_blocks(Fe);
    m->fp8_w = m->ops->alloc(tensors * n);
    m->fp8_ws = m->ops->alloc(tensors * m->fp8_ws_per * sizeof(float));
    m->fp8_wt = m->ops->alloc(tensors * n);
    m->fp8_wts = m->ops->alloc(tensors * m->fp8_ws_per * sizeof(float));
    m->fp8 = 1;
    param_store_drop_act(&m->store, CLASS_EXPERT); // the FP8 copies replace the BF16 ones (a no-op on FP32)
    // AdamW writes the copies as it updates the weights (store.h), unless
    // MOECORE_ADAMW_FP8=separate asks for the refresh's own pass
    const char *sep = getenv("MOECORE_ADAMW_FP8");
    if (!(sep && !strcmp(sep, "separate")) && m->ops->adamw_update_fp8) {
        ParamStore *st = &m->store;
        st->fp8 = calloc((size_t)st->table.n, sizeof(ParamFp8Copy));
        if (!st->fp8) die("model_set_fp8: out of host memory");
        for (int l = 0; l < c->n_layers; l++) {
            const LayerParams *L = &m->layers[l];
            if (L->moe_index < 0) continue;
            for (int t = 0; t < 3; t++) {
                Fp8Target f = fp8_target(m, L, t);
                st->fp8[f.entry] = f.copy;
            }
        }
    }
    return 0;
}

// FP8 expert weight t (0 gate, 1 up, 2 down) of MoE layer li, and its scales
static uint8_t *fp8_weight(const Model *m, int li, int t) {
    return m->fp8_w + ((size_t)li * 3 + t) * m->E_local * m->cfg.d_model * m->cfg.expert_hidden;
}
static float *fp8_scales(const Model *m, int li, int t) { return m->fp8_ws + ((size_t)li * 3 + t) * m->fp8_ws_per; }
// The data-grads' transposed copies of layer li: t 0 the gate/up pair
// [Wg^T | Wu^T] [E, D, 2 Fe], t 2 Wd^T [E, Fe, D]; and their scales
static uint8_t *fp8_weight_t(const Model *m, int li, int t) {
    return m->fp8_wt + ((size_t)li * 3 + t) * m->E_local * m->cfg.d_model * m->cfg.expert_hidden;
}
static float *fp8_scales_t(const Model *m, int li, int t) { return m->fp8_wts + ((size_t)li * 3 + t) * m->fp8_ws_per; }

static void fp8d_refresh(Model *m);

static Fp8Target fp8_target(const Model *m, const LayerParams *L, int t) {
    int li = L->moe_index, El = m->E_local, D = m->cfg.d_model, Fe = m->cfg.expert_hidden;
    int tt = t == 2 ? 2 : 0; // the pair's copy holds gate and up
    Fp8Target f = {.entry = t == 0 ? L->exp_gate : t == 1 ? L->exp_up : L->exp_down,
                   .copy = {.q = fp8_weight(m, li, t), .s = fp8_scales(m, li, t), .qt = fp8_weight_t(m, li, tt),
                            .st = fp8_scales_t(m, li, tt), .ldt = t == 2 ? D : 2 * Fe, .col0 = t == 1 ? Fe : 0,
                            .E = El, .M = t == 2 ? D : Fe, .K = t == 2 ? Fe : D}};
    return f;
}

void model_fp8_refresh(Model *m) {
    if (!m->fp8) return;
    ParamStore *st = &m->store;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const LayerParams *L = &m->layers[l];
        if (L->moe_index < 0) continue;
        for (int t = 0; t < 3; t++) {
            Fp8Target f = fp8_target(m, L, t);
            if (st->fp8 && st->fp8[f.entry].fresh) { // written by the last AdamW step (store.h)
                st->fp8[f.entry].fresh = 0;
                continue;
            }
            const ParamFp8Copy *c = &f.copy;
            m->ops->fp8_quantize_weights(c->q, c->s, c->qt, c->st, c->ldt, c->col0, param_store_main(st, f.entry),
                                         c->E, c->M, c->K);
        }
    }
    fp8d_refresh(m);
}

// ---- FP8 dense GEMMs (fp8.gemms: experts_dense) ----------------------------------

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

// Bytes of one dense FP8 weight [M, K]: its copy and the transposed one,
// and their 128 x 128 scales, each piece on a 256-byte boundary.
static size_t fp8d_weight_bytes(int M, int K) {
    return 2 * align256((size_t)M * K) + 2 * align256(fp8_blocks(M) * fp8_blocks(K) * sizeof(float));
}

// The dense FP8 GEMMs' weights of layer l as [M, K] (y = x W^T, W [M, K]),
// in the order model_set_fp8_dense maps them to entries: wq, wk, wv, wo,
// then the gate, up and down of its dense MLP or its shared experts.
static int fp8d_layer_shapes(const ModelConfig *c, int l, int sh[7][2]) {
    int D = c->d_model, qd = model_q_dim(c), kvd = model_kv_dim(c), n = 0;
    int F = model_is_moe_layer(c, l) ? c->n_shared * c->shared_hidden : c->dense_hidden;
    int mk[7][2] = {{qd, D}, {kvd, D}, {kvd, D}, {D, qd}, {F, D}, {F, D}, {D, F}};
    for (int i = 0; i < (F > 0 ? 7 : 4); i++, n++) { sh[n][0] = mk[i][0]; sh[n][1] = mk[i][1]; }
    return n;
}

// The widest input or output of the dense FP8 GEMMs (the scratch rows).
static int fp8d_width(const ModelConfig *c) {
    int w = 0;
    for (int l = 0; l < c->n_layers; l++) {
        int sh[7][2], n = fp8d_layer_shapes(c, l, sh);
        for (int i = 0; i < n; i++) {
            if (sh[i][0] > w) w = sh[i][0];
            if (sh[i][1] > w) w = sh[i][1];
        }
    }
    return w;
}

size_t model_fp8_dense_bytes(const ModelConfig *c, const ParamStage *stage) {
    ParamStage all = stage ? *stage : param_stage_all(c);
    size_t b = 0;
    for (int ch = 0; ch < all.n_chunks; ch++)
        for (int l = all.begin[ch]; l < all.end[ch]; l++) {
            int sh[7][2], n = fp8d_layer_shapes(c, l, sh);
            for (int i = 0; i < n; i++) b += fp8d_weight_bytes(sh[i][0], sh[i][1]);
        }
    return b;
}

int model_set_fp8_dense(Model *m, int tokens, char *err, size_t errlen) {
    const ModelConfig *c = &m->cfg;
    const Ops *ops = m->ops;
    if (!m->fp8) {
        snprintf(err, errlen, "fp8.gemms: experts_dense needs train.precision: fp8 (model_set_fp8 first)");
        return -1;
    }
    if (!ops->fp8_matmul || !ops->fp8_quantize_rows_t) {
        snprintf(err, errlen, "fp8.gemms: experts_dense: the %s backend has no dense FP8 GEMM", ops->name);
        return -1;
    }
    if (m->defer_wgrad) { // model_wgrad_chunk would read the unquantised inputs
        snprintf(err, errlen, "fp8.gemms: experts_dense with deferred weight-grads (parallel.pp_schedule: zb1) is "
                 "not supported");
        return -1;
    }
    int F = c->dense_layers > 0 ? c->dense_hidden : 0, Fs = c->n_shared * c->shared_hidden;
    int qd = model_q_dim(c), kvd = model_kv_dim(c);
    if (c->d_model % 128 || qd % 128 || kvd % 128 || F % 128 || Fs % 128) {
        snprintf(err, errlen, "fp8.gemms: experts_dense needs every dense GEMM size a multiple of 128: model.d_model "
                 "%d, model.n_heads x model.head_dim %d, model.n_kv_heads x model.head_dim %d, model.dense_hidden %d "
                 "(with dense layers), model.n_shared x model.shared_hidden %d", c->d_model, qd, kvd, F, Fs);
        return -1;
    }
    ParamStage st = m->staged ? m->stage : param_stage_all(c);
    int n = 0;
    for (int ch = 0; ch < st.n_chunks; ch++)
        for (int l = st.begin[ch]; l < st.end[ch]; l++) {
            int sh[7][2], k = fp8d_layer_shapes(c, l, sh);
            for (int i = 0; i < k; i++) {
                char why[300] = "";
                OpDesc d = {.op = OP_FP8_DENSE, .N = tokens, .C = sh[i][1], .OC = sh[i][0]};
                if (ops->supports && !ops->supports(&d, why, sizeof why)) {
                    snprintf(err, errlen, "fp8.gemms: experts_dense: the %s backend cannot run the dense FP8 GEMM "
                             "of layer %d ([%d, %d] weight, %d tokens per micro-batch): %s", ops->name, l, sh[i][0],
                             sh[i][1], tokens, why);
                    return -1;
                }
            }
            n += k;
        }
    m->fp8d = mallocCheck((size_t)n * sizeof *m->fp8d + 1);
    m->fp8d_of = mallocCheck((size_t)m->store.table.n * sizeof(int) + 1);
    for (int i = 0; i < m->store.table.n; i++) m->fp8d_of[i] = -1;
    m->fp8d_bytes = ops->alloc(model_fp8_dense_bytes(c, m->staged ? &m->stage : NULL));
    uint8_t *p = m->fp8d_bytes;
    m->n_fp8d = 0;
    for (int ch = 0; ch < st.n_chunks; ch++)
        for (int l = st.begin[ch]; l < st.end[ch]; l++) {
            const LayerParams *L = &m->layers[l];
            int moe = L->moe_index >= 0;
            int entry[7] = {L->wq, L->wk, L->wv, L->wo, moe ? L->sh_gate : L->mlp_gate, moe ? L->sh_up : L->mlp_up,
                            moe ? L->sh_down : L->mlp_down};
            int sh[7][2], k = fp8d_layer_shapes(c, l, sh);
            for (int i = 0; i < k; i++) {
                int M = sh[i][0], K = sh[i][1];
                if (entry[i] < 0 || m->store.table.entries[entry[i]].numel != (size_t)M * K)
                    die("model_set_fp8_dense: layer %d weight %d is not the [%d, %d] tensor expected", l, i, M, K);
                struct Fp8DenseWeight *w = &m->fp8d[m->n_fp8d];
                size_t qb = align256((size_t)M * K), sb = align256(fp8_blocks(M) * fp8_blocks(K) * sizeof(float));
                *w = (struct Fp8DenseWeight){.entry = entry[i], .M = M, .K = K, .q = p, .qt = p + qb,
                                             .s = (float *)(p + 2 * qb), .st = (float *)(p + 2 * qb + sb)};
                p += 2 * qb + 2 * sb;
                m->fp8d_of[entry[i]] = m->n_fp8d++;
            }
        }
    m->fp8_dense = 1;
    return 0;
}

// The dense FP8 weights and their transposed copies from the FP32 main weights.
static void fp8d_refresh(Model *m) {
    for (int i = 0; i < m->n_fp8d; i++) {
        const struct Fp8DenseWeight *w = &m->fp8d[i];
        m->ops->fp8_quantize_weights(w->q, w->s, w->qt, w->st, w->M, 0, param_store_main(&m->store, w->entry), 1,
                                     w->M, w->K);
    }
}

static const struct Fp8DenseWeight *fp8d_weight(const Model *m, int w) {
    int i = m->fp8d_of[w];
    if (i < 0) die("fp8.gemms: experts_dense: parameter entry %d has no FP8 copy", w);
    return &m->fp8d[i];
}

// Box-Muller over splitmix64: reproducible on every platform.
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static double rng_uniform(uint64_t *s) { return ((rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

void model_init_weights(Model *m, uint64_t seed) {
    // Every chunk of 64k elements of every tensor has its own stream, keyed
    // by (seed, tensor index, chunk): the values do not depend on which
    // other tensors exist, on the class layout or on the thread count, and
    // a 7B-parameter model initialises in seconds.
    enum { CHUNK = 1 << 16 };
    float *host = mallocCheck(1);
    size_t cap = 0;
    for (int i = 0; i < m->store.table.n; i++) {
        const ParamEntry *e = &m->store.table.entries[i];
        if (e->numel > cap) { cap = e->numel; host = reallocCheck(host, cap * sizeof(float)); }
        float *p = host;
        if (e->kind == PARAM_NORM) {
            for (size_t j = 0; j < e->numel; j++) p[j] = 1.0f;
        } else {
            size_t chunks = (e->numel + CHUNK - 1) / CHUNK;
            double std = m->cfg.init_std;
#pragma omp parallel for schedule(static)
            for (size_t ch = 0; ch < chunks; ch++) {
                // keyed by the index in the whole model's table: a pipeline stage draws its tensors' values
                uint64_t s = seed * 0x100000001b3ULL + (uint64_t)e->global_index * 0x9e3779b97f4a7c15ULL;
                s ^= rng_next(&s) + ch * 0xd1b54a32d192ed03ULL;
                size_t end = (ch + 1) * CHUNK < e->numel ? (ch + 1) * CHUNK : e->numel;
                for (size_t j = ch * CHUNK; j < end; j++) {
                    double u1 = rng_uniform(&s), u2 = rng_uniform(&s);
                    p[j] = (float)(std * sqrt(-2.0 * log(u1)) * cos(2 * M_PI * u2));
                }
            }
        }
        m->ops->to_device(param_store_main(&m->store, i), host, e->numel * sizeof(float));
    }
    free(host);
    param_store_sync_weights(&m->store);
}

int model_fp8_wgrad_gemm(const Model *m) {
    if (!m->fp8 || m->fp8_wgrad != 2 || !m->ops->fp8_grouped_wgrad || !m->ops->fp8_quantize_tokens_t ||
        !m->ops->fp8_requantize_tokens_t)
        return 0;
    if (!m->ops->supports) return 1;
    const ModelConfig *c = &m->cfg;
    char why[300];
    OpDesc down = {.op = OP_FP8_WGRAD, .E = m->E_local, .C = c->expert_hidden, .OC = c->d_model};
    OpDesc gate = {.op = OP_FP8_WGRAD, .E = m->E_local, .C = c->d_model, .OC = c->expert_hidden};
    return m->ops->supports(&down, why, sizeof why) && m->ops->supports(&gate, why, sizeof why);
}

// ---- activations ----------------------------------------------------------------

// Carves buffers out of one arena: act elements are act_bytes wide, f32
// and i32 4 bytes; every buffer starts on a 256-byte boundary.
typedef struct { char *base; size_t used, act_bytes; int measure; } Carver;
static void *take_bytes(Carver *cv, size_t bytes) {
    void *p = cv->measure ? NULL : cv->base + cv->used;
    cv->used += (bytes + 255) & ~(size_t)255;
    return p;
}
static void *take(Carver *cv, size_t n) { return take_bytes(cv, n * cv->act_bytes); }
static float *ftake(Carver *cv, size_t n) { return take_bytes(cv, n * sizeof(float)); }
static int *itake(Carver *cv, size_t n) { return take_bytes(cv, n * sizeof(int)); }

int model_recomputes_layer(const Model *m, int l) {
    if (m->recompute != 3) return 0;
    int ch = param_stage_chunk_of(&m->stage, l);
    if (ch < 0 || l == m->stage.end[ch] - 1) return 0; // a chunk's last block: its backward comes right away
    int every = m->recompute_every > 0 ? m->recompute_every : 1;
    return l % every == 0 && (m->recompute_first <= 0 || l < m->recompute_first);
}

// Whether the backward remakes the SwiGLU outputs (shared buffers, model.h).
static int recomputes_swiglu(const Model *m) { return m->recompute == 1 || m->recompute_swiglu; }

// Whether the residual stream after layer l (before layer l + 1; l = -1:
// the embedding) is held: inside or at the ends of a chunk.
static int resid_held(const Model *m, int l) {
    for (int ch = 0; ch < m->stage.n_chunks; ch++)
        if (l + 1 >= m->stage.begin[ch] && l + 1 <= m->stage.end[ch]) return 1;
    return 0;
}

// Carves the activations of one micro-batch (one slot) for the layers held;
// run once to measure, once to assign. sv carves its symmetric memory
// (m->ep_sym: each MoE layer's receive buffer), the same layout on every
// rank of the ep group, so a buffer's offset in it names the peers'.
static void carve_slot(Model *m, Carver *cv, Carver *sv) {
    const ModelConfig *c = &m->cfg;
    size_t N = (size_t)m->B * m->T, D = c->d_model, qd = model_q_dim(c), kvd = model_kv_dim(c);
    size_t E = c->n_experts, k = c->top_k, R = N * k, Fe = c->expert_hidden;
    int ep = m->par.ep_size, El = m->E_local;
    // rows an expert rank receives: the dropless bound, or symmetric's
    // receive buffers (max_rows_local, set by model_alloc_acts)
    size_t Rl = m->ep_sym ? (size_t)m->max_rows_local : (size_t)ep * R;
    if (!m->ep_sym) m->max_rows_local = (int)Rl;
    int sym = m->ep_sym;
    size_t tab = (size_t)ep * sizeof(void *);
    size_t Fs = (size_t)c->n_shared * c->shared_hidden, F = c->dense_hidden;
    size_t Vp = c->padded_vocab;
    int pre = c->norm != NORM_POST, post = c->norm != NORM_PRE;
    size_t att = m->ops->attention_saved_floats(m->B, m->T, c->n_heads, c->head_dim);
    for (int l = 0; l <= c->n_layers; l++) m->resid[l] = resid_held(m, l - 1) ? take(cv, N * D) : NULL;
    // recompute: one buffer each, shared by the MoE layers (model.h)
    int rc_ea = (m->recompute == 1 || m->recompute_swiglu) && m->n_moe;
    int rc_xp = (m->recompute == 1 || m->recompute == 2) && m->n_moe && ep == 1 && !m->ep_sym;
    // symmetric expert parallelism: the routed rows are only the dispatch's
    // source (the backward reads the received rows), so every MoE layer
    // gathers into one buffer
    int sh_xp = rc_xp || (m->ep_sym && m->n_moe);
    int fp8 = m->fp8; // FP8 inputs and SwiGLU outputs in place of xp / xl and ea (shared likewise)
    void *ea_shared = rc_ea && !fp8 ? take(cv, Rl * Fe) : NULL, *xp_shared = sh_xp && !fp8 ? take(cv, R * D) : NULL;
    uint8_t *eaq_shared = rc_ea && fp8 ? take_bytes(cv, Rl * Fe) : NULL, *xq_shared = rc_xp && fp8 ? take_bytes(cv, R * D) : NULL;
    float *eas_shared = rc_ea && fp8 ? ftake(cv, Rl * fp8_blocks((int)Fe)) : NULL;
    float *xs_shared = rc_xp && fp8 ? ftake(cv, R * fp8_blocks((int)D)) : NULL;
    int rc_ln = m->recompute_norms && pre; // ln1 and ln2 of every block in one buffer
    void *ln_shared = rc_ln ? take(cv, N * D) : NULL;
    // recompute_attention: what the backward refills from q, k, v, one set
    // for every block (with QK-norm: qn, kn and their rstd too)
    int rc_at = m->recompute_attention, qkn = c->qk_norm != QKNORM_NONE;
    LayerActs at_shared = {0};
    if (rc_at) {
        if (qkn) {
            at_shared.qn = take(cv, N * qd); at_shared.kn = take(cv, N * kvd);
            at_shared.qn_rstd = ftake(cv, N * c->n_heads); at_shared.kn_rstd = ftake(cv, N * c->n_kv_heads);
        }
        at_shared.qr = take(cv, N * qd); at_shared.kr = take(cv, N * kvd);
        at_shared.att = ftake(cv, att); at_shared.ao = take(cv, N * qd);
    }
    // QK-norm's normed q, k are only the scratch of rmsnorm_rope_forward
    // (a backend that does not fuse it writes them there): one pair for all
    // blocks
    void *qn_scratch = qkn && !rc_at ? take(cv, N * qd) : NULL, *kn_scratch = qkn && !rc_at ? take(cv, N * kvd) : NULL;
    // recompute_swiglu: the dense MLPs' and the shared experts' SwiGLU
    // outputs, one buffer each (the experts' is ea_shared)
    int dense_held = 0;
    for (int l = 0; l < c->n_layers; l++) dense_held += !model_is_moe_layer(c, l) && param_stage_chunk_of(&m->stage, l) >= 0;
    int rc_a = m->recompute_swiglu && dense_held && F, rc_sa = m->recompute_swiglu && Fs && m->n_moe;
    void *a_shared = rc_a ? take(cv, N * F) : NULL, *sa_shared = rc_sa ? take(cv, N * Fs) : NULL;
    // recompute layers: the recomputed blocks share one set of buffers per
    // kind of block (MoE, dense); only their inputs (resid) stay
    LayerActs shared[2];
    int have_shared[2] = {0, 0};
    for (int l = 0; l < c->n_layers; l++) {
        LayerActs *a = &m->acts[l];
        int moe = model_is_moe_layer(c, l), rl = model_recomputes_layer(m, l);
        if (rl && have_shared[moe]) { *a = shared[moe]; continue; }
        memset(a, 0, sizeof(*a));
        if (param_stage_chunk_of(&m->stage, l) < 0) continue; // another stage's
        if (pre) { a->ln1 = rc_ln ? ln_shared : take(cv, N * D); a->ln1_rstd = ftake(cv, N); }
        a->q = take(cv, N * qd); a->k = take(cv, N * kvd); a->v = take(cv, N * kvd);
        if (qkn && rc_at) {
            a->qn = at_shared.qn; a->kn = at_shared.kn; a->qn_rstd = at_shared.qn_rstd; a->kn_rstd = at_shared.kn_rstd;
        } else if (qkn) {
            a->qn = qn_scratch; a->kn = kn_scratch;
            a->qn_rstd = ftake(cv, N * c->n_heads); a->kn_rstd = ftake(cv, N * c->n_kv_heads);
        } else { a->qn = a->q; a->kn = a->k; }
        if (rc_at) { a->qr = at_shared.qr; a->kr = at_shared.kr; }
        else { a->qr = take(cv, N * qd); a->kr = take(cv, N * kvd); }
        if (m->defer_wgrad) { a->w_do = take(cv, N * D); a->w_dq = take(cv, N * qd); a->w_dk = take(cv, N * kvd); a->w_dv = take(cv, N * kvd); }
        a->att = rc_at ? at_shared.att : ftake(cv, att);
        a->ao = rc_at ? at_shared.ao : take(cv, N * qd);
        a->o = take(cv, N * D);
        if (post) { a->on = take(cv, N * D); a->o_rstd = ftake(cv, N); }
        a->h = take(cv, N * D);
        if (pre) { a->ln2 = rc_ln ? ln_shared : take(cv, N * D); a->ln2_rstd = ftake(cv, N); }
        a->f = take(cv, N * D);
        if (post) { a->fn = take(cv, N * D); a->f_rstd = ftake(cv, N); }
        if (!moe) { a->g = take(cv, N * F); a->u = take(cv, N * F); a->a = rc_a ? a_shared : take(cv, N * F); goto carved; }
        a->logits = ftake(cv, N * E); a->probs = ftake(cv, N * E); a->weights = ftake(cv, N * k);
        a->idx = itake(cv, N * k); a->row_of = itake(cv, R); a->token_of_row = itake(cv, R);
        a->offsets = itake(cv, E + 1);
        a->counts = ftake(cv, E); a->lb_counts = ftake(cv, E);
        a->ey = take(cv, R * D);
        if (fp8) { // the inputs as the experts' FP8 GEMMs read them: ep > 1 received (symmetric: unpacked from m->sym_xrecv)
            a->xq = rc_xp ? xq_shared : take_bytes(cv, Rl * D); a->xs = rc_xp ? xs_shared : ftake(cv, Rl * fp8_blocks((int)D));
            a->eaq = rc_ea ? eaq_shared : take_bytes(cv, Rl * Fe); a->eas = rc_ea ? eas_shared : ftake(cv, Rl * fp8_blocks((int)Fe));
            a->yl = sym ? NULL : ep > 1 ? take(cv, Rl * D) : a->ey; // symmetric: the shared m->sym_out
            if (sym) a->sym_plan = itake(cv, ep_sym_plan_ints(ep, (int)E));
            a->eg = take(cv, Rl * Fe); a->eu = take(cv, Rl * Fe);
        } else {
            a->xp = sh_xp ? xp_shared : take(cv, R * D);
            a->xl = sym ? take(sv, Rl * D) : ep > 1 ? take(cv, Rl * D) : a->xp;
            a->yl = sym ? NULL : ep > 1 ? take(cv, Rl * D) : a->ey; // symmetric: the shared m->sym_out
            if (sym) { a->sym_plan = itake(cv, ep_sym_plan_ints(ep, (int)E)); a->sym_recv = take_bytes(cv, tab); }
            a->eg = take(cv, Rl * Fe); a->eu = take(cv, Rl * Fe); a->ea = rc_ea ? ea_shared : take(cv, Rl * Fe);
        }
        if (ep > 1 && !sym) { // the plan's backend arrays here, its host ones in plan_host
            size_t pn = ep_plan_ints(ep, El, (int)Rl);
            int *plan_ints = itake(cv, pn);
            if (!cv->measure)
                ep_plan_carve(&a->plan, ep, El, (int)Rl, m->plan_host + (size_t)l * pn, plan_ints,
                              m->plan_sizes + (size_t)l * ep_plan_sizes(ep));
        }
        if (Fs) { a->sg = take(cv, N * Fs); a->su = take(cv, N * Fs); a->sa = rc_sa ? sa_shared : take(cv, N * Fs); a->so = take(cv, N * D); }
    carved:
        if (rl) { shared[moe] = *a; have_shared[moe] = 1; }
    }
    m->xf = take(cv, N * D); m->xf_rstd = ftake(cv, N);
    m->logits = take(cv, N * Vp); m->losses = ftake(cv, N);
    m->tokens = itake(cv, N); m->targets = itake(cv, N);
    m->route_seeds = take_bytes(cv, (size_t)c->n_layers * sizeof(uint64_t));
    m->route_seed_set = 0;
    m->doc_start = m->doc_mask ? itake(cv, N) : NULL;
    m->grad_out = m->staged ? take(cv, N * D) : NULL;
}

// Carves what every slot shares: RoPE tables, the backward scratch and,
// with symmetric expert parallelism, the count window and the experts'
// output, output-grad and input-grad buffers (sv) with their peer tables.
static void carve_shared(Model *m, Carver *cv, Carver *sv) {
    const ModelConfig *c = &m->cfg;
    size_t N = (size_t)m->B * m->T, D = c->d_model, qd = model_q_dim(c), kvd = model_kv_dim(c);
    size_t E = c->n_experts, k = c->top_k, R = N * k, Fe = c->expert_hidden;
    int ep = m->par.ep_size, sym = m->ep_sym;
    size_t Rl = sym ? (size_t)m->max_rows_local : (size_t)ep * R;
    if (sym) {
        size_t tab = (size_t)ep * sizeof(void *);
        m->sym_counts = take_bytes(sv, (size_t)ep * E * sizeof(int));
        m->sym_out = take(sv, Rl * D); m->sym_dout = take(sv, Rl * D); m->sym_dxl = take(sv, Rl * D);
        m->sym_counts_tab = take_bytes(cv, tab);
        m->sym_out_tab = take_bytes(cv, tab); m->sym_dout_tab = take_bytes(cv, tab); m->sym_dxl_tab = take_bytes(cv, tab);
        // fp8: the FP8 payload rows' receive buffer, one for all layers (the
        // backward reads the unpacked a->xq, a->xs, not these rows)
        m->sym_xrecv = m->fp8 ? take_bytes(sv, Rl * fp8_payload_bytes((int)D)) : NULL;
        m->sym_xrecv_tab = m->fp8 ? take_bytes(cv, tab) : NULL;
    }
    size_t Fs = (size_t)c->n_shared * c->shared_hidden, F = c->dense_hidden;
    m->rope_cos = ftake(cv, (size_t)m->T * c->head_dim / 2);
    m->rope_sin = ftake(cv, (size_t)m->T * c->head_dim / 2);
    // backward scratch, shared by all layers
    m->dres = take(cv, N * D); m->d1 = take(cv, N * D); m->d2 = take(cv, N * D);
    m->dq = take(cv, N * qd); m->dk = take(cv, N * kvd); m->dv = take(cv, N * kvd);
    m->dq2 = take(cv, N * qd); m->dk2 = take(cv, N * kvd); m->dao = take(cv, N * qd);
    m->att_scratch = ftake(cv, m->ops->attention_scratch_floats(m->B, m->T, c->n_heads, c->n_kv_heads, c->head_dim));
    if (F) { m->da = take(cv, N * F); m->dg = take(cv, N * F); m->du = take(cv, N * F); }
    if (m->n_moe) {
        // fp8 with the all-to-all (or one rank) swaps the two pairs
        // (fp8_moe_experts_backward_ep): dey, dxp hold the experts' rows
        // [Rl, D], dyl, dxl the routed ones [R, D]; symmetric keeps them
        int swap = m->fp8 && !sym;
        size_t Rx = swap ? Rl : R, Rr = swap ? R : Rl;
        m->dey = take(cv, Rx * D); m->dxp = take(cv, Rx * D);
        m->dyl = sym ? m->sym_dout : ep > 1 ? take(cv, Rr * D) : m->dey;
        m->dxl = sym ? m->sym_dxl : ep > 1 ? take(cv, Rr * D) : m->dxp;
        m->dea = take(cv, Rl * Fe); m->deg = take(cv, Rl * Fe); m->deu = take(cv, Rl * Fe);
        m->fp8_deq = m->fp8 ? take(cv, Rl * (D > Fe ? D : Fe)) : NULL;
        size_t dqw = D > 2 * Fe ? D : 2 * Fe; // the down's output grads [Rl, D], the gate/up pair's [Rl, 2 Fe]
        m->fp8_dq = m->fp8 ? take_bytes(cv, Rl * dqw) : NULL;
        m->fp8_ds = m->fp8 ? ftake(cv, Rl * fp8_blocks((int)dqw)) : NULL;
        // ep > 1 (or symmetric): the routed rows quantised at this rank and
        // packed for the dispatch (ep_dispatch_fp8, received into ep_scratch;
        // symmetric: ep_sym_dispatch into the owners' sym_xrecv)
        int fp8_ep = m->fp8 && (ep > 1 || sym);
        m->fp8_src_q = fp8_ep ? take_bytes(cv, R * D) : NULL;
        m->fp8_src_s = fp8_ep ? ftake(cv, R * fp8_blocks((int)D)) : NULL;
        m->fp8_send = fp8_ep ? take_bytes(cv, R * fp8_payload_bytes((int)D)) : NULL;
        // the FP8 weight-grad's operands along the tokens (dout^T, inp^T) and their scales
        int fw = model_fp8_wgrad_gemm(m);
        size_t wide = D > Fe ? D : Fe, ldk = fw ? (size_t)fp8_tokens_ldk((int)Rl, m->E_local) : 0;
        m->fp8_ldk = (int)ldk;
        m->fp8_wqa = fw ? take_bytes(cv, wide * ldk) : NULL;
        m->fp8_wqb = fw ? take_bytes(cv, wide * ldk) : NULL;
        m->fp8_wsa = fw ? ftake(cv, wide * (ldk / 128)) : NULL;
        m->fp8_wsb = fw ? ftake(cv, wide * (ldk / 128)) : NULL;
        m->ep_scratch = ep > 1 && !sym ? take(cv, Rl * D) : NULL;
        m->dweights = ftake(cv, N * k); m->dprobs = ftake(cv, N * E); m->dlogits = ftake(cv, N * E);
        if (Fs) { m->dsa = take(cv, N * Fs); m->dsg = take(cv, N * Fs); m->dsu = take(cv, N * Fs); }
    }
    if (m->fp8_dense) { // the dense FP8 GEMMs' scratch (model.h)
        size_t W = (size_t)fp8d_width(c);
        m->fp8d_xq = take_bytes(cv, N * W); m->fp8d_gq = take_bytes(cv, N * W);
        m->fp8d_xs = ftake(cv, N * (W / 128)); m->fp8d_gs = ftake(cv, N * (W / 128));
        m->fp8d_deq = take(cv, N * W);
    }
}

// Symmetric expert parallelism: the receive buffers' rows per layer. The
// bound ep x R (every rank's rows to one rank: nothing can overflow) unless
// parallel.ep_recv_factor sets fewer; on a device, shrunk to what its free
// memory holds beside the rest of the arena, keeping a tenth of it for the
// rest of the run. Past the bound a micro-batch drops the largest experts'
// tails (counted as dropped) instead of failing.
static void sym_size_rows(Model *m) {
    int ep = m->par.ep_size;
    size_t R = (size_t)m->B * m->T * m->cfg.top_k, full = (size_t)ep * R, rows = full;
    double f = m->par.ep_recv_factor;
    if (f > 0) rows = (size_t)ceil(f * (double)R);
    if (rows > full) rows = full;
    if (rows < 1) rows = 1;
    const char *why = f > 0 ? "parallel.ep_recv_factor" : "ep x the rows routed here: nothing can overflow";
    if (!(f > 0) && m->ops->device_memory_free) {
        // the arena and symmetric bytes are affine in the rows: two measures
        size_t at[2], r2[2] = {R, full};
        for (int i = 0; i < 2; i++) {
            m->max_rows_local = (int)r2[i];
            Carver cv = {.measure = 1, .act_bytes = m->ops->act_bytes}, sv = cv;
            carve_slot(m, &cv, &sv);
            size_t per_slot = cv.used + sv.used;
            carve_shared(m, &cv, &sv);
            at[i] = cv.used + sv.used + (size_t)(m->n_slots - 1) * per_slot;
        }
        size_t spare = (size_t)(0.9 * (double)m->ops->device_memory_free());
        if (at[1] > spare && full > R) {
            double per_row = (double)(at[1] - at[0]) / (double)(full - R);
            double fit = spare > at[0] ? (double)R + (double)(spare - at[0]) / per_row : (double)R;
            rows = (size_t)fit;
            if (rows < R) rows = R;
            why = "what the device's free memory holds";
        }
    }
    // the same rows on every rank of the ep group (each rank's free memory
    // differs; the peers' buffers are addressed by this rank's offsets, and
    // every source cuts an owner's rows by this bound); none in a plan
    if (m->par.ep_comm) {
        size_t least = symmem_min(m->par.ep_comm, rows);
        if (least < rows) rows = least, why = "what the device's free memory holds, the least over the ep group";
    }
    m->max_rows_local = (int)rows;
    snprintf(m->ep_note, sizeof m->ep_note,
             "expert dispatch: symmetric (direct writes into %d ranks' receive buffers); receive buffers "
             "%zu rows per layer = %.2f x the %zu rows a rank routes (%s); beyond them a micro-batch drops the "
             "largest experts' tails and counts them",
             ep, rows, (double)rows / (double)R, R, why);
}

// The peer tables: entry q of a buffer's table is peer q's copy of it.
static void sym_table(Model *m, void *table_b, const void *local) {
    int P = m->par.ep_size;
    size_t off = (const char *)local - (const char *)symmem_local(m->sym);
    void *t[P];
    for (int q = 0; q < P; q++) t[q] = (char *)symmem_peer(m->sym, q) + off;
    m->ops->to_device(table_b, t, sizeof t);
}

static void sym_fill_tables(Model *m) {
    sym_table(m, m->sym_counts_tab, m->sym_counts);
    sym_table(m, m->sym_out_tab, m->sym_out);
    sym_table(m, m->sym_dout_tab, m->sym_dout);
    sym_table(m, m->sym_dxl_tab, m->sym_dxl);
    if (m->sym_xrecv) sym_table(m, m->sym_xrecv_tab, m->sym_xrecv);
    for (int k = 0; k < m->n_slots; k++) {
        const ModelSlot *sl = &m->slots[k];
        for (int l = 0; l < m->cfg.n_layers; l++)
            if (model_is_moe_layer(&m->cfg, l) && sl->acts[l].sym_recv) sym_table(m, sl->acts[l].sym_recv, sl->acts[l].xl);
    }
}

// The per-micro-batch fields of m to and from a slot.
static void slot_store(const Model *m, ModelSlot *s) {
    s->acts = m->acts; s->resid = m->resid;
    s->xf = m->xf; s->logits = m->logits; s->xf_rstd = m->xf_rstd; s->losses = m->losses;
    s->tokens = m->tokens; s->targets = m->targets; s->doc_start = m->doc_start; s->doc_start_host = m->doc_start_host;
    s->batch_docs = m->batch_docs; s->n_valid = m->n_valid;
    s->plan_sizes = m->plan_sizes; s->plan_host = m->plan_host;
    s->grad_out = m->grad_out;
    s->route_seeds = m->route_seeds; s->route_seed = m->route_seed; s->route_seed_set = m->route_seed_set;
}
static void slot_load(Model *m, const ModelSlot *s) {
    m->acts = s->acts; m->resid = s->resid;
    m->xf = s->xf; m->logits = s->logits; m->xf_rstd = s->xf_rstd; m->losses = s->losses;
    m->tokens = s->tokens; m->targets = s->targets; m->doc_start = s->doc_start; m->doc_start_host = s->doc_start_host;
    m->batch_docs = s->batch_docs; m->n_valid = s->n_valid;
    m->plan_sizes = s->plan_sizes; m->plan_host = s->plan_host;
    m->grad_out = s->grad_out;
    m->route_seeds = s->route_seeds; m->route_seed = s->route_seed; m->route_seed_set = s->route_seed_set;
}

void model_use_slot(Model *m, int k) {
    if (k < 0 || k >= m->n_slots) die("model_use_slot: slot %d of %d", k, m->n_slots);
    if (k == m->slot) return;
    slot_store(m, &m->slots[m->slot]);
    slot_load(m, &m->slots[k]);
    m->slot = k;
}

static void free_slots(Model *m) {
    for (int k = 0; k < m->n_slots; k++) {
        ModelSlot *s = &m->slots[k];
        free(s->acts); free(s->resid); free(s->plan_sizes); free(s->plan_host); free(s->doc_start_host);
    }
    free(m->slots);
    m->slots = NULL;
    m->n_slots = m->slot = 0;
    m->acts = NULL; m->resid = NULL; m->plan_sizes = NULL; m->plan_host = NULL; m->doc_start_host = NULL;
}

// The sizes of what model_alloc_slots allocates, from a measuring carve:
// the arena (n_slots slots and the shared part: slot_bytes, arena_bytes)
// and the symmetric memory (sym_bytes). model_arena_plan runs the same.
static void measure_arena(Model *m) {
    Carver cv = {.measure = 1, .act_bytes = m->ops->act_bytes}, sv = cv;
    carve_slot(m, &cv, &sv);
    m->slot_bytes = cv.used;
    size_t sym_slot = sv.used;
    carve_shared(m, &cv, &sv);
    m->arena_bytes = cv.used + (size_t)(m->n_slots - 1) * m->slot_bytes;
    m->sym_bytes = m->ep_sym ? sv.used + (size_t)(m->n_slots - 1) * sym_slot : 0;
}

int model_arena_plan(const ModelConfig *cfg, const Ops *ops, const ModelArenaSpec *s, ModelArenaSize *out,
                     char *err, size_t errlen) {
    Model *m = calloc(1, sizeof *m);
    if (!m) return errorf(err, errlen, "out of host memory");
    m->cfg = *cfg;
    if (model_config_validate(&m->cfg, err, errlen)) { free(m); return -1; }
    // the backend's sizes without its device: the symmetric receive
    // buffers are the bound (or ep_recv_factor's), not what a device spares,
    // and the kernels are taken to run the shapes (a run asks the device)
    Ops o = *ops;
    o.device_memory_free = NULL;
    o.supports = NULL;
    m->ops = &o;
    int ep = s->ep > 0 ? s->ep : 1;
    if (cfg->n_experts % ep) { free(m); return errorf(err, errlen, "ep %d does not divide model.n_experts %d", ep, cfg->n_experts); }
    m->par = (ModelParallel){.ep_size = ep, .ep_recv_factor = s->ep_recv_factor};
    m->stage = s->stage ? *s->stage : param_stage_all(&m->cfg);
    m->staged = s->stage != NULL;
    m->E_local = cfg->n_experts / ep;
    m->ep_sym = s->ep_sym && cfg->n_experts > 0;
    for (int ch = 0; ch < m->stage.n_chunks; ch++)
        for (int l = m->stage.begin[ch]; l < m->stage.end[ch]; l++) m->n_moe += model_is_moe_layer(cfg, l);
    m->recompute = s->recompute;
    m->recompute_every = s->recompute_every;
    m->recompute_first = s->recompute_first;
    m->recompute_norms = s->recompute_norms;
    m->recompute_attention = s->recompute_attention;
    m->recompute_swiglu = s->recompute_swiglu;
    m->fp8 = s->fp8;
    m->fp8_wgrad = s->fp8_wgrad;
    m->fp8_dense = s->fp8 && s->fp8_dense;
    m->defer_wgrad = s->defer_wgrad;
    m->doc_mask = s->doc_mask;
    m->B = s->B;
    m->T = s->T;
    m->n_slots = s->n_slots > 0 ? s->n_slots : 1;
    m->acts = calloc(cfg->n_layers, sizeof(LayerActs));
    m->resid = calloc(cfg->n_layers + 1, sizeof(void *));
    if (m->ep_sym) sym_size_rows(m);
    measure_arena(m);
    out->arena_bytes = m->arena_bytes;
    out->slot_bytes = m->slot_bytes;
    out->sym_bytes = m->sym_bytes;
    out->rows_local = m->max_rows_local;
    free(m->acts);
    free(m->resid);
    free(m);
    return 0;
}

void model_alloc_acts(Model *m, int B, int T) { model_alloc_slots(m, B, T, 1); }

void model_alloc_slots(Model *m, int B, int T, int n_slots) {
    if (m->arena) m->ops->free(m->arena);
    if (m->slots) slot_store(m, &m->slots[m->slot]);
    free_slots(m);
    m->B = B;
    m->T = T;
    if (n_slots < 1) n_slots = 1;
    m->slots = mallocCheck(n_slots * sizeof(ModelSlot));
    m->n_slots = n_slots;
    int ep = m->par.ep_size;
    size_t L = m->cfg.n_layers, Rl = (size_t)ep * B * T * m->cfg.top_k;
    // the host parts of each slot: its layers' activation views and, with
    // ep > 1 and the all-to-all, the host side of its plans (dist/ep.h)
    for (int k = 0; k < n_slots; k++) {
        ModelSlot *s = &m->slots[k];
        memset(s, 0, sizeof *s);
        s->acts = mallocCheck(L * sizeof(LayerActs));
        s->resid = mallocCheck((L + 1) * sizeof(void *));
        if (ep > 1 && !m->ep_sym) {
            s->plan_sizes = mallocCheck(L * ep_plan_sizes(ep) * sizeof(size_t));
            s->plan_host = mallocCheck(L * ep_plan_ints(ep, m->E_local, (int)Rl) * sizeof(int));
        }
        s->doc_start_host = m->doc_mask ? mallocCheck((size_t)B * T * sizeof(int)) : NULL;
    }
    // measure one slot and the shared part, then carve slot after slot
    // and the shared part behind them (one slot: the layout it always had);
    // the symmetric memory likewise: each slot's receive buffers, then the
    // shared count window and expert buffers
    slot_load(m, &m->slots[0]);
    if (m->ep_sym) sym_size_rows(m);
    measure_arena(m);
    m->arena = m->ops->alloc(m->arena_bytes);
    Carver real_cv = {.base = m->arena, .act_bytes = m->ops->act_bytes}, real_sv = real_cv;
    if (m->ep_sym) {
        symmem_free(m->sym);
        char err[256] = "";
        m->sym = symmem_create(m->par.ep_comm, m->ops, m->sym_bytes, err, sizeof err);
        if (!m->sym) {
            fprintf(stderr, "moecore: symmetric expert parallelism: %s\n", err);
            exit(1);
        }
        real_sv.base = symmem_local(m->sym);
    }
    for (int k = 0; k < n_slots; k++) {
        slot_load(m, &m->slots[k]);
        carve_slot(m, &real_cv, &real_sv);
        slot_store(m, &m->slots[k]);
    }
    carve_shared(m, &real_cv, &real_sv);
    if (real_cv.used != m->arena_bytes) // the measure and the carve take the same buffers (model_arena_plan's too)
        die("model_alloc_slots: carved %zu bytes of an arena measured at %zu", real_cv.used, m->arena_bytes);
    if (m->ep_sym) sym_fill_tables(m);
    slot_load(m, &m->slots[0]);
    m->slot = 0;
    size_t nt = (size_t)T * m->cfg.head_dim / 2;
    float *cs = mallocCheck(2 * nt * sizeof(float));
    rope_tables(cs, cs + nt, T, m->cfg.head_dim, m->cfg.rope_theta);
    m->ops->to_device(m->rope_cos, cs, nt * sizeof(float));
    m->ops->to_device(m->rope_sin, cs + nt, nt * sizeof(float));
    free(cs);
}

void model_free(Model *m) {
    const Ops *ops = m->ops;
    param_store_free(&m->store);
    if (m->arena) ops->free(m->arena);
    symmem_free(m->sym);
    if (m->slots) slot_store(m, &m->slots[m->slot]);
    free_slots(m);
    free(m->layers); free(m->lb); free(m->z); free(m->route_seeds_host);
    free(m->step_dropped); free(m->step_rows);
    float *dev[] = {m->step_counts, m->lb_mb, m->z_mb, m->lb_step, m->z_step, m->lb_global_counts, m->dropped_step};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) ops->free(dev[i]);
    ops->free(m->ce_acc);
    if (m->fp8) { ops->free(m->fp8_w); ops->free(m->fp8_ws); ops->free(m->fp8_wt); ops->free(m->fp8_wts); }
    if (m->fp8_dense) { ops->free(m->fp8d_bytes); free(m->fp8d); free(m->fp8d_of); }
    if (m->wgrad_slots) ops->free(m->wgrad_slots);
    memset(m, 0, sizeof(*m));
}

// The grad norm's slots of one MoE layer's expert grads: gate, up, down.
static size_t wgrad_slots_per_layer(const ModelConfig *c, int E_local) {
    return 2 * ops_wgrad_slots(E_local, c->d_model, c->expert_hidden) +
           ops_wgrad_slots(E_local, c->expert_hidden, c->d_model);
}

size_t model_wgrad_slots_for(const ModelConfig *cfg, int E_local) {
    return (size_t)model_moe_layers(cfg) * wgrad_slots_per_layer(cfg, E_local);
}

size_t model_alloc_wgrad_slots(Model *m) {
    if (!m->n_moe || !m->ops->grouped_wgrad_sumsq || model_fp8_wgrad_gemm(m)) return 0;
    size_t n = (size_t)m->n_moe * wgrad_slots_per_layer(&m->cfg, m->E_local);
    m->wgrad_slots = m->ops->alloc(n * sizeof(double));
    return n;
}

void model_zero_grads(Model *m) {
    for (int c = 0; c < N_CLASSES; c++) m->ops->zero(m->store.grads[c], m->store.table.class_numel[c] * sizeof(float));
    m->expert_grads_unset = 0;
}

void model_zero_dense_grads(Model *m) {
    m->ops->zero(m->store.grads[CLASS_DENSE], m->store.table.class_numel[CLASS_DENSE] * sizeof(float));
    m->expert_grads_unset = 1;
}

void model_begin_step(Model *m) {
    size_t nm = (size_t)m->n_moe;
    m->ops->zero(m->step_counts, nm * m->cfg.n_experts * sizeof(float));
    if (m->lb_global_counts) m->ops->zero(m->lb_global_counts, nm * m->cfg.n_experts * sizeof(float));
    m->ops->zero(m->dropped_step, nm * sizeof(float));
    memset(m->step_dropped, 0, nm * sizeof(float));
    memset(m->step_rows, 0, nm * sizeof(float));
    m->ops->zero(m->lb_step, nm * sizeof(float));
    m->ops->zero(m->z_step, nm * sizeof(float));
    m->ops->zero(m->ce_acc, 2 * sizeof(double));
    m->step_tokens = 0;
    m->step_dispatch_rows = m->step_dispatch_bytes = 0;
    model_fp8_refresh(m);
}

// ---- forward ----------------------------------------------------------------------

static uint64_t layer_seed(uint64_t seed, int l) {
    uint64_t s = seed ^ (0xd1b54a32d192ed03ULL * (uint64_t)(l + 1));
    return rng_next(&s);
}

// out = RMSNorm(inp) where a norm exists at this place, else returns inp.
static const void *maybe_norm(Model *m, void *out, float *rstd, const void *inp, int w, int N) {
    if (w < 0) return inp;
    m->ops->rmsnorm_forward(out, rstd, inp, P(w), N, m->cfg.d_model, m->cfg.norm_eps);
    return out;
}

// The doc_start attention gets: NULL (causal) for a micro-batch without a
// document boundary.
static const int *model_docs(const Model *m) { return m->batch_docs ? m->doc_start : NULL; }

// out[N, OC] = x[N, C] W^T, W the weights of entry w: in FP8 with
// fp8.gemms: experts_dense (x quantised per 1 x 128 tile into the input
// scratch, unless again: x is the previous call's, there already), else in
// the compute dtype.
static void dense_forward(Model *m, void *out, const void *x, int again, int w, int N, int C, int OC) {
    const Ops *ops = m->ops;
    if (!m->fp8_dense) { ops->matmul_forward(out, x, P(w), N, C, OC); return; }
    const struct Fp8DenseWeight *fw = fp8d_weight(m, w);
    if (!again) ops->fp8_quantize_rows_t(m->fp8d_xq, m->fp8d_xs, x, N, C);
    ops->fp8_matmul(out, m->fp8d_xq, m->fp8d_xs, fw->q, fw->s, N, C, OC, 0);
}

// What the weight-grads of a GEMM with input x [N, C] multiply: x, or in
// FP8 what the forward multiplied, x quantised and dequantised (into the
// scratch fp8d_deq, valid until the next call; the same codes and scales as
// the forward's fp8_quantize_rows_t, in fp8_dequantize_rows' layout).
static const void *dense_wgrad_input(Model *m, const void *x, int N, int C) {
    if (!m->fp8_dense) return x;
    m->ops->fp8_quantize_rows(m->fp8d_xq, m->fp8d_xs, x, NULL, N, C);
    m->ops->fp8_dequantize_rows(m->fp8d_deq, m->fp8d_xq, m->fp8d_xs, N, C);
    return m->fp8d_deq;
}

// dense_forward's backward, as matmul_backward: dinp (=|+=) dout W, dw +=
// dout^T xw (either may be NULL), xw from dense_wgrad_input. In FP8 the
// data-grad multiplies dout quantised 1 x 128 by the transposed FP8 weight
// (the gradient of what the forward computed); the weight-grad stays in the
// compute dtype, from the unquantised dout.
static void dense_backward(Model *m, void *dinp, float *dw, const void *dout, const void *xw, int w, int N, int C,
                           int OC, int accumulate) {
    const Ops *ops = m->ops;
    if (!m->fp8_dense) { ops->matmul_backward(dinp, dw, dout, xw, P(w), N, C, OC, accumulate); return; }
    if (dinp) {
        const struct Fp8DenseWeight *fw = fp8d_weight(m, w);
        ops->fp8_quantize_rows_t(m->fp8d_gq, m->fp8d_gs, dout, N, OC);
        ops->fp8_matmul(dinp, m->fp8d_gq, m->fp8d_gs, fw->qt, fw->st, N, OC, C, accumulate);
    }
    if (dw) ops->matmul_backward(NULL, dw, dout, xw, P(w), N, C, OC, 0);
}

// From the projections q, k, v to the attention output ao: QK-norm, RoPE,
// causal attention. recompute_attention runs it again in the backward.
static void attention_core_forward(Model *m, const LayerParams *L, LayerActs *a) {
    const Ops *ops = m->ops;
    const ModelConfig *c = &m->cfg;
    int B = m->B, T = m->T, H = c->n_heads, KV = c->n_kv_heads;
    int hd = c->head_dim, qd = model_q_dim(c), kvd = model_kv_dim(c);
    if (c->qk_norm != QKNORM_NONE) { // norm then RoPE in one op (qn, kn: its scratch)
        int full = c->qk_norm == QKNORM_FULL;
        ops->rmsnorm_rope_forward(a->qr, a->qn_rstd, a->qn, a->q, P(L->q_norm), m->rope_cos, m->rope_sin, B, T, H, hd,
                                  full ? qd : hd, c->norm_eps);
        ops->rmsnorm_rope_forward(a->kr, a->kn_rstd, a->kn, a->k, P(L->k_norm), m->rope_cos, m->rope_sin, B, T, KV,
                                  hd, full ? kvd : hd, c->norm_eps);
    } else {
        ops->rope_forward(a->qr, a->q, m->rope_cos, m->rope_sin, B, T, H, hd);
        ops->rope_forward(a->kr, a->k, m->rope_cos, m->rope_sin, B, T, KV, hd);
    }
    ops->attention_forward(a->ao, a->att, a->qr, a->kr, a->v, model_docs(m), B, T, H, KV, hd);
}

static void attention_forward(Model *m, const LayerParams *L, LayerActs *a, const void *in) {
    const ModelConfig *c = &m->cfg;
    int N = m->B * m->T, D = c->d_model, qd = model_q_dim(c), kvd = model_kv_dim(c);
    dense_forward(m, a->q, in, 0, L->wq, N, D, qd);
    dense_forward(m, a->k, in, 1, L->wk, N, D, kvd);
    dense_forward(m, a->v, in, 1, L->wv, N, D, kvd);
    attention_core_forward(m, L, a);
    dense_forward(m, a->o, a->ao, 0, L->wo, N, qd, D);
}

static void swiglu_mlp_forward(Model *m, void *out, void *g, void *u, void *act,
                               const void *in, int wg, int wu, int wd, int N, int F) {
    int D = m->cfg.d_model;
    dense_forward(m, g, in, 0, wg, N, D, F);
    dense_forward(m, u, in, 1, wu, N, D, F);
    m->ops->swiglu_forward(act, g, u, (size_t)N * F);
    dense_forward(m, out, act, 0, wd, N, F, D);
}

// Rows each expert keeps per micro-batch (model.capacity_factor; 0:
// dropless): ceil(cf * tokens * k / E) over the tokens of the whole ep group.
static int expert_capacity(const Model *m) {
    const ModelConfig *c = &m->cfg;
    if (!(c->capacity_factor > 0)) return 0;
    int N = m->B * m->T;
    return (int)ceil((double)c->capacity_factor * N * m->par.ep_size * c->top_k / c->n_experts);
}

// The symmetric dispatch's first phases for layer li (ops/ep_sym.h b, c):
// this rank's counts into every peer's window, barrier, the plan from its
// own window (capacity and the receive bound; drops counted once, not when
// a block is recomputed). Marks the layer as planned on the device.
static void sym_plan_layer(Model *m, LayerActs *a, int li) {
    const Ops *ops = m->ops;
    int P = m->par.ep_size, me = m->par.ep_rank, E = m->cfg.n_experts;
    a->use_plan = 0;
    a->rows_local = -1;
    ops->ep_sym_write_counts(m->sym_counts_tab, a->offsets, P, me, E);
    symmem_barrier(m->sym);
    ops->ep_sym_plan(a->sym_plan, m->recomputing ? NULL : m->dropped_step + li, m->sym_counts, P, me, E,
                     expert_capacity(m), m->max_rows_local);
}

// The expert weight-grad k (0 gate, 1 up, 2 down) of layer L into its grads
// (= or +=, by accw), with the data-grad of the same product into dinp
// unless NULL; while wgrad_slots_on (a step's last backward) also the sum
// of squares of the grads it leaves, into the layer's slots.
static void expert_wgrad(Model *m, const LayerParams *L, int k, void *dinp, const void *dout, const void *inp,
                         const int *lo, int accw) {
    const Ops *ops = m->ops;
    int D = m->cfg.d_model, Fe = m->cfg.expert_hidden, El = m->E_local;
    int C = k == 2 ? Fe : D, OC = k == 2 ? D : Fe, t = k == 0 ? L->exp_gate : k == 1 ? L->exp_up : L->exp_down;
    if (!m->wgrad_slots_on) {
        ops->grouped_matmul_backward(dinp, G(t), dout, inp, P(t), lo, El, C, OC, accw);
        return;
    }
    if (dinp) ops->grouped_matmul_backward(dinp, NULL, dout, inp, P(t), lo, El, C, OC, accw);
    double *slots = m->wgrad_slots + (size_t)L->moe_index * wgrad_slots_per_layer(&m->cfg, El) +
                    (size_t)k * ops_wgrad_slots(El, D, Fe);
    ops->grouped_wgrad_sumsq(G(t), slots, dout, inp, lo, El, C, OC, accw);
}

// Symmetric expert parallelism (ops/ep_sym.h): from the routed rows a->xp
// in expert order to their expert outputs a->ey in the same order, through
// the owners' receive buffers, with no host-visible size: counts into every
// peer's window, barrier, the plan (capacity and the receive bound), the
// rows straight into their owners' a->xl, barrier, the experts on the valid
// prefix, barrier, the outputs read back. The plan's drops are counted at
// the experts (dropped_step) and give zero outputs.
static void sym_moe_experts_forward(Model *m, const LayerParams *L, LayerActs *a, int li) {
    const Ops *ops = m->ops;
    const ModelConfig *c = &m->cfg;
    int N = m->B * m->T, D = c->d_model, E = c->n_experts, R = N * c->top_k, Fe = c->expert_hidden;
    int P = m->par.ep_size, El = m->E_local, rows = m->max_rows_local;
    sym_plan_layer(m, a, li);
    ops->ep_sym_dispatch(a->sym_recv, a->sym_plan, a->offsets, a->xp, P, E, R, D);
    symmem_barrier(m->sym);
    const int *lo = ep_sym_recv_offsets(a->sym_plan, E);
    a->local_offsets = lo;
    ops->grouped_matmul_forward(a->eg, a->xl, P(L->exp_gate), lo, El, D, Fe);
    ops->grouped_matmul_forward(a->eu, a->xl, P(L->exp_up), lo, El, D, Fe);
    ops->swiglu_forward_rows(a->ea, a->eg, a->eu, lo + El, rows, Fe);
    ops->grouped_matmul_forward(m->sym_out, a->ea, P(L->exp_down), lo, El, Fe, D);
    symmem_barrier(m->sym);
    ops->ep_sym_combine(a->ey, m->sym_out_tab, a->sym_plan, a->offsets, P, E, R, D);
}

// Its backward, mirrored: the output grads (dey, xp's order) straight into
// the owners' dout buffers, barrier, the experts' backward on the valid
// prefix (weight grads from a->xl), barrier, the input grads read back into
// dxp (zeros for dropped rows).
static void sym_moe_experts_backward(Model *m, const LayerParams *L, LayerActs *a) {
    const Ops *ops = m->ops;
    const ModelConfig *c = &m->cfg;
    int N = m->B * m->T, D = c->d_model, E = c->n_experts, R = N * c->top_k, Fe = c->expert_hidden;
    int P = m->par.ep_size, El = m->E_local, rows = m->max_rows_local;
    const int *lo = a->local_offsets;
    ops->ep_sym_dispatch(m->sym_dout_tab, a->sym_plan, a->offsets, m->dey, P, E, R, D);
    symmem_barrier(m->sym);
    if (recomputes_swiglu(m)) ops->swiglu_forward_rows(a->ea, a->eg, a->eu, lo + El, rows, Fe);
    int accw = !m->expert_grads_unset;
    expert_wgrad(m, L, 2, m->dea, m->sym_dout, a->ea, lo, accw);
    ops->swiglu_backward_rows(m->deg, m->deu, m->dea, a->eg, a->eu, lo + El, rows, Fe);
    expert_wgrad(m, L, 0, NULL, m->deg, a->xl, lo, accw);
    expert_wgrad(m, L, 1, NULL, m->deu, a->xl, lo, accw);
    ops->grouped_dgrad_pair(m->sym_dxl, m->deg, P(L->exp_gate), m->deu, P(L->exp_up), lo, El, D, Fe);
    symmem_barrier(m->sym);
    ops->ep_sym_combine(m->dxp, m->sym_dxl_tab, a->sym_plan, a->offsets, P, E, R, D);
}

// Counts what a forward dispatch sent (not again when a block is recomputed).
static void count_dispatch(Model *m, const EpPlan *p, size_t row_bytes) {
    if (m->recomputing) return;
    size_t rows = ep_sent_rows(p);
    m->step_dispatch_rows += (double)rows;
    m->step_dispatch_bytes += (double)rows * (double)row_bytes;
}

// The same without symmetric memory: dispatch to the experts' ranks with the
// all-to-all (dist/ep.h), run the local experts on their segments, combine
// back. One rank needs no plan: the experts' segments are the routed rows'
// offsets, which stay where they are (device memory).
static void a2a_moe_experts_forward(Model *m, const LayerParams *L, LayerActs *a, int li) {
    const Ops *ops = m->ops;
    const ModelConfig *c = &m->cfg;
    int N = m->B * m->T, D = c->d_model, R = N * c->top_k, Fe = c->expert_hidden;
    int El = m->E_local;
    Comm *epc = m->par.ep_comm;
    a->use_plan = m->par.ep_size > 1;
    int Rl = R;
    a->local_offsets = a->offsets;
    if (a->use_plan) {
        ep_plan(epc, ops, &a->plan, a->offsets);
        Rl = a->plan.rows;
        a->local_offsets = a->plan.local_offsets_b;
        ep_dispatch(epc, ops, &a->plan, a->xp, a->xl, m->ep_scratch, D);
        count_dispatch(m, &a->plan, (size_t)D * ops->act_bytes);
    }
    a->rows_local = Rl;
    if (ops->grouped_glu_forward) {
        ops->grouped_glu_forward(a->eg, a->eu, a->ea, a->xl, P(L->exp_gate), P(L->exp_up), a->local_offsets, El, D,
                                 Fe, Rl);
    } else {
        ops->grouped_matmul_forward(a->eg, a->xl, P(L->exp_gate), a->local_offsets, El, D, Fe);
        ops->grouped_matmul_forward(a->eu, a->xl, P(L->exp_up), a->local_offsets, El, D, Fe);
        ops->swiglu_forward(a->ea, a->eg, a->eu, (size_t)Rl * Fe);
    }
    ops->grouped_matmul_forward(a->yl, a->ea, P(L->exp_down), a->local_offsets, El, Fe, D);
    // capacity: the rows past each local expert's first `capacity` give zero
    // outputs (and get zero grads in backward), counted where they are (not
    // again when backward recomputes the block)
    int capacity = expert_capacity(m);
    if (capacity > 0)
        ops->moe_capacity_drop(a->yl, m->recomputing ? NULL : m->dropped_step + li, a->local_offsets, El, Rl, D,
                               capacity);
    if (a->use_plan) ep_combine(epc, ops, &a->plan, a->yl, a->ey, m->ep_scratch, D);
}

// train.precision: fp8 (model_set_fp8): the routed rows gathered and
// quantised in one pass, the three grouped GEMMs in FP8 with FP32
// accumulation, the SwiGLU output quantised as it is made. The backward
// reads the FP8 inputs (xq, eaq) and the BF16 eg, eu. With ep > 1 the
// rows are quantised here, at their source, in the plan's send order, and
// travel to the experts' ranks in FP8 with their scales (ep_dispatch_fp8:
// a 1 x 128 tile lies inside one row, so these are the codes and scales
// that quantising after the dispatch would give); the expert outputs come
// back in the compute dtype (ep_combine), as DeepSeek-V3's combine does.
// Local offsets, capacity and recompute as a2a_moe_experts_forward.
static void fp8_moe_experts_forward(Model *m, const LayerParams *L, LayerActs *a, const void *in, int li) {
    const Ops *ops = m->ops;
    const ModelConfig *c = &m->cfg;
    int R = m->B * m->T * c->top_k, D = c->d_model, Fe = c->expert_hidden, El = m->E_local;
    Comm *epc = m->par.ep_comm;
    a->use_plan = m->par.ep_size > 1;
    a->local_offsets = a->offsets;
    int Rl = R;
    if (a->use_plan) {
        ep_plan(epc, ops, &a->plan, a->offsets);
        Rl = a->plan.rows;
        a->local_offsets = a->plan.local_offsets_b;
        // received into ep_scratch: a payload row (33/32 D bytes) fits in D act elements
        ops->fp8_quantize_rows(m->fp8_src_q, m->fp8_src_s, in, a->token_of_row, R, D);
        ep_dispatch_fp8(epc, ops, &a->plan, m->fp8_src_q, m->fp8_src_s, a->xq, a->xs, m->fp8_send, m->ep_scratch, D);
        count_dispatch(m, &a->plan, fp8_payload_bytes(D));
    } else {
        ops->fp8_quantize_rows(a->xq, a->xs, in, a->token_of_row, R, D);
    }
    a->rows_local = Rl;
    const int *lo = a->local_offsets;
    ops->fp8_grouped_matmul_forward(a->eg, a->xq, a->xs, fp8_weight(m, li, 0), fp8_scales(m, li, 0), lo, El, D, Fe);
    ops->fp8_grouped_matmul_forward(a->eu, a->xq, a->xs, fp8_weight(m, li, 1), fp8_scales(m, li, 1), lo, El, D, Fe);
    ops->fp8_swiglu_quantize(a->eaq, a->eas, a->eg, a->eu, Rl, Fe);
    ops->fp8_grouped_matmul_forward(a->yl, a->eaq, a->eas, fp8_weight(m, li, 2), fp8_scales(m, li, 2), lo, El, Fe, D);
    int capacity = expert_capacity(m); // as a2a_moe_experts_forward
    if (capacity > 0)
        ops->moe_capacity_drop(a->yl, m->recomputing ? NULL : m->dropped_step + li, lo, El, Rl, D, capacity);
    if (a->use_plan) ep_combine(epc, ops, &a->plan, a->yl, a->ey, m->ep_scratch, D);
}

// train.precision: fp8 over the symmetric dispatch: the phases of
// sym_moe_experts_forward with fp8_moe_experts_forward's FP8 rows. The
// routed rows are quantised at their source (as the all-to-all's) and packed
// with their scales, one payload row each, which ep_sym_dispatch writes into
// the owners' sym_xrecv as fp8_payload_bytes(D) / act_bytes elements (whole:
// model_set_fp8); the owner unpacks them into the GEMMs' a->xq, a->xs. The
// slots are the BF16 path's, so the rows at each expert, and their order,
// are the a2a path's. Capacity and the receive bound are the plan's (the
// dropped rows are never sent; combine gives them zero outputs).
// Row counts: only the device knows the valid prefix recv_offsets[E_local],
// so the ops that need a host count (the unpack, the SwiGLU quantiser, and
// the backward's quantisers) run over the buffers' bound max_rows_local,
// not over a device count: each is a row-wise pass whose rows past the
// prefix are never read (every reader takes the device offsets: the
// grouped GEMMs, the weight-grads' 128 x 1 quantisers, the combine), and
// the FP8 rules map any garbage there (NaN, inf) to codes, never a trap;
// a device count would need a twin of every FP8 quantiser kernel. The
// cost: elementwise passes over up to ep x the rows (the default bound;
// parallel.ep_recv_factor lowers it), why ep_backend: auto keeps the
// all-to-all for fp8.
static void sym_fp8_moe_experts_forward(Model *m, const LayerParams *L, LayerActs *a, const void *in, int li) {
    const Ops *ops = m->ops;
    const ModelConfig *c = &m->cfg;
    int D = c->d_model, E = c->n_experts, R = m->B * m->T * c->top_k, Fe = c->expert_hidden;
    int P = m->par.ep_size, El = m->E_local, rows = m->max_rows_local;
    int Cp = (int)(fp8_payload_bytes(D) / ops->act_bytes); // a payload row in act elements
    sym_plan_layer(m, a, li);
    ops->fp8_quantize_rows(m->fp8_src_q, m->fp8_src_s, in, a->token_of_row, R, D);
    ops->fp8_pack_rows(m->fp8_send, m->fp8_src_q, m->fp8_src_s, R, D);
    ops->ep_sym_dispatch(m->sym_xrecv_tab, a->sym_plan, a->offsets, m->fp8_send, P, E, R, Cp);
    symmem_barrier(m->sym);
    const int *lo = ep_sym_recv_offsets(a->sym_plan, E);
    a->local_offsets = lo;
    ops->fp8_unpack_rows(a->xq, a->xs, m->sym_xrecv, NULL, rows, D);
    ops->fp8_grouped_matmul_forward(a->eg, a->xq, a->xs, fp8_weight(m, li, 0), fp8_scales(m, li, 0), lo, El, D, Fe);
    ops->fp8_grouped_matmul_forward(a->eu, a->xq, a->xs, fp8_weight(m, li, 1), fp8_scales(m, li, 1), lo, El, D, Fe);
    ops->fp8_swiglu_quantize(a->eaq, a->eas, a->eg, a->eu, rows, Fe);
    ops->fp8_grouped_matmul_forward(m->sym_out, a->eaq, a->eas, fp8_weight(m, li, 2), fp8_scales(m, li, 2), lo, El,
                                    Fe, D);
    symmem_barrier(m->sym);
    ops->ep_sym_combine(a->ey, m->sym_out_tab, a->sym_plan, a->offsets, P, E, R, D);
}

// The routed rows in expert order, xp[r] = in[token_of_row[r]] (R = N k):
// by the backend's scatter where it has one (each token row read once).
static void route_rows(Model *m, void *xp, const void *in, const LayerActs *a, int N, int k) {
    if (m->ops->permute_scatter) m->ops->permute_scatter(xp, in, a->row_of, N, k, m->cfg.d_model);
    else m->ops->permute_forward(xp, in, a->token_of_row, N * k, m->cfg.d_model);
}

// With res_out (not NULL), the layer's output goes straight into the
// residual stream: res_out = res_in + the combined expert rows
// (ops->unpermute_residual, the bits of unpermute_forward then sum_act),
// and a->f is not written.
static void moe_forward(Model *m, int l, const LayerParams *L, LayerActs *a, const void *in, void *res_out,
                        const void *res_in) {
    const Ops *ops = m->ops;
    const ModelConfig *c = &m->cfg;
    int N = m->B * m->T, D = c->d_model, E = c->n_experts, k = c->top_k;
    int li = L->moe_index;
    ops->router_logits_forward(a->logits, in, P(L->router), N, D, E);
    ops->router_probs_forward(a->probs, a->logits, N, E, c->gating);
    const float *bias = c->aux_free_rate > 0 ? m->store.router_bias + (size_t)li * E : NULL;
    ops->router_topk(a->idx, a->probs, bias, N, E, k, c->routing, m->route_seeds + l); // model_set_route_seed's
    ops->router_weights_forward(a->weights, a->probs, a->idx, N, E, k, c->renorm_topk);
    ops->zero(a->counts, E * sizeof(float));
    ops->router_count(a->counts, a->idx, N, E, k);
    float *step_counts = m->step_counts + (size_t)li * E;
    // a block recomputed in backward (recompute: layers) redoes the
    // forward's values but not its bookkeeping: the step's counts, the
    // global LB counts and the drop counts were taken the first time
    int again = m->recomputing;
    if (!again) ops->add_f32(step_counts, a->counts, E);
    if (c->lb_global && again) { // the counts the first time saw
        ops->copy_f32(a->lb_counts, m->lb_global_counts + (size_t)li * E, E);
    } else if (c->lb_global) {
        // Megatron-Core's global_aux_loss: this micro-batch's counts summed
        // over the dp group (every rank runs its i-th micro-batch at once),
        // added to those of the step's earlier micro-batches; f_i is their
        // share of the tokens they cover. P_i stays this micro-batch's.
        float *global = m->lb_global_counts + (size_t)li * E;
        int dp = m->par.dp_comm ? comm_size(m->par.dp_comm) : 1;
        ops->copy_f32(a->lb_counts, a->counts, E);
        if (dp > 1) comm_allreduce(m->par.dp_comm, a->lb_counts, E, COMM_F32); // backend buffers: host on CPU
        ops->add_f32(global, a->lb_counts, E);
        ops->copy_f32(a->lb_counts, global, E);
        a->lb_tokens = 0; // the kernels' sum of the counts / k: (step tokens so far + N) x dp, no host argument
    } else {
        ops->copy_f32(a->lb_counts, a->counts, E);
        a->lb_tokens = (float)N;
    }
    ops->lb_loss_forward(m->lb_mb + li, a->probs, a->lb_counts, a->lb_tokens, N, E, k, c->gating);
    ops->zloss_forward(m->z_mb + li, a->logits, N, E);

    ops->moe_route_index(a->offsets, a->row_of, a->token_of_row, a->idx, N, E, k);
    // the routed rows to their experts and the outputs back (a->xp -> a->ey)
    if (m->fp8) {
        if (m->ep_sym) sym_fp8_moe_experts_forward(m, L, a, in, li);
        else fp8_moe_experts_forward(m, L, a, in, li);
    } else {
        route_rows(m, a->xp, in, a, N, k);
        if (m->ep_sym) sym_moe_experts_forward(m, L, a, li);
        else a2a_moe_experts_forward(m, L, a, li);
    }
    if (res_out) {
        ops->unpermute_residual(res_out, res_in, a->ey, a->weights, a->row_of, N, k, D);
        return;
    }
    ops->unpermute_forward(a->f, a->ey, a->weights, a->row_of, N, k, D, 0);
    if (c->n_shared > 0) {
        int Fs = c->n_shared * c->shared_hidden;
        swiglu_mlp_forward(m, a->so, a->sg, a->su, a->sa, in, L->sh_gate, L->sh_up, L->sh_down, N, Fs);
        ops->add_act(a->f, a->so, (size_t)N * D);
    }
}

void model_set_route_seed(Model *m, uint64_t route_seed) {
    if (m->cfg.routing != ROUTING_RANDOM || (m->route_seed_set && m->route_seed == route_seed)) return;
    int L = m->cfg.n_layers;
    uint64_t *s = m->route_seeds_host;
    for (int l = 0; l < L; l++) s[l] = layer_seed(route_seed, l);
    m->ops->to_device(m->route_seeds, s, L * sizeof(uint64_t));
    m->route_seed = route_seed;
    m->route_seed_set = 1;
}

void model_set_batch(Model *m, const int *tokens, const int *targets) {
    int N = m->B * m->T;
    m->ops->to_device(m->tokens, tokens, N * sizeof(int));
    m->ops->to_device(m->targets, targets, N * sizeof(int));
    m->n_valid = (int)model_count_valid(targets, N);
    m->batch_docs = 0;
    if (m->doc_start) {
        model_doc_starts(m->doc_start_host, tokens, m->B, m->T, m->doc_eos);
        for (int b = 0; b < m->B && !m->batch_docs; b++) m->batch_docs = m->doc_start_host[(size_t)b * m->T + m->T - 1] > 0;
        if (m->batch_docs) m->ops->to_device(m->doc_start, m->doc_start_host, N * sizeof(int));
    }
}

void model_doc_starts(int *doc_start, const int *tokens, int B, int T, int eos) {
    for (int b = 0; b < B; b++) {
        const int *x = tokens + (size_t)b * T;
        int *ds = doc_start + (size_t)b * T;
        for (int t = 0; t < T; t++) ds[t] = t == 0 ? 0 : x[t - 1] == eos ? t : ds[t - 1];
    }
}

int64_t model_count_valid(const int *targets, size_t n) {
    int64_t valid = 0;
    for (size_t i = 0; i < n; i++) valid += targets[i] >= 0;
    return valid;
}

double model_aux_loss(const ModelConfig *c, const double *lb, const double *z, int n_moe) {
    double aux = 0;
    for (int i = 0; i < n_moe; i++) aux += (double)c->lb_coef * lb[i] + (double)c->z_coef * z[i];
    return aux;
}

// Block l: resid[l] -> resid[l + 1], its activations into acts[l].
// Random routing reads the layer's seed from the slot's route_seeds, which a
// recompute in the backward finds unchanged.
static void block_forward(Model *m, int l) {
    const Ops *ops = m->ops;
    const ModelConfig *c = &m->cfg;
    int N = m->B * m->T, D = c->d_model;
    const LayerParams *L = &m->layers[l];
    LayerActs *a = &m->acts[l];
    const void *x = m->resid[l];
    const void *in = maybe_norm(m, a->ln1, a->ln1_rstd, x, L->attn_norm, N);
    attention_forward(m, L, a, in);
    const void *add = maybe_norm(m, a->on, a->o_rstd, a->o, L->attn_post_norm, N);
    ops->sum_act(a->h, x, add, (size_t)N * D);
    in = maybe_norm(m, a->ln2, a->ln2_rstd, a->h, L->ffn_norm, N);
    // an MoE output that only joins the residual stream: combined into it
    if (L->moe_index >= 0 && L->ffn_post_norm < 0 && c->n_shared == 0 && ops->unpermute_residual) {
        moe_forward(m, l, L, a, in, m->resid[l + 1], a->h);
        return;
    }
    if (L->moe_index >= 0) moe_forward(m, l, L, a, in, NULL, NULL);
    else swiglu_mlp_forward(m, a->f, a->g, a->u, a->a, in, L->mlp_gate, L->mlp_up, L->mlp_down, N, c->dense_hidden);
    add = maybe_norm(m, a->fn, a->f_rstd, a->f, L->ffn_post_norm, N);
    ops->sum_act(m->resid[l + 1], a->h, add, (size_t)N * D);
}

// The MoE layers of chunk ch: [*first, *first + *n) by moe_index.
static void chunk_moe_range(const Model *m, int ch, int *first, int *n) {
    *first = 0;
    *n = 0;
    for (int l = m->stage.begin[ch]; l < m->stage.end[ch]; l++) {
        int mi = m->layers[l].moe_index;
        if (mi < 0) continue;
        if (*n == 0) *first = mi;
        (*n)++;
    }
}

void model_forward_chunk(Model *m, int ch, uint64_t route_seed) {
    const Ops *ops = m->ops;
    const ModelConfig *c = &m->cfg;
    int N = m->B * m->T, D = c->d_model;
    int first = m->stage.begin[ch], end = m->stage.end[ch];
    int head = m->stage.head && ch == m->stage.n_chunks - 1;
    model_set_route_seed(m, route_seed);
    if (m->stage.embed && ch == 0) ops->embedding_forward(m->resid[0], m->tokens, P(m->embed), N, D);
    for (int l = first; l < end; l++) {
        block_forward(m, l);
        if (m->between_blocks) m->between_blocks(m->between_blocks_ctx);
    }
    int mf, mn;
    chunk_moe_range(m, ch, &mf, &mn);
    if (mn) {
        ops->add_f32(m->lb_step + mf, m->lb_mb + mf, mn);
        ops->add_f32(m->z_step + mf, m->z_mb + mf, mn);
    }
    if (!head) return;
    ops->rmsnorm_forward(m->xf, m->xf_rstd, m->resid[c->n_layers], P(m->final_norm), N, D, c->norm_eps);
    ops->matmul_forward(m->logits, m->xf, P(m->lm_head), N, D, c->padded_vocab);
    if (m->ce_fused_scale != 0 && ops->crossentropy_fused) { // dlogits over the logits, for the backward
        ops->crossentropy_fused(m->losses, m->logits, m->logits, m->targets, m->ce_fused_scale, N, c->padded_vocab);
        m->ce_dlogits_ready = 1;
    } else {
        ops->crossentropy_forward(m->losses, m->logits, m->targets, N, c->padded_vocab);
    }
    ops->zero(m->ce_acc, sizeof(double));
    ops->loss_sum(m->ce_acc, m->losses, m->targets, N);      // this micro-batch
    ops->loss_sum(m->ce_acc + 1, m->losses, m->targets, N);  // the step
}

void model_forward_async(Model *m, uint64_t route_seed) {
    for (int ch = 0; ch < m->stage.n_chunks; ch++) model_forward_chunk(m, ch, route_seed);
}

void *model_chunk_input(Model *m, int ch) { return m->resid[m->stage.begin[ch]]; }
void *model_chunk_output(Model *m, int ch) { return m->resid[m->stage.end[ch]]; }
void *model_stage_dres(Model *m) { return m->dres; }
void *model_stage_grad_out(Model *m) {
    if (!m->grad_out) die("model_stage_grad_out: the model is not a pipeline stage");
    m->ops->copy_act(m->grad_out, m->dres, (size_t)m->B * m->T * m->cfg.d_model);
    return m->grad_out;
}

void model_count_chunk(Model *m, int ch) {
    int N = m->B * m->T;
    for (int l = m->stage.begin[ch]; l < m->stage.end[ch]; l++)
        if (m->layers[l].moe_index >= 0) m->step_rows[m->layers[l].moe_index] += (float)N * m->cfg.top_k;
    if (ch == m->stage.n_chunks - 1) m->step_tokens += N;
}

void model_count_micro_batch(Model *m) {
    if (m->staged) {
        for (int ch = 0; ch < m->stage.n_chunks; ch++) model_count_chunk(m, ch);
        return;
    }
    int N = m->B * m->T;
    m->step_tokens += N;
    for (int li = 0; li < m->n_moe; li++) m->step_rows[li] += (float)N * m->cfg.top_k;
}

float model_forward(Model *m, const int *tokens, const int *targets, uint64_t route_seed) {
    model_set_batch(m, tokens, targets);
    model_forward_async(m, route_seed);
    model_count_micro_batch(m);
    const ModelConfig *c = &m->cfg;
    m->ops->to_host(&m->ce_sum, m->ce_acc, sizeof(double));
    if (m->n_moe) {
        m->ops->to_host(m->lb, m->lb_mb, m->n_moe * sizeof(float));
        m->ops->to_host(m->z, m->z_mb, m->n_moe * sizeof(float));
        m->ops->to_host(m->step_dropped, m->dropped_step, m->n_moe * sizeof(float));
    }
    m->loss_ce = m->n_valid ? (float)(m->ce_sum / m->n_valid) : 0.0f;
    double lb[m->n_moe + 1], z[m->n_moe + 1];
    for (int i = 0; i < m->n_moe; i++) { lb[i] = m->lb[i]; z[i] = m->z[i]; }
    m->loss_total = (float)(m->loss_ce + model_aux_loss(c, lb, z, m->n_moe));
    return m->loss_total;
}

// ---- backward -------------------------------------------------------------------------

// Backward of maybe_norm: returns the grad w.r.t. the norm input. Without a
// norm the grad passes through unchanged (returns dout itself).
static const void *maybe_norm_backward(Model *m, void *dinp, const void *dout, const void *inp,
                                       const float *rstd, int w, int N) {
    if (w < 0) return dout;
    m->ops->rmsnorm_backward(dinp, G(w), dout, inp, P(w), rstd, N, m->cfg.d_model, 0);
    return dinp;
}

// Accumulates into dres the grad through the sublayer's input norm (pre /
// peri) or, without one, directly (the sublayer wrote into dres).
static void input_norm_backward(Model *m, const void *din, const void *x, const float *rstd, int w, int N) {
    if (w >= 0) m->ops->rmsnorm_backward(m->dres, G(w), din, x, P(w), rstd, N, m->cfg.d_model, 1);
}

// dinp (=|+=) grad of out = SwiGLU(in); recompute_swiglu: act (a shared
// buffer) is made again from g and u first
static void swiglu_mlp_backward(Model *m, void *dinp, const void *dout, const void *in,
                                const void *g, const void *u, void *act, void *da,
                                void *dg, void *du, int wg, int wu, int wd, int N, int F,
                                int accumulate) {
    const Ops *ops = m->ops;
    int D = m->cfg.d_model;
    if (m->recompute_swiglu) ops->swiglu_forward(act, g, u, (size_t)N * F);
    dense_backward(m, da, G(wd), dout, dense_wgrad_input(m, act, N, F), wd, N, F, D, 0);
    ops->swiglu_backward(dg, du, da, g, u, (size_t)N * F);
    const void *xw = dense_wgrad_input(m, in, N, D);
    dense_backward(m, dinp, G(wg), dg, xw, wg, N, D, F, accumulate);
    dense_backward(m, dinp, G(wu), du, xw, wu, N, D, F, 1);
}

// a2a_moe_experts_forward's backward: the grad of combine is a dispatch, and
// the grad of dispatch a combine.
static void a2a_moe_experts_backward(Model *m, const LayerParams *L, LayerActs *a, const void *in) {
    const Ops *ops = m->ops;
    const ModelConfig *c = &m->cfg;
    int D = c->d_model, Fe = c->expert_hidden;
    int El = m->E_local, Rl = a->rows_local;
    const int *lo = a->local_offsets;
    Comm *epc = m->par.ep_comm;
    void *dyl = m->dey, *dxl = m->dxp;
    if (a->use_plan) {
        dyl = m->dyl;
        dxl = m->dxl;
        ep_dispatch(epc, ops, &a->plan, m->dey, dyl, m->ep_scratch, D);
    }
    int capacity = expert_capacity(m); // dropped rows get zero grads
    if (capacity > 0) ops->moe_capacity_drop(dyl, NULL, lo, El, Rl, D, capacity);
    // recompute: a->ea and (rows kept here) a->xp = a->xl are shared buffers
    // that later layers overwrote in the forward
    if (recomputes_swiglu(m)) ops->swiglu_forward(a->ea, a->eg, a->eu, (size_t)Rl * Fe);
    int accw = !m->expert_grads_unset; // the step's first backward writes the expert grads
    expert_wgrad(m, L, 2, m->dea, dyl, a->ea, lo, accw);
    ops->swiglu_backward(m->deg, m->deu, m->dea, a->eg, a->eu, (size_t)Rl * Fe);
    if ((m->recompute == 1 || m->recompute == 2) && !a->use_plan) // the rows stayed here: xl is xp, shared (carve)
        route_rows(m, a->xl, in, a, m->B * m->T, c->top_k);
    expert_wgrad(m, L, 0, NULL, m->deg, a->xl, lo, accw);
    expert_wgrad(m, L, 1, NULL, m->deu, a->xl, lo, accw);
    ops->grouped_dgrad_pair(dxl, m->deg, P(L->exp_gate), m->deu, P(L->exp_up), lo, El, D, Fe);
    if (a->use_plan) ep_combine(epc, ops, &a->plan, dxl, m->dxp, m->ep_scratch, D);
}

// fp8_moe_experts_forward's backward. The data-grads in FP8: the output
// grads quantised 1 x 128 (the down's as they come, the gate/up pair's as
// the SwiGLU backward writes them, side by side: one GEMM with K = 2 Fe),
// times the weights' transposed FP8 copies. The weight-grads in the compute
// dtype: the unquantised output grads times the dequantised FP8 inputs; with
// fp8.wgrad: fp8 both quantised per 128 x 1 tile along the tokens, on the
// FP8 weight-grad GEMM where the backend has it, else fake-quantised in
// place for the compute-dtype weight-grad.
// Each output grad's data- and weight-grad read the same values (dy;
// deg, deu), only the data-grad's quantised. On the R rows at this rank's
// experts (ep > 1: fp8_moe_experts_backward_ep and
// sym_fp8_moe_experts_backward below move them): dy their output grads
// (quantised in place under fp8.wgrad: fp8), dx their input grads.
// dy_codes: m->fp8_dq / fp8_ds hold dy's 1 x 128 codes already (moe_backward
// made them with dy: fp8_unpermute_backward_quantize).
static void fp8_moe_experts_backward(Model *m, const LayerParams *L, LayerActs *a, const void *in, void *dy, void *dx,
                                     int R, int dy_codes) {
    const Ops *ops = m->ops;
    const ModelConfig *c = &m->cfg;
    int D = c->d_model, Fe = c->expert_hidden, El = m->E_local;
    const int *lo = a->local_offsets;
    int capacity = m->ep_sym ? 0 : expert_capacity(m); // dropped rows get zero grads (symmetric: never sent)
    if (capacity > 0) ops->moe_capacity_drop(dy, NULL, lo, El, R, D, capacity);
    // recompute: a->eaq and (both) a->xq are shared buffers that later layers overwrote
    if (recomputes_swiglu(m)) ops->fp8_swiglu_quantize(a->eaq, a->eas, a->eg, a->eu, R, Fe);
    int accw = !m->expert_grads_unset, li = L->moe_index;
    if (!dy_codes) ops->fp8_quantize_rows(m->fp8_dq, m->fp8_ds, dy, NULL, R, D);
    ops->fp8_grouped_matmul_forward(m->dea, m->fp8_dq, m->fp8_ds, fp8_weight_t(m, li, 2), fp8_scales_t(m, li, 2), lo,
                                    El, D, Fe);
    int ldk = m->fp8_ldk;
    if (m->fp8_wqa) { // fp8.wgrad: fp8 on the FP8 weight-grad GEMM
        ops->fp8_quantize_tokens_t(m->fp8_wqa, m->fp8_wsa, dy, lo, El, D, ldk);
        ops->fp8_requantize_tokens_t(m->fp8_wqb, m->fp8_wsb, a->eaq, a->eas, lo, El, Fe, ldk); // from the FP8 input
        ops->fp8_grouped_wgrad(G(L->exp_down), m->fp8_wqa, m->fp8_wsa, m->fp8_wqb, m->fp8_wsb, lo, El, Fe, D, ldk, accw);
    } else {
        ops->fp8_dequantize_rows(m->fp8_deq, a->eaq, a->eas, R, Fe);
        if (m->fp8_wgrad) { // dey's last use is this weight-grad: quantised in place
            ops->fp8_fake_quantize_tokens(m->fp8_deq, lo, El, Fe);
            ops->fp8_fake_quantize_tokens(dy, lo, El, D);
        }
        expert_wgrad(m, L, 2, NULL, dy, m->fp8_deq, lo, accw);
    }
    ops->fp8_swiglu_backward_quantize(m->deg, m->deu, m->fp8_dq, m->fp8_ds, m->dea, a->eg, a->eu, R, Fe);
    ops->fp8_grouped_matmul_forward(dx, m->fp8_dq, m->fp8_ds, fp8_weight_t(m, li, 0), fp8_scales_t(m, li, 0), lo,
                                    El, 2 * Fe, D);
    // xq: a shared buffer, overwritten since; ep > 1 keeps the received rows (carve_slot)
    int regather = (m->recompute == 1 || m->recompute == 2) && !a->use_plan && !m->ep_sym;
    if (m->fp8_wqa) { // the input along the tokens once, then each output grad in turn
        if (regather) ops->fp8_quantize_rows(a->xq, a->xs, in, a->token_of_row, R, D);
        ops->fp8_requantize_tokens_t(m->fp8_wqb, m->fp8_wsb, a->xq, a->xs, lo, El, D, ldk);
        ops->fp8_quantize_tokens_t(m->fp8_wqa, m->fp8_wsa, m->deg, lo, El, Fe, ldk);
        ops->fp8_grouped_wgrad(G(L->exp_gate), m->fp8_wqa, m->fp8_wsa, m->fp8_wqb, m->fp8_wsb, lo, El, D, Fe, ldk, accw);
        ops->fp8_quantize_tokens_t(m->fp8_wqa, m->fp8_wsa, m->deu, lo, El, Fe, ldk);
        ops->fp8_grouped_wgrad(G(L->exp_up), m->fp8_wqa, m->fp8_wsa, m->fp8_wqb, m->fp8_wsb, lo, El, D, Fe, ldk, accw);
        return;
    }
    // the weight-grads' input: the dequantised FP8 input, re-gathered in one pass (no codes between)
    if (regather) ops->fp8_fake_quantize_rows(m->fp8_deq, in, a->token_of_row, R, D);
    else ops->fp8_dequantize_rows(m->fp8_deq, a->xq, a->xs, R, D);
    if (m->fp8_wgrad) { // deg and deu are used by these two weight-grads alone (the pair's data-grad read fp8_dq)
        ops->fp8_fake_quantize_tokens(m->fp8_deq, lo, El, D);
        ops->fp8_fake_quantize_tokens(m->deg, lo, El, Fe);
        ops->fp8_fake_quantize_tokens(m->deu, lo, El, Fe);
    }
    expert_wgrad(m, L, 0, NULL, m->deg, m->fp8_deq, lo, accw);
    expert_wgrad(m, L, 1, NULL, m->deu, m->fp8_deq, lo, accw);
}

// With ep > 1, fp8_moe_experts_backward between the moves of
// a2a_moe_experts_backward: the routed rows' output grads dy to the
// experts' ranks (into dey, in their rows' order), the input grads back
// from dxp into dx. Both travel in the compute dtype, dY unquantised: the
// weight-grads read it so under fp8.wgrad: bf16, and fp8.wgrad: fp8
// quantises it per 128 x 1 tile along each expert's tokens, which come from
// every source rank, so 1 x 128 codes made at the sources could not give
// those tiles (only a second rounding of them); dY with its 1 x 128 codes
// as well would be more bytes than dY alone. The data-grad's 1 x 128 codes
// are then made at the experts, from the values ep = 1 quantises.
static void fp8_moe_experts_backward_ep(Model *m, const LayerParams *L, LayerActs *a, const void *in, void *dy,
                                        void *dx, int dy_codes) {
    if (!a->use_plan) { fp8_moe_experts_backward(m, L, a, in, dy, dx, a->rows_local, dy_codes); return; } // dey, dxp
    Comm *epc = m->par.ep_comm;
    ep_dispatch(epc, m->ops, &a->plan, dy, m->dey, m->ep_scratch, m->cfg.d_model);
    fp8_moe_experts_backward(m, L, a, in, m->dey, m->dxp, a->rows_local, 0);
    ep_combine(epc, m->ops, &a->plan, m->dxp, dx, m->ep_scratch, m->cfg.d_model);
}

// sym_fp8_moe_experts_forward's backward: sym_moe_experts_backward's moves
// around fp8_moe_experts_backward, dY and dX in the compute dtype as the
// all-to-all's (fp8_moe_experts_backward_ep says why), on the bound
// max_rows_local (sym_fp8_moe_experts_forward says why).
static void sym_fp8_moe_experts_backward(Model *m, const LayerParams *L, LayerActs *a, const void *in) {
    const Ops *ops = m->ops;
    const ModelConfig *c = &m->cfg;
    int D = c->d_model, E = c->n_experts, R = m->B * m->T * c->top_k, P = m->par.ep_size;
    ops->ep_sym_dispatch(m->sym_dout_tab, a->sym_plan, a->offsets, m->dey, P, E, R, D);
    symmem_barrier(m->sym);
    fp8_moe_experts_backward(m, L, a, in, m->sym_dout, m->sym_dxl, m->max_rows_local, 0);
    symmem_barrier(m->sym);
    ops->ep_sym_combine(m->dxp, m->sym_dxl_tab, a->sym_plan, a->offsets, P, E, R, D);
}

static void moe_backward(Model *m, const LayerParams *L, LayerActs *a, void *dinp,
                         const void *dout, const void *in, float aux_scale, int accumulate) {
    const Ops *ops = m->ops;
    const ModelConfig *c = &m->cfg;
    int N = m->B * m->T, D = c->d_model, E = c->n_experts, k = c->top_k;
    int R = N * k;
    if (c->n_shared > 0) {
        int Fs = c->n_shared * c->shared_hidden;
        swiglu_mlp_backward(m, dinp, dout, in, a->sg, a->su, a->sa, m->dsa, m->dsg, m->dsu,
                            L->sh_gate, L->sh_up, L->sh_down, N, Fs, accumulate);
        accumulate = 1;
    }
    // the routed rows' output grads dy to the experts and the input grads dx
    // back (dey, dxp; fp8 with ep > 1: dyl, dxl, carve_shared)
    void *dy = m->fp8 && a->use_plan ? m->dyl : m->dey, *dx = m->fp8 && a->use_plan ? m->dxl : m->dxp;
    // FP8 on this rank's own rows with nothing dropped: dy's data-grad codes
    // are made as dy is stored (the rows all stay here, in dy's order)
    int dy_codes = m->fp8 && !a->use_plan && !m->ep_sym && expert_capacity(m) == 0 &&
                   ops->fp8_unpermute_backward_quantize;
    if (dy_codes)
        ops->fp8_unpermute_backward_quantize(dy, m->dweights, m->fp8_dq, m->fp8_ds, dout, a->ey, a->weights, a->row_of,
                                             N, k, D);
    else ops->unpermute_backward(dy, m->dweights, dout, a->ey, a->weights, a->row_of, N, k, D);
    if (m->fp8 && m->ep_sym) sym_fp8_moe_experts_backward(m, L, a, in);
    else if (m->fp8) fp8_moe_experts_backward_ep(m, L, a, in, dy, dx, dy_codes);
    else if (m->ep_sym) sym_moe_experts_backward(m, L, a);
    else a2a_moe_experts_backward(m, L, a, in);
    ops->permute_backward(dinp, dx, a->token_of_row, N, R, D, accumulate);
    // router: weights <- probs <- logits, plus the aux losses
    ops->router_weights_backward(m->dprobs, m->dweights, a->probs, a->idx, N, E, k, c->renorm_topk, 0);
    if (c->lb_coef > 0)
        ops->lb_loss_backward(m->dprobs, a->probs, a->lb_counts, a->lb_tokens, N, E, k, c->gating,
                              c->lb_coef * aux_scale);
    ops->router_probs_backward(m->dlogits, m->dprobs, a->probs, N, E, c->gating, 0);
    if (c->z_coef > 0) ops->zloss_backward(m->dlogits, a->logits, N, E, c->z_coef * aux_scale);
    ops->router_logits_backward(dinp, G(L->router), m->dlogits, in, P(L->router), N, D, E);
}

static void attention_backward(Model *m, const LayerParams *L, LayerActs *a, void *dinp,
                               const void *dout, const void *in, int accumulate) {
    const Ops *ops = m->ops;
    const ModelConfig *c = &m->cfg;
    int B = m->B, T = m->T, N = B * T, D = c->d_model, H = c->n_heads, KV = c->n_kv_heads;
    int hd = c->head_dim, qd = model_q_dim(c), kvd = model_kv_dim(c);
    int defer = m->defer_wgrad; // the weight grads come later, in model_wgrad_chunk
    dense_backward(m, m->dao, defer ? NULL : G(L->wo), dout, dense_wgrad_input(m, a->ao, N, qd), L->wo, N, qd, D, 0);
    if (defer) ops->copy_act(a->w_do, dout, (size_t)N * D);
    ops->attention_backward(m->dq, m->dk, m->dv, m->dao, a->att, a->qr, a->kr, a->v, a->ao, model_docs(m),
                            m->att_scratch, B, T, H, KV, hd);
    // RoPE back, then the QK-norm (one op; dq2, dk2 its scratch): grads w.r.t. q, k
    const void *dq = m->dq2, *dk = m->dk2;
    if (c->qk_norm != QKNORM_NONE) {
        int full = c->qk_norm == QKNORM_FULL;
        ops->rmsnorm_rope_backward(m->dq, G(L->q_norm), m->dq2, m->dq, a->q, P(L->q_norm), a->qn_rstd, m->rope_cos,
                                   m->rope_sin, B, T, H, hd, full ? qd : hd, 0);
        ops->rmsnorm_rope_backward(m->dk, G(L->k_norm), m->dk2, m->dk, a->k, P(L->k_norm), a->kn_rstd, m->rope_cos,
                                   m->rope_sin, B, T, KV, hd, full ? kvd : hd, 0);
        dq = m->dq; dk = m->dk;
    } else {
        ops->rope_backward(m->dq2, m->dq, m->rope_cos, m->rope_sin, B, T, H, hd);
        ops->rope_backward(m->dk2, m->dk, m->rope_cos, m->rope_sin, B, T, KV, hd);
    }
    if (defer) {
        ops->copy_act(a->w_dq, dq, (size_t)N * qd);
        ops->copy_act(a->w_dk, dk, (size_t)N * kvd);
        ops->copy_act(a->w_dv, m->dv, (size_t)N * kvd);
    }
    const void *xw = dense_wgrad_input(m, in, N, D);
    dense_backward(m, dinp, defer ? NULL : G(L->wq), dq, xw, L->wq, N, D, qd, accumulate);
    dense_backward(m, dinp, defer ? NULL : G(L->wk), dk, xw, L->wk, N, D, kvd, 1);
    dense_backward(m, dinp, defer ? NULL : G(L->wv), m->dv, xw, L->wv, N, D, kvd, 1);
}

void model_wgrad_chunk(Model *m, int ch) {
    if (!m->defer_wgrad) return;
    const Ops *ops = m->ops;
    const ModelConfig *c = &m->cfg;
    int N = m->B * m->T, D = c->d_model, qd = model_q_dim(c), kvd = model_kv_dim(c);
    if (m->stage.head && ch == m->stage.n_chunks - 1) // the logits hold their grads (in place)
        ops->matmul_backward(NULL, G(m->lm_head), m->logits, m->xf, P(m->lm_head), N, D, c->padded_vocab, 0);
    for (int l = m->stage.end[ch] - 1; l >= m->stage.begin[ch]; l--) {
        const LayerParams *L = &m->layers[l];
        LayerActs *a = &m->acts[l];
        const void *in = L->attn_norm >= 0 ? a->ln1 : m->resid[l];
        ops->matmul_backward(NULL, G(L->wo), a->w_do, a->ao, P(L->wo), N, qd, D, 0);
        ops->matmul_backward(NULL, G(L->wq), a->w_dq, in, P(L->wq), N, D, qd, 0);
        ops->matmul_backward(NULL, G(L->wk), a->w_dk, in, P(L->wk), N, D, kvd, 0);
        ops->matmul_backward(NULL, G(L->wv), a->w_dv, in, P(L->wv), N, D, kvd, 0);
    }
}

// Tells the store's hook (DDP) that the grads of entries [first, end) are final.
static void grads_final(Model *m, int first, int end) {
    if (m->store.grads_ready) m->store.grads_ready(m->store.grads_ready_ctx, first, end);
}

void model_backward_chunk(Model *m, int ch, float ce_scale, float aux_scale) {
    const Ops *ops = m->ops;
    const ModelConfig *c = &m->cfg;
    int N = m->B * m->T, D = c->d_model, Vp = c->padded_vocab;
    if (m->stage.head && ch == m->stage.n_chunks - 1) {
        // classifier: dlogits overwrite the logits in place (or did in the forward)
        if (m->ce_dlogits_ready) {
            if (ce_scale != m->ce_fused_scale)
                die("model_backward: ce_scale %g differs from the %g the forward's fused cross-entropy used",
                    (double)ce_scale, (double)m->ce_fused_scale);
            m->ce_dlogits_ready = 0;
        } else {
            ops->crossentropy_backward(m->logits, m->logits, m->targets, ce_scale, N, Vp);
        }
        ops->matmul_backward(m->d1, m->defer_wgrad ? NULL : G(m->lm_head), m->logits, m->xf, P(m->lm_head), N, D, Vp, 0);
        ops->rmsnorm_backward(m->dres, G(m->final_norm), m->d1, m->resid[c->n_layers],
                              P(m->final_norm), m->xf_rstd, N, D, 0);
        grads_final(m, m->final_norm, m->store.table.n);
    } // else dres holds the grad of the chunk's output (model.h)
    for (int l = m->stage.end[ch] - 1; l >= m->stage.begin[ch]; l--) {
        const LayerParams *L = &m->layers[l];
        LayerActs *a = &m->acts[l];
        if (model_recomputes_layer(m, l)) { // its activations, again, from its input (same kernels: same bits)
            m->recomputing = 1;
            block_forward(m, l);
            m->recomputing = 0;
        }
        // feed-forward half: y = h + post(ffn(pre(h))); dres holds dL/dy
        const void *df = maybe_norm_backward(m, m->d1, m->dres, a->f, a->f_rstd, L->ffn_post_norm, N);
        if (m->recompute_norms) maybe_norm(m, a->ln2, a->ln2_rstd, a->h, L->ffn_norm, N); // the same bits again
        const void *in = L->ffn_norm >= 0 ? a->ln2 : a->h;
        void *din = L->ffn_norm >= 0 ? m->d2 : m->dres; // without an input norm, add straight into dres
        int acc = L->ffn_norm < 0;
        if (L->moe_index >= 0) moe_backward(m, L, a, din, df, in, aux_scale, acc);
        else swiglu_mlp_backward(m, din, df, in, a->g, a->u, a->a, m->da, m->dg, m->du,
                                 L->mlp_gate, L->mlp_up, L->mlp_down, N, c->dense_hidden, acc);
        input_norm_backward(m, m->d2, a->h, a->ln2_rstd, L->ffn_norm, N);
        // attention half: h = x + post(attn(pre(x))); dres holds dL/dh
        const void *x = m->resid[l];
        const void *dout = maybe_norm_backward(m, m->d1, m->dres, a->o, a->o_rstd, L->attn_post_norm, N);
        if (m->recompute_norms) maybe_norm(m, a->ln1, a->ln1_rstd, x, L->attn_norm, N);
        if (m->recompute_attention && !model_recomputes_layer(m, l)) attention_core_forward(m, L, a); // same bits
        in = L->attn_norm >= 0 ? a->ln1 : x;
        din = L->attn_norm >= 0 ? m->d2 : m->dres;
        attention_backward(m, L, a, din, dout, in, L->attn_norm < 0);
        input_norm_backward(m, m->d2, x, a->ln1_rstd, L->attn_norm, N);
        grads_final(m, L->first_entry, L->end_entry);
        if (m->between_blocks) m->between_blocks(m->between_blocks_ctx);
    }
    if (m->stage.embed && ch == 0) {
        ops->embedding_backward(G(m->embed), m->dres, m->tokens, N, D);
        grads_final(m, m->embed, m->embed + 1);
    }
}

void model_backward(Model *m, float ce_scale, float aux_scale) {
    for (int ch = m->stage.n_chunks - 1; ch >= 0; ch--) model_backward_chunk(m, ch, ce_scale, aux_scale);
    m->expert_grads_unset = 0;
}

void model_end_step(Model *m) {
    const ModelConfig *c = &m->cfg;
    if (!(c->aux_free_rate > 0) || !m->n_moe) return;
    m->ops->router_bias_update(m->store.router_bias, m->step_counts, m->n_moe, c->n_experts, c->aux_free_rate);
}

double model_active_matmul_params(const ModelConfig *c) {
    double D = c->d_model, qd = model_q_dim(c), kvd = model_kv_dim(c);
    double p = (double)c->padded_vocab * D; // LM head
    for (int l = 0; l < c->n_layers; l++) {
        p += D * (qd + 2 * kvd) + qd * D;
        if (model_is_moe_layer(c, l))
            p += D * c->n_experts + 3.0 * D * c->expert_hidden * c->top_k +
                 3.0 * D * c->n_shared * c->shared_hidden;
        else
            p += 3.0 * D * c->dense_hidden;
    }
    return p;
}
