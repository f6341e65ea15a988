// Token-file data loader; see data.h for the stream, the mixture rule and
// the file conventions. Instances are numbered three ways: a global index g
// (what callers pass), an epoch position (after the shuffle) and a native
// index u over all files in order (files[f].first .. first + n_inst - 1).
#include "data/data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/npy.h"
#include "util/check.h"

#define SAMPLE_BYTES (1 << 20)   // the start of a file whose ids are checked at open

typedef struct {
    char *path;
    int64_t bytes, n_tokens;
    int64_t offset;          // bytes before the first token: the .npy header, 0 for a raw file
    int npy;                 // has a .npy header (which says its dtype)
    int64_t first, n_inst;   // native instances
    int source;
    int fd;                  // -1 until first read
} DataFile;

struct DataLoader {
    DataFile *files;
    int n_files, cap_files;
    DataSourceSummary *src;
    char **src_names;
    int64_t *src_first;      // native index of source s's first instance
    int64_t *slot_first;     // first epoch position of source s (n_sources + 1 entries)
    int n_sources, weighted, shuffle, seq_len, vocab_size;
    TokenDtype dtype;
    size_t tsize;
    uint64_t seed;
    int64_t n_epoch;         // N
    unsigned char *scratch;  // seq_len tokens as stored
    DataSummary summary;
};

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(mallocCheck(n), s, n);
}

int tokens_dtype_parse(const char *s, TokenDtype *dt)
{
    if (s && strcmp(s, "uint16") == 0) { *dt = TOKENS_U16; return 0; }
    if (s && strcmp(s, "uint32") == 0) { *dt = TOKENS_U32; return 0; }
    return -1;
}

const char *tokens_dtype_name(TokenDtype dt)
{
    return dt == TOKENS_U16 ? "uint16" : dt == TOKENS_U32 ? "uint32" : "?";
}

size_t tokens_dtype_size(TokenDtype dt) { return dt == TOKENS_U16 ? 2 : dt == TOKENS_U32 ? 4 : 0; }

// ---------------------------------------------------------------------------
// keyed permutations

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t key3(uint64_t a, uint64_t b, uint64_t c)
{
    return splitmix64(splitmix64(splitmix64(a) ^ b) ^ c);
}

#define FEISTEL_ROUNDS 6

// Position of i in a permutation of [0, n) keyed by key: a balanced Feistel
// network on 2h bits (4^h >= n, so < 4n values) is a bijection, and walking
// its cycle until the value falls below n keeps it one on [0, n).
static uint64_t permute(uint64_t i, uint64_t n, uint64_t key)
{
    if (n <= 1) return 0;
    int h = 1;
    while (h < 32 && (1ull << (2 * h)) < n) h++;
    uint64_t mask = (1ull << h) - 1, rk[FEISTEL_ROUNDS];
    for (int r = 0; r < FEISTEL_ROUNDS; r++) rk[r] = splitmix64(key + (uint64_t)r);
    do {
        uint64_t lo = i & mask, hi = i >> h;
        for (int r = 0; r < FEISTEL_ROUNDS; r++) {
            uint64_t t = hi ^ (splitmix64(lo ^ rk[r]) & mask);
            hi = lo;
            lo = t;
        }
        i = (hi << h) | lo;
    } while (i >= n);
    return i;
}

// Native instance at global index g (see data.h for the rule).
static int64_t native_index(const DataLoader *d, int64_t g)
{
    uint64_t e = (uint64_t)(g / d->n_epoch), k = (uint64_t)(g % d->n_epoch);
    if (d->shuffle) k = permute(k, (uint64_t)d->n_epoch, key3(d->seed, e, 0));
    if (!d->weighted) return (int64_t)k;
    int s = 0;
    while ((uint64_t)d->slot_first[s + 1] <= k) s++;
    uint64_t c = (uint64_t)d->src[s].per_epoch, n = (uint64_t)d->src[s].n_instances;
    uint64_t q = e * c + (k - (uint64_t)d->slot_first[s]);
    return d->src_first[s] + (int64_t)permute(q % n, n, key3(d->seed, q / n, 1 + (uint64_t)s));
}

// The file holding native instance u: the last file with first <= u (files
// without instances share their first with the next one, so never match).
static int file_of(const DataLoader *d, int64_t u)
{
    int lo = 0, hi = d->n_files - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (d->files[mid].first <= u) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

void data_locate(const DataLoader *d, int64_t g, int *file, int64_t *token)
{
    int64_t u = native_index(d, g);
    int f = file_of(d, u);
    *file = f;
    *token = (u - d->files[f].first) * d->seq_len;
}

// ---------------------------------------------------------------------------
// opening

// Reads n bytes at off, retrying short reads: the bytes read (< n at the
// end of the file), or -1 with errno.
static int64_t pread_full(int fd, void *buf, size_t n, int64_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + (int64_t)got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (int64_t)got;
}

// The .npy header of the file open as fd, if it has one: *offset and
// *n_tokens from it (data.h). 0 for a raw file, 1 for an .npy file, -1 on
// error: a bad header, or a dtype that is not data.dtype.
static int read_npy_header(const DataLoader *d, const char *path, int fd, int64_t bytes, int64_t *offset,
                           int64_t *n_tokens, char *err, size_t errlen)
{
    unsigned char pre[NPY_PREAMBLE];
    size_t n = bytes < NPY_PREAMBLE ? (size_t)bytes : NPY_PREAMBLE;
    if (pread_full(fd, pre, n, 0) != (int64_t)n)
        return errorf(err, errlen, "data file %s: read: %s", path, strerror(errno));
    if (!npy_has_magic(pre, n)) return 0;
    char msg[400];
    int64_t len = npy_header_size(pre, n, msg, sizeof msg);
    if (len < 0) return errorf(err, errlen, "data file %s: %s", path, msg);
    if (len > bytes)
        return errorf(err, errlen, "data file %s: its .npy header is %lld bytes long but the file holds %lld",
                      path, (long long)len, (long long)bytes);
    unsigned char *buf = mallocCheck((size_t)len);
    NpyHeader h;
    int rc = pread_full(fd, buf, (size_t)len, 0) != len ? errorf(err, errlen, "data file %s: read: %s", path, strerror(errno))
           : npy_parse(buf, (size_t)len, &h, msg, sizeof msg) ? errorf(err, errlen, "data file %s: %s", path, msg)
           : 1;
    free(buf);
    if (rc < 0) return rc;
    TokenDtype dt = h.item_size == 2 ? TOKENS_U16 : TOKENS_U32;
    if (dt != d->dtype)
        return errorf(err, errlen, "data file %s: its .npy header says dtype '%s' (%s) but data.dtype is %s: "
                      "set data.dtype: %s", path, h.descr, tokens_dtype_name(dt), tokens_dtype_name(d->dtype),
                      tokens_dtype_name(dt));
    if (bytes - len != h.n_items * h.item_size)
        return errorf(err, errlen, "data file %s: its .npy header says %lld tokens (%lld bytes after the %lld-byte "
                      "header) but the file holds %lld bytes after it: truncated, or not written by np.save",
                      path, (long long)h.n_items, (long long)(h.n_items * h.item_size), (long long)len,
                      (long long)(bytes - len));
    *offset = len;
    *n_tokens = h.n_items;
    return 1;
}

static int add_file(DataLoader *d, const char *path, int source, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0) return errorf(err, errlen, "data file %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return errorf(err, errlen, "data file %s: not a regular file", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errorf(err, errlen, "data file %s: open: %s", path, strerror(errno));
    int64_t offset = 0, n_tokens = st.st_size / (int64_t)d->tsize;
    int npy = read_npy_header(d, path, fd, st.st_size, &offset, &n_tokens, err, errlen);
    close(fd);
    if (npy < 0) return -1;
    if (!npy && (uint64_t)st.st_size % d->tsize != 0)
        return errorf(err, errlen, "data file %s: size %lld bytes is not a multiple of %zu (%s tokens)%s",
                    path, (long long)st.st_size, d->tsize, tokens_dtype_name(d->dtype),
                    d->dtype == TOKENS_U32 && st.st_size % 2 == 0 ? ": if it holds uint16 tokens, set data.dtype: uint16" : "");
    if (d->n_files == d->cap_files) {
        d->cap_files = d->cap_files ? 2 * d->cap_files : 16;
        d->files = reallocCheck(d->files, (size_t)d->cap_files * sizeof *d->files);
    }
    DataFile *f = &d->files[d->n_files++];
    f->path = dup_str(path);
    f->bytes = st.st_size;
    f->offset = offset;
    f->npy = npy;
    f->n_tokens = n_tokens;
    f->n_inst = f->n_tokens / d->seq_len;
    f->source = source;
    f->fd = -1;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

// A pattern without glob characters is a plain path, so a missing one is
// reported as a missing file rather than an empty match.
static int add_matches(DataLoader *d, const char *pattern, int source, char *err, size_t errlen)
{
    if (!strpbrk(pattern, "*?[")) return add_file(d, pattern, source, err, errlen);
    glob_t g;
    int rc = glob(pattern, GLOB_NOSORT | GLOB_ERR, NULL, &g);
    if (rc == GLOB_NOMATCH) {
        globfree(&g);
        return errorf(err, errlen, "data pattern '%s' matches no files", pattern);
    }
    if (rc != 0) {
        globfree(&g);
        return errorf(err, errlen, "data pattern '%s': %s", pattern,
                    rc == GLOB_NOSPACE ? "out of memory" : "read error while matching");
    }
    qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, cmp_str);
    for (size_t i = 0; i < g.gl_pathc; i++)
        if (add_file(d, g.gl_pathv[i], source, err, errlen) != 0) {
            globfree(&g);
            return -1;
        }
    globfree(&g);
    return 0;
}

static int check_sample(DataLoader *d, int i, char *err, size_t errlen);

// Adds the files of a path or pattern and checks the start of the first.
static int add_pattern(DataLoader *d, const char *pattern, int source, char *err, size_t errlen)
{
    int first = d->n_files;
    if (add_matches(d, pattern, source, err, errlen) != 0) return -1;
    return first < d->n_files ? check_sample(d, first, err, errlen) : 0;
}

static uint64_t fingerprint(const DataLoader *d)
{
    uint64_t h = key3((uint64_t)d->seq_len, (uint64_t)d->dtype, d->seed);
    h = key3(h, (uint64_t)d->shuffle, (uint64_t)d->n_sources);
    for (int s = 0; s < d->n_sources; s++) h = key3(h, (uint64_t)d->src[s].n_files, (uint64_t)d->src[s].per_epoch);
    for (int i = 0; i < d->n_files; i++) h = key3(h, (uint64_t)i, (uint64_t)d->files[i].bytes);
    return h;
}

DataLoader *data_open(const DataSource *sources, int n_sources, TokenDtype dt, int seq_len,
                      int vocab_size, uint64_t seed, int shuffle, char *err, size_t errlen)
{
    if (n_sources < 1) { errorf(err, errlen, "data: no sources given"); return NULL; }
    if (seq_len < 1) { errorf(err, errlen, "data: seq_len %d must be >= 1", seq_len); return NULL; }
    if (vocab_size < 1) { errorf(err, errlen, "data: vocab_size %d must be >= 1", vocab_size); return NULL; }
    if (tokens_dtype_size(dt) == 0) { errorf(err, errlen, "data: invalid token dtype %d", (int)dt); return NULL; }

    DataLoader *d = mallocCheck(sizeof *d);
    d->n_sources = n_sources;
    d->seq_len = seq_len;
    d->vocab_size = vocab_size;
    d->dtype = dt;
    d->tsize = tokens_dtype_size(dt);
    d->seed = seed;
    d->shuffle = shuffle != 0;
    d->src = mallocCheck((size_t)n_sources * sizeof *d->src);
    d->src_names = mallocCheck((size_t)n_sources * sizeof *d->src_names);
    d->src_first = mallocCheck((size_t)n_sources * sizeof *d->src_first);
    d->slot_first = mallocCheck((size_t)(n_sources + 1) * sizeof *d->slot_first);
    d->scratch = mallocCheck((size_t)seq_len * d->tsize);

    int n_weighted = 0;
    double wsum = 0;
    for (int s = 0; s < n_sources; s++) {
        const DataSource *src = &sources[s];
        char name[32];
        snprintf(name, sizeof name, "source%d", s);
        d->src_names[s] = dup_str(src->name ? src->name : name);
        d->src[s].name = d->src_names[s];
        d->src[s].weight = src->weight;
        if (isnan(src->weight) || isinf(src->weight)) {
            errorf(err, errlen, "data source %s: weight %g is not finite", d->src_names[s], src->weight);
            goto bad;
        }
        if (src->weight > 0) { n_weighted++; wsum += src->weight; }
        if (src->n_patterns < 1) { errorf(err, errlen, "data source %s: no paths", d->src_names[s]); goto bad; }

        int f0 = d->n_files;
        for (int p = 0; p < src->n_patterns; p++) {
            if (!src->patterns[p]) { errorf(err, errlen, "data source %s: path %d is NULL", d->src_names[s], p); goto bad; }
            if (add_pattern(d, src->patterns[p], s, err, errlen) != 0) goto bad;
        }
        d->src[s].n_files = d->n_files - f0;
        for (int i = f0; i < d->n_files; i++) {
            d->src[s].n_tokens += d->files[i].n_tokens;
            d->src[s].n_instances += d->files[i].n_inst;
        }
    }
    if (n_weighted != 0 && n_weighted != n_sources) {
        errorf(err, errlen, "data: %d of %d sources have a weight > 0; give every source a weight or none",
             n_weighted, n_sources);
        goto bad;
    }
    d->weighted = n_weighted > 0;

    int64_t first = 0;
    for (int i = 0; i < d->n_files; i++) {
        d->files[i].first = first;
        first += d->files[i].n_inst;
    }
    int64_t total = first, n_tokens = 0;
    for (int i = 0; i < d->n_files; i++) n_tokens += d->files[i].n_tokens;
    first = 0;
    d->slot_first[0] = 0;
    for (int s = 0; s < n_sources; s++) {
        DataSourceSummary *src = &d->src[s];
        d->src_first[s] = first;
        first += src->n_instances;
        if (d->weighted) {
            if (src->n_instances == 0) {
                errorf(err, errlen, "data source %s (weight %g): no file holds a complete instance of %d tokens",
                     src->name, src->weight, seq_len);
                goto bad;
            }
            src->per_epoch = llround((double)total * src->weight / wsum);
        } else {
            src->per_epoch = src->n_instances;
        }
        d->slot_first[s + 1] = d->slot_first[s] + src->per_epoch;
    }
    d->n_epoch = d->slot_first[n_sources];
    if (d->n_epoch == 0) {
        errorf(err, errlen, "data: %d files hold %lld tokens, not one complete instance of %d tokens",
             d->n_files, (long long)n_tokens, seq_len);
        goto bad;
    }

    DataSummary *sm = &d->summary;
    sm->n_files = d->n_files;
    sm->n_sources = n_sources;
    sm->seq_len = seq_len;
    sm->weighted = d->weighted;
    sm->shuffle = d->shuffle;
    sm->dtype = dt;
    sm->n_tokens = n_tokens;
    sm->n_instances = total;
    sm->instances_per_epoch = d->n_epoch;
    sm->tokens_per_epoch = d->n_epoch * seq_len;
    sm->fingerprint = fingerprint(d);
    sm->sources = d->src;
    return d;
bad:
    data_close(d);
    return NULL;
}

void data_close(DataLoader *d)
{
    if (!d) return;
    for (int i = 0; i < d->n_files; i++) {
        if (d->files[i].fd >= 0) close(d->files[i].fd);
        free(d->files[i].path);
    }
    for (int s = 0; s < d->n_sources; s++) free(d->src_names[s]);
    free(d->files);
    free(d->src);
    free(d->src_names);
    free(d->src_first);
    free(d->slot_first);
    free(d->scratch);
    free(d);
}

// ---------------------------------------------------------------------------
// reading

static int file_fd(DataLoader *d, int i, char *err, size_t errlen)
{
    DataFile *f = &d->files[i];
    if (f->fd >= 0) return f->fd;
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
        for (int j = 0; j < d->n_files; j++)
            if (d->files[j].fd >= 0) { close(d->files[j].fd); d->files[j].fd = -1; }
        fd = open(f->path, O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0) return errorf(err, errlen, "data file %s: open: %s", f->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return errorf(err, errlen, "data file %s: fstat: %s", f->path, strerror(e));
    }
    if (st.st_size != f->bytes) {
        close(fd);
        return errorf(err, errlen, "data file %s: size changed from %lld to %lld bytes since the loader opened it",
                    f->path, (long long)f->bytes, (long long)st.st_size);
    }
    f->fd = fd;
    return fd;
}

static int pread_all(DataLoader *d, int i, void *buf, size_t n, int64_t off, char *err, size_t errlen)
{
    int fd = file_fd(d, i, err, errlen);
    if (fd < 0) return -1;
    int64_t got = pread_full(fd, buf, n, off);
    if (got < 0)
        return errorf(err, errlen, "data file %s: pread at byte offset %lld: %s", d->files[i].path, (long long)off,
                      strerror(errno));
    if (got < (int64_t)n)
        return errorf(err, errlen, "data file %s: unexpected end of file at byte offset %lld", d->files[i].path,
                      (long long)(off + got));
    return 0;
}

static uint32_t token_at(const unsigned char *p, size_t size)
{
    return size == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8
                     : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// Whether nbytes of stored tokens, read size bytes at a time, are all < vocab.
static int all_below(const unsigned char *buf, size_t nbytes, size_t size, uint32_t vocab)
{
    for (size_t b = 0; b + size <= nbytes; b += size)
        if (token_at(buf + b, size) >= vocab) return 0;
    return 1;
}

// What to change when stored tokens of file f hold an id >= vocab_size,
// max the largest (the rule in data.h).
static void mismatch_hint(const DataLoader *d, const DataFile *f, const unsigned char *buf, size_t nbytes,
                          uint32_t max, char *hint, size_t len)
{
    uint32_t vocab = (uint32_t)d->vocab_size;
    int whole32 = (f->bytes - f->offset) % 4 == 0 && nbytes % 4 == 0;
    if (!f->npy && d->dtype == TOKENS_U32 && all_below(buf, nbytes, 2, vocab))
        snprintf(hint, len, "read as uint16 all its ids here are < model.vocab_size: the file looks like uint16 "
                 "tokens; set data.dtype: uint16");
    else if (!f->npy && d->dtype == TOKENS_U16 && whole32 && all_below(buf, nbytes, 4, vocab))
        snprintf(hint, len, "read as uint32 all its ids here are < model.vocab_size: the file looks like uint32 "
                 "tokens; set data.dtype: uint32");
    else
        snprintf(hint, len, "set model.vocab_size to the tokenizer's vocabulary (ids here go up to %u)%s", max,
                 f->npy ? "" : ", or data.dtype to the file's token width");
}

// Decodes n stored tokens into out (out may be NULL), checking each against
// vocab_size; off is the byte offset of buf[0] in file i, for the message.
static int decode(const DataLoader *d, int i, const unsigned char *buf, int64_t n, int64_t off,
                  int *out, char *err, size_t errlen)
{
    uint32_t bad = 0, max = 0;
    int64_t bad_at = -1;
    for (int64_t t = 0; t < n; t++) {
        uint32_t v = token_at(buf + t * (int64_t)d->tsize, d->tsize);
        if (v >= (uint32_t)d->vocab_size && bad_at < 0) { bad = v; bad_at = t; }
        if (v > max) max = v;
        if (out) out[t] = (int)v;
    }
    if (bad_at < 0) return 0;
    char hint[300];
    mismatch_hint(d, &d->files[i], buf, (size_t)n * d->tsize, max, hint, sizeof hint);
    return errorf(err, errlen, "data file %s: token %u at byte offset %lld is >= model.vocab_size %d: %s",
                  d->files[i].path, bad, (long long)(off + bad_at * (int64_t)d->tsize), d->vocab_size, hint);
}

// Rule (b) of data.h over nbytes stored at the start of raw file i read as
// uint16: uint32 tokens read as uint16 make every second id (the high
// halves) at most (vocab_size - 1) >> 16 while the others are not all that
// small.
static int check_width(const DataLoader *d, int i, const unsigned char *buf, size_t nbytes, char *err, size_t errlen)
{
    const DataFile *f = &d->files[i];
    if (f->npy || d->dtype != TOKENS_U16 || (f->bytes - f->offset) % 4 != 0) return 0;
    uint32_t vocab = (uint32_t)d->vocab_size, hi_max = (vocab - 1) >> 16;
    size_t pairs = nbytes / 4;
    if (pairs < 256) return 0;
    int low_big = 0;
    for (size_t p = 0; p < pairs; p++) {
        uint32_t lo = token_at(buf + 4 * p, 2), hi = token_at(buf + 4 * p + 2, 2);
        if (hi > hi_max || token_at(buf + 4 * p, 4) >= vocab) return 0;
        low_big |= lo > hi_max;
    }
    if (!low_big) return 0;
    return errorf(err, errlen, "data file %s: read as uint16 (data.dtype), every second id of its first %zu bytes is "
                  "<= %u and the others are not: the file looks like uint32 tokens; set data.dtype: uint32",
                  f->path, pairs * 4, hi_max);
}

// Checks at open: the first SAMPLE_BYTES of file i (data.h).
static int check_sample(DataLoader *d, int i, char *err, size_t errlen)
{
    DataFile *f = &d->files[i];
    int64_t n = f->n_tokens < SAMPLE_BYTES / (int64_t)d->tsize ? f->n_tokens : SAMPLE_BYTES / (int64_t)d->tsize;
    if (n == 0) return 0;
    unsigned char *buf = mallocCheck((size_t)n * d->tsize);
    int rc = pread_all(d, i, buf, (size_t)n * d->tsize, f->offset, err, errlen);
    if (rc == 0) rc = decode(d, i, buf, n, f->offset, NULL, err, errlen);
    if (rc == 0) rc = check_width(d, i, buf, (size_t)n * d->tsize, err, errlen);
    free(buf);
    // the first read opens it again and sees whether its size changed since
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    return rc;
}

int data_read(DataLoader *d, int64_t g_start, int count, int *tokens, int *targets, char *err, size_t errlen)
{
    if (g_start < 0 || count < 0 || g_start > INT64_MAX - count)
        return errorf(err, errlen, "data_read: bad range start %lld count %d", (long long)g_start, count);
    if (count > 0 && !tokens) return errorf(err, errlen, "data_read: tokens is NULL");
    int T = d->seq_len;
    size_t nbytes = (size_t)T * d->tsize;
    for (int b = 0; b < count; b++) {
        int f;
        int64_t tok;
        data_locate(d, g_start + b, &f, &tok);
        int64_t off = d->files[f].offset + tok * (int64_t)d->tsize;
        int *x = tokens + (size_t)b * T;
        if (pread_all(d, f, d->scratch, nbytes, off, err, errlen) != 0) return -1;
        if (decode(d, f, d->scratch, T, off, x, err, errlen) != 0) return -1;
        if (targets) {
            int *y = targets + (size_t)b * T;
            memcpy(y, x + 1, (size_t)(T - 1) * sizeof *y);
            y[T - 1] = -1;
        }
    }
    return 0;
}

int data_validate_all(DataLoader *d, char *err, size_t errlen)
{
    const int64_t chunk = 1 << 20;   // tokens per read
    unsigned char *buf = mallocCheck((size_t)chunk * d->tsize);
    int rc = 0;
    for (int i = 0; i < d->n_files && rc == 0; i++)
        for (int64_t t = 0; t < d->files[i].n_tokens && rc == 0; t += chunk) {
            int64_t n = d->files[i].n_tokens - t < chunk ? d->files[i].n_tokens - t : chunk;
            int64_t off = d->files[i].offset + t * (int64_t)d->tsize;
            size_t nbytes = (size_t)n * d->tsize;
            rc = pread_all(d, i, buf, nbytes, off, err, errlen);
            if (rc == 0) rc = decode(d, i, buf, n, off, NULL, err, errlen);
            if (rc == 0 && t == 0) rc = check_width(d, i, buf, nbytes < SAMPLE_BYTES ? nbytes : SAMPLE_BYTES, err, errlen);
        }
    free(buf);
    return rc;
}

// ---------------------------------------------------------------------------
// summary

int64_t data_instances_per_epoch(const DataLoader *d) { return d->n_epoch; }
const DataSummary *data_summary(const DataLoader *d) { return &d->summary; }

const char *data_file_path(const DataLoader *d, int file)
{
    return file >= 0 && file < d->n_files ? d->files[file].path : NULL;
}

int data_file_source(const DataLoader *d, int file)
{
    return file >= 0 && file < d->n_files ? d->files[file].source : -1;
}

void data_describe(const DataLoader *d, char *buf, size_t len)
{
    if (!buf || !len) return;
    const DataSummary *s = &d->summary;
    size_t k = (size_t)snprintf(buf, len,
        "%d files in %d sources (%s), %lld tokens, %lld instances/epoch x %d tokens = %lld tokens/epoch, %s",
        s->n_files, s->n_sources, tokens_dtype_name(s->dtype), (long long)s->n_tokens,
        (long long)s->instances_per_epoch, s->seq_len, (long long)s->tokens_per_epoch,
        s->shuffle ? "shuffled" : "in file order");
    for (int i = 0; i < s->n_sources && k < len; i++) {
        const DataSourceSummary *src = &s->sources[i];
        k += (size_t)snprintf(buf + k, len - k, "; %s: %d files, %lld instances -> %lld/epoch",
                              src->name, src->n_files, (long long)src->n_instances, (long long)src->per_epoch);
        if (k < len && s->weighted) k += (size_t)snprintf(buf + k, len - k, " (weight %g)", src->weight);
    }
}
