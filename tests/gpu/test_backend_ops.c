// Every op of the op table (src/ops/ops.h) on the CUDA backend against the
// CPU backend, through the Ops interface: ggml's test-backend-ops for
// moecore. Longer than 800 lines because it is one list of ~50 ops' cases
// and the harness that runs them; the per-op code is a run function and a
// builder of a few lines each.
//
// A case (make_cases) is one call of one op at one shape: its tensors
// (inputs, outputs, accumulated outputs, work buffers), a run function that
// makes the call on either backend, and per output a bound (Bound: the
// tolerance and the reason for it). run_case
//  1. draws the inputs on the host (BF16-representable where the GPU reads
//     BF16: the CPU's act is FP32, CUDA's BF16, so both see the same values;
//     never zeros), and the prefills of accumulated outputs;
//  2. runs the op on ops_cpu over host copies and on ops_cuda over device
//     buffers whose assigned outputs are poisoned (NaN) first, so that every
//     element must be written;
//  3. compares each output by relative L2 error ||cuda - cpu|| / ||cpu|| with
//     its bound, every element finite (exact bounds compare bits; the
//     accumulators of scalars compare their increments);
//  4. repeats 2-3 under each other kernel choice of the backend (CudaSettings
//     through cuda_configure; the first choice is the production default),
//     also comparing each choice's outputs with the default's;
//  5. RERUN cases run a second time over reset outputs and must give the same
//     bits (the backend is deterministic: no float atomics);
//  6. extra checks where an op promises more (the attention's saved
//     log-sum-exp, AdamW's BF16 copy, dw written = dw added into zeros).
// NOCPU cases (attention at T = 4096, too slow for the CPU's naive loops;
// the special check attention_heads validates two heads of that shape) are
// checked for written, finite outputs and between kernel choices.
// Checks that are not one op call stay named special checks (specials[]):
// a CUDA graph of the ops with scratch buffers, attention causality, the
// T = 4096 heads (also with documents), intra-document masking (no leak
// across documents, all-0 doc_start = NULL), and that every compute op of
// Ops has a case.
//
// Perf mode (--perf): each case marked PERF (OLMoE-1B-7B's shapes), after
// its checks, is timed under every kernel choice: CUDA events on the
// backend's stream around the op alone, 3 warm-up runs, median of 10, L2
// flushed before each timed run by reading 4 x 50 MB (so inputs come from
// HBM, as rotating input sets larger than L2 would). Products print
// TFLOP/s (the FLOPs are stated per builder); memory-bound ops print GB/s of
// each buffer moved once (inputs read, outputs written, accumulated outputs
// read and written; embedding_backward counts only the rows of dwte that
// its tokens touch), as bench_kernels counts them.
//
// Usage: test_backend_ops [--perf] [-o PREFIX[,PREFIX...]] [--grouped-variant N[,N...]] [--list]
//   -o: only the cases (and special checks) whose op starts with a prefix;
//   --grouped-variant: the grouped cases (and grouped_wgrad_tail) also run
//     under these epilogue variants of the warp-specialised kernels
//     (grouped_wgmma.cu's WS_* bits, up to 4), each a kernel choice that is
//     compared with the CPU like the others and with the default bit for bit;
//   --list: print the cases with their outputs and bounds, run nothing.
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_test_util.h"
#include "ops/cuda/fp8_cuda.h"
#include "ops/ops.h"

// grouped_wgmma.cu: 0 when the kernel ran, -1 (nothing launched) when it
// does not take the shape or device. Only asked whether they take a shape.
int cuda_grouped_forward_wgmma(void *out, const void *inp, const void *w, const int *offsets, int E, int C, int OC);
int cuda_grouped_dgrad_wgmma(void *dinp, const void *dout, const void *w, const int *offsets, int E, int C, int OC);
int cuda_grouped_glu_wgmma(void *g, void *u, void *a, const void *inp, const void *wg, const void *wu, const int *offsets,
                           int E, int C, int OC);
int cuda_grouped_wgrad_wgmma(float *dw, const void *dout, const void *inp, const int *offsets, int E, int C, int OC,
                             int accumulate, double *sq, int *sq_done);
int cuda_grouped_dgrad_pair_wgmma(void *dinp, const void *dout, const void *w, const void *dout2, const void *w2,
                                  const int *offsets, int E, int C, int OC);

// ---- bounds --------------------------------------------------------------------
// Relative L2 error of the CUDA output against the CPU's (FP32) on the same
// BF16-representable inputs.

typedef struct { double tol; const char *why; } Bound;
static const Bound B_BF16 = {1e-2, "BF16 output (8-bit mantissa, ~2e-3 RMS per rounding), FP32 sums in another order; "
                                   "a missed tile, k-step or expert costs > 1e-1"};
static const Bound B_F32 = {1e-5, "FP32 output from the same inputs; only the order of the sums differs"};
static const Bound B_DOT = {1e-4, "FP32 dots over C products, which the CPU sums sequentially in FP32"};
static const Bound B_LOGITS = {1e-4, "FP32 logits: exact BF16 products summed in FP32 in another order"};
static const Bound B_DW = {1e-2, "FP32 weight grads: exact products in another order, but the router's FP32 dlogits "
                                 "are rounded to BF16 before cuBLASLt (2^-9 each)"};
static const Bound B_ATTN = {1e-2, "BF16 outputs; the GPU also rounds P and dS to BF16 before the second products, "
                                   "and its D uses the BF16 out"};
static const Bound B_LSE = {1e-4, "FP32 log-sum-exp of exact BF16 products, against a float64 reference"};
static const Bound B_ROPE_DW = {1e-2, "FP32 norm-weight grads from the rotated-back grad, which the GPU rounds to BF16 "
                                      "(as rope_backward stores it) and the CPU keeps in FP32: 2^-9 each; the GPU's "
                                      "bits are held to its two ops' by the special check rope_paths"};
static const Bound B_EXACT = {0, "gathers, copies, integer outputs and the BF16 cast: bits"};

// ---- cases -----------------------------------------------------------------------

#define MAXT 12
#define MAXCHOICE 8
#define MAX_GROUPED_VARIANTS 4

enum { ACT, F32, I32, F64 };                 // element types: ops.h's act, f32, i32; f64 accumulators
static const size_t dev_elem[] = {2, 4, 4, 8}; // bytes on the GPU (act: BF16); on the host act is float
enum { IN, OUT, ACC, WORK, NONE };           // role: read; assigned; accumulated (+=, or in place); scratch; NULL
enum { G_UNIFORM, G_NORMAL, G_AROUND1, G_CUSTOM }; // how inputs and prefills are drawn
enum { MIS = 1, NOCMP = 2, SIZED = 4 };       // tensor flags: misaligned GPU view, not compared, size per backend
enum { RERUN = 1, PERF = 2, NOCPU = 4 };      // case flags

typedef struct {
    const char *name;
    int type, role, flags, gen;
    float scale;
    size_t n;                  // elements (SIZED: Case.numel per backend)
    const Bound *bound;        // outputs
    int dims[4];               // for diagnostics, outermost first (0-terminated)
    const int *seg;            // segments of dims[0] (the experts' rows), nseg + 1 boundaries
    int nseg;
    size_t row;                // elements per row when kernel choices are compared (0: whole tensor)
} Tensor;

typedef struct Case Case;
typedef struct Run Run;
typedef void (*RunFn)(const Case *c, const Ops *o, void *const *b);
// variant: the grouped kernels' epilogue variant (cuda_grouped_set_variant)
// this choice runs under, -1 the default; a choice with one must give the
// default's bits
typedef struct { const char *label; CudaSettings s; int variant, exact; } Choice; // exact: the bits of choice 0

struct Case {
    char name[192];
    const char *op;            // the Ops member it exercises
    const char *section;       // the family, as printed
    int nt;
    Tensor t[MAXT];
    // the op's parameters (those it takes; the rest 0)
    int N, C, OC, E, k, V, R, B, T, H, KV, hd, acc, inplace, renorm, t_step, bwd, hot, ties, kind;
    int doc;                   // attention: the tensor index of doc_start (0: NULL)
    int capacity;              // moe_capacity_drop
    Gating gating;
    RoutingMode mode;
    size_t n;
    float x;                   // lb_loss: count_tokens
    uint64_t seed;
    const int *offsets;        // grouped: host offsets [E + 1]
    RunFn prep;                // before run on each backend (not compared, not timed)
    RunFn run;
    void (*init)(const Case *c, void *const *h);          // custom inputs (G_CUSTOM)
    size_t (*numel)(const Case *c, const Ops *o, int i);  // SIZED tensors
    void (*extra)(const Run *r, const char *label);       // more checks after each CUDA run
    int (*takes)(const Case *c, void *const *b);          // whether the wgmma kernel takes the shape
    int flags, nchoice;
    Choice choice[MAXCHOICE];  // [0]: the production defaults, unless a case says otherwise
    double flops;              // > 0: a product (TFLOP/s); else memory-bound (GB/s)
    double bytes;              // memory-bound traffic; 0: each buffer once (traffic())
};

static Case **cases;
static int ncases;
static const char *section = "";

static Case *new_case(const char *op, RunFn run, const char *fmt, ...) {
    Case *c = calloc(1, sizeof *c);
    int len = snprintf(c->name, sizeof c->name, "%s ", op);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->name + len, sizeof c->name - len, fmt, ap);
    va_end(ap);
    c->op = op;
    c->section = section;
    c->run = run;
    c->choice[0] = (Choice){NULL, cuda_settings_default(), -1, 0};
    c->nchoice = 1;
    if (ncases % 64 == 0) cases = realloc(cases, (ncases + 64) * sizeof *cases);
    cases[ncases++] = c;
    return c;
}
static Tensor *tensor(Case *c, const char *name, int type, int role, size_t n) {
    if (c->nt == MAXT) { fprintf(stderr, "%s: more than %d tensors\n", c->name, MAXT); exit(2); }
    Tensor *t = &c->t[c->nt++];
    memset(t, 0, sizeof *t);
    t->name = name;
    t->type = type;
    t->role = role;
    t->n = n;
    t->gen = G_CUSTOM;
    return t;
}
static Tensor *tin(Case *c, const char *name, int type, size_t n, int gen, float scale) {
    Tensor *t = tensor(c, name, type, IN, n);
    t->gen = gen;
    t->scale = scale;
    return t;
}
static Tensor *tout(Case *c, const char *name, int type, size_t n, const Bound *b) {
    Tensor *t = tensor(c, name, type, OUT, n);
    t->bound = b;
    return t;
}
static Tensor *tacc(Case *c, const char *name, int type, size_t n, int gen, float scale, const Bound *b) {
    Tensor *t = tensor(c, name, type, ACC, n);
    t->gen = gen;
    t->scale = scale;
    t->bound = b;
    return t;
}
// an output that accumulates when acc (prefilled on both sides), else assigned
static Tensor *tio(Case *c, const char *name, int type, size_t n, int acc, int gen, float scale, const Bound *b) {
    return acc ? tacc(c, name, type, n, gen, scale, b) : tout(c, name, type, n, b);
}
static Tensor *dims2(Tensor *t, int d0, int d1) { t->dims[0] = d0; t->dims[1] = d1; return t; }
static Tensor *dims4(Tensor *t, int d0, int d1, int d2, int d3) {
    t->dims[0] = d0; t->dims[1] = d1; t->dims[2] = d2; t->dims[3] = d3;
    return t;
}
static void add_choice(Case *c, const char *label, CudaSettings s) {
    if (c->nchoice == MAXCHOICE) { fprintf(stderr, "%s: more than %d kernel choices\n", c->name, MAXCHOICE); exit(2); }
    c->choice[c->nchoice++] = (Choice){label, s, -1, 0};
}
// --grouped-variant N[,N...]: the grouped cases also run under these epilogue variants
static int grouped_variants[MAX_GROUPED_VARIANTS], n_grouped_variants;
static char grouped_variant_label[MAX_GROUPED_VARIANTS][24];
// Runs choice ch's settings and variant.
static void configure_choice(const Choice *ch) {
    cuda_configure(&ch->s);
    cuda_grouped_set_variant(ch->variant);
}

#define MIS_(m) ((m) ? " misaligned" : "")
static const char *gname(Gating g) { return g == GATING_SIGMOID ? "sigmoid" : "softmax"; }
static const char *grads_tag(int dinp, int dw) { return dinp && dw ? "" : dinp ? ", dw NULL" : ", dinp NULL"; }

// ---- custom inputs -----------------------------------------------------------------

// tokens: half uniform over V, half from the first `hot` ids (repeats)
static void make_tokens(int *t, int N, int V, int hot) {
    for (int n = 0; n < N; n++) t[n] = (n % 2 && hot > 0) ? gt_irand(hot < V ? hot : V) : gt_irand(V);
}
// targets: every 7th masked (-1), the last one the last column
static void make_targets(int *t, int N, int V) {
    for (int n = 0; n < N; n++) t[n] = n % 7 == 3 ? -1 : gt_irand(V);
    if (N > 1) t[N - 1] = V - 1;
}
// router probabilities of uniform logits in [-scale, scale)
static void cpu_probs(float *p, int N, int E, Gating g, float scale) {
    size_t ne = (size_t)N * E;
    float *l = gt_malloc(ne * 4);
    for (size_t i = 0; i < ne; i++) l[i] = gt_urand() * scale;
    ops_cpu.router_probs_forward(p, l, N, E, g);
    free(l);
}
static void random_idx(int *idx, int N, int E, int k, uint64_t seed) {
    ops_cpu.router_topk(idx, NULL, NULL, N, E, k, ROUTING_RANDOM, &seed);
}
// expert choices: 0 random distinct experts, 1 learned top-k, 2 skewed (only
// experts 0..2, slots may repeat an expert; most segments empty)
static const char *idx_kind[] = {"random", "learned", "skewed"};
static void make_idx(int *idx, int N, int E, int k, int kind) {
    if (kind == 0) { random_idx(idx, N, E, k, 1234); return; }
    if (kind == 1) {
        float *p = gt_malloc((size_t)N * E * 4);
        cpu_probs(p, N, E, GATING_SOFTMAX, 2);
        ops_cpu.router_topk(idx, p, NULL, N, E, k, ROUTING_LEARNED, 0);
        free(p);
        return;
    }
    for (size_t i = 0; i < (size_t)N * k; i++) idx[i] = gt_irand(E < 3 ? E : 3);
}
// the dispatch maps of a random routing over 64 experts
static void cpu_route(int *token_of_row, int *row_of, int N, int k) {
    size_t R = (size_t)N * k;
    int *idx = gt_malloc(R * 4), *off = gt_malloc(65 * 4), *ro = gt_malloc(R * 4), *tor = gt_malloc(R * 4);
    make_idx(idx, N, 64, k, 0);
    ops_cpu.moe_route_index(off, ro, tor, idx, N, 64, k);
    if (token_of_row) memcpy(token_of_row, tor, R * 4);
    if (row_of) memcpy(row_of, ro, R * 4);
    free(idx); free(off); free(ro); free(tor);
}

// ---- the run of one case -------------------------------------------------------------

struct Run {
    const Case *c;
    void *h[MAXT];     // host values of the inputs and the prefills (float for act)
    void *cpu[MAXT];   // the CPU backend's buffers
    void *dev[MAXT];   // the CUDA backend's (views: one element in for MIS)
    void *base[MAXT];  // their allocations
    void *got[MAXT];   // CUDA results on the host (float for act)
    size_t ncpu[MAXT], ngpu[MAXT];
};

static int perf_mode;
static uint64_t fill_seed = 1;

static size_t host_elem(int type) { return type == F64 ? 8 : 4; }
static size_t numel_of(const Case *c, const Ops *o, int i) {
    return c->t[i].flags & SIZED ? c->numel(c, o, i) : c->t[i].n;
}
static int is_output(const Tensor *t) { return t->role == OUT || t->role == ACC; }

static void upload(Run *r, int i) {
    const Tensor *t = &r->c->t[i];
    if (t->type == ACT) gt_upload_bf16(r->dev[i], r->h[i], r->ngpu[i]);
    else cuda_to_device(r->dev[i], r->h[i], r->ngpu[i] * dev_elem[t->type]);
}
// assigned outputs to NaN, accumulated ones to their prefill
static void reset_outputs(Run *r) {
    for (int i = 0; i < r->c->nt; i++) {
        const Tensor *t = &r->c->t[i];
        if (t->role == OUT) gt_poison(r->dev[i], r->ngpu[i] * dev_elem[t->type]);
        if (t->role == ACC) upload(r, i);
    }
}
static void fetch_outputs(Run *r) {
    for (int i = 0; i < r->c->nt; i++) {
        const Tensor *t = &r->c->t[i];
        if (!is_output(t)) continue;
        free(r->got[i]);
        r->got[i] = t->type == ACT ? gt_host_bf16(r->dev[i], r->ngpu[i])
                                   : gt_host_bytes(r->dev[i], r->ngpu[i] * dev_elem[t->type]);
    }
}

static void setup(Run *r, const Case *c, int with_cpu) {
    memset(r, 0, sizeof *r);
    r->c = c;
    for (int i = 0; i < c->nt; i++) {
        const Tensor *t = &c->t[i];
        if (t->role == NONE) continue;
        r->ngpu[i] = numel_of(c, &ops_cuda, i);
        if (t->role != IN && t->role != ACC) continue;
        r->h[i] = gt_malloc(r->ngpu[i] * host_elem(t->type));
        if (t->gen != G_CUSTOM)
            gt_fill(r->h[i], r->ngpu[i], t->gen == G_NORMAL ? GT_NORMAL : GT_UNIFORM, t->gen == G_AROUND1 ? 1.f : 0.f,
                    t->scale, t->type == ACT, fill_seed++);
    }
    if (c->init) c->init(c, r->h);
    for (int i = 0; with_cpu && i < c->nt; i++) {
        const Tensor *t = &c->t[i];
        if (t->role == NONE) continue;
        size_t n = r->ncpu[i] = numel_of(c, &ops_cpu, i), bytes = n * host_elem(t->type);
        if (t->role == IN) r->cpu[i] = r->h[i]; // host memory is the CPU backend's memory
        else if (t->role == ACC) r->cpu[i] = memcpy(gt_malloc(bytes), r->h[i], bytes);
        else r->cpu[i] = calloc(1, bytes + 16);
    }
    for (int i = 0; i < c->nt; i++) {
        const Tensor *t = &c->t[i];
        if (t->role == NONE) continue;
        size_t bytes = r->ngpu[i] * dev_elem[t->type];
        int mis = t->flags & MIS;
        r->base[i] = cuda_alloc(bytes + (mis ? 16 : 0));
        r->dev[i] = (char *)r->base[i] + (mis ? dev_elem[t->type] : 0);
        if (t->role == IN || t->role == ACC) upload(r, i);
        else gt_poison(r->dev[i], bytes);
    }
}
static void teardown(Run *r) {
    for (int i = 0; i < r->c->nt; i++) {
        if (r->cpu[i] != r->h[i]) free(r->cpu[i]);
        free(r->h[i]);
        free(r->got[i]);
        cuda_free(r->base[i]);
    }
}

static char what[320];
static const char *check_name(const Case *c, const char *label, const char *tensor) {
    snprintf(what, sizeof what, "%s%s%s%s: %s", c->name, label ? " [" : "", label ? label : "", label ? "]" : "", tensor);
    return what;
}

// the CUDA outputs of the last run against the CPU's
static void compare_cpu(const Run *r, const char *label) {
    const Case *c = r->c;
    for (int i = 0; i < c->nt; i++) {
        const Tensor *t = &c->t[i];
        size_t n = r->ngpu[i];
        if (!is_output(t) || (t->flags & NOCMP) || n == 0) continue;
        const char *nm = check_name(c, label, t->name);
        if (t->type == I32) {
            gt_check_int(nm, r->got[i], r->cpu[i], n);
        } else if (t->type == F64) { // an accumulator: the increments
            const double *g = r->got[i], *ref = r->cpu[i], *pre = r->h[i];
            for (size_t j = 0; j < n; j++) {
                float gi = (float)(g[j] - pre[j]), ri = (float)(ref[j] - pre[j]);
                if (!gt_check(nm, &gi, &ri, 1, t->bound->tol))
                    printf("      got %.17g ref %.17g (prefill %.17g)\n", g[j], ref[j], pre[j]);
            }
        } else if (t->bound->tol == 0) { // bits; the CPU's act rounded to BF16
            const float *g = r->got[i], *ref = r->cpu[i];
            size_t bad = 0, first = 0;
            for (size_t j = 0; j < n; j++) {
                int differ = t->type == ACT ? f2bf(g[j]) != f2bf(ref[j]) : memcmp(&g[j], &ref[j], 4) != 0;
                if (differ && !bad++) first = j;
            }
            gt_ok(!bad, "%-48s %zu of %zu differ (exact)", nm, bad, n);
            if (bad) printf("      first at [%zu]: got %.8g ref %.8g\n", first, g[first], ref[first]);
        } else {
            gt_check_diag(nm, r->got[i], r->cpu[i], n, t->bound->tol, t->dims, t->seg, t->nseg);
        }
    }
}
// NOCPU: every assigned element written and finite
static void check_written(const Run *r, const char *label) {
    const Case *c = r->c;
    for (int i = 0; i < c->nt; i++) {
        const Tensor *t = &c->t[i];
        size_t n = r->ngpu[i], bad = 0;
        if (!is_output(t) || (t->type != ACT && t->type != F32) || n == 0) continue;
        const float *g = r->got[i];
        for (size_t j = 0; j < n; j++) bad += !isfinite(g[j]);
        char nm[64];
        snprintf(nm, sizeof nm, "%s written and finite", t->name);
        gt_ok(!bad, "%-48s %zu of %zu not finite", check_name(c, label, nm), bad, n);
    }
}
// this choice's outputs against the primary's
static void compare_choice(const Run *r, void *const *prim, const char *label, int exact) {
    const Case *c = r->c;
    char nm[64];
    for (int i = 0; i < c->nt; i++) {
        const Tensor *t = &c->t[i];
        if (!is_output(t) || r->ngpu[i] == 0) continue;
        snprintf(nm, sizeof nm, "%s vs [%s]%s", t->name, c->choice[0].label, exact ? ", bit for bit" : "");
        if (t->type == I32) gt_check_int(check_name(c, label, nm), r->got[i], prim[i], r->ngpu[i]);
        else if (exact) gt_check_bits(check_name(c, label, nm), r->got[i], prim[i], r->ngpu[i], t->type == F64 ? 8 : 4);
        else if (t->type == F64) gt_check_bits(check_name(c, label, nm), r->got[i], prim[i], r->ngpu[i], 8);
        else gt_agree(check_name(c, label, nm), r->got[i], prim[i], r->ngpu[i], t->row, t->bound ? t->bound->tol : 0);
    }
}
static void rerun(Run *r) {
    const Case *c = r->c;
    void *first[MAXT] = {0};
    for (int i = 0; i < c->nt; i++)
        if (is_output(&c->t[i])) first[i] = gt_host_bytes(r->dev[i], r->ngpu[i] * dev_elem[c->t[i].type]);
    reset_outputs(r);
    c->run(c, &ops_cuda, r->dev);
    char nm[96];
    for (int i = 0; i < c->nt; i++) {
        if (!first[i]) continue;
        void *second = gt_host_bytes(r->dev[i], r->ngpu[i] * dev_elem[c->t[i].type]);
        snprintf(nm, sizeof nm, "rerun gives the same bits: %s", c->t[i].name);
        gt_check_bits(check_name(c, c->choice[0].label, nm), first[i], second, r->ngpu[i], dev_elem[c->t[i].type]);
        free(first[i]);
        free(second);
    }
}

// ---- perf -------------------------------------------------------------------------------

#define WARMUP 3
#define RUNS 10
#define L2_FLUSH_FLOATS ((size_t)50 << 20) // 200 MB: 4 x the H200's 50 MB L2

static float *flush_buf;
static double *flush_acc;

static double traffic(const Case *c, const Run *r) {
    if (c->bytes > 0) return c->bytes;
    double b = 0;
    for (int i = 0; i < c->nt; i++) {
        const Tensor *t = &c->t[i];
        double once = (double)r->ngpu[i] * dev_elem[t->type];
        b += t->role == IN || t->role == OUT ? once : t->role == ACC ? 2 * once : 0;
    }
    return b;
}
static void time_choice(const Case *c, Run *r, int ch, int fallback) {
    if (!flush_buf) {
        flush_buf = cuda_alloc(L2_FLUSH_FLOATS * 4);
        flush_acc = cuda_alloc(8);
    }
    configure_choice(&c->choice[ch]);
    for (int i = 0; i < WARMUP; i++) c->run(c, &ops_cuda, r->dev);
    float ms[RUNS];
    for (int i = 0; i < RUNS; i++) {
        ops_cuda.sum_squares(flush_acc, flush_buf, L2_FLUSH_FLOATS);
        void *t0 = cuda_event_record();
        c->run(c, &ops_cuda, r->dev);
        void *t1 = cuda_event_record();
        ms[i] = cuda_event_elapsed_ms(t0, t1);
    }
    double med = gt_median(ms, RUNS);
    const char *label = c->choice[ch].label;
    printf("perf %s%s%s%s: %10.1f us ", c->name, label ? " [" : "", label ? label : "", label ? "]" : "", med * 1e3);
    if (c->flops > 0) printf("%7.1f TFLOP/s", c->flops / (med * 1e-3) / 1e12);
    else printf("%7.0f GB/s", traffic(c, r) / (med * 1e-3) / 1e9);
    printf("%s\n", fallback ? " (no wgmma kernel takes it: mma.sync ran)" : "");
    fflush(stdout);
}

// ---- the runner -----------------------------------------------------------------------------

static void run_case(const Case *c) {
    int with_cpu = !(c->flags & NOCPU), timed = perf_mode && (c->flags & PERF);
    cuda_configure(&c->choice[0].s); // before sizing: the attention scratch depends on it
    Run r;
    setup(&r, c, with_cpu);
    if (with_cpu) {
        if (c->prep) c->prep(c, &ops_cpu, r.cpu);
        c->run(c, &ops_cpu, r.cpu);
    }
    void *prim[MAXT] = {0};
    int fallback[MAXCHOICE] = {0}, outputs = 0;
    for (int i = 0; i < c->nt; i++) outputs += is_output(&c->t[i]) && r.ngpu[i] > 0;
    for (int ch = 0; ch < c->nchoice; ch++) {
        const char *label = c->choice[ch].label;
        configure_choice(&c->choice[ch]);
        if (ch == 0 && c->prep) c->prep(c, &ops_cuda, r.dev);
        if (c->takes && c->choice[ch].s.grouped_gemm == CUDA_KERNELS_WGMMA && !c->takes(c, r.dev)) {
            fallback[ch] = 1;
            printf("      (%s [%s]: no wgmma kernel takes this shape; the op ran on mma.sync)\n", c->name, label);
        }
        if (ch > 0 || c->takes) reset_outputs(&r);
        c->run(c, &ops_cuda, r.dev);
        fetch_outputs(&r);
        if (!outputs) printf("      (%s%s%s%s: nothing to compare)\n", c->name, label ? " [" : "", label ? label : "",
                             label ? "]" : "");
        if (with_cpu) compare_cpu(&r, label);
        else check_written(&r, label);
        if (c->extra) c->extra(&r, label);
        if (ch == 0) {
            memcpy(prim, r.got, sizeof prim);
            memset(r.got, 0, sizeof r.got);
            if (c->flags & RERUN) rerun(&r);
        } else {
            compare_choice(&r, prim, label, c->choice[ch].variant >= 0 || c->choice[ch].exact);
        }
    }
    if (timed)
        for (int ch = 0; ch < c->nchoice; ch++) time_choice(c, &r, ch, fallback[ch]);
    for (int i = 0; i < MAXT; i++) free(prim[i]);
    teardown(&r);
    CudaSettings d = cuda_settings_default();
    cuda_configure(&d);
    cuda_grouped_set_variant(-1);
    fflush(stdout);
}

// ==== the ops ==================================================================================
// Each op: a run function (tensors in the order its builder adds them) and
// a builder that adds a case.

// ---- elementwise ----------------------------------------------------------------------------

static void run_cast(const Case *c, const Ops *o, void *const *b) { o->cast_to_act(b[1], b[0], c->n); }
static void run_add_act(const Case *c, const Ops *o, void *const *b) { o->add_act(b[1], b[0], c->n); }
static void run_copy_act(const Case *c, const Ops *o, void *const *b) { o->copy_act(b[1], b[0], c->n); }
static void run_sum_act(const Case *c, const Ops *o, void *const *b) { o->sum_act(b[2], b[0], b[1], c->n); }
static void run_add_f32(const Case *c, const Ops *o, void *const *b) { o->add_f32(b[1], b[0], c->n); }
static void run_copy_f32(const Case *c, const Ops *o, void *const *b) { o->copy_f32(b[1], b[0], c->n); }
static void run_zero(const Case *c, const Ops *o, void *const *b) { o->zero(b[0], c->n * 4); }
static void run_swiglu_fwd(const Case *c, const Ops *o, void *const *b) { o->swiglu_forward(b[2], b[0], b[1], c->n); }
static void run_swiglu_bwd(const Case *c, const Ops *o, void *const *b) {
    o->swiglu_backward(b[3], b[4], b[0], b[1], b[2], c->n);
}

static void add_cast(size_t n, int mis) {
    Case *c = new_case("cast_to_act", run_cast, "n=%zu%s", n, MIS_(mis));
    c->n = n;
    tin(c, "src", F32, n, G_UNIFORM, 3)->flags |= mis ? MIS : 0;
    tout(c, "dst (RNE)", ACT, n, &B_EXACT);
}
static void add_elementwise(size_t n, int mis) {
    Case *c = new_case("add_act", run_add_act, "n=%zu%s", n, MIS_(mis));
    c->n = n;
    tin(c, "x", ACT, n, G_UNIFORM, 1);
    tacc(c, "y", ACT, n, G_UNIFORM, 1, &B_BF16)->flags |= mis ? MIS : 0;
    c = new_case("sum_act", run_sum_act, "n=%zu%s", n, MIS_(mis));
    c->n = n;
    tin(c, "a", ACT, n, G_UNIFORM, 1);
    tin(c, "b", ACT, n, G_UNIFORM, 1)->flags |= mis ? MIS : 0;
    tout(c, "out", ACT, n, &B_BF16);
    c = new_case("copy_act", run_copy_act, "n=%zu%s", n, MIS_(mis));
    c->n = n;
    tin(c, "src", ACT, n, G_UNIFORM, 1);
    tout(c, "dst", ACT, n, &B_EXACT)->flags |= mis ? MIS : 0;
    c = new_case("add_f32", run_add_f32, "n=%zu%s", n, MIS_(mis));
    c->n = n;
    tin(c, "x", F32, n, G_UNIFORM, 1);
    tacc(c, "y", F32, n, G_UNIFORM, 1, &B_F32)->flags |= mis ? MIS : 0;
    c = new_case("copy_f32", run_copy_f32, "n=%zu%s", n, MIS_(mis));
    c->n = n;
    tin(c, "src", F32, n, G_UNIFORM, 1);
    tout(c, "dst", F32, n, &B_EXACT)->flags |= mis ? MIS : 0;
}
static void add_zero(size_t n, int mis) {
    Case *c = new_case("zero", run_zero, "%zu bytes%s", n * 4, MIS_(mis));
    c->n = n;
    tout(c, "x", F32, n, &B_EXACT)->flags |= mis ? MIS : 0;
}
static void add_swiglu(size_t n, int mis, int perf) {
    Case *c = new_case("swiglu_forward", run_swiglu_fwd, "n=%zu%s", n, MIS_(mis));
    c->n = n;
    c->flags = perf ? PERF : 0;
    tin(c, "gate", ACT, n, G_UNIFORM, 4)->flags |= mis ? MIS : 0;
    tin(c, "up", ACT, n, G_UNIFORM, 1);
    tout(c, "out", ACT, n, &B_BF16);
    c = new_case("swiglu_backward", run_swiglu_bwd, "n=%zu%s", n, MIS_(mis));
    c->n = n;
    c->flags = perf ? PERF : 0;
    tin(c, "dout", ACT, n, G_UNIFORM, 1);
    tin(c, "gate", ACT, n, G_UNIFORM, 4)->flags |= mis ? MIS : 0;
    tin(c, "up", ACT, n, G_UNIFORM, 1);
    tout(c, "dgate", ACT, n, &B_BF16);
    tout(c, "dup", ACT, n, &B_BF16)->flags |= mis ? MIS : 0;
}

// ---- embedding, rmsnorm, rope ---------------------------------------------------------------

static void run_emb_fwd(const Case *c, const Ops *o, void *const *b) { o->embedding_forward(b[2], b[0], b[1], c->N, c->C); }
static void run_emb_bwd(const Case *c, const Ops *o, void *const *b) {
    o->embedding_backward(b[2], b[1], b[0], c->N, c->C);
}
static void init_tokens(const Case *c, void *const *h) { make_tokens(h[0], c->N, c->V, c->hot); }

static void add_embedding(int N, int C, int V, int hot, int mis, int flags) {
    Case *c = new_case("embedding_forward", run_emb_fwd, "N=%d C=%d V=%d%s", N, C, V, MIS_(mis));
    c->N = N, c->C = C, c->V = V, c->hot = hot;
    c->init = init_tokens;
    tin(c, "tokens", I32, N, G_CUSTOM, 0);
    tin(c, "wte", ACT, (size_t)V * C, G_UNIFORM, 1);
    dims2(tout(c, "out", ACT, (size_t)N * C, &B_EXACT), N, C)->flags |= mis ? MIS : 0;
    c = new_case("embedding_backward", run_emb_bwd, "N=%d C=%d V=%d hot=%d%s", N, C, V, hot, MIS_(mis));
    c->N = N, c->C = C, c->V = V, c->hot = hot;
    c->flags = flags;
    c->init = init_tokens;
    c->bytes = (double)N * C * 2 + 2.0 * N * C * 4; // dout read, the touched rows of dwte read and written
    tin(c, "tokens", I32, N, G_CUSTOM, 0);
    tin(c, "dout", ACT, (size_t)N * C, G_UNIFORM, 1);
    dims2(tacc(c, "dwte", F32, (size_t)V * C, G_UNIFORM, 1, &B_F32), V, C)->flags |= mis ? MIS : 0;
}

static void run_rms_fwd(const Case *c, const Ops *o, void *const *b) {
    o->rmsnorm_forward(b[2], b[3], b[0], b[1], c->N, c->C, 1e-5f);
}
static void run_rms_bwd(const Case *c, const Ops *o, void *const *b) {
    o->rmsnorm_backward(b[4], b[5], b[0], b[1], b[2], b[3], c->N, c->C, c->acc);
}
// the CPU's rstd of these x and w, on both sides
static void init_rms_bwd(const Case *c, void *const *h) {
    float *out = gt_malloc((size_t)c->N * c->C * 4);
    ops_cpu.rmsnorm_forward(out, h[3], h[1], h[2], c->N, c->C, 1e-5f);
    free(out);
}
static void add_rmsnorm(int N, int C, int acc, int mis, int flags) {
    size_t nc = (size_t)N * C;
    Case *c = new_case("rmsnorm_forward", run_rms_fwd, "N=%d C=%d%s", N, C, MIS_(mis));
    c->N = N, c->C = C;
    c->flags = flags & PERF;
    tin(c, "x", ACT, nc, G_UNIFORM, 2);
    tin(c, "w", ACT, C, G_AROUND1, 0.3f);
    dims2(tout(c, "out", ACT, nc, &B_BF16), N, C)->flags |= mis ? MIS : 0;
    tout(c, "rstd", F32, N, &B_F32);
    c = new_case("rmsnorm_backward", run_rms_bwd, "N=%d C=%d acc=%d%s", N, C, acc, MIS_(mis));
    c->N = N, c->C = C, c->acc = acc;
    c->flags = flags;
    c->init = init_rms_bwd;
    tin(c, "dy", ACT, nc, G_UNIFORM, 1);
    tin(c, "x", ACT, nc, G_UNIFORM, 2);
    tin(c, "w", ACT, C, G_AROUND1, 0.3f);
    tin(c, "rstd", F32, N, G_CUSTOM, 0);
    dims2(tio(c, "dinp", ACT, nc, acc, G_UNIFORM, 1, &B_BF16), N, C)->flags |= mis ? MIS : 0;
    tacc(c, "dw", F32, C, G_UNIFORM, 1, &B_F32);
}

static void run_rope(const Case *c, const Ops *o, void *const *b) {
    void *out = c->inplace ? b[2] : b[3];
    if (c->bwd) o->rope_backward(out, b[2], b[0], b[1], c->B, c->T, c->H, c->hd);
    else o->rope_forward(out, b[2], b[0], b[1], c->B, c->T, c->H, c->hd);
}
static void init_rope(const Case *c, void *const *h) { rope_tables(h[0], h[1], c->T, c->hd, 10000.f); }
static void add_rope(int B, int T, int nh, int hd, int inplace, int mis) {
    size_t n = (size_t)B * T * nh * hd, nt = (size_t)T * (hd / 2);
    for (int bwd = 0; bwd < 2; bwd++) {
        Case *c = new_case(bwd ? "rope_backward" : "rope_forward", run_rope, "B=%d T=%d nh=%d hd=%d%s%s", B, T, nh,
                           hd, inplace ? " in place" : "", MIS_(mis));
        c->B = B, c->T = T, c->H = nh, c->hd = hd, c->inplace = inplace, c->bwd = bwd;
        c->init = init_rope;
        tin(c, "cos", F32, nt, G_CUSTOM, 0);
        tin(c, "sin", F32, nt, G_CUSTOM, 0);
        Tensor *x = inplace ? tacc(c, bwd ? "dout -> dinp" : "x -> out", ACT, n, G_UNIFORM, 1, &B_BF16)
                            : tin(c, bwd ? "dout" : "x", ACT, n, G_UNIFORM, 1);
        dims4(x, B, T, nh, hd)->flags |= mis ? MIS : 0;
        if (!inplace) dims4(tout(c, bwd ? "dinp" : "out", ACT, n, &B_BF16), B, T, nh, hd);
    }
}

// QK-norm then RoPE in one op: C = nh hd (one row per (b, t)) or hd (per head)
static void run_rms_rope(const Case *c, const Ops *o, void *const *b) {
    if (c->bwd)
        o->rmsnorm_rope_backward(b[7], b[8], b[6], b[2], b[3], b[4], b[5], b[0], b[1], c->B, c->T, c->H, c->hd, c->C,
                                 c->acc);
    else o->rmsnorm_rope_forward(b[5], b[6], b[4], b[2], b[3], b[0], b[1], c->B, c->T, c->H, c->hd, c->C, 1e-5f);
}
static void init_rms_rope(const Case *c, void *const *h) {
    rope_tables(h[0], h[1], c->T, c->hd, 10000.f);
    if (!c->bwd) return;
    int N = (int)((size_t)c->B * c->T * c->H * c->hd / c->C);
    float *out = gt_malloc((size_t)N * c->C * 4);
    ops_cpu.rmsnorm_forward(out, h[5], h[3], h[4], N, c->C, 1e-5f);
    free(out);
}
static void add_rmsnorm_rope(int B, int T, int nh, int hd, int full, int acc, int flags) {
    size_t n = (size_t)B * T * nh * hd, nt = (size_t)T * (hd / 2);
    int C = full ? nh * hd : hd, N = (int)(n / C);
    for (int bwd = 0; bwd < 2; bwd++) {
        Case *c = new_case(bwd ? "rmsnorm_rope_backward" : "rmsnorm_rope_forward", run_rms_rope,
                           "B=%d T=%d nh=%d hd=%d C=%d%s", B, T, nh, hd, C, bwd && acc ? " acc=1" : "");
        c->B = B, c->T = T, c->H = nh, c->hd = hd, c->C = C, c->N = N, c->bwd = bwd, c->acc = bwd && acc;
        c->flags = flags;
        c->init = init_rms_rope;
        tin(c, "cos", F32, nt, G_CUSTOM, 0);
        tin(c, "sin", F32, nt, G_CUSTOM, 0);
        if (!bwd) {
            tin(c, "x", ACT, n, G_UNIFORM, 2);
            tin(c, "w", ACT, C, G_AROUND1, 0.3f);
            tensor(c, "tmp", ACT, WORK, n);
            dims4(tout(c, "out", ACT, n, &B_BF16), B, T, nh, hd);
            tout(c, "rstd", F32, N, &B_F32);
        } else {
            tin(c, "dy", ACT, n, G_UNIFORM, 1);
            tin(c, "x", ACT, n, G_UNIFORM, 2);
            tin(c, "w", ACT, C, G_AROUND1, 0.3f);
            tin(c, "rstd", F32, N, G_CUSTOM, 0);
            tensor(c, "tmp", ACT, WORK, n);
            dims2(tio(c, "dinp", ACT, n, c->acc, G_UNIFORM, 1, &B_BF16), N, C);
            tacc(c, "dw", F32, C, G_UNIFORM, 1, &B_ROPE_DW);
        }
    }
}

// ---- router ---------------------------------------------------------------------------------

static void run_probs_fwd(const Case *c, const Ops *o, void *const *b) {
    o->router_probs_forward(b[1], b[0], c->N, c->E, c->gating);
}
static void run_probs_bwd(const Case *c, const Ops *o, void *const *b) {
    o->router_probs_backward(b[2], b[0], b[1], c->N, c->E, c->gating, c->acc);
}
static void init_probs_bwd(const Case *c, void *const *h) {
    float *l = gt_malloc((size_t)c->N * c->E * 4);
    for (size_t i = 0; i < (size_t)c->N * c->E; i++) l[i] = gt_urand() * 3;
    ops_cpu.router_probs_forward(h[1], l, c->N, c->E, c->gating);
    free(l);
}
static void add_router_probs(int N, int E, Gating g, int acc) {
    size_t ne = (size_t)N * E;
    Case *c = new_case("router_probs_forward", run_probs_fwd, "N=%d E=%d %s", N, E, gname(g));
    c->N = N, c->E = E, c->gating = g;
    tin(c, "logits", F32, ne, G_UNIFORM, 3);
    tout(c, "probs", F32, ne, &B_F32);
    c = new_case("router_probs_backward", run_probs_bwd, "N=%d E=%d %s acc=%d", N, E, gname(g), acc);
    c->N = N, c->E = E, c->gating = g, c->acc = acc;
    c->init = init_probs_bwd;
    tin(c, "dprobs", F32, ne, G_UNIFORM, 1);
    tin(c, "probs", F32, ne, G_CUSTOM, 0);
    dims2(tio(c, "dlogits", F32, ne, acc, G_UNIFORM, 1, &B_F32), N, E);
}

static void run_topk(const Case *c, const Ops *o, void *const *b) { // the seed in the backend's memory
    uint64_t *seed = o->alloc(sizeof(uint64_t));
    o->to_device(seed, &c->seed, sizeof(uint64_t));
    o->router_topk(b[2], b[0], b[1], c->N, c->E, c->k, c->mode, seed);
    o->free(seed);
}
// ties: probabilities and bias quantised to a few levels, so that
// most choices are decided by the lower-index rule
static void init_topk(const Case *c, void *const *h) {
    size_t ne = (size_t)c->N * c->E;
    float *p = h[0], *b = h[1];
    cpu_probs(p, c->N, c->E, GATING_SOFTMAX, 2);
    if (c->ties)
        for (size_t i = 0; i < ne; i++) p[i] = (float)gt_irand(4) * 0.25f;
    for (int e = 0; b && e < c->E; e++) b[e] = c->ties ? (float)gt_irand(2) * 0.25f : gt_urand() * 0.02f;
}
static void add_router_topk(int N, int E, int k, RoutingMode mode, int bias, int ties, uint64_t seed) {
    const char *mname = mode == ROUTING_LEARNED ? "learned" : mode == ROUTING_RANDOM ? "random" : "uniform";
    Case *c = new_case("router_topk", run_topk, "%s N=%d E=%d k=%d%s%s", mname, N, E, k, bias ? " bias" : "",
                       ties ? " ties" : "");
    c->N = N, c->E = E, c->k = k, c->mode = mode, c->ties = ties, c->seed = seed;
    c->init = init_topk;
    tin(c, "probs", F32, (size_t)N * E, G_CUSTOM, 0);
    if (bias) tin(c, "bias", F32, E, G_CUSTOM, 0);
    else tensor(c, "bias", F32, NONE, 0);
    tout(c, "idx", I32, (size_t)N * k, &B_EXACT);
}

static void run_weights_fwd(const Case *c, const Ops *o, void *const *b) {
    o->router_weights_forward(b[2], b[0], b[1], c->N, c->E, c->k, c->renorm);
}
static void run_weights_bwd(const Case *c, const Ops *o, void *const *b) {
    o->router_weights_backward(b[3], b[0], b[1], b[2], c->N, c->E, c->k, c->renorm, c->acc);
}
// probs and idx at tensors `at`, `at + 1`
static void init_probs_idx(const Case *c, void *const *h, int at) {
    cpu_probs(h[at], c->N, c->E, GATING_SOFTMAX, 2);
    random_idx(h[at + 1], c->N, c->E, c->k, 77);
}
static void init_weights_fwd(const Case *c, void *const *h) { init_probs_idx(c, h, 0); }
static void init_weights_bwd(const Case *c, void *const *h) { init_probs_idx(c, h, 1); }
static void add_router_weights(int N, int E, int k, int renorm, int acc) {
    size_t ne = (size_t)N * E, nk = (size_t)N * k;
    Case *c = new_case("router_weights_forward", run_weights_fwd, "N=%d E=%d k=%d renorm=%d", N, E, k, renorm);
    c->N = N, c->E = E, c->k = k, c->renorm = renorm;
    c->init = init_weights_fwd;
    tin(c, "probs", F32, ne, G_CUSTOM, 0);
    tin(c, "idx", I32, nk, G_CUSTOM, 0);
    tout(c, "weights", F32, nk, &B_F32);
    c = new_case("router_weights_backward", run_weights_bwd, "N=%d E=%d k=%d renorm=%d acc=%d", N, E, k, renorm, acc);
    c->N = N, c->E = E, c->k = k, c->renorm = renorm, c->acc = acc;
    c->init = init_weights_bwd;
    tin(c, "dweights", F32, nk, G_UNIFORM, 1);
    tin(c, "probs", F32, ne, G_CUSTOM, 0);
    tin(c, "idx", I32, nk, G_CUSTOM, 0);
    tio(c, "dprobs", F32, ne, acc, G_UNIFORM, 1, &B_F32);
}

static void run_count(const Case *c, const Ops *o, void *const *b) { o->router_count(b[1], b[0], c->N, c->E, c->k); }
static void init_count(const Case *c, void *const *h) {
    random_idx(h[0], c->N, c->E, c->k, 5);
    for (int e = 0; e < c->E; e++) ((float *)h[1])[e] = (float)(e % 7); // integers: exact on both sides
}
static void add_router_count(int N, int E, int k) {
    Case *c = new_case("router_count", run_count, "N=%d E=%d k=%d (onto prefill)", N, E, k);
    c->N = N, c->E = E, c->k = k;
    c->init = init_count;
    tin(c, "idx", I32, (size_t)N * k, G_CUSTOM, 0);
    tacc(c, "counts", F32, E, G_CUSTOM, 0, &B_F32);
}

// aux-loss-free bias update: L = N layers of E experts; counts are integers
// around the mean with some equal to it (the 0 branch), bias a prefill
static void run_bias_update(const Case *c, const Ops *o, void *const *b) {
    o->router_bias_update(b[1], b[0], c->N, c->E, 0.01f);
}
static void init_bias_update(const Case *c, void *const *h) {
    float *counts = h[0];
    for (int l = 0; l < c->N; l++)
        for (int e = 0; e < c->E; e++) counts[(size_t)l * c->E + e] = (float)(e % 5 == 0 ? 2 : (e * 7 + l * 3) % 5);
}
static void add_router_bias_update(int L, int E) {
    Case *c = new_case("router_bias_update", run_bias_update, "L=%d E=%d (onto prefill)", L, E);
    c->N = L, c->E = E;
    c->init = init_bias_update;
    tin(c, "counts", F32, (size_t)L * E, G_CUSTOM, 0);
    tacc(c, "bias", F32, (size_t)L * E, G_UNIFORM, 0.1f, &B_EXACT);
}

static void run_lb_fwd(const Case *c, const Ops *o, void *const *b) {
    o->lb_loss_forward(b[2], b[0], b[1], c->x, c->N, c->E, c->k, c->gating);
}
static void run_lb_bwd(const Case *c, const Ops *o, void *const *b) {
    o->lb_loss_backward(b[2], b[0], b[1], c->x, c->N, c->E, c->k, c->gating, 0.37f);
}
static void init_lb(const Case *c, void *const *h) {
    float *counts = h[1];
    int *idx = gt_malloc((size_t)c->N * c->k * 4);
    cpu_probs(h[0], c->N, c->E, c->gating, 2);
    random_idx(idx, c->N, c->E, c->k, 9);
    memset(counts, 0, c->E * 4);
    ops_cpu.router_count(counts, idx, c->N, c->E, c->k);
    for (int e = 0; e < c->E; e++) counts[e] += (float)(e % 3); // uneven
    free(idx);
}
static void add_lb_loss(int N, int E, int k, Gating g, float count_tokens, int flags) {
    size_t ne = (size_t)N * E;
    Case *c = new_case("lb_loss_forward", run_lb_fwd, "N=%d E=%d k=%d %s count_tokens=%.0f", N, E, k, gname(g),
                       count_tokens);
    c->N = N, c->E = E, c->k = k, c->gating = g, c->x = count_tokens;
    c->flags = flags;
    c->init = init_lb;
    tin(c, "probs", F32, ne, G_CUSTOM, 0);
    tin(c, "counts", F32, E, G_CUSTOM, 0);
    tout(c, "loss", F32, 1, &B_F32);
    c = new_case("lb_loss_backward", run_lb_bwd, "N=%d E=%d k=%d %s count_tokens=%.0f", N, E, k, gname(g),
                 count_tokens);
    c->N = N, c->E = E, c->k = k, c->gating = g, c->x = count_tokens;
    c->init = init_lb;
    tin(c, "probs", F32, ne, G_CUSTOM, 0);
    tin(c, "counts", F32, E, G_CUSTOM, 0);
    tacc(c, "dprobs", F32, ne, G_UNIFORM, 1e-5f, &B_F32); // prefill: the size of the increments
}

static void run_z_fwd(const Case *c, const Ops *o, void *const *b) { o->zloss_forward(b[1], b[0], c->N, c->E); }
static void run_z_bwd(const Case *c, const Ops *o, void *const *b) { o->zloss_backward(b[1], b[0], c->N, c->E, 0.25f); }
static void add_zloss(int N, int E, int flags) {
    size_t ne = (size_t)N * E;
    Case *c = new_case("zloss_forward", run_z_fwd, "N=%d E=%d", N, E);
    c->N = N, c->E = E;
    c->flags = flags;
    tin(c, "logits", F32, ne, G_UNIFORM, 4);
    tout(c, "loss", F32, 1, &B_F32);
    c = new_case("zloss_backward", run_z_bwd, "N=%d E=%d", N, E);
    c->N = N, c->E = E;
    tin(c, "logits", F32, ne, G_UNIFORM, 4);
    tacc(c, "dlogits", F32, ne, G_UNIFORM, 1e-5f, &B_F32); // prefill: the size of the increments
}

// ---- dispatch -------------------------------------------------------------------------------

static void run_route_index(const Case *c, const Ops *o, void *const *b) {
    o->moe_route_index(b[1], b[2], b[3], b[0], c->N, c->E, c->k);
}
static void init_route_index(const Case *c, void *const *h) { make_idx(h[0], c->N, c->E, c->k, c->kind); }
static void add_route_index(int N, int E, int k, int kind, int flags) {
    size_t R = (size_t)N * k;
    Case *c = new_case("moe_route_index", run_route_index, "N=%d E=%d k=%d %s", N, E, k, idx_kind[kind]);
    c->N = N, c->E = E, c->k = k, c->kind = kind;
    c->flags = flags;
    c->init = init_route_index;
    tin(c, "idx", I32, R, G_CUSTOM, 0);
    tout(c, "offsets", I32, E + 1, &B_EXACT);
    tout(c, "row_of", I32, R, &B_EXACT);
    tout(c, "token_of_row", I32, R, &B_EXACT);
}

static void run_permute_fwd(const Case *c, const Ops *o, void *const *b) {
    o->permute_forward(b[2], b[1], b[0], c->R, c->C);
}
// permute_scatter where the backend has it (the GPU), else permute_forward
// from the matching token_of_row (the CPU: the reference is the gather)
static void run_permute_scatter(const Case *c, const Ops *o, void *const *b) {
    if (o->permute_scatter) o->permute_scatter(b[3], b[2], b[0], c->N, c->k, c->C);
    else o->permute_forward(b[3], b[2], b[1], c->R, c->C);
}
static void init_route_maps(const Case *c, void *const *h) { cpu_route(h[1], h[0], c->N, c->k); }
static void run_permute_bwd(const Case *c, const Ops *o, void *const *b) {
    o->permute_backward(b[2], b[1], b[0], c->N, c->R, c->C, c->acc);
}
static void init_tor(const Case *c, void *const *h) { cpu_route(h[0], NULL, c->N, c->k); }
// an arbitrary row -> token map: tokens with no rows and tokens with many
static void init_tor_uneven(const Case *c, void *const *h) {
    int *tor = h[0];
    for (int r = 0; r < c->R; r++) tor[r] = r % 5 == 0 ? 3 % c->N : gt_irand(c->N / 2 > 0 ? c->N / 2 : 1);
}
static void add_permute(int N, int k, int C, int acc, int mis, int flags) {
    int R = N * k;
    size_t nc = (size_t)N * C, rc = (size_t)R * C;
    Case *c = new_case("permute_forward", run_permute_fwd, "N=%d k=%d C=%d%s", N, k, C, MIS_(mis));
    c->N = N, c->k = k, c->C = C, c->R = R;
    c->flags = flags & PERF;
    c->init = init_tor;
    tin(c, "token_of_row", I32, R, G_CUSTOM, 0);
    tin(c, "x", ACT, nc, G_UNIFORM, 1);
    dims2(tout(c, "xp", ACT, rc, &B_EXACT), R, C)->flags |= mis ? MIS : 0;
    c = new_case("permute_scatter", run_permute_scatter, "N=%d k=%d C=%d%s", N, k, C, MIS_(mis));
    c->N = N, c->k = k, c->C = C, c->R = R;
    c->flags = flags & PERF;
    c->init = init_route_maps;
    tin(c, "row_of", I32, R, G_CUSTOM, 0);
    tin(c, "token_of_row", I32, R, G_CUSTOM, 0);
    tin(c, "x", ACT, nc, G_UNIFORM, 1);
    dims2(tout(c, "xp", ACT, rc, &B_EXACT), R, C)->flags |= mis ? MIS : 0;
    c = new_case("permute_backward", run_permute_bwd, "N=%d k=%d C=%d acc=%d%s", N, k, C, acc, MIS_(mis));
    c->N = N, c->k = k, c->C = C, c->R = R, c->acc = acc;
    c->flags = flags;
    c->init = init_tor;
    tin(c, "token_of_row", I32, R, G_CUSTOM, 0);
    tin(c, "dxp", ACT, rc, G_UNIFORM, 1);
    dims2(tio(c, "dx", ACT, nc, acc, G_UNIFORM, 1, &B_BF16), N, C)->flags |= mis ? MIS : 0;
}
static void add_permute_backward_uneven(int N, int R, int C, int acc) {
    Case *c = new_case("permute_backward", run_permute_bwd, "uneven N=%d R=%d C=%d acc=%d", N, R, C, acc);
    c->N = N, c->C = C, c->R = R, c->acc = acc;
    c->init = init_tor_uneven;
    tin(c, "token_of_row", I32, R, G_CUSTOM, 0);
    tin(c, "dxp", ACT, (size_t)R * C, G_UNIFORM, 1);
    dims2(tio(c, "dx", ACT, (size_t)N * C, acc, G_UNIFORM, 1, &B_BF16), N, C);
}

// Capacity drop and segment sizes over host-made offsets (c->offsets):
// uneven segments, every 5th empty, some longer than the capacity, and
// `tail` rows past offsets[E] that must stay untouched. Their own stream:
// made when the cases are listed, they leave the other cases' inputs as they were.
static int *make_segments(int E, int mean, int tail, int *R) {
    int *off = malloc((E + 1) * sizeof(int));
    uint64_t st = 0x5eed0000u + (uint64_t)E * 977 + mean;
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + (e % 5 == 4 ? 0 : (int)(gt_next(&st) % (2 * mean + 1)));
    *R = off[E] + tail;
    return off;
}
static void init_offsets(const Case *c, void *const *h) { memcpy(h[0], c->offsets, (c->E + 1) * sizeof(int)); }
static void run_capacity_drop(const Case *c, const Ops *o, void *const *b) {
    o->moe_capacity_drop(b[1], b[2], b[0], c->E, c->R, c->C, c->capacity);
}
static void add_capacity_drop(int E, int mean, int capacity, int C, int count, int mis, int flags) {
    int R;
    const int *off = make_segments(E, mean, 5, &R);
    int dropped = 0;
    for (int e = 0; e < E; e++) dropped += off[e + 1] - off[e] > capacity ? off[e + 1] - off[e] - capacity : 0;
    Case *c = new_case("moe_capacity_drop", run_capacity_drop, "E=%d R=%d C=%d capacity=%d (%d rows dropped)%s%s", E,
                       R, C, capacity, dropped, count ? "" : ", dropped NULL", MIS_(mis));
    c->E = E, c->R = R, c->C = C, c->capacity = capacity, c->offsets = off;
    c->flags = flags;
    c->init = init_offsets;
    tin(c, "offsets", I32, E + 1, G_CUSTOM, 0);
    dims2(tacc(c, "y", ACT, (size_t)R * C, G_UNIFORM, 1, &B_EXACT), R, C)->flags |= mis ? MIS : 0;
    if (count) tacc(c, "dropped", F32, 1, G_UNIFORM, 4, &B_EXACT); // prefill + an integer: one rounding each side
    else tensor(c, "dropped", F32, NONE, 1);
}
static void run_segment_sizes(const Case *c, const Ops *o, void *const *b) { o->moe_segment_sizes(b[1], b[0], c->E); }
static void add_segment_sizes(int E, int mean) {
    int R;
    Case *c = new_case("moe_segment_sizes", run_segment_sizes, "E=%d", E);
    c->E = E, c->offsets = make_segments(E, mean, 0, &R);
    c->init = init_offsets;
    tin(c, "offsets", I32, E + 1, G_CUSTOM, 0);
    tout(c, "sizes", I32, E, &B_EXACT);
}

static void run_unpermute_fwd(const Case *c, const Ops *o, void *const *b) {
    o->unpermute_forward(b[3], b[1], b[2], b[0], c->N, c->k, c->C, c->acc);
}
// unpermute_residual where the backend has it (the GPU), else the two ops it
// replaces (the CPU): unpermute_forward into the scratch f, sum_act
static void run_unpermute_res(const Case *c, const Ops *o, void *const *b) {
    if (o->unpermute_residual) {
        o->unpermute_residual(b[4], b[3], b[1], b[2], b[0], c->N, c->k, c->C);
        return;
    }
    o->unpermute_forward(b[5], b[1], b[2], b[0], c->N, c->k, c->C, 0);
    o->sum_act(b[4], b[3], b[5], (size_t)c->N * c->C);
}
static void run_unpermute_bwd(const Case *c, const Ops *o, void *const *b) {
    o->unpermute_backward(b[4], b[5], b[1], b[2], b[3], b[0], c->N, c->k, c->C);
}
// row_of at 0, weights (in [0, 1)) at `w`
static void init_unpermute(const Case *c, void *const *h, int w) {
    cpu_route(NULL, h[0], c->N, c->k);
    for (size_t i = 0; i < (size_t)c->N * c->k; i++) ((float *)h[w])[i] = 0.5f + 0.5f * gt_urand();
}
static void init_unpermute_fwd(const Case *c, void *const *h) { init_unpermute(c, h, 2); }
static void init_unpermute_bwd(const Case *c, void *const *h) { init_unpermute(c, h, 3); }
static void add_unpermute(int N, int k, int C, int acc, int mis, int flags) {
    int R = N * k;
    size_t nc = (size_t)N * C, rc = (size_t)R * C, nk = (size_t)N * k;
    Case *c = new_case("unpermute_forward", run_unpermute_fwd, "N=%d k=%d C=%d acc=%d%s", N, k, C, acc, MIS_(mis));
    c->N = N, c->k = k, c->C = C, c->R = R, c->acc = acc;
    c->flags = flags;
    c->init = init_unpermute_fwd;
    tin(c, "row_of", I32, nk, G_CUSTOM, 0);
    tin(c, "y", ACT, rc, G_UNIFORM, 1);
    tin(c, "weights", F32, nk, G_CUSTOM, 0);
    dims2(tio(c, "out", ACT, nc, acc, G_UNIFORM, 1, &B_BF16), N, C)->flags |= mis ? MIS : 0;
    if (!acc) {
        c = new_case("unpermute_residual", run_unpermute_res, "N=%d k=%d C=%d%s", N, k, C, MIS_(mis));
        c->N = N, c->k = k, c->C = C, c->R = R;
        c->flags = flags;
        c->init = init_unpermute_fwd;
        tin(c, "row_of", I32, nk, G_CUSTOM, 0);
        tin(c, "y", ACT, rc, G_UNIFORM, 1);
        tin(c, "weights", F32, nk, G_CUSTOM, 0);
        tin(c, "res", ACT, nc, G_UNIFORM, 1);
        dims2(tout(c, "out", ACT, nc, &B_BF16), N, C)->flags |= mis ? MIS : 0;
        tensor(c, "f", ACT, WORK, nc); // the CPU's scratch
    }
    c = new_case("unpermute_backward", run_unpermute_bwd, "N=%d k=%d C=%d%s", N, k, C, MIS_(mis));
    c->N = N, c->k = k, c->C = C, c->R = R;
    c->flags = acc ? 0 : flags;
    c->init = init_unpermute_bwd;
    tin(c, "row_of", I32, nk, G_CUSTOM, 0);
    tin(c, "dout", ACT, nc, G_UNIFORM, 1)->flags |= mis ? MIS : 0;
    tin(c, "y", ACT, rc, G_UNIFORM, 1);
    tin(c, "weights", F32, nk, G_CUSTOM, 0);
    dims2(tout(c, "dy", ACT, rc, &B_BF16), R, C);
    tout(c, "dweights", F32, nk, &B_DOT);
}

// ---- loss -----------------------------------------------------------------------------------

static void run_ce_fwd(const Case *c, const Ops *o, void *const *b) {
    o->crossentropy_forward(b[2], b[1], b[0], c->N, c->V);
}
static void run_ce_bwd(const Case *c, const Ops *o, void *const *b) {
    o->crossentropy_backward(c->inplace ? b[1] : b[2], b[1], b[0], 0.37f, c->N, c->V);
}
static void run_ce_fused(const Case *c, const Ops *o, void *const *b) {
    o->crossentropy_fused(b[2], b[1], b[1], b[0], 0.37f, c->N, c->V);
}
static void init_targets(const Case *c, void *const *h) { make_targets(h[0], c->N, c->V); }
// which: 1 forward, 2 backward, 4 backward in place (as the model calls it;
// masked rows must come back zero), 8 both fused, in place (as the
// training step's forward calls it)
static void add_crossentropy(int N, int V, int mis, int which, int flags) {
    size_t nv = (size_t)N * V;
    for (int w = 1; w <= 8; w *= 2) {
        if (!(which & w)) continue;
        Case *c = w == 1   ? new_case("crossentropy_forward", run_ce_fwd, "N=%d V=%d%s", N, V, MIS_(mis))
                  : w == 8 ? new_case("crossentropy_fused", run_ce_fused, "in place N=%d V=%d%s", N, V, MIS_(mis))
                           : new_case("crossentropy_backward", run_ce_bwd, "%sN=%d V=%d%s",
                                      w == 4 ? "in place " : "", N, V, MIS_(mis));
        c->N = N, c->V = V, c->inplace = w >= 4;
        c->flags = flags;
        c->init = init_targets;
        tin(c, "targets", I32, N, G_CUSTOM, 0);
        if (w >= 4) {
            dims2(tacc(c, "logits -> dlogits", ACT, nv, G_UNIFORM, 4, &B_BF16), N, V)->flags |= mis ? MIS : 0;
            if (w == 8) tout(c, "losses", F32, N, &B_F32);
            continue;
        }
        tin(c, "logits", ACT, nv, G_UNIFORM, 4)->flags |= mis ? MIS : 0;
        if (w == 1) tout(c, "losses", F32, N, &B_F32);
        else dims2(tout(c, "dlogits", ACT, nv, &B_BF16), N, V);
    }
}

static void run_loss_sum(const Case *c, const Ops *o, void *const *b) { o->loss_sum(b[2], b[1], b[0], c->N); }
static void init_loss_sum(const Case *c, void *const *h) {
    make_targets(h[0], c->N, 100);
    float *loss = h[1];
    for (int n = 0; n < c->N; n++) loss[n] = fabsf(gt_urand() * 5);
    *(double *)h[2] = 1234.5;
}
static void add_loss_sum(int N, int flags) {
    Case *c = new_case("loss_sum", run_loss_sum, "N=%d (onto prefill)", N);
    c->N = N;
    c->flags = flags;
    c->init = init_loss_sum;
    tin(c, "targets", I32, N, G_CUSTOM, 0);
    tin(c, "losses", F32, N, G_CUSTOM, 0);
    tacc(c, "acc", F64, 1, G_CUSTOM, 0, &B_F32);
}

// ---- optimizer ------------------------------------------------------------------------------

static void run_adamw(const Case *c, const Ops *o, void *const *b) {
    o->adamw_update(b[1], b[4], b[0], b[2], b[3], c->n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, c->t_step);
}
static void init_adamw(const Case *c, void *const *h) {
    float *v = h[3];
    for (size_t i = 0; i < c->n; i++) v[i] = v[i] * v[i] * 0.01f;
}
// p_act is the BF16 rounding of the GPU's own p; p itself need not match the CPU's bits
static void extra_adamw(const Run *r, const char *label) {
    const Case *c = r->c;
    const float *p = r->got[1], *pcpu = r->cpu[1];
    size_t bitdiff = 0;
    for (size_t i = 0; i < c->n; i++) bitdiff += memcmp(&p[i], &pcpu[i], 4) != 0;
    printf("      (p differs from the CPU's in %zu of %zu bit patterns; 0 expected, not required)\n", bitdiff, c->n);
    if (!r->got[4]) return;
    const float *pa = r->got[4];
    size_t bad = 0;
    for (size_t i = 0; i < c->n; i++) bad += f2bf(pa[i]) != f2bf(p[i]);
    gt_ok(!bad, "%-48s %zu of %zu differ", check_name(c, label, "p_act = bf16(p)"), bad, c->n);
}
static void add_adamw(size_t n, int with_act, int t, int mis, int flags) {
    Case *c = new_case("adamw_update", run_adamw, "n=%zu t=%d%s%s", n, t, with_act ? " +act" : "", MIS_(mis));
    c->n = n, c->t_step = t;
    c->flags = flags;
    c->init = init_adamw;
    c->extra = extra_adamw;
    tin(c, "g", F32, n, G_UNIFORM, 1);
    tacc(c, "p", F32, n, G_UNIFORM, 1, &B_F32)->flags |= mis ? MIS : 0;
    tacc(c, "m", F32, n, G_UNIFORM, 0.1f, &B_F32);
    tacc(c, "v", F32, n, G_UNIFORM, 1, &B_F32);
    if (with_act) tout(c, "p_act", ACT, n, &B_BF16)->flags |= NOCMP;
    else tensor(c, "p_act", ACT, NONE, 0);
}

static void run_sum_squares(const Case *c, const Ops *o, void *const *b) { o->sum_squares(b[1], b[0], c->n); }
static void init_sum_squares(const Case *c, void *const *h) { *(double *)h[1] = 7.25; }
static void add_sum_squares(size_t n, int mis, int flags) {
    Case *c = new_case("sum_squares", run_sum_squares, "n=%zu%s (onto prefill)", n, MIS_(mis));
    c->n = n;
    c->flags = flags;
    c->init = init_sum_squares;
    tin(c, "x", F32, n, G_UNIFORM, 2)->flags |= mis ? MIS : 0;
    tacc(c, "acc", F64, 1, G_CUSTOM, 0, &B_F32);
}

// ---- dense products (cuBLASLt) --------------------------------------------------------------

static void run_mm_fwd(const Case *c, const Ops *o, void *const *b) {
    o->matmul_forward(b[2], b[0], b[1], c->N, c->C, c->OC);
}
static void run_mm_bwd(const Case *c, const Ops *o, void *const *b) {
    o->matmul_backward(b[3], b[4], b[0], b[1], b[2], c->N, c->C, c->OC, c->acc);
}
static void add_matmul_forward(int N, int C, int OC, int flags, const char *note) {
    Case *c = new_case("matmul_forward", run_mm_fwd, "N=%d C=%d OC=%d%s", N, C, OC, note);
    c->N = N, c->C = C, c->OC = OC;
    c->flags = flags;
    c->flops = 2.0 * N * C * OC;
    tin(c, "inp", ACT, (size_t)N * C, G_NORMAL, 1);
    tin(c, "w", ACT, (size_t)OC * C, G_NORMAL, 1 / sqrtf((float)C));
    dims2(tout(c, "out", ACT, (size_t)N * OC, &B_BF16), N, OC);
}
static void add_matmul_backward(int N, int C, int OC, int acc, int want_dinp, int want_dw, int flags, const char *note) {
    Case *c = new_case("matmul_backward", run_mm_bwd, "N=%d C=%d OC=%d acc=%d%s%s", N, C, OC, acc,
                       grads_tag(want_dinp, want_dw), note);
    c->N = N, c->C = C, c->OC = OC, c->acc = acc;
    c->flags = flags;
    c->flops = 2.0 * N * C * OC * (want_dinp + want_dw);
    tin(c, "dout", ACT, (size_t)N * OC, G_NORMAL, 1);
    tin(c, "inp", ACT, (size_t)N * C, G_NORMAL, 1);
    tin(c, "w", ACT, (size_t)OC * C, G_NORMAL, 1 / sqrtf((float)C));
    if (want_dinp) dims2(tio(c, "dinp", ACT, (size_t)N * C, acc, G_NORMAL, 1, &B_BF16), N, C);
    else tensor(c, "dinp", ACT, NONE, 0);
    if (want_dw) dims2(tacc(c, "dw", F32, (size_t)OC * C, G_NORMAL, 1, &B_DW), OC, C);
    else tensor(c, "dw", F32, NONE, 0);
}
// odd sizes have tails everywhere; acc 0: both grads, dw NULL, dinp NULL; acc 1: both, dw NULL
static void add_matmul(int N, int C, int OC) {
    add_matmul_forward(N, C, OC, 0, "");
    for (int acc = 0; acc <= 1; acc++)
        for (int variant = 0; variant < (acc ? 2 : 3); variant++)
            add_matmul_backward(N, C, OC, acc, variant != 2, variant != 1, 0, "");
}

static void run_rl_fwd(const Case *c, const Ops *o, void *const *b) {
    o->router_logits_forward(b[2], b[0], b[1], c->N, c->C, c->E);
}
static void run_rl_bwd(const Case *c, const Ops *o, void *const *b) {
    o->router_logits_backward(b[3], b[4], b[0], b[1], b[2], c->N, c->C, c->E);
}
static void add_router_logits(int N, int C, int E) {
    Case *c = new_case("router_logits_forward", run_rl_fwd, "N=%d C=%d E=%d", N, C, E);
    c->N = N, c->C = C, c->E = E;
    tin(c, "inp", ACT, (size_t)N * C, G_NORMAL, 1);
    tin(c, "w", ACT, (size_t)E * C, G_NORMAL, 1 / sqrtf((float)C));
    dims2(tout(c, "logits", F32, (size_t)N * E, &B_LOGITS), N, E);
    for (int variant = 0; variant < 3; variant++) { // both, dw NULL, dinp NULL; both always accumulate
        int want_dinp = variant != 2, want_dw = variant != 1;
        c = new_case("router_logits_backward", run_rl_bwd, "N=%d C=%d E=%d%s", N, C, E, grads_tag(want_dinp, want_dw));
        c->N = N, c->C = C, c->E = E;
        // FP32 dlogits, not BF16-representable: the GPU's rounding of them is part of what is tested
        tin(c, "dlogits", F32, (size_t)N * E, G_NORMAL, 1);
        tin(c, "inp", ACT, (size_t)N * C, G_NORMAL, 1);
        tin(c, "w", ACT, (size_t)E * C, G_NORMAL, 1 / sqrtf((float)C));
        if (want_dinp) dims2(tacc(c, "dinp", ACT, (size_t)N * C, G_NORMAL, 1, &B_BF16), N, C);
        else tensor(c, "dinp", ACT, NONE, 0);
        if (want_dw) dims2(tacc(c, "dw", F32, (size_t)E * C, G_NORMAL, 1, &B_DW), E, C);
        else tensor(c, "dw", F32, NONE, 0);
    }
}

// ---- grouped products (the experts) ----------------------------------------------------------
// The production default runs them on the wgmma kernels (grouped_wgmma.cu:
// TMA, else cp.async, else the mma.sync kernels of gemm.cu); each case also
// runs on the other kernel choices, against the CPU and against the default.

static void run_g_fwd(const Case *c, const Ops *o, void *const *b) {
    o->grouped_matmul_forward(b[3], b[1], b[2], b[0], c->E, c->C, c->OC);
}
static void run_g_bwd(const Case *c, const Ops *o, void *const *b) {
    o->grouped_matmul_backward(b[4], b[5], b[1], b[2], b[3], b[0], c->E, c->C, c->OC, c->acc);
}
static void run_g_pair(const Case *c, const Ops *o, void *const *b) {
    o->grouped_dgrad_pair(b[5], b[1], b[2], b[3], b[4], b[0], c->E, c->C, c->OC);
}
static int takes_g_fwd(const Case *c, void *const *b) {
    return cuda_grouped_forward_wgmma(b[3], b[1], b[2], b[0], c->E, c->C, c->OC) == 0;
}
static int takes_g_bwd(const Case *c, void *const *b) {
    int ok = 1;
    if (b[4]) ok &= cuda_grouped_dgrad_wgmma(b[4], b[1], b[3], b[0], c->E, c->C, c->OC) == 0;
    if (b[5] && cuda_settings()->grouped_wgrad == CUDA_KERNELS_WGMMA)
        ok &= cuda_grouped_wgrad_wgmma(b[5], b[1], b[2], b[0], c->E, c->C, c->OC, c->acc, NULL, NULL) == 0;
    return ok;
}
static int takes_g_pair(const Case *c, void *const *b) {
    return cuda_grouped_dgrad_pair_wgmma(b[5], b[1], b[2], b[3], b[4], b[0], c->E, c->C, c->OC) == 0;
}
// dw = (accumulate 0, a step's first backward) gives the same bits as += into zeros
static void extra_g_dw_set(const Run *r, const char *label) {
    const Case *c = r->c;
    size_t nw = r->ngpu[5];
    float *dw = cuda_alloc(nw * 4 + 4); // zero-filled
    ops_cuda.grouped_matmul_backward(NULL, dw, r->dev[1], r->dev[2], r->dev[3], r->dev[0], c->E, c->C, c->OC, 1);
    float *added = gt_host_f32(dw, nw);
    gt_ok(!memcmp(added, r->got[5], nw * 4), "%s", check_name(c, label, "dw = is += into zeros, bit for bit"));
    free(added);
    cuda_free(dw);
}
static Case *grouped_case(const char *op, RunFn run, const char *label, int E, int C, int OC, const int *off,
                          int flags, const char *what) {
    int R = off[E];
    Case *c = new_case(op, run, "%sE=%d C=%d OC=%d R=%d (%s)", what, E, C, OC, R, label);
    c->E = E, c->C = C, c->OC = OC, c->R = R, c->offsets = off;
    c->flags = flags;
    c->init = init_offsets;
    c->choice[0].label = "wgmma";
    CudaSettings s = cuda_settings_default();
    s.grouped_gemm = CUDA_KERNELS_MMA_SYNC;
    add_choice(c, "mma.sync", s);
    s = cuda_settings_default();
    s.gemm_tma = 0;
    add_choice(c, "wgmma cp.async", s);
    for (int v = 0; v < n_grouped_variants; v++) {
        add_choice(c, grouped_variant_label[v], cuda_settings_default());
        c->choice[c->nchoice - 1].variant = grouped_variants[v];
    }
    tin(c, "offsets", I32, E + 1, G_CUSTOM, 0);
    return c;
}
static void add_grouped(const char *label, int E, int C, int OC, const int *counts, int perf) {
    int *off = malloc((E + 1) * sizeof(int)), *wseg = malloc((E + 1) * sizeof(int)); // kept: the cases point at them
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + counts[e];
    for (int e = 0; e <= E; e++) wseg[e] = e * OC; // dw as [E*OC, C]: a segment per expert
    int R = off[E], pf = perf ? PERF : 0;
    size_t nin = (size_t)R * C, nw = (size_t)E * OC * C, nout = (size_t)R * OC;
    double flop = 2.0 * R * C * OC;
    float ws = 1 / sqrtf((float)C);

    // forward (no rows: must still run, with nothing to compare)
    Case *c = grouped_case("grouped_matmul_forward", run_g_fwd, label, E, C, OC, off, pf, "");
    c->flops = flop;
    c->takes = takes_g_fwd;
    tin(c, "inp", ACT, nin, G_NORMAL, 1);
    tin(c, "w", ACT, nw, G_NORMAL, ws);
    Tensor *t = dims2(tout(c, "out", ACT, nout, &B_BF16), R, OC);
    t->seg = off, t->nseg = E;

    // backward: both, dw NULL (data-grad), dinp NULL (weight-grad) with dw +=,
    // and dw = (accumulate 0) over poison: experts without rows get zeros
    for (int variant = 0; variant < 4; variant++) {
        int want_dinp = variant < 2, want_dw = variant != 1, acc = variant != 3;
        c = grouped_case("grouped_matmul_backward", run_g_bwd, label, E, C, OC, off,
                         variant == 1 || variant == 2 ? pf : 0, acc ? "" : "dw = ");
        snprintf(c->name + strlen(c->name), sizeof c->name - strlen(c->name), "%s", grads_tag(want_dinp, want_dw));
        c->acc = acc;
        c->flops = flop * (want_dinp + want_dw);
        c->takes = takes_g_bwd;
        if (!acc) c->extra = extra_g_dw_set;
        if (want_dw) {
            CudaSettings s = cuda_settings_default();
            s.grouped_wgrad = CUDA_KERNELS_MMA_SYNC;
            add_choice(c, "wgrad mma.sync", s);
        }
        tin(c, "dout", ACT, nout, G_NORMAL, 1);
        tin(c, "inp", ACT, nin, G_NORMAL, 1);
        tin(c, "w", ACT, nw, G_NORMAL, ws);
        if (want_dinp) {
            t = dims2(tout(c, "dinp", ACT, nin, &B_BF16), R, C);
            t->seg = off, t->nseg = E;
        } else {
            tensor(c, "dinp", ACT, NONE, 0);
        }
        if (want_dw) {
            t = dims2(tio(c, "dw", F32, nw, acc, G_NORMAL, 1, &B_DW), E * OC, C);
            t->seg = wseg, t->nseg = E;
        } else {
            tensor(c, "dw", F32, NONE, 0);
        }
    }

    // the data-grad pair dout w_e + dout2 w2_e (the experts' gate and up)
    if (R == 0) return;
    c = grouped_case("grouped_dgrad_pair", run_g_pair, label, E, C, OC, off, pf, "");
    c->flops = 2 * flop;
    c->takes = takes_g_pair;
    tin(c, "dout1", ACT, nout, G_NORMAL, 1);
    tin(c, "w1", ACT, nw, G_NORMAL, ws);
    tin(c, "dout2", ACT, nout, G_NORMAL, 1);
    tin(c, "w2", ACT, nw, G_NORMAL, ws);
    t = dims2(tout(c, "dinp", ACT, nin, &B_BF16), R, C);
    t->seg = off, t->nseg = E;
}
// R rows spread over E experts with random weights in [0.2, 2], none for the
// experts listed in zero[]
static void uneven_counts(int *counts, int E, int R, const int *zero, int nzero) {
    double *cum = malloc(E * sizeof(double)), total = 0;
    for (int e = 0; e < E; e++) {
        double wgt = 0.2 + 1.8 * (gt_urand() + 1) / 2;
        for (int z = 0; z < nzero; z++)
            if (zero[z] == e) wgt = 0;
        cum[e] = total += wgt;
        counts[e] = 0;
    }
    for (int r = 0; r < R; r++) {
        double u = (gt_urand() + 1) / 2 * total;
        int e = 0;
        while (e < E - 1 && u >= cum[e]) e++; // skips empty experts: their cum equals the previous
        counts[e]++;
    }
    free(cum);
}

// ---- attention -------------------------------------------------------------------------------
// The CPU saves the probabilities [B,H,T,T], CUDA the log-sum-exp [B,H,T]
// (saved is SIZED and not compared; extra_lse checks CUDA's). At head dim
// 128 without GQA, the backward's dQ goes through dS^T by default
// (device.cuda.attention_ds_mib > 0) or by its own kernel (0). Where T is
// a multiple of 128 and there are no documents the forward runs on the TMA
// + wgmma kernel by default (device.cuda.attention_fwd; each hd 128 case
// also runs under mma_sync), and the dS^T backward has a TMA + wgmma choice
// (device.cuda.attention_bwd: wgmma; default mma_sync). The mma.sync
// choices do the same arithmetic in the same order (0 differing elements
// expected), the wgmma kernels sum in another order; the comparison between
// choices allows rounding-level differences within 1e-2 per position.
// Cases with documents (docs=..., intra-document masking) add doc_start
// [B,T], an I32 input of the pattern named (make_doc_starts); their TFLOP/s
// count the causal FLOPs, so that fewer masked tiles show as a higher rate.

enum { DOCS_NONE, DOCS_ONE, DOCS_MANY, DOCS_TILE, DOCS_SHORT, DOCS_LONG };
static const char *const docs_name[] = {"none", "one", "many", "tile", "short", "long"};
// doc_start [B,T] (ops.h) of documents whose lengths follow the pattern:
// one: no EOS, every doc_start 0; many: 1 in 5 of length 1, 3 in 10 of
// 2..16, the rest 17..300; tile: lengths cycling through 1, 62, 1, 64, 63,
// 2, 128, 127, 129, 31, 33, 17 (boundaries on, just before and just after
// the 16- to 128-row tile edges); short: lengths 1 and 2 in turn; long: 1 to
// 512 (about 16 documents in 4096). Each batch row draws its own.
static void make_doc_starts(int *ds, int B, int T, int kind) {
    static const int tile[] = {1, 62, 1, 64, 63, 2, 128, 127, 129, 31, 33, 17};
    for (int b = 0; b < B; b++)
        for (int t = 0, i = 5 * b; t < T;) {
            int u = gt_irand(10), len = kind == DOCS_ONE ? T
                                      : kind == DOCS_MANY ? (u < 2 ? 1 : u < 5 ? 2 + gt_irand(15) : 17 + gt_irand(284))
                                      : kind == DOCS_TILE ? tile[i++ % 12]
                                      : kind == DOCS_SHORT ? 1 + (i++ & 1)
                                                           : 1 + gt_irand(512);
            for (int j = 0; j < len && t < T; j++, t++) ds[(size_t)b * T + t] = t - j;
        }
}
static void init_docs(const Case *c, void *const *h) { make_doc_starts(h[c->doc], c->B, c->T, c->kind); }
static const int *att_docs(const Case *c, void *const *b) { return c->doc ? b[c->doc] : NULL; }

static void run_att_fwd(const Case *c, const Ops *o, void *const *b) {
    o->attention_forward(b[3], b[4], b[0], b[1], b[2], att_docs(c, b), c->B, c->T, c->H, c->KV, c->hd);
}
static void prep_att_bwd(const Case *c, const Ops *o, void *const *b) {
    o->attention_forward(b[4], b[5], b[0], b[1], b[2], att_docs(c, b), c->B, c->T, c->H, c->KV, c->hd);
}
static void run_att_bwd(const Case *c, const Ops *o, void *const *b) {
    o->attention_backward(b[6], b[7], b[8], b[3], b[5], b[0], b[1], b[2], b[4], att_docs(c, b), b[9], c->B, c->T, c->H,
                          c->KV, c->hd);
}
static size_t att_numel(const Case *c, const Ops *o, int i) {
    if (!strcmp(c->t[i].name, "scratch")) return o->attention_scratch_floats(c->B, c->T, c->H, c->KV, c->hd);
    return o->attention_saved_floats(c->B, c->T, c->H, c->hd);
}
// The GPU's saved statistic lse2[b,h,t] = log2 sum_{s<=t} exp(q.k_s * scale)
// (s from doc_start[b,t] with documents), against its reference in double.
static void extra_lse(const Run *r, const char *label) {
    const Case *c = r->c;
    int B = c->B, T = c->T, H = c->H, KV = c->KV, hd = c->hd;
    const float *q = r->h[0], *k = r->h[1], *lse = r->got[4];
    const int *ds = c->doc ? r->h[c->doc] : NULL;
    size_t ns = r->ngpu[4];
    float *ref = gt_malloc(ns * 4);
    double scale = 1.0 / sqrt((double)hd);
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            double *sc = gt_malloc((size_t)T * sizeof(double));
            for (int t = 0; t < T; t++) {
                const float *qv = q + (((size_t)b * T + t) * H + h) * hd;
                double mx = -INFINITY, sum = 0;
                int lo = ds ? ds[(size_t)b * T + t] : 0;
                for (int s = lo; s <= t; s++) {
                    const float *kv = k + (((size_t)b * T + s) * KV + h / (H / KV)) * hd;
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += (double)qv[i] * kv[i];
                    sc[s] = d * scale;
                    if (sc[s] > mx) mx = sc[s];
                }
                for (int s = lo; s <= t; s++) sum += exp(sc[s] - mx);
                ref[((size_t)b * H + h) * T + t] = (float)((mx + log(sum)) / log(2.0));
            }
            free(sc);
        }
    int dims[] = {B, H, T, 0};
    gt_check_diag(check_name(c, label, "saved lse2"), lse, ref, ns, B_LSE.tol, dims, NULL, 0);
    free(ref);
}
// doc_start, after the case's other tensors (their indices stay those of the run functions)
static void attention_docs_input(Case *c, int docs) {
    c->kind = docs;
    c->doc = c->nt;
    c->init = init_docs;
    dims2(tin(c, "doc_start", I32, (size_t)c->B * c->T, G_CUSTOM, 0), c->B, c->T);
}
static Case *attention_case(int bwd, int B, int T, int H, int KV, int hd, int flags, int docs) {
    char dn[32] = "";
    if (docs) snprintf(dn, sizeof dn, " docs=%s", docs_name[docs]);
    Case *c = bwd ? new_case("attention_backward", run_att_bwd, "B=%d T=%d H=%d KV=%d hd=%d%s", B, T, H, KV, hd, dn)
                  : new_case("attention_forward", run_att_fwd, "B=%d T=%d H=%d KV=%d hd=%d%s", B, T, H, KV, hd, dn);
    c->B = B, c->T = T, c->H = H, c->KV = KV, c->hd = hd;
    c->flags = flags;
    c->numel = att_numel;
    double fwd_flop = 4.0 * B * H * (double)T * T * hd / 2; // two products, halved for causality
    c->flops = bwd ? 2.5 * fwd_flop : fwd_flop;
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd;
    tin(c, "q", ACT, nq, G_NORMAL, 1);
    tin(c, "k", ACT, nk, G_NORMAL, 1);
    tin(c, "v", ACT, nk, G_NORMAL, 1);
    if (!bwd) {
        dims4(tout(c, "out", ACT, nq, &B_ATTN), B, T, H, hd)->row = (size_t)H * hd;
        tout(c, "saved", F32, 0, &B_LSE)->flags |= SIZED | NOCMP;
        if (!(flags & NOCPU)) c->extra = extra_lse;
        if (hd == 128) { // the TMA + wgmma forward where it takes the shape (the default), and mma.sync
            c->choice[0].label = "fwd wgmma";
            CudaSettings s = cuda_settings_default();
            s.attention_fwd = CUDA_KERNELS_MMA_SYNC;
            add_choice(c, "fwd mma_sync", s);
        }
        if (docs) attention_docs_input(c, docs);
        return c;
    }
    c->prep = prep_att_bwd;
    tin(c, "dout", ACT, nq, G_NORMAL, 1);
    tensor(c, "out", ACT, WORK, nq);
    tensor(c, "saved", F32, WORK, 0)->flags |= SIZED;
    dims4(tout(c, "dq", ACT, nq, &B_ATTN), B, T, H, hd)->row = (size_t)H * hd;
    dims4(tout(c, "dk", ACT, nk, &B_ATTN), B, T, KV, hd)->row = (size_t)KV * hd;
    dims4(tout(c, "dv", ACT, nk, &B_ATTN), B, T, KV, hd)->row = (size_t)KV * hd;
    tensor(c, "scratch", F32, WORK, 0)->flags |= SIZED;
    if (hd == 128 && H == KV) { // dQ through dS^T (the default: on wgmma where it takes the shape), on mma.sync, by its own kernel
        c->choice[0].label = "dQ via dS^T, wgmma";
        CudaSettings s = cuda_settings_default();
        s.attention_bwd = CUDA_KERNELS_MMA_SYNC;
        add_choice(c, "dQ via dS^T, mma_sync", s);
        s.attention_ds_mib = 0;
        add_choice(c, "dQ kernel", s);
    }
    if (docs) attention_docs_input(c, docs);
    return c;
}
// forward and backward; small_cap: the backward's dS^T under a 1 MiB cap
// (batch rows go through it in slices) instead of the default; docs: the
// documents' pattern (DOCS_NONE: doc_start NULL)
// order: the wgmma kernels' block order (device.cuda.attention_group) also
// as groups of `order` (batch, head) pairs and as one group, each a choice
// that must give the default's bits
static void add_order_choices(Case *c, int order) {
    int groups[2] = {order, c->B * c->H};
    for (int i = 0; i < 2; i++) {
        CudaSettings s = cuda_settings_default();
        s.attention_group = groups[i];
        char label[64];
        snprintf(label, sizeof label, "%s, attention_group=%d", c->choice[0].label ? c->choice[0].label : "default",
                 groups[i]);
        add_choice(c, strdup(label), s); // the cases live for the whole run
        c->choice[c->nchoice - 1].exact = 1;
    }
}
static void add_attention_ordered(int B, int T, int H, int KV, int hd, int flags, int docs, int order) {
    Case *f = attention_case(0, B, T, H, KV, hd, flags, docs);
    add_order_choices(f, order);
    Case *b = attention_case(1, B, T, H, KV, hd, flags, docs);
    add_order_choices(b, order);
}
static void add_attention(int B, int T, int H, int KV, int hd, int flags, int small_cap, int docs) {
    attention_case(0, B, T, H, KV, hd, flags, docs);
    Case *c = attention_case(1, B, T, H, KV, hd, flags, docs);
    if (small_cap) { // every dS^T choice under the cap the scratch is sized with (choice 0's)
        c->choice[0].s.attention_ds_mib = 1;
        c->choice[0].label = "dQ via dS^T, wgmma, attention_ds_mib=1";
        c->choice[1].s.attention_ds_mib = 1;
        c->choice[1].label = "dQ via dS^T, mma_sync, attention_ds_mib=1";
    }
}

// ==== the case table ============================================================================

static const int small[] = {37, 0, 130, 1, 9}, tails[] = {0, 200, 3, 0}, one_row[] = {1}, no_rows[] = {0, 0, 0};
static const int wide[] = {37, 0, 130, 1, 300}, wide2[] = {300, 0, 77};
static const int last8[8] = {0, 0, 0, 0, 0, 0, 0, 32768}, first8[8] = {4096, 0, 0, 0, 0, 0, 0, 0};
static int olmoe_counts[64];

// Shapes: odd ones (tails of every vector width and tile; misaligned views,
// which send the kernels down their scalar paths) and OLMoE-1B-7B's
// (d_model 2048, 16 heads of 128, sequence 4096, 64 experts top-8 => 32768
// grouped rows, expert hidden 1024, vocab 50304), the PERF cases.
static void make_cases(void) {
    section = "elementwise";
    add_cast(1000003, 0);
    add_cast(4099, 1);
    add_elementwise(1000003, 0);
    add_elementwise(4099, 1);
    add_zero(1000003, 0);
    add_zero(4099, 1);
    add_swiglu((size_t)32768 * 1024, 0, 1);
    add_swiglu(1001, 0, 0);
    add_swiglu(4099, 1, 0);

    section = "embedding, rmsnorm, rope";
    add_embedding(4096, 2048, 50304, 100, 0, PERF);
    add_embedding(37, 100, 13, 3, 0, 0);
    add_embedding(300, 256, 1000, 1, 1, 0);      // one hot id: a run of ~150 positions
    add_embedding(16384, 2048, 1000, 40, 0, RERUN); // many repeated ids
    add_rmsnorm(4096, 2048, 0, 0, PERF | RERUN);
    add_rmsnorm(4096, 2048, 1, 0, 0);
    add_rmsnorm(65536, 128, 0, 0, RERUN); // per-head QK-norm rows
    add_rmsnorm(4096, 1024, 1, 0, 0);
    add_rmsnorm(777, 512, 0, 0, 0);
    add_rmsnorm(5, 24, 1, 0, 0);      // fast path, lanes past C idle
    add_rmsnorm(9, 1544, 1, 0, 0);    // block per row: 193 of 224 threads busy, fewer rows than blocks
    add_rmsnorm(37, 100, 1, 0, 0);    // general path, C not a multiple of 8
    add_rmsnorm(33, 4096, 1, 0, 0);   // general path, vectorised
    add_rmsnorm(1000, 2048, 1, 1, 0); // general path, scalar
    add_rmsnorm(512, 4096, 0, 0, RERUN);
    add_rope(2, 256, 16, 128, 0, 0);
    add_rope(2, 64, 16, 128, 1, 0);
    add_rope(2, 17, 4, 64, 0, 0);
    add_rope(1, 5, 3, 6, 0, 0);    // hd/2 = 3: scalar
    add_rope(2, 33, 4, 128, 1, 1); // in place, misaligned
    // QK-norm + RoPE in one op: fused where a row is whole heads of 512 <
    // C <= 2048 (OLMoE's q, the sweep's, 6 heads of 128, 12 of 64, T not a
    // multiple of anything), else the two ops through tmp (per-head rows,
    // narrow rows); the bits of the two ops: special check rope_paths
    add_rmsnorm_rope(2, 64, 16, 128, 1, 0, RERUN);
    add_rmsnorm_rope(1, 8192, 16, 128, 1, 0, NOCPU | PERF);
    add_rmsnorm_rope(2, 33, 8, 128, 1, 1, 0);
    add_rmsnorm_rope(3, 17, 6, 128, 1, 0, 0);
    add_rmsnorm_rope(2, 21, 12, 64, 1, 1, 0);
    add_rmsnorm_rope(2, 16, 4, 32, 1, 0, 0);
    add_rmsnorm_rope(2, 40, 8, 128, 0, 1, 0);

    section = "router";
    for (int g = 0; g < 2; g++)
        for (int acc = 0; acc < 2; acc++) {
            add_router_probs(4096, 64, (Gating)g, acc);
            add_router_probs(5, 7, (Gating)g, acc);
        }
    add_router_probs(300, 100, GATING_SOFTMAX, 0);
    add_router_topk(4096, 64, 8, ROUTING_LEARNED, 0, 0, 0);
    add_router_topk(4096, 64, 8, ROUTING_LEARNED, 1, 0, 0);
    add_router_topk(4096, 64, 8, ROUTING_LEARNED, 1, 1, 0);
    add_router_topk(4096, 64, 8, ROUTING_LEARNED, 0, 1, 0);
    add_router_topk(1000, 256, 16, ROUTING_LEARNED, 1, 1, 0);
    add_router_topk(9, 7, 7, ROUTING_LEARNED, 1, 1, 0);
    add_router_topk(5, 7, 3, ROUTING_LEARNED, 0, 0, 0);
    add_router_topk(4096, 64, 8, ROUTING_RANDOM, 0, 0, 0x1234);
    add_router_topk(4096, 64, 8, ROUTING_RANDOM, 0, 0, 0xfedcba9876543210ULL);
    add_router_topk(1000, 256, 64, ROUTING_RANDOM, 0, 0, 42);
    add_router_topk(100, 7, 7, ROUTING_RANDOM, 0, 0, 3);
    add_router_topk(4096, 64, 8, ROUTING_UNIFORM, 0, 0, 0);
    add_router_topk(37, 7, 3, ROUTING_UNIFORM, 0, 0, 0);
    for (int renorm = 0; renorm < 2; renorm++)
        for (int acc = 0; acc < 2; acc++) {
            add_router_weights(4096, 64, 8, renorm, acc);
            add_router_weights(5, 7, 3, renorm, acc);
        }
    add_router_bias_update(16, 64);
    add_router_bias_update(3, 7);
    add_router_count(4096, 64, 8);
    add_router_count(5, 7, 3);
    for (int g = 0; g < 2; g++) {
        add_lb_loss(4096, 64, 8, (Gating)g, 4096.f, g == GATING_SIGMOID ? RERUN : 0);
        add_lb_loss(4096, 64, 8, (Gating)g, 3 * 4096.f, 0);
        add_lb_loss(5, 7, 3, (Gating)g, 5.f, 0);
        add_lb_loss(4096, 64, 8, (Gating)g, 0.f, 0); // count_tokens 0: from the counts (lb_global)
        add_lb_loss(5, 7, 3, (Gating)g, 0.f, 0);
    }
    add_zloss(4096, 64, RERUN);
    add_zloss(5, 7, 0);

    section = "dispatch";
    for (int kind = 0; kind < 3; kind++) add_route_index(4096, 64, 8, kind, kind == 0 ? PERF : 0);
    add_route_index(5, 7, 3, 0, 0);
    add_route_index(33, 1, 2, 2, 0);
    add_route_index(100, 256, 16, 1, 0);
    for (int acc = 0; acc < 2; acc++) {
        add_permute(4096, 8, 2048, acc, 0, acc ? 0 : PERF | RERUN);
        add_permute(37, 3, 100, acc, 0, 0);
        add_permute(300, 4, 256, acc, 1, 0);
        add_permute_backward_uneven(50, 300, 64, acc);
        add_permute_backward_uneven(50, 300, 2056, acc); // C > 2048: two channel passes
        add_unpermute(4096, 8, 2048, acc, 0, acc ? 0 : PERF);
        add_unpermute(37, 3, 100, acc, 0, 0);
        add_unpermute(300, 4, 256, acc, 1, 0);
        add_unpermute(100, 6, 1000, acc, 0, 0); // slots in two groups, the second partial
    }
    // capacity drops: the OLMoE shape (64 experts, ~512 rows each, capacity
    // 1.0 x the mean), scalar rows, one expert, a capacity nothing exceeds,
    // 256 mostly small experts; with and without the count
    add_capacity_drop(64, 512, 512, 2048, 1, 0, PERF);
    add_capacity_drop(7, 6, 3, 100, 1, 1, 0);
    add_capacity_drop(7, 6, 3, 100, 0, 0, 0);
    add_capacity_drop(1, 40, 1, 8, 1, 0, 0);
    add_capacity_drop(16, 8, 100, 256, 1, 0, 0);
    add_capacity_drop(256, 2, 1, 264, 1, 1, 0);
    add_segment_sizes(64, 512);
    add_segment_sizes(5, 3);
    add_segment_sizes(1536, 4);
    section = "loss";
    add_crossentropy(1024, 50304, 0, 15, 0);
    add_crossentropy(7, 1001, 0, 15, 0);
    add_crossentropy(64, 50257, 0, 15, 0);
    add_crossentropy(3, 8, 0, 15, 0);
    add_crossentropy(16, 4104, 1, 15, 0);
    add_crossentropy(4096, 50304, 0, 1 | 4 | 8, PERF);
    add_loss_sum(4096, RERUN);
    add_loss_sum(3, 0);

    section = "optimizer";
    add_adamw(1000003, 1, 1, 0, 0);
    add_adamw(1000003, 0, 1000, 0, 0);
    add_adamw(4099, 1, 7, 1, 0);
    add_adamw((size_t)64 << 20, 1, 3, 0, PERF);
    add_sum_squares(10000019, 0, RERUN);
    add_sum_squares(1, 0, 0);
    add_sum_squares(4099, 1, 0);
    add_sum_squares((size_t)64 << 20, 0, PERF);

    section = "dense products (cuBLASLt)";
    // dense products: odd sizes, OLMoE's attention-sized GEMM; then the size
    // of the grouped OLMoE products as one dense GEMM (all rows against one
    // weight: the same FLOPs), for the perf comparison
    add_matmul(37, 64, 96);
    add_matmul(37, 72, 40);
    add_matmul(4096, 2048, 1024);
    add_matmul_forward(32768, 2048, 1024, PERF, " (the grouped size, dense)");
    add_matmul_backward(32768, 2048, 1024, 0, 1, 0, PERF, " (the grouped size, dense)");
    add_matmul_backward(32768, 2048, 1024, 0, 0, 1, PERF, " (the grouped size, dense)");
    // the bench configs' dense products (timed only): the attention
    // projections one at a time and q, k, v as one product of 3x the
    // width, and the LM head; OLMoE (micro-batch 2 x 4096, d 2048) and the
    // sweep (16 x 4096, d 1024)
    {
        static const int shapes[][3] = {{8192, 2048, 2048}, {8192, 2048, 6144}, {8192, 2048, 50304},
                                        {65536, 1024, 1024}, {65536, 1024, 3072}, {65536, 1024, 50304}};
        for (int i = 0; i < 6; i++) {
            int N = shapes[i][0], C = shapes[i][1], OC = shapes[i][2];
            add_matmul_forward(N, C, OC, NOCPU | PERF, " (bench shape)");
            add_matmul_backward(N, C, OC, 1, 1, 0, NOCPU | PERF, " (bench shape)");
            add_matmul_backward(N, C, OC, 0, 0, 1, NOCPU | PERF, " (bench shape)");
        }
    }
    // router (E=60: a leading dimension that is not a multiple of 8)
    add_router_logits(37, 64, 8);
    add_router_logits(4096, 2048, 64);
    add_router_logits(37, 72, 60);

    section = "grouped products (the experts)";
    // grouped, small: rows not multiples of the 128-row tile, zero-row
    // experts first / inside / last, K (C=72, OC=40) not multiples of 32
    add_grouped("small", 5, 64, 96, small, 0);
    add_grouped("tails", 4, 72, 40, tails, 0);
    add_grouped("one row", 1, 8, 8, one_row, 0);
    add_grouped("no rows", 3, 64, 96, no_rows, 0);
    // the wgmma kernel's 256-column tile with tails in every dimension:
    // K = 200 (3 x 64 + 8), OC = 264 (a second column tile with 8 columns),
    // rows around its 128-row tile and a zero-row expert
    add_grouped("wide tails", 5, 200, 264, wide, 0);
    // the data-grad's 256-column tile (N = C = 328: a second column tile with
    // 72 columns) with K = OC = 136 (2 x 64 + 8): the TMA kernel reads zeros
    // past dout's columns and the last expert's weights
    add_grouped("wide tails, data-grad", 3, 328, 136, wide2, 0);
    // OLMoE: 64 experts, 2048 -> 1024, 4096 tokens x top-8, uneven with empty
    // experts (first, middle, last); then all rows in one expert
    int zero[] = {0, 17, 40, 63};
    uneven_counts(olmoe_counts, 64, 32768, zero, 4);
    add_grouped("olmoe uneven", 64, 2048, 1024, olmoe_counts, 1);
    add_grouped("E=8 all rows in expert 7", 8, 2048, 1024, last8, 1);
    add_grouped("E=8 all rows in expert 0", 8, 2048, 1024, first8, 0);

    section = "attention";
    // attention: T not a multiple of the tiles, GQA, every compiled head dim
    add_attention(2, 37, 4, 2, 16, RERUN, 0, DOCS_NONE);
    add_attention(1, 128, 4, 4, 32, RERUN, 0, DOCS_NONE);
    add_attention(2, 200, 8, 2, 64, RERUN, 0, DOCS_NONE);
    add_attention(1, 512, 4, 1, 128, RERUN, 0, DOCS_NONE);
    add_attention(3, 1, 2, 1, 32, RERUN, 0, DOCS_NONE);   // a single position: out = v
    add_attention(1, 97, 6, 3, 128, RERUN, 0, DOCS_NONE); // GQA groups of 2, a tail in every tile size
    // H == KV at head dim 128: dQ through dS^T, tails of 64 and 128
    add_attention(2, 200, 4, 4, 128, RERUN, 0, DOCS_NONE);
    add_attention(1, 333, 2, 2, 128, RERUN, 0, DOCS_NONE);
    add_attention(3, 200, 4, 4, 128, RERUN, 1, DOCS_NONE); // dS^T of 2 batch rows of T=200, H=4 fit: slices of 2, 1
    add_attention(1, 129, 2, 2, 128, 0, 0, DOCS_NONE);
    // shapes the TMA + wgmma forward takes (T a multiple of 128): one tile,
    // GQA groups of 3 and of 4, several batch rows; T = 512 GQA above too
    add_attention(1, 128, 2, 1, 128, RERUN, 0, DOCS_NONE);
    add_attention(2, 384, 6, 2, 128, RERUN, 0, DOCS_NONE);
    add_attention(3, 256, 4, 4, 128, RERUN, 0, DOCS_NONE);
    add_attention(3, 256, 4, 4, 128, RERUN, 1, DOCS_NONE); // the wgmma backward's dS^T in slices of 2, 1
    add_attention(1, 1024, 8, 2, 128, RERUN, 0, DOCS_NONE);
    // the wgmma backward (H == KV) over many query tiles per key block (its
    // dK/dV ring wraps, both dS^T buffers of a warpgroup turn over), B = 2
    add_attention(1, 1024, 2, 2, 128, RERUN, 0, DOCS_NONE);
    add_attention(2, 640, 3, 3, 128, RERUN, 0, DOCS_NONE);
    // the block order in groups of (batch, head) pairs: of 1, and of 5 of
    // 12 and 4 of 6 (a short last group), GQA, the same bits as the default
    add_attention_ordered(3, 256, 4, 4, 128, RERUN, DOCS_NONE, 1);
    add_attention_ordered(3, 256, 4, 4, 128, 0, DOCS_NONE, 5);
    add_attention_ordered(2, 384, 3, 3, 128, 0, DOCS_NONE, 4);
    add_attention_ordered(2, 384, 6, 2, 128, 0, DOCS_NONE, 5);
    // OLMoE's attention (special check attention_heads validates two heads);
    // rerun: the same bits at full size
    add_attention(1, 4096, 16, 16, 128, NOCPU | PERF | RERUN, 0, DOCS_NONE);
    add_attention(1, 4096, 8, 8, 128, NOCPU | PERF, 0, DOCS_NONE);
    add_attention(2, 4096, 16, 16, 128, NOCPU | PERF | RERUN, 0, DOCS_NONE);
    // the sweep's (16 x 4096, 8 heads: 128 pairs, whose K and V are 256 MiB)
    // in the default order (auto: groups of 8), in groups of 4 and in the
    // (head, batch, tile) one
    add_attention_ordered(16, 4096, 8, 8, 128, NOCPU | PERF, DOCS_NONE, 4);
    // OLMoE's micro-batch (32 pairs: auto is 4 groups of 8) in groups of 4
    add_attention_ordered(2, 4096, 16, 16, 128, NOCPU | PERF, DOCS_NONE, 4);
    // intra-document masking: every kernel (both sets, dS^T and its slices,
    // variant 2's query-block kernels at 17 x 8 blocks of 128 > 2 per SM),
    // boundaries inside and on tiles, documents of length 1, a row without EOS
    add_attention(2, 37, 4, 2, 16, RERUN, 0, DOCS_SHORT);
    add_attention(1, 128, 4, 4, 32, RERUN, 0, DOCS_ONE);
    add_attention(2, 200, 8, 2, 64, RERUN, 0, DOCS_MANY);
    add_attention(1, 512, 4, 1, 128, RERUN, 0, DOCS_TILE);
    add_attention(1, 97, 6, 3, 128, RERUN, 0, DOCS_TILE);
    add_attention(2, 200, 4, 4, 128, RERUN, 0, DOCS_MANY);
    add_attention(1, 333, 2, 2, 128, RERUN, 0, DOCS_TILE);
    add_attention(3, 200, 4, 4, 128, RERUN, 1, DOCS_MANY); // slices of 2, 1 batch rows
    add_attention(17, 256, 8, 8, 128, RERUN, 0, DOCS_TILE);
    add_attention(17, 256, 8, 8, 128, 0, 0, DOCS_SHORT);
    // OLMoE's attention without EOS (the causal speed) and with ~16 documents per sequence
    add_attention(1, 4096, 16, 16, 128, NOCPU | PERF, 0, DOCS_ONE);
    add_attention(1, 4096, 16, 16, 128, NOCPU | PERF, 0, DOCS_LONG);
    add_attention(1, 4096, 8, 8, 128, NOCPU | PERF, 0, DOCS_ONE);
    add_attention(2, 4096, 16, 16, 128, NOCPU | PERF, 0, DOCS_ONE);
    // head dims 64, 32, 16 (the first kernel set at every size) with and without documents
    add_attention(1, 4096, 16, 16, 64, NOCPU | PERF, 0, DOCS_NONE);
    add_attention(1, 4096, 16, 16, 64, NOCPU | PERF, 0, DOCS_ONE);
    add_attention(1, 4096, 16, 16, 32, NOCPU | PERF, 0, DOCS_NONE);
    add_attention(1, 4096, 16, 16, 32, NOCPU | PERF, 0, DOCS_ONE);
    add_attention(1, 4096, 16, 16, 16, NOCPU | PERF, 0, DOCS_NONE);
    add_attention(1, 4096, 16, 16, 16, NOCPU | PERF, 0, DOCS_ONE);
}

// ==== special checks ============================================================================
// Checks that are not one op call, through ops_cuda all the same.

static const Ops *const gpu = &ops_cuda;

static void *dev_keep[64];
static int ndev_keep;
static void *dkeep(void *d) {
    if (ndev_keep == 64) { fprintf(stderr, "special check: too many device buffers\n"); exit(2); }
    return dev_keep[ndev_keep++] = d;
}
static void dev_release(void) {
    while (ndev_keep) gpu->free(dev_keep[--ndev_keep]);
}
static void *dev_poison(size_t bytes) {
    void *d = dkeep(gpu->alloc(bytes));
    gt_poison(d, bytes);
    return d;
}
// random act on the device: offset + scale * uniform (or normal)
static void *dev_act(size_t n, int dist, float offset, float scale) {
    float *h = gt_malloc(n * 4);
    gt_fill(h, n, dist, offset, scale, 1, fill_seed++);
    void *d = dkeep(gt_dev_bf16(h, n));
    free(h);
    return d;
}
static void *dev_copy(const void *h, size_t bytes) { return dkeep(gt_dev_bytes(h, bytes)); }

// ---- capture: the ops with scratch buffers or several launches, run once
// directly and once as a replayed CUDA graph from the same starting values:
// the capture fails on any host synchronisation or allocation, and the
// replay must match bit for bit.

typedef struct {
    int N, E, k, C, V, R;
    int *idx, *off, *row_of, *tor, *tok, *tgt;
    void *x, *xp, *dxp, *dx, *gout, *gin, *w, *logits, *ygrad;
    float *dwte, *dw, *rstd, *probs, *counts, *lb, *losses;
    double *acc;
    size_t dwte_bytes;
} CapCase;

static void cap_reset(CapCase *c) { // accumulators to zero (outside the graph)
    gpu->zero(c->dwte, c->dwte_bytes);
    gpu->zero(c->dw, c->C * 4);
    gpu->zero(c->acc, 2 * sizeof(double));
    cuda_synchronize();
}
static void cap_run(CapCase *c) {
    gpu->moe_route_index(c->off, c->row_of, c->tor, c->idx, c->N, c->E, c->k);
    gpu->permute_forward(c->xp, c->x, c->tor, c->R, c->C);
    gpu->permute_backward(c->dx, c->dxp, c->tor, c->N, c->R, c->C, 0);
    gpu->embedding_backward(c->dwte, c->gout, c->tok, c->N, c->C);
    gpu->rmsnorm_backward(c->gin, c->dw, c->gout, c->x, c->w, c->rstd, c->N, c->C, 0);
    gpu->lb_loss_forward(c->lb, c->probs, c->counts, (float)c->N, c->N, c->E, c->k, GATING_SOFTMAX);
    gpu->zloss_forward(c->lb + 1, c->probs, c->N, c->E);
    gpu->crossentropy_forward(c->losses, c->logits, c->tgt, c->N, c->V);
    gpu->crossentropy_backward(c->ygrad, c->logits, c->tgt, 0.5f, c->N, c->V);
    gpu->loss_sum(c->acc, c->losses, c->tgt, c->N);
    gpu->sum_squares(c->acc + 1, c->dw, c->C);
}
#define CAP_OUTS 12
static void cap_outputs(CapCase *c, void *h[CAP_OUTS], size_t bytes[CAP_OUTS], const char *names[CAP_OUTS]) {
    size_t R = c->R, N = c->N, C = c->C;
    void *d[CAP_OUTS] = {c->off, c->row_of, c->tor, c->xp, c->dx, c->dwte, c->gin, c->dw, c->lb, c->losses, c->ygrad, c->acc};
    size_t b[CAP_OUTS] = {(c->E + 1) * 4, R * 4, R * 4, R * C * 2, N * C * 2, c->dwte_bytes, N * C * 2, C * 4, 2 * 4, N * 4,
                          N * (size_t)c->V * 2, 2 * 8};
    const char *nm[CAP_OUTS] = {"offsets", "row_of", "token_of_row", "permute fwd", "permute bwd", "embedding bwd",
                                "rmsnorm bwd dinp", "rmsnorm bwd dw", "lb, z loss", "ce losses", "ce dlogits",
                                "loss_sum, sum_squares"};
    for (int i = 0; i < CAP_OUTS; i++) { h[i] = gt_host_bytes(d[i], b[i]); bytes[i] = b[i]; names[i] = nm[i]; }
}

static void special_capture(void) {
    CapCase c = {.N = 2048, .E = 64, .k = 8, .C = 1024, .V = 4099};
    c.R = c.N * c.k;
    size_t nc = (size_t)c.N * c.C, rc = (size_t)c.R * c.C, nv = (size_t)c.N * c.V;
    int Vtok = 5000;
    int *hi = gt_malloc((size_t)c.R * 4);
    make_idx(hi, c.N, c.E, c.k, 1);
    c.idx = dev_copy(hi, (size_t)c.R * 4);
    make_tokens(hi, c.N, Vtok, 30);
    c.tok = dev_copy(hi, (size_t)c.N * 4);
    make_targets(hi, c.N, c.V);
    c.tgt = dev_copy(hi, (size_t)c.N * 4);
    free(hi);
    c.off = dev_poison((c.E + 1) * 4);
    c.row_of = dev_poison((size_t)c.R * 4);
    c.tor = dev_poison((size_t)c.R * 4);
    c.x = dev_act(nc, GT_UNIFORM, 0, 1);
    c.xp = dev_poison(rc * 2);
    c.dxp = dev_act(rc, GT_UNIFORM, 0, 1);
    c.dx = dev_poison(nc * 2);
    c.gout = dev_act(nc, GT_UNIFORM, 0, 1);
    c.gin = dev_poison(nc * 2);
    c.w = dev_act(c.C, GT_UNIFORM, 1, 0.3f);
    c.logits = dev_act(nv, GT_UNIFORM, 0, 4);
    c.ygrad = dev_poison(nv * 2);
    c.dwte_bytes = (size_t)Vtok * c.C * 4;
    c.dwte = dkeep(gpu->alloc(c.dwte_bytes));
    c.dw = dkeep(gpu->alloc(c.C * 4));
    float *hf = gt_malloc((size_t)c.N * c.E * 4);
    for (int n = 0; n < c.N; n++) hf[n] = 0.5f + 0.5f * fabsf(gt_urand());
    c.rstd = dev_copy(hf, (size_t)c.N * 4);
    cpu_probs(hf, c.N, c.E, GATING_SOFTMAX, 2);
    c.probs = dev_copy(hf, (size_t)c.N * c.E * 4);
    for (int e = 0; e < c.E; e++) hf[e] = (float)(c.N * c.k / c.E + e % 5);
    c.counts = dev_copy(hf, c.E * 4);
    free(hf);
    c.lb = dev_poison(2 * 4);
    c.losses = dev_poison((size_t)c.N * 4);
    c.acc = dkeep(gpu->alloc(2 * sizeof(double)));

    void *direct[CAP_OUTS], *replay[CAP_OUTS];
    size_t bytes[CAP_OUTS];
    const char *names[CAP_OUTS];
    cap_reset(&c);
    cap_run(&c); // sizes every scratch buffer
    cap_outputs(&c, direct, bytes, names);

    char err[256] = "";
    gpu->capture_begin();
    cap_run(&c);
    void *exec = gpu->capture_end(err, sizeof err);
    if (gt_ok(exec != NULL, "%-48s %s", "capture of the ops above", exec ? "" : err)) {
        cap_reset(&c);
        gpu->graph_launch(exec);
        cuda_synchronize();
        cap_outputs(&c, replay, bytes, names);
        char nm[96];
        for (int i = 0; i < CAP_OUTS; i++) {
            snprintf(nm, sizeof nm, "replay = direct: %s", names[i]);
            gt_check_bits(nm, replay[i], direct[i], bytes[i] / 4, 4);
            free(replay[i]);
        }
        gpu->graph_free(exec);
    }
    for (int i = 0; i < CAP_OUTS; i++) free(direct[i]);
    dev_release();
}

// ---- attention_causality: changing k/v at position s leaves out, saved and
// dq at t < s bit-identical (and does change saved at t = s)

// elements of rows t < s ([B,T,NH,w], elem bytes each) whose bits differ
static int same_before(const char *what, const void *a, const void *b, size_t elem, int B, int T, int NH, int w,
                       int s) {
    size_t bad = 0, total = 0, first = (size_t)-1, row = (size_t)NH * w * elem;
    for (int bb = 0; bb < B; bb++)
        for (int t = 0; t < s; t++) {
            const char *pa = (const char *)a + ((size_t)bb * T + t) * row, *pb = (const char *)b + ((size_t)bb * T + t) * row;
            for (size_t j = 0; j < (size_t)NH * w; j++, total++)
                if (memcmp(pa + j * elem, pb + j * elem, elem)) {
                    if (first == (size_t)-1) first = ((size_t)bb * T + t) * NH * w + j;
                    bad++;
                }
        }
    printf("%s %-48s %zu of %zu differ\n", bad ? "FAIL" : "ok  ", what, bad, total);
    if (bad)
        printf("      first at (b=%d, t=%d, %d)\n", (int)(first / ((size_t)T * NH * w)), (int)(first / ((size_t)NH * w) % T),
               (int)(first % ((size_t)NH * w)));
    return gt_count(!bad);
}

static void causality(int B, int T, int H, int KV, int hd) {
    char sh[96], nm[192];
    snprintf(sh, sizeof sh, "B=%d T=%d H=%d KV=%d hd=%d", B, T, H, KV, hd);
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd;
    size_t ns = gpu->attention_saved_floats(B, T, H, hd), nscr = gpu->attention_scratch_floats(B, T, H, KV, hd);
    float *k = gt_malloc(nk * 4), *v = gt_malloc(nk * 4);
    gt_fill(k, nk, GT_NORMAL, 0, 1, 1, fill_seed++);
    gt_fill(v, nk, GT_NORMAL, 0, 1, 1, fill_seed++);
    void *qd = dev_act(nq, GT_NORMAL, 0, 1), *dod = dev_act(nq, GT_NORMAL, 0, 1);
    float *scr = dev_poison(nscr * 4);
    void *out[2], *dq[2];
    float *lse[2];
    int s = (2 * T) / 3;
    for (int run = 0; run < 2; run++) {
        if (run == 1) // new k, v at position s (every batch row and kv head)
            for (int b = 0; b < B; b++)
                for (int j = 0; j < KV * hd; j++) {
                    size_t at = ((size_t)b * T + s) * KV * hd + j;
                    k[at] = bf2f(f2bf(3 * gt_randn()));
                    v[at] = bf2f(f2bf(3 * gt_randn()));
                }
        void *kd = dkeep(gt_dev_bf16(k, nk)), *vd = dkeep(gt_dev_bf16(v, nk));
        void *outd = dev_poison(nq * 2), *dqd = dev_poison(nq * 2), *dkd = dev_poison(nk * 2), *dvd = dev_poison(nk * 2);
        float *saved = dev_poison(ns * 4);
        gpu->attention_forward(outd, saved, qd, kd, vd, NULL, B, T, H, KV, hd);
        gpu->attention_backward(dqd, dkd, dvd, dod, saved, qd, kd, vd, outd, NULL, scr, B, T, H, KV, hd);
        out[run] = gt_host_bytes(outd, nq * 2);
        dq[run] = gt_host_bytes(dqd, nq * 2);
        lse[run] = gt_host_f32(saved, ns);
    }
    snprintf(nm, sizeof nm, "attention %s: out at t < %d after k/v[%d] change", sh, s, s);
    same_before(nm, out[0], out[1], 2, B, T, H, hd, s);
    snprintf(nm, sizeof nm, "attention %s: dq at t < %d after k/v[%d] change", sh, s, s);
    same_before(nm, dq[0], dq[1], 2, B, T, H, hd, s);
    // lse2 is [B,H,T]: compare t < s for every (b, h)
    size_t bad = 0, total = 0, changed_at_s = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *a = lse[0] + ((size_t)b * H + h) * T, *c = lse[1] + ((size_t)b * H + h) * T;
            for (int t = 0; t < s; t++, total++) bad += memcmp(a + t, c + t, 4) != 0;
            changed_at_s += memcmp(a + s, c + s, 4) != 0;
        }
    snprintf(nm, sizeof nm, "attention %s: lse2 at t < %d after k/v[%d] change", sh, s, s);
    gt_ok(!bad, "%-48s %zu of %zu differ", nm, bad, total);
    // the change must be visible at t = s, or the check above proves nothing
    snprintf(nm, sizeof nm, "attention %s: lse2 at t = %d does change", sh, s);
    gt_ok(changed_at_s > 0, "%-48s %zu of %d (b, h) changed", nm, changed_at_s, B * H);
    for (int run = 0; run < 2; run++) { free(out[run]); free(dq[run]); free(lse[run]); }
    free(k); free(v);
    dev_release();
}
static void special_causality(void) {
    static const int shapes[][5] = {{2, 37, 4, 2, 16},  {1, 128, 4, 4, 32},  {2, 200, 8, 2, 64},
                                    {1, 512, 4, 1, 128}, {3, 1, 2, 1, 32},    {1, 97, 6, 3, 128},
                                    {2, 200, 4, 4, 128}, {1, 333, 2, 2, 128}, {3, 200, 4, 4, 128}};
    for (int i = 0; i < 9; i++) causality(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4]);
}

// ---- attention_heads: OLMoE's attention (B=1 T=4096 H=KV=16 hd=128, the
// NOCPU cases) against the CPU on two whole heads, each as a one-head
// problem, and every element of every head written and finite; without
// documents and with about 16 (docs=long)

// head h of x [T, NH, hd] (B = 1) as [T, 1, hd]
static float *head_slice(const float *x, int T, int NH, int hd, int h) {
    float *r = gt_malloc((size_t)T * hd * 4);
    for (int t = 0; t < T; t++) memcpy(r + (size_t)t * hd, x + ((size_t)t * NH + h) * hd, hd * 4);
    return r;
}
static void heads(int docs) {
    const int B = 1, T = 4096, H = 16, KV = 16, hd = 128;
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd;
    float *x[4]; // q, k, v, dout
    void *xd[4];
    for (int i = 0; i < 4; i++) {
        x[i] = gt_malloc(nq * 4);
        gt_fill(x[i], nq, GT_NORMAL, 0, 1, 1, fill_seed++);
        xd[i] = dkeep(gt_dev_bf16(x[i], nq));
    }
    int *ds = NULL, *dsd = NULL;
    char dn[32] = "";
    if (docs) {
        ds = gt_malloc((size_t)T * 4);
        make_doc_starts(ds, 1, T, docs);
        dsd = dev_copy(ds, (size_t)T * 4);
        snprintf(dn, sizeof dn, " docs=%s", docs_name[docs]);
    }
    size_t ns = gpu->attention_saved_floats(B, T, H, hd), nscr = gpu->attention_scratch_floats(B, T, H, KV, hd);
    void *outd = dev_poison(nq * 2), *dqd = dev_poison(nq * 2), *dkd = dev_poison(nk * 2), *dvd = dev_poison(nk * 2);
    float *saved = dev_poison(ns * 4), *scr = dev_poison(nscr * 4);
    gpu->attention_forward(outd, saved, xd[0], xd[1], xd[2], dsd, B, T, H, KV, hd);
    gpu->attention_backward(dqd, dkd, dvd, xd[3], saved, xd[0], xd[1], xd[2], outd, dsd, scr, B, T, H, KV, hd);
    float *got[4] = {gt_host_bf16(outd, nq), gt_host_bf16(dqd, nq), gt_host_bf16(dkd, nk), gt_host_bf16(dvd, nk)};
    static const char *names[4] = {"out", "dq", "dk", "dv"};
    int hs[2] = {0, H - 1}, dims[] = {1, T, 1, hd};
    float *att = gt_malloc(ops_cpu.attention_saved_floats(1, T, 1, hd) * 4);
    float *cscr = gt_malloc(ops_cpu.attention_scratch_floats(1, T, 1, 1, hd) * 4);
    for (int i = 0; i < 2; i++) {
        int h = hs[i];
        float *xh[4], *ref[4];
        for (int j = 0; j < 4; j++) {
            xh[j] = head_slice(x[j], T, H, hd, h);
            ref[j] = gt_malloc((size_t)T * hd * 4);
        }
        ops_cpu.attention_forward(ref[0], att, xh[0], xh[1], xh[2], ds, 1, T, 1, 1, hd);
        ops_cpu.attention_backward(ref[1], ref[2], ref[3], xh[3], att, xh[0], xh[1], xh[2], ref[0], ds, cscr, 1, T, 1,
                                   1, hd);
        for (int j = 0; j < 4; j++) {
            char nm[96];
            float *g = head_slice(got[j], T, H, hd, h);
            snprintf(nm, sizeof nm, "attention B=1 T=4096 H=16 hd=128%s head %d: %s", dn, h, names[j]);
            gt_check_diag(nm, g, ref[j], (size_t)T * hd, B_ATTN.tol, dims, NULL, 0);
            free(g); free(xh[j]); free(ref[j]);
        }
    }
    size_t bad = 0;
    for (size_t i = 0; i < nq; i++) bad += !isfinite(got[0][i]) + !isfinite(got[1][i]);
    for (size_t i = 0; i < nk; i++) bad += !isfinite(got[2][i]) + !isfinite(got[3][i]);
    char nm[96];
    snprintf(nm, sizeof nm, "attention T=4096%s: all heads finite", dn);
    gt_ok(!bad, "%-48s %zu of %zu not finite", nm, bad, 2 * nq + 2 * nk);
    for (int i = 0; i < 4; i++) { free(x[i]); free(got[i]); }
    free(att); free(cscr); free(ds);
    dev_release();
}
static void special_heads(void) {
    heads(DOCS_NONE);
    heads(DOCS_LONG);
}

// ---- attention_docs: intra-document masking on the GPU alone, for shapes
// that run every kernel: (1) every doc_start 0 gives the bits of doc_start
// NULL (out, lse2, dq, dk, dv); (2) new k/v at every position of one
// document per batch row (the one holding t = 2T/3) leave out, dq, dk, dv
// and lse2 of every other position bit-identical, and change lse2 in it.

// elements of rows t outside [lo[b], hi[b]) ([B,T,NH,w], elem bytes each) whose bits differ
static size_t rows_differ(const void *a, const void *c, size_t elem, int B, int T, int NH, int w, const int *lo,
                          const int *hi, size_t *total) {
    size_t bad = 0, row = (size_t)NH * w * elem;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            if (t >= lo[b] && t < hi[b]) continue;
            size_t off = ((size_t)b * T + t) * row;
            bad += memcmp((const char *)a + off, (const char *)c + off, row) != 0;
            (*total)++;
        }
    return bad;
}
static void docs_check(int B, int T, int H, int KV, int hd, int kind, int ds_mib) {
    // doc_start NULL on the mma.sync kernels: the DOC kernels' causal twins,
    // whose bits they must give with every doc_start 0 (the TMA + wgmma
    // kernels, which documents fall back from, sum in another order)
    CudaSettings cs = cuda_settings_default();
    cs.attention_fwd = cs.attention_bwd = CUDA_KERNELS_MMA_SYNC;
    if (ds_mib >= 0) cs.attention_ds_mib = ds_mib;
    cuda_configure(&cs); // before sizing the scratch
    char sh[128], nm[256];
    snprintf(sh, sizeof sh, "B=%d T=%d H=%d KV=%d hd=%d docs=%s%s", B, T, H, KV, hd, docs_name[kind],
             ds_mib == 0 ? " (dQ kernel)" : ds_mib > 0 ? " (dS^T slices)" : "");
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, nt = (size_t)B * T;
    size_t ns = gpu->attention_saved_floats(B, T, H, hd), nscr = gpu->attention_scratch_floats(B, T, H, KV, hd);
    int *ds = gt_malloc(nt * 4), *zeros = calloc(nt, 4), lo[64], hi[64];
    make_doc_starts(ds, B, T, kind);
    for (int b = 0; b < B; b++) { // the document holding t = 2T/3
        const int *d = ds + (size_t)b * T;
        lo[b] = d[2 * T / 3];
        for (hi[b] = 2 * T / 3 + 1; hi[b] < T && d[hi[b]] == lo[b]; hi[b]++) {}
    }
    float *k = gt_malloc(nk * 4), *v = gt_malloc(nk * 4);
    gt_fill(k, nk, GT_NORMAL, 0, 1, 1, fill_seed++);
    gt_fill(v, nk, GT_NORMAL, 0, 1, 1, fill_seed++);
    void *qd = dev_act(nq, GT_NORMAL, 0, 1), *dod = dev_act(nq, GT_NORMAL, 0, 1);
    void *dsd = dev_copy(ds, nt * 4), *zd = dev_copy(zeros, nt * 4);
    float *scr = dev_poison(nscr * 4);
    void *got[3][5]; // runs: doc_start NULL, zeros, ds; then ds with new k/v. out, lse2, dq, dk, dv
    void *changed[5];
    size_t bytes[5] = {nq * 2, ns * 4, nq * 2, nk * 2, nk * 2};
    for (int run = 0; run < 4; run++) {
        if (run == 3)
            for (int b = 0; b < B; b++)
                for (int t = lo[b]; t < hi[b]; t++)
                    for (int j = 0; j < KV * hd; j++) {
                        size_t at = ((size_t)b * T + t) * KV * hd + j;
                        k[at] = bf2f(f2bf(3 * gt_randn()));
                        v[at] = bf2f(f2bf(3 * gt_randn()));
                    }
        void *kd = dkeep(gt_dev_bf16(k, nk)), *vd = dkeep(gt_dev_bf16(v, nk));
        void *o[5] = {dev_poison(bytes[0]), dev_poison(bytes[1]), dev_poison(bytes[2]), dev_poison(bytes[3]),
                      dev_poison(bytes[4])};
        const int *d = run == 0 ? NULL : run == 1 ? zd : dsd;
        gpu->attention_forward(o[0], o[1], qd, kd, vd, d, B, T, H, KV, hd);
        gpu->attention_backward(o[2], o[3], o[4], dod, o[1], qd, kd, vd, o[0], d, scr, B, T, H, KV, hd);
        for (int i = 0; i < 5; i++) {
            void *h = gt_host_bytes(o[i], bytes[i]);
            if (run < 3) got[run][i] = h;
            else changed[i] = h;
        }
    }
    static const char *names[5] = {"out", "lse2", "dq", "dk", "dv"};
    for (int i = 0; i < 5; i++) {
        snprintf(nm, sizeof nm, "attention %s: doc_start 0 = NULL, %s", sh, names[i]);
        gt_check_bits(nm, got[1][i], got[0][i], bytes[i] / 2, 2);
    }
    size_t bad = 0, total = 0;
    bad += rows_differ(got[2][0], changed[0], 2, B, T, H, hd, lo, hi, &total);
    bad += rows_differ(got[2][2], changed[2], 2, B, T, H, hd, lo, hi, &total);
    bad += rows_differ(got[2][3], changed[3], 2, B, T, KV, hd, lo, hi, &total);
    bad += rows_differ(got[2][4], changed[4], 2, B, T, KV, hd, lo, hi, &total);
    size_t changed_in = 0, bh = 0; // lse2 is [B,H,T]
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++, bh++) {
            const float *a = (const float *)got[2][1] + bh * T, *c = (const float *)changed[1] + bh * T;
            for (int t = 0; t < T; t++) {
                int in = t >= lo[b] && t < hi[b];
                if (in) changed_in += memcmp(a + t, c + t, 4) != 0;
                else bad += memcmp(a + t, c + t, 4) != 0, total++;
            }
        }
    snprintf(nm, sizeof nm, "attention %s: other documents unchanged", sh);
    gt_ok(!bad, "%-48s %zu of %zu rows differ", nm, bad, total);
    snprintf(nm, sizeof nm, "attention %s: the changed document's lse2 changes", sh);
    gt_ok(changed_in > 0, "%-48s %zu changed", nm, changed_in);
    for (int i = 0; i < 5; i++) { free(got[0][i]); free(got[1][i]); free(got[2][i]); free(changed[i]); }
    free(ds); free(zeros); free(k); free(v);
    dev_release();
    CudaSettings d = cuda_settings_default();
    cuda_configure(&d);
}
static void special_docs(void) {
    // B, T, H, KV, hd, documents, attention_ds_mib (-1: the default)
    static const int shapes[][7] = {
        {2, 37, 4, 2, 16, DOCS_SHORT, -1},  {1, 128, 4, 4, 32, DOCS_TILE, -1},   {2, 200, 8, 2, 64, DOCS_MANY, -1},
        {1, 97, 6, 3, 128, DOCS_TILE, -1},  {1, 333, 2, 2, 128, DOCS_TILE, -1},  {1, 333, 2, 2, 128, DOCS_TILE, 0},
        {3, 200, 4, 4, 128, DOCS_MANY, 1},  {17, 256, 8, 8, 128, DOCS_MANY, -1}, {17, 256, 8, 8, 128, DOCS_TILE, 0},
        {1, 4096, 16, 16, 128, DOCS_LONG, -1}, {2, 4096, 8, 2, 128, DOCS_MANY, -1}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        docs_check(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4], shapes[i][5], shapes[i][6]);
}

// ---- crossentropy_paths: the shared-memory cross-entropy kernels (the row
// copied in by one bulk copy: src/ops/cuda/loss.cu) against the streaming
// ones (cuda_crossentropy_set_streaming), bit for bit: losses, dlogits out of place and
// in place (as the model calls it), masked rows included; and the widest
// row the shared-memory path takes next to the first one it leaves to the
// streaming kernels. On each path the fused kernel (crossentropy_fused, in
// place) must give the forward's losses and the in-place backward's dlogits
// bit for bit.

static void ce_paths_case(int N, int V) {
    size_t nv = (size_t)N * V;
    int *t = gt_malloc(N * 4);
    make_targets(t, N, V);
    void *tgt = dev_copy(t, N * 4), *logits = dev_act(nv, G_UNIFORM, 0, 4);
    void *h[2][5];
    for (int path = 0; path < 2; path++) { // 0: shared memory (the default), 1: streaming
        cuda_crossentropy_set_streaming(path);
        void *loss = dev_poison(N * 4), *dl = dev_poison(nv * 2), *inpl = dkeep(gpu->alloc(nv * 2));
        void *floss = dev_poison(N * 4), *fused = dkeep(gpu->alloc(nv * 2));
        gpu->copy_act(inpl, logits, nv);
        gpu->copy_act(fused, logits, nv);
        gpu->crossentropy_forward(loss, logits, tgt, N, V);
        gpu->crossentropy_backward(dl, logits, tgt, 0.37f, N, V);
        gpu->crossentropy_backward(inpl, inpl, tgt, 0.37f, N, V);
        gpu->crossentropy_fused(floss, fused, fused, tgt, 0.37f, N, V);
        cuda_synchronize();
        h[path][0] = gt_host_bytes(loss, N * 4);
        h[path][1] = gt_host_bytes(dl, nv * 2);
        h[path][2] = gt_host_bytes(inpl, nv * 2);
        h[path][3] = gt_host_bytes(floss, N * 4);
        h[path][4] = gt_host_bytes(fused, nv * 2);
    }
    cuda_crossentropy_set_streaming(0);
    const char *nm[3] = {"losses", "dlogits", "dlogits in place"};
    size_t bytes[3] = {(size_t)N * 4, nv * 2, nv * 2};
    for (int i = 0; i < 3; i++) {
        int same = !memcmp(h[0][i], h[1][i], bytes[i]);
        gt_ok(same, "%-48s N=%d V=%d: %s %s", "crossentropy shared memory = streaming", N, V, nm[i],
              same ? "bit-identical" : "DIFFER");
    }
    for (int path = 0; path < 2; path++)
        for (int i = 0; i < 2; i++) { // fused losses = forward's, fused dlogits = in-place backward's
            int same = !memcmp(h[path][3 + i], h[path][2 * i], bytes[2 * i]);
            gt_ok(same, "%-48s N=%d V=%d: %s %s", path ? "crossentropy fused = separate (streaming)"
                                                       : "crossentropy fused = separate (shared memory)",
                  N, V, i ? "dlogits" : "losses", same ? "bit-identical" : "DIFFER");
        }
    for (int path = 0; path < 2; path++)
        for (int i = 0; i < 5; i++) free(h[path][i]);
    free(t);
    dev_release();
}
static void special_ce_paths(void) {
    int limit = 0, dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    int vmax = (limit - 1024) / 2 / 8 * 8; // the widest row loss.cu copies into shared memory
    ce_paths_case(300, 50304);
    ce_paths_case(9, 8);
    ce_paths_case(17, 4104);
    ce_paths_case(5, vmax);
    ce_paths_case(5, vmax + 8);
}

// ---- grouped_wgrad_tail: the weight-grad's K is the expert's rows, so a
// tile's last, partial K step loads rows past the segment; past the last
// expert those rows are whatever the allocation holds after the routed rows
// (in the model's arena: the next activation, FP32 statistics among them).
// Here they are NaN in both operands, and dw must equal, bit for bit, the
// dw of the same rows in buffers that end with them (where the copy engine
// reads zeros past the end), dw = and dw += alike.

static void wgrad_tail_case(int E, int C, int OC, const int *counts) {
    int *off = gt_malloc((E + 1) * sizeof(int));
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + counts[e];
    int R = off[E], extra = 192;
    size_t na = (size_t)R * OC, nb = (size_t)R * C, nw = (size_t)E * OC * C;
    float *ha = gt_malloc(na * 4), *hb = gt_malloc(nb * 4);
    gt_fill(ha, na, G_NORMAL, 0, 1, 1, fill_seed++);
    gt_fill(hb, nb, G_NORMAL, 0, 1, 1, fill_seed++);
    void *doff = dev_copy(off, (E + 1) * sizeof(int));
    void *a_exact = dkeep(gt_dev_bf16(ha, na)), *b_exact = dkeep(gt_dev_bf16(hb, nb));
    void *a_tail = dkeep(gpu->alloc((na + (size_t)extra * OC) * 2)), *b_tail = dkeep(gpu->alloc((nb + (size_t)extra * C) * 2));
    gt_poison(a_tail, (na + (size_t)extra * OC) * 2);
    gt_poison(b_tail, (nb + (size_t)extra * C) * 2);
    gt_upload_bf16(a_tail, ha, na);
    gt_upload_bf16(b_tail, hb, nb);
    for (int acc = 0; acc < 2; acc++) {
        float *first = NULL; // the default's dw (tail buffers), which every variant must give bit for bit
        for (int k = -1; k < n_grouped_variants; k++) {
            cuda_grouped_set_variant(k < 0 ? -1 : grouped_variants[k]);
            float *dw_exact = dkeep(gpu->alloc(nw * 4)), *dw_tail = dkeep(gpu->alloc(nw * 4));
            gpu->zero(dw_exact, nw * 4);
            gpu->zero(dw_tail, nw * 4);
            int r1 = cuda_grouped_wgrad_wgmma(dw_exact, a_exact, b_exact, doff, E, C, OC, acc, NULL, NULL);
            int r2 = cuda_grouped_wgrad_wgmma(dw_tail, a_tail, b_tail, doff, E, C, OC, acc, NULL, NULL);
            cuda_synchronize();
            cuda_grouped_set_variant(-1);
            float *h1 = gt_host_f32(dw_exact, nw), *h2 = gt_host_f32(dw_tail, nw);
            size_t bad = 0, nonfinite = 0, other = 0;
            for (size_t i = 0; i < nw; i++) {
                bad += memcmp(&h1[i], &h2[i], 4) != 0;
                nonfinite += !isfinite(h2[i]);
                other += first && memcmp(&first[i], &h2[i], 4) != 0;
            }
            gt_ok(r1 == 0 && r2 == 0 && !bad && !nonfinite && !other,
                  "%-48s E=%d C=%d OC=%d R=%d dw %s%s%s: %zu of %zu differ, %zu not finite, %zu differ from the "
                  "default (ran: %d %d)",
                  "grouped weight-grad, NaN rows after the last segment", E, C, OC, R, acc ? "+=" : "=",
                  k < 0 ? "" : ", ", k < 0 ? "" : grouped_variant_label[k], bad, nw, nonfinite, other, r1, r2);
            free(h1);
            if (first) free(h2);
            else first = h2;
        }
        free(first);
    }
    free(ha);
    free(hb);
    free(off);
    dev_release();
}
static void special_wgrad_tail(void) {
    static const int c4[] = {100, 0, 77, 61};    // the last expert's 61 rows: a partial K step of 64
    static const int c3[] = {130, 64, 1};        // one row in the last expert
    static const int c2[] = {0, 200};            // everything in the last
    wgrad_tail_case(4, 512, 256, c4); // N = C = 512 >= 256: the warp-specialised TMA kernel
    wgrad_tail_case(3, 256, 128, c3);
    wgrad_tail_case(2, 320, 136, c2); // column and row tiles with tails
    wgrad_tail_case(4, 128, 96, c4);  // N = 128: the cp.async kernel
}

// ---- wgrad_sumsq: grouped_wgrad_sumsq leaves grouped_matmul_backward's dw
// bit for bit and fills every slot (poisoned with NaN first) with the bits
// of ops_cpu_wgrad_slots on that dw: from the fused epilogues (the ping-pong
// kernel for +=, the cooperative one for =), the read-back of the experts
// without rows, and the kernels without the fused sum (cp.async, mma.sync,
// --grouped-variant's); = and += (onto random grads); and sum_f64 over the
// slots against the host's sum.

static void wgrad_sumsq_case(int E, int C, int OC, const int *counts) {
    int *off = gt_malloc((E + 1) * sizeof(int));
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + counts[e];
    int R = off[E];
    size_t na = (size_t)R * OC, nb = (size_t)R * C, nw = (size_t)E * OC * C, ns = ops_wgrad_slots(E, C, OC);
    void *a = dev_act(na, G_NORMAL, 0, 1), *b = dev_act(nb, G_NORMAL, 0, 1), *w = dev_act(nw, G_NORMAL, 0, 1);
    void *doff = dev_copy(off, (E + 1) * sizeof(int));
    float *hpre = gt_malloc(nw * 4);
    gt_fill(hpre, nw, G_NORMAL, 0, 0.5f, 1, fill_seed++);
    float *pre = dev_copy(hpre, nw * 4);
    static const char *const kname[] = {"default", "mma.sync", "wgmma cp.async"};
    for (int acc = 0; acc < 2; acc++)
        for (int k = 0; k < 3 + n_grouped_variants; k++) {
            CudaSettings st = cuda_settings_default();
            if (k == 1) st.grouped_gemm = CUDA_KERNELS_MMA_SYNC;
            if (k == 2) st.gemm_tma = 0;
            cuda_configure(&st);
            cuda_grouped_set_variant(k < 3 ? -1 : grouped_variants[k - 3]);
            float *dw_ref = dkeep(gpu->alloc(nw * 4)), *dw = dkeep(gpu->alloc(nw * 4));
            double *slots = dkeep(gpu->alloc(ns * 8)), *sum = dkeep(gpu->alloc(8));
            cuda_copy_f32(dw_ref, pre, nw);
            cuda_copy_f32(dw, pre, nw);
            gt_poison(slots, ns * 8);
            gpu->zero(sum, 8);
            gpu->grouped_matmul_backward(NULL, dw_ref, a, b, w, doff, E, C, OC, acc);
            gpu->grouped_wgrad_sumsq(dw, slots, a, b, doff, E, C, OC, acc);
            gpu->sum_f64(sum, slots, ns);
            cuda_synchronize();
            st = cuda_settings_default();
            cuda_configure(&st);
            cuda_grouped_set_variant(-1);
            float *h_ref = gt_host_f32(dw_ref, nw), *h = gt_host_f32(dw, nw);
            double *hs = gt_host_bytes(slots, ns * 8), *want = gt_malloc(ns * 8), hsum;
            cuda_to_host(&hsum, sum, 8);
            ops_cpu_wgrad_slots(h, want, E, C, OC);
            size_t dw_bad = 0, slot_bad = 0;
            for (size_t i = 0; i < nw; i++) dw_bad += memcmp(&h[i], &h_ref[i], 4) != 0;
            double total = 0, all = 0;
            for (size_t i = 0; i < ns; i++) {
                slot_bad += memcmp(&hs[i], &want[i], 8) != 0;
                total += want[i];
            }
            for (size_t i = 0; i < nw; i++) all += (double)h[i] * h[i];
            double rel = fabs(hsum - total) / (total > 0 ? total : 1), rel_all = fabs(total - all) / (all > 0 ? all : 1);
            // the slots' sum against a plain sum of every square: two FP64
            // orders over nw terms, within nw ulps (measured 1.1e-11 at 16.7M)
            gt_ok(!dw_bad && !slot_bad && rel < 1e-12 && rel_all < (double)nw * 0x1p-52,
                  "%-48s E=%d C=%d OC=%d R=%d dw %s, %s: dw %zu of %zu differ from grouped_matmul_backward's, slots "
                  "%zu of %zu differ from the CPU's order; sum_f64 rel %.1e, slots vs every square rel %.1e",
                  "grouped_wgrad_sumsq: dw and its sum of squares", E, C, OC, R, acc ? "+=" : "=",
                  k < 3 ? kname[k] : grouped_variant_label[k - 3], dw_bad, nw, slot_bad, ns, rel, rel_all);
            free(h_ref);
            free(h);
            free(hs);
            free(want);
        }
    free(hpre);
    free(off);
    dev_release();
}
static void special_wgrad_sumsq(void) {
    static const int c4[] = {100, 0, 77, 61};   // an expert without rows (its slots read back from dw)
    static const int c3[] = {130, 64, 1};
    static const int c2[] = {0, 200};
    static const int c8[] = {1100, 0, 961, 1024, 1094, 700, 0, 1300};
    wgrad_sumsq_case(4, 512, 256, c4);  // the warp-specialised TMA kernels (ping-pong for +=)
    wgrad_sumsq_case(3, 256, 128, c3);
    wgrad_sumsq_case(2, 320, 136, c2);  // column and row tails: slots past C and OC
    wgrad_sumsq_case(4, 128, 96, c4);   // N = 128: the cp.async kernel
    wgrad_sumsq_case(8, 2048, 1024, c8); // OLMoE's gate / up shape
    wgrad_sumsq_case(8, 1024, 2048, c8); // and its down
}

// ---- glu_forward: the gate and up products and SwiGLU in one pass
// (cuda_grouped_glu_wgmma, WS_GLU) give the bits of the two
// grouped_matmul_forward and swiglu_forward, on every row of the segments
// (outputs NaN-poisoned first): TMA epilogue halves and rows past a
// segment's last whole half through registers, column tails, experts
// without rows; and grouped_glu_forward through ops_cuda the same.

static void glu_case(int E, int C, int OC, const int *counts) {
    int *off = gt_malloc((E + 1) * sizeof(int));
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + counts[e];
    int R = off[E];
    size_t n = (size_t)R * OC;
    void *x = dev_act((size_t)R * C, G_NORMAL, 0, 1);
    void *wg = dev_act((size_t)E * OC * C, G_NORMAL, 0, 1 / sqrtf((float)C));
    void *wu = dev_act((size_t)E * OC * C, G_NORMAL, 0, 1 / sqrtf((float)C));
    void *doff = dev_copy(off, (E + 1) * sizeof(int));
    void *out[2][3];
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < 3; i++) out[p][i] = dev_poison(n * 2 + 16);
    gpu->grouped_matmul_forward(out[0][0], x, wg, doff, E, C, OC);
    gpu->grouped_matmul_forward(out[0][1], x, wu, doff, E, C, OC);
    gpu->swiglu_forward(out[0][2], out[0][0], out[0][1], n);
    int ran = cuda_grouped_glu_wgmma(out[1][0], out[1][1], out[1][2], x, wg, wu, doff, E, C, OC);
    cuda_synchronize();
    static const char *const name[3] = {"g", "u", "silu(g) u"};
    for (int i = 0; i < 3; i++) {
        uint16_t *h0 = gt_host_bytes(out[0][i], n * 2), *h1 = gt_host_bytes(out[1][i], n * 2);
        size_t bad = 0;
        for (size_t k = 0; k < n; k++) bad += h0[k] != h1[k];
        gt_ok(ran == 0 && !bad, "%-48s E=%d C=%d OC=%d R=%d %s: %zu of %zu differ from the separate ops (ran: %d)",
              "grouped GLU forward, fused", E, C, OC, R, name[i], bad, n, ran);
        free(h0);
        free(h1);
    }
    // through the op table (fused where it takes the call)
    for (int i = 0; i < 3; i++) gt_poison(out[1][i], n * 2 + 16);
    gpu->grouped_glu_forward(out[1][0], out[1][1], out[1][2], x, wg, wu, doff, E, C, OC, R);
    cuda_synchronize();
    size_t bad = 0;
    for (int i = 0; i < 3; i++) {
        uint16_t *h0 = gt_host_bytes(out[0][i], n * 2), *h1 = gt_host_bytes(out[1][i], n * 2);
        for (size_t k = 0; k < n; k++) bad += h0[k] != h1[k];
        free(h0);
        free(h1);
    }
    gt_ok(!bad, "%-48s E=%d C=%d OC=%d R=%d: %zu of %zu differ", "grouped_glu_forward = the three ops", E, C, OC, R,
          bad, 3 * n);
    free(off);
    dev_release();
}
static void special_glu(void) {
    setenv("MOECORE_GLU", "1", 1); // grouped_glu_forward's fused path (read at its first call)
    static const int c4[] = {100, 0, 77, 61};
    static const int c3[] = {130, 64, 1};
    static const int c2[] = {0, 200};
    static const int c8[] = {1100, 0, 961, 1024, 1094, 700, 0, 1300};
    glu_case(4, 512, 256, c4);
    glu_case(3, 256, 136, c3);  // a column tail: 136 = 128 + 8
    glu_case(2, 320, 128, c2);
    glu_case(8, 2048, 1024, c8); // OLMoE's gate and up
    glu_case(4, 1024, 2048, c4); // the sweep's (d 1024, expert hidden 2048)
}

// ---- adamw_fp8: adamw_update_fp8 (AdamW on an expert weight with its FP8
// copies made in the same pass, cuda_fp8_adamw_quantize_128x128_t) leaves
// p, m, v, the codes, the scales and the transposed copy with the bits of
// adamw_update followed by fp8_quantize_weights on the GPU (every output
// NaN-poisoned first, the transposed copy's other columns included); a
// block whose weights, grads and moments are all zero (the amax floor);
// through the op table the same; and with grads and moments that are not
// 16-byte aligned the fused kernel declines (-1) and the op falls back to
// the two (the weights themselves stay aligned, as fp8_quantize_weights
// needs; the optimizer's tensors always are).

static void adamw_fp8_case(int E, int M, int K, int ldt, int col0, int mis) {
    size_t n = (size_t)E * M * K, ns = (size_t)E * (M / 128) * (K / 128), nt = ldt ? (size_t)E * K * ldt : 0;
    size_t nst = ldt ? (size_t)E * (K / 128) * (ldt / 128) : 0;
    float *h[4]; // g, p, m, v
    for (int i = 0; i < 4; i++) {
        h[i] = gt_malloc(n * 4);
        gt_fill(h[i], n, GT_NORMAL, 0, i == 0 ? 1e-2f : i == 1 ? 0.05f : i == 2 ? 1e-3f : 1.f, 0, fill_seed++);
    }
    for (size_t i = 0; i < n; i++) h[3][i] = h[3][i] * h[3][i] * 1e-4f; // v >= 0
    for (int r = 0; r < 128; r++) // the first block of expert 0: all zero
        for (int i = 0; i < 4; i++) memset(h[i] + (size_t)r * K, 0, 128 * 4);
    float lr = 3e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.7f;
    int t = 5;
    void *buf[3][4];
    uint8_t *q[3], *qt[3];
    float *sc[3], *st[3];
    for (int k = 0; k < 3; k++) { // 0: the two ops, 1: the fused kernel, 2: the op table
        for (int i = 0; i < 4; i++) {
            char *d = dkeep(gpu->alloc(n * 4 + 16));
            buf[k][i] = d + (mis && i != 1 ? 4 : 0); // p stays aligned: fp8_quantize_weights reads it by 16 bytes
            cuda_to_device(buf[k][i], h[i], n * 4);
        }
        q[k] = dev_poison(n), sc[k] = dev_poison(ns * 4);
        qt[k] = ldt ? dev_poison(nt) : NULL, st[k] = ldt ? dev_poison(nst * 4) : NULL;
    }
    float *const *b0 = (float *const *)buf[0], *const *b1p = (float *const *)buf[1], *const *b2p = (float *const *)buf[2];
    gpu->adamw_update(b0[1], NULL, b0[0], b0[2], b0[3], n, lr, b1, b2, eps, wd, gs, t);
    gpu->fp8_quantize_weights(q[0], sc[0], qt[0], st[0], ldt, col0, b0[1], E, M, K);
    int rc = cuda_fp8_adamw_quantize_128x128_t(b1p[1], b1p[0], b1p[2], b1p[3], lr, b1, b2, eps, wd, gs, t, q[1], sc[1],
                                               qt[1], st[1], ldt, col0, E, M, K);
    if (rc) { // declined (misaligned): the same result through the two ops, so that the comparison below says only rc
        gpu->adamw_update(b1p[1], NULL, b1p[0], b1p[2], b1p[3], n, lr, b1, b2, eps, wd, gs, t);
        gpu->fp8_quantize_weights(q[1], sc[1], qt[1], st[1], ldt, col0, b1p[1], E, M, K);
    }
    gpu->adamw_update_fp8(b2p[1], b2p[0], b2p[2], b2p[3], lr, b1, b2, eps, wd, gs, t, q[2], sc[2], qt[2], st[2], ldt,
                          col0, E, M, K);
    cuda_synchronize();
    const char *what[7] = {"p", "m", "v", "codes", "scales", "transposed codes", "scales of the transposed"};
    for (int k = 1; k < 3; k++) {
        size_t bad[7] = {0}, cnt[7] = {n, n, n, n, ns * 4, nt, nst * 4};
        void *a[7] = {buf[0][1], buf[0][2], buf[0][3], q[0], sc[0], qt[0], st[0]};
        void *b[7] = {buf[k][1], buf[k][2], buf[k][3], q[k], sc[k], qt[k], st[k]};
        char msg[400] = "";
        size_t all = 0;
        for (int i = 0; i < 7; i++) {
            if (!cnt[i]) continue;
            size_t bytes = i < 3 ? cnt[i] * 4 : cnt[i];
            uint8_t *x = gt_host_bytes(a[i], bytes), *y = gt_host_bytes(b[i], bytes);
            if (i < 3) {
                for (size_t j = 0; j < cnt[i]; j++) bad[i] += memcmp(x + 4 * j, y + 4 * j, 4) != 0;
            } else {
                for (size_t j = 0; j < cnt[i]; j++) bad[i] += x[j] != y[j];
            }
            all += bad[i];
            size_t len = strlen(msg);
            snprintf(msg + len, sizeof msg - len, "%s%s %zu/%zu", len ? ", " : "", what[i], bad[i], cnt[i]);
            free(x);
            free(y);
        }
        int want_rc = mis ? -1 : 0;
        gt_ok(!all && (k == 2 || rc == want_rc), "%-48s E=%d M=%d K=%d ldt=%d col0=%d%s %s (rc %d): differ: %s",
              "adamw_update_fp8 = adamw_update + quantise", E, M, K, ldt, col0, mis ? " misaligned" : "",
              k == 1 ? "fused kernel" : "op table", rc, msg);
    }
    for (int i = 0; i < 4; i++) free(h[i]);
    dev_release();
}
static void special_adamw_fp8(void) {
    adamw_fp8_case(2, 256, 384, 512, 256, 0);   // the up weight of a pair: columns 256.. of [Wg^T | Wu^T]
    adamw_fp8_case(2, 256, 384, 512, 0, 0);     // the gate: columns 0..
    adamw_fp8_case(3, 128, 256, 0, 0, 0);       // no transposed copy
    adamw_fp8_case(2, 256, 128, 512, 256, 1);   // misaligned: declined, the two ops
    adamw_fp8_case(8, 1024, 2048, 2048, 1024, 0); // OLMoE's up [E, 1024, 2048]
    adamw_fp8_case(8, 2048, 1024, 2048, 0, 0);  // and its down
}

// ---- coverage: every compute op of Ops has a case

static const char *const compute_ops[] = {
    "cast_to_act", "embedding_forward", "embedding_backward", "matmul_forward", "matmul_backward",
    "router_logits_forward", "router_logits_backward", "rmsnorm_forward", "rmsnorm_backward", "rope_forward",
    "rope_backward", "rmsnorm_rope_forward", "rmsnorm_rope_backward", "attention_forward", "attention_backward", "swiglu_forward", "swiglu_backward",
    "router_probs_forward", "router_probs_backward", "router_topk", "router_weights_forward",
    "router_weights_backward", "router_count", "router_bias_update", "lb_loss_forward", "lb_loss_backward", "zloss_forward",
    "zloss_backward", "moe_route_index", "permute_forward", "permute_scatter", "permute_backward", "unpermute_forward", "unpermute_residual",
    "unpermute_backward", "moe_capacity_drop", "moe_segment_sizes", "grouped_matmul_forward", "grouped_matmul_backward", "grouped_dgrad_pair",
    "crossentropy_forward", "crossentropy_backward", "crossentropy_fused", "loss_sum", "add_act", "sum_act", "copy_act", "add_f32", "copy_f32",
    "zero", "adamw_update", "sum_squares"};
static void special_coverage(void) {
    int n = (int)(sizeof compute_ops / sizeof compute_ops[0]), missing = 0;
    for (int i = 0; i < n; i++) {
        int found = 0;
        for (int j = 0; j < ncases && !found; j++) found = !strcmp(cases[j]->op, compute_ops[i]);
        if (!found) { printf("      no case for %s\n", compute_ops[i]); missing++; }
    }
    gt_ok(!missing, "%-48s %d ops, %d cases, %d ops without one", "every compute op of Ops has a case", n, ncases,
          missing);
}

// ---- rope_paths: rmsnorm_rope_forward / _backward give the bits of the two
// ops in turn (rmsnorm_forward then rope_forward; rope_backward then
// rmsnorm_backward), out, rstd, dinp (= and +=, dinp aliasing dout as the
// model calls it) and dw, on shapes the fused kernels take and on one they
// do not

static void rope_paths_case(int B, int T, int nh, int hd, int full) {
    size_t n = (size_t)B * T * nh * hd, nt = (size_t)T * (hd / 2);
    int C = full ? nh * hd : hd, N = (int)(n / C);
    float *hx = gt_malloc(n * 4), *hw = gt_malloc((size_t)C * 4), *hd_ = gt_malloc(n * 4), *hg = gt_malloc(n * 4);
    float *hc = gt_malloc(nt * 4), *hs = gt_malloc(nt * 4);
    gt_fill(hx, n, G_UNIFORM, 0, 2, 1, fill_seed++);
    gt_fill(hw, C, G_AROUND1, 0, 0.3f, 1, fill_seed++);
    gt_fill(hd_, n, G_UNIFORM, 0, 1, 1, fill_seed++);
    gt_fill(hg, n, G_UNIFORM, 0, 1, 1, fill_seed++);
    rope_tables(hc, hs, T, hd, 10000.f);
    void *x = dkeep(gt_dev_bf16(hx, n)), *w = dkeep(gt_dev_bf16(hw, C));
    float *cs = dev_copy(hc, nt * 4), *sn = dev_copy(hs, nt * 4);
    void *tmp = dkeep(gpu->alloc(n * 2)), *o1 = dkeep(gpu->alloc(n * 2)), *o2 = dkeep(gpu->alloc(n * 2));
    float *r1 = dkeep(gpu->alloc((size_t)N * 4)), *r2 = dkeep(gpu->alloc((size_t)N * 4));
    gpu->rmsnorm_forward(tmp, r1, x, w, N, C, 1e-5f);
    gpu->rope_forward(o1, tmp, cs, sn, B, T, nh, hd);
    gpu->rmsnorm_rope_forward(o2, r2, tmp, x, w, cs, sn, B, T, nh, hd, C, 1e-5f);
    cuda_synchronize();
    float *ho1 = gt_host_bf16(o1, n), *ho2 = gt_host_bf16(o2, n), *hr1 = gt_host_f32(r1, N), *hr2 = gt_host_f32(r2, N);
    char nm[128];
    snprintf(nm, sizeof nm, "rmsnorm_rope_forward B=%d T=%d nh=%d hd=%d C=%d: out as the two ops'", B, T, nh, hd, C);
    gt_check_bits(nm, ho1, ho2, n, 4);
    snprintf(nm, sizeof nm, "rmsnorm_rope_forward B=%d T=%d nh=%d hd=%d C=%d: rstd as the two ops'", B, T, nh, hd, C);
    gt_check_bits(nm, hr1, hr2, N, 4);
    for (int acc = 0; acc < 2; acc++) {
        void *dy = dkeep(gt_dev_bf16(hd_, n)), *d1 = dkeep(gt_dev_bf16(hg, n)), *d2 = dkeep(gt_dev_bf16(hd_, n));
        float *w1 = dkeep(gpu->alloc((size_t)C * 4)), *w2 = dkeep(gpu->alloc((size_t)C * 4));
        gpu->zero(w1, (size_t)C * 4);
        gpu->zero(w2, (size_t)C * 4);
        gpu->rope_backward(tmp, dy, cs, sn, B, T, nh, hd);
        gpu->rmsnorm_backward(d1, w1, tmp, x, w, r1, N, C, acc);
        if (acc) { // +=: dinp holds the old grad, so it cannot also be dout; dout separate
            void *g2 = dkeep(gt_dev_bf16(hg, n));
            gpu->rmsnorm_rope_backward(g2, w2, tmp, dy, x, w, r1, cs, sn, B, T, nh, hd, C, 1);
            d2 = g2;
        } else { // as the model calls it: dinp aliasing dout
            gpu->rmsnorm_rope_backward(d2, w2, tmp, d2, x, w, r1, cs, sn, B, T, nh, hd, C, 0);
        }
        cuda_synchronize();
        float *a1 = gt_host_bf16(d1, n), *a2 = gt_host_bf16(d2, n), *b1 = gt_host_f32(w1, C), *b2 = gt_host_f32(w2, C);
        snprintf(nm, sizeof nm, "rmsnorm_rope_backward B=%d T=%d nh=%d hd=%d C=%d acc=%d: dinp as the two ops'", B, T,
                 nh, hd, C, acc);
        gt_check_bits(nm, a1, a2, n, 4);
        snprintf(nm, sizeof nm, "rmsnorm_rope_backward B=%d T=%d nh=%d hd=%d C=%d acc=%d: dw as the two ops'", B, T, nh,
                 hd, C, acc);
        gt_check_bits(nm, b1, b2, C, 4);
        free(a1), free(a2), free(b1), free(b2);
    }
    free(hx), free(hw), free(hd_), free(hg), free(hc), free(hs), free(ho1), free(ho2), free(hr1), free(hr2);
    dev_release();
}
static void special_rope_paths(void) {
    rope_paths_case(2, 4096, 16, 128, 1); // OLMoE's q (fused)
    rope_paths_case(1, 4096, 8, 128, 1);  // the sweep's (fused)
    rope_paths_case(3, 17, 12, 64, 1);    // fused, head dim 64
    rope_paths_case(2, 40, 8, 128, 0);    // per-head rows: the two ops
}

// ---- timed_table: bench --breakdown's table (ops_cuda_timed) has every op
// ops_cuda has, but the graph hooks (it runs uncaptured)

static void special_timed_table(void) {
    const void *const *a = (const void *const *)&ops_cuda, *const *t = (const void *const *)&ops_cuda_timed;
    size_t n = sizeof(Ops) / sizeof(void *), missing = 0;
    size_t hooks[] = {offsetof(Ops, capture_begin), offsetof(Ops, capture_end), offsetof(Ops, graph_launch),
                      offsetof(Ops, graph_free)};
    for (size_t i = 0; i < n; i++) {
        int hook = 0;
        for (size_t j = 0; j < sizeof hooks / sizeof hooks[0]; j++) hook |= hooks[j] == i * sizeof(void *);
        if (a[i] && !t[i] && !hook) {
            printf("      ops_cuda_timed lacks the member at byte %zu of Ops (add it to TIMED_OPS)\n", i * sizeof(void *));
            missing++;
        }
    }
    gt_ok(!missing, "%-48s %zu slots, %zu missing", "ops_cuda_timed has every op of ops_cuda", n, missing);
}

static const struct { const char *name; void (*fn)(void); } specials[] = {
    {"capture", special_capture},
    {"attention_causality", special_causality},
    {"attention_heads", special_heads},
    {"attention_docs", special_docs},
    {"crossentropy_paths", special_ce_paths},
    {"grouped_wgrad_tail", special_wgrad_tail},
    {"wgrad_sumsq", special_wgrad_sumsq},
    {"glu_forward", special_glu},
    {"adamw_fp8", special_adamw_fp8},
    {"coverage", special_coverage},
    {"timed_table", special_timed_table},
    {"rope_paths", special_rope_paths},
};

// ==== main ======================================================================================

static struct timespec t_start;
static double elapsed_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t_start.tv_sec) + 1e-9 * (t.tv_nsec - t_start.tv_nsec);
}

static const char *filter; // -o: comma-separated prefixes
static int selected(const char *op) {
    if (!filter) return 1;
    for (const char *p = filter; *p;) {
        size_t len = strcspn(p, ",");
        if (len && !strncmp(op, p, len)) return 1;
        p += len + (p[len] == ',');
    }
    return 0;
}

static void list_cases(void) {
    const Bound *bounds[] = {&B_BF16, &B_F32, &B_DOT, &B_LOGITS, &B_DW, &B_ATTN, &B_LSE, &B_EXACT};
    printf("bounds (relative L2 error against the CPU):\n");
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++) printf("  %.0e  %s\n", bounds[i]->tol, bounds[i]->why);
    printf("cases:\n");
    for (int i = 0; i < ncases; i++) {
        const Case *c = cases[i];
        if (!selected(c->op)) continue;
        printf("  %s%s%s%s:", c->name, c->flags & PERF ? " PERF" : "", c->flags & RERUN ? " RERUN" : "",
               c->flags & NOCPU ? " NOCPU" : "");
        for (int j = 0; j < c->nt; j++) {
            const Tensor *t = &c->t[j];
            if (is_output(t)) printf(" %s%s", t->name, t->flags & NOCMP ? " (extra)" : "");
            if (is_output(t) && !(t->flags & NOCMP)) printf(" <= %.0e", t->bound->tol);
        }
        for (int ch = 0; ch < c->nchoice; ch++)
            if (c->choice[ch].label) printf("%s%s", ch ? ", " : "; kernels: ", c->choice[ch].label);
        printf("\n");
    }
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        if (selected(specials[i].name)) printf("  special check %s\n", specials[i].name);
}

// --grouped-variant's list (up to MAX_GROUPED_VARIANTS numbers 0-CUDA_GROUPED_VARIANT_MAX): 0, or -1 when malformed
static int parse_variants(const char *arg) {
    for (const char *p = arg; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > CUDA_GROUPED_VARIANT_MAX || n_grouped_variants == MAX_GROUPED_VARIANTS || (*end && *end != ','))
            return -1;
        snprintf(grouped_variant_label[n_grouped_variants], sizeof grouped_variant_label[0], "variant %ld", v);
        grouped_variants[n_grouped_variants++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return n_grouped_variants ? 0 : -1;
}

int main(int argc, char **argv) {
    int list = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--perf")) perf_mode = 1;
        else if (!strcmp(argv[i], "--list")) list = 1;
        else if (!strcmp(argv[i], "-o") && i + 1 < argc) filter = argv[++i];
        else if (!strcmp(argv[i], "--grouped-variant") && i + 1 < argc && parse_variants(argv[++i]) == 0) continue;
        else {
            fprintf(stderr, "usage: %s [--perf] [-o PREFIX[,PREFIX...]] [--grouped-variant N[,N...]] [--list]\n",
                    argv[0]);
            return 2;
        }
    }
    make_cases();
    if (list) { list_cases(); return 0; }
    clock_gettime(CLOCK_MONOTONIC, &t_start);
    const char *prev = "";
    int nrun = 0;
    for (int i = 0; i < ncases; i++) {
        if (!selected(cases[i]->op)) continue;
        if (strcmp(cases[i]->section, prev)) printf("-- %s (%.0f s in)\n", prev = cases[i]->section, elapsed_s());
        run_case(cases[i]);
        nrun++;
    }
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) {
        if (!selected(specials[i].name) || (filter && specials[i].fn == special_coverage)) continue;
        printf("-- special check %s (%.0f s in)\n", specials[i].name, elapsed_s());
        specials[i].fn();
        fflush(stdout);
    }
    printf("-- %d cases and the special checks: %d checks in %.0f s\n", nrun, gt_pass + gt_fail, elapsed_s());
    return gt_finish();
}
