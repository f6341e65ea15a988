// The model's shape and routing options (docs/model.md), with one table of
// keys so that setting, validating, printing and serialising a config all
// walk the same list. Keys are spelled as in the YAML `model:` section and
// on the command line as --model.KEY=VALUE.
#pragma once
#include <stddef.h>
#include <stdio.h>
#include "ops/ops.h"

typedef enum { NORM_PRE = 0, NORM_POST = 1, NORM_PERI = 2 } NormPlacement;
typedef enum { QKNORM_NONE = 0, QKNORM_FULL = 1, QKNORM_HEAD = 2 } QKNorm;

typedef struct {
    int vocab_size;       // real vocabulary; padded_vocab rounds it up to 128
    int d_model;
    int n_layers;
    int n_heads;
    int n_kv_heads;       // 0: same as n_heads
    int head_dim;         // 0: d_model / n_heads
    float rope_theta;
    float norm_eps;
    int norm;             // NormPlacement
    int qk_norm;          // QKNorm
    int dense_layers;     // the first dense_layers layers use a dense SwiGLU MLP
    int dense_hidden;     // hidden size of those MLPs
    int n_experts;
    int top_k;
    int expert_hidden;
    int n_shared;         // shared experts, run on every token, unweighted
    int shared_hidden;
    int gating;           // Gating
    int renorm_topk;      // bool
    float lb_coef;
    float z_coef;
    int lb_global;        // bool: counts over the micro-batches of the step
    float aux_free_rate;  // > 0 turns on aux-loss-free bias balancing
    int routing;          // RoutingMode
    float capacity_factor;  // 0: dropless; else each expert keeps ceil(cf*tokens*k/E) rows
    int seq_len;
    float init_std;
    // derived by model_config_validate
    int padded_vocab;
} ModelConfig;

void model_config_defaults(ModelConfig *c);
// Sets one key from its text value ("model." prefix optional). On error
// returns -1 and writes a message naming the key into err.
int model_config_set(ModelConfig *c, const char *key, const char *value, char *err, size_t errlen);
// Checks every field and fills the derived ones. -1 with a message naming
// the field on error.
int model_config_validate(ModelConfig *c, char *err, size_t errlen);
// Whether the backend runs a validated config at this micro-batch with its
// experts over ep ranks (Ops.supports); -1 with the keys and the limit in
// err when it does not. Touches no device: callers ask before allocating.
int model_config_check_backend(const ModelConfig *c, const Ops *ops, int micro_batch, int ep, char *err,
                               size_t errlen);
// Writes the config as a JSON object (every key, derived ones included).
// Returns a malloc'd string.
char *model_config_to_json(const ModelConfig *c);
// Writes a "model:" YAML section with every key.
void model_config_write_yaml(const ModelConfig *c, FILE *f);
// Reads a config from the JSON object model_config_to_json writes.
int model_config_from_json(ModelConfig *c, const char *json, char *err, size_t errlen);
// For the nearest-key hint of unknown keys: the list of key names.
extern const char *const model_config_keys[];

static inline int model_is_moe_layer(const ModelConfig *c, int l) {
    return c->n_experts > 0 && l >= c->dense_layers;
}
static inline int model_moe_layers(const ModelConfig *c) {
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += model_is_moe_layer(c, l);
    return n;
}
static inline int model_q_dim(const ModelConfig *c) { return c->n_heads * c->head_dim; }
static inline int model_kv_dim(const ModelConfig *c) { return c->n_kv_heads * c->head_dim; }
