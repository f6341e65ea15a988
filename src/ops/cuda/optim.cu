// The optimizer's kernels: the AdamW update of the FP32 master weights and
// their moments (and of the BF16 compute copy, in the same pass, when there
// is one), and the FP64 sum of squares behind the gradient norm.
//
// AdamW is elementwise: one thread per 8 elements, the 16-byte path when
// every pointer is 16-byte aligned; it matches cpu_adamw_update bit for bit.
// The sum of squares takes two passes: a grid of min(8 x SMs, ew_blocks(n))
// blocks (fixed by n and the GPU) sums FP64 squares over a grid-stride loop
// into one partial per block (block_sum), and sum_partials adds the partials
// in order into acc.
#include "ops/cuda/adamw.cuh"
#include "ops/cuda/memkernels.cuh"

// torch.optim.AdamW (adamw.cuh: cpu_adamw_update's bits)
static __global__ void adamw_kernel(float *p, bf16 *p_act, const float *g, float *m, float *v, size_t n, AdamArgs a,
                                    bool vec) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    float pf[8], gf[8], mf[8], vf[8];
    load8(p, i, n, vec, pf);
    load8(g, i, n, vec, gf);
    load8(m, i, n, vec, mf);
    load8(v, i, n, vec, vf);
#pragma unroll
    for (int j = 0; j < 8; j++) adamw_apply(pf[j], mf[j], vf[j], gf[j], a);
    store8(p, i, n, vec, pf);
    store8(m, i, n, vec, mf);
    store8(v, i, n, vec, vf);
    if (p_act) store8(p_act, i, n, vec, pf);
}

extern "C" void cuda_adamw_update(float *p, void *p_act, const float *g, float *m, float *v, size_t n, float lr,
                                  float beta1, float beta2, float eps, float wd, float grad_scale, int t) {
    if (!n) return;
    AdamArgs a = adamw_args(lr, beta1, beta2, eps, wd, grad_scale, t);
    if (p_act == (void *)p) p_act = NULL;
    bool vec = aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v) && (!p_act || aligned16(p_act));
    adamw_kernel<<<ew_blocks(n), EW_THREADS, 0, cuda_stream()>>>(p, (bf16 *)p_act, g, m, v, n, a, vec);
    cudaLaunchCheck();
}

// Pass 1: a fixed grid (from n and the GPU), per-block FP64 partials;
// pass 2 sums them in order into acc.
static __global__ void sum_squares_kernel(double *part, const float *x, size_t n, bool vec) {
    double s = 0;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < n; i += (size_t)gridDim.x * blockDim.x * 8) {
        float f[8];
        load8(x, i, n, vec, f);
#pragma unroll
        for (int j = 0; j < 8; j++) s += (double)f[j] * f[j];
    }
    s = block_sum(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

extern "C" void cuda_sum_squares(double *acc, const float *x, size_t n) {
    static Scratch s;
    if (!n) return;
    int G = 8 * cuda_num_sms();
    if (G > ew_blocks(n)) G = ew_blocks(n);
    double *part = (double *)scratch_get(&s, (size_t)G * sizeof(double));
    sum_squares_kernel<<<G, EW_THREADS, 0, cuda_stream()>>>(part, x, n, aligned16(x));
    cudaLaunchCheck();
    sum_partials(part, G, NULL, 1.0, acc);
}

// acc[0] += the sum of x: as the sum of squares, a fixed grid of FP64
// partials (grid-stride, 2 values a thread a round), then sum_partials.
static __global__ void sum_f64_kernel(double *part, const double *x, size_t n) {
    double s = 0;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 2; i < n; i += (size_t)gridDim.x * blockDim.x * 2) {
        s += x[i];
        if (i + 1 < n) s += x[i + 1];
    }
    s = block_sum(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

extern "C" void cuda_sum_f64(double *acc, const double *x, size_t n) {
    static Scratch s;
    if (!n) return;
    size_t blocks = (n + 2 * EW_THREADS - 1) / (2 * EW_THREADS);
    int G = 8 * cuda_num_sms();
    if ((size_t)G > blocks) G = (int)blocks;
    double *part = (double *)scratch_get(&s, (size_t)G * sizeof(double));
    sum_f64_kernel<<<G, EW_THREADS, 0, cuda_stream()>>>(part, x, n);
    cudaLaunchCheck();
    sum_partials(part, G, NULL, 1.0, acc);
}
