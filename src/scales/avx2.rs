//! The scale codec's scalar twin compiled for AVX2 + FMA: the same Rust
//! code (`scalar.rs`, inlined here) in `#[target_feature]` functions, so
//! the compiler vectorizes the table's `exp2` polynomial and the search's
//! logarithm guesses eight scales a register. Rust never contracts a
//! multiply and an add into an FMA and vectorizing keeps each element's
//! IEEE operations, so the tables, codes and decoded scales are the scalar
//! twin's bit for bit (tested in `mod.rs`). The code search of the encode
//! is written out with gathers (`encode_all_gather`): the binary search of
//! `bisect.rs`, step for step, four vectors of eight scales at a time.

#![cfg(target_arch = "x86_64")]

use super::bisect::code_of;
use super::scalar;
use crate::simd::Avx2;

/// [`scalar::table_with`] over [`scalar::fill_table`].
pub(super) fn table(_proof: Avx2, max: f32, step: f32, t: &mut [f32; 256]) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn imp(max: f32, step: f32, t: &mut [f32; 256]) {
        scalar::table_with(max, step, t, scalar::fill_table);
    }
    // SAFETY: the token proves AVX2 and FMA.
    unsafe { imp(max, step, t) }
}

/// [`scalar::encode_bisect_with_table`] on the scalar table, the search
/// eight scales a vector (`encode_all_gather`).
pub(super) fn encode_table(
    _proof: Avx2,
    s: &mut [f32],
    codes: &mut [u8],
    t: &mut [f32; 256],
) -> (f32, f32) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn imp(s: &mut [f32], codes: &mut [u8], t: &mut [f32; 256]) -> (f32, f32) {
        scalar::encode_table_then(s, codes, scalar::fill_table, t, |s, c, t| {
            // SAFETY: AVX2 is enabled in this function.
            unsafe { encode_all_gather(s, c, t) }
        })
    }
    // SAFETY: the token proves AVX2 and FMA.
    unsafe { imp(s, codes, t) }
}

/// `bisect::encode_all` eight scales a vector: the same eight steps of
/// `code_of` (`t[c + half] >= x`, ordered, so a NaN gives 0 and a zero
/// 255), each a gather of eight table entries, so the same codes and
/// decoded scales. Four vectors go step by step together, so that four
/// independent gathers hide each other's latency: a search is a chain of
/// eight dependent loads (one scale at a time about 28 cycles a scale on
/// Zen 3, 8 % of the optimizer's step).
///
/// # Safety
/// AVX2.
#[target_feature(enable = "avx2,fma")]
unsafe fn encode_all_gather(s: &mut [f32], codes: &mut [u8], t: &[f32; 256]) {
    /// Vectors searched side by side.
    const WAYS: usize = 4;
    let n = s.len().min(codes.len());
    let (wide, whole) = (n / (8 * WAYS) * (8 * WAYS), n / 8 * 8);
    for i in (0..wide).step_by(8 * WAYS) {
        // SAFETY: AVX2 per this function's contract; `i + 32 <= n`.
        unsafe { search_vectors::<WAYS>(s, codes, t, i) };
    }
    for i in (wide..whole).step_by(8) {
        // SAFETY: AVX2 per this function's contract; `i + 8 <= n`.
        unsafe { search_vectors::<1>(s, codes, t, i) };
    }
    for (x, c) in s[whole..n].iter_mut().zip(&mut codes[whole..n]) {
        let k = code_of(*x, t);
        *c = k as u8;
        *x = t[k];
    }
}

/// The codes and decoded scales of the `8 * WAYS` scales from element `i`.
///
/// # Safety
/// AVX2; `i + 8 * WAYS` within `s` and `codes`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn search_vectors<const WAYS: usize>(
    s: &mut [f32],
    codes: &mut [u8],
    t: &[f32; 256],
    i: usize,
) {
    use std::arch::x86_64::*;
    assert!(i + 8 * WAYS <= s.len().min(codes.len()));
    // Byte 0 of each 32-bit lane to the low 4 bytes of each 128-bit half.
    let low_bytes = _mm256_setr_epi8(
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1,
        -1, -1, -1, -1, -1, -1, -1, -1,
    );
    // SAFETY: loads and stores of lanes `i..i + 8 * WAYS`, asserted within
    // `s` and `codes`; every gather index is `c + half <= 255` or a code
    // `c <= 255`, inside `t`; AVX2 per this function's contract.
    unsafe {
        let mut x = [_mm256_setzero_ps(); WAYS];
        let mut c = [_mm256_setzero_si256(); WAYS];
        for (j, x) in x.iter_mut().enumerate() {
            *x = _mm256_loadu_ps(s.as_ptr().add(i + 8 * j));
        }
        for half in [128, 64, 32, 16, 8, 4, 2, 1] {
            let h = _mm256_set1_epi32(half);
            for (c, &x) in c.iter_mut().zip(&x) {
                let entry = _mm256_i32gather_ps::<4>(t.as_ptr(), _mm256_add_epi32(*c, h));
                let holds = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(entry, x));
                *c = _mm256_add_epi32(*c, _mm256_and_si256(holds, h));
            }
        }
        for (j, &c) in c.iter().enumerate() {
            let at = i + 8 * j;
            _mm256_storeu_ps(
                s.as_mut_ptr().add(at),
                _mm256_i32gather_ps::<4>(t.as_ptr(), c),
            );
            let bytes = _mm256_shuffle_epi8(c, low_bytes);
            let eight = _mm_unpacklo_epi32(
                _mm256_castsi256_si128(bytes),
                _mm256_extracti128_si256::<1>(bytes),
            );
            _mm_storel_epi64(codes.as_mut_ptr().add(at) as *mut __m128i, eight);
        }
    }
}

/// The guess-and-walk encode compiled for AVX2 (the timing's baseline).
#[cfg(test)]
pub(super) fn encode_table_walk(
    _proof: Avx2,
    s: &mut [f32],
    codes: &mut [u8],
    t: &mut [f32; 256],
) -> (f32, f32) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn imp(s: &mut [f32], codes: &mut [u8], t: &mut [f32; 256]) -> (f32, f32) {
        scalar::encode_with_table(s, codes, scalar::fill_table, None, t)
    }
    // SAFETY: the token proves AVX2 and FMA.
    unsafe { imp(s, codes, t) }
}
