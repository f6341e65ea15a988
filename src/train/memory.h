// Memory accounting (DESIGN.md §4): the bytes one rank holds, by category,
// computed from the model config and the layout alone, so that the same
// numbers can be printed by a run at start and checked by a test for
// layouts no test machine has.
//
// Per parameter a rank holds: its compute weight (act_bytes: 2 for BF16, 4
// for FP32), its FP32 grad (4), and, for the parameters in its optimizer
// range, an FP32 main weight (4) and two FP32 AdamW moments (8). With the
// distributed optimizer that range is the rank's 1/D shard of its group
// (D = dp for dense parameters, ep_dp for expert ones, which ep has already
// divided), so a BF16 rank holds 6 + 12/D bytes per parameter. An FP32
// compute weight is the main weight (the CPU keeps one buffer), so an FP32
// rank holds 4 + 4 + 8/D.
#pragma once
#include <stddef.h>
#include <stdio.h>

#include "config/config.h"
#include "config/model_config.h"
#include "model/model.h"
#include "params/layout.h"

typedef struct {
    int dp, dp_rank;            // the dense data-parallel group: size, this rank's index in it
    int ep, ep_dp, ep_dp_rank;  // expert parallelism; the expert data-parallel group
    int sharded;                // optim.sharded
    size_t act_bytes;           // bytes per compute weight; 4 (FP32): the main weights are the compute weights
    size_t arena_bytes;         // the activation arena (0: not known); with the all-to-all dispatch
                                // it holds the expert-parallel receive buffers too
    size_t dispatch_bytes;      // symmetric expert parallelism: its symmetric memory (model.h)
    const ParamStage *stage;    // a pipeline stage's tensors only (NULL: the whole model)
    // The rest of what a run allocates (memory_plan fills the categories
    // below only with ops set; the initializers above leave them 0):
    const Ops *ops;             // the backend: with it, the arena and the dispatch come from
                                // model_arena_plan (arena_bytes / dispatch_bytes must then be 0)
    ModelArenaSpec act;         // the activations (act.stage and act.ep are taken from above)
    int gpu;                    // device memory: kernel workspaces and the context allowance count
    size_t context_bytes;       // the stated CUDA context + allocator allowance (gpu)
    size_t nccl_bytes;          // the stated NCCL buffers of each communicator of more than one rank (gpu)
    int n_comms;                // such communicators of this rank (dp, ep, ep_dp, pp groups)
    int pp, pp_rank, micro;     // pipeline: stages, this rank's, micro-batches per step (the send buffers)
} MemoryLayout;

typedef struct {
    size_t dense, expert;           // parameters held (expert: E/ep of the experts)
    int tensors;                    // parameter tensors held (the optimizer launches one update each)
    size_t dense_opt, expert_opt;   // of which in the optimizer's range (moments)
    size_t dense_main, expert_main; // of which with an FP32 main weight of their own
    int dense_div, expert_div;      // the optimizer range's divisor (1: not sharded)
    // bytes by category
    size_t compute_weights, grads, main_weights, moments;
    size_t comm;                    // the reduced-grad shard of the distributed optimizer
    size_t arena;                   // activations (0: not known)
    size_t dispatch;                // symmetric memory of the expert dispatch (0: none)
    size_t other;                   // the aux-free router bias
    // with MemoryLayout.ops (else 0)
    size_t small;                   // the model's router statistics and loss sums, DDP's norm accumulator
    size_t pipe;                    // pipeline: the grad send buffers (at most one per slot)
    size_t workspace;               // kernel workspaces (cuBLASLt's, the sort and reduction scratch)
    size_t context;                 // CUDA context and allocator allowance (stated), NCCL buffers
    size_t slot_bytes;              // of the arena, each activation slot
    int n_slots;                    // activation slots (micro-batches in flight)
    // the peak: the steady state (memory_total), or setup's, where the
    // distributed optimizer's main-weight shard is copied out of the whole
    // FP32 weights before they are freed (before the arena: train.c); on
    // CPU ranks with ep > 1 setup also draws the whole model on the CPU
    // beside the stage's
    size_t setup_peak, peak;
    size_t setup_late;              // set-up's phases after the whole model (CPU ep > 1) is freed, without workspace and context
    size_t fp8_weights;             // train.precision: fp8: the expert weights' E4M3 copies (forward and transposed) and their 128x128 scales
    size_t fp8_dense_weights;       // fp8.gemms: experts_dense: the dense GEMMs' weights likewise (beside their compute weights)
} MemoryPlan;

// The plan of this rank of layout l for model cfg (validated). -1 with a
// message when the layout does not fit the model.
int memory_plan(MemoryPlan *p, const ModelConfig *cfg, const MemoryLayout *l, char *err, size_t errlen);
// The layout of one rank of run config cfg (validated) on backend ops:
// its dp and ep_dp group indices, its pipeline stage (NULL: none) with
// n_slots activation slots, M micro-batches per step; gpu: device memory
// (context allowance MEMORY_CONTEXT_MIB, NCCL buffers: set n_comms).
void memory_layout_for_run(MemoryLayout *l, const RunConfig *cfg, const Ops *ops, int dp_rank, int ep_dp_rank,
                           const ParamStage *stage, int n_slots, int M, int gpu);
// compute weights + grads + main weights + moments, per parameter held.
// train.precision: fp8 (model_set_fp8), after memory_plan: the expert
// weights' FP8 copies and 128x128 block scales, which replace their compute
// weights where those are a separate copy (not the FP32 main weights); with
// fp8.gemms: experts_dense (l->act.fp8_dense) the dense GEMMs' FP8 copies
// too, which do not replace theirs (model.h).
void memory_plan_fp8(MemoryPlan *p, const ModelConfig *cfg, const MemoryLayout *l);
// compute weights (and FP8 weights) + grads + main weights + moments, per parameter held.
double memory_bytes_per_param(const MemoryPlan *p);
size_t memory_total(const MemoryPlan *p);
// The planner's and the trainer's figures for the GPU context (MiB): the
// allowance stated for a kind of GPU (configs/gpus/*.yaml), and the
// NCCL buffers per communicator of more than one rank.
#define MEMORY_NCCL_MIB_DEFAULT 256.0
#define MEMORY_CONTEXT_MIB 527.0 // measured on the H200 (configs/gpus/h200.yaml)
// The second line: every category in MiB and the peak.
void memory_print_plan(FILE *f, int rank, const MemoryPlan *p);
// One line: "rank R: memory: ...", every number with its unit.
void memory_print(FILE *f, int rank, const MemoryPlan *p);
