//! `int_zp` as a weight format: the forward (act-order permutation
//! included) against a float64 product of the dequantized weight, the input
//! gradient, the layer blob, and bad blobs.

use super::super::row_format_checks::{assert_bad_blobs, assert_grad_input, blob_round_trips};
use super::*;
use crate::testutil::rand_vec;

const OUT: usize = 5;
const IN: usize = 160;
const GS: usize = 64;

/// A 4- or 8-bit weight with a reversed-halves input permutation.
fn weight(bits: u32) -> ZpWeight {
    let q = quantize_rtn(&rand_vec(OUT * IN, 3), OUT, IN, GS, bits).unwrap();
    let perm: Vec<u32> = (0..IN as u32).map(|i| (i * 37) % IN as u32).collect();
    let codes: Vec<u8> = (0..OUT).flat_map(|o| q.unpacked_row(o)).collect();
    let parts = ZpParts {
        scales: q.scales().to_vec(),
        zeros: q.zeros().to_vec(),
        perm: Some(perm),
        shape: [OUT, IN],
        group_size: GS,
        bits,
    };
    ZpWeight::from_codes(&codes, parts).unwrap()
}

/// `sum_i |s| (q_i + z) |x_i|` over row `o`: what the fused dot's rounding
/// bound scales with (`crate::int_zp::dot`).
fn magnitude(q: &ZpWeight, o: usize, x: &[f32]) -> f64 {
    let codes = q.unpacked_row(o);
    let perm = q.perm().unwrap();
    (0..IN)
        .map(|i| {
            let g = o * q.groups() + i / GS;
            let s = crate::int_zp::half(q.scales()[g]).abs() as f64;
            s * (codes[i] as f64 + q.zeros()[g] as f64) * (x[perm[i] as usize] as f64).abs()
        })
        .sum()
}

#[test]
fn forward_and_gradient_match_float64_with_the_permutation() {
    for bits in [4, 8] {
        let q = weight(bits);
        assert!(q.perm().is_some());
        let deq = IntZp::dequantize(&q);
        let bias = rand_vec(OUT, 12);
        for rows in [1usize, 5, 40] {
            let x = rand_vec(rows * IN, 13 + rows as u64);
            let mut y = vec![0f32; rows * OUT];
            IntZp::matmul(&q, &x, rows, Some(&bias), &mut y).unwrap();
            for b in 0..rows {
                for o in 0..OUT {
                    let mut exact = bias[o] as f64;
                    for i in 0..IN {
                        exact += deq[o * IN + i] as f64 * x[b * IN + i] as f64;
                    }
                    let mag = magnitude(&q, o, &x[b * IN..(b + 1) * IN]) + bias[o].abs() as f64;
                    let bound = (IN + 3) as f64 * f32::EPSILON as f64 * mag;
                    let got = y[b * OUT + o] as f64;
                    assert!(
                        (got - exact).abs() <= bound,
                        "{bits} rows {rows} [{b}, {o}]"
                    );
                }
            }
        }
        assert_grad_input::<IntZp>(&q, &deq, OUT, IN);
    }
}

#[test]
fn the_layer_blob_round_trips_and_bad_parts_are_serialization_errors() {
    for bits in [4, 8] {
        let q = weight(bits);
        let bytes = blob_round_trips::<IntZp>(&q);
        // The last perm entry made a repeat of another, CRC recomputed: the
        // reader refuses it as a serialization error naming perm.
        let repeat = |b: &mut [u8]| {
            let n = b.len();
            let first = b[n - 4 * IN..n - 4 * IN + 4].to_vec();
            b[n - 4..].copy_from_slice(&first);
        };
        assert_bad_blobs(&bytes, repeat, "perm");
    }
}

#[test]
fn bits_per_weight_count_scales_and_zeros() {
    assert_eq!(IntZp::block(32, 64).unwrap().bits_per_weight(), 4.75);
    assert_eq!(IntZp::block(128, 1536).unwrap().bits_per_weight(), 4.1875);
    assert!(IntZp::block(48, 576).is_err());
    assert_eq!(
        crate::format::FormatId::parse("gptq"),
        Some(crate::format::FormatId::IntZp)
    );
}
