//! Q4_0: 32 weights, `{ f16 d; u8 qs[16] }` (18 bytes, 4.5 bits per
//! weight); byte `j` holds weight `j` (low nibble) and `j + 16` (high);
//! `w = d * (q - 8)`.

use super::{f16_at, inverse, put_f16, signed_absmax, Codes, GgmlType, Legacy};

/// ggml's Q4_0.
#[derive(Clone, Copy, Debug, Default)]
pub struct Q4_0;

impl GgmlType for Q4_0 {
    const NAME: &'static str = "q4_0";
    const GGML_TYPE: u32 = 2;
    const ELEMS: usize = 32;
    const BYTES: usize = 18;
    const HALF_SCALES: &'static [usize] = &[0];
    const LEGACY: Legacy = Legacy::Nibbles { qs: 2, bias: 8 };
    fn codes(b: &[u8], q: &mut Codes) {
        for (j, &v) in b[2..18].iter().enumerate() {
            q[j] = (v & 0x0F) as i8 - 8;
            q[j + 16] = (v >> 4) as i8 - 8;
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn codes_x86(b: *const u8, q: *mut i8) -> *const i8 {
        // SAFETY: 18 bytes at `b`, 256 at `q`, AVX2 (the caller).
        unsafe { super::codes_x86::nibbles32(b.add(2), q, 8) };
        q
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn codes32_x86(b: *const u8, _c: usize) -> std::arch::x86_64::__m256i {
        // SAFETY: 18 bytes at `b`, AVX2 (the caller).
        unsafe { super::codes_x86::nibbles32_reg(b.add(2), 8) }
    }

    fn dequantize_block(b: &[u8], out: &mut [f32]) {
        let d = f16_at(b, 0);
        let (lo, hi) = out.split_at_mut(16);
        for (j, &q) in b[2..18].iter().enumerate() {
            lo[j] = d * f32::from((q & 0x0F) as i8 - 8);
            hi[j] = d * f32::from((q >> 4) as i8 - 8);
        }
    }

    /// ggml's choice: the signed absmax maps to code 0 (`d = max / -8`).
    fn quantize_block(x: &[f32], b: &mut [u8]) {
        let d = signed_absmax(x) / -8.0;
        let id = inverse(d);
        put_f16(b, 0, d);
        let code = |v: f32| (v * id + 8.5).clamp(0.0, 15.0) as u8;
        for j in 0..16 {
            b[2 + j] = code(x[j]) | (code(x[j + 16]) << 4);
        }
    }
}
