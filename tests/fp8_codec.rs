//! FP8 slice codecs: every SIMD level against the scalar reference (decode
//! and round-to-grid), the parallel entry points, and edge values.

use proptest::prelude::*;
use quantrs::fp8::{
    decode_scalar, decode_slice, decode_slice_level, encode_scalar, encode_slice,
    round_to_grid_scalar, round_to_grid_slice, Fp8Format,
};
use quantrs::simd;

const FMTS: [Fp8Format; 2] = [Fp8Format::E4M3, Fp8Format::E5M2];

#[test]
fn decode_every_level_every_code_and_tails() {
    for fmt in FMTS {
        for n in [0usize, 1, 15, 16, 17, 255, 256, 1000, 4099] {
            let codes: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
            for level in simd::available_levels() {
                let mut out = vec![0f32; n];
                decode_slice_level(level, &codes, &mut out, fmt).unwrap();
                for (c, v) in codes.iter().zip(&out) {
                    assert_eq!(
                        v.to_bits(),
                        decode_scalar(*c, fmt).to_bits(),
                        "{level:?} {fmt:?} {c:#x}"
                    );
                }
            }
        }
    }
}

#[test]
fn parallel_entry_points_match_scalar() {
    let n = (1 << 18) + 13;
    let x: Vec<f32> = (0..n as u32)
        .map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761)))
        .collect();
    for fmt in FMTS {
        for sat in [false, true] {
            let mut codes = vec![0u8; n];
            encode_slice(&x, &mut codes, fmt, sat);
            let mut back = vec![0f32; n];
            decode_slice(&codes, &mut back, fmt);
            let mut grid = x.clone();
            round_to_grid_slice(&mut grid, fmt, sat);
            for i in (0..n).step_by(7) {
                assert_eq!(codes[i], encode_scalar(x[i], fmt, sat));
                assert_eq!(back[i].to_bits(), decode_scalar(codes[i], fmt).to_bits());
                assert_eq!(
                    grid[i].to_bits(),
                    round_to_grid_scalar(x[i], fmt, sat).to_bits()
                );
            }
        }
    }
}

#[test]
fn nan_is_canonical_and_keeps_its_sign() {
    for bits in [0x7FC0_0000u32, 0x7F80_0001, 0x7FFF_FFFF, 0x7FA0_0000] {
        for (sign, s) in [(0u32, 0u8), (0x8000_0000, 0x80)] {
            let x = f32::from_bits(bits | sign);
            assert_eq!(encode_scalar(x, Fp8Format::E4M3, false), s | 0x7F);
            assert_eq!(encode_scalar(x, Fp8Format::E5M2, false), s | 0x7E);
            assert_eq!(encode_scalar(x, Fp8Format::E5M2, true), s | 0x7E);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn round_to_grid_is_idempotent_and_nearest(v in proptest::num::f32::ANY, sat: bool) {
        for fmt in FMTS {
            let r = round_to_grid_scalar(v, fmt, sat);
            if r.is_nan() { continue; }
            prop_assert_eq!(round_to_grid_scalar(r, fmt, sat).to_bits(), r.to_bits());
            if r.is_finite() && v.is_finite() && v.abs() <= fmt.max_value() {
                // No grid value is strictly closer.
                for c in 0..=255u8 {
                    let g = decode_scalar(c, fmt);
                    if g.is_finite() {
                        prop_assert!((g as f64 - v as f64).abs() >= (r as f64 - v as f64).abs());
                    }
                }
            }
        }
    }
}
