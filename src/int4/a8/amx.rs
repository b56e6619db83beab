//! The int8-activation GEMM on the AMX tile unit (Sapphire Rapids and
//! later), for prefill-sized batches (docs/int4.md, "Int8 activations").
//!
//! Per group and output column the scalar twin's integer is
//! `acc = sum_i q_x[i] * q_w[i]`; here the tile dot `tdpbsud` (signed x
//! unsigned bytes, exact i32 sums) forms `sum_i q_x[i] * (q_w[i] + 8)` for
//! a 16 x 16 block of (batch row, column) per instruction, and the epilogue
//! takes `8 * sum(q_x)` back off (`Xq8::sums`), so `acc` is the same
//! integer. The epilogue then runs the twin's f32 operations in its order,
//! `y = y + f32(acc) * (scale_w * d)`, group by group from `y = 0`, so the
//! results are its bits.
//!
//! Operands: A is 16 rows of `x`'s codes, copied per call so that each
//! group's 16 rows are contiguous (a last block short of 16 rows
//! zero-padded), `ks` = 32 or 64 inputs deep (64 where the group size allows:
//! one instruction per 64 inputs, fewer epilogues per instruction); B is
//! the decoded panel of the AVX2 / VNNI GEMM ([`super::gemm`]): per quad of
//! input rows, 32 columns of 4 bytes `q + 8`, which is the tile unit's B
//! layout (a row of 16 dwords, one per column, four inputs each) for 16
//! columns at a stride of 128 bytes. Per group a pair of 16-row blocks
//! times the panel's 32 columns fills four C tiles (tiles 0-3), from two A
//! (4-5) and two B tiles (6-7).

use std::arch::x86_64::*;
use std::ops::Range;

use super::gemm::pack;
use super::micro::PANEL;
use super::scalar::{cols_scalar, A8Args};
use crate::linear::tiles::{
    tile_dot_i8, tile_load, tile_store, tile_zero, AmxInt8, TileConfig, Tiles, T,
};
use crate::simd::Avx512;

/// Smallest batch the driver sends here: one whole 16-row tile (below it
/// most of each tile product would be padding).
pub(super) const MIN_BATCH: usize = 16;
/// Rows of `x` one piece of a call serves: the panel decode is paid once
/// per piece, so a piece should hold several 32-row tile pairs.
pub(super) const ROW_BLOCK: usize = 128;
/// Input rows per decoded panel, rounded down to whole groups (at least
/// one): `PANEL * DEPTH` = 16 KiB of codes stay in L1.
const DEPTH: usize = 512;
/// Largest group size taken: the i32 sums, offset included, stay below
/// `23 * 127 * group_size` in magnitude, far inside i32.
const MAX_GROUP: usize = 1 << 16;

/// Whether the tile GEMM takes weights of `group_size`: whole 32-input
/// tile steps per group.
pub(super) fn eligible(group_size: usize) -> bool {
    group_size.is_multiple_of(32) && group_size <= MAX_GROUP
}

/// Whether the driver sends weights of `group_size` here: whole 64-input
/// tile steps. At 32-input groups each output pays the f32 epilogue (and
/// its share of a tile store) every 32 products, which the tile unit
/// cannot shorten; there the VNNI GEMM, summing in registers, measured as
/// fast (docs/benchmarks.md, "INT4 with int8 activations on AMX").
pub(super) fn chosen(group_size: usize) -> bool {
    eligible(group_size) && group_size.is_multiple_of(64)
}

/// Inputs per tile dot for `group_size` (an eligible one).
fn k_step(group_size: usize) -> usize {
    if group_size.is_multiple_of(64) {
        64
    } else {
        32
    }
}

/// Four C tiles of 16 x 16 i32, as the tile stores write them.
#[repr(C, align(64))]
struct CTiles([[i32; T * T]; 4]);

/// `ys[j][..] = (W^T x_r)[o0 .. o0 + width]` for the rows `r` of `rows`
/// (`ys[j]` is row `rows.start + j`), the contract of the other kernels.
/// Whole panels run on the tiles, the columns short of a panel through the
/// scalar twin.
pub(super) fn cols(
    tok: AmxInt8,
    args: &A8Args,
    rows: Range<usize>,
    o0: usize,
    ys: &mut [&mut [f32]],
) {
    let width = args.check_cols(&rows, o0, ys);
    let gs = args.group_size;
    assert!(eligible(gs));
    let main = width / PANEL * PANEL;
    for y in ys.iter_mut() {
        y[..main].fill(0.0);
    }
    let x = args.x;
    let pitch = x.pitch;
    let nrows = rows.len();
    let ng = x.num_groups;
    let nblk = nrows.div_ceil(T);
    // The rows' codes as A tiles: per 16-row block, per group, 16 rows of
    // `gs` codes (rows past `rows` zero). Read in place, 16 rows a matrix
    // row apart would share a few L1 sets.
    let mut apack = vec![0i8; nblk * T * pitch];
    for (j, r) in rows.clone().enumerate() {
        let (blk, lane) = (j / T, j % T);
        for (g, src) in x.row(r).chunks_exact(gs).enumerate() {
            apack[((blk * ng + g) * T + lane) * gs..][..gs].copy_from_slice(src);
        }
    }
    let block_codes = |blk: usize| &apack[blk * T * pitch..(blk + 1) * T * pitch];
    let ks = k_step(gs);
    let (c, a, b) = ((T, 64), (T, ks), (ks / 4, 64));
    let cfg = TileConfig::new([c, c, c, c, a, a, b, b]);
    let per_block = (DEPTH / gs).max(1);
    let mut panel = vec![0u8; per_block * gs * PANEL];
    let mut yacc = [[0f32; PANEL]; 2 * T];
    let mut ctiles = [CTiles([[0; T * T]; 4]), CTiles([[0; T * T]; 4])];
    let tiles = Tiles::configure(tok.amx(), &cfg);
    let groups = args.groups.clone();
    for gb in groups.clone().step_by(per_block) {
        let block = gb..(gb + per_block).min(groups.end);
        for c in (0..main).step_by(PANEL) {
            // SAFETY: the token proves AVX2; `pack` checks every size.
            unsafe { pack(tok.vnni().avx2(), args, block.clone(), o0 + c, &mut panel) };
            for b0 in (0..nblk).step_by(2) {
                let a0 = block_codes(b0);
                let a1 = (b0 + 1 < nblk).then(|| block_codes(b0 + 1));
                let (r0, r1) = (b0 * T, (b0 * T + 2 * T).min(nrows));
                let epi = |g: usize| Epi {
                    args,
                    g,
                    col: o0 + c,
                    xrow: rows.start + r0,
                };
                // The pair's 32 x 32 outputs in a contiguous buffer while
                // the groups add into them: rows of `ys` lie a matrix row
                // apart, and 32 of them at a power-of-two pitch share a
                // few L1 sets.
                let acc = &mut yacc[..r1 - r0];
                for (a, y) in acc.iter_mut().zip(&ys[r0..r1]) {
                    a.copy_from_slice(&y[c..c + PANEL]);
                }
                // Software-pipelined: group g's products go into one
                // buffer while the epilogue reads group g - 1's from the
                // other, so its loads do not wait on the tile stores.
                for g in block.clone() {
                    let quad0 = (g - block.start) * gs / 4;
                    let at = Step { g, gs, ks, quad0 };
                    let (cur, prev) = ctiles.split_at_mut(1);
                    let (cur, prev) = if g % 2 == 0 {
                        (&mut cur[0], &prev[0])
                    } else {
                        (&mut prev[0], &cur[0])
                    };
                    products(&tiles, &at, a0, a1, &panel, cur);
                    if g > block.start {
                        epilogue(tok.avx512(), &epi(g - 1), prev, acc);
                    }
                }
                let last = block.end - 1;
                epilogue(tok.avx512(), &epi(last), &ctiles[last % 2], acc);
                for (y, a) in ys[r0..r1].iter_mut().zip(acc.iter()) {
                    y[c..c + PANEL].copy_from_slice(a);
                }
            }
        }
    }
    drop(tiles);
    if main < width {
        let mut tails: Vec<&mut [f32]> = ys.iter_mut().map(|y| &mut y[main..]).collect();
        cols_scalar(args, rows, o0 + main, &mut tails);
    }
}

/// Where one group's tile products read.
struct Step {
    /// The group.
    g: usize,
    /// Its size, and the inputs per tile dot.
    gs: usize,
    ks: usize,
    /// Its first quad of input rows in the panel.
    quad0: usize,
}

/// The i32 sums of group `at.g` for the 16-row blocks `a0` and `a1` (if
/// any; each, per group, 16 rows of `gs` codes) times the panel's 32 columns,
/// into `out` (tiles 0, 1: `a0` by columns 0-15, 16-31; tiles 2, 3: `a1`).
fn products(
    _loaded: &Tiles,
    at: &Step,
    a0: &[i8],
    a1: Option<&[i8]>,
    panel: &[u8],
    out: &mut CTiles,
) {
    let (g, gs, ks) = (at.g, at.gs, at.ks);
    assert!(gs.is_multiple_of(ks) && (ks == 32 || ks == 64));
    assert!((g + 1) * T * gs <= a0.len());
    assert!(a1.is_none_or(|a| a.len() == a0.len()));
    assert!((at.quad0 + gs / 4) * 4 * PANEL <= panel.len());
    let o = out.0.as_mut_ptr();
    // SAFETY: the configuration (`_loaded`) is loaded on this thread: C
    // tiles 16 x 64 bytes, A tiles 16 rows of `ks` bytes, B tiles `ks / 4`
    // rows of 64 bytes. A loads read 16 rows of `ks` bytes at a stride of
    // `gs` from byte (16 g) gs + s, with s + ks <= gs: inside group g's
    // 16 * gs codes, which end inside `a0` / `a1` (asserted). B loads read `ks / 4`
    // quads of 128 bytes from quad `quad0 + s / 4` (the second at +64
    // bytes), quads that end by quad0 + gs / 4, inside `panel` (asserted).
    // Stores write the four 1 KiB tiles of `out` at a 64-byte stride.
    unsafe {
        tile_zero!(0);
        tile_zero!(1);
        tile_zero!(2);
        tile_zero!(3);
        for s in (0..gs).step_by(ks) {
            let b = panel.as_ptr().add((at.quad0 + s / 4) * 4 * PANEL);
            tile_load!(6, b, 4 * PANEL);
            tile_load!(7, b.add(64), 4 * PANEL);
            tile_load!(4, a0.as_ptr().add(g * T * gs + s), gs);
            tile_dot_i8!(0, 4, 6);
            tile_dot_i8!(1, 4, 7);
            if let Some(a1) = a1 {
                tile_load!(5, a1.as_ptr().add(g * T * gs + s), gs);
                tile_dot_i8!(2, 5, 6);
                tile_dot_i8!(3, 5, 7);
            }
        }
        tile_store!(0, o);
        tile_store!(1, o.add(1));
        if a1.is_some() {
            tile_store!(2, o.add(2));
            tile_store!(3, o.add(3));
        }
    }
}

/// Where one group's epilogue writes.
struct Epi<'a, 'b> {
    args: &'a A8Args<'b>,
    /// The group.
    g: usize,
    /// The panel's first column in the matrix.
    col: usize,
    /// Row of `x` of the first output row.
    xrow: usize,
}

/// `ys[j][..] += f32(C[j] - 8 sum) * (scale_w * d)` for the (at most 32)
/// rows `ys` of a tile pair, a rounding per operation, as the scalar twin.
fn epilogue(tok: Avx512, ep: &Epi, c: &CTiles, ys: &mut [[f32; PANEL]]) {
    let x = ep.args.x;
    assert!(ys.len() <= 2 * T && ep.xrow + ys.len() <= x.rows && ep.g < x.num_groups);
    assert!(ep.col + PANEL <= ep.args.out_feat);
    // SAFETY: the token proves AVX-512 F; the sizes are asserted above.
    unsafe { epilogue_avx512(tok, ep, c, ys) }
}

/// # Safety
/// AVX-512 F must be available (the token); the sizes as [`epilogue`]
/// asserts them.
#[target_feature(enable = "avx512f")]
unsafe fn epilogue_avx512(_: Avx512, ep: &Epi, c: &CTiles, ys: &mut [[f32; PANEL]]) {
    let (args, x) = (ep.args, ep.args.x);
    let sw = &args.scales[ep.g * args.out_feat + ep.col..][..PANEL];
    let sums = &x.sums[ep.xrow * x.num_groups..];
    let ds = &x.d[ep.xrow * x.num_groups..];
    // SAFETY: `sw` holds 32 elements (sliced above).
    let (sw0, sw1) = unsafe {
        (
            _mm512_loadu_ps(sw.as_ptr()),
            _mm512_loadu_ps(sw.as_ptr().add(T)),
        )
    };
    for (j, y) in ys.iter_mut().enumerate() {
        let i = j * x.num_groups + ep.g;
        let off = _mm512_set1_epi32(8 * sums[i]);
        let dv = _mm512_set1_ps(ds[i]);
        let (t, lane) = (2 * (j / T), j % T);
        for (h, swh) in [sw0, sw1].into_iter().enumerate() {
            // SAFETY: 16 elements at row `lane` of C tile `t + h` (16 x
            // 16) and at `y[16 h]` (32 elements).
            unsafe {
                let ct = c.0[t + h].as_ptr().add(lane * T);
                let acc = _mm512_sub_epi32(_mm512_loadu_si512(ct.cast()), off);
                let p = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(swh, dv));
                let yh = y.as_mut_ptr().add(T * h);
                _mm512_storeu_ps(yh, _mm512_add_ps(_mm512_loadu_ps(yh), p));
            }
        }
    }
}
