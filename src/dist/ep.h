// Expert parallelism on host buffers: dispatch routed rows to the rank that
// owns their expert, and combine the expert outputs back.
//
// Every rank of the ep group routes its own tokens and sorts its rows by
// global expert (moe_route_index), so the rows for rank r's experts
// [r*E_local, (r+1)*E_local) are one contiguous block. The plan exchanges
// per-expert row counts; dispatch sends each block to its owner with one
// all-to-all-v and regroups the received rows by local expert (expert, then
// source rank, then the source's order) for the grouped matmul; combine is
// the exact reverse. Backward uses the same two moves the other way round:
// the grad of dispatch is combine, and the grad of combine is dispatch.
//
// Capacity (capacity > 0): each local expert keeps its first `capacity`
// rows in that order and drops the rest (tail drop); dropped rows produce
// zero outputs and receive zero grads.
#pragma once
#include <stddef.h>

#include "dist/comm.h"

typedef struct {
    int ep, E_local;
    size_t *send_rows, *recv_rows;  // [ep]
    int *recv_counts;               // [ep][E_local]: rows from rank s for local expert e
    int *local_offsets;             // [E_local + 1] segments of the regrouped rows
    int *local_to_recv;             // [rows]: received-order row of each regrouped row
    int *kept;                      // [E_local]: rows kept per local expert (capacity)
    int rows;                       // rows received (= regrouped)
    int dropped;                    // rows dropped by capacity
} EpPlan;

// Bytes of int storage a plan needs for at most max_rows received rows.
size_t ep_plan_ints(int ep, int E_local, int max_rows);
// Carves a plan's arrays from ints (ep_plan_ints of them) and sizes.
void ep_plan_carve(EpPlan *p, int ep, int E_local, int *ints, size_t *sizes /* 2*ep */);
// From this rank's global-expert offsets [E+1] (E = ep * E_local): exchange
// counts and fill the plan. capacity 0 = dropless.
void ep_plan(Comm *c, EpPlan *p, const int *offsets, int capacity);
// Rows are row_bytes wide (host memory for now: the NCCL path will move
// device rows).
// xp [sum send_rows] (sorted by global expert) -> xl [rows] regrouped by
// local expert. scratch: [rows]. With ep 1 xl may be xp.
void ep_dispatch(Comm *c, const EpPlan *p, const void *xp, void *xl, void *scratch, size_t row_bytes);
// yl [rows] (regrouped order; dropped rows are zeroed first, in place)
// -> y [sum send_rows] in xp's order. scratch: [rows].
void ep_combine(Comm *c, const EpPlan *p, void *yl, void *y, void *scratch, size_t row_bytes);
// Zeroes the rows of yl that capacity dropped.
void ep_zero_dropped(const EpPlan *p, void *yl, size_t row_bytes);
