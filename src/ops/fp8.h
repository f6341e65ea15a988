// FP8 formats and their CPU reference (issue 18): E4M3 values, the block128
// recipe (Hopper; DeepSeek-V3's fine-grained scaling) and MXFP8 (OCP MX v1.0,
// Blackwell). Every CUDA quantiser must match these functions bit for bit
// (tests/gpu/test_fp8.c); tests/test_fp8.c checks them exhaustively and
// tests/test_fp8_torch.sh against PyTorch's float8_e4m3fn where it exists.
//
// E4M3 (OCP "E4M3", PyTorch float8_e4m3fn): sign, 4 exponent bits (bias 7),
// 3 mantissa bits; no infinities; S.1111.111 is NaN; largest finite 448,
// smallest normal 2^-6, subnormals m * 2^-9 (m = 1..7).
// Encoding (fp8_e4m3_from_float): round to nearest, ties to even, on the
// exact FP32 value; |x| >= 448 and +-inf saturate to +-448 (0x7e / 0xfe);
// zeros keep their sign; FP32 subnormals round like any small value (to 0
// or 2^-9); any NaN becomes 0x7f.
//
// block128 (scales FP32, one per tile):
//   activations [R, C]: one scale per 1 x 128 tile along C, [R, ceil(C/128)];
//   weights [M, K] (per expert): one scale per 128 x 128 block,
//   [ceil(M/128), ceil(K/128)].
//   amax = max |x| over the tile's elements, NaN ignored, +-inf counted as
//   FLT_MAX, then raised to at least FP8_AMAX_FLOOR (so an all-zero or
//   all-tiny tile has a normal scale and quantises to zeros);
//   scale = amax / 448 (one FP32 division); q = e4m3(x / scale) (FP32
//   division, then the encoding above); dequantised x' = float(q) * scale.
//   Edge tiles (C, M or K not a multiple of 128) cover the elements present.
// MXFP8 (OCP MX v1.0, E4M3 elements, E8M0 scale per 32 along the row):
//   [R, C] -> q [R, C], scale bytes [R, ceil(C/32)].
//   e = floor(log2(amax)) - 8 (8 = E4M3's largest exponent), clamped to
//   [-127, 127] (amax 0 or FP32-subnormal gives -127); scale byte e + 127;
//   q = e4m3(x * 2^-e) (exact unless it underflows FP32). A block holding a
//   NaN gets the NaN scale byte 0xff (its elements are still encoded, with
//   the e of its other elements, and dequantise to NaN). amax in [1.75, 2) * 2^k saturates the largest
//   elements to 448 * 2^e, as the OCP rule does.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define FP8_E4M3_MAX 448.0f
#define FP8_BLOCK 128          // block128 tile edge
#define FP8_MX_BLOCK 32        // MXFP8 elements per scale
#define FP8_AMAX_FLOOR 0x1p-100f
#define FP8_E4M3_NAN 0x7f
#define FP8_E8M0_NAN 0xff

uint8_t fp8_e4m3_from_float(float x);
float fp8_e4m3_to_float(uint8_t b);
// The block128 scale of a tile whose max |x| (NaN ignored) is amax.
float fp8_block_scale(float amax);
// E8M0 byte -> 2^(b - 127) (NaN for 0xff); the MX scale byte for amax.
float fp8_e8m0_to_float(uint8_t b);
uint8_t fp8_mx_scale_byte(float amax, int has_nan);

// block128, activations: x [R, C] -> q [R, C], scale [R, ceil(C/128)].
void fp8_quantize_1x128(uint8_t *q, float *scale, const float *x, int R, int C);
// block128, weights: w [E, M, K] -> q [E, M, K], scale [E, ceil(M/128), ceil(K/128)].
void fp8_quantize_128x128(uint8_t *q, float *scale, const float *w, int E, int M, int K);
void fp8_dequantize_1x128(float *x, const uint8_t *q, const float *scale, int R, int C);
void fp8_dequantize_128x128(float *w, const uint8_t *q, const float *scale, int E, int M, int K);
// The data-grads' weight copy: q [E, M, K], scale [E, M/128, K/128] from
// fp8_quantize_128x128, laid out transposed: qt [E, K, ldt] gets q_e^T in
// columns col0..col0 + M (qt[e][j][col0 + i] = q[e][i][j]), st [E, K/128,
// ldt/128] the same scales at block column col0/128 (st[e][bj][col0/128 +
// bi] = scale[e][bi][bj]): the same bytes and scales, only moved. Two
// weights [M, K] side by side (ldt = 2M, col0 0 and M) make the gate/up
// pair's [Wg^T | Wu^T]. M, K, ldt, col0 multiples of 128.
void fp8_transpose_128x128(uint8_t *qt, float *st, int ldt, int col0, const uint8_t *q, const float *scale, int E,
                           int M, int K);
// block128 activations of two matrices side by side: row r of [a | b]
// (a, b [R, F]) -> q [R, 2F], scale [R, 2F/128] (fp8_quantize_1x128 of the
// concatenation; F % 128 == 0, so no tile straddles a and b).
void fp8_quantize_1x128_pair(uint8_t *q, float *scale, const float *a, const float *b, int R, int F);
// block128 along the rows, for the weight-grads (fp8.wgrad: fp8, whose K
// is the tokens): x [R, C] quantised and dequantised in place with one
// scale per 128 x 1 tile: within each segment offsets[e]..offsets[e+1]
// (host offsets), column by column, in runs of 128 rows from the
// segment's first (the last run of a segment may be shorter; no tile
// crosses a segment). The same amax, scale and encoding rules as 1 x 128.
// The FP8 weight-grad reference is then the FP32 grouped weight-grad of
// the two operands so treated.
void fp8_fake_quantize_128x1(float *x, const int *offsets, int E, int C);
// The weight-grads' FP8 operands on GPUs (K-major: the tokens contiguous):
// [C, ldk] with each expert's tokens in whole 128-blocks from column
// 128 x (the blocks of the experts before it); ldk is enough for any
// routing of R rows over E experts.
static inline int fp8_tokens_ldk(int R, int E) { return ((R + 127) / 128 + E) * 128; }
// The FP8 dispatch payload (train.precision: fp8 with parallel.ep > 1): a
// 1 x 128 tile lies inside one row, so a routed row quantised at its
// source rank has the codes and scales it would get after the dispatch.
// It travels as one row of fp8_payload_bytes(C) bytes: its C E4M3 codes,
// then its C/128 FP32 scales (C % 128 == 0, so the scales start 4-byte
// aligned in every row). fp8_pack_rows: payload row r from q [R, C],
// scale [R, C/128] (fp8_quantize_1x128's layout); fp8_unpack_rows: q row r
// and its scales from payload row src_row[r] (NULL: row r), the regroup
// of the received rows in the same pass. Bytes are moved, never converted.
static inline size_t fp8_payload_bytes(int C) { return (size_t)C + sizeof(float) * (size_t)(C / FP8_BLOCK); }
void fp8_pack_rows(uint8_t *payload, const uint8_t *q, const float *scale, int R, int C);
void fp8_unpack_rows(uint8_t *q, float *scale, const uint8_t *payload, const int *src_row, int R, int C);
// MXFP8: x [R, C] -> q [R, C], scale bytes [R, ceil(C/32)]; and back.
void fp8_quantize_mx(uint8_t *q, uint8_t *scale, const float *x, int R, int C);
void fp8_dequantize_mx(float *x, const uint8_t *q, const uint8_t *scale, int R, int C);

// The FP8 grouped GEMM reference: out[R, OC] (FP32) = dequant(qa) dequant(qw_e)^T
// over the expert segments offsets[e]..offsets[e+1] (host offsets), qa
// 1x128-quantised [R, C], qw 128x128-quantised [E, OC, C]. FP32 products.
// The data-grads are the same product with the transposed weights
// (fp8_transpose_128x128): dX [R, C] = dequant(dY) dequant(W_e), W [E, OC, C],
// is this function with qa = dY [R, OC] and qw = W^T [E, C, OC].
void fp8_grouped_matmul_ref(float *out, const uint8_t *qa, const float *sa, const uint8_t *qw, const float *sw,
                            const int *offsets, int E, int C, int OC);
// The MXFP8 grouped GEMM reference (the Blackwell kernel's, fp8_sm100.cu):
// out[R, OC] (FP32) = dequant_mx(qa) dequant_mx(qw_e)^T over the expert
// segments offsets[e]..offsets[e+1] (host offsets), qa [R, C] with scale
// bytes sa [R, ceil(C/32)], qw [E, OC, C] with sw [E, OC, ceil(C/32)]
// (fp8_quantize_mx's layouts; a weight is OC rows of C). The dequantised
// values (E4M3 times a power of two) and their products are exact in FP32
// unless they leave its range; the sums are FP32's (ops_cpu's product).
void fp8_grouped_matmul_mx_ref(float *out, const uint8_t *qa, const uint8_t *sa, const uint8_t *qw, const uint8_t *sw,
                               const int *offsets, int E, int C, int OC);

// The dense FP8 GEMMs' activations (fp8.gemms: experts_dense): the codes
// and scales of fp8_quantize_1x128 with the scales transposed, st [C/128,
// R] (tile t of row r at st[t R + r]); C % 128 == 0. And back.
void fp8_quantize_1x128_t(uint8_t *q, float *st, const float *x, int R, int C);
void fp8_dequantize_1x128_t(float *x, const uint8_t *q, const float *st, int R, int C);
// The dense FP8 GEMM reference: out[N, OC] (FP32) = dequant(qa) dequant(qw)^T,
// qa [N, C] with st [C/128, N] (fp8_quantize_1x128_t), qw [OC, C] with its
// 128x128 scales [OC/128, C/128]. FP32 products (the CPU backend's matmul).
void fp8_matmul_ref(float *out, const uint8_t *qa, const float *st, const uint8_t *qw, const float *sw, int N, int C,
                    int OC);
