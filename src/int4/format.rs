//! The argument structs the INT4 kernels share, the layout constants of the
//! GEMM panels, and the scalar twins every SIMD kernel is tested against.
//! A leaf: no imports from the rest of `int4`, no `unsafe`.
//!
//! The packed format itself (nibble order, padding, scales) is described in
//! `int4/mod.rs` and docs/int4.md.

/// Column width the scalar kernel accumulates at once (stays in L1).
const SCALAR_TILE: usize = 256;

/// 2^-28: the AVX2 kernel reads the low nibble as `q << 28`.
pub(crate) const LO_SCALE: f32 = 1.0 / 268_435_456.0;
/// 1/16: the AVX2 kernel reads the high nibble as `q * 16`.
pub(crate) const HI_SCALE: f32 = 1.0 / 16.0;

/// Panel width of the GEMM: output columns per micro-kernel call.
pub(crate) const NR: usize = 32;
/// Floats between panels beyond their `kc * NR`: without it panels sit a
/// multiple of 4 KiB apart, so a row's eight panel writes all land in the
/// same L1 set and evict each other.
const PANEL_PAD: usize = 16;

/// Distance between consecutive panels of a tile `kc` rows deep.
pub(crate) const fn panel_stride(kc: usize) -> usize {
    kc * NR + PANEL_PAD
}

/// The arguments every matvec column-range kernel shares.
#[derive(Clone)]
pub(crate) struct MatvecArgs<'a> {
    /// Packed nibbles, `[num_pairs * out_feat]`.
    pub data: &'a [u8],
    /// Scales, `[num_groups * out_feat]`.
    pub scales: &'a [f32],
    /// `x` zero-padded to `in_padded`.
    pub x: &'a [f32],
    /// `x` pre-scaled for the AVX2 nibble trick: even rows by [`LO_SCALE`]
    /// (the low nibble is converted as `q << 28`), odd rows by [`HI_SCALE`]
    /// (the high nibble as `q * 16`). Both scalings are exact powers of two.
    /// Filled only for the AVX2 kernel (empty otherwise).
    pub xs: &'a [f32],
    /// Output dimension (the row pitch of `data`).
    pub out_feat: usize,
    /// Input rows per scale.
    pub group_size: usize,
    /// The groups (blocks of input rows) this call sums over, in order.
    pub groups: std::ops::Range<usize>,
}

/// The arguments of a matvec over several rows of `x` at once: `base.x`
/// (and `base.xs` when filled) hold `rows` rows of `pitch` floats each
/// (`pitch` = `in_padded`), everything else is one matrix as in
/// [`MatvecArgs`].
#[derive(Clone)]
pub(crate) struct RowsArgs<'a> {
    /// The matrix, and every row of `x` (and `xs`) back to back.
    pub base: MatvecArgs<'a>,
    /// Rows of `x`.
    pub rows: usize,
    /// Floats between consecutive rows of `x` (and of `xs`).
    pub pitch: usize,
}

impl<'a> RowsArgs<'a> {
    /// The single-row arguments of row `r`.
    pub(crate) fn row(&self, r: usize) -> MatvecArgs<'a> {
        let at = |v: &'a [f32]| {
            if v.is_empty() {
                v
            } else {
                &v[r * self.pitch..(r + 1) * self.pitch]
            }
        };
        MatvecArgs {
            x: at(self.base.x),
            xs: at(self.base.xs),
            ..self.base.clone()
        }
    }
}

/// The scalar twin of the multi-row kernels: `ys[r][..] = (W^T x_r)[o0 ..
/// o0 + ys[r].len()]`, one row at a time through [`matvec_scalar`].
pub(crate) fn matvec_rows_scalar(args: &RowsArgs, o0: usize, ys: &mut [&mut [f32]]) {
    for (r, y) in ys.iter_mut().enumerate() {
        matvec_scalar(&args.row(r), o0, y);
    }
}

/// What one GEMM tile dequantization needs.
pub(crate) struct TileArgs<'a> {
    /// Packed nibbles, `[num_pairs * out_feat]`.
    pub data: &'a [u8],
    /// Scales, `[num_groups * out_feat]`.
    pub scales: &'a [f32],
    /// Output dimension (the row pitch of `data`).
    pub out_feat: usize,
    /// Input rows per scale.
    pub group_size: usize,
    /// First row of W in the tile (even), and how many rows.
    pub k0: usize,
    /// Rows in the tile.
    pub kc: usize,
    /// First output column of the tile.
    pub c0: usize,
    /// Columns in the tile.
    pub nc: usize,
}

impl TileArgs<'_> {
    /// The same tile from column `from` (relative to `c0`) on.
    pub(crate) fn columns_from(&self, from: usize) -> Self {
        TileArgs {
            c0: self.c0 + from,
            nc: self.nc - from,
            ..*self
        }
    }
}

impl Clone for TileArgs<'_> {
    fn clone(&self) -> Self {
        *self
    }
}
impl Copy for TileArgs<'_> {}

/// Scalar matvec over the columns `o0 .. o0 + y.len()`: the format written
/// out plainly. For every group `g`, `acc[o] = sum over the group's pairs p
/// of x[2p] * lo(p, o) + x[2p+1] * hi(p, o)` (low nibble = even row, high
/// nibble = odd row, two's complement), then `y[o] += acc[o] * scale[g, o]`.
pub(crate) fn matvec_scalar(args: &MatvecArgs, o0: usize, y: &mut [f32]) {
    y.fill(0.0);
    let mut acc = [0.0f32; SCALAR_TILE];
    for (t, yt) in y.chunks_mut(SCALAR_TILE).enumerate() {
        let c0 = o0 + t * SCALAR_TILE;
        for g in args.groups.clone() {
            scalar_group(args, g, c0, &mut acc[..yt.len()], yt);
        }
    }
}

/// One group's contribution to the columns `c0 .. c0 + y.len()` (also the
/// SIMD kernels' tail, for the columns short of a vector).
pub(crate) fn scalar_group(args: &MatvecArgs, g: usize, c0: usize, acc: &mut [f32], y: &mut [f32]) {
    let n = y.len();
    let half = args.group_size / 2;
    acc.fill(0.0);
    for p in g * half..(g + 1) * half {
        let (x0, x1) = (args.x[2 * p], args.x[2 * p + 1]);
        let row = &args.data[p * args.out_feat + c0..p * args.out_feat + c0 + n];
        for (a, &b) in acc.iter_mut().zip(row) {
            let lo = ((b << 4) as i8 >> 4) as f32;
            let hi = (b as i8 >> 4) as f32;
            *a += x0 * lo + x1 * hi;
        }
    }
    let srow = &args.scales[g * args.out_feat + c0..g * args.out_feat + c0 + n];
    for ((yv, a), s) in y.iter_mut().zip(acc.iter()).zip(srow) {
        *yv += a * s;
    }
}

/// Write the tile `W[k0 .. k0 + kc, c0 .. c0 + nc]` into `packed` as
/// panels of `NR` columns, each `kc` rows deep
/// (`packed[j * panel_stride(kc) + r * NR + c]`),
/// zero-filling columns past `nc`. Inlined into per-ISA wrappers so the
/// compiler vectorizes it with the widest registers allowed.
#[inline(always)]
pub(crate) fn dequant_tile_scalar(t: &TileArgs, packed: &mut [f32]) {
    let n = t.out_feat;
    let gs = t.group_size;
    for j in 0..t.nc.div_ceil(NR) {
        let cj = t.c0 + j * NR;
        let ncols = NR.min(t.c0 + t.nc - cj);
        let panel = &mut packed[j * panel_stride(t.kc)..][..t.kc * NR];
        for (rr, dst) in panel.chunks_exact_mut(NR).enumerate() {
            let r = t.k0 + rr;
            let g = r / gs;
            let src = &t.data[(r / 2) * n + cj..(r / 2) * n + cj + ncols];
            let sc = &t.scales[g * n + cj..g * n + cj + ncols];
            if r.is_multiple_of(2) {
                for ((d, &b), &s) in dst.iter_mut().zip(src).zip(sc) {
                    *d = (((b << 4) as i8) >> 4) as f32 * s;
                }
            } else {
                for ((d, &b), &s) in dst.iter_mut().zip(src).zip(sc) {
                    *d = ((b as i8) >> 4) as f32 * s;
                }
            }
            dst[ncols..].fill(0.0);
        }
    }
}

/// Scalar GEMM micro-kernel:
/// `out[m][c] = sum_k a[m * lda + k] * b[k * NR + c]` for `m` rows.
pub(crate) fn gemm_micro_scalar(
    a: &[f32],
    lda: usize,
    b: &[f32],
    kc: usize,
    m: usize,
    out: &mut [[f32; NR]],
) {
    for (mi, o) in out.iter_mut().take(m).enumerate() {
        let mut acc = [0.0f32; NR];
        let row = &a[mi * lda..mi * lda + kc];
        for (k, &av) in row.iter().enumerate() {
            let bk = &b[k * NR..(k + 1) * NR];
            for (c, bv) in acc.iter_mut().zip(bk) {
                *c += av * bv;
            }
        }
        *o = acc;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One group of two rows, three columns, by hand: codes (lo, hi) =
    /// (1, -1), (-8, 7), (0, 3); x = (2, 0.5); scales 1, 0.25, 2.
    #[test]
    fn scalar_matvec_by_hand() {
        let nib = |lo: i8, hi: i8| ((lo as u8) & 0x0F) | ((hi as u8) << 4);
        let data = [nib(1, -1), nib(-8, 7), nib(0, 3)];
        let scales = [1.0, 0.25, 2.0];
        let args = MatvecArgs {
            data: &data,
            scales: &scales,
            x: &[2.0, 0.5],
            xs: &[],
            out_feat: 3,
            group_size: 2,
            groups: 0..1,
        };
        let mut y = [9.0f32; 3];
        matvec_scalar(&args, 0, &mut y);
        assert_eq!(y, [1.5, (-16.0 + 3.5) * 0.25, 1.5 * 2.0]);
        let mut y1 = [0.0f32; 2];
        matvec_scalar(&args, 1, &mut y1);
        assert_eq!(y1, [y[1], y[2]]);
    }

    /// The tile dequantizer writes panel-major rows and zero-fills the
    /// columns past the tile.
    #[test]
    fn scalar_tile_layout() {
        // 4 rows (2 pairs), 3 columns, group 2: code of row r, column c is
        // r - c (in range), scale of group g, column c is 1 + g + c.
        let (k, n) = (4usize, 3usize);
        let code = |r: usize, c: usize| r as i8 - c as i8;
        let data: Vec<u8> = (0..k / 2)
            .flat_map(|p| {
                (0..n).map(move |c| {
                    ((code(2 * p, c) as u8) & 0x0F) | ((code(2 * p + 1, c) as u8) << 4)
                })
            })
            .collect();
        let scales: Vec<f32> = (0..2)
            .flat_map(|g| (0..n).map(move |c| (1 + g + c) as f32))
            .collect();
        let t = TileArgs {
            data: &data,
            scales: &scales,
            out_feat: n,
            group_size: 2,
            k0: 0,
            kc: k,
            c0: 0,
            nc: n,
        };
        let mut packed = vec![f32::NAN; panel_stride(k)];
        dequant_tile_scalar(&t, &mut packed);
        for r in 0..k {
            for c in 0..NR {
                let want = if c < n {
                    code(r, c) as f32 * (1 + r / 2 + c) as f32
                } else {
                    0.0
                };
                assert_eq!(packed[r * NR + c], want, "row {r} col {c}");
            }
        }
        let rest = t.columns_from(1);
        assert_eq!((rest.c0, rest.nc), (1, 2));
    }

    #[test]
    fn scalar_micro_kernel_by_hand() {
        let kc = 2;
        let a = [1.0, 2.0, 0.0, 3.0, -1.0, 0.5];
        let b: Vec<f32> = (0..kc * NR).map(|i| i as f32).collect();
        let mut out = [[0.0f32; NR]; 2];
        gemm_micro_scalar(&a, 3, &b, kc, 2, &mut out);
        for c in 0..NR {
            assert_eq!(out[0][c], b[c] + 2.0 * b[NR + c]);
            assert_eq!(out[1][c], 3.0 * b[c] - b[NR + c]);
        }
    }
}
