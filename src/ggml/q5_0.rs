//! Q5_0: 32 weights, `{ f16 d; u8 qh[4]; u8 qs[16] }` (22 bytes, 5.5 bits
//! per weight); low nibbles as Q4_0, bit `j` of the little-endian u32 `qh`
//! is the fifth bit of weight `j`; `w = d * (q - 16)`.

use super::{f16_at, inverse, put_f16, signed_absmax, Codes, GgmlType, Legacy};

/// ggml's Q5_0.
#[derive(Clone, Copy, Debug, Default)]
pub struct Q5_0;

/// The 5-bit codes of a Q5_0 / Q5_1 block from `qh` (4 bytes) and `qs`
/// (16 bytes).
pub(crate) fn codes5(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 0x0F) | ((((h >> j) & 1) as u8) << 4);
        q[j + 16] = (qs[j] >> 4) | ((((h >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

/// Pack 32 five-bit codes into `qh` (4 bytes) and `qs` (16 bytes).
pub(crate) fn pack5(q: &[u8; 32], qh: &mut [u8], qs: &mut [u8]) {
    let mut h = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
        h |= u32::from(q[j] >> 4) << j;
        h |= u32::from(q[j + 16] >> 4) << (j + 16);
    }
    qh.copy_from_slice(&h.to_le_bytes());
}

impl GgmlType for Q5_0 {
    const NAME: &'static str = "q5_0";
    const GGML_TYPE: u32 = 6;
    const ELEMS: usize = 32;
    const BYTES: usize = 22;
    const HALF_SCALES: &'static [usize] = &[0];
    const LEGACY: Legacy = Legacy::Fifth {
        qh: 2,
        qs: 6,
        bias: 16,
    };
    fn codes(b: &[u8], q: &mut Codes) {
        for (c, v) in q.iter_mut().zip(codes5(&b[2..6], &b[6..22])) {
            *c = v as i8 - 16;
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn codes_x86(b: *const u8, q: *mut i8) -> *const i8 {
        // SAFETY: 22 bytes at `b`, 256 at `q`, AVX2 (the caller).
        unsafe { super::codes_x86::five32(b.add(2), b.add(6), q, 16) };
        q
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn codes32_x86(b: *const u8, _c: usize) -> std::arch::x86_64::__m256i {
        // SAFETY: 22 bytes at `b`, AVX2 (the caller).
        unsafe { super::codes_x86::five32_reg(b.add(2), b.add(6), 16) }
    }

    fn dequantize_block(b: &[u8], out: &mut [f32]) {
        let d = f16_at(b, 0);
        for (o, q) in out.iter_mut().zip(codes5(&b[2..6], &b[6..22])) {
            *o = d * f32::from(q as i8 - 16);
        }
    }

    /// ggml's choice: the signed absmax maps to code 0 (`d = max / -16`).
    fn quantize_block(x: &[f32], b: &mut [u8]) {
        let d = signed_absmax(x) / -16.0;
        let id = inverse(d);
        put_f16(b, 0, d);
        let mut q = [0u8; 32];
        for (c, &v) in q.iter_mut().zip(x) {
            *c = (v * id + 16.5).clamp(0.0, 31.0) as u8;
        }
        let (qh, qs) = b[2..22].split_at_mut(4);
        pack5(&q, qh, qs);
    }
}
