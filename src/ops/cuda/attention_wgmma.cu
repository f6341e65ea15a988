// Causal attention on Hopper tensor cores (wgmma, sm_90a) with TMA loads,
// FlashAttention-3 style: the same function and outputs as the kernels in
// attention.cu (forward: out, and lse2 [B,H,T], the base-2 log-sum-exp that
// the backward reads; backward below), for head dim 128, T a multiple of
// 128 and no documents; cuda_attention_forward / _backward (attention.cu)
// fall back to those kernels elsewhere, and run these only under
// device.cuda.attention_fwd / attention_bwd: wgmma.
// H200, B=1 T=4096 H=16 (2026-12-01): forward 558 TFLOP/s (mma.sync 317),
// backward 475 (235; 353 before its dK/dV kernel queued the next products).
//
// ---- forward
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
// Across the two warpgroups nothing is ordered (FA3's "ping-pong", the two
// taking turns at the tensor cores through named barriers, measured 1%
// slower here: bench/results/2026-12-01-h200-issue19-attention.md).
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
        alpha[i] = fast_exp2(m[i] * sl2 - base); // m = -inf at first: 0
        m[i] = mx;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            float p0 = fast_exp2(fmaf(s[4 * j + 2 * i], sl2, -base));
            float p1 = fast_exp2(fmaf(s[4 * j + 2 * i + 1], sl2, -base));
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
        for (int r = 0; r < 4; r++) p[4 * kk + r] = pack_bf16(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}
__device__ __forceinline__ void fa_rescale(float (&o)[64], const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < 16; j++)
#pragma unroll
        for (int h = 0; h < 4; h++) o[4 * j + h] *= alpha[h >> 1];
}

// The blocks' order. A 1-D grid of B H nz blocks (nz tiles per (batch,
// head) pair) walks the pairs in groups of G: within a group the heaviest
// tile of every pair first, then the next, so that the blocks resident at
// once share the K and V (or Q and dO) of G pairs and find them in L2; with
// the pairs all in one group (G = B H) this is the order of a (H, B, nz)
// grid. Each block computes what it did in any order: the same bits.
// Returns the tile rank z (0: the heaviest); *b, *h the pair.
__device__ __forceinline__ int fa_block_tile(int H, int P, int nz, int G, int *b, int *h) {
    int L = blockIdx.x, p0 = L / (G * nz) * G, n = min(G, P - p0), j = L - p0 * nz;
    int p = p0 + j % n;
    *b = p / H, *h = p - p / H * H;
    return j / n;
}

// Pairs per group: device.cuda.attention_group, or (0, auto) as many as
// keep the K and V of T keys (T x 512 bytes a pair) within 16 MiB of L2.
static int fa_group(int B, int H, int T) {
    int g = cuda_settings()->attention_group, P = B * H;
    if (g <= 0) g = (int)((16u << 20) / ((unsigned)T * 2u * FA_HD * 2u));
    return g < 1 ? 1 : g > P ? P : g;
}

// grid: fa_block_tile's, of T / 128 tiles a pair; maps over q, k, v; out [B,T,H,128]; lse2 [B,H,T].
__global__ void __launch_bounds__(FA_THREADS, 1)
    attention_fwd_wgmma_kernel(bf16 *out, float *lse2, const __grid_constant__ FaMaps maps, int T, int H, int KV,
                               float sl2, int G) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    uint32_t base = (raw + 1023) & ~1023u;
    uint32_t qbar = base + FA_BARS;                // Q loaded
    uint32_t kfull = qbar + 8, vfull = kfull + 8 * FA_STAGES;
    uint32_t kempty = vfull + 8 * FA_STAGES, vempty = kempty + 8 * FA_STAGES;
    int b, h, nz = T / FA_BM, qb = nz - 1 - fa_block_tile(H, gridDim.x / nz, nz, G, &b, &h);
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
        mbar_wait(vfull + 8 * pv, pph);
        wgmma_fence();
        fa_qk(s, qa, ka);
        wgmma_commit();
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
    attention_fwd_wgmma_kernel<<<B * H * (T / FA_BM), FA_THREADS, FA_SMEM, cuda_stream()>>>(
        (bf16 *)out, lse2, maps, T, H, KV, (float)(1.4426950408889634 / sqrt((double)FA_HD)), fa_group(B, H, T));
    cudaLaunchCheck();
    return 0;
}

// ---- backward ---------------------------------------------------------------------------
//
// Two kernels after attention.cu's D = rowsum(dO * O), for head dim 128
// without GQA, T a multiple of 128 and no documents (the cases whose dQ goes
// through dS^T in scratch, attention.cu):
//   dK/dV   one block per (head, batch, 128 keys), 384 threads: the producer
//           warp loads the block's K and V once, then Q and dO tiles of 64
//           queries (and their lse2 and D), from the block's first key to T,
//           into a 3-deep ring; consumer warpgroup w owns keys 64 w.. of the
//           block, and per query tile computes S^T = K Q^T and dP^T = V dO^T
//           (m64n64, A and B from shared memory), P^T = 2^(S^T scale log2 e -
//           lse2), dS^T = P^T (dP^T - D) in registers, then dV += P^T dO
//           (m64n128, A from registers, dO read MN-major) and, with dS^T
//           written to shared memory, dK += dS^T Q (A that tile, Q read
//           MN-major); the copy engine stores the dS^T tile (BF16) to
//           scratch, and the next tile's S^T and dP^T are issued behind dK
//           (the kernel's comment says how); dK = scale dK.
//   dQ      one block per (head, batch, 128 queries): dQ = scale dS K over
//           the key tiles of 64 up to the diagonal, dS^T tiles and K tiles
//           streamed by the copy engine into a 6-deep ring; consumer
//           warpgroup w owns queries 64 w.. .
// dS^T scratch, per (batch row, head) ds_head_elems(T) BF16 (attention.cu's
// size): tiles of 64 keys x 64 queries (8 KB), key tile kt holding the
// query tiles from 2 (kt / 2) on (the key block of 128's first query tile:
// the same causal half plus diagonal blocks as attention.cu's layout), each
// tile already in the shared-memory layout the dQ kernel's wgmma reads (A
// MN-major: key row r, queries 8 c.. in 16-byte chunk c ^ (r % 8)), so that
// it arrives by a plain 1D bulk copy. Entries above the diagonal are
// written as 0.
namespace {

constexpr int FB_QT = 64;                 // queries per tile
constexpr int FB_QHALF = FB_QT * 128;     // 64 rows x 64 hd: 8 KB
constexpr int FB_QTILE = 2 * FB_QHALF;    // Q or dO tile: 16 KB
constexpr int FB_STAGES = 3;
constexpr int FB_K = 0, FB_V = FA_TILE;   // K, V of the block: 128 keys x 128 hd each
constexpr int FB_RING = 2 * FA_TILE;      // stage s: Q at FB_RING + s * 2 FB_QTILE, dO after it
constexpr int FB_ROWS = FB_RING + FB_STAGES * 2 * FB_QTILE; // stage s: lse2, then D of its 64 queries (512 bytes)
constexpr int FB_DS = (FB_ROWS + FB_STAGES * 2 * FB_QT * 4 + 1023) / 1024 * 1024; // dS^T tiles: 2 per warpgroup, 8 KB
constexpr int FB_BARS = FB_DS + 4 * 8192;
constexpr int FB_SMEM = FB_BARS + 8 * (1 + 2 * FB_STAGES) + 1024;
constexpr int DQ_STAGES = 6;
constexpr int DQ_STAGE = 2 * 8192 + 16384; // dS^T tiles of the two query halves, K tile of 64 keys
constexpr int DQ_BARS = DQ_STAGES * DQ_STAGE;
constexpr int DQ_SMEM = DQ_BARS + 8 * 2 * DQ_STAGES + 1024;

struct FbMaps {
    CUtensorMap q, k, v, dout; // box 64 hd x 64 rows
};

// The dS^T tile (key tile kt, query tile qt >= 2 (kt / 2)) of a head whose
// tiles start at ds: element offset.
__host__ __device__ __forceinline__ size_t ds_tile_off(int kt, int qt, int nq) {
    int a = kt >> 1, r = kt & 1;
    size_t first = (size_t)2 * a * nq - (size_t)2 * a * (a - 1) + (size_t)r * (nq - 2 * a);
    return (first + (size_t)(qt - 2 * a)) * 4096;
}

// The backward kernels' ring: n full barriers (`arrivals` arrivals and the
// bytes) and n empty ones (one arrival per consumer warp), and `once` (a
// load of their own, when not 0); then the whole block syncs.
__device__ __forceinline__ void fb_init_ring(uint32_t full, uint32_t empty, int n, int arrivals, uint32_t once) {
    if (threadIdx.x == 0) {
        if (once) mbar_init(once, 1);
        for (int s = 0; s < n; s++) {
            mbar_init(full + 8 * s, arrivals);
            mbar_init(empty + 8 * s, 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
}
// S^T = K Q^T into sacc and dP^T = V dO^T into pacc for one warpgroup's 64
// keys (K at ka, V at va) and the 64 queries of the stage at st: two
// commit groups, S^T first.
__device__ __forceinline__ void fb_sdp(float (&sacc)[32], float (&pacc)[32], uint32_t ka, uint32_t va, uint32_t st) {
    uint64_t q0d = smem_desc(st), q1d = smem_desc(st + FB_QHALF);
    uint64_t o0d = smem_desc(st + FB_QTILE), o1d = smem_desc(st + FB_QTILE + FB_QHALF);
    uint64_t k0d = smem_desc(ka), k1d = smem_desc(ka + FA_HALF), v0d = smem_desc(va), v1d = smem_desc(va + FA_HALF);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma_n64<0, 0>(sacc, k0d + 2 * kk, q0d + 2 * kk, kk > 0);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma_n64<0, 0>(sacc, k1d + 2 * kk, q1d + 2 * kk, 1);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma_n64<0, 0>(pacc, v0d + 2 * kk, o0d + 2 * kk, kk > 0);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma_n64<0, 0>(pacc, v1d + 2 * kk, o1d + 2 * kk, 1);
    wgmma_commit();
}
// acc (m64n128) (+)= A B with A from registers (frag[4 kk + r]: the k16
// step kk) and B the stage's 64 rows read MN-major (dO at b, two 64-wide hd
// blocks FB_QHALF apart), acc = A B when `first`; one commit group.
__device__ __forceinline__ void fb_acc(float (&acc)[64], const uint32_t (&frag)[16], uint32_t b, bool first) {
    uint64_t bd = smem_desc_mn_lbo(b, FB_QHALF);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const uint32_t a[4] = {frag[4 * kk], frag[4 * kk + 1], frag[4 * kk + 2], frag[4 * kk + 3]};
        wgmma_n128_rs<1>(acc, a, bd + (uint64_t)(2048 >> 4) * kk, kk > 0 || !first);
    }
    wgmma_commit();
}
// bytes (a multiple of 16) from shared src to global dst by the copy
// engine, in this thread's bulk group; fb_bulk_read_wait: this thread's
// bulk stores are done reading shared memory (.read) or all done.
__device__ __forceinline__ void fb_bulk_store(void *dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                 "cp.async.bulk.commit_group;\n" ::"l"(dst),
                 "r"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void fb_bulk_read_wait() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void fb_bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// An empty asm that reads and writes every register of r: the operands of a
// product in flight stay where they are (live, in the same registers) until
// the wait_group that retires it, so that ptxas neither reuses them nor
// serialises the products.
template <int N> __device__ __forceinline__ void reg_fence(uint32_t (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
// grid: fa_block_tile's, of T / 128 key blocks a pair; heaviest (first) key blocks first.
//
// A consumer warpgroup's query tile i: wait for S^T_i, dP^T_i (and tile i -
// 1's dV, dK); P^T_i and dS^T_i in registers; issue dV += P^T_i dO; write
// dS^T_i into its shared tile (two per warpgroup, alternating) while dV
// runs; issue dK += dS^T_i Q from it and the bulk store of it to scratch;
// once dV is done (its A registers free), issue S^T_i+1 and dP^T_i+1 behind
// dK. So the tensor cores hold this warpgroup's next three products while
// it waits, and the other warpgroup's elementwise work runs under them.
// dK from shared memory rather than registers keeps the dS^T registers free
// during the next products: with them in flight as well ptxas ran out of
// registers and serialised every product (C7512), and a wait for S^T alone
// with dP^T in flight was serialised too (C7515). The producer warp also
// copies the tile's lse2 and D (64 floats each) into the stage: a second
// arrival on its full barrier, after the bulk copies are issued.
__global__ void __launch_bounds__(FA_THREADS, 1)
    attention_bwd_dkv_wgmma_kernel(bf16 *dk, bf16 *dv, bf16 *dsT, const __grid_constant__ FbMaps maps,
                                   const float *lse2, const float *D, int T, int H, size_t ds_head, float sl2,
                                   float scale, int G) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    uint32_t base = (raw + 1023) & ~1023u;
    float *rows_s = (float *)(smem_raw + (base - raw) + FB_ROWS); // stage s: lse2 at 128 s, D at 128 s + 64
    uint32_t kvbar = base + FB_BARS, full = kvbar + 8, empty = full + 8 * FB_STAGES;
    int b, h, kb = fa_block_tile(H, gridDim.x / (T / FA_BN), T / FA_BN, G, &b, &h), k0 = kb * FA_BN;
    int nq = T / FB_QT, q_first = 2 * kb, ntiles = nq - q_first;
    int wg = threadIdx.x >> 7;
    const float *lse_h = lse2 + ((size_t)b * H + h) * T, *D_h = D + ((size_t)b * H + h) * T;
    fb_init_ring(full, empty, FB_STAGES, 2, kvbar);

    if (wg == 0) { // producer: warp 0; lane 0 issues the copies
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (threadIdx.x >= 32) return;
        int lane = threadIdx.x, row = b * T, c = h * FA_HD;
        if (lane == 0) {
            mbar_expect_tx(kvbar, 2 * FA_TILE);
            for (int hh = 0; hh < 2; hh++)
                for (int g = 0; g < 2; g++) {
                    uint32_t off = hh * FA_HALF + g * 8192;
                    tma_load_2d(base + FB_K + off, &maps.k, c + 64 * hh, row + k0 + 64 * g, kvbar);
                    tma_load_2d(base + FB_V + off, &maps.v, c + 64 * hh, row + k0 + 64 * g, kvbar);
                }
        }
        for (int i = 0; i < ntiles; i++) {
            int s = i % FB_STAGES, q0 = (q_first + i) * FB_QT;
            uint32_t ph = (i / FB_STAGES) & 1, st = base + FB_RING + s * 2 * FB_QTILE;
            float2 l2 = __ldg((const float2 *)(lse_h + q0) + lane), dd = __ldg((const float2 *)(D_h + q0) + lane);
            mbar_wait(empty + 8 * s, ph ^ 1);
            if (lane == 0) {
                int qr = row + q0;
                mbar_expect_tx(full + 8 * s, 2 * FB_QTILE);
                tma_load_2d(st, &maps.q, c, qr, full + 8 * s);
                tma_load_2d(st + FB_QHALF, &maps.q, c + 64, qr, full + 8 * s);
                tma_load_2d(st + FB_QTILE, &maps.dout, c, qr, full + 8 * s);
                tma_load_2d(st + FB_QTILE + FB_QHALF, &maps.dout, c + 64, qr, full + 8 * s);
            }
            ((float2 *)(rows_s + 128 * s))[lane] = l2;
            ((float2 *)(rows_s + 128 * s + 64))[lane] = dd;
            __syncwarp();
            if (lane == 0) mbar_arrive(full + 8 * s); // the rows' stores, ordered by __syncwarp, released
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    bool leader = lane == 0;
    int lrow = warp * 16 + (lane >> 2), lcol = 2 * (lane & 3); // rows lrow, lrow + 8 of the warpgroup's 64 keys
    int key0 = k0 + cw * 64;                                   // the warpgroup's first key
    uint32_t ka = base + FB_K + cw * 8192, va = base + FB_V + cw * 8192;
    bf16 *ds_h = dsT + ((size_t)b * H + h) * ds_head;
    uint32_t ds_s = base + FB_DS + cw * 2 * 8192;
    float dvacc[64], dkacc[64]; // zero at the first tile by the products' scale-d
    uint32_t pf[16], df[16];
    float sacc[32], pacc[32];
    mbar_wait(kvbar, 0);
    mbar_wait(full, 0);
    wgmma_fence();
    fb_sdp(sacc, pacc, ka, va, base + FB_RING);

    for (int i = 0; i < ntiles; i++) {
        int s = i % FB_STAGES, qt = q_first + i, q0 = qt * FB_QT;
        uint32_t st = base + FB_RING + s * 2 * FB_QTILE;
        const float *lse_s = rows_s + 128 * s, *D_s = lse_s + 64;
        // S^T_i, dP^T_i are in, and dK, dV of tile i - 1: release its stage.
        // (A wait for S^T_i alone, dP^T_i left in flight, made ptxas
        // serialise every product: C7515.)
        wgmma_wait<0>();
        reg_fence(sacc);
        reg_fence(pacc);
        reg_fence(dkacc);
        if (i > 0) {
            __syncwarp();
            if (leader) mbar_arrive(empty + 8 * ((i - 1) % FB_STAGES));
        }
        // P^T and dS^T = P^T (dP^T - D): acc[4 j + e] is key lrow + 8 (e / 2),
        // query q0 + 8 j + lcol + e % 2
        bool diag = q0 < key0 + 64;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float2 l2 = *(const float2 *)(lse_s + 8 * j + lcol), dd = *(const float2 *)(D_s + 8 * j + lcol);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = fast_exp2(fmaf(sacc[4 * j + e], sl2, -(e & 1 ? l2.y : l2.x)));
                if (diag && q0 + 8 * j + lcol + (e & 1) < key0 + lrow + 8 * (e >> 1)) p = 0.f;
                sacc[4 * j + e] = p;
                pacc[4 * j + e] = p * (pacc[4 * j + e] - (e & 1 ? dd.y : dd.x));
            }
        }
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                pf[4 * kk + r] = pack_bf16(sacc[8 * kk + 2 * r], sacc[8 * kk + 2 * r + 1]);
                df[4 * kk + r] = pack_bf16(pacc[8 * kk + 2 * r], pacc[8 * kk + 2 * r + 1]);
            }
        reg_fence(pf);
        reg_fence(dvacc);
        wgmma_fence();
        fb_acc(dvacc, pf, st + FB_QTILE, i == 0); // dV += P^T dO
        // dS^T into this warpgroup's tile i % 2 in the dQ kernel's layout
        // (word df[4 kk + r]: key lrow + 8 (r & 1), queries 16 kk + 8 (r >> 1)
        // + lcol, + 1), which is also dK's A operand, K-major; the bulk store
        // from it two tiles back is done reading (waited before the last
        // barrier), and so is the dK product (the wait at the top)
        uint32_t dst = ds_s + (i & 1) * 8192;
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int kr = lrow + 8 * (r & 1), ch = 2 * kk + (r >> 1);
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dst + kr * 128 + ((ch ^ (kr & 7)) << 4) + 2 * lcol),
                             "r"(df[4 * kk + r])
                             : "memory");
            }
        fence_proxy_async();
        if (threadIdx.x % 128 == 0) fb_bulk_read_wait(); // the last tile's store has read its tile
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + cw) : "memory");
        {
            uint64_t ad = smem_desc(dst), bd = smem_desc_mn_lbo(st, FB_QHALF);
            reg_fence(dkacc);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
                wgmma_n128<0, 1>(dkacc, ad + 2 * kk, bd + (uint64_t)(2048 >> 4) * kk, kk > 0 || i > 0); // dK += dS^T Q
            wgmma_commit();
        }
        if (threadIdx.x % 128 == 0) fb_bulk_store(ds_h + ds_tile_off(2 * kb + cw, qt, nq), dst, 8192);
        if (i + 1 < ntiles) { // S^T, dP^T of tile i + 1 queued behind dK
            int sn = (i + 1) % FB_STAGES;
            wgmma_wait<1>(); // dV += P^T_i dO is done: pf is free
            reg_fence(pf);
            reg_fence(dvacc);
            mbar_wait(full + 8 * sn, ((i + 1) / FB_STAGES) & 1);
            wgmma_fence();
            fb_sdp(sacc, pacc, ka, va, base + FB_RING + sn * 2 * FB_QTILE);
        }
    }
    wgmma_wait<0>();
    reg_fence(dvacc);
    reg_fence(dkacc);
    if (threadIdx.x % 128 == 0) fb_bulk_wait(); // before the block's shared memory goes

    // dK = scale dK, dV: rows key0 + lrow (+ 8) of [B, T, H, 128]
    size_t ld = (size_t)H * FA_HD;
    size_t o = ((size_t)b * T + key0 + lrow) * ld + (size_t)h * FA_HD + lcol;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        *(__nv_bfloat162 *)(dv + o + 8 * j) = __floats2bfloat162_rn(dvacc[4 * j], dvacc[4 * j + 1]);
        *(__nv_bfloat162 *)(dv + o + 8 * ld + 8 * j) = __floats2bfloat162_rn(dvacc[4 * j + 2], dvacc[4 * j + 3]);
        *(__nv_bfloat162 *)(dk + o + 8 * j) = __floats2bfloat162_rn(dkacc[4 * j] * scale, dkacc[4 * j + 1] * scale);
        *(__nv_bfloat162 *)(dk + o + 8 * ld + 8 * j) =
            __floats2bfloat162_rn(dkacc[4 * j + 2] * scale, dkacc[4 * j + 3] * scale);
    }
}

// grid: fa_block_tile's, heaviest (last) query blocks first. Key tile kt of
// 64: warpgroup w's dS^T tile (queries 64 w.. of the block) and the K tile.
__global__ void __launch_bounds__(FA_THREADS, 1)
    attention_bwd_dq_wgmma_kernel(bf16 *dq, const bf16 *dsT, const __grid_constant__ FbMaps maps, int T, int H,
                                  size_t ds_head, float scale, int G) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    uint32_t base = (raw + 1023) & ~1023u;
    uint32_t full = base + DQ_BARS, empty = full + 8 * DQ_STAGES;
    int b, h, nz = T / FA_BM, qb = nz - 1 - fa_block_tile(H, gridDim.x / nz, nz, G, &b, &h), q0 = qb * FA_BM;
    int nq = T / FB_QT, nkt = 2 * qb + 2; // key tiles 0 .. 2 qb + 1; warpgroup 0 skips the last
    int wg = threadIdx.x >> 7;
    const bf16 *ds_h = dsT + ((size_t)b * H + h) * ds_head;
    fb_init_ring(full, empty, DQ_STAGES, 1, 0);

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x != 0) return;
        int row = b * T, c = h * FA_HD;
        for (int kt = 0; kt < nkt; kt++) {
            int s = kt % DQ_STAGES;
            uint32_t ph = (kt / DQ_STAGES) & 1, st = base + s * DQ_STAGE;
            mbar_wait(empty + 8 * s, ph ^ 1);
            mbar_expect_tx(full + 8 * s, DQ_STAGE);
            bulk_load(st, ds_h + ds_tile_off(kt, 2 * qb, nq), 8192, full + 8 * s);
            bulk_load(st + 8192, ds_h + ds_tile_off(kt, 2 * qb + 1, nq), 8192, full + 8 * s);
            tma_load_2d(st + 16384, &maps.k, c, row + kt * 64, full + 8 * s);
            tma_load_2d(st + 16384 + 8192, &maps.k, c + 64, row + kt * 64, full + 8 * s);
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    bool leader = lane == 0;
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.f;
    int mine = nkt - 1 + cw; // warpgroup 0's queries end before the last key tile
    for (int kt = 0; kt < nkt; kt++) {
        int s = kt % DQ_STAGES;
        uint32_t ph = (kt / DQ_STAGES) & 1, st = base + s * DQ_STAGE;
        mbar_wait(full + 8 * s, ph);
        if (kt < mine) {
            uint64_t a = smem_desc_mn_lbo(st + cw * 8192, 8192), bk = smem_desc_mn_lbo(st + 16384, 8192);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
                wgmma_n128<1, 1>(acc, a + (uint64_t)(2048 >> 4) * kk, bk + (uint64_t)(2048 >> 4) * kk, 1);
            wgmma_commit();
            wgmma_wait<1>(); // the previous tile's products are done
        } else {
            wgmma_wait<0>();
        }
        __syncwarp();
        if (leader) {
            if (kt > 0) mbar_arrive(empty + 8 * ((kt - 1) % DQ_STAGES));
            if (kt == nkt - 1) mbar_arrive(empty + 8 * s); // (nothing waits for the last)
        }
    }
    wgmma_wait<0>();
    int lrow = warp * 16 + (lane >> 2), lcol = 2 * (lane & 3);
    size_t ld = (size_t)H * FA_HD;
    bf16 *og = dq + ((size_t)b * T + q0 + cw * 64 + lrow) * ld + (size_t)h * FA_HD + lcol;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        *(__nv_bfloat162 *)(og + 8 * j) = __floats2bfloat162_rn(acc[4 * j] * scale, acc[4 * j + 1] * scale);
        *(__nv_bfloat162 *)(og + 8 * ld + 8 * j) = __floats2bfloat162_rn(acc[4 * j + 2] * scale, acc[4 * j + 3] * scale);
    }
}

} // namespace

// Whether the wgmma backward takes the shape (nothing launched).
extern "C" int cuda_attention_backward_wgmma_takes(const int *doc_start, int B, int T, int H, int KV, int hd) {
    return !doc_start && hd == FA_HD && B > 0 && T > 0 && T % FA_BM == 0 && H == KV && B <= 65535 &&
           T / FA_BM <= 65535 && cuda_wgmma_device_ok() && cuda_tma_available();
}

// dK, dV and dS^T into dsT (ds_head elements per head, at least
// ds_head_elems(T)), then dQ, for B batch rows, given D; after
// cuda_attention_backward_wgmma_takes. 0, or -1 with nothing launched.
extern "C" int cuda_attention_backward_wgmma(void *dq, void *dk, void *dv, void *dsT, const void *dout,
                                             const float *lse2, const float *D, const void *q, const void *k,
                                             const void *v, int B, int T, int H, size_t ds_head) {
    if ((((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)dout | (uintptr_t)dsT) & 15) ||
        ((uintptr_t)lse2 | (uintptr_t)D) & 7)
        return -1;
    FbMaps maps;
    memset(&maps, 0, sizeof maps);
    uint64_t rows = (uint64_t)B * T, cols = (uint64_t)H * FA_HD;
    const CUtensorMapDataType bf = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    if (cuda_tensor_map_2d(&maps.q, q, bf, 2, cols, rows, 64, 64) || cuda_tensor_map_2d(&maps.k, k, bf, 2, cols, rows, 64, 64) ||
        cuda_tensor_map_2d(&maps.v, v, bf, 2, cols, rows, 64, 64) ||
        cuda_tensor_map_2d(&maps.dout, dout, bf, 2, cols, rows, 64, 64))
        return -1;
    static int set_kv, set_q;
    cuda_allow_smem((const void *)attention_bwd_dkv_wgmma_kernel, &set_kv, FB_SMEM);
    cuda_allow_smem((const void *)attention_bwd_dq_wgmma_kernel, &set_q, DQ_SMEM);
    int grid = B * H * (T / FA_BM), G = fa_group(B, H, T);
    float scale = (float)(1.0 / sqrt((double)FA_HD)), sl2 = (float)(1.4426950408889634 / sqrt((double)FA_HD));
    attention_bwd_dkv_wgmma_kernel<<<grid, FA_THREADS, FB_SMEM, cuda_stream()>>>(
        (bf16 *)dk, (bf16 *)dv, (bf16 *)dsT, maps, lse2, D, T, H, ds_head, sl2, scale, G);
    cudaLaunchCheck();
    attention_bwd_dq_wgmma_kernel<<<grid, FA_THREADS, DQ_SMEM, cuda_stream()>>>((bf16 *)dq, (const bf16 *)dsT, maps,
                                                                                T, H, ds_head, scale, G);
    cudaLaunchCheck();
    return 0;
}
