//! AVX-512 (F/BW/VL) FP8 slice codec, callable only with an [`Avx512`]
//! token. The method is described in `format.rs` (encode) and below
//! (decode: a 128-entry magnitude table held in eight zmm registers and
//! indexed with `vpermt2ps`; the sign bit is OR-ed back in).

use std::arch::x86_64::*;

use super::format::{enc_consts, encode_scalar_slice, Fp8Format};
use crate::simd::Avx512;

/// Encode `x` into `out` (equal lengths).
///
/// # Safety
/// None beyond the token: it proves AVX-512 F, BW and VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn encode(_: Avx512, x: &[f32], out: &mut [u8], fmt: Fp8Format, saturate: bool) {
    assert_eq!(x.len(), out.len());
    let k = enc_consts(fmt, saturate);
    let abs_mask = _mm512_set1_epi32(0x7FFF_FFFF);
    let inf = _mm512_set1_epi32(0x7F80_0000);
    let one = _mm512_set1_epi32(1);
    let sign_mask = _mm512_set1_epi32(0x80);
    let round = _mm512_set1_epi32(k.round_half_m1);
    let exp_adjust = _mm512_set1_epi32(k.exp_adjust);
    let min_normal = _mm512_set1_epi32(k.min_normal_bits);
    let magic = _mm512_set1_epi32(k.magic_bits);
    let max_code = _mm512_set1_epi32(k.max_code);
    let overflow = _mm512_set1_epi32(k.overflow_code);
    let nan = _mm512_set1_epi32(k.nan_code);
    let shift = _mm_cvtsi32_si128(k.shift);
    let n = x.len() / 16 * 16;
    let mut i = 0;
    while i < n {
        // SAFETY: i + 16 <= n <= x.len() == out.len(): 16 floats read, 16 bytes written.
        unsafe {
            let v = _mm512_loadu_si512(x.as_ptr().add(i).cast());
            let abs = _mm512_and_si512(v, abs_mask);
            let sign = _mm512_and_si512(_mm512_srli_epi32::<24>(v), sign_mask);
            let lsb = _mm512_and_si512(_mm512_srl_epi32(abs, shift), one);
            let rounded = _mm512_add_epi32(abs, _mm512_add_epi32(round, lsb));
            let normal = _mm512_sub_epi32(_mm512_srl_epi32(rounded, shift), exp_adjust);
            let sum = _mm512_add_ps(_mm512_castsi512_ps(abs), _mm512_castsi512_ps(magic));
            let sub = _mm512_sub_epi32(_mm512_castps_si512(sum), magic);
            let small = _mm512_cmplt_epu32_mask(abs, min_normal);
            let mut code = _mm512_mask_blend_epi32(small, normal, sub);
            let ovf = _mm512_cmpgt_epi32_mask(code, max_code);
            code = _mm512_mask_mov_epi32(code, ovf, overflow);
            let is_nan = _mm512_cmpgt_epu32_mask(abs, inf);
            code = _mm512_mask_mov_epi32(code, is_nan, nan);
            code = _mm512_or_si512(code, sign);
            _mm_storeu_si128(out.as_mut_ptr().add(i).cast(), _mm512_cvtepi32_epi8(code));
        }
        i += 16;
    }
    encode_scalar_slice(&x[n..], &mut out[n..], fmt, saturate);
}

/// Decode `codes` into `out` (equal lengths) through `table`.
///
/// # Safety
/// None beyond the token: it proves AVX-512 F, BW and VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn decode(_: Avx512, codes: &[u8], out: &mut [f32], table: &[f32; 256]) {
    assert_eq!(codes.len(), out.len());
    // SAFETY: 16 j + 16 <= 128 <= 256 floats of the table.
    let t: [__m512; 8] =
        std::array::from_fn(|j| unsafe { _mm512_loadu_ps(table.as_ptr().add(16 * j)) });
    let b5 = _mm512_set1_epi32(32);
    let b6 = _mm512_set1_epi32(64);
    let sign_bit = _mm512_set1_epi32(0x80);
    let n = codes.len() / 16 * 16;
    let mut i = 0;
    while i < n {
        // SAFETY: i + 16 <= n <= codes.len() == out.len(): 16 bytes read, 16 floats written.
        unsafe {
            let idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(codes.as_ptr().add(i).cast()));
            // vpermt2ps uses the low 5 index bits: four lookups of 32 entries.
            let p0 = _mm512_permutex2var_ps(t[0], idx, t[1]);
            let p1 = _mm512_permutex2var_ps(t[2], idx, t[3]);
            let p2 = _mm512_permutex2var_ps(t[4], idx, t[5]);
            let p3 = _mm512_permutex2var_ps(t[6], idx, t[7]);
            let m5 = _mm512_test_epi32_mask(idx, b5);
            let m6 = _mm512_test_epi32_mask(idx, b6);
            let lo = _mm512_mask_blend_ps(m5, p0, p1);
            let hi = _mm512_mask_blend_ps(m5, p2, p3);
            let mag = _mm512_castps_si512(_mm512_mask_blend_ps(m6, lo, hi));
            let sign = _mm512_slli_epi32::<24>(_mm512_and_si512(idx, sign_bit));
            _mm512_storeu_si512(out.as_mut_ptr().add(i).cast(), _mm512_or_si512(mag, sign));
        }
        i += 16;
    }
    for (o, &c) in out[n..].iter_mut().zip(&codes[n..]) {
        *o = table[c as usize];
    }
}
