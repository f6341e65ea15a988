// Checkpoints (DESIGN.md §7): a directory per step,
//
//   step-000100/
//     model.safetensors   global FP32 weights, canonical names and shapes
//     optim.safetensors   exp_avg.NAME / exp_avg_sq.NAME, router_bias
//     train_state.json    step, tokens, data position, optimizer step, seed,
//                         skip-step window, model config
//     COMMITTED           written last
//
// Writing goes to step-N.tmp/ and is renamed when complete, so a crash
// leaves either the previous checkpoint or a .tmp directory that readers
// ignore. Tensors are in their global shape; each rank writes only the byte
// ranges it owns (one rank owns everything until the distributed runtime),
// so the files do not depend on the layout that wrote them.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "ckpt/safetensors.h"
#include "config/model_config.h"
#include "dist/comm.h"
#include "optim/adamw.h"
#include "params/store.h"

#define SKIP_WINDOW_MAX 1024

// The files of a checkpoint directory.
#define CKPT_MODEL_FILE "model.safetensors"
#define CKPT_OPTIM_FILE "optim.safetensors"
#define CKPT_STATE_FILE "train_state.json"
#define CKPT_COMMITTED "COMMITTED"

// Save and load move tensors between backend memory and the files through
// one host buffer of at most this many bytes (page-locked on CUDA), so that
// a rank never holds a host copy of its model.
#define CKPT_CHUNK_BYTES ((size_t)64 << 20)
// Sets that size (rounded down to whole floats; 0: back to CKPT_CHUNK_BYTES),
// for tests that make tensors cross chunk boundaries.
void ckpt_set_chunk_bytes(size_t bytes);

typedef struct {
    int64_t step;           // optimizer steps completed
    int64_t tokens_seen;
    int64_t data_position;  // next global instance index of the train stream
    int64_t skipped_steps;
    uint64_t seed;
    // skip-step statistics: the last n (loss, grad norm) of accepted steps
    int hist_n;
    double hist_loss[SKIP_WINDOW_MAX], hist_gnorm[SKIP_WINDOW_MAX];
} TrainState;

// Which bytes this rank writes: elements [own_begin, own_end) of each class
// buffer (the shards of the data-parallel groups partition the global
// tensors, so every byte has exactly one writer). All ranks of world call
// save and load together; rank 0 writes headers, state and the marker.
typedef struct {
    Comm *world;
    size_t own_begin[N_CLASSES], own_end[N_CLASSES];
} CkptLayout;

// A one-rank layout that owns everything.
void ckpt_layout_single(CkptLayout *l, const ParamStore *ps);

// Saves step state.step of a model of config cfg (its store ps and optimizer
// opt) into dir/step-%08lld. keep > 0 deletes all but the newest keep
// committed checkpoints afterwards, never the one just written. config_yaml
// is stored beside the state for reference (may be NULL). An error, with
// nothing written, when that step is already committed or when a tensor
// holds a NaN or an Inf (the message names it).
int ckpt_save(const char *dir, const ModelConfig *cfg, const ParamStore *ps, const AdamW *opt,
              const TrainState *st, const char *config_yaml, int keep, const CkptLayout *layout, char *err,
              size_t errlen);
// Removes every checkpoint directory of dir (step-N, committed or not, and
// step-N.tmp), COMMITTED first; other files stay. *removed counts them.
int ckpt_remove_all(const char *dir, int *removed, char *err, size_t errlen);
// Finds the committed checkpoint with the highest step. Returns 1 and fills
// path when found, 0 when there is none, -1 on error.
int ckpt_find_latest(const char *dir, char *path, size_t pathlen, char *err, size_t errlen);
// Loads a checkpoint into the store ps and optimizer of an initialised model
// of config cfg with the same architecture; a mismatch (config, names,
// shapes, dtypes, a malformed or truncated file) is an error naming the
// field or tensor, found before anything is modified. Each rank reads the
// global-tensor ranges of what it holds (its experts, its optimizer range,
// its shard of the main weights), so the checkpoint may come from any
// layout. A read error of the system after those checks (EIO) leaves the
// model partly loaded; the caller must then not use it.
int ckpt_load(const char *path, const ModelConfig *cfg, ParamStore *ps, AdamW *opt, TrainState *st, char *err,
              size_t errlen);

// The format's parts that ckpt_save is made of, for import-hf, which streams
// tensors into a new checkpoint rather than saving a model in memory.
//
// The tensor lists (finalized) of model.safetensors and optim.safetensors for
// a model of config cfg whose table is t, in global shapes.
int ckpt_tensor_lists(StFile *model, StFile *optim, const ModelConfig *cfg, const ParamTable *t, char *err,
                      size_t errlen);
// Creates dir/model.safetensors and dir/optim.safetensors with those headers,
// durably; every tensor reads as zeros until written.
int ckpt_create_files(const char *dir, StFile *model, StFile *optim, char *err, size_t errlen);
// Completes the checkpoint in dir: train_state.json (the counters of s, the
// optimizer step, the model config), config.yaml when config_yaml is not NULL,
// and last COMMITTED.
int ckpt_write_state(const char *dir, const ModelConfig *cfg, const TrainState *s, int optimizer_step,
                     const char *config_yaml, char *err, size_t errlen);
// The model config object of state, a parsed train_state.json read from
// path, after checking that it is in this format; NULL with a message if not.
struct json_object *ckpt_state_model(struct json_object *state, const char *path, char *err, size_t errlen);
