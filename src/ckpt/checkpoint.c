// Checkpoint directories: atomic save, latest-committed lookup, strict load.
#include "ckpt/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/safetensors.h"
#include "params/layout.h"
#include "util/check.h"
#include "util/fs.h"


// Model-config keys that may change between a checkpoint and a resumed run:
// training-time options, not the architecture.
static const char *const mutable_keys[] = {"lb_coef", "z_coef", "lb_global", "aux_free_rate",
                                           "routing", "seq_len", "init_std",
                                           "capacity_factor", NULL};

#define CKPT_FORMAT "moecore-checkpoint-1"

void ckpt_layout_single(CkptLayout *l, const ParamStore *ps) {
    l->world = comm_world();
    for (int c = 0; c < N_CLASSES; c++) {
        l->own_begin[c] = 0;
        l->own_end[c] = ps->table.class_numel[c];
    }
}

// One file's tensor list: for each prefix, every table entry under its
// global name and shape; then an optional extra [r, c] tensor.
static int build_layout(StFile *st, const ParamTable *t, int nbufs, const char *const *prefixes,
                        const char *extra_name, const int64_t *extra_shape, char *err, size_t errlen) {
    char name[PARAM_NAME_MAX + 32];
    for (int b = 0; b < nbufs; b++)
        for (int i = 0; i < t->n; i++) {
            const ParamEntry *e = &t->entries[i];
            snprintf(name, sizeof name, "%s%s", prefixes[b], e->name);
            if (st_add(st, name, ST_F32, e->ndim, e->global_shape, err, errlen) < 0) return -1;
        }
    if (extra_name && st_add(st, extra_name, ST_F32, 2, extra_shape, err, errlen) < 0) return -1;
    return st_finalize(st, err, errlen);
}

// Whether n floats are all finite (their exponent bits not all ones).
static int all_finite(const float *x, size_t n) {
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, x + i, 4);
        bad |= (~bits & 0x7f800000u) == 0;
    }
    return !bad;
}

// Tensors move between backend memory and the files through one host buffer
// of at most chunk_bytes (page-locked on CUDA), a chunk at a time: a rank
// never holds a host copy of its model.
static size_t chunk_bytes = CKPT_CHUNK_BYTES;

void ckpt_set_chunk_bytes(size_t bytes) {
    chunk_bytes = bytes ? (bytes < 4 ? 4 : bytes / 4 * 4) : CKPT_CHUNK_BYTES;
}

typedef struct {
    const Ops *ops;
    float *buf;
    size_t floats;  // its capacity
} Stage;

// A staging buffer for ranges of at most max_floats elements.
static void stage_open(Stage *g, const Ops *ops, size_t max_floats) {
    g->ops = ops;
    g->floats = chunk_bytes / 4 < max_floats ? chunk_bytes / 4 : max_floats;
    if (g->floats == 0) g->floats = 1;
    g->buf = ops->alloc_host(g->floats * 4);
}

static void stage_close(Stage *g) {
    if (g->buf) g->ops->free_host(g->buf);
    g->buf = NULL;
}

// Writes n floats of backend memory src at element file_elem of tensor idx,
// chunk by chunk. A checkpoint is never written from non-finite numbers:
// such a tensor is an error naming it (the caller discards the directory).
static int write_range(int fd, const char *path, const StFile *st, int idx, uint64_t file_elem, const float *src,
                       size_t n, Stage *g, char *err, size_t errlen) {
    for (size_t done = 0; done < n; done += g->floats) {
        size_t k = n - done < g->floats ? n - done : g->floats;
        g->ops->to_host(g->buf, src + done, k * 4);
        if (!all_finite(g->buf, k)) FAIL("%s holds non-finite values (NaN or Inf)", st->tensors[idx].name);
        if (st_write_range(fd, path, st, idx, (file_elem + done) * 4, g->buf, k * 4, err, errlen)) return -1;
    }
    return 0;
}

// Writes this rank's bytes: for prefix b and entry i, the elements of
// [own_begin, own_end) held in bufs[b][class] (backend memory) starting at
// element base[b][class]. Every owned element must be held there.
// The file lists every tensor of the whole model (n_global per prefix): an
// entry's place in it is its global_index (a pipeline stage's table holds some).
static int write_own(const char *path, const StFile *st, const ParamTable *t, int n_global, int nbufs,
                     float *const *const *bufs, const size_t (*base)[N_CLASSES], const size_t (*lim)[N_CLASSES],
                     const CkptLayout *l, Stage *g, char *err, size_t errlen) {
    for (int b = 0; b < nbufs; b++)
        for (int c = 0; c < N_CLASSES; c++)
            if (l->own_begin[c] < l->own_end[c] && (l->own_begin[c] < base[b][c] || l->own_end[c] > lim[b][c]))
                FAIL("%s: this rank owns elements %zu..%zu of the %s buffer but holds %zu..%zu of them", path,
                     l->own_begin[c], l->own_end[c], c == CLASS_DENSE ? "dense" : "expert", base[b][c], lim[b][c]);
    int fd = open(path, O_WRONLY);
    if (fd < 0) { snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno)); return -1; }
    for (int b = 0; b < nbufs; b++)
        for (int i = 0; i < t->n; i++) {
            const ParamEntry *e = &t->entries[i];
            int idx = b * n_global + e->global_index;
            int c = e->cls;
            size_t lo = e->offset, hi = e->offset + e->numel;
            if (l->own_begin[c] > lo) lo = l->own_begin[c];
            if (l->own_end[c] < hi) hi = l->own_end[c];
            if (hi <= lo) continue;
            uint64_t file_elem = param_global_offset(e) + (lo - e->offset);
            if (write_range(fd, path, st, idx, file_elem, bufs[b][c] + (lo - base[b][c]), hi - lo, g, err, errlen)) {
                close(fd);
                return -1;
            }
        }
    if (fsync(fd) || close(fd)) { snprintf(err, errlen, "fsync/close %s: %s", path, strerror(errno)); return -1; }
    return 0;
}

int ckpt_tensor_lists(StFile *model, StFile *optim, const ModelConfig *cfg, const ParamTable *t, char *err,
                      size_t errlen) {
    const char *mpre[1] = {""}, *opre[2] = {"exp_avg.", "exp_avg_sq."};
    int n_moe = model_moe_layers(cfg);
    int64_t bshape[2] = {n_moe, cfg->n_experts};
    if (build_layout(model, t, 1, mpre, NULL, NULL, err, errlen)) return -1;
    return build_layout(optim, t, 2, opre, n_moe ? "router_bias" : NULL, bshape, err, errlen);
}

// Creates the file and writes the header (sizing the file).
static int create_file(const char *path, StFile *st, char *err, size_t errlen) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) FAIL("cannot create %s: %s", path, strerror(errno));
    if (st_write_header(fd, path, st, err, errlen)) { close(fd); return -1; }
    if (fsync(fd)) { errorf(err, errlen, "fsync %s: %s", path, strerror(errno)); close(fd); return -1; }
    if (close(fd)) FAIL("close %s: %s", path, strerror(errno));
    return 0;
}

int ckpt_create_files(const char *dir, StFile *model, StFile *optim, char *err, size_t errlen) {
    char path[4400];
    snprintf(path, sizeof path, "%s/" CKPT_MODEL_FILE, dir);
    if (create_file(path, model, err, errlen)) return -1;
    snprintf(path, sizeof path, "%s/" CKPT_OPTIM_FILE, dir);
    return create_file(path, optim, err, errlen);
}

static char *state_json(const ModelConfig *cfg, const TrainState *s, int optimizer_step) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "format", json_object_new_string(CKPT_FORMAT));
    json_object_object_add(o, "step", json_object_new_int64(s->step));
    json_object_object_add(o, "tokens_seen", json_object_new_int64(s->tokens_seen));
    json_object_object_add(o, "data_position", json_object_new_int64(s->data_position));
    json_object_object_add(o, "skipped_steps", json_object_new_int64(s->skipped_steps));
    json_object_object_add(o, "optimizer_step", json_object_new_int(optimizer_step));
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)s->seed);
    json_object_object_add(o, "seed", json_object_new_string(seed));
    json_object *hl = json_object_new_array(), *hg = json_object_new_array();
    for (int i = 0; i < s->hist_n; i++) {
        // %.17g text round-trips doubles exactly
        char b[40];
        snprintf(b, sizeof b, "%.17g", s->hist_loss[i]);
        json_object_array_add(hl, json_object_new_string(b));
        snprintf(b, sizeof b, "%.17g", s->hist_gnorm[i]);
        json_object_array_add(hg, json_object_new_string(b));
    }
    json_object_object_add(o, "skip_hist_loss", hl);
    json_object_object_add(o, "skip_hist_gnorm", hg);
    char *mc = model_config_to_json(cfg);
    json_object_object_add(o, "model", json_tokener_parse(mc));
    free(mc);
    char *out = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY));
    json_object_put(o);
    return out;
}

int ckpt_write_state(const char *dir, const ModelConfig *cfg, const TrainState *s, int optimizer_step,
                     const char *config_yaml, char *err, size_t errlen) {
    char path[4400];
    char *js = state_json(cfg, s, optimizer_step);
    snprintf(path, sizeof path, "%s/" CKPT_STATE_FILE, dir);
    int rc = fs_write_text(path, js, err, errlen);
    free(js);
    if (!rc && config_yaml) {
        snprintf(path, sizeof path, "%s/config.yaml", dir);
        rc = fs_write_text(path, config_yaml, err, errlen);
    }
    if (!rc) {
        snprintf(path, sizeof path, "%s/" CKPT_COMMITTED, dir);
        rc = fs_write_text(path, "ok\n", err, errlen);
    }
    return rc;
}

json_object *ckpt_state_model(json_object *state, const char *path, char *err, size_t errlen) {
    json_object *v;
    if (!json_object_object_get_ex(state, "format", &v) || !json_object_is_type(v, json_type_string) ||
        strcmp(json_object_get_string(v), CKPT_FORMAT)) {
        errorf(err, errlen, "%s: not a moecore checkpoint (format)", path);
        return NULL;
    }
    if (!json_object_object_get_ex(state, "model", &v) || !json_object_is_type(v, json_type_object)) {
        errorf(err, errlen, "%s: no model config", path);
        return NULL;
    }
    return v;
}

static int step_of(const char *name, int64_t *step) {
    long long v;
    char tail;
    if (sscanf(name, "step-%lld%c", &v, &tail) != 1) return 0;
    *step = v;
    return 1;
}

static int is_committed(const char *dir, const char *name) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s/" CKPT_COMMITTED, dir, name);
    return access(p, F_OK) == 0;
}

// Removes the checkpoint directory dir/name: COMMITTED first, so that a
// half-deleted directory is never taken for a checkpoint. 0 on success.
static int remove_checkpoint(const char *dir, const char *name) {
    char p[4096], c[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    snprintf(c, sizeof c, "%s/" CKPT_COMMITTED, p);
    if (unlink(c) && errno != ENOENT) return -1;
    return fs_remove_dir(p);
}

// Deletes all but the newest keep committed checkpoints, never the one of
// step saved (the one just written, the last from finite weights).
static void prune(const char *dir, int keep, int64_t saved) {
    DIR *d = opendir(dir);
    if (!d) return;
    int64_t steps[4096];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096) {
        int64_t s;
        if (step_of(e->d_name, &s) && is_committed(dir, e->d_name)) steps[n++] = s;
    }
    closedir(d);
    for (int i = 0; i < n; i++) {
        int newer = 0;
        for (int j = 0; j < n; j++) newer += steps[j] > steps[i];
        if (newer >= keep && steps[i] != saved) {
            char name[64];
            snprintf(name, sizeof name, "step-%08lld", (long long)steps[i]);
            remove_checkpoint(dir, name);
        }
    }
}

int ckpt_remove_all(const char *dir, int *removed, char *err, size_t errlen) {
    *removed = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        FAIL("cannot read checkpoint directory %s: %s", dir, strerror(errno));
    }
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        long long v;
        char tail = 0, rest[8] = "";
        // step-N, and step-N.tmp of an interrupted save
        int k = sscanf(e->d_name, "step-%lld%c%7s", &v, &tail, rest);
        if (!(k == 1 || (k == 3 && tail == '.' && !strcmp(rest, "tmp")))) continue;
        if (remove_checkpoint(dir, e->d_name)) {
            rc = errorf(err, errlen, "cannot remove %s/%s: %s", dir, e->d_name, strerror(errno));
            break;
        }
        ++*removed;
    }
    closedir(d);
    if (!rc) fs_sync_dir(dir);
    return rc;
}

// Every rank agrees on rc: the worst of all.
static int agree(const CkptLayout *l, int rc) {
    int32_t v = rc ? 1 : 0;
    comm_allreduce(l->world, &v, 1, COMM_I32);
    return v ? -1 : 0;
}

int ckpt_save(const char *dir, const ModelConfig *cfg, const ParamStore *ps, const AdamW *opt,
              const TrainState *s, const char *config_yaml, int keep, const CkptLayout *l, char *err,
              size_t errlen) {
    char final[4096], tmp[4200], path[4400], mpath[4400], opath[4400];
    int rank0 = comm_rank(l->world) == 0, rc = 0;
    StFile sm, so;
    st_init(&sm);
    st_init(&so);
    snprintf(final, sizeof final, "%s/step-%08lld", dir, (long long)s->step);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    snprintf(mpath, sizeof mpath, "%s/" CKPT_MODEL_FILE, tmp);
    snprintf(opath, sizeof opath, "%s/" CKPT_OPTIM_FILE, tmp);
    snprintf(err, errlen, "another rank failed to save the checkpoint");
    int32_t exists = 0;
    if (rank0) {
        rc = fs_mkdirs(dir, 1, err, errlen);
        snprintf(path, sizeof path, "%s/" CKPT_COMMITTED, final);
        exists = access(path, F_OK) == 0;
    }
    if (agree(l, rc)) return -1;
    comm_broadcast(l->world, &exists, 1, COMM_I32, 0);
    if (exists) return errorf(err, errlen, "%s is already committed (a checkpoint is never overwritten)", final);

    int n_moe = model_moe_layers(cfg);
    int64_t bshape[2] = {n_moe, cfg->n_experts};
    // the files' tensor lists are the whole model's, whatever part of it this rank holds
    ParamTable whole;
    memset(&whole, 0, sizeof whole);
    rc = param_table_for_config(cfg, &whole, err, errlen);
    if (!rc) rc = ckpt_tensor_lists(&sm, &so, cfg, &whole, err, errlen);
    int n_global = whole.n;
    param_table_free(&whole);
    if (rank0 && !rc) {
        rc = fs_fresh_dir(tmp, err, errlen);
        if (!rc) rc = ckpt_create_files(tmp, &sm, &so, err, errlen);
    }
    if (agree(l, rc)) goto fail;
    {
        // backend memory -> file through one staging buffer, never a host
        // copy of the model
        Stage g;
        size_t most = (size_t)bshape[0] * bshape[1];
        for (int c = 0; c < N_CLASSES; c++)
            if (ps->table.class_numel[c] > most) most = ps->table.class_numel[c];
        stage_open(&g, ps->ops, most);
        float *const *pb[1] = {ps->params};
        size_t pbase[1][N_CLASSES], plim[1][N_CLASSES];
        for (int c = 0; c < N_CLASSES; c++) { pbase[0][c] = ps->main_begin[c]; plim[0][c] = ps->main_end[c]; }
        rc = write_own(mpath, &sm, &ps->table, n_global, 1, pb, pbase, plim, l, &g, err, errlen);
        float *const *ob[2] = {opt->m, opt->v};
        size_t obase[2][N_CLASSES], olim[2][N_CLASSES];
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < N_CLASSES; c++) { obase[b][c] = opt->begin[c]; olim[b][c] = opt->end[c]; }
        if (!rc) rc = write_own(opath, &so, &ps->table, n_global, 2, ob, obase, olim, l, &g, err, errlen);
        if (!rc && rank0 && n_moe) {
            int fd = open(opath, O_WRONLY);
            if (fd < 0) { snprintf(err, errlen, "cannot open %s: %s", opath, strerror(errno)); rc = -1; }
            else {
                rc = write_range(fd, opath, &so, so.n - 1, 0, ps->router_bias, (size_t)bshape[0] * bshape[1], &g, err, errlen);
                if ((fsync(fd) | close(fd)) && !rc) { snprintf(err, errlen, "fsync %s: %s", opath, strerror(errno)); rc = -1; }
            }
        }
        stage_close(&g);
    }
    if (agree(l, rc)) goto fail;
    if (rank0) {
        rc = ckpt_write_state(tmp, cfg, s, opt->t, config_yaml, err, errlen);
        if (!rc) {
            fs_sync_dir(tmp);
            fs_remove_dir(final); // an uncommitted leftover of the same step
            if (rename(tmp, final)) { snprintf(err, errlen, "rename %s -> %s: %s", tmp, final, strerror(errno)); rc = -1; }
            else fs_sync_dir(dir);
        }
        if (!rc && keep > 0) prune(dir, keep, s->step);
    }
    if (agree(l, rc)) goto fail;
    st_free(&sm);
    st_free(&so);
    return 0;
fail:
    if (rank0) fs_remove_dir(tmp);
    st_free(&sm);
    st_free(&so);
    return -1;
}

int ckpt_find_latest(const char *dir, char *path, size_t pathlen, char *err, size_t errlen) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        snprintf(err, errlen, "cannot read checkpoint directory %s: %s", dir, strerror(errno));
        return -1;
    }
    int64_t best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s;
        if (step_of(e->d_name, &s) && s > best && is_committed(dir, e->d_name)) best = s;
    }
    closedir(d);
    if (best < 0) return 0;
    snprintf(path, pathlen, "%s/step-%08lld", dir, (long long)best);
    return 1;
}

// Checks that every table entry is in st under prefix with its global shape
// (FP32); idx[i] gets entry i's tensor index.
static int expect_tensors(const char *path, const StFile *st, const ParamTable *t, const char *prefix, int *idx,
                          char *err, size_t errlen) {
    char name[PARAM_NAME_MAX + 32];
    for (int i = 0; i < t->n; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, t->entries[i].name);
        if ((idx[i] = st_expect(st, path, name, ST_F32, t->entries[i].ndim, t->entries[i].global_shape, err, errlen)) < 0)
            return -1;
    }
    return 0;
}

// Where load_range puts what it reads: into the store (main and compute
// weights of class cls from element at), or into backend memory dst.
typedef struct {
    ParamStore *ps;
    int cls;
    size_t at;
    float *dst;
} LoadDest;

// Reads n floats from element file_elem of tensor idx, chunk by chunk.
static int load_range(int fd, const char *path, const StFile *st, int idx, uint64_t file_elem, size_t n,
                      LoadDest d, Stage *g, char *err, size_t errlen) {
    for (size_t done = 0; done < n; done += g->floats) {
        size_t k = n - done < g->floats ? n - done : g->floats;
        if (st_read_range(fd, path, st, idx, (file_elem + done) * 4, g->buf, k * 4, err, errlen)) return -1;
        if (d.ps) param_store_write(d.ps, d.cls, d.at + done, g->buf, k);
        else g->ops->to_device(d.dst + done, g->buf, k * 4);
    }
    return 0;
}

// Reads, for every table entry, the elements of [lo, hi) of its class buffer
// that this rank holds: into the store's weights (dst NULL) or into
// dst[class] + (i - lo[class]).
static int load_tensors(const char *path, const StFile *st, int fd, const int *idx, ParamStore *ps,
                        float *const *dst, const size_t *lim_lo, const size_t *lim_hi, Stage *g, char *err,
                        size_t errlen) {
    const ParamTable *t = &ps->table;
    for (int i = 0; i < t->n; i++) {
        const ParamEntry *e = &t->entries[i];
        int c = e->cls;
        size_t lo = e->offset > lim_lo[c] ? e->offset : lim_lo[c];
        size_t hi = e->offset + e->numel < lim_hi[c] ? e->offset + e->numel : lim_hi[c];
        if (hi <= lo) continue;
        LoadDest d = {dst ? NULL : ps, c, lo, dst ? dst[c] + (lo - lim_lo[c]) : NULL};
        if (load_range(fd, path, st, idx[i], param_global_offset(e) + (lo - e->offset), hi - lo, d, g, err, errlen))
            return -1;
    }
    return 0;
}

static int check_model_config(const char *path, json_object *saved, const ModelConfig *cur, char *err,
                              size_t errlen) {
    char *cj = model_config_to_json(cur);
    json_object *now = json_tokener_parse(cj);
    free(cj);
    int rc = 0;
    json_object_object_foreach(now, key, val) {
        int skip = 0;
        for (int i = 0; mutable_keys[i]; i++) skip |= !strcmp(key, mutable_keys[i]);
        if (skip) continue;
        json_object *sv = NULL;
        if (!json_object_object_get_ex(saved, key, &sv)) {
            snprintf(err, errlen, "%s: checkpoint has no model.%s", path, key);
            rc = -1;
            break;
        }
        const char *a = json_object_to_json_string(sv), *b = json_object_to_json_string(val);
        if (strcmp(a, b)) {
            snprintf(err, errlen, "%s: checkpoint was written with model.%s = %s, this config has %s",
                     path, key, a, b);
            rc = -1;
            break;
        }
    }
    json_object_put(now);
    return rc;
}

int ckpt_load(const char *dir, const ModelConfig *cfg, ParamStore *ps, AdamW *opt, TrainState *s, char *err,
              size_t errlen) {
    char path[4400], mpath[4400], opath[4400];
    json_object *js = NULL;
    StFile sm, so;
    st_init(&sm);
    st_init(&so);
    int fdm = -1, fdo = -1, rc = -1, bias_idx = -1;
    int n_moe = model_moe_layers(cfg);
    int64_t bshape[2] = {n_moe, cfg->n_experts};
    int nt = ps->table.n;
    int *im = mallocCheck((size_t)nt * sizeof(int) + 4), *ia = mallocCheck((size_t)nt * sizeof(int) + 4),
        *iv = mallocCheck((size_t)nt * sizeof(int) + 4);
    Stage g = {0};
    TrainState ns;
    memset(&ns, 0, sizeof ns);

    // 1. everything that can be wrong with the checkpoint is found before
    // the model is touched: state, headers (st_open checks that the tensors
    // tile the file), names, dtypes and shapes
    snprintf(path, sizeof path, "%s/" CKPT_STATE_FILE, dir);
    js = json_object_from_file(path);
    if (!js || !json_object_is_type(js, json_type_object)) FAIL_GOTO("%s: missing or not a JSON object", path);
    json_object *v = ckpt_state_model(js, path, err, errlen);
    if (!v || check_model_config(path, v, cfg, err, errlen)) goto fail;
#define GET(key, type) (json_object_object_get_ex(js, key, &v) && json_object_is_type(v, type))
    if (!GET("step", json_type_int)) FAIL_GOTO("%s: missing step", path);
    ns.step = json_object_get_int64(v);
    if (!GET("tokens_seen", json_type_int)) FAIL_GOTO("%s: missing tokens_seen", path);
    ns.tokens_seen = json_object_get_int64(v);
    if (!GET("data_position", json_type_int)) FAIL_GOTO("%s: missing data_position", path);
    ns.data_position = json_object_get_int64(v);
    if (!GET("skipped_steps", json_type_int)) FAIL_GOTO("%s: missing skipped_steps", path);
    ns.skipped_steps = json_object_get_int64(v);
    if (!GET("optimizer_step", json_type_int)) FAIL_GOTO("%s: missing optimizer_step", path);
    int adam_t = json_object_get_int(v);
    if (!GET("seed", json_type_string)) FAIL_GOTO("%s: missing seed", path);
    ns.seed = strtoull(json_object_get_string(v), NULL, 10);
    json_object *hg;
    if (!GET("skip_hist_loss", json_type_array) ||
        !json_object_object_get_ex(js, "skip_hist_gnorm", &hg) || !json_object_is_type(hg, json_type_array) ||
        json_object_array_length(v) != json_object_array_length(hg) || json_object_array_length(v) > SKIP_WINDOW_MAX)
        FAIL_GOTO("%s: bad skip-step history", path);
    ns.hist_n = (int)json_object_array_length(v);
    for (int i = 0; i < ns.hist_n; i++) {
        ns.hist_loss[i] = strtod(json_object_get_string(json_object_array_get_idx(v, i)), NULL);
        ns.hist_gnorm[i] = strtod(json_object_get_string(json_object_array_get_idx(hg, i)), NULL);
    }
    if (ns.step < 0 || ns.data_position < 0 || adam_t < 0) FAIL_GOTO("%s: negative counters", path);

    snprintf(mpath, sizeof mpath, "%s/" CKPT_MODEL_FILE, dir);
    if (st_open(mpath, &fdm, &sm, err, errlen) || expect_tensors(mpath, &sm, &ps->table, "", im, err, errlen)) goto fail;
    snprintf(opath, sizeof opath, "%s/" CKPT_OPTIM_FILE, dir);
    if (st_open(opath, &fdo, &so, err, errlen) || expect_tensors(opath, &so, &ps->table, "exp_avg.", ia, err, errlen) ||
        expect_tensors(opath, &so, &ps->table, "exp_avg_sq.", iv, err, errlen))
        goto fail;
    if (n_moe && (bias_idx = st_expect(&so, opath, "router_bias", ST_F32, 2, bshape, err, errlen)) < 0) goto fail;

    // 2. file -> backend memory through one staging buffer (no host copy of
    // the model). Only a read error of the system (EIO) can fail from here
    // on, and it leaves the model partly loaded: the caller must not use it
    // (the trainer ends).
    {
        size_t most = (size_t)bshape[0] * bshape[1], zero[N_CLASSES] = {0, 0};
        for (int c = 0; c < N_CLASSES; c++)
            if (ps->table.class_numel[c] > most) most = ps->table.class_numel[c];
        stage_open(&g, ps->ops, most);
        // the weights of everything held (compute weights of the whole
        // buffer, main weights where held)
        if (load_tensors(mpath, &sm, fdm, im, ps, NULL, zero, ps->table.class_numel, &g, err, errlen)) goto fail;
        if (load_tensors(opath, &so, fdo, ia, ps, opt->m, opt->begin, opt->end, &g, err, errlen)) goto fail;
        if (load_tensors(opath, &so, fdo, iv, ps, opt->v, opt->begin, opt->end, &g, err, errlen)) goto fail;
        LoadDest d = {NULL, 0, 0, ps->router_bias};
        if (n_moe && load_range(fdo, opath, &so, bias_idx, 0, (size_t)bshape[0] * bshape[1], d, &g, err, errlen))
            goto fail;
    }
    opt->t = adam_t;
    *s = ns;
    rc = 0;
fail:
    stage_close(&g);
    if (fdm >= 0) close(fdm);
    if (fdo >= 0) close(fdo);
    st_free(&sm);
    st_free(&so);
    if (js) json_object_put(js);
    free(im); free(ia); free(iv);
    return rc;
}
