// Multi-head attention, flash style (online softmax), one warp per (query row, head): lanes hold
// head channels `lane, lane + 32, …` (head_dim ≤ 128), `q·k` is a warp sum, the weights use the
// kernels' `exp`. Scores: `scale·(q·k) + bias[h, i, j] + (1 − mask[j])·masked_value`, as
// kernels/generic/src/attention.rs. The reduction order differs from the CPU's, so outputs agree
// within a bound. Query/key/value rows are read in place with strides and offsets (fused qkv).
#include "common.cuh"

#define MAX_PER_LANE 4

extern "C" __global__ void __launch_bounds__(128)
edge_attention(const float* q_src, const float* kv_src, const float* mask, const float* bias,
               float* out, unsigned long long lq, unsigned long long lk, unsigned int heads,
               unsigned int head_dim, float scale, unsigned long long q_stride,
               unsigned long long q_offset, unsigned long long kv_stride,
               unsigned long long k_offset, unsigned long long v_offset, float masked_value) {
    const unsigned int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const unsigned int lane = threadIdx.x % 32;
    const unsigned long long i = warp / heads;
    const unsigned int h = warp % heads;
    if (i >= lq) return;
    const float* q = q_src + i * q_stride + q_offset + (unsigned long long)h * head_dim;
    float qv[MAX_PER_LANE], acc[MAX_PER_LANE];
    for (int c = 0; c < MAX_PER_LANE; c++) {
        unsigned int d = lane + 32 * c;
        qv[c] = d < head_dim ? q[d] : 0.0f;
        acc[c] = 0.0f;
    }
    float run_max = -__int_as_float(0x7f800000), run_sum = 0.0f;
    for (unsigned long long j = 0; j < lk; j++) {
        const float* kr = kv_src + j * kv_stride + k_offset + (unsigned long long)h * head_dim;
        float part = 0.0f;
        for (int c = 0; c < MAX_PER_LANE; c++) {
            unsigned int d = lane + 32 * c;
            if (d < head_dim) part = __fmaf_rn(qv[c], kr[d], part);
        }
        float s = __fmul_rn(scale, warp_sum(part));
        if (bias) s = __fadd_rn(s, bias[((unsigned long long)h * lq + i) * lk + j]);
        if (mask) s = __fadd_rn(s, __fmul_rn(__fsub_rn(1.0f, mask[j]), masked_value));
        float new_max = fmaxf(run_max, s);
        float corr = edge_exp(__fsub_rn(run_max, new_max));
        float wgt = edge_exp(__fsub_rn(s, new_max));
        run_sum = __fadd_rn(__fmul_rn(run_sum, corr), wgt);
        const float* vr = kv_src + j * kv_stride + v_offset + (unsigned long long)h * head_dim;
        for (int c = 0; c < MAX_PER_LANE; c++) {
            unsigned int d = lane + 32 * c;
            if (d < head_dim) acc[c] = __fmaf_rn(wgt, vr[d], __fmul_rn(acc[c], corr));
        }
        run_max = new_max;
    }
    float* o = out + i * (unsigned long long)heads * head_dim + (unsigned long long)h * head_dim;
    for (int c = 0; c < MAX_PER_LANE; c++) {
        unsigned int d = lane + 32 * c;
        if (d < head_dim) o[d] = __fdiv_rn(acc[c], run_sum);
    }
}
