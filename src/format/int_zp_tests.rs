//! `int_zp` as a weight format: the forward (act-order permutation
//! included) against a float64 product of the dequantized weight, the input
//! gradient, the layer blob, and bad blobs.

use std::borrow::Cow;

use super::*;
use crate::linear::{Device, QuantLinear, QuantMethod, QuantizedSerde, ReadLayer};
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
        let g = rand_vec(2 * OUT, 18);
        let mut dx = vec![0f32; 2 * IN];
        IntZp::matmul_transposed(&q, &g, 2, &mut dx).unwrap();
        for b in 0..2 {
            for i in 0..IN {
                let want: f64 = (0..OUT)
                    .map(|o| g[b * OUT + o] as f64 * deq[o * IN + i] as f64)
                    .sum();
                assert!((dx[b * IN + i] as f64 - want).abs() < 1e-5, "dx [{b}, {i}]");
            }
        }
    }
}

#[test]
fn the_layer_blob_round_trips_and_bad_parts_are_serialization_errors() {
    for bits in [4, 8] {
        let q = weight(bits);
        let layer = QuantLinear::<IntZp>::from_weight(q.clone(), None).unwrap();
        let bytes = QuantizedSerde::serialize(&layer).unwrap().into_owned();
        assert_eq!(bytes[4], IntZp::INFO.serde_tag);
        let back = <dyn QuantMethod>::read_layer(Cow::Borrowed(&bytes), &Device::Cpu).unwrap();
        assert_eq!(back.serialize_layer().unwrap().into_owned(), bytes);
        assert_eq!(back.dequantize_w_vec().unwrap(), IntZp::dequantize(&q));
        // The last perm entry made a repeat of another, CRC recomputed: the
        // reader refuses it as a serialization error naming perm.
        let n = bytes.len() - 4;
        let mut bad = bytes[..n].to_vec();
        let first = bad[n - 4 * IN..n - 4 * IN + 4].to_vec();
        bad[n - 4..].copy_from_slice(&first);
        let crc = crc32fast::hash(&bad);
        bad.extend_from_slice(&crc.to_le_bytes());
        let err = <dyn QuantMethod>::read_layer(Cow::Borrowed(&bad), &Device::Cpu).unwrap_err();
        assert!(matches!(err, QuantError::Serialization(_)), "{err}");
        assert!(err.to_string().contains("perm"), "{err}");
        let err =
            <dyn QuantMethod>::read_layer(Cow::Borrowed(&bytes[..n]), &Device::Cpu).unwrap_err();
        assert!(matches!(err, QuantError::Serialization(_)), "{err}");
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
