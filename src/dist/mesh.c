#include "dist/mesh.h"

#include <string.h>

void mesh_coords(Mesh *m, int rank, int dp, int ep, int pp) {
    memset(m, 0, sizeof(*m));
    m->pp = pp;
    m->dp = dp;
    m->ep = ep;
    m->ep_dp = dp / ep;
    m->pp_rank = rank / dp;
    m->dp_rank = rank % dp;
    m->ep_rank = m->dp_rank % ep;
    m->ep_dp_rank = m->dp_rank / ep;
}

void mesh_groups(const Mesh *m, int color[MESH_GROUPS], int key[MESH_GROUPS]) {
    color[MESH_DP] = m->pp_rank;
    key[MESH_DP] = m->dp_rank;
    color[MESH_EP] = m->pp_rank * m->ep_dp + m->ep_dp_rank;
    key[MESH_EP] = m->ep_rank;
    color[MESH_EP_DP] = m->pp_rank * m->ep + m->ep_rank;
    key[MESH_EP_DP] = m->ep_dp_rank;
}

void mesh_init(Mesh *m, Comm *world, int dp, int ep, int pp) {
    mesh_coords(m, comm_rank(world), dp, ep, pp);
    m->world = world;
    int color[MESH_GROUPS], key[MESH_GROUPS];
    mesh_groups(m, color, key);
    m->dp_comm = comm_split(world, color[MESH_DP], key[MESH_DP]);
    m->ep_comm = comm_split(world, color[MESH_EP], key[MESH_EP]);
    m->ep_dp_comm = comm_split(world, color[MESH_EP_DP], key[MESH_EP_DP]);
    comm_set_name(m->dp_comm, "dp");
    comm_set_name(m->ep_comm, "ep");
    comm_set_name(m->ep_dp_comm, "ep_dp");
    m->pp_comm = comm_split(world, m->dp_rank, m->pp_rank);
    comm_set_name(m->pp_comm, "pp");
}

void mesh_free(Mesh *m) {
    comm_free(m->dp_comm);
    comm_free(m->ep_comm);
    comm_free(m->ep_dp_comm);
    comm_free(m->pp_comm);
    memset(m, 0, sizeof(*m));
}
