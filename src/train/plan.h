// `moecore plan`: every layout of a run config on N GPUs of one kind, its
// per-GPU memory from the trainer's own memory model (train/memory.h) and
// its step time from a rates file (configs/gpus/*.yaml), ranked by
// predicted tokens/s per GPU (README "Planning a layout").
#pragma once
#include <stddef.h>
#include <stdio.h>

#include "config/config.h"
#include "train/memory.h"

// A kind of GPU: memory, the effective rates of our kernels (H200: measured;
// others scaled from it, see gpu_spec_load), the links.
typedef struct {
    char name[64];
    char source[512];          // where the rates come from (measured: commit, date; or scaled)
    double memory_gib;         // usable device memory
    double context_mib;        // CUDA context + allocator allowance
    double nccl_mib;           // NCCL buffers per communicator of more than one rank
    double bf16_peak, fp8_peak; // dense datasheet peaks, TFLOP/s (the MFU denominator: BF16)
    double hbm_gbs;            // datasheet memory bandwidth
    // effective rates, TFLOP/s or GB/s
    double gemm, fp8_gemm;     // dense GEMMs (cuBLASLt) BF16, FP8
    double grouped_fwd, grouped_dgrad, fp8_grouped; // expert GEMMs at grouped_rows rows per expert
    double copy_gbs;           // device-to-device copy (the weight-grads' FP32 accumulation)
    double grouped_rows;       // the rows per expert of those rates
    double grouped_half_rows;  // the rows per expert where the grouped rate is half its large-segment value
    double attn_fwd, attn_bwd; // causal attention
    double membw;              // memory-bound kernels
    double optim_gbs;          // AdamW, grad zeroing and norms
    double op_floor_us;        // the least time of one kernel
    double step_host_us;       // per optimizer step, beside the kernels: the host's fixed work (graph launch, the
                               // loss read, the optimizer's loop)
    // links, GB/s per GPU per direction
    double nvlink_gbs, ib_gbs;
    double overlap;            // share of the gradient reduction hidden behind the backward
} GpuSpec;

// Loads a flat "key: value" file; "scale_from: NAME" takes the rates of
// configs/gpus/NAME.yaml scaled by this GPU's peaks (compute rates by
// bf16_peak / theirs, FP8 by fp8_peak, memory-bound by hbm_gbs).
int gpu_spec_load(GpuSpec *g, const char *path, char *err, size_t errlen);
// configs/gpus/NAME.yaml below the working directory or beside the binary's.
int gpu_spec_find(char *path, size_t n, const char *name, char *err, size_t errlen);

typedef struct {
    int dp, ep, pp, virt, sched;   // sched: PPScheduleKind (pp > 1)
    int sharded, recompute, norms, mb, fp8; // norms: train.recompute_norms
    int attn, swiglu;              // train.recompute_attention, train.recompute_swiglu
} PlanLayout;

typedef struct {
    PlanLayout lay;
    int M;                         // micro-batches per step per dp replica
    MemoryPlan mem;                // the worst pipeline rank's
    int mem_rank;
    double recv_factor;            // symmetric receive rows / rows routed, when cut to fit (0: the bound)
    double peak_gib;
    int fits;
    // seconds per optimizer step, on the slowest pipeline rank
    double t_expert, t_attn, t_dense, t_elem, t_floor, t_recompute; // compute, per step (all micro-batches)
    double t_ep;                   // expert-parallel dispatch + combine
    double t_pp_comm;              // stage-to-stage sends
    double bubble;                 // the schedule's bubble fraction
    double t_bubble;
    double t_dp, t_dp_exposed;     // gradient reduction (+ all-gather), and the part not hidden
    double t_optim;
    double t_host;             // the host's fixed work per step (GpuSpec.step_host_us)
    double t_step, tokens_s_gpu, tflops_gpu, mfu;
    const char *dominant;
} PlanResult;

typedef struct {
    const RunConfig *cfg;
    const GpuSpec *gpu;
    int gpus, gpus_per_node;
} PlanInput;

// One layout: memory and time. -1 with a message when the layout cannot run
// the config at all (e.g. ep does not divide the experts).
int plan_layout(const PlanInput *in, const PlanLayout *lay, PlanResult *r, char *err, size_t errlen);
// "dp8/ep8/pp4/v1/1f1b/sharded/layers/mb2/bf16" and back; given (may be
// NULL): the PL_* bits of the parts s names (the rest are defaults)
enum { PL_DP = 1, PL_EP = 2, PL_PP = 4, PL_V = 8, PL_SCHED = 16, PL_SHARDED = 32, PL_RC = 64, PL_MB = 128, PL_PREC = 256, PL_NORMS = 512,
       PL_ATTN = 1024, PL_SWIGLU = 2048 };
void plan_layout_name(const PlanLayout *lay, char *buf, size_t n);
int plan_layout_parse(PlanLayout *lay, const char *s, unsigned *given, char *err, size_t errlen);
void plan_explain(FILE *f, const PlanInput *in, const PlanResult *r);

int cmd_plan(int argc, char **argv);
