//! AVX-512 twin of the row layout's scale encoder (`direct.rs`), 16
//! blocks a vector: a row of GPT-2 (12 blocks) is one masked vector, so
//! the codec costs a few instructions per block instead of a scalar
//! search each. The codes and decoded scales are the scalar ones bit for
//! bit: the same guess, the same window of four codes read with gathers,
//! and the scalar walk for any lane the window misses; v's unbiased
//! rounding draws the same splitmix64 numbers, eight 64-bit lanes at a
//! time (AVX-512 DQ's `vpmullq`; the body is compiled with DQ, so both
//! entry points take the DQ token). Each `unsafe fn` is private; the
//! `pub(super)` wrappers take the token that proves the CPU runs it.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::coin::Dither;
use super::direct::{grid, round_one};
use super::scalar::ZERO_CODE;
use crate::simd::Avx512Dq;

/// `direct::encode`, 16 blocks a vector (see there).
pub(super) fn encode(_proof: Avx512Dq, s: &mut [f32], codes: &mut [u8]) -> f32 {
    // SAFETY: the token proves AVX-512 F/BW/VL and DQ (the body is compiled
    // for both); it bounds every access by `min(s.len(), codes.len())` and
    // clamps gather indices.
    unsafe { encode_impl(s, codes, None) }
}

/// `direct::encode_dithered`, 16 blocks a vector (see there).
pub(super) fn encode_dithered(_proof: Avx512Dq, s: &mut [f32], codes: &mut [u8], d: Dither) -> f32 {
    // SAFETY: the token proves AVX-512 F/BW/VL and DQ; as `encode`.
    unsafe { encode_impl(s, codes, Some(d)) }
}

/// splitmix64's finalizer on eight lanes (`optim::dither::splitmix64`).
///
/// # Safety
/// AVX-512 F and DQ.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn splitmix64(z: __m512i) -> __m512i {
    let z = _mm512_add_epi64(z, _mm512_set1_epi64(0x9E37_79B9_7F4A_7C15u64 as i64));
    let z = _mm512_mullo_epi64(
        _mm512_xor_si512(z, _mm512_srli_epi64::<30>(z)),
        _mm512_set1_epi64(0xBF58_476D_1CE4_E5B9u64 as i64),
    );
    let z = _mm512_mullo_epi64(
        _mm512_xor_si512(z, _mm512_srli_epi64::<27>(z)),
        _mm512_set1_epi64(0x94D0_49BB_1331_11EBu64 as i64),
    );
    _mm512_xor_si512(z, _mm512_srli_epi64::<31>(z))
}

/// The dither's uniform numbers of blocks `first + i .. first + i + 16`:
/// `(splitmix64(key ^ block) >> 40) * 2^-24`, exact in float32 (also the
/// flat layout's, `optim::dither_avx512`).
///
/// # Safety
/// AVX-512 F and DQ.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
pub(crate) unsafe fn uniforms(d: Dither, i: usize) -> __m512 {
    let lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    let base = _mm512_set1_epi64(d.first_block.wrapping_add(i as u64) as i64);
    let key = _mm512_set1_epi64(d.key as i64);
    let half = |off: i64| {
        let idx = _mm512_add_epi64(_mm512_add_epi64(base, lane), _mm512_set1_epi64(off));
        // SAFETY: this function's features include splitmix64's.
        let z = unsafe { splitmix64(_mm512_xor_si512(key, idx)) };
        // < 2^24: the int32 narrowing and the conversion are exact.
        _mm512_cvtepi64_epi32(_mm512_srli_epi64::<40>(z))
    };
    let (lo, hi) = (half(0), half(8));
    let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
    _mm512_mul_ps(_mm512_cvtepi32_ps(both), _mm512_set1_ps(1.0 / 16_777_216.0))
}

/// # Safety
/// AVX-512 F/BW/VL, and DQ when `dither` is given.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
unsafe fn encode_impl(s: &mut [f32], codes: &mut [u8], dither: Option<Dither>) -> f32 {
    let n = s.len().min(codes.len());
    let t = grid();
    let tail = |i: usize| -> __mmask16 {
        let left = n - i;
        if left >= 16 {
            0xffff
        } else {
            (1u16 << left) - 1
        }
    };
    let mut vmax = _mm512_setzero_ps();
    for i in (0..n).step_by(16) {
        // SAFETY: the load is masked to the lanes `i..n`, inside `s`.
        let x = unsafe { _mm512_maskz_loadu_ps(tail(i), s.as_ptr().add(i)) };
        vmax = _mm512_max_ps(vmax, x);
    }
    let max = _mm512_reduce_max_ps(vmax);
    let inv_max = if max > 0.0 { 1.0 / max } else { 0.0 };
    let (vm, vinv) = (_mm512_set1_ps(max), _mm512_set1_ps(inv_max));
    let (zero_i, one_i) = (_mm512_setzero_si512(), _mm512_set1_epi32(1));
    let last = _mm512_set1_epi32(254);
    for i in (0..n).step_by(16) {
        let k = tail(i);
        // SAFETY: the load is masked to the lanes `i..n`, inside `s`.
        let x = unsafe { _mm512_maskz_loadu_ps(k, s.as_ptr().add(i)) };
        // `direct::guess`: exponent plus mantissa minus one, times -8.
        let bits = _mm512_castps_si512(_mm512_mul_ps(x, vinv));
        let e = _mm512_sub_epi32(
            _mm512_and_si512(_mm512_srli_epi32::<23>(bits), _mm512_set1_epi32(0xff)),
            _mm512_set1_epi32(127),
        );
        let m = _mm512_castsi512_ps(_mm512_or_si512(
            _mm512_and_si512(bits, _mm512_set1_epi32(0x007f_ffff)),
            _mm512_set1_epi32(0x3f80_0000),
        ));
        let l = _mm512_add_ps(_mm512_cvtepi32_ps(e), _mm512_sub_ps(m, _mm512_set1_ps(1.0)));
        let g = _mm512_min_ps(
            _mm512_max_ps(_mm512_mul_ps(l, _mm512_set1_ps(-8.0)), _mm512_setzero_ps()),
            _mm512_set1_ps(254.0),
        );
        let c0 = _mm512_max_epi32(
            _mm512_sub_epi32(_mm512_cvttps_epi32(g), _mm512_set1_epi32(2)),
            zero_i,
        );
        // Code c0 + j holds x when it is a code (<= 254) and its scale is at least x.
        let holds = |j: i32| -> __mmask16 {
            let c = _mm512_add_epi32(c0, _mm512_set1_epi32(j));
            // SAFETY: gather indices are clamped to 0..=254, inside the 256-entry grid.
            let tv = unsafe { _mm512_i32gather_ps::<4>(_mm512_min_epi32(c, last), t.as_ptr()) };
            _mm512_cmp_epi32_mask::<_MM_CMPINT_LE>(c, last)
                & _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_mul_ps(vm, tv), x)
        };
        let (h0, h1, h2, h3) = (holds(0), holds(1), holds(2), holds(3));
        let mut code = c0;
        for h in [h1, h2, h3] {
            code = _mm512_mask_add_epi32(code, h, code, one_i);
        }
        let nonzero = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(x, _mm512_setzero_ps());
        code = _mm512_mask_mov_epi32(_mm512_set1_epi32(ZERO_CODE as i32), nonzero, code);
        // SAFETY: gather indices are clamped to 0..=254, inside the 256-entry grid.
        let tv = unsafe { _mm512_i32gather_ps::<4>(_mm512_min_epi32(code, last), t.as_ptr()) };
        let mut dec = _mm512_maskz_mul_ps(nonzero, vm, tv);
        if let Some(d) = dither {
            // `dither::dq_encode_dithered_direct`: down one code with the
            // probability that makes the decoded scale unbiased.
            let next = _mm512_min_epi32(_mm512_add_epi32(code, one_i), last);
            // SAFETY: gather indices are clamped to 0..=254, inside the 256-entry grid.
            let lo = _mm512_mul_ps(vm, unsafe { _mm512_i32gather_ps::<4>(next, t.as_ptr()) });
            let gap = _mm512_sub_ps(dec, lo);
            // SAFETY: this function's features include `uniforms`'.
            let u = unsafe { uniforms(d, i) };
            let down = _mm512_cmp_epi32_mask::<_MM_CMPINT_LT>(code, last)
                & _mm512_cmp_ps_mask::<_CMP_GT_OQ>(gap, _mm512_setzero_ps())
                & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_mul_ps(u, gap), _mm512_sub_ps(dec, x));
            code = _mm512_mask_add_epi32(code, down, code, one_i);
            dec = _mm512_mask_mov_ps(dec, down, lo);
        }
        // SAFETY: the stores are masked to the lanes `i..n`, inside `codes` and `s`.
        unsafe {
            _mm512_mask_cvtepi32_storeu_epi8(codes.as_mut_ptr().add(i) as *mut i8, k, code);
            _mm512_mask_storeu_ps(s.as_mut_ptr().add(i), k, dec);
        }
        // Lanes the window missed (never seen; kept exact by the scalar
        // code, then the same rounding as above).
        let mut miss = k & nonzero & (!h0 | (h1 & h2 & h3));
        while miss != 0 {
            let lane = miss.trailing_zeros() as usize;
            miss &= miss - 1;
            let j = i + lane;
            // `s[j]` now holds the lane's decoded scale; the original is in `x`.
            let mut xs = [0f32; 16];
            // SAFETY: `xs` holds 16 floats.
            unsafe { _mm512_storeu_ps(xs.as_mut_ptr(), x) };
            let (c, dec) = round_one(t, max, inv_max, xs[lane], dither, j);
            codes[j] = c;
            s[j] = dec;
        }
    }
    max
}
