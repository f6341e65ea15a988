// Strict safetensors reader/writer; see safetensors.h for the format and the
// invariants. json-c parses and prints the JSON; since it keeps the last of
// duplicate keys, cuts keys at an escaped NUL and takes single-quoted strings
// even in strict mode, scan_value walks the raw text once more to catch those
// before the parsed object is trusted.
#include "ckpt/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/check.h"

static const struct { const char *name; size_t size; } dtypes[ST_NDTYPES] = {
    [ST_F64] = {"F64", 8},   [ST_F32] = {"F32", 4},   [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2}, [ST_I64] = {"I64", 8},   [ST_I32] = {"I32", 4},
    [ST_I16] = {"I16", 2},   [ST_I8] = {"I8", 1},     [ST_U64] = {"U64", 8},
    [ST_U32] = {"U32", 4},   [ST_U16] = {"U16", 2},   [ST_U8] = {"U8", 1},
    [ST_BOOL] = {"BOOL", 1}, [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
};

size_t st_dtype_size(StDtype dt) { return (unsigned)dt < ST_NDTYPES ? dtypes[dt].size : 0; }
const char *st_dtype_name(StDtype dt) { return (unsigned)dt < ST_NDTYPES ? dtypes[dt].name : "?"; }

static int dtype_from_name(const char *s, size_t len, StDtype *out)
{
    for (int i = 0; i < ST_NDTYPES; i++)
        if (strlen(dtypes[i].name) == len && memcmp(dtypes[i].name, s, len) == 0) {
            *out = (StDtype)i;
            return 0;
        }
    return -1;
}

static const char *shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

// numel * dtype size, or -1 on overflow (dims already checked >= 0).
static int tensor_bytes(StDtype dt, int ndim, const int64_t *shape, uint64_t *out)
{
    uint64_t n = st_dtype_size(dt);
    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (d && n > UINT64_MAX / d) return -1;
        n *= d;
    }
    *out = n;
    return 0;
}

static int utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        int extra;
        uint32_t c = *p;
        if (c < 0x80) { p++; continue; }
        else if (c >= 0xc2 && c <= 0xdf) { extra = 1; c &= 0x1f; }
        else if (c >= 0xe0 && c <= 0xef) { extra = 2; c &= 0x0f; }
        else if (c >= 0xf0 && c <= 0xf4) { extra = 3; c &= 0x07; }
        else return 0;
        p++;
        for (int i = 0; i < extra; i++, p++) {
            if ((*p & 0xc0) != 0x80) return 0;
            c = (c << 6) | (*p & 0x3f);
        }
        if ((extra == 2 && (c < 0x800 || (c >= 0xd800 && c <= 0xdfff))) ||
            (extra == 3 && (c < 0x10000 || c > 0x10ffff)))
            return 0;
    }
    return 1;
}

// ---------------------------------------------------------------------------
// Layout

void st_init(StFile *f) { memset(f, 0, sizeof *f); }

void st_free(StFile *f)
{
    for (int i = 0; i < f->n; i++) free(f->tensors[i].name);
    for (int i = 0; i < f->n_meta; i++) { free(f->meta_keys[i]); free(f->meta_vals[i]); }
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_vals);
    free(f->slots);
    st_init(f);
}

// Open addressing over tensor indices (slot value idx + 1, 0 empty), so
// loading 10^4 expert tensors by name stays linear.
static uint32_t name_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static void slot_insert(int *slots, int n_slots, const StFile *f, int idx)
{
    uint32_t m = (uint32_t)n_slots - 1, i = name_hash(f->tensors[idx].name) & m;
    while (slots[i]) i = (i + 1) & m;
    slots[i] = idx + 1;
}

// Indexes the last tensor, growing the table to keep it at most half full.
static int index_last(StFile *f)
{
    if (2 * f->n > f->n_slots) {
        int n_slots = f->n_slots ? 2 * f->n_slots : 64;
        int *slots = calloc((size_t)n_slots, sizeof *slots);
        if (!slots) return -1;
        for (int i = 0; i < f->n - 1; i++) slot_insert(slots, n_slots, f, i);
        free(f->slots);
        f->slots = slots;
        f->n_slots = n_slots;
    }
    slot_insert(f->slots, f->n_slots, f, f->n - 1);
    return 0;
}

int st_find(const StFile *f, const char *name)
{
    if (!f->n_slots) return -1;
    uint32_t m = (uint32_t)f->n_slots - 1, i = name_hash(name) & m;
    for (; f->slots[i]; i = (i + 1) & m)
        if (strcmp(f->tensors[f->slots[i] - 1].name, name) == 0) return f->slots[i] - 1;
    return -1;
}

const char *st_get_meta(const StFile *f, const char *key)
{
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_vals[i];
    return NULL;
}

// Appends a tensor whose fields are already valid; takes ownership of name.
static int push_tensor(StFile *f, char *name, StDtype dt, int ndim, const int64_t *shape,
                       uint64_t begin, uint64_t end)
{
    if (f->n == f->cap) {
        int cap = f->cap ? 2 * f->cap : 16;
        StTensor *t = realloc(f->tensors, (size_t)cap * sizeof *t);
        if (!t) return -1;
        f->tensors = t;
        f->cap = cap;
    }
    StTensor *t = &f->tensors[f->n++];
    memset(t, 0, sizeof *t);
    t->name = name;
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->begin = begin;
    t->end = end;
    if (index_last(f)) { f->n--; return -1; }
    return f->n - 1;
}

int st_add(StFile *f, const char *name, StDtype dt, int ndim, const int64_t *shape,
           char *err, size_t errlen)
{
    if (!name || !*name) return errorf(err, errlen, "st_add: empty tensor name");
    if (!utf8_valid(name)) return errorf(err, errlen, "st_add: tensor name is not valid UTF-8");
    if (strcmp(name, "__metadata__") == 0)
        return errorf(err, errlen, "st_add: tensor name __metadata__ is reserved");
    if ((unsigned)dt >= ST_NDTYPES) return errorf(err, errlen, "st_add: tensor %s: invalid dtype %d", name, (int)dt);
    if (ndim < 0 || ndim > ST_MAX_DIMS)
        return errorf(err, errlen, "st_add: tensor %s: %d dims, expected 0..%d", name, ndim, ST_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0) return errorf(err, errlen, "st_add: tensor %s: shape[%d] = %lld is negative",
                                      name, i, (long long)shape[i]);
    if (st_find(f, name) >= 0) return errorf(err, errlen, "st_add: duplicate tensor name %s", name);
    uint64_t nbytes;
    if (tensor_bytes(dt, ndim, shape, &nbytes) || nbytes > UINT64_MAX - f->data_size)
        return errorf(err, errlen, "st_add: tensor %s: size overflows", name);
    char *copy = strdup(name);
    int idx = copy ? push_tensor(f, copy, dt, ndim, shape, f->data_size, f->data_size + nbytes) : -1;
    if (idx < 0) { free(copy); return errorf(err, errlen, "st_add: out of memory"); }
    f->data_size += nbytes;
    f->header_len = 0;
    return idx;
}

int st_set_meta(StFile *f, const char *key, const char *val, char *err, size_t errlen)
{
    if (!utf8_valid(key) || !utf8_valid(val))
        return errorf(err, errlen, "st_set_meta: key or value of %s is not valid UTF-8", key);
    char *v = strdup(val);
    if (!v) return errorf(err, errlen, "st_set_meta: out of memory");
    f->header_len = 0;
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) {
            free(f->meta_vals[i]);
            f->meta_vals[i] = v;
            return 0;
        }
    char *k = strdup(key);
    char **ks = realloc(f->meta_keys, (size_t)(f->n_meta + 1) * sizeof *ks);
    if (ks) f->meta_keys = ks;
    char **vs = ks ? realloc(f->meta_vals, (size_t)(f->n_meta + 1) * sizeof *vs) : NULL;
    if (vs) f->meta_vals = vs;
    if (!k || !vs) { free(k); free(v); return errorf(err, errlen, "st_set_meta: out of memory"); }
    f->meta_keys[f->n_meta] = k;
    f->meta_vals[f->n_meta++] = v;
    return 0;
}

// ---------------------------------------------------------------------------
// Header serialisation

// Adds v to an object (key) or an array (key NULL); drops v on failure.
static int put(json_object *to, const char *key, json_object *v)
{
    int rc = !v ? -1 : key ? json_object_object_add_ex(to, key, v, JSON_C_OBJECT_ADD_KEY_IS_NEW)
                           : json_object_array_add(to, v);
    if (rc) json_object_put(v);
    return rc ? -1 : 0;
}

// The header JSON as Python's writer lays it out: compact, __metadata__
// first, fields in the order dtype, shape, data_offsets.
static json_object *header_object(const StFile *f)
{
    json_object *root = json_object_new_object(), *m = NULL;
    int rc = root ? 0 : -1;
    if (!rc && f->n_meta) rc = put(root, "__metadata__", m = json_object_new_object());
    for (int i = 0; !rc && i < f->n_meta; i++)
        rc = put(m, f->meta_keys[i], json_object_new_string(f->meta_vals[i]));
    for (int i = 0; !rc && i < f->n; i++) {
        const StTensor *t = &f->tensors[i];
        json_object *e, *sh, *off;
        rc = put(root, t->name, e = json_object_new_object());
        rc = rc ? rc : put(e, "dtype", json_object_new_string(st_dtype_name(t->dtype)));
        rc = rc ? rc : put(e, "shape", sh = json_object_new_array());
        for (int d = 0; !rc && d < t->ndim; d++) rc = put(sh, NULL, json_object_new_int64(t->shape[d]));
        rc = rc ? rc : put(e, "data_offsets", off = json_object_new_array());
        rc = rc ? rc : put(off, NULL, json_object_new_uint64(t->begin));
        rc = rc ? rc : put(off, NULL, json_object_new_uint64(t->end));
    }
    if (rc) { json_object_put(root); return NULL; }
    return root;
}

static const char *header_json(json_object *root, size_t *len)
{
    return json_object_to_json_string_length(root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, len);
}

int st_finalize(StFile *f, char *err, size_t errlen)
{
    json_object *root = header_object(f);
    size_t len;
    const char *s = root ? header_json(root, &len) : NULL;
    if (!s) { json_object_put(root); return errorf(err, errlen, "st_finalize: out of memory"); }
    f->header_len = (len + 7) / 8 * 8;
    json_object_put(root);
    return 0;
}

// ---------------------------------------------------------------------------
// I/O

static int pwrite_all(int fd, const char *path, const void *buf, uint64_t n, uint64_t off,
                      char *err, size_t errlen)
{
    const char *p = buf;
    while (n) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t w = pwrite(fd, p, chunk, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return errorf(err, errlen, "%s: pwrite of %zu bytes at offset %llu: %s", path, chunk,
                                (unsigned long long)off, w < 0 ? strerror(errno) : "wrote nothing");
        p += w; n -= (uint64_t)w; off += (uint64_t)w;
    }
    return 0;
}

static int pread_all(int fd, const char *path, void *buf, uint64_t n, uint64_t off,
                     char *err, size_t errlen)
{
    char *p = buf;
    while (n) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t r = pread(fd, p, chunk, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return errorf(err, errlen, "%s: pread of %zu bytes at offset %llu: %s", path, chunk,
                               (unsigned long long)off, strerror(errno));
        if (r == 0) return errorf(err, errlen, "%s: unexpected end of file at offset %llu (file truncated?)",
                                path, (unsigned long long)off);
        p += r; n -= (uint64_t)r; off += (uint64_t)r;
    }
    return 0;
}

int st_write_header(int fd, const char *path, StFile *f, char *err, size_t errlen)
{
    json_object *root = header_object(f);
    size_t len = 0;
    const char *s = root ? header_json(root, &len) : NULL;
    uint64_t n = (len + 7) / 8 * 8;
    unsigned char *buf = s ? malloc(8 + n) : NULL;
    if (!buf) { json_object_put(root); return errorf(err, errlen, "%s: st_write_header: out of memory", path); }
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(n >> (8 * i));
    memcpy(buf + 8, s, len);
    memset(buf + 8 + len, ' ', n - len);
    json_object_put(root);
    f->header_len = n;
    int rc = pwrite_all(fd, path, buf, 8 + n, 0, err, errlen);
    free(buf);
    if (rc) return -1;
    if (ftruncate(fd, (off_t)(8 + n + f->data_size)))
        return errorf(err, errlen, "%s: ftruncate to %llu bytes: %s", path,
                    (unsigned long long)(8 + n + f->data_size), strerror(errno));
    return 0;
}

// Checks that [byte_off, byte_off + nbytes) lies inside tensor idx.
static int check_range(const char *path, const StFile *f, int idx, uint64_t byte_off, uint64_t nbytes,
                       const char *what, char *err, size_t errlen)
{
    if (!f->header_len)
        return errorf(err, errlen, "%s: %s: layout not finalized (call st_finalize)", path, what);
    if (idx < 0 || idx >= f->n)
        return errorf(err, errlen, "%s: %s: tensor index %d out of range [0, %d)", path, what, idx, f->n);
    const StTensor *t = &f->tensors[idx];
    if (byte_off > st_nbytes(t) || nbytes > st_nbytes(t) - byte_off)
        return errorf(err, errlen, "%s: %s: range [%llu, +%llu) outside tensor %s of %llu bytes", path, what,
                    (unsigned long long)byte_off, (unsigned long long)nbytes, t->name,
                    (unsigned long long)st_nbytes(t));
    return 0;
}

int st_write_range(int fd, const char *path, const StFile *f, int idx, uint64_t byte_off,
                   const void *data, uint64_t nbytes, char *err, size_t errlen)
{
    if (check_range(path, f, idx, byte_off, nbytes, "st_write_range", err, errlen)) return -1;
    return pwrite_all(fd, path, data, nbytes, 8 + f->header_len + f->tensors[idx].begin + byte_off,
                      err, errlen);
}

int st_read_range(int fd, const char *path, const StFile *f, int idx, uint64_t byte_off,
                  void *data, uint64_t nbytes, char *err, size_t errlen)
{
    if (check_range(path, f, idx, byte_off, nbytes, "st_read_range", err, errlen)) return -1;
    return pread_all(fd, path, data, nbytes, 8 + f->header_len + f->tensors[idx].begin + byte_off,
                     err, errlen);
}

int st_save(const char *path, StFile *f, const void *const *datas, char *err, size_t errlen)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return errorf(err, errlen, "%s: open for writing: %s", path, strerror(errno));
    int rc = st_write_header(fd, path, f, err, errlen);
    for (int i = 0; !rc && i < f->n; i++) {
        uint64_t n = st_nbytes(&f->tensors[i]);
        if (n && (!datas || !datas[i])) rc = errorf(err, errlen, "%s: st_save: no data for tensor %s", path, f->tensors[i].name);
        else if (n) rc = st_write_range(fd, path, f, i, 0, datas[i], n, err, errlen);
    }
    if (!rc && fsync(fd)) rc = errorf(err, errlen, "%s: fsync: %s", path, strerror(errno));
    if (close(fd) && !rc) rc = errorf(err, errlen, "%s: close: %s", path, strerror(errno));
    return rc;
}

// ---------------------------------------------------------------------------
// Reading and validation

static int check_header_len(const char *path, uint64_t n, uint64_t file_size, char *err, size_t errlen)
{
    if (file_size < 8)
        return errorf(err, errlen, "%s: file is %llu bytes, shorter than the 8-byte header length",
                    path, (unsigned long long)file_size);
    if (n == 0) return errorf(err, errlen, "%s: header length is 0", path);
    if (n > ST_MAX_HEADER)
        return errorf(err, errlen, "%s: header length %llu bytes exceeds the %u-byte limit (not a safetensors file?)",
                    path, (unsigned long long)n, ST_MAX_HEADER);
    if (n > file_size - 8)
        return errorf(err, errlen, "%s: header length %llu bytes exceeds the file (%llu bytes after the length)",
                    path, (unsigned long long)n, (unsigned long long)(file_size - 8));
    return 0;
}

typedef struct {
    const char *s;
    size_t len, p;
    json_tokener *tok;      // decodes keys that hold escapes
    const char *path;
    char *err;
    size_t errlen;
} Scan;

typedef struct { char **v; int n, cap; } Keys;

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static void skip_ws(Scan *sc) { while (sc->p < sc->len && is_ws(sc->s[sc->p])) sc->p++; }
static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int scan_bad(Scan *sc, const char *what)
{
    return errorf(sc->err, sc->errlen, "%s: header is not valid JSON: %s at offset %zu", sc->path, what, sc->p);
}

// Skips the string at p; with out, returns its decoded text (malloc'd).
static int scan_string(Scan *sc, char **out)
{
    if (sc->s[sc->p] != '"') return scan_bad(sc, sc->s[sc->p] == '\'' ? "single-quoted string" : "expected a string");
    size_t b = sc->p++;
    int escaped = 0;
    while (sc->p < sc->len && sc->s[sc->p] != '"') {
        if (sc->s[sc->p] == '\\') { escaped = 1; sc->p++; }
        sc->p++;
    }
    if (sc->p >= sc->len) return scan_bad(sc, "unterminated string");
    sc->p++;
    if (!out) return 0;
    if (!escaped) {
        *out = strndup(sc->s + b + 1, sc->p - b - 2);
    } else {
        json_tokener_reset(sc->tok);
        json_object *o = json_tokener_parse_ex(sc->tok, sc->s + b, (int)(sc->p - b));
        if (!json_object_is_type(o, json_type_string)) { json_object_put(o); return scan_bad(sc, "bad string"); }
        if ((size_t)json_object_get_string_len(o) != strlen(json_object_get_string(o))) {
            json_object_put(o);
            return errorf(sc->err, sc->errlen, "%s: key at offset %zu contains a NUL character", sc->path, b);
        }
        *out = strdup(json_object_get_string(o));
        json_object_put(o);
    }
    return *out ? 0 : errorf(sc->err, sc->errlen, "%s: out of memory", sc->path);
}

static int scan_value(Scan *sc, int depth, const char *parent);

// Checks one object's keys: no duplicates. parent is the key holding it.
static int scan_object(Scan *sc, int depth, const char *parent)
{
    Keys k = {0};
    int rc = 0;
    sc->p++;
    for (;;) {
        skip_ws(sc);
        if (sc->p >= sc->len) { rc = scan_bad(sc, "truncated object"); break; }
        if (sc->s[sc->p] == '}') { sc->p++; break; }
        if (sc->s[sc->p] == ',') { sc->p++; skip_ws(sc); if (sc->p >= sc->len) continue; }
        if (k.n == k.cap) {
            int cap = k.cap ? 2 * k.cap : 8;
            char **v = realloc(k.v, (size_t)cap * sizeof *v);
            if (!v) { rc = errorf(sc->err, sc->errlen, "%s: out of memory", sc->path); break; }
            k.v = v;
            k.cap = cap;
        }
        if ((rc = scan_string(sc, &k.v[k.n]))) break;
        const char *key = k.v[k.n++];
        skip_ws(sc);
        if (sc->p >= sc->len || sc->s[sc->p] != ':') { rc = scan_bad(sc, "expected ':'"); break; }
        sc->p++;
        if ((rc = scan_value(sc, depth + 1, key))) break;
    }
    if (!rc && k.n > 1) {
        qsort(k.v, (size_t)k.n, sizeof *k.v, cmp_str);
        for (int i = 1; i < k.n && !rc; i++) {
            if (strcmp(k.v[i - 1], k.v[i])) continue;
            if (depth == 0) rc = errorf(sc->err, sc->errlen, "%s: duplicate tensor name %s", sc->path, k.v[i]);
            else if (depth == 1 && strcmp(parent, "__metadata__") == 0)
                rc = errorf(sc->err, sc->errlen, "%s: __metadata__ has duplicate key %s", sc->path, k.v[i]);
            else if (depth == 1)
                rc = errorf(sc->err, sc->errlen, "%s: tensor %s: duplicate field \"%s\"", sc->path, parent, k.v[i]);
            else
                rc = errorf(sc->err, sc->errlen, "%s: duplicate key %s in %s", sc->path, k.v[i], parent);
        }
    }
    for (int i = 0; i < k.n; i++) free(k.v[i]);
    free(k.v);
    return rc;
}

static int scan_value(Scan *sc, int depth, const char *parent)
{
    if (depth > 2 * JSON_TOKENER_DEFAULT_DEPTH) return scan_bad(sc, "nested too deeply");
    skip_ws(sc);
    if (sc->p >= sc->len) return scan_bad(sc, "truncated");
    char c = sc->s[sc->p];
    if (c == '{') return scan_object(sc, depth, parent);
    if (c == '"' || c == '\'') return scan_string(sc, NULL);
    if (c == '[') {
        sc->p++;
        for (;;) {
            skip_ws(sc);
            if (sc->p >= sc->len) return scan_bad(sc, "truncated array");
            if (sc->s[sc->p] == ']') { sc->p++; return 0; }
            if (sc->s[sc->p] == ',') { sc->p++; continue; }
            if (scan_value(sc, depth + 1, parent)) return -1;
        }
    }
    // number, true, false or null; json-c also takes NaN and Infinity
    int digit_next = sc->p + 1 < sc->len && sc->s[sc->p + 1] >= '0' && sc->s[sc->p + 1] <= '9';
    if (!strchr("0123456789tfn-", c) || c == '\0' || (c == '-' && !digit_next)) return scan_bad(sc, "unexpected value");
    while (sc->p < sc->len && !is_ws(sc->s[sc->p]) && !strchr(",]}", sc->s[sc->p])) sc->p++;
    return 0;
}

// A non-negative JSON integer (at most INT64_MAX), else -1.
static int get_count(json_object *o, int64_t *out)
{
    if (!json_object_is_type(o, json_type_int)) return -1;
    int64_t v = json_object_get_int64(o);
    if (v < 0 || (v == INT64_MAX && json_object_get_uint64(o) > (uint64_t)INT64_MAX)) return -1;
    *out = v;
    return 0;
}

static int parse_metadata(const char *path, json_object *m, StFile *f, char *err, size_t errlen)
{
    if (!json_object_is_type(m, json_type_object))
        return errorf(err, errlen, "%s: __metadata__ is not an object", path);
    json_object_object_foreach(m, key, val) {
        if (!json_object_is_type(val, json_type_string))
            return errorf(err, errlen, "%s: __metadata__ value for key %s is not a string", path, key);
        if ((size_t)json_object_get_string_len(val) != strlen(json_object_get_string(val)))
            return errorf(err, errlen, "%s: __metadata__ value for key %s contains a NUL character", path, key);
        if (st_set_meta(f, key, json_object_get_string(val), err, errlen))
            return errorf(err, errlen, "%s: __metadata__ key %s: out of memory", path, key);
    }
    return 0;
}

static int parse_tensor(const char *path, const char *name, json_object *e, StFile *f, char *err, size_t errlen)
{
    static const char *fields[] = {"dtype", "shape", "data_offsets"};
    if (!*name) return errorf(err, errlen, "%s: empty tensor name", path);
    if (!json_object_is_type(e, json_type_object))
        return errorf(err, errlen, "%s: tensor %s: entry is not an object", path, name);
    json_object_object_foreach(e, key, val) {
        (void)val;
        if (strcmp(key, fields[0]) && strcmp(key, fields[1]) && strcmp(key, fields[2]))
            return errorf(err, errlen, "%s: tensor %s: unexpected field \"%s\"", path, name, key);
    }
    json_object *v[3];
    for (int i = 0; i < 3; i++)
        if (!json_object_object_get_ex(e, fields[i], &v[i]))
            return errorf(err, errlen, "%s: tensor %s: missing field \"%s\"", path, name, fields[i]);

    StDtype dt;
    if (!json_object_is_type(v[0], json_type_string))
        return errorf(err, errlen, "%s: tensor %s: dtype is not a string", path, name);
    if (dtype_from_name(json_object_get_string(v[0]), (size_t)json_object_get_string_len(v[0]), &dt))
        return errorf(err, errlen, "%s: tensor %s: unknown dtype \"%s\"", path, name, json_object_get_string(v[0]));

    if (!json_object_is_type(v[1], json_type_array))
        return errorf(err, errlen, "%s: tensor %s: shape is not an array", path, name);
    size_t ndim = json_object_array_length(v[1]);
    if (ndim > ST_MAX_DIMS)
        return errorf(err, errlen, "%s: tensor %s: shape has %zu dims, at most %d supported", path, name, ndim, ST_MAX_DIMS);
    int64_t shape[ST_MAX_DIMS];
    for (size_t i = 0; i < ndim; i++)
        if (get_count(json_object_array_get_idx(v[1], i), &shape[i]))
            return errorf(err, errlen, "%s: tensor %s: shape[%zu] = %s is not a non-negative integer", path, name, i,
                        json_object_to_json_string_ext(json_object_array_get_idx(v[1], i), JSON_C_TO_STRING_PLAIN));
    char sb[256];
    uint64_t nbytes;
    if (tensor_bytes(dt, (int)ndim, shape, &nbytes))
        return errorf(err, errlen, "%s: tensor %s: size of %s %s overflows", path, name, st_dtype_name(dt),
                    shape_str(sb, sizeof sb, (int)ndim, shape));

    int64_t off[2];
    if (!json_object_is_type(v[2], json_type_array) || json_object_array_length(v[2]) != 2 ||
        get_count(json_object_array_get_idx(v[2], 0), &off[0]) ||
        get_count(json_object_array_get_idx(v[2], 1), &off[1]))
        return errorf(err, errlen, "%s: tensor %s: data_offsets %s is not two non-negative integers", path, name,
                    json_object_to_json_string_ext(v[2], JSON_C_TO_STRING_PLAIN));
    uint64_t begin = (uint64_t)off[0], end = (uint64_t)off[1];
    if (begin > end)
        return errorf(err, errlen, "%s: tensor %s: data_offsets begin %llu > end %llu", path, name,
                    (unsigned long long)begin, (unsigned long long)end);
    if (end - begin != nbytes)
        return errorf(err, errlen, "%s: tensor %s: data_offsets [%llu, %llu) hold %llu bytes, but %s %s needs %llu",
                    path, name, (unsigned long long)begin, (unsigned long long)end,
                    (unsigned long long)(end - begin), st_dtype_name(dt),
                    shape_str(sb, sizeof sb, (int)ndim, shape), (unsigned long long)nbytes);
    if (end > f->data_size)
        return errorf(err, errlen, "%s: tensor %s: data_offsets [%llu, %llu) extend past the data area (%llu bytes)",
                    path, name, (unsigned long long)begin, (unsigned long long)end,
                    (unsigned long long)f->data_size);
    char *copy = strdup(name);
    if (!copy || push_tensor(f, copy, dt, (int)ndim, shape, begin, end) < 0) {
        free(copy);
        return errorf(err, errlen, "%s: out of memory", path);
    }
    return 0;
}

typedef struct { uint64_t begin, end; int idx; } Span;

static int cmp_span(const void *a, const void *b)
{
    const Span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->idx - y->idx;
}

// The tensors must tile [0, data_size) exactly.
static int check_tiling(const char *path, const StFile *f, char *err, size_t errlen)
{
    Span *s = malloc((size_t)(f->n ? f->n : 1) * sizeof *s);
    if (!s) return errorf(err, errlen, "%s: out of memory", path);
    for (int i = 0; i < f->n; i++) s[i] = (Span){f->tensors[i].begin, f->tensors[i].end, i};
    qsort(s, (size_t)f->n, sizeof *s, cmp_span);
    int rc = 0;
    uint64_t at = 0;       // where the next tensor must begin
    for (int i = 0; i < f->n && !rc; i++) {
        const StTensor *t = &f->tensors[s[i].idx], *prev = i ? &f->tensors[s[i - 1].idx] : NULL;
        if (s[i].begin < at)
            rc = errorf(err, errlen, "%s: tensors %s [%llu, %llu) and %s [%llu, %llu) overlap", path,
                      prev->name, (unsigned long long)prev->begin, (unsigned long long)prev->end, t->name,
                      (unsigned long long)t->begin, (unsigned long long)t->end);
        else if (s[i].begin > at && prev)
            rc = errorf(err, errlen, "%s: %llu-byte hole in the data area between %s [%llu, %llu) and %s [%llu, %llu)",
                      path, (unsigned long long)(s[i].begin - at), prev->name, (unsigned long long)prev->begin,
                      (unsigned long long)prev->end, t->name, (unsigned long long)t->begin,
                      (unsigned long long)t->end);
        else if (s[i].begin > at)
            rc = errorf(err, errlen, "%s: %llu-byte hole at the start of the data area, before %s [%llu, %llu)",
                      path, (unsigned long long)s[i].begin, t->name, (unsigned long long)t->begin,
                      (unsigned long long)t->end);
        at = s[i].end;
    }
    if (!rc && at != f->data_size)
        rc = errorf(err, errlen, "%s: %llu trailing bytes in the data area after the last tensor "
                  "(data area is %llu bytes, tensors end at %llu)", path, (unsigned long long)(f->data_size - at),
                  (unsigned long long)f->data_size, (unsigned long long)at);
    free(s);
    return rc;
}

int st_parse_header(const char *json, size_t len, uint64_t file_size, const char *path,
                    StFile *f, char *err, size_t errlen)
{
    if (!path) path = "<memory>";
    st_init(f);
    if (check_header_len(path, len, file_size, err, errlen)) return -1;
    const char *nul = memchr(json, '\0', len);
    if (nul) return errorf(err, errlen, "%s: header contains a NUL byte at offset %zu", path, (size_t)(nul - json));
    if (json[0] != '{')
        return errorf(err, errlen, "%s: header is not a JSON object (first byte 0x%02x)", path, (unsigned char)json[0]);

    json_tokener *tok = json_tokener_new();
    if (!tok) return errorf(err, errlen, "%s: out of memory", path);
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    json_object *root = json_tokener_parse_ex(tok, json, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    int rc = 0;
    if (!root && jerr == json_tokener_continue)
        rc = errorf(err, errlen, "%s: header is not valid JSON: it ends early", path);
    else if (!root)
        rc = errorf(err, errlen, "%s: header is not valid JSON: %s at offset %zu", path,
                  json_tokener_error_desc(jerr), json_tokener_get_parse_end(tok));
    else if (!json_object_is_type(root, json_type_object))
        rc = errorf(err, errlen, "%s: header is not a JSON object", path);

    Scan sc = {json, len, 0, tok, path, err, errlen};
    if (!rc) rc = scan_value(&sc, 0, NULL);
    skip_ws(&sc);
    if (!rc && sc.p != len)
        rc = errorf(err, errlen, "%s: unexpected bytes after the header JSON at offset %zu", path, sc.p);

    if (!rc) {
        f->data_size = file_size - 8 - len;
        json_object_object_foreach(root, name, val) {
            if (strcmp(name, "__metadata__") == 0) rc = parse_metadata(path, val, f, err, errlen);
            else rc = parse_tensor(path, name, val, f, err, errlen);
            if (rc) break;
        }
    }
    if (!rc) rc = check_tiling(path, f, err, errlen);
    f->header_len = len;    // after parse_metadata, whose st_set_meta clears it
    json_object_put(root);
    json_tokener_free(tok);
    if (rc) st_free(f);
    return rc;
}

int st_open(const char *path, int *fd_out, StFile *f, char *err, size_t errlen)
{
    st_init(f);
    *fd_out = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errorf(err, errlen, "%s: open: %s", path, strerror(errno));
    struct stat st;
    unsigned char len8[8] = {0};
    char *json = NULL;
    int rc = 0;
    if (fstat(fd, &st)) rc = errorf(err, errlen, "%s: fstat: %s", path, strerror(errno));
    uint64_t size = rc ? 0 : (uint64_t)st.st_size, n = 0;
    if (!rc && size < 8) rc = check_header_len(path, 0, size, err, errlen);
    if (!rc) rc = pread_all(fd, path, len8, 8, 0, err, errlen);
    for (int i = 0; i < 8; i++) n |= (uint64_t)len8[i] << (8 * i);
    if (!rc) rc = check_header_len(path, n, size, err, errlen);
    if (!rc && !(json = malloc(n)))
        rc = errorf(err, errlen, "%s: out of memory for a %llu-byte header", path, (unsigned long long)n);
    if (!rc) rc = pread_all(fd, path, json, n, 8, err, errlen);
    if (!rc) rc = st_parse_header(json, n, size, path, f, err, errlen);
    free(json);
    if (rc) { close(fd); return -1; }
    *fd_out = fd;
    return 0;
}

int st_expect(const StFile *f, const char *path, const char *name, StDtype dt, int ndim,
              const int64_t *shape, char *err, size_t errlen)
{
    int i = st_find(f, name);
    if (i < 0) return errorf(err, errlen, "%s: missing tensor %s", path, name);
    const StTensor *t = &f->tensors[i];
    int same = t->dtype == dt && t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (same) return i;
    char have[256], want[256];
    return errorf(err, errlen, "%s: tensor %s has dtype %s shape %s, expected %s %s", path, name,
                st_dtype_name(t->dtype), shape_str(have, sizeof have, t->ndim, t->shape), st_dtype_name(dt),
                shape_str(want, sizeof want, ndim, shape));
}
