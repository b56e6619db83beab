//! Whole-step tests that need a SIMD level: every available level against
//! the scalar bodies, bit for bit, and the refusal of a level above the one
//! in force.

use super::{
    CounterRng, IntDtype, QatConfig, QatOptimizer, QuantScheme, QuantTarget, RoundingMode,
};
use crate::fp8::Fp8Format;
use crate::simd::{self, SimdLevel};

fn targets() -> [QuantTarget; 4] {
    [
        QuantTarget::Int(IntDtype::Int8),
        QuantTarget::Int(IntDtype::Int4),
        QuantTarget::Fp8(Fp8Format::E4M3),
        QuantTarget::Fp8(Fp8Format::E5M2),
    ]
}

fn data(n: usize, seed: u64) -> Vec<f64> {
    let mut r = CounterRng::new(seed);
    let mut u = vec![0.0; n];
    r.fill_uniform(&mut u);
    u.iter().map(|x| (x - 0.5) * 4.0).collect()
}

/// `steps` steps at `level`: (master, optimizer).
fn run(level: SimdLevel, c: QatConfig, n: usize, steps: usize) -> (Vec<f64>, QatOptimizer<f64>) {
    let mut w = data(n, 1);
    let mut opt = QatOptimizer::with_seed(&w, c, 11).unwrap();
    for s in 0..steps {
        let g = data(n, 100 + s as u64);
        opt.step_at(level, &mut w, &g, None).unwrap();
    }
    (w, opt)
}

#[test]
fn step_at_a_level_above_the_one_in_force_is_an_error() {
    let c = QatConfig::with_target(QuantTarget::Int(IntDtype::Int8));
    let mut w = data(10, 1);
    let mut opt = QatOptimizer::with_seed(&w, c, 0).unwrap();
    let before = (w.clone(), opt.clone());
    for level in [SimdLevel::Neon, SimdLevel::Avx2, SimdLevel::Avx512] {
        if !simd::available_levels().contains(&level) {
            assert!(opt.step_at(level, &mut w, &data(10, 2), None).is_err());
            assert_eq!((w.clone(), opt.clone()), before, "{level:?}");
        }
    }
    assert!(opt
        .step_at(SimdLevel::Scalar, &mut w, &data(10, 2), None)
        .is_ok());
}

#[test]
fn every_simd_level_matches_scalar_bit_for_bit() {
    let levels: Vec<SimdLevel> = simd::available_levels()
        .into_iter()
        .filter(|&l| l != SimdLevel::Scalar)
        .collect();
    if levels.is_empty() {
        eprintln!("skipped: no SIMD level in force, only the scalar bodies would run");
        return;
    }
    for target in targets() {
        for rounding in [RoundingMode::Nearest, RoundingMode::Stochastic] {
            let schemes: &[QuantScheme] = match target {
                QuantTarget::Int(_) => &[QuantScheme::Symmetric, QuantScheme::Affine],
                QuantTarget::Fp8(_) => &[QuantScheme::Symmetric],
            };
            for &scheme in schemes {
                let mut c = QatConfig::with_target(target);
                (c.scheme, c.rounding, c.lr, c.weight_decay) = (scheme, rounding, 0.05, 0.01);
                // Lengths around the 8-lane body, the 1024 piece and the task chunk.
                for n in [1, 7, 9, 1023, 1025, 16_385] {
                    let (w0, o0) = run(SimdLevel::Scalar, c, n, 3);
                    for &level in &levels {
                        let (w1, o1) = run(level, c, n, 3);
                        assert_eq!(w0, w1, "{target:?} {level:?} n={n}");
                        assert_eq!(o0, o1, "{target:?} {level:?} n={n}");
                    }
                }
            }
        }
    }
}

#[test]
fn setters_change_only_the_config_and_validate_first() {
    let c = QatConfig::with_target(QuantTarget::Int(IntDtype::Int8));
    let mut w = data(64, 1);
    let mut a = QatOptimizer::with_seed(&w, c, 11).unwrap();
    a.step_seeded(&mut w, &data(64, 2), None).unwrap();
    let before = a.clone();
    for bad in [
        a.set_lr(-1.0),
        a.set_betas(0.9, 1.0),
        a.set_eps(0.0),
        a.set_weight_decay(f64::NAN),
        a.set_hyper(0.1, 0.9, 0.99, 1e-8, -0.5),
    ] {
        assert!(bad.is_err());
    }
    assert_eq!(a, before);
    let msg = a.set_betas(1.5, 0.9).unwrap_err().to_string();
    assert!(msg.contains("beta1"), "{msg}");
    // The setters against an optimizer built with the new values from the same state.
    a.set_hyper(0.02, 0.8, 0.95, 1e-6, 0.1).unwrap();
    a.set_rounding(RoundingMode::Stochastic).unwrap();
    a.set_seed(7);
    let mut c2 = c;
    (c2.lr, c2.beta1, c2.beta2, c2.eps, c2.weight_decay) = (0.02, 0.8, 0.95, 1e-6, 0.1);
    c2.rounding = RoundingMode::Stochastic;
    let (m, v) = before.moments();
    let b = QatOptimizer::from_parts(
        c2,
        7,
        before.step_count(),
        m.to_vec(),
        v.to_vec(),
        before.quantized_slice().to_vec(),
        before.quant_params().copied(),
    )
    .unwrap();
    assert_eq!(a, b);
    let (mut wa, mut wb) = (w.clone(), w.clone());
    let mut b = b;
    a.step_seeded(&mut wa, &data(64, 3), None).unwrap();
    b.step_seeded(&mut wb, &data(64, 3), None).unwrap();
    assert_eq!((wa, a), (wb, b));
}

#[test]
fn set_moments_checks_everything_first() {
    let c = QatConfig::with_target(QuantTarget::Int(IntDtype::Int8));
    let mut w = data(8, 1);
    let mut a = QatOptimizer::with_seed(&w, c, 3).unwrap();
    a.step_seeded(&mut w, &data(8, 2), None).unwrap();
    let before = a.clone();
    let ok = vec![0.5; 8];
    assert!(a.set_moments(5, &ok[..7], &ok).is_err());
    assert!(a.set_moments(5, &[f64::NAN; 8], &ok).is_err());
    let msg = a.set_moments(5, &ok, &[-1.0; 8]).unwrap_err().to_string();
    assert!(msg.contains("v:"), "{msg}");
    assert!(a.set_moments(u64::MAX, &ok, &ok).is_err());
    assert_eq!(a, before);
    a.set_moments(5, &ok, &[0.25; 8]).unwrap();
    assert_eq!(a.step_count(), 5);
    assert_eq!(a.moments(), (&ok[..], &[0.25; 8][..]));
}
