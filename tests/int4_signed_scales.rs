//! Imported INT4 formats carry scales of either sign and zero ones (GGUF
//! `Q4_0` stores each block's largest-magnitude element / -8, and 0 for an
//! all-zero block): the raw constructor takes them, and every kernel at every
//! SIMD level computes `sum_i x_i * code_io * scale_go` with them, checked here
//! against a float64 reference.

use quantrs::int4::MatvecKernel;
use quantrs::simd::available_levels;
use quantrs::QuantizedWeight;

/// Deterministic pseudo-random values in [-1, 1) (splitmix64).
fn noise(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

/// A weight with random codes and scales: a third negative, a sixth zero.
fn signed_weight(in_feat: usize, out_feat: usize, gs: usize, seed: u64) -> QuantizedWeight {
    let groups = in_feat.div_ceil(gs);
    let pairs = groups * gs / 2;
    let data: Vec<u8> = noise(pairs * out_feat, seed)
        .iter()
        .map(|v| ((v + 1.0) * 128.0) as u8)
        .collect();
    let scales: Vec<f32> = noise(groups * out_feat, seed + 1)
        .iter()
        .enumerate()
        .map(|(i, v)| match i % 6 {
            0 => 0.0,
            1 | 2 => -(v.abs() as f32) * 0.1 - 1e-3,
            _ => v.abs() as f32 * 0.1 + 1e-3,
        })
        .collect();
    QuantizedWeight::from_parts(data, scales, in_feat, out_feat, groups).unwrap()
}

fn reference(qw: &QuantizedWeight, x: &[f32], batch: usize) -> Vec<f64> {
    let (k, n, gs) = (qw.in_feat(), qw.out_feat(), qw.group_size());
    let mut y = vec![0.0f64; batch * n];
    for b in 0..batch {
        for o in 0..n {
            y[b * n + o] = (0..k)
                .map(|i| {
                    let w = f64::from(qw.code(i, o)) * f64::from(qw.scales()[(i / gs) * n + o]);
                    f64::from(x[b * k + i]) * w
                })
                .sum();
        }
    }
    y
}

fn assert_close(qw: &QuantizedWeight, x: &[f32], batch: usize, y: &[f32], what: &str) {
    let want = reference(qw, x, batch);
    let (k, n, gs) = (qw.in_feat(), qw.out_feat(), qw.group_size());
    for b in 0..batch {
        for o in 0..n {
            // the kernels' bound: 1e-5 of sum |x w| (plus f32 rounding slack)
            let mag: f64 = (0..k)
                .map(|i| {
                    let w = f64::from(qw.code(i, o)) * f64::from(qw.scales()[(i / gs) * n + o]);
                    (f64::from(x[b * k + i]) * w).abs()
                })
                .sum();
            let (got, exp) = (f64::from(y[b * n + o]), want[b * n + o]);
            assert!(
                (got - exp).abs() <= 1e-5 * mag + 1e-30,
                "{what}: y[{b}, {o}] = {got}, want {exp}"
            );
        }
    }
}

#[test]
fn raw_constructor_takes_any_finite_scale() {
    let qw = signed_weight(64, 5, 32, 1);
    assert!(qw.scales().iter().any(|&s| s < 0.0) && qw.scales().contains(&0.0));
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut s = qw.scales().to_vec();
        s[3] = bad;
        let e = QuantizedWeight::from_parts(qw.data().to_vec(), s, 64, 5, 2).unwrap_err();
        assert!(e.to_string().contains("scales[3]"), "{e}");
    }
}

#[test]
fn every_kernel_handles_negative_and_zero_scales() {
    for (k, n, gs, seed) in [
        (64, 9, 32, 3),
        (256, 33, 32, 4),
        (130, 17, 64, 5),
        (96, 70, 2, 6),
    ] {
        let qw = signed_weight(k, n, gs, seed);
        assert_close(
            &qw,
            &vec![0.0; k],
            1,
            &qw_matvec(&qw, &vec![0.0; k]),
            "zeros",
        );
        let dq = qw.dequantize();
        for i in 0..k {
            for o in 0..n {
                let s = qw.scales()[(i / qw.group_size()) * n + o];
                assert_eq!(dq[i * n + o], f32::from(qw.code(i, o)) * s);
            }
        }
        for batch in [1, 3, 9] {
            let x: Vec<f32> = noise(batch * k, seed + 7)
                .iter()
                .map(|&v| v as f32)
                .collect();
            for level in available_levels() {
                for gemm in [false, true] {
                    let mut y = vec![f32::NAN; batch * n];
                    qw.matmul_with(&x, batch, &mut y, level, gemm).unwrap();
                    assert_close(
                        &qw,
                        &x,
                        batch,
                        &y,
                        &format!("{level:?} gemm={gemm} {k}x{n}"),
                    );
                }
            }
            for kernel in MatvecKernel::available() {
                let mut y = vec![f32::NAN; batch * n];
                for (xr, yr) in x.chunks_exact(k).zip(y.chunks_exact_mut(n)) {
                    qw.matvec_with(xr, yr, kernel).unwrap();
                }
                assert_close(&qw, &x, batch, &y, kernel.name());
            }
        }
    }
}

fn qw_matvec(qw: &QuantizedWeight, x: &[f32]) -> Vec<f32> {
    let mut y = vec![0.0; qw.out_feat()];
    qw.try_matvec(x, &mut y).unwrap();
    y
}
