//! AVX2 bodies of the nibble formats' run decode (`runs.rs`): one run of 32
//! inputs (16 bytes, input `j` in byte `j`'s low nibble and input `j + 16`
//! in its high nibble) becomes 32 floats in four vectors of 8, with the
//! group's multipliers applied by the scalar decoders' own float32
//! operations (a multiply rounded, then an add rounded: no FMA), so the
//! values are theirs bit for bit.

use std::arch::x86_64::*;

use super::RUN;
use crate::simd::Avx2;

/// The 32 codes of the run at `b` as four vectors of i32: inputs 0-7,
/// 8-15 (low nibbles of bytes 0-7, 8-15), then 16-23, 24-31 (high nibbles).
///
/// # Safety
/// AVX2 is enabled in the caller; `b` has 16 readable bytes.
#[inline(always)]
pub(crate) unsafe fn nibbles(b: *const u8) -> [__m256i; 4] {
    // SAFETY: two 8-byte loads inside the run's 16 bytes (the contract).
    unsafe {
        let v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.cast()));
        let v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.add(8).cast()));
        let mask = _mm256_set1_epi32(0x0F);
        [
            _mm256_and_si256(v0, mask),
            _mm256_and_si256(v1, mask),
            _mm256_srli_epi32::<4>(v0),
            _mm256_srli_epi32::<4>(v1),
        ]
    }
}

/// `out[j] = d * q_j + c` (the product rounded, then the sum) for the run
/// `b`: `int4_asym`'s `d q + m` with `c = m`, `int4_k`'s `d q - m` with
/// `c = -m` (`a - m` and `a + (-m)` are the same IEEE operation).
pub(crate) fn affine_run(t: Avx2, b: &[u8], d: f32, c: f32, out: &mut [f32]) {
    assert!(b.len() >= RUN / 2 && out.len() >= RUN);
    // SAFETY: the token proves AVX2 and FMA; lengths checked above.
    unsafe { affine_run_unchecked(t, b.as_ptr(), d, c, out.as_mut_ptr()) }
}

/// # Safety
/// None beyond the token; `b` has 16 bytes and `out` 32 floats.
#[target_feature(enable = "avx2,fma")]
unsafe fn affine_run_unchecked(_: Avx2, b: *const u8, d: f32, c: f32, out: *mut f32) {
    let (dv, cv) = (_mm256_set1_ps(d), _mm256_set1_ps(c));
    // SAFETY: 16 bytes at `b`, four stores of 8 floats inside `out`.
    unsafe {
        for (j, q) in nibbles(b).into_iter().enumerate() {
            let w = _mm256_add_ps(_mm256_mul_ps(dv, _mm256_cvtepi32_ps(q)), cv);
            _mm256_storeu_ps(out.add(8 * j), w);
        }
    }
}
