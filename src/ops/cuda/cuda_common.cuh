// Shared by the CUDA kernels: error checks that name the call, file and line;
// BF16 conversions; the backend's stream and cuBLASLt handle.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef __nv_bfloat16 bf16;

static inline void cuda_check_(cudaError_t e, const char *call, const char *file, int line) {
    if (e != cudaSuccess) {
        fprintf(stderr, "moecore: CUDA error %s in %s at %s:%d\n", cudaGetErrorString(e), call, file, line);
        exit(3);
    }
}
#define cudaCheck(call) cuda_check_((call), #call, __FILE__, __LINE__)
static inline void cublas_check_(cublasStatus_t s, const char *call, const char *file, int line) {
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "moecore: cuBLAS error %d in %s at %s:%d\n", (int)s, call, file, line);
        exit(3);
    }
}
#define cublasCheck(call) cublas_check_((call), #call, __FILE__, __LINE__)
// After a kernel launch: a bad configuration shows here, a fault at the next sync.
#define cudaLaunchCheck() cuda_check_(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

// cuBLASLt is loaded with dlopen on first use (ops_cuda.cu), so that a
// process that never touches the GPU does not map its ~200 MB; the calls
// below go through this table under their usual names.
#define BLASLT_FUNCS(X)                                                                              \
    X(cublasLtCreate) X(cublasLtMatmul) X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmulDescCreate) \
    X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute) X(cublasLtMatmulPreferenceCreate)  \
    X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute)                        \
    X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)
struct BlasLtApi {
#define BLASLT_MEMBER(f) decltype(&::f) f;
    BLASLT_FUNCS(BLASLT_MEMBER)
#undef BLASLT_MEMBER
};
const BlasLtApi &blaslt_api(void);
#ifndef BLASLT_NO_REDIRECT
#define cublasLtCreate blaslt_api().cublasLtCreate
#define cublasLtMatmul blaslt_api().cublasLtMatmul
#define cublasLtMatmulAlgoGetHeuristic blaslt_api().cublasLtMatmulAlgoGetHeuristic
#define cublasLtMatmulDescCreate blaslt_api().cublasLtMatmulDescCreate
#define cublasLtMatmulDescDestroy blaslt_api().cublasLtMatmulDescDestroy
#define cublasLtMatmulDescSetAttribute blaslt_api().cublasLtMatmulDescSetAttribute
#define cublasLtMatmulPreferenceCreate blaslt_api().cublasLtMatmulPreferenceCreate
#define cublasLtMatmulPreferenceDestroy blaslt_api().cublasLtMatmulPreferenceDestroy
#define cublasLtMatmulPreferenceSetAttribute blaslt_api().cublasLtMatmulPreferenceSetAttribute
#define cublasLtMatrixLayoutCreate blaslt_api().cublasLtMatrixLayoutCreate
#define cublasLtMatrixLayoutDestroy blaslt_api().cublasLtMatrixLayoutDestroy
#endif

// The stream every op runs on, the cuBLASLt handle and its workspace
// (created on first use by ops_cuda.cu).
extern "C" cudaStream_t cuda_stream(void);
extern "C" cublasLtHandle_t cuda_blaslt(void);
extern "C" void *cuda_blaslt_workspace(size_t *bytes);
extern "C" int cuda_num_sms(void);

static inline int ceil_div(long a, long b) { return (int)((a + b - 1) / b); }

// 2^x on the special-function unit (the attention kernels' softmax)
// Whether environment variable name is "1" (the opt-in experiments,
// MOECORE_GLU, MOECORE_PERMUTE_STREAM), read once: cache starts at -1.
static inline int env_on(int *cache, const char *name) {
    if (*cache < 0) {
        const char *e = getenv(name);
        *cache = e && !strcmp(e, "1");
    }
    return *cache;
}

// SwiGLU's value from the gate and up values (FP32 math, SiLU through expf):
// the one expression of swiglu_forward and the grouped GEMMs' fused
// epilogue (grouped_wgmma.cu), so that both give the same bits.
__device__ __forceinline__ float swiglu_value(float g, float u) { return g / (1.f + expf(-g)) * u; }

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
// two floats as a BF16 pair in one register (lo in the low half)
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

// Adds a thread's two accumulator pairs into an FP32 matrix owned by its
// block alone (the weight-grads' epilogue): lo = (x0, x1) at row_lo[c],
// row_lo[c + 1] and hi = (y0, y1) at the same columns of row_hi, where the
// 4 lanes q = lane % 4 of a quad hold columns 2q, 2q + 1 of an 8-column
// group (the mma / wgmma accumulator layout). Lane pairs (q, q ^ 1) swap
// halves so that the even lane adds 4 consecutive columns of row_lo and the
// odd lane 4 of row_hi, each with one fire-and-forget 16-byte
// red.global.add.v4.f32 (sm_90): the warp does not wait for a read of the
// old value, as a load-add-store would. One thread adds to each element
// once per launch, so the result is the same as the plain += (deterministic).
// Needs c of the even lane, and the rows, 16-byte aligned (vec4 != 0);
// otherwise (vec4 == 0) it falls back to 8-byte read-modify-writes. All 32
// lanes must call it (it shuffles); lo_ok / hi_ok mask the rows.
// SET stores the values instead of adding them (16-byte stores likewise).
template <bool SET = false>
__device__ __forceinline__ void red_add_quad(float *row_lo, float *row_hi, int c, float x0, float x1, float y0,
                                             float y1, bool lo_ok, bool hi_ok, bool vec4) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (vec4) {
        bool odd = threadIdx.x & 1; // lane parity (blocks are whole warps)
        float s0 = odd ? x0 : y0, s1 = odd ? x1 : y1;
        float r0 = __shfl_xor_sync(0xffffffffu, s0, 1), r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
        if (!odd && lo_ok) {
            if (SET) *(float4 *)(row_lo + c) = make_float4(x0, x1, r0, r1);
            else
                asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(row_lo + c), "f"(x0), "f"(x1),
                             "f"(r0), "f"(r1)
                             : "memory");
        }
        if (odd && hi_ok) {
            if (SET) *(float4 *)(row_hi + c - 2) = make_float4(r0, r1, y0, y1);
            else
                asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(row_hi + c - 2), "f"(r0),
                             "f"(r1), "f"(y0), "f"(y1)
                             : "memory");
        }
        return;
    }
#endif
    (void)vec4;
    if (lo_ok) {
        float2 *p = (float2 *)(row_lo + c), v = SET ? make_float2(0.f, 0.f) : *p;
        v.x += x0;
        v.y += x1;
        *p = v;
    }
    if (hi_ok) {
        float2 *p = (float2 *)(row_hi + c), v = SET ? make_float2(0.f, 0.f) : *p;
        v.x += y0;
        v.y += y1;
        *p = v;
    }
}

// Raises a kernel's dynamic shared memory limit (needed above 48 KB) when it
// is asked for more than *set, the most it was given so far.
static inline void cuda_allow_smem(const void *kernel, int *set, int bytes) {
    if (bytes > 48 * 1024 && bytes > *set) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        *set = bytes;
    }
}
