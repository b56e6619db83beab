//! What the x86 matvec kernels share: the walk of a task's columns in
//! register-blocked strips, the strip body itself (one generic body over
//! [`StripLanes`], which `avx2.rs` and `avx512.rs` implement for their
//! register types and instantiate in their `#[target_feature]` functions),
//! and the software prefetch offsets.

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
use std::ops::Range;

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

/// Pairs of packed rows a strip walks side by side, at most, for the
/// kernels that cut groups into slabs (AVX2): a group of 128 walked whole
/// is 64 concurrent streams a row pitch apart, which Zen 3 reads from DRAM
/// at a third of the rate of 16 (docs/benchmarks.md, "What bounds the
/// batch-1 INT4 matvec"). [`NO_SLABS`] keeps whole groups.
pub(super) const SLAB_PAIRS: usize = 16;
/// Slab size that never cuts a group.
pub(super) const NO_SLABS: usize = usize::MAX;

/// Which part of a group a strip runs: the pairs `pairs` of group `g`, and
/// where its sums start and end. A group cut into slabs carries each
/// column's sum between them in `carry` (`f32` values stored and reloaded
/// exactly, so the sums, and the results, are those of the whole group in
/// one strip).
pub(super) struct Slab<'a> {
    pub g: usize,
    pub pairs: Range<usize>,
    /// The strip's columns of the carried sums; `None` for a whole group.
    pub carry: Option<&'a mut [f32]>,
}

impl<'a> Slab<'a> {
    /// The pairs `pairs` of group `g` for the `w` columns from `o` of a
    /// task, carrying their sums in `carry[o .. o + w]` (an empty `carry`:
    /// whole groups, nothing to carry).
    fn at(g: usize, pairs: &Range<usize>, carry: &'a mut [f32], o: usize, w: usize) -> Slab<'a> {
        Slab {
            g,
            pairs: pairs.clone(),
            carry: (!carry.is_empty()).then(|| &mut carry[o..o + w]),
        }
    }

    /// The whole of group `g` (no carry).
    pub(super) fn whole(args: &MatvecArgs, g: usize) -> Slab<'static> {
        let half = args.group_size / 2;
        Slab {
            g,
            pairs: g * half..(g + 1) * half,
            carry: None,
        }
    }
}

/// `y[..] = (W^T x)[o0 .. o0 + y.len()]`, group by group, each group in
/// slabs of at most `slab_pairs` pairs of rows (every column of the task
/// per slab): strips of `STRIP_VECS * lanes` columns (`strip(slab, c0, ys,
/// ahead, true)`), then single vectors of `lanes` columns (`strip(..,
/// false)`), then (once per group) the scalar twin for the columns short of
/// a vector.
#[inline(always)]
pub(super) fn walk(
    args: &MatvecArgs,
    o0: usize,
    y: &mut [f32],
    lanes: usize,
    slab_pairs: usize,
    mut strip: impl FnMut(Slab, usize, &mut [f32], Ahead, bool),
) {
    y.fill(0.0);
    let width = y.len();
    let wide = lanes * STRIP_VECS;
    let half = args.group_size / 2;
    let slab_pairs = slab_pairs.clamp(1, half.max(1));
    let mut acc_tail = [0.0f32; 16];
    let wrap = Ahead::wrap_pairs(args, width, slab_pairs);
    // The carried sums of the vector-wide columns, when groups are cut.
    let mut carry = vec![0.0f32; if slab_pairs < half { width } else { 0 }];
    for g in args.groups.clone() {
        for p0 in (g * half..(g + 1) * half).step_by(slab_pairs) {
            let pairs = p0..(p0 + slab_pairs).min((g + 1) * half);
            let mut o = 0;
            while o + wide <= width {
                let s = Slab::at(g, &pairs, &mut carry, o, wide);
                strip(s, o0 + o, &mut y[o..o + wide], wrap.at(o, width), true);
                o += wide;
            }
            while o + lanes <= width {
                let s = Slab::at(g, &pairs, &mut carry, o, lanes);
                strip(s, o0 + o, &mut y[o..o + lanes], Ahead::default(), false);
                o += lanes;
            }
        }
        let o = width / lanes * lanes;
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
        Ahead::wrap_pairs(args, width, args.group_size / 2)
    }

    /// [`Ahead::wrap`] for strips that walk `pairs` pairs of rows (a slab,
    /// see [`walk`]): the jump is to the next slab's rows.
    pub(super) fn wrap_pairs(args: &MatvecArgs, width: usize, pairs: usize) -> Ahead {
        let n = args.out_feat;
        Ahead {
            rows: (pairs * n) as isize - width as isize,
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

/// The pairs `slab.pairs` of group `slab.g` against `V * L::LANES` columns
/// starting at `c0`: per pair of rows, two FMAs per vector (low nibbles
/// times `x[2p]`, high nibbles times `x[2p + 1]`); the sums start at zero
/// on the group's first pair (else from `slab.carry`), and after its last
/// pair go through one FMA with the scales into `y` (else to the carry).
///
/// # Safety
/// The CPU must have `L`'s instruction set (the caller is a
/// `#[target_feature]` function holding its token); every index is checked.
#[inline(always)]
pub(super) unsafe fn strip<L: StripLanes, const V: usize>(
    args: &MatvecArgs,
    slab: Slab,
    c0: usize,
    y: &mut [f32],
    ahead: Ahead,
) {
    let lanes = L::LANES;
    assert_eq!(y.len(), lanes * V);
    let (g, half, n) = (slab.g, args.group_size / 2, args.out_feat);
    let x = L::x(args);
    let (first, last) = (
        slab.pairs.start == g * half,
        slab.pairs.end == (g + 1) * half,
    );
    let p_end = slab.pairs.end;
    assert!(slab.pairs.start >= g * half && p_end <= (g + 1) * half);
    assert!(p_end * n <= args.data.len() && c0 + lanes * V <= n && 2 * p_end <= x.len());
    let acc = match slab.carry {
        // A whole group: the sums start at zero (its own copy of the loop,
        // so that the accumulators stay in registers).
        None => {
            assert!(first && last);
            // SAFETY: the caller guarantees the instruction set; the
            // indices are checked above.
            unsafe { sum_pairs::<L, V>(args, slab.pairs, c0, [L::zero(); V], ahead) }
        }
        Some(carry) => {
            assert_eq!(carry.len(), lanes * V);
            // SAFETY: as above.
            let mut acc = [unsafe { L::zero() }; V];
            if !first {
                for (v, a) in acc.iter_mut().enumerate() {
                    // SAFETY: the carry holds LANES V floats (asserted).
                    *a = unsafe { L::load(carry.as_ptr().add(lanes * v)) };
                }
            }
            // SAFETY: as above.
            let acc = unsafe { sum_pairs::<L, V>(args, slab.pairs, c0, acc, ahead) };
            if !last {
                for (v, a) in acc.iter().enumerate() {
                    // SAFETY: the carry holds LANES V floats (asserted).
                    unsafe { a.store(carry.as_mut_ptr().add(lanes * v)) };
                }
                return;
            }
            acc
        }
    };
    ahead.prefetch_scales(args, g, c0, (4 * lanes * V).div_ceil(64));
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

/// `acc` plus the pairs `pairs` of `V * L::LANES` columns from `c0`: per
/// pair of rows, two FMAs per vector (low nibbles times `x[2p]`, high
/// nibbles times `x[2p + 1]`), in order.
///
/// # Safety
/// As for [`strip`], which checks the indices.
#[inline(always)]
unsafe fn sum_pairs<L: StripLanes, const V: usize>(
    args: &MatvecArgs,
    pairs: Range<usize>,
    c0: usize,
    mut acc: [L; V],
    ahead: Ahead,
) -> [L; V] {
    let (n, x, lanes) = (args.out_feat, L::x(args), L::LANES);
    for p in pairs {
        // SAFETY: p < num_pairs and c0 + LANES V <= out_feat (asserted by
        // the caller), so the row slice is inside `data`; 2p + 1 < x.len().
        unsafe {
            let row = args.data.as_ptr().add(p * n + c0);
            // The strips of a slab walk its rows side by side, which the
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
    acc
}

/// The matvec of one instruction set: `matvec` (the token's entry point,
/// the columns `o0 .. o0 + y.len()`) and `strip` (one group's contribution
/// to `V * LANES` columns from `c0`; the VNNI kernel's path for the groups
/// its integer form cannot carry), both compiled with `$features` over the
/// lanes `$lanes`, cutting groups into slabs of `$slab_pairs` pairs
/// (`strips::walk`).
macro_rules! matvec_kernels {
    ($features:literal, $token:ty, $lanes:ty, $slab_pairs:expr) => {
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
            walk(
                args,
                o0,
                y,
                lanes,
                $slab_pairs,
                |slab, c0, ys, ahead, wide| {
                    // SAFETY: this function's features are present (the token);
                    // the walk hands out strips inside the matrix.
                    unsafe {
                        if wide {
                            strip_slab::<STRIP_VECS>(args, slab, c0, ys, ahead)
                        } else {
                            strip_slab::<1>(args, slab, c0, ys, ahead)
                        }
                    }
                },
            );
        }

        /// One group's contribution to `V * LANES` columns starting at `c0`.
        ///
        /// # Safety
        /// The CPU must have this file's instruction set (the callers hold
        /// its token or one that implies it).
        #[target_feature(enable = $features)]
        // (The VNNI kernel's fallback; the AVX2 matvec walks slabs.)
        #[allow(dead_code)]
        pub(super) unsafe fn strip<const V: usize>(
            args: &super::format::MatvecArgs,
            g: usize,
            c0: usize,
            y: &mut [f32],
            ahead: super::strips::Ahead,
        ) {
            let slab = super::strips::Slab::whole(args, g);
            // SAFETY: this function's features are those of the lanes.
            unsafe { super::strips::strip::<$lanes, V>(args, slab, c0, y, ahead) }
        }

        /// A slab of a group (`strips::Slab`) against `V * LANES` columns
        /// starting at `c0`.
        ///
        /// # Safety
        /// As for `strip`.
        #[target_feature(enable = $features)]
        unsafe fn strip_slab<const V: usize>(
            args: &super::format::MatvecArgs,
            slab: super::strips::Slab,
            c0: usize,
            y: &mut [f32],
            ahead: super::strips::Ahead,
        ) {
            // SAFETY: this function's features are those of the lanes.
            unsafe { super::strips::strip::<$lanes, V>(args, slab, c0, y, ahead) }
        }
    };
}
pub(super) use matvec_kernels;
