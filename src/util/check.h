// Checked allocation and I/O, llm.c style: a failure prints the call, the
// file and the line, then exits. For errors the caller can recover from,
// functions return -1 with a message instead.
#pragma once
#include <stdio.h>
#include <stdlib.h>

static inline void *malloc_check_(size_t n, const char *file, int line) {
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        fprintf(stderr, "moecore: out of memory allocating %zu bytes at %s:%d\n", n, file, line);
        exit(1);
    }
    return p;
}
#define mallocCheck(n) malloc_check_((n), __FILE__, __LINE__)

static inline void *realloc_check_(void *q, size_t n, const char *file, int line) {
    void *p = realloc(q, n ? n : 1);
    if (!p) {
        fprintf(stderr, "moecore: out of memory reallocating %zu bytes at %s:%d\n", n, file, line);
        exit(1);
    }
    return p;
}
#define reallocCheck(q, n) realloc_check_((q), (n), __FILE__, __LINE__)

#define die(...) do { fprintf(stderr, "moecore: error: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
