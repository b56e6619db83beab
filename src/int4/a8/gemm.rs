//! Blocked integer GEMM for the int8-activation path at large batch
//! (docs/int4.md, "Int8 activations"). Callable only with a [`Micro`],
//! which carries the CPU proof token of its micro-kernel ([`super::micro`]).
//!
//! The per-row kernel ([`super::avx2`]) decodes a batch of nibbles per
//! pass of four rows and pays a float epilogue per pass; at batch 128 that
//! decode, not the arithmetic, sets its speed. Here a panel of 32 columns
//! times a block of whole groups is decoded once into `u8` codes `q + 8`,
//! laid out so that one 32-bit lane holds four consecutive input rows of
//! one column (what `vpdpbusd`, and `vpmaddubsw` + `vpmaddwd`, consume),
//! and every row of the piece then runs over it from L1 (the order of the
//! float path's blocked GEMM, [`crate::int4::gemm`]). Per column and group the
//! integer sum is the scalar twin's exactly, and the f32 epilogue is its
//! operations in its order, so the results are the same bits.

use std::arch::x86_64::*;
use std::ops::Range;

use super::micro::{self, eligible, Micro, PANEL};
use super::scalar::{cols_scalar, A8Args};
use crate::int4::gemm_split::{self, TaskGrid};
use crate::simd::Avx2;

/// Smallest batch the driver sends here: from 5 rows the panel decode,
/// paid once per piece of 64 rows, costs less than the per-row kernel's
/// decode per pass of 4 (measured, docs/benchmarks.md); up to 4 rows the
/// driver's split along the groups, which streams the weights from DRAM in
/// order, is the faster shape.
pub(super) const MIN_BATCH: usize = 5;
/// Rows of `x` one piece of a call serves.
pub(super) const ROW_BLOCK: usize = 64;
/// Widest column piece of a call (whole panels), where the layer has
/// enough of them for the task grid (`crate::int4::gemm_split`).
const WIDEST: usize = 256;

/// The shape-only pieces of an AVX2 call of `batch` rows times `n` columns
/// (see `crate::int4::gemm_split`: one-panel pieces for narrow layers, the
/// batch split in blocks of whole micro-kernel passes).
pub(super) fn task_grid(n: usize, batch: usize) -> TaskGrid {
    gemm_split::task_grid(n, batch, PANEL, WIDEST, micro::AVX2_ROWS)
}

/// Input rows per decoded panel, rounded down to whole groups (at least
/// one): `PANEL * DEPTH` = 16 KiB of codes stay in L1 while every row of
/// the piece reads them.
const DEPTH: usize = 512;
/// `ys[j][..] = (W^T x_r)[o0 .. o0 + width]` for the rows `r` of `rows`
/// (`ys[j]` is row `rows.start + j`), the contract of the other kernels.
/// Whole panels run here, the columns short of a panel through the scalar
/// twin.
pub(super) fn cols(
    micro: Micro,
    args: &A8Args,
    rows: Range<usize>,
    o0: usize,
    ys: &mut [&mut [f32]],
) {
    let width = args.check_cols(&rows, o0, ys);
    assert!(eligible(args.group_size));
    let gs = args.group_size;
    let main = width / PANEL * PANEL;
    let per_block = (DEPTH / gs).max(1);
    let mut panel = vec![0u8; per_block * gs * PANEL];
    let groups = args.groups.clone();
    for gb in groups.clone().step_by(per_block) {
        let block = gb..(gb + per_block).min(groups.end);
        for c in (0..main).step_by(PANEL) {
            // SAFETY: the token proves AVX2; `pack` checks every size.
            unsafe { pack(micro.avx2(), args, block.clone(), o0 + c, &mut panel) };
            let first = gb == groups.start;
            let mr = micro::rows(micro);
            for (b, part) in ys.chunks_mut(mr).enumerate() {
                let r0 = rows.start + b * mr;
                let at = micro::At {
                    groups: block.clone(),
                    col: o0 + c,
                    yoff: c,
                    r0,
                    first,
                };
                micro::run(micro, args, &panel, &at, part);
            }
        }
    }
    if main < width {
        let mut tails: Vec<&mut [f32]> = ys.iter_mut().map(|y| &mut y[main..]).collect();
        cols_scalar(args, rows, o0 + main, &mut tails);
    }
}

/// Decode the groups `groups` of the 32 columns from `col` into `panel`:
/// per group, per quad of input rows `4t .. 4t + 3`, 32 columns of 4 bytes
/// `q + 8` (rows in order), 128 bytes per quad.
///
/// Per pair of packed rows (16 columns at a time): XOR `0x88` turns both
/// two's-complement nibbles into `q + 8`; the nibbles are split and
/// interleaved bytewise (rows `2p`, `2p + 1` per 16-bit lane), and the two
/// pairs' lanes interleaved wordwise (four rows per 32-bit lane). The
/// unpacks stay within 128-bit lanes, so 16 columns per register keep the
/// columns in order.
///
/// # Safety
/// None beyond the token: it proves AVX2. Every size is checked.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pack(
    _: Avx2,
    args: &A8Args,
    groups: Range<usize>,
    col: usize,
    panel: &mut [u8],
) {
    let (n, half) = (args.out_feat, args.group_size / 2);
    let (p0, p_end) = (groups.start * half, groups.end * half);
    assert!(half.is_multiple_of(2) && col + PANEL <= n && p_end * n <= args.data.len());
    assert!(panel.len() >= (p_end - p0) / 2 * 4 * PANEL);
    let flip = _mm_set1_epi8(0x88u8 as i8);
    let low = _mm_set1_epi8(0x0F);
    let mut out = panel.as_mut_ptr();
    for p in (p0..p_end).step_by(2) {
        for h in 0..PANEL / 16 {
            // SAFETY: pairs p, p + 1 < p_end at columns col + 16 h .. + 16
            // <= n lie in `data` (asserted above); `out` stays inside the
            // quad's 128 bytes of `panel`, whose length is asserted.
            unsafe {
                let src = args.data.as_ptr().add(p * n + col + 16 * h);
                let a = _mm_xor_si128(_mm_loadu_si128(src as *const __m128i), flip);
                let b = _mm_xor_si128(_mm_loadu_si128(src.add(n) as *const __m128i), flip);
                let (la, ha) = (
                    _mm_and_si128(a, low),
                    _mm_and_si128(_mm_srli_epi16::<4>(a), low),
                );
                let (lb, hb) = (
                    _mm_and_si128(b, low),
                    _mm_and_si128(_mm_srli_epi16::<4>(b), low),
                );
                let (a0, a1) = (_mm_unpacklo_epi8(la, ha), _mm_unpackhi_epi8(la, ha));
                let (b0, b1) = (_mm_unpacklo_epi8(lb, hb), _mm_unpackhi_epi8(lb, hb));
                let dst = out.add(64 * h) as *mut __m128i;
                _mm_storeu_si128(dst, _mm_unpacklo_epi16(a0, b0));
                _mm_storeu_si128(dst.add(1), _mm_unpackhi_epi16(a0, b0));
                _mm_storeu_si128(dst.add(2), _mm_unpacklo_epi16(a1, b1));
                _mm_storeu_si128(dst.add(3), _mm_unpackhi_epi16(a1, b1));
            }
        }
        // SAFETY: at most one past the last quad written (asserted above).
        out = unsafe { out.add(4 * PANEL) };
    }
}
