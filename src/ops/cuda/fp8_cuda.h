// The FP8 kernels of the CUDA backend (fp8.cu; issue 18): quantisers that
// match the CPU reference of src/ops/fp8.h bit for bit, and the block128
// FP8 grouped GEMM forward on Hopper (wgmma e4m3, sm_90a). All pointers are
// device memory, all work on cuda_stream(). Each returns 0 when it ran, or
// -1 having launched nothing when it does not take the sizes (stated per
// function) or the device.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// q[i] = e4m3 of the float whose bits are first + i, i < n (n % 4 == 0):
// the encoder itself, for exhaustive checks.
int cuda_fp8_encode_bits(uint8_t *q, uint32_t first, size_t n);
// The quantisers' division of BF16 values (div_bf16 in fp8.cu) against
// IEEE division on every (BF16 value, scale of a BF16 amax) pair: adds to
// counts[0] (device, zeroed by the caller) the pairs whose E4M3 codes
// differ, to counts[1] those whose FP32 quotients differ.
int cuda_fp8_div_bf16_check(unsigned long long *counts);
// block128 activations: x [R, C] (BF16, or FP32 for the _f32 form) ->
// q [R, C], scale [R, C/128]. C % 128 == 0.
int cuda_fp8_quantize_1x128(uint8_t *q, float *scale, const void *x, int R, int C);
int cuda_fp8_quantize_1x128_f32(uint8_t *q, float *scale, const float *x, int R, int C);
// block128 weights from the FP32 master weights: w [E, M, K] -> q [E, M, K],
// scale [E, M/128, K/128]. M % 128 == 0, K % 128 == 0.
int cuda_fp8_quantize_128x128(uint8_t *q, float *scale, const float *w, int E, int M, int K);
// The same, and (qt not NULL) the data-grads' transposed copy of the same
// bytes and scales (fp8_transpose_128x128 of fp8.h): qt [E, K, ldt] with
// q_e^T in columns col0..col0+M, st [E, K/128, ldt/128]. ldt, col0
// multiples of 128, col0 + M <= ldt.
int cuda_fp8_quantize_128x128_t(uint8_t *q, float *scale, uint8_t *qt, float *st, int ldt, int col0, const float *w,
                                int E, int M, int K);
// AdamW (cuda_adamw_update's arguments) on p [E, M, K] with its grads g and
// moments m, v, then its FP8 copies from the updated values as
// cuda_fp8_quantize_128x128_t makes them, in one pass (the bits of the two);
// -1 without running for sizes or buffers it does not take (the same rules,
// and p, g, m, v 16-byte aligned). ops_cuda's adamw_update_fp8 falls back
// to the two kernels then.
int cuda_fp8_adamw_quantize_128x128_t(float *p, const float *g, float *m, float *v, float lr, float beta1, float beta2,
                                      float eps, float wd, float grad_scale, int t, uint8_t *q, float *scale,
                                      uint8_t *qt, float *st, int ldt, int col0, int E, int M, int K);
// The same with row r of q read from row rows[r] of x (BF16): the permute's
// gather and the quantiser in one pass.
int cuda_fp8_gather_quantize(uint8_t *q, float *scale, const void *x, const int *rows, int R, int C);
// out [R, C] (BF16) = the dequantised values of cuda_fp8_gather_quantize's
// codes and scales, without them: the bits of it and cuda_fp8_dequantize_1x128.
int cuda_fp8_gather_fake_quantize(void *out, const void *x, const int *rows, int R, int C);
// silu(gate) * up [R, F] (BF16, as cuda_swiglu_forward rounds it), quantised
// 1 x 128: the bits of cuda_swiglu_forward + cuda_fp8_quantize_1x128. F % 128 == 0.
int cuda_fp8_swiglu_quantize_1x128(uint8_t *q, float *scale, const void *gate, const void *up, int R, int F);
// cuda_swiglu_backward's dgate, dup [R, F] (the same bits), and the pair
// quantised 1 x 128 side by side: q [R, 2F], scale [R, 2F/128] of row
// [dgate_r | dup_r] (fp8_quantize_1x128_pair of the BF16 values). F % 128
// == 0; the BF16 buffers 16-byte aligned.
int cuda_fp8_swiglu_backward_quantize_1x128(void *dgate, void *dup, uint8_t *q, float *scale, const void *dout,
                                            const void *gate, const void *up, int R, int F);
// x [R, C] (BF16) = float(q) * scale, rounded to nearest. C % 128 == 0.
int cuda_fp8_dequantize_1x128(void *x, const uint8_t *q, const float *scale, int R, int C);
// w [E, M, K] (BF16) = float(q) * its 128 x 128 block's scale, rounded to
// nearest. M % 128 == 0, K % 128 == 0.
int cuda_fp8_dequantize_128x128(void *w, const uint8_t *q, const float *scale, int E, int M, int K);
// MXFP8: x [R, C] (BF16) -> q [R, C], E8M0 scale bytes [R, C/32]. C % 32 == 0.
int cuda_fp8_quantize_mx(uint8_t *q, uint8_t *scale, const void *x, int R, int C);
// fp8.wgrad: fp8's operands: x [R, C] (BF16) quantised and dequantised in
// place per 128 x 1 tile along the rows of each segment offsets[e]..
// offsets[e+1] (device offsets), each value float(q) * scale rounded to
// BF16: fp8_fake_quantize_128x1 of fp8.h on the BF16 values, rounded.
// C % 8 == 0, x 16-byte aligned.
int cuda_fp8_fake_quantize_128x1(void *x, const int *offsets, int E, int C);
// fp8.wgrad: fp8's speed path (the layout: fp8_tokens_ldk of fp8.h).
// x [R, C] (BF16) -> qt [C, ldk] E4M3, st [ldk / 128, C]: each expert's
// tokens transposed into its 128-token blocks (the last block's tail zero),
// the codes and scales of fp8_fake_quantize_128x1's tiles. C % 128 == 0,
// ldk >= fp8_tokens_ldk(offsets[E], E), a multiple of 128.
int cuda_fp8_quantize_tokens_t(uint8_t *qt, float *st, const void *x, const int *offsets, int E, int C, int ldk);
// The same of the BF16 values cuda_fp8_dequantize_1x128 makes of q [R, C],
// s [R, C / 128] (1 x 128 codes and scales), without writing them: the
// bits of the two calls.
int cuda_fp8_requantize_tokens_t(uint8_t *qt, float *st, const uint8_t *q, const float *s, const int *offsets, int E,
                                 int C, int ldk);
// dw [E, OC, C] (accumulate: +=, else =) = sum over each expert's token
// blocks kb of deq(qa)_kb^T deq(qb)_kb, qa/sa [OC, ldk] from dout [R, OC]
// and qb/sb [C, ldk] from inp [R, C] (cuda_fp8_quantize_tokens_t): the
// weight-grad of the two operands fake-quantised, with FP32 accumulation;
// an empty expert's dw is zeros (or left as it is). OC % 128 == 0,
// C % 256 == 0, dw 8-byte aligned (16 for the TMA epilogue, the default).
int cuda_fp8_grouped_wgrad(float *dw, const uint8_t *qa, const float *sa, const uint8_t *qb, const float *sb,
                           const int *offsets, int E, int C, int OC, int ldk, int accumulate);
// The FP8 dispatch payload (fp8_payload.cu; fp8_pack_rows / fp8_unpack_rows
// of fp8.h, the same bytes): payload [R, fp8_payload_bytes(C)] from q [R,
// C] and scale [R, C/128]; and back, q and scale row r from payload row
// src_row[r] (src_row NULL: r). C % 128 == 0, buffers 4-byte aligned.
int cuda_fp8_payload_pack(void *payload, const uint8_t *q, const float *scale, int R, int C);
int cuda_fp8_payload_unpack(uint8_t *q, float *scale, const void *payload, const int *src_row, int R, int C);
// The FP8 grouped GEMM forward: out[R, OC] (BF16) = dequant(qa) dequant(qw_e)^T
// over the expert segments offsets[e]..offsets[e+1] (device offsets; the
// host never reads them), qa/sa from cuda_fp8_quantize_1x128 ([R, C]), qw/sw
// from cuda_fp8_quantize_128x128 ([E, OC, C]). FP32 accumulation, the
// block scales applied every 128 of K. C % 128 == 0, OC % 256 == 0. The
// data-grads: dX [R, C] = deq(dY) deq(W_e) is this with qa = dY [R, OC]
// and qw = W^T [E, C, OC] (cuda_fp8_quantize_128x128_t's copy).
int cuda_fp8_grouped_forward(void *out, const uint8_t *qa, const float *sa, const uint8_t *qw, const float *sw,
                             const int *offsets, int E, int C, int OC);
// Its kernel variants (MOECORE_FP8_GEMM_VARIANT=0..FP8_GEMM_VARIANTS-1,
// benchmarks and tests only; fp8.cu says what each does): the same bits.
#define FP8_GEMM_VARIANTS 4

// The MXFP8 grouped GEMM forward on Blackwell (fp8_sm100.cu; COMPILE-ONLY:
// built for sm_100a where nvcc has it, never run: no Blackwell GPU was
// available; tests/gpu/test_fp8 mx is its check). out[R, OC] (BF16) =
// dequant_mx(qa) dequant_mx(qw_e)^T over the segments offsets[e]..
// offsets[e+1] (device offsets, offsets[E] == R): qa [R, C] with E8M0 scale
// bytes sa [R, C/32], qw [E, OC, C] with sw [E, OC, C/32] (fp8_quantize_mx's
// layouts; reference fp8_grouped_matmul_mx_ref), FP32 accumulation in
// tensor memory; only rows of segments are written. On cuda_stream().
// Returns 0, or one of the codes below having launched nothing;
// cuda_mxfp8_error(rc) says why in words. C % 128 == 0, OC % 128 == 0, qa,
// qw, out 16-byte aligned, sa, sw 4-byte aligned.
#define CUDA_MXFP8_NOT_BUILT (-1) // this build's nvcc had no sm_100a
#define CUDA_MXFP8_DEVICE (-2)    // the current device is not compute capability 10.0
#define CUDA_MXFP8_SIZES (-3)     // sizes or alignment not taken
#define CUDA_MXFP8_NO_TMA (-4)    // no tensor maps from the driver
int cuda_mxfp8_grouped_forward(void *out, const uint8_t *qa, const uint8_t *sa, const uint8_t *qw, const uint8_t *sw,
                               const int *offsets, int R, int E, int C, int OC);
const char *cuda_mxfp8_error(int rc);

#ifdef __cplusplus
}
#endif
