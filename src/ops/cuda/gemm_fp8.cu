// The dense GEMMs in FP8 (fp8.gemms: experts_dense; issue 18) through
// cuBLASLt's block-scaled FP8 on Hopper: the attention projections and the
// dense / shared-expert MLPs, forward and data-grad. The rules for codes
// and scales are block128's (src/ops/fp8.h); this file only lays them out
// the way cuBLASLt reads them.
//
// Our row-major out[N, OC] = x[N, C] W[OC, C]^T is cuBLASLt's column-major
// out^T[OC, N] = op(A) B with A = W stored [C, OC] (op T) and B = x stored
// [C, N] (op N): the "TN" form, the only one FP8 takes on sm_90 (both
// operands K-major). The scale modes:
//   A (the weight): CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, one FP32
//     scale per 128 x 128 block, stored like the data (the K blocks
//     contiguous): element (ob, kb) at ob * ldk + kb, ldk = C/128 rounded up
//     to a multiple of 4. fp8_quantize_weights writes [OC/128, C/128]
//     unpadded, the same thing whenever C/128 % 4 == 0; otherwise the scales
//     are copied into a padded scratch first (cudaMemcpy2DAsync, a few KB).
//   B (the activation): CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, one FP32
//     scale per 128 values along K, stored outer-dimension first: tile kb of
//     row n at kb * N + n. cuda_fp8_quantize_rows_t writes that layout.
// D is BF16 (C = D for the data-grads that accumulate: beta = 1), compute
// FP32 (the library promotes the block partials in FP32; no fast accumulation
// with block scales). Plans are cached per shape and alignment as gemm.cu's;
// cuda_fp8_dense_supports asks the heuristic at set-up, so a shape the
// library has no algorithm for fails there, with its sizes, not mid-run.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/ops_cuda.h"
#include "ops/fp8.h"
#include <cuda_fp8.h>
#include <float.h>

namespace {

__device__ __forceinline__ uint8_t to_e4m3(float x) {
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

// 1 x 128 tiles of x [R, C] (BF16), 16 threads per tile and 8 values each:
// amax (NaN ignored) by shuffles among the 16, fp8_block_scale's clamps,
// IEEE divisions (the reference's FP32 arithmetic, so the codes and scales
// are its bits), then the codes and (the tile's first thread) the scale at
// st[tile * R + row].
__global__ void quantize_rows_t_kernel(uint8_t *q, float *st, const bf16 *x, int R, int C) {
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x, e0 = t * 8;
    bool live = e0 < (size_t)R * C; // whole tiles are live or not (C % 128 == 0)
    float v[8], amax = 0.0f;
    if (live) {
        uint4 raw = *(const uint4 *)(x + e0);
        const __nv_bfloat162 *h = (const __nv_bfloat162 *)&raw;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 f = __bfloat1622float2(h[j]);
            v[2 * j] = f.x;
            v[2 * j + 1] = f.y;
        }
#pragma unroll
        for (int j = 0; j < 8; j++) amax = fmaxf(amax, fabsf(v[j]));
    }
#pragma unroll
    for (int d = 8; d > 0; d >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
    if (!live) return;
    float s = __fdiv_rn(fmaxf(fminf(amax, FLT_MAX), FP8_AMAX_FLOOR), FP8_E4M3_MAX);
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        lo |= (uint32_t)to_e4m3(__fdiv_rn(v[j], s)) << (8 * j);
        hi |= (uint32_t)to_e4m3(__fdiv_rn(v[4 + j], s)) << (8 * j);
    }
    *(uint2 *)(q + e0) = make_uint2(lo, hi);
    if ((threadIdx.x & 15) == 0) {
        size_t r = e0 / C, tile = e0 % C / FP8_BLOCK;
        st[tile * R + r] = s;
    }
}

struct Fp8Plan {
    int N, C, OC, align;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
};
#define FP8_PLANS 32
Fp8Plan plans[FP8_PLANS];
int plans_used, plans_next;

// The padded weight scales (see the header) and their size in floats.
float *wscale_pad;
size_t wscale_pad_n;

int scale_ld(int K) { return (K / FP8_BLOCK + 3) / 4 * 4; }

// Largest power of two (<= 256) dividing every address.
int alignment_of(const void *a, const void *b, const void *d) {
    uintptr_t x = (uintptr_t)a | (uintptr_t)b | (uintptr_t)d | 256;
    return (int)(x & (~x + 1));
}

// The plan of out[N, OC] = x[N, C] W^T, or NULL (nothing cached) with the
// heuristic's status in *status when cuBLASLt has no algorithm for it.
const Fp8Plan *fp8_plan(int N, int C, int OC, int align, cublasStatus_t *status) {
    for (int i = 0; i < plans_used; i++) {
        const Fp8Plan *p = &plans[i];
        if (p->N == N && p->C == C && p->OC == OC && p->align == align) return p;
    }
    Fp8Plan t = {N, C, OC, align};
    cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
    cublasLtMatmulMatrixScale_t sa = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                                sb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    cublasCheck(cublasLtMatmulDescCreate(&t.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(t.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    cublasCheck(cublasLtMatmulDescSetAttribute(t.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    cublasCheck(cublasLtMatmulDescSetAttribute(t.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &sa, sizeof sa));
    cublasCheck(cublasLtMatmulDescSetAttribute(t.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &sb, sizeof sb));
    // the scale pointers are set per call; the heuristic gets aligned stand-ins
    size_t ws_bytes;
    const void *stand_in = cuda_blaslt_workspace(&ws_bytes);
    cublasCheck(cublasLtMatmulDescSetAttribute(t.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &stand_in, sizeof stand_in));
    cublasCheck(cublasLtMatmulDescSetAttribute(t.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &stand_in, sizeof stand_in));
    cublasCheck(cublasLtMatrixLayoutCreate(&t.la, CUDA_R_8F_E4M3, C, OC, C));
    cublasCheck(cublasLtMatrixLayoutCreate(&t.lb, CUDA_R_8F_E4M3, C, N, C));
    cublasCheck(cublasLtMatrixLayoutCreate(&t.ld, CUDA_R_16BF, OC, N, OC));

    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = ws_bytes;
    uint32_t al = (uint32_t)align;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    *status = cublasLtMatmulAlgoGetHeuristic(cuda_blaslt(), t.desc, t.la, t.lb, t.ld, t.ld, pref, 1, &res, &found);
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    if (*status != CUBLAS_STATUS_SUCCESS || found == 0) {
        if (*status == CUBLAS_STATUS_SUCCESS) *status = CUBLAS_STATUS_NOT_SUPPORTED;
        cublasCheck(cublasLtMatmulDescDestroy(t.desc));
        cublasCheck(cublasLtMatrixLayoutDestroy(t.la));
        cublasCheck(cublasLtMatrixLayoutDestroy(t.lb));
        cublasCheck(cublasLtMatrixLayoutDestroy(t.ld));
        return NULL;
    }
    t.algo = res.algo;
    Fp8Plan *p;
    if (plans_used < FP8_PLANS) {
        p = &plans[plans_used++];
    } else { // full: recycle round-robin
        p = &plans[plans_next];
        plans_next = (plans_next + 1) % FP8_PLANS;
        cublasCheck(cublasLtMatmulDescDestroy(p->desc));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->la));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->lb));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->ld));
    }
    *p = t;
    return p;
}

// Grows the padded weight-scale scratch (set-up only: a cudaMalloc).
void reserve_wscale_pad(int C, int OC) {
    size_t n = (size_t)(OC / FP8_BLOCK) * scale_ld(C);
    if (C / FP8_BLOCK % 4 == 0 || n <= wscale_pad_n) return;
    if (wscale_pad) {
        cudaCheck(cudaStreamSynchronize(cuda_stream()));
        cudaCheck(cudaFree(wscale_pad));
    }
    cudaCheck(cudaMalloc(&wscale_pad, n * sizeof(float)));
    wscale_pad_n = n;
}

} // namespace

extern "C" int cuda_fp8_quantize_rows_t(uint8_t *q, float *st, const void *x, int R, int C) {
    if (C % FP8_BLOCK || R < 0 || ((uintptr_t)x & 15) || ((uintptr_t)q & 7)) return -1;
    size_t threads = (size_t)R * C / 8;
    if (threads == 0) return 0;
    quantize_rows_t_kernel<<<(unsigned)((threads + 255) / 256), 256, 0, cuda_stream()>>>(q, st, (const bf16 *)x, R, C);
    cudaLaunchCheck();
    return 0;
}

// Which block-scale assignments cuBLASLt has an algorithm for on this
// device, for the record (tests/gpu/test_fp8 prints it): the TN product
// [m, n] = op(A)[m, k] B[k, n] with (A, B) = (weight 2D, activation 1D) as
// we run it, the roles swapped (activation 1D as A, weight 2D as B: the
// transposed output), and both 1D. One line per variant into out.
extern "C" void cuda_fp8_dense_probe(int N, int C, int OC, char *out, size_t len) {
    struct { const char *name; int m, n; cublasLtMatmulMatrixScale_t a, b; } v[3] = {
        {"A = weight BLK128x128, B = activation VEC128 (ours)", OC, N, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
         CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F},
        {"A = activation VEC128, B = weight BLK128x128", N, OC, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
         CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F},
        {"A, B both VEC128", OC, N, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F}};
    size_t used = 0;
    out[0] = 0;
    for (int i = 0; i < 3; i++) {
        cublasLtMatmulDesc_t desc;
        cublasLtMatrixLayout_t la, lb, ld;
        cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
        size_t ws_bytes;
        const void *stand_in = cuda_blaslt_workspace(&ws_bytes);
        cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &v[i].a, sizeof v[i].a));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &v[i].b, sizeof v[i].b));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &stand_in, sizeof stand_in));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &stand_in, sizeof stand_in));
        cublasCheck(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, C, v[i].m, C));
        cublasCheck(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, C, v[i].n, C));
        cublasCheck(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, v[i].m, v[i].n, v[i].m));
        cublasLtMatmulPreference_t pref;
        cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
        uint64_t ws = ws_bytes;
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        cublasLtMatmulHeuristicResult_t res[8];
        int found = 0;
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cuda_blaslt(), desc, la, lb, ld, ld, pref, 8, res, &found);
        used += snprintf(out + used, used < len ? len - used : 0, "%s: status %d, %d algorithms\n", v[i].name, (int)st,
                         st == CUBLAS_STATUS_SUCCESS ? found : 0);
        cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
        cublasCheck(cublasLtMatmulDescDestroy(desc));
        cublasCheck(cublasLtMatrixLayoutDestroy(la));
        cublasCheck(cublasLtMatrixLayoutDestroy(lb));
        cublasCheck(cublasLtMatrixLayoutDestroy(ld));
    }
}

extern "C" int cuda_fp8_dense_supports(int N, int C, int OC, char *why, size_t whylen) {
    if (N <= 0 || C % FP8_BLOCK || OC % FP8_BLOCK || C <= 0 || OC <= 0) {
        snprintf(why, whylen, "the FP8 dense GEMM needs both matrix sizes multiples of 128 (got %d and %d, %d tokens)",
                 C, OC, N);
        return 0;
    }
    // the forward out[N, OC] (K = C) and the data-grad out[N, C] (K = OC),
    // at the 256-byte alignment of the arena's buffers
    int shapes[2][2] = {{C, OC}, {OC, C}};
    for (int i = 0; i < 2; i++) {
        cublasStatus_t st;
        if (!fp8_plan(N, shapes[i][0], shapes[i][1], 256, &st)) {
            snprintf(why, whylen, "cuBLASLt (block-scaled FP8: BLK128x128_32F weights, VEC128_32F activations, E4M3, "
                     "BF16 out) has no algorithm for %d tokens x K %d -> %d (status %d)", N, shapes[i][0],
                     shapes[i][1], (int)st);
            return 0;
        }
        reserve_wscale_pad(shapes[i][0], shapes[i][1]);
    }
    return 1;
}

extern "C" int cuda_fp8_dense_matmul(void *out, const uint8_t *qa, const float *st, const uint8_t *qw, const float *sw,
                                     int N, int C, int OC, int accumulate) {
    if (C % FP8_BLOCK || OC % FP8_BLOCK || N < 0) return -1;
    if (N == 0) return 0;
    const float *wscale = sw;
    if (C / FP8_BLOCK % 4) { // cuBLASLt's leading dimension of the block scales: a multiple of 4
        size_t kb = C / FP8_BLOCK, ld = scale_ld(C);
        if ((size_t)(OC / FP8_BLOCK) * ld > wscale_pad_n) {
            fprintf(stderr, "moecore: fp8_matmul K %d -> %d: its padded weight scales were not reserved "
                            "(cuda_fp8_dense_supports at set-up)\n", C, OC);
            exit(3);
        }
        cudaCheck(cudaMemcpy2DAsync(wscale_pad, ld * sizeof(float), sw, kb * sizeof(float), kb * sizeof(float),
                                    OC / FP8_BLOCK, cudaMemcpyDeviceToDevice, cuda_stream()));
        wscale = wscale_pad;
    }
    cublasStatus_t status;
    const Fp8Plan *p = fp8_plan(N, C, OC, alignment_of(qa, qw, out), &status);
    if (!p) {
        fprintf(stderr, "moecore: cuBLASLt has no block-scaled FP8 algorithm (status %d) for %d tokens x K %d -> %d "
                        "at %d-byte alignment\n", (int)status, N, C, OC, alignment_of(qa, qw, out));
        exit(3);
    }
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &wscale, sizeof wscale));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &st, sizeof st));
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    size_t ws_bytes;
    void *ws = cuda_blaslt_workspace(&ws_bytes);
    cublasCheck(cublasLtMatmul(cuda_blaslt(), p->desc, &alpha, qw, p->la, qa, p->lb, &beta, out, p->ld, out, p->ld,
                               &p->algo, ws, ws_bytes, cuda_stream()));
    return 0;
}

static void dense_ok(int rc, const char *what, int a, int b) {
    if (rc) {
        fprintf(stderr, "moecore: %s does not take sizes %d, %d (multiples of 128 needed)\n", what, a, b);
        exit(3);
    }
}

extern "C" void cuda_fp8_quantize_rows_t_op(uint8_t *q, float *st, const void *x, int R, int C) {
    dense_ok(cuda_fp8_quantize_rows_t(q, st, x, R, C), "fp8_quantize_rows_t", R, C);
}

extern "C" void cuda_fp8_matmul_op(void *out, const uint8_t *qa, const float *st, const uint8_t *qw, const float *sw,
                                   int N, int C, int OC, int accumulate) {
    dense_ok(cuda_fp8_dense_matmul(out, qa, st, qw, sw, N, C, OC, accumulate), "fp8_matmul", C, OC);
}
