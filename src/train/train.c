// `moecore train`: the single-process training loop. The order of work in
// one step follows DESIGN.md §2; the parallel runtimes will slot in at the
// marked places (data slice per rank, grad reduction before the optimizer).
#include "train/train.h"

#include <cblas.h>
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "data/data.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "train/metrics.h"
#include "util/check.h"

static volatile sig_atomic_t stop_signal = 0;
static void on_signal(int sig) { stop_signal = sig; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double lr_at(const TrainSection *t, double base, int64_t step) {
    if (step < t->warmup_steps) return base * (double)(step + 1) / (double)t->warmup_steps;
    double lo = base * t->min_lr_ratio;
    int64_t span = t->steps - t->warmup_steps;
    double p = span > 0 ? (double)(step - t->warmup_steps) / (double)span : 1.0;
    if (p > 1) p = 1;
    switch (t->lr_schedule) {
    case LR_COSINE: return lo + (base - lo) * 0.5 * (1 + cos(M_PI * p));
    case LR_WSD: {
        // warmup, stable, then linear decay over the last decay_fraction of all steps
        double decay_start = 1.0 - (t->decay_fraction * t->steps) / (double)(span > 0 ? span : 1);
        if (p <= decay_start || t->decay_fraction <= 0) return base;
        return base + (lo - base) * (p - decay_start) / (1 - decay_start);
    }
    default: return base;
    }
}

double flops_per_token(const ModelConfig *c) {
    return 6.0 * model_active_matmul_params(c) +
           6.0 * c->n_layers * (double)c->seq_len * model_q_dim(c);
}

// Dense BF16 peak of known GPUs for MFU; on CPU a measured SGEMM rate.
static double measure_cpu_peak_tflops(void) {
    int n = 512;
    float *a = mallocCheck((size_t)n * n * 4), *b = mallocCheck((size_t)n * n * 4), *c = mallocCheck((size_t)n * n * 4);
    for (int i = 0; i < n * n; i++) { a[i] = (float)(i % 7) * 0.1f; b[i] = (float)(i % 5) * 0.1f; }
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        double dt = now_s() - t0;
        if (dt < best) best = dt;
    }
    free(a); free(b); free(c);
    return 2.0 * n * n * n / best / 1e12;
}

static double peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;
}

static void fmt_duration(char *buf, size_t n, double s) {
    if (s < 0 || !isfinite(s)) { snprintf(buf, n, "?"); return; }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
    else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, n, "%lds", t);
}

static int mkdir_parents(const char *path) {
    char buf[CFG_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) && errno != EEXIST ? -1 : 0;
}

// Skip-step: a step whose loss or grad norm exceeds mean + k sigma of the
// last `window` accepted steps is not applied. Needs half a window of history.
int train_should_skip(const TrainState *s, const TrainSection *t, double loss, double gnorm) {
    if (t->skip_window <= 0 || s->hist_n < t->skip_window / 2 || s->hist_n < 2) return 0;
    const double *series[2] = {s->hist_loss, s->hist_gnorm};
    double value[2] = {loss, gnorm};
    for (int k = 0; k < 2; k++) {
        double mean = 0, var = 0;
        for (int i = 0; i < s->hist_n; i++) mean += series[k][i];
        mean /= s->hist_n;
        for (int i = 0; i < s->hist_n; i++) var += (series[k][i] - mean) * (series[k][i] - mean);
        double sd = sqrt(var / (s->hist_n - 1));
        if (!isfinite(value[k]) || value[k] > mean + t->skip_sigmas * sd) return 1;
    }
    return 0;
}

void train_push_history(TrainState *s, int window, double loss, double gnorm) {
    if (window <= 0) return;
    if (window > SKIP_WINDOW_MAX) window = SKIP_WINDOW_MAX;
    if (s->hist_n == window) {
        memmove(s->hist_loss, s->hist_loss + 1, (window - 1) * sizeof(double));
        memmove(s->hist_gnorm, s->hist_gnorm + 1, (window - 1) * sizeof(double));
        s->hist_n--;
    }
    s->hist_loss[s->hist_n] = loss;
    s->hist_gnorm[s->hist_n] = gnorm;
    s->hist_n++;
}

static uint64_t mix(uint64_t a, uint64_t b) {
    uint64_t z = a * 0x9e3779b97f4a7c15ULL ^ (b + 0x632be59bd9b4e019ULL + (a << 6) + (a >> 2));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static DataLoader *open_loader(const RunConfig *c, const StrList *paths, const StrList *weights,
                               int shuffle, char *err, size_t errlen) {
    int n = weights && weights->n ? paths->n : 1;
    DataSource src[CFG_MAX_LIST];
    for (int i = 0; i < n; i++) {
        src[i].name = NULL;
        src[i].patterns = (const char *const *)(n == 1 ? paths->items : &paths->items[i]);
        src[i].n_patterns = n == 1 ? paths->n : 1;
        src[i].weight = weights && weights->n ? strtod(weights->items[i], NULL) : 0;
    }
    return data_open(src, n, (TokenDtype)c->data.dtype, c->model.seq_len, c->model.vocab_size,
                     c->train.seed, shuffle, err, errlen);
}

static double evaluate(Model *m, DataLoader *eval, int batches, int mb, int *tokens, int *targets,
                       uint64_t seed, char *err, size_t errlen) {
    double ce = 0;
    int64_t valid = 0;
    int64_t n_inst = data_instances_per_epoch(eval);
    for (int b = 0; b < batches; b++) {
        int64_t g = ((int64_t)b * mb) % n_inst;
        if (data_read(eval, g, mb, tokens, targets, err, errlen)) return NAN;
        model_forward(m, tokens, targets, mix(seed, 0xe7a1 + b));
        ce += m->ce_sum;
        valid += m->n_valid;
    }
    return valid ? ce / valid : NAN;
}

static const char *train_usage =
    "usage: moecore train CONFIG.yaml [--resume] [--stop-after=N] [--section.key=value ...]\n"
    "  --resume        continue from the latest committed checkpoint in checkpoint.dir\n"
    "  --stop-after=N  run at most N steps in this process, save a checkpoint and exit\n"
    "                  (for jobs with a time limit; resume with --resume)\n"
    "  overrides  any config key, e.g. --train.steps=500 --optim.lr=1e-3\n";

int cmd_train(int argc, char **argv) {
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
        fputs(train_usage, argc < 1 ? stderr : stdout);
        return argc < 1 ? 2 : 0;
    }
    char err[1024];
    RunConfig cfg;
    run_config_defaults(&cfg);
    const char *config_path = argv[0];
    if (run_config_load_yaml(&cfg, config_path, err, sizeof err)) {
        fprintf(stderr, "moecore: error: %s\n", err);
        return 2;
    }
    int resume = 0;
    int64_t stop_after = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--resume")) { resume = 1; continue; }
        if (!strncmp(a, "--stop-after=", 13)) {
            char *end;
            stop_after = strtoll(a + 13, &end, 10);
            if (*end || stop_after <= 0) {
                fprintf(stderr, "moecore: error: --stop-after: expected a positive number of steps, got '%s'\n", a + 13);
                return 2;
            }
            continue;
        }
        const char *eq = strchr(a, '=');
        if (strncmp(a, "--", 2) || !eq) {
            fprintf(stderr, "moecore: error: argument '%s': expected --section.key=value or --resume\n%s", a, train_usage);
            return 2;
        }
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(eq - a - 2), a + 2);
        if (run_config_set(&cfg, key, eq + 1, err, sizeof err)) {
            fprintf(stderr, "moecore: error: command line: %s\n", err);
            return 2;
        }
    }
    if (run_config_validate(&cfg, 1, err, sizeof err)) {
        fprintf(stderr, "moecore: error: %s: %s\n", config_path, err);
        return 2;
    }
    if (cfg.device.type != 0) {
        fprintf(stderr, "moecore: error: device.type: cuda is not compiled into this build (only cpu)\n");
        return 2;
    }
    const TrainSection *t = &cfg.train;
    int T = cfg.model.seq_len, G = t->global_batch, MB = t->micro_batch, M = G / MB;

    // data: every file is checked before anything is written
    DataLoader *train = open_loader(&cfg, &cfg.data.train, &cfg.data.train_weights, 1, err, sizeof err);
    if (!train) { fprintf(stderr, "moecore: error: data.train: %s\n", err); return 2; }
    DataLoader *eval = NULL;
    if (cfg.data.eval.n) {
        eval = open_loader(&cfg, &cfg.data.eval, NULL, 0, err, sizeof err);
        if (!eval) { fprintf(stderr, "moecore: error: data.eval: %s\n", err); data_close(train); return 2; }
    }
    if (cfg.data.validate) {
        printf("validating every token of the data ...\n");
        if (data_validate_all(train, err, sizeof err) || (eval && data_validate_all(eval, err, sizeof err))) {
            fprintf(stderr, "moecore: error: %s\n", err);
            return 2;
        }
    }

    Model m;
    if (model_init(&m, &cfg.model, &ops_cpu, err, sizeof err)) {
        fprintf(stderr, "moecore: error: %s\n", err);
        return 2;
    }
    model_init_weights(&m, t->seed);
    model_alloc_acts(&m, MB, T);
    AdamW opt;
    adamw_init(&opt, &cfg.optim, &m);
    TrainState st;
    memset(&st, 0, sizeof st);
    st.seed = t->seed;

    if (resume) {
        char path[CFG_PATH_MAX + 64];
        int found = ckpt_find_latest(cfg.checkpoint.dir, path, sizeof path, err, sizeof err);
        if (found < 0) { fprintf(stderr, "moecore: error: %s\n", err); return 2; }
        if (found == 0) {
            printf("resume: no committed checkpoint in %s, starting from step 0\n", cfg.checkpoint.dir);
        } else {
            if (ckpt_load(path, &m, &opt, &st, err, sizeof err)) {
                fprintf(stderr, "moecore: error: cannot resume: %s\n", err);
                return 2;
            }
            if (st.seed != t->seed) printf("resume: note: the checkpoint's seed %llu differs from train.seed %llu; using the checkpoint's\n",
                                           (unsigned long long)st.seed, (unsigned long long)t->seed);
            printf("resume: loaded %s (step %lld, %lld tokens seen)\n", path, (long long)st.step, (long long)st.tokens_seen);
        }
    }

    // the first batch is read once before anything is written, so that a bad
    // token there (the common case of a wrong vocab or dtype) leaves no trace
    int *tokens = mallocCheck((size_t)G * T * sizeof(int)), *targets = mallocCheck((size_t)G * T * sizeof(int));
    if (st.step < t->steps && data_read(train, st.data_position, G, tokens, targets, err, sizeof err)) {
        fprintf(stderr, "moecore: error: %s\n", err);
        return 2;
    }

    // only now, with a valid config, data and checkpoint, write anything
    if (mkdir_parents(cfg.logging.run_dir)) {
        fprintf(stderr, "moecore: error: cannot create logging.run_dir %s: %s\n", cfg.logging.run_dir, strerror(errno));
        return 2;
    }
    char *config_yaml = NULL;
    size_t config_len = 0;
    {
        FILE *mf = open_memstream(&config_yaml, &config_len);
        run_config_write_yaml(&cfg, mf);
        fclose(mf);
        char p[CFG_PATH_MAX + 32];
        snprintf(p, sizeof p, "%s/config.yaml", cfg.logging.run_dir);
        FILE *f = fopen(p, "w");
        if (!f || fputs(config_yaml, f) < 0 || fclose(f)) {
            fprintf(stderr, "moecore: error: cannot write %s: %s\n", p, strerror(errno));
            return 2;
        }
    }
    char metrics_path[CFG_PATH_MAX + 32];
    snprintf(metrics_path, sizeof metrics_path, "%s/metrics.jsonl", cfg.logging.run_dir);
    FILE *metrics = fopen(metrics_path, st.step > 0 ? "a" : "w");
    if (!metrics) { fprintf(stderr, "moecore: error: cannot open %s: %s\n", metrics_path, strerror(errno)); return 2; }

    double peak = cfg.device.peak_tflops;
    const char *peak_name = "device.peak_tflops";
    if (peak <= 0) { peak = measure_cpu_peak_tflops(); peak_name = "measured CPU SGEMM 512^3"; }
    double fpt = flops_per_token(&m.cfg);
    char desc[1024];
    data_describe(train, desc, sizeof desc);
    printf("moecore train: %s\n", config_path);
    printf("model: %zu parameters (%zu dense, %zu expert), %d layers (%d MoE, E=%d top-%d), vocab %d (padded %d)\n",
           param_total(&m.table), m.table.class_numel[CLASS_DENSE], m.table.class_numel[CLASS_EXPERT],
           m.cfg.n_layers, m.n_moe, m.cfg.n_experts, m.cfg.top_k, m.cfg.vocab_size, m.cfg.padded_vocab);
    printf("data: %s\n", desc);
    printf("batch: %d x %d tokens per step (%d micro-batches of %d), %lld steps; %.3g FLOP/token; MFU denominator %.3f TFLOP/s (%s)\n",
           G, T, M, MB, (long long)t->steps, fpt, peak, peak_name);
    printf("run dir: %s, checkpoints: %s\n", cfg.logging.run_dir, cfg.checkpoint.dir);
    fflush(stdout);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    int E = m.cfg.n_experts, L = m.n_moe;
    double *lb_step = mallocCheck((L + 1) * sizeof(double)), *z_step = mallocCheck((L + 1) * sizeof(double));
    double *maxload = mallocCheck((L + 1) * sizeof(double));
    int *gflags = mallocCheck((L + 1) * sizeof(int));
    Gerrymander gm;
    gerrymander_init(&gm, L, cfg.logging.gerrymander_window);
    int rc = 0;
    double t_start = now_s(), t_window = t_start;
    int64_t first_step = st.step, window_tokens = 0;

    while (st.step < t->steps && !stop_signal) {
        double t0 = now_s();
        int64_t step = st.step;
        double lr = lr_at(t, cfg.optim.lr, step);
        // the whole global batch is read first: the CE normalisation needs its
        // count of valid targets before the first backward
        if (data_read(train, st.data_position, G, tokens, targets, err, sizeof err)) {
            fprintf(stderr, "moecore: error: step %lld: %s\n", (long long)step + 1, err);
            rc = 2;
            break;
        }
        int64_t valid = 0;
        for (size_t i = 0; i < (size_t)G * T; i++) valid += targets[i] >= 0;
        model_zero_grads(&m);
        model_begin_step(&m);
        double ce_sum = 0;
        for (int l = 0; l < L; l++) lb_step[l] = z_step[l] = 0;
        for (int mi = 0; mi < M; mi++) {
            size_t off = (size_t)mi * MB * T;
            model_forward(&m, tokens + off, targets + off, mix(st.seed, (uint64_t)step * 1024 + mi));
            model_backward(&m, valid ? 1.0f / (float)valid : 0.0f, 1.0f / M);
            ce_sum += m.ce_sum;
            for (int l = 0; l < L; l++) { lb_step[l] += m.lb[l] / M; z_step[l] += m.z[l] / M; }
        }
        double ce = valid ? ce_sum / valid : 0, aux = 0, lb_raw = 0, z_raw = 0;
        for (int l = 0; l < L; l++) {
            aux += m.cfg.lb_coef * lb_step[l] + m.cfg.z_coef * z_step[l];
            lb_raw += lb_step[l];
            z_raw += z_step[l];
        }
        double loss = ce + aux;
        // (data parallelism: grads reduce here)
        double gnorm = grad_norm(&m);
        int skipped = train_should_skip(&st, t, loss, gnorm);
        double clip_scale = 1.0;
        if (!skipped) {
            if (t->clip_grad > 0 && gnorm > t->clip_grad) clip_scale = t->clip_grad / (gnorm + 1e-6);
            adamw_step(&opt, &m, (float)lr, (float)clip_scale);
            train_push_history(&st, t->skip_window, loss, gnorm);
        } else {
            st.skipped_steps++;
        }
        model_end_step(&m);
        st.step++;
        st.data_position += G;
        st.tokens_seen += (int64_t)G * T;
        window_tokens += (int64_t)G * T;
        double dt = now_s() - t0;

        // metrics: one JSON object per step
        double tps = (double)G * T / dt, tflops = tps * fpt / 1e12;
        json_object *o = json_object_new_object();
        json_object_object_add(o, "step", json_object_new_int64(st.step));
        json_object_object_add(o, "loss", json_object_new_double(loss));
        json_object_object_add(o, "ce", json_object_new_double(ce));
        json_object_object_add(o, "lb", json_object_new_double(m.cfg.lb_coef * lb_raw));
        json_object_object_add(o, "lb_raw", json_object_new_double(lb_raw));
        json_object_object_add(o, "z_loss", json_object_new_double(m.cfg.z_coef * z_raw));
        json_object_object_add(o, "z_loss_raw", json_object_new_double(z_raw));
        json_object_object_add(o, "lr", json_object_new_double(lr));
        json_object_object_add(o, "grad_norm", json_object_new_double(gnorm));
        json_object_object_add(o, "clip_scale", json_object_new_double(clip_scale));
        json_object_object_add(o, "skipped", json_object_new_boolean(skipped));
        json_object_object_add(o, "skipped_total", json_object_new_int64(st.skipped_steps));
        json_object_object_add(o, "tokens", json_object_new_int64(st.tokens_seen));
        json_object_object_add(o, "tokens_per_s", json_object_new_double(tps));
        json_object_object_add(o, "tokens_per_s_device", json_object_new_double(tps));
        json_object_object_add(o, "tflops_per_device", json_object_new_double(tflops));
        json_object_object_add(o, "mfu", json_object_new_double(tflops / peak));
        json_object_object_add(o, "mfu_denominator_tflops", json_object_new_double(peak));
        json_object_object_add(o, "peak_mem_mib", json_object_new_double(peak_rss_mib()));
        json_object_object_add(o, "step_time_s", json_object_new_double(dt));
        json_object *layers = json_object_new_array();
        double worst_max = 0;
        for (int l = 0; l < L; l++) {
            ExpertLoad el;
            expert_load_stats(m.step_counts + (size_t)l * E, E, &el);
            maxload[l] = el.max_over_mean;
            if (el.max_over_mean > worst_max) worst_max = el.max_over_mean;
            json_object *lo = json_object_new_object();
            json_object_object_add(lo, "lb_raw", json_object_new_double(lb_step[l]));
            json_object_object_add(lo, "z_raw", json_object_new_double(z_step[l]));
            json_object_object_add(lo, "load_max_over_mean", json_object_new_double(el.max_over_mean));
            json_object_object_add(lo, "load_min_over_mean", json_object_new_double(el.min_over_mean));
            json_object_object_add(lo, "load_cv", json_object_new_double(el.cv));
            json_object_object_add(lo, "dead_experts", json_object_new_int(el.dead));
            json_object_object_add(lo, "dropped_fraction", json_object_new_double(0.0));
            json_object_array_add(layers, lo);
        }
        int flagged = L ? gerrymander_push(&gm, lb_step, maxload, gflags) : 0;
        for (int l = 0; l < L; l++)
            json_object_object_add(json_object_array_get_idx(layers, l), "gerrymander_flag", json_object_new_boolean(gflags[l]));
        json_object_object_add(o, "moe_layers", layers);
        json_object_object_add(o, "gerrymander_flag", json_object_new_boolean(flagged > 0));

        int do_eval = eval && t->eval_interval > 0 && (st.step % t->eval_interval == 0 || st.step == t->steps);
        if (do_eval) {
            double ev = evaluate(&m, eval, t->eval_batches, MB, tokens, targets, st.seed, err, sizeof err);
            if (isnan(ev)) { fprintf(stderr, "moecore: error: eval: %s\n", err); rc = 2; json_object_put(o); break; }
            json_object_object_add(o, "eval_ce", json_object_new_double(ev));
            printf("eval  step %lld | eval ce %.4f\n", (long long)st.step, ev);
        }
        fprintf(metrics, "%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
        fflush(metrics);
        json_object_put(o);

        if (st.step % cfg.logging.log_interval == 0 || st.step == t->steps || st.step == first_step + 1) {
            double now = now_s(), wt = now - t_window;
            double avg_tps = wt > 0 ? window_tokens / wt : tps;
            char eta[32];
            fmt_duration(eta, sizeof eta, (now - t_start) / (st.step - first_step) * (t->steps - st.step));
            printf("step %5lld/%lld | loss %.4f | ce %.4f | lb %.4f | z %.4f | lr %.2e | gnorm %.3f%s | "
                   "%.0f tok/s | %.3f TFLOP/s | MFU %.1f%% | load max/mean %.2f%s | ETA %s\n",
                   (long long)st.step, (long long)t->steps, loss, ce, lb_raw, z_raw, lr, gnorm,
                   skipped ? " SKIPPED" : "", avg_tps, avg_tps * fpt / 1e12, 100 * avg_tps * fpt / 1e12 / peak,
                   worst_max, flagged ? " GERRYMANDER?" : "", eta);
            fflush(stdout);
            t_window = now;
            window_tokens = 0;
        }
        int last = st.step == t->steps || (stop_after > 0 && st.step - first_step >= stop_after);
        if ((cfg.checkpoint.interval > 0 && st.step % cfg.checkpoint.interval == 0) || last || stop_signal) {
            if (ckpt_save(cfg.checkpoint.dir, &m, &opt, &st, config_yaml, cfg.checkpoint.keep, err, sizeof err)) {
                fprintf(stderr, "moecore: error: checkpoint: %s\n", err);
                rc = 2;
                break;
            }
            printf("checkpoint: saved step %lld to %s\n", (long long)st.step, cfg.checkpoint.dir);
            fflush(stdout);
        }
        if (last) break;
    }
    if (stop_signal && rc == 0) {
        // a signal before the first step of this process: save what we have
        if (ckpt_save(cfg.checkpoint.dir, &m, &opt, &st, config_yaml, cfg.checkpoint.keep, err, sizeof err)) {
            fprintf(stderr, "moecore: error: checkpoint: %s\n", err);
            rc = 2;
        }
        printf("stopped by signal %d after step %lld; checkpoint committed\n", (int)stop_signal, (long long)st.step);
    } else if (rc == 0) {
        char d[32];
        fmt_duration(d, sizeof d, now_s() - t_start);
        printf("%s: step %lld of %lld, %lld tokens, %s\n", st.step < t->steps ? "stopped (--stop-after)" : "done",
               (long long)st.step, (long long)t->steps, (long long)st.tokens_seen, d);
    }
    fclose(metrics);
    free(config_yaml);
    free(tokens); free(targets); free(lb_step); free(z_step); free(maxload); free(gflags);
    gerrymander_free(&gm);
    adamw_free(&opt);
    model_free(&m);
    data_close(train);
    if (eval) data_close(eval);
    run_config_free(&cfg);
    return rc;
}
