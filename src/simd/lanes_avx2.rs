//! [`F32Lanes`] for AVX2 + FMA (`__m256`, 8 lanes).
//!
//! A 16-entry code book takes two 8-lane registers: a look-up is two
//! `vpermps` (which read the index's low 3 bits) and a blend on bit 3. The
//! nearest-code search counts the midpoints below `x` in two levels of three
//! compares ([`Mids16`]): the same code as the binary search over the sorted
//! midpoints, without its chain of dependent blends. The int8 m code book
//! (256 entries) is read with gathers.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::lanes::F32Lanes;

/// A 16-entry table as two 8-lane halves.
#[derive(Clone, Copy)]
pub(crate) struct Lut16 {
    lo: __m256,
    hi: __m256,
}

impl Lut16 {
    /// `t[idx]` lane-wise for `idx` in 0..16; `hi_mask` has the sign bit set
    /// in the lanes whose index has bit 3 set.
    #[inline(always)]
    unsafe fn get(self, idx: __m256i, hi_mask: __m256) -> __m256 {
        // SAFETY: the caller runs with AVX2 enabled.
        unsafe {
            _mm256_blendv_ps(
                _mm256_permutevar8x32_ps(self.lo, idx),
                _mm256_permutevar8x32_ps(self.hi, idx),
                hi_mask,
            )
        }
    }
}

/// The 15 midpoints of a sorted 16-entry code book laid out for a two-level
/// count: `x`'s quarter `q` (0..4) is the number of the midpoints 3, 7 and
/// 11 below it, and its code `4q` plus the number of the midpoints `4q`,
/// `4q + 1`, `4q + 2` below it. For non-decreasing midpoints that count is
/// what `Codebook16::encode`'s binary search returns (both are the number
/// of midpoints strictly below `x`; 0 for NaN, whose compares are false).
#[derive(Clone, Copy)]
pub(crate) struct Mids16 {
    /// Midpoints 3, 7 and 11, broadcast.
    quarters: [__m256; 3],
    /// Lanes 0..4: midpoint `4q` of quarter `q`; lanes 4..8: midpoint `4q + 1`.
    first: __m256,
    /// Lanes 0..4: midpoint `4q + 2`.
    third: __m256,
}

impl F32Lanes for __m256 {
    const LANES: usize = 8;
    type Idx = __m256i;
    type Table = Lut16;
    type Mids = Mids16;
    type Bad = __m256;

    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        // SAFETY: AVX2 (the trait's contract).
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: AVX2 (the trait's contract).
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: AVX2 (the trait's contract).
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: AVX2 (the trait's contract).
        unsafe { _mm256_storeu_ps(p, self) }
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        // SAFETY: AVX2 (the trait's contract).
        unsafe { _mm256_add_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn sub(self, o: Self) -> Self {
        // SAFETY: AVX2 (the trait's contract).
        unsafe { _mm256_sub_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        // SAFETY: AVX2 (the trait's contract).
        unsafe { _mm256_mul_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn div(self, o: Self) -> Self {
        // SAFETY: AVX2 (the trait's contract).
        unsafe { _mm256_div_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn sqrt(self) -> Self {
        // SAFETY: AVX2 (the trait's contract).
        unsafe { _mm256_sqrt_ps(self) }
    }
    #[inline(always)]
    unsafe fn max(self, o: Self) -> Self {
        // SAFETY: AVX2 (the trait's contract).
        unsafe { _mm256_max_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn abs(self) -> Self {
        // SAFETY: AVX2 (the trait's contract).
        unsafe { _mm256_and_ps(self, _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX))) }
    }
    #[inline(always)]
    unsafe fn hmax(self) -> f32 {
        // SAFETY: AVX2 (the trait's contract).
        unsafe {
            let m = _mm_max_ps(
                _mm256_castps256_ps128(self),
                _mm256_extractf128_ps::<1>(self),
            );
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
            _mm_cvtss_f32(m)
        }
    }

    #[inline(always)]
    unsafe fn table(t: &[f32; 16]) -> Lut16 {
        // SAFETY: AVX2 (the trait's contract); `t` holds 16 readable f32.
        unsafe {
            Lut16 {
                lo: _mm256_loadu_ps(t.as_ptr()),
                hi: _mm256_loadu_ps(t.as_ptr().add(8)),
            }
        }
    }
    #[inline(always)]
    unsafe fn lookup(t: Lut16, idx: __m256i) -> Self {
        // SAFETY: AVX2 (the trait's contract).
        unsafe { t.get(idx, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(idx))) }
    }
    #[inline(always)]
    unsafe fn mids(t: &[f32; 16]) -> Mids16 {
        // SAFETY: AVX2 (the trait's contract).
        unsafe {
            Mids16 {
                quarters: [t[3], t[7], t[11]].map(|m| _mm256_set1_ps(m)),
                first: _mm256_setr_ps(t[0], t[4], t[8], t[12], t[1], t[5], t[9], t[13]),
                third: _mm256_setr_ps(t[2], t[6], t[10], t[14], 0.0, 0.0, 0.0, 0.0),
            }
        }
    }
    #[inline(always)]
    unsafe fn search16(m: Mids16, x: Self) -> __m256i {
        // A true compare is -1 in every bit: subtracting it counts it.
        // SAFETY: AVX2 (the trait's contract).
        unsafe {
            let below = |mid: __m256| _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(x, mid));
            let mut q = _mm256_setzero_si256();
            for mid in m.quarters {
                q = _mm256_sub_epi32(q, below(mid));
            }
            let second = _mm256_add_epi32(q, _mm256_set1_epi32(4));
            let mut idx = _mm256_slli_epi32::<2>(q);
            idx = _mm256_sub_epi32(idx, below(_mm256_permutevar8x32_ps(m.first, q)));
            idx = _mm256_sub_epi32(idx, below(_mm256_permutevar8x32_ps(m.first, second)));
            _mm256_sub_epi32(idx, below(_mm256_permutevar8x32_ps(m.third, q)))
        }
    }
    #[inline(always)]
    unsafe fn search_uniform(x: Self) -> __m256i {
        // SAFETY: AVX2 (the trait's contract).
        unsafe {
            let t = _mm256_sub_ps(_mm256_mul_ps(x, _mm256_set1_ps(16.0)), _mm256_set1_ps(1.5));
            let c = _mm256_round_ps::<{ _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC }>(t);
            let c = _mm256_min_ps(_mm256_max_ps(c, _mm256_setzero_ps()), _mm256_set1_ps(15.0));
            _mm256_cvttps_epi32(c)
        }
    }
    #[inline(always)]
    unsafe fn load_nibbles(p: *const u8) -> __m256i {
        // SAFETY: AVX2 (the trait's contract); 4 readable bytes at `p`.
        unsafe {
            let b = _mm_cvtsi32_si128(i32::from_le_bytes(p.cast::<[u8; 4]>().read_unaligned()));
            let q = _mm256_cvtepu8_epi64(b);
            let lo = _mm256_and_si256(q, _mm256_set1_epi64x(15));
            let hi = _mm256_slli_epi64::<32>(_mm256_srli_epi64::<4>(q));
            _mm256_or_si256(lo, hi)
        }
    }
    #[inline(always)]
    unsafe fn store_nibbles(idx: __m256i, p: *mut u8) {
        // SAFETY: AVX2 (the trait's contract); 4 writable bytes at `p`.
        unsafe {
            // Each 64-bit lane: even code in bits 0..4, odd code in bits 4..8.
            let q = _mm256_or_si256(idx, _mm256_srli_epi64::<28>(idx));
            // Bytes 0 and 8 of the low 128 bits to bytes 0, 1; of the high to 2, 3.
            let sel = _mm256_setr_epi8(
                0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, //
                -1, -1, 0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
            );
            let s = _mm256_shuffle_epi8(q, sel);
            let b = _mm_or_si128(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
            p.cast::<[u8; 4]>()
                .write_unaligned(_mm_cvtsi128_si32(b).to_le_bytes());
        }
    }
    #[inline(always)]
    unsafe fn gather256(t: &[f32; 256], codes: *const u8) -> Self {
        // SAFETY: AVX2 (the trait's contract); 8 readable bytes at `codes`; byte indices stay inside the table.
        unsafe {
            let idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(codes as *const __m128i));
            _mm256_i32gather_ps::<4>(t.as_ptr(), idx)
        }
    }
    #[inline(always)]
    unsafe fn search256(mids: &[f32; 256], x: Self) -> __m256i {
        // SAFETY: AVX2 (the trait's contract); gather indices stay in 0..=254 (at most 2^8 - 1 minus one).
        unsafe {
            let mut idx = _mm256_setzero_si256();
            for shift in (0..8).rev() {
                let step = _mm256_set1_epi32(1 << shift);
                let at = _mm256_sub_epi32(_mm256_add_epi32(idx, step), _mm256_set1_epi32(1));
                let mid = _mm256_i32gather_ps::<4>(mids.as_ptr(), at);
                let gt = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(x, mid));
                idx = _mm256_add_epi32(idx, _mm256_and_si256(gt, step));
            }
            idx
        }
    }
    #[inline(always)]
    unsafe fn store_bytes(idx: __m256i, p: *mut u8) {
        // SAFETY: AVX2 (the trait's contract); 8 writable bytes at `p`.
        unsafe {
            // Byte 0 of each i32 to bytes 0..4 of each 128-bit half, then
            // the halves' first dwords side by side.
            let sel = _mm256_setr_epi8(
                0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, //
                0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
            );
            let b = _mm256_permutevar8x32_epi32(
                _mm256_shuffle_epi8(idx, sel),
                _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0),
            );
            _mm_storel_epi64(p as *mut __m128i, _mm256_castsi256_si128(b));
        }
    }

    #[inline(always)]
    unsafe fn no_bad() -> __m256 {
        // SAFETY: AVX2 (the trait's contract).
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn add_bad(bad: __m256, x: Self) -> __m256 {
        // NaN compares unordered: NLT_UQ is true for NaN and for |x| >= inf.
        // SAFETY: AVX2 (the trait's contract).
        unsafe {
            _mm256_or_ps(
                bad,
                _mm256_cmp_ps::<_CMP_NLT_UQ>(x.abs(), _mm256_set1_ps(f32::INFINITY)),
            )
        }
    }
    #[inline(always)]
    unsafe fn none_bad(bad: __m256) -> bool {
        // SAFETY: AVX2 (the trait's contract).
        unsafe { _mm256_movemask_ps(bad) == 0 }
    }

    #[inline(always)]
    unsafe fn load_i8(p: *const i8) -> Self {
        // SAFETY: AVX2, and `p` holds 8 bytes, which `_mm_loadl_epi64` reads.
        unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()))) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: the caller guarantees FMA.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    /// The two 128-bit halves added, then the high pair onto the low pair,
    /// then lane 1 onto lane 0.
    #[inline(always)]
    unsafe fn hsum(self) -> f32 {
        // SAFETY: the caller guarantees AVX2.
        unsafe {
            let s = _mm_add_ps(
                _mm256_castps256_ps128(self),
                _mm256_extractf128_ps::<1>(self),
            );
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }
}
