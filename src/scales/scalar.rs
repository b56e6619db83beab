//! The scale codec's scalar twin (a leaf: no `unsafe`, no dispatch); the
//! format is described in the module docs of [`crate::scales`].

/// Code of an all-zero block (scale exactly 0).
pub(crate) const ZERO_CODE: u8 = 255;
/// Code steps between the group's largest and smallest non-zero scale.
pub(crate) const STEPS: f32 = 254.0;

/// `log2(r)` for a positive normal `r`, to ~1e-5: exponent bits plus the
/// atanh series of the mantissa. Only a starting guess for the code search
/// (the result is fixed up against the table), so its accuracy affects the
/// speed, never the codes.
#[inline(always)]
pub(crate) fn log2_approx(r: f32) -> f32 {
    let bits = r.to_bits();
    let e = ((bits >> 23) & 0xff) as i32 - 127;
    let m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    let z = (m - 1.0) / (m + 1.0);
    let z2 = z * z;
    let series = z * (1.0 + z2 * (1.0 / 3.0 + z2 * (0.2 + z2 * (1.0 / 7.0))));
    e as f32 + series * (2.0 / std::f32::consts::LN_2)
}

#[inline]
pub(crate) fn log2_step(max: f32, min: f32) -> f32 {
    if min < max {
        // Scales are normal f32 (clamped to [min_scale^2, max_scale^2]), so
        // min / max >= 2^-254 and the step is >= -1 (checkpoints are checked
        // for it; the exp2 table relies on it).
        (log2_det(min / max) / STEPS).max(-1.0)
    } else {
        0.0
    }
}

/// `log2(r)` of a positive finite `r`, from IEEE double operations only
/// (exponent bits plus the atanh series of the mantissa in
/// `[sqrt(1/2), sqrt(2)]`, rounded to f32 once). libm's `log2f` differs
/// between platforms and is not correctly rounded (glibc's differs from the
/// rounded exact value for about 1 in 7000 inputs), so the stored step would
/// depend on the machine; this gives the same step on every CPU and on the
/// GPU (src/gpu/kernels/optim.cu runs the same operations).
pub(crate) fn log2_det(r: f32) -> f32 {
    let bits = r.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32;
    let mut m;
    if e == 0 {
        // Subnormal: the mantissa as an integer times 2^-149.
        m = (bits & 0x007f_ffff) as f64;
        let mut k = 0;
        while m >= 2.0 {
            m *= 0.5;
            k += 1;
        }
        e = k - 149;
    } else {
        m = 1.0 + (bits & 0x007f_ffff) as f64 * (1.0 / 8_388_608.0);
        e -= 127;
    }
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let z = (m - 1.0) / (m + 1.0);
    let z2 = z * z;
    let mut s = 2.0 / 19.0;
    for k in [17.0, 15.0, 13.0, 11.0, 9.0, 7.0, 5.0, 3.0] {
        s = 2.0 / k + z2 * s;
    }
    s = 2.0 + z2 * s;
    (e as f64 + z * s * std::f64::consts::LOG2_E) as f32
}

/// `2^y` for `y` in `[-126, 0]`: exponent bits times a degree-6 Taylor
/// polynomial of `2^f`, `f` in `[-0.5, 0.5]` (relative error < 1e-6;
/// exactness is not needed, determinism is: plain f32 operations, no libm).
#[inline(always)]
pub(crate) fn exp2_neg(y: f32) -> f32 {
    // Round to the nearest integer without libm (`as` truncates; -y >= 0).
    let t = ((0.5 - y) as i32).min(126);
    let f = y + t as f32;
    const C: [f32; 6] = EXP2_C;
    let p = 1.0 + f * (C[0] + f * (C[1] + f * (C[2] + f * (C[3] + f * (C[4] + f * C[5])))));
    p * f32::from_bits(((127 - t) as u32) << 23)
}

/// Taylor coefficients `ln2^k / k!` of `2^f` (shared with the AVX-512 table,
/// which runs the same operations in the same order).
pub(crate) const EXP2_C: [f32; 6] = [
    std::f32::consts::LN_2,
    0.240_226_5,
    0.055_504_11,
    0.009_618_129,
    0.001_333_356,
    0.000_154_035_3,
];

/// Fill `t[..255]` with `max * 2^(c * step)`: the scalar twin of the
/// AVX-512 table (the same operations in the same order). Inlined, so the
/// AVX2 instantiation (`avx2.rs`) vectorizes it.
#[inline(always)]
pub(crate) fn fill_table(max: f32, step: f32, t: &mut [f32; 256]) {
    for (c, x) in t.iter_mut().enumerate().take(255) {
        *x = max * exp2_neg(c as f32 * step);
    }
}

/// The 256 decoded scales of a group: `t[0] = max`, `t[c] = max * 2^(c *
/// step)` made non-increasing (a running minimum, so the search below is
/// exact whatever the polynomial's rounding), `t[255] = 0`. `fill` writes
/// the raw values ([`fill_table`] or a SIMD twin of it).
#[inline(always)]
pub(crate) fn table_with(
    max: f32,
    step: f32,
    t: &mut [f32; 256],
    fill: impl FnOnce(f32, f32, &mut [f32; 256]),
) {
    fill(max, step, t);
    t[0] = max;
    // Usually already non-increasing (a vectorizable check); otherwise take
    // the running minimum. Either way the same table results.
    let sorted = t[..255].windows(2).fold(true, |ok, w| ok & (w[1] <= w[0]));
    if !sorted {
        for c in 1..255 {
            t[c] = t[c].min(t[c - 1]);
        }
    }
    t[ZERO_CODE as usize] = 0.0;
}

/// Decode the scales of one group (`codes.len()` blocks) into `out`, given
/// the group's table.
pub(crate) fn decode_with_table(codes: &[u8], t: &[f32; 256], out: &mut [f32]) {
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = t[c as usize];
    }
}

/// The largest code `c <= 254` with `t[c] >= x` (for `x > 0`), walking
/// from `guess`; the table is non-increasing with `t[0] = max >= x`, so the
/// answer does not depend on the guess.
#[inline]
pub(crate) fn search_from(x: f32, guess: usize, t: &[f32; 256]) -> usize {
    let mut idx = guess.min(254);
    while idx > 0 && t[idx] < x {
        idx -= 1;
    }
    while idx < 254 && t[idx + 1] >= x {
        idx += 1;
    }
    idx
}

/// The code of one scale `x` (the fix-up of a failed SIMD guess too):
/// writes the code and the decoded scale.
#[inline]
pub(crate) fn encode_one(x: &mut f32, c: &mut u8, guess: usize, t: &[f32; 256]) {
    if *x == 0.0 {
        *c = ZERO_CODE;
        *x = 0.0;
    } else {
        let idx = search_from(*x, guess, t);
        *c = idx as u8;
        *x = t[idx];
    }
}

/// What a search needs of a group: its largest scale, `1 / step` and its
/// decoded table.
pub(crate) struct GroupTable<'a> {
    pub(crate) max: f32,
    pub(crate) inv_step: f32,
    pub(crate) t: &'a [f32; 256],
}

/// A SIMD search over a prefix of the scales: `(s, codes, group) -> how
/// many leading entries it encoded`.
pub(crate) type PrefixSearch<'a> = &'a dyn Fn(&mut [f32], &mut [u8], &GroupTable<'_>) -> usize;

/// The group's `(max, step)` and its table in `t`; `None` for an all-zero
/// group, whose codes, scales and table it has then written (255, 0, 0).
#[inline(always)]
fn group_table(
    s: &mut [f32],
    codes: &mut [u8],
    fill: impl FnOnce(f32, f32, &mut [f32; 256]),
    t: &mut [f32; 256],
) -> Option<(f32, f32)> {
    let max = s.iter().fold(0f32, |a, &x| a.max(x));
    let min = s
        .iter()
        .filter(|&&x| x > 0.0)
        .fold(f32::INFINITY, |a, &x| a.min(x));
    if max == 0.0 {
        codes.fill(ZERO_CODE);
        s.fill(0.0);
        t.fill(0.0);
        return None;
    }
    let step = log2_step(max, min);
    table_with(max, step, t, fill);
    Some((max, step))
}

/// [`encode_with_table`] with the branch-free binary search
/// (`super::bisect`) in place of the guesses and walks: the same codes,
/// tables and decoded scales (tested against it), at a fixed cost per
/// scale. The scalar and AVX2 codecs use it.
#[inline(always)]
pub(crate) fn encode_bisect_with_table(
    s: &mut [f32],
    codes: &mut [u8],
    fill: impl FnOnce(f32, f32, &mut [f32; 256]),
    t: &mut [f32; 256],
) -> (f32, f32) {
    encode_table_then(s, codes, fill, t, super::bisect::encode_all)
}

/// [`encode_bisect_with_table`] with `search` in place of
/// `bisect::encode_all`: a twin of it (the same codes and decoded scales)
/// for a SIMD level.
#[inline(always)]
pub(crate) fn encode_table_then(
    s: &mut [f32],
    codes: &mut [u8],
    fill: impl FnOnce(f32, f32, &mut [f32; 256]),
    t: &mut [f32; 256],
    search: impl FnOnce(&mut [f32], &mut [u8], &[f32; 256]),
) -> (f32, f32) {
    let Some((max, step)) = group_table(s, codes, fill, t) else {
        return (0.0, 0.0);
    };
    search(s, codes, t);
    (max, step)
}

/// Encode the (non-negative, finite) scales `s` of one group: writes the
/// codes, returns `(max, step)` and overwrites `s` with the decoded scales.
/// Each code is the largest `c <= 254` with `t[c] >= s`, so every decoded
/// scale is at least its block's absmax. `fill` builds the table (see
/// [`table_with`]); `prefix`, when given, encodes a leading run first (it
/// must give exactly these codes).
/// The group's decoded table is left in `t` (all zeros for an all-zero
/// group): the unbiased rounding of v's scales (`dither.rs`) needs each
/// code's neighbour.
#[inline(always)]
pub(crate) fn encode_with_table(
    s: &mut [f32],
    codes: &mut [u8],
    fill: impl FnOnce(f32, f32, &mut [f32; 256]),
    prefix: Option<PrefixSearch<'_>>,
    t: &mut [f32; 256],
) -> (f32, f32) {
    let Some((max, step)) = group_table(s, codes, fill, t) else {
        return (0.0, 0.0);
    };
    let inv_step = if step < 0.0 { 1.0 / step } else { 0.0 };
    // The fast logarithm is good to ~1e-5: with code steps below 1e-3
    // (max/min < 1.2) the exact one keeps the walk short.
    let fast = step < -1e-3;
    let done = match prefix {
        Some(search) if fast => search(s, codes, &GroupTable { max, inv_step, t }),
        _ => 0,
    };
    // The guesses first, a chunk at a time, in a loop without branches (the
    // AVX2 instantiation vectorizes it), then the walks; a guess only
    // shortens a walk, the code is the table's.
    const CHUNK: usize = 64;
    for (xs, cs) in s[done..]
        .chunks_mut(CHUNK)
        .zip(codes[done..].chunks_mut(CHUNK))
    {
        let mut guesses = [254i32; CHUNK];
        for (g, &x) in guesses.iter_mut().zip(xs.iter()) {
            let l = if fast {
                log2_approx(x / max)
            } else {
                (x / max).log2()
            };
            let at = (l * inv_step).clamp(0.0, STEPS) as i32;
            *g = if step == 0.0 || x == 0.0 { 254 } else { at };
        }
        for ((x, c), &g) in xs.iter_mut().zip(cs.iter_mut()).zip(&guesses) {
            encode_one(x, c, g as usize, t);
        }
    }
    (max, step)
}

/// [`encode_with_table`] on the scalar table, no SIMD prefix: the
/// reference every other search is tested against.
#[cfg(test)]
pub(crate) fn encode(s: &mut [f32], codes: &mut [u8]) -> (f32, f32) {
    let mut t = [0f32; 256];
    encode_with_table(s, codes, fill_table, None, &mut t)
}

/// Decode one group with the scalar table: the scalar twin.
#[cfg(test)]
pub(crate) fn decode(codes: &[u8], max: f32, step: f32, out: &mut [f32]) {
    let mut t = [0f32; 256];
    table_with(max, step, &mut t, fill_table);
    decode_with_table(codes, &t, out);
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
        let (max, step) = encode(&mut s, &mut codes);
        let mut dec = vec![0f32; 256];
        decode(&codes, max, step, &mut dec);
        let min = max * 2f32.powf(254.0 * step);
        assert_eq!(dec, s);
        let ratio = (max / min).powf(1.0 / 254.0);
        for (d, o) in dec.iter().zip(&orig) {
            if *o == 0.0 {
                assert_eq!(*d, 0.0);
            } else {
                assert!(*d >= *o && *d <= *o * ratio * 1.0001, "{d} {o}");
            }
        }
        for k in 0..=254u8 {
            let y = k as f32 * -0.37;
            let e = exp2_neg(y);
            assert!((e / 2f32.powf(y) - 1.0).abs() < 1e-6, "{y}");
        }
    }

    #[test]
    fn codes_are_the_largest_code_not_below_the_scale() {
        for spread in [1.0001f32, 1.5, 10.0, 1e4, 1e30] {
            let mut s: Vec<f32> = (0..256)
                .map(|i| spread.powf(((i * 37) % 256) as f32 / 255.0) * 1e-3)
                .collect();
            let orig = s.clone();
            let mut codes = vec![0u8; 256];
            let (max, step) = encode(&mut s, &mut codes);
            let mut t = [0f32; 256];
            table_with(max, step, &mut t, fill_table);
            for (x, c) in orig.iter().zip(&codes) {
                let best = (0..255).filter(|&k| t[k] >= *x).max().unwrap();
                assert_eq!(*c as usize, best, "spread {spread}");
            }
        }
    }

    #[test]
    fn log2_det_is_close_and_exact_on_powers_of_two() {
        for i in 1..20000 {
            let r = (i as f32 / 20000.0).powi(9);
            let d = (log2_det(r) as f64 - (r as f64).log2()).abs();
            assert!(d <= 1e-6 * (r as f64).log2().abs().max(1.0), "{r}");
        }
        for k in -149..=0i32 {
            let r = if k >= -126 {
                f32::from_bits(((k + 127) as u32) << 23)
            } else {
                f32::from_bits(1 << (k + 149))
            };
            assert_eq!(log2_det(r), k as f32);
        }
    }

    #[test]
    fn log2_approx_is_close() {
        for i in 1..2000 {
            let r = (i as f32 / 2000.0).powi(7);
            assert!((log2_approx(r) - r.log2()).abs() < 2e-5, "{r}");
        }
    }

    #[test]
    fn constant_and_single() {
        let mut s = vec![3.5f32; 10];
        let mut codes = vec![0u8; 10];
        let (max, step) = encode(&mut s, &mut codes);
        assert_eq!((max, step), (3.5, 0.0));
        assert!(s.iter().all(|&x| x == 3.5));
        let mut z = vec![0f32; 4];
        let mut c = vec![0u8; 4];
        assert_eq!(encode(&mut z, &mut c), (0.0, 0.0));
        assert!(c.iter().all(|&x| x == ZERO_CODE));
    }
}
