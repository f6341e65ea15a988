// Checkpoints through a small staging buffer, and the distributed
// optimizer's parameter store where the compute weights are a separate copy
// (the GPU layout, DESIGN.md §4), both on the CPU:
//
//  1. ckpt_save / ckpt_load move tensors in chunks of at most
//     ckpt_set_chunk_bytes: with chunks of 3 floats, 2 floats and 1 float
//     every tensor crosses chunk boundaries, and the files are byte for byte
//     those of one chunk per tensor; each tensor's bytes in the file are the
//     ones in memory (read back with pread at the header's offsets, not
//     through the loader); a load restores weights, moments and router bias
//     exactly; ranks that own ranges cut mid-tensor write exactly their
//     bytes (the files of three "ranks", ORed, are the one-rank file).
//  2. With compute weights that are not the main weights (an emulated BF16
//     backend: the CPU's ops with a 2-byte act type, cast by
//     round-to-nearest-even), three ranks' stores keep FP32 main weights
//     and moments for their shard only; a sharded AdamW step followed by
//     the all-gather of the compute-weight bytes (what ddp_gather_params
//     does) gives every rank the compute weights of the unsharded store,
//     bit for bit, and each rank the main weights of its shard; loading a
//     checkpoint fills a rank's shard of main weights and moments and all of
//     its compute weights; each rank saves its shard from a sharded store
//     and the ORed files are the unsharded store's; a layout that owns more
//     than a sharded store holds is refused.
#include <check.h>

#include "check_main.h"
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "dist/ddp.h"
#include "optim/adamw.h"
#include "params/store.h"
#include "util/fs.h"

// ---- fixtures ------------------------------------------------------------------

static ModelConfig test_config(void) {
    ModelConfig c;
    model_config_defaults(&c);
    c.vocab_size = 100; c.d_model = 24; c.n_layers = 2; c.n_heads = 2; c.n_experts = 4; c.top_k = 2;
    c.expert_hidden = 20; c.seq_len = 16;
    char err[512];
    ck_assert_msg(model_config_validate(&c, err, sizeof err) == 0, "%s", err);
    return c;
}

// Deterministic values with varied exponents, no two alike.
static float value(uint64_t seed, size_t i) {
    uint64_t z = (seed + 1) * 0x9e3779b97f4a7c15ULL + i * 0xbf58476d1ce4e5b9ULL;
    z ^= z >> 31; z *= 0x94d049bb133111ebULL; z ^= z >> 29;
    return (float)((double)(z >> 11) / 9007199254740992.0 - 0.5) * (1 + (i % 7));
}

typedef struct {
    ParamStore ps;
    AdamW opt;
    ModelConfig cfg;
    TrainState st;
} Fix;

// A store of cfg on ops, weights and router bias from seed; sharded over n
// ranks as rank r when n > 1 (main weights and moments for the shard).
static void fix_init(Fix *f, const Ops *ops, uint64_t seed, int n, int r) {
    memset(f, 0, sizeof *f);
    f->cfg = test_config();
    ParamLayout lay;
    param_store_init(&f->ps, &f->cfg, ops, 0, 1, &lay);
    free(lay.layers);
    size_t b[N_CLASSES], e[N_CLASSES];
    for (int c = 0; c < N_CLASSES; c++) ddp_shard_range(f->ps.table.class_numel[c], n, r, &b[c], &e[c]);
    if (n > 1 && r % 2) param_store_shard_main(&f->ps, b, e); // odd ranks: shard before the weights are written
    for (int c = 0; c < N_CLASSES; c++) {
        size_t N = f->ps.table.class_numel[c];
        float *h = malloc(N * 4 + 4);
        for (size_t i = 0; i < N; i++) h[i] = value(seed + c, i);
        param_store_write(&f->ps, c, 0, h, N);
        free(h);
    }
    if (n > 1) param_store_shard_main(&f->ps, b, e); // even ranks: after
    int nb = model_moe_layers(&f->cfg) * f->cfg.n_experts;
    for (int i = 0; i < nb; i++) f->ps.router_bias[i] = value(seed + 7, i);
    OptimConfig oc;
    optim_config_defaults(&oc);
    oc.weight_decay = 0.1f;
    adamw_init_range(&f->opt, &oc, &f->ps, b, e);
    f->st.seed = 1;
}

static void fix_free(Fix *f) {
    adamw_free(&f->opt);
    param_store_free(&f->ps);
}

// Moments of the optimizer's range from seed (as if it had stepped).
static void fill_moments(Fix *f, uint64_t seed) {
    for (int c = 0; c < N_CLASSES; c++)
        for (size_t i = f->opt.begin[c]; i < f->opt.end[c]; i++) {
            f->opt.m[c][i - f->opt.begin[c]] = value(seed + 2 * c, i);
            f->opt.v[c][i - f->opt.begin[c]] = fabsf(value(seed + 2 * c + 1, i));
        }
    f->opt.t = 3;
}

static void tmpdir(char *d, size_t n) {
    snprintf(d, n, "/tmp/moecore-test-stage-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(d));
}

static void rmtree(const char *d) { fs_remove_dir(d); }

static int save_layout(Fix *f, const char *dir, int64_t step, const size_t *own_b, const size_t *own_e) {
    CkptLayout l;
    ckpt_layout_single(&l, &f->ps);
    if (own_b)
        for (int c = 0; c < N_CLASSES; c++) { l.own_begin[c] = own_b[c]; l.own_end[c] = own_e[c]; }
    f->st.step = step;
    char err[1024];
    int rc = ckpt_save(dir, &f->cfg, &f->ps, &f->opt, &f->st, NULL, 0, &l, err, sizeof err);
    ck_assert_msg(rc == 0, "save: %s", err);
    return rc;
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    ck_assert_msg(fp != NULL, "cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    *n = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    ck_assert_uint_eq(fread(b, 1, *n, fp), *n);
    fclose(fp);
    return b;
}

static void ckpt_file(char *p, size_t n, const char *dir, int64_t step, const char *file) {
    snprintf(p, n, "%s/step-%08lld/%s", dir, (long long)step, file);
}

static void assert_same_file(const char *dir, int64_t s1, int64_t s2, const char *file) {
    char a[512], b[512];
    ckpt_file(a, sizeof a, dir, s1, file);
    ckpt_file(b, sizeof b, dir, s2, file);
    size_t na, nb;
    unsigned char *x = slurp(a, &na), *y = slurp(b, &nb);
    ck_assert_msg(na == nb && memcmp(x, y, na) == 0, "%s and %s differ", a, b);
    free(x); free(y);
}

// ---- 1. chunks -------------------------------------------------------------------

// Each tensor's bytes in model.safetensors, read with pread at the offsets of
// the header, against the store's main weights.
static void check_file_holds_weights(Fix *f, const char *path) {
    int fd;
    StFile st;
    char err[1024];
    ck_assert_msg(st_open(path, &fd, &st, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < f->ps.table.n; i++) {
        const ParamEntry *e = &f->ps.table.entries[i];
        int k = st_find(&st, e->name);
        ck_assert_int_ge(k, 0);
        float *got = malloc(e->numel * 4 + 4);
        ck_assert_int_eq(pread(fd, got, e->numel * 4, (off_t)(8 + st.header_len + st.tensors[k].begin)),
                         (ssize_t)(e->numel * 4));
        ck_assert_msg(memcmp(got, param_store_main(&f->ps, i), e->numel * 4) == 0, "%s: file bytes differ", e->name);
        free(got);
    }
    close(fd);
    st_free(&st);
}

START_TEST(test_chunks_same_bytes) {
    Fix f;
    fix_init(&f, &ops_cpu, 11, 1, 0);
    fill_moments(&f, 5);
    char dir[64], path[512];
    tmpdir(dir, sizeof dir);
    ckpt_set_chunk_bytes(0);            // the default: one chunk per tensor here
    save_layout(&f, dir, 1, NULL, NULL);
    size_t sizes[3] = {12, 8, 4};       // 3, 2, 1 floats: every tensor crosses chunk boundaries
    for (int k = 0; k < 3; k++) {
        ckpt_set_chunk_bytes(sizes[k]);
        save_layout(&f, dir, 2 + k, NULL, NULL);
        assert_same_file(dir, 1, 2 + k, CKPT_MODEL_FILE);
        assert_same_file(dir, 1, 2 + k, CKPT_OPTIM_FILE);
    }
    ckpt_file(path, sizeof path, dir, 2, CKPT_MODEL_FILE);
    check_file_holds_weights(&f, path);

    // loaded through 3-float chunks into a store of other values: exactly the saved ones
    Fix g;
    fix_init(&g, &ops_cpu, 99, 1, 0);
    ckpt_set_chunk_bytes(12);
    char err[1024], ck[512];
    snprintf(ck, sizeof ck, "%s/step-00000002", dir);
    ck_assert_msg(ckpt_load(ck, &g.cfg, &g.ps, &g.opt, &g.st, err, sizeof err) == 0, "%s", err);
    for (int c = 0; c < N_CLASSES; c++) {
        size_t N = f.ps.table.class_numel[c];
        ck_assert(memcmp(g.ps.params[c], f.ps.params[c], N * 4) == 0);
        ck_assert(memcmp(g.opt.m[c], f.opt.m[c], N * 4) == 0);
        ck_assert(memcmp(g.opt.v[c], f.opt.v[c], N * 4) == 0);
    }
    ck_assert(memcmp(g.ps.router_bias, f.ps.router_bias, (size_t)model_moe_layers(&f.cfg) * f.cfg.n_experts * 4) == 0);
    ck_assert_int_eq(g.opt.t, 3);
    ckpt_set_chunk_bytes(0);
    fix_free(&g);
    fix_free(&f);
    rmtree(dir);
}
END_TEST

// ORs the files file of steps [first, first + n) of dir; compares with step ref.
static void assert_or_is(const char *dir, int64_t first, int n, int64_t ref, const char *file) {
    char p[512];
    size_t nr, nx;
    ckpt_file(p, sizeof p, dir, ref, file);
    unsigned char *want = slurp(p, &nr), *acc = calloc(nr, 1);
    for (int r = 0; r < n; r++) {
        ckpt_file(p, sizeof p, dir, first + r, file);
        unsigned char *x = slurp(p, &nx);
        ck_assert_uint_eq(nx, nr);
        for (size_t i = 0; i < nr; i++) acc[i] |= x[i];
        free(x);
    }
    ck_assert_msg(memcmp(acc, want, nr) == 0, "%s: the ranks' files ORed differ from the one-rank file", file);
    free(want); free(acc);
}

START_TEST(test_chunks_partial_ranges) {
    // three "ranks" own [0, a), [a, b), [b, N) of each class, cut mid-tensor;
    // each writes only its bytes (the rest stays zero), through 3-float chunks
    Fix f;
    fix_init(&f, &ops_cpu, 12, 1, 0);
    fill_moments(&f, 6);
    char dir[64];
    tmpdir(dir, sizeof dir);
    ckpt_set_chunk_bytes(0);
    save_layout(&f, dir, 1, NULL, NULL);
    ckpt_set_chunk_bytes(12);
    for (int r = 0; r < 3; r++) {
        size_t b[N_CLASSES], e[N_CLASSES];
        for (int c = 0; c < N_CLASSES; c++) ddp_shard_range(f.ps.table.class_numel[c], 3, r, &b[c], &e[c]);
        save_layout(&f, dir, 10 + r, b, e);
    }
    assert_or_is(dir, 10, 3, 1, CKPT_MODEL_FILE);
    assert_or_is(dir, 10, 3, 1, CKPT_OPTIM_FILE);
    ckpt_set_chunk_bytes(0);
    fix_free(&f);
    rmtree(dir);
}
END_TEST

// ---- 2. separate compute weights -------------------------------------------------

// The emulated BF16 backend: the CPU's ops, 2-byte compute weights.
static uint16_t bf16_rne(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16); // finite inputs only
}
static void split_cast(void *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = bf16_rne(src[i]);
}
static void split_adamw(float *p, void *p_act, const float *g, float *m, float *v, size_t n, float lr, float b1,
                        float b2, float eps, float wd, float gs, int t) {
    ops_cpu.adamw_update(p, NULL, g, m, v, n, lr, b1, b2, eps, wd, gs, t);
    if (p_act) split_cast(p_act, p, n);
}
static Ops split;
static void split_init(void) {
    split = ops_cpu;
    split.name = "bf16-emulated";
    split.act_bytes = 2;
    split.cast_to_act = split_cast;
    split.adamw_update = split_adamw;
}

#define D 3

// Every rank's compute weights against the reference store's, and against
// bf16 of the reference main weights; each rank's main weights against its
// shard of the reference.
static void assert_ranks_match(Fix *ref, Fix *rk) {
    for (int c = 0; c < N_CLASSES; c++) {
        size_t N = ref->ps.table.class_numel[c];
        for (int r = 0; r < D; r++) {
            ck_assert_msg(memcmp(rk[r].ps.wact[c], ref->ps.wact[c], N * 2) == 0, "rank %d class %d: compute weights", r, c);
            size_t b = rk[r].ps.main_begin[c], e = rk[r].ps.main_end[c];
            ck_assert_msg(memcmp(rk[r].ps.params[c], ref->ps.params[c] + b, (e - b) * 4) == 0, "rank %d class %d: main", r, c);
        }
        for (size_t i = 0; i < N; i++) ck_assert_uint_eq(((uint16_t *)ref->ps.wact[c])[i], bf16_rne(ref->ps.params[c][i]));
    }
}

// What ddp_gather_params does on one group: every rank's shard of compute
// weights (bytes) to every other rank.
static void all_gather_compute(Fix *rk) {
    for (int c = 0; c < N_CLASSES; c++)
        for (int r = 0; r < D; r++) {
            size_t b = rk[r].ps.main_begin[c], e = rk[r].ps.main_end[c];
            for (int q = 0; q < D; q++)
                if (q != r) memcpy((char *)rk[q].ps.wact[c] + b * 2, (char *)rk[r].ps.wact[c] + b * 2, (e - b) * 2);
        }
}

START_TEST(test_sharded_separate_compute_weights) {
    split_init();
    Fix ref, rk[D];
    fix_init(&ref, &split, 21, 1, 0);
    ck_assert(ref.ps.wact[0] != (void *)ref.ps.params[0]);
    for (int r = 0; r < D; r++) fix_init(&rk[r], &split, 21, D, r);
    for (int r = 0; r < D; r++)
        for (int c = 0; c < N_CLASSES; c++) {
            size_t b, e;
            ddp_shard_range(ref.ps.table.class_numel[c], D, r, &b, &e);
            ck_assert_uint_eq(rk[r].ps.main_begin[c], b);
            ck_assert_uint_eq(rk[r].ps.main_end[c], e);
            ck_assert_uint_eq(rk[r].opt.end[c] - rk[r].opt.begin[c], e - b); // moments: the shard only
        }
    assert_ranks_match(&ref, rk);

    // two steps: the same summed grads everywhere, each rank updating its shard
    for (int step = 0; step < 2; step++) {
        for (int c = 0; c < N_CLASSES; c++) {
            size_t N = ref.ps.table.class_numel[c];
            for (size_t i = 0; i < N; i++) {
                float g = value(100 + step * 2 + c, i);
                ref.ps.grads[c][i] = g;
                for (int r = 0; r < D; r++) rk[r].ps.grads[c][i] = g;
            }
        }
        adamw_step(&ref.opt, &ref.ps, 1e-2f, 0.5f);
        for (int r = 0; r < D; r++) adamw_step(&rk[r].opt, &rk[r].ps, 1e-2f, 0.5f);
        all_gather_compute(rk);
        assert_ranks_match(&ref, rk);
    }

    // each rank saves its shard from its sharded store; ORed, the reference's files
    char dir[64], err[1024], ck[512];
    tmpdir(dir, sizeof dir);
    ckpt_set_chunk_bytes(8);
    save_layout(&ref, dir, 1, NULL, NULL);
    for (int r = 0; r < D; r++) save_layout(&rk[r], dir, 10 + r, rk[r].ps.main_begin, rk[r].ps.main_end);
    assert_or_is(dir, 10, D, 1, CKPT_MODEL_FILE);
    assert_or_is(dir, 10, D, 1, CKPT_OPTIM_FILE);
    // a layout that owns more than the store holds is an error, not zeros in the file
    {
        CkptLayout all;
        ckpt_layout_single(&all, &rk[1].ps);
        rk[1].st.step = 20;
        ck_assert_int_eq(ckpt_save(dir, &rk[1].cfg, &rk[1].ps, &rk[1].opt, &rk[1].st, NULL, 0, &all, err, sizeof err), -1);
        ck_assert_msg(strstr(err, "owns elements") && strstr(err, "holds"), "message: %s", err);
        snprintf(ck, sizeof ck, "%s/step-00000020", dir);
        ck_assert(access(ck, F_OK) != 0);
    }

    // loading into fresh sharded stores of other values restores everything held
    snprintf(ck, sizeof ck, "%s/step-00000001", dir);
    Fix fresh[D];
    for (int r = 0; r < D; r++) {
        fix_init(&fresh[r], &split, 77, D, r);
        ck_assert_msg(ckpt_load(ck, &fresh[r].cfg, &fresh[r].ps, &fresh[r].opt, &fresh[r].st, err, sizeof err) == 0, "%s", err);
        for (int c = 0; c < N_CLASSES; c++) {
            size_t b = fresh[r].opt.begin[c], n = fresh[r].opt.end[c] - b;
            ck_assert(memcmp(fresh[r].opt.m[c], ref.opt.m[c] + b, n * 4) == 0);
            ck_assert(memcmp(fresh[r].opt.v[c], ref.opt.v[c] + b, n * 4) == 0);
        }
    }
    assert_ranks_match(&ref, fresh);
    ckpt_set_chunk_bytes(0);
    for (int r = 0; r < D; r++) { fix_free(&rk[r]); fix_free(&fresh[r]); }
    fix_free(&ref);
    rmtree(dir);
}
END_TEST

// A sharded store does not hand out main weights it lacks: it dies naming
// the tensor (the exit code is checked; the message goes to stderr).
START_TEST(test_main_outside_the_shard_dies) {
    split_init();
    Fix f;
    fix_init(&f, &split, 3, D, 2);
    int i = param_find(&f.ps.table, "embed"); // the first dense tensor: in rank 0's shard, not rank 2's
    ck_assert_int_ge(i, 0);
    param_store_main(&f.ps, i);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ckpt_stage");
    TCase *tc = tcase_create("stage");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_chunks_same_bytes);
    tcase_add_test(tc, test_chunks_partial_ranges);
    tcase_add_test(tc, test_sharded_separate_compute_weights);
    tcase_add_exit_test(tc, test_main_outside_the_shard_dies, 1);
    suite_add_tcase(s, tc);
    return check_run(s);
}
