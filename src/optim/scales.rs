//! Block scales: one f32 per block, or (double quantization, after QLoRA
//! section 3) an 8-bit code per block plus an f32 pair per group of
//! [`GROUP_BLOCKS`] blocks.
//!
//! The 8-bit code is log-spaced between the group's largest and smallest
//! non-zero scale: `s(c) = max * (min / max)^(c / 254)` for `c = 0..=254`, and
//! `c = 255` is an all-zero block (scale exactly 0). A scale is rounded *up*
//! to the next code, so every value of the block still fits in `[-1, 1]`
//! after normalization; the relative rounding error is at most
//! `(max/min)^(1/254) - 1` (0.9 % for four decades). Unlike QLoRA's linear
//! 8-bit code on the scales, this never rounds the scale of a block with
//! small values (typical for v) to 0 or to the group's maximum.

/// Blocks per double-quantization group (and per kernel work item).
pub const GROUP_BLOCKS: usize = 256;

/// Code of an all-zero block.
pub const ZERO_CODE: u8 = 255;
const STEPS: f32 = 254.0;

#[inline]
fn ln_step(max: f32, min: f32) -> f32 {
    if min < max {
        (min / max).ln() / STEPS
    } else {
        0.0
    }
}

#[inline]
fn decode_one(code: u8, max: f32, step: f32) -> f32 {
    if code == ZERO_CODE {
        0.0
    } else {
        max * (code as f32 * step).exp()
    }
}

/// Decode the scales of one group (`codes.len()` blocks) into `out`.
pub fn dq_decode(codes: &[u8], max: f32, min: f32, out: &mut [f32]) {
    let step = ln_step(max, min);
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = decode_one(c, max, step);
    }
}

/// Encode the (non-negative, finite) scales `s` of one group: writes the
/// codes, returns `(max, min)` and overwrites `s` with the decoded scales
/// (each `>= ` its input).
pub fn dq_encode(s: &mut [f32], codes: &mut [u8]) -> (f32, f32) {
    let max = s.iter().fold(0f32, |a, &x| a.max(x));
    let min = s
        .iter()
        .filter(|&&x| x > 0.0)
        .fold(f32::INFINITY, |a, &x| a.min(x));
    if max == 0.0 {
        codes.fill(ZERO_CODE);
        s.fill(0.0);
        return (0.0, 0.0);
    }
    let step = ln_step(max, min);
    for (x, c) in s.iter_mut().zip(codes.iter_mut()) {
        if *x == 0.0 {
            *c = ZERO_CODE;
            continue;
        }
        let mut code = if step == 0.0 {
            0.0
        } else {
            ((*x / max).ln() / step).floor().clamp(0.0, STEPS)
        } as u8;
        // Round up: the decoded scale must not be below the block's absmax.
        while code > 0 && decode_one(code, max, step) < *x {
            code -= 1;
        }
        *c = code;
        *x = decode_one(code, max, step);
    }
    (max, min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_rounds_up_and_keeps_zero() {
        let mut s: Vec<f32> = (0..256)
            .map(|i| {
                if i % 17 == 0 {
                    0.0
                } else {
                    1e-6 * 1.07f32.powi(i)
                }
            })
            .collect();
        let orig = s.clone();
        let mut codes = vec![0u8; 256];
        let (max, min) = dq_encode(&mut s, &mut codes);
        let mut dec = vec![0f32; 256];
        dq_decode(&codes, max, min, &mut dec);
        assert_eq!(dec, s);
        let ratio = (max / min).powf(1.0 / 254.0);
        for (d, o) in dec.iter().zip(&orig) {
            if *o == 0.0 {
                assert_eq!(*d, 0.0);
            } else {
                assert!(*d >= *o && *d <= *o * ratio * 1.0001, "{d} {o}");
            }
        }
    }

    #[test]
    fn constant_and_single() {
        let mut s = vec![3.5f32; 10];
        let mut codes = vec![0u8; 10];
        let (max, min) = dq_encode(&mut s, &mut codes);
        assert_eq!((max, min), (3.5, 3.5));
        assert!(s.iter().all(|&x| x == 3.5));
        let mut z = vec![0f32; 4];
        let mut c = vec![0u8; 4];
        assert_eq!(dq_encode(&mut z, &mut c), (0.0, 0.0));
        assert!(c.iter().all(|&x| x == ZERO_CODE));
    }
}
