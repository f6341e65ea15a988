// The .npy header: the preamble, then a small parser for the one Python dict
// literal numpy writes there (strings, True/False and a tuple of integers).
#include "data/npy.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "util/check.h"

int npy_has_magic(const unsigned char *buf, size_t n) {
    return n >= NPY_MAGIC_LEN && !memcmp(buf, NPY_MAGIC, NPY_MAGIC_LEN);
}

int64_t npy_header_size(const unsigned char *pre, size_t n, char *err, size_t errlen) {
    if (n < 10 || !npy_has_magic(pre, n)) FAIL(".npy header: shorter than its 10-byte preamble");
    int major = pre[6], minor = pre[7];
    int64_t len;
    if (major == 1) {
        len = 10 + (int64_t)(pre[8] | pre[9] << 8);
    } else if (major == 2 || major == 3) {
        if (n < 12) FAIL(".npy header: shorter than its 12-byte preamble");
        len = 12 + (int64_t)((uint32_t)pre[8] | (uint32_t)pre[9] << 8 | (uint32_t)pre[10] << 16 |
                             (uint32_t)pre[11] << 24);
    } else {
        FAIL(".npy format version %d.%d is not one moecore reads (1.0, 2.0, 3.0)", major, minor);
    }
    if (len > NPY_MAX_HEADER) FAIL(".npy header: %lld bytes long, more than %d", (long long)len, NPY_MAX_HEADER);
    return len;
}

// ---- the dict literal ------------------------------------------------------------------

typedef struct {
    const char *p, *end;
} Cursor;

static void skip_space(Cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int eat(Cursor *c, char ch) {
    skip_space(c);
    if (c->p < c->end && *c->p == ch) { c->p++; return 1; }
    return 0;
}

// A quoted string ('...' or "...", no escapes) into out; 0 if there is none.
static int string(Cursor *c, char *out, size_t cap) {
    skip_space(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return 0;
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q && *c->p != '\\') {
        if (n + 1 < cap) out[n++] = *c->p;
        c->p++;
    }
    if (c->p >= c->end || *c->p != q) return 0;
    c->p++;
    out[n] = 0;
    return 1;
}

static int word(Cursor *c, const char *w) {
    skip_space(c);
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n)) return 0;
    c->p += n;
    return 1;
}

// A tuple of non-negative integers "(3,)" / "(2, 3)" / "()"; 0 if malformed.
static int tuple(Cursor *c, int64_t *dims, int max, int *ndim) {
    if (!eat(c, '(')) return 0;
    *ndim = 0;
    for (;;) {
        if (eat(c, ')')) return 1;
        skip_space(c);
        if (c->p >= c->end || !isdigit((unsigned char)*c->p)) return 0;
        int64_t v = 0;
        while (c->p < c->end && isdigit((unsigned char)*c->p)) {
            if (v > (INT64_MAX - 9) / 10) return 0;
            v = v * 10 + (*c->p++ - '0');
        }
        if (c->p < c->end && *c->p == 'L') c->p++;   // Python 2 longs
        if (*ndim < max) dims[*ndim] = v;
        ++*ndim;
        if (!eat(c, ',')) return eat(c, ')');
    }
}

int npy_parse(const unsigned char *buf, size_t size, NpyHeader *h, char *err, size_t errlen) {
    memset(h, 0, sizeof *h);
    int64_t len = npy_header_size(buf, size, err, errlen);
    if (len < 0) return -1;
    if ((int64_t)size < len) FAIL(".npy header: %lld bytes long but only %zu read", (long long)len, size);
    h->major = buf[6];
    h->minor = buf[7];
    h->data_offset = len;
    int pre = h->major == 1 ? 10 : 12;
    Cursor c = {(const char *)buf + pre, (const char *)buf + len};
    int have_descr = 0, have_order = 0, have_shape = 0, fortran = 0, ndim = 0;
    int64_t dims[8];
    if (!eat(&c, '{')) FAIL(".npy header: not a Python dict literal");
    for (;;) {
        if (eat(&c, '}')) break;
        char key[32];
        if (!string(&c, key, sizeof key) || !eat(&c, ':')) FAIL(".npy header: malformed dict");
        int *seen = !strcmp(key, "descr") ? &have_descr : !strcmp(key, "fortran_order") ? &have_order
                  : !strcmp(key, "shape") ? &have_shape : NULL;
        if (!seen) FAIL(".npy header: unexpected key '%s' (expected descr, fortran_order, shape)", key);
        if (*seen) FAIL(".npy header: key '%s' given twice", key);
        *seen = 1;
        if (seen == &have_descr) {
            if (!string(&c, h->descr, sizeof h->descr))
                FAIL(".npy header: descr is not a dtype string (a structured dtype?): moecore reads 1-D uint16 "
                     "or uint32 token arrays");
        } else if (seen == &have_order) {
            if (word(&c, "True")) fortran = 1;
            else if (!word(&c, "False")) FAIL(".npy header: fortran_order is neither True nor False");
        } else if (!tuple(&c, dims, 8, &ndim)) {
            FAIL(".npy header: shape is not a tuple of integers");
        }
        if (!eat(&c, ',')) {
            if (eat(&c, '}')) break;
            FAIL(".npy header: malformed dict");
        }
    }
    skip_space(&c);
    if (c.p != c.end) FAIL(".npy header: bytes after the dict");
    if (!have_descr || !have_order || !have_shape) FAIL(".npy header: descr, fortran_order or shape is missing");
    if (!strcmp(h->descr, "<u2")) h->item_size = 2;
    else if (!strcmp(h->descr, "<u4")) h->item_size = 4;
    else if (!strcmp(h->descr, ">u2") || !strcmp(h->descr, ">u4"))
        FAIL(".npy dtype '%s' is big-endian: moecore reads little-endian tokens; save tokens.astype('<%s')",
             h->descr, h->descr + 1);
    else
        FAIL(".npy dtype '%s' is not a token dtype moecore reads: save the tokens as uint16 ('<u2') or uint32 "
             "('<u4'), e.g. np.save(path, tokens.astype(np.uint32))", h->descr);
    if (fortran) FAIL(".npy header: fortran_order is True: save a C-ordered array (np.ascontiguousarray)");
    if (ndim != 1) {
        char shape[128] = "(";
        size_t k = 1;
        for (int i = 0; i < ndim && i < 8 && k < sizeof shape; i++)
            k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%lld", i ? ", " : "", (long long)dims[i]);
        if (k < sizeof shape) snprintf(shape + k, sizeof shape - k, "%s)", ndim == 1 ? "," : "");
        FAIL(".npy shape %s is not 1-D: moecore reads a flat array of tokens; save tokens.reshape(-1)", shape);
    }
    h->n_items = dims[0];
    if (h->n_items > (INT64_MAX - len) / h->item_size) FAIL(".npy shape (%lld,) is too large", (long long)h->n_items);
    return 0;
}
