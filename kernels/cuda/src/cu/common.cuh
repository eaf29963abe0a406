// Shared device helpers of the edgerun CUDA kernels. Every arithmetic step that the CPU kernels
// define (kernels/generic) is written with explicit round-to-nearest intrinsics (__fadd_rn,
// __fmul_rn, ...), which the compiler never contracts into fused multiply-adds, so where a CUDA
// kernel follows the generic order it computes the same bits.
#pragma once

typedef unsigned short half_bits;

// IEEE binary16 bits -> float (exact), without cuda_fp16.h.
__device__ __forceinline__ float f16_to_f32(half_bits h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// float -> IEEE binary16 bits, rounded to nearest even, returned in the low 16 bits of a 32-bit
// value. The 16-bit result is widened inside the asm: on an H200 (driver 580) the bytes of a
// 16-bit `"=h"` asm output stored one by one lost the low byte (0x2403 was written as 0x2400).
__device__ __forceinline__ unsigned int f32_to_f16_bits(float f) {
    unsigned int u;
    asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; cvt.u32.u16 %0, t; }" : "=r"(u) : "f"(f));
    return u;
}

// bfloat16 bits -> float (exact).
__device__ __forceinline__ float bf16_to_f32(half_bits h) {
    return __uint_as_float(((unsigned int)h) << 16);
}

// exp in the kernels' one arithmetic (kernels/generic/src/expf.rs: Cody-Waite reduction by fused
// multiply-adds, degree-7 Taylor polynomial by Horner with fused multiply-adds, two exact
// power-of-two factors).
__device__ __forceinline__ float edge_exp(float x) {
    if (isnan(x)) return x;
    if (x < -104.0f) return 0.0f;
    if (x > 89.0f) return __int_as_float(0x7f800000);
    const float LOG2E = 1.44269502f;          // f32 of log2(e)
    const float LN2_HI = 0.693145751953125f;  // 16 significant bits
    const float LN2_LO = 1.42860677e-6f;
    float n = rintf(__fmul_rn(x, LOG2E));     // round half to even
    float r = __fmaf_rn(-n, LN2_LO, __fmaf_rn(-n, LN2_HI, x));
    float p = 1.0f / 5040.0f;
    p = __fmaf_rn(p, r, 1.0f / 720.0f);
    p = __fmaf_rn(p, r, 1.0f / 120.0f);
    p = __fmaf_rn(p, r, 1.0f / 24.0f);
    p = __fmaf_rn(p, r, 1.0f / 6.0f);
    p = __fmaf_rn(p, r, 0.5f);
    p = __fmaf_rn(p, r, 1.0f);
    p = __fmaf_rn(p, r, 1.0f);
    int ni = (int)n;
    int n1 = ni >> 1;
    float s1 = __int_as_float((n1 + 127) << 23);
    float s2 = __int_as_float((ni - n1 + 127) << 23);
    return __fmul_rn(__fmul_rn(p, s1), s2);
}

// tanh as kernels/generic/src/expf.rs::tanh_f32: 1 - 2 / (exp(2|u|) + 1), sign of u.
__device__ __forceinline__ float edge_tanh(float u) {
    float a = fabsf(u);
    float e = edge_exp(__fmul_rn(2.0f, a));
    float t = __fsub_rn(1.0f, __fdiv_rn(2.0f, __fadd_rn(e, 1.0f)));
    return copysignf(t, u);
}

// Sum of `v` over the 32 lanes of a warp (a fixed butterfly: the same order on every call).
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
