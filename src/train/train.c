// `moecore train`: the training loop of one process (of several under
// mpirun). Read it top-down from train_run: parse_args, train_setup (backend,
// data, model, optimizer, resume, run directory, header), train_loop (per
// step: train_step, step_record, eval, console line, checkpoint), and
// train_teardown. The order of work in one step follows DESIGN.md §2.
#include "train/train.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "ckpt/hf_tokenizer.h"
#include "data/data.h"
#include "dist/comm.h"
#include "dist/ddp.h"
#include "dist/launch.h"
#include "dist/mesh.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "train/metrics.h"
#include "train/trainer.h"
#include "util/check.h"
#include "util/clock.h"
#include "util/fs.h"
#ifdef MOECORE_CUDA
#include "ops/cuda/ops_cuda.h"
#endif

static volatile sig_atomic_t stop_signal = 0;
static void on_signal(int sig) { stop_signal = sig; }


double flops_per_token(const ModelConfig *c) {
    return 6.0 * model_active_matmul_params(c) +
           6.0 * c->n_layers * (double)c->seq_len * model_q_dim(c);
}




// Skip-step: a step whose loss or grad norm exceeds mean + k sigma of the
// last `window` accepted steps is not applied. Needs half a window of history.
// A NaN or Inf loss or grad norm is skipped whatever the window.
int train_should_skip(const TrainState *s, const TrainSection *t, double loss, double gnorm) {
    if (!isfinite(loss) || !isfinite(gnorm)) return 1; // always, also with skip-step off
    if (t->skip_window <= 0 || s->hist_n < t->skip_window / 2 || s->hist_n < 2) return 0;
    const double *series[2] = {s->hist_loss, s->hist_gnorm};
    double value[2] = {loss, gnorm};
    for (int k = 0; k < 2; k++) {
        double mean = 0, var = 0;
        for (int i = 0; i < s->hist_n; i++) mean += series[k][i];
        mean /= s->hist_n;
        for (int i = 0; i < s->hist_n; i++) var += (series[k][i] - mean) * (series[k][i] - mean);
        double sd = sqrt(var / (s->hist_n - 1));
        if (value[k] > mean + t->skip_sigmas * sd) return 1;
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

uint64_t train_micro_seed(const Trainer *tr, int64_t step, int mi) {
    uint64_t micro = (uint64_t)tr->mesh.dp_rank * tr->M + mi;
    return mix(tr->st.seed, (uint64_t)step * 1024 + micro);
}

// Synthetic data (data.synthetic): instance g of the stream is uniformly
// random tokens keyed by (seed, g), with the usual shifted targets.
static void synthetic_instances(uint64_t seed, int64_t g_start, int count, int T, int vocab, int *tokens,
                                int *targets) {
    for (int i = 0; i < count; i++) {
        uint64_t s = mix(seed, (uint64_t)(g_start + i));
        for (int t = 0; t < T; t++) tokens[(size_t)i * T + t] = (int)(mix(s, (uint64_t)t) % (uint64_t)vocab);
        for (int t = 0; t < T; t++) targets[(size_t)i * T + t] = t < T - 1 ? tokens[(size_t)i * T + t + 1] : -1;
    }
}

// The count instances from global index g_start of the train stream.
static int read_instances(const RunConfig *cfg, DataLoader *d, int64_t g_start, int count, int *tokens,
                          int *targets, char *err, size_t errlen) {
    if (!d) {
        synthetic_instances(cfg->train.seed, g_start, count, cfg->model.seq_len, cfg->model.vocab_size, tokens, targets);
        return 0;
    }
    return data_read(d, g_start, count, tokens, targets, err, errlen);
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

// Eval CE over the eval set into *ce (NaN or Inf when the model diverged):
// each data-parallel rank takes every dp-th micro-batch; sums are reduced
// over the dp group. 0, or -1 with a message after a data error.
static int evaluate(Trainer *tr, DataLoader *eval, const Mesh *mesh, int batches, int mb, int *tokens,
                    int *targets, uint64_t seed, double *ce, char *err, size_t errlen) {
    Model *m = &tr->m;
    double acc[2] = {0, 0}; // CE sum, valid targets
    int64_t n_inst = data_instances_per_epoch(eval);
    int rounds = (batches + mesh->dp - 1) / mesh->dp;
    model_fp8_refresh(m); // the weights of the last optimizer step
    for (int i = 0; i < rounds; i++) {
        int b = i * mesh->dp + mesh->dp_rank;
        int64_t g = ((int64_t)(b < batches ? b : 0) * mb) % n_inst;
        if (data_read(eval, g, mb, tokens, targets, err, errlen)) return -1;
        // every rank runs the forward (expert parallelism needs all of them);
        // with pipeline stages the last one has the CE, the others count 0
        if (tr->pipe.on) pipeline_eval(tr, tokens, targets, mix(seed, 0xe7a1 + b));
        else model_forward(m, tokens, targets, mix(seed, 0xe7a1 + b));
        if (b < batches) { acc[0] += m->ce_sum; acc[1] += m->n_valid; }
    }
    comm_allreduce(tr->pipe.on ? mesh->world : mesh->dp_comm, acc, 2, COMM_F64);
    if (!(acc[1] > 0)) return errorf(err, errlen, "the eval set has no targets to score");
    *ce = acc[0] / acc[1];
    return 0;
}

static const char *train_usage =
    "usage: moecore train CONFIG.yaml [--resume | --overwrite] [--stop-after=N] [--section.key=value ...]\n"
    "  --resume        continue from the latest committed checkpoint in checkpoint.dir\n"
    "  --overwrite     start a new run where checkpoint.dir holds an earlier run's checkpoints:\n"
    "                  deletes them (a fresh run is refused there without it)\n"
    "  --stop-after=N  run at most N steps in this process, save a checkpoint and exit\n"
    "                  (for jobs with a time limit; resume with --resume)\n"
    "  --print-schedule  print the pipeline schedule's table (parallel.pp > 1) at start\n"
    "  overrides       any config key, e.g. --train.steps=500 --optim.lr=1e-3\n"
    "Several processes: mpirun -np N moecore train CONFIG --parallel.dp=N [--parallel.ep=E]\n";

int train_rank0 = 1, train_world_size = 1;
static int train_rank = 0;
#define SAY(...) do { if (train_rank0) { printf(__VA_ARGS__); fflush(stdout); } } while (0)

// An error on this rank ends the job: alone, return the exit code; in a
// parallel run, abort every rank so that none waits forever in a collective.
static int fatal(const char *fmt, const char *msg) {
    fprintf(stderr, "moecore: error: ");
    fprintf(stderr, fmt, msg);
    fprintf(stderr, "\n");
    if (train_world_size > 1) {
        fprintf(stderr, "moecore: rank %d failed; ending the job\n", train_rank);
        comm_abort(2);
    }
    return 2;
}



// Reads the config and the command line. Returns -1 to go on, else the exit code.
static int parse_args(Trainer *tr, int argc, char **argv) {
    char err[2400];
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
        if (train_rank0) fputs(train_usage, argc < 1 ? stderr : stdout);
        return argc < 1 ? 2 : 0;
    }
    RunConfig *cfg = &tr->cfg;
    tr->config_path = argv[0];
    // config errors are the same on every rank: each exits with the message
    // (printed once), no abort needed
    if (run_config_load_yaml(cfg, tr->config_path, err, sizeof err)) {
        if (train_rank0) fprintf(stderr, "moecore: error: %s\n", err);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--resume")) { tr->resume = 1; continue; }
        if (!strcmp(a, "--overwrite")) { tr->overwrite = 1; continue; }
        if (!strcmp(a, "--print-schedule")) { tr->print_schedule = 1; continue; }
        if (!strncmp(a, "--stop-after=", 13)) {
            char *end;
            tr->stop_after = strtoll(a + 13, &end, 10);
            if (*end || tr->stop_after <= 0) {
                if (train_rank0) fprintf(stderr, "moecore: error: --stop-after: expected a positive number of steps, got '%s'\n", a + 13);
                return 2;
            }
            continue;
        }
        const char *eq = strchr(a, '=');
        if (strncmp(a, "--", 2) || !eq) {
            if (train_rank0) fprintf(stderr, "moecore: error: argument '%s': expected --section.key=value or --resume\n%s", a, train_usage);
            return 2;
        }
        if (run_config_override(cfg, a, err, sizeof err)) {
            if (train_rank0) fprintf(stderr, "moecore: error: %s\n", err);
            return 2;
        }
    }
    if (tr->resume && tr->overwrite) {
        if (train_rank0) fprintf(stderr, "moecore: error: --resume and --overwrite exclude each other: --resume continues "
                                         "from the checkpoints in checkpoint.dir, --overwrite deletes them\n");
        return 2;
    }
    // CPU ranks talk over MPI: torchrun's or srun's variables alone are not a
    // job (every rank says so: none of them has a communicator)
    if (cfg->device.type != 1 && tr->launch.kind != LAUNCH_SINGLE && !comm_is_mpi() && tr->launch.world > 1) {
        fprintf(stderr, "moecore: error: started by %s as rank %d of %d, but CPU ranks (device.type: cpu) "
                "communicate over MPI: start them with mpirun (or srun with MPI), or use device.type: cuda\n",
                launch_kind_name(tr->launch.kind), tr->launch.rank, tr->launch.world);
        return 2;
    }
    if (run_config_validate(cfg, train_world_size, err, sizeof err)) {
        if (train_rank0) fprintf(stderr, "moecore: error: %s\n", err);
        return 2;
    }
    return -1;
}

// The op table of the configured device, with its kernel choices applied.
// Returns -1 to go on, else the exit code.
static int pick_backend(Trainer *tr) {
    const RunConfig *cfg = &tr->cfg;
    tr->ops = &ops_cpu;
    if (tr->opt.timed_ops && cfg->device.type != 1) {
        if (train_rank0) fprintf(stderr, "moecore: error: bench --breakdown needs the cuda device (device.type: cuda)\n");
        return 2;
    }
    if (cfg->device.type != 1) return -1;
#ifdef MOECORE_CUDA
    int launched = tr->launch.kind != LAUNCH_SINGLE;
    // a launched GPU job: one GPU per process, NCCL for every collective
    // (the device is chosen before anything else touches CUDA); or MPI with
    // device buffers staged through the host (MOECORE_COMM=mpi, comm.h),
    // which lets several ranks share one GPU to check the runtimes
    if (launched) {
        char err[1200];
        const char *via = getenv("MOECORE_COMM");
        int mpi = via && !strcmp(via, "mpi");
        if (via && *via && !mpi && strcmp(via, "nccl"))
            return fatal("MOECORE_COMM=%s: expected nccl (the default) or mpi", via);
        Comm *w = mpi ? comm_mpi_device_world(&tr->launch, err, sizeof err)
                      : comm_nccl_world(&tr->launch, cfg->parallel.timeout_s, err, sizeof err);
        if (!w) return fatal("%s", err);
        tr->world = w;
        SAY("communicator: %s, launched by %s\n", comm_nccl_describe(), launch_kind_name(tr->launch.kind));
    }
    tr->ops = tr->opt.timed_ops ? &ops_cuda_timed : &ops_cuda;
    cuda_configure(&cfg->device.cuda);
    // what the kernels cannot run is refused here, before any allocation
    char msg[600], err[1800];
    if (model_config_check_backend(&cfg->model, tr->ops, cfg->train.micro_batch, cfg->parallel.ep, msg, sizeof msg)) {
        run_config_blame(cfg, msg, err, sizeof err);
        if (train_rank0) fprintf(stderr, "moecore: error: %s\n", err);
        return 2;
    }
    // what the CUDA context takes before our first allocation (the memory
    // plan's stated allowance is checked against it: train/memory.h)
    tr->start_dev_mib = tr->ops->device_memory_used() / 1048576.0;
    return -1;
#else
    if (train_rank0) fprintf(stderr, "moecore: error: device.type: cuda is not compiled into this build (nvcc was not found when it was built)\n");
    return 2;
#endif
}


// The token that ends a document for data.doc_mask: data.eos_id.
static int doc_eos_id(const RunConfig *c) { return c->data.eos_id; }

// Model, data-parallel runtime, optimizer and the resumed state. Returns -1
// to go on, else the exit code.
static int setup_model(Trainer *tr) {
    char err[2400];
    const RunConfig *cfg = &tr->cfg;
    const TrainSection *t = &cfg->train;
    const Ops *ops = tr->ops;
    Model *m = &tr->m;
    // pipeline parallelism: the split and this rank's stage, before the model
    if (pipeline_plan(tr, tr->print_schedule, err, sizeof err)) return fatal("%s", err);
    ModelParallel par = {.ep_rank = tr->mesh.ep_rank, .ep_size = tr->mesh.ep, .ep_comm = tr->mesh.ep_comm,
                         .dp_comm = tr->mesh.dp_comm, .ep_backend = run_config_ep_backend(cfg),
                         .ep_recv_factor = cfg->parallel.ep_recv_factor,
                         .stage = tr->pipe.on ? &tr->pipe.stage : NULL};
    if (model_init_parallel(m, &cfg->model, ops, &par, err, sizeof err)) return fatal("%s", err);
    // every rank draws the same full model and keeps its slice of the
    // experts (and, in a pipeline stage, its tensors: the entries' global_index)
    if (tr->mesh.ep == 1) {
        model_init_weights(m, t->seed);
    } else {
        Model full;
        if (model_init(&full, &cfg->model, &ops_cpu, err, sizeof err)) return fatal("%s", err);
        model_init_weights(&full, t->seed);
        for (int i = 0; i < m->store.table.n; i++) {
            const ParamEntry *e = &m->store.table.entries[i];
            ops->to_device(param_store_main(&m->store, i), param_store_main(&full.store, e->global_index) + param_global_offset(e),
                           e->numel * sizeof(float));
        }
        model_free(&full);
        param_store_sync_weights(&m->store);
    }
    m->recompute = cfg->train.recompute;
    m->recompute_every = cfg->train.recompute_every;
    m->recompute_first = cfg->train.recompute_first;
    m->recompute_norms = cfg->train.recompute_norms;
    m->recompute_attention = cfg->train.recompute_attention;
    m->recompute_swiglu = cfg->train.recompute_swiglu;
    m->defer_wgrad = tr->pipe.on && tr->pipe.sched.kind == PP_ZB1; // W runs the deferred weight grads
    m->doc_mask = cfg->data.doc_mask;
    m->doc_eos = doc_eos_id(cfg);
    if (t->precision == PRECISION_FP8) {
        if (model_set_fp8(m, err, sizeof err)) return fatal("%s", err);
        if (cfg->fp8.wgrad == FP8_WGRAD_FP8) {
            if (!m->ops->fp8_fake_quantize_tokens)
                return fatal("fp8.wgrad: fp8: the %s backend cannot quantise the weight-grads' operands along the "
                             "tokens (the CPU backend can); use fp8.wgrad: bf16", m->ops->name);
            m->fp8_wgrad = cfg->device.type == 1 && cfg->device.cuda.fp8_wgrad_gemm ? 2 : 1; // 2: the FP8 GEMM, asked
        }
        int dense = cfg->fp8.gemms == FP8_GEMMS_EXPERTS_DENSE;
        if (dense && model_set_fp8_dense(m, tr->MB * tr->T, err, sizeof err)) return fatal("%s", err);
        SAY("precision: fp8 (block128: E4M3, FP32 scales per 1x128 activation tile and 128x128 weight block) in the "
            "experts' grouped GEMMs' forward and data-grads%s%s; %s%sthe router, attention and the LM head in "
            "the compute dtype (BF16 on GPUs); "
            "MFU stays against the dense BF16 peak\n",
            !m->fp8_wgrad ? "" : model_fp8_wgrad_gemm(m) ?
                           ", and their weight-grads (fp8.wgrad: fp8, one scale per 128 x 1 tile along each expert's "
                           "tokens, on the FP8 weight-grad GEMM)" :
                           ", and their weight-grads (fp8.wgrad: fp8, one scale per 128 x 1 tile along each expert's "
                           "tokens, fake-quantised for the compute-dtype weight-grad)",
            dense ? " and the dense GEMMs' (fp8.gemms: experts_dense: the attention projections q, k, v, o and the "
                    "dense and shared-expert MLPs; their weight-grads in the compute dtype)" : "",
            m->fp8_wgrad ? "" : "the experts' weight-grads, ", dense ? "" : "the dense GEMMs, ");
    }
    // DDP and the optimizer before the activations: the distributed
    // optimizer frees the whole FP32 main weights for its shard first, so
    // they never sit beside the arena (train/memory.h, the setup peak), and
    // the arena's receive buffers are sized from the memory really left
    ddp_init(&tr->ddp, &m->store, tr->mesh.dp_comm, tr->mesh.ep_dp_comm, tr->world, cfg->optim_sharded,
             (size_t)(cfg->parallel.bucket_mb * 1024 * 1024 / 4));
    if (cfg->optim_sharded) adamw_init_range(&tr->adamw, &cfg->optim, &m->store, tr->ddp.shard_begin, tr->ddp.shard_end);
    else adamw_init(&tr->adamw, &cfg->optim, &m->store);
    // the grad norm: the expert grads' share summed by the last backward's
    // weight-grads where nothing changes them after it (ddp_use_wgrad_slots;
    // MOECORE_GRAD_NORM=separate: a pass over them, as before)
    const char *gn = getenv("MOECORE_GRAD_NORM");
    size_t n_slots = !tr->pipe.on && ddp_expert_grads_final(&tr->ddp) && !(gn && !strcmp(gn, "separate"))
                         ? model_alloc_wgrad_slots(m) : 0;
    if (n_slots) {
        ddp_use_wgrad_slots(&tr->ddp, m->wgrad_slots, n_slots);
        SAY("grad norm: the expert grads' squares summed by the last backward's weight-grads (%zu slots)\n", n_slots);
    }
    model_alloc_slots(m, tr->MB, tr->T, tr->pipe.on ? tr->pipe.n_slots : 1);
    if (m->ep_note[0]) SAY("%s%s%s\n", m->ep_note, m->sym ? "; symmetric memory: " : "", m->sym ? symmem_kind(m->sym) : "");
    pipeline_alloc(tr);
    tr->layout.world = tr->world;
    for (int c = 0; c < N_CLASSES; c++) {
        tr->layout.own_begin[c] = tr->ddp.shard_begin[c];
        tr->layout.own_end[c] = tr->ddp.shard_end[c];
    }
    memset(&tr->st, 0, sizeof tr->st);
    tr->st.seed = t->seed;
    if (tr->resume) {
        char path[CFG_PATH_MAX + 64];
        int found = ckpt_find_latest(cfg->checkpoint.dir, path, sizeof path, err, sizeof err);
        if (found < 0) return fatal("%s", err);
        if (found == 0) {
            SAY("resume: no committed checkpoint in %s, starting from step 0\n", cfg->checkpoint.dir);
        } else {
            if (ckpt_load(path, &m->cfg, &m->store, &tr->adamw, &tr->st, err, sizeof err)) return fatal("cannot resume: %s", err);
            snprintf(tr->resumed, sizeof tr->resumed, "%s", path);
            tr->saved_step = tr->st.step;
            if (tr->st.seed != t->seed)
                SAY("resume: note: the checkpoint's seed %llu differs from train.seed %llu; using the checkpoint's\n",
                    (unsigned long long)tr->st.seed, (unsigned long long)t->seed);
            SAY("resume: loaded %s (step %lld, %lld tokens seen)\n", path, (long long)tr->st.step,
                (long long)tr->st.tokens_seen);
        }
    }
    return -1;
}

// A run's claim on checkpoint.dir (README "Run directories"): a fresh run
// does not start beside committed checkpoints (its own would mix with them,
// and pruning would delete theirs) unless --overwrite; a resumed run goes on
// from the newest one, which must still be the one it loaded (tr->resumed).
// Rank 0 looks. Early (before the lock), a directory that cannot be read is
// left to claim_outputs, which names the key. Returns -1 to go on, else the
// exit code.
static int check_checkpoint_dir(const Trainer *tr, int early) {
    char err[2400], latest[CFG_PATH_MAX + 64] = "", msg[2 * CFG_PATH_MAX + 600];
    const char *dir = tr->cfg.checkpoint.dir;
    if (!train_rank0 || tr->overwrite) return -1;
    int found = ckpt_find_latest(dir, latest, sizeof latest, err, sizeof err);
    if (found < 0) return early ? -1 : fatal("%s", err);
    if (!tr->resume && found) {
        snprintf(msg, sizeof msg, "checkpoint.dir %s already holds committed checkpoints of a run (newest: %s); "
                 "continue that run with --resume, or delete them and start a new run with --overwrite",
                 dir, strrchr(latest, '/') + 1);
        return fatal("%s", msg);
    }
    if (tr->resume && strcmp(latest, tr->resumed)) {
        snprintf(msg, sizeof msg, "checkpoint.dir %s changed while this run was loading (newest now %s, loaded %s): "
                 "another trainer wrote it; start again with --resume", dir, found ? latest : "none",
                 tr->resumed[0] ? tr->resumed : "none");
        return fatal("%s", msg);
    }
    return -1;
}

// The lock file of a run's directories (fs_lock_file: held while the
// trainer runs, gone with the process).
#define RUN_LOCK_FILE "moecore.lock"

// Before anything is written (rank 0): logging.run_dir and, when the run
// saves checkpoints, checkpoint.dir exist and take files, each is locked
// for this trainer, the checkpoint directory suits the run, and
// --overwrite has cleared it. Returns -1 to go on, else the exit code.
static int claim_outputs(Trainer *tr) {
    char err[2400], msg[2 * CFG_PATH_MAX + 3000];
    const RunConfig *cfg = &tr->cfg;
    int saves = cfg->checkpoint.interval > 0 || cfg->checkpoint.save_final;
    const char *dirs[2] = {cfg->logging.run_dir, cfg->checkpoint.dir}, *keys[2] = {"logging.run_dir", "checkpoint.dir"};
    for (int i = 0; i < 1 + saves; i++) {
        if (fs_mkdirs(dirs[i], 1, err, sizeof err)) {
            snprintf(msg, sizeof msg, "cannot create %s %s: %s", keys[i], dirs[i], err);
            return fatal("%s", msg);
        }
        char path[CFG_PATH_MAX + 32], holder[400];
        snprintf(path, sizeof path, "%s/" RUN_LOCK_FILE, dirs[i]);
        int fd = fs_lock_file(path, holder, sizeof holder, err, sizeof err);
        if (fd == -2) {
            snprintf(msg, sizeof msg, "%s %s is in use by another trainer (%s holds %s); wait for it to end, "
                     "or give this run another %s", keys[i], dirs[i], holder, path, keys[i]);
            return fatal("%s", msg);
        }
        if (fd == -1 && errno == ENOLCK) {
            SAY("warning: %s; running without the lock (the file system has none)\n", err);
        } else if (fd == -1) {
            snprintf(msg, sizeof msg, "%s %s is not writable: %s", keys[i], dirs[i], err);
            return fatal("%s", msg);
        }
        tr->lock_fd[i] = fd;
    }
    int rc = check_checkpoint_dir(tr, 0);
    if (rc >= 0) return rc;
    if (tr->overwrite) {
        int n;
        if (ckpt_remove_all(cfg->checkpoint.dir, &n, err, sizeof err)) return fatal("--overwrite: %s", err);
        SAY("overwrite: removed %d checkpoint directories from %s\n", n, cfg->checkpoint.dir);
    }
    return -1;
}

// The run directory: config.yaml and metrics.jsonl (rank 0), after
// claim_outputs. Returns -1 to go on, else the exit code.
static int open_run_dir(Trainer *tr) {
    char err[2400];
    const RunConfig *cfg = &tr->cfg;
    size_t config_len = 0;
    FILE *mf = open_memstream(&tr->config_yaml, &config_len);
    run_config_write_yaml(cfg, mf);
    fclose(mf);
    if (!train_rank0) return -1;
    int rc = claim_outputs(tr);
    if (rc >= 0) return rc;
    char p[CFG_PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/config.yaml", cfg->logging.run_dir);
    FILE *f = fopen(p, "w");
    if (!f || fputs(tr->config_yaml, f) < 0 || fclose(f)) {
        snprintf(err, sizeof err, "cannot write %s: %s", p, strerror(errno));
        return fatal("%s", err);
    }
    snprintf(p, sizeof p, "%s/metrics.jsonl", cfg->logging.run_dir);
    tr->metrics = fopen(p, tr->st.step > 0 ? "a" : "w");
    if (!tr->metrics) {
        snprintf(err, sizeof err, "cannot open %s: %s", p, strerror(errno));
        return fatal("%s", err);
    }
    if (cfg->logging.tensorboard && !(tr->tb = tfevents_open(cfg->logging.run_dir, err, sizeof err)))
        return fatal("logging.tensorboard: %s", err);
    return -1;
}


// Everything before the first step: backend, mesh, data, model, optimizer,
// resume, the first batch, the run directory. Nothing is written before the
// config, the data, the checkpoint and the first batch are known good.
// Returns -1 to go on, else the exit code.
static int train_setup(Trainer *tr) {
    char err[2400];
    int rc = pick_backend(tr);
    if (rc >= 0) return rc;
    const RunConfig *cfg = &tr->cfg;
    const TrainSection *t = &cfg->train;
    // a fresh run where checkpoints are is refused at once (again under the lock)
    if (!tr->resume && (rc = check_checkpoint_dir(tr, 1)) >= 0) return rc;
    mesh_init(&tr->mesh, tr->world, cfg->parallel.dp, cfg->parallel.ep, cfg->parallel.pp);
    tr->T = cfg->model.seq_len;
    tr->G = t->global_batch;
    tr->MB = t->micro_batch;
    tr->G_local = tr->G / tr->mesh.dp;
    tr->M = tr->G_local / tr->MB;
    tr->M_total = tr->G / tr->MB;

    // data: every file is checked before anything is written
    if (!cfg->data.synthetic) {
        tr->train = open_loader(cfg, &cfg->data.train, &cfg->data.train_weights, 1, err, sizeof err);
        if (!tr->train) return fatal("data.train: %s", err);
    }
    if (cfg->data.eval.n && !cfg->data.synthetic) {
        tr->eval = open_loader(cfg, &cfg->data.eval, NULL, 0, err, sizeof err);
        if (!tr->eval) return fatal("data.eval: %s", err);
    }
    if (cfg->data.tokenizer[0]) {
        HfTokenizerInfo tok;
        if (hf_tokenizer_read(cfg->data.tokenizer, cfg->data.eos_id, &tok, err, sizeof err) ||
            hf_tokenizer_check_vocab(cfg->data.tokenizer, &tok, cfg->model.vocab_size, err, sizeof err))
            return fatal("data.tokenizer: %s", err);
        SAY("tokenizer: %s, %d tokens, EOS %d %s\n", cfg->data.tokenizer, tok.vocab_size, cfg->data.eos_id,
            tok.eos_token[0] ? tok.eos_token : "(not one of its special tokens)");
    }
    if (cfg->data.validate) {
        SAY("validating every token of the data ...\n");
        if ((tr->train && data_validate_all(tr->train, err, sizeof err)) ||
            (tr->eval && data_validate_all(tr->eval, err, sizeof err)))
            return fatal("%s", err);
    }
    if ((rc = setup_model(tr)) >= 0) return rc;

    // the first batch is read once before anything is written, so that a bad
    // token there (the common case of a wrong vocab or dtype) leaves no trace
    tr->tokens = mallocCheck((size_t)tr->G_local * tr->T * sizeof(int));
    tr->targets = mallocCheck((size_t)tr->G_local * tr->T * sizeof(int));
    if (tr->st.step < t->steps &&
        read_instances(cfg, tr->train, tr->st.data_position + (int64_t)tr->mesh.dp_rank * tr->G_local, tr->G_local,
                       tr->tokens, tr->targets, err, sizeof err))
        return fatal("%s", err);

    // only now, with a valid config, data and checkpoint, write anything
    if ((rc = open_run_dir(tr)) >= 0) return rc;
    print_header(tr);

    int E = tr->E = tr->m.cfg.n_experts, L = tr->L = tr->m.n_moe;
    tr->red = mallocCheck((size_t)(4 + 2 * L + 2 * L) * sizeof(double)); // CE, aux, drops, dispatch (train_step)
    tr->lb_step = mallocCheck((L + 1) * sizeof(double));
    tr->z_step = mallocCheck((L + 1) * sizeof(double));
    tr->maxload = mallocCheck((L + 1) * sizeof(double));
    tr->counts_host = mallocCheck(((size_t)L * (E > 2 ? E : 2) + 1) * sizeof(float));
    tr->gflags = mallocCheck((L + 1) * sizeof(int));
    gerrymander_init(&tr->gm, L, cfg->logging.gerrymander_window);

    // CUDA graph of one micro-batch's forward + backward: its inputs are the
    // uploaded batch and fixed buffers, so one graph serves every micro-batch
    // (a different CE scale, from a batch with other masked targets, runs
    // uncaptured). Random routing reads its seeds from device memory, which
    // model_set_route_seed fills before each replay, and lb_global's token
    // count comes from its running counts on the device; with several ranks
    // lb_global reduces its counts in the forward, and DDP hooks need the
    // host: those run uncaptured.
    // With several ranks the step captures when nothing in forward and
    // backward talks to the host: no expert dispatch, or the symmetric one
    // (the all-to-all's split sizes pass through the host).
    // Staged MPI (MOECORE_COMM=mpi) waits on the host inside a call: no graphs.
    tr->use_graph = cfg->device.cuda_graph && tr->ops->capture_begin && !comm_stages_device() &&
                    (train_world_size == 1 || tr->m.par.ep_size == 1 || tr->m.ep_sym) &&
                    (train_world_size == 1 || !tr->m.cfg.lb_global);
    if (tr->ops->capture_begin) SAY("cuda graph: %s\n", tr->use_graph ? "on" : "off");
    return -1;
}

// One micro-batch's forward + backward: replayed from the CUDA graph when
// there is one, captured on the second micro-batch of its kind in the run
// (every lazy allocation has happened by then), else launched op by op.
// With data.doc_mask a micro-batch with document boundaries and one without
// run different attention kernels, and a step's first backward writes the
// expert grads (=) where the later ones add (+=): a graph each, captured
// alike; so does the step's last, where it also sums the expert grads'
// squares for the grad norm (where it has the slots, Model.wgrad_slots).
static void micro_batch(Trainer *tr, uint64_t route_seed, float ce_scale, int last) {
    Model *m = &tr->m;
    const Ops *ops = tr->ops;
    char err[512];
    m->wgrad_slots_on = last && m->wgrad_slots;
    int g = m->batch_docs + 2 * (m->expert_grads_unset != 0) + 4 * m->wgrad_slots_on;
    model_set_route_seed(m, route_seed); // before a capture or replay, which only read it
    m->ce_fused_scale = ce_scale;        // the forward writes the dlogits (model.h)
    if (tr->use_graph && tr->graph[g] && ce_scale == tr->graph_scale[g]) {
        ops->graph_launch(tr->graph[g]);
        m->expert_grads_unset = 0; // what model_backward does on the host
    } else if (tr->use_graph && tr->graph_tries[g] == 1) {
        tr->graph_tries[g]++;
        ops->capture_begin();
        model_forward_async(m, route_seed);
        model_backward(m, ce_scale, 1.0f / tr->M_total);
        tr->graph[g] = ops->capture_end(err, sizeof err);
        if (tr->graph[g]) {
            tr->graph_scale[g] = ce_scale;
            SAY("cuda graph: captured a micro-batch's forward + backward (%s backward%s%s)\n",
                g & 2 ? "a step's first" : "a later", g & 4 ? ", the step's last" : "",
                g & 1 ? ", documents" : "");
            ops->graph_launch(tr->graph[g]);
        } else {
            SAY("cuda graph: %s; running uncaptured\n", err);
            tr->use_graph = 0;
            model_forward_async(m, route_seed);
            model_backward(m, ce_scale, 1.0f / tr->M_total);
        }
    } else {
        if (tr->use_graph && !tr->graph[g]) tr->graph_tries[g]++;
        model_forward_async(m, route_seed);
        model_backward(m, ce_scale, 1.0f / tr->M_total);
    }
    m->ce_fused_scale = 0;
    m->wgrad_slots_on = 0;
    model_count_micro_batch(m);
}

// One optimizer step (DESIGN.md §2): this rank's slice of the batch, the
// micro-batches' forward + backward, grad reduction, the step's statistics
// over the data-parallel group, clipping, skip-step and AdamW. Returns 0,
// or the exit code after a data error.
static int train_step(Trainer *tr, StepResult *r) {
    char err[2400];
    const RunConfig *cfg = &tr->cfg;
    const TrainSection *t = &cfg->train;
    Model *m = &tr->m;
    TrainState *st = &tr->st;
    int L = tr->L, E = tr->E, T = tr->T, M = tr->M, MB = tr->MB, M_total = tr->M_total;
    double t0 = clock_now_s();
    int64_t step = r->step = st->step;
    double lr = r->lr = lr_at(t, cfg->optim.lr, step);
    // this rank's slice of the global batch, read whole: the CE
    // normalisation needs the global count of valid targets first
    if (read_instances(cfg, tr->train, st->data_position + (int64_t)tr->mesh.dp_rank * tr->G_local, tr->G_local,
                       tr->tokens, tr->targets, err, sizeof err)) {
        char msg[2600];
        snprintf(msg, sizeof msg, "step %lld: %s", (long long)step + 1, err);
        return fatal("%s", msg);
    }
    int64_t valid = model_count_valid(tr->targets, (size_t)tr->G_local * T);
    comm_allreduce(tr->mesh.dp_comm, &valid, 1, COMM_I64);
    // the first backward writes the expert grads (its own CUDA graph),
    // unless pipeline chunks run their backwards in turn
    if (tr->pipe.on) model_zero_grads(m);
    else model_zero_dense_grads(m);
    model_begin_step(m);
    double ce_sum = 0;
    double *lb_step = tr->lb_step, *z_step = tr->z_step;
    for (int l = 0; l < L; l++) lb_step[l] = z_step[l] = 0;
    if (tr->pipe.on) { // the schedule's actions; the grads reduce after them
        pipeline_step(tr, step, valid ? 1.0f / (float)valid : 0.0f);
        ddp_arm(&tr->ddp, 0);
    }
    for (int mi = 0; mi < M && !tr->pipe.on; mi++) {
        size_t off = (size_t)mi * MB * T;
        // grads become final in this backward: buckets start from its hooks,
        // or after it when it is replayed from a CUDA graph (one rank only)
        if (mi == M - 1) ddp_arm(&tr->ddp, !tr->use_graph);
        model_set_batch(m, tr->tokens + off, tr->targets + off);
        micro_batch(tr, train_micro_seed(tr, step, mi), valid ? 1.0f / (float)valid : 0.0f, mi == M - 1);
    }
    ddp_finish(&tr->ddp);
    // the step's sums, read once (the only wait for the device in the step)
    {
        float *lz = tr->counts_host; // reused: the counts are read after these
        tr->ops->to_host(&ce_sum, m->ce_acc + 1, sizeof(double));
        if (L) {
            tr->ops->to_host(lz, m->lb_step, L * sizeof(float));
            tr->ops->to_host(lz + L, m->z_step, L * sizeof(float));
            tr->ops->to_host(m->step_dropped, m->dropped_step, L * sizeof(float));
        }
        for (int l = 0; l < L; l++) { lb_step[l] = lz[l]; z_step[l] = lz[L + l]; }
    }
    // statistics over the dp group: CE, aux losses, drops; the expert
    // counts are reduced where they live (backend memory: the aux-free bias
    // update reads them there) and copied to the host only for the metrics.
    // They are integers, exact in FP32 below 2^24 per expert and step.
    // Pipeline stages hold the CE (the last) and their layers' values (zero
    // elsewhere): summed over the world, every rank has all of them, and
    // every stage moves the whole (replicated) aux-free bias alike.
    {
        Comm *stats = tr->pipe.on ? tr->world : tr->mesh.dp_comm;
        double *red = tr->red;
        int k = 0;
        red[k++] = ce_sum;
        for (int l = 0; l < L; l++) { red[k++] = lb_step[l]; red[k++] = z_step[l]; }
        for (int l = 0; l < L; l++) { red[k++] = m->step_dropped[l]; red[k++] = m->step_rows[l]; }
        red[k++] = m->step_dispatch_rows; red[k++] = m->step_dispatch_bytes;
        comm_allreduce(stats, red, k, COMM_F64);
        k = 0;
        ce_sum = red[k++];
        for (int l = 0; l < L; l++) { lb_step[l] = red[k++] / M_total; z_step[l] = red[k++] / M_total; }
        for (int l = 0; l < L; l++) { m->step_dropped[l] = (float)red[k++]; m->step_rows[l] = (float)red[k++]; }
        m->step_dispatch_rows = red[k++]; m->step_dispatch_bytes = red[k++];
        comm_allreduce(stats, m->step_counts, (size_t)L * E, COMM_F32);
        m->ops->to_host(tr->counts_host, m->step_counts, (size_t)L * E * sizeof(float));
    }
    r->ce = valid ? ce_sum / valid : 0;
    r->lb_raw = r->z_raw = 0;
    for (int l = 0; l < L; l++) {
        r->lb_raw += lb_step[l];
        r->z_raw += z_step[l];
    }
    r->loss = r->ce + model_aux_loss(&m->cfg, lb_step, z_step, L);
    r->gnorm = ddp_grad_norm(&tr->ddp);
    r->nonfinite = !isfinite(r->loss) || !isfinite(r->gnorm);
    r->skipped = train_should_skip(st, t, r->loss, r->gnorm);
    r->clip_scale = 1.0;
    if (!r->skipped) {
        float *opt_grads[N_CLASSES];
        if (t->clip_grad > 0 && r->gnorm > t->clip_grad) r->clip_scale = t->clip_grad / (r->gnorm + 1e-6);
        ddp_optimizer_grads(&tr->ddp, opt_grads);
        adamw_step_grads(&tr->adamw, &m->store, opt_grads, (float)lr, (float)r->clip_scale);
        ddp_gather_params(&tr->ddp);
        train_push_history(st, t->skip_window, r->loss, r->gnorm);
    } else {
        st->skipped_steps++;
    }
    model_end_step(m);
    st->step++;
    st->data_position += tr->G;
    st->tokens_seen += (int64_t)tr->G * T;
    r->dt = clock_now_s() - t0;
    return 0;
}


// Saves step st.step, or says why not: never after a step whose loss or
// grad norm is not finite (the weights that gave it are suspect), and
// ckpt_save refuses NaN or Inf weights. Returns 0, else the exit code.
static int save_checkpoint(Trainer *tr) {
    char err[2400], msg[2600];
    long long step = (long long)tr->st.step;
    if (tr->nonfinite_run) {
        SAY("checkpoint: step %lld not saved: its loss or grad norm is not finite\n", step);
        return 0;
    }
    if (ckpt_save(tr->cfg.checkpoint.dir, &tr->m.cfg, &tr->m.store, &tr->adamw, &tr->st, tr->config_yaml, tr->cfg.checkpoint.keep,
                  &tr->layout, err, sizeof err)) {
        snprintf(msg, sizeof msg, "checkpoint: step %lld not saved: %s", step, err);
        return fatal("%s", msg);
    }
    tr->saved_step = tr->st.step;
    SAY("checkpoint: saved step %lld to %s\n", step, tr->cfg.checkpoint.dir);
    return 0;
}

// Appends a step's record to metrics.jsonl (rank 0), non-finite numbers as
// null. A failed write (a full disk) is an error, not a truncated file.
static int write_record(Trainer *tr, json_object *o, char *err, size_t errlen) {
    record_null_nonfinite(o);
    if (fprintf(tr->metrics, "%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN)) < 0 ||
        fflush(tr->metrics) || ferror(tr->metrics))
        return errorf(err, errlen, "cannot write %s/metrics.jsonl: %s", tr->cfg.logging.run_dir, strerror(errno));
    return 0;
}

// The step loop: steps, eval, metrics, console lines, checkpoints, signals.
static int train_loop(Trainer *tr) {
    char err[2400];
    const RunConfig *cfg = &tr->cfg;
    const TrainSection *t = &cfg->train;
    TrainState *st = &tr->st;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    int rc = 0;
    double t_start = clock_now_s(), t_window = t_start;
    int64_t first_step = st->step, window_tokens = 0;
    int32_t stop = 0;
    // the op breakdown covers the steps from timed_from on: the op times are
    // reset as that step starts, and their mean wall time is the reference
    int timed = tr->opt.timed_ops;
    int64_t timed_from = tr->opt.timed_from < first_step ? first_step : tr->opt.timed_from;
    double timed_s = 0;
    int timed_steps = 0;

    while (st->step < t->steps && !stop) {
#ifdef MOECORE_CUDA
        if (timed && st->step == timed_from) ops_timed_reset(); // before the step: its wait is not the step's
#endif
        StepResult r = {0};
        if ((rc = train_step(tr, &r))) break;
        window_tokens += (int64_t)tr->G * tr->T;
        // a signal may reach the ranks at different steps: agree on it (over
        // NCCL a host wait for the step's last kernels, the optimizer's: the
        // step's time includes it)
        stop = stop_signal != 0;
        if (train_world_size > 1) {
            double t_agree = clock_now_s();
            comm_allreduce(tr->world, &stop, 1, COMM_I32);
            r.dt += clock_now_s() - t_agree;
        }
        if (timed && r.step >= timed_from) { timed_s += r.dt; timed_steps++; }

        double worst_max, dropped_total, rows_total;
        int flagged;
        json_object *o = step_record(tr, &r, &worst_max, &dropped_total, &rows_total, &flagged);
        int do_eval = tr->eval && t->eval_interval > 0 && (st->step % t->eval_interval == 0 || st->step == t->steps);
        if (do_eval) {
            double ev;
            if (evaluate(tr, tr->eval, &tr->mesh, t->eval_batches, tr->MB, tr->tokens, tr->targets, st->seed, &ev,
                         err, sizeof err)) {
                json_object_put(o);
                rc = fatal("eval: %s", err);
                break;
            }
            json_object_object_add(o, "eval_ce", json_object_new_double(ev));
            if (isfinite(ev)) SAY("eval  step %lld | eval ce %.4f\n", (long long)st->step, ev);
            else SAY("eval  step %lld | eval ce %f: not finite, the model has diverged\n", (long long)st->step, ev);
        }
        // TensorBoard first: it takes the record's values before non-finite ones become null
        if (tr->tb && tb_write_record(tr->tb, &tr->m.cfg, o, err, sizeof err)) {
            json_object_put(o);
            rc = fatal("logging.tensorboard: %s", err);
            break;
        }
        rc = tr->metrics ? write_record(tr, o, err, sizeof err) : 0;
        json_object_put(o);
        if (rc) { rc = fatal("%s", err); break; }
        tr->nonfinite_run = r.nonfinite ? tr->nonfinite_run + 1 : 0;

        if (st->step % cfg->logging.log_interval == 0 || st->step == t->steps || st->step == first_step + 1 || r.nonfinite) {
            double now = clock_now_s(), wt = now - t_window;
            double avg_tps = wt > 0 ? window_tokens / wt : (double)tr->G * tr->T / r.dt;
            print_step_line(tr, &r, avg_tps, (now - t_start) / (st->step - first_step) * (t->steps - st->step),
                            worst_max, dropped_total, rows_total, flagged);
            t_window = now;
            window_tokens = 0;
        }
        // divergence: the loss or grad norm of max_nonfinite_steps steps in a row was not finite
        // (each was skipped, and none saved); every rank knows it, so all end here
        if (tr->nonfinite_run >= t->max_nonfinite_steps) {
            char newest[CFG_PATH_MAX + 64], next[CFG_PATH_MAX + 200];
            if (train_rank0 && ckpt_find_latest(cfg->checkpoint.dir, newest, sizeof newest, err, sizeof err) > 0)
                snprintf(next, sizeof next, "its newest checkpoint is %s: continue from it with --resume and", newest);
            else
                snprintf(next, sizeof next, "no checkpoint was written; start again with");
            if (train_rank0)
                fprintf(stderr, "moecore: error: step %lld: %d steps in a row with a non-finite loss or grad norm "
                        "(train.max_nonfinite_steps %d; loss %g, grad norm %g): the run has diverged and stops; "
                        "%s a lower optim.lr or train.clip_grad\n", (long long)st->step, tr->nonfinite_run,
                        t->max_nonfinite_steps, r.loss, r.gnorm, next);
            rc = 2;
            break;
        }
        int last = st->step == t->steps || (tr->stop_after > 0 && st->step - first_step >= tr->stop_after);
        if ((cfg->checkpoint.interval > 0 && st->step % cfg->checkpoint.interval == 0) ||
            ((last || stop) && cfg->checkpoint.save_final)) {
            if ((rc = save_checkpoint(tr))) break;
        }
        if (last) break;
    }
    // a signal before the first step of this process: save what we have
    // (unless it is the checkpoint this run resumed from)
    if (rc == 0 && (stop_signal || stop) && st->step == first_step && cfg->checkpoint.save_final &&
        tr->saved_step != st->step)
        rc = save_checkpoint(tr);
    if (rc == 0 && stop) {
        SAY("stopped by signal %d after step %lld; %s\n", stop_signal ? (int)stop_signal : SIGTERM, (long long)st->step,
            tr->saved_step == st->step ? "checkpoint committed" : "no checkpoint of this step");
    } else if (rc == 0) {
        char d[32];
        fmt_duration(d, sizeof d, clock_now_s() - t_start);
        SAY("%s: step %lld of %lld, %lld tokens, %s\n", st->step < t->steps ? "stopped (--stop-after)" : "done",
            (long long)st->step, (long long)t->steps, (long long)st->tokens_seen, d);
    }
    if (rc == 0) print_memory_measured(tr);
#ifdef MOECORE_CUDA
    if (timed && rc == 0 && train_rank0)
        ops_timed_report(stdout, timed_steps, timed_steps ? 1000 * timed_s / timed_steps : 0);
#endif
    return rc;
}

// Frees what set-up made; after a failed set-up only what it got to.
static void train_teardown(Trainer *tr, int set_up) {
    if (set_up) {
        for (size_t g = 0; g < sizeof tr->graph / sizeof tr->graph[0]; g++)
            if (tr->graph[g]) tr->ops->graph_free(tr->graph[g]);
        if (tr->metrics) fclose(tr->metrics);
        for (int i = 0; i < 2; i++)
            if (tr->lock_fd[i] >= 0) close(tr->lock_fd[i]); // releases the lock; the file stays
        tfevents_close(tr->tb);
        free(tr->config_yaml);
        free(tr->tokens); free(tr->targets); free(tr->lb_step); free(tr->z_step); free(tr->maxload); free(tr->gflags);
        free(tr->red); free(tr->counts_host);
        gerrymander_free(&tr->gm);
        adamw_free(&tr->adamw);
        ddp_free(&tr->ddp);
        pipeline_free(&tr->pipe, tr->ops);
        model_free(&tr->m);
        mesh_free(&tr->mesh);
        if (comm_is_nccl(tr->world)) comm_free(tr->world);
        if (tr->train) data_close(tr->train);
        if (tr->eval) data_close(tr->eval);
    }
    run_config_free(&tr->cfg);
}

int train_run(int argc, char **argv, const TrainOptions *opt) {
    static Trainer zero;
    Trainer *tr = mallocCheck(sizeof *tr);
    *tr = zero;
    tr->lock_fd[0] = tr->lock_fd[1] = -1;
    tr->saved_step = -1;
    if (opt) tr->opt = *opt;
    tr->world = comm_world();
    train_world_size = comm_size(tr->world);
    train_rank = comm_rank(tr->world);
    char lerr[600];
    if (launch_detect(&tr->launch, lerr, sizeof lerr)) {
        fprintf(stderr, "moecore: error: %s\n", lerr);
        free(tr);
        return 2;
    }
    // torchrun / srun without MPI: the launcher's ranks (the NCCL world comes with the GPU)
    if (!comm_is_mpi() && tr->launch.kind != LAUNCH_SINGLE) train_world_size = tr->launch.world, train_rank = tr->launch.rank;
    train_rank0 = train_rank == 0;
    run_config_defaults(&tr->cfg);
    int rc = parse_args(tr, argc, argv);
    if (rc < 0) {
        rc = train_setup(tr);
        if (rc < 0) {
            rc = train_loop(tr);
            train_teardown(tr, 1);
        }
        // else a failed set-up has reported its error and the process exits
    } else {
        train_teardown(tr, 0);
    }
    free(tr);
    return rc;
}

int cmd_train(int argc, char **argv) { return train_run(argc, argv, NULL); }
