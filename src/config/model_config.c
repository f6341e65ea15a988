// Model config: defaults, one key table, parsing, validation, JSON.
#include "config/model_config.h"

#include <errno.h>
#include <json-c/json.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/check.h"
#include "util/text.h"

typedef enum { K_INT, K_FLOAT, K_BOOL, K_ENUM } KeyType;
typedef struct {
    const char *name;
    KeyType type;
    size_t offset;
    const char *const *enum_names; // NULL-terminated, for K_ENUM
} KeyDesc;

static const char *const norm_names[] = {"pre", "post", "peri", NULL};
static const char *const qknorm_names[] = {"none", "full", "head", NULL};
static const char *const gating_names[] = {"softmax", "sigmoid", NULL};
static const char *const routing_names[] = {"learned", "random", "uniform", NULL};

#define KEY(n, t) {#n, t, offsetof(ModelConfig, n), NULL}
#define KEYE(n, names) {#n, K_ENUM, offsetof(ModelConfig, n), names}
static const KeyDesc keys[] = {
    KEY(vocab_size, K_INT),      KEY(d_model, K_INT),         KEY(n_layers, K_INT),
    KEY(n_heads, K_INT),         KEY(n_kv_heads, K_INT),      KEY(head_dim, K_INT),
    KEY(rope_theta, K_FLOAT),    KEY(norm_eps, K_FLOAT),      KEYE(norm, norm_names),
    KEYE(qk_norm, qknorm_names), KEY(dense_layers, K_INT),    KEY(dense_hidden, K_INT),
    KEY(n_experts, K_INT),       KEY(top_k, K_INT),           KEY(expert_hidden, K_INT),
    KEY(n_shared, K_INT),        KEY(shared_hidden, K_INT),   KEYE(gating, gating_names),
    KEY(renorm_topk, K_BOOL),    KEY(lb_coef, K_FLOAT),       KEY(z_coef, K_FLOAT),
    KEY(lb_global, K_BOOL),      KEY(aux_free_rate, K_FLOAT), KEYE(routing, routing_names),
    KEY(seq_len, K_INT),         KEY(init_std, K_FLOAT),      KEY(capacity_factor, K_FLOAT),
};
#define NKEYS ((int)(sizeof(keys) / sizeof(keys[0])))

const char *const model_config_keys[] = {
    "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "rope_theta",
    "norm_eps", "norm", "qk_norm", "dense_layers", "dense_hidden", "n_experts", "top_k",
    "expert_hidden", "n_shared", "shared_hidden", "gating", "renorm_topk", "lb_coef", "z_coef",
    "lb_global", "aux_free_rate", "routing", "seq_len", "init_std", "capacity_factor", NULL};

void model_config_defaults(ModelConfig *c) {
    // OLMoE-1B-7B's architecture at a small size
    memset(c, 0, sizeof(*c));
    c->vocab_size = 256;
    c->d_model = 128;
    c->n_layers = 4;
    c->n_heads = 4;
    c->rope_theta = 10000.0f;
    c->norm_eps = 1e-5f;
    c->norm = NORM_PRE;
    c->qk_norm = QKNORM_FULL;
    c->dense_hidden = 0; // 0: 4 * d_model rounded, resolved in validate
    c->n_experts = 8;
    c->top_k = 2;
    c->expert_hidden = 256;
    c->gating = GATING_SOFTMAX;
    c->lb_coef = 0.01f;
    c->z_coef = 0.001f;
    c->routing = ROUTING_LEARNED;
    c->seq_len = 256;
    c->init_std = 0.02f;
}

static const KeyDesc *find_key(const char *name) {
    if (strncmp(name, "model.", 6) == 0) name += 6;
    for (int i = 0; i < NKEYS; i++)
        if (strcmp(keys[i].name, name) == 0) return &keys[i];
    return NULL;
}

int model_config_set(ModelConfig *c, const char *key, const char *value, char *err, size_t errlen) {
    const KeyDesc *k = find_key(key);
    if (!k) {
        const char *bare = strncmp(key, "model.", 6) ? key : key + 6;
        const char *hint = nearest_key(bare, model_config_keys);
        if (hint) snprintf(err, errlen, "unknown key model.%s (did you mean model.%s?)", bare, hint);
        else snprintf(err, errlen, "unknown key model.%s", bare);
        return -1;
    }
    char *p = (char *)c + k->offset;
    char *end = NULL;
    errno = 0;
    switch (k->type) {
    case K_INT: {
        long v = strtol(value, &end, 10);
        if (end == value || *end) {
            snprintf(err, errlen, "model.%s: expected an integer, got '%s'", k->name, value);
            return -1;
        }
        if (errno == ERANGE || v < -INT_MAX || v > INT_MAX) {
            snprintf(err, errlen, "model.%s: %s is out of range (a 32-bit integer: at most %d)", k->name, value,
                     INT_MAX);
            return -1;
        }
        *(int *)p = (int)v;
        return 0;
    }
    case K_FLOAT: {
        double v = strtod(value, &end);
        if (end == value || *end || errno || !isfinite(v)) {
            snprintf(err, errlen, "model.%s: expected a number, got '%s'", k->name, value);
            return -1;
        }
        *(float *)p = (float)v;
        return 0;
    }
    case K_BOOL:
        if (!strcasecmp(value, "true") || !strcmp(value, "1")) { *(int *)p = 1; return 0; }
        if (!strcasecmp(value, "false") || !strcmp(value, "0")) { *(int *)p = 0; return 0; }
        snprintf(err, errlen, "model.%s: expected true or false, got '%s'", k->name, value);
        return -1;
    case K_ENUM:
        for (int i = 0; k->enum_names[i]; i++)
            if (!strcmp(value, k->enum_names[i])) { *(int *)p = i; return 0; }
        int n = snprintf(err, errlen, "model.%s: '%s' is not one of", k->name, value);
        for (int i = 0; k->enum_names[i] && n > 0 && (size_t)n < errlen; i++)
            n += snprintf(err + n, errlen - n, " %s", k->enum_names[i]);
        return -1;
    }
    return -1;
}

// The int widths of the layout (model_q_dim, the shared experts' hidden
// size) and the parameter table's element counts, checked for overflow on a
// validated config. Counted in double, exact far beyond MODEL_MAX_PARAMS.
#define MODEL_MAX_PARAMS (1ll << 48)
static int model_config_check_sizes(const ModelConfig *c, char *err, size_t errlen) {
    double D = c->d_model, qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
    double Fs = (double)c->n_shared * c->shared_hidden;
    if (qd > INT_MAX)
        FAIL("model.n_heads (%d) x model.head_dim (%d) = %.0f is more than %d", c->n_heads, c->head_dim, qd, INT_MAX);
    if (Fs > INT_MAX)
        FAIL("model.n_shared (%d) x model.shared_hidden (%d) = %.0f is more than %d", c->n_shared, c->shared_hidden,
             Fs, INT_MAX);
    // matrices and norms, as in params/layout.c
    double attn = 2 * qd * D + 2 * kvd * D + 4 * D + qd + kvd;
    double dense = 3 * D * c->dense_hidden;
    double moe = (double)c->n_experts * D + 3.0 * c->n_experts * c->expert_hidden * D + 3 * Fs * D;
    int n_moe = model_moe_layers(c);
    double total = 2.0 * c->padded_vocab * D + D + (double)c->n_layers * attn + (double)(c->n_layers - n_moe) * dense +
                   (double)n_moe * moe;
    if (total > (double)MODEL_MAX_PARAMS)
        FAIL("model: these shapes give %.3g parameters (model.vocab_size %d, model.d_model %d, model.n_layers %d, "
             "model.n_experts %d, model.expert_hidden %d), more than the 2^48 = %.3g a parameter table counts",
             total, c->vocab_size, c->d_model, c->n_layers, c->n_experts, c->expert_hidden, (double)MODEL_MAX_PARAMS);
    return 0;
}

#define POSITIVE(f) do { if (c->f <= 0) FAIL("model." #f " must be positive, got %d", c->f); } while (0)
#define NONNEG(f) do { if (c->f < 0) FAIL("model." #f " must be >= 0, got %d", c->f); } while (0)

int model_config_validate(ModelConfig *c, char *err, size_t errlen) {
    // upper bounds keep every derived size far from integer overflow
#define AT_MOST(f, lim) do { if (c->f > (lim)) FAIL("model." #f " (%d) is larger than %d", c->f, (lim)); } while (0)
    AT_MOST(vocab_size, 1 << 30);
    AT_MOST(d_model, 1 << 20);
    AT_MOST(n_layers, 1 << 16);
    AT_MOST(n_heads, 1 << 16);
    AT_MOST(n_kv_heads, 1 << 16);
    AT_MOST(head_dim, 1 << 16);
    AT_MOST(dense_hidden, 1 << 22);
    AT_MOST(n_experts, 1 << 16);
    AT_MOST(top_k, 1 << 16);
    AT_MOST(expert_hidden, 1 << 22);
    AT_MOST(n_shared, 1 << 10);
    AT_MOST(shared_hidden, 1 << 22);
    AT_MOST(seq_len, 1 << 24);
    POSITIVE(vocab_size);
    POSITIVE(d_model);
    POSITIVE(n_layers);
    POSITIVE(n_heads);
    NONNEG(n_kv_heads);
    NONNEG(head_dim);
    POSITIVE(seq_len);
    NONNEG(dense_layers);
    NONNEG(dense_hidden);
    NONNEG(n_experts);
    NONNEG(n_shared);
    NONNEG(shared_hidden);
    if (c->head_dim == 0) {
        if (c->d_model % c->n_heads)
            FAIL("model.d_model (%d) must be divisible by model.n_heads (%d), or set model.head_dim",
                 c->d_model, c->n_heads);
        c->head_dim = c->d_model / c->n_heads;
    }
    if (c->head_dim % 2) FAIL("model.head_dim (%d) must be even for RoPE", c->head_dim);
    if (c->n_kv_heads == 0) c->n_kv_heads = c->n_heads;
    if (c->n_heads % c->n_kv_heads)
        FAIL("model.n_kv_heads (%d) must divide model.n_heads (%d)", c->n_kv_heads, c->n_heads);
    if (!(c->rope_theta > 0)) FAIL("model.rope_theta must be positive, got %g", c->rope_theta);
    if (!(c->norm_eps > 0)) FAIL("model.norm_eps must be positive, got %g", c->norm_eps);
    if (!(c->init_std > 0)) FAIL("model.init_std must be positive, got %g", c->init_std);
    if (c->lb_coef < 0) FAIL("model.lb_coef must be >= 0, got %g", c->lb_coef);
    if (c->z_coef < 0) FAIL("model.z_coef must be >= 0, got %g", c->z_coef);
    if (c->capacity_factor < 0) FAIL("model.capacity_factor must be >= 0 (0 = dropless), got %g", c->capacity_factor);
    if (c->aux_free_rate < 0) FAIL("model.aux_free_rate must be >= 0, got %g", c->aux_free_rate);
    int has_moe = c->n_experts > 0 && c->dense_layers < c->n_layers;
    if (c->dense_layers > c->n_layers)
        FAIL("model.dense_layers (%d) exceeds model.n_layers (%d)", c->dense_layers, c->n_layers);
    if (c->dense_layers > 0 || c->n_experts == 0) {
        if (c->dense_hidden == 0) c->dense_hidden = ((8 * c->d_model / 3) + 63) / 64 * 64;
    }
    if (has_moe) {
        POSITIVE(top_k);
        POSITIVE(expert_hidden);
        if (c->top_k > c->n_experts)
            FAIL("model.top_k (%d) must be <= model.n_experts (%d)", c->top_k, c->n_experts);
        if (c->n_shared > 0 && c->shared_hidden <= 0)
            FAIL("model.shared_hidden must be positive when model.n_shared is %d", c->n_shared);
    } else {
        if (c->n_experts == 0) c->dense_layers = c->n_layers;
    }
    c->padded_vocab = (c->vocab_size + 127) / 128 * 128;
    return model_config_check_sizes(c, err, errlen);
}

char *model_config_to_json(const ModelConfig *c) {
    json_object *o = json_object_new_object();
    for (int i = 0; i < NKEYS; i++) {
        const char *p = (const char *)c + keys[i].offset;
        json_object *v = NULL;
        switch (keys[i].type) {
        case K_INT: v = json_object_new_int(*(const int *)p); break;
        case K_FLOAT: v = json_object_new_double(*(const float *)p); break;
        case K_BOOL: v = json_object_new_boolean(*(const int *)p); break;
        case K_ENUM: v = json_object_new_string(keys[i].enum_names[*(const int *)p]); break;
        }
        json_object_object_add(o, keys[i].name, v);
    }
    json_object_object_add(o, "padded_vocab", json_object_new_int(c->padded_vocab));
    char *s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
    return s;
}

void model_config_write_yaml(const ModelConfig *c, FILE *f) {
    fprintf(f, "model:\n");
    for (int i = 0; i < NKEYS; i++) {
        const char *p = (const char *)c + keys[i].offset;
        fprintf(f, "  %s: ", keys[i].name);
        switch (keys[i].type) {
        case K_INT: fprintf(f, "%d\n", *(const int *)p); break;
        case K_FLOAT: fprintf(f, "%.9g\n", *(const float *)p); break;
        case K_BOOL: fprintf(f, "%s\n", *(const int *)p ? "true" : "false"); break;
        case K_ENUM: fprintf(f, "%s\n", keys[i].enum_names[*(const int *)p]); break;
        }
    }
}

int model_config_from_json(ModelConfig *c, const char *json, char *err, size_t errlen) {
    json_object *o = json_tokener_parse(json);
    if (!o || !json_object_is_type(o, json_type_object)) {
        if (o) json_object_put(o);
        FAIL("model config: not a JSON object");
    }
    model_config_defaults(c);
    int rc = 0;
    json_object_object_foreach(o, key, val) {
        if (!strcmp(key, "padded_vocab")) continue;
        char buf[64];
        const char *s;
        if (json_object_is_type(val, json_type_string)) s = json_object_get_string(val);
        else if (json_object_is_type(val, json_type_double)) {
            snprintf(buf, sizeof buf, "%.9g", json_object_get_double(val));
            s = buf;
        } else s = json_object_to_json_string(val);
        if (model_config_set(c, key, s, err, errlen)) { rc = -1; break; }
    }
    json_object_put(o);
    return rc ? rc : model_config_validate(c, err, errlen);
}

// The ops of a config whose sizes a backend may not take, each with the
// config keys that set them, asked of ops->supports before any allocation.
int model_config_check_backend(const ModelConfig *c, const Ops *ops, int micro_batch, int ep, char *err,
                               size_t errlen) {
    if (!ops->supports) return 0;
    char why[300];
    OpDesc a = {.op = OP_ATTENTION, .B = micro_batch, .T = c->seq_len, .H = c->n_heads, .KV = c->n_kv_heads,
                .hd = c->head_dim};
    if (!ops->supports(&a, why, sizeof why)) {
        snprintf(err, errlen, "model.head_dim %d, model.n_heads %d, model.n_kv_heads %d, model.seq_len %d, "
                 "train.micro_batch %d: the %s backend cannot run this attention: %s", c->head_dim, c->n_heads,
                 c->n_kv_heads, c->seq_len, micro_batch, ops->name, why);
        return -1;
    }
    if (c->n_experts <= 0) return 0;
    OpDesc r = {.op = OP_ROUTER, .N = micro_batch * c->seq_len, .E = c->n_experts, .k = c->top_k,
                .routing = c->routing};
    if (!ops->supports(&r, why, sizeof why)) {
        snprintf(err, errlen, "model.n_experts %d, model.top_k %d: the %s backend cannot run this router: %s",
                 c->n_experts, c->top_k, ops->name, why);
        return -1;
    }
    // the experts' gate/up (d_model -> expert_hidden) and down products
    OpDesc g = {.op = OP_GROUPED_MATMUL, .E = c->n_experts / (ep > 0 ? ep : 1), .C = c->d_model,
                .OC = c->expert_hidden};
    if (!ops->supports(&g, why, sizeof why)) {
        snprintf(err, errlen, "model.n_experts %d (%d per rank), model.d_model %d, model.expert_hidden %d: the %s "
                 "backend cannot run these expert GEMMs: %s", c->n_experts, g.E, c->d_model, c->expert_hidden,
                 ops->name, why);
        return -1;
    }
    return 0;
}
