// The single-process training loop (`moecore train`): config, data, model,
// optimizer, LR schedule, clipping, skip-step, eval, metrics, checkpoints.
#pragma once
#include <stdint.h>

#include "config/config.h"

// moecore train CONFIG.yaml [--resume] [--section.key=value ...]
int cmd_train(int argc, char **argv);

// Learning rate for the 0-based step index (warmup, then the schedule).
double lr_at(const TrainSection *t, double base_lr, int64_t step);
// Useful-model FLOPs per token (DESIGN.md §8).
double flops_per_token(const ModelConfig *c);
