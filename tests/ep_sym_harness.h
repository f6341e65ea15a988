// Virtual ranks for the symmetric expert-parallel ops (ops/ep_sym.h,
// DESIGN.md §11): P logical ranks of one ep group in one process, each with
// its own routed rows, count window, plan and receive buffer, and peer
// tables (arrays of P pointers) into the others' — what NCCL's symmetric
// windows hand the kernels on real peers. The phases run rank by rank, phase
// by phase (the order is the barrier). tests/test_ep_sym.c runs it on the
// CPU reference; tests/gpu/test_ep_sym.c runs the CUDA kernels the same way
// and compares them with this.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ep_sym.h"
#include "ops/ops.h"

typedef struct {
    int P, N, k, E, C;
    int capacity;  // rows per expert, 0 = none
    int max_rows;  // rows of each receive buffer
    int skewed;    // learned-like routing: a few experts take most rows
    uint64_t seed;
} EpSymCase;

typedef struct {
    int *idx;       // [N k] expert choices
    int *offsets;   // [E+1] routed rows by global expert
    float *xp;      // [R][C] routed rows, expert order
    int *window;    // [P][E] count window (peers write row s)
    int *plan;      // [ep_sym_plan_ints]
    float *recv;    // [max_rows][C]
    float *y;       // [R][C] combine result
    float dropped;  // rows this rank's experts dropped
} EpSymRank;

static inline uint64_t eh_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
static inline double eh_unit(uint64_t *s) { return (double)(eh_next(s) >> 11) / 9007199254740992.0; }
static inline uint64_t eh_seed(uint64_t seed, int rank) {
    uint64_t s = (seed + 1) * 0x9e3779b97f4a7c15ULL ^ (uint64_t)(rank + 1) * 0xbf58476d1ce4e5b9ULL;
    return s ? s : 1;
}

// Rank r's routing: k distinct experts per token, uniform or drawn with
// weights 1 / (1 + g)^1.5 over a rank-dependent rotation of the experts
// (skewed, as early training routes); rows random in [-1, 1).
static inline void eh_route(const EpSymCase *c, int rank, int *idx, float *xp) {
    uint64_t s = eh_seed(c->seed, rank);
    double w[c->E];
    for (int n = 0; n < c->N; n++) {
        double total = 0;
        for (int g = 0; g < c->E; g++) {
            int rot = (g + rank) % c->E;
            w[g] = c->skewed ? 1.0 / pow(1.0 + rot, 1.5) : 1.0;
            total += w[g];
        }
        for (int j = 0; j < c->k; j++) {
            double u = eh_unit(&s) * total;
            int g = 0;
            while (g < c->E - 1 && (u >= w[g] || w[g] == 0)) { u -= w[g]; g++; }
            while (w[g] == 0) g = (g + 1) % c->E; // rounding landed on a taken expert
            idx[(size_t)n * c->k + j] = g;
            total -= w[g];
            w[g] = 0;
        }
    }
    for (size_t i = 0; i < (size_t)c->N * c->k * c->C; i++) xp[i] = (float)(2 * eh_unit(&s) - 1);
}

static inline EpSymRank *eh_alloc(const EpSymCase *c) {
    EpSymRank *rk = calloc(c->P, sizeof *rk);
    size_t R = (size_t)c->N * c->k;
    for (int r = 0; r < c->P; r++) {
        EpSymRank *a = &rk[r];
        a->idx = calloc(R, sizeof(int));
        a->offsets = calloc(c->E + 1, sizeof(int));
        a->xp = calloc(R * c->C, sizeof(float));
        a->window = calloc((size_t)c->P * c->E, sizeof(int));
        a->plan = calloc(ep_sym_plan_ints(c->P, c->E), sizeof(int));
        a->recv = calloc((size_t)c->max_rows * c->C + 1, sizeof(float));
        a->y = calloc(R * c->C, sizeof(float));
        int *row_of = calloc(R, sizeof(int)), *token_of_row = calloc(R, sizeof(int));
        float *rows = calloc(R * c->C, sizeof(float));
        eh_route(c, r, a->idx, rows);
        // the rows in expert order, as permute_forward leaves them
        ops_cpu.moe_route_index(a->offsets, row_of, token_of_row, a->idx, c->N, c->E, c->k);
        for (size_t i = 0; i < R; i++) memcpy(a->xp + (size_t)row_of[i] * c->C, rows + i * c->C, c->C * sizeof(float));
        free(row_of); free(token_of_row); free(rows);
    }
    return rk;
}

static inline void eh_free(const EpSymCase *c, EpSymRank *rk) {
    for (int r = 0; r < c->P; r++) {
        EpSymRank *a = &rk[r];
        free(a->idx); free(a->offsets); free(a->xp); free(a->window); free(a->plan); free(a->recv); free(a->y);
    }
    free(rk);
}

// Counts, barrier, plans, dispatch on the CPU reference: after it, every
// rank's recv holds its kept rows and its plan the segments.
static inline void eh_dispatch_cpu(const EpSymCase *c, EpSymRank *rk) {
    int P = c->P, R = c->N * c->k;
    int *windows[P];
    void *recv[P];
    for (int q = 0; q < P; q++) { windows[q] = rk[q].window; recv[q] = rk[q].recv; }
    for (int r = 0; r < P; r++) ep_sym_cpu_write_counts(windows, rk[r].offsets, P, r, c->E);
    // barrier 1
    for (int r = 0; r < P; r++) {
        rk[r].dropped = 0;
        ep_sym_cpu_plan(rk[r].plan, &rk[r].dropped, rk[r].window, P, r, c->E, c->capacity, c->max_rows);
    }
    for (int r = 0; r < P; r++) ep_sym_cpu_dispatch(recv, rk[r].plan, rk[r].offsets, rk[r].xp, P, c->E, R, c->C);
    // barrier 2
}

// Combine on the CPU reference from out[q] (each owner's expert outputs).
static inline void eh_combine_cpu(const EpSymCase *c, EpSymRank *rk, float *const *out) {
    int P = c->P;
    void *o[P];
    for (int q = 0; q < P; q++) o[q] = out[q];
    // barrier 3
    for (int r = 0; r < P; r++) ep_sym_cpu_combine(rk[r].y, o, rk[r].plan, rk[r].offsets, P, c->E, c->N * c->k, c->C);
}
