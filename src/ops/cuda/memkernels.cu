// The out-of-line part of memkernels.cuh: sum_partials, the second pass of
// the two-pass FP64 reductions (router.cu's z-loss, optim.cu's sum of
// squares). One block of 256 threads: each sums a strided slice of the
// partials in order, then block_sum's fixed tree, so the total depends only
// on the partials and G.
#include "ops/cuda/memkernels.cuh"

static __global__ void sum_partials_kernel(const double *part, int G, float *out, double div, double *acc) {
    double s = 0;
    for (int g = threadIdx.x; g < G; g += blockDim.x) s += part[g];
    s = block_sum(s);
    if (threadIdx.x == 0) {
        if (out) out[0] = (float)(s / div);
        else acc[0] += s;
    }
}
void sum_partials(const double *part, int G, float *out, double div, double *acc) {
    sum_partials_kernel<<<1, 256, 0, cuda_stream()>>>(part, G, out, div, acc);
    cudaLaunchCheck();
}
