// Pipeline schedules: per-rank action orders for each kind, laid out in
// lock-step slots, a validator that replays them with costs, and a printer.
//
// Each kind is written as the order in which one rank runs its actions (the
// way Megatron-Core and torch.distributed.pipelining describe them); a single
// placement pass then puts every action in the earliest slot after its rank's
// previous action and after everything it depends on. The validator trusts
// none of this: it checks the finished table from scratch.
#include "dist/pp_schedule.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static const char *kind_names[] = {"gpipe", "1f1b", "interleaved", "zb1"};

const char *pp_schedule_kind_name(PPScheduleKind kind) { return kind_names[kind]; }

int pp_schedule_kind_parse(const char *name, PPScheduleKind *kind, char *err, size_t errlen) {
    for (int k = 0; k < 4; k++)
        if (!strcmp(name, kind_names[k])) {
            *kind = (PPScheduleKind)k;
            return 0;
        }
    return fail(err, errlen, "unknown pipeline schedule '%s' (expected gpipe, 1f1b, interleaved or zb1)", name);
}

PPCosts pp_costs_unit(void) { return (PPCosts){.f = 1, .b = 2, .bi = 1, .w = 1}; }

// ---------------------------------------------------------------------------
// dependencies, shared by the placement and the validator

enum { DEP_F, DEP_BWD };  // a forward; a backward's input grad (B or Bi)

typedef struct {
    int what, stage;
} Dep;

// What action (kind, stage) of the same micro-batch needs done first.
static int deps_of(PPActionKind kind, int stage, int n_stages, Dep out[2]) {
    int n = 0;
    if (kind == PP_F && stage > 0) out[n++] = (Dep){DEP_F, stage - 1};
    if (kind == PP_B || kind == PP_BI) {
        out[n++] = (Dep){DEP_F, stage};
        if (stage < n_stages - 1) out[n++] = (Dep){DEP_BWD, stage + 1};
    }
    if (kind == PP_W) out[n++] = (Dep){DEP_BWD, stage};
    return n;
}

static void comm_of(PPActionKind kind, int stage, int pp, int n_stages, int *recv_from, int *send_to) {
    int prev = stage > 0 ? (stage - 1) % pp : -1, next = stage < n_stages - 1 ? (stage + 1) % pp : -1;
    *recv_from = *send_to = -1;
    if (kind == PP_F) *recv_from = prev, *send_to = next;
    if (kind == PP_B || kind == PP_BI) *recv_from = next, *send_to = prev;
}

static const char *label(const PPAction *a, int virt, char *buf, size_t n) {
    static const char *k[] = {".", "F", "B", "Bi", "W"};
    if (a->kind == PP_IDLE) snprintf(buf, n, ".");
    else if (virt == 1) snprintf(buf, n, "%s%d", k[a->kind], a->mb);
    else snprintf(buf, n, "%s%dc%d", k[a->kind], a->mb, a->chunk);
    return buf;
}

// ---------------------------------------------------------------------------
// per-rank orders

typedef struct {
    PPAction *a;
    int n;
} Order;

static void push(Order *o, PPActionKind kind, int mb, int chunk) {
    o->a[o->n++] = (PPAction){.kind = kind, .mb = mb, .chunk = chunk};
}

static int imin(int a, int b) { return a < b ? a : b; }

// All forwards, then all backwards (GPipe).
static void order_gpipe(Order *o, int m) {
    for (int i = 0; i < m; i++) push(o, PP_F, i, 0);
    for (int i = 0; i < m; i++) push(o, PP_B, i, 0);
}

// 1F1B: pp-1-p forwards to fill the pipe, then one forward and one backward
// in turn, then the backwards left. At most pp - p micro-batches in flight.
static void order_1f1b(Order *o, int pp, int m, int p) {
    int warm = imin(pp - 1 - p, m);
    for (int i = 0; i < warm; i++) push(o, PP_F, i, 0);
    for (int i = 0; i < m - warm; i++) push(o, PP_F, warm + i, 0), push(o, PP_B, i, 0);
    for (int i = m - warm; i < m; i++) push(o, PP_B, i, 0);
}

// ZB-H1: 1F1B's forwards and input-grad backwards, with rank p running each
// weight-grad W p micro-batches late. The late W's fill the cool-down bubble
// (the last rank sends its first input grads back sooner), and each rank
// holds at most pp micro-batches, rank 0's peak under 1F1B.
static void order_zb1(Order *o, int pp, int m, int p) {
    int warm = imin(pp - 1 - p, m), w_done = 0;
    for (int i = 0; i < warm; i++) push(o, PP_F, i, 0);
    for (int i = 0; i < m - warm; i++) {
        push(o, PP_F, warm + i, 0);
        push(o, PP_BI, i, 0);
        if (i >= p) push(o, PP_W, w_done++, 0);
    }
    for (int i = m - warm; i < m; i++) {
        push(o, PP_BI, i, 0);
        push(o, PP_W, w_done++, 0);
    }
    while (w_done < m) push(o, PP_W, w_done++, 0);
}

// Interleaved 1F1B (Megatron-Core): micro-batches go in groups of pp; a rank
// runs a group through chunk 0, then chunk 1, ..., then the next group, and
// its backwards the same way from the last chunk down. The warm-up is
// 2(pp-1-p) + (v-1)pp forwards, then 1F1B pairs, then the backwards left.
static void order_interleaved(Order *o, int pp, int m, int v, int p) {
    int total = m * v, group = pp * v;
    int warm = imin(2 * (pp - 1 - p) + (v - 1) * pp, total);
#define NTH_MB(k) ((k) / group * pp + (k) % pp)
#define NTH_CHUNK(k) ((k) % group / pp)
    for (int k = 0; k < warm; k++) push(o, PP_F, NTH_MB(k), NTH_CHUNK(k));
    for (int k = 0; k < total - warm; k++) {
        int f = warm + k;
        push(o, PP_F, NTH_MB(f), NTH_CHUNK(f));
        push(o, PP_B, NTH_MB(k), v - 1 - NTH_CHUNK(k));
    }
    for (int k = total - warm; k < total; k++) push(o, PP_B, NTH_MB(k), v - 1 - NTH_CHUNK(k));
#undef NTH_MB
#undef NTH_CHUNK
}

// ---------------------------------------------------------------------------
// build: orders, then lock-step placement

int pp_schedule_build(PPSchedule *s, PPScheduleKind kind, int pp, int micro, int virt, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    if ((unsigned)kind > PP_ZB1) return fail(err, errlen, "pipeline schedule kind %d is not one of the four", kind);
    const char *name = kind_names[kind];
    if (pp < 1 || pp > PP_MAX_RANKS)
        return fail(err, errlen, "%s schedule: pp %d is outside 1..%d", name, pp, PP_MAX_RANKS);
    if (micro < 1) return fail(err, errlen, "%s schedule: %d micro-batches (need at least 1)", name, micro);
    if (kind == PP_INTERLEAVED) {
        if (virt < 2)
            return fail(err, errlen,
                        "interleaved schedule: pp_virtual %d, need at least 2 chunks per rank (with 1 it is 1f1b)",
                        virt);
        if (micro % pp)
            return fail(err, errlen,
                        "interleaved schedule: %d micro-batches is not a multiple of pp %d (Megatron's "
                        "interleaving runs micro-batches in groups of pp)",
                        micro, pp);
    } else if (virt != 1) {
        return fail(err, errlen, "%s schedule: pp_virtual %d, but only interleaved has several chunks per rank",
                    name, virt);
    }
    int n_stages = pp * virt, per_rank = (kind == PP_ZB1 ? 3 : 2) * micro * virt;
    Order *orders = calloc(pp, sizeof *orders);
    PPAction *all = calloc((size_t)pp * per_rank, sizeof *all);
    // slot of each placed forward / input-grad backward, by [stage][mb]; -1 not yet
    int *done[2] = {malloc(sizeof(int) * n_stages * micro), malloc(sizeof(int) * n_stages * micro)};
    int *slot = malloc(sizeof(int) * pp * per_rank);
    if (!orders || !all || !done[0] || !done[1] || !slot) {
        free(orders), free(all), free(done[0]), free(done[1]), free(slot);
        return fail(err, errlen, "%s schedule: out of memory", name);
    }
    for (int p = 0; p < pp; p++) {
        orders[p].a = all + (size_t)p * per_rank;
        if (kind == PP_GPIPE) order_gpipe(&orders[p], micro);
        if (kind == PP_1F1B) order_1f1b(&orders[p], pp, micro, p);
        if (kind == PP_ZB1) order_zb1(&orders[p], pp, micro, p);
        if (kind == PP_INTERLEAVED) order_interleaved(&orders[p], pp, micro, virt, p);
        for (int i = 0; i < orders[p].n; i++) {
            PPAction *a = &orders[p].a[i];
            a->stage = a->chunk * pp + p;
            comm_of(a->kind, a->stage, pp, n_stages, &a->recv_from, &a->send_to);
        }
    }
    for (int i = 0; i < n_stages * micro; i++) done[0][i] = done[1][i] = -1;
    // Each rank takes its next action as soon as what it needs is placed; an
    // order whose dependencies never come is a bug in the order above.
    int pos[PP_MAX_RANKS] = {0}, next_free[PP_MAX_RANKS] = {0}, placed = 0, n_slots = 0;
    while (placed < pp * per_rank) {
        int progress = 0;
        for (int p = 0; p < pp; p++) {
            for (; pos[p] < orders[p].n; pos[p]++) {
                PPAction *a = &orders[p].a[pos[p]];
                Dep d[2];
                int nd = deps_of(a->kind, a->stage, n_stages, d), t = next_free[p], ready = 1;
                for (int j = 0; j < nd; j++) {
                    int u = done[d[j].what][d[j].stage * micro + a->mb];
                    if (u < 0) ready = 0;
                    if (u + 1 > t) t = u + 1;
                }
                if (!ready) break;
                slot[p * per_rank + pos[p]] = t;
                if (a->kind == PP_F) done[DEP_F][a->stage * micro + a->mb] = t;
                if (a->kind == PP_B || a->kind == PP_BI) done[DEP_BWD][a->stage * micro + a->mb] = t;
                next_free[p] = t + 1;
                if (t + 1 > n_slots) n_slots = t + 1;
                placed++, progress = 1;
            }
        }
        if (!progress) {
            int p = 0;
            while (pos[p] >= orders[p].n) p++;
            char l[32];
            fail(err, errlen, "%s schedule (pp %d, %d micro-batches, %d chunks): rank %d's order waits forever at "
                 "its action %d, %s", name, pp, micro, virt, p, pos[p], label(&orders[p].a[pos[p]], virt, l, sizeof l));
            free(orders), free(all), free(done[0]), free(done[1]), free(slot);
            return -1;
        }
    }
    *s = (PPSchedule){.kind = kind, .pp = pp, .micro = micro, .virt = virt, .n_slots = n_slots,
                      .table = calloc((size_t)pp * n_slots, sizeof(PPAction))};
    if (!s->table) {
        free(orders), free(all), free(done[0]), free(done[1]), free(slot);
        return fail(err, errlen, "%s schedule: out of memory", name);
    }
    for (int p = 0; p < pp; p++)
        for (int i = 0; i < orders[p].n; i++) *pp_schedule_at(s, p, slot[p * per_rank + i]) = orders[p].a[i];
    free(orders), free(all), free(done[0]), free(done[1]), free(slot);
    return 0;
}

void pp_schedule_free(PPSchedule *s) {
    free(s->table);
    memset(s, 0, sizeof *s);
}

// ---------------------------------------------------------------------------
// validate

int pp_schedule_validate(const PPSchedule *s, PPCosts costs, PPSimResult *out, char *err, size_t errlen) {
    int pp = s->pp, m = s->micro, v = s->virt, n_stages = pp * v, rc = -1;
    if (pp < 1 || pp > PP_MAX_RANKS || m < 1 || v < 1 || s->n_slots < 0)
        return fail(err, errlen, "schedule shape pp %d, %d micro-batches, %d chunks is invalid", pp, m, v);
    size_t n = (size_t)n_stages * m;
    // slot (then end time) of each stage's forward, backward and W, by [stage][mb]
    int *slot_f = malloc(sizeof(int) * n), *slot_b = malloc(sizeof(int) * n), *slot_w = malloc(sizeof(int) * n);
    PPActionKind *bwd_kind = malloc(sizeof(PPActionKind) * n);
    double *end_f = malloc(sizeof(double) * n), *end_b = malloc(sizeof(double) * n);
    char l1[32], l2[32];
    if (!slot_f || !slot_b || !slot_w || !bwd_kind || !end_f || !end_b) {
        fail(err, errlen, "validate: out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) slot_f[i] = slot_b[i] = slot_w[i] = -1;
    // 1. each entry is well formed, on its stage's rank, and appears once
    for (int p = 0; p < pp; p++)
        for (int t = 0; t < s->n_slots; t++) {
            const PPAction *a = pp_schedule_at(s, p, t);
            if (a->kind == PP_IDLE) continue;
            if (a->kind < PP_F || a->kind > PP_W || a->mb < 0 || a->mb >= m || a->chunk < 0 || a->chunk >= v) {
                fail(err, errlen, "rank %d slot %d: action kind %d, micro-batch %d, chunk %d is out of range "
                     "(%d micro-batches, %d chunks)", p, t, a->kind, a->mb, a->chunk, m, v);
                goto done;
            }
            label(a, v, l1, sizeof l1);
            if (a->stage != a->chunk * pp + p) {
                fail(err, errlen, "rank %d slot %d: %s names stage %d, but chunk %d of rank %d is stage %d", p, t,
                     l1, a->stage, a->chunk, p, a->chunk * pp + p);
                goto done;
            }
            int recv_from, send_to;
            comm_of(a->kind, a->stage, pp, n_stages, &recv_from, &send_to);
            if (a->recv_from != recv_from || a->send_to != send_to) {
                fail(err, errlen, "rank %d slot %d: %s receives from %d and sends to %d; stage %d of %d must "
                     "receive from %d and send to %d", p, t, l1, a->recv_from, a->send_to, a->stage, n_stages,
                     recv_from, send_to);
                goto done;
            }
            size_t i = (size_t)a->stage * m + a->mb;
            int *first = a->kind == PP_F ? &slot_f[i] : a->kind == PP_W ? &slot_w[i] : &slot_b[i];
            if (*first >= 0) {
                fail(err, errlen, "rank %d slot %d: %s of stage %d runs a second time (first at slot %d)", p, t, l1,
                     a->stage, *first);
                goto done;
            }
            *first = t;
            if (a->kind == PP_B || a->kind == PP_BI) bwd_kind[i] = a->kind;
        }
    // 2. every (micro-batch, stage) is forwarded and backwarded, W exactly after a Bi
    for (int st = 0; st < n_stages; st++)
        for (int mb = 0; mb < m; mb++) {
            size_t i = (size_t)st * m + mb;
            const char *what = slot_f[i] < 0 ? "forwarded" : slot_b[i] < 0 ? "backwarded" : NULL;
            if (what) {
                fail(err, errlen, "micro-batch %d is never %s on stage %d (rank %d, chunk %d)", mb, what, st, st % pp,
                     st / pp);
                goto done;
            }
            if (bwd_kind[i] == PP_BI && slot_w[i] < 0) {
                fail(err, errlen, "micro-batch %d on stage %d (rank %d, chunk %d): Bi without its W", mb, st, st % pp,
                     st / pp);
                goto done;
            }
            if (bwd_kind[i] == PP_B && slot_w[i] >= 0) {
                fail(err, errlen, "micro-batch %d on stage %d (rank %d, chunk %d): a full B and a W (the weight grad "
                     "twice)", mb, st, st % pp, st / pp);
                goto done;
            }
        }
    // 3. dependencies in earlier slots; then the replay with costs, slot by
    // slot (every dependency's end time is known when it is needed)
    PPSimResult r = {0};
    double first_start[PP_MAX_RANKS], free_at[PP_MAX_RANKS] = {0};
    for (int p = 0; p < pp; p++) first_start[p] = -1;
    for (int t = 0; t < s->n_slots; t++)
        for (int p = 0; p < pp; p++) {
            const PPAction *a = pp_schedule_at(s, p, t);
            if (a->kind == PP_IDLE) continue;
            Dep d[2];
            int nd = deps_of(a->kind, a->stage, n_stages, d);
            double start = free_at[p];
            for (int j = 0; j < nd; j++) {
                size_t i = (size_t)d[j].stage * m + a->mb;
                int u = d[j].what == DEP_F ? slot_f[i] : slot_b[i];
                if (u >= t) {
                    PPAction need = {.kind = d[j].what == DEP_F ? PP_F : bwd_kind[i], .mb = a->mb,
                                     .chunk = d[j].stage / pp};
                    fail(err, errlen, "rank %d slot %d: %s needs %s of stage %d (rank %d) first, which runs at slot "
                         "%d", p, t, label(a, v, l1, sizeof l1), label(&need, v, l2, sizeof l2), d[j].stage,
                         d[j].stage % pp, u);
                    goto done;
                }
                double e = d[j].what == DEP_F ? end_f[i] : end_b[i];
                if (e > start) start = e;
            }
            double cost = (a->kind == PP_F ? costs.f : a->kind == PP_B ? costs.b : a->kind == PP_BI ? costs.bi
                                                                                                  : costs.w) / v;
            size_t i = (size_t)a->stage * m + a->mb;
            if (a->kind == PP_F) end_f[i] = start + cost;
            if (a->kind == PP_B || a->kind == PP_BI) end_b[i] = start + cost;
            if (first_start[p] < 0) first_start[p] = start;
            free_at[p] = start + cost;
            r.busy[p] += cost;
            if (free_at[p] > r.makespan) r.makespan = free_at[p];
        }
    double busy_all = 0;
    for (int p = 0; p < pp; p++) {
        r.idle[p] = free_at[p] - first_start[p] - r.busy[p];
        busy_all += r.busy[p];
        int held = 0;
        for (int t = 0; t < s->n_slots; t++) {
            const PPAction *a = pp_schedule_at(s, p, t);
            held += a->kind == PP_F ? 1 : a->kind == PP_B || a->kind == PP_W ? -1 : 0;
            if (held > r.peak_inflight[p]) r.peak_inflight[p] = held;
        }
    }
    r.bubble_fraction = r.makespan > 0 ? 1 - busy_all / (pp * r.makespan) : 0;
    if (out) *out = r;
    rc = 0;
done:
    free(slot_f), free(slot_b), free(slot_w), free(bwd_kind), free(end_f), free(end_b);
    return rc;
}

// ---------------------------------------------------------------------------
// hand-offs in call order (NCCL's matching)

int pp_schedule_recv_slot(const PPSchedule *s, int rank, int t) {
    const PPAction *a = pp_schedule_at(s, rank, t);
    if (a->kind == PP_IDLE || a->send_to < 0) return -1;
    int fwd = a->kind == PP_F, stage = fwd ? a->stage + 1 : a->stage - 1;
    for (int u = 0; u < s->n_slots; u++) {
        const PPAction *b = pp_schedule_at(s, a->send_to, u);
        if (b->mb == a->mb && b->stage == stage && (fwd ? b->kind == PP_F : b->kind == PP_B || b->kind == PP_BI))
            return u;
    }
    return -1;
}

typedef struct {
    int rank, peer, recv, group;  // group: the rank's call (NCCL group) it is issued in
    int mb, stage, grad;          // the message: its micro-batch, receiving stage, and whether a grad
    int partner;                  // the op it meets in call order
} P2POp;

static void msg_label(const P2POp *o, char *buf, size_t n) {
    snprintf(buf, n, "%s rank %d (%s of micro-batch %d for stage %d)", o->recv ? "receive from" : "send to", o->peer,
             o->grad ? "grad" : "activation", o->mb, o->stage);
}

int pp_schedule_check_p2p(const PPSchedule *s, PPP2POrder order, char *err, size_t errlen) {
    int pp = s->pp, rc = -1, n = 0;
    P2POp *ops = malloc(sizeof(P2POp) * (2 * (size_t)pp * s->n_slots + 1));
    int stride = 2 * s->n_slots + 1; // groups a rank issues: at most two per action
    int *first = malloc(sizeof(int) * ((size_t)pp * stride + 1)), *n_groups = calloc(pp, sizeof(int));
    int *recv_slot = malloc(sizeof(int) * ((size_t)s->n_slots + 1));
    // the pairing: each op's place among its (sender, receiver) pair's sends
    // or receives, the pair's counts, and its receives by place
    size_t n_ops_max = 2 * (size_t)pp * s->n_slots + 1;
    int *place = malloc(sizeof(int) * n_ops_max), *recv_at = malloc(sizeof(int) * n_ops_max);
    int *n_send = calloc((size_t)pp * pp, sizeof(int)), *n_recv = calloc((size_t)pp * pp, sizeof(int));
    int *recv_off = calloc((size_t)pp * pp + 1, sizeof(int));
    char l1[120], l2[120];
    if (!ops || !first || !n_groups || !recv_slot || !place || !recv_at || !n_send || !n_recv || !recv_off) {
        fail(err, errlen, "check_p2p: out of memory");
        goto done;
    }
    // each rank's calls in issue order; first[p][g]: the index of group g's first op
    for (int p = 0; p < pp; p++) {
        int *fp = first + (size_t)p * stride, g = 0;
#define P2P_OP(peer_, recv_, mb_, stage_, grad_) \
    (ops[n++] = (P2POp){p, peer_, recv_, g, mb_, stage_, grad_, -1})
        if (order == PP_P2P_EAGER) {
            for (int t = 0; t < s->n_slots; t++) {
                const PPAction *a = pp_schedule_at(s, p, t);
                if (a->kind == PP_IDLE) continue;
                int grad = a->kind != PP_F;
                if (a->recv_from >= 0) fp[g] = n, P2P_OP(a->recv_from, 1, a->mb, a->stage, grad), g++;
                if (a->send_to >= 0) fp[g] = n, P2P_OP(a->send_to, 0, a->mb, grad ? a->stage - 1 : a->stage + 1, grad), g++;
            }
        } else {
            for (int t = 0; t < s->n_slots; t++) recv_slot[t] = pp_schedule_recv_slot(s, p, t);
            for (int u = 0; u < s->n_slots; u++) {
                int start = n;
                for (int t = 0; t < u; t++) {
                    if (recv_slot[t] != u) continue;
                    const PPAction *a = pp_schedule_at(s, p, t);
                    int grad = a->kind != PP_F;
                    P2P_OP(a->send_to, 0, a->mb, grad ? a->stage - 1 : a->stage + 1, grad);
                }
                const PPAction *a = pp_schedule_at(s, p, u);
                if (a->kind != PP_IDLE && a->recv_from >= 0) P2P_OP(a->recv_from, 1, a->mb, a->stage, a->kind != PP_F);
                if (n > start) fp[g++] = start;
            }
        }
#undef P2P_OP
        fp[g] = n;
        n_groups[p] = g;
    }
    // pair the k-th send from a to b with b's k-th receive from a
    for (int i = 0; i < n; i++) {
        int pair = ops[i].recv ? ops[i].peer * pp + ops[i].rank : ops[i].rank * pp + ops[i].peer;
        place[i] = ops[i].recv ? n_recv[pair]++ : n_send[pair]++;
    }
    for (int q = 0; q < pp * pp; q++) recv_off[q + 1] = recv_off[q] + n_recv[q];
    for (int i = 0; i < n; i++)
        if (ops[i].recv) recv_at[recv_off[ops[i].peer * pp + ops[i].rank] + place[i]] = i;
    for (int i = 0; i < n; i++) {
        if (ops[i].recv) continue;
        int pair = ops[i].rank * pp + ops[i].peer;
        msg_label(&ops[i], l1, sizeof l1);
        if (place[i] >= n_recv[pair]) {
            fail(err, errlen, "rank %d's %s: rank %d posts no matching receive", ops[i].rank, l1, ops[i].peer);
            goto done;
        }
        int j = recv_at[recv_off[pair] + place[i]];
        if (ops[j].mb != ops[i].mb || ops[j].stage != ops[i].stage || ops[j].grad != ops[i].grad) {
            msg_label(&ops[j], l2, sizeof l2);
            fail(err, errlen, "in call order rank %d's %s meets rank %d's %s", ops[i].rank, l1, ops[j].rank, l2);
            goto done;
        }
        ops[i].partner = j, ops[j].partner = i;
    }
    for (int i = 0; i < n; i++)
        if (ops[i].partner < 0) {
            msg_label(&ops[i], l1, sizeof l1);
            fail(err, errlen, "rank %d's %s: rank %d sends nothing to match it", ops[i].rank, l1, ops[i].peer);
            goto done;
        }
    // run the calls: a rank's current group completes once every partner's
    // group has been reached (it is current there, or done)
    int pos[PP_MAX_RANKS] = {0};
    for (int progress = 1; progress;) {
        progress = 0;
        for (int p = 0; p < pp; p++) {
            if (pos[p] == n_groups[p]) continue;
            const int *fp = first + (size_t)p * stride;
            int ready = 1;
            for (int i = fp[pos[p]]; i < fp[pos[p] + 1]; i++) {
                const P2POp *o = &ops[ops[i].partner];
                ready &= pos[o->rank] >= o->group;
            }
            if (ready) pos[p]++, progress = 1;
        }
    }
    size_t len = 0;
    for (int p = 0; p < pp; p++) {
        if (pos[p] == n_groups[p]) continue;
        msg_label(&ops[first[(size_t)p * stride + pos[p]]], l1, sizeof l1);
        if (!len) len = snprintf(err, errlen, "deadlock in call order:");
        if (len < errlen) len += snprintf(err + len, errlen - len, " rank %d waits in its call %d (%s);", p, pos[p], l1);
    }
    rc = len ? -1 : 0;
done:
    free(ops), free(first), free(n_groups), free(recv_slot);
    free(place), free(recv_at), free(n_send), free(n_recv), free(recv_off);
    return rc;
}

double pp_schedule_theory_bubble(PPScheduleKind kind, int pp, int micro, int virt, PPCosts c) {
    double p1 = pp - 1, m = micro;
    if (kind == PP_INTERLEAVED) return p1 / (virt * m + p1);
    if (kind == PP_ZB1) {
        double bubble = p1 * (c.f + c.bi - c.w);
        return bubble / (m * (c.f + c.bi + c.w) + bubble);
    }
    return p1 / (m + p1);
}

// ---------------------------------------------------------------------------
// print

void pp_schedule_print(FILE *f, const PPSchedule *s) {
    char buf[32];
    int width = 1;
    for (size_t i = 0; i < (size_t)s->pp * s->n_slots; i++) {
        int len = (int)strlen(label(&s->table[i], s->virt, buf, sizeof buf));
        if (len > width) width = len;
    }
    fprintf(f, "%s schedule: pp %d, %d micro-batches, %d chunk%s per rank, %d slots of one action each\n",
            kind_names[s->kind], s->pp, s->micro, s->virt, s->virt > 1 ? "s" : "", s->n_slots);
    fprintf(f, "slot    ");
    for (int t = 0; t < s->n_slots; t++) fprintf(f, " %-*d", width, t);
    fprintf(f, "\n");
    for (int p = 0; p < s->pp; p++) {
        fprintf(f, "rank %-2d ", p);
        for (int t = 0; t < s->n_slots; t++) fprintf(f, " %-*s", width, label(pp_schedule_at(s, p, t), s->virt, buf, sizeof buf));
        fprintf(f, "\n");
    }
    fprintf(f, "F forward, B backward, Bi input-grad backward, W weight-grad backward; the number is the "
               "micro-batch%s; . idle\n", s->virt > 1 ? ", cN the chunk" : "");
}
