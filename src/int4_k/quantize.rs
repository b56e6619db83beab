//! Choosing one super-block of `int4_k` (module docs of `crate::int4_k`):
//! the codes `q`, the 6-bit `(sc, mn)` of each group of 32 and the half
//! pair `(D, Dmin)`.
//!
//! 1. Each group's float step `d >= 0` and minimum `-m <= 0` (Q4_K's grid
//!    reaches down to `-Dmin * mn`, never above 0): `Rtn` from the group's
//!    range widened to include 0; `Search` by `int4_asym`'s weighted search
//!    (`crate::int4_asym::quantize_group`, llama.cpp's `make_qkx2_quants`
//!    idea), its range widened to 0 where the search's minimum is above 0.
//! 2. `D = max d / 63`, `Dmin = max m / 63`, rounded to half (the group of
//!    the largest step or minimum gets code 63).
//! 3. Per group: `Rtn` takes the nearest codes `sc = round(d / D)`,
//!    `mn = round(m / Dmin)`. `Search` scores those and their neighbours
//!    (`+-1` each, nine pairs), then the codes nearest to the weighted
//!    least-squares `(d, m)` of the best pair's 4-bit codes, and keeps the
//!    pair of least weighted squared error
//!    `sum imp * (x - ((D sc) q - Dmin mn))^2` (the float32 values the format
//!    decodes, each 4-bit code the nearest grid point).
//! 4. `Search` also quantizes the super-block by `Rtn` and keeps whichever
//!    has the lower weighted error, so it is never worse than `Rtn` under
//!    that error.

use super::{CODE_MAX, GROUP};
use crate::ggml::f32_to_f16;
use crate::int4_asym::{half, quantize_group, AsymMethod};

/// How a super-block is chosen (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KMethod {
    /// Group ranges, nearest 6-bit codes.
    Rtn,
    /// Weighted search of the group grids and of the 6-bit codes.
    Search,
}

impl KMethod {
    /// The method named `name` (`"rtn"`, `"search"`).
    pub fn parse(name: &str) -> Option<KMethod> {
        match name {
            "rtn" => Some(KMethod::Rtn),
            "search" => Some(KMethod::Search),
            _ => None,
        }
    }
}

/// Quantize one super-block `x` (finite, a multiple of 32 long) into codes
/// `q` (`x.len()`), `sc` and `mn` (one per group); returns the half bits of
/// `(D, Dmin)`.
pub(super) fn quantize_super(
    x: &[f32],
    imp: Option<&[f32]>,
    method: KMethod,
    q: &mut [u8],
    sc: &mut [u8],
    mn: &mut [u8],
) -> (u16, u16) {
    let rtn = choose(x, imp, KMethod::Rtn, q, sc, mn);
    if method == KMethod::Rtn {
        return rtn;
    }
    let rtn_err = super_error(x, imp, rtn, sc, mn, q);
    let (mut q2, mut sc2, mut mn2) = (vec![0u8; q.len()], vec![0u8; sc.len()], vec![0u8; mn.len()]);
    let s = choose(x, imp, KMethod::Search, &mut q2, &mut sc2, &mut mn2);
    if super_error(x, imp, s, &sc2, &mn2, &mut q2) < rtn_err {
        q.copy_from_slice(&q2);
        sc.copy_from_slice(&sc2);
        mn.copy_from_slice(&mn2);
        return s;
    }
    rtn
}

/// Steps 1-3 of the module docs for `method`.
fn choose(
    x: &[f32],
    imp: Option<&[f32]>,
    method: KMethod,
    q: &mut [u8],
    sc: &mut [u8],
    mn: &mut [u8],
) -> (u16, u16) {
    let groups = x.len() / GROUP;
    let mut dm = vec![(0f32, 0f32); groups];
    for (g, p) in dm.iter_mut().enumerate() {
        let xs = &x[g * GROUP..(g + 1) * GROUP];
        let lo = xs.iter().fold(0f32, |a, &v| a.min(v));
        let hi = xs.iter().fold(lo, |a, &v| a.max(v));
        *p = ((hi - lo) / 15.0, -lo);
        if method == KMethod::Search && hi > lo {
            let ig = imp.map(|v| &v[g * GROUP..(g + 1) * GROUP]);
            let (d, m) = quantize_group(
                xs,
                ig,
                AsymMethod::Search,
                &mut q[g * GROUP..(g + 1) * GROUP],
            );
            let (d, m) = (half(d), half(m));
            if m <= 0.0 && d > 0.0 {
                *p = (d, -m);
            }
        }
    }
    let dmax = dm.iter().fold(0f32, |a, p| a.max(p.0));
    let mmax = dm.iter().fold(0f32, |a, p| a.max(p.1));
    let (dh, mh) = (f32_to_f16(dmax / 63.0), f32_to_f16(mmax / 63.0));
    let (big_d, big_m) = (half(dh), half(mh));
    let nearest = |v: f32, unit: f32| -> u8 {
        if unit > 0.0 {
            (v / unit).round().clamp(0.0, f32::from(CODE_MAX)) as u8
        } else {
            0
        }
    };
    for (g, &(d, m)) in dm.iter().enumerate() {
        let xs = &x[g * GROUP..(g + 1) * GROUP];
        let ig = imp.map(|v| &v[g * GROUP..(g + 1) * GROUP]);
        let qg = &mut q[g * GROUP..(g + 1) * GROUP];
        let mut best = (nearest(d, big_d), nearest(m, big_m));
        let mut best_err = group_error(xs, ig, big_d, big_m, best, qg);
        if method == KMethod::Search {
            let start = best;
            let mut trial = [0u8; GROUP];
            let mut consider = |pair: (u8, u8), qg: &mut [u8]| {
                let e = group_error(xs, ig, big_d, big_m, pair, &mut trial);
                if e < best_err {
                    best_err = e;
                    best = pair;
                    qg.copy_from_slice(&trial);
                }
            };
            for ds in -1i32..=1 {
                for dn in -1i32..=1 {
                    let step =
                        |c: u8, k: i32| (i32::from(c) + k).clamp(0, i32::from(CODE_MAX)) as u8;
                    consider((step(start.0, ds), step(start.1, dn)), qg);
                }
            }
            if let Some((d, m)) = least_squares(xs, ig, qg) {
                consider((nearest(d, big_d), nearest(m, big_m)), qg);
            }
        }
        sc[g] = best.0;
        mn[g] = best.1;
    }
    (dh, mh)
}

/// The weighted least-squares `(d, m)` of `x ~ d q - m` for codes `q`;
/// None when singular.
fn least_squares(x: &[f32], imp: Option<&[f32]>, q: &[u8]) -> Option<(f32, f32)> {
    let (mut sw, mut sl, mut sl2, mut sx, mut sxl) = (0f64, 0f64, 0f64, 0f64, 0f64);
    for (i, (&v, &c)) in x.iter().zip(q).enumerate() {
        let (wi, l, v) = (
            f64::from(imp.map_or(1.0, |w| w[i])),
            f64::from(c),
            f64::from(v),
        );
        sw += wi;
        sl += wi * l;
        sl2 += wi * l * l;
        sx += wi * v;
        sxl += wi * v * l;
    }
    let det = sw * sl2 - sl * sl;
    if det <= 0.0 {
        return None;
    }
    let d = (sw * sxl - sx * sl) / det;
    let offset = (sl2 * sx - sl * sxl) / det;
    Some((d as f32, -offset as f32))
}

/// The weighted squared error of group `x` on the grid of `(D sc, Dmin mn)`
/// (f64 sum of the float32 decoded values); the nearest codes go to `q`.
fn group_error(
    x: &[f32],
    imp: Option<&[f32]>,
    big_d: f32,
    big_m: f32,
    (sc, mn): (u8, u8),
    q: &mut [u8],
) -> f64 {
    let (d, m) = (big_d * f32::from(sc), big_m * f32::from(mn));
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let mut err = 0f64;
    for (i, (c, &v)) in q.iter_mut().zip(x).enumerate() {
        *c = ((v + m) * id).round().clamp(0.0, 15.0) as u8;
        let e = f64::from(v) - f64::from(d * f32::from(*c) - m);
        err += f64::from(imp.map_or(1.0, |w| w[i])) * e * e;
    }
    err
}

/// The weighted error of a chosen super-block (codes re-assigned into `q`).
fn super_error(
    x: &[f32],
    imp: Option<&[f32]>,
    (dh, mh): (u16, u16),
    sc: &[u8],
    mn: &[u8],
    q: &mut [u8],
) -> f64 {
    let (big_d, big_m) = (half(dh), half(mh));
    (0..sc.len())
        .map(|g| {
            let r = g * GROUP..(g + 1) * GROUP;
            let ig = imp.map(|v| &v[r.clone()]);
            group_error(&x[r.clone()], ig, big_d, big_m, (sc[g], mn[g]), &mut q[r])
        })
        .sum()
}

/// The weighted squared error `sum imp * (x - w_hat)^2` (f64) of row `r`
/// of `w` against `x` (`in` floats): what the quantizers minimize.
pub fn row_error(w: &super::KWeight, r: usize, x: &[f32], imp: Option<&[f32]>) -> f64 {
    let mut deq = vec![0f32; x.len()];
    w.decode(r, 0, &mut deq);
    x.iter()
        .zip(&deq)
        .enumerate()
        .map(|(i, (&a, &b))| {
            let e = f64::from(a) - f64::from(b);
            f64::from(imp.map_or(1.0, |v| v[i])) * e * e
        })
        .sum()
}
