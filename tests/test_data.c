// Tests for src/data: instance cutting, targets, the seeded shuffle (every
// epoch a permutation, deterministic per seed), random access by global
// index, both token widths, .npy files of every format version, globs, the
// mixture rule of data.h, the eval order, and one test per error (malformed
// .npy headers, a width that is not data.dtype's, ...), each checking that
// the message says what and where. Token files live in a mkdtemp directory removed after each test.
//
// Most files hold token value 1000*f + p at token p of file f, so a token
// read back says where it came from.
#include <check.h>

#include "check_main.h"
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "data/data.h"

#define VOCAB 60000

// ---------------------------------------------------------------------------
// helpers

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/test_data_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
    DIR *dp = opendir(dir);
    if (!dp) return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(dp)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(dp);
    rmdir(dir);
}

static const char *path_of(const char *name)
{
    static char buf[8][256];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

// Writes n tokens little-endian in width 2 or 4; returns the path.
static const char *write_tokens(const char *name, int width, const uint32_t *v, int64_t n)
{
    const char *path = path_of(name);
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    for (int64_t i = 0; i < n; i++)
        for (int b = 0; b < width; b++) fputc((int)((v[i] >> (8 * b)) & 0xff), fp);
    ck_assert_int_eq(fclose(fp), 0);
    return path;
}

// An .npy file as np.save writes it: format version major.0, the dict
// literal dict padded with spaces and '\n' to a multiple of 64 bytes, then n
// tokens of width bytes (n_write of them: fewer makes a truncated file).
static const char *write_npy(const char *name, int major, const char *dict, int width, const uint32_t *v,
                             int64_t n_write)
{
    const char *path = path_of(name);
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    int pre = major == 1 ? 10 : 12;
    size_t len = strlen(dict) + 1;
    while ((pre + len) % 64) len++;
    fwrite("\x93NUMPY", 1, 6, fp);
    fputc(major, fp);
    fputc(0, fp);
    for (int b = 0; b < pre - 8; b++) fputc((int)((len >> (8 * b)) & 0xff), fp);
    fputs(dict, fp);
    for (size_t i = strlen(dict) + 1; i < len; i++) fputc(' ', fp);
    fputc('\n', fp);
    for (int64_t i = 0; i < n_write; i++)
        for (int b = 0; b < width; b++) fputc((int)((v[i] >> (8 * b)) & 0xff), fp);
    ck_assert_int_eq(fclose(fp), 0);
    return path;
}

// File f with n uint16 tokens 1000*f + p.
static const char *write_tagged(const char *name, int f, int64_t n)
{
    uint32_t *v = malloc((size_t)n * sizeof *v + 1);
    for (int64_t p = 0; p < n; p++) v[p] = (uint32_t)(1000 * f + p);
    const char *path = write_tokens(name, 2, v, n);
    free(v);
    return path;
}

static DataLoader *open1(const char *const *paths, int n, int seq_len, uint64_t seed, int shuffle)
{
    char err[512] = "";
    DataSource s = {.patterns = paths, .n_patterns = n};
    DataLoader *d = data_open(&s, 1, TOKENS_U16, seq_len, VOCAB, seed, shuffle, err, sizeof err);
    ck_assert_msg(d != NULL, "data_open: %s", err);
    return d;
}

// Expects data_open to fail with a message containing want.
static void expect_open_error_vocab(const DataSource *s, int n, TokenDtype dt, int seq_len, int vocab,
                                    const char *want)
{
    char err[512] = "";
    DataLoader *d = data_open(s, n, dt, seq_len, vocab, 1, 1, err, sizeof err);
    ck_assert_msg(d == NULL, "data_open accepted a bad input (want '%s')", want);
    ck_assert_msg(strstr(err, want) != NULL, "message '%s' lacks '%s'", err, want);
}

static void expect_open_error(const DataSource *s, int n, TokenDtype dt, int seq_len, const char *want)
{
    char err[512] = "";
    DataLoader *d = data_open(s, n, dt, seq_len, VOCAB, 1, 1, err, sizeof err);
    ck_assert_msg(d == NULL, "data_open accepted a bad input (want '%s')", want);
    ck_assert_msg(strstr(err, want) != NULL, "message '%s' lacks '%s'", err, want);
}

// Native instance id of global index g: files[f].first + offset/seq_len,
// computed from data_locate and the summary, for permutation checks.
static int64_t instance_id(const DataLoader *d, int64_t g, const int64_t *file_first)
{
    int f;
    int64_t tok;
    data_locate(d, g, &f, &tok);
    return file_first[f] + tok / data_summary(d)->seq_len;
}

static int64_t *file_firsts(const DataLoader *d, const int64_t *n_inst)
{
    int n = data_summary(d)->n_files;
    int64_t *first = malloc(((size_t)n + 1) * sizeof *first);
    first[0] = 0;
    for (int i = 0; i < n; i++) first[i + 1] = first[i] + n_inst[i];
    return first;
}

// ---------------------------------------------------------------------------
// cutting and reading

START_TEST(test_dtype_names)
{
    TokenDtype dt;
    ck_assert_int_eq(tokens_dtype_parse("uint16", &dt), 0);
    ck_assert_int_eq(dt, TOKENS_U16);
    ck_assert_int_eq(tokens_dtype_parse("uint32", &dt), 0);
    ck_assert_int_eq(dt, TOKENS_U32);
    ck_assert_int_eq(tokens_dtype_parse("int32", &dt), -1);
    ck_assert_int_eq(tokens_dtype_parse(NULL, &dt), -1);
    ck_assert_str_eq(tokens_dtype_name(TOKENS_U32), "uint32");
    ck_assert_uint_eq(tokens_dtype_size(TOKENS_U16), 2);
    ck_assert_uint_eq(tokens_dtype_size(TOKENS_U32), 4);
}
END_TEST

START_TEST(test_cutting_and_targets)
{
    // 10 tokens -> 2 instances of 4 (2 dropped); 7 -> 1 (3 dropped); 3 -> none.
    const char *paths[3] = {write_tagged("a.bin", 1, 10), write_tagged("b.bin", 2, 7), write_tagged("c.bin", 3, 3)};
    DataLoader *d = open1(paths, 3, 4, 0, 0);
    const DataSummary *s = data_summary(d);
    ck_assert_int_eq(s->n_files, 3);
    ck_assert_int_eq(s->n_tokens, 20);
    ck_assert_int_eq(s->n_instances, 3);
    ck_assert_int_eq(s->instances_per_epoch, 3);
    ck_assert_int_eq(data_instances_per_epoch(d), 3);
    ck_assert_int_eq(s->tokens_per_epoch, 12);
    ck_assert_int_eq(s->sources[0].n_tokens, 20);

    static const int want[4][4] = {{1000, 1001, 1002, 1003}, {1004, 1005, 1006, 1007},
                                   {2000, 2001, 2002, 2003}, {1000, 1001, 1002, 1003}};
    int x[16], y[16];
    char err[256];
    ck_assert_int_eq(data_read(d, 0, 4, x, y, err, sizeof err), 0);   // g = 3 wraps to epoch 1
    for (int b = 0; b < 4; b++)
        for (int t = 0; t < 4; t++) {
            ck_assert_int_eq(x[4 * b + t], want[b][t]);
            ck_assert_int_eq(y[4 * b + t], t < 3 ? want[b][t + 1] : -1);
        }
    ck_assert_int_eq(data_read(d, 1, 1, x, NULL, err, sizeof err), 0);   // targets optional
    ck_assert_int_eq(x[0], 1004);
    ck_assert_int_eq(data_read(d, 0, 0, NULL, NULL, err, sizeof err), 0);
    ck_assert_int_eq(data_read(d, -1, 1, x, y, err, sizeof err), -1);
    ck_assert_int_eq(data_validate_all(d, err, sizeof err), 0);
    ck_assert_str_eq(data_file_path(d, 1), paths[1]);
    ck_assert_ptr_null(data_file_path(d, 3));
    data_close(d);
}
END_TEST

START_TEST(test_seq_len_one)
{
    const char *p = write_tagged("a.bin", 0, 5);
    DataLoader *d = open1(&p, 1, 1, 0, 0);
    int x[5], y[5];
    char err[256];
    ck_assert_int_eq(data_read(d, 0, 5, x, y, err, sizeof err), 0);
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(x[i], i);
        ck_assert_int_eq(y[i], -1);
    }
    data_close(d);
}
END_TEST

START_TEST(test_uint32)
{
    uint32_t v[9];
    for (int i = 0; i < 9; i++) v[i] = 70000u + 1000u * (uint32_t)i + 0x01000000u * (uint32_t)(i % 3);
    const char *p = write_tokens("wide.bin", 4, v, 9);
    DataSource s = {.patterns = &p, .n_patterns = 1};
    char err[256];
    DataLoader *d = data_open(&s, 1, TOKENS_U32, 3, 0x03000000, 5, 0, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    ck_assert_int_eq(data_summary(d)->n_tokens, 9);
    int x[9], y[9];
    ck_assert_int_eq(data_read(d, 0, 3, x, y, err, sizeof err), 0);
    for (int i = 0; i < 9; i++) {
        ck_assert_int_eq(x[i], (int)v[i]);
        ck_assert_int_eq(y[i], i % 3 < 2 ? (int)v[i + 1] : -1);
    }
    data_close(d);

    // The same bytes read as uint16: twice the tokens, the low halves first.
    d = data_open(&s, 1, TOKENS_U16, 2, 65536, 5, 0, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    ck_assert_int_eq(data_summary(d)->n_tokens, 18);
    ck_assert_int_eq(data_read(d, 1, 1, x, y, err, sizeof err), 0);
    ck_assert_int_eq(x[0], (int)(v[1] & 0xffff));
    ck_assert_int_eq(x[1], (int)(v[1] >> 16));
    data_close(d);
}
END_TEST

START_TEST(test_npy_files)
{
    // np.save files of both widths and every format version: the header gives
    // the length, the tokens start after it.
    uint32_t v[12];
    for (int i = 0; i < 12; i++) v[i] = 70000u + 17u * (uint32_t)i;
    const char *p = write_npy("wide.npy", 1, "{'descr': '<u4', 'fortran_order': False, 'shape': (12,), }", 4, v, 12);
    DataSource s = {.patterns = &p, .n_patterns = 1};
    char err[512];
    int x[12], file;
    int64_t tok;
    DataLoader *d = data_open(&s, 1, TOKENS_U32, 4, 100278, 1, 0, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    ck_assert_int_eq(data_summary(d)->n_tokens, 12);
    ck_assert_int_eq(data_read(d, 0, 3, x, NULL, err, sizeof err), 0);
    for (int i = 0; i < 12; i++) ck_assert_int_eq(x[i], (int)v[i]);
    data_locate(d, 2, &file, &tok);
    ck_assert_int_eq(tok, 8);
    data_close(d);

    const char *dicts[] = {"{'descr': '<u2', 'fortran_order': False, 'shape': (12,), }",
                           "{\"descr\": \"<u2\", \"shape\": (12L,), \"fortran_order\": False}"};
    for (int major = 1; major <= 3; major++)
        for (int k = 0; k < 2; k++) {
            for (int i = 0; i < 12; i++) v[i] = 1000u * (uint32_t)major + (uint32_t)(11 - i);
            p = write_npy("narrow.npy", major, dicts[k], 2, v, 12);
            d = data_open(&s, 1, TOKENS_U16, 6, VOCAB, 1, 0, err, sizeof err);
            ck_assert_msg(d != NULL, "version %d: %s", major, err);
            ck_assert_int_eq(data_summary(d)->n_tokens, 12);
            ck_assert_int_eq(data_read(d, 0, 2, x, NULL, err, sizeof err), 0);
            for (int i = 0; i < 12; i++) ck_assert_int_eq(x[i], (int)v[i]);
            data_close(d);
        }
}
END_TEST

START_TEST(test_npy_errors)
{
    uint32_t v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct {
        int major, width, n_write;
        TokenDtype dt;
        const char *dict, *want;
    } cases[] = {
        {1, 4, 8, TOKENS_U16, "{'descr': '<u4', 'fortran_order': False, 'shape': (8,), }",
         "its .npy header says dtype '<u4' (uint32) but data.dtype is uint16: set data.dtype: uint32"},
        {1, 2, 8, TOKENS_U32, "{'descr': '<u2', 'fortran_order': False, 'shape': (8,), }",
         "its .npy header says dtype '<u2' (uint16) but data.dtype is uint32: set data.dtype: uint16"},
        {1, 4, 8, TOKENS_U32, "{'descr': '<i4', 'fortran_order': False, 'shape': (8,), }",
         ".npy dtype '<i4' is not a token dtype moecore reads: save the tokens as uint16 ('<u2') or uint32 ('<u4')"},
        {1, 2, 8, TOKENS_U16, "{'descr': '>u2', 'fortran_order': False, 'shape': (8,), }",
         ".npy dtype '>u2' is big-endian: moecore reads little-endian tokens; save tokens.astype('<u2')"},
        {1, 2, 8, TOKENS_U16, "{'descr': '<u2', 'fortran_order': False, 'shape': (2, 4), }",
         ".npy shape (2, 4) is not 1-D"},
        {1, 2, 8, TOKENS_U16, "{'descr': '<u2', 'fortran_order': True, 'shape': (8,), }", "fortran_order is True"},
        {1, 2, 6, TOKENS_U16, "{'descr': '<u2', 'fortran_order': False, 'shape': (8,), }",
         "its .npy header says 8 tokens (16 bytes after the 128-byte header) but the file holds 12 bytes after it"},
        {4, 2, 8, TOKENS_U16, "{'descr': '<u2', 'fortran_order': False, 'shape': (8,), }",
         ".npy format version 4.0 is not one moecore reads"},
        {1, 2, 8, TOKENS_U16, "{'descr': '<u2', 'fortran_order': False, 'shape': (8,) ", "malformed dict"},
        {1, 2, 8, TOKENS_U16, "{'descr': '<u2', 'shape': (8,), }", "descr, fortran_order or shape is missing"},
        {1, 2, 8, TOKENS_U16, "{'descr': '<u2', 'fortran_order': False, 'shape': (8,), 'x': 1}",
         "unexpected key 'x'"},
        {1, 2, 8, TOKENS_U16, "{'descr': '<u2', 'descr': '<u2', 'fortran_order': False, 'shape': (8,)}",
         "key 'descr' given twice"},
        {1, 2, 8, TOKENS_U16, "{'descr': [('a', '<u2')], 'fortran_order': False, 'shape': (8,)}",
         "descr is not a dtype string"},
        {1, 2, 8, TOKENS_U16, "{'descr': '<u2', 'fortran_order': 0, 'shape': (8,)}", "neither True nor False"},
        {1, 2, 8, TOKENS_U16, "{'descr': '<u2', 'fortran_order': False, 'shape': (-8,)}", "shape is not a tuple"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *p = write_npy("bad.npy", cases[c].major, cases[c].dict, cases[c].width, v, cases[c].n_write);
        DataSource s = {.patterns = &p, .n_patterns = 1};
        expect_open_error(&s, 1, cases[c].dt, 2, p);
        expect_open_error(&s, 1, cases[c].dt, 2, cases[c].want);
    }
    // a header length past the end of the file
    const char *p = path_of("short.npy");
    FILE *fp = fopen(p, "wb");
    fwrite("\x93NUMPY\x01\x00\xff\x00{'descr'", 1, 18, fp);
    fclose(fp);
    DataSource s = {.patterns = &p, .n_patterns = 1};
    expect_open_error(&s, 1, TOKENS_U16, 2, "its .npy header is 265 bytes long but the file holds 18");
}
END_TEST

// Tokens of one width read at the other, found in the first MiB at open
// (the rule in data.h), with the key to change.
START_TEST(test_dtype_mismatch)
{
    enum { N = 2048 };
    uint32_t *v = malloc(N * sizeof *v);
    char err[512];
    const char *p;
    DataSource s = {.patterns = &p, .n_patterns = 1};
    // uint16 tokens read as uint32: ids of 65536 and more
    for (int i = 0; i < N; i++) v[i] = (uint32_t)(i * 37 % 50000) + 1;
    p = write_tokens("u16.bin", 2, v, N);
    expect_open_error_vocab(&s, 1, TOKENS_U32, 8, 100278, "the file looks like uint16 tokens; set data.dtype: uint16");
    DataLoader *d = data_open(&s, 1, TOKENS_U16, 8, 100278, 1, 0, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    data_close(d);
    // uint32 tokens read as uint16: dolma2 (vocab 100278) and gpt-neox (50280)
    // ids, whose high halves are 0 or 1, and 0
    int vocabs[2] = {100278, 50280};
    const char *bound[2] = {"is <= 1 and the others are not", "is <= 0 and the others are not"};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < N; i++) v[i] = (uint32_t)((int64_t)i * 7919 % vocabs[k]);
        p = write_tokens("u32.npy", 4, v, N);
        expect_open_error_vocab(&s, 1, TOKENS_U16, 8, vocabs[k], "the file looks like uint32 tokens; set data.dtype: uint32");
        expect_open_error_vocab(&s, 1, TOKENS_U16, 8, vocabs[k], bound[k]);
        d = data_open(&s, 1, TOKENS_U32, 8, vocabs[k], 1, 0, err, sizeof err);
        ck_assert_msg(d != NULL, "%s", err);
        data_close(d);
    }
    // ids too large at either width: the vocabulary is named
    for (int i = 0; i < N; i++) v[i] = 60000u + (uint32_t)i;
    p = write_tokens("big.bin", 2, v, N);
    expect_open_error_vocab(&s, 1, TOKENS_U16, 8, 50280, "set model.vocab_size to the tokenizer's vocabulary (ids here go up to 62047)");

    // only the first file of a pattern is sampled at open; data.validate
    // checks the width of every file
    for (int i = 0; i < N; i++) v[i] = (uint32_t)(i * 37 % 50000) + 1;
    write_tokens("part-0.bin", 2, v, N);
    for (int i = 0; i < N; i++) v[i] = (uint32_t)((int64_t)i * 7919 % 50280);
    const char *second = write_tokens("part-1.bin", 4, v, N);
    p = path_of("part-*.bin");
    d = data_open(&s, 1, TOKENS_U16, 8, 50280, 1, 0, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    ck_assert_int_eq(data_validate_all(d, err, sizeof err), -1);
    ck_assert_msg(strstr(err, second) && strstr(err, "set data.dtype: uint32"), "%s", err);
    data_close(d);
    free(v);
}
END_TEST

// ---------------------------------------------------------------------------
// the stream

static void make_three(const char *paths[3])
{
    paths[0] = write_tagged("a.bin", 0, 8 * 20 + 3);   // 20 instances of 8
    paths[1] = write_tagged("b.bin", 1, 8 * 13);       // 13
    paths[2] = write_tagged("c.bin", 2, 8 * 17 + 7);   // 17
}

START_TEST(test_determinism)
{
    const char *paths[3];
    make_three(paths);
    enum { G = 160, T = 8 };
    int *a = malloc(G * T * sizeof *a), *b = malloc(G * T * sizeof *b), *c = malloc(G * T * sizeof *c);
    char err[256];
    DataLoader *d1 = open1(paths, 3, T, 1234, 1), *d2 = open1(paths, 3, T, 1234, 1), *d3 = open1(paths, 3, T, 1235, 1);
    ck_assert_int_eq(data_read(d1, 0, G, a, NULL, err, sizeof err), 0);
    ck_assert_int_eq(data_read(d2, 0, G, b, NULL, err, sizeof err), 0);
    ck_assert_int_eq(data_read(d3, 0, G, c, NULL, err, sizeof err), 0);
    ck_assert_int_eq(memcmp(a, b, G * T * sizeof *a), 0);
    ck_assert_int_ne(memcmp(a, c, G * T * sizeof *a), 0);
    ck_assert_uint_eq(data_summary(d1)->fingerprint, data_summary(d2)->fingerprint);
    ck_assert_uint_ne(data_summary(d1)->fingerprint, data_summary(d3)->fingerprint);
    // Fixed values of the stream for seed 1234, so a change to the shuffle
    // (which would break resuming old runs) shows up here.
    int f;
    int64_t tok;
    char got[256] = "";
    for (int g = 0; g < 6; g++) {
        data_locate(d1, g, &f, &tok);
        snprintf(got + strlen(got), sizeof got - strlen(got), "%d:%lld ", f, (long long)tok);
    }
    ck_assert_str_eq(got, "2:64 2:72 1:0 2:0 2:104 0:16 ");
    data_close(d1);
    data_close(d2);
    data_close(d3);
    free(a);
    free(b);
    free(c);
}
END_TEST

START_TEST(test_epochs_are_permutations)
{
    const char *paths[3];
    make_three(paths);
    static const int64_t n_inst[3] = {20, 13, 17};
    DataLoader *d = open1(paths, 3, 8, 7, 1);
    int64_t *first = file_firsts(d, n_inst);
    const int64_t N = 50;
    ck_assert_int_eq(data_instances_per_epoch(d), N);
    int64_t order[4][50];
    int x[8];
    char err[256];
    for (int e = 0; e < 4; e++) {
        int seen[50] = {0};
        for (int64_t k = 0; k < N; k++) {
            int64_t g = e * N + k, id = instance_id(d, g, first);
            ck_assert(id >= 0 && id < N);
            seen[id]++;
            order[e][k] = id;
            // The tokens agree with data_locate.
            int f;
            int64_t tok;
            data_locate(d, g, &f, &tok);
            ck_assert_int_eq(data_read(d, g, 1, x, NULL, err, sizeof err), 0);
            ck_assert_int_eq(x[0], 1000 * f + (int)tok);
            ck_assert_int_eq(x[7], 1000 * f + (int)tok + 7);
        }
        for (int i = 0; i < N; i++) ck_assert_int_eq(seen[i], 1);
    }
    int identity = 1;
    for (int k = 0; k < N; k++) identity &= order[0][k] == k;
    ck_assert(!identity);
    for (int e = 1; e < 4; e++) ck_assert(memcmp(order[0], order[e], sizeof order[0]) != 0);
    free(first);
    data_close(d);
}
END_TEST

// seq_len 1 makes one instance per token, so the permutation is checked for
// many sizes, including 1 and powers of two and four at the edges.
START_TEST(test_permutation_sizes)
{
    static const int sizes[] = {1, 2, 3, 4, 5, 15, 16, 17, 63, 64, 65, 257, 1000};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        int n = sizes[i];
        const char *p = write_tagged("p.bin", 0, n);
        DataLoader *d = open1(&p, 1, 1, 99 + i, 1);
        int *x = malloc(2 * (size_t)n * sizeof *x), *seen = calloc((size_t)n, sizeof *seen);
        char err[256];
        ck_assert_int_eq(data_read(d, 0, 2 * n, x, NULL, err, sizeof err), 0);
        for (int k = 0; k < 2 * n; k++) {
            ck_assert(x[k] >= 0 && x[k] < n);
            seen[x[k]]++;
        }
        for (int k = 0; k < n; k++) ck_assert_int_eq(seen[k], 2);
        free(x);
        free(seen);
        data_close(d);
    }
}
END_TEST

START_TEST(test_range_equals_single)
{
    const char *paths[3];
    make_three(paths);
    DataLoader *d = open1(paths, 3, 8, 42, 1);
    enum { C = 75, T = 8 };
    int x[C * T], y[C * T], x1[T], y1[T];
    char err[256];
    static const int64_t starts[] = {0, 37, 149, 1000000007};   // across epoch boundaries, far ahead
    for (size_t s = 0; s < sizeof starts / sizeof *starts; s++) {
        ck_assert_int_eq(data_read(d, starts[s], C, x, y, err, sizeof err), 0);
        for (int b = C - 1; b >= 0; b--) {   // backwards: order of reads does not matter
            ck_assert_int_eq(data_read(d, starts[s] + b, 1, x1, y1, err, sizeof err), 0);
            ck_assert_int_eq(memcmp(x1, x + b * T, sizeof x1), 0);
            ck_assert_int_eq(memcmp(y1, y + b * T, sizeof y1), 0);
        }
    }
    // Two data-parallel ranks each reading half of a global batch get the
    // same instances as one rank reading all of it.
    int half[2][20 * T];
    ck_assert_int_eq(data_read(d, 500, 40, x, NULL, err, sizeof err), 0);
    ck_assert_int_eq(data_read(d, 500, 20, half[0], NULL, err, sizeof err), 0);
    ck_assert_int_eq(data_read(d, 520, 20, half[1], NULL, err, sizeof err), 0);
    ck_assert_int_eq(memcmp(half, x, sizeof half), 0);
    data_close(d);
}
END_TEST

START_TEST(test_eval_unshuffled)
{
    const char *paths[3];
    make_three(paths);
    DataLoader *d = open1(paths, 3, 8, 42, 0);
    ck_assert_int_eq(data_summary(d)->shuffle, 0);
    static const int n_inst[3] = {20, 13, 17};
    int g = 0, x[8];
    char err[256];
    for (int e = 0; e < 2; e++)
        for (int f = 0; f < 3; f++)
            for (int i = 0; i < n_inst[f]; i++, g++) {
                ck_assert_int_eq(data_read(d, g, 1, x, NULL, err, sizeof err), 0);
                ck_assert_int_eq(x[0], 1000 * f + 8 * i);
            }
    data_close(d);
}
END_TEST

START_TEST(test_globs)
{
    write_tagged("a_0.bin", 0, 4);
    write_tagged("a_1.bin", 1, 4);
    write_tagged("a_10.bin", 10, 4);
    write_tagged("a_2.bin", 2, 4);
    write_tagged("b.bin", 5, 8);
    write_tagged("skip.txt", 9, 4);
    const char *pats[2] = {path_of("b.bin"), path_of("a_*.bin")};
    DataLoader *d = open1(pats, 2, 4, 0, 0);
    static const char *order[5] = {"b.bin", "a_0.bin", "a_1.bin", "a_10.bin", "a_2.bin"};
    ck_assert_int_eq(data_summary(d)->n_files, 5);
    for (int i = 0; i < 5; i++) ck_assert_str_eq(data_file_path(d, i), path_of(order[i]));
    int x[4 * 6];
    char err[256];
    ck_assert_int_eq(data_read(d, 0, 6, x, NULL, err, sizeof err), 0);
    static const int first[6] = {5000, 5004, 0, 1000, 10000, 2000};
    for (int b = 0; b < 6; b++) ck_assert_int_eq(x[4 * b], first[b]);
    data_close(d);

    const char *q = path_of("a_[01].bin");
    d = open1(&q, 1, 4, 0, 0);
    ck_assert_int_eq(data_summary(d)->n_files, 2);
    data_close(d);
}
END_TEST

START_TEST(test_many_files)
{
    // More files than descriptors: the loader must close and reopen.
    struct rlimit rl;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    enum { NF = 60 };
    for (int f = 0; f < NF; f++) {
        char name[32];
        snprintf(name, sizeof name, "m%03d.bin", f);
        write_tagged(name, f, 6);
    }
    struct rlimit low = {.rlim_cur = 24, .rlim_max = rl.rlim_max};
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
    const char *p = path_of("m*.bin");
    DataLoader *d = open1(&p, 1, 3, 3, 1);
    int x[3], seen[NF][2] = {{0}};
    char err[256];
    for (int g = 0; g < 2 * NF; g++) {
        ck_assert_msg(data_read(d, g, 1, x, NULL, err, sizeof err) == 0, "%s", err);
        seen[x[0] / 1000][(x[0] % 1000) / 3]++;
    }
    for (int f = 0; f < NF; f++) ck_assert(seen[f][0] == 1 && seen[f][1] == 1);
    ck_assert_int_eq(data_validate_all(d, err, sizeof err), 0);
    data_close(d);
    setrlimit(RLIMIT_NOFILE, &rl);
}
END_TEST

// ---------------------------------------------------------------------------
// mixture

START_TEST(test_mixture_counts)
{
    // web: 10 instances, weight 3; code: 30 instances, weight 1. T = 40, so
    // web fills llround(40*3/4) = 30 positions (each instance 3 times) and
    // code 10 (a third of its data per epoch, all of it every 3 epochs).
    const char *web[1] = {write_tagged("web.bin", 1, 4 * 10 + 1)};
    const char *code[2] = {write_tagged("code0.bin", 2, 4 * 12), write_tagged("code1.bin", 3, 4 * 18 + 3)};
    DataSource s[2] = {{"web", web, 1, 3.0}, {"code", code, 2, 1.0}};
    char err[512];
    DataLoader *d = data_open(s, 2, TOKENS_U16, 4, VOCAB, 11, 1, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    const DataSummary *sm = data_summary(d);
    ck_assert_int_eq(sm->weighted, 1);
    ck_assert_int_eq(sm->n_instances, 40);
    ck_assert_int_eq(sm->instances_per_epoch, 40);
    ck_assert_int_eq(sm->sources[0].per_epoch, 30);
    ck_assert_int_eq(sm->sources[1].per_epoch, 10);
    ck_assert_str_eq(sm->sources[1].name, "code");
    ck_assert_int_eq(sm->sources[1].n_files, 2);
    ck_assert_int_eq(sm->sources[1].n_instances, 30);
    ck_assert_int_eq(data_file_source(d, 0), 0);
    ck_assert_int_eq(data_file_source(d, 2), 1);

    static const int64_t n_inst[3] = {10, 12, 18};
    int64_t *first = file_firsts(d, n_inst);
    int web_seen[10] = {0}, code_seen[30] = {0};
    for (int e = 0; e < 3; e++) {
        int per_source[2] = {0, 0};
        for (int k = 0; k < 40; k++) {
            int64_t g = 40 * e + k, id = instance_id(d, g, first);
            int f;
            int64_t tok;
            data_locate(d, g, &f, &tok);
            per_source[data_file_source(d, f)]++;
            if (id < 10) web_seen[id]++;
            else code_seen[id - 10]++;
        }
        ck_assert_int_eq(per_source[0], 30);
        ck_assert_int_eq(per_source[1], 10);
        if (e == 0)
            for (int i = 0; i < 10; i++) ck_assert_int_eq(web_seen[i], 3);
    }
    for (int i = 0; i < 10; i++) ck_assert_int_eq(web_seen[i], 9);
    for (int i = 0; i < 30; i++) ck_assert_int_eq(code_seen[i], 1);
    char line[512];
    data_describe(d, line, sizeof line);
    ck_assert_msg(strstr(line, "code: 2 files, 30 instances -> 10/epoch (weight 1)"), "%s", line);
    free(first);
    data_close(d);
}
END_TEST

START_TEST(test_mixture_rounding_unshuffled)
{
    // T = 40 over weights 1:1:1 -> llround(13.33) = 13 each, N = 39. Without
    // shuffle the sources follow each other in order.
    const char *a[1] = {write_tagged("a.bin", 1, 2 * 10)};
    const char *b[1] = {write_tagged("b.bin", 2, 2 * 10)};
    const char *c[1] = {write_tagged("c.bin", 3, 2 * 20)};
    DataSource s[3] = {{NULL, a, 1, 1}, {NULL, b, 1, 1}, {NULL, c, 1, 1}};
    char err[512];
    DataLoader *d = data_open(s, 3, TOKENS_U16, 2, VOCAB, 5, 0, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    ck_assert_int_eq(data_instances_per_epoch(d), 39);
    ck_assert_str_eq(data_summary(d)->sources[2].name, "source2");
    for (int k = 0; k < 39; k++) {
        int f;
        int64_t tok;
        data_locate(d, k, &f, &tok);
        ck_assert_int_eq(f, k / 13);
    }
    data_close(d);
}
END_TEST

// ---------------------------------------------------------------------------
// errors

START_TEST(test_error_missing_file)
{
    const char *p[2] = {write_tagged("a.bin", 0, 8), path_of("nope.bin")};
    DataSource s = {.patterns = p, .n_patterns = 2};
    expect_open_error(&s, 1, TOKENS_U16, 4, p[1]);
}
END_TEST

START_TEST(test_error_empty_pattern)
{
    write_tagged("a.bin", 0, 8);
    const char *p[2] = {path_of("a.bin"), path_of("shard-*.bin")};
    DataSource s = {.patterns = p, .n_patterns = 2};
    expect_open_error(&s, 1, TOKENS_U16, 4, p[1]);
    expect_open_error(&s, 1, TOKENS_U16, 4, "matches no files");
}
END_TEST

START_TEST(test_error_bad_size)
{
    uint32_t v[3] = {1, 2, 3};
    const char *p = write_tokens("odd.bin", 1, v, 3);   // 3 bytes
    DataSource s = {.patterns = &p, .n_patterns = 1};
    expect_open_error(&s, 1, TOKENS_U16, 1, p);
    expect_open_error(&s, 1, TOKENS_U16, 1, "not a multiple of 2");
    p = write_tokens("six.bin", 2, v, 3);                // 6 bytes: fine as uint16, not as uint32
    expect_open_error(&s, 1, TOKENS_U32, 1, "six.bin");
    expect_open_error(&s, 1, TOKENS_U32, 1, "not a multiple of 4");
}
END_TEST

START_TEST(test_error_directory)
{
    const char *p = dir;
    DataSource s = {.patterns = &p, .n_patterns = 1};
    expect_open_error(&s, 1, TOKENS_U16, 1, "not a regular file");
}
END_TEST

START_TEST(test_error_no_instances)
{
    const char *p = write_tagged("short.bin", 0, 5);
    DataSource s = {.patterns = &p, .n_patterns = 1};
    expect_open_error(&s, 1, TOKENS_U16, 8, "not one complete instance of 8 tokens");
}
END_TEST

START_TEST(test_error_bad_args)
{
    const char *p = write_tagged("a.bin", 0, 8);
    const char *q = write_tagged("b.bin", 1, 8);
    const char *r = write_tagged("c.bin", 2, 3);
    DataSource s = {.patterns = &p, .n_patterns = 1};
    expect_open_error(&s, 1, TOKENS_U16, 0, "seq_len");
    expect_open_error(&s, 0, TOKENS_U16, 4, "no sources");
    DataSource mixed[2] = {{"x", &p, 1, 1.0}, {"y", &q, 1, 0.0}};
    expect_open_error(mixed, 2, TOKENS_U16, 4, "1 of 2 sources have a weight");
    DataSource empty[2] = {{"x", &p, 1, 1.0}, {"tiny", &r, 1, 1.0}};
    expect_open_error(empty, 2, TOKENS_U16, 4, "data source tiny (weight 1)");
    DataSource nan[1] = {{"n", &p, 1, NAN}};
    expect_open_error(nan, 1, TOKENS_U16, 4, "not finite");
    DataSource none[1] = {{"z", &p, 0, 0}};
    expect_open_error(none, 1, TOKENS_U16, 4, "data source z: no paths");
}
END_TEST

START_TEST(test_error_token_out_of_range)
{
    // In the first MiB of the first file of a path or pattern, an id >=
    // vocab_size is refused at open: token 7 of bad.bin (byte offset 14).
    uint32_t v[10] = {1, 2, 3, 4, 5, 6, 7, 60001, 9, 60002};
    write_tagged("a.bin", 0, 8);
    const char *paths[2] = {path_of("a.bin"), write_tokens("bad.bin", 2, v, 10)};
    DataSource s = {.patterns = paths, .n_patterns = 2};
    expect_open_error(&s, 1, TOKENS_U16, 4, "bad.bin: token 60001 at byte offset 14 is >= model.vocab_size 60000");
    expect_open_error(&s, 1, TOKENS_U16, 4, "set model.vocab_size to the tokenizer's vocabulary (ids here go up to 60002)");

    // Past the first MiB the read of an instance finds it: token 524295 (byte
    // offset 1048590) of big.bin; token 524297, in the dropped remainder, only
    // the full scan sees.
    const int64_t n = 524298;
    uint32_t *w = malloc((size_t)n * sizeof *w);
    for (int64_t i = 0; i < n; i++) w[i] = (uint32_t)(i % 1000) + 1;
    w[524295] = 60001;
    w[524297] = 60002;
    paths[1] = write_tokens("big.bin", 2, w, n);
    DataLoader *d = open1(paths, 2, 4, 0, 0);
    int x[4];
    char err[512];
    int64_t g = 2 + 524292 / 4;   // a.bin holds 2 instances
    ck_assert_int_eq(data_read(d, g - 1, 1, x, NULL, err, sizeof err), 0);
    ck_assert_int_eq(data_read(d, g, 1, x, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, paths[1]) && strstr(err, "byte offset 1048590") && strstr(err, "60001"), "%s", err);
    ck_assert_int_eq(data_validate_all(d, err, sizeof err), -1);
    ck_assert_msg(strstr(err, paths[1]) && strstr(err, "byte offset 1048590"), "%s", err);
    data_close(d);

    w[524295] = 8;
    paths[1] = write_tokens("big.bin", 2, w, n);
    d = open1(paths, 2, 4, 0, 0);
    ck_assert_int_eq(data_read(d, g, 1, x, NULL, err, sizeof err), 0);
    ck_assert_int_eq(data_validate_all(d, err, sizeof err), -1);
    ck_assert_msg(strstr(err, paths[1]) && strstr(err, "token 60002 at byte offset 1048594"), "%s", err);
    data_close(d);
    free(w);
}
END_TEST

START_TEST(test_error_file_changed)
{
    const char *p = write_tagged("a.bin", 0, 8);
    DataLoader *d = open1(&p, 1, 4, 0, 0);
    write_tagged("a.bin", 0, 12);
    int x[4];
    char err[512];
    ck_assert_int_eq(data_read(d, 0, 1, x, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, p) && strstr(err, "size changed"), "%s", err);
    data_close(d);
}
END_TEST

START_TEST(test_describe)
{
    const char *paths[3];
    make_three(paths);
    DataLoader *d = open1(paths, 3, 8, 1, 1);
    char line[512];
    data_describe(d, line, sizeof line);
    ck_assert_msg(strstr(line, "3 files in 1 sources (uint16), 410 tokens, 50 instances/epoch x 8 tokens "
                               "= 400 tokens/epoch, shuffled; source0: 3 files, 50 instances -> 50/epoch"),
                  "%s", line);
    data_describe(d, line, 10);   // truncates safely
    ck_assert_uint_eq(strlen(line), 9);
    data_close(d);
}
END_TEST

static Suite *data_suite(void)
{
    Suite *s = suite_create("data");
    TCase *tc = tcase_create("read");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_dtype_names);
    tcase_add_test(tc, test_cutting_and_targets);
    tcase_add_test(tc, test_seq_len_one);
    tcase_add_test(tc, test_uint32);
    tcase_add_test(tc, test_npy_files);
    tcase_add_test(tc, test_determinism);
    tcase_add_test(tc, test_epochs_are_permutations);
    tcase_add_test(tc, test_permutation_sizes);
    tcase_add_test(tc, test_range_equals_single);
    tcase_add_test(tc, test_eval_unshuffled);
    tcase_add_test(tc, test_globs);
    tcase_add_test(tc, test_many_files);
    tcase_add_test(tc, test_mixture_counts);
    tcase_add_test(tc, test_mixture_rounding_unshuffled);
    tcase_add_test(tc, test_describe);
    suite_add_tcase(s, tc);
    TCase *te = tcase_create("errors");
    tcase_add_checked_fixture(te, setup, teardown);
    tcase_add_test(te, test_error_missing_file);
    tcase_add_test(te, test_error_empty_pattern);
    tcase_add_test(te, test_error_bad_size);
    tcase_add_test(te, test_error_directory);
    tcase_add_test(te, test_error_no_instances);
    tcase_add_test(te, test_error_bad_args);
    tcase_add_test(te, test_error_token_out_of_range);
    tcase_add_test(te, test_npy_errors);
    tcase_add_test(te, test_dtype_mismatch);
    tcase_add_test(te, test_error_file_changed);
    suite_add_tcase(s, te);
    return s;
}

int main(void)
{
    return check_run(data_suite());
}
