// The kernel table: the CUDA backend's kernels on OLMoE-1B-7B's shapes
// (d_model 2048, 16 heads of 128, sequence 4096, 64 experts top-8 => 32768
// grouped rows, expert hidden 1024, vocab 50304), for one run on an H200.
// Each row is a time and a rate, and each kernel is validated in the same
// run against the CPU backend (ops_cpu, FP32) on the same inputs. It prints
// the table as markdown and writes it to argv[1] when given (rewritten after
// each section, and by an exit handler if a CUDA error stops the run, marked
// INCOMPLETE); argv[2], when given, names the sections to run ("attention",
// "gemm,memory"; default all). Not a test_* program, so scripts/gpu-check.sh's test loop
// leaves it out; `gpu-check.sh kernels` runs it. Ends with "N passed, N
// failed" and exits 1 when a check failed.
//
// Sections
// 1. Grouped GEMM of the experts, gate/up (C 2048 -> OC 1024) and down
//    (1024 -> 2048), with row counts from a random top-8 routing of 4096
//    tokens: forward, data-grad (dinp only) and weight-grad (dw only, +=)
//    through cuda_grouped_matmul_forward / _backward, i.e. whichever kernel
//    production picks (the device.cuda defaults, printed in the header). Beside
//    them (a) the same 64 products as a per-expert cuBLASLt loop with the
//    host-known counts (cuda_matmul_forward / _backward on row ranges with
//    per-expert weight pointers), once launched from the host (what a
//    PyTorch-style loop costs, launch gaps included) and once replayed as one
//    CUDA graph (the loop's GPU time alone), and (b) one dense cuBLASLt
//    product of the same size (all R rows against expert 0's weights).
//    TFLOP/s at 2 R C OC for all of them.
// 2. Causal attention forward and backward, B=1 T=4096 H=KV=16 hd=128;
//    the forward and the backward under both device.cuda.attention_fwd /
//    attention_bwd choices (TMA + wgmma, mma.sync), the default first. FLOPs: forward 4 B H T^2 hd / 2 (two
//    matmuls, halved for causality), backward 2.5 x forward. The backward
//    also runs twice on one input set: the same bits.
// 3. Memory-bound kernels: GB/s with every buffer counted once (each input
//    read once, each output written once; accumulated outputs read and
//    written; the bytes are stated per row), against a measured
//    cudaMemcpyAsync device-to-device rate of a 1 GiB buffer (read + write).
//
// Method, every timed row
// - median of RUNS timed runs after WARMUP warm-ups, CUDA events on the
//   backend's stream around the op alone;
// - before each run (outside the events): assigned outputs are filled with
//   NaN, accumulated outputs and in-place inputs are restored from a saved
//   device copy, and L2 is flushed by sum_squares over 4 x L2 of FP32. The
//   flush only reads: a memset flush would leave dirty lines whose
//   write-back the timed kernel would pay for;
// - inputs rotate over MAXSETS sets where one set fits in 2 x L2 (the flush
//   already empties L2; rotation also keeps the inputs distinct run to run);
// - inputs are random, BF16-representable where the GPU reads BF16, fresh
//   for each kernel, never zero;
// - after timing, the assigned outputs of the last timed run must be all
//   finite: every element was written again after the NaN fill.
//
// Validation: a first run (set 0, outputs poisoned or prefilled like the
// timed runs) against the CPU backend on the same values: relative L2 error
// ||gpu - cpu|| / ||cpu|| over the whole output, every element finite.
// Tolerances are the GPU tests' (see the bounds of test_backend_ops.c for
// why each holds):
//   BF16 outputs 1e-2; FP32 dw of the GEMMs 1e-2; FP32 outputs of the
//   memory-bound kernels 1e-5; unpermute's dweights (dots over C) 1e-4;
//   attention 1e-2; gathers, copies and the BF16 casts exact (bits).
// What is validated in full and what on a subset:
// - GEMMs: everything, every expert's rows and all of dw, for every
//   implementation. The CPU references are OpenBLAS SGEMMs of the same sizes
//   as the GPU's (137 GFLOP each for the grouped products and as much for the
//   dense one; about 1.6 TFLOP in all, seconds at the ~0.5-1 TFLOP/s of the
//   H200 host's 16 cores);
// - attention: 4 of the 16 heads (0, 5, 10, 15; heads are independent with
//   KV = H) on the CPU, whose reference is naive loops holding [H, T, T]
//   probabilities (64 MB a head); all heads must be finite. The forward's
//   log-sum-exp is checked finite only: the backward reads it, so an error
//   there shows in dq, dk, dv;
// - memory-bound kernels: everything.
// Expected run time: one to two minutes, nearly all host work (random
// inputs, CPU references, ~20 GB of pageable transfers, comparisons); the
// timed GPU work is a few seconds. gpu-check.sh gives it 400 s.
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_test_util.h"
#include "ops/ops.h"

// ops_cuda.cu (declared only in cuda_common.cuh, which is C++)
cudaStream_t cuda_stream(void);

#ifndef MOECORE_BUILD_COMMIT // the Makefile passes `git describe --always --dirty`
#define MOECORE_BUILD_COMMIT ""
#endif

#define WARMUP 5
#define RUNS 20
#define MAXSETS 4

#define TOL_BF16 1e-2
#define TOL_DW 1e-2
#define TOL_F32 1e-5
#define TOL_DOT 1e-4
#define TOL_ATT 1e-2
#define EXACT 0.0

// OLMoE-1B-7B (overridable only to try the program out on small shapes)
#ifndef D_MODEL
#define D_MODEL 2048
#define N_HEADS 16 // at least 16: heads 0, 5, 10, 15 are validated
#define HEAD_DIM 128
#define SEQ 4096
#define N_EXP 64
#define TOP_K 8
#define EXP_HIDDEN 1024
#define VOCAB 50304
#define BIG ((size_t)256 << 20) // elements of the optimizer-sized buffers
#define COPY_BYTES ((size_t)1 << 30)
#endif
#define NORM_EPS 1e-5f

static cudaStream_t st;
static cudaEvent_t ev0, ev1;
static size_t l2_bytes;
static float *flush_buf; // read by sum_squares to empty L2 before each run
static size_t flush_n;
static double *flush_acc;
static double copy_gbs; // the measured device-to-device copy rate
static double t_start;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void ck_(cudaError_t e, const char *call, int line) {
    if (e != cudaSuccess) {
        fprintf(stderr, "bench_kernels: CUDA error %s in %s at line %d\n", cudaGetErrorString(e), call, line);
        exit(3);
    }
}
#define CK(call) ck_((call), #call, __LINE__)

// ---- buffers ----------------------------------------------------------------------
// Host and device buffers of one case, freed together by release(); the
// few that live across cases use malloc / cuda_alloc directly.

static void *hbufs[256];
static int nhbufs;
static void *dbufs[256];
static int ndbufs;

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes + 16);
    if (!p) { fprintf(stderr, "bench_kernels: out of host memory (%zu bytes)\n", bytes); exit(2); }
    return p;
}
static void *halloc(size_t bytes) {
    if (nhbufs == 256) { fprintf(stderr, "bench_kernels: too many host buffers\n"); exit(2); }
    return hbufs[nhbufs++] = xmalloc(bytes);
}
static float *hf(size_t n) { return halloc(n * sizeof(float)); }
static int *hi(size_t n) { return halloc(n * sizeof(int)); }
static float *dupf(const float *x, size_t n) { return memcpy(hf(n), x, n * sizeof(float)); }
static void *dalloc(size_t bytes) {
    if (ndbufs == 256) { fprintf(stderr, "bench_kernels: too many device buffers\n"); exit(2); }
    return dbufs[ndbufs++] = cuda_alloc(bytes);
}
static void release(void) {
    for (int i = 0; i < nhbufs; i++) free(hbufs[i]);
    for (int i = 0; i < ndbufs; i++) cuda_free(dbufs[i]);
    nhbufs = ndbufs = 0;
}

// ---- random inputs ------------------------------------------------------------------

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static uint64_t seed_state = 0x243f6a8885a308d3ULL; // one seed per rnd() call
static uint64_t host_rng = 0x13198a2e03707344ULL;   // serial draws: routing, tokens
static int irand(int n) { return (int)(splitmix64(&host_rng) % (uint64_t)n); }

// n floats offset + scale * u, u uniform in [-1, 1) and never 0, rounded
// through BF16 when bf16 (so that both sides see the same values).
// Parallel over chunks with their own xorshift streams: the largest inputs
// have 256M elements.
#define RCHUNK 65536
static float *rnd(size_t n, float offset, float scale, int bf16) {
    float *p = hf(n);
    uint64_t base = splitmix64(&seed_state);
    long nchunks = (long)((n + RCHUNK - 1) / RCHUNK);
#pragma omp parallel for schedule(static)
    for (long c = 0; c < nchunks; c++) {
        uint64_t s = base ^ ((uint64_t)c * 0xd1b54a32d192ed03ULL);
        s = splitmix64(&s) | 1;
        size_t i0 = (size_t)c * RCHUNK, i1 = i0 + RCHUNK < n ? i0 + RCHUNK : n;
        for (size_t i = i0; i < i1; i++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            float u = (float)((s >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f;
            if (u == 0.f) u = 0.5f;
            float x = offset + scale * u;
            p[i] = bf16 ? bf2f(f2bf(x)) : x;
        }
    }
    return p;
}

// Random top-k routing: each token picks k distinct experts uniformly.
static void random_topk(int *idx, int N, int E, int k) {
    int perm[256];
    for (int n = 0; n < N; n++) {
        for (int e = 0; e < E; e++) perm[e] = e;
        for (int s = 0; s < k; s++) {
            int j = s + irand(E - s), t = perm[s];
            perm[s] = perm[j];
            perm[j] = t;
            idx[(size_t)n * k + s] = perm[s];
        }
    }
}

// ---- transfers -------------------------------------------------------------------------

static void up_bf16(void *d, const float *h, size_t n) {
    uint16_t *b = xmalloc(n * 2);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) b[i] = f2bf(h[i]);
    cuda_to_device(d, b, n * 2);
    free(b);
}
static void *d_bf16(const float *h, size_t n) {
    void *d = dalloc(n * 2);
    up_bf16(d, h, n);
    return d;
}
static void *d_copy(const void *h, size_t bytes) {
    void *d = dalloc(bytes);
    cuda_to_device(d, h, bytes);
    return d;
}
// device -> host floats (caller frees)
static float *down_bf16(const void *d, size_t n) {
    uint16_t *b = xmalloc(n * 2);
    cuda_to_host(b, d, n * 2);
    float *f = xmalloc(n * 4);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) f[i] = bf2f(b[i]);
    free(b);
    return f;
}
static float *down_f32(const void *d, size_t n) {
    float *f = xmalloc(n * 4);
    cuda_to_host(f, d, n * 4);
    return f;
}
// elements of a device buffer (BF16, or FP32 when f32) that are not finite
static size_t count_nonfinite(const void *d, size_t n, int f32) {
    size_t bad = 0;
    if (f32) {
        float *f = down_f32(d, n);
#pragma omp parallel for reduction(+ : bad)
        for (size_t i = 0; i < n; i++) bad += !isfinite(f[i]);
        free(f);
    } else {
        uint16_t *b = xmalloc(n * 2);
        cuda_to_host(b, d, n * 2);
#pragma omp parallel for reduction(+ : bad)
        for (size_t i = 0; i < n; i++) bad += (b[i] & 0x7f80) == 0x7f80;
        free(b);
    }
    return bad;
}

// ---- rows of the table ------------------------------------------------------------------

enum { SEC_GEMM, SEC_ATTN, SEC_MEM };
typedef struct {
    int sec;
    char op[64], shape[64], impl[96], bytes_note[192];
    double flops, bytes;  // per run: the rate is flops (SEC_GEMM, SEC_ATTN) or bytes (SEC_MEM) over ms
    double ms, min_ms, max_ms; // median; ms < 0: not timed
    double dense_ms;      // SEC_GEMM: the dense cuBLASLt time of the same op and layer
    char check[400];      // "what err (tol); ..."
    int nchecks, failed;
} Row;
#define MAXROWS 96
static Row rows[MAXROWS];
static int nrows;
static Row *cur; // the row that checks and timings go to

static Row *row_begin(int sec, const char *op, const char *shape, const char *impl) {
    if (nrows == MAXROWS) { fprintf(stderr, "bench_kernels: too many rows\n"); exit(2); }
    cur = &rows[nrows++];
    memset(cur, 0, sizeof *cur);
    cur->sec = sec;
    cur->ms = cur->dense_ms = -1;
    snprintf(cur->op, sizeof cur->op, "%s", op);
    snprintf(cur->shape, sizeof cur->shape, "%s", shape);
    snprintf(cur->impl, sizeof cur->impl, "%s", impl);
    printf("-- %s %s %s\n", op, shape, impl);
    return cur;
}
// a memory-bound row: bytes moved per run and how they were counted
static Row *row_mem(const char *op, const char *shape, double bytes, const char *bytes_note) {
    Row *r = row_begin(SEC_MEM, op, shape, "");
    r->bytes = bytes;
    snprintf(r->bytes_note, sizeof r->bytes_note, "%s", bytes_note);
    return r;
}

static void note(const char *fmt, ...) {
    char tmp[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    size_t len = strlen(cur->check);
    snprintf(cur->check + len, sizeof cur->check - len, "%s%s", len ? "; " : "", tmp);
}
static void count(int ok) {
    cur->nchecks++;
    if (ok) gt_pass++;
    else { gt_fail++; cur->failed = 1; }
}
static const char *tolstr(double tol, char *buf, size_t len) {
    if (tol == 0) snprintf(buf, len, "exact");
    else snprintf(buf, len, "%.0e", tol);
    return buf;
}

// row labels (row_begin copies them)
static char shp[160];
#define SHAPE(...) (snprintf(shp, sizeof shp, __VA_ARGS__), shp)

// ---- checks -------------------------------------------------------------------------

// relative L2 error <= tol and every element finite (NaN fills left
// unwritten fail here)
static int check_vals(const char *what, const float *got, const float *ref, size_t n, double tol) {
    double d = 0, r = 0;
    size_t bad = 0;
#pragma omp parallel for reduction(+ : d, r, bad)
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) { bad++; continue; }
        double e = (double)got[i] - ref[i];
        d += e * e;
        r += (double)ref[i] * ref[i];
    }
    double err = r > 0 ? sqrt(d / r) : sqrt(d);
    int ok = bad == 0 && err <= tol;
    char tb[16];
    tolstr(tol, tb, sizeof tb);
    printf("%s %s %s %s: rel err %.3e (tol %s)", ok ? "ok  " : "FAIL", cur->op, cur->impl, what, err, tb);
    if (bad) printf(", %zu of %zu elements not finite", bad, n);
    printf("\n");
    if (bad) note("%s %zu/%zu NOT FINITE", what, bad, n);
    else if (tol == 0) note("%s %s%s", what, err == 0 ? "exact" : "NOT EXACT", err == 0 ? "" : " (want exact)");
    else note("%s %.1e (%s)%s", what, err, tb, ok ? "" : " TOO LARGE");
    count(ok);
    return ok;
}
static int check_bf16(const char *what, const void *d, const float *ref, size_t n, double tol) {
    float *got = down_bf16(d, n);
    int ok = check_vals(what, got, ref, n, tol);
    free(got);
    return ok;
}
static int check_f32(const char *what, const void *d, const float *ref, size_t n, double tol) {
    float *got = down_f32(d, n);
    int ok = check_vals(what, got, ref, n, tol);
    free(got);
    return ok;
}
// BF16 bit patterns, exactly
static int check_bits(const char *what, const uint16_t *got, const uint16_t *ref, size_t n) {
    size_t bad = 0;
#pragma omp parallel for reduction(+ : bad)
    for (size_t i = 0; i < n; i++) bad += got[i] != ref[i];
    printf("%s %s %s: %zu of %zu differ\n", bad ? "FAIL" : "ok  ", cur->op, what, bad, n);
    if (bad) note("%s %zu/%zu BITS DIFFER", what, bad, n);
    else note("%s exact", what);
    count(!bad);
    return !bad;
}
// every element of a device buffer finite (written over the NaN fill)
static int check_written(const char *what, const void *d, size_t n, int f32) {
    size_t bad = count_nonfinite(d, n, f32);
    printf("%s %s %s %s: %zu of %zu not finite\n", bad ? "FAIL" : "ok  ", cur->op, cur->impl, what, bad, n);
    if (bad) note("%s %zu/%zu NOT WRITTEN", what, bad, n);
    count(!bad);
    return !bad;
}
// the increment of an accumulated double against the CPU's
static int check_acc(const char *what, double got, double ref, double prefill) {
    float g = (float)(got - prefill), r = (float)(ref - prefill);
    return check_vals(what, &g, &r, 1, TOL_F32);
}

// ---- timing -----------------------------------------------------------------------

typedef struct {
    void (*run)(void *ctx, int set);
    void *ctx;
    int nsets;
    int npoison; // assigned outputs: NaN before each run, all written after (scratch: NaN only)
    void *poison[4];
    size_t poison_n[4];
    int poison_f32[4], poison_scratch[4];
    int nrestore; // accumulated outputs, in-place inputs: dst <- src before each run
    void *rdst[4];
    const void *rsrc[4];
    size_t rbytes[4];
} Timed;

static void add_poison(Timed *t, void *d, size_t n, int f32) {
    t->poison[t->npoison] = d;
    t->poison_n[t->npoison] = n;
    t->poison_scratch[t->npoison] = 0;
    t->poison_f32[t->npoison++] = f32;
}
// scratch the op may not rely on between calls: NaN before each run, not checked after
static void add_scratch(Timed *t, void *d, size_t n) {
    add_poison(t, d, n, 1);
    t->poison_scratch[t->npoison - 1] = 1;
}
static void add_restore(Timed *t, void *dst, const void *src, size_t bytes) {
    t->rdst[t->nrestore] = dst;
    t->rsrc[t->nrestore] = src;
    t->rbytes[t->nrestore++] = bytes;
}
static void prepare(const Timed *t) {
    for (int i = 0; i < t->npoison; i++)
        CK(cudaMemsetAsync(t->poison[i], 0xff, t->poison_n[i] * (t->poison_f32[i] ? 4 : 2), st));
    for (int i = 0; i < t->nrestore; i++)
        CK(cudaMemcpyAsync(t->rdst[i], t->rsrc[i], t->rbytes[i], cudaMemcpyDeviceToDevice, st));
    cuda_sum_squares(flush_acc, flush_buf, flush_n);
}
// the validation run
static void run_once(const Timed *t, int set) {
    prepare(t);
    t->run(t->ctx, set);
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
}
static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}
static void time_it(const Timed *t) {
    float ms[RUNS];
    int nsets = t->nsets > 0 ? t->nsets : 1;
    for (int i = -WARMUP; i < RUNS; i++) {
        prepare(t);
        CK(cudaEventRecord(ev0, st));
        t->run(t->ctx, (i + WARMUP) % nsets);
        CK(cudaEventRecord(ev1, st));
        CK(cudaEventSynchronize(ev1));
        CK(cudaGetLastError());
        if (i >= 0) CK(cudaEventElapsedTime(&ms[i], ev0, ev1));
    }
    qsort(ms, RUNS, sizeof(float), cmp_float);
    cur->ms = 0.5 * (ms[RUNS / 2 - 1] + ms[RUNS / 2]);
    cur->min_ms = ms[0];
    cur->max_ms = ms[RUNS - 1];
    if (cur->sec == SEC_MEM)
        printf("time %s %s: %.1f us (min %.1f, max %.1f), %.0f GB/s\n", cur->op, cur->shape, cur->ms * 1e3,
               cur->min_ms * 1e3, cur->max_ms * 1e3, cur->bytes / (cur->ms * 1e-3) / 1e9);
    else
        printf("time %s %s %s: %.3f ms (min %.3f, max %.3f), %.1f TFLOP/s\n", cur->op, cur->shape, cur->impl, cur->ms,
               cur->min_ms, cur->max_ms, cur->flops / (cur->ms * 1e-3) / 1e12);
    for (int i = 0; i < t->npoison; i++) {
        if (t->poison_scratch[i]) continue;
        size_t bad = count_nonfinite(t->poison[i], t->poison_n[i], t->poison_f32[i]);
        if (bad) {
            printf("FAIL %s %s: the last timed run left %zu of %zu elements of output %d unwritten\n", cur->op,
                   cur->impl, bad, t->poison_n[i], i);
            note("LAST TIMED RUN LEFT %zu NaN in output %d", bad, i);
            count(0);
        }
    }
}
// input sets to rotate over: MAXSETS when one set fits in 2 x L2
static int sets_for(size_t set_bytes) { return set_bytes <= 2 * l2_bytes ? MAXSETS : 1; }

// ---- the table ----------------------------------------------------------------------

static const char *table_path;
static int table_done;
static char header[2048], gemm_note[512];

static void rate_cells(const Row *r, char *ms, char *rate, size_t len) {
    if (r->ms < 0) {
        snprintf(ms, len, "n/a");
        snprintf(rate, len, "n/a");
    } else if (r->sec == SEC_MEM) {
        snprintf(ms, len, "%.1f", r->ms * 1e3);
        snprintf(rate, len, "%.0f", r->bytes / (r->ms * 1e-3) / 1e9);
    } else {
        snprintf(ms, len, "%.3f", r->ms);
        snprintf(rate, len, "%.1f", r->flops / (r->ms * 1e-3) / 1e12);
    }
}
static const char *verdict(const Row *r) { return r->nchecks == 0 ? "-" : r->failed ? "**FAIL**" : "PASS"; }

static void write_table(FILE *f, int complete) {
    fprintf(f, "# moecore kernel table\n\n%s\n", header);
    if (!complete) fprintf(f, "**INCOMPLETE: the run stopped before the end; see its log.**\n\n");
    fprintf(f, "Timing: median of %d runs after %d warm-ups (CUDA events around the op alone). Before each run: "
               "outputs filled with NaN (accumulated outputs and in-place inputs restored), L2 flushed by reading "
               "%.0f MiB; inputs rotate over %d sets where one set fits in 2 x L2; the last timed run's outputs "
               "must be fully written. Validation: first run against the CPU backend (FP32) on the same "
               "BF16-representable inputs, relative L2 error (tolerance).\n\n",
            RUNS, WARMUP, flush_n * 4.0 / 1048576, MAXSETS);

    fprintf(f, "## 1. Grouped GEMM (experts)\n\n%s\n\n", gemm_note);
    fprintf(f, "| op | layer, shape | implementation | ms | TFLOP/s | vs dense | validation: rel. L2 err (tol) | check |\n"
               "|---|---|---|---:|---:|---:|---|---|\n");
    char ms[32], rate[32], vs[32];
    for (int i = 0; i < nrows; i++) {
        const Row *r = &rows[i];
        if (r->sec != SEC_GEMM) continue;
        rate_cells(r, ms, rate, sizeof ms);
        if (r->ms > 0 && r->dense_ms > 0) snprintf(vs, sizeof vs, "%.0f%%", 100 * r->dense_ms / r->ms);
        else snprintf(vs, sizeof vs, "n/a");
        fprintf(f, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", r->op, r->shape, r->impl, ms, rate, vs, r->check,
                verdict(r));
    }

    fprintf(f, "\n## 2. Attention (causal)\n\nFLOPs: forward 4·B·H·T²·hd/2 (QKᵀ and PV, halved for causality), "
               "backward 2.5 × forward. Validated on heads 0, 5, 10, 15 (all heads must be finite).\n\n");
    fprintf(f, "| op | shape | ms | TFLOP/s | validation: rel. L2 err (tol) | check |\n|---|---|---:|---:|---|---|\n");
    for (int i = 0; i < nrows; i++) {
        const Row *r = &rows[i];
        if (r->sec != SEC_ATTN) continue;
        rate_cells(r, ms, rate, sizeof ms);
        fprintf(f, "| %s | %s | %s | %s | %s | %s |\n", r->op, r->shape, ms, rate, r->check, verdict(r));
    }

    fprintf(f, "\n## 3. Memory-bound kernels\n\nGB/s = bytes counted / time, every buffer once (inputs read once, "
               "outputs written once, accumulated outputs read and written; gathered rows counted once; "
               "scratch of sorts and reductions not counted), against the measured cudaMemcpyAsync "
               "device-to-device rate (%zu MiB, read + write counted).\n\n", COPY_BYTES >> 20);
    fprintf(f, "| kernel | shape | bytes counted | MB | µs | GB/s | of copy | validation: rel. L2 err (tol) | check |\n"
               "|---|---|---|---:|---:|---:|---:|---|---|\n");
    for (int i = 0; i < nrows; i++) {
        const Row *r = &rows[i];
        if (r->sec != SEC_MEM) continue;
        rate_cells(r, ms, rate, sizeof ms);
        if (r->ms > 0 && copy_gbs > 0) snprintf(vs, sizeof vs, "%.0f%%", 100 * r->bytes / (r->ms * 1e-3) / 1e9 / copy_gbs);
        else snprintf(vs, sizeof vs, "n/a");
        fprintf(f, "| %s | %s | %s | %.1f | %s | %s | %s | %s | %s |\n", r->op, r->shape, r->bytes_note, r->bytes / 1e6,
                ms, rate, vs, r->check[0] ? r->check : "-", verdict(r));
    }
    fprintf(f, "\n%d checks: %d passed, %d failed. Run time %.0f s.\n", gt_pass + gt_fail, gt_pass, gt_fail,
            now() - t_start);
}

static void save_table(int complete) {
    if (!table_path) return;
    FILE *f = fopen(table_path, "w");
    if (!f) { fprintf(stderr, "bench_kernels: cannot write %s\n", table_path); return; }
    write_table(f, complete);
    fclose(f);
}
// a CUDA error anywhere (the backend exits on its own) still leaves the
// rows measured so far in the file
static void save_partial_table(void) {
    if (!table_done) save_table(0);
}

static void device_info(void) {
    int dev, drv = 0, rtv = 0;
    CK(cudaGetDevice(&dev));
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    CK(cudaDriverGetVersion(&drv));
    CK(cudaRuntimeGetVersion(&rtv));
    l2_bytes = prop.l2CacheSize > 0 ? (size_t)prop.l2CacheSize : (size_t)50 << 20;
    // the kernel driver's version, from its first line ("... Kernel Module  580.95.05  ...")
    char nvrm[32] = "?", line[512];
    FILE *f = fopen("/proc/driver/nvidia/version", "r");
    if (f) {
        if (fgets(line, sizeof line, f))
            for (char *tok = strtok(line, " \t\n"); tok; tok = strtok(NULL, " \t\n"))
                if (tok[0] >= '0' && tok[0] <= '9' && strchr(tok, '.')) {
                    snprintf(nvrm, sizeof nvrm, "%s", tok);
                    break;
                }
        fclose(f);
    }
    const char *commit = getenv("MOECORE_COMMIT");
    char date[40];
    time_t tnow = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&tnow));
    const CudaSettings *cs = cuda_settings();
    const char *e4 = getenv("OMP_NUM_THREADS");
    snprintf(header, sizeof header,
             "- device: %s (sm_%d%d, %d SMs, %.1f GiB, L2 %.0f MiB)\n"
             "- driver %s (CUDA driver API %d.%d), CUDA runtime %d.%d\n"
             "- commit: %s (MOECORE_COMMIT); binary built from %s\n"
             "- date: %s; device.cuda: grouped_gemm %s, grouped_wgrad %s, gemm_tma %s, attention_ds_mib %d, "
             "attention_fwd %s, attention_bwd %s; "
             "OMP_NUM_THREADS=%s\n",
             prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0,
             l2_bytes / 1048576.0, nvrm, drv / 1000, drv % 1000 / 10, rtv / 1000, rtv % 1000 / 10,
             commit && *commit ? commit : "unset", MOECORE_BUILD_COMMIT[0] ? MOECORE_BUILD_COMMIT : "unknown", date,
             cuda_kernels_name(cs->grouped_gemm), cuda_kernels_name(cs->grouped_wgrad), cs->gemm_tma ? "true" : "false", cs->attention_ds_mib,
             cuda_kernels_name(cs->attention_fwd), cuda_kernels_name(cs->attention_bwd), e4 ? e4 : "unset");
    printf("%s", header);
}

// ---- 1. grouped GEMM --------------------------------------------------------------

enum { OP_FWD, OP_DGRAD, OP_WGRAD };
enum { IMPL_GROUPED, IMPL_LOOP, IMPL_GRAPH, IMPL_DENSE, N_IMPL };
static const char *gemm_op_name[] = {"forward", "data-grad (dinp only)", "weight-grad (dw only, +=)"};
static const char *gemm_impl_name[] = {"grouped (production: cuda_grouped_matmul_*)",
                                       "per-expert cuBLASLt loop, 64 host launches",
                                       "per-expert cuBLASLt loop, one CUDA graph",
                                       "dense cuBLASLt, R rows x expert 0's weights"};

typedef struct {
    int E, C, OC, R, op;
    const int *off; // host offsets [E+1]
    int *d_off;
    void *inp, *w, *dout; // [R,C], [E,OC,C], [R,OC]
    void *res;            // forward out [R,OC] or data-grad dinp [R,C]
    float *dw;            // weight-grad: [E,OC,C] (dense: [OC,C])
    void *graph;
} Gemm;

static void gemm_grouped(void *p, int set) {
    Gemm *g = p;
    (void)set;
    if (g->op == OP_FWD) cuda_grouped_matmul_forward(g->res, g->inp, g->w, g->d_off, g->E, g->C, g->OC);
    else if (g->op == OP_DGRAD)
        cuda_grouped_matmul_backward(g->res, NULL, g->dout, g->inp, g->w, g->d_off, g->E, g->C, g->OC, 1);
    else cuda_grouped_matmul_backward(NULL, g->dw, g->dout, g->inp, g->w, g->d_off, g->E, g->C, g->OC, 1);
}
// the same products, one cuBLASLt call per expert with the host's counts
static void gemm_loop(void *p, int set) {
    Gemm *g = p;
    (void)set;
    size_t wsz = (size_t)g->OC * g->C;
    for (int e = 0; e < g->E; e++) {
        int r0 = g->off[e], n = g->off[e + 1] - r0;
        if (n == 0) continue;
        const char *inp = (const char *)g->inp + (size_t)r0 * g->C * 2;
        const char *dout = (const char *)g->dout + (size_t)r0 * g->OC * 2;
        const char *w = (const char *)g->w + e * wsz * 2;
        if (g->op == OP_FWD) cuda_matmul_forward((char *)g->res + (size_t)r0 * g->OC * 2, inp, w, n, g->C, g->OC);
        else if (g->op == OP_DGRAD)
            cuda_matmul_backward((char *)g->res + (size_t)r0 * g->C * 2, NULL, dout, inp, w, n, g->C, g->OC, 0);
        else cuda_matmul_backward(NULL, g->dw + e * wsz, dout, inp, w, n, g->C, g->OC, 0);
    }
}
static void gemm_graph(void *p, int set) {
    (void)set;
    cuda_graph_launch(((Gemm *)p)->graph);
}
// one product of the same size: all R rows against expert 0's weights
static void gemm_dense(void *p, int set) {
    Gemm *g = p;
    (void)set;
    if (g->op == OP_FWD) cuda_matmul_forward(g->res, g->inp, g->w, g->R, g->C, g->OC);
    else if (g->op == OP_DGRAD) cuda_matmul_backward(g->res, NULL, g->dout, g->inp, g->w, g->R, g->C, g->OC, 0);
    else cuda_matmul_backward(NULL, g->dw, g->dout, g->inp, g->w, g->R, g->C, g->OC, 0);
}

// One op of one layer shape: fresh inputs, the CPU references (grouped and
// dense), then each implementation validated in full and timed. The inputs
// are 64-256 MB each, over 2 x L2: no rotation.
static void gemm_case(const char *layer, int C, int OC, int op, const int *off) {
    const int E = N_EXP, R = off[N_EXP];
    size_t nin = (size_t)R * C, nw = (size_t)E * OC * C, nout = (size_t)R * OC, nwe = (size_t)OC * C;
    char shape[64];
    snprintf(shape, sizeof shape, "%s: R=%d, %d -> %d", layer, R, C, OC);
    printf("== grouped GEMM %s, %s\n", gemm_op_name[op], shape);
    fflush(stdout);
    double t0 = now();
    float *inp = rnd(nin, 0, 1, 1), *w = rnd(nw, 0, 1 / sqrtf((float)C), 1), *dout = rnd(nout, 0, 1, 1);
    Gemm g = {.E = E, .C = C, .OC = OC, .R = R, .op = op, .off = off};
    g.d_off = d_copy(off, (E + 1) * sizeof(int));
    g.inp = d_bf16(inp, nin);
    g.w = d_bf16(w, nw);
    g.dout = d_bf16(dout, nout);

    // references: ref for the grouped and per-expert products, refd for the dense one
    size_t nres = op == OP_FWD ? nout : nin;
    float *ref, *refd, *d_dw = NULL, *d_dw0 = NULL, *d_dwd = NULL, *d_dwd0 = NULL;
    if (op == OP_FWD) {
        ref = hf(nout);
        refd = hf(nout);
        ops_cpu.grouped_matmul_forward(ref, inp, w, off, E, C, OC);
        ops_cpu.matmul_forward(refd, inp, w, R, C, OC);
    } else if (op == OP_DGRAD) {
        ref = hf(nin);
        refd = hf(nin);
        ops_cpu.grouped_matmul_backward(ref, NULL, dout, inp, w, off, E, C, OC, 1);
        ops_cpu.matmul_backward(refd, NULL, dout, inp, w, R, C, OC, 0);
    } else { // dw accumulates: both sides start from the same random FP32 values
        float *dw0 = rnd(nw, 0, 1, 0);
        ref = dupf(dw0, nw);
        refd = dupf(dw0, nwe);
        ops_cpu.grouped_matmul_backward(NULL, ref, dout, inp, w, off, E, C, OC, 1);
        ops_cpu.matmul_backward(NULL, refd, dout, inp, w, R, C, OC, 0);
        d_dw0 = d_copy(dw0, nw * 4);
        d_dwd0 = d_copy(dw0, nwe * 4);
        d_dw = dalloc(nw * 4);
        d_dwd = dalloc(nwe * 4);
    }
    if (op != OP_WGRAD) g.res = dalloc(nres * 2);
    printf("   inputs and CPU references: %.1f s\n", now() - t0);

    int first = nrows;
    for (int impl = 0; impl < N_IMPL; impl++) {
        Row *r = row_begin(SEC_GEMM, gemm_op_name[op], shape, gemm_impl_name[impl]);
        r->flops = 2.0 * R * C * OC;
        int dense = impl == IMPL_DENSE;
        Timed t = {.ctx = &g, .nsets = 1};
        t.run = impl == IMPL_GROUPED ? gemm_grouped : impl == IMPL_LOOP ? gemm_loop : impl == IMPL_GRAPH ? gemm_graph
                                                                                                         : gemm_dense;
        if (op == OP_WGRAD) {
            g.dw = dense ? d_dwd : d_dw;
            add_restore(&t, g.dw, dense ? d_dwd0 : d_dw0, (dense ? nwe : nw) * 4);
        } else {
            add_poison(&t, g.res, nres, 0);
        }
        if (impl == IMPL_GRAPH) { // the loop above ran already: its cuBLASLt plans are cached
            char err[256] = "";
            cuda_capture_begin();
            gemm_loop(&g, 0);
            g.graph = cuda_capture_end(err, sizeof err);
            if (!g.graph) {
                printf("   capture failed: %s\n", err);
                note("not run: capture failed (%.120s)", err);
                continue;
            }
        }
        run_once(&t, 0);
        if (op == OP_WGRAD) check_f32("dw", g.dw, dense ? refd : ref, dense ? nwe : nw, TOL_DW);
        else check_bf16(op == OP_FWD ? "out" : "dinp", g.res, dense ? refd : ref, nres, TOL_BF16);
        time_it(&t);
        if (g.graph) {
            cuda_graph_free(g.graph);
            g.graph = NULL;
        }
    }
    for (int i = first; i < nrows; i++) rows[i].dense_ms = rows[nrows - 1].ms;
    release();
}

static void section_gemm(void) {
    printf("\n==== 1. grouped GEMM\n");
    // rows per expert of a random top-8 routing of 4096 tokens, as the
    // model's dispatch orders them
    int N = SEQ, R = SEQ * TOP_K;
    int *idx = xmalloc((size_t)R * sizeof(int)), *row_of = xmalloc((size_t)R * sizeof(int));
    int *tor = xmalloc((size_t)R * sizeof(int)), *off = xmalloc((N_EXP + 1) * sizeof(int));
    random_topk(idx, N, N_EXP, TOP_K);
    ops_cpu.moe_route_index(off, row_of, tor, idx, N, N_EXP, TOP_K);
    int mn = R, mx = 0;
    for (int e = 0; e < N_EXP; e++) {
        int c = off[e + 1] - off[e];
        if (c < mn) mn = c;
        if (c > mx) mx = c;
    }
    snprintf(gemm_note, sizeof gemm_note,
             "E=%d experts, R=%d rows from a random top-%d routing of %d tokens: %d to %d rows per expert (mean %d). "
             "TFLOP/s at 2·R·C·OC for every implementation; \"vs dense\" = dense cuBLASLt time / this time. "
             "Validated in full (every expert's rows, all of dw) against OpenBLAS FP32.",
             N_EXP, R, TOP_K, N, mn, mx, R / N_EXP);
    printf("%s\n", gemm_note);
    for (int op = OP_FWD; op <= OP_WGRAD; op++) gemm_case("gate/up", D_MODEL, EXP_HIDDEN, op, off);
    save_table(0);
    for (int op = OP_FWD; op <= OP_WGRAD; op++) gemm_case("down", EXP_HIDDEN, D_MODEL, op, off);
    save_table(0);
    free(idx); free(row_of); free(tor); free(off);
}

// ---- 2. attention ---------------------------------------------------------------------

typedef struct {
    int B, T, H, KV, hd, nsets;
    void *q[MAXSETS], *k[MAXSETS], *v[MAXSETS], *dout[MAXSETS], *out[MAXSETS];
    float *lse[MAXSETS];
    void *out_t, *dq, *dk, *dv; // the timed forward writes out_t, lse_t (out, lse: the backward's inputs)
    float *lse_t, *scr;
} Attn;

static void attn_fwd(void *p, int s) {
    Attn *a = p;
    cuda_attention_forward(a->out_t, a->lse_t, a->q[s], a->k[s], a->v[s], NULL, a->B, a->T, a->H, a->KV, a->hd);
}
static void attn_bwd(void *p, int s) {
    Attn *a = p;
    cuda_attention_backward(a->dq, a->dk, a->dv, a->dout[s], a->lse[s], a->q[s], a->k[s], a->v[s], a->out[s], NULL,
                            a->scr, a->B, a->T, a->H, a->KV, a->hd);
}

// heads[] of x [T, NH, hd] (B = 1) as [T, nh, hd]
static float *gather_heads(const float *x, int T, int NH, int hd, const int *heads, int nh) {
    float *r = hf((size_t)T * nh * hd);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < nh; j++)
            memcpy(r + ((size_t)t * nh + j) * hd, x + ((size_t)t * NH + heads[j]) * hd, hd * sizeof(float));
    return r;
}

static void section_attention(void) {
    printf("\n==== 2. attention\n");
    Attn a = {.B = 1, .T = SEQ, .H = N_HEADS, .KV = N_HEADS, .hd = HEAD_DIM};
    const int B = a.B, T = a.T, H = a.H, KV = a.KV, hd = a.hd;
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd;
    size_t ns = cuda_attention_saved_floats(B, T, H, hd), nscr = cuda_attention_scratch_floats(B, T, H, H, hd);
    a.nsets = sets_for(2 * (nq + 2 * nk));
    float *q0 = NULL, *k0 = NULL, *v0 = NULL, *do0 = NULL;
    for (int s = 0; s < a.nsets; s++) {
        float *q = rnd(nq, 0, 1, 1), *k = rnd(nk, 0, 1, 1), *v = rnd(nk, 0, 1, 1), *dout = rnd(nq, 0, 1, 1);
        a.q[s] = d_bf16(q, nq);
        a.k[s] = d_bf16(k, nk);
        a.v[s] = d_bf16(v, nk);
        a.dout[s] = d_bf16(dout, nq);
        a.out[s] = dalloc(nq * 2);
        a.lse[s] = dalloc(ns * 4);
        // the backward's inputs out and lse come from the forward on the same set
        cuda_attention_forward(a.out[s], a.lse[s], a.q[s], a.k[s], a.v[s], NULL, B, T, H, KV, hd);
        if (s == 0) { q0 = q; k0 = k; v0 = v; do0 = dout; }
    }
    a.out_t = dalloc(nq * 2);
    a.lse_t = dalloc(ns * 4);
    a.dq = dalloc(nq * 2);
    a.dk = dalloc(nk * 2);
    a.dv = dalloc(nk * 2);
    a.scr = dalloc(nscr * 4);
    cuda_synchronize();

    // CPU reference on 4 heads of set 0, as one [T, 4, hd] problem
    enum { NH = 4 };
    const int heads[NH] = {0, 5, 10, 15};
    double t0 = now();
    float *qh = gather_heads(q0, T, H, hd, heads, NH), *kh = gather_heads(k0, T, KV, hd, heads, NH);
    float *vh = gather_heads(v0, T, KV, hd, heads, NH), *doh = gather_heads(do0, T, H, hd, heads, NH);
    size_t nh = (size_t)T * NH * hd;
    float *ro = hf(nh), *rdq = hf(nh), *rdk = hf(nh), *rdv = hf(nh);
    float *att = hf(ops_cpu.attention_saved_floats(1, T, NH, hd)), *cscr = hf(ops_cpu.attention_scratch_floats(1, T, NH, NH, hd));
    ops_cpu.attention_forward(ro, att, qh, kh, vh, NULL, 1, T, NH, NH, hd);
    ops_cpu.attention_backward(rdq, rdk, rdv, doh, att, qh, kh, vh, ro, NULL, cscr, 1, T, NH, NH, hd);
    printf("   CPU reference (4 heads): %.1f s\n", now() - t0);

    char shape[64];
    snprintf(shape, sizeof shape, "B=%d T=%d H=KV=%d hd=%d", B, T, H, hd);
    double fwd_flop = 4.0 * B * H * (double)T * T * hd / 2;

    // the forward under both device.cuda.attention_fwd choices, the default first
    CudaSettings fs = *cuda_settings(), saved_fs = fs;
    Row *r = NULL;
    for (int pass = 0; pass < 2; pass++) {
        int kern = pass == 0 ? saved_fs.attention_fwd : !saved_fs.attention_fwd;
        fs.attention_fwd = kern;
        cuda_configure(&fs);
        r = row_begin(SEC_ATTN, kern == CUDA_KERNELS_WGMMA ? "attention forward (TMA + wgmma)" : "attention forward (mma.sync)",
                      shape, "");
        r->flops = fwd_flop;
        Timed tf = {.run = attn_fwd, .ctx = &a, .nsets = a.nsets};
        add_poison(&tf, a.out_t, nq, 0);
        add_poison(&tf, a.lse_t, ns, 1);
        run_once(&tf, 0);
        {
            float *got = down_bf16(a.out_t, nq), *gh = gather_heads(got, T, H, hd, heads, NH);
            check_vals("out (4 heads)", gh, ro, nh, TOL_ATT);
            free(got);
            check_written("out (all heads)", a.out_t, nq, 0);
            check_written("lse (all heads)", a.lse_t, ns, 1);
        }
        time_it(&tf);
    }
    cuda_configure(&saved_fs);

    // the backward likewise under both device.cuda.attention_bwd choices
    CudaSettings bs = saved_fs;
    for (int pass = 0; pass < 2; pass++) {
        int kern = pass == 0 ? saved_fs.attention_bwd : !saved_fs.attention_bwd;
        bs.attention_bwd = kern;
        cuda_configure(&bs);
        r = row_begin(SEC_ATTN, kern == CUDA_KERNELS_WGMMA ? "attention backward (TMA + wgmma)" : "attention backward (mma.sync)",
                      shape, "");
        r->flops = 2.5 * fwd_flop;
        Timed tb = {.run = attn_bwd, .ctx = &a, .nsets = a.nsets};
        add_poison(&tb, a.dq, nq, 0);
        add_poison(&tb, a.dk, nk, 0);
        add_poison(&tb, a.dv, nk, 0);
        add_scratch(&tb, a.scr, nscr);
        run_once(&tb, 0);
        {
            const char *what[3] = {"dq", "dk", "dv"};
            void *d[3] = {a.dq, a.dk, a.dv};
            float *ref[3] = {rdq, rdk, rdv};
            size_t n[3] = {nq, nk, nk};
            int nhead[3] = {H, KV, KV};
            char name[32];
            for (int i = 0; i < 3; i++) {
                float *got = down_bf16(d[i], n[i]), *gh = gather_heads(got, T, nhead[i], hd, heads, NH);
                snprintf(name, sizeof name, "%s (4 heads)", what[i]);
                check_vals(name, gh, ref[i], nh, TOL_ATT);
                free(got);
                snprintf(name, sizeof name, "%s (all heads)", what[i]);
                check_written(name, d[i], n[i], 0);
            }
            // a second run over fresh poison gives the same bits (no atomics, fixed order)
            uint16_t *first[3];
            for (int i = 0; i < 3; i++) {
                first[i] = xmalloc(n[i] * 2);
                cuda_to_host(first[i], d[i], n[i] * 2);
            }
            run_once(&tb, 0);
            for (int i = 0; i < 3; i++) {
                uint16_t *again = xmalloc(n[i] * 2);
                cuda_to_host(again, d[i], n[i] * 2);
                snprintf(name, sizeof name, "%s rerun: same bits", what[i]);
                check_bits(name, again, first[i], n[i]);
                free(again);
                free(first[i]);
            }
        }
        time_it(&tb);
    }
    cuda_configure(&saved_fs);
    release();
    save_table(0);
}

// ---- 3. memory-bound kernels --------------------------------------------------------

// One context for all of them; each bench_* fills the fields it uses.
typedef struct {
    int N, C, V, k, R, B, T, nh, hd;
    size_t n;
    void *a[MAXSETS], *b[MAXSETS], *c[MAXSETS]; // BF16 inputs per set
    float *fa[MAXSETS];                         // FP32 inputs per set
    void *w;                                    // BF16 norm weights
    float *cs, *sn, *weights;                   // RoPE tables; routing weights
    int *tok, *tor, *row_of;                    // token ids / targets, dispatch maps
    void *o1, *o2;                              // BF16 outputs
    float *f1, *f2, *f3;                        // FP32 outputs, optimizer state
    double *acc;
} Mem;

#define ADAM_LR 3e-4f
#define ADAM_B1 0.9f
#define ADAM_B2 0.95f
#define ADAM_EPS 1e-8f
#define ADAM_WD 0.1f
#define ADAM_GS 0.7f
#define ADAM_T 10

static void k_copy(void *p, int s) {
    Mem *m = p;
    (void)s;
    CK(cudaMemcpyAsync(m->o1, m->a[0], m->n, cudaMemcpyDeviceToDevice, st));
}
static void k_rmsnorm_fwd(void *p, int s) {
    Mem *m = p;
    cuda_rmsnorm_forward(m->o1, m->f1, m->a[s], m->w, m->N, m->C, NORM_EPS);
}
static void k_rmsnorm_bwd(void *p, int s) {
    Mem *m = p;
    cuda_rmsnorm_backward(m->o1, m->f1, m->a[s], m->b[s], m->w, m->fa[s], m->N, m->C, 1);
}
static void k_rope_fwd(void *p, int s) {
    Mem *m = p;
    cuda_rope_forward(m->o1, m->a[s], m->cs, m->sn, m->B, m->T, m->nh, m->hd);
}
static void k_rope_bwd(void *p, int s) {
    Mem *m = p;
    cuda_rope_backward(m->o1, m->a[s], m->cs, m->sn, m->B, m->T, m->nh, m->hd);
}
static void k_swiglu_fwd(void *p, int s) {
    Mem *m = p;
    cuda_swiglu_forward(m->o1, m->a[s], m->b[s], m->n);
}
static void k_swiglu_bwd(void *p, int s) {
    Mem *m = p;
    cuda_swiglu_backward(m->o1, m->o2, m->c[s], m->a[s], m->b[s], m->n);
}
static void k_permute_fwd(void *p, int s) {
    Mem *m = p;
    cuda_permute_forward(m->o1, m->a[s], m->tor, m->R, m->C);
}
static void k_permute_bwd(void *p, int s) {
    Mem *m = p;
    cuda_permute_backward(m->o1, m->a[s], m->tor, m->N, m->R, m->C, 1);
}
static void k_unpermute_fwd(void *p, int s) {
    Mem *m = p;
    cuda_unpermute_forward(m->o1, m->a[s], m->weights, m->row_of, m->N, m->k, m->C, 0);
}
static void k_unpermute_bwd(void *p, int s) {
    Mem *m = p;
    cuda_unpermute_backward(m->o1, m->f1, m->a[s], m->b[s], m->weights, m->row_of, m->N, m->k, m->C);
}
static void k_ce_fwd(void *p, int s) {
    Mem *m = p;
    cuda_crossentropy_forward(m->f1, m->a[s], m->tok, m->N, m->V);
}
static void k_ce_bwd(void *p, int s) { // in place, as the model calls it: o1 holds the logits (restored each run)
    Mem *m = p;
    (void)s;
    cuda_crossentropy_backward(m->o1, m->o1, m->tok, 1.f / m->N, m->N, m->V);
}
static void k_embedding_fwd(void *p, int s) {
    Mem *m = p;
    (void)s;
    cuda_embedding_forward(m->o1, m->tok, m->w, m->N, m->C);
}
static void k_embedding_bwd(void *p, int s) {
    Mem *m = p;
    (void)s;
    cuda_embedding_backward(m->f1, m->a[0], m->tok, m->N, m->C);
}
static void k_adamw(void *p, int s) {
    Mem *m = p;
    (void)s;
    cuda_adamw_update(m->f1, m->o1, m->fa[0], m->f2, m->f3, m->n, ADAM_LR, ADAM_B1, ADAM_B2, ADAM_EPS, ADAM_WD,
                      ADAM_GS, ADAM_T);
}
static void k_sum_squares(void *p, int s) {
    Mem *m = p;
    (void)s;
    cuda_sum_squares(m->acc, m->fa[0], m->n);
}
static void k_zero(void *p, int s) {
    Mem *m = p;
    (void)s;
    cuda_zero(m->o1, m->n);
}
static void k_cast(void *p, int s) {
    Mem *m = p;
    (void)s;
    cuda_cast_to_act(m->o1, m->fa[0], m->n);
}

// the reference rate: a 1 GiB device-to-device copy, read + write counted
static void bench_copy(void) {
    Mem m = {.n = COPY_BYTES};
    m.a[0] = dalloc(m.n);
    m.o1 = dalloc(m.n);
    CK(cudaMemsetAsync(m.a[0], 0x3c, m.n, st)); // not zeros
    row_mem("cudaMemcpyAsync D2D (reference)", SHAPE("%zu MiB", m.n >> 20), 2.0 * m.n, "read + write the buffer");
    Timed t = {.run = k_copy, .ctx = &m, .nsets = 1};
    time_it(&t);
    copy_gbs = cur->bytes / (cur->ms * 1e-3) / 1e9;
    release();
}

static void bench_rmsnorm_forward(void) {
    Mem m = {.N = SEQ, .C = D_MODEL};
    size_t nc = (size_t)m.N * m.C;
    int ns = sets_for(nc * 2);
    float *x0 = NULL;
    for (int s = 0; s < ns; s++) {
        float *x = rnd(nc, 0, 2, 1);
        m.a[s] = d_bf16(x, nc);
        if (!s) x0 = x;
    }
    float *w = rnd(m.C, 1, 0.3f, 1);
    m.w = d_bf16(w, m.C);
    m.o1 = dalloc(nc * 2);
    m.f1 = dalloc(m.N * 4);
    row_mem("rmsnorm_forward", SHAPE("N=%d C=%d", m.N, m.C), 2.0 * nc * 2 + m.C * 2 + m.N * 4,
            "read x (bf16), w; write out (bf16), rstd (f32)");
    Timed t = {.run = k_rmsnorm_fwd, .ctx = &m, .nsets = ns};
    add_poison(&t, m.o1, nc, 0);
    add_poison(&t, m.f1, m.N, 1);
    run_once(&t, 0);
    float *ref = hf(nc), *rstd = hf(m.N);
    ops_cpu.rmsnorm_forward(ref, rstd, x0, w, m.N, m.C, NORM_EPS);
    check_bf16("out", m.o1, ref, nc, TOL_BF16);
    check_f32("rstd", m.f1, rstd, m.N, TOL_F32);
    time_it(&t);
    release();
}

// accumulate = 1: dinp += (the residual stream's norms)
static void bench_rmsnorm_backward(void) {
    Mem m = {.N = SEQ, .C = D_MODEL};
    size_t nc = (size_t)m.N * m.C;
    int ns = sets_for(2 * nc * 2);
    float *w = rnd(m.C, 1, 0.3f, 1), *tmp = hf(nc);
    m.w = d_bf16(w, m.C);
    float *dy0 = NULL, *x0 = NULL, *rstd0 = NULL;
    for (int s = 0; s < ns; s++) {
        float *dy = rnd(nc, 0, 1, 1), *x = rnd(nc, 0, 2, 1), *rstd = hf(m.N);
        ops_cpu.rmsnorm_forward(tmp, rstd, x, w, m.N, m.C, NORM_EPS); // the CPU's rstd on both sides
        m.a[s] = d_bf16(dy, nc);
        m.b[s] = d_bf16(x, nc);
        m.fa[s] = d_copy(rstd, m.N * 4);
        if (!s) { dy0 = dy; x0 = x; rstd0 = rstd; }
    }
    float *dx0 = rnd(nc, 0, 1, 1), *dw0 = rnd(m.C, 0, 1, 0);
    void *d_dx0 = d_bf16(dx0, nc);
    float *d_dw0 = d_copy(dw0, m.C * 4);
    m.o1 = dalloc(nc * 2);
    m.f1 = dalloc(m.C * 4);
    row_mem("rmsnorm_backward (dinp +=)", SHAPE("N=%d C=%d", m.N, m.C), 4.0 * nc * 2 + m.C * 2 + m.N * 4 + 2.0 * m.C * 4,
            "read dout, x, dinp (bf16), w, rstd; write dinp; dw (f32) read + written");
    Timed t = {.run = k_rmsnorm_bwd, .ctx = &m, .nsets = ns};
    add_restore(&t, m.o1, d_dx0, nc * 2);
    add_restore(&t, m.f1, d_dw0, m.C * 4);
    run_once(&t, 0);
    float *dxref = dupf(dx0, nc), *dwref = dupf(dw0, m.C);
    ops_cpu.rmsnorm_backward(dxref, dwref, dy0, x0, w, rstd0, m.N, m.C, 1);
    check_bf16("dinp", m.o1, dxref, nc, TOL_BF16);
    check_f32("dw", m.f1, dwref, m.C, TOL_F32);
    time_it(&t);
    release();
}

static void bench_rope(int backward) {
    Mem m = {.B = 1, .T = SEQ, .nh = N_HEADS, .hd = HEAD_DIM};
    size_t n = (size_t)m.B * m.T * m.nh * m.hd, nt = (size_t)m.T * (m.hd / 2);
    float *cs = hf(nt), *sn = hf(nt);
    rope_tables(cs, sn, m.T, m.hd, 10000.f);
    m.cs = d_copy(cs, nt * 4);
    m.sn = d_copy(sn, nt * 4);
    int ns = sets_for(n * 2);
    float *x0 = NULL;
    for (int s = 0; s < ns; s++) {
        float *x = rnd(n, 0, 1, 1);
        m.a[s] = d_bf16(x, n);
        if (!s) x0 = x;
    }
    m.o1 = dalloc(n * 2);
    row_mem(backward ? "rope_backward" : "rope_forward", SHAPE("B=%d T=%d nh=%d hd=%d (q)", m.B, m.T, m.nh, m.hd), 2.0 * n * 2 + 2.0 * nt * 4,
            backward ? "read dout (bf16), cos, sin (f32); write dinp" : "read x (bf16), cos, sin (f32); write out");
    Timed t = {.run = backward ? k_rope_bwd : k_rope_fwd, .ctx = &m, .nsets = ns};
    add_poison(&t, m.o1, n, 0);
    run_once(&t, 0);
    float *ref = hf(n);
    if (backward) ops_cpu.rope_backward(ref, x0, cs, sn, m.B, m.T, m.nh, m.hd);
    else ops_cpu.rope_forward(ref, x0, cs, sn, m.B, m.T, m.nh, m.hd);
    check_bf16(backward ? "dinp" : "out", m.o1, ref, n, TOL_BF16);
    time_it(&t);
    release();
}

static void bench_swiglu(int backward) {
    Mem m = {.n = (size_t)SEQ * TOP_K * EXP_HIDDEN};
    size_t n = m.n;
    int ns = sets_for((backward ? 3 : 2) * n * 2);
    float *g0 = NULL, *u0 = NULL, *d0 = NULL;
    for (int s = 0; s < ns; s++) {
        float *g = rnd(n, 0, 4, 1), *u = rnd(n, 0, 1, 1);
        m.a[s] = d_bf16(g, n);
        m.b[s] = d_bf16(u, n);
        float *d = NULL;
        if (backward) {
            d = rnd(n, 0, 1, 1);
            m.c[s] = d_bf16(d, n);
        }
        if (!s) { g0 = g; u0 = u; d0 = d; }
    }
    m.o1 = dalloc(n * 2);
    if (backward) m.o2 = dalloc(n * 2);
    if (backward)
        row_mem("swiglu_backward", SHAPE("%d x %d", SEQ * TOP_K, EXP_HIDDEN), 5.0 * n * 2, "read dout, gate, up; write dgate, dup (bf16)");
    else row_mem("swiglu_forward", SHAPE("%d x %d", SEQ * TOP_K, EXP_HIDDEN), 3.0 * n * 2, "read gate, up; write out (bf16)");
    Timed t = {.run = backward ? k_swiglu_bwd : k_swiglu_fwd, .ctx = &m, .nsets = ns};
    add_poison(&t, m.o1, n, 0);
    if (backward) add_poison(&t, m.o2, n, 0);
    run_once(&t, 0);
    if (backward) {
        float *dg = hf(n), *du = hf(n);
        ops_cpu.swiglu_backward(dg, du, d0, g0, u0, n);
        check_bf16("dgate", m.o1, dg, n, TOL_BF16);
        check_bf16("dup", m.o2, du, n, TOL_BF16);
    } else {
        float *out = hf(n);
        ops_cpu.swiglu_forward(out, g0, u0, n);
        check_bf16("out", m.o1, out, n, TOL_BF16);
    }
    time_it(&t);
    release();
}

// a random top-8 routing of the 4096 tokens: token_of_row and row_of (device)
static void mem_route(Mem *m, int **tor_h, int **row_of_h) {
    int *idx = hi((size_t)m->R), *off = hi(N_EXP + 1), *row_of = hi((size_t)m->R), *tor = hi((size_t)m->R);
    random_topk(idx, m->N, N_EXP, m->k);
    ops_cpu.moe_route_index(off, row_of, tor, idx, m->N, N_EXP, m->k);
    m->tor = d_copy(tor, (size_t)m->R * 4);
    m->row_of = d_copy(row_of, (size_t)m->R * 4);
    *tor_h = tor;
    *row_of_h = row_of;
}

static void bench_permute(int backward) {
    Mem m = {.N = SEQ, .k = TOP_K, .C = D_MODEL, .R = SEQ * TOP_K};
    size_t nc = (size_t)m.N * m.C, rc = (size_t)m.R * m.C;
    int *tor, *row_of;
    mem_route(&m, &tor, &row_of);
    size_t nin = backward ? rc : nc;
    int ns = sets_for(nin * 2);
    float *x0 = NULL;
    for (int s = 0; s < ns; s++) {
        float *x = rnd(nin, 0, 1, 1);
        m.a[s] = d_bf16(x, nin);
        if (!s) x0 = x;
    }
    Timed t = {.run = backward ? k_permute_bwd : k_permute_fwd, .ctx = &m, .nsets = ns};
    float *ref;
    if (backward) { // dx += : the MoE block's input grad joins the residual stream's
        float *dx0 = rnd(nc, 0, 1, 1);
        void *d_dx0 = d_bf16(dx0, nc);
        m.o1 = dalloc(nc * 2);
        row_mem("permute_backward (dx +=)", SHAPE("N=%d k=%d C=%d", m.N, m.k, m.C), (double)rc * 2 + m.R * 4 + 2.0 * nc * 2,
                "read dxp (R x C bf16), token_of_row; dx (bf16) read + written");
        add_restore(&t, m.o1, d_dx0, nc * 2);
        run_once(&t, 0);
        ref = dupf(dx0, nc);
        ops_cpu.permute_backward(ref, x0, tor, m.N, m.R, m.C, 1);
        check_bf16("dx", m.o1, ref, nc, TOL_BF16);
    } else {
        m.o1 = dalloc(rc * 2);
        row_mem("permute_forward", SHAPE("N=%d k=%d C=%d", m.N, m.k, m.C), (double)nc * 2 + m.R * 4 + (double)rc * 2,
                "read x (N x C bf16, each row once), token_of_row; write xp (R x C)");
        add_poison(&t, m.o1, rc, 0);
        run_once(&t, 0);
        ref = hf(rc);
        ops_cpu.permute_forward(ref, x0, tor, m.R, m.C);
        check_bf16("xp", m.o1, ref, rc, EXACT);
    }
    time_it(&t);
    release();
}

static void bench_unpermute(int backward) {
    Mem m = {.N = SEQ, .k = TOP_K, .C = D_MODEL, .R = SEQ * TOP_K};
    size_t nc = (size_t)m.N * m.C, rc = (size_t)m.R * m.C, nk = (size_t)m.N * m.k;
    int *tor, *row_of;
    mem_route(&m, &tor, &row_of);
    float *wts = rnd(nk, 0.5f, 0.45f, 0); // routing weights in [0.05, 0.95), FP32
    m.weights = d_copy(wts, nk * 4);
    float *y = rnd(rc, 0, 1, 1); // one set: R x C is 128 MB
    Timed t = {.ctx = &m, .nsets = 1};
    if (backward) {
        float *dout = rnd(nc, 0, 1, 1);
        m.a[0] = d_bf16(dout, nc);
        m.b[0] = d_bf16(y, rc);
        m.o1 = dalloc(rc * 2);
        m.f1 = dalloc(nk * 4);
        row_mem("unpermute_backward", SHAPE("N=%d k=%d C=%d", m.N, m.k, m.C), (double)nc * 2 + (double)rc * 2 + 2.0 * nk * 4 + (double)rc * 2 + nk * 4,
                "read dout (N x C), y (R x C bf16), weights, row_of; write dy (R x C), dweights (f32)");
        t.run = k_unpermute_bwd;
        add_poison(&t, m.o1, rc, 0);
        add_poison(&t, m.f1, nk, 1);
        run_once(&t, 0);
        float *dy = hf(rc), *dw = hf(nk);
        ops_cpu.unpermute_backward(dy, dw, dout, y, wts, row_of, m.N, m.k, m.C);
        check_bf16("dy", m.o1, dy, rc, TOL_BF16);
        check_f32("dweights", m.f1, dw, nk, TOL_DOT);
    } else {
        m.a[0] = d_bf16(y, rc);
        m.o1 = dalloc(nc * 2);
        row_mem("unpermute_forward", SHAPE("N=%d k=%d C=%d", m.N, m.k, m.C), (double)rc * 2 + 2.0 * nk * 4 + (double)nc * 2,
                "read y (R x C bf16), weights, row_of; write out (N x C)");
        t.run = k_unpermute_fwd;
        add_poison(&t, m.o1, nc, 0);
        run_once(&t, 0);
        float *out = hf(nc);
        ops_cpu.unpermute_forward(out, y, wts, row_of, m.N, m.k, m.C, 0);
        check_bf16("out", m.o1, out, nc, TOL_BF16);
    }
    time_it(&t);
    release();
}

// targets as the tests make them: every 7th ignored (-1), the last column used
static int *make_targets(int N, int V) {
    int *t = hi(N);
    for (int n = 0; n < N; n++) t[n] = n % 7 == 3 ? -1 : irand(V);
    t[N - 1] = V - 1;
    return t;
}

static void bench_crossentropy(int backward) {
    Mem m = {.N = SEQ, .V = VOCAB};
    size_t nv = (size_t)m.N * m.V;
    int *tgt = make_targets(m.N, m.V);
    m.tok = d_copy(tgt, m.N * 4);
    float *l = rnd(nv, 0, 4, 1); // one set: 412 MB
    m.a[0] = d_bf16(l, nv);
    Timed t = {.ctx = &m, .nsets = 1};
    if (backward) {
        m.o1 = dalloc(nv * 2);
        row_mem("crossentropy_backward (in place)", SHAPE("N=%d V=%d", m.N, m.V), 2.0 * nv * 2 + m.N * 4,
                "read logits (bf16), targets; write dlogits over them");
        t.run = k_ce_bwd;
        add_restore(&t, m.o1, m.a[0], nv * 2);
        run_once(&t, 0);
        float *dl = hf(nv);
        ops_cpu.crossentropy_backward(dl, l, tgt, 1.f / m.N, m.N, m.V);
        check_bf16("dlogits", m.o1, dl, nv, TOL_BF16);
    } else {
        m.f1 = dalloc(m.N * 4);
        row_mem("crossentropy_forward", SHAPE("N=%d V=%d", m.N, m.V), (double)nv * 2 + m.N * 4 + m.N * 4,
                "read logits (bf16), targets; write losses (f32)");
        t.run = k_ce_fwd;
        add_poison(&t, m.f1, m.N, 1);
        run_once(&t, 0);
        float *loss = hf(m.N);
        ops_cpu.crossentropy_forward(loss, l, tgt, m.N, m.V);
        check_f32("losses", m.f1, loss, m.N, TOL_F32);
    }
    time_it(&t);
    release();
}

// tokens as the tests make them: half uniform over V, half from 100 hot ids
static void bench_embedding(int backward) {
    Mem m = {.N = SEQ, .C = D_MODEL, .V = VOCAB};
    size_t nc = (size_t)m.N * m.C, vc = (size_t)m.V * m.C;
    int *tok = hi(m.N);
    for (int n = 0; n < m.N; n++) tok[n] = n % 2 ? irand(100) : irand(m.V);
    char *seen = halloc(m.V);
    memset(seen, 0, m.V);
    int uniq = 0;
    for (int n = 0; n < m.N; n++) {
        uniq += !seen[tok[n]];
        seen[tok[n]] = 1;
    }
    m.tok = d_copy(tok, m.N * 4);
    char note_b[192], shape[64];
    snprintf(shape, sizeof shape, "N=%d C=%d V=%d (%d distinct ids)", m.N, m.C, m.V, uniq);
    Timed t = {.ctx = &m, .nsets = 1};
    if (backward) {
        float *g = rnd(nc, 0, 1, 1), *dw0 = rnd(vc, 0, 1, 0);
        m.a[0] = d_bf16(g, nc);
        float *d_dw0 = d_copy(dw0, vc * 4);
        m.f1 = dalloc(vc * 4);
        snprintf(note_b, sizeof note_b, "read dout (bf16), ids; the %d touched rows of dwte (f32) read + written", uniq);
        row_mem("embedding_backward", shape, (double)nc * 2 + m.N * 4 + 2.0 * uniq * m.C * 4, note_b);
        t.run = k_embedding_bwd;
        add_restore(&t, m.f1, d_dw0, vc * 4);
        run_once(&t, 0);
        float *ref = dupf(dw0, vc);
        ops_cpu.embedding_backward(ref, g, tok, m.N, m.C);
        check_f32("dwte", m.f1, ref, vc, TOL_F32);
    } else {
        float *wte = rnd(vc, 0, 1, 1);
        m.w = d_bf16(wte, vc);
        m.o1 = dalloc(nc * 2);
        snprintf(note_b, sizeof note_b, "read the %d distinct rows of wte (bf16), ids; write out (N x C)", uniq);
        row_mem("embedding_forward", shape, (double)uniq * m.C * 2 + m.N * 4 + (double)nc * 2, note_b);
        t.run = k_embedding_fwd;
        add_poison(&t, m.o1, nc, 0);
        run_once(&t, 0);
        float *ref = hf(nc);
        ops_cpu.embedding_forward(ref, tok, wte, m.N, m.C);
        check_bf16("out", m.o1, ref, nc, EXACT);
    }
    time_it(&t);
    release();
}

// p, g, m, v FP32 and the BF16 copy of p. The timed runs keep updating p,
// m, v in place (the state stays finite; the validation run came first).
static void bench_adamw(void) {
    Mem m = {.n = BIG};
    size_t n = m.n;
    float *p = rnd(n, 0, 1, 0), *g = rnd(n, 0, 1, 0), *mo = rnd(n, 0, 0.1f, 0), *v = rnd(n, 0, 1, 0);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) v[i] = v[i] * v[i] * 0.01f; // second moments: positive
    m.f1 = d_copy(p, n * 4);
    m.fa[0] = d_copy(g, n * 4);
    m.f2 = d_copy(mo, n * 4);
    m.f3 = d_copy(v, n * 4);
    m.o1 = dalloc(n * 2);
    row_mem("adamw_update (+ bf16 copy)", SHAPE("n=%zuM", BIG >> 20), n * (4.0 * 4 + 3 * 4 + 2),
            "read p, g, m, v (f32); write p, m, v (f32), p_act (bf16): 30 B per element");
    Timed t = {.run = k_adamw, .ctx = &m, .nsets = 1};
    add_poison(&t, m.o1, n, 0);
    run_once(&t, 0);
    ops_cpu.adamw_update(p, NULL, g, mo, v, n, ADAM_LR, ADAM_B1, ADAM_B2, ADAM_EPS, ADAM_WD, ADAM_GS, ADAM_T);
    float *gp = down_f32(m.f1, n);
    check_vals("p", gp, p, n, TOL_F32);
    check_f32("m", m.f2, mo, n, TOL_F32);
    check_f32("v", m.f3, v, n, TOL_F32);
    { // p_act must be the BF16 rounding of the GPU's own p
        uint16_t *bits = xmalloc(n * 2), *want = xmalloc(n * 2);
        cuda_to_host(bits, m.o1, n * 2);
#pragma omp parallel for
        for (size_t i = 0; i < n; i++) want[i] = f2bf(gp[i]);
        check_bits("p_act = bf16(p)", bits, want, n);
        free(bits);
        free(want);
    }
    free(gp);
    time_it(&t);
    release();
}

static void bench_sum_squares(void) {
    Mem m = {.n = BIG};
    float *x = rnd(m.n, 0, 2, 0);
    m.fa[0] = d_copy(x, m.n * 4);
    double prefill = 7.25, ref = prefill, got;
    m.acc = d_copy(&prefill, sizeof(double));
    double *d_pre = d_copy(&prefill, sizeof(double));
    row_mem("sum_squares", SHAPE("n=%zuM", BIG >> 20), m.n * 4.0, "read x (f32)");
    Timed t = {.run = k_sum_squares, .ctx = &m, .nsets = 1};
    add_restore(&t, m.acc, d_pre, sizeof(double));
    run_once(&t, 0);
    ops_cpu.sum_squares(&ref, x, m.n);
    cuda_to_host(&got, m.acc, sizeof(double));
    check_acc("sum (onto a prefill)", got, ref, prefill);
    time_it(&t);
    release();
}

static void bench_zero(void) {
    Mem m = {.n = COPY_BYTES}; // bytes
    m.o1 = dalloc(m.n);
    row_mem("zero", SHAPE("%zu MiB", m.n >> 20), (double)m.n, "write the buffer");
    Timed t = {.run = k_zero, .ctx = &m, .nsets = 1};
    add_poison(&t, m.o1, m.n / 4, 1);
    run_once(&t, 0);
    float *ref = hf(m.n / 4);
    ops_cpu.zero(ref, m.n);
    check_f32("buffer", m.o1, ref, m.n / 4, EXACT);
    time_it(&t);
    release();
}

// FP32 inputs that BF16 cannot hold: the rounding itself is checked
static void bench_cast(void) {
    Mem m = {.n = BIG};
    size_t n = m.n;
    float *x = rnd(n, 0, 3, 0);
    m.fa[0] = d_copy(x, n * 4);
    m.o1 = dalloc(n * 2);
    row_mem("cast_to_act", SHAPE("n=%zuM", BIG >> 20), n * 6.0, "read f32; write bf16");
    Timed t = {.run = k_cast, .ctx = &m, .nsets = 1};
    add_poison(&t, m.o1, n, 0);
    run_once(&t, 0);
    float *ref = hf(n);
    ops_cpu.cast_to_act(ref, x, n); // the CPU's act is FP32: a copy
    check_bf16("out vs FP32", m.o1, ref, n, TOL_BF16);
    uint16_t *bits = xmalloc(n * 2), *want = xmalloc(n * 2);
    cuda_to_host(bits, m.o1, n * 2);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) want[i] = f2bf(x[i]);
    check_bits("bits = RNE(x)", bits, want, n);
    free(bits);
    free(want);
    time_it(&t);
    release();
}

static void section_memory(void) {
    printf("\n==== 3. memory-bound kernels\n");
    bench_copy();
    bench_rmsnorm_forward();
    bench_rmsnorm_backward();
    bench_rope(0);
    bench_rope(1);
    bench_swiglu(0);
    bench_swiglu(1);
    bench_permute(0);
    bench_permute(1);
    bench_unpermute(0);
    bench_unpermute(1);
    bench_crossentropy(0);
    bench_crossentropy(1);
    bench_embedding(0);
    bench_embedding(1);
    save_table(0);
    bench_adamw();
    bench_sum_squares();
    bench_zero();
    bench_cast();
}

int main(int argc, char **argv) {
    table_path = argc > 1 ? argv[1] : NULL;
    t_start = now();
    setvbuf(stdout, NULL, _IOLBF, 0);
    st = cuda_stream(); // starts the backend
    device_info();
    atexit(save_partial_table);
    CK(cudaEventCreate(&ev0));
    CK(cudaEventCreate(&ev1));
    flush_n = 4 * l2_bytes / sizeof(float);
    if (flush_n < ((size_t)64 << 20) / sizeof(float)) flush_n = ((size_t)64 << 20) / sizeof(float);
    flush_buf = cuda_alloc(flush_n * sizeof(float));
    flush_acc = cuda_alloc(sizeof(double));
    CK(cudaMemsetAsync(flush_buf, 0x3c, flush_n * sizeof(float), st));

    // argv[2] (optional): the sections to run, e.g. "attention" or "gemm,memory"
    const char *only = argc > 2 ? argv[2] : "gemm,attention,memory";
    if (strstr(only, "gemm")) section_gemm();
    if (strstr(only, "attention")) section_attention();
    if (strstr(only, "memory")) section_memory();

    printf("\n");
    write_table(stdout, 1);
    save_table(1);
    table_done = 1;
    if (table_path) printf("(table written to %s)\n", table_path);
    return gt_finish();
}
