// The CUDA backend's op table (compiled only when nvcc was found).
#ifdef MOECORE_CUDA
#include "ops/cuda/ops_cuda.h"
#include "ops/ep_sym.h"

int cuda_supports(const OpDesc *d, char *why, size_t whylen) {
    switch (d->op) {
    case OP_ATTENTION: return cuda_attention_supports(d->B, d->T, d->H, d->KV, d->hd, why, whylen);
    case OP_GROUPED_MATMUL: return cuda_grouped_supports(d->E, d->C, d->OC, why, whylen);
    case OP_ROUTER: return cuda_router_supports(d->E, d->k, d->routing, why, whylen);
    case OP_FP8_GROUPED: return cuda_fp8_supports(d->E, d->C, d->OC, why, whylen);
    case OP_FP8_WGRAD: return cuda_fp8_wgrad_supports(d->E, d->C, d->OC, why, whylen);
    case OP_FP8_DENSE: return cuda_fp8_dense_supports(d->N, d->C, d->OC, why, whylen);
    }
    return 1;
}

const Ops ops_cuda = {
    .name = "cuda",
    .supports = cuda_supports,
    .act_bytes = 2, // BF16
    .alloc = cuda_alloc,
    .free = cuda_free,
    .to_device = cuda_to_device,
    .alloc_host = cuda_alloc_host,
    .free_host = cuda_free_host,
    .to_host = cuda_to_host,
    .device_memory_used = cuda_device_memory_used,
    .device_memory_free = cuda_device_memory_free,
    .capture_begin = cuda_capture_begin,
    .capture_end = cuda_capture_end,
    .graph_launch = cuda_graph_launch,
    .graph_free = cuda_graph_free,
    .cast_to_act = cuda_cast_to_act,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .matmul_forward = cuda_matmul_forward,
    .matmul_backward = cuda_matmul_backward,
    .router_logits_forward = cuda_router_logits_forward,
    .router_logits_backward = cuda_router_logits_backward,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .rope_forward = cuda_rope_forward,
    .rope_backward = cuda_rope_backward,
    .rmsnorm_rope_forward = cuda_rmsnorm_rope_forward,
    .rmsnorm_rope_backward = cuda_rmsnorm_rope_backward,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .attention_saved_floats = cuda_attention_saved_floats,
    .attention_scratch_floats = cuda_attention_scratch_floats,
    .swiglu_forward = cuda_swiglu_forward,
    .swiglu_backward = cuda_swiglu_backward,
    .swiglu_forward_rows = cuda_swiglu_forward_rows,
    .swiglu_backward_rows = cuda_swiglu_backward_rows,
    .router_probs_forward = cuda_router_probs_forward,
    .router_probs_backward = cuda_router_probs_backward,
    .router_topk = cuda_router_topk,
    .router_weights_forward = cuda_router_weights_forward,
    .router_weights_backward = cuda_router_weights_backward,
    .router_count = cuda_router_count,
    .router_bias_update = cuda_router_bias_update,
    .lb_loss_forward = cuda_lb_loss_forward,
    .lb_loss_backward = cuda_lb_loss_backward,
    .zloss_forward = cuda_zloss_forward,
    .zloss_backward = cuda_zloss_backward,
    .moe_route_index = cuda_moe_route_index,
    .permute_forward = cuda_permute_forward,
    .permute_backward = cuda_permute_backward,
    .unpermute_forward = cuda_unpermute_forward,
    .unpermute_backward = cuda_unpermute_backward,
    .moe_capacity_drop = cuda_moe_capacity_drop,
    .moe_segment_sizes = cuda_moe_segment_sizes,
    .ep_sym_write_counts = cuda_ep_sym_write_counts,
    .ep_sym_plan = cuda_ep_sym_plan,
    .ep_sym_dispatch = cuda_ep_sym_dispatch,
    .ep_sym_combine = cuda_ep_sym_combine,
    .grouped_matmul_forward = cuda_grouped_matmul_forward,
    .grouped_matmul_backward = cuda_grouped_matmul_backward,
    .grouped_dgrad_pair = cuda_grouped_dgrad_pair,
    .fp8_quantize_weights = cuda_fp8_quantize_weights,
    .fp8_quantize_rows = cuda_fp8_quantize_rows,
    .fp8_swiglu_quantize = cuda_fp8_swiglu_quantize,
    .fp8_swiglu_backward_quantize = cuda_fp8_swiglu_backward_quantize,
    .fp8_dequantize_rows = cuda_fp8_dequantize_rows,
    .fp8_fake_quantize_rows = cuda_fp8_fake_quantize_rows,
    .fp8_pack_rows = cuda_fp8_pack_rows,
    .fp8_unpack_rows = cuda_fp8_unpack_rows,
    .fp8_fake_quantize_tokens = cuda_fp8_fake_quantize_tokens,
    .fp8_quantize_tokens_t = cuda_fp8_quantize_tokens_t_op,
    .fp8_requantize_tokens_t = cuda_fp8_requantize_tokens_t_op,
    .fp8_grouped_wgrad = cuda_fp8_grouped_wgrad_op,
    .fp8_grouped_matmul_forward = cuda_fp8_grouped_matmul_forward,
    .fp8_quantize_rows_t = cuda_fp8_quantize_rows_t_op,
    .fp8_matmul = cuda_fp8_matmul_op,
    .crossentropy_forward = cuda_crossentropy_forward,
    .crossentropy_backward = cuda_crossentropy_backward,
    .crossentropy_fused = cuda_crossentropy_fused,
    .loss_sum = cuda_loss_sum,
    .add_act = cuda_add_act,
    .sum_act = cuda_sum_act,
    .copy_act = cuda_copy_act,
    .add_f32 = cuda_add_f32,
    .copy_f32 = cuda_copy_f32,
    .zero = cuda_zero,
    .adamw_update = cuda_adamw_update,
    .sum_squares = cuda_sum_squares,
};
#endif
