// moecore's side of tests/hf_compare.py: makes a random model checkpoint and
// computes its logits, so that the same tokens can be run through
// transformers after `moecore export-hf`.
//
// usage: tool_hf_logits init CKPT_PARENT [--seed=N] [--model.KEY=V ...]
//          writes CKPT_PARENT/step-00000000: matrices normal(0, model.init_std),
//          norm weights uniform in [0.5, 1.5] (so that a norm mapped to the
//          wrong tensor shows), zero optimizer state
//        tool_hf_logits logits CKPT_DIR TOKENS.i32 B T OUT.f32
//          loads the checkpoint, runs the forward pass on B x T int32 tokens
//          (little-endian, row-major) and writes the [B*T, padded_vocab] FP32 logits
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/checkpoint.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "util/check.h"

static int cmd_init(int argc, char **argv) {
    if (argc < 1) die("usage: tool_hf_logits init CKPT_PARENT [--seed=N] [--model.KEY=V ...]");
    ModelConfig cfg;
    model_config_defaults(&cfg);
    uint64_t seed = 1;
    char err[512];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        if (strncmp(a, "--", 2) || !eq) die("bad argument '%s'", a);
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)(eq - a - 2), a + 2);
        if (!strcmp(key, "seed")) seed = strtoull(eq + 1, NULL, 10);
        else if (model_config_set(&cfg, key, eq + 1, err, sizeof err)) die("%s", err);
    }
    Model m;
    if (model_init(&m, &cfg, &ops_cpu, err, sizeof err)) die("%s", err);
    model_init_weights(&m, seed);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < m.store.table.n; i++) {
        const ParamEntry *e = &m.store.table.entries[i];
        if (e->kind != PARAM_NORM) continue;
        float *p = param_store_main(&m.store, i);
        for (size_t j = 0; j < e->numel; j++) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            p[j] = (float)(0.5 + (s >> 11) * (1.0 / 9007199254740992.0));
        }
    }
    OptimConfig oc;
    optim_config_defaults(&oc);
    AdamW opt;
    adamw_init(&opt, &oc, &m.store);
    TrainState st;
    memset(&st, 0, sizeof st);
    st.seed = seed;
    CkptLayout layout;
    ckpt_layout_single(&layout, &m.store);
    if (ckpt_save(argv[0], &m.cfg, &m.store, &opt, &st, NULL, 0, &layout, err, sizeof err)) die("%s", err);
    printf("wrote %s/step-00000000: %zu parameters\n", argv[0], param_total(&m.store.table));
    return 0;
}

static int cmd_logits(int argc, char **argv) {
    if (argc != 5) die("usage: tool_hf_logits logits CKPT_DIR TOKENS.i32 B T OUT.f32");
    const char *dir = argv[0], *tok_path = argv[1], *out_path = argv[4];
    int B = atoi(argv[2]), T = atoi(argv[3]);
    if (B <= 0 || T <= 0) die("B and T must be positive");
    char path[4200], err[512];
    snprintf(path, sizeof path, "%s/train_state.json", dir);
    json_object *js = json_object_from_file(path), *mj;
    if (!js || !json_object_object_get_ex(js, "model", &mj)) die("%s: no model config", path);
    ModelConfig cfg;
    if (model_config_from_json(&cfg, json_object_to_json_string(mj), err, sizeof err)) die("%s: %s", path, err);
    json_object_put(js);
    Model m;
    if (model_init(&m, &cfg, &ops_cpu, err, sizeof err)) die("%s", err);
    OptimConfig oc;
    optim_config_defaults(&oc);
    AdamW opt;
    adamw_init(&opt, &oc, &m.store);
    TrainState st;
    if (ckpt_load(dir, &m.cfg, &m.store, &opt, &st, err, sizeof err)) die("%s", err);
    int N = B * T;
    int *tokens = mallocCheck(N * sizeof(int)), *targets = mallocCheck(N * sizeof(int));
    FILE *f = fopen(tok_path, "rb");
    if (!f || fread(tokens, sizeof(int), N, f) != (size_t)N) die("%s: cannot read %d int32 tokens", tok_path, N);
    fclose(f);
    for (int n = 0; n < N; n++) {
        if (tokens[n] < 0 || tokens[n] >= m.cfg.vocab_size) die("token %d at %d outside the vocabulary", tokens[n], n);
        targets[n] = -1;
    }
    model_alloc_acts(&m, B, T);
    model_begin_step(&m);
    model_forward(&m, tokens, targets, 0);
    f = fopen(out_path, "wb");
    size_t nl = (size_t)N * m.cfg.padded_vocab;
    if (!f || fwrite(m.logits, sizeof(float), nl, f) != nl || fclose(f)) die("cannot write %s", out_path);
    printf("wrote %s: [%d, %d] logits\n", out_path, N, m.cfg.padded_vocab);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "init")) return cmd_init(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "logits")) return cmd_logits(argc - 2, argv + 2);
    die("usage: tool_hf_logits init CKPT_PARENT [--seed=N] [--model.KEY=V ...]\n"
        "       tool_hf_logits logits CKPT_DIR TOKENS.i32 B T OUT.f32");
}
