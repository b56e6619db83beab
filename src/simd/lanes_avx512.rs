//! [`F32Lanes`] for AVX-512 F/BW/VL (`__m512`, 16 lanes).
//!
//! A 16-entry code book fits one register: decoding is one `vpermps`, the
//! nearest-code search is a four-step binary search over the midpoints
//! (`Mids16`). The int8 m code book (256 entries) is read with gathers.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::lanes::F32Lanes;

/// 16 i32 codes (< 16) -> 8 bytes of packed nibbles, in the low half.
#[inline(always)]
unsafe fn pack16(idx: __m512i) -> __m128i {
    // SAFETY: the caller runs with AVX-512 F/BW/VL enabled.
    unsafe {
        let lo = _mm512_and_si512(idx, _mm512_set1_epi64(15));
        let hi = _mm512_slli_epi64(_mm512_srli_epi64(idx, 32), 4);
        _mm512_cvtepi64_epi8(_mm512_or_si512(lo, hi))
    }
}

/// The midpoints for the four-step search: `m7` (all lanes `mids[7]`, the
/// first compare) and, for the steps of 4, 2 and 1, tables indexed by the
/// code so far: `t[s][j] = mids[min(j + s - 1, 15)]`, so each step is one
/// permute, one compare and one masked add (the compares of
/// `Codebook16::encode`, in its order).
#[derive(Clone, Copy)]
pub(crate) struct Mids16 {
    m7: __m512,
    t4: __m512,
    t2: __m512,
    t1: __m512,
}

impl F32Lanes for __m512 {
    const LANES: usize = 16;
    type Idx = __m512i;
    type Table = __m512;
    type Mids = Mids16;
    type Bad = __mmask16;

    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract).
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract).
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract).
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract).
        unsafe { _mm512_storeu_ps(p, self) }
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract).
        unsafe { _mm512_add_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn sub(self, o: Self) -> Self {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract).
        unsafe { _mm512_sub_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract).
        unsafe { _mm512_mul_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn div(self, o: Self) -> Self {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract).
        unsafe { _mm512_div_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn sqrt(self) -> Self {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract).
        unsafe { _mm512_sqrt_ps(self) }
    }
    #[inline(always)]
    unsafe fn max(self, o: Self) -> Self {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract).
        unsafe { _mm512_max_ps(self, o) }
    }
    #[inline(always)]
    unsafe fn abs(self) -> Self {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract).
        unsafe { _mm512_abs_ps(self) }
    }
    #[inline(always)]
    unsafe fn hmax(self) -> f32 {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract).
        unsafe { _mm512_reduce_max_ps(self) }
    }

    #[inline(always)]
    unsafe fn table(t: &[f32; 16]) -> __m512 {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract); `t` holds 16 readable f32.
        unsafe { _mm512_loadu_ps(t.as_ptr()) }
    }
    #[inline(always)]
    unsafe fn lookup(t: __m512, idx: __m512i) -> Self {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract).
        unsafe { _mm512_permutexvar_ps(idx, t) }
    }
    #[inline(always)]
    unsafe fn mids(t: &[f32; 16]) -> Mids16 {
        let shifted = |s: usize| {
            let mut o = [0f32; 16];
            for (j, x) in o.iter_mut().enumerate() {
                *x = t[(j + s - 1).min(15)];
            }
            o
        };
        let (t4, t2) = (shifted(4), shifted(2));
        // SAFETY: AVX-512 F/BW/VL (the trait's contract); each array holds 16 f32.
        unsafe {
            Mids16 {
                m7: _mm512_set1_ps(t[7]),
                t4: _mm512_loadu_ps(t4.as_ptr()),
                t2: _mm512_loadu_ps(t2.as_ptr()),
                t1: _mm512_loadu_ps(t.as_ptr()),
            }
        }
    }
    #[inline(always)]
    unsafe fn search16(m: Mids16, x: Self) -> __m512i {
        // The number of midpoints strictly below `x`.
        // SAFETY: AVX-512 F/BW/VL (the trait's contract).
        unsafe {
            let gt = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, m.m7);
            let mut idx = _mm512_maskz_mov_epi32(gt, _mm512_set1_epi32(8));
            for (t, step) in [(m.t4, 4), (m.t2, 2), (m.t1, 1)] {
                let gt = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_permutexvar_ps(idx, t));
                idx = _mm512_mask_add_epi32(idx, gt, idx, _mm512_set1_epi32(step));
            }
            idx
        }
    }
    #[inline(always)]
    unsafe fn search_uniform(x: Self) -> __m512i {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract).
        unsafe {
            let t = _mm512_sub_ps(_mm512_mul_ps(x, _mm512_set1_ps(16.0)), _mm512_set1_ps(1.5));
            let c = _mm512_roundscale_ps::<{ _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC }>(t);
            let c = _mm512_min_ps(_mm512_max_ps(c, _mm512_setzero_ps()), _mm512_set1_ps(15.0));
            _mm512_cvttps_epi32(c)
        }
    }
    #[inline(always)]
    unsafe fn load_nibbles(p: *const u8) -> __m512i {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract); 8 readable bytes at `p`.
        unsafe {
            let q = _mm512_cvtepu8_epi64(_mm_loadl_epi64(p as *const __m128i));
            let lo = _mm512_and_si512(q, _mm512_set1_epi64(15));
            let hi = _mm512_slli_epi64(_mm512_srli_epi64(q, 4), 32);
            _mm512_or_si512(lo, hi)
        }
    }
    #[inline(always)]
    unsafe fn store_nibbles(idx: __m512i, p: *mut u8) {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract); 8 writable bytes at `p`.
        unsafe { _mm_storel_epi64(p as *mut __m128i, pack16(idx)) }
    }
    #[inline(always)]
    unsafe fn store_nibbles2(a: __m512i, b: __m512i, p: *mut u8) {
        // One 16-byte store: a narrowing store per 8 bytes is microcoded
        // and slow on some cores.
        // SAFETY: AVX-512 F/BW/VL (the trait's contract); 16 writable bytes at `p`.
        unsafe { _mm_storeu_si128(p as *mut __m128i, _mm_unpacklo_epi64(pack16(a), pack16(b))) }
    }
    #[inline(always)]
    unsafe fn gather256(t: &[f32; 256], codes: *const u8) -> Self {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract); 16 readable bytes at `codes`; byte indices stay inside the table.
        unsafe {
            let idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(codes as *const __m128i));
            _mm512_i32gather_ps::<4>(idx, t.as_ptr())
        }
    }
    #[inline(always)]
    unsafe fn search256(mids: &[f32; 256], x: Self) -> __m512i {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract); gather indices stay in 0..=254 (at most 2^8 - 1 minus one).
        unsafe {
            let mut idx = _mm512_setzero_si512();
            for shift in (0..8).rev() {
                let step = _mm512_set1_epi32(1 << shift);
                let at = _mm512_add_epi32(idx, _mm512_sub_epi32(step, _mm512_set1_epi32(1)));
                let mid = _mm512_i32gather_ps::<4>(at, mids.as_ptr());
                let gt = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, mid);
                idx = _mm512_mask_add_epi32(idx, gt, idx, step);
            }
            idx
        }
    }
    #[inline(always)]
    unsafe fn store_bytes(idx: __m512i, p: *mut u8) {
        // SAFETY: AVX-512 F/BW/VL (the trait's contract); 16 writable bytes at `p`.
        unsafe { _mm_storeu_si128(p as *mut __m128i, _mm512_cvtepi32_epi8(idx)) }
    }

    #[inline(always)]
    unsafe fn no_bad() -> __mmask16 {
        0
    }
    #[inline(always)]
    unsafe fn add_bad(bad: __mmask16, x: Self) -> __mmask16 {
        // NaN compares unordered: NLT_UQ is true for NaN and for |x| >= inf.
        // SAFETY: AVX-512 F/BW/VL (the trait's contract).
        unsafe {
            bad | _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(_mm512_abs_ps(x), _mm512_set1_ps(f32::INFINITY))
        }
    }
    #[inline(always)]
    unsafe fn none_bad(bad: __mmask16) -> bool {
        bad == 0
    }

    #[inline(always)]
    unsafe fn load_i8(p: *const i8) -> Self {
        // SAFETY: AVX-512 F, and `p` holds 16 bytes (the caller).
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()))) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: the caller guarantees AVX-512 F.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    /// In the order of `_mm512_reduce_add_ps`.
    #[inline(always)]
    unsafe fn hsum(self) -> f32 {
        // SAFETY: the caller guarantees AVX-512 F.
        unsafe { _mm512_reduce_add_ps(self) }
    }
}
