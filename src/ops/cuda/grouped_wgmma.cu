// The grouped GEMMs on Hopper tensor cores (wgmma, sm_90a): forward
// out[R, OC] = inp[R, C] w_e[OC, C]^T over the experts' row segments
// offsets[e]..offsets[e+1] (offsets on the device; see gemm.cu's header for
// the persistent tile scheduler), data-grad and weight-grad. Two families:
//   - grouped_ws_kernel (further down, the default where N >= 256): warp-
//     specialised, TMA loads into an mbarrier ring, one producer and two
//     consumer warpgroups; forward, data-grad (alone or as a pair) and
//     weight-grad; its ping-pong twin grouped_wgrad_pingpong_kernel (the
//     default for the weight-grad's +=: each consumer warpgroup on its own
//     tiles, one's epilogue under the other's wgmma);
//   - the cp.async kernels described here (grouped_wgmma_kernel,
//     grouped_wgmma_bwd_kernel): every thread loads and computes; they run
//     the shapes the TMA kernel does not take and device.cuda.gemm_tma: false.
// H200, OLMoE shape (2026-11-30): forward 551 vs 384 TFLOP/s, data-grad 468
// vs 336, weight-grad 262 vs 253 (bench/results/2026-11-30-h200-issue6.md);
// since issue 19's 16-byte epilogue, at 65536 rows: forward 599 / 569
// (gate/up / down), data-grads 602-609, weight-grads 453-523
// (bench/results/2026-12-01-h200-issue19-grouped.md).
//
// A block of 2 warpgroups owns a 128 x BN output tile (BN = 256, or 128),
// each warpgroup 64 rows of it as one m64nBNk16 accumulator in registers.
// K goes in steps of 64 BF16 (128 bytes, one swizzle row) through a STAGES
// deep ring of shared-memory tiles that every thread fills with 16-byte
// cp.async; rows past the expert's segment, columns past OC and K past C
// are zero-filled (src-size 0), so they add nothing. Tiles are stored in
// wgmma's canonical K-major 128-byte-swizzled layout: row r's 16-byte chunk
// c sits at r * 128 + ((c ^ (r % 8)) * 16) from a 1024-byte aligned base,
// and the k16 steps inside a row are reached by moving the descriptor's
// start address 32 bytes at a time (the hardware swizzles the final
// address, so this stays consistent with the layout).
//
// Per K step: wait for its cp.async group, fence.proxy.async (cp.async
// writes are generic-proxy, wgmma reads are async-proxy), barrier, issue 4
// wgmma and commit, wait until at most this group is pending (the previous
// step's wgmma are done), barrier (both warpgroups are done with the
// previous slot), refill that slot with the step STAGES-1 ahead. When a tile
// ends, the next tile's first stages are issued before the epilogue stores
// the accumulators, so the loads overlap the stores.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/grouped_sched.cuh"
#include "ops/cuda/ops_cuda.h"
#include "ops/cuda/wgmma_util.cuh"
#include <cudaTypedefs.h>
#include <stdlib.h>
#include <string.h>

namespace {

constexpr int WG_BM = 128;     // block tile rows: 2 warpgroups x m64
constexpr int WG_BK = 64;      // K per stage: one 128-byte swizzle row
constexpr int WG_THREADS = 256;
constexpr int WG_SMEM_LIMIT = 227 * 1024;

template <int BN, int STAGES_ = BN == 256 ? 4 : 6> struct WgConfig {
    static constexpr int STAGES = STAGES_;
    static constexpr int A_BYTES = WG_BM * WG_BK * 2;          // 16 KB
    static constexpr int B_BYTES = BN * WG_BK * 2;             // 32 or 16 KB
    static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;      // multiple of 1024
    static constexpr int TILE_BYTES = STAGES * STAGE_BYTES;    // 192 KB
    static constexpr int ACC = BN / 2;                         // fp32 accumulators per thread
    static_assert(A_BYTES % 1024 == 0 && STAGE_BYTES % 1024 == 0, "swizzle atoms need 1024-byte alignment");
};

// One output tile: expert e's rows m0.. of its segment (which starts at
// row r0 of the grouped activations and holds `rows` rows), columns n0..
struct Tile {
    int e, m0, n0, r0, rows;
};

// Tile t of the list whose expert e starts at s_tile[e] (see gemm.cu).
__host__ __device__ __forceinline__ Tile locate(int t, const int *s_off, const int *s_tile, int E, int col_tiles, int bn) {
    int lo = grouped_tile_expert(t, s_tile, E);
    Tile tl;
    int local = t - s_tile[lo];
    tl.e = lo;
    tl.m0 = local / col_tiles * WG_BM;
    tl.n0 = local % col_tiles * bn;
    tl.r0 = s_off[lo];
    tl.rows = s_off[lo + 1] - tl.r0;
    return tl;
}

// The epilogues of the kernels: out = bf16(acc) (store_acc_bf16, in
// wgmma_util.cuh) for rows < rows and columns < N ...
// ... and dw += acc (SET: dw = acc) for rows < M and columns < N
// (red_add_quad; the block alone owns the tile).
template <int BN, bool SET = false>
__device__ __forceinline__ void add_acc_f32(const float (&acc)[BN / 2], float *o, int M, int N, int r, int c0,
                                            bool vec4) {
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        int c = c0 + 8 * j;
        bool c_ok = c < N;
        red_add_quad<SET>(o + (size_t)r * N, o + (size_t)(r + 8) * N, c, acc[4 * j], acc[4 * j + 1], acc[4 * j + 2],
                          acc[4 * j + 3], c_ok && r < M, c_ok && r + 8 < M, vec4);
    }
}

// Issues this thread's cp.async for K step kt of tile tl into the stage at
// shared address st: chunk (tid % 8) of rows tid / 8 + 32 i, A then B.
template <int BN>
__device__ __forceinline__ void load_stage(uint32_t st, const bf16 *A, const bf16 *B, const Tile &tl, int N, int K,
                                           int kt) {
    int chunk = threadIdx.x & 7, rb = threadIdx.x >> 3;
    int k = kt * WG_BK + chunk * 8;
    bool kv = k < K;
    const bf16 *a = A + ((size_t)tl.r0 + tl.m0) * K + k;
    int a_rows = tl.rows - tl.m0;
#pragma unroll
    for (int i = 0; i < WG_BM / 32; i++) {
        int r = rb + 32 * i;
        bool v = kv && r < a_rows;
        cp_async16(st + swz(r, chunk), v ? a + (size_t)r * K : A, v);
    }
    const bf16 *b = B + ((size_t)tl.e * N + tl.n0) * K + k;
    int b_rows = N - tl.n0;
#pragma unroll
    for (int i = 0; i < BN / 32; i++) {
        int r = rb + 32 * i;
        bool v = kv && r < b_rows;
        cp_async16(st + WgConfig<BN>::A_BYTES + swz(r, chunk), v ? b + (size_t)r * K : B, v);
    }
}

// The first STAGES-1 K steps of a tile, one cp.async group each (empty
// groups past the end keep the count uniform).
template <int BN, int S>
__device__ __forceinline__ void load_prologue(uint32_t tiles, const bf16 *A, const bf16 *B, const Tile &tl, int N,
                                              int K, int ktiles) {
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < ktiles) load_stage<BN>(tiles + s * WgConfig<BN, S>::STAGE_BYTES, A, B, tl, N, K, s);
        cp_async_commit();
    }
}

template <int BN>
__device__ __forceinline__ void wgmma_step(float (&d)[BN / 2], uint64_t a, uint64_t b, int accumulate);
template <>
__device__ __forceinline__ void wgmma_step<128>(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
    wgmma_n128(d, a, b, accumulate);
}
template <>
__device__ __forceinline__ void wgmma_step<256>(float (&d)[128], uint64_t a, uint64_t b, int accumulate) {
    wgmma_n256(d, a, b, accumulate);
}

// out[R, N] = A[R, K] B_e[N, K]^T over the expert segments; a persistent
// grid whose block b takes tiles b, b + gridDim.x, ...; S stages, MINB
// blocks per multiprocessor.
template <int BN, int S, int MINB>
__global__ void __launch_bounds__(WG_THREADS, MINB)
grouped_wgmma_kernel(bf16 *out, const bf16 *A, const bf16 *B, const int *offsets, int E, int N, int K) {
    using Cfg = WgConfig<BN, S>;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    uint32_t tiles = (raw + 1023) & ~1023u; // swizzle atoms want 1024-byte alignment
    int *s_off = (int *)(smem_raw + (tiles - raw) + Cfg::TILE_BYTES); // offsets[0..E]
    int *s_tile = s_off + E + 1;                                      // first tile of each expert, [0..E]
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int col_tiles = (N + BN - 1) / BN;

    grouped_load_offsets<WG_THREADS>(offsets, E, s_off);
    int total = grouped_tile_prefix<WG_BM>(s_off, E, col_tiles, s_tile);
    int t = blockIdx.x;
    if (t >= total) return;

    int ktiles = (K + WG_BK - 1) / WG_BK;
    int wg = threadIdx.x >> 7, wwarp = warp & 3; // warpgroup, warp within it
    Tile cur = locate(t, s_off, s_tile, E, col_tiles, BN);
    load_prologue<BN, S>(tiles, A, B, cur, N, K, ktiles);

    float acc[Cfg::ACC];
#pragma unroll
    for (int i = 0; i < Cfg::ACC; i++) acc[i] = 0.0f;

    for (;;) {
        int slot = 0, fill = S - 1; // slot of step kt, slot that step kt + S - 1 goes to
        for (int kt = 0; kt < ktiles; kt++) {
            cp_async_wait<S - 2>(); // this thread's part of step kt has landed
            fence_proxy_async();    // ... and is visible to the async proxy
            __syncthreads();        // ... for every thread's part
            uint32_t st = tiles + slot * Cfg::STAGE_BYTES;
            uint64_t da = smem_desc(st + wg * 64 * 128), db = smem_desc(st + Cfg::A_BYTES);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < WG_BK / 16; kk++) // k16 steps: 32 bytes along the swizzled row
                wgmma_step<BN>(acc, da + 2 * kk, db + 2 * kk, kt > 0 || kk > 0);
            wgmma_commit();
            wgmma_wait<1>(); // step kt-1's wgmma (this warpgroup's) are done
            __syncthreads(); // ... both warpgroups': its slot, `fill`, is free
            if (kt + S - 1 < ktiles) load_stage<BN>(tiles + fill * Cfg::STAGE_BYTES, A, B, cur, N, K, kt + S - 1);
            cp_async_commit();
            slot = slot == S - 1 ? 0 : slot + 1;
            fill = fill == S - 1 ? 0 : fill + 1;
        }
        wgmma_wait<0>();
        __syncthreads(); // all wgmma done reading shared memory

        int tn = t + gridDim.x;
        Tile nxt = cur;
        if (tn < total) { // start the next tile's loads under this tile's stores
            nxt = locate(tn, s_off, s_tile, E, col_tiles, BN);
            load_prologue<BN, S>(tiles, A, B, nxt, N, K, ktiles);
        }

        store_acc_bf16<BN>(acc, out + (size_t)cur.r0 * N, N, cur.m0 + wg * 64 + wwarp * 16 + (lane >> 2),
                           cur.n0 + 2 * (lane & 3), cur.rows);
        if (tn >= total) break;
        t = tn;
        cur = nxt;
    }
}

template <int BN, int S = WgConfig<BN>::STAGES, int MINB = 1>
int launch_wgmma(bf16 *out, const bf16 *inp, const bf16 *w, const int *offsets, int E, int C, int OC) {
    static int smem_set;
    int smem = WgConfig<BN, S>::TILE_BYTES + 1024 + 2 * (E + 1) * (int)sizeof(int);
    if (smem * MINB > WG_SMEM_LIMIT) return -1;
    cuda_allow_smem((const void *)grouped_wgmma_kernel<BN, S, MINB>, &smem_set, smem);
    grouped_wgmma_kernel<BN, S, MINB><<<cuda_num_sms() * MINB, WG_THREADS, smem, cuda_stream()>>>(out, inp, w, offsets,
                                                                                                E, OC, C);
    cudaLaunchCheck();
    return 0;
}

// ---------------------------------------------------------------------------
// Backward: the same block, pipeline and scheduler, with M/N-major operands.
//
// Data-grad: dinp[R, C] = dout[R, OC] w_e[OC, C] over the expert segments
// (M = rows, N = C, K = OC). A = dout is K-major as in the forward; B = w_e
// is stored [K][N], N contiguous: N-major. Weight-grad: dw[e][OC, C] +=
// dout_e^T inp_e (M = OC, N = C, K = the expert's rows, read from the
// offsets). A = dout_e stored [K][M] and B = inp_e stored [K][N]: both
// M/N-major.
//
// M/N-major tiles use wgmma's canonical MN-major 128-byte-swizzled layout
// (PTX ISA, "Shared Memory Matrix Layout", MN-major 128B swizzling:
// ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)) in elements, T = 8 for 16-bit types,
// Swizzle<3,4,3> on the byte address). One swizzle atom is 64 MN x 8 k:
// 8 rows of 128 bytes, row kr holding the 64 consecutive MN elements of k
// = kr, its 16-byte chunk c (MN 8c..8c+7) at kr * 128 + ((c ^ kr) * 16).
// A tile of X (64 or more) MN x 64 k is (X / 64) x 8 atoms: MN atom a,
// k group g at a * 8192 + g * 1024. So the descriptor's leading byte offset
// (between 64-wide MN blocks) is 8192 and its stride byte offset (between
// 8-k groups) 1024, and the k16 steps of a stage are 2 k groups = 2048
// bytes apart: each step's start address is 1024-byte aligned (base offset
// 0), unlike the K-major steps that move 32 bytes inside the atom.
// wgmma reads them with imm-trans-a / imm-trans-b = 1.

constexpr int MN_ATOM_BYTES = 1024;          // 64 MN x 8 k
constexpr int MN_LBO = 8 * MN_ATOM_BYTES;    // next 64 MN: past the 8 k groups of a 64-k stage
constexpr int MN_SBO = MN_ATOM_BYTES;        // next 8 k

// The MN-major descriptor of a stage's operand (smem_desc_mn_lbo, in
// wgmma_util.cuh, with 64-k stages). The k16 step kk of a stage is desc +
// kk * (2 * MN_SBO >> 4).
static_assert(MN_SBO == 1024, "smem_desc_mn_lbo's stride byte offset");
__host__ __device__ __forceinline__ uint64_t smem_desc_mn(uint32_t addr) { return smem_desc_mn_lbo(addr, MN_LBO); }
constexpr int MN_KSTEP_DESC = 2 * MN_SBO >> 4; // descriptor increment per k16 step

// Byte offset in an MN-major tile of the 16-byte chunk holding MN elements
// 8 mc .. 8 mc + 7 of k (0..63).
__host__ __device__ __forceinline__ uint32_t mn_off(int mc, int k) {
    return (uint32_t)((mc >> 3) * MN_LBO + (k >> 3) * MN_SBO + (k & 7) * 128 + (((mc & 7) ^ (k & 7)) << 4));
}

// The chunk that thread `tid` copies in its i-th cp.async of an X-wide
// MN-major tile: k row and chunk mc along MN (a warp covers 512 contiguous
// bytes of one k row when X >= 256, two rows of 256 when X = 128).
template <int X> __host__ __device__ __forceinline__ void mn_chunk(int tid, int i, int &k, int &mc) {
    int c = tid + WG_THREADS * i;
    k = c / (X / 8);
    mc = c % (X / 8);
}

// cp.async of an X (MN) x 64 (k) tile into the MN-major layout at dst; g is
// element (k 0, MN 0) of the tile in a matrix stored [k][MN] with row
// length ld; k >= k_lim or MN >= mn_lim are zero-filled (mn_lim is a
// multiple of 8, so a chunk is wholly in or out). `safe`: any valid address.
template <int X>
__device__ __forceinline__ void load_mn(uint32_t dst, const bf16 *g, int ld, int k_lim, int mn_lim, const bf16 *safe) {
#pragma unroll
    for (int i = 0; i < X / 32; i++) {
        int k, mc;
        mn_chunk<X>(threadIdx.x, i, k, mc);
        bool v = k < k_lim && mc * 8 < mn_lim;
        cp_async16(dst + mn_off(mc, k), v ? g + (size_t)k * ld + mc * 8 : safe, v);
    }
}

// K step kt of tile tl into the stage at st. Data-grad: A = dout [R][K]
// (K-major, as the forward), B = w [E][K][N]. Weight-grad: A = dout
// [R][M], B = inp [R][N], K = the segment's rows.
// The backward's operands. A data-grad pair (A2 != NULL) computes
// dinp = A B_e + A2 B2_e as one product over 2 kt1 K steps: steps from kt1
// on read A2 and B2 (kt1 = the K steps of one operand).
struct BwdOperands {
    const bf16 *A, *B, *A2, *B2;
    int kt1;
};

template <int BN, bool WGRAD>
__device__ __forceinline__ void bwd_load_stage(uint32_t st, const BwdOperands &o, const Tile &tl, int M, int N,
                                               int K, int kt) {
    const bf16 *A = o.A, *B = o.B;
    if (!WGRAD && o.A2 && kt >= o.kt1) {
        A = o.A2;
        B = o.B2;
        kt -= o.kt1;
    }
    int k0 = kt * WG_BK;
    if constexpr (!WGRAD) {
        int chunk = threadIdx.x & 7, rb = threadIdx.x >> 3;
        int k = k0 + chunk * 8;
        bool kv = k < K;
        const bf16 *a = A + ((size_t)tl.r0 + tl.m0) * K + k;
        int a_rows = tl.rows - tl.m0;
#pragma unroll
        for (int i = 0; i < WG_BM / 32; i++) {
            int r = rb + 32 * i;
            bool v = kv && r < a_rows;
            cp_async16(st + swz(r, chunk), v ? a + (size_t)r * K : A, v);
        }
        load_mn<BN>(st + WgConfig<BN>::A_BYTES, B + ((size_t)tl.e * K + k0) * N + tl.n0, N, K - k0, N - tl.n0, B);
    } else {
        load_mn<WG_BM>(st, A + ((size_t)tl.r0 + k0) * M + tl.m0, M, tl.rows - k0, M - tl.m0, A);
        load_mn<BN>(st + WgConfig<BN>::A_BYTES, B + ((size_t)tl.r0 + k0) * N + tl.n0, N, tl.rows - k0, N - tl.n0, B);
    }
}

template <int BN, bool WGRAD, int S>
__device__ __forceinline__ void bwd_load_prologue(uint32_t tiles, const BwdOperands &o, const Tile &tl, int M, int N,
                                                  int K, int ktiles) {
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < ktiles) bwd_load_stage<BN, WGRAD>(tiles + s * WgConfig<BN, S>::STAGE_BYTES, o, tl, M, N, K, s);
        cp_async_commit();
    }
}

// One k16 step: data-grad A K-major (trans 0), B N-major (1); weight-grad
// both M/N-major (1, 1).
template <int BN, bool WGRAD>
__device__ __forceinline__ void bwd_wgmma(float (&d)[BN / 2], uint64_t a, uint64_t b, int accumulate) {
    if constexpr (BN == 256) wgmma_n256<WGRAD ? 1 : 0, 1>(d, a, b, accumulate);
    else wgmma_n128<WGRAD ? 1 : 0, 1>(d, a, b, accumulate);
}

// Weight-grad tile t of E x row_tiles x col_tiles (expert-major: one
// expert's tiles run together, sharing its rows in L2).
__host__ __device__ __forceinline__ Tile wgrad_locate(int t, const int *s_off, int per_e, int col_tiles, int bn,
                                                     int bm = WG_BM) {
    Tile tl;
    tl.e = t / per_e;
    int local = t - tl.e * per_e;
    tl.m0 = local / col_tiles * bm;
    tl.n0 = local % col_tiles * bn;
    tl.r0 = s_off[tl.e];
    tl.rows = s_off[tl.e + 1] - tl.r0;
    return tl;
}
// The first tile from t on (stepping by `step`) whose expert has rows.
__host__ __device__ __forceinline__ int wgrad_skip_empty(int t, int total, int step, const int *s_off, int per_e) {
    while (t < total) {
        int e = t / per_e;
        if (s_off[e + 1] > s_off[e]) break;
        t += step;
    }
    return t;
}

// Data-grad (WGRAD false): out = dinp (BF16 [R][N]), M unused, K = OC.
// Weight-grad (WGRAD true): out = dw (FP32 [E][M][N], +=, through
// red_add_quad: 16-byte reductions when K = 1, else K is unused).
// Persistent grid, block b takes tiles b, b + gridDim.x, ... (weight-grad:
// skipping the tiles of experts without rows). S stages; MINB blocks per
// multiprocessor (2 lets one block's epilogue run under the other's
// main loop).
template <int BN, bool WGRAD, int S, int MINB>
__global__ void __launch_bounds__(WG_THREADS, MINB)
grouped_wgmma_bwd_kernel(void *out, const BwdOperands o, const int *offsets, int E, int M, int N, int K) {
    using Cfg = WgConfig<BN, S>;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    uint32_t tiles = (raw + 1023) & ~1023u;
    int *s_off = (int *)(smem_raw + (tiles - raw) + Cfg::TILE_BYTES); // offsets[0..E]
    int *s_tile = s_off + E + 1;                                      // data-grad: first tile of each expert
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int col_tiles = (N + BN - 1) / BN;

    grouped_load_offsets<WG_THREADS>(offsets, E, s_off);
    int total, per_e = 1;
    if constexpr (!WGRAD) {
        total = grouped_tile_prefix<WG_BM>(s_off, E, col_tiles, s_tile);
    } else {
        per_e = (M + WG_BM - 1) / WG_BM * col_tiles;
        total = E * per_e;
    }
    int t = blockIdx.x;
    if constexpr (WGRAD) t = wgrad_skip_empty(t, total, gridDim.x, s_off, per_e);
    if (t >= total) return;

    int wg = threadIdx.x >> 7, wwarp = warp & 3;
    Tile cur = WGRAD ? wgrad_locate(t, s_off, per_e, col_tiles, BN) : locate(t, s_off, s_tile, E, col_tiles, BN);
    // data-grad: K steps of one operand (o.kt1), twice for a pair
    const int dgrad_kt = WGRAD ? 0 : (o.A2 ? 2 : 1) * ((K + WG_BK - 1) / WG_BK);
    int ktiles = WGRAD ? (cur.rows + WG_BK - 1) / WG_BK : dgrad_kt;
    bwd_load_prologue<BN, WGRAD, S>(tiles, o, cur, M, N, K, ktiles);

    float acc[Cfg::ACC];
#pragma unroll
    for (int i = 0; i < Cfg::ACC; i++) acc[i] = 0.0f;

    for (;;) {
        int slot = 0, fill = S - 1;
        for (int kt = 0; kt < ktiles; kt++) {
            cp_async_wait<S - 2>();
            fence_proxy_async();
            __syncthreads();
            uint32_t st = tiles + slot * Cfg::STAGE_BYTES;
            // warpgroup wg's 64 rows of A start 8192 bytes in, in either layout
            uint64_t da = WGRAD ? smem_desc_mn(st + wg * 64 * 128) : smem_desc(st + wg * 64 * 128);
            uint64_t db = smem_desc_mn(st + Cfg::A_BYTES);
            const uint64_t a_step = WGRAD ? MN_KSTEP_DESC : 2;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < WG_BK / 16; kk++)
                bwd_wgmma<BN, WGRAD>(acc, da + a_step * kk, db + (uint64_t)MN_KSTEP_DESC * kk, kt > 0 || kk > 0);
            wgmma_commit();
            wgmma_wait<1>();
            __syncthreads();
            if (kt + S - 1 < ktiles)
                bwd_load_stage<BN, WGRAD>(tiles + fill * Cfg::STAGE_BYTES, o, cur, M, N, K, kt + S - 1);
            cp_async_commit();
            slot = slot == S - 1 ? 0 : slot + 1;
            fill = fill == S - 1 ? 0 : fill + 1;
        }
        wgmma_wait<0>();
        __syncthreads();

        int tn = t + gridDim.x;
        if constexpr (WGRAD) tn = wgrad_skip_empty(tn, total, gridDim.x, s_off, per_e);
        Tile nxt = cur;
        int nkt = ktiles;
        if (tn < total) {
            nxt = WGRAD ? wgrad_locate(tn, s_off, per_e, col_tiles, BN) : locate(tn, s_off, s_tile, E, col_tiles, BN);
            nkt = WGRAD ? (nxt.rows + WG_BK - 1) / WG_BK : dgrad_kt;
            bwd_load_prologue<BN, WGRAD, S>(tiles, o, nxt, M, N, K, nkt);
        }

        int r = cur.m0 + wg * 64 + wwarp * 16 + (lane >> 2), c0 = cur.n0 + 2 * (lane & 3);
        if constexpr (!WGRAD) store_acc_bf16<BN>(acc, (bf16 *)out + (size_t)cur.r0 * N, N, r, c0, cur.rows);
        else add_acc_f32<BN>(acc, (float *)out + (size_t)cur.e * M * N, M, N, r, c0, K == 1);
        if (tn >= total) break;
        t = tn;
        cur = nxt;
        ktiles = nkt;
    }
}

template <int BN, bool WGRAD, int S = WgConfig<BN>::STAGES, int MINB = 1>
int launch_wgmma_bwd(void *out, const BwdOperands &o, const int *offsets, int E, int M, int N, int K) {
    static int smem_set;
    int smem = WgConfig<BN, S>::TILE_BYTES + 1024 + (WGRAD ? 1 : 2) * (E + 1) * (int)sizeof(int);
    if (smem * MINB > WG_SMEM_LIMIT) return -1;
    cuda_allow_smem((const void *)grouped_wgmma_bwd_kernel<BN, WGRAD, S, MINB>, &smem_set, smem);
    grouped_wgmma_bwd_kernel<BN, WGRAD, S, MINB><<<cuda_num_sms() * MINB, WG_THREADS, smem, cuda_stream()>>>(
        out, o, offsets, E, M, N, K);
    cudaLaunchCheck();
    return 0;
}


// ---------------------------------------------------------------------------
// Warp-specialised forward and data-grad: TMA loads and an mbarrier ring.
//
// 384 threads: warpgroup 0 is the producer, whose one elected thread issues
// the tile loads with the bulk tensor copy engine (TMA, cp.async.bulk.tensor)
// into a 4-deep ring of 48 KB stages; warpgroups 1 and 2 are the consumers,
// each owning 64 rows of the 128 x 256 output tile as in the kernels above.
// Stage s has two barriers: full[s] (the producer's expect_tx arrival plus
// the copy engine's byte count complete it) and empty[s] (all 256 consumer
// threads arrive once their wgmma on the stage are done). Nobody waits at a
// block-wide barrier after the start, so the producer runs ahead across tile
// boundaries while the consumers store the previous tile (loads overlap the
// epilogue), and the copy engine writes shared memory through the async
// proxy that wgmma reads, so no proxy fence is needed.
//
// Tensor maps (2D, 128-byte swizzle, built per call on the host): A is the
// grouped rows [rows, K] (K-major; box 64 x 128), its row count bounded by
// the end of the allocation it lives in (so a tile past the last segment
// reads zeros, never past the buffer); rows of a tile past its expert's
// segment read the next expert's rows, which only reach output rows the
// epilogue does not store. B is w as [E * N_rows, inner]: the forward's
// w_e [OC, C] (K-major; box 64 x 256) or the data-grad's w_e [OC, C] read
// N-major (K = OC; four 64 x 64 boxes per stage, one per 64 output
// columns: the MN-major atoms of bwd_load_stage). Columns or K past the
// matrix edge read zeros (or the next expert's weights times zero A).
constexpr int WS_THREADS = 384;
constexpr int WS_BN = 256;
constexpr int WS_STAGES = 4;
using WsCfg = WgConfig<WS_BN, WS_STAGES>;
static_assert(WS_BN == 256, "the weight-grad's tail zeroing splits B's four 64-column boxes between the two consumers");

struct WsMaps {
    CUtensorMap a, b, a2, b2; // a2, b2: the data-grad pair's second operands (WS_GLU: b2 the up weights)
    CUtensorMap o;            // the TMA epilogue's output: out [rows, N] BF16 (box 64 x 64) or dw [E*M, N] FP32 (32 x 64)
    CUtensorMap o2, o3;       // WS_GLU: the up product's and SwiGLU's outputs (o: the gate product's)
    void *out2, *out3;        // WS_GLU: the same as pointers (the epilogue from registers)
    double *sq;               // weight-grad: the slots of dw's sum of squares (ops_wgrad_slots), or NULL
};

// The weight-grad's sum of squares of the dw it leaves, by slots of 16 rows
// x 128 columns of dw[e] [M, N] (ops.h: ops_wgrad_slots; the CPU's
// cpu_wgrad_slots is the reference, bit for bit). Lane l of the warp that
// sums slot (e, i, j) takes rows 16 i + l / 4 and + 8 and columns 128 j +
// 2 (l % 4) + 8 t + {0, 1}, t = 0..15, which is where the wgmma
// accumulators put them: the epilogue of a warp sums the values it holds.
// Each lane adds its squares in FP64 in the order t, then (row, column),
// (row, column + 1), (row + 8, column), (row + 8, column + 1), skipping
// elements past M or N; the lanes' sums then add in a butterfly (xor 16, 8,
// 4, 2, 1) and lane 0 writes the slot. A square of an FP32 value is exact
// in FP64, so a fused multiply-add gives the same bits.
__device__ __forceinline__ void sq_quad(double &s, float x0, float x1, float y0, float y1, bool lo, bool hi) {
    if (lo) {
        s += (double)x0 * x0;
        s += (double)x1 * x1;
    }
    if (hi) {
        s += (double)y0 * y0;
        s += (double)y1 * y1;
    }
}

// The warp's butterfly, then lane 0 stores slot (e, r16, c128) when it exists.
__device__ __forceinline__ void sq_slot_store(double s, double *sq, int e, int r16, int c128, int M, int N) {
#pragma unroll
    for (int k = 16; k; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
    int rs = (M + 15) / 16, cs = (N + 127) / 128;
    if ((threadIdx.x & 31) == 0 && r16 < rs && c128 < cs) sq[((size_t)e * rs + r16) * cs + c128] = s;
}

// The slots of a warp's 16 rows x BN columns of accumulators (64 x BN per
// warpgroup, rows r and r + 8 for this lane, columns c0 + 8 j + {0, 1}),
// which are dw's values (dw = the tile): BN / 128 slots.
template <int BN>
__device__ __forceinline__ void acc_sumsq(const float (&acc)[BN / 2], double *sq, int e, int M, int N, int r, int c0,
                                          int n0) {
#pragma unroll
    for (int q = 0; q < BN / 128; q++) {
        double s = 0;
#pragma unroll
        for (int t = 0; t < 16; t++) {
            int j = 16 * q + t, c = c0 + 8 * j;
            bool c_ok = c < N;
            sq_quad(s, acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3], c_ok && r < M, c_ok && r + 8 < M);
        }
        sq_slot_store(s, sq, e, (r - (threadIdx.x & 31) / 4) / 16, n0 / 128 + q, M, N);
    }
}

// Quad j of a warp's accumulators (acc4 = &acc[4 j]: rows r and r + 8,
// columns c, c + 1) added to the old dw values lo (row r) and hi (row r +
// 8), stored where they exist, and with SQ their squares added to s in
// sq_quad's order.
template <bool SQ>
__device__ __forceinline__ void add_store_quad(const float *acc4, float2 lo, float2 hi, float *o, int N, int r, int c,
                                               bool l_ok, bool h_ok, double &s) {
    float x0 = lo.x + acc4[0], x1 = lo.y + acc4[1];
    float y0 = hi.x + acc4[2], y1 = hi.y + acc4[3];
    if (l_ok) *(float2 *)(o + (size_t)r * N + c) = make_float2(x0, x1);
    if (h_ok) *(float2 *)(o + (size_t)(r + 8) * N + c) = make_float2(y0, y1);
    if (SQ) sq_quad(s, x0, x1, y0, y1, l_ok, h_ok);
}

// dw += acc (one writer per element: a load, the FP32 addition the L2's
// reduction would do, a store) and the slots of the sums, for a warp's 16
// rows x BN columns as acc_sumsq.
template <int BN>
__device__ __forceinline__ void add_acc_f32_sumsq(const float (&acc)[BN / 2], float *o, double *sq, int e, int M, int N,
                                                  int r, int c0, int n0) {
#pragma unroll
    for (int q = 0; q < BN / 128; q++) {
        double s = 0;
#pragma unroll
        for (int h = 0; h < 2; h++) { // 8 quads at a time: their loads in flight together
            float2 lo[8], hi[8];
#pragma unroll
            for (int t = 0; t < 8; t++) {
                int c = c0 + 8 * (16 * q + 8 * h + t);
                bool c_ok = c < N;
                lo[t] = c_ok && r < M ? *(const float2 *)(o + (size_t)r * N + c) : make_float2(0.f, 0.f);
                hi[t] = c_ok && r + 8 < M ? *(const float2 *)(o + (size_t)(r + 8) * N + c) : make_float2(0.f, 0.f);
            }
#pragma unroll
            for (int t = 0; t < 8; t++) {
                int j = 16 * q + 8 * h + t, c = c0 + 8 * j;
                bool c_ok = c < N;
                add_store_quad<true>(acc + 4 * j, lo[t], hi[t], o, N, r, c, c_ok && r < M, c_ok && r + 8 < M, s);
            }
        }
        sq_slot_store(s, sq, e, (r - (threadIdx.x & 31) / 4) / 16, n0 / 128 + q, M, N);
    }
}

// dw += acc with the old dw values from a copy in shared memory (WS_DW_SMEM,
// the ping-pong's 128 x 128 tiles), and with SQ the slots as
// add_acc_f32_sumsq: `half` is the tile's 64-row half this warp's rows r,
// r + 8 are in, as the copy engine left it: four boxes of 64 rows x 32 FP32
// columns (8 KB each, 128-byte swizzle: row q at q * 128, its 16-byte chunk
// c at (c ^ (q % 8)) * 16), box b holding the tile's columns 32 b .. 32 b +
// 31. The loads are shared-memory reads (a warp's 8 rows x 32 bytes in the
// two wavefronts 256 bytes take), so the epilogue no longer waits on device
// memory. The additions (one writer per element, the FP32 sum
// red_add_quad's reduction makes), the stores and the sums are
// add_store_quad's in add_acc_f32_sumsq's order: the same dw and slots,
// bit for bit.
template <int BN, bool SQ>
__device__ __forceinline__ void add_acc_f32_smem(const float (&acc)[BN / 2], float *o, double *sq, int e, int M,
                                                 int N, int r, int c0, int n0, uint32_t half) {
    static_assert(BN == 128, "a 128-column tile: four 32-column boxes");
    const int lane = threadIdx.x & 31, rq = ((threadIdx.x >> 5) & 3) * 16 + lane / 4; // r's row in the half
    double s = 0;
#pragma unroll
    for (int t = 0; t < 16; t++) {
        int c = c0 + 8 * t;
        bool c_ok = c < N;
        // column 8 t + 2 (lane % 4) of the tile: box t / 4, chunk 2 (t % 4) + (lane % 4) / 2, byte 8 (lane % 2)
        uint32_t at = half + (t >> 2) * 8192 + swz(rq, 2 * (t & 3) + ((lane & 3) >> 1)) + 8 * (lane & 1);
        float2 lo, hi;
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(lo.x), "=f"(lo.y) : "r"(at));
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(hi.x), "=f"(hi.y) : "r"(at + 8 * 128));
        add_store_quad<SQ>(acc + 4 * t, lo, hi, o, N, r, c, c_ok && r < M, c_ok && r + 8 < M, s);
    }
    if (SQ) sq_slot_store(s, sq, e, (r - lane / 4) / 16, n0 / 128, M, N);
}

// The slots from dw in memory (the kernels without the fused sum, and the
// experts without rows, which have no tiles): one warp a slot, in the
// order above; with only_empty, the slots of experts with rows are left.
__global__ void wgrad_sumsq_slots_kernel(const float *dw, double *sq, const int *offsets, int E, int M, int N,
                                         int only_empty) {
    const int rs = (M + 15) / 16, cs = (N + 127) / 128, lane = threadIdx.x & 31;
    size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (w >= (size_t)E * rs * cs) return; // whole warps
    int e = (int)(w / ((size_t)rs * cs)), rem = (int)(w % ((size_t)rs * cs)), r16 = rem / cs, c128 = rem % cs;
    if (only_empty && offsets[e + 1] != offsets[e]) return;
    const float *o = dw + (size_t)e * M * N;
    int r = 16 * r16 + lane / 4, c0 = 128 * c128 + 2 * (lane & 3);
    double s = 0;
#pragma unroll 4
    for (int t = 0; t < 16; t++) {
        int c = c0 + 8 * t;
        bool c_ok = c < N, l_ok = c_ok && r < M, h_ok = c_ok && r + 8 < M;
        float2 lo = l_ok ? *(const float2 *)(o + (size_t)r * N + c) : make_float2(0.f, 0.f);
        float2 hi = h_ok ? *(const float2 *)(o + (size_t)(r + 8) * N + c) : make_float2(0.f, 0.f);
        sq_quad(s, lo.x, lo.y, hi.x, hi.y, l_ok, h_ok);
    }
    sq_slot_store(s, sq, e, r16, c128, M, N);
}

// The weight-grad (mode WS_WGRAD) uses the same ring: dw[e][M, N] +=
// A_e^T B_e with A = dout [rows, M] and B = inp [rows, N], both read
// M/N-major in 64 x 64 boxes (two for A's 128 rows of M, four for B), K =
// the expert's rows. A box that runs past the segment reads the next
// expert's rows (past the last expert: whatever the allocation holds
// next), so on a tile's last, partial K step each consumer warpgroup zeroes
// the K rows past the segment in its half of A and in half of B (a zero in
// one operand alone would not do: 0 x NaN is NaN) and the two wait for each
// other before their wgmma; the tile is added into dw by red_add_quad, or stored over it
// (WS_WGRAD_SET on the host: dw = A_e^T B_e, the same kernel with bit 1 of
// vec4 set; experts without rows, which have no tiles, are zeroed by
// zero_empty_experts first).
enum { WS_FWD = 0, WS_DGRAD = 1, WS_WGRAD = 2, WS_WGRAD_SET = 3, WS_GLU = 4 };
// WS_GLU, the experts' gate and up products and their SwiGLU in one
// forward: a tile is 128 rows x 128 columns of each product, its B stage
// the gate weights' 128 rows then the up weights' (so one m64n256k16 runs
// both on one load of A, which the two products' separate GEMMs each
// read), and the epilogue stores g, u and silu(g) u from the accumulators,
// each rounded to BF16 as the separate ops do: the same bits as the two
// forwards and swiglu_forward (the per-element sums do not depend on the
// instruction's N, as the weight-grad's 128 x 128 tiles showed).

// The epilogue's variants, bits of grouped_ws_kernel's `variant`:
// WS_STORE16 stores BF16 outputs 16 bytes per thread (a quad transpose,
// store_acc_bf16_v16) instead of 4 (store_acc_bf16); WS_PREFETCH_DW has the
// producer bring each weight-grad tile's dw rows into L2 (cp.async.bulk
// prefetch, 32 rows per K step) while the tile's K steps run, so that the
// += reductions of the epilogue hit L2 instead of waiting on device memory;
// WS_NO_EPILOGUE (benchmarks only: outputs are left unwritten) stores
// nothing, to time the main loop alone; WS_STAGGER (weight-grad only) holds
// the consumers of odd blocks back by about half their first tile, so that
// the blocks' epilogues (128 KB of FP32 reductions a tile, all blocks at
// once otherwise: their tiles have the same K) alternate between the two
// halves of the grid instead of meeting. None but WS_NO_EPILOGUE changes
// what is stored: the outputs are bit-identical under every other variant.
// H200, OLMoE shapes, 65536 rows (bench/results/2026-12-01-h200-issue19-
// grouped.md): WS_STORE16 lifts the forward 519 -> 599 TFLOP/s (gate/up) and
// 451 -> 569 (down), the data-grads 521 -> 609 and 522 -> 602 (pair); the
// prefetch slows the weight-grad += by 6-11% and the stagger changes
// nothing, so the default is WS_STORE16 alone.
// WS_TMA_EPI4 / WS_TMA_EPI3 store through shared memory and the copy engine
// (tma_epilogue: 4 stages and 16 KB of staging per consumer warpgroup, or 3
// stages and 32 KB); WS_TMA_BY_MODE takes EPI3 for the BF16 outputs and
// EPI4 for the weight-grads, the faster of the two for each (one call,
// 3 rounds: forward and data-grads 1.00-1.03x WS_STORE16 with EPI3,
// weight-grad += 1.05-1.08x with EPI4, bit-identical outputs at the OLMoE
// shapes).
// WS_PINGPONG / WS_PINGPONG_128 run every weight-grad on
// grouped_wgrad_pingpong_kernel (64 x 256 / 128 x 128 tiles per consumer
// warpgroup, which take turns), WS_PINGPONG_ADD only the += ones (128 x
// 128). Measured at e396024 (bench/results/2026-12-01-h200-issue19-wgrad-
// pingpong.md; one call, 5 interleaved rounds, TFLOP/s at the OLMoE shapes,
// gate/up | down, ratios against variant 0 in the same rounds):
//   weight-grad +=: WS_STORE16 409 | 405 (1.00x), TMA EPI4 427 | 418 (1.05x),
//     ping-pong 64 x 256 425 | 430 (1.05x), 128 x 128 474 | 480 (1.16x |
//     1.18x); main loops alone (WS_NO_EPILOGUE): 608 | 613, 539 | 560,
//     546 | 558: the ping-pong hides most of the FP32 epilogue but its main
//     loop is ~10% slower (1.33x / 1.67x the L2 bytes per FLOP).
//   weight-grad =: WS_STORE16 479 | 476, EPI4 480 | 477, ping-pong 417 |
//     450 and 469 | 467 (0.87-0.98x): the plain stores cost less than the
//     slower main loop.
//   forward / data-grads: EPI3 1.02-1.04x WS_STORE16 (590 | 568, 582, 590
//     against 573 | 542, 568, 576).
// test_backend_ops -o grouped --grouped-variant 65,193,321 passed (814
// checks; every variant bit for bit equal to the default), and
// bench_grouped's 40 bit-for-bit checks. So the default takes each call's
// fastest: EPI3 for the BF16 outputs, EPI4 for dw =, the 128 x 128
// ping-pong for dw += (variant 577).
// WS_DW_SMEM (dw += on the 128 x 128 ping-pong, with or without the grad
// norm's slots): the old dw from a copy the copy engine brings into shared
// memory under the other warpgroup's main loop, then plain stores, instead
// of the epilogue's own loads (with the slots) or red_add_quad's L2
// reductions (without) (grouped_wgrad_pingpong_kernel's SMEM_DW). The
// same bits as without it. Measured on an H100 (2026-12-07, bench_grouped
// sumsq, OLMoE shapes, 65536 rows, 5 interleaved rounds; 577 against 1601 =
// 577 + WS_DW_SMEM): dw += alone 0.842 -> 0.739 ms (gate/up, 1.14x) and
// 0.801 -> 0.635 (down, 1.26x), with the slots 0.845 -> 0.772 (1.10x) and
// 0.833 -> 0.732 (1.14x); OLMoE-1B-7B at 8 of its layers 94,804 -> 97,007
// tokens/s (1.023x, every loss and grad norm bit-identical;
// bench/results/2026-12-07-s10.md). So the default is 1601.
enum { WS_STORE16 = 1, WS_PREFETCH_DW = 2, WS_NO_EPILOGUE = 4, WS_STAGGER = 8, WS_TMA_EPI4 = 16, WS_TMA_EPI3 = 32,
       WS_TMA_BY_MODE = 64, WS_PINGPONG = 128, WS_PINGPONG_128 = 256, WS_PINGPONG_ADD = 512, WS_DW_SMEM = 1024 };
enum { WS_DEFAULT_VARIANT = WS_STORE16 | WS_TMA_BY_MODE | WS_PINGPONG_ADD | WS_DW_SMEM };
static_assert(2 * WS_DW_SMEM - 1 == CUDA_GROUPED_VARIANT_MAX, "the variants' range covers every WS_* bit");

// The TMA epilogue (kernels with STG > 0, variants WS_TMA_EPI4 / _EPI3):
// a consumer warpgroup's 64 x 256 half of the tile goes through its own
// STG bytes of shared memory in rounds of STG / 8 KB boxes, each box 64 rows
// x 128 bytes in the 128-byte-swizzled layout the output map expects (row r
// at r * 128, its 16-byte chunk c at (c ^ (r % 8)) * 16): BF16 by stmatrix
// (8 KB = 64 columns, 4 boxes), FP32 by 8-byte stores (32 columns, 8
// boxes). After a fence and the warpgroup's barrier, its first thread hands
// the round's boxes to the copy engine, which stores them (BF16 out, dw =)
// or adds them into dw (cp.reduce.async.bulk .add.f32; each element has one
// writer per call, so the sum is the single FP32 addition the L2 reductions
// did: the same bits); the warpgroup then goes on with its next tile while
// the copy engine drains the last round. Before a round overwrites the
// buffer, the first thread waits until the copy engine has read the
// previous one. Only whole halves take this path (rows past an expert's
// segment or past M must not be written); columns past N are outside the
// map, which the copy engine does not write.
// Stages round q's BPR boxes (64 columns each: box b holds accumulator
// columns 64 (BPR q + b)..) of a warpgroup's 64 x 256 BF16 results into stg
// by stmatrix, 64 rows x 128 bytes a box in the output map's swizzle.
template <int BPR>
__device__ __forceinline__ void stage_bf16_boxes(const float (&acc)[WS_BN / 2], uint32_t stg, int q, int warp,
                                                 int lane) {
    constexpr int BOX = 8192, JB = 8; // JB: 8-column groups a box
    // matrices (h, j) as stmatrix.x4 takes them: lanes 8i.. give matrix i = (h = i % 2, j + i / 2)
    int mi = lane >> 3, row = warp * 16 + 8 * (mi & 1) + (lane & 7);
#pragma unroll
    for (int jj = 0; jj < JB * BPR; jj += 2) {
        int j = JB * BPR * q + jj, js = j + (mi >> 1);
        uint32_t addr = stg + (js / JB - BPR * q) * BOX + row * 128 + (((js % JB) ^ (row & 7)) << 4);
        stmatrix_x4(addr, bf16x2_bits(acc[4 * j], acc[4 * j + 1]), bf16x2_bits(acc[4 * j + 2], acc[4 * j + 3]),
                    bf16x2_bits(acc[4 * j + 4], acc[4 * j + 5]), bf16x2_bits(acc[4 * j + 6], acc[4 * j + 7]));
    }
}

template <bool WGRAD, int STG>
__device__ __forceinline__ void tma_epilogue(const float (&acc)[WS_BN / 2], const CUtensorMap *map, uint32_t stg,
                                             int cw, int warp, int lane, int n0, int c1, int N, bool reduce) {
    constexpr int BOX = 8192, NB = WGRAD ? 8 : 4, BPR = STG / BOX, JB = WGRAD ? 4 : 8; // JB: 8-column groups a box
    static_assert(STG % BOX == 0 && NB % BPR == 0, "whole boxes, whole rounds");
    const bool lead = (threadIdx.x & 127) == 0;
    const int cols_per_box = WGRAD ? 32 : 64;
#pragma unroll
    for (int q = 0; q < NB / BPR; q++) {
        if (lead) bulk_wait_read<0>(); // the buffer's previous round has been read
        named_barrier(3 + cw, 128);
        if constexpr (!WGRAD) {
            stage_bf16_boxes<BPR>(acc, stg, q, warp, lane);
        } else {
            int p = lane & 3;
#pragma unroll
            for (int jj = 0; jj < JB * BPR; jj++) {
                int j = JB * BPR * q + jj;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int row = warp * 16 + 8 * h + (lane >> 2), chunk = 2 * (j % JB) + (p >> 1);
                    uint32_t addr = stg + (j / JB - BPR * q) * BOX + row * 128 + ((chunk ^ (row & 7)) << 4) + (p & 1) * 8;
                    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(acc[4 * j + 2 * h]),
                                 "f"(acc[4 * j + 2 * h + 1])
                                 : "memory");
                }
            }
        }
        fence_proxy_async(); // generic-proxy writes before the copy engine reads them
        named_barrier(3 + cw, 128);
        if (lead) {
#pragma unroll
            for (int b = 0; b < BPR; b++) {
                int c0 = n0 + cols_per_box * (BPR * q + b);
                if (c0 >= N) continue;
                if (reduce) tma_reduce_add_2d(map, stg + b * BOX, c0, c1);
                else tma_store_2d(map, stg + b * BOX, c0, c1);
            }
            bulk_commit();
        }
    }
}

// SwiGLU in place over a warpgroup's gate half: acc[i] (the gate product,
// columns 0..127) = silu(g) u of the two products rounded to BF16 (acc[i +
// 64] holds the up product's same element).
__device__ __forceinline__ void glu_in_place(float (&acc)[WS_BN / 2]) {
#pragma unroll
    for (int i = 0; i < WS_BN / 4; i++)
        acc[i] = swiglu_value(__bfloat162float(__float2bfloat16_rn(acc[i])),
                              __bfloat162float(__float2bfloat16_rn(acc[i + WS_BN / 4])));
}

// WS_GLU's epilogue through shared memory and the copy engine (32 KB of
// staging a warpgroup, 4 boxes): round 1 the gate (boxes 0, 1) and up (2, 3)
// products at columns n0.., round 2 SwiGLU's (boxes 0, 1) after glu_in_place.
__device__ __forceinline__ void glu_tma_epilogue(float (&acc)[WS_BN / 2], const WsMaps &maps, uint32_t stg, int cw,
                                                 int warp, int lane, int n0, int c1, int N) {
    const bool lead = (threadIdx.x & 127) == 0;
#pragma unroll
    for (int round = 0; round < 2; round++) {
        if (round == 1) glu_in_place(acc);
        if (lead) bulk_wait_read<0>(); // the buffer's previous round has been read
        named_barrier(3 + cw, 128);
        if (round == 0) stage_bf16_boxes<4>(acc, stg, 0, warp, lane);
        else stage_bf16_boxes<2>(acc, stg, 0, warp, lane);
        fence_proxy_async(); // generic-proxy writes before the copy engine reads them
        named_barrier(3 + cw, 128);
        if (lead) {
#pragma unroll
            for (int b = 0; b < (round == 0 ? 4 : 2); b++) {
                int c0 = n0 + 64 * (b & 1);
                if (c0 >= N) continue;
                tma_store_2d(round == 1 ? &maps.o3 : b < 2 ? &maps.o : &maps.o2, stg + b * 8192, c0, c1);
            }
            bulk_commit();
        }
    }
}

// The same from registers (rows past the segment masked): g, u, then SwiGLU.
__device__ __forceinline__ void glu_reg_epilogue(float (&acc)[WS_BN / 2], void *g, const WsMaps &maps, int r0, int N,
                                                 int r, int c0, int rows) {
    const float(&lo)[WS_BN / 4] = *reinterpret_cast<const float(*)[WS_BN / 4]>(&acc[0]);
    const float(&hi)[WS_BN / 4] = *reinterpret_cast<const float(*)[WS_BN / 4]>(&acc[WS_BN / 4]);
    store_acc_bf16_v16<WS_BN / 2>(lo, (bf16 *)g + (size_t)r0 * N, N, r, c0, rows);
    store_acc_bf16_v16<WS_BN / 2>(hi, (bf16 *)maps.out2 + (size_t)r0 * N, N, r, c0, rows);
    glu_in_place(acc);
    store_acc_bf16_v16<WS_BN / 2>(lo, (bf16 *)maps.out3 + (size_t)r0 * N, N, r, c0, rows);
}

// out[R, N] = A[R, K] B_e^T (forward: B_e [N, K]) or A[R, K] B_e (data-grad:
// B_e [K, N]), plus A2 B2_e when pair; or dw (weight-grad, above; M rows,
// vec4 as red_add_quad's, K unused). N >= 256.
template <int MODE, int S = WS_STAGES, int STG = 0>
__global__ void __launch_bounds__(WS_THREADS, 1)
grouped_ws_kernel(void *out, const __grid_constant__ WsMaps maps, int pair, const int *offsets, int E, int M, int N,
                  int K, int vec4, int variant) {
    constexpr int BN = WS_BN;
    constexpr bool DGRAD = MODE == WS_DGRAD, WGRAD = MODE == WS_WGRAD, GLU = MODE == WS_GLU;
    constexpr int TBN = GLU ? BN / 2 : BN; // output columns a tile (of each product, WS_GLU)
    using Cfg = WgConfig<WS_BN, S>;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    uint32_t tiles = (raw + 1023) & ~1023u;
    uint32_t staging = tiles + Cfg::TILE_BYTES; // STG bytes per consumer warpgroup (the TMA epilogue)
    uint32_t full0 = staging + 2 * STG, empty0 = full0 + 8 * S; // S barriers each, 8 bytes apiece
    int *s_off = (int *)(smem_raw + (tiles - raw) + Cfg::TILE_BYTES + 2 * STG + 16 * S);
    int *s_tile = s_off + E + 1;
    int col_tiles = (N + TBN - 1) / TBN;
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            mbar_init(full0 + 8 * s, 1);
            mbar_init(empty0 + 8 * s, 256);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    grouped_load_offsets<WS_THREADS>(offsets, E, s_off); // ends with a barrier
    int total, per_e = 1;
    if constexpr (WGRAD) {
        per_e = (M + WG_BM - 1) / WG_BM * col_tiles;
        total = E * per_e;
    } else {
        total = grouped_tile_prefix<WG_BM>(s_off, E, col_tiles, s_tile);
    }
    // the tiles this block takes (weight-grad: skipping experts without rows)
    auto first = [&]() { return WGRAD ? wgrad_skip_empty(blockIdx.x, total, gridDim.x, s_off, per_e) : (int)blockIdx.x; };
    auto next = [&](int t) { return WGRAD ? wgrad_skip_empty(t + gridDim.x, total, gridDim.x, s_off, per_e) : t + (int)gridDim.x; };
    auto tile_at = [&](int t) {
        return WGRAD ? wgrad_locate(t, s_off, per_e, col_tiles, BN) : locate(t, s_off, s_tile, E, col_tiles, TBN);
    };
    int kt1 = (K + WG_BK - 1) / WG_BK, dgrad_kt = (pair ? 2 : 1) * kt1;
    int wg = threadIdx.x >> 7;

    if (wg == 0) { // producer: one thread issues every load
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x != 0) return;
        int slot = 0;
        uint32_t phase = 0;
        for (int t = first(); t < total; t = next(t)) {
            Tile tl = tile_at(t);
            int ktiles = WGRAD ? (tl.rows + WG_BK - 1) / WG_BK : dgrad_kt;
            // weight-grad +=: the tile's rows of dw, 32 per K step, into L2
            // ahead of the epilogue's reductions (WS_PREFETCH_DW)
            const float *pf = (const float *)out + ((size_t)tl.e * M + tl.m0) * N + tl.n0;
            int pf_rows = WGRAD && (variant & WS_PREFETCH_DW) && (vec4 & 3) == 1 ? min(WG_BM, M - tl.m0) : 0;
            uint32_t pf_bytes = (uint32_t)min(BN, N - tl.n0) * 4;
            for (int kt = 0; kt < ktiles; kt++) {
                mbar_wait(empty0 + 8 * slot, phase ^ 1); // a fresh barrier passes parity 1 at once
                uint32_t st = tiles + slot * Cfg::STAGE_BYTES, fb = full0 + 8 * slot;
                mbar_expect_tx(fb, Cfg::STAGE_BYTES);
                bool second = kt >= kt1 && !WGRAD;
                int k0 = (second ? kt - kt1 : kt) * WG_BK;
                const CUtensorMap *ma = second ? &maps.a2 : &maps.a, *mb = second ? &maps.b2 : &maps.b;
                if constexpr (WGRAD) {
                    tma_load_2d(st, ma, tl.m0, tl.r0 + k0, fb);
                    tma_load_2d(st + MN_LBO, ma, tl.m0 + 64, tl.r0 + k0, fb);
#pragma unroll
                    for (int j = 0; j < BN / 64; j++)
                        tma_load_2d(st + Cfg::A_BYTES + j * MN_LBO, mb, tl.n0 + 64 * j, tl.r0 + k0, fb);
                } else if constexpr (GLU) { // B: the gate weights' 128 rows, then the up weights'
                    tma_load_2d(st, ma, k0, tl.r0 + tl.m0, fb);
                    tma_load_2d(st + Cfg::A_BYTES, mb, k0, tl.e * N + tl.n0, fb);
                    tma_load_2d(st + Cfg::A_BYTES + Cfg::B_BYTES / 2, &maps.b2, k0, tl.e * N + tl.n0, fb);
                } else if constexpr (!DGRAD) {
                    tma_load_2d(st, ma, k0, tl.r0 + tl.m0, fb);
                    tma_load_2d(st + Cfg::A_BYTES, mb, k0, tl.e * N + tl.n0, fb);
                } else {
                    tma_load_2d(st, ma, k0, tl.r0 + tl.m0, fb);
#pragma unroll
                    for (int j = 0; j < BN / 64; j++)
                        tma_load_2d(st + Cfg::A_BYTES + j * MN_LBO, mb, tl.n0 + 64 * j, tl.e * K + k0, fb);
                }
                ring_next(slot, phase, S);
                if constexpr (WGRAD) {
                    int hi = kt == ktiles - 1 ? pf_rows : min(pf_rows, 32 * (kt + 1));
                    for (int i = 32 * kt; i < hi; i++) bulk_prefetch_l2(pf + (size_t)i * N, pf_bytes);
                }
            }
        }
        return;
    }

    // consumers
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    int slot = 0;
    uint32_t phase = 0;
    float acc[Cfg::ACC];
#pragma unroll
    for (int i = 0; i < Cfg::ACC; i++) acc[i] = 0.0f;
    if (WGRAD && (variant & WS_STAGGER) && (blockIdx.x & 1) && first() < total) {
        // ~0.4 us a K step: about half a tile at the kernel's rate
        uint64_t until = global_ns() + 400ull * ((tile_at(first()).rows + WG_BK - 1) / WG_BK);
        while (global_ns() < until) __nanosleep(256);
    }
    for (int t = first(); t < total; t = next(t)) {
        Tile tl = tile_at(t);
        int ktiles = WGRAD ? (tl.rows + WG_BK - 1) / WG_BK : dgrad_kt;
        int prev = 0;
        for (int kt = 0; kt < ktiles; kt++) {
            mbar_wait(full0 + 8 * slot, phase);
            uint32_t st = tiles + slot * Cfg::STAGE_BYTES;
            if constexpr (WGRAD) {
                int valid = tl.rows - kt * WG_BK; // K rows of this step inside the segment
                if (valid < WG_BK) {
                    // Zero the K rows valid..63 (128 bytes each) of this
                    // warpgroup's half of A and of its half of B's four 64-column
                    // boxes (2 cw, 2 cw + 1): both operands, because past the
                    // last expert those rows are whatever follows in the
                    // allocation, and 0 x Inf or 0 x NaN is NaN. The two
                    // consumer warpgroups then wait for each other (named barrier
                    // 5), as each reads all of B.
                    int ct = threadIdx.x & 127, per = (WG_BK - valid) * 8; // 16-byte chunks per box
                    for (int i = ct; i < 3 * per; i += 128) {
                        int box = i / per, r = i - box * per, kr = valid + (r >> 3);
                        uint32_t base = box == 0 ? st + cw * MN_LBO : st + WsCfg::A_BYTES + (2 * cw + box - 1) * MN_LBO;
                        uint32_t addr = base + (kr >> 3) * MN_SBO + (kr & 7) * 128 + (r & 7) * 16;
                        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
                    }
                    fence_proxy_async(); // generic writes before the async-proxy reads
                    named_barrier(5, 256); // 5: tma_epilogue takes 3 and 4
                }
            }
            wgmma_fence();
            if constexpr (WGRAD) {
                uint64_t da = smem_desc_mn(st + cw * MN_LBO), db = smem_desc_mn(st + Cfg::A_BYTES);
#pragma unroll
                for (int kk = 0; kk < WG_BK / 16; kk++)
                    wgmma_n256<1, 1>(acc, da + (uint64_t)MN_KSTEP_DESC * kk, db + (uint64_t)MN_KSTEP_DESC * kk,
                                     kt > 0 || kk > 0);
            } else if constexpr (!DGRAD) {
                uint64_t da = smem_desc(st + cw * 64 * 128);
                uint64_t db = smem_desc(st + Cfg::A_BYTES);
#pragma unroll
                for (int kk = 0; kk < WG_BK / 16; kk++) wgmma_n256<0, 0>(acc, da + 2 * kk, db + 2 * kk, kt > 0 || kk > 0);
            } else {
                uint64_t da = smem_desc(st + cw * 64 * 128), db = smem_desc_mn(st + Cfg::A_BYTES);
#pragma unroll
                for (int kk = 0; kk < WG_BK / 16; kk++)
                    wgmma_n256<0, 1>(acc, da + 2 * kk, db + (uint64_t)MN_KSTEP_DESC * kk, kt > 0 || kk > 0);
            }
            wgmma_commit();
            ring_consumed(empty0, kt, prev, slot, phase, S); // the previous stage goes back
        }
        wgmma_wait<0>();
        mbar_arrive(empty0 + 8 * prev);

        if (variant & WS_NO_EPILOGUE) continue; // timing only: nothing stored
        if constexpr (WGRAD) // dw = acc (the host passes sq for dw = only)
            if (maps.sq)
                acc_sumsq<BN>(acc, maps.sq, tl.e, M, N, tl.m0 + cw * 64 + warp * 16 + (lane >> 2),
                              tl.n0 + 2 * (lane & 3), tl.n0);
        if constexpr (GLU) {
            int half = tl.m0 + cw * 64;
            if (STG == 32768 && half + 64 <= tl.rows)
                glu_tma_epilogue(acc, maps, staging + cw * STG, cw, warp, lane, tl.n0, tl.r0 + half, N);
            else
                glu_reg_epilogue(acc, out, maps, tl.r0, N, tl.m0 + cw * 64 + warp * 16 + (lane >> 2),
                                 tl.n0 + 2 * (lane & 3), tl.rows);
            continue;
        }
        if constexpr (STG > 0) { // whole 64-row halves through shared memory and the copy engine
            int half = tl.m0 + cw * 64; // this warpgroup's first row (weight-grad: of dw_e)
            if (half + 64 <= (WGRAD ? M : tl.rows)) {
                int c1 = WGRAD ? tl.e * M + half : tl.r0 + half;
                tma_epilogue<WGRAD, STG>(acc, &maps.o, staging + cw * STG, cw, warp, lane, tl.n0, c1, N,
                                         WGRAD && !(vec4 & 2));
                continue;
            }
        }
        int r = tl.m0 + cw * 64 + warp * 16 + (lane >> 2), c0 = tl.n0 + 2 * (lane & 3);
        if constexpr (WGRAD) {
            float *o = (float *)out + (size_t)tl.e * M * N;
            if (vec4 & 2) add_acc_f32<BN, true>(acc, o, M, N, r, c0, vec4 & 1);
            else add_acc_f32<BN>(acc, o, M, N, r, c0, vec4 & 1);
        } else if (variant & WS_STORE16) {
            store_acc_bf16_v16<BN>(acc, (bf16 *)out + (size_t)tl.r0 * N, N, r, c0, tl.rows);
        } else {
            store_acc_bf16<BN>(acc, (bf16 *)out + (size_t)tl.r0 * N, N, r, c0, tl.rows);
        }
    }
    if (STG > 0 && (threadIdx.x & 127) == 0) bulk_wait<0>(); // the last stores out of shared memory
}

// WS_DW_SMEM: the copy engine brings tile tl's 128 x 128 FP32 block of
// dw [E M, N] (rows e M + m0 .., columns n0 ..; maps.o, boxes of 32
// columns x 64 rows) into `buf` as up to 8 boxes, box (h, b) at (4 h + b)
// 8 KB, onto barrier bar. A box that starts past dw's last column or row
// is not asked for (the epilogue uses none of its values); the part of a
// box past them comes back as zeros, counted in the transaction all the
// same; rows past M are the next expert's, which the epilogue does not use.
__device__ __forceinline__ void dw_copy_load(uint32_t buf, uint32_t bar, const CUtensorMap *map, const Tile &tl, int M,
                                             int N, int E) {
    int nb = min(4, (N - tl.n0 + 31) / 32), row0 = tl.e * M + tl.m0, nh = row0 + 64 < E * M ? 2 : 1;
    mbar_expect_tx(bar, (uint32_t)(nh * nb * 8192));
    for (int h = 0; h < nh; h++)
        for (int b = 0; b < nb; b++) tma_load_2d(buf + (4 * h + b) * 8192, map, tl.n0 + 32 * b, row0 + 64 * h, bar);
}

// ---------------------------------------------------------------------------
// Weight-grad ping-pong (variants WS_PINGPONG: TM x TN = 64 x 256, 5 stages;
// WS_PINGPONG_128 and, for += only, WS_PINGPONG_ADD: 128 x 128, 6 stages;
// the default for +=): the producer and the ring of
// grouped_ws_kernel, but each consumer warpgroup owns whole TM x TN tiles
// of dw (128 FP32 accumulators a thread either way), warpgroup w taking the
// block's tiles w, w + 2, ... (skipping the stages of the other's tiles in
// the ring). Two ordering barriers make their main loops take turns:
// warpgroup w issues a tile's first wgmma only after the other has issued
// its previous tile's last (order[w], one arrival per tile), so that one
// warpgroup's epilogue (the same red_add_quad or store from registers)
// runs under the other's wgmma instead of idling the tensor cores. Each dw
// element still has one writer per call, and its K is summed in the same
// k16 steps in the same order, so the sum is the default's: 64 x 256 is the
// same m64n256k16 instruction on the same rows; 128 x 128 issues m64n128k16
// instead (the same per-element products; bench_grouped and
// test_backend_ops check the bits). Shared memory: S stages of TM + TN
// rows of 64 K (one 64 x 64 box per 64 of them, A's then B's), so a tile
// moves (TM + TN) / (TM TN) bytes from L2 per FLOP: 1.67x (64 x 256) and
// 1.33x (128 x 128) what grouped_ws_kernel's 128 x 256 tiles move. A partial last
// K step is zeroed past the segment in all the warpgroup's boxes (its own
// stage: no wait for the other warpgroup).
//
// SMEM_DW (variant WS_DW_SMEM, 128 x 128 only, +=): the epilogue takes
// the old dw from a 64 KB copy in shared memory and stores the sums,
// instead of loading dw itself (with the grad norm's slots: the loads'
// latency, one tile's 64 KB with 16 KB in flight a warpgroup, left the
// epilogue longer than the other warpgroup's main loop) or reducing into
// it in L2 (red_add_quad, without the slots). One copy serves both warpgroups,
// in the order of the block's tiles: the warpgroup of tile i, once every
// thread of it has read tile i's copy, has the copy engine bring tile i +
// 1's (8 boxes of maps.o, 64 rows x 32 columns) onto dwbar[(i + 1) % 2];
// tile 0's is asked for by warpgroup 0 before its first main loop. So each
// load has the other warpgroup's main loop to land in, a load never
// overwrites a copy still being read, and each barrier completes once per
// tile of its warpgroup, in order (its parity is the tile's count there).
template <int TM, int S, bool SMEM_DW = false>
__global__ void __launch_bounds__(WS_THREADS, 1)
grouped_wgrad_pingpong_kernel(float *dw, const __grid_constant__ WsMaps maps, const int *offsets, int E, int M, int N,
                              int vec4, int variant) {
    constexpr int TN = 16384 / TM, NA = TM / 64, NB = TN / 64;
    constexpr int A_BYTES = NA * MN_LBO, STAGE = (NA + NB) * MN_LBO;
    constexpr int DW_BYTES = SMEM_DW ? TM * TN * 4 : 0;
    static_assert(!SMEM_DW || (TM == 128 && TN == 128), "the shared copy of dw: 128 x 128 tiles");
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    uint32_t tiles = (raw + 1023) & ~1023u;
    uint32_t dwbuf = tiles + S * STAGE; // SMEM_DW: the copy (1024-aligned: STAGE is)
    uint32_t full0 = dwbuf + DW_BYTES, empty0 = full0 + 8 * S, order0 = empty0 + 8 * S; // order[w] at order0 + 8 w
    uint32_t dwbar0 = order0 + 16;                                                          // SMEM_DW: dwbar[w]
    int *s_off = (int *)(smem_raw + (tiles - raw) + S * STAGE + DW_BYTES + 16 * S + 16 + (SMEM_DW ? 16 : 0));
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            mbar_init(full0 + 8 * s, 1);
            mbar_init(empty0 + 8 * s, 128); // one consumer warpgroup a stage
        }
        mbar_init(order0, 1);
        mbar_init(order0 + 8, 1);
        if (SMEM_DW) {
            mbar_init(dwbar0, 1);
            mbar_init(dwbar0 + 8, 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    grouped_load_offsets<WS_THREADS>(offsets, E, s_off); // ends with a barrier
    const int col_tiles = (N + TN - 1) / TN, per_e = (M + TM - 1) / TM * col_tiles, total = E * per_e;
    const int first = wgrad_skip_empty(blockIdx.x, total, gridDim.x, s_off, per_e);
    int wg = threadIdx.x >> 7;

    if (wg == 0) { // producer: one thread issues every load
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x != 0) return;
        int slot = 0;
        uint32_t phase = 0;
        for (int t = first; t < total; t = wgrad_skip_empty(t + gridDim.x, total, gridDim.x, s_off, per_e)) {
            Tile tl = wgrad_locate(t, s_off, per_e, col_tiles, TN, TM);
            int ktiles = (tl.rows + WG_BK - 1) / WG_BK;
            for (int kt = 0; kt < ktiles; kt++) {
                mbar_wait(empty0 + 8 * slot, phase ^ 1);
                uint32_t st = tiles + slot * STAGE, fb = full0 + 8 * slot;
                mbar_expect_tx(fb, STAGE);
                int k = tl.r0 + kt * WG_BK;
#pragma unroll
                for (int a = 0; a < NA; a++) tma_load_2d(st + a * MN_LBO, &maps.a, tl.m0 + 64 * a, k, fb);
#pragma unroll
                for (int b = 0; b < NB; b++) tma_load_2d(st + A_BYTES + b * MN_LBO, &maps.b, tl.n0 + 64 * b, k, fb);
                ring_next(slot, phase, S);
            }
        }
        return;
    }

    // consumers
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    int slot = 0, mine = 0; // mine: tiles this warpgroup has taken
    uint32_t phase = 0;
    float acc[NA][TN / 2];
    if (SMEM_DW && cw == 0 && (threadIdx.x & 127) == 0 && first < total) // tile 0's copy of dw
        dw_copy_load(dwbuf, dwbar0, &maps.o, wgrad_locate(first, s_off, per_e, col_tiles, TN, TM), M, N, E);
    int i = 0; // the tile's place in the block's list
    for (int t = first; t < total; t = wgrad_skip_empty(t + gridDim.x, total, gridDim.x, s_off, per_e), i++) {
        Tile tl = wgrad_locate(t, s_off, per_e, col_tiles, TN, TM);
        int ktiles = (tl.rows + WG_BK - 1) / WG_BK;
        if ((i & 1) != cw) { // the other warpgroup's: pass over its stages
            slot += ktiles;
            phase ^= (uint32_t)(slot / S) & 1;
            slot %= S;
            continue;
        }
        // warpgroup 0's tile j waits for the other's tile j - 1 (j > 0),
        // warpgroup 1's tile j for warpgroup 0's tile j: arrival `need` on
        // order[cw]. Before any full wait of the tile: every stage before it
        // has landed then, so no full barrier is two phases behind the
        // parity waited for (which would pass it early).
        int need = mine - 1 + cw;
        if (need >= 0) mbar_wait(order0 + 8 * cw, (uint32_t)need & 1);
        mine++;
        int prev = 0;
        for (int kt = 0; kt < ktiles; kt++) {
            mbar_wait(full0 + 8 * slot, phase);
            uint32_t st = tiles + slot * STAGE;
            int valid = tl.rows - kt * WG_BK; // K rows of this step inside the segment
            if (valid < WG_BK) {
                // zero K rows valid..63 (128 bytes each) of every box of the
                // stage, A's and B's (0 x NaN is NaN: both operands)
                int ct = threadIdx.x & 127, per = (WG_BK - valid) * 8; // 16-byte chunks a box
                for (int z = ct; z < (NA + NB) * per; z += 128) {
                    int box = z / per, r = z - box * per, kr = valid + (r >> 3);
                    uint32_t addr = st + box * MN_LBO + (kr >> 3) * MN_SBO + (kr & 7) * 128 + (r & 7) * 16;
                    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
                }
                fence_proxy_async();        // generic writes before the async-proxy reads
                named_barrier(6 + cw, 128); // the warpgroup's four warps
            }
            wgmma_fence();
            uint64_t db = smem_desc_mn(st + A_BYTES);
#pragma unroll
            for (int h = 0; h < NA; h++) {
                uint64_t da = smem_desc_mn(st + h * MN_LBO);
#pragma unroll
                for (int kk = 0; kk < WG_BK / 16; kk++)
                    bwd_wgmma<TN, true>(acc[h], da + (uint64_t)MN_KSTEP_DESC * kk, db + (uint64_t)MN_KSTEP_DESC * kk,
                                        kt > 0 || kk > 0);
            }
            wgmma_commit();
            // the tile's last wgmma are issued: the other warpgroup's turn
            if (kt == ktiles - 1 && (threadIdx.x & 127) == 0) mbar_arrive(order0 + 8 * (1 - cw));
            ring_consumed(empty0, kt, prev, slot, phase, S); // the previous stage goes back
        }
        wgmma_wait<0>();
        mbar_arrive(empty0 + 8 * prev);

        if (variant & WS_NO_EPILOGUE) continue; // timing only: nothing stored
        float *o = dw + (size_t)tl.e * M * N;
        int c0 = tl.n0 + 2 * (lane & 3);
        if constexpr (SMEM_DW) {
            mbar_wait(dwbar0 + 8 * cw, (uint32_t)(mine - 1) & 1); // this tile's copy has landed
#pragma unroll
            for (int h = 0; h < NA; h++) {
                int r = tl.m0 + 64 * h + warp * 16 + (lane >> 2);
                uint32_t half = dwbuf + h * 4 * 8192;
                if (maps.sq) add_acc_f32_smem<TN, true>(acc[h], o, maps.sq, tl.e, M, N, r, c0, tl.n0, half);
                else add_acc_f32_smem<TN, false>(acc[h], o, NULL, tl.e, M, N, r, c0, tl.n0, half);
            }
            fence_proxy_async();        // the copy's reads before the copy engine's next writes
            named_barrier(6 + cw, 128); // ... by every thread of the warpgroup
            int tn = wgrad_skip_empty(t + gridDim.x, total, gridDim.x, s_off, per_e);
            if ((threadIdx.x & 127) == 0 && tn < total) // the next tile's copy, for the other warpgroup
                dw_copy_load(dwbuf, dwbar0 + 8 * (1 - cw), &maps.o, wgrad_locate(tn, s_off, per_e, col_tiles, TN, TM),
                             M, N, E);
        } else {
#pragma unroll
            for (int h = 0; h < NA; h++) {
                int r = tl.m0 + 64 * h + warp * 16 + (lane >> 2);
                if (maps.sq && !(vec4 & 2)) {
                    add_acc_f32_sumsq<TN>(acc[h], o, maps.sq, tl.e, M, N, r, c0, tl.n0);
                    continue;
                }
                if (maps.sq) acc_sumsq<TN>(acc[h], maps.sq, tl.e, M, N, r, c0, tl.n0);
                if (vec4 & 2) add_acc_f32<TN, true>(acc[h], o, M, N, r, c0, vec4 & 1);
                else add_acc_f32<TN>(acc[h], o, M, N, r, c0, vec4 & 1);
            }
        }
    }
}

// dw[e] = 0 for the experts without rows (grid.y = expert).
__global__ void zero_empty_experts(float *dw, const int *offsets, size_t per_expert) {
    int e = blockIdx.y;
    if (offsets[e + 1] != offsets[e]) return;
    float *d = dw + (size_t)e * per_expert;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < per_expert; i += (size_t)gridDim.x * blockDim.x)
        d[i] = 0.f;
}

} // namespace

// ---- host side of the TMA kernels ----------------------------------------------

int wgmma_bn(int N);
extern "C" int wgrad_vec4(const float *dw); // gemm.cu

// cuTensorMapEncodeTiled and cuMemGetAddressRange from the driver (the
// runtime is linked statically; the driver is loaded by it): 1 when found.
static PFN_cuTensorMapEncodeTiled_v12000 encode_tiled;
static PFN_cuMemGetAddressRange_v3020 address_range;
int cuda_tma_available(void) {
    static int state;
    if (!state) {
        cudaDriverEntryPointQueryResult q1, q2;
        void *f1 = NULL, *f2 = NULL;
        int ok = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f1, 12000, cudaEnableDefault, &q1) ==
                     cudaSuccess &&
                 q1 == cudaDriverEntryPointSuccess &&
                 cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f2, 12000, cudaEnableDefault, &q2) ==
                     cudaSuccess &&
                 q2 == cudaDriverEntryPointSuccess;
        encode_tiled = (PFN_cuTensorMapEncodeTiled_v12000)f1;
        address_range = (PFN_cuMemGetAddressRange_v3020)f2;
        state = ok ? 1 : -1;
    }
    return state == 1;
}

// Rows of `cols` BF16 elements from p to the end of p's allocation (0 when
// the driver does not know p).
uint64_t cuda_rows_to_end(const void *p, size_t row_bytes) {
    CUdeviceptr base;
    size_t size;
    if (address_range(&base, &size, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS) return 0;
    return ((uint64_t)base + size - (uint64_t)(uintptr_t)p) / row_bytes;
}
static uint64_t rows_to_end(const void *p, int cols) { return cuda_rows_to_end(p, (size_t)cols * 2); }

int cuda_tensor_map_2d(CUtensorMap *m, const void *p, CUtensorMapDataType type, int elem_bytes, uint64_t inner,
                       uint64_t outer, uint32_t box_inner, uint32_t box_outer) {
    if (outer == 0 || outer > (1ull << 31)) return -1;
    cuuint64_t dims[2] = {inner, outer}, strides[1] = {inner * (uint64_t)elem_bytes};
    cuuint32_t box[2] = {box_inner, box_outer}, elem[2] = {1, 1};
    return encode_tiled(m, type, 2, (void *)p, dims, strides, box, elem,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS
               ? 0
               : -1;
}
// A 2D BF16 tensor map over [outer, inner] (inner contiguous), box
// box_inner x box_outer, 128-byte swizzle: 0, or -1 when the driver refuses.
static int tensor_map(CUtensorMap *m, const void *p, uint64_t inner, uint64_t outer, uint32_t box_inner,
                      uint32_t box_outer) {
    return cuda_tensor_map_2d(m, p, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, inner, outer, box_inner, box_outer);
}

// device.cuda.gemm_tma: false runs the cp.async kernels instead.
static int tma_wanted(void) { return cuda_settings()->gemm_tma != 0; }

// The epilogue variant: WS_DEFAULT_VARIANT unless a benchmark or test has
// set another (cuda_grouped_set_variant, a number 0-CUDA_GROUPED_VARIANT_MAX of the WS_* bits;
// tests/gpu/bench_grouped.c interleaves them). Not configuration: the
// variants other than the default are measured, not supported.
static int ws_variant_override = -1;
// MOECORE_WS_VARIANT=N in the environment sets it for a whole run (the
// training A/B of a variant; measurement only, like the above).
extern "C" void cuda_grouped_set_variant(int v) { ws_variant_override = v >= 0 && v <= CUDA_GROUPED_VARIANT_MAX ? v : -1; }
static int ws_variant(void) {
    static int env = -2;
    if (env == -2) {
        const char *v = getenv("MOECORE_WS_VARIANT");
        char *end;
        long n = v && *v ? strtol(v, &end, 10) : -1;
        env = v && *v && !*end && n >= 0 && n <= CUDA_GROUPED_VARIANT_MAX ? (int)n : -1;
    }
    return ws_variant_override >= 0 ? ws_variant_override : env >= 0 ? env : WS_DEFAULT_VARIANT;
}

// dw = A_e^T B_e leaves the experts without rows (no tiles) to this.
static void zero_empty(void *dw, const int *offsets, int E, int C, int OC) {
    size_t per = (size_t)OC * C;
    zero_empty_experts<<<dim3(ceil_div(per, 4 * 256) < 32 ? ceil_div(per, 4 * 256) : 32, E), 256, 0, cuda_stream()>>>(
        (float *)dw, offsets, per);
    cudaLaunchCheck();
}

// The weight-grad on grouped_wgrad_pingpong_kernel: shape 0 = 64 x 256
// tiles, 5 stages; 1 = 128 x 128, 6 stages. 0, or -1 (nothing launched)
// when shared memory does not allow it.
// Shape 2: 128 x 128 with the shared copy of dw (WS_DW_SMEM: +=, dw
// 16-byte aligned), 5 stages beside the copy's 64 KB; else shape 1.
static int launch_wgrad_pingpong(int shape, float *dw, WsMaps &maps, const int *offsets, int E, int C, int OC, int set,
                                 int variant) {
    typedef void (*Kernel)(float *, const WsMaps, const int *, int, int, int, int, int);
    static const Kernel kernels[3] = {grouped_wgrad_pingpong_kernel<64, 5>, grouped_wgrad_pingpong_kernel<128, 6>,
                                      grouped_wgrad_pingpong_kernel<128, 5, true>};
    static const int stages[3] = {5, 6, 5}, stage_bytes[3] = {5 * MN_LBO, 4 * MN_LBO, 4 * MN_LBO};
    static const int extra[3] = {0, 0, 128 * 128 * 4 + 16}; // the copy and its two barriers
    static int smem_set[3];
    if (shape == 1 && (variant & WS_DW_SMEM) && !set && !(variant & WS_NO_EPILOGUE) &&
        !((uintptr_t)dw & 15) &&
        !cuda_tensor_map_2d(&maps.o, dw, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, C, (uint64_t)E * OC, 32, 64))
        shape = 2;
    auto smem_of = [&](int k) { return stages[k] * (stage_bytes[k] + 16) + 16 + extra[k] + 1024 + (E + 1) * (int)sizeof(int); };
    if (shape == 2 && smem_of(2) > WG_SMEM_LIMIT) shape = 1;
    int smem = smem_of(shape);
    if (smem > WG_SMEM_LIMIT) return -1;
    cuda_allow_smem((const void *)kernels[shape], &smem_set[shape], smem);
    if (set) zero_empty(dw, offsets, E, C, OC);
    kernels[shape]<<<cuda_num_sms(), WS_THREADS, smem, cuda_stream()>>>(dw, maps, offsets, E, OC, C,
                                                                         wgrad_vec4(dw) | (set << 1), variant);
    cudaLaunchCheck();
    return 0;
}

// Forward (WS_FWD: out[R, OC] = inp w_e^T, A = inp [., C], B = w [E*OC, C]),
// data-grad (WS_DGRAD: out[R, C] = A w_e (+ A2 w2_e), A = dout [., OC], B =
// w [E*OC, C] N-major) or weight-grad (WS_WGRAD: dw[e][OC, C] += A_e^T B_e,
// WS_WGRAD_SET: =; A = dout [., OC], B = inp [., C]) on the warp-specialised
// kernel: 0 when it ran, -1 (nothing launched) when it does not take the call.
// grouped_ws_kernel's shared memory: `stages` stages of the ring, two
// warpgroups' `staging` bytes, the 1024-byte alignment, the stages' 16
// bytes of barriers and the experts' offsets and tile prefix.
static int ws_smem_bytes(int stages, int staging, int E) {
    return WsCfg::STAGE_BYTES * stages + 2 * staging + 1024 + 16 * stages + 2 * (E + 1) * (int)sizeof(int);
}

static int launch_ws(int mode, void *out, const void *A, const void *B, const void *A2, const void *B2,
                     const int *offsets, int E, int C, int OC, double *sq = NULL, int *sq_done = NULL) {
    int set = mode == WS_WGRAD_SET;
    if (set) mode = WS_WGRAD;
    int N = mode == WS_FWD ? OC : C, K = mode == WS_FWD ? C : OC;
    if (!tma_wanted() || N < WS_BN || wgmma_bn(N) != WS_BN || !cuda_tma_available()) return -1;
    WsMaps maps;
    memset(&maps, 0, sizeof maps);
    if (mode == WS_WGRAD) { // both M/N-major, rows bounded by their allocations
        if (tensor_map(&maps.a, A, OC, rows_to_end(A, OC), 64, 64)) return -1;
        if (tensor_map(&maps.b, B, C, rows_to_end(B, C), 64, 64)) return -1;
    } else {
        if (tensor_map(&maps.a, A, K, rows_to_end(A, K), 64, WG_BM)) return -1;
        if (tensor_map(&maps.b, B, C, (uint64_t)E * OC, 64, mode == WS_DGRAD ? 64 : WS_BN)) return -1;
        if (A2) {
            if (tensor_map(&maps.a2, A2, K, rows_to_end(A2, K), 64, WG_BM)) return -1;
            if (tensor_map(&maps.b2, B2, C, (uint64_t)E * OC, 64, 64)) return -1;
        }
    }
    int variant = ws_variant();
    int pingpong = variant & WS_PINGPONG                                     ? 0
                   : variant & WS_PINGPONG_128 || (variant & WS_PINGPONG_ADD && !set) ? 1
                                                                                       : -1;
    // the weight-grad's sum of squares: fused where the kernel knows dw's
    // final values (the ping-pong kernels, the cooperative one for dw =)
    if (sq && (pingpong >= 0 || set)) {
        maps.sq = sq;
        *sq_done = 1;
    }
    if (mode == WS_WGRAD && pingpong >= 0)
        return launch_wgrad_pingpong(pingpong, (float *)out, maps, offsets, E, C, OC, set, variant);
    // the epilogue: 0 = from registers; 1 = TMA, 4 stages and 16 KB of staging
    // per warpgroup; 2 = TMA, 3 stages and 32 KB (when the output map and
    // shared memory allow)
    int epi = variant & WS_TMA_BY_MODE ? (mode == WS_WGRAD ? 1 : 2)
              : variant & WS_TMA_EPI3  ? 2
              : variant & WS_TMA_EPI4  ? 1
                                       : 0;
    if (epi && mode == WS_WGRAD && ((uintptr_t)out & 15)) epi = 0;
    if (epi && (mode == WS_WGRAD ? cuda_tensor_map_2d(&maps.o, out, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, C,
                                                      (uint64_t)E * OC, 32, 64)
                                 : tensor_map(&maps.o, out, N, rows_to_end(out, N), 64, 64)))
        epi = 0;
    static const int stages[3] = {WS_STAGES, 4, 3}, staging[3] = {0, 16384, 32768};
    int smem = ws_smem_bytes(stages[epi], staging[epi], E);
    if (smem > WG_SMEM_LIMIT && epi) {
        epi = 0;
        smem = ws_smem_bytes(WS_STAGES, 0, E);
    }
    if (smem > WG_SMEM_LIMIT) return -1;
    typedef void (*Kernel)(void *, const WsMaps, int, const int *, int, int, int, int, int, int);
    static const Kernel kernels[3][3] = {
        {grouped_ws_kernel<WS_FWD>, grouped_ws_kernel<WS_FWD, 4, 16384>, grouped_ws_kernel<WS_FWD, 3, 32768>},
        {grouped_ws_kernel<WS_DGRAD>, grouped_ws_kernel<WS_DGRAD, 4, 16384>, grouped_ws_kernel<WS_DGRAD, 3, 32768>},
        {grouped_ws_kernel<WS_WGRAD>, grouped_ws_kernel<WS_WGRAD, 4, 16384>, grouped_ws_kernel<WS_WGRAD, 3, 32768>}};
    static int smem_set[3][3];
    Kernel kernel = kernels[mode][epi];
    cuda_allow_smem((const void *)kernel, &smem_set[mode][epi], smem);
    int grid = cuda_num_sms(), pair = A2 != NULL;
    if (mode == WS_WGRAD) {
        if (set) zero_empty(out, offsets, E, C, OC);
        kernel<<<grid, WS_THREADS, smem, cuda_stream()>>>(out, maps, 0, offsets, E, OC, C, 0,
                                                          wgrad_vec4((const float *)out) | (set << 1), variant);
    } else {
        kernel<<<grid, WS_THREADS, smem, cuda_stream()>>>(out, maps, pair, offsets, E, 0, N, K, 0, variant);
    }
    cudaLaunchCheck();
    return 0;
}

// The gate and up products g, u [R, OC] = inp [R, C] wg_e^T, inp wu_e^T and
// a = silu(g) u on the warp-specialised kernel (WS_GLU): 0 when it ran, -1
// (nothing launched) when it does not take the call (the forward's
// conditions, OC >= 128).
extern "C" int cuda_grouped_glu_wgmma(void *g, void *u, void *a, const void *inp, const void *wg, const void *wu,
                                     const int *offsets, int E, int C, int OC) {
    if (!cuda_wgmma_device_ok() || E <= 0 || C <= 0 || OC < 128 || C % 8 || OC % 8) return -1;
    if (((uintptr_t)g | (uintptr_t)u | (uintptr_t)a | (uintptr_t)inp | (uintptr_t)wg | (uintptr_t)wu) & 15) return -1;
    if (!tma_wanted() || !cuda_tma_available()) return -1;
    WsMaps maps;
    memset(&maps, 0, sizeof maps);
    if (tensor_map(&maps.a, inp, C, rows_to_end(inp, C), 64, WG_BM)) return -1;
    if (tensor_map(&maps.b, wg, C, (uint64_t)E * OC, 64, WS_BN / 2)) return -1;
    if (tensor_map(&maps.b2, wu, C, (uint64_t)E * OC, 64, WS_BN / 2)) return -1;
    maps.out2 = u;
    maps.out3 = a;
    // the epilogue through the copy engine (3 stages, 32 KB of staging a
    // warpgroup) where the output maps and shared memory allow
    int tma = !tensor_map(&maps.o, g, OC, rows_to_end(g, OC), 64, 64) &&
              !tensor_map(&maps.o2, u, OC, rows_to_end(u, OC), 64, 64) &&
              !tensor_map(&maps.o3, a, OC, rows_to_end(a, OC), 64, 64);
    int smem = ws_smem_bytes(3, 32768, E);
    if (!tma || smem > WG_SMEM_LIMIT) {
        tma = 0;
        smem = ws_smem_bytes(WS_STAGES, 0, E);
    }
    if (smem > WG_SMEM_LIMIT) return -1;
    typedef void (*Kernel)(void *, const WsMaps, int, const int *, int, int, int, int, int, int);
    static const Kernel kernels[2] = {grouped_ws_kernel<WS_GLU>, grouped_ws_kernel<WS_GLU, 3, 32768>};
    static int smem_set[2];
    cuda_allow_smem((const void *)kernels[tma], &smem_set[tma], smem);
    kernels[tma]<<<cuda_num_sms(), WS_THREADS, smem, cuda_stream()>>>(g, maps, 0, offsets, E, 0, OC, C, 0, ws_variant());
    cudaLaunchCheck();
    return 0;
}

// Whether the current device runs the sm_90a code (compute capability 9.0
// exactly), cached per device.
int cuda_wgmma_device_ok(void) {
    static int cc_device = -1, cc_ok;
    int dev;
    cudaCheck(cudaGetDevice(&dev));
    if (dev != cc_device) {
        int major, minor;
        cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        cc_ok = major == 9 && minor == 0;
        cc_device = dev;
    }
    return cc_ok;
}

// The tile of the cp.async forward and data-grad: 0 = 128 x 256, 4 stages
// (N >= 256); 1 = 128 x 128, 6 stages (N < 256). One block per
// multiprocessor.
static int wgmma_tile(int N) { return N < 256 ? 1 : 0; }
int wgmma_bn(int N) { return wgmma_tile(N) == 0 ? 256 : 128; }

// Runs the forward on the wgmma kernel and returns 0, or returns -1 having
// launched nothing when it cannot: not a compute capability 9.0 device (the
// code is sm_90a only), C or OC not multiples of 8, operands not 16-byte
// aligned, or too many experts for shared memory. The column tile is 256
// when OC >= 256, else 128.
extern "C" int cuda_grouped_forward_wgmma(void *out, const void *inp, const void *w, const int *offsets, int E, int C,
                                          int OC) {
    if (!cuda_wgmma_device_ok() || E <= 0 || C <= 0 || OC <= 0 || C % 8 || OC % 8) return -1;
    if (((uintptr_t)out | (uintptr_t)inp | (uintptr_t)w) & 15) return -1;
    if (launch_ws(WS_FWD, out, inp, w, NULL, NULL, offsets, E, C, OC) == 0) return 0;
    const bf16 *a = (const bf16 *)inp, *b = (const bf16 *)w;
    if (wgmma_tile(OC) == 0) return launch_wgmma<256>((bf16 *)out, a, b, offsets, E, C, OC);
    return launch_wgmma<128>((bf16 *)out, a, b, offsets, E, C, OC);
}

// The data-grad dinp[R, C] = dout[R, OC] w_e[OC, C] (assigned, BF16) on the
// wgmma kernel, plus dout2[R, OC] w2_e[OC, C] when dout2 is not NULL (the
// gate and up projections' data-grads in one product): 0 when it ran, -1
// (nothing launched) under the forward's conditions. Column tile 256 when
// C >= 256, else 128.
extern "C" int cuda_grouped_dgrad_pair_wgmma(void *dinp, const void *dout, const void *w, const void *dout2,
                                             const void *w2, const int *offsets, int E, int C, int OC) {
    if (!cuda_wgmma_device_ok() || E <= 0 || C <= 0 || OC <= 0 || C % 8 || OC % 8) return -1;
    if (((uintptr_t)dinp | (uintptr_t)dout | (uintptr_t)w | (uintptr_t)dout2 | (uintptr_t)w2) & 15) return -1;
    if (launch_ws(WS_DGRAD, dinp, dout, w, dout2, w2, offsets, E, C, OC) == 0) return 0;
    BwdOperands o = {(const bf16 *)dout, (const bf16 *)w, (const bf16 *)dout2, (const bf16 *)w2,
                     (OC + WG_BK - 1) / WG_BK};
    if (wgmma_tile(C) == 0) return launch_wgmma_bwd<256, false>(dinp, o, offsets, E, 0, C, OC);
    return launch_wgmma_bwd<128, false>(dinp, o, offsets, E, 0, C, OC);
}
extern "C" int cuda_grouped_dgrad_wgmma(void *dinp, const void *dout, const void *w, const int *offsets, int E, int C,
                                        int OC) {
    return cuda_grouped_dgrad_pair_wgmma(dinp, dout, w, NULL, NULL, offsets, E, C, OC);
}

// The weight-grad dw[e][OC, C] += dout_e^T inp_e (FP32) on the wgmma kernels:
// 0 when it ran, -1 (nothing launched) as above, or dw not 8-byte aligned.
// The TMA kernel where it takes the call, else the cp.async kernel with
// 128 x 128 tiles, 3 stages and two blocks per multiprocessor (short expert
// segments give few K steps per tile, so one block's epilogue runs under
// the other's main loop).
// dw (=|+=, by accumulate) on the warp-specialised kernel; otherwise (+=
// only) on the cp.async kernel, into zeros when accumulate = 0.
// With sq (not NULL), *sq_done = 1 when the kernel that ran also wrote the
// slots of dw's sum of squares (ops_wgrad_slots) for every expert with rows.
extern "C" int cuda_grouped_wgrad_wgmma(float *dw, const void *dout, const void *inp, const int *offsets, int E, int C,
                                        int OC, int accumulate, double *sq, int *sq_done) {
    if (!cuda_wgmma_device_ok() || E <= 0 || C <= 0 || OC <= 0 || C % 8 || OC % 8) return -1;
    if (((uintptr_t)dout | (uintptr_t)inp) & 15 || (uintptr_t)dw & 7) return -1;
    if (sq_done) *sq_done = 0;
    if (launch_ws(accumulate ? WS_WGRAD : WS_WGRAD_SET, dw, dout, inp, NULL, NULL, offsets, E, C, OC, sq, sq_done) == 0)
        return 0;
    if (sq_done) *sq_done = 0;
    if (!accumulate) cudaCheck(cudaMemsetAsync(dw, 0, (size_t)E * OC * C * sizeof(float), cuda_stream()));
    int vec4 = wgrad_vec4(dw); // passed as K (unused by the weight-grad otherwise)
    BwdOperands o = {(const bf16 *)dout, (const bf16 *)inp, NULL, NULL, 0};
    return launch_wgmma_bwd<128, true, 3, 2>(dw, o, offsets, E, OC, C, vec4);
}

// The slots of dw's sum of squares (ops_wgrad_slots) from dw in memory:
// every expert's, or (only_empty) those of the experts without rows.
extern "C" void cuda_wgrad_sumsq_slots(const float *dw, double *sq, const int *offsets, int E, int C, int OC,
                                       int only_empty) {
    size_t warps = (size_t)E * ((OC + 15) / 16) * ((C + 127) / 128);
    if (!warps) return;
    wgrad_sumsq_slots_kernel<<<(unsigned)((warps + 7) / 8), 256, 0, cuda_stream()>>>(dw, sq, offsets, E, OC, C,
                                                                                   only_empty);
    cudaLaunchCheck();
}
