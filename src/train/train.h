// The single-process training loop (`moecore train`): config, data, model,
// optimizer, LR schedule, clipping, skip-step, eval, metrics, checkpoints.
#pragma once
#include <stdint.h>

#include "ckpt/checkpoint.h"
#include "config/config.h"

// moecore train CONFIG.yaml [--resume] [--section.key=value ...]
int cmd_train(int argc, char **argv);
// What `moecore bench` asks of a training run beyond its arguments.
typedef struct {
    int timed_ops;       // time every op with CUDA events (the ops_cuda_timed table; cuda only)
    int64_t timed_from;  // ... over the steps from this 0-based index on (bench's warm-up)
} TrainOptions;
// cmd_train with options (NULL: none).
int train_run(int argc, char **argv, const TrainOptions *opt);
// moecore bench CONFIG.yaml ... (src/train/bench.c)
int cmd_bench(int argc, char **argv);

// Learning rate for the 0-based step index (warmup, then the schedule).
double lr_at(const TrainSection *t, double base_lr, int64_t step);
// Useful-model FLOPs per token (DESIGN.md §8).
double flops_per_token(const ModelConfig *c);
// Skip-step: whether a step with this loss and grad norm is skipped, given
// the history of accepted steps; and adding an accepted step to it.
int train_should_skip(const TrainState *s, const TrainSection *t, double loss, double gnorm);
void train_push_history(TrainState *s, int window, double loss, double gnorm);
