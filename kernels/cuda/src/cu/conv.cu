// 2-D convolution (torch nn.Conv2d, groups 1, dilation 1, zero padding per side) as an implicit
// GEMM in the arithmetic of the generic kernel's direct form (`conv2d_direct`,
// kernels/generic/src/conv.rs): every output is one fused multiply-add per patch element in
// (ci, ky, kx) order from 0, padded positions included as zeros, then `+ bias[co]`, so it gives
// those bits (the CPU's own conv2d takes Winograd F(2x2, 3x3) for 3x3 stride-1 kernels with at
// least 8 input channels, whose last bits differ). `out[co, pix] = w[co, :] · patch[:, pix]`
// with the patches unfolded on the fly; tiles as edge_linear_plain (64 × 64 outputs per block of
// 256 threads, 4 × 4 per thread, 16 patch elements per shared-memory stage).
#include "common.cuh"

#define CM 64
#define CN 64
#define CK 16

typedef unsigned long long u64;

// dtype: 0 = F32, 1 = F16, 2 = BF16 weights [cout, cin·kh·kw].
__device__ __forceinline__ float conv_weight(const void* w, int dtype, u64 i) {
    if (dtype == 0) return ((const float*)w)[i];
    half_bits h = ((const half_bits*)w)[i];
    return dtype == 1 ? f16_to_f32(h) : bf16_to_f32(h);
}

// x [cin, h, w]; out [cout, oh, ow]. geo: cin, h, w, cout, kh, kw, stride_h, stride_w, pad_top,
// pad_left, oh, ow (u32 each).
extern "C" __global__ void __launch_bounds__(256)
edge_conv2d(const float* x, const void* wt, int dtype, const float* bias, float* out,
            unsigned cin, unsigned h, unsigned w, unsigned cout, unsigned kh, unsigned kw,
            unsigned sh, unsigned sw, unsigned pt, unsigned pl, unsigned oh, unsigned ow) {
    __shared__ float ws[CK][CM + 1];
    __shared__ float ps[CK][CN + 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const u64 kk = (u64)cin * kh * kw, npix = (u64)oh * ow;
    const u64 c0 = blockIdx.y * (u64)CM, p0 = blockIdx.x * (u64)CN;
    float acc[4][4];
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) acc[a][b] = 0.0f;
    for (u64 k0 = 0; k0 < kk; k0 += CK) {
        for (int e = threadIdx.x; e < CM * CK; e += 256) {
            int r = e / CK, t = e % CK;
            u64 co = c0 + r, k = k0 + t;
            ws[t][r] = (co < cout && k < kk) ? conv_weight(wt, dtype, co * kk + k) : 0.0f;
            u64 pix = p0 + r;
            float v = 0.0f;
            if (pix < npix && k < kk) {
                unsigned ci = (unsigned)(k / ((u64)kh * kw));
                unsigned ky = (unsigned)((k / kw) % kh), kx = (unsigned)(k % kw);
                long long y = (long long)(pix / ow) * sh + ky - pt;
                long long xx = (long long)(pix % ow) * sw + kx - pl;
                if (y >= 0 && y < h && xx >= 0 && xx < w) v = x[((u64)ci * h + y) * w + xx];
            }
            ps[t][r] = v;
        }
        __syncthreads();
        int kt = (int)((kk - k0) < CK ? (kk - k0) : CK);
        for (int t = 0; t < kt; t++)
            for (int a = 0; a < 4; a++)
                for (int b = 0; b < 4; b++)
                    acc[a][b] = __fmaf_rn(ws[t][ty * 4 + a], ps[t][tx * 4 + b], acc[a][b]);
        __syncthreads();
    }
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            u64 co = c0 + ty * 4 + a, pix = p0 + tx * 4 + b;
            if (co < cout && pix < npix)
                out[co * npix + pix] = bias ? __fadd_rn(acc[a][b], bias[co]) : acc[a][b];
        }
}
