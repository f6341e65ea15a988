// TensorBoard event files: TFRecord framing and the few protobuf fields of
// tfevents.h, encoded by hand (varints, fixed64 double, fixed32 float,
// length-delimited strings and messages; all little-endian).
#include "util/tfevents.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "util/check.h"

typedef struct {
    uint8_t *p;
    size_t n, cap;
} Buf;

struct TfEvents {
    FILE *f;
    char path[1200];
    int64_t step;
    double wall_time;
    Buf values, event;  // the step's Summary.value entries; the Event being framed
};

static void put(Buf *b, const void *data, size_t n) {
    if (!n) return;
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = reallocCheck(b->p, b->cap);
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void put_varint(Buf *b, uint64_t v) {
    uint8_t out[10];
    int n = 0;
    do {
        out[n] = v & 0x7f;
        v >>= 7;
        if (v) out[n] |= 0x80;
        n++;
    } while (v);
    put(b, out, n);
}

static void put_le(Buf *b, uint64_t v, int bytes) {
    uint8_t out[8];
    for (int i = 0; i < bytes; i++) out[i] = (uint8_t)(v >> (8 * i));
    put(b, out, bytes);
}

// protobuf keys: field number << 3 | wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32)
static void put_key(Buf *b, int field, int wire) { put_varint(b, (uint64_t)field << 3 | wire); }

static void put_double(Buf *b, int field, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    put_key(b, field, 1);
    put_le(b, u, 8);
}

static void put_float(Buf *b, int field, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    put_key(b, field, 5);
    put_le(b, u, 4);
}

static void put_bytes(Buf *b, int field, const void *data, size_t n) {
    put_key(b, field, 2);
    put_varint(b, n);
    put(b, data, n);
}

uint32_t crc32c(const void *data, size_t n) {
    static uint32_t table[256];
    if (!table[1]) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
            table[i] = c;
        }
    }
    const uint8_t *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

static uint32_t masked_crc(const void *data, size_t n) {
    uint32_t c = crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// Writes b as one TFRecord and flushes. 0, or -1 with a message.
static int write_record(TfEvents *w, const Buf *b, char *err, size_t errlen) {
    Buf head = {0};
    put_le(&head, b->n, 8);
    put_le(&head, masked_crc(head.p, 8), 4);
    uint8_t tail[4];
    uint32_t crc = masked_crc(b->p, b->n);
    for (int i = 0; i < 4; i++) tail[i] = (uint8_t)(crc >> (8 * i));
    int ok = fwrite(head.p, 1, head.n, w->f) == head.n && fwrite(b->p, 1, b->n, w->f) == b->n &&
             fwrite(tail, 1, 4, w->f) == 4 && fflush(w->f) == 0;
    free(head.p);
    if (!ok) {
        snprintf(err, errlen, "cannot write %s: %s", w->path, strerror(errno));
        return -1;
    }
    return 0;
}

static double wall_time(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return tv.tv_sec + tv.tv_usec * 1e-6;
}

TfEvents *tfevents_open(const char *dir, char *err, size_t errlen) {
    TfEvents *w = mallocCheck(sizeof *w);
    memset(w, 0, sizeof *w);
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%ld.moecore", dir, (long long)time(NULL), host,
             (long)getpid());
    w->f = fopen(w->path, "wb");
    if (!w->f) {
        snprintf(err, errlen, "cannot create %s: %s", w->path, strerror(errno));
        free(w);
        return NULL;
    }
    Buf *e = &w->event;
    put_double(e, 1, wall_time());
    put_bytes(e, 3, "brain.Event:2", 13);
    if (write_record(w, e, err, errlen)) {
        tfevents_close(w);
        return NULL;
    }
    return w;
}

const char *tfevents_path(const TfEvents *w) { return w->path; }

void tfevents_begin(TfEvents *w, int64_t step) {
    w->step = step;
    w->wall_time = wall_time();
    w->values.n = 0;
}

void tfevents_scalar(TfEvents *w, const char *tag, double value) {
    Buf v = {0};
    put_bytes(&v, 1, tag, strlen(tag));
    put_float(&v, 2, (float)value);
    put_bytes(&w->values, 1, v.p, v.n);
    free(v.p);
}

int tfevents_end(TfEvents *w, char *err, size_t errlen) {
    Buf *e = &w->event;
    e->n = 0;
    put_double(e, 1, w->wall_time);
    put_key(e, 2, 0);
    put_varint(e, (uint64_t)w->step);
    put_bytes(e, 5, w->values.p, w->values.n);
    return write_record(w, e, err, errlen);
}

int tfevents_close(TfEvents *w) {
    if (!w) return 0;
    int rc = fclose(w->f) ? -1 : 0;
    free(w->values.p);
    free(w->event.p);
    free(w);
    return rc;
}
