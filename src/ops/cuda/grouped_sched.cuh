// The tile scheduler shared by the grouped GEMM kernels (gemm.cu,
// grouped_wgmma.cu): every block copies the E+1 expert offsets from device
// memory into shared memory and computes, with one warp's prefix sum, the
// first output-tile index of each expert (ceil(rows_e / BM) row tiles times
// col_tiles column tiles); a tile index then maps to its expert by binary
// search. The host never reads the offsets.
#pragma once

// Loads offsets[0..E] into s_off. All threads call it; ends with a barrier.
template <int THREADS>
__device__ __forceinline__ void grouped_load_offsets(const int *offsets, int E, int *s_off) {
    for (int i = threadIdx.x; i <= E; i += THREADS) s_off[i] = offsets[i];
    __syncthreads();
}

// After grouped_load_offsets: s_tile[e] = first tile of expert e, s_tile[E]
// = all tiles, which it returns. All threads call it; ends with a barrier.
template <int BM>
__device__ __forceinline__ int grouped_tile_prefix(const int *s_off, int E, int col_tiles, int *s_tile) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (warp == 0) { // exclusive prefix sum of tiles per expert, 32 experts at a time
        int carry = 0;
        for (int base = 0; base < E; base += 32) {
            int e = base + lane, v = 0;
            if (e < E) {
                int rows = s_off[e + 1] - s_off[e];
                v = rows > 0 ? (rows + BM - 1) / BM * col_tiles : 0;
            }
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                int y = __shfl_up_sync(0xffffffffu, v, d);
                if (lane >= d) v += y;
            }
            if (e < E) s_tile[e + 1] = carry + v;
            carry += __shfl_sync(0xffffffffu, v, 31);
        }
        if (lane == 0) s_tile[0] = 0;
    }
    __syncthreads();
    return s_tile[E];
}

// The expert of tile t (0 <= t < s_tile[E]): the last e whose first tile
// s_tile[e] is <= t (experts without tiles share their successor's first
// tile and are passed over).
__host__ __device__ __forceinline__ int grouped_tile_expert(int t, const int *s_tile, int E) {
    int lo = 0, hi = E - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (s_tile[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}
