// The run configuration: every section of a training config, read from YAML
// (libyaml) and dotted command-line overrides (--section.key=value), then
// validated as a whole. Every key lives in one table (config.c) that also
// drives printing and the nearest-key hint, and configs/reference.yaml
// documents each one (tests/test_config.sh keeps the two in step).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config/model_config.h"
#include "config/optim_config.h"
#include "ops/cuda/cuda_settings.h"

#define CFG_MAX_LIST 64
#define CFG_PATH_MAX 1024

typedef struct {
    char *items[CFG_MAX_LIST];
    int n;
} StrList;

typedef enum { LR_COSINE = 0, LR_WSD = 1, LR_CONSTANT = 2, LR_LINEAR = 3, LR_INV_SQRT = 4 } LrSchedule;
// The shape of the WSD decay (train.decay_shape).
typedef enum { DECAY_LINEAR = 0, DECAY_COSINE = 1, DECAY_1_SQRT = 2 } DecayShape;

typedef struct {
    StrList train;          // paths or globs; each entry is one source
    StrList train_weights;  // optional mixture weight per entry of train
    StrList eval;           // held-out paths or globs
    int dtype;              // TokenDtype: uint16 | uint32
    int validate;           // scan every token of every file at start
    int synthetic;          // uniformly random tokens instead of files (benchmarks)
    int eos_id;             // the token that ends each document (byte tokenizer: 256)
    int doc_mask;           // attention within EOS-delimited documents only (docs/model.md)
    char tokenizer[CFG_PATH_MAX]; // tokenizer.json the token files were made with; "" = none (ckpt/hf_tokenizer.h)
} DataSection;

typedef struct {
    int global_batch;       // instances (sequences) per optimizer step
    int micro_batch;        // instances per forward/backward
    int recompute;          // 0 none; 1 experts: re-gather expert inputs, redo SwiGLU in backward; 2 gather only;
                            // 3 layers: whole blocks redone in backward (model.h)
    int recompute_every, recompute_first; // layers: every N-th block (0: 1); only blocks below this one (0: all)
    int recompute_norms;    // selective: the input norms' outputs are recomputed in the backward (model.h)
    int recompute_attention; // selective: QK-norm, RoPE and attention redone from q, k, v in the backward
    int recompute_swiglu;   // selective: the SwiGLU outputs redone from gate and up in the backward
    int precision;          // Precision: bf16 (the compute dtype everywhere) | fp8 (the FP8 GEMMs of the fp8 section)
    int64_t steps;          // optimizer steps (0: derive from tokens)
    int64_t tokens;         // train tokens (used when steps is 0)
    int lr_schedule;        // LrSchedule
    int64_t warmup_steps;
    double decay_fraction;  // WSD: final fraction of steps spent decaying
    int decay_shape;        // DecayShape of the WSD decay
    double min_lr_ratio;    // lr floor as a fraction of optim.lr
    double clip_grad;       // global grad-norm clip; 0 = off
    int skip_window;        // steps in the skip-step statistics; 0 = off
    double skip_sigmas;     // skip when loss or grad norm > mean + k sigma
    int max_nonfinite_steps; // consecutive steps with a non-finite loss or grad norm (each skipped) that stop the run
    int64_t eval_interval;  // steps between evals; 0 = off
    int eval_batches;       // micro-batches per eval
    uint64_t seed;          // data order, init, random routing
} TrainSection;

// train.precision and the fp8 section (issue 18): which GEMMs run in FP8 and
// in which format. block128 (E4M3, FP32 scales per 1 x 128 activation tile
// and 128 x 128 weight block) runs on Hopper; mxfp8 (E8M0 scales per 32) is
// Blackwell's, refused by validation until a GEMM consumes it.
typedef enum { PRECISION_BF16 = 0, PRECISION_FP8 = 1 } Precision;
typedef enum { FP8_RECIPE_BLOCK128 = 0, FP8_RECIPE_MXFP8 = 1 } Fp8Recipe;
typedef enum { FP8_GEMMS_EXPERTS = 0, FP8_GEMMS_EXPERTS_DENSE = 1 } Fp8Gemms;
typedef enum { FP8_WGRAD_BF16 = 0, FP8_WGRAD_FP8 = 1 } Fp8Wgrad;
typedef struct {
    int recipe;              // Fp8Recipe
    int gemms;               // Fp8Gemms: the experts' grouped GEMMs, or also the dense ones
    int wgrad;               // Fp8Wgrad: the experts' weight-grads in the compute dtype, or FP8
} Fp8Section;

typedef struct {
    char dir[CFG_PATH_MAX];  // default <run_dir>/checkpoints
    int64_t interval;        // steps between checkpoints; 0 = only at the end / on signal
    int keep;                // committed checkpoints kept; 0 = all
    int save_final;          // save at the last step (and on a signal)
} CheckpointSection;

typedef struct {
    char run_dir[CFG_PATH_MAX];
    int64_t log_interval;
    int gerrymander_window;  // steps in the token-gerrymandering check
    int tensorboard;         // also write TensorBoard event files into run_dir
} LoggingSection;

typedef struct {
    int dp, ep, pp;          // world = pp x dp, dp = ep x ep_dp
    double bucket_mb;        // gradient-reduction bucket size, MiB of FP32 grads
    double timeout_s;        // NCCL: a collective not done after this aborts the job
    int ep_backend;          // expert dispatch (EpBackend of model.h): 0 auto, 1 a2a (all-to-all with
                             // host-known split sizes, dist/ep.h), 2 symmetric (direct writes, ops/ep_sym.h)
    double ep_recv_factor;   // symmetric: receive-buffer rows per layer / rows a rank routes (0: auto)
    // pipeline parallelism (pp > 1): the schedule (PPScheduleKind order:
    // 0 gpipe, 1 1f1b, 2 interleaved, 3 zb1), model chunks per rank, and an
    // explicit split (layers per virtual stage; empty = the balanced one),
    // parsed by validation into pp_layer_counts
    int pp_schedule;
    int pp_virtual;
    StrList pp_layers;
    int pp_layer_counts[CFG_MAX_LIST], n_pp_layers;
} ParallelSection;

typedef struct {
    int type;                // 0 cpu, 1 cuda
    double peak_tflops;      // MFU denominator; 0 = the device's (train/mfu.h)
    int cuda_graph;          // replay each micro-batch's forward + backward as a CUDA graph
    CudaSettings cuda;       // device.cuda.*: the CUDA backend's kernel choices
} DeviceSection;

// Where a key's value came from, for messages (run_config_blame): a line of
// the YAML file or a command-line argument.
typedef struct {
    char key[64];           // "section.key"
    int line;               // YAML line, from 1; 0 when not set from YAML
    char *arg;              // the argument "--section.key=value" that set it, or NULL
} KeyOrigin;

typedef struct {
    ModelConfig model;
    DataSection data;
    TrainSection train;
    OptimConfig optim;
    int optim_sharded;
    Fp8Section fp8;
    CheckpointSection checkpoint;
    LoggingSection logging;
    ParallelSection parallel;
    DeviceSection device;
    char source[CFG_PATH_MAX];  // the YAML file read, "" if none
    KeyOrigin *origins;         // every key set, by YAML or argument
    int n_origins;
} RunConfig;

void run_config_defaults(RunConfig *c);
void run_config_free(RunConfig *c);
// Reads a YAML file into c. Errors name the file, the line and the key. A
// key or a section given twice, and a second document, are errors.
int run_config_load_yaml(RunConfig *c, const char *path, char *err, size_t errlen);
// Same from a string (tests and the fuzz target); name appears in messages.
int run_config_load_yaml_string(RunConfig *c, const char *text, size_t len, const char *name,
                                char *err, size_t errlen);
// Applies "section.key=value" (a list value is comma-separated).
int run_config_set(RunConfig *c, const char *key, const char *value, char *err, size_t errlen);
// Applies the command-line argument "--section.key=value" and remembers it;
// errors read "command line: ARG: ...".
int run_config_override(RunConfig *c, const char *arg, char *err, size_t errlen);
// Cross-field checks and derived values; world is the number of ranks. The
// message says where the keys it names were set (run_config_blame).
int run_config_validate(RunConfig *c, int world, char *err, size_t errlen);
// The expert dispatch a run asks the model for (EpBackend of model.h):
// parallel.ep_backend, with auto taken as a2a under train.precision: fp8
// (the symmetric FP8 path runs its quantisers over the whole receive
// buffer, model.c's sym_fp8_moe_experts_forward; ask for it by name);
// otherwise auto stays auto (the model picks symmetric where the ep group
// has symmetric memory).
int run_config_ep_backend(const RunConfig *c);
// Writes msg into err prefixed with where the keys it names came from: the
// arguments "command line: --a=1, --b=2: " when any was set on the command
// line, else "FILE:LINE: " of the first one set in the YAML, else "FILE: ".
void run_config_blame(const RunConfig *c, const char *msg, char *err, size_t errlen);
// The resolved config as YAML (written to the run directory).
void run_config_write_yaml(const RunConfig *c, FILE *f);
// All keys "section.key", NULL-terminated.
const char *const *run_config_keys(void);
