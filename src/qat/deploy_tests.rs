//! The deploy grid against the serving layers: after every step the view is,
//! bit for bit, `dequantize_w` of the layer built from the master (the
//! layers' public constructors, not the format calls `deploy.rs` makes).

use super::{
    CounterRng, IntDtype, QatConfig, QatGrid, QatOptimizer, QuantScheme, QuantTarget, RoundingMode,
};
use crate::fp8::Fp8Format;
use crate::linear::{Int4Linear, Int8Linear, PerTensorFP8Linear, QuantMethod};

const OUT: usize = 6;
const IN: usize = 40;

fn data(n: usize, seed: u64, spread: f64) -> Vec<f64> {
    let mut r = CounterRng::new(seed);
    let mut u = vec![0.0; n];
    r.fill_uniform(&mut u);
    u.iter().map(|x| (x - 0.5) * spread).collect()
}

/// The serving layer's dequantized weight for the f32 master `w` `[OUT, IN]`.
fn served(target: QuantTarget, group_size: usize, w: &[f32]) -> Vec<f32> {
    let layer: Box<dyn QuantMethod> = match target {
        QuantTarget::Int(IntDtype::Int4) => {
            Box::new(Int4Linear::from_float(w, OUT, IN, group_size, None, None).unwrap())
        }
        QuantTarget::Int(IntDtype::Int8) => {
            Box::new(Int8Linear::from_float(w, OUT, IN, None).unwrap())
        }
        _ => Box::new(PerTensorFP8Linear::from_float(w, vec![OUT, IN], None, None).unwrap()),
    };
    layer.dequantize_w_vec().unwrap()
}

fn deploy_targets() -> [(QuantTarget, usize); 4] {
    [
        (QuantTarget::Int(IntDtype::Int4), 8),
        (QuantTarget::Int(IntDtype::Int4), 32), // 40 inputs: a short last group
        (QuantTarget::Int(IntDtype::Int8), 32),
        (QuantTarget::Fp8(Fp8Format::E4M3), 32),
    ]
}

fn check_steps<T: super::Master>(to: impl Fn(f64) -> T) {
    for (target, gs) in deploy_targets() {
        // Rows of very different ranges: a per-tensor grid would differ.
        let mut w: Vec<T> = data(OUT * IN, 1, 1.0)
            .iter()
            .enumerate()
            .map(|(k, &x)| to(x * (1 + k / IN) as f64))
            .collect();
        let c = QatConfig::new(target, QuantScheme::Symmetric, RoundingMode::Nearest, 1e-2);
        let mut opt = QatOptimizer::with_grid(&w, c, QatGrid::deploy(OUT, IN, gs), 3).unwrap();
        assert!(opt.quant_params().is_none());
        for s in 0..4u64 {
            let w32: Vec<f32> = w.iter().map(|&x| x.into() as f32).collect();
            let want = served(target, gs, &w32);
            for (k, (&q, &e)) in opt.quantized_slice().iter().zip(&want).enumerate() {
                let q: f64 = q.into();
                assert_eq!(
                    q.to_bits(),
                    (e as f64).to_bits(),
                    "{target:?} g{gs} step {s} [{k}]"
                );
            }
            let g: Vec<T> = data(OUT * IN, 10 + s, 2.0).into_iter().map(&to).collect();
            opt.step_seeded(&mut w, &g, None).unwrap();
        }
        let bytes = opt.to_bytes();
        assert_eq!(QatOptimizer::<T>::from_bytes(&bytes).unwrap(), opt);
    }
}

#[test]
fn the_view_is_the_serving_layers_weight_after_every_step_f64() {
    check_steps::<f64>(|x| x);
}

#[test]
fn the_view_is_the_serving_layers_weight_after_every_step_f32() {
    check_steps::<f32>(|x| x as f32);
}

#[test]
fn int4_deploy_differs_from_the_per_tensor_grid() {
    let w: Vec<f64> = (0..OUT * IN)
        .map(|k| (k as f64 * 0.37).sin() * (1 + k / IN) as f64)
        .collect();
    let c = QatConfig::with_target(QuantTarget::Int(IntDtype::Int4));
    let tensor = QatOptimizer::with_seed(&w, c, 0).unwrap();
    let deploy = QatOptimizer::with_grid(&w, c, QatGrid::deploy(OUT, IN, 8), 0).unwrap();
    assert_eq!(tensor.grid(), QatGrid::PerTensor);
    assert_ne!(tensor.quantized_slice(), deploy.quantized_slice());
}

#[test]
fn bad_deploy_grids_are_errors() {
    let w = vec![0.5f64; OUT * IN];
    let int4 = QatConfig::with_target(QuantTarget::Int(IntDtype::Int4));
    let grid = QatGrid::deploy(OUT, IN, 32);
    let bad = |c: QatConfig, g: QatGrid, what: &str| {
        let e = QatOptimizer::with_grid(&w, c, g, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains(what), "{e}");
    };
    bad(
        QatConfig::with_target(QuantTarget::Fp8(Fp8Format::E5M2)),
        grid,
        "fp8_e5m2",
    );
    bad(
        QatConfig {
            scheme: QuantScheme::Affine,
            ..int4
        },
        grid,
        "scheme",
    );
    bad(
        QatConfig {
            rounding: RoundingMode::Stochastic,
            ..int4
        },
        grid,
        "rounding",
    );
    bad(int4, QatGrid::deploy(OUT, IN, 7), "group_size");
    bad(int4, QatGrid::deploy(OUT, IN + 1, 32), "master");
    bad(int4, QatGrid::deploy(0, IN, 32), "master");
    // An all-zero weight has a deploy view (the serving rules' floors), unlike per tensor.
    let zeros = vec![0.0f64; OUT * IN];
    let opt = QatOptimizer::with_grid(&zeros, int4, grid, 0).unwrap();
    assert!(opt.quantized_slice().iter().all(|&x| x == 0.0));
}

#[test]
fn a_failed_deploy_step_changes_nothing() {
    let mut w = data(OUT * IN, 2, 1.0);
    let c = QatConfig::with_target(QuantTarget::Int(IntDtype::Int8));
    let mut opt = QatOptimizer::with_grid(&w, c, QatGrid::deploy(OUT, IN, 32), 0).unwrap();
    let (before, w0) = (opt.clone(), w.clone());
    let mut g = vec![1.0; OUT * IN];
    g[5] = f64::NAN;
    assert!(opt.step_seeded(&mut w, &g, None).is_err());
    assert_eq!((opt, w), (before, w0));
}

#[test]
fn version_1_bytes_read_as_the_per_tensor_grid() {
    let w = data(OUT * IN, 4, 1.0);
    let c = QatConfig::with_target(QuantTarget::Int(IntDtype::Int8));
    let opt = QatOptimizer::with_seed(&w, c, 0).unwrap();
    let v2 = opt.to_bytes();
    // Version 2 adds one grid byte (0: per tensor) after the quant params; the view,
    // moments and CRC follow. Rebuild the version 1 form: no grid byte, version 1.
    let tail = 3 * OUT * IN * 8 + 4;
    let grid_at = v2.len() - tail - 1;
    assert_eq!(v2[grid_at], 0);
    let mut v1 = [&v2[..grid_at], &v2[grid_at + 1..v2.len() - 4]].concat();
    v1[4..8].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32fast::hash(&v1);
    v1.extend_from_slice(&crc.to_le_bytes());
    assert_eq!(QatOptimizer::<f64>::from_bytes(&v1).unwrap(), opt);
}
