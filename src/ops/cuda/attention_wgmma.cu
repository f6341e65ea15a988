// Causal attention forward on Hopper tensor cores (wgmma, sm_90a) with TMA
// loads, FlashAttention-3 style: the same function and outputs as the
// forward kernels in attention.cu (out, and lse2 [B,H,T], the base-2
// log-sum-exp that their backward reads), for head dim 128, T a multiple of
// 128 and no documents; cuda_attention_forward (attention.cu) falls back to
// those kernels elsewhere, and runs this one only under
// device.cuda.attention_fwd: wgmma.
//
// One block per (head, batch, 128 queries), heaviest query blocks first;
// 384 threads. Warpgroup 0 is the producer: one thread loads the block's Q
// tile once, then the K and V tiles of 128 keys, from the diagonal down to
// key 0, by the bulk tensor copy engine into a 2-deep ring. K and V have
// barriers of their own (full: the expect_tx arrival and the copy's bytes;
// empty: one arrival per consumer warp), so that a K tile is refilled as
// soon as its product is done, while V is still in use. Warpgroups 1 and 2
// are the consumers, 64 query rows each:
//   S = Q K^T      m64n128k16 x 8 (hd 128 = two 64-wide swizzle rows), Q
//                  and K K-major in shared memory;
//   online softmax in registers (FP32; m per row on the raw scores, p =
//                  2^(s * scale log2 e - m * scale log2 e));
//   O += P V       m64n128k16 x 8, P from registers as BF16 (the S
//                  accumulator's layout is the A fragment's), V read
//                  MN-major (imm-trans-b) from its [key][hd] rows.
// Inside a warpgroup the products overlap the softmax: S of tile j is
// issued, then O += P V of tile j - 1, and the softmax of tile j runs
// while the second product is in flight; O is rescaled once it lands.
// Only the first (diagonal) tile is masked. Each output element is written
// by one thread after a fixed-order sum: deterministic, no atomics.
//
// Shared memory (1024-byte aligned; a tile of 128 rows x 128 hd is two
// 16 KB halves of 128 rows x 64 hd, each row one 128-byte swizzle row):
// Q (32 KB), then 2 stages of K, V (32 KB each), then the barriers: 160 KB,
// one block per multiprocessor.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/ops_cuda.h"
#include "ops/cuda/wgmma_util.cuh"
#include <math.h>
#include <string.h>

namespace {

constexpr int FA_HD = 128, FA_BM = 128, FA_BN = 128, FA_STAGES = 2, FA_THREADS = 384;
constexpr int FA_HALF = 128 * 64 * 2;          // 128 rows x 64 hd
constexpr int FA_TILE = 2 * FA_HALF;           // 128 rows x 128 hd
constexpr int FA_KV0 = FA_TILE;                // K of stage s at FA_KV0 + s * FA_STAGE, V FA_TILE after
constexpr int FA_STAGE = 2 * FA_TILE;
constexpr int FA_BARS = FA_KV0 + FA_STAGES * FA_STAGE;
constexpr int FA_SMEM = FA_BARS + 8 * (1 + 4 * FA_STAGES) + 1024; // barriers, alignment slack
static_assert(FA_BM == FA_BN, "the diagonal tile is the only masked one");

struct FaMaps {
    CUtensorMap q, k, v; // [B*T, H*hd] and [B*T, KV*hd], box 64 hd x 128 rows
};

// S = Q K^T for this warpgroup's 64 rows (Q at qa: its rows of half 0; K
// at ka), k16 steps of 32 bytes inside each half.
__device__ __forceinline__ void fa_qk(float (&s)[64], uint32_t qa, uint32_t ka) {
    uint64_t q0 = smem_desc(qa), q1 = smem_desc(qa + FA_HALF), k0 = smem_desc(ka), k1 = smem_desc(ka + FA_HALF);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma_n128<0, 0>(s, q0 + 2 * kk, k0 + 2 * kk, kk > 0);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma_n128<0, 0>(s, q1 + 2 * kk, k1 + 2 * kk, 1);
}
// O += P V: V at va, MN-major with its two 64-wide hd blocks a half apart,
// the k16 step (16 keys) 2048 bytes.
__device__ __forceinline__ void fa_pv(float (&o)[64], const uint32_t (&p)[32], uint32_t va) {
    uint64_t v = smem_desc_mn_lbo(va, FA_HALF);
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
        const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
        wgmma_n128_rs<1>(o, a, v + (uint64_t)(2048 >> 4) * kk, 1);
    }
}
__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ uint32_t fa_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
// Keys past their row (columns > row, both local to the diagonal tile) to
// -inf; acc[4 j + h] is row row0 + 8 (h / 2), column col0 + 8 j + h % 2.
__device__ __forceinline__ void fa_mask(float (&s)[64], int row0, int col0) {
#pragma unroll
    for (int j = 0; j < 16; j++)
#pragma unroll
        for (int h = 0; h < 4; h++)
            if (col0 + 8 * j + (h & 1) > row0 + 8 * (h >> 1)) s[4 * j + h] = -INFINITY;
}
// The online softmax of one tile for the thread's rows i = 0, 1: the new
// running max m (raw scores), the rescale alpha of what came before,
// s to p = 2^(s sl2 - m sl2) and l = l alpha + (this thread's) row sums.
__device__ __forceinline__ void fa_softmax(float (&s)[64], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                           float sl2) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float mx = m[i];
#pragma unroll
        for (int j = 0; j < 16; j++) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float base = mx == -INFINITY ? 0.f : mx * sl2;
        alpha[i] = fa_exp2(m[i] * sl2 - base); // m = -inf at first: 0
        m[i] = mx;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            float p0 = fa_exp2(fmaf(s[4 * j + 2 * i], sl2, -base));
            float p1 = fa_exp2(fmaf(s[4 * j + 2 * i + 1], sl2, -base));
            s[4 * j + 2 * i] = p0;
            s[4 * j + 2 * i + 1] = p1;
            sum += p0 + p1;
        }
        l[i] = l[i] * alpha[i] + sum;
    }
}
// P as BF16 A fragments: k16 step kk takes accumulator columns 16 kk ..
__device__ __forceinline__ void fa_to_p(uint32_t (&p)[32], const float (&s)[64]) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) p[4 * kk + r] = fa_pack(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}
__device__ __forceinline__ void fa_rescale(float (&o)[64], const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < 16; j++)
#pragma unroll
        for (int h = 0; h < 4; h++) o[4 * j + h] *= alpha[h >> 1];
}

// grid (H, B, T / 128); maps over q, k, v; out [B,T,H,128]; lse2 [B,H,T].
__global__ void __launch_bounds__(FA_THREADS, 1)
    attention_fwd_wgmma_kernel(bf16 *out, float *lse2, const __grid_constant__ FaMaps maps, int T, int H, int KV,
                               float sl2) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    uint32_t base = (raw + 1023) & ~1023u;
    uint32_t qbar = base + FA_BARS;                // Q loaded
    uint32_t kfull = qbar + 8, vfull = kfull + 8 * FA_STAGES;
    uint32_t kempty = vfull + 8 * FA_STAGES, vempty = kempty + 8 * FA_STAGES;
    int h = blockIdx.x, b = blockIdx.y, qb = gridDim.z - 1 - blockIdx.z;
    int q0 = qb * FA_BM, nkb = qb + 1; // key tiles qb (the diagonal), qb - 1, ..., 0
    int wg = threadIdx.x >> 7;
    if (threadIdx.x == 0) {
        mbar_init(qbar, 1);
        for (int s = 0; s < FA_STAGES; s++) {
            mbar_init(kfull + 8 * s, 1);
            mbar_init(vfull + 8 * s, 1);
            mbar_init(kempty + 8 * s, 8); // one arrival per consumer warp
            mbar_init(vempty + 8 * s, 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) { // producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x != 0) return;
        int row = b * T, qc = h * FA_HD, kc = h / (H / KV) * FA_HD;
        mbar_expect_tx(qbar, FA_TILE);
        tma_load_2d(base, &maps.q, qc, row + q0, qbar);
        tma_load_2d(base + FA_HALF, &maps.q, qc + 64, row + q0, qbar);
        for (int j = 0; j < nkb; j++) {
            int s = j % FA_STAGES;
            uint32_t ph = (j / FA_STAGES) & 1, st = base + FA_KV0 + s * FA_STAGE;
            int kr = row + (qb - j) * FA_BN;
            mbar_wait(kempty + 8 * s, ph ^ 1); // a fresh barrier passes parity 1 at once
            mbar_expect_tx(kfull + 8 * s, FA_TILE);
            tma_load_2d(st, &maps.k, kc, kr, kfull + 8 * s);
            tma_load_2d(st + FA_HALF, &maps.k, kc + 64, kr, kfull + 8 * s);
            mbar_wait(vempty + 8 * s, ph ^ 1);
            mbar_expect_tx(vfull + 8 * s, FA_TILE);
            tma_load_2d(st + FA_TILE, &maps.v, kc, kr, vfull + 8 * s);
            tma_load_2d(st + FA_TILE + FA_HALF, &maps.v, kc + 64, kr, vfull + 8 * s);
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    bool leader = lane == 0;
    int lrow = cw * 64 + warp * 16 + (lane >> 2), lcol = 2 * (lane & 3); // local row (and + 8), first column
    uint32_t qa = base + cw * 64 * 128;
    float o[64], s[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];
    uint32_t p[32];
#pragma unroll
    for (int i = 0; i < 64; i++) o[i] = 0.f;

    // tile 0, the diagonal: S, mask, softmax
    mbar_wait(qbar, 0);
    mbar_wait(kfull, 0);
    wgmma_fence();
    fa_qk(s, qa, base + FA_KV0);
    wgmma_commit();
    wgmma_wait<0>();
    __syncwarp();
    if (leader) mbar_arrive(kempty);
    fa_mask(s, lrow, lcol);
    fa_softmax(s, m, l, alpha, sl2);
    fa_to_p(p, s);

    for (int j = 1; j < nkb; j++) {
        int st = j % FA_STAGES, pv = (j - 1) % FA_STAGES;
        uint32_t ph = (j / FA_STAGES) & 1, pph = ((j - 1) / FA_STAGES) & 1;
        uint32_t ka = base + FA_KV0 + st * FA_STAGE, va = base + FA_KV0 + pv * FA_STAGE + FA_TILE;
        mbar_wait(kfull + 8 * st, ph);
        wgmma_fence();
        fa_qk(s, qa, ka);
        wgmma_commit();
        mbar_wait(vfull + 8 * pv, pph);
        fa_pv(o, p, va);
        wgmma_commit();
        wgmma_wait<1>(); // S of tile j is in
        __syncwarp();
        if (leader) mbar_arrive(kempty + 8 * st);
        fa_softmax(s, m, l, alpha, sl2);
        wgmma_wait<0>(); // O += P V of tile j - 1 is in
        __syncwarp();
        if (leader) mbar_arrive(vempty + 8 * pv);
        fa_rescale(o, alpha);
        fa_to_p(p, s);
    }
    {
        int pv = (nkb - 1) % FA_STAGES;
        uint32_t pph = ((nkb - 1) / FA_STAGES) & 1;
        mbar_wait(vfull + 8 * pv, pph);
        wgmma_fence();
        fa_pv(o, p, base + FA_KV0 + pv * FA_STAGE + FA_TILE);
        wgmma_commit();
        wgmma_wait<0>();
    }

    // out = O / l, lse2 = m sl2 + log2 l (l summed over the quad)
    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float li = l[i];
        li += __shfl_xor_sync(0xffffffffu, li, 1);
        li += __shfl_xor_sync(0xffffffffu, li, 2);
        inv[i] = 1.f / li;
        int t = q0 + lrow + 8 * i;
        if ((lane & 3) == 0) lse2[((size_t)b * H + h) * T + t] = m[i] * sl2 + log2f(li);
    }
    size_t ld = (size_t)H * FA_HD;
    bf16 *og = out + ((size_t)b * T + q0 + lrow) * ld + (size_t)h * FA_HD + lcol;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        *(__nv_bfloat162 *)(og + 8 * j) = __floats2bfloat162_rn(o[4 * j] * inv[0], o[4 * j + 1] * inv[0]);
        *(__nv_bfloat162 *)(og + 8 * ld + 8 * j) = __floats2bfloat162_rn(o[4 * j + 2] * inv[1], o[4 * j + 3] * inv[1]);
    }
}

} // namespace

// The forward on the wgmma kernel: 0 when it ran, -1 (nothing launched)
// where it does not take the call: not an sm_90 device, no TMA in the
// driver, head dim other than 128, T not a multiple of 128, documents,
// operands not 16-byte aligned, or a grid too large.
extern "C" int cuda_attention_forward_wgmma(void *out, float *lse2, const void *q, const void *k, const void *v,
                                            const int *doc_start, int B, int T, int H, int KV, int hd) {
    if (doc_start || hd != FA_HD || B <= 0 || T <= 0 || T % FA_BM || H <= 0 || KV <= 0 || H % KV) return -1;
    if (B > 65535 || T / FA_BM > 65535 || (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) & 15)) return -1;
    if (!cuda_wgmma_device_ok() || !cuda_tma_available()) return -1;
    FaMaps maps;
    memset(&maps, 0, sizeof maps);
    uint64_t rows = (uint64_t)B * T;
    if (cuda_tensor_map_2d(&maps.q, q, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (uint64_t)H * FA_HD, rows, 64, FA_BM) ||
        cuda_tensor_map_2d(&maps.k, k, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (uint64_t)KV * FA_HD, rows, 64, FA_BN) ||
        cuda_tensor_map_2d(&maps.v, v, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (uint64_t)KV * FA_HD, rows, 64, FA_BN))
        return -1;
    static int smem_set;
    cuda_allow_smem((const void *)attention_fwd_wgmma_kernel, &smem_set, FA_SMEM);
    dim3 grid(H, B, T / FA_BM);
    attention_fwd_wgmma_kernel<<<grid, FA_THREADS, FA_SMEM, cuda_stream()>>>(
        (bf16 *)out, lse2, maps, T, H, KV, (float)(1.4426950408889634 / sqrt((double)FA_HD)));
    cudaLaunchCheck();
    return 0;
}
