// Pipeline stage splits (pp_split.h).
#include "dist/pp_split.h"

#include <stdlib.h>
#include <string.h>

#include "params/layout.h"
#include "util/check.h"

int pp_layer_costs(const ModelConfig *c, PPCost *layers, PPCost *first, PPCost *last, char *err, size_t errlen) {
    ParamTable t;
    memset(&t, 0, sizeof t);
    if (param_table_for_config(c, &t, err, errlen)) return -1;
    memset(layers, 0, (size_t)c->n_layers * sizeof(PPCost));
    memset(first, 0, sizeof *first);
    memset(last, 0, sizeof *last);
    double active = c->n_experts > 0 ? (double)c->top_k / c->n_experts : 1;
    for (int i = 0; i < t.n; i++) {
        const ParamEntry *e = &t.entries[i];
        double n = (double)param_global_numel(e);
        int l = -1;
        PPCost *dst = sscanf(e->name, "layers.%d.", &l) == 1 && l >= 0 && l < c->n_layers ? &layers[l]
                      : e->kind == PARAM_EMBEDDING                                        ? first
                                                                                          : last;
        dst->params += n;
        // matmuls a token touches (an embedding is a lookup, norms are not matmuls)
        if (e->kind == PARAM_MATRIX) dst->flops += 6 * n * (e->cls == CLASS_EXPERT ? active : 1);
    }
    for (int l = 0; l < c->n_layers; l++) layers[l].flops += 6.0 * c->seq_len * model_q_dim(c);
    param_table_free(&t);
    return 0;
}

// A stage of layers [a, b) of S stages, stage s: its cost against the totals.
static double stage_cost(const PPCost *pre, int a, int b, int s, int S, PPCost first, PPCost last, PPCost total) {
    double p = pre[b].params - pre[a].params, f = pre[b].flops - pre[a].flops;
    if (s == 0) p += first.params, f += first.flops;
    if (s == S - 1) p += last.params, f += last.flops;
    double cp = total.params > 0 ? p / total.params : 0, cf = total.flops > 0 ? f / total.flops : 0;
    return cp > cf ? cp : cf;
}

static PPCost *prefix(const PPCost *layers, int L, PPCost first, PPCost last, PPCost *total) {
    PPCost *pre = mallocCheck((size_t)(L + 1) * sizeof(PPCost));
    for (int l = 0; l < L; l++)
        pre[l + 1].params = pre[l].params + layers[l].params, pre[l + 1].flops = pre[l].flops + layers[l].flops;
    total->params = pre[L].params + first.params + last.params;
    total->flops = pre[L].flops + first.flops + last.flops;
    return pre;
}

int pp_split_auto(const PPCost *layers, int L, PPCost first, PPCost last, int S, int *counts, char *err,
                  size_t errlen) {
    if (S < 1) FAIL("pipeline stages: %d (pp x pp_virtual) must be at least 1", S);
    if (S > L) FAIL("pipeline stages: %d stages (pp x pp_virtual) for %d layers would leave a stage empty", S, L);
    PPCost total;
    PPCost *pre = prefix(layers, L, first, last, &total);
    // best[s][b]: the least largest cost of stages 0..s covering layers [0, b);
    // cut[s][b]: where stage s starts in it
    double *best = mallocCheck((size_t)S * (L + 1) * sizeof(double));
    int *cut = mallocCheck((size_t)S * (L + 1) * sizeof(int));
#define BEST(s, b) best[(size_t)(s) * (L + 1) + (b)]
#define CUT(s, b) cut[(size_t)(s) * (L + 1) + (b)]
    for (int b = 1; b <= L; b++) BEST(0, b) = stage_cost(pre, 0, b, 0, S, first, last, total), CUT(0, b) = 0;
    for (int s = 1; s < S; s++)
        for (int b = s + 1; b <= L; b++) {
            BEST(s, b) = -1;
            for (int a = s; a < b; a++) {  // stages 0..s-1 hold [0, a), at least one layer each
                double c = stage_cost(pre, a, b, s, S, first, last, total), m = BEST(s - 1, a) > c ? BEST(s - 1, a) : c;
                if (BEST(s, b) < 0 || m < BEST(s, b)) BEST(s, b) = m, CUT(s, b) = a;
            }
        }
    for (int s = S - 1, b = L; s >= 0; s--) {
        int a = CUT(s, b);
        counts[s] = b - a;
        b = a;
    }
#undef BEST
#undef CUT
    free(best);
    free(cut);
    free(pre);
    return 0;
}

double pp_split_cost(const PPCost *layers, int L, PPCost first, PPCost last, int S, const int *counts) {
    PPCost total;
    PPCost *pre = prefix(layers, L, first, last, &total);
    double worst = 0;
    for (int s = 0, a = 0; s < S; a += counts[s], s++) {
        double c = stage_cost(pre, a, a + counts[s], s, S, first, last, total);
        if (c > worst) worst = c;
    }
    free(pre);
    return worst;
}

int pp_split_check(const int *counts, int n, int L, int S, char *err, size_t errlen) {
    if (n != S) FAIL("parallel.pp_layers: %d entries, expected one per stage (pp x pp_virtual = %d)", n, S);
    long sum = 0;
    for (int i = 0; i < n; i++) {
        if (counts[i] < 1) FAIL("parallel.pp_layers[%d] is %d: every stage needs at least one layer", i, counts[i]);
        sum += counts[i];
    }
    if (sum != L) FAIL("parallel.pp_layers sums to %ld layers, the model has %d (model.n_layers)", sum, L);
    return 0;
}
