//! Write a per-tensor FP8 checkpoint with the `safetensors` crate, load it
//! as a `PerTensorFP8Linear` and run it.
//!
//! `cargo run --release --example fp8_linear`

use ndarray::{Array2, ArrayD, IxDyn};
use quantrs::fp8::{encode_slice, Fp8Format};
use quantrs::{PerTensorFP8Linear, QuantError, QuantMethod};
use safetensors::{tensor::TensorView, Dtype};

fn main() -> Result<(), QuantError> {
    let (out_f, in_f) = (32, 64);
    let w = Array2::from_shape_fn((out_f, in_f), |(o, i)| ((o * in_f + i) as f32 * 0.01).sin());

    // The checkpoint: E4M3 codes of w / s_w, the F32 scalars
    // weight_scale_inv (s_w) and activation_scale (s_a), as per-tensor FP8
    // models store them (weight_block_size = null).
    let s_w = w.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 448.0;
    let s_a = 4.0f32 / 448.0; // inputs stay within |x| <= 4
    let scaled: Vec<f32> = w.iter().map(|v| v / s_w).collect();
    let mut codes = vec![0u8; scaled.len()];
    encode_slice(&scaled, &mut codes, Fp8Format::E4M3, true);
    let (sw, sa) = (s_w.to_le_bytes(), s_a.to_le_bytes());
    let tensor = |dtype, shape: Vec<usize>, data| TensorView::new(dtype, shape, data);
    let views = vec![
        (
            "proj.weight",
            tensor(Dtype::F8_E4M3, vec![out_f, in_f], &codes[..]),
        ),
        ("proj.weight_scale_inv", tensor(Dtype::F32, vec![], &sw[..])),
        ("proj.activation_scale", tensor(Dtype::F32, vec![], &sa[..])),
    ];
    let views: Vec<_> = views
        .into_iter()
        .map(|(n, v)| v.map(|v| (n, v)))
        .collect::<Result<_, _>>()
        .map_err(|e| QuantError::ser(e.to_string()))?;
    let path = std::env::temp_dir().join(format!("quantrs-fp8-{}.safetensors", std::process::id()));
    safetensors::serialize_to_file(views, None, &path)
        .map_err(|e| QuantError::ser(e.to_string()))?;

    let layer = PerTensorFP8Linear::from_safetensors(&path, "proj")?;
    std::fs::remove_file(&path)?;
    println!(
        "loaded {:?}: weight {:?}, weight_scale_inv {:.3e}, activation type {:?}",
        path.file_name().unwrap(),
        layer.weight_shape(),
        layer.weight_scale_inv(),
        layer.quantized_act_type()
    );

    let x = ArrayD::from_shape_fn(IxDyn(&[2, 4, in_f]), |i| {
        ((i[0] + i[1] * 3 + i[2]) as f32 * 0.1).cos() * 2.0
    });
    let y = layer.forward(x.view())?; // [2, 4, out_f], W8A8
    let x2 = x
        .view()
        .into_shape_with_order((8, in_f))
        .expect("contiguous");
    let exact = x2.dot(&w.t());
    let y2 = y
        .view()
        .into_shape_with_order((8, out_f))
        .expect("contiguous");
    let err = (&y2 - &exact).mapv(f32::abs).fold(0.0f32, |a, &b| a.max(b));
    let norm = exact.mapv(f32::abs).fold(0.0f32, |a, &b| a.max(b));
    println!(
        "forward {:?} -> {:?}; max |FP8 - f32| = {err:.4} (max |y| = {norm:.2})",
        x.shape(),
        y.shape()
    );
    assert!(err < 0.1 * norm, "FP8 error out of range");
    Ok(())
}
