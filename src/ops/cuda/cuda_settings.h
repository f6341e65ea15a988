// Kernel choices of the CUDA backend: the device.cuda.* keys of a run
// config (configs/reference.yaml documents each), handed to the backend by
// cuda_configure (ops_cuda.h) before its first op. Plain C with no CUDA
// header, so that the config reader of a CPU-only build knows them too.
//
// Every choice computes the same function; the defaults are the fastest
// measured on an H200 (README, "On a GPU"). The others are fallbacks kept
// because they run where the default cannot, and for A/B measurements.
#pragma once

typedef enum { CUDA_KERNELS_WGMMA = 0, CUDA_KERNELS_MMA_SYNC = 1 } CudaGemmKernels;
// Their names, in the enum's order (the config's values).
#define CUDA_KERNELS_NAMES {"wgmma", "mma_sync", NULL}
static inline const char *cuda_kernels_name(int k) { return k == CUDA_KERNELS_MMA_SYNC ? "mma_sync" : "wgmma"; }

typedef struct {
    // Expert (grouped) GEMMs, forward and data-grads: wgmma (Hopper, sm_90a)
    // or the mma.sync kernels that run on any GPU and also take the shapes
    // wgmma does not.
    int grouped_gemm;      // CudaGemmKernels
    // Their weight-grads, likewise (wgmma only when grouped_gemm is too).
    int grouped_wgrad;     // CudaGemmKernels
    // The wgmma kernels load tiles by TMA in a warp-specialised kernel (1),
    // or by cp.async in the earlier kernels (0).
    int gemm_tma;
    // Attention backward at head dim 128 without GQA: the cap, in MiB, of
    // the dS^T scratch through which dQ is one plain matmul (5 matmuls
    // instead of 7); batch rows go through it in slices beyond it; 0: dQ
    // by its own kernel. Read when the attention scratch is sized.
    int attention_ds_mib;
    // Attention forward at head dim 128 without documents, T a multiple of
    // 128: the warp-specialised TMA + wgmma kernel (attention_wgmma.cu) or
    // the mma.sync kernels (attention.cu), which run every other case.
    int attention_fwd;     // CudaGemmKernels
    // Attention backward where dQ goes through dS^T (head dim 128 without
    // GQA, attention_ds_mib > 0), T a multiple of 128, no documents: the
    // TMA + wgmma dK/dV and dQ kernels (attention_wgmma.cu) or the mma.sync
    // kernels (attention.cu), which run every other case.
    int attention_bwd;     // CudaGemmKernels
    // fp8.wgrad: fp8: the experts' weight-grads on the FP8 wgmma kernel
    // (their operands quantised along the tokens into its K-major layout,
    // 1), or the operands fake-quantised in place and the BF16 weight-grad
    // kernel (0). The same codes and scales; the BF16 path also rounds the
    // dequantised operands to BF16.
    int fp8_wgrad_gemm;
    // The TMA + wgmma attention kernels' block order: (batch, head) pairs
    // in groups of this many, each group's blocks heaviest tile first, so
    // that the blocks resident at once share their K and V in L2; 0: auto
    // (as many pairs as keep K and V within 16 MiB); B x H or more: all in
    // one group (the order before). The same bits in every order.
    int attention_group;
} CudaSettings;

static inline CudaSettings cuda_settings_default(void) {
    CudaSettings s = {CUDA_KERNELS_WGMMA, CUDA_KERNELS_WGMMA, 1, 1024, CUDA_KERNELS_WGMMA, CUDA_KERNELS_WGMMA, 1, 0};
    return s;
}
