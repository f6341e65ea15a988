// The CUDA backend's memory-bound kernels (src/ops/cuda/: elementwise.cu,
// rmsnorm.cu, rope.cu, router.cu, dispatch.cu, loss.cu, optim.cu) against
// the CPU backend, op by op, on fresh random inputs; then bit-for-bit
// determinism of the reductions and scatter-adds, the same ops replayed from
// a captured CUDA graph, and bandwidth numbers for the hot kernels.
//
// Inputs are rounded through BF16 where the GPU reads BF16, so both sides
// see the same values. Outputs are poisoned (NaN) before each run, except
// accumulating ones, which start from the same known values on both sides.
// Tolerances (relative L2 error over the whole output):
//   BF16 outputs          1e-2  (8-bit mantissa: ~2e-3 per rounding)
//   FP32 from the same    1e-5  (FP32 on the GPU, FP32 or FP64 on the CPU;
//   inputs                       reduction orders differ)
//   dweights              1e-4  (dots over C = 2048 products, which the CPU
//                                sums sequentially in FP32)
//   integer outputs       exact (router_topk, moe_route_index), as are
//                                copies, gathers and the BF16 cast's bits
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_test_util.h"
#include "ops/ops.h"

#define TOL_BF16 1e-2
#define TOL_F32 1e-5
#define TOL_DOT 1e-4
#define EXACT 0.0

// ---- inputs ------------------------------------------------------------------

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static inline uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static inline float urand(void) { return (float)((rng_next() >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f; }  // [-1, 1)
static inline int irand(int n) { return (int)(rng_next() % (uint64_t)n); }

// host buffers of one test, freed together by release()
static void *hbufs[1024];
static int nhbufs;
static void *hkeep(void *p) {
    if (nhbufs == 1024) { fprintf(stderr, "test_cuda_kernels: too many host buffers\n"); exit(2); }
    hbufs[nhbufs++] = p;
    return p;
}
static void *dbufs[1024];
static int ndbufs;
static void *dalloc(size_t bytes) {
    if (ndbufs == 1024) { fprintf(stderr, "test_cuda_kernels: too many device buffers\n"); exit(2); }
    void *d = cuda_alloc(bytes + 16);  // + 16: room for a misaligned view
    dbufs[ndbufs++] = d;
    return d;
}
static void release(void) {
    for (int i = 0; i < nhbufs; i++) free(hbufs[i]);
    for (int i = 0; i < ndbufs; i++) cuda_free(dbufs[i]);
    nhbufs = ndbufs = 0;
}

static float *hf(size_t n) { return hkeep(malloc(n * sizeof(float) + 4)); }
static int *hi(size_t n) { return hkeep(malloc(n * sizeof(int) + 4)); }
// uniform in [-scale, scale), rounded through BF16
static float *rnd_bf16(size_t n, float scale) {
    float *p = hf(n);
    for (size_t i = 0; i < n; i++) p[i] = bf2f(f2bf(urand() * scale));
    return p;
}
// 1 + uniform in [-scale, scale), rounded through BF16 (norm weights)
static float *rnd_bf16_around1(size_t n, float scale) {
    float *p = hf(n);
    for (size_t i = 0; i < n; i++) p[i] = bf2f(f2bf(1.f + urand() * scale));
    return p;
}
static float *rnd_f32(size_t n, float scale) {
    float *p = hf(n);
    for (size_t i = 0; i < n; i++) p[i] = urand() * scale;
    return p;
}
static float *dupf(const float *a, size_t n) {
    float *p = hf(n);
    memcpy(p, a, n * sizeof(float));
    return p;
}

// Device buffers; mis = 1 views them one element past a 16-byte boundary,
// which sends the kernels down their scalar paths.
static void *d_bf16(const float *h, size_t n, int mis) {
    char *d = (char *)dalloc(n * 2) + 2 * mis;
    uint16_t *b = malloc(n * 2 + 2);
    for (size_t i = 0; i < n; i++) b[i] = f2bf(h[i]);
    cuda_to_device(d, b, n * 2);
    free(b);
    return d;
}
static void *d_bf16_poison(size_t n, int mis) {
    char *d = (char *)dalloc(n * 2) + 2 * mis;
    gt_poison(d, n * 2);
    return d;
}
static float *d_f32(const float *h, size_t n, int mis) {
    float *d = (float *)dalloc(n * 4) + mis;
    cuda_to_device(d, h, n * 4);
    return d;
}
static float *d_f32_poison(size_t n, int mis) {
    float *d = (float *)dalloc(n * 4) + mis;
    gt_poison(d, n * 4);
    return d;
}
static int *d_i32(const int *h, size_t n) {
    int *d = dalloc(n * sizeof(int));
    cuda_to_device(d, h, n * sizeof(int));
    return d;
}
static int *d_i32_poison(size_t n) {
    int *d = dalloc(n * sizeof(int));
    gt_poison(d, n * sizeof(int));
    return d;
}

// ---- checks ----------------------------------------------------------------------

// gt_check, and on failure the worst element and the first non-finite one
static int check_vals(const char *what, const float *got, const float *ref, size_t n, double tol) {
    int ok = gt_check(what, got, ref, n, tol);
    if (ok) return ok;
    size_t worst = 0, nonfinite = (size_t)-1;
    double wd = -1;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            if (nonfinite == (size_t)-1) nonfinite = i;
            continue;
        }
        double d = fabs((double)got[i] - ref[i]);
        if (d > wd) { wd = d; worst = i; }
    }
    if (wd >= 0) printf("      worst at [%zu]: got %.8g ref %.8g\n", worst, got[worst], ref[worst]);
    if (nonfinite != (size_t)-1) printf("      first non-finite at [%zu] (ref %.8g)\n", nonfinite, ref[nonfinite]);
    return ok;
}
static int check_bf16(const char *what, const void *d, const float *ref, size_t n, double tol) {
    float *got = gt_host_bf16(d, n);
    int ok = check_vals(what, got, ref, n, tol);
    free(got);
    return ok;
}
static int check_f32(const char *what, const float *d, const float *ref, size_t n, double tol) {
    float *got = gt_host_f32(d, n);
    int ok = check_vals(what, got, ref, n, tol);
    free(got);
    return ok;
}
static int check_ints(const char *what, const int *got, const int *ref, size_t n) {
    int ok = gt_check_int(what, got, ref, n);
    if (ok) return ok;
    int shown = 0;
    for (size_t i = 0; i < n && shown < 8; i++)
        if (got[i] != ref[i]) { printf("      [%zu]: got %d ref %d\n", i, got[i], ref[i]); shown++; }
    return ok;
}
static int check_i32(const char *what, const int *d, const int *ref, size_t n) {
    int *got = malloc(n * sizeof(int) + 4);
    cuda_to_host(got, d, n * sizeof(int));
    int ok = check_ints(what, got, ref, n);
    free(got);
    return ok;
}
// the increment of an accumulated double against the CPU's
static int check_acc(const char *what, double got, double ref, double prefill) {
    float g = (float)(got - prefill), r = (float)(ref - prefill);
    int ok = check_vals(what, &g, &r, 1, TOL_F32);
    if (!ok) printf("      got %.17g ref %.17g (prefill %.17g)\n", got, ref, prefill);
    return ok;
}
// bit-for-bit equality of two host copies
static int check_same(const char *what, const void *a, const void *b, size_t bytes) {
    size_t words = bytes / 4, diff = 0;
    const uint32_t *x = a, *y = b;
    for (size_t i = 0; i < words; i++) diff += x[i] != y[i];
    if (!diff && memcmp(a, b, bytes)) diff = 1;
    printf("%s %-48s %zu of %zu words differ\n", diff ? "FAIL" : "ok  ", what, diff, words);
    if (diff) gt_fail++; else gt_pass++;
    return !diff;
}
static void *host_copy(const void *d, size_t bytes) {
    void *h = hkeep(malloc(bytes + 4));
    cuda_to_host(h, d, bytes);
    return h;
}

static char name[256];
#define NAME(...) (snprintf(name, sizeof name, __VA_ARGS__), name)
#define MIS(m) ((m) ? " misaligned" : "")

// ---- elementwise -----------------------------------------------------------------

static void test_cast(size_t n, int mis) {
    float *src = rnd_f32(n, 3);
    float *ds = d_f32(src, n, mis);
    void *dd = d_bf16_poison(n, 0);
    cuda_cast_to_act(dd, ds, n);
    uint16_t *bits = hkeep(malloc(n * 2 + 2));
    cuda_to_host(bits, dd, n * 2);
    int *got = hi(n), *ref = hi(n);
    for (size_t i = 0; i < n; i++) { got[i] = bits[i]; ref[i] = f2bf(src[i]); }
    check_ints(NAME("cast_to_act n=%zu%s (bits, RNE)", n, MIS(mis)), got, ref, n);
    release();
}

static void test_elementwise(size_t n, int mis) {
    float *x = rnd_bf16(n, 1), *y = rnd_bf16(n, 1);
    float *yref = dupf(y, n);
    ops_cpu.add_act(yref, x, n);
    void *dx = d_bf16(x, n, 0), *dy = d_bf16(y, n, mis);
    cuda_add_act(dy, dx, n);
    check_bf16(NAME("add_act n=%zu%s", n, MIS(mis)), dy, yref, n, TOL_BF16);
    void *dc = d_bf16_poison(n, mis);
    cuda_copy_act(dc, dx, n);
    check_bf16(NAME("copy_act n=%zu%s (exact)", n, MIS(mis)), dc, x, n, EXACT);

    float *xf = rnd_f32(n, 1), *yf = rnd_f32(n, 1);
    float *yfref = dupf(yf, n);
    ops_cpu.add_f32(yfref, xf, n);
    float *dxf = d_f32(xf, n, 0), *dyf = d_f32(yf, n, mis);
    cuda_add_f32(dyf, dxf, n);
    check_f32(NAME("add_f32 n=%zu%s", n, MIS(mis)), dyf, yfref, n, TOL_F32);
    float *dcf = d_f32_poison(n, mis);
    cuda_copy_f32(dcf, dxf, n);
    check_f32(NAME("copy_f32 n=%zu%s (exact)", n, MIS(mis)), dcf, xf, n, EXACT);
    release();
}

static void test_swiglu(size_t n, int mis) {
    float *g = rnd_bf16(n, 4), *u = rnd_bf16(n, 1), *dout = rnd_bf16(n, 1);
    float *out = hf(n), *dg = hf(n), *du = hf(n);
    ops_cpu.swiglu_forward(out, g, u, n);
    ops_cpu.swiglu_backward(dg, du, dout, g, u, n);
    void *dgate = d_bf16(g, n, mis), *dup_ = d_bf16(u, n, 0), *dd = d_bf16(dout, n, 0);
    void *dout_ = d_bf16_poison(n, 0);
    cuda_swiglu_forward(dout_, dgate, dup_, n);
    check_bf16(NAME("swiglu_forward n=%zu%s", n, MIS(mis)), dout_, out, n, TOL_BF16);
    void *ddg = d_bf16_poison(n, 0), *ddu = d_bf16_poison(n, mis);
    cuda_swiglu_backward(ddg, ddu, dd, dgate, dup_, n);
    check_bf16(NAME("swiglu_backward dgate n=%zu%s", n, MIS(mis)), ddg, dg, n, TOL_BF16);
    check_bf16(NAME("swiglu_backward dup n=%zu%s", n, MIS(mis)), ddu, du, n, TOL_BF16);
    release();
}

// ---- embedding, rmsnorm, rope ----------------------------------------------------------

// tokens: half uniform over V, half from the first `hot` ids (repeats)
static int *make_tokens(int N, int V, int hot) {
    int *t = hi(N);
    for (int n = 0; n < N; n++) t[n] = (n % 2 && hot > 0) ? irand(hot < V ? hot : V) : irand(V);
    return t;
}

static void test_embedding(int N, int C, int V, int hot, int mis) {
    int *tok = make_tokens(N, V, hot);
    float *wte = rnd_bf16((size_t)V * C, 1), *out = hf((size_t)N * C);
    ops_cpu.embedding_forward(out, tok, wte, N, C);
    int *dtok = d_i32(tok, N);
    void *dwte = d_bf16(wte, (size_t)V * C, 0), *dout_ = d_bf16_poison((size_t)N * C, mis);
    cuda_embedding_forward(dout_, dtok, dwte, N, C);
    check_bf16(NAME("embedding_forward N=%d C=%d V=%d%s (exact)", N, C, V, MIS(mis)), dout_, out, (size_t)N * C, EXACT);

    float *g = rnd_bf16((size_t)N * C, 1), *dw0 = rnd_f32((size_t)V * C, 1);
    float *dwref = dupf(dw0, (size_t)V * C);
    ops_cpu.embedding_backward(dwref, g, tok, N, C);
    void *dg = d_bf16(g, (size_t)N * C, 0);
    float *ddw = d_f32(dw0, (size_t)V * C, mis);
    cuda_embedding_backward(ddw, dg, dtok, N, C);
    check_f32(NAME("embedding_backward N=%d C=%d V=%d hot=%d%s", N, C, V, hot, MIS(mis)), ddw, dwref, (size_t)V * C,
              TOL_F32);
    release();
}

static void test_rmsnorm(int N, int C, int acc, int mis) {
    size_t nc = (size_t)N * C;
    float eps = 1e-5f;
    float *x = rnd_bf16(nc, 2), *w = rnd_bf16_around1(C, 0.3f);
    float *out = hf(nc), *rstd = hf(N);
    ops_cpu.rmsnorm_forward(out, rstd, x, w, N, C, eps);
    void *dx = d_bf16(x, nc, 0), *dw = d_bf16(w, C, 0), *dout_ = d_bf16_poison(nc, mis);
    float *drstd = d_f32_poison(N, 0);
    cuda_rmsnorm_forward(dout_, drstd, dx, dw, N, C, eps);
    check_bf16(NAME("rmsnorm_forward out N=%d C=%d%s", N, C, MIS(mis)), dout_, out, nc, TOL_BF16);
    check_f32(NAME("rmsnorm_forward rstd N=%d C=%d%s", N, C, MIS(mis)), drstd, rstd, N, TOL_F32);

    float *dy = rnd_bf16(nc, 1), *dx0 = rnd_bf16(nc, 1), *dw0 = rnd_f32(C, 1);
    float *dxref = acc ? dupf(dx0, nc) : hf(nc), *dwref = dupf(dw0, C);
    ops_cpu.rmsnorm_backward(dxref, dwref, dy, x, w, rstd, N, C, acc);
    void *ddy = d_bf16(dy, nc, 0);
    void *ddx = acc ? d_bf16(dx0, nc, mis) : d_bf16_poison(nc, mis);
    float *ddw = d_f32(dw0, C, 0), *drstd_ref = d_f32(rstd, N, 0);  // the CPU's rstd on both sides
    cuda_rmsnorm_backward(ddx, ddw, ddy, dx, dw, drstd_ref, N, C, acc);
    check_bf16(NAME("rmsnorm_backward dinp N=%d C=%d acc=%d%s", N, C, acc, MIS(mis)), ddx, dxref, nc, TOL_BF16);
    check_f32(NAME("rmsnorm_backward dw N=%d C=%d acc=%d%s", N, C, acc, MIS(mis)), ddw, dwref, C, TOL_F32);
    release();
}

static void test_rope(int B, int T, int nh, int hd, int inplace, int mis) {
    size_t n = (size_t)B * T * nh * hd, nt = (size_t)T * (hd / 2);
    float *cs = hf(nt), *sn = hf(nt);
    rope_tables(cs, sn, T, hd, 10000.f);
    float *x = rnd_bf16(n, 1), *dy = rnd_bf16(n, 1), *out = hf(n), *dx = hf(n);
    ops_cpu.rope_forward(out, x, cs, sn, B, T, nh, hd);
    ops_cpu.rope_backward(dx, dy, cs, sn, B, T, nh, hd);
    float *dcs = d_f32(cs, nt, 0), *dsn = d_f32(sn, nt, 0);
    void *din = d_bf16(x, n, mis), *dout_ = inplace ? din : d_bf16_poison(n, 0);
    cuda_rope_forward(dout_, din, dcs, dsn, B, T, nh, hd);
    check_bf16(NAME("rope_forward B=%d T=%d nh=%d hd=%d%s%s", B, T, nh, hd, inplace ? " in place" : "", MIS(mis)),
               dout_, out, n, TOL_BF16);
    void *ddy = d_bf16(dy, n, mis), *ddx = inplace ? ddy : d_bf16_poison(n, 0);
    cuda_rope_backward(ddx, ddy, dcs, dsn, B, T, nh, hd);
    check_bf16(NAME("rope_backward B=%d T=%d nh=%d hd=%d%s%s", B, T, nh, hd, inplace ? " in place" : "", MIS(mis)),
               ddx, dx, n, TOL_BF16);
    release();
}

// ---- router ------------------------------------------------------------------------

static const char *gname(Gating g) { return g == GATING_SIGMOID ? "sigmoid" : "softmax"; }

static float *cpu_probs(int N, int E, Gating g, float scale) {
    float *l = rnd_f32((size_t)N * E, scale), *p = hf((size_t)N * E);
    ops_cpu.router_probs_forward(p, l, N, E, g);
    return p;
}
static int *cpu_random_idx(int N, int E, int k, uint64_t seed) {
    int *idx = hi((size_t)N * k);
    ops_cpu.router_topk(idx, NULL, NULL, N, E, k, ROUTING_RANDOM, seed);
    return idx;
}

static void test_router_probs(int N, int E, Gating g, int acc) {
    size_t ne = (size_t)N * E;
    float *l = rnd_f32(ne, 3), *p = hf(ne);
    ops_cpu.router_probs_forward(p, l, N, E, g);
    float *dl = d_f32(l, ne, 0), *dp = d_f32_poison(ne, 0);
    cuda_router_probs_forward(dp, dl, N, E, g);
    check_f32(NAME("router_probs_forward N=%d E=%d %s", N, E, gname(g)), dp, p, ne, TOL_F32);

    float *dprobs = rnd_f32(ne, 1), *dl0 = rnd_f32(ne, 1);
    float *dlref = acc ? dupf(dl0, ne) : hf(ne);
    ops_cpu.router_probs_backward(dlref, dprobs, p, N, E, g, acc);
    float *ddp = d_f32(dprobs, ne, 0), *dpr = d_f32(p, ne, 0);
    float *ddl = acc ? d_f32(dl0, ne, 0) : d_f32_poison(ne, 0);
    cuda_router_probs_backward(ddl, ddp, dpr, N, E, g, acc);
    check_f32(NAME("router_probs_backward N=%d E=%d %s acc=%d", N, E, gname(g), acc), ddl, dlref, ne, TOL_F32);
    release();
}

// ties: probabilities and bias quantised to a few levels, so that most
// choices are decided by the lower-index rule
static void test_router_topk(int N, int E, int k, RoutingMode mode, int bias, int ties, uint64_t seed) {
    size_t ne = (size_t)N * E;
    float *p = cpu_probs(N, E, GATING_SOFTMAX, 2);
    if (ties)
        for (size_t i = 0; i < ne; i++) p[i] = (float)irand(4) * 0.25f;
    float *b = NULL;
    if (bias) {
        b = rnd_f32(E, 0.02f);
        if (ties)
            for (int e = 0; e < E; e++) b[e] = (float)irand(2) * 0.25f;
    }
    int *idx = hi((size_t)N * k);
    ops_cpu.router_topk(idx, p, b, N, E, k, mode, seed);
    float *dp = d_f32(p, ne, 0), *db = bias ? d_f32(b, E, 0) : NULL;
    int *didx = d_i32_poison((size_t)N * k);
    cuda_router_topk(didx, dp, db, N, E, k, mode, seed);
    const char *mname = mode == ROUTING_LEARNED ? "learned" : mode == ROUTING_RANDOM ? "random" : "uniform";
    check_i32(NAME("router_topk %s N=%d E=%d k=%d%s%s", mname, N, E, k, bias ? " bias" : "", ties ? " ties" : ""),
              didx, idx, (size_t)N * k);
    release();
}

static void test_router_weights(int N, int E, int k, int renorm, int acc) {
    size_t ne = (size_t)N * E, nk = (size_t)N * k;
    float *p = cpu_probs(N, E, GATING_SOFTMAX, 2);
    int *idx = cpu_random_idx(N, E, k, 77);
    float *w = hf(nk);
    ops_cpu.router_weights_forward(w, p, idx, N, E, k, renorm);
    float *dp = d_f32(p, ne, 0), *dw = d_f32_poison(nk, 0);
    int *didx = d_i32(idx, nk);
    cuda_router_weights_forward(dw, dp, didx, N, E, k, renorm);
    check_f32(NAME("router_weights_forward N=%d E=%d k=%d renorm=%d", N, E, k, renorm), dw, w, nk, TOL_F32);

    float *dweights = rnd_f32(nk, 1), *dp0 = rnd_f32(ne, 1);
    float *dpref = acc ? dupf(dp0, ne) : hf(ne);
    ops_cpu.router_weights_backward(dpref, dweights, p, idx, N, E, k, renorm, acc);
    float *ddw = d_f32(dweights, nk, 0), *ddp = acc ? d_f32(dp0, ne, 0) : d_f32_poison(ne, 0);
    cuda_router_weights_backward(ddp, ddw, dp, didx, N, E, k, renorm, acc);
    check_f32(NAME("router_weights_backward N=%d E=%d k=%d renorm=%d acc=%d", N, E, k, renorm, acc), ddp, dpref, ne,
              TOL_F32);
    release();
}

static void test_router_count(int N, int E, int k) {
    int *idx = cpu_random_idx(N, E, k, 5);
    float *c0 = hf(E);
    for (int e = 0; e < E; e++) c0[e] = (float)(e % 7);  // integers: exact on both sides
    float *cref = dupf(c0, E);
    ops_cpu.router_count(cref, idx, N, E, k);
    float *dc = d_f32(c0, E, 0);
    cuda_router_count(dc, d_i32(idx, (size_t)N * k), N, E, k);
    check_f32(NAME("router_count N=%d E=%d k=%d (onto prefill)", N, E, k), dc, cref, E, TOL_F32);
    release();
}

static void test_lb_loss(int N, int E, int k, Gating g, float count_tokens) {
    size_t ne = (size_t)N * E;
    float *p = cpu_probs(N, E, g, 2);
    float *counts = hf(E);
    for (int e = 0; e < E; e++) counts[e] = 0;
    ops_cpu.router_count(counts, cpu_random_idx(N, E, k, 9), N, E, k);
    for (int e = 0; e < E; e++) counts[e] += (float)(e % 3);  // uneven
    float ref;
    ops_cpu.lb_loss_forward(&ref, p, counts, count_tokens, N, E, k, g);
    float *dp = d_f32(p, ne, 0), *dc = d_f32(counts, E, 0), *dout_ = d_f32_poison(1, 0);
    cuda_lb_loss_forward(dout_, dp, dc, count_tokens, N, E, k, g);
    check_f32(NAME("lb_loss_forward N=%d E=%d k=%d %s", N, E, k, gname(g)), dout_, &ref, 1, TOL_F32);

    float *dp0 = rnd_f32(ne, 1e-5f), *dpref = dupf(dp0, ne);  // the size of the increments
    ops_cpu.lb_loss_backward(dpref, p, counts, count_tokens, N, E, k, g, 0.37f);
    float *ddp = d_f32(dp0, ne, 0);
    cuda_lb_loss_backward(ddp, dp, dc, count_tokens, N, E, k, g, 0.37f);
    check_f32(NAME("lb_loss_backward N=%d E=%d k=%d %s", N, E, k, gname(g)), ddp, dpref, ne, TOL_F32);
    release();
}

static void test_zloss(int N, int E) {
    size_t ne = (size_t)N * E;
    float *l = rnd_f32(ne, 4), ref;
    ops_cpu.zloss_forward(&ref, l, N, E);
    float *dl = d_f32(l, ne, 0), *dout_ = d_f32_poison(1, 0);
    cuda_zloss_forward(dout_, dl, N, E);
    check_f32(NAME("zloss_forward N=%d E=%d", N, E), dout_, &ref, 1, TOL_F32);
    float *g0 = rnd_f32(ne, 1e-5f), *gref = dupf(g0, ne);  // the size of the increments
    ops_cpu.zloss_backward(gref, l, N, E, 0.25f);
    float *dg = d_f32(g0, ne, 0);
    cuda_zloss_backward(dg, dl, N, E, 0.25f);
    check_f32(NAME("zloss_backward N=%d E=%d", N, E), dg, gref, ne, TOL_F32);
    release();
}

// ---- dispatch ------------------------------------------------------------------------

// idx kinds: 0 random distinct experts, 1 learned top-k, 2 skewed (only
// experts 0..2, slots may repeat an expert; most segments empty)
static int *make_idx(int N, int E, int k, int kind) {
    if (kind == 0) return cpu_random_idx(N, E, k, 1234);
    int *idx = hi((size_t)N * k);
    if (kind == 1) {
        float *p = cpu_probs(N, E, GATING_SOFTMAX, 2);
        ops_cpu.router_topk(idx, p, NULL, N, E, k, ROUTING_LEARNED, 0);
    } else {
        for (size_t i = 0; i < (size_t)N * k; i++) idx[i] = irand(E < 3 ? E : 3);
    }
    return idx;
}

static void test_route_index(int N, int E, int k, int kind) {
    size_t R = (size_t)N * k;
    int *idx = make_idx(N, E, k, kind);
    int *off = hi(E + 1), *row_of = hi(R), *tor = hi(R);
    ops_cpu.moe_route_index(off, row_of, tor, idx, N, E, k);
    int *doff = d_i32_poison(E + 1), *drow = d_i32_poison(R), *dtor = d_i32_poison(R);
    cuda_moe_route_index(doff, drow, dtor, d_i32(idx, R), N, E, k);
    const char *kn[] = {"random", "learned", "skewed"};
    check_i32(NAME("moe_route_index offsets N=%d E=%d k=%d %s", N, E, k, kn[kind]), doff, off, E + 1);
    check_i32(NAME("moe_route_index row_of N=%d E=%d k=%d %s", N, E, k, kn[kind]), drow, row_of, R);
    check_i32(NAME("moe_route_index token_of_row N=%d E=%d k=%d %s", N, E, k, kn[kind]), dtor, tor, R);
    release();
}

static int *cpu_route(int N, int E, int k, int **row_of_out) {
    size_t R = (size_t)N * k;
    int *idx = make_idx(N, E, k, 0), *off = hi(E + 1), *row_of = hi(R), *tor = hi(R);
    ops_cpu.moe_route_index(off, row_of, tor, idx, N, E, k);
    if (row_of_out) *row_of_out = row_of;
    return tor;
}

static void test_permute(int N, int k, int C, int acc, int mis) {
    int R = N * k;
    size_t nc = (size_t)N * C, rc = (size_t)R * C;
    int *tor = cpu_route(N, 64, k, NULL);
    float *x = rnd_bf16(nc, 1), *xp = hf(rc);
    ops_cpu.permute_forward(xp, x, tor, R, C);
    int *dtor = d_i32(tor, R);
    void *dx = d_bf16(x, nc, 0), *dxp = d_bf16_poison(rc, mis);
    cuda_permute_forward(dxp, dx, dtor, R, C);
    check_bf16(NAME("permute_forward N=%d k=%d C=%d%s (exact)", N, k, C, MIS(mis)), dxp, xp, rc, EXACT);

    float *g = rnd_bf16(rc, 1), *dx0 = rnd_bf16(nc, 1);
    float *dxref = acc ? dupf(dx0, nc) : hf(nc);
    ops_cpu.permute_backward(dxref, g, tor, N, R, C, acc);
    void *dg = d_bf16(g, rc, 0), *ddx = acc ? d_bf16(dx0, nc, mis) : d_bf16_poison(nc, mis);
    cuda_permute_backward(ddx, dg, dtor, N, R, C, acc);
    check_bf16(NAME("permute_backward N=%d k=%d C=%d acc=%d%s", N, k, C, acc, MIS(mis)), ddx, dxref, nc, TOL_BF16);
    release();
}

// permute_backward with an arbitrary row -> token map: R rows, tokens with
// no rows (assigned 0 or left as they were) and tokens with many
static void test_permute_backward_uneven(int N, int R, int C, int acc) {
    size_t nc = (size_t)N * C, rc = (size_t)R * C;
    int *tor = hi(R);
    for (int r = 0; r < R; r++) tor[r] = r % 5 == 0 ? 3 % N : irand(N / 2 > 0 ? N / 2 : 1);
    float *g = rnd_bf16(rc, 1), *dx0 = rnd_bf16(nc, 1);
    float *dxref = acc ? dupf(dx0, nc) : hf(nc);
    ops_cpu.permute_backward(dxref, g, tor, N, R, C, acc);
    void *dg = d_bf16(g, rc, 0), *ddx = acc ? d_bf16(dx0, nc, 0) : d_bf16_poison(nc, 0);
    cuda_permute_backward(ddx, dg, d_i32(tor, R), N, R, C, acc);
    check_bf16(NAME("permute_backward uneven N=%d R=%d C=%d acc=%d", N, R, C, acc), ddx, dxref, nc, TOL_BF16);
    release();
}

static void test_unpermute(int N, int k, int C, int acc, int mis) {
    int R = N * k;
    size_t nc = (size_t)N * C, rc = (size_t)R * C, nk = (size_t)N * k;
    int *row_of;
    cpu_route(N, 64, k, &row_of);
    float *y = rnd_bf16(rc, 1), *w = hf(nk), *o0 = rnd_bf16(nc, 1);
    for (size_t i = 0; i < nk; i++) w[i] = 0.5f + 0.5f * urand();
    float *oref = acc ? dupf(o0, nc) : hf(nc);
    ops_cpu.unpermute_forward(oref, y, w, row_of, N, k, C, acc);
    int *drow = d_i32(row_of, nk);
    void *dy = d_bf16(y, rc, 0), *dout_ = acc ? d_bf16(o0, nc, mis) : d_bf16_poison(nc, mis);
    float *dw = d_f32(w, nk, 0);
    cuda_unpermute_forward(dout_, dy, dw, drow, N, k, C, acc);
    check_bf16(NAME("unpermute_forward N=%d k=%d C=%d acc=%d%s", N, k, C, acc, MIS(mis)), dout_, oref, nc, TOL_BF16);

    float *g = rnd_bf16(nc, 1), *dyref = hf(rc), *dwref = hf(nk);
    ops_cpu.unpermute_backward(dyref, dwref, g, y, w, row_of, N, k, C);
    void *dg = d_bf16(g, nc, mis), *ddy = d_bf16_poison(rc, 0);
    float *ddw = d_f32_poison(nk, 0);
    cuda_unpermute_backward(ddy, ddw, dg, dy, dw, drow, N, k, C);
    check_bf16(NAME("unpermute_backward dy N=%d k=%d C=%d%s", N, k, C, MIS(mis)), ddy, dyref, rc, TOL_BF16);
    check_f32(NAME("unpermute_backward dweights N=%d k=%d C=%d%s", N, k, C, MIS(mis)), ddw, dwref, nk, TOL_DOT);
    release();
}

// ---- loss ---------------------------------------------------------------------------

static int *make_targets(int N, int V) {
    int *t = hi(N);
    for (int n = 0; n < N; n++) t[n] = n % 7 == 3 ? -1 : irand(V);
    if (N > 1) t[N - 1] = V - 1;  // the last column
    return t;
}

static void test_crossentropy(int N, int V, int mis) {
    size_t nv = (size_t)N * V;
    int *tgt = make_targets(N, V);
    float *l = rnd_bf16(nv, 4), *loss = hf(N), *dl = hf(nv);
    float dloss = 0.37f;
    ops_cpu.crossentropy_forward(loss, l, tgt, N, V);
    ops_cpu.crossentropy_backward(dl, l, tgt, dloss, N, V);
    int *dt = d_i32(tgt, N);
    void *dlog = d_bf16(l, nv, mis);
    float *dloss_ = d_f32_poison(N, 0);
    cuda_crossentropy_forward(dloss_, dlog, dt, N, V);
    check_f32(NAME("crossentropy_forward N=%d V=%d%s", N, V, MIS(mis)), dloss_, loss, N, TOL_F32);
    void *ddl = d_bf16_poison(nv, 0);
    cuda_crossentropy_backward(ddl, dlog, dt, dloss, N, V);
    check_bf16(NAME("crossentropy_backward N=%d V=%d%s", N, V, MIS(mis)), ddl, dl, nv, TOL_BF16);
    // in place, as the model calls it; masked rows must come back zero
    cuda_crossentropy_backward(dlog, dlog, dt, dloss, N, V);
    check_bf16(NAME("crossentropy_backward in place N=%d V=%d%s", N, V, MIS(mis)), dlog, dl, nv, TOL_BF16);
    release();
}

static void test_loss_sum(int N) {
    int *tgt = make_targets(N, 100);
    float *loss = rnd_f32(N, 5);
    for (int n = 0; n < N; n++) loss[n] = fabsf(loss[n]);
    double prefill = 1234.5, ref = prefill, got;
    ops_cpu.loss_sum(&ref, loss, tgt, N);
    double *dacc = dalloc(sizeof(double));
    cuda_to_device(dacc, &prefill, sizeof(double));
    cuda_loss_sum(dacc, d_f32(loss, N, 0), d_i32(tgt, N), N);
    cuda_to_host(&got, dacc, sizeof(double));
    check_acc(NAME("loss_sum N=%d (onto prefill)", N), got, ref, prefill);
    release();
}

// ---- optimizer -------------------------------------------------------------------------

static void test_adamw(size_t n, int with_act, int t, int mis) {
    float *p = rnd_f32(n, 1), *g = rnd_f32(n, 1), *m = rnd_f32(n, 0.1f), *v = rnd_f32(n, 1);
    for (size_t i = 0; i < n; i++) v[i] = v[i] * v[i] * 0.01f;
    float lr = 3e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.7f;
    float *pref = dupf(p, n), *mref = dupf(m, n), *vref = dupf(v, n);
    ops_cpu.adamw_update(pref, NULL, g, mref, vref, n, lr, b1, b2, eps, wd, gs, t);
    float *dp = d_f32(p, n, mis), *dg = d_f32(g, n, 0), *dm = d_f32(m, n, 0), *dv = d_f32(v, n, 0);
    void *dact = with_act ? d_bf16_poison(n, 0) : NULL;
    cuda_adamw_update(dp, dact, dg, dm, dv, n, lr, b1, b2, eps, wd, gs, t);
    const char *tag = with_act ? " +act" : "";
    float *gp = hkeep(gt_host_f32(dp, n));
    check_vals(NAME("adamw p n=%zu t=%d%s%s", n, t, tag, MIS(mis)), gp, pref, n, TOL_F32);
    check_f32(NAME("adamw m n=%zu t=%d%s%s", n, t, tag, MIS(mis)), dm, mref, n, TOL_F32);
    check_f32(NAME("adamw v n=%zu t=%d%s%s", n, t, tag, MIS(mis)), dv, vref, n, TOL_F32);
    size_t bitdiff = 0;
    for (size_t i = 0; i < n; i++) bitdiff += memcmp(&gp[i], &pref[i], 4) != 0;
    printf("      (p differs from the CPU's in %zu of %zu bit patterns; 0 expected, not required)\n", bitdiff, n);
    if (with_act) {
        uint16_t *bits = hkeep(malloc(n * 2 + 2));
        cuda_to_host(bits, dact, n * 2);
        int *got = hi(n), *ref = hi(n);
        for (size_t i = 0; i < n; i++) { got[i] = bits[i]; ref[i] = f2bf(gp[i]); }
        check_ints(NAME("adamw p_act = bf16(p) n=%zu t=%d%s", n, t, MIS(mis)), got, ref, n);
    }
    release();
}

static void test_sum_squares(size_t n, int mis) {
    float *x = rnd_f32(n, 2);
    double prefill = 7.25, ref = prefill, got;
    ops_cpu.sum_squares(&ref, x, n);
    double *dacc = dalloc(sizeof(double));
    cuda_to_device(dacc, &prefill, sizeof(double));
    cuda_sum_squares(dacc, d_f32(x, n, mis), n);
    cuda_to_host(&got, dacc, sizeof(double));
    check_acc(NAME("sum_squares n=%zu%s (onto prefill)", n, MIS(mis)), got, ref, prefill);
    release();
}

// ---- determinism ---------------------------------------------------------------------------

static void test_determinism(void) {
    printf("-- determinism: each op twice on the same inputs, outputs bit for bit\n");
    {  // embedding backward, many repeated ids
        int N = 16384, C = 2048, V = 1000;
        size_t vc = (size_t)V * C;
        int *dt = d_i32(make_tokens(N, V, 40), N);
        void *dg = d_bf16(rnd_bf16((size_t)N * C, 1), (size_t)N * C, 0);
        float *a = dalloc(vc * 4), *b = dalloc(vc * 4);  // zero-filled
        cuda_embedding_backward(a, dg, dt, N, C);
        cuda_embedding_backward(b, dg, dt, N, C);
        check_same(NAME("embedding_backward N=%d C=%d (40 hot ids)", N, C), host_copy(a, vc * 4), host_copy(b, vc * 4),
                   vc * 4);
        release();
    }
    {  // permute backward
        int N = 4096, k = 8, C = 2048, R = N * k;
        int *dtor = d_i32(cpu_route(N, 64, k, NULL), R);
        void *dg = d_bf16(rnd_bf16((size_t)R * C, 1), (size_t)R * C, 0);
        void *a = d_bf16_poison((size_t)N * C, 0), *b = d_bf16_poison((size_t)N * C, 0);
        cuda_permute_backward(a, dg, dtor, N, R, C, 0);
        cuda_permute_backward(b, dg, dtor, N, R, C, 0);
        check_same(NAME("permute_backward N=%d k=%d C=%d", N, k, C), host_copy(a, (size_t)N * C * 2),
                   host_copy(b, (size_t)N * C * 2), (size_t)N * C * 2);
        release();
    }
    int shapes[][2] = {{4096, 2048}, {65536, 128}, {512, 4096}};
    for (int s = 0; s < 3; s++) {  // rmsnorm backward: dinp and dw
        int N = shapes[s][0], C = shapes[s][1];
        size_t nc = (size_t)N * C;
        float *x = rnd_bf16(nc, 2), *w = rnd_bf16_around1(C, 0.3f), *rstd = hf(N), *out = hf(nc);
        ops_cpu.rmsnorm_forward(out, rstd, x, w, N, C, 1e-5f);
        void *dx = d_bf16(x, nc, 0), *dw = d_bf16(w, C, 0), *dy = d_bf16(rnd_bf16(nc, 1), nc, 0);
        float *dr = d_f32(rstd, N, 0);
        void *ga = d_bf16_poison(nc, 0), *gb = d_bf16_poison(nc, 0);
        float *wa = dalloc(C * 4), *wb = dalloc(C * 4);
        cuda_rmsnorm_backward(ga, wa, dy, dx, dw, dr, N, C, 0);
        cuda_rmsnorm_backward(gb, wb, dy, dx, dw, dr, N, C, 0);
        check_same(NAME("rmsnorm_backward dinp N=%d C=%d", N, C), host_copy(ga, nc * 2), host_copy(gb, nc * 2), nc * 2);
        check_same(NAME("rmsnorm_backward dw N=%d C=%d", N, C), host_copy(wa, C * 4), host_copy(wb, C * 4), C * 4);
        release();
    }
    {  // scalar reductions
        int N = 4096, E = 64, k = 8;
        size_t n = 10000019;
        float *dloss = d_f32(rnd_f32(N, 5), N, 0), *dx = d_f32(rnd_f32(n, 1), n, 0);
        int *dt = d_i32(make_targets(N, 100), N);
        double *acc = dalloc(4 * sizeof(double));
        cuda_loss_sum(acc, dloss, dt, N);
        cuda_loss_sum(acc + 1, dloss, dt, N);
        cuda_sum_squares(acc + 2, dx, n);
        cuda_sum_squares(acc + 3, dx, n);
        double h[4];
        cuda_to_host(h, acc, sizeof h);
        check_same(NAME("loss_sum N=%d", N), &h[0], &h[1], sizeof(double));
        check_same(NAME("sum_squares n=%zu", n), &h[2], &h[3], sizeof(double));
        float *p = cpu_probs(N, E, GATING_SIGMOID, 2), *counts = hf(E);
        for (int e = 0; e < E; e++) counts[e] = (float)(N * k / E + e % 5);
        float *dp = d_f32(p, (size_t)N * E, 0), *dc = d_f32(counts, E, 0), *dl = d_f32(rnd_f32((size_t)N * E, 4), (size_t)N * E, 0);
        float *o = dalloc(4 * sizeof(float));
        cuda_lb_loss_forward(o, dp, dc, (float)N, N, E, k, GATING_SIGMOID);
        cuda_lb_loss_forward(o + 1, dp, dc, (float)N, N, E, k, GATING_SIGMOID);
        cuda_zloss_forward(o + 2, dl, N, E);
        cuda_zloss_forward(o + 3, dl, N, E);
        float ho[4];
        cuda_to_host(ho, o, sizeof ho);
        check_same(NAME("lb_loss_forward N=%d E=%d", N, E), &ho[0], &ho[1], sizeof(float));
        check_same(NAME("zloss_forward N=%d E=%d", N, E), &ho[2], &ho[3], sizeof(float));
        release();
    }
}

// ---- CUDA graph capture --------------------------------------------------------------
// The ops with scratch buffers or several launches, run once directly and
// once as a replayed graph from the same starting values: the capture fails
// on any host synchronisation or allocation, and the replay must match.

typedef struct {
    int N, E, k, C, V, R;
    int *idx, *off, *row_of, *tor, *tok, *tgt;
    void *x, *xp, *dxp, *dx, *gout, *gin, *w, *logits, *ygrad;
    float *dwte, *dw, *rstd, *probs, *counts, *lb, *losses;
    double *acc;
    size_t dwte_bytes;
} CapCase;

static void cap_reset(CapCase *c) {  // accumulators to zero (outside the graph)
    cuda_zero(c->dwte, c->dwte_bytes);
    cuda_zero(c->dw, c->C * 4);
    cuda_zero(c->acc, 2 * sizeof(double));
    cuda_synchronize();
}
static void cap_run(CapCase *c) {
    cuda_moe_route_index(c->off, c->row_of, c->tor, c->idx, c->N, c->E, c->k);
    cuda_permute_forward(c->xp, c->x, c->tor, c->R, c->C);
    cuda_permute_backward(c->dx, c->dxp, c->tor, c->N, c->R, c->C, 0);
    cuda_embedding_backward(c->dwte, c->gout, c->tok, c->N, c->C);
    cuda_rmsnorm_backward(c->gin, c->dw, c->gout, c->x, c->w, c->rstd, c->N, c->C, 0);
    cuda_lb_loss_forward(c->lb, c->probs, c->counts, (float)c->N, c->N, c->E, c->k, GATING_SOFTMAX);
    cuda_zloss_forward(c->lb + 1, c->probs, c->N, c->E);
    cuda_crossentropy_forward(c->losses, c->logits, c->tgt, c->N, c->V);
    cuda_crossentropy_backward(c->ygrad, c->logits, c->tgt, 0.5f, c->N, c->V);
    cuda_loss_sum(c->acc, c->losses, c->tgt, c->N);
    cuda_sum_squares(c->acc + 1, c->dw, c->C);
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
    for (int i = 0; i < CAP_OUTS; i++) { h[i] = host_copy(d[i], b[i]); bytes[i] = b[i]; names[i] = nm[i]; }
}

static void test_capture(void) {
    printf("-- CUDA graph: capture, replay, compare with the direct run bit for bit\n");
    CapCase c = {.N = 2048, .E = 64, .k = 8, .C = 1024, .V = 4099};
    c.R = c.N * c.k;
    size_t nc = (size_t)c.N * c.C, rc = (size_t)c.R * c.C;
    int Vtok = 5000;
    c.idx = d_i32(make_idx(c.N, c.E, c.k, 1), c.R);
    c.off = d_i32_poison(c.E + 1);
    c.row_of = d_i32_poison(c.R);
    c.tor = d_i32_poison(c.R);
    c.tok = d_i32(make_tokens(c.N, Vtok, 30), c.N);
    c.tgt = d_i32(make_targets(c.N, c.V), c.N);
    c.x = d_bf16(rnd_bf16(nc, 1), nc, 0);
    c.xp = d_bf16_poison(rc, 0);
    c.dxp = d_bf16(rnd_bf16(rc, 1), rc, 0);
    c.dx = d_bf16_poison(nc, 0);
    c.gout = d_bf16(rnd_bf16(nc, 1), nc, 0);
    c.gin = d_bf16_poison(nc, 0);
    c.w = d_bf16(rnd_bf16_around1(c.C, 0.3f), c.C, 0);
    c.logits = d_bf16(rnd_bf16((size_t)c.N * c.V, 4), (size_t)c.N * c.V, 0);
    c.ygrad = d_bf16_poison((size_t)c.N * c.V, 0);
    c.dwte_bytes = (size_t)Vtok * c.C * 4;
    c.dwte = dalloc(c.dwte_bytes);
    c.dw = dalloc(c.C * 4);
    float *rstd = hf(c.N);
    for (int n = 0; n < c.N; n++) rstd[n] = 0.5f + 0.5f * fabsf(urand());
    c.rstd = d_f32(rstd, c.N, 0);
    c.probs = d_f32(cpu_probs(c.N, c.E, GATING_SOFTMAX, 2), (size_t)c.N * c.E, 0);
    float *counts = hf(c.E);
    for (int e = 0; e < c.E; e++) counts[e] = (float)(c.N * c.k / c.E + e % 5);
    c.counts = d_f32(counts, c.E, 0);
    c.lb = d_f32_poison(2, 0);
    c.losses = d_f32_poison(c.N, 0);
    c.acc = dalloc(2 * sizeof(double));

    void *direct[CAP_OUTS], *replay[CAP_OUTS];
    size_t bytes[CAP_OUTS];
    const char *names[CAP_OUTS];
    cap_reset(&c);
    cap_run(&c);  // sizes every scratch buffer
    cap_outputs(&c, direct, bytes, names);

    char err[256] = "";
    cuda_capture_begin();
    cap_run(&c);
    void *exec = cuda_capture_end(err, sizeof err);
    printf("%s %-48s %s\n", exec ? "ok  " : "FAIL", "capture of the ops above", exec ? "" : err);
    if (!exec) { gt_fail++; release(); return; }
    gt_pass++;
    cap_reset(&c);
    cuda_graph_launch(exec);
    cuda_synchronize();
    cap_outputs(&c, replay, bytes, names);
    for (int i = 0; i < CAP_OUTS; i++) check_same(NAME("replay = direct: %s", names[i]), replay[i], direct[i], bytes[i]);
    cuda_graph_free(exec);
    release();
}

// ---- bandwidth -------------------------------------------------------------------------------
// Median of 10 timed runs after 3 warm-up runs; working sets smaller than
// a few times the 50 MB L2 rotate over NSETS copies. Bytes are the minimum
// each kernel must move (each input read once, each output written once).

#define NSETS 4
#define COPY_GBS 4300.0

typedef void (*BenchFn)(void *ctx, int rep);
static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}
static void bench(const char *what, BenchFn fn, void *ctx, double bytes) {
    for (int i = 0; i < 3; i++) fn(ctx, i);
    float t[10];
    for (int i = 0; i < 10; i++) {
        void *a = cuda_event_record();
        fn(ctx, i);
        void *b = cuda_event_record();
        t[i] = cuda_event_elapsed_ms(a, b);
    }
    qsort(t, 10, sizeof(float), cmp_float);
    double ms = 0.5 * (t[4] + t[5]), gbs = bytes / (ms * 1e-3) / 1e9;
    printf("perf %-44s %9.1f us %7.0f GB/s (%3.0f%% of the %.0f GB/s copy rate)\n", what, ms * 1e3, gbs,
           100 * gbs / COPY_GBS, COPY_GBS);
}

typedef struct {
    int N, C, V, k, R;
    size_t n;
    void *a[NSETS], *b[NSETS], *c[NSETS], *w;
    float *f[NSETS], *g, *m, *v;
    int *idx, *tor, *row_of, *off;
    double *acc;
} Bench;

static void *dev_random_bf16(size_t n, float scale) {  // a random block tiled (fast for huge n)
    size_t blk = n < (1u << 20) ? n : (1u << 20);
    uint16_t *h = malloc(n * 2 + 2);
    for (size_t i = 0; i < blk; i++) h[i] = f2bf(urand() * scale);
    for (size_t i = blk; i < n; i++) h[i] = h[i % blk];
    void *d = dalloc(n * 2);
    cuda_to_device(d, h, n * 2);
    free(h);
    return d;
}
static float *dev_random_f32(size_t n, float scale, int positive) {
    size_t blk = n < (1u << 20) ? n : (1u << 20);
    float *h = malloc(n * 4 + 4);
    for (size_t i = 0; i < blk; i++) h[i] = positive ? fabsf(urand() * scale) : urand() * scale;
    for (size_t i = blk; i < n; i++) h[i] = h[i % blk];
    float *d = dalloc(n * 4);
    cuda_to_device(d, h, n * 4);
    free(h);
    return d;
}

static void b_rmsnorm_fwd(void *p, int i) {
    Bench *b = p;
    cuda_rmsnorm_forward(b->b[i % NSETS], b->f[i % NSETS], b->a[i % NSETS], b->w, b->N, b->C, 1e-5f);
}
static void b_rmsnorm_bwd(void *p, int i) {
    Bench *b = p;
    cuda_rmsnorm_backward(b->c[i % NSETS], b->g, b->b[i % NSETS], b->a[i % NSETS], b->w, b->f[i % NSETS], b->N, b->C, 0);
}
static void b_swiglu_fwd(void *p, int i) {
    Bench *b = p;
    (void)i;
    cuda_swiglu_forward(b->c[0], b->a[0], b->b[0], b->n);
}
static void b_route_index(void *p, int i) {
    Bench *b = p;
    (void)i;
    cuda_moe_route_index(b->off, b->row_of, b->tor, b->idx, b->N, 64, b->k);
}
static void b_permute_fwd(void *p, int i) {
    Bench *b = p;
    (void)i;
    cuda_permute_forward(b->b[0], b->a[0], b->tor, b->R, b->C);
}
static void b_permute_bwd(void *p, int i) {
    Bench *b = p;
    (void)i;
    cuda_permute_backward(b->a[0], b->b[0], b->tor, b->N, b->R, b->C, 0);
}
static void b_unpermute_fwd(void *p, int i) {
    Bench *b = p;
    (void)i;
    cuda_unpermute_forward(b->a[0], b->b[0], b->g, b->row_of, b->N, b->k, b->C, 0);
}
static void b_embedding_bwd(void *p, int i) {
    Bench *b = p;
    (void)i;
    cuda_embedding_backward(b->m, b->a[0], b->idx, b->N, b->C);
}
static void b_ce_fwd(void *p, int i) {
    Bench *b = p;
    (void)i;
    cuda_crossentropy_forward(b->g, b->a[0], b->idx, b->N, b->V);
}
static void b_ce_bwd(void *p, int i) {
    Bench *b = p;
    (void)i;
    cuda_crossentropy_backward(b->a[0], b->a[0], b->idx, 1.f / b->N, b->N, b->V);
}
static void b_adamw(void *p, int i) {
    Bench *b = p;
    cuda_adamw_update(b->f[0], b->a[0], b->g, b->m, b->v, b->n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.f, 1 + i);
}
static void b_sum_squares(void *p, int i) {
    Bench *b = p;
    (void)i;
    cuda_sum_squares(b->acc, b->f[0], b->n);
}

static void test_bandwidth(void) {
    printf("-- bandwidth (OLMoE-1B-7B shapes; GB/s of the minimum traffic)\n");
    {
        Bench b = {.N = 4096, .C = 2048};
        size_t nc = (size_t)b.N * b.C;
        for (int s = 0; s < NSETS; s++) {
            b.a[s] = dev_random_bf16(nc, 2);
            b.b[s] = dev_random_bf16(nc, 1);
            b.c[s] = dalloc(nc * 2);
            b.f[s] = dev_random_f32(b.N, 1, 1);
        }
        b.w = dev_random_bf16(b.C, 1);
        b.g = dalloc(b.C * 4);
        bench("rmsnorm_forward N=4096 C=2048", b_rmsnorm_fwd, &b, 2.0 * nc * 2 + b.N * 4);
        bench("rmsnorm_backward N=4096 C=2048", b_rmsnorm_bwd, &b, 3.0 * nc * 2 + b.N * 4);
        release();
    }
    {
        Bench b = {.n = (size_t)32768 * 1024};
        b.a[0] = dev_random_bf16(b.n, 3);
        b.b[0] = dev_random_bf16(b.n, 1);
        b.c[0] = dalloc(b.n * 2);
        bench("swiglu_forward n=32768x1024", b_swiglu_fwd, &b, 3.0 * b.n * 2);
        release();
    }
    {
        Bench b = {.N = 4096, .C = 2048, .k = 8};
        b.R = b.N * b.k;
        size_t nc = (size_t)b.N * b.C, rc = (size_t)b.R * b.C;
        b.idx = d_i32(make_idx(b.N, 64, b.k, 1), b.R);
        b.off = dalloc(65 * 4);
        b.row_of = dalloc(b.R * 4);
        b.tor = dalloc(b.R * 4);
        b.a[0] = dev_random_bf16(nc, 1);
        b.b[0] = dev_random_bf16(rc, 1);
        b.g = dev_random_f32(b.R, 1, 1);
        bench("moe_route_index N=4096 E=64 k=8", b_route_index, &b, 2.0 * b.R * 4 + 2.0 * b.R * 4);
        bench("permute_forward R=32768 C=2048", b_permute_fwd, &b, 2.0 * rc * 2);
        bench("permute_backward N=4096 k=8 C=2048", b_permute_bwd, &b, (double)rc * 2 + nc * 2);
        bench("unpermute_forward N=4096 k=8 C=2048", b_unpermute_fwd, &b, (double)rc * 2 + nc * 2);
        release();
    }
    {
        Bench b = {.N = 4096, .C = 2048, .V = 50304};
        size_t nc = (size_t)b.N * b.C;
        b.idx = d_i32(make_tokens(b.N, b.V, 200), b.N);
        b.a[0] = dev_random_bf16(nc, 1);
        b.m = dalloc((size_t)b.V * b.C * 4);
        bench("embedding_backward N=4096 C=2048", b_embedding_bwd, &b, (double)nc * 2 + 2.0 * nc * 4);
        release();
    }
    {
        Bench b = {.N = 4096, .V = 50304};
        size_t nv = (size_t)b.N * b.V;
        b.a[0] = dev_random_bf16(nv, 4);
        b.idx = d_i32(make_targets(b.N, b.V), b.N);
        b.g = dalloc(b.N * 4);
        bench("crossentropy_forward N=4096 V=50304", b_ce_fwd, &b, (double)nv * 2);
        bench("crossentropy_backward in place N=4096 V=50304", b_ce_bwd, &b, 2.0 * nv * 2);
        release();
    }
    {
        Bench b = {.n = (size_t)64 << 20};
        b.f[0] = dev_random_f32(b.n, 1, 0);
        b.g = dev_random_f32(b.n, 1, 0);
        b.m = dev_random_f32(b.n, 0.1f, 0);
        b.v = dev_random_f32(b.n, 0.01f, 1);
        b.a[0] = dalloc(b.n * 2);
        b.acc = dalloc(8);
        bench("adamw_update n=64M (+ bf16 copy)", b_adamw, &b, b.n * (4.0 * 4 + 3 * 4 + 2));
        bench("sum_squares n=64M", b_sum_squares, &b, b.n * 4.0);
        release();
    }
}

int main(void) {
    printf("-- elementwise\n");
    test_cast(1000003, 0);
    test_cast(4099, 1);
    test_elementwise(1000003, 0);
    test_elementwise(4099, 1);
    test_swiglu((size_t)32768 * 1024, 0);
    test_swiglu(1001, 0);
    test_swiglu(4099, 1);

    printf("-- embedding, rmsnorm, rope\n");
    test_embedding(4096, 2048, 50304, 100, 0);
    test_embedding(37, 100, 13, 3, 0);
    test_embedding(300, 256, 1000, 1, 1);  // one hot id: a run of ~150 positions
    test_rmsnorm(4096, 2048, 0, 0);
    test_rmsnorm(4096, 2048, 1, 0);
    test_rmsnorm(65536, 128, 0, 0);  // per-head QK-norm rows
    test_rmsnorm(4096, 1024, 1, 0);
    test_rmsnorm(777, 512, 0, 0);
    test_rmsnorm(5, 24, 1, 0);      // fast path, lanes past C idle
    test_rmsnorm(9, 1544, 1, 0);    // block per row: 193 of 224 threads busy, fewer rows than blocks
    test_rmsnorm(37, 100, 1, 0);    // general path, C not a multiple of 8
    test_rmsnorm(33, 4096, 1, 0);   // general path, vectorised
    test_rmsnorm(1000, 2048, 1, 1); // general path, scalar
    test_rope(2, 256, 16, 128, 0, 0);
    test_rope(2, 64, 16, 128, 1, 0);
    test_rope(2, 17, 4, 64, 0, 0);
    test_rope(1, 5, 3, 6, 0, 0);     // hd/2 = 3: scalar
    test_rope(2, 33, 4, 128, 1, 1);  // in place, misaligned

    printf("-- router\n");
    for (int g = 0; g < 2; g++)
        for (int acc = 0; acc < 2; acc++) {
            test_router_probs(4096, 64, (Gating)g, acc);
            test_router_probs(5, 7, (Gating)g, acc);
        }
    test_router_probs(300, 100, GATING_SOFTMAX, 0);
    test_router_topk(4096, 64, 8, ROUTING_LEARNED, 0, 0, 0);
    test_router_topk(4096, 64, 8, ROUTING_LEARNED, 1, 0, 0);
    test_router_topk(4096, 64, 8, ROUTING_LEARNED, 1, 1, 0);
    test_router_topk(4096, 64, 8, ROUTING_LEARNED, 0, 1, 0);
    test_router_topk(1000, 256, 16, ROUTING_LEARNED, 1, 1, 0);
    test_router_topk(9, 7, 7, ROUTING_LEARNED, 1, 1, 0);
    test_router_topk(5, 7, 3, ROUTING_LEARNED, 0, 0, 0);
    test_router_topk(4096, 64, 8, ROUTING_RANDOM, 0, 0, 0x1234);
    test_router_topk(4096, 64, 8, ROUTING_RANDOM, 0, 0, 0xfedcba9876543210ULL);
    test_router_topk(1000, 256, 64, ROUTING_RANDOM, 0, 0, 42);
    test_router_topk(100, 7, 7, ROUTING_RANDOM, 0, 0, 3);
    test_router_topk(4096, 64, 8, ROUTING_UNIFORM, 0, 0, 0);
    test_router_topk(37, 7, 3, ROUTING_UNIFORM, 0, 0, 0);
    for (int renorm = 0; renorm < 2; renorm++)
        for (int acc = 0; acc < 2; acc++) {
            test_router_weights(4096, 64, 8, renorm, acc);
            test_router_weights(5, 7, 3, renorm, acc);
        }
    test_router_count(4096, 64, 8);
    test_router_count(5, 7, 3);
    for (int g = 0; g < 2; g++) {
        test_lb_loss(4096, 64, 8, (Gating)g, 4096.f);
        test_lb_loss(4096, 64, 8, (Gating)g, 3 * 4096.f);
        test_lb_loss(5, 7, 3, (Gating)g, 5.f);
    }
    test_zloss(4096, 64);
    test_zloss(5, 7);

    printf("-- dispatch\n");
    for (int kind = 0; kind < 3; kind++) test_route_index(4096, 64, 8, kind);
    test_route_index(5, 7, 3, 0);
    test_route_index(33, 1, 2, 2);
    test_route_index(100, 256, 16, 1);
    for (int acc = 0; acc < 2; acc++) {
        test_permute(4096, 8, 2048, acc, 0);
        test_permute(37, 3, 100, acc, 0);
        test_permute(300, 4, 256, acc, 1);
        test_permute_backward_uneven(50, 300, 64, acc);
        test_permute_backward_uneven(50, 300, 2056, acc);  // C > 2048: two channel passes
        test_unpermute(4096, 8, 2048, acc, 0);
        test_unpermute(37, 3, 100, acc, 0);
        test_unpermute(300, 4, 256, acc, 1);
        test_unpermute(100, 6, 1000, acc, 0);  // slots in two groups, the second partial
    }

    printf("-- loss\n");
    test_crossentropy(1024, 50304, 0);
    test_crossentropy(7, 1001, 0);
    test_crossentropy(64, 50257, 0);
    test_crossentropy(3, 8, 0);
    test_crossentropy(16, 4104, 1);
    test_loss_sum(4096);
    test_loss_sum(3);

    printf("-- optimizer\n");
    test_adamw(1000003, 1, 1, 0);
    test_adamw(1000003, 0, 1000, 0);
    test_adamw(4099, 1, 7, 1);
    test_sum_squares(10000019, 0);
    test_sum_squares(1, 0);
    test_sum_squares(4099, 1);

    test_determinism();
    test_capture();
    test_bandwidth();
    return gt_finish();
}
