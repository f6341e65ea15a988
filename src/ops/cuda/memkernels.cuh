// Helpers of the CUDA backend's memory-bound kernels: the op families of
// elementwise.cu, rmsnorm.cu, rope.cu, router.cu, dispatch.cu, loss.cu and
// optim.cu, which are every op of src/ops/ops.h except the matmuls (gemm.cu)
// and attention (attention.cu). Their semantics are the CPU kernels'
// (src/ops/cpu/cpu_kernels.h): act is BF16, all math FP32 (a few scalar
// reductions in FP64), f32 buffers FP32.
//
// Invariants of those files
// - Everything runs on cuda_stream() with no host synchronisation and no
//   allocation, so a captured CUDA graph replays it. Ops that need scratch
//   keep a static device buffer of their own (Scratch), sized on the first
//   call and grown only when a call needs more; a training step calls with
//   fixed sizes, so its first (uncaptured) run sizes them all.
// - Deterministic: no floating-point atomics. Reductions write per-block
//   partials that one block (or one thread per column) sums in a fixed
//   order; the grid of a reduction depends only on the shape and the GPU.
// - 16-byte loads and stores wherever a row's length is a multiple of 8
//   elements and the pointers are 16-byte aligned; scalar otherwise (the
//   same kernels, through load8 / store8).
#pragma once
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/ops_cuda.h"

#define WARP 32
#define ROW_THREADS 256  // blocks of warp-per-row kernels: 8 rows at a time
#define ROW_WARPS (ROW_THREADS / WARP)
#define ROW_BLOCK_MAX 256  // block-per-row kernels: 8 channels a thread, C <= 2048
#define MAX_WARPS 32       // warps of the largest block
#define EW_THREADS 256   // elementwise kernels: 8 elements per thread

// ---------------------------------------------------------------------------
// Launch shapes and scratch

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

// ---------------------------------------------------------------------------
// 8 elements at a time: BF16 and FP32 loads and stores

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

// RoPE's rotation of 8 pairs (a, b) = (x[i], x[i + hd/2]) by (c, s): oa =
// a c - b sn, ob = b c + a sn, sn = sign s (sign -1: the inverse), with the
// roundings written out so that every kernel that rotates (rope.cu, the
// fused QK-norm + RoPE of rmsnorm.cu) gives the same bits.
__device__ __forceinline__ float rope_first(float a, float b, float c, float s, float sign) {
    return __fmaf_rn(a, c, -__fmul_rn(b, sign * s));
}
__device__ __forceinline__ float rope_second(float a, float b, float c, float s, float sign) {
    return __fmaf_rn(b, c, __fmul_rn(a, sign * s));
}
__device__ __forceinline__ void rope_rotate8(const float a[8], const float b[8], const float c[8], const float s[8],
                                             float sign, float oa[8], float ob[8]) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        oa[j] = rope_first(a[j], b[j], c[j], s[j], sign);
        ob[j] = rope_second(a[j], b[j], c[j], s[j], sign);
    }
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

// ---------------------------------------------------------------------------
// Fixed-order reductions

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

// One block sums part[0..G) in a fixed order: out[0] = total / div when out,
// else acc[0] += total (memkernels.cu).
void sum_partials(const double *part, int G, float *out, double div, double *acc);

// One row of C BF16 values copied by one warp (lane = its lane), zeros
// where s is NULL; vec: 16-byte accesses, 4 loads in flight per lane before
// the stores (C % 8 == 0 and both rows 16-byte aligned). STREAM: the stores
// marked evict-first (st.global.cs), for a gather whose sources are read
// again and again (the permute: every token's row k times) while its
// output streams through L2 (which would evict the sources otherwise).
template <bool STREAM = false>
__device__ __forceinline__ void warp_copy_row(bf16 *__restrict__ o, const bf16 *__restrict__ s, int C, int lane,
                                              bool vec) {
    if (!vec) {
        for (int c = lane; c < C; c += WARP) o[c] = s ? s[c] : __float2bfloat16(0.f);
        return;
    }
    for (int c0 = lane * 8; c0 < C; c0 += 4 * WARP * 8) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int c = c0 + u * WARP * 8;
            if (c < C) v[u] = s ? *reinterpret_cast<const uint4 *>(s + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int c = c0 + u * WARP * 8;
            if (c >= C) continue;
            if (STREAM) __stcs(reinterpret_cast<uint4 *>(o + c), v[u]);
            else *reinterpret_cast<uint4 *>(o + c) = v[u];
        }
    }
}
