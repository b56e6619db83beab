//! The scale codec of the row layout of a sharded parameter's optimizer
//! state (`crate::optim`, docs/torch.md "The sharded layout"): a group is
//! one row's few blocks (12 on GPT-2's 768-wide rows), so it stores only
//! the group's largest scale, and each block a code on a fixed log grid
//! below it, `scale = max * 2^(c * ROW_STEP)` (code 255: an all-zero
//! block).
//!
//! The table codec of the flat layout (`super::scalar`) fits its grid to
//! each group's range and builds a 256-entry table per group to decode and
//! to encode; for 12 blocks that cost more than the optimizer step itself.
//! Here the grid is one table built once: a decode is a multiplication, an
//! encode a guess and a short walk over it, and a group stores 4 bytes.

use std::sync::OnceLock;

use super::coin::Dither;
use super::scalar::{exp2_neg, STEPS, ZERO_CODE};

/// log2 of the ratio of neighbouring codes: an eighth of an octave (9 %);
/// the 255 codes span 2^-31.75 of the row's largest scale, and a smaller
/// non-zero scale takes the last code (rounded up).
pub(crate) const ROW_STEP: f32 = -0.125;

/// `2^(c * ROW_STEP)` for `c < 255` (non-increasing), 0 for code 255.
pub(super) fn grid() -> &'static [f32; 256] {
    static GRID: OnceLock<[f32; 256]> = OnceLock::new();
    GRID.get_or_init(|| {
        let mut t = [0f32; 256];
        t[0] = 1.0;
        for c in 1..255 {
            t[c] = exp2_neg(c as f32 * ROW_STEP).min(t[c - 1]);
        }
        t
    })
}

/// Decode the scales of one group into `out`.
pub(crate) fn decode(codes: &[u8], max: f32, out: &mut [f32]) {
    let t = grid();
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = max * t[c as usize];
    }
}

/// Encode the (non-negative, finite) scales `s` of one group: writes each
/// block's code (the largest with a decoded scale at least the block's),
/// overwrites `s` with the decoded scales and returns the group's largest
/// scale. The scalar reference of `ScaleCodec::encode_row`.
pub(crate) fn encode(s: &mut [f32], codes: &mut [u8]) -> f32 {
    encode_scalar(s, codes, None)
}

/// [`encode`], then each block moved to the next smaller code with the
/// probability that makes its decoded scale unbiased (the rule of
/// `optim::dither::dq_encode_dithered`, on this grid). The scalar
/// reference of `ScaleCodec::encode_row` with a dither.
pub(crate) fn encode_dithered(s: &mut [f32], codes: &mut [u8], d: Dither) -> f32 {
    encode_scalar(s, codes, Some(d))
}

fn encode_scalar(s: &mut [f32], codes: &mut [u8], dither: Option<Dither>) -> f32 {
    let t = grid();
    let max = s.iter().fold(0f32, |a, &x| a.max(x));
    let inv_max = if max > 0.0 { 1.0 / max } else { 0.0 };
    for (i, (x, c)) in s.iter_mut().zip(codes.iter_mut()).enumerate() {
        (*c, *x) = round_one(t, max, inv_max, *x, dither, i);
    }
    max
}

/// Block `i`'s code and decoded scale, for scale `x` in a group whose
/// largest scale is `max`.
#[inline]
pub(super) fn round_one(
    t: &[f32; 256],
    max: f32,
    inv_max: f32,
    x: f32,
    dither: Option<Dither>,
    i: usize,
) -> (u8, f32) {
    let k = code_of(t, max, inv_max, x);
    let hi = if k == ZERO_CODE as usize {
        0.0
    } else {
        max * t[k]
    };
    let Some(d) = dither else {
        return (k as u8, hi);
    };
    // The grid's last code and an all-zero block do not move; the fair
    // coin is taken without a branch (one would mispredict half the time).
    let lo = max * t[(k + 1).min(254)];
    let gap = hi - lo;
    let down = (k < 254) & (gap > 0.0) & (d.uniform(i) * gap < hi - x);
    let keep = (down as u32).wrapping_sub(1);
    let dec = f32::from_bits((hi.to_bits() & keep) | (lo.to_bits() & !keep));
    ((k + down as usize) as u8, dec)
}

/// The code of a scale `x` in a group whose largest scale is `max`: the
/// largest `c <= 254` with `max * t[c] >= x`, [`ZERO_CODE`] for `x == 0`.
///
/// [`guess`] lands on the code or the one after it, so the answer lies in
/// the window `g - 2 ..= g + 1`: it is `g - 2` plus the number of the next
/// three codes that still hold `x` (`max * t[c]` is non-increasing in `c`,
/// so those that do come first). Counting compiles to compares and adds:
/// the walk it replaces mispredicted about once per block, which made the
/// codec cost more than the optimizer step of a 12-block row. Should the
/// window ever miss (its first code too small, or all three next codes
/// holding `x`), the walk settles it, so the code never depends on the
/// guess.
#[inline]
pub(super) fn code_of(t: &[f32; 256], max: f32, inv_max: f32, x: f32) -> usize {
    if x == 0.0 {
        return ZERO_CODE as usize;
    }
    let c0 = guess(x * inv_max).saturating_sub(2);
    let holds = |c: usize| (c <= 254) & (max * t[c.min(254)] >= x);
    let n = holds(c0 + 1) as usize + holds(c0 + 2) as usize + holds(c0 + 3) as usize;
    if holds(c0) & (n < 3) {
        return c0 + n;
    }
    walk(t, max, x, c0)
}

/// The code of `x > 0` by walking the grid from `idx`: the reference
/// [`code_of`] falls back to (and is tested against).
fn walk(t: &[f32; 256], max: f32, x: f32, mut idx: usize) -> usize {
    while idx > 0 && max * t[idx] < x {
        idx -= 1;
    }
    while idx < 254 && max * t[idx + 1] >= x {
        idx += 1;
    }
    idx
}

/// A code near the one of the ratio `r = x / max` (`log2(r) / ROW_STEP`, with `log2`
/// taken as the exponent plus the mantissa minus one: within 0.09 of it, so within a
/// code); the walk in [`encode`] makes it exact, so only the speed depends on it.
#[inline]
fn guess(r: f32) -> usize {
    let bits = r.to_bits();
    let e = ((bits >> 23) & 0xff) as i32 - 127;
    let m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    let l = e as f32 + (m - 1.0);
    (l * (1.0 / ROW_STEP)).clamp(0.0, STEPS) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_up_to_the_nearest_code_and_keeps_zero() {
        let mut s: Vec<f32> = (0..40)
            .map(|i| match i {
                5 => 0.0,
                39 => 1e-20, // below the grid: the last code
                _ => 1e-4 * 1.37f32.powi(i),
            })
            .collect();
        let orig = s.clone();
        let mut codes = vec![0u8; s.len()];
        let max = encode(&mut s, &mut codes);
        assert_eq!(max, orig.iter().fold(0f32, |a, &x| a.max(x)));
        for i in 0..s.len() {
            if orig[i] == 0.0 {
                assert_eq!((codes[i], s[i]), (ZERO_CODE, 0.0));
                continue;
            }
            assert!(s[i] >= orig[i], "{i}");
            // The next code down would be too small (or there is none).
            let c = codes[i] as usize;
            assert!(c == 254 || max * grid()[c + 1] < orig[i], "{i}");
            // The grid is 2^(c / -8) to float32 rounding.
            let want = max as f64 * 2f64.powf(c as f64 * ROW_STEP as f64);
            assert!((s[i] as f64 / want - 1.0).abs() < 1e-5, "{i}");
        }
        assert_eq!(codes[39], 254);
        let mut out = vec![0f32; s.len()];
        decode(&codes, max, &mut out);
        assert_eq!(out, s);
        // The window gives the walk's code from either end of the grid.
        let t = grid();
        for max in [1.0f32, 3.7e-3, 6.1e4, 1e-30] {
            for i in 0..20_000u32 {
                let x = max * 2f32.powf(-(i as f32) * 1.7e-3) * (1.0 + (i % 7) as f32 * 1e-7);
                let want = walk(t, max, x, 0);
                assert_eq!(want, walk(t, max, x, 254));
                assert_eq!(code_of(t, max, 1.0 / max, x), want, "{max} {x}");
            }
        }
        let mut z = vec![0f32; 3];
        let mut c = vec![0u8; 3];
        assert_eq!(encode(&mut z, &mut c), 0.0);
        assert_eq!(c, vec![ZERO_CODE; 3]);
    }
}
