// Causal attention with GQA on BF16 tensor cores, FlashAttention-2 style:
// the T x T score matrix never reaches device memory.
//
// q [B,T,H,hd], k/v [B,T,KV,hd], out [B,T,H,hd]; head h reads kv head
// h / (H/KV); scale 1/sqrt(hd); query t sees keys s <= t, and with
// doc_start (intra-document masking, ops.h) only keys s >= doc_start[t].
//
// saved   [B,H,T] f32: log2-sum-exp2 of the scaled scores in base 2,
//         lse2[t] = log2(sum_{s<=t} 2^(q_t.k_s * scale * log2 e)), so that
//         backward recomputes p_ts = 2^(q_t.k_s * scale * log2 e - lse2[t]).
// scratch [B,H,T] f32: D[t] = rowsum(dout_t * out_t), the softmax backward's
//         sum_s p_ts dp_ts.
//
// Kernels (mma.sync m16n8k16 BF16 -> FP32; every warp owns 16 rows of the
// tile; K/V (or Q/dO) tiles stream through shared memory by cp.async,
// double-buffered, rows padded by 16 bytes so ldmatrix is conflict-free):
//   forward       one block per (head, batch, 64 queries); online softmax
//                 over key blocks of 64, FP32 statistics.
//   backward D    D = rowsum(dout * out).
//   backward dK/dV one block per (kv head, batch, 64 keys): loops over the
//                 heads of its group and the query blocks (32 rows at hd 128,
//                 64 below) at or after it, accumulating dK, dV in registers.
//   backward dQ   one block per (head, batch, 64 queries): loops over key
//                 blocks (32 at hd 128, 64 below), accumulating dQ in registers.
// Blocks with the most causal work are launched first (the tile index is
// grid.z, the slowest in launch order).
// No atomics anywhere: every output element is written by one thread after
// a fixed-order sum, so results are bit-reproducible run to run. The price
// is that backward recomputes QK^T and dO V^T in both of its big kernels
// (7 matmuls where FA2 with atomic dQ does 5) - except at head dim 128
// without GQA, where the dK/dV kernel also writes dS^T to scratch and dQ is
// a plain matmul after it (5 matmuls; see "dS^T in device memory" below).
//
// Head dims 16, 32, 64 and 128 are compiled; tails of T are masked
// (zero-filled loads, guarded stores).
//
// Documents. Every kernel has a DOC instance, launched when doc_start is
// given; without it the kernels are those of plain causal attention. With
// DOC, a query block starts at the key block of its first query's document
// (doc_start rises within a sequence, so that query's is the block's
// smallest), a key block's queries end where the document of its last key
// ends (doc_query_end), warps skip the tiles their documents do not reach,
// and tiles that a document boundary crosses are masked element by element.
// Variant 2's query-block kernels run a tile whose rows share one document
// as causal attention from its first key (M_UNIFORM), with none of the
// per-row code, which cost them 3-4% on a sequence without EOS; the first
// set keeps the per-row code throughout (the split measured slower there).
// With every doc_start 0 a DOC kernel computes what its causal twin does, in
// the same order: the same bits.
//
// Head dim 128 also has a second set of kernels ("variant 2", below the
// first), with bigger warp tiles; the launchers choose by shape.
//
// At head dim 128 with T a multiple of 128 and no documents, the forward
// runs on attention_wgmma.cu's TMA + wgmma kernel (device.cuda.attention_fwd:
// wgmma, the default), and so does the dS^T backward (attention_bwd: wgmma,
// the default), with the same saved lse2 and scratch; the kernels here run
// every other case, and all of them under mma_sync.
#include <math.h>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/ops_cuda.h"

// ---- PTX wrappers -----------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
// 16 bytes global -> shared; bytes = 0 writes zeros (rows past T).
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}
// c[16x8] += a[16x16] b[16x8]. Fragments (g = lane / 4, c = lane % 4):
// a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..), a3 (g+8, 2c+8..);
// b0 (k 2c..2c+1, n g), b1 (k 2c+8.., n g); c0,c1 (g, 2c..), c2,c3 (g+8, 2c..).
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ int div_up(int a, int b) { return (a + b - 1) / b; }

// ---- documents ------------------------------------------------------------
// ds is the doc_start of one sequence (ops.h): ds[t] is the first key query
// t sees, and rises with t.

// ds of row t, rows past T as the last row (their results are never stored).
__device__ __forceinline__ int doc_lo(const int *ds, int t, int T) { return ds[t < T ? t : T - 1]; }
// The end of the queries that see some key <= kmax (< T): the first t > kmax
// whose document starts after kmax, or T. A whole warp calls it: each round
// probes 32 evenly spread positions of [lo, hi) and keeps the stretch before
// the first one whose document starts after kmax (3 rounds at T = 4096).
__device__ int doc_query_end(const int *ds, int kmax, int T, int lane) {
    int lo = kmax + 1, hi = T; // the answer is in [lo, hi]: ds[t] > kmax from it on
    while (lo < hi) {
        int len = hi - lo, pos = lo + (int)((long)(lane + 1) * len / 32) - 1; // lane 31 probes hi - 1
        unsigned ball = __ballot_sync(0xffffffffu, pos >= lo && ds[pos] > kmax);
        int prev = __shfl_up_sync(0xffffffffu, pos, 1);
        if (!ball) return hi;
        int f = __ffs(ball) - 1;
        int pf = __shfl_sync(0xffffffffu, pos, f), pb = __shfl_sync(0xffffffffu, prev, f);
        if (f > 0 && pb + 1 > lo) lo = pb + 1;
        hi = pf;
    }
    return hi;
}
// How variant 2's query-block kernels run a tile: M_CAUSAL without
// documents; M_UNIFORM when every row of the tile is in one document,
// starting at key L: causal attention from L, with nothing per row; else
// M_DOCS, each row with its own first key (in the mask of the tiles a
// boundary crosses).
enum { M_CAUSAL, M_UNIFORM, M_DOCS };
// The mode of the tile of rows q0 .. q0 + BR - 1, and L = ds[q0] (its smallest).
__device__ __forceinline__ int doc_tile_mode(const int *ds, int q0, int BR, int T, int *L) {
    int a = ds[q0], z = ds[min(q0 + BR, T) - 1];
    *L = a;
    return a == z ? M_UNIFORM : M_DOCS;
}

// The first set's query-block kernels (a warp owns rows wrow .. wrow + 15 of
// the tile q0..): the key block (of BC) the tile starts at, j0; the first key
// of the thread's rows g, g + 8 (lo) and of the warp's first and last row
// (wlo, whi).
template <int BC>
__device__ __forceinline__ void doc_rows16(const int *ds, int T, int q0, int wrow, int g, int &j0, int (&lo)[2],
                                           int &wlo, int &whi) {
    j0 = ds[q0] / BC;
    lo[0] = doc_lo(ds, wrow + g, T), lo[1] = doc_lo(ds, wrow + g + 8, T);
    wlo = doc_lo(ds, wrow, T), whi = doc_lo(ds, wrow + 15, T);
}

// Entries of a warp's 16 x BC accumulator (rows g, g + 8: first keys lo)
// whose key k0 + column is before its row's document: to masked.
template <int BC>
__device__ __forceinline__ void mask_keys_below(float (&x)[BC / 8][4], const int (&lo)[2], int k0, int c4,
                                                float masked) {
#pragma unroll
    for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (k0 + nt * 8 + 2 * c4 + (e & 1) < lo[e >> 1]) x[nt][e] = masked;
}

// ---- tile helpers -----------------------------------------------------------
// A shared tile holds rows of HD bf16 at a stride of HD + 8 elements.

template <int HD>
struct Tile {
    static constexpr int STRIDE = HD + 8;
    static constexpr int CHUNKS = HD / 8; // 16-byte chunks per row
};

// Rows row0 .. row0+ROWS-1 of a [T, gstride] matrix into s; rows >= T zero.
template <int HD, int ROWS, int NT>
__device__ __forceinline__ void load_rows(bf16 *s, const bf16 *g, int row0, int T, size_t gstride) {
    constexpr int C = Tile<HD>::CHUNKS, TOTAL = ROWS * C;
#pragma unroll
    for (int it = 0; it < (TOTAL + NT - 1) / NT; it++) {
        int c = it * NT + threadIdx.x;
        if (TOTAL % NT == 0 || c < TOTAL) {
            int r = c / C, ch = c % C, t = row0 + r;
            const bf16 *src = g + (size_t)(t < T ? t : 0) * gstride + ch * 8;
            cp_async16(s + r * Tile<HD>::STRIDE + ch * 8, src, t < T ? 16 : 0);
        }
    }
}
// ROWS 4-byte words (floats, ints) src[row0 ..] into s; entries past T zero.
template <int ROWS, int NT, typename W>
__device__ __forceinline__ void load_words(W *s, const W *src, int row0, int T) {
    static_assert(sizeof(W) == 4, "4-byte words");
    for (int r = threadIdx.x; r < ROWS; r += NT) {
        int t = row0 + r;
        cp_async4(s + r, src + (t < T ? t : 0), t < T ? 4 : 0);
    }
}
// A fragment of rows r0..r0+15, cols k0..k0+15 of a row-major tile.
template <int HD>
__device__ __forceinline__ void frag_a(uint32_t a[4], const bf16 *s, int r0, int k0, int lane) {
    ldsm_x4(a, s + (r0 + (lane & 15)) * Tile<HD>::STRIDE + k0 + (lane >> 4) * 8);
}
// B fragments of two n-tiles (n0, n0+8) x k0..k0+15 from a tile stored
// [n][k] (K for Q K^T): b[0],b[1] for n0; b[2],b[3] for n0+8.
template <int HD>
__device__ __forceinline__ void frag_b_nk(uint32_t b[4], const bf16 *s, int n0, int k0, int lane) {
    ldsm_x4(b, s + (n0 + (lane & 7) + ((lane >> 4) << 3)) * Tile<HD>::STRIDE + k0 + ((lane >> 3) & 1) * 8);
}
// The same from a tile stored [k][n] (V for P V).
template <int HD>
__device__ __forceinline__ void frag_b_kn(uint32_t b[4], const bf16 *s, int k0, int n0, int lane) {
    ldsm_x4_trans(b, s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * Tile<HD>::STRIDE + n0 + (lane >> 4) * 8);
}
// acc[16 x 8*NTILES] += A (fragments af[HD/16] over k) * B, B from a [n][k] tile
// at rows n0.. (the "x y^T" product of two row-major operands).
template <int HD, int NTILES>
__device__ __forceinline__ void mma_abt_regs(float acc[][4], const uint32_t af[][4], const bf16 *s, int n0,
                                             int lane) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
        for (int np = 0; np < NTILES / 2; np++) {
            uint32_t b[4];
            frag_b_nk<HD>(b, s, n0 + np * 16, kk * 16, lane);
            mma_bf16(acc[2 * np], af[kk], b[0], b[1]);
            mma_bf16(acc[2 * np + 1], af[kk], b[2], b[3]);
        }
}
// The same with A read from shared memory rows a0.. of tile sa.
template <int HD, int NTILES>
__device__ __forceinline__ void mma_abt_smem(float acc[][4], const bf16 *sa, int a0, const bf16 *s, int lane) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t a[4];
        frag_a<HD>(a, sa, a0, kk * 16, lane);
#pragma unroll
        for (int np = 0; np < NTILES / 2; np++) {
            uint32_t b[4];
            frag_b_nk<HD>(b, s, np * 16, kk * 16, lane);
            mma_bf16(acc[2 * np], a, b[0], b[1]);
            mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
}
// acc[16 x HD] += P (accumulator layout, 16 x KDIM, rounded to BF16) * V,
// V a [k][n] tile of KDIM rows.
template <int HD, int KDIM>
__device__ __forceinline__ void mma_pv(float acc[][4], const float p[][4], const bf16 *s, int lane) {
#pragma unroll
    for (int kk = 0; kk < KDIM / 16; kk++) {
        uint32_t a[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]), pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                         pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                         pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int np = 0; np < HD / 16; np++) {
            uint32_t b[4];
            frag_b_kn<HD>(b, s, kk * 16, np * 16, lane);
            mma_bf16(acc[2 * np], a, b[0], b[1]);
            mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
}
// A warp's 16 x HD accumulator, times mul[row half], as BF16 into its rows
// r0.. of tile s (for a coalesced store after).
template <int HD>
__device__ __forceinline__ void stage_acc(bf16 *s, int r0, const float acc[][4], float mul0, float mul1,
                                          int lane) {
    int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++) {
        bf16 *p = s + (r0 + g) * Tile<HD>::STRIDE + nt * 8 + 2 * c;
        *(uint32_t *)p = pack_bf16(acc[nt][0] * mul0, acc[nt][1] * mul0);
        *(uint32_t *)(p + 8 * Tile<HD>::STRIDE) = pack_bf16(acc[nt][2] * mul1, acc[nt][3] * mul1);
    }
}
// A warp's 16 staged rows r0.. of s to global rows t0.. (rows >= T skipped).
template <int HD>
__device__ __forceinline__ void store_rows16(bf16 *g, size_t gstride, int t0, int T, const bf16 *s, int r0,
                                             int lane) {
    constexpr int C = Tile<HD>::CHUNKS;
#pragma unroll
    for (int it = 0; it < (16 * C + 31) / 32; it++) {
        int c = it * 32 + lane;
        if ((16 * C) % 32 == 0 || c < 16 * C) {
            int r = c / C, ch = c % C;
            if (t0 + r < T)
                *(uint4 *)(g + (size_t)(t0 + r) * gstride + ch * 8) =
                    *(const uint4 *)(s + (r0 + r) * Tile<HD>::STRIDE + ch * 8);
        }
    }
}

// ---- forward ----------------------------------------------------------------

template <int HD>
struct FwdCfg {
    static constexpr int WARPS = 4, BR = 16 * WARPS, BC = 64, NT = 32 * WARPS;
    static constexpr size_t SMEM = (size_t)(BR + 4 * BC) * Tile<HD>::STRIDE * sizeof(bf16);
    // blocks per SM: the DOC instance held to what the causal one reaches
    // (ptxas, nvcc 13.0: 227, 144, 104, 77 registers at hd 128, 64, 32, 16;
    // unbounded, the DOC instance took up to 25% more and lost a block);
    // minBlocks 0 leaves the causal instance unbounded, as it was (1 does not);
    // at hd 16 the 6 blocks spill 28 bytes and still measured 23% faster than 5
    static constexpr int MINB_DOC = HD >= 128 ? 2 : HD == 64 ? 3 : HD == 32 ? 4 : 6;
};

// grid (H, B, query blocks), heaviest (last) query blocks first.
template <int HD, bool DOC>
__global__ void __launch_bounds__(FwdCfg<HD>::NT, DOC ? FwdCfg<HD>::MINB_DOC : 0)
    attention_forward_kernel(bf16 *out, float *lse2, const bf16 *q, const bf16 *k, const bf16 *v,
                             const int *doc_start, int T, int H, int KV, float scale_log2) {
    using Cfg = FwdCfg<HD>;
    constexpr int BR = Cfg::BR, BC = Cfg::BC, NT = Cfg::NT, S = Tile<HD>::STRIDE;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem;  // [BR][S]
    bf16 *Ks = Qs + BR * S;   // [2][BC][S]
    bf16 *Vs = Ks + 2 * BC * S; // [2][BC][S]

    int h = blockIdx.x, b = blockIdx.y, qb = gridDim.z - 1 - blockIdx.z;
    int kvh = h / (H / KV);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, c4 = lane & 3;
    int q0 = qb * BR, wrow = q0 + warp * 16; // this warp's first query
    size_t qstride = (size_t)H * HD, kstride = (size_t)KV * HD;
    const bf16 *qg = q + ((size_t)b * T * H + h) * HD;
    const bf16 *kg = k + ((size_t)b * T * KV + kvh) * HD;
    const bf16 *vg = v + ((size_t)b * T * KV + kvh) * HD;
    int nkb = div_up(min(T, q0 + BR), BC);

    load_rows<HD, BR, NT>(Qs, qg, q0, T, qstride);
    int j0 = 0, lo[2] = {0, 0}, wlo = 0, whi = 0;
    if (DOC) doc_rows16<BC>(doc_start + (size_t)b * T, T, q0, wrow, g, j0, lo, wlo, whi);
    load_rows<HD, BC, NT>(Ks + (j0 & 1) * BC * S, kg, j0 * BC, T, kstride);
    load_rows<HD, BC, NT>(Vs + (j0 & 1) * BC * S, vg, j0 * BC, T, kstride);
    cp_async_commit();

    uint32_t qf[HD / 16][4];
    float o[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}; // rows g, g+8; l per thread, summed at the end

    for (int j = j0; j < nkb; j++) {
        if (j + 1 < nkb) {
            int st = (j + 1) & 1;
            load_rows<HD, BC, NT>(Ks + st * BC * S, kg, (j + 1) * BC, T, kstride);
            load_rows<HD, BC, NT>(Vs + st * BC * S, vg, (j + 1) * BC, T, kstride);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (j == j0) {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) frag_a<HD>(qf[kk], Qs, warp * 16, kk * 16, lane);
        }
        int k0 = j * BC;
        // some key of this block is visible to some row of this warp
        if (k0 <= wrow + 15 && (!DOC || k0 + BC - 1 >= wlo)) {
            const bf16 *Kt = Ks + (j & 1) * BC * S, *Vt = Vs + (j & 1) * BC * S;
            float s[BC / 8][4];
#pragma unroll
            for (int i = 0; i < BC / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
            mma_abt_regs<HD, BC / 8>(s, qf, Kt, 0, lane);

            bool mask = k0 + BC - 1 > wrow; // the block crosses the warp's diagonal
#pragma unroll
            for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x = s[nt][e] * scale_log2;
                    if (mask && k0 + nt * 8 + 2 * c4 + (e & 1) > wrow + g + (e >> 1) * 8) x = -INFINITY;
                    s[nt][e] = x;
                }
            // DOC: a document of the warp's rows starts after key k0; a
            // pass of its own, so that without one the loop above is the
            // causal kernel's (the merged test cost 3-4% at one wave)
            if (DOC && k0 < whi) mask_keys_below<BC>(s, lo, k0, c4, -INFINITY);
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float mx = m[r];
#pragma unroll
                for (int nt = 0; nt < BC / 8; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                float base = mx == -INFINITY ? 0.f : mx; // a row with nothing visible yet
                float alpha = fast_exp2(m[r] - base);
                m[r] = mx;
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < BC / 8; nt++) {
                    s[nt][2 * r] = fast_exp2(s[nt][2 * r] - base);
                    s[nt][2 * r + 1] = fast_exp2(s[nt][2 * r + 1] - base);
                    sum += s[nt][2 * r] + s[nt][2 * r + 1];
                }
                l[r] = l[r] * alpha + sum;
#pragma unroll
                for (int nt = 0; nt < HD / 8; nt++) {
                    o[nt][2 * r] *= alpha;
                    o[nt][2 * r + 1] *= alpha;
                }
            }
            mma_pv<HD, BC>(o, s, Vt, lane);
        }
        __syncthreads();
    }

    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        inv[r] = 1.f / l[r];
        int t = wrow + g + r * 8;
        if (c4 == 0 && t < T) lse2[((size_t)b * H + h) * T + t] = m[r] + log2f(l[r]);
    }
    // the warp's own Q rows are free since j == j0
    stage_acc<HD>(Qs, warp * 16, o, inv[0], inv[1], lane);
    __syncwarp();
    store_rows16<HD>(out + ((size_t)b * T * H + h) * HD, qstride, wrow, T, Qs, warp * 16, lane);
}

// ---- backward: D = rowsum(dout * out) -----------------------------------------

// One group of HD/8 threads per (b, t, h) row, 16-byte loads.
template <int HD>
__global__ void attention_backward_d_kernel(float *D, const bf16 *out, const bf16 *dout, int B, int T, int H) {
    constexpr int TPR = HD / 8;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t row = idx / TPR, nrows = (size_t)B * T * H;
    int part = idx % TPR;
    float sum = 0.f;
    if (row < nrows) {
        uint4 a = *(const uint4 *)(out + row * HD + part * 8);
        uint4 d = *(const uint4 *)(dout + row * HD + part * 8);
        const __nv_bfloat162 *a2 = (const __nv_bfloat162 *)&a, *d2 = (const __nv_bfloat162 *)&d;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 af = __bfloat1622float2(a2[i]), df = __bfloat1622float2(d2[i]);
            sum += af.x * df.x + af.y * df.y;
        }
    }
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (row < nrows && part == 0) {
        int h = row % H;
        size_t bt = row / H;
        int t = bt % T, b = bt / T;
        D[((size_t)b * H + h) * T + t] = sum;
    }
}

// ---- backward: dK, dV ---------------------------------------------------------

template <int HD>
struct BwdKVCfg {
    static constexpr int WARPS = 4, BC = 16 * WARPS, NT = 32 * WARPS;
    static constexpr int BR = HD >= 128 ? 32 : 64; // queries per step
    static constexpr size_t SMEM =
        (size_t)(2 * BC + 4 * BR) * Tile<HD>::STRIDE * sizeof(bf16) + 4 * BR * sizeof(float);
    static constexpr size_t SMEM_DOC = SMEM + 2 * BR * sizeof(int); // and the queries' doc_start
};

// grid (KV, B, key blocks), heaviest (first) key blocks first.
template <int HD, bool DOC>
__global__ void __launch_bounds__(BwdKVCfg<HD>::NT)
    attention_backward_dkv_kernel(bf16 *dk, bf16 *dv, const bf16 *q, const bf16 *k, const bf16 *v,
                                  const bf16 *dout, const float *lse2, const float *D, const int *doc_start,
                                  int T, int H, int KV, float scale_log2, float scale) {
    using Cfg = BwdKVCfg<HD>;
    constexpr int BR = Cfg::BR, BC = Cfg::BC, NT = Cfg::NT, S = Tile<HD>::STRIDE;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Ks = (bf16 *)smem;    // [BC][S]
    bf16 *Vs = Ks + BC * S;     // [BC][S]
    bf16 *Qs = Vs + BC * S;     // [2][BR][S]
    bf16 *dOs = Qs + 2 * BR * S; // [2][BR][S]
    float *Ls = (float *)(dOs + 2 * BR * S); // [2][BR]
    float *Ds = Ls + 2 * BR;                 // [2][BR]
    int *DSs = (int *)(Ds + 2 * BR);         // [2][BR] (DOC)

    int kvh = blockIdx.x, b = blockIdx.y, kb = blockIdx.z;
    int group = H / KV;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, c4 = lane & 3;
    int k0 = kb * BC, wkey = k0 + warp * 16; // this warp's first key
    size_t qstride = (size_t)H * HD, kstride = (size_t)KV * HD;
    const bf16 *kg = k + ((size_t)b * T * KV + kvh) * HD;
    const bf16 *vg = v + ((size_t)b * T * KV + kvh) * HD;
    const int *docs = DOC ? doc_start + (size_t)b * T : NULL;
    // DOC: the query blocks end with the document of the block's last key
    int i0 = k0 / BR, nqb = DOC ? div_up(doc_query_end(docs, min(k0 + BC, T) - 1, T, lane), BR) : div_up(T, BR);
    int nsteps = group * (nqb - i0);

    // the steps run over the heads of the group, and for each over the query
    // blocks i0 .. nqb-1; (ld_h, ld_i) is the next step to load
    int ld_h = kvh * group, ld_i = i0;
    auto load_next = [&](int st) {
        size_t hoff = ((size_t)b * T * H + ld_h) * HD, loff = ((size_t)b * H + ld_h) * T;
        int qr = ld_i * BR;
        load_rows<HD, BR, NT>(Qs + st * BR * S, q + hoff, qr, T, qstride);
        load_rows<HD, BR, NT>(dOs + st * BR * S, dout + hoff, qr, T, qstride);
        load_words<BR, NT>(Ls + st * BR, lse2 + loff, qr, T);
        load_words<BR, NT>(Ds + st * BR, D + loff, qr, T);
        if (DOC) load_words<BR, NT>(DSs + st * BR, docs, qr, T);
        if (++ld_i == nqb) { ld_i = i0; ld_h++; }
    };
    load_rows<HD, BC, NT>(Ks, kg, k0, T, kstride);
    load_rows<HD, BC, NT>(Vs, vg, k0, T, kstride);
    load_next(0);
    cp_async_commit();

    float dka[HD / 8][4], dva[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[i][e] = dva[i][e] = 0.f;

    int cur_i = i0; // query block of the step being computed
    for (int n = 0; n < nsteps; n++) {
        if (n + 1 < nsteps) {
            load_next((n + 1) & 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        int st = n & 1, qr = cur_i * BR;
        if (++cur_i == nqb) cur_i = i0;
        const int *DSt = DSs + st * BR; // (DOC) rises over the step's queries < T
        // some query of this step sees some key of this warp
        if (qr + BR - 1 >= wkey && (!DOC || DSt[0] <= wkey + 15)) {
            const bf16 *Qt = Qs + st * BR * S, *dOt = dOs + st * BR * S;
            const float *Lt = Ls + st * BR, *Dt = Ds + st * BR;
            // P^T [16 keys x BR queries]
            float p[BR / 8][4];
#pragma unroll
            for (int i = 0; i < BR / 8; i++) p[i][0] = p[i][1] = p[i][2] = p[i][3] = 0.f;
            mma_abt_smem<HD, BR / 8>(p, Ks, warp * 16, Qt, lane);
            bool mask = qr < wkey + 15 || qr + BR > T;
#pragma unroll
            for (int nt = 0; nt < BR / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int qq = nt * 8 + 2 * c4 + (e & 1), t = qr + qq;
                    float x = fast_exp2(p[nt][e] * scale_log2 - Lt[qq]);
                    if (mask && (t < wkey + g + (e >> 1) * 8 || t >= T)) x = 0.f;
                    p[nt][e] = x;
                }
            // DOC: a query of the step is in a document after the warp's
            // first key (a pass of its own, as in the forward; entries past
            // T are 0, the last query's the largest)
            if (DOC && DSt[min(BR, T - qr) - 1] > wkey) {
#pragma unroll
                for (int nt = 0; nt < BR / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (wkey + g + (e >> 1) * 8 < DSt[nt * 8 + 2 * c4 + (e & 1)]) p[nt][e] = 0.f;
            }
            // dV += P^T dO
            mma_pv<HD, BR>(dva, p, dOt, lane);
            // dP^T = V dO^T, then dS^T = P^T (dP^T - D)
            float ds[BR / 8][4];
#pragma unroll
            for (int i = 0; i < BR / 8; i++) ds[i][0] = ds[i][1] = ds[i][2] = ds[i][3] = 0.f;
            mma_abt_smem<HD, BR / 8>(ds, Vs, warp * 16, dOt, lane);
#pragma unroll
            for (int nt = 0; nt < BR / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) ds[nt][e] = p[nt][e] * (ds[nt][e] - Dt[nt * 8 + 2 * c4 + (e & 1)]);
            // dK += dS^T Q (times scale at the end)
            mma_pv<HD, BR>(dka, ds, Qt, lane);
        }
        __syncthreads();
    }

    // the warp's own K and V rows are free now
    stage_acc<HD>(Ks, warp * 16, dka, scale, scale, lane);
    stage_acc<HD>(Vs, warp * 16, dva, 1.f, 1.f, lane);
    __syncwarp();
    size_t koff = ((size_t)b * T * KV + kvh) * HD;
    store_rows16<HD>(dk + koff, kstride, wkey, T, Ks, warp * 16, lane);
    store_rows16<HD>(dv + koff, kstride, wkey, T, Vs, warp * 16, lane);
}

// ---- backward: dQ -------------------------------------------------------------

template <int HD>
struct BwdQCfg {
    static constexpr int WARPS = 4, BR = 16 * WARPS, NT = 32 * WARPS;
    static constexpr int BC = HD >= 128 ? 32 : 64; // keys per step
    static constexpr size_t SMEM = (size_t)(2 * BR + 4 * BC) * Tile<HD>::STRIDE * sizeof(bf16);
    // as FwdCfg's (causal: 232, 168, 106, 60 registers; DOC unbounded 208 at
    // hd 64), but unbounded at hd 16 (0): 8 blocks spill 128 bytes, and 6
    // (24 bytes) measured 6% slower than unbounded (96 registers, 5 blocks)
    static constexpr int MINB_DOC = HD >= 128 ? 2 : HD == 64 ? 3 : HD == 32 ? 4 : 0;
};

// grid (H, B, query blocks), heaviest (last) query blocks first.
template <int HD, bool DOC>
__global__ void __launch_bounds__(BwdQCfg<HD>::NT, DOC ? BwdQCfg<HD>::MINB_DOC : 0)
    attention_backward_dq_kernel(bf16 *dq, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *dout,
                                 const float *lse2, const float *D, const int *doc_start, int T, int H, int KV,
                                 float scale_log2, float scale) {
    using Cfg = BwdQCfg<HD>;
    constexpr int BR = Cfg::BR, BC = Cfg::BC, NT = Cfg::NT, S = Tile<HD>::STRIDE;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem;    // [BR][S]
    bf16 *dOs = Qs + BR * S;    // [BR][S]
    bf16 *Ks = dOs + BR * S;    // [2][BC][S]
    bf16 *Vs = Ks + 2 * BC * S; // [2][BC][S]

    int h = blockIdx.x, b = blockIdx.y, qb = gridDim.z - 1 - blockIdx.z;
    int kvh = h / (H / KV);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, c4 = lane & 3;
    int q0 = qb * BR, wrow = q0 + warp * 16;
    size_t qstride = (size_t)H * HD, kstride = (size_t)KV * HD;
    size_t qoff = ((size_t)b * T * H + h) * HD, loff = ((size_t)b * H + h) * T;
    const bf16 *kg = k + ((size_t)b * T * KV + kvh) * HD;
    const bf16 *vg = v + ((size_t)b * T * KV + kvh) * HD;
    int nkb = div_up(min(T, q0 + BR), BC);

    load_rows<HD, BR, NT>(Qs, q + qoff, q0, T, qstride);
    load_rows<HD, BR, NT>(dOs, dout + qoff, q0, T, qstride);
    int j0 = 0, lo[2] = {0, 0}, wlo = 0, whi = 0;
    if (DOC) doc_rows16<BC>(doc_start + (size_t)b * T, T, q0, wrow, g, j0, lo, wlo, whi);
    load_rows<HD, BC, NT>(Ks + (j0 & 1) * BC * S, kg, j0 * BC, T, kstride);
    load_rows<HD, BC, NT>(Vs + (j0 & 1) * BC * S, vg, j0 * BC, T, kstride);
    cp_async_commit();

    float lrow[2], drow[2]; // rows g, g+8 of this warp
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int t = wrow + g + r * 8;
        lrow[r] = t < T ? lse2[loff + t] : 0.f;
        drow[r] = t < T ? D[loff + t] : 0.f;
    }
    uint32_t qf[HD / 16][4], df[HD / 16][4];
    float dqa[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) dqa[i][0] = dqa[i][1] = dqa[i][2] = dqa[i][3] = 0.f;

    for (int j = j0; j < nkb; j++) {
        if (j + 1 < nkb) {
            int st = (j + 1) & 1;
            load_rows<HD, BC, NT>(Ks + st * BC * S, kg, (j + 1) * BC, T, kstride);
            load_rows<HD, BC, NT>(Vs + st * BC * S, vg, (j + 1) * BC, T, kstride);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (j == j0) {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                frag_a<HD>(qf[kk], Qs, warp * 16, kk * 16, lane);
                frag_a<HD>(df[kk], dOs, warp * 16, kk * 16, lane);
            }
        }
        int k0 = j * BC;
        if (k0 <= wrow + 15 && (!DOC || k0 + BC - 1 >= wlo)) {
            const bf16 *Kt = Ks + (j & 1) * BC * S, *Vt = Vs + (j & 1) * BC * S;
            float p[BC / 8][4], ds[BC / 8][4];
#pragma unroll
            for (int i = 0; i < BC / 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) p[i][e] = ds[i][e] = 0.f;
            mma_abt_regs<HD, BC / 8>(p, qf, Kt, 0, lane);
            bool mask = k0 + BC - 1 > wrow;
#pragma unroll
            for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x = fast_exp2(p[nt][e] * scale_log2 - lrow[e >> 1]);
                    if (mask && k0 + nt * 8 + 2 * c4 + (e & 1) > wrow + g + (e >> 1) * 8) x = 0.f;
                    p[nt][e] = x;
                }
            if (DOC && k0 < whi) mask_keys_below<BC>(p, lo, k0, c4, 0.f); // as in the forward
            mma_abt_regs<HD, BC / 8>(ds, df, Vt, 0, lane); // dP = dO V^T
#pragma unroll
            for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) ds[nt][e] = p[nt][e] * (ds[nt][e] - drow[e >> 1]);
            mma_pv<HD, BC>(dqa, ds, Kt, lane); // dQ += dS K
        }
        __syncthreads();
    }

    stage_acc<HD>(Qs, warp * 16, dqa, scale, scale, lane);
    __syncwarp();
    store_rows16<HD>(dq + qoff, qstride, wrow, T, Qs, warp * 16, lane);
}

// ---- variant 2, head dim 128 ----------------------------------------------------
//
// The same function, and the same arithmetic in the same order as the kernels
// above (so the outputs are expected to be bit-identical to them), on bigger
// warp tiles so that each fragment loaded from shared memory feeds more MMAs
// (ldmatrix bandwidth, not the tensor cores, bounds the kernels above):
//   forward   4 warps x 32 query rows (BR = 128), BC = 64; Q fragments are
//             re-read from shared memory (Q in registers would not fit beside
//             the 32 x 128 accumulator); K/V double-buffered; the causal
//             mask only on the key blocks that cross the warp's diagonal.
//             Per 64-key block a warp does 256 MMAs on 80 ldmatrix.x4 (the
//             kernel above: 128 on 64).
//   dQ        4 warps x 32 query rows (BR = 128), 32 keys per step, Q and dO
//             re-read from shared memory: 192 MMAs on 80 ldmatrix (was 96 on 48).
//   dK/dV     8 warps, 128 keys per block, 64 queries per step, FA2's split
//             through shared memory: phase 1, warp tile 32 keys x 32 queries
//             of P^T and dS^T (to shared memory as the BF16 that mma_pv
//             packs above); phase 2, warp tile 32 keys x 128 columns of dV
//             (warps 0-3) or dK (warps 4-7) from those. Per step a warp does
//             256 MMAs on 104 ldmatrix.x4 and 32 4-byte stores (was 256 on
//             160).
// Selected by shape (see the launchers); sizes of saved and scratch
// are those of the kernels above.

namespace v2 {

constexpr int HD = 128, S = HD + 8; // tile row stride (elements), as Tile<128>

// a: rows r0..r0+15, cols k0..k0+15 of a row-major tile of stride STR.
template <int STR>
__device__ __forceinline__ void ld_a(uint32_t a[4], const bf16 *s, int r0, int k0, int lane) {
    ldsm_x4(a, s + (r0 + (lane & 15)) * STR + k0 + (lane >> 4) * 8);
}
// b of n-tiles n0, n0+8 over k0..k0+15 from a tile stored [n][k].
template <int STR>
__device__ __forceinline__ void ld_b_nk(uint32_t b[4], const bf16 *s, int n0, int k0, int lane) {
    ldsm_x4(b, s + (n0 + (lane & 7) + ((lane >> 4) << 3)) * STR + k0 + ((lane >> 3) & 1) * 8);
}
// The same from a tile stored [k][n].
template <int STR>
__device__ __forceinline__ void ld_b_kn(uint32_t b[4], const bf16 *s, int k0, int n0, int lane) {
    ldsm_x4_trans(b, s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * STR + n0 + (lane >> 4) * 8);
}
// acc[2][NT8][4] (rows ra..ra+31 of A x n-tiles 8*NT8 from nb..) += A B^T over
// k = 0..HD-1, A and B row-major [row][k] tiles of stride S; k outermost, as
// mma_abt_regs / mma_abt_smem above.
template <int NT8>
__device__ __forceinline__ void abt32(float (&acc)[2][NT8][4], const bf16 *sa, int ra, const bf16 *sb, int nb,
                                      int lane) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t a0[4], a1[4];
        ld_a<S>(a0, sa, ra, kk * 16, lane);
        ld_a<S>(a1, sa, ra + 16, kk * 16, lane);
#pragma unroll
        for (int np = 0; np < NT8 / 2; np++) {
            uint32_t b[4];
            ld_b_nk<S>(b, sb, nb + np * 16, kk * 16, lane);
            mma_bf16(acc[0][2 * np], a0, b[0], b[1]);
            mma_bf16(acc[0][2 * np + 1], a0, b[2], b[3]);
            mma_bf16(acc[1][2 * np], a1, b[0], b[1]);
            mma_bf16(acc[1][2 * np + 1], a1, b[2], b[3]);
        }
    }
}
// acc[2][HD/8][4] += A (rows of two 16-row tiles, fragments a[0], a[1], k
// = k0..k0+15) * B (rows k0.. of a [k][n] tile of stride S, all HD columns).
__device__ __forceinline__ void mma2_bkn(float (&acc)[2][HD / 8][4], const uint32_t (&a)[2][4], const bf16 *s, int k0,
                                         int lane) {
#pragma unroll
    for (int np = 0; np < HD / 16; np++) {
        uint32_t b[4];
        ld_b_kn<S>(b, s, k0, np * 16, lane);
        mma_bf16(acc[0][2 * np], a[0], b[0], b[1]);
        mma_bf16(acc[0][2 * np + 1], a[0], b[2], b[3]);
        mma_bf16(acc[1][2 * np], a[1], b[0], b[1]);
        mma_bf16(acc[1][2 * np + 1], a[1], b[2], b[3]);
    }
}
// acc[2][HD/8][4] += P (2 x 16 rows, accumulator layout, KDIM columns,
// rounded to BF16) * V (a [k][n] tile of stride S, KDIM rows), as mma_pv.
template <int KDIM>
__device__ __forceinline__ void pv32(float (&acc)[2][HD / 8][4], const float (&p)[2][KDIM / 8][4], const bf16 *s,
                                     int lane) {
#pragma unroll
    for (int kk = 0; kk < KDIM / 16; kk++) {
        uint32_t a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            a[mt][0] = pack_bf16(p[mt][2 * kk][0], p[mt][2 * kk][1]);
            a[mt][1] = pack_bf16(p[mt][2 * kk][2], p[mt][2 * kk][3]);
            a[mt][2] = pack_bf16(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
            a[mt][3] = pack_bf16(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
        }
        mma2_bkn(acc, a, s, kk * 16, lane);
    }
}
// Rows row0 .. row0+ROWS-1 of a [T, gstride] matrix into s (stride S); rows
// >= T zero. As load_rows, but rolled, so that the addresses of all the
// block's copies are not kept live across the key loop (registers).
template <int ROWS, int NT>
__device__ __forceinline__ void load_tile(bf16 *s, const bf16 *g, int row0, int T, size_t gstride) {
    constexpr int C = HD / 8, RPI = NT / C; // 16-byte chunks per row, rows per pass
    static_assert(NT % C == 0 && ROWS % RPI == 0, "tile shape");
    int r = threadIdx.x / C, ch = threadIdx.x % C;
#pragma unroll 1
    for (int rr = r; rr < ROWS; rr += RPI) {
        int t = row0 + rr;
        const bf16 *src = g + (size_t)(t < T ? t : 0) * gstride + ch * 8;
        cp_async16(s + rr * S + ch * 8, src, t < T ? 16 : 0);
    }
}
template <int N>
__device__ __forceinline__ void zero(float (&x)[2][N][4]) {
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int i = 0; i < N; i++) x[mt][i][0] = x[mt][i][1] = x[mt][i][2] = x[mt][i][3] = 0.f;
}

// Sets x of the keys k0.. (accumulator layout, two 16-row tiles) that precede
// their row's first key to masked: M_DOCS, lo the doc_start of the warp's 32
// rows (a pass of its own, one row's lo live at a time: registers are
// short); M_UNIFORM, L for every row.
template <int MODE, int NT8>
__device__ __forceinline__ void mask_doc(float (&x)[2][NT8][4], const int *lo, int L, int k0, float masked,
                                         int lane) {
    int g = lane >> 2, c4 = lane & 3;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int first = (MODE == M_DOCS ? lo[mt * 16 + g + r * 8] : L) - k0 - 2 * c4; // columns nt * 8 + c below
#pragma unroll
            for (int nt = 0; nt < NT8; nt++)
#pragma unroll
                for (int c = 0; c < 2; c++)
                    if (nt * 8 + c < first) x[mt][nt][2 * r + c] = masked;
        }
}

// ---- forward ----

struct Fwd {
    static constexpr int WARPS = 4, BR = 32 * WARPS, BC = 64, NT = 32 * WARPS;
    static constexpr size_t SMEM = (size_t)(BR + 4 * BC) * S * sizeof(bf16); // 104,448: 2 blocks per SM
    static constexpr size_t SMEM_DOC = SMEM + BR * sizeof(int);               // and the rows' doc_start
};

// One key block for the warp's 32 rows (wrow.., at rows qr.. of Qs): the
// online-softmax step of attention_forward_kernel, for two 16-row tiles.
// MASK: the causal mask, and with documents the documents' (mask_doc).
template <bool MASK, int MODE>
__device__ __forceinline__ void fwd_block(float (&o)[2][HD / 8][4], float (&m)[2][2], float (&l)[2][2],
                                          const bf16 *Qs, int qr, const bf16 *Kt, const bf16 *Vt, int wrow,
                                          int k0, const int *lo, int L, float scale_log2, int lane) {
    constexpr int BC = Fwd::BC;
    int g = lane >> 2, c4 = lane & 3;
    float s[2][BC / 8][4];
    zero(s);
    abt32<BC / 8>(s, Qs, qr, Kt, 0, lane);
    if (MASK && MODE != M_CAUSAL) mask_doc<MODE>(s, lo, L, k0, -INFINITY, lane);
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = __fmul_rn(s[mt][nt][e], scale_log2); // not fused with the "- base" below, as above
                if (MASK && k0 + nt * 8 + 2 * c4 + (e & 1) > wrow + mt * 16 + g + (e >> 1) * 8) x = -INFINITY;
                s[mt][nt][e] = x;
            }
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = m[mt][r];
#pragma unroll
            for (int nt = 0; nt < BC / 8; nt++) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float base = mx == -INFINITY ? 0.f : mx;
            float alpha = fast_exp2(m[mt][r] - base);
            m[mt][r] = mx;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < BC / 8; nt++) {
                s[mt][nt][2 * r] = fast_exp2(s[mt][nt][2 * r] - base);
                s[mt][nt][2 * r + 1] = fast_exp2(s[mt][nt][2 * r + 1] - base);
                sum += s[mt][nt][2 * r] + s[mt][nt][2 * r + 1];
            }
            l[mt][r] = l[mt][r] * alpha + sum;
#pragma unroll
            for (int nt = 0; nt < HD / 8; nt++) {
                o[mt][nt][2 * r] *= alpha;
                o[mt][nt][2 * r + 1] *= alpha;
            }
        }
    pv32<BC>(o, s, Vt, lane);
}

// One query block of 128 in mode MODE (L: doc_tile_mode's).
template <int MODE>
__device__ __forceinline__ void forward_tile(bf16 *out, float *lse2, const bf16 *q, const bf16 *k, const bf16 *v,
                                             const int *doc_start, int T, int H, int KV, float scale_log2, int L) {
    constexpr bool DOC = MODE == M_DOCS;
    constexpr int BR = Fwd::BR, BC = Fwd::BC, NT = Fwd::NT;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem;    // [BR][S]
    bf16 *Ks = Qs + BR * S;     // [2][BC][S]
    bf16 *Vs = Ks + 2 * BC * S; // [2][BC][S]
    int *Ls = (int *)(Vs + 2 * BC * S); // [BR] the rows' doc_start (DOC)

    int h = blockIdx.x, b = blockIdx.y, qb = gridDim.z - 1 - blockIdx.z;
    int kvh = h / (H / KV);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, c4 = lane & 3;
    int q0 = qb * BR, wrow = q0 + warp * 32; // this warp's first query
    size_t qstride = (size_t)H * HD, kstride = (size_t)KV * HD;
    const bf16 *qg = q + ((size_t)b * T * H + h) * HD;
    const bf16 *kg = k + ((size_t)b * T * KV + kvh) * HD;
    const bf16 *vg = v + ((size_t)b * T * KV + kvh) * HD;
    int nkb = div_up(min(T, q0 + BR), BC);

    load_tile<BR, NT>(Qs, qg, q0, T, qstride);
    // documents: keys from the block of L; DOC: the rows' doc_start
    int j0 = MODE != M_CAUSAL ? L / BC : 0;
    if (DOC) load_words<BR, NT>(Ls, doc_start + (size_t)b * T, q0, T);
    load_tile<BC, NT>(Ks + (j0 & 1) * BC * S, kg, j0 * BC, T, kstride);
    load_tile<BC, NT>(Vs + (j0 & 1) * BC * S, vg, j0 * BC, T, kstride);
    cp_async_commit();

    float o[2][HD / 8][4];
    zero(o);
    float m[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}}, l[2][2] = {{0.f, 0.f}, {0.f, 0.f}};

    for (int j = j0; j < nkb; j++) {
        cp_async_wait<0>();
        __syncthreads(); // block j is in; every warp is done with block j - 1's buffers
        if (j + 1 < nkb) {
            int st = (j + 1) & 1;
            load_tile<BC, NT>(Ks + st * BC * S, kg, (j + 1) * BC, T, kstride);
            load_tile<BC, NT>(Vs + st * BC * S, vg, (j + 1) * BC, T, kstride);
            cp_async_commit();
        }
        int k0 = j * BC;
        const int *lo = Ls + warp * 32; // (DOC) the warp's rows; rows past T hold 0
        // some key of this block is visible to some row of this warp
        if (k0 <= wrow + 31 && (!DOC || k0 + BC - 1 >= lo[0])) {
            const bf16 *Kt = Ks + (j & 1) * BC * S, *Vt = Vs + (j & 1) * BC * S;
            if (k0 + BC - 1 > wrow || (DOC && k0 < lo[min(31, T - 1 - wrow)]) || (MODE == M_UNIFORM && k0 < L))
                fwd_block<true, MODE>(o, m, l, Qs, warp * 32, Kt, Vt, wrow, k0, lo, L, scale_log2, lane);
            else
                fwd_block<false, MODE>(o, m, l, Qs, warp * 32, Kt, Vt, wrow, k0, lo, L, scale_log2, lane);
        }
    }

    float inv[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lr = l[mt][r];
            lr += __shfl_xor_sync(0xffffffffu, lr, 1);
            lr += __shfl_xor_sync(0xffffffffu, lr, 2);
            inv[mt][r] = 1.f / lr;
            int t = wrow + mt * 16 + g + r * 8;
            if (c4 == 0 && t < T) lse2[((size_t)b * H + h) * T + t] = m[mt][r] + log2f(lr);
        }
    // only this warp reads its 32 rows of Qs
    __syncwarp();
    stage_acc<HD>(Qs, warp * 32, o[0], inv[0][0], inv[0][1], lane);
    stage_acc<HD>(Qs, warp * 32 + 16, o[1], inv[1][0], inv[1][1], lane);
    __syncwarp();
    bf16 *og = out + ((size_t)b * T * H + h) * HD;
    store_rows16<HD>(og, qstride, wrow, T, Qs, warp * 32, lane);
    store_rows16<HD>(og, qstride, wrow + 16, T, Qs, warp * 32 + 16, lane);
}

// grid (H, B, query blocks of 128), heaviest (last) query blocks first.
template <bool DOC>
__global__ void __launch_bounds__(Fwd::NT, 2)
    forward_kernel(bf16 *out, float *lse2, const bf16 *q, const bf16 *k, const bf16 *v, const int *doc_start, int T,
                   int H, int KV, float scale_log2) {
    if (!DOC) {
        forward_tile<M_CAUSAL>(out, lse2, q, k, v, doc_start, T, H, KV, scale_log2, 0);
        return;
    }
    int L, q0 = (gridDim.z - 1 - blockIdx.z) * Fwd::BR;
    if (doc_tile_mode(doc_start + (size_t)blockIdx.y * T, q0, Fwd::BR, T, &L) == M_UNIFORM)
        forward_tile<M_UNIFORM>(out, lse2, q, k, v, doc_start, T, H, KV, scale_log2, L);
    else
        forward_tile<M_DOCS>(out, lse2, q, k, v, doc_start, T, H, KV, scale_log2, L);
}

// ---- backward: dQ ----

struct BwdQ {
    static constexpr int WARPS = 4, BR = 32 * WARPS, BC = 32, NT = 32 * WARPS;
    static constexpr size_t SMEM = (size_t)(2 * BR + 4 * BC) * S * sizeof(bf16); // 104,448: 2 blocks per SM
    static constexpr size_t SMEM_DOC = SMEM + BR * sizeof(int);                   // and the rows' doc_start
};

template <bool MASK, int MODE>
__device__ __forceinline__ void dq_block(float (&dqa)[2][HD / 8][4], const bf16 *Qs, const bf16 *dOs, int qr,
                                         const bf16 *Kt, const bf16 *Vt, const float (&lrow)[2][2],
                                         const float (&drow)[2][2], int wrow, int k0, const int *lo, int L,
                                         float scale_log2, int lane) {
    constexpr int BC = BwdQ::BC;
    int g = lane >> 2, c4 = lane & 3;
    float p[2][BC / 8][4], ds[2][BC / 8][4];
    zero(p);
    zero(ds);
    abt32<BC / 8>(p, Qs, qr, Kt, 0, lane); // S = Q K^T
    if (MASK && MODE != M_CAUSAL) mask_doc<MODE>(p, lo, L, k0, -INFINITY, lane); // exp2(-inf) = 0 below
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = fast_exp2(p[mt][nt][e] * scale_log2 - lrow[mt][e >> 1]);
                if (MASK && k0 + nt * 8 + 2 * c4 + (e & 1) > wrow + mt * 16 + g + (e >> 1) * 8) x = 0.f;
                p[mt][nt][e] = x;
            }
    abt32<BC / 8>(ds, dOs, qr, Vt, 0, lane); // dP = dO V^T
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) ds[mt][nt][e] = p[mt][nt][e] * (ds[mt][nt][e] - drow[mt][e >> 1]);
    pv32<BC>(dqa, ds, Kt, lane); // dQ += dS K
}

// One query block of 128 in mode MODE (as forward_tile).
template <int MODE>
__device__ __forceinline__ void backward_dq_tile(bf16 *dq, const bf16 *q, const bf16 *k, const bf16 *v,
                                                 const bf16 *dout, const float *lse2, const float *D,
                                                 const int *doc_start, int T, int H, int KV, float scale_log2,
                                                 float scale, int L) {
    constexpr bool DOC = MODE == M_DOCS;
    constexpr int BR = BwdQ::BR, BC = BwdQ::BC, NT = BwdQ::NT;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem;    // [BR][S]
    bf16 *dOs = Qs + BR * S;    // [BR][S]
    bf16 *Ks = dOs + BR * S;    // [2][BC][S]
    bf16 *Vs = Ks + 2 * BC * S; // [2][BC][S]
    int *Ls = (int *)(Vs + 2 * BC * S); // [BR] the rows' doc_start (DOC)

    int h = blockIdx.x, b = blockIdx.y, qb = gridDim.z - 1 - blockIdx.z;
    int kvh = h / (H / KV);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2;
    int q0 = qb * BR, wrow = q0 + warp * 32;
    size_t qstride = (size_t)H * HD, kstride = (size_t)KV * HD;
    size_t qoff = ((size_t)b * T * H + h) * HD, loff = ((size_t)b * H + h) * T;
    const bf16 *kg = k + ((size_t)b * T * KV + kvh) * HD;
    const bf16 *vg = v + ((size_t)b * T * KV + kvh) * HD;
    int nkb = div_up(min(T, q0 + BR), BC);

    load_tile<BR, NT>(Qs, q + qoff, q0, T, qstride);
    load_tile<BR, NT>(dOs, dout + qoff, q0, T, qstride);
    int j0 = MODE != M_CAUSAL ? L / BC : 0; // as in forward_tile
    if (DOC) load_words<BR, NT>(Ls, doc_start + (size_t)b * T, q0, T);
    load_tile<BC, NT>(Ks + (j0 & 1) * BC * S, kg, j0 * BC, T, kstride);
    load_tile<BC, NT>(Vs + (j0 & 1) * BC * S, vg, j0 * BC, T, kstride);
    cp_async_commit();

    float lrow[2][2], drow[2][2]; // rows g, g+8 of the warp's two 16-row tiles
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int t = wrow + mt * 16 + g + r * 8;
            lrow[mt][r] = t < T ? lse2[loff + t] : 0.f;
            drow[mt][r] = t < T ? D[loff + t] : 0.f;
        }
    float dqa[2][HD / 8][4];
    zero(dqa);

    for (int j = j0; j < nkb; j++) {
        cp_async_wait<0>();
        __syncthreads();
        if (j + 1 < nkb) {
            int st = (j + 1) & 1;
            load_tile<BC, NT>(Ks + st * BC * S, kg, (j + 1) * BC, T, kstride);
            load_tile<BC, NT>(Vs + st * BC * S, vg, (j + 1) * BC, T, kstride);
            cp_async_commit();
        }
        int k0 = j * BC;
        const int *lo = Ls + warp * 32;
        if (k0 <= wrow + 31 && (!DOC || k0 + BC - 1 >= lo[0])) {
            const bf16 *Kt = Ks + (j & 1) * BC * S, *Vt = Vs + (j & 1) * BC * S;
            if (k0 + BC - 1 > wrow || (DOC && k0 < lo[min(31, T - 1 - wrow)]) || (MODE == M_UNIFORM && k0 < L))
                dq_block<true, MODE>(dqa, Qs, dOs, warp * 32, Kt, Vt, lrow, drow, wrow, k0, lo, L, scale_log2, lane);
            else
                dq_block<false, MODE>(dqa, Qs, dOs, warp * 32, Kt, Vt, lrow, drow, wrow, k0, lo, L, scale_log2, lane);
        }
    }

    __syncwarp(); // only this warp reads its 32 rows of Qs
    stage_acc<HD>(Qs, warp * 32, dqa[0], scale, scale, lane);
    stage_acc<HD>(Qs, warp * 32 + 16, dqa[1], scale, scale, lane);
    __syncwarp();
    store_rows16<HD>(dq + qoff, qstride, wrow, T, Qs, warp * 32, lane);
    store_rows16<HD>(dq + qoff, qstride, wrow + 16, T, Qs, warp * 32 + 16, lane);
}

// grid (H, B, query blocks of 128), heaviest (last) query blocks first.
template <bool DOC>
__global__ void __launch_bounds__(BwdQ::NT, 2)
    backward_dq_kernel(bf16 *dq, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *dout, const float *lse2,
                       const float *D, const int *doc_start, int T, int H, int KV, float scale_log2, float scale) {
    if (!DOC) {
        backward_dq_tile<M_CAUSAL>(dq, q, k, v, dout, lse2, D, doc_start, T, H, KV, scale_log2, scale, 0);
        return;
    }
    int L, q0 = (gridDim.z - 1 - blockIdx.z) * BwdQ::BR;
    if (doc_tile_mode(doc_start + (size_t)blockIdx.y * T, q0, BwdQ::BR, T, &L) == M_UNIFORM)
        backward_dq_tile<M_UNIFORM>(dq, q, k, v, dout, lse2, D, doc_start, T, H, KV, scale_log2, scale, L);
    else
        backward_dq_tile<M_DOCS>(dq, q, k, v, dout, lse2, D, doc_start, T, H, KV, scale_log2, scale, L);
}

// ---- dS^T in device memory (dQ as a matmul after the dK/dV kernel) ----
//
// With DS, the dK/dV kernel also writes each dS^T tile it computes (BF16, the
// values its dK matmul uses) to scratch, and dq_ds_kernel then computes
// dQ = scale dS K as a plain causal matmul: 5 matmuls in all instead of 7,
// still without atomics. Per head, dS^T is stored by key blocks of 128: block
// kb (keys k0 = 128 kb .. k0 + 127) holds, for each key, the queries
// k0 .. Tp - 1 (Tp = T rounded up to 128), so only the causal half (plus the
// diagonal blocks) takes memory. Every entry the dQ kernel reads for a query
// < T is written by the dK/dV kernel (computed, masked to 0, or a zeroed
// skipped tile); entries of queries >= T only reach dQ rows that are never
// stored.
__host__ __device__ __forceinline__ int ds_pad(int T) { return (T + 127) / 128 * 128; }
__host__ __device__ __forceinline__ size_t ds_block_off(int kb, int Tp) {
    return (size_t)128 * ((size_t)kb * Tp - (size_t)64 * kb * (kb - 1));
}
__host__ __device__ __forceinline__ size_t ds_head_elems(int T) {
    int Tp = ds_pad(T);
    return ds_block_off(Tp / 128, Tp);
}

// ---- backward: dK, dV ----

struct BwdKV {
    static constexpr int WARPS = 8, BC = 128, BR = 64, NT = 32 * WARPS;
    static constexpr int PS = BR + 8; // stride of the P^T / dS^T tiles (144 bytes: ldmatrix conflict-free)
    static constexpr size_t SMEM = (size_t)(2 * BC + 4 * BR) * S * sizeof(bf16) // K, V; 2 x (Q, dO)
                                   + 4 * BR * sizeof(float)                        // 2 x (lse2, D)
                                   + (size_t)2 * BC * PS * sizeof(bf16);           // P^T, dS^T: 177,152
    static constexpr size_t SMEM_DOC = SMEM + 2 * BR * sizeof(int);                 // 2 x the queries' doc_start
};

// grid (KV, B, key blocks of 128), heaviest (first) key blocks first.
// Steps run over the heads of the group, and for each over the query blocks
// of 64 at or after the key block (the order of the kernel above). Per step:
//   phase 1, warp (kw = warp & 3, qw = warp >> 2): keys 32 kw.., queries
//     32 qw..: S^T = K Q^T, P^T, dP^T = V dO^T, dS^T = P^T (dP^T - D),
//     both to shared memory as BF16 (the values mma_pv packs above);
//   phase 2, warp (kw, hw = warp >> 2): keys 32 kw.., all columns of
//     dV += P^T dO (hw = 0) or dK += dS^T Q (hw = 1), over the 16-query
//     chunks in order, skipping the chunks that no key of the warp sees
//     (whose phase-1 tiles were skipped too, so never read stale).
// DOC: the query blocks end with the document of the block's last key; a
// phase-1 tile whose queries' documents all start after the warp's keys is
// skipped (zeros in dS^T), and so are its chunks in phase 2.
template <bool DS, bool DOC>
__global__ void __launch_bounds__(BwdKV::NT, 1)
    backward_dkv_kernel(bf16 *dk, bf16 *dv, bf16 *dsT, const bf16 *q, const bf16 *k, const bf16 *v,
                        const bf16 *dout, const float *lse2, const float *D, const int *doc_start, int T, int H,
                        int KV, float scale_log2, float scale) {
    constexpr int BR = BwdKV::BR, BC = BwdKV::BC, NT = BwdKV::NT, PS = BwdKV::PS;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Ks = (bf16 *)smem;                 // [BC][S]
    bf16 *Vs = Ks + BC * S;                  // [BC][S]
    bf16 *Qs = Vs + BC * S;                  // [2][BR][S]
    bf16 *dOs = Qs + 2 * BR * S;             // [2][BR][S]
    float *Ls = (float *)(dOs + 2 * BR * S); // [2][BR]
    float *Ds = Ls + 2 * BR;                 // [2][BR]
    bf16 *Ps = (bf16 *)(Ds + 2 * BR);        // [BC][PS] P^T
    bf16 *dSs = Ps + BC * PS;                // [BC][PS] dS^T
    int *DSs = (int *)(dSs + BC * PS);       // [2][BR] the queries' doc_start (DOC)

    int kvh = blockIdx.x, b = blockIdx.y, kb = blockIdx.z;
    int group = H / KV;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, c4 = lane & 3;
    int kw = warp & 3, hw = warp >> 2; // phase 1: qw = hw
    int k0 = kb * BC, wkey = k0 + kw * 32; // the warp's first key (both phases)
    size_t qstride = (size_t)H * HD, kstride = (size_t)KV * HD;
    const bf16 *kg = k + ((size_t)b * T * KV + kvh) * HD;
    const bf16 *vg = v + ((size_t)b * T * KV + kvh) * HD;
    const int *docs = DOC ? doc_start + (size_t)b * T : NULL;
    int i0 = k0 / BR, nqb = DOC ? div_up(doc_query_end(docs, min(k0 + BC, T) - 1, T, lane), BR) : div_up(T, BR);
    int nsteps = group * (nqb - i0);

    // step n: head kvh * group + n / nper, queries (i0 + n % nper) * BR ..
    int nper = nqb - i0;
    auto load_step = [&](int n, int st) {
        int hh = kvh * group + n / nper, qr = (i0 + n % nper) * BR;
        size_t hoff = ((size_t)b * T * H + hh) * HD, loff = ((size_t)b * H + hh) * T;
        load_tile<BR, NT>(Qs + st * BR * S, q + hoff, qr, T, qstride);
        load_tile<BR, NT>(dOs + st * BR * S, dout + hoff, qr, T, qstride);
        load_words<BR, NT>(Ls + st * BR, lse2 + loff, qr, T);
        load_words<BR, NT>(Ds + st * BR, D + loff, qr, T);
        if (DOC) load_words<BR, NT>(DSs + st * BR, docs, qr, T);
    };
    load_tile<BC, NT>(Ks, kg, k0, T, kstride);
    load_tile<BC, NT>(Vs, vg, k0, T, kstride);
    load_step(0, 0);
    cp_async_commit();

    float acc[2][HD / 8][4]; // 32 keys x HD of dV (warps 0-3) or dK (warps 4-7)
    zero(acc);

    for (int n = 0; n < nsteps; n++) {
        cp_async_wait<0>();
        __syncthreads(); // step n is in; every warp is done with step n - 1 (its buffers, P^T, dS^T)
        if (n + 1 < nsteps) {
            load_step(n + 1, (n + 1) & 1);
            cp_async_commit();
        }
        int st = n & 1, qr = (i0 + n % nper) * BR;
        const bf16 *Qt = Qs + st * BR * S, *dOt = dOs + st * BR * S;

        // phase 1: keys wkey.., queries q1..
        int q1 = qr + hw * 32;
        const int *DSt = DSs + st * BR; // (DOC) rises over the step's queries < T
        // some query of the tile sees some key
        if (q1 + 31 >= wkey && (!DOC || DSt[hw * 32] <= wkey + 31)) {
            const float *Lt = Ls + st * BR + hw * 32, *Dt = Ds + st * BR + hw * 32;
            const int *Qd = DSt + hw * 32;
            float p[2][4][4], ds[2][4][4];
            zero(p);
            zero(ds);
            abt32<4>(p, Ks, kw * 32, Qt, hw * 32, lane); // S^T = K Q^T
            bool mask = q1 < wkey + 31 || q1 + 32 > T || (DOC && Qd[31] > wkey);
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int qq = nt * 8 + 2 * c4 + (e & 1), t = q1 + qq;
                        float x = fast_exp2(p[mt][nt][e] * scale_log2 - Lt[qq]);
                        if (mask && (t < wkey + mt * 16 + g + (e >> 1) * 8 || t >= T ||
                                     (DOC && wkey + mt * 16 + g + (e >> 1) * 8 < Qd[qq])))
                            x = 0.f;
                        p[mt][nt][e] = x;
                    }
            abt32<4>(ds, Vs, kw * 32, dOt, hw * 32, lane); // dP^T = V dO^T
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        ds[mt][nt][e] = p[mt][nt][e] * (ds[mt][nt][e] - Dt[nt * 8 + 2 * c4 + (e & 1)]);
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    int off = (kw * 32 + mt * 16 + g) * PS + hw * 32 + nt * 8 + 2 * c4;
                    *(uint32_t *)(Ps + off) = pack_bf16(p[mt][nt][0], p[mt][nt][1]);
                    *(uint32_t *)(Ps + off + 8 * PS) = pack_bf16(p[mt][nt][2], p[mt][nt][3]);
                    *(uint32_t *)(dSs + off) = pack_bf16(ds[mt][nt][0], ds[mt][nt][1]);
                    *(uint32_t *)(dSs + off + 8 * PS) = pack_bf16(ds[mt][nt][2], ds[mt][nt][3]);
                }
        } else if (DS) { // written out below: its zeros, not the last step's values
            uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int c = 0; c < 4; c++) *(uint4 *)(dSs + (kw * 32 + lane) * PS + hw * 32 + c * 8) = z;
        }
        // (a tile skipped here is never read below: its chunks are skipped too)
        __syncthreads();
        if (DS) { // dS^T of keys k0.., queries qr.. to its place in dsT (see ds_block_off)
            int hh = kvh * group + n / nper, Tp = ds_pad(T);
            bf16 *dst = dsT + (size_t)(b * H + hh) * ds_head_elems(T) + ds_block_off(kb, Tp) + (qr - k0);
            size_t ld = (size_t)(Tp - k0);
#pragma unroll 1
            for (int it = 0; it < BC * (BR / 8) / NT; it++) {
                int c = it * NT + threadIdx.x, r = c / (BR / 8), ch = c % (BR / 8);
                *(uint4 *)(dst + r * ld + ch * 8) = *(const uint4 *)(dSs + r * PS + ch * 8);
            }
        }

        // phase 2: keys wkey.., all columns; warps 0-3 dV += P^T dO, warps 4-7 dK += dS^T Q
        {
            const bf16 *As = hw ? dSs : Ps, *Bs = hw ? Qt : dOt;
            int first = wkey - qr - 15; // chunks kk with kk * 16 < first see no key of the warp
            asm volatile("" : "+r"(first)); // (computed here, not kept live through phase 1: registers)
            // DOC: bit i, phase 1 skipped the tile of queries 32 i.. (the test above)
            int skipped = DOC ? (DSt[0] > wkey + 31) | (DSt[32] > wkey + 31) << 1 : 0;
#pragma unroll
            for (int kk = 0; kk < BR / 16; kk++) {
                if (kk * 16 < first) continue; // no query of the chunk sees a key of the warp
                if (DOC && (skipped >> (kk / 2) & 1)) continue;
                uint32_t a[2][4];
                ld_a<PS>(a[0], As, kw * 32, kk * 16, lane);
                ld_a<PS>(a[1], As, kw * 32 + 16, kk * 16, lane);
                mma2_bkn(acc, a, Bs, kk * 16, lane);
            }
        }
    }

    __syncthreads(); // every warp is done with K and V: stage dV, dK there
    {
        float mul = hw ? scale : 1.f;
        bf16 *st = hw ? Ks : Vs;
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < HD / 8; nt++) {
                int off = (kw * 32 + mt * 16 + g) * S + nt * 8 + 2 * c4;
                *(uint32_t *)(st + off) = pack_bf16(acc[mt][nt][0] * mul, acc[mt][nt][1] * mul);
                *(uint32_t *)(st + off + 8 * S) = pack_bf16(acc[mt][nt][2] * mul, acc[mt][nt][3] * mul);
            }
    }
    __syncthreads();
    size_t koff = ((size_t)b * T * KV + kvh) * HD;
    constexpr int C = HD / 8; // 16-byte chunks per row
#pragma unroll
    for (int it = 0; it < BC * C / NT; it++) {
        int c = it * NT + threadIdx.x, r = c / C, ch = c % C, t = k0 + r;
        if (t < T) {
            *(uint4 *)(dk + koff + (size_t)t * kstride + ch * 8) = *(const uint4 *)(Ks + r * S + ch * 8);
            *(uint4 *)(dv + koff + (size_t)t * kstride + ch * 8) = *(const uint4 *)(Vs + r * S + ch * 8);
        }
    }
}

// ---- backward: dQ from dS^T (after backward_dkv_kernel<true>) ----

struct DqDs {
    static constexpr int WARPS = 4, BR = 32 * WARPS, BC = 64, NT = 32 * WARPS;
    static constexpr size_t SMEM = (size_t)4 * BC * S * sizeof(bf16); // 2 x (dS^T, K): 69,632
};

// grid (H, B, query blocks of 128), heaviest (last) query blocks first.
// dQ[q] = scale sum_k dS[q, k] K[k] over key blocks of 64 in order; warp w
// owns queries q0 + 32 w .. + 31 (A fragments by ldmatrix.trans from the
// [key][query] tile), all HD columns. DOC: key blocks from the one of the
// tile's first document; a warp skips the key blocks before its first
// query's document, which backward_dkv_kernel<true, true> may not have
// written (it ends each key block's queries with the last key's document).
template <bool DOC>
__global__ void __launch_bounds__(DqDs::NT, 2)
    dq_ds_kernel(bf16 *dq, const bf16 *dsT, const bf16 *k, const int *doc_start, int T, int H, int KV,
                 float scale) {
    constexpr int BR = DqDs::BR, BC = DqDs::BC, NT = DqDs::NT;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Ds = (bf16 *)smem;     // [2][BC][S]: keys x queries q0..q0+127
    bf16 *Ks = Ds + 2 * BC * S;  // [2][BC][S]

    int h = blockIdx.x, b = blockIdx.y, qb = gridDim.z - 1 - blockIdx.z;
    int kvh = h / (H / KV);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int q0 = qb * BR, wrow = q0 + warp * 32, Tp = ds_pad(T);
    size_t qstride = (size_t)H * HD, kstride = (size_t)KV * HD;
    const bf16 *head = dsT + (size_t)(b * H + h) * ds_head_elems(T);
    const bf16 *kg = k + ((size_t)b * T * KV + kvh) * HD;
    int nkb = div_up(min(T, q0 + BR), BC);

    int j0 = 0, wlo = 0;
    if (DOC) {
        const int *ds = doc_start + (size_t)b * T;
        j0 = ds[q0] / BC;
        wlo = doc_lo(ds, wrow, T);
    }
    auto load = [&](int j, int st) {
        int kk0 = j * BC, kb = kk0 / 128, k0 = kb * 128;
        size_t ld = (size_t)(Tp - k0);
        const bf16 *src = head + ds_block_off(kb, Tp) + (size_t)(kk0 - k0) * ld + (q0 - k0);
        bf16 *d = Ds + st * BC * S;
        constexpr int C = BR / 8; // 16-byte chunks per row
#pragma unroll 1
        for (int c = threadIdx.x; c < BC * C; c += NT) {
            int r = c / C, ch = c % C;
            cp_async16(d + r * S + ch * 8, src + r * ld + ch * 8, 16);
        }
        load_tile<BC, NT>(Ks + st * BC * S, kg, kk0, T, kstride);
    };
    load(j0, j0 & 1);
    cp_async_commit();

    float acc[2][HD / 8][4];
    zero(acc);
    for (int j = j0; j < nkb; j++) {
        cp_async_wait<0>();
        __syncthreads(); // block j is in; every warp is done with block j - 1's buffers
        if (j + 1 < nkb) {
            load(j + 1, (j + 1) & 1);
            cp_async_commit();
        }
        if (j * BC > wrow + 31) continue; // no query of the warp sees these keys (dS is 0)
        if (DOC && j * BC + BC - 1 < wlo) continue; // nor here (dS is 0, or unwritten)
        const bf16 *Dt = Ds + (j & 1) * BC * S, *Kt = Ks + (j & 1) * BC * S;
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            uint32_t a[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                ldsm_x4_trans(a[mt], Dt + (kk * 16 + (lane & 7) + ((lane >> 4) << 3)) * S + warp * 32 + mt * 16 +
                                         ((lane >> 3) & 1) * 8);
            mma2_bkn(acc, a, Kt, kk * 16, lane);
        }
    }
    __syncthreads(); // every warp is done with the tiles: stage dQ over them
    stage_acc<HD>(Ds, warp * 32, acc[0], scale, scale, lane);
    stage_acc<HD>(Ds, warp * 32 + 16, acc[1], scale, scale, lane);
    __syncwarp();
    size_t qoff = ((size_t)b * T * H + h) * HD;
    store_rows16<HD>(dq + qoff, qstride, wrow, T, Ds, warp * 32, lane);
    store_rows16<HD>(dq + qoff, qstride, wrow + 16, T, Ds, warp * 32 + 16, lane);
}

} // namespace v2

// ---- launchers ----------------------------------------------------------------

// The shapes the kernels take: 1, or 0 with the limit in why.
extern "C" int cuda_attention_supports(int B, int T, int H, int KV, int hd, char *why, size_t whylen) {
    if (B < 0 || T < 0 || H <= 0 || KV <= 0 || H % KV) {
        snprintf(why, whylen, "bad shape B=%d T=%d H=%d KV=%d (need H %% KV == 0)", B, T, H, KV);
        return 0;
    }
    if (hd != 16 && hd != 32 && hd != 64 && hd != 128) {
        snprintf(why, whylen, "head dim %d is not supported on CUDA (16, 32, 64 or 128)", hd);
        return 0;
    }
    if (ceil_div(T, 16) > 65535 || B > 65535) { // grid.z counts blocks of T, grid.y is B
        snprintf(why, whylen, "B=%d T=%d too large for the launch grid (at most 65535 sequences of %d tokens)", B,
                 T, 16 * 65535);
        return 0;
    }
    return 1;
}

static void check_shape(const char *what, int B, int T, int H, int KV, int hd) {
    char why[200];
    if (!cuda_attention_supports(B, T, H, KV, hd, why, sizeof why)) {
        fprintf(stderr, "moecore: %s: %s\n", what, why);
        exit(3);
    }
}

static inline float log2e_scale(int hd) { return (float)(1.4426950408889634 / sqrt((double)hd)); }

// Head dim 128 runs variant 2's dK/dV kernel without GQA (H == KV), and
// its forward and dQ kernels (128 queries per block, 2 blocks per SM) where
// their grid has more blocks than one wave (2 per SM): on fewer, the
// longest causal block sets the time and the first set's kernels, with half
// as many queries per block, finish first. Other head dims always run the
// first set. Measured on an H200 (T=4096, hd=128, 2026-11-30;
// test_cuda_attention), variant 2 over the first set: forward x1.33 with
// B H >= 16 (x0.82 with B=1 H=8: one wave), backward x1.04-1.05 without
// GQA, x0.94 with 4 query heads per kv head - hence the choice by shape.
// Both sets compute the same function with the same arithmetic (they were
// measured bit-identical before the forced choices were removed,
// 2026-12-01), so the choice does not change numerics.
// Whether variant 2's query-block kernels (forward, dQ) run this shape.
static bool v2_qblocks(int B, int T, int H) {
    return (long)B * H * ceil_div(T, v2::Fwd::BR) > 2L * cuda_num_sms();
}

// The kernels' DOC instances run when doc_start is given (the same grids).
static void forward_v2(bf16 *out, float *lse2, const bf16 *q, const bf16 *k, const bf16 *v, const int *doc_start,
                       int B, int T, int H, int KV) {
    using Cfg = v2::Fwd;
    static int smem_set[2];
    bool doc = doc_start != NULL;
    int smem = (int)(doc ? Cfg::SMEM_DOC : Cfg::SMEM);
    auto fn = doc ? v2::forward_kernel<true> : v2::forward_kernel<false>;
    cuda_allow_smem((const void *)fn, &smem_set[doc], smem);
    dim3 grid(H, B, ceil_div(T, Cfg::BR));
    fn<<<grid, Cfg::NT, smem, cuda_stream()>>>(out, lse2, q, k, v, doc_start, T, H, KV, log2e_scale(128));
    cudaLaunchCheck();
}

static void backward_dq_v2(bf16 *dq, const bf16 *dout, const float *lse2, const bf16 *q, const bf16 *k,
                           const bf16 *v, const float *D, const int *doc_start, int B, int T, int H, int KV) {
    using Cfg = v2::BwdQ;
    static int smem_set[2];
    bool doc = doc_start != NULL;
    int smem = (int)(doc ? Cfg::SMEM_DOC : Cfg::SMEM);
    auto fn = doc ? v2::backward_dq_kernel<true> : v2::backward_dq_kernel<false>;
    cuda_allow_smem((const void *)fn, &smem_set[doc], smem);
    dim3 grid(H, B, ceil_div(T, Cfg::BR));
    fn<<<grid, Cfg::NT, smem, cuda_stream()>>>(dq, q, k, v, dout, lse2, D, doc_start, T, H, KV, log2e_scale(128),
                                               (float)(1.0 / sqrt(128.0)));
    cudaLaunchCheck();
}

// dsT NULL: dK, dV only; else also dS^T into dsT (v2::ds_block_off).
static void backward_dkv_v2(bf16 *dk, bf16 *dv, bf16 *dsT, const bf16 *dout, const float *lse2, const bf16 *q,
                            const bf16 *k, const bf16 *v, const float *D, const int *doc_start, int B, int T, int H,
                            int KV) {
    using Cfg = v2::BwdKV;
    static int smem_set[4];
    bool doc = doc_start != NULL;
    int smem = (int)(doc ? Cfg::SMEM_DOC : Cfg::SMEM), which = (dsT != NULL) + 2 * doc;
    decltype(&v2::backward_dkv_kernel<false, false>) fns[4] = {
        v2::backward_dkv_kernel<false, false>, v2::backward_dkv_kernel<true, false>,
        v2::backward_dkv_kernel<false, true>, v2::backward_dkv_kernel<true, true>};
    cuda_allow_smem((const void *)fns[which], &smem_set[which], smem);
    dim3 grid(KV, B, ceil_div(T, Cfg::BC));
    fns[which]<<<grid, Cfg::NT, smem, cuda_stream()>>>(dk, dv, dsT, q, k, v, dout, lse2, D, doc_start, T, H, KV,
                                                       log2e_scale(128), (float)(1.0 / sqrt(128.0)));
    cudaLaunchCheck();
}

static void backward_dq_ds(bf16 *dq, const bf16 *dsT, const bf16 *k, const int *doc_start, int B, int T, int H,
                           int KV) {
    using Cfg = v2::DqDs;
    static int smem_set[2];
    bool doc = doc_start != NULL;
    auto fn = doc ? v2::dq_ds_kernel<true> : v2::dq_ds_kernel<false>;
    cuda_allow_smem((const void *)fn, &smem_set[doc], (int)Cfg::SMEM);
    dim3 grid(H, B, ceil_div(T, Cfg::BR));
    fn<<<grid, Cfg::NT, Cfg::SMEM, cuda_stream()>>>(dq, dsT, k, doc_start, T, H, KV, (float)(1.0 / sqrt(128.0)));
    cudaLaunchCheck();
}

// dQ through dS^T in scratch (5 matmuls instead of 7) runs where variant 2's
// dK/dV kernel runs without GQA (head dim 128, H == KV) and the dS^T of at
// least one batch row fits the cap: device.cuda.attention_ds_mib (default
// 1024; 0 turns it off). Batch rows go through the buffer in slices when
// all of them do not fit. The cap is read when the scratch is sized
// (cuda_attention_scratch_floats) and must not grow after (lowering it is
// safe: fewer rows per slice).
static size_t ds_cap_bytes(void) {
    int mib = cuda_settings()->attention_ds_mib;
    return mib > 0 ? (size_t)mib << 20 : 0;
}
// Batch rows per dS^T slice; 0 when dQ does not go through dS^T.
static int ds_batch_rows(int B, int T, int H, int KV, int hd) {
    if (hd != 128 || H != KV || B <= 0 || T <= 0) return 0;
    size_t per_row = (size_t)H * v2::ds_head_elems(T) * sizeof(bf16), cap = ds_cap_bytes();
    size_t n = cap / per_row;
    return n > (size_t)B ? B : (int)n;
}
static size_t d_floats(int B, int T, int H) { return ((size_t)B * H * T + 3) / 4 * 4; } // 16-byte aligned after

template <int HD>
static void forward_hd(bf16 *out, float *lse2, const bf16 *q, const bf16 *k, const bf16 *v, const int *doc_start,
                       int B, int T, int H, int KV) {
    if (HD == 128 && v2_qblocks(B, T, H)) {
        forward_v2(out, lse2, q, k, v, doc_start, B, T, H, KV);
        return;
    }
    using Cfg = FwdCfg<HD>;
    static int smem_set[2];
    bool doc = doc_start != NULL;
    auto fn = doc ? attention_forward_kernel<HD, true> : attention_forward_kernel<HD, false>;
    cuda_allow_smem((const void *)fn, &smem_set[doc], (int)Cfg::SMEM);
    dim3 grid(H, B, ceil_div(T, Cfg::BR));
    fn<<<grid, Cfg::NT, Cfg::SMEM, cuda_stream()>>>(out, lse2, q, k, v, doc_start, T, H, KV, log2e_scale(HD));
    cudaLaunchCheck();
}

template <int HD>
static void backward_hd(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const float *lse2, const bf16 *q,
                        const bf16 *k, const bf16 *v, const bf16 *out, const int *doc_start, float *D, int B, int T,
                        int H, int KV) {
    size_t threads = (size_t)B * T * H * (HD / 8);
    attention_backward_d_kernel<HD><<<ceil_div(threads, 256), 256, 0, cuda_stream()>>>(D, out, dout, B, T, H);
    cudaLaunchCheck();

    float sl2 = log2e_scale(HD), scale = (float)(1.0 / sqrt((double)HD));
    bool doc = doc_start != NULL;
    int dsr = ds_batch_rows(B, T, H, KV, HD);
    if (dsr > 0) { // dK, dV and dS^T, then dQ = scale dS K, per slice of batch rows
        bf16 *dsT = (bf16 *)(D + d_floats(B, T, H));
        bool wg = cuda_settings()->attention_bwd == CUDA_KERNELS_WGMMA &&
                  cuda_attention_backward_wgmma_takes(doc_start, B, T, H, KV, HD);
        for (int b0 = 0; b0 < B; b0 += dsr) {
            int nb = B - b0 < dsr ? B - b0 : dsr;
            size_t oq = (size_t)b0 * T * H * HD, ok = (size_t)b0 * T * KV * HD, ol = (size_t)b0 * H * T;
            const int *dst = doc ? doc_start + (size_t)b0 * T : NULL;
            if (wg && cuda_attention_backward_wgmma(dq + oq, dk + ok, dv + ok, dsT, dout + oq, lse2 + ol, D + ol,
                                                    q + oq, k + ok, v + ok, nb, T, H, v2::ds_head_elems(T)) == 0)
                continue;
            backward_dkv_v2(dk + ok, dv + ok, dsT, dout + oq, lse2 + ol, q + oq, k + ok, v + ok, D + ol, dst, nb, T,
                            H, KV);
            backward_dq_ds(dq + oq, dsT, k + ok, dst, nb, T, H, KV);
        }
        return;
    }
    if (HD == 128 && v2_qblocks(B, T, H)) {
        backward_dq_v2(dq, dout, lse2, q, k, v, D, doc_start, B, T, H, KV);
    } else {
        using Cfg = BwdQCfg<HD>;
        static int smem_set[2];
        auto fn = doc ? attention_backward_dq_kernel<HD, true> : attention_backward_dq_kernel<HD, false>;
        cuda_allow_smem((const void *)fn, &smem_set[doc], (int)Cfg::SMEM);
        dim3 grid(H, B, ceil_div(T, Cfg::BR));
        fn<<<grid, Cfg::NT, Cfg::SMEM, cuda_stream()>>>(dq, q, k, v, dout, lse2, D, doc_start, T, H, KV, sl2, scale);
        cudaLaunchCheck();
    }
    if (HD == 128 && H == KV) {
        backward_dkv_v2(dk, dv, NULL, dout, lse2, q, k, v, D, doc_start, B, T, H, KV);
    } else {
        using Cfg = BwdKVCfg<HD>;
        static int smem_set[2];
        auto fn = doc ? attention_backward_dkv_kernel<HD, true> : attention_backward_dkv_kernel<HD, false>;
        int smem = (int)(doc ? Cfg::SMEM_DOC : Cfg::SMEM);
        cuda_allow_smem((const void *)fn, &smem_set[doc], smem);
        dim3 grid(KV, B, ceil_div(T, Cfg::BC));
        fn<<<grid, Cfg::NT, smem, cuda_stream()>>>(dk, dv, q, k, v, dout, lse2, D, doc_start, T, H, KV, sl2, scale);
        cudaLaunchCheck();
    }
}

extern "C" void cuda_attention_forward(void *out, float *saved, const void *q, const void *k, const void *v,
                                       const int *doc_start, int B, int T, int H, int KV, int hd) {
    check_shape("attention forward", B, T, H, KV, hd);
    if (B == 0 || T == 0) return;
    if (cuda_settings()->attention_fwd == CUDA_KERNELS_WGMMA &&
        cuda_attention_forward_wgmma(out, saved, q, k, v, doc_start, B, T, H, KV, hd) == 0)
        return;
    bf16 *o = (bf16 *)out;
    const bf16 *qq = (const bf16 *)q, *kk = (const bf16 *)k, *vv = (const bf16 *)v;
    switch (hd) {
    case 16: forward_hd<16>(o, saved, qq, kk, vv, doc_start, B, T, H, KV); break;
    case 32: forward_hd<32>(o, saved, qq, kk, vv, doc_start, B, T, H, KV); break;
    case 64: forward_hd<64>(o, saved, qq, kk, vv, doc_start, B, T, H, KV); break;
    case 128: forward_hd<128>(o, saved, qq, kk, vv, doc_start, B, T, H, KV); break;
    }
}

extern "C" void cuda_attention_backward(void *dq, void *dk, void *dv, const void *dout, const float *saved,
                                        const void *q, const void *k, const void *v, const void *out,
                                        const int *doc_start, float *scratch, int B, int T, int H, int KV, int hd) {
    check_shape("attention backward", B, T, H, KV, hd);
    if (B == 0 || T == 0) return;
    bf16 *a = (bf16 *)dq, *bk = (bf16 *)dk, *bv = (bf16 *)dv;
    const bf16 *d = (const bf16 *)dout, *qq = (const bf16 *)q, *kk = (const bf16 *)k, *vv = (const bf16 *)v,
               *o = (const bf16 *)out;
    const int *ds = doc_start;
    switch (hd) {
    case 16: backward_hd<16>(a, bk, bv, d, saved, qq, kk, vv, o, ds, scratch, B, T, H, KV); break;
    case 32: backward_hd<32>(a, bk, bv, d, saved, qq, kk, vv, o, ds, scratch, B, T, H, KV); break;
    case 64: backward_hd<64>(a, bk, bv, d, saved, qq, kk, vv, o, ds, scratch, B, T, H, KV); break;
    case 128: backward_hd<128>(a, bk, bv, d, saved, qq, kk, vv, o, ds, scratch, B, T, H, KV); break;
    }
}

// saved: lse2 [B,H,T]; scratch: D [B,H,T], then (16-byte aligned) the dS^T of
// a slice of batch rows when dQ goes through it.
extern "C" size_t cuda_attention_saved_floats(int B, int T, int H, int hd) { return (size_t)B * H * T; }
extern "C" size_t cuda_attention_scratch_floats(int B, int T, int H, int KV, int hd) {
    int dsr = ds_batch_rows(B, T, H, KV, hd);
    if (!dsr) return (size_t)B * H * T;
    return d_floats(B, T, H) + ((size_t)dsr * H * v2::ds_head_elems(T) + 1) / 2;
}
