//! Inputs too large for the kernels' intermediates (docs/int4.md, "Range").
//!
//! The INT4 kernels form products `x * q` (or `x * 2^-28 * (q << 28)`,
//! AVX2) with `|q| <= 8` and sum them over a group before applying the
//! scale, and the linear layers' engine (`linear::kernels`) sums `x * code`
//! (FP8 codes up to 448, INT8 up to 127) before its per-row scale: for `|x|` near `f32::MAX` (3e38) those intermediates overflow to
//! inf although NumPy's `x @ W` (which multiplies by the small scale first)
//! is finite. A row of `x` whose largest finite `|x|` is at least
//! `2^ROW_LIMIT_LOG2` is therefore scaled by an exact power of two into range,
//! run through the same kernel, and its outputs scaled back: the result is
//! finite wherever the true product is. Rows in range (all real inputs) are
//! not copied.

/// Rows with a larger `|x|` take the scaled path: `2^64 * 448 * 2^40`
/// (largest FP8 code, any row length) stays below `f32::MAX` (2^128).
const ROW_LIMIT_LOG2: i32 = 64;

/// The power of two `k` by which `row` must be divided (`x * 2^-k`), or
/// `None` when every finite `|x|` is below `2^ROW_LIMIT_LOG2`.
pub(crate) fn row_shift(row: &[f32]) -> Option<i32> {
    let max_bits = row
        .iter()
        .map(|v| v.to_bits() & 0x7FFF_FFFF)
        .filter(|&b| b < 0x7F80_0000)
        .max()?;
    let e = (max_bits >> 23) as i32 - 127;
    (e >= ROW_LIMIT_LOG2).then_some(e - ROW_LIMIT_LOG2 + 1)
}

/// `2^k` for `k` in the normal f32 range.
pub(crate) fn pow2(k: i32) -> f32 {
    debug_assert!((-126..=127).contains(&k));
    f32::from_bits(((k + 127) as u32) << 23)
}

/// Whether some `|x|` is at least `2^ROW_LIMIT_LOG2` or not finite: false
/// settles that no row needs a shift (all real inputs), true sends `x` to
/// the exact per-row search of [`row_shift`] (which ignores inf / NaN).
///
/// One signed compare per value OR-ed together: an integer reduction with
/// no early exit, which the compiler vectorizes on SSE2 (the build's
/// baseline). A scalar pass (the per-row search, or an unsigned max, which
/// SSE2 lacks) took 5-6 % of a one-thread prefill call on a narrow layer
/// (576 -> 192 at M = 512, Zen 3), on the calling thread before the
/// parallel GEMM.
fn may_need_shift(x: &[f32]) -> bool {
    const LIMIT_BITS: i32 = (127 + ROW_LIMIT_LOG2) << 23;
    x.iter().fold(0u32, |a, v| {
        a | ((v.to_bits() & 0x7FFF_FFFF) as i32 >= LIMIT_BITS) as u32
    }) != 0
}

/// Values per piece of [`may_need_shift_par`] (64 KiB of `x`).
const PIECE: usize = 1 << 14;
/// Values from which [`may_need_shift_par`] runs on the pool.
const PAR_MIN: usize = 1 << 17;

/// [`may_need_shift`] in pieces on the pool for a prefill-sized `x`: the
/// pass ran on the calling thread before the GEMM that the pool shares
/// (2.5 % of a one-thread call at M = 512, so 5 % of a two-thread one).
fn may_need_shift_par(x: &[f32]) -> bool {
    if x.len() < PAR_MIN {
        return may_need_shift(x);
    }
    let found = std::sync::atomic::AtomicBool::new(false);
    crate::par::for_each_block(x.len().div_ceil(PIECE), |p| {
        let piece = &x[p * PIECE..((p + 1) * PIECE).min(x.len())];
        if may_need_shift(piece) {
            found.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    found.into_inner()
}

/// Per row of `x` (`in_feat` wide), its shift; `None` when no row needs one.
pub(crate) fn shifts(x: &[f32], in_feat: usize) -> Option<Vec<i32>> {
    // All real inputs are in range: one fast pass over the whole of `x`
    // settles it before any per-row work.
    if !may_need_shift_par(x) {
        return None;
    }
    let s: Vec<i32> = x
        .chunks_exact(in_feat)
        .map(|r| row_shift(r).unwrap_or(0))
        .collect();
    s.iter().any(|&k| k != 0).then_some(s)
}

/// `x` with each row divided by `2^shift` (exact but for underflow of
/// elements `2^-k` below the row's largest, far below the accuracy bound).
pub(crate) fn scaled(x: &[f32], in_feat: usize, shifts: &[i32]) -> Vec<f32> {
    x.chunks_exact(in_feat)
        .zip(shifts)
        .flat_map(|(r, &k)| {
            let f = pow2(-k);
            r.iter().map(move |v| v * f)
        })
        .collect()
}

/// Multiply each row of `y` (`out_feat` wide) back by `2^shift`.
pub(crate) fn unscale(y: &mut [f32], out_feat: usize, shifts: &[i32]) {
    for (r, &k) in y.chunks_exact_mut(out_feat).zip(shifts) {
        if k != 0 {
            let f = pow2(k);
            r.iter_mut().for_each(|v| *v *= f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shifts_only_rows_out_of_range() {
        assert_eq!(row_shift(&[1.0, -3.0, f32::NAN]), None);
        assert_eq!(row_shift(&[f32::INFINITY]), None);
        assert_eq!(row_shift(&[3e38]), Some(128 - 64));
        let x = [1.0, 2.0, 3e38, 0.5];
        let s = shifts(&x, 2).unwrap();
        assert_eq!(s, vec![0, 64]);
        let xs = scaled(&x, 2, &s);
        assert_eq!(xs[..2], [1.0, 2.0]);
        assert_eq!(xs[2], 3e38 / 2f32.powi(64));
    }

    /// The whole-buffer pass sees a large value at every position (of the
    /// vector lanes and the tail), negative ones too; inf / NaN send it to the
    /// exact search, which finds no shift for them.
    #[test]
    fn fast_pass_sees_every_position() {
        for len in [1usize, 7, 8, 9, 17, 40] {
            let x = vec![0.5f32; len];
            assert!(!may_need_shift(&x), "len {len}");
            assert_eq!(shifts(&x, 1), None);
            for at in 0..len {
                let mut x = x.clone();
                x[at] = -f32::powi(2.0, 64);
                assert!(may_need_shift(&x), "len {len} at {at}");
                assert_eq!(shifts(&x, 1).unwrap()[at], 1, "len {len} at {at}");
                x[at] = f32::powi(2.0, 63) * 1.999;
                assert!(!may_need_shift(&x), "len {len} at {at}");
                x[at] = if at % 2 == 0 { f32::INFINITY } else { f32::NAN };
                assert!(may_need_shift(&x), "len {len} at {at}");
                assert_eq!(shifts(&x, 1), None);
            }
        }
        assert!(!may_need_shift(&[]));
    }

    /// The pieces on the pool see a large value or a NaN anywhere in a
    /// prefill-sized `x`, the last partial piece included.
    #[test]
    fn pool_pass_sees_every_piece() {
        let len = PAR_MIN + PIECE / 2 + 3;
        let mut x = vec![-0.25f32; len];
        assert!(!may_need_shift_par(&x));
        for at in [0, PIECE - 1, PIECE, len / 2, len - 1] {
            for bad in [f32::powi(2.0, 64), -f32::powi(2.0, 70), f32::NAN] {
                x[at] = bad;
                assert!(may_need_shift_par(&x), "at {at} value {bad}");
                x[at] = -0.25;
            }
        }
        assert!(!may_need_shift_par(&x));
        let rows = len / 577;
        let mut x = vec![1.0f32; rows * 577];
        x[(rows - 1) * 577 + 5] = 3e38;
        let s = shifts(&x, 577).unwrap();
        assert_eq!(s[rows - 1], 128 - 64);
        assert!(s[..rows - 1].iter().all(|&k| k == 0));
    }
}
