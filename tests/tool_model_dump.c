// Writes one forward / backward / N AdamW steps of the model on a random
// batch to a safetensors file, for tests/torch_ref.py to recompute in
// PyTorch. Format: see the header of tests/torch_ref.py.
//
// usage: tool_model_dump OUT.safetensors [--model.KEY=V ...] [--batch=B] [--seq=T]
//        [--steps=S] [--seed=N] [--optim.KEY=V ...] [--tokens=FILE [--dtype=uint16|uint32]]
//        [--doc_mask=EOS]
//   --tokens: the batch is the first B instances of a token file, read by the
//             training data loader (targets: the next token, the last masked)
//   --doc_mask: intra-document attention masking, documents ending with EOS
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/safetensors.h"
#include "data/data.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "util/check.h"

static uint64_t rng_state = 42;
static double urand(void) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (rng_state >> 11) * (1.0 / 9007199254740992.0);
}

typedef struct {
    StFile st;
    const void **datas;
    int cap;
} Dump;

static void dump_add(Dump *d, const char *name, StDtype dt, int ndim, const int64_t *shape, const void *data) {
    char err[256];
    if (st_add(&d->st, name, dt, ndim, shape, err, sizeof err) < 0) die("%s", err);
    if (d->st.n > d->cap) {
        d->cap = d->cap ? 2 * d->cap : 256;
        d->datas = reallocCheck(d->datas, d->cap * sizeof(void *));
    }
    d->datas[d->st.n - 1] = data;
}

// A copy of every parameter (or grad) under prefix.NAME.
static void dump_tensors(Dump *d, const Model *m, const char *prefix, float *const *bufs) {
    for (int i = 0; i < m->store.table.n; i++) {
        const ParamEntry *e = &m->store.table.entries[i];
        char name[160];
        snprintf(name, sizeof name, "%s.%s", prefix, e->name);
        float *copy = mallocCheck(e->numel * sizeof(float));
        memcpy(copy, bufs[e->cls] + e->offset, e->numel * sizeof(float));
        dump_add(d, name, ST_F32, e->ndim, e->shape, copy);
    }
}

static float *copy_floats(const float *src, size_t n) {
    float *p = mallocCheck(n * sizeof(float) + 1);
    memcpy(p, src, n * sizeof(float));
    return p;
}

int main(int argc, char **argv) {
    if (argc < 2) die("usage: tool_model_dump OUT.safetensors [--model.KEY=V ...] [--batch=B] [--seq=T] [--steps=S] [--seed=N]");
    const char *out = argv[1];
    ModelConfig cfg;
    model_config_defaults(&cfg);
    OptimConfig oc;
    optim_config_defaults(&oc);
    oc.lr = 1e-3f;
    int B = 2, T = 16, steps = 10, doc_eos = -1;
    uint64_t seed = 1;
    const char *token_file = NULL;
    TokenDtype dtype = TOKENS_U16;
    char err[256];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        if (strncmp(a, "--", 2) || !eq) die("bad argument '%s'", a);
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)(eq - a - 2), a + 2);
        const char *v = eq + 1;
        if (!strncmp(key, "model.", 6)) {
            if (model_config_set(&cfg, key, v, err, sizeof err)) die("%s", err);
        } else if (!strcmp(key, "batch")) B = atoi(v);
        else if (!strcmp(key, "seq")) T = atoi(v);
        else if (!strcmp(key, "steps")) steps = atoi(v);
        else if (!strcmp(key, "seed")) seed = strtoull(v, NULL, 10);
        else if (!strcmp(key, "tokens")) token_file = v;
        else if (!strcmp(key, "dtype")) { if (tokens_dtype_parse(v, &dtype)) die("bad --dtype '%s'", v); }
        else if (!strcmp(key, "doc_mask")) doc_eos = atoi(v);
        else if (!strcmp(key, "optim.lr")) oc.lr = strtof(v, NULL);
        else if (!strcmp(key, "optim.weight_decay")) oc.weight_decay = strtof(v, NULL);
        else die("unknown argument '%s'", key);
    }
    Model m;
    if (model_init(&m, &cfg, &ops_cpu, err, sizeof err)) die("%s", err);
    model_init_weights(&m, seed);
    rng_state = 0x1234567 + seed;
    // norms away from 1 so that their gradients are exercised
    for (int i = 0; i < m.store.table.n; i++) {
        const ParamEntry *e = &m.store.table.entries[i];
        if (e->kind != PARAM_NORM) continue;
        float *p = param_store_main(&m.store, i);
        for (size_t j = 0; j < e->numel; j++) p[j] = (float)(0.8 + 0.4 * urand());
    }
    if (doc_eos >= 0) { m.doc_mask = 1; m.doc_eos = doc_eos; }
    model_alloc_acts(&m, B, T);
    int N = B * T;
    int *tokens = mallocCheck(N * sizeof(int)), *targets = mallocCheck(N * sizeof(int));
    if (token_file) {
        DataSource src = {NULL, &token_file, 1, 0};
        DataLoader *dl = data_open(&src, 1, dtype, T, m.cfg.vocab_size, 0, 0, err, sizeof err);
        if (!dl || data_read(dl, 0, B, tokens, targets, err, sizeof err)) die("%s", err);
        data_close(dl);
    } else {
        for (int n = 0; n < N; n++) tokens[n] = (int)(urand() * m.cfg.vocab_size);
        for (int n = 0; n < N; n++) {
            int t = n % T;
            targets[n] = t == T - 1 || urand() < 0.1 ? -1 : tokens[n + 1];
        }
    }

    Dump d = {0};
    st_init(&d.st);
    char *cj = model_config_to_json(&m.cfg);
    char oj[512];
    snprintf(oj, sizeof oj,
             "{\"lr\": %.9g, \"beta1\": %.9g, \"beta2\": %.9g, \"eps\": %.9g, \"weight_decay\": %.9g, "
             "\"decay_norms\": %s, \"decay_embeddings\": %s, \"steps\": %d}",
             oc.lr, oc.beta1, oc.beta2, oc.eps, oc.weight_decay, oc.decay_norms ? "true" : "false",
             oc.decay_embeddings ? "true" : "false", steps);
    if (st_set_meta(&d.st, "config", cj, err, sizeof err) || st_set_meta(&d.st, "optim", oj, err, sizeof err))
        die("%s", err);
    char dj[64];
    snprintf(dj, sizeof dj, "{\"eos_id\": %d}", doc_eos);
    if (doc_eos >= 0 && st_set_meta(&d.st, "doc_mask", dj, err, sizeof err)) die("%s", err);
    int64_t bt[2] = {B, T};
    dump_add(&d, "tokens", ST_I32, 2, bt, tokens);
    dump_add(&d, "targets", ST_I32, 2, bt, targets);
    dump_tensors(&d, &m, "param", m.store.params);

    AdamW opt;
    adamw_init(&opt, &oc, &m.store);
    float *step_loss = mallocCheck(steps * sizeof(float) + 1);
    for (int s = 0; s < steps; s++) {
        model_zero_grads(&m);
        model_begin_step(&m);
        step_loss[s] = model_forward(&m, tokens, targets, seed);
        if (s == 0) {
            int64_t ls[2] = {N, m.cfg.padded_vocab}, one[1] = {1}, nm[1] = {m.n_moe};
            dump_add(&d, "logits", ST_F32, 2, ls, copy_floats(m.logits, (size_t)N * m.cfg.padded_vocab));
            dump_add(&d, "loss_ce", ST_F32, 1, one, copy_floats(&m.loss_ce, 1));
            dump_add(&d, "loss_total", ST_F32, 1, one, copy_floats(&m.loss_total, 1));
            if (m.n_moe) {
                dump_add(&d, "lb", ST_F32, 1, nm, copy_floats(m.lb, m.n_moe));
                dump_add(&d, "z", ST_F32, 1, nm, copy_floats(m.z, m.n_moe));
            }
        }
        model_backward(&m, 1.0f / m.n_valid, 1.0f);
        if (s == 0) dump_tensors(&d, &m, "grad", m.store.grads);
        adamw_step(&opt, &m.store, oc.lr, 1.0f);
        model_end_step(&m);
    }
    int64_t sh[1] = {steps};
    dump_add(&d, "step_loss", ST_F32, 1, sh, step_loss);
    dump_tensors(&d, &m, "final", m.store.params);
    if (st_save(out, &d.st, d.datas, err, sizeof err)) die("%s", err);
    printf("wrote %s: %d tensors, loss %.6f -> %.6f over %d steps\n", out, d.st.n, step_loss[0],
           step_loss[steps - 1], steps);
    return 0;
}
