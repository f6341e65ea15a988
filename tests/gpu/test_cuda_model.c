// The whole training step on the GPU against the CPU backend:
//  1. for the tiny config and an OLMoE-style test config, one step's loss
//     and every parameter gradient (BF16 bounds, below);
//  2. 50 AdamW steps on both backends: losses within 1% at every step;
//  3. the forward + backward runs under CUDA graph capture (which fails on
//     any host synchronisation) and a replay gives the uncaptured loss;
//  4. 1-3 with intra-document masking (data.doc_mask) on batches of short
//     EOS-delimited documents;
//  5. 1-3 with model.capacity_factor 1.0 and 0.5 on the tiny config: the
//     rows each layer drops equal the CPU's (random routing), a captured
//     step counts its drops on every replay, and recompute stays
//     bit-identical;
//  6. train.precision: fp8 (a config the FP8 kernels take): 1-3 and
//     recompute with FP8 on both backends, 1 and 3 with fp8.wgrad: fp8 too (FP8_GRAD_TOL below; the curves
//     against the BF16 path's own drift, fp8_tests); 1 and 3 with fp8.gemms: experts_dense
//     (fp8_dense_part);
//  7. the selective recomputes (norms, attention, SwiGLU) bit-identical to
//     keeping the activations (selective_recompute_step; the argument
//     "recompute" runs the recompute checks alone, with doc masking and
//     FP8 too).
//
// Tolerances: the GPU runs BF16 weights and activations (8 bits of
// mantissa: ~4e-3 relative per rounding) through 4 layers, against FP32 on
// the CPU; the loss agrees to well under 1e-2 and the gradients, which
// compound many roundings, to a few percent. The bounds below are those
// expectations with margin, not fitted to a run.
//
// Gradients and loss curves are compared with random routing, whose expert
// choices depend only on (seed, token) and so are the same on both
// backends. With learned routing, BF16 router inputs flip a few near-tie
// top-k choices against FP32 (the first H200 run: expert-weight grads
// differed by up to 13% and 50-step curves by 2-4%); a flipped choice moves
// a token's whole contribution between experts, which no rounding bound
// covers. For learned routing the test checks the loss and reports the
// fraction of flipped choices and the gradient error. Capacity drops the
// tail of each expert's rows in (token, slot) order, so its drops are
// compared where the choices are the same: random routing (a flipped choice
// would also move which rows are the tail).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_test_util.h"
#include "model/model.h"
#include "optim/adamw.h"

#define LOSS_TOL 1e-2
#define GRAD_TOL 5e-2
#define CURVE_TOL 1e-2
// train.precision: fp8 on both backends (6.). The CPU quantises FP32
// activations, the GPU BF16 ones: a value within a BF16 rounding (2^-9
// relative) of an E4M3 rounding boundary lands on the other E4M3 code, one
// E4M3 step (2^-4..2^-3 relative) away, for ~1 value in 16-32. That adds
// ~1-2% relative to each expert GEMM's output on top of the BF16 path's
// differences, and gradients compound it through 4 layers: bound the
// gradients at 2x GRAD_TOL. The loss and the curves, averages over many
// tokens, keep their bounds.
#define FP8_GRAD_TOL 1e-1
// fp8.gemms: experts_dense quantises every attention projection's input and
// output grad too, so those code flips reach every gradient directly: on
// the CPU alone, the quantisers fed BF16-rounded values instead of FP32
// ones move this config's one-step gradients by up to 1.16e-1 (layers.3
// attn.k_norm; 8e-2 on most tensors; the experts alone: 3.4e-2), and the
// H200 gave 1.31e-1 at the same tensor against 1e-1 (2026-12-02,
// bench/results/2026-12-02-h200-fp8-dense.md). A scale read from the wrong
// tile moves a GEMM by O(1) (tests/test_fp8.c's mutation: 1.23); the
// GEMMs' own accuracy is test_fp8 dense's (4e-3).
#define FP8_DENSE_GRAD_TOL 2e-1

typedef struct {
    const char *name;
    const char *keys[16][2];
} TestConfig;

static const TestConfig configs[] = {
    {"tiny", {{"vocab_size", "257"}, {"d_model", "128"}, {"n_layers", "4"}, {"n_heads", "4"},
              {"n_experts", "8"}, {"top_k", "2"}, {"expert_hidden", "256"}, {"seq_len", "128"},
              {"norm", "pre"}, {"qk_norm", "full"}, {NULL, NULL}}},
    {"olmoe-style", {{"vocab_size", "1000"}, {"d_model", "256"}, {"n_layers", "4"}, {"n_heads", "4"},
                     {"n_experts", "16"}, {"top_k", "4"}, {"expert_hidden", "128"}, {"seq_len", "256"},
                     {"norm", "pre"}, {"qk_norm", "full"}, {"gating", "softmax"}, {"renorm_topk", "false"},
                     {NULL, NULL}}},
};

// for train.precision: fp8: d_model and expert_hidden multiples of 256 (the CUDA FP8 GEMM's tiles)
static const TestConfig fp8_config = {
    "fp8 block128", {{"vocab_size", "257"}, {"d_model", "256"}, {"n_layers", "4"}, {"n_heads", "4"},
                     {"n_experts", "8"}, {"top_k", "2"}, {"expert_hidden", "256"}, {"seq_len", "128"},
                     {"norm", "pre"}, {"qk_norm", "full"}, {NULL, NULL}}};
static int fp8; // build() makes train.precision: fp8 models (with fp8.wgrad: fp8: 2 fake-quantised, 3 on the FP8 GEMM;
                // 4: fp8.gemms: experts_dense)

// the tiny config with intra-document masking (doc_eos below)
static const TestConfig doc_config = {
    "tiny + doc_mask", {{"vocab_size", "257"}, {"d_model", "128"}, {"n_layers", "4"}, {"n_heads", "4"},
                        {"n_experts", "8"}, {"top_k", "2"}, {"expert_hidden", "256"}, {"seq_len", "128"},
                        {"norm", "pre"}, {"qk_norm", "full"}, {NULL, NULL}}};

static const char *routing = "random";
static const char *capacity = "0"; // model.capacity_factor
// >= 0: models mask attention to documents ending with this token, and the
// batches hold documents of 1 to ~40 tokens (1 in 16 tokens is an EOS)
static int doc_eos = -1;

static void build(Model *m, const TestConfig *tc, const Ops *ops, int B, int T) {
    ModelConfig c;
    char err[256];
    model_config_defaults(&c);
    for (int i = 0; tc->keys[i][0]; i++)
        if (model_config_set(&c, tc->keys[i][0], tc->keys[i][1], err, sizeof err)) { printf("%s\n", err); exit(1); }
    model_config_set(&c, "routing", routing, err, sizeof err);
    if (model_config_set(&c, "capacity_factor", capacity, err, sizeof err)) { printf("%s\n", err); exit(1); }
    if (model_init(m, &c, ops, err, sizeof err)) { printf("%s\n", err); exit(1); }
    model_init_weights(m, 7);
    if (doc_eos >= 0) { m->doc_mask = 1; m->doc_eos = doc_eos; }
    if (fp8 && model_set_fp8(m, err, sizeof err)) { printf("FAIL %s: %s\n", tc->name, err); exit(1); }
    m->fp8_wgrad = fp8 == 2 || fp8 == 3 ? fp8 - 1 : 0;
    if (fp8 == 4 && model_set_fp8_dense(m, B * T, err, sizeof err)) { printf("FAIL %s: %s\n", tc->name, err); exit(1); }
    model_alloc_acts(m, B, T);
}

// the test's name: the config's, and the capacity factor when there is one
static const char *tag(const TestConfig *tc) {
    static char buf[96];
    if (fp8) { snprintf(buf, sizeof buf, "%s, fp8%s", tc->name, fp8 == 2 ? " + fp8.wgrad (fake)" : fp8 == 3 ? " + fp8.wgrad (GEMM)" : fp8 == 4 ? " + experts_dense" : ""); return buf; }
    if (!strcmp(capacity, "0")) return tc->name;
    snprintf(buf, sizeof buf, "%s + capacity_factor %s", tc->name, capacity);
    return buf;
}

static void add_eos(int *tok, int n, unsigned seed) {
    if (doc_eos < 0) return;
    for (int i = 0; i < n; i++) { seed = seed * 1103515245u + 12345u; if ((seed >> 8) % 16 == 0) tok[i] = doc_eos; }
}

static void make_batch(int *tok, int *tgt, int n, int T, int vocab, unsigned seed) {
    for (int i = 0; i < n; i++) { seed = seed * 1103515245u + 12345u; tok[i] = (seed >> 8) % vocab; }
    add_eos(tok, n, seed);
    for (int i = 0; i < n; i++) tgt[i] = (i % T == T - 1) ? -1 : tok[i + 1];
}

// Learnable sequences: the next token is (7 * token + 3) mod vocab four
// times in five, else random, so the loss falls steadily as the model learns.
static void make_pattern_batch(int *tok, int *tgt, int n, int T, int vocab, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        unsigned r = seed >> 8;
        tok[i] = (i % T == 0 || r % 5 == 0) ? (int)((r / 5) % vocab) : (tok[i - 1] * 7 + 3) % vocab;
    }
    add_eos(tok, n, seed);
    for (int i = 0; i < n; i++) tgt[i] = (i % T == T - 1) ? -1 : tok[i + 1];
}

static float *grads_host(const Model *m, int idx) {
    const ParamEntry *e = &m->store.table.entries[idx];
    float *h = malloc(e->numel * sizeof(float) + 4);
    m->ops->to_host(h, param_store_grad(&m->store, idx), e->numel * sizeof(float));
    return h;
}

static double grad_tol(void) { return fp8 == 4 ? FP8_DENSE_GRAD_TOL : fp8 ? FP8_GRAD_TOL : GRAD_TOL; }

static void compare_step(const TestConfig *tc) {
    int B = 2, T = 128;
    Model cpu, gpu;
    build(&cpu, tc, &ops_cpu, B, T);
    build(&gpu, tc, &ops_cuda, B, T);
    int N = B * T, *tok = malloc(N * sizeof(int)), *tgt = malloc(N * sizeof(int));
    make_batch(tok, tgt, N, T, cpu.cfg.vocab_size, 11);
    Model *ms[2] = {&cpu, &gpu};
    float loss[2];
    for (int i = 0; i < 2; i++) {
        model_zero_grads(ms[i]);
        model_begin_step(ms[i]);
        loss[i] = model_forward(ms[i], tok, tgt, 1);
        model_backward(ms[i], 1.0f / ms[i]->n_valid, 1.0f);
    }
    char what[160];
    snprintf(what, sizeof what, "%s, %s routing: loss (cpu %.5f, gpu %.5f)", tag(tc), routing, loss[0], loss[1]);
    gt_check(what, &loss[1], &loss[0], 1, LOSS_TOL);
    int strict = strcmp(routing, "learned") != 0;
    // expert choices that differ between the backends, per MoE layer
    int flips = 0, choices = 0;
    for (int l = 0; l < cpu.cfg.n_layers; l++) {
        if (cpu.layers[l].moe_index < 0) continue;
        size_t n = (size_t)N * cpu.cfg.top_k;
        int *ig = malloc(n * sizeof(int));
        cuda_to_host(ig, gpu.acts[l].idx, n * sizeof(int));
        for (size_t j = 0; j < n; j++) flips += ig[j] != cpu.acts[l].idx[j];
        choices += (int)n;
        free(ig);
    }
    printf("      %s routing: %d of %d expert choices differ between CPU and GPU\n", routing, flips, choices);
    if (strict && flips) { printf("FAIL random routing must choose the same experts on both backends\n"); gt_fail++; }
    if (cpu.cfg.capacity_factor > 0) {
        // the same choices in the same stable order: the same rows dropped
        int same = 1;
        double dropped = 0;
        for (int li = 0; li < cpu.n_moe; li++) {
            same &= cpu.step_dropped[li] == gpu.step_dropped[li];
            dropped += cpu.step_dropped[li];
            printf("      MoE layer %d: %.0f rows dropped on the CPU, %.0f on the GPU, of %d\n", li, cpu.step_dropped[li],
                   gpu.step_dropped[li], N * cpu.cfg.top_k);
        }
        if (strict) {
            int ok = same && dropped > 0;
            printf("%s %s, %s routing: dropped rows equal the CPU's in every layer (%.0f in all)\n", ok ? "ok  " : "FAIL",
                   tag(tc), routing, dropped);
            if (ok) gt_pass++; else gt_fail++;
        }
    }
    // every gradient tensor; report the worst and fail on any above the bound
    double worst = 0;
    const char *worst_name = "";
    int bad = 0;
    for (int i = 0; i < cpu.store.table.n; i++) {
        const ParamEntry *e = &cpu.store.table.entries[i];
        float *gc = grads_host(&cpu, i), *gg = grads_host(&gpu, i);
        double d = 0, r = 0;
        int finite = 1;
        for (size_t j = 0; j < e->numel; j++) {
            finite &= isfinite(gg[j]);
            d += ((double)gg[j] - gc[j]) * ((double)gg[j] - gc[j]);
            r += (double)gc[j] * gc[j];
        }
        double err = r > 0 ? sqrt(d / r) : sqrt(d);
        if (err > worst) { worst = err; worst_name = e->name; }
        if ((!finite || err > grad_tol()) && strcmp(routing, "learned")) {
            printf("      grad %-40s rel err %.3e%s\n", e->name, err, finite ? "" : " NONFINITE");
            bad++;
        }
        free(gc); free(gg);
    }
    if (!strict) {
        printf("info %s, learned routing: %d gradients, worst rel err %.3e (%s): not bounded, see the header\n",
               tag(tc), cpu.store.table.n, worst, worst_name);
    } else {
        printf("%s %s, %s routing: %d gradients, worst rel err %.3e (%s), tol %.0e\n", bad ? "FAIL" : "ok  ",
               tag(tc), routing, cpu.store.table.n, worst, worst_name, grad_tol());
        if (bad) gt_fail++; else gt_pass++;
    }
    free(tok); free(tgt);
    model_free(&cpu);
    model_free(&gpu);
}

// 50 AdamW steps on both backends; counted against tol (< 0: reported only).
// Returns the worst relative loss difference.
static double compare_curves_tol(const TestConfig *tc, double tol) {
    int B = 2, T = 128, steps = 50;
    Model cpu, gpu;
    build(&cpu, tc, &ops_cpu, B, T);
    build(&gpu, tc, &ops_cuda, B, T);
    OptimConfig oc;
    optim_config_defaults(&oc);
    oc.lr = 1e-3f;
    AdamW oa, og;
    adamw_init(&oa, &oc, &cpu.store);
    adamw_init(&og, &oc, &gpu.store);
    int N = B * T, *tok = malloc(N * sizeof(int)), *tgt = malloc(N * sizeof(int));
    double worst = 0;
    int worst_step = 0;
    float first[2] = {0, 0}, last[2] = {0, 0};
    for (int s = 0; s < steps; s++) {
        make_pattern_batch(tok, tgt, N, T, cpu.cfg.vocab_size, 100 + s); // a fresh batch each step
        float l[2];
        Model *ms[2] = {&cpu, &gpu};
        AdamW *os[2] = {&oa, &og};
        for (int i = 0; i < 2; i++) {
            model_zero_grads(ms[i]);
            model_begin_step(ms[i]);
            l[i] = model_forward(ms[i], tok, tgt, 1);
            model_backward(ms[i], 1.0f / ms[i]->n_valid, 1.0f);
            adamw_step(os[i], &ms[i]->store, oc.lr, 1.0f);
            model_end_step(ms[i]);
        }
        double d = fabs(l[1] - l[0]) / fabs(l[0]);
        if (!(d <= worst)) { worst = d; worst_step = s + 1; }
        if (s == 0) { first[0] = l[0]; first[1] = l[1]; }
        last[0] = l[0]; last[1] = l[1];
    }
    int ok = worst <= tol && last[0] < first[0];
    printf("%s %s, %s routing: 50-step losses cpu %.4f -> %.4f, gpu %.4f -> %.4f; worst rel diff %.3e at step %d (tol %.2e)\n",
           tol < 0 ? "info" : ok ? "ok  " : "FAIL", tag(tc), routing, first[0], last[0], first[1], last[1], worst,
           worst_step, tol);
    if (tol >= 0) { if (ok) gt_pass++; else gt_fail++; }
    free(tok); free(tgt);
    adamw_free(&oa); adamw_free(&og);
    model_free(&cpu);
    model_free(&gpu);
    return worst;
}
static void compare_curves(const TestConfig *tc) { compare_curves_tol(tc, CURVE_TOL); }

static void graph_capture(const TestConfig *tc) {
    int B = 2, T = 128;
    Model gpu;
    build(&gpu, tc, &ops_cuda, B, T);
    int N = B * T, *tok = malloc(N * sizeof(int)), *tgt = malloc(N * sizeof(int));
    make_batch(tok, tgt, N, T, gpu.cfg.vocab_size, 5);
    // uncaptured reference (also the warm-up that creates every lazy resource)
    model_set_batch(&gpu, tok, tgt);
    model_zero_grads(&gpu);
    model_begin_step(&gpu);
    model_forward_async(&gpu, 1);
    model_backward(&gpu, 1.0f / gpu.n_valid, 1.0f);
    double ref, got;
    cuda_to_host(&ref, gpu.ce_acc, sizeof(double));
    int L = gpu.n_moe;
    float drop_ref[L + 1], drop_got[L + 1];
    cuda_to_host(drop_ref, gpu.dropped_step, L * sizeof(float));
    model_zero_grads(&gpu);
    model_begin_step(&gpu);
    char err[256];
    cuda_capture_begin();
    model_forward_async(&gpu, 1);
    model_backward(&gpu, 1.0f / gpu.n_valid, 1.0f);
    void *exec = cuda_capture_end(err, sizeof err);
    if (!exec) {
        printf("FAIL %s: the step cannot be captured as a CUDA graph: %s\n", tag(tc), err);
        gt_fail++;
    } else {
        for (int r = 0; r < 3; r++) cuda_graph_launch(exec); // replays give the same CE sum
        cuda_synchronize();
        cuda_to_host(&got, gpu.ce_acc, sizeof(double));
        int ok = got == ref;
        printf("%s %s: forward + backward captured as a CUDA graph (no host sync); replay CE sum %.6f vs %.6f\n",
               ok ? "ok  " : "FAIL", tag(tc), got, ref);
        if (ok) gt_pass++; else gt_fail++;
        if (gpu.cfg.capacity_factor > 0) { // the drops are counted inside the graph: 3 replays, 3 times the rows
            cuda_to_host(drop_got, gpu.dropped_step, L * sizeof(float));
            double a = 0, b = 0;
            ok = 1;
            for (int li = 0; li < L; li++) { ok &= drop_got[li] == 3 * drop_ref[li]; a += drop_got[li]; b += drop_ref[li]; }
            ok &= b > 0;
            printf("%s %s: 3 replays count %.0f dropped rows, 3 x the uncaptured step's %.0f\n", ok ? "ok  " : "FAIL",
                   tag(tc), a, b);
            if (ok) gt_pass++; else gt_fail++;
        }
        if (gpu.cfg.routing == ROUTING_RANDOM) {
            // the graph reads the route seeds from device memory: after an
            // uncaptured step with seed 2 a replay gives seed 2's CE, and
            // after model_set_route_seed(1) seed 1's again
            double ref2, got2, got1;
            model_zero_grads(&gpu);
            model_begin_step(&gpu);
            model_forward_async(&gpu, 2);
            model_backward(&gpu, 1.0f / gpu.n_valid, 1.0f);
            cuda_to_host(&ref2, gpu.ce_acc, sizeof(double));
            cuda_graph_launch(exec);
            cuda_to_host(&got2, gpu.ce_acc, sizeof(double));
            model_set_route_seed(&gpu, 1);
            cuda_graph_launch(exec);
            cuda_to_host(&got1, gpu.ce_acc, sizeof(double));
            ok = got2 == ref2 && got1 == ref && ref2 != ref;
            printf("%s %s: random routing replayed with the seed in device memory: seed 2 CE %.6f vs uncaptured %.6f, "
                   "seed 1 again %.6f vs %.6f\n", ok ? "ok  " : "FAIL", tag(tc), got2, ref2, got1, ref);
            if (ok) gt_pass++; else gt_fail++;
        }
        // time the captured step
        void *t0 = cuda_event_record();
        for (int r = 0; r < 10; r++) cuda_graph_launch(exec);
        void *t1 = cuda_event_record();
        printf("      captured step: %.3f ms per forward+backward of %d tokens\n", cuda_event_elapsed_ms(t0, t1) / 10, N);
        cuda_graph_free(exec);
    }
    free(tok); free(tgt);
    model_free(&gpu);
}

// model.lb_global under a CUDA graph: two replays of one captured
// micro-batch on two batches give the step's LB sums of the two uncaptured
// micro-batches bit for bit (the second sees the running counts of both;
// the LB kernels take the token count from them on the device, not from a
// host argument).
static void lb_global_graph(const TestConfig *tc) {
    int B = 2, T = 128, N = B * T;
    Model gpu;
    char err[256];
    ModelConfig c;
    model_config_defaults(&c);
    for (int i = 0; tc->keys[i][0]; i++) model_config_set(&c, tc->keys[i][0], tc->keys[i][1], err, sizeof err);
    model_config_set(&c, "routing", routing, err, sizeof err);
    model_config_set(&c, "lb_global", "true", err, sizeof err);
    if (model_init(&gpu, &c, &ops_cuda, err, sizeof err)) { printf("FAIL %s\n", err); gt_fail++; return; }
    model_init_weights(&gpu, 7);
    model_alloc_acts(&gpu, B, T);
    int *tok = malloc(2 * N * sizeof(int)), *tgt = malloc(2 * N * sizeof(int)); // two micro-batches
    make_batch(tok, tgt, N, T, gpu.cfg.vocab_size, 9);
    make_batch(tok + N, tgt + N, N, T, gpu.cfg.vocab_size, 10);
    int L = gpu.n_moe;
    float ref[L + 1], got[L + 1], one[L + 1];
    model_zero_grads(&gpu);
    model_begin_step(&gpu);
    for (int mb = 0; mb < 2; mb++) {
        model_set_batch(&gpu, tok + mb * N, tgt + mb * N);
        model_forward_async(&gpu, 1);
        model_backward(&gpu, 1.0f / gpu.n_valid, 1.0f);
        model_count_micro_batch(&gpu);
        if (mb == 0) cuda_to_host(one, gpu.lb_step, L * sizeof(float));
    }
    cuda_to_host(ref, gpu.lb_step, L * sizeof(float));
    model_zero_grads(&gpu);
    model_begin_step(&gpu);
    model_set_batch(&gpu, tok, tgt);
    cuda_capture_begin();
    model_forward_async(&gpu, 1);
    model_backward(&gpu, 1.0f / gpu.n_valid, 1.0f);
    void *exec = cuda_capture_end(err, sizeof err);
    if (!exec) {
        printf("FAIL %s: lb_global: the step cannot be captured: %s\n", tag(tc), err);
        gt_fail++;
    } else {
        for (int mb = 0; mb < 2; mb++) {
            model_set_batch(&gpu, tok + mb * N, tgt + mb * N);
            cuda_graph_launch(exec);
            model_count_micro_batch(&gpu);
        }
        cuda_to_host(got, gpu.lb_step, L * sizeof(float));
        int ok = !memcmp(got, ref, L * sizeof(float)) && ref[0] != 2 * one[0];
        printf("%s %s: lb_global captured: 2 replays' LB sum %.6f (layer 0) vs 2 uncaptured micro-batches %.6f "
               "(one micro-batch %.6f)\n", ok ? "ok  " : "FAIL", tag(tc), got[0], ref[0], one[0]);
        if (ok) gt_pass++; else gt_fail++;
        cuda_graph_free(exec);
    }
    free(tok); free(tgt);
    model_free(&gpu);
}

// train.recompute = experts on the GPU: the same deterministic kernels on
// the same inputs, so two micro-batches' grads must be bit-identical to
// keeping the activations, with a smaller arena. Likewise (third model) when
// the first backward writes the expert grads over poison
// (model_zero_dense_grads, as train does without a graph).
static void recompute_step(const TestConfig *tc) {
    int B = 2, T = 128, N = B * T;
    Model m[3];
    for (int r = 0; r < 3; r++) {
        build(&m[r], tc, &ops_cuda, B, T);
        if (r == 1) { m[r].recompute = 1; model_alloc_acts(&m[r], B, T); }
    }
    int *tok = malloc(2 * N * sizeof(int)), *tgt = malloc(2 * N * sizeof(int));
    make_batch(tok, tgt, 2 * N, T, m[0].cfg.vocab_size, 13);
    for (int r = 0; r < 3; r++) {
        if (r == 2) {
            gt_poison(m[r].store.grads[CLASS_EXPERT], m[r].store.table.class_numel[CLASS_EXPERT] * sizeof(float));
            model_zero_dense_grads(&m[r]);
        } else {
            model_zero_grads(&m[r]);
        }
        model_begin_step(&m[r]);
        for (int mb = 0; mb < 2; mb++) {
            model_forward(&m[r], tok + mb * N, tgt + mb * N, 3 + mb);
            model_backward(&m[r], 1.0f / (2 * N), 0.5f);
        }
    }
    int same = 1;
    for (int i = 0; i < m[0].store.table.n && same; i++) {
        float *a = grads_host(&m[0], i), *b = grads_host(&m[1], i);
        same = !memcmp(a, b, m[0].store.table.entries[i].numel * sizeof(float));
        if (!same) printf("      %s: grads of %s differ with recompute\n", tag(tc), m[0].store.table.entries[i].name);
        free(a); free(b);
    }
    int ok = same && m[1].arena_bytes < m[0].arena_bytes;
    printf("%s %s: recompute=experts grads bit-identical over 2 micro-batches, arena %.1f vs %.1f MiB\n",
           ok ? "ok  " : "FAIL", tag(tc), m[1].arena_bytes / 1048576.0, m[0].arena_bytes / 1048576.0);
    if (ok) gt_pass++; else gt_fail++;
    same = 1;
    for (int i = 0; i < m[0].store.table.n && same; i++) {
        float *a = grads_host(&m[0], i), *b = grads_host(&m[2], i);
        same = !memcmp(a, b, m[0].store.table.entries[i].numel * sizeof(float));
        if (!same) printf("      %s: grads of %s differ when written by the first backward\n", tag(tc),
                          m[0].store.table.entries[i].name);
        free(a); free(b);
    }
    printf("%s %s: expert grads written by the first backward (over NaN) bit-identical to zero + add\n",
           same ? "ok  " : "FAIL", tag(tc));
    if (same) gt_pass++; else gt_fail++;
    free(tok); free(tgt);
    model_free(&m[0]); model_free(&m[1]); model_free(&m[2]);
}

// The selective recomputes (train.recompute_norms, _attention, _swiglu)
// on the GPU, each alone and all three beside gather and layers: two
// micro-batches' grads bit-identical to keeping everything (the same
// deterministic kernels on the same inputs), with a smaller arena.
static void selective_recompute_step(const TestConfig *tc) {
    int B = 2, T = 128, N = B * T;
    enum { NM = 6 };
    static const char *const names[NM] = {"keep", "norms", "attention", "swiglu", "gather + all three",
                                          "layers + all three"};
    Model m[NM];
    int *tok = malloc(2 * N * sizeof(int)), *tgt = malloc(2 * N * sizeof(int));
    for (int r = 0; r < NM; r++) {
        build(&m[r], tc, &ops_cuda, B, T);
        if (!r) make_batch(tok, tgt, 2 * N, T, m[0].cfg.vocab_size, 17);
        int all = r >= 4;
        m[r].recompute_norms = r == 1 || all;
        m[r].recompute_attention = r == 2 || all;
        m[r].recompute_swiglu = r == 3 || all;
        m[r].recompute = r == 4 ? 2 : r == 5 ? 3 : 0;
        if (r) model_alloc_acts(&m[r], B, T);
        model_zero_grads(&m[r]);
        model_begin_step(&m[r]);
        for (int mb = 0; mb < 2; mb++) {
            model_forward(&m[r], tok + mb * N, tgt + mb * N, 3 + mb);
            model_backward(&m[r], 1.0f / (2 * N), 0.5f);
        }
        if (!r) continue;
        int same = 1;
        for (int i = 0; i < m[0].store.table.n && same; i++) {
            float *a = grads_host(&m[0], i), *b = grads_host(&m[r], i);
            same = !memcmp(a, b, m[0].store.table.entries[i].numel * sizeof(float));
            if (!same) printf("      %s: grads of %s differ with recompute %s\n", tag(tc), m[0].store.table.entries[i].name,
                              names[r]);
            free(a); free(b);
        }
        int ok = same && m[r].arena_bytes < m[0].arena_bytes;
        printf("%s %s: recompute %s grads bit-identical over 2 micro-batches, arena %.2f vs %.2f MiB\n",
               ok ? "ok  " : "FAIL", tag(tc), names[r], m[r].arena_bytes / 1048576.0, m[0].arena_bytes / 1048576.0);
        if (ok) gt_pass++; else gt_fail++;
        model_free(&m[r]);
    }
    model_free(&m[0]);
    free(tok); free(tgt);
}

// two dense blocks and a shared expert: every SwiGLU kind
static const TestConfig dense_shared_config = {
    "tiny + dense + shared", {{"vocab_size", "257"}, {"d_model", "128"}, {"n_layers", "4"}, {"n_heads", "4"},
                              {"n_experts", "8"}, {"top_k", "2"}, {"expert_hidden", "256"}, {"seq_len", "128"},
                              {"norm", "pre"}, {"qk_norm", "head"}, {"dense_layers", "2"}, {"dense_hidden", "384"},
                              {"n_shared", "1"}, {"shared_hidden", "128"}, {NULL, NULL}}};

static void fp8_tests(void);
static void fp8_dense_part(void);

static void models_part(void) { // both configs: steps, curves, graphs, recompute
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        routing = "random";
        compare_step(&configs[i]);
        compare_curves(&configs[i]);
        routing = "learned";
        compare_step(&configs[i]);
        graph_capture(&configs[i]);
        routing = "random";
        graph_capture(&configs[i]);
        lb_global_graph(&configs[i]);
        recompute_step(&configs[i]);
        selective_recompute_step(&configs[i]);
    }
    selective_recompute_step(&dense_shared_config);
}
static void docs_part(void) {
    doc_eos = 256;
    routing = "random";
    compare_step(&doc_config);
    compare_curves(&doc_config);
    graph_capture(&doc_config);
    doc_eos = -1;
}
static void capacity_part(void) {
    const char *factors[] = {"1.0", "0.5"};
    for (int i = 0; i < 2; i++) {
        capacity = factors[i];
        routing = "random";
        compare_step(&configs[0]);
        if (i == 1) compare_curves(&configs[0]);
        recompute_step(&configs[0]);
        routing = "learned";
        compare_step(&configs[0]); // the loss; the drops only reported (flipped choices move the tail)
        graph_capture(&configs[0]);
    }
    capacity = "0";
}
static void recompute_part(void) { // the recompute checks alone
    routing = "random";
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        recompute_step(&configs[i]);
        selective_recompute_step(&configs[i]);
    }
    selective_recompute_step(&dense_shared_config);
    doc_eos = 256;
    selective_recompute_step(&doc_config);
    doc_eos = -1;
    fp8 = 1;
    selective_recompute_step(&fp8_config);
    fp8 = 0;
}

// Arguments: the parts to run, in order (default: models docs capacity
// fp8, the whole program, which takes minutes on an H200 machine, most of
// it in the CPU references); "recompute" runs the recompute checks alone,
// "fp8dense" the fp8.gemms: experts_dense checks (also the end of fp8).
// Parts let a GPU call with a time limit run the program in pieces.
int main(int argc, char **argv) {
    static const struct { const char *name; void (*fn)(void); } parts[] = {
        {"models", models_part}, {"docs", docs_part}, {"capacity", capacity_part},
        {"fp8", fp8_tests},      {"recompute", recompute_part}, {"fp8dense", fp8_dense_part}};
    const int nparts = (int)(sizeof parts / sizeof parts[0]), ndefault = 4;
    setvbuf(stdout, NULL, _IOLBF, 0); // a time-limited call's log shows how far it got
    for (int a = 1; a < argc; a++) {
        int found = 0;
        for (int i = 0; i < nparts; i++) found |= !strcmp(argv[a], parts[i].name);
        if (!found) {
            fprintf(stderr, "test_cuda_model: unknown part '%s' (models, docs, capacity, fp8, recompute, fp8dense)\n", argv[a]);
            return 2;
        }
    }
    if (argc == 1)
        for (int i = 0; i < ndefault; i++) parts[i].fn();
    for (int a = 1; a < argc; a++)
        for (int i = 0; i < nparts; i++)
            if (!strcmp(argv[a], parts[i].name)) parts[i].fn();
    return gt_finish();
}

// 6. train.precision: fp8: CPU-fp8 (the reference: quantise, dequantise,
// FP32 matmul) against CUDA-fp8, on a config the FP8 kernels take. The
// curves: on this config (d_model 256) the BF16 GPU run itself drifts from
// the CPU's FP32 past CURVE_TOL late in the 50 steps (4.2e-2 at step 47 on
// the H200, 2026-12-01), so the FP8 curves are bound by what BF16 reaches
// on the same config (run first), or CURVE_TOL where that is larger: FP8
// may not add divergence of its own beyond the BF16 path's.
static void fp8_tests(void) {
    routing = "random";
    double bf16_worst = compare_curves_tol(&fp8_config, -1);
    fp8 = 1;
    compare_step(&fp8_config);
    compare_curves_tol(&fp8_config, bf16_worst > CURVE_TOL ? bf16_worst : CURVE_TOL);
    graph_capture(&fp8_config);
    recompute_step(&fp8_config);
    for (fp8 = 2; fp8 <= 3; fp8++) { // fp8.wgrad: fp8, fake-quantised and on the FP8 GEMM (the CPU: the reference)
        compare_step(&fp8_config);
        graph_capture(&fp8_config);
    }
    fp8 = 1;
    routing = "learned";
    compare_step(&fp8_config);
    fp8 = 0;
    fp8_dense_part();
}

// fp8.gemms: experts_dense: the attention projections in FP8 too (cuBLASLt's
// block-scaled FP8 on the GPU, the dequantised FP32 product on the CPU): one
// step's loss and every gradient under the FP8 bounds, and the step captured
// in a CUDA graph.
static void fp8_dense_part(void) {
    routing = "random";
    fp8 = 4;
    compare_step(&fp8_config);
    graph_capture(&fp8_config);
    fp8 = 0;
}
