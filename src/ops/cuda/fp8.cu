// FP8 on the GPU (issue 18; formats and rules in src/ops/fp8.h, API in
// fp8_cuda.h).
//
// Quantisers: the CPU reference's arithmetic step for step, so that values
// and scales agree bit for bit: fmaxf over |x| (NaN ignored), the same
// clamps, IEEE division (__fdiv_rn; the backend is built without fast-math,
// so subnormals are kept; where the values are BF16, div_bf16: one
// reciprocal per scale and Markstein's correction per value, which gives
// __fdiv_rn's codes on every (BF16 value, scale) pair, all of which
// tests/gpu/test_fp8.c tries), and cuda_fp8.h's saturating round-to-nearest-even
// conversion (cvt.rn.satfinite; NaN -> 0x7f). Memory-bound: 16-byte loads,
// the tile's amax by shuffles among the threads that hold it.
//
// The grouped GEMM forward (block128): the warp-specialised layout of
// grouped_wgmma.cu's TMA kernel with FP8 operands. 384 threads: warpgroup 0
// produces (one thread issues TMA loads into a 4-deep ring of 48 KB stages:
// a 128 x 128-byte A box and a 256 x 128-byte B box, 128-byte swizzle),
// warpgroups 1 and 2 consume, each owning 64 rows of the 128 x 256 output
// tile. A stage is K = 128: one scale block of both operands. Per stage and
// per 128-column half h of the tile, a consumer issues 4 wgmma
// m64n128k32.e4m3.e4m3 into a partial accumulator (zeroed by the first),
// waits for them, and promotes: acc_h += part * sa[row][kb] * sw[e][nb_h][kb],
// in FP32 (DeepSeek-V3's promotion every 128 of K; the tensor cores'
// accumulation inside one block is the only part not in IEEE FP32). The
// two consumer warpgroups interleave, so one's promotion runs under the
// other's wgmma; consumer 2 takes the halves in the order 1, 0. Registers
// per consumer thread: 2 x 64 accumulators and 64 partials. The epilogue
// stores 16 bytes per thread after a transpose inside each quad.
// Measured (ncu, H200): the tensor pipe is busy ~55% of the time; the
// consumers mostly wait on their own wgmma (issue, wait, promote), so the
// next step is more overlap inside a warpgroup (A from registers, two
// partial accumulators over column quarters), not more bandwidth. Tried and
// dropped (2026-12-02, bench/results/2026-12-02-h200-s4.md): the two
// consumers taking turns to issue (named barriers), so that one's wait and
// promotion would run under the other's wgmma: 0.92x (gate/up) and 0.94x
// (down) with the stagger, 1.00x without; their wgmma already overlap.
// Also tried and dropped (2026-12-07, H100, bench/results/2026-12-07-h100-s5.md;
// the code is commit 4585e2c's variants 4-7): 128 x 128 tiles with two
// partial accumulators, so that a stage's wgmma run while the previous
// stage is promoted: 0.95x / 0.91x variant 3 (gate/up / down), with the
// tensor pipe no busier (ncu: 53.8% against 55.9%), so the promotion's
// wait is not what holds the kernel at ~43% of the FP8 peak either; the
// same in 2-CTA clusters with A multicast (TMA .multicast::cluster, remote
// mbarrier arrivals): 0.34x / 0.38x, L2 71% busy for a third of the work
// (not understood); the next tile's first stage issued under the epilogue:
// slower (it spilled). What the shared pipe (ncu: 55.9%, the highest)
// and the issue of four m64n128k32 per half leave is the next question.
// A from registers (ldmatrix of the swizzled A box once a stage, both
// halves' wgmma reading the registers; commit c80f930) gave the default's
// bits at 0.89x (gate/up) and 0.92x (down) on an H100 (2026-12-07,
// bench/results/2026-12-07-s9.md): not the shared pipe's A reads either.
// An m64n256 wgmma per stage does not fit: with the promotion every 128
// of K it needs 128 partial and 128 accumulator registers a thread (256,
// the limit is 255). ncu's stall samples (H100, 2026-12-07,
// bench/results/2026-12-07-s10.md): the tensor pipe is busy 58% of the
// cycles (the BF16 forward's: 85%), a quarter of the consumer samples sit
// at the wgmma wait before each half's promotion and ~9% in the stage
// barriers' waits; so the gap to 1.6x is the pipe's idle time. More
// independent wgmma in flight per multiprocessor did not fill it: three
// consumer warpgroups on 192 x 128 tiles (64 accumulators + 64 partials at
// 160 registers, one wait and promotion a stage, 5 stages of 40 KB; commit
// 8e1a5eb's variant 4) gave the default's bits at 1.23x BF16 against the
// default's 1.35x (gate/up) and 1.16x against 1.21x (down) on an H100
// (2026-12-07, bench/results/2026-12-07-s11.md). Nor did DeepGEMM's loop
// shape: 128 x 192 tiles, each consumer issuing one wgmma group a stage (4 x
// m64n192k32 into 96 partials), one wait and one promotion a stage, the two
// weight scale blocks a tile spans split per 8-column group, 64- and
// 128-wide tails on m64n64 / m64n128 (commit df2b0f4; 598de18 added one
// empty-barrier arrival per consumer warp): the default's bits at 1.18x /
// 1.17x BF16 (gate/up / down; 1.17x / 1.15x with the warp arrivals)
// against the default's 1.32x / 1.20x, and 0.987x / 0.988x on the FP8
// OLMoE-1B-7B step (8 layers) on an H100 (2026-12-07,
// bench/results/2026-12-07-s13.md); removed. The same call's DIAG rows
// bound what any promotion scheme can gain on this feed (128 x 256 tiles,
// both operands from shared memory): without the promotion's arithmetic
// 1.80x / 1.59x BF16, with all of K in the tensor cores and one wait a
// stage 1.69x / 1.51x, so the down shape stays under 1.6x even with a free
// promotion.
// Tiles come from the device offsets like the BF16 kernels
// (grouped_sched.cuh); rows past a segment read the next expert's rows,
// which only reach output rows the epilogue does not store.
//
// fp8.wgrad: fp8 (its section below): the 128 x 1 fake quantiser along
// each expert's tokens, and the speed path: a quantiser that writes both
// weight-grad operands transposed (K-major, as FP8 wgmma reads them) and
// the FP8 grouped weight-grad, whose block scales vary along both output
// axes (H200, OLMoE shapes: 1.18-1.21x the BF16 weight-grad, 553 TFLOP/s;
// bench/results/2026-12-01-h200-issue18-wgrad-gpu.md).
#include "ops/cuda/adamw.cuh"
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/fp8_cuda.h"
#include "ops/cuda/grouped_sched.cuh"
#include "ops/cuda/ops_cuda.h"
#include "ops/cuda/unpermute_bwd.cuh"
#include "ops/cuda/wgmma_util.cuh"
#include "ops/fp8.h"
#include <cuda_fp8.h>
#include <float.h>
#include <stdlib.h>
#include <string.h>

namespace {

__device__ __forceinline__ uint8_t e4m3(float x) {
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}
// fp8_block_scale of fp8.h
__device__ __forceinline__ float block_scale(float amax) {
    amax = fminf(amax, FLT_MAX);
    amax = fmaxf(amax, FP8_AMAX_FLOOR);
    return __fdiv_rn(amax, FP8_E4M3_MAX);
}
// x / s where x is a BF16 value and s a block_scale of a BF16 amax: the
// reciprocal once per scale (__frcp_rn), then q = x r and one correction
// from the exact residual x - q s (Markstein). q itself where the residual
// is 0 (x exact multiples, and -0, whose sign the correction would lose) or
// q is not finite (x = +-inf, NaN). The quotient may differ from __fdiv_rn's
// only where it is far below E4M3's smallest value, which both encode as 0
// of the same sign: div_bf16_codes_match (test_fp8) checks the codes of
// every pair.
struct Recip {
    float s, r;
};
__device__ __forceinline__ Recip recip(float s) { return Recip{s, __frcp_rn(s)}; }
__device__ __forceinline__ float div_bf16(float x, Recip d) {
    float q = __fmul_rn(x, d.r);
    float e = __fmaf_rn(-q, d.s, x);
    return e == 0.0f || !isfinite(q) ? q : __fmaf_rn(e, d.r, q);
}
// e4m3 of a, b, c, d in bytes 0..3: two values per conversion
// (cvt.rn.satfinite.e4m3x2.f32, the instruction e4m3 uses for one)
__device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d) {
    uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
    uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
    return lo | hi << 16;
}
__device__ __forceinline__ uint32_t pack4(float a, float b, float c, float d, float s) {
    return e4m3x4(__fdiv_rn(a, s), __fdiv_rn(b, s), __fdiv_rn(c, s), __fdiv_rn(d, s));
}
__device__ __forceinline__ uint32_t pack4(float a, float b, float c, float d, Recip s) {
    return e4m3x4(div_bf16(a, s), div_bf16(b, s), div_bf16(c, s), div_bf16(d, s));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&h;
}

// div_bf16 against __fdiv_rn: block b takes the scale of amax = the BF16
// bits b (b = 0 .. 0x7f80: zero, the subnormals and normals, +inf: every
// amax block_scale can see from BF16 values), its threads every BF16 value
// x; counts[0] += pairs whose E4M3 codes differ, counts[1] += pairs whose
// FP32 quotients differ (the codes are what the quantisers keep).
__global__ void div_bf16_check_kernel(unsigned long long *counts) {
    float s = block_scale(__uint_as_float((uint32_t)blockIdx.x << 16));
    Recip d = recip(s);
    unsigned codes = 0, quots = 0;
    for (uint32_t b = threadIdx.x; b < 65536; b += blockDim.x) {
        float x = __uint_as_float(b << 16), q0 = __fdiv_rn(x, s), q1 = div_bf16(x, d);
        codes += e4m3(q0) != e4m3(q1);
        quots += __float_as_uint(q0) != __float_as_uint(q1) && !(q0 != q0 && q1 != q1);
    }
    if (codes) atomicAdd(&counts[0], (unsigned long long)codes);
    if (quots) atomicAdd(&counts[1], (unsigned long long)quots);
}

__global__ void encode_bits_kernel(uint8_t *q, uint32_t first, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= n) return;
    uint32_t u = first + (uint32_t)i, w = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) w |= (uint32_t)e4m3(__uint_as_float(u + j)) << (8 * j);
    *(uint32_t *)(q + i) = w;
}

// 8 E4M3 bytes times s, rounded to BF16, as 16 bytes
__device__ __forceinline__ uint4 dequant8(const uint8_t *q, float s) {
    uint2 raw = *(const uint2 *)q;
    const uint8_t *b = (const uint8_t *)&raw;
    uint4 out;
    uint32_t *o = (uint32_t *)&out;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        __nv_fp8_e4m3 lo, hi;
        lo.__x = b[2 * j];
        hi.__x = b[2 * j + 1];
        __nv_bfloat162 h = __floats2bfloat162_rn((float)lo * s, (float)hi * s);
        o[j] = *(uint32_t *)&h;
    }
    return out;
}
// 8 consecutive values of x as floats
__device__ __forceinline__ void load8(float (&v)[8], const bf16 *x) {
    uint4 raw = *(const uint4 *)x;
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&raw;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float2 f = __bfloat1622float2(h[j]);
        v[2 * j] = f.x;
        v[2 * j + 1] = f.y;
    }
}
__device__ __forceinline__ void load8(float (&v)[8], const float *x) {
    float4 a = *(const float4 *)x, b = *(const float4 *)(x + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// The 1 x 128 tile holding v (8 values per thread, 16 threads per tile):
// its amax by shuffles, then the values and (lane 0 of the 16) the scale.
// BF: the values are BF16 (div_bf16).
template <bool BF, bool FAKE = false>
__device__ __forceinline__ void quantize_tile8(uint8_t *q, float *scale, const float (&v)[8], bool live, size_t e0) {
    float amax = 0.0f;
    if (live) {
#pragma unroll
        for (int j = 0; j < 8; j++) amax = fmaxf(amax, fabsf(v[j]));
    }
#pragma unroll
    for (int d = 8; d > 0; d >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
    if (!live) return;
    float s = block_scale(amax);
    uint2 out;
    if (BF) {
        Recip d = recip(s);
        out = make_uint2(pack4(v[0], v[1], v[2], v[3], d), pack4(v[4], v[5], v[6], v[7], d));
    } else {
        out = make_uint2(pack4(v[0], v[1], v[2], v[3], s), pack4(v[4], v[5], v[6], v[7], s));
    }
    if (FAKE) { // q is BF16 [.., C]: the dequantised values (dequant8: the dequantiser's bits), no scale
        *(uint4 *)((bf16 *)q + e0) = dequant8((const uint8_t *)&out, s);
        return;
    }
    *(uint2 *)(q + e0) = out;
    if ((threadIdx.x & 15) == 0) scale[e0 / 128] = s;
}

// unpermute_bwd.cuh's hook: the 1 x 128 tiles of the dy rows it stores
struct Quant1x128Hook {
    uint8_t *q;
    float *s;
    __device__ __forceinline__ void operator()(const float (&v)[8], size_t e0) const {
        quantize_tile8<true>(q, s, v, true, e0);
    }
};

// 1 x 128 tiles: 16 threads per tile, 8 values each; the grid covers R * C / 8
// threads. Row r of the output reads row rows[r] of x (rows NULL: row r):
// the permute's gather, fused.
// FAKE: q is BF16 and takes the dequantised values instead (no scales):
// fp8_fake_quantize_rows, the bits of quantise then dequantise.
template <typename T, bool FAKE = false>
__global__ void quantize_1x128_kernel(uint8_t *q, float *scale, const T *x, const int *rows, int R, int C) {
    uint32_t t = blockIdx.x * blockDim.x + threadIdx.x; // R C / 8 < 2^32 (the launcher)
    size_t e0 = (size_t)t * 8;
    bool live = e0 < (size_t)R * C; // whole tiles are live or not (C % 128 == 0)
    float v[8];
    if (live) {
        uint32_t cw = (uint32_t)C / 8, r = t / cw, c = (t - r * cw) * 8; // 32-bit: no 64-bit division
        load8(v, x + (size_t)(rows ? rows[r] : (int)r) * C + c);
    }
    quantize_tile8<sizeof(T) == 2, FAKE>(q, scale, v, live, e0);
}

// SwiGLU then 1 x 128: o = silu(g) * u as swiglu_forward computes it
// (elementwise.cu), rounded to BF16 as it would store it, then quantised:
// the same bits as swiglu_forward followed by quantize_1x128.
__global__ void swiglu_quantize_kernel(uint8_t *q, float *scale, const bf16 *gate, const bf16 *up, size_t n) {
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x, e0 = t * 8;
    bool live = e0 < n;
    float v[8];
    if (live) {
        float g[8], u[8];
        load8(g, gate + e0);
        load8(u, up + e0);
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = __bfloat162float(__float2bfloat16_rn(g[j] / (1.f + expf(-g[j])) * u[j]));
    }
    quantize_tile8<true>(q, scale, v, live, e0);
}

// swiglu_backward (elementwise.cu: the same FP32 expressions, rounded to
// BF16 as it stores them) writing dgate and dup [R, F], and both quantised
// 1 x 128 side by side for the data-grad: row r of q [R, 2F] is
// [dgate_r | dup_r]. The grid covers R * F / 8 threads (F % 128 == 0: a
// 16-thread group holds one tile of each).
__global__ void swiglu_backward_quantize_kernel(bf16 *dgate, bf16 *dup, uint8_t *q, float *scale, const bf16 *dout,
                                                const bf16 *gate, const bf16 *up, size_t n, int F) {
    uint32_t t = blockIdx.x * blockDim.x + threadIdx.x; // n / 8 < 2^32 (the launcher)
    size_t e0 = (size_t)t * 8;
    bool live = e0 < n;
    float vg[8], vu[8];
    uint32_t fw = (uint32_t)F / 8, r = live ? t / fw : 0, c = live ? (t - r * fw) * 8 : 0;
    if (live) {
        float g[8], u[8], d[8];
        load8(g, gate + e0);
        load8(u, up + e0);
        load8(d, dout + e0);
        uint32_t og[4], ou[4];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float sig = 1.f / (1.f + expf(-g[j]));
            float dsilu = sig * (1.f + g[j] * (1.f - sig));
            vg[j] = __bfloat162float(__float2bfloat16_rn(d[j] * u[j] * dsilu));
            vu[j] = __bfloat162float(__float2bfloat16_rn(d[j] * g[j] * sig));
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            og[j] = pack_bf16x2(vg[2 * j], vg[2 * j + 1]);
            ou[j] = pack_bf16x2(vu[2 * j], vu[2 * j + 1]);
        }
        *(uint4 *)(dgate + e0) = make_uint4(og[0], og[1], og[2], og[3]);
        *(uint4 *)(dup + e0) = make_uint4(ou[0], ou[1], ou[2], ou[3]);
    }
    size_t q0 = (size_t)r * 2 * F + c;
    quantize_tile8<true>(q, scale, vg, live, q0);
    quantize_tile8<true>(q, scale, vu, live, q0 + F);
}

// ... stored at x
__device__ __forceinline__ void dequantize8(bf16 *x, const uint8_t *q, float s) { *(uint4 *)x = dequant8(q, s); }

// x = float(q) * scale, rounded to BF16; 8 values per thread.
__global__ void dequantize_1x128_kernel(bf16 *x, const uint8_t *q, const float *scale, size_t n) {
    size_t e0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (e0 >= n) return;
    dequantize8(x + e0, q + e0, scale[e0 / 128]);
}

// w [E, M, K] = float(q) * the scale of its 128 x 128 block; 8 values per thread.
__global__ void dequantize_128x128_kernel(bf16 *w, const uint8_t *q, const float *scale, int M, int K, size_t n) {
    size_t e0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (e0 >= n) return;
    size_t row = e0 / K; // over all experts: [E * M]
    int k = (int)(e0 % K), kb = K / 128;
    size_t e = row / M, i = row % M;
    dequantize8(w + e0, q + e0, scale[(e * (M / 128) + i / 128) * kb + k / 128]);
}

// 4 x 4 bytes: out[b] holds byte b of w[0..3], in order
__device__ __forceinline__ void transpose4x4(uint32_t (&out)[4], const uint32_t (&w)[4]) {
    uint32_t lo01 = __byte_perm(w[0], w[1], 0x5140), hi01 = __byte_perm(w[0], w[1], 0x7362);
    uint32_t lo23 = __byte_perm(w[2], w[3], 0x5140), hi23 = __byte_perm(w[2], w[3], 0x7362);
    out[0] = __byte_perm(lo01, lo23, 0x5410);
    out[1] = __byte_perm(lo01, lo23, 0x7632);
    out[2] = __byte_perm(hi01, hi23, 0x5410);
    out[3] = __byte_perm(hi01, hi23, 0x7632);
}

// 128 x 128 blocks of w [E, M, K]: one block of 256 threads each; thread
// (row group g = tid / 16, column chunk c = tid % 16) holds rows g + 16 i,
// columns 8c..8c+7 of the block in registers. With qt (the data-grads'
// transposed copy, fp8_transpose_128x128's layout) the block's bytes also
// go through shared memory (rows of 136 bytes, 34 words, so that the 8-byte
// writes and the column reads below meet no bank conflict) and come out
// transposed: thread (c = tid / 16, word column jq = tid % 16) reads rows
// 8c..8c+7 at byte columns 4 jw .. 4 jw + 3 (jw = jq, jq + 16), transposes
// the 8 x 4 bytes in registers and writes 8 bytes to each of those 4 rows
// of the transposed block.
// ADAM (adamw_update_fp8): the block is first updated by AdamW (adamw.cuh:
// w the FP32 main weights, their grads ga and moments ma, va at the same
// offsets, written back) and the updated values quantised: the bits of
// adamw_update followed by this kernel, in one pass over memory.
constexpr int Q_LD = 136;
__device__ __forceinline__ void store8(float *x, const float (&v)[8]) {
    *(float4 *)x = make_float4(v[0], v[1], v[2], v[3]);
    *(float4 *)(x + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
template <bool ADAM = false>
__global__ void __launch_bounds__(256) quantize_128x128_kernel(uint8_t *q, float *scale, uint8_t *qt, float *st,
                                                                 const float *w, int ldt, int col0, int M, int K,
                                                                 const float *ga = nullptr, float *ma = nullptr,
                                                                 float *va = nullptr, AdamArgs adam = AdamArgs{}) {
    __shared__ float s_max[8];
    __shared__ __align__(16) uint8_t s_q[128 * Q_LD];
    int mb = M / 128, kb = K / 128;
    int e = blockIdx.y, bi = blockIdx.x / kb, bj = blockIdx.x % kb;
    int g = threadIdx.x >> 4, c = threadIdx.x & 15;
    size_t base = ((size_t)e * M + (size_t)bi * 128) * K + (size_t)bj * 128 + 8 * c;
    float v[8][8];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        size_t at = base + (size_t)(g + 16 * i) * K;
        load8(v[i], w + at);
        if (ADAM) {
            float gf[8], mf[8], vf[8];
            load8(gf, ga + at);
            load8(mf, ma + at);
            load8(vf, va + at);
#pragma unroll
            for (int j = 0; j < 8; j++) adamw_apply(v[i][j], mf[j], vf[j], gf[j], adam);
            store8(const_cast<float *>(w) + at, v[i]);
            store8(ma + at, mf);
            store8(va + at, vf);
        }
#pragma unroll
        for (int j = 0; j < 8; j++) amax = fmaxf(amax, fabsf(v[i][j]));
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
    if ((threadIdx.x & 31) == 0) s_max[threadIdx.x >> 5] = amax;
    __syncthreads();
    amax = s_max[0];
#pragma unroll
    for (int k = 1; k < 8; k++) amax = fmaxf(amax, s_max[k]);
    float s = block_scale(amax);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        uint2 out = make_uint2(pack4(v[i][0], v[i][1], v[i][2], v[i][3], s), pack4(v[i][4], v[i][5], v[i][6], v[i][7], s));
        *(uint2 *)(q + base + (size_t)(g + 16 * i) * K) = out;
        if (qt) *(uint2 *)(s_q + (g + 16 * i) * Q_LD + 8 * c) = out;
    }
    if (threadIdx.x == 0) scale[((size_t)e * mb + bi) * kb + bj] = s;
    if (!qt) return;
    if (threadIdx.x == 0) st[((size_t)e * kb + bj) * (ldt / 128) + col0 / 128 + bi] = s;
    __syncthreads();
    int tc = threadIdx.x >> 4, jq = threadIdx.x & 15;
    // transposed block: rows bj * 128 + j of expert e, columns col0 + bi * 128 + 8 tc .. + 7
    uint8_t *qte = qt + ((size_t)e * K + (size_t)bj * 128) * ldt + col0 + (size_t)bi * 128 + 8 * tc;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int jw = jq + 16 * h;
        uint32_t lo[4], hi[4], tlo[4], thi[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            lo[k] = *(const uint32_t *)(s_q + (8 * tc + k) * Q_LD + 4 * jw);
            hi[k] = *(const uint32_t *)(s_q + (8 * tc + 4 + k) * Q_LD + 4 * jw);
        }
        transpose4x4(tlo, lo);
        transpose4x4(thi, hi);
#pragma unroll
        for (int b = 0; b < 4; b++) *(uint2 *)(qte + (size_t)(4 * jw + b) * ldt) = make_uint2(tlo[b], thi[b]);
    }
}

// MXFP8: 4 threads per block of 32, 8 values each.
__global__ void quantize_mx_kernel(uint8_t *q, uint8_t *scale, const bf16 *x, size_t n) {
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x, e0 = t * 8;
    bool live = e0 < n;
    float v[8];
    float amax = 0.0f;
    int nan = 0;
    if (live) {
        load8(v, x + e0);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            amax = fmaxf(amax, fabsf(v[j]));
            nan |= isnan(v[j]);
        }
    }
#pragma unroll
    for (int d = 2; d > 0; d >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
        nan |= __shfl_xor_sync(0xffffffffu, nan, d);
    }
    if (!live) return;
    int ex = (int)((__float_as_uint(amax) >> 23) & 0xff) - 127 - 8; // fp8_mx_scale_byte
    ex = ex < -127 ? -127 : ex > 127 ? 127 : ex;
    int sb = ex + 127, ib = 254 - sb; // ib: the E8M0 byte of 2^-ex
    float inv = ib == 0 ? __uint_as_float(0x00400000u) : __uint_as_float((uint32_t)ib << 23);
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        lo |= (uint32_t)e4m3(__fmul_rn(v[j], inv)) << (8 * j);
        hi |= (uint32_t)e4m3(__fmul_rn(v[4 + j], inv)) << (8 * j);
    }
    *(uint2 *)(q + e0) = make_uint2(lo, hi);
    if ((threadIdx.x & 3) == 0) scale[e0 / 32] = nan ? FP8_E8M0_NAN : (uint8_t)sb;
}

// fp8.wgrad: fp8's operands (fp8_fake_quantize_128x1 of fp8.h): x [R, C]
// BF16 quantised and dequantised in place per 128 x 1 tile along the rows
// of each expert segment, the result rounded to BF16. A block of 512
// threads takes one block tile of 128 rows (from the segment's first row
// in steps of 128, fewer at its end) by 256 columns: lane l of warp w holds
// columns 8 l .. 8 l + 7 of rows w, w + 16, .., w + 112 (16 bytes a row),
// the column amax meets across the 16 warps in shared memory, and the
// second pass reads the tile again (from L1 or L2: 64 KB a block; keeping
// it in registers spilled at 512 threads). Block
// tiles come from the device offsets (grouped_sched.cuh), the grid strides
// over them.
// amax[j] = max(amax[j], |value j|) over the 8 BF16 of a 16-byte word (NaN ignored)
__device__ __forceinline__ void amax8_bf16(float (&amax)[8], const uint4 &w) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&w;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float2 f = __bfloat1622float2(h[j]);
        amax[2 * j] = fmaxf(amax[2 * j], fabsf(f.x));
        amax[2 * j + 1] = fmaxf(amax[2 * j + 1], fabsf(f.y));
    }
}
constexpr int FQ_ROWS = 128, FQ_COLS = 256, FQ_THREADS = 512, FQ_WARPS = FQ_THREADS / 32, FQ_PER = FQ_ROWS / FQ_WARPS;
__global__ void __launch_bounds__(FQ_THREADS, 1) fake_quantize_128x1_kernel(bf16 *x, const int *offsets, int E, int C) {
    extern __shared__ int fq_smem[];
    float *s_amax = (float *)fq_smem; // [FQ_WARPS][FQ_COLS]
    int *s_off = fq_smem + FQ_WARPS * FQ_COLS, *s_tile = s_off + E + 1;
    grouped_load_offsets<FQ_THREADS>(offsets, E, s_off);
    int col_tiles = (C + FQ_COLS - 1) / FQ_COLS;
    int total = grouped_tile_prefix<FQ_ROWS>(s_off, E, col_tiles, s_tile);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
        int e = grouped_tile_expert(t, s_tile, E), local = t - s_tile[e];
        int r0 = s_off[e] + local / col_tiles * FQ_ROWS, r1 = min(r0 + FQ_ROWS, s_off[e + 1]);
        int c = local % col_tiles * FQ_COLS + 8 * lane;
        bool live_c = c < C;
        float amax[8];
#pragma unroll
        for (int j = 0; j < 8; j++) amax[j] = 0.0f;
#pragma unroll
        for (int i = 0; i < FQ_PER; i++) {
            int r = r0 + warp + FQ_WARPS * i;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (live_c && r < r1) v = *(const uint4 *)(x + (size_t)r * C + c);
            amax8_bf16(amax, v);
        }
#pragma unroll
        for (int j = 0; j < 8; j++) s_amax[warp * FQ_COLS + 8 * lane + j] = amax[j];
        __syncthreads();
        float s[8];
        Recip d[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float a = s_amax[8 * lane + j];
#pragma unroll
            for (int w = 1; w < FQ_WARPS; w++) a = fmaxf(a, s_amax[w * FQ_COLS + 8 * lane + j]);
            s[j] = block_scale(a);
            d[j] = recip(s[j]);
        }
        __syncthreads(); // s_amax is free for the next tile
        if (!live_c) continue;
#pragma unroll
        for (int i = 0; i < FQ_PER; i++) {
            int r = r0 + warp + FQ_WARPS * i;
            if (r >= r1) continue;
            uint4 v = *(const uint4 *)(x + (size_t)r * C + c); // again: from L1 or L2
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
            uint32_t o[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float2 f = __bfloat1622float2(h[j]);
                __nv_fp8_e4m3 lo, hi;
                lo.__x = e4m3(div_bf16(f.x, d[2 * j]));
                hi.__x = e4m3(div_bf16(f.y, d[2 * j + 1]));
                o[j] = pack_bf16x2(__fmul_rn((float)lo, s[2 * j]), __fmul_rn((float)hi, s[2 * j + 1]));
            }
            *(uint4 *)(x + (size_t)r * C + c) = make_uint4(o[0], o[1], o[2], o[3]);
        }
    }
}

// ---- the grouped GEMM forward ----------------------------------------------------

constexpr int F8_BM = 128, F8_BN = 256, F8_BK = 128; // BK in elements = bytes
constexpr int F8_STAGES = 4;
constexpr int F8_A_BYTES = F8_BM * F8_BK;            // 16 KB
constexpr int F8_B_BYTES = F8_BN * F8_BK;            // 32 KB
constexpr int F8_STAGE_BYTES = F8_A_BYTES + F8_B_BYTES;
constexpr int F8_TILE_BYTES = F8_STAGES * F8_STAGE_BYTES;
constexpr int F8_THREADS = 384;
static_assert(F8_A_BYTES % 1024 == 0 && F8_STAGE_BYTES % 1024 == 0, "swizzle atoms need 1024-byte alignment");

// acc += part * (s_lo for the accumulator's first row, s_hi for row + 8)
__device__ __forceinline__ void promote(float (&acc)[64], const float (&part)[64], float s_lo, float s_hi) {
#pragma unroll
    for (int j = 0; j < 16; j++) {
        acc[4 * j] = fmaf(part[4 * j], s_lo, acc[4 * j]);
        acc[4 * j + 1] = fmaf(part[4 * j + 1], s_lo, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(part[4 * j + 2], s_hi, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(part[4 * j + 3], s_hi, acc[4 * j + 3]);
    }
}

// One stage of a 4 x 4 transpose of 32-bit words among the 4 lanes of a
// quad: lane p swaps with lane p ^ D the words i (i & D == 0) it holds for
// the pair (i, i + D) that the other lane needs.
template <int D> __device__ __forceinline__ void quad_swap(uint32_t (&w)[4], int p) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (i & D) continue;
        bool up = p & D;
        uint32_t give = up ? w[i] : w[i + D];
        uint32_t got = __shfl_xor_sync(0xffffffffu, give, D);
        if (up) w[i] = got;
        else w[i + D] = got;
    }
}
// store_acc_bf16<128>'s result with 16-byte stores: for each row and group
// m of 4 column octets, the quad transposes its words so that lane p holds
// columns 8 (4 m + p) .. + 7 (lane k's pair is word k). All lanes of the
// warp take part in the shuffles; rows >= rows are not stored.
__device__ __forceinline__ void store_half_vec(const float (&acc)[64], bf16 *o, int N, int r, int col0, int rows) {
    int p = threadIdx.x & 3;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        int row = r + 8 * hr;
#pragma unroll
        for (int m = 0; m < 4; m++) {
            uint32_t w[4];
#pragma unroll
            for (int i = 0; i < 4; i++) w[i] = pack_bf16x2(acc[4 * (4 * m + i) + 2 * hr], acc[4 * (4 * m + i) + 2 * hr + 1]);
            quad_swap<2>(w, p);
            quad_swap<1>(w, p);
            if (row < rows) *(uint4 *)(o + (size_t)row * N + col0 + 8 * (4 * m + p)) = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
}

struct F8Tile {
    int e, m0, n0, r0, rows;
};
__device__ __forceinline__ F8Tile f8_locate(int t, const int *s_off, const int *s_tile, int E, int col_tiles) {
    int lo = grouped_tile_expert(t, s_tile, E);
    F8Tile tl;
    int local = t - s_tile[lo];
    tl.e = lo;
    tl.m0 = local / col_tiles * F8_BM;
    tl.n0 = local % col_tiles * F8_BN;
    tl.r0 = s_off[lo];
    tl.rows = s_off[lo + 1] - tl.r0;
    return tl;
}

struct F8Maps {
    CUtensorMap a, b;
};

// The stage ring of the warp-specialised FP8 kernels: S full barriers (one
// arrival: the producer's expect_tx) and S empty ones (`arrivals`: the 256
// consumer threads, or one per consumer warp); the slot / phase step after
// each stage is ring_next.
__device__ __forceinline__ void f8_ring_init(uint32_t full0, uint32_t empty0, int S, int arrivals = 256) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            mbar_init(full0 + 8 * s, 1);
            mbar_init(empty0 + 8 * s, arrivals);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
}
// part = A B^T over one K = 128 stage: 4 wgmma m64n128k32 e4m3, waited for
__device__ __forceinline__ void f8_mma_k128(float (&part)[64], uint64_t da, uint64_t db) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < F8_BK / 32; kk++) wgmma_fp8_n128(part, da + 2 * kk, db + 2 * kk, kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
}

// out[R, N] = A[R, K] B_e^T with block scales sa [R, K/128], sb [E, N/128, K/128].
// PREFETCH: each stage's four scales are loaded one stage ahead (else at
// the stage's start, under its barrier wait only). VEC_STORE: the epilogue
// stores 16 bytes per thread (store_half_vec), else 4 (store_acc_bf16).
// STAGGER: consumer warpgroup 2 takes the column halves in the order 1, 0,
// so that the two warpgroups' first wgmma of a stage read different B.
// DIAG (MOECORE_FP8_GEMM_DIAG, diagnostics for bench_fp8 diag only: WRONG
// results): 1 leaves out the promotion's arithmetic (the waits stay), 2
// accumulates all of K in the tensor cores (no partials, no promotion, one
// wait a stage after both halves' wgmma), to bound what the promotion and
// its waits cost.
template <bool PREFETCH, bool VEC_STORE, bool STAGGER = false, int DIAG = 0>
__global__ void __launch_bounds__(F8_THREADS, 1)
fp8_grouped_fwd_kernel(bf16 *out, const __grid_constant__ F8Maps maps, const float *sa, const float *sb,
                       const int *offsets, int E, int N, int K) {
    constexpr int S = F8_STAGES;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    uint32_t tiles = (raw + 1023) & ~1023u;
    uint32_t full0 = tiles + F8_TILE_BYTES, empty0 = full0 + 8 * S;
    int *s_off = (int *)(smem_raw + (tiles - raw) + F8_TILE_BYTES + 16 * S);
    int *s_tile = s_off + E + 1;
    int col_tiles = N / F8_BN, kb = K / F8_BK;
    f8_ring_init(full0, empty0, S);
    grouped_load_offsets<F8_THREADS>(offsets, E, s_off);
    int total = grouped_tile_prefix<F8_BM>(s_off, E, col_tiles, s_tile);
    int wg = threadIdx.x >> 7;

    if (wg == 0) { // producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x != 0) return;
        int slot = 0;
        uint32_t phase = 0;
        for (int t = blockIdx.x; t < total; t += gridDim.x) {
            F8Tile tl = f8_locate(t, s_off, s_tile, E, col_tiles);
            for (int kt = 0; kt < kb; kt++) {
                mbar_wait(empty0 + 8 * slot, phase ^ 1);
                uint32_t st = tiles + slot * F8_STAGE_BYTES, fb = full0 + 8 * slot;
                mbar_expect_tx(fb, F8_STAGE_BYTES);
                tma_load_2d(st, &maps.a, kt * F8_BK, tl.r0 + tl.m0, fb);
                tma_load_2d(st + F8_A_BYTES, &maps.b, kt * F8_BK, tl.e * N + tl.n0, fb);
                ring_next(slot, phase, S);
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    int slot = 0;
    uint32_t phase = 0;
    float acc0[64], acc1[64], part[64];
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
        F8Tile tl = f8_locate(t, s_off, s_tile, E, col_tiles);
        int r = tl.m0 + cw * 64 + warp * 16 + (lane >> 2); // this thread's rows r and r + 8 of the segment
        bool lo_ok = r < tl.rows, hi_ok = r + 8 < tl.rows;
        const float *sa_lo = sa + (size_t)(tl.r0 + r) * kb, *sa_hi = sa_lo + (size_t)8 * kb;
        const float *sb_t = sb + ((size_t)tl.e * (N / 128) + tl.n0 / 128) * kb;
#pragma unroll
        for (int i = 0; i < 64; i++) acc0[i] = acc1[i] = 0.0f;
        // this stage's scales (a: rows r, r + 8; b: the two column halves)
        float n_lo = 0.0f, n_hi = 0.0f, n_b0 = 0.0f, n_b1 = 0.0f;
        if (PREFETCH) {
            n_lo = lo_ok ? sa_lo[0] : 0.0f, n_hi = hi_ok ? sa_hi[0] : 0.0f;
            n_b0 = sb_t[0], n_b1 = sb_t[kb];
        }
        for (int kt = 0; kt < kb; kt++) {
            float a_lo, a_hi, b0, b1;
            if (PREFETCH) {
                a_lo = n_lo, a_hi = n_hi, b0 = n_b0, b1 = n_b1;
                if (kt + 1 < kb) {
                    n_lo = lo_ok ? sa_lo[kt + 1] : 0.0f, n_hi = hi_ok ? sa_hi[kt + 1] : 0.0f;
                    n_b0 = sb_t[kt + 1], n_b1 = sb_t[kb + kt + 1];
                }
            } else {
                a_lo = lo_ok ? sa_lo[kt] : 0.0f, a_hi = hi_ok ? sa_hi[kt] : 0.0f;
                b0 = sb_t[kt], b1 = sb_t[kb + kt];
            }
            mbar_wait(full0 + 8 * slot, phase);
            uint32_t st = tiles + slot * F8_STAGE_BYTES;
            uint64_t da = smem_desc(st + cw * 64 * 128);
            if constexpr (DIAG == 2) { // both halves' wgmma straight into the accumulators, one wait
                wgmma_fence();
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    uint64_t db = smem_desc(st + F8_A_BYTES + h * 128 * 128);
#pragma unroll
                    for (int kk = 0; kk < F8_BK / 32; kk++)
                        wgmma_fp8_n128(h ? acc1 : acc0, da + 2 * kk, db + 2 * kk, kt > 0 || kk > 0);
                }
                wgmma_commit();
                wgmma_wait<0>();
                mbar_arrive(empty0 + 8 * slot);
            } else {
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    int h = STAGGER ? hh ^ cw : hh;
                    uint64_t db = smem_desc(st + F8_A_BYTES + h * 128 * 128);
                    f8_mma_k128(part, da, db);
                    if (hh == 1) mbar_arrive(empty0 + 8 * slot); // both halves read: release the stage
                    float bs = h ? b1 : b0;
                    if (DIAG == 1) continue;
                    if (h == 0) promote(acc0, part, a_lo * bs, a_hi * bs);
                    else promote(acc1, part, a_lo * bs, a_hi * bs);
                }
            }
            ring_next(slot, phase, S);
        }
        bf16 *o = out + (size_t)tl.r0 * N;
        if (VEC_STORE) {
            store_half_vec(acc0, o, N, r, tl.n0, tl.rows);
            store_half_vec(acc1, o, N, r, tl.n0 + 128, tl.rows);
        } else {
            int c0 = tl.n0 + 2 * (lane & 3);
            store_acc_bf16<128>(acc0, o, N, r, c0, tl.rows);
            store_acc_bf16<128>(acc1, o, N, r, c0 + 128, tl.rows);
        }
    }
}

// 128 x 128 tiles of the weight-grad's variant 2 (below): a 16 KB A box and a
// 16 KB B box a stage.
constexpr int F8P_BN = 128;
constexpr int F8P_A_BYTES = F8_BM * F8_BK, F8P_B_BYTES = F8P_BN * F8_BK; // 16 KB each
constexpr int F8P_STAGE_BYTES = F8P_A_BYTES + F8P_B_BYTES;

// ---- fp8.wgrad: fp8, the speed path ------------------------------------------------
// The weight-grad dw[e] = dout_e^T inp_e has the tokens as K, and FP8 wgmma
// reads both operands K-major, so each operand is quantised into its
// transpose: qt [C, ldk] E4M3, expert e's tokens at columns P_e .. P_e +
// n_e of every row, P_e = 128 * (the 128-blocks of the experts before it),
// the rest of its last block zero; st [ldk / 128, C] FP32, row P_e / 128 +
// kb the scales of block kb of expert e (its rows offsets[e] + 128 kb ..),
// one per column: fp8_fake_quantize_128x1's tiles, codes and scales.

// The transposing quantiser: a block of 256 threads takes 128 tokens x 128
// columns; thread (g = tid / 16, cc = tid % 16) loads rows 8 g .. 8 g + 7 at
// columns 8 cc .. 8 cc + 7 (16 bytes a row), the column amax meets by a
// shuffle (two g per warp) and across the 8 warps in shared memory, and
// each column's 8 codes go as one 8-byte word into the transposed tile in
// shared memory (row = column, 128 token bytes; the 8-byte chunk g at
// position g ^ 2 ((row / 8) % 8), so that a warp's stores meet no bank
// conflict), which goes out as 64 bytes per thread.
// FP8_IN (fp8_requantize_tokens_t): x is E4M3 codes [R, C] with xs [R, C /
// 128] their 1 x 128 scales, loaded 8 bytes a row and dequantised to BF16 in
// registers (dequant8, dequantize_1x128's bits), so the tiles are those of
// the BF16 values fp8_dequantize_rows would have written, at a third of
// the bytes.
// value j (0..7) of 8 BF16 in a 16-byte word, as a float
__device__ __forceinline__ float bf16_at(const uint4 &w, int j) {
    uint32_t u = j < 2 ? w.x : j < 4 ? w.y : j < 6 ? w.z : w.w;
    return __uint_as_float(j & 1 ? u & 0xffff0000u : u << 16);
}
constexpr int QT_THREADS = 256;
template <bool FP8_IN>
__global__ void __launch_bounds__(QT_THREADS, 4) quantize_tokens_t_kernel(uint8_t *qt, float *st, const void *x,
                                                                       const float *xs, const int *offsets, int E,
                                                                       int C, int ldk) {
    __shared__ __align__(16) uint8_t s_q[128 * 128];
    __shared__ float s_amax[QT_THREADS / 32][128];
    extern __shared__ int qt_smem[];
    int *s_off = qt_smem, *s_tile = s_off + E + 1;
    grouped_load_offsets<QT_THREADS>(offsets, E, s_off);
    int col_tiles = C / 128;
    int total = grouped_tile_prefix<128>(s_off, E, col_tiles, s_tile);
    int g = threadIdx.x >> 4, cc = threadIdx.x & 15, warp = threadIdx.x >> 5;
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
        int e = grouped_tile_expert(t, s_tile, E), local = t - s_tile[e];
        int kb = s_tile[e] / col_tiles + local / col_tiles; // the block's row of st, its 128 columns of qt
        int r0 = s_off[e] + local / col_tiles * 128, r1 = min(r0 + 128, s_off[e + 1]);
        int c0 = local % col_tiles * 128;
        uint4 raw[8]; // the rows as loaded (BF16: half the registers of floats, for more blocks per SM)
        float amax[8];
#pragma unroll
        for (int j = 0; j < 8; j++) amax[j] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int r = r0 + 8 * g + i;
            raw[i] = make_uint4(0, 0, 0, 0); // rows past the segment: zeros, which quantise to 0
            if (r < r1 && FP8_IN)
                raw[i] = dequant8((const uint8_t *)x + (size_t)r * C + c0 + 8 * cc, xs[(size_t)r * (C / 128) + c0 / 128]);
            else if (r < r1) raw[i] = *(const uint4 *)((const bf16 *)x + (size_t)r * C + c0 + 8 * cc);
        }
#pragma unroll
        for (int i = 0; i < 8; i++) amax8_bf16(amax, raw[i]);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            amax[j] = fmaxf(amax[j], __shfl_xor_sync(0xffffffffu, amax[j], 16));
            if ((threadIdx.x & 16) == 0) s_amax[warp][8 * cc + j] = amax[j];
        }
        __syncthreads();
        Recip d[8]; // the column scales and their reciprocals
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float a = s_amax[0][8 * cc + j];
#pragma unroll
            for (int w = 1; w < QT_THREADS / 32; w++) a = fmaxf(a, s_amax[w][8 * cc + j]);
            d[j] = recip(block_scale(a));
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int row = 8 * cc + j; // the column, a row of the transposed tile
            uint32_t lo = 0, hi = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                lo |= (uint32_t)e4m3(div_bf16(bf16_at(raw[i], j), d[j])) << (8 * i);
                hi |= (uint32_t)e4m3(div_bf16(bf16_at(raw[4 + i], j), d[j])) << (8 * i);
            }
            *(uint2 *)(s_q + row * 128 + 8 * (g ^ (2 * (cc & 7)))) = make_uint2(lo, hi);
        }
        if (g == 0) {
            float4 *o = (float4 *)(st + (size_t)kb * C + c0 + 8 * cc);
            o[0] = make_float4(d[0].s, d[1].s, d[2].s, d[3].s);
            o[1] = make_float4(d[4].s, d[5].s, d[6].s, d[7].s);
        }
        __syncthreads();
        int row = threadIdx.x >> 1, half = threadIdx.x & 1, key = (row >> 3) & 7;
        uint8_t *dst = qt + (size_t)(c0 + row) * ldk + (size_t)kb * 128 + 64 * half;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int k = 4 * half + i; // logical 16-byte chunk: token bytes 16 k .. 16 k + 15
            *(uint4 *)(dst + 16 * i) = *(const uint4 *)(s_q + row * 128 + 16 * (k ^ key));
        }
        __syncthreads(); // s_q and s_amax are free for the next tile
    }
}

// The FP8 grouped weight-grad: dw[e] [M, N] (=|+=) sum over expert e's
// token blocks kb of (A_kb B_kb^T) * sa[kb][m] * sb[kb][n], A = qa [M, ldk]
// (dout^T), B = qb [N, ldk] (inp^T), from quantize_tokens_t. The forward
// kernel's layout (warpgroup 0 loads, 1 and 2 each own 64 rows of a 128 x
// 256 tile; a stage is one token block: a 128 x 128 A box, a 256 x 128 B box,
// and by 1D bulk copies the block's 128 row and 256 column scales), but the
// scales vary along both output axes, so each half's partial is promoted
// elementwise: acc += part * (sa[row] * sb[col]), the column scales read
// from the stage in shared memory. Tiles: experts x (M / 128) x (N / 256),
// each over its expert's blocks (none for an empty expert: zeros, or dw
// left as it is when accumulating). Each element is one thread's, summed in
// a fixed order and written once (a store, or one add into dw): deterministic.
constexpr int W8_SCALE_BYTES = (F8_BM + F8_BN) * 4;
__device__ __forceinline__ void promote_cols(float (&acc)[64], const float (&part)[64], float a_lo, float a_hi,
                                             const float *bcol) {
#pragma unroll
    for (int j = 0; j < 16; j++) {
        float2 b = *(const float2 *)(bcol + 8 * j);
        acc[4 * j] = fmaf(part[4 * j], a_lo * b.x, acc[4 * j]);
        acc[4 * j + 1] = fmaf(part[4 * j + 1], a_lo * b.y, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(part[4 * j + 2], a_hi * b.x, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(part[4 * j + 3], a_hi * b.y, acc[4 * j + 3]);
    }
}
// rows r, r + 8, columns c .. c + 1 + 8 j of acc into o [.., N] (=|+=):
// the old values all loaded first, so that their latencies overlap
__device__ __forceinline__ void store_acc_f32(const float (&acc)[64], float *o, int N, int r, int c, int accumulate) {
    float2 old[32];
#pragma unroll
    for (int i = 0; i < 32; i++) {
        old[i] = make_float2(0.0f, 0.0f);
        if (accumulate) old[i] = *(const float2 *)(o + (size_t)(r + 8 * (i & 1)) * N + c + 8 * (i >> 1));
    }
#pragma unroll
    for (int i = 0; i < 32; i++) {
        int j = i >> 1, hr = i & 1;
        *(float2 *)(o + (size_t)(r + 8 * hr) * N + c + 8 * j) =
            make_float2(acc[4 * j + 2 * hr] + old[i].x, acc[4 * j + 2 * hr + 1] + old[i].y);
    }
}
// A consumer warpgroup's 64 x 128 half of the tile into its staging buffer
// for TMA: 4 boxes of 64 rows x 32 columns (8 KB each, 128-byte rows,
// 16-byte chunks swizzled by row % 8 as the tensor map's 128-byte swizzle
// reads them). rl: the thread's row in the warpgroup's 64, q = lane % 4.
__device__ __forceinline__ void stage_acc_f32(const float (&acc)[64], unsigned char *stg, int rl, int q) {
#pragma unroll
    for (int j = 0; j < 16; j++) {
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            int row = rl + 8 * hr, chunk = 2 * (j & 3) + (q >> 1);
            *(float2 *)(stg + (j >> 2) * 8192 + row * 128 + ((chunk ^ (row & 7)) << 4) + 8 * (q & 1)) =
                make_float2(acc[4 * j + 2 * hr], acc[4 * j + 2 * hr + 1]);
        }
    }
}

struct W8Maps {
    CUtensorMap a, b, dw; // dw: FP32 [E * M, N], boxes of 32 x 64
};
template <bool TMA_EPI> struct W8Smem {
    static constexpr int STAGES = TMA_EPI ? 3 : 4;
    static constexpr int TILES = STAGES * F8_STAGE_BYTES;
    static constexpr int STAGING = TMA_EPI ? 2 * 64 * 128 * 4 : 0; // one 64 x 128 FP32 half per consumer warpgroup
    static constexpr int FIXED = 1024 + TILES + STAGING + STAGES * (W8_SCALE_BYTES + 16);
    static int bytes(int E) { return FIXED + 2 * (E + 1) * (int)sizeof(int); }
};

// A consumer warpgroup's 64 x 128 FP32 block (rows row0.., columns col0.. of
// dw as the map sees it, [E * M, N]) out through its staging buffer: once
// the copy engine has read the staging's last contents, the warpgroup
// writes it (stage_acc_f32), and its first thread (the issuer) hands it to
// the copy engine as four 64 x 32 boxes, stored or reduce-added into dw.
__device__ __forceinline__ void w8_tma_store(const float (&acc)[64], const W8Maps *maps, unsigned char *stg,
                                             uint32_t stg_s, int rw, int lane, int cw, int col0, int row0,
                                             int accumulate) {
    bool issuer = (threadIdx.x & 127) == 0;
    if (issuer) bulk_wait_read<0>();
    named_barrier(1 + cw, 128);
    stage_acc_f32(acc, stg, rw, lane & 3);
    fence_proxy_async();
    named_barrier(1 + cw, 128);
    if (issuer) {
#pragma unroll
        for (int b = 0; b < 4; b++) {
            if (accumulate) tma_reduce_add_2d(&maps->dw, stg_s + b * 8192, col0 + 32 * b, row0);
            else tma_store_2d(&maps->dw, stg_s + b * 8192, col0 + 32 * b, row0);
        }
        bulk_commit();
    }
}

// The weight-grad kernels' producer (one thread): for each of this block's
// tiles (experts x M / 128 x N / BN), each token block of its expert into
// the S-stage ring: a 128 x 128 A box, a BN x 128 B box (BN * 128 bytes
// after A's 16 KB), and by 1D bulk copies the block's 128 row and BN column
// scales (4 (128 + BN) bytes a stage at `scales`).
template <int BN, int S>
__device__ __forceinline__ void w8_produce(const W8Maps *maps, const float *sa, const float *sb, const int *s_blk,
                                           int M, int N, int per_e, int n_tiles, int total, uint32_t tiles,
                                           uint32_t scales, uint32_t full0, uint32_t empty0) {
    constexpr uint32_t A_BYTES = F8_BM * F8_BK, STAGE_BYTES = A_BYTES + BN * F8_BK, SCALE_BYTES = (F8_BM + BN) * 4;
    int slot = 0;
    uint32_t phase = 0;
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
        int e = t / per_e, loc = t % per_e, m0 = loc / n_tiles * F8_BM, n0 = loc % n_tiles * BN;
        for (int kb = s_blk[e]; kb < s_blk[e + 1]; kb++) {
            mbar_wait(empty0 + 8 * slot, phase ^ 1);
            uint32_t st = tiles + slot * STAGE_BYTES, fb = full0 + 8 * slot, sc = scales + slot * SCALE_BYTES;
            mbar_expect_tx(fb, STAGE_BYTES + SCALE_BYTES);
            tma_load_2d(st, &maps->a, kb * F8_BK, m0, fb);
            tma_load_2d(st + A_BYTES, &maps->b, kb * F8_BK, n0, fb);
            bulk_load(sc, sa + (size_t)kb * M + m0, F8_BM * 4, fb);
            bulk_load(sc + F8_BM * 4, sb + (size_t)kb * N + n0, BN * 4, fb);
            ring_next(slot, phase, S);
        }
    }
}

// TMA_EPI: the epilogue stages each half of a warpgroup's accumulators in
// shared memory and one thread hands it to the copy engine (a TMA store,
// or a TMA reduce-add into dw when accumulating), so that the warpgroup
// goes on to its next tile while the copy engine writes (3 stages, to make
// room for the staging); else each thread stores (or loads, adds and
// stores) its accumulators itself (4 stages).
template <bool TMA_EPI>
__global__ void __launch_bounds__(F8_THREADS, 1)
fp8_grouped_wgrad_kernel(float *dw, const __grid_constant__ W8Maps maps, const float *sa, const float *sb,
                         const int *offsets, int E, int M, int N, int accumulate) {
    typedef W8Smem<TMA_EPI> L;
    constexpr int S = L::STAGES;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    uint32_t tiles = (raw + 1023) & ~1023u, staging = tiles + L::TILES, scales = staging + L::STAGING;
    uint32_t full0 = scales + S * W8_SCALE_BYTES, empty0 = full0 + 8 * S;
    const float *s_sc = (const float *)(smem_raw + (scales - raw));
    int *s_off = (int *)(smem_raw + (empty0 + 8 * S - raw));
    int *s_blk = s_off + E + 1;
    f8_ring_init(full0, empty0, S);
    grouped_load_offsets<F8_THREADS>(offsets, E, s_off);
    grouped_tile_prefix<F8_BK>(s_off, E, 1, s_blk); // s_blk[e]: expert e's first token block
    int n_tiles = N / F8_BN, per_e = M / F8_BM * n_tiles, total = E * per_e;
    int wg = threadIdx.x >> 7;

    if (wg == 0) { // producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x != 0) return;
        w8_produce<F8_BN, S>(&maps, sa, sb, s_blk, M, N, per_e, n_tiles, total, tiles, scales, full0, empty0);
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    int rw = warp * 16 + (lane >> 2), rl = cw * 64 + rw, cl = 2 * (lane & 3); // this thread's first row, column
    bool issuer = (threadIdx.x & 127) == 0; // the warpgroup's thread that hands its staging to the copy engine
    unsigned char *stg = smem_raw + (staging - raw) + cw * (64 * 128 * 4);
    uint32_t stg_s = staging + cw * (64 * 128 * 4);
    int slot = 0;
    uint32_t phase = 0;
    float acc0[64], acc1[64], part[64];
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
        int e = t / per_e, loc = t % per_e, m0 = loc / n_tiles * F8_BM, n0 = loc % n_tiles * F8_BN;
        int kb0 = s_blk[e], kb1 = s_blk[e + 1];
        if (kb0 == kb1 && accumulate) continue; // an empty expert adds nothing
#pragma unroll
        for (int i = 0; i < 64; i++) acc0[i] = acc1[i] = 0.0f;
        for (int kb = kb0; kb < kb1; kb++) {
            mbar_wait(full0 + 8 * slot, phase);
            uint32_t st = tiles + slot * F8_STAGE_BYTES;
            const float *sc = s_sc + slot * (W8_SCALE_BYTES / 4);
            float a_lo = sc[rl], a_hi = sc[rl + 8];
            uint64_t da = smem_desc(st + cw * 64 * 128);
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                int h = hh ^ cw; // the two warpgroups take the halves in opposite orders
                uint64_t db = smem_desc(st + F8_A_BYTES + h * 128 * 128);
                f8_mma_k128(part, da, db);
                const float *bcol = sc + F8_BM + h * 128 + cl;
                if (h == 0) promote_cols(acc0, part, a_lo, a_hi, bcol);
                else promote_cols(acc1, part, a_lo, a_hi, bcol);
            }
            mbar_arrive(empty0 + 8 * slot); // both halves and the scales read: release the stage
            ring_next(slot, phase, S);
        }
        if (TMA_EPI) {
            int row0 = e * M + m0 + cw * 64;
            w8_tma_store(acc0, &maps, stg, stg_s, rw, lane, cw, n0, row0, accumulate);
            w8_tma_store(acc1, &maps, stg, stg_s, rw, lane, cw, n0 + 128, row0, accumulate);
        } else {
            float *o = dw + (size_t)e * M * N;
            store_acc_f32(acc0, o, N, m0 + rl, n0 + cl, accumulate);
            store_acc_f32(acc1, o, N, m0 + rl, n0 + 128 + cl, accumulate);
        }
    }
    if (TMA_EPI && issuer) bulk_wait<0>(); // the last writes done before the staging goes away
}

// Variant 2 of the weight-grad (the default): a consumer warpgroup owns 64 x
// 128 of a 128 x 128 tile with two partial accumulators, so token block kb's
// wgmma run while block kb - 1's partial is promoted (elementwise, the
// column scales from that block's stage, which is handed back only after
// the promotion has read them); the TMA epilogue of variant 1 (a 64 x 128
// FP32 half a warpgroup). Same products, same promotion order: the same
// bits. Its promotion is elementwise (a scale product per element), so
// hiding it pays here where it did not in the forward (above): H100,
// OLMoE shapes, 7 interleaved rounds, paired medians: 1.25x / 1.31x the
// BF16 weight-grad (down / gate or up) against variant 1's 1.21x / 1.24x
// (bench/results/2026-12-07-h100-s5.md). ptxas keeps the wgmma
// asynchronous only where every read of a partial follows an unconditional
// wait (warning C7514 otherwise): hence the peeled first block and the
// pairs of blocks in the loop.
constexpr int W8P_STAGES = 4, W8P_SCALE_BYTES = (F8_BM + F8P_BN) * 4;
constexpr int W8P_TILES = W8P_STAGES * F8P_STAGE_BYTES, W8P_STAGING = 2 * 64 * 128 * 4;
constexpr int W8P_FIXED = 1024 + W8P_TILES + W8P_STAGING + W8P_STAGES * (W8P_SCALE_BYTES + 16);

struct W8PStage {
    int slot, prev_slot;
    uint32_t phase;
};
// Token block kb's four wgmma into cur (stage slot g.slot).
__device__ __forceinline__ void w8p_issue(float (&cur)[64], int kb, W8PStage &g, uint32_t tiles, uint32_t full0,
                                          int cw) {
    mbar_wait(full0 + 8 * g.slot, g.phase);
    uint32_t st = tiles + g.slot * F8P_STAGE_BYTES;
    uint64_t da = smem_desc(st + cw * 64 * 128), db = smem_desc(st + F8P_A_BYTES);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < F8_BK / 32; kk++) wgmma_fp8_n128(cur, da + 2 * kk, db + 2 * kk, kk > 0);
    wgmma_commit();
    fence_regs(cur);
}
// prev (the block in stage slot g.prev_slot, done) promoted with its
// stage's scales, then the slot handed back (one arrival a warp).
__device__ __forceinline__ void w8p_promote(float (&acc)[64], float (&prev)[64], const W8PStage &g, const float *s_sc,
                                            int rl, int cl, uint32_t empty0, int lane) {
    fence_regs(prev);
    const float *sc = s_sc + g.prev_slot * (W8P_SCALE_BYTES / 4);
    promote_cols(acc, prev, sc[rl], sc[rl + 8], sc + F8_BM + cl);
    __syncwarp();
    if (lane == 0) mbar_arrive(empty0 + 8 * g.prev_slot);
}
__device__ __forceinline__ void w8p_stage(float (&acc)[64], float (&cur)[64], float (&prev)[64], int kb, W8PStage &g,
                                          uint32_t tiles, uint32_t full0, uint32_t empty0, const float *s_sc, int cw,
                                          int rl, int cl, int lane) {
    w8p_issue(cur, kb, g, tiles, full0, cw);
    wgmma_wait<1>();
    w8p_promote(acc, prev, g, s_sc, rl, cl, empty0, lane);
    g.prev_slot = g.slot;
    ring_next(g.slot, g.phase, W8P_STAGES);
}

__global__ void __launch_bounds__(F8_THREADS, 1)
fp8_grouped_wgrad_pipe_kernel(float *dw, const __grid_constant__ W8Maps maps, const float *sa, const float *sb,
                              const int *offsets, int E, int M, int N, int accumulate) {
    constexpr int S = W8P_STAGES;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    uint32_t tiles = (raw + 1023) & ~1023u, staging = tiles + W8P_TILES, scales = staging + W8P_STAGING;
    uint32_t full0 = scales + S * W8P_SCALE_BYTES, empty0 = full0 + 8 * S;
    const float *s_sc = (const float *)(smem_raw + (scales - raw));
    int *s_off = (int *)(smem_raw + (empty0 + 8 * S - raw));
    int *s_blk = s_off + E + 1;
    f8_ring_init(full0, empty0, S, 8); // one arrival per consumer warp
    grouped_load_offsets<F8_THREADS>(offsets, E, s_off);
    grouped_tile_prefix<F8_BK>(s_off, E, 1, s_blk); // s_blk[e]: expert e's first token block
    int n_tiles = N / F8P_BN, per_e = M / F8_BM * n_tiles, total = E * per_e;
    int wg = threadIdx.x >> 7;

    if (wg == 0) { // producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x != 0) return;
        w8_produce<F8P_BN, S>(&maps, sa, sb, s_blk, M, N, per_e, n_tiles, total, tiles, scales, full0, empty0);
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    int rw = warp * 16 + (lane >> 2), rl = cw * 64 + rw, cl = 2 * (lane & 3); // this thread's first row, column
    bool issuer = (threadIdx.x & 127) == 0; // the warpgroup's thread that hands its staging to the copy engine
    unsigned char *stg = smem_raw + (staging - raw) + cw * (64 * 128 * 4);
    uint32_t stg_s = staging + cw * (64 * 128 * 4);
    W8PStage g = {0, 0, 0};
    float acc[64], p0[64], p1[64];
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
        int e = t / per_e, loc = t % per_e, m0 = loc / n_tiles * F8_BM, n0 = loc % n_tiles * F8P_BN;
        int kb0 = s_blk[e], nk = s_blk[e + 1] - kb0;
        if (nk == 0 && accumulate) continue; // an empty expert adds nothing
#pragma unroll
        for (int i = 0; i < 64; i++) acc[i] = 0.0f;
        if (nk > 0) {
            w8p_issue(p0, kb0, g, tiles, full0, cw);
            g.prev_slot = g.slot;
            ring_next(g.slot, g.phase, S);
            int i = 1;
            for (; i + 1 < nk; i += 2) {
                w8p_stage(acc, p1, p0, kb0 + i, g, tiles, full0, empty0, s_sc, cw, rl, cl, lane);
                w8p_stage(acc, p0, p1, kb0 + i + 1, g, tiles, full0, empty0, s_sc, cw, rl, cl, lane);
            }
            if (i < nk) {
                w8p_stage(acc, p1, p0, kb0 + i, g, tiles, full0, empty0, s_sc, cw, rl, cl, lane);
                wgmma_wait<0>();
                w8p_promote(acc, p1, g, s_sc, rl, cl, empty0, lane);
            } else {
                wgmma_wait<0>();
                w8p_promote(acc, p0, g, s_sc, rl, cl, empty0, lane);
            }
        }
        w8_tma_store(acc, &maps, stg, stg_s, rw, lane, cw, n0, e * M + m0 + cw * 64, accumulate);
    }
    if (issuer) bulk_wait<0>(); // the last writes done before the staging goes away
}

} // namespace

extern "C" int cuda_fp8_div_bf16_check(unsigned long long *counts) {
    div_bf16_check_kernel<<<0x7f81, 256, 0, cuda_stream()>>>(counts);
    cudaLaunchCheck();
    return 0;
}

extern "C" int cuda_fp8_encode_bits(uint8_t *q, uint32_t first, size_t n) {
    if (n % 4) return -1;
    size_t threads = n / 4;
    if (!threads) return 0;
    encode_bits_kernel<<<(unsigned)((threads + 255) / 256), 256, 0, cuda_stream()>>>(q, first, n);
    cudaLaunchCheck();
    return 0;
}

template <typename T>
static int quantize_1x128(uint8_t *q, float *scale, const T *x, const int *rows, int R, int C) {
    if (R < 0 || C <= 0 || C % 128) return -1;
    size_t threads = (size_t)R * C / 8;
    if (!threads) return 0;
    if (threads > 0xffffff00u) return -1; // the kernel's 32-bit thread index
    quantize_1x128_kernel<T><<<(unsigned)((threads + 255) / 256), 256, 0, cuda_stream()>>>(q, scale, x, rows, R, C);
    cudaLaunchCheck();
    return 0;
}
extern "C" int cuda_fp8_quantize_1x128(uint8_t *q, float *scale, const void *x, int R, int C) {
    return quantize_1x128(q, scale, (const bf16 *)x, NULL, R, C);
}
extern "C" int cuda_fp8_quantize_1x128_f32(uint8_t *q, float *scale, const float *x, int R, int C) {
    return quantize_1x128(q, scale, x, NULL, R, C);
}
extern "C" int cuda_fp8_gather_quantize(uint8_t *q, float *scale, const void *x, const int *rows, int R, int C) {
    return quantize_1x128(q, scale, (const bf16 *)x, rows, R, C);
}
extern "C" int cuda_fp8_gather_fake_quantize(void *out, const void *x, const int *rows, int R, int C) {
    if (R < 0 || C <= 0 || C % 128 || ((uintptr_t)out | (uintptr_t)x) & 15) return -1;
    size_t threads = (size_t)R * C / 8;
    if (!threads) return 0;
    if (threads > 0xffffff00u) return -1; // the kernel's 32-bit thread index
    quantize_1x128_kernel<bf16, true><<<(unsigned)((threads + 255) / 256), 256, 0, cuda_stream()>>>(
        (uint8_t *)out, NULL, (const bf16 *)x, rows, R, C);
    cudaLaunchCheck();
    return 0;
}
extern "C" int cuda_fp8_swiglu_quantize_1x128(uint8_t *q, float *scale, const void *gate, const void *up, int R, int F) {
    if (R < 0 || F <= 0 || F % 128) return -1;
    size_t n = (size_t)R * F, threads = n / 8;
    if (!threads) return 0;
    if (((uintptr_t)gate | (uintptr_t)up) & 15) return -1;
    swiglu_quantize_kernel<<<(unsigned)((threads + 255) / 256), 256, 0, cuda_stream()>>>(q, scale, (const bf16 *)gate,
                                                                                       (const bf16 *)up, n);
    cudaLaunchCheck();
    return 0;
}
extern "C" int cuda_fp8_swiglu_backward_quantize_1x128(void *dgate, void *dup, uint8_t *q, float *scale,
                                                       const void *dout, const void *gate, const void *up, int R, int F) {
    if (R < 0 || F <= 0 || F % 128) return -1;
    size_t n = (size_t)R * F, threads = n / 8;
    if (!threads) return 0;
    if (((uintptr_t)dgate | (uintptr_t)dup | (uintptr_t)dout | (uintptr_t)gate | (uintptr_t)up) & 15) return -1;
    if (threads > 0xffffff00u) return -1; // the kernel's 32-bit thread index
    swiglu_backward_quantize_kernel<<<(unsigned)((threads + 255) / 256), 256, 0, cuda_stream()>>>(
        (bf16 *)dgate, (bf16 *)dup, q, scale, (const bf16 *)dout, (const bf16 *)gate, (const bf16 *)up, n, F);
    cudaLaunchCheck();
    return 0;
}
extern "C" int cuda_fp8_dequantize_1x128(void *x, const uint8_t *q, const float *scale, int R, int C) {
    if (R < 0 || C <= 0 || C % 128) return -1;
    size_t n = (size_t)R * C, threads = n / 8;
    if (!threads) return 0;
    if (((uintptr_t)x & 15) || ((uintptr_t)q & 7)) return -1;
    dequantize_1x128_kernel<<<(unsigned)((threads + 255) / 256), 256, 0, cuda_stream()>>>((bf16 *)x, q, scale, n);
    cudaLaunchCheck();
    return 0;
}

extern "C" int cuda_fp8_dequantize_128x128(void *w, const uint8_t *q, const float *scale, int E, int M, int K) {
    if (E <= 0 || M <= 0 || K <= 0 || M % 128 || K % 128) return -1;
    if (((uintptr_t)w & 15) || ((uintptr_t)q & 7)) return -1;
    size_t n = (size_t)E * M * K, threads = n / 8;
    dequantize_128x128_kernel<<<(unsigned)((threads + 255) / 256), 256, 0, cuda_stream()>>>((bf16 *)w, q, scale, M, K, n);
    cudaLaunchCheck();
    return 0;
}

extern "C" int cuda_fp8_quantize_128x128_t(uint8_t *q, float *scale, uint8_t *qt, float *st, int ldt, int col0,
                                           const float *w, int E, int M, int K) {
    if (E <= 0 || M <= 0 || K <= 0 || M % 128 || K % 128 || E > 65535) return -1;
    if (qt && (ldt % 128 || col0 % 128 || col0 < 0 || col0 + M > ldt || ((uintptr_t)qt & 7))) return -1;
    quantize_128x128_kernel<<<dim3((unsigned)(M / 128 * (K / 128)), E), 256, 0, cuda_stream()>>>(q, scale, qt, st, w,
                                                                                                ldt, col0, M, K);
    cudaLaunchCheck();
    return 0;
}
// adamw_update_fp8: AdamW on p [E, M, K] and its FP8 copies in one pass
// (quantize_128x128_kernel<true>); -1 for sizes or buffers it does not take
extern "C" int cuda_fp8_adamw_quantize_128x128_t(float *p, const float *g, float *m, float *v, float lr, float beta1,
                                                 float beta2, float eps, float wd, float grad_scale, int t, uint8_t *q,
                                                 float *scale, uint8_t *qt, float *st, int ldt, int col0, int E, int M,
                                                 int K) {
    if (E <= 0 || M <= 0 || K <= 0 || M % 128 || K % 128 || E > 65535) return -1;
    if (qt && (ldt % 128 || col0 % 128 || col0 < 0 || col0 + M > ldt || ((uintptr_t)qt & 7))) return -1;
    if (((uintptr_t)p | (uintptr_t)g | (uintptr_t)m | (uintptr_t)v) & 15) return -1;
    quantize_128x128_kernel<true><<<dim3((unsigned)(M / 128 * (K / 128)), E), 256, 0, cuda_stream()>>>(
        q, scale, qt, st, p, ldt, col0, M, K, g, m, v, adamw_args(lr, beta1, beta2, eps, wd, grad_scale, t));
    cudaLaunchCheck();
    return 0;
}
extern "C" int cuda_fp8_quantize_128x128(uint8_t *q, float *scale, const float *w, int E, int M, int K) {
    return cuda_fp8_quantize_128x128_t(q, scale, NULL, NULL, 0, 0, w, E, M, K);
}

extern "C" int cuda_fp8_quantize_mx(uint8_t *q, uint8_t *scale, const void *x, int R, int C) {
    if (R < 0 || C <= 0 || C % 32) return -1;
    size_t n = (size_t)R * C, threads = n / 8;
    if (!threads) return 0;
    quantize_mx_kernel<<<(unsigned)((threads + 255) / 256), 256, 0, cuda_stream()>>>(q, scale, (const bf16 *)x, n);
    cudaLaunchCheck();
    return 0;
}

extern "C" int cuda_fp8_fake_quantize_128x1(void *x, const int *offsets, int E, int C) {
    if (E == 0) return 0;
    if (E < 0 || C <= 0 || C % 8 || ((uintptr_t)x & 15)) return -1;
    int smem = (FQ_WARPS * FQ_COLS + 2 * (E + 1)) * (int)sizeof(int);
    if (smem > 227 * 1024) return -1;
    static int smem_set;
    cuda_allow_smem((const void *)fake_quantize_128x1_kernel, &smem_set, smem);
    // the tiles are known on the device only: a grid that fills the GPU strides over them
    fake_quantize_128x1_kernel<<<cuda_num_sms() * 4, FQ_THREADS, smem, cuda_stream()>>>((bf16 *)x, offsets, E, C);
    cudaLaunchCheck();
    return 0;
}

extern "C" int cuda_fp8_grouped_forward(void *out, const uint8_t *qa, const float *sa, const uint8_t *qw,
                                        const float *sw, const int *offsets, int E, int C, int OC) {
    if (!cuda_wgmma_device_ok() || !cuda_tma_available()) return -1;
    if (E <= 0 || C <= 0 || OC <= 0 || C % F8_BK || OC % F8_BN) return -1;
    if (((uintptr_t)out | (uintptr_t)qa | (uintptr_t)qw) & 15) return -1;
    F8Maps maps;
    memset(&maps, 0, sizeof maps);
    if (cuda_tensor_map_2d(&maps.a, qa, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, C, cuda_rows_to_end(qa, C), F8_BK, F8_BM))
        return -1;
    if (cuda_tensor_map_2d(&maps.b, qw, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, C, (uint64_t)E * OC, F8_BK, F8_BN))
        return -1;
    const char *v = getenv("MOECORE_FP8_GEMM_VARIANT");
    int variant = v && *v >= '0' && *v < '0' + FP8_GEMM_VARIANTS ? *v - '0' : 3;
    int smem = F8_TILE_BYTES + 1024 + 16 * F8_STAGES + 2 * (E + 1) * (int)sizeof(int);
    if (smem > 227 * 1024) return -1;
    // MOECORE_FP8_GEMM_VARIANT (benchmarks and tests only): 0 loads the
    // scales at each stage's start and stores 4 bytes per thread, 1 adds the
    // scale prefetch, 2 also the 16-byte epilogue, 3 (the default) also
    // staggers the column halves. H200, OLMoE shapes, 7 interleaved rounds
    // (bench/results/2026-12-01-h200-issue18-fp8.md): 1.38 / 1.35 / 1.49 /
    // 1.52x the BF16 grouped forward (gate/up), 1.28 / 1.23 / 1.48 / 1.52x (down).
    // MOECORE_FP8_GEMM_DIAG=1|2 (bench_fp8's diag rows only): the default's
    // DIAG kernels, kernels 4 and 5, whose results are wrong by design.
    const char *dg = getenv("MOECORE_FP8_GEMM_DIAG");
    int k = dg && (*dg == '1' || *dg == '2') ? 3 + (*dg - '0') : variant;
    typedef void (*Kernel)(bf16 *, const F8Maps, const float *, const float *, const int *, int, int, int);
    static const Kernel kernels[6] = {fp8_grouped_fwd_kernel<false, false>,         fp8_grouped_fwd_kernel<true, false>,
                                      fp8_grouped_fwd_kernel<true, true>,           fp8_grouped_fwd_kernel<true, true, true>,
                                      fp8_grouped_fwd_kernel<true, true, true, 1>, fp8_grouped_fwd_kernel<true, true, true, 2>};
    static int smem_set[6];
    cuda_allow_smem((const void *)kernels[k], &smem_set[k], smem);
    kernels[k]<<<cuda_num_sms(), F8_THREADS, smem, cuda_stream()>>>((bf16 *)out, maps, sa, sw, offsets, E, OC, C);
    cudaLaunchCheck();
    return 0;
}

static int quantize_tokens_t(uint8_t *qt, float *st, const void *x, const float *xs, const int *offsets, int E, int C,
                             int ldk) {
    if (E == 0) return 0;
    if (E < 0 || C <= 0 || C % 128 || ldk <= 0 || ldk % 128) return -1;
    if (((uintptr_t)x | (uintptr_t)qt | (uintptr_t)st) & 15 || ((uintptr_t)xs & 3)) return -1;
    int smem = 2 * (E + 1) * (int)sizeof(int);
    if (smem > 48 * 1024 - 128 * 128 - 8 * 128 * 4) return -1;
    if (xs)
        quantize_tokens_t_kernel<true><<<cuda_num_sms() * 8, QT_THREADS, smem, cuda_stream()>>>(qt, st, x, xs, offsets,
                                                                                               E, C, ldk);
    else
        quantize_tokens_t_kernel<false><<<cuda_num_sms() * 8, QT_THREADS, smem, cuda_stream()>>>(qt, st, x, NULL,
                                                                                                offsets, E, C, ldk);
    cudaLaunchCheck();
    return 0;
}
extern "C" int cuda_fp8_quantize_tokens_t(uint8_t *qt, float *st, const void *x, const int *offsets, int E, int C,
                                          int ldk) {
    return quantize_tokens_t(qt, st, x, NULL, offsets, E, C, ldk);
}
extern "C" int cuda_fp8_requantize_tokens_t(uint8_t *qt, float *st, const uint8_t *q, const float *s,
                                            const int *offsets, int E, int C, int ldk) {
    if (!s) return -1;
    return quantize_tokens_t(qt, st, q, s, offsets, E, C, ldk);
}

static int wgrad_smem(int E) { return W8Smem<true>::bytes(E) > W8Smem<false>::bytes(E) ? W8Smem<true>::bytes(E) : W8Smem<false>::bytes(E); }

extern "C" int cuda_fp8_grouped_wgrad(float *dw, const uint8_t *qa, const float *sa, const uint8_t *qb, const float *sb,
                                      const int *offsets, int E, int C, int OC, int ldk, int accumulate) {
    if (!cuda_wgmma_device_ok() || !cuda_tma_available()) return -1;
    if (E <= 0 || C <= 0 || OC <= 0 || OC % F8_BM || C % F8_BN || ldk <= 0 || ldk % F8_BK) return -1;
    if (((uintptr_t)qa | (uintptr_t)qb | (uintptr_t)sa | (uintptr_t)sb) & 15 || ((uintptr_t)dw & 7)) return -1;
    // MOECORE_FP8_WGRAD_VARIANT (benchmarks and tests only): 0 stores the
    // accumulators from registers (also wherever dw is not 16-byte aligned,
    // as TMA needs), 1 by TMA from shared memory, 2 (the default) the
    // double-buffered 128 x 128 tiles (fp8_grouped_wgrad_pipe_kernel).
    const char *v = getenv("MOECORE_FP8_WGRAD_VARIANT");
    int variant = (v && *v == '0') || ((uintptr_t)dw & 15) ? 0 : v && *v == '1' ? 1 : 2;
    int bn = variant == 2 ? F8P_BN : F8_BN; // the tiles' columns, B's box
    int smem = variant == 2 ? W8P_FIXED + 2 * (E + 1) * (int)sizeof(int) : wgrad_smem(E);
    if (smem > 227 * 1024) return -1;
    W8Maps maps;
    memset(&maps, 0, sizeof maps);
    if (cuda_tensor_map_2d(&maps.a, qa, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, ldk, OC, F8_BK, F8_BM)) return -1;
    if (cuda_tensor_map_2d(&maps.b, qb, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, ldk, C, F8_BK, bn)) return -1;
    if (variant && cuda_tensor_map_2d(&maps.dw, dw, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, C, (uint64_t)E * OC, 32, 64))
        return -1;
    typedef void (*Kernel)(float *, const W8Maps, const float *, const float *, const int *, int, int, int, int);
    static const Kernel kernels[3] = {fp8_grouped_wgrad_kernel<false>, fp8_grouped_wgrad_kernel<true>,
                                      fp8_grouped_wgrad_pipe_kernel};
    static int smem_set[3];
    cuda_allow_smem((const void *)kernels[variant], &smem_set[variant], smem);
    int tiles = E * (OC / F8_BM) * (C / bn), grid = cuda_num_sms() < tiles ? cuda_num_sms() : tiles;
    kernels[variant]<<<grid, F8_THREADS, smem, cuda_stream()>>>(dw, maps, sa, sb, offsets, E, OC, C, accumulate);
    cudaLaunchCheck();
    return 0;
}

// ---- the op table's FP8 entries (ops.h): the functions above, which must take the sizes ----

// The sizes the FP8 ops of a model need (model_set_fp8 asks before it runs).
extern "C" int cuda_fp8_supports(int E, int C, int OC, char *why, size_t whylen) {
    if (!cuda_wgmma_device_ok() || !cuda_tma_available()) {
        snprintf(why, whylen, "the FP8 grouped GEMM needs a Hopper GPU (sm_90a wgmma and TMA)");
        return 0;
    }
    if (C % F8_BK || OC % F8_BN) {
        snprintf(why, whylen, "the FP8 grouped GEMM needs the input width a multiple of %d and the output width a "
                 "multiple of %d (got %d -> %d)", F8_BK, F8_BN, C, OC);
        return 0;
    }
    if (F8_TILE_BYTES + 1024 + 16 * F8_STAGES + 2 * (E + 1) * (int)sizeof(int) > 227 * 1024) {
        snprintf(why, whylen, "the FP8 grouped GEMM takes at most %d experts per GPU (shared memory), got %d",
                 (227 * 1024 - F8_TILE_BYTES - 1024 - 16 * F8_STAGES) / 8 - 1, E);
        return 0;
    }
    return 1;
}

static void fp8_ok(int rc, const char *what, int a, int b) {
    if (rc == 0) return;
    fprintf(stderr, "moecore: %s: the CUDA FP8 kernel does not take these sizes (%d, %d) or buffers\n", what, a, b);
    exit(3);
}
extern "C" void cuda_fp8_quantize_weights(uint8_t *qw, float *sw, uint8_t *qwt, float *swt, int ldt, int col0,
                                          const float *w, int E, int M, int K) {
    fp8_ok(cuda_fp8_quantize_128x128_t(qw, sw, qwt, swt, ldt, col0, w, E, M, K), "fp8_quantize_weights", M, K);
}
extern "C" void cuda_adamw_update_fp8(float *p, const float *g, float *m, float *v, float lr, float beta1,
                                      float beta2, float eps, float wd, float grad_scale, int t, uint8_t *qw, float *sw,
                                      uint8_t *qwt, float *swt, int ldt, int col0, int E, int M, int K) {
    if (!cuda_fp8_adamw_quantize_128x128_t(p, g, m, v, lr, beta1, beta2, eps, wd, grad_scale, t, qw, sw, qwt, swt, ldt,
                                           col0, E, M, K))
        return;
    // sizes or alignment the fused kernel does not take: the two ops
    cuda_adamw_update(p, NULL, g, m, v, (size_t)E * M * K, lr, beta1, beta2, eps, wd, grad_scale, t);
    cuda_fp8_quantize_weights(qw, sw, qwt, swt, ldt, col0, p, E, M, K);
}
extern "C" void cuda_fp8_quantize_rows(uint8_t *q, float *s, const void *x, const int *token_of_row, int R, int C) {
    fp8_ok(cuda_fp8_gather_quantize(q, s, x, token_of_row, R, C), "fp8_quantize_rows", R, C);
}
// unpermute_backward with dy's tiles quantised as they are stored: the
// bits of cuda_unpermute_backward then cuda_fp8_quantize_rows (the hook
// rounds each value to BF16 as the store does). The hook's shuffles need
// every thread of a block to store as many 8-channel groups as the others:
// C a multiple of 8 x the block's threads (and so of 128); other shapes,
// and unaligned pointers, run the two ops, as does
// MOECORE_FP8_UNPERMUTE_FUSED=0 (benchmarks and test_fp8). H100,
// OLMoE-1B-7B FP8 at 8 layers, A B B A: 1.009x the two ops, every loss
// bit-identical (2026-12-07, bench/results/2026-12-07-s13.md).
extern "C" void cuda_fp8_unpermute_backward_quantize(void *dy, float *dweights, uint8_t *q, float *s, const void *dout,
                                                     const void *y, const float *weights, const int *row_of, int N,
                                                     int k, int C) {
    int threads = row_block_threads(C);
    if (N <= 0) return;
    const char *on = getenv("MOECORE_FP8_UNPERMUTE_FUSED");
    if ((on && !strcmp(on, "0")) || C % 128 || C % (8 * threads) || !aligned16(dy) || !aligned16(dout) ||
        !aligned16(y) || ((uintptr_t)q & 7) || ((uintptr_t)s & 3)) {
        cuda_unpermute_backward(dy, dweights, dout, y, weights, row_of, N, k, C);
        cuda_fp8_quantize_rows(q, s, dy, NULL, N * k, C);
        return;
    }
    unpermute_backward_kernel<true, Quant1x128Hook><<<N, threads, 0, cuda_stream()>>>(
        (bf16 *)dy, dweights, (const bf16 *)dout, (const bf16 *)y, weights, row_of, N, k, C, Quant1x128Hook{q, s});
    cudaLaunchCheck();
}
extern "C" void cuda_fp8_swiglu_quantize(uint8_t *q, float *s, const void *gate, const void *up, int R, int F) {
    fp8_ok(cuda_fp8_swiglu_quantize_1x128(q, s, gate, up, R, F), "fp8_swiglu_quantize", R, F);
}
extern "C" void cuda_fp8_swiglu_backward_quantize(void *dgate, void *dup, uint8_t *q, float *s, const void *dout,
                                                  const void *gate, const void *up, int R, int F) {
    fp8_ok(cuda_fp8_swiglu_backward_quantize_1x128(dgate, dup, q, s, dout, gate, up, R, F),
           "fp8_swiglu_backward_quantize", R, F);
}
extern "C" void cuda_fp8_fake_quantize_rows(void *out, const void *x, const int *token_of_row, int R, int C) {
    fp8_ok(cuda_fp8_gather_fake_quantize(out, x, token_of_row, R, C), "fp8_fake_quantize_rows", R, C);
}
extern "C" void cuda_fp8_dequantize_rows(void *x, const uint8_t *q, const float *s, int R, int C) {
    fp8_ok(cuda_fp8_dequantize_1x128(x, q, s, R, C), "fp8_dequantize_rows", R, C);
}
extern "C" void cuda_fp8_fake_quantize_tokens(void *x, const int *offsets, int E, int C) {
    fp8_ok(cuda_fp8_fake_quantize_128x1(x, offsets, E, C), "fp8_fake_quantize_tokens", E, C);
}
extern "C" int cuda_fp8_wgrad_supports(int E, int C, int OC, char *why, size_t whylen) {
    if (!cuda_wgmma_device_ok() || !cuda_tma_available()) {
        snprintf(why, whylen, "the FP8 weight-grad needs a Hopper GPU (sm_90a wgmma and TMA)");
        return 0;
    }
    if (C % F8_BN || OC % F8_BM || wgrad_smem(E) > 227 * 1024) {
        snprintf(why, whylen, "the FP8 weight-grad needs dw [E, OC, C] with OC a multiple of %d, C of %d and at most "
                 "%d experts (got %d, %d, %d)", F8_BM, F8_BN, (227 * 1024 - wgrad_smem(0)) / 8, E, OC, C);
        return 0;
    }
    return 1;
}
extern "C" void cuda_fp8_quantize_tokens_t_op(uint8_t *qt, float *st, const void *x, const int *offsets, int E, int C,
                                              int ldk) {
    fp8_ok(cuda_fp8_quantize_tokens_t(qt, st, x, offsets, E, C, ldk), "fp8_quantize_tokens_t", C, ldk);
}
extern "C" void cuda_fp8_requantize_tokens_t_op(uint8_t *qt, float *st, const uint8_t *q, const float *s,
                                                const int *offsets, int E, int C, int ldk) {
    fp8_ok(cuda_fp8_requantize_tokens_t(qt, st, q, s, offsets, E, C, ldk), "fp8_requantize_tokens_t", C, ldk);
}
extern "C" void cuda_fp8_grouped_wgrad_op(float *dw, const uint8_t *qa, const float *sa, const uint8_t *qb,
                                          const float *sb, const int *offsets, int E, int C, int OC, int ldk,
                                          int accumulate) {
    fp8_ok(cuda_fp8_grouped_wgrad(dw, qa, sa, qb, sb, offsets, E, C, OC, ldk, accumulate), "fp8_grouped_wgrad", C, OC);
}
extern "C" void cuda_fp8_grouped_matmul_forward(void *out, const uint8_t *qa, const float *sa, const uint8_t *qw,
                                            const float *sw, const int *offsets, int E, int C, int OC) {
    fp8_ok(cuda_fp8_grouped_forward(out, qa, sa, qw, sw, offsets, E, C, OC), "fp8_grouped_matmul_forward", C, OC);
}
