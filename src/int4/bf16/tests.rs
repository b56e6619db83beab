//! Tests of the bf16 tile GEMM: the split of float32 activations (exact,
//! SIMD equal to scalar), the tile kernel against its scalar twin and
//! against float64 within the bound of the module docs on edge shapes (rows
//! short of a tile and of a pair, several row blocks, columns short of a
//! panel, padded inputs, several chunks of groups, one to three planes),
//! and the drivers (`try_matmul` from `MIN_BATCH` rows, `matmul_bf16`).

use super::planes::{split_row_both, Planes};
use super::*;
use crate::int4::QuantizedWeight;
use crate::testutil::rand_vec;

/// (in_feat, out_feat, group_size): SmolLM2's 576 inputs at g32 and g128
/// (padded to 640), g64, several chunks of groups (1100 inputs at g32,
/// padded to 1120), a group deeper than a chunk (g1024), columns short of a
/// panel.
const SHAPES: [(usize, usize, usize); 6] = [
    (576, 64, 32),
    (576, 70, 128),
    (256, 96, 64),
    (1100, 45, 32),
    (2048, 40, 1024),
    (64, 33, 32),
];

/// Batches: one tile, a tile and a row, a pair and a row, more than one row
/// block (256 rows) with a short last tile.
const BATCHES: [usize; 4] = [16, 17, 33, 301];

fn weight(k: usize, n: usize, gs: usize, seed: u64) -> QuantizedWeight {
    let w: Vec<f32> = rand_vec(k * n, seed).iter().map(|v| v - 0.5).collect();
    QuantizedWeight::quantize_grouped(&w, k, n, gs).unwrap()
}

fn acts(m: usize, k: usize, seed: u64) -> Vec<f32> {
    rand_vec(m * k, seed)
        .iter()
        .map(|v| 8.0 * v - 4.0)
        .collect()
}

/// Per output: the float64 value of `x @ W` and `sum_g |s_g| sum_i |q_i x_i|`.
fn reference(qw: &QuantizedWeight, x: &[f32], m: usize) -> (Vec<f64>, Vec<f64>) {
    let (k, n, gs) = (qw.in_feat(), qw.out_feat(), qw.group_size());
    let (mut want, mut mag) = (vec![0f64; m * n], vec![0f64; m * n]);
    for r in 0..m {
        for o in 0..n {
            let (mut s, mut a) = (0f64, 0f64);
            for g in 0..qw.num_groups() {
                let sc = f64::from(qw.scales()[g * n + o]);
                let (mut gsum, mut gmag) = (0f64, 0f64);
                for i in g * gs..((g + 1) * gs).min(k) {
                    let p = f64::from(qw.code(i, o)) * f64::from(x[r * k + i]);
                    gsum += p;
                    gmag += p.abs();
                }
                s += gsum * sc;
                a += gmag * sc.abs();
            }
            want[r * n + o] = s;
            mag[r * n + o] = a;
        }
    }
    (want, mag)
}

/// The documented bound: the f32 sums of a group (up to `gs * parts` terms)
/// and of the groups, each rounding at most 2^-24 of the running magnitude.
fn bound(qw: &QuantizedWeight, parts: usize, mag: f64) -> f64 {
    (qw.group_size() * parts + qw.num_groups() + 2) as f64 * 2f64.powi(-23) * mag + 1e-30
}

#[test]
fn split_is_exact_and_simd_equals_scalar() {
    let mut x = acts(1, 1000, 5);
    x[3] = 1.5;
    x[7] = 1e-30;
    x[9] = -3.0e30;
    for len in [0, 1, 15, 16, 17, 1000] {
        let [s, v] = split_row_both(&x[..len]);
        assert_eq!(s, v, "len {len}");
        for (i, &xv) in x[..len].iter().enumerate() {
            let sum: f64 = (0..3)
                .map(|p| f64::from(bf16_value(s.0[p * len + i])))
                .sum();
            assert_eq!(sum, f64::from(xv), "element {i}");
        }
        assert!(!s.1);
    }
    let [s, v] = split_row_both(&[1.5, -448.0, 0.0]);
    assert_eq!((s.2, s.3), (false, false));
    assert_eq!(s, v);
    let [s, v] = split_row_both(&[1.0 + 1.0 / 256.0]);
    assert_eq!((s.2, s.3), (true, false));
    assert_eq!(s, v);
    let [s, v] = split_row_both(&[1.0 + 1.0 / 512.0 + 1.0 / 1_048_576.0]);
    assert_eq!((s.2, s.3), (true, true));
    assert_eq!(s, v);
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let [s, v] = split_row_both(&[1.0, bad, 2.0]);
        assert!(s.1 && v.1);
    }
}

/// The planes of `x` with 1, 2 or 3 parts needed, and their value.
fn planed(x: &[f32], parts: usize) -> Vec<f32> {
    x.iter()
        .map(|&v| match parts {
            1 => bf16_value(bf16_rne(v)),
            2 => bf16_value(bf16_rne(v)) + bf16_value(bf16_rne(v / 300.0)),
            _ => v,
        })
        .collect()
}

#[test]
fn tiles_match_the_scalar_twin_and_float64() {
    let Some(tok) = tiles_for(32) else {
        eprintln!("skipped: no AMX-BF16 here");
        return;
    };
    for (s, &(k, n, gs)) in SHAPES.iter().enumerate() {
        let qw = weight(k, n, gs, 10 + s as u64);
        let v = qw.view();
        for &m in &BATCHES {
            for parts in 1..=3 {
                let x = planed(&acts(m, k, (m + s) as u64), parts);
                let planes = Planes::split_f32(&x, m, k, qw.in_padded()).unwrap();
                assert_eq!(planes.parts(), parts);
                let mut got = vec![f32::NAN; m * n];
                matmul_tiles(tok, &v, &planes, Out::F32(&mut got));
                let mut twin = vec![f32::NAN; m * n];
                matmul_scalar(&v, &planes, Out::F32(&mut twin));
                let (want, mag) = reference(&qw, &x, m);
                for i in 0..m * n {
                    let what = format!("[{k}x{n}] g{gs} m={m} parts={parts} at {i}");
                    let b = bound(&qw, parts, mag[i]);
                    let (g, t) = (f64::from(got[i]), f64::from(twin[i]));
                    assert!((g - want[i]).abs() <= b, "{what}: {g} vs {}", want[i]);
                    assert!((t - want[i]).abs() <= b, "twin {what}: {t} vs {}", want[i]);
                    assert!((g - t).abs() <= 2.0 * b, "{what}: {g} vs twin {t}");
                }
            }
        }
    }
}

#[test]
fn bf16_in_place_and_copied_match_the_twin() {
    let Some(tok) = tiles_for(32) else {
        eprintln!("skipped: no AMX-BF16 here");
        return;
    };
    for (s, &(k, n, gs)) in SHAPES.iter().enumerate() {
        let qw = weight(k, n, gs, 30 + s as u64);
        let v = qw.view();
        let bias = acts(1, n, 7);
        for &m in &BATCHES {
            let xb: Vec<u16> = acts(m, k, 40 + m as u64)
                .iter()
                .map(|&f| bf16_rne(f))
                .collect();
            let planes = Planes::bf16(&xb, m, k, qw.in_padded());
            let mut got = vec![0xFFFFu16; m * n];
            matmul_tiles(
                tok,
                &v,
                &planes,
                Out::Bf16 {
                    y: &mut got,
                    bias: Some(&bias),
                },
            );
            let mut twin = vec![0xFFFFu16; m * n];
            matmul_scalar(
                &v,
                &planes,
                Out::Bf16 {
                    y: &mut twin,
                    bias: Some(&bias),
                },
            );
            let xf: Vec<f32> = xb.iter().map(|&h| bf16_value(h)).collect();
            let (want, mag) = reference(&qw, &xf, m);
            for i in 0..m * n {
                let w = want[i] + f64::from(bias[i % n]);
                // One bf16 rounding (2^-9 relative) of a value within the
                // bound of the sums.
                let b = bound(&qw, 1, mag[i]);
                let tol = (w.abs() + b) * 2f64.powi(-8) + b;
                for (name, y) in [("tiles", &got), ("twin", &twin)] {
                    let g = f64::from(bf16_value(y[i]));
                    assert!(
                        (g - w).abs() <= tol,
                        "{name} [{k}x{n}] g{gs} m={m} at {i}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_drivers_take_the_tiles_within_the_bound() {
    for (s, &(k, n, gs)) in SHAPES.iter().enumerate() {
        let qw = weight(k, n, gs, 50 + s as u64);
        for m in [8, 16, 40] {
            let x = acts(m, k, 60 + m as u64);
            let mut y = vec![f32::NAN; m * n];
            qw.try_matmul(&x, m, &mut y).unwrap();
            let (want, mag) = reference(&qw, &x, m);
            for i in 0..m * n {
                let b = bound(&qw, 3, mag[i]);
                assert!(
                    (f64::from(y[i]) - want[i]).abs() <= b,
                    "[{k}x{n}] m={m} at {i}"
                );
            }
            let xb: Vec<u16> = x.iter().map(|&f| bf16_rne(f)).collect();
            let xf: Vec<f32> = xb.iter().map(|&h| bf16_value(h)).collect();
            let (want, mag) = reference(&qw, &xf, m);
            let mut yb = vec![0u16; m * n];
            qw.view().matmul_bf16(&xb, m, None, &mut yb).unwrap();
            for i in 0..m * n {
                let b = bound(&qw, 3, mag[i]);
                let tol = (want[i].abs() + b) * 2f64.powi(-8) + b;
                let g = f64::from(bf16_value(yb[i]));
                assert!(
                    (g - want[i]).abs() <= tol,
                    "bf16 [{k}x{n}] m={m} at {i}: {g} vs {}",
                    want[i]
                );
            }
        }
    }
}

#[test]
fn non_finite_and_huge_inputs_take_the_float32_kernels() {
    let (k, n, m) = (64, 40, 32);
    let qw = weight(k, n, 32, 3);
    let mut x = acts(m, k, 4);
    x[5] = f32::INFINITY;
    x[k + 2] = f32::NAN;
    let mut y = vec![0f32; m * n];
    qw.try_matmul(&x, m, &mut y).unwrap();
    let mut fma = vec![0f32; m * n];
    qw.matmul_with(&x, m, &mut fma, crate::simd::level(), true)
        .unwrap();
    let same = |a: f32, b: f32| a == b || (a.is_nan() && b.is_nan());
    assert!(y.iter().zip(&fma).all(|(&a, &b)| same(a, b)));
    assert!(y[0].is_nan() || y[0].is_infinite());
    // 2^120 is past the tile GEMM's range: the float32 kernels (with their
    // range scaling) give the finite result.
    let mut xb: Vec<u16> = acts(m, k, 6).iter().map(|&f| bf16_rne(f)).collect();
    xb[1] = bf16_rne(2f32.powi(120));
    let mut yb = vec![0u16; m * n];
    qw.view().matmul_bf16(&xb, m, None, &mut yb).unwrap();
    let xf: Vec<f32> = xb.iter().map(|&h| bf16_value(h)).collect();
    let mut yf = vec![0f32; m * n];
    qw.try_matmul(&xf, m, &mut yf).unwrap();
    for (a, b) in yb.iter().zip(&yf) {
        assert_eq!(*a, bf16_rne(*b));
    }
    let mut short = vec![0u16; 3];
    assert!(qw.view().matmul_bf16(&xb, m, None, &mut short).is_err());
    assert!(qw
        .view()
        .matmul_bf16(&xb, m, Some(&[1.0]), &mut yb)
        .is_err());
}
