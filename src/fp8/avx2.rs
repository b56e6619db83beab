//! AVX2 FP8 slice codec, callable only with an [`Avx2`] token. The encode
//! method is described in `format.rs`; decode is a 256-entry gather.

use std::arch::x86_64::*;

use super::format::{enc_consts, encode_scalar_slice, EncConsts, Fp8Format};
use crate::simd::Avx2;

/// Encode `x` into `out` (equal lengths).
///
/// # Safety
/// None beyond the token: it proves AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn encode(_: Avx2, x: &[f32], out: &mut [u8], fmt: Fp8Format, saturate: bool) {
    assert_eq!(x.len(), out.len());
    let k = enc_consts(fmt, saturate);
    // packus interleaves 128-bit lanes; this puts the 32-bit groups back.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let n = x.len() / 32 * 32;
    let mut i = 0;
    while i < n {
        // SAFETY: i + 32 <= n <= x.len() == out.len(): 32 floats read, 32 bytes written.
        unsafe {
            let p = x.as_ptr().add(i).cast::<__m256i>();
            let a = encode8(_mm256_loadu_si256(p), &k);
            let b = encode8(_mm256_loadu_si256(p.add(1)), &k);
            let c = encode8(_mm256_loadu_si256(p.add(2)), &k);
            let d = encode8(_mm256_loadu_si256(p.add(3)), &k);
            // Every lane holds 0..=255, so the saturating packs are exact.
            let ab = _mm256_packus_epi32(a, b);
            let cd = _mm256_packus_epi32(c, d);
            let bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), order);
            _mm256_storeu_si256(out.as_mut_ptr().add(i).cast(), bytes);
        }
        i += 32;
    }
    encode_scalar_slice(&x[n..], &mut out[n..], fmt, saturate);
}

/// Eight lanes of the AVX2 encoder (codes in the low byte of each lane).
#[target_feature(enable = "avx2")]
fn encode8(v: __m256i, k: &EncConsts) -> __m256i {
    let abs = _mm256_and_si256(v, _mm256_set1_epi32(0x7FFF_FFFF));
    let sign = _mm256_and_si256(_mm256_srli_epi32::<24>(v), _mm256_set1_epi32(0x80));
    let shift = _mm_cvtsi32_si128(k.shift);
    let lsb = _mm256_and_si256(_mm256_srl_epi32(abs, shift), _mm256_set1_epi32(1));
    let rounded = _mm256_add_epi32(
        abs,
        _mm256_add_epi32(_mm256_set1_epi32(k.round_half_m1), lsb),
    );
    let normal = _mm256_sub_epi32(
        _mm256_srl_epi32(rounded, shift),
        _mm256_set1_epi32(k.exp_adjust),
    );
    let magic = _mm256_set1_epi32(k.magic_bits);
    let sum = _mm256_add_ps(_mm256_castsi256_ps(abs), _mm256_castsi256_ps(magic));
    let sub = _mm256_sub_epi32(_mm256_castps_si256(sum), magic);
    // `abs` is non-negative as i32, so signed compares are exact here.
    let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(k.min_normal_bits), abs);
    let mut code = _mm256_blendv_epi8(normal, sub, small);
    let ovf = _mm256_cmpgt_epi32(code, _mm256_set1_epi32(k.max_code));
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(k.overflow_code), ovf);
    let is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F80_0000));
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(k.nan_code), is_nan);
    _mm256_or_si256(code, sign)
}

/// Decode `codes` into `out` (equal lengths) through `table` (a gather).
///
/// # Safety
/// None beyond the token: it proves AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn decode(_: Avx2, codes: &[u8], out: &mut [f32], table: &[f32; 256]) {
    assert_eq!(codes.len(), out.len());
    let n = codes.len() / 8 * 8;
    let mut i = 0;
    while i < n {
        // SAFETY: i + 8 <= n <= codes.len() == out.len(): 8 bytes read, 8 floats written; the gather indices are bytes, < 256 = table.len().
        unsafe {
            let idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(codes.as_ptr().add(i).cast()));
            let v = _mm256_i32gather_ps::<4>(table.as_ptr(), idx);
            _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
        }
        i += 8;
    }
    for (o, &c) in out[n..].iter_mut().zip(&codes[n..]) {
        *o = table[c as usize];
    }
}
