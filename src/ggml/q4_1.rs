//! Q4_1: 32 weights, `{ f16 d; f16 m; u8 qs[16] }` (20 bytes, 5 bits per
//! weight); nibbles as Q4_0; `w = d * q + m`.

use super::{f16_at, put_f16, Codes, Factors, GgmlType, Legacy, MAX_SUBS};
use crate::ggml::{f32_to_f16, inverse};

/// ggml's Q4_1.
#[derive(Clone, Copy, Debug, Default)]
pub struct Q4_1;

/// Offset `m` and step `d` (as stored) spanning `x` in `levels` steps.
pub(crate) fn min_step(x: &[f32], levels: f32) -> (f32, f32) {
    let lo = x.iter().fold(f32::INFINITY, |m, &v| m.min(v));
    let hi = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let stored = |v: f32| crate::linear::fp8_dialect::f16_to_f32(f32_to_f16(v));
    (stored(lo), stored((hi - lo) / levels))
}

/// The one map `w = d * q + m` of a Q4_1 / Q5_1 block (`d`, `m` its first
/// two halves).
#[inline(always)]
pub(crate) fn scale_and_min(b: &[u8]) -> Factors {
    let (mut a, mut c) = ([0f32; MAX_SUBS], [0f32; MAX_SUBS]);
    (a[0], c[0]) = (f16_at(b, 0), f16_at(b, 2));
    (a, c)
}

impl GgmlType for Q4_1 {
    const NAME: &'static str = "q4_1";
    const GGML_TYPE: u32 = 3;
    const ELEMS: usize = 32;
    const BYTES: usize = 20;
    const HALF_SCALES: &'static [usize] = &[0, 2];
    const LEGACY: Legacy = Legacy::Nibbles { qs: 4, bias: 0 };
    const AFFINE: bool = true;

    #[inline(always)]
    fn factors(b: &[u8]) -> Factors {
        scale_and_min(b)
    }

    fn codes(b: &[u8], q: &mut Codes) {
        for (j, &v) in b[4..20].iter().enumerate() {
            q[j] = (v & 0x0F) as i8;
            q[j + 16] = (v >> 4) as i8;
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn codes_x86(b: *const u8, q: *mut i8) -> *const i8 {
        // SAFETY: 20 bytes at `b`, 256 at `q`, AVX2 (the caller).
        unsafe { super::codes_x86::nibbles32(b.add(4), q, 0) };
        q
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn codes32_x86(b: *const u8, _c: usize) -> std::arch::x86_64::__m256i {
        // SAFETY: 20 bytes at `b`, AVX2 (the caller).
        unsafe { super::codes_x86::nibbles32_reg(b.add(4), 0) }
    }

    fn dequantize_block(b: &[u8], out: &mut [f32]) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        let (lo, hi) = out.split_at_mut(16);
        for (j, &q) in b[4..20].iter().enumerate() {
            lo[j] = d * f32::from(q & 0x0F) + m;
            hi[j] = d * f32::from(q >> 4) + m;
        }
    }

    fn quantize_block(x: &[f32], b: &mut [u8]) {
        let (m, d) = min_step(x, 15.0);
        let id = inverse(d);
        put_f16(b, 0, d);
        put_f16(b, 2, m);
        let code = |v: f32| ((v - m) * id).round().clamp(0.0, 15.0) as u8;
        for j in 0..16 {
            b[4 + j] = code(x[j]) | (code(x[j + 16]) << 4);
        }
    }
}
