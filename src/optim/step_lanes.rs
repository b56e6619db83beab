//! The step's 4-bit code operations per register type: the nearest-code
//! search, the (un)packing of two registers of nibbles. `kernel.rs` calls
//! them through [`StepLanes`]; AVX-512 keeps the shared `F32Lanes` forms,
//! AVX2 has its own (fewer instructions per element: the AVX2 step is
//! bound by the instructions it issues, docs/optim.md). Every form gives
//! the scalar `Codebook16::encode` codes and the `format.rs` nibble layout,
//! so the step's bits do not change (tested in `dispatch.rs` and
//! `tests/python/test_optim_golden.py`).

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use crate::simd::F32Lanes as Lanes;

/// The code operations of one register type.
pub(super) trait StepLanes: Lanes {
    /// A 16-entry code book's midpoints laid out for [`Self::nearest16`].
    type Search: Copy;

    /// The search layout of the 15 sorted midpoints `mids[..15]`.
    ///
    /// # Safety
    /// The CPU must support the type's features.
    unsafe fn search_mids(mids: &[f32; 16]) -> Self::Search;

    /// Lane-wise nearest code: `Codebook16::encode`'s binary search.
    ///
    /// # Safety
    /// The CPU must support the type's features.
    unsafe fn nearest16(s: Self::Search, x: Self) -> Self::Idx;

    /// The codes of `2 * LANES` elements from `LANES` bytes of nibbles at
    /// `p` (element `2i` in the low nibble of byte `i`).
    ///
    /// # Safety
    /// The type's features; `LANES` readable bytes at `p`.
    #[inline(always)]
    unsafe fn load_nibbles_pair(p: *const u8) -> (Self::Idx, Self::Idx) {
        // SAFETY: per this function's contract.
        unsafe {
            (
                Self::load_nibbles(p),
                Self::load_nibbles(p.add(Self::LANES / 2)),
            )
        }
    }

    /// Store the codes `a` then `b` (`2 * LANES` elements) as `LANES`
    /// bytes of nibbles at `p`.
    ///
    /// # Safety
    /// The type's features; `LANES` writable bytes at `p`.
    #[inline(always)]
    unsafe fn store_nibbles_pair(a: Self::Idx, b: Self::Idx, p: *mut u8) {
        // SAFETY: per this function's contract.
        unsafe { Self::store_nibbles2(a, b, p) }
    }
}

impl StepLanes for __m512 {
    type Search = <__m512 as Lanes>::Mids;

    #[inline(always)]
    unsafe fn search_mids(mids: &[f32; 16]) -> Self::Search {
        // SAFETY: the type's features per this function's contract.
        unsafe { <__m512 as Lanes>::mids(mids) }
    }

    #[inline(always)]
    unsafe fn nearest16(s: Self::Search, x: Self) -> Self::Idx {
        // SAFETY: the type's features per this function's contract.
        unsafe { <__m512 as Lanes>::search16(s, x) }
    }
}

/// The midpoints as the four steps of the binary search read them: step
/// `k` (code bits from the top) compares with `mids[code + 2^(3-k) - 1]`,
/// and the code bits found so far, `p`, take at most 8 values, so each
/// step's midpoints fit one 8-lane register indexed by `p` (one `vpermps`,
/// against the two and a blend a 16-entry look-up takes).
#[derive(Clone, Copy)]
pub(super) struct Search8 {
    /// `mids[7]`, broadcast: the first step.
    top: __m256,
    /// `mids[8p + 3]` for `p` in 0..2: the second step.
    fours: __m256,
    /// `mids[4p + 1]` for `p` in 0..4: the third step.
    twos: __m256,
    /// `mids[2p]` for `p` in 0..8: the last step.
    ones: __m256,
}

impl StepLanes for __m256 {
    type Search = Search8;

    #[inline(always)]
    unsafe fn search_mids(m: &[f32; 16]) -> Search8 {
        // SAFETY: AVX2 per this function's contract.
        unsafe {
            Search8 {
                top: _mm256_set1_ps(m[7]),
                fours: _mm256_setr_ps(m[3], m[11], 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
                twos: _mm256_setr_ps(m[1], m[5], m[9], m[13], 0.0, 0.0, 0.0, 0.0),
                ones: _mm256_setr_ps(m[0], m[2], m[4], m[6], m[8], m[10], m[12], m[14]),
            }
        }
    }

    #[inline(always)]
    unsafe fn nearest16(s: Search8, x: __m256) -> __m256i {
        // SAFETY: AVX2 per this function's contract.
        unsafe {
            // `x > mid` as the scalar search: false for NaN. A true compare
            // is -1 in every lane bit, so `2p - mask` appends the bit.
            let above = |mid: __m256| _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(x, mid));
            let mut p = _mm256_srli_epi32::<31>(above(s.top));
            for t in [s.fours, s.twos, s.ones] {
                let bit = above(_mm256_permutevar8x32_ps(t, p));
                p = _mm256_sub_epi32(_mm256_add_epi32(p, p), bit);
            }
            p
        }
    }

    #[inline(always)]
    unsafe fn load_nibbles_pair(p: *const u8) -> (__m256i, __m256i) {
        // SAFETY: AVX2; 8 readable bytes at `p` per this function's contract.
        unsafe {
            let bytes = _mm_loadl_epi64(p.cast());
            let low = _mm_set1_epi8(15);
            let even = _mm_and_si128(bytes, low);
            let odd = _mm_and_si128(_mm_srli_epi16::<4>(bytes), low);
            // One code per byte, in element order.
            let codes = _mm_unpacklo_epi8(even, odd);
            (
                _mm256_cvtepu8_epi32(codes),
                _mm256_cvtepu8_epi32(_mm_unpackhi_epi64(codes, codes)),
            )
        }
    }

    #[inline(always)]
    unsafe fn store_nibbles_pair(a: __m256i, b: __m256i, p: *mut u8) {
        // SAFETY: AVX2; 8 writable bytes at `p` per this function's contract.
        unsafe {
            // Each 64-bit lane: its even code in bits 0..4, its odd code in
            // bits 4..8 (codes are below 16).
            let qa = _mm256_or_si256(a, _mm256_srli_epi64::<28>(a));
            let qb = _mm256_or_si256(b, _mm256_srli_epi64::<28>(b));
            // Byte 0 and 8 of each 128-bit half: a's to bytes 0, 1 (low
            // half) and 2, 3 (high half), b's to bytes 4..8 the same way.
            let sel_a = _mm256_setr_epi8(
                0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, //
                -1, -1, 0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
            );
            let sel_b = _mm256_setr_epi8(
                -1, -1, -1, -1, 0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, //
                -1, -1, -1, -1, -1, -1, 0, 8, -1, -1, -1, -1, -1, -1, -1, -1,
            );
            let s = _mm256_or_si256(
                _mm256_shuffle_epi8(qa, sel_a),
                _mm256_shuffle_epi8(qb, sel_b),
            );
            let bytes = _mm_or_si128(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
            _mm_storel_epi64(p.cast(), bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    //! The AVX2 forms against the scalar code book and nibble layout.
    use super::*;
    use crate::optim::codebook::{Codebook16, DYNAMIC4, INT4, NF4};
    use crate::optim::format::{nibble, set_nibble};
    use crate::optim::VarianceMap;
    use crate::simd::Avx2;

    #[target_feature(enable = "avx2,fma")]
    unsafe fn nearest(cb: &Codebook16, xs: &[f32; 8]) -> [i32; 8] {
        // SAFETY: AVX2 enabled here; `xs` and the output hold 8 lanes.
        unsafe {
            let s = <__m256 as StepLanes>::search_mids(&cb.mids);
            let c = <__m256 as StepLanes>::nearest16(s, _mm256_loadu_ps(xs.as_ptr()));
            let mut out = [0i32; 8];
            _mm256_storeu_si256(out.as_mut_ptr().cast(), c);
            out
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn round_trip(bytes: &[u8; 8]) -> ([i32; 16], [u8; 8]) {
        // SAFETY: AVX2 enabled here; 8 bytes in and out, 16 codes.
        unsafe {
            let (a, b) = <__m256 as StepLanes>::load_nibbles_pair(bytes.as_ptr());
            let mut codes = [0i32; 16];
            _mm256_storeu_si256(codes.as_mut_ptr().cast(), a);
            _mm256_storeu_si256(codes.as_mut_ptr().add(8).cast(), b);
            let mut back = [0u8; 8];
            <__m256 as StepLanes>::store_nibbles_pair(a, b, back.as_mut_ptr());
            (codes, back)
        }
    }

    #[test]
    fn nearest16_is_the_scalar_search() {
        if Avx2::new().is_none() {
            eprintln!("skipped: no AVX2");
            return;
        }
        let books = [NF4, INT4, DYNAMIC4]
            .into_iter()
            .chain(VarianceMap::ALL.map(|m| m.table()));
        for t in books {
            let cb = Codebook16::new(t);
            let mut xs = vec![
                0.0f32,
                -0.0,
                f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                1e-45,
            ];
            for &m in cb.mids[..15].iter().chain(&cb.values) {
                for d in [-2i32, -1, 0, 1, 2] {
                    let x = f32::from_bits(m.to_bits().wrapping_add_signed(d));
                    xs.extend([x, -x]);
                }
            }
            xs.extend((-1300..=1300).map(|i| i as f32 / 1000.0));
            xs.resize(xs.len().next_multiple_of(8), 0.5);
            for chunk in xs.chunks_exact(8) {
                let lanes: [f32; 8] = chunk.try_into().unwrap();
                // SAFETY: AVX2 checked above.
                let got = unsafe { nearest(&cb, &lanes) };
                for (x, c) in lanes.iter().zip(got) {
                    assert_eq!(c, cb.encode(*x) as i32, "{x} in {t:?}");
                }
            }
        }
    }

    #[test]
    fn nibble_pairs_round_trip_in_element_order() {
        if Avx2::new().is_none() {
            eprintln!("skipped: no AVX2");
            return;
        }
        let mut seed = 0x9E37_79B9u32;
        for _ in 0..200 {
            let mut bytes = [0u8; 8];
            for b in &mut bytes {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                *b = seed as u8;
            }
            // SAFETY: AVX2 checked above.
            let (codes, back) = unsafe { round_trip(&bytes) };
            let mut expect = [0u8; 8];
            for (e, &c) in codes.iter().enumerate() {
                assert_eq!(c as u8, nibble(&bytes, e), "{e}");
                set_nibble(&mut expect, e, c as u8);
            }
            assert_eq!(back, bytes);
            assert_eq!(expect, bytes);
        }
    }
}
