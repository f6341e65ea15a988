// Elementwise ops: the BF16 cast of an FP32 buffer (cast_to_act), SwiGLU
// forward and backward, y += x for BF16 act and FP32 buffers, and the copies.
//
// One thread per 8 consecutive elements, EW_THREADS a block (ew_blocks(n)
// blocks). Each output element depends only on the inputs at its index (FP32
// math, SiLU through expf), so the results do not depend on the grid. The
// 16-byte path of load8 / store8 runs when every pointer is 16-byte aligned;
// the last group of fewer than 8 elements, and unaligned buffers, take the
// scalar path. The copies are cudaMemcpyAsync on the stream, none when
// dst == src.
#include "ops/cuda/memkernels.cuh"

static __global__ void cast_kernel(bf16 *dst, const float *src, size_t n, bool vec) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    float f[8];
    load8(src, i, n, vec, f);
    store8(dst, i, n, vec, f);
}

extern "C" void cuda_cast_to_act(void *dst, const float *src, size_t n) {
    if (!n) return;
    bool vec = aligned16(dst) && aligned16(src);
    cast_kernel<<<ew_blocks(n), EW_THREADS, 0, cuda_stream()>>>((bf16 *)dst, src, n, vec);
    cudaLaunchCheck();
}

// rows (may be NULL): only the first min(rows[0], n / F) rows of F elements
__device__ __forceinline__ size_t rows_bound(size_t n, const int *rows, int F) {
    if (!rows) return n;
    size_t m = (size_t)(rows[0] > 0 ? rows[0] : 0) * F;
    return m < n ? m : n;
}

static __global__ void swiglu_forward_kernel(bf16 *out, const bf16 *gate, const bf16 *up, size_t n, bool vec,
                                             const int *rows, int F) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    n = rows_bound(n, rows, F);
    if (i >= n) return;
    float g[8], u[8], o[8];
    load8(gate, i, n, vec, g);
    load8(up, i, n, vec, u);
#pragma unroll
    for (int j = 0; j < 8; j++) o[j] = swiglu_value(g[j], u[j]);
    store8(out, i, n, vec, o);
}

static __global__ void swiglu_backward_kernel(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate,
                                              const bf16 *up, size_t n, bool vec, const int *rows, int F) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    n = rows_bound(n, rows, F);
    if (i >= n) return;
    float g[8], u[8], d[8], dg[8], du[8];
    load8(gate, i, n, vec, g);
    load8(up, i, n, vec, u);
    load8(dout, i, n, vec, d);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float sig = 1.f / (1.f + expf(-g[j]));
        float dsilu = sig * (1.f + g[j] * (1.f - sig));
        dg[j] = d[j] * u[j] * dsilu;
        du[j] = d[j] * g[j] * sig;
    }
    store8(dgate, i, n, vec, dg);
    store8(dup, i, n, vec, du);
}

extern "C" void cuda_swiglu_forward(void *out, const void *gate, const void *up, size_t n) {
    if (!n) return;
    bool vec = aligned16(out) && aligned16(gate) && aligned16(up);
    swiglu_forward_kernel<<<ew_blocks(n), EW_THREADS, 0, cuda_stream()>>>((bf16 *)out, (const bf16 *)gate,
                                                                         (const bf16 *)up, n, vec, nullptr, 1);
    cudaLaunchCheck();
}

// the grid covers max_rows; the blocks past the device's row count return
extern "C" void cuda_swiglu_forward_rows(void *out, const void *gate, const void *up, const int *rows,
                                         int max_rows, int F) {
    size_t n = (size_t)max_rows * F;
    if (!n) return;
    bool vec = aligned16(out) && aligned16(gate) && aligned16(up) && F % 8 == 0;
    swiglu_forward_kernel<<<ew_blocks(n), EW_THREADS, 0, cuda_stream()>>>((bf16 *)out, (const bf16 *)gate,
                                                                         (const bf16 *)up, n, vec, rows, F);
    cudaLaunchCheck();
}

extern "C" void cuda_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                                     size_t n) {
    if (!n) return;
    bool vec = aligned16(dgate) && aligned16(dup) && aligned16(dout) && aligned16(gate) && aligned16(up);
    swiglu_backward_kernel<<<ew_blocks(n), EW_THREADS, 0, cuda_stream()>>>(
        (bf16 *)dgate, (bf16 *)dup, (const bf16 *)dout, (const bf16 *)gate, (const bf16 *)up, n, vec, nullptr, 1);
    cudaLaunchCheck();
}

extern "C" void cuda_swiglu_backward_rows(void *dgate, void *dup, const void *dout, const void *gate,
                                          const void *up, const int *rows, int max_rows, int F) {
    size_t n = (size_t)max_rows * F;
    if (!n) return;
    bool vec = aligned16(dgate) && aligned16(dup) && aligned16(dout) && aligned16(gate) && aligned16(up) &&
               F % 8 == 0;
    swiglu_backward_kernel<<<ew_blocks(n), EW_THREADS, 0, cuda_stream()>>>(
        (bf16 *)dgate, (bf16 *)dup, (const bf16 *)dout, (const bf16 *)gate, (const bf16 *)up, n, vec, rows, F);
    cudaLaunchCheck();
}

// out = y + x (out may be y: y += x), for BF16 act and FP32 buffers alike
template <typename T> static __global__ void add_kernel(T *out, const T *y, const T *x, size_t n, bool vec) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    float a[8], b[8];
    load8(y, i, n, vec, a);
    load8(x, i, n, vec, b);
#pragma unroll
    for (int j = 0; j < 8; j++) a[j] += b[j];
    store8(out, i, n, vec, a);
}

extern "C" void cuda_add_act(void *y, const void *x, size_t n) {
    if (!n) return;
    bool vec = aligned16(y) && aligned16(x);
    add_kernel<bf16><<<ew_blocks(n), EW_THREADS, 0, cuda_stream()>>>((bf16 *)y, (const bf16 *)y, (const bf16 *)x, n,
                                                                     vec);
    cudaLaunchCheck();
}
// out = a + b in one pass (the residual adds: 3 passes over memory where a
// copy and an add made 5); the same FP32 sum and rounding as copy + add_act
extern "C" void cuda_sum_act(void *out, const void *a, const void *b, size_t n) {
    if (!n) return;
    bool vec = aligned16(out) && aligned16(a) && aligned16(b);
    add_kernel<bf16><<<ew_blocks(n), EW_THREADS, 0, cuda_stream()>>>((bf16 *)out, (const bf16 *)a, (const bf16 *)b, n,
                                                                     vec);
    cudaLaunchCheck();
}
extern "C" void cuda_add_f32(float *y, const float *x, size_t n) {
    if (!n) return;
    bool vec = aligned16(y) && aligned16(x);
    add_kernel<float><<<ew_blocks(n), EW_THREADS, 0, cuda_stream()>>>(y, y, x, n, vec);
    cudaLaunchCheck();
}
extern "C" void cuda_copy_act(void *dst, const void *src, size_t n) {
    if (n && dst != src) cudaCheck(cudaMemcpyAsync(dst, src, n * sizeof(bf16), cudaMemcpyDeviceToDevice, cuda_stream()));
}
extern "C" void cuda_copy_f32(float *dst, const float *src, size_t n) {
    if (n && dst != src) cudaCheck(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, cuda_stream()));
}
