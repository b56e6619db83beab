//! The code extraction of each block type (`GgmlType::codes_x86`) with AVX2
//! integer instructions: the packed nibbles, fifth and sixth bits become one
//! signed byte per weight, in the order of the weights, with 16- and 32-byte
//! loads, masks and shifts (the bit layouts are in each type's file).
//!
//! Every function here is `#[inline(always)]` and called only from the
//! AVX2 / AVX-512 bodies (`body.rs`), whose `#[target_feature]` covers AVX2.

use std::arch::x86_64::*;

/// Weights `0..16` from the low nibbles of the 16 bytes at `p`, `16..32`
/// from the high nibbles, minus `bias` (Q4_0, Q4_1), as one register.
///
/// # Safety
/// AVX2 in force; 16 readable bytes at `p`.
#[inline(always)]
pub(super) unsafe fn nibbles32_reg(p: *const u8, bias: i8) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let b = _mm_loadu_si128(p.cast());
        let m = _mm_set1_epi8(0x0F);
        let v = _mm256_set_m128i(
            _mm_and_si128(_mm_srli_epi16::<4>(b), m),
            _mm_and_si128(b, m),
        );
        _mm256_sub_epi8(v, _mm256_set1_epi8(bias))
    }
}

/// [`nibbles32_reg`] stored at `q` (one 32-byte store, so that a 32-byte
/// load of it is forwarded from the store).
///
/// # Safety
/// AVX2 in force; 16 readable bytes at `p`, 32 writable at `q`.
#[inline(always)]
pub(super) unsafe fn nibbles32(p: *const u8, q: *mut i8, bias: i8) {
    // SAFETY: the caller's contract.
    unsafe { _mm256_storeu_si256(q.cast(), nibbles32_reg(p, bias)) }
}

/// Byte `i` is `0x10` where bit `i` of the little-endian u32 at `p` is set:
/// each byte takes byte `i / 8` of the word and tests bit `i % 8`.
///
/// # Safety
/// AVX2 in force; 4 readable bytes at `p`.
#[inline(always)]
unsafe fn fifth_bits(p: *const u8) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let h = p.cast::<i32>().read_unaligned();
        let which = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let spread = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(h), which), bit);
        _mm256_and_si256(_mm256_cmpeq_epi8(spread, bit), _mm256_set1_epi8(0x10))
    }
}

/// The 32 five-bit codes of Q5_0 / Q5_1 (`qh` 4 bytes, `qs` 16 bytes)
/// minus `bias`, as one register.
///
/// # Safety
/// AVX2 in force; the bytes named readable.
#[inline(always)]
pub(super) unsafe fn five32_reg(qh: *const u8, qs: *const u8, bias: i8) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let v = _mm256_or_si256(nibbles32_reg(qs, 0), fifth_bits(qh));
        _mm256_sub_epi8(v, _mm256_set1_epi8(bias))
    }
}

/// [`five32_reg`] stored at `q`.
///
/// # Safety
/// AVX2 in force; the bytes named readable, 32 writable at `q`.
#[inline(always)]
pub(super) unsafe fn five32(qh: *const u8, qs: *const u8, q: *mut i8, bias: i8) {
    // SAFETY: the caller's contract.
    unsafe { _mm256_storeu_si256(q.cast(), five32_reg(qh, qs, bias)) }
}

/// Q4_K / Q5_K codes `32c..32c + 32`: the 32 bytes at `qs + 32 (c / 2)`
/// hold them in their low (`c` even) or high (`c` odd) nibbles; with `qh`
/// (Q5_K), bit `c` of its 32 bytes is their fifth bit.
///
/// # Safety
/// AVX2 in force; 128 readable bytes at `qs` (and 32 at `qh`), `c < 8`.
#[inline(always)]
pub(super) unsafe fn k_quant_reg(qs: *const u8, qh: Option<*const u8>, c: usize) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let b = _mm256_loadu_si256(qs.add(32 * (c / 2)).cast());
        let b = if c.is_multiple_of(2) {
            b
        } else {
            _mm256_srli_epi16::<4>(b)
        };
        let v = _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
        match qh {
            Some(p) => {
                let h = _mm256_loadu_si256(p.cast());
                let sel = _mm256_set1_epi8((1u8 << c) as i8);
                let bit = _mm256_cmpeq_epi8(_mm256_and_si256(h, sel), sel);
                _mm256_or_si256(v, _mm256_and_si256(bit, _mm256_set1_epi8(0x10)))
            }
            None => v,
        }
    }
}

/// All 256 codes of [`k_quant_reg`] stored at `q`.
///
/// # Safety
/// AVX2 in force; 128 readable bytes at `qs` (and 32 at `qh`), 256
/// writable at `q`.
#[inline(always)]
pub(super) unsafe fn k_quant(qs: *const u8, qh: Option<*const u8>, q: *mut i8) {
    // SAFETY: the caller's contract.
    unsafe {
        for c in 0..8 {
            _mm256_storeu_si256(q.add(32 * c).cast(), k_quant_reg(qs, qh, c));
        }
    }
}

/// Q6_K codes `32c..32c + 32` minus 32: in half `n = c / 4`, `ql` bytes
/// `64n..64n+32` (A) and `64n+32..64n+64` (B), `qh` bytes `32n..32n+32`
/// (H); runs `c % 4` = 0..3 are A low, B low, A high, B high nibbles with
/// bit pairs 0-1, 2-3, 4-5, 6-7 of H moved to bits 4-5 (16-bit shifts,
/// then a mask that keeps only bits of the byte's own).
///
/// # Safety
/// AVX2 in force; 192 readable bytes at `b`, `c < 8`.
#[inline(always)]
pub(super) unsafe fn q6_k_reg(b: *const u8, c: usize) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let n = c / 4;
        let m4 = _mm256_set1_epi8(0x0F);
        let l = _mm256_loadu_si256(b.add(64 * n + 32 * (c % 2)).cast());
        let h = _mm256_loadu_si256(b.add(128 + 32 * n).cast());
        let (lo, top) = match c % 4 {
            0 => (_mm256_and_si256(l, m4), _mm256_slli_epi16::<4>(h)),
            1 => (_mm256_and_si256(l, m4), _mm256_slli_epi16::<2>(h)),
            2 => (_mm256_and_si256(_mm256_srli_epi16::<4>(l), m4), h),
            _ => (
                _mm256_and_si256(_mm256_srli_epi16::<4>(l), m4),
                _mm256_srli_epi16::<2>(h),
            ),
        };
        let v = _mm256_or_si256(lo, _mm256_and_si256(top, _mm256_set1_epi8(0x30)));
        _mm256_sub_epi8(v, _mm256_set1_epi8(32))
    }
}

/// All 256 codes of [`q6_k_reg`] stored at `q`.
///
/// # Safety
/// AVX2 in force; 192 readable bytes at `b`, 256 writable at `q`.
#[inline(always)]
pub(super) unsafe fn q6_k(b: *const u8, q: *mut i8) {
    // SAFETY: the caller's contract.
    unsafe {
        for c in 0..8 {
            _mm256_storeu_si256(q.add(32 * c).cast(), q6_k_reg(b, c));
        }
    }
}
