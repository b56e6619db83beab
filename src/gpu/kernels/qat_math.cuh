// The per-element leaves of the QAT step (kernels/qat.cu), each the twin
// of a CPU function named beside it, bit for bit. Prepended to qat.cu
// (src/gpu/nvrtc.rs) and included by the host test's build
// (src/gpu/host_test/qat_harness.cpp). Needs common.cuh (the FP8 codec).

typedef unsigned long long u64;

#define QAT_GOLDEN 0x9E3779B97F4A7C15ull

// CPU twin: qat::rng::mix64 (SplitMix64's output function).
__device__ __forceinline__ u64 qat_mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// CPU twin: qat::rng::uniform (53 random bits; both conversions are exact).
__device__ __forceinline__ double qat_uniform(u64 key, u64 index) {
    u64 bits = qat_mix64(key + (index + 1ull) * QAT_GOLDEN);
    return (double)(bits >> 11) * (1.0 / 9007199254740992.0);
}

// CPU twin: fake::round_even. 1.5 * 2^52 rounds |y| < 2^51 to an integer
// with the FPU's ties-to-even; copysign keeps the sign of a zero result.
__device__ __forceinline__ double qat_round_even(double y) {
    const double magic = 6755399441055744.0;
    return copysign((y + magic) - magic, y);
}

// CPU twin: fake::IntGrid (scale, zero point and code range as f64).
struct QatGrid {
    double scale, zp, lo, hi;
};

// CPU twin: IntGrid::code; `sto` selects stochastic rounding with draw u.
__device__ __forceinline__ double qat_code(const QatGrid& g, double x, bool sto, double u) {
    double y = x / g.scale + g.zp;
    y = y < g.lo ? g.lo : (y > g.hi ? g.hi : y);
    double r = qat_round_even(y);
    if (!sto) return r;
    double fl = r > y ? r - 1.0 : r;
    return u < y - fl ? fl + 1.0 : fl;
}

// CPU twin: IntGrid::fake.
__device__ __forceinline__ double qat_fake_int(const QatGrid& g, double x, bool sto, double u) {
    return (qat_code(g, x, sto, u) - g.zp) * g.scale;
}

// CPU twin: element::f64_to_f32_odd (truncate, then set the last bit if
// inexact), so that the FP8 rounding of the f32 is the f64's.
__device__ __forceinline__ float qat_f32_odd(double x) {
    float f = (float)x;
    double back = (double)f;
    if (back == x || isnan(x)) return f;
    u32 bits = __float_as_uint(f);
    u32 t = fabs(back) > fabs(x) ? bits - 1u : bits;
    return __uint_as_float(t | 1u);
}

// CPU twin: fp8::round_to_grid_scalar(x, fmt, saturate = true).
__device__ __forceinline__ float qat_fp8_nearest(float x, Fp8Fmt f) {
    return fp8_decode(fp8_encode(x, f, true), f);
}

// CPU twin: fake::fp8_stochastic (`maxv`: the format's largest finite value).
__device__ __forceinline__ double qat_fp8_stochastic(double x, Fp8Fmt f, double maxv, double u) {
    if (isnan(x)) return x;
    if (fabs(x) >= maxv) return copysign(maxv, x);
    double near_ = (double)qat_fp8_nearest(qat_f32_odd(x), f);
    if (near_ == x) return near_;
    // The other neighbour, one code further from or closer to zero.
    u32 code = fp8_encode((float)fabs(near_), f, true);
    u32 other_code = fabs(near_) < fabs(x) ? code + 1u : code - 1u;
    double other = copysign((double)fp8_decode((u8)other_code, f), x);
    double lo = near_ < other ? near_ : other;
    double hi = near_ < other ? other : near_;
    return u < (x - lo) / (hi - lo) ? hi : lo;
}

// The master precision's square root (IEEE: NVRTC's default -prec-sqrt).
__device__ __forceinline__ float qat_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double qat_sqrt(double x) { return sqrt(x); }

// CPU twin: format::Coef (computed on the host by that code).
template <class T> struct QatCoef {
    T lr, lrwd, b1, b2, omb1, omb2, bc1, bc2, eps;
};

// CPU twin: format::adamw, PyTorch's order: decoupled decay on the old
// weight, then the bias-corrected Adam step. Updates m and v.
template <class T>
__device__ __forceinline__ T qat_adamw(const QatCoef<T>& c, T w, T g, T* m, T* v) {
    T nm = c.b1 * *m + c.omb1 * g;
    T nv = c.b2 * *v + c.omb2 * (g * g);
    T wd = w - c.lrwd * w;
    T mhat = nm / c.bc1;
    T vhat = nv / c.bc2;
    *m = nm;
    *v = nv;
    return wd - c.lr * mhat / (qat_sqrt(vhat) + c.eps);
}

// CPU twin: element::zero_if_finite (0 for a finite x, NaN otherwise).
template <class T> __device__ __forceinline__ T qat_zero_if_finite(T x) { return x - x; }
