//! Fit a linear least-squares model with `AdamW4bit`: 4-bit
//! moments, about one byte of optimizer state per parameter.
//!
//! `cargo run --release --example adamw4bit_train`

use ndarray::{Array1, Array2};
use quantrs::{AdamW4bit, Optimizer, QuantError, StatefulOptimizer};

fn main() -> Result<(), QuantError> {
    let (n, d) = (512, 64);
    let x = Array2::from_shape_fn((n, d), |(i, j)| ((i * 7 + j * 13) as f32 * 0.031).sin());
    let w_true = Array1::from_shape_fn(d, |j| (j as f32 * 0.2).cos());
    let y = x.dot(&w_true);

    let mut w = Array1::<f32>::zeros(d);
    let mut opt = AdamW4bit::new(5e-2, 0.9, 0.999, 1e-8, 0.0);
    let loss = |w: &Array1<f32>| (x.dot(w) - &y).mapv(|r| r * r).mean().unwrap_or(0.0);
    let first = loss(&w);
    for step in 0..300 {
        let r = x.dot(&w) - &y;
        let grad = x.t().dot(&r) * (2.0 / n as f32);
        opt.update(w.view_mut().into_dyn(), grad.view().into_dyn())?;
        opt.step();
        if step % 100 == 0 {
            println!("step {step:3}: loss {:.5}", loss(&w));
        }
    }
    let last = loss(&w);
    let mem = opt.memory_usage();
    println!(
        "loss {first:.4} -> {last:.6}; optimizer state {} bytes for {} parameters \
         ({:.0}% less than float32 AdamW)",
        mem.total_bytes,
        opt.num_parameters(),
        100.0 * opt.memory_savings()
    );
    assert!(last < 0.01 * first, "AdamW4bit did not converge");
    Ok(())
}
