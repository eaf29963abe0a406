// Element-wise kernels: one thread per element (grid-stride), each the generic scalar definition
// (kernels/generic/src/elementwise.rs) with explicit rounding, so the outputs are bit-identical to
// the CPU kernels'.
#include "common.cuh"

extern "C" __global__ void edge_silu(const float* x, float* out, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        float v = x[i];
        out[i] = __fdiv_rn(v, __fadd_rn(1.0f, edge_exp(-v)));
    }
}

extern "C" __global__ void edge_gelu_tanh(const float* x, float* out, unsigned long long n) {
    const float SQRT_2_OVER_PI = 0.797884583f;
    const float KAPPA = 0.044715f;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        float v = x[i];
        float cube = __fmul_rn(__fmul_rn(v, v), v);
        float inner = __fmul_rn(SQRT_2_OVER_PI, __fadd_rn(v, __fmul_rn(KAPPA, cube)));
        out[i] = __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, edge_tanh(inner)));
    }
}

extern "C" __global__ void edge_tanh_k(const float* x, float* out, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = edge_tanh(x[i]);
}

extern "C" __global__ void edge_relu(const float* x, float* out, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        float v = x[i];
        out[i] = v < 0.0f ? 0.0f : v;
    }
}

extern "C" __global__ void edge_scale(const float* x, float factor, float* out,
                                      unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = __fmul_rn(x[i], factor);
}

// a + b and a * b, `b` broadcast: b has `nb` elements and a's length is a multiple of nb.
extern "C" __global__ void edge_add(const float* a, const float* b, float* out,
                                    unsigned long long n, unsigned long long nb) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = __fadd_rn(a[i], b[i % nb]);
}

extern "C" __global__ void edge_mul(const float* a, const float* b, float* out,
                                    unsigned long long n, unsigned long long nb) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = __fmul_rn(a[i], b[i % nb]);
}

// x [m, d]: x * (1 + scale) + shift (PixArt's adaLN modulation).
extern "C" __global__ void edge_modulate(const float* x, const float* shift, const float* scale,
                                         float* out, unsigned long long m, unsigned long long d) {
    unsigned long long n = m * d;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long j = i % d;
        out[i] = __fadd_rn(__fmul_rn(x[i], __fadd_rn(1.0f, scale[j])), shift[j]);
    }
}

// x + gate * y, gate [d].
extern "C" __global__ void edge_gated_residual(const float* x, const float* y, const float* gate,
                                               float* out, unsigned long long m,
                                               unsigned long long d) {
    unsigned long long n = m * d;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = __fadd_rn(x[i], __fmul_rn(gate[i % d], y[i]));
}

// [c, h, w] -> [c, 2h, 2w], nearest.
extern "C" __global__ void edge_upsample_nearest2x(const float* x, float* out,
                                                   unsigned long long c, unsigned long long h,
                                                   unsigned long long w) {
    unsigned long long n = c * 4 * h * w;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long ox = i % (2 * w), oy = (i / (2 * w)) % (2 * h), ch = i / (4 * h * w);
        out[i] = x[(ch * h + oy / 2) * w + ox / 2];
    }
}

// Rows of a table widened to f32, as kernels/generic/src/quant.rs::dequantize_row: dtype 0 = F32
// (copied), 1 = F16, 2 = BF16, 3 = Q8_0 (`q · d` per 34-byte block; n a multiple of 32). The
// cross-attention K/V cache and the T5 states are read this way.
extern "C" __global__ void edge_dequantize(const unsigned char* src, int dtype, float* out,
                                           unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        float v;
        if (dtype == 0) {
            v = ((const float*)src)[i];
        } else if (dtype == 1) {
            v = f16_to_f32(((const half_bits*)src)[i]);
        } else if (dtype == 2) {
            v = bf16_to_f32(((const half_bits*)src)[i]);
        } else {
            const unsigned char* b = src + (i / 32) * 34;
            float d = f16_to_f32((half_bits)(b[0] | (b[1] << 8)));
            v = __fmul_rn((float)(signed char)b[2 + i % 32], d);
        }
        out[i] = v;
    }
}
