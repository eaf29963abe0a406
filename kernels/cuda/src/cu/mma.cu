// Matrix products on tensor cores (sm_80 and later: Orin's sm_87, Hopper's sm_90; on sm_72 the
// kernels are empty and the executor uses linear.cu's). `out[m, n] = x[m, k] · w[n, k]ᵀ (+ bias)`.
//
// edge_linear_q8_0_mma: the CPU's Q8_0 arithmetic exactly (the generic order: activation rows
// quantized to Q8_0 by edge_quantize_q8_0, per 32-wide block an exact integer sum, then
// `sumf = fma(sumi, dw · da, sumf)` block by block from 0, then the bias). The integer block sums come
// from `mma.m16n8k32` s8 × s8 → s32, one mma per block with a zero accumulator, so the result is
// bit-identical to kernels/generic and to edge_linear_q8_0 (dp4a).
//
// edge_linear_f16_mma: F16 (dtype 1) or BF16 (dtype 2) weights with the activations rounded to
// the weights' type, `mma.m16n8k16` with f32 accumulation. Not the CPU's bits (the activations
// lose precision: relative 2⁻¹¹ for F16, 2⁻⁸ for BF16, and F16 overflows above 65504): the
// executor uses it only where the plan's precision allows (the denoiser, `--cuda-math fast`).
//
// Tiles: 128 × 128 outputs per block of 256 threads (8 warps as 4 × 2, each 32 × 64 outputs:
// 2 × 8 mma tiles of 16 × 8); 4 Q8_0 blocks (128 features) or 64 features per shared-memory
// stage. Shared rows are padded so the fragment loads hit 32 distinct banks. The F16 kernel
// loads the next stage into registers (16-byte loads when k is a multiple of 8) while the
// current one multiplies.
#include "common.cuh"

#define MBM 128
#define MBN 128
// Q8_0 blocks per stage and the padded row stride in 32-bit words (4 blocks × 8 words + 4).
#define QKB 4
#define QROW (QKB * 8 + 4)
// f16 features per stage and the padded row stride in 32-bit words (32 words + 4).
#define HBK 64
#define HROW (HBK / 2 + 4)

typedef unsigned long long u64;

// The Q8_0 layout of the GPU's tensor-core kernel: a `[rows, k/32]` array of 34-byte blocks
// split into the quants `[rows, k]` (int8, rows 16-byte aligned when k is a multiple of 16) and
// the scales `[rows, k/32]` (f32, widened exactly from the blocks' f16). Same values, so the
// products stay the CPU's bits.
extern "C" __global__ void edge_q8_0_split(const unsigned char* src, signed char* qs, float* d,
                                           u64 blocks) {
    for (u64 b = blockIdx.x * (u64)blockDim.x + threadIdx.x; b < blocks;
         b += (u64)gridDim.x * blockDim.x) {
        const unsigned char* s = src + b * 34;
        d[b] = f16_to_f32((half_bits)(s[0] | (s[1] << 8)));
        for (int j = 0; j < 32; j++) qs[b * 32 + j] = (signed char)s[2 + j];
    }
}

// edge_quantize_q8_0 writing the split layout: the same d (f16-rounded, stored widened) and q.
extern "C" __global__ void edge_quantize_q8_0_split(const float* x, signed char* qs, float* d,
                                                    u64 blocks) {
    for (u64 b = blockIdx.x * (u64)blockDim.x + threadIdx.x; b < blocks;
         b += (u64)gridDim.x * blockDim.x) {
        const float* xb = x + b * 32;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
        }
        float dd = __fdiv_rn(amax, 127.0f);
        float id = dd != 0.0f ? __fdiv_rn(1.0f, dd) : 0.0f;
        d[b] = f16_to_f32((half_bits)f32_to_f16_bits(dd));
        for (int j = 0; j < 32; j++) qs[b * 32 + j] = (signed char)roundf(__fmul_rn(xb[j], id));
    }
}

// One stage of edge_linear_q8_0_mma's operands in registers: 128 rows × QKB blocks of quants
// (16-byte pieces) and scales for each operand.
struct Q8Stage {
    uint4 a[4], b[4];
    float ad[2], bd[2];
};

__device__ __forceinline__ void q8_load(Q8Stage& st, const signed char* xq, const float* xd,
                                        const signed char* wq, const float* wd, u64 m, u64 n,
                                        u64 k, u64 i0, u64 j0, u64 b0, unsigned tid) {
    const u64 nb = k / 32;
#pragma unroll
    for (int it = 0; it < 4; it++) {
        // 128 rows × QKB·2 pieces of 16 quants.
        unsigned e = tid + 256 * it, r = e / (QKB * 2), c = e % (QKB * 2);
        u64 blk = b0 + c / 2, i = i0 + r, j = j0 + r;
        uint4 za = make_uint4(0u, 0u, 0u, 0u), zb = za;
        if (blk < nb) {
            if (i < m) za = *(const uint4*)(xq + i * k + blk * 32 + 16 * (c % 2));
            if (j < n) zb = *(const uint4*)(wq + j * k + blk * 32 + 16 * (c % 2));
        }
        st.a[it] = za;
        st.b[it] = zb;
    }
#pragma unroll
    for (int it = 0; it < 2; it++) {
        unsigned e = tid + 256 * it, r = e % MBM, c = e / MBM;
        u64 blk = b0 + c, i = i0 + r, j = j0 + r;
        st.ad[it] = (blk < nb && i < m) ? xd[i * nb + blk] : 0.0f;
        st.bd[it] = (blk < nb && j < n) ? wd[j * nb + blk] : 0.0f;
    }
}

// xq/xd: activations by edge_quantize_q8_0_split; wq/wd: weights by edge_q8_0_split; k a
// multiple of 32 with 16-byte aligned rows (k % 16 == 0 and aligned bases: the executor's
// buffers).
extern "C" __global__ void __launch_bounds__(256, 1)
edge_linear_q8_0_mma(const signed char* xq, const float* xd, const signed char* wq,
                     const float* wd, const float* bias, float* out, u64 m, u64 k, u64 n) {
#if __CUDA_ARCH__ >= 800
    __shared__ int as[MBM * QROW];
    __shared__ int bs[MBN * QROW];
    __shared__ float ad[QKB][MBM];
    __shared__ float bd[QKB][MBN];
    const unsigned tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const unsigned g = lane / 4, t = lane % 4;
    const unsigned wm = (warp / 2) * 32, wn = (warp % 2) * 64;
    const u64 i0 = blockIdx.y * (u64)MBM, j0 = blockIdx.x * (u64)MBN;
    const u64 nb = k / 32;
    float acc[2][8][4];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 8; b++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[a][b][e] = 0.0f;
    Q8Stage st;
    q8_load(st, xq, xd, wq, wd, m, n, k, i0, j0, 0, tid);
    for (u64 b0 = 0; b0 < nb; b0 += QKB) {
#pragma unroll
        for (int it = 0; it < 4; it++) {
            unsigned e = tid + 256 * it, r = e / (QKB * 2), c = e % (QKB * 2);
            int* pa = as + r * QROW + 4 * c;
            int* pb = bs + r * QROW + 4 * c;
            pa[0] = (int)st.a[it].x; pa[1] = (int)st.a[it].y; pa[2] = (int)st.a[it].z; pa[3] = (int)st.a[it].w;
            pb[0] = (int)st.b[it].x; pb[1] = (int)st.b[it].y; pb[2] = (int)st.b[it].z; pb[3] = (int)st.b[it].w;
        }
#pragma unroll
        for (int it = 0; it < 2; it++) {
            unsigned e = tid + 256 * it, r = e % MBM, c = e / MBM;
            ad[c][r] = st.ad[it];
            bd[c][r] = st.bd[it];
        }
        __syncthreads();
        if (b0 + QKB < nb) q8_load(st, xq, xd, wq, wd, m, n, k, i0, j0, b0 + QKB, tid);
        const unsigned kb = (unsigned)((nb - b0) < QKB ? (nb - b0) : QKB);
        for (unsigned blk = 0; blk < kb; blk++) {
            int af[2][4];
#pragma unroll
            for (int a = 0; a < 2; a++) {
                const int* r0 = as + (wm + a * 16 + g) * QROW + blk * 8;
                const int* r1 = r0 + 8 * QROW;
                af[a][0] = r0[t];
                af[a][1] = r1[t];
                af[a][2] = r0[4 + t];
                af[a][3] = r1[4 + t];
            }
            float da[2][2];
#pragma unroll
            for (int a = 0; a < 2; a++) {
                da[a][0] = ad[blk][wm + a * 16 + g];
                da[a][1] = ad[blk][wm + a * 16 + g + 8];
            }
#pragma unroll
            for (int b = 0; b < 8; b++) {
                const int* c0 = bs + (wn + b * 8 + g) * QROW + blk * 8;
                const int b0v = c0[t], b1v = c0[4 + t];
                const unsigned cb = wn + b * 8 + 2 * t;
                const float dw0 = bd[blk][cb], dw1 = bd[blk][cb + 1];
#pragma unroll
                for (int a = 0; a < 2; a++) {
                    int c0i, c1i, c2i, c3i;
                    asm volatile(
                        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
                        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
                        : "=r"(c0i), "=r"(c1i), "=r"(c2i), "=r"(c3i)
                        : "r"(af[a][0]), "r"(af[a][1]), "r"(af[a][2]), "r"(af[a][3]),
                          "r"(b0v), "r"(b1v), "r"(0));
                    acc[a][b][0] = __fmaf_rn((float)c0i, __fmul_rn(dw0, da[a][0]), acc[a][b][0]);
                    acc[a][b][1] = __fmaf_rn((float)c1i, __fmul_rn(dw1, da[a][0]), acc[a][b][1]);
                    acc[a][b][2] = __fmaf_rn((float)c2i, __fmul_rn(dw0, da[a][1]), acc[a][b][2]);
                    acc[a][b][3] = __fmaf_rn((float)c3i, __fmul_rn(dw1, da[a][1]), acc[a][b][3]);
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 8; b++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                u64 i = i0 + wm + a * 16 + g + (e >= 2 ? 8 : 0);
                u64 j = j0 + wn + b * 8 + 2 * t + (e & 1);
                if (i < m && j < n)
                    out[i * n + j] = bias ? __fadd_rn(acc[a][b][e], bias[j]) : acc[a][b][e];
            }
#endif
}

// f32 -> the bits of F16 (dtype 1) or BF16 (dtype 2), rounded to nearest even.
__device__ __forceinline__ unsigned int to_half_bits(float v, int dtype) {
    if (dtype == 1) return f32_to_f16_bits(v);
    unsigned int u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// One stage of edge_linear_f16_mma's operands in registers: 128 rows × HBK features of x (f32,
// as loaded) and of w (halves), so the next stage's global loads are in flight while the
// current stage's products run.
struct F16Stage {
    float4 x[8];
    uint4 w[4];
};

__device__ __forceinline__ void f16_load(F16Stage& st, const float* x, const half_bits* w, u64 m,
                                         u64 k, u64 n, u64 i0, u64 j0, u64 k0, unsigned tid) {
    const bool vec = (k % 8) == 0 && ((u64)x % 16) == 0 && ((u64)w % 16) == 0;
#pragma unroll
    for (int it = 0; it < 8; it++) {
        unsigned e = tid + 256 * it, r = e / (HBK / 4), c = e % (HBK / 4);
        u64 i = i0 + r, kk = k0 + 4 * c;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < m) {
            const float* p = x + i * k + kk;
            if (vec && kk < k) {
                v = *(const float4*)p;
            } else {
                if (kk < k) v.x = p[0];
                if (kk + 1 < k) v.y = p[1];
                if (kk + 2 < k) v.z = p[2];
                if (kk + 3 < k) v.w = p[3];
            }
        }
        st.x[it] = v;
    }
#pragma unroll
    for (int it = 0; it < 4; it++) {
        unsigned e = tid + 256 * it, r = e / (HBK / 8), c = e % (HBK / 8);
        u64 j = j0 + r, kk = k0 + 8 * c;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (j < n) {
            const half_bits* p = w + j * k + kk;
            if (vec && kk < k) {
                v = *(const uint4*)p;
            } else {
                unsigned hw[8];
#pragma unroll
                for (int q = 0; q < 8; q++) hw[q] = kk + q < k ? p[q] : 0u;
                v = make_uint4(hw[0] | (hw[1] << 16), hw[2] | (hw[3] << 16), hw[4] | (hw[5] << 16),
                               hw[6] | (hw[7] << 16));
            }
        }
        st.w[it] = v;
    }
}

extern "C" __global__ void __launch_bounds__(256, 1)
edge_linear_f16_mma(const float* x, const half_bits* w, int dtype, const float* bias, float* out,
                    u64 m, u64 k, u64 n) {
#if __CUDA_ARCH__ >= 800
    __shared__ unsigned int as[MBM * HROW];
    __shared__ unsigned int bs[MBN * HROW];
    const unsigned tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const unsigned g = lane / 4, t = lane % 4;
    const unsigned wm = (warp / 2) * 32, wn = (warp % 2) * 64;
    const u64 i0 = blockIdx.y * (u64)MBM, j0 = blockIdx.x * (u64)MBN;
    float acc[2][8][4];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 8; b++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[a][b][e] = 0.0f;
    F16Stage st;
    f16_load(st, x, w, m, k, n, i0, j0, 0, tid);
    for (u64 k0 = 0; k0 < k; k0 += HBK) {
#pragma unroll
        for (int it = 0; it < 8; it++) {
            unsigned e = tid + 256 * it, r = e / (HBK / 4), c = e % (HBK / 4);
            float4 v = st.x[it];
            as[r * HROW + 2 * c] = (to_half_bits(v.x, dtype) & 0xffffu) | (to_half_bits(v.y, dtype) << 16);
            as[r * HROW + 2 * c + 1] = (to_half_bits(v.z, dtype) & 0xffffu) | (to_half_bits(v.w, dtype) << 16);
        }
#pragma unroll
        for (int it = 0; it < 4; it++) {
            unsigned e = tid + 256 * it, r = e / (HBK / 8), c = e % (HBK / 8);
            uint4 v = st.w[it];
            unsigned* d = bs + r * HROW + 4 * c;
            d[0] = v.x;
            d[1] = v.y;
            d[2] = v.z;
            d[3] = v.w;
        }
        __syncthreads();
        if (k0 + HBK < k) f16_load(st, x, w, m, k, n, i0, j0, k0 + HBK, tid);
#pragma unroll
        for (int ks = 0; ks < HBK / 16; ks++) {
            unsigned af[2][4];
#pragma unroll
            for (int a = 0; a < 2; a++) {
                const unsigned* r0 = as + (wm + a * 16 + g) * HROW + ks * 8;
                const unsigned* r1 = r0 + 8 * HROW;
                af[a][0] = r0[t];
                af[a][1] = r1[t];
                af[a][2] = r0[4 + t];
                af[a][3] = r1[4 + t];
            }
#pragma unroll
            for (int b = 0; b < 8; b++) {
                const unsigned* c0 = bs + (wn + b * 8 + g) * HROW + ks * 8;
                const unsigned b0 = c0[t], b1 = c0[4 + t];
#pragma unroll
                for (int a = 0; a < 2; a++) {
                    if (dtype == 1)
                        asm volatile(
                            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                            : "+f"(acc[a][b][0]), "+f"(acc[a][b][1]), "+f"(acc[a][b][2]),
                              "+f"(acc[a][b][3])
                            : "r"(af[a][0]), "r"(af[a][1]), "r"(af[a][2]), "r"(af[a][3]),
                              "r"(b0), "r"(b1));
                    else
                        asm volatile(
                            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                            : "+f"(acc[a][b][0]), "+f"(acc[a][b][1]), "+f"(acc[a][b][2]),
                              "+f"(acc[a][b][3])
                            : "r"(af[a][0]), "r"(af[a][1]), "r"(af[a][2]), "r"(af[a][3]),
                              "r"(b0), "r"(b1));
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 8; b++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                u64 i = i0 + wm + a * 16 + g + (e >= 2 ? 8 : 0);
                u64 j = j0 + wn + b * 8 + 2 * t + (e & 1);
                if (i < m && j < n)
                    out[i * n + j] = bias ? __fadd_rn(acc[a][b][e], bias[j]) : acc[a][b][e];
            }
#endif
}
