//! The one-activation-row integer step of the AVX2 legacy body
//! (`a8_legacy_x86.rs`) for the 4- and 5-bit types (Q4_0, Q4_1, Q5_0,
//! Q5_1): the eight weight rows' exact block sums of `u * xq`, `u` the
//! stored unsigned field (`q + bias`, `a8_legacy_x86::code_bias`), as the
//! int32 lanes of one register.
//!
//! Why pairs: with one activation row nothing amortizes a per-block
//! transpose, and reducing eight rows' int32 vectors to one costs six
//! `vphaddd`. Instead two rows share a register: the low 128-bit half
//! holds row `w`'s codes `0..16` (low nibbles, then `16..32` in a second
//! register from the high nibbles) and the high half row `w + 4`'s, so one
//! 16-byte load per row, one mask and one shift unpack two rows, and the
//! activations are two 128-bit broadcasts per block. Row `w`'s products sit
//! in int16 lanes (each `vpmaddubsw` lane at most `2 * 31 * 127`, two
//! registers added at most `15748`, a `vphaddw` pair at most `31496`: no
//! overflow), and two `vphaddw`, two `vpmaddwd` by ones and one `vphaddd`
//! leave row `w`'s sum in int32 lane `w`. The sums are exact, so the block
//! values are the scalar twin's (`a8::dot_row_a8_scalar`) bit for bit.

use std::arch::x86_64::*;

use super::super::xq::XqRow;
use super::super::GgmlType;

/// Byte offsets of a 4- or 5-bit legacy block's packed fields, by ggml type
/// number (ggml-common.h): the 16 nibble bytes and, for the 5-bit types,
/// the 4 bytes of fifth bits (bit `i` of the little-endian word is code
/// `i`'s); `None` for the other types.
pub(in crate::ggml) const fn nibble_layout(ggml_type: u32) -> Option<(usize, Option<usize>)> {
    match ggml_type {
        2 => Some((2, None)),
        3 => Some((4, None)),
        6 => Some((6, Some(2))),
        7 => Some((8, Some(4))),
        _ => None,
    }
}

/// The fifth bits of the codes a [`pair_fields`] register holds, as `0x10`
/// per byte: `h` is row `w`'s fifth-bit word in its low 32 bits and row
/// `w + 4`'s in its high 32 bits; `first` picks codes `0..16` (byte 0, 1 of
/// each word) or `16..32` (bytes 2, 3).
///
/// # Safety
/// AVX2 in force.
#[inline(always)]
unsafe fn pair_fifth_bits(h: __m256i, first: bool) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        // Per 128-bit half the broadcast word pair is bytes 0-7: row `w`'s
        // word at 0-3 (low half's codes), row `w + 4`'s at 4-7 (high half).
        let o: i8 = if first { 0 } else { 2 };
        let (a, b, c, d) = (o, o + 1, o + 4, o + 5);
        let which = _mm256_setr_epi8(
            a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b, //
            c, c, c, c, c, c, c, c, d, d, d, d, d, d, d, d,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let spread = _mm256_and_si256(_mm256_shuffle_epi8(h, which), bit);
        _mm256_and_si256(_mm256_cmpeq_epi8(spread, bit), _mm256_set1_epi8(0x10))
    }
}

/// The stored fields of rows `a` (low half) and `b` (high half), codes
/// `0..16` and `16..32`: `(lo, hi)`.
///
/// # Safety
/// AVX2 in force; `a`, `b` blocks of `T`, a type of [`nibble_layout`].
#[inline(always)]
unsafe fn pair_fields<T: GgmlType>(a: *const u8, b: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller's contract; the offsets are inside the block.
    unsafe {
        let (qs, qh) = match nibble_layout(T::GGML_TYPE) {
            Some(l) => l,
            None => unreachable!("pair_fields of a type without nibbles"),
        };
        let v = _mm256_set_m128i(
            _mm_loadu_si128(b.add(qs).cast()),
            _mm_loadu_si128(a.add(qs).cast()),
        );
        let m = _mm256_set1_epi8(0x0F);
        let mut lo = _mm256_and_si256(v, m);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m);
        if let Some(o) = qh {
            let wa = u64::from(a.add(o).cast::<u32>().read_unaligned());
            let wb = u64::from(b.add(o).cast::<u32>().read_unaligned());
            let h = _mm256_set1_epi64x((wa | (wb << 32)) as i64);
            lo = _mm256_or_si256(lo, pair_fifth_bits(h, true));
            hi = _mm256_or_si256(hi, pair_fifth_bits(h, false));
        }
        (lo, hi)
    }
}

/// Lane `w` of the result: `sum_i u_i xq_i` over block `bi` of weight row
/// `w` (at `p + w * stride`), `u` the stored unsigned fields, against the
/// activation row `x`.
///
/// # Safety
/// AVX2 in force; `T` a type of [`nibble_layout`]; the eight blocks and
/// block `bi` of `x` inside their slices.
#[inline(always)]
pub(in crate::ggml) unsafe fn pair_isums<T: GgmlType>(
    p: *const u8,
    stride: usize,
    x: &XqRow<'_>,
    bi: usize,
) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let xp = x.q.as_ptr().add(bi * 32);
        let xl = _mm256_broadcastsi128_si256(_mm_loadu_si128(xp.cast()));
        let xh = _mm256_broadcastsi128_si256(_mm_loadu_si128(xp.add(16).cast()));
        // `s[k]`: rows `k` (low half) and `k + 4` (high half), eight int16
        // lanes each.
        let mut s = [_mm256_setzero_si256(); 4];
        for (k, sk) in s.iter_mut().enumerate() {
            let (lo, hi) = pair_fields::<T>(p.add(k * stride), p.add((k + 4) * stride));
            *sk = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh));
        }
        let ones = _mm256_set1_epi16(1);
        // Low half: rows 0, 1 (then 2, 3) four lanes each; high half rows
        // 4, 5 (6, 7); `vpmaddwd` halves the lanes into int32.
        let s01 = _mm256_madd_epi16(_mm256_hadd_epi16(s[0], s[1]), ones);
        let s23 = _mm256_madd_epi16(_mm256_hadd_epi16(s[2], s[3]), ones);
        // Low half: rows 0-3, high half rows 4-7: lane `w` is row `w`.
        _mm256_hadd_epi32(s01, s23)
    }
}
