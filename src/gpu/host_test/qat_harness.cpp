// Host entry points over the QAT kernels' device functions
// (src/gpu/qat_host.rs loads this as a shared library). Each runs what the
// CUDA kernel of the same name runs, one thread at a time: the dry pass
// keeps one (min, max, non-finite) triple per block over the same
// grid-stride partition of the elements (the block's tree reduction is a
// min / max / or, which no order changes), the commit pass every element.
#include "shim.h"
#include "../kernels/common.cuh"
#include "../kernels/qat_math.cuh"
#include "../kernels/qat.cu"

template <class T> static void host_dry(const QatArgs* a, u64 blocks) {
    QatCoef<T> c = qat_coef<T>(*a);
    u64 stride = blocks * QAT_THREADS;
    for (u64 b = 0; b < blocks; ++b) {
        QatStats s = qat_stats_empty();
        for (u64 t = 0; t < QAT_THREADS; ++t)
            for (u64 i = b * QAT_THREADS + t; i < a->n; i += stride) qat_dry_elem<T>(*a, c, i, &s);
        a->partials[3 * b] = s.mn;
        a->partials[3 * b + 1] = s.mx;
        a->partials[3 * b + 2] = (double)s.bad;
    }
}

template <class T> static void host_commit(const QatArgs* a) {
    QatCoef<T> c = qat_coef<T>(*a);
    for (u64 i = 0; i < a->n; ++i) qat_commit_elem<T>(*a, c, i);
}

extern "C" void host_qat_dry_f32(const QatArgs* a, u64 blocks) { host_dry<float>(a, blocks); }
extern "C" void host_qat_dry_f64(const QatArgs* a, u64 blocks) { host_dry<double>(a, blocks); }
extern "C" void host_qat_commit_f32(const QatArgs* a) { host_commit<float>(a); }
extern "C" void host_qat_commit_f64(const QatArgs* a) { host_commit<double>(a); }

extern "C" void host_qat_channel_minmax_f32(const float* x, u64 rows, u64 cols, int axis,
                                            double* out) {
    for (u64 ch = 0; ch < (axis == 0 ? rows : cols); ++ch)
        qat_channel_minmax_elem<float>(x, rows, cols, axis, ch, out);
}
extern "C" void host_qat_channel_minmax_f64(const double* x, u64 rows, u64 cols, int axis,
                                            double* out) {
    for (u64 ch = 0; ch < (axis == 0 ? rows : cols); ++ch)
        qat_channel_minmax_elem<double>(x, rows, cols, axis, ch, out);
}
