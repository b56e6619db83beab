//! QatOptimizer through the public API: thread-count independence, transactional failures, byte-format robustness, and fake
//! quantization against a direct formula (proptest over shapes and values).

use proptest::prelude::*;
use quantrs::qat::{
    fake_quant_int, CounterRng, IntDtype, QatConfig, QatOptimizer, QuantParams, QuantScheme,
    QuantTarget, Rounding, RoundingMode,
};
use quantrs::QuantError;

fn targets() -> Vec<QuantTarget> {
    use quantrs::fp8::Fp8Format;
    vec![
        QuantTarget::Int(IntDtype::Int8),
        QuantTarget::Int(IntDtype::Int4),
        QuantTarget::Fp8(Fp8Format::E4M3),
        QuantTarget::Fp8(Fp8Format::E5M2),
    ]
}

fn config(target: QuantTarget, scheme: QuantScheme, rounding: RoundingMode) -> QatConfig {
    let mut c = QatConfig::with_target(target);
    c.scheme = scheme;
    c.rounding = rounding;
    c.lr = 0.05;
    c.weight_decay = 0.01;
    c
}

fn data(n: usize, seed: u64) -> Vec<f64> {
    let mut r = CounterRng::new(seed);
    let mut u = vec![0.0; n];
    r.fill_uniform(&mut u);
    u.iter().map(|x| (x - 0.5) * 4.0).collect()
}

/// Run `steps` steps; return (master, optimizer). (Every SIMD level against
/// the scalar bodies is tested inside the crate, `src/qat/tests.rs`.)
fn run(c: QatConfig, n: usize, steps: usize) -> (Vec<f64>, QatOptimizer<f64>) {
    let mut w = data(n, 1);
    let mut opt = QatOptimizer::with_seed(&w, c, 11).unwrap();
    for s in 0..steps {
        let g = data(n, 100 + s as u64);
        opt.step_seeded(&mut w, &g, None).unwrap();
    }
    (w, opt)
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let c = config(
        QuantTarget::Int(IntDtype::Int4),
        QuantScheme::Affine,
        RoundingMode::Stochastic,
    );
    let results: Vec<_> = [1, 2, 3]
        .iter()
        .map(|&t| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap();
            pool.install(|| run(c, 100_003, 2))
        })
        .collect();
    assert_eq!(results[0], results[1]);
    assert_eq!(results[0], results[2]);
}

#[test]
fn f32_master_steps() {
    let c = config(
        QuantTarget::Int(IntDtype::Int8),
        QuantScheme::Symmetric,
        RoundingMode::Nearest,
    );
    let mut w: Vec<f32> = data(1000, 3).iter().map(|&x| x as f32).collect();
    let mut opt = QatOptimizer::with_seed(&w, c, 0).unwrap();
    let g: Vec<f32> = data(1000, 4).iter().map(|&x| x as f32).collect();
    opt.step_seeded(&mut w, &g, None).unwrap();
    let p = *opt.quant_params().unwrap();
    let absmax = w.iter().fold(0.0f64, |a, &x| a.max((x as f64).abs()));
    assert_eq!(p.scale, absmax / 127.0);
    for (&q, &x) in opt.quantized_weights().iter().zip(&w) {
        let expect = ((x as f64 / p.scale).round_ties_even().clamp(-127.0, 127.0) * p.scale) as f32;
        assert_eq!(q, expect);
    }
}

fn snapshot(w: &[f64], o: &QatOptimizer<f64>) -> (Vec<f64>, QatOptimizer<f64>) {
    (w.to_vec(), o.clone())
}

#[test]
fn failures_change_nothing() {
    for target in targets() {
        let c = config(target, QuantScheme::Symmetric, RoundingMode::Stochastic);
        let (mut w, mut opt) = run(c, 50, 2);
        let before = snapshot(&w, &opt);
        let mut nan = vec![1.0; 50];
        nan[13] = f64::NAN;
        let err = opt.step_seeded(&mut w, &nan, None).unwrap_err();
        assert!(err.to_string().contains("index 13"), "{err}");
        assert!(opt.step_seeded(&mut w, &vec![1e200; 50], None).is_err());
        assert!(matches!(
            opt.step_seeded(&mut w, &[1.0; 49], None),
            Err(QuantError::DimensionMismatch { .. })
        ));
        assert!(opt.step_seeded(&mut w[..49], &[1.0; 49], None).is_err());
        assert_eq!(snapshot(&w, &opt), before);
    }
    // Degenerate calibration after the update: everything decays to 0.
    let mut c = QatConfig::with_target(QuantTarget::Int(IntDtype::Int8));
    (c.lr, c.weight_decay) = (1.0, 1.0);
    let mut w = vec![0.5, -2.0];
    let mut opt = QatOptimizer::with_seed(&w, c, 0).unwrap();
    let before = snapshot(&w, &opt);
    assert!(matches!(
        opt.step_seeded(&mut w, &[0.0, 0.0], None),
        Err(QuantError::InvalidState(_))
    ));
    assert_eq!(snapshot(&w, &opt), before);
}

#[test]
fn construction_errors() {
    let c = QatConfig::with_target(QuantTarget::Int(IntDtype::Int8));
    assert!(matches!(
        QatOptimizer::<f64>::with_seed(&[], c, 0),
        Err(QuantError::InvalidState(_))
    ));
    assert!(matches!(
        QatOptimizer::with_seed(&[0.0, 0.0], c, 0),
        Err(QuantError::InvalidState(_))
    ));
    assert!(QatOptimizer::with_seed(&[1.0, f64::INFINITY], c, 0).is_err());
    let mut bad = c;
    bad.beta2 = 1.0;
    assert!(QatOptimizer::with_seed(&[1.0], bad, 0).is_err());
}

#[test]
fn bytes_round_trip_and_reject_every_truncation() {
    let c = config(
        QuantTarget::Int(IntDtype::Int4),
        QuantScheme::Affine,
        RoundingMode::Stochastic,
    );
    let (mut w, opt) = run(c, 37, 2);
    let bytes = opt.to_bytes();
    let mut back = QatOptimizer::<f64>::from_bytes(&bytes).unwrap();
    assert_eq!(back, opt);
    assert!(QatOptimizer::<f32>::from_bytes(&bytes).is_err());
    for k in 0..bytes.len() {
        assert!(matches!(
            QatOptimizer::<f64>::from_bytes(&bytes[..k]),
            Err(QuantError::Serialization(_))
        ));
    }
    for i in (0..bytes.len()).step_by(7) {
        let mut b = bytes.clone();
        b[i] ^= 0x10;
        assert!(QatOptimizer::<f64>::from_bytes(&b).is_err());
    }
    let mut w2 = w.clone();
    let mut o = opt.clone();
    o.step_seeded(&mut w, &data(37, 5), None).unwrap();
    back.step_seeded(&mut w2, &data(37, 5), None).unwrap();
    assert_eq!((w, o), (w2, back));
}

fn value() -> impl Strategy<Value = f64> {
    prop_oneof![
        -1e3..1e3f64,
        Just(0.0),
        Just(-0.0),
        Just(f64::MIN_POSITIVE / 4.0),
        Just(1e-300),
        Just(-7.5),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn int_fake_quant_matches_formula(
        x in prop::collection::vec(value(), 1..300),
        absmax in 1e-3..1e3f64,
        int4 in any::<bool>(),
        affine in any::<bool>(),
    ) {
        let d = if int4 { IntDtype::Int4 } else { IntDtype::Int8 };
        let s = if affine { QuantScheme::Affine } else { QuantScheme::Symmetric };
        let p = QuantParams::from_minmax(-absmax / 3.0, absmax, d, s).unwrap();
        let mut out = vec![0.0; x.len()];
        fake_quant_int(&x, &mut out, &p, Rounding::Nearest).unwrap();
        for (&v, &o) in x.iter().zip(&out) {
            let zp = p.zero_point as f64;
            let q = (v / p.scale + zp).round_ties_even().clamp(p.qmin as f64, p.qmax as f64);
            prop_assert_eq!(o, (q - zp) * p.scale);
        }
        let mut st = vec![0.0; x.len()];
        fake_quant_int(&x, &mut st, &p, Rounding::Stochastic { key: 3 }).unwrap();
        for ((&v, &o), &s) in x.iter().zip(&out).zip(&st) {
            // Stochastic lands on a grid neighbour of the exact value.
            prop_assert!((s - o).abs() <= p.scale * (1.0 + 1e-12), "{} {} {}", v, o, s);
        }
    }

    #[test]
    fn step_is_finite_or_untouched(
        w0 in prop::collection::vec(value(), 1..200),
        gscale in prop_oneof![Just(0.0), Just(1e-300), 1e-3..1e3f64, Just(1e300)],
    ) {
        let c = QatConfig::with_target(QuantTarget::Int(IntDtype::Int8));
        let Ok(mut opt) = QatOptimizer::with_seed(&w0, c, 1) else {
            prop_assert!(w0.iter().all(|&v| v == 0.0 || v.abs() < 1e-200));
            return Ok(());
        };
        let mut w = w0.clone();
        let g: Vec<f64> = w0.iter().map(|&v| (v + 1.0) * gscale).collect();
        let before = opt.clone();
        match opt.step_seeded(&mut w, &g, None) {
            Ok(()) => {
                prop_assert!(w.iter().all(|v| v.is_finite()));
                let p = opt.quant_params().unwrap();
                prop_assert!(opt.quantized_weights().iter().all(|q| q.abs() <= p.scale * 127.0 * (1.0 + 1e-12)));
            }
            Err(_) => {
                prop_assert_eq!(&w, &w0);
                prop_assert_eq!(opt, before);
            }
        }
    }
}
