// NCCL, loaded with dlopen on first use (as cuBLASLt is, ops_cuda.cu), so
// that CPU runs and CPU-only machines never map it; the communicator for
// device buffers calls it through this table. Compiled only with the CUDA
// backend (nccl.h comes with the CUDA toolkit here; a GPU machine's NCCL
// may come from PyTorch's nvidia-nccl wheel: put its lib/ on
// LD_LIBRARY_PATH, or set NCCL_HOME).
#pragma once
#ifdef MOECORE_CUDA
#include <nccl.h>
#include <stddef.h>

#define NCCL_FUNCS(X)                                                                                     \
    X(ncclGetVersion) X(ncclGetUniqueId) X(ncclGetErrorString) X(ncclGetLastError)                        \
    X(ncclCommInitRankConfig) X(ncclCommSplit) X(ncclCommDestroy) X(ncclCommAbort) X(ncclCommFinalize)    \
    X(ncclCommGetAsyncError) X(ncclCommCount) X(ncclCommUserRank) X(ncclAllReduce) X(ncclReduce)           \
    X(ncclReduceScatter)                                                                                  \
    X(ncclAllGather) X(ncclBroadcast) X(ncclSend) X(ncclRecv) X(ncclGroupStart) X(ncclGroupEnd)           \
    X(ncclMemAlloc) X(ncclMemFree) X(ncclCommWindowRegister) X(ncclCommWindowDeregister)

typedef struct {
#define NCCL_MEMBER(f) __typeof__(&f) f;
    NCCL_FUNCS(NCCL_MEMBER)
#undef NCCL_MEMBER
    void *dl;        // its dlopen handle (symmem_nccl.cu looks up the device-API host calls)
    char path[512];  // the library that was loaded
    int version;     // ncclGetVersion: 22809 for 2.28.9
} NcclApi;

// The table, loading libnccl.so.2 on the first call; NULL with the places
// tried and the loader's message in err when it cannot be loaded or lacks a
// function (NCCL older than 2.28).
const NcclApi *nccl_api(char *err, size_t errlen);
#endif
