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

// The part of the model a pipeline rank holds (issue 17): chunks of
// contiguous layer ranges in layer order (one per model chunk of the rank;
// the chunks of a rank are not adjacent unless it has one), the embedding
// with the first stage, the final norm and LM head with the last.
#define PARAM_MAX_CHUNKS 16
typedef struct {
    int n_chunks;
    int begin[PARAM_MAX_CHUNKS], end[PARAM_MAX_CHUNKS];  // layers [begin, end) of each chunk
    int embed, head;                                      // holds the embedding; the final norm and LM head
} ParamStage;

// The whole model as one stage.
ParamStage param_stage_all(const ModelConfig *cfg);
// The chunk of stage st that holds layer l, or -1.
int param_stage_chunk_of(const ParamStage *st, int l);

// Appends the tensors of cfg (validated) to t for expert-parallel rank
// ep_rank of ep_size (which divides n_experts): the expert tensors hold that
// rank's E/ep_size experts, a slice of their global [E, ...] shape.
void param_layout_build(ParamTable *t, ParamLayout *l, const ModelConfig *cfg, int ep_rank, int ep_size);
// The same for the tensors of stage st only (NULL: all), in the same order,
// each entry's global_index its index in the whole model's table. The layers
// not held have every index -1 (moe_index stays their index among all MoE
// layers, and n_moe counts them all) and an empty entry range.
void param_layout_build_stage(ParamTable *t, ParamLayout *l, const ModelConfig *cfg, int ep_rank, int ep_size,
                              const ParamStage *st);
// The table of a config on one rank, with no buffers: for tools that only
// need names, shapes and offsets. -1 with a message on an invalid config.
int param_table_for_config(const ModelConfig *cfg, ParamTable *t, char *err, size_t errlen);
