// Hugging Face config.json <-> moecore model config (docs/hf.md): which
// architectures and options map, the JSON moecore writes, and the checks of
// the JSON it reads (each refusal names the field).
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/hf.h"
#include "util/check.h"

// Parses JSON text; NULL with "PATH: not valid JSON (...)".
json_object *hf_parse_json(const char *text, const char *path, char *err, size_t errlen) {
    enum json_tokener_error jerr = json_tokener_success;
    json_object *o = json_tokener_parse_verbose(text, &jerr);
    if (!o || jerr != json_tokener_success) {
        snprintf(err, errlen, "%s: not valid JSON (%s)", path,
                 jerr != json_tokener_success ? json_tokener_error_desc(jerr) : "empty or null");
        if (o) json_object_put(o);
        return NULL;
    }
    if (!json_object_is_type(o, json_type_object)) {
        snprintf(err, errlen, "%s: not a JSON object", path);
        json_object_put(o);
        return NULL;
    }
    return o;
}

// ---- configs -----------------------------------------------------------------------------

const char *hf_format_name(HfFormat f) {
    return f == HF_OLMOE ? "olmoe" : f == HF_FLEX_OLMO ? "flex_olmo" : "auto";
}

static const char *norm_name(int n) { return n == NORM_PRE ? "pre" : n == NORM_POST ? "post" : "peri"; }
static const char *qk_name(int q) { return q == QKNORM_NONE ? "none" : q == QKNORM_FULL ? "full" : "head"; }

int hf_check_config(const ModelConfig *c, HfFormat *f, char *err, size_t errlen) {
    if (c->norm == NORM_PERI)
        FAIL_GOTO("model.norm = peri has no transformers equivalent (olmoe is model.norm = pre, flex_olmo is post)");
    HfFormat want = c->norm == NORM_PRE ? HF_OLMOE : HF_FLEX_OLMO;
    if (*f == HF_AUTO) *f = want;
    if (*f != want)
        FAIL_GOTO("model.norm = %s cannot be written as %s, which is model.norm = %s", norm_name(c->norm),
             hf_format_name(*f), *f == HF_OLMOE ? "pre" : "post");
    const char *fn = hf_format_name(*f);
    if (c->qk_norm != QKNORM_FULL)
        FAIL_GOTO("model.qk_norm = %s: %s normalises q and k over their full width (model.qk_norm = full)",
             qk_name(c->qk_norm), fn);
    if (c->n_experts == 0) FAIL_GOTO("model.n_experts = 0: %s has an MoE feed-forward in every layer", fn);
    if (c->dense_layers > 0)
        FAIL_GOTO("model.dense_layers = %d: %s has an MoE feed-forward in every layer (model.dense_layers = 0)",
             c->dense_layers, fn);
    if (c->n_shared > 0) FAIL_GOTO("model.n_shared = %d: %s has no shared experts", c->n_shared, fn);
    if (c->gating != GATING_SOFTMAX) FAIL_GOTO("model.gating = sigmoid: %s gates with a softmax", fn);
    if (c->routing != ROUTING_LEARNED)
        FAIL_GOTO("model.routing = %s: %s routes with the learned router (model.routing = learned)",
             c->routing == ROUTING_RANDOM ? "random" : "uniform", fn);
    if (c->capacity_factor > 0)
        FAIL_GOTO("model.capacity_factor = %g: %s computes every routed token (model.capacity_factor = 0, dropless)",
             c->capacity_factor, fn);
    if (c->aux_free_rate > 0)
        FAIL_GOTO("model.aux_free_rate = %g: the aux-loss-free router bias changes which experts are chosen, "
             "and %s has no router bias", c->aux_free_rate, fn);
    if (*f == HF_OLMOE && c->head_dim * c->n_heads != c->d_model)
        FAIL_GOTO("model.head_dim = %d: olmoe derives head_dim = hidden_size / num_attention_heads = %d "
             "(flex_olmo, model.norm = post, takes any head_dim)", c->head_dim, c->d_model / c->n_heads);
    return 0;
fail:
    return -1;
}

// The shortest decimal that reads back as the same float, always with a
// fraction or exponent so that Python reads a float.
static json_object *json_float(float v) {
    char b[40];
    for (int p = 6; p <= 9; p++) {
        snprintf(b, sizeof b, "%.*g", p, (double)v);
        if ((float)strtod(b, NULL) == v) break;
    }
    if (!strpbrk(b, ".eE")) strcat(b, ".0");
    return json_object_new_double_s((double)v, b);
}

char *hf_config_json(const ModelConfig *c, HfFormat f, StDtype dtype, int eos_token_id) {
    json_object *o = json_object_new_object(), *arch = json_object_new_array();
    json_object_array_add(arch, json_object_new_string(f == HF_OLMOE ? "OlmoeForCausalLM" : "FlexOlmoForCausalLM"));
#define ADD(k, v) json_object_object_add(o, k, v)
    ADD("architectures", arch);
    ADD("model_type", json_object_new_string(hf_format_name(f)));
    ADD("vocab_size", json_object_new_int(c->padded_vocab));
    ADD("hidden_size", json_object_new_int(c->d_model));
    ADD("intermediate_size", json_object_new_int(c->expert_hidden));
    ADD("num_hidden_layers", json_object_new_int(c->n_layers));
    ADD("num_attention_heads", json_object_new_int(c->n_heads));
    ADD("num_key_value_heads", json_object_new_int(c->n_kv_heads));
    ADD("head_dim", json_object_new_int(c->head_dim));
    ADD("hidden_act", json_object_new_string("silu"));
    ADD("max_position_embeddings", json_object_new_int(c->seq_len));
    ADD("initializer_range", json_float(c->init_std));
    ADD("rms_norm_eps", json_float(c->norm_eps));
    ADD("rope_theta", json_float(c->rope_theta));
    ADD("rope_scaling", NULL);
    ADD("attention_bias", json_object_new_boolean(0));
    ADD("attention_dropout", json_float(0.0f));
    if (f == HF_OLMOE) ADD("clip_qkv", NULL);
    ADD("num_experts", json_object_new_int(c->n_experts));
    ADD("num_experts_per_tok", json_object_new_int(c->top_k));
    ADD("norm_topk_prob", json_object_new_boolean(c->renorm_topk));
    ADD("output_router_logits", json_object_new_boolean(0));
    ADD("router_aux_loss_coef", json_float(c->lb_coef));
    ADD("tie_word_embeddings", json_object_new_boolean(0));
    ADD("use_cache", json_object_new_boolean(1));
    ADD("pad_token_id", NULL);
    ADD("bos_token_id", NULL);
    ADD("eos_token_id", eos_token_id >= 0 ? json_object_new_int(eos_token_id) : NULL);
    ADD("torch_dtype", json_object_new_string(dtype == ST_BF16 ? "bfloat16" : "float32"));
    char *mc = model_config_to_json(c);
    ADD("moecore_model_config", json_tokener_parse(mc));
    free(mc);
#undef ADD
    char *s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED));
    json_object_put(o);
    size_t n = strlen(s);
    s = reallocCheck(s, n + 2);
    strcpy(s + n, "\n");
    return s;
}

// config.json field readers: absent (or null) takes the default; a present
// field of the wrong type is an error naming it.
static int get_int(json_object *o, const char *key, int required, int def, int *out, const char *path,
                   char *err, size_t errlen) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !v) {
        if (required) { snprintf(err, errlen, "%s: missing %s", path, key); return -1; }
        *out = def;
        return 0;
    }
    int64_t x = json_object_get_int64(v);
    if (!json_object_is_type(v, json_type_int) || x <= 0 || x > 1000000000) {
        snprintf(err, errlen, "%s: %s: expected a positive integer, got %s", path, key, json_object_to_json_string(v));
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int get_float(json_object *o, const char *key, float def, float *out, const char *path, char *err,
                     size_t errlen) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !v) { *out = def; return 0; }
    if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int)) {
        snprintf(err, errlen, "%s: %s: expected a number, got %s", path, key, json_object_to_json_string(v));
        return -1;
    }
    *out = (float)json_object_get_double(v);
    return 0;
}

static int get_bool(json_object *o, const char *key, int def, int *out, const char *path, char *err, size_t errlen) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !v) { *out = def; return 0; }
    if (!json_object_is_type(v, json_type_boolean)) {
        snprintf(err, errlen, "%s: %s: expected true or false, got %s", path, key, json_object_to_json_string(v));
        return -1;
    }
    *out = json_object_get_boolean(v);
    return 0;
}

// A field that must be absent, null or equal to `allowed` (a JSON text).
static int require_unset(json_object *o, const char *key, const char *allowed, const char *why, const char *path,
                         char *err, size_t errlen) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !v) return 0;
    const char *s = json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN);
    if (allowed && !strcmp(s, allowed)) return 0;
    snprintf(err, errlen, "%s: %s = %s is not supported (%s)", path, key, s, why);
    return -1;
}

int hf_config_parse(const char *json, const char *path, ModelConfig *c, HfFormat *f, int *hf_vocab,
                    int *tied, char *err, size_t errlen) {
    json_object *o = hf_parse_json(json, path, err, errlen), *v;
    if (!o) return -1;
    if (!json_object_object_get_ex(o, "model_type", &v) || !json_object_is_type(v, json_type_string))
        FAIL_GOTO("%s: missing model_type", path);
    const char *mt = json_object_get_string(v);
    if (!strcmp(mt, "olmoe")) *f = HF_OLMOE;
    else if (!strcmp(mt, "flex_olmo")) *f = HF_FLEX_OLMO;
    else FAIL_GOTO("%s: model_type %s is not supported (olmoe, flex_olmo)", path, mt);
    int nested = json_object_object_get_ex(o, "moecore_model_config", &v) && v;
    if (nested) {
        if (!json_object_is_type(v, json_type_object)) FAIL_GOTO("%s: moecore_model_config: not a JSON object", path);
        char e2[512];
        if (model_config_from_json(c, json_object_to_json_string(v), e2, sizeof e2))
            FAIL_GOTO("%s: moecore_model_config: %s", path, e2);
    } else {
        model_config_defaults(c);
    }
    int nested_vocab = c->vocab_size;
    int D, F, L, H, KV, E, K, hd, maxpos;
    if (get_int(o, "hidden_size", 1, 0, &D, path, err, errlen) ||
        get_int(o, "intermediate_size", 1, 0, &F, path, err, errlen) ||
        get_int(o, "num_hidden_layers", 1, 0, &L, path, err, errlen) ||
        get_int(o, "num_attention_heads", 1, 0, &H, path, err, errlen) ||
        get_int(o, "num_experts", 1, 0, &E, path, err, errlen) ||
        get_int(o, "num_experts_per_tok", 1, 0, &K, path, err, errlen) ||
        get_int(o, "vocab_size", 1, 0, hf_vocab, path, err, errlen) ||
        get_int(o, "num_key_value_heads", 0, H, &KV, path, err, errlen) ||
        get_int(o, "head_dim", 0, D / H, &hd, path, err, errlen) ||
        get_int(o, "max_position_embeddings", 0, 4096, &maxpos, path, err, errlen))
        goto fail;
    if (*f == HF_OLMOE && (D % H || hd != D / H))
        FAIL_GOTO("%s: head_dim = %d: olmoe uses hidden_size / num_attention_heads (%d / %d)", path, hd, D, H);
    float theta, eps, std = c->init_std, aux = c->lb_coef;
    if (get_float(o, "rope_theta", *f == HF_OLMOE ? 10000.0f : 500000.0f, &theta, path, err, errlen)) goto fail;
    json_object *rp;
    if (!json_object_object_get_ex(o, "rope_theta", &v) && json_object_object_get_ex(o, "rope_parameters", &rp) && rp) {
        // newer transformers write {"rope_type": "default", "rope_theta": ...}
        if (require_unset(rp, "rope_type", "\"default\"", "moecore has plain RoPE", path, err, errlen) ||
            get_float(rp, "rope_theta", theta, &theta, path, err, errlen))
            goto fail;
    }
    if (get_float(o, "rms_norm_eps", *f == HF_OLMOE ? 1e-5f : 1e-6f, &eps, path, err, errlen) ||
        get_float(o, "initializer_range", std, &std, path, err, errlen) ||
        get_float(o, "router_aux_loss_coef", aux, &aux, path, err, errlen) ||
        get_bool(o, "norm_topk_prob", 0, &c->renorm_topk, path, err, errlen) ||
        get_bool(o, "tie_word_embeddings", 0, tied, path, err, errlen))
        goto fail;
    if (require_unset(o, "hidden_act", "\"silu\"", "moecore's experts are SwiGLU", path, err, errlen) ||
        require_unset(o, "attention_bias", "false", "moecore's projections have no bias", path, err, errlen) ||
        require_unset(o, "clip_qkv", NULL, "moecore does not clip q, k, v", path, err, errlen) ||
        require_unset(o, "rope_scaling", NULL, "moecore has plain RoPE", path, err, errlen))
        goto fail;
    c->d_model = D;
    c->expert_hidden = F;
    c->n_layers = L;
    c->n_heads = H;
    c->n_kv_heads = KV;
    c->head_dim = hd;
    c->n_experts = E;
    c->top_k = K;
    c->rope_theta = theta;
    c->norm_eps = eps;
    c->init_std = std;
    c->lb_coef = aux;
    c->norm = *f == HF_OLMOE ? NORM_PRE : NORM_POST;
    c->qk_norm = QKNORM_FULL;
    c->dense_layers = 0;
    c->dense_hidden = 0;
    c->n_shared = 0;
    c->shared_hidden = 0;
    c->gating = GATING_SOFTMAX;
    c->routing = ROUTING_LEARNED;
    c->aux_free_rate = 0;
    // the real vocabulary when the padded one is what moecore exported, else all rows
    c->vocab_size = nested && nested_vocab <= *hf_vocab && (nested_vocab + 127) / 128 * 128 == *hf_vocab
                        ? nested_vocab : *hf_vocab;
    if (!nested) c->seq_len = maxpos < 4096 ? maxpos : 4096;
    char e2[512];
    if (model_config_validate(c, e2, sizeof e2)) FAIL_GOTO("%s: %s", path, e2);
    json_object_put(o);
    return 0;
fail:
    json_object_put(o);
    return -1;
}

