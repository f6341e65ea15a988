// Run config: key table, YAML reader, overrides, validation, YAML writer.
#include <stdio.h>

#include "config/config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "util/check.h"
#include "util/text.h"

typedef enum { T_INT, T_I64, T_U64, T_DOUBLE, T_FLOAT, T_BOOL, T_ENUM, T_STR, T_LIST, T_MODEL } KType;
typedef struct {
    const char *key;   // "section.name"
    KType type;
    size_t offset;
    const char *const *enums;
} Key;

static const char *const dtype_names[] = {"uint16", "uint32", NULL};
static const char *const sched_names[] = {"cosine", "wsd", "constant", "linear", "inv_sqrt", NULL};
static const char *const decay_shape_names[] = {"linear", "cosine", "1-sqrt", NULL}; // DecayShape
static const char *const device_names[] = {"cpu", "cuda", NULL};
static const char *const recompute_names[] = {"none", "experts", "gather", "layers", NULL};
static const char *const precision_names[] = {"bf16", "fp8", NULL};            // Precision
static const char *const fp8_recipe_names[] = {"block128", "mxfp8", NULL};     // Fp8Recipe
static const char *const fp8_gemms_names[] = {"experts", "experts_dense", NULL}; // Fp8Gemms
static const char *const fp8_wgrad_names[] = {"bf16", "fp8", NULL};              // Fp8Wgrad
// parallel.ep_backend, in EpBackend's order (model.h)
static const char *const ep_backend_names[] = {"auto", "a2a", "symmetric", NULL};
// parallel.pp_schedule, in the order of dist/pp_schedule.h's PPScheduleKind
static const char *const pp_schedule_names[] = {"gpipe", "1f1b", "interleaved", "zb1", NULL};
static const char *const gemm_kernel_names[] = CUDA_KERNELS_NAMES;

#define F(field, type) {#field, type, offsetof(RunConfig, field), NULL}
#define FE(field, names) {#field, T_ENUM, offsetof(RunConfig, field), names}
static const Key table[] = {
    F(data.train, T_LIST), F(data.train_weights, T_LIST), F(data.eval, T_LIST),
    FE(data.dtype, dtype_names), F(data.validate, T_BOOL), F(data.synthetic, T_BOOL), F(data.eos_id, T_INT),
    F(data.doc_mask, T_BOOL), F(data.tokenizer, T_STR),
    F(train.global_batch, T_INT), F(train.micro_batch, T_INT), F(train.steps, T_I64),
    F(train.tokens, T_I64), FE(train.lr_schedule, sched_names), F(train.warmup_steps, T_I64),
    F(train.decay_fraction, T_DOUBLE), F(train.min_lr_ratio, T_DOUBLE), F(train.clip_grad, T_DOUBLE),
    F(train.skip_window, T_INT), F(train.skip_sigmas, T_DOUBLE), F(train.eval_interval, T_I64),
    F(train.max_nonfinite_steps, T_INT),
    F(train.eval_batches, T_INT), F(train.seed, T_U64), FE(train.recompute, recompute_names),
    F(train.recompute_every, T_INT), F(train.recompute_first, T_INT), F(train.recompute_norms, T_BOOL),
    F(train.recompute_attention, T_BOOL), F(train.recompute_swiglu, T_BOOL),
    FE(train.decay_shape, decay_shape_names), FE(train.precision, precision_names),
    FE(fp8.recipe, fp8_recipe_names), FE(fp8.gemms, fp8_gemms_names), FE(fp8.wgrad, fp8_wgrad_names),
    F(optim.lr, T_FLOAT), F(optim.beta1, T_FLOAT), F(optim.beta2, T_FLOAT), F(optim.eps, T_FLOAT),
    F(optim.weight_decay, T_FLOAT), F(optim.decay_norms, T_BOOL), F(optim.decay_embeddings, T_BOOL),
    {"optim.sharded", T_BOOL, offsetof(RunConfig, optim_sharded), NULL},
    F(checkpoint.dir, T_STR), F(checkpoint.interval, T_I64), F(checkpoint.keep, T_INT), F(checkpoint.save_final, T_BOOL),
    F(logging.run_dir, T_STR), F(logging.log_interval, T_I64), F(logging.gerrymander_window, T_INT),
    F(logging.tensorboard, T_BOOL),
    F(parallel.dp, T_INT), F(parallel.ep, T_INT), F(parallel.pp, T_INT), F(parallel.bucket_mb, T_DOUBLE), F(parallel.timeout_s, T_DOUBLE),
    FE(parallel.ep_backend, ep_backend_names), F(parallel.ep_recv_factor, T_DOUBLE),
    FE(parallel.pp_schedule, pp_schedule_names), F(parallel.pp_virtual, T_INT), F(parallel.pp_layers, T_LIST),
    FE(device.type, device_names), F(device.peak_tflops, T_DOUBLE), F(device.cuda_graph, T_BOOL),
    FE(device.cuda.grouped_gemm, gemm_kernel_names), FE(device.cuda.grouped_wgrad, gemm_kernel_names),
    F(device.cuda.gemm_tma, T_BOOL), F(device.cuda.attention_ds_mib, T_INT), F(device.cuda.fp8_wgrad_gemm, T_BOOL),
    F(device.cuda.attention_group, T_INT),
    FE(device.cuda.attention_fwd, gemm_kernel_names), FE(device.cuda.attention_bwd, gemm_kernel_names),
};
#define NTABLE ((int)(sizeof(table) / sizeof(table[0])))

const char *const *run_config_keys(void) {
    static const char *keys[NTABLE + 64];
    if (!keys[0]) {
        int n = 0;
        for (int i = 0; model_config_keys[i]; i++) {
            static char buf[64][40];
            snprintf(buf[i], sizeof buf[i], "model.%s", model_config_keys[i]);
            keys[n++] = buf[i];
        }
        for (int i = 0; i < NTABLE; i++) keys[n++] = table[i].key;
        keys[n] = NULL;
    }
    return keys;
}

void run_config_defaults(RunConfig *c) {
    memset(c, 0, sizeof(*c));
    model_config_defaults(&c->model);
    optim_config_defaults(&c->optim);
    c->data.dtype = 0;
    c->data.eos_id = 256;   // the byte tokenizer's EOS (src/data/tokenizer.h)
    c->train.global_batch = 8;
    c->train.micro_batch = 8;
    c->train.steps = 100;
    c->train.lr_schedule = LR_COSINE;
    c->train.warmup_steps = 10;
    c->train.decay_fraction = 0.2;
    c->train.min_lr_ratio = 0.1;
    c->train.clip_grad = 1.0;
    c->train.skip_window = 0;
    c->train.skip_sigmas = 6.0;
    c->train.max_nonfinite_steps = 5;
    c->train.eval_interval = 0;
    c->train.eval_batches = 4;
    c->train.seed = 1;
    c->checkpoint.interval = 0;
    c->checkpoint.keep = 3;
    c->checkpoint.save_final = 1;
    snprintf(c->logging.run_dir, CFG_PATH_MAX, "runs/default");
    c->logging.log_interval = 10;
    c->logging.gerrymander_window = 50;
    c->parallel.dp = c->parallel.ep = c->parallel.pp = 1;
    c->parallel.bucket_mb = 16;
    c->parallel.timeout_s = 600;
    c->parallel.pp_schedule = 1; // 1f1b
    c->parallel.pp_virtual = 1;
    c->device.cuda_graph = 1;
    c->device.cuda = cuda_settings_default();
}

static void list_clear(StrList *l) {
    for (int i = 0; i < l->n; i++) free(l->items[i]);
    l->n = 0;
}

void run_config_free(RunConfig *c) {
    list_clear(&c->data.train);
    list_clear(&c->data.train_weights);
    list_clear(&c->data.eval);
    list_clear(&c->parallel.pp_layers);
    for (int i = 0; i < c->n_origins; i++) free(c->origins[i].arg);
    free(c->origins);
    c->origins = NULL;
    c->n_origins = 0;
}

// ---- where values came from -------------------------------------------------------------

static KeyOrigin *origin_find(const RunConfig *c, const char *key) {
    for (int i = 0; i < c->n_origins; i++)
        if (!strcmp(c->origins[i].key, key)) return &c->origins[i];
    return NULL;
}

// Records that key was last set at YAML line (> 0) or by arg.
static void origin_set(RunConfig *c, const char *key, int line, const char *arg) {
    KeyOrigin *o = origin_find(c, key);
    if (!o) {
        c->origins = reallocCheck(c->origins, (size_t)(c->n_origins + 1) * sizeof *c->origins);
        o = &c->origins[c->n_origins++];
        snprintf(o->key, sizeof o->key, "%s", key);
        o->arg = NULL;
    }
    free(o->arg);
    o->line = line;
    o->arg = arg ? strdup(arg) : NULL;
}

// Where msg mentions key as a whole word (not inside data.train_weights for
// data.train); -1 if nowhere.
static long mention(const char *msg, const char *key) {
    size_t n = strlen(key);
    for (const char *p = strstr(msg, key); p; p = strstr(p + 1, key)) {
        int before = p > msg && (isalnum((unsigned char)p[-1]) || p[-1] == '_' || p[-1] == '.');
        int after = isalnum((unsigned char)p[n]) || p[n] == '_';
        if (!before && !after) return p - msg;
    }
    return -1;
}

void run_config_blame(const RunConfig *c, const char *msg, char *err, size_t errlen) {
    // the origins of the keys msg names, in the order it names them
    const KeyOrigin *named[CFG_MAX_LIST];
    long at[CFG_MAX_LIST];
    int n = 0;
    for (int i = 0; i < c->n_origins && n < CFG_MAX_LIST; i++) {
        long pos = mention(msg, c->origins[i].key);
        if (pos < 0) continue;
        int j = n++;
        for (; j > 0 && at[j - 1] > pos; j--) { at[j] = at[j - 1]; named[j] = named[j - 1]; }
        at[j] = pos;
        named[j] = &c->origins[i];
    }
    char where[1200] = "";
    size_t k = 0;
    for (int i = 0; i < n && k < sizeof where; i++)
        if (named[i]->arg)
            k += (size_t)snprintf(where + k, sizeof where - k, "%s%s", k ? ", " : "command line: ", named[i]->arg);
    for (int i = 0; i < n && !k; i++)
        if (named[i]->line > 0) k = (size_t)snprintf(where, sizeof where, "%s:%d", c->source, named[i]->line);
    if (!k && c->source[0]) snprintf(where, sizeof where, "%s", c->source);
    if (where[0]) snprintf(err, errlen, "%s: %s", where, msg);
    else snprintf(err, errlen, "%s", msg);
}

static const Key *find(const char *key) {
    for (int i = 0; i < NTABLE; i++)
        if (!strcmp(table[i].key, key)) return &table[i];
    return NULL;
}

static int unknown_key(const char *key, char *err, size_t errlen) {
    const char *hint = nearest_key(key, run_config_keys());
    if (hint) snprintf(err, errlen, "unknown key %s (did you mean %s?)", key, hint);
    else snprintf(err, errlen, "unknown key %s", key);
    return -1;
}

static int list_append(StrList *l, const char *key, const char *v, char *err, size_t errlen) {
    if (l->n == CFG_MAX_LIST) {
        snprintf(err, errlen, "%s: more than %d entries", key, CFG_MAX_LIST);
        return -1;
    }
    l->items[l->n++] = strdup(v);
    return 0;
}

// Sets a scalar key (lists: one entry appended when append, else replaced by
// the comma-separated value).
static int set_key(RunConfig *c, const char *key, const char *value, int append, char *err,
                   size_t errlen) {
    if (!strncmp(key, "model.", 6)) return model_config_set(&c->model, key, value, err, errlen);
    const Key *k = find(key);
    if (!k) return unknown_key(key, err, errlen);
    char *p = (char *)c + k->offset, *end = NULL;
    errno = 0;
    switch (k->type) {
    case T_INT: case T_I64: {
        long long v = strtoll(value, &end, 10);
        if (end == value || *end) {
            snprintf(err, errlen, "%s: expected an integer, got '%s'", key, value);
            return -1;
        }
        if (errno == ERANGE || (k->type == T_INT && (v > INT_MAX || v < -INT_MAX))) {
            snprintf(err, errlen, "%s: %s is out of range (a %d-bit integer: at most %lld)", key, value,
                     k->type == T_INT ? 32 : 64, k->type == T_INT ? (long long)INT_MAX : LLONG_MAX);
            return -1;
        }
        if (k->type == T_INT) *(int *)p = (int)v; else *(int64_t *)p = v;
        return 0;
    }
    case T_U64: {
        unsigned long long v = strtoull(value, &end, 10);
        if (end == value || *end || value[0] == '-') {
            snprintf(err, errlen, "%s: expected a non-negative integer, got '%s'", key, value);
            return -1;
        }
        if (errno == ERANGE) {
            snprintf(err, errlen, "%s: %s is out of range (an unsigned 64-bit integer: at most %llu)", key, value,
                     ULLONG_MAX);
            return -1;
        }
        *(uint64_t *)p = v;
        return 0;
    }
    case T_DOUBLE: case T_FLOAT: {
        double v = strtod(value, &end);
        if (end == value || *end || errno || !isfinite(v)) {
            snprintf(err, errlen, "%s: expected a number, got '%s'", key, value);
            return -1;
        }
        if (k->type == T_FLOAT) *(float *)p = (float)v; else *(double *)p = v;
        return 0;
    }
    case T_BOOL:
        if (!strcasecmp(value, "true") || !strcmp(value, "1")) { *(int *)p = 1; return 0; }
        if (!strcasecmp(value, "false") || !strcmp(value, "0")) { *(int *)p = 0; return 0; }
        snprintf(err, errlen, "%s: expected true or false, got '%s'", key, value);
        return -1;
    case T_ENUM: {
        for (int i = 0; k->enums[i]; i++)
            if (!strcmp(value, k->enums[i])) { *(int *)p = i; return 0; }
        int n = snprintf(err, errlen, "%s: '%s' is not one of", key, value);
        for (int i = 0; k->enums[i] && n > 0 && (size_t)n < errlen; i++)
            n += snprintf(err + n, errlen - n, " %s", k->enums[i]);
        return -1;
    }
    case T_STR:
        if (strlen(value) >= CFG_PATH_MAX) {
            snprintf(err, errlen, "%s: longer than %d characters", key, CFG_PATH_MAX - 1);
            return -1;
        }
        snprintf(p, CFG_PATH_MAX, "%s", value);
        return 0;
    case T_LIST: {
        StrList *l = (StrList *)p;
        if (append) return list_append(l, key, value, err, errlen);
        list_clear(l);
        char *copy = strdup(value), *save = NULL;
        int rc = 0;
        for (char *tok = strtok_r(copy, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save))
            if (*tok) rc = list_append(l, key, tok, err, errlen);
        free(copy);
        return rc;
    }
    case T_MODEL: break;
    }
    return -1;
}

int run_config_set(RunConfig *c, const char *key, const char *value, char *err, size_t errlen) {
    if (set_key(c, key, value, 0, err, errlen)) return -1;
    origin_set(c, key, 0, NULL);
    return 0;
}

int run_config_override(RunConfig *c, const char *arg, char *err, size_t errlen) {
    const char *eq = strchr(arg, '=');
    char key[256], msg[1024];
    if (strncmp(arg, "--", 2) || !eq || eq - arg - 2 >= (long)sizeof key) {
        snprintf(err, errlen, "command line: %s: expected --section.key=value", arg);
        return -1;
    }
    snprintf(key, sizeof key, "%.*s", (int)(eq - arg - 2), arg + 2);
    if (set_key(c, key, eq + 1, 0, msg, sizeof msg)) {
        snprintf(err, errlen, "command line: %s: %s", arg, msg);
        return -1;
    }
    origin_set(c, key, 0, arg);
    return 0;
}

// ---- YAML -------------------------------------------------------------------------------

// Whether section.name is a mapping of keys (device.cuda), not a key.
static int is_mapping_key(const char *section, const char *name) {
    char prefix[400];
    int n = snprintf(prefix, sizeof prefix, "%s.%s.", section, name);
    for (int i = 0; i < NTABLE; i++)
        if (!strncmp(table[i].key, prefix, n)) return 1;
    return 0;
}

// A key the YAML sets at line: an error if the file set it before.
static int yaml_key_once(const RunConfig *c, const char *key, size_t line, const char *name, char *err,
                         size_t errlen) {
    const KeyOrigin *o = origin_find(c, key);
    if (!o || o->line <= 0) return 0;
    snprintf(err, errlen, "%s:%zu: %s is given twice (first at line %d); give each key once", name, line, key,
             o->line);
    return -1;
}

static const char *const sections[] = {"model", "data", "train", "fp8", "optim", "checkpoint", "logging",
                                       "parallel", "device", NULL};

// Accepts one two-level document: sections mapping keys to scalars or to
// sequences of scalars (list keys), and where the table has keys
// section.mapping.key (device.cuda.*), mappings of those inside a section.
// Anything else, a key, mapping or section given twice included, is an
// error with its line.
int run_config_load_yaml_string(RunConfig *c, const char *text, size_t len, const char *name,
                                char *err, size_t errlen) {
    yaml_parser_t parser;
    yaml_event_t ev;
    if (!yaml_parser_initialize(&parser)) {
        snprintf(err, errlen, "%s: cannot initialise the YAML parser", name);
        return -1;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    enum { TOP, IN_SECTION, IN_LIST } state = TOP;
    int depth = 0, rc = 0, done = 0;
    // sub: the mapping inside a section ("cuda" of device.cuda.*), keys
    // one level further down
    char section[128] = "", sub[128] = "", key[256] = "", full[520], msg[512];
    int have_key = 0, list_started = 0, documents = 0;
    size_t key_line = 0, section_line[sizeof sections / sizeof *sections] = {0};
    // the mappings inside sections seen so far ("device.cuda") and their lines
    char subs[8][520];
    size_t sub_line[8];
    int n_subs = 0;
    snprintf(c->source, sizeof c->source, "%s", name);
    while (!done && !rc) {
        if (!yaml_parser_parse(&parser, &ev)) {
            snprintf(err, errlen, "%s:%zu: YAML syntax error: %s", name, parser.problem_mark.line + 1,
                     parser.problem ? parser.problem : "unknown");
            rc = -1;
            break;
        }
        size_t line = ev.start_mark.line + 1;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT: done = 1; break;
        case YAML_STREAM_START_EVENT: case YAML_DOCUMENT_END_EVENT: break;
        case YAML_DOCUMENT_START_EVENT:
            if (++documents > 1) {
                rc = -1;
                snprintf(err, errlen, "%s:%zu: a second YAML document ('---'); a config is one document", name, line);
            }
            break;
        case YAML_MAPPING_START_EVENT:
            depth++;
            if (depth == 2 && !section[0]) { rc = -1; snprintf(err, errlen, "%s:%zu: expected a section name", name, line); }
            else if (depth == 2) state = IN_SECTION;
            else if (depth == 3 && state == IN_SECTION && have_key && !sub[0] && is_mapping_key(section, key)) {
                snprintf(sub, sizeof sub, "%s", key);
                have_key = 0;
                snprintf(full, sizeof full, "%s.%s", section, sub);
                for (int i = 0; i < n_subs && !rc; i++)
                    if (!strcmp(subs[i], full)) {
                        rc = -1;
                        snprintf(err, errlen, "%s:%zu: %s is given twice (first at line %zu); give each mapping once",
                                 name, key_line, full, sub_line[i]);
                    }
                if (!rc && n_subs < 8) { snprintf(subs[n_subs], sizeof subs[n_subs], "%s", full); sub_line[n_subs++] = key_line; }
            } else if (depth > 2) {
                rc = -1;
                snprintf(err, errlen, "%s:%zu: %s.%s%s%s: nested mappings are not supported", name, line, section, sub,
                         sub[0] ? "." : "", key);
            }
            break;
        case YAML_MAPPING_END_EVENT:
            depth--;
            if (depth == 1) { state = TOP; section[0] = 0; have_key = 0; }
            if (depth == 2) { sub[0] = 0; have_key = 0; }
            break;
        case YAML_SEQUENCE_START_EVENT:
            if (state != IN_SECTION || !have_key) {
                rc = -1;
                snprintf(err, errlen, "%s:%zu: unexpected list%s%s", name, line, section[0] ? " in section " : "", section);
                break;
            }
            state = IN_LIST;
            list_started = 0;
            snprintf(full, sizeof full, "%s.%s%s%s", section, sub, sub[0] ? "." : "", key);
            {
                const Key *k = find(full);
                int model_key = 0;
                for (int i = 0; model_config_keys[i] && !strncmp(full, "model.", 6); i++)
                    model_key |= !strcmp(full + 6, model_config_keys[i]);
                if (!k && !model_key) { rc = unknown_key(full, msg, sizeof msg); snprintf(err, errlen, "%s:%zu: %s", name, line, msg); break; }
                if (!k || k->type != T_LIST) { rc = -1; snprintf(err, errlen, "%s:%zu: %s: expected a single value, got a list", name, line, full); break; }
                if ((rc = yaml_key_once(c, full, key_line, name, err, errlen))) break;
                list_clear((StrList *)((char *)c + k->offset));
                origin_set(c, full, (int)key_line, NULL);
            }
            break;
        case YAML_SEQUENCE_END_EVENT:
            state = IN_SECTION;
            have_key = 0;
            (void)list_started;
            break;
        case YAML_ALIAS_EVENT:
            rc = -1;
            snprintf(err, errlen, "%s:%zu: YAML aliases are not supported", name, line);
            break;
        case YAML_SCALAR_EVENT: {
            const char *v = (const char *)ev.data.scalar.value;
            if (depth == 1) {
                // a section name; an empty section ("optim:" alone) is a null scalar next
                if (!section[0]) {
                    if (strlen(v) >= sizeof section) { rc = -1; snprintf(err, errlen, "%s:%zu: section name too long", name, line); break; }
                    int ok = -1;
                    for (int i = 0; sections[i]; i++) if (!strcmp(v, sections[i])) ok = i;
                    if (ok >= 0 && section_line[ok]) {
                        rc = -1;
                        snprintf(err, errlen, "%s:%zu: section '%s' is given twice (first at line %zu); give each "
                                 "section once", name, line, v, section_line[ok]);
                        break;
                    }
                    if (ok >= 0) section_line[ok] = line;
                    if (ok < 0) {
                        const char *hint = nearest_key(v, sections);
                        rc = -1;
                        snprintf(err, errlen, "%s:%zu: unknown section '%s'%s%s%s", name, line, v,
                                 hint ? " (did you mean " : "", hint ? hint : "", hint ? "?)" : "");
                        break;
                    }
                    snprintf(section, sizeof section, "%s", v);
                } else if (!v[0]) {
                    section[0] = 0; // "section:" with no body
                } else {
                    rc = -1;
                    snprintf(err, errlen, "%s:%zu: section '%s' must be a mapping of keys", name, line, section);
                }
                break;
            }
            if (depth == 0) { rc = -1; snprintf(err, errlen, "%s:%zu: the config must be a mapping of sections", name, line); break; }
            if (state == IN_LIST) {
                rc = set_key(c, full, v, 1, msg, sizeof msg);
                if (rc) snprintf(err, errlen, "%s:%zu: %s", name, line, msg);
                break;
            }
            if (!have_key) {
                if (strlen(v) >= sizeof key) { rc = -1; snprintf(err, errlen, "%s:%zu: key too long", name, line); break; }
                snprintf(key, sizeof key, "%s", v);
                have_key = 1;
                key_line = line;
                break;
            }
            snprintf(full, sizeof full, "%s.%s%s%s", section, sub, sub[0] ? "." : "", key);
            if ((rc = yaml_key_once(c, full, key_line, name, err, errlen))) break;
            rc = set_key(c, full, v, 0, msg, sizeof msg);
            if (rc) snprintf(err, errlen, "%s:%zu: %s", name, line, msg);
            else origin_set(c, full, (int)key_line, NULL);
            have_key = 0;
            break;
        }
        default: break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    return rc;
}

int run_config_load_yaml(RunConfig *c, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open config %s: %s", path, strerror(errno));
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0 || n > (1 << 24)) {
        fclose(f);
        snprintf(err, errlen, "config %s: unreadable or larger than 16 MiB", path);
        return -1;
    }
    char *buf = mallocCheck(n + 1);
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    int rc = got == (size_t)n ? run_config_load_yaml_string(c, buf, n, path, err, errlen) : -1;
    if (got != (size_t)n) snprintf(err, errlen, "config %s: short read", path);
    free(buf);
    return rc;
}

// ---- validation ----------------------------------------------------------------------------

// The largest micro-batch that divides the global batch's share of one of dp
// ranks and is at most mb (0 if none), for the hint of the batch-size error.
static int micro_batch_hint(int global_batch, int dp, int mb) {
    if (global_batch % dp) return 0;
    for (int m = mb; m > 0; m--)
        if ((global_batch / dp) % m == 0) return m;
    return 0;
}

// The pipeline keys (issue 17). dist/pp_schedule and dist/pp_split build the
// schedule and the split later and check the same limits; here they are
// refused by key, before anything runs.
static int pipeline_validate(RunConfig *c, char *err, size_t errlen) {
    ParallelSection *p = &c->parallel;
    const TrainSection *t = &c->train;
    int v = p->pp_virtual, L = c->model.n_layers;
    p->n_pp_layers = 0;
    if (v < 1) FAIL("parallel.pp_virtual must be positive, got %d", v);
    if (p->pp == 1) {
        if (v > 1) FAIL("parallel.pp_virtual (%d) needs parallel.pp > 1", v);
        if (p->pp_layers.n) FAIL("parallel.pp_layers needs parallel.pp > 1 (it splits the layers into pipeline stages)");
        return 0;
    }
    if (p->pp > 64) FAIL("parallel.pp (%d) must be at most 64", p->pp);
    // MOECORE_PP_GPU=1 lets the GPU pipeline be tried: it has run with
    // several ranks on one GPU over MPI (tests/gpu/ranks.sh), its NCCL
    // hand-offs between GPUs never (bench/multi-gpu.sh pp)
    const char *pp_gpu = getenv("MOECORE_PP_GPU");
    if (c->device.type == 1 && !(pp_gpu && !strcmp(pp_gpu, "1")))
        FAIL("parallel.pp (%d): pipeline parallelism runs on CPU ranks for now (device.type: cpu); "
             "the GPU pipeline has run only with several ranks on one GPU over MPI, never over NCCL between GPUs "
             "(MOECORE_PP_GPU=1 tries it: the multi-GPU issue's pp step)",
             p->pp);
    if (p->pp_schedule == 2 && v < 2)
        FAIL("parallel.pp_schedule interleaved needs parallel.pp_virtual >= 2 model chunks per rank, got %d", v);
    if (p->pp_schedule != 2 && v > 1)
        FAIL("parallel.pp_virtual (%d) > 1 needs parallel.pp_schedule: interleaved (got %s)", v,
             pp_schedule_names[p->pp_schedule]);
    int S = p->pp * v;
    if (S > L)
        FAIL("parallel.pp (%d) x parallel.pp_virtual (%d) = %d pipeline stages for model.n_layers (%d): "
             "every stage needs at least one layer", p->pp, v, S, L);
    if (p->dp > 0 && t->micro_batch > 0 && t->global_batch % ((int64_t)t->micro_batch * p->dp) == 0) {
        int m = t->global_batch / (t->micro_batch * p->dp);
        if (p->pp_schedule == 2 && m % p->pp)
            FAIL("parallel.pp_schedule interleaved needs the micro-batches per step (train.global_batch / "
                 "(train.micro_batch x parallel.dp) = %d) to be a multiple of parallel.pp (%d)", m, p->pp);
    }
    if (p->pp_layers.n) {
        if (p->pp_layers.n != S)
            FAIL("parallel.pp_layers has %d entries; parallel.pp (%d) x parallel.pp_virtual (%d) = %d stages "
                 "need one layer count each", p->pp_layers.n, p->pp, v, S);
        int sum = 0;
        for (int i = 0; i < S; i++) {
            char *end;
            long n = strtol(p->pp_layers.items[i], &end, 10);
            if (*end || end == p->pp_layers.items[i] || n < 1 || n > L)
                FAIL("parallel.pp_layers[%d]: expected a layer count of at least 1 (a stage cannot be empty), got '%s'",
                     i, p->pp_layers.items[i]);
            p->pp_layer_counts[i] = (int)n;
            sum += (int)n;
        }
        if (sum != L) FAIL("parallel.pp_layers sums to %d layers; model.n_layers is %d", sum, L);
        p->n_pp_layers = S;
    }
    if (c->model.lb_global && v > 1)
        FAIL("model.lb_global with parallel.pp_virtual > 1 is not supported yet (its counts assume one forward "
             "order per rank)");
    return 0;
}

static int validate(RunConfig *c, int world, char *err, size_t errlen) {
    char msg[400];
    if (model_config_validate(&c->model, msg, sizeof msg)) FAIL("%s", msg);
    TrainSection *t = &c->train;
    if (c->data.train.n == 0 && !c->data.synthetic)
        FAIL("data.train: no training data given (a list of token files or globs, or data.synthetic: true)");
    if (c->data.train_weights.n && c->data.train_weights.n != c->data.train.n)
        FAIL("data.train_weights: %d weights for %d data.train entries", c->data.train_weights.n, c->data.train.n);
    for (int i = 0; i < c->data.train_weights.n; i++) {
        char *end;
        double w = strtod(c->data.train_weights.items[i], &end);
        if (*end || !(w > 0)) FAIL("data.train_weights[%d]: expected a positive number, got '%s'", i, c->data.train_weights.items[i]);
    }
    if (t->global_batch <= 0) FAIL("train.global_batch must be positive, got %d", t->global_batch);
    if (t->micro_batch <= 0) FAIL("train.micro_batch must be positive, got %d", t->micro_batch);
    if ((int64_t)t->micro_batch * c->model.seq_len > INT_MAX)
        FAIL("train.micro_batch (%d) x model.seq_len (%d) = %lld tokens per micro-batch is more than %d",
             t->micro_batch, c->model.seq_len, (long long)t->micro_batch * c->model.seq_len, INT_MAX);
    if (c->data.eos_id < 0) FAIL("data.eos_id must be >= 0, got %d", c->data.eos_id);
    if (t->steps < 0) FAIL("train.steps must be >= 0, got %lld", (long long)t->steps);
    if (t->tokens < 0) FAIL("train.tokens must be >= 0, got %lld", (long long)t->tokens);
    if (t->steps == 0 && t->tokens == 0) FAIL("train.steps or train.tokens must be set");
    int64_t tokens_per_step = (int64_t)t->global_batch * c->model.seq_len;
    if (t->steps == 0) t->steps = t->tokens / tokens_per_step + (t->tokens % tokens_per_step != 0);
    if (t->warmup_steps < 0) FAIL("train.warmup_steps must be >= 0");
    if (!(t->decay_fraction >= 0 && t->decay_fraction <= 1)) FAIL("train.decay_fraction must be in [0, 1], got %g", t->decay_fraction);
    if (!(t->min_lr_ratio >= 0 && t->min_lr_ratio <= 1)) FAIL("train.min_lr_ratio must be in [0, 1], got %g", t->min_lr_ratio);
    if (t->clip_grad < 0) FAIL("train.clip_grad must be >= 0 (0 turns clipping off)");
    if (t->skip_window < 0) FAIL("train.skip_window must be >= 0 (0 turns skip-step off)");
    if (t->skip_window > 0 && t->skip_window < 2) FAIL("train.skip_window must be at least 2 steps");
    if (!(t->skip_sigmas > 0)) FAIL("train.skip_sigmas must be positive");
    if (t->max_nonfinite_steps < 1) FAIL("train.max_nonfinite_steps must be at least 1, got %d", t->max_nonfinite_steps);
    if (t->eval_interval < 0) FAIL("train.eval_interval must be >= 0");
    if (t->eval_batches <= 0) FAIL("train.eval_batches must be positive");
    if (t->eval_interval > 0 && c->data.eval.n == 0) FAIL("train.eval_interval is set but data.eval lists no files");
    OptimConfig *o = &c->optim;
    if (!(o->lr > 0)) FAIL("optim.lr must be positive, got %g", o->lr);
    if (!(o->beta1 >= 0 && o->beta1 < 1)) FAIL("optim.beta1 must be in [0, 1), got %g", o->beta1);
    if (!(o->beta2 >= 0 && o->beta2 < 1)) FAIL("optim.beta2 must be in [0, 1), got %g", o->beta2);
    if (!(o->eps > 0)) FAIL("optim.eps must be positive, got %g", o->eps);
    if (o->weight_decay < 0) FAIL("optim.weight_decay must be >= 0, got %g", o->weight_decay);
    if (c->checkpoint.interval < 0) FAIL("checkpoint.interval must be >= 0");
    if (c->checkpoint.keep < 0) FAIL("checkpoint.keep must be >= 0 (0 keeps all)");
    if (!c->logging.run_dir[0]) FAIL("logging.run_dir must be set");
    if (c->logging.log_interval <= 0) FAIL("logging.log_interval must be positive");
    if (c->logging.gerrymander_window < 4) FAIL("logging.gerrymander_window must be at least 4 steps");
    if (!c->checkpoint.dir[0]) {
        if (strlen(c->logging.run_dir) + 13 > CFG_PATH_MAX) FAIL("logging.run_dir is too long");
        memcpy(c->checkpoint.dir, c->logging.run_dir, strlen(c->logging.run_dir));
        strcat(c->checkpoint.dir, "/checkpoints");
    }
    ParallelSection *p = &c->parallel;
    if (p->dp <= 0 || p->ep <= 0 || p->pp <= 0) FAIL("parallel.dp, parallel.ep and parallel.pp must be positive");
    if (pipeline_validate(c, err, errlen)) return -1;
    if (!(p->bucket_mb > 0)) FAIL("parallel.bucket_mb must be positive, got %g", p->bucket_mb);
    if (c->train.recompute_every < 0 || c->train.recompute_first < 0)
        FAIL("train.recompute_every (%d) and train.recompute_first (%d) must be >= 0 (0: every block, all blocks)",
             c->train.recompute_every, c->train.recompute_first);
    if (c->train.recompute == 3 && p->pp > 1 && p->pp_schedule == 3)
        FAIL("train.recompute: layers with parallel.pp_schedule: zb1 is not supported: the deferred weight grads "
             "need the activations a recomputed block does not keep; use 1f1b or interleaved, or another recompute");
    if (c->train.recompute_norms && p->pp > 1 && p->pp_schedule == 3)
        FAIL("train.recompute_norms with parallel.pp_schedule: zb1 is not supported: the deferred weight grads of "
             "wq, wk and wv read the attention norm's output after the backward; use 1f1b or interleaved");
    if (c->train.recompute_attention && p->pp > 1 && p->pp_schedule == 3)
        FAIL("train.recompute_attention with parallel.pp_schedule: zb1 is not supported: the deferred weight grad of "
             "wo reads the attention output after the backward; use 1f1b or interleaved");
    if ((c->train.recompute_every > 0 || c->train.recompute_first > 0) && c->train.recompute != 3)
        FAIL("train.recompute_every and train.recompute_first choose the blocks of train.recompute: layers, "
             "which is not set");
    if (t->precision == PRECISION_FP8) {
        if (c->fp8.recipe == FP8_RECIPE_MXFP8)
            FAIL("fp8.recipe: mxfp8 is not implemented for training: the MXFP8 GEMM is Blackwell's (compiled for "
                 "sm_100a, never run, no training path calls it; README, FP8); use fp8.recipe: block128");
        if (c->model.n_experts <= 0)
            FAIL("train.precision: fp8 with fp8.gemms: %s needs MoE layers (model.n_experts > 0)",
                 c->fp8.gemms == FP8_GEMMS_EXPERTS_DENSE ? "experts_dense" : "experts");
        if (p->pp > 1) FAIL("train.precision: fp8 with parallel.pp > 1 is not supported yet");
        if (c->optim_sharded && p->dp > 1 && c->device.type == 1)
            FAIL("train.precision: fp8 with optim.sharded on GPUs is not supported yet (the FP8 expert weights are "
                 "made from the whole FP32 main weights, which a sharded optimizer does not keep)");
    }
    if (!(p->ep_recv_factor >= 0) || p->ep_recv_factor > 1e6)
        FAIL("parallel.ep_recv_factor must be 0 (auto) or a positive number of times the rows a rank routes, got %g",
             p->ep_recv_factor);
    if (!(p->timeout_s > 0)) FAIL("parallel.timeout_s must be positive, got %g", p->timeout_s);
    if (p->dp % p->ep) FAIL("parallel.ep (%d) must divide parallel.dp (%d): dp = ep x ep_dp", p->ep, p->dp);
    if ((int64_t)p->dp * p->pp != world)
        FAIL("parallel.dp (%d) x parallel.pp (%d) = %lld must equal the number of ranks (%d)", p->dp, p->pp,
             (long long)p->dp * p->pp, world);
    if (c->model.n_experts > 0 && c->model.n_experts % p->ep)
        FAIL("parallel.ep (%d) must divide model.n_experts (%d)", p->ep, c->model.n_experts);
    int64_t per_step = (int64_t)t->micro_batch * p->dp;  // instances of one micro-batch on every rank
    if (t->global_batch % per_step) {
        int hint = micro_batch_hint(t->global_batch, p->dp, t->micro_batch);
        char also[96] = "";
        if (hint) snprintf(also, sizeof also, " or --train.micro_batch=%d", hint);
        FAIL("train.global_batch (%d) must be a multiple of train.micro_batch (%d) x parallel.dp (%d): "
             "e.g. --train.global_batch=%lld%s", t->global_batch, t->micro_batch, p->dp,
             (long long)((t->global_batch + per_step - 1) / per_step * per_step), also);
    }
    if (c->device.peak_tflops < 0) FAIL("device.peak_tflops must be >= 0");
    if (c->device.cuda.attention_ds_mib < 0)
        FAIL("device.cuda.attention_ds_mib must be >= 0 (0 turns the dS scratch off), got %d", c->device.cuda.attention_ds_mib);
    if (c->device.cuda.attention_group < 0)
        FAIL("device.cuda.attention_group must be >= 0 (0: auto), got %d", c->device.cuda.attention_group);
    return 0;
}

int run_config_ep_backend(const RunConfig *c) {
    int b = c->parallel.ep_backend;
    return b == 0 && c->train.precision == PRECISION_FP8 ? 1 : b; // 0 auto, 1 a2a (ep_backend_names)
}

int run_config_validate(RunConfig *c, int world, char *err, size_t errlen) {
    char msg[1024];
    if (!validate(c, world, msg, sizeof msg)) return 0;
    run_config_blame(c, msg, err, errlen);
    return -1;
}

// ---- writing ----------------------------------------------------------------------------------

static void yaml_quoted(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

void run_config_write_yaml(const RunConfig *c, FILE *f) {
    model_config_write_yaml(&c->model, f);
    char section[32] = "", sub[32] = "";
    for (int i = 0; i < NTABLE; i++) {
        const Key *k = &table[i];
        const char *dot = strchr(k->key, '.'), *dot2 = strchr(dot + 1, '.');
        if (strncmp(section, k->key, dot - k->key) || section[dot - k->key] != 0) {
            snprintf(section, sizeof section, "%.*s", (int)(dot - k->key), k->key);
            sub[0] = 0;
            fprintf(f, "%s:\n", section);
        }
        // a key of a mapping inside the section (device.cuda.*)
        const char *name = dot2 ? dot2 + 1 : dot + 1;
        if (dot2 && (strncmp(sub, dot + 1, dot2 - dot - 1) || sub[dot2 - dot - 1] != 0)) {
            snprintf(sub, sizeof sub, "%.*s", (int)(dot2 - dot - 1), dot + 1);
            fprintf(f, "  %s:\n", sub);
        }
        const char *p = (const char *)c + k->offset;
        fprintf(f, "%s%s: ", dot2 ? "    " : "  ", name);
        switch (k->type) {
        case T_INT: fprintf(f, "%d\n", *(const int *)p); break;
        case T_I64: fprintf(f, "%lld\n", (long long)*(const int64_t *)p); break;
        case T_U64: fprintf(f, "%llu\n", (unsigned long long)*(const uint64_t *)p); break;
        case T_DOUBLE: fprintf(f, "%.17g\n", *(const double *)p); break;
        case T_FLOAT: fprintf(f, "%.9g\n", *(const float *)p); break;
        case T_BOOL: fprintf(f, "%s\n", *(const int *)p ? "true" : "false"); break;
        case T_ENUM: fprintf(f, "%s\n", k->enums[*(const int *)p]); break;
        case T_STR: yaml_quoted(f, p); fputc('\n', f); break;
        case T_LIST: {
            const StrList *l = (const StrList *)p;
            fprintf(f, "[");
            for (int j = 0; j < l->n; j++) { if (j) fprintf(f, ", "); yaml_quoted(f, l->items[j]); }
            fprintf(f, "]\n");
            break;
        }
        case T_MODEL: break;
        }
    }
}
