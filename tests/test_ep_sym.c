// The symmetric expert-parallel ops (ops/ep_sym.h) on the CPU reference,
// with P = 2, 4, 8 virtual ranks (tests/ep_sym_harness.h), uniform and
// skewed (learned-like) routing, against references computed here row by
// row from ep.h's documented order (local expert, then source rank, then the
// source's order) — the order ep.c's all-to-all path regroups into:
//  1. each owner's receive buffer holds exactly those rows, bit-identical,
//     with those segments; the capacity tail and the dropped counts equal an
//     independent walk that keeps a row while its expert has room;
//  2. combine returns every kept row to its source position and zeros the
//     dropped ones, bit-identical (identity experts);
//  3. through real grouped matmuls forward and backward (dispatch of the
//     output grads, combine of the input grads) the sources' rows and the
//     owners' weight grads equal a direct per-row computation;
//  4. dropless with a receive buffer too small for the skewed rows drops the
//     tail of the largest experts and counts it, and never writes past the
//     buffer;
//  5. against src/dist/ep.c itself: tests/tool_ep_a2a runs the a2a path over
//     MPI (mpirun -np P) on the same per-rank inputs; each owner's segments
//     hold the same rows bit for bit (ours the kept prefix of each), the
//     dropped counts and the combined rows are equal.
#include <check.h>

#include "check_main.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ep_sym_harness.h"

// The independent reference for owner q: the rows its receive buffer must
// hold (want [rows][C]), its segments want_off[El+1], the rows its experts
// drop, and kept[s][j] = whether row j of source s is kept (for q's experts).
static long reference(const EpSymCase *c, EpSymRank *rk, int q, float *want, int *want_off, char **kept) {
    int P = c->P, El = c->E / P, C = c->C;
    int room[El];
    long total = 0, n_all = 0;
    for (int e = 0; e < El; e++) {
        int g = q * El + e, n = 0;
        for (int s = 0; s < P; s++) n += rk[s].offsets[g + 1] - rk[s].offsets[g];
        room[e] = c->capacity > 0 && n > c->capacity ? c->capacity : n;
        total += room[e];
        n_all += n;
    }
    if (total > c->max_rows) { // the largest per-expert limit whose rows fit, by linear search
        int lim = 0;
        for (int e = 0; e < El; e++) lim = room[e] > lim ? room[e] : lim;
        for (;; lim--) {
            long s = 0;
            for (int e = 0; e < El; e++) s += room[e] < lim ? room[e] : lim;
            if (s <= c->max_rows) break;
        }
        for (int e = 0; e < El; e++) room[e] = room[e] < lim ? room[e] : lim;
    }
    int row = 0;
    for (int e = 0; e < El; e++) {
        int g = q * El + e, taken = 0;
        want_off[e] = row;
        for (int s = 0; s < P; s++)
            for (int j = rk[s].offsets[g]; j < rk[s].offsets[g + 1]; j++) {
                kept[s][j] = taken < room[e];
                if (!kept[s][j]) continue;
                memcpy(want + (size_t)row * C, rk[s].xp + (size_t)j * C, C * sizeof(float));
                row++;
                taken++;
            }
    }
    want_off[El] = row;
    return n_all - row;
}

static int capacity_of(double cf, int N, int P, int k, int E) { return cf > 0 ? (int)ceil(cf * N * P * k / E) : 0; }

// 1 and 2 for one case; returns the rows dropped over all owners.
static long check_dispatch_combine(const EpSymCase *c) {
    int P = c->P, El = c->E / P, C = c->C, R = c->N * c->k;
    EpSymRank *rk = eh_alloc(c);
    for (int q = 0; q < P; q++) rk[q].recv[(size_t)c->max_rows * C] = 12345.f; // past the buffer
    eh_dispatch_cpu(c, rk);
    char *kept[P];
    for (int s = 0; s < P; s++) kept[s] = calloc(R, 1);
    float *want = calloc((size_t)c->max_rows * C + (size_t)R * P * C, sizeof(float));
    int want_off[El + 1];
    long dropped_all = 0;
    for (int q = 0; q < P; q++) {
        long dropped = reference(c, rk, q, want, want_off, kept);
        const int *off = ep_sym_recv_offsets(rk[q].plan, c->E);
        for (int e = 0; e <= El; e++)
            ck_assert_msg(off[e] == want_off[e], "P %d cap %d rows %d: owner %d segment %d starts at %d, expected %d",
                          P, c->capacity, c->max_rows, q, e, off[e], want_off[e]);
        ck_assert_int_le(off[El], c->max_rows);
        ck_assert_msg(!memcmp(rk[q].recv, want, (size_t)off[El] * C * sizeof(float)),
                      "P %d: owner %d's received rows differ from ep.h's order", P, q);
        ck_assert_msg(rk[q].dropped == (float)dropped, "P %d cap %d: owner %d dropped %g, recount %ld", P,
                      c->capacity, q, rk[q].dropped, dropped);
        ck_assert_msg(rk[q].recv[(size_t)c->max_rows * C] == 12345.f, "owner %d: written past its buffer", q);
        dropped_all += dropped;
    }
    // identity experts: out = recv; every source gets its kept rows back, zeros for the rest
    float *out[P];
    for (int q = 0; q < P; q++) {
        out[q] = rk[q].recv;
        for (int j = 0; j < R; j++) rk[q].y[(size_t)j * C] = NAN; // poisoned: every row must be written
    }
    eh_combine_cpu(c, rk, out);
    float *zero = calloc(C, sizeof(float));
    for (int s = 0; s < P; s++)
        for (int j = 0; j < R; j++) {
            const float *got = rk[s].y + (size_t)j * C, *exp = kept[s][j] ? rk[s].xp + (size_t)j * C : zero;
            ck_assert_msg(!memcmp(got, exp, C * sizeof(float)), "P %d: source %d row %d (%s) not combined back", P,
                          s, j, kept[s][j] ? "kept" : "dropped");
        }
    for (int s = 0; s < P; s++) free(kept[s]);
    free(zero);
    free(want);
    eh_free(c, rk);
    return dropped_all;
}

START_TEST(test_dispatch_combine_vs_a2a_order) {
    int Ps[] = {2, 4, 8};
    for (int pi = 0; pi < 3; pi++)
        for (int skewed = 0; skewed <= 1; skewed++)
            for (int ci = 0; ci < 3; ci++) {
                double cf[] = {0, 1.0, 0.5};
                EpSymCase c = {Ps[pi], 24, 2, 16, 8, 0, 0, skewed, 100 + pi * 10 + skewed * 3 + ci};
                c.capacity = capacity_of(cf[ci], c.N, c.P, c.k, c.E);
                c.max_rows = c.N * c.k * c.P; // every row fits: capacity alone cuts
                long dropped = check_dispatch_combine(&c);
                if (cf[ci] == 0) ck_assert_int_eq(dropped, 0);
                if (cf[ci] == 0.5) ck_assert_msg(dropped > 0, "P %d cf 0.5: nothing dropped, the case tests nothing", c.P);
            }
}
END_TEST

START_TEST(test_dropless_bounded_by_the_buffer) {
    int Ps[] = {2, 4, 8};
    for (int pi = 0; pi < 3; pi++) {
        // skewed rows: the first owners get far more than the mean; the buffer holds 1.2 x the mean
        EpSymCase c = {Ps[pi], 32, 4, 16, 8, 0, 0, 1, 7 + pi};
        c.max_rows = (int)(1.2 * c.N * c.k);
        long dropped = check_dispatch_combine(&c);
        ck_assert_msg(dropped > 0, "P %d: the buffer held every row, the case tests nothing", c.P);
        // with a capacity as well: both cuts, in that order
        c.capacity = capacity_of(1.5, c.N, c.P, c.k, c.E);
        check_dispatch_combine(&c);
    }
}
END_TEST

// 3: W[g] is [C][C]; the owners run grouped matmuls on their segments.
START_TEST(test_grouped_matmul_forward_backward) {
    int Ps[] = {2, 4, 8};
    for (int pi = 0; pi < 3; pi++) {
        EpSymCase c = {Ps[pi], 16, 2, 16, 8, 0, 0, 1, 55 + pi};
        c.capacity = capacity_of(0.75, c.N, c.P, c.k, c.E);
        c.max_rows = c.N * c.k * c.P;
        int P = c.P, E = c.E, El = E / P, C = c.C, R = c.N * c.k;
        EpSymRank *rk = eh_alloc(&c);
        eh_dispatch_cpu(&c, rk);
        uint64_t s = 99;
        float *W = calloc((size_t)E * C * C, sizeof(float));
        for (size_t i = 0; i < (size_t)E * C * C; i++) W[i] = (float)(eh_unit(&s) - 0.5);
        float *out[P], *dout[P], *dinp[P], *dW[P], *dy[P], *dx[P];
        for (int q = 0; q < P; q++) {
            out[q] = calloc((size_t)c.max_rows * C, sizeof(float));
            dout[q] = calloc((size_t)c.max_rows * C, sizeof(float));
            dinp[q] = calloc((size_t)c.max_rows * C, sizeof(float));
            dW[q] = calloc((size_t)El * C * C, sizeof(float));
            dy[q] = calloc((size_t)R * C, sizeof(float));
            dx[q] = calloc((size_t)R * C, sizeof(float));
            for (size_t i = 0; i < (size_t)R * C; i++) dy[q][i] = (float)(eh_unit(&s) - 0.5);
            const int *off = ep_sym_recv_offsets(rk[q].plan, E);
            ops_cpu.grouped_matmul_forward(out[q], rk[q].recv, W + (size_t)q * El * C * C, off, El, C, C);
        }
        eh_combine_cpu(&c, rk, out);
        // backward: the output grads go out with the same plan, the input grads come back
        void *dtab[P];
        for (int q = 0; q < P; q++) dtab[q] = dout[q];
        for (int r = 0; r < P; r++) ep_sym_cpu_dispatch(dtab, rk[r].plan, rk[r].offsets, dy[r], P, E, R, C);
        for (int q = 0; q < P; q++) {
            const int *off = ep_sym_recv_offsets(rk[q].plan, E);
            ops_cpu.grouped_matmul_backward(dinp[q], dW[q], dout[q], rk[q].recv, W + (size_t)q * El * C * C, off, El,
                                            C, C, 0);
        }
        void *itab[P];
        for (int q = 0; q < P; q++) itab[q] = dinp[q];
        for (int r = 0; r < P; r++) ep_sym_cpu_combine(dx[r], itab, rk[r].plan, rk[r].offsets, P, E, R, C);
        // direct: per source row, its expert's W; the rows kept are the first
        // `capacity` of each expert in source order
        double *dW_ref = calloc((size_t)E * C * C, sizeof(double));
        double err = 0, ref = 0, gerr = 0, gref = 0;
        for (int g = 0; g < E; g++) {
            int taken = 0;
            const float *w = W + (size_t)g * C * C;
            for (int r = 0; r < P; r++)
                for (int j = rk[r].offsets[g]; j < rk[r].offsets[g + 1]; j++, taken++) {
                    int keep = taken < c.capacity;
                    const float *x = rk[r].xp + (size_t)j * C, *d = dy[r] + (size_t)j * C;
                    for (int o = 0; o < C; o++) {
                        double yo = 0, dxo = 0;
                        for (int i = 0; i < C; i++) {
                            yo += (double)w[(size_t)o * C + i] * x[i];
                            dxo += (double)d[i] * w[(size_t)i * C + o];
                            if (keep) dW_ref[((size_t)g * C + o) * C + i] += (double)d[o] * x[i];
                        }
                        if (!keep) yo = dxo = 0;
                        double gy = rk[r].y[(size_t)j * C + o], gx = dx[r][(size_t)j * C + o];
                        ck_assert_msg(keep || (gy == 0 && gx == 0), "a dropped row came back nonzero");
                        err += (gy - yo) * (gy - yo) + (gx - dxo) * (gx - dxo);
                        ref += yo * yo + dxo * dxo;
                    }
                }
        }
        for (int g = 0; g < E; g++)
            for (size_t i = 0; i < (size_t)C * C; i++) {
                double got = dW[g / El][(size_t)(g % El) * C * C + i], want = dW_ref[(size_t)g * C * C + i];
                gerr += (got - want) * (got - want);
                gref += want * want;
            }
        ck_assert_msg(ref > 0 && sqrt(err / ref) < 1e-5, "P %d: rows rel. error %g", P, sqrt(err / ref));
        ck_assert_msg(gref > 0 && sqrt(gerr / gref) < 1e-5, "P %d: weight grads rel. error %g", P, sqrt(gerr / gref));
        for (int q = 0; q < P; q++) {
            free(out[q]); free(dout[q]); free(dinp[q]); free(dW[q]); free(dy[q]); free(dx[q]);
        }
        free(dW_ref);
        free(W);
        eh_free(&c, rk);
    }
}
END_TEST

// 5: one case of tool_ep_a2a under mpirun against the harness.
static void check_against_ep_c(int P, int skewed, double cf, uint64_t seed, const char *dir) {
    EpSymCase c = {P, 20, 2, 16, 8, 0, 0, skewed, seed};
    c.capacity = capacity_of(cf, c.N, c.P, c.k, c.E);
    c.max_rows = c.N * c.k * c.P;
    int El = c.E / P, C = c.C, R = c.N * c.k;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 "
             "OMPI_MCA_btl_vader_single_copy_mechanism=none timeout 120 mpirun --oversubscribe -np %d "
             "build/tests/tool_ep_a2a %d %d %d %d %d %d %llu %s > %s/log 2>&1",
             P, c.N, c.k, c.E, C, c.capacity, skewed, (unsigned long long)seed, dir, dir);
    ck_assert_msg(system(cmd) == 0, "%s failed (see %s/log)", cmd, dir);
    EpSymRank *rk = eh_alloc(&c);
    eh_dispatch_cpu(&c, rk);
    float *out[P];
    for (int q = 0; q < P; q++) out[q] = rk[q].recv;
    eh_combine_cpu(&c, rk, out);
    long dropped_all = 0;
    for (int q = 0; q < P; q++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%d.bin", dir, q);
        FILE *f = fopen(path, "rb");
        ck_assert_msg(f != NULL, "no %s", path);
        int rows, lo[El + 1];
        float dropped;
        ck_assert(fread(&rows, sizeof(int), 1, f) == 1 && fread(lo, sizeof(int), El + 1, f) == (size_t)El + 1 &&
                  fread(&dropped, sizeof(float), 1, f) == 1);
        float *xl = calloc((size_t)rows * C + 1, sizeof(float)), *y = calloc((size_t)R * C, sizeof(float));
        ck_assert(fread(xl, sizeof(float), (size_t)rows * C, f) == (size_t)rows * C &&
                  fread(y, sizeof(float), (size_t)R * C, f) == (size_t)R * C);
        fclose(f);
        const int *ro = ep_sym_recv_offsets(rk[q].plan, c.E);
        long lost = 0;
        for (int e = 0; e < El; e++) {
            int kept = ro[e + 1] - ro[e], all = lo[e + 1] - lo[e];
            ck_assert_msg(kept <= all && (c.capacity > 0 || kept == all), "P %d owner %d expert %d: %d rows, ep.c %d",
                          P, q, e, kept, all);
            ck_assert_msg(!memcmp(rk[q].recv + (size_t)ro[e] * C, xl + (size_t)lo[e] * C, (size_t)kept * C * sizeof(float)),
                          "P %d owner %d expert %d: rows differ from ep.c's", P, q, e);
            lost += all - kept;
        }
        ck_assert_msg(rk[q].dropped == dropped && lost == (long)dropped, "P %d owner %d: dropped %g, ep.c %g (%ld)", P,
                      q, rk[q].dropped, dropped, lost);
        ck_assert_msg(!memcmp(rk[q].y, y, (size_t)R * C * sizeof(float)), "P %d rank %d: combined rows differ from ep.c's",
                      P, q);
        dropped_all += lost;
        free(xl);
        free(y);
    }
    if (cf > 0) ck_assert_msg(dropped_all > 0, "P %d cf %g: nothing dropped, the case tests nothing", P, cf);
    eh_free(&c, rk);
}

START_TEST(test_against_ep_c_over_mpi) {
    char dir[] = "/tmp/test_ep_sym.XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    int Ps[] = {2, 4, 8};
    for (int pi = 0; pi < 3; pi++) {
        check_against_ep_c(Ps[pi], 0, 0, 300 + pi, dir);
        check_against_ep_c(Ps[pi], 1, 0.5, 400 + pi, dir);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert(system(cmd) == 0);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ep_sym");
    TCase *tc = tcase_create("virtual ranks");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_dispatch_combine_vs_a2a_order);
    tcase_add_test(tc, test_dropless_bounded_by_the_buffer);
    tcase_add_test(tc, test_grouped_matmul_forward_backward);
    tcase_add_test(tc, test_against_ep_c_over_mpi);
    suite_add_tcase(s, tc);
    return check_run(s);
}
