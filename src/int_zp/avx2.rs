//! The AVX2 body of `dot::dot_row`: a run of 32 codes widens to four
//! vectors of 8 f32 (4-bit: the low then the high nibbles of 16 bytes;
//! 8-bit: 32 bytes in order) for the shared loop `body::group_loop`.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::body::group_loop;
use super::Row;
use crate::simd::Avx2;

/// # Safety
/// None beyond the token (AVX2 and FMA); the caller (`dot::dot_row`)
/// checks the lengths of `row` against `x`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_row(_: Avx2, row: Row<'_>, x: &[f32]) -> f32 {
    // 8 bytes at `p` as 8 f32.
    let f8 = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    if row.bits == 8 {
        let widen = |p: *const u8| -> [__m256; 4] {
            // SAFETY: `p` has 32 bytes (one 8-bit run); AVX2 is this
            // function's feature.
            unsafe { std::array::from_fn(|j| f8(_mm_loadl_epi64(p.add(8 * j).cast()))) }
        };
        // SAFETY: AVX2 and FMA are this function's features; lengths checked
        // by the caller.
        return unsafe { group_loop(row, x, widen) };
    }
    let widen = |p: *const u8| -> [__m256; 4] {
        // SAFETY: `p` has 16 bytes (one 4-bit run); AVX2 is this function's
        // feature.
        unsafe {
            let b = _mm_loadu_si128(p.cast());
            let nib = _mm_set1_epi8(0x0F);
            let (lo, hi) = (
                _mm_and_si128(b, nib),
                _mm_and_si128(_mm_srli_epi16::<4>(b), nib),
            );
            let upper = |v: __m128i| _mm_unpackhi_epi64(v, v);
            [f8(lo), f8(upper(lo)), f8(hi), f8(upper(hi))]
        }
    };
    // SAFETY: as above.
    unsafe { group_loop(row, x, widen) }
}
