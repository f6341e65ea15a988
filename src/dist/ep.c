#include "dist/ep.h"

#include <string.h>

#include "ops/fp8.h"

size_t ep_plan_ints(int ep, int E_local, int max_rows) {
    return 2 * (size_t)ep * E_local + (E_local + 1) + 2 * (size_t)max_rows;
}

size_t ep_plan_sizes(int ep) { return 3 * (size_t)ep; }

// one layout for the host and the backend arrays: the counts, then
// local_offsets, local_to_recv and recv_to_local back to back (the last two
// `rows` long, so ep_plan places recv_to_local once it knows rows, and the
// three go to the backend in one copy)
static void carve_ints(int *ints, int ep, int El, int **counts, int **local_offsets, int **local_to_recv) {
    *counts = ints;
    *local_offsets = ints + 2 * (size_t)ep * El;
    *local_to_recv = *local_offsets + El + 1;
}

void ep_plan_carve(EpPlan *p, int ep, int E_local, int max_rows, int *host_ints, int *backend_ints,
                   size_t *sizes) {
    memset(p, 0, sizeof(*p));
    p->ep = ep;
    p->E_local = E_local;
    p->send_rows = sizes;
    p->recv_rows = sizes + ep;
    p->per_rank = sizes + 2 * ep;
    for (int r = 0; r < ep; r++) p->per_rank[r] = E_local;
    (void)max_rows; // ep_plan_ints made room for 2 x max_rows after local_offsets
    carve_ints(host_ints, ep, E_local, &p->send_counts, &p->local_offsets, &p->local_to_recv);
    p->recv_counts = p->send_counts + (size_t)ep * E_local;
    carve_ints(backend_ints, ep, E_local, &p->counts_b, &p->local_offsets_b, &p->local_to_recv_b);
}

void ep_plan(Comm *c, const Ops *ops, EpPlan *p, const int *offsets) {
    int ep = p->ep, El = p->E_local;
    size_t n = (size_t)ep * El;
    // per-expert counts to every owner (El ints per rank), computed and
    // exchanged in backend memory; both halves come to the host at once
    ops->moe_segment_sizes(p->counts_b, offsets, (int)n);
    comm_all_to_all_v(c, p->counts_b, p->per_rank, p->counts_b + n, p->per_rank, sizeof(int));
    ops->to_host(p->send_counts, p->counts_b, 2 * n * sizeof(int));
    p->rows = 0;
    for (int r = 0; r < ep; r++) {
        p->send_rows[r] = p->recv_rows[r] = 0;
        for (int e = 0; e < El; e++) {
            p->send_rows[r] += p->send_counts[r * El + e];
            p->recv_rows[r] += p->recv_counts[r * El + e];
        }
        p->rows += (int)p->recv_rows[r];
    }
    p->recv_to_local = p->local_to_recv + p->rows;
    p->recv_to_local_b = p->local_to_recv_b + p->rows;
    // regrouped order: local expert, then source rank, then the source's order
    int src_start[ep], pos = 0;
    for (int s = 0; s < ep; s++) { src_start[s] = pos; pos += (int)p->recv_rows[s]; }
    int row = 0;
    for (int e = 0; e < El; e++) {
        p->local_offsets[e] = row;
        for (int s = 0; s < ep; s++) {
            int first = src_start[s];
            for (int j = 0; j < e; j++) first += p->recv_counts[s * El + j];
            for (int i = 0; i < p->recv_counts[s * El + e]; i++) {
                p->recv_to_local[first + i] = row;
                p->local_to_recv[row++] = first + i;
            }
        }
    }
    p->local_offsets[El] = row;
    // the segments and both regroup maps to the backend, in one copy
    ops->to_device(p->local_offsets_b, p->local_offsets, ((size_t)El + 1 + 2 * (size_t)p->rows) * sizeof(int));
}

size_t ep_sent_rows(const EpPlan *p) {
    size_t n = 0;
    for (int r = 0; r < p->ep; r++) n += p->send_rows[r];
    return n;
}

void ep_exchange(Comm *c, const EpPlan *p, const void *xp, void *recv, size_t row_bytes) {
    comm_all_to_all_v(c, xp, p->send_rows, recv, p->recv_rows, row_bytes);
}

void ep_dispatch(Comm *c, const Ops *ops, const EpPlan *p, const void *xp, void *xl, void *scratch, int C) {
    ep_exchange(c, p, xp, scratch, (size_t)C * ops->act_bytes);
    ops->permute_forward(xl, scratch, p->local_to_recv_b, p->rows, C);
}

void ep_dispatch_fp8(Comm *c, const Ops *ops, const EpPlan *p, const uint8_t *q, const float *s, uint8_t *ql,
                     float *sl, void *send, void *recv, int C) {
    ops->fp8_pack_rows(send, q, s, (int)ep_sent_rows(p), C);
    ep_exchange(c, p, send, recv, fp8_payload_bytes(C));
    ops->fp8_unpack_rows(ql, sl, recv, p->local_to_recv_b, p->rows, C);
}

void ep_combine(Comm *c, const Ops *ops, const EpPlan *p, const void *yl, void *y, void *scratch, int C) {
    ops->permute_forward(scratch, yl, p->recv_to_local_b, p->rows, C);
    comm_all_to_all_v(c, scratch, p->recv_rows, y, p->send_rows, (size_t)C * ops->act_bytes);
}
