// Pipeline stages (issue 17): contiguous layer ranges, the embedding on the
// first stage, the final norm and LM head on the last. A split is the number
// of layers of each of S stages (S = pp x pp_virtual), every stage at least
// one layer.
//
// The automatic split balances both what a stage holds and what it
// computes: a stage's cost is the larger of its share of the parameters and
// its share of the useful FLOPs per token (DESIGN.md §8: 6 x the matmul
// parameters a token touches, the top-k of the experts, + the causal
// attention term), and the split minimises the largest stage cost (an exact
// dynamic programme over the contiguous splits).
#pragma once
#include <stddef.h>

#include "config/model_config.h"

typedef struct {
    double params;  // parameters held
    double flops;   // useful FLOPs per token
} PPCost;

// Per-layer costs of a (validated) config, and what the first stage
// (embedding) and the last (final norm, LM head) hold beside their layers.
// 0, or -1 with a message.
int pp_layer_costs(const ModelConfig *c, PPCost *layers /* [n_layers] */, PPCost *first, PPCost *last,
                   char *err, size_t errlen);
// The balanced split of L layers into S stages: counts[S]. 0, or -1 with a
// message when S > L (a stage would be empty) or S < 1.
int pp_split_auto(const PPCost *layers, int L, PPCost first, PPCost last, int S, int *counts, char *err,
                  size_t errlen);
// The cost of a split (the largest stage cost, as pp_split_auto minimises it).
double pp_split_cost(const PPCost *layers, int L, PPCost first, PPCost last, int S, const int *counts);
// An explicit split (parallel.pp_layers): n entries, S expected, each >= 1,
// summing to L; else -1 with a message naming the entry.
int pp_split_check(const int *counts, int n, int L, int S, char *err, size_t errlen);
