//! Q5_1: 32 weights, `{ f16 d; f16 m; u8 qh[4]; u8 qs[16] }` (24 bytes, 6
//! bits per weight); codes as Q5_0; `w = d * q + m`.

use super::q4_1::{min_step, scale_and_min};
use super::q5_0::{codes5, pack5};
use super::{f16_at, inverse, put_f16, Codes, Factors, GgmlType, Legacy};

/// ggml's Q5_1.
#[derive(Clone, Copy, Debug, Default)]
pub struct Q5_1;

impl GgmlType for Q5_1 {
    const NAME: &'static str = "q5_1";
    const GGML_TYPE: u32 = 7;
    const ELEMS: usize = 32;
    const BYTES: usize = 24;
    const HALF_SCALES: &'static [usize] = &[0, 2];
    const LEGACY: Legacy = Legacy::Fifth {
        qh: 4,
        qs: 8,
        bias: 0,
    };
    const AFFINE: bool = true;

    #[inline(always)]
    fn factors(b: &[u8]) -> Factors {
        scale_and_min(b)
    }

    fn codes(b: &[u8], q: &mut Codes) {
        for (c, v) in q.iter_mut().zip(codes5(&b[4..8], &b[8..24])) {
            *c = v as i8;
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn codes_x86(b: *const u8, q: *mut i8) -> *const i8 {
        // SAFETY: 24 bytes at `b`, 256 at `q`, AVX2 (the caller).
        unsafe { super::codes_x86::five32(b.add(4), b.add(8), q, 0) };
        q
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn codes32_x86(b: *const u8, _c: usize) -> std::arch::x86_64::__m256i {
        // SAFETY: 24 bytes at `b`, AVX2 (the caller).
        unsafe { super::codes_x86::five32_reg(b.add(4), b.add(8), 0) }
    }

    fn dequantize_block(b: &[u8], out: &mut [f32]) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for (o, q) in out.iter_mut().zip(codes5(&b[4..8], &b[8..24])) {
            *o = d * f32::from(q) + m;
        }
    }

    fn quantize_block(x: &[f32], b: &mut [u8]) {
        let (m, d) = min_step(x, 31.0);
        let id = inverse(d);
        put_f16(b, 0, d);
        put_f16(b, 2, m);
        let mut q = [0u8; 32];
        for (c, &v) in q.iter_mut().zip(x) {
            *c = ((v - m) * id).round().clamp(0.0, 31.0) as u8;
        }
        let (qh, qs) = b[4..24].split_at_mut(4);
        pack5(&q, qh, qs);
    }
}
