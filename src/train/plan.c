// `moecore plan` (plan.h): the layouts of a run config on N GPUs, their
// memory from the trainer's memory model (memory_plan: the arena's own
// measuring carve) and their step time from a cost model over a rates
// file. The time model, per optimizer step on the slowest pipeline rank:
//   compute: every op of the forward and backward of the rank's layers, at
//     the rates of the file (GEMM FLOPs at the dense / grouped / attention
//     rates, the grouped rate scaled by the rows per expert; memory-bound
//     ops' bytes at membw), each kernel at least op_floor_us;
//   recompute: the forward work the mode and the selective keys (norms,
//     attention, SwiGLU) redo in the backward;
//   expert parallelism: dispatch and combine (forward and backward) over
//     NVLink when the ep group is inside a node, InfiniBand otherwise;
//   pipeline: the schedule's bubble (pp_schedule_theory_bubble with the
//     stage's forward and backward times) and the stage-to-stage sends;
//   data parallelism: ring all-reduce of the FP32 grads (2 (n-1)/n bytes per
//     link), or reduce-scatter + BF16 all-gather when sharded, hidden behind
//     the last micro-batch's backward up to the file's overlap share, per
//     pipeline rank (its own parameters and backward; the slowest counts);
//   the optimizer: AdamW's 30 B, grad zeroing and norm 8 B per dense element
//   and per expert element under a pipeline (4 B, the norm's, with expert
//   data parallelism; none on one stage without it: train.c).
#include "train/plan.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist/ddp.h"
#include "dist/pp_schedule.h"
#include "model/model.h"
#include "train/train.h"
#include "train/trainer.h"
#include "util/check.h"
#ifdef MOECORE_CUDA
#include "ops/cuda/ops_cuda.h"
#endif

// ---- rates files ------------------------------------------------------------------

typedef struct { const char *key; size_t off; } SpecKey;
#define K(f) {#f, offsetof(GpuSpec, f)}
static const SpecKey spec_keys[] = {
    K(memory_gib), K(context_mib), K(nccl_mib), K(bf16_peak), K(fp8_peak), K(hbm_gbs), K(gemm), K(fp8_gemm),
    K(grouped_fwd), K(grouped_dgrad), K(copy_gbs), K(fp8_grouped), K(grouped_rows), K(grouped_half_rows),
    K(attn_fwd), K(attn_bwd), K(membw), K(optim_gbs), K(op_floor_us), K(step_host_us), K(nvlink_gbs), K(ib_gbs), K(overlap),
};
#undef K
#define NKEYS (sizeof spec_keys / sizeof spec_keys[0])
static double *spec_field(GpuSpec *g, size_t i) { return (double *)((char *)g + spec_keys[i].off); }

int gpu_spec_find(char *path, size_t n, const char *name, char *err, size_t errlen) {
    for (const char *c = name; *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '-' && *c != '_')
            return errorf(err, errlen, "--gpu %s: a GPU name is letters, digits, '-' and '_' (or use --gpu-spec FILE)", name);
    char exe[PATH_MAX], lower[64];
    snprintf(lower, sizeof lower, "%s", name);
    for (char *c = lower; *c; c++) *c = (char)tolower((unsigned char)*c);
    snprintf(path, n, "configs/gpus/%s.yaml", lower);
    if (access(path, R_OK) == 0) return 0;
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        snprintf(path, n, "%s/../configs/gpus/%s.yaml", exe, lower);
        if (access(path, R_OK) == 0) return 0;
    }
    return errorf(err, errlen, "--gpu %s: no configs/gpus/%s.yaml here or beside the binary (or use --gpu-spec FILE)",
                  name, lower);
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
    if (e - s >= 2 && (*s == '"' || *s == '\'') && e[-1] == *s) { e[-1] = 0; s++; }
    return s;
}

static int spec_read(GpuSpec *g, const char *path, char *scale_from, size_t sn, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) return errorf(err, errlen, "%s: %s", path, strerror(errno));
    memset(g, 0, sizeof *g);
    for (size_t i = 0; i < NKEYS; i++) *spec_field(g, i) = NAN;
    scale_from[0] = 0;
    char line[1024];
    int ln = 0, rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        ln++;
        for (char *q = line, quote = 0; *q; q++) { // a comment: '#' outside quotes
            if (*q == '"' || *q == '\'') quote = quote == *q ? 0 : quote ? quote : *q;
            else if (*q == '#' && !quote) { *q = 0; break; }
        }
        char *s = trim(line);
        if (!*s) continue;
        char *colon = strchr(s, ':');
        if (!colon) { rc = errorf(err, errlen, "%s:%d: expected 'key: value'", path, ln); break; }
        *colon = 0;
        char *key = trim(s), *val = trim(colon + 1);
        if (!strcmp(key, "name")) { snprintf(g->name, sizeof g->name, "%s", val); continue; }
        if (!strcmp(key, "source")) { snprintf(g->source, sizeof g->source, "%s", val); continue; }
        if (!strcmp(key, "scale_from")) { snprintf(scale_from, sn, "%s", val); continue; }
        size_t i = 0;
        while (i < NKEYS && strcmp(key, spec_keys[i].key)) i++;
        if (i == NKEYS) { rc = errorf(err, errlen, "%s:%d: unknown key '%s'", path, ln, key); break; }
        char *end;
        double v = strtod(val, &end);
        if (end == val || *trim(end) || !isfinite(v) || v < 0)
            rc = errorf(err, errlen, "%s:%d: %s: '%s' is not a non-negative number", path, ln, key, val);
        else *spec_field(g, i) = v;
    }
    fclose(f);
    return rc;
}

int gpu_spec_load(GpuSpec *g, const char *path, char *err, size_t errlen) {
    char from[64];
    if (spec_read(g, path, from, sizeof from, err, errlen)) return -1;
    if (!g->name[0]) return errorf(err, errlen, "%s: no name", path);
    if (from[0]) { // the rates of another GPU, scaled by the peaks
        char bpath[PATH_MAX + 64], b_from[64];
        GpuSpec b;
        if (gpu_spec_find(bpath, sizeof bpath, from, err, errlen)) return -1;
        if (spec_read(&b, bpath, b_from, sizeof b_from, err, errlen)) return -1;
        if (b_from[0]) return errorf(err, errlen, "%s: scale_from %s, which is itself scaled", path, from);
        if (!(g->bf16_peak > 0 && g->fp8_peak > 0 && g->hbm_gbs > 0))
            return errorf(err, errlen, "%s: scale_from needs bf16_peak, fp8_peak and hbm_gbs", path);
        double c = g->bf16_peak / b.bf16_peak, c8 = g->fp8_peak / b.fp8_peak, m = g->hbm_gbs / b.hbm_gbs;
        double *dst[] = {&g->gemm, &g->grouped_fwd, &g->grouped_dgrad, &g->copy_gbs, &g->attn_fwd, &g->attn_bwd,
                         &g->fp8_gemm, &g->fp8_grouped, &g->membw, &g->optim_gbs};
        double src[] = {b.gemm * c, b.grouped_fwd * c, b.grouped_dgrad * c, b.copy_gbs * m, b.attn_fwd * c,
                        b.attn_bwd * c, b.fp8_gemm * c8, b.fp8_grouped * c8, b.membw * m, b.optim_gbs * m};
        for (size_t i = 0; i < sizeof src / sizeof src[0]; i++)
            if (isnan(*dst[i])) *dst[i] = src[i];
        double *same[] = {&g->grouped_rows, &g->grouped_half_rows, &g->op_floor_us, &g->step_host_us, &g->overlap,
                          &g->context_mib, &g->nccl_mib};
        double bsame[] = {b.grouped_rows, b.grouped_half_rows, b.op_floor_us, b.step_host_us, b.overlap, b.context_mib,
                          b.nccl_mib};
        for (size_t i = 0; i < sizeof bsame / sizeof bsame[0]; i++)
            if (isnan(*same[i])) *same[i] = bsame[i];
        char src_note[sizeof g->source + 1024];
        snprintf(src_note, sizeof src_note, "%.400s%srates of %.60s scaled by the datasheet peaks (BF16 x%.3f, FP8 x%.3f, "
                 "HBM x%.3f)", g->source, g->source[0] ? "; " : "", b.name, c, c8, m);
        snprintf(g->source, sizeof g->source, "%.500s", src_note);
    }
    for (size_t i = 0; i < NKEYS; i++)
        if (isnan(*spec_field(g, i))) return errorf(err, errlen, "%s: missing key %s", path, spec_keys[i].key);
    if (!(g->memory_gib > 0 && g->gemm > 0 && g->grouped_fwd > 0 && g->grouped_dgrad > 0 && g->copy_gbs > 0 &&
          g->attn_fwd > 0 && g->attn_bwd > 0 && g->membw > 0 && g->optim_gbs > 0 && g->nvlink_gbs > 0 &&
          g->ib_gbs > 0 && g->grouped_rows > 0 && g->fp8_gemm > 0 && g->fp8_grouped > 0))
        return errorf(err, errlen, "%s: memory, rates and link bandwidths must be > 0", path);
    if (g->overlap > 1) return errorf(err, errlen, "%s: overlap %.3f is a share (0..1)", path, g->overlap);
    return 0;
}

// ---- layouts ----------------------------------------------------------------------

static const char *const rc_names[] = {"none", "experts", "gather", "layers"};

void plan_layout_name(const PlanLayout *l, char *buf, size_t n) {
    char pp[48] = "";
    if (l->pp > 1) snprintf(pp, sizeof pp, "/pp%d/v%d/%s", l->pp, l->virt, pp_schedule_kind_name((PPScheduleKind)l->sched));
    snprintf(buf, n, "dp%d/ep%d%s%s/%s%s%s%s/mb%d/%s", l->dp, l->ep, pp, l->sharded ? "/sharded" : "",
             rc_names[l->recompute], l->norms ? "/norms" : "", l->attn ? "/attn" : "", l->swiglu ? "/swiglu" : "", l->mb,
             l->fp8 ? "mxfp8" : "bf16");
}

int plan_layout_parse(PlanLayout *l, const char *s, unsigned *given, char *err, size_t errlen) {
    unsigned gv = 0;
    memset(l, 0, sizeof *l);
    l->dp = l->ep = l->pp = l->virt = l->mb = 1;
    l->sched = PP_1F1B;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save, *t = strtok_r(buf, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
        int *num = NULL;
        const char *digits = NULL;
        unsigned bit = 0;
        if (!strncmp(t, "dp", 2)) num = &l->dp, digits = t + 2, bit = PL_DP;
        else if (!strncmp(t, "ep", 2)) num = &l->ep, digits = t + 2, bit = PL_EP;
        else if (!strncmp(t, "pp", 2)) num = &l->pp, digits = t + 2, bit = PL_PP;
        else if (!strncmp(t, "mb", 2)) num = &l->mb, digits = t + 2, bit = PL_MB;
        else if (t[0] == 'v' && isdigit((unsigned char)t[1])) num = &l->virt, digits = t + 1, bit = PL_V;
        if (num) {
            gv |= bit;
            char *end;
            long v = strtol(digits, &end, 10);
            if (end == digits || *end || v < 1 || v > 1 << 20)
                return errorf(err, errlen, "layout '%s': '%s' needs a positive count", s, t);
            *num = (int)v;
            continue;
        }
        if (!strcmp(t, "sharded") || !strcmp(t, "unsharded")) { l->sharded = t[0] == 's'; gv |= PL_SHARDED; continue; }
        if (!strcmp(t, "norms") || !strcmp(t, "keepnorms")) { l->norms = t[0] == 'n'; gv |= PL_NORMS; continue; }
        if (!strcmp(t, "attn") || !strcmp(t, "keepattn")) { l->attn = t[0] == 'a'; gv |= PL_ATTN; continue; }
        if (!strcmp(t, "swiglu") || !strcmp(t, "keepswiglu")) { l->swiglu = t[0] == 's'; gv |= PL_SWIGLU; continue; }
        if (!strcmp(t, "bf16") || !strcmp(t, "mxfp8")) { l->fp8 = t[0] == 'm'; gv |= PL_PREC; continue; }
        int r = 0;
        while (r < 4 && strcmp(t, rc_names[r])) r++;
        if (r < 4) { l->recompute = r; gv |= PL_RC; continue; }
        PPScheduleKind k;
        char e2[128];
        if (!pp_schedule_kind_parse(t, &k, e2, sizeof e2)) { l->sched = k; gv |= PL_SCHED; continue; }
        return errorf(err, errlen, "layout '%s': unknown part '%s' (dpN, epN, ppN, vN, gpipe|1f1b|interleaved|zb1, "
                      "sharded|unsharded, none|experts|gather|layers, norms|keepnorms, attn|keepattn, "
                      "swiglu|keepswiglu, mbN, bf16|mxfp8)", s, t);
    }
    if (l->pp == 1) l->virt = 1;
    if (given) *given = gv;
    return 0;
}

// The run config of a layout (its parallel, optim.sharded, recompute and
// micro-batch keys), validated for dp x pp ranks.
static int layout_config(const PlanInput *in, const PlanLayout *l, RunConfig *c, char *err, size_t errlen) {
    *c = *in->cfg;
    c->origins = NULL;
    c->n_origins = 0;
    c->parallel.dp = l->dp;
    c->parallel.ep = l->ep;
    c->parallel.pp = l->pp;
    c->parallel.pp_virtual = l->virt;
    c->parallel.pp_schedule = l->pp > 1 ? l->sched : c->parallel.pp_schedule;
    if (l->pp == 1) c->parallel.n_pp_layers = 0;
    c->optim_sharded = l->sharded;
    c->train.recompute = l->recompute;
    c->train.recompute_norms = l->norms;
    c->train.recompute_attention = l->attn;
    c->train.recompute_swiglu = l->swiglu;
    c->train.micro_batch = l->mb;
    if (l->dp * l->pp != in->gpus)
        return errorf(err, errlen, "dp %d x pp %d is not the %d GPUs", l->dp, l->pp, in->gpus);
    // the rules of the layout keys, as for CPU ranks: pipeline parallelism is
    // modelled on GPUs before the trainer runs it there (the table marks it)
    c->device.type = 0;
    return run_config_validate(c, l->dp * l->pp, err, errlen);
}

// ---- the time model ----------------------------------------------------------------

enum { C_EXPERT, C_ATTN, C_DENSE, C_ELEM, C_FLOOR, NCLS };
typedef struct { double t[NCLS]; } Acc;

static double acc_sum(const Acc *a) {
    double s = 0;
    for (int i = 0; i < NCLS; i++) s += a->t[i];
    return s;
}

// n kernels doing work units at rate units/s: at least n floors
static void op(Acc *a, const GpuSpec *g, int cls, double work, double rate, int n) {
    double t = work / rate, floor = n * g->op_floor_us * 1e-6;
    a->t[cls] += t;
    if (t < floor) a->t[C_FLOOR] += floor - t;
}

#define TF 1e12
#define GB 1e9

// The grouped GEMM rate at r rows per expert: the file's rate at
// grouped_rows, scaled by r / (r + h) with h = grouped_half_rows.
static double grouped_rate(const GpuSpec *g, double rate, double r) {
    double h = g->grouped_half_rows;
    return rate * (r / (r + h)) / (g->grouped_rows / (g->grouped_rows + h));
}

// One block's forward (f) or backward (b) on a rank.
static void block_time(const ModelConfig *c, const GpuSpec *g, const PlanLayout *l, int moe, int backward, Acc *a) {
    double N = (double)l->mb * c->seq_len, D = c->d_model, qd = model_q_dim(c), kvd = model_kv_dim(c);
    double E = c->n_experts, k = c->top_k, R = N * k, Fe = c->expert_hidden, Fs = (double)c->n_shared * c->shared_hidden;
    double F = c->dense_hidden, T = c->seq_len, H = c->n_heads, hd = c->head_dim;
    double m = backward ? 2 : 1; // GEMM work: data-grad + weight-grad
    double gemm = (l->fp8 ? g->fp8_gemm : g->gemm) * TF;
    op(a, g, C_DENSE, m * 2 * N * D * (2 * qd + 2 * kvd), gemm, backward ? 8 : 4);
    double att = 4.0 * l->mb * H * T * T * hd / 2;
    if (backward) op(a, g, C_ATTN, 2.5 * att, g->attn_bwd * TF, 3);
    else op(a, g, C_ATTN, att, g->attn_fwd * TF, 1);
    double eb = m * 2; // elementwise: the backward reads and writes about twice the forward's bytes
    double qk = c->qk_norm != QKNORM_NONE ? 2 * (qd + kvd) * N * 2 : 0;
    op(a, g, C_ELEM, eb * (8 * N * D + qk + 2 * (qd + kvd) * N * 2 + 12 * N * D) / 2, g->membw * GB,
       backward ? 10 : 8);
    if (moe) {
        op(a, g, C_DENSE, m * 2 * N * D * E, gemm, backward ? 2 : 1); // router
        op(a, g, C_ELEM, eb * N * E * 4 * 2 / 2, g->membw * GB, backward ? 3 : 3);
        op(a, g, C_ELEM, eb * ((N * D + R * D) * 2 + R * Fe * 6 + (R * D + N * D) * 2) / 2, g->membw * GB,
           backward ? 5 : 4);
        if (l->ep > 1) op(a, g, C_ELEM, eb * R * D * 2 * 2 / 2, g->membw * GB, 2);
        double rows = R * l->ep / E; // rows per local expert, random routing
        double fl = 3 * 2 * R * D * Fe;
        if (!backward) {
            op(a, g, C_EXPERT, fl, grouped_rate(g, l->fp8 ? g->fp8_grouped : g->grouped_fwd, rows) * TF, 3);
        } else {
            double dg = l->fp8 ? g->grouped_dgrad * g->fp8_grouped / g->grouped_fwd : g->grouped_dgrad;
            op(a, g, C_EXPERT, fl, grouped_rate(g, dg, rows) * TF, 3);
            // weight-grads: the MMAs at the BF16 data-grad rate, then each
            // tile's FP32 dw += (8 B per dw element and micro-batch) at the
            // copy rate: 0.517 ms against the kernel table's 0.534 for gate/up
            op(a, g, C_EXPERT, fl, grouped_rate(g, g->grouped_dgrad, rows) * TF, 3);
            op(a, g, C_EXPERT, 8.0 * (E / l->ep) * 3 * D * Fe, g->copy_gbs * GB, 0);
        }
        if (Fs > 0) {
            op(a, g, C_DENSE, m * 3 * 2 * N * D * Fs, gemm, backward ? 6 : 3);
            op(a, g, C_ELEM, eb * N * Fs * 6 / 2, g->membw * GB, 1);
        }
    } else if (F > 0) {
        op(a, g, C_DENSE, m * 3 * 2 * N * D * F, gemm, backward ? 6 : 3);
        op(a, g, C_ELEM, eb * N * F * 6 / 2, g->membw * GB, 1);
    }
}

// What the recompute mode and the selective ones redo in block l's backward
// (whole: the block's forward; the norms and SwiGLU are redone in it too).
static void recompute_time(const ModelConfig *c, const GpuSpec *g, const PlanLayout *l, int moe, int whole, Acc *a) {
    double N = (double)l->mb * c->seq_len, D = c->d_model, R = N * c->top_k, Fe = c->expert_hidden;
    double qd = model_q_dim(c), kvd = model_kv_dim(c), T = c->seq_len, H = c->n_heads, hd = c->head_dim;
    double Fs = (double)c->n_shared * c->shared_hidden;
    if (l->norms) op(a, g, C_ELEM, 2 * 4.0 * N * D, g->membw * GB, 2); // the two input norms again
    if (l->swiglu) { // SwiGLU again: gate and up read, the output written (2 B each)
        if (!moe && c->dense_hidden > 0) op(a, g, C_ELEM, N * c->dense_hidden * 6, g->membw * GB, 1);
        if (moe && Fs > 0) op(a, g, C_ELEM, N * Fs * 6, g->membw * GB, 1);
    }
    if (moe && (l->recompute == 1 || l->swiglu)) op(a, g, C_ELEM, R * Fe * 6, g->membw * GB, 1);
    if (whole) { block_time(c, g, l, moe, 0, a); return; }
    if (l->attn) { // QK-norm and RoPE (read and write, 2 B) and the attention forward again
        double qk = c->qk_norm != QKNORM_NONE ? 2 * (qd + kvd) * N * 2 : 0;
        op(a, g, C_ELEM, qk + 2 * (qd + kvd) * N * 2, g->membw * GB, qk > 0 ? 4 : 2);
        op(a, g, C_ATTN, 4.0 * l->mb * H * T * T * hd / 2, g->attn_fwd * TF, 1);
    }
    if (moe && (l->recompute == 1 || l->recompute == 2)) op(a, g, C_ELEM, (N * D + R * D) * 2, g->membw * GB, 1);
}

// Block l recomputed whole (model_recomputes_layer's rule).
static int recomputes_block(const RunConfig *rc, const ParamStage *st, int l) {
    if (rc->train.recompute != 3) return 0;
    int ch = param_stage_chunk_of(st, l);
    if (ch < 0 || l == st->end[ch] - 1) return 0;
    int every = rc->train.recompute_every > 0 ? rc->train.recompute_every : 1;
    return l % every == 0 && (rc->train.recompute_first <= 0 || l < rc->train.recompute_first);
}

typedef struct { Acc f, b, rc; double ep_bytes_links; int moe_layers; } StageTime;

static void stage_time(const RunConfig *rc, const GpuSpec *g, const PlanLayout *l, const ParamStage *st, StageTime *s) {
    const ModelConfig *c = &rc->model;
    memset(s, 0, sizeof *s);
    double N = (double)l->mb * c->seq_len, D = c->d_model, V = c->padded_vocab;
    for (int ch = 0; ch < st->n_chunks; ch++)
        for (int i = st->begin[ch]; i < st->end[ch]; i++) {
            int moe = model_is_moe_layer(c, i);
            block_time(c, g, l, moe, 0, &s->f);
            block_time(c, g, l, moe, 1, &s->b);
            recompute_time(c, g, l, moe, recomputes_block(rc, st, i), &s->rc);
            s->moe_layers += moe;
        }
    double gemm = (l->fp8 ? g->fp8_gemm : g->gemm) * TF;
    if (st->embed) {
        op(&s->f, g, C_ELEM, N * D * 2 * 2, g->membw * GB, 1);
        op(&s->b, g, C_ELEM, N * D * 2 * 2, g->membw * GB / 2.5, 1); // the row scatter-add, ~27% of copy rate
    }
    if (st->head) {
        op(&s->f, g, C_ELEM, 4 * N * D, g->membw * GB, 1);
        op(&s->f, g, C_DENSE, 2 * N * D * V, gemm, 1);
        op(&s->f, g, C_ELEM, N * V * 2, g->membw * GB, 1);
        op(&s->b, g, C_DENSE, 4 * N * D * V, gemm, 2);
        op(&s->b, g, C_ELEM, 2 * N * V * 2 + 8 * N * D, g->membw * GB, 2);
    }
}

// The bandwidth of a group of n ranks at stride `stride` GPUs: NVLink when
// it stays inside a node of G, InfiniBand otherwise.
static double group_bw(const PlanInput *in, int n, int stride) {
    return (long)n * stride <= in->gpus_per_node ? in->gpu->nvlink_gbs * GB : in->gpu->ib_gbs * GB;
}

// A ring collective of `bytes` per rank over n ranks at stride `stride`
// (k = 2: all-reduce, 1: reduce-scatter or all-gather), hierarchical across
// nodes: k (g-1)/g of the bytes over NVLink among the g members of a node,
// then k (m-1)/m of their 1/g share over each GPU's own InfiniBand link
// among the m nodes.
static double coll_time(const PlanInput *in, int n, int stride, double bytes, double k) {
    if (n < 2) return 0;
    int gi = in->gpus_per_node / stride;
    if (gi < 1) gi = 1;
    if (gi > n) gi = n;
    int nn = n / gi;
    double t = gi > 1 ? k * (gi - 1) / gi * bytes / (in->gpu->nvlink_gbs * GB) : 0;
    if (nn > 1) t += k * (nn - 1) / nn * (bytes / gi) / (in->gpu->ib_gbs * GB);
    return t;
}

// The backend whose arena is planned: the CUDA one (its sizes need no
// device). A build without it plans with the CPU's sizes at 2 bytes per
// activation (its attention keeps other buffers: stated in the output).
static const Ops *plan_ops(void) {
#ifdef MOECORE_CUDA
    return &ops_cuda;
#else
    static Ops o;
    o = ops_cpu;
    o.act_bytes = 2;
    return &o;
#endif
}

static const char *const cls_names[NCLS] = {"expert GEMMs", "attention", "dense GEMMs", "memory-bound kernels",
                                            "kernel floor"};

// A rank's memory as the trainer would allocate it: with the symmetric
// dispatch and parallel.ep_recv_factor 0, the receive buffers (and the
// expert buffers sized with them) are the dropless bound, ep x the rows a
// rank routes, unless that does not fit: then model.c's sym_size_rows cuts
// them to what 90% of the memory left beside the rest holds, down to 1x
// the rows routed. *factor: the receive rows / rows routed used (0: the bound).
static int rank_memory(MemoryPlan *mp, const ModelConfig *c, MemoryLayout *ml, const GpuSpec *g, double *factor,
                       char *err, size_t errlen) {
    *factor = 0;
    if (memory_plan(mp, c, ml, err, errlen)) return -1;
    double mem = g->memory_gib * 1073741824.0;
    if (!ml->act.ep_sym || ml->act.ep_recv_factor > 0 || mp->peak <= mem || ml->ep < 2) return 0;
    MemoryPlan at[2];
    double f[2] = {1.0, (double)ml->ep};
    for (int i = 0; i < 2; i++) {
        ml->act.ep_recv_factor = f[i];
        if (memory_plan(&at[i], c, ml, err, errlen)) return -1;
    }
    // arena + symmetric memory are affine in the rows; the rest is fixed
    double var0 = (double)(at[0].arena + at[0].dispatch), var1 = (double)(at[1].arena + at[1].dispatch);
    double rest = (double)memory_total(&at[0]) - var0, spare = 0.9 * (mem - rest);
    double fit = var1 > var0 ? 1.0 + (spare - var0) / ((var1 - var0) / (f[1] - 1.0)) : 1.0;
    if (fit < 1.0) fit = 1.0;
    if (fit > f[1]) fit = f[1];
    ml->act.ep_recv_factor = fit;
    *factor = fit;
    int rc = memory_plan(mp, c, ml, err, errlen);
    ml->act.ep_recv_factor = 0;
    return rc;
}

int plan_layout(const PlanInput *in, const PlanLayout *lay, PlanResult *r, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    r->lay = *lay;
    RunConfig rc;
    if (layout_config(in, lay, &rc, err, errlen)) return -1;
    const GpuSpec *g = in->gpu;
    const ModelConfig *c = &rc.model;
    int dp = lay->dp, ep = lay->ep, pp = lay->pp, G = rc.train.global_batch;
    if (G % (dp * lay->mb)) return errorf(err, errlen, "train.global_batch %d is not a multiple of dp %d x mb %d", G, dp, lay->mb);
    int M = G / (dp * lay->mb);
    r->M = M;
    const Ops *ops = plan_ops();
    // memory and time of every pipeline rank; the worst of each
    double worst_stage = -1, f_worst = 0, b_worst = 0;
    StageTime worst;
    memset(&worst, 0, sizeof worst);
    int ncomm = (in->gpus > 1) + (dp > 1) + (ep > 1) + (dp / ep > 1) + (pp > 1);
    // each pipeline rank's parameters held (its grad reduction and optimizer
    // step) and its backward (which hides the reduction)
    double held_dense[PP_MAX_RANKS], held_expert[PP_MAX_RANKS], opt_elems[PP_MAX_RANKS], back[PP_MAX_RANKS];
    int tensors[PP_MAX_RANKS];
    if (pp > PP_MAX_RANKS) return errorf(err, errlen, "pp %d: at most %d pipeline ranks", pp, PP_MAX_RANKS);
    for (int p = 0; p < pp; p++) {
        ParamStage st = param_stage_all(c);
        PPSchedule sched;
        int split[PP_MAX_RANKS * PARAM_MAX_CHUNKS], slots = 1;
        if (pp > 1) {
            if (pipeline_rank_layout(&rc, M, p, split, &st, &sched, &slots, err, errlen)) return -1;
            pp_schedule_free(&sched);
        }
        MemoryLayout ml;
        memory_layout_for_run(&ml, &rc, ops, 0, 0, pp > 1 ? &st : NULL, slots, M, 1);
        ml.pp_rank = p;
        ml.context_bytes = (size_t)(g->context_mib * 1048576.0);
        ml.nccl_bytes = (size_t)(g->nccl_mib * 1048576.0);
        ml.n_comms = ncomm;
        MemoryPlan mp;
        double factor = 0;
        if (rank_memory(&mp, c, &ml, g, &factor, err, errlen)) return -1;
        if (p == 0 || mp.peak > r->mem.peak) { r->mem = mp; r->mem_rank = p; r->recv_factor = factor; }
        StageTime s;
        stage_time(&rc, g, lay, &st, &s);
        held_dense[p] = (double)mp.dense;
        held_expert[p] = (double)mp.expert;
        tensors[p] = mp.tensors;
        // zeroing: the dense grads (a step's first backward writes the expert
        // grads), all of them under a pipeline; the norm's pass: the dense
        // grads, the expert grads too unless the last backward sums them
        // (one pipeline stage and an expert DP group of one: train.c)
        int fused = ddp_norm_from_slots(pp, dp / ep);
        opt_elems[p] = 30.0 * (double)(mp.dense_opt + mp.expert_opt) + 8.0 * (double)mp.dense +
                       (4.0 * (pp > 1) + 4.0 * !fused) * (double)mp.expert;
        back[p] = acc_sum(&s.b) + acc_sum(&s.rc);
        double t = acc_sum(&s.f) + acc_sum(&s.b) + acc_sum(&s.rc);
        if (t > worst_stage) { worst_stage = t; worst = s; f_worst = acc_sum(&s.f); b_worst = acc_sum(&s.b) + acc_sum(&s.rc); }
    }
    r->peak_gib = r->mem.peak / 1073741824.0;
    r->fits = r->peak_gib <= g->memory_gib;
    // compute per step: M micro-batches
    r->t_expert = M * (worst.f.t[C_EXPERT] + worst.b.t[C_EXPERT]);
    r->t_attn = M * (worst.f.t[C_ATTN] + worst.b.t[C_ATTN]);
    r->t_dense = M * (worst.f.t[C_DENSE] + worst.b.t[C_DENSE]);
    r->t_elem = M * (worst.f.t[C_ELEM] + worst.b.t[C_ELEM]);
    r->t_floor = M * (worst.f.t[C_FLOOR] + worst.b.t[C_FLOOR]);
    r->t_recompute = M * acc_sum(&worst.rc);
    // expert parallelism: 4 transfers per MoE layer and micro-batch (dispatch
    // and combine, forward and backward; 2 more when whole blocks recompute)
    if (ep > 1) {
        double N = (double)lay->mb * c->seq_len, bytes = N * c->top_k * c->d_model * 2 * (ep - 1) / ep;
        int n = 4 + (lay->recompute == 3 ? 2 : 0);
        r->t_ep = M * worst.moe_layers * n * bytes / group_bw(in, ep, 1);
    }
    // pipeline: sends of the residual stream, forward and backward, per
    // chunk boundary; the bubble of the schedule on the slowest stage
    double t_mb = f_worst + b_worst + (M ? r->t_ep / M : 0);
    if (pp > 1) {
        double N = (double)lay->mb * c->seq_len;
        r->t_pp_comm = M * lay->virt * 2 * N * c->d_model * 2 / group_bw(in, pp, dp);
        PPCosts cost = {f_worst, b_worst, b_worst / 2, b_worst / 2};
        r->bubble = pp_schedule_theory_bubble((PPScheduleKind)lay->sched, pp, M, lay->virt, cost);
        r->t_bubble = (M * t_mb + r->t_pp_comm) * r->bubble / (1 - r->bubble);
    }
    // data parallelism: the FP32 grads over dp (dense) and ep_dp (experts),
    // per pipeline rank (its own parameters, hidden behind its own
    // backward); the step waits for the slowest rank's exposed part
    int edp = dp / ep;
    double k = lay->sharded ? 1 : 2; // reduce-scatter or all-reduce
    r->t_dp = r->t_dp_exposed = r->t_optim = 0;
    for (int p = 0; p < pp; p++) {
        double t_dense_red = coll_time(in, dp, 1, 4.0 * held_dense[p], k);
        double t_exp_red = coll_time(in, edp, ep, 4.0 * held_expert[p], k);
        double t_gather = lay->sharded ? coll_time(in, dp, 1, 2.0 * held_dense[p], 1) +
                                         coll_time(in, edp, ep, 2.0 * held_expert[p], 1) : 0;
        double hidden = g->overlap * back[p], red = t_dense_red + t_exp_red;
        double exposed = (red > hidden ? red - hidden : 0) + t_gather;
        if (red + t_gather > r->t_dp) r->t_dp = red + t_gather;
        if (exposed > r->t_dp_exposed) r->t_dp_exposed = exposed;
        // optimizer: AdamW 30 B per element of the range, zeroing and norm (above);
        // one update launched per tensor, 4 more for the norm and zeroing
        double t_opt = opt_elems[p] / (g->optim_gbs * GB) + (tensors[p] + 4) * g->op_floor_us * 1e-6;
        if (t_opt > r->t_optim) r->t_optim = t_opt;
    }
    r->t_host = g->step_host_us * 1e-6;
    r->t_step = M * t_mb + r->t_pp_comm + r->t_bubble + r->t_dp_exposed + r->t_optim + r->t_host;
    double tokens = (double)G * c->seq_len;
    r->tokens_s_gpu = tokens / r->t_step / in->gpus;
    r->tflops_gpu = flops_per_token(c) * r->tokens_s_gpu / 1e12;
    r->mfu = g->bf16_peak > 0 ? r->tflops_gpu / g->bf16_peak : 0;
    // the largest term
    double terms[] = {r->t_expert, r->t_attn, r->t_dense, r->t_elem, r->t_floor, r->t_recompute, r->t_ep,
                      r->t_bubble + r->t_pp_comm, r->t_dp_exposed, r->t_optim, r->t_host};
    static const char *const names[] = {"expert GEMMs", "attention", "dense GEMMs", "memory-bound kernels",
                                        "kernel floor (small kernels)", "recompute", "expert dispatch (a2a)",
                                        "pipeline bubble", "exposed grad reduction", "optimizer", "host work"};
    int best = 0;
    for (int i = 1; i < (int)(sizeof terms / sizeof terms[0]); i++)
        if (terms[i] > terms[best]) best = i;
    r->dominant = names[best];
    (void)cls_names;
    return 0;
}

// ---- output -------------------------------------------------------------------------

static double ms(double s) { return 1e3 * s; }

void plan_explain(FILE *f, const PlanInput *in, const PlanResult *r) {
    const GpuSpec *g = in->gpu;
    const MemoryPlan *m = &r->mem;
    char name[128];
    plan_layout_name(&r->lay, name, sizeof name);
    const double Mi = 1048576.0, Gi = 1073741824.0;
    fprintf(f, "layout %s on %d x %s (%d per node): %d micro-batch%s of %d x %d per step per replica\n", name,
            in->gpus, g->name, in->gpus_per_node, r->M, r->M == 1 ? "" : "es", r->lay.mb, in->cfg->model.seq_len);
    fprintf(f, "memory per GPU (train/memory.h, the trainer's own model; pipeline rank %d, the largest):\n", r->mem_rank);
    fprintf(f, "  parameters held     %zu dense + %zu expert\n", m->dense, m->expert);
    fprintf(f, "  BF16 weights        %10.1f MiB\n", m->compute_weights / Mi);
    fprintf(f, "  FP32 grads          %10.1f MiB\n", m->grads / Mi);
    fprintf(f, "  FP32 main weights   %10.1f MiB  (1/%d of dense, 1/%d of expert)\n", m->main_weights / Mi, m->dense_div,
            m->expert_div);
    fprintf(f, "  AdamW moments       %10.1f MiB\n", m->moments / Mi);
    fprintf(f, "  comm (grad shard)   %10.1f MiB\n", m->comm / Mi);
    fprintf(f, "  activations         %10.1f MiB  (%d slot%s of %.1f MiB for the schedule, + shared scratch)%s\n",
            m->arena / Mi, m->n_slots, m->n_slots == 1 ? "" : "s", m->slot_bytes / Mi,
            r->lay.fp8 ? "; mxfp8: counted at BF16 (FP8 activation storage not modelled)" : "");
    if (r->recv_factor > 0)
        fprintf(f, "  EP receive buffers  %10.1f MiB  (symmetric memory, cut to %.2fx the rows routed to fit, as the "
                   "trainer does: rows beyond it are dropped)\n", m->dispatch / Mi, r->recv_factor);
    else
        fprintf(f, "  EP receive buffers  %10.1f MiB  (symmetric memory%s)\n", m->dispatch / Mi,
                m->dispatch ? ", the dropless bound" : "");
    fprintf(f, "  router state etc.   %10.1f MiB\n", (m->other + m->small) / Mi);
    fprintf(f, "  pipeline buffers    %10.1f MiB\n", m->pipe / Mi);
    fprintf(f, "  kernel workspaces   %10.1f MiB  (estimate from the code)\n", m->workspace / Mi);
    fprintf(f, "  context allowance   %10.1f MiB  (stated: %.0f MiB CUDA context + %.0f MiB per NCCL communicator)\n",
            m->context / Mi, g->context_mib, g->nccl_mib);
    fprintf(f, "  steady %.2f GiB, setup peak %.2f GiB -> peak %.2f GiB of %.2f GiB: %s\n", memory_total(m) / Gi,
            m->setup_peak / Gi, r->peak_gib, g->memory_gib, r->fits ? "fits" : "DOES NOT FIT");
    fprintf(f, "time per optimizer step (slowest pipeline rank):\n");
    fprintf(f, "  expert GEMMs        %10.3f ms\n", ms(r->t_expert));
    fprintf(f, "  attention           %10.3f ms\n", ms(r->t_attn));
    fprintf(f, "  dense GEMMs         %10.3f ms\n", ms(r->t_dense));
    fprintf(f, "  memory-bound        %10.3f ms\n", ms(r->t_elem));
    fprintf(f, "  kernel floor        %10.3f ms  (kernels shorter than %.1f us)\n", ms(r->t_floor), g->op_floor_us);
    fprintf(f, "  recompute           %10.3f ms\n", ms(r->t_recompute));
    fprintf(f, "  EP dispatch/combine %10.3f ms\n", ms(r->t_ep));
    fprintf(f, "  PP sends            %10.3f ms\n", ms(r->t_pp_comm));
    fprintf(f, "  PP bubble           %10.3f ms  (%.1f%% of the pipeline)\n", ms(r->t_bubble), 100 * r->bubble);
    fprintf(f, "  grad reduction      %10.3f ms, exposed %.3f ms (%.0f%% of the last backward hides it)\n", ms(r->t_dp),
            ms(r->t_dp_exposed), 100 * g->overlap);
    fprintf(f, "  optimizer           %10.3f ms\n", ms(r->t_optim));
    fprintf(f, "  host work           %10.3f ms  (each optimizer step: graph launch, loss read, the optimizer's loop)\n",
            ms(r->t_host));
    fprintf(f, "  step                %10.3f ms -> %.0f tokens/s per GPU, %.1f TFLOP/s per GPU (model FLOPs), MFU %.1f%% "
               "of %.0f\n", ms(r->t_step), r->tokens_s_gpu, r->tflops_gpu, 100 * r->mfu, g->bf16_peak);
    fprintf(f, "  largest term: %s\n", r->dominant);
}

// ---- enumeration ----------------------------------------------------------------------

typedef struct { PlanResult *r; int n, cap; } Results;

static void push(Results *rs, const PlanResult *r) {
    if (rs->n == rs->cap) {
        rs->cap = rs->cap ? 2 * rs->cap : 256;
        rs->r = reallocCheck(rs->r, rs->cap * sizeof(PlanResult));
    }
    rs->r[rs->n++] = *r;
}

static int by_speed(const void *a, const void *b) {
    const PlanResult *x = a, *y = b;
    if (x->fits != y->fits) return y->fits - x->fits;
    return (y->tokens_s_gpu > x->tokens_s_gpu) - (y->tokens_s_gpu < x->tokens_s_gpu);
}

// Every layout of the input: pp | gpus (pp <= layers), ep | dp and E,
// virtual chunks 1 or 2 with interleaved, the three schedules, sharded or
// not, the recompute modes, micro-batches dividing the replica's batch,
// the precisions asked for. Layouts the config refuses are skipped (counted).
static int matches(const PlanLayout *a, const PlanLayout *w, unsigned given) {
    return (!(given & PL_DP) || a->dp == w->dp) && (!(given & PL_EP) || a->ep == w->ep) &&
           (!(given & PL_PP) || a->pp == w->pp) && (!(given & PL_V) || a->virt == w->virt) &&
           (!(given & PL_SCHED) || a->pp == 1 || a->sched == w->sched) &&
           (!(given & PL_SHARDED) || a->sharded == w->sharded) && (!(given & PL_RC) || a->recompute == w->recompute) &&
           (!(given & PL_MB) || a->mb == w->mb) && (!(given & PL_PREC) || a->fp8 == w->fp8) &&
           (!(given & PL_NORMS) || a->norms == w->norms) && (!(given & PL_ATTN) || a->attn == w->attn) &&
           (!(given & PL_SWIGLU) || a->swiglu == w->swiglu);
}

// A selective key (norms, attention, SwiGLU) only adds recompute time and
// never adds memory, so (unless --where names a selective part) the layout
// with all of them is evaluated first: when it does not fit, neither do the
// others; when it does, a key set is evaluated only when no subset of it
// fits (a subset is as fast or faster). *skipped counts those left out.
static void enumerate(const PlanInput *in, int precisions, const PlanLayout *where, unsigned given, Results *rs,
                      int *refused, int *skipped) {
    const RunConfig *cfg = in->cfg;
    int N = in->gpus, L = cfg->model.n_layers, E = cfg->model.n_experts, G = cfg->train.global_batch;
    // swiglu beside experts changes something only with dense or shared-expert MLPs
    int other_swiglu = (cfg->model.dense_layers > 0 && cfg->model.dense_hidden > 0) || cfg->model.n_shared > 0 || E == 0;
    int prune = !(given & (PL_NORMS | PL_ATTN | PL_SWIGLU));
    for (int pp = 1; pp <= N && pp <= L; pp++) {
        if (N % pp) continue;
        int dp = N / pp;
        for (int ep = 1; ep <= dp; ep++) {
            if (dp % ep || (E ? E % ep : ep > 1)) continue;
            static const int scheds[][2] = {{PP_1F1B, 1}, {PP_INTERLEAVED, 2}, {PP_ZB1, 1}};
            for (int si = 0; si < (pp > 1 ? 3 : 1); si++)
                for (int sh = 0; sh <= (dp > 1); sh++)
                    for (int rc = 0; rc < 4; rc++)
                        for (int mb = 1; mb <= G / dp; mb++) {
                            if ((G / dp) % mb || G % dp) continue;
                            for (int p8 = 0; p8 < 2; p8++) {
                                if (!(precisions & (1 << p8))) continue;
                                // the key sets: bit 0 norms, 1 attention, 2 SwiGLU (not beside
                                // experts unless it shares more than the experts' buffers)
                                int all = rc == 1 && !other_swiglu && !(given & PL_SWIGLU) ? 3 : 7;
                                int fits[8] = {0}, state[8] = {0}; // state: 0 not run, 1 pushed, -1 refused
                                PlanResult rall;
                                for (int k = 0; k < 9; k++) {
                                    int sel = k == 0 ? all : k - 1; // all of them first, then by subsets
                                    if (k > 0 && (sel & ~all)) continue;
                                    if (k == 0 && !prune) continue;
                                    PlanLayout l = {.dp = dp, .ep = ep, .pp = pp, .virt = pp > 1 ? scheds[si][1] : 1,
                                                    .sched = pp > 1 ? scheds[si][0] : PP_1F1B, .sharded = sh,
                                                    .recompute = rc, .norms = sel & 1, .attn = sel >> 1 & 1,
                                                    .swiglu = sel >> 2, .mb = mb, .fp8 = p8};
                                    if (!matches(&l, where, given)) continue;
                                    if (k > 0 && prune && state[all] == 1 && !fits[all] && sel != all) {
                                        (*skipped)++; // does not fit with all the keys: not with fewer
                                        continue;
                                    }
                                    int sub = 0;
                                    for (int t = 0; t < sel && !sub; t++) sub = (t & sel) == t && fits[t];
                                    if (k > 0 && prune && sub) { (*skipped)++; continue; }
                                    if (k > 0 && sel == all && prune) { // evaluated first
                                        if (state[all] == 1) push(rs, &rall);
                                        continue;
                                    }
                                    PlanResult r;
                                    char err[512];
                                    if (plan_layout(in, &l, &r, err, sizeof err)) { (*refused)++; state[sel] = -1; continue; }
                                    fits[sel] = r.fits;
                                    state[sel] = 1;
                                    if (k == 0) rall = r;
                                    else push(rs, &r);
                                }
                            }
                        }
        }
    }
}

static void print_table(FILE *f, const PlanInput *in, const Results *rs, int top, int refused, int skipped) {
    int fit = 0;
    for (int i = 0; i < rs->n; i++) fit += rs->r[i].fits;
    fprintf(f, "%d layouts: %d fit %.1f GiB of a %s, %d do not; %d refused by the config's rules", rs->n, fit,
            in->gpu->memory_gib, in->gpu->name, rs->n - fit, refused);
    if (skipped)
        fprintf(f, "; %d with selective recompute (norms, attn, swiglu) not evaluated: the layout fits with fewer "
                   "of them, or not with all", skipped);
    fprintf(f, "\n");
    fprintf(f, "%-4s %-46s %9s %10s %12s %10s %6s  %s\n", "#", "layout", "peak GiB", "step ms", "tokens/s/GPU",
            "TFLOP/s", "MFU", "largest term");
    int shown = 0;
    for (int i = 0; i < rs->n && shown < top; i++) {
        const PlanResult *r = &rs->r[i];
        if (!r->fits) break;
        char name[128];
        plan_layout_name(&r->lay, name, sizeof name);
        fprintf(f, "%-4d %-46s %9.2f %10.2f %12.0f %10.1f %5.1f%%  %s\n", ++shown, name, r->peak_gib, ms(r->t_step),
                r->tokens_s_gpu, r->tflops_gpu, 100 * r->mfu, r->dominant);
    }
    if (!fit) fprintf(f, "(none fits)\n");
    for (int i = 0; i < rs->n && i < top; i++)
        if (rs->r[i].fits && (rs->r[i].lay.pp > 1 || rs->r[i].lay.fp8)) {
            fprintf(f, "(pp > 1 and mxfp8 are modelled: the trainer runs pp on CPU ranks only, and FP8 as block128 "
                       "with pp 1 only (ep > 1 over the all-to-all dispatch), README \"FP8\")\n");
            break;
        }
}

static void print_why(FILE *f, const Results *rs) {
    if (!rs->n || !rs->r[0].fits) return;
    const PlanResult *a = &rs->r[0];
    char name[128];
    plan_layout_name(&a->lay, name, sizeof name);
    fprintf(f, "why %s: its step is %.2f ms, of which %s is the largest term;", name, ms(a->t_step), a->dominant);
    if (a->t_bubble > 0) fprintf(f, " bubble %.1f%%;", 100 * a->bubble);
    if (a->t_dp > 0) fprintf(f, " grad reduction %.2f ms, %.2f exposed;", ms(a->t_dp), ms(a->t_dp_exposed));
    if (a->t_ep > 0) fprintf(f, " EP transfers %.2f ms;", ms(a->t_ep));
    fprintf(f, " peak memory %.2f GiB", a->peak_gib);
    for (int i = 1; i < rs->n; i++) {
        const PlanResult *b = &rs->r[i];
        if (!b->fits) break;
        if (b->lay.recompute != a->lay.recompute || b->lay.norms != a->lay.norms || b->lay.attn != a->lay.attn ||
            b->lay.swiglu != a->lay.swiglu || b->lay.mb != a->lay.mb || b->lay.ep != a->lay.ep || b->lay.pp != a->lay.pp) {
            char bn[128];
            plan_layout_name(&b->lay, bn, sizeof bn);
            fprintf(f, "; the next different one, %s, is %.1f%% slower", bn, 100 * (a->tokens_s_gpu / b->tokens_s_gpu - 1));
            break;
        }
    }
    fprintf(f, "\n");
}

static int usage_plan(FILE *f) {
    fprintf(f, "usage: moecore plan CONFIG.yaml --gpus N [--gpus-per-node G] [--gpu NAME | --gpu-spec FILE]\n"
               "                    [--top K] [--explain LAYOUT] [--where PARTS] [--precision bf16|mxfp8|all]\n"
               "                    [--section.key=value ...]\n"
               "  Enumerates the layouts of CONFIG on N GPUs (dp, ep, pp, virtual stages and schedule, sharded\n"
               "  optimizer, recompute, micro-batch, precision), drops those whose peak memory does not fit, and\n"
               "  ranks the rest by predicted tokens/s per GPU. NAME: configs/gpus/NAME.yaml (default h200).\n"
               "  LAYOUT: as the table prints it, e.g. dp8/ep8/pp4/v1/1f1b/sharded/gather/norms/attn/swiglu/mb1/bf16\n"
               "  (missing parts: dp1 ep1 pp1 v1 1f1b, not sharded, none, norms, attention and SwiGLU kept\n"
               "  (keepnorms, keepattn, keepswiglu), mb1, bf16). --where keeps the layouts\n"
               "  with the parts given (e.g. ep8/pp4/unsharded/keepattn). mxfp8 is modelled (the FP8 expert GEMM\n"
               "  rate, activations at BF16); the trainer's FP8 (block128) runs with pp 1 only.\n");
    return f == stdout ? 0 : 2;
}

static int parse_int(const char *flag, const char *v, int lo, int *out) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || end == v || *end || x < lo || x > 1 << 24) {
        fprintf(stderr, "moecore: error: %s needs an integer >= %d (got '%s')\n", flag, lo, v ? v : "");
        return -1;
    }
    *out = (int)x;
    return 0;
}

int cmd_plan(int argc, char **argv) {
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) return usage_plan(argc < 1 ? stderr : stdout);
    char err[2048], msg[1024];
    RunConfig rc;
    run_config_defaults(&rc);
    if (!strncmp(argv[0], "--", 2)) { fprintf(stderr, "moecore: error: plan: the first argument is CONFIG.yaml\n"); return 2; }
    if (run_config_load_yaml(&rc, argv[0], err, sizeof err)) {
        fprintf(stderr, "moecore: error: %s\n", err);
        run_config_free(&rc);
        return 2;
    }
    int gpus = 0, per_node = 0, top = 10, precisions = 1, rcode = 2;
    const char *gpu = "h200", *spec_path = NULL, *explain = NULL, *where_s = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--gpus")) { if (parse_int(a, v, 1, &gpus)) goto out; i++; }
        else if (!strcmp(a, "--gpus-per-node")) { if (parse_int(a, v, 1, &per_node)) goto out; i++; }
        else if (!strcmp(a, "--top")) { if (parse_int(a, v, 1, &top)) goto out; i++; }
        else if (!strcmp(a, "--gpu") && v) { gpu = v; i++; }
        else if (!strcmp(a, "--gpu-spec") && v) { spec_path = v; i++; }
        else if (!strcmp(a, "--explain") && v) { explain = v; i++; }
        else if (!strcmp(a, "--where") && v) { where_s = v; i++; }
        else if (!strcmp(a, "--precision") && v) {
            if (!strcmp(v, "bf16")) precisions = 1;
            else if (!strcmp(v, "mxfp8")) precisions = 2;
            else if (!strcmp(v, "all")) precisions = 3;
            else { fprintf(stderr, "moecore: error: --precision %s: bf16, mxfp8 or all\n", v); goto out; }
            i++;
        } else if (!strncmp(a, "--", 2) && strchr(a, '=')) {
            if (run_config_override(&rc, a, err, sizeof err)) { fprintf(stderr, "moecore: error: %s\n", err); goto out; }
        } else {
            fprintf(stderr, "moecore: error: plan: unknown or incomplete argument '%s' (see moecore plan --help)\n", a);
            goto out;
        }
    }
    if (!gpus) { fprintf(stderr, "moecore: error: plan: --gpus N is required\n"); goto out; }
    if (!per_node) per_node = gpus < 8 ? gpus : 8;
    if (gpus > per_node && gpus % per_node) {
        fprintf(stderr, "moecore: error: --gpus %d is not a whole number of nodes of --gpus-per-node %d\n", gpus, per_node);
        goto out;
    }
    char path[PATH_MAX + 64];
    if (!spec_path) {
        if (gpu_spec_find(path, sizeof path, gpu, err, sizeof err)) { fprintf(stderr, "moecore: error: %s\n", err); goto out; }
        spec_path = path;
    }
    GpuSpec g;
    if (gpu_spec_load(&g, spec_path, err, sizeof err)) { fprintf(stderr, "moecore: error: --gpu-spec: %s\n", err); goto out; }
    // the model must be valid on its own first (the layouts change only the parallel keys)
    ModelConfig mc = rc.model;
    if (model_config_validate(&mc, msg, sizeof msg)) {
        run_config_blame(&rc, msg, err, sizeof err);
        fprintf(stderr, "moecore: error: invalid model config: %s\n", err);
        goto out;
    }
    rc.model = mc;
    PlanInput in = {&rc, &g, gpus, per_node};
    printf("moecore plan: %s on %d x %s (%d per node); rates: %s\n", argv[0], gpus, g.name, per_node, g.source);
#ifndef MOECORE_CUDA
    printf("note: a build without CUDA plans the activations with the CPU backend's attention buffers\n");
#endif
    if (explain) {
        PlanLayout l;
        PlanResult r;
        if (plan_layout_parse(&l, explain, NULL, err, sizeof err) || plan_layout(&in, &l, &r, err, sizeof err)) {
            fprintf(stderr, "moecore: error: --explain: %s\n", err);
            goto out;
        }
        plan_explain(stdout, &in, &r);
        rcode = 0;
        goto out;
    }
    PlanLayout where;
    unsigned given = 0;
    if (where_s && plan_layout_parse(&where, where_s, &given, err, sizeof err)) {
        fprintf(stderr, "moecore: error: --where: %s\n", err);
        goto out;
    }
    if (given & PL_PREC) precisions = 1 << where.fp8;
    Results rs = {0};
    int refused = 0, skipped = 0;
    enumerate(&in, precisions, &where, given, &rs, &refused, &skipped);
    qsort(rs.r, rs.n, sizeof *rs.r, by_speed);
    print_table(stdout, &in, &rs, top, refused, skipped);
    print_why(stdout, &rs);
    if (!rs.n || !rs.r[0].fits) {
        // the smallest peak, to say how far off it is
        double best = INFINITY;
        for (int i = 0; i < rs.n; i++) best = rs.r[i].peak_gib < best ? rs.r[i].peak_gib : best;
        fprintf(stderr, "moecore: error: no layout of %s fits %d x %s (smallest peak %.2f GiB of %.2f)\n", argv[0], gpus,
                g.name, best, g.memory_gib);
        rcode = 1;
    } else {
        rcode = 0;
    }
    free(rs.r);
out:
    run_config_free(&rc);
    return rcode;
}
