//! Q4_K: 256 weights, `{ f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }`
//! (144 bytes, 4.5 bits per weight); per 64 weights, 32 bytes hold the
//! first 32 in their low nibbles and the next 32 in their high nibbles;
//! `w = (d * sc) * q - (dmin * m)` (`k_scales`).

use super::k_scales::{multipliers, quantize_super_block};
use super::{Codes, GgmlType};

/// ggml's Q4_K.
#[derive(Clone, Copy, Debug, Default)]
pub struct Q4K;

impl GgmlType for Q4K {
    const NAME: &'static str = "q4_k";
    const GGML_TYPE: u32 = 12;
    const ELEMS: usize = 256;
    const BYTES: usize = 144;
    const HALF_SCALES: &'static [usize] = &[0, 2];
    const AFFINE: bool = true;

    super::k_scales::k_super_block_maps!();

    fn codes(b: &[u8], q: &mut Codes) {
        for (c, qs) in b[16..144].chunks_exact(32).enumerate() {
            for (l, &v) in qs.iter().enumerate() {
                q[64 * c + l] = (v & 0x0F) as i8;
                q[64 * c + 32 + l] = (v >> 4) as i8;
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn codes_x86(b: *const u8, q: *mut i8) -> *const i8 {
        // SAFETY: 144 bytes at `b`, 256 at `q`, AVX2 (the caller).
        unsafe { super::codes_x86::k_quant(b.add(16), None, q) };
        q
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn codes32_x86(b: *const u8, c: usize) -> std::arch::x86_64::__m256i {
        // SAFETY: 144 bytes at `b`, AVX2 (the caller).
        unsafe { super::codes_x86::k_quant_reg(b.add(16), None, c) }
    }

    fn dequantize_block(b: &[u8], out: &mut [f32]) {
        let mult = multipliers(b);
        for (c, (qs, w)) in b[16..144]
            .chunks_exact(32)
            .zip(out.chunks_exact_mut(64))
            .enumerate()
        {
            let ((d1, m1), (d2, m2)) = (mult[2 * c], mult[2 * c + 1]);
            let (lo, hi) = w.split_at_mut(32);
            for (l, &q) in qs.iter().enumerate() {
                lo[l] = d1 * f32::from(q & 0x0F) - m1;
                hi[l] = d2 * f32::from(q >> 4) - m2;
            }
        }
    }

    fn quantize_block(x: &[f32], b: &mut [u8]) {
        let q = quantize_super_block(x, 15.0, b);
        for (c, qs) in b[16..144].chunks_exact_mut(32).enumerate() {
            for (l, byte) in qs.iter_mut().enumerate() {
                *byte = q[64 * c + l] | (q[64 * c + 32 + l] << 4);
            }
        }
    }
}
