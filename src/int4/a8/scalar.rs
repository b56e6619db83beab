//! The arguments of the int8-activation kernels and their scalar twin, the
//! reference the AVX2 kernel must match bit for bit. No `unsafe`.
//!
//! Per output column `o` and group `g` both compute the exact integer
//! `acc = sum_{i in g} q_w[i, o] * q_x[i]` and then, in f32 and in this
//! order, `y[o] = y[o] + (acc as f32) * (scale_w[g, o] * d[g])`, over the
//! call's groups in ascending order starting from `y[o] = 0`.

use std::ops::Range;

use super::xq8::Xq8;

/// Columns the scalar kernel accumulates at once (in L1).
const TILE: usize = 64;

/// What the int8-activation kernels read.
pub(crate) struct A8Args<'a> {
    /// Packed nibbles, `[num_pairs * out_feat]`.
    pub data: &'a [u8],
    /// Weight scales, `[num_groups * out_feat]`.
    pub scales: &'a [f32],
    /// Output dimension (the row pitch of `data`).
    pub out_feat: usize,
    /// Input rows per scale.
    pub group_size: usize,
    /// The quantized rows of `x`.
    pub x: &'a Xq8,
    /// The groups this call sums over, in order (all of them, or one block
    /// of a split whose partial sums the driver adds in block order).
    pub groups: Range<usize>,
}

impl A8Args<'_> {
    /// Panics unless the sizes agree (the fields of `QuantizedWeight` are
    /// public, so a broken layout must stop here, before unchecked reads).
    pub(crate) fn check(&self) {
        let (n, x) = (self.out_feat, self.x);
        assert!(
            n > 0
                && self.group_size >= 2
                && self.group_size.is_multiple_of(2)
                && x.pitch == x.num_groups * self.group_size
                && self.data.len() == x.pitch / 2 * n
                && self.scales.len() == x.num_groups * n
                && x.q.len() == x.rows * x.pitch
                && x.d.len() == x.rows * x.num_groups
                && x.sums.len() == x.rows * x.num_groups
                && self.groups.end <= x.num_groups,
            "int8-activation matvec: inconsistent sizes"
        );
    }

    /// [`Self::check`], and that `ys` are the rows `rows` of `x`, all of
    /// one width, over columns `o0 ..` inside the matrix (the contract of
    /// the SIMD kernels' `cols`). Returns the width.
    pub(crate) fn check_cols(&self, rows: &Range<usize>, o0: usize, ys: &[&mut [f32]]) -> usize {
        self.check();
        let width = ys.first().map_or(0, |y| y.len());
        assert!(ys.len() == rows.len() && ys.iter().all(|y| y.len() == width));
        assert!(o0 + width <= self.out_feat && rows.end <= self.x.rows);
        width
    }
}

/// Signed value of the low nibble of `b` (row `2 * pair`).
fn lo(b: u8) -> i64 {
    (((b << 4) as i8) >> 4) as i64
}

/// Signed value of the high nibble of `b` (row `2 * pair + 1`).
fn hi(b: u8) -> i64 {
    ((b as i8) >> 4) as i64
}

/// `ys[j][..] = (W^T x_r)[o0 .. o0 + width]` for the rows `r` of `rows`
/// (`ys[j]` is row `rows.start + j`).
pub(crate) fn cols_scalar(args: &A8Args, rows: Range<usize>, o0: usize, ys: &mut [&mut [f32]]) {
    args.check();
    let n = args.out_feat;
    let half = args.group_size / 2;
    let x = args.x;
    // i64: exact for any group size (the AVX2 kernel's i32 sums are exact
    // for the group sizes it takes, so both hold the same integer).
    let mut acc = [0i64; TILE];
    for (r, y) in rows.zip(ys.iter_mut()) {
        assert!(o0 + y.len() <= n);
        y.fill(0.0);
        let xq = x.row(r);
        for g in args.groups.clone() {
            let dx = x.d[r * x.num_groups + g];
            for c in (0..y.len()).step_by(TILE) {
                let w = TILE.min(y.len() - c);
                let acc = &mut acc[..w];
                acc.fill(0);
                for p in g * half..(g + 1) * half {
                    let (x0, x1) = (xq[2 * p] as i64, xq[2 * p + 1] as i64);
                    let row = &args.data[p * n + o0 + c..][..w];
                    for (a, &b) in acc.iter_mut().zip(row) {
                        *a += lo(b) * x0 + hi(b) * x1;
                    }
                }
                let srow = &args.scales[g * n + o0 + c..][..w];
                for ((yv, &a), &sw) in y[c..c + w].iter_mut().zip(acc.iter()).zip(srow) {
                    *yv += a as f32 * (sw * dx);
                }
            }
        }
    }
}
