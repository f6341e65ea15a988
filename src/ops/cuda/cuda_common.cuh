// Shared by the CUDA kernels: error checks that name the call, file and line;
// BF16 conversions; the backend's stream and cuBLASLt handle.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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
