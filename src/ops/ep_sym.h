// Symmetric ("direct-write") expert parallelism (issue 15, DESIGN.md §6 and
// §11): the ops of a dispatch that writes each routed row straight into the
// owning rank's expert-contiguous receive buffer, and a combine that reads
// the expert outputs straight back, over a table of peer pointers. No
// host-visible split sizes, no permutation on either side, no host wait: the
// counts, offsets and capacity cut live in device memory from routing to the
// grouped GEMM. `parallel.ep_backend: a2a` (src/dist/ep.h) is the reference
// it must agree with; the model runs these ops (through the Ops table) with
// `parallel.ep_backend: symmetric` over dist/symmem.h's memory.
//
// Where the pointers come from. Rank r of an ep group of P ranks holds
// E_local = E / P experts (global expert g belongs to rank g / E_local). For
// every peer q (itself included) it has q's count window and q's buffers:
// on GPUs of one NVLink domain these are NCCL LSA pointers of windows
// registered with ncclCommWindowRegister (ncclGetLsaPointer of the device
// communicator); with virtual ranks (tests/ep_sym_harness.h) they are just
// the other logical ranks' allocations in the same memory. The ops below only
// see the table: P pointers, entry q = peer q's buffer; on CUDA the table
// itself is in device memory.
//
// Buffers of rank q (window memory, peers write or read them):
//   counts  int [P][E]      row s is written by source s: counts[s][g] =
//                           rows of s routed to global expert g (all E, not
//                           only q's experts, so that every rank can compute
//                           every owner's offsets without a second exchange)
//   recv    act [max_rows][C]  expert-contiguous: local expert e's rows are
//                           recv_offsets[e] .. recv_offsets[e+1], and inside
//                           them the blocks of sources 0, 1, ..., P-1, each
//                           in its source's row order (ep.h's regrouped
//                           order: expert, source rank, source order)
//   out     act [max_rows][C]  the experts' outputs in recv's order (the
//                           grouped GEMM's result; combine reads it)
// Local memory of rank r (only r reads it):
//   offsets int [E+1]       r's routed rows sorted by global expert
//                           (moe_route_index), xp [offsets[E]][C] their rows
//   plan    int [ep_sym_plan_ints]: send_base[E], send_keep[E],
//                           recv_offsets[E_local + 1] (below)
//
// Phases of one MoE layer (forward), per rank r:
//   a. route; offsets[E+1] (moe_route_index) — already on the device
//   b. ep_sym_write_counts: counts row r of every peer's window
//      BARRIER 1 (every row of r's window written before r reads it)
//   c. ep_sym_plan: from r's own window only, deterministically in source
//      order, for every global expert g (owner q, local expert e):
//        n_g      = sum_s counts[s][g]
//        cut_g    = min(n_g, capacity)        capacity = ceil(cf × tokens ×
//                                             k / E), tokens of the ep group;
//                                             0: no capacity (dropless)
//        then per owner q, if sum_e cut > max_rows (the receive buffer), the
//        largest c with sum_e min(cut, c) <= max_rows and cut = min(cut, c):
//        only the largest experts lose rows, and the buffer never overflows
//        (dropless with a bound instead of an out-of-memory)
//        seg_q[e] = sum_{e' < e} cut (q's recv_offsets)
//        before_s = sum_{s' < s} counts[s'][g]: source s keeps the first
//        clamp(cut_g - before_s, 0, counts[s][g]) rows of its block (the tail
//        in source order is dropped, as moe_capacity_drop on ep.c's
//        regrouped rows drops it) at slot seg_q[e] + min(before_s, cut_g)
//      r keeps send_base/send_keep for s = r and its own recv_offsets, and
//      adds the rows its experts drop, sum_e (n - cut), to dropped[0]
//   d. ep_sym_dispatch: each kept row xp[j] (expert g, i-th of its block) is
//      written to recv_q[send_base[g] + i] (pushes over NVLink); under
//      train.precision: fp8 the rows are FP8 payload rows (ops/fp8.h), moved
//      as fp8_payload_bytes(D) / act_bytes elements (model.c)
//      BARRIER 2 (every source's rows in r's recv before r's GEMM reads them)
//   e. grouped GEMM on recv with recv_offsets (the valid prefix
//      recv_offsets[E_local] <= max_rows), read where they are: out
//   BARRIER 3 (every owner's out written before sources read it)
//   f. ep_sym_combine: y[j] = out_q[send_base[g] + i] for kept rows, zero for
//      dropped ones (a pull, the mirror of d's push: the same slot of the same
//      row); the source then applies its routing weights in FP32 and sums the
//      top-k (unpermute_forward), as today
//   BARRIER 4, or the next phase-b barrier if the buffers are per layer: an
//      owner must not overwrite out (or recv) while a peer still reads it
//   Backward mirrors both with the same plan: the output grads dy go out
//   with ep_sym_dispatch (into peers' dout buffers, laid out as recv) —
//   BARRIER — the grouped GEMM backward on them — BARRIER — the input grads
//   come back with ep_sym_combine (dropped rows get zero grads; the rows a
//   source never sent get none). recv itself is kept per layer for the
//   weight grads (it is the layer's saved xl).
//
// On GPUs a barrier is an LSA barrier of the device communicator
// (ncclLsaBarrierSession arrive/wait, in a kernel of its own or at the end
// of the writing kernel), ordered on the compute stream, so the whole layer
// stays one stream of kernels and captures as a CUDA graph. With virtual
// ranks on one device (or the CPU harness) the host issues the phases rank
// by rank, phase by phase, on one stream: stream order is the barrier.
//
// Determinism: all offsets are integer prefix sums in source order; a row's
// slot depends only on the counts, never on timing; dispatch and combine are
// copies, so the rows an owner receives are bit-identical to ep.c's.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// Ints of a plan for E global experts over P ranks.
static inline size_t ep_sym_plan_ints(int P, int E) { return 2 * (size_t)E + (size_t)(E / P) + 1; }
// The plan's parts: where this rank's rows of global expert g go in their
// owner's recv (send_base[g]), how many of them are kept (send_keep[g]), and
// this rank's receive segments (recv_offsets[E/P + 1]).
static inline int *ep_sym_send_base(int *plan, int E) { return plan; }
static inline int *ep_sym_send_keep(int *plan, int E) { return plan + E; }
static inline int *ep_sym_recv_offsets(int *plan, int E) { return plan + 2 * (size_t)E; }

// The CPU reference (ep_sym_cpu.c): host pointers, act = float. The CUDA
// twins (src/ops/cuda/ep_sym.cu, cuda_ep_sym_*) take the same arguments in
// device memory (the pointer tables included), act = BF16, all on
// cuda_stream(), no host synchronisation.
//
// b: counts row `rank` of every peer's window: windows[q][rank*E + g] =
// offsets[g+1] - offsets[g].
void ep_sym_cpu_write_counts(int *const *windows, const int *offsets, int P, int rank, int E);
// c: the plan from this rank's window counts[P][E] (phase c above);
// capacity 0 = none; dropped (may be NULL) += the rows this rank's experts drop.
void ep_sym_cpu_plan(int *plan, float *dropped, const int *counts, int P, int rank, int E, int capacity,
                     int max_rows);
// d: recv[q] = peer q's receive buffer; xp [R][C] this rank's routed rows in
// expert order (R = N × k, known to the host; the first offsets[E] <= R move).
void ep_sym_cpu_dispatch(void *const *recv, const int *plan, const int *offsets, const void *xp, int P, int E,
                         int R, int C);
// f: y [R][C] (xp's order) from out[q] = peer q's output buffer; rows this
// rank's plan dropped are zeroed (rows from offsets[E] on are untouched).
void ep_sym_cpu_combine(void *y, void *const *out, const int *plan, const int *offsets, int P, int E, int R,
                        int C);

#ifdef MOECORE_CUDA
void cuda_ep_sym_write_counts(int *const *windows, const int *offsets, int P, int rank, int E);
void cuda_ep_sym_plan(int *plan, float *dropped, const int *counts, int P, int rank, int E, int capacity,
                      int max_rows);
void cuda_ep_sym_dispatch(void *const *recv, const int *plan, const int *offsets, const void *xp, int P, int E,
                          int R, int C);
void cuda_ep_sym_combine(void *y, void *const *out, const int *plan, const int *offsets, int P, int E, int R,
                         int C);
#endif

#ifdef __cplusplus
}
#endif
