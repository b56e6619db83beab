//! Q6_K: 256 weights, `{ u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }`
//! (210 bytes, 6.5625 bits per weight). Weight `i` of half `n = i / 128`
//! (`g = (i % 128) / 32`, `l = i % 32`): low 4 bits in nibble `g / 2` of
//! `ql[64n + 32(g % 2) + l]`, top 2 bits at bit `2g` of `qh[32n + l]`,
//! scale `scales[i / 16]`; `w = (d * scale) * (q - 32)`.

use super::{f16_at, inverse, put_f16, signed_absmax, A8Ints, Codes, Factors, GgmlType, MAX_SUBS};

/// ggml's Q6_K.
#[derive(Clone, Copy, Debug, Default)]
pub struct Q6K;

/// Where weight `i`'s bits are: (ql byte, ql shift, qh byte, qh shift).
fn place(i: usize) -> (usize, u32, usize, u32) {
    let (n, g, l) = (i / 128, (i % 128) / 32, i % 32);
    (
        64 * n + 32 * (g % 2) + l,
        4 * (g / 2) as u32,
        128 + 32 * n + l,
        2 * g as u32,
    )
}

impl GgmlType for Q6K {
    const NAME: &'static str = "q6_k";
    const GGML_TYPE: u32 = 14;
    const ELEMS: usize = 256;
    const BYTES: usize = 210;
    const HALF_SCALES: &'static [usize] = &[208];
    const SUB: usize = 16;

    #[inline(always)]
    fn factors(b: &[u8]) -> Factors {
        let d = f16_at(b, 208);
        let mut a = [0f32; MAX_SUBS];
        for (o, &sc) in a.iter_mut().zip(&b[192..208]) {
            *o = d * f32::from(sc as i8);
        }
        (a, [0.0; MAX_SUBS])
    }

    /// The signed 8-bit scales `k_j = scales[j]`, no minimum.
    #[inline(always)]
    fn a8_ints(b: &[u8]) -> A8Ints {
        let mut k = [0i16; MAX_SUBS];
        for (o, &sc) in k.iter_mut().zip(&b[192..208]) {
            *o = i16::from(sc as i8);
        }
        (k, [0; MAX_SUBS])
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn a8_ints_x86(
        b: *const u8,
    ) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m128i) {
        use std::arch::x86_64::*;
        // SAFETY: 210 bytes at `b`, AVX2 (the caller).
        unsafe {
            let k = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192).cast()));
            (k, _mm_setzero_si128())
        }
    }

    /// `w = (d k_j) q`: `(d dx) isum` (ggml's `vec_dot_q6_K_q8_K`).
    #[inline(always)]
    fn a8_value(b: &[u8], dx: f32, isum: i32, _msum: i32, _xsum: i32) -> f32 {
        (f16_at(b, 208) * dx) * isum as f32
    }

    fn codes(b: &[u8], q: &mut Codes) {
        for (i, c) in q.iter_mut().enumerate() {
            let (lb, ls, hb, hs) = place(i);
            *c = (((b[lb] >> ls) & 0x0F) | (((b[hb] >> hs) & 3) << 4)) as i8 - 32;
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn codes_x86(b: *const u8, q: *mut i8) -> *const i8 {
        // SAFETY: 210 bytes at `b`, 256 at `q`, AVX2 (the caller).
        unsafe { super::codes_x86::q6_k(b, q) };
        q
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn codes32_x86(b: *const u8, c: usize) -> std::arch::x86_64::__m256i {
        // SAFETY: 210 bytes at `b`, AVX2 (the caller).
        unsafe { super::codes_x86::q6_k_reg(b, c) }
    }

    fn dequantize_block(b: &[u8], out: &mut [f32]) {
        let d = f16_at(b, 208);
        let mult: [f32; 16] = std::array::from_fn(|j| d * f32::from(b[192 + j] as i8));
        for (i, o) in out.iter_mut().enumerate() {
            let (lb, ls, hb, hs) = place(i);
            let q = ((b[lb] >> ls) & 0x0F) | (((b[hb] >> hs) & 3) << 4);
            *o = mult[i / 16] * f32::from(q as i8 - 32);
        }
    }

    fn quantize_block(x: &[f32], b: &mut [u8]) {
        let scale: [f32; 16] =
            std::array::from_fn(|j| signed_absmax(&x[16 * j..16 * j + 16]) / -32.0);
        let top = scale.iter().fold(0f32, |m, v| m.max(v.abs()));
        put_f16(b, 208, top / 127.0);
        let d = f16_at(b, 208);
        for (j, s) in scale.iter().enumerate() {
            b[192 + j] = ((s * inverse(d)).round().clamp(-127.0, 127.0) as i8) as u8;
        }
        b[..192].fill(0);
        for (i, &v) in x.iter().enumerate() {
            let step = d * f32::from(b[192 + i / 16] as i8);
            let q = ((v * inverse(step)).round() + 32.0).clamp(0.0, 63.0) as u8;
            let (lb, ls, hb, hs) = place(i);
            b[lb] |= (q & 0x0F) << ls;
            b[hb] |= (q >> 4) << hs;
        }
    }
}
