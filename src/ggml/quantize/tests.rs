//! The quantizers against facts that do not need llama.cpp: ggml's
//! rounding helper, the earlier plain quantizers of the types whose
//! reference quantizer is the same formula, error bounds of the decoded
//! weight, and what importance does. Byte equality with llama.cpp and
//! gguf-py is checked from Python (tests/python/test_gguf_quantize.py,
//! benches/check_gguf_quantize.py).

use super::legacy::{min_max, round_half_away, signed_max, trunc_code};
use super::search::{nearest_int, symmetric, GROUP_MAX_EPS};
use super::*;
use crate::testutil::xorshift_f32;

fn decode<T: GgmlType>(bytes: &[u8]) -> Vec<f32> {
    let mut out = vec![0f32; bytes.len() / T::BYTES * T::ELEMS];
    for (b, o) in bytes
        .chunks_exact(T::BYTES)
        .zip(out.chunks_exact_mut(T::ELEMS))
    {
        T::dequantize_block(b, o);
    }
    out
}

/// Sum of `imp_i (x_i - y_i)^2` in f64 over rows of `imp.len()`.
fn weighted_sse(x: &[f32], y: &[f32], imp: &[f32]) -> f64 {
    x.iter()
        .zip(y)
        .enumerate()
        .map(|(i, (&a, &b))| f64::from(imp[i % imp.len()]) * (f64::from(a) - f64::from(b)).powi(2))
        .sum()
}

#[test]
fn nearest_int_rounds_half_to_even() {
    let cases = [
        (0.5, 0),
        (1.5, 2),
        (2.5, 2),
        (-0.5, 0),
        (-1.5, -2),
        (3.49, 3),
        (-7.51, -8),
    ];
    for (v, want) in cases {
        assert_eq!(nearest_int(v), want, "{v}");
    }
}

#[test]
fn vector_friendly_roundings_equal_the_plain_ones() {
    // Every tie and its neighbours over the Q8_0 code range, then a dense
    // sweep of both ranges.
    let mut vs: Vec<f32> = (-256..=256)
        .flat_map(|k| {
            let t = k as f32 * 0.5;
            [t, t.next_down(), t.next_up()]
        })
        .collect();
    vs.extend(xorshift_f32(1, 4096, 127.0));
    for &v in &vs {
        let v = v.clamp(-128.0, 128.0);
        assert_eq!(round_half_away(v), v.round() as i32, "{v}");
        let t = (v.abs() * 2.0).min(255.0);
        assert_eq!(trunc_code(t, 255.0), t as i32, "{t}");
        assert_eq!(trunc_code(t, 15.0), (t as i32).min(15), "{t}");
        assert_eq!(
            trunc_code(t * 0.125, 31.0),
            ((t * 0.125) as i32).min(31),
            "{t}"
        );
    }
    // Out of range and NaN only clamp (soundness, not a code).
    assert_eq!(round_half_away(f32::NAN), -128);
    assert_eq!(round_half_away(1e30), 128);
    assert_eq!(trunc_code(f32::NAN, 15.0), 15);
    assert_eq!(
        (trunc_code(3.0, f32::NAN), trunc_code(3e9, f32::INFINITY)),
        (255, 255)
    );
    assert_eq!((trunc_code(-3.0, 15.0), trunc_code(1e30, 15.0)), (0, 15));
}

/// ggml's block loops: `amax < |v|` from `(0, 0)`; strict `<` / `>` from
/// `(FLT_MAX, -FLT_MAX)`.
fn ggml_signed_max(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            (amax, max) = (v.abs(), v);
        }
    }
    max
}

fn ggml_min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

#[test]
fn block_extremes_are_ggml_s_to_the_sign_of_zero() {
    let mut blocks: Vec<Vec<f32>> = (0..64).map(|s| xorshift_f32(s, 32, 2.0)).collect();
    // Zeros of both signs where they decide the bits: all zeros in each
    // sign order, zeros as the minimum or maximum, ties of magnitude.
    for pattern in 0u32..40 {
        let mut b: Vec<f32> = (0..32)
            .map(|j| {
                if (pattern >> (j % 5)) & 1 == 1 {
                    -0.0
                } else {
                    0.0
                }
            })
            .collect();
        if pattern >= 32 {
            b[(pattern as usize * 7) % 32] = if pattern % 2 == 0 { 1.5 } else { -1.5 };
        }
        blocks.push(b.iter().map(|v| -v).collect());
        blocks.push(b);
    }
    let mut ties = xorshift_f32(99, 32, 1.0);
    (ties[3], ties[20], ties[27]) = (-4.0, 4.0, -4.0);
    blocks.push(ties);
    for b in &blocks {
        let ((lo, hi), (glo, ghi)) = (min_max(b), ggml_min_max(b));
        assert_eq!(
            (lo.to_bits(), hi.to_bits()),
            (glo.to_bits(), ghi.to_bits()),
            "{b:?}"
        );
        assert_eq!(
            signed_max(b).to_bits(),
            ggml_signed_max(b).to_bits(),
            "{b:?}"
        );
    }
}

/// ggml's `make_qx_quants(n, nmax, x, L, rmse_type = 1, qw)` as its C
/// source runs it: one grid after another, codes rewritten at every
/// improvement. The reference of [`symmetric`], which runs the grids side
/// by side.
fn ggml_make_qx_quants(x: &[f32], nmax: i32, qw: Option<&[f32]>, codes: &mut [u8]) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            (amax, max) = (v.abs(), v);
        }
    }
    if amax < GROUP_MAX_EPS {
        codes.fill(0);
        return 0.0;
    }
    let weight = |i: usize| qw.map_or(x[i] * x[i], |q| q[i]);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for (i, &v) in x.iter().enumerate() {
            let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
            sumlx += weight(i) * v * l as f32;
            suml2 += weight(i) * l as f32 * l as f32;
        }
        (sumlx, suml2)
    };
    let assign = |iscale: f32, codes: &mut [u8]| {
        for (c, &v) in codes.iter_mut().zip(x) {
            *c = (nmax + nearest_int(iscale * v).clamp(-nmax, nmax - 1)) as u8;
        }
    };
    let iscale = -nmax as f32 / max;
    assign(iscale, codes);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            assign(iscale, codes);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Groups where the grids' choice is close or degenerate: random of
/// several spreads, ties of magnitude, one outlier, a single non-zero,
/// zeros of both signs, constant, values on the grid, tiny and huge.
fn symmetric_cases(n: usize) -> Vec<Vec<f32>> {
    let mut cases: Vec<Vec<f32>> = (0..300)
        .map(|s| {
            let scale = [1.0, 1e-3, 300.0, 65504.0][s as usize % 4];
            xorshift_f32(1000 + s, n, scale)
        })
        .collect();
    let base = xorshift_f32(5, n, 1.0);
    let mut push = |f: &dyn Fn(usize, f32) -> f32| {
        cases.push(base.iter().enumerate().map(|(j, &v)| f(j, v)).collect())
    };
    push(&|_, _| 0.0);
    push(&|j, _| if j % 3 == 0 { -0.0 } else { 0.0 });
    push(&|j, _| if j == 7 { -2.5 } else { 0.0 });
    push(&|j, v| if j == 3 { 1e4 } else { v });
    push(&|j, v| {
        if j == 1 || j == 9 {
            -4.0
        } else if j == 5 {
            4.0
        } else {
            v
        }
    });
    push(&|_, _| 0.7);
    push(&|j, _| (j % 17) as f32 - 8.0);
    push(&|j, _| ((j * 5) % 32) as f32 * 0.25 - 4.0);
    push(&|_, v| v * 1e-14);
    push(&|_, v| v.abs());
    push(&|_, v| -v.abs());
    push(&|j, v| if j % 2 == 0 { 0.0 } else { v });
    cases
}

#[test]
fn symmetric_search_is_ggml_s_grid_by_grid() {
    // Q4_0 / Q5_0 (32 inputs, nmax 8 / 16) and Q6_K (16 inputs, nmax 32),
    // weighted by x^2 and by several importances (zeros included).
    for (n, nmax) in [(32, 8), (32, 16), (16, 32)] {
        let weights: Vec<Option<Vec<f32>>> = vec![
            None,
            Some(vec![1.0; n]),
            Some(
                xorshift_f32(77, n, 1.0)
                    .iter()
                    .map(|v| v * v * 10.0)
                    .collect(),
            ),
            Some(
                (0..n)
                    .map(|j| if j % 4 == 0 { 0.0 } else { 1.0 + j as f32 })
                    .collect(),
            ),
            Some(vec![0.0; n]),
        ];
        for x in symmetric_cases(n) {
            for qw in &weights {
                let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
                let da = symmetric(&x, nmax, qw.as_deref(), &mut a);
                let db = ggml_make_qx_quants(&x, nmax, qw.as_deref(), &mut b);
                assert_eq!(
                    (da.to_bits(), &a),
                    (db.to_bits(), &b),
                    "nmax {nmax} x {x:?} qw {qw:?}"
                );
            }
        }
    }
}

/// ggml's reference Q4_0 / Q5_0 / Q8_0 are the formulas the earlier plain
/// quantizers (`GgmlType::quantize_block`) already wrote.
fn same_as_plain<T: QuantizeRow>() {
    let x = xorshift_f32(7, 64 * 32, 3.0);
    let ours = quantize_matrix::<T>(&x, 64, 32, None).unwrap();
    let mut plain = vec![0u8; 64 * T::BYTES];
    for (xb, b) in x.chunks_exact(32).zip(plain.chunks_exact_mut(T::BYTES)) {
        T::quantize_block(xb, b);
    }
    assert_eq!(ours, plain, "{}", T::NAME);
}

#[test]
fn symmetric_legacy_types_equal_the_plain_quantizers() {
    same_as_plain::<Q4_0>();
    same_as_plain::<Q5_0>();
    same_as_plain::<Q8_0>();
}

/// Every weight within `bound(block)` of its decoded value.
fn within_step<T: QuantizeRow>(steps: f32) {
    let (rows, cols) = (6, 512);
    let mut x = xorshift_f32(11, rows * cols, 2.0);
    x[5] = 40.0; // one outlier
    x[cols..2 * cols].fill(0.0); // an all-zero row
    let y = decode::<T>(&quantize_matrix::<T>(&x, rows, cols, None).unwrap());
    for (xb, yb) in x.chunks_exact(T::ELEMS).zip(y.chunks_exact(T::ELEMS)) {
        let lo = xb.iter().fold(0f32, |m, &v| m.min(v));
        let hi = xb.iter().fold(0f32, |m, &v| m.max(v));
        let bound = (hi - lo) / steps * 1.01 + 1e-6;
        for (a, b) in xb.iter().zip(yb) {
            assert!(
                (a - b).abs() <= bound,
                "{}: {a} vs {b} (bound {bound})",
                T::NAME
            );
        }
    }
}

#[test]
fn decoded_weights_are_within_a_few_steps() {
    // Legacy: half a step of the block's range, a full step for the
    // symmetric types' clamped top code.
    within_step::<Q4_0>(7.5);
    within_step::<Q5_0>(15.5);
    within_step::<Q8_0>(127.0);
    within_step::<Q4_1>(14.0);
    within_step::<Q5_1>(30.0);
    // The k-quants' 6-bit scales round the steps: looser, still a
    // fraction of the super-block's range.
    within_step::<Q4K>(6.0);
    within_step::<Q5K>(12.0);
    within_step::<Q6K>(24.0);
}

/// The search is no worse than the plain round-to-nearest of the same
/// block structure (`GgmlType::quantize_block`), in squared error over a
/// matrix.
fn beats_plain<T: QuantizeRow>() {
    let (rows, cols) = (32, 512);
    let x = xorshift_f32(3, rows * cols, 1.0);
    let ours = decode::<T>(&quantize_matrix::<T>(&x, rows, cols, None).unwrap());
    let mut plain = vec![0u8; rows * cols / T::ELEMS * T::BYTES];
    for (xb, b) in x
        .chunks_exact(T::ELEMS)
        .zip(plain.chunks_exact_mut(T::BYTES))
    {
        T::quantize_block(xb, b);
    }
    let plain = decode::<T>(&plain);
    let (a, b) = (
        weighted_sse(&x, &ours, &[1.0]),
        weighted_sse(&x, &plain, &[1.0]),
    );
    assert!(a <= b, "{}: search {a} vs plain {b}", T::NAME);
}

#[test]
fn k_quants_are_no_worse_than_round_to_nearest() {
    beats_plain::<Q4K>();
    beats_plain::<Q5K>();
    beats_plain::<Q6K>();
}

/// Importance on the first half of the inputs moves the error there down
/// (and is not ignored).
fn importance_shifts_error<T: QuantizeRow>() {
    let (rows, cols) = (16, 512);
    let x = xorshift_f32(5, rows * cols, 1.0);
    let imp: Vec<f32> = (0..cols)
        .map(|i| if i % 64 < 32 { 100.0 } else { 0.01 })
        .collect();
    let heavy: Vec<f32> = imp
        .iter()
        .map(|&v| if v > 1.0 { 1.0 } else { 0.0 })
        .collect();
    let plain = decode::<T>(&quantize_matrix::<T>(&x, rows, cols, None).unwrap());
    let with = decode::<T>(&quantize_matrix::<T>(&x, rows, cols, Some(&imp)).unwrap());
    let (a, b) = (
        weighted_sse(&x, &with, &heavy),
        weighted_sse(&x, &plain, &heavy),
    );
    assert!(a < b, "{}: weighted {a} vs plain {b}", T::NAME);
}

#[test]
fn importance_lowers_the_error_of_heavy_inputs() {
    importance_shifts_error::<Q4_0>();
    importance_shifts_error::<Q5_1>();
    importance_shifts_error::<Q4K>();
    importance_shifts_error::<Q5K>();
    importance_shifts_error::<Q6K>();
}

#[test]
fn zero_importance_super_block_keeps_finite_scales() {
    let x = xorshift_f32(9, 512, 1.0);
    let mut imp = vec![1.0f32; 512];
    imp[..256].fill(0.0);
    let b = quantize_matrix::<Q4K>(&x, 1, 512, Some(&imp)).unwrap();
    assert!(crate::ggml::bad_scale::<Q4K>(&b).is_none());
    let plain = quantize_matrix::<Q4K>(&x[..256], 1, 256, None).unwrap();
    assert_eq!(
        &b[..144],
        &plain[..],
        "falls back to the reference quantizer"
    );
}

#[test]
fn bad_input_is_an_error() {
    let x = vec![0.5f32; 2 * 256];
    assert!(quantize_matrix::<Q4K>(&x[..2 * 128], 2, 128, None).is_err());
    assert!(quantize_matrix::<Q4_0>(&x, 0, 256, None).is_err());
    let mut nan = x.clone();
    nan[3] = f32::NAN;
    assert!(quantize_matrix::<Q8_0>(&nan, 2, 256, None).is_err());
    assert!(quantize_matrix::<Q6K>(&x, 2, 256, Some(&[1.0; 255])).is_err());
    assert!(quantize_matrix::<Q6K>(&x, 2, 256, Some(&[-1.0; 256])).is_err());
}

/// `w`'s values are checked row by row inside the parallel loop: the error
/// names the first bad value of the lowest bad row (`w[r, c]`, with the
/// half bound) on any number of threads, and the largest half passes.
#[test]
fn a_bad_value_names_the_lowest_row_on_any_thread_count() {
    let (rows, cols) = (256, 64);
    let mut w = xorshift_f32(7, rows * cols, 1.0);
    w[3 * cols + 1] = 65504.0;
    w[4 * cols + 2] = -65504.0;
    assert!(quantize_matrix::<Q4_1>(&w, rows, cols, None).is_ok());
    w[200 * cols + 9] = f32::NAN;
    w[37 * cols + 40] = 65520.0;
    w[37 * cols + 41] = f32::INFINITY;
    w[90 * cols] = f32::NEG_INFINITY;
    for threads in [1, 2, 4, 8] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let e = pool
            .install(|| quantize_matrix::<Q4_0>(&w, rows, cols, None))
            .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("w[37, 40] is 65520.0"), "{threads}: {msg}");
        assert!(msg.contains("|w| <= 65504"), "{msg}");
    }
    // A bad importance is named before any row is quantized.
    let e = quantize_matrix::<Q4_1>(&w, rows, cols, Some(&[-1.0; 64])).unwrap_err();
    assert!(e.to_string().contains("importance[0]"), "{e}");
}

/// A row's bytes are its blocks' bytes one block at a time, whatever the
/// row's length: the plain legacy quantizers group blocks (four at a time
/// for Q4_0 / Q5_0, with one-block leftovers) and check and quantize a row
/// a piece (`PIECE` floats) at a time.
fn rows_are_their_blocks<T: QuantizeRow>() {
    for cols in [32, 96, 160, 1024, 1056, 2080, 3104] {
        let rows = 3;
        let mut x = xorshift_f32(cols as u64, rows * cols, 2.0);
        x[cols + 40] = 0.0;
        x[2 * cols..2 * cols + 32].fill(-0.0);
        let whole = quantize_matrix::<T>(&x, rows, cols, None).unwrap();
        let one_by_one: Vec<u8> = x
            .chunks_exact(32)
            .flat_map(|b| quantize_matrix::<T>(b, 1, 32, None).unwrap())
            .collect();
        assert_eq!(whole, one_by_one, "{} {cols}", T::NAME);
    }
}

#[test]
fn plain_rows_equal_their_blocks_one_at_a_time() {
    rows_are_their_blocks::<Q4_0>();
    rows_are_their_blocks::<Q5_0>();
    rows_are_their_blocks::<Q4_1>();
    rows_are_their_blocks::<Q5_1>();
    rows_are_their_blocks::<Q8_0>();
}
