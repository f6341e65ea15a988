#include "dist/ep.h"

#include <string.h>

#include "util/check.h"

size_t ep_plan_ints(int ep, int E_local, int max_rows) {
    return (size_t)ep * E_local + (E_local + 1) + (size_t)max_rows + E_local;
}

void ep_plan_carve(EpPlan *p, int ep, int E_local, int *ints, size_t *sizes) {
    memset(p, 0, sizeof(*p));
    p->ep = ep;
    p->E_local = E_local;
    p->send_rows = sizes;
    p->recv_rows = sizes + ep;
    p->recv_counts = ints;
    p->local_offsets = ints + (size_t)ep * E_local;
    p->kept = p->local_offsets + E_local + 1;
    p->local_to_recv = p->kept + E_local;
}

void ep_plan(Comm *c, EpPlan *p, const int *offsets, int capacity) {
    int ep = p->ep, El = p->E_local;
    // per-expert counts to every owner: El ints per rank
    int *send_counts = mallocCheck((size_t)ep * El * sizeof(int));
    size_t *per = mallocCheck(ep * sizeof(size_t));
    for (int r = 0; r < ep; r++) {
        p->send_rows[r] = 0;
        for (int e = 0; e < El; e++) {
            int g = r * El + e;
            send_counts[r * El + e] = offsets[g + 1] - offsets[g];
            p->send_rows[r] += send_counts[r * El + e];
        }
    }
    for (int r = 0; r < ep; r++) per[r] = El;
    comm_all_to_all_v(c, send_counts, per, p->recv_counts, per, sizeof(int));
    free(send_counts);
    free(per);
    p->rows = 0;
    for (int s = 0; s < ep; s++) {
        p->recv_rows[s] = 0;
        for (int e = 0; e < El; e++) p->recv_rows[s] += p->recv_counts[s * El + e];
        p->rows += (int)p->recv_rows[s];
    }
    // regrouped order: local expert, then source rank, then the source's order
    int *src_start = mallocCheck(ep * sizeof(int)), pos = 0;
    for (int s = 0; s < ep; s++) { src_start[s] = pos; pos += (int)p->recv_rows[s]; }
    int row = 0;
    p->dropped = 0;
    for (int e = 0; e < El; e++) {
        p->local_offsets[e] = row;
        for (int s = 0; s < ep; s++) {
            int first = src_start[s];
            for (int j = 0; j < e; j++) first += p->recv_counts[s * El + j];
            for (int i = 0; i < p->recv_counts[s * El + e]; i++) p->local_to_recv[row++] = first + i;
        }
        int n = row - p->local_offsets[e];
        p->kept[e] = capacity > 0 && n > capacity ? capacity : n;
        p->dropped += n - p->kept[e];
    }
    p->local_offsets[El] = row;
    free(src_start);
}

void ep_dispatch(Comm *c, const EpPlan *p, const void *xp, void *xl, void *scratch, size_t row_bytes) {
    if (p->ep == 1) {
        if (xl != xp) memcpy(xl, xp, (size_t)p->rows * row_bytes);
        return;
    }
    comm_all_to_all_v(c, xp, p->send_rows, scratch, p->recv_rows, row_bytes);
#pragma omp parallel for
    for (int r = 0; r < p->rows; r++)
        memcpy((char *)xl + (size_t)r * row_bytes, (char *)scratch + (size_t)p->local_to_recv[r] * row_bytes, row_bytes);
}

void ep_zero_dropped(const EpPlan *p, void *yl, size_t row_bytes) {
    if (!p->dropped) return;
    for (int e = 0; e < p->E_local; e++) {
        int first = p->local_offsets[e] + p->kept[e], end = p->local_offsets[e + 1];
        if (end > first) memset((char *)yl + (size_t)first * row_bytes, 0, (size_t)(end - first) * row_bytes);
    }
}

void ep_combine(Comm *c, const EpPlan *p, void *yl, void *y, void *scratch, size_t row_bytes) {
    ep_zero_dropped(p, yl, row_bytes);
    if (p->ep == 1) {
        if (y != yl) memcpy(y, yl, (size_t)p->rows * row_bytes);
        return;
    }
#pragma omp parallel for
    for (int r = 0; r < p->rows; r++)
        memcpy((char *)scratch + (size_t)p->local_to_recv[r] * row_bytes, (char *)yl + (size_t)r * row_bytes, row_bytes);
    comm_all_to_all_v(c, scratch, p->recv_rows, y, p->send_rows, row_bytes);
}
