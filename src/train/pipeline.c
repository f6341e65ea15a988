// Pipeline parallelism in the trainer (issue 17): the stage split, this
// rank's chunks, and the execution of its row of the schedule's table
// (dist/pp_schedule.h) with the residual stream and its grad handed between
// ranks over the pipeline group (mesh.pp_comm).
//
// Each action receives its input (blocking: the time a rank waits is its
// bubble), computes, and sends its output without waiting. The table puts
// every receive's sender in an earlier slot, so ranks that block only on
// receives cannot deadlock. That holds where messages match by tag (MPI, CPU
// ranks); over NCCL they match in call order and a rank's calls complete
// one after another, so GPU ranks send each output in the slot where its
// receiver takes it, in one group with that slot's receive (exchange). Send buffers therefore must outlive the call:
// a forward sends its slot's output, which stays until the micro-batch's
// backward here (by then the next stage has received it: its grad came
// back); a backward sends a copy of its input grad from a pool whose
// buffers are reused only once their send has completed (comm_test).
//
// The micro-batches in flight each have an activation slot of the model
// (model_use_slot): a slot is taken by a micro-batch's first forward here
// and given back by its last chunk's backward (B, or W after Bi). ZB-H1's
// split is partial: Bi leaves the weight grads of the attention projections
// and the LM head to W (model.defer_wgrad); the MoE and MLP weight grads stay
// in Bi (README, "Pipeline parallelism").
#include <stdlib.h>
#include <string.h>

#include "dist/pp_split.h"
#include "train/trainer.h"
#include "util/check.h"
#include "util/clock.h"

int pipeline_rank_layout(const RunConfig *cfg, int M, int rank, int *split, ParamStage *st, PPSchedule *sched,
                         int *n_slots, char *err, size_t errlen) {
    const ParallelSection *par = &cfg->parallel;
    int L = cfg->model.n_layers, v = par->pp_virtual > 0 ? par->pp_virtual : 1, pp = par->pp, S = pp * v;
    if (S > PP_MAX_RANKS * PARAM_MAX_CHUNKS || v > PARAM_MAX_CHUNKS)
        return errorf(err, errlen, "parallel.pp x parallel.pp_virtual: at most %d chunks per rank", PARAM_MAX_CHUNKS);
    if (par->n_pp_layers) {
        if (pp_split_check(par->pp_layer_counts, par->n_pp_layers, L, S, err, errlen)) return -1;
        memcpy(split, par->pp_layer_counts, S * sizeof(int));
    } else {
        ModelConfig mc = cfg->model;
        PPCost *layers = mallocCheck(L * sizeof(PPCost)), first, last;
        int rc = pp_layer_costs(&mc, layers, &first, &last, err, errlen);
        if (!rc) rc = pp_split_auto(layers, L, first, last, S, split, err, errlen);
        free(layers);
        if (rc) return -1;
    }
    // chunk c of rank p is virtual stage c * pp + p (pp_schedule.h)
    memset(st, 0, sizeof *st);
    st->n_chunks = v;
    for (int c = 0; c < v; c++) {
        int s = c * pp + rank, begin = 0;
        for (int i = 0; i < s; i++) begin += split[i];
        st->begin[c] = begin;
        st->end[c] = begin + split[s];
    }
    st->embed = rank == 0;
    st->head = rank == pp - 1;
    if (pp_schedule_build(sched, (PPScheduleKind)par->pp_schedule, pp, M, v, err, errlen)) return -1;
    PPSimResult sim;
    if (pp_schedule_validate(sched, pp_costs_unit(), &sim, err, errlen)) { pp_schedule_free(sched); return -1; }
    // slots: the most micro-batches this rank holds at once (taken at the
    // first forward, given back at the last B or W)
    int *open = calloc(M, sizeof(int)), held = 0;
    *n_slots = 1;
    for (int t = 0; t < sched->n_slots; t++) {
        const PPAction *a = pp_schedule_at(sched, rank, t);
        if (a->kind == PP_F && open[a->mb]++ == 0 && ++held > *n_slots) *n_slots = held;
        if ((a->kind == PP_B || a->kind == PP_W) && --open[a->mb] == 0) held--;
    }
    free(open);
    return 0;
}

int pipeline_plan(Trainer *tr, int print_schedule, char *err, size_t errlen) {
    Pipeline *pl = &tr->pipe;
    const RunConfig *cfg = &tr->cfg;
    const ParallelSection *par = &cfg->parallel;
    memset(pl, 0, sizeof *pl);
    pl->on = par->pp > 1;
    if (!pl->on) return 0;
    pl->pp = par->pp;
    pl->rank = tr->mesh.pp_rank;
    pl->virt = par->pp_virtual;
    pl->n_stages = par->pp * par->pp_virtual;
    if (pipeline_rank_layout(cfg, tr->M, pl->rank, pl->split, &pl->stage, &pl->sched, &pl->n_slots, err, errlen))
        return -1;
    pl->theory = pp_schedule_theory_bubble(pl->sched.kind, pl->pp, tr->M, pl->virt, pp_costs_unit());
    if (print_schedule && train_rank0) {
        printf("pipeline schedule (--print-schedule), generated once and run every step:\n");
        pp_schedule_print(stdout, &pl->sched);
        fflush(stdout);
    }
    return 0;
}

// Model hook between blocks (model.h between_blocks), on CPU ranks: tests
// every send still in flight, which is what lets MPI move its remaining
// fragments (with Open MPI's shared-memory transport and no single-copy
// mechanism a 128 KiB send otherwise waits for this rank's next action, and
// with gpipe for the end of the step: 43% measured bubble against 11%).
static void progress_sends(void *ctx) {
    Pipeline *pl = ctx;
    for (int i = 0; i < pl->n_grad_buf; i++) comm_test(&pl->grad_req[i]);
    for (int i = 0; i < pl->n_slots * pl->virt; i++) comm_test(&pl->slot_reqs[i]);
    if (pl->pre_req && comm_test(&pl->pre_req)) pl->pre_req = NULL; // done: the action after this one finds it
}

void pipeline_alloc(Trainer *tr) {
    Pipeline *pl = &tr->pipe;
    if (!pl->on) return;
    pl->slot_of = mallocCheck(tr->M * sizeof(int));
    pl->chunks_open = mallocCheck(tr->M * sizeof(int));
    pl->slot_used = calloc(pl->n_slots, sizeof(int));
    pl->slot_reqs = calloc((size_t)pl->n_slots * pl->virt, sizeof(CommReq *));
    pl->msg_bytes = (size_t)tr->MB * tr->T * tr->m.cfg.d_model * tr->ops->act_bytes;
    pl->pre_slot = -1;
    const char *h = getenv("MOECORE_PP_HANDOFF");
    if (h && strcmp(h, "eager") && strcmp(h, "receiver"))
        die("MOECORE_PP_HANDOFF: '%s' is not eager or receiver", h);
    int gpu = tr->cfg.device.type == 1;
    if (gpu && h && !strcmp(h, "eager"))
        die("MOECORE_PP_HANDOFF=eager: GPU ranks hand off at the receiver's slot (eager sends deadlock over NCCL, "
            "pp_schedule_check_p2p)");
    pl->at_receiver = gpu || (h && !strcmp(h, "receiver"));
    if (pl->at_receiver) {
        pl->recv_slot = mallocCheck(pl->sched.n_slots * sizeof(int));
        for (int t = 0; t < pl->sched.n_slots; t++) pl->recv_slot[t] = pp_schedule_recv_slot(&pl->sched, pl->rank, t);
        pl->pend = mallocCheck(pl->sched.n_slots * sizeof *pl->pend);
        char err[400];
        if (pp_schedule_check_p2p(&pl->sched, PP_P2P_AT_RECEIVER, err, sizeof err))
            die("pipeline: the schedule's hand-offs do not meet in call order: %s", err);
    }
    if (!gpu) { // over NCCL the sends progress on their own stream
        tr->m.between_blocks = progress_sends;
        tr->m.between_blocks_ctx = pl;
        if (!pl->at_receiver) pl->pre_buf = tr->ops->alloc(pl->msg_bytes);
    }
}

void pipeline_free(Pipeline *pl, const Ops *ops) {
    if (!pl->on) return;
    free(pl->slot_of); free(pl->chunks_open); free(pl->slot_used); free(pl->slot_reqs);
    for (int i = 0; i < pl->n_grad_buf; i++) ops->free(pl->grad_buf[i]);
    if (pl->pre_buf) ops->free(pl->pre_buf);
    free(pl->grad_buf); free(pl->grad_req); free(pl->grad_pending);
    free(pl->recv_slot); free(pl->pend);
    pp_schedule_free(&pl->sched);
    memset(pl, 0, sizeof *pl);
}

// Messages of one pair of ranks match by tag: (micro-batch, receiving
// stage, activation or grad).
static int msg_tag(const Pipeline *pl, int mb, int stage, int grad) {
    return ((mb * pl->n_stages + stage) * 2 + grad) % 32768;
}

// A send buffer for an input grad whose previous send has completed (a
// new one when every buffer is still in flight: the pool grows to the most
// sends a step keeps outstanding, in its first steps).
static void *grad_send_buffer(Trainer *tr, int *which) {
    Pipeline *pl = &tr->pipe;
    for (int i = 0; i < pl->n_grad_buf; i++)
        if (!pl->grad_pending[i] && comm_test(&pl->grad_req[i])) { *which = i; return pl->grad_buf[i]; }
    pl->grad_buf = reallocCheck(pl->grad_buf, (pl->n_grad_buf + 1) * sizeof(void *));
    pl->grad_req = reallocCheck(pl->grad_req, (pl->n_grad_buf + 1) * sizeof(CommReq *));
    pl->grad_pending = reallocCheck(pl->grad_pending, (pl->n_grad_buf + 1) * sizeof(int));
    pl->grad_buf[pl->n_grad_buf] = tr->ops->alloc(pl->msg_bytes);
    pl->grad_req[pl->n_grad_buf] = NULL;
    pl->grad_pending[pl->n_grad_buf] = 0;
    *which = pl->n_grad_buf;
    return pl->grad_buf[pl->n_grad_buf++];
}

// Takes a free slot for micro-batch mb; its earlier occupant's forward
// sends were received before that micro-batch's grads came back, so the
// waits here return at once.
static int take_slot(Pipeline *pl, int mb) {
    for (int k = 0; k < pl->n_slots; k++) {
        if (pl->slot_used[k]) continue;
        for (int c = 0; c < pl->virt; c++) comm_wait(pl->slot_reqs[k * pl->virt + c]), pl->slot_reqs[k * pl->virt + c] = NULL;
        pl->slot_used[k] = 1;
        pl->slot_of[mb] = k;
        return k;
    }
    die("pipeline: no free activation slot for micro-batch %d (%d slots)", mb, pl->n_slots);
    return -1;
}

// A blocking receive; returns the seconds it waited.
static double recv_into(Pipeline *pl, Comm *ppc, void *buf, int from, int tag) {
    double t = clock_now_s();
    comm_wait(comm_irecv(ppc, buf, pl->msg_bytes, COMM_BYTE, from, tag));
    return clock_now_s() - t;
}

static int action_tag(const Pipeline *pl, const PPAction *a) {
    return msg_tag(pl, a->mb, a->stage, a->kind != PP_F);
}

// CPU ranks: posts the receive of this rank's next action after slot t
// into the staging buffer, so that its message lands while this action
// computes (the between-blocks hook tests it) instead of being matched only
// when the next action starts.
static void post_next_recv(Pipeline *pl, Comm *ppc, int t) {
    if (!pl->pre_buf) return;
    const PPSchedule *s = &pl->sched;
    for (int u = t + 1; u < s->n_slots; u++) {
        const PPAction *a = pp_schedule_at(s, pl->rank, u);
        if (a->kind == PP_IDLE) continue;
        if (a->recv_from < 0 || a->kind == PP_W) return;
        pl->pre_req = comm_irecv(ppc, pl->pre_buf, pl->msg_bytes, COMM_BYTE, a->recv_from, action_tag(pl, a));
        pl->pre_slot = u;
        return;
    }
}

// This action's input into buf: from the staging buffer when it was
// received ahead, else received now. Returns the seconds it waited.
static double recv_input(Trainer *tr, Comm *ppc, int t, const PPAction *a, void *buf) {
    Pipeline *pl = &tr->pipe;
    if (pl->pre_slot != t) return recv_into(pl, ppc, buf, a->recv_from, action_tag(pl, a));
    double t0 = clock_now_s();
    comm_wait(pl->pre_req);
    pl->pre_req = NULL;
    pl->pre_slot = -1;
    double waited = clock_now_s() - t0;
    tr->ops->copy_act(buf, pl->pre_buf, (size_t)tr->MB * tr->T * tr->m.cfg.d_model);
    return waited;
}

// The hand-offs of slot t at the receiver's slot (pl->at_receiver): the
// sends whose receiver takes them in slot t, and this rank's own receive
// into recv_buf (NULL: none), in one group. Over NCCL, where two ranks'
// messages meet in call order and a rank's groups complete one after
// another, that is what keeps the pipeline from deadlocking: every rank
// issues slot t's group after slot t - 1's, and each op's partner is in its
// peer's group of the same slot (pp_schedule_check_p2p, checked at start).
// Sending when the output is made instead deadlocks 1f1b at pp 2: stage 0
// sends micro-batch 1's activation while stage 1 sends micro-batch 0's grad,
// each before its receive. Over MPI the tags are each pair's message count,
// so that messages meet in call order there too: a send issued in another
// slot than its receiver expects would deliver another micro-batch's data
// (test_pp compares the losses). Returns the seconds the receive waited.
static double exchange(Trainer *tr, Comm *ppc, int t, const PPAction *a, void *recv_buf) {
    Pipeline *pl = &tr->pipe;
    CommP2P ops[PP_MAX_RANKS + 1];
    struct PPPending *sent[PP_MAX_RANKS + 1];
    int n = 0;
    for (int i = 0; i < pl->n_pend; i++) {
        struct PPPending *p = &pl->pend[i];
        if (p->u != t) continue;
        sent[n] = p;
        ops[n++] = (CommP2P){.buf = p->buf, .n = pl->msg_bytes, .type = COMM_BYTE, .peer = p->dst,
                             .tag = (int)(pl->n_sent[p->dst]++ % 32768)};
    }
    int r = -1;
    if (recv_buf) {
        r = n;
        ops[n++] = (CommP2P){.buf = recv_buf, .n = pl->msg_bytes, .type = COMM_BYTE, .peer = a->recv_from,
                             .tag = (int)(pl->n_recv[a->recv_from]++ % 32768), .recv = 1};
    }
    if (!n) return 0;
    comm_p2p_group(ppc, ops, n);
    for (int i = 0; i < n; i++) {
        if (i == r) continue;
        struct PPPending *p = sent[i];
        if (p->grad) pl->grad_req[p->idx] = ops[i].req, pl->grad_pending[p->idx] = 0;
        else pl->slot_reqs[p->idx] = ops[i].req;
        p->u = -1;
    }
    int k = 0; // drop the issued sends
    for (int i = 0; i < pl->n_pend; i++)
        if (pl->pend[i].u >= 0) pl->pend[k++] = pl->pend[i];
    pl->n_pend = k;
    if (r < 0) return 0;
    double t0 = clock_now_s();
    comm_wait(ops[r].req);
    return clock_now_s() - t0;
}

// A send of slot t's output: now (eager, with the message's tag), or kept
// for the slot in which its receiver takes it (at the receiver). grad:
// buffer idx is grad_buf's, else slot_reqs' index.
static void send_output(Pipeline *pl, Comm *ppc, int t, void *buf, int dst, int tag, int grad, int idx) {
    if (!pl->at_receiver) {
        CommReq *r = comm_isend(ppc, buf, pl->msg_bytes, COMM_BYTE, dst, tag);
        if (grad) pl->grad_req[idx] = r;
        else pl->slot_reqs[idx] = r;
        return;
    }
    if (grad) pl->grad_pending[idx] = 1;
    pl->pend[pl->n_pend++] = (struct PPPending){.u = pl->recv_slot[t], .grad = grad, .idx = idx, .dst = dst, .buf = buf};
}

// On a device the host only queues the work: waits for it (returns the
// seconds), so that the pipeline's clock -- busy, waited, the bubble --
// measures the device's time, not how fast the host queues kernels. The
// host then no longer runs ahead across actions: their launch gaps count
// as idle (small beside actions of milliseconds).
static double settle(const Trainer *tr) {
    if (!tr->ops->synchronize) return 0;
    double t = clock_now_s();
    tr->ops->synchronize();
    return clock_now_s() - t;
}
// The seconds since t0 once the device has done the work queued since.
static double busy_since(const Trainer *tr, double t0) {
    settle(tr);
    return clock_now_s() - t0;
}

void pipeline_step(Trainer *tr, int64_t step, float ce_scale) {
    Pipeline *pl = &tr->pipe;
    Model *m = &tr->m;
    Comm *ppc = tr->mesh.pp_comm;
    const PPSchedule *s = &pl->sched;
    size_t mb_elems = (size_t)tr->MB * tr->T;
    for (int i = 0; i < tr->M; i++) pl->slot_of[i] = -1, pl->chunks_open[i] = 0;
    comm_barrier(ppc); // the step's actions are timed from a common start
    double t0 = clock_now_s(), busy = 0, waited = 0, first = -1, last = 0;
    double kind_s[5] = {0}; // compute time by action kind (PPActionKind)
    int kind_n[5] = {0};
    for (int t = 0; t < s->n_slots; t++) {
        const PPAction *a = pp_schedule_at(s, pl->rank, t);
        if (a->kind == PP_IDLE) {
            if (pl->at_receiver) exchange(tr, ppc, t, a, NULL);
            continue;
        }
        int mb = a->mb, ch = a->chunk;
        double ta = clock_now_s(), busy_before = busy;
        if (first < 0) first = ta - t0;
        if (a->kind == PP_F) {
            int k = pl->slot_of[mb] >= 0 ? pl->slot_of[mb] : take_slot(pl, mb);
            pl->chunks_open[mb]++;
            model_use_slot(m, k);
            if (ch == 0) model_set_batch(m, tr->tokens + mb * mb_elems, tr->targets + mb * mb_elems);
            if (pl->at_receiver) waited += exchange(tr, ppc, t, a, a->recv_from >= 0 ? model_chunk_input(m, ch) : NULL);
            else if (a->recv_from >= 0) waited += recv_input(tr, ppc, t, a, model_chunk_input(m, ch));
            post_next_recv(pl, ppc, t);
            waited += settle(tr); // the input's arrival
            double tc = clock_now_s();
            model_forward_chunk(m, ch, train_micro_seed(tr, step, mb));
            model_count_chunk(m, ch);
            busy += busy_since(tr, tc);
            if (a->send_to >= 0)
                send_output(pl, ppc, t, model_chunk_output(m, ch), a->send_to, msg_tag(pl, mb, a->stage + 1, 0), 0,
                            k * pl->virt + ch);
        } else if (a->kind == PP_B || a->kind == PP_BI) {
            int k = pl->slot_of[mb];
            model_use_slot(m, k);
            if (pl->at_receiver) waited += exchange(tr, ppc, t, a, a->recv_from >= 0 ? model_stage_dres(m) : NULL);
            else if (a->recv_from >= 0) waited += recv_input(tr, ppc, t, a, model_stage_dres(m));
            post_next_recv(pl, ppc, t);
            waited += settle(tr);
            double tc = clock_now_s();
            model_backward_chunk(m, ch, ce_scale, 1.0f / tr->M_total);
            int b = -1;
            void *buf = a->send_to >= 0 ? grad_send_buffer(tr, &b) : NULL;
            if (buf) tr->ops->copy_act(buf, model_stage_dres(m), mb_elems * m->cfg.d_model);
            busy += busy_since(tr, tc);
            if (buf) send_output(pl, ppc, t, buf, a->send_to, msg_tag(pl, mb, a->stage - 1, 1), 1, b);
            if (a->kind == PP_B && --pl->chunks_open[mb] == 0) pl->slot_used[k] = 0;
        } else if (a->kind == PP_W) { // the weight grads Bi left (model.defer_wgrad)
            if (pl->at_receiver) exchange(tr, ppc, t, a, NULL);
            post_next_recv(pl, ppc, t);
            int k = pl->slot_of[mb];
            model_use_slot(m, k);
            double tc = clock_now_s(); // the action before ended settled, and no receive came since
            model_wgrad_chunk(m, ch);
            busy += busy_since(tr, tc);
            if (--pl->chunks_open[mb] == 0) pl->slot_used[k] = 0;
        }
        kind_s[a->kind] += busy - busy_before;
        kind_n[a->kind]++;
        last = clock_now_s() - t0;
    }
    // every send of the step is received within it
    if (pl->n_pend) die("pipeline: internal error: %d sends never issued at the end of the step", pl->n_pend);
    for (int i = 0; i < pl->n_grad_buf; i++) comm_wait(pl->grad_req[i]), pl->grad_req[i] = NULL;
    for (int i = 0; i < pl->n_slots * pl->virt; i++) comm_wait(pl->slot_reqs[i]), pl->slot_reqs[i] = NULL;
    m->expert_grads_unset = 0;
    // the bubble: every rank's busy time and the makespan over the group
    pl->busy_s = busy;
    pl->span_s = last - (first < 0 ? 0 : first);
    enum { G_BUSY = 0, G_LAST = PP_MAX_RANKS, G_SPAN = 2 * PP_MAX_RANKS, G_WAIT = 3 * PP_MAX_RANKS,
           G_KIND = 4 * PP_MAX_RANKS, G_N = 4 * PP_MAX_RANKS + 10 };
    double g[G_N];
    memset(g, 0, sizeof g);
    g[G_BUSY + pl->rank] = busy;
    g[G_LAST + pl->rank] = last;
    g[G_SPAN + pl->rank] = pl->span_s;
    g[G_WAIT + pl->rank] = waited;
    for (int k = 1; k < 5; k++) g[G_KIND + 2 * k] = kind_s[k], g[G_KIND + 2 * k + 1] = kind_n[k];
    comm_allreduce(ppc, g, G_N, COMM_F64);
    double sum_busy = 0, makespan = 0;
    for (int p = 0; p < pl->pp; p++) {
        sum_busy += g[G_BUSY + p];
        if (g[G_LAST + p] > makespan) makespan = g[G_LAST + p];
        double span = g[G_SPAN + p];
        pl->idle[p] = span > 0 ? (span - g[G_BUSY + p]) / span : 0;
        pl->wait[p] = span > 0 ? g[G_WAIT + p] / span : 0;
        pl->other[p] = pl->idle[p] - pl->wait[p];
    }
    pl->bubble = makespan > 0 ? 1 - sum_busy / (pl->pp * makespan) : 0;
    // the table replayed with the mean measured action times (a rank's
    // share: v chunks' worth) and free hand-offs: what the schedule alone gives
    double mean[5] = {0};
    for (int k = 1; k < 5; k++) {
        double n = g[G_KIND + 2 * k + 1];
        mean[k] = n > 0 ? g[G_KIND + 2 * k] / n * pl->virt : 0;
    }
    PPCosts costs = {.f = mean[PP_F], .b = mean[PP_B], .bi = mean[PP_BI], .w = mean[PP_W]};
    PPSimResult sim;
    char err[200];
    pl->bubble_sim = pp_schedule_validate(s, costs, &sim, err, sizeof err) ? -1 : sim.bubble_fraction;
}

void pipeline_eval(Trainer *tr, const int *tokens, const int *targets, uint64_t route_seed) {
    Pipeline *pl = &tr->pipe;
    Model *m = &tr->m;
    Comm *ppc = tr->mesh.pp_comm;
    CommReq *sends[PARAM_MAX_CHUNKS] = {0};
    model_use_slot(m, 0);
    model_set_batch(m, tokens, targets);
    m->ce_sum = 0;
    for (int c = 0; c < pl->virt; c++) {
        int s = c * pl->pp + pl->rank;
        if (s > 0) recv_into(pl, ppc, model_chunk_input(m, c), (s - 1) % pl->pp, msg_tag(pl, 0, s, 0));
        model_forward_chunk(m, c, route_seed);
        if (s < pl->n_stages - 1)
            sends[c] = comm_isend(ppc, model_chunk_output(m, c), pl->msg_bytes, COMM_BYTE, (s + 1) % pl->pp,
                                  msg_tag(pl, 0, s + 1, 0));
    }
    for (int c = 0; c < pl->virt; c++) comm_wait(sends[c]);
    if (m->stage.head) m->ops->to_host(&m->ce_sum, m->ce_acc, sizeof(double));
    else m->n_valid = 0;
}
