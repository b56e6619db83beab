//! Q8_0: 32 weights, `{ f16 d; i8 qs[32] }` (34 bytes, 8.5 bits per
//! weight); `w = d * q`.

use super::{f16_at, inverse, put_f16, Codes, GgmlType, Legacy};

/// ggml's Q8_0.
#[derive(Clone, Copy, Debug, Default)]
pub struct Q8_0;

impl GgmlType for Q8_0 {
    const NAME: &'static str = "q8_0";
    const GGML_TYPE: u32 = 8;
    const ELEMS: usize = 32;
    const BYTES: usize = 34;
    const HALF_SCALES: &'static [usize] = &[0];
    const LEGACY: Legacy = Legacy::Bytes { qs: 2 };
    fn codes(b: &[u8], q: &mut Codes) {
        for (c, &v) in q.iter_mut().zip(&b[2..34]) {
            *c = v as i8;
        }
    }

    /// The codes are the block's bytes 2..34, read in place.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn codes_x86(b: *const u8, _: *mut i8) -> *const i8 {
        // SAFETY: the block has 34 bytes (the caller).
        unsafe { b.add(2).cast() }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn codes32_x86(b: *const u8, _c: usize) -> std::arch::x86_64::__m256i {
        // SAFETY: 34 bytes at `b`, AVX2 (the caller).
        unsafe { std::arch::x86_64::_mm256_loadu_si256(b.add(2).cast()) }
    }

    fn dequantize_block(b: &[u8], out: &mut [f32]) {
        let d = f16_at(b, 0);
        for (o, &q) in out.iter_mut().zip(&b[2..34]) {
            *o = d * f32::from(q as i8);
        }
    }

    fn quantize_block(x: &[f32], b: &mut [u8]) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = inverse(d);
        put_f16(b, 0, d);
        for (q, &v) in b[2..34].iter_mut().zip(x) {
            *q = ((v * id).round().clamp(-127.0, 127.0) as i8) as u8;
        }
    }
}
