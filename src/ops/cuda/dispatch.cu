// Moving rows between token order and expert order for the dropless MoE
// layer, and the embedding, whose forward is the same row gather:
// moe_route_index (the expert-sorted row order and each expert's offset),
// permute (token rows to expert rows) and unpermute (each token's k expert
// rows, weighted, back into one row), forward and backward; embedding
// forward and backward; the capacity tail drop and the segment sizes that
// expert parallelism exchanges.
//
// Determinism: no floating-point atomics. Scatter-adds sum each
// destination's rows in ascending source order: embedding backward
// stable-sorts the source rows by destination (CUB radix sort, keys =
// destination, values = source index), then one warp per destination and
// 256-channel slice adds them; permute backward lists each token's rows with
// integer atomics and sorts each short list in a warp before adding.
// moe_route_index is the same stable sort of the flat (token, slot) indices
// by expert: the stable order is then (expert, token, slot), as on the CPU,
// and offsets are the segment starts of the sorted keys. Unpermute sums a
// token's slots in slot order; its backward's dweights are block_sums dots.
//
// Variants: the warp-per-row kernels (gathers, embedding backward,
// unpermute forward) take the 16-byte path when C is a multiple of 8 and the
// pointers are 16-byte aligned, scalar accesses otherwise; the
// block-per-token kernels (permute and unpermute backward,
// row_block_threads(C) threads of 8 channels) are instantiated with
// VEC = true under the same condition.
#include <cub/cub.cuh>

#include "ops/cuda/memkernels.cuh"
#include "ops/cuda/unpermute_bwd.cuh"

// ---------------------------------------------------------------------------
// Stable sort of indices by key (CUB radix sort; LSD radix sorting is stable)

// bits needed for keys 0..n-1 (at least 1)
static inline int key_bits(long n) {
    int b = 1;
    while (b < 31 && (1L << b) < n) b++;
    return b;
}

static __global__ void iota_kernel(int *a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = i;
}

// Sorts 0..n-1 by keys[i] in [0, 2^bits): sorted_keys[j] and order[j], the
// index with the j-th smallest key, equal keys in ascending index. Both live
// in s (n >= 1).
static void sort_indices_by_key(Scratch *s, const int *keys, int n, int bits, unsigned **sorted_keys,
                                int **order) {
    size_t temp = 0;
    cudaCheck(cub::DeviceRadixSort::SortPairs(nullptr, temp, (const unsigned *)keys, (unsigned *)nullptr,
                                              (const int *)nullptr, (int *)nullptr, n, 0, bits, cuda_stream()));
    size_t arr = ((size_t)n * sizeof(int) + 255) & ~(size_t)255;
    char *base = (char *)scratch_get(s, 3 * arr + temp);
    unsigned *kout = (unsigned *)base;
    int *iota = (int *)(base + arr), *vout = (int *)(base + 2 * arr);
    iota_kernel<<<ceil_div(n, 256), 256, 0, cuda_stream()>>>(iota, n);
    cudaLaunchCheck();
    cudaCheck(cub::DeviceRadixSort::SortPairs(base + 3 * arr, temp, (const unsigned *)keys, kout, iota, vout, n,
                                              0, bits, cuda_stream()));
    *sorted_keys = kout;
    *order = vout;
}

// starts[0..M] of the segments of sorted keys in [0, M): starts[e] = first j
// with key >= e. Thread j in [0, n] writes the entries between keys j-1 and j,
// so every entry is written exactly once.
static __global__ void segment_starts_kernel(int *starts, const unsigned *skeys, int n, int M) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j > n) return;
    int lo = j > 0 ? (int)skeys[j - 1] + 1 : 0;
    int hi = j < n ? (int)skeys[j] : M;
    for (int e = lo; e <= hi; e++) starts[e] = j;
}

// ---------------------------------------------------------------------------
// Dropless dispatch index: a stable sort of the flat (token, slot) indices
// i = n k + s by expert gives the order (expert, token, slot); row j of the
// grouped rows is the j-th sorted index.

static __global__ void route_rows_kernel(int *row_of, int *token_of_row, const int *order, int R, int k) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= R) return;
    int i = order[j];
    row_of[i] = j;
    token_of_row[j] = i / k;
}

extern "C" void cuda_moe_route_index(int *offsets, int *row_of, int *token_of_row, const int *idx, int N, int E,
                                     int k) {
    static Scratch s;
    int R = N * k;
    if (E <= 0) return;
    if (R <= 0) {
        cudaCheck(cudaMemsetAsync(offsets, 0, (size_t)(E + 1) * sizeof(int), cuda_stream()));
        return;
    }
    unsigned *skeys;
    int *order;
    sort_indices_by_key(&s, idx, R, key_bits(E), &skeys, &order);
    segment_starts_kernel<<<ceil_div(R + 1, 256), 256, 0, cuda_stream()>>>(offsets, skeys, R, E);
    cudaLaunchCheck();
    route_rows_kernel<<<ceil_div(R, 256), 256, 0, cuda_stream()>>>(row_of, token_of_row, order, R, k);
    cudaLaunchCheck();
}

// ---------------------------------------------------------------------------
// Row gathers: embedding forward and permute forward (out[r] = src[index[r]]),
// one warp per row, 4 independent 16-byte loads per lane before the stores.

template <bool STREAM>
static __global__ void gather_rows_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ src,
                                          const int *__restrict__ index, int R, int C, bool vec) {
    int r = blockIdx.x * ROW_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (r >= R) return;
    warp_copy_row<STREAM>(out + (size_t)r * C, src + (size_t)index[r] * C, C, lane, vec);
}

// stream: evict-first stores (warp_copy_row), where the sources repeat
static void gather_rows(void *out, const void *src, const int *index, int R, int C, bool stream) {
    if (R <= 0 || C <= 0) return;
    bool vec = C % 8 == 0 && aligned16(out) && aligned16(src);
    (stream ? gather_rows_kernel<true> : gather_rows_kernel<false>)<<<row_blocks(R), ROW_THREADS, 0, cuda_stream()>>>(
        (bf16 *)out, (const bf16 *)src, index, R, C, vec);
    cudaLaunchCheck();
}

extern "C" void cuda_embedding_forward(void *out, const int *tokens, const void *wte, int N, int C) {
    gather_rows(out, wte, tokens, N, C, false);
}
// MOECORE_PERMUTE_STREAM=1: the permute's stores with the evict-first hint
// (an experiment: no gain on the sweep's E = 8, 0.995x on an H100 on
// 2026-12-07; OLMoE-1B-7B, whose token rows fit L2 and are each read 8
// times, not measured yet)
extern "C" void cuda_permute_forward(void *xp, const void *x, const int *token_of_row, int R, int C) {
    static int stream = -1;
    gather_rows(xp, x, token_of_row, R, C, env_on(&stream, "MOECORE_PERMUTE_STREAM"));
}

// permute_scatter: xp[row_of[n, s]] = x[n] for the k slots of token n, one
// warp per token: the lanes hold SCATTER_V 16-byte chunks each (SCATTER_V *
// 256 channels) and store them to the k rows, so that each token row is
// read once, where the gather (one warp per expert row) reads it k times,
// from L2 when it stays there (OLMoE's 8192 x 2048 input is 32 MiB, but the
// 256 MiB of rows stored meanwhile pass through the same L2).
#define SCATTER_V 8
static __global__ void scatter_rows_kernel(bf16 *__restrict__ xp, const bf16 *__restrict__ x,
                                           const int *__restrict__ row_of, int N, int k, int C, bool vec) {
    int n = blockIdx.x * ROW_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (n >= N) return;
    const bf16 *s = x + (size_t)n * C;
    int mine = lane < k ? row_of[(size_t)n * k + lane] : 0; // k <= 32: the slots' rows, one a lane
    if (!vec) {
        for (int c = lane; c < C; c += WARP) {
            bf16 v = s[c];
            for (int j = 0; j < k; j++) xp[(size_t)__shfl_sync(0xffffffffu, mine, j) * C + c] = v;
        }
        return;
    }
    for (int c0 = lane * 8; c0 < C; c0 += SCATTER_V * WARP * 8) {
        uint4 v[SCATTER_V];
#pragma unroll
        for (int u = 0; u < SCATTER_V; u++) {
            int c = c0 + u * WARP * 8;
            if (c < C) v[u] = *reinterpret_cast<const uint4 *>(s + c);
        }
        for (int j = 0; j < k; j++) {
            bf16 *o = xp + (size_t)__shfl_sync(0xffffffffu, mine, j) * C;
#pragma unroll
            for (int u = 0; u < SCATTER_V; u++) {
                int c = c0 + u * WARP * 8;
                if (c < C) *reinterpret_cast<uint4 *>(o + c) = v[u];
            }
        }
    }
}

// tor[row_of[i]] = i / k: permute_forward's map from permute_scatter's
static __global__ void invert_rows_kernel(int *tor, const int *row_of, int R, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < R) tor[row_of[i]] = i / k;
}

// MOECORE_PERMUTE_SCATTER=0 (measurement only): the gather instead, from
// the inverted map (the A/B of one binary; MOECORE_PERMUTE_STREAM applies)
extern "C" void cuda_permute_scatter(void *xp, const void *x, const int *row_of, int N, int k, int C) {
    static int off = -1;
    if (N <= 0 || C <= 0 || k <= 0) return;
    if (off < 0) {
        const char *v = getenv("MOECORE_PERMUTE_SCATTER");
        off = v && !strcmp(v, "0");
    }
    if (off) {
        static Scratch s;
        int R = N * k, *tor = (int *)scratch_get(&s, (size_t)R * sizeof(int));
        invert_rows_kernel<<<ceil_div(R, 256), 256, 0, cuda_stream()>>>(tor, row_of, R, k);
        cudaLaunchCheck();
        cuda_permute_forward(xp, x, tor, R, C);
        return;
    }
    if (k > WARP) { // never with top-k routing; the gather's map is not at hand here
        fprintf(stderr, "moecore: permute_scatter: k = %d slots per token, at most %d\n", k, WARP);
        exit(3);
    }
    bool vec = C % 8 == 0 && aligned16(xp) && aligned16(x);
    scatter_rows_kernel<<<row_blocks(N), ROW_THREADS, 0, cuda_stream()>>>((bf16 *)xp, (const bf16 *)x, row_of, N, k,
                                                                         C, vec);
    cudaLaunchCheck();
}

// ---------------------------------------------------------------------------
// Deterministic scatter-adds.

// dwte[tok] += the dout rows of tok's positions, summed in ascending position.
// Grid: x = 8 sorted positions per block, one per warp; y = 256-channel
// slices, 8 channels per lane. Warp i works only if sorted position i starts
// its token's run.
static __global__ void embedding_backward_kernel(float *dwte, const bf16 *dout, const unsigned *skeys,
                                                 const int *order, int N, int C, bool vec_in, bool vec_out) {
    int i = blockIdx.x * ROW_WARPS + threadIdx.x / WARP;
    int c = (blockIdx.y * WARP + threadIdx.x % WARP) * 8;
    if (i >= N || c >= C) return;
    unsigned tok = skeys[i];
    if (i > 0 && skeys[i - 1] == tok) return;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, f[8];
    for (int j = i; j < N && skeys[j] == tok; j++) {
        load8(dout + (size_t)order[j] * C, c, C, vec_in, f);
#pragma unroll
        for (int u = 0; u < 8; u++) acc[u] += f[u];
    }
    float *d = dwte + (size_t)tok * C;
    load8(d, c, C, vec_out, f);
#pragma unroll
    for (int u = 0; u < 8; u++) f[u] += acc[u];
    store8(d, c, C, vec_out, f);
}

extern "C" void cuda_embedding_backward(float *dwte, const void *dout, const int *tokens, int N, int C) {
    static Scratch s;
    if (N <= 0 || C <= 0) return;
    unsigned *skeys;
    int *order;
    sort_indices_by_key(&s, tokens, N, 31, &skeys, &order);
    bool vec_in = C % 8 == 0 && aligned16(dout), vec_out = C % 8 == 0 && aligned16(dwte);
    dim3 grid(row_blocks(N), ceil_div(C, WARP * 8));
    embedding_backward_kernel<<<grid, ROW_THREADS, 0, cuda_stream()>>>(dwte, (const bf16 *)dout, skeys, order, N,
                                                                       C, vec_in, vec_out);
    cudaLaunchCheck();
}

// permute backward: dx[n] (=|+=) the dxp rows of token n, summed in
// ascending row. No sort: one pass lists each token's rows in the order
// integer atomics hand out slots (counts exact, order timing-dependent), and
// the gather, one block per token with 8 channels a thread, puts the list in
// ascending order in each warp before adding. A token with more rows than a
// list holds (never with top-k routing, k <= 32) scans token_of_row instead.
#define PERMUTE_LIST 32  // rows listed per token: one per lane

// cnt[t] = rows of token t (zeroed before); list[t, 0..min(cnt[t], 32))
static __global__ void permute_list_kernel(int *cnt, int *list, const int *token_of_row, int R) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= R) return;
    int t = token_of_row[r];
    int slot = atomicAdd(&cnt[t], 1);
    if (slot < PERMUTE_LIST) list[(size_t)t * PERMUTE_LIST + slot] = r;
}

// acc += src rows r_0 < r_1 < ... < r_{count-1} (lane i holds r_i), in
// that order, ADD_ROWS loads in flight at a time
#define ADD_ROWS 4
template <bool VEC>
__device__ __forceinline__ void add_rows(float acc[8], int row, int count, const bf16 *src, int c, int C) {
    for (int i0 = 0; i0 < count; i0 += ADD_ROWS) {
        float f[ADD_ROWS][8];
#pragma unroll
        for (int u = 0; u < ADD_ROWS; u++) {
            int r = __shfl_sync(0xffffffffu, row, (i0 + u) & (WARP - 1));
            load8_row<VEC>(src + (size_t)r * C, i0 + u < count ? c : C, C, f[u]);
        }
#pragma unroll
        for (int u = 0; u < ADD_ROWS; u++)
            if (i0 + u < count)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[j] += f[u][j];
    }
}

template <bool VEC>
static __global__ void __launch_bounds__(ROW_BLOCK_MAX)
    permute_backward_kernel(bf16 *dx, const bf16 *dxp, const int *cnt, const int *list, const int *token_of_row,
                            int R, int C, int accumulate) {
    int n = blockIdx.x, lane = threadIdx.x % WARP;
    int L = cnt[n];
    bool listed = L <= PERMUTE_LIST;
    int mine = listed && lane < L ? list[(size_t)n * PERMUTE_LIST + lane] : INT_MAX; // only the written entries
    // lane i takes the listed row of rank i (rows are distinct)
    int rank = 0, sorted = 0;
    for (int j = 0; j < L && listed; j++) rank += __shfl_sync(0xffffffffu, mine, j) < mine;
    for (int j = 0; j < L && listed; j++) {
        int rj = __shfl_sync(0xffffffffu, mine, j), kj = __shfl_sync(0xffffffffu, rank, j);
        if (kj == lane) sorted = rj;
    }
    bf16 *d = dx + (size_t)n * C;
    for (int c0 = (threadIdx.x - lane) * 8; c0 < C; c0 += blockDim.x * 8) {  // warp-uniform: lanes past C idle
        int c = c0 + lane * 8;
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (accumulate) load8_row<VEC>(d, c, C, acc);
        if (listed) add_rows<VEC>(acc, sorted, L, dxp, c, C);
        else
            for (int base = 0; base < R; base += WARP) {  // the i-th match of 32 rows to lane i
                unsigned m = __ballot_sync(0xffffffffu, base + lane < R && token_of_row[base + lane] == n);
                add_rows<VEC>(acc, base + (int)__fns(m, 0, lane + 1), __popc(m), dxp, c, C);
            }
        store8_row<VEC>(d, c, C, acc);
    }
}

extern "C" void cuda_permute_backward(void *dx, const void *dxp, const int *token_of_row, int N, int R, int C,
                                      int accumulate) {
    static Scratch s;
    if (N <= 0 || C <= 0) return;
    if (R > 0) {
        int *cnt = (int *)scratch_get(&s, (size_t)N * (1 + PERMUTE_LIST) * sizeof(int)), *list = cnt + N;
        cudaCheck(cudaMemsetAsync(cnt, 0, (size_t)N * sizeof(int), cuda_stream()));
        permute_list_kernel<<<ceil_div(R, 256), 256, 0, cuda_stream()>>>(cnt, list, token_of_row, R);
        cudaLaunchCheck();
        bool vec = C % 8 == 0 && aligned16(dx) && aligned16(dxp);
        (vec ? permute_backward_kernel<true> : permute_backward_kernel<false>)<<<N, row_block_threads(C), 0,
                                                                                 cuda_stream()>>>(
            (bf16 *)dx, (const bf16 *)dxp, cnt, list, token_of_row, R, C, accumulate);
        cudaLaunchCheck();
    } else if (!accumulate) {
        cudaCheck(cudaMemsetAsync(dx, 0, (size_t)N * C * sizeof(bf16), cuda_stream()));
    }
}

// ---------------------------------------------------------------------------
// Unpermute

// out[n] (=|+=) sum_s weights[n,s] y[row_of[n,s]], s ascending; with res
// (unpermute_residual), out[n] = res[n] + that sum rounded to BF16, in FP32
// and rounded again: unpermute_forward's then sum_act's roundings.
static __global__ void unpermute_forward_kernel(bf16 *out, const bf16 *y, const float *weights, const int *row_of,
                                                int N, int k, int C, int accumulate, bool vec,
                                                const bf16 *res = nullptr) {
    int n = blockIdx.x * ROW_WARPS + threadIdx.x / WARP;
    int c = (blockIdx.y * WARP + threadIdx.x % WARP) * 8;
    if (n >= N || c >= C) return;
    float acc[8], f[8];
    bf16 *o = out + (size_t)n * C;
    if (accumulate) load8(o, c, C, vec, acc);
    else
#pragma unroll
        for (int u = 0; u < 8; u++) acc[u] = 0.f;
#pragma unroll 4
    for (int s = 0; s < k; s++) {
        float w = weights[(size_t)n * k + s];
        load8(y + (size_t)row_of[(size_t)n * k + s] * C, c, C, vec, f);
#pragma unroll
        for (int u = 0; u < 8; u++) acc[u] += w * f[u];
    }
    if (res) {
        load8(res + (size_t)n * C, c, C, vec, f);
#pragma unroll
        for (int u = 0; u < 8; u++) acc[u] = f[u] + __bfloat162float(__float2bfloat16_rn(acc[u]));
    }
    store8(o, c, C, vec, acc);
}

extern "C" void cuda_unpermute_forward(void *out, const void *y, const float *weights, const int *row_of, int N,
                                       int k, int C, int accumulate) {
    if (N <= 0 || C <= 0) return;
    bool vec = C % 8 == 0 && aligned16(out) && aligned16(y);
    dim3 grid(row_blocks(N), ceil_div(C, WARP * 8));
    unpermute_forward_kernel<<<grid, ROW_THREADS, 0, cuda_stream()>>>((bf16 *)out, (const bf16 *)y, weights, row_of,
                                                                      N, k, C, accumulate, vec);
    cudaLaunchCheck();
}

extern "C" void cuda_unpermute_residual(void *out, const void *res, const void *y, const float *weights,
                                        const int *row_of, int N, int k, int C) {
    if (N <= 0 || C <= 0) return;
    bool vec = C % 8 == 0 && aligned16(out) && aligned16(y) && aligned16(res);
    dim3 grid(row_blocks(N), ceil_div(C, WARP * 8));
    unpermute_forward_kernel<<<grid, ROW_THREADS, 0, cuda_stream()>>>((bf16 *)out, (const bf16 *)y, weights, row_of,
                                                                      N, k, C, 0, vec, (const bf16 *)res);
    cudaLaunchCheck();
}

extern "C" void cuda_unpermute_backward(void *dy, float *dweights, const void *dout, const void *y,
                                        const float *weights, const int *row_of, int N, int k, int C) {
    if (N <= 0) return;
    bool vec = C % 8 == 0 && aligned16(dy) && aligned16(dout) && aligned16(y);
    (vec ? unpermute_backward_kernel<true> : unpermute_backward_kernel<false>)<<<N, row_block_threads(C), 0,
                                                                                 cuda_stream()>>>(
        (bf16 *)dy, dweights, (const bf16 *)dout, (const bf16 *)y, weights, row_of, N, k, C, NoRowHook{});
    cudaLaunchCheck();
}

// ---------------------------------------------------------------------------
// Capacity (tail drop) and the per-expert counts of expert parallelism. Both
// read the segment offsets in device memory, so the host never sees the
// counts (capture-safe).

// One warp per row r < R: the segment holding r is the last e with
// offsets[e] <= r (binary search; empty segments are skipped since the next
// one starts at the same row); the row is zeroed when it lies `capacity` or
// more rows into its segment.
static __global__ void capacity_drop_kernel(bf16 *y, const int *__restrict__ offsets, int E, int R, int C,
                                            int capacity, bool vec) {
    int r = blockIdx.x * ROW_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (r >= R || r >= offsets[E]) return;
    int lo = 0, hi = E - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (offsets[mid] <= r) lo = mid;
        else hi = mid - 1;
    }
    if (r - offsets[lo] < capacity) return;
    bf16 *o = y + (size_t)r * C;
    if (!vec) {
        for (int c = lane; c < C; c += WARP) o[c] = __float2bfloat16(0.f);
        return;
    }
    for (int c = lane * 8; c < C; c += WARP * 8) *reinterpret_cast<uint4 *>(o + c) = make_uint4(0, 0, 0, 0);
}

// dropped[0] += sum_e max(0, size_e - capacity): one block, integer partials
// (exact), one FP32 add of the total, as the CPU does.
static __global__ void capacity_count_kernel(float *dropped, const int *__restrict__ offsets, int E, int capacity) {
    long long n = 0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int over = offsets[e + 1] - offsets[e] - capacity;
        if (over > 0) n += over;
    }
    n = block_sum(n);
    if (threadIdx.x == 0) dropped[0] += (float)n;
}

extern "C" void cuda_moe_capacity_drop(void *y, float *dropped, const int *offsets, int E, int R, int C,
                                       int capacity) {
    if (E <= 0) return;
    if (R > 0 && C > 0) {
        bool vec = C % 8 == 0 && aligned16(y);
        capacity_drop_kernel<<<row_blocks(R), ROW_THREADS, 0, cuda_stream()>>>((bf16 *)y, offsets, E, R, C,
                                                                             capacity, vec);
        cudaLaunchCheck();
    }
    if (dropped) {
        capacity_count_kernel<<<1, 256, 0, cuda_stream()>>>(dropped, offsets, E, capacity);
        cudaLaunchCheck();
    }
}

static __global__ void segment_sizes_kernel(int *sizes, const int *__restrict__ offsets, int E) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e < E) sizes[e] = offsets[e + 1] - offsets[e];
}

extern "C" void cuda_moe_segment_sizes(int *sizes, const int *offsets, int E) {
    if (E <= 0) return;
    segment_sizes_kernel<<<ceil_div(E, 256), 256, 0, cuda_stream()>>>(sizes, offsets, E);
    cudaLaunchCheck();
}
