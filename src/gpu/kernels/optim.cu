// The fused 4-bit Adam / AdamW step (AdamW4bit, Adam4bit) on a device
// (after optim_math.cuh, its per-element leaves).
//
// CPU twin: the scalar step of src/optim (format.rs: element math, code
// books, nibble layout; scales/scalar.rs: double-quantized block scales,
// polynomial exp2, deterministic log2; dither.rs: unbiased rounding of v's
// scales; state.rs: the group walk and rank-1 statistics).
// Accuracy contract: bit-identical to the CPU step (weights, codes, scales,
// group pairs). How each source of difference is removed (docs/gpu.md):
// compiled with --fmad=false (no contraction, as Rust never contracts);
// IEEE division and square root (NVRTC's defaults, no fast math); the same
// operations in the same order; order-independent reductions only (max and
// min of non-negative finite floats); the same exp2 polynomial, log2 series
// and splitmix64 hash; the code books' values and midpoints are the CPU's
// own tables, copied to the device.
//
// One CUDA block of 256 threads per group of 256 quantization blocks. The
// group is walked twice: pass 1 finds each block's new absmax (nothing is
// written), the group's scales are encoded, and pass 2 recomputes the same
// element math, writes the weight and encodes m and v. Each thread owns
// whole bytes (pairs of elements), so nibble writes never race.
//
// The step is a sequence of phases separated by __syncthreads(); each phase
// is a per-thread function (`adam_phase`), so the host test
// (src/gpu/host_math.rs) runs the very same code with g++ by calling each
// phase for every thread in turn.

#define ADAM_THREADS 256
#define ADAM_ZERO_CODE 255
// Offsets of the code book tables (floats) in `tables`.
#define TAB_M_VALUES 0
#define TAB_M_MIDS 256
#define TAB_V_VALUES 512
#define TAB_V_MIDS 528
#define TAB_LEN 544

// One parameter's step. Pointers are device addresses (host addresses in
// the host test). Scales: per block f32 (`double_quant == 0`), else one
// code per block plus (max, log2 step) per group. Rank-1 v: `rows_old` /
// `cols_old` the statistics in the state, `rows_new` / `cols_new` the
// ones of this step (computed by adam_rank1_*).
struct AdamArgs {
    u64 numel;
    u64 t;  // the step being taken, 1-based (seeds v's scale rounding)
    u64 cols;  // rank-1: columns of the matrix
    float* w;
    const float* g;
    u8* m_codes;
    u8* v_codes;
    float* m_scales;
    u8* m_scale_codes;
    float* m_groups;
    float* v_scales;
    u8* v_scale_codes;
    float* v_groups;
    const float* rows_old;
    const float* cols_old;
    float* rows_new;
    float* cols_new;
    const float* tables;
    AdamConsts k;
    float m_lo, m_hi, u_lo, u_hi;
    int block_size;
    int m_bits;
    int sqrt_domain;
    int double_quant;
    int rank1;
};

struct AdamShared {
    float m_scale[ADAM_GROUP_BLOCKS];  // old decoded scales
    float v_scale[ADAM_GROUP_BLOCKS];
    u32 m_absmax[ADAM_GROUP_BLOCKS];  // float bits of non-negative values
    u32 u_max[ADAM_GROUP_BLOCKS];
    float m_new[ADAM_GROUP_BLOCKS];  // clamped, then decoded new scales
    float v_new[ADAM_GROUP_BLOCKS];
    float v_orig[ADAM_GROUP_BLOCKS];  // clamped before rounding (dither)
    float m_inv[ADAM_GROUP_BLOCKS];
    float v_inv[ADAM_GROUP_BLOCKS];
    float tm[256];  // double-quantization tables
    float tv[256];
    float m_pair[2];  // new (max, step) of the group
    float v_pair[2];
};

// ---- per-element pieces of both passes ----

struct Elem {
    float w, m, u;
};

// The element math of element e (of block b, `base` its group's first
// element) from the state before the step.
__device__ __forceinline__ Elem adam_elem(const AdamArgs& a, const AdamShared& sh, u64 base,
                                          int b, u64 e) {
    const float* tab = a.tables;
    u64 ge = base + e;
    u32 mc = a.m_bits == 8 ? (u32)a.m_codes[ge] : nibble_at(a.m_codes, ge);
    float m_hat = tab[TAB_M_VALUES + mc] * sh.m_scale[b];
    float vs;
    if (a.rank1) {
        float ro = a.rows_old[ge / a.cols], co = a.cols_old[ge % a.cols];
        vs = fminf(ro, co);
    } else {
        vs = sh.v_scale[b];
    }
    float vh = tab[TAB_V_VALUES + nibble_at(a.v_codes, ge)] * vs;
    if (a.sqrt_domain) vh = vh * vh;
    Elem out;
    float v, r;
    out.w = adam_element(a.k, a.w[ge], a.g[ge], m_hat, vh, &out.m, &v, &r);
    out.u = a.sqrt_domain ? r : v;
    return out;
}

// The 4-bit v code of element e after the step.
__device__ __forceinline__ u32 adam_v_code(const AdamArgs& a, const AdamShared& sh, u64 ge, int b,
                                           float u) {
    float vi;
    if (a.rank1) {
        vi = inv_scale(fminf(a.rows_new[ge / a.cols], a.cols_new[ge % a.cols]));
    } else {
        vi = sh.v_inv[b];
    }
    return encode16(u * vi, a.tables + TAB_V_MIDS);
}

__device__ __forceinline__ u32 adam_m_code(const AdamArgs& a, const AdamShared& sh, int b, float m) {
    float x = m * sh.m_inv[b];
    return a.m_bits == 8 ? encode256(x, a.tables + TAB_M_MIDS)
                         : encode16(x, a.tables + TAB_M_MIDS);
}

// ---- the group's scales ----

// Raw table entry c of a group (CPU twin: scales::scalar::fill_table).
__device__ __forceinline__ float dq_raw(float max, float step, int c) {
    return max * exp2_neg((float)c * step);
}

// t[0] = max, running minimum, t[255] = 0 (CPU twin: table_with).
__device__ __forceinline__ void dq_finish_table(float* t, float max) {
    t[0] = max;
    for (int c = 1; c < 255; ++c) t[c] = fminf(t[c], t[c - 1]);
    t[ADAM_ZERO_CODE] = 0.0f;
}

// (max, log2 step) of the clamped scales s[0..nb) (CPU twin: the head of
// scales::scalar::encode_with_table and log2_step).
__device__ __forceinline__ void dq_pair(const float* s, int nb, float* pair) {
    float max = 0.0f, min = __uint_as_float(0x7F800000u);
    for (int i = 0; i < nb; ++i) {
        max = fmaxf(max, s[i]);
        if (s[i] > 0.0f) min = fminf(min, s[i]);
    }
    float step = 0.0f;
    if (max != 0.0f && min < max) step = fmaxf(log2_det(min / max) / 254.0f, -1.0f);
    pair[0] = max;
    pair[1] = step;
}

// How many elements group `gi` holds and its first element.
__device__ __forceinline__ u64 group_len(const AdamArgs& a, u64 gi, u64* base) {
    u64 ge = (u64)ADAM_GROUP_BLOCKS * (u64)a.block_size;
    *base = gi * ge;
    u64 left = a.numel - *base;
    return left < ge ? left : ge;
}

#define ADAM_PHASES 9

// Phase `ph` of group `gi` for thread `tid`. Phases are separated by a
// barrier; within a phase threads touch disjoint data or combine with
// order-independent atomic maxima.
__device__ __forceinline__ void adam_phase(int ph, const AdamArgs& a, AdamShared& sh, u64 gi,
                                           int tid) {
    u64 base;
    u64 n = group_len(a, gi, &base);
    int bs = a.block_size;
    int nb = (int)((n + (u64)bs - 1) / (u64)bs);
    u64 gb = gi * (u64)ADAM_GROUP_BLOCKS;  // first block of the group
    bool v_block = !a.rank1;
    switch (ph) {
    case 0:  // old tables (double quantization), zeroed maxima
        sh.m_absmax[tid] = 0u;
        sh.u_max[tid] = 0u;
        if (a.double_quant && tid < 255) {
            sh.tm[tid] = dq_raw(a.m_groups[2 * gi], a.m_groups[2 * gi + 1], tid);
            if (v_block) sh.tv[tid] = dq_raw(a.v_groups[2 * gi], a.v_groups[2 * gi + 1], tid);
        }
        break;
    case 1:  // finish the old tables
        if (a.double_quant && tid == 0) dq_finish_table(sh.tm, a.m_groups[2 * gi]);
        if (a.double_quant && v_block && tid == 1) dq_finish_table(sh.tv, a.v_groups[2 * gi]);
        break;
    case 2:  // decode the old scales
        if (tid < nb) {
            sh.m_scale[tid] = a.double_quant ? sh.tm[a.m_scale_codes[gb + tid]] : a.m_scales[gb + tid];
            if (v_block) {
                sh.v_scale[tid] =
                    a.double_quant ? sh.tv[a.v_scale_codes[gb + tid]] : a.v_scales[gb + tid];
            }
        }
        break;
    case 3: {  // pass 1: each block's absmax of m and max of u
        u64 pairs = (n + 1) / 2;
        for (u64 p = (u64)tid; p < pairs; p += ADAM_THREADS) {
            for (u64 e = 2 * p; e < 2 * p + 2 && e < n; ++e) {
                int b = (int)(e / (u64)bs);
                Elem x = adam_elem(a, sh, base, b, e);
                atomicMax(&sh.m_absmax[b], __float_as_uint(fabsf(x.m)));
                atomicMax(&sh.u_max[b], __float_as_uint(x.u));
            }
        }
        break;
    }
    case 4:  // clamp the new scales
        if (tid < nb) {
            sh.m_new[tid] = clamp_scale(__uint_as_float(sh.m_absmax[tid]), a.m_lo, a.m_hi);
            float v = clamp_scale(__uint_as_float(sh.u_max[tid]), a.u_lo, a.u_hi);
            sh.v_new[tid] = v;
            sh.v_orig[tid] = v;
        }
        break;
    case 5:  // the group pairs (one thread per moment)
        if (a.double_quant && tid == 0) dq_pair(sh.m_new, nb, sh.m_pair);
        if (a.double_quant && v_block && tid == 1) dq_pair(sh.v_new, nb, sh.v_pair);
        break;
    case 6:  // new tables
        if (a.double_quant && tid < 255) {
            sh.tm[tid] = dq_raw(sh.m_pair[0], sh.m_pair[1], tid);
            if (v_block) sh.tv[tid] = dq_raw(sh.v_pair[0], sh.v_pair[1], tid);
        }
        break;
    case 7:  // finish them; store the pairs
        if (a.double_quant && tid == 0) {
            dq_finish_table(sh.tm, sh.m_pair[0]);
            if (sh.m_pair[0] == 0.0f) for (int c = 0; c < 256; ++c) sh.tm[c] = 0.0f;
            a.m_groups[2 * gi] = sh.m_pair[0];
            a.m_groups[2 * gi + 1] = sh.m_pair[1];
        }
        if (a.double_quant && v_block && tid == 1) {
            dq_finish_table(sh.tv, sh.v_pair[0]);
            if (sh.v_pair[0] == 0.0f) for (int c = 0; c < 256; ++c) sh.tv[c] = 0.0f;
            a.v_groups[2 * gi] = sh.v_pair[0];
            a.v_groups[2 * gi + 1] = sh.v_pair[1];
        }
        break;
    case 8:  // encode block scales (v rounded without bias), inverses
        if (tid < nb) {
            float ms = sh.m_new[tid];
            if (a.double_quant) {
                int c = ms == 0.0f ? ADAM_ZERO_CODE : dq_search(sh.tm, ms);
                a.m_scale_codes[gb + tid] = (u8)c;
                ms = sh.tm[c];
            } else {
                a.m_scales[gb + tid] = ms;
            }
            sh.m_inv[tid] = inv_scale(ms);
            if (v_block) {
                float x = sh.v_orig[tid];
                float vs = x;
                if (a.double_quant) {
                    int c = x == 0.0f ? ADAM_ZERO_CODE : dq_search(sh.tv, x);
                    vs = sh.tv[c];
                    if (c < 254) {
                        float hi = sh.tv[c], lo = sh.tv[c + 1];
                        float gap = hi - lo;
                        if (gap > 0.0f && dither_uniform(a.t, a.numel, gi, tid) * gap < hi - x) {
                            c += 1;
                            vs = lo;
                        }
                    }
                    a.v_scale_codes[gb + tid] = (u8)c;
                } else {
                    a.v_scales[gb + tid] = vs;
                }
                sh.v_inv[tid] = inv_scale(vs);
            }
        }
        break;
    }
}

// Pass 2 for thread `tid` (after every phase): the same element math again,
// the new weight written, m and v encoded, one byte pair per iteration.
__device__ __forceinline__ void adam_pass2(const AdamArgs& a, const AdamShared& sh, u64 gi, int tid) {
    u64 base;
    u64 n = group_len(a, gi, &base);
    int bs = a.block_size;
    u64 pairs = (n + 1) / 2;
    for (u64 p = (u64)tid; p < pairs; p += ADAM_THREADS) {
        u32 mc[2], vc[2];
        float wn[2];
        u64 cnt = (2 * p + 2 <= n) ? 2 : 1;
        for (u64 j = 0; j < cnt; ++j) {
            u64 e = 2 * p + j;
            int b = (int)(e / (u64)bs);
            Elem x = adam_elem(a, sh, base, b, e);
            wn[j] = x.w;
            mc[j] = adam_m_code(a, sh, b, x.m);
            vc[j] = adam_v_code(a, sh, base + e, b, x.u);
        }
        // Every read of this pair is done: now write.
        u64 ge = base + 2 * p;
        u64 byte = ge >> 1;  // groups and blocks start on even elements
        for (u64 j = 0; j < cnt; ++j) a.w[ge + j] = wn[j];
        if (a.m_bits == 8) {
            for (u64 j = 0; j < cnt; ++j) a.m_codes[ge + j] = (u8)mc[j];
        } else {
            u32 hi = cnt == 2 ? mc[1] : (a.m_codes[byte] >> 4);
            a.m_codes[byte] = (u8)(mc[0] | (hi << 4));
        }
        u32 vhi = cnt == 2 ? vc[1] : (a.v_codes[byte] >> 4);
        a.v_codes[byte] = (u8)(vc[0] | (vhi << 4));
    }
}

// Rank-1 statistics, element e: the new u folded into its row's and
// column's maximum (`rows_new` / `cols_new` zeroed first; CPU twin:
// state::rank1_stats).
__device__ __forceinline__ void adam_rank1_elem(const AdamArgs& a, u64 e) {
    u64 i = e / a.cols, j = e % a.cols;
    float vh = a.tables[TAB_V_VALUES + nibble_at(a.v_codes, e)] * fminf(a.rows_old[i], a.cols_old[j]);
    if (a.sqrt_domain) vh = vh * vh;
    float m, v, r;
    adam_element(a.k, a.w[e], a.g[e], 0.0f, vh, &m, &v, &r);
    u32 u = __float_as_uint(a.sqrt_domain ? r : v);
    atomicMax((u32*)&a.rows_new[i], u);
    atomicMax((u32*)&a.cols_new[j], u);
}

extern "C" __global__ void adam4bit_step(AdamArgs a) {
    __shared__ AdamShared sh;
    u64 gi = blockIdx.x;
    int tid = threadIdx.x;
    for (int ph = 0; ph < ADAM_PHASES; ++ph) {
        adam_phase(ph, a, sh, gi, tid);
        __syncthreads();
    }
    adam_pass2(a, sh, gi, tid);
}

extern "C" __global__ void adam4bit_rank1_stats(AdamArgs a) {
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < a.numel;
         e += (u64)gridDim.x * blockDim.x) {
        adam_rank1_elem(a, e);
    }
}

// Clamp the n new statistics in place (CPU twin: the end of rank1_stats).
extern "C" __global__ void adam4bit_rank1_clamp(float* x, u64 n, float lo, float hi) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = clamp_scale(x[i], lo, hi);
}

// Sets *flag to 1 when any of the n values is not finite.
extern "C" __global__ void all_finite_f32(const float* x, u64 n, u32* flag) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        if (!isfinite(x[i])) atomicOr(flag, 1u);
    }
}

// Gradient accumulation: s += g (CPU twin: Adam4bitCore::accumulate_grad).
extern "C" __global__ void accum_add_f32(float* s, const float* g, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        s[i] = s[i] + g[i];
    }
}

// The mean of an accumulated gradient: out = s / d (CPU twin:
// apply_accumulated_grads).
extern "C" __global__ void accum_mean_f32(const float* s, float* out, u64 n, float d) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        out[i] = s[i] / d;
    }
}
