// The symmetric expert-parallel ops on the device (ops/ep_sym.h): the count
// writes into every peer's window, the plan (one block), the dispatch push
// and the combine pull, over tables of peer pointers that live in device
// memory (NCCL LSA pointers on real peers, the other virtual ranks' buffers
// on one GPU). Same semantics as ep_sym_cpu.c, act = BF16; all on
// cuda_stream(), no host synchronisation, no allocation (capture-safe).
// The barriers between the phases are the caller's (ep_sym.h).
//
// The copies are one warp per row (memkernels.cuh's warp_copy_row, as
// dispatch.cu's gathers); the peer buffers must be 16-byte
// aligned (windows are: ncclMemAlloc's granularity) and the vector path is
// taken when C is a multiple of 8 and the local rows are aligned.
#include "ops/cuda/memkernels.cuh"
#include "ops/ep_sym.h"

// b: thread (q, g) writes counts[rank][g] into peer q's window
static __global__ void write_counts_kernel(int *const *windows, const int *__restrict__ offsets, int P, int rank,
                                           int E) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= P * E) return;
    int q = i / E, g = i % E;
    windows[q][(size_t)rank * E + g] = offsets[g + 1] - offsets[g];
}

extern "C" void cuda_ep_sym_write_counts(int *const *windows, const int *offsets, int P, int rank, int E) {
    if (P <= 0 || E <= 0) return;
    write_counts_kernel<<<ceil_div(P * E, 256), 256, 0, cuda_stream()>>>(windows, offsets, P, rank, E);
    cudaLaunchCheck();
}

// c: one block; n and cut of every global expert in shared memory. Threads
// stride over experts for the sums, one thread per owner bounds that owner's
// cuts to the buffer (as ep_sym_cpu.c's bound_to_buffer), then threads
// stride over experts again for the bases and keeps. Integers only: exact
// and the same on every rank.
#define PLAN_THREADS 256
static __global__ void plan_kernel(int *plan, float *dropped, const int *__restrict__ counts, int P, int rank,
                                   int E, int capacity, int max_rows) {
    extern __shared__ int sh[];
    int *n = sh, *cut = sh + E;
    int El = E / P;
    for (int g = threadIdx.x; g < E; g += blockDim.x) {
        int t = 0;
        for (int s = 0; s < P; s++) t += counts[(size_t)s * E + g];
        n[g] = t;
        cut[g] = capacity > 0 && t > capacity ? capacity : t;
    }
    __syncthreads();
    for (int q = threadIdx.x; q < P; q += blockDim.x) {
        int *c = cut + (size_t)q * El;
        long long total = 0;
        int hi = 0;
        for (int e = 0; e < El; e++) {
            total += c[e];
            hi = c[e] > hi ? c[e] : hi;
        }
        if (total <= max_rows) continue;
        int lo = 0;
        while (hi - lo > 1) {
            int mid = lo + (hi - lo) / 2;
            long long s = 0;
            for (int e = 0; e < El; e++) s += c[e] < mid ? c[e] : mid;
            if (s <= max_rows) lo = mid;
            else hi = mid;
        }
        for (int e = 0; e < El; e++)
            if (c[e] > lo) c[e] = lo;
    }
    __syncthreads();
    int *base = plan, *keep = plan + E, *recv_offsets = plan + 2 * (size_t)E;
    for (int g = threadIdx.x; g < E; g += blockDim.x) {
        int q = g / El, e = g % El, seg = 0, before = 0;
        for (int j = q * El; j < g; j++) seg += cut[j];
        for (int s = 0; s < rank; s++) before += counts[(size_t)s * E + g];
        int left = cut[g] - before, mine = counts[(size_t)rank * E + g];
        keep[g] = left < 0 ? 0 : left < mine ? left : mine;
        base[g] = seg + (before < cut[g] ? before : cut[g]);
        if (q == rank) recv_offsets[e] = seg;
    }
    if (threadIdx.x == 0) {
        int seg = 0;
        long long lost = 0;
        for (int g = rank * El; g < (rank + 1) * El; g++) {
            seg += cut[g];
            lost += n[g] - cut[g];
        }
        recv_offsets[El] = seg;
        if (dropped) dropped[0] += (float)lost;
    }
}

extern "C" void cuda_ep_sym_plan(int *plan, float *dropped, const int *counts, int P, int rank, int E, int capacity,
                                 int max_rows) {
    if (P <= 0 || E <= 0) return;
    plan_kernel<<<1, PLAN_THREADS, 2 * (size_t)E * sizeof(int), cuda_stream()>>>(plan, dropped, counts, P, rank, E,
                                                                                capacity, max_rows);
    cudaLaunchCheck();
}

// The expert of routed row r < offsets[E]: the last g with offsets[g] <= r
// (binary search; empty experts are skipped since the next starts at the
// same row).
__device__ __forceinline__ int expert_of_row(const int *__restrict__ offsets, int E, int r) {
    int lo = 0, hi = E - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (offsets[mid] <= r) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// d (push): kept row r (expert g, i-th of its block) to recv[owner][base + i].
// f (pull): y[r] from out[owner][base + i], or zeros when r was dropped.
template <bool PUSH>
static __global__ void move_rows_kernel(bf16 *local, bf16 *const *peers, const int *__restrict__ plan,
                                        const int *__restrict__ offsets, int P, int E, int R, int C, bool vec) {
    int r = blockIdx.x * ROW_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (r >= R || r >= offsets[E]) return;
    int g = expert_of_row(offsets, E, r), i = r - offsets[g];
    bool kept = i < plan[E + g];
    bf16 *remote = kept ? peers[g / (E / P)] + (size_t)(plan[g] + i) * C : nullptr;
    bf16 *mine = local + (size_t)r * C;
    if (PUSH) {
        if (kept) warp_copy_row(remote, mine, C, lane, vec);
    } else {
        warp_copy_row(mine, remote, C, lane, vec);
    }
}

extern "C" void cuda_ep_sym_dispatch(void *const *recv, const int *plan, const int *offsets, const void *xp, int P,
                                     int E, int R, int C) {
    if (R <= 0 || C <= 0 || E <= 0) return;
    bool vec = C % 8 == 0 && aligned16(xp);
    move_rows_kernel<true><<<row_blocks(R), ROW_THREADS, 0, cuda_stream()>>>(
        (bf16 *)xp, (bf16 *const *)recv, plan, offsets, P, E, R, C, vec);
    cudaLaunchCheck();
}

extern "C" void cuda_ep_sym_combine(void *y, void *const *out, const int *plan, const int *offsets, int P, int E,
                                    int R, int C) {
    if (R <= 0 || C <= 0 || E <= 0) return;
    bool vec = C % 8 == 0 && aligned16(y);
    move_rows_kernel<false><<<row_blocks(R), ROW_THREADS, 0, cuda_stream()>>>(
        (bf16 *)y, (bf16 *const *)out, plan, offsets, P, E, R, C, vec);
    cudaLaunchCheck();
}
