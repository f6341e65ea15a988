// AdamW's arithmetic for one element, shared by optim.cu's update and
// fp8.cu's update fused with the FP8 weight quantiser, so that both give
// cpu_adamw_update's bits: torch.optim.AdamW's operations in
// cpu_adamw_update's order, without contraction into FMAs (__f*_rn).
#pragma once
#include <math.h>

struct AdamArgs {
    float beta1, beta2, eps, grad_scale;
    float step, bc2_sqrt, decay; // lr / (1 - beta1^t), sqrt(1 - beta2^t), 1 - lr wd
};

static inline AdamArgs adamw_args(float lr, float beta1, float beta2, float eps, float wd, float grad_scale, int t) {
    double bc1 = 1 - pow(beta1, t), bc2 = 1 - pow(beta2, t);
    AdamArgs a = {beta1, beta2, eps, grad_scale, (float)(lr / bc1), (float)sqrt(bc2), 1 - lr * wd};
    return a;
}

// p, m, v updated in place from the grad g
__device__ __forceinline__ void adamw_apply(float &p, float &m, float &v, float g, const AdamArgs &a) {
    float b1c = __fsub_rn(1.f, a.beta1), b2c = __fsub_rn(1.f, a.beta2);
    float gi = __fmul_rn(g, a.grad_scale);
    m = __fadd_rn(__fmul_rn(a.beta1, m), __fmul_rn(b1c, gi));
    v = __fadd_rn(__fmul_rn(a.beta2, v), __fmul_rn(__fmul_rn(b2c, gi), gi));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), a.bc2_sqrt), a.eps);
    p = __fsub_rn(__fmul_rn(p, a.decay), __fdiv_rn(__fmul_rn(a.step, m), denom));
}
