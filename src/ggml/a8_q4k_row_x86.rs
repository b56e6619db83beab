//! The one-activation-row integer step of the AVX2 k-quant body
//! (`a8_kquant_x86.rs`) for Q4_K: row `w`'s `sum_j k_j dot_j` of one block
//! as int32 lanes, with two sub-blocks per register.
//!
//! Why: Q4_K keeps sub-block `2i` in the low nibbles and `2i + 1` in the
//! high nibbles of the same 32 bytes (ggml-common.h, `block_q4_K`). The
//! general step unpacks 32 codes of one sub-block per register, so each
//! sub-block pays its own `vpmaddwd` by its scale and a scale broadcast (an
//! element extract and `vpbroadcastw`: a quarter of the row's vector work on
//! Zen 3 by `perf annotate`). Here a 16-byte half of those 32 bytes is
//! broadcast to both 128-bit halves, and one per-lane shift (`vpsrlvd` by 0
//! in the low half, 4 in the high) and one mask give codes `0..16` of
//! sub-block `2i` (low half) and of `2i + 1` (high half) in one register.
//! The activations are arranged the same way once per block for all eight
//! rows ([`pair_activations`]), so the two `vpmaddubsw` of a byte group add
//! in int16 (each lane at most `2 * 15 * 127`, the sum at most `7620`), and
//! one `vpmaddwd` by `[k_2i x 8 | k_2i+1 x 8]` (one `vpshufb` of the scale
//! bytes) takes both sub-blocks to int32. The sums are exact, so the block
//! values are the scalar twin's (`a8::dot_row_a8_scalar`) bit for bit.

use std::arch::x86_64::*;

use super::super::k_scales::k_a8_bytes_x86;
use super::super::xq::XqRow;

/// Q4_K (ggml type 12): 144-byte blocks, the 12 scale bytes at 4, the
/// 128 code bytes at 16.
pub(in crate::ggml) const Q4_K_TYPE: u32 = 12;
const CODES_AT: usize = 16;

/// Block `bi`'s 256 activations of `x` as eight registers: `[2i]` holds
/// activations `64i..64i + 16` (low half) and `64i + 32..64i + 48` (high
/// half), `[2i + 1]` the 16 after each; the order of [`row_isums`]'s codes.
///
/// # Safety
/// AVX2 in force; `x.q` holds 256 codes at `256 * bi`.
#[inline(always)]
pub(in crate::ggml) unsafe fn pair_activations(x: &XqRow<'_>, bi: usize) -> [__m256i; 8] {
    // SAFETY: the caller's contract.
    unsafe {
        let xp = x.q.as_ptr().add(256 * bi);
        let at = |o: usize| xp.add(o).cast::<__m128i>();
        let mut v = [_mm256_setzero_si256(); 8];
        for i in 0..4 {
            v[2 * i] = _mm256_loadu2_m128i(at(64 * i + 32), at(64 * i));
            v[2 * i + 1] = _mm256_loadu2_m128i(at(64 * i + 48), at(64 * i + 16));
        }
        v
    }
}

/// The scale bytes of the block at `b` (`sc_0..sc_7, m_0..m_7`,
/// `k_scales::k_a8_bytes_x86`) in both 128-bit halves, and the minimums
/// `m_0..m_7` as int32 lanes.
///
/// # Safety
/// AVX2 in force; 20 readable bytes at `b` (`k_scales::k_a8_bytes_x86`).
#[inline(always)]
pub(in crate::ggml) unsafe fn scale_bytes(b: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller's contract.
    unsafe {
        let s = k_a8_bytes_x86(b);
        (
            _mm256_broadcastsi128_si256(s),
            _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(s)),
        )
    }
}

/// `sum_j k_j dot_j` over the Q4_K block at `b` against the activations
/// `xv` ([`pair_activations`]), as int32 lanes (their sum is the block's
/// exact `isum`); `kb` the block's [`scale_bytes`].
///
/// # Safety
/// AVX2 in force; 144 readable bytes at `b`.
#[inline(always)]
pub(in crate::ggml) unsafe fn row_isums(b: *const u8, xv: &[__m256i; 8], kb: __m256i) -> __m256i {
    // SAFETY: the caller's contract; the loads are bytes 16..144 of the
    // block.
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        let shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
        let (mut acc0, mut acc1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for i in 0..4 {
            let q = b.add(CODES_AT + 32 * i);
            let lo = _mm256_broadcastsi128_si256(_mm_loadu_si128(q.cast()));
            let hi = _mm256_broadcastsi128_si256(_mm_loadu_si128(q.add(16).cast()));
            let lo = _mm256_and_si256(_mm256_srlv_epi32(lo, shift), mask);
            let hi = _mm256_and_si256(_mm256_srlv_epi32(hi, shift), mask);
            let p = _mm256_add_epi16(
                _mm256_maddubs_epi16(lo, xv[2 * i]),
                _mm256_maddubs_epi16(hi, xv[2 * i + 1]),
            );
            // int16 lanes: scale byte `2i` (low half) / `2i + 1` (high half)
            // zero-extended (`-128`: a zero byte).
            let (a, c) = (2 * i as i8, 2 * i as i8 + 1);
            let z = -128i8;
            let pick = _mm256_setr_epi8(
                a, z, a, z, a, z, a, z, a, z, a, z, a, z, a, z, //
                c, z, c, z, c, z, c, z, c, z, c, z, c, z, c, z,
            );
            let k = _mm256_madd_epi16(p, _mm256_shuffle_epi8(kb, pick));
            if i % 2 == 0 {
                acc0 = _mm256_add_epi32(acc0, k);
            } else {
                acc1 = _mm256_add_epi32(acc1, k);
            }
        }
        _mm256_add_epi32(acc0, acc1)
    }
}
