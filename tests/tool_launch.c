// The launcher detection and TCP rendezvous of src/dist/launch.h, for
// tests/test_launch.sh: started N times with torchrun- or Slurm-style
// variables, every rank all-gathers a block (rank 0's random id, its rank
// and its mesh coordinates for dp x ep), and rank 0 checks that every rank
// took the rank and coordinates the mesh gives it.
//   tool_launch TIMEOUT_S DP EP      one rank of the job
//   tool_launch --first-host LIST    the first host of a Slurm node list
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/launch.h"
#include "dist/mesh.h"

typedef struct {
    unsigned char id[128];
    int32_t rank, local_rank, pp_rank, dp_rank, ep_rank, ep_dp_rank, color[MESH_GROUPS], key[MESH_GROUPS];
} Block;

static void fill(Block *b, const LaunchInfo *li, int rank, int dp, int ep) {
    Mesh m;
    mesh_coords(&m, rank, dp, ep, li->world / dp);
    b->rank = rank;
    b->pp_rank = m.pp_rank;
    b->dp_rank = m.dp_rank;
    b->ep_rank = m.ep_rank;
    b->ep_dp_rank = m.ep_dp_rank;
    int color[MESH_GROUPS], key[MESH_GROUPS];
    mesh_groups(&m, color, key);
    for (int g = 0; g < MESH_GROUPS; g++) { b->color[g] = color[g]; b->key[g] = key[g]; }
}

int main(int argc, char **argv) {
    char err[600];
    if (argc == 3 && !strcmp(argv[1], "--first-host")) {
        char host[256];
        if (launch_first_host(argv[2], host, sizeof host)) { printf("error\n"); return 1; }
        printf("%s\n", host);
        return 0;
    }
    if (argc != 4) { fprintf(stderr, "usage: tool_launch TIMEOUT_S DP EP | --first-host LIST\n"); return 2; }
    double timeout = atof(argv[1]);
    int dp = atoi(argv[2]), ep = atoi(argv[3]);
    LaunchInfo li;
    if (launch_detect(&li, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); return 1; }
    if (dp < 1 || li.world % dp || dp % ep) { fprintf(stderr, "error: bad dp %d / ep %d for %d ranks\n", dp, ep, li.world); return 2; }
    Block mine, *all = calloc(li.world, sizeof(Block));
    memset(&mine, 0, sizeof mine);
    if (li.rank == 0) {
        FILE *f = fopen("/dev/urandom", "rb");
        if (!f || fread(mine.id, 1, sizeof mine.id, f) != sizeof mine.id) { fprintf(stderr, "error: urandom\n"); return 1; }
        fclose(f);
    }
    fill(&mine, &li, li.rank, dp, ep);
    mine.local_rank = li.local_rank;
    if (launch_allgather(&li, &mine, all, sizeof(Block), timeout, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    int bad = 0;
    for (int r = 0; r < li.world; r++) {
        Block want;
        memset(&want, 0, sizeof want);
        fill(&want, &li, r, dp, ep);
        memcpy(want.id, all[r].id, sizeof want.id);
        want.local_rank = all[r].local_rank;
        if (memcmp(&want, &all[r], sizeof want)) { printf("rank %d: block of rank %d disagrees\n", li.rank, r); bad = 1; }
    }
    printf("%s rank %d of %d (local %d) rendezvous %s:%d id %02x%02x%02x%02x%02x%02x%02x%02x mesh pp %d dp %d ep %d "
           "ep_dp %d: %s\n", launch_kind_name(li.kind), li.rank, li.world, li.local_rank, li.master_addr,
           li.master_port, all[0].id[0], all[0].id[1], all[0].id[2], all[0].id[3], all[0].id[4], all[0].id[5],
           all[0].id[6], all[0].id[7], mine.pp_rank, mine.dp_rank, mine.ep_rank, mine.ep_dp_rank,
           bad ? "DISAGREE" : "agreed");
    free(all);
    return bad;
}
