// Matrix products `out[m, n] = x[m, k] · w[n, k]ᵀ (+ bias)` in the generic kernels' arithmetic:
// for F32/F16/BF16 weights one fused multiply-add per input feature in increasing order from 0,
// then the bias (kernels/generic/src/gemm.rs); for Q8_0 weights the generic order (activation
// rows quantized to Q8_0, exact integer block sums by dp4a, `sumf = fma(sumi, dw · da, sumf)`
// block by block, then the bias). So both are bit-identical to the CPU kernels. Tiles: 64 × 64 outputs per block
// of 256 threads, 4 × 4 per thread, 16 features per shared-memory stage.
#include "common.cuh"

#define TM 64
#define TN 64
#define TK 16

// dtype: 0 = F32, 1 = F16, 2 = BF16 weights (rows of k elements).
__device__ __forceinline__ float weight_at(const void* w, int dtype, unsigned long long i) {
    if (dtype == 0) return ((const float*)w)[i];
    half_bits h = ((const half_bits*)w)[i];
    return dtype == 1 ? f16_to_f32(h) : bf16_to_f32(h);
}

extern "C" __global__ void __launch_bounds__(256)
edge_linear_plain(const float* x, const void* w, int dtype, const float* bias, float* out,
                  unsigned long long m, unsigned long long k, unsigned long long n) {
    __shared__ float xs[TK][TM + 1];
    __shared__ float ws[TK][TN + 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const unsigned long long i0 = blockIdx.y * (unsigned long long)TM;
    const unsigned long long j0 = blockIdx.x * (unsigned long long)TN;
    float acc[4][4];
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) acc[a][b] = 0.0f;
    for (unsigned long long t0 = 0; t0 < k; t0 += TK) {
        for (int e = threadIdx.x; e < TM * TK; e += 256) {
            int r = e / TK, t = e % TK;
            unsigned long long i = i0 + r, tt = t0 + t;
            xs[t][r] = (i < m && tt < k) ? x[i * k + tt] : 0.0f;
            unsigned long long j = j0 + r;
            ws[t][r] = (j < n && tt < k) ? weight_at(w, dtype, j * k + tt) : 0.0f;
        }
        __syncthreads();
        int kt = (int)((k - t0) < TK ? (k - t0) : TK);
        for (int t = 0; t < kt; t++)
            for (int a = 0; a < 4; a++)
                for (int b = 0; b < 4; b++)
                    acc[a][b] = __fmaf_rn(xs[t][ty * 4 + a], ws[t][tx * 4 + b], acc[a][b]);
        __syncthreads();
    }
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            unsigned long long i = i0 + ty * 4 + a, j = j0 + tx * 4 + b;
            if (i < m && j < n) out[i * n + j] = bias ? __fadd_rn(acc[a][b], bias[j]) : acc[a][b];
        }
}

// ggml quantize_row_q8_0_ref per 32-value block: d = amax / 127 (stored as f16, round to
// nearest even), id = d ? 1/d : 0, q = roundf(x · id) (half away from zero). One thread per
// block; `q` is [m, k/32, 34] bytes (d then 32 quants), as the CPU writes it.
extern "C" __global__ void edge_quantize_q8_0(const float* x, unsigned char* q,
                                              unsigned long long blocks) {
    for (unsigned long long b = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         b < blocks; b += (unsigned long long)gridDim.x * blockDim.x) {
        const float* xb = x + b * 32;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
        }
        float d = __fdiv_rn(amax, 127.0f);
        float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
        unsigned int h = f32_to_f16_bits(d);
        unsigned char* qb = q + b * 34;
        qb[0] = (unsigned char)(h & 0xffu);
        qb[1] = (unsigned char)((h >> 8) & 0xffu);
        for (int j = 0; j < 32; j++) qb[2 + j] = (unsigned char)(signed char)roundf(__fmul_rn(xb[j], id));
    }
}

// Four bytes of a Q8_0 block's quants (unaligned in the 34-byte block) as one int.
__device__ __forceinline__ int quad(const unsigned char* p) {
    return (int)((unsigned)p[0] | ((unsigned)p[1] << 8) | ((unsigned)p[2] << 16) |
                 ((unsigned)p[3] << 24));
}

// x_q: activations quantized by edge_quantize_q8_0 ([m, k/32] blocks); w: Q8_0 rows [n, k/32].
// One thread per output element, 64 columns × 4 rows per block of 256 threads.
extern "C" __global__ void __launch_bounds__(256)
edge_linear_q8_0(const unsigned char* xq, const unsigned char* w, const float* bias, float* out,
                 unsigned long long m, unsigned long long k, unsigned long long n) {
    const unsigned long long j = blockIdx.x * 64ull + threadIdx.x % 64;
    const unsigned long long i = blockIdx.y * 4ull + threadIdx.x / 64;
    if (i >= m || j >= n) return;
    const unsigned long long nb = k / 32;
    const unsigned char* xr = xq + i * nb * 34;
    const unsigned char* wr = w + j * nb * 34;
    float sumf = 0.0f;
    for (unsigned long long b = 0; b < nb; b++) {
        const unsigned char* xb = xr + b * 34;
        const unsigned char* wb = wr + b * 34;
        int sumi = 0;
        for (int s = 0; s < 8; s++) sumi = __dp4a(quad(xb + 2 + 4 * s), quad(wb + 2 + 4 * s), sumi);
        float da = f16_to_f32((half_bits)(xb[0] | (xb[1] << 8)));
        float dw = f16_to_f32((half_bits)(wb[0] | (wb[1] << 8)));
        sumf = __fmaf_rn((float)sumi, __fmul_rn(dw, da), sumf);
    }
    out[i * n + j] = bias ? __fadd_rn(sumf, bias[j]) : sumf;
}
