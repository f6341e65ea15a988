// Tests for src/ckpt/safetensors: round trips, the exact header bytes
// Python's writer produces, byte-range I/O in any order, and one rejection
// test per malformed-file case (table `bad`), each checking that the
// message names the file and the problem.
#include <check.h>

#include "check_main.h"
#include <fcntl.h>
#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/safetensors.h"

// ---------------------------------------------------------------------------
// helpers

static void tmp_path(char *buf, size_t n)
{
    snprintf(buf, n, "/tmp/test_safetensors_XXXXXX");
    int fd = mkstemp(buf);
    ck_assert_msg(fd >= 0, "mkstemp failed");
    close(fd);
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_uint_eq(fwrite(p, 1, n, fp), n);
    ck_assert_int_eq(fclose(fp), 0);
}

static unsigned char *read_all(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    ck_assert_ptr_nonnull(fp);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *p = malloc((size_t)len + 1);
    ck_assert_uint_eq(fread(p, 1, (size_t)len, fp), (size_t)len);
    fclose(fp);
    *n = (size_t)len;
    return p;
}

// A file: u64 hdr_len, then json_len bytes of json, then data_len zero bytes.
static void write_st(const char *path, uint64_t hdr_len, const char *json, size_t json_len, size_t data_len)
{
    size_t n = 8 + json_len + data_len;
    unsigned char *p = calloc(1, n);
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(hdr_len >> (8 * i));
    memcpy(p + 8, json, json_len);
    write_bytes(path, p, n);
    free(p);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 131 + seed * 7 + (i >> 8));
}

// A layout with every dtype, a scalar and two empty tensors.
#define N_MIXED 12
static void build_mixed(StFile *f)
{
    static const struct { const char *name; StDtype dt; int ndim; int64_t shape[3]; } t[N_MIXED] = {
        {"embed.weight", ST_F32, 2, {5, 7}},
        {"layers.0.attn.bf16", ST_BF16, 3, {2, 3, 4}},
        {"step", ST_I64, 0, {0}},
        {"empty_u8", ST_U8, 1, {0}},
        {"f64", ST_F64, 2, {3, 3}},
        {"empty_mid", ST_F16, 3, {2, 0, 3}},
        {"i32", ST_I32, 1, {9}},
        {"i16", ST_I16, 1, {5}},
        {"i8", ST_I8, 2, {3, 1}},
        {"mask", ST_BOOL, 1, {6}},
        {"e4m3", ST_F8_E4M3, 1, {11}},
        {"e5m2", ST_F8_E5M2, 2, {1, 13}},
    };
    char err[256];
    st_init(f);
    ck_assert_int_eq(st_set_meta(f, "format", "pt", err, sizeof err), 0);
    ck_assert_int_eq(st_set_meta(f, "moecore.step", "42", err, sizeof err), 0);
    for (int i = 0; i < N_MIXED; i++)
        ck_assert_int_eq(st_add(f, t[i].name, t[i].dt, t[i].ndim, t[i].shape, err, sizeof err), i);
}

// ---------------------------------------------------------------------------
// layout and writing

START_TEST(test_dtype_table)
{
    ck_assert_uint_eq(st_dtype_size(ST_F64), 8);
    ck_assert_uint_eq(st_dtype_size(ST_F32), 4);
    ck_assert_uint_eq(st_dtype_size(ST_BF16), 2);
    ck_assert_uint_eq(st_dtype_size(ST_F16), 2);
    ck_assert_uint_eq(st_dtype_size(ST_BOOL), 1);
    ck_assert_uint_eq(st_dtype_size(ST_F8_E5M2), 1);
    ck_assert_uint_eq(st_dtype_size(ST_NDTYPES), 0);
    ck_assert_str_eq(st_dtype_name(ST_BF16), "BF16");
    ck_assert_str_eq(st_dtype_name(ST_F8_E4M3), "F8_E4M3");
    ck_assert_str_eq(st_dtype_name((StDtype)99), "?");
    for (int i = 0; i < ST_NDTYPES; i++) ck_assert_uint_gt(st_dtype_size((StDtype)i), 0);
}
END_TEST

START_TEST(test_roundtrip)
{
    char path[64], err[256];
    tmp_path(path, sizeof path);
    StFile f;
    build_mixed(&f);
    unsigned char *bufs[N_MIXED];
    const void *datas[N_MIXED];
    for (int i = 0; i < f.n; i++) {
        bufs[i] = malloc(st_nbytes(&f.tensors[i]) + 1);
        fill(bufs[i], st_nbytes(&f.tensors[i]), (unsigned)i);
        datas[i] = st_nbytes(&f.tensors[i]) ? bufs[i] : NULL;
    }
    ck_assert_msg(st_save(path, &f, datas, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(f.header_len % 8, 0);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq((uint64_t)st.st_size, 8 + f.header_len + f.data_size);

    StFile g;
    int fd;
    ck_assert_msg(st_open(path, &fd, &g, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(g.n, f.n);
    ck_assert_uint_eq(g.header_len, f.header_len);
    ck_assert_uint_eq(g.data_size, f.data_size);
    ck_assert_int_eq(g.n_meta, 2);
    ck_assert_str_eq(st_get_meta(&g, "format"), "pt");
    ck_assert_str_eq(st_get_meta(&g, "moecore.step"), "42");
    ck_assert_ptr_null(st_get_meta(&g, "nope"));
    for (int i = 0; i < f.n; i++) {
        const StTensor *a = &f.tensors[i], *b = &g.tensors[i];
        ck_assert_str_eq(a->name, b->name);
        ck_assert_int_eq(a->dtype, b->dtype);
        ck_assert_int_eq(a->ndim, b->ndim);
        for (int d = 0; d < a->ndim; d++) ck_assert_int_eq(a->shape[d], b->shape[d]);
        ck_assert_uint_eq(a->begin, b->begin);
        ck_assert_uint_eq(a->end, b->end);
        ck_assert_int_eq(st_find(&g, a->name), i);
        unsigned char *back = malloc(st_nbytes(b) + 1);
        ck_assert_msg(st_read_range(fd, path, &g, i, 0, back, st_nbytes(b), err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(memcmp(back, bufs[i], st_nbytes(b)), 0);
        free(back);
    }
    ck_assert_int_eq(g.tensors[st_find(&g, "step")].ndim, 0);
    ck_assert_uint_eq(st_nbytes(&g.tensors[st_find(&g, "step")]), 8);
    ck_assert_uint_eq(st_nbytes(&g.tensors[st_find(&g, "empty_mid")]), 0);
    ck_assert_int_eq(st_find(&g, "absent"), -1);
    close(fd);
    for (int i = 0; i < f.n; i++) free(bufs[i]);
    st_free(&f);
    st_free(&g);
    ck_assert_int_eq(g.n, 0);
    ck_assert_ptr_null(g.tensors);
    unlink(path);
}
END_TEST

// The header bytes equal what Python's safetensors writes for the same dict.
START_TEST(test_python_layout)
{
    char path[64], err[256];
    tmp_path(path, sizeof path);
    StFile f;
    st_init(&f);
    int64_t s23[] = {2, 3}, s4[] = {4};
    ck_assert_int_eq(st_add(&f, "w", ST_F32, 2, s23, err, sizeof err), 0);
    ck_assert_int_eq(st_add(&f, "b", ST_BF16, 1, s4, err, sizeof err), 1);
    ck_assert_int_eq(st_add(&f, "s", ST_I64, 0, NULL, err, sizeof err), 2);
    ck_assert_int_eq(st_set_meta(&f, "format", "pt", err, sizeof err), 0);
    float w[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[4] = {0x3f80, 0x4000, 0x4040, 0x4080};
    int64_t s = -7;
    const void *datas[] = {w, b, &s};
    ck_assert_msg(st_save(path, &f, datas, err, sizeof err) == 0, "%s", err);

    const char *want = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                       "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                       "\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[32,40]}}";
    size_t n, wl = strlen(want);
    unsigned char *p = read_all(path, &n);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)p[i] << (8 * i);
    ck_assert_uint_eq(hl, (wl + 7) / 8 * 8);
    ck_assert_uint_eq(hl, f.header_len);
    ck_assert_int_eq(memcmp(p + 8, want, wl), 0);
    for (size_t i = wl; i < hl; i++) ck_assert_int_eq(p[8 + i], ' ');
    ck_assert_uint_eq(n, 8 + hl + 40);
    ck_assert_int_eq(memcmp(p + 8 + hl, w, 24), 0);
    ck_assert_int_eq(memcmp(p + 8 + hl + 24, b, 8), 0);
    ck_assert_int_eq(memcmp(p + 8 + hl + 32, &s, 8), 0);

    // and an independent JSON parser reads the same structure
    json_object *root = json_tokener_parse((const char *)p + 8);  // padding is whitespace
    ck_assert_ptr_nonnull(root);
    json_object *e, *off;
    ck_assert(json_object_object_get_ex(root, "b", &e));
    ck_assert(json_object_object_get_ex(e, "data_offsets", &off));
    ck_assert_int_eq(json_object_get_int64(json_object_array_get_idx(off, 0)), 24);
    ck_assert_int_eq(json_object_get_int64(json_object_array_get_idx(off, 1)), 32);
    json_object_put(root);
    free(p);
    st_free(&f);
    unlink(path);
}
END_TEST

// The header length always pads to a multiple of 8 with spaces.
START_TEST(test_header_padding)
{
    char path[64], err[256], name[32];
    tmp_path(path, sizeof path);
    for (int k = 1; k <= 9; k++) {
        StFile f;
        st_init(&f);
        memset(name, 'x', (size_t)k);
        name[k] = 0;
        int64_t one = 1;
        ck_assert_int_eq(st_add(&f, name, ST_U8, 1, &one, err, sizeof err), 0);
        unsigned char byte = 0xab;
        const void *datas[] = {&byte};
        ck_assert_msg(st_save(path, &f, datas, err, sizeof err) == 0, "%s", err);
        ck_assert_uint_eq(f.header_len % 8, 0);
        StFile g;
        int fd;
        ck_assert_msg(st_open(path, &fd, &g, err, sizeof err) == 0, "%s", err);
        unsigned char back = 0;
        ck_assert_int_eq(st_read_range(fd, path, &g, 0, 0, &back, 1, err, sizeof err), 0);
        ck_assert_int_eq(back, 0xab);
        close(fd);
        st_free(&g);
        st_free(&f);
    }
    unlink(path);
}
END_TEST

// An empty file (no tensors, no metadata) round-trips as "{}".
START_TEST(test_empty_file)
{
    char path[64], err[256];
    tmp_path(path, sizeof path);
    StFile f, g;
    st_init(&f);
    ck_assert_msg(st_save(path, &f, NULL, err, sizeof err) == 0, "%s", err);
    size_t n;
    unsigned char *p = read_all(path, &n);
    ck_assert_uint_eq(n, 16);
    ck_assert_int_eq(memcmp(p + 8, "{}      ", 8), 0);
    free(p);
    int fd;
    ck_assert_msg(st_open(path, &fd, &g, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(g.n, 0);
    close(fd);
    st_free(&g);
    unlink(path);
}
END_TEST

// Pieces written in shuffled order by separate "ranks" (the header among
// them) give the same bytes as one st_save.
START_TEST(test_range_writes_shuffled)
{
    char whole[64], parts[64], err[256];
    tmp_path(whole, sizeof whole);
    tmp_path(parts, sizeof parts);
    StFile f;
    build_mixed(&f);
    unsigned char *bufs[N_MIXED];
    const void *datas[N_MIXED];
    for (int i = 0; i < f.n; i++) {
        bufs[i] = malloc(st_nbytes(&f.tensors[i]) + 1);
        fill(bufs[i], st_nbytes(&f.tensors[i]), (unsigned)i + 100);
        datas[i] = bufs[i];
    }
    ck_assert_msg(st_save(whole, &f, datas, err, sizeof err) == 0, "%s", err);

    // a rank that never writes the header computes the same layout
    StFile r;
    build_mixed(&r);
    ck_assert_int_eq(st_finalize(&r, err, sizeof err), 0);
    ck_assert_uint_eq(r.header_len, f.header_len);

    // pieces: each tensor cut into up to 3 ranges; piece -1 is the header
    typedef struct { int idx; uint64_t off, n; } Piece;
    Piece piece[3 * N_MIXED + 1];
    int np = 0;
    piece[np++].idx = -1;
    for (int i = 0; i < r.n; i++) {
        uint64_t n = st_nbytes(&r.tensors[i]), a = n / 3, b = n - n / 4;
        uint64_t cuts[4] = {0, a, b, n};
        for (int c = 0; c < 3; c++)
            if (cuts[c + 1] > cuts[c]) piece[np++] = (Piece){i, cuts[c], cuts[c + 1] - cuts[c]};
    }
    for (int i = np - 1; i > 0; i--) {
        int j = (int)(rng() % (uint64_t)(i + 1));
        Piece t = piece[i];
        piece[i] = piece[j];
        piece[j] = t;
    }
    int fd = open(parts, O_WRONLY | O_TRUNC);
    ck_assert_int_ge(fd, 0);
    for (int k = 0; k < np; k++) {
        int rc = piece[k].idx < 0
                     ? st_write_header(fd, parts, &f, err, sizeof err)
                     : st_write_range(fd, parts, &r, piece[k].idx, piece[k].off,
                                      bufs[piece[k].idx] + piece[k].off, piece[k].n, err, sizeof err);
        ck_assert_msg(rc == 0, "%s", err);
    }
    close(fd);
    size_t na, nb;
    unsigned char *a = read_all(whole, &na), *b = read_all(parts, &nb);
    ck_assert_uint_eq(na, nb);
    ck_assert_int_eq(memcmp(a, b, na), 0);
    free(a);
    free(b);
    for (int i = 0; i < f.n; i++) free(bufs[i]);
    st_free(&f);
    st_free(&r);
    unlink(whole);
    unlink(parts);
}
END_TEST

START_TEST(test_read_ranges)
{
    char path[64], err[256];
    tmp_path(path, sizeof path);
    StFile f;
    st_init(&f);
    int64_t s[] = {64, 33};
    ck_assert_int_eq(st_add(&f, "a", ST_U8, 1, s + 1, err, sizeof err), 0);
    ck_assert_int_eq(st_add(&f, "big", ST_F32, 2, s, err, sizeof err), 1);
    unsigned char a[33], big[64 * 33 * 4];
    fill(a, sizeof a, 1);
    fill(big, sizeof big, 2);
    const void *datas[] = {a, big};
    ck_assert_msg(st_save(path, &f, datas, err, sizeof err) == 0, "%s", err);
    st_free(&f);

    int fd;
    ck_assert_msg(st_open(path, &fd, &f, err, sizeof err) == 0, "%s", err);
    unsigned char buf[sizeof big];
    for (int k = 0; k < 200; k++) {
        uint64_t off = rng() % sizeof big, n = rng() % (sizeof big - off + 1);
        ck_assert_msg(st_read_range(fd, path, &f, 1, off, buf, n, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(memcmp(buf, big + off, n), 0);
    }
    ck_assert_int_eq(st_read_range(fd, path, &f, 0, 30, buf, 3, err, sizeof err), 0);
    ck_assert_int_eq(memcmp(buf, a + 30, 3), 0);
    // out of bounds
    ck_assert_int_eq(st_read_range(fd, path, &f, 0, 30, buf, 4, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "outside tensor a of 33 bytes"));
    ck_assert_ptr_nonnull(strstr(err, path));
    ck_assert_int_eq(st_read_range(fd, path, &f, 0, UINT64_MAX, buf, 2, err, sizeof err), -1);
    ck_assert_int_eq(st_read_range(fd, path, &f, 0, 2, buf, UINT64_MAX, err, sizeof err), -1);
    ck_assert_int_eq(st_read_range(fd, path, &f, 2, 0, buf, 1, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "tensor index 2 out of range"));
    ck_assert_int_eq(st_read_range(fd, path, &f, -1, 0, buf, 1, err, sizeof err), -1);

    // a file cut short after it was opened fails the read, not the process
    ck_assert_int_eq(truncate(path, (off_t)(8 + f.header_len + 40)), 0);
    ck_assert_int_eq(st_read_range(fd, path, &f, 1, 0, buf, 64, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "unexpected end of file"));
    close(fd);
    st_free(&f);
    unlink(path);
}
END_TEST

START_TEST(test_write_range_checks)
{
    char path[64], err[256];
    tmp_path(path, sizeof path);
    StFile f;
    st_init(&f);
    int64_t s = 4;
    ck_assert_int_eq(st_add(&f, "a", ST_F32, 1, &s, err, sizeof err), 0);
    float x[5] = {0};
    int fd = open(path, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(st_write_range(fd, path, &f, 0, 0, x, 16, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "not finalized"));
    ck_assert_int_eq(st_finalize(&f, err, sizeof err), 0);
    ck_assert_int_eq(st_write_range(fd, path, &f, 0, 0, x, 16, err, sizeof err), 0);
    ck_assert_int_eq(st_write_range(fd, path, &f, 0, 4, x, 16, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "outside tensor a"));
    ck_assert_int_eq(st_write_range(fd, path, &f, 1, 0, x, 4, err, sizeof err), -1);
    // st_add after finalize makes the layout stale again
    ck_assert_int_eq(st_add(&f, "b", ST_F32, 1, &s, err, sizeof err), 1);
    ck_assert_int_eq(st_write_range(fd, path, &f, 0, 0, x, 16, err, sizeof err), -1);
    close(fd);
    // a read-only descriptor makes pwrite fail with the path and strerror
    fd = open(path, O_RDONLY);
    ck_assert_int_eq(st_write_header(fd, path, &f, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, path));
    ck_assert_ptr_nonnull(strstr(err, "pwrite"));
    ck_assert_ptr_nonnull(strstr(err, "Bad file descriptor"));
    close(fd);
    st_free(&f);
    unlink(path);
}
END_TEST

START_TEST(test_add_rejects)
{
    char err[256];
    StFile f;
    st_init(&f);
    int64_t ok[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, neg[] = {2, -1}, huge[] = {INT64_MAX, 3};
    ck_assert_int_eq(st_add(&f, "a", ST_F32, 1, ok, err, sizeof err), 0);
    ck_assert_int_eq(st_add(&f, "a", ST_F32, 1, ok, err, sizeof err), -1);
    ck_assert_str_eq(err, "st_add: duplicate tensor name a");
    ck_assert_int_eq(st_add(&f, "", ST_F32, 1, ok, err, sizeof err), -1);
    ck_assert_int_eq(st_add(&f, "__metadata__", ST_F32, 1, ok, err, sizeof err), -1);
    ck_assert_int_eq(st_add(&f, "bad\xff", ST_F32, 1, ok, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "UTF-8"));
    ck_assert_int_eq(st_add(&f, "n", ST_F32, 9, ok, err, sizeof err), -1);
    ck_assert_int_eq(st_add(&f, "n", ST_F32, -1, ok, err, sizeof err), -1);
    ck_assert_int_eq(st_add(&f, "n", ST_F32, 2, neg, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "negative"));
    ck_assert_int_eq(st_add(&f, "n", ST_F32, 2, huge, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "overflows"));
    ck_assert_int_eq(st_add(&f, "n", ST_NDTYPES, 1, ok, err, sizeof err), -1);
    ck_assert_int_eq(st_add(&f, "n", ST_F32, 8, ok, NULL, 0), 1);  // err may be NULL
    ck_assert_int_eq(st_add(&f, "\xc3\xa9t\xc3\xa9", ST_U8, 1, ok, err, sizeof err), 2);
    ck_assert_int_eq(f.n, 3);
    ck_assert_uint_eq(f.data_size, 9);
    st_free(&f);
}
END_TEST

// The name index survives growth; st_save refuses missing data.
START_TEST(test_find_many)
{
    char err[256], name[32];
    StFile f;
    st_init(&f);
    int64_t s = 3;
    for (int i = 0; i < 1000; i++) {
        snprintf(name, sizeof name, "layers.%d.expert.%d", i / 64, i % 64);
        ck_assert_int_eq(st_add(&f, name, ST_F16, 1, &s, err, sizeof err), i);
    }
    for (int i = 999; i >= 0; i--) {
        snprintf(name, sizeof name, "layers.%d.expert.%d", i / 64, i % 64);
        ck_assert_int_eq(st_find(&f, name), i);
    }
    ck_assert_int_eq(st_find(&f, "layers.0.expert.64"), -1);
    ck_assert_int_eq(st_add(&f, "layers.15.expert.39", ST_F16, 1, &s, err, sizeof err), -1);
    ck_assert_uint_eq(f.data_size, 6000);
    ck_assert_uint_eq(f.tensors[999].begin, 5994);
    char path[64];
    tmp_path(path, sizeof path);
    ck_assert_int_eq(st_save(path, &f, NULL, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "no data for tensor layers.0.expert.0"));
    unlink(path);
    st_free(&f);
}
END_TEST

START_TEST(test_meta)
{
    char err[256];
    StFile f;
    st_init(&f);
    ck_assert_int_eq(st_set_meta(&f, "k", "v1", err, sizeof err), 0);
    ck_assert_int_eq(st_set_meta(&f, "k", "v2", err, sizeof err), 0);
    ck_assert_int_eq(st_set_meta(&f, "z", "", err, sizeof err), 0);
    ck_assert_int_eq(f.n_meta, 2);
    ck_assert_str_eq(st_get_meta(&f, "k"), "v2");
    ck_assert_str_eq(st_get_meta(&f, "z"), "");
    ck_assert_int_eq(st_set_meta(&f, "x", "\xff", err, sizeof err), -1);
    st_free(&f);
}
END_TEST

START_TEST(test_expect)
{
    char err[256];
    StFile f;
    st_init(&f);
    int64_t s48[] = {4, 8}, s49[] = {4, 9};
    ck_assert_int_eq(st_add(&f, "x", ST_F32, 0, NULL, err, sizeof err), 0);
    ck_assert_int_eq(st_add(&f, "w", ST_BF16, 2, s48, err, sizeof err), 1);
    ck_assert_int_eq(st_expect(&f, "ck.st", "w", ST_BF16, 2, s48, err, sizeof err), 1);
    ck_assert_int_eq(st_expect(&f, "ck.st", "x", ST_F32, 0, NULL, err, sizeof err), 0);
    ck_assert_int_eq(st_expect(&f, "ck.st", "w", ST_F32, 2, s49, err, sizeof err), -1);
    ck_assert_str_eq(err, "ck.st: tensor w has dtype BF16 shape [4, 8], expected F32 [4, 9]");
    ck_assert_int_eq(st_expect(&f, "ck.st", "w", ST_BF16, 1, s48, err, sizeof err), -1);
    ck_assert_str_eq(err, "ck.st: tensor w has dtype BF16 shape [4, 8], expected BF16 [4]");
    ck_assert_int_eq(st_expect(&f, "ck.st", "x", ST_F32, 1, s48, err, sizeof err), -1);
    ck_assert_str_eq(err, "ck.st: tensor x has dtype F32 shape [], expected F32 [4]");
    ck_assert_int_eq(st_expect(&f, "ck.st", "nope", ST_F32, 0, NULL, err, sizeof err), -1);
    ck_assert_str_eq(err, "ck.st: missing tensor nope");
    st_free(&f);
}
END_TEST

// Python lists tensors in any order; offsets, not header order, place them.
START_TEST(test_header_order_differs_from_offsets)
{
    char path[64], err[256];
    tmp_path(path, sizeof path);
    const char *json = "{\"b\":{\"data_offsets\":[4,8],\"shape\":[2],\"dtype\":\"I16\"},"
                       "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
                       "\"a\":{\"dtype\":\"U8\",\"shape\":[2,2],\"data_offsets\":[0,4]},"
                       "\"__metadata__\":{\"format\":\"pt\"}}\n";
    size_t jl = strlen(json), n = 8 + jl + 8;
    unsigned char *p = calloc(1, n);
    p[0] = (unsigned char)jl;
    memcpy(p + 8, json, jl);
    for (int i = 0; i < 8; i++) p[8 + jl + i] = (unsigned char)(i + 1);
    write_bytes(path, p, n);
    free(p);
    StFile f;
    int fd;
    ck_assert_msg(st_open(path, &fd, &f, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(f.n, 3);
    ck_assert_str_eq(f.tensors[0].name, "b");
    unsigned char got[4];
    ck_assert_int_eq(st_read_range(fd, path, &f, st_find(&f, "b"), 0, got, 4, err, sizeof err), 0);
    ck_assert_int_eq(got[0], 5);
    ck_assert_int_eq(got[3], 8);
    ck_assert_int_eq(st_expect(&f, path, "a", ST_U8, 2, (int64_t[]){2, 2}, err, sizeof err), 2);
    close(fd);
    st_free(&f);
    unlink(path);
}
END_TEST

START_TEST(test_open_missing_file)
{
    char err[256];
    StFile f;
    int fd = 123;
    ck_assert_int_eq(st_open("/nonexistent/dir/x.safetensors", &fd, &f, err, sizeof err), -1);
    ck_assert_int_eq(fd, -1);
    ck_assert_str_eq(err, "/nonexistent/dir/x.safetensors: open: No such file or directory");
    ck_assert_int_eq(f.n, 0);
    ck_assert_int_eq(st_save("/nonexistent/dir/x.safetensors", &f, NULL, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "open for writing: No such file or directory"));
}
END_TEST

// ---------------------------------------------------------------------------
// rejection cases: each a header (json, with hdr_len and the data length)

#define TN(name, body) "{\"" name "\":{" body "}}"
#define F32_1 "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]"

typedef struct {
    const char *what;
    const char *json;
    int64_t json_len;   // -1: strlen(json)
    int64_t hdr_len;    // -1: json_len
    size_t data_len;
    int64_t file_len;   // -1: whole; else the file is cut to this many bytes
    const char *expect;
} Bad;

static const Bad bad[] = {
    {"short file", "{}", -1, -1, 0, 5, "file is 5 bytes, shorter than the 8-byte header length"},
    {"header length 0", "", -1, 0, 0, -1, "header length is 0"},
    {"header past file", "{}", -1, 100, 0, -1, "header length 100 bytes exceeds the file (2 bytes after the length)"},
    {"header absurd", "{}", -1, 200000000, 0, -1, "header length 200000000 bytes exceeds the 100000000-byte limit"},
    {"json truncated", "{\"a\":{\"dtype\":\"F32\"", -1, -1, 0, -1, "header is not valid JSON: it ends early"},
    {"json syntax", "{\"a\":1,}", -1, -1, 0, -1, "header is not valid JSON"},
    {"json comment", "{/* c */}", -1, -1, 0, -1, "header is not valid JSON"},
    {"not an object", "[1, 2]", -1, -1, 0, -1, "header is not a JSON object (first byte 0x5b)"},
    {"leading space", " {}", -1, -1, 0, -1, "header is not a JSON object (first byte 0x20)"},
    {"invalid utf-8", TN("a\xff", F32_1), -1, -1, 4, -1, "invalid utf-8"},
    {"nul byte", "{} \0    ", 8, -1, 0, -1, "header contains a NUL byte at offset 3"},
    {"trailing garbage", "{} x", -1, -1, 0, -1, "header is not valid JSON"},
    {"trailing formfeed", "{}\f", -1, -1, 0, -1, "header is not valid JSON"},
    {"single quotes", "{'a':{" F32_1 "}}", -1, -1, 4, -1, "single-quoted string"},
    {"entry not object", "{\"a\":5}", -1, -1, 0, -1, "tensor a: entry is not an object"},
    {"missing field", TN("a", "\"dtype\":\"F32\",\"shape\":[1]"), -1, -1, 4, -1,
     "tensor a: missing field \"data_offsets\""},
    {"extra field", TN("a", F32_1 ",\"foo\":1"), -1, -1, 4, -1, "tensor a: unexpected field \"foo\""},
    {"duplicate field", TN("a", F32_1 ",\"dtype\":\"F32\""), -1, -1, 4, -1, "tensor a: duplicate field \"dtype\""},
    {"dtype not string", TN("a", "\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]"), -1, -1, 4, -1,
     "tensor a: dtype is not a string"},
    {"unknown dtype", TN("a", "\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]"), -1, -1, 4, -1,
     "tensor a: unknown dtype \"F33\""},
    {"lowercase dtype", TN("a", "\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]"), -1, -1, 4, -1,
     "tensor a: unknown dtype \"f32\""},
    {"shape not array", TN("a", "\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]"), -1, -1, 4, -1,
     "tensor a: shape is not an array"},
    {"negative dim", TN("a", "\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,4]"), -1, -1, 4, -1,
     "tensor a: shape[1] = -1 is not a non-negative integer"},
    {"float dim", TN("a", "\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]"), -1, -1, 4, -1,
     "tensor a: shape[0] = 1.0 is not a non-negative integer"},
    {"string dim", TN("a", "\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]"), -1, -1, 4, -1,
     "tensor a: shape[0] = \"1\" is not a non-negative integer"},
    {"bool dim", TN("a", "\"dtype\":\"F32\",\"shape\":[true],\"data_offsets\":[0,4]"), -1, -1, 4, -1,
     "tensor a: shape[0] = true is not a non-negative integer"},
    {"dim past int64", TN("a", "\"dtype\":\"F32\",\"shape\":[18446744073709551615],\"data_offsets\":[0,4]"),
     -1, -1, 4, -1, "tensor a: shape[0] = 18446744073709551615 is not a non-negative integer"},
    {"too many dims", TN("a", "\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]"), -1, -1, 4,
     -1, "tensor a: shape has 9 dims, at most 8 supported"},
    {"size overflow", TN("a", "\"dtype\":\"F32\",\"shape\":[4611686018427387904,8],\"data_offsets\":[0,4]"), -1, -1,
     4, -1, "tensor a: size of F32 [4611686018427387904, 8] overflows"},
    {"offsets one int", TN("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]"), -1, -1, 4, -1,
     "tensor a: data_offsets [4] is not two non-negative integers"},
    {"offsets three ints", TN("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,4]"), -1, -1, 4, -1,
     "tensor a: data_offsets [0,4,4] is not two"},
    {"offsets negative", TN("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]"), -1, -1, 4, -1,
     "tensor a: data_offsets [-4,0] is not two non-negative integers"},
    {"offsets float", TN("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]"), -1, -1, 4, -1,
     "is not two non-negative integers"},
    {"offsets object", TN("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{}"), -1, -1, 4, -1,
     "tensor a: data_offsets {} is not two"},
    {"begin after end", TN("a", "\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]"), -1, -1, 8, -1,
     "tensor a: data_offsets begin 8 > end 4"},
    {"wrong byte count", TN("a", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]"), -1, -1, 4, -1,
     "tensor a: data_offsets [0, 4) hold 4 bytes, but F32 [2] needs 8"},
    {"past data end", TN("a", "\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]"), -1, -1, 8, -1,
     "tensor a: data_offsets [0, 16) extend past the data area (8 bytes)"},
    {"overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", -1, -1, 12, -1,
     "tensors a [0, 8) and b [4, 12) overlap"},
    {"empty inside another", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                             "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", -1, -1, 8, -1,
     "tensors a [0, 8) and z [4, 4) overlap"},
    {"hole between", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", -1, -1, 12, -1,
     "4-byte hole in the data area between a [0, 4) and b [8, 12)"},
    {"hole at start", TN("a", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]"), -1, -1, 8, -1,
     "4-byte hole at the start of the data area, before a [4, 8)"},
    {"trailing bytes", TN("a", F32_1), -1, -1, 8, -1,
     "4 trailing bytes in the data area after the last tensor (data area is 8 bytes, tensors end at 4)"},
    {"trailing bytes, no tensors", "{}", -1, -1, 3, -1, "3 trailing bytes in the data area"},
    {"duplicate name", "{\"a\":{" F32_1 "},\"a\":{" F32_1 "}}", -1, -1, 4, -1, "duplicate tensor name a"},
    {"duplicate escaped name", "{\"a\":{" F32_1 "},\"\\u0061\":{" F32_1 "}}", -1, -1, 4, -1,
     "duplicate tensor name a"},
    {"nul in name", "{\"a\\u0000b\":{" F32_1 "}}", -1, -1, 4, -1, "key at offset 1 contains a NUL character"},
    {"empty name", TN("", F32_1), -1, -1, 4, -1, "empty tensor name"},
    {"metadata not object", "{\"__metadata__\":\"pt\"}", -1, -1, 0, -1, "__metadata__ is not an object"},
    {"metadata null", "{\"__metadata__\":null}", -1, -1, 0, -1, "__metadata__ is not an object"},
    {"metadata value not string", "{\"__metadata__\":{\"step\":3}}", -1, -1, 0, -1,
     "__metadata__ value for key step is not a string"},
    {"metadata value nul", "{\"__metadata__\":{\"k\":\"x\\u0000y\"}}", -1, -1, 0, -1,
     "__metadata__ value for key k contains a NUL character"},
    {"metadata duplicate key", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", -1, -1, 0, -1,
     "__metadata__ has duplicate key k"},
};
#define N_BAD ((int)(sizeof bad / sizeof bad[0]))

START_TEST(test_reject)
{
    const Bad *b = &bad[_i];
    char path[64], err[512];
    tmp_path(path, sizeof path);
    size_t jl = b->json_len < 0 ? strlen(b->json) : (size_t)b->json_len;
    write_st(path, b->hdr_len < 0 ? jl : (uint64_t)b->hdr_len, b->json, jl, b->data_len);
    if (b->file_len >= 0) ck_assert_int_eq(truncate(path, (off_t)b->file_len), 0);
    StFile f;
    int fd = 7;
    err[0] = 0;
    int rc = st_open(path, &fd, &f, err, sizeof err);
    ck_assert_msg(rc == -1, "%s: accepted", b->what);
    ck_assert_int_eq(fd, -1);
    ck_assert_int_eq(f.n, 0);
    ck_assert_int_eq(f.n_meta, 0);
    ck_assert_ptr_null(f.tensors);
    ck_assert_msg(strncmp(err, path, strlen(path)) == 0, "%s: message lacks the path: %s", b->what, err);
    ck_assert_msg(strstr(err, b->expect), "%s: message \"%s\" lacks \"%s\"", b->what, err, b->expect);
    unlink(path);
}
END_TEST

// The builder itself makes valid files when the header is right.
START_TEST(test_reject_control)
{
    char path[64], err[512];
    tmp_path(path, sizeof path);
    const char *json = "{\"a\":{" F32_1 "},\"__metadata__\":{\"k\":\"v\"}}  ";
    write_st(path, strlen(json), json, strlen(json), 4);
    StFile f;
    int fd;
    ck_assert_msg(st_open(path, &fd, &f, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(f.n, 1);
    ck_assert_str_eq(st_get_meta(&f, "k"), "v");
    close(fd);
    st_free(&f);
    unlink(path);
}
END_TEST

// Random mutations of a valid header never crash or leak; whatever is
// accepted satisfies the invariants.
START_TEST(test_fuzz_parse)
{
    StFile f;
    char err[512];
    build_mixed(&f);
    ck_assert_int_eq(st_finalize(&f, err, sizeof err), 0);
    char path[64];
    tmp_path(path, sizeof path);
    const void *datas[N_MIXED] = {0};
    unsigned char *zeros = calloc(1, f.data_size);
    for (int i = 0; i < f.n; i++) datas[i] = zeros;
    ck_assert_int_eq(st_save(path, &f, datas, err, sizeof err), 0);
    size_t n;
    unsigned char *file = read_all(path, &n);
    size_t hl = (size_t)f.header_len;
    const char *alphabet = "{}[],:\" \\u0123456789-.eE";
    char *buf = malloc(hl);
    int accepted = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, file + 8, hl);
        int nmut = 1 + (int)(rng() % 3);
        for (int m = 0; m < nmut; m++) {
            size_t at = rng() % hl;
            buf[at] = (rng() & 1) ? alphabet[rng() % strlen(alphabet)] : (char)(rng() & 0xff);
        }
        size_t len = (rng() % 8 == 0) ? 1 + rng() % hl : hl;
        uint64_t fsize = 8 + len + ((rng() & 1) ? f.data_size : rng() % (f.data_size + 16));
        StFile g;
        if (st_parse_header(buf, len, fsize, NULL, &g, err, sizeof err) == 0) {
            accepted++;
            uint64_t total = 0;
            for (int i = 0; i < g.n; i++) {
                total += st_nbytes(&g.tensors[i]);
                ck_assert_uint_le(g.tensors[i].end, g.data_size);
            }
            ck_assert_uint_eq(total, g.data_size);
            st_free(&g);
        } else {
            ck_assert_int_eq(g.n, 0);
            ck_assert_ptr_nonnull(strstr(err, "<memory>"));
        }
    }
    ck_assert_int_gt(accepted, 0);  // e.g. mutations inside the padding
    free(buf);
    free(file);
    free(zeros);
    st_free(&f);
    unlink(path);
}
END_TEST

static Suite *safetensors_suite(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("layout");
    tcase_add_test(tc, test_dtype_table);
    tcase_add_test(tc, test_roundtrip);
    tcase_add_test(tc, test_python_layout);
    tcase_add_test(tc, test_header_padding);
    tcase_add_test(tc, test_empty_file);
    tcase_add_test(tc, test_range_writes_shuffled);
    tcase_add_test(tc, test_read_ranges);
    tcase_add_test(tc, test_write_range_checks);
    tcase_add_test(tc, test_add_rejects);
    tcase_add_test(tc, test_find_many);
    tcase_add_test(tc, test_meta);
    tcase_add_test(tc, test_expect);
    tcase_add_test(tc, test_header_order_differs_from_offsets);
    tcase_add_test(tc, test_open_missing_file);
    suite_add_tcase(s, tc);
    TCase *tr = tcase_create("reject");
    tcase_add_test(tr, test_reject_control);
    tcase_add_loop_test(tr, test_reject, 0, N_BAD);
    tcase_add_test(tr, test_fuzz_parse);
    tcase_set_timeout(tr, 60);
    suite_add_tcase(s, tr);
    return s;
}

int main(void)
{
    return check_run(safetensors_suite());
}
