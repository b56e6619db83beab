//! What the x86 matvec kernels share: the walk of a task's columns in
//! register-blocked strips, the strip body itself (one generic body over
//! [`StripLanes`], which `avx2.rs` and `avx512.rs` implement for their
//! register types and instantiate in their `#[target_feature]` functions),
//! and the software prefetch offsets.

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};

use super::format::{scalar_group, MatvecArgs};
use crate::simd::F32Lanes;

/// Vectors per register-blocked strip: 8 accumulators.
pub(super) const STRIP_VECS: usize = 8;
/// Bytes ahead (along a row) that the matvec strips prefetch.
const PREFETCH_AHEAD: usize = 512;
/// Bytes ahead (along a scale row) that the matvec strips prefetch: the
/// scales are a fifth of the bytes a matvec reads, and a strip otherwise
/// meets them cold in its epilogue (figures in docs/benchmarks.md).
const SCALE_PREFETCH_AHEAD: usize = 2048;

/// `y[..] = (W^T x)[o0 .. o0 + y.len()]`, group by group: strips of
/// `STRIP_VECS * lanes` columns (`strip(g, c0, ys, ahead, true)`), then
/// single vectors of `lanes` columns (`strip(.., false)`), then the scalar
/// twin for the columns short of a vector.
#[inline(always)]
pub(super) fn walk(
    args: &MatvecArgs,
    o0: usize,
    y: &mut [f32],
    lanes: usize,
    mut strip: impl FnMut(usize, usize, &mut [f32], Ahead, bool),
) {
    y.fill(0.0);
    let width = y.len();
    let wide = lanes * STRIP_VECS;
    let mut acc_tail = [0.0f32; 16];
    let wrap = Ahead::wrap(args, width);
    for g in args.groups.clone() {
        let mut o = 0;
        while o + wide <= width {
            strip(g, o0 + o, &mut y[o..o + wide], wrap.at(o, width), true);
            o += wide;
        }
        while o + lanes <= width {
            strip(g, o0 + o, &mut y[o..o + lanes], Ahead::default(), false);
            o += lanes;
        }
        if o < width {
            let n = width - o;
            scalar_group(args, g, o0 + o, &mut acc_tail[..n], &mut y[o..]);
        }
    }
}

/// Byte offsets added to a strip's prefetch addresses: zero along the
/// current group; near the end of the task's columns, where the prefetch
/// distance runs past them, the jump to the same distance into the next
/// group's rows and scale row, so that each group starts with its first
/// strips already on the way.
#[derive(Clone, Copy, Default)]
pub(super) struct Ahead {
    rows: isize,
    scales: isize,
}

impl Ahead {
    /// The jumps for a task `width` columns wide (row pitch `n` bytes,
    /// scale pitch `4n`).
    pub(super) fn wrap(args: &MatvecArgs, width: usize) -> Ahead {
        let n = args.out_feat;
        Ahead {
            rows: (args.group_size / 2 * n) as isize - width as isize,
            scales: 4 * (n as isize - width as isize),
        }
    }

    /// The offsets for the strip starting at column `o` of the task.
    pub(super) fn at(self, o: usize, width: usize) -> Ahead {
        Ahead {
            rows: if o + PREFETCH_AHEAD >= width {
                self.rows
            } else {
                0
            },
            scales: if 4 * o + SCALE_PREFETCH_AHEAD >= 4 * width {
                self.scales
            } else {
                0
            },
        }
    }

    /// Prefetch the `lines` cache lines from `SCALE_PREFETCH_AHEAD` bytes
    /// past the scales of group `g` at column `c0`.
    #[inline(always)]
    pub(super) fn prefetch_scales(self, args: &MatvecArgs, g: usize, c0: usize, lines: usize) {
        let at = (args.scales.as_ptr().wrapping_add(g * args.out_feat + c0) as *const u8)
            .wrapping_add(SCALE_PREFETCH_AHEAD)
            .wrapping_offset(self.scales);
        for line in 0..lines {
            // SAFETY: a prefetch never faults, whatever the address; SSE is
            // part of x86_64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64 * line) as *const i8) };
        }
    }

    /// Prefetch `lines` cache lines `PREFETCH_AHEAD` bytes along `row`, into
    /// L2 (T1): faster from DRAM than into L1 or L3 (docs/benchmarks.md).
    #[inline(always)]
    pub(super) fn prefetch_row(self, row: *const u8, lines: usize) {
        let at = row.wrapping_add(PREFETCH_AHEAD).wrapping_offset(self.rows);
        for line in 0..lines {
            // SAFETY: as above.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(64 * line) as *const i8) };
        }
    }
}

/// What the matvec strip needs beyond [`F32Lanes`]: which activations its
/// decoded nibbles multiply, and the decoding. Implemented for the AVX2 and
/// AVX-512 register types in their files.
pub(super) trait StripLanes: F32Lanes {
    /// The activations the decoded nibbles multiply: `x`, or `xs` where the
    /// decoding leaves a power-of-two factor that `xs` pre-scales away.
    fn x<'a>(args: &MatvecArgs<'a>) -> &'a [f32];

    /// The `LANES` packed bytes at `row`, decoded to the f32 values of their
    /// low nibbles and of their high nibbles (in the scale [`Self::x`]
    /// expects).
    ///
    /// # Safety
    /// As for [`F32Lanes`]; `row` must be valid for `LANES` byte reads.
    unsafe fn decode(row: *const u8) -> (Self, Self);
}

/// One group's contribution to `V * L::LANES` columns starting at `c0`:
/// per pair of rows, two FMAs per vector (low nibbles times `x[2p]`, high
/// nibbles times `x[2p + 1]`), then one FMA with the scales into `y`.
///
/// # Safety
/// The CPU must have `L`'s instruction set (the caller is a
/// `#[target_feature]` function holding its token); every index is checked.
#[inline(always)]
pub(super) unsafe fn strip<L: StripLanes, const V: usize>(
    args: &MatvecArgs,
    g: usize,
    c0: usize,
    y: &mut [f32],
    ahead: Ahead,
) {
    let lanes = L::LANES;
    assert_eq!(y.len(), lanes * V);
    let half = args.group_size / 2;
    let n = args.out_feat;
    let x = L::x(args);
    // SAFETY: the caller guarantees the instruction set.
    let mut acc = [unsafe { L::zero() }; V];
    let p_end = (g + 1) * half;
    assert!(p_end * n <= args.data.len() && c0 + lanes * V <= n && 2 * p_end <= x.len());
    ahead.prefetch_scales(args, g, c0, (4 * lanes * V).div_ceil(64));
    for p in g * half..p_end {
        // SAFETY: p < num_pairs and c0 + LANES V <= out_feat (asserted
        // above), so the row slice is inside `data`; 2p + 1 < x.len().
        unsafe {
            let row = args.data.as_ptr().add(p * n + c0);
            // The strips of a group walk its rows side by side, which the
            // hardware prefetchers follow poorly: fetch this row's bytes a
            // few strips ahead (a prefetch never faults, even past the end).
            ahead.prefetch_row(row, (lanes * V).div_ceil(64));
            let x0 = L::splat(*x.get_unchecked(2 * p));
            let x1 = L::splat(*x.get_unchecked(2 * p + 1));
            for (v, a) in acc.iter_mut().enumerate() {
                let (lo, hi) = L::decode(row.add(lanes * v));
                *a = L::fmadd(lo, x0, *a);
                *a = L::fmadd(hi, x1, *a);
            }
        }
    }
    let srow = &args.scales[g * n + c0..g * n + c0 + lanes * V];
    for (v, a) in acc.iter().enumerate() {
        // SAFETY: y and srow hold LANES V floats; unaligned loads and stores.
        unsafe {
            let yp = y.as_mut_ptr().add(lanes * v);
            let s = L::load(srow.as_ptr().add(lanes * v));
            L::fmadd(*a, s, L::load(yp)).store(yp);
        }
    }
}

/// The matvec of one instruction set: `matvec` (the token's entry point,
/// the columns `o0 .. o0 + y.len()`) and `strip` (one group's contribution
/// to `V * LANES` columns from `c0`; the VNNI kernel's path for the groups
/// its integer form cannot carry), both compiled with `$features` over the
/// lanes `$lanes`.
macro_rules! matvec_kernels {
    ($features:literal, $token:ty, $lanes:ty) => {
        /// Matvec over the columns `o0 .. o0 + y.len()` (for AVX2, with
        /// `args.xs` filled).
        ///
        /// # Safety
        /// None beyond the token: it proves this file's instruction set.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn matvec(
            _: $token,
            args: &super::format::MatvecArgs,
            o0: usize,
            y: &mut [f32],
        ) {
            use super::strips::{walk, STRIP_VECS};
            let lanes = <$lanes as crate::simd::F32Lanes>::LANES;
            walk(args, o0, y, lanes, |g, c0, ys, ahead, wide| {
                // SAFETY: this function's features are present (the token);
                // the walk hands out strips inside the matrix.
                unsafe {
                    if wide {
                        strip::<STRIP_VECS>(args, g, c0, ys, ahead)
                    } else {
                        strip::<1>(args, g, c0, ys, ahead)
                    }
                }
            });
        }

        /// One group's contribution to `V * LANES` columns starting at `c0`.
        ///
        /// # Safety
        /// The CPU must have this file's instruction set (the callers hold
        /// its token or one that implies it).
        #[target_feature(enable = $features)]
        pub(super) unsafe fn strip<const V: usize>(
            args: &super::format::MatvecArgs,
            g: usize,
            c0: usize,
            y: &mut [f32],
            ahead: super::strips::Ahead,
        ) {
            // SAFETY: this function's features are those of the lanes.
            unsafe { super::strips::strip::<$lanes, V>(args, g, c0, y, ahead) }
        }
    };
}
pub(super) use matvec_kernels;
