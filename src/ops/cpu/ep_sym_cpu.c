// The CPU reference of the symmetric expert-parallel ops (ops/ep_sym.h):
// plain loops over host memory, act = float. The virtual-rank tests hold the
// CUDA kernels (ep_sym.cu) and ep.c's all-to-all path to these.
#include "ops/ep_sym.h"

#include <string.h>

void ep_sym_cpu_write_counts(int *const *windows, const int *offsets, int P, int rank, int E) {
    for (int q = 0; q < P; q++)
        for (int g = 0; g < E; g++) windows[q][(size_t)rank * E + g] = offsets[g + 1] - offsets[g];
}

// The receive-buffer bound: when an owner's experts would take more than
// max_rows rows, the largest c with sum_e min(cut[e], c) <= max_rows, and
// cut[e] = min(cut[e], c) (only the largest experts lose rows).
static void bound_to_buffer(int *cut, int El, int max_rows) {
    long total = 0;
    int hi = 0;
    for (int e = 0; e < El; e++) {
        total += cut[e];
        if (cut[e] > hi) hi = cut[e];
    }
    if (total <= max_rows) return;
    int lo = 0; // sum of min(cut, 0) = 0 fits; hi does not
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        long s = 0;
        for (int e = 0; e < El; e++) s += cut[e] < mid ? cut[e] : mid;
        if (s <= max_rows) lo = mid;
        else hi = mid;
    }
    for (int e = 0; e < El; e++)
        if (cut[e] > lo) cut[e] = lo;
}

void ep_sym_cpu_plan(int *plan, float *dropped, const int *counts, int P, int rank, int E, int capacity,
                     int max_rows) {
    int El = E / P;
    int *base = ep_sym_send_base(plan, E), *keep = ep_sym_send_keep(plan, E);
    int *recv_offsets = ep_sym_recv_offsets(plan, E);
    int n[E], cut[E];
    for (int g = 0; g < E; g++) {
        n[g] = 0;
        for (int s = 0; s < P; s++) n[g] += counts[(size_t)s * E + g];
        cut[g] = capacity > 0 && n[g] > capacity ? capacity : n[g];
    }
    for (int q = 0; q < P; q++) bound_to_buffer(cut + (size_t)q * El, El, max_rows);
    long lost = 0;
    for (int q = 0; q < P; q++) {
        int seg = 0;
        for (int e = 0; e < El; e++) {
            int g = q * El + e, before = 0;
            for (int s = 0; s < rank; s++) before += counts[(size_t)s * E + g];
            int left = cut[g] - before, mine = counts[(size_t)rank * E + g];
            keep[g] = left < 0 ? 0 : left < mine ? left : mine;
            base[g] = seg + (before < cut[g] ? before : cut[g]);
            if (q == rank) {
                recv_offsets[e] = seg;
                lost += n[g] - cut[g];
            }
            seg += cut[g];
        }
        if (q == rank) recv_offsets[El] = seg;
    }
    if (dropped) dropped[0] += (float)lost;
}

void ep_sym_cpu_dispatch(void *const *recv, const int *plan, const int *offsets, const void *xp, int P, int E,
                         int R, int C) {
    int El = E / P;
    const int *base = plan, *keep = plan + E;
    (void)R;
#pragma omp parallel for schedule(dynamic)
    for (int g = 0; g < E; g++) {
        float *dst = (float *)recv[g / El] + (size_t)base[g] * C;
        memcpy(dst, (const float *)xp + (size_t)offsets[g] * C, (size_t)keep[g] * C * sizeof(float));
    }
}

void ep_sym_cpu_combine(void *y, void *const *out, const int *plan, const int *offsets, int P, int E, int R,
                        int C) {
    int El = E / P;
    const int *base = plan, *keep = plan + E;
    (void)R;
#pragma omp parallel for schedule(dynamic)
    for (int g = 0; g < E; g++) {
        float *dst = (float *)y + (size_t)offsets[g] * C;
        int rows = offsets[g + 1] - offsets[g];
        memcpy(dst, (const float *)out[g / El] + (size_t)base[g] * C, (size_t)keep[g] * C * sizeof(float));
        memset(dst + (size_t)keep[g] * C, 0, (size_t)(rows - keep[g]) * C * sizeof(float));
    }
}
