//! The activations of the bf16 tile GEMM: `parts` planes of bf16 bits,
//! each `rows` rows of `pitch` inputs, whose sum is `x` exactly; inputs
//! past `in_feat` are zero. The tile unit reads 16 rows at a time, so the
//! rows are served in 16-row blocks: whole blocks from `main` (a bfloat16
//! input's own memory where its rows need no padding), the last short block
//! from a zero-padded copy.

use std::borrow::Cow;

use super::{bf16_rne, bf16_value};
use crate::linear::tiles::T;

/// Largest number of planes (bf16 parts of an f32).
pub(crate) const MAX_PARTS: usize = 3;

/// See the module docs.
pub(crate) struct Planes<'a> {
    /// `parts` planes of `main_rows * pitch` values, `plane` apart.
    main: Cow<'a, [u16]>,
    main_rows: usize,
    plane: usize,
    /// `parts` planes of `T * pitch` values: rows `main_rows .. rows`,
    /// zero-padded (empty when `rows` is a whole number of blocks).
    tail: Vec<u16>,
    parts: usize,
    rows: usize,
    pitch: usize,
}

impl<'a> Planes<'a> {
    /// A bfloat16 `x` `[rows, in_feat]` as one plane of pitch `in_padded`:
    /// read in place when `in_feat == in_padded` (a multiple of 32), the
    /// rows short of a block copied.
    pub(crate) fn bf16(x: &'a [u16], rows: usize, in_feat: usize, in_padded: usize) -> Self {
        assert!(x.len() == rows * in_feat && in_padded >= in_feat);
        assert!(in_padded.is_multiple_of(32));
        let main_rows = if in_feat == in_padded {
            rows / T * T
        } else {
            0
        };
        let main: Cow<'a, [u16]> = if in_feat == in_padded {
            Cow::Borrowed(&x[..main_rows * in_feat])
        } else {
            let mut m = vec![0u16; rows / T * T * in_padded];
            for (dst, src) in m.chunks_exact_mut(in_padded).zip(x.chunks_exact(in_feat)) {
                dst[..in_feat].copy_from_slice(src);
            }
            Cow::Owned(m)
        };
        let main_rows = main_rows.max(main.len() / in_padded);
        let mut tail = Vec::new();
        if main_rows < rows {
            tail = vec![0u16; T * in_padded];
            let src = x[main_rows * in_feat..].chunks_exact(in_feat);
            for (dst, s) in tail.chunks_exact_mut(in_padded).zip(src) {
                dst[..in_feat].copy_from_slice(s);
            }
        }
        Planes {
            plane: main.len(),
            main,
            main_rows,
            tail,
            parts: 1,
            rows,
            pitch: in_padded,
        }
    }

    /// A float32 `x` `[rows, in_feat]` split into as many planes as some
    /// element needs (one to three), rows padded to whole blocks, inputs to
    /// `in_padded`; `None` when an element is not finite.
    pub(crate) fn split_f32(
        x: &[f32],
        rows: usize,
        in_feat: usize,
        in_padded: usize,
    ) -> Option<Planes<'static>> {
        assert!(x.len() == rows * in_feat && in_padded >= in_feat);
        assert!(in_padded.is_multiple_of(32));
        let rows_pad = rows.next_multiple_of(T);
        let plane = rows_pad * in_padded;
        let mut buf = vec![0u16; MAX_PARTS * plane];
        let flags = split_all(x, in_feat, in_padded, plane, &mut buf);
        if flags.nonfinite {
            return None;
        }
        let parts = if flags.third {
            3
        } else if flags.second {
            2
        } else {
            1
        };
        buf.truncate(parts * plane);
        Some(Planes {
            main: Cow::Owned(buf),
            main_rows: rows_pad,
            plane,
            tail: Vec::new(),
            parts,
            rows,
            pitch: in_padded,
        })
    }

    /// Rows of `x`.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Planes summed.
    pub(crate) fn parts(&self) -> usize {
        self.parts
    }

    /// Values between consecutive rows of a block.
    pub(crate) fn pitch(&self) -> usize {
        self.pitch
    }

    /// The `T * pitch` values of 16-row block `blk` of plane `p`.
    pub(crate) fn block(&self, p: usize, blk: usize) -> &[u16] {
        assert!(p < self.parts && blk * T < self.rows);
        let len = T * self.pitch;
        if (blk + 1) * T <= self.main_rows {
            &self.main[p * self.plane + blk * len..][..len]
        } else {
            &self.tail[p * len..][..len]
        }
    }

    /// Plane `p`'s value of row `r`, input `i` (bf16 bits).
    #[cfg(test)]
    pub(crate) fn at(&self, p: usize, r: usize, i: usize) -> u16 {
        self.block(p, r / T)[(r % T) * self.pitch + i]
    }
}

/// What a split found: an element that is not finite, one that needs a
/// second part, one that needs a third.
#[derive(Default)]
struct Flags {
    nonfinite: bool,
    second: bool,
    third: bool,
}

/// `x = p0 + p1 + p2` with each a bf16 (finite `x`; see the module docs of
/// `super` for the subnormal caveat).
fn split3(v: f32) -> [u16; MAX_PARTS] {
    let hi = bf16_rne(v);
    let r = v - bf16_value(hi);
    let mid = bf16_rne(r);
    let lo = r - bf16_value(mid);
    [hi, mid, (lo.to_bits() >> 16) as u16]
}

/// Split every row of `x` into `buf`'s three planes (`plane` apart, rows
/// `pitch` apart), in parallel over blocks of rows.
fn split_all(x: &[f32], in_feat: usize, pitch: usize, plane: usize, buf: &mut [u16]) -> Flags {
    use rayon::prelude::*;
    let (p0, rest) = buf.split_at_mut(plane);
    let (p1, p2) = rest.split_at_mut(plane);
    const BLOCK_ROWS: usize = 16;
    let len = BLOCK_ROWS * pitch;
    let go = |((a, b), c): ((&mut [u16], &mut [u16]), &mut [u16]), xs: &[f32]| {
        let mut f = Flags::default();
        for (r, xr) in xs.chunks_exact(in_feat).enumerate() {
            let at = r * pitch..r * pitch + in_feat;
            let g = split_row(xr, &mut a[at.clone()], &mut b[at.clone()], &mut c[at]);
            f.nonfinite |= g.nonfinite;
            f.second |= g.second;
            f.third |= g.third;
        }
        f
    };
    let merge = |a: Flags, b: Flags| Flags {
        nonfinite: a.nonfinite | b.nonfinite,
        second: a.second | b.second,
        third: a.third | b.third,
    };
    let xs = x.chunks(BLOCK_ROWS * in_feat);
    if x.len() < (1 << 14) {
        let chunks = p0
            .chunks_mut(len)
            .zip(p1.chunks_mut(len))
            .zip(p2.chunks_mut(len));
        chunks
            .zip(xs)
            .map(|(c, xb)| go(c, xb))
            .fold(Flags::default(), merge)
    } else {
        p0.par_chunks_mut(len)
            .zip(p1.par_chunks_mut(len))
            .zip(p2.par_chunks_mut(len))
            .zip(x.par_chunks(BLOCK_ROWS * in_feat))
            .map(|(c, xb)| go(c, xb))
            .reduce(Flags::default, merge)
    }
}

/// One row: `a[i] + b[i] + c[i] = x[i]`.
fn split_row(x: &[f32], a: &mut [u16], b: &mut [u16], c: &mut [u16]) -> Flags {
    #[cfg(target_arch = "x86_64")]
    if let Some(tok) = crate::simd::Amx::new() {
        // SAFETY: the Amx token proves AVX-512 F/BW/VL and AVX512-BF16.
        return unsafe { split_row_avx512(tok, x, a, b, c) };
    }
    split_row_scalar(x, a, b, c)
}

/// The scalar twin of [`split_row_avx512`].
fn split_row_scalar(x: &[f32], a: &mut [u16], b: &mut [u16], c: &mut [u16]) -> Flags {
    let mut f = Flags::default();
    for (i, &v) in x.iter().enumerate() {
        f.nonfinite |= !v.is_finite();
        let p = split3(v);
        (a[i], b[i], c[i]) = (p[0], p[1], p[2]);
        f.second |= p[1] != 0;
        f.third |= p[2] != 0;
    }
    f
}

/// # Safety
/// AVX-512 F/BW/VL and AVX512-BF16 must be available (the token).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn split_row_avx512(
    _: crate::simd::Amx,
    x: &[f32],
    a: &mut [u16],
    b: &mut [u16],
    c: &mut [u16],
) -> Flags {
    use std::arch::x86_64::*;
    assert!(a.len() == x.len() && b.len() == x.len() && c.len() == x.len());
    let widen = |h: __m256bh| {
        // bf16 bits to the f32 they stand for: a 16-bit shift.
        // SAFETY: both are 256-bit vectors, every bit pattern valid.
        let w = unsafe { std::mem::transmute::<__m256bh, __m256i>(h) };
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(w)))
    };
    let exp = _mm512_set1_epi32(0x7F80_0000);
    let (mut bad, mut two, mut three) = (0u16, 0u16, 0u16);
    let mut i = 0;
    while i < x.len() {
        let m: __mmask16 = if x.len() - i >= 16 {
            0xFFFF
        } else {
            (1u16 << (x.len() - i)) - 1
        };
        // SAFETY: the masked loads and stores touch the lanes below
        // `x.len() - i`, inside the four slices (asserted lengths).
        unsafe {
            let v = _mm512_maskz_loadu_ps(m, x.as_ptr().add(i));
            bad |=
                _mm512_mask_cmpeq_epi32_mask(m, _mm512_and_si512(_mm512_castps_si512(v), exp), exp);
            // VCVTNEPS2BF16 rounds to nearest even, as `bf16_rne`.
            let h1 = _mm512_cvtneps_pbh(v);
            let r = _mm512_sub_ps(v, widen(h1));
            let h2 = _mm512_cvtneps_pbh(r);
            let r2 = _mm512_sub_ps(r, widen(h2));
            let h3 = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(_mm512_castps_si512(r2)));
            let h1 = std::mem::transmute::<__m256bh, __m256i>(h1);
            let h2 = std::mem::transmute::<__m256bh, __m256i>(h2);
            two |= _mm256_mask_test_epi16_mask(m, h2, h2);
            three |= _mm256_mask_test_epi16_mask(m, h3, h3);
            _mm256_mask_storeu_epi16(a.as_mut_ptr().add(i).cast(), m, h1);
            _mm256_mask_storeu_epi16(b.as_mut_ptr().add(i).cast(), m, h2);
            _mm256_mask_storeu_epi16(c.as_mut_ptr().add(i).cast(), m, h3);
        }
        i += 16;
    }
    Flags {
        nonfinite: bad != 0,
        second: two != 0,
        third: three != 0,
    }
}

/// A row splitter writing three planes (tests).
#[cfg(test)]
type Splitter<'a> = &'a dyn Fn(&mut [u16], &mut [u16], &mut [u16]) -> Flags;

/// The scalar and the dispatched split of `x`: all three planes back to
/// back, and the flags (tests).
#[cfg(test)]
pub(super) fn split_row_both(x: &[f32]) -> [(Vec<u16>, bool, bool, bool); 2] {
    let n = x.len();
    let run = |f: Splitter| {
        let (mut a, mut b, mut c) = (vec![0; n], vec![0; n], vec![0; n]);
        let fl = f(&mut a, &mut b, &mut c);
        a.extend(b);
        a.extend(c);
        (a, fl.nonfinite, fl.second, fl.third)
    };
    [
        run(&|a, b, c| split_row_scalar(x, a, b, c)),
        run(&|a, b, c| split_row(x, a, b, c)),
    ]
}
