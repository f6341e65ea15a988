// The communicator interface (DESIGN.md §6): collectives over rank groups,
// blocking and non-blocking, on host buffers. The MPI implementation
// (comm_mpi.c) is used when the process was started by mpirun; a process
// started alone gets a one-rank world with no MPI at all, so single-process
// runs and tests never depend on an MPI launcher.
//
// On GPUs the same calls run over NCCL (comm_nccl.c, with the CUDA
// backend): comm_nccl_world makes the world from any launcher, comm_split
// gives NCCL groups (ncclCommSplit). There buffers are device memory and a
// call is ordered on the CUDA backend's stream (cuda_stream()): "blocking"
// means later work on that stream sees the result, not that the host
// waited. The non-blocking calls run on a communication stream after what
// the compute stream has enqueued so far, and comm_wait makes the compute
// stream wait for them (no host wait). Host buffers given to a NCCL Comm
// (the step's scalars) are staged through the device, and those calls do
// return with the result on the host.
//
// Sums are in the buffer's type; counts are in elements. Every failure of an
// MPI call aborts the whole job with the call, file and line (a rank that
// fails must not leave the others hanging).
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct Comm Comm;
typedef struct CommReq CommReq;

typedef enum { COMM_F32, COMM_F64, COMM_I32, COMM_I64, COMM_BYTE } CommType;

// Starts MPI when launched by mpirun (or srun with PMI); returns the world.
Comm *comm_init(int *argc, char ***argv);
void comm_finalize(void);
Comm *comm_world(void);
int comm_rank(const Comm *c);
int comm_size(const Comm *c);
int comm_is_mpi(void);
// Ranks with the same color form a group, ordered by key.
Comm *comm_split(Comm *parent, int color, int key);
void comm_free(Comm *c);

void comm_allreduce(Comm *c, void *buf, size_t n, CommType t);          // sum, in place
CommReq *comm_iallreduce(Comm *c, void *buf, size_t n, CommType t);
// Sum over ranks of send[0..sum(counts)), rank r receives block r (counts[r]
// elements, blocks in rank order) into recv.
void comm_reduce_scatter(Comm *c, const void *send, void *recv, const size_t *counts, CommType t);
CommReq *comm_ireduce_scatter(Comm *c, const void *send, void *recv, const size_t *counts, CommType t);
// In place: buf holds rank r's block at displacement sum(counts[0..r)).
void comm_all_gather(Comm *c, void *buf, const size_t *counts, CommType t);
// send holds send_counts[r] elements for each rank r in rank order; recv
// gets recv_counts[r] from each. Each element is elem_bytes bytes.
void comm_all_to_all_v(Comm *c, const void *send, const size_t *send_counts, void *recv,
                       const size_t *recv_counts, size_t elem_bytes);
void comm_send(Comm *c, const void *buf, size_t n, CommType t, int dst, int tag);
void comm_recv(Comm *c, void *buf, size_t n, CommType t, int src, int tag);
// Non-blocking point-to-point (pipeline stages): buf must stay untouched
// until comm_wait. Over MPI messages between two ranks match by tag; over
// NCCL (device buffers) in call order, one ncclSend / ncclRecv group each on
// the communication stream after what the compute stream has enqueued, and
// comm_wait makes the compute stream wait (no host wait).
CommReq *comm_isend(Comm *c, const void *buf, size_t n, CommType t, int dst, int tag);
CommReq *comm_irecv(Comm *c, void *buf, size_t n, CommType t, int src, int tag);
// Sends and receives that progress together (the pipeline's hand-offs of
// one slot): over NCCL one ncclGroupStart / ncclGroupEnd on the
// communication stream, after what the compute stream has enqueued; over MPI
// each op is comm_isend / comm_irecv with its tag. Sets each op's req (one
// request per op; comm_wait / comm_test each). Over NCCL a rank's groups run
// one after another and two ranks' ops match in call order, so the caller
// must issue groups whose partners meet (pp_schedule_check_p2p).
typedef struct {
    void *buf;
    size_t n;
    CommType type;
    int peer, tag, recv;  // recv: 1 receives from peer into buf, 0 sends buf to peer
    CommReq *req;         // set by comm_p2p_group
} CommP2P;
void comm_p2p_group(Comm *c, CommP2P *ops, int n_ops);
void comm_broadcast(Comm *c, void *buf, size_t n, CommType t, int root);
void comm_barrier(Comm *c);
void comm_wait(CommReq *r);      // completes and frees the request; NULL is a no-op
// Whether *r has completed (then frees it and sets *r to NULL; NULL: done),
// without waiting. Over NCCL it orders the compute stream after the call
// and says done: later work on that stream may reuse the buffer.
int comm_test(CommReq **r);
// Ends every rank of the job (after a fatal error on this one).
void comm_abort(int code);

typedef struct LaunchInfo LaunchInfo;
// The NCCL world of a GPU job (CUDA builds): one GPU per process, chosen
// from the launcher's local rank (li->local_rank modulo the visible
// devices) before anything else touches CUDA; the unique id reaches every
// rank over MPI under mpirun, else over the TCP rendezvous at
// MASTER_ADDR:MASTER_PORT (launch.h). A collective that does not complete
// within timeout_s seconds (or a NCCL asynchronous error) aborts every
// communicator and ends the job with a message naming the collective and
// its group. NULL with a message in err.
Comm *comm_nccl_world(const LaunchInfo *li, double timeout_s, char *err, size_t errlen);
// Whether c is a NCCL communicator (its buffers are device memory).
int comm_is_nccl(const Comm *c);

// GPU ranks over MPI instead of NCCL (MOECORE_COMM=mpi under mpirun): the
// one-GPU check of the multi-rank runtimes, since NCCL refuses two ranks on
// one GPU. Every MPI Comm then takes device buffers too and stages them
// through host memory: a call copies them out after the device's work so
// far, runs the MPI call on the host copies and copies the results back
// before the device's later work. Non-blocking collectives complete before
// they return (a NULL request); isend / irecv stay non-blocking on host
// copies (an irecv's result reaches the device at comm_wait / comm_test).
// Slow by design: for correctness, never for speed.
//
// MOECORE_COMM_CHECK=1 checks the non-blocking calls' contract over MPI (host
// or staged buffers; tests/test_dist.sh, test_pp.sh, tests/gpu/ranks.sh):
// each call works on host copies taken when it is made, as NCCL reads in
// stream order; its receive and in-place buffers hold 0xFF bytes (NaN) until
// comm_wait / comm_test completes it, so a result read too early is NaN;
// and completing it ends the job with a message naming the call and buffer
// if the caller wrote any of its buffers in between, which over NCCL would
// race the communication stream. Over MPI alone such writes mostly pass
// (the host does the work inside MPI_Wait, or the staged call before it
// returns).
typedef struct {
    int (*on_device)(const void *p);
    void (*to_host)(void *host, const void *dev, size_t bytes);   // after the device's enqueued work
    void (*to_device)(void *dev, const void *host, size_t bytes); // done before the device's later work
    void (*copy)(void *dst, const void *src, size_t bytes);       // either side on the device
} CommDeviceCopy;
void comm_stage_device(const CommDeviceCopy *dc);
int comm_stages_device(void);  // whether comm_stage_device was called
// The world of a GPU job over MPI (CUDA builds, started by mpirun): one GPU
// per process, chosen from the launcher's local rank modulo the visible
// devices (several ranks may share one), and comm_stage_device with the
// CUDA backend's copies. NULL with a message in err.
Comm *comm_mpi_device_world(const LaunchInfo *li, char *err, size_t errlen);
// The group's name in error messages ("dp", "ep", ...; default "world" or "group").
void comm_set_name(Comm *c, const char *name);
// NCCL's version and library path of a NCCL Comm, for the run header.
const char *comm_nccl_describe(void);
