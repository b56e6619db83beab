//! OCP 8-bit floating point codecs, E4M3 and E5M2 (docs/fp8.md).
//!
//! The files import one way: this one (the public surface) -> `slice` (the
//! slice codecs, rayon above the kernels) -> `dispatch` (the kernel and its
//! CPU proof token) -> the per-ISA kernels `avx2`, `avx512` -> `format` (the
//! formats, the scalar reference codec, the encoder constants).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod dispatch;
mod format;
mod slice;

pub use format::{decode_scalar, decode_table, encode_scalar, round_to_grid_scalar, Fp8Format};
pub(crate) use slice::round_to_grid_into;
pub use slice::{
    decode_slice, decode_slice_level, encode_slice, encode_slice_level, round_to_grid_slice,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{available_levels, SimdLevel};

    /// Every level in force against the scalar reference on every code and
    /// on values around each code (ties, overflow, NaN, subnormals), or a
    /// printed skip reason where only the scalar codec can run.
    #[test]
    fn every_available_level_matches_the_scalar_codec() {
        let levels = available_levels();
        if levels == [SimdLevel::Scalar] {
            eprintln!("skipped: no SIMD level in force here (CPU or QUANTRS_SIMD)");
            return;
        }
        let mut rng = crate::testutil::Xorshift::new(7);
        let mut x: Vec<f32> = (0..4099)
            .map(|_| f32::from_bits(rng.next_u64() as u32))
            .collect();
        for fmt in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for c in 0..=255u8 {
                let v = decode_scalar(c, fmt);
                x.extend([v, v * 1.0625, v * 0.96875, -v]);
            }
        }
        x.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.0, -0.0, 1e-40]);
        for fmt in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for saturate in [false, true] {
                let want: Vec<u8> = x.iter().map(|&v| encode_scalar(v, fmt, saturate)).collect();
                for &level in &levels {
                    let mut got = vec![0u8; x.len()];
                    encode_slice_level(level, &x, &mut got, fmt, saturate).unwrap();
                    assert_eq!(got, want, "{level:?} {fmt:?} saturate={saturate}");
                    let mut dec = vec![0f32; x.len()];
                    decode_slice_level(level, &got, &mut dec, fmt).unwrap();
                    for (i, (&d, &c)) in dec.iter().zip(&got).enumerate() {
                        let r = decode_scalar(c, fmt);
                        assert!(
                            d.to_bits() == r.to_bits() || (d.is_nan() && r.is_nan()),
                            "{level:?} {fmt:?} decode {i}"
                        );
                    }
                }
            }
        }
    }

    /// A level above the one in force is an error for both level entry points.
    #[test]
    fn levels_above_the_one_in_force_are_errors() {
        for level in [SimdLevel::Neon, SimdLevel::Avx2, SimdLevel::Avx512] {
            if available_levels().contains(&level) {
                continue;
            }
            let (x, mut codes, mut y) = ([1.0f32; 4], [0u8; 4], [0f32; 4]);
            assert!(encode_slice_level(level, &x, &mut codes, Fp8Format::E4M3, true).is_err());
            assert!(decode_slice_level(level, &codes, &mut y, Fp8Format::E4M3).is_err());
        }
    }

    #[test]
    fn round_to_grid_into_matches_the_scalar_reference() {
        let x = crate::testutil::rand_vec(1500, 3);
        let x: Vec<f32> = x.iter().map(|v| v * 600.0).collect();
        let mut y = vec![0f32; x.len()];
        round_to_grid_into(&x, &mut y, Fp8Format::E4M3, true);
        for (a, b) in x.iter().zip(&y) {
            assert_eq!(
                b.to_bits(),
                round_to_grid_scalar(*a, Fp8Format::E4M3, true).to_bits()
            );
        }
    }
}
