//! The micro-kernels of the int8-activation GEMM ([`super::gemm`]): a
//! few rows of `x` times one decoded panel of 32 columns, over a block of
//! groups.
//!
//! Per group each row's 32 sums start at `-8 sum(x_q)` (the codes' offset)
//! and add, per quad of input rows, the four products of each column's
//! lane against the row's four codes broadcast: `vpdpbusd` directly
//! (AVX-512 VNNI), or `vpmaddubsw` (pairs, summed in i16 over up to 8
//! quads) then `vpmaddwd` by ones (AVX2). Then the scalar twin's epilogue,
//! `y = y + f32(acc) * (scale_w * d)`, one rounding per operation, so both
//! give its bits.

use std::arch::x86_64::*;
use std::ops::Range;

use super::scalar::A8Args;
use crate::simd::{Avx2, Avx512, Avx512Vnni, SimdLevel};

/// Output columns per decoded panel (two 512-bit vectors of i32).
pub(super) const PANEL: usize = 32;
/// Largest group size taken: the i32 sums (at most `23 * 127 * group_size`
/// in magnitude, the offset included) stay exact far below `i32::MAX`.
const MAX_GROUP: usize = 1 << 16;

/// A micro-kernel with the token that lets it run.
#[derive(Clone, Copy, Debug)]
pub(super) enum Micro {
    /// AVX2 `vpmaddubsw` + `vpmaddwd`.
    Avx2(Avx2),
    /// AVX-512 VNNI `vpdpbusd`.
    Vnni(Avx512Vnni),
}

impl Micro {
    /// The best micro-kernel allowed at `level` for weights of
    /// `group_size`, if any (whole 4-row lanes per group).
    pub(super) fn at(level: SimdLevel, group_size: usize) -> Option<Micro> {
        if !eligible(group_size) {
            return None;
        }
        if let Some(t) = Avx512::at(level).and_then(Avx512::vnni) {
            return Some(Micro::Vnni(t));
        }
        Avx2::at(level).map(Micro::Avx2)
    }

    /// The AVX2 token every micro-kernel implies (the packing runs on it).
    pub(super) fn avx2(self) -> Avx2 {
        match self {
            Micro::Avx2(t) => t,
            Micro::Vnni(t) => t.avx2(),
        }
    }
}

/// Whether the GEMM takes weights of `group_size`.
pub(super) fn eligible(group_size: usize) -> bool {
    group_size.is_multiple_of(4) && group_size <= MAX_GROUP
}

/// Most rows one call of the VNNI kernel serves: 12 accumulators and 12
/// outputs in registers, next to the two weight vectors and the scales.
const VNNI_ROWS: usize = 6;
/// Most rows one call of the AVX2 kernel serves: 6 i32 and 6 i16 sums, two
/// weight vectors, the broadcast codes and the ones fill its 16 registers
/// (the outputs stay in L1; 4 rows spilled and ran slower).
pub(super) const AVX2_ROWS: usize = 3;

/// Most rows one call of `micro` serves.
pub(super) fn rows(micro: Micro) -> usize {
    match micro {
        Micro::Vnni(_) => VNNI_ROWS,
        Micro::Avx2(_) => AVX2_ROWS,
    }
}
/// Quads the AVX2 kernel sums in i16 before widening: each `vpmaddubsw`
/// lane is at most `2 * 15 * 127 = 3810` in magnitude, so eight stay below
/// `i16::MAX`.
const I16_QUADS: usize = 8;
/// Bytes of a decoded quad of input rows (32 columns x 4 rows).
const QUAD: usize = 4 * PANEL;

/// Where a micro-kernel call works.
pub(super) struct At {
    /// The groups the panel holds, in order.
    pub groups: Range<usize>,
    /// First output column of the panel.
    pub col: usize,
    /// Offset of that column in each row of `ys`.
    pub yoff: usize,
    /// Row of `x` of `ys[0]`.
    pub r0: usize,
    /// Whether these are the call's first groups (`y` starts at 0).
    pub first: bool,
}

/// Add the groups of `at` from `panel` into the rows `ys` (1 to
/// [`rows`]`(micro)`).
pub(super) fn run(micro: Micro, args: &A8Args, panel: &[u8], at: &At, ys: &mut [&mut [f32]]) {
    let (x, gs) = (args.x, args.group_size);
    assert!(!ys.is_empty() && ys.len() <= rows(micro) && at.r0 + ys.len() <= x.rows);
    assert!(ys.iter().all(|y| y.len() >= at.yoff + PANEL));
    assert!(at.col + PANEL <= args.out_feat && at.groups.end <= x.num_groups);
    assert!(gs.is_multiple_of(4) && at.groups.len() * gs * PANEL <= panel.len());
    assert!(at.groups.end * gs <= x.pitch);
    // SAFETY: (every arm) the token proves the kernel's features; the sizes
    // the kernel reads through pointers are asserted above, and each arm
    // passes exactly its row count.
    unsafe {
        match (micro, ys.len()) {
            (Micro::Vnni(t), 6) => vnni::<6>(t, args, panel, at, ys),
            (Micro::Vnni(t), 5) => vnni::<5>(t, args, panel, at, ys),
            (Micro::Vnni(t), 4) => vnni::<4>(t, args, panel, at, ys),
            (Micro::Vnni(t), 3) => vnni::<3>(t, args, panel, at, ys),
            (Micro::Vnni(t), 2) => vnni::<2>(t, args, panel, at, ys),
            (Micro::Vnni(t), _) => vnni::<1>(t, args, panel, at, ys),
            (Micro::Avx2(t), 3) => avx2::<3>(t, args, panel, at, ys),
            (Micro::Avx2(t), 2) => avx2::<2>(t, args, panel, at, ys),
            (Micro::Avx2(t), _) => avx2::<1>(t, args, panel, at, ys),
        }
    }
}

/// AVX-512 VNNI: `R` rows x 32 columns, the outputs held in registers over
/// the whole block of groups.
///
/// # Safety
/// The token proves the features; the caller ([`run`]) checks the sizes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn vnni<const R: usize>(
    _: Avx512Vnni,
    args: &A8Args,
    panel: &[u8],
    at: &At,
    ys: &mut [&mut [f32]],
) {
    let (n, x, gs) = (args.out_feat, args.x, args.group_size);
    let ng = x.num_groups;
    let mut yv: [[__m512; 2]; R] = std::array::from_fn(|j| {
        if at.first {
            [_mm512_setzero_ps(); 2]
        } else {
            let p = ys[j][at.yoff..at.yoff + PANEL].as_ptr();
            // SAFETY: the slice above holds 32 floats.
            unsafe { [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))] }
        }
    });
    let mut wp = panel.as_ptr();
    for g in at.groups.clone() {
        let mut acc: [[__m512i; 2]; R] =
            std::array::from_fn(|j| [_mm512_set1_epi32(-8 * x.sums[(at.r0 + j) * ng + g]); 2]);
        let mut xp: [*const i8; R] =
            std::array::from_fn(|j| x.row(at.r0 + j).as_ptr().wrapping_add(g * gs));
        for _ in 0..gs / 4 {
            // SAFETY: the panel holds gs / 4 quads of 128 bytes per group
            // of the block, and each row gs codes per group (asserted by
            // the caller).
            unsafe {
                let w0 = _mm512_loadu_si512(wp as *const __m512i);
                let w1 = _mm512_loadu_si512(wp.add(64) as *const __m512i);
                for (a, p) in acc.iter_mut().zip(xp.iter_mut()) {
                    let xv = _mm512_set1_epi32((*p as *const i32).read_unaligned());
                    a[0] = _mm512_dpbusd_epi32(a[0], w0, xv);
                    a[1] = _mm512_dpbusd_epi32(a[1], w1, xv);
                    *p = p.add(4);
                }
                wp = wp.add(QUAD);
            }
        }
        let s = args.scales[g * n + at.col..][..PANEL].as_ptr();
        // SAFETY: the slice above holds 32 floats.
        let sw = unsafe { [_mm512_loadu_ps(s), _mm512_loadu_ps(s.add(16))] };
        for (j, (y, a)) in yv.iter_mut().zip(acc.iter()).enumerate() {
            let d = _mm512_set1_ps(x.d[(at.r0 + j) * ng + g]);
            for v in 0..2 {
                let t = _mm512_mul_ps(sw[v], d);
                y[v] = _mm512_add_ps(y[v], _mm512_mul_ps(_mm512_cvtepi32_ps(a[v]), t));
            }
        }
    }
    for (y, v) in ys.iter_mut().zip(yv.iter()) {
        let p = y[at.yoff..at.yoff + PANEL].as_mut_ptr();
        // SAFETY: the slice holds 32 floats.
        unsafe {
            _mm512_storeu_ps(p, v[0]);
            _mm512_storeu_ps(p.add(16), v[1]);
        }
    }
}

/// AVX2: `R` rows x 16 columns at a time (two halves of the panel), the
/// outputs read and written in L1 once per group. Not one body with
/// [`vnni`]: without `vpdpbusd` the products sum in i16 over up to
/// `I16_QUADS` quads before widening, and 16 registers cannot hold the
/// outputs as the VNNI kernel does.
///
/// # Safety
/// The token proves the features; the caller ([`run`]) checks the sizes.
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2<const R: usize>(
    _: Avx2,
    args: &A8Args,
    panel: &[u8],
    at: &At,
    ys: &mut [&mut [f32]],
) {
    let (n, x, gs) = (args.out_feat, args.x, args.group_size);
    let ng = x.num_groups;
    let ones = _mm256_set1_epi16(1);
    if at.first {
        for y in ys.iter_mut() {
            y[at.yoff..at.yoff + PANEL].fill(0.0);
        }
    }
    for h in 0..PANEL / 16 {
        let mut wp = panel.as_ptr().wrapping_add(64 * h);
        for g in at.groups.clone() {
            let mut acc: [[__m256i; 2]; R] =
                std::array::from_fn(|j| [_mm256_set1_epi32(-8 * x.sums[(at.r0 + j) * ng + g]); 2]);
            let mut xp: [*const i8; R] =
                std::array::from_fn(|j| x.row(at.r0 + j).as_ptr().wrapping_add(g * gs));
            let mut left = gs / 4;
            while left > 0 {
                let quads = left.min(I16_QUADS);
                left -= quads;
                let mut a16 = [[_mm256_setzero_si256(); 2]; R];
                for _ in 0..quads {
                    // SAFETY: as in `vnni`: 64 bytes of this half of the
                    // quad lie in the panel, and 4 codes of the row in `x`.
                    unsafe {
                        let w0 = _mm256_loadu_si256(wp as *const __m256i);
                        let w1 = _mm256_loadu_si256(wp.add(32) as *const __m256i);
                        for (a, p) in a16.iter_mut().zip(xp.iter_mut()) {
                            let xv = _mm256_set1_epi32((*p as *const i32).read_unaligned());
                            a[0] = _mm256_add_epi16(a[0], _mm256_maddubs_epi16(w0, xv));
                            a[1] = _mm256_add_epi16(a[1], _mm256_maddubs_epi16(w1, xv));
                            *p = p.add(4);
                        }
                        wp = wp.add(QUAD);
                    }
                }
                for (a, s) in acc.iter_mut().zip(a16.iter()) {
                    a[0] = _mm256_add_epi32(a[0], _mm256_madd_epi16(s[0], ones));
                    a[1] = _mm256_add_epi32(a[1], _mm256_madd_epi16(s[1], ones));
                }
            }
            let col = at.col + 16 * h;
            let s = args.scales[g * n + col..][..16].as_ptr();
            // SAFETY: the slice above holds 16 floats.
            let sw = unsafe { [_mm256_loadu_ps(s), _mm256_loadu_ps(s.add(8))] };
            for (j, (y, a)) in ys.iter_mut().zip(acc.iter()).enumerate() {
                let d = _mm256_set1_ps(x.d[(at.r0 + j) * ng + g]);
                let y = y[at.yoff + 16 * h..][..16].as_mut_ptr();
                for v in 0..2 {
                    // SAFETY: the slice above holds 16 floats.
                    unsafe {
                        let t = _mm256_mul_ps(sw[v], d);
                        let prod = _mm256_mul_ps(_mm256_cvtepi32_ps(a[v]), t);
                        let yp = y.add(8 * v);
                        _mm256_storeu_ps(yp, _mm256_add_ps(_mm256_loadu_ps(yp), prod));
                    }
                }
            }
        }
    }
}
