// Hopper primitives shared by the wgmma kernels (grouped_wgmma.cu, the FP8
// kernels in fp8.cu, attention_wgmma.cu): cp.async, proxy fences, wgmma
// fences and waits, the m64n64 / m64n128 / m64n256 BF16 wgmma (A from shared
// memory, or registers at n128), the m64n128k32 E4M3 one, the K-major and MN-major 128-byte-swizzle descriptors,
// mbarriers, 2D TMA and 1D bulk loads, L2 bulk prefetches, the quad
// transpose behind 16-byte BF16 accumulator stores, stmatrix, TMA stores
// and reductions with their bulk groups, named barriers; and the host side of the tensor maps
// (grouped_wgmma.cu).
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

// The stage ring of the warp-specialised kernels (a producer filling S
// stages, full[s] / empty[s] barriers 8 bytes apart): the slot and parity
// after each stage, and a consumer's step once its wgmma on the stage are
// committed: when the previous stage's are done (one group left in
// flight), that stage goes back to the producer.
__device__ __forceinline__ void ring_next(int &slot, uint32_t &phase, int S) {
    if (++slot == S) {
        slot = 0;
        phase ^= 1;
    }
}
__device__ __forceinline__ void ring_consumed(uint32_t empty0, int kt, int &prev, int &slot, uint32_t &phase, int S) {
    wgmma_wait<1>();
    if (kt > 0) mbar_arrive(empty0 + 8 * prev);
    prev = slot;
    ring_next(slot, phase, S);
}
// box at element coordinates (c0 inner, c1 outer) of the map into dst
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                 "[%4];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

// d[64] (+)= A(desc a) B(desc b)^T, m64n128k16; TA / TB: 0 = that operand is
// K-major in shared memory, 1 = M/N-major (imm-trans-a / imm-trans-b)
template <int TA = 0, int TB = 0>
__device__ __forceinline__ void wgmma_n128(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
    asm volatile("{\n.reg .pred p;\n"
                 "setp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                 "%64, %65, p, 1, 1, %67, %68;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(a), "l"(b), "r"(accumulate), "n"(TA), "n"(TB));
}
// d[128] (+)= A(desc a) B(desc b)^T, m64n256k16; TA / TB as for wgmma_n128
template <int TA = 0, int TB = 0>
__device__ __forceinline__ void wgmma_n256(float (&d)[128], uint64_t a, uint64_t b, int accumulate) {
    asm volatile("{\n.reg .pred p;\n"
                 "setp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
                 "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
                 "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
                 "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
                 "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "
                 "%128, %129, p, 1, 1, %131, %132;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                   "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
                   "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
                   "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
                   "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
                   "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
                   "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(a), "l"(b), "r"(accumulate), "n"(TA), "n"(TB));
}

// d[32] (+)= A(desc a) B(desc b)^T, m64n64k16; TA / TB as for wgmma_n128
template <int TA = 0, int TB = 0>
__device__ __forceinline__ void wgmma_n64(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
    asm volatile("{\n.reg .pred p;\n"
                 "setp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "%32, %33, p, 1, 1, %35, %36;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(a), "l"(b), "r"(accumulate), "n"(TA), "n"(TB));
}

// d[64] = (accumulate ? d : 0) + A B^T, m64n128k32, e4m3 x e4m3 -> f32, both K-major
__device__ __forceinline__ void wgmma_fp8_n128(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
    asm volatile("{\n.reg .pred p;\n"
                 "setp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                 "%64, %65, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(a), "l"(b), "r"(accumulate));
}
// d[64] (+)= A B(desc b)^T, m64n128k16 with A from registers: a[4] is the
// warp's 16 x 16 slice of A as mma.sync m16n8k16 holds it (a0 row g, k
// 2c..2c+1; a1 row g+8; a2 row g, k 2c+8..; a3 row g+8, k 2c+8.., g = lane
// / 4, c = lane % 4), warp w of the warpgroup holding rows 16w..16w+15. TB
// as for wgmma_n128.
template <int TB = 0>
__device__ __forceinline__ void wgmma_n128_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int accumulate) {
    asm volatile("{\n.reg .pred p;\n"
                 "setp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                 "{%64,%65,%66,%67}, %68, p, 1, 1, %70;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate), "n"(TB));
}

// Matrix descriptor of an MN-major, 128-byte-swizzled operand at `addr`
// (1024-byte aligned; grouped_wgmma.cu's "M/N-major tiles" describes the
// layout): start >> 4 in bits 0-13, leading byte offset (between 64-wide
// MN blocks) >> 4 in 16-29, stride byte offset (between 8-k groups: 1024)
// >> 4 in 32-45, base offset 0, 128B swizzle (1) in 62-63.
__host__ __device__ __forceinline__ uint64_t smem_desc_mn_lbo(uint32_t addr, uint32_t lbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

// bytes (a multiple of 16) contiguous from gmem into dst by the copy engine,
// completing on bar (1D bulk copy: no tensor map)
__device__ __forceinline__ void bulk_load(uint32_t dst, const void *gmem, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(gmem), "r"(bytes), "r"(bar)
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

// One stage of a 4 x 4 transpose of 32-bit words among the 4 lanes of a
// quad (lane p = lane % 4): lanes p and p ^ D exchange, for each word pair
// (i, i + D) with i & D == 0, the word the other lane keeps. After stages
// D = 2 and D = 1, lane p's word k is lane k's word p before them.
template <int D> __device__ __forceinline__ void quad_transpose_stage(uint32_t (&w)[4], int p) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (i & D) continue;
        bool up = p & D;
        uint32_t got = __shfl_xor_sync(0xffffffffu, up ? w[i] : w[i + D], D);
        if (up) w[i] = got;
        else w[i + D] = got;
    }
}
__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&h;
}
// store_acc_bf16's result (the same values) with 16-byte stores: for each
// row and group m of 4 column octets, the quad transposes its packed pairs
// so that lane p holds columns 8 (4 m + p) .. + 7 of the row. All lanes of
// the warp take part in the shuffles; rows >= rows and columns >= N (N a
// multiple of 8) are not stored; o + row * N + column must be 16-byte
// aligned for columns that are multiples of 8.
template <int BN>
__device__ __forceinline__ void store_acc_bf16_v16(const float (&acc)[BN / 2], bf16 *o, int N, int r, int c0,
                                                   int rows) {
    int p = threadIdx.x & 3, n0 = c0 - 2 * p;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int row = r + 8 * h;
#pragma unroll
        for (int m = 0; m < BN / 32; m++) {
            uint32_t w[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                w[i] = bf16x2_bits(acc[4 * (4 * m + i) + 2 * h], acc[4 * (4 * m + i) + 2 * h + 1]);
            quad_transpose_stage<2>(w, p);
            quad_transpose_stage<1>(w, p);
            int c = n0 + 8 * (4 * m + p);
            if (row < rows && c < N) *(uint4 *)(o + (size_t)row * N + c) = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
}

// The global nanosecond timer (%globaltimer; coarse ticks).
__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    return t;
}
// Asks the copy engine to bring `bytes` (a multiple of 16, 16-byte aligned)
// from gmem into L2; no completion to wait for.
__device__ __forceinline__ void bulk_prefetch_l2(const void *gmem, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(gmem), "r"(bytes) : "memory");
}

// Four 8 x 8 BF16 matrices from registers into shared memory (stmatrix
// .x4): register i of every lane holds matrix i's row lane / 4, columns
// 2 (lane % 4) .. + 1 (the mma / wgmma accumulator layout), and lanes 8 i ..
// 8 i + 7 give the shared addresses of matrix i's 8 rows (16 bytes each).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}
// The box at element coordinates (c0 inner, c1 outer) of the map from
// shared memory src by the copy engine: stored (tma_store_2d) or added into
// global memory (tma_reduce_add_2d, the map's element type, e.g. FP32), as
// one bulk group of the issuing thread (bulk_commit closes it; elements
// outside the map are not written).
__device__ __forceinline__ void tma_store_2d(const CUtensorMap *map, uint32_t src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"((uint64_t)map),
                 "r"(c0), "r"(c1), "r"(src)
                 : "memory");
}
__device__ __forceinline__ void tma_reduce_add_2d(const CUtensorMap *map, uint32_t src, int c0, int c1) {
    asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                     (uint64_t)map),
                 "r"(c0), "r"(c1), "r"(src)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until at most N of this thread's bulk groups still read their shared
// source (bulk_wait_read) or are not complete (bulk_wait).
template <int N> __device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of x across this point
// (the registers of a wgmma accumulator that may still be in flight).
template <int N> __device__ __forceinline__ void fence_regs(float (&x)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(x[i])::"memory");
}
// Barrier `id` (1-15) of `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
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
