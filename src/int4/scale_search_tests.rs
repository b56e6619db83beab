//! The quantizer methods of `scale_search` against formulas written out here.

use super::*;
use crate::testutil::rand_vec;

/// Weighted squared error of `qw` against `w` `[k, n]` with row weights `imp`.
fn error(qw: &QuantizedWeight, w: &[f32], imp: &[f32], n: usize) -> f64 {
    let d = qw.dequantize();
    w.iter()
        .zip(&d)
        .enumerate()
        .map(|(i, (a, b))| imp[i / n] as f64 * ((a - b) as f64).powi(2))
        .sum()
}

#[test]
fn rtn_is_the_historical_grid() {
    let (k, n) = (70, 9);
    let w = rand_vec(k * n, 11);
    let old = QuantizedWeight::quantize_grouped(&w, k, n, 16).unwrap();
    let rtn = QuantizedWeight::quantize_method(&w, k, n, 16, ScaleMethod::Rtn, None).unwrap();
    assert_eq!(old, rtn);
}

#[test]
fn full_maps_the_largest_value_to_minus_eight() {
    // One group of 4 inputs, 2 outputs: column 0's largest magnitude is +2,
    // column 1's is -3; Q4_0's rule gives scale = max / -8.
    let w = [1.0, -3.0, 2.0, 0.5, -1.0, 1.0, 0.25, 0.0];
    let qw = QuantizedWeight::quantize_method(&w, 4, 2, 4, ScaleMethod::Full, None).unwrap();
    assert_eq!(qw.scales(), &[2.0 / -8.0, -3.0 / -8.0]);
    assert_eq!(qw.code(1, 0), -8);
    assert_eq!(qw.code(0, 1), -8);
    // 1.0 / -0.25 = -4; -1.0 / -0.25 = 4; 0.25 / -0.25 = -1.
    assert_eq!([qw.code(0, 0), qw.code(2, 0), qw.code(3, 0)], [-4, 4, -1]);
    // Column 1: 0.5 / 0.375 = 1.33 -> 1; 1.0 / 0.375 = 2.67 -> 3; 0 -> 0.
    assert_eq!([qw.code(1, 1), qw.code(2, 1), qw.code(3, 1)], [1, 3, 0]);
}

#[test]
fn search_is_never_worse_than_rtn_or_full() {
    for (seed, (k, n, gs)) in [(64, 16, 32), (576, 8, 128), (33, 5, 8)]
        .into_iter()
        .enumerate()
    {
        let w = rand_vec(k * n, 30 + seed as u64);
        let imp: Vec<f32> = rand_vec(k, 60 + seed as u64)
            .iter()
            .map(|v| v * v)
            .collect();
        let ones = vec![1.0f32; k];
        for weights in [None, Some(&imp[..])] {
            let m =
                |method| QuantizedWeight::quantize_method(&w, k, n, gs, method, weights).unwrap();
            let e = weights.unwrap_or(&ones);
            let search = error(&m(ScaleMethod::Search), &w, e, n);
            let rtn = error(&m(ScaleMethod::Rtn), &w, e, n);
            let full = error(&m(ScaleMethod::Full), &w, e, n);
            assert!(
                search <= rtn * (1.0 + 1e-5),
                "{k}x{n}: {search} > rtn {rtn}"
            );
            assert!(
                search <= full * (1.0 + 1e-5),
                "{k}x{n}: {search} > full {full}"
            );
            // Random weights: using all 16 codes and the best scale wins clearly over absmax / 7.
            assert!(search < 0.9 * rtn, "{k}x{n}: {search} vs rtn {rtn}");
        }
    }
}

#[test]
fn search_prefers_the_important_rows() {
    // With (almost) all the importance on row 0, row 0's error is no larger
    // than with uniform importance.
    let (k, n) = (32, 4);
    let w = rand_vec(k * n, 5);
    let mut imp = vec![1e-6f32; k];
    imp[0] = 1.0;
    let qw =
        QuantizedWeight::quantize_method(&w, k, n, 32, ScaleMethod::Search, Some(&imp)).unwrap();
    let d = qw.dequantize();
    let plain = QuantizedWeight::quantize_method(&w, k, n, 32, ScaleMethod::Search, None).unwrap();
    let dp = plain.dequantize();
    let row0 = |d: &[f32]| (0..n).map(|o| ((w[o] - d[o]) as f64).powi(2)).sum::<f64>();
    assert!(row0(&d) <= row0(&dp), "{} > {}", row0(&d), row0(&dp));
}

#[test]
fn zero_groups_and_bad_importance() {
    let w = vec![0.0f32; 8 * 3];
    for m in [ScaleMethod::Rtn, ScaleMethod::Full, ScaleMethod::Search] {
        let qw = QuantizedWeight::quantize_method(&w, 8, 3, 4, m, None).unwrap();
        assert!(qw.scales().iter().all(|s| *s == MIN_SCALE), "{m:?}");
        assert!(qw.dequantize().iter().all(|v| *v == 0.0));
    }
    let w = rand_vec(8 * 3, 1);
    let bad = |imp: &[f32]| {
        QuantizedWeight::quantize_method(&w, 8, 3, 4, ScaleMethod::Search, Some(imp))
            .unwrap_err()
            .to_string()
    };
    assert!(bad(&[1.0; 7]).contains("importance"));
    let mut imp = [1.0f32; 8];
    imp[3] = -1.0;
    assert!(bad(&imp).contains("importance[3]"));
    imp[3] = f32::NAN;
    assert!(bad(&imp).contains("importance[3]"));
    assert_eq!(ScaleMethod::parse("search"), Some(ScaleMethod::Search));
    assert_eq!(ScaleMethod::parse("gptq"), None);
}
