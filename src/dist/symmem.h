// Symmetric memory: one buffer of the same size on every rank of a group,
// which every rank can load from and store to directly, in peers' buffers as
// in its own (DESIGN.md §11; the symmetric expert parallelism of
// ops/ep_sym.h runs on it). The buffers are carved identically on every
// rank, so "peer q's copy of buffer X" is peer q's base plus X's offset here.
//
// Three kinds, one interface:
//   local        a group of one rank (no communicator, or size 1 without
//                NCCL): backend memory, the barrier is nothing
//   MPI shared   CPU ranks of one node: MPI_Win_allocate_shared, the
//                peers' bases from MPI_Win_shared_query; the barrier is
//                MPI_Win_sync + MPI_Barrier + MPI_Win_sync (the CPU ops are
//                synchronous, so the host barrier orders them)
//   NCCL LSA     GPUs of one NVLink domain (comm_nccl.c): ncclMemAlloc,
//                ncclCommWindowRegister, a device communicator with one
//                LSA barrier; the peers' bases are their load/store (LSA)
//                addresses, read once by a kernel; the barrier is a
//                one-block kernel on the compute stream (ncclLsaBarrierSession
//                sync), so it is ordered with the ops, needs no host wait and
//                is captured in CUDA graphs
// A group that spans nodes (MPI ranks on several hosts, GPUs outside one
// NVLink domain) has no load/store path: symmem_create says so and the
// caller falls back to the all-to-all expert parallelism. (NCCL's GIN,
// GPU-initiated networking, would carry the same writes between nodes; not
// built.)
#pragma once
#include <stddef.h>

#include "dist/comm.h"
#include "ops/ops.h"

typedef struct SymMem SymMem;

// 1 when the ranks of c (NULL: one rank) can share memory with the backend
// ops: else 0 with why. Collective (every rank of c gets the same answer).
int symmem_available(Comm *c, const Ops *ops, char *why, size_t whylen);
// The least v over the ranks of c (NULL: one rank); collective. What the
// ranks size their symmetric buffers from must agree: each rank addresses
// its peers' buffers by its own offsets, so one rank's own measure (its
// free device memory) is not enough.
size_t symmem_min(Comm *c, size_t v);
// Allocates `bytes` (zeroed) on every rank of c; collective. NULL with the
// reason in err when the group has no load/store path, memory runs out, or
// the ranks asked for different sizes (every rank then returns NULL).
SymMem *symmem_create(Comm *c, const Ops *ops, size_t bytes, char *err, size_t errlen);
void symmem_free(SymMem *s);
// Ranks of the group, this rank's index, the kind's name ("local", "mpi-shared",
// "nccl-lsa").
int symmem_ranks(const SymMem *s);
int symmem_rank(const SymMem *s);
const char *symmem_kind(const SymMem *s);
// This rank's buffer (backend memory), and peer q's as this rank addresses it
// (an address in backend memory: a device address on CUDA, held by the host).
void *symmem_local(const SymMem *s);
void *symmem_peer(const SymMem *s, int q);
// Every rank's earlier writes into any peer's buffer are complete and
// visible to every rank once they are all past this point (on CUDA: on the
// compute stream, in stream order).
void symmem_barrier(SymMem *s);
