// The router after its logits matmul (gemm.cu), on FP32 [N, E] rows: gate
// probabilities (softmax or sigmoid) and their backward; the top-k choice
// (learned, random or uniform); the chosen experts' gate weights, optionally
// renormalised, and their backward; the per-expert token counts; the
// load-balancing loss and the z-loss, forward and backward.
//
// One warp per token, lanes over experts, except: random top-k and the
// weights' forward, one thread per token; uniform top-k, one thread per
// (token, slot); counts, one block.
// Numerics follow the CPU where order matters: warp sums and maxima are
// butterflies (fixed order); learned top-k breaks ties to the lower index,
// so the choice and its order equal the CPU's; random top-k uses the CPU's
// generator; counts are an integer histogram (exact). The two losses reduce
// in two passes: per-block partials on a grid of min(2 x SMs, row blocks),
// then one block in a fixed order (P_e in FP64 for load balancing,
// logsumexp and its squares in FP64 for the z-loss).
// Launch-time limits (exit 3): learned top-k needs k <= E <= 2048, random
// top-k k <= min(E, 64).
#include "ops/cuda/memkernels.cuh"

static __global__ void router_probs_forward_kernel(float *probs, const float *logits, int N, int E, int sigmoid) {
    int n = blockIdx.x * ROW_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (n >= N) return;
    const float *l = logits + (size_t)n * E;
    float *p = probs + (size_t)n * E;
    if (sigmoid) {
        for (int e = lane; e < E; e += WARP) p[e] = 1.f / (1.f + expf(-l[e]));
        return;
    }
    float mx = -INFINITY, sum = 0.f;
    for (int e = lane; e < E; e += WARP) mx = fmaxf(mx, l[e]);
    mx = warp_max(mx);
    for (int e = lane; e < E; e += WARP) sum += expf(l[e] - mx);
    sum = warp_sum(sum);
    for (int e = lane; e < E; e += WARP) p[e] = expf(l[e] - mx) / sum;
}

extern "C" void cuda_router_probs_forward(float *probs, const float *logits, int N, int E, Gating g) {
    if (N <= 0) return;
    router_probs_forward_kernel<<<row_blocks(N), ROW_THREADS, 0, cuda_stream()>>>(probs, logits, N, E,
                                                                                 g == GATING_SIGMOID);
    cudaLaunchCheck();
}

static __global__ void router_probs_backward_kernel(float *dlogits, const float *dprobs, const float *probs, int N,
                                                    int E, int sigmoid, int accumulate) {
    int n = blockIdx.x * ROW_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (n >= N) return;
    const float *p = probs + (size_t)n * E, *dp = dprobs + (size_t)n * E;
    float *dl = dlogits + (size_t)n * E;
    float dot = 0.f;
    if (!sigmoid) {
        for (int e = lane; e < E; e += WARP) dot += p[e] * dp[e];
        dot = warp_sum(dot);
    }
    for (int e = lane; e < E; e += WARP) {
        float d = sigmoid ? dp[e] * p[e] * (1.f - p[e]) : p[e] * (dp[e] - dot);
        dl[e] = accumulate ? dl[e] + d : d;
    }
}

extern "C" void cuda_router_probs_backward(float *dlogits, const float *dprobs, const float *probs, int N, int E,
                                           Gating g, int accumulate) {
    if (N <= 0) return;
    router_probs_backward_kernel<<<row_blocks(N), ROW_THREADS, 0, cuda_stream()>>>(
        dlogits, dprobs, probs, N, E, g == GATING_SIGMOID, accumulate);
    cudaLaunchCheck();
}

// Learned routing: k rounds of a warp argmax of probs + bias over the experts
// not yet taken; ties go to the lower index, so the choice and its order
// equal the CPU's selection. Lane l owns experts l + 32j, j < 64 (E <= 2048),
// and marks the ones taken in a bit mask.
static __global__ void router_topk_learned_kernel(int *idx, const float *probs, const float *bias, int N, int E,
                                                  int k) {
    int n = blockIdx.x * ROW_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (n >= N) return;
    const float *p = probs + (size_t)n * E;
    uint64_t taken = 0;
    for (int s = 0; s < k; s++) {
        int be = -1;
        float bv = 0.f;
        for (int e = lane, j = 0; e < E; e += WARP, j++) {
            if (taken >> j & 1) continue;
            float val = p[e] + (bias ? bias[e] : 0.f);
            if (be < 0 || val > bv) { be = e; bv = val; }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (oe >= 0 && (be < 0 || ov > bv || (ov == bv && oe < be))) { be = oe; bv = ov; }
        }
        if (be >= 0 && be % WARP == lane) taken |= 1ull << (be / WARP);
        if (lane == 0) idx[(size_t)n * k + s] = be;
    }
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#define TOPK_RANDOM_MAX_K 64
// Random routing: cpu_router_topk's partial Fisher-Yates with the same
// generator keyed by (seed, n). The permutation is kept sparse: pos/val hold
// the entries that differ from the identity (at most 2k of them).
static __global__ void router_topk_random_kernel(int *idx, int N, int E, int k, const uint64_t *seedp) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    uint64_t seed = *seedp;
    int pos[2 * TOPK_RANDOM_MAX_K], val[2 * TOPK_RANDOM_MAX_K], m = 0;
    uint64_t st = seed ^ (0x632be59bd9b4e019ULL * (uint64_t)(n + 1));
    for (int s = 0; s < k; s++) {
        int j = s + (int)(splitmix64(&st) % (uint64_t)(E - s));
        int ps = -1, pj = -1;
        for (int q = 0; q < m; q++) {
            if (pos[q] == s) ps = q;
            if (pos[q] == j) pj = q;
        }
        int a = ps >= 0 ? val[ps] : s, b = pj >= 0 ? val[pj] : j;  // perm[s], perm[j]
        if (ps < 0) { ps = m; pos[m++] = s; }
        if (pj < 0 && j != s) { pj = m; pos[m++] = j; }
        if (j == s) pj = ps;
        val[ps] = b;
        val[pj] = a;
        idx[(size_t)n * k + s] = b;
    }
}

static __global__ void router_topk_uniform_kernel(int *idx, int N, int E, int k) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * k) return;
    int64_t n = (int64_t)(i / k), s = (int64_t)(i % k);
    idx[i] = (int)((n * k + s) % E);
}

// The expert counts the router's kernels take (their dynamic shared memory
// stays under the default 48 KB: E ints for the counts, ROW_WARPS x E
// floats for the LB partials; learned top-k keeps one bit per lane's
// expert in a 64-bit mask): 1, or 0 with the limit in why.
#define ROUTER_SMEM_MAX (48 * 1024)
extern "C" int cuda_router_supports(int E, int k, int routing, char *why, size_t whylen) {
    int lb_max = ROUTER_SMEM_MAX / (ROW_WARPS * (int)sizeof(float)), count_max = ROUTER_SMEM_MAX / (int)sizeof(int);
    if (k < 1 || k > E) {
        snprintf(why, whylen, "top-k needs 1 <= k <= E (k=%d, E=%d)", k, E);
        return 0;
    }
    if (routing == ROUTING_RANDOM && k > TOPK_RANDOM_MAX_K) {
        snprintf(why, whylen, "random routing supports top-k up to %d, got %d", TOPK_RANDOM_MAX_K, k);
        return 0;
    }
    if (routing == ROUTING_LEARNED && E > 64 * WARP) {
        snprintf(why, whylen, "learned top-k supports at most %d experts, got %d", 64 * WARP, E);
        return 0;
    }
    if (E > lb_max || E > count_max) {
        snprintf(why, whylen, "the load-balancing loss supports at most %d experts (shared memory), got %d", lb_max, E);
        return 0;
    }
    return 1;
}

extern "C" void cuda_router_topk(int *idx, const float *probs, const float *bias, int N, int E, int k,
                                 RoutingMode mode, const uint64_t *seed) {
    if (N <= 0 || k <= 0) return;
    if (mode == ROUTING_UNIFORM) {
        router_topk_uniform_kernel<<<ceil_div((long)N * k, 256), 256, 0, cuda_stream()>>>(idx, N, E, k);
    } else if (mode == ROUTING_RANDOM) {
        if (k > TOPK_RANDOM_MAX_K || k > E) {
            fprintf(stderr, "moecore: cuda_router_topk: random routing needs k <= min(E, %d) (k=%d, E=%d)\n",
                    TOPK_RANDOM_MAX_K, k, E);
            exit(3);
        }
        router_topk_random_kernel<<<ceil_div(N, 128), 128, 0, cuda_stream()>>>(idx, N, E, k, seed);
    } else {
        if (E > 64 * WARP || k > E) {
            fprintf(stderr, "moecore: cuda_router_topk: needs k <= E <= %d (k=%d, E=%d)\n", 64 * WARP, k, E);
            exit(3);
        }
        router_topk_learned_kernel<<<row_blocks(N), ROW_THREADS, 0, cuda_stream()>>>(idx, probs, bias, N, E, k);
    }
    cudaLaunchCheck();
}

// one thread per token, the CPU's order of operations
static __global__ void router_weights_forward_kernel(float *weights, const float *probs, const int *idx, int N, int E,
                                                     int k, int renorm) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    float sum = 0.f;
    for (int s = 0; s < k; s++) {
        float w = probs[(size_t)n * E + idx[(size_t)n * k + s]];
        weights[(size_t)n * k + s] = w;
        sum += w;
    }
    if (renorm)
        for (int s = 0; s < k; s++) weights[(size_t)n * k + s] /= sum;
}

extern "C" void cuda_router_weights_forward(float *weights, const float *probs, const int *idx, int N, int E, int k,
                                            int renorm) {
    if (N <= 0) return;
    router_weights_forward_kernel<<<ceil_div(N, 128), 128, 0, cuda_stream()>>>(weights, probs, idx, N, E, k, renorm);
    cudaLaunchCheck();
}

// one warp per token; lane e collects the slots that chose e, in slot order
static __global__ void router_weights_backward_kernel(float *dprobs, const float *dweights, const float *probs,
                                                      const int *idx, int N, int E, int k, int renorm,
                                                      int accumulate) {
    int n = blockIdx.x * ROW_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (n >= N) return;
    const int *ix = idx + (size_t)n * k;
    const float *dw = dweights + (size_t)n * k, *p = probs + (size_t)n * E;
    float S = 0.f, dot = 0.f;
    if (renorm) {
        for (int s = 0; s < k; s++) S += p[ix[s]];
        for (int s = 0; s < k; s++) dot += dw[s] * p[ix[s]] / S;
    }
    float *dp = dprobs + (size_t)n * E;
    for (int e = lane; e < E; e += WARP) {
        float d = accumulate ? dp[e] : 0.f;
        for (int s = 0; s < k; s++)
            if (ix[s] == e) d += renorm ? (dw[s] - dot) / S : dw[s];
        dp[e] = d;
    }
}

extern "C" void cuda_router_weights_backward(float *dprobs, const float *dweights, const float *probs, const int *idx,
                                             int N, int E, int k, int renorm, int accumulate) {
    if (N <= 0) return;
    router_weights_backward_kernel<<<row_blocks(N), ROW_THREADS, 0, cuda_stream()>>>(dprobs, dweights, probs, idx, N,
                                                                                    E, k, renorm, accumulate);
    cudaLaunchCheck();
}

// One block: integer histogram in shared memory (exact, so deterministic),
// then counts[e] += it.
static __global__ void router_count_kernel(float *counts, const int *idx, size_t n, int E) {
    extern __shared__ int hist[];
    for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
    __syncthreads();
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(&hist[idx[i]], 1);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] += (float)hist[e];
}

extern "C" void cuda_router_count(float *counts, const int *idx, int N, int E, int k) {
    if (E <= 0) return;
    router_count_kernel<<<1, 1024, E * sizeof(int), cuda_stream()>>>(counts, idx, (size_t)N * k, E);
    cudaLaunchCheck();
}

// Aux-loss-free bias update: one block per layer; the counts are integers
// (exact in FP64 in any order), so the mean and every comparison are the CPU's.
static __global__ void router_bias_update_kernel(float *bias, const float *counts, int E, float rate) {
    const float *cnt = counts + (size_t)blockIdx.x * E;
    float *b = bias + (size_t)blockIdx.x * E;
    __shared__ double mean;
    double s = 0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) s += cnt[e];
    s = block_sum(s);
    if (threadIdx.x == 0) mean = s / E;
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        b[e] += rate * (cnt[e] < mean ? 1.0f : cnt[e] > mean ? -1.0f : 0.0f);
}

extern "C" void cuda_router_bias_update(float *bias, const float *counts, int L, int E, float rate) {
    if (L <= 0 || E <= 0) return;
    router_bias_update_kernel<<<L, 256, 0, cuda_stream()>>>(bias, counts, E, rate);
    cudaLaunchCheck();
}

// Load-balancing loss. Pass 1: block b sums p̂[n, :] over its warps' rows
// (warp w of the grid takes rows w, w + 8G, ...) into part[b, :], each warp
// in its own shared row, combined in warp order. Pass 2 (one block): P_e in
// FP64 over the G partials in order, then the loss.
static __global__ void lb_partial_kernel(float *part, const float *probs, int N, int E, int sigmoid) {
    extern __shared__ float sp[];  // [ROW_WARPS][E]
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    float *mine = sp + (size_t)warp * E;
    for (int e = lane; e < E; e += WARP) mine[e] = 0.f;
    for (int n = blockIdx.x * ROW_WARPS + warp; n < N; n += gridDim.x * ROW_WARPS) {
        const float *p = probs + (size_t)n * E;
        float denom = 1.f;
        if (sigmoid) {
            denom = 0.f;
            for (int e = lane; e < E; e += WARP) denom += p[e];
            denom = warp_sum(denom);
        }
        for (int e = lane; e < E; e += WARP) mine[e] += p[e] / denom;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float s = 0.f;
        for (int w = 0; w < ROW_WARPS; w++) s += sp[(size_t)w * E + e];
        part[(size_t)blockIdx.x * E + e] = s;
    }
}

// count_tokens <= 0: the tokens the counts cover, sum counts / k (ops.h),
// the same in every lane of the calling warp. The counts are integers, so
// their FP64 sum is exact in any order (the CPU's serial one included).
static __device__ float lb_count_tokens(const float *counts, float count_tokens, int E, int k) {
    if (count_tokens > 0) return count_tokens;
    double s = 0;
    for (int e = threadIdx.x % WARP; e < E; e += WARP) s += counts[e];
    return (float)(warp_sum(s) / k);
}

static __global__ void lb_finish_kernel(float *out, const float *part, int G, const float *counts, float count_tokens,
                                        int N, int E, int k) {
    count_tokens = lb_count_tokens(counts, count_tokens, E, k);
    double loss = 0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        double P = 0;
        for (int g = 0; g < G; g++) P += part[(size_t)g * E + e];
        loss += (double)counts[e] / count_tokens * (P / N);
    }
    loss = block_sum(loss);
    if (threadIdx.x == 0) out[0] = (float)(loss * E / k);
}

static int reduce_grid(long rows) {
    int G = 2 * cuda_num_sms();
    return G < row_blocks(rows) ? G : row_blocks(rows);
}

extern "C" void cuda_lb_loss_forward(float *out, const float *probs, const float *counts, float count_tokens, int N,
                                     int E, int k, Gating g) {
    static Scratch s;
    if (N <= 0 || E <= 0) return;
    int G = reduce_grid(N);
    float *part = (float *)scratch_get(&s, (size_t)G * E * sizeof(float));
    lb_partial_kernel<<<G, ROW_THREADS, ROW_WARPS * E * sizeof(float), cuda_stream()>>>(part, probs, N, E,
                                                                                        g == GATING_SIGMOID);
    cudaLaunchCheck();
    lb_finish_kernel<<<1, 256, 0, cuda_stream()>>>(out, part, G, counts, count_tokens, N, E, k);
    cudaLaunchCheck();
}

// dLB/dp̂_ti = (E/k) f_i / N, through the sigmoid normalisation p̂ = p / S
static __global__ void lb_backward_kernel(float *dprobs, const float *probs, const float *counts, float count_tokens,
                                          int N, int E, int k, int sigmoid, float scale) {
    int n = blockIdx.x * ROW_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (n >= N) return;
    count_tokens = lb_count_tokens(counts, count_tokens, E, k);
    const float *p = probs + (size_t)n * E;
    float *dp = dprobs + (size_t)n * E;
    float c = scale * (float)E / (float)k / (float)N / count_tokens;
    if (!sigmoid) {
        for (int e = lane; e < E; e += WARP) dp[e] += c * counts[e];
        return;
    }
    float S = 0.f, dot = 0.f;
    for (int e = lane; e < E; e += WARP) S += p[e];
    S = warp_sum(S);
    for (int e = lane; e < E; e += WARP) dot += c * counts[e] * p[e] / S;
    dot = warp_sum(dot);
    for (int e = lane; e < E; e += WARP) dp[e] += (c * counts[e] - dot) / S;
}

extern "C" void cuda_lb_loss_backward(float *dprobs, const float *probs, const float *counts, float count_tokens,
                                      int N, int E, int k, Gating g, float scale) {
    if (N <= 0) return;
    lb_backward_kernel<<<row_blocks(N), ROW_THREADS, 0, cuda_stream()>>>(dprobs, probs, counts, count_tokens, N, E, k,
                                                                        g == GATING_SIGMOID, scale);
    cudaLaunchCheck();
}

// Router z-loss: logsumexp in FP64 like the CPU (E is small). Pass 1: a
// persistent grid, per-block FP64 partials of lse^2; pass 2 sums them.
static __device__ void warp_lse(const float *l, int E, int lane, float *mx_out, double *s_out) {
    float mx = -INFINITY;
    for (int e = lane; e < E; e += WARP) mx = fmaxf(mx, l[e]);
    mx = warp_max(mx);
    double s = 0;
    for (int e = lane; e < E; e += WARP) s += exp((double)(l[e] - mx));
    *mx_out = mx;
    *s_out = warp_sum(s);
}

static __global__ void zloss_partial_kernel(double *part, const float *logits, int N, int E) {
    __shared__ double sw[ROW_WARPS];
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    double acc = 0;
    for (int n = blockIdx.x * ROW_WARPS + warp; n < N; n += gridDim.x * ROW_WARPS) {
        float mx;
        double s;
        warp_lse(logits + (size_t)n * E, E, lane, &mx, &s);
        double lse = mx + log(s);
        acc += lse * lse;
    }
    if (lane == 0) sw[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int w = 0; w < ROW_WARPS; w++) t += sw[w];
        part[blockIdx.x] = t;
    }
}

extern "C" void cuda_zloss_forward(float *out, const float *logits, int N, int E) {
    static Scratch s;
    if (N <= 0 || E <= 0) return;
    int G = reduce_grid(N);
    double *part = (double *)scratch_get(&s, (size_t)G * sizeof(double));
    zloss_partial_kernel<<<G, ROW_THREADS, 0, cuda_stream()>>>(part, logits, N, E);
    cudaLaunchCheck();
    sum_partials(part, G, out, (double)N, NULL);
}

// dZ/dl_te = (2/N) lse_t softmax(l_t)_e
static __global__ void zloss_backward_kernel(float *dlogits, const float *logits, int N, int E, float scale) {
    int n = blockIdx.x * ROW_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (n >= N) return;
    const float *l = logits + (size_t)n * E;
    float *dl = dlogits + (size_t)n * E;
    float mx;
    double s;
    warp_lse(l, E, lane, &mx, &s);
    double lse = mx + log(s);
    for (int e = lane; e < E; e += WARP) dl[e] += (float)(scale * 2.0 / N * lse * exp((double)(l[e] - mx)) / s);
}

extern "C" void cuda_zloss_backward(float *dlogits, const float *logits, int N, int E, float scale) {
    if (N <= 0) return;
    zloss_backward_kernel<<<row_blocks(N), ROW_THREADS, 0, cuda_stream()>>>(dlogits, logits, N, E, scale);
    cudaLaunchCheck();
}
