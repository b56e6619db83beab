// The QAT step (QatOptimizer with a float32 or float64 master) on a device
// (after qat_math.cuh, its per-element leaves).
//
// CPU twin: src/qat (format.rs: the two passes and the AdamW element;
// fake.rs: integer and FP8 fake quantization, nearest and stochastic;
// rng.rs: the (key, index) uniforms).
// Accuracy contract: bit-identical to the CPU step (master, moments, view,
// calibration). How (docs/gpu.md): compiled with --fmad=false (no
// contraction, as Rust never contracts); IEEE division and square root;
// the same operations in the same order on the same precision; the same
// SplitMix64 uniforms keyed by (seed, step) and the element's global
// index; the calibration's reduction is min / max only (order-independent
// up to the sign of a zero, which calibration never reads), and the
// calibration itself runs on the host with the CPU's own code.
//
// A step is two launches, as the CPU's two passes: `qat_dry_*` computes
// every updated weight and moment in registers and writes one (min, max,
// non-finite) triple per block, nothing else; the host reduces the triples
// and calibrates; only then does `qat_commit_*` recompute the same values
// and write master, moments and the view. A failed step has written
// nothing but the triples.
//
// Every kernel is a grid-stride loop over a per-element function, so the
// host test (src/gpu/qat_host.rs) runs the very same functions with g++.

#define QAT_THREADS 256

// Targets of the view (`QatArgs::target`).
#define QAT_INT 0
#define QAT_E4M3 1
#define QAT_E5M2 2

// One step of one tensor. Pointers are device addresses
// (host addresses in the host test), of the master's type.
struct QatArgs {
    u64 n;
    void* w;        // master, updated in place
    const void* g;  // gradient
    void* m;
    void* v;
    void* q;            // the fake-quantized view
    double* partials;   // 3 per block of the dry pass: min, max, non-finite
    u64 key;            // stochastic rounding's stream key
    double coef64[9];   // QatCoef<double> (float64 masters)
    float coef32[9];    // QatCoef<float> (float32 masters)
    QatGrid grid;       // integer targets
    double fp8_max;     // FP8 targets: the largest finite value
    int target;
    int stochastic;
};

template <class T> __device__ __forceinline__ QatCoef<T> qat_coef(const QatArgs& a);
template <> __device__ __forceinline__ QatCoef<float> qat_coef<float>(const QatArgs& a) {
    const float* c = a.coef32;
    QatCoef<float> k = {c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8]};
    return k;
}
template <> __device__ __forceinline__ QatCoef<double> qat_coef<double>(const QatArgs& a) {
    const double* c = a.coef64;
    QatCoef<double> k = {c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8]};
    return k;
}

// The running (min, max, non-finite) of one thread or block.
struct QatStats {
    double mn, mx;
    int bad;
};

__device__ __forceinline__ QatStats qat_stats_empty() {
    QatStats s = {__longlong_as_double(0x7FF0000000000000ll),
                  __longlong_as_double((long long)0xFFF0000000000000ull), 0};
    return s;
}

// Dry pass, element i (CPU twin: format::dry_body + reduce): the updated
// weight poisoned by a non-finite moment, folded into s.
template <class T>
__device__ __forceinline__ void qat_dry_elem(const QatArgs& a, const QatCoef<T>& c, u64 i,
                                             QatStats* s) {
    T m = ((const T*)a.m)[i], v = ((const T*)a.v)[i];
    T w = qat_adamw(c, ((const T*)a.w)[i], ((const T*)a.g)[i], &m, &v);
    T o = w + qat_zero_if_finite(m) + qat_zero_if_finite(v);
    double x = (double)o;
    s->mn = x < s->mn ? x : s->mn;
    s->mx = x > s->mx ? x : s->mx;
    if (!isfinite(x)) s->bad = 1;
}

// The view of the weight x of element i (CPU twins: fake_int_chunk,
// fake_fp8_chunk, Master::fp8_round).
template <class T> __device__ __forceinline__ T qat_view_value(const QatArgs& a, T x, u64 i) {
    double u = a.stochastic ? qat_uniform(a.key, i) : 0.0;
    if (a.target == QAT_INT) return (T)qat_fake_int(a.grid, (double)x, a.stochastic != 0, u);
    Fp8Fmt f = a.target == QAT_E4M3 ? fmt_e4m3() : fmt_e5m2();
    if (a.stochastic) return (T)qat_fp8_stochastic((double)x, f, a.fp8_max, u);
    return (T)qat_fp8_nearest(sizeof(T) == 8 ? qat_f32_odd((double)x) : (float)x, f);
}

// Commit pass, element i (CPU twin: format::commit_body): the same AdamW
// update written back, then the new weight's view.
template <class T>
__device__ __forceinline__ void qat_commit_elem(const QatArgs& a, const QatCoef<T>& c, u64 i) {
    T m = ((const T*)a.m)[i], v = ((const T*)a.v)[i];
    T w = qat_adamw(c, ((const T*)a.w)[i], ((const T*)a.g)[i], &m, &v);
    ((T*)a.w)[i] = w;
    ((T*)a.m)[i] = m;
    ((T*)a.v)[i] = v;
    ((T*)a.q)[i] = qat_view_value<T>(a, w, i);
}

// Block-wide (min, max, or) of the threads' stats into partials[3 * block].
template <class T> __device__ void qat_dry(const QatArgs& a) {
    __shared__ double smn[QAT_THREADS], smx[QAT_THREADS];
    __shared__ int sbad[QAT_THREADS];
    QatCoef<T> c = qat_coef<T>(a);
    QatStats s = qat_stats_empty();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < a.n;
         i += (u64)gridDim.x * blockDim.x) {
        qat_dry_elem<T>(a, c, i, &s);
    }
    int t = threadIdx.x;
    smn[t] = s.mn;
    smx[t] = s.mx;
    sbad[t] = s.bad;
    __syncthreads();
    for (int k = QAT_THREADS / 2; k > 0; k >>= 1) {
        if (t < k) {
            smn[t] = smn[t + k] < smn[t] ? smn[t + k] : smn[t];
            smx[t] = smx[t + k] > smx[t] ? smx[t + k] : smx[t];
            sbad[t] |= sbad[t + k];
        }
        __syncthreads();
    }
    if (t == 0) {
        a.partials[3 * blockIdx.x] = smn[0];
        a.partials[3 * blockIdx.x + 1] = smx[0];
        a.partials[3 * blockIdx.x + 2] = (double)sbad[0];
    }
}

template <class T> __device__ void qat_commit(const QatArgs& a) {
    QatCoef<T> c = qat_coef<T>(a);
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < a.n;
         i += (u64)gridDim.x * blockDim.x) {
        qat_commit_elem<T>(a, c, i);
    }
}

extern "C" __global__ void qat_dry_f32(QatArgs a) { qat_dry<float>(a); }
extern "C" __global__ void qat_dry_f64(QatArgs a) { qat_dry<double>(a); }
extern "C" __global__ void qat_commit_f32(QatArgs a) { qat_commit<float>(a); }
extern "C" __global__ void qat_commit_f64(QatArgs a) { qat_commit<double>(a); }

// Per-channel (min, max) of a row-major [rows, cols] tensor along `axis`
// (0: one channel per row, 1: per column), the reduction of
// qat::params::calibrate_per_channel with clip fraction 0. One thread per
// channel walks its elements in order, so NaN / infinity are flagged as on
// the CPU (the host then names the first one from a copy).
template <class T>
__device__ __forceinline__ void qat_channel_minmax_elem(const T* x, u64 rows, u64 cols, int axis,
                                                        u64 ch, double* out) {
    QatStats s = qat_stats_empty();
    u64 len = axis == 0 ? cols : rows;
    for (u64 k = 0; k < len; ++k) {
        double v = (double)(axis == 0 ? x[ch * cols + k] : x[k * cols + ch]);
        s.mn = v < s.mn ? v : s.mn;
        s.mx = v > s.mx ? v : s.mx;
        if (!isfinite(v)) s.bad = 1;
    }
    out[3 * ch] = s.mn;
    out[3 * ch + 1] = s.mx;
    out[3 * ch + 2] = (double)s.bad;
}

extern "C" __global__ void qat_channel_minmax_f32(const float* x, u64 rows, u64 cols, int axis,
                                                  double* out) {
    u64 ch = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch < (axis == 0 ? rows : cols)) qat_channel_minmax_elem<float>(x, rows, cols, axis, ch, out);
}
extern "C" __global__ void qat_channel_minmax_f64(const double* x, u64 rows, u64 cols, int axis,
                                                  double* out) {
    u64 ch = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch < (axis == 0 ? rows : cols)) qat_channel_minmax_elem<double>(x, rows, cols, axis, ch, out);
}
