// Attention on tensor cores (sm_80 and later), flash style (FlashAttention-2's loop: a block of
// 64 query rows of one head keeps its scores in registers, one 64-key tile of K and V at a time
// in shared memory, online softmax), for head dims ≤ 80: PixArt's 72 (1152 / 16) is padded to
// 80 = 5 × 16 with zeros, which neither ggml-cuda nor FlashAttention-2 have a tensor-core kernel
// for. Scores: `scale·(q·k) + bias[h, i, j] + (1 − mask[j])·masked_value`, as
// kernels/generic/src/attention.rs, with q, k, v and the softmax weights rounded to F16 for
// `mma.m16n8k16` (f32 sums) and the hardware exp: fast math only (the executor uses it in the
// denoiser with `--cuda-math fast`; outputs within 2e-3 of the largest value of the generic
// kernel's, kernels/cuda/tests/twins.rs).
#include "common.cuh"

#define FQ 64
#define FK 64
#define FD 80
// Padded row strides in 32-bit words (fragment loads hit 32 distinct banks).
#define KROW (FD / 2 + 4)
#define VROW (FK / 2 + 4)

typedef unsigned long long u64;

__device__ __forceinline__ unsigned pack_f16(float lo, float hi) {
    return (f32_to_f16_bits(lo) & 0xffffu) | (f32_to_f16_bits(hi) << 16);
}

__device__ __forceinline__ void mma_f16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

extern "C" __global__ void __launch_bounds__(128)
edge_attention_mma(const float* q_src, const float* kv_src, const float* mask, const float* bias,
                   float* out, u64 lq, u64 lk, unsigned heads, unsigned head_dim, float scale,
                   u64 q_stride, u64 q_offset, u64 kv_stride, u64 k_offset, u64 v_offset,
                   float masked_value) {
#if __CUDA_ARCH__ >= 800
    __shared__ unsigned ks[FK * KROW];
    __shared__ unsigned vs[FD * VROW];
    unsigned short* vh = (unsigned short*)vs;
    const unsigned tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const unsigned g = lane / 4, t = lane % 4;
    const unsigned h = blockIdx.y;
    const u64 r0 = blockIdx.x * (u64)FQ + warp * 16;
    const float NEG_INF = -__int_as_float(0x7f800000);
    // This warp's 16 query rows as A fragments, 5 steps of 16 dims.
    unsigned qf[5][4];
#pragma unroll
    for (int s = 0; s < 5; s++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            u64 i = r0 + g + ((e & 1) ? 8 : 0);
            unsigned d = s * 16 + 2 * t + ((e & 2) ? 8 : 0);
            float lo = 0.0f, hi = 0.0f;
            if (i < lq) {
                const float* q = q_src + i * q_stride + q_offset + (u64)h * head_dim;
                if (d < head_dim) lo = q[d];
                if (d + 1 < head_dim) hi = q[d + 1];
            }
            qf[s][e] = pack_f16(lo, hi);
        }
    }
    float o[10][4];
#pragma unroll
    for (int d = 0; d < 10; d++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[d][e] = 0.0f;
    float mrow[2] = {NEG_INF, NEG_INF}, lrow[2] = {0.0f, 0.0f};
    for (u64 j0 = 0; j0 < lk; j0 += FK) {
        __syncthreads();
        // K as [key][dim pairs]; V transposed as [dim][key] halves.
        for (unsigned e = tid; e < FK * (FD / 2); e += 128) {
            unsigned key = e / (FD / 2), c = e % (FD / 2), d = 2 * c;
            u64 j = j0 + key;
            float k0 = 0.0f, k1 = 0.0f, v0 = 0.0f, v1 = 0.0f;
            if (j < lk) {
                const float* kr = kv_src + j * kv_stride + k_offset + (u64)h * head_dim;
                const float* vr = kv_src + j * kv_stride + v_offset + (u64)h * head_dim;
                if (d < head_dim) { k0 = kr[d]; v0 = vr[d]; }
                if (d + 1 < head_dim) { k1 = kr[d + 1]; v1 = vr[d + 1]; }
            }
            ks[key * KROW + c] = pack_f16(k0, k1);
            vh[d * (2 * VROW) + key] = (unsigned short)f32_to_f16_bits(v0);
            vh[(d + 1) * (2 * VROW) + key] = (unsigned short)f32_to_f16_bits(v1);
        }
        __syncthreads();
        float s[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) s[nt][e] = 0.0f;
            const unsigned* kr = ks + (nt * 8 + g) * KROW;
#pragma unroll
            for (int st = 0; st < 5; st++) mma_f16(s[nt], qf[st], kr[st * 8 + t], kr[st * 8 + 4 + t]);
        }
        // Scores, then the online softmax of rows g (e < 2) and g + 8 (e ≥ 2).
        float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                u64 i = r0 + g + (e >= 2 ? 8 : 0);
                u64 j = j0 + nt * 8 + 2 * t + (e & 1);
                float v = s[nt][e] * scale;
                if (j >= lk) {
                    v = NEG_INF;
                } else {
                    if (bias && i < lq) v += bias[((u64)h * lq + i) * lk + j];
                    if (mask) v += (1.0f - mask[j]) * masked_value;
                }
                s[nt][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float nm = fmaxf(mrow[r], mx[r]);
            corr[r] = mrow[r] == NEG_INF ? 0.0f : __expf(mrow[r] - nm);
            mrow[r] = nm;
            lrow[r] *= corr[r];
        }
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float m = mrow[e >> 1];
                float p = m == NEG_INF ? 0.0f : __expf(s[nt][e] - m);
                s[nt][e] = p;
                lrow[e >> 1] += p;
            }
#pragma unroll
        for (int d = 0; d < 10; d++) {
            o[d][0] *= corr[0];
            o[d][1] *= corr[0];
            o[d][2] *= corr[1];
            o[d][3] *= corr[1];
        }
        // O += P·V, four steps of 16 keys.
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            unsigned pf[4] = {pack_f16(s[2 * kk][0], s[2 * kk][1]), pack_f16(s[2 * kk][2], s[2 * kk][3]),
                              pack_f16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_f16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int d = 0; d < 10; d++) {
                const unsigned* vr = vs + (d * 8 + g) * VROW + kk * 8;
                mma_f16(o[d], pf, vr[t], vr[4 + t]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 1);
        lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 2);
    }
#pragma unroll
    for (int d = 0; d < 10; d++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            u64 i = r0 + g + (e >= 2 ? 8 : 0);
            unsigned c = d * 8 + 2 * t + (e & 1);
            if (i < lq && c < head_dim)
                out[i * (u64)heads * head_dim + (u64)h * head_dim + c] = o[d][e] / lrow[e >> 1];
        }
#endif
}
