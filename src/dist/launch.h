// How this process was launched, and a rendezvous of all of its ranks
// without MPI: what a GPU job started by torchrun or Slurm's srun needs
// before NCCL exists (the NCCL unique id must reach every rank; llm.c's
// bootstrap does the same over TCP). Under mpirun, MPI itself is the
// rendezvous (comm_mpi.c).
//
// Launchers, by the variables they set (the first that is present wins):
//   mpirun   OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK  (PMI_RANK / PMI_SIZE)
//   torchrun RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
//   srun     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the first host of
//            SLURM_JOB_NODELIST (MASTER_ADDR / MASTER_PORT override it; the
//            port defaults to 29500 + SLURM_JOB_ID % 1000)
// A process with none of them is one rank of one.
#pragma once
#include <stddef.h>

typedef enum { LAUNCH_SINGLE = 0, LAUNCH_MPI = 1, LAUNCH_TORCHRUN = 2, LAUNCH_SLURM = 3 } LaunchKind;

typedef struct LaunchInfo {
    LaunchKind kind;
    int rank, world, local_rank;
    char master_addr[256];  // torchrun, srun: the rendezvous host (rank 0's)
    int master_port;
} LaunchInfo;

const char *launch_kind_name(LaunchKind k);
// Reads the launcher's variables. 0, or -1 with the variable and what is
// wrong with it in err (a rank outside [0, world), a missing MASTER_ADDR
// under torchrun, a node list that cannot be parsed, ...).
int launch_detect(LaunchInfo *li, char *err, size_t errlen);
// The first host of a Slurm node list: "gpu[003-010,012],cpu1" -> "gpu003".
// 0, or -1 when it cannot be parsed.
int launch_first_host(const char *nodelist, char *host, size_t hostlen);

// All-gather of `bytes` bytes per rank over TCP at master_addr:master_port:
// rank 0 listens and collects every rank's block, then sends all of them,
// in rank order, to every rank (all[r * bytes ..] = rank r's block). Rank
// 0's block alone is a broadcast (the NCCL unique id). Every rank returns
// only when all have joined, so it is also a barrier. -1 with a message
// naming the address, the ranks missing or the one that misbehaved when
// it does not complete within timeout_s seconds.
int launch_allgather(const LaunchInfo *li, const void *mine, void *all, size_t bytes, double timeout_s, char *err,
                     size_t errlen);
