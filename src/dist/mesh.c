#include "dist/mesh.h"

#include <string.h>

void mesh_init(Mesh *m, Comm *world, int dp, int ep, int pp) {
    memset(m, 0, sizeof(*m));
    int r = comm_rank(world);
    m->world = world;
    m->pp = pp;
    m->dp = dp;
    m->ep = ep;
    m->ep_dp = dp / ep;
    m->pp_rank = r / dp;
    m->dp_rank = r % dp;
    m->ep_rank = m->dp_rank % ep;
    m->ep_dp_rank = m->dp_rank / ep;
    m->dp_comm = comm_split(world, m->pp_rank, m->dp_rank);
    m->ep_comm = comm_split(world, m->pp_rank * m->ep_dp + m->ep_dp_rank, m->ep_rank);
    m->ep_dp_comm = comm_split(world, m->pp_rank * ep + m->ep_rank, m->ep_dp_rank);
}

void mesh_free(Mesh *m) {
    comm_free(m->dp_comm);
    comm_free(m->ep_comm);
    comm_free(m->ep_dp_comm);
    memset(m, 0, sizeof(*m));
}
