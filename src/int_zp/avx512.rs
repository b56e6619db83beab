//! The AVX-512 body of `dot::dot_row`: a run of 32 codes widens to two
//! vectors of 16 f32 (4-bit: the low and the high nibbles of 16 bytes;
//! 8-bit: the two halves of 32 bytes) for the shared loop
//! `body::group_loop`.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::body::group_loop;
use super::Row;
use crate::simd::Avx512;

/// # Safety
/// None beyond the token (AVX-512 F/BW/VL); the caller (`dot::dot_row`)
/// checks the lengths of `row` against `x`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn dot_row(_: Avx512, row: Row<'_>, x: &[f32]) -> f32 {
    // 16 bytes as 16 f32.
    let f16 = |v: __m128i| _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
    if row.bits == 8 {
        let widen = |p: *const u8| -> [__m512; 2] {
            // SAFETY: `p` has 32 bytes (one 8-bit run); AVX-512 F is this
            // function's feature.
            unsafe { std::array::from_fn(|j| f16(_mm_loadu_si128(p.add(16 * j).cast()))) }
        };
        // SAFETY: AVX-512 F and FMA are this function's features; lengths
        // checked by the caller.
        return unsafe { group_loop(row, x, widen) };
    }
    let widen = |p: *const u8| -> [__m512; 2] {
        // SAFETY: `p` has 16 bytes (one 4-bit run); AVX-512 F is this
        // function's feature.
        unsafe {
            let b = _mm_loadu_si128(p.cast());
            let nib = _mm_set1_epi8(0x0F);
            [
                f16(_mm_and_si128(b, nib)),
                f16(_mm_and_si128(_mm_srli_epi16::<4>(b), nib)),
            ]
        }
    };
    // SAFETY: as above.
    unsafe { group_loop(row, x, widen) }
}
