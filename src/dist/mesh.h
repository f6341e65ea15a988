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
    // the pipeline group: the pp ranks of one dp coordinate, by stage
    // (rank pp_rank * dp + dp_rank of the world is stage pp_rank)
    Comm *pp_comm;
} Mesh;

// Sizes must already be validated (dp * pp = world size, ep | dp).
void mesh_init(Mesh *m, Comm *world, int dp, int ep, int pp);
// The sizes and coordinates of a rank, without communicators: what every
// launcher and communicator (MPI here, NCCL's split) agrees on.
void mesh_coords(Mesh *m, int rank, int dp, int ep, int pp);
// The split of the world into the dp, ep and ep_dp groups: ranks with the
// same color[g] form group g, ordered by key[g].
enum { MESH_DP = 0, MESH_EP = 1, MESH_EP_DP = 2, MESH_GROUPS = 3 };
void mesh_groups(const Mesh *m, int color[MESH_GROUPS], int key[MESH_GROUPS]);
void mesh_free(Mesh *m);
