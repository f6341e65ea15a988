// Multi-group data parallelism (DESIGN.md §3): dense grads reduce over the
// dp group, expert grads over ep_dp. Grads are reduced in fixed-size
// buckets in reverse table order, each started (non-blocking) as soon as
// the last micro-batch's backward has made all its tensors final, and all
// waited for before the optimizer. Earlier micro-batches communicate
// nothing.
//
// Each class buffer is split into one contiguous shard per rank of its
// group. With the distributed optimizer (sharded) the buckets are
// reduce-scattered, so a rank only receives the summed grads of its shard,
// keeps FP32 main weights and moments for it alone (where the compute
// weights are a separate BF16 copy; FP32 compute weights are the main
// weights and stay whole), updates it, and all-gathers the updated compute
// weights (BF16 on the GPU, FP32 on the CPU). Without it the buckets are all-reduced and every rank
// updates the whole buffer. Either way the shards partition the global
// parameters, which makes the grad norm and checkpoint byte ranges a sum
// over ranks with nothing counted twice.
#pragma once
#include <stddef.h>

#include "dist/comm.h"
#include "params/store.h"

typedef struct {
    int cls;
    size_t lo, hi;            // element range of its class buffer
    int first, end;           // table entries [first, end) it covers
    int pending;              // entries not yet final
    CommReq *req;
    int launched;
} Bucket;

typedef struct {
    ParamStore *store;
    Comm *group[N_CLASSES];   // dense: dp, expert: ep_dp
    Comm *world;
    int sharded;
    size_t shard_begin[N_CLASSES], shard_end[N_CLASSES];
    size_t *shard_counts[N_CLASSES];  // per rank of the class group
    size_t *shard_act_bytes[N_CLASSES]; // the same in bytes of compute weights
    float *grad_shard[N_CLASSES];     // sharded: the reduced grads of this rank's shard
    Bucket *buckets;
    int n_buckets, next_launch;
    int *entry_bucket;                // table entry -> bucket
    double *norm_acc;                 // backend scalar for the grad norm
    // The expert grads' share of the norm from the slots the last backward
    // filled (Model.wgrad_slots), when set: ddp_use_wgrad_slots.
    const double *expert_slots;
    size_t n_expert_slots;
} Ddp;

// The shard [begin, end) of rank r of n of a class buffer of total elements.
void ddp_shard_range(size_t total, int n, int r, size_t *begin, size_t *end);
// bucket_elems: target bucket size in elements (tensors are never split).
// With sharded, the store keeps main weights for this rank's shards only.
void ddp_init(Ddp *d, ParamStore *s, Comm *dense_group, Comm *expert_group, Comm *world, int sharded,
              size_t bucket_elems);
void ddp_free(Ddp *d);
// Before the last micro-batch's backward: resets the buckets and, with
// hooks, arms the store's grads-ready hook so that buckets start during that
// backward (without, ddp_finish starts them all: for a backward replayed
// from a CUDA graph, where no host code runs).
void ddp_arm(Ddp *d, int hooks);
// After it: starts what is left, waits for everything, disarms the hook.
void ddp_finish(Ddp *d);
// Global grad L2 norm (after ddp_finish).
double ddp_grad_norm(Ddp *d);
// Whether nothing changes the expert grads after the last backward (an
// expert data-parallel group of one rank, which also makes this rank's
// shard the whole class), so that their share of the norm may come from
// slots that backward fills (ddp_use_wgrad_slots) instead of a pass over
// them. With a pipeline the stages' backwards interleave, so the trainer
// (and the memory plan and moecore plan, through ddp_norm_from_slots) also
// needs a single stage.
int ddp_expert_grads_final(const Ddp *d);
static inline int ddp_norm_from_slots(int pp, int ep_dp) { return pp <= 1 && ep_dp <= 1; }
// The norm takes the expert grads' share from n slots (ddp_expert_grads_final).
void ddp_use_wgrad_slots(Ddp *d, const double *slots, size_t n);
// The grads the optimizer reads for element begin of its range.
void ddp_optimizer_grads(Ddp *d, float **grads);
// After a sharded optimizer step: all-gathers the updated compute weights.
void ddp_gather_params(Ddp *d);
