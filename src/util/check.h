// Checked allocation and I/O, llm.c style: a failure prints the call, the
// file and the line, then exits. For errors the caller can recover from,
// functions return -1 with a message instead.
#pragma once
#include <stdarg.h>
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

// The recoverable error: formats the message into err (when err and errlen
// are set) and returns -1, so that `return errorf(err, errlen, ...)` reports
// and fails in one statement.
__attribute__((format(printf, 3, 4)))
static inline int errorf(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}
// In a function with parameters (char *err, size_t errlen): FAIL reports and
// returns -1; FAIL_GOTO reports and jumps to the function's `fail:` label,
// for functions that release what they hold there.
#define FAIL(...) return errorf(err, errlen, __VA_ARGS__)
#define FAIL_GOTO(...) do { errorf(err, errlen, __VA_ARGS__); goto fail; } while (0)
