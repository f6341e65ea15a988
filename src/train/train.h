// The single-process training loop (`moecore train`): config, data, model,
// optimizer, LR schedule, clipping, skip-step, eval, metrics, checkpoints.
#pragma once
#include <stdint.h>

#include "ckpt/checkpoint.h"
#include "config/config.h"

// moecore train CONFIG.yaml [--resume] [--section.key=value ...]
int cmd_train(int argc, char **argv);
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
