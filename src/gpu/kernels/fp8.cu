// FP8 codecs on device arrays.

// CPU twin: fp8::encode_slice (quantrs.fp8.encode). Contract: bit-identical
// codes for every f32 input (the same integer rounding as encode_scalar).
// fmt: 0 = E4M3, 1 = E5M2.
extern "C" __global__ void fp8_encode_kernel(const float* __restrict__ x, u8* __restrict__ out,
                                             unsigned long long n, int fmt, int saturate) {
    Fp8Fmt f = fmt == 0 ? fmt_e4m3() : fmt_e5m2();
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        out[i] = fp8_encode(x[i], f, saturate != 0);
    }
}

// CPU twin: fp8::decode_slice (quantrs.fp8.decode). Contract: bit-identical
// f32 for every code (NaN codes give NaN with the code's sign).
extern "C" __global__ void fp8_decode_kernel(const u8* __restrict__ codes, float* __restrict__ out,
                                             unsigned long long n, int fmt) {
    Fp8Fmt f = fmt == 0 ? fmt_e4m3() : fmt_e5m2();
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        out[i] = fp8_decode(codes[i], f);
    }
}

// CPU twin: the activation step of PerTensorFP8Linear::forward with an
// activation scale (W8A8): `decode(encode(x / s_a, saturate))`, a true IEEE
// division as on the CPU. Contract: bit-identical to fp8::round_to_grid_slice
// applied to `x / s_a`.
extern "C" __global__ void fp8_quantize_act(const float* __restrict__ x, float* __restrict__ out,
                                            unsigned long long n, float act_scale) {
    Fp8Fmt f = fmt_e4m3();
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        out[i] = fp8_decode(fp8_encode(__fdiv_rn(x[i], act_scale), f, true), f);
    }
}

// CPU twin: the activation codes of PerTensorFP8Linear's W8A8 forward,
// `encode(x / s_a, saturate)` (the codes whose decoded values
// fp8_quantize_act produces), for the cuBLASLt E4M3 GEMM. Contract:
// bit-identical codes.
extern "C" __global__ void fp8_encode_act(const float* __restrict__ x, u8* __restrict__ out,
                                          unsigned long long n, float act_scale) {
    Fp8Fmt f = fmt_e4m3();
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        out[i] = fp8_encode(__fdiv_rn(x[i], act_scale), f, true);
    }
}
