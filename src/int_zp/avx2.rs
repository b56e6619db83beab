//! The AVX2 body of `dot::dot_row`: a run of 32 codes widens to four
//! vectors of 8 f32 (4-bit: the low then the high nibbles of 16 bytes;
//! 8-bit: 32 bytes in order) for the shared loop `body::group_loop`; and
//! the 4-bit rows' `(s, -(s z))` pairs for the shared multi-row kernel,
//! four groups at a time ([`zp_pairs_f16c`]).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::body::group_loop;
use super::Row;
use crate::simd::{Avx2, Avx2F16c};

/// `dm[2g] = s_g`, `dm[2g + 1] = -(s_g z_g)` (the scalar pairs bit for bit:
/// F16C's conversion is exact, then the same f32 product and negation)
/// for the `dm.len() / 2` groups from the start of `s` (halves) and `z`
/// (zero points), four at a time; then `dm[pairs..]` zeroed (the groups
/// past the row's `pairs / 2`, read from the next row, are dropped).
///
/// # Panics
/// Unless `dm.len()` is a multiple of 8 at most `pairs + 7`, and `s` and
/// `z` hold `dm.len() / 2` values.
pub(super) fn zp_pairs_f16c(f: Avx2F16c, s: &[u16], z: &[u8], pairs: usize, dm: &mut [f32]) {
    let n = dm.len();
    assert!(n.is_multiple_of(8) && pairs <= n && n < pairs + 8 && n >= 8);
    assert!(s.len() >= n / 2 && z.len() >= n / 2);
    // SAFETY: the token proves AVX2 and F16C; lengths asserted above.
    unsafe { zp_pairs_body(f, s, z, dm) };
    // The padding (fewer than 8 floats, all in the last 8): a fixed trip
    // count, not a fill of a run-time length (a `memset` call per row).
    let last = &mut dm[n - 8..];
    for (j, v) in last.iter_mut().enumerate() {
        if n - 8 + j >= pairs {
            *v = 0.0;
        }
    }
}

/// # Safety
/// None beyond the token (AVX2 and F16C); `dm.len()` a multiple of 8, `s`
/// and `z` hold `dm.len() / 2` values.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn zp_pairs_body(_: Avx2F16c, s: &[u16], z: &[u8], dm: &mut [f32]) {
    let neg = _mm_set1_ps(-0.0);
    for (c, out) in dm.chunks_exact_mut(8).enumerate() {
        // SAFETY: 4 halves (8 bytes) and 4 zero points (4 bytes) at group
        // `4c`, inside `s` and `z` (the contract); 8 floats out.
        unsafe {
            let h = _mm_loadl_epi64(s.as_ptr().add(4 * c).cast());
            let zb = z.as_ptr().add(4 * c).cast::<i32>().read_unaligned();
            let sf = _mm_cvtph_ps(h);
            let zf = _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(zb)));
            // Negating the rounded product is exact: `-(s * z)`.
            let c = _mm_xor_ps(_mm_mul_ps(sf, zf), neg);
            let p = out.as_mut_ptr();
            _mm_storeu_ps(p, _mm_unpacklo_ps(sf, c));
            _mm_storeu_ps(p.add(4), _mm_unpackhi_ps(sf, c));
        }
    }
}

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
