// Host build of the CUDA kernel sources (src/gpu/host_math.rs): maps the
// CUDA qualifiers and intrinsics the kernels use to plain C++, so g++
// (with -ffp-contract=off, the host twin of NVRTC's --fmad=false) compiles
// the same device functions. Only the per-thread functions are called; the
// __global__ kernels compile but never run here. Atomics are plain
// read-modify-writes: the host test runs one thread at a time.
#include <cmath>
#include <cstdint>
#include <cstring>

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __shared__ static

struct HostDim3 {
    unsigned x, y, z;
};
static HostDim3 threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0}, blockDim = {1, 1, 1},
                gridDim = {1, 1, 1};

static inline void __syncthreads() {}
static inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
static inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
static inline unsigned atomicMax(unsigned* p, unsigned v) {
    unsigned o = *p;
    if (v > o) *p = v;
    return o;
}
static inline unsigned atomicOr(unsigned* p, unsigned v) {
    unsigned o = *p;
    *p = o | v;
    return o;
}
static inline float __shfl_xor_sync(unsigned, float v, int) { return v; }
template <class T> static inline T __ldg(const T* p) { return *p; }
using std::isfinite;
static inline double __longlong_as_double(long long i) {
    double d;
    std::memcpy(&d, &i, 8);
    return d;
}
using std::copysign;
using std::fabs;
using std::isnan;
using std::sqrt;
