// Over 400 lines: the one home of every INT4 path's tests, one helper set.
//! Unit tests of the INT4 format and kernels against plain references.

use super::*;
use crate::simd::{available_levels, SimdLevel};
use crate::testutil::{on_one_thread, rand_vec};
use proptest::prelude::*;

/// Float64 `x @ dequantize(W)`, the accuracy reference, with the bound
/// `sum_i |x_i w_io|` per output.
fn reference(qw: &QuantizedWeight, x: &[f32], batch: usize) -> (Vec<f64>, Vec<f64>) {
    let w = qw.dequantize();
    let (k, n) = (qw.in_feat, qw.out_feat);
    let mut y = vec![0.0f64; batch * n];
    let mut mag = vec![0.0f64; batch * n];
    for b in 0..batch {
        for i in 0..k {
            let xv = x[b * k + i] as f64;
            for o in 0..n {
                let t = xv * w[i * n + o] as f64;
                y[b * n + o] += t;
                mag[b * n + o] += t.abs();
            }
        }
    }
    (y, mag)
}

fn assert_close(qw: &QuantizedWeight, x: &[f32], batch: usize, y: &[f32], what: &str) {
    let (yr, mag) = reference(qw, x, batch);
    for i in 0..y.len() {
        let tol = 1e-5 * mag[i] + 1e-6;
        assert!(
            (y[i] as f64 - yr[i]).abs() <= tol,
            "{what}: y[{i}] = {} vs {} (tol {tol})",
            y[i],
            yr[i]
        );
    }
}

#[test]
fn layout_rules() {
    assert_eq!(Layout::new(64, 32).unwrap().num_groups, 2);
    let l = Layout::new(5, 32).unwrap(); // odd in_feat below the group size
    assert_eq!((l.group_size, l.in_padded, l.num_groups), (6, 6, 1));
    let l = Layout::new(100, 32).unwrap();
    assert_eq!((l.group_size, l.in_padded, l.num_groups), (32, 128, 4));
    assert!(Layout::new(0, 32).is_err());
    assert!(Layout::new(8, 3).is_err());
    assert!(Layout::new(8, 0).is_err());
}

#[test]
fn known_values_and_ties_to_even() {
    // One group of 2 rows, 3 outputs. Column 0: absmax 7 -> scale 1, and
    // 2.5 rounds to 2 (ties to even, the original rounded to 3).
    // Column 1: absmax 3.5 -> scale 0.5, -1.25 / 0.5 = -2.5 -> -2.
    // Column 2: all zero -> scale 1e-8, codes 0.
    let w = [7.0, 3.5, 0.0, 2.5, -1.25, 0.0];
    let qw = QuantizedWeight::try_quantize(&w, 2, 3).unwrap();
    assert_eq!(qw.scales, vec![1.0, 0.5, MIN_SCALE]);
    assert_eq!((qw.code(0, 0), qw.code(1, 0)), (7, 2));
    assert_eq!((qw.code(0, 1), qw.code(1, 1)), (7, -2));
    assert_eq!(qw.data, vec![0x27, 0xE7, 0x00]);
    assert_eq!(qw.dequantize(), vec![7.0, 3.5, 0.0, 2.0, -1.0, 0.0]);
}

#[test]
fn odd_in_feat_keeps_last_row() {
    let w: Vec<f32> = (0..5).map(|i| i as f32 - 2.0).collect(); // [5, 1]
    let qw = QuantizedWeight::try_quantize(&w, 5, 1).unwrap();
    assert_eq!(qw.num_groups, 1);
    assert_eq!(qw.group_size(), 6);
    let d = qw.dequantize();
    assert_eq!(d.len(), 5);
    assert!((d[4] - 2.0).abs() < 0.2, "last row lost: {d:?}");
}

#[test]
fn bad_inputs_are_errors() {
    assert!(matches!(
        QuantizedWeight::try_quantize(&[], 0, 4),
        Err(QuantError::DimensionMismatch { .. })
    ));
    assert!(QuantizedWeight::try_quantize(&[1.0; 6], 2, 4).is_err());
    let mut w = vec![0.5f32; 8];
    w[5] = f32::NAN;
    let e = QuantizedWeight::try_quantize(&w, 4, 2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("[2, 1]") && e.contains("flat 5"), "{e}");
    w[5] = f32::INFINITY;
    assert!(QuantizedWeight::try_quantize(&w, 4, 2).is_err());
    let qw = QuantizedWeight::try_quantize(&[1.0; 8], 4, 2).unwrap();
    let mut y = [0.0f32; 3];
    assert!(qw.try_matvec(&[1.0; 4], &mut y).is_err());
    assert!(qw.try_matvec(&[1.0; 3], &mut y[..2]).is_err());
    assert!(qw.try_dequantize_to(&mut [0.0; 7]).is_err());
}

#[test]
fn from_parts_validates() {
    let w = rand_vec(40 * 3, 1);
    let qw = QuantizedWeight::try_quantize(&w, 40, 3).unwrap();
    let ok = QuantizedWeight::from_parts(qw.data.clone(), qw.scales.clone(), 40, 3, qw.num_groups);
    assert_eq!(ok.unwrap(), qw);
    let bad =
        |d: Vec<u8>, s: Vec<f32>, i, o, g| QuantizedWeight::from_parts(d, s, i, o, g).is_err();
    assert!(bad(qw.data.clone(), qw.scales.clone(), 0, 3, 2));
    assert!(bad(qw.data.clone(), qw.scales.clone(), 40, 0, 2));
    assert!(bad(qw.data.clone(), qw.scales.clone(), 40, 3, 0));
    assert!(bad(qw.data[1..].to_vec(), qw.scales.clone(), 40, 3, 2));
    assert!(bad(qw.data.clone(), qw.scales[1..].to_vec(), 40, 3, 2));
    assert!(bad(qw.data.clone(), qw.scales.clone(), 40, 3, 3));
    let mut s = qw.scales.clone();
    s[0] = f32::NAN;
    assert!(bad(qw.data.clone(), s.clone(), 40, 3, 2));
    s[0] = f32::INFINITY;
    assert!(bad(qw.data.clone(), s.clone(), 40, 3, 2));
    // zero and negative scales are valid (imported GGUF Q4_0 has both)
    s[0] = 0.0;
    s[1] = -0.5;
    assert!(!bad(qw.data.clone(), s, 40, 3, 2));
}

#[test]
fn serde_round_trip_and_corruption() {
    let w = rand_vec(70 * 9, 2);
    let qw = QuantizedWeight::quantize_grouped(&w, 70, 9, 16).unwrap();
    let bytes = qw.to_safetensors_bytes().unwrap();
    assert_eq!(QuantizedWeight::from_safetensors_bytes(&bytes).unwrap(), qw);
    for cut in [0, 7, 8, 20, bytes.len() - 1] {
        assert!(QuantizedWeight::from_safetensors_bytes(&bytes[..cut]).is_err());
    }
    let mut flipped = bytes.clone();
    flipped[12] ^= 0xFF;
    assert!(QuantizedWeight::from_safetensors_bytes(&flipped).is_err());
}

fn check_all_paths(in_feat: usize, out_feat: usize, gs: usize, batch: usize, seed: u64) {
    let w = rand_vec(in_feat * out_feat, seed);
    let x = rand_vec(batch * in_feat, seed + 1);
    let qw = QuantizedWeight::quantize_grouped(&w, in_feat, out_feat, gs).unwrap();
    let mut y_ref = vec![0.0f32; batch * out_feat];
    qw.matmul_with(&x, batch, &mut y_ref, SimdLevel::Scalar, false)
        .unwrap();
    assert_close(&qw, &x, batch, &y_ref, "scalar matvec");
    for level in available_levels() {
        for use_gemm in [false, true] {
            let mut y = vec![f32::NAN; batch * out_feat];
            qw.matmul_with(&x, batch, &mut y, level, use_gemm).unwrap();
            let what =
                format!("{level:?} gemm={use_gemm} [{in_feat}x{out_feat}] gs {gs} b {batch}");
            assert_close(&qw, &x, batch, &y, &what);
            // Tight agreement with the scalar kernel.
            for (a, b) in y.iter().zip(&y_ref) {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{what}: {a} vs {b}"
                );
            }
        }
    }
    check_matvec_kernels(&qw, &x, batch, &format!("[{in_feat}x{out_feat}] gs {gs}"));
}

/// Every matvec kernel the machine has, row by row, against the bound.
fn check_matvec_kernels(qw: &QuantizedWeight, x: &[f32], batch: usize, what: &str) {
    for kernel in MatvecKernel::available() {
        let mut y = vec![f32::NAN; batch * qw.out_feat];
        for (xr, yr) in x
            .chunks_exact(qw.in_feat)
            .zip(y.chunks_exact_mut(qw.out_feat))
        {
            qw.matvec_with(xr, yr, kernel).unwrap();
        }
        assert_close(qw, x, batch, &y, &format!("{} {what}", kernel.name()));
    }
}

/// `x` whose groups are all zero, partly zero, of wide dynamic range, huge
/// (1e20) or tiny (1e-20): the kernels' per-group scaling must hold for all.
fn mixed_range_x(k: usize, seed: u64) -> Vec<f32> {
    let base = rand_vec(k, seed);
    base.iter()
        .enumerate()
        .map(|(i, &v)| match (i / 32) % 6 {
            0 => 0.0,
            1 if i % 7 == 0 => v * 1e-6,
            2 => v * 1e20,
            3 => v * 1e-20,
            4 if i % 5 == 0 => 0.0,
            _ => v,
        })
        .collect()
}

#[test]
fn matvec_kernels_on_mixed_range_inputs() {
    for (i, &(k, n, gs)) in [
        (384, 200, 32),
        (384, 131, 64),
        (200, 64, 4),
        (96, 70, 6),
        (256, 300, 128),
    ]
    .iter()
    .enumerate()
    {
        let qw =
            QuantizedWeight::quantize_grouped(&rand_vec(k * n, 40 + i as u64), k, n, gs).unwrap();
        let x = mixed_range_x(k, 50 + i as u64);
        check_matvec_kernels(&qw, &x, 1, &format!("mixed [{k}x{n}] gs {gs}"));
    }
}

/// The VNNI kernel's integer `x` rounds an element by up to 2^-18 of itself
/// when it sits 2^12 below its group's largest (the widest range it takes).
/// Here weights are nonzero only on those small rows, and the small
/// elements are all equal (so their rounding errors all point the same
/// way): the small elements are the whole of `sum |x w|` and their rounding
/// must stay inside the bound. Further below, the group runs the f32 path
/// (a range of 2^16 taken in integer form would break the bound here).
#[test]
fn small_elements_of_an_integer_group_stay_within_the_bound() {
    for &(gs, n) in &[(8usize, 70usize), (24, 200), (32, 131), (128, 64)] {
        let k = 4 * gs;
        for &ratio in &[4096.0f32 * 0.9999, 4096.0 * 1.0001, 65536.0, 1000.0] {
            let x: Vec<f32> = (0..k)
                .map(|i| {
                    if i % gs == 0 {
                        3e4
                    } else {
                        3e4 * 1.234_567_8 / ratio
                    }
                })
                .collect();
            let w: Vec<f32> = (0..k * n)
                .map(|i| if (i / n) % gs == 0 { 0.0 } else { 5.0 })
                .collect();
            let qw = QuantizedWeight::quantize_grouped(&w, k, n, gs).unwrap();
            check_matvec_kernels(&qw, &x, 1, &format!("small elements gs {gs} ratio {ratio}"));
        }
    }
}

#[test]
fn matvec_kernels_propagate_non_finite_x() {
    let (k, n) = (128, 80);
    let qw = QuantizedWeight::try_quantize(&rand_vec(k * n, 61), k, n).unwrap();
    for bad in [f32::NAN, f32::INFINITY] {
        let mut x = rand_vec(k, 62);
        x[40] = bad;
        for kernel in MatvecKernel::available() {
            let mut y = vec![0.0f32; n];
            qw.matvec_with(&x, &mut y, kernel).unwrap();
            // Row 40 times a nonzero code: NaN or +-inf; times a zero code: NaN.
            assert!(y.iter().all(|v| !v.is_finite()), "{}: {y:?}", kernel.name());
        }
    }
}

#[test]
fn simd_paths_match_scalar_on_odd_shapes() {
    let shapes = [
        (1, 1, 32, 1),
        (1, 17, 32, 3),
        (3, 1, 32, 9),
        (31, 15, 32, 2),
        (33, 129, 32, 13),
        (64, 160, 32, 8),
        (100, 257, 16, 12),
        (300, 300, 128, 20),
        (257, 33, 2, 5),
        (512, 300, 64, 1),
    ];
    for (i, &(k, n, gs, b)) in shapes.iter().enumerate() {
        check_all_paths(k, n, gs, b, 100 + i as u64);
    }
}

#[test]
fn matmul_dispatch_uses_both_paths_consistently() {
    let qw = QuantizedWeight::try_quantize(&rand_vec(96 * 70, 5), 96, 70).unwrap();
    for batch in [1, 7, 8, 33] {
        let x = rand_vec(batch * 96, 6);
        let mut y = vec![0.0f32; batch * 70];
        qw.try_matmul(&x, batch, &mut y).unwrap();
        assert_close(&qw, &x, batch, &y, "matmul");
    }
}

/// The multi-row matvec (batches 2 to `ROWS_MAX_BATCH` with the AVX2
/// kernel) against the float64 reference and bound, and, row by row, equal
/// to the single-row AVX2 matvec on matrices small enough that it runs in
/// one piece (both sum each row in the same order); large ones, split into
/// column pieces, must not depend on the thread count.
#[test]
#[cfg(target_arch = "x86_64")]
fn multi_row_matvec_matches_the_single_row_kernel() {
    if crate::simd::Avx2::at(simd::level()).is_none() {
        eprintln!("skipped: AVX2 is not in force here (CPU or QUANTRS_SIMD)");
        return;
    }
    let shapes = [
        (33, 129, 32),
        (100, 257, 16),
        (257, 33, 2),
        (300, 301, 128),
        (7, 23, 32),
    ];
    for (i, &(k, n, gs)) in shapes.iter().enumerate() {
        let qw =
            QuantizedWeight::quantize_grouped(&rand_vec(k * n, 200 + i as u64), k, n, gs).unwrap();
        for batch in [2, 3, 4, 5, 7, 8, 9, 16] {
            let x = mixed_range_x(batch * k, 300 + (i * 17 + batch) as u64);
            let mut y = vec![f32::NAN; batch * n];
            qw.matmul_with(&x, batch, &mut y, SimdLevel::Avx2, false)
                .unwrap();
            let what = format!("rows [{k}x{n}] gs {gs} b {batch}");
            assert_close(&qw, &x, batch, &y, &what);
            for (r, (xr, yr)) in x.chunks_exact(k).zip(y.chunks_exact(n)).enumerate() {
                let mut y1 = vec![f32::NAN; n];
                qw.matvec_with(xr, &mut y1, MatvecKernel::Avx2).unwrap();
                assert_eq!(yr, &y1[..], "{what}: row {r}");
            }
            // The dispatch runs the AVX2 rows kernel only where AVX2 is the
            // level in force; on an AVX-512 CPU it takes the AVX-512 kernels,
            // which sum in another order.
            let dispatches_avx2 =
                MatvecKernel::for_weights(simd::level(), qw.group_size()) == MatvecKernel::Avx2;
            if batch <= ROWS_MAX_BATCH && dispatches_avx2 {
                let mut yd = vec![f32::NAN; batch * n];
                qw.try_matmul(&x, batch, &mut yd).unwrap();
                assert_eq!(yd, y, "{what}: matmul dispatch");
            }
        }
    }
    // Column pieces on every thread: the same as on one.
    let (k, n) = (1024, 1000);
    let qw = QuantizedWeight::try_quantize(&rand_vec(k * n, 7), k, n).unwrap();
    for batch in [2, 4, 7, 16] {
        let x = rand_vec(batch * k, 8 + batch as u64);
        let mut y = vec![f32::NAN; batch * n];
        qw.matmul_with(&x, batch, &mut y, SimdLevel::Avx2, false)
            .unwrap();
        assert_close(&qw, &x, batch, &y, &format!("rows [{k}x{n}] b {batch}"));
        let mut y1 = vec![f32::NAN; batch * n];
        on_one_thread(|| qw.matmul_with(&x, batch, &mut y1, SimdLevel::Avx2, false)).unwrap();
        assert_eq!(y, y1, "b {batch}: one thread vs the pool");
    }
}

#[test]
fn large_parallel_matvec_is_deterministic() {
    // Row blocks in two column pieces (the second shorter), one piece
    // (n < 128), and a group count that K_BLOCKS does not divide.
    for (i, &(k, n)) in [(1024, 1000), (4096, 70), (288, 1000)].iter().enumerate() {
        let qw = QuantizedWeight::try_quantize(&rand_vec(k * n, 9 + i as u64), k, n).unwrap();
        let x = rand_vec(k, 10 + i as u64);
        let mut y1 = vec![f32::NAN; n];
        qw.try_matvec(&x, &mut y1).unwrap();
        let mut y2 = vec![f32::NAN; n];
        on_one_thread(|| qw.try_matvec(&x, &mut y2).unwrap());
        assert_eq!(y1, y2, "[{k}x{n}]");
        assert_close(&qw, &x, 1, &y1, &format!("parallel matvec [{k}x{n}]"));
    }
}

/// The AVX2 matvec against the multi-row kernel, which sums each column in
/// the same order, on groups above 32 and widths with vector and scalar
/// tails, and the same for any thread count.
#[test]
#[cfg(target_arch = "x86_64")]
fn avx2_matvec_on_large_groups_matches_the_rows_kernel() {
    if crate::simd::Avx2::at(simd::level()).is_none() {
        eprintln!("skipped: AVX2 is not in force here (CPU or QUANTRS_SIMD)");
        return;
    }
    for (i, &(k, n, gs)) in [
        (128, 75, 64),
        (384, 131, 128),
        (512, 64, 256),
        (96, 200, 48),
        (2048, 1003, 128),
    ]
    .iter()
    .enumerate()
    {
        let qw =
            QuantizedWeight::quantize_grouped(&rand_vec(k * n, 400 + i as u64), k, n, gs).unwrap();
        let x = mixed_range_x(2 * k, 410 + i as u64);
        let what = format!("[{k}x{n}] gs {gs}");
        let mut rows = vec![f32::NAN; 2 * n];
        qw.matmul_with(&x, 2, &mut rows, SimdLevel::Avx2, false)
            .unwrap();
        let mut y = vec![f32::NAN; n];
        qw.matvec_with(&x[..k], &mut y, MatvecKernel::Avx2).unwrap();
        assert_close(&qw, &x[..k], 1, &y, &what);
        if k * n < matvec::PAR_MIN_WEIGHTS {
            // One piece: the rows kernel's sums, bit for bit.
            assert_eq!(y, rows[..n], "{what}: matvec vs rows kernel");
        }
        let mut y1 = vec![f32::NAN; n];
        on_one_thread(|| qw.matvec_with(&x[..k], &mut y1, MatvecKernel::Avx2)).unwrap();
        assert_eq!(y, y1, "{what}: one thread vs the pool");
    }
}

/// The AVX2 matvec's slab walk (groups cut into slabs of 16 pairs, each
/// column's sum carried between them) against its whole-group walk, bit for
/// bit, on groups of 34 to 256 (slabs that do and do not divide them),
/// widths with vector and scalar tails, and pieces of the groups and
/// columns as the parallel matvec hands them out; against the float64
/// reference too.
#[test]
#[cfg(target_arch = "x86_64")]
fn avx2_matvec_in_slabs_matches_whole_groups() {
    let Some(tok) = crate::simd::Avx2::at(simd::level()) else {
        eprintln!("skipped: AVX2 is not in force here (CPU or QUANTRS_SIMD)");
        return;
    };
    for (i, &(k, n, gs)) in [
        (256, 75, 128),
        (384, 131, 128),
        (512, 64, 256),
        (136, 200, 68),
        (192, 72, 96),
        (640, 203, 64),
    ]
    .iter()
    .enumerate()
    {
        let qw =
            QuantizedWeight::quantize_grouped(&rand_vec(k * n, 500 + i as u64), k, n, gs).unwrap();
        let x = mixed_range_x(k, 510 + i as u64);
        let what = format!("[{k}x{n}] gs {gs}");
        let xs = matvec::prescaled(&x, super::dispatch::Matvec::Avx2(tok));
        let view = qw.view();
        let args = format::MatvecArgs {
            data: view.data,
            scales: view.scales,
            x: &x,
            xs: &xs,
            out_feat: n,
            group_size: gs,
            groups: 0..qw.num_groups(),
        };
        // Every column and group; then a piece of the columns and of the
        // groups, as one work item of the parallel matvec.
        let g1 = qw.num_groups().div_ceil(2);
        for (groups, o0, w) in [(0..qw.num_groups(), 0, n), (1..g1.max(2), 3, n - 11)] {
            let a = format::MatvecArgs {
                groups: groups.clone(),
                ..args.clone()
            };
            let mut whole = vec![f32::NAN; w];
            let mut slabs = vec![f32::NAN; w];
            // SAFETY: the token proves AVX2 and FMA.
            unsafe {
                super::avx2::matvec_walk(tok, &a, o0, &mut whole, false);
                super::avx2::matvec_walk(tok, &a, o0, &mut slabs, true);
            }
            assert_eq!(slabs, whole, "{what} groups {groups:?} cols {o0}+{w}");
        }
        let mut y = vec![f32::NAN; n];
        // SAFETY: as above.
        unsafe { super::avx2::matvec_walk(tok, &args, 0, &mut y, true) };
        assert_close(&qw, &x, 1, &y, &what);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn prop_kernels_agree(k in 1usize..80, n in 1usize..70, gs_half in 1usize..40, b in 1usize..14, seed in 0u64..1000) {
        check_all_paths(k, n, 2 * gs_half, b, seed);
    }

    #[test]
    fn prop_special_values_quantize_exactly(
        k in 1usize..40, n in 1usize..9,
        vals in proptest::collection::vec(prop_oneof![
            Just(0.0f32), Just(-0.0f32), Just(f32::MIN_POSITIVE), Just(1e-45f32),
            Just(-3.5f32), Just(3.5f32), Just(1e30f32), Just(-1e30f32), -10.0f32..10.0
        ], 1..400)
    ) {
        let w: Vec<f32> = (0..k * n).map(|i| vals[i % vals.len()]).collect();
        let qw = QuantizedWeight::try_quantize(&w, k, n).unwrap();
        let d = qw.dequantize();
        // Every dequantized value is within half a step of the input.
        for (i, (&a, &b)) in w.iter().zip(&d).enumerate() {
            let g = (i / n) / qw.group_size();
            let s = qw.scales[g * n + i % n];
            prop_assert!((a - b).abs() <= 0.5 * s * (1.0 + 1e-6) + 1e-30, "w {a} deq {b} scale {s}");
        }
    }
}

#[test]
#[cfg(target_arch = "x86_64")]
fn vnni_kernel_is_chosen_only_for_group_sizes_it_can_take() {
    let pick = |gs| MatvecKernel::for_weights(SimdLevel::Avx512, gs);
    if crate::simd::Avx512Vnni::new().is_some() {
        for gs in [32, 64, 128, 4096] {
            assert_eq!(pick(gs), MatvecKernel::Avx512Vnni, "group {gs}");
        }
    }
    // Below the threshold, not a multiple of 8, or too large: the f32 kernel.
    for gs in [16, 34, 36, 8192] {
        assert_ne!(pick(gs), MatvecKernel::Avx512Vnni, "group {gs}");
    }
    if crate::simd::Avx2::new().is_some() {
        assert_eq!(
            MatvecKernel::for_weights(SimdLevel::Avx2, 32),
            MatvecKernel::Avx2
        );
    }
}

/// Every entry point that takes a level or a kernel refuses one above the
/// level in force with an error (never runs instructions the CPU lacks).
#[test]
fn levels_above_the_one_in_force_are_errors() {
    let (k, n) = (64, 40);
    let qw = QuantizedWeight::try_quantize(&rand_vec(k * n, 80), k, n).unwrap();
    let x = rand_vec(2 * k, 81);
    let mut y = vec![0.0f32; 2 * n];
    let above: Vec<SimdLevel> = [SimdLevel::Neon, SimdLevel::Avx2, SimdLevel::Avx512]
        .into_iter()
        .filter(|l| !available_levels().contains(l))
        .collect();
    assert!(!above.is_empty(), "NEON and x86 levels never coexist");
    for level in above {
        for use_gemm in [false, true] {
            let e = qw.matmul_with(&x, 2, &mut y, level, use_gemm).unwrap_err();
            assert!(
                matches!(e, QuantError::UnsupportedOperation(_)),
                "{level:?}: {e}"
            );
        }
    }
    #[cfg(target_arch = "x86_64")]
    for kernel in [
        MatvecKernel::Avx2,
        MatvecKernel::Avx512,
        MatvecKernel::Avx512Vnni,
    ] {
        if !MatvecKernel::available().contains(&kernel) {
            let r = qw.matvec_with(&x[..k], &mut y[..n], kernel);
            assert!(r.is_err(), "{kernel:?} ran on a CPU without it");
        }
    }
}

/// One ISA's kernels (matvec and GEMM at `level`, the `kernel` matvec)
/// against the scalar twin on awkward shapes, or a printed skip reason.
fn isa_matches_scalar(level: SimdLevel, kernel: MatvecKernel, present: bool) {
    if !present {
        eprintln!(
            "skipped: {} is not in force here (CPU or QUANTRS_SIMD); only the scalar twin ran",
            kernel.name()
        );
        return;
    }
    for (i, &(k, n, gs, b)) in [
        (64, 300, 32, 1),
        (256, 257, 128, 3),
        (96, 129, 16, 9),
        (40, 70, 8, 2),
    ]
    .iter()
    .enumerate()
    {
        let qw =
            QuantizedWeight::quantize_grouped(&rand_vec(k * n, 90 + i as u64), k, n, gs).unwrap();
        let x = mixed_range_x(b * k, 95 + i as u64);
        let what = format!("{} [{k}x{n}] gs {gs} b {b}", kernel.name());
        for use_gemm in [false, true] {
            let mut y = vec![f32::NAN; b * n];
            qw.matmul_with(&x, b, &mut y, level, use_gemm).unwrap();
            assert_close(&qw, &x, b, &y, &format!("{what} gemm={use_gemm}"));
        }
        let mut y = vec![f32::NAN; b * n];
        for (xr, yr) in x.chunks_exact(k).zip(y.chunks_exact_mut(n)) {
            qw.matvec_with(xr, yr, kernel).unwrap();
        }
        assert_close(&qw, &x, b, &y, &what);
    }
}

#[test]
#[cfg(target_arch = "x86_64")]
fn avx2_kernels_match_the_scalar_twin() {
    let present = crate::simd::Avx2::new().is_some();
    isa_matches_scalar(SimdLevel::Avx2, MatvecKernel::Avx2, present);
}

#[test]
#[cfg(target_arch = "x86_64")]
fn avx512_kernels_match_the_scalar_twin() {
    let present = crate::simd::Avx512::new().is_some();
    isa_matches_scalar(SimdLevel::Avx512, MatvecKernel::Avx512, present);
}

#[test]
#[cfg(target_arch = "x86_64")]
fn vnni_kernel_matches_the_scalar_twin() {
    let present = crate::simd::Avx512Vnni::new().is_some();
    isa_matches_scalar(SimdLevel::Avx512, MatvecKernel::Avx512Vnni, present);
}
