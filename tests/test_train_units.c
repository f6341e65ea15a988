// Unit tests of the training loop's pieces: LR schedules, skip-step (also of
// non-finite steps), expert-load statistics, the token-gerrymandering flag,
// the FLOP count, the MFU denominators; and the checkpoint writer's promises
// that keep a user's work: a tensor with a NaN or an Inf is never saved (the
// error names it, nothing is committed), a committed step is never
// overwritten, pruning (checkpoint.keep) never deletes the checkpoint just
// written, and ckpt_remove_all (--overwrite) removes checkpoint directories only.
#include <check.h>

#include "check_main.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "train/metrics.h"
#include "train/mfu.h"
#include "train/train.h"
#include "util/fs.h"

static TrainSection sched(int kind) {
    RunConfig c;
    run_config_defaults(&c);
    TrainSection t = c.train;
    t.steps = 100;
    t.warmup_steps = 10;
    t.lr_schedule = kind;
    t.min_lr_ratio = 0.1;
    t.decay_fraction = 0.2;
    return t;
}

START_TEST(test_lr_schedules) {
    TrainSection t = sched(LR_COSINE);
    ck_assert_double_eq_tol(lr_at(&t, 1.0, 0), 0.1, 1e-12);       // warmup (step+1)/10
    ck_assert_double_eq_tol(lr_at(&t, 1.0, 9), 1.0, 1e-12);
    ck_assert_double_eq_tol(lr_at(&t, 1.0, 10), 1.0, 1e-12);      // cosine starts at the peak
    ck_assert_double_eq_tol(lr_at(&t, 1.0, 55), 0.55, 1e-12);     // halfway: (1 + 0.1) / 2
    ck_assert_double_eq_tol(lr_at(&t, 1.0, 100), 0.1, 1e-12);     // floor
    for (int s = 11; s < 100; s++) ck_assert(lr_at(&t, 1.0, s) < lr_at(&t, 1.0, s - 1) + 1e-15);
    t = sched(LR_WSD);
    ck_assert_double_eq_tol(lr_at(&t, 1.0, 50), 1.0, 1e-12);      // stable
    ck_assert_double_eq_tol(lr_at(&t, 1.0, 80), 1.0, 1e-12);      // decay starts at 80 of 100
    ck_assert_double_eq_tol(lr_at(&t, 1.0, 90), 0.55, 1e-12);     // halfway down
    ck_assert_double_eq_tol(lr_at(&t, 1.0, 100), 0.1, 1e-12);
    t = sched(LR_CONSTANT);
    ck_assert_double_eq_tol(lr_at(&t, 2.0, 4), 1.0, 1e-12);
    ck_assert_double_eq_tol(lr_at(&t, 2.0, 99), 2.0, 1e-12);
}
END_TEST

// Each schedule against its closed form at several steps: 100 steps, 10 of
// warmup, floor lo = 0.1, peak 1 (the step index is 0-based).
typedef struct { int64_t step; double lr; } LrPoint;
static void check_schedule(const TrainSection *t, const LrPoint *pts, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        double got = lr_at(t, 1.0, pts[i].step);
        ck_assert_msg(fabs(got - pts[i].lr) <= 1e-12, "%s: step %lld: lr %.15g, expected %.15g", what,
                      (long long)pts[i].step, got, pts[i].lr);
    }
}

START_TEST(test_lr_schedules_closed_form) {
    // linear: peak - (peak - lo) p, p = (step - 10) / 90, held at lo after the end
    TrainSection t = sched(LR_LINEAR);
    LrPoint linear[] = {{0, 0.1}, {9, 1.0}, {10, 1.0}, {28, 1 - 0.9 * 0.2}, {55, 0.55}, {82, 1 - 0.9 * 0.8},
                        {100, 0.1}, {150, 0.1}};
    check_schedule(&t, linear, 6, "linear");
    check_schedule(&t, linear + 6, 2, "linear past the end");
    // inv_sqrt: lo + (peak - lo) sqrt(W / n), n = step + 1, W = 10; open-ended
    t = sched(LR_INV_SQRT);
    LrPoint inv[] = {{4, 0.5}, {9, 1.0}, {39, 0.1 + 0.9 * 0.5}, {89, 0.1 + 0.9 / 3}, {159, 0.1 + 0.9 * 0.25},
                     {999, 0.1 + 0.9 * 0.1}, {99999, 0.1 + 0.9 * 0.01}};
    check_schedule(&t, inv, 7, "inv_sqrt");
    t.warmup_steps = 0; // timescale 1: the peak at step 0
    LrPoint inv0[] = {{0, 1.0}, {3, 0.1 + 0.9 * 0.5}, {99, 0.1 + 0.9 * 0.1}};
    check_schedule(&t, inv0, 3, "inv_sqrt without warmup");
    // wsd: the peak until step 80, then the decay over the last 20% of the
    // steps, q = (step - 80) / 20, to lo: peak - (peak - lo) g(q)
    t = sched(LR_WSD);
    t.decay_shape = DECAY_LINEAR; // g(q) = q
    LrPoint wsd_lin[] = {{9, 1.0}, {50, 1.0}, {80, 1.0}, {85, 1 - 0.9 * 0.25}, {90, 0.55}, {95, 1 - 0.9 * 0.75},
                         {100, 0.1}, {120, 0.1}};
    check_schedule(&t, wsd_lin, 8, "wsd linear");
    t.decay_shape = DECAY_COSINE; // g(q) = (1 - cos(pi q)) / 2
    LrPoint wsd_cos[] = {{50, 1.0}, {80, 1.0}, {85, 1 - 0.9 * (1 - cos(M_PI / 4)) / 2}, {90, 0.55},
                         {95, 1 - 0.9 * (1 - cos(3 * M_PI / 4)) / 2}, {100, 0.1}};
    check_schedule(&t, wsd_cos, 6, "wsd cosine");
    t.decay_shape = DECAY_1_SQRT; // g(q) = sqrt(q)
    LrPoint wsd_sqrt[] = {{50, 1.0}, {80, 1.0}, {85, 0.55}, {90, 1 - 0.9 * sqrt(0.5)}, {95, 1 - 0.9 * sqrt(0.75)},
                          {100, 0.1}};
    check_schedule(&t, wsd_sqrt, 6, "wsd 1-sqrt");
    // another decay fraction: half of the steps, so the decay starts at 50
    t.decay_shape = DECAY_LINEAR;
    t.decay_fraction = 0.5;
    LrPoint wsd_half[] = {{40, 1.0}, {50, 1.0}, {60, 1 - 0.9 * 0.2}, {75, 0.55}, {100, 0.1}};
    check_schedule(&t, wsd_half, 5, "wsd, decay_fraction 0.5");
    t.decay_fraction = 0; // no decay: warmup-stable
    LrPoint wsd_none[] = {{10, 1.0}, {99, 1.0}};
    check_schedule(&t, wsd_none, 2, "wsd, decay_fraction 0");
}
END_TEST

START_TEST(test_skip_step) {
    TrainSection t = sched(LR_CONSTANT);
    t.skip_window = 10;
    t.skip_sigmas = 3;
    TrainState s;
    memset(&s, 0, sizeof s);
    ck_assert(!train_should_skip(&s, &t, 1e9, 1e9)); // no history yet: never skip
    for (int i = 0; i < 20; i++) train_push_history(&s, t.skip_window, 3.0 + 0.01 * (i % 3), 1.0 + 0.01 * (i % 2));
    ck_assert_int_eq(s.hist_n, 10);                 // the window keeps the last 10
    ck_assert(!train_should_skip(&s, &t, 3.01, 1.0));
    ck_assert(train_should_skip(&s, &t, 4.0, 1.0));  // loss spike
    ck_assert(train_should_skip(&s, &t, 3.0, 5.0));  // grad-norm spike
    ck_assert(train_should_skip(&s, &t, NAN, 1.0));  // NaN loss
    t.skip_window = 0;
    ck_assert(!train_should_skip(&s, &t, 4.0, 5.0)); // off
    // a NaN or Inf loss or grad norm is skipped also with skip-step off and without history
    ck_assert(train_should_skip(&s, &t, NAN, 1.0));
    ck_assert(train_should_skip(&s, &t, 3.0, INFINITY));
    memset(&s, 0, sizeof s);
    ck_assert(train_should_skip(&s, &t, -INFINITY, 1.0));
    ck_assert(!train_should_skip(&s, &t, 1e30, 1e30));
}
END_TEST

START_TEST(test_expert_load) {
    float c[4] = {10, 10, 20, 0};
    ExpertLoad el;
    expert_load_stats(c, 4, &el);
    ck_assert_double_eq_tol(el.max_over_mean, 2.0, 1e-12);
    ck_assert_double_eq_tol(el.min_over_mean, 0.0, 1e-12);
    ck_assert_int_eq(el.dead, 1);
    ck_assert_double_eq_tol(el.cv, sqrt(50.0) / 10.0, 1e-12);
    float u[3] = {5, 5, 5};
    expert_load_stats(u, 3, &el);
    ck_assert_double_eq_tol(el.max_over_mean, 1.0, 1e-12);
    ck_assert_double_eq_tol(el.cv, 0.0, 1e-12);
}
END_TEST

START_TEST(test_gerrymander) {
    Gerrymander g;
    gerrymander_init(&g, 2, 20);
    int flags[2], any = 0;
    unsigned r = 1;
    for (int i = 0; i < 40; i++) {
        r = r * 1103515245 + 12345;
        double noise = ((r >> 16) % 1000) / 1000.0 - 0.5;
        // layer 0: LB falls while max/mean rises (gerrymandering);
        // layer 1: both fall, with noise (healthy)
        double lb[2] = {1.5 - 0.01 * i + 0.001 * noise, 1.5 - 0.01 * i + 0.001 * noise};
        double mx[2] = {1.2 + 0.02 * i + 0.002 * noise, 2.0 - 0.02 * i + 0.05 * noise};
        any = gerrymander_push(&g, lb, mx, flags);
        if (i < 19) ck_assert_int_eq(any, 0); // not before a full window
    }
    ck_assert_int_eq(flags[0], 1);
    ck_assert_int_eq(flags[1], 0);
    ck_assert_int_eq(any, 1);
    // pure noise is never flagged
    Gerrymander h;
    gerrymander_init(&h, 1, 20);
    for (int i = 0; i < 200; i++) {
        r = r * 1103515245 + 12345;
        double a = ((r >> 16) % 1000) / 1000.0;
        r = r * 1103515245 + 12345;
        double b = ((r >> 16) % 1000) / 1000.0;
        double lb[1] = {1 + 0.1 * a}, mx[1] = {1.5 + 0.2 * b};
        ck_assert_int_eq(gerrymander_push(&h, lb, mx, flags), 0);
    }
    gerrymander_free(&g);
    gerrymander_free(&h);
}
END_TEST

START_TEST(test_flops_per_token) {
    ModelConfig c;
    model_config_defaults(&c);
    c.vocab_size = 128; c.d_model = 64; c.n_layers = 2; c.n_heads = 4; c.n_experts = 8; c.top_k = 2;
    c.expert_hidden = 32; c.seq_len = 16;
    char err[256];
    ck_assert_int_eq(model_config_validate(&c, err, sizeof err), 0);
    // per layer: qkvo 4*64*64 + router 8*64 + top-2 experts 2*3*64*32; LM head 128*64
    double params = 2 * (4.0 * 64 * 64 + 8 * 64 + 2 * 3.0 * 64 * 32) + 128.0 * 64;
    ck_assert_double_eq_tol(flops_per_token(&c), 6 * params + 6.0 * 2 * 16 * 64, 1e-6);
}
END_TEST

// The checkpoint writer's cases: a small model, its optimizer, a fresh directory.
typedef struct {
    Model m;
    AdamW opt;
    TrainState st;
    CkptLayout layout;
    char dir[64];
} Fixture;

static void fixture_init(Fixture *f) {
    ModelConfig c;
    model_config_defaults(&c);
    c.vocab_size = 128; c.d_model = 32; c.n_layers = 2; c.n_heads = 2; c.n_experts = 4; c.top_k = 2;
    c.expert_hidden = 32; c.seq_len = 16;
    char err[512];
    ck_assert_msg(model_init(&f->m, &c, &ops_cpu, err, sizeof err) == 0, "%s", err);
    model_init_weights(&f->m, 1);
    OptimConfig oc;
    optim_config_defaults(&oc);
    adamw_init(&f->opt, &oc, &f->m.store);
    memset(&f->st, 0, sizeof f->st);
    ckpt_layout_single(&f->layout, &f->m.store);
    snprintf(f->dir, sizeof f->dir, "/tmp/moecore-test-ckpt-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(f->dir));
}

static void fixture_free(Fixture *f) {
    int n;
    char err[512];
    ckpt_remove_all(f->dir, &n, err, sizeof err);
    rmdir(f->dir);
    adamw_free(&f->opt);
    model_free(&f->m);
}

static int save(Fixture *f, int64_t step, int keep, char *err, size_t errlen) {
    f->st.step = step;
    return ckpt_save(f->dir, &f->m.cfg, &f->m.store, &f->opt, &f->st, NULL, keep, &f->layout, err, errlen);
}

static int exists(const Fixture *f, const char *name) {
    char p[256];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", f->dir, name);
    return stat(p, &sb) == 0;
}

START_TEST(test_nonfinite_refused) {
    Fixture f;
    fixture_init(&f);
    char err[1024];
    ck_assert_int_eq(save(&f, 1, 0, err, sizeof err), 0);
    // a NaN in a weight, then an Inf in a moment: refused, named, nothing committed
    int i = param_find(&f.m.store.table, "layers.1.attn.wk");
    ck_assert_int_ge(i, 0);
    float *w = param_store_main(&f.m.store, i), keep_w = w[3];
    w[3] = NAN;
    ck_assert_int_eq(save(&f, 2, 0, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "layers.1.attn.wk") && strstr(err, "non-finite"), "message: %s", err);
    ck_assert(!exists(&f, "step-00000002") && !exists(&f, "step-00000002.tmp"));
    w[3] = keep_w;
    f.opt.v[CLASS_EXPERT][5] = INFINITY;
    ck_assert_int_eq(save(&f, 2, 0, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "exp_avg_sq.") && strstr(err, "non-finite"), "message: %s", err);
    ck_assert(!exists(&f, "step-00000002"));
    f.opt.v[CLASS_EXPERT][5] = 0;
    ck_assert_int_eq(save(&f, 2, 0, err, sizeof err), 0);
    char latest[256];
    ck_assert_int_eq(ckpt_find_latest(f.dir, latest, sizeof latest, err, sizeof err), 1);
    ck_assert(strstr(latest, "step-00000002"));
    fixture_free(&f);
}
END_TEST

START_TEST(test_committed_never_overwritten) {
    Fixture f;
    fixture_init(&f);
    char err[1024];
    ck_assert_int_eq(save(&f, 5, 0, err, sizeof err), 0);
    ck_assert_int_eq(save(&f, 5, 0, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "step-00000005") && strstr(err, "already committed"), "message: %s", err);
    ck_assert(exists(&f, "step-00000005/COMMITTED"));
    fixture_free(&f);
}
END_TEST

START_TEST(test_prune_keeps_the_new_one) {
    Fixture f;
    fixture_init(&f);
    char err[1024];
    // an earlier run's higher steps are there; keep 1 must not delete the step just written
    ck_assert_int_eq(save(&f, 10, 0, err, sizeof err), 0);
    ck_assert_int_eq(save(&f, 20, 0, err, sizeof err), 0);
    ck_assert_int_eq(save(&f, 5, 1, err, sizeof err), 0);
    ck_assert(exists(&f, "step-00000005/COMMITTED"));
    ck_assert(exists(&f, "step-00000020/COMMITTED"));
    ck_assert(!exists(&f, "step-00000010"));
    // and in the usual order it keeps the newest
    ck_assert_int_eq(save(&f, 30, 1, err, sizeof err), 0);
    ck_assert(exists(&f, "step-00000030/COMMITTED") && !exists(&f, "step-00000020") && !exists(&f, "step-00000005"));
    fixture_free(&f);
}
END_TEST

START_TEST(test_remove_all) {
    Fixture f;
    fixture_init(&f);
    char err[1024], p[256];
    ck_assert_int_eq(save(&f, 1, 0, err, sizeof err), 0);
    ck_assert_int_eq(save(&f, 2, 0, err, sizeof err), 0);
    snprintf(p, sizeof p, "%s/step-00000003.tmp", f.dir);  // an interrupted save
    ck_assert_int_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/notes.txt", f.dir);          // not a checkpoint: stays
    ck_assert_int_eq(fs_write_text(p, "mine\n", err, sizeof err), 0);
    snprintf(p, sizeof p, "%s/step-7x", f.dir);            // not a checkpoint name: stays
    ck_assert_int_eq(mkdir(p, 0755), 0);
    int n = -1;
    ck_assert_int_eq(ckpt_remove_all(f.dir, &n, err, sizeof err), 0);
    ck_assert_int_eq(n, 3);
    ck_assert(!exists(&f, "step-00000001") && !exists(&f, "step-00000002") && !exists(&f, "step-00000003.tmp"));
    ck_assert(exists(&f, "notes.txt") && exists(&f, "step-7x"));
    char latest[256];
    ck_assert_int_eq(ckpt_find_latest(f.dir, latest, sizeof latest, err, sizeof err), 0);
    snprintf(p, sizeof p, "%s/notes.txt", f.dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/step-7x", f.dir);
    rmdir(p);
    fixture_free(&f);
}
END_TEST

// The MFU denominators: GPU peaks by the names CUDA reports, an unknown
// GPU, and the CPU's measurement, cached and read back.
START_TEST(test_mfu_gpu_table) {
    struct { const char *name; double tflops; } cases[] = {
        {"NVIDIA A100-SXM4-80GB", 312}, {"NVIDIA A100-PCIE-40GB", 312}, {"NVIDIA A100 80GB PCIe", 312},
        {"NVIDIA H100 80GB HBM3", 989}, {"NVIDIA H100 PCIe", 756},      {"NVIDIA H100 NVL", 835},
        {"NVIDIA H200", 989},           {"NVIDIA H200 NVL", 835},       {"NVIDIA B200", 2250},
        {"NVIDIA B300 SXM6 AC", 2250},
        // unknown: 0, no entry
        {"NVIDIA GB200", 0}, {"NVIDIA GeForce RTX 4090", 0}, {"NVIDIA H20", 0}, {"", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *entry = "unset";
        double got = mfu_gpu_peak_tflops(cases[i].name, &entry);
        ck_assert_msg(got == cases[i].tflops, "'%s': %g TFLOP/s, expected %g", cases[i].name, got, cases[i].tflops);
        ck_assert_msg((entry != NULL) == (got > 0), "'%s': entry %s", cases[i].name, entry ? entry : "NULL");
    }
}
END_TEST

START_TEST(test_mfu_cpu_cache) {
    char dir[] = "/tmp/moecore-mfu-XXXXXX", path[128], how[1400];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/sub/cpu-peak.json", dir);
    double first = mfu_cpu_peak_tflops(path, how, sizeof how);
    ck_assert_msg(first > 0 && strstr(how, "measured now") && strstr(how, path), "%s", how);
    // the second run reads the same number back instead of measuring
    double again = mfu_cpu_peak_tflops(path, how, sizeof how);
    ck_assert_msg(again == first && strstr(how, "cached in") && !strstr(how, "now"), "%g vs %g: %s", again, first, how);
    // an unreadable cache is replaced by a new measurement
    FILE *f = fopen(path, "w");
    fputs("{not json", f);
    fclose(f);
    double fresh = mfu_cpu_peak_tflops(path, how, sizeof how);
    ck_assert_msg(fresh > 0 && strstr(how, "replaced an unreadable cache"), "%s", how);
    ck_assert_double_eq(mfu_cpu_peak_tflops(path, how, sizeof how), fresh);
    // a cache that cannot be written (below a file): measured, used, and said so
    char bad[160];
    snprintf(bad, sizeof bad, "%s/x/cpu-peak.json", path);
    ck_assert(mfu_cpu_peak_tflops(bad, how, sizeof how) > 0);
    ck_assert_msg(strstr(how, "not cached"), "%s", how);
    unlink(path);
    snprintf(path, sizeof path, "%s/sub", dir);
    rmdir(path);
    rmdir(dir);
    // the default location follows XDG_CACHE_HOME, then HOME
    setenv("XDG_CACHE_HOME", "/x/cache", 1);
    ck_assert_int_eq(mfu_cpu_cache_path(path, sizeof path), 0);
    ck_assert_str_eq(path, "/x/cache/moecore/cpu-peak.json");
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/x/home", 1);
    ck_assert_int_eq(mfu_cpu_cache_path(path, sizeof path), 0);
    ck_assert_str_eq(path, "/x/home/.cache/moecore/cpu-peak.json");
    unsetenv("HOME");
    ck_assert_int_eq(mfu_cpu_cache_path(path, sizeof path), -1);
}
END_TEST

int main(void) {
    Suite *s = suite_create("train_units");
    TCase *tc = tcase_create("units");
    tcase_add_test(tc, test_lr_schedules);
    tcase_add_test(tc, test_lr_schedules_closed_form);
    tcase_add_test(tc, test_skip_step);
    tcase_add_test(tc, test_expert_load);
    tcase_add_test(tc, test_gerrymander);
    tcase_add_test(tc, test_flops_per_token);
    tcase_add_test(tc, test_mfu_gpu_table);
    tcase_add_test(tc, test_mfu_cpu_cache);
    suite_add_tcase(s, tc);
    TCase *ck = tcase_create("checkpoint");
    tcase_add_test(ck, test_nonfinite_refused);
    tcase_add_test(ck, test_committed_never_overwritten);
    tcase_add_test(ck, test_prune_keeps_the_new_one);
    tcase_add_test(ck, test_remove_all);
    suite_add_tcase(s, ck);
    return check_run(s);
}
