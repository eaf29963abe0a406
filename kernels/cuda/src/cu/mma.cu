// Matrix products on tensor cores (sm_80 and later: Orin's sm_87, Hopper's sm_90; on sm_72 the
// kernels are empty and the executor uses linear.cu's). `out[m, n] = x[m, k] · w[n, k]ᵀ (+ bias)`.
//
// edge_linear_q8_0_mma: the CPU's Q8_0 arithmetic exactly (ggml's order: activation rows
// quantized to Q8_0 by edge_quantize_q8_0, per 32-wide block an exact integer sum, then
// `sumf += sumi · (dw · da)` block by block from 0, then the bias). The integer block sums come
// from `mma.m16n8k32` s8 × s8 → s32, one mma per block with a zero accumulator, so the result is
// bit-identical to kernels/generic and to edge_linear_q8_0 (dp4a).
//
// edge_linear_f16_mma: F16 (dtype 1) or BF16 (dtype 2) weights with the activations rounded to
// the weights' type, `mma.m16n8k16` with f32 accumulation. Not the CPU's bits (the activations
// lose precision: relative 2⁻¹¹ for F16, 2⁻⁸ for BF16, and F16 overflows above 65504): the
// executor uses it only where the plan's precision allows (the denoiser, `--cuda-math fast`).
//
// Tiles: 128 × 128 outputs per block of 256 threads (8 warps as 4 × 2, each 32 × 64 outputs:
// 2 × 8 mma tiles of 16 × 8); 4 Q8_0 blocks (128 features) or 32 features per shared-memory
// stage. Shared rows are padded so the fragment loads hit 32 distinct banks.
#include "common.cuh"

#define MBM 128
#define MBN 128
// Q8_0 blocks per stage and the padded row stride in 32-bit words (4 blocks × 8 words + 4).
#define QKB 4
#define QROW (QKB * 8 + 4)
// f16 features per stage and the padded row stride in 32-bit words (16 words + 4).
#define HBK 32
#define HROW (HBK / 2 + 4)

typedef unsigned long long u64;

// Four quants of a 34-byte Q8_0 block at byte `off` (even) as one 32-bit word.
__device__ __forceinline__ int quad16(const unsigned char* p) {
    const unsigned short* h = (const unsigned short*)p;
    return (int)((unsigned)h[0] | ((unsigned)h[1] << 16));
}

extern "C" __global__ void __launch_bounds__(256, 1)
edge_linear_q8_0_mma(const unsigned char* xq, const unsigned char* w, const float* bias,
                     float* out, u64 m, u64 k, u64 n) {
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
    for (u64 b0 = 0; b0 < nb; b0 += QKB) {
        // Quants: 128 rows × QKB blocks × 8 words for each operand, 16 words per thread.
        for (unsigned e = tid; e < MBM * QKB * 8; e += 256) {
            unsigned r = e / (QKB * 8), c = e % (QKB * 8), blk = c / 8, wd = c % 8;
            u64 b = b0 + blk, i = i0 + r, j = j0 + r;
            as[r * QROW + c] = (i < m && b < nb) ? quad16(xq + (i * nb + b) * 34 + 2 + 4 * wd) : 0;
            bs[r * QROW + c] = (j < n && b < nb) ? quad16(w + (j * nb + b) * 34 + 2 + 4 * wd) : 0;
        }
        for (unsigned e = tid; e < MBM * QKB; e += 256) {
            unsigned r = e % MBM, blk = e / MBM;
            u64 b = b0 + blk, i = i0 + r, j = j0 + r;
            ad[blk][r] = (i < m && b < nb)
                ? f16_to_f32(*(const half_bits*)(xq + (i * nb + b) * 34)) : 0.0f;
            bd[blk][r] = (j < n && b < nb)
                ? f16_to_f32(*(const half_bits*)(w + (j * nb + b) * 34)) : 0.0f;
        }
        __syncthreads();
        const unsigned kb = (unsigned)((nb - b0) < QKB ? (nb - b0) : QKB);
        for (unsigned blk = 0; blk < kb; blk++) {
            int af[2][4], bf[8][2];
            #pragma unroll
            for (int a = 0; a < 2; a++) {
                const int* r0 = as + (wm + a * 16 + g) * QROW + blk * 8;
                const int* r1 = r0 + 8 * QROW;
                af[a][0] = r0[t];
                af[a][1] = r1[t];
                af[a][2] = r0[4 + t];
                af[a][3] = r1[4 + t];
            }
            #pragma unroll
            for (int b = 0; b < 8; b++) {
                const int* c0 = bs + (wn + b * 8 + g) * QROW + blk * 8;
                bf[b][0] = c0[t];
                bf[b][1] = c0[4 + t];
            }
            #pragma unroll
            for (int a = 0; a < 2; a++) {
                const unsigned ra = wm + a * 16 + g;
                const float da0 = ad[blk][ra], da1 = ad[blk][ra + 8];
                #pragma unroll
                for (int b = 0; b < 8; b++) {
                    int c0, c1, c2, c3;
                    asm volatile(
                        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
                        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
                        : "=r"(c0), "=r"(c1), "=r"(c2), "=r"(c3)
                        : "r"(af[a][0]), "r"(af[a][1]), "r"(af[a][2]), "r"(af[a][3]),
                          "r"(bf[b][0]), "r"(bf[b][1]), "r"(0));
                    const unsigned cb = wn + b * 8 + 2 * t;
                    const float dw0 = bd[blk][cb], dw1 = bd[blk][cb + 1];
                    acc[a][b][0] = __fadd_rn(acc[a][b][0], __fmul_rn((float)c0, __fmul_rn(dw0, da0)));
                    acc[a][b][1] = __fadd_rn(acc[a][b][1], __fmul_rn((float)c1, __fmul_rn(dw1, da0)));
                    acc[a][b][2] = __fadd_rn(acc[a][b][2], __fmul_rn((float)c2, __fmul_rn(dw0, da1)));
                    acc[a][b][3] = __fadd_rn(acc[a][b][3], __fmul_rn((float)c3, __fmul_rn(dw1, da1)));
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

extern "C" __global__ void __launch_bounds__(256)
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
    for (u64 k0 = 0; k0 < k; k0 += HBK) {
        // 128 rows × 16 words (pairs of features) per operand, 8 per thread.
        for (unsigned e = tid; e < MBM * (HBK / 2); e += 256) {
            unsigned r = e / (HBK / 2), c = e % (HBK / 2);
            u64 kk = k0 + 2 * c, i = i0 + r, j = j0 + r;
            unsigned lo = 0, hi = 0;
            if (i < m) {
                if (kk < k) lo = to_half_bits(x[i * k + kk], dtype);
                if (kk + 1 < k) hi = to_half_bits(x[i * k + kk + 1], dtype);
            }
            as[r * HROW + c] = lo | (hi << 16);
            lo = 0;
            hi = 0;
            if (j < n) {
                if (kk < k) lo = w[j * k + kk];
                if (kk + 1 < k) hi = w[j * k + kk + 1];
            }
            bs[r * HROW + c] = lo | (hi << 16);
        }
        __syncthreads();
        #pragma unroll
        for (int ks = 0; ks < HBK / 16; ks++) {
            unsigned af[2][4], bf[8][2];
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
                bf[b][0] = c0[t];
                bf[b][1] = c0[4 + t];
            }
            #pragma unroll
            for (int a = 0; a < 2; a++)
                #pragma unroll
                for (int b = 0; b < 8; b++) {
                    if (dtype == 1)
                        asm volatile(
                            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                            : "+f"(acc[a][b][0]), "+f"(acc[a][b][1]), "+f"(acc[a][b][2]),
                              "+f"(acc[a][b][3])
                            : "r"(af[a][0]), "r"(af[a][1]), "r"(af[a][2]), "r"(af[a][3]),
                              "r"(bf[b][0]), "r"(bf[b][1]));
                    else
                        asm volatile(
                            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                            : "+f"(acc[a][b][0]), "+f"(acc[a][b][1]), "+f"(acc[a][b][2]),
                              "+f"(acc[a][b][3])
                            : "r"(af[a][0]), "r"(af[a][1]), "r"(af[a][2]), "r"(af[a][3]),
                              "r"(bf[b][0]), "r"(bf[b][1]));
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
