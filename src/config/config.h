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

typedef enum { LR_COSINE = 0, LR_WSD = 1, LR_CONSTANT = 2 } LrSchedule;

typedef struct {
    StrList train;          // paths or globs; each entry is one source
    StrList train_weights;  // optional mixture weight per entry of train
    StrList eval;           // held-out paths or globs
    int dtype;              // TokenDtype: uint16 | uint32
    int validate;           // scan every token of every file at start
    int synthetic;          // uniformly random tokens instead of files (benchmarks)
    int doc_mask;           // attention within EOS-delimited documents only (docs/model.md)
} DataSection;

typedef struct {
    int global_batch;       // instances (sequences) per optimizer step
    int micro_batch;        // instances per forward/backward
    int recompute;          // 0 none; 1 experts: re-gather expert inputs, redo SwiGLU in backward; 2 gather only
    int64_t steps;          // optimizer steps (0: derive from tokens)
    int64_t tokens;         // train tokens (used when steps is 0)
    int lr_schedule;        // LrSchedule
    int64_t warmup_steps;
    double decay_fraction;  // WSD: final fraction of steps spent decaying
    double min_lr_ratio;    // lr floor as a fraction of optim.lr
    double clip_grad;       // global grad-norm clip; 0 = off
    int skip_window;        // steps in the skip-step statistics; 0 = off
    double skip_sigmas;     // skip when loss or grad norm > mean + k sigma
    int64_t eval_interval;  // steps between evals; 0 = off
    int eval_batches;       // micro-batches per eval
    uint64_t seed;          // data order, init, random routing
} TrainSection;

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
} LoggingSection;

typedef struct {
    int dp, ep, pp;          // world = pp x dp, dp = ep x ep_dp
    double bucket_mb;        // gradient-reduction bucket size, MiB of FP32 grads
} ParallelSection;

typedef struct {
    int type;                // 0 cpu, 1 cuda
    double peak_tflops;      // MFU denominator; 0 = device default (CPU: measured SGEMM)
    int cuda_graph;          // replay each micro-batch's forward + backward as a CUDA graph
    CudaSettings cuda;       // device.cuda.*: the CUDA backend's kernel choices
} DeviceSection;

typedef struct {
    ModelConfig model;
    DataSection data;
    TrainSection train;
    OptimConfig optim;
    int optim_sharded;
    CheckpointSection checkpoint;
    LoggingSection logging;
    ParallelSection parallel;
    DeviceSection device;
} RunConfig;

void run_config_defaults(RunConfig *c);
void run_config_free(RunConfig *c);
// Reads a YAML file into c. Errors name the file, the line and the key.
int run_config_load_yaml(RunConfig *c, const char *path, char *err, size_t errlen);
// Same from a string (tests and the fuzz target); name appears in messages.
int run_config_load_yaml_string(RunConfig *c, const char *text, size_t len, const char *name,
                                char *err, size_t errlen);
// Applies "section.key=value" (a list value is comma-separated).
int run_config_set(RunConfig *c, const char *key, const char *value, char *err, size_t errlen);
// Cross-field checks and derived values; world is the number of ranks.
int run_config_validate(RunConfig *c, int world, char *err, size_t errlen);
// The resolved config as YAML (written to the run directory).
void run_config_write_yaml(const RunConfig *c, FILE *f);
// All keys "section.key", NULL-terminated.
const char *const *run_config_keys(void);
