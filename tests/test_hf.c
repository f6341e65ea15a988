// Unit tests for src/ckpt/hf: BF16 rounding and F16 widening against
// reference arithmetic, config.json written and read back to the same model
// config, configs from transformers without moecore's extra fields, the
// tensor-name map covering every parameter element exactly once, and
// refusals that name the field. The end-to-end conversions are in
// tests/test_hf_cli.sh, the comparison with transformers in tests/hf_compare.py.
#include <check.h>

#include "check_main.h"
#include <json-c/json.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/hf.h"
#include "params/layout.h"

static float bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }

// ---- number formats -----------------------------------------------------------------

START_TEST(test_bf16_cases)
{
    static const struct { uint32_t in; uint16_t out; } cases[] = {
        {0x3f800000, 0x3f80},  // 1
        {0x3f808000, 0x3f80},  // 1 + 2^-8: a tie, to the even 0x3f80
        {0x3f818000, 0x3f82},  // 1 + 3 * 2^-8: a tie, to the even 0x3f82
        {0x3f808001, 0x3f81},  // just above the tie
        {0x3f807fff, 0x3f80},  // just below it
        {0x80000000, 0x8000},  // -0
        {0x7f800000, 0x7f80},  // inf
        {0xff800000, 0xff80},  // -inf
        {0x7f7fffff, 0x7f80},  // FLT_MAX rounds to inf
        {0x00000001, 0x0000},  // the smallest subnormal rounds to 0
        {0x00008000, 0x0000},  // a subnormal tie, to even
        {0x00018000, 0x0002},
        {0xbf7fffff, 0xbf80},  // -0.99999994 -> -1
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ck_assert_msg(hf_f32_to_bf16(bits_f32(cases[i].in)) == cases[i].out, "0x%08x -> 0x%04x, expected 0x%04x",
                      cases[i].in, hf_f32_to_bf16(bits_f32(cases[i].in)), cases[i].out);
    uint16_t n = hf_f32_to_bf16(bits_f32(0x7fc00001)), n2 = hf_f32_to_bf16(bits_f32(0x7f800001));
    ck_assert(isnan(hf_bf16_to_f32(n)) && isnan(hf_bf16_to_f32(n2)));
}
END_TEST

// Against the definition: the nearer of the two BF16 neighbours, ties to the even one.
START_TEST(test_bf16_random)
{
    uint64_t s = 12345;
    for (int i = 0; i < 2000000; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        uint32_t u = (uint32_t)s;
        if ((u & 0x7f800000u) == 0x7f800000u) continue;  // inf / NaN: above
        float x = bits_f32(u);
        // the neighbours by magnitude; past the largest BF16 the upper one is inf, rounded to as if at 2^128
        uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
        double ax = fabs((double)x), xl = fabs((double)bits_f32(lo));
        double xh = (hi & 0x7fffffffu) == 0x7f800000u ? ldexp(1.0, 128) : fabs((double)bits_f32(hi));
        double dl = ax - xl, dh = xh - ax;
        uint16_t want = (uint16_t)((dl < dh || (dl == dh && !((lo >> 16) & 1)) ? lo : hi) >> 16);
        uint16_t got = hf_f32_to_bf16(x);
        ck_assert_msg(got == want, "0x%08x -> 0x%04x, expected 0x%04x", u, got, want);
        ck_assert(f32_bits(hf_bf16_to_f32(got)) == (uint32_t)got << 16);
    }
}
END_TEST

START_TEST(test_f16_all)
{
    for (uint32_t h = 0; h < 65536; h++) {
        int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
        double want = e == 31 ? (m ? NAN : INFINITY) : e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
        if (sign) want = -want;
        float got = hf_f16_to_f32((uint16_t)h);
        if (isnan(want)) ck_assert_msg(isnan(got), "0x%04x", h);
        else ck_assert_msg(got == (float)want && !signbit(got) == !signbit(want), "0x%04x -> %g, expected %g", h, got, want);
    }
}
END_TEST

// ---- configs ---------------------------------------------------------------------------

static ModelConfig make_config(const char *const *kv) {
    ModelConfig c;
    model_config_defaults(&c);
    char err[256];
    for (int i = 0; kv[i]; i += 2) ck_assert_msg(!model_config_set(&c, kv[i], kv[i + 1], err, sizeof err), "%s", err);
    ck_assert_msg(!model_config_validate(&c, err, sizeof err), "%s", err);
    return c;
}

static const char *const round_trip_configs[][32] = {
    {"vocab_size", "257", NULL},
    {"norm", "post", "head_dim", "24", "n_kv_heads", "2", "renorm_topk", "true", "rope_theta", "500000",
     "norm_eps", "1e-6", "lb_coef", "0.02", "z_coef", "0", "seq_len", "77", "init_std", "0.01", NULL},
    {"vocab_size", "50280", "d_model", "96", "n_heads", "3", "n_experts", "64", "top_k", "8", "lb_global", "true", NULL},
};

START_TEST(test_config_round_trip)
{
    ModelConfig c = make_config(round_trip_configs[_i]), back;
    HfFormat f = HF_AUTO, f2;
    char err[512];
    ck_assert_msg(!hf_check_config(&c, &f, err, sizeof err), "%s", err);
    ck_assert_int_eq(f, c.norm == NORM_PRE ? HF_OLMOE : HF_FLEX_OLMO);
    char *js = hf_config_json(&c, f, ST_F32, -1);
    int vocab = 0, tied = 1;
    ck_assert_msg(!hf_config_parse(js, "config.json", &back, &f2, &vocab, &tied, err, sizeof err), "%s", err);
    ck_assert_int_eq(f2, f);
    ck_assert_int_eq(vocab, c.padded_vocab);
    ck_assert_int_eq(tied, 0);
    char *a = model_config_to_json(&c), *b = model_config_to_json(&back);
    ck_assert_str_eq(a, b);
    free(a); free(b); free(js);
}
END_TEST

// A config.json as transformers writes it, without moecore's own fields.
START_TEST(test_config_foreign)
{
    const char *js =
        "{\"model_type\": \"olmoe\", \"vocab_size\": 300, \"hidden_size\": 64, \"intermediate_size\": 32,"
        " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_experts\": 8, \"num_experts_per_tok\": 2,"
        " \"max_position_embeddings\": 8192, \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 50000.0},"
        " \"router_aux_loss_coef\": 0.05, \"norm_topk_prob\": true, \"tie_word_embeddings\": true,"
        " \"clip_qkv\": null, \"rope_scaling\": null, \"hidden_act\": \"silu\", \"attention_bias\": false}";
    ModelConfig c;
    HfFormat f;
    int vocab, tied;
    char err[512];
    ck_assert_msg(!hf_config_parse(js, "config.json", &c, &f, &vocab, &tied, err, sizeof err), "%s", err);
    ck_assert_int_eq(f, HF_OLMOE);
    ck_assert_int_eq(vocab, 300);
    ck_assert_int_eq(tied, 1);
    ck_assert_int_eq(c.vocab_size, 300);
    ck_assert_int_eq(c.padded_vocab, 384);
    ck_assert_int_eq(c.n_kv_heads, 4);
    ck_assert_int_eq(c.head_dim, 16);
    ck_assert_int_eq(c.seq_len, 4096);       // max_position_embeddings capped
    ck_assert(c.rope_theta == 50000.0f);
    ck_assert(c.norm_eps == 1e-5f);          // olmoe's default
    ck_assert(c.lb_coef == 0.05f);
    ck_assert(c.renorm_topk == 1);
    ck_assert_int_eq(c.norm, NORM_PRE);
    ck_assert_int_eq(c.qk_norm, QKNORM_FULL);
    ModelConfig d = make_config((const char *const[]){"lb_coef", "0.05", NULL});
    ck_assert(c.z_coef == d.z_coef);         // not in config.json: moecore's default
}
END_TEST

static const struct { const char *edit, *want; } bad_configs[] = {
    {"\"model_type\": \"mixtral\"", "model_type mixtral is not supported"},
    {"\"hidden_size\": \"64\"", "hidden_size: expected a positive integer"},
    {"\"hidden_size\": 0", "hidden_size: expected a positive integer"},
    {"\"num_experts\": null", "missing num_experts"},
    {"\"hidden_act\": \"gelu\"", "hidden_act = \"gelu\" is not supported"},
    {"\"attention_bias\": true", "attention_bias = true is not supported"},
    {"\"clip_qkv\": 8.0", "clip_qkv = 8.0 is not supported"},
    {"\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}", "rope_scaling = "},
    {"\"head_dim\": 32", "head_dim = 32: olmoe uses hidden_size / num_attention_heads"},
    {"\"rms_norm_eps\": \"small\"", "rms_norm_eps: expected a number"},
    {"\"norm_topk_prob\": 1", "norm_topk_prob: expected true or false"},
    {"\"num_experts_per_tok\": 9", "model.top_k (9) must be <= model.n_experts (8)"},
    {"\"moecore_model_config\": {\"norm\": \"sideways\"}", "moecore_model_config: model.norm: 'sideways'"},
};

START_TEST(test_config_bad)
{
    char js[1024], err[512];
    snprintf(js, sizeof js,
             "{\"model_type\": \"olmoe\", \"vocab_size\": 300, \"hidden_size\": 64, \"intermediate_size\": 32,"
             " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_experts\": 8, \"num_experts_per_tok\": 2,"
             " %s}", bad_configs[_i].edit);
    ModelConfig c;
    HfFormat f;
    int vocab, tied;
    err[0] = 0;
    ck_assert_int_eq(hf_config_parse(js, "cfg.json", &c, &f, &vocab, &tied, err, sizeof err), -1);
    ck_assert_msg(strstr(err, bad_configs[_i].want) && !strncmp(err, "cfg.json: ", 10), "'%s' does not say '%s'", err,
                  bad_configs[_i].want);
}
END_TEST

START_TEST(test_config_not_json)
{
    ModelConfig c;
    HfFormat f;
    int vocab, tied;
    char err[512];
    ck_assert_int_eq(hf_config_parse("{\"model_type\": ", "c.json", &c, &f, &vocab, &tied, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "c.json: not valid JSON"), "%s", err);
    ck_assert_int_eq(hf_config_parse("[1, 2]", "c.json", &c, &f, &vocab, &tied, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "c.json: not a JSON object"), "%s", err);
}
END_TEST

// ---- tensor map ----------------------------------------------------------------------------

START_TEST(test_tensor_map)
{
    const char *norm = _i ? "post" : "pre";
    ModelConfig c = make_config((const char *const[]){"norm", norm, "n_layers", "3", "n_experts", "5", "d_model", "32",
                                                      "expert_hidden", "24", "vocab_size", "300", NULL});
    ParamTable t;
    char err[512];
    ck_assert_msg(!param_table_for_config(&c, &t, err, sizeof err), "%s", err);
    HfTensor *map;
    int n;
    HfFormat f = _i ? HF_FLEX_OLMO : HF_OLMOE;
    ck_assert_msg(!hf_tensor_map(&t, f, c.padded_vocab, 0, &map, &n, err, sizeof err), "%s", err);
    ck_assert_int_eq(n, t.n + 3 * 3 * (5 - 1));
    // every element of every parameter exactly once, names unique, in table order
    size_t *covered = calloc(t.n, sizeof(size_t));
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(map[i].offset, covered[map[i].param]);
        covered[map[i].param] += map[i].numel;
        ck_assert(i == 0 || map[i].param >= map[i - 1].param);
        for (int j = 0; j < i; j++) ck_assert_msg(strcmp(map[i].name, map[j].name), "duplicate %s", map[i].name);
    }
    for (int p = 0; p < t.n; p++) ck_assert_int_eq(covered[p], t.entries[p].numel);
    free(covered);
    // spot checks of names and shapes
    int found = 0;
    for (int i = 0; i < n; i++) {
        const HfTensor *h = &map[i];
        const char *ours = t.entries[h->param].name;
        if (!strcmp(h->name, "model.layers.2.mlp.experts.4.down_proj.weight")) {
            ck_assert_str_eq(ours, "layers.2.moe.experts.w_down");
            ck_assert(h->shape[0] == 32 && h->shape[1] == 24 && h->offset == 4 * 32 * 24);
            found++;
        }
        if (!strcmp(h->name, "model.layers.0.post_attention_layernorm.weight")) {
            ck_assert_str_eq(ours, _i ? "layers.0.attn_post_norm" : "layers.0.ffn_norm");
            found++;
        }
        if (!strcmp(h->name, _i ? "model.layers.1.post_feedforward_layernorm.weight" : "model.layers.1.input_layernorm.weight")) {
            ck_assert_str_eq(ours, _i ? "layers.1.ffn_post_norm" : "layers.1.attn_norm");
            found++;
        }
        if (!strcmp(h->name, "lm_head.weight")) {
            ck_assert(h->shape[0] == 384 && h->shape[1] == 32);
            found++;
        }
    }
    ck_assert_int_eq(found, 4);
    free(map);
    // an HF vocabulary smaller than the padded one fills the first rows only; tied reads the embedding
    ck_assert(!hf_tensor_map(&t, f, 300, 1, &map, &n, err, sizeof err));
    for (int i = 0; i < n; i++)
        if (!strcmp(t.entries[map[i].param].name, "lm_head")) {
            ck_assert_str_eq(map[i].name, "model.embed_tokens.weight");
            ck_assert(map[i].shape[0] == 300 && map[i].numel == 300 * 32);
        }
    free(map);
    param_table_free(&t);
}
END_TEST

START_TEST(test_check_config_names_field)
{
    static const char *const cases[][6] = {
        {"norm", "peri", NULL, NULL, "model.norm = peri"},
        {"qk_norm", "head", NULL, NULL, "model.qk_norm = head"},
        {"gating", "sigmoid", NULL, NULL, "model.gating = sigmoid"},
        {"dense_layers", "1", NULL, NULL, "model.dense_layers = 1"},
        {"n_shared", "1", "shared_hidden", "8", "model.n_shared = 1"},
        {"routing", "uniform", NULL, NULL, "model.routing = uniform"},
        {"aux_free_rate", "0.01", NULL, NULL, "model.aux_free_rate = 0.01"},
        {"head_dim", "64", NULL, NULL, "model.head_dim = 64"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ModelConfig c = make_config((const char *const[]){cases[i][0], cases[i][1], cases[i][2], cases[i][3], NULL});
        HfFormat f = HF_AUTO;
        char err[512] = "";
        ck_assert_int_eq(hf_check_config(&c, &f, err, sizeof err), -1);
        ck_assert_msg(strstr(err, cases[i][4]), "'%s' does not say '%s'", err, cases[i][4]);
    }
    ModelConfig c = make_config((const char *const[]){"norm", "post", NULL});
    HfFormat f = HF_OLMOE;
    char err[512];
    ck_assert_int_eq(hf_check_config(&c, &f, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "model.norm = post cannot be written as olmoe"), "%s", err);
}
END_TEST

static Suite *hf_suite(void) {
    Suite *s = suite_create("hf");
    TCase *tc = tcase_create("hf");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_bf16_cases);
    tcase_add_test(tc, test_bf16_random);
    tcase_add_test(tc, test_f16_all);
    tcase_add_loop_test(tc, test_config_round_trip, 0, sizeof round_trip_configs / sizeof round_trip_configs[0]);
    tcase_add_test(tc, test_config_foreign);
    tcase_add_loop_test(tc, test_config_bad, 0, sizeof bad_configs / sizeof bad_configs[0]);
    tcase_add_test(tc, test_config_not_json);
    tcase_add_loop_test(tc, test_tensor_map, 0, 2);
    tcase_add_test(tc, test_check_config_names_field);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return check_run(hf_suite());
}
