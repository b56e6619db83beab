//! Q5_K: 256 weights, `{ f16 d; f16 dmin; u8 scales[12]; u8 qh[32];
//! u8 qs[128] }` (176 bytes, 5.5 bits per weight); low nibbles as Q4_K,
//! bit `2c` / `2c + 1` of `qh[l]` is the fifth bit of weight `64c + l` /
//! `64c + 32 + l`; `w = (d * sc) * q - (dmin * m)` (`k_scales`).

use super::k_scales::{multipliers, quantize_super_block};
use super::{Codes, GgmlType};

/// ggml's Q5_K.
#[derive(Clone, Copy, Debug, Default)]
pub struct Q5K;

impl GgmlType for Q5K {
    const NAME: &'static str = "q5_k";
    const GGML_TYPE: u32 = 13;
    const ELEMS: usize = 256;
    const BYTES: usize = 176;
    const HALF_SCALES: &'static [usize] = &[0, 2];
    const AFFINE: bool = true;

    super::k_scales::k_super_block_maps!();

    fn codes(b: &[u8], q: &mut Codes) {
        let qh = &b[16..48];
        for (c, qs) in b[48..176].chunks_exact(32).enumerate() {
            for (l, &v) in qs.iter().enumerate() {
                let h = qh[l] >> (2 * c);
                q[64 * c + l] = ((v & 0x0F) | ((h & 1) << 4)) as i8;
                q[64 * c + 32 + l] = ((v >> 4) | ((h & 2) << 3)) as i8;
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn codes_x86(b: *const u8, q: *mut i8) -> *const i8 {
        // SAFETY: 176 bytes at `b`, 256 at `q`, AVX2 (the caller).
        unsafe { super::codes_x86::k_quant(b.add(48), Some(b.add(16)), q) };
        q
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn codes32_x86(b: *const u8, c: usize) -> std::arch::x86_64::__m256i {
        // SAFETY: 176 bytes at `b`, AVX2 (the caller).
        unsafe { super::codes_x86::k_quant_reg(b.add(48), Some(b.add(16)), c) }
    }

    fn dequantize_block(b: &[u8], out: &mut [f32]) {
        let mult = multipliers(b);
        let qh = &b[16..48];
        for (c, (qs, w)) in b[48..176]
            .chunks_exact(32)
            .zip(out.chunks_exact_mut(64))
            .enumerate()
        {
            let ((d1, m1), (d2, m2)) = (mult[2 * c], mult[2 * c + 1]);
            let (lo, hi) = w.split_at_mut(32);
            for (l, &q) in qs.iter().enumerate() {
                let h = qh[l] >> (2 * c);
                lo[l] = d1 * f32::from((q & 0x0F) | ((h & 1) << 4)) - m1;
                hi[l] = d2 * f32::from((q >> 4) | ((h & 2) << 3)) - m2;
            }
        }
    }

    fn quantize_block(x: &[f32], b: &mut [u8]) {
        let q = quantize_super_block(x, 31.0, b);
        b[16..48].fill(0);
        for c in 0..4 {
            for l in 0..32 {
                let (a, z) = (q[64 * c + l], q[64 * c + 32 + l]);
                b[48 + 32 * c + l] = (a & 0x0F) | ((z & 0x0F) << 4);
                b[16 + l] |= ((a >> 4) << (2 * c)) | ((z >> 4) << (2 * c + 1));
            }
        }
    }
}
