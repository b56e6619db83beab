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

use super::scalar::{exp2_neg, STEPS, ZERO_CODE};

/// log2 of the ratio of neighbouring codes: an eighth of an octave (9 %);
/// the 255 codes span 2^-31.75 of the row's largest scale, and a smaller
/// non-zero scale takes the last code (rounded up).
pub(crate) const ROW_STEP: f32 = -0.125;

/// `2^(c * ROW_STEP)` for `c < 255` (non-increasing), 0 for code 255.
fn grid() -> &'static [f32; 256] {
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

/// The decoded scale of code `c` in a group whose largest scale is `max`.
#[inline]
pub(crate) fn value(max: f32, c: u8) -> f32 {
    max * grid()[c as usize]
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
/// scale. `max * t[c]` is non-increasing in `c`, so the code does not
/// depend on the guess the walk starts from.
pub(crate) fn encode(s: &mut [f32], codes: &mut [u8]) -> f32 {
    let t = grid();
    let max = s.iter().fold(0f32, |a, &x| a.max(x));
    let inv_max = if max > 0.0 { 1.0 / max } else { 0.0 };
    for (x, c) in s.iter_mut().zip(codes.iter_mut()) {
        if *x == 0.0 {
            *c = ZERO_CODE;
            continue;
        }
        let mut idx = guess(*x * inv_max);
        while idx > 0 && max * t[idx] < *x {
            idx -= 1;
        }
        while idx < 254 && max * t[idx + 1] >= *x {
            idx += 1;
        }
        *c = idx as u8;
        *x = max * t[idx];
    }
    max
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
            assert!(c == 254 || value(max, c as u8 + 1) < orig[i], "{i}");
            // The grid is 2^(c / -8) to float32 rounding.
            let want = max as f64 * 2f64.powf(c as f64 * ROW_STEP as f64);
            assert!((s[i] as f64 / want - 1.0).abs() < 1e-5, "{i}");
        }
        assert_eq!(codes[39], 254);
        let mut out = vec![0f32; s.len()];
        decode(&codes, max, &mut out);
        assert_eq!(out, s);
        let mut z = vec![0f32; 3];
        let mut c = vec![0u8; 3];
        assert_eq!(encode(&mut z, &mut c), 0.0);
        assert_eq!(c, vec![ZERO_CODE; 3]);
    }
}
