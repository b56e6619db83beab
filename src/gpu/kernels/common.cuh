// Shared device helpers, prepended to every kernel source before NVRTC
// compiles it (src/gpu/nvrtc.rs). No headers: NVRTC needs none of the
// toolkit for these kernels.

typedef unsigned char u8;
typedef unsigned int u32;

// One FP8 format, as the CPU codec describes it (src/fp8/mod.rs, Fp8Format).
struct Fp8Fmt {
    int m;             // mantissa bits
    int bias;          // exponent bias
    u32 max_code;      // largest finite magnitude code
    u32 nan_code;      // NaN magnitude code
    u32 overflow_code; // magnitude code of an overflow without saturation
};

__device__ __forceinline__ Fp8Fmt fmt_e4m3() { Fp8Fmt f = {3, 7, 0x7E, 0x7F, 0x7F}; return f; }
__device__ __forceinline__ Fp8Fmt fmt_e5m2() { Fp8Fmt f = {2, 15, 0x7B, 0x7E, 0x7C}; return f; }

// CPU twin: fp8::encode_scalar. The same integer operations on the f32 bit
// pattern (round to nearest even on the dropped mantissa bits), so every
// input gives the same code as the CPU.
__device__ __forceinline__ u8 fp8_encode(float x, Fp8Fmt f, bool saturate) {
    u32 bits = __float_as_uint(x);
    u32 sign = (bits >> 24) & 0x80u;
    u32 a = bits & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (u8)(sign | f.nan_code);
    u32 overflow = saturate ? f.max_code : f.overflow_code;
    if (a == 0x7F800000u) return (u8)(sign | overflow);
    int exp = (int)(a >> 23);
    if (exp == 0) return (u8)sign;
    int emin = 1 - f.bias;
    int e = exp - 127;
    u32 full = (a & 0x7FFFFFu) | 0x800000u;
    u32 shift = e >= emin ? (u32)(23 - f.m) : (u32)(23 - f.m + (emin - e));
    if (shift >= 25) return (u8)sign;
    u32 q = full >> shift;
    u32 rem = full & ((1u << shift) - 1u);
    u32 half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q += 1u;
    u32 code = e >= emin ? (((u32)(e + f.bias)) << f.m) + q - (1u << f.m) : q;
    if (code > f.max_code) return (u8)(sign | overflow);
    return (u8)(sign | code);
}

// CPU twin: fp8::decode_scalar. Every finite code is an exact f32 product
// of a small integer and a power of two, so the result is bit-identical.
__device__ __forceinline__ float fp8_decode(u8 code, Fp8Fmt f) {
    float sign = (code & 0x80u) ? -1.0f : 1.0f;
    u32 mag = code & 0x7Fu;
    u32 exp_field = mag >> f.m;
    u32 man = mag & ((1u << f.m) - 1u);
    u32 all_ones = (1u << (7 - f.m)) - 1u;
    if (f.m == 3 && mag == 0x7Fu) return copysignf(__int_as_float(0x7FC00000), sign);
    if (f.m == 2 && exp_field == all_ones) {
        return man == 0 ? sign * __int_as_float(0x7F800000)
                        : copysignf(__int_as_float(0x7FC00000), sign);
    }
    float v;
    if (exp_field == 0) {
        v = (float)man * __int_as_float((1 - f.bias - f.m + 127) << 23);
    } else {
        v = (float)((1u << f.m) | man) * __int_as_float(((int)exp_field - f.bias - f.m + 127) << 23);
    }
    return sign * v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

// The 4x4 register micro-tile of the tiled FMA GEMMs (int4_gemm,
// linear_*_gemm): acc[i][j] += xs[kk][ty*4+i] * ws[kk][tx*4+j] over the
// BK rows of the two shared-memory tiles (row length W).
template <int BK, int W>
__device__ __forceinline__ void tile_fma_4x4(const float (&xs)[BK][W], const float (&ws)[BK][W],
                                             int ty, int tx, float (&acc)[4][4]) {
#pragma unroll 8
    for (int kk = 0; kk < BK; ++kk) {
        float a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty * 4 + i];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx * 4 + j];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
}

// The tiled GEMMs' epilogue: writes thread (ty, tx)'s 4 x 4 accumulators of
// the 64 x 64 output tile at (row0, col0) of y [m, n] as out(acc, column),
// skipping the rows and columns past the edge.
template <typename Out>
__device__ __forceinline__ void store_tile_4x4(float* __restrict__ y, const float (&acc)[4][4],
                                               int row0, int col0, int ty, int tx, int m, int n,
                                               Out out) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int r = row0 + ty * 4 + i;
        if (r >= m) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int cc = col0 + tx * 4 + j;
            if (cc < n) y[(long long)r * n + cc] = out(acc[i][j], cc);
        }
    }
}
