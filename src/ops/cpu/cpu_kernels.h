// The CPU kernels, written once over the scalar type `real`.
//
// ops_cpu.c includes this file with real = float to build the ops_cpu table;
// tests/test_ops_grad.c includes it with real = double so that every backward
// is checked against central finite differences in double precision on the
// very same code. Everything here is static; define `real` (and REAL_IS_DOUBLE
// for double) before including. Matmuls go through OpenBLAS, loops through
// OpenMP. Semantics of each kernel: see src/ops/ops.h.
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef REAL_IS_DOUBLE
#define GEMM cblas_dgemm
#else
#define GEMM cblas_sgemm
#endif

// out[N,C] = wte[tokens[n], :]
static void cpu_embedding_forward(real *out, const int *tokens, const real *wte, int N, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) memcpy(out + (size_t)n * C, wte + (size_t)tokens[n] * C, C * sizeof(real));
}

static void cpu_embedding_backward(real *dwte, const real *dout, const int *tokens, int N, int C) {
    // serial over tokens: repeated ids would race
    for (int n = 0; n < N; n++) {
        real *d = dwte + (size_t)tokens[n] * C;
        const real *g = dout + (size_t)n * C;
        for (int c = 0; c < C; c++) d[c] += g[c];
    }
}

// out[N,OC] = inp[N,C] w[OC,C]^T
static void cpu_matmul_forward(real *out, const real *inp, const real *w, int N, int C, int OC) {
    if (N == 0) return;
    GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1, inp, C, w, C, 0, out, OC);
}

static void cpu_matmul_backward(real *dinp, real *dw, const real *dout, const real *inp,
                                const real *w, int N, int C, int OC, int accumulate) {
    if (N == 0) {
        return;
    }
    if (dinp) // dinp[N,C] = dout[N,OC] w[OC,C]
        GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1, dout, OC, w, C,
             accumulate ? 1 : 0, dinp, C);
    if (dw) // dw[OC,C] += dout^T[OC,N] inp[N,C]
        GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1, dout, OC, inp, C, 1, dw, C);
}

static void cpu_rmsnorm_forward(real *out, real *rstd, const real *inp, const real *w, int N, int C,
                                real eps) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const real *x = inp + (size_t)n * C;
        real *o = out + (size_t)n * C;
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        real r = (real)(1.0 / sqrt(ss / C + eps));
        for (int c = 0; c < C; c++) o[c] = x[c] * r * w[c];
        rstd[n] = r;
    }
}

// y = x r w, r = (mean(x^2)+eps)^-1/2:  dx = r (w dy) - x r^3 mean(x w dy)
static void cpu_rmsnorm_backward(real *dinp, real *dw, const real *dout, const real *inp,
                                 const real *w, const real *rstd, int N, int C, int accumulate) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const real *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        real *dx = dinp + (size_t)n * C;
        real r = rstd[n];
        double dot = 0;
        for (int c = 0; c < C; c++) dot += (double)x[c] * w[c] * dy[c];
        real k = (real)(dot / C) * r * r * r;
        for (int c = 0; c < C; c++) {
            real g = r * w[c] * dy[c] - x[c] * k;
            dx[c] = accumulate ? dx[c] + g : g;
        }
    }
    // dw[c] += sum_n dy x r ; parallel over channels so no two threads share dw[c]
#pragma omp parallel for
    for (int c = 0; c < C; c++) {
        double s = 0;
        for (int n = 0; n < N; n++) s += (double)dout[(size_t)n * C + c] * inp[(size_t)n * C + c] * rstd[n];
        dw[c] += (real)s;
    }
}

// x is [B, T, nh, hd]; rotate pairs (i, i + hd/2) by angle t * f_i
static void cpu_rope(real *out, const real *inp, const float *cos_t, const float *sin_t, int B,
                     int T, int nh, int hd, real sign) {
    int half = hd / 2;
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *cs = cos_t + (size_t)t * half, *sn = sin_t + (size_t)t * half;
            for (int h = 0; h < nh; h++) {
                size_t base = (((size_t)b * T + t) * nh + h) * hd;
                for (int i = 0; i < half; i++) {
                    real a = inp[base + i], bb = inp[base + i + half];
                    real c = cs[i], s = sign * sn[i];
                    out[base + i] = a * c - bb * s;
                    out[base + i + half] = bb * c + a * s;
                }
            }
        }
}
static void cpu_rope_forward(real *out, const real *inp, const float *cos_t, const float *sin_t,
                             int B, int T, int nh, int hd) {
    cpu_rope(out, inp, cos_t, sin_t, B, T, nh, hd, 1);
}
// The rotation is orthogonal: its transpose is the rotation by -angle.
static void cpu_rope_backward(real *dinp, const real *dout, const float *cos_t, const float *sin_t,
                              int B, int T, int nh, int hd) {
    cpu_rope(dinp, dout, cos_t, sin_t, B, T, nh, hd, -1);
}

// Causal attention, GQA. q [B,T,H,hd], k/v [B,T,KV,hd]; att [B,H,T,T] probabilities.
// Query t sees keys lo..t, lo = doc_start[b*T+t] (0 when doc_start is NULL).
static void cpu_attention_forward(real *out, real *att, const real *q, const real *k, const real *v,
                                  const int *doc_start, int B, int T, int H, int KV, int hd) {
    int group = H / KV;
    real scale = (real)(1.0 / sqrt((double)hd));
#pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                int g = h / group;
                const real *qv = q + (((size_t)b * T + t) * H + h) * hd;
                real *a = att + (((size_t)b * H + h) * T + t) * T;
                int lo = doc_start ? doc_start[(size_t)b * T + t] : 0;
                real mx = -INFINITY;
                for (int s = lo; s <= t; s++) {
                    const real *kv = k + (((size_t)b * T + s) * KV + g) * hd;
                    real dot = 0;
                    for (int i = 0; i < hd; i++) dot += qv[i] * kv[i];
                    a[s] = dot * scale;
                    if (a[s] > mx) mx = a[s];
                }
                real sum = 0;
                for (int s = lo; s <= t; s++) { a[s] = (real)exp(a[s] - mx); sum += a[s]; }
                for (int s = lo; s <= t; s++) a[s] /= sum;
                for (int s = 0; s < lo; s++) a[s] = 0;
                for (int s = t + 1; s < T; s++) a[s] = 0;
                real *o = out + (((size_t)b * T + t) * H + h) * hd;
                for (int i = 0; i < hd; i++) o[i] = 0;
                for (int s = lo; s <= t; s++) {
                    const real *vv = v + (((size_t)b * T + s) * KV + g) * hd;
                    for (int i = 0; i < hd; i++) o[i] += a[s] * vv[i];
                }
            }
}

// scratch: datt [B,H,T,T]; doc_start as in the forward
static void cpu_attention_backward(real *dq, real *dk, real *dv, const real *dout, const real *att,
                                   const real *q, const real *k, const real *v, const int *doc_start,
                                   real *scratch, int B, int T, int H, int KV, int hd) {
    int group = H / KV;
    real scale = (real)(1.0 / sqrt((double)hd));
    real *dpre = scratch;
    // pass 1, parallel over (b, h, t): dq and the pre-softmax grads
#pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                int g = h / group;
                const real *a = att + (((size_t)b * H + h) * T + t) * T;
                real *dp = dpre + (((size_t)b * H + h) * T + t) * T;
                const real *dov = dout + (((size_t)b * T + t) * H + h) * hd;
                // datt[s] = <do, v_s>; dpre[s] = a[s] (datt[s] - sum_j a[j] datt[j])
                int lo = doc_start ? doc_start[(size_t)b * T + t] : 0;
                real dot_sum = 0;
                for (int s = lo; s <= t; s++) {
                    const real *vv = v + (((size_t)b * T + s) * KV + g) * hd;
                    real d = 0;
                    for (int i = 0; i < hd; i++) d += dov[i] * vv[i];
                    dp[s] = d;
                    dot_sum += a[s] * d;
                }
                for (int s = lo; s <= t; s++) dp[s] = a[s] * (dp[s] - dot_sum) * scale;
                real *dqv = dq + (((size_t)b * T + t) * H + h) * hd;
                for (int i = 0; i < hd; i++) dqv[i] = 0;
                for (int s = lo; s <= t; s++) {
                    const real *kv = k + (((size_t)b * T + s) * KV + g) * hd;
                    for (int i = 0; i < hd; i++) dqv[i] += dp[s] * kv[i];
                }
            }
    // pass 2, parallel over (b, kv head, s): dk and dv gather over the queries t >= s
    // that see s (dpre holds nothing for the others)
#pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++)
        for (int g = 0; g < KV; g++)
            for (int s = 0; s < T; s++) {
                real *dkv = dk + (((size_t)b * T + s) * KV + g) * hd;
                real *dvv = dv + (((size_t)b * T + s) * KV + g) * hd;
                for (int i = 0; i < hd; i++) { dkv[i] = 0; dvv[i] = 0; }
                for (int h = g * group; h < (g + 1) * group; h++)
                    for (int t = s; t < T; t++) {
                        if (doc_start && doc_start[(size_t)b * T + t] > s) continue;
                        real a = att[(((size_t)b * H + h) * T + t) * T + s];
                        real dp = dpre[(((size_t)b * H + h) * T + t) * T + s];
                        const real *qv = q + (((size_t)b * T + t) * H + h) * hd;
                        const real *dov = dout + (((size_t)b * T + t) * H + h) * hd;
                        for (int i = 0; i < hd; i++) {
                            dkv[i] += dp * qv[i];
                            dvv[i] += a * dov[i];
                        }
                    }
            }
}
static size_t cpu_attention_saved_floats(int B, int T, int H, int hd) { return (size_t)B * H * T * T; }
static size_t cpu_attention_scratch_floats(int B, int T, int H, int KV, int hd) { return (size_t)B * H * T * T; }

static inline real silu_r(real x) { return x / (1 + (real)exp(-x)); }

static void cpu_swiglu_forward(real *out, const real *gate, const real *up, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = silu_r(gate[i]) * up[i];
}

static void cpu_swiglu_backward(real *dgate, real *dup, const real *dout, const real *gate,
                                const real *up, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        real x = gate[i];
        real sig = 1 / (1 + (real)exp(-x));
        real dsilu = sig * (1 + x * (1 - sig));
        real d = dout[i];
        dgate[i] = d * up[i] * dsilu;
        dup[i] = d * x * sig;
    }
}

// ---- router -------------------------------------------------------------

static void cpu_router_probs_forward(real *probs, const real *logits, int N, int E, Gating g) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const real *l = logits + (size_t)n * E;
        real *p = probs + (size_t)n * E;
        if (g == GATING_SIGMOID) {
            for (int e = 0; e < E; e++) p[e] = 1 / (1 + (real)exp(-l[e]));
        } else {
            real mx = l[0];
            for (int e = 1; e < E; e++) if (l[e] > mx) mx = l[e];
            real sum = 0;
            for (int e = 0; e < E; e++) { p[e] = (real)exp(l[e] - mx); sum += p[e]; }
            for (int e = 0; e < E; e++) p[e] /= sum;
        }
    }
}

static void cpu_router_probs_backward(real *dlogits, const real *dprobs, const real *probs, int N,
                                      int E, Gating g, int accumulate) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const real *p = probs + (size_t)n * E, *dp = dprobs + (size_t)n * E;
        real *dl = dlogits + (size_t)n * E;
        real dot = 0;
        if (g == GATING_SOFTMAX) for (int e = 0; e < E; e++) dot += p[e] * dp[e];
        for (int e = 0; e < E; e++) {
            real d = g == GATING_SIGMOID ? dp[e] * p[e] * (1 - p[e]) : p[e] * (dp[e] - dot);
            dl[e] = accumulate ? dl[e] + d : d;
        }
    }
}

static inline uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void cpu_router_topk(int *idx, const real *probs, const float *bias, int N, int E, int k,
                            RoutingMode mode, uint64_t seed) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        int *out = idx + (size_t)n * k;
        if (mode == ROUTING_UNIFORM) {
            for (int s = 0; s < k; s++) out[s] = (int)(((int64_t)n * k + s) % E);
        } else if (mode == ROUTING_RANDOM) {
            // k distinct experts: partial Fisher-Yates, generator keyed by (seed, n)
            uint64_t st = seed ^ (0x632be59bd9b4e019ULL * (uint64_t)(n + 1));
            int perm[E];
            for (int e = 0; e < E; e++) perm[e] = e;
            for (int s = 0; s < k; s++) {
                int j = s + (int)(splitmix64(&st) % (uint64_t)(E - s));
                int tmp = perm[s]; perm[s] = perm[j]; perm[j] = tmp;
                out[s] = perm[s];
            }
        } else {
            // top-k by selection; strict > keeps the lower index on ties
            const real *p = probs + (size_t)n * E;
            for (int s = 0; s < k; s++) {
                int best = -1;
                real bv = 0;
                for (int e = 0; e < E; e++) {
                    int taken = 0;
                    for (int j = 0; j < s; j++) taken |= out[j] == e;
                    if (taken) continue;
                    real val = p[e] + (bias ? bias[e] : 0);
                    if (best < 0 || val > bv) { best = e; bv = val; }
                }
                out[s] = best;
            }
        }
    }
}

static void cpu_router_weights_forward(real *weights, const real *probs, const int *idx, int N,
                                       int E, int k, int renorm) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        real sum = 0;
        for (int s = 0; s < k; s++) {
            real w = probs[(size_t)n * E + idx[(size_t)n * k + s]];
            weights[(size_t)n * k + s] = w;
            sum += w;
        }
        if (renorm)
            for (int s = 0; s < k; s++) weights[(size_t)n * k + s] /= sum;
    }
}

// renorm: w_s = p_s / S, S = sum_j p_j  =>  dp_s = (dw_s - sum_j dw_j w_j) / S
static void cpu_router_weights_backward(real *dprobs, const real *dweights, const real *probs,
                                        const int *idx, int N, int E, int k, int renorm,
                                        int accumulate) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        real *dp = dprobs + (size_t)n * E;
        const real *dw = dweights + (size_t)n * k;
        const int *ix = idx + (size_t)n * k;
        if (!accumulate) for (int e = 0; e < E; e++) dp[e] = 0;
        if (!renorm) {
            for (int s = 0; s < k; s++) dp[ix[s]] += dw[s];
            continue;
        }
        real S = 0, dot = 0;
        for (int s = 0; s < k; s++) S += probs[(size_t)n * E + ix[s]];
        for (int s = 0; s < k; s++) dot += dw[s] * probs[(size_t)n * E + ix[s]] / S;
        for (int s = 0; s < k; s++) dp[ix[s]] += (dw[s] - dot) / S;
    }
}

static void cpu_router_count(float *counts, const int *idx, int N, int E, int k) {
    for (size_t i = 0; i < (size_t)N * k; i++) counts[idx[i]] += 1;
}

static inline void cpu_router_bias_update(float *bias, const float *counts, int L, int E, float rate) {
    for (int l = 0; l < L; l++) {
        const float *cnt = counts + (size_t)l * E;
        float *b = bias + (size_t)l * E;
        double mean = 0;
        for (int e = 0; e < E; e++) mean += cnt[e];
        mean /= E;
        for (int e = 0; e < E; e++) b[e] += rate * (cnt[e] < mean ? 1.0f : cnt[e] > mean ? -1.0f : 0.0f);
    }
}

// count_tokens <= 0: the tokens the counts cover (ops.h), summed in FP64
static float cpu_lb_count_tokens(const float *counts, float count_tokens, int E, int k) {
    if (count_tokens > 0) return count_tokens;
    double s = 0;
    for (int e = 0; e < E; e++) s += counts[e];
    return (float)(s / k);
}

// LB = (E/k) sum_i f_i P_i ;  f_i = counts_i / count_tokens ;  P_i = mean_t p̂_ti
static real cpu_lb_loss_forward(const real *probs, const float *counts, float count_tokens, int N,
                                int E, int k, Gating g) {
    count_tokens = cpu_lb_count_tokens(counts, count_tokens, E, k);
    double P[E];
    for (int e = 0; e < E; e++) P[e] = 0;
    for (int n = 0; n < N; n++) {
        const real *p = probs + (size_t)n * E;
        double denom = 1;
        if (g == GATING_SIGMOID) { denom = 0; for (int j = 0; j < E; j++) denom += p[j]; }
        for (int e = 0; e < E; e++) P[e] += p[e] / denom;
    }
    double loss = 0;
    for (int e = 0; e < E; e++) loss += (double)counts[e] / count_tokens * (P[e] / N);
    return (real)(loss * E / k);
}

static void cpu_lb_loss_backward(real *dprobs, const real *probs, const float *counts,
                                 float count_tokens, int N, int E, int k, Gating g, real scale) {
    count_tokens = cpu_lb_count_tokens(counts, count_tokens, E, k);
    // dLB/dp̂_ti = (E/k) f_i / N
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const real *p = probs + (size_t)n * E;
        real *dp = dprobs + (size_t)n * E;
        real c = scale * (real)E / (real)k / (real)N / count_tokens;
        if (g != GATING_SIGMOID) {
            for (int e = 0; e < E; e++) dp[e] += c * counts[e];
            continue;
        }
        // p̂_i = p_i / S:  dp_j = (dp̂_j - sum_i dp̂_i p̂_i) / S
        real S = 0, dot = 0;
        for (int e = 0; e < E; e++) S += p[e];
        for (int e = 0; e < E; e++) dot += c * counts[e] * p[e] / S;
        for (int e = 0; e < E; e++) dp[e] += (c * counts[e] - dot) / S;
    }
}

// Reductions sum fixed chunks in a fixed order, so results do not depend
// on the thread count or schedule (bit-exact resume needs that).
#define CPU_CHUNKS 64

static double cpu_lse(const real *l, int E) {
    real mx = l[0];
    for (int e = 1; e < E; e++) if (l[e] > mx) mx = l[e];
    double s = 0;
    for (int e = 0; e < E; e++) s += exp((double)(l[e] - mx));
    return mx + log(s);
}

static real cpu_zloss_forward(const real *logits, int N, int E) {
    double part[CPU_CHUNKS];
#pragma omp parallel for
    for (int c = 0; c < CPU_CHUNKS; c++) {
        double s = 0;
        for (int n = (int)((int64_t)N * c / CPU_CHUNKS); n < (int)((int64_t)N * (c + 1) / CPU_CHUNKS); n++) {
            double lse = cpu_lse(logits + (size_t)n * E, E);
            s += lse * lse;
        }
        part[c] = s;
    }
    double total = 0;
    for (int c = 0; c < CPU_CHUNKS; c++) total += part[c];
    return (real)(total / N);
}

// dZ/dl_te = (2/N) lse_t softmax(l_t)_e
static void cpu_zloss_backward(real *dlogits, const real *logits, int N, int E, real scale) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const real *l = logits + (size_t)n * E;
        real *dl = dlogits + (size_t)n * E;
        real mx = l[0];
        for (int e = 1; e < E; e++) if (l[e] > mx) mx = l[e];
        double s = 0;
        for (int e = 0; e < E; e++) s += exp((double)(l[e] - mx));
        double lse = mx + log(s);
        for (int e = 0; e < E; e++)
            dl[e] += (real)(scale * 2.0 / N * lse * exp((double)(l[e] - mx)) / s);
    }
}

// ---- dispatch -------------------------------------------------------------

static void cpu_moe_route_index(int *offsets, int *row_of, int *token_of_row, const int *idx,
                                int N, int E, int k) {
    for (int e = 0; e <= E; e++) offsets[e] = 0;
    for (size_t i = 0; i < (size_t)N * k; i++) offsets[idx[i] + 1]++;
    for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];
    int cursor[E];
    for (int e = 0; e < E; e++) cursor[e] = offsets[e];
    for (int n = 0; n < N; n++)
        for (int s = 0; s < k; s++) {
            int r = cursor[idx[(size_t)n * k + s]]++;
            row_of[(size_t)n * k + s] = r;
            token_of_row[r] = n;
        }
}

static void cpu_permute_forward(real *xp, const real *x, const int *token_of_row, int R, int C) {
#pragma omp parallel for
    for (int r = 0; r < R; r++) memcpy(xp + (size_t)r * C, x + (size_t)token_of_row[r] * C, C * sizeof(real));
}

static void cpu_permute_backward(real *dx, const real *dxp, const int *token_of_row, int N, int R,
                                 int C, int accumulate) {
    if (!accumulate) memset(dx, 0, (size_t)N * C * sizeof(real));
    for (int r = 0; r < R; r++) {
        real *d = dx + (size_t)token_of_row[r] * C;
        const real *g = dxp + (size_t)r * C;
        for (int c = 0; c < C; c++) d[c] += g[c];
    }
}

static void cpu_unpermute_forward(real *out, const real *y, const real *weights, const int *row_of,
                                  int N, int k, int C, int accumulate) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        real *o = out + (size_t)n * C;
        if (!accumulate) for (int c = 0; c < C; c++) o[c] = 0;
        for (int s = 0; s < k; s++) {
            real w = weights[(size_t)n * k + s];
            const real *yr = y + (size_t)row_of[(size_t)n * k + s] * C;
            for (int c = 0; c < C; c++) o[c] += w * yr[c];
        }
    }
}

static void cpu_unpermute_backward(real *dy, real *dweights, const real *dout, const real *y,
                                   const real *weights, const int *row_of, int N, int k, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const real *d = dout + (size_t)n * C;
        for (int s = 0; s < k; s++) {
            int r = row_of[(size_t)n * k + s];
            real w = weights[(size_t)n * k + s];
            const real *yr = y + (size_t)r * C;
            real *dyr = dy + (size_t)r * C;
            real dot = 0;
            for (int c = 0; c < C; c++) { dyr[c] = w * d[c]; dot += d[c] * yr[c]; }
            dweights[(size_t)n * k + s] = dot;
        }
    }
}

static void cpu_grouped_matmul_forward(real *out, const real *inp, const real *w, const int *offsets,
                                       int E, int C, int OC) {
    for (int e = 0; e < E; e++) {
        int r0 = offsets[e], rows = offsets[e + 1] - offsets[e];
        cpu_matmul_forward(out + (size_t)r0 * OC, inp + (size_t)r0 * C, w + (size_t)e * OC * C,
                           rows, C, OC);
    }
}

static void cpu_grouped_matmul_backward(real *dinp, real *dw, const real *dout, const real *inp,
                                        const real *w, const int *offsets, int E, int C, int OC) {
    for (int e = 0; e < E; e++) {
        int r0 = offsets[e], rows = offsets[e + 1] - offsets[e];
        cpu_matmul_backward(dinp ? dinp + (size_t)r0 * C : NULL, dw ? dw + (size_t)e * OC * C : NULL,
                            dout + (size_t)r0 * OC, inp + (size_t)r0 * C, w + (size_t)e * OC * C,
                            rows, C, OC, 0);
    }
}

static void cpu_grouped_dgrad_pair(real *dinp, const real *dout1, const real *w1, const real *dout2,
                                   const real *w2, const int *offsets, int E, int C, int OC) {
    for (int e = 0; e < E; e++) {
        int r0 = offsets[e], rows = offsets[e + 1] - offsets[e];
        size_t wo = (size_t)e * OC * C;
        cpu_matmul_backward(dinp + (size_t)r0 * C, NULL, dout1 + (size_t)r0 * OC, NULL, w1 + wo, rows, C, OC, 0);
        cpu_matmul_backward(dinp + (size_t)r0 * C, NULL, dout2 + (size_t)r0 * OC, NULL, w2 + wo, rows, C, OC, 1);
    }
}

// ---- loss -------------------------------------------------------------------

static void cpu_crossentropy_forward(real *losses, const real *logits, const int *targets, int N,
                                     int V) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        if (targets[n] < 0) { losses[n] = 0; continue; }
        const real *l = logits + (size_t)n * V;
        real mx = l[0];
        for (int v = 1; v < V; v++) if (l[v] > mx) mx = l[v];
        double s = 0;
        for (int v = 0; v < V; v++) s += exp((double)(l[v] - mx));
        losses[n] = (real)(mx + log(s) - l[targets[n]]);
    }
}

static void cpu_crossentropy_backward(real *dlogits, const real *logits, const int *targets,
                                      real dloss, int N, int V) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        real *d = dlogits + (size_t)n * V;
        const real *l = logits + (size_t)n * V;
        if (targets[n] < 0) { for (int v = 0; v < V; v++) d[v] = 0; continue; }
        real mx = l[0];
        for (int v = 1; v < V; v++) if (l[v] > mx) mx = l[v];
        double s = 0;
        for (int v = 0; v < V; v++) s += exp((double)(l[v] - mx));
        // d may alias l: read l[v] before writing d[v]
        for (int v = 0; v < V; v++) d[v] = (real)(exp((double)(l[v] - mx)) / s) * dloss;
        d[targets[n]] -= dloss;
    }
}

// ---- elementwise and optimizer -------------------------------------------------

static void cpu_add_inplace(real *y, const real *x, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}
static inline void cpu_zero(real *x, size_t n) { memset(x, 0, n * sizeof(real)); }
static void cpu_copy(real *dst, const real *src, size_t n) { memcpy(dst, src, n * sizeof(real)); }

// torch.optim.AdamW's arithmetic: p *= 1 - lr wd; m, v EMA; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
static void cpu_adamw_update(real *p, const real *g, real *m, real *v, size_t n, float lr,
                             float beta1, float beta2, float eps, float wd, float grad_scale, int t) {
    double bc1 = 1 - pow(beta1, t), bc2 = 1 - pow(beta2, t);
    real step = (real)(lr / bc1), bc2_sqrt = (real)sqrt(bc2), decay = 1 - (real)lr * (real)wd;
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        real gi = g[i] * grad_scale;
        m[i] = beta1 * m[i] + (1 - beta1) * gi;
        v[i] = beta2 * v[i] + (1 - beta2) * gi * gi;
        p[i] *= decay;
        p[i] -= step * m[i] / ((real)sqrt(v[i]) / bc2_sqrt + eps);
    }
}

static double cpu_sum_squares(const real *x, size_t n) {
    double part[CPU_CHUNKS];
#pragma omp parallel for
    for (int c = 0; c < CPU_CHUNKS; c++) {
        double s = 0;
        for (size_t i = n * c / CPU_CHUNKS; i < n * (c + 1) / CPU_CHUNKS; i++) s += (double)x[i] * x[i];
        part[c] = s;
    }
    double total = 0;
    for (int c = 0; c < CPU_CHUNKS; c++) total += part[c];
    return total;
}
