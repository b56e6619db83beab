//! The fused step's layout and its scalar twin: element math, code
//! layout, the argument structs of the two passes, and the scalar passes
//! every SIMD kernel is tested against (a leaf: no `unsafe`, no dispatch).
//!
//! A group is up to [`GROUP_BLOCKS`] blocks; per group:
//!
//! 1. `pass1`: per element, decode m and v from their codes and the block's
//!    scale, apply the Adam(W) update to the weight, and write the new m and
//!    the new v (in the map's domain, `u = v` or `u = sqrt(v)`) to a
//!    per-thread scratch of one group; record each block's absmax.
//! 2. the caller turns absmaxes into (double-quantized) scales;
//! 3. `pass2`: normalize the scratch by the new scales and encode.
//!
//! Only one group of f32 m and v exists at a time per thread; the full
//! tensors are never materialized.
//!
//! Element math (docs/optim.md), the same IEEE operations in the same
//! order in every path (no FMA contraction), so SIMD and scalar agree bit
//! for bit:
//! `g' = g + l2 * w`, `m = b1 m + (1-b1) g'`, `v = b2 v + (1-b2) g'^2`,
//! `w = (w - lr_wd * w) - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)`
//! (one square root per element, shared with the `sqrt(v)` maps),
//! where `l2 = wd` for Adam and 0 for AdamW, `lr_wd = lr * wd` for AdamW and
//! 0 for Adam.
//!
//! Code layout: 4-bit codes two per byte, element `2i` in the low nibble of
//! byte `i`, `2i + 1` in the high nibble; blocks have an even size, so every
//! block starts on a byte. int8 m codes are one byte per element.

use super::codebook::{Codebook16, Codebook256};

/// Blocks per group: per kernel work item, and per double-quantization
/// group of the block scales (`crate::scales`).
pub(crate) const GROUP_BLOCKS: usize = 256;

/// Per-step constants of the element math.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StepConsts {
    pub(crate) b1: f32,
    pub(crate) b2: f32,
    pub(crate) omb1: f32,
    pub(crate) omb2: f32,
    /// `1 / sqrt(1 - b2^t)`.
    pub(crate) inv_sqrt_bc2: f32,
    pub(crate) eps: f32,
    /// `lr / (1 - b1^t)`.
    pub(crate) step_size: f32,
    /// `lr * wd` (AdamW) or 0.
    pub(crate) lr_wd: f32,
    /// `wd` (Adam, L2 folded into the gradient) or 0.
    pub(crate) l2: f32,
}

impl StepConsts {
    /// Constants for step `t = step + 1`.
    pub(crate) fn new(
        lr: f32,
        b1: f32,
        b2: f32,
        eps: f32,
        wd: f32,
        decoupled: bool,
        t: u64,
    ) -> Self {
        let t = t.min(i32::MAX as u64) as i32;
        let bc1 = 1.0 - (b1 as f64).powi(t);
        let bc2 = 1.0 - (b2 as f64).powi(t);
        StepConsts {
            b1,
            b2,
            omb1: 1.0 - b1,
            omb2: 1.0 - b2,
            inv_sqrt_bc2: (1.0 / bc2.sqrt()) as f32,
            eps,
            step_size: (lr as f64 / bc1) as f32,
            lr_wd: if decoupled { lr * wd } else { 0.0 },
            l2: if decoupled { 0.0 } else { wd },
        }
    }

    /// One element: returns `(w, m, v, sqrt(v))`.
    #[inline(always)]
    pub(crate) fn element(&self, w: f32, g: f32, m_hat: f32, v_hat: f32) -> (f32, f32, f32, f32) {
        let gp = g + self.l2 * w;
        let m = self.b1 * m_hat + self.omb1 * gp;
        let v = self.b2 * v_hat + self.omb2 * (gp * gp);
        let r = v.sqrt();
        let denom = r * self.inv_sqrt_bc2 + self.eps;
        let w = (w - self.lr_wd * w) - (self.step_size * m) / denom;
        (w, m, v, r)
    }
}

/// The m code book.
#[derive(Clone, Debug)]
pub(crate) enum MCodec {
    Four(Codebook16),
    Eight(Box<Codebook256>),
}

/// Code books of one optimizer.
#[derive(Clone, Debug)]
pub(crate) struct Codecs {
    pub(crate) m: MCodec,
    pub(crate) v: Codebook16,
    pub(crate) sqrt_domain: bool,
}

impl Codecs {
    /// v (linear domain) from its code and scale.
    #[inline(always)]
    pub(crate) fn v_decode(&self, code: u8, scale: f32) -> f32 {
        let u = self.v.decode(code) * scale;
        if self.sqrt_domain {
            u * u
        } else {
            u
        }
    }

    /// v in the map's domain, given `v` and `sqrt(v)`.
    #[inline(always)]
    pub(crate) fn to_domain(&self, v: f32, r: f32) -> f32 {
        if self.sqrt_domain {
            r
        } else {
            v
        }
    }
}

/// Decoded (unscaled) m of element `e`.
#[inline(always)]
pub(crate) fn m_decode(m: &MCodec, codes: &[u8], e: usize) -> f32 {
    match m {
        MCodec::Four(cb) => cb.decode(nibble(codes, e)),
        MCodec::Eight(cb) => cb.decode(codes[e]),
    }
}

/// Store the nearest code of the normalized `x` for element `e`.
#[inline(always)]
pub(crate) fn m_encode(m: &MCodec, codes: &mut [u8], e: usize, x: f32) {
    match m {
        MCodec::Four(cb) => set_nibble(codes, e, cb.encode(x)),
        MCodec::Eight(cb) => codes[e] = cb.encode(x),
    }
}

#[inline(always)]
pub(crate) fn nibble(codes: &[u8], e: usize) -> u8 {
    (codes[e >> 1] >> ((e & 1) * 4)) & 15
}

#[inline(always)]
pub(crate) fn set_nibble(codes: &mut [u8], e: usize, c: u8) {
    let sh = (e & 1) * 4;
    let b = &mut codes[e >> 1];
    *b = (*b & !(15 << sh)) | (c << sh);
}

/// How v is scaled: per block, or per element by rank-1 statistics.
#[derive(Clone, Copy, Debug)]
pub(crate) enum VScale<'a> {
    Block(&'a [f32]),
    /// `min(rows[i], cols[j])` for element `(i, j)` of a `rows x cols`
    /// matrix; `base` is the group's first element.
    Rank1 {
        rows: &'a [f32],
        cols: &'a [f32],
        base: usize,
    },
}

impl VScale<'_> {
    #[inline(always)]
    pub(crate) fn at(&self, block: usize, e: usize) -> f32 {
        match *self {
            VScale::Block(s) => s[block],
            VScale::Rank1 { rows, cols, base } => {
                let g = base + e;
                rows[g / cols.len()].min(cols[g % cols.len()])
            }
        }
    }
}

/// One group's buffers for pass 1.
pub(crate) struct Pass1<'a> {
    pub(crate) w: &'a mut [f32],
    pub(crate) g: &'a [f32],
    pub(crate) m_codes: &'a [u8],
    pub(crate) v_codes: &'a [u8],
    pub(crate) m_scale: &'a [f32],
    pub(crate) v_scale: VScale<'a>,
    /// Scratch of `w.len()` each: new m and new u.
    pub(crate) sm: &'a mut [f32],
    pub(crate) su: &'a mut [f32],
    /// Per block: absmax of the new m, max of the new u.
    pub(crate) m_absmax: &'a mut [f32],
    pub(crate) u_max: &'a mut [f32],
}

/// One group's buffers for pass 2. `inv_*` hold `1 / scale` (0 for a zero
/// scale); for rank-1 v, `v_inv` is `VScale::Rank1` over the new statistics
/// and is inverted per element.
pub(crate) struct Pass2<'a> {
    pub(crate) sm: &'a [f32],
    pub(crate) su: &'a [f32],
    pub(crate) m_inv: &'a [f32],
    pub(crate) v_inv: VScale<'a>,
    pub(crate) m_codes: &'a mut [u8],
    pub(crate) v_codes: &'a mut [u8],
    /// Where the weight and the gradient continue past this group (the
    /// next group's, usually taken by the same thread): the SIMD kernels
    /// prefetch them while they encode, so the next pass 1 finds its
    /// streams in L2 instead of waiting on DRAM. Hints only, never
    /// dereferenced (a prefetch does not fault), null for none.
    pub(crate) ahead: [*const f32; 2],
}

#[inline(always)]
pub(crate) fn inv(s: f32) -> f32 {
    if s > 0.0 {
        1.0 / s
    } else {
        0.0
    }
}

/// Pass 1, the scalar twin of the SIMD kernels. Dispatches once on the code book and the v
/// scaling so the element loop is monomorphized.
pub(crate) fn pass1(k: &StepConsts, c: &Codecs, bs: usize, p: Pass1<'_>) {
    let vs = p.v_scale;
    match (&c.m, vs) {
        (MCodec::Four(cb), VScale::Block(s)) => {
            pass1_loop(k, c, bs, p, |m, e| cb.decode(nibble(m, e)), |b, _| s[b])
        }
        (MCodec::Four(cb), _) => pass1_loop(
            k,
            c,
            bs,
            p,
            |m, e| cb.decode(nibble(m, e)),
            |b, e| vs.at(b, e),
        ),
        (MCodec::Eight(cb), VScale::Block(s)) => {
            pass1_loop(k, c, bs, p, |m, e| cb.decode(m[e]), |b, _| s[b])
        }
        (MCodec::Eight(cb), _) => {
            pass1_loop(k, c, bs, p, |m, e| cb.decode(m[e]), |b, e| vs.at(b, e))
        }
    }
}

#[inline(always)]
fn pass1_loop(
    k: &StepConsts,
    c: &Codecs,
    bs: usize,
    mut p: Pass1<'_>,
    m_dec: impl Fn(&[u8], usize) -> f32,
    v_scale: impl Fn(usize, usize) -> f32,
) {
    let n = p.w.len();
    for (b, start) in (0..n).step_by(bs).enumerate() {
        let end = (start + bs).min(n);
        let (am, au) = pass1_elements(k, c, &mut p, b, start..end, &m_dec, &v_scale, (0.0, 0.0));
        p.m_absmax[b] = am;
        p.u_max[b] = au;
    }
}

/// Pass 1 over the elements `range` of block `b`, folding the block's
/// running `(absmax of m, max of u)` from `acc`; also the tail of the SIMD
/// kernels.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn pass1_elements(
    k: &StepConsts,
    c: &Codecs,
    p: &mut Pass1<'_>,
    b: usize,
    range: std::ops::Range<usize>,
    m_dec: impl Fn(&[u8], usize) -> f32,
    v_scale: impl Fn(usize, usize) -> f32,
    acc: (f32, f32),
) -> (f32, f32) {
    let sm = p.m_scale[b];
    let (mut am, mut au) = acc;
    for e in range {
        let m_hat = m_dec(p.m_codes, e) * sm;
        let v_hat = c.v_decode(nibble(p.v_codes, e), v_scale(b, e));
        let (w, m, v, r) = k.element(p.w[e], p.g[e], m_hat, v_hat);
        let u = c.to_domain(v, r);
        p.w[e] = w;
        p.sm[e] = m;
        p.su[e] = u;
        am = am.max(m.abs());
        au = au.max(u);
    }
    (am, au)
}

/// Pass 2, the scalar twin.
pub(crate) fn pass2(c: &Codecs, bs: usize, p: Pass2<'_>) {
    let vi = p.v_inv;
    match (&c.m, vi) {
        (MCodec::Four(cb), VScale::Block(s)) => pass2_loop(
            c,
            bs,
            p,
            |m, e, x| set_nibble(m, e, cb.encode(x)),
            |b, _| s[b],
        ),
        (MCodec::Four(cb), _) => pass2_loop(
            c,
            bs,
            p,
            |m, e, x| set_nibble(m, e, cb.encode(x)),
            |b, e| inv(vi.at(b, e)),
        ),
        (MCodec::Eight(cb), VScale::Block(s)) => {
            pass2_loop(c, bs, p, |m, e, x| m[e] = cb.encode(x), |b, _| s[b])
        }
        (MCodec::Eight(cb), _) => pass2_loop(
            c,
            bs,
            p,
            |m, e, x| m[e] = cb.encode(x),
            |b, e| inv(vi.at(b, e)),
        ),
    }
}

#[inline(always)]
fn pass2_loop(
    c: &Codecs,
    bs: usize,
    mut p: Pass2<'_>,
    m_enc: impl Fn(&mut [u8], usize, f32),
    v_inv: impl Fn(usize, usize) -> f32,
) {
    let n = p.sm.len();
    for (b, start) in (0..n).step_by(bs).enumerate() {
        let end = (start + bs).min(n);
        pass2_elements(c, &mut p, b, start..end, &m_enc, &v_inv);
    }
}

/// Pass 2 over the elements `range` of block `b`; also the tail of the
/// SIMD kernels.
#[inline(always)]
pub(crate) fn pass2_elements(
    c: &Codecs,
    p: &mut Pass2<'_>,
    b: usize,
    range: std::ops::Range<usize>,
    m_enc: impl Fn(&mut [u8], usize, f32),
    v_inv: impl Fn(usize, usize) -> f32,
) {
    let im = p.m_inv[b];
    for e in range {
        m_enc(p.m_codes, e, p.sm[e] * im);
        set_nibble(p.v_codes, e, c.v.encode(p.su[e] * v_inv(b, e)));
    }
}

/// True when every value of `x` is finite (the scalar twin of the AVX-512
/// check; a fold without early exit, so it vectorizes).
pub(crate) fn all_finite(x: &[f32]) -> bool {
    x.iter().fold(true, |ok, v| ok & v.is_finite())
}
