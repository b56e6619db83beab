//! IEEE half scales inside blocks.

pub(crate) use crate::linear::fp8_dialect::f16_to_f32;

/// The little-endian half at byte `o` of `b`, as f32 (exact). Normal
/// halves by moving their fields into f32 bits (the hot path of every block
/// decode), the rest by `f16_to_f32`.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], o: usize) -> f32 {
    let h = u16::from_le_bytes([b[o], b[o + 1]]);
    let exp = u32::from((h >> 10) & 0x1F);
    if exp == 0 || exp == 31 {
        return f16_to_f32(h);
    }
    let sign = u32::from(h & 0x8000) << 16;
    f32::from_bits(sign | ((exp + 112) << 23) | (u32::from(h & 0x3FF) << 13))
}

/// Store `v` as a little-endian half at byte `o` of `b`.
pub(crate) fn put_f16(b: &mut [u8], o: usize, v: f32) {
    b[o..o + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
}

/// f32 to half bits, round to nearest even (overflow to infinity).
pub(crate) fn f32_to_f16(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let a = bits & 0x7FFF_FFFF;
    if a >= 0x7F80_0000 {
        // Infinity keeps its mantissa 0; a NaN becomes a quiet NaN.
        return sign | if a > 0x7F80_0000 { 0x7E00 } else { 0x7C00 };
    }
    if a >= 0x4780_0000 {
        // >= 65536: beyond the largest half even after rounding.
        return sign | 0x7C00;
    }
    if a < 0x3880_0000 {
        // Below 2^-14: a subnormal half. Adding 0.5 puts the half's
        // mantissa in the low bits of the f32, rounded by the FPU.
        let f = f32::from_bits(a) + 0.5;
        return sign | (f.to_bits() - 0x3F00_0000) as u16;
    }
    // Normal: rebias the exponent and round the 13 dropped bits to even.
    let odd = (a >> 13) & 1;
    let r = a.wrapping_add(0xC800_0FFF).wrapping_add(odd);
    sign | (r >> 13) as u16
}
