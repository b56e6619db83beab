//! Quantize a weight to packed INT4 and multiply with it.
//!
//! `cargo run --release --example int4_matvec`

use ndarray::Array2;
use quantrs::{QuantError, QuantizedWeight};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn main() -> Result<(), QuantError> {
    let (in_feat, out_feat) = (1024, 256);
    let mut rng = StdRng::seed_from_u64(0);
    let mut uniform = move || (rng.next_u32() >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0;
    let w = Array2::from_shape_simple_fn((in_feat, out_feat), &mut uniform);
    let qw = QuantizedWeight::quantize_array(w.view(), 32)?;
    println!(
        "INT4 weight [{in_feat}, {out_feat}]: {} bytes instead of {} (group size {}, {} groups)",
        qw.nbytes(),
        4 * in_feat * out_feat,
        qw.group_size(),
        qw.num_groups()
    );

    let x = Array2::from_shape_simple_fn((8, in_feat), &mut uniform);
    let y = qw.matvec_array(x.row(0))?; // W^T x, [out_feat]
    let ys = qw.matmul_array(x.view())?; // X W, [8, out_feat]
    let exact = x.dot(&w);
    // Relative RMS error of the product against float32. For weights
    // uniform in [-1, 1] the INT4 step is about 1/7, the rounding error's RMS
    // (1/7)/sqrt(12) = 0.041 against the weights' 1/sqrt(3) = 0.58: about 7%.
    let rms = |a: &Array2<f32>| (a.mapv(|v| v * v).mean().unwrap_or(0.0)).sqrt();
    let rel = rms(&(&ys - &exact)) / rms(&exact);
    println!("matvec y[0..4] = {:?}", &y.as_slice().unwrap()[..4]);
    println!("matmul relative RMS error against float32: {rel:.4}");
    assert!(rel < 0.1, "INT4 error out of range");
    // matvec and the blocked GEMM sum in different orders: equal to rounding.
    let gap = (&ys.row(0) - &y)
        .mapv(f32::abs)
        .fold(0.0f32, |a, &b| a.max(b));
    assert!(
        gap < 1e-4 * rms(&exact),
        "matvec and matmul disagree by {gap}"
    );
    Ok(())
}
