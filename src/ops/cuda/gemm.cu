// The CUDA backend's matrix products: dense matmuls through cuBLASLt and the
// grouped GEMM of the MoE experts, a tensor-core kernel of our own.
//
// Dense. Our matrices are row-major and cuBLASLt's column-major; a row-major
// X[r, c] is the column-major X^T with the same leading dimension, so every
// product below is written for the transposes (see lt_matmul's callers).
// Plans (descriptors + the heuristic's algorithm) are cached per shape,
// types and pointer alignment; nothing is allocated per call.
//
// Grouped. Expert e owns rows offsets[e]..offsets[e+1] of the grouped
// activations, and offsets live on the device: the host never learns the
// counts, so it cannot size a grid by them. Forward and data-grad therefore
// run a persistent grid (as many blocks as fit at once) whose blocks walk a
// shared list of output tiles; each block turns a tile index into (expert,
// row tile, column tile) by a binary search over per-expert tile counts it
// prefix-sums from offsets into shared memory at start. The weight-grad's
// tiles, (expert, OC tile, C tile), are known on the host; each block runs
// over its expert's rows as the K dimension and adds its FP32 tile into dw,
// which it alone owns (no atomics).
//
// All three share one main loop: a 128x128 output tile per block of 8 warps
// (each 64x32), K in steps of 32 through a 4-stage cp.async pipeline, BF16
// mma.sync m16n8k16 with FP32 accumulators. Operands are either K-major
// (inp and dout as A, w as B in the forward) or M/N-major (w in the
// data-grad, both operands of the weight-grad), and ldmatrix's .trans form
// turns the latter into the same fragments. Tiles that run past a matrix's
// edge are zero-filled by cp.async, which is why C and OC must be multiples
// of 8 (a 16-byte chunk is then wholly inside or outside).
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/ops_cuda.h"
#include "ops/cuda/grouped_sched.cuh"

// ---------------------------------------------------------------------------
// cuBLASLt

// A scratch device buffer shared by the router's conversions: allocated on
// first use, grown only when a call needs more (shapes are fixed in a
// training step, so this never runs inside a captured graph).
static void *scratch;
static size_t scratch_bytes;
static void *gemm_scratch(size_t bytes) {
    if (bytes > scratch_bytes) {
        if (scratch) {
            cudaCheck(cudaStreamSynchronize(cuda_stream()));
            cudaCheck(cudaFree(scratch));
        }
        cudaCheck(cudaMalloc(&scratch, bytes));
        scratch_bytes = bytes;
    }
    return scratch;
}

typedef struct {
    int transa, transb, m, n, k, lda, ldb, ldd, align;
    cudaDataType_t ta, tb, td;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
} LtPlan;

#define LT_PLANS 64
static LtPlan plans[LT_PLANS];
static int plans_used, plans_next;

// Largest power of two (<= 256) that divides every address.
static int ptr_alignment(const void *a, const void *b, const void *d) {
    uintptr_t x = (uintptr_t)a | (uintptr_t)b | (uintptr_t)d | 256;
    return (int)(x & (~x + 1));
}

static const LtPlan *lt_plan(int transa, int transb, int m, int n, int k, int lda, int ldb, int ldd,
                             cudaDataType_t ta, cudaDataType_t tb, cudaDataType_t td, int align) {
    for (int i = 0; i < plans_used; i++) {
        const LtPlan *p = &plans[i];
        if (p->transa == transa && p->transb == transb && p->m == m && p->n == n && p->k == k &&
            p->lda == lda && p->ldb == ldb && p->ldd == ldd && p->ta == ta && p->tb == tb &&
            p->td == td && p->align == align)
            return p;
    }
    LtPlan *p;
    if (plans_used < LT_PLANS) {
        p = &plans[plans_used++];
    } else { // full: recycle round-robin
        p = &plans[plans_next];
        plans_next = (plans_next + 1) % LT_PLANS;
        cublasCheck(cublasLtMatmulDescDestroy(p->desc));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->la));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->lb));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->ld));
    }
    *p = LtPlan{transa, transb, m, n, k, lda, ldb, ldd, align, ta, tb, td};
    cublasOperation_t opa = transa ? CUBLAS_OP_T : CUBLAS_OP_N, opb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    // layouts as stored (column-major rows x cols)
    cublasCheck(cublasLtMatrixLayoutCreate(&p->la, ta, transa ? k : m, transa ? m : k, lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->lb, tb, transb ? n : k, transb ? k : n, ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->ld, td, m, n, ldd));

    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws_bytes;
    cuda_blaslt_workspace(&ws_bytes);
    uint64_t ws = ws_bytes;
    uint32_t al = (uint32_t)align;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cuda_blaslt(), p->desc, p->la, p->lb, p->ld, p->ld, pref, 1,
                                                       &res, &found);
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
        fprintf(stderr, "moecore: cuBLASLt has no algorithm (status %d) for column-major m=%d n=%d k=%d "
                        "(trans %d%d, ld %d %d %d, types %d %d -> %d, alignment %d bytes)\n",
                (int)st, m, n, k, transa, transb, lda, ldb, ldd, (int)ta, (int)tb, (int)td, align);
        exit(3);
    }
    p->algo = res.algo;
    return p;
}

// Column-major D[m, n] (ld ldd) = op(A)[m, k] op(B)[k, n] + beta D, FP32 compute.
// A is stored [m, k] (ld lda), or [k, m] when transa; B [k, n], or [n, k] when transb.
static void lt_matmul(void *d, cudaDataType_t td, const void *a, cudaDataType_t ta, int transa, int lda,
                      const void *b, cudaDataType_t tb, int transb, int ldb, int m, int n, int k, int ldd,
                      float beta) {
    if (m == 0 || n == 0) return;
    if (k == 0) { // op(A) op(B) is empty: D = beta D
        if (beta == 0) {
            size_t es = td == CUDA_R_32F ? 4 : 2;
            cudaCheck(cudaMemset2DAsync(d, (size_t)ldd * es, 0, (size_t)m * es, n, cuda_stream()));
        }
        return;
    }
    const LtPlan *p = lt_plan(transa, transb, m, n, k, lda, ldb, ldd, ta, tb, td, ptr_alignment(a, b, d));
    float alpha = 1.0f;
    size_t ws_bytes;
    void *ws = cuda_blaslt_workspace(&ws_bytes);
    cublasCheck(cublasLtMatmul(cuda_blaslt(), p->desc, &alpha, a, p->la, b, p->lb, &beta, d, p->ld, d, p->ld,
                               &p->algo, ws, ws_bytes, cuda_stream()));
}

// Row-major out[N, OC] = inp[N, C] w[OC, C]^T is column-major
// out^T[OC, N] = (w^T as stored [C, OC])^T inp^T[C, N].
static void dense_forward(void *out, cudaDataType_t tout, const void *inp, const void *w, int N, int C, int OC) {
    lt_matmul(out, tout, w, CUDA_R_16BF, 1, C, inp, CUDA_R_16BF, 0, C, OC, N, C, OC, 0.0f);
}
// dinp[N, C] (=|+=) dout[N, OC] w[OC, C]:  dinp^T[C, N] = w^T[C, OC] dout^T[OC, N]
static void dense_dinp(void *dinp, const void *dout, const void *w, int N, int C, int OC, int accumulate) {
    lt_matmul(dinp, CUDA_R_16BF, w, CUDA_R_16BF, 0, C, dout, CUDA_R_16BF, 0, OC, C, N, OC, C,
              accumulate ? 1.0f : 0.0f);
}
// dw[OC, C] += dout^T[OC, N] inp[N, C]:  dw^T[C, OC] += inp^T[C, N] (dout^T[OC, N])^T
static void dense_dw(float *dw, const void *dout, const void *inp, int N, int C, int OC) {
    lt_matmul(dw, CUDA_R_32F, inp, CUDA_R_16BF, 0, C, dout, CUDA_R_16BF, 1, OC, C, OC, N, C, 1.0f);
}

extern "C" void cuda_matmul_forward(void *out, const void *inp, const void *w, int N, int C, int OC) {
    dense_forward(out, CUDA_R_16BF, inp, w, N, C, OC);
}

extern "C" void cuda_matmul_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                                     int N, int C, int OC, int accumulate) {
    if (dinp) dense_dinp(dinp, dout, w, N, C, OC, accumulate);
    if (dw) dense_dw(dw, dout, inp, N, C, OC);
}

extern "C" void cuda_router_logits_forward(float *logits, const void *inp, const void *w, int N, int C, int E) {
    dense_forward(logits, CUDA_R_32F, inp, w, N, C, E);
}

// cuBLASLt wants A and B of one type: dlogits (FP32, [N, E], small) goes to
// BF16 in the scratch buffer first, then both products are the dense ones.
extern "C" void cuda_router_logits_backward(void *dinp, float *dw, const float *dlogits, const void *inp,
                                            const void *w, int N, int C, int E) {
    size_t n = (size_t)N * E;
    if (n == 0 || (!dinp && !dw)) return;
    bf16 *dl = (bf16 *)gemm_scratch(n * sizeof(bf16));
    cuda_cast_to_act(dl, dlogits, n);
    if (dinp) dense_dinp(dinp, dl, w, N, C, E, 1);
    if (dw) dense_dw(dw, dl, inp, N, C, E);
}

// ---------------------------------------------------------------------------
// Grouped GEMM

#define GG_BM 128     // block tile rows (M)
#define GG_BN 128     // block tile columns (N)
#define GG_BK 32      // K per pipeline stage
#define GG_STAGES 4
#define GG_THREADS 256 // 8 warps, 2 (M) x 4 (N), each 64 x 32

// A tile of one operand in shared memory. K-major: MN rows of GG_BK; else
// GG_BK rows of MN. Rows are padded by 16 bytes so that the 8 row addresses
// of an ldmatrix fall in distinct bank groups (80- and 272-byte strides).
template <bool KMAJOR, int MN> struct SmemTile {
    static constexpr int LD = KMAJOR ? GG_BK + 8 : MN + 8;
    static constexpr int ELEMS = KMAJOR ? MN * LD : GG_BK * LD;
};

template <bool AK, bool BK> struct GemmSmem {
    static constexpr int A_ELEMS = SmemTile<AK, GG_BM>::ELEMS;
    static constexpr int STAGE_ELEMS = A_ELEMS + SmemTile<BK, GG_BN>::ELEMS;
    static constexpr int BYTES = GG_STAGES * STAGE_ELEMS * (int)sizeof(bf16);
};

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int n = valid ? 16 : 0; // 0: fills 16 zero bytes, reads nothing
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16 *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16 *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

// c[16x8] += a[16x16] b[16x8], BF16 in, FP32 accumulate
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Stage rows mn0.. (< mn_lim) x k0.. (< k_lim) of one operand into shared
// memory. g is element (0, 0); K-major: (mn, k) at g[mn * ld + k], else at
// g[k * ld + mn]. Out-of-range 16-byte chunks are zero-filled.
template <bool KMAJOR, int MN>
__device__ __forceinline__ void load_tile(bf16 *s, const bf16 *g, int ld, int mn0, int mn_lim, int k0, int k_lim) {
    constexpr int LD = SmemTile<KMAJOR, MN>::LD;
    constexpr int INNER = KMAJOR ? GG_BK : MN; // contiguous extent
    constexpr int ROW_CHUNKS = INNER / 8;
    constexpr int CHUNKS = (KMAJOR ? MN : GG_BK) * ROW_CHUNKS;
    static_assert(CHUNKS % GG_THREADS == 0, "tile chunks must divide among the threads");
#pragma unroll
    for (int i = 0; i < CHUNKS / GG_THREADS; i++) {
        int c = threadIdx.x + i * GG_THREADS;
        int outer = c / ROW_CHUNKS, inner = (c % ROW_CHUNKS) * 8;
        int go = (KMAJOR ? mn0 : k0) + outer, gi = (KMAJOR ? k0 : mn0) + inner;
        bool valid = go < (KMAJOR ? mn_lim : k_lim) && gi < (KMAJOR ? k_lim : mn_lim);
        const bf16 *src = valid ? g + (size_t)go * ld + gi : g;
        cp_async16(s + outer * LD + inner, src, valid);
    }
}

// Element offsets in a staged tile of the row address that `lane` gives
// ldmatrix.x4 for one k16 step at kk. A: the 16x16 fragment at row m, as
// matrices (m, k) = (0,0) (8,0) (0,8) (8,8), i.e. mma's a0..a3. B: two n8
// fragments at column n, as (n, k) = (0,0) (0,8) (8,0) (8,8), i.e. b0 b1 of
// columns n.. then of n+8. K-major tiles (rows of m or n, k contiguous) are
// read as they are, M/N-major ones (rows of k) with .trans.
template <bool AK> __host__ __device__ __forceinline__ int a_frag_offset(int lane, int m, int kk) {
    constexpr int LD = SmemTile<AK, GG_BM>::LD;
    if (AK) return (m + (lane & 15)) * LD + kk + (lane >> 4) * 8;
    return (kk + (lane & 7) + (lane >> 4) * 8) * LD + m + ((lane >> 3) & 1) * 8;
}
template <bool BK> __host__ __device__ __forceinline__ int b_frag_offset(int lane, int n, int kk) {
    constexpr int LD = SmemTile<BK, GG_BN>::LD;
    if (BK) return (n + (lane & 7) + (lane >> 4) * 8) * LD + kk + ((lane >> 3) & 1) * 8;
    return (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n + (lane >> 4) * 8;
}

// One k16 step on a staged tile: the warp's 64x32 block of acc.
template <bool AK, bool BK>
__device__ __forceinline__ void mma_stage(float (&acc)[4][4][4], const bf16 *As, const bf16 *Bs, int kk, int wm,
                                          int wn, int lane) {
    uint32_t a[4][4], b[4][2];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const bf16 *p = As + a_frag_offset<AK>(lane, wm + i * 16, kk);
        if (AK) ldmatrix_x4(a[i], p);
        else ldmatrix_x4_trans(a[i], p);
    }
#pragma unroll
    for (int j = 0; j < 2; j++) {
        uint32_t r[4];
        const bf16 *p = Bs + b_frag_offset<BK>(lane, wn + j * 16, kk);
        if (BK) ldmatrix_x4(r, p);
        else ldmatrix_x4_trans(r, p);
        b[2 * j][0] = r[0];
        b[2 * j][1] = r[1];
        b[2 * j + 1][0] = r[2];
        b[2 * j + 1][1] = r[3];
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) mma_bf16(acc[i][j], a[i], b[j][0], b[j][1]);
}

// acc = A[m0:m0+128, 0:K] B[0:K, n0:n0+128] for one block tile, rows of A
// limited to m_lim and columns of B to n_lim (zeros beyond). A is K-major
// ([M, K], ld lda) when AK, else [K, M]; B is K-major ([N, K]) when BK,
// else [K, N]. Leaves shared memory free for the next call.
template <bool AK, bool BK>
__device__ __forceinline__ void gemm_tile(float (&acc)[4][4][4], bf16 *smem, const bf16 *A, int lda, int m0, int m_lim,
                                          const bf16 *B, int ldb, int n0, int n_lim, int K) {
    using S = GemmSmem<AK, BK>;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int v = 0; v < 4; v++) acc[i][j][v] = 0.0f;

    int ktiles = (K + GG_BK - 1) / GG_BK;
#pragma unroll
    for (int s = 0; s < GG_STAGES - 1; s++) {
        if (s < ktiles) {
            bf16 *st = smem + s * S::STAGE_ELEMS;
            load_tile<AK, GG_BM>(st, A, lda, m0, m_lim, s * GG_BK, K);
            load_tile<BK, GG_BN>(st + S::A_ELEMS, B, ldb, n0, n_lim, s * GG_BK, K);
        }
        cp_async_commit(); // empty groups keep the count uniform
    }
    for (int kt = 0; kt < ktiles; kt++) {
        cp_async_wait<GG_STAGES - 2>(); // stage kt has landed (for this thread)
        __syncthreads();                // ... for all, and stage kt-1 is consumed
        int pf = kt + GG_STAGES - 1;
        if (pf < ktiles) {
            bf16 *st = smem + (pf % GG_STAGES) * S::STAGE_ELEMS;
            load_tile<AK, GG_BM>(st, A, lda, m0, m_lim, pf * GG_BK, K);
            load_tile<BK, GG_BN>(st + S::A_ELEMS, B, ldb, n0, n_lim, pf * GG_BK, K);
        }
        cp_async_commit();
        const bf16 *st = smem + (kt % GG_STAGES) * S::STAGE_ELEMS;
#pragma unroll
        for (int kk = 0; kk < GG_BK; kk += 16) mma_stage<AK, BK>(acc, st, st + S::A_ELEMS, kk, wm, wn, lane);
    }
    cp_async_wait<0>();
    __syncthreads();
}

// Forward and data-grad: out[R, N] = A[R, K] B_e over expert segments; B is
// E matrices [N, K] (BK, the forward's w) or [K, N] (the data-grad's w).
// Calls f(row, col, acc0, acc1) for each pair of adjacent output columns a
// thread holds after gemm_tile (the m16n8 accumulator layout of its warp's
// 64 x 32 sub-tile), in tile coordinates offset by (m0, n0).
template <typename F>
__device__ __forceinline__ void for_each_acc_pair(const float (&acc)[4][4][4], int m0, int n0, F f) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int wm = (warp >> 2) * 64, wn = (warp & 3) * 32, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                f(m0 + wm + i * 16 + g + h * 8, n0 + wn + j * 8 + 2 * q, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
}

// A persistent grid: block b takes tiles b, b + gridDim.x, ...
template <bool BK>
__global__ void __launch_bounds__(GG_THREADS, 2)
grouped_rows_kernel(bf16 *out, const bf16 *A, const bf16 *B, const int *offsets, int E, int N, int K, int accumulate) {
    using S = GemmSmem<true, BK>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *smem = (bf16 *)smem_raw;
    int *s_off = (int *)(smem_raw + S::BYTES); // offsets[0..E]
    int *s_tile = s_off + E + 1;               // first tile index of each expert, [0..E]
    int col_tiles = (N + GG_BN - 1) / GG_BN;

    grouped_load_offsets<GG_THREADS>(offsets, E, s_off);
    int total = grouped_tile_prefix<GG_BM>(s_off, E, col_tiles, s_tile);

    for (int t = blockIdx.x; t < total; t += gridDim.x) {
        int lo = 0, hi = E - 1; // the last expert whose first tile is <= t
        while (lo < hi) {
            int mid = (lo + hi + 1) >> 1;
            if (s_tile[mid] <= t) lo = mid; else hi = mid - 1;
        }
        int e = lo, local = t - s_tile[e];
        int m0 = local / col_tiles * GG_BM, n0 = local % col_tiles * GG_BN;
        int r0 = s_off[e], rows = s_off[e + 1] - r0;
        const bf16 *Ae = A + (size_t)r0 * K, *Be = B + (size_t)e * N * K;

        float acc[4][4][4];
        gemm_tile<true, BK>(acc, smem, Ae, K, m0, rows, Be, BK ? K : N, n0, N, K);

        bf16 *o = out + (size_t)r0 * N;
        for_each_acc_pair(acc, m0, n0, [&](int r, int c, float x, float y) {
            if (r < rows && c < N) {
                __nv_bfloat162 *p = (__nv_bfloat162 *)(o + (size_t)r * N + c);
                if (accumulate) {
                    float2 old = __bfloat1622float2(*p);
                    x += old.x;
                    y += old.y;
                }
                *p = __floats2bfloat162_rn(x, y);
            }
        });
    }
}

// Weight-grad: dw[e][OC, C] += dout_e^T inp_e, K = the expert's rows.
// Grid (C tiles, OC tiles, E); A = dout_e stored [K, OC], B = inp_e [K, C].
// The tile is added with red_add_quad (16-byte reductions when vec4).
__global__ void __launch_bounds__(GG_THREADS, 2)
grouped_wgrad_kernel(float *dw, const bf16 *dout, const bf16 *inp, const int *offsets, int C, int OC, int vec4) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    int e = blockIdx.z;
    int r0 = offsets[e], rows = offsets[e + 1] - r0;
    if (rows <= 0) return;
    int m0 = blockIdx.y * GG_BM, n0 = blockIdx.x * GG_BN;
    float acc[4][4][4];
    gemm_tile<false, false>(acc, (bf16 *)smem_raw, dout + (size_t)r0 * OC, OC, m0, OC, inp + (size_t)r0 * C, C,
                            n0, C, rows);

    // the m16n8 layout of for_each_acc_pair: rows g and g + 8, columns 2q, 2q + 1
    float *d = dw + (size_t)e * OC * C;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int wm = (warp >> 2) * 64, wn = (warp & 3) * 32, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int r = m0 + wm + i * 16 + g, c = n0 + wn + j * 8 + 2 * q;
            bool c_ok = c < C;
            red_add_quad(d + (size_t)r * C, d + (size_t)(r + 8) * C, c, acc[i][j][0], acc[i][j][1], acc[i][j][2],
                         acc[i][j][3], c_ok && r < OC, c_ok && r + 8 < OC, vec4);
        }
}

// cp.async reads 16-byte chunks of the BF16 operands (hence C, OC multiples
// of 8 and 16-byte aligned operands); outputs are written in pairs.
static void grouped_check(const char *op, int E, int C, int OC, const void *const *operands, int n_operands,
                          const void *out, int out_align) {
    if (C % 8 || OC % 8 || E < 0) {
        fprintf(stderr, "moecore: %s needs C and OC multiples of 8 and E >= 0 (C=%d, OC=%d, E=%d)\n", op, C, OC, E);
        exit(3);
    }
    for (int i = 0; i < n_operands; i++)
        if ((uintptr_t)operands[i] & 15) {
            fprintf(stderr, "moecore: %s needs 16-byte aligned operands (operand %d is at %p)\n", op, i, operands[i]);
            exit(3);
        }
    if ((uintptr_t)out & (out_align - 1)) {
        fprintf(stderr, "moecore: %s needs a %d-byte aligned output (%p)\n", op, out_align, out);
        exit(3);
    }
}

// The most experts the mma.sync kernels (which also take every shape the
// wgmma kernels do not) keep the segment offsets of in shared memory.
static int grouped_max_experts(void) {
    int a = (227 * 1024 - GemmSmem<true, true>::BYTES) / 8 - 1, b = (227 * 1024 - GemmSmem<true, false>::BYTES) / 8 - 1;
    return a < b ? a : b;
}

// The sizes the grouped GEMMs take: 1, or 0 with the limit in why.
extern "C" int cuda_grouped_supports(int E, int C, int OC, char *why, size_t whylen) {
    if (C % 8 || OC % 8 || E < 0) {
        snprintf(why, whylen, "the grouped GEMM needs both matrix sizes multiples of 8 (got %d and %d)", C, OC);
        return 0;
    }
    if (E > grouped_max_experts()) {
        snprintf(why, whylen, "the grouped GEMM supports at most %d experts per GPU (shared memory), got %d",
                 grouped_max_experts(), E);
        return 0;
    }
    return 1;
}

// Launches the persistent grid of grouped_rows_kernel<BK>: one block per
// slot that can be resident at once; accumulate: out += instead of =.
template <bool BK>
static void launch_grouped_rows(bf16 *out, const bf16 *A, const bf16 *B, const int *offsets, int E, int N, int K,
                                int accumulate = 0) {
    static int smem_set, occ_smem, occ_blocks;
    const void *kernel = (const void *)grouped_rows_kernel<BK>;
    int smem = GemmSmem<true, BK>::BYTES + 2 * (E + 1) * (int)sizeof(int);
    if (smem > 227 * 1024) {
        fprintf(stderr, "moecore: grouped GEMM supports at most %d experts (E=%d)\n",
                (227 * 1024 - GemmSmem<true, BK>::BYTES) / 8 - 1, E);
        exit(3);
    }
    cuda_allow_smem(kernel, &smem_set, smem);
    if (occ_smem != smem) {
        cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_blocks, grouped_rows_kernel<BK>, GG_THREADS,
                                                                smem));
        if (occ_blocks < 1) occ_blocks = 1;
        occ_smem = smem;
    }
    grouped_rows_kernel<BK><<<cuda_num_sms() * occ_blocks, GG_THREADS, smem, cuda_stream()>>>(out, A, B, offsets,
                                                                                              E, N, K, accumulate);
    cudaLaunchCheck();
}

// The Hopper kernels (grouped_wgmma.cu): 0 when it ran, -1 (nothing
// launched) for shapes or devices it does not take.
extern "C" int cuda_grouped_forward_wgmma(void *out, const void *inp, const void *w, const int *offsets, int E, int C,
                                          int OC);
extern "C" int cuda_grouped_dgrad_wgmma(void *dinp, const void *dout, const void *w, const int *offsets, int E, int C,
                                        int OC);
extern "C" int cuda_grouped_wgrad_wgmma(float *dw, const void *dout, const void *inp, const int *offsets, int E, int C,
                                        int OC, int accumulate, double *sq, int *sq_done);
extern "C" void cuda_wgrad_sumsq_slots(const float *dw, double *sq, const int *offsets, int E, int C, int OC,
                                       int only_empty);
extern "C" int cuda_grouped_dgrad_pair_wgmma(void *dinp, const void *dout, const void *w, const void *dout2,
                                             const void *w2, const int *offsets, int E, int C, int OC);

// device.cuda.grouped_gemm: mma_sync runs every grouped product on the
// mma.sync kernels below.
static int no_wgmma(void) { return cuda_settings()->grouped_gemm == CUDA_KERNELS_MMA_SYNC; }

// device.cuda.grouped_wgrad: the weight-grad on wgmma (default) or on the
// kernel below. With short expert segments (K = rows per expert: ~512 on
// OLMoE-1B-7B) it lost to the mma.sync kernel while its epilogue was a
// load-add-store (120 vs 167 TFLOP/s); with 16-byte reductions and two
// blocks per multiprocessor it wins (254 vs 232 on the OLMoE shape, 221 vs
// 189 with one expert holding 32k rows; H200, 2026-11-30).
static int wgmma_wgrad(void) { return cuda_settings()->grouped_wgrad == CUDA_KERNELS_WGMMA; }

// Whether the weight-grad epilogues may use 16-byte reductions into dw: dw
// 16-byte aligned (C is a multiple of 8, so rows are too).
extern "C" int wgrad_vec4(const float *dw) { return ((uintptr_t)dw & 15) == 0; }

extern "C" void cuda_grouped_matmul_forward(void *out, const void *inp, const void *w, const int *offsets, int E,
                                            int C, int OC) {
    const void *operands[3] = {inp, w, w};
    grouped_check("grouped_matmul_forward", E, C, OC, operands, 3, out, 4);
    if (E == 0) return;
    if (!no_wgmma() && cuda_grouped_forward_wgmma(out, inp, w, offsets, E, C, OC) == 0) return;
    launch_grouped_rows<true>((bf16 *)out, (const bf16 *)inp, (const bf16 *)w, offsets, E, OC, C);
}

static void grouped_wgrad(float *dw, double *sq, const void *dout, const void *inp, const int *offsets, int E, int C,
                          int OC, int accumulate);

extern "C" int cuda_grouped_glu_wgmma(void *g, void *u, void *a, const void *inp, const void *wg, const void *wu,
                                     const int *offsets, int E, int C, int OC);
// The fused kernel where it takes the call with MOECORE_GLU=1 (not yet the
// default: it has not run on a GPU), else the two forwards and
// swiglu_forward.
extern "C" void cuda_grouped_glu_forward(void *g, void *u, void *a, const void *inp, const void *wg, const void *wu,
                                         const int *offsets, int E, int C, int OC, int R) {
    const void *operands[3] = {inp, wg, wu};
    grouped_check("grouped_glu_forward", E, C, OC, operands, 3, g, 4);
    if (E == 0) return;
    static int fuse = -1;
    if (env_on(&fuse, "MOECORE_GLU") && !no_wgmma() && cuda_grouped_glu_wgmma(g, u, a, inp, wg, wu, offsets, E, C, OC) == 0) return;
    cuda_grouped_matmul_forward(g, inp, wg, offsets, E, C, OC);
    cuda_grouped_matmul_forward(u, inp, wu, offsets, E, C, OC);
    cuda_swiglu_forward(a, g, u, (size_t)R * OC);
}

extern "C" void cuda_grouped_matmul_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                                             const int *offsets, int E, int C, int OC, int accumulate) {
    const void *operands[3] = {dout, inp, w};
    grouped_check("grouped_matmul_backward", E, C, OC, operands, 3, dinp, 4);
    grouped_check("grouped_matmul_backward", E, C, OC, operands, 3, dw, 8);
    if (E == 0) return;
    // dinp[R, C] = dout[R, OC] w_e[OC, C]: K = OC, B stored [K, N]
    if (dinp && (no_wgmma() || cuda_grouped_dgrad_wgmma(dinp, dout, w, offsets, E, C, OC) != 0))
        launch_grouped_rows<false>((bf16 *)dinp, (const bf16 *)dout, (const bf16 *)w, offsets, E, C, OC);
    if (dw) grouped_wgrad(dw, NULL, dout, inp, offsets, E, C, OC, accumulate);
}

// dw: the warp-specialised kernel writes (accumulate = 0) or adds; the
// others add, into zeros when accumulate = 0. With sq, also the slots of
// dw's sum of squares: from the kernel's epilogue where it has them (then
// only the experts without rows, which have no tiles, are read back), else
// from dw in memory.
static void grouped_wgrad(float *dw, double *sq, const void *dout, const void *inp, const int *offsets, int E, int C,
                          int OC, int accumulate) {
    int fused = 0;
    if (no_wgmma() || !wgmma_wgrad() ||
        cuda_grouped_wgrad_wgmma(dw, dout, inp, offsets, E, C, OC, accumulate, sq, &fused)) {
        fused = 0;
        if (!accumulate) cudaCheck(cudaMemsetAsync(dw, 0, (size_t)E * OC * C * sizeof(float), cuda_stream()));
        static int smem_set;
        int smem = GemmSmem<false, false>::BYTES;
        cuda_allow_smem((const void *)grouped_wgrad_kernel, &smem_set, smem);
        dim3 grid(ceil_div(C, GG_BN), ceil_div(OC, GG_BM), E);
        grouped_wgrad_kernel<<<grid, GG_THREADS, smem, cuda_stream()>>>(dw, (const bf16 *)dout, (const bf16 *)inp,
                                                                        offsets, C, OC, wgrad_vec4(dw));
        cudaLaunchCheck();
    }
    if (sq) cuda_wgrad_sumsq_slots(dw, sq, offsets, E, C, OC, fused);
}

extern "C" void cuda_grouped_wgrad_sumsq(float *dw, double *sq, const void *dout, const void *inp, const int *offsets,
                                         int E, int C, int OC, int accumulate) {
    const void *operands[2] = {dout, inp};
    grouped_check("grouped_wgrad_sumsq", E, C, OC, operands, 2, dw, 8);
    if (E == 0) return;
    grouped_wgrad(dw, sq, dout, inp, offsets, E, C, OC, accumulate);
}

// dinp = dout1 w1_e + dout2 w2_e: one wgmma product over both K ranges, or
// (fallback) two mma.sync data-grads, the second adding into the first.
extern "C" void cuda_grouped_dgrad_pair(void *dinp, const void *dout1, const void *w1, const void *dout2,
                                        const void *w2, const int *offsets, int E, int C, int OC) {
    const void *operands[4] = {dout1, w1, dout2, w2};
    grouped_check("grouped_dgrad_pair", E, C, OC, operands, 4, dinp, 4);
    if (E == 0) return;
    if (!no_wgmma() && cuda_grouped_dgrad_pair_wgmma(dinp, dout1, w1, dout2, w2, offsets, E, C, OC) == 0) return;
    launch_grouped_rows<false>((bf16 *)dinp, (const bf16 *)dout1, (const bf16 *)w1, offsets, E, C, OC, 0);
    launch_grouped_rows<false>((bf16 *)dinp, (const bf16 *)dout2, (const bf16 *)w2, offsets, E, C, OC, 1);
}
