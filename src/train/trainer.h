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
#include "model/model.h"
#include "optim/adamw.h"
#include "train/metrics.h"
#include "train/train.h"
#include "util/tfevents.h"

// Rank 0 of the job prints; the number of ranks (set by train_run).
extern int train_rank0, train_world_size;
#define SAY(...) do { if (train_rank0) { printf(__VA_ARGS__); fflush(stdout); } } while (0)

// Everything one training process holds, from set-up to teardown.
typedef struct {
    RunConfig cfg;
    const char *config_path;
    int resume, overwrite;     // --resume, --overwrite
    char resumed[CFG_PATH_MAX + 64]; // the checkpoint this run resumed from ("" none)
    int lock_fd[2];            // rank 0's locks on logging.run_dir and checkpoint.dir (-1 none)
    int64_t stop_after;        // --stop-after (0: run to train.steps)
    TrainOptions opt;          // bench's
    Comm *world;               // MPI's (or one rank), or the NCCL world of a GPU job
    LaunchInfo launch;         // how this process was started (dist/launch.h)
    const Ops *ops;
    Mesh mesh;
    int T, G, MB, G_local, M, M_total;  // sequence, global batch, micro-batch; per rank; micro-batches
    DataLoader *train, *eval;
    Model m;
    Ddp ddp;
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
    // the CUDA graphs of one micro-batch's forward + backward: [1] for
    // micro-batches with document boundaries (data.doc_mask), [0] without
    int use_graph, graph_tries[2];
    void *graph[2];
    float graph_scale[2];
    double peak_dev_mib;
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

// train_report.c
double peak_rss_mib(void);
void fmt_duration(char *buf, size_t n, double s);
json_object *run_info_json(const Trainer *tr);
// Sets tr->peak and tr->fpt, prints the header (rank 0; every rank its memory line).
void print_header(Trainer *tr);
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
