// The parameter layout of the MoE transformer (docs/model.md): which tensors
// a model config has, under their canonical names and shapes, in table
// order, and where each block's tensors sit in the table. It lives below the
// model because the names and shapes are also the checkpoint and export
// format: checkpoints and the HF converter lay out a model's tensors from its
// config without building the model.
#pragma once
#include <stddef.h>

#include "config/model_config.h"
#include "params/params.h"

// Indices into the parameter table (-1 where a layer lacks the tensor).
typedef struct {
    int attn_norm, wq, wk, wv, wo, q_norm, k_norm, attn_post_norm;
    int ffn_norm, ffn_post_norm;
    int mlp_gate, mlp_up, mlp_down;                   // dense layers
    int router, exp_gate, exp_up, exp_down;           // MoE layers
    int sh_gate, sh_up, sh_down;                      // shared experts
    int moe_index;                                    // among MoE layers, or -1
    int first_entry, end_entry;                       // its table entries [first, end)
} LayerParams;

typedef struct {
    int embed, final_norm, lm_head;
    LayerParams *layers;                              // [n_layers], malloc'd
    int n_moe;                                        // MoE layers
} ParamLayout;

// Appends the tensors of cfg (validated) to t for expert-parallel rank
// ep_rank of ep_size (which divides n_experts): the expert tensors hold that
// rank's E/ep_size experts, a slice of their global [E, ...] shape.
void param_layout_build(ParamTable *t, ParamLayout *l, const ModelConfig *cfg, int ep_rank, int ep_size);
// The table of a config on one rank, with no buffers: for tools that only
// need names, shapes and offsets. -1 with a message on an invalid config.
int param_table_for_config(const ModelConfig *cfg, ParamTable *t, char *err, size_t errlen);
