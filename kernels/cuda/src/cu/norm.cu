// Normalisations, one thread block per row (layer and RMS norm) or per group (group norm).
// Statistics in double, summed in a fixed tree (per thread in index order, then the block's
// threads pairwise), so results do not depend on timing; the order differs from the CPU's
// `lane_sum`, so outputs agree with the generic kernels within a bound, not bit for bit.
#include "common.cuh"

#define NORM_THREADS 256

// Sum of `v` over the block's NORM_THREADS threads, in a fixed pairwise order.
__device__ double block_sum(double v, double* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = NORM_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

// Mean and variance (two passes) of the n values at x, by the whole block.
__device__ void block_moments(const float* x, unsigned long long n, double* sh, double* mean,
                              double* var) {
    double s = 0.0;
    for (unsigned long long i = threadIdx.x; i < n; i += NORM_THREADS) s += (double)x[i];
    *mean = block_sum(s, sh) / (double)n;
    double q = 0.0;
    for (unsigned long long i = threadIdx.x; i < n; i += NORM_THREADS) {
        double t = (double)x[i] - *mean;
        q += t * t;
    }
    *var = block_sum(q, sh) / (double)n;
}

// x, out [m, d]; weight/bias [d] or null (affine = 0). Launch m blocks of NORM_THREADS.
extern "C" __global__ void edge_layer_norm(const float* x, const float* weight, const float* bias,
                                           float* out, unsigned long long d, float eps) {
    __shared__ double sh[NORM_THREADS];
    const float* xr = x + blockIdx.x * d;
    float* o = out + blockIdx.x * d;
    double mean, var;
    block_moments(xr, d, sh, &mean, &var);
    double rstd = 1.0 / sqrt(var + (double)eps);
    for (unsigned long long j = threadIdx.x; j < d; j += NORM_THREADS) {
        double y = ((double)xr[j] - mean) * rstd;
        if (weight) y *= (double)weight[j];
        if (bias) y += (double)bias[j];
        o[j] = (float)y;
    }
}

// T5 RMS norm: x / sqrt(mean(x^2) + eps) * weight. Launch m blocks of NORM_THREADS.
extern "C" __global__ void edge_rms_norm(const float* x, const float* weight, float* out,
                                         unsigned long long d, float eps) {
    __shared__ double sh[NORM_THREADS];
    const float* xr = x + blockIdx.x * d;
    float* o = out + blockIdx.x * d;
    double q = 0.0;
    for (unsigned long long j = threadIdx.x; j < d; j += NORM_THREADS) {
        double t = (double)xr[j];
        q += t * t;
    }
    double ms = block_sum(q, sh) / (double)d;
    double r = 1.0 / sqrt(ms + (double)eps);
    for (unsigned long long j = threadIdx.x; j < d; j += NORM_THREADS)
        o[j] = (float)((double)xr[j] * r) * weight[j];
}

// x, out [c, hw] in `groups` groups of c/groups channels; weight/bias [c]. Launch `groups`
// blocks of NORM_THREADS.
extern "C" __global__ void edge_group_norm(const float* x, const float* weight, const float* bias,
                                           float* out, unsigned long long c, unsigned long long hw,
                                           unsigned long long groups, float eps) {
    __shared__ double sh[NORM_THREADS];
    unsigned long long cg = c / groups;
    unsigned long long n = cg * hw;
    const float* xg = x + blockIdx.x * n;
    float* og = out + blockIdx.x * n;
    double mean, var;
    block_moments(xg, n, sh, &mean, &var);
    double rstd = 1.0 / sqrt(var + (double)eps);
    for (unsigned long long i = threadIdx.x; i < n; i += NORM_THREADS) {
        unsigned long long ch = blockIdx.x * cg + i / hw;
        double y = ((double)xg[i] - mean) * rstd * (double)weight[ch] + (double)bias[ch];
        og[i] = (float)y;
    }
}
