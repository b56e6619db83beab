// Packed INT4 weights (src/int4/mod.rs layout): data[pair * N + o] holds
// rows 2*pair (low nibble) and 2*pair + 1 (high nibble) of column o as 4-bit
// two's complement; scales[g * N + o] for groups of `pairs_per_group` pairs.

// The 4-bit two's complement nibble at bit `shift` of `w` as an exact f32,
// without an int-to-float conversion (a quarter-rate instruction): with
// u = nibble ^ 8 (0..15), 2^23 + u is the float with u in its low mantissa
// bits, and subtracting 2^23 + 8 leaves u - 8, the signed value.
__device__ __forceinline__ float nib(u32 w, int shift) {
    u32 u = ((w >> shift) & 0xFu) ^ 0x8u;
    return __uint_as_float(0x4B000000u | u) - 8388616.0f;
}

// Four bytes of column block `c` in pair row `p`; byte loads where the row
// is not 4-byte aligned or the block runs past N.
__device__ __forceinline__ u32 load_word(const u8* __restrict__ data, long long row, int c, int n) {
    if ((n & 3) == 0 && c + 3 < n) {
        return __ldg((const u32*)(data + row + c));
    }
    u32 w = 0;
    for (int j = 0; j < 4; ++j) {
        if (c + j < n) w |= ((u32)__ldg(data + row + c + j)) << (8 * j);
    }
    return w;
}

#define MV_THREADS 64
#define MV_MAX_BATCH 8

// Eight pair rows [pc, pc + 8) of 4 columns into `part`. FULL: the rows
// are whole aligned words inside the weight and x, so the eight 32-bit reads
// (and the x reads) are unconditional and all issued before any math: the
// reads, not the decode, bound the matvec. Otherwise every read is guarded.
template <bool FULL>
__device__ __forceinline__ void matvec_chunk(const float* __restrict__ x,
                                             const u8* __restrict__ data,
                                             float (&part)[MV_MAX_BATCH][4], int pc, int p1,
                                             int c, int n, int in_feat, int batch) {
    u32 wv[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        if (FULL)
            wv[i] = __ldg((const u32*)(data + (long long)(pc + i) * n + c));
        else
            wv[i] = pc + i < p1 ? load_word(data, (long long)(pc + i) * n, c, n) : 0u;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int k = 2 * (pc + i);
#pragma unroll
        for (int b = 0; b < MV_MAX_BATCH; ++b) {
            if (b < batch) {
                const float* xb = x + (long long)b * in_feat;
                float x0 = FULL || k < in_feat ? __ldg(xb + k) : 0.0f;
                float x1 = FULL || k + 1 < in_feat ? __ldg(xb + k + 1) : 0.0f;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    part[b][j] = fmaf(x0, nib(wv[i], 8 * j), part[b][j]);
                    part[b][j] = fmaf(x1, nib(wv[i], 8 * j + 4), part[b][j]);
                }
            }
        }
    }
}
#define MV_COLS (MV_THREADS * 4)

// CPU twin: QuantizedWeight::matmul for batch 1-8 (src/int4/matvec.rs).
// y[b, o] = sum_g scale[g, o] * sum_{k in g} x[b, k] * q[k, o] (+ bias[o]).
// Each thread owns 4 adjacent columns (one coalesced 32-bit read per pair
// row, nibbles decoded in registers); grid.y splits the pairs into
// group-aligned ranges whose f32 partial sums the last block of a column
// tile adds in split order (deterministic). Contract: f32 accumulation;
// |y - y_cpu| <= 1e-5 * sum_k |x[b, k] * w[k, o]| + 1e-6.
extern "C" __global__ void int4_matvec(const float* __restrict__ x, const u8* __restrict__ data,
                                       const float* __restrict__ scales,
                                       const float* __restrict__ bias, float* __restrict__ y,
                                       float* __restrict__ partial, u32* __restrict__ counters,
                                       int batch, int in_feat, int n, int num_pairs,
                                       int pairs_per_group, int groups_per_split) {
    int c = (blockIdx.x * MV_THREADS + threadIdx.x) * 4;
    int g0 = blockIdx.y * groups_per_split;
    int g1 = min(g0 + groups_per_split, num_pairs / pairs_per_group);
    float acc[MV_MAX_BATCH][4];
#pragma unroll
    for (int b = 0; b < MV_MAX_BATCH; ++b)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[b][j] = 0.0f;
    // Whole 32-bit words (rows 4-byte aligned, all 4 columns inside).
    const bool aligned = (n & 3) == 0 && c + 3 < n;
    if (c < n) {
        for (int g = g0; g < g1; ++g) {
            float part[MV_MAX_BATCH][4];
#pragma unroll
            for (int b = 0; b < MV_MAX_BATCH; ++b)
#pragma unroll
                for (int j = 0; j < 4; ++j) part[b][j] = 0.0f;
            int p0 = g * pairs_per_group, p1 = p0 + pairs_per_group;
            // Eight 32-bit reads in flight per thread before any math: the
            // loads, not the decode, bound this kernel.
            for (int pc = p0; pc < p1; pc += 8) {
                if (aligned && pc + 8 <= p1 && 2 * (pc + 8) <= in_feat)
                    matvec_chunk<true>(x, data, part, pc, p1, c, n, in_feat, batch);
                else
                    matvec_chunk<false>(x, data, part, pc, p1, c, n, in_feat, batch);
            }
            float s[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) s[j] = c + j < n ? __ldg(scales + (long long)g * n + c + j) : 0.0f;
#pragma unroll
            for (int b = 0; b < MV_MAX_BATCH; ++b)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[b][j] = fmaf(part[b][j], s[j], acc[b][j]);
        }
    }
    if (gridDim.y == 1) {
        for (int b = 0; b < batch; ++b)
            for (int j = 0; j < 4; ++j)
                if (c + j < n) y[(long long)b * n + c + j] = acc[b][j] + (bias ? bias[c + j] : 0.0f);
        return;
    }
    for (int b = 0; b < batch; ++b)
        for (int j = 0; j < 4; ++j)
            if (c + j < n) partial[((long long)blockIdx.y * batch + b) * n + c + j] = acc[b][j];
    __threadfence();
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counters + blockIdx.x, 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    // Split order is fixed (deterministic); the unrolled loop keeps many
    // independent L2 reads in flight (the splits' partials are in L2).
    for (int b = 0; b < batch; ++b) {
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 8
        for (int sp = 0; sp < (int)gridDim.y; ++sp) {
            const float* row = partial + ((long long)sp * batch + b) * n + c;
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (c + j < n) v[j] += __ldcg(row + j);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (c + j < n) y[(long long)b * n + c + j] = v[j] + (bias ? bias[c + j] : 0.0f);
    }
    if (threadIdx.x == 0) counters[blockIdx.x] = 0;  // ready for the next call
}

#define GM_BM 64
#define GM_BN 64
#define GM_BK 32

// CPU twin: QuantizedWeight::matmul for batch >= 16 (src/int4/gemm.rs).
// A tiled FMA GEMM: each 32-row by 64-column weight tile is read once
// (coalesced 32-bit words), dequantized (q * scale, exact as on the CPU)
// into shared memory and used by a 64 x 64 output tile, 4 x 4 per thread.
// Contract: f32 accumulation; the same bound as int4_matvec.
extern "C" __global__ void __launch_bounds__(256) int4_gemm(
    const float* __restrict__ x, const u8* __restrict__ data, const float* __restrict__ scales,
    const float* __restrict__ bias, float* __restrict__ y, int m, int in_feat, int n,
    int num_pairs, int pairs_per_group) {
    __shared__ float xs[GM_BK][GM_BM + 4];
    __shared__ float ws[GM_BK][GM_BN + 4];
    int t = threadIdx.x, tx = t % 16, ty = t / 16;
    int row0 = blockIdx.y * GM_BM, col0 = blockIdx.x * GM_BN;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < 2 * num_pairs; k0 += GM_BK) {
        // x tile: 64 rows x 32 k, 8 per thread (k fastest: coalesced).
        for (int i = t; i < GM_BM * GM_BK; i += 256) {
            int r = i / GM_BK, kk = i % GM_BK;
            int gr = row0 + r, gk = k0 + kk;
            xs[kk][r] = (gr < m && gk < in_feat) ? x[(long long)gr * in_feat + gk] : 0.0f;
        }
        // weight tile: 16 pair rows x 64 columns = one 32-bit word per thread.
        {
            int pr = t / 16, cw = (t % 16) * 4;
            int p = k0 / 2 + pr, gc = col0 + cw;
            u32 w = (p < num_pairs && gc < n) ? load_word(data, (long long)p * n, gc, n) : 0u;
            int g = p / pairs_per_group;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float s = (p < num_pairs && gc + j < n) ? __ldg(scales + (long long)g * n + gc + j) : 0.0f;
                ws[2 * pr][cw + j] = nib(w, 8 * j) * s;
                ws[2 * pr + 1][cw + j] = nib(w, 8 * j + 4) * s;
            }
        }
        __syncthreads();
        tile_fma_4x4<GM_BK, GM_BM + 4>(xs, ws, ty, tx, acc);
        __syncthreads();
    }
    store_tile_4x4(y, acc, row0, col0, ty, tx, m, n,
                   [&](float a, int cc) { return a + (bias ? bias[cc] : 0.0f); });
}
