// The rank mesh (DESIGN.md §3): world = pp x dp, and inside a pipeline
// stage dp = ep x ep_dp (parallel folding). A rank's coordinates are
// (pp, ep_dp, ep); ep ranks are adjacent so that an expert-parallel group
// sits on neighbouring GPUs. Groups are built once.
#pragma once
#include "dist/comm.h"

typedef struct {
    int pp, dp, ep, ep_dp;                  // sizes
    int pp_rank, dp_rank, ep_rank, ep_dp_rank;
    Comm *world, *dp_comm, *ep_comm, *ep_dp_comm;
} Mesh;

// Sizes must already be validated (dp * pp = world size, ep | dp).
void mesh_init(Mesh *m, Comm *world, int dp, int ep, int pp);
void mesh_free(Mesh *m);
