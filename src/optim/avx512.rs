//! AVX-512 twins of the two passes of `format.rs` (4-bit or int8 m,
//! per-block v scales). Each `unsafe fn` here is private; the `pub(super)`
//! wrappers take an [`Avx512`] token, the proof that the CPU runs them.
//!
//! A 16-entry code book fits one register: decoding is one `vpermps`, the
//! nearest-code search is a four-step binary search over the midpoints with
//! `vpermps` + compare + masked move. 16 elements per iteration, the block's
//! remainder through the scalar element code.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::format::{
    m_decode, m_encode, pass1_elements, pass2_elements, Codecs, MCodec, Pass1, Pass2, StepConsts,
    VScale,
};
use crate::simd::Avx512;

/// Prefetch distance of pass 1, in elements.
const PREFETCH: usize = 512;

/// 8 bytes of packed nibbles -> 16 i32 lane indices (element order).
#[inline(always)]
unsafe fn unpack16(p: *const u8) -> __m512i {
    // SAFETY: the caller guarantees 8 readable bytes at `p` and AVX-512 F/BW/VL.
    unsafe {
        let q = _mm512_cvtepu8_epi64(_mm_loadl_epi64(p as *const __m128i));
        let lo = _mm512_and_si512(q, _mm512_set1_epi64(15));
        let hi = _mm512_slli_epi64(_mm512_srli_epi64(q, 4), 32);
        _mm512_or_si512(lo, hi)
    }
}

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

/// Nearest codes of 16 normalized values on the uniform `{k/16 : k = 1..16}`
/// map: `clamp(ceil(16x - 1.5), 0, 15)`. Equal to the midpoint search: the
/// midpoints are `(2k + 3) / 32`, `16x` is exact, and `16x - 1.5` is exact
/// whenever `16x >= 0.75` (and negative otherwise), so `x > mid_k` iff
/// `k < 16x - 1.5`. Tested bit for bit against the scalar reference.
#[inline(always)]
unsafe fn encode16_uniform(x: __m512) -> __m512i {
    // SAFETY: the caller runs with AVX-512 F enabled.
    unsafe {
        let t = _mm512_sub_ps(_mm512_mul_ps(x, _mm512_set1_ps(16.0)), _mm512_set1_ps(1.5));
        let c = _mm512_roundscale_ps::<{ _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC }>(t);
        let c = _mm512_min_ps(_mm512_max_ps(c, _mm512_setzero_ps()), _mm512_set1_ps(15.0));
        _mm512_cvttps_epi32(c)
    }
}

/// Encode 16 v values at `src`, normalized by `inv`.
#[inline(always)]
unsafe fn enc16_v(src: *const f32, inv: __m512, mids: __m512, uniform: bool) -> __m512i {
    // SAFETY: the caller guarantees 16 readable f32 at `src` and AVX-512 F.
    unsafe {
        let x = _mm512_mul_ps(_mm512_loadu_ps(src), inv);
        if uniform {
            encode16_uniform(x)
        } else {
            encode16(x, mids)
        }
    }
}

/// 2 x 16 codes -> one 16-byte store (a narrowing store per 8 bytes is
/// microcoded and slow on some cores).
#[inline(always)]
unsafe fn store32(a: __m512i, b: __m512i, p: *mut u8) {
    // SAFETY: the caller guarantees 16 writable bytes at `p` and AVX-512 F/BW/VL.
    unsafe {
        _mm_storeu_si128(p as *mut __m128i, _mm_unpacklo_epi64(pack16(a), pack16(b)));
    }
}

/// Lane-wise nearest code: the number of midpoints strictly below `x`.
#[inline(always)]
unsafe fn encode16(x: __m512, mids: __m512) -> __m512i {
    // SAFETY: the caller runs with AVX-512 F enabled.
    unsafe {
        let mut idx = _mm512_setzero_si512();
        for step in [8, 4, 2, 1] {
            let cand = _mm512_add_epi32(idx, _mm512_set1_epi32(step));
            let mid = _mm512_permutexvar_ps(_mm512_sub_epi32(cand, _mm512_set1_epi32(1)), mids);
            let gt = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, mid);
            idx = _mm512_mask_mov_epi32(idx, gt, cand);
        }
        idx
    }
}

/// The m code book as the kernels see it: a 16-entry register, or the
/// 256-entry int8 table (gathers).
#[derive(Clone, Copy)]
enum MLut<'a> {
    Four(__m512, __m512),
    Eight(&'a [f32; 256], &'a [f32; 256]),
}

impl MLut<'_> {
    #[inline(always)]
    unsafe fn new(m: &MCodec) -> MLut<'_> {
        match m {
            // SAFETY: the caller runs with AVX-512 F; each table holds 16 f32.
            MCodec::Four(cb) => unsafe {
                MLut::Four(
                    _mm512_loadu_ps(cb.values.as_ptr()),
                    _mm512_loadu_ps(cb.mids.as_ptr()),
                )
            },
            MCodec::Eight(cb) => MLut::Eight(&cb.values, &cb.mids),
        }
    }

    /// Decoded (unscaled) m of elements `e..e + 16`.
    #[inline(always)]
    unsafe fn decode16(self, codes: &[u8], e: usize) -> __m512 {
        // SAFETY: the caller guarantees `e + 16` elements of codes (8 bytes
        // of nibbles at `e / 2`, or 16 int8 codes at `e`) and AVX-512 F/BW/VL;
        // int8 gather indices are bytes, inside the 256-entry table.
        unsafe {
            match self {
                MLut::Four(lut, _) => {
                    _mm512_permutexvar_ps(unpack16(codes.as_ptr().add(e / 2)), lut)
                }
                MLut::Eight(values, _) => {
                    let idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                        codes.as_ptr().add(e) as *const __m128i
                    ));
                    _mm512_i32gather_ps::<4>(idx, values.as_ptr())
                }
            }
        }
    }

    /// Nearest codes of 16 normalized values.
    #[inline(always)]
    unsafe fn encode16(self, x: __m512) -> __m512i {
        // SAFETY: the caller runs with AVX-512 F; the int8 search's gather
        // indices stay in 0..=254 (at most 2^8 - 1 minus one).
        unsafe {
            match self {
                MLut::Four(_, mids) => encode16(x, mids),
                MLut::Eight(_, mids) => {
                    let mut idx = _mm512_setzero_si512();
                    for shift in (0..8).rev() {
                        let step = _mm512_set1_epi32(1 << shift);
                        let at =
                            _mm512_add_epi32(idx, _mm512_sub_epi32(step, _mm512_set1_epi32(1)));
                        let mid = _mm512_i32gather_ps::<4>(at, mids.as_ptr());
                        let gt = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, mid);
                        idx = _mm512_mask_add_epi32(idx, gt, idx, step);
                    }
                    idx
                }
            }
        }
    }
}

/// Pass 1 (see `format::pass1`) for per-block v scales.
pub(super) fn pass1(_proof: Avx512, k: &StepConsts, c: &Codecs, bs: usize, p: Pass1<'_>) {
    // SAFETY: the token proves AVX-512 F/BW/VL, AVX2 and FMA; `pass1_impl`
    // checks every slice length it relies on.
    unsafe { pass1_impl(k, c, bs, p) }
}

/// # Safety
/// The CPU must support AVX-512 F/BW/VL, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn pass1_impl(k: &StepConsts, c: &Codecs, bs: usize, mut p: Pass1<'_>) {
    let VScale::Block(v_scale) = p.v_scale else {
        unreachable!("pass1 avx512: block scales only")
    };
    let n = p.w.len();
    let m_bytes = if matches!(c.m, MCodec::Eight(_)) {
        n
    } else {
        n.div_ceil(2)
    };
    assert!(p.g.len() == n && p.sm.len() >= n && p.su.len() >= n);
    assert!(p.m_codes.len() >= m_bytes && p.v_codes.len() * 2 >= n);
    // SAFETY: the features are enabled (this function's contract); every
    // load and store below is bounded by `e + 16 <= end <= n` and the
    // lengths asserted above (the code slices hold n / 2 bytes, e is even).
    unsafe {
        let mlut = MLut::new(&c.m);
        let lut_v = _mm512_loadu_ps(c.v.values.as_ptr());
        let (b1, b2) = (_mm512_set1_ps(k.b1), _mm512_set1_ps(k.b2));
        let (omb1, omb2) = (_mm512_set1_ps(k.omb1), _mm512_set1_ps(k.omb2));
        let (isb2, eps) = (_mm512_set1_ps(k.inv_sqrt_bc2), _mm512_set1_ps(k.eps));
        let (step, lr_wd, l2) = (
            _mm512_set1_ps(k.step_size),
            _mm512_set1_ps(k.lr_wd),
            _mm512_set1_ps(k.l2),
        );
        for (b, start) in (0..n).step_by(bs).enumerate() {
            let end = (start + bs).min(n);
            let (sm, sv) = (_mm512_set1_ps(p.m_scale[b]), _mm512_set1_ps(v_scale[b]));
            let (mut am, mut au) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            let mut e = start;
            while e + 16 <= end {
                let m_hat = _mm512_mul_ps(mlut.decode16(p.m_codes, e), sm);
                let mut v_hat = _mm512_mul_ps(
                    _mm512_permutexvar_ps(unpack16(p.v_codes.as_ptr().add(e / 2)), lut_v),
                    sv,
                );
                if c.sqrt_domain {
                    v_hat = _mm512_mul_ps(v_hat, v_hat);
                }
                // Two streams from DRAM: ask for them 2 KiB ahead (a hint; the
                // address may lie past the slice, so it is formed with wrapping_add).
                _mm_prefetch::<_MM_HINT_T0>(p.w.as_ptr().wrapping_add(e + PREFETCH) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(p.g.as_ptr().wrapping_add(e + PREFETCH) as *const i8);
                let w = _mm512_loadu_ps(p.w.as_ptr().add(e));
                let g = _mm512_loadu_ps(p.g.as_ptr().add(e));
                let gp = _mm512_add_ps(g, _mm512_mul_ps(l2, w));
                let m = _mm512_add_ps(_mm512_mul_ps(b1, m_hat), _mm512_mul_ps(omb1, gp));
                let v = _mm512_add_ps(
                    _mm512_mul_ps(b2, v_hat),
                    _mm512_mul_ps(omb2, _mm512_mul_ps(gp, gp)),
                );
                let r = _mm512_sqrt_ps(v);
                let denom = _mm512_add_ps(_mm512_mul_ps(r, isb2), eps);
                let wn = _mm512_sub_ps(
                    _mm512_sub_ps(w, _mm512_mul_ps(lr_wd, w)),
                    _mm512_div_ps(_mm512_mul_ps(step, m), denom),
                );
                let u = if c.sqrt_domain { r } else { v };
                _mm512_storeu_ps(p.w.as_mut_ptr().add(e), wn);
                _mm512_storeu_ps(p.sm.as_mut_ptr().add(e), m);
                _mm512_storeu_ps(p.su.as_mut_ptr().add(e), u);
                am = _mm512_max_ps(am, _mm512_abs_ps(m));
                au = _mm512_max_ps(au, u);
                e += 16;
            }
            let acc = (_mm512_reduce_max_ps(am), _mm512_reduce_max_ps(au));
            let (am_s, au_s) = pass1_elements(
                k,
                c,
                &mut p,
                b,
                e..end,
                |m, e| m_decode(&c.m, m, e),
                |b, _| v_scale[b],
                acc,
            );
            p.m_absmax[b] = am_s;
            p.u_max[b] = au_s;
        }
    }
}

/// Pass 2 (see `format::pass2`) for per-block v scales.
pub(super) fn pass2(_proof: Avx512, c: &Codecs, bs: usize, p: Pass2<'_>) {
    // SAFETY: the token proves AVX-512 F/BW/VL, AVX2 and FMA; `pass2_impl`
    // checks every slice length it relies on.
    unsafe { pass2_impl(c, bs, p) }
}

/// # Safety
/// The CPU must support AVX-512 F/BW/VL, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn pass2_impl(c: &Codecs, bs: usize, mut p: Pass2<'_>) {
    let VScale::Block(v_inv) = p.v_inv else {
        unreachable!("pass2 avx512: block scales only")
    };
    let n = p.sm.len();
    let eight = matches!(c.m, MCodec::Eight(_));
    let m_bytes = if eight { n } else { n.div_ceil(2) };
    assert!(p.su.len() == n && p.m_codes.len() >= m_bytes && p.v_codes.len() * 2 >= n);
    let uniform = (0..16).all(|k| c.v.values[k] == (k + 1) as f32 / 16.0);
    // SAFETY: the features are enabled (this function's contract); the loops
    // bound every load by `e + 16 <= end <= n` (or `e + 32`) and every store
    // by the code lengths asserted above (int8: bytes e..e + 16; nibbles:
    // bytes e/2..e/2 + 8, or + 16 in the two-vector loop).
    unsafe {
        let mlut = MLut::new(&c.m);
        let mids_v = _mm512_loadu_ps(c.v.mids.as_ptr());
        for (b, start) in (0..n).step_by(bs).enumerate() {
            let end = (start + bs).min(n);
            let (im, iv) = (_mm512_set1_ps(p.m_inv[b]), _mm512_set1_ps(v_inv[b]));
            let mut e = start;
            while eight && e + 16 <= end {
                let xm = _mm512_mul_ps(_mm512_loadu_ps(p.sm.as_ptr().add(e)), im);
                let bm = _mm512_cvtepi32_epi8(mlut.encode16(xm));
                _mm_storeu_si128(p.m_codes.as_mut_ptr().add(e) as *mut __m128i, bm);
                let bv = pack16(enc16_v(p.su.as_ptr().add(e), iv, mids_v, uniform));
                _mm_storel_epi64(p.v_codes.as_mut_ptr().add(e / 2) as *mut __m128i, bv);
                e += 16;
            }
            while !eight && e + 32 <= end {
                let (m0, m1) = (
                    mlut.encode16(_mm512_mul_ps(_mm512_loadu_ps(p.sm.as_ptr().add(e)), im)),
                    mlut.encode16(_mm512_mul_ps(
                        _mm512_loadu_ps(p.sm.as_ptr().add(e + 16)),
                        im,
                    )),
                );
                store32(m0, m1, p.m_codes.as_mut_ptr().add(e / 2));
                let (v0, v1) = (
                    enc16_v(p.su.as_ptr().add(e), iv, mids_v, uniform),
                    enc16_v(p.su.as_ptr().add(e + 16), iv, mids_v, uniform),
                );
                store32(v0, v1, p.v_codes.as_mut_ptr().add(e / 2));
                e += 32;
            }
            while !eight && e + 16 <= end {
                let bm =
                    pack16(mlut.encode16(_mm512_mul_ps(_mm512_loadu_ps(p.sm.as_ptr().add(e)), im)));
                _mm_storel_epi64(p.m_codes.as_mut_ptr().add(e / 2) as *mut __m128i, bm);
                let bv = pack16(enc16_v(p.su.as_ptr().add(e), iv, mids_v, uniform));
                _mm_storel_epi64(p.v_codes.as_mut_ptr().add(e / 2) as *mut __m128i, bv);
                e += 16;
            }
            pass2_elements(
                c,
                &mut p,
                b,
                e..end,
                |m, e, x| m_encode(&c.m, m, e, x),
                |b, _| v_inv[b],
            );
        }
    }
}

/// True when every value is finite (16 lanes per compare).
pub(super) fn all_finite(_proof: Avx512, x: &[f32]) -> bool {
    // SAFETY: the token proves AVX-512 F.
    unsafe { all_finite_impl(x) }
}

/// # Safety
/// The CPU must support AVX-512 F.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn all_finite_impl(x: &[f32]) -> bool {
    let inf = _mm512_set1_ps(f32::INFINITY);
    let mut bad: __mmask16 = 0;
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        // SAFETY: `c` holds exactly 16 values.
        let v = _mm512_abs_ps(unsafe { _mm512_loadu_ps(c.as_ptr()) });
        // NaN compares unordered: NLT_UQ is true for NaN and for |v| >= inf.
        bad |= _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(v, inf);
    }
    bad == 0 && chunks.remainder().iter().all(|v| v.is_finite())
}
