// moecore export-hf / import-hf: argument parsing around src/ckpt/hf.c.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ckpt/hf.h"

static const char export_usage[] =
    "usage: moecore export-hf CKPT_DIR OUT_DIR [--dtype=fp32|bf16] [--max-shard-size=SIZE]\n"
    "                         [--format=auto|olmoe|flex_olmo] [--tokenizer=PATH | --no-tokenizer] [--force]\n"
    "  CKPT_DIR            a checkpoint (step-N/) or a checkpoint directory (its newest committed step)\n"
    "  OUT_DIR             the transformers model directory to write (config.json + safetensors)\n"
    "  --dtype             tensor type of the safetensors (default fp32; bf16 rounds to nearest even)\n"
    "  --max-shard-size    bytes per safetensors shard, e.g. 5GB, 500MB, 2GiB (default 5GB);\n"
    "                      above it the model is split and model.safetensors.index.json written\n"
    "  --format            auto (default): olmoe for model.norm = pre, flex_olmo for post\n"
    "  --tokenizer         tokenizer.json to put beside the model (with tokenizer_config.json and\n"
    "                      special_tokens_map.json, for AutoTokenizer); its vocabulary must be\n"
    "                      model.vocab_size. Default: the run's data.tokenizer (the checkpoint's config.yaml)\n"
    "  --no-tokenizer      export the model only, even when the run named a tokenizer\n"
    "  --force             replace an existing OUT_DIR\n";

static const char import_usage[] =
    "usage: moecore import-hf HF_DIR CKPT_DIR [--seed=N] [--force]\n"
    "  HF_DIR              an olmoe or flex_olmo model directory: config.json and model.safetensors\n"
    "                      or model.safetensors.index.json with its shards\n"
    "  CKPT_DIR            the checkpoint to write, named step-NNNNNNNN (e.g. runs/ft/checkpoints/step-00000000);\n"
    "                      `moecore train CONFIG --resume --checkpoint.dir=PARENT` continues from it\n"
    "  --seed              train.seed recorded in the checkpoint (default 1)\n"
    "  --force             replace an existing CKPT_DIR\n";

// "5GB", "500MB", "2GiB", "123": bytes; 0 on a malformed size.
static unsigned long long parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v > 0)) return 0;
    static const struct { const char *suffix; double mult; } units[] = {
        {"", 1}, {"B", 1}, {"K", 1e3}, {"KB", 1e3}, {"M", 1e6}, {"MB", 1e6}, {"G", 1e9}, {"GB", 1e9},
        {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcasecmp(end, units[i].suffix)) {
            double b = v * units[i].mult;
            return b >= 1 && b < 1.8e19 ? (unsigned long long)b : 0;
        }
    return 0;
}

int cmd_export_hf(int argc, char **argv) {
    HfExportOptions o;
    hf_export_defaults(&o);
    const char *pos[2] = {NULL, NULL};
    int npos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(export_usage, stdout); return 0; }
        if (!strncmp(a, "--dtype=", 8)) {
            if (!strcmp(a + 8, "fp32")) o.dtype = ST_F32;
            else if (!strcmp(a + 8, "bf16")) o.dtype = ST_BF16;
            else { fprintf(stderr, "moecore: error: --dtype: '%s' is not one of fp32 bf16\n", a + 8); return 2; }
        } else if (!strncmp(a, "--max-shard-size=", 17)) {
            if (!(o.max_shard_bytes = parse_size(a + 17))) {
                fprintf(stderr, "moecore: error: --max-shard-size: expected bytes such as 5GB, 500MB or 1000000, got '%s'\n", a + 17);
                return 2;
            }
        } else if (!strncmp(a, "--format=", 9)) {
            if (!strcmp(a + 9, "auto")) o.format = HF_AUTO;
            else if (!strcmp(a + 9, "olmoe")) o.format = HF_OLMOE;
            else if (!strcmp(a + 9, "flex_olmo")) o.format = HF_FLEX_OLMO;
            else { fprintf(stderr, "moecore: error: --format: '%s' is not one of auto olmoe flex_olmo\n", a + 9); return 2; }
        } else if (!strncmp(a, "--tokenizer=", 12) && a[12]) {
            o.tokenizer = a + 12;
        } else if (!strcmp(a, "--no-tokenizer")) {
            o.no_tokenizer = 1;
        } else if (!strcmp(a, "--force")) {
            o.force = 1;
        } else if (!strncmp(a, "--", 2) || npos == 2) {
            fprintf(stderr, "moecore: error: export-hf: unexpected argument '%s'\n%s", a, export_usage);
            return 2;
        } else {
            pos[npos++] = a;
        }
    }
    if (npos != 2) { fprintf(stderr, "%s", export_usage); return 2; }
    if (o.tokenizer && o.no_tokenizer) {
        fprintf(stderr, "moecore: error: export-hf: --tokenizer and --no-tokenizer exclude each other\n");
        return 2;
    }
    char err[1024];
    if (hf_export(pos[0], pos[1], &o, err, sizeof err)) {
        fprintf(stderr, "moecore: error: export-hf: %s\n", err);
        return 1;
    }
    return 0;
}

int cmd_import_hf(int argc, char **argv) {
    HfImportOptions o;
    hf_import_defaults(&o);
    const char *pos[2] = {NULL, NULL};
    int npos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(import_usage, stdout); return 0; }
        if (!strncmp(a, "--seed=", 7)) {
            char *end;
            o.seed = strtoull(a + 7, &end, 10);
            if (end == a + 7 || *end || a[7] == '-') {
                fprintf(stderr, "moecore: error: --seed: expected an unsigned integer, got '%s'\n", a + 7);
                return 2;
            }
        } else if (!strcmp(a, "--force")) {
            o.force = 1;
        } else if (!strncmp(a, "--", 2) || npos == 2) {
            fprintf(stderr, "moecore: error: import-hf: unexpected argument '%s'\n%s", a, import_usage);
            return 2;
        } else {
            pos[npos++] = a;
        }
    }
    if (npos != 2) { fprintf(stderr, "%s", import_usage); return 2; }
    char err[1024];
    ModelConfig c;
    if (hf_import(pos[0], pos[1], &o, &c, err, sizeof err)) {
        fprintf(stderr, "moecore: error: import-hf: %s\n", err);
        return 1;
    }
    printf("\nThe checkpoint records this model config (also in its config.yaml). A training config that\n"
           "resumes from it needs the same model keys; lb_coef, z_coef, lb_global, aux_free_rate, routing,\n"
           "seq_len and init_std may differ:\n\n");
    model_config_write_yaml(&c, stdout);
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", pos[1]);
    size_t len = strlen(parent);
    while (len > 1 && parent[len - 1] == '/') parent[--len] = 0;
    char *slash = strrchr(parent, '/');
    if (!slash) snprintf(parent, sizeof parent, ".");
    else if (slash == parent) parent[1] = 0;
    else *slash = 0;
    printf("\nthen: moecore train CONFIG.yaml --checkpoint.dir=%s --resume\n", parent);
    return 0;
}
