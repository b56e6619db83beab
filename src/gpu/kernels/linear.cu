// Linear layers with a row-major weight [N, K] (torch.nn.Linear layout):
// UnquantLinear (f32), Int8Linear (int8 + per-row scale) and
// PerTensorFP8Linear (E4M3 codes + one multiplier). Int4Linear runs on
// int4.cu. y[m, o] = (sum_k x[m, k] * w(o, k)) * row_scale(o) * mult + bias[o].

#define KIND_F32 0
#define KIND_I8 1
#define KIND_FP8 2

template <int KIND>
__device__ __forceinline__ float weight_at(const void* __restrict__ w, long long i) {
    if (KIND == KIND_F32) return __ldg((const float*)w + i);
    if (KIND == KIND_I8) return (float)__ldg((const signed char*)w + i);
    return fp8_decode(__ldg((const u8*)w + i), fmt_e4m3());
}

#define DOT_MAX_BATCH 8
#define DOT_WARPS 4

// CPU twins: the batch 1-8 path of UnquantLinear / Int8Linear /
// PerTensorFP8Linear forward (src/linear/kernels.rs, matmul_rows). One warp
// per output row: the row of w is read once, coalesced (FP8 codes decoded
// in registers: the fused decode-dot), against every x row; warp-shuffle
// sum. Contract: f32 accumulation; |y - y_cpu| <= 1e-5 * sum_k |x w| + 1e-6.
template <int KIND>
__device__ void linear_dot(const float* __restrict__ x, const void* __restrict__ w,
                           const float* __restrict__ row_scale, float mult,
                           const float* __restrict__ bias, float* __restrict__ y, int m, int n,
                           int k) {
    int o = blockIdx.x * DOT_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (o >= n) return;
    float acc[DOT_MAX_BATCH];
#pragma unroll
    for (int b = 0; b < DOT_MAX_BATCH; ++b) acc[b] = 0.0f;
    const long long base = (long long)o * k;
    for (int kk = lane; kk < k; kk += 32) {
        float wv = weight_at<KIND>(w, base + kk);
#pragma unroll
        for (int b = 0; b < DOT_MAX_BATCH; ++b)
            if (b < m) acc[b] = fmaf(__ldg(x + (long long)b * k + kk), wv, acc[b]);
    }
    float s = (row_scale ? row_scale[o] : 1.0f) * mult;
#pragma unroll
    for (int b = 0; b < DOT_MAX_BATCH; ++b) {
        if (b >= m) break;
        float v = warp_sum(acc[b]);
        if (lane == 0) y[(long long)b * n + o] = v * s + (bias ? bias[o] : 0.0f);
    }
}

#define LG_BM 64
#define LG_BN 64
#define LG_BK 32

// CPU twins: the batch >= 16 path of the same layers. A tiled FMA GEMM:
// 64 x 32 tiles of x and of w (decoded to f32 in shared memory: the
// dequantize-tile path), a 64 x 64 output tile, 4 x 4 per thread.
// Contract: as linear_dot.
template <int KIND>
__device__ void linear_gemm(const float* __restrict__ x, const void* __restrict__ w,
                            const float* __restrict__ row_scale, float mult,
                            const float* __restrict__ bias, float* __restrict__ y, int m, int n,
                            int k) {
    __shared__ float xs[LG_BK][LG_BM + 4];
    __shared__ float ws[LG_BK][LG_BN + 4];
    int t = threadIdx.x, tx = t % 16, ty = t / 16;
    int row0 = blockIdx.y * LG_BM, col0 = blockIdx.x * LG_BN;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < k; k0 += LG_BK) {
        for (int i = t; i < LG_BM * LG_BK; i += 256) {
            int r = i / LG_BK, kk = i % LG_BK;
            int gr = row0 + r, gk = k0 + kk;
            xs[kk][r] = (gr < m && gk < k) ? x[(long long)gr * k + gk] : 0.0f;
            int gc = col0 + r;
            ws[kk][r] = (gc < n && gk < k) ? weight_at<KIND>(w, (long long)gc * k + gk) : 0.0f;
        }
        __syncthreads();
        tile_fma_4x4<LG_BK, LG_BM + 4>(xs, ws, ty, tx, acc);
        __syncthreads();
    }
    store_tile_4x4(y, acc, row0, col0, ty, tx, m, n, [&](float a, int cc) {
        float s = (row_scale ? row_scale[cc] : 1.0f) * mult;
        return a * s + (bias ? bias[cc] : 0.0f);
    });
}

#define LINEAR_ENTRY(NAME, KIND)                                                               \
    extern "C" __global__ void __launch_bounds__(DOT_WARPS * 32)                              \
        NAME##_dot(const float* x, const void* w, const float* rs, float mult, const float* b, \
                   float* y, int m, int n, int k) {                                            \
        linear_dot<KIND>(x, w, rs, mult, b, y, m, n, k);                                       \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                         \
        NAME##_gemm(const float* x, const void* w, const float* rs, float mult, const float* b, \
                    float* y, int m, int n, int k) {                                           \
        linear_gemm<KIND>(x, w, rs, mult, b, y, m, n, k);                                      \
    }

LINEAR_ENTRY(linear_f32, KIND_F32)
LINEAR_ENTRY(linear_i8, KIND_I8)
LINEAR_ENTRY(linear_fp8, KIND_FP8)

// y[r, o] += bias[o] for the cuBLASLt path (whose f32 output takes no f32
// bias epilogue with E4M3 inputs). Exact: one f32 addition, as on the CPU.
extern "C" __global__ void add_bias(float* __restrict__ y, const float* __restrict__ bias,
                                    unsigned long long rows, int n) {
    unsigned long long total = rows * (unsigned long long)n;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < total;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        y[i] += bias[i % n];
    }
}
