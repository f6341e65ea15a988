// Rotary position embedding, forward and backward: each head of each (b, t)
// of a [B, T, nh, hd] BF16 tensor has its pairs (i, i + hd/2) rotated by the
// FP32 tables cos_t, sin_t [T, hd/2]; the backward is the same rotation with
// sin negated.
//
// One thread per 8 pairs of one (b, t, head); it reads all 16 values before
// writing them, so out may alias inp. Elementwise FP32, no reductions. The
// 16-byte path of load8 / store8 runs when hd/2 is a multiple of 8 and all
// four pointers are 16-byte aligned, the scalar path otherwise. The rotation
// is memkernels.cuh's rope_rotate8, which rmsnorm.cu's fused QK-norm + RoPE
// shares.
#include "ops/cuda/memkernels.cuh"

static __global__ void rope_kernel(bf16 *out, const bf16 *inp, const float *cos_t, const float *sin_t, int T, int nh,
                                   int hd, size_t rows, float sign, bool vec) {
    int half = hd / 2, chunks = (half + 7) / 8;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * chunks) return;
    size_t row = idx / chunks;  // (b, t, h)
    int i = (int)(idx % chunks) * 8;
    int t = (int)((row / nh) % T);
    const bf16 *x = inp + row * hd;
    bf16 *o = out + row * hd;
    float a[8], b[8], c[8], s[8], oa[8], ob[8];
    load8(x, i, half, vec, a);
    load8(x + half, i, half, vec, b);
    load8(cos_t + (size_t)t * half, i, half, vec, c);
    load8(sin_t + (size_t)t * half, i, half, vec, s);
    rope_rotate8(a, b, c, s, sign, oa, ob);
    store8(o, i, half, vec, oa);
    store8(o + half, i, half, vec, ob);
}

static void rope(void *out, const void *inp, const float *cos_t, const float *sin_t, int B, int T, int nh, int hd,
                 float sign) {
    int half = hd / 2;
    size_t rows = (size_t)B * T * nh;
    if (!rows || half <= 0) return;
    bool vec = half % 8 == 0 && aligned16(out) && aligned16(inp) && aligned16(cos_t) && aligned16(sin_t);
    size_t threads = rows * ((half + 7) / 8);
    rope_kernel<<<ceil_div((long)threads, 256), 256, 0, cuda_stream()>>>((bf16 *)out, (const bf16 *)inp, cos_t, sin_t,
                                                                        T, nh, hd, rows, sign, vec);
    cudaLaunchCheck();
}

extern "C" void cuda_rope_forward(void *out, const void *inp, const float *cos_t, const float *sin_t, int B, int T,
                                  int nh, int hd) {
    rope(out, inp, cos_t, sin_t, B, T, nh, hd, 1.f);
}
extern "C" void cuda_rope_backward(void *dinp, const void *dout, const float *cos_t, const float *sin_t, int B, int T,
                                   int nh, int hd) {
    rope(dinp, dout, cos_t, sin_t, B, T, nh, hd, -1.f);
}
