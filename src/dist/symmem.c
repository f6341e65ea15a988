// Symmetric memory (symmem.h): the local and MPI-shared kinds here, the
// NCCL LSA kind in symmem_nccl.cu (device code of NCCL's device API).
#include "dist/symmem.h"

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm_impl.h"
#include "util/check.h"

#ifdef MOECORE_CUDA
// symmem_nccl.cu
void *nccl_sym_create(Comm *c, size_t bytes, void **local, void **peers, char *err, size_t errlen);
void nccl_sym_barrier(void *state);
void nccl_sym_free(void *state);
int nccl_sym_available(Comm *c, char *why, size_t whylen);
#endif

typedef enum { KIND_LOCAL, KIND_MPI, KIND_NCCL } Kind;

struct SymMem {
    Kind kind;
    int P, rank;
    const Ops *ops;
    void *local;
    void **peers;      // [P] host array of the peers' bases
    MPI_Win win;       // KIND_MPI
    MPI_Comm mpi;      // KIND_MPI: the group's communicator
    size_t bytes;      // KIND_MPI: the window, counted as CPU backend memory
    void *nccl;        // KIND_NCCL: symmem_nccl.cu's state
};

static int group_size(Comm *c) { return c ? comm_size(c) : 1; }

// MPI ranks share memory when they are all on this node: the shared-memory
// split of the group has the group's size on every rank.
static int mpi_one_node(Comm *c) {
    MPI_Comm node;
    if (MPI_Comm_split_type(c->mpi, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS) return 0;
    int n = 0, all = 0;
    MPI_Comm_size(node, &n);
    int mine = n == c->size;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, c->mpi);
    MPI_Comm_free(&node);
    return all;
}

int symmem_available(Comm *c, const Ops *ops, char *why, size_t whylen) {
    if (group_size(c) == 1 && !comm_is_nccl(c)) return 1;
#ifdef MOECORE_CUDA
    if (comm_is_nccl(c)) return nccl_sym_available(c, why, whylen);
#endif
    if (!ops->host_memory) {
        errorf(why, whylen, "the %s backend's ranks communicate through NCCL, and this group has no NCCL communicator%s",
               ops->name, comm_stages_device() ? " (MOECORE_COMM=mpi stages buffers through the host instead)" : "");
        return 0;
    }
    if (!comm_mpi_active()) {
        errorf(why, whylen, "a group of %d ranks without MPI", group_size(c));
        return 0;
    }
    if (!mpi_one_node(c)) {
        errorf(why, whylen, "the %d ranks of the group are not all on one node (no shared memory between them)",
               c->size);
        return 0;
    }
    return 1;
}

// Every rank's v (host memory, one per rank of c), through the group's own
// communicator (MPI, or NCCL staging the host buffer).
static int64_t *gather_all(Comm *c, size_t v) {
    int n = group_size(c);
    int64_t *all = mallocCheck((size_t)n * sizeof(int64_t));
    size_t *counts = mallocCheck((size_t)n * sizeof(size_t));
    for (int q = 0; q < n; q++) counts[q] = 1, all[q] = 0;
    all[c ? comm_rank(c) : 0] = (int64_t)v;
    if (n > 1) comm_all_gather(c, all, counts, COMM_I64);
    free(counts);
    return all;
}

size_t symmem_min(Comm *c, size_t v) {
    if (group_size(c) == 1) return v;
    int64_t *all = gather_all(c, v);
    size_t m = v;
    for (int q = 0; q < group_size(c); q++)
        if ((size_t)all[q] < m) m = (size_t)all[q];
    free(all);
    return m;
}

SymMem *symmem_create(Comm *c, const Ops *ops, size_t bytes, char *err, size_t errlen) {
    if (!symmem_available(c, ops, err, errlen)) return NULL;
    if (group_size(c) > 1) { // one carve on every rank: the same size everywhere, or none
        int64_t *all = gather_all(c, bytes);
        int q = 1;
        while (q < group_size(c) && all[q] == all[0]) q++;
        if (q < group_size(c)) {
            errorf(err, errlen, "the %d ranks asked for symmetric buffers of different sizes (rank 0: %lld bytes, "
                   "rank %d: %lld), which would make the offsets into the peers' buffers disagree", group_size(c),
                   (long long)all[0], q, (long long)all[q]);
            free(all);
            return NULL;
        }
        free(all);
    }
    SymMem *s = calloc(1, sizeof(SymMem));
    s->P = group_size(c);
    s->rank = c ? comm_rank(c) : 0;
    s->ops = ops;
    s->peers = calloc((size_t)s->P, sizeof(void *));
    if (bytes == 0) bytes = 256;
#ifdef MOECORE_CUDA
    if (comm_is_nccl(c)) {
        s->kind = KIND_NCCL;
        s->nccl = nccl_sym_create(c, bytes, &s->local, s->peers, err, errlen);
        if (!s->nccl) {
            free(s->peers);
            free(s);
            return NULL;
        }
        return s;
    }
#endif
    if (s->P == 1) {
        s->kind = KIND_LOCAL;
        s->local = ops->alloc(bytes);
        s->peers[0] = s->local;
        return s;
    }
    s->kind = KIND_MPI;
    s->mpi = c->mpi;
    void *base = NULL;
    int rc = MPI_Win_allocate_shared((MPI_Aint)bytes, 64, MPI_INFO_NULL, c->mpi, &base, &s->win);
    if (rc != MPI_SUCCESS) {
        errorf(err, errlen, "MPI_Win_allocate_shared of %zu bytes on each of %d ranks failed", bytes, s->P);
        free(s->peers);
        free(s);
        return NULL;
    }
    s->local = base;
    s->bytes = bytes;
    memset(base, ops_cpu_poison() ? 0xff : 0, bytes); // (ops.h's MOECORE_CPU_POISON)
    ops_cpu_count_bytes(bytes, 0); // host memory, counted with the CPU backend's (ops.h)
    for (int q = 0; q < s->P; q++) {
        MPI_Aint size = 0;
        int disp = 0;
        MPI_Win_shared_query(s->win, q, &size, &disp, &s->peers[q]);
    }
    // one passive-target epoch for the life of the window: MPI_Win_sync is
    // the memory fence of the barrier
    MPI_Win_lock_all(MPI_MODE_NOCHECK, s->win);
    symmem_barrier(s); // every rank's zeroing done before anyone writes
    return s;
}

void symmem_barrier(SymMem *s) {
    switch (s->kind) {
    case KIND_LOCAL: break;
    case KIND_MPI:
        MPI_Win_sync(s->win);
        MPI_Barrier(s->mpi);
        MPI_Win_sync(s->win);
        break;
    case KIND_NCCL:
#ifdef MOECORE_CUDA
        nccl_sym_barrier(s->nccl);
#endif
        break;
    }
}

void symmem_free(SymMem *s) {
    if (!s) return;
    switch (s->kind) {
    case KIND_LOCAL: s->ops->free(s->local); break;
    case KIND_MPI:
        MPI_Win_unlock_all(s->win);
        MPI_Win_free(&s->win);
        ops_cpu_count_bytes(s->bytes, 1);
        break;
    case KIND_NCCL:
#ifdef MOECORE_CUDA
        nccl_sym_free(s->nccl);
#endif
        break;
    }
    free(s->peers);
    free(s);
}

int symmem_ranks(const SymMem *s) { return s->P; }
int symmem_rank(const SymMem *s) { return s->rank; }
const char *symmem_kind(const SymMem *s) {
    return s->kind == KIND_LOCAL ? "local" : s->kind == KIND_MPI ? "mpi-shared" : "nccl-lsa";
}
void *symmem_local(const SymMem *s) { return s->local; }
void *symmem_peer(const SymMem *s, int q) { return s->peers[q]; }
