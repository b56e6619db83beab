//! The two passes of `format.rs` for per-block v scales (4-bit or int8 m),
//! and the finiteness check, written once over `crate::simd::F32Lanes` (and
//! the 4-bit code operations of `step_lanes.rs`); [`entry_points`]
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
use super::step_lanes::StepLanes as Lanes;

/// Prefetch distance of pass 1, in elements (one hint per cache line).
const PREFETCH: usize = 512;

/// Bytes per prefetch hint (one cache line).
const LINE: usize = 64;

/// The m code book as the kernels see it: values and midpoints in
/// registers, or the 256-entry int8 tables (gathers).
#[derive(Clone, Copy)]
enum MLut<'a, V: Lanes> {
    Four(V::Table, V::Search),
    Eight(&'a [f32; 256], &'a [f32; 256]),
}

impl<V: Lanes> MLut<'_, V> {
    /// # Safety
    /// The CPU must support `V`'s features.
    #[inline(always)]
    unsafe fn new(m: &MCodec) -> MLut<'_, V> {
        match m {
            // SAFETY: `V`'s features per this function's contract.
            MCodec::Four(cb) => unsafe {
                MLut::Four(V::table(&cb.values), V::search_mids(&cb.mids))
            },
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

    /// Decoded (unscaled) m of elements `e..e + 2N`.
    ///
    /// # Safety
    /// `V`'s features, and the codes of `e + 2N` elements in `codes`; `e`
    /// even.
    #[inline(always)]
    unsafe fn decode_pair(self, codes: &[u8], e: usize) -> (V, V) {
        // SAFETY: the caller guarantees `e + 2N` elements of codes (`N`
        // bytes of nibbles at `e / 2`, or `2N` int8 codes at `e`).
        unsafe {
            match self {
                MLut::Four(lut, _) => {
                    let (a, b) = V::load_nibbles_pair(codes.as_ptr().add(e / 2));
                    (V::lookup(lut, a), V::lookup(lut, b))
                }
                MLut::Eight(values, _) => (
                    V::gather256(values, codes.as_ptr().add(e)),
                    V::gather256(values, codes.as_ptr().add(e + V::LANES)),
                ),
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
                MLut::Four(_, mids) => V::nearest16(mids, x),
                MLut::Eight(_, mids) => V::search256(mids, x),
            }
        }
    }
}

/// Pass 1's registers: the code books and the step constants.
#[derive(Clone, Copy)]
struct Update<'a, V: Lanes> {
    lut_m: MLut<'a, V>,
    lut_v: V::Table,
    sqrt_domain: bool,
    b1: V,
    b2: V,
    omb1: V,
    omb2: V,
    isb2: V,
    eps: V,
    step: V,
    lr_wd: V,
    l2: V,
}

impl<'a, V: Lanes> Update<'a, V> {
    /// # Safety
    /// The CPU must support `V`'s features.
    #[inline(always)]
    unsafe fn new(k: &StepConsts, c: &'a Codecs) -> Self {
        // SAFETY: `V`'s features per this function's contract.
        unsafe {
            Update {
                lut_m: MLut::new(&c.m),
                lut_v: V::table(&c.v.values),
                sqrt_domain: c.sqrt_domain,
                b1: V::splat(k.b1),
                b2: V::splat(k.b2),
                omb1: V::splat(k.omb1),
                omb2: V::splat(k.omb2),
                isb2: V::splat(k.inv_sqrt_bc2),
                eps: V::splat(k.eps),
                step: V::splat(k.step_size),
                lr_wd: V::splat(k.lr_wd),
                l2: V::splat(k.l2),
            }
        }
    }

    /// Elements `e..e + N` of `p`: decode m and v (block scales `sm`, `sv`),
    /// update the weight, write the new m and u to the scratch, fold their
    /// maxima into `am`, `au`.
    ///
    /// # Safety
    /// `V`'s features, and `e + N` within every slice of `p` (the nibble
    /// slices hold `(e + N) / 2` bytes; `e` even).
    #[inline(always)]
    unsafe fn vector(&self, p: &mut Pass1<'_>, e: usize, s: (V, V), acc: &mut (V, V)) {
        // SAFETY: per this function's contract.
        unsafe {
            let m = self.lut_m.decode(p.m_codes, e);
            let v = V::lookup(self.lut_v, V::load_nibbles(p.v_codes.as_ptr().add(e / 2)));
            self.prefetch(p, e);
            self.apply(p, e, s, (m, v), acc);
        }
    }

    /// Elements `e..e + 2N`, as two [`Self::vector`] calls: the codes of
    /// both registers unpacked at once, one prefetch hint per cache line.
    ///
    /// # Safety
    /// `V`'s features, and `e + 2N` within every slice of `p` (the nibble
    /// slices hold `(e + 2N) / 2` bytes; `e` even).
    #[inline(always)]
    unsafe fn pair(&self, p: &mut Pass1<'_>, e: usize, s: (V, V), acc: &mut (V, V)) {
        // SAFETY: per this function's contract.
        unsafe {
            let (m0, m1) = self.lut_m.decode_pair(p.m_codes, e);
            let (c0, c1) = V::load_nibbles_pair(p.v_codes.as_ptr().add(e / 2));
            let (v0, v1) = (V::lookup(self.lut_v, c0), V::lookup(self.lut_v, c1));
            for off in (0..2 * V::LANES).step_by(LINE / 4) {
                self.prefetch(p, e + off);
            }
            self.apply(p, e, s, (m0, v0), acc);
            self.apply(p, e + V::LANES, s, (m1, v1), acc);
        }
    }

    /// Hints for the weight and gradient 2 KiB past element `e`: two
    /// streams from DRAM. The address may lie past the slice, so it is
    /// formed with `wrapping_add`; a prefetch never faults.
    #[inline(always)]
    fn prefetch(&self, p: &Pass1<'_>, e: usize) {
        // SAFETY: a prefetch hint reads nothing and cannot fault (SSE,
        // which every x86_64 CPU has).
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(p.w.as_ptr().wrapping_add(e + PREFETCH) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(p.g.as_ptr().wrapping_add(e + PREFETCH) as *const i8);
        }
    }

    /// The element math of `e..e + N` on the decoded, unscaled `(m, v)`
    /// table values (`format::pass1_elements`' operations, in its order).
    ///
    /// # Safety
    /// `V`'s features, and `e + N` within `p.w`, `p.g`, `p.sm`, `p.su`.
    #[inline(always)]
    unsafe fn apply(&self, p: &mut Pass1<'_>, e: usize, s: (V, V), mv: (V, V), acc: &mut (V, V)) {
        let (sm, sv) = s;
        // SAFETY: per this function's contract.
        unsafe {
            let m_hat = mv.0.mul(sm);
            let mut v_hat = mv.1.mul(sv);
            if self.sqrt_domain {
                v_hat = v_hat.mul(v_hat);
            }
            let w = V::load(p.w.as_ptr().add(e));
            let g = V::load(p.g.as_ptr().add(e));
            let gp = g.add(self.l2.mul(w));
            let m = self.b1.mul(m_hat).add(self.omb1.mul(gp));
            let v = self.b2.mul(v_hat).add(self.omb2.mul(gp.mul(gp)));
            let r = v.sqrt();
            let denom = r.mul(self.isb2).add(self.eps);
            let wn = w.sub(self.lr_wd.mul(w)).sub(self.step.mul(m).div(denom));
            let u = if self.sqrt_domain { r } else { v };
            wn.store(p.w.as_mut_ptr().add(e));
            m.store(p.sm.as_mut_ptr().add(e));
            u.store(p.su.as_mut_ptr().add(e));
            acc.0 = acc.0.max(m.abs());
            acc.1 = acc.1.max(u);
        }
    }
}

/// Pass 1 of block `b` (elements `start..end`) from its first vector.
///
/// # Safety
/// `V`'s features, and the slice lengths `pass1` asserts.
#[inline(always)]
unsafe fn pass1_block<V: Lanes>(
    k: &StepConsts,
    c: &Codecs,
    u: &Update<'_, V>,
    p: &mut Pass1<'_>,
    v_scale: &[f32],
    b: usize,
    (start, end): (usize, usize),
) {
    // SAFETY: per this function's contract; `e + N <= end`.
    unsafe {
        let s = (V::splat(p.m_scale[b]), V::splat(v_scale[b]));
        let mut acc = (V::zero(), V::zero());
        let mut e = start;
        while e + 2 * V::LANES <= end {
            u.pair(p, e, s, &mut acc);
            e += 2 * V::LANES;
        }
        while e + V::LANES <= end {
            u.vector(p, e, s, &mut acc);
            e += V::LANES;
        }
        let acc = (acc.0.hmax(), acc.1.hmax());
        let (am_s, au_s) = pass1_elements(
            k,
            c,
            p,
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

/// Checks pass 1's slice lengths; returns the block scales of v.
fn pass1_checked<'a>(c: &Codecs, p: &Pass1<'a>) -> &'a [f32] {
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
    v_scale
}

/// Pass 1 (see `format::pass1`) for per-block v scales.
///
/// # Safety
/// The CPU must support `V`'s features. Slice lengths are checked here.
#[inline(always)]
pub(super) unsafe fn pass1<V: Lanes>(k: &StepConsts, c: &Codecs, bs: usize, mut p: Pass1<'_>) {
    let v_scale = pass1_checked(c, &p);
    let n = p.w.len();
    // SAFETY: `V`'s features per this function's contract; every load and
    // store is bounded by `e + N <= end <= n` and the lengths checked above
    // (the nibble slices hold n / 2 bytes, e is even: blocks are even).
    unsafe {
        let u = Update::<V>::new(k, c);
        for (b, start) in (0..n).step_by(bs).enumerate() {
            pass1_block(k, c, &u, &mut p, v_scale, b, (start, (start + bs).min(n)));
        }
    }
}

/// Pass 2's registers: the code books' midpoints.
#[derive(Clone, Copy)]
struct Encode<'a, V: Lanes> {
    mlut: MLut<'a, V>,
    mids_v: V::Search,
    /// v's map is `{k/16}`: the arithmetic search.
    uniform: bool,
    eight: bool,
}

impl<'a, V: Lanes> Encode<'a, V> {
    /// # Safety
    /// The CPU must support `V`'s features.
    #[inline(always)]
    unsafe fn new(c: &'a Codecs) -> Self {
        // SAFETY: `V`'s features per this function's contract.
        unsafe {
            Encode {
                mlut: MLut::new(&c.m),
                mids_v: V::search_mids(&c.v.mids),
                uniform: (0..16).all(|k| c.v.values[k] == (k + 1) as f32 / 16.0),
                eight: matches!(c.m, MCodec::Eight(_)),
            }
        }
    }

    /// # Safety
    /// `V`'s features.
    #[inline(always)]
    unsafe fn v(&self, x: V) -> V::Idx {
        // SAFETY: `V`'s features per this function's contract.
        unsafe {
            if self.uniform {
                V::search_uniform(x)
            } else {
                V::nearest16(self.mids_v, x)
            }
        }
    }

    /// Encode 4-bit m and v of elements `e..e + 2N` (inverse block scales
    /// `im`, `iv`).
    ///
    /// # Safety
    /// `V`'s features; 4-bit m; `e + 2N` within the scratch and the codes
    /// (`(e + 2N) / 2` bytes), `e` even.
    #[inline(always)]
    unsafe fn pair(&self, p: &mut Pass2<'_>, e: usize, im: V, iv: V) {
        // SAFETY: per this function's contract.
        unsafe {
            let sm = |e: usize| V::load(p.sm.as_ptr().add(e)).mul(im);
            let su = |e: usize| V::load(p.su.as_ptr().add(e)).mul(iv);
            let (m0, m1) = (self.mlut.encode(sm(e)), self.mlut.encode(sm(e + V::LANES)));
            V::store_nibbles_pair(m0, m1, p.m_codes.as_mut_ptr().add(e / 2));
            let (v0, v1) = (self.v(su(e)), self.v(su(e + V::LANES)));
            V::store_nibbles_pair(v0, v1, p.v_codes.as_mut_ptr().add(e / 2));
        }
    }
}

/// Pass 2 of block `b` (elements `start..end`).
///
/// # Safety
/// `V`'s features, and the slice lengths `pass2` asserts.
#[inline(always)]
unsafe fn pass2_block<V: Lanes>(
    c: &Codecs,
    x: &Encode<'_, V>,
    p: &mut Pass2<'_>,
    v_inv: &[f32],
    b: usize,
    (start, end): (usize, usize),
) {
    // SAFETY: per this function's contract; every load is bounded by
    // `e + N <= end` (or `e + 2N`) and every store by the code lengths.
    unsafe {
        let [next_w, next_g] = p.ahead.map(|a| a as *const i8);
        // Pass 2 reads only L2 (the scratch): the next group's weight
        // and gradient stream in under its arithmetic, block for block.
        if !next_w.is_null() {
            for off in (4 * start..4 * end).step_by(LINE) {
                _mm_prefetch::<_MM_HINT_T1>(next_w.wrapping_add(off));
                _mm_prefetch::<_MM_HINT_T1>(next_g.wrapping_add(off));
            }
        }
        let (im, iv) = (V::splat(p.m_inv[b]), V::splat(v_inv[b]));
        let sm = |e: usize| V::load(p.sm.as_ptr().add(e)).mul(im);
        let su = |e: usize| V::load(p.su.as_ptr().add(e)).mul(iv);
        let mut e = start;
        while x.eight && e + V::LANES <= end {
            V::store_bytes(x.mlut.encode(sm(e)), p.m_codes.as_mut_ptr().add(e));
            V::store_nibbles(x.v(su(e)), p.v_codes.as_mut_ptr().add(e / 2));
            e += V::LANES;
        }
        while !x.eight && e + 2 * V::LANES <= end {
            x.pair(p, e, im, iv);
            e += 2 * V::LANES;
        }
        while !x.eight && e + V::LANES <= end {
            V::store_nibbles(x.mlut.encode(sm(e)), p.m_codes.as_mut_ptr().add(e / 2));
            V::store_nibbles(x.v(su(e)), p.v_codes.as_mut_ptr().add(e / 2));
            e += V::LANES;
        }
        pass2_elements(
            c,
            p,
            b,
            e..end,
            |m, e, x| m_encode(&c.m, m, e, x),
            |b, _| v_inv[b],
        );
    }
}

/// Checks pass 2's slice lengths; returns the inverse block scales of v.
fn pass2_checked<'a>(c: &Codecs, p: &Pass2<'a>) -> &'a [f32] {
    let VScale::Block(v_inv) = p.v_inv else {
        unreachable!("SIMD pass2: block scales only")
    };
    let n = p.sm.len();
    let m_bytes = if matches!(c.m, MCodec::Eight(_)) {
        n
    } else {
        n.div_ceil(2)
    };
    assert!(p.su.len() == n && p.m_codes.len() >= m_bytes && p.v_codes.len() * 2 >= n);
    v_inv
}

/// Pass 2 (see `format::pass2`) for per-block v scales.
///
/// # Safety
/// The CPU must support `V`'s features. Slice lengths are checked here.
#[inline(always)]
pub(super) unsafe fn pass2<V: Lanes>(c: &Codecs, bs: usize, mut p: Pass2<'_>) {
    let v_inv = pass2_checked(c, &p);
    let n = p.sm.len();
    // SAFETY: `V`'s features per this function's contract; the block
    // bodies stay within the lengths checked above.
    unsafe {
        let x = Encode::<V>::new(c);
        for (b, start) in (0..n).step_by(bs).enumerate() {
            pass2_block(c, &x, &mut p, v_inv, b, (start, (start + bs).min(n)));
        }
    }
}

/// Pass 2 of one group and pass 1 of the next, interleaved two vectors at a
/// time: pass 1 waits on the divider (a square root and a division per
/// element), pass 2 on shuffles and compares, so the core overlaps them.
/// The same operations per element as [`pass2`] then [`pass1`] (the two
/// touch disjoint buffers), so the same bits.
///
/// # Safety
/// The CPU must support `V`'s features. Slice lengths are checked here.
#[inline(always)]
pub(super) unsafe fn pass2_then_1<V: Lanes>(
    k: &StepConsts,
    c: &Codecs,
    bs: usize,
    mut p2: Pass2<'_>,
    mut p1: Pass1<'_>,
) {
    let (v_inv, v_scale) = (pass2_checked(c, &p2), pass1_checked(c, &p1));
    let (n2, n1) = (p2.sm.len(), p1.w.len());
    // SAFETY: `V`'s features per this function's contract; the block
    // bodies stay within the lengths checked above, and the fused loop
    // runs only over blocks that are whole in both groups (`e + 2N <= end`
    // for both).
    unsafe {
        let (u, x) = (Update::<V>::new(k, c), Encode::<V>::new(c));
        let fuse = !x.eight && bs.is_multiple_of(2 * V::LANES);
        for b in 0..n1.max(n2).div_ceil(bs) {
            let start = b * bs;
            let (end2, end1) = ((start + bs).min(n2), (start + bs).min(n1));
            if fuse && end2 == start + bs && end1 == start + bs {
                let (im, iv) = (V::splat(p2.m_inv[b]), V::splat(v_inv[b]));
                let s = (V::splat(p1.m_scale[b]), V::splat(v_scale[b]));
                let mut acc = (V::zero(), V::zero());
                for e in (start..end1).step_by(2 * V::LANES) {
                    x.pair(&mut p2, e, im, iv);
                    u.pair(&mut p1, e, s, &mut acc);
                }
                p1.m_absmax[b] = acc.0.hmax();
                p1.u_max[b] = acc.1.hmax();
                continue;
            }
            if start < n2 {
                pass2_block(c, &x, &mut p2, v_inv, b, (start, end2));
            }
            if start < n1 {
                pass1_block(k, c, &u, &mut p1, v_scale, b, (start, end1));
            }
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

/// The interleaved `pass2_then_1` over `$token` (AVX2 only: the AVX-512
/// step keeps its two passes).
macro_rules! interleaved_entry_point {
    ($token:ty, $lanes:ty, $features:literal) => {
        /// Pass 2 of one group and pass 1 of the next, interleaved.
        pub(super) fn pass2_then_1(
            _proof: $token,
            k: &StepConsts,
            c: &Codecs,
            bs: usize,
            p2: Pass2<'_>,
            p1: Pass1<'_>,
        ) {
            #[target_feature(enable = $features)]
            unsafe fn imp(k: &StepConsts, c: &Codecs, bs: usize, p2: Pass2<'_>, p1: Pass1<'_>) {
                // SAFETY: the features are enabled here.
                unsafe { super::kernel::pass2_then_1::<$lanes>(k, c, bs, p2, p1) }
            }
            // SAFETY: the token proves the features; the body checks every
            // slice length it relies on.
            unsafe { imp(k, c, bs, p2, p1) }
        }
    };
}
pub(super) use {entry_points, interleaved_entry_point};
