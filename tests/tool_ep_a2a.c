// ep.c's all-to-all expert parallelism (parallel.ep_backend: a2a) on the
// virtual-rank harness's inputs, for tests/test_ep_sym.c: started under
// mpirun with P ranks, rank r routes rk[r] of tests/ep_sym_harness.h, runs
// ep_plan and ep_dispatch over MPI, treats the received rows as identity
// experts' outputs with model.c's capacity drop, ep_combine's them back, and
// writes OUTDIR/RANK.bin: rows, local_offsets[E/P+1], dropped (float), the
// regrouped rows [rows][C] and the combined rows [N k][C].
//   tool_ep_a2a N K E C CAPACITY SKEWED SEED OUTDIR
#include <stdio.h>
#include <stdlib.h>

#include "dist/comm.h"
#include "dist/ep.h"
#include "ep_sym_harness.h"

int main(int argc, char **argv) {
    Comm *w = comm_init(&argc, &argv);
    if (argc != 9) {
        fprintf(stderr, "usage: tool_ep_a2a N K E C CAPACITY SKEWED SEED OUTDIR\n");
        return 2;
    }
    int P = comm_size(w), rank = comm_rank(w);
    EpSymCase c = {P, atoi(argv[1]), atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), 0, atoi(argv[6]),
                   strtoull(argv[7], NULL, 10)};
    int R = c.N * c.k, El = c.E / P, C = c.C, max_rows = R * P;
    c.max_rows = max_rows;
    EpSymRank *rk = eh_alloc(&c);
    EpPlan p;
    size_t ni = ep_plan_ints(P, El, max_rows);
    int *host_ints = calloc(ni, sizeof(int)), *backend_ints = calloc(ni, sizeof(int));
    size_t *sizes = calloc(ep_plan_sizes(P), sizeof(size_t));
    ep_plan_carve(&p, P, El, max_rows, host_ints, backend_ints, sizes);
    ep_plan(w, &ops_cpu, &p, rk[rank].offsets);
    float *xl = calloc((size_t)max_rows * C + 1, sizeof(float)), *yl = calloc((size_t)max_rows * C + 1, sizeof(float));
    float *scratch = calloc((size_t)max_rows * C + 1, sizeof(float)), *y = calloc((size_t)R * C, sizeof(float));
    ep_dispatch(w, &ops_cpu, &p, rk[rank].xp, xl, scratch, C);
    ops_cpu.copy_act(yl, xl, (size_t)p.rows * C);
    float dropped = 0;
    if (c.capacity > 0) ops_cpu.moe_capacity_drop(yl, &dropped, p.local_offsets_b, El, p.rows, C, c.capacity);
    ep_combine(w, &ops_cpu, &p, yl, y, scratch, C);
    char path[512];
    snprintf(path, sizeof path, "%s/%d.bin", argv[8], rank);
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); return 1; }
    fwrite(&p.rows, sizeof(int), 1, f);
    fwrite(p.local_offsets, sizeof(int), El + 1, f);
    fwrite(&dropped, sizeof(float), 1, f);
    fwrite(xl, sizeof(float), (size_t)p.rows * C, f);
    fwrite(y, sizeof(float), (size_t)R * C, f);
    fclose(f);
    eh_free(&c, rk);
    free(host_ints); free(backend_ints); free(sizes); free(xl); free(yl); free(scratch); free(y);
    comm_finalize();
    return 0;
}
