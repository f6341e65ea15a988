// Model-level behaviour the PyTorch reference does not cover: gradient
// accumulation over micro-batches, random and uniform routing (the router
// still gets its gradient through the gathered weights), aux-loss-free bias
// balancing and the global-batch LB counts.
#include <check.h>

#include "check_main.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

static void small_config(ModelConfig *c) {
    model_config_defaults(c);
    c->vocab_size = 100; c->d_model = 32; c->n_layers = 2; c->n_heads = 2; c->n_experts = 4;
    c->top_k = 2; c->expert_hidden = 16; c->seq_len = 8;
}

static void make_batch(int *tok, int *tgt, int n, int vocab, unsigned seed) {
    for (int i = 0; i < n; i++) { seed = seed * 1103515245 + 12345; tok[i] = (seed >> 16) % vocab; }
    for (int i = 0; i < n; i++) tgt[i] = (i % 8 == 7) ? -1 : tok[(i + 1) % n];
}

static double rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) { d += (double)(a[i] - b[i]) * (a[i] - b[i]); r += (double)b[i] * b[i]; }
    return sqrt(d / r);
}

START_TEST(test_grad_accumulation) {
    ModelConfig c;
    small_config(&c);
    c.lb_coef = 0; // the LB loss is not linear in the batch; CE and z-loss are
    char err[256];
    Model a, b;
    ck_assert_int_eq(model_init(&a, &c, &ops_cpu, err, sizeof err), 0);
    ck_assert_int_eq(model_init(&b, &c, &ops_cpu, err, sizeof err), 0);
    model_init_weights(&a, 5);
    model_init_weights(&b, 5);
    model_alloc_acts(&a, 4, 8);
    model_alloc_acts(&b, 2, 8);
    int tok[32], tgt[32];
    make_batch(tok, tgt, 32, c.vocab_size, 3);
    int valid = 0;
    for (int i = 0; i < 32; i++) valid += tgt[i] >= 0;
    model_zero_grads(&a); model_begin_step(&a);
    model_forward(&a, tok, tgt, 1);
    model_backward(&a, 1.0f / valid, 1.0f);
    model_zero_grads(&b); model_begin_step(&b);
    for (int mb = 0; mb < 2; mb++) {
        model_forward(&b, tok + 16 * mb, tgt + 16 * mb, 1);
        model_backward(&b, 1.0f / valid, 0.5f);
    }
    for (int cl = 0; cl < N_CLASSES; cl++) {
        double d = rel_diff(b.store.grads[cl], a.store.grads[cl], a.store.table.class_numel[cl]);
        ck_assert_msg(d < 1e-5, "class %d: accumulated grads differ by %g", cl, d);
    }
    model_free(&a); model_free(&b);
}
END_TEST

// Activation recompute (train.recompute = experts, gather, layers) runs the
// same kernels on the same inputs, so losses and grads must be bit-identical
// to keeping the activations, with a smaller arena, with and without
// capacity (one rank: the rows stay in place, and the dropped ones are
// zeroed in the outputs and their grads, never in the routed rows). Two
// micro-batches with shared experts and a dense first layer: every path
// through moe_backward. layers: every block but the last, every other one,
// the first three; and with model.lb_global (the recomputed block must reuse
// the step's global counts, not add them again) and the capacity drop count
// (counted once, not again in the recompute).
START_TEST(test_recompute_experts) {
    struct { int mode, every, first, lb_global; } modes[] = {
        {1, 0, 0, 0}, {2, 0, 0, 0}, {3, 0, 0, 0}, {3, 2, 0, 0}, {3, 0, 3, 0}, {3, 0, 0, 1}};
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++)
    for (int cap = 0; cap < 2; cap++) {
        int mode = modes[mi].mode;
        ModelConfig c;
        small_config(&c);
        c.n_layers = 5; c.dense_layers = 1; c.dense_hidden = 24; c.n_shared = 1; c.shared_hidden = 8;
        c.capacity_factor = cap ? 1.0f : 0.0f;
        c.lb_global = modes[mi].lb_global;
        char err[256];
        Model a, b;
        ck_assert_int_eq(model_init(&a, &c, &ops_cpu, err, sizeof err), 0);
        ck_assert_int_eq(model_init(&b, &c, &ops_cpu, err, sizeof err), 0);
        model_init_weights(&a, 9);
        model_init_weights(&b, 9);
        b.recompute = mode;
        b.recompute_every = modes[mi].every;
        b.recompute_first = modes[mi].first;
        model_alloc_acts(&a, 2, 8);
        model_alloc_acts(&b, 2, 8);
        // every other block: blocks 0 (dense) and 2 (MoE), one of each kind, so no sharing
        if (modes[mi].every == 2) ck_assert(b.arena_bytes == a.arena_bytes);
        else ck_assert_msg(b.arena_bytes < a.arena_bytes, "recompute %d, capacity %d: arena %zu not below %zu", mode,
                           cap, b.arena_bytes, a.arena_bytes);
        int tok[32], tgt[32];
        make_batch(tok, tgt, 32, c.vocab_size, 11);
        model_zero_grads(&a); model_begin_step(&a);
        model_zero_grads(&b); model_begin_step(&b);
        for (int mb = 0; mb < 2; mb++) {
            float la = model_forward(&a, tok + 16 * mb, tgt + 16 * mb, 7);
            float lb = model_forward(&b, tok + 16 * mb, tgt + 16 * mb, 7);
            ck_assert_msg(la == lb, "recompute %d, capacity %d, micro-batch %d: loss %.9g vs %.9g", mode, cap, mb,
                          lb, la);
            model_backward(&a, 1.0f / 28, 0.5f);
            model_backward(&b, 1.0f / 28, 0.5f);
        }
        for (int cl = 0; cl < N_CLASSES; cl++)
            ck_assert_msg(!memcmp(a.store.grads[cl], b.store.grads[cl], a.store.table.class_numel[cl] * sizeof(float)),
                          "recompute %d, capacity %d, class %d: grads differ with recompute", mode, cap, cl);
        float da[8], db[8], ca[8 * 16], cb[8 * 16];
        ck_assert(a.n_moe <= 8 && c.n_experts <= 16);
        a.ops->to_host(da, a.dropped_step, a.n_moe * sizeof(float));
        b.ops->to_host(db, b.dropped_step, b.n_moe * sizeof(float));
        ck_assert_msg(!memcmp(da, db, a.n_moe * sizeof(float)), "recompute %d, capacity %d: drop counts differ", mode, cap);
        a.ops->to_host(ca, a.step_counts, (size_t)a.n_moe * c.n_experts * sizeof(float));
        b.ops->to_host(cb, b.step_counts, (size_t)a.n_moe * c.n_experts * sizeof(float));
        ck_assert_msg(!memcmp(ca, cb, (size_t)a.n_moe * c.n_experts * sizeof(float)),
                      "recompute %d, capacity %d: the step's expert counts differ", mode, cap);
        model_free(&a); model_free(&b);
    }
}
END_TEST

// model_zero_dense_grads: the first backward of the step writes the expert
// grads, whatever they held (NaN here), with zeros for experts that get no
// rows (16 experts, top-1, 8 tokens per micro-batch: at least 8 are empty);
// the grads after two micro-batches are bit-identical to zeroing them all.
START_TEST(test_expert_grads_written) {
    for (int cap = 0; cap < 2; cap++) {
        ModelConfig c;
        small_config(&c);
        c.n_layers = 3; c.dense_layers = 1; c.dense_hidden = 24; c.n_shared = 1; c.shared_hidden = 8;
        c.n_experts = 16; c.top_k = 1;
        c.capacity_factor = cap ? 2.0f : 0.0f;
        char err[256];
        Model a, b;
        ck_assert_int_eq(model_init(&a, &c, &ops_cpu, err, sizeof err), 0);
        ck_assert_int_eq(model_init(&b, &c, &ops_cpu, err, sizeof err), 0);
        model_init_weights(&a, 4);
        model_init_weights(&b, 4);
        model_alloc_acts(&a, 1, 8);
        model_alloc_acts(&b, 1, 8);
        int tok[16], tgt[16];
        make_batch(tok, tgt, 16, c.vocab_size, 5);
        for (size_t i = 0; i < b.store.table.class_numel[CLASS_EXPERT]; i++) b.store.grads[CLASS_EXPERT][i] = NAN;
        model_zero_grads(&a); model_begin_step(&a);
        model_zero_dense_grads(&b); model_begin_step(&b);
        for (int mb = 0; mb < 2; mb++) {
            model_forward(&a, tok + 8 * mb, tgt + 8 * mb, 3);
            model_forward(&b, tok + 8 * mb, tgt + 8 * mb, 3);
            model_backward(&a, 1.0f / 14, 0.5f);
            model_backward(&b, 1.0f / 14, 0.5f);
        }
        for (int cl = 0; cl < N_CLASSES; cl++)
            ck_assert_msg(!memcmp(a.store.grads[cl], b.store.grads[cl], a.store.table.class_numel[cl] * sizeof(float)),
                          "capacity %d, class %d: grads differ when the first backward writes them", cap, cl);
        model_free(&a); model_free(&b);
    }
}
END_TEST

// Directional derivative of the loss along the router gradient, by central
// differences in FP32 (h chosen for float): the routing is fixed by the
// seed, so the loss is smooth in the router weights.
static void check_router_grad(int routing) {
    ModelConfig c;
    small_config(&c);
    c.routing = routing;
    c.lb_coef = 0.1f; c.z_coef = 0.01f;
    c.init_std = 0.1f; // spread router logits: fewer near-tie top-k choices to cross
    char err[256];
    Model m;
    ck_assert_int_eq(model_init(&m, &c, &ops_cpu, err, sizeof err), 0);
    model_init_weights(&m, 9);
    model_alloc_acts(&m, 2, 8);
    int tok[16], tgt[16];
    make_batch(tok, tgt, 16, c.vocab_size, 11);
    model_zero_grads(&m); model_begin_step(&m);
    model_forward(&m, tok, tgt, 77);
    model_backward(&m, 1.0f / m.n_valid, 1.0f);
    int r = m.layers[1].router;
    size_t n = m.store.table.entries[r].numel;
    float *w = param_store_main(&m.store, r), *g = param_store_grad(&m.store, r);
    double gg = 0;
    for (size_t i = 0; i < n; i++) gg += (double)g[i] * g[i];
    ck_assert_msg(gg > 0, "router got no gradient");
    double gn = sqrt(gg);
    float *w0 = malloc(n * sizeof(float));
    memcpy(w0, w, n * sizeof(float));
    // learned routing is piecewise smooth: a step that flips a top-k choice
    // crosses a kink, so the step shrinks until no choice flips
    size_t nidx = (size_t)m.B * m.T * c.top_k;
    int *idx0 = malloc(nidx * sizeof(int));
    memcpy(idx0, m.acts[1].idx, nidx * sizeof(int));
    double fd = NAN, used = 0;
    for (double h = 1e-2; h >= 1e-4 && isnan(fd); h /= 3) {
        double lp, lm;
        int same = 1;
        for (size_t i = 0; i < n; i++) w[i] = w0[i] + (float)(h * g[i] / gn);
        model_begin_step(&m); lp = model_forward(&m, tok, tgt, 77);
        same &= !memcmp(idx0, m.acts[1].idx, nidx * sizeof(int));
        for (size_t i = 0; i < n; i++) w[i] = w0[i] - (float)(h * g[i] / gn);
        model_begin_step(&m); lm = model_forward(&m, tok, tgt, 77);
        same &= !memcmp(idx0, m.acts[1].idx, nidx * sizeof(int));
        if (same) { fd = (lp - lm) / (2 * h); used = h; }
    }
    ck_assert_msg(!isnan(fd), "routing %d: every step down to 1e-4 flipped a top-k choice", routing);
    // FP32 loss: differences carry ~4e-7 absolute noise, i.e. 2e-7/h in the derivative
    double tol = 2e-2 + 4e-7 / (2 * used) / gn;
    printf("routing %d: directional derivative %g vs |grad| %g (h %g, tol %.3g)\n", routing, fd, gn, used, tol);
    ck_assert_msg(fabs(fd - gn) / gn < tol, "routing %d: directional derivative %g vs |grad| %g (h %g)", routing, fd, gn, used);
    free(idx0);
    free(w0);
    model_free(&m);
}
START_TEST(test_router_grad_random) { check_router_grad(ROUTING_RANDOM); }
END_TEST
START_TEST(test_router_grad_uniform) { check_router_grad(ROUTING_UNIFORM); }
END_TEST
START_TEST(test_router_grad_learned) { check_router_grad(ROUTING_LEARNED); }
END_TEST

// Capacity on one rank (model.capacity_factor 0.5 with 4 experts, top-2,
// 16 tokens: each expert keeps ceil(0.5 * 16 * 2 / 4) = 4 of its rows):
// against the dropless model with the same weights and random routing (the
// same choices), every expert's first 4 rows in (token, slot) order give the
// same outputs in the first MoE layer and the rest exactly zero; the
// reported drops of every layer equal a recount of its routing.
START_TEST(test_capacity_drops) {
    ModelConfig c;
    small_config(&c);
    c.routing = ROUTING_RANDOM;
    char err[256];
    Model a, b; // a dropless, b with capacity
    ck_assert_int_eq(model_init(&a, &c, &ops_cpu, err, sizeof err), 0);
    c.capacity_factor = 0.5f;
    ck_assert_int_eq(model_init(&b, &c, &ops_cpu, err, sizeof err), 0);
    model_init_weights(&a, 3);
    model_init_weights(&b, 3);
    model_alloc_acts(&a, 2, 8);
    model_alloc_acts(&b, 2, 8);
    int tok[16], tgt[16], N = 16, k = 2, E = 4, D = c.d_model, cap = 4;
    make_batch(tok, tgt, 16, c.vocab_size, 21);
    model_begin_step(&a);
    model_begin_step(&b);
    model_forward(&a, tok, tgt, 5);
    model_forward(&b, tok, tgt, 5);
    int total = 0;
    for (int l = 0; l < c.n_layers; l++) {
        const LayerActs *la = &a.acts[l], *lb = &b.acts[l];
        int li = b.layers[l].moe_index, counts[4] = {0};
        for (int i = 0; i < N * k; i++) counts[lb->idx[i]]++;
        int dropped = 0;
        for (int e = 0; e < E; e++) dropped += counts[e] > cap ? counts[e] - cap : 0;
        ck_assert_msg(b.step_dropped[li] == dropped, "layer %d: %g rows reported dropped, recount %d", l,
                      b.step_dropped[li], dropped);
        ck_assert_float_eq(a.step_dropped[li], 0.0f);
        total += dropped;
        if (l > 0) continue; // later layers see inputs that the drops changed
        for (int e = 0; e < E; e++)
            for (int r = lb->offsets[e]; r < lb->offsets[e + 1]; r++) {
                const float *ya = (const float *)la->ey + (size_t)r * D, *yb = (const float *)lb->ey + (size_t)r * D;
                for (int j = 0; j < D; j++) {
                    if (r - lb->offsets[e] < cap)
                        ck_assert_msg(fabsf(ya[j] - yb[j]) <= 1e-6f * (1 + fabsf(ya[j])), "expert %d row %d kept: %g vs %g",
                                      e, r, yb[j], ya[j]);
                    else
                        ck_assert_msg(yb[j] == 0.0f, "expert %d row %d dropped but %g", e, r, yb[j]);
                }
            }
    }
    ck_assert_msg(total > 0, "the routing dropped nothing: the test checks nothing");
    model_free(&a);
    model_free(&b);
}
END_TEST

START_TEST(test_uniform_and_random_loads) {
    ModelConfig c;
    small_config(&c);
    char err[256];
    for (int routing = ROUTING_RANDOM; routing <= ROUTING_UNIFORM; routing++) {
        c.routing = routing;
        Model m;
        ck_assert_int_eq(model_init(&m, &c, &ops_cpu, err, sizeof err), 0);
        model_init_weights(&m, 1);
        model_alloc_acts(&m, 4, 8);
        int tok[32], tgt[32];
        make_batch(tok, tgt, 32, c.vocab_size, 5);
        model_begin_step(&m);
        model_forward(&m, tok, tgt, 123);
        for (int l = 0; l < m.n_moe; l++) {
            const int *idx = m.acts[l + c.dense_layers].idx;
            for (int t = 0; t < 32; t++) ck_assert_int_ne(idx[2 * t], idx[2 * t + 1]);
            float total = 0;
            for (int e = 0; e < 4; e++) {
                float cnt = m.step_counts[l * 4 + e];
                total += cnt;
                if (routing == ROUTING_UNIFORM) ck_assert_float_eq(cnt, 16.0f); // 32 tokens * 2 / 4
            }
            ck_assert_float_eq(total, 64.0f);
        }
        model_free(&m);
    }
}
END_TEST

START_TEST(test_aux_free_bias) {
    ModelConfig c;
    small_config(&c);
    c.aux_free_rate = 0.05f;
    char err[256];
    Model m;
    ck_assert_int_eq(model_init(&m, &c, &ops_cpu, err, sizeof err), 0);
    model_init_weights(&m, 2);
    model_alloc_acts(&m, 4, 8);
    int tok[32], tgt[32];
    make_batch(tok, tgt, 32, c.vocab_size, 8);
    model_begin_step(&m);
    model_forward(&m, tok, tgt, 1);
    float counts[4];
    memcpy(counts, m.step_counts, sizeof counts);
    model_end_step(&m);
    float mean = 16;
    for (int e = 0; e < 4; e++) {
        float b = m.store.router_bias[e];
        if (counts[e] > mean) ck_assert_float_eq_tol(b, -0.05f, 1e-7);
        else if (counts[e] < mean) ck_assert_float_eq_tol(b, 0.05f, 1e-7);
        else ck_assert_float_eq(b, 0.0f);
    }
    // a large bias on one expert makes every token pick it
    for (int e = 0; e < 4; e++) m.store.router_bias[e] = e == 3 ? 10.0f : 0.0f;
    model_begin_step(&m);
    model_forward(&m, tok, tgt, 1);
    ck_assert_float_eq(m.step_counts[3], 32.0f);
    model_free(&m);
}
END_TEST

START_TEST(test_lb_global_counts) {
    // with lb_global the second micro-batch's LB uses the counts of both
    ModelConfig c;
    small_config(&c);
    c.lb_global = 1;
    char err[256];
    Model m;
    ck_assert_int_eq(model_init(&m, &c, &ops_cpu, err, sizeof err), 0);
    model_init_weights(&m, 4);
    model_alloc_acts(&m, 2, 8);
    int tok[32], tgt[32];
    make_batch(tok, tgt, 32, c.vocab_size, 2);
    model_begin_step(&m);
    model_forward(&m, tok, tgt, 1);
    float first[4];
    memcpy(first, m.acts[0].counts, sizeof first);
    model_forward(&m, tok + 16, tgt + 16, 1);
    const LayerActs *a = &m.acts[0];
    // the LB kernels take the token count from the running counts (lb_tokens 0): both micro-batches' 32
    ck_assert_float_eq(a->lb_tokens, 0.0f);
    float covered = 0;
    for (int e = 0; e < 4; e++) {
        ck_assert_float_eq(a->lb_counts[e], first[e] + a->counts[e]);
        covered += a->lb_counts[e];
    }
    ck_assert_float_eq(covered / c.top_k, 32.0f);
    float expect;
    ops_cpu.lb_loss_forward(&expect, a->probs, a->lb_counts, 32.0f, 16, 4, 2, GATING_SOFTMAX);
    ck_assert_double_eq_tol(m.lb[0], expect, 1e-7);
    model_free(&m);
}
END_TEST

// data.doc_mask: attention gets doc_start only for a micro-batch with a
// document boundary (an EOS before the last position of some row); without
// one it gets NULL and runs the causal kernels. An Ops that records what the
// attention ops were given checks the switch, and the losses check that a
// boundary masks (and the missing one does not).
static const int *seen_fwd, *seen_bwd;
static int fwd_calls;
static void rec_attention_forward(void *out, float *saved, const void *q, const void *k, const void *v,
                                  const int *doc_start, int B, int T, int H, int KV, int hd) {
    seen_fwd = doc_start, fwd_calls++;
    ops_cpu.attention_forward(out, saved, q, k, v, doc_start, B, T, H, KV, hd);
}
static void rec_attention_backward(void *dq, void *dk, void *dv, const void *dout, const float *saved,
                                   const void *q, const void *k, const void *v, const void *out,
                                   const int *doc_start, float *scratch, int B, int T, int H, int KV, int hd) {
    seen_bwd = doc_start;
    ops_cpu.attention_backward(dq, dk, dv, dout, saved, q, k, v, out, doc_start, scratch, B, T, H, KV, hd);
}

START_TEST(test_doc_mask_switch) {
    ModelConfig c;
    small_config(&c);
    Ops rec = ops_cpu;
    rec.attention_forward = rec_attention_forward;
    rec.attention_backward = rec_attention_backward;
    char err[256];
    Model plain, docs;
    ck_assert_int_eq(model_init(&plain, &c, &ops_cpu, err, sizeof err), 0);
    ck_assert_int_eq(model_init(&docs, &c, &rec, err, sizeof err), 0);
    model_init_weights(&plain, 4);
    model_init_weights(&docs, 4);
    int eos = 99;
    docs.doc_mask = 1, docs.doc_eos = eos;
    model_alloc_acts(&plain, 2, 8);
    model_alloc_acts(&docs, 2, 8);
    int tok[16], tgt[16];
    make_batch(tok, tgt, 16, c.vocab_size - 1, 7); // ids < 99: no EOS
    float want = model_forward(&plain, tok, tgt, 1);
    // 0: no EOS; 1: EOS at the last position of each row only (no boundary
    // inside a row); 2: an EOS at position 3 of row 1
    for (int k = 0; k < 3; k++) {
        if (k == 1) tok[7] = tok[15] = eos;
        if (k == 2) tok[8 + 3] = eos;
        if (k > 0) want = model_forward(&plain, tok, tgt, 1);
        seen_fwd = seen_bwd = (const int *)1, fwd_calls = 0;
        model_zero_grads(&docs); model_begin_step(&docs);
        float got = model_forward(&docs, tok, tgt, 1);
        model_backward(&docs, 1.0f / 14, 1.0f);
        ck_assert_int_eq(fwd_calls, c.n_layers);
        ck_assert_int_eq(docs.batch_docs, k == 2);
        ck_assert_msg((seen_fwd != NULL) == (k == 2) && (seen_bwd != NULL) == (k == 2),
                      "case %d: attention got doc_start %p / %p", k, (void *)seen_fwd, (void *)seen_bwd);
        if (k < 2) ck_assert_msg(got == want, "case %d: loss %.9g, causal %.9g", k, got, want);
        else ck_assert_msg(fabsf(got - want) > 1e-6f, "a document boundary changed nothing (%.9g)", got);
    }
    model_free(&plain); model_free(&docs);
}
END_TEST

int main(void) {
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("model");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_grad_accumulation);
    tcase_add_test(tc, test_recompute_experts);
    tcase_add_test(tc, test_expert_grads_written);
    tcase_add_test(tc, test_capacity_drops);
    tcase_add_test(tc, test_router_grad_random);
    tcase_add_test(tc, test_router_grad_uniform);
    tcase_add_test(tc, test_router_grad_learned);
    tcase_add_test(tc, test_uniform_and_random_loads);
    tcase_add_test(tc, test_aux_free_bias);
    tcase_add_test(tc, test_lb_global_counts);
    tcase_add_test(tc, test_doc_mask_switch);
    suite_add_tcase(s, tc);
    return check_run(s);
}
