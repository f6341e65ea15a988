// The CUDA backend's memory-bound kernels: every op of src/ops/ops.h except
// the matmuls (gemm.cu) and attention (attention.cu). The semantics are the
// CPU kernels' (src/ops/cpu/cpu_kernels.h): act is BF16, all math FP32
// (a few scalar reductions in FP64), f32 buffers FP32.
//
// Invariants
// - Everything runs on cuda_stream() with no host synchronisation and no
//   allocation, so a captured CUDA graph replays it. Ops that need scratch
//   keep a static device buffer of their own, sized on the first call and
//   grown only when a call needs more; a training step calls with fixed
//   sizes, so its first (uncaptured) run sizes them all.
// - Deterministic: no floating-point atomics. Reductions write per-block
//   partials that one block (or one thread per column) sums in a fixed
//   order; the grid of a reduction depends only on the shape and the GPU.
//   Scatter-adds sum each destination's rows in ascending source order:
//   embedding backward stable-sorts the source rows by destination (CUB
//   radix sort, keys = destination, values = source index), then one warp
//   per destination and 256-channel slice adds them; permute backward
//   lists each token's rows with integer atomics and sorts each short list
//   in a warp before adding.
// - moe_route_index is the same stable sort of the flat (token, slot)
//   indices by expert: the stable order is then (expert, token, slot), as
//   on the CPU, and offsets are the segment starts of the sorted keys.
// - 16-byte loads and stores wherever a row's length is a multiple of 8
//   elements and the pointers are 16-byte aligned; scalar otherwise (the
//   same kernels, through load8 / store8).
#include <cub/cub.cuh>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/ops_cuda.h"

#define WARP 32
#define ROW_THREADS 256  // blocks of warp-per-row kernels: 8 rows at a time
#define ROW_WARPS (ROW_THREADS / WARP)
#define ROW_BLOCK_MAX 256  // block-per-row kernels: 8 channels a thread, C <= 2048
#define MAX_WARPS 32       // warps of the largest block
#define EW_THREADS 256   // elementwise kernels: 8 elements per thread
#define LOG2E 1.4426950408889634f

// ---------------------------------------------------------------------------
// Helpers

static inline bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// A static device buffer that only grows (see the header comment). Growing
// waits for the stream first: the old buffer may still be in use.
struct Scratch {
    void *p;
    size_t bytes;
};
static void *scratch_get(Scratch *s, size_t bytes) {
    if (bytes > s->bytes) {
        if (s->p) {
            cudaCheck(cudaStreamSynchronize(cuda_stream()));
            cudaCheck(cudaFree(s->p));
        }
        cudaCheck(cudaMalloc(&s->p, bytes));
        s->bytes = bytes;
    }
    return s->p;
}

static inline int ew_blocks(size_t n) { return ceil_div((long)((n + 7) / 8), EW_THREADS); }
static inline int row_blocks(long rows) { return ceil_div(rows, ROW_WARPS); }
// threads per row of a block-per-row kernel: C / 8 rounded up to warps, at
// most ROW_BLOCK_MAX
static __host__ __device__ inline int row_block_threads(int C) {
    int t = ((C + 7) / 8 + WARP - 1) / WARP * WARP;
    return t < WARP ? WARP : t < ROW_BLOCK_MAX ? t : ROW_BLOCK_MAX;
}
// Blocks of a persistent grid: as many of `threads` threads and `smem`
// bytes of dynamic shared memory as fit on the GPU, no more than `work`.
// per_sm[threads / WARP] (MAX_WARPS + 1 entries) caches the occupancy, so
// the grid depends only on the shape and the GPU.
template <typename Kernel>
static int persistent_blocks(Kernel kernel, int threads, size_t smem, int *per_sm, long work) {
    int &b = per_sm[threads / WARP];
    if (!b) {
        cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, threads, smem));
        if (b < 1) b = 1;
    }
    long G = (long)cuda_num_sms() * b;
    return (int)(G < work ? G : work);
}

// bits needed for keys 0..n-1 (at least 1)
static inline int key_bits(long n) {
    int b = 1;
    while (b < 31 && (1L << b) < n) b++;
    return b;
}

__device__ __forceinline__ void unpack8(uint4 raw, float f[8]) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}
__device__ __forceinline__ uint4 pack8(const float f[8]) {
    uint4 raw;
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    return raw;
}

// Elements i..i+7 of p, those at or past n reading as `fill`: one 16-byte
// load when vec (p 16-byte aligned, i a multiple of 8) and all 8 are in range.
__device__ __forceinline__ void load8(const bf16 *p, size_t i, size_t n, bool vec, float f[8],
                                      float fill = 0.f) {
    if (vec && i + 8 <= n) {
        unpack8(*reinterpret_cast<const uint4 *>(p + i), f);
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++) f[j] = i + j < n ? __bfloat162float(p[i + j]) : fill;
}
__device__ __forceinline__ void load8(const float *p, size_t i, size_t n, bool vec, float f[8],
                                      float fill = 0.f) {
    if (vec && i + 8 <= n) {
        float4 a = *reinterpret_cast<const float4 *>(p + i);
        float4 b = *reinterpret_cast<const float4 *>(p + i + 4);
        f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
        f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++) f[j] = i + j < n ? p[i + j] : fill;
}
__device__ __forceinline__ void store8(bf16 *p, size_t i, size_t n, bool vec, const float f[8]) {
    if (vec && i + 8 <= n) {
        *reinterpret_cast<uint4 *>(p + i) = pack8(f);
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (i + j < n) p[i + j] = __float2bfloat16_rn(f[j]);
}
__device__ __forceinline__ void store8(float *p, size_t i, size_t n, bool vec, const float f[8]) {
    if (vec && i + 8 <= n) {
        *reinterpret_cast<float4 *>(p + i) = make_float4(f[0], f[1], f[2], f[3]);
        *reinterpret_cast<float4 *>(p + i + 4) = make_float4(f[4], f[5], f[6], f[7]);
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (i + j < n) p[i + j] = f[j];
}

// load8 / store8 of a row's channels i..i+7 (i a multiple of 8): with VEC
// the row length n is a multiple of 8 too, so the 8 are all in (one 16-byte
// access) or all out; without, load8 / store8's scalar path.
template <bool VEC>
__device__ __forceinline__ void load8_row(const bf16 *p, int i, int n, float f[8]) {
    if (!VEC) return load8(p, i, n, false, f);
    uint4 raw = make_uint4(0, 0, 0, 0);  // BF16 zeros: select before unpacking
    if (i < n) raw = *reinterpret_cast<const uint4 *>(p + i);
    unpack8(raw, f);
}
template <bool VEC>
__device__ __forceinline__ void store8_row(bf16 *p, int i, int n, const float f[8]) {
    if (!VEC) return store8(p, i, n, false, f);
    if (i < n) *reinterpret_cast<uint4 *>(p + i) = pack8(f);
}

// Butterfly reductions: every lane ends with the same value (a + b == b + a
// exactly), and the order is fixed, so results are reproducible.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Sum over the block (blockDim a multiple of 32), valid in thread 0. Call at
// most once per kernel (its shared array is not reset).
template <typename T>
__device__ T block_sum(T v) {
    __shared__ T part[32];
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    v = warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    T r = 0;
    if (warp == 0) {
        r = lane < nw ? part[lane] : (T)0;
        r = warp_sum(r);
    }
    return r;
}

// Sums of v[0..K) over warps w0 .. w0 + nw - 1 of the block (the caller's
// group; blockDim a multiple of 32), the same in all their threads: warps'
// butterflies, then the warps in order. Every thread of the block calls it
// (one __syncthreads); red holds K x MAX_WARPS floats. A kernel calling it
// once per row alternates between two such slots: a thread reaches a slot's
// next writes only after every thread has passed the barrier that follows
// its last reads.
template <int K>
__device__ __forceinline__ void block_sums(float v[K], float *red, int w0, int nw) {
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
#pragma unroll
    for (int j = 0; j < K; j++) {
        v[j] = warp_sum(v[j]);
        if (lane == 0) red[j * MAX_WARPS + warp] = v[j];
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < K; j++) {
        float t = 0.f;
        for (int i = w0; i < w0 + nw; i++) t += red[j * MAX_WARPS + i];
        v[j] = t;
    }
}

__device__ __forceinline__ float fast_exp(float x) { return exp2f(x * LOG2E); }

// One block sums part[0..G) in a fixed order: out[0] = total / div when out,
// else acc[0] += total.
static __global__ void sum_partials_kernel(const double *part, int G, float *out, double div, double *acc) {
    double s = 0;
    for (int g = threadIdx.x; g < G; g += blockDim.x) s += part[g];
    s = block_sum(s);
    if (threadIdx.x == 0) {
        if (out) out[0] = (float)(s / div);
        else acc[0] += s;
    }
}
static void sum_partials(const double *part, int G, float *out, double div, double *acc) {
    sum_partials_kernel<<<1, 256, 0, cuda_stream()>>>(part, G, out, div, acc);
    cudaLaunchCheck();
}

// ---------------------------------------------------------------------------
// Stable sort of indices by key (CUB radix sort; LSD radix sorting is stable)

static __global__ void iota_kernel(int *a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = i;
}

// Sorts 0..n-1 by keys[i] in [0, 2^bits): sorted_keys[j] and order[j], the
// index with the j-th smallest key, equal keys in ascending index. Both live
// in s (n >= 1).
static void sort_indices_by_key(Scratch *s, const int *keys, int n, int bits, unsigned **sorted_keys,
                                int **order) {
    size_t temp = 0;
    cudaCheck(cub::DeviceRadixSort::SortPairs(nullptr, temp, (const unsigned *)keys, (unsigned *)nullptr,
                                              (const int *)nullptr, (int *)nullptr, n, 0, bits, cuda_stream()));
    size_t arr = ((size_t)n * sizeof(int) + 255) & ~(size_t)255;
    char *base = (char *)scratch_get(s, 3 * arr + temp);
    unsigned *kout = (unsigned *)base;
    int *iota = (int *)(base + arr), *vout = (int *)(base + 2 * arr);
    iota_kernel<<<ceil_div(n, 256), 256, 0, cuda_stream()>>>(iota, n);
    cudaLaunchCheck();
    cudaCheck(cub::DeviceRadixSort::SortPairs(base + 3 * arr, temp, (const unsigned *)keys, kout, iota, vout, n,
                                              0, bits, cuda_stream()));
    *sorted_keys = kout;
    *order = vout;
}

// starts[0..M] of the segments of sorted keys in [0, M): starts[e] = first j
// with key >= e. Thread j in [0, n] writes the entries between keys j-1 and j,
// so every entry is written exactly once.
static __global__ void segment_starts_kernel(int *starts, const unsigned *skeys, int n, int M) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j > n) return;
    int lo = j > 0 ? (int)skeys[j - 1] + 1 : 0;
    int hi = j < n ? (int)skeys[j] : M;
    for (int e = lo; e <= hi; e++) starts[e] = j;
}

// ---------------------------------------------------------------------------
// Elementwise

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

static __global__ void swiglu_forward_kernel(bf16 *out, const bf16 *gate, const bf16 *up, size_t n, bool vec) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    float g[8], u[8], o[8];
    load8(gate, i, n, vec, g);
    load8(up, i, n, vec, u);
#pragma unroll
    for (int j = 0; j < 8; j++) o[j] = g[j] / (1.f + expf(-g[j])) * u[j];
    store8(out, i, n, vec, o);
}

static __global__ void swiglu_backward_kernel(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate,
                                              const bf16 *up, size_t n, bool vec) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
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
                                                                         (const bf16 *)up, n, vec);
    cudaLaunchCheck();
}

extern "C" void cuda_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                                     size_t n) {
    if (!n) return;
    bool vec = aligned16(dgate) && aligned16(dup) && aligned16(dout) && aligned16(gate) && aligned16(up);
    swiglu_backward_kernel<<<ew_blocks(n), EW_THREADS, 0, cuda_stream()>>>(
        (bf16 *)dgate, (bf16 *)dup, (const bf16 *)dout, (const bf16 *)gate, (const bf16 *)up, n, vec);
    cudaLaunchCheck();
}

// y += x, for BF16 act and FP32 buffers alike
template <typename T> static __global__ void add_kernel(T *y, const T *x, size_t n, bool vec) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    float a[8], b[8];
    load8(y, i, n, vec, a);
    load8(x, i, n, vec, b);
#pragma unroll
    for (int j = 0; j < 8; j++) a[j] += b[j];
    store8(y, i, n, vec, a);
}

extern "C" void cuda_add_act(void *y, const void *x, size_t n) {
    if (!n) return;
    bool vec = aligned16(y) && aligned16(x);
    add_kernel<bf16><<<ew_blocks(n), EW_THREADS, 0, cuda_stream()>>>((bf16 *)y, (const bf16 *)x, n, vec);
    cudaLaunchCheck();
}
extern "C" void cuda_add_f32(float *y, const float *x, size_t n) {
    if (!n) return;
    bool vec = aligned16(y) && aligned16(x);
    add_kernel<float><<<ew_blocks(n), EW_THREADS, 0, cuda_stream()>>>(y, x, n, vec);
    cudaLaunchCheck();
}
extern "C" void cuda_copy_act(void *dst, const void *src, size_t n) {
    if (n && dst != src) cudaCheck(cudaMemcpyAsync(dst, src, n * sizeof(bf16), cudaMemcpyDeviceToDevice, cuda_stream()));
}
extern "C" void cuda_copy_f32(float *dst, const float *src, size_t n) {
    if (n && dst != src) cudaCheck(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, cuda_stream()));
}

// ---------------------------------------------------------------------------
// Row gathers: embedding forward and permute forward (out[r] = src[index[r]]),
// one warp per row, 4 independent 16-byte loads per lane before the stores.

static __global__ void gather_rows_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ src,
                                          const int *__restrict__ index, int R, int C, bool vec) {
    int r = blockIdx.x * ROW_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (r >= R) return;
    const bf16 *s = src + (size_t)index[r] * C;
    bf16 *o = out + (size_t)r * C;
    if (!vec) {
        for (int c = lane; c < C; c += WARP) o[c] = s[c];
        return;
    }
    for (int c0 = lane * 8; c0 < C; c0 += 4 * WARP * 8) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int c = c0 + u * WARP * 8;
            if (c < C) v[u] = *reinterpret_cast<const uint4 *>(s + c);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int c = c0 + u * WARP * 8;
            if (c < C) *reinterpret_cast<uint4 *>(o + c) = v[u];
        }
    }
}

static void gather_rows(void *out, const void *src, const int *index, int R, int C) {
    if (R <= 0 || C <= 0) return;
    bool vec = C % 8 == 0 && aligned16(out) && aligned16(src);
    gather_rows_kernel<<<row_blocks(R), ROW_THREADS, 0, cuda_stream()>>>((bf16 *)out, (const bf16 *)src, index,
                                                                       R, C, vec);
    cudaLaunchCheck();
}

extern "C" void cuda_embedding_forward(void *out, const int *tokens, const void *wte, int N, int C) {
    gather_rows(out, wte, tokens, N, C);
}
extern "C" void cuda_permute_forward(void *xp, const void *x, const int *token_of_row, int R, int C) {
    gather_rows(xp, x, token_of_row, R, C);
}

// ---------------------------------------------------------------------------
// Deterministic scatter-adds.

// dwte[tok] += the dout rows of tok's positions, summed in ascending position.
// Grid: x = 8 sorted positions per block, one per warp; y = 256-channel
// slices, 8 channels per lane. Warp i works only if sorted position i starts
// its token's run.
static __global__ void embedding_backward_kernel(float *dwte, const bf16 *dout, const unsigned *skeys,
                                                 const int *order, int N, int C, bool vec_in, bool vec_out) {
    int i = blockIdx.x * ROW_WARPS + threadIdx.x / WARP;
    int c = (blockIdx.y * WARP + threadIdx.x % WARP) * 8;
    if (i >= N || c >= C) return;
    unsigned tok = skeys[i];
    if (i > 0 && skeys[i - 1] == tok) return;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, f[8];
    for (int j = i; j < N && skeys[j] == tok; j++) {
        load8(dout + (size_t)order[j] * C, c, C, vec_in, f);
#pragma unroll
        for (int u = 0; u < 8; u++) acc[u] += f[u];
    }
    float *d = dwte + (size_t)tok * C;
    load8(d, c, C, vec_out, f);
#pragma unroll
    for (int u = 0; u < 8; u++) f[u] += acc[u];
    store8(d, c, C, vec_out, f);
}

extern "C" void cuda_embedding_backward(float *dwte, const void *dout, const int *tokens, int N, int C) {
    static Scratch s;
    if (N <= 0 || C <= 0) return;
    unsigned *skeys;
    int *order;
    sort_indices_by_key(&s, tokens, N, 31, &skeys, &order);
    bool vec_in = C % 8 == 0 && aligned16(dout), vec_out = C % 8 == 0 && aligned16(dwte);
    dim3 grid(row_blocks(N), ceil_div(C, WARP * 8));
    embedding_backward_kernel<<<grid, ROW_THREADS, 0, cuda_stream()>>>(dwte, (const bf16 *)dout, skeys, order, N,
                                                                       C, vec_in, vec_out);
    cudaLaunchCheck();
}

// permute backward: dx[n] (=|+=) the dxp rows of token n, summed in
// ascending row. No sort: one pass lists each token's rows in the order
// integer atomics hand out slots (counts exact, order timing-dependent), and
// the gather, one block per token with 8 channels a thread, puts the list in
// ascending order in each warp before adding. A token with more rows than a
// list holds (never with top-k routing, k <= 32) scans token_of_row instead.
#define PERMUTE_LIST 32  // rows listed per token: one per lane

// cnt[t] = rows of token t (zeroed before); list[t, 0..min(cnt[t], 32))
static __global__ void permute_list_kernel(int *cnt, int *list, const int *token_of_row, int R) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= R) return;
    int t = token_of_row[r];
    int slot = atomicAdd(&cnt[t], 1);
    if (slot < PERMUTE_LIST) list[(size_t)t * PERMUTE_LIST + slot] = r;
}

// acc += src rows r_0 < r_1 < ... < r_{count-1} (lane i holds r_i), in
// that order, ADD_ROWS loads in flight at a time
#define ADD_ROWS 4
template <bool VEC>
__device__ __forceinline__ void add_rows(float acc[8], int row, int count, const bf16 *src, int c, int C) {
    for (int i0 = 0; i0 < count; i0 += ADD_ROWS) {
        float f[ADD_ROWS][8];
#pragma unroll
        for (int u = 0; u < ADD_ROWS; u++) {
            int r = __shfl_sync(0xffffffffu, row, (i0 + u) & (WARP - 1));
            load8_row<VEC>(src + (size_t)r * C, i0 + u < count ? c : C, C, f[u]);
        }
#pragma unroll
        for (int u = 0; u < ADD_ROWS; u++)
            if (i0 + u < count)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[j] += f[u][j];
    }
}

template <bool VEC>
static __global__ void __launch_bounds__(ROW_BLOCK_MAX)
    permute_backward_kernel(bf16 *dx, const bf16 *dxp, const int *cnt, const int *list, const int *token_of_row,
                            int R, int C, int accumulate) {
    int n = blockIdx.x, lane = threadIdx.x % WARP;
    int L = cnt[n];
    bool listed = L <= PERMUTE_LIST;
    int mine = listed && lane < L ? list[(size_t)n * PERMUTE_LIST + lane] : INT_MAX; // only the written entries
    // lane i takes the listed row of rank i (rows are distinct)
    int rank = 0, sorted = 0;
    for (int j = 0; j < L && listed; j++) rank += __shfl_sync(0xffffffffu, mine, j) < mine;
    for (int j = 0; j < L && listed; j++) {
        int rj = __shfl_sync(0xffffffffu, mine, j), kj = __shfl_sync(0xffffffffu, rank, j);
        if (kj == lane) sorted = rj;
    }
    bf16 *d = dx + (size_t)n * C;
    for (int c0 = (threadIdx.x - lane) * 8; c0 < C; c0 += blockDim.x * 8) {  // warp-uniform: lanes past C idle
        int c = c0 + lane * 8;
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (accumulate) load8_row<VEC>(d, c, C, acc);
        if (listed) add_rows<VEC>(acc, sorted, L, dxp, c, C);
        else
            for (int base = 0; base < R; base += WARP) {  // the i-th match of 32 rows to lane i
                unsigned m = __ballot_sync(0xffffffffu, base + lane < R && token_of_row[base + lane] == n);
                add_rows<VEC>(acc, base + (int)__fns(m, 0, lane + 1), __popc(m), dxp, c, C);
            }
        store8_row<VEC>(d, c, C, acc);
    }
}

extern "C" void cuda_permute_backward(void *dx, const void *dxp, const int *token_of_row, int N, int R, int C,
                                      int accumulate) {
    static Scratch s;
    if (N <= 0 || C <= 0) return;
    if (R > 0) {
        int *cnt = (int *)scratch_get(&s, (size_t)N * (1 + PERMUTE_LIST) * sizeof(int)), *list = cnt + N;
        cudaCheck(cudaMemsetAsync(cnt, 0, (size_t)N * sizeof(int), cuda_stream()));
        permute_list_kernel<<<ceil_div(R, 256), 256, 0, cuda_stream()>>>(cnt, list, token_of_row, R);
        cudaLaunchCheck();
        bool vec = C % 8 == 0 && aligned16(dx) && aligned16(dxp);
        (vec ? permute_backward_kernel<true> : permute_backward_kernel<false>)<<<N, row_block_threads(C), 0,
                                                                                 cuda_stream()>>>(
            (bf16 *)dx, (const bf16 *)dxp, cnt, list, token_of_row, R, C, accumulate);
        cudaLaunchCheck();
    } else if (!accumulate) {
        cudaCheck(cudaMemsetAsync(dx, 0, (size_t)N * C * sizeof(bf16), cuda_stream()));
    }
}

// out[n] (=|+=) sum_s weights[n,s] y[row_of[n,s]], s ascending
static __global__ void unpermute_forward_kernel(bf16 *out, const bf16 *y, const float *weights, const int *row_of,
                                                int N, int k, int C, int accumulate, bool vec) {
    int n = blockIdx.x * ROW_WARPS + threadIdx.x / WARP;
    int c = (blockIdx.y * WARP + threadIdx.x % WARP) * 8;
    if (n >= N || c >= C) return;
    float acc[8], f[8];
    bf16 *o = out + (size_t)n * C;
    if (accumulate) load8(o, c, C, vec, acc);
    else
#pragma unroll
        for (int u = 0; u < 8; u++) acc[u] = 0.f;
#pragma unroll 4
    for (int s = 0; s < k; s++) {
        float w = weights[(size_t)n * k + s];
        load8(y + (size_t)row_of[(size_t)n * k + s] * C, c, C, vec, f);
#pragma unroll
        for (int u = 0; u < 8; u++) acc[u] += w * f[u];
    }
    store8(o, c, C, vec, acc);
}

extern "C" void cuda_unpermute_forward(void *out, const void *y, const float *weights, const int *row_of, int N,
                                       int k, int C, int accumulate) {
    if (N <= 0 || C <= 0) return;
    bool vec = C % 8 == 0 && aligned16(out) && aligned16(y);
    dim3 grid(row_blocks(N), ceil_div(C, WARP * 8));
    unpermute_forward_kernel<<<grid, ROW_THREADS, 0, cuda_stream()>>>((bf16 *)out, (const bf16 *)y, weights, row_of,
                                                                      N, k, C, accumulate, vec);
    cudaLaunchCheck();
}

// One block per token, 8 channels a thread (looping when C > 2048):
// dy[row] = w dout[n] and dweights[n,s] = <dout[n], y[row]> for
// UNPERMUTE_SLOTS slots at a time, whose y loads all issue before the first
// product and whose dots share one block_sums.
#define UNPERMUTE_SLOTS 4
template <bool VEC>
static __global__ void __launch_bounds__(ROW_BLOCK_MAX, VEC ? 4 : 1)
    unpermute_backward_kernel(bf16 *dy, float *dweights, const bf16 *dout, const bf16 *y, const float *weights,
                              const int *row_of, int N, int k, int C) {
    __shared__ float red[2][UNPERMUTE_SLOTS * MAX_WARPS];
    size_t n = blockIdx.x;
    const bf16 *d = dout + n * C;
    for (int s0 = 0, slot = 0; s0 < k; s0 += UNPERMUTE_SLOTS, slot ^= 1) {
        int row[UNPERMUTE_SLOTS];
        float w[UNPERMUTE_SLOTS], dot[UNPERMUTE_SLOTS];
#pragma unroll
        for (int u = 0; u < UNPERMUTE_SLOTS; u++) {
            bool on = s0 + u < k;
            row[u] = on ? row_of[n * k + s0 + u] : 0;
            w[u] = on ? weights[n * k + s0 + u] : 0.f;
            dot[u] = 0.f;
        }
        for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8) {
            float df[8], yf[UNPERMUTE_SLOTS][8];
            load8_row<VEC>(d, c, C, df);
#pragma unroll
            for (int u = 0; u < UNPERMUTE_SLOTS; u++)  // slots past k read zeros
                load8_row<VEC>(y + (size_t)row[u] * C, s0 + u < k ? c : C, C, yf[u]);
#pragma unroll
            for (int u = 0; u < UNPERMUTE_SLOTS; u++)
                if (s0 + u < k) {
                    float o[8];
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        o[j] = w[u] * df[j];
                        dot[u] += df[j] * yf[u][j];
                    }
                    store8_row<VEC>(dy + (size_t)row[u] * C, c, C, o);
                }
        }
        block_sums<UNPERMUTE_SLOTS>(dot, red[slot], 0, blockDim.x / WARP);
#pragma unroll
        for (int u = 0; u < UNPERMUTE_SLOTS; u++)
            if (threadIdx.x == u && s0 + u < k) dweights[n * k + s0 + u] = dot[u];
    }
}

extern "C" void cuda_unpermute_backward(void *dy, float *dweights, const void *dout, const void *y,
                                        const float *weights, const int *row_of, int N, int k, int C) {
    if (N <= 0) return;
    bool vec = C % 8 == 0 && aligned16(dy) && aligned16(dout) && aligned16(y);
    (vec ? unpermute_backward_kernel<true> : unpermute_backward_kernel<false>)<<<N, row_block_threads(C), 0,
                                                                                 cuda_stream()>>>(
        (bf16 *)dy, dweights, (const bf16 *)dout, (const bf16 *)y, weights, row_of, N, k, C);
    cudaLaunchCheck();
}

// ---------------------------------------------------------------------------
// RMSNorm, three paths by C (the first two for C a multiple of 8 and
// 16-byte aligned rows):
// - C <= 512 (QK-norm's heads): one warp per row holding the row in
//   registers, V 16-byte vectors per lane;
// - C <= 2048 (d_model): C / 8 threads per row, one 16-byte vector of each
//   operand per thread, on a persistent grid of G blocks: block b takes
//   rows b, b + G, ... and issues row i + G's loads before reducing row i,
//   so loads stay in flight through each row's reduction (block_sums, one
//   barrier) and stores. The forward's blocks are one row wide (32
//   registers: 8 blocks per SM); the backward's hold several rows' groups
//   of threads, one block per SM, so that its dw partials are few;
// - otherwise a general warp-per-row kernel that reads the row twice (the
//   second time from cache).

template <int V>
static __global__ void __launch_bounds__(ROW_THREADS)
    rmsnorm_forward_reg_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int N, int C, float eps) {
    int row = blockIdx.x * ROW_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N) return;
    const bf16 *x = inp + (size_t)row * C;
    uint4 xr[V];
    float ss = 0.f;
#pragma unroll
    for (int v = 0; v < V; v++) {
        int c = (v * WARP + lane) * 8;
        if (c < C) xr[v] = *reinterpret_cast<const uint4 *>(x + c);
    }
#pragma unroll
    for (int v = 0; v < V; v++) {
        int c = (v * WARP + lane) * 8;
        if (c < C) {
            float f[8];
            unpack8(xr[v], f);
#pragma unroll
            for (int j = 0; j < 8; j++) ss += f[j] * f[j];
        }
    }
    ss = warp_sum(ss);
    float r = 1.f / sqrtf(ss / C + eps);
#pragma unroll
    for (int v = 0; v < V; v++) {
        int c = (v * WARP + lane) * 8;
        if (c < C) {
            float f[8], wf[8], o[8];
            unpack8(xr[v], f);
            unpack8(*reinterpret_cast<const uint4 *>(w + c), wf);
#pragma unroll
            for (int j = 0; j < 8; j++) o[j] = f[j] * r * wf[j];
            *reinterpret_cast<uint4 *>(out + (size_t)row * C + c) = pack8(o);
        }
    }
    if (lane == 0) rstd[row] = r;
}

// 16 bytes at channel c of row `row` of a [N, C] array: zeros past N or C
__device__ __forceinline__ uint4 load_row16(const bf16 *a, int row, int N, int C, int c) {
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < N && c < C) v = *reinterpret_cast<const uint4 *>(a + (size_t)row * C + c);
    return v;
}

// Block per row: row i + G is in flight while row i is reduced.
static __global__ void __launch_bounds__(ROW_BLOCK_MAX, 8)
    rmsnorm_forward_block_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int N, int C, float eps) {
    __shared__ float red[2][MAX_WARPS];
    int c = threadIdx.x * 8;
    bool on = c < C;
    uint4 wr = load_row16(w, 0, 1, C, c), xn = load_row16(inp, blockIdx.x, N, C, c);
    for (int row = blockIdx.x, slot = 0; row < N; row += gridDim.x, slot ^= 1) {
        uint4 xr = xn;
        int next = row + gridDim.x;
        if (on && next < N) xn = *reinterpret_cast<const uint4 *>(inp + (size_t)next * C + c);
        float f[8], wf[8], ss[1] = {0.f};
        unpack8(xr, f);
#pragma unroll
        for (int j = 0; j < 8; j++) ss[0] += f[j] * f[j];
        block_sums<1>(ss, red[slot], 0, blockDim.x / WARP);
        float r = 1.f / sqrtf(ss[0] / C + eps);
        if (on) {
            unpack8(wr, wf);
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = f[j] * r * wf[j];
            *reinterpret_cast<uint4 *>(out + (size_t)row * C + c) = pack8(f);
        }
        if (threadIdx.x == 0) rstd[row] = r;
    }
}

static __global__ void rmsnorm_forward_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int N, int C,
                                              float eps, bool vec) {
    int row = blockIdx.x * ROW_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N) return;
    const bf16 *x = inp + (size_t)row * C;
    float ss = 0.f, f[8], wf[8];
    for (int c = lane * 8; c < C; c += WARP * 8) {
        load8(x, c, C, vec, f);
#pragma unroll
        for (int j = 0; j < 8; j++) ss += f[j] * f[j];
    }
    ss = warp_sum(ss);
    float r = 1.f / sqrtf(ss / C + eps);
    for (int c = lane * 8; c < C; c += WARP * 8) {
        load8(x, c, C, vec, f);
        load8(w, c, C, vec, wf);
#pragma unroll
        for (int j = 0; j < 8; j++) f[j] = f[j] * r * wf[j];
        store8(out + (size_t)row * C, c, C, vec, f);
    }
    if (lane == 0) rstd[row] = r;
}

extern "C" void cuda_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *w, int N, int C,
                                     float eps) {
    if (N <= 0 || C <= 0) return;
    bool vec = C % 8 == 0 && aligned16(out) && aligned16(inp) && aligned16(w);
    int nvec = C / 8, grid = row_blocks(N);
    bf16 *o = (bf16 *)out;
    const bf16 *x = (const bf16 *)inp, *wb = (const bf16 *)w;
    cudaStream_t st = cuda_stream();
    if (vec && nvec <= 1 * WARP) rmsnorm_forward_reg_kernel<1><<<grid, ROW_THREADS, 0, st>>>(o, rstd, x, wb, N, C, eps);
    else if (vec && nvec <= 2 * WARP) rmsnorm_forward_reg_kernel<2><<<grid, ROW_THREADS, 0, st>>>(o, rstd, x, wb, N, C, eps);
    else if (vec && nvec <= ROW_BLOCK_MAX) {
        static int per_sm[MAX_WARPS + 1];
        int threads = row_block_threads(C);
        int G = persistent_blocks(rmsnorm_forward_block_kernel, threads, 0, per_sm, N);
        rmsnorm_forward_block_kernel<<<G, threads, 0, st>>>(o, rstd, x, wb, N, C, eps);
    } else rmsnorm_forward_kernel<<<grid, ROW_THREADS, 0, st>>>(o, rstd, x, wb, N, C, eps, vec);
    cudaLaunchCheck();
}

// Backward, dx = r w dy - x r^3 mean(x w dy) (=|+=), per row; dw partials
// [G, C] that column_sum_kernel adds into dw. Each thread reads and writes
// the same elements, so dinp may alias dout.
//
// Warp per row (C <= 512): a persistent grid of G blocks; warp g of the grid
// takes rows g, g + 8G, ... and keeps its dw in registers (every warp's
// lanes own the same channels); the block's 8 warps then add theirs into
// shared memory in warp order and write one partial row.
// 8 channels of a row: g (=|+=) r w dy - x kk (g holds the old dx when
// accumulating), dw += dy x r
__device__ __forceinline__ void rmsnorm_dx8(float g[8], float dw[8], const float xf[8], const float wf[8],
                                            const float df[8], float r, float kk, int accumulate) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float gj = r * wf[j] * df[j] - xf[j] * kk;
        g[j] = accumulate ? g[j] + gj : gj;
        dw[j] += df[j] * xf[j] * r;
    }
}

template <int V>
static __global__ void __launch_bounds__(ROW_THREADS)
    rmsnorm_backward_reg_kernel(bf16 *dinp, float *partial, const bf16 *dout, const bf16 *inp, const bf16 *w,
                                const float *rstd, int N, int C, int accumulate) {
    extern __shared__ float sdw[];  // [C]
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    uint4 wr[V];
    float dw[V][8];
#pragma unroll
    for (int v = 0; v < V; v++) {
        int c = (v * WARP + lane) * 8;
        if (c < C) wr[v] = *reinterpret_cast<const uint4 *>(w + c);
#pragma unroll
        for (int j = 0; j < 8; j++) dw[v][j] = 0.f;
    }
    for (int row = blockIdx.x * ROW_WARPS + warp; row < N; row += gridDim.x * ROW_WARPS) {
        const bf16 *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
        bf16 *dx = dinp + (size_t)row * C;
        uint4 xr[V], dyr[V];
#pragma unroll
        for (int v = 0; v < V; v++) {
            int c = (v * WARP + lane) * 8;
            if (c < C) {
                xr[v] = *reinterpret_cast<const uint4 *>(x + c);
                dyr[v] = *reinterpret_cast<const uint4 *>(dy + c);
            }
        }
        float r = rstd[row];
        float dot = 0.f;
#pragma unroll
        for (int v = 0; v < V; v++) {
            int c = (v * WARP + lane) * 8;
            if (c < C) {
                float xf[8], wf[8], df[8];
                unpack8(xr[v], xf);
                unpack8(wr[v], wf);
                unpack8(dyr[v], df);
#pragma unroll
                for (int j = 0; j < 8; j++) dot += xf[j] * wf[j] * df[j];
            }
        }
        dot = warp_sum(dot);
        float kk = (dot / C) * r * r * r;
#pragma unroll
        for (int v = 0; v < V; v++) {
            int c = (v * WARP + lane) * 8;
            if (c < C) {
                float xf[8], wf[8], df[8], g[8];
                unpack8(xr[v], xf);
                unpack8(wr[v], wf);
                unpack8(dyr[v], df);
                if (accumulate) unpack8(*reinterpret_cast<const uint4 *>(dx + c), g);
                rmsnorm_dx8(g, dw[v], xf, wf, df, r, kk, accumulate);
                *reinterpret_cast<uint4 *>(dx + c) = pack8(g);
            }
        }
    }
    for (int wi = 0; wi < ROW_WARPS; wi++) {
        if (warp == wi) {
#pragma unroll
            for (int v = 0; v < V; v++) {
                int c = (v * WARP + lane) * 8;
                if (c < C)
#pragma unroll
                    for (int j = 0; j < 8; j++) sdw[c + j] = (wi ? sdw[c + j] : 0.f) + dw[v][j];
            }
        }
        __syncthreads();
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) partial[(size_t)blockIdx.x * C + c] = sdw[c];
}

// Block per row (C <= 2048), one block per SM: its groups of T =
// row_block_threads(C) threads each take one row of every set of `groups`
// consecutive rows; block b takes sets b, b + G, ... and loads set s + G
// while reducing set s. Each thread keeps its 8 channels' dw in registers;
// at the end the groups' dw are added in group order into the block's
// partial row (G = the SM count: few partials for column_sum_kernel). The
// block is as large as the registers allow: 64 a thread at 1024 threads,
// 80 at 768 for the old dx's 16 bytes.
#define DW_BLOCK_THREADS(acc) ((acc) ? 768 : 1024)
template <int ACC>
static __global__ void __launch_bounds__(DW_BLOCK_THREADS(ACC), 1)
    rmsnorm_backward_block_kernel(bf16 *dinp, float *partial, const bf16 *dout, const bf16 *inp, const bf16 *w,
                                  const float *rstd, int N, int C, int accumulate) {
    __shared__ float red[2][MAX_WARPS], sdw[DW_BLOCK_THREADS(ACC) * 8];
    int T = row_block_threads(C), groups = blockDim.x / T, grp = threadIdx.x / T, c = threadIdx.x % T * 8;
    int stride = gridDim.x * groups, row = blockIdx.x * groups + grp;  // stride: rows from a set to the next
    uint4 wr = load_row16(w, 0, 1, C, c), xn = load_row16(inp, row, N, C, c), dyn = load_row16(dout, row, N, C, c);
    uint4 gn = ACC ? load_row16(dinp, row, N, C, c) : make_uint4(0, 0, 0, 0);
    float rn = row < N ? rstd[row] : 0.f, dw[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int first = blockIdx.x * groups, slot = 0; first < N; first += stride, row += stride, slot ^= 1) {
        float xf[8], wf[8], df[8], g[8], r = rn, dot[1] = {0.f};
        unpack8(xn, xf);
        unpack8(dyn, df);
        unpack8(gn, g);
        int next = row + stride;
        if (next < N) {  // past N the buffers keep stale rows, which are not stored
            size_t o = (size_t)next * C + c;
            if (c < C) {
                xn = *reinterpret_cast<const uint4 *>(inp + o);
                dyn = *reinterpret_cast<const uint4 *>(dout + o);
                if (ACC) gn = *reinterpret_cast<const uint4 *>(dinp + o);
            }
            rn = rstd[next];
        }
        unpack8(wr, wf);
#pragma unroll
        for (int j = 0; j < 8; j++) dot[0] += xf[j] * wf[j] * df[j];
        block_sums<1>(dot, red[slot], grp * T / WARP, T / WARP);
        float kk = (dot[0] / C) * r * r * r;
        if (row < N && c < C) {
            rmsnorm_dx8(g, dw, xf, wf, df, r, kk, ACC);
            *reinterpret_cast<uint4 *>(dinp + (size_t)row * C + c) = pack8(g);
        }
    }
    if (c < C) store8(sdw + grp * C, c, C, true, dw);
    __syncthreads();
    if (grp == 0 && c < C) {
        float f[8];
        for (int k = 1; k < groups; k++) {
            load8(sdw + k * C, c, C, true, f);
#pragma unroll
            for (int j = 0; j < 8; j++) dw[j] += f[j];
        }
        store8(partial + (size_t)blockIdx.x * C, c, C, true, dw);
    }
}

// General path, dx only (dw by rmsnorm_dw_partial_kernel, launched first so
// that dinp may alias dout).
static __global__ void rmsnorm_backward_kernel(bf16 *dinp, const bf16 *dout, const bf16 *inp, const bf16 *w,
                                               const float *rstd, int N, int C, int accumulate, bool vec) {
    int row = blockIdx.x * ROW_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N) return;
    const bf16 *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    bf16 *dx = dinp + (size_t)row * C;
    float r = rstd[row], dot = 0.f, xf[8], wf[8], df[8], g[8];
    for (int c = lane * 8; c < C; c += WARP * 8) {
        load8(x, c, C, vec, xf);
        load8(w, c, C, vec, wf);
        load8(dy, c, C, vec, df);
#pragma unroll
        for (int j = 0; j < 8; j++) dot += xf[j] * wf[j] * df[j];
    }
    dot = warp_sum(dot);
    float kk = (dot / C) * r * r * r;
    for (int c = lane * 8; c < C; c += WARP * 8) {
        load8(x, c, C, vec, xf);
        load8(w, c, C, vec, wf);
        load8(dy, c, C, vec, df);
        if (accumulate) load8(dx, c, C, vec, g);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float gj = r * wf[j] * df[j] - xf[j] * kk;
            g[j] = accumulate ? g[j] + gj : gj;
        }
        store8(dx, c, C, vec, g);
    }
}

// partial[g, c] = sum of dy x r over rows [g N/G, (g+1) N/G), one thread per
// channel (coalesced across the block)
static __global__ void rmsnorm_dw_partial_kernel(float *partial, const bf16 *dout, const bf16 *inp,
                                                 const float *rstd, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, g = blockIdx.y, G = gridDim.y;
    if (c >= C) return;
    int r0 = (int)((long)N * g / G), r1 = (int)((long)N * (g + 1) / G);
    float s = 0.f;
    for (int r = r0; r < r1; r++)
        s += __bfloat162float(dout[(size_t)r * C + c]) * __bfloat162float(inp[(size_t)r * C + c]) * rstd[r];
    partial[(size_t)g * C + c] = s;
}

// dw[c] += sum over g of partial[g, c]: 32 channels x 32 slices of g per
// block, the slices then summed in order. A slice's loads go 8 at a time
// (the partials of a persistent grid are hundreds of rows).
static __global__ void column_sum_kernel(float *dw, const float *partial, int G, int C) {
    __shared__ double sh[32][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    double s = 0;
    if (c < C)
        for (int g0 = threadIdx.y; g0 < G; g0 += 8 * 32) {
            float p[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                int g = g0 + u * 32;
                p[u] = g < G ? partial[(size_t)g * C + c] : 0.f;
            }
#pragma unroll
            for (int u = 0; u < 8; u++) s += p[u];
        }
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        double t = 0;
        for (int y = 0; y < 32; y++) t += sh[y][threadIdx.x];
        dw[c] += (float)t;
    }
}

typedef void (*RmsnormDwKernel)(bf16 *, float *, const bf16 *, const bf16 *, const bf16 *, const float *, int, int,
                                int);

// A fast path's kernel on its persistent grid (blocks of `threads` taking
// rows_per_block rows at a time; each block writes a partial row), then the
// partials' column sums into dw.
static void rmsnorm_backward_persistent(RmsnormDwKernel kernel, int threads, size_t smem, int rows_per_block,
                                        int *per_sm, Scratch *s, bf16 *dinp, float *dw, const bf16 *dout,
                                        const bf16 *inp, const bf16 *w, const float *rstd, int N, int C,
                                        int accumulate) {
    int G = persistent_blocks(kernel, threads, smem, per_sm, ceil_div(N, rows_per_block));
    float *partial = (float *)scratch_get(s, (size_t)G * C * sizeof(float));
    kernel<<<G, threads, smem, cuda_stream()>>>(dinp, partial, dout, inp, w, rstd, N, C, accumulate);
    cudaLaunchCheck();
    column_sum_kernel<<<ceil_div(C, 32), dim3(32, 32), 0, cuda_stream()>>>(dw, partial, G, C);
    cudaLaunchCheck();
}

// the warp-per-row kernel's shared memory, sized for its largest C
template <int V>
static void rmsnorm_backward_reg(Scratch *s, bf16 *dinp, float *dw, const bf16 *dout, const bf16 *inp,
                                 const bf16 *w, const float *rstd, int N, int C, int accumulate) {
    static int per_sm[MAX_WARPS + 1];
    rmsnorm_backward_persistent(rmsnorm_backward_reg_kernel<V>, ROW_THREADS, V * WARP * 8 * sizeof(float), ROW_WARPS,
                                per_sm, s, dinp, dw, dout, inp, w, rstd, N, C, accumulate);
}

extern "C" void cuda_rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                                      const float *rstd, int N, int C, int accumulate) {
    static Scratch s;
    static int per_sm[2][MAX_WARPS + 1];
    if (N <= 0 || C <= 0) return;
    bool vec = C % 8 == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(w);
    int nvec = C / 8;
    bf16 *dx = (bf16 *)dinp;
    const bf16 *dy = (const bf16 *)dout, *x = (const bf16 *)inp, *wb = (const bf16 *)w;
    if (vec && nvec <= 1 * WARP) return rmsnorm_backward_reg<1>(&s, dx, dw, dy, x, wb, rstd, N, C, accumulate);
    if (vec && nvec <= 2 * WARP) return rmsnorm_backward_reg<2>(&s, dx, dw, dy, x, wb, rstd, N, C, accumulate);
    if (vec && nvec <= ROW_BLOCK_MAX) {
        int T = row_block_threads(C), groups = DW_BLOCK_THREADS(accumulate) / T;
        return rmsnorm_backward_persistent(
            accumulate ? rmsnorm_backward_block_kernel<1> : rmsnorm_backward_block_kernel<0>, groups * T, 0, groups,
            per_sm[accumulate != 0], &s, dx, dw, dy, x, wb, rstd, N, C, accumulate);
    }
    int G = N < 128 ? N : 128;
    float *partial = (float *)scratch_get(&s, (size_t)G * C * sizeof(float));
    rmsnorm_dw_partial_kernel<<<dim3(ceil_div(C, 256), G), 256, 0, cuda_stream()>>>(partial, dy, x, rstd, N, C);
    cudaLaunchCheck();
    column_sum_kernel<<<ceil_div(C, 32), dim3(32, 32), 0, cuda_stream()>>>(dw, partial, G, C);
    cudaLaunchCheck();
    rmsnorm_backward_kernel<<<row_blocks(N), ROW_THREADS, 0, cuda_stream()>>>(dx, dy, x, wb, rstd, N, C, accumulate,
                                                                            vec);
    cudaLaunchCheck();
}

// ---------------------------------------------------------------------------
// RoPE: one thread per 8 pairs (i, i + hd/2) of one (b, t, head); it reads
// all 16 values before writing them, so out may alias inp.

static __global__ void rope_kernel(bf16 *out, const bf16 *inp, const float *cos_t, const float *sin_t, int T, int nh,
                                   int hd, size_t rows, float sign, bool vec) {
    int half = hd / 2, chunks = (half + 7) / 8;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * chunks) return;
    size_t row = idx / chunks;  // (b, t, h)
    int i = (int)(idx % chunks) * 8;
    int t = (int)((row / nh) % T);
    const bf16 *x = inp + row * hd;
    bf16 *o = out + row * hd;
    float a[8], b[8], c[8], s[8], oa[8], ob[8];
    load8(x, i, half, vec, a);
    load8(x + half, i, half, vec, b);
    load8(cos_t + (size_t)t * half, i, half, vec, c);
    load8(sin_t + (size_t)t * half, i, half, vec, s);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float sn = sign * s[j];
        oa[j] = a[j] * c[j] - b[j] * sn;
        ob[j] = b[j] * c[j] + a[j] * sn;
    }
    store8(o, i, half, vec, oa);
    store8(o + half, i, half, vec, ob);
}

static void rope(void *out, const void *inp, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd,
                 float sign) {
    int half = hd / 2;
    size_t rows = (size_t)B * T * nh;
    if (!rows || half <= 0) return;
    bool vec = half % 8 == 0 && aligned16(out) && aligned16(inp) && aligned16(cos_t) && aligned16(sin_t);
    size_t threads = rows * ((half + 7) / 8);
    rope_kernel<<<ceil_div((long)threads, 256), 256, 0, cuda_stream()>>>((bf16 *)out, (const bf16 *)inp, cos_t, sin_t,
                                                                        T, nh, hd, rows, sign, vec);
    cudaLaunchCheck();
}

extern "C" void cuda_rope_forward(void *out, const void *inp, const float *cos_t, const float *sin_t, int B, int T,
                                  int nh, int hd) {
    rope(out, inp, cos_t, sin_t, B, T, nh, hd, 1.f);
}
extern "C" void cuda_rope_backward(void *dinp, const void *dout, const float *cos_t, const float *sin_t, int B, int T,
                                   int nh, int hd) {
    rope(dinp, dout, cos_t, sin_t, B, T, nh, hd, -1.f);
}

// ---------------------------------------------------------------------------
// Router (f32 [N, E]); one warp per token, lanes over experts.

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
static __global__ void router_topk_random_kernel(int *idx, int N, int E, int k, uint64_t seed) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
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

extern "C" void cuda_router_topk(int *idx, const float *probs, const float *bias, int N, int E, int k,
                                 RoutingMode mode, uint64_t seed) {
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

static __global__ void lb_finish_kernel(float *out, const float *part, int G, const float *counts, float count_tokens,
                                        int N, int E, int k) {
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

// ---------------------------------------------------------------------------
// Dropless dispatch index: a stable sort of the flat (token, slot) indices
// i = n k + s by expert gives the order (expert, token, slot); row j of the
// grouped rows is the j-th sorted index.

static __global__ void route_rows_kernel(int *row_of, int *token_of_row, const int *order, int R, int k) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= R) return;
    int i = order[j];
    row_of[i] = j;
    token_of_row[j] = i / k;
}

extern "C" void cuda_moe_route_index(int *offsets, int *row_of, int *token_of_row, const int *idx, int N, int E,
                                     int k) {
    static Scratch s;
    int R = N * k;
    if (E <= 0) return;
    if (R <= 0) {
        cudaCheck(cudaMemsetAsync(offsets, 0, (size_t)(E + 1) * sizeof(int), cuda_stream()));
        return;
    }
    unsigned *skeys;
    int *order;
    sort_indices_by_key(&s, idx, R, key_bits(E), &skeys, &order);
    segment_starts_kernel<<<ceil_div(R + 1, 256), 256, 0, cuda_stream()>>>(offsets, skeys, R, E);
    cudaLaunchCheck();
    route_rows_kernel<<<ceil_div(R, 256), 256, 0, cuda_stream()>>>(row_of, token_of_row, order, R, k);
    cudaLaunchCheck();
}

// ---------------------------------------------------------------------------
// Cross-entropy: one block per row, an online softmax over all V logits in
// FP32: each thread keeps (max, sum of exp(x - max)) over its 8-element
// vectors, 4 vectors loaded before use; the block combines the pairs in a
// fixed tree. Backward recomputes the statistics, then writes
// dloss (softmax - onehot) in place of the logits it has just read (every
// element is read and written by the same thread, after the block's first
// pass), so dlogits may alias logits.

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

static __global__ void __launch_bounds__(CE_THREADS)
    crossentropy_forward_kernel(float *losses, const bf16 *logits, const int *targets, int V, bool vec) {
    int n = blockIdx.x, t = targets[n];
    if (t < 0) {
        if (threadIdx.x == 0) losses[n] = 0.f;
        return;
    }
    const bf16 *row = logits + (size_t)n * V;
    float m, s;
    ce_row_stats(row, V, vec, &m, &s);
    if (threadIdx.x == 0) losses[n] = m + logf(s) - __bfloat162float(row[t]);
}

static __global__ void __launch_bounds__(CE_THREADS)
    crossentropy_backward_kernel(bf16 *dlogits, const bf16 *logits, const int *targets, float dloss, int V,
                                 bool vec) {
    int n = blockIdx.x, t = targets[n];
    const bf16 *row = logits + (size_t)n * V;
    bf16 *d = dlogits + (size_t)n * V;
    const int step = CE_THREADS * 8;
    if (t < 0) {
        float z[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int c = threadIdx.x * 8; c < V; c += step) store8(d, c, V, vec, z);
        return;
    }
    float m, s;
    ce_row_stats(row, V, vec, &m, &s);
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

extern "C" void cuda_crossentropy_forward(float *losses, const void *logits, const int *targets, int N, int V) {
    if (N <= 0) return;
    bool vec = V % 8 == 0 && aligned16(logits);
    crossentropy_forward_kernel<<<N, CE_THREADS, 0, cuda_stream()>>>(losses, (const bf16 *)logits, targets, V, vec);
    cudaLaunchCheck();
}

extern "C" void cuda_crossentropy_backward(void *dlogits, const void *logits, const int *targets, float dloss, int N,
                                           int V) {
    if (N <= 0) return;
    bool vec = V % 8 == 0 && aligned16(logits) && aligned16(dlogits);
    crossentropy_backward_kernel<<<N, CE_THREADS, 0, cuda_stream()>>>((bf16 *)dlogits, (const bf16 *)logits, targets,
                                                                      dloss, V, vec);
    cudaLaunchCheck();
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

// ---------------------------------------------------------------------------
// Optimizer

// torch.optim.AdamW, with cpu_adamw_update's operations in its order and
// without contraction into FMAs (__f*_rn), so p, m, v match the CPU's
// bit for bit.
static __global__ void adamw_kernel(float *p, bf16 *p_act, const float *g, float *m, float *v, size_t n, float beta1,
                                    float beta2, float eps, float grad_scale, float step, float bc2_sqrt, float decay,
                                    bool vec) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    float pf[8], gf[8], mf[8], vf[8];
    load8(p, i, n, vec, pf);
    load8(g, i, n, vec, gf);
    load8(m, i, n, vec, mf);
    load8(v, i, n, vec, vf);
    float b1c = __fsub_rn(1.f, beta1), b2c = __fsub_rn(1.f, beta2);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float gi = __fmul_rn(gf[j], grad_scale);
        mf[j] = __fadd_rn(__fmul_rn(beta1, mf[j]), __fmul_rn(b1c, gi));
        vf[j] = __fadd_rn(__fmul_rn(beta2, vf[j]), __fmul_rn(__fmul_rn(b2c, gi), gi));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vf[j]), bc2_sqrt), eps);
        pf[j] = __fsub_rn(__fmul_rn(pf[j], decay), __fdiv_rn(__fmul_rn(step, mf[j]), denom));
    }
    store8(p, i, n, vec, pf);
    store8(m, i, n, vec, mf);
    store8(v, i, n, vec, vf);
    if (p_act) store8(p_act, i, n, vec, pf);
}

extern "C" void cuda_adamw_update(float *p, void *p_act, const float *g, float *m, float *v, size_t n, float lr,
                                  float beta1, float beta2, float eps, float wd, float grad_scale, int t) {
    if (!n) return;
    double bc1 = 1 - pow(beta1, t), bc2 = 1 - pow(beta2, t);
    float step = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2), decay = 1 - lr * wd;
    if (p_act == (void *)p) p_act = NULL;
    bool vec = aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v) && (!p_act || aligned16(p_act));
    adamw_kernel<<<ew_blocks(n), EW_THREADS, 0, cuda_stream()>>>(p, (bf16 *)p_act, g, m, v, n, beta1, beta2, eps,
                                                               grad_scale, step, bc2_sqrt, decay, vec);
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
