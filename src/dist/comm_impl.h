// What comm_mpi.c and comm_nccl.c share (not for other files): the Comm and
// CommReq structs. A Comm is an MPI communicator (host buffers) or, with
// nccl set, a NCCL one (device buffers; host buffers are staged through
// the device, comm_nccl.c). Every public comm.h call is in comm_mpi.c and
// hands a NCCL Comm to its nccl_* twin.
#pragma once
#include <mpi.h>

#include "dist/comm.h"

typedef struct NcclComm NcclComm;
typedef struct NcclReq NcclReq;

struct Comm {
    MPI_Comm mpi;
    int rank, size;
    NcclComm *nccl;  // NULL: MPI (or a one-rank group without MPI)
};
struct CommReq {
    MPI_Request req;
    MPI_Datatype tmp_type;  // freed on wait when not MPI_DATATYPE_NULL
    int *ints;              // count arrays kept alive until completion
    NcclReq *nccl;          // a NCCL request: comm_wait is a stream dependency
    void *host;             // the host copy MPI works on (staged or checked), freed on completion
    void *out;              // given host's bytes on completion (a staged or checked receive)
    size_t bytes;
    void *send_copy;        // MOECORE_COMM_CHECK: the send snapshot a reduce-scatter reads, freed
    // MOECORE_COMM_CHECK: buffers that must still hold `want` on completion
    struct { const void *buf; void *want; size_t bytes; const char *what; } guard[2];
    int n_guard;
    const char *op;
};

size_t comm_type_size(CommType t);
int comm_mpi_active(void);

#ifdef MOECORE_CUDA
Comm *nccl_split(Comm *parent, int color, int key);
void nccl_free(Comm *c);
void nccl_allreduce(Comm *c, void *buf, size_t n, CommType t);
CommReq *nccl_iallreduce(Comm *c, void *buf, size_t n, CommType t);
CommReq *nccl_ireduce_scatter(Comm *c, const void *send, void *recv, const size_t *counts, CommType t);
void nccl_all_gather(Comm *c, void *buf, const size_t *counts, CommType t);
void nccl_all_to_all_v(Comm *c, const void *send, const size_t *send_counts, void *recv, const size_t *recv_counts,
                       size_t elem_bytes);
void nccl_send(Comm *c, const void *buf, size_t n, CommType t, int dst);
void nccl_recv(Comm *c, void *buf, size_t n, CommType t, int src);
CommReq *nccl_isend(Comm *c, const void *buf, size_t n, CommType t, int dst);
CommReq *nccl_irecv(Comm *c, void *buf, size_t n, CommType t, int src);
void nccl_p2p_group(Comm *c, CommP2P *ops, int n_ops);
void nccl_broadcast(Comm *c, void *buf, size_t n, CommType t, int root);
void nccl_barrier(Comm *c);
void nccl_wait(CommReq *r);
void nccl_shutdown(void);
void *nccl_handle(Comm *c);  // its ncclComm_t (symmem_nccl.cu)
// The watchdog (comm_nccl.c): a blocking NCCL call the host enters and
// leaves, and a symmetric-memory barrier just launched on the compute stream.
void nccl_host_enter(const char *op);
void nccl_host_leave(void);
void nccl_watch_barrier(const Comm *c);
#endif
