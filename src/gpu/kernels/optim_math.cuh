// The per-element leaves of the 4-bit Adam step (kernels/optim.cu), each
// the twin of a CPU function named beside it, bit for bit. Prepended to
// optim.cu (src/gpu/nvrtc.rs) and included by the host test's build.

typedef unsigned long long u64;

#define ADAM_GROUP_BLOCKS 256

// CPU twin: optim::format::StepConsts (computed on the host by that code).
struct AdamConsts {
    float b1, b2, omb1, omb2, inv_sqrt_bc2, eps, step_size, lr_wd, l2;
};

// CPU twin: dither::splitmix64.
__device__ __forceinline__ u64 splitmix64(u64 z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// CPU twin: Dither::new + Dither::uniform (24-bit uniform in [0, 1)).
__device__ __forceinline__ float dither_uniform(u64 t, u64 numel, u64 group, int i) {
    u64 key = splitmix64((t * 0x9E3779B97F4A7C15ull) ^ numel);
    u64 z = splitmix64(key ^ (group * (u64)ADAM_GROUP_BLOCKS + (u64)i));
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

// CPU twin: scales::scalar::exp2_neg (degree-6 Taylor polynomial of 2^f).
__device__ __forceinline__ float exp2_neg(float y) {
    int t = (int)(0.5f - y);
    if (t > 126) t = 126;
    float f = y + (float)t;
    const float c0 = 0.6931471805599453f, c1 = 0.2402265f, c2 = 0.05550411f,
                c3 = 0.009618129f, c4 = 0.001333356f, c5 = 0.0001540353f;
    float p = 1.0f + f * (c0 + f * (c1 + f * (c2 + f * (c3 + f * (c4 + f * c5)))));
    return p * __uint_as_float(((u32)(127 - t)) << 23);
}

// CPU twin: scales::scalar::log2_det (IEEE double operations only, rounded
// to f32 once), for a positive finite r.
__device__ __forceinline__ float log2_det(float r) {
    u32 bits = __float_as_uint(r);
    int e = (int)((bits >> 23) & 0xFFu);
    double m;
    if (e == 0) {
        // Subnormal: the mantissa as an integer times 2^-149.
        double mant = (double)(bits & 0x7FFFFFu);
        int k = 0;
        while (mant >= 2.0) { mant *= 0.5; ++k; }
        m = mant;
        e = k - 149;
    } else {
        m = 1.0 + (double)(bits & 0x7FFFFFu) * (1.0 / 8388608.0);
        e -= 127;
    }
    if (m > 1.4142135623730951) { m *= 0.5; e += 1; }
    double z = (m - 1.0) / (m + 1.0);
    double z2 = z * z;
    double s = 2.0 / 19.0;
    s = 2.0 / 17.0 + z2 * s;
    s = 2.0 / 15.0 + z2 * s;
    s = 2.0 / 13.0 + z2 * s;
    s = 2.0 / 11.0 + z2 * s;
    s = 2.0 / 9.0 + z2 * s;
    s = 2.0 / 7.0 + z2 * s;
    s = 2.0 / 5.0 + z2 * s;
    s = 2.0 / 3.0 + z2 * s;
    s = 2.0 + z2 * s;
    double ln_m = z * s;
    return (float)((double)e + ln_m * 1.4426950408889634);
}

// CPU twin: Codebook16::encode (ties to the lower code).
__device__ __forceinline__ u32 encode16(float x, const float* mids) {
    u32 idx = (x > mids[7]) ? 8u : 0u;
    idx += (x > mids[idx + 3]) ? 4u : 0u;
    idx += (x > mids[idx + 1]) ? 2u : 0u;
    idx += (x > mids[idx]) ? 1u : 0u;
    return idx;
}

// CPU twin: Codebook256::encode.
__device__ __forceinline__ u32 encode256(float x, const float* mids) {
    u32 idx = 0;
    for (int shift = 7; shift >= 0; --shift) {
        idx += (x > mids[idx + (1u << shift) - 1u]) ? (1u << shift) : 0u;
    }
    return idx;
}

// CPU twin: StepConsts::element. Returns the new weight; m, v, sqrt(v) out.
__device__ __forceinline__ float adam_element(const AdamConsts& k, float w, float g, float m_hat,
                                              float v_hat, float* m, float* v, float* r) {
    float gp = g + k.l2 * w;
    *m = k.b1 * m_hat + k.omb1 * gp;
    *v = k.b2 * v_hat + k.omb2 * (gp * gp);
    *r = sqrtf(*v);
    float denom = *r * k.inv_sqrt_bc2 + k.eps;
    return (w - k.lr_wd * w) - (k.step_size * *m) / denom;
}

// CPU twin: Clamp::apply.
__device__ __forceinline__ float clamp_scale(float s, float lo, float hi) {
    if (!(s > 0.0f)) return 0.0f;
    if (s < lo) s = lo;
    if (s > hi) s = hi;
    return s;
}

// CPU twin: format::inv.
__device__ __forceinline__ float inv_scale(float s) { return s > 0.0f ? 1.0f / s : 0.0f; }

__device__ __forceinline__ u32 nibble_at(const u8* codes, u64 e) {
    return (codes[e >> 1] >> ((e & 1) * 4)) & 15u;
}

// The largest c <= 254 with t[c] >= x (t non-increasing, t[0] >= x > 0):
// the answer of scales::scalar::search_from whatever its guess.
__device__ __forceinline__ int dq_search(const float* t, float x) {
    int lo = 0, hi = 254;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (t[mid] >= x) lo = mid; else hi = mid - 1;
    }
    return lo;
}
