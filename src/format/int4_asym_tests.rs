//! `int4_asym` as a weight format: min / max quantization against the
//! formula written out here, the forward against a float64 product of the
//! dequantized weight at every SIMD level, the layer blob, and bad blobs.

use super::super::row_format_checks::{assert_bad_blobs, assert_grad_input, blob_round_trips};
use super::*;
use crate::linear::dispatch::Dots;
use crate::linear::kernels::RowSource;
use crate::simd::available_levels;
use crate::testutil::rand_vec;

/// 160 inputs in groups of 64: two full groups and one of 32.
const OUT: usize = 5;
const IN: usize = 160;
const GS: usize = 64;

fn weight() -> Vec<f32> {
    // Rows of both signs of minimum: row o is shifted by o / 2.
    rand_vec(OUT * IN, 21)
        .iter()
        .enumerate()
        .map(|(i, v)| v + (i / IN) as f32 / 2.0)
        .collect()
}

/// f32 to half and back, through the `half`-free formula: round the
/// mantissa to 10 bits, ties to even (normal range only, as here).
fn half(v: f32) -> f32 {
    let e = v.abs().log2().floor() as i32;
    let ulp = 2f64.powi(e - 10);
    let q = v as f64 / ulp;
    let r = q.round();
    let r = if (q - q.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
        r - q.signum()
    } else {
        r
    };
    (r * ulp) as f32
}

#[test]
fn min_max_quantization_is_the_formula() {
    let w = weight();
    let q = Int4Asym::quantize(&w, OUT, IN, GS).unwrap();
    assert_eq!(Int4Asym::params(&q), GS);
    let deq = Int4Asym::dequantize(&q);
    for o in 0..OUT {
        for g0 in (0..IN).step_by(GS) {
            let x = &w[o * IN + g0..o * IN + (g0 + GS).min(IN)];
            let lo = x.iter().fold(f32::INFINITY, |a, &v| a.min(v));
            let hi = x.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            let (d, m) = (half((hi - lo) / 15.0), half(lo));
            for (i, &v) in x.iter().enumerate() {
                let c = ((v - m) * (1.0 / d)).round().clamp(0.0, 15.0);
                let got = deq[o * IN + g0 + i];
                assert_eq!(got, d * c + m, "[{o}, {}]", g0 + i);
            }
        }
    }
}

/// `sum_i (|d_g q_i| + |m_g|) |x_i|` over row `o`: the magnitude the fused
/// dot's rounding bound scales with (`crate::int4_asym::dot`).
fn magnitude(q: &AsymWeight, o: usize, x: &[f32]) -> f64 {
    let codes = q.unpacked_row(o);
    let sc = &q.scales()[o * 2 * q.groups()..];
    let h = crate::linear::fp8_dialect::f16_to_f32;
    (0..IN)
        .map(|i| {
            let g = i / GS;
            let (d, m) = (h(sc[2 * g]) as f64, h(sc[2 * g + 1]) as f64);
            ((d * codes[i] as f64).abs() + m.abs()) * (x[i] as f64).abs()
        })
        .sum()
}

#[test]
fn forward_matches_float64_and_scalar_at_every_level() {
    let w = weight();
    let q = Int4Asym::quantize(&w, OUT, IN, GS).unwrap();
    let deq = Int4Asym::dequantize(&q);
    let bias = rand_vec(OUT, 12);
    for rows in [1usize, 5, 40] {
        let x = rand_vec(rows * IN, 13 + rows as u64);
        let mut y = vec![0f32; rows * OUT];
        Int4Asym::matmul(&q, &x, rows, Some(&bias), &mut y).unwrap();
        for b in 0..rows {
            for o in 0..OUT {
                let xb = &x[b * IN..(b + 1) * IN];
                let exact: f64 = bias[o] as f64
                    + (0..IN)
                        .map(|i| deq[o * IN + i] as f64 * xb[i] as f64)
                        .sum::<f64>();
                let mag = magnitude(&q, o, xb) + bias[o].abs() as f64;
                let bound = (IN + 3) as f64 * f32::EPSILON as f64 * mag;
                let got = y[b * OUT + o] as f64;
                assert!((got - exact).abs() <= bound, "rows {rows} [{b}, {o}]");
            }
        }
    }
    let x = rand_vec(IN, 17);
    for level in available_levels() {
        let dots = Dots::at(level).unwrap();
        for o in 0..OUT {
            let (got, want) = (q.dot(dots, o, &x), q.dot(Dots::Scalar, o, &x));
            let bound = 2.0 * (IN + 2) as f64 * f32::EPSILON as f64 * magnitude(&q, o, &x);
            assert!(((got - want) as f64).abs() <= bound, "{level:?} row {o}");
        }
    }
    // An unaligned column range decodes to the dequantized slice.
    let mut part = vec![0f32; 100];
    RowSource::decode(&q, 3, 37, &mut part);
    assert_eq!(part, deq[3 * IN + 37..3 * IN + 137]);
    // The input gradient is g . W.
    assert_grad_input::<Int4Asym>(&q, &deq, OUT, IN);
}

#[test]
fn the_layer_blob_round_trips_and_bad_halves_are_serialization_errors() {
    let w = weight();
    let q = Int4Asym::quantize(&w, OUT, IN, GS).unwrap();
    let bytes = blob_round_trips::<Int4Asym>(&q);
    // The last half of the blob (row 4, group 2, m) made infinite, CRC
    // recomputed: the reader refuses it as a serialization error (and a
    // truncated blob fails its CRC).
    let inf_m = |b: &mut [u8]| {
        let n = b.len();
        b[n - 2..].copy_from_slice(&0x7C00u16.to_le_bytes());
    };
    assert_bad_blobs(&bytes, inf_m, "row 4 group 2 m");
}

#[test]
fn bits_per_weight_count_the_halves() {
    assert_eq!(Int4Asym::block(32, 64).unwrap().bits_per_weight(), 5.0);
    assert_eq!(Int4Asym::block(64, 64).unwrap().bits_per_weight(), 4.5);
    assert_eq!(Int4Asym::block(128, 1536).unwrap().bits_per_weight(), 4.25);
    // 576 inputs in groups of 128: 4 full groups and one of 64.
    let b = Int4Asym::block(128, 576).unwrap();
    assert_eq!(b.code_bytes + b.scale_bytes, 288 + 20);
    assert!(Int4Asym::block(48, 576).is_err());
}
