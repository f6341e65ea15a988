// symmem.h's agreement between ranks, on CPU ranks under mpirun (for
// tests/test_dist.sh): the ranks size their symmetric buffers from one
// value they all hold (symmem_min: the least over the group, where each
// rank's own measure, its free device memory, differs), and symmem_create
// refuses, on every rank and without a hang, sizes that differ. A rank
// prints "ok: ..." / "FAIL: ..." and exits 1 on any failure.
#include <stdio.h>
#include <string.h>

#include "dist/comm.h"
#include "dist/symmem.h"
#include "ops/ops.h"

static int rank, P, fails;
static void check(int cond, const char *what) {
    printf("%s: rank %d: %s\n", cond ? "ok" : "FAIL", rank, what);
    if (!cond) fails++;
}

int main(int argc, char **argv) {
    Comm *w = comm_init(&argc, &argv);
    rank = comm_rank(w), P = comm_size(w);
    setvbuf(stdout, NULL, _IOLBF, 0);

    // each rank its own value, the least on a rank in the middle
    size_t mine = 1000 + 37 * (size_t)((rank + 1) % P), want = 1000;
    check(symmem_min(w, mine) == want, "symmem_min: every rank gets the least of the ranks' values");
    Comm *one = comm_split(w, rank, 0);
    check(symmem_min(one, mine) == mine, "symmem_min of a one-rank group is its own value");
    comm_free(one);

    // different sizes: refused on every rank, naming them
    char err[300] = "";
    SymMem *s = symmem_create(w, &ops_cpu, rank == P - 1 ? 8192 : 4096, err, sizeof err);
    char what[400];
    snprintf(what, sizeof what, "symmem_create refuses sizes that differ between ranks (\"%s\")", err);
    check(s == NULL && strstr(err, "different sizes") && strstr(err, "4096") && strstr(err, "8192"), what);
    symmem_free(s);

    // the agreed size: one window, a write into the next rank's buffer seen after the barrier
    size_t bytes = symmem_min(w, 4096 + 64 * (size_t)rank);
    err[0] = 0;
    s = symmem_create(w, &ops_cpu, bytes, err, sizeof err);
    check(s != NULL, s ? "symmem_create of the agreed size" : err);
    if (s) {
        int next = (rank + 1) % P, prev = (rank + P - 1) % P;
        ((int *)symmem_peer(s, next))[1] = 100 + rank;
        symmem_barrier(s);
        check(((int *)symmem_local(s))[1] == 100 + prev && !strcmp(symmem_kind(s), "mpi-shared"),
              "a write into the next rank's buffer is there after the barrier");
        symmem_free(s);
    }
    comm_barrier(w);
    printf("rank %d: %d failed\n", rank, fails);
    comm_finalize();
    return fails ? 1 : 0;
}
