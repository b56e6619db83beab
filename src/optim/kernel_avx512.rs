//! AVX-512 (F) versions of the two passes of `kernel.rs`, for 4-bit m and
//! per-block v scales. A 16-entry code book fits one register: decoding is
//! one `vpermps`, the nearest-code search is a four-step binary search over
//! the midpoints with `vpermps` + compare + masked move. 16 elements per
//! iteration, the block's remainder through the scalar element code.

#![cfg(target_arch = "x86_64")]
// The AVX-512 intrinsics are stable since Rust 1.89, above the crate's
// declared rust-version (1.85); building this file needs 1.89 (reported to the lead).
#![allow(clippy::incompatible_msrv)]

use std::arch::x86_64::*;

use super::kernel::{
    m_decode, m_encode, nibble, set_nibble, Codecs, MCodec, Pass1, Pass2, StepConsts, VScale,
};

/// Prefetch distance of pass 1, in elements.
const PREFETCH: usize = 512;

/// 8 bytes of packed nibbles -> 16 i32 lane indices (element order).
#[inline(always)]
unsafe fn unpack16(p: *const u8) -> __m512i {
    let q = _mm512_cvtepu8_epi64(_mm_loadl_epi64(p as *const __m128i));
    let lo = _mm512_and_si512(q, _mm512_set1_epi64(15));
    let hi = _mm512_slli_epi64(_mm512_srli_epi64(q, 4), 32);
    _mm512_or_si512(lo, hi)
}

/// 16 i32 codes (< 16) -> 8 bytes of packed nibbles, in the low half.
#[inline(always)]
unsafe fn pack16(idx: __m512i) -> __m128i {
    let lo = _mm512_and_si512(idx, _mm512_set1_epi64(15));
    let hi = _mm512_slli_epi64(_mm512_srli_epi64(idx, 32), 4);
    _mm512_cvtepi64_epi8(_mm512_or_si512(lo, hi))
}

/// Nearest codes of 16 normalized values on the uniform `{k/16 : k = 1..16}`
/// map: `clamp(ceil(16x - 1.5), 0, 15)`. Equal to the midpoint search: the
/// midpoints are `(2k + 3) / 32`, `16x` is exact, and `16x - 1.5` is exact
/// whenever `16x >= 0.75` (and negative otherwise), so `x > mid_k` iff
/// `k < 16x - 1.5`. Tested bit for bit against the scalar reference.
#[inline(always)]
unsafe fn encode16_uniform(x: __m512) -> __m512i {
    let t = _mm512_sub_ps(_mm512_mul_ps(x, _mm512_set1_ps(16.0)), _mm512_set1_ps(1.5));
    let c = _mm512_roundscale_ps::<{ _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC }>(t);
    let c = _mm512_min_ps(_mm512_max_ps(c, _mm512_setzero_ps()), _mm512_set1_ps(15.0));
    _mm512_cvttps_epi32(c)
}

/// Encode 16 v values at `src`, normalized by `inv`.
#[inline(always)]
unsafe fn enc16_v(src: *const f32, inv: __m512, mids: __m512, uniform: bool) -> __m512i {
    let x = _mm512_mul_ps(_mm512_loadu_ps(src), inv);
    if uniform {
        encode16_uniform(x)
    } else {
        encode16(x, mids)
    }
}

/// 2 x 16 codes -> one 16-byte store (a narrowing store per 8 bytes is
/// microcoded and slow on some cores).
#[inline(always)]
unsafe fn store32(a: __m512i, b: __m512i, p: *mut u8) {
    _mm_storeu_si128(p as *mut __m128i, _mm_unpacklo_epi64(pack16(a), pack16(b)));
}

/// Lane-wise nearest code: the number of midpoints strictly below `x`.
#[inline(always)]
unsafe fn encode16(x: __m512, mids: __m512) -> __m512i {
    let mut idx = _mm512_setzero_si512();
    for step in [8, 4, 2, 1] {
        let cand = _mm512_add_epi32(idx, _mm512_set1_epi32(step));
        let mid = _mm512_permutexvar_ps(_mm512_sub_epi32(cand, _mm512_set1_epi32(1)), mids);
        let gt = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, mid);
        idx = _mm512_mask_mov_epi32(idx, gt, cand);
    }
    idx
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
            MCodec::Four(cb) => MLut::Four(
                _mm512_loadu_ps(cb.values.as_ptr()),
                _mm512_loadu_ps(cb.mids.as_ptr()),
            ),
            MCodec::Eight(cb) => MLut::Eight(&cb.values, &cb.mids),
        }
    }

    /// Decoded (unscaled) m of elements `e..e + 16`.
    #[inline(always)]
    unsafe fn decode16(self, codes: &[u8], e: usize) -> __m512 {
        match self {
            MLut::Four(lut, _) => _mm512_permutexvar_ps(unpack16(codes.as_ptr().add(e / 2)), lut),
            MLut::Eight(values, _) => {
                let idx =
                    _mm512_cvtepu8_epi32(_mm_loadu_si128(codes.as_ptr().add(e) as *const __m128i));
                _mm512_i32gather_ps::<4>(idx, values.as_ptr())
            }
        }
    }

    /// Nearest codes of 16 normalized values.
    #[inline(always)]
    unsafe fn encode16(self, x: __m512) -> __m512i {
        match self {
            MLut::Four(_, mids) => encode16(x, mids),
            MLut::Eight(_, mids) => {
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
    }
}

/// # Safety
/// The CPU must support AVX-512 F/BW/VL; `p.v_scale` must be per block; the
/// slices must have the lengths `Pass1` documents.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub unsafe fn pass1(k: &StepConsts, c: &Codecs, bs: usize, p: Pass1<'_>) {
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
        let (sm_s, sv_s) = (p.m_scale[b], v_scale[b]);
        let (sm, sv) = (_mm512_set1_ps(sm_s), _mm512_set1_ps(sv_s));
        let (mut am, mut au) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut e = start;
        while e + 16 <= end {
            // SAFETY: e + 16 <= n bounds every load and store below; the
            // code slices hold n / 2 bytes and e is even.
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
        let (mut am_s, mut au_s) = (_mm512_reduce_max_ps(am), _mm512_reduce_max_ps(au));
        while e < end {
            let m_hat = m_decode(&c.m, p.m_codes, e) * sm_s;
            let mut v_hat = c.v.decode(nibble(p.v_codes, e)) * sv_s;
            if c.sqrt_domain {
                v_hat *= v_hat;
            }
            let (w, m, v, r) = k.element(p.w[e], p.g[e], m_hat, v_hat);
            let u = c.to_domain(v, r);
            p.w[e] = w;
            p.sm[e] = m;
            p.su[e] = u;
            am_s = am_s.max(m.abs());
            au_s = au_s.max(u);
            e += 1;
        }
        p.m_absmax[b] = am_s;
        p.u_max[b] = au_s;
    }
}

/// # Safety
/// As for [`pass1`]; `p.v_inv` must be per block.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub unsafe fn pass2(c: &Codecs, bs: usize, p: Pass2<'_>) {
    let VScale::Block(v_inv) = p.v_inv else {
        unreachable!("pass2 avx512: block scales only")
    };
    let n = p.sm.len();
    let eight = matches!(c.m, MCodec::Eight(_));
    let m_bytes = if eight { n } else { n.div_ceil(2) };
    assert!(p.su.len() == n && p.m_codes.len() >= m_bytes && p.v_codes.len() * 2 >= n);
    let mlut = MLut::new(&c.m);
    let uniform = (0..16).all(|k| c.v.values[k] == (k + 1) as f32 / 16.0);
    let mids_v = _mm512_loadu_ps(c.v.mids.as_ptr());
    for (b, start) in (0..n).step_by(bs).enumerate() {
        let end = (start + bs).min(n);
        let (im_s, iv_s) = (p.m_inv[b], v_inv[b]);
        let (im, iv) = (_mm512_set1_ps(im_s), _mm512_set1_ps(iv_s));
        let mut e = start;
        while eight && e + 16 <= end {
            // SAFETY: e + 16 <= n bounds the loads and the 16-byte store
            // into the n-byte int8 code slice.
            let xm = _mm512_mul_ps(_mm512_loadu_ps(p.sm.as_ptr().add(e)), im);
            let bm = _mm512_cvtepi32_epi8(mlut.encode16(xm));
            _mm_storeu_si128(p.m_codes.as_mut_ptr().add(e) as *mut __m128i, bm);
            let bv = pack16(enc16_v(p.su.as_ptr().add(e), iv, mids_v, uniform));
            _mm_storel_epi64(p.v_codes.as_mut_ptr().add(e / 2) as *mut __m128i, bv);
            e += 16;
        }
        while !eight && e + 32 <= end {
            // SAFETY: e + 32 <= n bounds the loads; the stores write bytes
            // e/2 .. e/2 + 16 of code slices of at least n / 2 bytes.
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
            // SAFETY: e + 16 <= n bounds the loads; the stores write bytes
            // e/2 .. e/2 + 8 of code slices of at least n / 2 bytes.
            let bm =
                pack16(mlut.encode16(_mm512_mul_ps(_mm512_loadu_ps(p.sm.as_ptr().add(e)), im)));
            _mm_storel_epi64(p.m_codes.as_mut_ptr().add(e / 2) as *mut __m128i, bm);
            let bv = pack16(enc16_v(p.su.as_ptr().add(e), iv, mids_v, uniform));
            _mm_storel_epi64(p.v_codes.as_mut_ptr().add(e / 2) as *mut __m128i, bv);
            e += 16;
        }
        while e < end {
            m_encode(&c.m, p.m_codes, e, p.sm[e] * im_s);
            set_nibble(p.v_codes, e, c.v.encode(p.su[e] * iv_s));
            e += 1;
        }
    }
}

/// True when every value is finite (16 lanes per compare).
///
/// # Safety
/// The CPU must support AVX-512 F.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub unsafe fn all_finite(x: &[f32]) -> bool {
    let inf = _mm512_set1_ps(f32::INFINITY);
    let mut bad: __mmask16 = 0;
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        // SAFETY: `c` holds exactly 16 values.
        let v = _mm512_abs_ps(_mm512_loadu_ps(c.as_ptr()));
        // NaN compares unordered: NLT_UQ is true for NaN and for |v| >= inf.
        bad |= _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(v, inf);
    }
    bad == 0 && chunks.remainder().iter().all(|v| v.is_finite())
}

/// Block-scale codes of double quantization, 16 blocks at a time: a guess
/// from a vectorized logarithm (`getexp` + `getmant` + the atanh series),
/// verified with two gathers (`t[c] >= x > t[c + 1]`); lanes that fail, and
/// zero scales, go through the scalar walk. The code of a scale is defined
/// by the table alone (the largest `c` with `t[c] >= x`), so this returns
/// exactly the scalar codes. Returns how many leading entries it handled.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL; `t` must be non-increasing with
/// `t[0] = max` and `t[255] = 0`; `codes.len() >= s.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub unsafe fn dq_search(
    s: &mut [f32],
    codes: &mut [u8],
    max: f32,
    inv_step: f32,
    t: &[f32; 256],
) -> usize {
    use super::scales::{search_from, ZERO_CODE};
    let n = s.len().min(codes.len());
    let (inv_max, istep) = (_mm512_set1_ps(1.0 / max), _mm512_set1_ps(inv_step));
    let one = _mm512_set1_ps(1.0);
    let two_over_ln2 = _mm512_set1_ps(2.0 / std::f32::consts::LN_2);
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n bounds the loads and stores of s and codes;
        // gather indices lie in 0..=255 (clamped guess, plus one).
        let x = _mm512_loadu_ps(s.as_ptr().add(i));
        let r = _mm512_mul_ps(x, inv_max);
        let e = _mm512_getexp_ps(r);
        let m = _mm512_getmant_ps::<_MM_MANT_NORM_1_2, _MM_MANT_SIGN_SRC>(r);
        let z = _mm512_div_ps(_mm512_sub_ps(m, one), _mm512_add_ps(m, one));
        let z2 = _mm512_mul_ps(z, z);
        let mut p = _mm512_add_ps(
            _mm512_set1_ps(0.2),
            _mm512_mul_ps(z2, _mm512_set1_ps(1.0 / 7.0)),
        );
        p = _mm512_add_ps(_mm512_set1_ps(1.0 / 3.0), _mm512_mul_ps(z2, p));
        p = _mm512_add_ps(one, _mm512_mul_ps(z2, p));
        let l = _mm512_add_ps(e, _mm512_mul_ps(_mm512_mul_ps(z, p), two_over_ln2));
        let g = _mm512_min_ps(
            _mm512_max_ps(_mm512_mul_ps(l, istep), _mm512_setzero_ps()),
            _mm512_set1_ps(254.0),
        );
        let idx = _mm512_cvttps_epi32(g);
        let t0 = _mm512_i32gather_ps::<4>(idx, t.as_ptr());
        let t1 = _mm512_i32gather_ps::<4>(_mm512_add_epi32(idx, _mm512_set1_epi32(1)), t.as_ptr());
        let ok = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(t0, x)
            & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(t1, x)
            & _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_setzero_ps());
        _mm_storeu_si128(
            codes.as_mut_ptr().add(i) as *mut __m128i,
            _mm512_cvtepi32_epi8(idx),
        );
        _mm512_storeu_ps(s.as_mut_ptr().add(i), t0);
        let mut bad = !ok;
        if bad != 0 {
            let mut xs = [0f32; 16];
            _mm512_storeu_ps(xs.as_mut_ptr(), x);
            while bad != 0 {
                let lane = bad.trailing_zeros() as usize;
                bad &= bad - 1;
                let j = i + lane;
                if xs[lane] == 0.0 {
                    codes[j] = ZERO_CODE;
                    s[j] = 0.0;
                } else {
                    let c = search_from(xs[lane], codes[j] as usize, t);
                    codes[j] = c as u8;
                    s[j] = t[c];
                }
            }
        }
        i += 16;
    }
    i
}

/// `t[c] = max * exp2_neg(c * step)` for `c = 0..256`: the scalar
/// `scales::exp2_neg` lane-wise, the same IEEE operations in the same order
/// (so the tables are bit-identical).
///
/// # Safety
/// The CPU must support AVX-512 F; `step` must be in `[-1, 0]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub unsafe fn exp2_table(max: f32, step: f32, t: &mut [f32; 256]) {
    use super::scales::EXP2_C as C;
    let (vmax, vstep) = (_mm512_set1_ps(max), _mm512_set1_ps(step));
    let c: [__m512; 6] = [
        _mm512_set1_ps(C[0]),
        _mm512_set1_ps(C[1]),
        _mm512_set1_ps(C[2]),
        _mm512_set1_ps(C[3]),
        _mm512_set1_ps(C[4]),
        _mm512_set1_ps(C[5]),
    ];
    let lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for k in 0..16 {
        let code = _mm512_add_epi32(lane, _mm512_set1_epi32(16 * k as i32));
        let y = _mm512_mul_ps(_mm512_cvtepi32_ps(code), vstep);
        // (0.5 - y) lies in [0.5, 254.5]: truncation equals Rust's `as i32`.
        let ti = _mm512_min_epi32(
            _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_set1_ps(0.5), y)),
            _mm512_set1_epi32(126),
        );
        let f = _mm512_add_ps(y, _mm512_cvtepi32_ps(ti));
        let mut p = _mm512_add_ps(c[4], _mm512_mul_ps(f, c[5]));
        p = _mm512_add_ps(c[3], _mm512_mul_ps(f, p));
        p = _mm512_add_ps(c[2], _mm512_mul_ps(f, p));
        p = _mm512_add_ps(c[1], _mm512_mul_ps(f, p));
        p = _mm512_add_ps(c[0], _mm512_mul_ps(f, p));
        p = _mm512_add_ps(_mm512_set1_ps(1.0), _mm512_mul_ps(f, p));
        let scale = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_sub_epi32(
            _mm512_set1_epi32(127),
            ti,
        )));
        // SAFETY: 16 * k + 16 <= 256 = t.len().
        _mm512_storeu_ps(
            t.as_mut_ptr().add(16 * k),
            _mm512_mul_ps(vmax, _mm512_mul_ps(p, scale)),
        );
    }
}
