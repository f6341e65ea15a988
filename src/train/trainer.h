// The training process's state, shared by train.c (set-up, steps, loop,
// teardown) and train_report.c (what the run prints and records). Private
// to src/train/.
#pragma once
#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>

#include "ckpt/checkpoint.h"
#include "config/config.h"
#include "data/data.h"
#include "dist/comm.h"
#include "dist/ddp.h"
#include "dist/launch.h"
#include "dist/mesh.h"
#include "dist/pp_schedule.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "train/metrics.h"
#include "train/train.h"
#include "util/tfevents.h"

// Rank 0 of the job prints; the number of ranks (set by train_run).
extern int train_rank0, train_world_size;
#define SAY(...) do { if (train_rank0) { printf(__VA_ARGS__); fflush(stdout); } } while (0)

// Pipeline parallelism (pipeline.c, issue 17): the stage this rank holds,
// the schedule's table, the activation slots of the micro-batches in
// flight, the sends outstanding, and the timing of the last step.
typedef struct {
    int on;                    // parallel.pp > 1
    int pp, rank, virt, n_stages;
    int split[PP_MAX_RANKS * PARAM_MAX_CHUNKS]; // layers of each virtual stage
    ParamStage stage;          // this rank's chunks
    PPSchedule sched;
    double theory;             // the schedule's bubble fraction in theory (pp_schedule_theory_bubble, unit costs)
    int n_slots;               // activation slots: the most micro-batches this rank's row keeps in flight
    int *slot_of, *chunks_open, *slot_used; // [micro], [micro], [n_slots]
    CommReq **slot_reqs;       // [n_slots * virt]: the forward output sends of each slot's chunks
    void **grad_buf;           // pooled send buffers of input grads, each with its request
    CommReq **grad_req;
    int n_grad_buf;
    size_t msg_bytes;          // one micro-batch's residual stream
    // CPU ranks: the next action's input, received ahead into a staging
    // buffer while this action computes (pipeline.c, post_next_recv)
    void *pre_buf;
    CommReq *pre_req;
    int pre_slot;              // the schedule slot it belongs to (-1: none posted)
    // GPU ranks (and CPU ranks with MOECORE_PP_HANDOFF=receiver): every send
    // waits for the slot in which its receiver takes it and goes out in that
    // slot's group with this rank's own receive (pipeline.c, exchange)
    int at_receiver;
    int *recv_slot;            // [schedule slots]: pp_schedule_recv_slot of this rank's actions
    struct PPPending { int u, grad, idx, dst; void *buf; } *pend; // sends not yet issued
    int n_pend;
    int *grad_pending;         // [n_grad_buf]: the buffer holds a send not yet issued
    // messages to / from each pipeline rank so far: over MPI their tags in
    // this mode, so that messages meet in call order as over NCCL
    unsigned n_sent[PP_MAX_RANKS], n_recv[PP_MAX_RANKS];
    // the last step, from a common start (a barrier of the pipeline group)
    double busy_s, span_s;     // this rank: compute time; its first action's start to its last's end
    double bubble;             // 1 - sum of busy / (pp x the step's makespan), over the pipeline group
    double bubble_sim;         // the table replayed with the step's mean action times, hand-offs free
    double idle[PP_MAX_RANKS]; // each rank's idle share between its first and last action
    double wait[PP_MAX_RANKS]; // of that span, the share in blocking receives (waiting for a peer)
    double other[PP_MAX_RANKS]; // and the share in neither compute nor receives (slot switches, batch upload, send setup, grad copy)
} Pipeline;

// Everything one training process holds, from set-up to teardown.
typedef struct {
    RunConfig cfg;
    const char *config_path;
    int resume, overwrite;     // --resume, --overwrite
    char resumed[CFG_PATH_MAX + 64]; // the checkpoint this run resumed from ("" none)
    int lock_fd[2];            // rank 0's locks on logging.run_dir and checkpoint.dir (-1 none)
    int64_t stop_after;        // --stop-after (0: run to train.steps)
    int print_schedule;        // --print-schedule: print the pipeline schedule's table at start
    TrainOptions opt;          // bench's
    Comm *world;               // MPI's (or one rank), or the NCCL world of a GPU job
    LaunchInfo launch;         // how this process was started (dist/launch.h)
    const Ops *ops;
    Mesh mesh;
    int T, G, MB, G_local, M, M_total;  // sequence, global batch, micro-batch; per rank; micro-batches
    DataLoader *train, *eval;
    Model m;
    Ddp ddp;
    Pipeline pipe;
    AdamW adamw;
    CkptLayout layout;
    TrainState st;
    int *tokens, *targets;     // this rank's slice of a step's batch [G_local, T]
    char *config_yaml;         // the resolved config, saved in the run dir and in checkpoints
    FILE *metrics;             // rank 0
    TfEvents *tb;              // logging.tensorboard (rank 0)
    double peak, fpt;          // MFU denominator (TFLOP/s; 0: unknown, no MFU), useful FLOPs per token
    char peak_source[1400];    // where the MFU denominator came from (rank 0)
    // per-step statistics, MoE layers L x experts E
    int L, E;
    double *red, *lb_step, *z_step, *maxload;
    float *counts_host;
    int *gflags;
    Gerrymander gm;
    // the CUDA graphs of one micro-batch's forward + backward, indexed
    // docs + 2 first + 4 last: docs = 1 for micro-batches with document
    // boundaries (data.doc_mask), first = 1 for a step's first backward,
    // which writes the expert grads (=) where the later ones add to them
    // (+=), last = 1 for its last, which also sums their squares for the
    // grad norm where the model has the slots for it (Model.wgrad_slots)
    int use_graph, graph_tries[8];
    void *graph[8];
    float graph_scale[8];
    double peak_dev_mib;
    double start_dev_mib;      // GPU memory in use before the first allocation (the CUDA context)
    double mem_plan_mib[2];    // this rank's memory plan (train/memory.h): steady, peak
    int run_info_written;      // the first metrics record of this process carries the run's description
    int nonfinite_run;         // consecutive steps with a non-finite loss or grad norm, up to now
    int64_t saved_step;        // the newest step committed by or resumed from in this process (-1 none)
} Trainer;

// What one optimizer step produced.
typedef struct {
    int64_t step;              // 0-based index of the step
    double lr, loss, ce, lb_raw, z_raw, gnorm, clip_scale, dt;
    int skipped;
    int nonfinite;             // loss or grad norm NaN or Inf (the step is skipped)
} StepResult;

// pipeline.c. pipeline_plan: the split, this rank's stage and the schedule
// (before the model is built); pipeline_alloc: the slots' bookkeeping
// (after). pipeline_step runs this rank's row of the table for the step's
// micro-batches (tr->tokens), ce_scale as model_backward's; pipeline_eval
// runs one micro-batch's forward through the stages (the CE on the last).
int pipeline_plan(Trainer *tr, int print_schedule, char *err, size_t errlen);
// The part of it that needs no trainer (the planner's too): the split of
// run config cfg's layers into pp x pp_virtual stages (split), pipeline rank
// rank's chunks (st), the schedule of M micro-batches (built: free it) and
// the activation slots the rank holds at most (n_slots).
int pipeline_rank_layout(const RunConfig *cfg, int M, int rank, int *split, ParamStage *st, PPSchedule *sched,
                         int *n_slots, char *err, size_t errlen);
void pipeline_alloc(Trainer *tr);
void pipeline_step(Trainer *tr, int64_t step, float ce_scale);
void pipeline_eval(Trainer *tr, const int *tokens, const int *targets, uint64_t route_seed);
void pipeline_free(Pipeline *pl, const Ops *ops);
// train.c: the routing seed of micro-batch mi (of this rank's M) of a step.
uint64_t train_micro_seed(const Trainer *tr, int64_t step, int mi);

// train_report.c
double peak_rss_mib(void);
void fmt_duration(char *buf, size_t n, double s);
json_object *run_info_json(const Trainer *tr);
// Sets tr->peak and tr->fpt, prints the header (rank 0; every rank its memory line).
void print_header(Trainer *tr);
// Every rank's measured memory beside its plan, at the end of a run.
void print_memory_measured(const Trainer *tr);
// The step's metrics.jsonl record; fills the per-layer loads, the worst
// max/mean load, dropped and routed rows, and whether gerrymandering is flagged.
json_object *step_record(Trainer *tr, const StepResult *r, double *worst_max, double *dropped_total,
                         double *rows_total, int *flagged);
// JSON has no NaN or Inf (json-c would print a bare NaN): every non-finite
// number of record o becomes null, and o's "nonfinite" lists their keys.
void record_null_nonfinite(json_object *o);
void print_step_line(const Trainer *tr, const StepResult *r, double avg_tps, double eta_s, double worst_max,
                     double dropped_total, double rows_total, int flagged);

// tensorboard.c: a metrics.jsonl record as one event of scalars. -1 with a
// message when the write fails.
int tb_write_record(TfEvents *w, const ModelConfig *c, json_object *rec, char *err, size_t errlen);
