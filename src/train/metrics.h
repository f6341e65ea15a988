// Per-step metrics (DESIGN.md §8): expert-load statistics, the
// token-gerrymandering check, and the metrics.jsonl writer.
#pragma once
#include <stdint.h>
#include <stdio.h>

typedef struct {
    double max_over_mean;   // max expert load / mean load
    double min_over_mean;   // min / mean (0: a dead expert)
    double cv;              // coefficient of variation of the loads
    int dead;               // experts that got no token
} ExpertLoad;

void expert_load_stats(const float *counts, int E, ExpertLoad *out);

// Token gerrymandering: the LB loss falls while the real imbalance
// (max/mean load) rises. Keeps a window of both per MoE layer and flags a
// layer when, over a full window, the least-squares trend of LB falls and
// that of max/mean rises, both clearly (|t| > 3 for the slope), with
// max/mean up by at least 5% of its mean across the window.
typedef struct {
    int layers, window, n, head;
    double *lb, *maxload;   // [layers][window] rings
} Gerrymander;

void gerrymander_init(Gerrymander *g, int layers, int window);
void gerrymander_free(Gerrymander *g);
// Adds one step's values and returns a bitmask-free count: flags[l] = 1 when flagged.
int gerrymander_push(Gerrymander *g, const double *lb, const double *maxload, int *flags);
