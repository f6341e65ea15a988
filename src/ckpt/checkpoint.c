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

// Writes this rank's bytes: for prefix b and entry i, the elements of
// [own_begin, own_end) held in bufs[b][class] starting at element base[b][class].
// A checkpoint is never written from non-finite numbers: such a tensor is
// an error naming it.
static int write_own(const char *path, const StFile *st, const ParamTable *t, int nbufs,
                     float *const *const *bufs, const size_t (*base)[N_CLASSES], const size_t (*lim)[N_CLASSES],
                     const CkptLayout *l, char *err, size_t errlen) {
    int fd = open(path, O_WRONLY);
    if (fd < 0) { snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno)); return -1; }
    int idx = 0;
    for (int b = 0; b < nbufs; b++)
        for (int i = 0; i < t->n; i++, idx++) {
            const ParamEntry *e = &t->entries[i];
            int c = e->cls;
            size_t lo = e->offset, hi = e->offset + e->numel;
            if (l->own_begin[c] > lo) lo = l->own_begin[c];
            if (l->own_end[c] < hi) hi = l->own_end[c];
            if (base[b][c] > lo) lo = base[b][c];
            if (lim[b][c] < hi) hi = lim[b][c];
            if (hi <= lo) continue;
            uint64_t file_elem = param_global_offset(e) + (lo - e->offset);
            const float *src = bufs[b][c] + (lo - base[b][c]);
            if (!all_finite(src, hi - lo)) {
                errorf(err, errlen, "%s holds non-finite values (NaN or Inf)", st->tensors[idx].name);
                close(fd);
                return -1;
            }
            if (st_write_range(fd, path, st, idx, file_elem * 4, src, (hi - lo) * 4, err, errlen)) {
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
    rc = ckpt_tensor_lists(&sm, &so, cfg, &ps->table, err, errlen);
    if (rank0 && !rc) {
        rc = fs_fresh_dir(tmp, err, errlen);
        if (!rc) rc = ckpt_create_files(tmp, &sm, &so, err, errlen);
    }
    if (agree(l, rc)) goto fail;
    {
        // device buffers are written from host copies
        const Ops *ops = ps->ops;
        float *hp[N_CLASSES], *hm[N_CLASSES], *hv[N_CLASSES], *hbias = ps->router_bias;
        for (int c = 0; c < N_CLASSES; c++) {
            hp[c] = ps->params[c]; hm[c] = opt->m[c]; hv[c] = opt->v[c];
            if (ops->host_memory) continue;
            size_t n = ps->table.class_numel[c], no = opt->end[c] - opt->begin[c];
            hp[c] = mallocCheck(n * 4 + 4); hm[c] = mallocCheck(no * 4 + 4); hv[c] = mallocCheck(no * 4 + 4);
            ops->to_host(hp[c], ps->params[c], n * 4);
            ops->to_host(hm[c], opt->m[c], no * 4);
            ops->to_host(hv[c], opt->v[c], no * 4);
        }
        if (!ops->host_memory && n_moe) {
            hbias = mallocCheck((size_t)bshape[0] * bshape[1] * 4);
            ops->to_host(hbias, ps->router_bias, (size_t)bshape[0] * bshape[1] * 4);
        }
        float *const *pb[1] = {hp};
        size_t zero[1][N_CLASSES] = {{0}}, full[1][N_CLASSES];
        for (int c = 0; c < N_CLASSES; c++) full[0][c] = ps->table.class_numel[c];
        rc = write_own(mpath, &sm, &ps->table, 1, pb, zero, full, l, err, errlen);
        float *const *ob[2] = {hm, hv};
        size_t obase[2][N_CLASSES], olim[2][N_CLASSES];
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < N_CLASSES; c++) { obase[b][c] = opt->begin[c]; olim[b][c] = opt->end[c]; }
        if (!rc) rc = write_own(opath, &so, &ps->table, 2, ob, obase, olim, l, err, errlen);
        if (!rc && rank0 && n_moe) {
            int fd = open(opath, O_WRONLY);
            if (fd < 0) { snprintf(err, errlen, "cannot open %s: %s", opath, strerror(errno)); rc = -1; }
            else {
                if (!all_finite(hbias, (size_t)bshape[0] * bshape[1]))
                    rc = errorf(err, errlen, "router_bias holds non-finite values (NaN or Inf)");
                else
                    rc = st_write_range(fd, opath, &so, so.n - 1, 0, hbias, (uint64_t)bshape[0] * bshape[1] * 4, err, errlen);
                if ((fsync(fd) | close(fd)) && !rc) { snprintf(err, errlen, "fsync %s: %s", opath, strerror(errno)); rc = -1; }
            }
        }
        if (!ops->host_memory) {
            for (int c = 0; c < N_CLASSES; c++) { free(hp[c]); free(hm[c]); free(hv[c]); }
            if (n_moe) free(hbias);
        }
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

// Reads, for every table entry under prefix, the elements of [lo, hi) of
// its class buffer that this rank holds into dst[class] + (i - base[class]).
static int load_tensors(const char *path, const StFile *st, int fd, const ParamTable *t, const char *prefix,
                        float *const *dst, const size_t *base, const size_t *lim, char *err, size_t errlen) {
    char name[PARAM_NAME_MAX + 32];
    for (int i = 0; i < t->n; i++) {
        const ParamEntry *e = &t->entries[i];
        snprintf(name, sizeof name, "%s%s", prefix, e->name);
        int idx = st_expect(st, path, name, ST_F32, e->ndim, e->global_shape, err, errlen);
        if (idx < 0) return -1;
        int c = e->cls;
        size_t lo = e->offset > base[c] ? e->offset : base[c];
        size_t hi = e->offset + e->numel < lim[c] ? e->offset + e->numel : lim[c];
        if (hi <= lo) continue;
        uint64_t file_elem = param_global_offset(e) + (lo - e->offset);
        if (st_read_range(fd, path, st, idx, file_elem * 4, dst[c] + (lo - base[c]), (hi - lo) * 4, err, errlen))
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
    char path[4400];
    json_object *js = NULL;
    StFile sm, so;
    st_init(&sm);
    st_init(&so);
    int fdm = -1, fdo = -1, rc = -1;
    size_t dn = ps->table.class_numel[CLASS_DENSE], en = ps->table.class_numel[CLASS_EXPERT];
    int n_moe = model_moe_layers(cfg);
    // stage into fresh buffers so that a failure leaves the model untouched
    size_t od = opt->end[CLASS_DENSE] - opt->begin[CLASS_DENSE], oe = opt->end[CLASS_EXPERT] - opt->begin[CLASS_EXPERT];
    float *p[N_CLASSES] = {mallocCheck(dn * 4), mallocCheck(en * 4)};
    float *mm[N_CLASSES] = {mallocCheck(od * 4), mallocCheck(oe * 4)};
    float *vv[N_CLASSES] = {mallocCheck(od * 4), mallocCheck(oe * 4)};
    size_t zero[N_CLASSES] = {0, 0}, full[N_CLASSES] = {dn, en};
    float *bias = mallocCheck((size_t)n_moe * cfg->n_experts * 4 + 4);
    TrainState ns;
    memset(&ns, 0, sizeof ns);

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

    snprintf(path, sizeof path, "%s/" CKPT_MODEL_FILE, dir);
    if (st_open(path, &fdm, &sm, err, errlen)) goto fail;
    if (load_tensors(path, &sm, fdm, &ps->table, "", p, zero, full, err, errlen)) goto fail;
    snprintf(path, sizeof path, "%s/" CKPT_OPTIM_FILE, dir);
    if (st_open(path, &fdo, &so, err, errlen)) goto fail;
    if (load_tensors(path, &so, fdo, &ps->table, "exp_avg.", mm, opt->begin, opt->end, err, errlen)) goto fail;
    if (load_tensors(path, &so, fdo, &ps->table, "exp_avg_sq.", vv, opt->begin, opt->end, err, errlen)) goto fail;
    if (n_moe) {
        int64_t bshape[2] = {n_moe, cfg->n_experts};
        int idx = st_expect(&so, path, "router_bias", ST_F32, 2, bshape, err, errlen);
        if (idx < 0 || st_read_range(fdo, path, &so, idx, 0, bias, (uint64_t)bshape[0] * bshape[1] * 4, err, errlen))
            goto fail;
    }
    // commit
    for (int c = 0; c < N_CLASSES; c++) {
        ps->ops->to_device(ps->params[c], p[c], ps->table.class_numel[c] * 4);
        ps->ops->to_device(opt->m[c], mm[c], (opt->end[c] - opt->begin[c]) * 4);
        ps->ops->to_device(opt->v[c], vv[c], (opt->end[c] - opt->begin[c]) * 4);
    }
    if (n_moe) ps->ops->to_device(ps->router_bias, bias, (size_t)n_moe * cfg->n_experts * 4);
    param_store_sync_weights(ps);
    opt->t = adam_t;
    *s = ns;
    rc = 0;
fail:
    if (fdm >= 0) close(fdm);
    if (fdo >= 0) close(fdo);
    st_free(&sm);
    st_free(&so);
    if (js) json_object_put(js);
    for (int c = 0; c < N_CLASSES; c++) { free(p[c]); free(mm[c]); free(vv[c]); }
    free(bias);
    return rc;
}
