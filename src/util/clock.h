// Wall-clock seconds from a monotonic clock, for step times, timeouts and
// measurements.
#pragma once
#include <time.h>

static inline double clock_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
