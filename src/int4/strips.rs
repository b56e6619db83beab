//! What the x86 matvec kernels share: the walk of a task's columns in
//! register-blocked strips, and the software prefetch offsets.

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};

use super::format::{scalar_group, MatvecArgs};

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
