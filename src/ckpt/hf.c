// Hugging Face OLMoE / FlexOlmo export and import (docs/hf.md): the
// tensor-name mapping and streaming copies between a moecore checkpoint and a
// transformers model directory (the config.json mapping is hf_config.c).
#include "ckpt/hf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "ckpt/hf_tokenizer.h"
#include "config/config.h"
#include "params/layout.h"
#include "util/check.h"
#include "util/fs.h"

#define PATH_LEN 4096

// ---- number formats -------------------------------------------------------------

uint16_t hf_f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1);   // round to nearest, ties to even; overflow carries to inf
    return (uint16_t)(u >> 16);
}

float hf_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

float hf_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) u = sign | 0x7f800000u | (man << 13);          // inf, NaN
    else if (exp) u = sign | ((exp + 112) << 23) | (man << 13);      // normal
    else if (!man) u = sign;                                         // zero
    else {                                                           // subnormal: renormalise
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float x;
    memcpy(&x, &u, 4);
    return x;
}

// ---- small file helpers --------------------------------------------------------------

static int exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

// 0 when path is absent or a directory of plain files only (safe to replace),
// -1 with a message otherwise.
static int replaceable(const char *path, char *err, size_t errlen) {
    struct stat st;
    if (lstat(path, &st)) return 0;
    if (!S_ISDIR(st.st_mode)) { snprintf(err, errlen, "%s exists and is not a directory; not replacing it", path); return -1; }
    DIR *d = opendir(path);
    if (!d) { snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno)); return -1; }
    struct dirent *e;
    char p[PATH_LEN + 256];
    int rc = 0;
    while (!rc && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        if (lstat(p, &st) || !S_ISREG(st.st_mode)) {
            snprintf(err, errlen, "%s holds %s, which is not a plain file; not replacing it", path, e->d_name);
            rc = -1;
        }
    }
    closedir(d);
    return rc;
}

// Makes a fresh path.tmp next to final (parents created, a stale one removed).
static int begin_dir(const char *final, char *tmp, size_t tmplen, char *err, size_t errlen) {
    snprintf(tmp, tmplen, "%s.tmp", final);
    if (fs_mkdirs(tmp, 0, err, errlen)) return -1;
    if (replaceable(tmp, err, errlen)) return -1;
    return fs_fresh_dir(tmp, err, errlen);
}

// Renames the completed tmp over final; an existing final (checked replaceable) is removed.
static int commit_dir(const char *tmp, const char *final, char *err, size_t errlen) {
    char old[PATH_LEN + 8], parent[PATH_LEN];
    fs_sync_dir(tmp);
    if (exists(final)) {
        snprintf(old, sizeof old, "%s.old", final);
        fs_remove_dir(old);
        if (rename(final, old)) { snprintf(err, errlen, "rename %s -> %s: %s", final, old, strerror(errno)); return -1; }
        if (rename(tmp, final)) {
            snprintf(err, errlen, "rename %s -> %s: %s", tmp, final, strerror(errno));
            rename(old, final);
            return -1;
        }
        fs_remove_dir(old);
    } else if (rename(tmp, final)) {
        snprintf(err, errlen, "rename %s -> %s: %s", tmp, final, strerror(errno));
        return -1;
    }
    snprintf(parent, sizeof parent, "%s", final);
    char *slash = strrchr(parent, '/');
    if (slash) { *slash = 0; fs_sync_dir(slash == parent ? "/" : parent); } else fs_sync_dir(".");
    return 0;
}

// Copies path without trailing slashes (so that path.tmp is a sibling).
static void clean_path(char *out, size_t n, const char *path) {
    snprintf(out, n, "%s", path);
    size_t len = strlen(out);
    while (len > 1 && out[len - 1] == '/') out[--len] = 0;
}

// ---- tensor names ---------------------------------------------------------------------------

enum { F_OLMOE = 1 << HF_OLMOE, F_FLEX = 1 << HF_FLEX_OLMO, F_ALL = F_OLMOE | F_FLEX };
// moecore "layers.L.<ours>" <-> HF "model.layers.L.<theirs>.weight"; experts
// carry %d for the expert index.
static const struct { const char *ours, *theirs; int formats; } layer_names[] = {
    {"attn_norm", "input_layernorm", F_OLMOE},
    {"attn.wq", "self_attn.q_proj", F_ALL},
    {"attn.wk", "self_attn.k_proj", F_ALL},
    {"attn.wv", "self_attn.v_proj", F_ALL},
    {"attn.wo", "self_attn.o_proj", F_ALL},
    {"attn.q_norm", "self_attn.q_norm", F_ALL},
    {"attn.k_norm", "self_attn.k_norm", F_ALL},
    {"attn_post_norm", "post_attention_layernorm", F_FLEX},
    {"ffn_norm", "post_attention_layernorm", F_OLMOE},
    {"moe.router", "mlp.gate", F_ALL},
    {"moe.experts.w_gate", "mlp.experts.%d.gate_proj", F_ALL},
    {"moe.experts.w_up", "mlp.experts.%d.up_proj", F_ALL},
    {"moe.experts.w_down", "mlp.experts.%d.down_proj", F_ALL},
    {"ffn_post_norm", "post_feedforward_layernorm", F_FLEX},
};

int hf_tensor_map(const ParamTable *t, HfFormat f, int hf_vocab, int tied,
                  HfTensor **out, int *n, char *err, size_t errlen) {
    int cap = 0, cnt = 0;
    HfTensor *m = NULL;
    for (int i = 0; i < t->n; i++) {
        const ParamEntry *e = &t->entries[i];
        const char *theirs = NULL, *fmt = NULL;
        int layer = -1, pos = 0;
        if (!strcmp(e->name, "embed")) theirs = "model.embed_tokens.weight";
        else if (!strcmp(e->name, "lm_head")) theirs = tied ? "model.embed_tokens.weight" : "lm_head.weight";
        else if (!strcmp(e->name, "final_norm")) theirs = "model.norm.weight";
        else if (sscanf(e->name, "layers.%d.%n", &layer, &pos) == 1 && pos > 0) {
            for (size_t k = 0; k < sizeof layer_names / sizeof layer_names[0]; k++)
                if ((layer_names[k].formats & (1 << f)) && !strcmp(e->name + pos, layer_names[k].ours))
                    fmt = layer_names[k].theirs;
        }
        if (!theirs && !fmt) {
            snprintf(err, errlen, "moecore tensor %s has no %s equivalent", e->name, hf_format_name(f));
            free(m);
            return -1;
        }
        int experts = e->ndim == 3 ? (int)e->shape[0] : 1;
        size_t per = e->numel / experts;
        for (int x = 0; x < experts; x++) {
            if (cnt == cap) m = reallocCheck(m, (cap = cap ? 2 * cap : 256) * sizeof *m);
            HfTensor *h = &m[cnt++];
            memset(h, 0, sizeof *h);
            if (theirs) snprintf(h->name, sizeof h->name, "%s", theirs);
            else {
                char mid[128];
                snprintf(mid, sizeof mid, fmt, x);
                snprintf(h->name, sizeof h->name, "model.layers.%d.%s.weight", layer, mid);
            }
            h->param = i;
            h->offset = (size_t)x * per;
            h->ndim = e->ndim == 3 ? 2 : e->ndim;
            for (int d = 0; d < h->ndim; d++) h->shape[d] = e->shape[d + (e->ndim == 3)];
            if (theirs && (!strcmp(e->name, "embed") || !strcmp(e->name, "lm_head"))) h->shape[0] = hf_vocab;
            h->numel = 1;
            for (int d = 0; d < h->ndim; d++) h->numel *= (size_t)h->shape[d];
        }
    }
    *out = m;
    *n = cnt;
    return 0;
}

// ---- export ----------------------------------------------------------------------------------

void hf_export_defaults(HfExportOptions *o) {
    memset(o, 0, sizeof *o);
    o->format = HF_AUTO;
    o->dtype = ST_F32;
    o->max_shard_bytes = HF_DEFAULT_SHARD_BYTES;
}

void hf_import_defaults(HfImportOptions *o) {
    memset(o, 0, sizeof *o);
    o->seed = 1;
}

// Reads a checkpoint's model config and step from its train_state.json.
static int read_ckpt_config(const char *dir, ModelConfig *c, long long *step, char *err, size_t errlen) {
    char path[PATH_LEN + 32];
    snprintf(path, sizeof path, "%s/" CKPT_STATE_FILE, dir);
    char *text = fs_read_text(path, 64u << 20, err, errlen);
    if (!text) return -1;
    json_object *o = hf_parse_json(text, path, err, errlen), *v;
    free(text);
    if (!o) return -1;
    int rc = -1;
    json_object *mj = ckpt_state_model(o, path, err, errlen);
    if (!mj) goto fail;
    *step = json_object_object_get_ex(o, "step", &v) ? json_object_get_int64(v) : 0;
    char e2[512];
    if (model_config_from_json(c, json_object_to_json_string(mj), e2, sizeof e2)) FAIL_GOTO("%s: model: %s", path, e2);
    rc = 0;
fail:
    json_object_put(o);
    return rc;
}

// A committed checkpoint directory: dir itself, or the newest step-N in it.
static int resolve_ckpt(const char *dir, char *out, size_t outlen, char *err, size_t errlen) {
    char p[PATH_LEN + 32];
    snprintf(p, sizeof p, "%s/" CKPT_STATE_FILE, dir);
    if (!exists(p)) {
        int found = ckpt_find_latest(dir, out, outlen, err, errlen);
        if (found < 0) return -1;
        if (found == 0) {
            snprintf(err, errlen, "%s: not a checkpoint (no train_state.json) and holds no committed step-N checkpoint", dir);
            return -1;
        }
        return 0;
    }
    snprintf(p, sizeof p, "%s/" CKPT_COMMITTED, dir);
    if (!exists(p)) {
        snprintf(err, errlen, "%s: no COMMITTED marker (a checkpoint that was not completely written)", dir);
        return -1;
    }
    snprintf(out, outlen, "%s", dir);
    return 0;
}

// Copies numel floats of tensor src_idx (from element src_off) into tensor
// dst_idx (from element dst_off), converting to dst's dtype, in chunks.
typedef struct { int fd; const char *path; const StFile *st; } StRef;

static int copy_elems(StRef src, int src_idx, size_t src_off, StRef dst, int dst_idx, size_t dst_off, size_t numel,
                      void *raw, float *f32, char *err, size_t errlen) {
    StDtype sd = src.st->tensors[src_idx].dtype, dd = dst.st->tensors[dst_idx].dtype;
    size_t ss = st_dtype_size(sd), ds = st_dtype_size(dd);
    for (size_t done = 0; done < numel; done += HF_CHUNK_ELEMS) {
        size_t k = numel - done < HF_CHUNK_ELEMS ? numel - done : HF_CHUNK_ELEMS;
        void *rbuf = sd == ST_F32 ? (void *)f32 : raw;
        if (st_read_range(src.fd, src.path, src.st, src_idx, (src_off + done) * ss, rbuf, k * ss, err, errlen)) return -1;
        const uint16_t *h = raw;
        if (sd == ST_BF16) for (size_t j = 0; j < k; j++) f32[j] = hf_bf16_to_f32(h[j]);
        else if (sd == ST_F16) for (size_t j = 0; j < k; j++) f32[j] = hf_f16_to_f32(h[j]);
        const void *wbuf = f32;
        if (dd == ST_BF16) {
            uint16_t *b = raw;
            for (size_t j = 0; j < k; j++) b[j] = hf_f32_to_bf16(f32[j]);
            wbuf = b;
        }
        if (st_write_range(dst.fd, dst.path, dst.st, dst_idx, (dst_off + done) * ds, wbuf, k * ds, err, errlen))
            return -1;
    }
    return 0;
}

static int close_synced(int fd, const char *path, char *err, size_t errlen) {
    if (fsync(fd)) { snprintf(err, errlen, "fsync %s: %s", path, strerror(errno)); close(fd); return -1; }
    if (close(fd)) { snprintf(err, errlen, "close %s: %s", path, strerror(errno)); return -1; }
    return 0;
}

// The tokenizer an export carries: --tokenizer, else data.tokenizer of the
// checkpoint's config.yaml (the run's resolved config; a relative path is
// taken from the current directory, as the trainer took it). *eos_id is that
// config's data.eos_id. 1 with *info filled, 0 for none, -1 with a message.
static int export_tokenizer(const char *ckpt, const HfExportOptions *o, const ModelConfig *c, char *path,
                            size_t pathlen, HfTokenizerInfo *info, int *eos_id, char *err, size_t errlen) {
    if (o->no_tokenizer) return 0;
    char cfg_path[PATH_LEN + 32], e2[1024];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.yaml", ckpt);
    RunConfig *rc = mallocCheck(sizeof *rc);
    run_config_defaults(rc);
    int r = -1;
    if (exists(cfg_path) && run_config_load_yaml(rc, cfg_path, e2, sizeof e2)) {
        snprintf(err, errlen, "tokenizer: %s (export with --no-tokenizer to leave the tokenizer out)", e2);
        goto done;
    }
    *eos_id = rc->data.eos_id;
    const char *from = o->tokenizer ? "--tokenizer" : "data.tokenizer of the run";
    snprintf(path, pathlen, "%s", o->tokenizer ? o->tokenizer : rc->data.tokenizer);
    if (!path[0]) { r = 0; goto done; }
    if (hf_tokenizer_read(path, *eos_id, info, e2, sizeof e2) ||
        hf_tokenizer_check_vocab(path, info, c->vocab_size, e2, sizeof e2)) {
        snprintf(err, errlen, "tokenizer (%s%s%s): %s; pass --tokenizer=PATH of the tokenizer the run used, or "
                 "--no-tokenizer", from, o->tokenizer ? "" : ", ", o->tokenizer ? "" : cfg_path, e2);
        goto done;
    }
    r = 1;
done:
    run_config_free(rc);
    free(rc);
    return r;
}

int hf_export(const char *ckpt_arg, const char *out_arg, const HfExportOptions *o, char *err, size_t errlen) {
    char ckpt[PATH_LEN], out[PATH_LEN], tmp[PATH_LEN + 8], path[PATH_LEN + 64], src_path[PATH_LEN + 32];
    ParamTable t = {0};
    HfTensor *map = NULL;
    int nmap = 0, fd_src = -1, fd = -1, tmp_made = 0, rc = -1;
    int *shard_of = NULL;
    StFile src, dst;
    st_init(&src);
    st_init(&dst);
    void *raw = mallocCheck(HF_CHUNK_ELEMS * 4);
    float *f32 = mallocCheck(HF_CHUNK_ELEMS * 4);
    json_object *index = NULL;
    char *cfg_text = NULL;
    ModelConfig c;
    long long step = 0;
    HfFormat f = o->format;

    if (o->dtype != ST_F32 && o->dtype != ST_BF16) FAIL_GOTO("export dtype must be F32 or BF16");
    clean_path(out, sizeof out, out_arg);
    if (resolve_ckpt(ckpt_arg, ckpt, sizeof ckpt, err, errlen)) goto fail;
    if (read_ckpt_config(ckpt, &c, &step, err, errlen)) goto fail;
    if (hf_check_config(&c, &f, err, errlen)) goto fail;
    if (param_table_for_config(&c, &t, err, errlen)) goto fail;
    if (hf_tensor_map(&t, f, c.padded_vocab, 0, &map, &nmap, err, errlen)) goto fail;
    snprintf(src_path, sizeof src_path, "%s/" CKPT_MODEL_FILE, ckpt);
    if (st_open(src_path, &fd_src, &src, err, errlen)) goto fail;
    for (int i = 0; i < t.n; i++) {
        const ParamEntry *e = &t.entries[i];
        if (st_expect(&src, src_path, e->name, ST_F32, e->ndim, e->shape, err, errlen) < 0) goto fail;
    }
    if (exists(out) && !o->force) FAIL_GOTO("%s exists (add --force to replace it)", out);
    snprintf(path, sizeof path, "%s/" CKPT_STATE_FILE, out);
    if (exists(path)) FAIL_GOTO("%s holds a moecore checkpoint; not replacing it with an export", out);
    if (replaceable(out, err, errlen)) goto fail;
    char tok_path[PATH_LEN];
    HfTokenizerInfo tok;
    int eos_id = -1;
    int has_tok = export_tokenizer(ckpt, o, &c, tok_path, sizeof tok_path, &tok, &eos_id, err, errlen);
    if (has_tok < 0) goto fail;

    // shards: greedy in map order, a new one when the next tensor would pass the limit
    size_t es = st_dtype_size(o->dtype);
    shard_of = mallocCheck(nmap * sizeof(int));
    int nshards = 1;
    uint64_t in_shard = 0, total = 0;
    for (int i = 0; i < nmap; i++) {
        uint64_t b = map[i].numel * es;
        if (in_shard > 0 && in_shard + b > o->max_shard_bytes) { nshards++; in_shard = 0; }
        shard_of[i] = nshards - 1;
        in_shard += b;
        total += b;
    }

    if (begin_dir(out, tmp, sizeof tmp, err, errlen)) goto fail;
    tmp_made = 1;
    json_object *wmap = json_object_new_object();
    index = json_object_new_object();
    json_object *meta = json_object_new_object();
    json_object_object_add(meta, "total_size", json_object_new_int64((int64_t)total));
    json_object_object_add(index, "metadata", meta);
    json_object_object_add(index, "weight_map", wmap);
    StRef sref = {fd_src, src_path, &src};
    for (int s = 0, first = 0; s < nshards; s++) {
        char name[64], spath[PATH_LEN + 96];
        if (nshards == 1) snprintf(name, sizeof name, "model.safetensors");
        else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, nshards);
        snprintf(spath, sizeof spath, "%s/%s", tmp, name);
        st_free(&dst);
        st_init(&dst);
        if (st_set_meta(&dst, "format", "pt", err, errlen)) goto fail;
        int last = first;
        while (last < nmap && shard_of[last] == s) {
            if (st_add(&dst, map[last].name, o->dtype, map[last].ndim, map[last].shape, err, errlen) < 0) goto fail;
            json_object_object_add(wmap, map[last].name, json_object_new_string(name));
            last++;
        }
        fd = open(spath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) FAIL_GOTO("cannot create %s: %s", spath, strerror(errno));
        if (st_write_header(fd, spath, &dst, err, errlen)) goto fail;
        StRef dref = {fd, spath, &dst};
        for (int i = first; i < last; i++) {
            int si = st_find(&src, t.entries[map[i].param].name);
            if (copy_elems(sref, si, map[i].offset, dref, i - first, 0, map[i].numel, raw, f32, err, errlen)) goto fail;
        }
        int cfd = fd;
        fd = -1;
        if (close_synced(cfd, spath, err, errlen)) goto fail;
        first = last;
    }
    if (nshards > 1) {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmp);
        char *js = strdup(json_object_to_json_string_ext(index, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED));
        int wrc = fs_write_text(path, js, err, errlen);
        free(js);
        if (wrc) goto fail;
    }
    cfg_text = hf_config_json(&c, f, o->dtype, has_tok && tok.eos_token[0] ? eos_id : -1);
    snprintf(path, sizeof path, "%s/config.json", tmp);
    if (fs_write_text(path, cfg_text, err, errlen)) goto fail;
    if (has_tok && hf_tokenizer_write(tok_path, &tok, c.seq_len, tmp, err, errlen)) goto fail;
    if (commit_dir(tmp, out, err, errlen)) goto fail;
    tmp_made = 0;
    if (!o->quiet)
        printf("export-hf: %s (step %lld) -> %s: %s, %s, %d tensor%s in %d shard%s, %.1f MB\n", ckpt, step, out,
               hf_format_name(f), o->dtype == ST_BF16 ? "bf16" : "fp32", nmap, nmap == 1 ? "" : "s", nshards,
               nshards == 1 ? "" : "s", total / 1e6);
    if (!o->quiet && has_tok) {
        printf("export-hf: + %s as tokenizer.json (%d tokens", tok_path, tok.vocab_size);
        if (tok.eos_token[0]) printf(", eos_token %s = id %d)", tok.eos_token, eos_id);
        else printf("; data.eos_id %d is not one of its special tokens, so no eos_token is named)", eos_id);
        printf(", tokenizer_config.json, special_tokens_map.json\n");
    }
    rc = 0;
fail:
    if (fd >= 0) close(fd);
    if (tmp_made) fs_remove_dir(tmp);
    if (fd_src >= 0) close(fd_src);
    st_free(&src);
    st_free(&dst);
    if (index) json_object_put(index);
    free(cfg_text);
    free(shard_of);
    free(map);
    param_table_free(&t);
    free(raw);
    free(f32);
    return rc;
}

// ---- import ----------------------------------------------------------------------------------

// The safetensors files of an HF model: one model.safetensors, or the shards
// an index names, with each tensor's file looked up through the weight_map.
typedef struct {
    int n;
    char **names, **paths;
    int *fds;
    StFile *st;
    char **used;                 // per file, per tensor: taken by the mapping
    json_object *weight_map;     // NULL for a single file
    char index_path[PATH_LEN + 64];
} HfSource;

static void source_close(HfSource *s) {
    for (int i = 0; i < s->n; i++) {
        if (s->fds[i] >= 0) close(s->fds[i]);
        st_free(&s->st[i]);
        free(s->names[i]);
        free(s->paths[i]);
        free(s->used[i]);
    }
    free(s->names); free(s->paths); free(s->fds); free(s->st); free(s->used);
    if (s->weight_map) json_object_put(s->weight_map);
    memset(s, 0, sizeof *s);
}

static int source_add(HfSource *s, const char *dir, const char *name, char *err, size_t errlen) {
    int i = s->n++;
    s->names = reallocCheck(s->names, s->n * sizeof(char *));
    s->paths = reallocCheck(s->paths, s->n * sizeof(char *));
    s->fds = reallocCheck(s->fds, s->n * sizeof(int));
    s->st = reallocCheck(s->st, s->n * sizeof(StFile));
    s->used = reallocCheck(s->used, s->n * sizeof(char *));
    s->names[i] = strdup(name);
    s->paths[i] = mallocCheck(strlen(dir) + strlen(name) + 2);
    sprintf(s->paths[i], "%s/%s", dir, name);
    s->fds[i] = -1;
    s->used[i] = NULL;
    if (st_open(s->paths[i], &s->fds[i], &s->st[i], err, errlen)) return -1;
    s->used[i] = mallocCheck(s->st[i].n + 1);
    return 0;
}

static int source_open(HfSource *s, const char *dir, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    char single[PATH_LEN + 64];
    snprintf(s->index_path, sizeof s->index_path, "%s/model.safetensors.index.json", dir);
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    if (!exists(s->index_path)) {
        if (!exists(single)) {
            snprintf(err, errlen, "%s: no model.safetensors or model.safetensors.index.json "
                     "(only safetensors are read: save with safe_serialization=True)", dir);
            return -1;
        }
        return source_add(s, dir, "model.safetensors", err, errlen);
    }
    char *text = fs_read_text(s->index_path, 256u << 20, err, errlen);
    if (!text) return -1;
    json_object *o = hf_parse_json(text, s->index_path, err, errlen), *wm;
    free(text);
    if (!o) return -1;
    int rc = -1;
    if (!json_object_object_get_ex(o, "weight_map", &wm) || !json_object_is_type(wm, json_type_object))
        FAIL_GOTO("%s: no weight_map object", s->index_path);
    if (json_object_object_length(wm) == 0) FAIL_GOTO("%s: weight_map is empty", s->index_path);
    json_object_object_foreach(wm, key, val) {
        if (!json_object_is_type(val, json_type_string))
            FAIL_GOTO("%s: weight_map[%s]: expected a file name, got %s", s->index_path, key, json_object_to_json_string(val));
        const char *file = json_object_get_string(val);
        if (!*file || strchr(file, '/') || !strcmp(file, ".") || !strcmp(file, ".."))
            FAIL_GOTO("%s: weight_map[%s] = \"%s\": expected a file name in the same directory", s->index_path, key, file);
        int known = 0;
        for (int i = 0; i < s->n && !known; i++) known = !strcmp(s->names[i], file);
        if (!known && source_add(s, dir, file, err, errlen)) goto fail;
    }
    s->weight_map = json_object_get(wm);
    rc = 0;
fail:
    json_object_put(o);
    return rc;
}

// Finds tensor name: *file and its index there, or -1 with a message.
static int source_find(HfSource *s, const char *name, int *file, char *err, size_t errlen) {
    if (!s->weight_map) {
        *file = 0;
        int i = st_find(&s->st[0], name);
        if (i < 0) snprintf(err, errlen, "%s: missing tensor %s", s->paths[0], name);
        return i;
    }
    json_object *v;
    if (!json_object_object_get_ex(s->weight_map, name, &v)) {
        snprintf(err, errlen, "%s: missing tensor %s (not in the weight_map)", s->index_path, name);
        return -1;
    }
    const char *f = json_object_get_string(v);
    for (int k = 0; k < s->n; k++)
        if (!strcmp(s->names[k], f)) {
            *file = k;
            int i = st_find(&s->st[k], name);
            if (i < 0) snprintf(err, errlen, "%s: the weight_map puts %s in %s, which has no such tensor", s->index_path, name, f);
            return i;
        }
    return -1;
}

static const char *shape_text(char *buf, size_t n, int ndim, const int64_t *shape) {
    int k = snprintf(buf, n, "[");
    for (int d = 0; d < ndim && k > 0 && (size_t)k < n; d++)
        k += snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k > 0 && (size_t)k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

static int is_step_dir(const char *path) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    long long v;
    char tail;
    return sscanf(b, "step-%lld%c", &v, &tail) == 1 && v >= 0;
}

int hf_import(const char *hf_dir, const char *ckpt_arg, const HfImportOptions *o, ModelConfig *cfg_out,
              char *err, size_t errlen) {
    char ckpt[PATH_LEN], tmp[PATH_LEN + 8], path[PATH_LEN + 64];
    ParamTable t = {0};
    HfTensor *map = NULL;
    HfSource src;
    memset(&src, 0, sizeof src);
    StFile dst, opt;
    st_init(&dst);
    st_init(&opt);
    int nmap = 0, fd = -1, tmp_made = 0, rc = -1, hf_vocab = 0, tied = 0;
    int *file_of = NULL, *idx_of = NULL;   // per map entry: source file and tensor
    void *raw = mallocCheck(HF_CHUNK_ELEMS * 4);
    float *f32 = mallocCheck(HF_CHUNK_ELEMS * 4);
    char *text = NULL;
    ModelConfig c;
    HfFormat f;

    clean_path(ckpt, sizeof ckpt, ckpt_arg);
    if (!is_step_dir(ckpt))
        FAIL_GOTO("%s: a checkpoint directory is named step-NNNNNNNN (train --resume looks for those); "
             "use e.g. %s/step-00000000", ckpt, ckpt);
    if (exists(ckpt) && !o->force) FAIL_GOTO("%s exists (add --force to replace it)", ckpt);
    snprintf(path, sizeof path, "%s/config.json", ckpt);
    if (exists(path)) FAIL_GOTO("%s holds a Hugging Face model (config.json); not replacing it with a checkpoint", ckpt);
    if (replaceable(ckpt, err, errlen)) goto fail;
    snprintf(path, sizeof path, "%s/config.json", hf_dir);
    if (!(text = fs_read_text(path, 64u << 20, err, errlen))) goto fail;
    if (hf_config_parse(text, path, &c, &f, &hf_vocab, &tied, err, errlen)) goto fail;
    if (param_table_for_config(&c, &t, err, errlen)) goto fail;
    if (hf_tensor_map(&t, f, hf_vocab, tied, &map, &nmap, err, errlen)) goto fail;
    if (source_open(&src, hf_dir, err, errlen)) goto fail;

    // every tensor present with a readable dtype and its shape, nothing left over
    file_of = mallocCheck(nmap * sizeof(int));
    idx_of = mallocCheck(nmap * sizeof(int));
    for (int i = 0; i < nmap; i++) {
        int k = 0, j = source_find(&src, map[i].name, &k, err, errlen);
        if (j < 0) goto fail;
        const StTensor *st = &src.st[k].tensors[j];
        char have[96], want[96];
        if (st->dtype != ST_F32 && st->dtype != ST_BF16 && st->dtype != ST_F16) {
            snprintf(err, errlen, "%s: tensor %s has dtype %s; import reads F32, BF16 and F16", src.paths[k],
                     map[i].name, st_dtype_name(st->dtype));
            goto fail;
        }
        int same = st->ndim == map[i].ndim;
        for (int d = 0; same && d < st->ndim; d++) same = st->shape[d] == map[i].shape[d];
        if (!same) {
            snprintf(err, errlen, "%s: tensor %s has shape %s, expected %s from config.json", src.paths[k], map[i].name,
                     shape_text(have, sizeof have, st->ndim, st->shape), shape_text(want, sizeof want, map[i].ndim, map[i].shape));
            goto fail;
        }
        src.used[k][j] = 1;
        file_of[i] = k;
        idx_of[i] = j;
    }
    for (int k = 0; k < src.n; k++)
        for (int j = 0; j < src.st[k].n; j++) {
            const char *nm = src.st[k].tensors[j].name;
            size_t l = strlen(nm);
            if (src.used[k][j] || (l >= 20 && !strcmp(nm + l - 20, "rotary_emb.inv_freq"))) continue;
            snprintf(err, errlen, "%s: unexpected tensor %s (not part of a %s model with this config.json)",
                     src.paths[k], nm, hf_format_name(f));
            goto fail;
        }

    if (begin_dir(ckpt, tmp, sizeof tmp, err, errlen)) goto fail;
    tmp_made = 1;
    // the optimizer moments and the router bias stay zero, as a fresh run starts
    if (ckpt_tensor_lists(&dst, &opt, &c, &t, err, errlen) || ckpt_create_files(tmp, &dst, &opt, err, errlen))
        goto fail;
    snprintf(path, sizeof path, "%s/" CKPT_MODEL_FILE, tmp);
    fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) FAIL_GOTO("cannot open %s: %s", path, strerror(errno));
    StRef dref = {fd, path, &dst};
    for (int i = 0; i < nmap; i++) {
        int k = file_of[i];
        StRef sref = {src.fds[k], src.paths[k], &src.st[k]};
        if (copy_elems(sref, idx_of[i], 0, dref, map[i].param, map[i].offset, map[i].numel, raw, f32, err, errlen))
            goto fail;
    }
    int cfd = fd;
    fd = -1;
    if (close_synced(cfd, path, err, errlen)) goto fail;

    char *yaml = NULL;
    size_t ylen = 0;
    FILE *mf = open_memstream(&yaml, &ylen);
    fprintf(mf, "# written by moecore import-hf from %s: the model section a training config resuming\n"
                "# from this checkpoint must have (lb_coef, z_coef, lb_global, aux_free_rate, routing,\n"
                "# seq_len and init_std may differ)\n", hf_dir);
    model_config_write_yaml(&c, mf);
    fclose(mf);
    TrainState st0;
    memset(&st0, 0, sizeof st0);
    st0.seed = o->seed;
    int wrc = ckpt_write_state(tmp, &c, &st0, 0, yaml, err, errlen);
    free(yaml);
    if (wrc) goto fail;
    if (commit_dir(tmp, ckpt, err, errlen)) goto fail;
    tmp_made = 0;
    if (cfg_out) *cfg_out = c;
    if (!o->quiet)
        printf("import-hf: %s (%s, %d tensor%s in %d file%s) -> %s: step 0, %zu parameters\n", hf_dir,
               hf_format_name(f), nmap, nmap == 1 ? "" : "s", src.n, src.n == 1 ? "" : "s", ckpt, param_total(&t));
    rc = 0;
fail:
    if (fd >= 0) close(fd);
    if (tmp_made) fs_remove_dir(tmp);
    source_close(&src);
    st_free(&dst);
    st_free(&opt);
    free(text);
    free(file_of);
    free(idx_of);
    free(map);
    param_table_free(&t);
    free(raw);
    free(f32);
    return rc;
}
