//! Quantization-aware training with `QatOptimizer`: int4
//! fake-quantized weights with stochastic rounding, the master in f64.
//!
//! `cargo run --release --example qat_loop`

use ndarray::{Array1, Array2};
use quantrs::qat::{IntDtype, QuantScheme, QuantTarget, RoundingMode};
use quantrs::{QatConfig, QatOptimizer, QuantError};
use rand::{rngs::StdRng, SeedableRng};

fn main() -> Result<(), QuantError> {
    let (n, d) = (256, 32);
    let x = Array2::from_shape_fn((n, d), |(i, j)| ((i * 5 + j * 11) as f64 * 0.047).sin());
    let w_true = Array1::from_shape_fn(d, |j| ((j as f64) * 0.3).cos());
    let y = x.dot(&w_true);

    let mut rng = StdRng::seed_from_u64(0);
    let config = QatConfig::new(
        QuantTarget::Int(IntDtype::Int4),
        QuantScheme::Symmetric,
        RoundingMode::Stochastic,
        2e-2,
    );
    let mut master = Array1::from_elem(d, 0.1);
    let mut opt = QatOptimizer::new(&master, config, &mut rng)?;
    let loss = |w: &Array1<f64>| (x.dot(w) - &y).mapv(|r| r * r).mean().unwrap_or(0.0);
    let first = loss(opt.quantized_weights());
    for _ in 0..400 {
        // The forward pass uses the quantized view; the straight-through
        // estimator passes its gradient to the master unchanged.
        let r = x.dot(opt.quantized_weights()) - &y;
        let grad = x.t().dot(&r) * (2.0 / n as f64);
        opt.step(&mut master, &grad, &mut rng)?;
    }
    let q = opt.quantized_weights();
    let p = opt.quant_params().expect("integer target");
    println!(
        "{} steps: loss on the int4 view {first:.4} -> {:.4} (master {:.4}); scale {:.4}",
        opt.step_count(),
        loss(q),
        loss(&master),
        p.scale
    );
    let codes: Vec<i32> = q.iter().map(|v| (v / p.scale).round() as i32).collect();
    println!("int4 codes: {codes:?}");
    assert!(codes.iter().all(|c| (-7..=7).contains(c)));
    assert!(loss(q) < 0.1 * first, "QAT did not converge");
    Ok(())
}
