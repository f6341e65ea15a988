// Tests for src/dist/pp_schedule: every kind over pp 1..8 and several
// micro-batch counts passes the validator; the unit-cost replay gives the
// theory's bubble (exactly where the theory is exact); interleaved and zb1
// beat 1f1b; 1f1b and gpipe hold the micro-batches they should; and the
// validator catches broken tables (swapped, missing, doubled actions, wrong
// sends), each with a message naming the problem.
#include <check.h>

#include "check_main.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/pp_schedule.h"

static const int PPS[] = {1, 2, 4, 8};

// m in {1, pp, 2pp, 4pp} without repeats (pp 1: 1, 2, 4)
static int micro_counts(int pp, int out[4]) {
    int cand[4] = {1, pp, 2 * pp, 4 * pp}, n = 0;
    for (int i = 0; i < 4; i++) {
        int seen = 0;
        for (int j = 0; j < n; j++) seen |= out[j] == cand[i];
        if (!seen) out[n++] = cand[i];
    }
    return n;
}

// Builds and validates with unit costs; fails the test with the message.
static PPSimResult build_and_run(PPScheduleKind kind, int pp, int m, int v, PPSchedule *keep) {
    PPSchedule s;
    PPSimResult r;
    char err[512];
    ck_assert_msg(pp_schedule_build(&s, kind, pp, m, v, err, sizeof err) == 0, "%s pp %d m %d v %d: build: %s",
                  pp_schedule_kind_name(kind), pp, m, v, err);
    ck_assert_msg(pp_schedule_validate(&s, pp_costs_unit(), &r, err, sizeof err) == 0,
                  "%s pp %d m %d v %d: validate: %s", pp_schedule_kind_name(kind), pp, m, v, err);
    if (keep)
        *keep = s;
    else
        pp_schedule_free(&s);
    return r;
}

static int count_actions(const PPSchedule *s, int rank) {
    int n = 0;
    for (int t = 0; t < s->n_slots; t++) n += pp_schedule_at(s, rank, t)->kind != PP_IDLE;
    return n;
}

START_TEST(test_every_kind_validates) {
    int checked = 0;
    for (size_t i = 0; i < sizeof PPS / sizeof *PPS; i++) {
        int pp = PPS[i], ms[4], nm = micro_counts(pp, ms);
        for (int j = 0; j < nm; j++) {
            int m = ms[j];
            for (int k = PP_GPIPE; k <= PP_ZB1; k++) {
                for (int v = 1; v <= 4; v *= 2) {
                    int valid = k == PP_INTERLEAVED ? v >= 2 && m % pp == 0 : v == 1;
                    if (!valid) continue;
                    PPSchedule s;
                    build_and_run((PPScheduleKind)k, pp, m, v, &s);
                    // every rank runs each of its (m, chunk) pairs' actions once
                    int per_rank = (k == PP_ZB1 ? 3 : 2) * m * v;
                    for (int p = 0; p < pp; p++) ck_assert_int_eq(count_actions(&s, p), per_rank);
                    pp_schedule_free(&s);
                    checked++;
                }
            }
        }
    }
    // 15 (pp, m) pairs (pp 1 has m 1, 2, 4) x (gpipe, 1f1b, zb1), and
    // interleaved with v 2 and 4 on the 12 pairs where pp divides m
    ck_assert_int_eq(checked, 3 * 15 + 2 * 12);
}
END_TEST

// With costs F 1, B 2 every rank computes 3m; the last rank's backward of
// the last micro-batch is the last to end on rank 0 after (m + pp - 1)(F + B),
// so makespan, rank 0's idle 3(pp-1) and the fraction (pp-1)/(m+pp-1) are
// exact (integers in doubles; the fraction to rounding of one division).
START_TEST(test_gpipe_1f1b_bubble_exact) {
    for (int k = PP_GPIPE; k <= PP_1F1B; k++)
        for (size_t i = 0; i < sizeof PPS / sizeof *PPS; i++) {
            int pp = PPS[i], ms[4], nm = micro_counts(pp, ms);
            for (int j = 0; j < nm; j++) {
                int m = ms[j];
                PPSimResult r = build_and_run((PPScheduleKind)k, pp, m, 1, NULL);
                ck_assert_msg(r.makespan == 3.0 * (m + pp - 1), "%s pp %d m %d: makespan %g, expected %d",
                              pp_schedule_kind_name(k), pp, m, r.makespan, 3 * (m + pp - 1));
                for (int p = 0; p < pp; p++) ck_assert(r.busy[p] == 3.0 * m);
                ck_assert(r.idle[0] == 3.0 * (pp - 1));
                ck_assert(r.idle[pp - 1] == 0);
                double theory = (double)(pp - 1) / (m + pp - 1);
                ck_assert_double_eq_tol(r.bubble_fraction, theory, 1e-12);
                ck_assert_double_eq_tol(pp_schedule_theory_bubble(k, pp, m, 1, pp_costs_unit()), theory, 1e-15);
            }
        }
}
END_TEST

// Other costs: the bubble fraction of 1f1b does not depend on B / F.
START_TEST(test_costs_configurable) {
    PPSchedule s;
    PPSimResult r;
    char err[256];
    ck_assert_int_eq(pp_schedule_build(&s, PP_1F1B, 4, 8, 1, err, sizeof err), 0);
    PPCosts c = {.f = 1, .b = 1, .bi = 1, .w = 1};
    ck_assert_int_eq(pp_schedule_validate(&s, c, &r, err, sizeof err), 0);
    ck_assert(r.makespan == 2.0 * (8 + 3));
    ck_assert_double_eq_tol(r.bubble_fraction, 3.0 / 11, 1e-12);
    pp_schedule_free(&s);
}
END_TEST

// Interleaving divides the bubble time (pp-1)(F+B) by v: with chunk costs
// 1/v and 2/v (powers of two, exact in binary) the replay hits it exactly.
START_TEST(test_interleaved_beats_1f1b) {
    for (size_t i = 1; i < sizeof PPS / sizeof *PPS; i++) {
        int pp = PPS[i];
        for (int m = pp; m <= 4 * pp; m *= 2) {
            PPSimResult base = build_and_run(PP_1F1B, pp, m, 1, NULL);
            for (int v = 2; v <= 4; v *= 2) {
                PPSimResult r = build_and_run(PP_INTERLEAVED, pp, m, v, NULL);
                ck_assert_msg(r.bubble_fraction < base.bubble_fraction,
                              "pp %d m %d v %d: interleaved bubble %g is not below 1f1b's %g", pp, m, v,
                              r.bubble_fraction, base.bubble_fraction);
                ck_assert_msg(r.makespan == 3.0 * m + 3.0 * (pp - 1) / v, "pp %d m %d v %d: makespan %g", pp, m, v,
                              r.makespan);
                ck_assert_double_eq_tol(r.bubble_fraction,
                                        pp_schedule_theory_bubble(PP_INTERLEAVED, pp, m, v, pp_costs_unit()), 1e-12);
            }
        }
    }
}
END_TEST

// ZB-H1 with F, Bi, W 1 each: bubble (pp-1)(F+Bi-W) = pp-1 for m >= pp
// (the paper's), below 1f1b's for every m when pp > 1; no rank holds more
// than pp micro-batches, 1f1b's peak.
START_TEST(test_zb1_beats_1f1b) {
    for (size_t i = 0; i < sizeof PPS / sizeof *PPS; i++) {
        int pp = PPS[i], ms[4], nm = micro_counts(pp, ms);
        for (int j = 0; j < nm; j++) {
            int m = ms[j];
            PPSimResult base = build_and_run(PP_1F1B, pp, m, 1, NULL);
            PPSimResult r = build_and_run(PP_ZB1, pp, m, 1, NULL);
            if (pp > 1)
                ck_assert_msg(r.bubble_fraction < base.bubble_fraction, "pp %d m %d: zb1 bubble %g, 1f1b %g", pp, m,
                              r.bubble_fraction, base.bubble_fraction);
            else
                ck_assert(r.bubble_fraction == 0 && base.bubble_fraction == 0);
            if (m >= pp) {
                ck_assert_msg(r.makespan == 3.0 * m + pp - 1, "pp %d m %d: zb1 makespan %g, expected %d", pp, m,
                              r.makespan, 3 * m + pp - 1);
                ck_assert_double_eq_tol(r.bubble_fraction, pp_schedule_theory_bubble(PP_ZB1, pp, m, 1, pp_costs_unit()),
                                        1e-12);
            }
            for (int p = 0; p < pp; p++) {
                ck_assert_int_le(r.peak_inflight[p], base.peak_inflight[0]);
                ck_assert_int_le(r.peak_inflight[p], pp);
            }
        }
    }
}
END_TEST

START_TEST(test_peak_inflight) {
    for (size_t i = 0; i < sizeof PPS / sizeof *PPS; i++) {
        int pp = PPS[i], ms[4], nm = micro_counts(pp, ms);
        for (int j = 0; j < nm; j++) {
            int m = ms[j];
            PPSimResult f1b1 = build_and_run(PP_1F1B, pp, m, 1, NULL);
            PPSimResult gpipe = build_and_run(PP_GPIPE, pp, m, 1, NULL);
            for (int p = 0; p < pp; p++) {
                int bound = pp - p < m ? pp - p : m;
                ck_assert_msg(f1b1.peak_inflight[p] == bound, "1f1b pp %d m %d rank %d holds %d, expected %d", pp, m, p,
                              f1b1.peak_inflight[p], bound);
                ck_assert_int_eq(gpipe.peak_inflight[p], m);
            }
        }
    }
}
END_TEST

START_TEST(test_sends_and_receives) {
    PPSchedule s;
    build_and_run(PP_INTERLEAVED, 4, 4, 2, &s);
    int seen = 0;
    for (int p = 0; p < 4; p++)
        for (int t = 0; t < s.n_slots; t++) {
            const PPAction *a = pp_schedule_at(&s, p, t);
            if (a->kind == PP_F && a->stage == 3) ck_assert(a->send_to == 0 && a->recv_from == 2), seen |= 1;
            if (a->kind == PP_B && a->stage == 4) ck_assert(a->send_to == 3 && a->recv_from == 1), seen |= 2;
            if (a->kind == PP_F && a->stage == 0) ck_assert(a->recv_from == -1 && a->send_to == 1), seen |= 4;
            if (a->kind == PP_B && a->stage == 7) ck_assert(a->recv_from == -1 && a->send_to == 2), seen |= 8;
        }
    ck_assert_int_eq(seen, 15);
    pp_schedule_free(&s);
}
END_TEST

static PPAction *find(const PPSchedule *s, int rank, PPActionKind kind, int mb) {
    for (int t = 0; t < s->n_slots; t++) {
        PPAction *a = pp_schedule_at(s, rank, t);
        if (a->kind == kind && a->mb == mb) return a;
    }
    ck_abort_msg("rank %d has no action kind %d for micro-batch %d", rank, kind, mb);
    return NULL;
}

// Over NCCL two ranks' messages meet in call order and a rank's calls run one
// after another. Issuing each send in the slot where its receiver takes it,
// grouped with that slot's receive, meets and completes for every kind; the
// eager order (send after the action, receive before it) deadlocks 1f1b at
// pp 2 (stage 0 sends micro-batch 1 while stage 1 sends micro-batch 0's
// grad), which is what the check is for.
START_TEST(test_p2p_call_order) {
    int checked = 0;
    char err[1024];
    for (size_t i = 0; i < sizeof PPS / sizeof *PPS; i++) {
        int pp = PPS[i], ms[4], nm = micro_counts(pp, ms);
        for (int j = 0; j < nm; j++)
            for (int k = PP_GPIPE; k <= PP_ZB1; k++)
                for (int v = 1; v <= 4; v *= 2) {
                    int m = ms[j];
                    if (k == PP_INTERLEAVED ? v < 2 || m % pp : v != 1) continue;
                    PPSchedule s;
                    build_and_run(k, pp, m, v, &s);
                    ck_assert_msg(pp_schedule_check_p2p(&s, PP_P2P_AT_RECEIVER, err, sizeof err) == 0,
                                  "%s pp %d m %d v %d: %s", pp_schedule_kind_name(k), pp, m, v, err);
                    // the receive slot of every send is later than the send's slot
                    for (int p = 0; p < pp; p++)
                        for (int t = 0; t < s.n_slots; t++) {
                            int u = pp_schedule_recv_slot(&s, p, t);
                            const PPAction *a = pp_schedule_at(&s, p, t);
                            ck_assert(a->kind != PP_IDLE && a->send_to >= 0 ? u > t : u == -1);
                        }
                    pp_schedule_free(&s);
                    checked++;
                }
    }
    ck_assert_int_ge(checked, 40);
    PPSchedule s;
    build_and_run(PP_1F1B, 2, 4, 1, &s);
    ck_assert(pp_schedule_check_p2p(&s, PP_P2P_EAGER, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "deadlock in call order: rank 0 waits in its call 1 (send to rank 1 (activation of "
                               "micro-batch 1 for stage 1)); rank 1 waits in its call 1 (send to rank 0 (grad of "
                               "micro-batch 0 for stage 0))"), "%s", err);
    pp_schedule_free(&s);
    // gpipe at pp 2 meets and completes even eagerly; with rank 1's first two
    // forwards swapped, call order pairs micro-batch 0's activation with the
    // receive meant for micro-batch 1
    build_and_run(PP_GPIPE, 2, 2, 1, &s);
    ck_assert_msg(pp_schedule_check_p2p(&s, PP_P2P_EAGER, err, sizeof err) == 0, "%s", err);
    PPAction *f0 = find(&s, 1, PP_F, 0), *f1 = find(&s, 1, PP_F, 1), tmp = *f0;
    *f0 = *f1, *f1 = tmp;
    ck_assert(pp_schedule_check_p2p(&s, PP_P2P_EAGER, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "in call order rank 0's send to rank 1 (activation of micro-batch 0 for stage 1) "
                              "meets rank 1's receive from rank 0 (activation of micro-batch 1 for stage 1)"), "%s", err);
    pp_schedule_free(&s);
}
END_TEST

static void expect_invalid(const PPSchedule *s, const char *what) {
    char err[512] = "";
    ck_assert_msg(pp_schedule_validate(s, pp_costs_unit(), NULL, err, sizeof err) != 0, "validator passed a table "
                  "that should fail with '%s'", what);
    ck_assert_msg(strstr(err, what), "message '%s' does not say '%s'", err, what);
}

static void expect_valid(const PPSchedule *s) {
    char err[512];
    ck_assert_msg(pp_schedule_validate(s, pp_costs_unit(), NULL, err, sizeof err) == 0, "restored table: %s", err);
}

// The mutation checks: break a valid table one way at a time, see the
// validator fail with the right message, restore it and see it pass.
START_TEST(test_validator_catches_broken_tables) {
    PPSchedule s;
    build_and_run(PP_1F1B, 4, 8, 1, &s);
    // swap rank 0's F0 and B0: the backward before its forward
    PPAction *f = find(&s, 0, PP_F, 0), *b = find(&s, 0, PP_B, 0), tmp = *f;
    *f = *b, *b = tmp;
    expect_invalid(&s, "rank 0 slot 0: B0 needs F0 of stage 0 (rank 0) first");
    tmp = *f, *f = *b, *b = tmp;
    expect_valid(&s);
    // swap rank 1's F3 with the idle slot before rank 0 has sent it: F3 too early
    PPAction *f3 = find(&s, 1, PP_F, 3), *early = pp_schedule_at(&s, 1, 0);
    tmp = *f3, *f3 = *early, *early = tmp;
    expect_invalid(&s, "rank 1 slot 0: F3 needs F3 of stage 0 (rank 0) first");
    tmp = *f3, *f3 = *early, *early = tmp;
    expect_valid(&s);
    // a missing backward
    PPAction *b7 = find(&s, 2, PP_B, 7), saved = *b7;
    b7->kind = PP_IDLE;
    expect_invalid(&s, "micro-batch 7 is never backwarded on stage 2");
    *b7 = saved;
    expect_valid(&s);
    // a forward run twice (in an idle slot at the end of rank 3)
    PPAction *last = pp_schedule_at(&s, 3, s.n_slots - 1);
    ck_assert_int_eq(last->kind, PP_IDLE);
    *last = *find(&s, 3, PP_F, 5);
    expect_invalid(&s, "F5 of stage 3 runs a second time");
    last->kind = PP_IDLE;
    expect_valid(&s);
    // a wrong destination, and an action on a rank that does not hold its stage
    PPAction *f2 = find(&s, 1, PP_F, 2);
    f2->send_to = 3;
    expect_invalid(&s, "must receive from 0 and send to 2");
    f2->send_to = 2;
    f2->stage = 2;
    expect_invalid(&s, "names stage 2, but chunk 0 of rank 1 is stage 1");
    f2->stage = 1;
    expect_valid(&s);
    pp_schedule_free(&s);

    // zb1: a Bi without its W; a W before its Bi
    build_and_run(PP_ZB1, 4, 8, 1, &s);
    PPAction *w = find(&s, 0, PP_W, 3);
    saved = *w;
    w->kind = PP_IDLE;
    expect_invalid(&s, "Bi without its W");
    *w = saved;
    PPAction *bi = find(&s, 0, PP_BI, 3);
    tmp = *w, *w = *bi, *bi = tmp;
    expect_invalid(&s, "W3 needs Bi3 of stage 0 (rank 0) first");
    tmp = *w, *w = *bi, *bi = tmp;
    expect_valid(&s);
    pp_schedule_free(&s);
}
END_TEST

START_TEST(test_refusals) {
    PPSchedule s;
    char err[512];
    ck_assert_int_ne(pp_schedule_build(&s, PP_INTERLEAVED, 4, 6, 2, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "6 micro-batches is not a multiple of pp 4"), "%s", err);
    ck_assert_int_ne(pp_schedule_build(&s, PP_INTERLEAVED, 4, 8, 1, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "pp_virtual 1"), "%s", err);
    ck_assert_int_ne(pp_schedule_build(&s, PP_1F1B, 4, 8, 2, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "only interleaved has several chunks"), "%s", err);
    ck_assert_int_ne(pp_schedule_build(&s, PP_GPIPE, 0, 8, 1, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "pp 0 is outside"), "%s", err);
    ck_assert_int_ne(pp_schedule_build(&s, PP_ZB1, 2, 0, 1, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "0 micro-batches"), "%s", err);
    PPScheduleKind k;
    ck_assert_int_ne(pp_schedule_kind_parse("zb2", &k, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "unknown pipeline schedule 'zb2'"), "%s", err);
    const char *names[] = {"gpipe", "1f1b", "interleaved", "zb1"};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(pp_schedule_kind_parse(names[i], &k, err, sizeof err), 0);
        ck_assert_int_eq(k, i);
        ck_assert_str_eq(pp_schedule_kind_name(k), names[i]);
    }
}
END_TEST

static char *printed(PPScheduleKind kind, int pp, int m, int v) {
    PPSchedule s;
    build_and_run(kind, pp, m, v, &s);
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    pp_schedule_print(f, &s);
    fclose(f);
    pp_schedule_free(&s);
    return buf;
}

START_TEST(test_print) {
    char *g = printed(PP_1F1B, 2, 2, 1);
    // rank 0: F0 F1 . B0 . B1 ; rank 1: . F0 B0 F1 B1 .
    ck_assert_msg(strstr(g, "rank 0   F0 F1 .  B0 .  B1\n"), "%s", g);
    ck_assert_msg(strstr(g, "rank 1   .  F0 B0 F1 B1 . \n"), "%s", g);
    ck_assert_msg(strstr(g, "1f1b schedule: pp 2, 2 micro-batches, 1 chunk per rank, 6 slots"), "%s", g);
    free(g);
    g = printed(PP_ZB1, 2, 2, 1);
    ck_assert_msg(strstr(g, "rank 0   F0  F1  .   Bi0 W0  Bi1 W1 \n"), "%s", g);
    ck_assert_msg(strstr(g, "rank 1   .   F0  Bi0 F1  Bi1 W0  W1 \n"), "%s", g);
    free(g);
    g = printed(PP_INTERLEAVED, 2, 2, 2);
    ck_assert_msg(strstr(g, "rank 0   F0c0 F1c0 F0c1 F1c1"), "%s", g);
    free(g);
}
END_TEST

int main(void) {
    Suite *s = suite_create("pp_schedule");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_every_kind_validates);
    tcase_add_test(tc, test_gpipe_1f1b_bubble_exact);
    tcase_add_test(tc, test_costs_configurable);
    tcase_add_test(tc, test_interleaved_beats_1f1b);
    tcase_add_test(tc, test_zb1_beats_1f1b);
    tcase_add_test(tc, test_peak_inflight);
    tcase_add_test(tc, test_sends_and_receives);
    tcase_add_test(tc, test_validator_catches_broken_tables);
    tcase_add_test(tc, test_p2p_call_order);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_print);
    suite_add_tcase(s, tc);
    return check_run(s);
}
