// The loss: cross-entropy of BF16 logits [N, V] against the targets (forward:
// the per-row losses; backward: dlogits) and loss_sum, the sum of the losses
// of the valid targets. A target < 0 marks a position without a loss: its
// loss is 0 and its dlogits row zeros.
//
// Cross-entropy: one block per row, an online softmax over all V logits in
// FP32: each thread keeps (max, sum of exp(x - max)) over its 8-element
// vectors, 4 vectors loaded before use; the block combines the pairs in a
// fixed tree. Backward recomputes the statistics, then writes
// dloss (softmax - onehot) in place of the logits it has just read (every
// element is read and written by the same thread, after the block's first
// pass), so dlogits may alias logits.
//
// Where the row fits in shared memory (V a multiple of 8, 16-byte aligned
// rows, 2 V bytes within the opt-in limit: V <= 116k), both kernels first
// copy the row there with one bulk copy (the copy engine, cp.async.bulk, on
// an mbarrier) and read it from shared memory: the backward then reads the
// logits from memory once instead of twice (its statistics pass and its
// output pass), and the forward keeps the whole row in flight at once. The
// arithmetic and its order are the same as the streaming kernels' (the same
// ce_row_stats over the same 8-element vectors), so the bits are too. Two
// rows of V = 50304 (98 KB each) fit on a multiprocessor, so one block's
// copy runs under the other's arithmetic.
//
// The fused kernel (crossentropy_fused: the training step's forward, when
// the backward's scale is known) is the backward kernel that also writes the
// row's loss from the statistics it has computed: one read of the logits
// where forward + backward made two (three without shared memory), the
// same values and bits as the two kernels.
//
// Numerics: FP32 with fast_exp (exp2f(x log2 e)), the (max, sum) pairs
// combined in a fixed tree (lane butterflies, then the block's warps);
// loss_sum is one block of 1024 threads in FP64, fixed order. The 16-byte
// path runs when V is a multiple of 8 and the logits (and dlogits) are
// 16-byte aligned.
#include "ops/cuda/memkernels.cuh"
#include "ops/cuda/wgmma_util.cuh" // mbarriers and the bulk copy

#define LOG2E 1.4426950408889634f

__device__ __forceinline__ float fast_exp(float x) { return exp2f(x * LOG2E); }

#define CE_THREADS 512
#define CE_UNROLL 4

__device__ __forceinline__ void ms_combine(float &m, float &s, float m2, float s2) {
    float M = fmaxf(m, m2);
    if (M == -INFINITY) return;  // both empty
    s = s * fast_exp(m - M) + s2 * fast_exp(m2 - M);
    m = M;
}

// (max, sum exp(l - max)) of a row, returned to every thread of the block
static __device__ void ce_row_stats(const bf16 *row, int V, bool vec, float *m_out, float *s_out) {
    __shared__ float sm[CE_THREADS / WARP], ss[CE_THREADS / WARP];
    float m = -INFINITY, s = 0.f;
    const int step = CE_THREADS * 8;
    for (int c0 = threadIdx.x * 8; c0 < V; c0 += step * CE_UNROLL) {
        float f[CE_UNROLL][8];
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++) load8(row, c0 + u * step, V, vec, f[u], -INFINITY);
        float lm = m;
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++)
#pragma unroll
            for (int j = 0; j < 8; j++) lm = fmaxf(lm, f[u][j]);
        float acc = s * fast_exp(m - lm);  // m = -inf at first: exp2(-inf) = 0
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++)
#pragma unroll
            for (int j = 0; j < 8; j++) acc += fast_exp(f[u][j] - lm);
        m = lm;
        s = acc;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ms_combine(m, s, m2, s2);
    }
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads();
    if (warp == 0) {
        m = lane < CE_THREADS / WARP ? sm[lane] : -INFINITY;
        s = lane < CE_THREADS / WARP ? ss[lane] : 0.f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
            ms_combine(m, s, m2, s2);
        }
        if (lane == 0) { sm[0] = m; ss[0] = s; }
    }
    __syncthreads();
    *m_out = sm[0];
    *s_out = ss[0];
}

// The row (2 V bytes) into shared memory by one bulk copy (the SMEM kernels).
__device__ __forceinline__ const bf16 *ce_row_to_smem(const bf16 *row, int V) {
    extern __shared__ __align__(16) unsigned char ce_smem[];
    __shared__ __align__(8) uint64_t bar;
    uint32_t b = (uint32_t)__cvta_generic_to_shared(&bar), dst = (uint32_t)__cvta_generic_to_shared(ce_smem);
    if (threadIdx.x == 0) {
        mbar_init(b, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        mbar_expect_tx(b, (uint32_t)V * 2);
        for (uint32_t o = 0; o < (uint32_t)V * 2; o += 32768) // pieces of 32 KB (16-byte multiples)
            bulk_load(dst + o, (const char *)row + o, min((uint32_t)V * 2 - o, 32768u), b);
    }
    __syncthreads(); // the barrier is initialised before anyone waits on it
    mbar_wait(b, 0);
    return (const bf16 *)ce_smem;
}

// SMEM: the row is read from shared memory (ce_row_to_smem; the 16-byte
// path always), else streamed from the logits.
template <bool SMEM>
static __global__ void __launch_bounds__(CE_THREADS)
    crossentropy_forward_kernel(float *losses, const bf16 *logits, const int *targets, int V, bool vec) {
    int n = blockIdx.x, t = targets[n];
    if (t < 0) {
        if (threadIdx.x == 0) losses[n] = 0.f;
        return;
    }
    const bf16 *row = logits + (size_t)n * V;
    if constexpr (SMEM) row = ce_row_to_smem(row, V);
    if constexpr (SMEM) vec = true; // a compile-time constant there
    float m, s;
    ce_row_stats(row, V, vec, &m, &s);
    if (threadIdx.x == 0) losses[n] = m + logf(s) - __bfloat162float(row[t]);
}

// losses: NULL, or the forward's losses[n] as well (the fused kernel)
template <bool SMEM>
static __global__ void __launch_bounds__(CE_THREADS)
    crossentropy_backward_kernel(bf16 *dlogits, float *losses, const bf16 *logits, const int *targets, float dloss,
                                 int V, bool vec) {
    int n = blockIdx.x, t = targets[n];
    const bf16 *row = logits + (size_t)n * V;
    bf16 *d = dlogits + (size_t)n * V;
    if constexpr (SMEM) vec = true; // a compile-time constant there
    const int step = CE_THREADS * 8;
    if (t < 0) {
        if (losses && threadIdx.x == 0) losses[n] = 0.f;
        float z[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int c = threadIdx.x * 8; c < V; c += step) store8(d, c, V, vec, z);
        return;
    }
    if constexpr (SMEM) row = ce_row_to_smem(row, V); // the whole row in before any write (d may alias it)
    // the target's logit before anyone writes (ce_row_stats ends with a barrier)
    float lt = losses && threadIdx.x == 0 ? __bfloat162float(row[t]) : 0.f;
    float m, s;
    ce_row_stats(row, V, vec, &m, &s);
    if (losses && threadIdx.x == 0) losses[n] = m + logf(s) - lt;
    float scale = dloss / s;
    for (int c0 = threadIdx.x * 8; c0 < V; c0 += step * CE_UNROLL) {
        float f[CE_UNROLL][8];
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++) load8(row, c0 + u * step, V, vec, f[u]);
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++) {
            int c = c0 + u * step;
#pragma unroll
            for (int j = 0; j < 8; j++) f[u][j] = fast_exp(f[u][j] - m) * scale - (c + j == t ? dloss : 0.f);
            if (c < V) store8(d, c, V, vec, f[u]);
        }
    }
}

// The shared-memory path when the row fits, unless a test or benchmark has
// asked for the streaming kernels (cuda_crossentropy_set_streaming: the
// fallback, for bit-for-bit and A/B checks).
static bool ce_force_stream;
extern "C" void cuda_crossentropy_set_streaming(int on) { ce_force_stream = on != 0; }
static bool ce_smem_ok(const void *a, const void *b, int V) {
    static int limit = -1;
    if (limit < 0) {
        int dev;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        limit -= 1024; // the static __shared__ of ce_row_stats and the barrier
    }
    return !ce_force_stream && V % 8 == 0 && aligned16(a) && aligned16(b) && (long)V * 2 <= limit;
}

extern "C" void cuda_crossentropy_forward(float *losses, const void *logits, const int *targets, int N, int V) {
    if (N <= 0) return;
    const bf16 *l = (const bf16 *)logits;
    if (ce_smem_ok(logits, logits, V)) {
        static int set;
        cuda_allow_smem((const void *)crossentropy_forward_kernel<true>, &set, V * 2);
        crossentropy_forward_kernel<true><<<N, CE_THREADS, V * 2, cuda_stream()>>>(losses, l, targets, V, true);
    } else {
        bool vec = V % 8 == 0 && aligned16(logits);
        crossentropy_forward_kernel<false><<<N, CE_THREADS, 0, cuda_stream()>>>(losses, l, targets, V, vec);
    }
    cudaLaunchCheck();
}

static void ce_backward(float *losses, void *dlogits, const void *logits, const int *targets, float dloss, int N,
                        int V) {
    if (N <= 0) return;
    bf16 *d = (bf16 *)dlogits;
    const bf16 *l = (const bf16 *)logits;
    if (ce_smem_ok(logits, dlogits, V)) {
        static int set;
        cuda_allow_smem((const void *)crossentropy_backward_kernel<true>, &set, V * 2);
        crossentropy_backward_kernel<true>
            <<<N, CE_THREADS, V * 2, cuda_stream()>>>(d, losses, l, targets, dloss, V, true);
    } else {
        bool vec = V % 8 == 0 && aligned16(logits) && aligned16(dlogits);
        crossentropy_backward_kernel<false><<<N, CE_THREADS, 0, cuda_stream()>>>(d, losses, l, targets, dloss, V, vec);
    }
    cudaLaunchCheck();
}
extern "C" void cuda_crossentropy_backward(void *dlogits, const void *logits, const int *targets, float dloss, int N,
                                           int V) {
    ce_backward(NULL, dlogits, logits, targets, dloss, N, V);
}
extern "C" void cuda_crossentropy_fused(float *losses, void *dlogits, const void *logits, const int *targets,
                                        float dloss, int N, int V) {
    ce_backward(losses, dlogits, logits, targets, dloss, N, V);
}

// one block, FP64, fixed order
static __global__ void loss_sum_kernel(double *acc, const float *losses, const int *targets, int N) {
    double s = 0;
    for (int n = threadIdx.x; n < N; n += blockDim.x)
        if (targets[n] >= 0) s += losses[n];
    s = block_sum(s);
    if (threadIdx.x == 0) acc[0] += s;
}

extern "C" void cuda_loss_sum(double *acc, const float *losses, const int *targets, int N) {
    if (N <= 0) return;
    loss_sum_kernel<<<1, 1024, 0, cuda_stream()>>>(acc, losses, targets, N);
    cudaLaunchCheck();
}
