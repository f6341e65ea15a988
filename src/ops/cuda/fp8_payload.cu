// The FP8 dispatch payload on the GPU (train.precision: fp8 with
// parallel.ep > 1; the layout and the CPU reference: fp8_pack_rows /
// fp8_unpack_rows of src/ops/fp8.h). A routed row leaves its source rank
// as one row of C E4M3 codes followed by its C/128 FP32 scales, so one
// all-to-all moves both; the expert's rank unpacks the rows straight into
// the FP8 GEMM's input and scale buffers, regrouping them by local expert
// in the same pass.
//
// Pure byte moves, one block per row: with C % 128 == 0 a payload row is
// 33 C / 32 bytes, a multiple of 4, so the threads move 4-byte words (the
// codes C/4 words, then the C/128 scales) and a warp touches 128
// contiguous bytes. Rows start only 4-byte aligned (132 bytes apart at C =
// 128), which rules out 16-byte loads on every size; the kernels are
// memory-bound either way, and a fused gather + quantise + pack is the
// next step should the extra pass show (the quantiser itself is fp8.cu's).
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/fp8_cuda.h"
#include "ops/cuda/ops_cuda.h"
#include "ops/fp8.h"

namespace {

constexpr int PAYLOAD_THREADS = 128;

// payload row r = [q row r | s row r]
__global__ void pack_rows_kernel(uint32_t *payload, const uint32_t *q, const uint32_t *s, int C) {
    int r = blockIdx.x, qw = C / 4, sw = C / FP8_BLOCK;
    uint32_t *p = payload + (size_t)r * (qw + sw);
    for (int w = threadIdx.x; w < qw + sw; w += blockDim.x)
        p[w] = w < qw ? q[(size_t)r * qw + w] : s[(size_t)r * sw + (w - qw)];
}

// q row r, s row r = payload row src_row[r] (src_row NULL: r)
__global__ void unpack_rows_kernel(uint32_t *q, uint32_t *s, const uint32_t *payload, const int *src_row, int C) {
    int r = blockIdx.x, qw = C / 4, sw = C / FP8_BLOCK;
    const uint32_t *p = payload + (size_t)(src_row ? src_row[r] : r) * (qw + sw);
    for (int w = threadIdx.x; w < qw + sw; w += blockDim.x) {
        uint32_t v = p[w];
        if (w < qw) q[(size_t)r * qw + w] = v;
        else s[(size_t)r * sw + (w - qw)] = v;
    }
}

int payload_sizes_ok(const void *a, const void *b, const void *c, int C) {
    return C > 0 && C % FP8_BLOCK == 0 && (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 3) == 0;
}

void payload_ok(int rc, const char *what, int R, int C) {
    if (rc == 0) return;
    fprintf(stderr, "moecore: %s: the CUDA FP8 payload kernel does not take these sizes (%d rows of %d) or "
            "buffers (C %% 128 == 0, 4-byte aligned)\n", what, R, C);
    exit(3);
}

} // namespace

extern "C" int cuda_fp8_payload_pack(void *payload, const uint8_t *q, const float *scale, int R, int C) {
    if (!payload_sizes_ok(payload, q, scale, C) || R < 0) return -1;
    if (R == 0) return 0;
    pack_rows_kernel<<<R, PAYLOAD_THREADS, 0, cuda_stream()>>>((uint32_t *)payload, (const uint32_t *)q,
                                                              (const uint32_t *)scale, C);
    cudaLaunchCheck();
    return 0;
}

extern "C" int cuda_fp8_payload_unpack(uint8_t *q, float *scale, const void *payload, const int *src_row, int R,
                                       int C) {
    if (!payload_sizes_ok(payload, q, scale, C) || R < 0) return -1;
    if (R == 0) return 0;
    unpack_rows_kernel<<<R, PAYLOAD_THREADS, 0, cuda_stream()>>>((uint32_t *)q, (uint32_t *)scale,
                                                                (const uint32_t *)payload, src_row, C);
    cudaLaunchCheck();
    return 0;
}

// the op table's entries (ops.h)
extern "C" void cuda_fp8_pack_rows(void *payload, const uint8_t *q, const float *s, int R, int C) {
    payload_ok(cuda_fp8_payload_pack(payload, q, s, R, C), "fp8_pack_rows", R, C);
}
extern "C" void cuda_fp8_unpack_rows(uint8_t *q, float *s, const void *payload, const int *src_row, int R, int C) {
    payload_ok(cuda_fp8_payload_unpack(q, s, payload, src_row, R, C), "fp8_unpack_rows", R, C);
}
