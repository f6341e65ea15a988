// Expert parallelism (parallel.ep_backend: a2a): dispatch routed rows to the
// rank that owns their expert, and combine the expert outputs back, with
// all-to-alls whose split sizes the host knows (Megatron's all-to-all
// dispatcher; the baseline for a sync-free dispatch).
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
// Rows live in the backend's memory (host on CPU, device on CUDA) and move
// through the communicator on those pointers and through the Ops row gather
// (permute_forward), so the same code runs on both. The counts are computed
// and exchanged where the routing left them (backend memory) and copied to
// the host once per plan: the split sizes of the row exchanges. The host
// then builds the regroup maps and copies them, with the local segments, to
// the backend.
//
// Capacity is not the plan's business: the caller drops the tail of each
// local expert's rows with moe_capacity_drop on local_offsets_b (the same
// rows as dropping by (source rank, source order), since that is the
// regrouped order).
#pragma once
#include <stddef.h>

#include "dist/comm.h"
#include "ops/ops.h"

typedef struct {
    int ep, E_local;
    size_t *send_rows, *recv_rows;  // [ep] rows this rank sends to / receives from each rank
    size_t *per_rank;               // [ep] E_local each: the sizes of the count exchange
    // host
    int *send_counts;               // [ep][E_local]: rows to rank r for its local expert e
    int *recv_counts;               // [ep][E_local]: rows from rank s for local expert e (follows send_counts)
    int *local_offsets;             // [E_local + 1] segments of the regrouped rows
    int *local_to_recv;             // [rows]: received-order row of each regrouped row (follows local_offsets)
    int *recv_to_local;             // [rows]: its inverse (follows local_to_recv)
    // the same arrays in backend memory (the counts: [2][ep][E_local])
    int *counts_b, *local_offsets_b, *local_to_recv_b, *recv_to_local_b;
    int rows;                       // rows received (= regrouped)
} EpPlan;

// Ints of storage a plan needs for at most max_rows received rows, on the
// host and again in backend memory; size_t entries for its sizes.
size_t ep_plan_ints(int ep, int E_local, int max_rows);
size_t ep_plan_sizes(int ep);
// Carves a plan's arrays from host ints, backend ints (ep_plan_ints of each)
// and sizes (ep_plan_sizes).
void ep_plan_carve(EpPlan *p, int ep, int E_local, int max_rows, int *host_ints, int *backend_ints,
                   size_t *sizes);
// From this rank's global-expert offsets [E+1] (E = ep * E_local, backend
// memory): exchange the counts and fill the plan. The host waits here, once.
void ep_plan(Comm *c, const Ops *ops, EpPlan *p, const int *offsets);
// Rows this rank sends (its routed rows, sum of send_rows).
size_t ep_sent_rows(const EpPlan *p);
// The exchange alone, for rows of any width: row_bytes bytes a row, xp
// [sum send_rows] (sorted by global expert) -> recv [rows] in the received
// order (source rank, then the source's order).
void ep_exchange(Comm *c, const EpPlan *p, const void *xp, void *recv, size_t row_bytes);
// Rows are C act elements wide, in backend memory.
// xp [sum send_rows] (sorted by global expert) -> xl [rows] regrouped by
// local expert. scratch: [rows].
void ep_dispatch(Comm *c, const Ops *ops, const EpPlan *p, const void *xp, void *xl, void *scratch, int C);
// train.precision: fp8: rows quantised 1 x 128 at their source (q [sum
// send_rows, C] bytes, s their scales, in xp's order) -> ql [rows, C], sl
// regrouped by local expert, as ep_dispatch would move and regroup the
// unquantised rows. A 1 x 128 tile lies inside one row, so these are the
// codes and scales the rows would get if quantised after the dispatch.
// Each row travels as one payload row of fp8_payload_bytes(C) bytes
// (ops/fp8.h: the codes, then the scales), packed into send [sum
// send_rows] and received into recv [rows]; the unpack regroups.
void ep_dispatch_fp8(Comm *c, const Ops *ops, const EpPlan *p, const uint8_t *q, const float *s, uint8_t *ql,
                     float *sl, void *send, void *recv, int C);
// yl [rows] (regrouped order) -> y [sum send_rows] in xp's order. scratch: [rows].
void ep_combine(Comm *c, const Ops *ops, const EpPlan *p, const void *yl, void *y, void *scratch, int C);
