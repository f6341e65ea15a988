// The memory accounting of train/memory.h against numbers computed here
// from the model's dimensions alone (DESIGN.md §4): with BF16 compute
// weights and the distributed optimizer a rank holds 6 + 12/D bytes per
// parameter (2 compute weight + 4 grad + 12/D main weight and two moments),
// D = dp for dense parameters and ep_dp for expert ones, of which it holds
// E/ep; with FP32 compute weights (the CPU, where they are the main
// weights) 8 + 8/D. Not sharded, the optimizer state is whole: 18 and 16.
#include <check.h>

#include "check_main.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/model.h"
#include "train/memory.h"

// The test model, and its parameter counts by hand (params/layout.c names
// the tensors; here only their sizes): pre-norm, full QK-norm, every layer
// MoE, as many KV heads as heads, no shared expert.
enum { V = 512, C = 64, NL = 3, H = 4, NE = 16, F = 96 };

static ModelConfig test_config(void) {
    ModelConfig c;
    model_config_defaults(&c);
    c.vocab_size = V; c.d_model = C; c.n_layers = NL; c.n_heads = H; c.n_experts = NE; c.top_k = 2;
    c.expert_hidden = F; c.seq_len = 32;
    char err[512];
    ck_assert_msg(model_config_validate(&c, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.padded_vocab, V); // V is a multiple of the padding: the count below uses V
    return c;
}

static const double dense_params = 2.0 * V * C                           // embed, lm_head
                                   + NL * (2.0 * C + 4.0 * C * C + 2.0 * C // attn/ffn norms, wq wk wv wo, q/k norms
                                           + (double)NE * C)               // router
                                   + C;                                    // final norm
static const double expert_params = NL * 3.0 * NE * F * C;                // w_gate, w_up, w_down [E, ...]

static MemoryPlan plan(int dp, int dp_rank, int ep, int ep_dp_rank, int sharded, size_t act_bytes) {
    ModelConfig c = test_config();
    MemoryLayout l = {.dp = dp, .dp_rank = dp_rank, .ep = ep, .ep_dp = dp / ep, .ep_dp_rank = ep_dp_rank,
                      .sharded = sharded, .act_bytes = act_bytes};
    MemoryPlan p;
    char err[512];
    ck_assert_msg(memory_plan(&p, &c, &l, err, sizeof err) == 0, "%s", err);
    return p;
}

// Every rank of a layout against the closed form: per category, the shard
// rounding (< 1 element per class) is all it may differ by; summed over the
// ranks of a group the optimizer state is exactly 12 (BF16) or 8 (FP32)
// bytes per parameter, counted once.
static void check_layout(int dp, int ep, int sharded, size_t act_bytes) {
    int ep_dp = dp / ep;
    double Dd = sharded ? dp : 1, De = sharded ? ep_dp : 1;
    double pd = dense_params, pe = expert_params / ep;
    double weight = act_bytes, state = act_bytes == 4 ? 8 : 12; // FP32: the main weight is the compute weight
    double want = (weight + 4) * (pd + pe) + state * (pd / Dd + pe / De);
    double dense_state_sum = 0, expert_state_sum = 0;
    for (int r = 0; r < dp; r++) {
        MemoryPlan p = plan(dp, r, ep, r / ep, sharded, act_bytes);
        ck_assert_msg(p.dense == pd && p.expert == pe, "dp %d ep %d: holds %zu + %zu, expected %.0f + %.0f", dp, ep,
                      p.dense, p.expert, pd, pe);
        ck_assert_uint_eq(p.compute_weights, (size_t)(weight * (pd + pe)));
        ck_assert_uint_eq(p.grads, (size_t)(4 * (pd + pe)));
        double got = p.compute_weights + p.grads + p.main_weights + p.moments;
        ck_assert_msg(fabs(got - want) < 2 * state, "dp %d ep %d sharded %d act %zu rank %d: %.0f B, expected %.1f B",
                      dp, ep, sharded, act_bytes, r, got, want);
        double per = memory_bytes_per_param(&p), want_per = want / (pd + pe);
        ck_assert_msg(fabs(per - want_per) < 1e-6 * want_per + 2 * state / (pd + pe),
                      "dp %d ep %d: %.6f B/param, expected %.6f", dp, ep, per, want_per);
        // the reduced-grad shard of the distributed optimizer: 4 B per shard element
        ck_assert_uint_eq(p.comm, sharded ? (p.dense_opt + p.expert_opt) * 4 : 0);
        dense_state_sum += state * p.dense_opt;
        if (r % ep == 0) expert_state_sum += state * p.expert_opt; // one ep rank per expert shard group
    }
    // dense: the dp ranks partition it (sharded) or each holds it all
    ck_assert_double_eq(dense_state_sum, state * pd * (sharded ? 1 : dp));
    ck_assert_double_eq(expert_state_sum, state * pe * (sharded ? 1 : ep_dp));
}

START_TEST(test_bf16_sharded_d1_d2_d8) {
    check_layout(1, 1, 1, 2);   // D = 1: 18 B/param
    check_layout(2, 1, 1, 2);   // D = 2: 12
    check_layout(8, 1, 1, 2);   // D = 8: 7.5
    // the number itself, once, for D = 8 (both classes sharded 8 ways)
    MemoryPlan p = plan(8, 3, 1, 3, 1, 2);
    ck_assert_double_eq_tol(memory_bytes_per_param(&p), 6 + 12.0 / 8, 1e-3);
}
END_TEST

START_TEST(test_bf16_sharded_with_ep) {
    check_layout(8, 2, 1, 2);   // dense D = 8; experts: 1/2 of them held, D = ep_dp = 4
    check_layout(8, 8, 1, 2);   // experts: 1/8 held, ep_dp = 1: their 12 B stay whole
    check_layout(4, 4, 1, 2);
}
END_TEST

START_TEST(test_not_sharded_and_fp32) {
    check_layout(8, 1, 0, 2);   // replicated optimizer: 18 B/param on every rank
    MemoryPlan p = plan(8, 0, 1, 0, 0, 2);
    ck_assert_double_eq_tol(memory_bytes_per_param(&p), 18, 1e-9);
    // FP32 compute weights are the main weights (the CPU): 8 + 8/D
    check_layout(1, 1, 1, 4);
    check_layout(2, 1, 1, 4);
    check_layout(8, 2, 1, 4);
    p = plan(8, 5, 1, 5, 1, 4);
    ck_assert_uint_eq(p.main_weights, 0);
    ck_assert_double_eq_tol(memory_bytes_per_param(&p), 8 + 8.0 / 8, 1e-3);
}
END_TEST

// The plan's counts are what a model of the config really allocates (one
// rank, CPU), and a layout that does not fit is an error, not a number.
START_TEST(test_against_the_store_and_errors) {
    ModelConfig c = test_config();
    Model m;
    char err[512];
    ck_assert_msg(model_init(&m, &c, &ops_cpu, err, sizeof err) == 0, "%s", err);
    ck_assert_double_eq(m.store.table.class_numel[CLASS_DENSE], dense_params);
    ck_assert_double_eq(m.store.table.class_numel[CLASS_EXPERT], expert_params);
    model_free(&m);
    MemoryLayout l = {.dp = 6, .ep = 3, .ep_dp = 2, .sharded = 1, .act_bytes = 2}; // ep 3 does not divide 16 experts
    MemoryPlan p;
    ck_assert_int_eq(memory_plan(&p, &c, &l, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "ep 3") && strstr(err, "n_experts"), "message: %s", err);
    // the printed line carries the categories with their units
    char line[1024];
    FILE *f = fmemopen(line, sizeof line, "w");
    p = plan(2, 1, 1, 1, 1, 2);
    memory_print(f, 1, &p);
    fclose(f);
    ck_assert_msg(strstr(line, "rank 1: memory:") && strstr(line, " B/param") && strstr(line, "main weights ") &&
                  strstr(line, "moments ") && strstr(line, "(1/2 of dense, 1/2 of expert)"), "line: %s", line);
}
END_TEST

// The planner's activations (model_arena_plan: no model, no device) are
// the arena model_alloc_slots allocates, for every recompute mode, slots,
// pipeline chunks (with the zero-bubble deferred grads), intra-document
// masking, the selective recomputes (norms, attention, SwiGLU: each on in
// half the cases, in different combinations) and 2-byte activations, with
// two dense blocks and a shared expert.
START_TEST(test_arena_plan_is_the_allocation) {
    ModelConfig c = test_config();
    c.n_layers = 6;
    c.dense_layers = 2;
    c.dense_hidden = 80;
    c.n_shared = 1;
    c.shared_hidden = 24;
    char err[512];
    ck_assert_msg(model_config_validate(&c, err, sizeof err) == 0, "%s", err);
    Ops bf16 = ops_cpu;
    bf16.act_bytes = 2;
    const Ops *backends[] = {&ops_cpu, &bf16};
    ParamStage chunks = {.n_chunks = 2, .begin = {1, 4}, .end = {3, 6}, .embed = 0, .head = 1};
    const ParamStage *stages[] = {NULL, &chunks};
    int n = 0;
    for (int b = 0; b < 2; b++)
        for (int si = 0; si < 2; si++)
            for (int rc = 0; rc < 4; rc++)
                for (int slots = 1; slots <= 3; slots += 2) {
                    ModelParallel par = {.ep_size = 1, .ep_comm = comm_world(), .stage = stages[si]};
                    Model m;
                    ck_assert_msg(model_init_parallel(&m, &c, backends[b], &par, err, sizeof err) == 0, "%s", err);
                    m.recompute = rc;
                    m.recompute_every = rc == 3 ? 2 : 0;
                    m.recompute_first = rc == 3 && slots == 3 ? 4 : 0;
                    m.defer_wgrad = si == 1 && rc != 3;
                    m.doc_mask = slots == 3;
                    m.recompute_norms = rc % 2 == b;
                    m.recompute_attention = !m.defer_wgrad && (rc / 2 + slots / 3) % 2 == b; // not with zb1
                    m.recompute_swiglu = (rc + slots / 3 + si) % 2 == 0;
                    model_alloc_slots(&m, 2, 16, slots);
                    ModelArenaSpec sp = {.B = 2, .T = 16, .n_slots = slots, .ep = 1, .recompute = rc,
                                         .recompute_every = m.recompute_every, .recompute_first = m.recompute_first,
                                         .defer_wgrad = m.defer_wgrad, .doc_mask = m.doc_mask, .stage = stages[si],
                                         .recompute_norms = m.recompute_norms,
                                         .recompute_attention = m.recompute_attention,
                                         .recompute_swiglu = m.recompute_swiglu};
                    ModelArenaSize sz;
                    ck_assert_msg(model_arena_plan(&c, backends[b], &sp, &sz, err, sizeof err) == 0, "%s", err);
                    ck_assert_msg(sz.arena_bytes == m.arena_bytes && sz.slot_bytes == m.slot_bytes,
                                  "act %zu stage %d recompute %d (norms %d attention %d swiglu %d) slots %d: plan %zu "
                                  "(slot %zu), allocated %zu (slot %zu)", backends[b]->act_bytes, si, rc,
                                  m.recompute_norms, m.recompute_attention, m.recompute_swiglu, slots, sz.arena_bytes,
                                  sz.slot_bytes, m.arena_bytes,
                                  m.slot_bytes);
                    ck_assert_uint_eq(sz.sym_bytes, 0);
                    model_free(&m);
                    n++;
                }
    ck_assert_int_eq(n, 32);
}
END_TEST

int main(void) {
    Suite *s = suite_create("memory");
    TCase *tc = tcase_create("accounting");
    tcase_add_test(tc, test_bf16_sharded_d1_d2_d8);
    tcase_add_test(tc, test_bf16_sharded_with_ep);
    tcase_add_test(tc, test_not_sharded_and_fp32);
    tcase_add_test(tc, test_against_the_store_and_errors);
    tcase_add_test(tc, test_arena_plan_is_the_allocation);
    suite_add_tcase(s, tc);
    return check_run(s);
}
