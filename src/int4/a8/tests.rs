//! Tests of the int8-activation path: the quantizer's codes, the kernels
//! against a column-by-column reference of the same formula (bit for bit),
//! the stated error bound against the float64 product, and determinism.

use super::super::*;
#[cfg(target_arch = "x86_64")]
use super::avx2::eligible;
use super::xq8::Xq8;
use crate::simd::{available_levels, SimdLevel};
use crate::testutil::{on_one_thread, rand_vec};

/// The documented formula, one column at a time, straight from `code()`:
/// `y = y + (acc as f32) * (scale_w * d)` per group in order.
fn formula(qw: &QuantizedWeight, x: &[f32], batch: usize) -> Vec<f32> {
    formula_blocks(qw, x, batch, qw.num_groups)
}

/// [`formula`] summed in blocks of `per_block` groups, the blocks' partial
/// sums then added in order (the driver's split of large calls).
fn formula_blocks(qw: &QuantizedWeight, x: &[f32], batch: usize, per_block: usize) -> Vec<f32> {
    let (k, n, gs) = (qw.in_feat, qw.out_feat, qw.group_size());
    let xq = Xq8::quantize(x, batch, k, qw.in_padded(), gs, None).unwrap();
    let mut y = vec![0.0f32; batch * n];
    for b in 0..batch {
        for o in 0..n {
            let (mut yo, mut part) = (0.0f32, 0.0f32);
            for g in 0..qw.num_groups {
                let acc: i64 = (g * gs..(g + 1) * gs)
                    .map(|i| qw.code(i, o) as i64 * xq.row(b)[i] as i64)
                    .sum();
                let t = qw.scales[g * n + o] * xq.d[b * qw.num_groups + g];
                part += acc as f32 * t;
                if (g + 1) % per_block == 0 || g + 1 == qw.num_groups {
                    yo = if g < per_block { part } else { yo + part };
                    part = 0.0;
                }
            }
            y[b * n + o] = yo;
        }
    }
    y
}

/// `|y - x @ W| <= sum_g d[g] / 2 * sum_{i in g} |w_io|` plus the float
/// term `1e-5 * sum_i |x_i w_io| + 1e-6`, against float64.
fn assert_within_a8_bound(qw: &QuantizedWeight, x: &[f32], batch: usize, y: &[f32], what: &str) {
    let (k, n, gs) = (qw.in_feat, qw.out_feat, qw.group_size());
    let w = qw.dequantize();
    let xq = Xq8::quantize(x, batch, k, qw.in_padded(), gs, None).unwrap();
    for b in 0..batch {
        for o in 0..n {
            let (mut exact, mut mag, mut quant) = (0.0f64, 0.0f64, 0.0f64);
            for i in 0..k {
                let (xv, wv) = (x[b * k + i] as f64, w[i * n + o] as f64);
                exact += xv * wv;
                mag += (xv * wv).abs();
                quant += xq.d[b * qw.num_groups + i / gs] as f64 / 2.0 * wv.abs();
            }
            let err = (y[b * n + o] as f64 - exact).abs();
            let bound = quant + 1e-5 * mag + 1e-6;
            assert!(
                err <= bound,
                "{what}: y[{b}, {o}] = {} vs {exact} (bound {bound})",
                y[b * n + o]
            );
        }
    }
}

/// The x86 levels this machine has (the A8 kernels are x86 only).
pub(super) fn levels() -> Vec<SimdLevel> {
    available_levels()
        .into_iter()
        .filter(|l| *l != SimdLevel::Neon)
        .collect()
}

#[test]
fn activation_codes_round_half_even_per_group() {
    // Group 0: absmax 127 -> d = 1; 63.5 -> 64 and 2.5 -> 2 (ties to even),
    // -0.5 -> 0. Group 1: absmax 2.54 -> d = 2.54 / 127 (f32), -1 -> -50,
    // 1e-3 -> 0.
    let x = [127.0, 63.5, -0.5, 2.5, 2.54, -1.0, 0.0, 1e-3];
    let xq = Xq8::quantize(&x, 1, 8, 8, 4, None).unwrap();
    assert_eq!(xq.d[0], 1.0);
    assert_eq!(&xq.q[..4], &[127, 64, 0, 2]);
    assert_eq!(xq.sums[0], 127 + 64 + 2);
    let d1 = 2.54f32 / 127.0;
    assert_eq!(xq.d[1], d1);
    let expect: Vec<i8> = x[4..]
        .iter()
        .map(|v| (v / d1).round_ties_even() as i8)
        .collect();
    assert_eq!(&xq.q[4..], &expect[..]);
    assert_eq!(&xq.q[4..], &[127, -50, 0, 0]);
    // A group whose scale would be subnormal is all zero with d = 0.
    let xq = Xq8::quantize(&[1e-40, -1e-41], 1, 2, 2, 2, None).unwrap();
    assert_eq!((xq.d[0], &xq.q[..]), (0.0, &[0i8, 0][..]));
    // Non-finite x has no code.
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let e = Xq8::quantize(&[1.0, bad], 1, 2, 2, 2, None).unwrap_err();
        assert!(e.to_string().contains("non-finite"), "{e}");
    }
}

#[test]
fn kernels_match_the_formula_bit_for_bit() {
    // Tails short of a strip (n % 32), group sizes the AVX2 kernel takes
    // (16, 32, 64, 128) and ones it leaves to the scalar twin (2, 6, 8, 40),
    // padded inputs, batches across the 4-row passes.
    let shapes = [
        (64, 32, 32),
        (100, 70, 32),
        (33, 45, 16),
        (256, 96, 64),
        (256, 33, 128),
        (20, 40, 8),
        (9, 37, 6),
        (80, 64, 40),
        (4, 3, 2),
    ];
    for (s, &(k, n, gs)) in shapes.iter().enumerate() {
        let qw = QuantizedWeight::quantize_grouped(&rand_vec(k * n, s as u64), k, n, gs).unwrap();
        for batch in [1, 2, 3, 5, 9] {
            let x = rand_vec(batch * k, 100 + s as u64);
            let want = formula(&qw, &x, batch);
            for level in levels() {
                let mut y = vec![f32::NAN; batch * n];
                qw.view().matmul_a8_with(&x, batch, &mut y, level).unwrap();
                let what = format!(
                    "{} [{k}x{n}] gs {} b {batch}",
                    level.name(),
                    qw.group_size()
                );
                assert_eq!(
                    y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{what}"
                );
                assert_within_a8_bound(&qw, &x, batch, &y, &what);
            }
        }
    }
    assert!(eligible(32) && eligible(16) && eligible(128));
    assert!(!eligible(8) && !eligible(40) && !eligible(2));
}

#[test]
fn bound_holds_on_mixed_magnitudes_and_the_error_is_real() {
    // Groups of very different magnitude in one row: each has its own d.
    let (k, n) = (256, 64);
    let qw = QuantizedWeight::try_quantize(&rand_vec(k * n, 5), k, n).unwrap();
    let mut x = rand_vec(2 * k, 6);
    for (i, v) in x.iter_mut().enumerate() {
        *v *= [1e-20f32, 1.0, 1e20, 3e-3][(i / 32) % 4];
    }
    for level in levels() {
        let mut y = vec![0.0f32; 2 * n];
        qw.view().matmul_a8_with(&x, 2, &mut y, level).unwrap();
        assert_within_a8_bound(&qw, &x, 2, &y, level.name());
        // The activation rounding shows: not the float32 path's result.
        let mut yf = vec![0.0f32; 2 * n];
        qw.try_matmul(&x, 2, &mut yf).unwrap();
        assert_ne!(y, yf, "{}", level.name());
    }
}

#[test]
fn large_calls_do_not_depend_on_the_thread_count() {
    // Above PAR_MIN_WEIGHTS: up to 4 rows split in K_BLOCKS blocks of
    // groups (the partial sums added in block order), more in column chunks
    // and row blocks of 16.
    // Groups of 128 at an odd width: the per-row strips walk each group in
    // slabs of 16 pairs, the tail columns in the scalar twin.
    let cases = [
        (1024, 1000, 32, &[1, 4, 5, 17, 40][..]),
        (2048, 1003, 128, &[1, 3][..]),
    ];
    for &(k, n, gs, batches) in &cases {
        large_call_checks(k, n, gs, batches);
    }
}

fn large_call_checks(k: usize, n: usize, gs: usize, batches: &[usize]) {
    let qw = QuantizedWeight::quantize_grouped(&rand_vec(k * n, 7), k, n, gs).unwrap();
    for &batch in batches {
        let x = rand_vec(batch * k, 8 + batch as u64);
        let mut y = vec![f32::NAN; batch * n];
        qw.view()
            .matmul_act(&x, batch, &mut y, Activations::Int8)
            .unwrap();
        let per_block = if batch <= 4 {
            qw.num_groups.div_ceil(super::K_BLOCKS)
        } else {
            qw.num_groups
        };
        let what = format!("[{k}x{n}] gs {gs} b {batch}");
        assert_eq!(y, formula_blocks(&qw, &x, batch, per_block), "{what}");
        assert_within_a8_bound(&qw, &x, batch, &y, &what);
        let mut y1 = vec![f32::NAN; batch * n];
        on_one_thread(|| qw.view().matmul_act(&x, batch, &mut y1, Activations::Int8)).unwrap();
        assert_eq!(y, y1, "{what}: one thread vs the pool");
    }
}

#[test]
fn bad_inputs_are_errors() {
    let qw = QuantizedWeight::try_quantize(&rand_vec(64 * 8, 1), 64, 8).unwrap();
    let mut x = rand_vec(64, 2);
    let mut y = vec![0.0f32; 8];
    x[10] = f32::NAN;
    let e = qw
        .view()
        .matmul_act(&x, 1, &mut y, Activations::Int8)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("x: non-finite value NaN at index [0, 10]"),
        "{e}"
    );
    assert!(qw
        .view()
        .matmul_a8_with(&x[..63], 1, &mut y, SimdLevel::Scalar)
        .is_err());
    let e = Activations::parse("fp16").unwrap_err().to_string();
    assert!(
        e.contains("activations") && e.contains("'float32' or 'int8'"),
        "{e}"
    );
    assert_eq!(Activations::parse("int8").unwrap(), Activations::Int8);
    assert_eq!(Activations::parse("float32").unwrap(), Activations::Float32);
    if !available_levels().contains(&SimdLevel::Avx512) {
        let x = rand_vec(64, 3);
        assert!(qw
            .view()
            .matmul_a8_with(&x, 1, &mut y, SimdLevel::Avx512)
            .is_err());
    }
    // Batch 0 is empty, not an error.
    assert!(qw
        .view()
        .matmul_a8_with(&[], 0, &mut [], SimdLevel::Scalar)
        .is_ok());
}
