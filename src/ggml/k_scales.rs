//! The super-block of Q4_K and Q5_K: 256 weights in 8 sub-blocks of 32,
//! each with a 6-bit scale and a 6-bit min packed into 12 bytes, times the
//! half `d` and `dmin` of the super-block: `w = (d * sc) * q - (dmin * m)`.

use super::{f16_at, inverse, put_f16, A8Ints, Factors, MAX_SUBS};

/// Sub-block `j`'s 6-bit (scale, min) from the 12 packed bytes `s`
/// (ggml's `get_scale_min_k4`): sub-blocks 0-3 in the low 6 bits of bytes
/// 0-3 / 4-7; sub-blocks 4-7 in the nibbles of bytes 8-11 with their top
/// two bits in the top bits of bytes 0-3 / 4-7.
#[inline(always)]
pub(crate) fn scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Pack 8 (scale, min) pairs (each < 64) the way [`scale_min`] reads them.
pub(crate) fn pack_scale_min(sc: &[u8; 8], m: &[u8; 8], s: &mut [u8]) {
    s[..12].fill(0);
    for j in 0..8 {
        if j < 4 {
            s[j] = sc[j];
            s[j + 4] = m[j];
        } else {
            s[j + 4] = (sc[j] & 0x0F) | ((m[j] & 0x0F) << 4);
            s[j - 4] |= (sc[j] >> 4) << 6;
            s[j] |= (m[j] >> 4) << 6;
        }
    }
}

/// The per-sub-block multipliers `(d * sc, dmin * m)` of a block whose
/// `d`, `dmin` and scales start at byte 0.
#[inline(always)]
pub(crate) fn multipliers(b: &[u8]) -> [(f32, f32); 8] {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    // A plain loop: `std::array::from_fn` is not inlined into the kernels.
    let mut out = [(0f32, 0f32); 8];
    for (j, o) in out.iter_mut().enumerate() {
        let (sc, m) = scale_min(j, &b[4..16]);
        *o = (d * f32::from(sc), dmin * f32::from(m));
    }
    out
}

/// The affine maps of a Q4_K / Q5_K block: `a_j = d * sc_j`, `c_j =
/// -(dmin * m_j)` (subtracting `dmin * m_j` and adding its negation are
/// the same IEEE operation).
#[inline(always)]
pub(crate) fn k_factors(b: &[u8]) -> Factors {
    let (mut a, mut c) = ([0f32; MAX_SUBS], [0f32; MAX_SUBS]);
    for (j, (d, m)) in multipliers(b).into_iter().enumerate() {
        (a[j], c[j]) = (d, -m);
    }
    (a, c)
}

/// Round-to-nearest quantization of 256 weights to codes `0..=levels`:
/// writes `d`, `dmin` and the scales (bytes 0-15 of `b`), returns the codes.
pub(crate) fn quantize_super_block(x: &[f32], levels: f32, b: &mut [u8]) -> [u8; 256] {
    let mut scale = [0f32; 8];
    let mut min = [0f32; 8];
    for (j, sub) in x.chunks_exact(32).enumerate() {
        let lo = sub.iter().fold(0f32, |m, &v| m.min(v));
        let hi = sub.iter().fold(0f32, |m, &v| m.max(v));
        scale[j] = (hi - lo) / levels;
        min[j] = -lo;
    }
    let top = |a: &[f32; 8]| a.iter().fold(0f32, |m, &v| m.max(v));
    put_f16(b, 0, top(&scale) / 63.0);
    put_f16(b, 2, top(&min) / 63.0);
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let six = |v: f32, step: f32| (v * inverse(step)).round().clamp(0.0, 63.0) as u8;
    let sc: [u8; 8] = std::array::from_fn(|j| six(scale[j], d));
    let m: [u8; 8] = std::array::from_fn(|j| six(min[j], dmin));
    pack_scale_min(&sc, &m, &mut b[4..16]);
    let mult = multipliers(b);
    let mut q = [0u8; 256];
    for (i, (c, &v)) in q.iter_mut().zip(x).enumerate() {
        let (dj, mj) = mult[i / 32];
        *c = ((v + mj) * inverse(dj)).round().clamp(0.0, levels) as u8;
    }
    q
}

/// The int8-activation integers of a Q4_K / Q5_K block: the 6-bit scales
/// `k_j = sc_j` and minimums `m_j` (`GgmlType::a8_ints`).
#[inline(always)]
pub(crate) fn k_a8_ints(b: &[u8]) -> A8Ints {
    let (mut k, mut m) = ([0i16; MAX_SUBS], [0i16; MAX_SUBS]);
    for j in 0..8 {
        let (sc, mn) = scale_min(j, &b[4..16]);
        (k[j], m[j]) = (i16::from(sc), i16::from(mn));
    }
    (k, m)
}

/// The int8-activation value of a Q4_K / Q5_K block (`GgmlType::a8_value`):
/// `w = (d sc_j) q - (dmin m_j)` summed against `dx xq` is
/// `(d dx) isum - (dmin dx) msum` (ggml's `vec_dot_q4_K_q8_K` formula).
#[inline(always)]
pub(crate) fn k_a8_value(b: &[u8], dx: f32, isum: i32, msum: i32) -> f32 {
    (f16_at(b, 0) * dx) * isum as f32 - (f16_at(b, 2) * dx) * msum as f32
}

/// The 12 scale bytes of the Q4_K / Q5_K block at `b` as the 16 bytes
/// `sc_0..sc_7, m_0..m_7` of one register: three little-endian words
/// `u0, u1, u2` rearranged (ggml's `utmp` steps) into the 8 scales
/// (`u0 & 0x3F3F3F3F`, then `(u2 & 0x0F0F0F0F) | ((u0 >> 6) & 0x03030303) << 4`)
/// and the 8 minimums (`u1 & 0x3F3F3F3F`, then `((u2 >> 4) & 0x0F0F0F0F) |
/// ((u1 >> 6) & 0x03030303) << 4`): the same integers as [`scale_min`].
/// The four words are built in one register (two dword shuffles put `u0,
/// u2, u1, u2` and `u0, u0, u1, u1` in the lanes, per-lane shifts and
/// masks do the rest; `(u >> 6 & 3) << 4` per byte is `u >> 2 & 0x30`):
/// about half the instructions of the scalar steps and four lane inserts,
/// which the one-row Q4_K step pays per weight row and block.
///
/// # Safety
/// AVX2 in force; 20 readable bytes at `b` (bytes 16-19, the first code
/// bytes, are loaded and unused).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn k_a8_bytes_x86(b: *const u8) -> std::arch::x86_64::__m128i {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract.
    unsafe {
        let (low6, nib, top2) = (0x3F3F_3F3F, 0x0F0F_0F0F, 0x3030_3030);
        let v = _mm_loadu_si128(b.add(4).cast());
        let a = _mm_shuffle_epi32::<0b10_01_10_00>(v); // u0, u2, u1, u2
        let c = _mm_shuffle_epi32::<0b01_01_00_00>(v); // u0, u0, u1, u1
        let low = _mm_and_si128(a, _mm_setr_epi32(low6, 0, low6, 0));
        let nibs = _mm_and_si128(
            _mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
            _mm_setr_epi32(0, nib, 0, nib),
        );
        let tops = _mm_and_si128(_mm_srli_epi32::<2>(c), _mm_setr_epi32(0, top2, 0, top2));
        _mm_or_si128(low, _mm_or_si128(nibs, tops))
    }
}

/// [`k_a8_ints`] with AVX2: [`k_a8_bytes_x86`] widened to int16, the
/// scales as 16 lanes (the first 8 used) and the minimums as 8.
///
/// # Safety
/// AVX2 in force; 20 readable bytes at `b`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn k_a8_ints_x86(
    b: *const u8,
) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m128i) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract.
    unsafe {
        let wide = _mm256_cvtepu8_epi16(k_a8_bytes_x86(b));
        (wide, _mm256_extracti128_si256::<1>(wide))
    }
}

/// The `GgmlType` items Q4_K and Q5_K share (their 12 scale bytes and
/// halves sit at the same offsets): the affine maps and the
/// int8-activation integers, vectors and value of the super-block.
macro_rules! k_super_block_maps {
    () => {
        #[inline(always)]
        fn factors(b: &[u8]) -> super::Factors {
            super::k_scales::k_factors(b)
        }

        #[inline(always)]
        fn a8_ints(b: &[u8]) -> super::A8Ints {
            super::k_scales::k_a8_ints(b)
        }

        const A8_UNSIGNED: bool = true;

        #[cfg(target_arch = "x86_64")]
        #[inline(always)]
        unsafe fn a8_ints_x86(
            b: *const u8,
        ) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m128i) {
            // SAFETY: the caller's contract (AVX2, the block's bytes).
            unsafe { super::k_scales::k_a8_ints_x86(b) }
        }

        #[inline(always)]
        fn a8_value(b: &[u8], dx: f32, isum: i32, msum: i32, _xsum: i32) -> f32 {
            super::k_scales::k_a8_value(b, dx, isum, msum)
        }
    };
}
pub(crate) use k_super_block_maps;
