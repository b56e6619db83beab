// Host entry points over the optimizer kernels' device functions
// (src/gpu/host_math.rs loads this as a shared library). Each runs exactly
// what the CUDA kernel of the same name runs: every phase for every thread
// of a group in turn (phases are separated by barriers on the device, and
// within a phase threads touch disjoint data or take order-independent
// maxima), then pass 2.
#include "shim.h"
#include "../kernels/common.cuh"
#include "../kernels/optim_math.cuh"
#include "../kernels/optim.cu"

extern "C" void host_adam4bit_step(const AdamArgs* a, u64 groups) {
    AdamShared sh;  // per call: tests run in parallel threads
    for (u64 gi = 0; gi < groups; ++gi) {
        for (int ph = 0; ph < ADAM_PHASES; ++ph)
            for (int tid = 0; tid < ADAM_THREADS; ++tid) adam_phase(ph, *a, sh, gi, tid);
        for (int tid = 0; tid < ADAM_THREADS; ++tid) adam_pass2(*a, sh, gi, tid);
    }
}

extern "C" void host_adam4bit_rank1_stats(const AdamArgs* a) {
    for (u64 e = 0; e < a->numel; ++e) adam_rank1_elem(*a, e);
}

extern "C" void host_adam4bit_rank1_clamp(float* x, u64 n, float lo, float hi) {
    for (u64 i = 0; i < n; ++i) x[i] = clamp_scale(x[i], lo, hi);
}

extern "C" float host_log2_det(float r) { return log2_det(r); }
