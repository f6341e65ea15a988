// Pipeline stage splits (src/dist/pp_split.h): the automatic split is the
// best contiguous split, checked against every split enumerated here (a
// brute force that computes stage sums on its own); per-layer costs add up
// to the config's parameter count and to the trainer's useful FLOPs per
// token (flops_per_token, other code); explicit splits are validated.
#include <check.h>

#include "check_main.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dist/pp_split.h"
#include "params/layout.h"
#include "train/train.h"

// The largest stage cost of a split, from scratch.
static double brute_cost(const PPCost *ly, int L, PPCost first, PPCost last, int S, const int *counts) {
    double tp = first.params + last.params, tf = first.flops + last.flops;
    for (int l = 0; l < L; l++) tp += ly[l].params, tf += ly[l].flops;
    double worst = 0;
    int l = 0;
    for (int s = 0; s < S; s++) {
        double p = 0, f = 0;
        for (int k = 0; k < counts[s]; k++, l++) p += ly[l].params, f += ly[l].flops;
        if (s == 0) p += first.params, f += first.flops;
        if (s == S - 1) p += last.params, f += last.flops;
        double c = fmax(p / tp, f / tf);
        worst = fmax(worst, c);
    }
    return worst;
}
// The least largest cost over every split of L layers into S non-empty stages.
static double brute_best(const PPCost *ly, int L, PPCost first, PPCost last, int S, int *counts, int s, int left) {
    if (s == S - 1) {
        counts[s] = left;
        return brute_cost(ly, L, first, last, S, counts);
    }
    double best = INFINITY;
    for (int n = 1; n <= left - (S - 1 - s); n++) {
        counts[s] = n;
        best = fmin(best, brute_best(ly, L, first, last, S, counts, s + 1, left - n));
    }
    return best;
}

START_TEST(test_auto_is_optimal) {
    unsigned seed = 12345;
    int cases = 0;
    for (int L = 1; L <= 10; L++)
        for (int S = 1; S <= 4 && S <= L; S++)
            for (int rep = 0; rep < 6; rep++) {
                PPCost ly[10], first, last;
                for (int l = 0; l < L; l++) {
                    seed = seed * 1103515245u + 12345u;
                    ly[l].params = 1 + (seed >> 8) % 100;
                    seed = seed * 1103515245u + 12345u;
                    ly[l].flops = 1 + (seed >> 8) % 100;
                }
                first = (PPCost){rep * 40.0, 0}, last = (PPCost){rep * 30.0, rep * 25.0};
                int counts[4], bc[4];
                char err[200];
                ck_assert_int_eq(pp_split_auto(ly, L, first, last, S, counts, err, sizeof err), 0);
                int sum = 0;
                for (int s = 0; s < S; s++) { ck_assert_int_ge(counts[s], 1); sum += counts[s]; }
                ck_assert_int_eq(sum, L);
                double got = brute_cost(ly, L, first, last, S, counts), want = brute_best(ly, L, first, last, S, bc, 0, L);
                ck_assert_msg(fabs(got - want) < 1e-12, "L %d S %d: split cost %.15g, best %.15g", L, S, got, want);
                ck_assert(fabs(pp_split_cost(ly, L, first, last, S, counts) - got) < 1e-12);
                cases++;
            }
    ck_assert_int_gt(cases, 150);
}
END_TEST

START_TEST(test_refusals) {
    PPCost ly[3] = {{1, 1}, {1, 1}, {1, 1}}, z = {0, 0};
    int counts[4];
    char err[200];
    ck_assert_int_eq(pp_split_auto(ly, 3, z, z, 4, counts, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "would leave a stage empty"));
    int good[2] = {2, 1}, zero[2] = {3, 0}, short_[2] = {1, 1};
    ck_assert_int_eq(pp_split_check(good, 2, 3, 2, err, sizeof err), 0);
    ck_assert_int_eq(pp_split_check(zero, 2, 3, 2, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "parallel.pp_layers[1] is 0"));
    ck_assert_int_eq(pp_split_check(short_, 2, 3, 2, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "sums to 2 layers, the model has 3"));
    ck_assert_int_eq(pp_split_check(good, 2, 3, 4, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "expected one per stage"));
}
END_TEST

// An OLMoE-style config with a dense first layer and a shared expert: the
// costs add up to the parameter table and to flops_per_token; the dense
// layer costs less FLOPs than a MoE layer's params suggest, and the split of
// 8 layers into 4 stages gives the first and last stages (embedding, LM head)
// no more layers than the middle ones.
START_TEST(test_config_costs) {
    ModelConfig c;
    model_config_defaults(&c);
    c.vocab_size = 5000; c.d_model = 64; c.n_layers = 8; c.n_heads = 4; c.n_experts = 16; c.top_k = 2;
    c.expert_hidden = 96; c.dense_layers = 1; c.dense_hidden = 128; c.n_shared = 1; c.shared_hidden = 32;
    c.seq_len = 64;
    char err[300];
    ck_assert_msg(model_config_validate(&c, err, sizeof err) == 0, "%s", err);
    PPCost ly[8], first, last;
    ck_assert_msg(pp_layer_costs(&c, ly, &first, &last, err, sizeof err) == 0, "%s", err);
    ParamTable t;
    memset(&t, 0, sizeof t);
    ck_assert_int_eq(param_table_for_config(&c, &t, err, sizeof err), 0);
    double p = first.params + last.params, f = first.flops + last.flops;
    for (int l = 0; l < 8; l++) p += ly[l].params, f += ly[l].flops;
    ck_assert_double_eq(p, (double)param_total(&t));
    ck_assert_msg(fabs(f - flops_per_token(&c)) <= 1e-9 * f, "FLOPs %.17g, flops_per_token %.17g", f, flops_per_token(&c));
    ck_assert(first.flops == 0 && first.params > 0 && last.flops > 0);
    for (int l = 2; l < 8; l++) ck_assert(ly[l].params == ly[1].params && ly[l].flops == ly[1].flops);
    ck_assert(ly[0].params < ly[1].params);
    int counts[4];
    ck_assert_int_eq(pp_split_auto(ly, 8, first, last, 4, counts, err, sizeof err), 0);
    ck_assert_int_eq(counts[0] + counts[1] + counts[2] + counts[3], 8);
    ck_assert_msg(counts[0] <= counts[1] && counts[3] <= counts[2], "split %d %d %d %d", counts[0], counts[1],
                  counts[2], counts[3]);
    param_table_free(&t);
}
END_TEST

int main(void) {
    Suite *s = suite_create("pp_split");
    TCase *tc = tcase_create("pp_split");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_auto_is_optimal);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_config_costs);
    suite_add_tcase(s, tc);
    return check_run(s);
}
