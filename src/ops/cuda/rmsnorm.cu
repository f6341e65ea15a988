// RMSNorm forward and backward over rows of C channels: BF16 rows and
// weight, FP32 rstd per row (saved by the forward), FP32 dw, which the
// backward adds into.
//
// Three paths by C (the first two for C a multiple of 8 and 16-byte aligned
// rows):
// - C <= 512 (QK-norm's heads): one warp per row holding the row in
//   registers, V 16-byte vectors per lane;
// - C <= 2048 (d_model): C / 8 threads per row, one 16-byte vector of each
//   operand per thread, on a persistent grid of G blocks: block b takes
//   rows b, b + G, ... and issues row i + G's loads before reducing row i,
//   so loads stay in flight through each row's reduction (block_sums, one
//   barrier) and stores. The forward's blocks are one row wide (32
//   registers: 8 blocks per SM); the backward's hold several rows' groups
//   of threads, one block per SM, so that its dw partials are few;
// - otherwise a general warp-per-row kernel that reads the row twice (the
//   second time from cache).
//
// Numerics: FP32. Each row's sum (of x^2; of x w dy) is a warp butterfly or
// block_sums' warps in order. dw takes no atomics: each block of the
// backward writes a partial row [G, C] (the persistent grids' blocks, or the
// general path's G = min(N, 128) slices of rows), and column_sum_kernel adds
// their column sums, in FP64 and a fixed order, into dw. The grids depend
// only on the shape and the GPU (occupancy), so results are reproducible.
#include "ops/cuda/memkernels.cuh"

template <int V>
static __global__ void __launch_bounds__(ROW_THREADS)
    rmsnorm_forward_reg_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int N, int C, float eps) {
    int row = blockIdx.x * ROW_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N) return;
    const bf16 *x = inp + (size_t)row * C;
    uint4 xr[V];
    float ss = 0.f;
#pragma unroll
    for (int v = 0; v < V; v++) {
        int c = (v * WARP + lane) * 8;
        if (c < C) xr[v] = *reinterpret_cast<const uint4 *>(x + c);
    }
#pragma unroll
    for (int v = 0; v < V; v++) {
        int c = (v * WARP + lane) * 8;
        if (c < C) {
            float f[8];
            unpack8(xr[v], f);
#pragma unroll
            for (int j = 0; j < 8; j++) ss += f[j] * f[j];
        }
    }
    ss = warp_sum(ss);
    float r = 1.f / sqrtf(ss / C + eps);
#pragma unroll
    for (int v = 0; v < V; v++) {
        int c = (v * WARP + lane) * 8;
        if (c < C) {
            float f[8], wf[8], o[8];
            unpack8(xr[v], f);
            unpack8(*reinterpret_cast<const uint4 *>(w + c), wf);
#pragma unroll
            for (int j = 0; j < 8; j++) o[j] = f[j] * r * wf[j];
            *reinterpret_cast<uint4 *>(out + (size_t)row * C + c) = pack8(o);
        }
    }
    if (lane == 0) rstd[row] = r;
}

// 16 bytes at channel c of row `row` of a [N, C] array: zeros past N or C
__device__ __forceinline__ uint4 load_row16(const bf16 *a, int row, int N, int C, int c) {
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < N && c < C) v = *reinterpret_cast<const uint4 *>(a + (size_t)row * C + c);
    return v;
}

// RoPE (rmsnorm_rope_*, QK-norm then RoPE in one pass) on the 8 channels c..
// of a row whose position is t: v holds them as BF16, the partner half of
// their head (channels c -+ hd/2) is in lane ^ hd/16 of the same warp, which
// every lane of the warp must call this for. Returns them rotated, as
// rope_forward (sign 1) or rope_backward (-1) would from v.
struct RopeArgs {
    const float *cos_t, *sin_t;
    int T, hd;       // positions (rows are (b, t)); head dim (a power of two, 16..256)
};
__device__ __forceinline__ void rope8(uint4 v, int row, int c, const RopeArgs &ra, float sign, float o[8]) {
    int sh = ra.hd / 16, half = ra.hd / 2, hh = c & (ra.hd - 1), i = hh & (half - 1);
    uint4 p;
    p.x = __shfl_xor_sync(0xffffffffu, v.x, sh);
    p.y = __shfl_xor_sync(0xffffffffu, v.y, sh);
    p.z = __shfl_xor_sync(0xffffffffu, v.z, sh);
    p.w = __shfl_xor_sync(0xffffffffu, v.w, sh);
    float mine[8], other[8];
    unpack8(v, mine);
    unpack8(p, other);
    bool lo = hh < half;
    const float *cp = ra.cos_t + (size_t)(row % ra.T) * half + i, *sp = ra.sin_t + (cp - ra.cos_t);
#pragma unroll
    for (int q = 0; q < 2; q++) {
        float4 c4 = reinterpret_cast<const float4 *>(cp)[q], s4 = reinterpret_cast<const float4 *>(sp)[q];
        float cs[4] = {c4.x, c4.y, c4.z, c4.w}, sn[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int j = 4 * q + u;
            o[j] = lo ? rope_first(mine[j], other[j], cs[u], sn[u], sign)
                      : rope_second(other[j], mine[j], cs[u], sn[u], sign);
        }
    }
}

// Block per row: row i + G is in flight while row i is reduced. ROPE: the
// normed row (rounded to BF16, as it would be stored) is rotated and stored
// instead.
template <bool ROPE>
static __global__ void __launch_bounds__(ROW_BLOCK_MAX, ROPE ? 4 : 8)
    rmsnorm_forward_block_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int N, int C, float eps,
                                 RopeArgs ra) {
    __shared__ float red[2][MAX_WARPS];
    int c = threadIdx.x * 8;
    bool on = c < C;
    uint4 wr = load_row16(w, 0, 1, C, c), xn = load_row16(inp, blockIdx.x, N, C, c);
    for (int row = blockIdx.x, slot = 0; row < N; row += gridDim.x, slot ^= 1) {
        uint4 xr = xn;
        int next = row + gridDim.x;
        if (on && next < N) xn = *reinterpret_cast<const uint4 *>(inp + (size_t)next * C + c);
        float f[8], wf[8], ss[1] = {0.f};
        unpack8(xr, f);
#pragma unroll
        for (int j = 0; j < 8; j++) ss[0] += f[j] * f[j];
        block_sums<1>(ss, red[slot], 0, blockDim.x / WARP);
        float r = 1.f / sqrtf(ss[0] / C + eps);
        unpack8(wr, wf);
#pragma unroll
        for (int j = 0; j < 8; j++) f[j] = f[j] * r * wf[j];
        uint4 o = pack8(f);
        if (ROPE) { // every lane: the partner's channels come by shuffle
            float g[8];
            rope8(o, row, c, ra, 1.f, g);
            o = pack8(g);
        }
        if (on) *reinterpret_cast<uint4 *>(out + (size_t)row * C + c) = o;
        if (threadIdx.x == 0) rstd[row] = r;
    }
}

static __global__ void rmsnorm_forward_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int N, int C,
                                              float eps, bool vec) {
    int row = blockIdx.x * ROW_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N) return;
    const bf16 *x = inp + (size_t)row * C;
    float ss = 0.f, f[8], wf[8];
    for (int c = lane * 8; c < C; c += WARP * 8) {
        load8(x, c, C, vec, f);
#pragma unroll
        for (int j = 0; j < 8; j++) ss += f[j] * f[j];
    }
    ss = warp_sum(ss);
    float r = 1.f / sqrtf(ss / C + eps);
    for (int c = lane * 8; c < C; c += WARP * 8) {
        load8(x, c, C, vec, f);
        load8(w, c, C, vec, wf);
#pragma unroll
        for (int j = 0; j < 8; j++) f[j] = f[j] * r * wf[j];
        store8(out + (size_t)row * C, c, C, vec, f);
    }
    if (lane == 0) rstd[row] = r;
}

extern "C" void cuda_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *w, int N, int C,
                                     float eps) {
    if (N <= 0 || C <= 0) return;
    bool vec = C % 8 == 0 && aligned16(out) && aligned16(inp) && aligned16(w);
    int nvec = C / 8, grid = row_blocks(N);
    bf16 *o = (bf16 *)out;
    const bf16 *x = (const bf16 *)inp, *wb = (const bf16 *)w;
    cudaStream_t st = cuda_stream();
    if (vec && nvec <= 1 * WARP) rmsnorm_forward_reg_kernel<1><<<grid, ROW_THREADS, 0, st>>>(o, rstd, x, wb, N, C, eps);
    else if (vec && nvec <= 2 * WARP) rmsnorm_forward_reg_kernel<2><<<grid, ROW_THREADS, 0, st>>>(o, rstd, x, wb, N, C, eps);
    else if (vec && nvec <= ROW_BLOCK_MAX) {
        static int per_sm[MAX_WARPS + 1];
        int threads = row_block_threads(C);
        int G = persistent_blocks(rmsnorm_forward_block_kernel<false>, threads, 0, per_sm, N);
        rmsnorm_forward_block_kernel<false><<<G, threads, 0, st>>>(o, rstd, x, wb, N, C, eps, RopeArgs{});
    } else rmsnorm_forward_kernel<<<grid, ROW_THREADS, 0, st>>>(o, rstd, x, wb, N, C, eps, vec);
    cudaLaunchCheck();
}

// Backward, dx = r w dy - x r^3 mean(x w dy) (=|+=), per row; dw partials
// [G, C] that column_sum_kernel adds into dw. Each thread reads and writes
// the same elements, so dinp may alias dout.
//
// Warp per row (C <= 512): a persistent grid of G blocks; warp g of the grid
// takes rows g, g + 8G, ... and keeps its dw in registers (every warp's
// lanes own the same channels); the block's 8 warps then add theirs into
// shared memory in warp order and write one partial row.
// 8 channels of a row: g (=|+=) r w dy - x kk (g holds the old dx when
// accumulating), dw += dy x r
__device__ __forceinline__ void rmsnorm_dx8(float g[8], float dw[8], const float xf[8], const float wf[8],
                                            const float df[8], float r, float kk, int accumulate) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float gj = r * wf[j] * df[j] - xf[j] * kk;
        g[j] = accumulate ? g[j] + gj : gj;
        dw[j] += df[j] * xf[j] * r;
    }
}

template <int V>
static __global__ void __launch_bounds__(ROW_THREADS)
    rmsnorm_backward_reg_kernel(bf16 *dinp, float *partial, const bf16 *dout, const bf16 *inp, const bf16 *w,
                                const float *rstd, int N, int C, int accumulate, RopeArgs) {
    extern __shared__ float sdw[];  // [C]
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    uint4 wr[V];
    float dw[V][8];
#pragma unroll
    for (int v = 0; v < V; v++) {
        int c = (v * WARP + lane) * 8;
        if (c < C) wr[v] = *reinterpret_cast<const uint4 *>(w + c);
#pragma unroll
        for (int j = 0; j < 8; j++) dw[v][j] = 0.f;
    }
    for (int row = blockIdx.x * ROW_WARPS + warp; row < N; row += gridDim.x * ROW_WARPS) {
        const bf16 *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
        bf16 *dx = dinp + (size_t)row * C;
        uint4 xr[V], dyr[V];
#pragma unroll
        for (int v = 0; v < V; v++) {
            int c = (v * WARP + lane) * 8;
            if (c < C) {
                xr[v] = *reinterpret_cast<const uint4 *>(x + c);
                dyr[v] = *reinterpret_cast<const uint4 *>(dy + c);
            }
        }
        float r = rstd[row];
        float dot = 0.f;
#pragma unroll
        for (int v = 0; v < V; v++) {
            int c = (v * WARP + lane) * 8;
            if (c < C) {
                float xf[8], wf[8], df[8];
                unpack8(xr[v], xf);
                unpack8(wr[v], wf);
                unpack8(dyr[v], df);
#pragma unroll
                for (int j = 0; j < 8; j++) dot += xf[j] * wf[j] * df[j];
            }
        }
        dot = warp_sum(dot);
        float kk = (dot / C) * r * r * r;
#pragma unroll
        for (int v = 0; v < V; v++) {
            int c = (v * WARP + lane) * 8;
            if (c < C) {
                float xf[8], wf[8], df[8], g[8];
                unpack8(xr[v], xf);
                unpack8(wr[v], wf);
                unpack8(dyr[v], df);
                if (accumulate) unpack8(*reinterpret_cast<const uint4 *>(dx + c), g);
                rmsnorm_dx8(g, dw[v], xf, wf, df, r, kk, accumulate);
                *reinterpret_cast<uint4 *>(dx + c) = pack8(g);
            }
        }
    }
    for (int wi = 0; wi < ROW_WARPS; wi++) {
        if (warp == wi) {
#pragma unroll
            for (int v = 0; v < V; v++) {
                int c = (v * WARP + lane) * 8;
                if (c < C)
#pragma unroll
                    for (int j = 0; j < 8; j++) sdw[c + j] = (wi ? sdw[c + j] : 0.f) + dw[v][j];
            }
        }
        __syncthreads();
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) partial[(size_t)blockIdx.x * C + c] = sdw[c];
}

// Block per row (C <= 2048), one block per SM: its groups of T =
// row_block_threads(C) threads each take one row of every set of `groups`
// consecutive rows; block b takes sets b, b + G, ... and loads set s + G
// while reducing set s. Each thread keeps its 8 channels' dw in registers;
// at the end the groups' dw are added in group order into the block's
// partial row (G = the SM count: few partials for column_sum_kernel). The
// block is as large as the registers allow: 64 a thread at 1024 threads,
// 80 at 768 for the old dx's 16 bytes.
#define DW_BLOCK_THREADS(acc) ((acc) ? 768 : 1024)
template <int ACC, bool ROPE = false>
static __global__ void __launch_bounds__(DW_BLOCK_THREADS(ACC), 1)
    rmsnorm_backward_block_kernel(bf16 *dinp, float *partial, const bf16 *dout, const bf16 *inp, const bf16 *w,
                                  const float *rstd, int N, int C, int accumulate, RopeArgs ra) {
    __shared__ float red[2][MAX_WARPS], sdw[DW_BLOCK_THREADS(ACC) * 8];
    int T = row_block_threads(C), groups = blockDim.x / T, grp = threadIdx.x / T, c = threadIdx.x % T * 8;
    int stride = gridDim.x * groups, row = blockIdx.x * groups + grp;  // stride: rows from a set to the next
    uint4 wr = load_row16(w, 0, 1, C, c), xn = load_row16(inp, row, N, C, c), dyn = load_row16(dout, row, N, C, c);
    uint4 gn = ACC ? load_row16(dinp, row, N, C, c) : make_uint4(0, 0, 0, 0);
    float rn = row < N ? rstd[row] : 0.f, dw[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int first = blockIdx.x * groups, slot = 0; first < N; first += stride, row += stride, slot ^= 1) {
        float xf[8], wf[8], df[8], g[8], r = rn, dot[1] = {0.f};
        unpack8(xn, xf);
        if (ROPE) { // dout is the rotated rows' grad: rotated back, rounded to BF16 as rope_backward stores it
            float u[8];
            rope8(dyn, row, c, ra, -1.f, u);
            unpack8(pack8(u), df);
        } else {
            unpack8(dyn, df);
        }
        unpack8(gn, g);
        int next = row + stride;
        if (next < N) {  // past N the buffers keep stale rows, which are not stored
            size_t o = (size_t)next * C + c;
            if (c < C) {
                xn = *reinterpret_cast<const uint4 *>(inp + o);
                dyn = *reinterpret_cast<const uint4 *>(dout + o);
                if (ACC) gn = *reinterpret_cast<const uint4 *>(dinp + o);
            }
            rn = rstd[next];
        }
        unpack8(wr, wf);
#pragma unroll
        for (int j = 0; j < 8; j++) dot[0] += xf[j] * wf[j] * df[j];
        block_sums<1>(dot, red[slot], grp * T / WARP, T / WARP);
        float kk = (dot[0] / C) * r * r * r;
        if (row < N && c < C) {
            rmsnorm_dx8(g, dw, xf, wf, df, r, kk, ACC);
            *reinterpret_cast<uint4 *>(dinp + (size_t)row * C + c) = pack8(g);
        }
    }
    if (c < C) store8(sdw + grp * C, c, C, true, dw);
    __syncthreads();
    if (grp == 0 && c < C) {
        float f[8];
        for (int k = 1; k < groups; k++) {
            load8(sdw + k * C, c, C, true, f);
#pragma unroll
            for (int j = 0; j < 8; j++) dw[j] += f[j];
        }
        store8(partial + (size_t)blockIdx.x * C, c, C, true, dw);
    }
}

// General path, dx only (dw by rmsnorm_dw_partial_kernel, launched first so
// that dinp may alias dout).
static __global__ void rmsnorm_backward_kernel(bf16 *dinp, const bf16 *dout, const bf16 *inp, const bf16 *w,
                                               const float *rstd, int N, int C, int accumulate, bool vec) {
    int row = blockIdx.x * ROW_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N) return;
    const bf16 *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    bf16 *dx = dinp + (size_t)row * C;
    float r = rstd[row], dot = 0.f, xf[8], wf[8], df[8], g[8];
    for (int c = lane * 8; c < C; c += WARP * 8) {
        load8(x, c, C, vec, xf);
        load8(w, c, C, vec, wf);
        load8(dy, c, C, vec, df);
#pragma unroll
        for (int j = 0; j < 8; j++) dot += xf[j] * wf[j] * df[j];
    }
    dot = warp_sum(dot);
    float kk = (dot / C) * r * r * r;
    for (int c = lane * 8; c < C; c += WARP * 8) {
        load8(x, c, C, vec, xf);
        load8(w, c, C, vec, wf);
        load8(dy, c, C, vec, df);
        if (accumulate) load8(dx, c, C, vec, g);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float gj = r * wf[j] * df[j] - xf[j] * kk;
            g[j] = accumulate ? g[j] + gj : gj;
        }
        store8(dx, c, C, vec, g);
    }
}

// partial[g, c] = sum of dy x r over rows [g N/G, (g+1) N/G), one thread per
// channel (coalesced across the block)
static __global__ void rmsnorm_dw_partial_kernel(float *partial, const bf16 *dout, const bf16 *inp,
                                                 const float *rstd, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, g = blockIdx.y, G = gridDim.y;
    if (c >= C) return;
    int r0 = (int)((long)N * g / G), r1 = (int)((long)N * (g + 1) / G);
    float s = 0.f;
    for (int r = r0; r < r1; r++)
        s += __bfloat162float(dout[(size_t)r * C + c]) * __bfloat162float(inp[(size_t)r * C + c]) * rstd[r];
    partial[(size_t)g * C + c] = s;
}

// dw[c] += sum over g of partial[g, c]: 32 channels x 32 slices of g per
// block, the slices then summed in order. A slice's loads go 8 at a time
// (the partials of a persistent grid are hundreds of rows).
static __global__ void column_sum_kernel(float *dw, const float *partial, int G, int C) {
    __shared__ double sh[32][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    double s = 0;
    if (c < C)
        for (int g0 = threadIdx.y; g0 < G; g0 += 8 * 32) {
            float p[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                int g = g0 + u * 32;
                p[u] = g < G ? partial[(size_t)g * C + c] : 0.f;
            }
#pragma unroll
            for (int u = 0; u < 8; u++) s += p[u];
        }
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        double t = 0;
        for (int y = 0; y < 32; y++) t += sh[y][threadIdx.x];
        dw[c] += (float)t;
    }
}

typedef void (*RmsnormDwKernel)(bf16 *, float *, const bf16 *, const bf16 *, const bf16 *, const float *, int, int,
                                int, RopeArgs);

// A fast path's kernel on its persistent grid (blocks of `threads` taking
// rows_per_block rows at a time; each block writes a partial row), then the
// partials' column sums into dw.
static void rmsnorm_backward_persistent(RmsnormDwKernel kernel, int threads, size_t smem, int rows_per_block,
                                        int *per_sm, Scratch *s, bf16 *dinp, float *dw, const bf16 *dout,
                                        const bf16 *inp, const bf16 *w, const float *rstd, int N, int C,
                                        int accumulate, RopeArgs ra = RopeArgs{}) {
    int G = persistent_blocks(kernel, threads, smem, per_sm, ceil_div(N, rows_per_block));
    float *partial = (float *)scratch_get(s, (size_t)G * C * sizeof(float));
    kernel<<<G, threads, smem, cuda_stream()>>>(dinp, partial, dout, inp, w, rstd, N, C, accumulate, ra);
    cudaLaunchCheck();
    column_sum_kernel<<<ceil_div(C, 32), dim3(32, 32), 0, cuda_stream()>>>(dw, partial, G, C);
    cudaLaunchCheck();
}

// the warp-per-row kernel's shared memory, sized for its largest C
template <int V>
static void rmsnorm_backward_reg(Scratch *s, bf16 *dinp, float *dw, const bf16 *dout, const bf16 *inp,
                                 const bf16 *w, const float *rstd, int N, int C, int accumulate) {
    static int per_sm[MAX_WARPS + 1];
    rmsnorm_backward_persistent(rmsnorm_backward_reg_kernel<V>, ROW_THREADS, V * WARP * 8 * sizeof(float), ROW_WARPS,
                                per_sm, s, dinp, dw, dout, inp, w, rstd, N, C, accumulate);
}

extern "C" void cuda_rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                                      const float *rstd, int N, int C, int accumulate) {
    static Scratch s;
    static int per_sm[2][MAX_WARPS + 1];
    if (N <= 0 || C <= 0) return;
    bool vec = C % 8 == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(w);
    int nvec = C / 8;
    bf16 *dx = (bf16 *)dinp;
    const bf16 *dy = (const bf16 *)dout, *x = (const bf16 *)inp, *wb = (const bf16 *)w;
    if (vec && nvec <= 1 * WARP) return rmsnorm_backward_reg<1>(&s, dx, dw, dy, x, wb, rstd, N, C, accumulate);
    if (vec && nvec <= 2 * WARP) return rmsnorm_backward_reg<2>(&s, dx, dw, dy, x, wb, rstd, N, C, accumulate);
    if (vec && nvec <= ROW_BLOCK_MAX) {
        int T = row_block_threads(C), groups = DW_BLOCK_THREADS(accumulate) / T;
        return rmsnorm_backward_persistent(
            accumulate ? rmsnorm_backward_block_kernel<1> : rmsnorm_backward_block_kernel<0>, groups * T, 0, groups,
            per_sm[accumulate != 0], &s, dx, dw, dy, x, wb, rstd, N, C, accumulate);
    }
    int G = N < 128 ? N : 128;
    float *partial = (float *)scratch_get(&s, (size_t)G * C * sizeof(float));
    rmsnorm_dw_partial_kernel<<<dim3(ceil_div(C, 256), G), 256, 0, cuda_stream()>>>(partial, dy, x, rstd, N, C);
    cudaLaunchCheck();
    column_sum_kernel<<<ceil_div(C, 32), dim3(32, 32), 0, cuda_stream()>>>(dw, partial, G, C);
    cudaLaunchCheck();
    rmsnorm_backward_kernel<<<row_blocks(N), ROW_THREADS, 0, cuda_stream()>>>(dx, dy, x, wb, rstd, N, C, accumulate,
                                                                            vec);
    cudaLaunchCheck();
}

// ---------------------------------------------------------------------------
// QK-norm then RoPE (ops.h rmsnorm_rope_forward / _backward): fused into the
// block-per-row kernels where a row is one (b, t) of whole heads (C = nh hd,
// 512 < C <= 2048, hd a power of two 16..256); elsewhere the two ops in turn
// through tmp. Either way the bits of rmsnorm_forward then rope_forward
// (rope_backward then rmsnorm_backward).

static bool rope_fuses(int C, int nh, int hd, const void *a, const void *b, const void *c, const void *d,
                       const float *cs, const float *sn) {
    int nvec = C / 8;
    bool pow2 = hd >= 16 && hd <= 256 && (hd & (hd - 1)) == 0;
    return C % 8 == 0 && nvec > 2 * WARP && nvec <= ROW_BLOCK_MAX && pow2 && C == nh * hd && aligned16(a) &&
           aligned16(b) && aligned16(c) && aligned16(d) && aligned16(cs) && aligned16(sn);
}

extern "C" void cuda_rmsnorm_rope_forward(void *out, float *rstd, void *tmp, const void *inp, const void *w,
                                          const float *cos_t, const float *sin_t, int B, int T, int nh, int hd, int C,
                                          float eps) {
    long N = C > 0 ? (long)B * T * nh * hd / C : 0;
    if (N <= 0) return;
    if (!rope_fuses(C, nh, hd, out, inp, w, inp, cos_t, sin_t)) {
        cuda_rmsnorm_forward(tmp, rstd, inp, w, (int)N, C, eps);
        cuda_rope_forward(out, tmp, cos_t, sin_t, B, T, nh, hd);
        return;
    }
    static int per_sm[MAX_WARPS + 1];
    int threads = row_block_threads(C);
    int G = persistent_blocks(rmsnorm_forward_block_kernel<true>, threads, 0, per_sm, N);
    rmsnorm_forward_block_kernel<true><<<G, threads, 0, cuda_stream()>>>(
        (bf16 *)out, rstd, (const bf16 *)inp, (const bf16 *)w, (int)N, C, eps, RopeArgs{cos_t, sin_t, T, hd});
    cudaLaunchCheck();
}

extern "C" void cuda_rmsnorm_rope_backward(void *dinp, float *dw, void *tmp, const void *dout, const void *inp,
                                           const void *w, const float *rstd, const float *cos_t, const float *sin_t,
                                           int B, int T, int nh, int hd, int C, int accumulate) {
    static Scratch s;
    static int per_sm[2][MAX_WARPS + 1];
    long N = C > 0 ? (long)B * T * nh * hd / C : 0;
    if (N <= 0) return;
    if (!rope_fuses(C, nh, hd, dinp, dout, inp, w, cos_t, sin_t)) {
        cuda_rope_backward(tmp, dout, cos_t, sin_t, B, T, nh, hd);
        cuda_rmsnorm_backward(dinp, dw, tmp, inp, w, rstd, (int)N, C, accumulate);
        return;
    }
    int Tr = row_block_threads(C), groups = DW_BLOCK_THREADS(accumulate) / Tr;
    rmsnorm_backward_persistent(accumulate ? rmsnorm_backward_block_kernel<1, true>
                                           : rmsnorm_backward_block_kernel<0, true>,
                                groups * Tr, 0, groups, per_sm[accumulate != 0], &s, (bf16 *)dinp, dw,
                                (const bf16 *)dout, (const bf16 *)inp, (const bf16 *)w, rstd, (int)N, C, accumulate,
                                RopeArgs{cos_t, sin_t, T, hd});
}
