//! The AVX2 body of `ZpWeight::decode`'s run decode
//! (`crate::int4_asym::runs`): 32 codes (4-bit: one 16-byte run, through
//! the nibble formats' shared unpack; 8-bit: 32 bytes in order) minus the
//! zero point as exact i32, converted, times the scale: the scalar
//! `f32(s) * f32(q - z)`, bit for bit.

use std::arch::x86_64::*;

use super::RUN;
use crate::int4_asym::decode_avx2::nibbles;
use crate::simd::Avx2;

/// `out[j] = s * f32(q_j - z)` for the run at `b` of `bits`-bit codes
/// (`RUN * bits / 8` bytes).
pub(super) fn zp_run(t: Avx2, b: &[u8], bits: u32, s: f32, z: i32, out: &mut [f32]) {
    assert!(b.len() >= RUN * bits as usize / 8 && out.len() >= RUN);
    // SAFETY: the token proves AVX2 and FMA; lengths checked above.
    unsafe {
        if bits == 8 {
            run8(t, b.as_ptr(), s, z, out.as_mut_ptr());
        } else {
            run4(t, b.as_ptr(), s, z, out.as_mut_ptr());
        }
    }
}

/// # Safety
/// None beyond the token; `b` has 16 bytes and `out` 32 floats.
#[target_feature(enable = "avx2,fma")]
unsafe fn run4(_: Avx2, b: *const u8, s: f32, z: i32, out: *mut f32) {
    let (sv, zv) = (_mm256_set1_ps(s), _mm256_set1_epi32(z));
    // SAFETY: 16 bytes at `b`, four stores of 8 floats inside `out`.
    unsafe {
        for (j, q) in nibbles(b).into_iter().enumerate() {
            let w = _mm256_mul_ps(sv, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, zv)));
            _mm256_storeu_ps(out.add(8 * j), w);
        }
    }
}

/// # Safety
/// None beyond the token; `b` has 32 bytes and `out` 32 floats.
#[target_feature(enable = "avx2,fma")]
unsafe fn run8(_: Avx2, b: *const u8, s: f32, z: i32, out: *mut f32) {
    let (sv, zv) = (_mm256_set1_ps(s), _mm256_set1_epi32(z));
    // SAFETY: four 8-byte loads inside `b`'s 32, four stores of 8 floats
    // inside `out`.
    unsafe {
        for j in 0..4 {
            let q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.add(8 * j).cast()));
            let w = _mm256_mul_ps(sv, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, zv)));
            _mm256_storeu_ps(out.add(8 * j), w);
        }
    }
}
