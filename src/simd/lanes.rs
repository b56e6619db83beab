//! One vector of f32 lanes as a trait, for kernel bodies written once and
//! compiled for AVX2 and AVX-512 (the pattern of memchr's `Vector`).
//!
//! A kernel body generic over [`F32Lanes`] is `#[inline(always)]`; each
//! per-ISA file instantiates it inside its own `#[target_feature]` function,
//! which takes the proof token. Every method here is `#[inline(always)]`, so
//! in that function it becomes the one instruction it names (outside such a
//! function it would not inline, so no such call is written).

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

/// The operations on one vector of f32 that the kernels share. Every method
/// is `unsafe`: the CPU must have the implementing type's instruction set
/// (AVX2 + FMA for `__m256`, AVX-512 F for `__m512`), and a method taking a
/// pointer reads or writes `LANES` elements through it.
pub(crate) trait F32Lanes: Copy {
    /// f32 lanes per vector.
    const LANES: usize;

    /// All lanes zero.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn zero() -> Self;

    /// All lanes `v`.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn splat(v: f32) -> Self;

    /// `LANES` floats from `p`, unaligned.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn load(p: *const f32) -> Self;

    /// `LANES` floats to `p`, unaligned.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn store(self, p: *mut f32);

    /// `LANES` signed bytes from `p`, each converted to f32 (exact).
    ///
    /// # Safety
    /// See the trait.
    unsafe fn load_i8(p: *const i8) -> Self;

    /// `a * b + c`, one rounding.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self;

    /// Lane-wise `a + b`.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn add(a: Self, b: Self) -> Self;

    /// The sum of the lanes, in the fixed order of the implementation.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn hsum(self) -> f32;
}

impl F32Lanes for __m256 {
    const LANES: usize = 8;

    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the caller guarantees AVX2 (see the trait).
        unsafe { _mm256_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        // SAFETY: as above.
        unsafe { _mm256_set1_ps(v) }
    }

    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: AVX2, and `p` holds 8 floats (the caller).
        unsafe { _mm256_loadu_ps(p) }
    }

    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: AVX2, and `p` holds 8 floats (the caller).
        unsafe { _mm256_storeu_ps(p, self) }
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

    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        // SAFETY: the caller guarantees AVX2.
        unsafe { _mm256_add_ps(a, b) }
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

impl F32Lanes for __m512 {
    const LANES: usize = 16;

    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the caller guarantees AVX-512 F (see the trait).
        unsafe { _mm512_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        // SAFETY: as above.
        unsafe { _mm512_set1_ps(v) }
    }

    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: AVX-512 F, and `p` holds 16 floats (the caller).
        unsafe { _mm512_loadu_ps(p) }
    }

    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: AVX-512 F, and `p` holds 16 floats (the caller).
        unsafe { _mm512_storeu_ps(p, self) }
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

    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        // SAFETY: the caller guarantees AVX-512 F.
        unsafe { _mm512_add_ps(a, b) }
    }

    /// In the order of `_mm512_reduce_add_ps`.
    #[inline(always)]
    unsafe fn hsum(self) -> f32 {
        // SAFETY: the caller guarantees AVX-512 F.
        unsafe { _mm512_reduce_add_ps(self) }
    }
}
