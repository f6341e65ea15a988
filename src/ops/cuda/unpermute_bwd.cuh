// unpermute_backward's kernel (dispatch.cu), shared with fp8.cu's fused
// quantiser: one block per token, 8 channels a thread (looping when C >
// 2048): dy[row] = w dout[n] and dweights[n,s] = <dout[n], y[row]> for
// UNPERMUTE_SLOTS slots at a time, whose y loads all issue before the first
// product and whose dots share one block_sums. Q is called with each
// stored 8 channels of a dy row, as BF16 values, and their element index in
// dy (row * C + c): NoRowHook does nothing; fp8.cu's quantises the 1 x 128
// tiles (every thread of the block calls it the same number of times,
// which the callers ensure by C % (8 x blockDim) == 0).
#pragma once
#include "ops/cuda/memkernels.cuh"

struct NoRowHook {
    __device__ __forceinline__ void operator()(const float (&)[8], size_t) const {}
};

#define UNPERMUTE_SLOTS 4
template <bool VEC, class Q = NoRowHook>
static __global__ void __launch_bounds__(ROW_BLOCK_MAX, VEC ? 4 : 1)
    unpermute_backward_kernel(bf16 *dy, float *dweights, const bf16 *dout, const bf16 *y, const float *weights,
                              const int *row_of, int N, int k, int C, Q hook) {
    __shared__ float red[2][UNPERMUTE_SLOTS * MAX_WARPS];
    size_t n = blockIdx.x;
    const bf16 *d = dout + n * C;
    for (int s0 = 0, slot = 0; s0 < k; s0 += UNPERMUTE_SLOTS, slot ^= 1) {
        int row[UNPERMUTE_SLOTS];
        float w[UNPERMUTE_SLOTS], dot[UNPERMUTE_SLOTS];
#pragma unroll
        for (int u = 0; u < UNPERMUTE_SLOTS; u++) {
            bool on = s0 + u < k;
            row[u] = on ? row_of[n * k + s0 + u] : 0;
            w[u] = on ? weights[n * k + s0 + u] : 0.f;
            dot[u] = 0.f;
        }
        for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8) {
            float df[8], yf[UNPERMUTE_SLOTS][8];
            load8_row<VEC>(d, c, C, df);
#pragma unroll
            for (int u = 0; u < UNPERMUTE_SLOTS; u++)  // slots past k read zeros
                load8_row<VEC>(y + (size_t)row[u] * C, s0 + u < k ? c : C, C, yf[u]);
#pragma unroll
            for (int u = 0; u < UNPERMUTE_SLOTS; u++)
                if (s0 + u < k) {
                    float o[8];
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        o[j] = w[u] * df[j];
                        dot[u] += df[j] * yf[u][j];
                    }
                    store8_row<VEC>(dy + (size_t)row[u] * C, c, C, o);
                    float b[8]; // the stored BF16 values (dead code under NoRowHook)
#pragma unroll
                    for (int j = 0; j < 8; j++) b[j] = __bfloat162float(__float2bfloat16_rn(o[j]));
                    hook(b, (size_t)row[u] * C + c);
                }
        }
        block_sums<UNPERMUTE_SLOTS>(dot, red[slot], 0, blockDim.x / WARP);
#pragma unroll
        for (int u = 0; u < UNPERMUTE_SLOTS; u++)
            if (threadIdx.x == u && s0 + u < k) dweights[n * k + s0 + u] = dot[u];
    }
}
