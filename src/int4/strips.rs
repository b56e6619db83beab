//! What the x86 matvec kernels share: the walk of a task's columns in
//! register-blocked strips, the strip body itself (one generic body over
//! [`StripLanes`], which `avx2.rs` and `avx512.rs` implement for their
//! register types and instantiate in their `#[target_feature]` functions),
//! and the software prefetch offsets.

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
use std::cell::RefCell;
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

/// Pairs of packed rows a strip walks side by side, at most, where the
/// kernel cuts groups into slabs ([`walk_slabs`]): a group of 128 walked
/// whole is 64 concurrent streams a row pitch apart, which Zen 3 reads from
/// DRAM at half the rate of 16 (docs/benchmarks.md, "What bounds the
/// batch-1 INT4 matvec").
pub(super) const SLAB_PAIRS: usize = 16;
/// Packed bytes from which a matrix is walked in slabs: a smaller one is
/// read from the caches in a decode step, where the carried sums cost more
/// than the access order gains.
const SLAB_MIN_BYTES: usize = 4 << 20;

/// Whether [`walk_slabs`] (not [`walk`]) runs a matvec over `args`: groups
/// larger than a slab, in a matrix large enough to come from DRAM. Either
/// walk gives the same bits, so the choice is free to depend on the size.
pub(super) fn in_slabs(args: &MatvecArgs) -> bool {
    args.group_size / 2 > SLAB_PAIRS && args.data.len() >= SLAB_MIN_BYTES
}

thread_local! {
    /// The carried sums of [`walk_slabs`], kept per thread between calls.
    static CARRY: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// [`walk`] with each group cut into slabs of [`SLAB_PAIRS`] pairs of
/// rows, every column of the task per slab: `strip(g, pairs, c0, ys,
/// carry, ahead, wide)` adds the pairs `pairs` of group `g` to the strip's
/// sums, which it carries between the slabs of a group in `carry` (the
/// strip's columns of a buffer as wide as the task; `f32` values stored
/// and loaded back exactly, so each column's sum is formed in the same
/// order, with the same roundings, as by one strip over the whole group).
/// The scalar tail runs once per group, after its slabs.
#[inline(always)]
#[allow(clippy::type_complexity)]
pub(super) fn walk_slabs(
    args: &MatvecArgs,
    o0: usize,
    y: &mut [f32],
    lanes: usize,
    mut strip: impl FnMut(usize, Range<usize>, usize, &mut [f32], &mut [f32], Ahead, bool),
) {
    y.fill(0.0);
    let width = y.len();
    let wide = lanes * STRIP_VECS;
    let half = args.group_size / 2;
    let mut acc_tail = [0.0f32; 16];
    let wrap = Ahead::wrap_pairs(args, width, SLAB_PAIRS);
    // (Taken out of the thread-local for the call: a nested call on this
    // thread would find it empty and use its own.)
    let mut carry = CARRY
        .try_with(|c| c.try_borrow_mut().map(|mut v| std::mem::take(&mut *v)))
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    if carry.len() < width {
        carry.resize(width, 0.0);
    }
    for g in args.groups.clone() {
        for p0 in (g * half..(g + 1) * half).step_by(SLAB_PAIRS) {
            let pairs = p0..(p0 + SLAB_PAIRS).min((g + 1) * half);
            let mut o = 0;
            while o + wide <= width {
                let (ys, cs) = (&mut y[o..o + wide], &mut carry[o..o + wide]);
                strip(g, pairs.clone(), o0 + o, ys, cs, wrap.at(o, width), true);
                o += wide;
            }
            while o + lanes <= width {
                let (ys, cs) = (&mut y[o..o + lanes], &mut carry[o..o + lanes]);
                strip(g, pairs.clone(), o0 + o, ys, cs, Ahead::default(), false);
                o += lanes;
            }
        }
        let o = width / lanes * lanes;
        if o < width {
            let n = width - o;
            scalar_group(args, g, o0 + o, &mut acc_tail[..n], &mut y[o..]);
        }
    }
    let _ = CARRY.try_with(|c| {
        if let Ok(mut v) = c.try_borrow_mut() {
            *v = carry;
        }
    });
}

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
        Ahead::wrap_pairs(args, width, args.group_size / 2)
    }

    /// [`Ahead::wrap`] for strips that walk `pairs` pairs of rows at a time
    /// (a slab, [`walk_slabs`]): the jump is to the next slab's rows.
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
    // SAFETY: the caller guarantees the instruction set; `sum_pairs`
    // checks the indices.
    let acc =
        unsafe { sum_pairs::<L, V>(args, g * half..(g + 1) * half, c0, [L::zero(); V], ahead) };
    ahead.prefetch_scales(args, g, c0, (4 * lanes * V).div_ceil(64));
    // SAFETY: as above.
    unsafe { add_scaled::<L, V>(args, g, c0, &acc, y) };
}

/// The pairs `pairs` of group `g` against `V * L::LANES` columns starting
/// at `c0`, a slab of [`walk_slabs`]: the sums start at zero on the
/// group's first pair (else from `carry`, where the slab before left
/// them), go on exactly as in [`strip`], and after the group's last pair
/// go through the same FMA with the scales into `y` (else to `carry`).
///
/// # Safety
/// As for [`strip`]; every index is checked.
#[inline(always)]
pub(super) unsafe fn strip_slab<L: StripLanes, const V: usize>(
    args: &MatvecArgs,
    g: usize,
    pairs: Range<usize>,
    c0: usize,
    y: &mut [f32],
    carry: &mut [f32],
    ahead: Ahead,
) {
    let lanes = L::LANES;
    let half = args.group_size / 2;
    assert!(y.len() == lanes * V && carry.len() == lanes * V);
    assert!(g * half <= pairs.start && pairs.end <= (g + 1) * half);
    let (first, last) = (pairs.start == g * half, pairs.end == (g + 1) * half);
    // SAFETY: (every block) the caller guarantees the instruction set; the
    // carry holds LANES V floats (asserted); `sum_pairs` checks the rest.
    unsafe {
        let mut acc = [L::zero(); V];
        if !first {
            for (v, a) in acc.iter_mut().enumerate() {
                *a = L::load(carry.as_ptr().add(lanes * v));
            }
        }
        let acc = sum_pairs::<L, V>(args, pairs, c0, acc, ahead);
        if !last {
            for (v, a) in acc.iter().enumerate() {
                a.store(carry.as_mut_ptr().add(lanes * v));
            }
            return;
        }
        ahead.prefetch_scales(args, g, c0, (4 * lanes * V).div_ceil(64));
        add_scaled::<L, V>(args, g, c0, &acc, y);
    }
}

/// `acc` plus the pairs `pairs` of `V * L::LANES` columns from `c0`: per
/// pair of rows, two FMAs per vector (low nibbles times `x[2p]`, high
/// nibbles times `x[2p + 1]`), in order.
///
/// # Safety
/// As for [`strip`]; every index is checked.
#[inline(always)]
unsafe fn sum_pairs<L: StripLanes, const V: usize>(
    args: &MatvecArgs,
    pairs: Range<usize>,
    c0: usize,
    mut acc: [L; V],
    ahead: Ahead,
) -> [L; V] {
    let (n, x, lanes) = (args.out_feat, L::x(args), L::LANES);
    assert!(pairs.end * n <= args.data.len() && c0 + lanes * V <= n && 2 * pairs.end <= x.len());
    for p in pairs {
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
    acc
}

/// `y += acc * scales[g][c0 ..]`, one FMA per vector: a group's sums into
/// the outputs.
///
/// # Safety
/// As for [`strip`]; every index is checked.
#[inline(always)]
unsafe fn add_scaled<L: StripLanes, const V: usize>(
    args: &MatvecArgs,
    g: usize,
    c0: usize,
    acc: &[L; V],
    y: &mut [f32],
) {
    let (n, lanes) = (args.out_feat, L::LANES);
    assert_eq!(y.len(), lanes * V);
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
/// lanes `$lanes`; with `slabs` (AVX2), a large matrix with groups above a
/// slab is walked in slabs ([`walk_slabs`]; the same bits).
macro_rules! matvec_kernels {
    ($features:literal, $token:ty, $lanes:ty) => {
        super::strips::matvec_kernels!($features, $token, $lanes, false);
    };
    ($features:literal, $token:ty, $lanes:ty, slabs) => {
        super::strips::matvec_kernels!($features, $token, $lanes, true);
    };
    ($features:literal, $token:ty, $lanes:ty, $slabs:literal) => {
        /// Matvec over the columns `o0 .. o0 + y.len()` (for AVX2, with
        /// `args.xs` filled).
        ///
        /// # Safety
        /// None beyond the token: it proves this file's instruction set.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn matvec(
            tok: $token,
            args: &super::format::MatvecArgs,
            o0: usize,
            y: &mut [f32],
        ) {
            let slabs = $slabs && super::strips::in_slabs(args);
            // SAFETY: the token proves the features.
            unsafe { matvec_walk(tok, args, o0, y, slabs) }
        }

        /// [`matvec`] walking whole groups, or slabs (`strips::walk_slabs`)
        /// with `slabs`: the same bits either way.
        ///
        /// # Safety
        /// None beyond the token: it proves this file's instruction set.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn matvec_walk(
            _: $token,
            args: &super::format::MatvecArgs,
            o0: usize,
            y: &mut [f32],
            slabs: bool,
        ) {
            use super::strips::{walk, walk_slabs, STRIP_VECS};
            let lanes = <$lanes as crate::simd::F32Lanes>::LANES;
            if slabs {
                walk_slabs(
                    args,
                    o0,
                    y,
                    lanes,
                    |g, pairs, c0, ys, carry, ahead, wide| {
                        // SAFETY: this function's features are present (the
                        // token); the walk hands out strips inside the matrix.
                        unsafe {
                            if wide {
                                strip_slab::<STRIP_VECS>(args, g, pairs, c0, ys, carry, ahead)
                            } else {
                                strip_slab::<1>(args, g, pairs, c0, ys, carry, ahead)
                            }
                        }
                    },
                );
                return;
            }
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

        /// The pairs `pairs` of group `g` against `V * LANES` columns from
        /// `c0`, their sums carried in `carry` (`strips::strip_slab`).
        ///
        /// # Safety
        /// As for `strip`.
        #[target_feature(enable = $features)]
        unsafe fn strip_slab<const V: usize>(
            args: &super::format::MatvecArgs,
            g: usize,
            pairs: std::ops::Range<usize>,
            c0: usize,
            y: &mut [f32],
            carry: &mut [f32],
            ahead: super::strips::Ahead,
        ) {
            // SAFETY: this function's features are those of the lanes.
            unsafe { super::strips::strip_slab::<$lanes, V>(args, g, pairs, c0, y, carry, ahead) }
        }
    };
}
pub(super) use matvec_kernels;
