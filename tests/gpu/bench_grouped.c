// The grouped GEMM kernel table (issue 19): the BF16 expert GEMMs on the
// OLMoE-1B-7B shapes as the training step runs them (64 experts, d 2048,
// expert hidden 1024, top-8 of 8192 tokens with random routing: 65536
// grouped rows, uneven per expert): forward gate/up and down, the down
// data-grad, the gate/up data-grad pair (dinp = dG Wg + dU Wu, one
// product), and the FP32 weight-grads assigned (first micro-batch) and
// accumulated (+=, later micro-batches), each through the production entry
// points (cuda_grouped_matmul_*, cuda_grouped_dgrad_pair).
//
// The warp-specialised kernel's epilogue variants (grouped_wgmma.cu's WS_*
// bits, picked by cuda_grouped_set_variant) are timed in ROUNDS interleaved
// rounds, each entry the median of RUNS runs after WARMUP (CUDA events
// around the call alone); a row gives the median over rounds (min..max) and
// the median of the rounds' paired ratios against variant 0 (the epilogue
// before issue 19), so that a drift of the card's clock cancels. Variants
// with bit 4 store nothing (the main loop alone): they are timed, not checked.
// Validation: every other variant's output must equal variant 0's bit for
// bit (outputs poisoned with NaN first; accumulated dw restored from the
// same random start), and be finite; test_backend_ops compares the kernels
// with the CPU backend. Every operand (64-512 MB) is over 2 x L2.
// Prints a markdown table (to argv[1] too when given) and ends with
// "N passed, N failed". Built by `make build/tests/gpu/bench_grouped`.
// Usage: bench_grouped [table.md [quick | sumsq]]; quick: 3 rounds, and only
// the variants after the first checked; sumsq: the last micro-batch's
// weight-grads (+= with the grad norm's slots, cuda_grouped_wgrad_sumsq)
// and the earlier micro-batches' (+= alone), under the default (577) and
// 1601 (577 + WS_DW_SMEM: the old dw from a shared-memory copy), 1601
// checked against 577 bit for bit (dw; test_backend_ops -o wgrad_sumsq
// checks the slots), beside a reference: the += then the slots from dw in
// memory (MOECORE_GRAD_NORM=separate's pass, cuda_wgrad_sumsq_slots).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_test_util.h"

#ifndef MOECORE_BUILD_COMMIT
#define MOECORE_BUILD_COMMIT "unknown"
#endif
enum { TOKENS = 8192, N_EXP = 64, TOP_K = 8, D_MODEL = 2048, HIDDEN = 1024 };
enum { WARMUP = 3, RUNS = 10, ROUNDS = 5 };

static const int all_variants[] = {0, 1, 65, 193, 321, 577, 1601, 4, 132, 260};
static const int sq_variants[] = {577, 1601};
#define N_VAR_MAX 10
static const int *variants = all_variants;
static int N_VAR = 10;
static const char *sq_variant_name[] = {"577: the default before WS_DW_SMEM (slots: the epilogue loads dw; else L2 reductions)",
                                        "1601 (default): 577 + the old dw from a shared-memory copy (WS_DW_SMEM)"};
static const char *const *variant_name;
static const char *all_variant_name[] = {"0: 4-byte stores (before)",
                                     "1: 16-byte stores (the default before e396024)",
                                     "65: TMA epilogue by mode (EPI3 BF16, EPI4 FP32)",
                                     "193: 65 + weight-grad ping-pong 64x256",
                                     "321: 65 + weight-grad ping-pong 128x128",
                                     "577: 65 + ping-pong 128x128 for += (the default before WS_DW_SMEM)",
                                     "1601: 577 + dw += from a shared-memory copy of dw (default)",
                                     "4: no epilogue (main loop alone)",
                                     "132: no epilogue, ping-pong 64x256",
                                     "260: no epilogue, ping-pong 128x128"};
static const int all_checked[] = {1, 65, 193, 321, 577, 1601}; // compared with variant 0 bit for bit
static const int sq_checked[] = {1601};                  // sumsq: compared with 577
static const int *checked = all_checked;
static int n_checked = 6;
static int sumsq;
static int quick; // argv[2] "quick": the last two checked only, 3 rounds
// how often a micro-batch of one MoE layer runs each case (bench_case's
// order): forward gate and up, down; down data-grad; the pair; weight-grads
// gate and up, down, assigned on 1 micro-batch of 4 and accumulated on 3
static const double per_layer[] = {2, 1, 1, 1, 0.5, 1.5, 0.25, 0.75};
static double case_ms[8][N_VAR_MAX];
static int n_cases;

static char table[16384];
static size_t tlen;
static void row(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tlen += vsnprintf(table + tlen, sizeof table - tlen, fmt, ap);
    va_end(ap);
}

enum { OP_FWD, OP_DGRAD, OP_PAIR, OP_WGRAD_SET, OP_WGRAD_ADD, OP_WGRAD_SQ, OP_WGRAD_ADD_SLOTS };
typedef struct {
    int op, E, C, OC, R;
    int *doff;
    void *inp, *w, *dout, *dout2, *w2, *res; // res: forward out or dinp (BF16)
    float *dw, *dw0;                          // weight-grad [E, OC, C] and its random start
    double *sq;                               // OP_WGRAD_SQ: the slots
} Case;

static void run_case(Case *c) {
    switch (c->op) {
    case OP_FWD: cuda_grouped_matmul_forward(c->res, c->inp, c->w, c->doff, c->E, c->C, c->OC); break;
    case OP_DGRAD:
        cuda_grouped_matmul_backward(c->res, NULL, c->dout, c->inp, c->w, c->doff, c->E, c->C, c->OC, 1);
        break;
    case OP_PAIR: cuda_grouped_dgrad_pair(c->res, c->dout, c->w, c->dout2, c->w2, c->doff, c->E, c->C, c->OC); break;
    case OP_WGRAD_SQ: cuda_grouped_wgrad_sumsq(c->dw, c->sq, c->dout, c->inp, c->doff, c->E, c->C, c->OC, 1); break;
    case OP_WGRAD_ADD_SLOTS:
        cuda_grouped_matmul_backward(NULL, c->dw, c->dout, c->inp, c->w, c->doff, c->E, c->C, c->OC, 1);
        cuda_wgrad_sumsq_slots(c->dw, c->sq, c->doff, c->E, c->C, c->OC, 0);
        break;
    default:
        cuda_grouped_matmul_backward(NULL, c->dw, c->dout, c->inp, c->w, c->doff, c->E, c->C, c->OC,
                                     c->op == OP_WGRAD_ADD);
    }
}

static void set_variant(int v) { cuda_grouped_set_variant(v); }

static void run_case_v(void *c) { run_case((Case *)c); }
static double time_ms(Case *c) { return gt_time_ms(run_case_v, c, WARMUP, RUNS); }

// The output of one run of variant v, on the host (raw bytes).
static void *run_output(Case *c, int v, size_t *bytes) {
    set_variant(v);
    int wgrad = c->op >= OP_WGRAD_SET;
    size_t n = wgrad ? (size_t)c->E * c->OC * c->C * 4 : (size_t)c->R * (c->op == OP_FWD ? c->OC : c->C) * 2;
    if (wgrad) cudaMemcpyAsync(c->dw, c->dw0, n, cudaMemcpyDeviceToDevice, cuda_stream());
    if (c->op == OP_WGRAD_SET || !wgrad) gt_poison(wgrad ? (void *)c->dw : c->res, n);
    run_case(c);
    *bytes = n;
    return gt_host_bytes(wgrad ? (void *)c->dw : c->res, n);
}

static void bench_case(Case *c, const char *name) {
    printf("== %s\n", name);
    fflush(stdout);
    size_t n0, n;
    void *ref = run_output(c, 0, &n0);
    int wgrad = c->op >= OP_WGRAD_SET;
    size_t elem = wgrad ? 4 : 2, cnt = n0 / elem, bad = 0;
    for (size_t i = 0; i < cnt; i++) { // variant 0 finite (NaN poison overwritten)
        float f = wgrad ? ((float *)ref)[i] : bf2f(((uint16_t *)ref)[i]);
        bad += !isfinite(f);
    }
    char what[160];
    snprintf(what, sizeof what, "%s, variant 0: every element written, finite", name);
    gt_ok(bad == 0, "%s (%zu not)", what, bad);
    for (int k = quick ? 1 : 0; k < n_checked; k++) {
        void *got = run_output(c, checked[k], &n);
        snprintf(what, sizeof what, "%s, variant %d = variant %d", name, checked[k], variants[0]);
        gt_check_bits(what, got, ref, cnt, elem);
        free(got);
    }
    free(ref);
    if (wgrad) cudaMemcpyAsync(c->dw, c->dw0, n0, cudaMemcpyDeviceToDevice, cuda_stream());

    double flops = 2.0 * c->R * c->C * c->OC * (c->op == OP_PAIR ? 2 : 1);
    double t[N_VAR][ROUNDS];
    int rounds = quick ? 3 : ROUNDS;
    for (int rd = 0; rd < rounds; rd++)
        for (int k = 0; k < N_VAR; k++) {
            set_variant(variants[k]);
            t[k][rd] = time_ms(c);
        }
    cuda_grouped_set_variant(-1);
    for (int k = 0; k < N_VAR; k++) {
        float x[ROUNDS], ratio[ROUNDS];
        double lo = 1e30, hi = 0;
        for (int rd = 0; rd < rounds; rd++) {
            x[rd] = (float)t[k][rd];
            ratio[rd] = (float)(t[0][rd] / t[k][rd]);
            lo = t[k][rd] < lo ? t[k][rd] : lo;
            hi = t[k][rd] > hi ? t[k][rd] : hi;
        }
        double med = gt_median(x, rounds), rmed = gt_median(ratio, rounds);
        case_ms[n_cases][k] = med;
        row("| %s | %s | %.3f (%.3f..%.3f) | %.0f | %.3fx |\n", name, variant_name[k], med, lo, hi,
            flops / med / 1e9, rmed);
    }
    n_cases++;
}

int main(int argc, char **argv) {
    quick = argc > 2 && !strcmp(argv[2], "quick");
    sumsq = argc > 2 && !strcmp(argv[2], "sumsq");
    variant_name = all_variant_name;
    if (sumsq) {
        variants = sq_variants, N_VAR = 2, variant_name = sq_variant_name;
        checked = sq_checked, n_checked = 1;
    }
    // random top-8 routing of 8192 tokens over 64 experts (distinct per token)
    int off[N_EXP + 1];
    gt_random_offsets(off, TOKENS, N_EXP, TOP_K);
    int mn = 1 << 30, mx = 0;
    for (int e = 0; e < N_EXP; e++) {
        int c = off[e + 1] - off[e];
        mn = c < mn ? c : mn;
        mx = c > mx ? c : mx;
    }
    const int R = off[N_EXP], E = N_EXP;
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    row("- commit %s; device %s (%d SMs); date %s\n", MOECORE_BUILD_COMMIT, prop.name, prop.multiProcessorCount, date);
    row("- %d tokens x top-%d of %d experts, random routing: %d rows, %d..%d per expert\n", TOKENS, TOP_K, N_EXP, R,
        mn, mx);
    row("- each entry the median of %d runs after %d warm-ups (CUDA events); %d interleaved rounds of all variants: "
        "ms = median over rounds (min..max), vs %d = median of the rounds' variant-%d / variant time ratios; "
        "FLOPs 2 R C OC (pair: twice)\n\n",
        RUNS, WARMUP, quick ? 3 : ROUNDS, variants[0], variants[0]);
    row("| op | variant | ms | TFLOP/s | vs %d |\n|---|---|---:|---:|---:|\n", variants[0]);

    // one random host buffer (N(0, 1), BF16-representable) for every operand
    size_t big = (size_t)E * D_MODEL * HIDDEN, rows_big = (size_t)R * D_MODEL;
    size_t nh = big > rows_big ? big : rows_big;
    float *h = gt_malloc((nh + 32) * 4); // operands start at small offsets into it
    gt_fill(h, nh + 32, GT_NORMAL, 0, 1, 1, 19);
    float *h_dw = gt_malloc(big * 4);
    gt_fill(h_dw, big, GT_NORMAL, 0, 1, 0, 20);
    void *x_d = gt_dev_bf16(h, (size_t)R * D_MODEL), *x_h = gt_dev_bf16(h + 7, (size_t)R * HIDDEN);
    void *w_a = gt_dev_bf16(h + 3, big), *w_b = gt_dev_bf16(h + 5, big);
    void *g_h = gt_dev_bf16(h + 11, (size_t)R * HIDDEN), *g_h2 = gt_dev_bf16(h + 13, (size_t)R * HIDDEN);
    void *g_d = gt_dev_bf16(h + 17, (size_t)R * D_MODEL);
    void *res = cuda_alloc((size_t)R * D_MODEL * 2);
    float *dw = cuda_alloc(big * 4), *dw0 = gt_dev_bytes(h_dw, big * 4);
    int *doff = gt_dev_bytes(off, (E + 1) * sizeof(int));
    free(h);
    free(h_dw);

    // gate/up: C = d 2048 -> OC = hidden 1024 (inp x_d, dout g_h); down: C = hidden -> OC = d (inp x_h, dout g_d)
    double *sq = cuda_alloc(ops_wgrad_slots(E, D_MODEL, HIDDEN) * 8);
    Case base = {.E = E, .R = R, .doff = doff, .res = res, .dw = dw, .dw0 = dw0, .sq = sq};
    Case c;
    if (sumsq) {
        // each op on gate/up (C = d, OC = hidden) then down (C = hidden, OC = d)
        static const int ops[3] = {OP_WGRAD_SQ, OP_WGRAD_ADD, OP_WGRAD_ADD_SLOTS};
        static const char *what[3] = {"dw += and the slots", "dw += alone",
                                      "dw += then the slots from memory (reference)"};
        for (int k = 0; k < 6; k++) {
            int down = k & 1;
            c = base, c.op = ops[k / 2], c.C = down ? HIDDEN : D_MODEL, c.OC = down ? D_MODEL : HIDDEN;
            c.inp = down ? x_h : x_d, c.dout = down ? g_d : g_h;
            char name[96];
            snprintf(name, sizeof name, "weight-grad %s, %s", down ? "down" : "gate/up", what[k / 2]);
            bench_case(&c, name);
        }
        goto done;
    }
    c = base, c.op = OP_FWD, c.C = D_MODEL, c.OC = HIDDEN, c.inp = x_d, c.w = w_a;
    bench_case(&c, "forward gate/up 2048->1024");
    c = base, c.op = OP_FWD, c.C = HIDDEN, c.OC = D_MODEL, c.inp = x_h, c.w = w_a;
    bench_case(&c, "forward down 1024->2048");
    c = base, c.op = OP_DGRAD, c.C = HIDDEN, c.OC = D_MODEL, c.inp = x_h, c.w = w_a, c.dout = g_d;
    bench_case(&c, "data-grad down (dinp [R,1024])");
    c = base, c.op = OP_PAIR, c.C = D_MODEL, c.OC = HIDDEN, c.w = w_a, c.w2 = w_b, c.dout = g_h, c.dout2 = g_h2;
    bench_case(&c, "data-grad pair gate/up (dinp [R,2048])");
    c = base, c.op = OP_WGRAD_SET, c.C = D_MODEL, c.OC = HIDDEN, c.inp = x_d, c.dout = g_h;
    bench_case(&c, "weight-grad gate/up, dw =");
    c.op = OP_WGRAD_ADD;
    bench_case(&c, "weight-grad gate/up, dw +=");
    c = base, c.op = OP_WGRAD_SET, c.C = HIDDEN, c.OC = D_MODEL, c.inp = x_h, c.dout = g_d;
    bench_case(&c, "weight-grad down, dw =");
    c.op = OP_WGRAD_ADD;
    bench_case(&c, "weight-grad down, dw +=");

done:;
    // the variant (not the diagnostic one) with the least time per layer and micro-batch
    int best = 0;
    double best_ms = 1e30;
    row("\n| variant | ms per MoE layer and micro-batch (weighted sum of the rows) |\n|---|---:|\n");
    for (int k = 0; k < N_VAR; k++) {
        if (variants[k] & 4) continue;
        double sum = 0;
        for (int i = 0; i < (sumsq ? 4 : n_cases); i++) sum += (sumsq ? 1 : per_layer[i]) * case_ms[i][k]; // sumsq: not the 2 reference rows
        row("| %s | %.3f |\n", variant_name[k], sum);
        if (sum < best_ms) best_ms = sum, best = variants[k];
    }
    if (gt_fail) { // a variant that does not give variant 0's bits is no candidate
        row("\n(checks failed: variant %d kept)\n", variants[0]);
        best = variants[0];
    }
    printf("\n%s\n", table);
    printf("BEST_VARIANT=%d\n", best);
    if (argc > 1) {
        FILE *f = fopen(argv[1], "w");
        if (f) {
            fputs(table, f);
            fclose(f);
        }
    }
    cuda_free(x_d); cuda_free(x_h); cuda_free(w_a); cuda_free(w_b); cuda_free(g_h); cuda_free(g_h2);
    cuda_free(g_d); cuda_free(res); cuda_free(dw); cuda_free(dw0); cuda_free(doff); cuda_free(sq);
    return gt_finish();
}
