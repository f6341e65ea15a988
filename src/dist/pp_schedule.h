// Pipeline-parallel schedules (issue 17): which action each pipeline rank
// runs in each time slot, generated once from (pp, micro-batches, virtual
// chunks, kind), checked by simulating it, and printed as a grid.
//
// The table is the whole schedule; it holds no model code. Rank p's row, read
// left to right with the idle slots skipped, is the order in which p runs its
// actions: for each one, receive its input (recv_from), compute, send its
// output (send_to). Slots are lock-step steps of one action each: every
// cross-rank dependency of an action sits in a strictly earlier slot, so a
// rank that blocks on its receives and never blocks on its sends cannot
// deadlock. Real durations differ (a backward costs about two forwards);
// pp_schedule_validate replays the rows with per-action costs.
//
// Stages: with v chunks per rank there are V = v * pp virtual stages, and
// chunk c of rank p holds virtual stage c * pp + p (Megatron's layout), so
// stage s lives on rank s % pp. F(m, c) needs F(m) of stage s - 1; B(m, c)
// (full backward) and Bi(m, c) (input-grad only) need F(m, c) and the grad
// from stage s + 1; W(m, c) (the deferred weight grad) needs Bi(m, c).
#pragma once
#include <stddef.h>
#include <stdio.h>

#define PP_MAX_RANKS 64

typedef enum { PP_GPIPE, PP_1F1B, PP_INTERLEAVED, PP_ZB1 } PPScheduleKind;

typedef enum { PP_IDLE = 0, PP_F, PP_B, PP_BI, PP_W } PPActionKind;

typedef struct {
    PPActionKind kind;
    int mb, chunk;  // micro-batch, model chunk on this rank
    int stage;      // virtual stage: chunk * pp + rank
    int recv_from;  // rank whose output this action needs first (activation for F, grad for B/Bi); -1: none
    int send_to;    // rank this action's output goes to after it; -1: none. Equal to the
                    // own rank when consecutive stages share it (pp 1 with chunks): a local hand-off
} PPAction;

typedef struct {
    PPScheduleKind kind;
    int pp, micro, virt;  // ranks, micro-batches per step, chunks per rank
    int n_slots;
    PPAction *table;      // [pp][n_slots], row-major; kind PP_IDLE where a rank waits
} PPSchedule;

// Durations of one whole rank's share of the model (v chunks together); a
// chunk's action takes 1/v of it. Communication is free in the simulation.
typedef struct {
    double f, b, bi, w;
} PPCosts;

typedef struct {
    double makespan;               // end of the last action, all ranks starting at 0
    double busy[PP_MAX_RANKS];     // compute time of each rank
    double idle[PP_MAX_RANKS];     // each rank's idle time between its first and last action
    int peak_inflight[PP_MAX_RANKS];  // most (micro-batch, chunk) activation sets held at once:
                                      // forwarded and not yet fully backwarded (B, or W after Bi)
    double bubble_fraction;        // 1 - sum(busy) / (pp * makespan): the step's idle share
} PPSimResult;

// The unit costs of the tests and the README: F 1, B 2, Bi 1, W 1.
PPCosts pp_costs_unit(void);

const char *pp_schedule_kind_name(PPScheduleKind kind);  // "gpipe", "1f1b", "interleaved", "zb1"
// 0 on success; -1 (with a message listing the names) for an unknown name.
int pp_schedule_kind_parse(const char *name, PPScheduleKind *kind, char *err, size_t errlen);

// Builds the table. Refuses, with a message naming the value: pp outside
// 1..PP_MAX_RANKS, micro < 1, virt != 1 except for interleaved, interleaved
// with virt < 2 or micro % pp != 0. Returns 0 or -1.
int pp_schedule_build(PPSchedule *s, PPScheduleKind kind, int pp, int micro, int virt, char *err, size_t errlen);
void pp_schedule_free(PPSchedule *s);

static inline PPAction *pp_schedule_at(const PPSchedule *s, int rank, int slot) {
    return &s->table[(size_t)rank * s->n_slots + slot];
}

// Checks the table: every (micro-batch, chunk) forwarded once and backwarded
// once (B, or Bi then W) on the rank that holds its stage, the sends and
// receives each action names, and every dependency in an earlier slot. Then
// replays each row with the costs and fills *out (may be NULL). Returns 0,
// or -1 with the first violation (rank, slot, action) in err.
int pp_schedule_validate(const PPSchedule *s, PPCosts costs, PPSimResult *out, char *err, size_t errlen);

// The slot in which the output of rank's action at slot t is received: the
// slot of the action on rank a->send_to that takes it (F of the same
// micro-batch on the next stage for a forward, its B or Bi on the previous
// stage for a backward). -1 when the action sends nothing.
int pp_schedule_recv_slot(const PPSchedule *s, int rank, int t);

// When a rank issues its hand-offs (over NCCL, train/pipeline.c):
// PP_P2P_EAGER sends each output right after its action and receives each
// input right before it, one call each; PP_P2P_AT_RECEIVER issues, at every
// slot u, one group holding the sends whose receiver takes them at u and this
// rank's own receive of u (idle slots too).
typedef enum { PP_P2P_EAGER, PP_P2P_AT_RECEIVER } PPP2POrder;

// Over NCCL, point-to-point messages between two ranks match in call order,
// not by tag, and a rank's calls (groups) complete one after another, each
// only once its partners are posted. Replays the table's hand-offs under
// that model in the given order: returns 0 when every message meets the one
// it is meant for and every rank's calls complete, else -1 with the first
// mismatched pair or the calls each stuck rank waits in (a deadlock).
int pp_schedule_check_p2p(const PPSchedule *s, PPP2POrder order, char *err, size_t errlen);

// The theory's bubble fraction (idle share of the step) for uniform stages:
// gpipe and 1f1b (pp-1)/(m+pp-1); interleaved (pp-1)/(v*m+pp-1), the bubble
// time (pp-1)(f+b) divided by v; zb1 (pp-1)(f+bi-w) / (m(f+bi+w) + (pp-1)(f+bi-w))
// (Qi et al. 2023, which holds for m >= pp and w <= f + bi).
double pp_schedule_theory_bubble(PPScheduleKind kind, int pp, int micro, int virt, PPCosts costs);

// The grid: one row per rank, one column per slot; cells F3, B1, Bi2, W0
// (with chunk: F3c1), '.' idle.
void pp_schedule_print(FILE *f, const PPSchedule *s);

// `moecore schedule --pp N --micro M --kind K [--virtual V]`: the grid, the
// simulated bubble per rank and the theory.
int cmd_schedule(int argc, char **argv);
