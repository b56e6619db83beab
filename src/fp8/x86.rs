//! x86-64 FP8 codec kernels (AVX2, AVX-512). Scalar tails use the reference.
//!
//! Encode, per 32-bit lane (the same rounding as `encode_scalar`):
//! - normal range (`|x| >= 2^emin`): round the f32 mantissa to `m` bits with
//!   the integer round-half-even trick `abs + (half - 1) + lsb`, shift, and
//!   rebias the exponent; a carry out of the mantissa bumps the exponent.
//! - subnormal range: `|x| + 2^(emin - m + 23)` in f32 rounds `|x|` to a
//!   multiple of the FP8 subnormal step (IEEE round-to-nearest-even, the
//!   default MXCSR mode), and the low mantissa bits of the sum are the code
//!   (the `float_to_half` "magic number" trick, F. Giesen 2012).
//! - codes above `max_code` (and inf) overflow; NaN takes the canonical code.
//!
//! Decode is a table lookup: a 128-entry magnitude table held in eight zmm
//! registers and indexed with `vpermt2ps` (AVX-512), or a 256-entry gather
//! (AVX2); the sign bit is OR-ed back in.

use std::arch::x86_64::*;

use super::{encode_scalar, Fp8Format};

/// Per-format constants of the encoder, as 32-bit lane values.
struct EncConsts {
    shift: i32,
    round_half_m1: i32,
    exp_adjust: i32,
    min_normal_bits: i32,
    magic_bits: i32,
    max_code: i32,
    overflow_code: i32,
    nan_code: i32,
}

fn enc_consts(fmt: Fp8Format, saturate: bool) -> EncConsts {
    let m = fmt.mantissa_bits() as i32;
    let emin = 1 - fmt.bias();
    EncConsts {
        shift: 23 - m,
        round_half_m1: (1 << (22 - m)) - 1,
        exp_adjust: (127 - fmt.bias()) << m,
        min_normal_bits: (127 + emin) << 23,
        magic_bits: (127 + emin - m + 23) << 23,
        max_code: fmt.max_code() as i32,
        overflow_code: if saturate {
            fmt.max_code()
        } else {
            fmt.overflow_code()
        } as i32,
        nan_code: fmt.nan_code() as i32,
    }
}

fn scalar_tail(x: &[f32], out: &mut [u8], fmt: Fp8Format, saturate: bool) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = encode_scalar(v, fmt, saturate);
    }
}

/// # Safety
/// The CPU must support AVX-512 F, BW and VL; `out.len() == x.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn encode_avx512(x: &[f32], out: &mut [u8], fmt: Fp8Format, saturate: bool) {
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
        i += 16;
    }
    scalar_tail(&x[n..], &mut out[n..], fmt, saturate);
}

/// Eight lanes of the AVX2 encoder (codes in the low byte of each lane).
#[target_feature(enable = "avx2")]
unsafe fn encode8_avx2(v: __m256i, k: &EncConsts) -> __m256i {
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

/// # Safety
/// The CPU must support AVX2; `out.len() == x.len()`.
#[target_feature(enable = "avx2")]
pub unsafe fn encode_avx2(x: &[f32], out: &mut [u8], fmt: Fp8Format, saturate: bool) {
    let k = enc_consts(fmt, saturate);
    // packus interleaves 128-bit lanes; this puts the 32-bit groups back.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let n = x.len() / 32 * 32;
    let mut i = 0;
    while i < n {
        let p = x.as_ptr().add(i).cast::<__m256i>();
        let a = encode8_avx2(_mm256_loadu_si256(p), &k);
        let b = encode8_avx2(_mm256_loadu_si256(p.add(1)), &k);
        let c = encode8_avx2(_mm256_loadu_si256(p.add(2)), &k);
        let d = encode8_avx2(_mm256_loadu_si256(p.add(3)), &k);
        // Every lane holds 0..=255, so the saturating packs are exact.
        let ab = _mm256_packus_epi32(a, b);
        let cd = _mm256_packus_epi32(c, d);
        let bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), order);
        _mm256_storeu_si256(out.as_mut_ptr().add(i).cast(), bytes);
        i += 32;
    }
    scalar_tail(&x[n..], &mut out[n..], fmt, saturate);
}

/// # Safety
/// The CPU must support AVX-512 F, BW and VL; `out.len() == codes.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn decode_avx512(codes: &[u8], out: &mut [f32], table: &[f32; 256]) {
    let t: [__m512; 8] = std::array::from_fn(|j| _mm512_loadu_ps(table.as_ptr().add(16 * j)));
    let b5 = _mm512_set1_epi32(32);
    let b6 = _mm512_set1_epi32(64);
    let sign_bit = _mm512_set1_epi32(0x80);
    let n = codes.len() / 16 * 16;
    let mut i = 0;
    while i < n {
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
        i += 16;
    }
    for (o, &c) in out[n..].iter_mut().zip(&codes[n..]) {
        *o = table[c as usize];
    }
}

/// # Safety
/// The CPU must support AVX2; `out.len() == codes.len()`.
#[target_feature(enable = "avx2")]
pub unsafe fn decode_avx2(codes: &[u8], out: &mut [f32], table: &[f32; 256]) {
    let n = codes.len() / 8 * 8;
    let mut i = 0;
    while i < n {
        let idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(codes.as_ptr().add(i).cast()));
        let v = _mm256_i32gather_ps::<4>(table.as_ptr(), idx);
        _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
        i += 8;
    }
    for (o, &c) in out[n..].iter_mut().zip(&codes[n..]) {
        *o = table[c as usize];
    }
}
