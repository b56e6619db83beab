//! AVX2 twins of the two passes of `format.rs` for per-block v scales (4-bit
//! or int8 m), and of the finiteness check. Each `unsafe fn` here is
//! private; the `pub(super)` wrappers take an [`Avx2`] token, the proof that
//! the CPU runs them. Rank-1 v scales and the double-quantization search
//! stay on the scalar twins.
//!
//! A 16-entry code book takes two 8-lane registers: a look-up is two
//! `vpermps` (which read the index's low 3 bits) and a blend on bit 3; the
//! nearest-code search is the four-step binary search over the midpoints of
//! `Codebook16::encode`, lane-wise. The int8 m code book (256 entries) is
//! read with gathers, its search is the 8-step one of `Codebook256::encode`.
//! No FMA: the element math is the scalar
//! one, operation for operation, so results are bit-identical. 8 elements
//! per iteration, the block's remainder through the scalar element code.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::format::{
    m_decode, m_encode, pass1_elements, pass2_elements, Codecs, MCodec, Pass1, Pass2, StepConsts,
    VScale,
};
use crate::simd::Avx2;

/// Prefetch distance of pass 1, in elements.
const PREFETCH: usize = 512;

/// A 16-entry table as two 8-lane halves.
#[derive(Clone, Copy)]
struct Lut16 {
    lo: __m256,
    hi: __m256,
}

impl Lut16 {
    /// # Safety
    /// The CPU must support AVX.
    #[inline(always)]
    unsafe fn load(t: &[f32; 16]) -> Lut16 {
        // SAFETY: `t` holds 16 readable f32; AVX per this function's contract.
        unsafe {
            Lut16 {
                lo: _mm256_loadu_ps(t.as_ptr()),
                hi: _mm256_loadu_ps(t.as_ptr().add(8)),
            }
        }
    }

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

    /// `t[idx]` lane-wise for `idx` in 0..16.
    #[inline(always)]
    unsafe fn decode(self, idx: __m256i) -> __m256 {
        // SAFETY: the caller runs with AVX2 enabled.
        unsafe { self.get(idx, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(idx))) }
    }

    /// Lane-wise nearest code (`self` holds the midpoints): the branch-free
    /// binary search of `Codebook16::encode`, the same compares.
    #[inline(always)]
    unsafe fn encode(self, x: __m256) -> __m256i {
        // SAFETY: the caller runs with AVX2 enabled.
        unsafe {
            // Step 8: mids[7]; its mask also selects the half for the rest.
            let gt8 = _mm256_cmp_ps::<_CMP_GT_OQ>(
                x,
                _mm256_permutevar8x32_ps(self.lo, _mm256_set1_epi32(7)),
            );
            let mut idx = _mm256_and_si256(_mm256_castps_si256(gt8), _mm256_set1_epi32(8));
            for (step, off) in [(4, 3), (2, 1), (1, 0)] {
                let mid = self.get(_mm256_add_epi32(idx, _mm256_set1_epi32(off)), gt8);
                let gt = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(x, mid));
                idx = _mm256_add_epi32(idx, _mm256_and_si256(gt, _mm256_set1_epi32(step)));
            }
            idx
        }
    }
}

/// 4 bytes of packed nibbles -> 8 i32 lane indices (element order).
#[inline(always)]
unsafe fn unpack8(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 4 readable bytes at `p` and AVX2.
    unsafe {
        let b = _mm_cvtsi32_si128(i32::from_le_bytes(p.cast::<[u8; 4]>().read_unaligned()));
        let q = _mm256_cvtepu8_epi64(b);
        let lo = _mm256_and_si256(q, _mm256_set1_epi64x(15));
        let hi = _mm256_slli_epi64::<32>(_mm256_srli_epi64::<4>(q));
        _mm256_or_si256(lo, hi)
    }
}

/// 8 i32 codes (< 16) -> 4 bytes of packed nibbles, stored at `p`.
#[inline(always)]
unsafe fn pack8_store(idx: __m256i, p: *mut u8) {
    // SAFETY: the caller guarantees 4 writable bytes at `p` and AVX2.
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

/// Nearest codes on the uniform `{k/16 : k = 1..16}` map:
/// `clamp(ceil(16x - 1.5), 0, 15)`, equal to the midpoint search (see the
/// AVX-512 twin, `avx512::encode16_uniform`, for why).
#[inline(always)]
unsafe fn encode8_uniform(x: __m256) -> __m256i {
    // SAFETY: the caller runs with AVX enabled.
    unsafe {
        let t = _mm256_sub_ps(_mm256_mul_ps(x, _mm256_set1_ps(16.0)), _mm256_set1_ps(1.5));
        let c = _mm256_round_ps::<{ _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC }>(t);
        let c = _mm256_min_ps(_mm256_max_ps(c, _mm256_setzero_ps()), _mm256_set1_ps(15.0));
        _mm256_cvttps_epi32(c)
    }
}

/// Largest lane.
#[inline(always)]
unsafe fn hmax(x: __m256) -> f32 {
    // SAFETY: the caller runs with AVX enabled.
    unsafe {
        let m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
        _mm_cvtss_f32(m)
    }
}

/// The m code book as the kernels see it: values and midpoints in
/// registers, or the 256-entry int8 tables (gathers).
#[derive(Clone, Copy)]
enum MLut<'a> {
    Four(Lut16, Lut16),
    Eight(&'a [f32; 256], &'a [f32; 256]),
}

impl MLut<'_> {
    /// # Safety
    /// The CPU must support AVX.
    #[inline(always)]
    unsafe fn new(m: &MCodec) -> MLut<'_> {
        match m {
            // SAFETY: AVX per this function's contract.
            MCodec::Four(cb) => unsafe {
                MLut::Four(Lut16::load(&cb.values), Lut16::load(&cb.mids))
            },
            MCodec::Eight(cb) => MLut::Eight(&cb.values, &cb.mids),
        }
    }

    /// Decoded (unscaled) m of elements `e..e + 8`.
    #[inline(always)]
    unsafe fn decode8(self, codes: &[u8], e: usize) -> __m256 {
        // SAFETY: the caller guarantees `e + 8` elements of codes (4 bytes
        // of nibbles at `e / 2`, or 8 int8 codes at `e`) and AVX2; int8
        // gather indices are bytes, inside the 256-entry table.
        unsafe {
            match self {
                MLut::Four(lut, _) => lut.decode(unpack8(codes.as_ptr().add(e / 2))),
                MLut::Eight(values, _) => {
                    let idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                        codes.as_ptr().add(e) as *const __m128i
                    ));
                    _mm256_i32gather_ps::<4>(values.as_ptr(), idx)
                }
            }
        }
    }

    /// Encode 8 normalized values and store their codes for elements
    /// `e..e + 8` (4 bytes at `e / 2`, or 8 int8 codes at `e`).
    #[inline(always)]
    unsafe fn encode8_store(self, x: __m256, codes: &mut [u8], e: usize) {
        // SAFETY: the caller guarantees room for the codes of `e + 8`
        // elements and AVX2; the int8 search's gather indices stay in
        // 0..=254 (at most 2^8 - 1 minus one).
        unsafe {
            match self {
                MLut::Four(_, mids) => pack8_store(mids.encode(x), codes.as_mut_ptr().add(e / 2)),
                MLut::Eight(_, mids) => {
                    let mut idx = _mm256_setzero_si256();
                    for shift in (0..8).rev() {
                        let step = _mm256_set1_epi32(1 << shift);
                        let at =
                            _mm256_sub_epi32(_mm256_add_epi32(idx, step), _mm256_set1_epi32(1));
                        let mid = _mm256_i32gather_ps::<4>(mids.as_ptr(), at);
                        let gt = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(x, mid));
                        idx = _mm256_add_epi32(idx, _mm256_and_si256(gt, step));
                    }
                    // Byte 0 of each i32 to bytes 0..4 of each 128-bit half,
                    // then the halves' first dwords side by side.
                    let sel = _mm256_setr_epi8(
                        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, //
                        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                    );
                    let b = _mm256_permutevar8x32_epi32(
                        _mm256_shuffle_epi8(idx, sel),
                        _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0),
                    );
                    _mm_storel_epi64(
                        codes.as_mut_ptr().add(e) as *mut __m128i,
                        _mm256_castsi256_si128(b),
                    );
                }
            }
        }
    }
}

/// True when this kernel covers the call: per-block v scales.
pub(super) fn covers(v_scale: &VScale<'_>) -> bool {
    matches!(v_scale, VScale::Block(_))
}

/// Pass 1 (see `format::pass1`) for per-block v scales.
pub(super) fn pass1(_proof: Avx2, k: &StepConsts, c: &Codecs, bs: usize, p: Pass1<'_>) {
    // SAFETY: the token proves AVX2 (and FMA, unused); `pass1_impl` checks
    // every slice length it relies on.
    unsafe { pass1_impl(k, c, bs, p) }
}

/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
unsafe fn pass1_impl(k: &StepConsts, c: &Codecs, bs: usize, mut p: Pass1<'_>) {
    let VScale::Block(v_scale) = p.v_scale else {
        unreachable!("pass1 avx2: block scales only")
    };
    let n = p.w.len();
    let m_bytes = if matches!(c.m, MCodec::Eight(_)) {
        n
    } else {
        n.div_ceil(2)
    };
    assert!(p.g.len() == n && p.sm.len() >= n && p.su.len() >= n);
    assert!(p.m_codes.len() >= m_bytes && p.v_codes.len() * 2 >= n);
    // SAFETY: AVX2 is enabled (this function's contract); every load and
    // store below is bounded by `e + 8 <= end <= n` and the lengths asserted
    // above (the nibble slices hold n / 2 bytes, e is even: blocks are even).
    unsafe {
        let (lut_m, lut_v) = (MLut::new(&c.m), Lut16::load(&c.v.values));
        let (b1, b2) = (_mm256_set1_ps(k.b1), _mm256_set1_ps(k.b2));
        let (omb1, omb2) = (_mm256_set1_ps(k.omb1), _mm256_set1_ps(k.omb2));
        let (isb2, eps) = (_mm256_set1_ps(k.inv_sqrt_bc2), _mm256_set1_ps(k.eps));
        let (step, lr_wd, l2) = (
            _mm256_set1_ps(k.step_size),
            _mm256_set1_ps(k.lr_wd),
            _mm256_set1_ps(k.l2),
        );
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
        for (b, start) in (0..n).step_by(bs).enumerate() {
            let end = (start + bs).min(n);
            let (sm, sv) = (_mm256_set1_ps(p.m_scale[b]), _mm256_set1_ps(v_scale[b]));
            let (mut am, mut au) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut e = start;
            while e + 8 <= end {
                let m_hat = _mm256_mul_ps(lut_m.decode8(p.m_codes, e), sm);
                let mut v_hat =
                    _mm256_mul_ps(lut_v.decode(unpack8(p.v_codes.as_ptr().add(e / 2))), sv);
                if c.sqrt_domain {
                    v_hat = _mm256_mul_ps(v_hat, v_hat);
                }
                // Two streams from DRAM: a hint 2 KiB ahead (the address may
                // lie past the slice, so it is formed with wrapping_add).
                _mm_prefetch::<_MM_HINT_T0>(p.w.as_ptr().wrapping_add(e + PREFETCH) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(p.g.as_ptr().wrapping_add(e + PREFETCH) as *const i8);
                let w = _mm256_loadu_ps(p.w.as_ptr().add(e));
                let g = _mm256_loadu_ps(p.g.as_ptr().add(e));
                let gp = _mm256_add_ps(g, _mm256_mul_ps(l2, w));
                let m = _mm256_add_ps(_mm256_mul_ps(b1, m_hat), _mm256_mul_ps(omb1, gp));
                let v = _mm256_add_ps(
                    _mm256_mul_ps(b2, v_hat),
                    _mm256_mul_ps(omb2, _mm256_mul_ps(gp, gp)),
                );
                let r = _mm256_sqrt_ps(v);
                let denom = _mm256_add_ps(_mm256_mul_ps(r, isb2), eps);
                let wn = _mm256_sub_ps(
                    _mm256_sub_ps(w, _mm256_mul_ps(lr_wd, w)),
                    _mm256_div_ps(_mm256_mul_ps(step, m), denom),
                );
                let u = if c.sqrt_domain { r } else { v };
                _mm256_storeu_ps(p.w.as_mut_ptr().add(e), wn);
                _mm256_storeu_ps(p.sm.as_mut_ptr().add(e), m);
                _mm256_storeu_ps(p.su.as_mut_ptr().add(e), u);
                am = _mm256_max_ps(am, _mm256_and_ps(m, abs_mask));
                au = _mm256_max_ps(au, u);
                e += 8;
            }
            let acc = (hmax(am), hmax(au));
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
pub(super) fn pass2(_proof: Avx2, c: &Codecs, bs: usize, p: Pass2<'_>) {
    // SAFETY: the token proves AVX2; `pass2_impl` checks every slice length
    // it relies on.
    unsafe { pass2_impl(c, bs, p) }
}

/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
unsafe fn pass2_impl(c: &Codecs, bs: usize, mut p: Pass2<'_>) {
    let VScale::Block(v_inv) = p.v_inv else {
        unreachable!("pass2 avx2: block scales only")
    };
    let n = p.sm.len();
    let m_bytes = if matches!(c.m, MCodec::Eight(_)) {
        n
    } else {
        n.div_ceil(2)
    };
    assert!(p.su.len() == n && p.m_codes.len() >= m_bytes && p.v_codes.len() * 2 >= n);
    let uniform = (0..16).all(|k| c.v.values[k] == (k + 1) as f32 / 16.0);
    // SAFETY: AVX2 is enabled (this function's contract); the loop bounds
    // every load by `e + 8 <= end <= n` and every store by the code lengths
    // asserted above (nibbles: 4 bytes at `e / 2`, e even as blocks are
    // even; int8: 8 bytes at `e`).
    unsafe {
        let (mlut, mids_v) = (MLut::new(&c.m), Lut16::load(&c.v.mids));
        for (b, start) in (0..n).step_by(bs).enumerate() {
            let end = (start + bs).min(n);
            let (im, iv) = (_mm256_set1_ps(p.m_inv[b]), _mm256_set1_ps(v_inv[b]));
            let mut e = start;
            while e + 8 <= end {
                let xm = _mm256_mul_ps(_mm256_loadu_ps(p.sm.as_ptr().add(e)), im);
                mlut.encode8_store(xm, p.m_codes, e);
                let xv = _mm256_mul_ps(_mm256_loadu_ps(p.su.as_ptr().add(e)), iv);
                let cv = if uniform {
                    encode8_uniform(xv)
                } else {
                    mids_v.encode(xv)
                };
                pack8_store(cv, p.v_codes.as_mut_ptr().add(e / 2));
                e += 8;
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

/// True when every value is finite (8 lanes per compare).
pub(super) fn all_finite(_proof: Avx2, x: &[f32]) -> bool {
    // SAFETY: the token proves AVX2.
    unsafe { all_finite_impl(x) }
}

/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
unsafe fn all_finite_impl(x: &[f32]) -> bool {
    let inf = _mm256_set1_ps(f32::INFINITY);
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    let mut bad = _mm256_setzero_ps();
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        // SAFETY: `c` holds exactly 8 values.
        let v = _mm256_and_ps(unsafe { _mm256_loadu_ps(c.as_ptr()) }, abs_mask);
        // NaN compares unordered: NLT_UQ is true for NaN and for |v| >= inf.
        bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_NLT_UQ>(v, inf));
    }
    _mm256_movemask_ps(bad) == 0 && chunks.remainder().iter().all(|v| v.is_finite())
}
