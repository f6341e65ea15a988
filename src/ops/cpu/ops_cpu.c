// The CPU backend: FP32 kernels from cpu_kernels.h gathered into the op table.
#include <math.h>
#include "ops/ops.h"

typedef float real;
#include "ops/cpu/cpu_kernels.h"

const Ops ops_cpu = {
    .name = "cpu",
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .attention_saved_floats = cpu_attention_saved_floats,
    .attention_scratch_floats = cpu_attention_scratch_floats,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .router_probs_forward = cpu_router_probs_forward,
    .router_probs_backward = cpu_router_probs_backward,
    .router_topk = cpu_router_topk,
    .router_weights_forward = cpu_router_weights_forward,
    .router_weights_backward = cpu_router_weights_backward,
    .router_count = cpu_router_count,
    .lb_loss_forward = cpu_lb_loss_forward,
    .lb_loss_backward = cpu_lb_loss_backward,
    .zloss_forward = cpu_zloss_forward,
    .zloss_backward = cpu_zloss_backward,
    .moe_route_index = cpu_moe_route_index,
    .permute_forward = cpu_permute_forward,
    .permute_backward = cpu_permute_backward,
    .unpermute_forward = cpu_unpermute_forward,
    .unpermute_backward = cpu_unpermute_backward,
    .grouped_matmul_forward = cpu_grouped_matmul_forward,
    .grouped_matmul_backward = cpu_grouped_matmul_backward,
    .crossentropy_forward = cpu_crossentropy_forward,
    .crossentropy_backward = cpu_crossentropy_backward,
    .add_inplace = cpu_add_inplace,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .adamw_update = cpu_adamw_update,
    .sum_squares = cpu_sum_squares,
};

void rope_tables(float *cos_t, float *sin_t, int T, int hd, float theta) {
    int half = hd / 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double f = pow((double)theta, -2.0 * i / hd);
            cos_t[(size_t)t * half + i] = (float)cos(t * f);
            sin_t[(size_t)t * half + i] = (float)sin(t * f);
        }
}
