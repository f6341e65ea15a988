// Hopper primitives shared by the wgmma kernels (grouped_wgmma.cu, the FP8
// kernels in fp8.cu): cp.async, proxy fences, wgmma fences and waits, the
// K-major 128-byte-swizzle descriptor, mbarriers and 2D TMA loads; and the
// host side of the tensor maps (grouped_wgmma.cu).
#pragma once
#include <cuda.h>
#include "ops/cuda/cuda_common.cuh"
#include <stddef.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ void cp_async16(uint32_t s, const void *gmem, bool valid) {
    int n = valid ? 16 : 0; // 0: fills 16 zero bytes, reads nothing
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Matrix descriptor of a K-major, 128-byte-swizzled operand at shared
// address `addr`: start address >> 4 in bits 0-13, leading byte offset
// (unused for this layout; 1 by convention) in 16-29, stride byte offset
// (1024 bytes between 8-row groups) >> 4 in 32-45, base offset 0 (atoms
// are 1024-byte aligned) in 49-51, swizzle mode 1 = 128B in 62-63.
__host__ __device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

// Byte offset in a swizzled tile of 16-byte chunk `chunk` (0..7) of row `row`.
__host__ __device__ __forceinline__ uint32_t swz(int row, int chunk) {
    return (uint32_t)(row * 128 + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile("{\n.reg .pred p;\nWAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT_%=;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
// box at element coordinates (c0 inner, c1 outer) of the map into dst
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                 "[%4];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

// A warpgroup's m64nBN accumulator block: acc[4 j + h] is row r + 8 (h / 2),
// column c0 + 8 j + h % 2, where r = its first row + 16 warp + lane / 4 and
// c0 = its first column + 2 (lane % 4). store_acc_bf16 stores
// out = bf16(acc) for rows < rows and columns < N.
template <int BN>
__device__ __forceinline__ void store_acc_bf16(const float (&acc)[BN / 2], bf16 *o, int N, int r, int c0, int rows) {
    bool lo_ok = r < rows, hi_ok = r + 8 < rows;
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        int c = c0 + 8 * j;
        if (c < N) {
            if (lo_ok) *(__nv_bfloat162 *)(o + (size_t)r * N + c) = __floats2bfloat162_rn(acc[4 * j], acc[4 * j + 1]);
            if (hi_ok)
                *(__nv_bfloat162 *)(o + (size_t)(r + 8) * N + c) = __floats2bfloat162_rn(acc[4 * j + 2], acc[4 * j + 3]);
        }
    }
}
} // namespace

// 1 when the driver gives cuTensorMapEncodeTiled and cuMemGetAddressRange.
int cuda_tma_available(void);
// Rows of row_bytes from p to the end of p's allocation (0 when unknown).
uint64_t cuda_rows_to_end(const void *p, size_t row_bytes);
// A 2D tensor map over [outer, inner] (inner contiguous) of elem_bytes
// elements of `type`, box box_inner x box_outer, 128-byte swizzle: 0, or
// -1 when the driver refuses. After cuda_tma_available().
int cuda_tensor_map_2d(CUtensorMap *m, const void *p, CUtensorMapDataType type, int elem_bytes, uint64_t inner,
                       uint64_t outer, uint32_t box_inner, uint32_t box_outer);
// Whether the current device runs sm_90a code (compute capability 9.0).
int cuda_wgmma_device_ok(void);
