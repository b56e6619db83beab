//! The two passes of `format.rs` for per-block v scales (4-bit or int8 m),
//! and the finiteness check, written once over `crate::simd::F32Lanes`; [`entry_points`]
//! instantiates them in a `#[target_feature]` function per ISA (`avx2.rs`,
//! `avx512.rs`). Rank-1 v scales and the double-quantization search stay
//! on the scalar twins.
//!
//! No FMA: the element math is the scalar one, operation for operation, so
//! results are bit-identical at every width. `N` elements per iteration,
//! the block's remainder through the scalar element code.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};

use super::format::{
    m_decode, m_encode, pass1_elements, pass2_elements, Codecs, MCodec, Pass1, Pass2, StepConsts,
    VScale,
};
use crate::simd::F32Lanes as Lanes;

/// Prefetch distance of pass 1, in elements.
const PREFETCH: usize = 512;

/// Bytes per prefetch hint (one cache line).
const LINE: usize = 64;

/// The m code book as the kernels see it: values and midpoints in
/// registers, or the 256-entry int8 tables (gathers).
#[derive(Clone, Copy)]
enum MLut<'a, V: Lanes> {
    Four(V::Table, V::Mids),
    Eight(&'a [f32; 256], &'a [f32; 256]),
}

impl<V: Lanes> MLut<'_, V> {
    /// # Safety
    /// The CPU must support `V`'s features.
    #[inline(always)]
    unsafe fn new(m: &MCodec) -> MLut<'_, V> {
        match m {
            // SAFETY: `V`'s features per this function's contract.
            MCodec::Four(cb) => unsafe { MLut::Four(V::table(&cb.values), V::mids(&cb.mids)) },
            MCodec::Eight(cb) => MLut::Eight(&cb.values, &cb.mids),
        }
    }

    /// Decoded (unscaled) m of elements `e..e + N`.
    ///
    /// # Safety
    /// `V`'s features, and the codes of `e + N` elements in `codes`.
    #[inline(always)]
    unsafe fn decode(self, codes: &[u8], e: usize) -> V {
        // SAFETY: the caller guarantees `e + N` elements of codes (`N / 2`
        // bytes of nibbles at `e / 2`, or `N` int8 codes at `e`).
        unsafe {
            match self {
                MLut::Four(lut, _) => V::lookup(lut, V::load_nibbles(codes.as_ptr().add(e / 2))),
                MLut::Eight(values, _) => V::gather256(values, codes.as_ptr().add(e)),
            }
        }
    }

    /// Nearest codes of `N` normalized values.
    ///
    /// # Safety
    /// `V`'s features.
    #[inline(always)]
    unsafe fn encode(self, x: V) -> V::Idx {
        // SAFETY: `V`'s features per this function's contract.
        unsafe {
            match self {
                MLut::Four(_, mids) => V::search16(mids, x),
                MLut::Eight(_, mids) => V::search256(mids, x),
            }
        }
    }
}

/// Pass 1 (see `format::pass1`) for per-block v scales.
///
/// # Safety
/// The CPU must support `V`'s features. Slice lengths are checked here.
#[inline(always)]
pub(super) unsafe fn pass1<V: Lanes>(k: &StepConsts, c: &Codecs, bs: usize, mut p: Pass1<'_>) {
    let VScale::Block(v_scale) = p.v_scale else {
        unreachable!("SIMD pass1: block scales only")
    };
    let n = p.w.len();
    let m_bytes = if matches!(c.m, MCodec::Eight(_)) {
        n
    } else {
        n.div_ceil(2)
    };
    assert!(p.g.len() == n && p.sm.len() >= n && p.su.len() >= n);
    assert!(p.m_codes.len() >= m_bytes && p.v_codes.len() * 2 >= n);
    // SAFETY: `V`'s features per this function's contract; every load and
    // store below is bounded by `e + N <= end <= n` and the lengths asserted
    // above (the nibble slices hold n / 2 bytes, e is even: blocks are even).
    unsafe {
        let (lut_m, lut_v) = (MLut::<V>::new(&c.m), V::table(&c.v.values));
        let (b1, b2) = (V::splat(k.b1), V::splat(k.b2));
        let (omb1, omb2) = (V::splat(k.omb1), V::splat(k.omb2));
        let (isb2, eps) = (V::splat(k.inv_sqrt_bc2), V::splat(k.eps));
        let (step, lr_wd, l2) = (V::splat(k.step_size), V::splat(k.lr_wd), V::splat(k.l2));
        for (b, start) in (0..n).step_by(bs).enumerate() {
            let end = (start + bs).min(n);
            let (sm, sv) = (V::splat(p.m_scale[b]), V::splat(v_scale[b]));
            let (mut am, mut au) = (V::zero(), V::zero());
            let mut e = start;
            while e + V::LANES <= end {
                let m_hat = lut_m.decode(p.m_codes, e).mul(sm);
                let mut v_hat = V::lookup(lut_v, V::load_nibbles(p.v_codes.as_ptr().add(e / 2)));
                v_hat = v_hat.mul(sv);
                if c.sqrt_domain {
                    v_hat = v_hat.mul(v_hat);
                }
                // Two streams from DRAM: a hint 2 KiB ahead (the address may
                // lie past the slice, so it is formed with wrapping_add).
                _mm_prefetch::<_MM_HINT_T0>(p.w.as_ptr().wrapping_add(e + PREFETCH) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(p.g.as_ptr().wrapping_add(e + PREFETCH) as *const i8);
                let w = V::load(p.w.as_ptr().add(e));
                let g = V::load(p.g.as_ptr().add(e));
                let gp = g.add(l2.mul(w));
                let m = b1.mul(m_hat).add(omb1.mul(gp));
                let v = b2.mul(v_hat).add(omb2.mul(gp.mul(gp)));
                let r = v.sqrt();
                let denom = r.mul(isb2).add(eps);
                let wn = w.sub(lr_wd.mul(w)).sub(step.mul(m).div(denom));
                let u = if c.sqrt_domain { r } else { v };
                wn.store(p.w.as_mut_ptr().add(e));
                m.store(p.sm.as_mut_ptr().add(e));
                u.store(p.su.as_mut_ptr().add(e));
                am = am.max(m.abs());
                au = au.max(u);
                e += V::LANES;
            }
            let acc = (am.hmax(), au.hmax());
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
///
/// # Safety
/// The CPU must support `V`'s features. Slice lengths are checked here.
#[inline(always)]
pub(super) unsafe fn pass2<V: Lanes>(c: &Codecs, bs: usize, mut p: Pass2<'_>) {
    let VScale::Block(v_inv) = p.v_inv else {
        unreachable!("SIMD pass2: block scales only")
    };
    let n = p.sm.len();
    let eight = matches!(c.m, MCodec::Eight(_));
    let m_bytes = if eight { n } else { n.div_ceil(2) };
    assert!(p.su.len() == n && p.m_codes.len() >= m_bytes && p.v_codes.len() * 2 >= n);
    let uniform = (0..16).all(|k| c.v.values[k] == (k + 1) as f32 / 16.0);
    // SAFETY: `V`'s features per this function's contract; the loops bound
    // every load by `e + N <= end <= n` (or `e + 2N`) and every store by the
    // code lengths asserted above (int8: bytes e..e + N; nibbles: bytes
    // e/2..e/2 + N/2, or + N in the two-register loop; e is even as blocks
    // are even).
    unsafe {
        let (mlut, mids_v) = (MLut::<V>::new(&c.m), V::mids(&c.v.mids));
        let enc_v = |x: V| {
            if uniform {
                V::search_uniform(x)
            } else {
                V::search16(mids_v, x)
            }
        };
        let [next_w, next_g] = p.ahead.map(|a| a as *const i8);
        for (b, start) in (0..n).step_by(bs).enumerate() {
            let end = (start + bs).min(n);
            // Pass 2 reads only L2 (the scratch): the next group's weight
            // and gradient stream in under its arithmetic, block for block.
            for off in (4 * start..4 * end).step_by(LINE) {
                _mm_prefetch::<_MM_HINT_T1>(next_w.wrapping_add(off));
                _mm_prefetch::<_MM_HINT_T1>(next_g.wrapping_add(off));
            }
            let (im, iv) = (V::splat(p.m_inv[b]), V::splat(v_inv[b]));
            let sm = |e: usize| V::load(p.sm.as_ptr().add(e)).mul(im);
            let su = |e: usize| V::load(p.su.as_ptr().add(e)).mul(iv);
            let mut e = start;
            while eight && e + V::LANES <= end {
                V::store_bytes(mlut.encode(sm(e)), p.m_codes.as_mut_ptr().add(e));
                V::store_nibbles(enc_v(su(e)), p.v_codes.as_mut_ptr().add(e / 2));
                e += V::LANES;
            }
            while !eight && e + 2 * V::LANES <= end {
                let (m0, m1) = (mlut.encode(sm(e)), mlut.encode(sm(e + V::LANES)));
                V::store_nibbles2(m0, m1, p.m_codes.as_mut_ptr().add(e / 2));
                let (v0, v1) = (enc_v(su(e)), enc_v(su(e + V::LANES)));
                V::store_nibbles2(v0, v1, p.v_codes.as_mut_ptr().add(e / 2));
                e += 2 * V::LANES;
            }
            while !eight && e + V::LANES <= end {
                V::store_nibbles(mlut.encode(sm(e)), p.m_codes.as_mut_ptr().add(e / 2));
                V::store_nibbles(enc_v(su(e)), p.v_codes.as_mut_ptr().add(e / 2));
                e += V::LANES;
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

/// True when every value is finite (`N` lanes per compare).
///
/// # Safety
/// The CPU must support `V`'s features.
#[inline(always)]
pub(super) unsafe fn all_finite<V: Lanes>(x: &[f32]) -> bool {
    let mut chunks = x.chunks_exact(V::LANES);
    // SAFETY: `V`'s features per this function's contract; each chunk
    // holds exactly `N` values.
    let none_bad = unsafe {
        let mut bad = V::no_bad();
        for c in &mut chunks {
            bad = V::add_bad(bad, V::load(c.as_ptr()));
        }
        V::none_bad(bad)
    };
    none_bad && chunks.remainder().iter().all(|v| v.is_finite())
}

/// The token-taking entry points of one ISA: `pass1`, `pass2` and
/// `all_finite` as safe `pub(super)` functions over `$token` (the proof
/// that the CPU runs `$features`), each calling a `#[target_feature]`
/// instance of the generic body for the register type `$lanes`.
macro_rules! entry_points {
    ($token:ty, $lanes:ty, $features:literal) => {
        /// Pass 1 (see `format::pass1`) for per-block v scales.
        pub(super) fn pass1(_proof: $token, k: &StepConsts, c: &Codecs, bs: usize, p: Pass1<'_>) {
            #[target_feature(enable = $features)]
            unsafe fn imp(k: &StepConsts, c: &Codecs, bs: usize, p: Pass1<'_>) {
                // SAFETY: the features are enabled here.
                unsafe { super::kernel::pass1::<$lanes>(k, c, bs, p) }
            }
            // SAFETY: the token proves the features; the body checks every
            // slice length it relies on.
            unsafe { imp(k, c, bs, p) }
        }

        /// Pass 2 (see `format::pass2`) for per-block v scales.
        pub(super) fn pass2(_proof: $token, c: &Codecs, bs: usize, p: Pass2<'_>) {
            #[target_feature(enable = $features)]
            unsafe fn imp(c: &Codecs, bs: usize, p: Pass2<'_>) {
                // SAFETY: the features are enabled here.
                unsafe { super::kernel::pass2::<$lanes>(c, bs, p) }
            }
            // SAFETY: the token proves the features; the body checks every
            // slice length it relies on.
            unsafe { imp(c, bs, p) }
        }

        /// True when every value is finite.
        pub(super) fn all_finite(_proof: $token, x: &[f32]) -> bool {
            #[target_feature(enable = $features)]
            unsafe fn imp(x: &[f32]) -> bool {
                // SAFETY: the features are enabled here.
                unsafe { super::kernel::all_finite::<$lanes>(x) }
            }
            // SAFETY: the token proves the features.
            unsafe { imp(x) }
        }
    };
}
pub(super) use entry_points;
