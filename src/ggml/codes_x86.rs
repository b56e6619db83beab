//! The code extraction of each block type (`GgmlType::codes_x86`) with AVX2
//! integer instructions: the packed nibbles, fifth and sixth bits become one
//! signed byte per weight, in the order of the weights, with 16- and 32-byte
//! loads, masks and shifts (the bit layouts are in each type's file).
//!
//! Every function here is `#[inline(always)]` and called only from the
//! AVX2 / AVX-512 bodies (`body.rs`), whose `#[target_feature]` covers AVX2.

use std::arch::x86_64::*;

/// Weights `0..16` from the low nibbles of the 16 bytes at `p`, `16..32`
/// from the high nibbles, minus `bias` (Q4_0, Q4_1).
///
/// # Safety
/// AVX2 in force; 16 readable bytes at `p`, 32 writable at `q`.
#[inline(always)]
pub(super) unsafe fn nibbles32(p: *const u8, q: *mut i8, bias: i8) {
    // SAFETY: the caller's contract.
    unsafe {
        let b = _mm_loadu_si128(p.cast());
        let (m, k) = (_mm_set1_epi8(0x0F), _mm_set1_epi8(bias));
        let lo = _mm_sub_epi8(_mm_and_si128(b, m), k);
        let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(b), m), k);
        _mm_storeu_si128(q.cast(), lo);
        _mm_storeu_si128(q.add(16).cast(), hi);
    }
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
/// minus `bias`.
///
/// # Safety
/// AVX2 in force; the bytes named readable, 32 writable at `q`.
#[inline(always)]
pub(super) unsafe fn five32(qh: *const u8, qs: *const u8, q: *mut i8, bias: i8) {
    // SAFETY: the caller's contract.
    unsafe {
        let b = _mm_loadu_si128(qs.cast());
        let m = _mm_set1_epi8(0x0F);
        let low = _mm256_set_m128i(
            _mm_and_si128(_mm_srli_epi16::<4>(b), m),
            _mm_and_si128(b, m),
        );
        let v = _mm256_or_si256(low, fifth_bits(qh));
        _mm256_storeu_si256(q.cast(), _mm256_sub_epi8(v, _mm256_set1_epi8(bias)));
    }
}

/// Q4_K / Q5_K codes: per 64 weights `c`, the 32 bytes at `qs + 32c` give
/// weights `64c..64c+32` (low nibbles) and `64c+32..64c+64` (high); with
/// `qh` (Q5_K), bits `2c` / `2c + 1` of its bytes are their fifth bits.
///
/// # Safety
/// AVX2 in force; 128 readable bytes at `qs` (and 32 at `qh`), 256
/// writable at `q`.
#[inline(always)]
pub(super) unsafe fn k_quant(qs: *const u8, qh: Option<*const u8>, q: *mut i8) {
    // SAFETY: the caller's contract.
    unsafe {
        let (m, five) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
        let h = qh.map(|p| _mm256_loadu_si256(p.cast()));
        for c in 0..4 {
            let b = _mm256_loadu_si256(qs.add(32 * c).cast());
            let mut lo = _mm256_and_si256(b, m);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(b), m);
            if let Some(h) = h {
                let bit = |k: i32| {
                    let sel = _mm256_set1_epi8((1u8 << k) as i8);
                    _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, sel), sel), five)
                };
                lo = _mm256_or_si256(lo, bit(2 * c as i32));
                hi = _mm256_or_si256(hi, bit(2 * c as i32 + 1));
            }
            _mm256_storeu_si256(q.add(64 * c).cast(), lo);
            _mm256_storeu_si256(q.add(64 * c + 32).cast(), hi);
        }
    }
}

/// Q6_K codes minus 32: per half `n`, `ql` bytes `64n..64n+32` (A) and
/// `64n+32..64n+64` (B), `qh` bytes `32n..32n+32` (H); the four runs of 32
/// are A low, B low, A high, B high nibbles with bit pairs 0-1, 2-3, 4-5,
/// 6-7 of H moved to bits 4-5 (16-bit shifts, then a mask that keeps only
/// bits of the byte's own).
///
/// # Safety
/// AVX2 in force; 192 readable bytes at `b`, 256 writable at `q`.
#[inline(always)]
pub(super) unsafe fn q6_k(b: *const u8, q: *mut i8) {
    // SAFETY: the caller's contract.
    unsafe {
        let (m4, m30, k) = (
            _mm256_set1_epi8(0x0F),
            _mm256_set1_epi8(0x30),
            _mm256_set1_epi8(32),
        );
        for n in 0..2 {
            let a = _mm256_loadu_si256(b.add(64 * n).cast());
            let bb = _mm256_loadu_si256(b.add(64 * n + 32).cast());
            let h = _mm256_loadu_si256(b.add(128 + 32 * n).cast());
            let runs = [
                (_mm256_and_si256(a, m4), _mm256_slli_epi16::<4>(h)),
                (_mm256_and_si256(bb, m4), _mm256_slli_epi16::<2>(h)),
                (_mm256_and_si256(_mm256_srli_epi16::<4>(a), m4), h),
                (
                    _mm256_and_si256(_mm256_srli_epi16::<4>(bb), m4),
                    _mm256_srli_epi16::<2>(h),
                ),
            ];
            for (g, (lo, top)) in runs.into_iter().enumerate() {
                let v = _mm256_or_si256(lo, _mm256_and_si256(top, m30));
                _mm256_storeu_si256(q.add(128 * n + 32 * g).cast(), _mm256_sub_epi8(v, k));
            }
        }
    }
}
