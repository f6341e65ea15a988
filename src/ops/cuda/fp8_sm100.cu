// The MXFP8 grouped GEMM forward on Blackwell (sm_100a; issue 18):
//   out[R, OC] (BF16) = dequant_mx(qa) dequant_mx(qw_e)^T over the expert
//   segments offsets[e]..offsets[e+1] (device offsets; the host never reads
//   them), qa [R, C] E4M3 with E8M0 scale bytes sa [R, C/32], qw [E, OC, C]
//   with sw [E, OC, C/32]: fp8_quantize_mx's layouts (src/ops/fp8.h), the
//   reference fp8_grouped_matmul_mx_ref. The scales are applied by the
//   tensor cores (block-scaled MMA), the accumulation is in tensor memory.
//
// Compiled for sm_100a, never run: no Blackwell GPU was available; the test
// below is the check to run first on one. Nothing here has been executed,
// and every encoding is a reading of the PTX ISA (and of code that uses
// it), not a measurement. The test: `build/tests/gpu/test_fp8 mx`
// (tests/gpu/test_fp8.c) compares every output element with the CPU
// reference within an FP32 bound and checks that no row outside a segment
// is written. Nothing calls this kernel yet (train.precision: fp8 runs the
// Hopper block128 path).
//
// Tiles: one CTA of 128 threads per 128 x 128 output tile (BM = BN = 128)
// of one expert; the grid is an upper bound on the tiles ((ceil(R/128) + E)
// x OC/128) and the tile of a CTA comes from the device offsets through
// grouped_sched.cuh (CTAs past the last tile return at once). K runs in
// blocks of 128 (one 128-byte swizzle row of E4M3) through a 4-stage ring
// in shared memory.
//   warp 0, the producer: per K block, its 32 lanes load the block's scale
//     words (4 E8M0 bytes = the four 32-blocks of K of one row, read as one
//     little-endian word: byte j is K block 4 kb + j) of the 128 A rows and
//     128 B rows into shared memory, in the order tcgen05.cp reads (below),
//     fence them for the async proxy and arrive on the stage's full
//     barrier; lane 0 also issues the two TMA loads (A: 128 rows x 128
//     bytes of qa from row r0 + m0; B: 128 rows of W_e from row e OC + n0;
//     128-byte swizzle) with expect_tx on the same barrier.
//   warp 1, lane 0, the MMA issuer: per K block, waits for the stage, copies
//     its scales into tensor memory (tcgen05.cp), issues four
//     tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.scale_vec::1X
//     (K = 32 each, one scale per row and MMA), and tcgen05.commit's the
//     stage's empty barrier (the producer may refill it once these MMAs and
//     copies have completed); after the last block, a commit to the
//     accumulator barrier.
//   all 4 warps, the epilogue: wait for the accumulator barrier, read it
//     with tcgen05.ld (warp w may read lanes 32w..32w+31, i.e. tile rows
//     32w..32w+31), convert to BF16 and store 64 bytes per thread and pass,
//     only for rows inside the tile's segment (rows past it were computed
//     from the next expert's rows or TMA's zero fill, and are dropped).
//
// Tensor memory (tcgen05.alloc of 256 columns by warp 0, freed by it at
// the end; 128 lanes x 32-bit columns):
//   columns 0..127: the FP32 accumulator. With M = 128 and cta_group::1,
//     row i of D is lane i and column j is column j (PTX ISA, tcgen05 "Data
//     path layout organization", layout D: M = 128).
//   columns 128 + 8 s .. + 7: stage s's scales, 4 columns of A then 4 of B.
//     For scale_vec::1X with M = 128 (and N = 128), the scale of row m is in
//     column m / 32, lane m % 32 of each 32-lane quarter (the copy
//     replicates the 32 lanes into all four), in byte j of the 32-bit
//     cell, j chosen per MMA by the instruction descriptor's scale-factor
//     IDs (PTX ISA, tcgen05 "Scale factor A/B" layouts). In shared memory
//     that is byte (m % 32) 16 + (m / 32) 4 + j for row m and 32-block j
//     of the K block: the 128 x 4 atom of CUTLASS's Sm1xxBlkScaledConfig
//     (K-major), which DeepGEMM's sm100 FP8 kernel also builds before its
//     tcgen05.cp. One region per stage, so that a copy never overwrites
//     scales an earlier MMA may still read: a stage's region is rewritten
//     only after its empty barrier, i.e. after the MMAs that read it
//     completed.
//
// The PTX pieces:
//   tcgen05.alloc / relinquish_alloc_permit / dealloc (cta_group::1): the
//     warp-wide allocation; the base address is written to shared memory
//     and read by all threads after tcgen05.fence::before_thread_sync,
//     bar.sync, tcgen05.fence::after_thread_sync.
//   cp.async.bulk.tensor.2d ... mbarrier::complete_tx::bytes (TMA) with
//     CU_TENSOR_MAP_SWIZZLE_128B: each 128-byte row r of a tile has its
//     16-byte chunks XOR-ed with r % 8, the "128B swizzle" K-major layout
//     the UMMA descriptor below names (8-row atoms of 1024 bytes).
//   Shared-memory matrix descriptors (PTX ISA, tcgen05 "Shared memory
//     descriptor"): start address >> 4 in bits 0-13, leading byte offset
//     >> 4 in 16-29, stride byte offset >> 4 in 32-45, the fixed value
//     0b001 in 46-48, base offset 49-51 (0: atoms are 1024-byte aligned),
//     swizzle mode in 61-63 (0 none, 2 = 128B). A and B: K-major 128B
//     swizzle, SBO 1024 (between 8-row groups), LBO unused (16); the k-th
//     MMA of a block starts 32 k bytes into the rows (the swizzle is a
//     function of the address, as for Hopper's wgmma; DeepGEMM and CUTLASS
//     advance the start address the same way). Scales: no swizzle, the
//     canonical K-major layout of 8 x 16-byte core matrices, SBO 128
//     between the four 8-row groups of the 32 x 16-byte source.
//   tcgen05.cp.cta_group::1.32x128b.warpx4: 32 rows x 16 bytes of shared
//     memory into 32 lanes x 4 columns, replicated into the four lane
//     quarters. Source row L (16 bytes) holds the words of tile rows L,
//     L + 32, L + 64, L + 96, so column c of lane L is row 32 c + L.
//   Instruction descriptor of kind::mxf8f6f4 with block scaling (PTX ISA,
//     tcgen05 "Instruction descriptor"; CUTLASS's UMMA::InstrDescriptor-
//     BlockScaled): bits 4-5 B's scale-factor ID, 7-9 A format (0 = E4M3),
//     10-12 B format (0 = E4M3), 15 / 16 A / B major (0 = K), 17-22 N >> 3,
//     23 scale type (1 = UE8M0), 24-28 M >> 4, 29-30 A's scale-factor ID,
//     31 K size (0: dense K = 32); the rest 0 (dense, no negation).
//   tcgen05.mma ... [d], adesc, bdesc, idesc, [sfa], [sfb], enable_input_d:
//     D (+)= (A x sfa) (B x sfb)^T; enable_input_d false on the first MMA
//     of the tile zeroes the accumulator. Issued by one thread; the copies
//     before it from the same thread are ordered before it (the tensor
//     pipe runs a thread's tcgen05 copies and MMAs in order).
//   tcgen05.commit.cta_group::1.mbarrier::arrive::one: the mbarrier gets
//     one arrival when all earlier tcgen05 operations of the thread are
//     complete (copies and MMAs: their shared memory may be reused).
//   tcgen05.ld.sync.aligned.32x32b.x32 + tcgen05.wait::ld: 32 consecutive
//     columns of the warp's 32 lanes, one lane (one tile row) per thread.
//
// Sizes: C % 128 == 0 (a K block is 4 whole scale words), OC % 128 == 0;
// qa, qw, out 16-byte aligned, sa, sw 4-byte aligned. A segment's rows need
// no alignment.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/fp8_cuda.h"
#include "ops/cuda/grouped_sched.cuh"
#include "ops/cuda/wgmma_util.cuh"
#include "ops/fp8.h"

#ifdef MOECORE_SM100A
namespace {

constexpr int MX_BM = 128, MX_BN = 128, MX_BK = 128; // BK in elements = bytes
constexpr int MX_UMMA_K = 32;                        // one MMA's K: one scale per row
constexpr int MX_STAGES = 4;
constexpr int MX_THREADS = 128;
constexpr int MX_A_BYTES = MX_BM * MX_BK, MX_B_BYTES = MX_BN * MX_BK; // 16 KB each
constexpr int MX_SF_BYTES = 128 * 4;   // a K block's scale words of 128 rows
constexpr int MX_ACC_COL = 0;          // accumulator: tensor memory columns 0..127
constexpr int MX_SF_COL = MX_BN;       // then 8 columns of scales per stage
constexpr uint32_t MX_TMEM_COLS = 256; // 128 + 4 x 8 = 160, allocated as a power of 2
static_assert(MX_SF_COL + 8 * MX_STAGES <= (int)MX_TMEM_COLS, "tensor memory columns");

// shared memory, from a 1024-byte-aligned base
constexpr int MX_OFF_A = 0;
constexpr int MX_OFF_B = MX_OFF_A + MX_STAGES * MX_A_BYTES;
constexpr int MX_OFF_SFA = MX_OFF_B + MX_STAGES * MX_B_BYTES;
constexpr int MX_OFF_SFB = MX_OFF_SFA + MX_STAGES * MX_SF_BYTES;
constexpr int MX_OFF_BAR = MX_OFF_SFB + MX_STAGES * MX_SF_BYTES; // full[S], empty[S], accumulator
constexpr int MX_OFF_TMEM = MX_OFF_BAR + 8 * (2 * MX_STAGES + 1); // tcgen05.alloc's address
constexpr int MX_OFF_SCHED = MX_OFF_TMEM + 8;                     // offsets [E+1], first tiles [E+1]
static_assert(MX_A_BYTES % 1024 == 0 && MX_OFF_SFA % 16 == 0, "swizzle atoms 1024-aligned, scales 16");

// the instruction descriptor (see the header), scale-factor IDs 0
constexpr uint32_t MX_IDESC = (0u << 7) | (0u << 10) | (0u << 15) | (0u << 16) | ((uint32_t)(MX_BN >> 3) << 17) |
                              (1u << 23) | ((uint32_t)(MX_BM >> 4) << 24);
// the same for the k-th MMA of a K block: scale byte k of A's and B's words
__device__ __forceinline__ uint32_t mx_idesc(int k) { return MX_IDESC | (uint32_t)k << 29 | (uint32_t)k << 4; }

// tcgen05 shared-memory matrix descriptor (see the header)
__device__ __forceinline__ uint64_t umma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo, uint32_t swizzle) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lbo >> 4) & 0x3FFF) << 16 |
           (uint64_t)((sbo >> 4) & 0x3FFF) << 32 | (uint64_t)1 << 46 | (uint64_t)swizzle << 61;
}
// K-major, 128-byte swizzle (A and B tiles)
__device__ __forceinline__ uint64_t umma_desc_sw128(uint32_t addr) { return umma_desc(addr, 16, 1024, 2); }
// the 32 x 16-byte scale words of one operand, no swizzle
__device__ __forceinline__ uint64_t umma_desc_sf(uint32_t addr) { return umma_desc(addr, 0, 128, 0); }

__device__ __forceinline__ void tmem_alloc(uint32_t dst_smem, uint32_t cols) {
    asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;\n" ::"r"(dst_smem), "r"(cols)
                 : "memory");
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void tmem_dealloc(uint32_t taddr, uint32_t cols) {
    asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;\n" ::"r"(taddr), "r"(cols) : "memory");
}
__device__ __forceinline__ void tc_fence_before() { asm volatile("tcgen05.fence::before_thread_sync;\n" ::: "memory"); }
__device__ __forceinline__ void tc_fence_after() { asm volatile("tcgen05.fence::after_thread_sync;\n" ::: "memory"); }
// one arrival on bar once this thread's earlier tcgen05 copies and MMAs are complete
__device__ __forceinline__ void tc_commit(uint32_t bar) {
    asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];\n" ::"r"(bar)
                 : "memory");
}
// 32 rows x 16 bytes of shared memory (desc) into 32 lanes x 4 columns at
// taddr, replicated into the four 32-lane quarters
__device__ __forceinline__ void tc_copy_scales(uint32_t taddr, uint64_t desc) {
    asm volatile("tcgen05.cp.cta_group::1.32x128b.warpx4 [%0], %1;\n" ::"r"(taddr), "l"(desc) : "memory");
}
// D[128 x 128] (+)= (A sfa)(B sfb)^T over K = 32: E4M3 x E4M3 with E8M0 scales
__device__ __forceinline__ void tc_mma_mx(uint32_t d, uint64_t a, uint64_t b, uint32_t idesc, uint32_t sfa,
                                          uint32_t sfb, int accumulate) {
    asm volatile("{\n.reg .pred p;\n"
                 "setp.ne.b32 p, %6, 0;\n"
                 "tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.scale_vec::1X [%0], %1, %2, %3, [%4], [%5], p;\n"
                 "}\n" ::"r"(d),
                 "l"(a), "l"(b), "r"(idesc), "r"(sfa), "r"(sfb), "r"(accumulate)
                 : "memory");
}
// columns taddr .. taddr + 31 of the warp's 32 lanes: v[j] = column j of
// this thread's lane. The wait is in the same statement, so that no use of
// v can be placed before it.
__device__ __forceinline__ void tc_load_32(uint32_t taddr, uint32_t (&v)[32]) {
    asm volatile("tcgen05.ld.sync.aligned.32x32b.x32.b32 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, [%32];\n"
                 "tcgen05.wait::ld.sync.aligned;\n"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]), "=r"(v[4]), "=r"(v[5]), "=r"(v[6]), "=r"(v[7]),
                   "=r"(v[8]), "=r"(v[9]), "=r"(v[10]), "=r"(v[11]), "=r"(v[12]), "=r"(v[13]), "=r"(v[14]),
                   "=r"(v[15]), "=r"(v[16]), "=r"(v[17]), "=r"(v[18]), "=r"(v[19]), "=r"(v[20]), "=r"(v[21]),
                   "=r"(v[22]), "=r"(v[23]), "=r"(v[24]), "=r"(v[25]), "=r"(v[26]), "=r"(v[27]), "=r"(v[28]),
                   "=r"(v[29]), "=r"(v[30]), "=r"(v[31])
                 : "r"(taddr)
                 : "memory");
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d)
                 : "memory");
}

struct MxMaps {
    CUtensorMap a, b;
};

// out[R, N] = A[R, K] B_e^T, block-scaled (see the header); N = OC, K = C
__global__ void __launch_bounds__(MX_THREADS, 1)
mxfp8_grouped_fwd_kernel(bf16 *out, const __grid_constant__ MxMaps maps, const uint8_t *sa, const uint8_t *sb,
                         const int *offsets, int E, int N, int K) {
#if defined(__CUDA_ARCH_FEAT_SM100_ALL)
    constexpr int S = MX_STAGES;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    uint32_t base = (raw + 1023) & ~1023u;
    unsigned char *gbase = smem_raw + (base - raw);
    int *s_off = (int *)(gbase + MX_OFF_SCHED), *s_tile = s_off + E + 1;
    int col_tiles = N / MX_BN, kblocks = K / MX_BK, sf_row = K / FP8_MX_BLOCK; // scale bytes per row

    grouped_load_offsets<MX_THREADS>(offsets, E, s_off);
    int total = grouped_tile_prefix<MX_BM>(s_off, E, col_tiles, s_tile);
    if ((int)blockIdx.x >= total) return; // the grid is an upper bound on the tiles
    int e = grouped_tile_expert((int)blockIdx.x, s_tile, E), local = (int)blockIdx.x - s_tile[e];
    int m0 = local / col_tiles * MX_BM, n0 = local % col_tiles * MX_BN;
    int r0 = s_off[e], rows = s_off[e + 1] - r0;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    uint32_t full0 = base + MX_OFF_BAR, empty0 = full0 + 8 * S, acc_bar = empty0 + 8 * S;
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            mbar_init(full0 + 8 * s, 32); // the producer's 32 lanes (lane 0's with the TMA bytes)
            mbar_init(empty0 + 8 * s, 1); // one tcgen05.commit
        }
        mbar_init(acc_bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncwarp(); // warp 0 converged again for the warp-wide allocation
    if (warp == 0) tmem_alloc(base + MX_OFF_TMEM, MX_TMEM_COLS);
    tc_fence_before();
    __syncthreads();
    tc_fence_after();
    uint32_t tmem = *(volatile uint32_t *)(gbase + MX_OFF_TMEM);

    if (warp == 0) { // producer
        int slot = 0;
        uint32_t phase = 0;
        for (int kb = 0; kb < kblocks; kb++) {
            mbar_wait(empty0 + 8 * slot, phase ^ 1);
            // scale words of tile rows lane + 32 j, j = 0..3, as 16-byte row `lane`;
            // A rows past the segment get 0 (their outputs are not stored)
            uint32_t wa[4], wb[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int i = 32 * j + lane;
                wa[j] = m0 + i < rows ? *(const uint32_t *)(sa + (size_t)(r0 + m0 + i) * sf_row + 4 * kb) : 0u;
                wb[j] = *(const uint32_t *)(sb + ((size_t)e * N + n0 + i) * sf_row + 4 * kb);
            }
            st_shared_v4(base + MX_OFF_SFA + slot * MX_SF_BYTES + 16 * lane, wa[0], wa[1], wa[2], wa[3]);
            st_shared_v4(base + MX_OFF_SFB + slot * MX_SF_BYTES + 16 * lane, wb[0], wb[1], wb[2], wb[3]);
            fence_proxy_async(); // visible to tcgen05.cp (the async proxy)
            __syncwarp();
            uint32_t fb = full0 + 8 * slot;
            if (lane == 0) {
                mbar_expect_tx(fb, MX_A_BYTES + MX_B_BYTES);
                tma_load_2d(base + MX_OFF_A + slot * MX_A_BYTES, &maps.a, kb * MX_BK, r0 + m0, fb);
                tma_load_2d(base + MX_OFF_B + slot * MX_B_BYTES, &maps.b, kb * MX_BK, e * N + n0, fb);
            } else {
                mbar_arrive(fb);
            }
            ring_next(slot, phase, S);
        }
    } else if (warp == 1 && lane == 0) { // MMA issuer
        int slot = 0;
        uint32_t phase = 0;
        for (int kb = 0; kb < kblocks; kb++) {
            mbar_wait(full0 + 8 * slot, phase);
            tc_fence_after();
            uint32_t sfa = tmem + MX_SF_COL + 8 * slot, sfb = sfa + 4;
            tc_copy_scales(sfa, umma_desc_sf(base + MX_OFF_SFA + slot * MX_SF_BYTES));
            tc_copy_scales(sfb, umma_desc_sf(base + MX_OFF_SFB + slot * MX_SF_BYTES));
            uint32_t a = base + MX_OFF_A + slot * MX_A_BYTES, b = base + MX_OFF_B + slot * MX_B_BYTES;
#pragma unroll
            for (int k = 0; k < MX_BK / MX_UMMA_K; k++)
                tc_mma_mx(tmem + MX_ACC_COL, umma_desc_sw128(a + k * MX_UMMA_K), umma_desc_sw128(b + k * MX_UMMA_K),
                          mx_idesc(k), sfa, sfb, kb > 0 || k > 0);
            tc_commit(empty0 + 8 * slot); // the stage (and its scale columns) is free once these complete
            ring_next(slot, phase, S);
        }
        tc_commit(acc_bar);
    }
    __syncwarp();

    // epilogue: thread (warp, lane) owns tile row 32 warp + lane = its TMEM lane
    mbar_wait(acc_bar, 0);
    tc_fence_after();
    int row = 32 * warp + lane;
    bool store = m0 + row < rows;
    bf16 *o = out + (size_t)(r0 + m0 + row) * N + n0;
#pragma unroll 1
    for (int c = 0; c < MX_BN; c += 32) {
        uint32_t v[32];
        tc_load_32(tmem + ((uint32_t)(32 * warp) << 16) + MX_ACC_COL + c, v);
        if (store) {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                uint32_t w[4];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    w[i] = pack_bf16(__uint_as_float(v[8 * q + 2 * i]), __uint_as_float(v[8 * q + 2 * i + 1]));
                *(uint4 *)(o + c + 8 * q) = make_uint4(w[0], w[1], w[2], w[3]);
            }
        }
    }
    tc_fence_before();
    __syncthreads();
    if (warp == 0) {
        tc_fence_after();
        tmem_dealloc(tmem, MX_TMEM_COLS);
    }
#endif
}

} // namespace
#endif // MOECORE_SM100A

extern "C" const char *cuda_mxfp8_error(int rc) {
    switch (rc) {
    case 0: return "ok";
    case CUDA_MXFP8_NOT_BUILT: return "not built for sm_100a (this nvcc has no compute_100)";
    case CUDA_MXFP8_DEVICE: return "the current device is not compute capability 10.0 (sm_100a code runs there only)";
    case CUDA_MXFP8_SIZES:
        return "sizes not taken (C % 128 == 0, OC % 128 == 0, E > 0, R >= 0; qa, qw, out 16-byte aligned, sa, sw "
               "4-byte aligned)";
    case CUDA_MXFP8_NO_TMA: return "the driver gives no cuTensorMapEncodeTiled, or refused a tensor map";
    }
    return "unknown error";
}

extern "C" int cuda_mxfp8_grouped_forward(void *out, const uint8_t *qa, const uint8_t *sa, const uint8_t *qw,
                                          const uint8_t *sw, const int *offsets, int R, int E, int C, int OC) {
#ifndef MOECORE_SM100A
    (void)out, (void)qa, (void)sa, (void)qw, (void)sw, (void)offsets, (void)R, (void)E, (void)C, (void)OC;
    return CUDA_MXFP8_NOT_BUILT;
#else
    int dev, major, minor;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major != 10 || minor != 0) return CUDA_MXFP8_DEVICE;
    if (R < 0 || E <= 0 || C <= 0 || OC <= 0 || C % MX_BK || OC % MX_BN) return CUDA_MXFP8_SIZES;
    if ((((uintptr_t)out | (uintptr_t)qa | (uintptr_t)qw) & 15) || (((uintptr_t)sa | (uintptr_t)sw) & 3))
        return CUDA_MXFP8_SIZES;
    int smem = MX_OFF_SCHED + 2 * (E + 1) * (int)sizeof(int) + 1024;
    if (smem > 227 * 1024) return CUDA_MXFP8_SIZES;
    if (R == 0) return 0;
    if (!cuda_tma_available()) return CUDA_MXFP8_NO_TMA;
    MxMaps maps;
    memset(&maps, 0, sizeof maps);
    // A's map runs to the end of qa's allocation (a tile's rows past R read
    // what is there, or TMA's zeros); its rows past a segment are not stored
    if (cuda_tensor_map_2d(&maps.a, qa, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, C, cuda_rows_to_end(qa, C), MX_BK, MX_BM) ||
        cuda_tensor_map_2d(&maps.b, qw, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, C, (uint64_t)E * OC, MX_BK, MX_BN))
        return CUDA_MXFP8_NO_TMA;
    static int smem_set;
    cuda_allow_smem((const void *)mxfp8_grouped_fwd_kernel, &smem_set, smem);
    // every expert adds at most one partial row tile
    long tiles = ((long)ceil_div(R, MX_BM) + E) * (OC / MX_BN);
    mxfp8_grouped_fwd_kernel<<<(unsigned)tiles, MX_THREADS, smem, cuda_stream()>>>((bf16 *)out, maps, sa, sw, offsets,
                                                                                    E, OC, C);
    cudaLaunchCheck();
    return 0;
#endif
}
